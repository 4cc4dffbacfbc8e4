"""A step table's arrays as a flat state dict, and their restore.

Keys: ``fields/<name>`` (data ``[T, lanes, *shape]``), ``side/<name>`` (kept-aside next
observations), ``meta/<name>`` (links and lane counters) and ``free_slots`` (the order
in which free side slots are reused, so later adds match the original exactly). States
written before ``meta/cleared`` existed load with no clear recorded (zeros: the first
steps after a clear then stay unserved by frame stacks, as when they were saved).

:func:`table_state` copies every array by default, so a state is a snapshot that later
writes to the table do not change. Inside :func:`state_views` it hands out views of the
storage instead: :func:`replaybank.persist.save` writes the state out under the buffer's
exclusive lock before anything can change, and so needs no second copy of the data.

Example:
    >>> import numpy as np
    >>> from replaybank.storage.writers.reference import write
    >>> from replaybank.spec import Spec
    >>> spec = Spec.coerce({"obs": ((2,), "float32"), "terminated": ((), "bool"),
    ...                     "truncated": ((), "bool")})
    >>> a = StepTable(spec, T=4, lanes=1, obs_fields=["obs"])
    >>> no = np.zeros((3, 1), bool)
    >>> _ = write(a, np.array([0]), {"obs": np.ones((3, 1, 2), np.float32),
    ...             "terminated": no, "truncated": no}, {"obs": np.ones((3, 1, 2), np.float32)})
    >>> b = StepTable(spec, T=4, lanes=1, obs_fields=["obs"])
    >>> load_table_state(b, table_state(a))
    >>> b.size, bool(np.array_equal(b.arrays["obs"], a.arrays["obs"]))
    (3, True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError
from replaybank.spec import Spec
from replaybank.storage.backends.base import ArrayBackend
from replaybank.storage.table import StepTable

__all__ = ["SNAPSHOT_ATTEMPTS", "check_counters", "check_table", "check_table_arrays",
           "checked_free_order", "load_table_state", "saved_meta", "snapshot_table",
           "state_views", "table_state", "views_allowed"]

IntArray = npt.NDArray[np.int64]
#: Item keys (``seq * lanes + lane``) stay below this, far from int64 overflow.
_MAX_KEY = 1 << 62
#: Reads of the counters :func:`snapshot_table` takes while a writer keeps adding before
#: it reports the last check that failed (a read is taken again when the writer committed
#: between its first two reads, a few microseconds apart).
SNAPSHOT_ATTEMPTS = 64


#: Whether :func:`table_state` may hand out views of the storage (set by
#: :func:`state_views`; per thread and task, as every context variable).
_VIEWS: ContextVar[bool] = ContextVar("replaybank_state_views", default=False)


@contextlib.contextmanager
def state_views() -> Iterator[None]:
    """Within the block, a buffer's ``state_dict()`` holds views of its storage, not
    copies: for a caller that writes the state out before the buffer can change (as
    :func:`replaybank.persist.save` does under the buffer's exclusive lock), sparing a
    copy of the whole buffer. Anything kept past the block would change with later
    writes, and its counters would no longer match its data.

    Example:
        >>> views_allowed()
        False
        >>> with state_views():
        ...     views_allowed()
        True
    """
    token = _VIEWS.set(True)
    try:
        yield
    finally:
        _VIEWS.reset(token)


def views_allowed() -> bool:
    """Whether the caller is inside :func:`state_views`."""
    return _VIEWS.get()


def table_state(t: StepTable, copy: bool = True) -> dict[str, npt.NDArray[Any]]:
    """The table's arrays as numpy, by state key.

    Args:
        t: The table.
        copy: Arrays of their own (True: a snapshot that later writes do not change;
            it costs a copy of the stored data) or views of the storage where it allows
            (False: valid until the next write).
    """
    be = t.backend

    def host(v: Any) -> npt.NDArray[Any]:
        return _host_copy(be, v) if copy else be.to_numpy(v)

    arrays = {f"fields/{k}": host(v) for k, v in t.arrays.items()}
    arrays.update({f"side/{k}": host(v) for k, v in t.side.arrays.items()})
    meta = np.array if copy else np.asarray
    arrays.update({f"meta/{k}": meta(v) for k, v in t.state_arrays().items()})
    arrays["free_slots"] = np.array(t.side.free, dtype=np.int64)
    return arrays


def _host_copy(backend: ArrayBackend, array: Any) -> npt.NDArray[Any]:
    """``array`` of ``backend`` as a numpy array of its own: copied from the storage,
    or as the backend hands it over when that already is a host copy (an array on an
    accelerator)."""
    out = backend.to_numpy(array)
    if getattr(getattr(array, "device", None), "type", "cpu") != "cpu":
        return out
    return np.array(out, copy=True)


def load_table_state(t: StepTable, arrays: Mapping[str, Any]) -> None:
    """Copy a :func:`table_state` into ``t`` (same spec, rows and lanes).

    Every shape and every invariant of the lane counters and links
    (:func:`check_table_arrays`) is checked before anything is written; arrays are copied
    in chunks of rows, so a lazily read source (a checkpoint file) never needs a second
    full copy.

    Raises:
        CheckpointError: An array is missing or has the wrong shape, or the counters,
            links or free slots break an invariant (the table is then unchanged).
    """
    side_len, meta, free = _checked(t.spec, t.T, t.lanes, t.obs_fields, arrays,
                                    "load_state_dict")
    t.keep_cleared()  # files of an older version: the loaded clears must persist too
    if side_len != t.side_capacity:
        t.side.resize(side_len)
    for name in t.arrays:
        _copy_rows(t.backend, t.arrays[name], arrays[f"fields/{name}"])
    for name in t.side.arrays:
        _copy_rows(t.backend, t.side.arrays[name], arrays[f"side/{name}"])
    for name, arr in t.state_arrays().items():
        arr[...] = meta[name]
    t.rebuild_free_list()
    if t.tail is not None:  # device storage: the newest steps' host copy
        t.tail.load(t.T, {**arrays, **{f"meta/{k}": v for k, v in meta.items()}})
    t.epoch += 1  # links changed without a write
    if free is not None:
        t.side.free = free


def check_table_arrays(spec: Spec, T: int, lanes: int,  # noqa: N803
                       obs_fields: Sequence[str], arrays: Mapping[str, Any],
                       where: str = "load_state_dict") -> int:
    """Check a :func:`table_state` for a table of ``spec``, ``T`` rows and ``lanes`` lanes
    without writing anything: every array present with the right shape, and the lane
    counters, links and free slots consistent (:func:`check_counters`).

    Args:
        spec: The table's fields.
        T: Rows per lane.
        lanes: Lanes.
        obs_fields: The observation fields (their next values are linked).
        arrays: The state, keyed like :func:`table_state`.
        where: What is loading (named in errors).

    Returns:
        The number of side slots the state holds.

    Raises:
        CheckpointError: Naming the array, the bad value and the rule.
    """
    return _checked(spec, T, lanes, obs_fields, arrays, where)[0]


def _checked(spec: Spec, T: int, lanes: int, obs_fields: Sequence[str],  # noqa: N803
             arrays: Mapping[str, Any], where: str
             ) -> tuple[int, dict[str, IntArray], list[int] | None]:
    """:func:`check_table_arrays`: ``(side slots, meta arrays as int64, saved free order
    or None)``."""
    side_len = _side_len(obs_fields, arrays, where)
    want = {f"fields/{n}": (T, lanes, *f.shape) for n, f in spec.items()}
    want.update({f"side/{n}": (side_len, *spec[n].shape) for n in obs_fields})
    want.update({"meta/written": (lanes,), "meta/counts": (lanes,), "meta/episodes": (lanes,),
                 "meta/link": (T, lanes)})
    if "meta/cleared" in arrays:  # (absent from states of older versions)
        want["meta/cleared"] = (lanes,)
    for key, shape in want.items():
        got = tuple(arrays[key].shape) if key in arrays else None
        if got != shape:
            raise CheckpointError(
                f"{where}: table array {key} has shape {got}, expected {shape}; "
                "the state does not belong to a buffer of this capacity/spec"
            )
    if not 0 < side_len <= T * lanes:
        raise CheckpointError(f"{where}: side store of {side_len} slots; expected "
                              f"1..{T * lanes}")
    meta = saved_meta(arrays, lanes, where)
    used = check_counters(T, meta["written"], meta["counts"], meta["episodes"], meta["link"],
                          side_len, where, meta["cleared"])
    return side_len, meta, _free_order(arrays, side_len, used, where)


def saved_meta(arrays: Mapping[str, Any], lanes: int, where: str) -> dict[str, IntArray]:
    """The bookkeeping arrays of a table state (``meta/<name>``) by name, as int64:
    ``written``, ``counts``, ``episodes``, ``link`` and ``cleared`` (zeros ``[lanes]``
    when the state has none: saved before it existed, no clear recorded). Shapes and
    invariants are not checked here (:func:`check_table_arrays` does).

    Raises:
        CheckpointError: A present array does not hold integers.

    Example:
        >>> m = saved_meta({"meta/written": np.array([3]), "meta/counts": np.array([3]),
        ...                 "meta/episodes": np.array([0]),
        ...                 "meta/link": np.array([[0], [0], [1]])}, 1, "load")
        >>> sorted(m), m["cleared"].tolist()
        (['cleared', 'counts', 'episodes', 'link', 'written'], [0])
    """
    meta = {name: _ints(arrays[f"meta/{name}"], f"meta/{name}", where)
            for name in ("written", "counts", "episodes", "link")}
    saved = arrays.get("meta/cleared")
    meta["cleared"] = np.zeros(lanes, dtype=np.int64) if saved is None else \
        _ints(saved, "meta/cleared", where)
    return meta


def check_table(t: StepTable, where: str) -> None:
    """Check the counters and links a table holds now (a memmap table reopened from its
    files, whose counters another process or a damaged disk may have written).

    Raises:
        CheckpointError: An invariant of :func:`check_counters` is broken.

    Example:
        >>> from replaybank.spec import Spec
        >>> spec = Spec.coerce({"obs": ((2,), "float32"), "terminated": ((), "bool"),
        ...                     "truncated": ((), "bool")})
        >>> t = StepTable(spec, T=4, lanes=1, obs_fields=["obs"])
        >>> t.counts[0] = 9
        >>> check_table(t, "open(d)")
        Traceback (most recent call last):
        ...
        replaybank.errors.CheckpointError: open(d): meta/counts[0] = 9 is outside [0, 4] (each lane holds at most capacity // num_envs = 4 steps); the lane counters are damaged: restore the buffer from a checkpoint
    """  # noqa: E501
    check_counters(t.T, np.asarray(t.written), np.asarray(t.counts), np.asarray(t.episodes),
                   np.asarray(t.link), t.side_capacity, where, np.asarray(t.cleared))


def snapshot_table(t: StepTable, where: str, attempts: int = SNAPSHOT_ATTEMPTS) -> None:
    """Settle a table reopened read-only from files another process may be adding to
    (``rb.open(path, mode="r")`` beside a running writer) on one consistent window of
    each lane, check it as :func:`check_table` does, and rebuild its free side slots.

    A live writer stores in the crash-safe order of
    :class:`~replaybank.storage.table.StepTable`, per lane: ``start`` advances past the
    steps it evicts, then side slots, data and links of the new steps, then ``written``
    (the commit), then the previous newest step is relinked to 0 (only when its kept
    next observation is bitwise the new step's observation); a clear empties the window
    (``start = written``) before it records ``cleared``. So the counters are read
    ``cleared`` first (no later than ``start`` at any later instant), then ``written``
    (``w``: every step below it is complete), then each lane's newest
    link, then ``written`` again (unchanged: no commit came between, so the newest link
    was read before any relink; else the read starts over), then the side store is
    mapped again (a slot of a step below ``w`` lies in its files by then), then every
    link, then ``start`` (``s``: no step from ``s`` on was evicted, so its row and link
    were not rewritten while they were read). The window is ``[s, w)``; its counters go
    into the table's own copy-on-write pages (the files never change), its data, links
    and side store stay mapped: a writer that goes on may later overwrite the oldest
    steps, and relinks the newest one (its next observation is then the next row's).

    A check that fails while the counters moved (a writer added meanwhile) is taken
    again, up to ``attempts`` reads in all; one that fails on counters that did not move
    reports damaged files, as :func:`check_table` would. Tables without ``start`` (files
    of an older version) are checked as they are.

    Args:
        t: A durable table reopened read-only.
        where: What is opening (named in errors).
        attempts: Snapshots taken before the last failure is reported.

    Raises:
        CheckpointError: An invariant of :func:`check_counters` is broken in a snapshot
            taken while no writer added, or in every one of ``attempts``.

    Example:
        >>> import tempfile
        >>> from replaybank.spec import Spec
        >>> from replaybank.storage.backends.memmap import MemmapBackend
        >>> from replaybank.storage.writers.reference import write
        >>> spec = Spec.coerce({"obs": ((), "int64"), "terminated": ((), "bool"),
        ...                     "truncated": ((), "bool")})
        >>> d = tempfile.mkdtemp()
        >>> t = StepTable(spec, T=4, lanes=1, obs_fields=["obs"], backend=MemmapBackend(d))
        >>> no = np.zeros((2, 1), bool)
        >>> _ = write(t, np.array([0]), {"obs": np.array([[1], [2]]), "terminated": no,
        ...             "truncated": no}, {"obs": np.array([[2], [3]])})
        >>> r = StepTable(spec, T=4, lanes=1, obs_fields=["obs"],
        ...               backend=MemmapBackend(d, reopen=True, mode="r"))
        >>> snapshot_table(r, f"open({d})")
        >>> r.counts.tolist(), r.gather_next("obs", np.array([0, 1])).tolist()
        ([2], [2, 3])
        >>> t.backend.close()
    """
    if t.start is None:
        check_table(t, where)
        t.rebuild_free_list()
        return
    T, lanes = t.T, t.lanes  # noqa: N806
    cols = np.arange(lanes)
    tries = max(1, attempts)
    for attempt in range(tries):
        last = attempt == tries - 1
        cleared = np.array(t.cleared, dtype=np.int64)  # [lanes], before start is read
        written = np.array(t.written, dtype=np.int64)  # [lanes]
        newest = np.array(t.link[(written - 1) % T, cols], dtype=np.int64)  # [lanes]
        if not last and not np.array_equal(written, t.written):
            continue  # a commit in between: the newest step may be relinked already
        t.side.remap()
        link = np.array(t.link)  # [T, lanes]
        start = np.array(t.start, dtype=np.int64)  # [lanes], after the links
        episodes = np.array(t.episodes, dtype=np.int64)
        some = written > 0
        link[((written - 1) % T)[some], cols[some]] = newest[some]
        counts = np.clip(written - start, 0, np.minimum(written, T))  # as a reopen does
        # a linked slot lies in every field's file (a writer grows them one by one)
        side_len = min(len(a) for a in t.side.arrays.values())
        try:
            used = check_counters(T, written, counts, episodes, link, side_len, where,
                                  cleared)
        except CheckpointError:
            if last or (np.array_equal(written, t.written)
                        and np.array_equal(start, t.start)):
                raise  # nothing moved (the files are damaged), or no attempt left
            continue  # a writer added meanwhile: take the counters again
        t.written[:] = written
        t.counts[:] = counts
        t.start[:] = written - counts
        t.episodes[:] = episodes
        t.cleared[:] = cleared
        t.side.rebuild(np.concatenate([used, np.zeros(t.side_capacity - side_len, bool)]))
        return


def check_counters(T: int, written: IntArray, counts: IntArray,  # noqa: N803
                   episodes: IntArray, link: npt.NDArray[Any], side_len: int,
                   where: str, cleared: IntArray | None = None) -> npt.NDArray[np.bool_]:
    """Check the invariants of a step table's bookkeeping (see
    :class:`~replaybank.storage.table.StepTable`), which the writers (the compiled one
    included) rely on as memory offsets.

    Per lane ``l``: ``0 <= counts[l] <= T``, ``counts[l] <= written[l]`` (small enough that
    item keys do not overflow), ``episodes[l] >= 0``, ``0 <= cleared[l] <= written[l] -
    counts[l]`` (a clear comes before every live step). Every live step's link is in
    ``[0, side_len]``; a link of 0 (next observation = the next step's) only where the
    next step of the lane is live, so the newest live step of a lane links to the side
    store; no side slot is linked from two live steps.

    Args:
        T: Rows per lane.
        written: Steps ever written per lane ``[lanes]``.
        counts: Live steps per lane ``[lanes]``.
        episodes: Episodes ended per lane ``[lanes]``.
        link: Next-observation links ``[T, lanes]``.
        side_len: Side slots allocated.
        where: What is loading (named in errors).
        cleared: Each lane's first step after its last clear ``[lanes]`` (None: no
            clear recorded).

    Returns:
        Which side slots live steps use ``[side_len]``.

    Raises:
        CheckpointError: Naming the array, the lane and the bad value.
    """
    lanes = len(counts)
    fix = "restore the buffer from a checkpoint"
    top = _MAX_KEY // max(1, lanes)
    for lane in range(lanes):
        c, w, e = int(counts[lane]), int(written[lane]), int(episodes[lane])
        if not 0 <= c <= T:
            raise CheckpointError(
                f"{where}: meta/counts[{lane}] = {c} is outside [0, {T}] (each lane holds at "
                f"most capacity // num_envs = {T} steps); the lane counters are damaged: {fix}")
        if not c <= w <= top:
            raise CheckpointError(
                f"{where}: meta/written[{lane}] = {w} is outside [counts = {c}, {top}] (a lane "
                f"has written at least the steps it holds); the lane counters are damaged: "
                f"{fix}")
        if e < 0:
            raise CheckpointError(f"{where}: meta/episodes[{lane}] = {e} is negative; the "
                                  f"lane counters are damaged: {fix}")
        if cleared is not None and not 0 <= int(cleared[lane]) <= w - c:
            raise CheckpointError(
                f"{where}: meta/cleared[{lane}] = {int(cleared[lane])} is outside [0, "
                f"written - counts = {w - c}] (a clear of lane {lane} comes before its "
                f"oldest live step); the lane counters are damaged: {fix}")
    used = np.zeros(side_len, dtype=bool)
    for lane in range(lanes):
        c, w = int(counts[lane]), int(written[lane])
        if c == 0:
            continue
        rows = np.arange(w - c, w, dtype=np.int64) % T  # [c], oldest to newest
        lk = np.asarray(link[rows, lane], dtype=np.int64)
        bad = np.flatnonzero((lk < 0) | (lk > side_len))
        if len(bad):
            r = int(rows[bad[0]])
            raise CheckpointError(
                f"{where}: meta/link[{r}, {lane}] = {int(lk[bad[0]])} is outside [0, "
                f"{side_len}] (0 or a side slot + 1); the links are damaged: {fix}")
        if lk[-1] == 0:
            raise CheckpointError(
                f"{where}: meta/link[{int(rows[-1])}, {lane}] = 0 but that step is the "
                f"newest of lane {lane}, so its next observation must be kept in the side "
                f"store (link > 0); the links are damaged: {fix}")
        slots = lk[lk > 0] - 1
        if len(slots) and (used[slots].any() or len(np.unique(slots)) < len(slots)):
            dup = next(int(s) for s in _repeats(slots, used))
            raise CheckpointError(
                f"{where}: side slot {dup} is linked from two live steps (meta/link, lane "
                f"{lane}); each kept next observation belongs to one step; the links are "
                f"damaged: {fix}")
        used[slots] = True
    return used


def _repeats(slots: IntArray, used: npt.NDArray[np.bool_]) -> list[int]:
    """Slots already marked in ``used`` or repeated within ``slots``."""
    seen = set(np.flatnonzero(used).tolist())
    out = []
    for s in slots.tolist():
        if s in seen:
            out.append(s)
        seen.add(s)
    return out


def _ints(src: Any, key: str, where: str) -> npt.NDArray[np.int64]:
    arr = np.asarray(src)
    if not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
        raise CheckpointError(f"{where}: table array {key} has dtype {arr.dtype}, expected "
                              "integers; the state is damaged: restore it from a checkpoint")
    return np.asarray(arr, dtype=np.int64)


def checked_free_order(t: StepTable, saved: Any, where: str) -> list[int] | None:
    """A saved order of the side slots free in ``t`` (a memmap resume state's
    ``free_slots``), checked against the slots free in ``t`` now, without changing ``t``.

    A table reopened from its files rebuilds its free list in a fixed order; the order
    kept at ``flush()`` makes later adds reuse the side slots the uninterrupted buffer
    would have reused, so its state stays bit-identical.

    Args:
        t: The table, reopened from the files the order was saved with.
        saved: ``[free slots]`` integers, or None (a resume state written before the
            order was kept: nothing to restore).
        where: What is loading (named in errors).

    Returns:
        The order to assign to ``t.side.free``, or None.

    Raises:
        CheckpointError: ``saved`` does not list exactly the free slots of ``t``.

    Example:
        >>> t = StepTable(Spec.coerce({"obs": ((1,), "float32")}), 2, 1, ["obs"])
        >>> t.side.free
        [1, 0]
        >>> checked_free_order(t, [0, 1], "open"), checked_free_order(t, None, "open")
        ([0, 1], None)
    """
    if saved is None:
        return None
    used = np.ones(t.side.capacity, dtype=bool)  # [side slots]
    used[np.asarray(t.side.free, dtype=np.int64)] = False
    return _free_order({"free_slots": saved}, t.side.capacity, used, where)


def _free_order(arrays: Mapping[str, Any], side_len: int, used: npt.NDArray[np.bool_],
                where: str) -> list[int] | None:
    """The saved order of free side slots (None when the state has none), checked: the
    free slots are exactly those no live step links to (``used`` ``[side_len]``)."""
    saved = arrays.get("free_slots")
    if saved is None:
        return None
    free = _ints(saved, "free_slots", where).reshape(-1)
    want = np.flatnonzero(~used)
    if len(free) != len(want) or not np.array_equal(np.sort(free), want):
        raise CheckpointError(
            f"{where}: free_slots lists {len(free)} side slots but {len(want)} of the "
            f"{side_len} are free (not linked from a live step); free_slots or meta/link "
            "is damaged: restore the buffer from a checkpoint")
    return [int(i) for i in free]


def _side_len(obs_fields: Sequence[str], arrays: Mapping[str, Any], where: str) -> int:
    key = f"side/{obs_fields[0]}"
    if key not in arrays or len(getattr(arrays[key], "shape", ())) < 1:
        raise CheckpointError(f"{where}: table array {key} is missing; the state "
                              "does not belong to a buffer of this spec")
    return int(arrays[key].shape[0])


def _copy_rows(backend: ArrayBackend, dst: Any, src: Any, chunk_bytes: int = 16 << 20) -> None:
    """``dst[:] = src`` in chunks of rows."""
    n = len(src)
    row = max(1, int(np.prod(src.shape[1:], dtype=np.int64)) * np.dtype(src.dtype).itemsize)
    step = max(1, chunk_bytes // row)
    for i in range(0, n, step):
        backend.write(dst, slice(i, min(n, i + step)), np.asarray(src[i:i + step]))
