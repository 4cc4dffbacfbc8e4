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
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops.continuity import bitwise_equal_rows, chunk_breaks
from replaybank.storage.table import StepTable
from replaybank.storage.writers import killpoint
from replaybank.storage.writers.plan import WritePlan, plan_write

__all__ = ["apply", "write"]


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
    #    truth after a kill), then out of counts, then their side slots are freed
    if plan.evicts:
        if table.start is not None:
            if point:
                point()
            table.start[lanes] = start
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
    if not slots:
        return np.zeros(0, dtype=np.int64)
    a, b, k = slots[0], slots[-1], len(slots)
    if host and k == 1:
        return slice(a, a + 1)
    if host and b - a == k - 1 and slots == list(range(a, b + 1)):
        return slice(a, b + 1)
    if host and a - b == k - 1 and slots == list(range(a, b - 1, -1)):
        return slice(a, b - 1 if b else None, -1)
    return np.array(slots, dtype=np.int64)


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
