"""Array backends: where the step table's arrays live.

The core builds numpy arrays and memmap files; the rooms above it register the rest
(:func:`replaybank.registry.register_storage`): torch tensors (:mod:`replaybank.device`)
and shared memory (:mod:`replaybank.shared`).
"""

from __future__ import annotations

from typing import Any

from replaybank import registry
from replaybank.errors import ConfigError
from replaybank.storage.backends.base import ArrayBackend
from replaybank.storage.backends.numpy import NumpyBackend

__all__ = ["make_backend"]


def make_backend(storage: str | ArrayBackend = "numpy", path: Any = None,
                 device: Any = None) -> ArrayBackend:
    """Build the array backend named by ``storage``.

    Args:
        storage: ``"numpy"`` (in memory), ``"memmap"`` (files under ``path``),
            ``"torch"`` (tensors on ``device``: :mod:`replaybank.device`), ``"shared"``
            (shared memory, written by collector processes: :mod:`replaybank.shared`),
            another registered name, or a ready backend.
        path: Directory for memmap storage.
        device: Torch device for torch storage.

    Returns:
        The backend.

    Raises:
        ConfigError: Unknown storage name, or arguments the storage does not take.

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
    kind = registry.STORAGE_KINDS.get(storage)
    if kind is None:
        raise ConfigError(f"storage={storage!r}: unknown storage; choose one of "
                          f"{list(registry.storage_names())}")
    backend: ArrayBackend = kind.backend(path, device)
    return backend
