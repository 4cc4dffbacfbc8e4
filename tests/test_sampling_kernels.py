"""The C sampling kernels (replaybank._sampling via replaybank.ops.sumtree_c) against their
numpy oracles and numba twins, their argument checks, and the first sample of a fresh
process, which must not wait for numba."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybank.ops import draws, sumtree
from replaybank.ops.jit import pure_python

c = pytest.importorskip("replaybank.ops.sumtree_c")
from replaybank import _sampling  # type: ignore[attr-defined]  # noqa: E402


def filled(n: int, fanout: int, rng: np.random.Generator
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    v = rng.random(n) * (rng.random(n) > 0.2)
    v[0] = 0.5
    off = sumtree.layout(n, fanout)
    s, m = sumtree.new_tree(off), sumtree.new_tree(off, np.inf, internal_only=True)
    sumtree.build_pair(s, m, off, fanout, v)
    return off, s, m, v


def stratified_oracle(s: np.ndarray, m: np.ndarray, off: np.ndarray, fanout: int,
                      u: np.ndarray, written: np.ndarray, counts: np.ndarray, rows: int,
                      beta: float, norm: int, n_items: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stratified draw written as a plain loop over the numpy tree functions."""
    n = len(u)
    total = sumtree.total(s, off)
    slots = sumtree.find(s, off, fanout, np.array([(b + u[b]) * (total / n)
                                                   for b in range(n)]))
    leaves = sumtree.leaves(s, off)
    p = leaves[slots]
    lanes = len(written)
    keys = []
    for sl in slots.tolist():
        row, lane = divmod(sl, lanes)
        oldest = int(written[lane] - counts[lane])
        keys.append((oldest + (row - oldest) % rows) * lanes + lane)
    base = {0: sumtree.total(m, off), 1: p.min()}.get(norm)
    lo, hi = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
    w = [min(max((x / base) ** -beta if base is not None else (n_items * (x / total)) ** -beta,
                 lo), hi) for x in p.tolist()]
    return np.array(keys), p / total, np.array(w)


@pytest.mark.parametrize("fanout", [2, 4, 16, 64])
@pytest.mark.parametrize("lanes", [1, 3])
def test_fused_sample_and_update_match_the_oracle(fanout: int, lanes: int) -> None:
    rng = np.random.default_rng(fanout * 7 + lanes)
    rows = 700
    off, s, m, _ = filled(rows * lanes, fanout, rng)
    written = np.array([rows + 13 * j + 50 for j in range(lanes)], np.int64)
    counts = np.full(lanes, rows, np.int64)
    for norm in (0, 1, 2):
        u = rng.random(257)
        got = c.sample_stratified(s, m, off, fanout, u, written, counts, rows, 0.4, norm,
                                  rows * lanes)
        want = stratified_oracle(s, m, off, fanout, u, written, counts, rows, 0.4, norm,
                                 rows * lanes)
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(g, w)
    keys = got[0].copy()
    keys[:5] = -1  # not keys: skipped
    keys[5] = 0  # long overwritten: stale, skipped
    raw = rng.random(len(keys)) * 3
    s2, m2 = s.copy(), m.copy()
    applied, top = c.update_keys(s, m, off, fanout, keys, raw, written, counts, rows, 1e-6, 0.6)
    seq, lane = keys // lanes, keys % lanes
    live = (keys >= 0) & (seq < written[lane]) & (seq >= written[lane] - counts[lane])
    # libm's pow, as the kernels (numpy's vectorised ** may differ in the last bit)
    vals = np.array([(x + 1e-6) ** 0.6 for x in raw[live].tolist()])
    sumtree.update_pair(s2, m2, off, fanout, (seq[live] % rows) * lanes + lane[live], vals)
    assert applied == int(live.sum()) and top == vals.max()
    assert np.array_equal(s, s2) and np.array_equal(m, m2)
    out, mx = c.transform(raw, 1e-6, 0.6)
    assert out.tolist() == [(x + 1e-6) ** 0.6 for x in raw.tolist()] and mx == out.max()
    assert c.transform(np.zeros(0), 0.1, 0.5)[1] == 0.0


def test_fused_kernels_equal_numba_twins() -> None:
    nb = pytest.importorskip("replaybank.ops.sumtree_numba")
    rng = np.random.default_rng(3)
    off, s, m, _ = filled(5000, 16, rng)
    s2, m2 = s.copy(), m.copy()
    written, counts = np.array([6000], np.int64), np.array([5000], np.int64)
    for _ in range(10):
        u = rng.random(256)
        a = c.sample_stratified(s, m, off, 16, u, written, counts, 5000, 0.7, 0, 5000)
        b = nb.sample_stratified(s2, m2, off, 16, u, written, counts, 5000, 0.7, 0, 5000)
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        raw = rng.random(256) * rng.integers(0, 2, 256)
        assert (c.update_keys(s, m, off, 16, a[0], raw, written, counts, 5000, 0.01, 0.5)
                == nb.update_keys(s2, m2, off, 16, b[0], raw, written, counts, 5000, 0.01, 0.5))
        assert np.array_equal(s, s2) and np.array_equal(m, m2)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 2**63), st.integers(0, 300), st.integers(0, 2**32))
def test_map_raw_matches_numpy(high: int, size: int, seed: int) -> None:
    a = draws.uniform_ints(np.random.default_rng(seed), high, size, kernel=_sampling.map_raw)
    b = draws.uniform_ints(np.random.default_rng(seed), high, size, kernel=draws.map_raw)
    assert a.tolist() == b.tolist()


def test_wrong_arguments_raise_instead_of_touching_memory() -> None:
    off, s, m, _ = filled(100, 4, np.random.default_rng(0))
    with pytest.raises(TypeError, match="float64"):
        _sampling.find(s.astype(np.float32), off, 4, np.zeros(2), np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="contiguous"):
        _sampling.find(s[::2], off, 4, np.zeros(2), np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="layout"):
        _sampling.find(s, off, 5, np.zeros(2), np.zeros(2, np.int64))  # levels too small
    with pytest.raises(ValueError, match="shorter"):
        _sampling.find(s[:10], off, 4, np.zeros(2), np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="length"):
        _sampling.find(s, off, 4, np.zeros(2), np.zeros(3, np.int64))
    before = s.copy()
    with pytest.raises(IndexError, match="outside"):
        c.update_pair(s, m, off, 4, np.array([1, 10**6]), np.array([1.0, 2.0]))
    assert np.array_equal(s, before)  # checked before any write
    with pytest.raises(ValueError, match="disagree"):
        c.update_keys(s, m, off, 4, np.zeros(1, np.int64), np.ones(1), np.array([5]),
                      np.array([5]), 10**6, 0.0, 1.0)
    with pytest.raises((TypeError, ValueError), match=r"writable|read-only"):
        ro = np.zeros(2, np.int64)
        ro.flags.writeable = False
        _sampling.find(s, off, 4, np.zeros(2), ro)
    with pytest.raises(ValueError, match="high"):
        _sampling.map_raw(np.zeros(1, np.uint64), 0, np.zeros(1, np.int64), 0)


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_first_sample_of_a_process_does_not_wait_for_numba(sampler: str) -> None:
    """The default sample paths run on the C kernels: a fresh process samples without
    importing numba (no JIT compile or cache load on the first draw)."""
    if pure_python():
        pytest.skip("REPLAYBANK_PURE_PYTHON=1: the C kernels are off (numba serves)")
    code = textwrap.dedent(f"""
        import sys, numpy as np, replaybank as rb
        kw = {{"sampler": rb.PrioritizedSampler()}} if {sampler!r} == "prioritized" else {{}}
        buf = rb.ReplayBuffer(1000, seed=0, **kw)
        for i in range(300):
            buf.add(obs=np.zeros(3, np.float32), action=1, reward=0.5,
                    next_obs=np.ones(3, np.float32), terminated=i % 50 == 49, truncated=False)
        b = buf.sample(64)
        if {sampler!r} == "prioritized":
            buf.update_priorities(b.indices, np.ones(64))
            assert buf.sampler.kernel_name == "c", buf.sampler.kernel_name
        assert "numba" not in sys.modules, "numba was imported"
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_pure_python_switch_leaves_the_c_kernels_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REPLAYBANK_PURE_PYTHON", raising=False)  # (a pure-Python run sets it)
    assert sumtree.kernels("auto")[1] == "c"
    monkeypatch.setenv("REPLAYBANK_PURE_PYTHON", "1")
    assert sumtree.kernels("auto")[1] in ("numba", "numpy")
    with pytest.raises(ImportError, match="REPLAYBANK_PURE_PYTHON"):
        sumtree.kernels("c")
    monkeypatch.setenv("REPLAYBANK_PURE_PYTHON", "0")
    assert sumtree.kernels("auto")[1] == "c"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-3, 50), max_size=20),
       st.lists(st.one_of(st.floats(-2.0, 1e6), st.just(float("nan")), st.just(float("inf")),
                          st.just(-float("inf"))), max_size=20),
       st.sampled_from([10.0, 1e300, float("inf")]))
def test_valid_update_is_update_priorities_checks(keys: list[int], prio: list[float],
                                                  limit: float) -> None:
    """The one-pass check of update_priorities' arguments against the rule it stands for."""
    k, p = np.array(keys, np.int64), np.array(prio, np.float64)
    want = all(x >= 0 for x in keys) and all(0.0 <= x <= limit and x != float("inf")
                                             for x in prio)
    assert _sampling.valid_update(k, p, limit) is want
