"""The on-disk layout of a sharded service checkpoint: shard folders, manifest, DONE.

A checkpoint of :class:`~replaybank.distributed.service.ReplayService` is one directory::

    <path>/shard-000/        rb.save of shard 0's buffer + shard.json + times.npy
    <path>/shard-001/        ...
    <path>/manifest.json     shard count, buffer config, lanes, limiter, client states
    <path>/DONE              written last: the checkpoint is complete

Order of writes: every shard saves its folder (each file atomically, by temporary name
and rename: :mod:`replaybank.io.atomic`), then the manifest (atomic), then ``DONE``
(atomic). A checkpoint interrupted at any point has no ``DONE`` and :func:`read_manifest`
refuses it with a :class:`~replaybank.errors.CheckpointError`; rewriting a checkpoint in
place removes its ``DONE`` first, so a half-rewritten one is refused too.

A service built with ``checkpoint_dir`` also records its latest complete checkpoint in
``<checkpoint_dir>/LATEST`` (the checkpoint's absolute path, replaced atomically after
``DONE``); a shard that Ray restarts after a crash reloads its folder from there.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> root = Path(tempfile.mkdtemp())
    >>> begin(root)
    >>> write_json(shard_dir(root, 0) / "shard.json", {"inserts": 3})
    >>> finish(root, {"num_shards": 1}, latest_dir=root.parent)
    >>> read_manifest(root)["num_shards"], latest(root.parent) == root.resolve()
    (1, True)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError
from replaybank.io.atomic import temp_path
from replaybank.io.manifest import checkpoint_paths

__all__ = ["BUFFER_PREFIX", "FORMAT", "MANIFEST", "SHARD_JSON", "TIMES", "begin", "check_shards",
           "finish", "latest", "read_array", "read_json", "read_manifest", "shard_dir",
           "write_json"]

#: The ``format`` entry of a service manifest.
FORMAT = "replaybank.distributed/1"
#: File name prefix of a shard's buffer files (``rb.save``'s ``prefix``).
BUFFER_PREFIX = "buffer_"
#: A shard's counters and limiter state.
SHARD_JSON = "shard.json"
#: A shard's ``max_times_sampled`` counts, ``[2, slots]`` int64.
TIMES = "times.npy"
#: The service manifest (shard count, buffer config, lanes, limiter, client states).
MANIFEST = "manifest.json"
_DONE = "DONE"
_LATEST = "LATEST"


def shard_dir(root: Path, shard: int) -> Path:
    """The folder of shard ``shard`` inside checkpoint ``root``."""
    return Path(root) / f"shard-{shard:03d}"


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as JSON to ``path`` atomically (temporary name, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with temp_path(path) as tmp:
        with open(tmp, "w") as fh:
            json.dump(value, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)


def read_json(path: Path, what: str) -> Any:
    """Read a JSON file, or raise CheckpointError naming ``what`` it should hold."""

    def load() -> Any:
        with open(path) as fh:
            return json.load(fh)

    return _read(path, what, load)


def read_array(path: Path, what: str) -> npt.NDArray[Any]:
    """Read a ``.npy`` file, or raise CheckpointError naming ``what`` it should hold."""
    return np.asarray(_read(path, what, lambda: np.load(path, allow_pickle=False)))


def _read(path: Path, what: str, load: Callable[[], Any]) -> Any:
    """``load()`` of the file ``path``, its failures as a CheckpointError naming ``what``
    the file should hold: missing (an incomplete checkpoint) or unreadable (damaged)."""
    try:
        return load()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing ({what}); the checkpoint is incomplete, "
                              "restore another one") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read {what} ({exc}); the checkpoint is "
                              "damaged, restore another one") from exc


def check_shards(root: Path, num_shards: int) -> None:
    """Check that every shard folder of the checkpoint at ``root`` holds the files a shard
    loads (its state, its counts and its buffer's state file), before any shard starts.

    Raises:
        CheckpointError: A file is missing, named with the shard and the fix.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> write_json(shard_dir(root, 0) / SHARD_JSON, {"inserts": 0})
        >>> check_shards(root, 1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        replaybank.errors.CheckpointError: ReplayService.restore(path=...): shard 0's file .../shard-000/times.npy is missing ...
    """  # noqa: E501
    for i in range(num_shards):
        where = shard_dir(Path(root), i)
        need = [(where / SHARD_JSON, "its counters"), (where / TIMES, "its sample counts"),
                (checkpoint_paths(where, BUFFER_PREFIX)[1], "its buffer's data")]
        for path, what in need:
            if not path.is_file():
                raise CheckpointError(
                    f"ReplayService.restore(path={str(root)!r}): shard {i}'s file {path} is "
                    f"missing ({what}), so the checkpoint is incomplete or was edited; "
                    "restore another checkpoint (e.g. an earlier one of checkpoint_dir)")


def begin(root: Path) -> None:
    """Prepare ``root`` for a new checkpoint: create it and remove an old ``DONE``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / _DONE).unlink(missing_ok=True)


def finish(root: Path, manifest: dict[str, Any], latest_dir: Path | None = None) -> None:
    """Write the manifest, then ``DONE``, then (with ``latest_dir``) ``LATEST``."""
    root = Path(root)
    write_json(root / MANIFEST, {"format": FORMAT, **manifest})
    write_json(root / _DONE, {"format": FORMAT})
    if latest_dir is not None:
        write_json(Path(latest_dir) / _LATEST, {"path": str(root.resolve())})


def read_manifest(root: Path) -> dict[str, Any]:
    """The manifest of the complete checkpoint at ``root``.

    Raises:
        CheckpointError: ``root`` has no ``DONE`` marker (an interrupted or unfinished
            checkpoint), or the manifest is missing, unreadable or of another format.
    """
    root = Path(root)
    if not root.is_dir():
        raise CheckpointError(f"ReplayService.restore(path={str(root)!r}): no such "
                              "directory; pass a folder written by service.checkpoint()")
    if not (root / _DONE).is_file():
        raise CheckpointError(
            f"ReplayService.restore(path={str(root)!r}): the checkpoint has no DONE marker, "
            "so it was interrupted before every shard and the manifest were written; "
            "restore an earlier checkpoint"
        )
    manifest = read_json(root / MANIFEST, "the service manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{root / MANIFEST}: not a {FORMAT} manifest; pass a folder "
                              "written by ReplayService.checkpoint()")
    return manifest


def latest(checkpoint_dir: Path) -> Path | None:
    """The latest complete checkpoint recorded in ``checkpoint_dir`` (None: none yet)."""
    path = Path(checkpoint_dir) / _LATEST
    if not path.is_file():
        return None
    entry = read_json(path, "the latest checkpoint's path")
    root = Path(entry["path"]) if isinstance(entry, dict) and "path" in entry else None
    if root is None or not (root / _DONE).is_file():
        return None
    return root
