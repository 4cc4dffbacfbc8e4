"""Checkpoint manifests: where they live, what a valid one holds, and its checks.

A checkpoint's manifest (``<prefix>metadata.json``, with a copy in the header of
``<prefix>state.safetensors``) says which format and version wrote it and, per array of
the state file, its dtype, shape and CRC-32. This module reads and validates it before
anything is built: :func:`read_manifest` checks the JSON file alone;
:func:`open_checked` opens the state file, makes sure the two copies agree (or falls back
to the embedded copy after an interrupted save), that every listed tensor is there with
the right size and that the buffer's spec matches the stored field arrays;
:func:`verify_crcs` compares every array's checksum. Any problem raises
:class:`~replaybank.errors.CheckpointError`. :mod:`replaybank.io.checkpoint` writes the
files and re-exports the public names.

Example:
    >>> import tempfile
    >>> import replaybank as rb
    >>> d = tempfile.mkdtemp()
    >>> rb.ReplayBuffer(8).save(d)
    >>> manifest, sf = open_checked(d, "buffer_")
    >>> with sf:
    ...     verify_crcs(manifest, sf)
    >>> manifest["format"], manifest["format_version"]
    ('replaybank.checkpoint', 1)
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from replaybank.errors import CheckpointError, ConfigError, describe
from replaybank.io.safetensors_stream import StateFile
from replaybank.io.state_tree import walk_markers

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "META_KEY",
    "check_tensors",
    "checkpoint_paths",
    "open_checked",
    "parse_manifest",
    "read_manifest",
    "verify_crcs",
]

FORMAT = "replaybank.checkpoint"
FORMAT_VERSION = 1
META_KEY = "replaybank_manifest"  # the manifest's key in the state file's __metadata__


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


def parse_manifest(data: Any, where: str) -> dict[str, Any]:
    """Check that decoded JSON ``data`` is a manifest this version can read.

    Args:
        data: The decoded manifest.
        where: Where it came from (named in errors).

    Returns:
        ``data``.

    Raises:
        CheckpointError: Not a replaybank manifest, a bad or newer ``format_version``,
            or a missing ``checkpoint_id``/``state``/``tensors`` entry.

    Example:
        >>> parse_manifest({"format": FORMAT, "format_version": 0}, "m.json")
        Traceback (most recent call last):
        ...
        replaybank.errors.CheckpointError: m.json: format_version=0 is not a positive int
    """
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
    return parse_manifest(data, str(meta_path))


def open_checked(dirpath: Any, prefix: str) -> tuple[dict[str, Any], StateFile]:
    """Validate manifest + state file (without reading the data).

    Warns (``RuntimeWarning``) and uses the manifest embedded in the state file when
    ``<prefix>metadata.json`` is missing or belongs to another save (a save interrupted
    between its two renames).

    Returns:
        ``(manifest, state file)``; the caller closes the state file. The manifest's
        tensor entries gain the parsed ``_dtype`` and ``_shape`` (see
        :func:`check_tensors`).

    Raises:
        CheckpointError: Missing files, an edited manifest, or a state file that does not
            match it.
    """
    meta_path, state_path = checkpoint_paths(dirpath, prefix)
    if not state_path.exists():
        raise CheckpointError(f"no checkpoint at {state_path}: the state file does not "
                              "exist; check dirpath and prefix")
    sf = StateFile(state_path)
    try:
        embedded_text = sf.metadata.get(META_KEY)
        embedded = None
        if isinstance(embedded_text, str):
            try:
                embedded = parse_manifest(json.loads(embedded_text), f"{state_path} header")
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
        check_tensors(manifest, sf)
        return manifest, sf
    except BaseException:
        sf.close()
        raise


def check_tensors(manifest: dict[str, Any], sf: StateFile) -> None:
    """Every listed tensor is in ``sf`` with the listed size; the spec matches the fields.

    Adds the parsed ``_dtype`` and ``_shape`` to each entry of ``manifest["tensors"]``.

    Raises:
        CheckpointError: A tensor missing or of another size, a malformed entry, a
            state entry naming an unlisted tensor, or a spec that does not match the
            stored ``[T, lanes, *shape]`` field arrays.
    """
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


def verify_crcs(manifest: dict[str, Any], sf: StateFile) -> None:
    """Compare each tensor's CRC-32 in ``sf`` with the manifest's (reads all the data).

    Raises:
        CheckpointError: A checksum differs: the state file is corrupted.
    """
    for name, t in manifest["tensors"].items():
        got = sf.crc32(name)
        if got != t.get("crc32"):
            raise CheckpointError(
                f"{sf.path}: checksum mismatch for tensor {name!r} (stored {t.get('crc32')}, "
                f"computed {got}); the state file is corrupted"
            )
