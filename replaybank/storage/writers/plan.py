"""The write plan: where ``n`` steps of ``m`` lanes go, decided from the lane counters alone.

This is the one contract of every write. Two appliers carry it out in the same four steps:
:mod:`~replaybank.storage.writers.reference` in Python, and ``apply_plan`` in
``replaybank/_lane.c``, whose planner ``plan_write`` is this function's C twin
(``tests/test_compiled_plan.py`` compares their decisions; ``tests/test_fastpath.py`` the
tables they leave):

1. **evict**: the live old steps whose rows the write overwrites leave the ring *first*:
   a durable table's ``start`` advances to ``start_written - kept_old`` (the truth of a
   reopened table, ``counts = written - start``, so it is consistent at every instant;
   files written before ``start`` existed drop ``counts`` to :attr:`WritePlan.kept_old`
   instead), then their kept-aside slots are freed;
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
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

__all__ = ["WritePlan", "plan_write"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class WritePlan:
    """Where one write goes (see the module docs for the four steps).

    When the written lanes are in step (the same ``written`` and ``counts``, as vector
    envs keep them), :func:`plan_write` decides with Python ints: the plan then carries
    those two counters (:attr:`lane_counters`) and computes its arrays (``rows``,
    ``evicted``, ``kept_old``, ...) on first read, with the same formulas as for lanes out
    of step. A writer that needs only the ints (:attr:`counter_values`, :attr:`evicts`,
    :attr:`continues`, a slice :attr:`index`) builds no array.

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
        lane_counters: ``(written, counts)`` of every written lane as Python ints when
            they are in step (and ``m > 0``), else None.
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
    lane_counters: tuple[int, int] | None = None

    if not TYPE_CHECKING:  # (hidden from type checkers: every other name stays an error)
        def __getattr__(self, name: str) -> Any:
            """An array field of a plan of lanes in step, computed on its first read."""
            d = self.__dict__
            counters = d.get("lane_counters")
            if name not in _LAZY or counters is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute "
                                     f"{name!r}")
            m = len(d["lane_ids"])
            s0 = np.full(m, counters[0], dtype=np.int64)
            c0 = np.full(m, counters[1], dtype=np.int64)
            d.update(_arrays(d["T"], d["n"], d["lane_ids"], d["all_lanes"], True, s0, c0))
            return d[name]

    @property
    def kept(self) -> int:
        """Steps kept per lane, ``nk = n - skip``."""
        return self.n - self.skip

    @property
    def lanes_index(self) -> Any:
        """The written lanes as an index of the counters (a slice when all lanes)."""
        return slice(None) if self.all_lanes else self.lane_ids

    @property
    def evicts(self) -> bool:
        """Some written row holds a live old step (``evicted`` is not None)."""
        if self.lane_counters is None:
            return self.evicted is not None
        c = self.lane_counters[1]
        return c > 0 and c + self.n > self.T

    @property
    def continues(self) -> bool:
        """Some lane's previous newest step survives the write (``prev_pos`` is not empty)."""
        if self.lane_counters is None:
            return len(self.prev_pos) > 0
        c = self.lane_counters[1]  # its row is not overwritten: fewer than T new steps
        return c > 0 and self.n < self.T

    @property
    def counter_values(self) -> tuple[Any, Any, Any, Any]:
        """What the write stores into the lanes' counters: ``(start, kept_old, new_written,
        new_counts)``, with ``start = start_written - kept_old`` (the sequence number of
        the oldest live step after the eviction); Python ints (one for every lane) when
        :attr:`lane_counters` is set, else ``[m]`` arrays."""
        if self.lane_counters is None:
            return (self.start_written - self.kept_old, self.kept_old, self.new_written,
                    self.new_counts)
        w, c = self.lane_counters
        kept = max(c - max(0, c + self.n - self.T), 0)
        return w - kept, kept, w + self.n, min(c + self.n, self.T)

    def keys(self) -> IntArray:
        """Item keys of the written steps, ``[n, m]``."""
        if self.lane_counters is not None:  # in step: sequence numbers written + i
            w, L, n = self.lane_counters[0], self.L, self.n  # noqa: N806
            if self.all_lanes:  # every lane in order: consecutive keys
                return np.arange(w * L, (w + n) * L, dtype=np.int64).reshape(n, L)
            seq = w + np.arange(n)  # [n]
            return np.add((seq * L)[:, None], self.lane_ids[None, :], dtype=np.int64)
        seq = self.start_written[None, :] + np.arange(self.n)[:, None]  # [n, m]
        return seq * self.L + self.lane_ids[None, :]


#: The fields a plan of lanes in step computes on first read.
_LAZY = frozenset({"start_written", "rows", "index", "evicted", "kept_old", "new_counts",
                   "new_written", "prev_pos", "prev_rows"})


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
    all_lanes = m == lanes and (lanes == 1 or lane_ids.tolist() == list(range(lanes)))
    skip = max(0, n - T)
    if m:  # lanes in step: decided with Python ints, the arrays wait until read
        w = (written if all_lanes else written[lane_ids]).tolist()
        c = (counts if all_lanes else counts[lane_ids]).tolist()
        w0, c0 = w[0], c[0]
        if m == 1 or (w.count(w0) == m and c.count(c0) == m):
            plan = object.__new__(WritePlan)
            plan.__dict__.update(T=T, L=lanes, n=n, lane_ids=lane_ids, all_lanes=all_lanes,
                                 in_step=True, skip=skip, lane_counters=(int(w0), int(c0)))
            start = (w0 + skip) % T
            if all_lanes and start + n - skip <= T:  # the index is a slice: no array
                plan.__dict__["index"] = slice(start, start + n - skip)
            return plan
    s0 = written.copy() if all_lanes else written[lane_ids]  # [m]
    c0 = counts.copy() if all_lanes else counts[lane_ids]  # [m]
    s0 = s0.astype(np.int64, copy=False)
    c0 = c0.astype(np.int64, copy=False)
    in_step = m <= 1 or bool(np.all(s0 == s0[0]) and np.all(c0 == c0[0]))
    return WritePlan(T=T, L=lanes, n=n, lane_ids=lane_ids, all_lanes=all_lanes,
                     in_step=in_step, skip=skip,
                     **_arrays(T, n, lane_ids, all_lanes, in_step, s0, c0))


def _arrays(T: int, n: int, lane_ids: IntArray, all_lanes: bool, in_step: bool,  # noqa: N803
            s0: IntArray, c0: IntArray) -> dict[str, Any]:
    """The array fields of a plan from the written lanes' ``written`` (``s0``) and
    ``counts`` (``c0``), ``[m]`` each."""
    m = len(lane_ids)
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
    return {"start_written": s0, "rows": rows, "index": index, "evicted": evicted,
            "kept_old": kept_old, "new_counts": new_counts, "new_written": s0 + n,
            "prev_pos": prev_pos, "prev_rows": prev_rows}
