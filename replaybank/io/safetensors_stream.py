"""Streaming reader and writer of the safetensors file format.

The format (https://huggingface.co/docs/safetensors) is an 8-byte little-endian header
length ``n``, ``n`` bytes of JSON header ``{name: {"dtype", "shape", "data_offsets"},
"__metadata__": {str: str}}`` and the raw little-endian tensor bytes. The ``safetensors``
package's ``save_file`` builds the whole file in memory; checkpoints of buffers larger
than a few GiB must not, so this module writes arrays chunk by chunk (computing a CRC-32
of each on the way) and reads them back chunk by chunk with ``os.pread``. Files written
here open with ``safetensors.safe_open``.

Arrays whose dtype safetensors has no code for (structured, complex, big-endian, ...)
are stored as raw ``U8`` bytes; the caller records their numpy dtype and shape.

Example:
    >>> import io, numpy as np
    >>> arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3)}
    >>> plan = plan_tensors(arrays)
    >>> plan["a"].code, plan["a"].offsets
    ('F32', (0, 24))
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError

__all__ = ["CHUNK_BYTES", "StateFile", "TensorPlan", "iter_chunks", "plan_tensors",
           "write_bytes", "write_safetensors"]

CHUNK_BYTES = 16 << 20
"""Bytes copied per chunk while streaming (bounds the extra memory of save and load)."""

_CODES = {"f8": "F64", "f4": "F32", "f2": "F16", "i8": "I64", "i4": "I32", "i2": "I16",
          "i1": "I8", "u8": "U64", "u4": "U32", "u2": "U16", "u1": "U8", "b1": "BOOL"}
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
             "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}


def st_code(dtype: np.dtype[Any]) -> str | None:
    """safetensors dtype code of a numpy dtype, or None when it has none."""
    if dtype.names is not None or dtype.subdtype is not None or dtype.str[0] not in "<|":
        return None
    return _CODES.get(f"{dtype.kind}{dtype.itemsize}")


@dataclass(frozen=True)
class TensorPlan:
    """Where one array goes in the file.

    Attributes:
        code: safetensors dtype code (``"U8"`` for raw bytes).
        shape: Shape written in the header (``[nbytes]`` for raw bytes).
        offsets: ``(begin, end)`` byte offsets relative to the data section.
    """

    code: str
    shape: tuple[int, ...]
    offsets: tuple[int, int]


def plan_tensors(arrays: Mapping[str, npt.NDArray[Any]]) -> dict[str, TensorPlan]:
    """Lay out arrays one after the other (in the given order).

    Example:
        >>> p = plan_tensors({"x": np.zeros(2, np.int64), "y": np.zeros((), "c16")})
        >>> p["y"]
        TensorPlan(code='U8', shape=(16,), offsets=(16, 32))
    """
    out: dict[str, TensorPlan] = {}
    pos = 0
    for name, arr in arrays.items():
        code = st_code(arr.dtype)
        shape = tuple(int(s) for s in arr.shape) if code is not None else (int(arr.nbytes),)
        out[name] = TensorPlan(code or "U8", shape, (pos, pos + int(arr.nbytes)))
        pos += int(arr.nbytes)
    return out


def iter_chunks(arr: npt.NDArray[Any], chunk_bytes: int = CHUNK_BYTES
                ) -> Iterator[npt.NDArray[np.uint8]]:
    """Yield the bytes of ``arr`` (C order) as uint8 arrays of about ``chunk_bytes``.

    Only one chunk is copied at a time (none when ``arr`` is C-contiguous).

    Example:
        >>> [c.size for c in iter_chunks(np.zeros((5, 2), np.int32), chunk_bytes=16)]
        [16, 16, 8]
    """
    if arr.size == 0:
        return
    if arr.flags.c_contiguous:
        flat = arr.reshape(-1).view(np.uint8)
        for i in range(0, flat.size, chunk_bytes):
            yield flat[i:i + chunk_bytes]
        return
    if arr.ndim == 0:  # pragma: no cover - 0-d arrays are always contiguous
        yield np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        return
    row = max(1, arr[0].nbytes)
    step = max(1, chunk_bytes // row)
    for i in range(0, arr.shape[0], step):
        part = np.ascontiguousarray(arr[i:i + step])
        yield from iter_chunks(part, chunk_bytes)


def write_bytes(fh: IO[bytes], data: Any) -> None:
    """Write a buffer to ``fh`` (a module function so tests can make it fail)."""
    fh.write(data)


def _header(plans: Mapping[str, TensorPlan], metadata: Mapping[str, str]) -> bytes:
    head: dict[str, Any] = {"__metadata__": dict(metadata)}
    for name, p in plans.items():
        head[name] = {"dtype": p.code, "shape": list(p.shape), "data_offsets": list(p.offsets)}
    raw = json.dumps(head, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def write_safetensors(
    fh: IO[bytes],
    arrays: Mapping[str, npt.NDArray[Any]],
    metadata: Callable[[Mapping[str, str]], Mapping[str, str]],
    chunk_bytes: int = CHUNK_BYTES,
) -> dict[str, str]:
    """Stream ``arrays`` into an open binary file in safetensors format.

    Args:
        fh: File opened for writing (seekable), positioned at 0.
        arrays: Arrays by name (written in this order).
        metadata: Called with ``{name: crc32 hex}`` (all ``"00000000"`` first, then the
            real values) and returns the header's ``__metadata__``; both calls must give
            the same length of JSON (fixed-width checksums make that so).
        chunk_bytes: Bytes per chunk.

    Returns:
        The CRC-32 of each array's bytes, as 8 hex digits.

    Raises:
        OSError: Writing failed (the caller removes the file).
    """
    plans = plan_tensors(arrays)
    crcs = {name: "00000000" for name in arrays}
    head = _header(plans, metadata(crcs))
    write_bytes(fh, len(head).to_bytes(8, "little"))
    write_bytes(fh, head)
    for name, arr in arrays.items():
        crc = 0
        for chunk in iter_chunks(arr, chunk_bytes):
            crc = zlib.crc32(memoryview(chunk), crc)  # type: ignore[arg-type]
            write_bytes(fh, chunk)
        crcs[name] = f"{crc:08x}"
    final = _header(plans, metadata(crcs))
    if len(final) != len(head):  # pragma: no cover - guarded by fixed-width checksums
        raise CheckpointError("internal error: safetensors header changed length")
    fh.flush()
    fh.seek(8)
    write_bytes(fh, final)
    fh.flush()
    return crcs


class StateFile:
    """A safetensors file opened for chunked, validated reads.

    Args:
        path: The file.

    Raises:
        CheckpointError: Missing file, a header that is not safetensors, offsets outside
            the file, or a truncated file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise CheckpointError(f"cannot open state file {self.path}: {exc.strerror}") \
                from exc
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    def _parse(self) -> None:
        size = os.fstat(self._fd).st_size
        first = os.pread(self._fd, 8, 0)
        if len(first) < 8:
            raise CheckpointError(f"state file {self.path} is truncated ({size} bytes): "
                                  "no safetensors header")
        n = int.from_bytes(first, "little")
        if n > size - 8 or n > 1 << 30:
            raise CheckpointError(
                f"state file {self.path}: header length {n} does not fit in the file "
                f"({size} bytes); the file is truncated or not a safetensors file"
            )
        try:
            header = json.loads(os.pread(self._fd, n, 8))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"state file {self.path}: header is not valid JSON "
                                  f"({exc}); the file is corrupt") from exc
        if not isinstance(header, dict):
            raise CheckpointError(f"state file {self.path}: header is not a JSON object")
        meta = header.pop("__metadata__", None) or {}
        self.metadata: dict[str, str] = meta if isinstance(meta, dict) else {}
        self.data_start = 8 + n
        end = 0
        self.entries: dict[str, dict[str, Any]] = {}
        for name, e in header.items():
            try:
                b, e_ = (int(x) for x in e["data_offsets"])
                shape = [int(s) for s in e["shape"]]
                code = str(e["dtype"])
            except (KeyError, TypeError, ValueError) as exc:
                raise CheckpointError(f"state file {self.path}: bad header entry for "
                                      f"{name!r}; the file is corrupt") from exc
            expect = int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE.get(code, 0)
            if e_ - b != expect or b < 0:
                raise CheckpointError(f"state file {self.path}: tensor {name!r} has "
                                      f"{e_ - b} bytes but shape {shape} {code} needs {expect}")
            self.entries[name] = {"dtype": code, "shape": shape, "offsets": (b, e_)}
            end = max(end, e_)
        if size != self.data_start + end:
            raise CheckpointError(
                f"state file {self.path} is truncated or has trailing bytes: the header "
                f"describes {self.data_start + end} bytes, the file has {size}; the save "
                "did not finish or the file was damaged"
            )
        self.size = size

    def close(self) -> None:
        """Close the file descriptor."""
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> StateFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def read_into(self, name: str, start: int, out: npt.NDArray[Any]) -> None:
        """Fill ``out`` (C-contiguous) with ``out.nbytes`` bytes of tensor ``name`` from
        byte ``start`` of the tensor."""
        b, e = self.entries[name]["offsets"]
        nbytes = int(out.nbytes)
        if start < 0 or b + start + nbytes > e:
            raise CheckpointError(f"read past the end of tensor {name!r}")
        view = memoryview(out.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        pos, done = self.data_start + b + start, 0
        while done < nbytes:
            got = os.preadv(self._fd, [view[done:]], pos + done)
            if got <= 0:
                raise CheckpointError(f"state file {self.path}: unexpected end of file")
            done += got

    def crc32(self, name: str, chunk_bytes: int = CHUNK_BYTES) -> str:
        """CRC-32 (8 hex digits) of tensor ``name``, read in chunks."""
        b, e = self.entries[name]["offsets"]
        buf = np.empty(min(chunk_bytes, max(e - b, 1)), dtype=np.uint8)
        crc, pos = 0, 0
        while pos < e - b:
            part = buf[: min(len(buf), e - b - pos)]
            self.read_into(name, pos, part)
            crc = zlib.crc32(memoryview(part), crc)  # type: ignore[arg-type]
            pos += len(part)
        return f"{crc:08x}"
