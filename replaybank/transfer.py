"""Host arrays to a device in one copy: a batch's fields packed into one byte buffer.

A batch sampled from host storage holds one numpy array per field (obs, action, reward,
next_obs, the two flags, indices: seven or more). Moving each with its own
``Tensor.to(device)`` costs one copy call per field, and on a GPU the call costs more
than the copy: 13 to 20 us of host time each on the H200 machine of
``docs/benchmarks.md``, for rows of a few hundred bytes. :class:`PackedLayout` places
the fields at aligned offsets of one ``uint8`` buffer; the host packs every array into
its place (numpy copies, which also turn a big-endian or strided array into a native,
contiguous one), one ``Tensor.to`` moves the whole buffer, and :meth:`PackedLayout.unpack`
hands out each field as a typed view of the copy: ``[B, *shape]`` tensors of the arrays'
dtypes, sharing one device allocation.

* Offsets are multiples of :data:`ALIGN` bytes, so each field starts aligned for any dtype
  and for vectorised loads.
* A dtype torch has no twin for (strings, objects, datetimes) has no layout:
  :meth:`PackedLayout.of` returns None and the caller copies field by field.
* :func:`to_device` is the whole round trip for one batch (``Batch.to_torch``);
  :class:`StagingBuffer` keeps a pinned buffer to pack into again and again (the
  prefetcher of :mod:`replaybank.device.prefetch` has one per staging set,
  ``PinnedStager`` of :mod:`replaybank.integrations.torch` one).

torch is passed in, never imported here.

Example:
    >>> import numpy as np, torch
    >>> arrays = {"obs": np.arange(6, dtype=np.float32).reshape(3, 2),
    ...           "done": np.array([True, False, True])}
    >>> layout = PackedLayout.of(torch, arrays)
    >>> layout.offsets, layout.nbytes
    ((0, 128), 256)
    >>> out = to_device(torch, arrays, torch.device("cpu"))
    >>> out["obs"].dtype, out["obs"].tolist()[2], out["done"].tolist()
    (torch.float32, [4.0, 5.0], [True, False, True])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["ALIGN", "PackedLayout", "StagingBuffer", "to_device"]

#: Byte alignment of every field's offset in a packed buffer.
ALIGN = 128


class PackedLayout:
    """Where each field of a batch sits in one ``uint8`` buffer.

    Args:
        torch: The torch module.
        fields: ``(name, dtype, shape)`` per field, in order (numpy dtypes, native byte
            order or not; each must have a torch twin).

    Attributes:
        names: The field names, in order.
        dtypes: Their native-order numpy dtypes.
        shapes: Their shapes.
        offsets: Each field's first byte (a multiple of :data:`ALIGN`).
        nbytes: The buffer's length in bytes (a multiple of :data:`ALIGN`).

    Raises:
        TypeError: A dtype has no torch twin (see :meth:`of`, which returns None instead).
    """

    def __init__(self, torch: Any, fields: list[tuple[str, np.dtype[Any], tuple[int, ...]]]
                 ) -> None:
        self.torch = torch
        self.names = tuple(name for name, _, _ in fields)
        self.dtypes = tuple(np.dtype(dt).newbyteorder("=") for _, dt, _ in fields)
        self.shapes = tuple(tuple(int(d) for d in shape) for _, _, shape in fields)
        self._torch_dtypes = tuple(_torch_dtype(torch, dt) for dt in self.dtypes)
        self._sizes = tuple(dt.itemsize * int(np.prod(shape, dtype=np.int64))
                            for dt, shape in zip(self.dtypes, self.shapes, strict=True))
        offsets, end = [], 0
        for size in self._sizes:
            start = -(-end // ALIGN) * ALIGN
            offsets.append(start)
            end = start + size
        self.offsets = tuple(offsets)
        # padded to ALIGN, so the whole buffer views as any field's dtype
        self.nbytes = -(-end // ALIGN) * ALIGN
        # per field: (its dtype's index in _views, element offset, shape, element strides)
        kinds = list(dict.fromkeys(self._torch_dtypes))
        self._views = tuple(kinds)
        self._plan = tuple(
            (kinds.index(tdt), off // dt.itemsize, shape, _contiguous_strides(shape))
            for tdt, off, dt, shape in zip(self._torch_dtypes, self.offsets, self.dtypes,
                                           self.shapes, strict=True))

    @classmethod
    def of(cls, torch: Any, arrays: Mapping[str, Any]) -> PackedLayout | None:
        """The layout of ``arrays`` (numpy arrays), or None when a value is not a numpy
        array or its dtype has no torch twin."""
        fields = []
        for name, arr in arrays.items():
            if not isinstance(arr, np.ndarray) or arr.dtype.hasobject:
                return None
            fields.append((name, arr.dtype, arr.shape))
        key = tuple(fields)
        layout = _LAYOUTS.get(key)
        if layout is None or layout.torch is not torch:
            try:
                layout = cls(torch, fields)
            except TypeError:  # torch.from_numpy refuses the dtype
                return None
            if len(_LAYOUTS) >= _MAX_LAYOUTS:
                _LAYOUTS.clear()
            _LAYOUTS[key] = layout
        return layout

    def fits(self, arrays: Mapping[str, Any]) -> bool:
        """Whether ``arrays`` have this layout's names, dtypes and shapes, in order."""
        if len(arrays) != len(self.names):
            return False
        for (name, arr), own, dt, shape in zip(arrays.items(), self.names, self.dtypes,
                                               self.shapes, strict=True):
            if name != own or not isinstance(arr, np.ndarray) or arr.shape != shape \
                    or arr.dtype.newbyteorder("=") != dt:
                return False
        return True

    def host_buffer(self, pin: bool = False) -> Any:
        """A new ``uint8`` CPU tensor of :attr:`nbytes` (pinned when ``pin`` and CUDA is
        available)."""
        torch = self.torch
        pin = bool(pin and torch.cuda.is_available())
        return torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=pin)

    def pack(self, arrays: Mapping[str, Any], buf: Any) -> None:
        """Copy ``arrays`` (which :meth:`fits`) into the CPU ``uint8`` tensor ``buf``."""
        raw = buf.numpy()
        for arr, off, n, dt, shape in zip(arrays.values(), self.offsets, self._sizes,
                                          self.dtypes, self.shapes, strict=True):
            # "equiv": byte order may differ (a big-endian array lands native), nothing else
            np.copyto(raw[off:off + n].view(dt).reshape(shape), arr, casting="equiv")

    def unpack(self, buf: Any) -> dict[str, Any]:
        """Each field as a typed view ``[*shape]`` of the ``uint8`` tensor ``buf`` (on any
        device): no copy; one ``as_strided`` per field (the cheapest view torch makes)."""
        typed = [buf.view(tdt) for tdt in self._views]
        base = [t.storage_offset() for t in typed]
        return {name: typed[k].as_strided(shape, strides, base[k] + off)
                for name, (k, off, shape, strides) in zip(self.names, self._plan, strict=True)}


#: Layouts by their fields' (name, dtype, shape): a training loop asks for the same few.
_LAYOUTS: dict[tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...], PackedLayout] = {}
_MAX_LAYOUTS = 64
_DTYPES: dict[np.dtype[Any], Any] = {}


def _torch_dtype(torch: Any, dt: np.dtype[Any]) -> Any:
    """The torch twin of the native-order numpy dtype ``dt`` (TypeError when none)."""
    found = _DTYPES.get(dt)
    if found is None:
        found = _DTYPES[dt] = torch.from_numpy(np.empty(0, dt)).dtype
    return found


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major element strides of ``shape`` (``(3, 4)`` -> ``(4, 1)``)."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


class StagingBuffer:
    """A host buffer that batches are packed into, reused while they keep one layout.

    Pinned (``pin`` and CUDA available), the buffer is reused from batch to batch: the
    caller waits until the device copy that read it is done before packing the next
    (an event per buffer). Otherwise every batch gets a new buffer, since nothing says
    when a copy from pageable memory has read it.

    Args:
        torch: The torch module.
        pin: Use pinned host memory (only when CUDA is available).
    """

    def __init__(self, torch: Any, pin: bool) -> None:
        self.torch = torch
        self.pin = bool(pin and torch.cuda.is_available())
        self.layout: PackedLayout | None = None
        self.buf: Any = None

    def pack(self, arrays: Mapping[str, Any]) -> tuple[PackedLayout, Any] | None:
        """``arrays`` packed: ``(layout, uint8 buffer)``, or None when they have no layout
        (a tensor field, a dtype torch lacks)."""
        layout = self.layout
        if layout is None or not layout.fits(arrays):
            layout = PackedLayout.of(self.torch, arrays)
            if layout is None:
                return None
        if self.buf is None or layout is not self.layout or not self.pin:
            self.buf = layout.host_buffer(self.pin)
        self.layout = layout
        layout.pack(arrays, self.buf)
        return layout, self.buf


def to_device(torch: Any, arrays: Mapping[str, Any], device: Any, non_blocking: bool = True,
              pin: bool = False) -> dict[str, Any] | None:
    """``arrays`` (numpy) as tensors on ``device`` through one packed copy.

    Args:
        torch: The torch module.
        arrays: Field name -> numpy array.
        device: A ``torch.device``.
        non_blocking: Passed to the one ``Tensor.to`` (asynchronous from pinned memory).
        pin: Pack into pinned host memory (CUDA only).

    Returns:
        Field name -> tensor on ``device`` (views of one allocation), or None when the
        arrays have no layout (:meth:`PackedLayout.of`).
    """
    layout = PackedLayout.of(torch, arrays)
    if layout is None:
        return None
    buf = layout.host_buffer(pin)
    layout.pack(arrays, buf)
    return layout.unpack(buf.to(device, non_blocking=non_blocking))
