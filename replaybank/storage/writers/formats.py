"""What a stored field accepts as-is: the checks the lean and compiled writers make.

A value is written without conversion only when it already is exactly what the field
stores: a numpy array of the field's shape and dtype, or, for a scalar field, a Python or
numpy scalar that casts to the dtype exactly as the general (validating) path casts it.

Example:
    >>> import numpy as np
    >>> f = FieldFormat((), np.dtype(np.int8))
    >>> f.one(np.int8(3)), f.one(300), f.one(-5), f.one(1.5)
    (True, False, True, False)
    >>> f.many(np.zeros(4, np.int8), 4)
    True
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["FieldFormat", "canonical_bools", "count_nonzero", "scalar_types"]

ND = np.ndarray
_FLOAT_SCALARS = (float, np.float64, np.float32, np.float16)


def _raw_count_nonzero() -> Callable[[Any], int]:
    """numpy's C ``count_nonzero`` without the Python dispatch wrapper (~5x cheaper)."""
    for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            fn = getattr(importlib.import_module(mod), "count_nonzero", None)
        except ImportError:  # pragma: no cover - depends on the numpy version
            continue
        if callable(fn):
            return fn  # type: ignore[no-any-return]
    return np.count_nonzero  # pragma: no cover


count_nonzero = _raw_count_nonzero()


def canonical_bools(v: Any) -> bool:
    """Whether every byte of the bool array ``v`` is 0 or 1 (numpy lets other bytes
    through a view, e.g. ``np.array([2], np.uint8).view(bool)``; only the general path,
    which stores 0/1, takes such arrays).

    Example:
        >>> canonical_bools(np.ones(3, bool)), canonical_bools(np.array([2], np.uint8).view(bool))
        (True, False)
    """
    return not v.size or int(v.view(np.uint8).max()) <= 1


def scalar_types(dtype: np.dtype[Any]) -> tuple[type, ...]:
    """Python/numpy scalar types that cast to ``dtype`` exactly as the general path does.

    Python ints are not listed: they need a range check (see :class:`LaneWriter`).
    """
    if dtype.kind == "f":
        return (*_FLOAT_SCALARS, dtype.type)
    if dtype.kind == "b":
        return (bool, np.bool_)
    return (dtype.type,)  # ints: only the exact numpy type (no range check needed)


class FieldFormat:
    """What one stored field accepts: ``shape``, ``dtype``, scalar types, int range."""

    __slots__ = ("bools", "dtype", "hi", "lo", "scalars", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self.shape = shape
        self.dtype = dtype
        self.scalars = scalar_types(dtype) if shape == () else ()
        ints = shape == () and dtype.kind in "iu"
        self.lo = int(np.iinfo(dtype).min) if ints else 1
        self.hi = int(np.iinfo(dtype).max) if ints else 0
        self.bools = dtype.kind == "b"  # arrays must hold canonical 0/1 bytes

    def one(self, v: Any) -> bool:
        """Whether ``v`` is one step's value, stored without any conversion check."""
        tv = type(v)
        if tv is ND:
            return bool(v.shape == self.shape and v.dtype == self.dtype) and (
                not self.bools or canonical_bools(v))
        return tv in self.scalars or (tv is int and self.lo <= v <= self.hi)

    def many(self, v: Any, n: int) -> bool:
        """Whether ``v`` is an array of ``n`` steps of exactly this field."""
        return type(v) is ND and v.shape == (n, *self.shape) and v.dtype == self.dtype \
            and (not self.bools or canonical_bools(v))
