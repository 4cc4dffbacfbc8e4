"""Disk-backed storage: every array in a ``numpy.memmap`` file, so capacity can exceed RAM.

``ReplayBuffer(capacity=..., storage="memmap", path="run/replay")`` keeps each field,
the side store of final observations and the bookkeeping (lane counters, links) in
files under ``path``, plus a small JSON manifest (``replaybank_memmap.json``: array
names, dtypes and row shapes, and the config of the owning buffer). Writes go straight
to the page cache through the mappings; the step table's write order (evictions leave
``counts`` first, then data and links are written, then counters advance) means the
files describe a consistent buffer at every instant, so a process killed (even with
SIGKILL) between or during adds loses nothing that an earlier add completed. Call
:meth:`MemmapBackend.flush` to survive an OS crash too.

``rb.open(path)`` (:func:`replaybank.persist.open`) reopens the files in a new process and
continues where the old one stopped, rebuilding the buffer from the owner record the buffer
keeps in the manifest (the backend never reads it). Generator and sampler state (e.g. PER
priorities) live in memory: ``buf.flush()`` saves them next to the files
(:mod:`replaybank.persist`), and a reopened buffer restores them when the files still
hold exactly the steps they held at that flush, so it draws the identical next sample.
Without such a flush (or with steps added after it) a reopened buffer starts a fresh
generator (from the config seed) and gives every live step the sampler's default state
(e.g. the running max priority).

Example:
    >>> import tempfile, numpy as np
    >>> import replaybank as rb
    >>> d = tempfile.mkdtemp()
    >>> buf = rb.ReplayBuffer(capacity=64, storage="memmap", path=d, seed=0)
    >>> for t in range(5):
    ...     buf.add(obs=np.full(2, t, np.float32), action=t, reward=1.0,
    ...             next_obs=np.full(2, t + 1, np.float32), terminated=False, truncated=False)
    >>> again = rb.open(d)
    >>> len(again), again.sample(2).obs.shape
    (5, (2, 2))
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError, ConfigError

__all__ = ["MANIFEST", "RESUME_PREFIX", "MemmapBackend"]

MANIFEST = "replaybank_memmap.json"
#: File name prefix of the generator/sampler state that ``flush()`` saves
#: (:mod:`replaybank.io.resume`); removed with the buffer's files.
RESUME_PREFIX = "replaybank_resume_"
_FORMAT = "replaybank.memmap"
_VERSION = 1


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class MemmapBackend:
    """Arrays in ``numpy.memmap`` files under a directory.

    Args:
        path: Directory for the files (created when missing).
        reopen: Map the existing files of a buffer at ``path`` instead of creating new
            ones (what :func:`replaybank.persist.open` does).
        overwrite: Replace a buffer that already exists at ``path``.

    Raises:
        ConfigError: ``path`` already holds a buffer (and neither ``reopen`` nor
            ``overwrite`` was given).
        CheckpointError: ``reopen`` and there is no buffer at ``path``, or its files do
            not match the manifest.

    Example:
        >>> import tempfile
        >>> be = MemmapBackend(tempfile.mkdtemp())
        >>> a = be.allocate("obs", (4, 1, 3), np.dtype("float32"))
        >>> be.write(a, (np.array([1]), np.array([0])), np.ones((1, 3), np.float32))
        >>> float(be.gather(a, (np.array([0, 1]), np.array([0, 0]))).sum())
        3.0
    """

    name = "memmap"
    host_numpy = True
    durable = True

    def __init__(self, path: Any, reopen: bool = False, overwrite: bool = False) -> None:
        self.path = Path(os.fspath(path))
        self.reopen = bool(reopen)
        self._maps: dict[str, np.memmap[Any, Any]] = {}
        manifest = self.path / MANIFEST
        if reopen:
            try:
                data = json.loads(manifest.read_text())
            except FileNotFoundError as exc:
                raise CheckpointError(f"no memmap buffer at {self.path}: {MANIFEST} is "
                                      "missing; check the path") from exc
            except (OSError, json.JSONDecodeError) as exc:
                raise CheckpointError(f"{manifest} cannot be read ({exc})") from exc
            if not isinstance(data, dict) or data.get("format") != _FORMAT:
                raise CheckpointError(f"{manifest} is not a replaybank memmap manifest")
            if data.get("version", 0) > _VERSION:
                raise CheckpointError(f"{manifest}: version {data.get('version')} was written "
                                      "by a newer replaybank; upgrade replaybank")
            self.manifest: dict[str, Any] = data
            return
        if manifest.exists():
            if not overwrite:
                raise ConfigError(
                    f"path={str(self.path)!r} already holds a replaybank memmap buffer; reopen "
                    "it with ReplayBuffer.open(path), choose an empty directory, or pass "
                    "MemmapBackend(path, overwrite=True) to replace it"
                )
            self._remove_files()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"path={str(self.path)!r}: cannot create the directory ({exc})") \
                from exc
        self.manifest = {"format": _FORMAT, "version": _VERSION, "arrays": {}, "config": None,
                         "buffer_id": uuid.uuid4().hex}
        self._save_manifest()

    # ------------------------------------------------------------------ files
    def _remove_files(self) -> None:
        try:
            old = json.loads((self.path / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError):
            old = {}
        for entry in (old.get("arrays") or {}).values():
            with contextlib.suppress(OSError, TypeError):
                (self.path / entry["file"]).unlink()
        with contextlib.suppress(OSError):
            (self.path / MANIFEST).unlink()
        for stale in self.path.glob(RESUME_PREFIX + "*"):  # the old buffer's resume state
            with contextlib.suppress(OSError):
                stale.unlink()

    @property
    def buffer_id(self) -> str:
        """A random id of the buffer in these files, made at creation (and recorded on
        first use for files written before ids existed): resume state names it."""
        bid = self.manifest.get("buffer_id")
        if not isinstance(bid, str):
            bid = self.manifest["buffer_id"] = uuid.uuid4().hex
            self._save_manifest()
        return bid

    def _save_manifest(self) -> None:
        _write_json_atomic(self.path / MANIFEST, self.manifest)

    @staticmethod
    def _file(name: str) -> str:
        return quote(name, safe="") + ".bin"

    def _open(self, name: str, rows: int, row_shape: tuple[int, ...],
              dtype: np.dtype[Any], create: bool) -> npt.NDArray[Any]:
        file = self.path / self._file(name)
        shape = (rows, *row_shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if create:
            with open(file, "wb") as fh:
                fh.truncate(nbytes)  # sparse: disk blocks are used as data arrives
        if nbytes == 0:
            return np.zeros(shape, dtype=dtype)
        mm: np.memmap[Any, Any] = np.memmap(file, dtype=dtype, mode="r+", shape=shape)
        self._maps[name] = mm
        return mm.view(np.ndarray)

    def _array(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any],
               growable: bool) -> npt.NDArray[Any]:
        dtype = np.dtype(dtype)
        entry: dict[str, Any] = {
            "file": self._file(name), "dtype": np.lib.format.dtype_to_descr(dtype),
            "row_shape": list(shape[1:]), "rows": int(shape[0]) if shape else 0,
            "growable": growable}
        if not shape:
            raise ConfigError(f"memmap array {name!r}: 0-d arrays are not supported")
        if self.reopen:
            old = self.manifest["arrays"].get(name)
            if old is None or old["dtype"] != entry["dtype"] or \
                    old["row_shape"] != entry["row_shape"]:
                raise CheckpointError(
                    f"{self.path}: array {name!r} on disk is {old} but the buffer needs "
                    f"{entry}; the files belong to a different buffer"
                )
            rows = int(shape[0])
            if growable:  # the side store grows; its file size is the truth
                size = (self.path / old["file"]).stat().st_size
                row = max(1, int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize)
                rows = max(size // row, rows)
            elif (self.path / old["file"]).stat().st_size < \
                    int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
                raise CheckpointError(f"{self.path / old['file']} is shorter than the manifest "
                                      "says; the files are damaged")
            return self._open(name, rows, shape[1:], dtype, create=False)
        self.manifest["arrays"][name] = entry
        self._save_manifest()
        return self._open(name, shape[0], shape[1:], dtype, create=True)

    # ------------------------------------------------------------------ protocol
    def allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """A zero-filled array in a new file (or the existing file when reopening)."""
        return self._array(name, shape, dtype, growable=name.startswith("side/"))

    def allocate_meta(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """Bookkeeping arrays persist in files too (``meta/<name>``)."""
        return self._array(f"meta/{name}", shape, dtype, growable=False)

    def resize(self, name: str, array: Any, length: int) -> Any:
        """Grow the file of ``name`` along axis 0 (content kept, new rows zero)."""
        mm = self._maps.get(name)
        if mm is None:  # zero-byte arrays are plain numpy
            out = np.zeros((length, *array.shape[1:]), dtype=array.dtype)
            out[: len(array)] = array
            return out
        mm.flush()
        file = self.path / self._file(name)
        row = int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize
        with open(file, "r+b") as fh:
            fh.truncate(length * row)
        del self._maps[name]
        return self._open(name, length, tuple(array.shape[1:]), array.dtype, create=False)

    def write(self, array: Any, index: Any, values: npt.NDArray[Any]) -> None:
        """``array[index] = values``."""
        array[index] = values

    def gather(self, array: Any, index: Any) -> Any:
        """``array[index]`` as a new in-memory numpy array."""
        return array[index]

    def to_numpy(self, array: Any) -> npt.NDArray[Any]:
        """The mapped array itself (no copy)."""
        return np.asarray(array)

    def flush(self) -> None:
        """msync every mapping (durable against an OS crash, not only a process kill)."""
        for mm in self._maps.values():
            mm.flush()

    def requires_memory(self) -> bool:
        """Data lives on disk: no RAM check at allocation."""
        return False

    def __getstate__(self) -> dict[str, Any]:
        """Refused: a pickled copy of mapped files would be a second writer (or a silent
        in-memory copy). Pass the directory instead and reopen it there.

        Raises:
            ConfigError: Always, naming the path and the fix.
        """
        raise ConfigError(
            f"a memmap buffer (path={str(self.path)!r}) cannot be pickled or copied: pass "
            "the path and call rb.open(path) in the other process (after buf.flush(), and "
            "after this process closed it), or rb.save(buf, dir) / rb.load(dir) for a copy"
        )

    # ------------------------------------------------------------------ owner
    def record_owner(self, record: dict[str, Any] | None, error: str | None = None) -> None:
        """Keep the owning buffer's record (its config) in the manifest.

        The backend never reads it: the buffer writes it, and
        :func:`replaybank.persist.open` rebuilds the buffer from it.

        Args:
            record: A JSON-able description of the owner, or None when it could not
                describe itself.
            error: Why there is no record (shown when the buffer is reopened).
        """
        self.manifest["config"] = record
        self.manifest["config_error"] = error
        self._save_manifest()

    def owner_record(self) -> dict[str, Any] | None:
        """The record :meth:`record_owner` kept, or None."""
        cfg = self.manifest.get("config")
        return cfg if isinstance(cfg, dict) else None
