"""Torch helpers: fast host-to-device batch transfer through reusable pinned memory.

``Batch.to_torch(device)`` already converts a numpy batch (zero-copy on CPU, one packed
copy to another device); with ``pin_memory=True`` it packs into fresh pinned memory per
call. :class:`PinnedStager` keeps one pinned host buffer
(:class:`~replaybank.transfer.StagingBuffer`) and reuses it, so each batch costs the
memcpys that pack its fields into pinned memory plus one asynchronous copy to the GPU.
For the CPU it wraps the arrays as tensors without a copy.

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

from replaybank.errors import require_extra
from replaybank.transfer import StagingBuffer

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
        self._staging = StagingBuffer(torch, self.pinned)
        self._event: Any = None

    def __call__(self, batch: Any) -> Any:
        """Return a container of the same type with every field as a tensor on the device."""
        torch = self.torch
        if self._event is not None:
            self._event.synchronize()  # the previous copy has read the pinned buffer
        packed = self._staging.pack(batch) if self.device.type != "cpu" else None
        if packed is not None:  # every field numpy: one copy, a view per field
            layout, buf = packed
            out = layout.unpack(buf.to(self.device, non_blocking=True))
        else:
            out = {}
            for name, value in batch.items():
                if isinstance(value, torch.Tensor):
                    out[name] = value.to(self.device, non_blocking=True)
                    continue
                arr = np.asarray(value)
                if not arr.flags.writeable or not arr.flags.c_contiguous \
                        or arr.dtype.byteorder == ">":
                    arr = np.array(arr, order="C", dtype=arr.dtype.newbyteorder("="))
                out[name] = torch.from_numpy(arr).to(self.device)
        if self.pinned and packed is not None:  # pragma: no cover - needs CUDA
            self._event = torch.cuda.Event()
            self._event.record()
        return type(batch)(out)
