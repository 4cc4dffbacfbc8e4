"""Sums over contiguous segments of a 1-D array (episode returns, per-episode counts).

Each segment is summed on its own (:func:`numpy.add.reduceat`), not as a difference of
running sums: a NaN or infinite value then stays in its own segment (a difference of
cumulative sums carries it into every later segment: ``inf - inf`` is NaN), and a late
segment of a long array keeps its precision.

Example:
    >>> import numpy as np
    >>> segment_sums(np.array([1.0, np.nan, 1.0, 2.0, 3.0]), np.array([0, 3]),
    ...              np.array([2, 4])).tolist()
    [nan, 5.0]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["segment_sums"]


def segment_sums(
    values: npt.NDArray[Any], starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """``sum(values[starts[i]:ends[i] + 1])`` for each segment ``i``, in float64.

    Args:
        values: ``[n]`` numbers.
        starts: ``[m]`` first index of each segment, increasing.
        ends: ``[m]`` last index of each segment (inclusive); ``starts[i] <= ends[i] <
            starts[i + 1]``.

    Returns:
        ``[m]`` float64 sums (empty when ``m`` is 0).
    """
    if starts.size == 0:
        return np.zeros(0)
    v = np.asarray(values, np.float64)
    # [2m] boundaries: each segment's start and the index after its end; reduceat sums
    # between consecutive boundaries, so every other result is a segment (the rest are
    # the gaps between segments, dropped)
    bounds = np.stack([starts, ends + 1], axis=1).reshape(-1)
    padded = np.concatenate([v, [0.0]])  # an end at the last value bounds at n
    with np.errstate(invalid="ignore", over="ignore"):  # (inf - inf, overflow: NaN, inf
        # stay in their segment, which callers count as non-finite)
        return np.add.reduceat(padded, bounds)[::2]
