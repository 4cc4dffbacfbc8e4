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

:func:`open_buffer` (``ReplayBuffer.open(path)``) reopens the files in a new process and
continues where the old one stopped. Generator and sampler state (e.g. PER priorities)
live in memory: ``buf.flush()`` saves them next to the files
(:mod:`replaybank.io.resume`), and a reopened buffer restores them when the files still
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
    >>> again = rb.ReplayBuffer.open(d)
    >>> len(again), again.sample(2).obs.shape
    (5, (2, 2))
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
import weakref
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError, ConfigError

__all__ = ["MANIFEST", "RESUME_PREFIX", "MemmapBackend", "open_buffer"]

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
            ones (what :func:`open_buffer` does).
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

    def __init__(self, path: Any, reopen: bool = False, overwrite: bool = False) -> None:
        self.path = Path(os.fspath(path))
        self.reopen = bool(reopen)
        self._maps: dict[str, np.memmap[Any, Any]] = {}
        self._owner: Any = None
        self._config_pending = False
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
        """``array[index] = values`` (the first write records the owner's config)."""
        if self._config_pending:
            self._record_config()
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

    # ------------------------------------------------------------------ owner
    def attach(self, owner: Any, replace: bool = False) -> None:
        """Remember the buffer that owns this storage; its config goes into the manifest
        (now, or at the first write if the owner cannot describe itself yet).

        Args:
            owner: The buffer :func:`open_buffer` is to rebuild.
            replace: Record ``owner``'s config even if one is recorded already (a
                wrapper such as ``SequenceReplayBuffer`` taking over its inner buffer).
        """
        self._owner = weakref.ref(owner)
        if replace or self.manifest.get("config") is None:
            self._config_pending = True
            with contextlib.suppress(Exception):
                self._record_config()

    def _record_config(self) -> None:
        owner = self._owner() if self._owner is not None else None
        self._config_pending = False
        if owner is None:
            return
        try:
            cfg = owner.config()
            data = cfg.model_dump(mode="json") if hasattr(cfg, "model_dump") else dict(cfg)
            self.manifest["config_error"] = None
        except Exception as exc:  # an unregistered sampler/view: reopen needs overrides
            data = None
            self.manifest["config_error"] = f"{type(exc).__name__}: {exc}"
        self.manifest["config"] = data
        self._save_manifest()


def open_buffer(path: Any, **overrides: Any) -> Any:
    """Reopen the memmap buffer at ``path`` (in this or a new process).

    Args:
        path: Directory of a buffer built with ``storage="memmap"``.
        **overrides: Config entries to change (e.g. ``seed=``, ``sampler=`` when the
            original used an unregistered sampler).

    Returns:
        The buffer, holding every step added before the old process stopped.

    Raises:
        CheckpointError: No buffer at ``path``, or no config recorded for it.

    Example:
        >>> import tempfile
        >>> import replaybank as rb
        >>> d = tempfile.mkdtemp()
        >>> _ = rb.ReplayBuffer(8, storage="memmap", path=d,
        ...                     spec={"obs": ((2,), "float32"), "action": ((), "int64")})
        >>> open_buffer(d).spec["obs"].shape
        (2,)
    """
    from replaybank.config import from_config
    from replaybank.ops import ring

    backend = MemmapBackend(path, reopen=True)
    cfg = backend.manifest.get("config")
    if not isinstance(cfg, dict):
        why = backend.manifest.get("config_error") or "nothing was ever added to it"
        raise CheckpointError(f"the memmap buffer at {path} has no recorded config ({why}); "
                              "it cannot be rebuilt")
    cfg = {**cfg, "storage": "memmap", "path": str(backend.path), **overrides}
    buf = from_config(cfg, storage=backend)
    table = buf.table
    table.rebuild_free_list()
    w, c, lanes = table.written, table.counts, table.lanes
    if int(c.sum()):
        seq = np.concatenate([np.arange(w[i] - c[i], w[i]) for i in range(lanes)])
        lane = np.concatenate([np.full(int(c[i]), i) for i in range(lanes)])
        order = np.argsort(seq, kind="stable")
        keys = (seq * lanes + lane)[order].astype(np.int64)
        buf.sampler.on_write(ring.key_to_slot(keys, table.T, lanes), None)
    from replaybank.io.resume import load_resume

    load_resume(buf)  # the generator and sampler state of the last flush, when it fits
    return buf
