"""The k-ary sum tree: numpy functions against plain loops, numba kernels against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybank.ops import sumtree
from replaybank.ops.jit import pure_python

FANOUTS = [2, 3, 4, 8, 16]


def loop_find(values: list[float], target: float) -> int:
    """Plain-loop reference: first leaf whose inclusive prefix sum exceeds target, else the
    last positive leaf."""
    acc = 0.0
    last = -1
    for i, v in enumerate(values):
        if v > 0:
            last = i
        if acc + v > target and v > 0:
            return i
        acc += v
    return last


def make(values: np.ndarray, fanout: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    off = sumtree.layout(len(values), fanout)
    s = sumtree.new_tree(off)
    m = sumtree.new_tree(off, np.inf, internal_only=True)
    sumtree.build_pair(s, m, off, fanout, values)
    return off, s, m


def random_values(rng: np.random.Generator, n: int, zero_frac: float = 0.3) -> np.ndarray:
    v = rng.random(n) ** 3 * 10
    v[rng.random(n) < zero_frac] = 0.0
    if not np.any(v > 0):
        v[rng.integers(n)] = 1.0
    return v


@pytest.mark.parametrize("fanout", FANOUTS)
def test_layout_levels_are_aligned_and_large_enough(fanout: int) -> None:
    for n in [1, 2, 5, fanout**2, fanout**2 + 1, 1000]:
        off = sumtree.layout(n, fanout)
        depth = len(off) - 2
        assert depth >= 1 and fanout**depth >= n
        assert np.all(off[1:] % fanout == 0)
        for lvl in range(depth + 1):
            assert off[lvl + 1] - off[lvl] >= fanout**lvl


@pytest.mark.parametrize("fanout", FANOUTS)
def test_build_sums_and_mins_match_leaves(fanout: int) -> None:
    rng = np.random.default_rng(fanout)
    v = random_values(rng, 123)
    off, s, m = make(v, fanout)
    assert sumtree.total(s, off) == pytest.approx(v.sum(), rel=1e-12)
    assert sumtree.total(m, off) == v[v > 0].min()
    lv = sumtree.leaves(s, off)
    assert np.array_equal(lv[:123], v) and np.all(lv[123:] == 0)


@pytest.mark.parametrize("fanout", FANOUTS)
def test_find_matches_plain_loop(fanout: int) -> None:
    rng = np.random.default_rng(10 + fanout)
    for n in [1, 7, 64, 300]:
        v = random_values(rng, n)
        off, s, _ = make(v, fanout)
        tot = sumtree.total(s, off)
        targets = np.concatenate([rng.random(200) * tot, np.cumsum(v)[:-1], [0.0]])
        got = sumtree.find(s, off, fanout, targets)
        want = [loop_find(v.tolist(), float(t)) for t in targets]
        # tree sums are grouped differently from a flat prefix sum: allow a one-leaf
        # disagreement only where a target sits within round-off of a leaf boundary
        cum = np.cumsum(v)
        for t, g, w in zip(targets, got, want, strict=True):
            if g != w:
                assert min(abs(cum - t)) <= 1e-9 * tot, (t, g, w)
        assert np.all(v[got] > 0)


@pytest.mark.parametrize("fanout", FANOUTS)
def test_find_is_clamped_to_positive_leaves(fanout: int) -> None:
    rng = np.random.default_rng(20 + fanout)
    v = random_values(rng, 50, zero_frac=0.7)
    v[-5:] = 0.0  # zeros at the end of the filled region
    off, s, _ = make(v, fanout)
    tot = sumtree.total(s, off)
    targets = np.array([tot, tot * (1 + 1e-12), np.nextafter(tot, 0), 10 * tot, 0.0])
    got = sumtree.find(s, off, fanout, targets)
    assert np.all(v[got] > 0)
    assert np.all(got < 45)
    assert got[0] == np.flatnonzero(v > 0)[-1]


def test_update_duplicates_last_wins_and_parents_recomputed() -> None:
    fanout = 4
    v = np.ones(20)
    off, s, m = make(v, fanout)
    sumtree.update_pair(s, m, off, fanout, np.array([3, 3, 7]), np.array([5.0, 2.0, 0.0]))
    want = v.copy()
    want[3], want[7] = 2.0, 0.0
    _, s2, m2 = make(want, fanout)
    assert np.array_equal(s, s2)
    assert np.array_equal(m, m2)


@pytest.mark.parametrize("fanout", [2, 4, 16])
def test_range_reduce_and_range_min(fanout: int) -> None:
    rng = np.random.default_rng(fanout)
    v = random_values(rng, 77)
    off, s, m = make(v, fanout)
    for _ in range(100):
        a, b = sorted(rng.integers(0, 78, size=2).tolist())
        assert sumtree.range_reduce(s, off, fanout, a, b) == pytest.approx(v[a:b].sum(),
                                                                           rel=1e-12, abs=1e-12)
        pos = v[a:b][v[a:b] > 0]
        want = pos.min() if len(pos) else np.inf
        assert sumtree.range_min(s, m, off, fanout, a, b) == want


COMPILED = ["replaybank.ops.sumtree_c", "replaybank.ops.sumtree_numba"]


@pytest.mark.parametrize("module", COMPILED)
@pytest.mark.parametrize("fanout", [2, 8, 16, 64])
def test_compiled_kernels_equal_numpy_oracle(fanout: int, module: str) -> None:
    nb = pytest.importorskip(module)

    rng = np.random.default_rng(100 + fanout)
    n = 5000
    v = random_values(rng, n)
    off, s_np, m_np = make(v, fanout)
    s_nb, m_nb = s_np.copy(), m_np.copy()
    for _ in range(20):
        idx = rng.integers(0, n, size=64)
        idx[:4] = idx[4]  # duplicates
        vals = random_values(rng, 64, zero_frac=0.2)
        sumtree.update_pair(s_np, m_np, off, fanout, idx, vals)
        nb.update_pair(s_nb, m_nb, off, fanout, idx, vals)
        assert np.array_equal(s_np, s_nb)
        assert np.array_equal(m_np, m_nb)
        tot = sumtree.total(s_np, off)
        targets = np.concatenate([rng.random(256) * tot, [tot, 2 * tot, 0.0]])
        assert np.array_equal(sumtree.find(s_np, off, fanout, targets),
                              nb.find(s_nb, off, fanout, targets))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 100.0), min_size=1, max_size=80),
       st.sampled_from([2, 4, 16]), st.floats(0.0, 1.0, exclude_max=True),
       st.sampled_from(COMPILED))
def test_compiled_find_property(values: list[float], fanout: int, frac: float,
                                module: str) -> None:
    nb = pytest.importorskip(module)

    v = np.asarray(values)
    if not np.any(v > 0):
        v[0] = 1.0
    off, s, _ = make(v, fanout)
    t = np.array([frac * sumtree.total(s, off)])
    got = nb.find(s, off, fanout, t)
    assert np.array_equal(got, sumtree.find(s, off, fanout, t))
    assert v[got[0]] > 0


def test_kernels_dispatch() -> None:
    _, name = sumtree.kernels("auto")
    try:
        import replaybank.ops.sumtree_c  # noqa: F401

        if pure_python():  # the C kernels built but switched off
            raise ImportError("REPLAYBANK_PURE_PYTHON=1")
    except ImportError:
        try:
            import numba  # noqa: F401
        except ImportError:
            assert name == "numpy"
        else:
            assert name == "numba"
    else:
        assert name == "c"
    assert sumtree.fused("numpy") is None
    (f2, _), name2 = sumtree.kernels("numpy")
    assert name2 == "numpy" and f2 is sumtree.find
    with pytest.raises(ValueError, match="prefer"):
        sumtree.kernels("cuda")
