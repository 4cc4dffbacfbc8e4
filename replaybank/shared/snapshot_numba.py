"""numba twin of :func:`replaybank.shared.snapshot.advance` (its oracle; same results).

One pass over the lanes, then one over the steps that left or entered the window.
Importing this module raises ImportError when numba is missing;
:class:`~replaybank.shared.lanes.LaneSnapshot` then uses the numpy function.

Example:
    >>> import numpy as np
    >>> link = np.zeros((8, 1), np.int32); flags = np.zeros((8, 1), bool)
    >>> lo, hi = np.zeros(1, np.int64), np.zeros(1, np.int64)
    >>> left, new = advance(np.array([3]), np.array([0]), link, flags, flags, 8, 2, lo, hi)
    >>> left.tolist(), new.tolist(), hi.tolist()
    ([], [0, 1, 2], [3])
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

__all__ = ["advance"]


@numba.njit(cache=True, nogil=True)
def _advance(written, start, link, terminated, truncated, T, guard, lo, hi):  # type: ignore[no-untyped-def]  # noqa: N803  # pragma: no cover - compiled
    lanes = written.shape[0]
    new_lo = np.empty(lanes, np.int64)
    new_hi = np.empty(lanes, np.int64)
    n_left = 0
    n_new = 0
    for lane in range(lanes):
        w = written[lane]
        pend = 0
        if w > 0:
            row = (w - 1) % T
            if link[row, lane] > 0 and not (terminated[row, lane] or truncated[row, lane]):
                pend = 1
        h = w - pend
        low = max(start[lane], w - T + guard)
        low = min(low, max(h, 0))
        new_lo[lane] = low
        new_hi[lane] = h
        n_left += max(min(low, hi[lane]) - lo[lane], 0)
        n_new += max(h - max(hi[lane], low), 0)
    left = np.empty(n_left, np.int64)
    new = np.empty(n_new, np.int64)
    i = 0
    j = 0
    for lane in range(lanes):
        for s in range(lo[lane], min(new_lo[lane], hi[lane])):
            left[i] = s % T * lanes + lane
            i += 1
        for s in range(max(hi[lane], new_lo[lane]), new_hi[lane]):
            new[j] = s % T * lanes + lane
            j += 1
        lo[lane] = new_lo[lane]
        hi[lane] = new_hi[lane]
    return left, new


def advance(written: Any, start: Any, link: Any, terminated: Any, truncated: Any, T: int,  # noqa: N803
            guard: int, lo: Any, hi: Any) -> tuple[Any, Any]:
    """See :func:`replaybank.shared.snapshot.advance`."""
    return _advance(written, start, link, terminated, truncated, T, guard, lo, hi)  # type: ignore[no-any-return]
