"""numba twin of :func:`replaybank.ops.gae.reverse_scan`'s loop (same operations, same order).

Importing this module raises ImportError when numba is missing; :func:`~replaybank.ops.gae.
reverse_scan` then runs its numpy loop. Compiled once per machine (``cache=True``).

Example:
    >>> import numpy as np
    >>> out = np.empty((3, 1))
    >>> scan(np.ones((3, 1)), np.full((3, 1), 0.5), out)
    >>> out[:, 0].tolist()
    [1.75, 1.5, 1.0]
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

__all__ = ["scan"]

FloatArray = npt.NDArray[np.float64]


@numba.njit(cache=True, nogil=True)
def _scan(x, coef, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    # x, coef, out: [T, M] float64, C-contiguous; loop time backwards, envs inner
    steps, width = x.shape
    acc = np.zeros(width)
    for t in range(steps - 1, -1, -1):
        for j in range(width):
            acc[j] = x[t, j] + coef[t, j] * acc[j]
            out[t, j] = acc[j]


def scan(x: FloatArray, coef: FloatArray, out: FloatArray) -> None:
    """``out[t] = x[t] + coef[t] * out[t + 1]`` backwards over axis 0 of ``[T, M]`` arrays."""
    _scan(x, coef, out)
