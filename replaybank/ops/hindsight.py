"""Where hindsight goals come from: which rows of a batch get a new goal, and the step
whose next achieved goal each one takes (see :mod:`replaybank.views.hindsight`).

:func:`goal_sources` is the numpy oracle; :mod:`replaybank.ops.hindsight_numba` holds its
compiled twin (same arguments, same results), chosen by :func:`goal_kernel`.

Uniform draws come in one array ``u`` ``[2B]`` from the buffer's generator: ``u[i] < p``
relabels row ``i``, and ``u[B + i]`` picks its goal step, so both kernels consume the
same numbers whatever rows end up relabelled.

Strategies (codes in :data:`STRATEGY_CODES`), for a row at step ``t`` of an episode whose
surviving steps are ``b..e`` in its lane: ``future`` ``j = t + floor(u (e - t + 1))``,
``final`` ``j = e``, ``episode`` ``j = b + floor(u (e - b + 1))``, ``random`` the
``floor(u N)``-th of the ``N`` live steps (lanes in order, oldest first).

Example:
    >>> import numpy as np
    >>> T, lanes = 8, 1
    >>> end = np.full(T, 5, np.int64); begin = np.zeros(T, np.int64)
    >>> link = np.zeros(T, np.int32); link[5] = 1       # episode 0..5 ended at step 5
    >>> u = np.array([0.1, 0.9, 0.5, 0.0])              # coins for 2 rows, then offsets
    >>> rows, nxt, side = goal_sources(np.array([1, 2]), u, 0.8, end, begin,
    ...                                np.array([6]), np.array([6]), link, T, lanes, 1, False)
    >>> rows.tolist(), nxt.tolist(), side.tolist()      # "final": step 5, kept aside
    ([0], [6], [0])
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops.jit import pick_kernel

__all__ = ["STRATEGY_CODES", "goal_kernel", "goal_sources"]

IntArray = npt.NDArray[np.int64]
STRATEGY_CODES = {"future": 0, "final": 1, "episode": 2, "random": 3}


def goal_sources(keys: IntArray, u: npt.NDArray[np.float64], p: float, end_of: IntArray,
                 begin_of: IntArray, written: IntArray, counts: IntArray,
                 link: npt.NDArray[np.int32], T: int, lanes: int,  # noqa: N803
                 strategy: int, unfinished: bool) -> tuple[IntArray, IntArray, IntArray]:
    """The relabelled rows of a batch and where their goals are.

    Args:
        keys: Item keys ``[B]`` of live steps.
        u: Uniform draws in ``[0, 1)`` ``[2B]`` (see the module docstring).
        p: Relabel probability ``k / (k + 1)``.
        end_of, begin_of: The episode index per storage slot ``[T * lanes]``
            (:class:`~replaybank.ops.episodes.EpisodeIndex`).
        written, counts: Lane counters ``[lanes]``.
        link: Flat links ``[T * lanes]``.
        T: Rows per lane.
        lanes: Lanes.
        strategy: A code of :data:`STRATEGY_CODES`.
        unfinished: Relabel rows of running episodes (they end at the lane's newest step).

    Returns:
        ``(rows [S], next_slots [S], side [S])``: the relabelled rows in batch order; the
        slot of the step after each goal step (its next observation, unless kept aside);
        the side slot of the goal step's next observation, or -1.
    """
    b = len(keys)
    rows = (u[:b] < p).nonzero()[0]
    picked = keys[rows]
    seq, lane = picked // lanes, picked % lanes
    slots = seq % T * lanes + lane
    end = end_of[slots]
    if unfinished:
        end = np.where(end < 0, written[lane] - 1, end)
    ok = end >= 0  # rows of running episodes keep their goal
    if not ok.all():
        rows, seq, lane, slots, end = rows[ok], seq[ok], lane[ok], slots[ok], end[ok]
    off = u[b + rows]
    if strategy == 3:  # random: any live step of any lane
        total = int(counts.sum())
        n = (off * total).astype(np.int64)
        cum = np.cumsum(counts)
        lane = np.searchsorted(cum, n, side="right").astype(np.int64)
        j = written[lane] - counts[lane] + (n - (cum[lane] - counts[lane]))
    elif strategy == 1:
        j = end
    else:
        lo = seq if strategy == 0 else np.maximum(begin_of[slots], (written - counts)[lane])
        j = lo + (off * (end - lo + 1)).astype(np.int64)  # u < 1: j <= end
    gslot = j % T * lanes + lane
    if strategy == 3:
        side = link[gslot].astype(np.int64) - 1
    else:  # inside an episode only its last step keeps its next observation aside
        side = np.full(len(j), -1, np.int64)
        last = (j == end).nonzero()[0]
        side[last] = link[gslot[last]].astype(np.int64) - 1
    return rows, (gslot + lanes) % (T * lanes), side


@cache
def goal_kernel() -> Any:
    """:func:`goal_sources`, compiled when numba imports (loaded once)."""
    return pick_kernel("auto", "replaybank.ops.hindsight_numba", "goal_sources",
                       goal_sources, "goal_kernel")[0]
