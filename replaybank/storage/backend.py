"""Array backends: where the storage arrays live.

A backend allocates named arrays and moves data in and out of them. The step table
(:mod:`replaybank.storage.table`) does all bookkeeping in numpy and talks to the arrays
only through this small interface, so numpy, memmap and torch storage share one code
path. Bookkeeping arrays (lane counters, next-obs links) always use :meth:`allocate_meta`,
which a persistent backend keeps on disk beside the data.

Example:
    >>> be = NumpyBackend()
    >>> a = be.allocate("obs", (4, 1, 3), np.dtype("float32"))
    >>> be.write(a, (np.array([0]), np.array([0])), np.ones((1, 3), np.float32))
    >>> float(be.gather(a, (np.array([0, 1]), np.array([0, 0]))).sum())
    3.0
"""

from __future__ import annotations

import os
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from replaybank.errors import CapacityError

__all__ = ["ArrayBackend", "NumpyBackend", "available_memory", "check_fits"]


@runtime_checkable
class ArrayBackend(Protocol):
    """What the step table needs from the place its arrays live."""

    name: str

    def allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """Return a zero-filled array ``shape`` of ``dtype`` for field ``name``."""
        ...

    def allocate_meta(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """Return a zero-filled numpy array for bookkeeping (persistent where the data is)."""
        ...

    def resize(self, name: str, array: Any, length: int) -> Any:
        """Return ``array`` grown along axis 0 to ``length`` (content kept)."""
        ...

    def write(self, array: Any, index: Any, values: npt.NDArray[Any]) -> None:
        """``array[index] = values`` where ``values`` is a numpy array."""
        ...

    def gather(self, array: Any, index: Any) -> Any:
        """Return ``array[index]`` (fancy indexing, a new array of the backend's kind)."""
        ...

    def to_numpy(self, array: Any) -> npt.NDArray[Any]:
        """Return the array's content as numpy (a view when possible)."""
        ...

    def flush(self) -> None:
        """Make written data durable (no-op in memory)."""
        ...

    def requires_memory(self) -> bool:
        """Whether data arrays take RAM (memmap storage does not)."""
        ...


def available_memory() -> int | None:
    """Bytes of memory available to new allocations, or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - platform specific
        return None


def check_fits(nbytes: int, what: str) -> None:
    """Raise :class:`CapacityError` when ``nbytes`` exceed the available memory.

    Args:
        nbytes: Bytes about to be allocated.
        what: Description for the message (e.g. ``"ReplayBuffer(capacity=10**9)"``).

    Example:
        >>> check_fits(10, "tiny buffer")
    """
    avail = available_memory()
    if avail is not None and nbytes > avail:
        raise CapacityError(
            f"{what} needs {nbytes:,} bytes ({nbytes / 2**30:.2f} GiB) but only {avail:,} "
            f"bytes ({avail / 2**30:.2f} GiB) of memory are available; lower capacity or use "
            'storage="memmap" with a path on disk'
        )


class NumpyBackend:
    """In-memory numpy arrays (the default)."""

    name = "numpy"

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
