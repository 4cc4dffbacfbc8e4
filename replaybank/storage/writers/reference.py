"""The reference writer of the step table: a :class:`~replaybank.storage.writers.plan.WritePlan`
applied step by step. Every other writer leaves the table exactly as this one does.

:func:`write` plans a write of ``n`` steps to any set of lanes (in step or not) with
:func:`~replaybank.storage.writers.plan.plan_write` and :func:`apply` carries it out in the
plan's four steps: evict (``counts`` first, then the evicted steps' side slots), check
whether each lane's previous newest step continues into the first new observation, link
the steps inside the chunk (a side slot where an episode ends or the data jumps, and for
each lane's newest step), then write data and links, relink the previous newest steps and
advance the counters. The lean one-lane writer
(:class:`~replaybank.storage.writers.lean.LaneWriter`) and the compiled writer
(``replaybank/_lane.c``) take the same decisions in the same order, so the side slots are
taken and freed in the same order too (``tests/test_fastpath.py`` compares whole tables).

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

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops.continuity import bitwise_equal_rows, chunk_breaks
from replaybank.storage.table import StepTable
from replaybank.storage.writers import killpoint
from replaybank.storage.writers.plan import WritePlan, plan_write

__all__ = ["apply", "write"]

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
    lane_ids = np.asarray(lane_ids, dtype=np.int64)
    n = int(next(iter(values.values())).shape[0])
    if done is None:
        done = np.asarray(values["terminated"], dtype=bool) | \
            np.asarray(values["truncated"], dtype=bool)
    plan = plan_write(table.T, table.lanes, lane_ids, table.written, table.counts, n)
    if table.durable and plan.evicted is not None and n > table.chunk:
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
    nk, m, skip = plan.kept, len(plan.lane_ids), plan.skip
    if skip:  # steps this same write overwrites again are dropped
        values = {k: v[skip:] for k, v in values.items()}
        next_obs = {k: v[skip:] for k, v in next_obs.items()}
    done_k = done[skip:] if skip else done
    lanes = plan.lanes_index
    # durable tables: a kill test hook before each store to the files (off: KILL_AT == 0)
    point = killpoint.store_point if killpoint.KILL_AT and table.durable else None

    # 1. evict: leaving steps drop out of the window first (durable: start advances, the
    #    truth after a kill), then out of counts, then their side slots are freed
    if plan.evicted is not None:
        if table.start is not None:
            if point:
                point()
            table.start[lanes] = plan.start_written - plan.kept_old
        if point:
            point()
        table.counts[lanes] = plan.kept_old
        old = link[plan.index].reshape(nk, m)  # [nk, m] links of the rows overwritten
        gone = old[plan.evicted & (old > 0)]
        if len(gone):
            side.release(gone)

    # 2. continuity of each lane's previous newest step with the first new obs
    relink: tuple[IntArray, IntArray, npt.NDArray[Any]] | None = None
    if len(plan.prev_pos):
        pos, prow = plan.prev_pos, plan.prev_rows
        plane = plan.lane_ids[pos]
        plink = link[prow, plane]  # [p]
        pend = plink > 0
        if not pend.all():
            pos, prow, plane, plink = pos[pend], prow[pend], plane[pend], plink[pend]
        if len(pos) and table.tail is not None:  # device storage: the host copy of the tail
            same = ~table.tail.done[plane]
            for name in table.obs_fields:
                same &= bitwise_equal_rows(table.tail.next_obs[name][plane],
                                           values[name][0, pos])
        elif len(pos):
            same = ~(np.asarray(be.to_numpy(be.gather(table.arrays["terminated"],
                                                      (prow, plane))), dtype=bool)
                     | np.asarray(be.to_numpy(be.gather(table.arrays["truncated"],
                                                        (prow, plane))), dtype=bool))
            for name in table.obs_fields:
                kept = be.to_numpy(be.gather(side.arrays[name], plink - 1))
                same &= bitwise_equal_rows(kept, values[name][0, pos])
        if len(pos):
            relink = (prow[same], plane[same], plink[same])  # applied after the data

    # 3. links inside the chunk: a side slot where the data does not continue, and for
    #    each lane's newest step
    need = chunk_breaks(table.obs_fields, values, next_obs, done_k) if nk > 1 else None
    links = np.zeros((nk, m), dtype=np.int32)
    if need is None:  # only the newest step of each lane is kept aside
        slots = side.alloc(m)
        links[-1] = slots + 1
        for name in table.obs_fields:
            if point:
                point()
            be.write(side.arrays[name], slots, next_obs[name][-1])
    else:
        slots = side.alloc(int(np.count_nonzero(need)))
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
    for name, v in values.items():
        if point:
            point()
        be.write(table.arrays[name], plan.index, v)
    if point:
        point()
    link[plan.index] = links
    if point:
        point()
    table.written[lanes] = plan.new_written
    if relink is not None and len(relink[0]):
        if point:
            point()
        link[relink[0], relink[1]] = 0
        side.release(relink[2])
    if point:
        point()
    table.counts[lanes] = plan.new_counts
    if point:
        point()
    table.episodes[lanes] += done.sum(axis=0)
