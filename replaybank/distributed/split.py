"""Global sampling over shards: split a batch by shard mass, merge with global weights.

A batch of ``B`` items is split across the live shards with one multinomial draw,
``counts ~ Multinomial(B, mass_s / sum(mass))``, where a shard's mass is its total
stored priority (prioritized samplers) or its size (uniform). Each shard then draws its
``counts[s]`` items with its own sampler, ``P(i | s) = p_i / total_s``, so every draw
picks item ``i`` with probability ``(total_s / total) * (p_i / total_s) = p_i / total``:
the distribution of one big buffer holding every shard's items.

:func:`merge` concatenates the shards' batches and, for prioritized samplers, replaces
each shard's local ``probabilities`` and ``weights`` with global ones computed from the
stored priority ``p_i`` of each drawn item and the global ``total``, size ``N`` and
smallest priority ``p_min`` (over every live shard): ``P(i) = p_i / total`` and the
weights of :func:`replaybank.samplers.prioritized.is_weights`, the formula one buffer
uses. (Per shard the draws are stratified; across shards they are not: each draw has
the single-buffer marginal, the joint law of a batch differs.)

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> split_counts(np.array([3.0, 0.0, 1.0]), 8, rng).sum()
    np.int64(8)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import EmptyBufferError
from replaybank.samplers.prioritized import is_weights

__all__ = ["merge", "split_counts", "split_distinct"]

IntArray = npt.NDArray[np.int64]


def split_counts(masses: npt.NDArray[np.float64], batch_size: int,
                 rng: np.random.Generator) -> IntArray:
    """Items per shard ``[S]``: ``Multinomial(batch_size, masses / masses.sum())``.

    Raises:
        EmptyBufferError: Every live shard's mass is 0 (nothing to draw).
    """
    total = float(np.sum(masses))
    if not total > 0.0:
        raise EmptyBufferError(
            f"sample(batch_size={batch_size}): the live shards hold nothing to draw "
            f"(masses {np.asarray(masses).tolist()}); add data, or wait for the writers"
        )
    return np.asarray(rng.multinomial(batch_size, np.asarray(masses) / total), np.int64)


def split_distinct(sizes: IntArray, batch_size: int, rng: np.random.Generator) -> IntArray:
    """Items per shard ``[S]`` of a uniform draw of ``batch_size`` *distinct* items:
    ``MultivariateHypergeometric(sizes, batch_size)``, the shard counts of a uniformly
    random subset of all items. Each shard then draws its count of distinct items
    uniformly, so the batch is a uniformly random subset, one buffer's
    ``sample(B, replace=False)`` law (a multinomial split is not: it can even ask a
    shard for more items than it holds).

    Raises:
        EmptyBufferError: The live shards hold fewer than ``batch_size`` items.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> c = split_distinct(np.array([3, 0, 5]), 8, rng)
        >>> c.tolist()
        [3, 0, 5]
    """
    sizes = np.asarray(sizes, np.int64)
    have = int(sizes.sum())
    if have < batch_size:
        raise EmptyBufferError(
            f"sample(batch_size={batch_size}, replace=False): the live shards hold {have} "
            f"items (sizes {sizes.tolist()}); lower batch_size or use replace=True")
    return np.asarray(rng.multivariate_hypergeometric(sizes, batch_size), np.int64)


def merge(parts: list[dict[str, Any]], masses: list[tuple[int, float, float]],
          beta: float | None, weight_norm: str | None) -> dict[str, Any]:
    """One batch's fields from the shards' replies.

    Args:
        parts: Each shard's reply (``fields``, ``priorities`` or None).
        masses: ``(size, total, p_min)`` of every live shard at the draw.
        beta: The IS exponent (prioritized samplers; None for uniform).
        weight_norm: The sampler's weight normalisation.

    Returns:
        Fields concatenated along the batch axis (shard order), with global
        ``probabilities`` and ``weights`` when the shards are prioritized.
    """
    names = list(parts[0]["fields"])
    fields = {k: np.concatenate([p["fields"][k] for p in parts], axis=0) for k in names}
    if beta is not None and parts[0]["priorities"] is not None:
        p = np.concatenate([q["priorities"] for q in parts])
        n = sum(m[0] for m in masses)
        total = float(sum(m[1] for m in masses))
        p_min = min(m[2] for m in masses)
        fields["probabilities"] = p / total
        fields["weights"] = is_weights(p, p_min, beta, weight_norm, n, total).astype(
            np.float32)
    return fields
