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
