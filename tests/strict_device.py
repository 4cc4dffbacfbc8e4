"""A CPU stand-in for device tensors that refuses every host conversion (issue 17, item 6).

CI has no GPU, so the bug class "device data converted to numpy on the host" (which on
CUDA raises ``TypeError: can't convert cuda:0 device type tensor to numpy`` or silently
synchronises) would never fail there. :class:`StrictTensor` is a ``torch.Tensor``
subclass: torch ops on it run on the CPU and return StrictTensors, but every call that on
a real device would copy data to the host or wait for the device (``np.asarray``,
``.numpy()``, ``.item()``, ``.tolist()``, ``.cpu()``, ``.to("cpu")``, ``bool()``/``int()``/
``float()`` of a tensor, data-dependent shapes: ``nonzero``, boolean-mask indexing,
``unique``, ``masked_select``) raises :class:`HostSyncError`, unless the test allows a
number of them with :func:`allow_syncs`. An allowed transfer (``.cpu()``, ``.to("cpu")``)
returns a plain tensor: host memory, free to convert.

:class:`StrictBackend` is torch storage (CPU) whose field arrays are StrictTensors, so a
buffer built with ``storage=StrictBackend()`` fails wherever device data would go to the
host. :func:`host` turns a StrictTensor into numpy for a test's own comparisons.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from replaybank.device.backend import TorchBackend

__all__ = ["HostSyncError", "StrictBackend", "StrictTensor", "allow_syncs", "host", "strict"]


class HostSyncError(RuntimeError):
    """Device data was converted on the host (or the host waited on the device)."""


_state = threading.local()


def _budget() -> list[int] | None:
    return getattr(_state, "budget", None)


@contextlib.contextmanager
def allow_syncs(n: int) -> Iterator[list[int]]:
    """Allow at most ``n`` host conversions inside the block; yields ``[left, used]``."""
    old = _budget()
    box = [n, 0]
    _state.budget = box
    try:
        yield box
    finally:
        _state.budget = old


_T = torch.Tensor
_SYNC_METHODS = {
    _T.__array__, _T.numpy, _T.item, _T.tolist, _T.cpu, _T.__bool__, _T.__int__,
    _T.__float__, _T.__index__, _T.__complex__, _T.nonzero, _T.unique, _T.masked_select,
    torch.nonzero, torch.unique, torch.masked_select, _T.argwhere, torch.argwhere,
}
_SYNC_NAMES = {"__array__", "numpy", "item", "tolist", "cpu", "__bool__", "__int__",
               "__float__", "__index__", "__complex__", "nonzero", "unique",
               "masked_select", "argwhere", "nonzero_static", "__array_wrap__"}


def _is_cpu(dev: Any) -> bool:
    return (isinstance(dev, str) and dev.split(":")[0] == "cpu") or \
        (isinstance(dev, torch.device) and dev.type == "cpu")


def _refuse(what: str) -> None:
    box = _budget()
    if box is not None and box[0] > 0:
        box[0] -= 1
        box[1] += 1
        return
    raise HostSyncError(f"host conversion of device data: {what}")


def _has_strict(obj: Any) -> bool:
    if isinstance(obj, StrictTensor):
        return True
    if isinstance(obj, (tuple, list)):
        return any(_has_strict(o) for o in obj)
    return False


class StrictTensor(torch.Tensor):
    """A CPU tensor that behaves like device memory: host conversions raise HostSyncError."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if func in _SYNC_METHODS or name in _SYNC_NAMES:
            if _has_strict(args[:1]) or _has_strict(list(kwargs.values())):
                _refuse(name)
                if name == "cpu":  # a transfer: what arrives is host memory
                    with torch._C.DisableTorchFunctionSubclass():
                        return func(*args, **kwargs)
        elif name == "to" and _has_strict(args[:1]):
            dev = kwargs.get("device")
            if dev is None:
                dev = next((a for a in args[1:] if isinstance(a, (str, torch.device))), None)
            if dev is not None and _is_cpu(dev):
                _refuse(f"{name}({dev!r})")  # a transfer: what arrives is host memory
                with torch._C.DisableTorchFunctionSubclass():
                    return func(*args, **kwargs).clone()
        elif name == "__getitem__" and len(args) > 1:
            idx = args[1] if isinstance(args[1], tuple) else (args[1],)
            for i in idx:
                if isinstance(i, torch.Tensor) and i.dtype == torch.bool:
                    _refuse("boolean-mask indexing")
                if isinstance(i, (np.ndarray, list)):
                    _refuse("indexing a device tensor with a host array")
        elif name == "__setitem__" and len(args) > 1:
            idx = args[1] if isinstance(args[1], tuple) else (args[1],)
            for i in idx:
                if isinstance(i, torch.Tensor) and i.dtype == torch.bool:
                    _refuse("boolean-mask assignment")
        return super().__torch_function__(func, types, args, kwargs)


def strict(t: torch.Tensor) -> StrictTensor:
    """``t`` as a StrictTensor (shares memory)."""
    return t.as_subclass(StrictTensor)  # type: ignore[return-value]


def host(x: Any) -> Any:
    """A test's own look at device data: numpy, allowed for StrictTensors."""
    if isinstance(x, torch.Tensor):
        return x.as_subclass(torch.Tensor).detach().cpu().numpy()
    return np.asarray(x)


class StrictBackend(TorchBackend):
    """Torch storage on the CPU whose arrays refuse host conversions (test only)."""

    def allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return strict(super().allocate(name, shape, dtype))

    def resize(self, name: str, array: Any, length: int) -> Any:
        return strict(super().resize(name, array, length))

    def allocate_fields(self, fields: dict[str, tuple[tuple[int, ...], np.dtype[Any]]]
                        ) -> dict[str, Any]:
        """The packed data fields refuse host conversions too (not only the side store)."""
        return {k: strict(v) for k, v in super().allocate_fields(fields).items()}
