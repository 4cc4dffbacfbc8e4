"""The device store: torch tensors whose one-step samples are drawn on the host and
gathered on the device (:mod:`replaybank.device.path`: numpy storage's keys, one packed
copy), with priority updates checked on the host and ``sample_fn``'s device generator in
the buffer's state.

Example:
    >>> import numpy as np, replaybank as rb
    >>> buf = rb.ReplayBuffer(16, storage="torch", device="cpu", seed=0)
    >>> for t in range(4):
    ...     buf.add(obs=np.full(2, t, np.float32), action=0, reward=1.0,
    ...             next_obs=np.full(2, t + 1, np.float32), terminated=False, truncated=False)
    >>> type(buf.store).__name__, tuple(buf.sample(3).obs.shape)
    ('DeviceStore', (3, 2))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replaybank.batch import Batch
from replaybank.buffers.priorities import to_host
from replaybank.buffers.sampling_parts import Parts
from replaybank.buffers.store import Store
from replaybank.device.path import DevicePath, device_path
from replaybank.samplers.base import Sampler
from replaybank.spec import Spec
from replaybank.storage.backends.base import ArrayBackend

__all__ = ["DeviceStore", "device_store"]


class DeviceStore(Store):
    """Torch tensors whose one-step samples are gathered on the device.

    Args:
        backend: Where the arrays live (torch tensors).
        rows: Rows per lane.
        lanes: Lanes (envs).
        rows_only: The table stores rows (no next observations).
        path: The device path (:func:`~replaybank.device.path.device_path`).
    """

    def __init__(self, backend: ArrayBackend, rows: int, lanes: int, rows_only: bool,
                 path: DevicePath) -> None:
        super().__init__(backend, rows, lanes, rows_only)
        self.path = path

    def sample(self, parts: Parts, rng: np.random.Generator, batch_size: Any,
               replace: Any, kwargs: dict[str, Any]) -> Batch[Any]:
        got = self.path.sample(self.table, parts, rng, batch_size, replace, kwargs)
        if got is not None:
            return Batch.own(got)
        return super().sample(parts, rng, batch_size, replace, kwargs)

    def updated(self, sampler: Sampler, apply: Callable[..., int], *values: Any) -> int:
        """The update on the host tree, the record of every priority (device tensors
        copied in one transfer)."""
        return apply(*to_host(*values))

    def state_dict(self) -> dict[str, Any]:
        """``{"device_rng": ...}`` once the device generator is seeded."""
        dev = self.path.state_dict()
        return {"device_rng": dev} if dev else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # absent: reseeded from the host generator on the next device draw
        self.path.load_state_dict(state_dict.get("device_rng", {}))

    def device(self) -> DevicePath:
        return self.path


def device_store(backend: ArrayBackend, rows: int, lanes: int, rows_only: bool,
                 spec: Spec | None = None) -> Store | None:
    """The store of a torch backend: a :class:`DeviceStore` when the backend takes the
    device path, else None (the local store: ``TorchBackend(draws="host")``).

    Args:
        backend: The torch backend.
        rows: Rows per lane.
        lanes: Lanes (envs).
        rows_only: The table stores rows (no next observations).
        spec: Unused (the caller allocates).
    """
    path = device_path(backend)
    return None if path is None else DeviceStore(backend, rows, lanes, rows_only, path)
