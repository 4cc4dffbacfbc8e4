"""numba kernels of the k-ary sum tree (:mod:`replaybank.ops.sumtree` is their oracle).

Compiled once per machine (``cache=True`` stores the machine code next to this module
in ``__pycache__``); importing this module raises ImportError when numba is missing, and
:func:`replaybank.ops.sumtree.kernels` then falls back to numpy. The results are
bit-identical to the numpy functions: same traversal, same child order in every sum.

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

import numba
import numpy as np
import numpy.typing as npt

__all__ = ["KERNELS", "find", "sample_stratified", "transform", "update_keys", "update_pair"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# importance weights are clamped to the float32 range of normal numbers
_W_LO = float(np.finfo(np.float32).tiny)
_W_HI = float(np.finfo(np.float32).max)


@numba.njit(cache=True, nogil=True)
def _find(tree, offsets, fanout, targets, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    # level-major: the B loads of one level are independent, so the CPU overlaps their
    # cache misses (a draw-major loop would wait for each miss in turn)
    depth = offsets.shape[0] - 2
    n = targets.shape[0]
    t = targets.copy()
    for b in range(n):
        out[b] = 0
    touched = 0.0
    for lvl in range(depth):
        off = offsets[lvl + 1]
        # pass 1: branch-free loads of every draw's child block, so the cache misses
        # overlap; pass 2 then scans blocks that are already in cache
        if offsets[lvl + 2] - off > 32768:  # small levels stay in cache anyway
            for b in range(n):
                base = off + out[b] * fanout
                for c in range(0, fanout, 8):
                    touched += tree[base + c]
        for b in range(n):
            node = out[b]
            base = off + node * fanout
            tb = t[b]
            acc = 0.0
            c = 0
            while c < fanout - 1:
                nxt = acc + tree[base + c]
                if nxt > tb:
                    break
                acc = nxt
                c += 1
            if c == fanout - 1 and not (tree[base + c] > 0.0 and acc + tree[base + c] > tb):
                # round-off or a target past the total: the last positive child
                last = 0
                acc = 0.0
                before_last = 0.0
                for cc in range(fanout):
                    v = tree[base + cc]
                    if v > 0.0:
                        last = cc
                        before_last = acc
                    acc = acc + v
                c = last
                acc = before_last
            t[b] = tb - acc
            out[b] = node * fanout + c
    return touched


@numba.njit(cache=True, nogil=True)
def _update_pair(stree, mtree, offsets, fanout, idx, values):  # type: ignore[no-untyped-def]  # pragma: no cover
    # mtree holds the internal levels only; its leaves are the sum tree's (0 -> inf)
    depth = offsets.shape[0] - 2
    leaf0 = offsets[depth]
    n = idx.shape[0]
    for i in range(n):  # in order: a later duplicate wins
        stree[leaf0 + idx[i]] = values[i]
    # recompute each ancestor once: walk the leaves in sorted order and skip repeats
    # (stratified draws come back sorted, so this is usually a no-op check)
    nodes = idx.copy()
    for i in range(1, n):
        if nodes[i] < nodes[i - 1]:
            nodes = np.sort(idx)
            break
    for lvl in range(depth - 1, -1, -1):
        off = offsets[lvl + 1]
        poff = offsets[lvl]
        prev = -1
        for i in range(n):
            node = nodes[i] // fanout
            nodes[i] = node
            if node == prev:
                continue
            prev = node
            base = off + node * fanout
            s = stree[base]
            if lvl == depth - 1:
                m = s if s > 0.0 else np.inf
                for c in range(1, fanout):
                    v = stree[base + c]
                    s = s + v
                    m = min(m, v if v > 0.0 else np.inf)
            else:
                m = mtree[base]
                for c in range(1, fanout):
                    s = s + stree[base + c]
                    m = min(m, mtree[base + c])
            stree[poff + node] = s
            mtree[poff + node] = m


def find(tree: FloatArray, offsets: IntArray, fanout: int, targets: FloatArray) -> IntArray:
    """Compiled :func:`replaybank.ops.sumtree.find`."""
    out = np.empty(targets.shape[0], dtype=np.int64)
    _find(tree, offsets, fanout, np.ascontiguousarray(targets, dtype=np.float64), out)
    return out


def update_pair(sum_tree: FloatArray, min_tree: FloatArray, offsets: IntArray, fanout: int,
                idx: IntArray, values: FloatArray) -> None:
    """Compiled :func:`replaybank.ops.sumtree.update_pair`."""
    _update_pair(sum_tree, min_tree, offsets, fanout,
                 np.ascontiguousarray(idx, dtype=np.int64),
                 np.ascontiguousarray(values, dtype=np.float64))


@numba.njit(cache=True, nogil=True)
def _sample(tree, mtree, offsets, fanout, u, written, counts, rows, beta, norm, n_items,  # type: ignore[no-untyped-def]
            keys, probs, weights):  # pragma: no cover
    n = u.shape[0]
    lanes = written.shape[0]
    total = tree[offsets[0]]
    step = total / n
    targets = np.empty(n, dtype=np.float64)
    for b in range(n):
        targets[b] = (b + u[b]) * step
    slots = np.empty(n, dtype=np.int64)
    _find(tree, offsets, fanout, targets, slots)
    leaf0 = offsets[offsets.shape[0] - 2]
    p_min = mtree[offsets[0]]
    p_bmin = np.inf
    for b in range(n):
        s = slots[b]
        p = tree[leaf0 + s]
        probs[b] = p / total
        weights[b] = p
        p_bmin = min(p_bmin, p)
        row = s // lanes
        lane = s - row * lanes
        oldest = written[lane] - counts[lane]
        seq = oldest + (row - oldest) % rows
        keys[b] = seq * lanes + lane
    # ratios, as replaybank.samplers.prioritized.is_weights: "batch" divides by the batch
    # maximum as (p / min_batch p) ** -beta (no overflow); clamped to the float32 range
    for b in range(n):
        p = weights[b]
        if norm == 0:
            w = (p / p_min) ** -beta
        elif norm == 1:
            w = (p / p_bmin) ** -beta
        else:
            w = (n_items * (p / total)) ** -beta
        weights[b] = min(max(w, _W_LO), _W_HI)


@numba.njit(cache=True, nogil=True)
def _transform(raw, eps, alpha, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    m = 0.0
    for i in range(raw.shape[0]):
        v = (raw[i] + eps) ** alpha
        out[i] = v
        m = max(m, v)
    return m


def sample_stratified(tree: FloatArray, min_tree: FloatArray, offsets: IntArray, fanout: int,
                      u: FloatArray, written: IntArray, counts: IntArray, rows: int,
                      beta: float, norm: int, n_items: int,
                      ) -> tuple[IntArray, FloatArray, FloatArray]:
    """Fused stratified draw: targets ``(b + u_b) * total / B``, :func:`find`, then item
    keys, probabilities and IS weights (``norm``: 0 buffer, 1 batch, 2 none) in one pass.

    Equals the numpy path of
    :meth:`replaybank.samplers.prioritized.PrioritizedSampler.sample`.
    """
    n = u.shape[0]
    keys = np.empty(n, dtype=np.int64)
    probs = np.empty(n, dtype=np.float64)
    weights = np.empty(n, dtype=np.float64)
    _sample(tree, min_tree, offsets, fanout, np.ascontiguousarray(u, dtype=np.float64),
            np.ascontiguousarray(written, dtype=np.int64),
            np.ascontiguousarray(counts, dtype=np.int64), rows, float(beta), norm,
            n_items, keys, probs, weights)
    return keys, probs, weights


def transform(raw: FloatArray, eps: float, alpha: float) -> tuple[FloatArray, float]:
    """``(raw + eps) ** alpha`` and its maximum (0 for an empty input)."""
    out = np.empty(raw.shape[0], dtype=np.float64)
    m = _transform(np.ascontiguousarray(raw, dtype=np.float64), float(eps), float(alpha), out)
    return out, float(m)


@numba.njit(cache=True, nogil=True)
def _update_keys(stree, mtree, offsets, fanout, keys, raw, written, counts, rows, eps,  # type: ignore[no-untyped-def]
                 alpha):  # pragma: no cover
    lanes = written.shape[0]
    n = keys.shape[0]
    slots = np.empty(n, dtype=np.int64)
    vals = np.empty(n, dtype=np.float64)
    m = 0
    top = 0.0
    for i in range(n):
        k = keys[i]
        if k < 0:
            continue
        seq = k // lanes
        lane = k - seq * lanes
        if seq >= written[lane] or seq < written[lane] - counts[lane]:
            continue  # overwritten (stale) or cleared
        v = (raw[i] + eps) ** alpha
        slots[m] = (seq % rows) * lanes + lane
        vals[m] = v
        top = max(top, v)
        m += 1
    _update_pair(stree, mtree, offsets, fanout, slots[:m], vals[:m])
    return m, top


def update_keys(sum_tree: FloatArray, min_tree: FloatArray, offsets: IntArray, fanout: int,
                keys: IntArray, raw: FloatArray, written: IntArray, counts: IntArray,
                rows: int, eps: float, alpha: float) -> tuple[int, float]:
    """Fused priority update by item key: drop stale keys, map live ones to slots, store
    ``(raw + eps) ** alpha``. Returns ``(number applied, largest stored value)``."""
    m, top = _update_keys(sum_tree, min_tree, offsets, fanout,
                          np.ascontiguousarray(keys, dtype=np.int64),
                          np.ascontiguousarray(raw, dtype=np.float64),
                          np.ascontiguousarray(written, dtype=np.int64),
                          np.ascontiguousarray(counts, dtype=np.int64), rows, float(eps),
                          float(alpha))
    return int(m), float(top)

# the (find, update_pair) pair that replaybank.ops.sumtree.kernels() hands out
KERNELS = (find, update_pair)
