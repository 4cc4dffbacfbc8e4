"""The torch device of a front end, written once: checked when it is given, resolved
to where batches go when the first batch is made.

A front end takes its reference library's ``device`` argument (a string such as
``"cuda:0"``, a ``torch.device`` or None) and

* checks it when it is given (:func:`checked_device`): torch must know it, and, where
  the library documents the device as where the data lives (velora, ``src.buffers``),
  this machine must have it (:func:`replaybank.batch.torch_device`); pytorchrl only
  places batches there, so its check is torch's parse alone (``available=False``);
* resolves it to where tensors go (:func:`batch_device`): None for the host (no device
  or the CPU: ``torch.from_numpy`` serves, no copy), else a ``torch.device``.

torch is imported only for a device that is not None.

Example:
    >>> import torch
    >>> checked_device("cpu"), checked_device(None)
    (device(type='cpu'), None)
    >>> batch_device(torch, "cpu") is None, batch_device(torch, "cuda:0")
    (True, device(type='cuda', index=0))
"""

from __future__ import annotations

from typing import Any

from replaybank.batch import torch_device
from replaybank.errors import ConfigError, describe, require_extra

__all__ = ["batch_device", "checked_device"]


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
    torch = require_extra("torch", "torch")
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
