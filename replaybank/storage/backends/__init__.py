"""Array backends: where the step table's arrays live (numpy, memmap files, torch)."""

from __future__ import annotations

from typing import Any

from replaybank.errors import ConfigError
from replaybank.storage.backends.base import ArrayBackend
from replaybank.storage.backends.numpy import NumpyBackend

__all__ = ["STORAGES", "make_backend"]

STORAGES = ("numpy", "memmap", "torch", "shared")


def make_backend(storage: str | ArrayBackend = "numpy", path: Any = None,
                 device: Any = None) -> ArrayBackend:
    """Build the array backend named by ``storage``.

    Args:
        storage: ``"numpy"`` (in memory), ``"memmap"`` (files under ``path``),
            ``"torch"`` (tensors on ``device``), ``"shared"`` (shared memory, written by
            collector processes: :mod:`replaybank.buffers.shared`), or a ready backend.
        path: Directory for memmap storage.
        device: Torch device for torch storage.

    Returns:
        The backend.

    Raises:
        ConfigError: Unknown storage name or a missing path.

    Example:
        >>> make_backend("numpy").name
        'numpy'
    """
    if not isinstance(storage, str):
        return storage
    if storage == "numpy":
        if path is not None or device is not None:
            raise ConfigError(
                f'storage="numpy" takes neither path={path!r} nor device={device!r}; '
                'use storage="memmap" for a path or storage="torch" for a device'
            )
        return NumpyBackend()
    if storage == "memmap":
        if path is None:
            raise ConfigError('storage="memmap" needs path=<directory for the array files>')
        from replaybank.storage.backends.memmap import MemmapBackend

        return MemmapBackend(path)
    if storage == "shared":
        if path is not None or device is not None:
            raise ConfigError(f'storage="shared" takes neither path={path!r} nor '
                              f"device={device!r}: its arrays live in shared memory")
        from replaybank.storage.backends.shared import SharedBackend

        return SharedBackend()
    if storage == "torch":
        from replaybank.storage.backends.torch import TorchBackend

        return TorchBackend(device)
    raise ConfigError(f"storage={storage!r}: unknown storage; choose one of {list(STORAGES)}")
