"""Shared helpers of the seeded statistical tests."""

from __future__ import annotations

import math


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper 0.1% point of chi-square(df), Wilson-Hilferty approximation."""
    h = 2.0 / (9.0 * df)
    return float(df * (1.0 - h + z * math.sqrt(h)) ** 3)
