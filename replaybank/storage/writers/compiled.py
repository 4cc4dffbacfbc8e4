"""The optional C accelerator ``replaybank._lane``: loaded once, or None.

``replaybank/_lane.c`` is built at install time where a C compiler and the Python headers
exist (``setup.py``, ``optional=True``). It holds the compiled writer of
:func:`compiled_writer`, whose Python twin gives the same
results when the module is missing or when the environment variable
``REPLAYBANK_PURE_PYTHON=1`` switches it off (read at import).

(A compiled row gather for sampling was tried and dropped: with random keys over a
large ring, sampling is bound by memory latency, and numpy's ``take`` already reaches it.)

Example:
    >>> isinstance(accelerated(), bool)
    True
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from replaybank.storage.table import StepTable
from replaybank.storage.writers.formats import FieldFormat, ObsLayout, RowsLayout
from replaybank.storage.writers.tell import WriteListener, announce_last_steps

__all__ = ["ACCEL", "MAX_EXTRAS", "MAX_OBS", "accelerated", "compiled_writer", "not_handled"]

#: The most extra fields the compiled writer takes (``MAXEXTRA`` in ``_lane.c``); a table
#: with more takes the Python writers.
MAX_EXTRAS = 16
#: The most fields of a dict observation the compiled writer takes (``MAXOBS``).
MAX_OBS = 16
#: A compiled writer's ``(add, extend, add_lanes)``.
Calls = tuple[Callable[..., bool], Callable[..., bool], Callable[..., bool]]
#: The standard fields after the observation, in the order the compiled writer takes them.
_STD = ("action", "reward", "terminated", "truncated")


def _load() -> Any:
    if os.environ.get("REPLAYBANK_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("replaybank._lane")
    except ImportError:
        return None


ACCEL: Any = _load()


def accelerated() -> bool:
    """Whether the compiled paths (``replaybank._lane``) are built and switched on."""
    return ACCEL is not None


def not_handled(*args: Any) -> bool:
    """Stands in for the compiled add/extend/add_lanes when the accelerator is off."""
    return False


def _c_field(store: Any, field: FieldFormat,
             arrays_only: bool = False) -> tuple[Any, str, tuple[int, ...], str, int, int]:
    """What the compiled Appender needs to know of one field.

    The C writer converts Python scalars in native byte order only: a scalar field of
    another byte order (an explicit ``>f4`` spec) takes arrays only (kind ``-``), and
    its Python scalars go to the Python paths, which convert them exactly. The fields of
    a dict observation take arrays only (``arrays_only``), as a flat ``obs`` does.
    """
    native = field.dtype.isnative
    kind = field.dtype.kind if field.shape == () and field.dtype.kind in "fiub" and native \
        and not arrays_only else "-"
    lo = max(field.lo, -(2**63)) if kind in "iu" else 0
    hi = min(field.hi, 2**63 - 1) if kind in "iu" else 0
    fmt = memoryview(np.empty(0, field.dtype)).format  # type: ignore[arg-type]
    return store, fmt, field.shape, kind, lo, hi


def compiled_writer(table: StepTable, sampler: WriteListener | None = None,
                    guard: Any = None) -> Calls | None:
    """The compiled ``(add, extend, add_lanes)`` of a numpy or memmap table, or None.

    ``add`` and ``extend`` take ``(obs, action, reward, next_obs, terminated, truncated,
    extras)`` and return True when they wrote the call (every lane at once, lanes in
    step, values of exactly the stored format; see ``replaybank/_lane.c``), False when
    the Python paths must take it (nothing was written). ``add_lanes(lanes, obs, ...,
    extras)`` writes one step of the lanes ``lanes`` (distinct ints; None: every lane),
    in step or not: async vector envs (``env_ids``), and every add once lanes fell out
    of step. On memmap files the writes keep the crash-safe order of
    :mod:`~replaybank.storage.writers.plan` (counts drop before rows are
    rewritten). ``extras`` must hold exactly the table's extra fields (the stored
    fields beyond obs/action/reward/terminated/truncated), each value held to the rule of
    ``action``: a C-contiguous array of exactly the stored dtype and shape (leading dims as
    ``action``'s), or a Python scalar for a scalar field of a one-lane ``add``; otherwise
    the call returns False before writing. A dict observation (fields ``obs/<key>``, at
    most :data:`MAX_OBS`) is taken as plain dicts ``obs`` and ``next_obs`` with exactly
    those keys, each value held to the rule of a flat ``obs`` (an array of exactly the
    stored format); a step continues only when every obs field does (bitwise), and its
    side slot holds every obs field. None when the accelerator is not built or off,
    or the table has a deeper nested observation, more than :data:`MAX_EXTRAS` extra fields, an
    extra field that is not a plain number or bool (kinds ``biufc``), a zero-size field or
    another storage (torch). Bool arrays holding bytes other than 0/1 are left to the
    Python paths (which store canonical bools).

    A rows table (``ReplayBuffer(next_obs=False)``: no observation fields) takes the same
    calls with every field an ordinary one (:class:`~replaybank.storage.writers.formats.
    RowsLayout`: ``obs``, ``action``, ``reward``, ``next_obs`` as named, the others in
    ``extras``, nested ones as plain dicts, the flags may be left out) and nothing kept
    aside; it needs at least three fields besides the flags, at most
    :data:`MAX_EXTRAS` + 3 in all, each a plain number or bool.

    Args:
        table: The step table.
        sampler: Told about writes (``on_write(slots, None)``) when not None.
        guard: The owning buffer's call guard (a ``_lane.GuardState``, see
            :mod:`replaybank.buffers.guard`), or None: the compiled calls then return
            False for a thread the guard does not let through.

    Example:
        >>> import numpy as np
        >>> from replaybank.spec import Spec
        >>> spec = Spec.coerce({"obs": ((2,), "float32"), "action": ((), "int64"),
        ...     "reward": ((), "float32"), "terminated": ((), "bool"),
        ...     "truncated": ((), "bool")})
        >>> t = StepTable(spec, T=4, lanes=2, obs_fields=["obs"])
        >>> pair = compiled_writer(t)
        >>> if pair is not None:  # built: one step of both lanes in one call
        ...     z = np.zeros((2, 2), np.float32)
        ...     assert pair[0](z, np.array([0, 1]), np.zeros(2, np.float32), z + 1,
        ...                    np.zeros(2, bool), np.zeros(2, bool), {})
        ...     assert pair[2]([1], z[:1], np.array([0]), np.zeros(1, np.float32), z[:1],
        ...                    np.zeros(1, bool), np.zeros(1, bool), {})  # lane 1 alone
        ...     assert t.size == 3 and t.written.tolist() == [1, 2]
    """
    spec = table.spec
    if not table.obs_fields:
        return _rows_writer(table, sampler, guard)
    std = _STD
    layout = ObsLayout(table.obs_fields)
    obs_names = list(layout.names)
    extras = [n for n in spec if n not in std and n not in layout.names]
    if ACCEL is None or not table.backend.host_numpy \
            or not (layout.flat or (layout.keys is not None and len(obs_names) <= MAX_OBS)) \
            or not set(std) <= set(spec) \
            or any(spec[k].shape != () for k in std[1:]) \
            or any(spec[k].dtype != np.bool_ for k in std[2:]) \
            or len(extras) > MAX_EXTRAS \
            or any(spec[n].dtype.kind not in "biufc" for n in extras):
        return None
    flat = table.flat

    def c_field(n: str, arrays_only: bool = False) -> tuple[Any, str, tuple[int, ...], str,
                                                             int, int]:
        return _c_field(flat(table.arrays[n]), FieldFormat(spec[n].shape, spec[n].dtype),
                        arrays_only)

    dict_obs = not layout.flat
    # a dict observation: its keys and side arrays; its first field stands where a flat
    # obs does, the others follow the extras
    obs_keys = tuple(zip(layout.keys or (), obs_names, strict=True)) if dict_obs else None
    try:
        fields = (c_field(obs_names[0], dict_obs), *(c_field(n) for n in std),
                  *((*c_field(n), n) for n in extras),
                  *(c_field(n, True) for n in obs_names[1:]))
        # files (memmap): the crash-safe order of the step table (start advances before
        # evicted rows are rewritten, written commits after the data; long evicting
        # extends go to the Python paths, which write them in chunks)
        app = ACCEL.Appender(table.side, np.ndarray, np.bool_, fields, flat(table.link),
                             table.written, table.counts, table.episodes, table.lanes,
                             table.durable, table.start, table.chunk, guard, obs_keys)
    except (ValueError, TypeError):  # e.g. a dtype without a buffer format, zero-size
        return None
    if sampler is None:
        return app.add, app.extend, app.add_lanes
    key0 = layout.keys[0] if layout.keys is not None else None

    def steps(args: tuple[Any, ...]) -> int:  # obs (a dict obs: its first field): [n, ...]
        return len(args[0] if key0 is None else args[0][key0])

    return _telling(table, sampler, (app.add, app.extend, app.add_lanes), steps)


def _telling(table: StepTable, sampler: WriteListener, calls: Calls,
             steps: Callable[[tuple[Any, ...]], int]) -> Calls:
    """``calls`` (add, extend, add_lanes) that also tell ``sampler`` which slots they wrote
    (``steps``: the number of steps of an extend's arguments)."""
    c_add, c_extend, c_add_lanes = calls
    tell = announce_last_steps(table, sampler)
    T, L, written = table.T, table.lanes, table.written  # noqa: N806
    every = np.arange(L, dtype=np.int64)

    def add(*args: Any) -> bool:
        if c_add(*args):
            tell(1)
            return True
        return False

    def extend(*args: Any) -> bool:
        if c_extend(*args):
            tell(steps(args))
            return True
        return False

    def add_lanes(lanes: Any, *args: Any) -> bool:
        if c_add_lanes(lanes, *args):  # the lanes were checked: distinct, in range
            ids = every if lanes is None else np.asarray(lanes, dtype=np.int64)
            sampler.on_write((written[ids] - 1) % T * L + ids, None)
            return True
        return False

    return add, extend, add_lanes


def _rows_writer(table: StepTable, sampler: WriteListener | None, guard: Any) -> Calls | None:
    """The compiled calls of a rows table (see :func:`compiled_writer`), or None."""
    spec = table.spec
    layout = RowsLayout(list(spec), {n: len(f.shape) for n, f in spec.items()})
    order = layout.order
    if ACCEL is None or not table.backend.host_numpy or order is None \
            or len(order) > len(_STD) + 1 + MAX_EXTRAS \
            or any(spec[n].dtype.kind not in "biufc" for n in order) \
            or any(spec[k].shape != () or spec[k].dtype != np.bool_ for k in order[3:5]):
        return None
    flat = table.flat

    def c_field(n: str) -> tuple[Any, ...]:
        return _c_field(flat(table.arrays[n]), FieldFormat(spec[n].shape, spec[n].dtype))

    try:  # the first field shows the leading dims (arrays only), extras carry a name
        fields = (_c_field(flat(table.arrays[order[0]]),
                           FieldFormat(spec[order[0]].shape, spec[order[0]].dtype), True),
                  *(c_field(n) for n in order[1:5]), *((*c_field(n), n) for n in order[5:]))
        app = ACCEL.Appender(table.side, np.ndarray, np.bool_, fields, flat(table.link),
                             table.written, table.counts, table.episodes, table.lanes,
                             table.durable, table.start, table.chunk, guard, None, True)
    except (ValueError, TypeError):  # e.g. a dtype without a buffer format, zero-size
        return None
    values = layout.values
    rows_add, rows_extend, rows_add_lanes = app.rows_add, app.rows_extend, app.rows_add_lanes

    def add(obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
            truncated: Any, extras: dict[str, Any]) -> bool:
        v = values((obs, action, reward, next_obs, terminated, truncated), extras)
        return v is not None and bool(rows_add(v))

    def extend(obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
               truncated: Any, extras: dict[str, Any]) -> bool:
        v = values((obs, action, reward, next_obs, terminated, truncated), extras)
        return v is not None and bool(rows_extend(v))

    def add_lanes(lanes: Any, obs: Any, action: Any, reward: Any, next_obs: Any,
                  terminated: Any, truncated: Any, extras: dict[str, Any]) -> bool:
        v = values((obs, action, reward, next_obs, terminated, truncated), extras)
        return v is not None and bool(rows_add_lanes(lanes, v))

    if sampler is None:
        return add, extend, add_lanes

    def steps(args: tuple[Any, ...]) -> int:  # the first field in order: [n, ...]
        v = values(args[:6], args[6])
        return 0 if v is None else len(v[0])

    return _telling(table, sampler, (add, extend, add_lanes), steps)
