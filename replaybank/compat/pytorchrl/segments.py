"""Where a recurrent learner's stored rows stop continuing each other, and window draws
that stay inside one run of continuing rows.

pytorchrl's collection workers each export whole sequences (``get_all_buffer_data``) and
a gradient worker appends every export to its storage (``insert_data_slice``). pytorchrl
draws only aligned sequences, each inside one inserted slice, so a sequence never joins
two collectors' trajectories (nor two exports of one collector with rows dropped
between them). The front end draws windows at any start of its lanes, so it needs to
know where the stored rows stop continuing each other: a *segment* is a run of rows
that do continue each other, and a segment *starts* at every inserted slice that does
not begin by re-sending the newest stored rows (the storage decides that and tells
:meth:`Segments.start`).

Rows are named by their sequence number in the core's real lanes (its ``written``
counter): every env's lane receives a slice's rows together, so one number names a row
of every env. A window of ``width`` steps that starts at row ``s`` *crosses* a segment
start ``b`` when ``s < b <= s + width - 1``; windows of other lanes (a HER storage's
hindsight copies) cross nothing. :meth:`Segments.inside` keeps a batch's windows inside
one segment by redrawing those that cross a start, as the core redraws windows that
are too short: the starts then follow the sampler's law conditioned on windows inside
one segment.

Example:
    >>> seg = Segments()
    >>> seg.start(6, oldest=0); seg.start(12, oldest=0)   # slices of rows 0-5, 6-11, 12-17
    >>> seg.crossing(np.array([0, 3, 6, 9, 12]), lanes=1, envs=1, width=4).tolist()
    [False, True, False, True, False]
    >>> seg.usable(oldest=0, newest=18, width=4)   # 3 starts in each of the 3 segments
    9
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from replaybank.batch import SequenceBatch
from replaybank.errors import EmptyBufferError

__all__ = ["MAX_REDRAWS", "Segments"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Rounds of redrawing windows that cross a segment start before a draw gives up (the
#: core's bound for samplers other than the uniform one).
MAX_REDRAWS = 1024


class Segments:
    """The segment starts of one storage's real lanes (sorted sequence numbers: row
    ``b`` does not continue row ``b - 1``), and the window draws that respect them.

    Example:
        >>> seg = Segments()
        >>> seg.start(4, oldest=0)
        >>> seg.lengths(oldest=2, newest=10).tolist(), seg.lengths(oldest=4, newest=10).tolist()
        ([2, 6], [6])
    """

    def __init__(self) -> None:
        self._starts: IntArray = np.zeros(0, dtype=np.int64)

    def clear(self) -> None:
        """Forget every start (the storage dropped its rows)."""
        self._starts = np.zeros(0, dtype=np.int64)

    def start(self, seq: int, oldest: int) -> None:
        """Row ``seq`` does not continue row ``seq - 1``: a segment starts there.

        Args:
            seq: Sequence number of the first row of the slice just written.
            oldest: Sequence number of the oldest row stored (a start at or below it
                separates nothing that is still stored; those are dropped).
        """
        kept = self._starts[self._starts > oldest]
        if seq > oldest:
            kept = np.append(kept, np.int64(seq))  # slices arrive in order: still sorted
        self._starts = kept

    def separate(self, oldest: int, newest: int) -> bool:
        """Whether the stored rows ``[oldest, newest)`` are more than one segment."""
        s = self._starts
        return bool(len(s)) and bool(np.any((s > oldest) & (s < newest)))

    def lengths(self, oldest: int, newest: int) -> IntArray:
        """Rows of each segment among the stored rows ``[oldest, newest)``, oldest first
        ``[segments]``."""
        s = self._starts
        inner = s[(s > oldest) & (s < newest)]
        return np.diff(np.concatenate([[oldest], inner, [newest]])).astype(np.int64)

    def usable(self, oldest: int, newest: int, width: int) -> int:
        """Window starts per real lane whose ``width`` steps lie in rows ``[oldest,
        newest)`` and inside one segment."""
        return int(np.maximum(self.lengths(oldest, newest) - width + 1, 0).sum())

    def crossing(self, keys: IntArray, lanes: int, envs: int, width: int) -> BoolArray:
        """Which windows cross a segment start.

        Args:
            keys: Window starts, the core's item keys ``seq * lanes + lane`` ``[B]``.
            lanes: Lanes of the core buffer.
            envs: Its real lanes (the first ``envs``; the others cross nothing).
            width: Steps per window.

        Returns:
            ``[B]`` bool.
        """
        keys = np.asarray(keys, dtype=np.int64)
        seq, lane = keys // lanes, keys % lanes  # [B]
        after = np.append(self._starts, np.iinfo(np.int64).max)  # [k + 1]
        nxt = after[np.searchsorted(self._starts, seq, side="right")]  # first start > seq
        return np.asarray((lane < envs) & (nxt <= seq + width - 1))

    def inside(self, draw: Callable[[int], SequenceBatch], count: int, lanes: int,
               envs: int, width: int, where: str) -> SequenceBatch:
        """``count`` windows of ``draw`` none of which crosses a segment start: the
        crossing ones are drawn again (at most :data:`MAX_REDRAWS` rounds).

        Args:
            draw: Draws ``n`` windows of ``width`` steps (the core's
                ``sample_sequences`` with the storage's options).
            count: Windows wanted.
            lanes: Lanes of the core buffer.
            envs: Its real lanes.
            width: Steps per window.
            where: The public call, for the error message.

        Returns:
            The batch, rows in draw order with each redrawn window at the place of the
            one it replaces.

        Raises:
            EmptyBufferError: Windows still crossed a segment start after
                :data:`MAX_REDRAWS` rounds (those inside one segment are too rare
                among the sampler's draws).
        """
        batch = draw(count)
        if not len(self._starts):
            return batch
        bad = np.flatnonzero(self.crossing(batch.starts, lanes, envs, width))
        if not len(bad):
            return batch
        data = {k: np.array(v) for k, v in batch.to_dict(nested=False).items()}  # writable
        for _ in range(MAX_REDRAWS):
            more = draw(len(bad))
            for key, value in more.to_dict(nested=False).items():
                data[key][bad] = value
            still = self.crossing(more.starts, lanes, envs, width)
            bad = bad[still]
            if not len(bad):
                return SequenceBatch.own(data)
        raise EmptyBufferError(
            f"{where}: {len(bad)} of {count} windows of {width} steps still joined two "
            f"inserted slices after {MAX_REDRAWS} redraws (a window never joins rows that "
            "do not continue each other: another collector's slice, or rows after a gap "
            "the collector held back); the sampler rarely draws a window inside one "
            "slice: insert longer slices (several sequences of update_every steps per "
            "export), or widen ERE's window (raise cmin or eta)")

