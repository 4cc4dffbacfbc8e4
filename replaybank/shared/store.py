"""The shared-memory owner's store: collector processes write, this process reads a
refreshed snapshot of their lanes (:mod:`replaybank.shared`).

Example:
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(8, num_envs=2, storage="shared",
    ...                       spec={"obs": ((), "float32"), "action": ((), "int64")})
    >>> type(buf.store).__name__, len(buf)
    ('SharedStore', 0)
    >>> buf.close()
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import numpy as np

from replaybank.batch import Batch
from replaybank.buffers.sampling_parts import Parts
from replaybank.buffers.store import Store
from replaybank.errors import ConfigError
from replaybank.samplers.base import Sampler
from replaybank.shared.checkpoint import snapshot_state
from replaybank.shared.reader import SharedReader
from replaybank.shared.writer import SharedWriterHandle, writer_handle
from replaybank.spec import Spec
from replaybank.storage.backends.base import ArrayBackend, SharedArrayBackend

__all__ = ["SharedStore", "shared_store"]

T_ = TypeVar("T_")


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
        self.closed = False

    def check_open(self, call: str) -> None:
        """Refuse a read after :meth:`close`: the segments are unmapped (reading them
        was a segmentation fault).

        Raises:
            ConfigError: The buffer was closed.
        """
        if self.closed:
            raise ConfigError(
                f'{call}: this storage="shared" buffer was closed (buf.close() unlinked and '
                "unmapped its shared memory); build a new buffer, or save it with rb.save "
                "before closing and rb.load the copy")

    size_syncs = True  # (size reads the writers' new steps into the snapshot)

    def size(self, sampler: Sampler) -> int:
        self.check_open("len(buf)")
        self.reader.sync(sampler)
        return super().size(sampler)

    def check_write(self, call: str) -> None:
        raise ConfigError(
            f'{call}(): a storage="shared" buffer is written by its writers, not by its '
            "owner: hand buf.writer(lanes=[...]) to each collector process and call "
            "add/extend on its open()")

    def sample(self, parts: Parts, rng: np.random.Generator, batch_size: Any,
               replace: Any, kwargs: dict[str, Any]) -> Batch[Any]:
        self.check_open("sample()")
        return self.reader.read(parts.sampler, lambda: super(SharedStore, self).sample(
            parts, rng, batch_size, replace, kwargs))

    def read(self, sampler: Sampler, draw: Callable[[], T_]) -> T_:
        self.check_open("sample() or state_dict()")
        return self.reader.read(sampler, draw)

    def updated(self, sampler: Sampler, apply: Callable[..., int], *values: Any) -> int:
        """The update on a fresh snapshot: keys of steps the writers evicted since they
        were sampled are stale (ignored and not counted), as on a local buffer."""
        self.check_open("update_priorities()")
        self.reader.sync(sampler)
        return apply(*values)

    def table_state(self, copy: bool = True) -> dict[str, Any] | None:
        """A copy of the snapshot's steps as a plain table's state
        (:func:`~replaybank.shared.checkpoint.snapshot_state`; always a copy, whatever
        ``copy`` says): read it through :meth:`read`, which retries when writers
        overwrote the copy."""
        self.check_open("state_dict()")
        table = self.table
        return None if table is None else snapshot_state(table, self.reader.snapshot)

    def metadata(self) -> dict[str, Any]:
        """``shared_retries``: draws thrown away because writers evicted their steps."""
        return {"shared_retries": self.reader.retries}

    def close(self, exclusive: Callable[[], AbstractContextManager[None]]) -> None:
        """Unlink and unmap the segments, once no other thread's call on the buffer runs
        (``exclusive``: a sample in flight in another thread read unmapped memory)."""
        with exclusive():
            self.closed = True
            self.shared_backend.close()

    def writer(self, owner: Any, lanes: Any) -> SharedWriterHandle:
        """A picklable handle for a collector process that writes ``lanes``."""
        from replaybank.config import buffer_config

        return writer_handle(self.shared_backend, buffer_config(owner).model_dump(mode="json"),
                             lanes, self.lanes)


def shared_store(backend: ArrayBackend, rows: int, lanes: int, rows_only: bool,
                 spec: Spec | None = None) -> Store | None:
    """The store of a shared backend: a :class:`SharedStore` for the owner (which
    allocates the shared arrays from ``spec`` now), None (the local store) for a writer's
    attached backend.

    Args:
        backend: The shared backend.
        rows: Rows per lane.
        lanes: Lanes (envs).
        rows_only: The table stores rows (no next observations).
        spec: The stored fields (required by the owner).

    Raises:
        ConfigError: An owner without ``spec``.
    """
    if isinstance(backend, SharedArrayBackend) and backend.owner:
        return SharedStore(backend, rows, lanes, rows_only, spec)
    return None
