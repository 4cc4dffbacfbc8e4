"""Shared helpers of the seeded statistical tests."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper 0.1% point of chi-square(df), Wilson-Hilferty approximation."""
    h = 2.0 / (9.0 * df)
    return float(df * (1.0 - h + z * math.sqrt(h)) ** 3)


def hypergeometric_cells(counts: Any, good: int, bad: int,
                         draws: int) -> tuple[np.ndarray, np.ndarray]:
    """Observed and expected cells of ``counts`` (how many of ``draws`` distinct items
    came from the ``good`` ones, of ``good + bad``, per trial) against the hypergeometric
    law, the cells expecting 5 or fewer pooled into one (for a chi-square test)."""
    counts = np.asarray(counts)
    k = np.arange(max(0, draws - bad), min(good, draws) + 1)
    pmf = np.array([math.comb(good, v) * math.comb(bad, draws - v) for v in k]) \
        / math.comb(good + bad, draws)
    expected = pmf * len(counts)
    observed = np.array([(counts == v).sum() for v in k], float)
    keep = expected > 5
    return (np.r_[observed[keep], observed[~keep].sum()],
            np.r_[expected[keep], expected[~keep].sum()])


def successive_inclusion(weights: Any, draws: int, sims: int = 100_000,
                         seed: int = 1) -> np.ndarray:
    """``[n]``: each item's probability of being in a successive sample of ``draws`` of
    the ``n`` items (each next drawn in proportion to its weight among those not drawn
    yet), estimated by ``sims`` Gumbel top-k draws (independent of the code under test)."""
    w = np.asarray(weights, np.float64)
    rng = np.random.default_rng(seed)
    keys = np.log(w)[None, :] + rng.gumbel(size=(sims, len(w)))
    top = np.argpartition(-keys, draws - 1, axis=1)[:, :draws]
    return np.bincount(top.ravel(), minlength=len(w)) / sims
