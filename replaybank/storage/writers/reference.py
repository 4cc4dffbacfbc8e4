"""The reference writer of the step table: a :class:`~replaybank.storage.writers.plan.WritePlan`
applied step by step. Every other writer leaves the table exactly as this one does.

:func:`write` plans a write of ``n`` steps to any set of lanes (in step or not) with
:func:`~replaybank.storage.writers.plan.plan_write` and :func:`apply` carries it out in the
plan's four steps: evict (``counts`` first, then the evicted steps' side slots), check
whether each lane's previous newest step continues into the first new observation, link
the steps inside the chunk (a side slot where an episode ends or the data jumps, and for
each lane's newest step), then write data and links, relink the previous newest steps and
advance the counters. The compiled writer (``replaybank/_lane.c``) takes the same
decisions in the same order, so the side slots are taken and freed in the same order too
(``tests/test_fastpath.py`` compares whole tables).

This is also the writer wherever the C accelerator is not built, so it decides the
common write (one step of lanes in step) in few steps: the plan's counters as Python
ints, one row of each array for the previous newest steps, side slots as a slice when
they are a run. The decisions and stores are those of the general case.

On a durable table (memmap files) every store keeps the files consistent for a reader
after a kill (see :mod:`~replaybank.storage.table`): ``start`` advances before evicted rows
are rewritten, ``written`` (the commit) advances after the data and links (the previous
newest steps are relinked after it: a newest step always keeps its next obs aside), and a
write that evicts live steps with more than ``table.chunk`` steps goes in chunks of at
most that many steps (so a long ``extend`` never empties the buffer first; its steps that
a later chunk overwrites are written too, so a kill shows a prefix of the write).

Example:
    >>> import numpy as np
    >>> from replaybank.spec import Spec
    >>> from replaybank.storage.table import StepTable
    >>> spec = Spec.coerce({"obs": ((), "int64"), "terminated": ((), "bool"),
    ...                     "truncated": ((), "bool")})
    >>> t = StepTable(spec, T=4, lanes=2, obs_fields=["obs"])
    >>> no = np.zeros((2, 1), bool)
    >>> write(t, np.array([1]), {"obs": np.array([[3], [4]]), "terminated": no,
    ...       "truncated": no}, {"obs": np.array([[4], [5]])}).tolist()  # lane 1 only
    [[1], [3]]
    >>> t.written.tolist(), t.counts.tolist()
    ([0, 2], [0, 2])
"""

from __future__ import annotations

import importlib
from _thread import get_ident
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops.continuity import bitwise_equal_rows, chunk_breaks
from replaybank.spec import (
    QUICK_VALUES,
    UNSET,
    FieldSpec,
    _canonical_bools,
    as_array,
    assignable_dtypes,
    stored_by_assignment,
)
from replaybank.storage.backends.base import DurableBackend
from replaybank.storage.table import StepTable
from replaybank.storage.writers import killpoint
from replaybank.storage.writers.layouts import ObsLayout
from replaybank.storage.writers.plan import WritePlan, plan_write

__all__ = ["StepWriter", "apply", "write"]


def _raw_count_nonzero() -> Callable[[Any], int]:
    """numpy's C ``count_nonzero`` without the Python dispatch wrapper (~5x cheaper)."""
    for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            fn = getattr(importlib.import_module(mod), "count_nonzero", None)
        except ImportError:  # pragma: no cover - depends on the numpy version
            continue
        if callable(fn):
            return fn  # type: ignore[no-any-return]
    return np.count_nonzero  # pragma: no cover


_count_nonzero = _raw_count_nonzero()

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
_NO_KEYS: IntArray = np.zeros((0, 0), dtype=np.int64)
_NO_EXTRAS: list[tuple[str, Any]] = []  # (never changed)


def write(
    table: StepTable,
    lane_ids: IntArray,
    values: Mapping[str, npt.NDArray[Any]],
    next_obs: Mapping[str, npt.NDArray[Any]],
    done: BoolArray | None = None,
    want_keys: bool = True,
) -> IntArray:
    """Append ``n`` steps to each lane in ``lane_ids``: plan, then :func:`apply`.

    Args:
        table: The step table.
        lane_ids: Distinct lanes, ``[m]``.
        values: Every stored field, ``[n, m, *shape]``, already validated and cast.
        next_obs: Next observation of every obs field, ``[n, m, *shape]``.
        done: ``terminated | truncated``, ``[n, m]``; read from ``values`` when None.
        want_keys: Return the keys (False: an empty array).

    Returns:
        Item keys of the written steps, ``[n, m]``.
    """
    if type(lane_ids) is not np.ndarray or lane_ids.dtype != np.int64:
        lane_ids = np.asarray(lane_ids, dtype=np.int64)
    n = int(next(iter(values.values())).shape[0])
    if done is None:
        done = np.asarray(values["terminated"], dtype=bool) | \
            np.asarray(values["truncated"], dtype=bool)
    plan = plan_write(table.T, table.lanes, lane_ids, table.written, table.counts, n)
    if table.durable and plan.evicts and n > table.chunk:
        _apply_chunks(table, lane_ids, values, next_obs, done)
    else:
        apply(table, plan, values, next_obs, done)
    return plan.keys() if want_keys else _NO_KEYS


def _apply_chunks(table: StepTable, lane_ids: IntArray, values: Mapping[str, npt.NDArray[Any]],
                  next_obs: Mapping[str, npt.NDArray[Any]], done: BoolArray) -> None:
    """A durable write of ``n`` steps that evicts live ones, ``table.chunk`` steps at a time
    (each chunk planned and applied whole: evict, write, commit)."""
    n, k = len(done), table.chunk
    for lo in range(0, n, k):
        part = slice(lo, min(lo + k, n))
        plan = plan_write(table.T, table.lanes, lane_ids, table.written, table.counts,
                          part.stop - lo)
        apply(table, plan, {name: v[part] for name, v in values.items()},
              {name: v[part] for name, v in next_obs.items()}, done[part])


def apply(table: StepTable, plan: WritePlan, values: Mapping[str, npt.NDArray[Any]],
          next_obs: Mapping[str, npt.NDArray[Any]], done: BoolArray) -> None:
    """Carry out ``plan`` (see :mod:`~replaybank.storage.writers.plan` for the steps).

    Lanes in step (the plan's :attr:`~replaybank.storage.writers.plan.WritePlan.
    lane_counters`) are written with Python ints for their counters and one row of each
    array for their previous newest steps; the steps and stores are the same.

    Args:
        table: The step table the plan was made for (counters unchanged since).
        plan: The write plan.
        values: Every stored field, ``[n, m, *shape]``.
        next_obs: Next observation of every obs field, ``[n, m, *shape]``.
        done: ``terminated | truncated``, ``[n, m]``.
    """
    if plan.n == 0:
        return
    be, side, link = table.backend, table.side, table.link
    skip = plan.skip
    nk, m = plan.n - skip, len(plan.lane_ids)
    if skip:  # steps this same write overwrites again are dropped
        values = {k: v[skip:] for k, v in values.items()}
        next_obs = {k: v[skip:] for k, v in next_obs.items()}
    done_k = done[skip:] if skip else done
    lanes = slice(None) if plan.all_lanes else plan.lane_ids  # plan.lanes_index
    start, kept_old, new_written, new_counts = plan.counter_values  # ints when in step
    index = plan.index
    # durable tables: a kill test hook before each store to the files (off: KILL_AT == 0)
    point = killpoint.store_point if killpoint.KILL_AT and table.durable else None

    # 1. evict: leaving steps drop out of the window first (durable: start advances, the
    #    truth after a kill; files without start: counts drop instead), then their side
    #    slots are freed (counts take their new values after the commit, step 4)
    if plan.evicts:
        if table.start is not None:
            if point:
                point()
            table.start[lanes] = start
        elif table.durable:
            if point:
                point()
            table.counts[lanes] = kept_old
        side.release(_overwritten_links(link, plan))

    # 2. continuity of each lane's previous newest step with the first new obs
    relink = _continuing(table, plan, values) if plan.continues else None

    # 3. links inside the chunk: a side slot where the data does not continue, and for
    #    each lane's newest step
    need = chunk_breaks(table.obs_fields, values, next_obs, done_k) if nk > 1 else None
    links: Any
    if need is None:  # only the newest step of each lane is kept aside
        taken = side.take_many(m)
        if nk == 1:
            links = [[s + 1 for s in taken]]
        else:
            links = np.zeros((nk, m), dtype=np.int32)
            links[-1] = [s + 1 for s in taken]
        slots = _slots_index(taken, be.host_numpy)
        for name in table.obs_fields:
            if point:
                point()
            be.write(side.arrays[name], slots, next_obs[name][-1])
    else:
        slots = side.alloc(int(np.count_nonzero(need)))
        links = np.zeros((nk, m), dtype=np.int32)
        links[need] = slots + 1
        for name in table.obs_fields:
            if point:
                point()
            be.write(side.arrays[name], slots, next_obs[name][need])

    if table.tail is not None:
        table.tail.record(plan.lane_ids, done_k[-1],
                          {name: next_obs[name][-1] for name in table.obs_fields})

    # 4. data and links (outside the live window), then the commit (written), then relink
    #    the previous newest steps (no longer the newest), then the counts and episodes
    arrays = table.arrays
    for name, v in values.items():
        if point:
            point()
        be.write(arrays[name], index, v)
    if point:
        point()
    link[index] = links
    if point:
        point()
    table.written[lanes] = new_written
    if relink is not None:
        if point:
            point()
        link[relink[0], relink[1]] = 0
        side.release(relink[2])
    if point:
        point()
    table.counts[lanes] = new_counts
    if point:
        point()
    if _count_nonzero(done):  # (adding zeros stores nothing new)
        table.episodes[lanes] += done.sum(axis=0)


def _slots_index(slots: list[int], host: bool) -> Any:
    """Side slots as an index of the side arrays: a slice when they are a run (host arrays:
    a cheaper write than an index array; taken and freed in lane order, they often are)."""
    run = _run(slots) if host and slots else None
    return np.array(slots, dtype=np.int64) if run is None else run


def _run(slots: list[int]) -> slice | None:
    """``slots`` (not empty) as a slice when they are a run, ascending or descending
    (else None). Side slots taken and freed a row of lanes at a time often are: a row
    frees its slots in lane order and the next row takes them back from the end of the
    free list, so the runs alternate in direction."""
    a, b = slots[0], slots[-1]
    k = len(slots)
    if b - a == k - 1:
        return slice(a, b + 1) if k == 1 or slots == list(range(a, b + 1)) else None
    if a - b == k - 1 and slots == list(range(a, b - 1, -1)):
        return slice(a, b - 1 if b else None, -1)
    return None


def _overwritten_links(link: npt.NDArray[np.int32], plan: WritePlan) -> npt.NDArray[np.int32]:
    """Links of the live old steps the write overwrites, row-major ``[k]`` (0: no slot)."""
    old: npt.NDArray[np.int32] = link[plan.index].reshape(plan.kept, len(plan.lane_ids))
    if plan.lane_counters is not None and plan.skip == 0:  # old: [nk, m]
        # in step: kept row i held a live old step when i >= T - counts
        return old[plan.T - plan.lane_counters[1]:]
    gone: npt.NDArray[np.int32] = old[plan.evicted]
    return gone


def _continuing(table: StepTable, plan: WritePlan, values: Mapping[str, npt.NDArray[Any]],
                ) -> tuple[Any, Any, Any] | None:
    """The lanes whose previous newest step continues into the first new observation (it
    kept its next obs aside, did not end an episode, and that obs is bitwise the new one):
    ``(rows, lanes, links)`` to relink after the commit, or None when none does."""
    link, side = table.link, table.side
    counters = plan.lane_counters
    if counters is not None and table.tail is None:
        # lanes in step, host arrays: the previous steps are one row of each array; the
        # common case (each kept its obs aside, none ended, all continue) in a few steps
        row = (counters[0] - 1) % plan.T
        arrays = table.arrays
        lanes: Any = slice(None) if plan.all_lanes else plan.lane_ids
        at = row if plan.all_lanes else (row, lanes)
        plink = link[at].tolist()  # [m]
        if 0 not in plink and not _count_nonzero(arrays["terminated"][at]) \
                and not _count_nonzero(arrays["truncated"][at]):
            slots = [k - 1 for k in plink]
            for name in table.obs_fields:
                old, new = side.arrays[name].take(slots, axis=0), values[name][0]
                if old.dtype != new.dtype or old.tobytes() != new.tobytes():
                    break
            else:
                return row, lanes, plink
    be = table.backend
    if counters is not None:  # in step: every lane, the same row
        pos = np.arange(len(plan.lane_ids))
        prow, plane = np.full(len(pos), (counters[0] - 1) % plan.T), plan.lane_ids
    else:
        pos, prow, plane = plan.prev_pos, plan.prev_rows, plan.lane_ids[plan.prev_pos]
    plink = link[prow, plane]  # [p]
    pend = plink > 0
    if not pend.all():
        pos, prow, plane, plink = pos[pend], prow[pend], plane[pend], plink[pend]
    if not len(pos):
        return None
    if table.tail is not None:  # device storage: the host copy of the tail
        same = ~table.tail.done[plane]
        for name in table.obs_fields:
            same &= bitwise_equal_rows(table.tail.next_obs[name][plane], values[name][0, pos])
    else:
        same = ~(np.asarray(be.to_numpy(be.gather(table.arrays["terminated"], (prow, plane))),
                            dtype=bool)
                 | np.asarray(be.to_numpy(be.gather(table.arrays["truncated"], (prow, plane))),
                              dtype=bool))
        for name in table.obs_fields:
            kept = be.to_numpy(be.gather(side.arrays[name], plink - 1))
            same &= bitwise_equal_rows(kept, values[name][0, pos])
    if not same.any():
        return None
    return prow[same], plane[same], plink[same]


# ---------------------------------------------------------------- one step of every lane
_ND = np.ndarray
#: Scalar types a float field takes as they are (cast to the field's dtype by its type).
_FLOATS = (float, np.float64, np.float32)
_INT64 = np.dtype(np.int64)
#: Float fields that take a float scalar by their scalar type's constructor.
_REALS = (np.dtype(np.float32), np.dtype(np.float64))
_BOOL = np.dtype(np.bool_)
#: How a scalar field takes a Python or numpy scalar without the general cast.
_F, _B, _I, _OTHER = 0, 1, 2, 3
#: A field as :class:`StepWriter` checks it: ``(name, argument name, field, per-step shape,
#: shape with the lanes' dim, dtype, is bool, scalar rule, dtype of the arrays taken as
#: they are (None for bool: their bytes are checked), the dtypes of arrays taken uncast
#: (:func:`~replaybank.spec.assignable_dtypes`))``.
_Field = tuple[str, str, FieldSpec, tuple[int, ...], tuple[int, ...], np.dtype[Any], bool, int,
               np.dtype[Any] | None, frozenset[np.dtype[Any]]]
#: A flag value of a step none of whose flags is set, as :class:`StepWriter` recognises and
#: stores it: ``(its bytes as a bool array, the list of Python bools [False] * L, the list
#: of their types, the bool array of L zeros, read-only, stored for it)``.
_NoFlags = tuple[bytes, list[bool], list[type], npt.NDArray[np.bool_]]
#: A call as :class:`StepWriter` casts it: ``(obs, next_obs, action, reward, [(extra
#: field, value)], terminated, truncated, any flag set, [(field index, obs, next obs)] of
#: the observation fields after the first)``. A dict observation's first field takes the
#: ``obs`` slot.
_Cast = tuple[Any, Any, Any, Any, list[tuple[str, Any]], Any, Any, bool,
              list[tuple[int, Any, Any]]]
_NO_OBS: list[tuple[int, Any, Any]] = []  # (never changed)


class StepWriter:
    """The Python writer's ``add`` of one step to every lane of a table whose lanes are in
    step: the call's values checked and cast, then the write that :func:`write` makes of
    it, decided with Python ints (the common call of a training loop where no compiler
    built ``replaybank._lane``).

    It takes exactly what the Python boundary would accept unchanged and writes the
    same bytes, slots and counters as :func:`write` (``tests/test_pure_python_writer.py``
    compares whole states on random sequences). A dict observation is a tree of plain
    dicts with exactly the table's keys (:class:`~replaybank.storage.writers.layouts.
    ObsLayout`): each field is cast, kept aside and compared for continuity as a flat
    observation is. Anything else (an ``extend``, ``env_ids``, lanes out of step, an
    observation mapping that is not such a dict, a value a casting rule refuses, a
    missing or unknown field) returns 0 before anything is stored, and the caller's
    Python boundary (:func:`~replaybank.buffers.checked_call.check_call`) takes the call
    and names any error. Each value is cast by its field's own rule
    (:meth:`~replaybank.spec.FieldSpec.cast`), except values that rule returns
    unchanged (an array of the stored dtype and shape) and a few scalars it would
    convert exactly as numpy's scalar constructors do (a Python or numpy float into a
    float field, a bool or 0/1 int into a bool field, a Python int into an int64 field).

    Args:
        table: The step table (see :attr:`serves`).
        guard: The owning buffer's call guard, checked by each :meth:`write` (see
            :attr:`guard`), or None when the caller holds it.

    On a table of files (memmap, :class:`~replaybank.storage.backends.base.
    DurableBackend`) it stores in :func:`apply`'s crash-safe order: an evicting step moves
    ``start`` first (files written before ``start`` existed: ``counts``), then the kept
    next observations, the rows, the link and ``written`` (the commit), the relink of the
    previous newest steps, the counts (where they change) and the episodes, with the
    kill-test hook before each store
    (``tests/test_hardening_inputs.py`` kills it at every one).

    Attributes:
        serves: The table is one this writer writes (host numpy arrays in memory or in
            files of a :class:`~replaybank.storage.backends.base.DurableBackend`, a
            flat ``obs`` field or the fields of a dict observation, ``action``, the
            standard flags as bool scalars, no dict extras, no zero-size field); when
            False, :meth:`write` always returns 0.

    Example:
        >>> from replaybank.spec import Spec
        >>> spec = Spec.coerce({"obs": ((2,), "float32"), "action": ((), "int64"),
        ...     "reward": ((), "float32"), "terminated": ((), "bool"),
        ...     "truncated": ((), "bool")})
        >>> t = StepTable(spec, T=4, lanes=1, obs_fields=["obs"])
        >>> w = StepWriter(t)
        >>> w.write(None, False, np.zeros(2), 1, 0.5, np.ones(2), False, False, {})
        1
        >>> w.write(None, False, np.zeros(2), 1.5, 0.5, np.ones(2), False, False, {})
        0
        >>> t.written.tolist(), t.arrays["action"][:, 0].tolist()  # 1.5 was refused
        ([1], [1, 0, 0, 0])
        >>> spec = Spec.coerce({"obs/pos": ((2,), "float32"), "obs/goal": ((2,), "float32"),
        ...     "action": ((), "int64"), "reward": ((), "float32"),
        ...     "terminated": ((), "bool"), "truncated": ((), "bool")})
        >>> t = StepTable(spec, T=4, lanes=1, obs_fields=["obs/pos", "obs/goal"])
        >>> o = {"pos": np.zeros(2), "goal": np.ones(2)}
        >>> StepWriter(t).write(None, False, o, 1, 0.5, o, False, False, {})
        1
        >>> StepWriter(t).write(None, False, {"pos": np.zeros(2)}, 1, 0.5, o, False,
        ...                     False, {})  # a key missing: the Python boundary names it
        0
    """

    def __init__(self, table: StepTable, guard: Any = None) -> None:
        self.table = table
        #: The owning buffer's call guard (its flags ``busy``, ``shared``, ``owner``; see
        #: :mod:`replaybank.buffers.guard`), checked by :meth:`write` as the compiled
        #: writer checks it: the owner thread's call while the guard is not shared
        #: writes, with ``busy`` raised (unless its own call raised it), the thread
        #: holding the lock while it is; any other returns 0 and leaves the flags alone.
        #: None: no check (the caller holds the guard).
        self.guard = guard
        spec = table.spec
        std = ("action", "reward", "terminated", "truncated")
        #: where the observation fields are found in a call's obs (a flat one: the value)
        self.layout = ObsLayout(table.obs_fields)
        self.obs_names = self.layout.names
        self.dict_obs = not self.layout.flat
        self.extra_names = tuple(n for n in spec if n not in std and n not in self.obs_names)
        self.extra_keys = frozenset(self.extra_names)
        be = table.backend
        #: files: the crash-safe order of stores (and the kill-test hook before each)
        self.durable = table.durable
        #: files written before ``start`` existed: an evicting step drops ``counts`` first
        #: (with ``start``, the truth of a reopened table, full lanes' counts stay ``T``)
        self.drops = table.durable and table.start is None
        self.serves = (
            be.host_numpy and (not table.durable or isinstance(be, DurableBackend))
            and table.tail is None and bool(self.obs_names) and self.layout.valid
            and all(n in spec for n in std)
            and all(spec[n].shape == () and spec[n].dtype == _BOOL
                    for n in ("terminated", "truncated"))
            and not any("/" in n for n in self.extra_names)
            and all(f.nbytes > 0 for f in spec.values()))
        self.T, self.L = table.T, table.lanes
        zeros = np.zeros(self.L, _BOOL)
        zeros.flags.writeable = False
        #: a row of flags none of which is set (:data:`_NoFlags`)
        self.no_flags: _NoFlags = (bytes(self.L), [False] * self.L, [bool] * self.L, zeros)
        #: the bytes of a flag array of L zeros by its dtype (bool and the integer dtypes
        #: a bool field takes by assignment)
        self.zero_flags = {dt: bytes(self.L * dt.itemsize)
                           for dt in (_BOOL, *assignable_dtypes(_BOOL))}

        def field(name: str, arg: str, obs: bool = False) -> _Field:
            f = spec[name]
            dt = f.dtype
            rule = _OTHER
            # (a scalar obs is cast as an array: its bytes are compared for continuity)
            if f.shape == () and self.L == 1 and not obs:
                rule = _B if dt == _BOOL else _F if dt in _REALS else \
                    _I if dt == _INT64 else _OTHER
            bools = dt.kind == "b"
            return (name, arg, f, f.shape, (self.L, *f.shape), dt, bools, rule,
                    None if bools else dt, assignable_dtypes(dt))

        #: Per observation field: its :data:`_Field` as ``obs`` and as ``next_obs`` (next
        #: obs go aside as whole rows, one put, when each is one flat row: :attr:`keeps`)
        self.obs: tuple[_Field, ...] = ()
        self.next_obs: tuple[_Field, ...] = ()
        self.keeps: tuple[tuple[str, np.dtype[Any], np.dtype[Any] | None,
                                tuple[int, ...] | None], ...] = ()
        if self.serves:
            flat = self.layout.flat
            self.obs = tuple(field(n, n, True) for n in self.obs_names)
            self.next_obs = tuple(field(n, "next_obs" if flat else "next_" + n, True)
                                  for n in self.obs_names)
            self.std = tuple(field(n, n) for n in std)
            self.extras = tuple(field(n, n) for n in self.extra_names)
            #: the first observation field (a dict observation's takes the obs slot)
            self.obs0, self.next_obs0 = self.obs[0], self.next_obs[0]
            #: the fields after the first: (index, as obs, as next obs)
            self.rest_fields = tuple((i, self.obs[i], self.next_obs[i])
                                     for i in range(1, len(self.obs)))
            self.obs_name, self.obs_dtype = self.obs0[0], self.obs0[5]
            self.obs_ndim = len(self.obs0[3])  # (its value shows the lead)
            #: an observation field is a scalar per step
            self.scalar_obs = any(not f[3] for f in self.obs)
            obs_rows = [np.dtype((np.void, f[2].nbytes)) if len(f[3]) <= 1 else None
                        for f in self.obs]
            #: per observation field: (name, dtype, its flat row as a void item or None,
            #: the strides of [L, *shape] in C order or None), for :meth:`_keep`
            self.keeps = tuple((f[0], f[5], vt, None if vt is None else
                                np.zeros(f[4], f[5]).strides)
                               for f, vt in zip(self.obs, obs_rows, strict=True))
        #: every observation field is one flat row (the memo keeps their bytes)
        self.flat_rows = all(k[2] is not None for k in self.keeps)
        #: The table as this writer's last step left it (:meth:`_apply`): ``(written,
        #: epoch, counts, the bytes of the next obs it kept aside (of every observation
        #: field, joined) or None, their side slots)``, valid while ``written`` and
        #: ``epoch`` are unchanged.
        self._memo: tuple[list[int], int, int, bytes | None, list[int]] | None = None
        #: Per observation field, the side store's array and its view as one void item
        #: per flat row (remade when the store grows; the old array is let go at the
        #: next step).
        self._kept_rows: list[tuple[Any, Any]] = [(None, None)] * len(self.obs)
        #: Per observation field kept as flat rows: an ``[L, *shape]`` array of its dtype
        #: in C order that a next obs of another dtype, or strided, is cast or copied into
        #: (by assignment: as ``astype`` casts, without making an array per step); read
        #: only within the step that fills it.
        self._staged: list[Any] = [None if k[2] is None else np.empty(f[4], f[5])
                                   for k, f in zip(self.keeps, self.obs, strict=True)]
        #: Per tuple of side slots taken: the slots as an index array and the link row.
        self._links: dict[tuple[int, ...], tuple[npt.NDArray[np.intp], npt.NDArray[Any]]] = {}
        #: A link row of no side slots, assigned to a row whose next obs all continue
        #: (cheaper than ``fill(0)`` of the row's view).
        self._no_links = np.zeros(self.L, table.link.dtype)

    def write(self, lanes: Any, steps: Any, obs: Any, action: Any, reward: Any,
              next_obs: Any, terminated: Any, truncated: Any, extras: dict[str, Any]) -> int:
        """Write one ``add`` (the compiled writer's call signature,
        :data:`~replaybank.storage.writers.compiled.WriteCall`).

        Args:
            lanes: The call's ``env_ids`` (this writer takes only None: every lane).
            steps: The call is an ``extend`` (not taken).
            obs: ``[*shape]`` or ``[1, *shape]`` (one lane), ``[L, *shape]`` (L lanes).
            action: As ``obs`` (so are the others, without the per-step shape for the
                scalar fields).
            reward: Reward.
            next_obs: Next observation.
            terminated: Terminal flag.
            truncated: Truncation flag.
            extras: Other stored fields, by their flat names.

        Returns:
            1 when the step was written, 0 when the call is not for this writer (nothing
            stored).
        """
        if lanes is not None or steps or not self.serves:
            return 0
        if (extras.keys() != self.extra_keys) if extras or self.extra_names else False:
            return 0
        if obs is UNSET or action is UNSET or reward is UNSET or next_obs is UNSET \
                or terminated is UNSET or truncated is UNSET:
            return 0
        guard = self.guard
        raised = False
        if guard is not None:  # (the compiled writer's check, in this writer's own call)
            me = get_ident()
            if guard.shared:
                if guard.holder != me:
                    return 0
            elif me != guard.owner:  # (only the owner writes busy: the guard's handshake)
                return 0
            elif not guard.busy:  # (busy: inside the owner's own call, which lowers it)
                guard.busy = raised = True  # raised before shared is read again
                if guard.shared:
                    guard.busy = False
                    return 0
        try:
            return self._cast_all(obs, action, reward, next_obs, terminated, truncated, extras)
        finally:
            if raised:
                guard.busy = False

    def _cast_all(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
                  truncated: Any, extras: dict[str, Any]) -> int:
        """Cast the call's values as :func:`_cast` gives them and write them
        (:meth:`_apply`, or :meth:`_apply_one` for one lane), returning what that returns
        (the cast values go on as its arguments: :data:`_Cast`). Returns 0, writing
        nothing, when the observation fields are not found (a dict observation that is
        not a tree of plain dicts with exactly the table's keys), a leading dim is not the
        one this writer takes, or a cast raises (the Python boundary raises it again,
        named: :meth:`FieldSpec.cast`)."""
        try:
            rest: list[tuple[int, Any, Any]] = _NO_OBS
            both: tuple[list[Any], list[Any]] | None = None
            if self.dict_obs:  # the first field takes the obs slot, the others rest
                parts, nparts = self.layout.parts(obs), self.layout.parts(next_obs)
                if parts is None or nparts is None:
                    return 0
                obs, next_obs = parts[0], nparts[0]
                both = (parts, nparts)
            # the leading dims, from the (first) observation field (as the Python boundary
            # reads them)
            a = obs if type(obs) is _ND else as_array(obs)
            extra_dims = a.ndim - self.obs_ndim
            L = self.L  # noqa: N806
            if L == 1:
                if extra_dims == 0:
                    lead: tuple[int, ...] = ()
                elif extra_dims == 1 and not self.scalar_obs:
                    # (a scalar obs field's [1] value goes to one side slot: the Python
                    # boundary takes it, as the lane's value)
                    lead = (1,)
                else:
                    return 0
            elif extra_dims == 1:
                lead = (L,)
            else:
                return 0
            # an array of a field's own dtype (not bool) and shape is taken as it is, here
            # without a call (_cast would return it too)
            # (or uncast, when its dtype casts with no check, as _cast would return it too)
            k = 4 if lead else 3  # the field's shape with or without the lanes' dim
            f, nf = self.obs0, self.next_obs0
            o = obs if type(obs) is _ND and (obs.dtype is f[8] or obs.dtype in f[9]) \
                and obs.shape == f[k] else _cast(f, obs, lead, a)
            no = next_obs if type(next_obs) is _ND and (next_obs.dtype is nf[8]
                                                        or next_obs.dtype in nf[9]) \
                and next_obs.shape == nf[k] else _cast(nf, next_obs, lead, None)
            f, rf, tf, uf = self.std
            act = action if type(action) is _ND and (action.dtype is f[8]
                                                     or action.dtype in f[9]) \
                and action.shape == f[k] else _cast(f, action, lead, None)
            rew = reward if type(reward) is _ND and (reward.dtype is rf[8]
                                                     or reward.dtype in rf[9]) \
                and reward.shape == rf[k] else _cast(rf, reward, lead, None)
            more = [(f[0], _cast(f, extras[f[0]], lead, None)) for f in self.extras] \
                if self.extras else _NO_EXTRAS
            if both is not None:  # the other observation fields (as the first; one loop)
                rest = []
                parts, nparts = both
                for i, f, nf in self.rest_fields:
                    x, nx = parts[i], nparts[i]
                    rest.append((i, x if type(x) is _ND and (x.dtype is f[8] or x.dtype in f[9])
                                 and x.shape == f[k] else _cast(f, x, lead, None),
                                 nx if type(nx) is _ND and (nx.dtype is nf[8] or nx.dtype in nf[9])
                                 and nx.shape == nf[k] else _cast(nf, nx, lead, None)))
            # the flags, and whether any is set (bool arrays: from the bytes checked anyway)
            # (bool or integer arrays none of whose flags is set, the common step: stored as
            # the writer's bool zeros)
            none, zeros = self.no_flags, self.zero_flags
            if type(terminated) is _ND and terminated.shape == tf[k] \
                    and terminated.tobytes() == zeros.get(terminated.dtype):
                term, ended = none[3], False
            else:
                term, ended = _flag(tf, terminated, lead, none)
            if type(truncated) is _ND and truncated.shape == uf[k] \
                    and truncated.tobytes() == zeros.get(truncated.dtype):
                trunc = none[3]
            else:
                trunc, cut = _flag(uf, truncated, lead, none)
                ended = ended or cut
        except Exception:  # the Python boundary raises it again, named
            return 0
        if L > 1:
            return self._apply(o, no, act, rew, more, term, trunc, ended, rest)
        return self._apply_one(o, no, act, rew, more, term, trunc, ended, rest)

    def _apply(self, o: Any, no: Any, act: Any, rew: Any, more: list[tuple[str, Any]],
               term: Any, trunc: Any, ends: bool, rest: list[tuple[int, Any, Any]]) -> int:
        """:func:`apply` of one step to every lane, lanes in step (0 when they are not):
        the values of :data:`_Cast`. The same decisions, so the same slots are taken and
        freed in the same order and the table ends the same. The continuity check reads
        the new obs as stored (values may come uncast, :func:`_cast`), after the commit;
        in memory, full lanes' counts, which end as they started, are not stored (files:
        :func:`apply`'s order, see the class).

        When nothing but this writer wrote since its last step (:attr:`_memo` still
        describes the table: the same ``written`` and ``epoch``; every other write moves
        ``written`` and a clear or load moves ``epoch``), the counters, the previous
        newest steps' side slots and the bytes kept in them come from the memo instead of
        the table: the same values, read without a numpy call."""
        t = self.table
        written, link, side = t.written, t.link, t.side
        wl = written.tolist()
        T, L = self.T, self.L  # noqa: N806
        memo = self._memo
        if memo is not None and memo[0] == wl and memo[1] == t.epoch:
            _, _, c, seen, ptaken = memo
        else:
            cl = t.counts.tolist()
            c = cl[0]
            if wl.count(wl[0]) != L or cl.count(c) != L:
                return 0
            seen = ptaken = None
        w = wl[0]
        row = w % T
        prow = row - 1 if row else T - 1
        known = ptaken is not None and T > 1  # the previous newest steps' slots: ptaken
        free = side.free
        durable = self.durable
        point = killpoint.store_point if durable and killpoint.KILL_AT else None
        # 1. evict (full lanes, c == T): the steps in the row written leave and free their
        #    side slots; read with the links of the previous newest steps (row - 1),
        #    whose next obs the new obs may continue (c > 0, T > 1)
        plink = None
        if c >= T:
            if known or T == 1:
                gone = link[row].tolist()
            elif row:
                plink, gone = link[row - 1:row + 1].tolist()
            else:
                gone = link[0].tolist()
                plink = link[T - 1].tolist()
            if gone.count(0) != L:
                free.extend([k - 1 for k in gone if k > 0])
            if durable:
                _evict_counters(t, w + 1 - T, T - 1, point)
        elif c and not known:
            plink = link[prow].tolist()
        # 2. the new steps are their lanes' newest: their next obs go aside in the slots
        #    SideStore.take_many would give (the last L free ones, from the end), each
        #    flat row as one void item (one put)
        if len(free) >= L:
            taken = free[:-L - 1:-1]
            del free[-L:]
        else:
            taken = side.take_many(L)
        # the slots taken as an index array and as the link row (the lanes' slots change
        # only where an episode ends or the data jumps: the same few tuples come back)
        key = tuple(taken)
        made = self._links.get(key)
        if made is None:
            if len(self._links) >= 64:
                self._links.clear()
            made = self._links[key] = (np.array(taken, np.intp),
                                       np.array([k + 1 for k in taken], link.dtype))
        at, links = made
        side_arrays = side.arrays
        no = self._keep(0, no, side_arrays, taken, at, point)
        # 3. data, links, the commit
        arrays = t.arrays
        _store_rows(arrays, row, self.obs_name, o, act, rew, more, term, trunc, point)
        if rest:  # the other observation fields: next obs aside and rows (before the
            # commit, in any order), and the bytes of both as stored
            kept_b, new_b = [no.tobytes()], []
            for i, x, nx in rest:
                kept_b.append(self._keep(i, nx, side_arrays, taken, at, point).tobytes())
                if point:
                    point()
                arrays[self.obs[i][0]][row] = x
                new_b.append(self._as_stored(i, x, row).tobytes())
        if point:
            point()
        link[row] = links
        if point:
            point()
        written.fill(w + 1)
        # 4. the previous newest steps that continue into the new obs (as stored) give
        #    their side slots back, in lane order (the common case: every lane does);
        #    then the counts and episodes
        new = o if o.dtype is self.obs_dtype else arrays[self.obs_name][row]
        if ptaken is not None and known:
            if seen is not None and seen == (new.tobytes() if not rest else
                                             new.tobytes() + b"".join(new_b)):
                # (no flag set, all continue)
                if point:
                    point()
                link[prow] = self._no_links
                free.extend(ptaken)
            else:
                self._relink(prow, [k + 1 for k in ptaken], self._stored_new(new, rest, row),
                             point)
        elif plink is not None:
            none = self.no_flags[0]
            news = self._stored_new(new, rest, row)
            if 0 in plink or arrays["terminated"][prow].tobytes() != none \
                    or arrays["truncated"][prow].tobytes() != none:
                self._relink(prow, plink, news, point)
            else:
                slots = [k - 1 for k in plink]
                if all(side.arrays[name].take(slots, axis=0).tobytes() == x.tobytes()
                       for name, x in zip(self.obs_names, news)):  # noqa: B905
                    if point:
                        point()
                    link[prow].fill(0)
                    free.extend(slots)
                else:
                    self._relink(prow, plink, news, point)
        if c < T or self.drops:  # (files without start: an evicting step stored T - 1)
            c = c + 1 if c < T else T
            if point:
                point()
            t.counts.fill(c)
        if ends:
            if point:
                point()
            t.episodes += np.logical_or(term, trunc)
        # what the next step needs to know of this one (the bytes its kept next obs
        # hold, read back from `no` as stored; None when a flag is set or obs rows are
        # not flat: the table is read then)
        self._memo = ([w + 1] * L, t.epoch, c, None if ends or not self.flat_rows else
                      no.tobytes() if not rest else b"".join(kept_b), taken)
        return 1

    def _keep(self, i: int, no: Any, side_arrays: dict[str, Any], taken: list[int],
              at: npt.NDArray[np.intp], point: Callable[[], None] | None) -> Any:
        """Store the next obs ``no`` ``[L, *shape]`` of observation field ``i`` aside, in
        the side slots ``taken`` of ``side_arrays`` (``at``: as an index array), after
        the kill-test hook ``point``; returns it as stored when each is one flat row
        (cast and in C order: one void item per lane, one put), else as given."""
        name, dt, vt, strides = self.keeps[i]
        kept = side_arrays[name]
        if vt is not None and (no.dtype is not dt or no.strides != strides):
            # an uncast value cast as the store would, or a strided one copied (a row at
            # a time cost 0.5 us more than the copy and one put; an assignment into the
            # staged array 0.2 us less than astype)
            staged = self._staged[i]
            staged[...] = no
            no = staged
        if point:
            point()
        if vt is not None:
            src, kv = self._kept_rows[i]
            if src is not kept:  # (the side store grew: a new array)
                kv = kept.view(vt)
                self._kept_rows[i] = (kept, kv)
            kv.put(at, no.view(vt))
        elif self.L <= 8:  # a row at a time: cheaper than an index array for a few lanes
            for s, x in zip(taken, no):  # noqa: B905 - both L long
                kept[s] = x
        else:
            kept[_slots_index(taken, True)] = no
        return no

    def _rest_continues(self, slot: int, rest: list[tuple[int, Any, Any]], row: int) -> bool:
        """Whether the next obs kept in side slot ``slot`` of every observation field
        after the first (``rest``, :data:`_Cast`) is bitwise its new obs as stored in
        ``row``."""
        side_arrays = self.table.side.arrays
        for i, x, _ in rest:
            if side_arrays[self.obs[i][0]][slot].tobytes() != \
                    self._as_stored(i, x, row).tobytes():
                return False
        return True

    def _as_stored(self, i: int, x: Any, row: int) -> Any:
        """The value ``x`` of observation field ``i`` as stored in ``row``: itself, or
        read back when it came uncast (:func:`_cast`)."""
        f = self.obs[i]
        return x if x.dtype is f[5] else self.table.arrays[f[0]][row]

    def _stored_new(self, new: Any, rest: list[tuple[int, Any, Any]], row: int) -> list[Any]:
        """The new obs of every observation field as stored in ``row`` (``new``: the
        first field's; ``rest``: the others', :data:`_Cast`)."""
        return [new, *(self._as_stored(i, x, row) for i, x, _ in rest)]

    def _relink(self, prow: int, plink: list[int], news: list[Any],
                point: Callable[[], None] | None) -> None:
        """``_continuing`` lane by lane: unlink the previous newest steps (row ``prow``,
        links ``plink``) that kept their next obs aside, did not end, and whose kept obs
        is bitwise their lane's row of ``news`` (the new obs of each observation field as
        stored), and free their side slots in lane order (``point``: the kill-test hook
        before the store)."""
        t = self.table
        arrays = t.arrays
        term, trunc = arrays["terminated"][prow].tolist(), arrays["truncated"][prow].tolist()
        fields = [(t.side.arrays[name], o.reshape(self.L, -1))
                  for name, o in zip(self.obs_names, news)]  # noqa: B905 - one per field
        lanes: list[int] = []
        for i, k in enumerate(plink):
            if k > 0 and not term[i] and not trunc[i] and all(
                    kept[k - 1].tobytes() == rows[i].tobytes() for kept, rows in fields):
                lanes.append(i)
        if lanes:
            if point:
                point()
            t.link[prow, lanes] = 0
            t.side.free.extend([plink[i] - 1 for i in lanes])

    def _apply_one(self, o: Any, no: Any, act: Any, rew: Any, more: list[tuple[str, Any]],
                   term: Any, trunc: Any, ends: bool, rest: list[tuple[int, Any, Any]]) -> int:
        """:meth:`_apply` of a one-lane table (its counters and links as Python ints)."""
        t = self.table
        T = self.T  # noqa: N806
        written, counts, link, side = t.written, t.counts, t.link, t.side
        w, c = written.item(0), counts.item(0)
        row = w % T
        arrays = t.arrays
        free = side.free
        point = killpoint.store_point if self.durable and killpoint.KILL_AT else None
        # 1. evict: the step in the row written leaves (a full lane: c == T)
        if c > 0 and c + 1 > T:
            k = link.item(row, 0)
            if k > 0:
                free.append(k - 1)
            if self.durable:
                _evict_counters(t, w + 1 - T, T - 1, point)
        # 2. the new step is the lane's newest: its next obs goes aside
        s = free.pop() if free else side.take_many(1)[0]
        f = self.obs0
        kept = side.arrays[f[0]]
        if point:
            point()
        kept[s] = no
        # 3. data, link, the commit
        _store_rows(arrays, row, self.obs_name, o, act, rew, more, term, trunc, point)
        if rest:  # the other observation fields (before the commit: in any order)
            for i, x, nx in rest:
                name = self.obs[i][0]
                if point:
                    point()
                side.arrays[name][s] = nx
                if point:
                    point()
                arrays[name][row] = x
        if point:
            point()
        link[row, 0] = s + 1
        if point:
            point()
        written[0] = w + 1
        # 4. the previous newest step continues into the new obs (as stored): it gives
        #    its side slot back; then the count and episodes
        if c > 0 and T > 1:
            prow = (w - 1) % T
            pk = link.item(prow, 0)
            if pk and not arrays["terminated"].item(prow, 0) \
                    and not arrays["truncated"].item(prow, 0) and kept[pk - 1].tobytes() \
                    == (o if o.dtype is f[5] else arrays[f[0]][row]).tobytes() \
                    and (not rest or self._rest_continues(pk - 1, rest, row)):
                if point:
                    point()
                link[prow, 0] = 0
                free.append(pk - 1)
        if c < T or self.drops:  # (files without start: an evicting step stored T - 1)
            if point:
                point()
            counts[0] = c + 1 if c < T else T
        if ends:
            if point:
                point()
            t.episodes[0] += 1
        return 1


def _evict_counters(t: StepTable, start: int, kept: int,
                    point: Callable[[], None] | None) -> None:
    """A durable table's first store of a step that evicts one step of every lane
    (lanes in step), after the kill-test hook ``point``: ``start`` advances (the truth of
    a reopened table: ``counts`` of full lanes then stay ``T`` and are not stored), or,
    in files written before ``start`` existed, ``counts`` drop to ``kept``."""
    if point:
        point()
    if t.start is not None:
        t.start.fill(start)
    else:
        t.counts.fill(kept)


def _store_rows(arrays: dict[str, Any], row: int, obs_name: str, o: Any, act: Any, rew: Any,
                more: list[tuple[str, Any]], term: Any, trunc: Any,
                point: Callable[[], None] | None) -> None:
    """The rows of one step (:class:`StepWriter`; ``o``: the first observation field's,
    ``obs_name``), each field after the kill-test hook ``point`` when one is armed."""
    if point is None:
        arrays[obs_name][row] = o
        arrays["action"][row] = act
        arrays["reward"][row] = rew
        for name, v in more:
            arrays[name][row] = v
        arrays["terminated"][row] = term
        arrays["truncated"][row] = trunc
        return
    for name, v in ((obs_name, o), ("action", act), ("reward", rew), *more,
                    ("terminated", term), ("truncated", trunc)):
        point()
        arrays[name][row] = v


def _cast(f: _Field, v: Any, lead: tuple[int, ...], arr: npt.NDArray[Any] | None) -> Any:
    """``v`` as the Python boundary stores it in field ``f`` (:meth:`FieldSpec.cast`),
    an exactly converted scalar where the field takes one (:class:`StepWriter`), or
    ``v`` itself, uncast, when that rule would cast it by ``astype`` only (an array of
    the right shape whose dtype casts with no check, or whose values the rule's quick
    check on Python numbers takes): the array it is stored in casts it as ``astype``
    does."""
    t = type(v)
    if t is list and lead:  # a value per lane: the array the Python boundary makes of it
        arr = np.asarray(v)
        a, t = arr, _ND
    else:
        a = v
    if t is _ND:
        if a.shape == f[4 if lead else 3]:
            vd, dt = a.dtype, f[5]
            if vd is not dt and vd != dt:
                # taken uncast when the cast would be astype alone (a dtype whose rule
                # checks nothing, or whose rule, made by an earlier cast of this dtype
                # pair, takes these values)
                return a if (vd in f[9] and not f[6]) or stored_by_assignment(a, dt) \
                    else f[2].cast(f[1], v, lead, arr)
            if not f[6] or _canonical_bools(a):
                return a
    elif f[7] != _OTHER and not lead:
        rule, dt = f[7], f[5]
        if rule == _F:
            if t in _FLOATS:
                return dt.type(v)
        elif rule == _B:
            if t is bool or t is np.bool_:
                return v
            if t is int and (v == 0 or v == 1):
                return v == 1
        elif t is int and -(2**63) <= v < 2**63:
            return v
    return f[2].cast(f[1], v, lead, arr)


def _flag(f: _Field, v: Any, lead: tuple[int, ...], none: _NoFlags) -> tuple[Any, bool]:
    """A flag field's value as :func:`_cast` gives it, and whether any flag in it is set;
    ``none``: the writer's value none of whose flags is set (:data:`_NoFlags`), returned
    for a value that says so (a list of Python bools, all False; integers, all 0)."""
    if type(v) is list and lead:  # a value per lane: as the Python boundary reads it
        # (the common step of a loop that keeps its flags in lists: no array made; equal
        # to False and of type bool is False itself)
        if v == none[1] and list(map(type, v)) == none[2]:
            return none[3], False
        v = np.asarray(v)
    if type(v) is _ND and v.shape == f[4 if lead else 3]:
        if v.dtype is _BOOL:
            b = v.tobytes()
            if b == none[0]:
                return v, False
            if not b.translate(None, b"\x00\x01"):  # canonical bools
                return v, True
        elif v.dtype in f[9]:  # integers: 0/1 values, stored by assignment (as _cast
            # does); all zero bytes (the common step): every value 0, stored as False
            if not v.tobytes().translate(None, b"\x00"):
                return none[3], False
            if v.size > QUICK_VALUES:
                return _flag_cast(f, v, lead)
            vals = v.tolist() if v.ndim == 1 else v.reshape(-1).tolist()
            ones = vals.count(1)
            if vals.count(0) + ones == len(vals):  # (the rule's 0/1 check)
                return v, ones > 0
    return _flag_cast(f, v, lead)


def _flag_cast(f: _Field, v: Any, lead: tuple[int, ...]) -> tuple[Any, bool]:
    """:func:`_flag` of a value it does not take as it is: cast (:func:`_cast`)."""
    v = _cast(f, v, lead, None)
    return v, bool(_count_nonzero(v)) if type(v) is _ND else bool(v)
