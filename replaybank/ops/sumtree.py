"""A wide (k-ary) sum tree and min tree as pure numpy functions over one flat array.

Layout: level ``0`` is the root, level ``D`` holds the ``fanout ** D >= n`` leaves. The
children of node ``i`` of level ``l`` are nodes ``i*K .. i*K+K-1`` of level ``l+1``,
stored side by side; every level starts at a multiple of ``K`` elements and the array
is 64-byte aligned, so with ``K = 8`` (float64) a node's children are one cache line
and with ``K = 16`` two adjacent lines. At one million leaves a ``K = 16`` tree is 5
levels deep where a binary tree is 20: a draw costs ~5 cache misses instead of ~20.

Leaves past ``n`` hold the reduction's identity (0 for sums, +inf for mins), so they
are never drawn. Every internal node is recomputed from its children (never updated by
a delta), in child order, so sums never drift and the C kernels of
:mod:`replaybank.ops.sumtree_c` and the numba kernels of :mod:`replaybank.ops.sumtree_numba`
give bit-identical results: these functions are their test oracle.

:func:`find` is clamped against round-off: it only ever descends into children with a
positive value, so a target at or past the total still returns a positive leaf.

Example:
    >>> import numpy as np
    >>> off = layout(5, fanout=4)
    >>> tree = new_tree(off, fill=0.0)
    >>> update(tree, off, 4, np.arange(5), np.array([1.0, 2.0, 3.0, 4.0, 0.0]))
    >>> float(total(tree, off))
    10.0
    >>> find(tree, off, 4, np.array([0.5, 1.0, 9.99, 50.0])).tolist()
    [0, 1, 3, 3]
    >>> float(range_reduce(tree, off, 4, 1, 3))
    5.0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from replaybank.ops.jit import pick_kernel

__all__ = [
    "FusedKernels",
    "Kernels",
    "build",
    "fused",
    "build_pair",
    "find",
    "kernels",
    "layout",
    "leaves",
    "new_tree",
    "range_min",
    "range_reduce",
    "total",
    "update",
    "update_pair",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

#: (find, update_pair) implementations: C or numba when available, else numpy.
Kernels = tuple[
    Callable[[FloatArray, IntArray, int, FloatArray], IntArray],
    Callable[[FloatArray, FloatArray, IntArray, int, IntArray, FloatArray], None],
]


def layout(n_leaves: int, fanout: int = 16) -> IntArray:
    """Level offsets of a k-ary tree over ``n_leaves`` leaves.

    Args:
        n_leaves: Number of leaves needed (>= 1).
        fanout: Children per node (>= 2).

    Returns:
        ``offsets`` ``[D + 2]``: level ``l`` occupies ``tree[offsets[l]:offsets[l] +
        fanout**l]``; ``offsets[D]`` is where the leaves start and ``offsets[D + 1]`` the
        array length.

    Example:
        >>> layout(5, fanout=4).tolist()  # root, 4 nodes, 16 leaves (each level K-aligned)
        [0, 4, 8, 24]
        >>> layout(1, fanout=4).tolist()  # depth >= 1
        [0, 4, 8]
    """
    if n_leaves < 1 or fanout < 2:
        raise ValueError(f"layout(n_leaves={n_leaves}, fanout={fanout}): need >= 1 and >= 2")
    depth = 1  # at least one internal level (the min tree stores internal levels only)
    while fanout**depth < n_leaves:
        depth += 1
    offs = [0]
    for lvl in range(depth + 1):
        end = offs[-1] + fanout**lvl
        offs.append(-(-end // fanout) * fanout)  # next level starts on a K boundary
    return np.asarray(offs, dtype=np.int64)


def new_tree(offsets: IntArray, fill: float = 0.0, internal_only: bool = False) -> FloatArray:
    """A 64-byte aligned float64 tree filled with ``fill`` (0 for sums, inf for mins).

    Args:
        offsets: From :func:`layout`.
        fill: Initial value of every node.
        internal_only: Allocate the internal levels only (a min tree, whose leaves are
            read from the sum tree's leaves).

    Example:
        >>> new_tree(layout(3, 2)).ctypes.data % 64
        0
    """
    n = int(offsets[-2] if internal_only else offsets[-1])
    raw = np.empty(n + 8, dtype=np.float64)
    start = (-raw.ctypes.data % 64) // 8
    tree = raw[start:start + n]
    tree[:] = fill
    return tree


def total(tree: FloatArray, offsets: IntArray) -> float:
    """The root: sum (or min) of all leaves."""
    return float(tree[int(offsets[0])])


def leaves(tree: FloatArray, offsets: IntArray) -> FloatArray:
    """View of the leaf level (``fanout ** D`` values, padding included)."""
    d = len(offsets) - 2
    return tree[int(offsets[d]):int(offsets[d + 1])]


def _reduce_children(tree: FloatArray, offsets: IntArray, fanout: int, lvl: int,
                     nodes: IntArray, op: str) -> FloatArray:
    """Reduce the children of ``nodes`` of level ``lvl`` in child order, ``[m]``.

    Sums use ``cumsum`` (strictly sequential, like the kernels' loop; ``sum`` would
    pair terms differently). ``op="minleaf"``: min over *sum-tree* leaves, 0 as +inf.
    """
    base = int(offsets[lvl + 1]) + nodes * fanout  # [m]
    block = tree[base[:, None] + np.arange(fanout)]  # [m, K]
    if op == "sum":
        return np.asarray(np.cumsum(block, axis=1)[:, -1], dtype=np.float64)
    if op == "minleaf":
        block = np.where(block > 0, block, np.inf)
    return np.asarray(block.min(axis=1), dtype=np.float64)


def build(tree: FloatArray, offsets: IntArray, fanout: int, values: FloatArray,
          op: str = "sum") -> None:
    """Set the first ``len(values)`` leaves and recompute every internal node.

    Example:
        >>> off = layout(4, 2); t = new_tree(off)
        >>> build(t, off, 2, np.array([1.0, 2.0, 3.0, 4.0])); total(t, off)
        10.0
    """
    d = len(offsets) - 2
    lv = leaves(tree, offsets)
    lv[:len(values)] = values
    for lvl in range(d - 1, -1, -1):
        nodes = np.arange(fanout**lvl, dtype=np.int64)
        tree[int(offsets[lvl]) + nodes] = _reduce_children(tree, offsets, fanout, lvl, nodes, op)


def _ancestors(idx: IntArray, fanout: int, depth: int) -> list[IntArray]:
    """Distinct ancestors of leaves ``idx`` per level, ``[depth - 1, ..., 0]`` order."""
    nodes = np.sort(np.asarray(idx, dtype=np.int64))
    out = []
    for _ in range(depth):
        nodes = nodes // fanout
        keep = np.ones(len(nodes), dtype=bool)
        keep[1:] = nodes[1:] != nodes[:-1]  # sorted: repeats are adjacent
        nodes = nodes[keep]
        out.append(nodes)
    return out


def update(tree: FloatArray, offsets: IntArray, fanout: int, idx: IntArray,
           values: FloatArray, op: str = "sum") -> None:
    """Set leaves ``idx`` to ``values`` (later duplicates win) and fix their ancestors.

    Args:
        tree: The tree array (modified in place).
        offsets: From :func:`layout`.
        fanout: Children per node.
        idx: Leaf indices ``[m]``.
        values: New leaf values ``[m]``.
        op: ``"sum"`` or ``"min"``.
    """
    d = len(offsets) - 2
    idx = np.asarray(idx, dtype=np.int64)
    tree[int(offsets[d]) + idx] = values
    for lvl, nodes in zip(range(d - 1, -1, -1), _ancestors(idx, fanout, d), strict=True):
        tree[int(offsets[lvl]) + nodes] = _reduce_children(tree, offsets, fanout, lvl, nodes, op)


def update_pair(sum_tree: FloatArray, min_tree: FloatArray, offsets: IntArray, fanout: int,
                idx: IntArray, values: FloatArray) -> None:
    """Update a sum tree and its min tree (internal levels only, see :func:`new_tree`).

    The min tree's leaves are the sum tree's, a zero counting as +inf: a zero priority
    is never drawn, so it takes no part in the minimum.
    """
    d = len(offsets) - 2
    idx = np.asarray(idx, dtype=np.int64)
    sum_tree[int(offsets[d]) + idx] = np.asarray(values, dtype=np.float64)
    for lvl, nodes in zip(range(d - 1, -1, -1), _ancestors(idx, fanout, d), strict=True):
        at = int(offsets[lvl]) + nodes
        sum_tree[at] = _reduce_children(sum_tree, offsets, fanout, lvl, nodes, "sum")
        src, op = (sum_tree, "minleaf") if lvl == d - 1 else (min_tree, "min")
        min_tree[at] = _reduce_children(src, offsets, fanout, lvl, nodes, op)


def build_pair(sum_tree: FloatArray, min_tree: FloatArray, offsets: IntArray, fanout: int,
               values: FloatArray) -> None:
    """Rebuild a sum tree and its min tree from the leaf ``values`` (rest zero)."""
    sum_tree[:] = 0.0
    min_tree[:] = np.inf
    build(sum_tree, offsets, fanout, np.asarray(values, dtype=np.float64), "sum")
    d = len(offsets) - 2
    for lvl in range(d - 1, -1, -1):
        nodes = np.arange(fanout**lvl, dtype=np.int64)
        src, op = (sum_tree, "minleaf") if lvl == d - 1 else (min_tree, "min")
        min_tree[int(offsets[lvl]) + nodes] = _reduce_children(src, offsets, fanout, lvl,
                                                               nodes, op)


def range_min(sum_tree: FloatArray, min_tree: FloatArray, offsets: IntArray, fanout: int,
              a: int, b: int) -> float:
    """Smallest positive leaf in ``[a, b)`` (inf if none), from a sum tree + its min tree.

    Example:
        >>> off = layout(8, 2); s = new_tree(off); m = new_tree(off, np.inf, True)
        >>> build_pair(s, m, off, 2, np.array([5.0, 0.0, 3.0, 4.0, 1.0, 2.0]))
        >>> range_min(s, m, off, 2, 0, 4), range_min(s, m, off, 2, 1, 2)
        (3.0, inf)
    """
    d = len(offsets) - 2
    lv = leaves(sum_tree, offsets)
    acc = np.inf
    a, b = int(a), int(b)
    for lvl in range(d, -1, -1):
        if a >= b:
            break
        a_up = min(-(-a // fanout) * fanout, b)
        b_dn = max(b // fanout * fanout, a_up)
        for lo, hi in ((a, a_up), (b_dn, b)):
            if hi > lo:
                if lvl == d:
                    part = lv[lo:hi]
                    part = part[part > 0]
                else:
                    base = int(offsets[lvl])
                    part = min_tree[base + lo:base + hi]
                if len(part):
                    acc = min(acc, float(part.min()))
        a, b = a_up // fanout, b_dn // fanout
    return float(acc)


def find(tree: FloatArray, offsets: IntArray, fanout: int, targets: FloatArray) -> IntArray:
    """Leaf of each target prefix mass: the first leaf ``i`` with ``cumsum[i] > target``.

    Only children with a positive value are ever chosen, so round-off (or a target at
    or past the total) can never return an empty leaf. The tree's total must be > 0.

    Args:
        tree: A sum tree.
        offsets: From :func:`layout`.
        fanout: Children per node.
        targets: Prefix masses ``[B]`` in ``[0, total)``.

    Returns:
        Leaf indices ``[B]``.
    """
    d = len(offsets) - 2
    t = np.array(targets, dtype=np.float64, copy=True).reshape(-1)  # [B]
    node = np.zeros(len(t), dtype=np.int64)
    rows = np.arange(len(t))
    ks = np.arange(fanout)
    for lvl in range(d):
        child = tree[int(offsets[lvl + 1]) + node[:, None] * fanout + ks]  # [B, K]
        cum = np.cumsum(child, axis=1)  # sequential, same order as the kernels
        j = np.sum(cum <= t[:, None], axis=1)
        last_nz = fanout - 1 - np.argmax(child[:, ::-1] > 0, axis=1)
        j = np.minimum(j, last_nz)
        before = np.where(j > 0, cum[rows, np.maximum(j - 1, 0)], 0.0)
        t = t - before
        node = node * fanout + j
    return node


def range_reduce(tree: FloatArray, offsets: IntArray, fanout: int, a: int, b: int,
                 op: str = "sum") -> float:
    """Sum (or min) of leaves ``[a, b)`` in ``O(fanout * depth)``.

    Example:
        >>> off = layout(8, 2); t = new_tree(off)
        >>> build(t, off, 2, np.arange(8.0)); range_reduce(t, off, 2, 3, 7)
        18.0
    """
    d = len(offsets) - 2
    red: Callable[[Any], Any] = np.sum if op == "sum" else np.min
    acc = 0.0 if op == "sum" else np.inf
    a, b = int(a), int(b)
    for lvl in range(d, -1, -1):
        if a >= b:
            break
        base = int(offsets[lvl])
        a_up = min(-(-a // fanout) * fanout, b)
        b_dn = max(b // fanout * fanout, a_up)
        parts = [tree[base + a:base + a_up], tree[base + b_dn:base + b]]
        for part in parts:
            if len(part):
                v = float(red(part))
                acc = acc + v if op == "sum" else min(acc, v)
        a, b = a_up // fanout, b_dn // fanout
    return float(acc)


def _numpy_kernels() -> Kernels:
    return find, update_pair


def kernels(prefer: str = "auto") -> tuple[Kernels, str]:
    """The fast path: the C kernels where built (``prefer="auto"``), else numba when it
    imports, else numpy.

    Args:
        prefer: ``"auto"``, ``"c"`` or ``"numba"`` (raise if unavailable) or ``"numpy"``.

    Returns:
        ``((find, update_pair), name)`` with name ``"c"``, ``"numba"`` or ``"numpy"``.

    Example:
        >>> (f, u), name = kernels("numpy"); name
        'numpy'
    """
    kernel, name = pick_kernel(prefer, "replaybank.ops.sumtree_numba", "KERNELS",
                               None, "kernels", compiled="replaybank.ops.sumtree_c")
    return (kernel if kernel is not None else _numpy_kernels()), name


class FusedKernels(Protocol):
    """The fused prioritized kernels of :mod:`replaybank.ops.sumtree_c` and
    :mod:`replaybank.ops.sumtree_numba` (same signatures and results)."""

    def sample_stratified(self, tree: FloatArray, min_tree: FloatArray, offsets: IntArray,
                          fanout: int, u: FloatArray, written: IntArray, counts: IntArray,
                          rows: int, beta: float, norm: int, n_items: int,
                          ) -> tuple[IntArray, FloatArray, FloatArray]: ...

    def transform(self, raw: FloatArray, eps: float, alpha: float
                  ) -> tuple[FloatArray, float]: ...

    def update_keys(self, sum_tree: FloatArray, min_tree: FloatArray, offsets: IntArray,
                    fanout: int, keys: IntArray, raw: FloatArray, written: IntArray,
                    counts: IntArray, rows: int, eps: float, alpha: float
                    ) -> tuple[int, float]: ...


def fused(name: str) -> FusedKernels | None:
    """The fused kernels that go with :func:`kernels`' ``name`` (None for numpy).

    Example:
        >>> fused("numpy") is None
        True
    """
    mod: FusedKernels | None = pick_kernel(name, "replaybank.ops.sumtree_numba", None, None,
                                           "fused", compiled="replaybank.ops.sumtree_c")[0]
    return mod
