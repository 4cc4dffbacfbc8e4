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

__all__ = ["FieldFormat", "ObsLayout", "canonical_bools", "count_nonzero", "scalar_types"]

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


class ObsLayout:
    """Where a table's observation fields come from in a call's ``obs`` / ``next_obs``.

    A flat observation (the one field ``obs``) is the value itself; the fields
    ``obs/<key>[/<key>...]`` of a dict observation are found in nested plain dicts whose
    keys are exactly the table's (a missing or extra key, or a dict subclass or another
    mapping, is not for the lean and compiled writers: the general path takes the call).

    Args:
        obs_fields: The table's observation field names (``obs`` or ``obs/...``).

    Attributes:
        names: The observation field names, in table order.
        flat: The observation is the one field ``obs``.
        keys: The dict keys of a one-level dict observation (``obs/<key>`` fields, in
            table order), else None.
        valid: The names form a tree of dicts (else no lean or compiled writer serves it).

    Example:
        >>> lay = ObsLayout(["obs/pos", "obs/goal/xy"])
        >>> a, b = np.zeros(2), np.ones(2)
        >>> [x.tolist() for x in lay.parts({"goal": {"xy": b}, "pos": a})]
        [[0.0, 0.0], [1.0, 1.0]]
        >>> lay.parts({"goal": {"xy": b}, "pos": a, "x": a}) is None, lay.keys
        (True, None)
    """

    __slots__ = ("flat", "keys", "names", "tree", "valid")

    def __init__(self, obs_fields: list[str]) -> None:
        self.names = tuple(obs_fields)
        self.flat = self.names == ("obs",)
        tree: dict[str, Any] = {}
        valid = bool(self.names) and not self.flat
        for i, name in enumerate(self.names if valid else ()):
            path = name.split("/")
            if path[0] != "obs" or len(path) < 2:
                valid = False
                break
            node = tree
            for key in path[1:-1]:
                node = node.setdefault(key, {})
                if not isinstance(node, dict):
                    valid = False
                    break
            if not valid or path[-1] in node:
                valid = False
                break
            node[path[-1]] = i
        self.valid = self.flat or valid
        self.tree = tree
        self.keys = tuple(tree) if valid and all(type(v) is int for v in tree.values()) \
            else None

    def parts(self, obs: Any) -> list[Any] | None:
        """The values of the observation fields in table order (not yet checked), or None
        when ``obs`` is not a tree of plain dicts with exactly the table's keys."""
        if self.flat:
            return [obs]
        out: list[Any] = [None] * len(self.names)
        return out if _walk(obs, self.tree, out) else None


def _walk(v: Any, tree: dict[str, Any], out: list[Any]) -> bool:
    if type(v) is not dict or len(v) != len(tree):
        return False
    for key, sub in tree.items():
        x = v.get(key, _MISSING)
        if x is _MISSING:
            return False
        if type(sub) is int:
            out[sub] = x
        elif not _walk(x, sub, out):
            return False
    return True


_MISSING = object()
