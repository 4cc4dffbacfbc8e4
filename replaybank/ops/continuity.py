"""Continuity tests for the step table: does a step's next obs equal the next step's obs?

Pure functions over numpy arrays, compared bitwise (NaN-safe; ``-0.0 != 0.0``), because
"the caller's next add continues from this next_obs" must be decided exactly.

Example:
    >>> import numpy as np
    >>> obs = np.arange(4, dtype=np.float32).reshape(4, 1, 1)      # [n, lanes, 1]
    >>> nxt = obs + 1
    >>> nxt[1] = 9.0                                                # out of order at step 1
    >>> done = np.zeros((4, 1), bool)
    >>> chunk_breaks(["obs"], {"obs": obs}, {"obs": nxt}, done)[:, 0].tolist()
    [False, True, False, True]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["bitwise_equal_rows", "chunk_breaks", "same_bytes"]

BoolArray = npt.NDArray[np.bool_]


def bitwise_equal_rows(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> BoolArray:
    """Row-wise bitwise equality of two numpy arrays ``[n, ...]`` (NaN-safe, -0.0 != 0.0).

    Example:
        >>> bitwise_equal_rows(np.array([[np.nan], [1.0]]), np.array([[np.nan], [2.0]])).tolist()
        [True, False]
    """
    n = a.shape[0]
    if n == 0:
        return np.zeros(0, dtype=bool)
    a2 = np.ascontiguousarray(a).reshape(n, -1)
    b2 = np.ascontiguousarray(b).reshape(n, -1)
    if a2.dtype != b2.dtype:
        return np.zeros(n, dtype=bool)
    size = a2.dtype.itemsize
    word = np.dtype(f"u{size}") if size in (1, 2, 4, 8) else np.dtype(np.uint8)
    av, bv = a2.view(word), b2.view(word)
    return np.asarray((av == bv).all(axis=1))


def same_bytes(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> bool:
    """Bitwise equality of two arrays of the same dtype and shape.

    Example:
        >>> same_bytes(np.array([np.nan]), np.array([np.nan]))
        True
    """
    return a.tobytes() == b.tobytes()  # one copy + memcmp: faster than numpy's ==/all


def chunk_breaks(obs_fields: Sequence[str], values: Mapping[str, Any],
                  next_obs: Mapping[str, Any], done: BoolArray) -> BoolArray | None:
    """Which steps of a chunk ``[n, m]`` keep their next obs aside (None: only the last).

    Args:
        obs_fields: Names of the observation fields.
        values: Stored fields ``[n, m, *shape]`` (the obs fields are read).
        next_obs: Next observations ``[n, m, *shape]``.
        done: ``terminated | truncated``, ``[n, m]``.

    Returns:
        ``[n, m]`` bool (True: the next obs must be kept aside; the last row always is),
        or None when only the last row is.

    A step continues into the next one unless it is done or its next obs differs
    bitwise from the next step's obs. Runs between done steps are compared as whole
    byte blocks first (one memcmp each); only a block that differs is compared row by row.
    """
    n = done.shape[0]
    head = done[:-1, 0] if done.shape[1] == 1 else done[:-1].any(axis=1)
    ends = head.nonzero()[0]  # rows where some lane's episode ended
    need: BoolArray | None = None
    if len(ends) > 16:  # many episode ends: compare every row
        cont = ~done[:-1]
        for nm in obs_fields:
            k = cont.size
            cont &= bitwise_equal_rows(next_obs[nm][:-1].reshape(k, -1),
                                       values[nm][1:].reshape(k, -1)).reshape(cont.shape)
        need = np.ones(done.shape, dtype=bool)
        need[:-1] = ~cont
        return need
    m = done.shape[1]
    lo = 0
    for hi in [*ends.tolist(), n - 1]:
        # rows [lo, hi): no lane is done there; each step continues unless its next obs
        # differs. Row hi (when < n - 1) has a done lane: compare its other lanes alone.
        for nm in obs_fields:
            if hi > lo:
                a, b = next_obs[nm][lo:hi], values[nm][lo + 1:hi + 1]
                if not same_bytes(a, b):
                    if need is None:
                        need = np.zeros(done.shape, dtype=bool)
                    k = hi - lo
                    need[lo:hi] |= ~bitwise_equal_rows(a.reshape(k * m, -1),
                                                       b.reshape(k * m, -1)).reshape(k, m)
            if hi < n - 1 and m > 1:
                if need is None:
                    need = np.zeros(done.shape, dtype=bool)
                need[hi] |= ~bitwise_equal_rows(next_obs[nm][hi], values[nm][hi + 1])
        lo = hi + 1
    if len(ends) or need is not None:
        if need is None:
            need = np.zeros(done.shape, dtype=bool)
        need[:-1] |= done[:-1]
        need[-1] = True
    return need
