"""A replay buffer's state dict: packing its parts into one nested dict, and checking a
saved one against the buffer before anything is restored.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(4, seed=0)
    >>> buf.add(obs=np.zeros(2, np.float32), action=0, reward=1.0,
    ...         next_obs=np.ones(2, np.float32), terminated=False, truncated=False)
    >>> meta = buf.metadata()
    >>> meta["size"], meta["capacity"]
    (1, 4)
    >>> checked_spec(meta, capacity=4, num_envs=1, current=buf.spec) == buf.spec
    True
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.buffers.inputs import obs_fields, rows_spec, standard_spec
from replaybank.errors import CheckpointError, ReplayBankError
from replaybank.ops import ring
from replaybank.samplers.base import DrawableSlots, Sampler
from replaybank.spec import FieldSpec, Spec
from replaybank.storage.backends.base import ArrayBackend, DurableBackend
from replaybank.storage.table import StepTable
from replaybank.storage.table_state import (
    check_table_arrays,
    load_table_state,
    saved_meta,
    table_state,
)
from replaybank.views import make_view
from replaybank.views.base import SpecTransform, View

IntArray = npt.NDArray[np.int64]

__all__ = ["ROWS_SIDE", "buffer_state", "check_parts", "check_saved_sizes", "checked_spec",
           "checked_state",
           "init_args", "init_config", "live_slots", "load_table", "make_table", "probe_load",
           "probe_rng", "recorded_seed", "resume_state", "rng_state", "checked_widths",
           "MAX_WIDTHS"]

#: How many window widths a buffer remembers for ``update_sequence_priorities``'s check.
MAX_WIDTHS = 16

#: A rows table's side store (``ReplayBuffer(next_obs=False)``: no observation fields, so
#: no next observation is kept aside) still hands out the slots its links point at (an
#: episode end, each lane's newest step); this one-byte array per slot, ``side/<name>``
#: in state dicts and memmap files, gives the store its size.
ROWS_SIDE = "rows"

#: What a component's ``load_state_dict`` raises on a state of the wrong structure.
_MISFIT = (KeyError, ValueError, TypeError, IndexError, AttributeError, OverflowError)


def init_args(n_step: int, gamma: float, frame_stack: int, storage: str | ArrayBackend,
              path: Any, device: Any, autoreset_mode: str | None = None,
              next_obs: bool = True) -> dict[str, Any]:
    """The constructor arguments a replay buffer records (JSON-able) beside its sizes,
    sampler and view: its state dict's ``init`` and :func:`replaybank.config.buffer_config`
    rebuild it from them. ``next_obs`` is recorded only when False (a rows buffer), so
    the states and configs of other buffers stay as they were.

    Example:
        >>> init_args(3, 0.9, 1, "memmap", "/tmp/buf", None)["path"]
        '/tmp/buf'
        >>> init_args(1, 0.99, 1, "numpy", None, None, next_obs=False)["next_obs"]
        False
    """
    out: dict[str, Any] = {
        "n_step": n_step, "gamma": gamma, "frame_stack": frame_stack,
        "storage": storage if isinstance(storage, str) else storage.name,
        "path": None if path is None else str(path),
        "device": None if device is None else str(device),
        "autoreset_mode": autoreset_mode,
    }
    if not next_obs:
        out["next_obs"] = False
    return out


def make_table(spec: Spec, T: int, lanes: int, backend: ArrayBackend,  # noqa: N803
               rows: bool) -> StepTable:
    """A replay buffer's step table: the observation fields' next values linked, or for
    a rows buffer (``rows=True``) none, with the :data:`ROWS_SIDE` array sizing its side
    store (reopened with the other files of a memmap buffer).

    Example:
        >>> from replaybank.storage.backends.numpy import NumpyBackend
        >>> spec = Spec.coerce({"x": ((), "int64"), "terminated": ((), "bool"),
        ...                     "truncated": ((), "bool")})
        >>> t = make_table(spec, 4, 2, NumpyBackend(), rows=True)
        >>> t.obs_fields, t.side_capacity
        ([], 8)
    """
    table = StepTable(spec, T, lanes, [] if rows else obs_fields(spec), backend=backend)
    if rows:
        side = table.side
        side.arrays[ROWS_SIDE] = backend.allocate(f"side/{ROWS_SIDE}", (len(side.free),),
                                                  np.dtype(np.uint8))
    return table


def _rows_view(spec: Spec, T: int, lanes: int,  # noqa: N803
               arrays: Mapping[str, Any]) -> tuple[Spec, dict[str, Any]]:
    """A rows table's spec and state as the table checks read them: the side array as the
    kept-aside values of one more (all-zero, never stored) field."""
    mark = FieldSpec(ROWS_SIDE, (), np.dtype(np.uint8))
    view = dict(arrays)
    view[f"fields/{ROWS_SIDE}"] = np.broadcast_to(np.uint8(0), (T, lanes))
    return spec.with_fields([mark]), view


def check_table(spec: Spec, T: int, lanes: int, arrays: Any, rows: bool,  # noqa: N803
                where: str = "load_state_dict") -> int:
    """:func:`~replaybank.storage.table_state.check_table_arrays` of a replay buffer's
    table state, rows tables included (nothing is written).

    Returns:
        The number of side slots the state holds.

    Raises:
        CheckpointError: Naming what does not fit.
    """
    if not rows:
        return check_table_arrays(spec, T, lanes, obs_fields(spec), arrays, where)
    if f"fields/{ROWS_SIDE}" in arrays:
        raise CheckpointError(f"{where}: the state has a field {ROWS_SIDE!r}, which a rows "
                              "buffer does not store; the state is damaged")
    spec, view = _rows_view(spec, T, lanes, arrays)
    return check_table_arrays(spec, T, lanes, [ROWS_SIDE], view, where)


def load_table(table: StepTable, arrays: Mapping[str, Any]) -> None:
    """Copy a table state into ``table``: every array and invariant checked first
    (:func:`~replaybank.storage.table_state.load_table_state`, which a rows table's state
    gets as :func:`check_table` checks it, then copied the same way).

    Raises:
        CheckpointError: The state does not fit (the table is then unchanged).
    """
    if table.obs_fields or ROWS_SIDE not in table.side.arrays:
        load_table_state(table, arrays)
        return
    side_len = check_table(table.spec, table.T, table.lanes, arrays, True)
    table.keep_cleared()  # files of an older version: the loaded clears must persist too
    if side_len != table.side_capacity:
        table.side.resize(side_len)
    be = table.backend
    for dst, src in [*((a, arrays[f"fields/{n}"]) for n, a in table.arrays.items()),
                     *((a, arrays[f"side/{n}"]) for n, a in table.side.arrays.items())]:
        step = max(1, (16 << 20) // max(1, int(np.prod(src.shape[1:], dtype=np.int64))
                                        * np.dtype(src.dtype).itemsize))
        for i in range(0, len(src), step):  # rows at a time: a lazily read source
            be.write(dst, slice(i, min(len(src), i + step)), np.asarray(src[i:i + step]))
    meta = saved_meta(arrays, table.lanes, "load_state_dict")
    for name, arr in table.state_arrays().items():
        arr[...] = meta[name]
    table.rebuild_free_list()
    table.epoch += 1  # links changed without a write
    free = arrays.get("free_slots")
    if free is not None:  # checked: exactly the free slots, in the saved order
        table.side.free = [int(i) for i in np.asarray(free).reshape(-1)]


def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    """A copy of the generator's bit-generator state (JSON-able).

    Example:
        >>> rng_state(np.random.default_rng(0))["bit_generator"]
        'PCG64'
    """
    state = rng.bit_generator.state
    return dict(state)


def buffer_state(metadata: dict[str, Any], init_args: dict[str, Any], rng: np.random.Generator,
                 sampler: Sampler, view: View, table: StepTable | None) -> dict[str, Any]:
    """The nested state dict of a replay buffer made of these parts.

    Args:
        metadata: The buffer's :meth:`~replaybank.buffers.replay.ReplayBuffer.metadata`.
        init_args: Its recorded constructor arguments (copied).
        rng: Its sampling generator.
        sampler: Its sampler.
        view: Its view.
        table: Its step table, None before the first add.

    Returns:
        ``{"metadata", "init", "rng", "sampler", "view"}`` plus ``"table"`` (copies:
        :func:`~replaybank.storage.table_state.table_state`) when there is a table.

    Example:
        >>> from replaybank.samplers.uniform import UniformSampler
        >>> from replaybank.views.transition import TransitionView
        >>> sorted(buffer_state({}, {}, np.random.default_rng(0), UniformSampler(),
        ...                     TransitionView(), None))
        ['init', 'metadata', 'rng', 'sampler', 'view']
    """
    state: dict[str, Any] = {
        "metadata": metadata,
        "init": dict(init_args),
        "rng": rng_state(rng),
        "sampler": sampler.state_dict(),
        "view": view.state_dict(),
    }
    if table is not None:
        state["table"] = table_state(table)
    return state


def checked_spec(meta: Any, capacity: int, num_envs: int,
                 current: Spec | None, rows: bool = False) -> Spec | None:
    """The spec a saved state holds, checked against the buffer it is loaded into.

    Args:
        meta: The state's ``metadata``.
        capacity: The buffer's capacity.
        num_envs: The buffer's number of lanes.
        current: The buffer's spec (None before its first add).
        rows: The buffer stores rows (``next_obs=False``): the spec is checked as
            :func:`~replaybank.buffers.inputs.rows_spec` checks one.

    Returns:
        The saved spec, or None when the saved buffer held nothing yet.

    Raises:
        CheckpointError: Capacity, lanes or spec differ.

    Example:
        >>> checked_spec({"capacity": 8, "num_envs": 2}, 8, 1, None)
        Traceback (most recent call last):
        ...
        replaybank.errors.CheckpointError: load_state_dict: state has num_envs=2 but this buffer has num_envs=1; build the buffer with the saved num_envs
    """  # noqa: E501
    if not isinstance(meta, Mapping):
        raise CheckpointError(f"load_state_dict: state metadata is {type(meta).__name__}, "
                              "expected a dict; pass a ReplayBuffer.state_dict()")
    check_saved_sizes(meta, capacity=capacity, num_envs=num_envs)
    spec_json = meta.get("spec")
    if spec_json is None:
        return None
    try:
        spec = Spec.from_json(spec_json)
        spec = rows_spec(spec) if rows else standard_spec(spec)
    except (ReplayBankError, *_MISFIT) as exc:
        raise CheckpointError(f"load_state_dict: the state's spec {spec_json!r} is not a "
                              f"valid spec ({exc}); the state is damaged") from exc
    if current is not None and current != spec:
        raise CheckpointError(
            f"load_state_dict: state spec {spec} differs from the buffer's {current}"
        )
    return spec


def probe_load(component: Any, saved: Any, what: str) -> Any:
    """Check that ``saved`` fits ``component`` (a sampler or view) by loading it into a deep
    copy, which is returned (None when it cannot be copied); ``component`` itself is left
    as it is.

    A component that cannot be copied is not probed (its own ``load_state_dict`` checks
    the state when it loads).

    Raises:
        CheckpointError: The copy rejected the state (any structural error becomes one).

    Example:
        >>> from replaybank.samplers.prioritized import PrioritizedSampler
        >>> s = PrioritizedSampler()
        >>> s.bind(2, 1)
        >>> probe_load(s, {"priorities": [1.0, float("nan")], "max_priority": 1.0,
        ...                "calls": 0}, "sampler")
        Traceback (most recent call last):
        ...
        replaybank.errors.CheckpointError: PrioritizedSampler.load_state_dict: priorities[1] = nan; stored priorities must be finite and >= 0: the sampler state is damaged, restore it from a checkpoint
    """  # noqa: E501
    try:
        trial = copy.deepcopy(component)
    except (TypeError, ValueError, AttributeError, RecursionError, copy.Error):
        return None
    try:
        trial.load_state_dict(saved)
    except CheckpointError:
        raise
    except (ReplayBankError, *_MISFIT) as exc:
        raise CheckpointError(
            f"load_state_dict: the {what} state does not fit {type(component).__name__} "
            f"({type(exc).__name__}: {exc}); it is damaged or belongs to another {what}"
        ) from exc
    return trial


def check_drawable(sampler: Any, written: Any, counts: Any, T: int) -> None:  # noqa: N803
    """Raise when ``sampler`` (loaded with a saved state) may draw a slot that holds no
    live step of a table with the lane counters ``written`` and ``counts`` ``[lanes]``
    and ``T`` rows (a :class:`~replaybank.samplers.base.DrawableSlots` sampler; others
    draw live steps only).

    Raises:
        CheckpointError: Naming the first such slot.

    Example:
        >>> from replaybank.samplers.prioritized import PrioritizedSampler
        >>> s = PrioritizedSampler(kernel="numpy"); s.bind(2, 2)
        >>> s.on_write(np.array([0, 1]))
        >>> check_drawable(s, np.array([1, 0]), np.array([1, 0]), 2)
        Traceback (most recent call last):
        ...
        replaybank.errors.CheckpointError: load_state_dict: the sampler state gives slot 1 (row 0 of lane 1) a priority, but no live step is there (lane 1 holds no steps); the state is damaged or belongs to other data
    """  # noqa: E501
    drawable = sampler.drawable() if isinstance(sampler, DrawableSlots) else None
    if drawable is None:
        return
    written = np.asarray(written, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    lanes = len(written)
    live = np.zeros((T, lanes), dtype=bool)
    for lane in range(lanes):
        live[np.arange(written[lane] - counts[lane], written[lane]) % T, lane] = True
    bad = np.flatnonzero(drawable & ~live.reshape(-1))
    if len(bad):
        row, lane = divmod(int(bad[0]), lanes)
        c, w = int(counts[lane]), int(written[lane])
        holds = f"rows {(w - c) % T} to {(w - 1) % T} (ring order)" if c else "no steps"
        raise CheckpointError(
            f"load_state_dict: the sampler state gives slot {bad[0]} (row {row} of lane "
            f"{lane}) a priority, but no live step is there (lane {lane} holds {holds}); "
            "the state is damaged or belongs to other data"
        )


def probe_rng(rng: np.random.Generator, saved: Any) -> None:
    """Check that ``saved`` is a state of ``rng``'s bit generator (assigned to a fresh one).

    Raises:
        CheckpointError: It is not.

    Example:
        >>> try:
        ...     probe_rng(np.random.default_rng(0), {"bit_generator": "MT19937"})
        ... except CheckpointError as exc:
        ...     print(str(exc).split(" (")[0])
        load_state_dict: rng state does not fit a PCG64 generator
    """
    kind = type(rng.bit_generator)
    try:
        kind().state = saved
    except _MISFIT as exc:
        raise CheckpointError(
            f"load_state_dict: rng state does not fit a {kind.__name__} generator "
            f"({type(exc).__name__}: {exc}); the state is damaged or was saved with another "
            "generator type"
        ) from exc


def check_parts(saved: Mapping[str, Any], sampler: Sampler, view: View,
                rng: np.random.Generator, counters: tuple[Any, Any, int] | None = None
                ) -> None:
    """Check the sampler, view and generator state of a state dict (or a resume state)
    without changing the parts.

    Args:
        saved: The state.
        sampler, view, rng: The buffer's parts.
        counters: ``(written, counts, T)`` of the table the state goes with: the sampler
            may then draw only its live slots (:func:`check_drawable`).

    Raises:
        CheckpointError: A part's state is missing or does not fit it.
    """
    if "sampler" not in saved or "rng" not in saved:
        missing = [k for k in ("sampler", "rng") if k not in saved]
        raise CheckpointError(f"load_state_dict: the state has no {' or '.join(missing)} "
                              "entry; pass a state_dict() of this buffer type")
    trial = probe_load(sampler, saved["sampler"], "sampler")
    if counters is not None and trial is not None:
        check_drawable(trial, *counters)
    # checkpoints written before views had state hold none: the view keeps its own
    probe_load(view, saved.get("view", {}), "view")
    probe_rng(rng, saved["rng"])


def checked_widths(saved: Any, where: str = "load_state_dict") -> set[int]:
    """The window widths (burn-in included) that ``sample_sequences`` returned, as a
    state keeps them (``sequence_widths``): ``update_sequence_priorities`` checks TD
    errors given without ``mask`` against them, so a restored buffer refuses what the
    saved one refused. A state without the entry (nothing drawn, or written before it
    was kept) gives none (no check).

    Raises:
        CheckpointError: Not a list of at most :data:`MAX_WIDTHS` positive ints.

    Example:
        >>> sorted(checked_widths([4, 3])), checked_widths(None)
        ([3, 4], set())
        >>> checked_widths([0])
        Traceback (most recent call last):
        ...
        replaybank.errors.CheckpointError: load_state_dict: sequence_widths=[0] must be a list of at most 16 window widths (ints >= 1); the state is damaged: pass a state_dict() of this buffer
    """  # noqa: E501
    if saved is None:
        return set()
    values = saved.tolist() if isinstance(saved, np.ndarray) else saved
    if (not isinstance(values, (list, tuple)) or len(values) > MAX_WIDTHS
            or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1
                       for w in values)):
        raise CheckpointError(f"{where}: sequence_widths={saved!r} must be a list of at most "
                              f"{MAX_WIDTHS} window widths (ints >= 1); the state is damaged: "
                              "pass a state_dict() of this buffer")
    return {int(w) for w in values}


def check_saved_sizes(meta: Mapping[str, Any], **sizes: int) -> None:
    """Raise when a saved state's metadata ``meta`` holds other sizes than this buffer's.

    Raises:
        CheckpointError: A size differs, naming it and the fix.

    Example:
        >>> check_saved_sizes({"capacity": 8, "num_envs": 2}, capacity=8, num_envs=2)
        >>> check_saved_sizes({"capacity": 4}, capacity=8)
        Traceback (most recent call last):
        ...
        replaybank.errors.CheckpointError: load_state_dict: state has capacity=4 but this buffer has capacity=8; build the buffer with the saved capacity
    """  # noqa: E501
    for key, mine in sizes.items():
        if meta.get(key) != mine:
            raise CheckpointError(
                f"load_state_dict: state has {key}={meta.get(key)!r} but this buffer has "
                f"{key}={mine}; build the buffer with the saved {key}"
            )


def checked_state(saved: Any, capacity: int, num_envs: int, current: Spec | None,
                  sampler: Sampler, view: View, rng: np.random.Generator,
                  rows: bool = False) -> Spec | None:
    """Check a whole replay-buffer state dict before anything is restored: sizes and spec,
    every table array and the invariants of its counters and links
    (:func:`~replaybank.storage.table_state.check_table_arrays`), and the sampler, view
    and generator state (:func:`check_parts`).

    A rows buffer's state (``next_obs=False``, recorded in the state's ``init``) loads
    only into a rows buffer, and the other way round.

    Returns:
        The saved spec, or None when the saved buffer held nothing yet.

    Raises:
        CheckpointError: Naming what does not fit.
    """
    if not isinstance(saved, Mapping):
        raise CheckpointError(f"load_state_dict: state is {type(saved).__name__}, expected "
                              "the dict of a ReplayBuffer.state_dict()")
    init = saved.get("init")
    saved_rows = isinstance(init, Mapping) and init.get("next_obs", True) is False
    if saved_rows != rows:
        raise CheckpointError(
            f"load_state_dict: the state is of a buffer with next_obs={not saved_rows} but "
            f"this buffer has next_obs={not rows}; build the buffer with "
            f"next_obs={not saved_rows}"
        )
    spec = checked_spec(saved.get("metadata"), capacity, num_envs, current, rows)
    if spec is not None:
        table = saved.get("table")
        if not isinstance(table, Mapping):
            raise CheckpointError("load_state_dict: the state's metadata has a spec but "
                                  "there is no table; the state is damaged")
        check_table(spec, capacity // num_envs, num_envs, table, rows)
        counters = (table["meta/written"], table["meta/counts"], capacity // num_envs)
    else:
        counters = (np.zeros(num_envs), np.zeros(num_envs), capacity // num_envs)
    check_parts(saved, sampler, view, rng, counters)
    return spec


def resume_state(rng: np.random.Generator, sampler: Sampler, view: View,
                 table: StepTable) -> dict[str, Any]:
    """What :func:`replaybank.persist.flush` saves beside memmap files: generator, sampler
    and view state, the lane counters (``written``, ``counts``, ``episodes``) they
    belong to, and the order in which free side slots are reused (``free_slots``: a
    reopened table rebuilds it in another order, and later adds would keep episode ends
    in other slots than the buffer that was not stopped)."""
    return {
        "rng": rng_state(rng),
        "sampler": sampler.state_dict(),
        "view": view.state_dict(),
        **{name: np.array(arr, dtype=np.int64) for name, arr in
           (("written", table.written), ("counts", table.counts),
            ("episodes", table.episodes))},
        "free_slots": np.array(table.side.free, dtype=np.int64),
    }


def live_slots(table: StepTable) -> IntArray:
    """Slots of every live step, oldest first (ties: lane order), ``[size]``: how a
    sampler hears about the steps of a table reopened from its files."""
    w, c, lanes = table.written, table.counts, table.lanes
    if not int(c.sum()):
        return np.zeros(0, dtype=np.int64)
    seq = np.concatenate([np.arange(w[i] - c[i], w[i]) for i in range(lanes)])
    lane = np.concatenate([np.full(int(c[i]), i) for i in range(lanes)])
    order = np.argsort(seq, kind="stable")
    keys = (seq * lanes + lane)[order].astype(np.int64)
    return ring.key_to_slot(keys, table.T, lanes)


def recorded_seed(seed: Any) -> int | None:
    """The seed a buffer's config records: an int seed, or None for None and for a
    ``numpy.random.Generator`` (its seed cannot be read back from it).

    Example:
        >>> recorded_seed(np.int64(7)), recorded_seed(np.random.default_rng(7))
        (7, None)
    """
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return int(seed)
    return None


def init_config(capacity: int, num_envs: int, spec: Spec | None, init: dict[str, Any],
                sampler: Sampler, view: View, backend: ArrayBackend,
                seed: int | None = None) -> dict[str, Any]:
    """The constructor values that rebuild a replay buffer of these parts empty.

    A view that the constructor arguments ``n_step``/``gamma``/``frame_stack`` would not
    build is recorded as a view config; a durable backend's directory as ``path``. The
    int ``seed`` the buffer was built with is recorded (:func:`recorded_seed`), so the
    rebuilt buffer draws the same samples from the same data; its generator starts
    afresh from that seed (a checkpoint, not a config, carries the generator's state).
    """
    if spec is not None and isinstance(view, SpecTransform):
        spec = view.added_spec(spec)  # (what spec= meant: the rebuilt buffer stores spec)
    cand: dict[str, Any] = {"capacity": capacity, "num_envs": num_envs, "seed": seed,
                            "spec": None if spec is None else spec.to_json(),
                            "next_obs": True, **init}
    sampler_cfg = sampler.config()
    cand["sampler"] = sampler_cfg
    cand.update({k: v for k, v in sampler_cfg.items() if k != "type" and k not in cand})
    view_cfg = view.config()
    default_view = make_view(init.get("n_step", 1), init.get("gamma", 0.99),
                             init.get("frame_stack", 1)).config()
    cand["view"] = None
    if view_cfg != default_view:  # a view passed in (or one that settled options itself)
        cand.update(view=view_cfg, n_step=1, frame_stack=1)
    if cand.get("path") is None and isinstance(backend, DurableBackend):
        cand["path"] = str(backend.path)
    return cand
