"""Torch storage: the step table's field arrays as preallocated tensors on a device.

Bookkeeping (lane counters, next-observation links) stays in numpy on the host, and so
does all index arithmetic; only the index arrays of a gather or write travel to the
device. Sampling from a buffer with ``storage="torch"`` therefore gathers on the device
and returns tensors, with no host round trip of field data.

Example:
    >>> import numpy as np
    >>> be = TorchBackend("cpu")
    >>> a = be.allocate("obs", (4, 1, 3), np.dtype("float32"))
    >>> be.write(a, (np.array([0]), np.array([0])), np.ones((1, 3), np.float32))
    >>> out = be.gather(a, (np.array([0, 1]), np.array([0, 0])))
    >>> type(out).__name__, tuple(out.shape), float(out.sum())
    ('Tensor', (2, 3), 3.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.batch import storage_device
from replaybank.errors import CapacityError, ConfigError, DtypeError, require_extra
from replaybank.host import as_numpy

__all__ = ["TorchBackend", "torch_backend", "torch_dtype"]


def _torch() -> Any:
    return require_extra("torch", "torch")


def torch_dtype(dtype: Any) -> Any:
    """The torch dtype that stores numpy ``dtype`` bit for bit.

    Args:
        dtype: A numpy dtype (or anything ``np.dtype`` accepts).

    Returns:
        The matching ``torch.dtype``.

    Raises:
        DtypeError: The dtype has no torch equivalent (strings, records, objects).

    Example:
        >>> torch_dtype("uint8")
        torch.uint8
    """
    torch = _torch()
    dt = np.dtype(dtype)
    if dt.kind not in "biufc":
        raise DtypeError(
            f"dtype={dt}: torch storage holds bool, integer, float and complex fields only; "
            'store this field with storage="numpy" or encode it as numbers'
        )
    try:
        return torch.from_numpy(np.zeros(0, dtype=dt.newbyteorder("="))).dtype
    except TypeError as exc:
        raise DtypeError(f"dtype={dt}: torch {torch.__version__} has no such dtype") from exc


class TorchBackend:
    """Field arrays as preallocated torch tensors on ``device``.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device`` or None (CPU).
        draws: ``"device"`` (default): one-step samples take the device path
            (:mod:`replaybank.device.path`: keys drawn on the host as numpy storage draws
            them, one packed copy, one gather per dtype group), and ``sample_fn`` draws
            on the device with a generator of its own inside a CUDA graph (the same
            distribution as numpy storage, not the same keys); ``"host"``: no device path
            (every sample gathers field by field on the device; ``sample_fn`` is refused).
            Either way an eager sample is numpy storage's under the same seed.

    Raises:
        ConfigError: The device is malformed, not available (e.g. CUDA without a GPU) or
            holds no data (``"meta"``: :func:`~replaybank.batch.storage_device`), or
            ``draws`` is neither ``"device"`` nor ``"host"``.
        MissingDependencyError: torch is not installed.

    Example:
        >>> import numpy as np
        >>> import replaybank as rb
        >>> buf = rb.ReplayBuffer(8, storage="torch", device="cpu", seed=0)
        >>> buf.add(obs=np.zeros(2, np.float32), action=1, reward=1.0,
        ...         next_obs=np.ones(2, np.float32), terminated=False, truncated=False)
        >>> batch = buf.sample(2)
        >>> type(batch.next_obs).__name__, batch.next_obs.device.type
        ('Tensor', 'cpu')
    """

    name = "torch"
    host_numpy = False
    durable = False

    def __init__(self, device: Any = None, draws: str = "device") -> None:
        if draws not in ("device", "host"):
            raise ConfigError(f"TorchBackend(draws={draws!r}): choose 'device' (the device "
                              "path, and sample_fn's draws on the device) or 'host' (no "
                              "device path)")
        #: Buffers take the device path (see ``draws``).
        self.device_draws = draws == "device"
        torch = _torch()
        dev = storage_device(torch, device)  # refuses a device without data (meta)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.torch = torch
        self.device = dev

    def __getstate__(self) -> dict[str, Any]:
        """Pickle support: the device, not the torch module (imported again)."""
        state = self.__dict__.copy()
        del state["torch"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.torch = _torch()

    # ------------------------------------------------------------------ helpers
    def _index(self, index: Any) -> Any:
        """numpy index (array, slice, tuple of those) -> the same on the device."""
        if isinstance(index, tuple):
            return tuple(self._index(i) for i in index)
        if isinstance(index, np.ndarray):
            idx = np.ascontiguousarray(index, dtype=np.int64)
            if not idx.flags.writeable:  # torch wraps writeable memory only
                idx = idx.copy()
            return self.torch.from_numpy(idx).to(self.device, non_blocking=True)
        return index

    def _flat_index(self, rows: np.ndarray[Any, Any], lanes: np.ndarray[Any, Any],
                    width: int) -> Any:
        """Device tensor of ``rows * width + lanes`` (flattened)."""
        flat = (np.asarray(rows, dtype=np.int64) * width
                + np.asarray(lanes, dtype=np.int64)).reshape(-1)
        return self._index(np.ascontiguousarray(flat))

    def _values(self, values: Any) -> Any:
        if isinstance(values, self.torch.Tensor):
            if values.device == self.device:  # device data stays where it is
                return values
            return values.to(self.device, non_blocking=True)
        arr = np.asarray(values)
        if not arr.flags.writeable or not arr.flags.c_contiguous or arr.dtype.byteorder == ">":
            arr = np.array(arr, dtype=arr.dtype.newbyteorder("="), order="C")
        return self.torch.from_numpy(arr).to(self.device, non_blocking=True)

    def _check_cuda_memory(self, nbytes: int, what: str) -> None:
        if self.device.type != "cuda":
            return
        free, _total = self.torch.cuda.mem_get_info(self.device)
        if nbytes > free:
            raise CapacityError(
                f"{what} needs {nbytes:,} bytes ({nbytes / 2**30:.2f} GiB) on {self.device} but "
                f"only {free:,} bytes ({free / 2**30:.2f} GiB) are free; lower capacity or "
                "use storage='numpy'"
            )

    # ------------------------------------------------------------------ protocol
    def allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """Return a zero-filled tensor ``shape`` on the device."""
        tdt = torch_dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        self._check_cuda_memory(nbytes, f"field {name!r} {shape}")
        return self.torch.zeros(shape, dtype=tdt, device=self.device)

    def allocate_fields(self, fields: dict[str, tuple[tuple[int, ...], np.dtype[Any]]]
                        ) -> dict[str, Any]:
        """Zero-filled tensors for the data fields ``{name: ([T, lanes, *shape], dtype)}``,
        the fields of one dtype packed: one ``[T, lanes, width]`` tensor per dtype (width
        the sum of the fields' flat sizes) and a view ``[T, lanes, *shape]`` of its columns
        per field, so that a sample reads a dtype group with one gather
        (:func:`field_groups` finds the groups again). A dtype with one field gets a
        tensor of its own, as :meth:`allocate` does. The dict lists the fields in the
        order of ``fields``."""
        torch = self.torch
        by_dtype: dict[Any, list[str]] = {}
        for name, (_shape, dtype) in fields.items():
            by_dtype.setdefault(torch_dtype(dtype), []).append(name)
        total = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
                    for shape, dt in fields.values())
        self._check_cuda_memory(total, f"{len(fields)} fields")
        out: dict[str, Any] = {}
        for tdt, names in by_dtype.items():
            widths = [int(np.prod(fields[n][0][2:], dtype=np.int64)) for n in names]
            if len(names) == 1 or 0 in widths:
                for n in names:
                    out[n] = torch.zeros(fields[n][0], dtype=tdt, device=self.device)
                continue
            T, lanes = fields[names[0]][0][:2]  # noqa: N806
            packed = torch.zeros((T, lanes, sum(widths)), dtype=tdt, device=self.device)
            off = 0
            for n, w in zip(names, widths, strict=True):
                shape = fields[n][0]
                out[n] = packed[:, :, off] if len(shape) == 2 else \
                    packed[:, :, off:off + w].view(shape)
                off += w
        # in the order given (the spec's), not grouped by dtype: the table's fields, and
        # so a batch's keys, are in the same order whatever the storage
        return {n: out[n] for n in fields}

    def allocate_meta(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """Bookkeeping stays in host numpy (index math never leaves the CPU)."""
        return np.zeros(shape, dtype=dtype)

    def resize(self, name: str, array: Any, length: int) -> Any:
        """Return ``array`` grown along axis 0 to ``length`` (content kept)."""
        out = self.torch.zeros((length, *array.shape[1:]), dtype=array.dtype,
                               device=self.device)
        out[: array.shape[0]] = array
        return out

    def write(self, array: Any, index: Any, values: npt.NDArray[Any] | Any) -> None:
        """``array[index] = values`` (numpy or tensor values; numpy index arrays)."""
        array[self._index(index)] = self._values(values)

    def index(self, index: npt.NDArray[np.int64]) -> Any:
        """``index`` as an int64 tensor on the device (one host-to-device copy), which
        :meth:`gather` and :meth:`write` take as it is."""
        return self._index(index)

    def gather(self, array: Any, index: Any) -> Any:
        """Return ``array[index]`` as a new tensor on the device.

        A ``(rows, lanes)`` pair is turned into flat slots ``rows * lanes_dim + lane`` on
        the host and gathered with one ``index_select`` on the device.
        """
        if isinstance(index, tuple) and len(index) == 2 and array.dim() >= 2 \
                and isinstance(index[0], np.ndarray) and isinstance(index[1], np.ndarray):
            rows, lanes = index
            lead = np.broadcast_shapes(rows.shape, lanes.shape)
            base = array.reshape(array.shape[0] * array.shape[1], *array.shape[2:])
            return base.index_select(0, self._flat_index(rows, lanes, int(array.shape[1]))) \
                .reshape(*lead, *array.shape[2:])
        if isinstance(index, (np.ndarray, self.torch.Tensor)) and index.ndim == 1:
            return array.index_select(0, self._index(index))
        return array[self._index(index)]

    def to_numpy(self, array: Any) -> npt.NDArray[Any]:
        """Host numpy copy of a tensor (a zero-copy view for CPU tensors)."""
        return as_numpy(array)

    def flush(self) -> None:
        """Wait for queued device work (writes are asynchronous on CUDA)."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def requires_memory(self) -> bool:
        """CPU tensors take host RAM; CUDA tensors are checked against GPU memory."""
        return bool(self.device.type == "cpu")

    def __repr__(self) -> str:
        draws = "" if self.device_draws else ", draws='host'"
        return f"TorchBackend(device={str(self.device)!r}{draws})"


def torch_backend(path: Any, device: Any) -> TorchBackend:
    """The backend of ``storage="torch"`` (registered by the package; ``path`` is unused).

    Example:
        >>> torch_backend(None, "cpu").device.type
        'cpu'
    """
    return TorchBackend(device)
