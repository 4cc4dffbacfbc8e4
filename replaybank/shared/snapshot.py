"""A reader's window over lanes that other processes write: the pure arithmetic.

See :mod:`replaybank.shared.lanes` for why the window is what it is. Per lane,
from the counters as read (``written`` first, then ``start``) and whether the newest step
is still pending, the window is ``[lo, hi)`` with

* ``hi = written - pending`` (``pending``: the newest step waits for its next observation:
  linked aside and its episode not ended),
* ``lo = min(max(start, written - T + guard), max(hi, 0))``.

:func:`advance` moves a window to the new counters and returns the storage slots
(``row * lanes + lane``) of the steps that left it (below the new ``lo``) and of those that
entered it (above the old ``hi``), lane by lane, oldest first. The numba twin
(:mod:`replaybank.shared.snapshot_numba`) gives the same results.

Example:
    >>> import numpy as np
    >>> link = np.zeros((8, 1), np.int32); flags = np.zeros((8, 1), bool)
    >>> lo, hi = np.zeros(1, np.int64), np.zeros(1, np.int64)
    >>> left, new = advance(np.array([3]), np.array([0]), link, flags, flags, 8, 2, lo, hi)
    >>> left.tolist(), new.tolist(), lo.tolist(), hi.tolist()
    ([], [0, 1, 2], [0], [3])
    >>> link[4, 0] = 1  # step 12 (row 4) is pending: linked aside, episode running
    >>> left, new = advance(np.array([13]), np.array([5]), link, flags, flags, 8, 2, lo, hi)
    >>> left.tolist(), new.tolist(), lo.tolist(), hi.tolist()  # [max(5, 13-8+2), 12)
    ([0, 1, 2], [7, 0, 1, 2, 3], [7], [12])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["advance", "range_slots"]

IntArray = npt.NDArray[np.int64]
_NONE = np.zeros(0, np.int64)


def range_slots(begin: IntArray, end: IntArray, T: int, lanes: int) -> IntArray:  # noqa: N803
    """Storage slots of the steps ``[begin[l], end[l])`` of every lane ``l``, lane by lane,
    oldest first (nothing where ``end <= begin``).

    Example:
        >>> range_slots(np.array([0, 5]), np.array([2, 7]), T=4, lanes=2).tolist()
        [0, 2, 3, 5]
    """
    n = np.maximum(end - begin, 0)  # [lanes]
    total = int(n.sum())
    if total == 0:
        return _NONE
    lane = np.repeat(np.arange(lanes), n)  # [total]
    first = np.cumsum(n) - n  # where each lane's range starts in the output
    seq = np.arange(total) - np.repeat(first - begin, n)  # [total] sequence numbers
    out: IntArray = seq % T * lanes + lane
    return out


def advance(written: IntArray, start: IntArray, link: npt.NDArray[np.int32],
            terminated: npt.NDArray[Any], truncated: npt.NDArray[Any], T: int,  # noqa: N803
            guard: int, lo: IntArray, hi: IntArray) -> tuple[IntArray, IntArray]:
    """Move the window ``[lo, hi)`` (updated in place) to the counters read.

    Args:
        written: Each lane's ``written`` as read (first), ``[lanes]``.
        start: Each lane's ``start`` as read (after ``written``), ``[lanes]``.
        link: Next-observation links ``[T, lanes]`` (``k > 0``: kept aside).
        terminated: Done flags ``[T, lanes]``.
        truncated: Done flags ``[T, lanes]``.
        T: Rows per lane.
        guard: Steps left out at the old end of a full lane.
        lo: The window's low ends ``[lanes]`` (in: the last window; out: the new one).
        hi: The window's high ends ``[lanes]``.

    Returns:
        ``(left, new)``: slots of the steps that left the window and that entered it.
    """
    lanes = len(written)
    cols = np.arange(lanes)
    rows = (written - 1) % T
    pending = (written > 0) & (link[rows, cols] > 0) \
        & ~(terminated[rows, cols].astype(bool) | truncated[rows, cols].astype(bool))
    new_hi = written - pending
    new_lo = np.minimum(np.maximum(start, written - T + guard), np.maximum(new_hi, 0))
    left = range_slots(lo, np.minimum(new_lo, hi), T, lanes)
    new = range_slots(np.maximum(hi, new_lo), new_hi, T, lanes)
    lo[:] = new_lo
    hi[:] = new_hi
    return left, new
