"""In-memory numpy arrays: the default backend.

Example:
    >>> import numpy as np
    >>> be = NumpyBackend()
    >>> a = be.allocate("obs", (4, 1, 3), np.dtype("float32"))
    >>> be.write(a, (np.array([0]), np.array([0])), np.ones((1, 3), np.float32))
    >>> float(be.gather(a, (np.array([0, 1]), np.array([0, 0]))).sum())
    3.0
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["NumpyBackend"]


class NumpyBackend:
    """In-memory numpy arrays (the default)."""

    name = "numpy"
    host_numpy = True
    durable = False

    def allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return np.zeros(shape, dtype=dtype)

    def allocate_meta(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return np.zeros(shape, dtype=dtype)

    def resize(self, name: str, array: Any, length: int) -> Any:
        out = np.zeros((length, *array.shape[1:]), dtype=array.dtype)
        keep = min(len(array), length)  # shrinking happens when a smaller state is loaded
        out[:keep] = array[:keep]
        return out

    def write(self, array: Any, index: Any, values: npt.NDArray[Any]) -> None:
        array[index] = values

    def index(self, index: npt.NDArray[np.int64]) -> Any:
        """The index itself (host memory)."""
        return index

    def gather(self, array: Any, index: Any) -> Any:
        if type(index) is np.ndarray and index.dtype.kind == "i" and type(array) is np.ndarray:
            return array.take(index, axis=0)  # ~2x faster than array[index] on axis 0
        if type(index) is tuple and len(index) == 2 and type(array) is np.ndarray \
                and array.ndim >= 2 and array.flags.c_contiguous:
            rows, lanes = index
            if type(rows) is np.ndarray and type(lanes) is np.ndarray \
                    and rows.dtype.kind == "i" and lanes.dtype.kind == "i":
                # (row, lane) pairs as one flat take: ~2x faster than 2-array indexing
                flat = array.reshape(array.shape[0] * array.shape[1], *array.shape[2:])
                return flat.take(rows * array.shape[1] + lanes, axis=0)
        return array[index]

    def to_numpy(self, array: Any) -> npt.NDArray[Any]:
        return np.asarray(array)

    def flush(self) -> None:
        return None

    def requires_memory(self) -> bool:
        return True
