"""Exact resume of disk-backed (memmap) buffers: generator and sampler state by the files.

A memmap buffer keeps its data, links and lane counters in files that are always
consistent (:mod:`replaybank.storage.memmap`), but the next sample also depends on the
generator state and the sampler's state (e.g. PER priorities), which live in memory.
:func:`save_resume` (``buf.flush()``) syncs the files and saves that state, with the lane
counters it belongs to and the buffer's id, as an atomic checkpoint
(``replaybank_resume_metadata.json`` + ``replaybank_resume_state.safetensors``, see
:mod:`replaybank.io.checkpoint`) in the buffer's directory.

:func:`load_resume`, called by ``ReplayBuffer.open(path)``, restores it when it belongs
to this buffer and the files hold exactly the steps they held at that flush (the same
``written``, ``counts`` and ``episodes`` per lane): the reopened buffer then draws the
identical next sample. When steps were added or the buffer was cleared after the last
flush, the saved state no longer describes the data; the reopened buffer keeps a fresh
generator and the sampler's default state (as without a flush) and warns. A typical
use is a preemptible job that calls ``flush()`` on its shutdown signal.

Example:
    >>> import tempfile, numpy as np
    >>> import replaybank as rb
    >>> d = tempfile.mkdtemp()
    >>> buf = rb.PrioritizedReplayBuffer(32, storage="memmap", path=d, seed=0)
    >>> for t in range(10):
    ...     buf.add(obs=np.full(2, t, np.float32), action=0, reward=1.0,
    ...             next_obs=np.full(2, t + 1, np.float32), terminated=False, truncated=False)
    >>> _ = buf.update_priorities(np.arange(10), np.arange(10.0))
    >>> buf.flush()
    >>> again = rb.ReplayBuffer.open(d)
    >>> a, b = buf.sample(4), again.sample(4)
    >>> a.indices.tolist() == b.indices.tolist(), bool(np.allclose(a.weights, b.weights))
    (True, True)
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from replaybank.buffers.replay_state import rng_state
from replaybank.buffers.sequence_buffer import SequenceReplayBuffer
from replaybank.errors import CheckpointError, ConfigError
from replaybank.io.checkpoint import load_state, save_state
from replaybank.io.manifest import checkpoint_paths
from replaybank.storage.memmap import RESUME_PREFIX, MemmapBackend

__all__ = ["ResumeWarning", "load_resume", "save_resume"]

_KIND = "replaybank.memmap_resume"
_COUNTERS = ("written", "counts", "episodes")


class ResumeWarning(UserWarning):
    """A reopened memmap buffer could not restore the state of its last ``flush()``."""


def _inner(buf: Any) -> Any:
    return buf.buffer if isinstance(buf, SequenceReplayBuffer) else buf


def _memmap(buf: Any) -> MemmapBackend | None:
    backend = getattr(buf, "backend", None)
    return backend if isinstance(backend, MemmapBackend) else None


def save_resume(buf: Any) -> Path | None:
    """Sync a memmap buffer's files and save its generator and sampler state by them.

    Args:
        buf: A ``ReplayBuffer`` (or ``SequenceReplayBuffer``) with ``storage="memmap"``.

    Returns:
        The resume manifest's path, or None when nothing was ever added (no files to
        resume yet).

    Raises:
        ConfigError: The buffer's storage is not memmap (use ``save(dirpath)``).
        CheckpointError: The state could not be written (the previous one is kept).
    """
    inner = _inner(buf)
    backend = _memmap(inner)
    if backend is None:
        raise ConfigError(
            f"flush(): {type(buf).__name__} with {getattr(inner, 'backend', None)!r} storage "
            "has no files to resume from; flush() is for storage='memmap' buffers, use "
            "save(dirpath) to checkpoint an in-memory buffer"
        )
    table = inner._table
    if table is None:
        return None
    backend.flush()
    state = {
        "rng": rng_state(inner.rng),
        "sampler": inner.sampler.state_dict(),
        **{name: np.array(getattr(table, name), dtype=np.int64) for name in _COUNTERS},
    }
    return save_state(state, backend.path, prefix=RESUME_PREFIX,
                      info={"kind": _KIND, "buffer_id": backend.buffer_id})


def load_resume(buf: Any) -> bool:
    """Restore the generator and sampler state of the last :func:`save_resume`.

    Args:
        buf: A memmap buffer just rebuilt from its files (``open_buffer``).

    Returns:
        True when restored; False when there is nothing to restore or it no longer fits
        (a :class:`ResumeWarning` says why in the second case).
    """
    inner = _inner(buf)
    backend = _memmap(inner)
    table = inner._table
    if backend is None or table is None:
        return False
    meta, _ = checkpoint_paths(backend.path, RESUME_PREFIX)
    if not meta.exists():
        return False
    try:
        manifest, state = load_state(backend.path, RESUME_PREFIX)
    except CheckpointError as exc:
        return _skip(backend.path, f"its resume state cannot be read ({exc})")
    if manifest.get("kind") != _KIND or manifest.get("buffer_id") != backend.buffer_id:
        return _skip(backend.path, "its resume state belongs to another buffer")
    for name in _COUNTERS:
        saved = np.asarray(state.get(name))
        if saved.shape != getattr(table, name).shape or \
                not np.array_equal(saved, getattr(table, name)):
            return _skip(backend.path, "steps were added (or the buffer cleared) after its "
                                       "last flush()")
    inner.sampler.load_state_dict(state["sampler"])
    inner.rng.bit_generator.state = state["rng"]
    return True


def _skip(path: Path, why: str) -> bool:
    warnings.warn(
        f"memmap buffer at {path}: {why}; it continues with every stored step but a fresh "
        "generator and default sampler state (e.g. priorities). Call flush() after the "
        "last add (e.g. on a shutdown signal) to resume exactly",
        ResumeWarning, stacklevel=3,
    )
    return False
