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

Distinct items (``replace=False``) cannot be split by a multinomial draw: it may ask a
shard for more items than it holds, and it is not one buffer's law.
:func:`check_distinct` refuses a batch larger than the shards can give (before anything
is drawn). Uniform: :func:`split_distinct`, the multivariate hypergeometric split (one
buffer's law exactly). Prioritized, one buffer's successive sampling (each next item
drawn in proportion to priority among those not drawn yet): :func:`split_successive`
decides how many of each shard's own successive draws the batch takes, exactly that
law; where shards may not draw spare items (rate limits, ``max_times_sampled``),
:func:`split_depleting` splits by the shards' masses depleted as items are taken, that
law when priorities are equal within each shard and approximately otherwise.
Distinct sequence windows (``sample_sequences(replace=False)``) are split by the same
functions over each shard's *servable* window starts (usable, of positive priority) and
their mass, in place of its items: one buffer's successive sampling over usable starts.

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
from replaybank.samplers.sample_args import empty_buffer_message

__all__ = ["check_distinct", "check_held", "merge", "split_counts", "split_depleting",
           "split_distinct", "split_successive"]

IntArray = npt.NDArray[np.int64]


def check_held(sizes: Any, call: str, shards: str = "the live shards") -> None:
    """Refuse a draw from shards that hold nothing, in a local buffer's words
    (:func:`~replaybank.samplers.sample_args.empty_buffer_message`).

    Args:
        sizes: ``[S]`` items each shard holds.
        call: The call as the message names it (``"sample(batch_size=8)"``).
        shards: Which shards these are, for the message.

    Raises:
        EmptyBufferError: Every shard's size is 0.

    Example:
        >>> check_held([0, 0], "sample(batch_size=8)")
        Traceback (most recent call last):
        ...
        replaybank.errors.EmptyBufferError: sample(batch_size=8): the buffer is empty; add \
transitions first, or wait for the writers' rows (the live shards hold 0 items)
    """
    if int(np.sum(sizes)) == 0:
        raise EmptyBufferError(empty_buffer_message(
            call, f", or wait for the writers' rows ({shards} hold 0 items)"))


def split_counts(masses: npt.NDArray[np.float64], batch_size: int,
                 rng: np.random.Generator, call: str = "") -> IntArray:
    """Items per shard ``[S]``: ``Multinomial(batch_size, masses / masses.sum())``.

    Args:
        masses: ``[S]`` each shard's total mass (items, or total priority).
        batch_size: Items to split.
        rng: The client's generator.
        call: The call as the message names it (default ``sample(batch_size=B)``);
            refuse an empty buffer first with :func:`check_held`.

    Raises:
        EmptyBufferError: Every live shard's mass is 0 (nothing to draw).
    """
    total = float(np.sum(masses))
    if not total > 0.0:
        raise EmptyBufferError(
            f"{call or f'sample(batch_size={batch_size})'}: the live shards hold nothing to draw "
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
    check_distinct(batch_size, sizes, sizes)
    return np.asarray(rng.multivariate_hypergeometric(sizes, batch_size), np.int64)


def check_distinct(batch_size: int, sizes: IntArray, distinct: IntArray,
                   shards: str = "the live shards", *, call: str | None = None,
                   servable: str = "have a positive priority", fixes: str = "") -> None:
    """Refuse a ``replace=False`` batch larger than the shards can give.

    Args:
        batch_size: The call's ``batch_size``.
        sizes: ``[S]`` sampleable items per shard.
        distinct: ``[S]`` items per shard a distinct draw may take (prioritized: those
            with a positive priority; windows: the servable starts).
        shards: Which shards these are, for the message.
        call: The call as the message names it (default ``sample(batch_size=B,
            replace=False)``).
        servable: What the items a distinct draw may take do, for the message.
        fixes: More ways out, appended to the message (``", or ..."``).

    Raises:
        EmptyBufferError: ``batch_size`` exceeds the shards' distinct items (the message
            names ``batch_size`` and the totals).

    Example:
        >>> check_distinct(8, np.array([3, 5]), np.array([3, 5]))
        >>> check_distinct(9, np.array([3, 5]), np.array([3, 5]))
        Traceback (most recent call last):
        ...
        replaybank.errors.EmptyBufferError: sample(batch_size=9, replace=False): the live \
shards hold 8 items (sizes [3, 5]); lower batch_size to at most 8 or use replace=True
    """
    sizes = np.asarray(sizes, np.int64)
    distinct = np.asarray(distinct, np.int64)
    have, can = int(sizes.sum()), int(distinct.sum())
    if can >= batch_size:
        return
    call = call or f"sample(batch_size={batch_size}, replace=False)"
    check_held(sizes, call, shards)
    head = f"{call}: {shards} hold {have} items (sizes {sizes.tolist()})"
    if can < have:
        head += (f", of which {can} {servable} (per shard {distinct.tolist()}; the others "
                 "are never drawn)")
    if can == 0:
        raise EmptyBufferError(f"{head}; add data first, or wait for the writers{fixes}")
    raise EmptyBufferError(f"{head}; lower batch_size to at most {can} or use "
                           f"replace=True{fixes}")


def split_depleting(totals: npt.NDArray[np.float64], distinct: IntArray, batch_size: int,
                    rng: np.random.Generator) -> IntArray:
    """Items per shard ``[S]`` of a prioritized distinct draw, split before any shard
    draws (where shards may not draw spares).

    Shard labels are drawn one at a time, shard ``s`` with weight ``total_s * (n_s -
    c_s) / n_s`` (``n_s`` its distinct items, ``c_s`` those taken so far): the mass it
    would have left if each taken item had its mean priority, 0 once all are taken. That
    is one buffer's successive-sampling law of the counts when priorities are equal
    within each shard (uniform: the multivariate hypergeometric), the multinomial by
    mass while ``batch_size`` is small against the shards, and never more than a shard
    holds.

    Args:
        totals: ``[S]`` each shard's total stored priority.
        distinct: ``[S]`` each shard's items with a positive priority.
        batch_size: B.
        rng: The client's split generator.

    Returns:
        ``[S]`` counts summing to ``batch_size``, each at most the shard's ``distinct``.

    Raises:
        EmptyBufferError: The shards hold fewer than ``batch_size`` distinct items
            (nothing is drawn from ``rng``).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> split_depleting(np.array([30.0, 1.0]), np.array([3, 5]), 8, rng).tolist()
        [3, 5]
    """
    distinct = np.asarray(distinct, np.int64)
    check_distinct(batch_size, distinct, distinct)
    mean = np.divide(np.asarray(totals, np.float64), distinct,
                     out=np.zeros(len(distinct)), where=distinct > 0)
    counts = np.zeros(len(distinct), np.int64)
    for u in rng.random(batch_size):
        cum = np.cumsum(mean * (distinct - counts))
        if not cum[-1] > 0.0:  # only items of zero mean priority left: by count
            cum = np.cumsum(distinct - counts).astype(np.float64)
        counts[int(np.searchsorted(cum, u * cum[-1], side="right"))] += 1
    return counts


def split_successive(priorities: list[npt.NDArray[np.float64]], totals: list[float],
                     batch_size: int, rng: np.random.Generator) -> IntArray:
    """How many of each shard's successive draws one buffer's successive sampling over
    every shard's items takes: ``[S]`` counts, a prefix of each shard's draws.

    One buffer draws each next item in proportion to its priority among the items not
    drawn yet; equivalently, it picks a shard in proportion to the mass the shard has not
    given yet, then that shard's next item in its own successive sampling. So when each
    shard has drawn its own successive sample (``priorities[s]``: the stored priorities
    of its draws in draw order, ``min(batch_size, its distinct items)`` of them) and
    reported its ``totals[s]`` at that draw, labels drawn one at a time in proportion
    to ``total_s`` minus the priorities of its draws taken so far (at least those of its
    draws not taken, against rounding; 0 once its draws are used up) give the batch
    exactly one buffer's law.

    Args:
        priorities: Per shard, the stored priorities of its draws, in draw order.
        totals: Per shard, its total stored priority at the draw.
        batch_size: B.
        rng: The client's split generator.

    Returns:
        ``[S]`` counts summing to ``batch_size``: the batch takes the first ``counts[s]``
        draws of shard ``s``.

    Raises:
        EmptyBufferError: The shards drew fewer than ``batch_size`` items (nothing is
            drawn from ``rng``).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> split_successive([np.array([4.0, 1.0]), np.array([2.0])], [5.0, 2.0], 3,
        ...                  rng).tolist()
        [2, 1]
    """
    m = [len(p) for p in priorities]
    tails = [np.r_[np.cumsum(np.asarray(p, np.float64)[::-1])[::-1], 0.0].tolist()
             for p in priorities]
    left = [float(t) for t in totals]
    taken = [0] * len(priorities)
    if sum(m) < batch_size:
        raise EmptyBufferError(
            f"sample(batch_size={batch_size}, replace=False): the shards drew {sum(m)} "
            "distinct items; lower batch_size or use replace=True")
    for u in rng.random(batch_size).tolist():
        weights = [max(left[s], tails[s][taken[s]]) if taken[s] < m[s] else 0.0
                   for s in range(len(m))]
        target = u * sum(weights)
        pick, acc = -1, 0.0
        for s, w in enumerate(weights):
            if w > 0.0:  # the last shard with mass left, should rounding pass the sum
                pick, acc = s, acc + w
                if acc > target:
                    break
        if pick < 0:  # only zero priorities left in the draws: take them in shard order
            pick = next(s for s in range(len(m)) if taken[s] < m[s])
        left[pick] -= float(priorities[pick][taken[pick]])
        taken[pick] += 1
    return np.asarray(taken, np.int64)


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
