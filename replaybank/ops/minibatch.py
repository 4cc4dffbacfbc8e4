"""Index arithmetic of on-policy minibatches: shuffled splits and per-env time chunks.

Rollout data is ``[T, num_envs]``; its flat index is ``i = t * num_envs + env`` (the
row-major order of the storage arrays), so ``data.reshape(T * num_envs, ...)[i]`` is step
``t`` of env ``env``.

Example:
    >>> import numpy as np
    >>> parts = split_minibatches(10, np.random.default_rng(0), num_mini_batch=3)
    >>> [len(p) for p in parts], sorted(np.concatenate(parts).tolist()) == list(range(10))
    ([4, 3, 3], True)
    >>> t, env, valid = time_chunks(5, 2, 2)
    >>> t.tolist(), env.tolist(), valid[-1].tolist()
    ([[0, 1], [2, 3], [4, 4], [0, 1], [2, 3], [4, 4]], [0, 0, 0, 1, 1, 1], [True, False])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import ConfigError, EmptyBufferError

__all__ = ["minibatch_count", "split_minibatches", "time_chunks"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigError(f"{name}={value!r}: must be a positive int")
    return int(value)


def minibatch_count(n: int, num_mini_batch: Any = None, mini_batch_size: Any = None,
                    unit: str = "steps", call: str = "generate_batches") -> int:
    """Validate the two size arguments (exactly one given) and return the number of parts.

    Args:
        n: Number of items to split.
        num_mini_batch: Number of minibatches per epoch.
        mini_batch_size: Items per minibatch (the last one may be smaller).
        unit: What an item is, for messages (``"steps"``, ``"chunks"``).
        call: Name of the calling method, for messages.

    Returns:
        The number of minibatches per epoch.

    Raises:
        ConfigError: Neither or both sizes given, or a size that is not a positive int.
        EmptyBufferError: More minibatches than items (or no items at all).

    Example:
        >>> minibatch_count(10, mini_batch_size=4)
        3
    """
    if (num_mini_batch is None) == (mini_batch_size is None):
        raise ConfigError(
            f"{call}(num_mini_batch={num_mini_batch!r}, mini_batch_size={mini_batch_size!r}):"
            " give exactly one of the two (the other follows from the rollout size)"
        )
    if n <= 0:
        raise EmptyBufferError(f"{call}: the buffer holds no {unit}; add data first")
    if num_mini_batch is not None:
        k = _positive("num_mini_batch", num_mini_batch)
        if k > n:
            raise EmptyBufferError(
                f"{call}(num_mini_batch={k}): only {n} {unit} to split; use at most {n} "
                "minibatches or collect more data"
            )
        return k
    size = _positive("mini_batch_size", mini_batch_size)
    return -(-n // size)


def split_minibatches(n: int, rng: np.random.Generator, num_mini_batch: Any = None,
                      mini_batch_size: Any = None, unit: str = "steps",
                      call: str = "generate_batches") -> list[IntArray]:
    """Shuffle ``range(n)`` and split it into minibatches covering every item exactly once.

    With ``num_mini_batch=k`` the parts differ in size by at most one (larger ones first);
    with ``mini_batch_size=s`` every part has ``s`` items except possibly the last.

    Args:
        n: Number of items.
        rng: Generator that draws the permutation.
        num_mini_batch: Number of parts (exactly one of the two sizes).
        mini_batch_size: Items per part.
        unit: What an item is, for messages.
        call: Name of the calling method, for messages.

    Returns:
        List of int64 index arrays whose concatenation is a permutation of ``range(n)``.

    Raises:
        ConfigError, EmptyBufferError: See :func:`minibatch_count`.

    Example:
        >>> [len(p) for p in split_minibatches(7, np.random.default_rng(1), mini_batch_size=3)]
        [3, 3, 1]
    """
    k = minibatch_count(n, num_mini_batch, mini_batch_size, unit, call)
    perm = rng.permutation(n).astype(np.int64)
    if num_mini_batch is not None:
        return list(np.array_split(perm, k))
    size = int(mini_batch_size)
    return [perm[i:i + size] for i in range(0, n, size)]


def time_chunks(num_steps: int, num_envs: int,
                chunk_length: int) -> tuple[IntArray, IntArray, BoolArray]:
    """Cut every env's timeline ``[0, num_steps)`` into consecutive chunks.

    Chunk ``c`` of env ``e`` covers steps ``[c * L, min((c + 1) * L, num_steps))``; the last
    chunk of an env is padded (``valid`` False, the time index repeats the last step).
    Chunks are ordered env-major: ``env = chunk // chunks_per_env``.

    Args:
        num_steps: Steps per env ``T``.
        num_envs: Number of envs.
        chunk_length: Steps per chunk ``L``.

    Returns:
        ``(t, env, valid)``: time index ``[C, L]``, env ``[C]`` and validity ``[C, L]``
        where ``C = num_envs * ceil(T / L)``.

    Example:
        >>> t, env, valid = time_chunks(4, 1, 2)
        >>> t.tolist(), valid.all()
        ([[0, 1], [2, 3]], np.True_)
    """
    per_env = -(-num_steps // chunk_length)
    t = np.arange(per_env * chunk_length, dtype=np.int64).reshape(per_env, chunk_length)
    valid = t < num_steps  # [per_env, L]
    t = np.minimum(t, num_steps - 1)
    env = np.repeat(np.arange(num_envs, dtype=np.int64), per_env)  # [C]
    return np.tile(t, (num_envs, 1)), env, np.tile(valid, (num_envs, 1))
