"""Where a replay buffer's steps live and how its calls reach them: the Store part.

A :class:`~replaybank.buffers.replay.ReplayBuffer` holds a sampler, a view, a generator
and a store, and never asks which storage it has. The store owns the backend and the step
table (allocated by the first write, or at construction from ``spec=``) and everything that
differs between storage modes:

* :class:`Store`: numpy arrays or memmap files read and written in this process (a
  memmap store also releases its files on :meth:`~Store.close`);
* :class:`DeviceStore`: torch tensors; uniform and prioritized one-step samples are drawn
  and gathered on the device (:mod:`~replaybank.buffers.device_path`), priority updates
  reach the device sum tree, and the device generator is part of the state;
* :class:`SharedStore`: the owner of ``storage="shared"`` memory, written by collector
  processes through :meth:`~SharedStore.writer` handles: every read refreshes a snapshot of
  their lanes first and retries a draw the writers outran
  (:mod:`~replaybank.buffers.shared`).

:func:`make_store` picks one from the backend's declared capabilities.

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
from typing import Any, TypeVar

import numpy as np

from replaybank.batch import Batch
from replaybank.buffers import buffer_state
from replaybank.buffers.device_path import DevicePath, device_path
from replaybank.buffers.parts import Parts
from replaybank.buffers.priorities import to_host
from replaybank.buffers.shared import SharedReader, SharedWriterHandle, writer_handle
from replaybank.errors import ConfigError
from replaybank.samplers.base import LaneView, Sampler
from replaybank.spec import Spec
from replaybank.storage.backends.base import ArrayBackend, DurableBackend, SharedArrayBackend
from replaybank.storage.table import StepTable

__all__ = ["DeviceStore", "SharedStore", "Store", "make_store"]

T_ = TypeVar("T_")


class Store:
    """Steps in this process's memory or memory-mapped files (numpy, memmap).

    Args:
        backend: Where the arrays live.
        rows: Rows per lane.
        lanes: Lanes (envs).
        rows_only: The table stores rows (no next observations).
    """

    def __init__(self, backend: ArrayBackend, rows: int, lanes: int, rows_only: bool) -> None:
        self.backend = backend
        self.rows = rows
        self.lanes = lanes
        self.rows_only = rows_only
        #: The step table (None until the first write or a spec).
        self.table: StepTable | None = None
        self._lane_view: LaneView | None = None

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
        """Raise when this process may not write the storage (``call``: the public verb)."""

    def sample(self, parts: Parts, rng: np.random.Generator, batch_size: Any,
               replace: Any, kwargs: dict[str, Any]) -> Batch:
        """One batch: the sampler draws, the view serves (:meth:`Parts.sample`)."""
        return Batch.own(parts.sample(self.table, self.lane_view(), rng, batch_size, replace,
                                      kwargs))

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

    def updated(self, apply: Callable[..., int], *values: Any) -> int:
        """``apply(*values)`` of a priority update by item keys (the first value)."""
        return apply(*values)

    def state_dict(self) -> dict[str, Any]:
        """State of the storage's own beyond the table (merged into the buffer's)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`, given the buffer's whole state."""

    def metadata(self) -> dict[str, Any]:
        """JSON-able entries the buffer's metadata adds for this storage."""
        return {}

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
        raise ConfigError(
            f"sample_fn: {self.backend!r} does not draw on the device; use "
            'storage="torch" (with TorchBackend draws="device", the default) or call '
            "sample()")

    def writer(self, owner: Any, lanes: Any) -> SharedWriterHandle:
        """A collector's write handle (:class:`SharedStore`); raises for other storage."""
        raise ConfigError(f'writer(): the buffer\'s storage is "{self.backend.name}"; only a '
                          'storage="shared" buffer hands out writers')

    def __getstate__(self) -> dict[str, Any]:
        """Pickle support: the lane view is rebuilt on use."""
        out = self.__dict__.copy()
        out["_lane_view"] = None
        return out


class DeviceStore(Store):
    """Torch tensors whose one-step samples are drawn and gathered on the device.

    Args:
        backend: Where the arrays live (torch tensors).
        rows: Rows per lane.
        lanes: Lanes (envs).
        rows_only: The table stores rows (no next observations).
        path: The device path (:func:`~replaybank.buffers.device_path.device_path`).
    """

    def __init__(self, backend: ArrayBackend, rows: int, lanes: int, rows_only: bool,
                 path: DevicePath) -> None:
        super().__init__(backend, rows, lanes, rows_only)
        self.path = path

    def sample(self, parts: Parts, rng: np.random.Generator, batch_size: Any,
               replace: Any, kwargs: dict[str, Any]) -> Batch:
        got = self.path.sample(self.table, parts, rng, batch_size, replace, kwargs)
        if got is not None:
            return Batch.own(got)
        return super().sample(parts, rng, batch_size, replace, kwargs)

    def updated(self, apply: Callable[..., int], *values: Any) -> int:
        """The update on the host (tensors copied in one transfer), then the device sum
        tree follows the keys (the first value)."""
        values = to_host(*values)
        n = apply(*values)
        self.path.touch(self.table, values[0])
        return n

    def state_dict(self) -> dict[str, Any]:
        """``{"device_rng": ...}`` once the device generator is seeded."""
        dev = self.path.state_dict()
        return {"device_rng": dev} if dev else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # absent: reseeded from the host generator on the next device draw
        self.path.load_state_dict(state_dict.get("device_rng", {}))

    def device(self) -> DevicePath:
        return self.path


class SharedStore(Store):
    """The owner's side of ``storage="shared"``: collector processes write, this process
    reads a refreshed snapshot of their lanes.

    Args:
        backend: The owner's shared-memory backend.
        rows: Rows per lane.
        lanes: Lanes (envs).
        rows_only: The table stores rows (no next observations).
        spec: The stored fields (the owner allocates the shared arrays before any writer
            starts).

    Raises:
        ConfigError: No ``spec``.
    """

    def __init__(self, backend: SharedArrayBackend, rows: int, lanes: int, rows_only: bool,
                 spec: Spec | None) -> None:
        super().__init__(backend, rows, lanes, rows_only)
        if spec is None:
            raise ConfigError('storage="shared" needs spec= (the owner allocates the '
                              "shared arrays before its writers start; "
                              "rb.spec_from_env(env) gives one)")
        self.shared_backend = backend
        self.reader = SharedReader(backend, self.allocate(spec))

    def size(self, sampler: Sampler) -> int:
        self.reader.sync(sampler)
        return super().size(sampler)

    def check_write(self, call: str) -> None:
        raise ConfigError(
            f'{call}(): a storage="shared" buffer is written by its writers, not by its '
            "owner: hand buf.writer(lanes=[...]) to each collector process and call "
            "add/extend on its open()")

    def sample(self, parts: Parts, rng: np.random.Generator, batch_size: Any,
               replace: Any, kwargs: dict[str, Any]) -> Batch:
        return self.reader.read(parts.sampler, lambda: super(SharedStore, self).sample(
            parts, rng, batch_size, replace, kwargs))

    def read(self, sampler: Sampler, draw: Callable[[], T_]) -> T_:
        return self.reader.read(sampler, draw)

    def metadata(self) -> dict[str, Any]:
        """``shared_retries``: draws thrown away because writers evicted their steps."""
        return {"shared_retries": self.reader.retries}

    def close(self, exclusive: Callable[[], AbstractContextManager[None]]) -> None:
        self.shared_backend.close()

    def writer(self, owner: Any, lanes: Any) -> SharedWriterHandle:
        """A picklable handle for a collector process that writes ``lanes``."""
        from replaybank.config import buffer_config

        return writer_handle(self.shared_backend, buffer_config(owner).model_dump(mode="json"),
                             lanes, self.lanes)


def make_store(backend: ArrayBackend, rows: int, lanes: int, rows_only: bool,
               spec: Spec | None = None) -> Store:
    """The store of ``backend``: shared-memory owner, device draws, or local.

    Args:
        backend: Where the arrays live.
        rows: Rows per lane.
        lanes: Lanes (envs).
        rows_only: The table stores rows (no next observations).
        spec: The stored fields when known (allocated now; required by a shared owner).

    Raises:
        ConfigError: A shared owner without ``spec``.
    """
    store: Store
    if isinstance(backend, SharedArrayBackend) and backend.owner:
        return SharedStore(backend, rows, lanes, rows_only, spec)
    path = device_path(backend)
    store = Store(backend, rows, lanes, rows_only) if path is None else \
        DeviceStore(backend, rows, lanes, rows_only, path)
    if spec is not None:
        store.allocate(spec)
    return store

