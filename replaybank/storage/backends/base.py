"""Array backends: where the storage arrays live.

A backend allocates named arrays and moves data in and out of them. The step table
(:mod:`replaybank.storage.table`) does all bookkeeping in numpy and talks to the arrays
only through this small interface, so numpy, memmap and torch storage share one code
path. Bookkeeping arrays (lane counters, next-obs links) always use :meth:`allocate_meta`,
which a persistent backend keeps on disk beside the data.

Capabilities are declared as attributes, read once when a table's writer is chosen:
``host_numpy`` (the arrays are numpy arrays in this process's memory, so the one-step and
compiled writers and the numpy gathers may use them directly) and ``durable`` (the data
outlives the process: writes keep a crash-safe order, and the backend is a
:class:`DurableBackend`).

Example:
    >>> from replaybank.storage.backends.numpy import NumpyBackend
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

__all__ = ["ArrayBackend", "DurableBackend", "GroupedBackend", "MetaAddingBackend",
           "SharedArrayBackend", "available_memory", "check_fits"]


@runtime_checkable
class ArrayBackend(Protocol):
    """What the step table needs from the place its arrays live."""

    name: str
    #: The arrays are numpy arrays in host memory (direct writes and ``take`` are fine).
    host_numpy: bool
    #: The data outlives the process (files): ordered writes, flush, an owner record.
    durable: bool

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

    def index(self, index: npt.NDArray[np.int64]) -> Any:
        """``index`` in the form :meth:`gather` and :meth:`write` read fastest: the array
        itself in host memory, a device tensor for device storage (one host-to-device
        copy, so an index used for several fields travels once)."""
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


@runtime_checkable
class DurableBackend(ArrayBackend, Protocol):
    """A backend whose data outlives the process (``durable = True``).

    It keeps an opaque *owner record* beside the data: a JSON-able description the owning
    buffer writes (its config), so that the buffer can be rebuilt from the files alone.
    The backend never interprets it.
    """

    path: Any

    @property
    def read_only(self) -> bool:
        """Whether the storage was opened read-only, beside a process that may be writing
        it: the table reopened from it reads its counters as one snapshot (see
        :func:`~replaybank.storage.table_state.snapshot_table`)."""
        ...

    @property
    def buffer_id(self) -> str:
        """A random id of the buffer held in these files."""
        ...

    def record_owner(self, record: dict[str, Any] | None, error: str | None = None) -> None:
        """Store the owner's record (None with ``error``: it could not describe itself)."""
        ...

    def owner_record(self) -> dict[str, Any] | None:
        """The stored owner record, or None."""
        ...

    def close(self) -> None:
        """Sync and release the storage (e.g. a writer's lock); idempotent."""
        ...

    def check_writable(self, what: str) -> None:
        """Raise :class:`~replaybank.errors.ConfigError` naming ``what`` (the refused
        call) and the fix when this process may not write the storage: it was opened
        read-only, or closed (its files may then have another writer)."""
        ...


@runtime_checkable
class MetaAddingBackend(ArrayBackend, Protocol):
    """A durable backend that can give reopened files a bookkeeping array they lack
    (files written by an older version, before the array existed; checked once per
    table).

    The new array must be crash-safe on its own: it is complete (zero-filled) on disk
    before anything names it, so a process killed at any instant leaves either no such
    array (the files read as before) or one of zeros.
    """

    def add_meta(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """Return the bookkeeping array ``meta/<name>``, zero-filled and persistent,
        creating it when the files have none (the existing one otherwise).

        Raises:
            ConfigError: The storage is read-only or closed here.
            CapacityError: The disk has no room for it (nothing is created).
        """
        ...


@runtime_checkable
class SharedArrayBackend(ArrayBackend, Protocol):
    """A backend whose arrays other processes map at the same time (shared memory).

    Its arrays are allocated whole (``fixed_size``: the step table allocates the side
    store at one slot per step, since a mapped array cannot grow), and ``owner`` says
    whether this process created them (and samples them through a snapshot of the lane
    counters) or attached them to write its own lanes.
    """

    fixed_size: bool
    owner: bool

    def shared(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """The shared array ``name`` (created by the owner on first call)."""
        ...

    def layout(self) -> Any:
        """A picklable description that lets another process attach the arrays."""
        ...

    def close(self) -> None:
        """Owner: release the arrays for good; attached: drop this process's mappings."""
        ...


@runtime_checkable
class GroupedBackend(ArrayBackend, Protocol):
    """A backend that allocates the data fields together (checked once per table): torch
    storage packs fields of one dtype into one ``[T, lanes, width]`` tensor and hands out
    views of it per field, so a sample reads each dtype group with one gather."""

    def allocate_fields(self, fields: dict[str, tuple[tuple[int, ...], np.dtype[Any]]]
                        ) -> dict[str, Any]:
        """Zero-filled arrays ``{name: shape}`` for the data fields (same as
        :meth:`allocate` for each, possibly views of shared memory)."""
        ...
