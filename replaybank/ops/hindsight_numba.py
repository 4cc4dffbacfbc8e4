"""numba twin of :func:`replaybank.ops.hindsight.goal_sources` (its oracle; same results).

Importing this module raises ImportError when numba is missing;
:func:`replaybank.ops.hindsight.goal_kernel` then uses the numpy function.

Example:
    >>> import numpy as np
    >>> T = 8
    >>> end = np.full(T, 5, np.int64); begin = np.zeros(T, np.int64)
    >>> link = np.zeros(T, np.int32); link[5] = 1
    >>> rows, nxt, side = goal_sources(np.array([1, 2]), np.array([0.1, 0.9, 0.5, 0.0]),
    ...                                0.8, end, begin, np.array([6]), np.array([6]),
    ...                                link, T, 1, 1, False)
    >>> rows.tolist(), nxt.tolist(), side.tolist()
    ([0], [6], [0])
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

__all__ = ["goal_sources"]


@numba.njit(cache=True, nogil=True)
def _sources(keys, u, p, end_of, begin_of, written, counts, link, T, lanes,  # type: ignore[no-untyped-def]  # noqa: N803
             strategy, unfinished):  # pragma: no cover - compiled
    b = keys.shape[0]
    rows = np.empty(b, np.int64)
    nxt = np.empty(b, np.int64)
    side = np.empty(b, np.int64)
    total = 0
    for lane in range(lanes):
        total += counts[lane]
    n_slots = T * lanes
    s = 0
    for i in range(b):
        if not u[i] < p:
            continue
        key = keys[i]
        seq = key // lanes
        lane = key % lanes
        slot = seq % T * lanes + lane
        end = end_of[slot]
        if end < 0:
            if not unfinished:
                continue
            end = written[lane] - 1
        off = u[b + i]
        if strategy == 3:
            n = np.int64(off * total)
            g = 0
            while n >= counts[g]:
                n -= counts[g]
                g += 1
            lane = g
            j = written[g] - counts[g] + n
        elif strategy == 1:
            j = end
        else:
            lo = seq if strategy == 0 else max(begin_of[slot], written[lane] - counts[lane])
            j = lo + np.int64(off * (end - lo + 1))
        gslot = j % T * lanes + lane
        rows[s] = i
        nxt[s] = (gslot + lanes) % n_slots
        # inside an episode only its last step keeps its next observation aside
        side[s] = np.int64(link[gslot]) - 1 if strategy == 3 or j == end else -1
        s += 1
    return rows[:s], nxt[:s], side[:s]


#: :func:`replaybank.ops.hindsight.goal_sources`, compiled.
goal_sources: Any = _sources
