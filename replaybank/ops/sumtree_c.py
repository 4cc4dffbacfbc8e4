"""C kernels of the k-ary sum tree (``replaybank._sampling``; :mod:`replaybank.ops.sumtree`
is their oracle, :mod:`replaybank.ops.sumtree_numba` their numba twin).

The same functions, signatures and results (bit for bit) as the numba module, without a
JIT: the prioritized sampler's first draw in a process costs no compile or cache load.
Importing this module raises ImportError where the extension was not built (no C
compiler at install); :func:`replaybank.ops.sumtree.kernels` then takes numba or numpy.

Example:
    >>> import numpy as np
    >>> from replaybank.ops import sumtree
    >>> off = sumtree.layout(5, 4)
    >>> s, m = sumtree.new_tree(off), sumtree.new_tree(off, np.inf, internal_only=True)
    >>> update_pair(s, m, off, 4, np.arange(5), np.array([1.0, 2.0, 3.0, 4.0, 0.0]))
    >>> find(s, off, 4, np.array([0.5, 9.99])).tolist(), float(m[0])
    ([0, 3], 1.0)
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import numpy.typing as npt

# the C extension (ImportError where it was not built); loaded by name, as a module of
# this layer: the package root above it is not imported for it
_sampling: Any = importlib.import_module("replaybank._sampling")

__all__ = ["KERNELS", "find", "sample_stratified", "transform", "update_keys", "update_pair"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

_f64, _i64 = np.float64, np.int64


def find(tree: FloatArray, offsets: IntArray, fanout: int, targets: FloatArray) -> IntArray:
    """Compiled :func:`replaybank.ops.sumtree.find`."""
    t = np.ascontiguousarray(targets, dtype=_f64).reshape(-1)
    out = np.empty(t.shape[0], dtype=_i64)
    _sampling.find(tree, offsets, fanout, t, out)
    return out


def update_pair(sum_tree: FloatArray, min_tree: FloatArray, offsets: IntArray, fanout: int,
                idx: IntArray, values: FloatArray) -> None:
    """Compiled :func:`replaybank.ops.sumtree.update_pair` (raises IndexError for a leaf
    outside the tree)."""
    _sampling.update_pair(sum_tree, min_tree, offsets, fanout,
                          np.ascontiguousarray(idx, dtype=_i64).reshape(-1),
                          np.ascontiguousarray(values, dtype=_f64).reshape(-1))


def sample_stratified(tree: FloatArray, min_tree: FloatArray, offsets: IntArray, fanout: int,
                      u: FloatArray, written: IntArray, counts: IntArray, rows: int,
                      beta: float, norm: int, n_items: int,
                      ) -> tuple[IntArray, FloatArray, FloatArray]:
    """Fused stratified draw (:func:`replaybank.ops.sumtree_numba.sample_stratified`):
    targets ``(b + u_b) * total / B``, their leaves, item keys, ``P(i)`` and IS weights
    (``norm``: 0 buffer, 1 batch, 2 none)."""
    n = len(u)
    keys = np.empty(n, dtype=_i64)
    probs = np.empty(n, dtype=_f64)
    weights = np.empty(n, dtype=_f64)
    try:  # the usual call: arrays of the right kind as they are (the kernel checks them)
        _sampling.sample(tree, min_tree, offsets, fanout, u, written, counts, rows, beta,
                         norm, n_items, keys, probs, weights)
    except TypeError:  # array-likes, other dtypes or strides: converted, as the twins do
        _sampling.sample(tree, min_tree, offsets, fanout,
                         np.ascontiguousarray(u, dtype=_f64).reshape(-1),
                         np.ascontiguousarray(written, dtype=_i64),
                         np.ascontiguousarray(counts, dtype=_i64), int(rows), float(beta),
                         int(norm), int(n_items), keys, probs, weights)
    return keys, probs, weights


def transform(raw: FloatArray, eps: float, alpha: float) -> tuple[FloatArray, float]:
    """``(raw + eps) ** alpha`` and its maximum (0 for an empty input)."""
    r = np.ascontiguousarray(raw, dtype=_f64).reshape(-1)
    out = np.empty(r.shape[0], dtype=_f64)
    top = _sampling.transform(r, float(eps), float(alpha), out)
    return out, float(top)


def update_keys(sum_tree: FloatArray, min_tree: FloatArray, offsets: IntArray, fanout: int,
                keys: IntArray, raw: FloatArray, written: IntArray, counts: IntArray,
                rows: int, eps: float, alpha: float) -> tuple[int, float]:
    """Fused priority update by item key: drop stale keys, map live ones to slots, store
    ``(raw + eps) ** alpha``. Returns ``(number applied, largest stored value)``."""
    try:  # the usual call: arrays of the right kind as they are (the kernel checks them
        # all before it writes anything)
        m, top = _sampling.update_keys(sum_tree, min_tree, offsets, fanout, keys, raw,
                                       written, counts, rows, eps, alpha)
    except TypeError:  # array-likes, other dtypes or strides: converted, as the twins do
        m, top = _sampling.update_keys(sum_tree, min_tree, offsets, fanout,
                                       np.ascontiguousarray(keys, dtype=_i64).reshape(-1),
                                       np.ascontiguousarray(raw, dtype=_f64).reshape(-1),
                                       np.ascontiguousarray(written, dtype=_i64),
                                       np.ascontiguousarray(counts, dtype=_i64), int(rows),
                                       float(eps), float(alpha))
    return int(m), float(top)


# the (find, update_pair) pair that replaybank.ops.sumtree.kernels() hands out
KERNELS = (find, update_pair)
