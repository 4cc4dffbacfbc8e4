"""numba twins of :func:`replaybank.ops.windows.stack_slots`,
:func:`~replaybank.ops.windows.window_extent` and
:func:`~replaybank.ops.windows.window_plan` (the numpy functions are their oracles).

Importing this module raises ImportError when numba is missing;
:func:`replaybank.ops.windows.stack_kernel` then falls back to numpy. Compiled once per
machine (``cache=True``).

Example:
    >>> import numpy as np
    >>> link = np.zeros((4, 1), np.int32); link[3, 0] = 1
    >>> slots, side, ok = stack_slots(link, np.array([4]), np.array([4]), np.array([1, 3]), 2)
    >>> slots.tolist(), side.tolist(), ok.tolist()
    ([[0, 1, 2], [2, 3, 0]], [-1, 0], [True, True])
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

__all__ = ["stack_slots", "window_extent", "window_plan"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@numba.njit(cache=True, nogil=True)
def _stack(link, written, counts, keys, k, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    # out[b] = (k + 1 slots, side slot, ok)
    T, lanes = link.shape  # noqa: N806
    for b in range(keys.shape[0]):
        seq = keys[b] // lanes
        lane = keys[b] % lanes
        lo = written[lane] - counts[lane]
        depth = 0
        good = 1
        for d in range(1, k):
            cand = seq - d
            if cand < lo:
                if cand >= 0:
                    good = 0
                break
            if link[cand % T, lane] != 0:
                break
            depth += 1
        for c in range(k):
            back = k - 1 - c
            if back > depth:
                back = depth
            out[b, c] = ((seq - back) % T) * lanes + lane
        row = seq % T
        out[b, k] = ((row + 1) % T) * lanes + lane
        out[b, k + 1] = link[row, lane] - 1
        out[b, k + 2] = good


def stack_slots(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                keys: IntArray, k: int) -> tuple[IntArray, IntArray, BoolArray]:
    """Same contract as :func:`replaybank.ops.windows.stack_slots`."""
    keys = np.asarray(keys, dtype=np.int64)
    out = np.empty((keys.shape[0], k + 3), dtype=np.int64)
    _stack(link, written, counts, keys, int(k), out)
    return out[:, :k + 1], out[:, k + 1], out[:, k + 2] != 0


@numba.njit(cache=True, nogil=True)
def _extent(link, written, counts, keys, width, cross, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    T, lanes = link.shape  # noqa: N806
    for b in range(keys.shape[0]):
        seq = keys[b] // lanes
        lane = keys[b] % lanes
        hi = written[lane]
        if keys[b] < 0 or seq < hi - counts[lane] or seq >= hi:
            out[b] = 0
            continue
        n = 1
        while n < width and seq + n < hi:
            if not cross and link[(seq + n - 1) % T, lane] != 0:
                break
            n += 1
        out[b] = n


def window_extent(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                  keys: IntArray, width: int, cross: bool) -> IntArray:
    """Same contract as :func:`replaybank.ops.windows.window_extent`."""
    keys = np.asarray(keys, dtype=np.int64)
    out = np.empty(keys.shape[0], dtype=np.int64)
    _extent(link, written, counts, keys, int(width), bool(cross), out)
    return out


@numba.njit(cache=True, nogil=True)
def _plan(link, written, counts, keys, width, slots, lk, ends, first):  # type: ignore[no-untyped-def]  # pragma: no cover
    T, lanes = link.shape  # noqa: N806
    for b in range(keys.shape[0]):
        seq = keys[b] // lanes
        lane = keys[b] % lanes
        newest = written[lane] - 1
        row = seq % T
        for j in range(width + 1):
            slots[b, j] = row * lanes + lane
            if j < width:
                v = link[row, lane]
                lk[b, j] = v
                ends[b, j] = v > 0 and seq + j != newest
            row += 1
            if row == T:
                row = 0
        prev = seq - 1
        if prev < written[lane] - counts[lane]:
            first[b] = True
        else:
            first[b] = link[prev % T, lane] > 0


def window_plan(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                keys: IntArray, width: int) -> tuple[IntArray, npt.NDArray[np.int32],
                                                     BoolArray, BoolArray]:
    """Same contract as :func:`replaybank.ops.windows.window_plan`."""
    keys = np.asarray(keys, dtype=np.int64)
    n = keys.shape[0]
    slots = np.empty((n, width + 1), dtype=np.int64)
    lk = np.empty((n, width), dtype=np.int32)
    ends = np.empty((n, width), dtype=np.bool_)
    first = np.empty(n, dtype=np.bool_)
    _plan(link, written, counts, keys, int(width), slots, lk, ends, first)
    return slots, lk, ends, first
