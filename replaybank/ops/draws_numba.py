"""numba twin of :func:`replaybank.ops.draws.map_raw` (its oracle; same stream).

Importing this module raises ImportError when numba is missing;
:func:`replaybank.ops.draws.uniform_ints` then uses the numpy function.

Example:
    >>> import numpy as np
    >>> out = np.zeros(3, np.int64)
    >>> map_raw(np.array([2**32 + 2**31], np.uint64), 4, out, 0), out.tolist()
    (2, [2, 0, 0])
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

__all__ = ["map_raw"]

IntArray = npt.NDArray[np.int64]
U64Array = npt.NDArray[np.uint64]


@numba.njit(cache=True, nogil=True)
def _map32(raw, high, out, start):  # type: ignore[no-untyped-def]  # pragma: no cover
    h = np.uint64(high)
    low32 = np.uint64(0xFFFFFFFF)
    thresh = np.uint64((np.uint64(1) << np.uint64(32)) % h)
    n = start
    size = out.shape[0]
    for i in range(raw.shape[0]):
        w = raw[i]
        for half in range(2):
            if n == size:
                return n
            x = w & low32 if half == 0 else w >> np.uint64(32)
            p = x * h
            if (p & low32) >= thresh:
                out[n] = np.int64(p >> np.uint64(32))
                n += 1
    return n


@numba.njit(cache=True, nogil=True)
def _map64(raw, high, mask, out, start):  # type: ignore[no-untyped-def]  # pragma: no cover
    h = np.uint64(high)
    n = start
    size = out.shape[0]
    for i in range(raw.shape[0]):
        if n == size:
            return n
        v = raw[i] & mask
        if v < h:
            out[n] = np.int64(v)
            n += 1
    return n


def map_raw(raw: U64Array, high: int, out: IntArray, start: int) -> int:
    """Same contract as :func:`replaybank.ops.draws.map_raw`."""
    if high <= 1 << 32:
        return int(_map32(raw, high, out, start))
    mask = np.uint64((1 << (high - 1).bit_length()) - 1)
    return int(_map64(raw, np.uint64(high), mask, out, start))
