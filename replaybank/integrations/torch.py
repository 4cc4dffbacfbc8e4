"""Torch helpers: fast host-to-device batch transfer through reusable pinned memory.

``Batch.to_torch(device)`` already converts a numpy batch (zero-copy on CPU); with
``pin_memory=True`` it pins a fresh host copy per call. :class:`PinnedStager` keeps
one pinned host buffer per field and reuses it, so each batch costs one memcpy into
pinned memory plus an asynchronous copy to the GPU. Without CUDA it falls back to
plain (zero-copy) tensors.

Example:
    >>> import numpy as np
    >>> from replaybank.batch import Batch
    >>> stager = PinnedStager("cpu")
    >>> out = stager(Batch({"obs": np.ones((2, 3), np.float32)}))
    >>> type(out["obs"]).__name__, stager.pinned
    ('Tensor', False)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybank.device.backend import torch_dtype
from replaybank.errors import require_extra

__all__ = ["PinnedStager"]


class PinnedStager:
    """Move numpy batches to ``device`` through reusable pinned host buffers.

    Args:
        device: Target device (``"cuda"``, ``"cuda:1"``, ``"cpu"``, a ``torch.device``).

    Attributes:
        pinned: Whether pinned staging is in use (CUDA device and CUDA available).

    Example:
        >>> import numpy as np
        >>> from replaybank.batch import Batch
        >>> PinnedStager("cpu")(Batch({"r": np.zeros(4, np.float32)}))["r"].shape
        torch.Size([4])
    """

    def __init__(self, device: Any = "cuda") -> None:
        torch = require_extra("torch", "torch")
        self.torch = torch
        self.device = torch.device(device)
        self.pinned = bool(self.device.type == "cuda" and torch.cuda.is_available())
        self._host: dict[str, Any] = {}
        self._event: Any = None

    def _staging(self, name: str, arr: np.ndarray[Any, Any]) -> Any:
        buf = self._host.get(name)
        tdt = torch_dtype(arr.dtype)
        if buf is None or tuple(buf.shape) != arr.shape or buf.dtype != tdt:
            buf = self.torch.empty(arr.shape, dtype=tdt, pin_memory=True)
            self._host[name] = buf
        return buf

    def __call__(self, batch: Any) -> Any:
        """Return a container of the same type with every field as a tensor on the device."""
        torch = self.torch
        if self._event is not None:
            self._event.synchronize()  # the previous copies have read the pinned buffers
        out: dict[str, Any] = {}
        for name, value in batch.items():
            if isinstance(value, torch.Tensor):
                out[name] = value.to(self.device, non_blocking=True)
                continue
            arr = np.asarray(value)
            if not self.pinned:
                if not arr.flags.writeable or not arr.flags.c_contiguous:
                    arr = np.array(arr, order="C")
                out[name] = torch.from_numpy(arr).to(self.device)
                continue
            host = self._staging(name, arr)
            host.numpy()[...] = arr
            out[name] = host.to(self.device, non_blocking=True)
        if self.pinned:
            self._event = torch.cuda.Event()
            self._event.record()
        return type(batch)(out)
