"""The torch device of a front end, written once: checked when it is given, resolved
to where batches go when the first batch is made.

A front end takes its reference library's ``device`` argument (a string such as
``"cuda:0"``, a ``torch.device`` or None) and

* checks it when it is given (:func:`checked_device`): torch must know it, and, where
  the library documents the device as where the data lives (velora, ``src.buffers``),
  this machine must have it (:func:`replaybank.batch.torch_device`); pytorchrl only
  places batches there, so its check is torch's parse alone (``available=False``);
* resolves it to where tensors go (:func:`batch_device`): None for the host (no device
  or the CPU: ``torch.from_numpy`` serves, no copy), else a ``torch.device``;
* turns a batch of numpy arrays into tensors there (:class:`BatchTensors`: torch and the
  device resolved once, at the first batch).

torch is imported only for a device that is not None, or at the first batch.

Example:
    >>> import numpy as np, torch
    >>> checked_device("cpu"), checked_device(None)
    (device(type='cpu'), None)
    >>> batch_device(torch, "cpu") is None, batch_device(torch, "cuda:0")
    (True, device(type='cuda', index=0))
    >>> BatchTensors("cpu")({"obs": np.zeros((2, 3), np.float32)})["obs"].shape
    torch.Size([2, 3])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replaybank.batch import torch_device
from replaybank.errors import ConfigError, describe, require_extra

__all__ = ["BatchTensors", "batch_device", "checked_device", "torch_module"]


def torch_module() -> Any:
    """The torch module, or the ImportError that names ``pip install "replaybank[torch]"``."""
    return require_extra("torch", "torch")


def checked_device(device: Any, call: str | None = None, name: str = "device", *,
                   available: bool = True) -> Any:
    """``device`` as a ``torch.device``, checked; None stays None (no torch import).

    Args:
        device: What the caller passed (``"cpu"``, ``"cuda:1"``, a ``torch.device``, None).
        call: The call to name in an error (``"ReplayBuffer"``), or None.
        name: The argument's name (or a longer label), for the message.
        available: Also require the device on this machine (CUDA, MPS present).

    Returns:
        The ``torch.device``, or None.

    Raises:
        ConfigError: torch does not know ``device`` or, with ``available``, this machine
            lacks it.

    Example:
        >>> checked_device("cuda", available=False)  # parsed, not looked for
        device(type='cuda')
        >>> try:
        ...     checked_device("gpu", "ReplayBuffer", available=False)
        ... except ConfigError as exc:
        ...     print(str(exc)[:48], "...", str(exc)[-22:])
        ReplayBuffer(device='gpu'): not a torch device ( ... pass e.g. device='cpu'
    """
    if device is None:
        return None
    torch = torch_module()
    if available:  # torch_device names the argument ``device``
        return torch_device(torch, device, call)
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        site = f"{name}={describe(device)}"
        raise ConfigError(f"{site if call is None else f'{call}({site})'}: not a torch "
                          f"device ({exc}); pass e.g. device='cpu'") from None


def batch_device(torch: Any, device: Any, default_cuda: bool = False) -> Any:
    """Where a front end's tensors go: None for the host (``device`` None or a CPU,
    where ``torch.from_numpy`` serves), else ``device`` as a ``torch.device``.

    Args:
        torch: The torch module.
        device: A checked device (see :func:`checked_device`) or None.
        default_cuda: For ``device=None``, the GPU when CUDA is available (``src``'s SAC
            buffer), else the host.

    Example:
        >>> import torch
        >>> batch_device(torch, None), batch_device(torch, torch.device("cpu", 0))
        (None, None)
    """
    if device is None:
        if not (default_cuda and torch.cuda.is_available()):
            return None
        device = "cuda"
    dev = torch.device(device)
    return None if dev.type == "cpu" else dev


class BatchTensors:
    """A front end's batches as torch tensors on its device: numpy arrays in, tensors out.

    torch and the device (:func:`batch_device`) are resolved at the first batch, once.

    Args:
        device: A checked device (see :func:`checked_device`) or None.
        default_cuda: As :func:`batch_device`.

    Example:
        >>> import numpy as np
        >>> a = np.ones(2, np.float32)
        >>> to_tensors = BatchTensors(None)
        >>> to_tensors({"x": a})["x"].data_ptr() == a.ctypes.data  # the host: no copy
        True
        >>> to_tensors({"x": a}, copy=True)["x"].data_ptr() == a.ctypes.data
        False
    """

    def __init__(self, device: Any, default_cuda: bool = False) -> None:
        self.device = device
        self.default_cuda = default_cuda
        self._resolved: tuple[Any, Any] | None = None  # (torch.from_numpy, device or None)

    def __call__(self, arrays: Mapping[str, Any], copy: bool = False) -> dict[str, Any]:
        """``{key: tensor}`` of ``{key: array}``: shared with the array on the host
        (``copy``: a copy), else copied to the device."""
        if self._resolved is None:
            torch = torch_module()
            self._resolved = (torch.from_numpy,
                              batch_device(torch, self.device, self.default_cuda))
        from_numpy, device = self._resolved
        if device is None:
            return {k: from_numpy(a.copy() if copy else a) for k, a in arrays.items()}
        return {k: from_numpy(a).to(device, copy=copy) for k, a in arrays.items()}
