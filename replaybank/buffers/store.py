"""Where a replay buffer's steps live and how its calls reach them: the Store part.

A :class:`~replaybank.buffers.replay.ReplayBuffer` holds a sampler, a view, a generator
and a store, and never asks which storage it has. The store owns the backend and the step
table (allocated by the first write, or at construction from ``spec=``) and everything that
differs between storage modes:

* :class:`Store`: numpy arrays or memmap files read and written in this process (a
  memmap store also releases its files on :meth:`~Store.close`);
* :class:`~replaybank.device.store.DeviceStore` (in the device room): torch tensors;
  one-step samples are drawn on the host (numpy storage's keys; the host tree is the
  record of every priority) and gathered on the device, and ``sample_fn``'s device
  generator is part of the state;
* :class:`~replaybank.shared.store.SharedStore` (in the shared-memory room): the owner of
  ``storage="shared"`` memory, written by collector processes through
  :meth:`~Store.writer` handles: every read refreshes a snapshot of their lanes first and
  retries a draw the writers outran.

This module defines the protocol (the methods of :class:`Store`) and the local store;
:func:`make_store` asks the registered storage kind of the backend for its store
(:func:`replaybank.registry.register_storage`), so the core imports neither room.

Example:
    >>> import numpy as np
    >>> from replaybank.storage.backends import make_backend
    >>> store = make_store(make_backend("numpy", None, None), rows=8, lanes=1,
    ...                    rows_only=False)
    >>> type(store).__name__, store.table is None
    ('Store', True)
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from replaybank import registry
from replaybank.batch import Batch, SequenceBatch
from replaybank.buffers import buffer_state
from replaybank.buffers.sampling_parts import Parts
from replaybank.errors import ConfigError
from replaybank.samplers.base import LaneView, Sampler
from replaybank.spec import Spec
from replaybank.storage.backends.base import ArrayBackend, DurableBackend
from replaybank.storage.table import StepTable
from replaybank.storage.table_state import check_table, snapshot_table, table_state

if TYPE_CHECKING:
    from replaybank.device.path import DevicePath
    from replaybank.shared.writer import SharedWriterHandle

__all__ = ["Store", "make_store", "no_device_draws"]

T_ = TypeVar("T_")
B_ = TypeVar("B_", Batch, SequenceBatch)


class Store:
    """Steps in this process's memory or memory-mapped files (numpy, memmap).

    Args:
        backend: Where the arrays live.
        rows: Rows per lane.
        lanes: Lanes (envs).
        rows_only: The table stores rows (no next observations).
    """

    #: :meth:`size` changes state (a shared-memory store refreshes its snapshot and tells
    #: the sampler what entered it), so ``len(buf)`` runs it as a guarded call; here it
    #: only reads the counters.
    size_syncs = False

    def __init__(self, backend: ArrayBackend, rows: int, lanes: int, rows_only: bool) -> None:
        self.backend = backend
        self.rows = rows
        self.lanes = lanes
        self.rows_only = rows_only
        #: The step table (None until the first write or a spec).
        self.table: StepTable | None = None
        self._lane_view: LaneView | None = None
        # files that may refuse writes (resolved once: a protocol check costs ~20 us)
        self._files = backend if backend.durable and isinstance(backend, DurableBackend) \
            else None

    def allocate(self, spec: Spec) -> StepTable:
        """Allocate the table for ``spec`` (its arrays on the backend)."""
        self.table = buffer_state.make_table(spec, self.rows, self.lanes, self.backend,
                                             self.rows_only)
        return self.table

    def size(self, sampler: Sampler) -> int:
        """Live steps over every lane (``sampler`` hears what the storage changed)."""
        t = self.table
        if t is None:
            return 0
        if t.lanes == 1:
            return int(t.counts[0])
        # a Python sum of a few lanes costs less than numpy's reduction call
        return sum(t.counts.tolist()) if t.lanes <= 64 else int(t.counts.sum())

    def check_write(self, call: str) -> None:
        """Raise when this process may not write the storage (``call``: the public verb):
        durable files opened read-only or closed refuse before anything changes, even in
        memory (``ConfigError``)."""
        if self._files is not None:
            self._files.check_writable(f"{call}()")

    def sample(self, parts: Parts, rng: np.random.Generator, batch_size: Any,
               replace: Any, kwargs: dict[str, Any]) -> Batch[Any]:
        """One batch: the sampler draws, the view serves (:meth:`Parts.sample`)."""
        return self.placed(Batch.own(parts.sample(self.table, self.lane_view(), rng,
                                                  batch_size, replace, kwargs)))

    def placed(self, batch: B_) -> B_:
        """``batch`` as this storage hands batches out: host arrays from host storage
        (numpy, memmap, shared memory), else every field a tensor on the storage's device
        (:meth:`~replaybank.batch.Batch.tensors_together`: the keys, weights and
        probabilities a sampler computes on the host join the gathered tensors)."""
        return batch if self.backend.host_numpy else batch.tensors_together()

    def read(self, sampler: Sampler, draw: Callable[[], T_]) -> T_:
        """Run a read of the table (e.g. a sequence draw) that ``sampler`` drives."""
        return draw()

    def lane_view(self) -> LaneView | None:
        """The table's lane bookkeeping for samplers (None before the table exists)."""
        t = self.table
        if t is None:
            return None
        lv = self._lane_view
        if lv is None or lv.written is not t.written or lv.counts is not t.counts:
            lv = self._lane_view = LaneView(t.T, t.lanes, t.written, t.counts)
        return lv

    def updated(self, sampler: Sampler, apply: Callable[..., int], *values: Any) -> int:
        """``apply(*values)`` of a priority update by item keys (the first value), on the
        live steps as they are now (``sampler`` hears what the storage changed first, as
        in :meth:`size`)."""
        return apply(*values)

    def table_state(self, copy: bool = True) -> dict[str, Any] | None:
        """The table's arrays by state key (:func:`~replaybank.storage.table_state.
        table_state`: copies, or with ``copy=False`` views where the storage allows),
        None before it exists."""
        return None if self.table is None else table_state(self.table, copy)

    def state_dict(self) -> dict[str, Any]:
        """State of the storage's own beyond the table (merged into the buffer's)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`, given the buffer's whole state."""

    def metadata(self) -> dict[str, Any]:
        """JSON-able entries the buffer's metadata adds for this storage."""
        return {}

    def reopened(self) -> None:
        """Check the table reopened from its files and rebuild its free side slots: as
        the files hold it (:func:`~replaybank.storage.table_state.check_table`), or,
        opened read-only beside a writer that may be adding, from one consistent
        snapshot of its counters
        (:func:`~replaybank.storage.table_state.snapshot_table`).

        Raises:
            CheckpointError: The files' lane counters or links are damaged.
        """
        t = self.table
        if t is None:
            return
        if self._files is not None and self._files.read_only:
            snapshot_table(t, self.where())
            return
        check_table(t, self.where())
        t.rebuild_free_list()

    def where(self) -> str:
        """The call that opened this storage, for error messages."""
        be = self.backend
        return f"open({be.path})" if isinstance(be, DurableBackend) else "open()"

    def close(self, exclusive: Callable[[], AbstractContextManager[None]]) -> None:
        """Release durable storage (a memmap store syncs its files and drops the writer's
        lock; held ``exclusive`` of the buffer's other calls); no-op in memory."""
        if isinstance(self.backend, DurableBackend):
            with exclusive():
                self.backend.close()

    def device(self) -> DevicePath:
        """The device path (:meth:`ReplayBuffer.sample_fn`); raises for host storage."""
        raise no_device_draws(f'this buffer\'s storage ("{self.backend.name}")')

    def writer(self, owner: Any, lanes: Any) -> SharedWriterHandle:
        """A collector's write handle (a shared store's); raises for other storage."""
        raise ConfigError(f'writer(): the buffer\'s storage is "{self.backend.name}"; only a '
                          'storage="shared" buffer hands out writers')

    def __getstate__(self) -> dict[str, Any]:
        """Pickle support: the lane view is rebuilt on use."""
        out = self.__dict__.copy()
        out["_lane_view"] = None
        return out


def no_device_draws(holder: str) -> ConfigError:
    """The refusal of ``sample_fn`` by a ``holder`` whose draws are not on the device: one
    message for a buffer's host storage and the Ray service's client.

    Args:
        holder: What does not draw there (``'this buffer\'s storage ("numpy")'``).

    Returns:
        The :class:`~replaybank.errors.ConfigError` to raise.

    Example:
        >>> str(no_device_draws("a ReplayClient")).split(";")[0]
        'sample_fn: a ReplayClient does not draw on the device'
    """
    return ConfigError(
        f"sample_fn: {holder} does not draw on the device; build a buffer with "
        'storage="torch" (with TorchBackend draws="device", the default) or call sample()'
    )


def make_store(backend: ArrayBackend, rows: int, lanes: int, rows_only: bool,
               spec: Spec | None = None) -> Store:
    """The store of ``backend``: the one its registered storage kind gives (the device
    path, a shared-memory owner: :func:`replaybank.registry.register_storage`), else local.

    Args:
        backend: Where the arrays live.
        rows: Rows per lane.
        lanes: Lanes (envs).
        rows_only: The table stores rows (no next observations).
        spec: The stored fields when known (allocated now; required by a shared owner).

    Raises:
        ConfigError: A shared owner without ``spec``.
    """
    kind = registry.STORAGE_KINDS.get(backend.name)
    store: Store | None = None
    if kind is not None and kind.store is not None:
        store = kind.store(backend, rows, lanes, rows_only, spec)
    if store is None:
        store = Store(backend, rows, lanes, rows_only)
    if spec is not None and store.table is None:
        store.allocate(spec)
    return store
