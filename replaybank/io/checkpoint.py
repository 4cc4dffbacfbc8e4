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
problem raises :class:`~replaybank.errors.CheckpointError`. The manifest and its checks
live in :mod:`replaybank.io.manifest`, the on-demand arrays in
:mod:`replaybank.io.lazy_tensor`; this module writes checkpoints and loads them.

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from replaybank.errors import CheckpointError, ConfigError
from replaybank.io.lazy_tensor import LazyTensor, lazy_tensors
from replaybank.io.manifest import (
    FORMAT,
    FORMAT_VERSION,
    META_KEY,
    checkpoint_paths,
    open_checked,
    read_manifest,
    verify_crcs,
)
from replaybank.io.safetensors_stream import (
    CHUNK_BYTES,
    StateFile,
    st_code,
    write_bytes,
    write_safetensors,
)
from replaybank.io.state import join_state, split_state

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
        return {"format": FORMAT, META_KEY: json.dumps(with_crcs(crcs))}

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
    manifest, sf = open_checked(dirpath, prefix)
    with sf:
        verify_crcs(manifest, sf)
        tensors = {k: np.asarray(v) for k, v in lazy_tensors(manifest, sf).items()}
    state = join_state(manifest["state"], tensors)
    manifest["tensors"] = {n: {k: v for k, v in t.items() if not k.startswith("_")}
                           for n, t in manifest["tensors"].items()}
    return manifest, state


def _restore(buf: Any, manifest: dict[str, Any], sf: StateFile) -> None:
    state = join_state(manifest["state"], lazy_tensors(manifest, sf))
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
    manifest, sf = open_checked(dirpath, prefix)
    with sf:
        verify_crcs(manifest, sf)
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

    manifest, sf = open_checked(dirpath, prefix)
    with sf:
        verify_crcs(manifest, sf)
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
