"""Checkpoints: ``<prefix>metadata.json`` + ``<prefix>state.safetensors``, atomic and exact.

This module knows no buffer class: it writes and reads any component's state dict
(:func:`save_state`, :func:`load_state`); :mod:`replaybank.persist` saves and rebuilds
buffers with it. ``save_state(buf.state_dict(), dirpath)`` writes two files (the layout of
velora's ``save``):

* ``<prefix>state.safetensors``: every array of ``buf.state_dict()`` (table fields, the
  side store of final observations, links, sampler arrays), streamed chunk by chunk so
  no second copy of the buffer is made in RAM. Its header's ``__metadata__`` carries a
  copy of the manifest, so the file describes itself.
* ``<prefix>metadata.json``: the manifest: format and version, the buffer's config (how
  to rebuild it, :mod:`replaybank.config`), its metadata (spec, size, sampler, view),
  the JSON part of its state (lane counters, generator and sampler state; arrays appear
  as ``{"__tensor__": name}``) and, per array, dtype, shape and CRC-32.

Writes are atomic: both files are written under temporary names in ``dirpath``
(``<name>.tmp-<pid>-<tag>``), fsynced, then renamed (state file first, then manifest) and
the directory is fsynced. The temporaries a killed save left behind are removed by the
next save to the directory (those of processes that no longer run; :mod:`replaybank.io.atomic`).
A crash or a full disk before the first rename leaves the previous checkpoint as it
was; a crash between the two renames leaves a new state file whose embedded manifest
the loader uses (the pair is never mixed).

Loading checks everything before it builds anything: the files exist, the
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

import datetime as _dt
import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from replaybank.errors import CheckpointError, os_error_fix
from replaybank.io.atomic import remove_stale_temps, temp_path
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
    st_code,
    write_bytes,
    write_safetensors,
)
from replaybank.io.state_tree import join_state, split_state

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "LazyTensor",
    "checkpoint_paths",
    "load_state",
    "open_checked",
    "read_manifest",
    "save_state",
    "verify_crcs",
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
    # the full-size temporaries of saves that were killed before their rename
    remove_stale_temps(meta_path.parent, (meta_path.name, state_path.name))
    try:
        with temp_path(state_path) as tmp_state, temp_path(meta_path) as tmp_meta:
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
    except OSError as exc:  # the temporaries are gone (temp_path removes them)
        raise CheckpointError(
            f"save to {meta_path.parent}: writing failed ({exc}); the previous "
            f"checkpoint there (if any) is unchanged; {os_error_fix(exc)}"
        ) from exc
    return meta_path


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
        ['init', 'metadata', 'rng', 'sampler', 'view']
    """
    manifest, sf = open_checked(dirpath, prefix)
    with sf:
        verify_crcs(manifest, sf)
        tensors = {k: np.asarray(v) for k, v in lazy_tensors(manifest, sf).items()}
    state = join_state(manifest["state"], tensors)
    manifest["tensors"] = {n: {k: v for k, v in t.items() if not k.startswith("_")}
                           for n, t in manifest["tensors"].items()}
    return manifest, state
