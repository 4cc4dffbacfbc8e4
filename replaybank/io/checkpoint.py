"""Checkpoints: ``<prefix>metadata.json`` + ``<prefix>state.safetensors``, atomic and exact.

``save_buffer(buf, dirpath)`` writes two files (the layout of velora's ``save``):

* ``<prefix>state.safetensors``: every array of ``buf.state_dict()`` (table fields, the
  side store of final observations, links, sampler arrays), streamed chunk by chunk so
  no second copy of the buffer is made in RAM. Its header's ``__metadata__`` carries a
  copy of the manifest, so the file describes itself.
* ``<prefix>metadata.json``: the manifest: format and version, the buffer's config (how
  to rebuild it, :mod:`replaybank.config`), its metadata (spec, size, sampler, view),
  the JSON part of its state (lane counters, generator and sampler state; arrays appear
  as ``{"__tensor__": name}``) and, per array, dtype, shape and CRC-32.

Writes are atomic: both files are written under temporary names in ``dirpath``,
fsynced, then renamed (state file first, then manifest) and the directory is fsynced.
A crash or a full disk before the first rename leaves the previous checkpoint as it
was; a crash between the two renames leaves a new state file whose embedded manifest
:func:`load_buffer` uses (the pair is never mixed).

``load_buffer`` checks everything before it builds anything: the files exist, the
manifest is a replaybank manifest of a supported version, it agrees with the state
file, the spec matches the stored arrays, and every array's checksum is right. Only
then is a buffer built and filled (in chunks, read straight from the file). Any
problem raises :class:`~replaybank.errors.CheckpointError`.

Example:
    >>> import tempfile, numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=16, seed=0)
    >>> for t in range(5):
    ...     buf.add(obs=np.full(2, t, np.float32), action=t, reward=1.0,
    ...             next_obs=np.full(2, t + 1, np.float32), terminated=False, truncated=False)
    >>> d = tempfile.mkdtemp()
    >>> buf.save(d)
    >>> back = rb.load(d)
    >>> bool(np.array_equal(back.sample(3).obs, buf.sample(3).obs))
    True
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError, ConfigError, describe
from replaybank.io.safetensors_stream import (
    CHUNK_BYTES,
    StateFile,
    st_code,
    write_bytes,
    write_safetensors,
)
from replaybank.io.state import join_state, split_state, walk_markers

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "LazyTensor",
    "checkpoint_paths",
    "load_buffer",
    "load_into",
    "load_state",
    "read_manifest",
    "save_buffer",
    "save_state",
]

FORMAT = "replaybank.checkpoint"
FORMAT_VERSION = 1
_META_KEY = "replaybank_manifest"


def checkpoint_paths(dirpath: Any, prefix: str = "buffer_") -> tuple[Path, Path]:
    """``(<dirpath>/<prefix>metadata.json, <dirpath>/<prefix>state.safetensors)``.

    Example:
        >>> [p.name for p in checkpoint_paths("ckpt", "rb_")]
        ['rb_metadata.json', 'rb_state.safetensors']
    """
    if not isinstance(prefix, str) or os.sep in prefix or "/" in prefix:
        raise ConfigError(f"prefix={prefix!r}: must be a str without path separators")
    d = Path(os.fspath(dirpath))
    return d / f"{prefix}metadata.json", d / f"{prefix}state.safetensors"


# ---------------------------------------------------------------------- saving
def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def save_state(
    state: Mapping[str, Any],
    dirpath: Any,
    prefix: str = "buffer_",
    info: Mapping[str, Any] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> Path:
    """Write any component's state dict as an atomic two-file checkpoint.

    Args:
        state: Nested dict of numpy arrays and JSON-able values.
        dirpath: Directory (created when missing).
        prefix: File name prefix.
        info: Extra JSON-able manifest entries (``config``, ``metadata``, ...).
        chunk_bytes: Bytes copied at a time.

    Returns:
        The manifest path.

    Raises:
        CheckpointError: A state leaf that cannot be stored, or the write failed (disk
            full, permissions); the previous checkpoint is then left as it was.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> save_state({"w": np.arange(3.0), "step": 7}, d, prefix="opt_").name
        'opt_metadata.json'
        >>> load_state(d, prefix="opt_")[1]["step"]
        7
    """
    meta_path, state_path = checkpoint_paths(dirpath, prefix)
    tree, tensors = split_state(state)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "checkpoint_id": uuid.uuid4().hex,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "state_file": state_path.name,
        **dict(info or {}),
        "state": tree,
        "tensors": {},
    }
    specs = {
        name: {"dtype": np.lib.format.dtype_to_descr(a.dtype), "shape": list(a.shape),
               "nbytes": int(a.nbytes), "raw": st_code(a.dtype) is None}
        for name, a in tensors.items()
    }

    def with_crcs(crcs: Mapping[str, str]) -> dict[str, Any]:
        m = dict(manifest)
        m["tensors"] = {n: {**s, "crc32": crcs[n]} for n, s in specs.items()}
        return m

    def header_meta(crcs: Mapping[str, str]) -> dict[str, str]:
        return {"format": FORMAT, _META_KEY: json.dumps(with_crcs(crcs))}

    try:
        meta_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"save: cannot create directory {meta_path.parent}: {exc}") \
            from exc
    tag = f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp_state = state_path.with_name(state_path.name + tag)
    tmp_meta = meta_path.with_name(meta_path.name + tag)
    try:
        with open(tmp_state, "wb") as fh:
            crcs = write_safetensors(fh, tensors, header_meta, chunk_bytes)
            os.fsync(fh.fileno())
        text = json.dumps(with_crcs(crcs), indent=2).encode()
        with open(tmp_meta, "wb") as fh:
            write_bytes(fh, text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_state, state_path)
        os.replace(tmp_meta, meta_path)
        _fsync_dir(meta_path.parent)
    except BaseException as exc:
        for p in (tmp_state, tmp_meta):
            with contextlib.suppress(OSError):
                p.unlink()
        if isinstance(exc, OSError):
            raise CheckpointError(
                f"save to {meta_path.parent}: writing failed ({exc}); the previous "
                "checkpoint there (if any) is unchanged; free disk space and save again"
            ) from exc
        raise
    return meta_path


def save_buffer(buf: Any, dirpath: Any, prefix: str = "buffer_") -> Path:
    """Save a buffer (any type with ``state_dict``, ``metadata`` and ``config``).

    Args:
        buf: The buffer.
        dirpath: Directory for ``<prefix>metadata.json`` and ``<prefix>state.safetensors``.
        prefix: File name prefix.

    Returns:
        The manifest path.

    Raises:
        CheckpointError: The write failed (the previous checkpoint is left intact).
        ConfigError: The buffer's config cannot be described (unregistered component).

    Example:
        >>> import tempfile
        >>> import replaybank as rb
        >>> d = tempfile.mkdtemp()
        >>> save_buffer(rb.ReplayBuffer(8), d).name
        'buffer_metadata.json'
    """
    from replaybank.config import buffer_config

    dump = buffer_config(buf).model_dump(mode="json")
    state = buf.state_dict()
    meta = buf.metadata() if callable(getattr(buf, "metadata", None)) else \
        state.get("metadata")
    info = {"buffer_type": type(buf).__name__, "config": dump, "metadata": meta}
    return save_state(state, dirpath, prefix, info)


# ---------------------------------------------------------------------- reading
def _parse_manifest(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(
            f"{where} is not a replaybank checkpoint manifest (expected a JSON object with "
            f'"format": "{FORMAT}"); pass the directory and prefix of a buffer.save()'
        )
    version = data.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CheckpointError(f"{where}: format_version={version!r} is not a positive int")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{where}: format_version={version} was written by a newer replaybank; this "
            f"version reads format_version <= {FORMAT_VERSION}; upgrade replaybank"
        )
    for key, typ in (("checkpoint_id", str), ("state", dict), ("tensors", dict)):
        if not isinstance(data.get(key), typ):
            raise CheckpointError(f"{where}: manifest entry {key!r}={describe(data.get(key))}"
                                  f" is missing or not a {typ.__name__}")
    return data


def read_manifest(dirpath: Any, prefix: str = "buffer_") -> dict[str, Any]:
    """Read and validate ``<prefix>metadata.json`` (not the state file).

    Raises:
        CheckpointError: Missing, not JSON, not a manifest, or a newer format version.

    Example:
        >>> import tempfile
        >>> import replaybank as rb
        >>> d = tempfile.mkdtemp()
        >>> rb.ReplayBuffer(8, num_envs=2).save(d)
        >>> m = read_manifest(d)
        >>> m["format_version"], m["config"]["num_envs"]
        (1, 2)
    """
    meta_path, _ = checkpoint_paths(dirpath, prefix)
    try:
        text = meta_path.read_text()
    except FileNotFoundError as exc:
        raise CheckpointError(f"no checkpoint at {meta_path}: the file does not exist; "
                              "check dirpath and prefix") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read {meta_path}: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{meta_path} is not valid JSON ({exc}); the manifest is "
                              "damaged") from exc
    return _parse_manifest(data, str(meta_path))


class LazyTensor:
    """An array in a state file, read on demand (rows ``[i:j]`` at a time).

    Supports ``shape``, ``dtype``, ``ndim``, ``len()``, slicing along axis 0 and
    ``numpy.asarray`` (reads everything).
    """

    def __init__(self, sf: StateFile, name: str, dtype: np.dtype[Any],
                 shape: tuple[int, ...]) -> None:
        self._sf, self.name, self.dtype, self.shape = sf, name, dtype, shape
        self.ndim = len(shape)
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    def _read(self, lo: int, hi: int) -> npt.NDArray[Any]:
        out = np.empty((hi - lo, *self.shape[1:]), dtype=self.dtype)
        row = out[0].nbytes if len(out) else 0
        if out.nbytes:
            self._sf.read_into(self.name, lo * row, out)
        return out

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice) and self.ndim and key.step in (None, 1):
            lo, hi, _ = key.indices(self.shape[0])
            return self._read(lo, max(lo, hi))
        return np.asarray(self)[key]

    def __array__(self, dtype: Any = None, copy: Any = None) -> npt.NDArray[Any]:
        if self.ndim == 0:
            out = np.empty((), dtype=self.dtype)
            self._sf.read_into(self.name, 0, out)
        else:
            out = self._read(0, self.shape[0])
        return out if dtype is None else out.astype(dtype)


def _open_checked(dirpath: Any, prefix: str) -> tuple[dict[str, Any], StateFile]:
    """Validate manifest + state file (without reading the data)."""
    meta_path, state_path = checkpoint_paths(dirpath, prefix)
    if not state_path.exists():
        raise CheckpointError(f"no checkpoint at {state_path}: the state file does not "
                              "exist; check dirpath and prefix")
    sf = StateFile(state_path)
    try:
        embedded_text = sf.metadata.get(_META_KEY)
        embedded = None
        if isinstance(embedded_text, str):
            try:
                embedded = _parse_manifest(json.loads(embedded_text), f"{state_path} header")
            except json.JSONDecodeError as exc:
                raise CheckpointError(f"{state_path}: embedded manifest is not JSON") from exc
        if embedded is None:
            raise CheckpointError(f"{state_path} is a safetensors file but not a replaybank "
                                  "checkpoint (no manifest in its header)")
        manifest: dict[str, Any] | None = None
        try:
            manifest = read_manifest(dirpath, prefix)
        except CheckpointError:
            if meta_path.exists():
                raise
        if manifest is None or manifest["checkpoint_id"] != embedded["checkpoint_id"]:
            # a save was interrupted between its two renames: the state file is newer
            warnings.warn(
                f"{meta_path} does not belong to {state_path.name} (interrupted save?); "
                "using the manifest stored in the state file", RuntimeWarning, stacklevel=3)
            manifest = embedded
        elif manifest != embedded:
            diff = sorted(k for k in set(manifest) | set(embedded)
                          if manifest.get(k) != embedded.get(k))
            raise CheckpointError(
                f"{meta_path} was modified after saving: entries {diff} differ from the copy "
                f"in {state_path.name}; restore the original file"
            )
        _check_tensors(manifest, sf)
        return manifest, sf
    except BaseException:
        sf.close()
        raise


def _check_tensors(manifest: dict[str, Any], sf: StateFile) -> None:
    where = sf.path
    for name, t in manifest["tensors"].items():
        if name not in sf.entries:
            raise CheckpointError(f"{where}: tensor {name!r} listed in the manifest is "
                                  "missing from the state file")
        try:
            descr: Any = t["dtype"] if isinstance(t["dtype"], str) else \
                [tuple(x) for x in t["dtype"]]
            dtype = np.lib.format.descr_to_dtype(descr)
            shape = tuple(int(s) for s in t["shape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: manifest entry of tensor {name!r} is malformed") \
                from exc
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        e = sf.entries[name]
        if e["offsets"][1] - e["offsets"][0] != nbytes:
            raise CheckpointError(
                f"{where}: tensor {name!r} holds {e['offsets'][1] - e['offsets'][0]} bytes "
                f"but the manifest says {shape} {dtype} ({nbytes} bytes)")
        t["_dtype"], t["_shape"] = dtype, shape
    for path, name in walk_markers(manifest["state"]):
        if name not in manifest["tensors"]:
            raise CheckpointError(f"{where}: state entry {'/'.join(path)} refers to tensor "
                                  f"{name!r}, which the manifest does not list")
    _check_spec(manifest)


def _check_spec(manifest: dict[str, Any]) -> None:
    """The stored field arrays must be ``[T, lanes, *shape]`` of the manifest's spec."""
    spec = (manifest.get("metadata") or {}).get("spec")
    if not isinstance(spec, dict):
        return
    fields = {path[-1][len("fields/"):]: name for path, name in walk_markers(manifest["state"])
              if len(path) >= 2 and path[-2] == "table" and path[-1].startswith("fields/")}
    if not fields:
        return
    for fname, f in spec.items():
        t = manifest["tensors"].get(fields.get(fname, ""))
        if t is None:
            raise CheckpointError(f"spec field {fname!r} has no stored array in the state "
                                  f"file (stored: {sorted(fields)}); the files do not match")
        try:
            want = np.dtype(f["dtype"])
            shape = tuple(int(s) for s in f["shape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"spec field {fname!r}={f!r} is malformed") from exc
        if t["_dtype"] != want or t["_shape"][2:] != shape:
            raise CheckpointError(
                f"spec field {fname!r} is {shape} {want} but the state file stores "
                f"{t['_shape'][2:]} {t['_dtype']} per step; the spec does not match the state")
    extra = set(fields) - set(spec)
    if extra:
        raise CheckpointError(f"the state file stores fields {sorted(extra)} that the spec "
                              "does not list; the spec does not match the state")


def _verify(manifest: dict[str, Any], sf: StateFile) -> None:
    for name, t in manifest["tensors"].items():
        got = sf.crc32(name)
        if got != t.get("crc32"):
            raise CheckpointError(
                f"{sf.path}: checksum mismatch for tensor {name!r} (stored {t.get('crc32')}, "
                f"computed {got}); the state file is corrupted"
            )


def _tensors(manifest: dict[str, Any], sf: StateFile) -> dict[str, Any]:
    """Lazy tensors for table data (copied in chunks), arrays for everything else."""
    lazy_names = {name for path, name in walk_markers(manifest["state"])
                  if len(path) >= 2 and path[-2] == "table"
                  and path[-1].startswith(("fields/", "side/"))}
    out: dict[str, Any] = {}
    for name, t in manifest["tensors"].items():
        lt = LazyTensor(sf, name, t["_dtype"], t["_shape"])
        out[name] = lt if name in lazy_names else np.asarray(lt)
    return out


def load_state(dirpath: Any, prefix: str = "buffer_") -> tuple[dict[str, Any], dict[str, Any]]:
    """Read a checkpoint fully into memory: ``(manifest, state_dict)`` (checksums verified).

    Raises:
        CheckpointError: Any problem with the files.

    Example:
        >>> import tempfile
        >>> import replaybank as rb
        >>> d = tempfile.mkdtemp()
        >>> rb.ReplayBuffer(8).save(d)
        >>> sorted(load_state(d)[1])
        ['init', 'metadata', 'rng', 'sampler']
    """
    manifest, sf = _open_checked(dirpath, prefix)
    with sf:
        _verify(manifest, sf)
        tensors = {k: np.asarray(v) for k, v in _tensors(manifest, sf).items()}
    state = join_state(manifest["state"], tensors)
    manifest["tensors"] = {n: {k: v for k, v in t.items() if not k.startswith("_")}
                           for n, t in manifest["tensors"].items()}
    return manifest, state


def _restore(buf: Any, manifest: dict[str, Any], sf: StateFile) -> None:
    state = join_state(manifest["state"], _tensors(manifest, sf))
    try:
        buf.load_state_dict(state)
    except CheckpointError:
        raise
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise CheckpointError(
            f"the checkpoint does not fit a {type(buf).__name__}: {type(exc).__name__}: {exc}"
        ) from exc


def load_into(buf: Any, dirpath: Any, prefix: str = "buffer_") -> Any:
    """Load a checkpoint into an existing buffer of the same type, capacity and spec.

    Every file check runs before the buffer is touched.

    Returns:
        ``buf``.

    Raises:
        CheckpointError: Any problem with the files, or they do not fit ``buf``.

    Example:
        >>> import tempfile, numpy as np
        >>> import replaybank as rb
        >>> d = tempfile.mkdtemp()
        >>> src = rb.ReplayBuffer(8, seed=0)
        >>> src.add(obs=np.zeros(2), action=0, reward=1.0, next_obs=np.ones(2),
        ...         terminated=False, truncated=False)
        >>> src.save(d)
        >>> len(load_into(rb.ReplayBuffer(8), d))
        1
    """
    manifest, sf = _open_checked(dirpath, prefix)
    with sf:
        _verify(manifest, sf)
        _restore(buf, manifest, sf)
    return buf


def load_buffer(dirpath: Any, prefix: str = "buffer_", **overrides: Any) -> Any:
    """Rebuild a saved buffer exactly (its type comes from the manifest).

    Args:
        dirpath: Directory of the checkpoint.
        prefix: File name prefix.
        **overrides: Config entries to change, e.g. ``storage="numpy"`` to load a memmap
            buffer into memory, or ``path=`` for a new memmap directory.

    Returns:
        The buffer; its next ``sample()`` equals the saved buffer's.

    Raises:
        CheckpointError: Missing, truncated or corrupted files, an edited manifest, a
            newer format version or a spec that does not match the state.

    Example:
        >>> import tempfile
        >>> import replaybank as rb
        >>> d = tempfile.mkdtemp()
        >>> rb.PrioritizedReplayBuffer(16, alpha=0.5).save(d)
        >>> type(load_buffer(d)).__name__, load_buffer(d).sampler.alpha
        ('PrioritizedReplayBuffer', 0.5)
    """
    from replaybank.config import from_config

    manifest, sf = _open_checked(dirpath, prefix)
    with sf:
        _verify(manifest, sf)
        cfg = manifest.get("config")
        if not isinstance(cfg, dict):
            raise CheckpointError(f"{sf.path}: the manifest has no buffer config; load the "
                                  "state into a buffer you build with load_into(buf, ...)")
        if "path" in overrides and "storage" not in overrides:
            overrides["storage"] = "memmap"
        try:
            buf = from_config(cfg, **overrides)
        except ConfigError as exc:
            raise CheckpointError(f"cannot rebuild the saved buffer: {exc}") from exc
        _restore(buf, manifest, sf)
    return buf
