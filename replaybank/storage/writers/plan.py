"""The write plan: where ``n`` steps of ``m`` lanes go, decided from the lane counters alone.

Every writer of the step table follows the same four steps (see
:mod:`~replaybank.storage.writers.reference`, which applies this plan, and
``replaybank/_lane.c``, whose ``write_steps`` / ``write_each`` take the same decisions in
C and are tested to leave the identical table):

1. **evict**: the live old steps whose rows the write overwrites leave the ring; their
   lanes' ``counts`` drop to :attr:`WritePlan.kept_old` *first* (a durable table is then
   consistent at every instant), then their kept-aside slots are freed;
2. **continue**: each lane whose previous newest step survives (:attr:`WritePlan.prev_rows`)
   may continue into the first new observation: then its kept next observation is freed
   and its link becomes 0 (it is the next step's observation);
3. **link**: inside the chunk a step keeps its next observation aside where its episode
   ended or the data jumps, and the newest step of each lane always does;
4. **commit**: data and links are written, then ``written`` advances to
   :attr:`WritePlan.new_written` (the commit of a durable table), then the previous newest
   steps are relinked, then ``counts`` becomes :attr:`WritePlan.new_counts`.

This module decides everything of step 1 and the rows of steps 2-4 from ``written`` and
``counts``: a pure function of integers, no data read. What depends on the data (whether a
step continues: flags and bitwise equal observations) is decided while applying.

Shapes: ``m`` lanes written, ``n`` steps each, of which the last ``nk = min(n, T)`` are
kept (a write longer than the ring overwrites its own first ``skip`` steps).

Example:
    >>> import numpy as np
    >>> p = plan_write(T=4, lanes=2, lane_ids=np.array([1]), written=np.array([0, 3]),
    ...                counts=np.array([0, 3]), n=2)
    >>> p.rows.tolist(), p.kept_old.tolist(), p.new_counts.tolist()
    ([[3], [0]], [2], [4])
    >>> p.evicted.tolist()  # row 0 of lane 1 held its oldest live step
    [[False], [True]]
    >>> p.keys().tolist(), p.prev_rows.tolist()
    ([[7], [9]], [2])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["WritePlan", "plan_write"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class WritePlan:
    """Where one write goes (see the module docs for the four steps).

    Attributes:
        T: Rows per lane.
        L: Lanes of the table.
        n: Steps per written lane.
        lane_ids: The written lanes ``[m]`` (distinct).
        all_lanes: ``lane_ids`` is every lane in order (the counters are written whole).
        in_step: Every written lane has the same ``written`` and ``counts``.
        start_written: ``written`` of the lanes before the write, ``[m]``.
        skip: Leading steps that this write overwrites itself (``max(0, n - T)``).
        rows: Rows of the kept steps, ``[nk, m]``.
        index: The same rows as an index into ``[T, L, ...]`` arrays: a slice of rows
            (all lanes in step, no wrap), a ``[nk]`` row array (all lanes in step), or a
            ``(rows, lanes)`` pair of ``[nk, m]`` arrays.
        evicted: Rows that held a live old step, ``[nk, m]``, or None when none did.
        kept_old: Live old steps per lane after the eviction, ``[m]``.
        new_counts: ``counts`` after the write, ``[m]``.
        new_written: ``written`` after the write, ``[m]``.
        prev_pos: Positions (in ``lane_ids``) of the lanes whose previous newest step
            survives and may continue into this write, ``[p]``.
        prev_rows: Rows of those previous newest steps, ``[p]``.
    """

    T: int
    L: int
    n: int
    lane_ids: IntArray
    all_lanes: bool
    in_step: bool
    start_written: IntArray
    skip: int
    rows: IntArray
    index: Any
    evicted: BoolArray | None
    kept_old: IntArray
    new_counts: IntArray
    new_written: IntArray
    prev_pos: IntArray
    prev_rows: IntArray

    @property
    def kept(self) -> int:
        """Steps kept per lane, ``nk = n - skip``."""
        return self.n - self.skip

    @property
    def lanes_index(self) -> Any:
        """The written lanes as an index of the counters (a slice when all lanes)."""
        return slice(None) if self.all_lanes else self.lane_ids

    def keys(self) -> IntArray:
        """Item keys of the written steps, ``[n, m]``."""
        seq = self.start_written[None, :] + np.arange(self.n)[:, None]  # [n, m]
        return seq * self.L + self.lane_ids[None, :]


def plan_write(T: int, lanes: int, lane_ids: IntArray, written: IntArray,  # noqa: N803
               counts: IntArray, n: int) -> WritePlan:
    """Plan a write of ``n`` steps to each lane in ``lane_ids``.

    Args:
        T: Rows per lane.
        lanes: Lanes of the table, ``L``.
        lane_ids: Distinct lanes ``[m]``.
        written: ``written`` of every lane of the table, ``[L]``.
        counts: ``counts`` of every lane of the table, ``[L]``.
        n: Steps per lane (``>= 0``).

    Returns:
        The :class:`WritePlan`.
    """
    m = len(lane_ids)
    all_lanes = m == lanes and (lanes == 1 or bool(np.all(lane_ids == np.arange(lanes))))
    s0 = written.copy() if all_lanes else written[lane_ids]  # [m]
    c0 = counts.copy() if all_lanes else counts[lane_ids]  # [m]
    s0 = s0.astype(np.int64, copy=False)
    c0 = c0.astype(np.int64, copy=False)
    in_step = m <= 1 or bool(np.all(s0 == s0[0]) and np.all(c0 == c0[0]))
    skip = max(0, n - T)
    nk = n - skip
    new_counts = np.minimum(c0 + n, T)
    kept_old = np.maximum(c0 - np.maximum(0, c0 + n - T), 0)
    start = int(s0[0] + skip) % T if m else 0
    if in_step and m:
        rows1 = (start + np.arange(nk)) % T  # [nk]
        rows = np.broadcast_to(rows1[:, None], (nk, m))
    else:
        rows = (s0[None, :] + skip + np.arange(nk)[:, None]) % T  # [nk, m]
    index: Any
    if in_step and all_lanes:
        index = slice(start, start + nk) if start + nk <= T else rows1
    else:
        index = (rows, np.broadcast_to(lane_ids[None, :], (nk, m)))
    # rows holding a live old step: within the c0 newest rows before the write
    evicted = None
    if bool(np.any(kept_old < c0)):
        evicted = ((rows - (s0 - c0)[None, :]) % T) < c0[None, :]  # [nk, m]
    # the previous newest step survives the write (and is not overwritten by it)
    prev_pos = np.flatnonzero((c0 > 0) & (kept_old > 0)) if skip == 0 \
        else np.zeros(0, dtype=np.int64)
    prev_rows = (s0[prev_pos] - 1) % T
    return WritePlan(T=T, L=lanes, n=n, lane_ids=lane_ids, all_lanes=all_lanes,
                     in_step=in_step, start_written=s0, skip=skip, rows=rows, index=index,
                     evicted=evicted, kept_old=kept_old, new_counts=new_counts,
                     new_written=s0 + n, prev_pos=prev_pos, prev_rows=prev_rows)
