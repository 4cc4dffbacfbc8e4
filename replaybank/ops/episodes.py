"""The episode index: the first and last step of the episode of every live step.

Built from a step table's bookkeeping (:mod:`replaybank.ops.ring`): ``link``
``[T, lanes]`` (``> 0`` where a step's next observation is not the next step's), the
``terminated``/``truncated`` flags, and the lane counters ``written`` and ``counts``.
An episode of a lane ends at a step that is not the lane's newest and has ``link > 0``
(terminated, truncated, or a discontinuity: the next step did not continue from it), or
at the lane's newest step when it is terminated or truncated. Every other step belongs
to the lane's running (unfinished) episode.

:class:`EpisodeIndex` keeps, for every step, ``begin`` (the sequence number of the first
step of its episode, which may have been overwritten since) and ``end`` (the sequence
number of its last step, ``-1`` while the episode runs). :meth:`EpisodeIndex.sync`
brings it up to date with the steps written since the last call, all lanes in one
vectorised pass: each step is indexed once when it arrives, and once more when its
episode ends (its ``end`` filled in), so the cost is amortised O(1) per written step
and nothing is searched at sample time. :meth:`EpisodeIndex.extents` reads a batch.

The index is a pure function of the table: a rebuilt one (after a state load or a
reopen) answers every query exactly as one kept current step by step, because a begin
older than the lane's oldest live step is read as that step (goals come only from the
steps of an episode that survive in the ring).

Example:
    >>> import numpy as np
    >>> T, lanes = 8, 1
    >>> link = np.zeros((T, lanes), np.int32); link[[2, 5], 0] = 1   # an end at 2; newest 5
    >>> term = np.zeros((T, lanes), bool); term[2, 0] = True
    >>> trunc = np.zeros((T, lanes), bool)
    >>> idx = EpisodeIndex(T, lanes)
    >>> idx.sync(link, term, trunc, np.array([6]), np.array([6]), epoch=0)
    >>> b, e = idx.extents(np.arange(6), np.zeros(6, np.int64), np.array([6]), np.array([6]))
    >>> b.tolist(), e.tolist()   # steps 3..5 belong to a running episode
    ([0, 0, 0, 3, 3, 3], [2, 2, 2, -1, -1, -1])
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops.jit import pick_kernel

__all__ = ["EpisodeIndex", "sync_lanes"]

IntArray = npt.NDArray[np.int64]


class EpisodeIndex:
    """``begin`` and ``end`` sequence numbers of every step's episode, ``[T * lanes]``.

    Args:
        T: Rows per lane.
        lanes: Lanes of the table.
        prefer: ``"auto"`` (the numba kernel when numba imports), ``"numba"`` or
            ``"numpy"`` (the vectorised oracle, :func:`sync_lanes`).
    """

    def __init__(self, T: int, lanes: int, prefer: str = "auto") -> None:  # noqa: N803
        self._kernel = _sync_kernel(prefer)
        self.T = int(T)
        self.lanes = int(lanes)
        n = self.T * self.lanes
        #: Per storage slot: first step of its episode (may be older than the oldest live).
        self.begin: IntArray = np.zeros(n, np.int64)
        #: Per storage slot: last step of its episode, -1 while the episode runs.
        self.end: IntArray = np.full(n, -1, np.int64)
        #: Per lane: the first step not yet final in the index (the newest one while its
        #: episode runs: a later write may still turn it into an episode end).
        self.seen: IntArray = np.zeros(self.lanes, np.int64)
        #: Per lane: the first step of its running episode.
        self.open: IntArray = np.zeros(self.lanes, np.int64)
        self.epoch: int | None = None
        self._written: list[int] = []  # ``written`` at the last sync
        self._flags: npt.NDArray[np.bool_] | None = None  # see sync_newest

    def sync(self, link: npt.NDArray[np.int32], terminated: npt.NDArray[Any],
             truncated: npt.NDArray[Any], written: IntArray, counts: IntArray,
             epoch: int) -> None:
        """Index the steps written since the last call (every live step after a change of
        ``epoch``: a clear or a state load changed links without a write).

        Args:
            link: The table's links ``[T, lanes]``.
            terminated, truncated: Its flags ``[T, lanes]``.
            written, counts: Its lane counters ``[lanes]``.
            epoch: Its ``epoch``.
        """
        now = written.tolist()  # a short list compares faster than numpy arrays
        if epoch != self.epoch:
            oldest = written - counts
            self.seen[:] = oldest
            self.open[:] = oldest
            self.epoch = epoch
        elif now == self._written:
            return  # nothing written since
        self._written = now
        self._kernel(link.reshape(-1), terminated.reshape(-1), truncated.reshape(-1),
                       written, counts, self.seen, self.open, self.begin, self.end,
                       self.T, self.lanes)

    def sync_newest(self, link: npt.NDArray[np.int32], done: npt.NDArray[np.bool_],
                    written: IntArray, counts: IntArray, epoch: int) -> None:
        """:meth:`sync` for a table whose flags are not in host memory (device storage).

        The index reads a step's done flag only while the step is its lane's newest (an
        older step's end is in ``link``), so the done flags of the newest steps, kept on
        the host as they were written (:class:`~replaybank.storage.newest_steps.NewestSteps`),
        are all it needs: no device data is read.

        Args:
            link: The table's links ``[T, lanes]`` (host).
            done: ``terminated | truncated`` of each lane's newest step ``[lanes]``.
            written, counts: Its lane counters ``[lanes]``.
            epoch: Its ``epoch``.
        """
        if epoch == self.epoch and written.tolist() == self._written:
            return  # nothing written since
        flags = self._flags
        if flags is None:
            flags = self._flags = np.zeros(self.T * self.lanes, dtype=bool)
        live = np.flatnonzero(counts > 0)
        flags[(written[live] - 1) % self.T * self.lanes + live] = done[live]
        self.sync(link, flags, flags, written, counts, epoch)

    def extents(self, slots: IntArray, lane: IntArray, written: IntArray,
                counts: IntArray, unfinished: bool = False) -> tuple[IntArray, IntArray]:
        """First and last live step of the episodes of the steps at ``slots`` ``[B]``.

        Args:
            slots: Storage slots ``[B]`` of live steps (:meth:`sync` first).
            lane: Their lanes ``[B]``.
            written, counts: The lane counters ``[lanes]``.
            unfinished: Give a running episode its steps so far (it ends at the lane's
                newest step) instead of ``-1``.

        Returns:
            ``(begin, end)`` sequence numbers ``[B]``: ``begin`` is at least the lane's
            oldest live step; ``end`` is ``-1`` for a running episode unless
            ``unfinished``.
        """
        begin = np.maximum(self.begin[slots], (written - counts)[lane])
        end = self.end[slots]
        if unfinished:
            end = np.where(end < 0, written[lane] - 1, end)
        return begin, end

    def nbytes(self) -> int:
        """Bytes held by the index."""
        flags = 0 if self._flags is None else self._flags.nbytes
        return int(self.begin.nbytes + self.end.nbytes + flags)


def sync_lanes(link: npt.NDArray[np.int32], terminated: npt.NDArray[Any],
               truncated: npt.NDArray[Any], written: IntArray, counts: IntArray,
               seen: IntArray, open_: IntArray, begin_of: IntArray, end_of: IntArray,
               T: int, lanes: int) -> None:  # noqa: N803
    """Index the steps ``[max(seen, oldest), written)`` of every lane, in place: the numpy
    oracle of :mod:`replaybank.ops.episodes_numba` (all lanes in one vectorised pass).

    Args:
        link, terminated, truncated: The table's flat links and flags ``[T * lanes]``.
        written, counts: Lane counters ``[lanes]``.
        seen, open_: Per lane, the first step not final yet and the first step of the
            running episode (updated).
        begin_of, end_of: The index per slot ``[T * lanes]`` (updated).
        T: Rows per lane.
        lanes: Lanes.
    """
    oldest = written - counts
    first = np.maximum(seen, oldest)  # first step of each lane to index
    n = written - first
    total = int(n.sum())
    if total == 0:
        return
    lane = np.repeat(np.arange(lanes, dtype=np.int64), n)
    seg = np.cumsum(n) - n  # position of each lane's first new step
    pos = np.arange(total, dtype=np.int64)
    seq = first[lane] + (pos - seg[lane])
    slot = seq % T * lanes + lane
    newest = seq == written[lane] - 1
    is_end = np.where(newest,
                      (terminated[slot] != 0) | (truncated[slot] != 0),
                      link[slot] > 0)
    # begin: one past the latest end before the step in its lane, else the lane's open
    last_end = np.maximum.accumulate(np.where(is_end, pos, -1))
    prev = np.empty(total, np.int64)
    prev[0] = -1
    prev[1:] = last_end[:-1]
    in_lane = prev >= seg[lane]
    begin = np.where(in_lane, seq[np.maximum(prev, 0)] + 1, open_[lane])
    # end: the first end at or after the step in its lane, else -1 (still running)
    seg_end = seg + n
    next_end = np.minimum.accumulate(np.where(is_end, pos, total)[::-1])[::-1]
    end = np.where(next_end < seg_end[lane], seq[np.minimum(next_end, total - 1)], -1)
    begin_of[slot] = begin
    end_of[slot] = end
    # steps indexed earlier whose running episode ends now: fill in their end
    has = n > 0
    first_end = np.full(lanes, total, np.int64)
    first_end[has] = next_end[seg[has]]
    ends_now = has & (first_end < seg_end)
    fill_from = np.maximum(open_, oldest)
    m = np.where(ends_now, np.maximum(first - fill_from, 0), 0)
    if m.any():
        fl = np.repeat(np.arange(lanes, dtype=np.int64), m)
        off = np.arange(int(m.sum()), dtype=np.int64) - np.repeat(np.cumsum(m) - m, m)
        fseq = fill_from[fl] + off
        end_of[fseq % T * lanes + fl] = seq[first_end[fl]]
    # each lane's running episode now starts after its last end
    closed = has & (last_end[np.maximum(seg_end - 1, 0)] >= seg)
    open_[closed] = seq[last_end[seg_end[closed] - 1]] + 1
    # the newest step stays open to re-indexing while its episode runs
    newest_end = np.zeros(lanes, bool)
    newest_end[has] = is_end[seg_end[has] - 1]
    seen[has] = np.where(newest_end[has], written[has], written[has] - 1)


@cache
def _sync_kernel(prefer: str) -> Any:
    """:func:`sync_lanes`, compiled when numba imports and ``prefer`` allows (loaded once)."""
    return pick_kernel(prefer, "replaybank.ops.episodes_numba", "sync_lanes", sync_lanes,
                       "EpisodeIndex")[0]
