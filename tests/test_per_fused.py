"""The C prioritized kernels' fast paths (branch-free descent, the fanout-16 instance,
running sums shared by consecutive draws at one node, division-free slot and key
arithmetic for one lane, grouped tree refreshes) against the numpy oracle of
:mod:`replaybank.ops.sumtree`, bit for bit, on random trees, targets and ring states."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybank.ops import sumtree

c = pytest.importorskip("replaybank.ops.sumtree_c")

FANOUTS = [2, 3, 5, 8, 16, 32, 64]


def tree(n: int, fanout: int, rng: np.random.Generator, zeros: float
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A sum tree and min tree over ``n`` random leaves, a fraction ``zeros`` of them 0
    (in runs, so whole nodes are empty), and at least one positive."""
    v = rng.random(n) * 10.0 ** rng.integers(-3, 4, n)
    runs = rng.random(n // 7 + 1) < zeros
    v[np.repeat(runs, 7)[:n]] = 0.0
    v[rng.integers(0, n)] = 0.25
    off = sumtree.layout(n, fanout)
    s, m = sumtree.new_tree(off), sumtree.new_tree(off, np.inf, internal_only=True)
    sumtree.build_pair(s, m, off, fanout, v)
    return off, s, m, v


def targets(kind: str, total: float, rng: np.random.Generator, b: int) -> np.ndarray:
    if kind == "stratified":  # sorted: consecutive draws share nodes near the root
        return (np.arange(b) + rng.random(b)) * (total / b)
    if kind == "random":  # unsorted: a shared node's sums then meet smaller targets
        return rng.random(b) * total
    if kind == "repeated":  # runs of equal targets, then a smaller one
        runs = np.repeat(rng.random(max(1, b // 4)) * total, 4)[:b]
        return np.ascontiguousarray(runs[::-1])
    # the edges: 0, the total, past it (round-off clamps to the last positive leaf)
    return np.array([0.0, total, total * (1 + 1e-12), np.nextafter(total, 0.0), total / 2]
                    * (b // 5 + 1))[:b]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FANOUTS), st.integers(1, 5000), st.floats(0.0, 0.9),
       st.sampled_from(["stratified", "random", "repeated", "edges"]),
       st.integers(0, 2**32))
def test_find_equals_the_oracle(fanout: int, n: int, zeros: float, kind: str,
                                seed: int) -> None:
    rng = np.random.default_rng(seed)
    off, s, _, v = tree(n, fanout, rng, zeros)
    t = targets(kind, sumtree.total(s, off), rng, int(rng.integers(1, 300)))
    got = c.find(s, off, fanout, t)
    assert np.array_equal(got, sumtree.find(s, off, fanout, t))
    assert np.all(v[got] > 0)  # never an empty leaf


def stratified_oracle(s: np.ndarray, m: np.ndarray, off: np.ndarray, fanout: int,
                      u: np.ndarray, written: np.ndarray, counts: np.ndarray, rows: int,
                      beta: float, norm: int, n_items: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stratified draw as a plain loop over the numpy tree functions (libm's pow)."""
    n = len(u)
    total = sumtree.total(s, off)
    slots = sumtree.find(s, off, fanout, np.array([(b + u[b]) * (total / n)
                                                   for b in range(n)]))
    p = sumtree.leaves(s, off)[slots]
    lanes = len(written)
    keys = []
    for sl in slots.tolist():
        row, lane = divmod(sl, lanes)
        oldest = int(written[lane] - counts[lane])
        keys.append((oldest + (row - oldest) % rows) * lanes + lane)
    base = {0: sumtree.total(m, off), 1: p.min()}.get(norm)
    lo, hi = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
    w = [min(max((x / base) ** -beta if base is not None
                 else (n_items * (x / total)) ** -beta, lo), hi) for x in p.tolist()]
    return np.array(keys, np.int64), p / total, np.array(w)


def ring_state(rows: int, lanes: int, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray]:
    """``written`` and ``counts`` per lane: full and wrapped at any row, or not yet full."""
    full = rng.random(lanes) < 0.7
    written = np.where(full, rows + rng.integers(0, 5 * rows, lanes),
                       rng.integers(1, rows + 1, lanes)).astype(np.int64)
    counts = np.where(full, rows, written).astype(np.int64)
    return written, counts


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FANOUTS), st.integers(1, 3), st.integers(1, 900),
       st.integers(0, 2), st.integers(0, 2**32))
def test_sample_and_update_keys_equal_the_oracle(fanout: int, lanes: int, rows: int,
                                                 norm: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    written, counts = ring_state(rows, lanes, rng)
    n = rows * lanes
    off, s, m, _ = tree(n, fanout, rng, 0.3)
    # leaves of steps not live hold 0, as in a buffer (only live steps are drawn)
    live_slots = [(seq % rows) * lanes + j for j in range(lanes)
                  for seq in range(int(written[j] - counts[j]), int(written[j]))]
    mask = np.zeros(n, bool)
    mask[live_slots] = True
    leaves = sumtree.leaves(s, off)[:n].copy()
    leaves[~mask] = 0.0
    leaves[live_slots[0]] = max(leaves[live_slots[0]], 0.5)
    sumtree.build_pair(s, m, off, fanout, leaves)
    u = rng.random(int(rng.integers(1, 300)))
    got = c.sample_stratified(s, m, off, fanout, u, written, counts, rows, 0.4, norm,
                              int(mask.sum()))
    want = stratified_oracle(s, m, off, fanout, u, written, counts, rows, 0.4, norm,
                             int(mask.sum()))
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)

    # keys: the drawn ones (live), shuffled, with duplicates, stale and negative ones
    keys = np.concatenate([got[0], got[0][: len(got[0]) // 3],
                           rng.integers(-3, int(written.max()) * lanes + 3, 40)])
    rng.shuffle(keys)
    raw = rng.random(len(keys)) * 3 * (rng.random(len(keys)) > 0.1)
    s2, m2 = s.copy(), m.copy()
    applied, top = c.update_keys(s, m, off, fanout, keys, raw, written, counts, rows,
                                 1e-6, 0.6)
    seq, lane = keys // lanes, keys % lanes
    live = (keys >= 0) & (seq < written[lane]) & (seq >= written[lane] - counts[lane])
    vals = np.array([(x + 1e-6) ** 0.6 for x in raw[live].tolist()])
    sumtree.update_pair(s2, m2, off, fanout, (seq[live] % rows) * lanes + lane[live], vals)
    assert applied == int(live.sum())
    assert top == (vals.max() if len(vals) else 0.0)
    assert np.array_equal(s, s2) and np.array_equal(m, m2)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FANOUTS), st.integers(1, 5000), st.integers(0, 600),
       st.integers(0, 2**32))
def test_update_pair_equals_the_oracle(fanout: int, n: int, k: int, seed: int) -> None:
    """Unsorted leaves with duplicates (the last one wins), zeros among the values, groups
    of refreshed parents of every size."""
    rng = np.random.default_rng(seed)
    off, s, m, _ = tree(n, fanout, rng, 0.3)
    s2, m2 = s.copy(), m.copy()
    idx = rng.integers(0, n, k)
    if k and rng.random() < 0.5:
        idx.sort()
    vals = rng.random(k) * (rng.random(k) > 0.2)
    # the oracle applies duplicates in order too (numpy fancy assignment: the last wins)
    c.update_pair(s, m, off, fanout, idx, vals)
    sumtree.update_pair(s2, m2, off, fanout, idx, vals)
    assert np.array_equal(s, s2) and np.array_equal(m, m2)


def test_a_million_slots_at_fanout_16() -> None:
    """The benchmark's shape: 2**20 leaves (5 levels of 16), 256 stratified draws and
    their update, many rounds on one tree."""
    rng = np.random.default_rng(7)
    n = 1_000_000
    off, s, m, _ = tree(n, 16, rng, 0.0)
    s2, m2 = s.copy(), m.copy()
    written, counts = np.array([3 * n + 12345], np.int64), np.array([n], np.int64)
    for _ in range(5):
        u = rng.random(256)
        got = c.sample_stratified(s, m, off, 16, u, written, counts, n, 0.4, 0, n)
        want = stratified_oracle(s2, m2, off, 16, u, written, counts, n, 0.4, 0, n)
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
        raw = rng.random(256) * 2
        c.update_keys(s, m, off, 16, got[0], raw, written, counts, n, 1e-6, 0.6)
        vals = np.array([(x + 1e-6) ** 0.6 for x in raw.tolist()])
        sumtree.update_pair(s2, m2, off, 16, got[0] % n, vals)
        assert np.array_equal(s, s2) and np.array_equal(m, m2)
