"""numba twin of :func:`replaybank.ops.episodes.sync_lanes` (its oracle; same results).

A loop over the new steps of each lane: O(steps written since the last sync), plus the
steps of each episode that ends (their ``end`` filled in once). Importing this module
raises ImportError when numba is missing; :class:`~replaybank.ops.episodes.EpisodeIndex`
then uses the numpy function.

Example:
    >>> import numpy as np
    >>> link = np.array([0, 1, 1], np.int32); flags = np.zeros(3, bool)
    >>> seen, open_ = np.zeros(1, np.int64), np.zeros(1, np.int64)
    >>> begin, end = np.zeros(3, np.int64), np.full(3, -1, np.int64)
    >>> sync_lanes(link, flags, flags, np.array([3]), np.array([3]), seen, open_, begin,
    ...            end, 3, 1)
    >>> end.tolist(), begin.tolist(), seen.tolist()   # an end at step 1; step 2 running
    ([1, 1, -1], [0, 0, 2], [2])
"""

from __future__ import annotations

from typing import Any

import numba

__all__ = ["sync_lanes"]


@numba.njit(cache=True, nogil=True)
def _sync(link, terminated, truncated, written, counts, seen, open_, begin_of, end_of,  # type: ignore[no-untyped-def]
          T, lanes):  # noqa: N803  # pragma: no cover - compiled
    for lane in range(lanes):
        w = written[lane]
        oldest = w - counts[lane]
        first = max(seen[lane], oldest)
        if first >= w:
            continue
        last_is_end = False
        for s in range(first, w):
            slot = s % T * lanes + lane
            if s == w - 1:
                last_is_end = terminated[slot] != 0 or truncated[slot] != 0
                is_end = last_is_end
            else:
                is_end = link[slot] > 0
            begin_of[slot] = open_[lane]
            end_of[slot] = -1
            if is_end:
                for x in range(max(open_[lane], oldest), s + 1):
                    end_of[x % T * lanes + lane] = s
                open_[lane] = s + 1
        seen[lane] = w if last_is_end else w - 1


#: :func:`replaybank.ops.episodes.sync_lanes`, compiled.
sync_lanes: Any = _sync
