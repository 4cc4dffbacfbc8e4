"""Emphasizing recent experience: window rule, draws only from the window, PER inside it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import ConfigError
from replaybank.samplers.base import LaneView
from replaybank.samplers.recent import window_counts
from tests.stats import chi2_critical


def steps(n: int, lanes: int = 1) -> dict[str, Any]:
    obs = np.arange(n + 1, dtype=np.float32)[:, None]
    d = {"obs": obs[:-1], "action": np.zeros(n, np.int64), "reward": np.ones(n, np.float32),
         "next_obs": obs[1:], "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
    if lanes > 1:
        d = {k: np.stack([v] * lanes, axis=1) for k, v in d.items()}
    return d


def window_keys(buf: rb.ReplayBuffer, c_per_lane: np.ndarray) -> set[int]:
    t = buf.table
    out: set[int] = set()
    for lane in range(t.lanes):
        w = int(t.written[lane])
        out |= {s * t.lanes + lane for s in range(w - int(c_per_lane[lane]), w)}
    return out


def test_window_size_rule() -> None:
    s = rb.RecentSampler(eta=0.996, c_min=100)
    n = 10_000
    for k, big_k in [(0, 10), (3, 10), (9, 10), (50, 100)]:
        want = min(n, max(math.floor(n * 0.996 ** (k * 1000 / big_k)), 100))
        assert s.window_size(n, k, big_k) == want
    assert s.window_size(n, 0, 10) == n  # k counted from 0: the first update sees everything
    assert s.window_size(50, 5, 10) == 50  # c_min capped at N
    with pytest.raises(ConfigError, match="update"):
        s.window_size(n, 10, 10)
    with pytest.raises(ConfigError, match="num_updates"):
        s.window_size(n, 0, 0)


def test_lane_windows_round_up_to_whole_rows() -> None:
    """With several lanes the window is ``ceil(count_l * c_k / N)`` newest steps per lane
    (docs/samplers/recent.md): every step of those rows is drawn, nothing older, so the
    window holds ``c_k`` steps rounded up to whole rows of the in-step lanes."""
    buf = rb.ReplayBuffer(600, num_envs=3, seed=0, sampler=rb.RecentSampler(eta=0.99, c_min=5))
    buf.extend(**steps(100, lanes=3))
    s = buf.sampler
    assert isinstance(s, rb.RecentSampler)
    c = s.window_size(300, 1, 10)
    assert c == math.floor(300 * 0.99**100) == 109
    per_lane = window_counts(buf.table.counts, c)
    assert per_lane.tolist() == [37, 37, 37]  # ceil(109 / 3): 111 = c_k + 2 steps
    keys = buf.sample(20_000, update=1, num_updates=10).indices
    assert set(keys.tolist()) == window_keys(buf, per_lane)


def test_window_counts_split_lanes_proportionally() -> None:
    assert window_counts(np.array([10, 10, 10]), 9).tolist() == [3, 3, 3]
    assert window_counts(np.array([10, 20]), 6).tolist() == [2, 4]
    assert window_counts(np.array([5, 0]), 100).tolist() == [5, 0]


@pytest.mark.statistical
@pytest.mark.parametrize("lanes", [1, 4])
def test_uniform_ere_draws_only_from_window(lanes: int) -> None:
    cap = 200 * lanes
    buf = rb.ReplayBuffer(cap, num_envs=lanes, seed=1,
                          sampler=rb.RecentSampler(eta=0.99, c_min=8))
    buf.extend(**steps(300, lanes))  # wrapped: 100 steps per lane overwritten
    n = len(buf)
    c = buf.sampler.window_size(n, 3, 20)  # type: ignore[attr-defined]
    wc = window_counts(buf.table.counts, c)
    allowed = sorted(window_keys(buf, wc))
    assert len(allowed) == wc.sum() < n
    counts = dict.fromkeys(allowed, 0)
    draws = 0
    for _ in range(100):
        b = buf.sample(256, update=3, num_updates=20)
        for key in b.indices.tolist():
            counts[key] += 1  # KeyError if outside the window
        draws += 256
    exp = draws / len(allowed)
    stat = sum((v - exp) ** 2 / exp for v in counts.values())
    assert stat < chi2_critical(len(allowed) - 1), stat


def test_async_lanes_window() -> None:
    buf = rb.ReplayBuffer(300, num_envs=3, seed=2, sampler=rb.RecentSampler(eta=0.9, c_min=5))
    d = steps(60)
    for lane, n in enumerate([60, 30, 10]):
        for t in range(n):
            buf.add(env_ids=[lane], **{k: v[t:t + 1] for k, v in d.items()})
    c = buf.sampler.window_size(len(buf), 1, 10)  # type: ignore[attr-defined]
    wc = window_counts(buf.table.counts, c)
    allowed = window_keys(buf, wc)
    b = buf.sample(2000, update=1, num_updates=10)
    assert set(b.indices.tolist()) <= allowed
    assert len(set(b.indices.tolist())) == len(allowed)  # every window step seen


@pytest.mark.statistical
@pytest.mark.parametrize(("lanes", "async_lanes"), [(1, False), (2, False), (3, True)])
def test_prioritized_ere_matches_window_priorities(lanes: int, async_lanes: bool) -> None:
    rows = 40
    per = rb.PrioritizedSampler(alpha=1.0, eps=0.0, beta=0.5, weight_norm="buffer")
    buf = rb.ReplayBuffer(rows * lanes, num_envs=lanes, seed=4,
                          sampler=rb.RecentSampler(eta=0.995, c_min=4, prioritized=per))
    rng = np.random.default_rng(5)
    if async_lanes:
        d = steps(70)
        for lane, n in enumerate([70, 55, 45]):  # unequal, wrapped
            for t in range(n):
                buf.add(env_ids=[lane], priority=rng.random() + 0.1,
                        **{k: v[t:t + 1] for k, v in d.items()})
    else:
        # 45 steps into 40 rows: the window (rows 31..44 mod 40) wraps around the ring
        buf.extend(**steps(45, lanes), priority=rng.random((45, lanes)) + 0.1)
    n = len(buf)
    k, big_k = 2, 10
    c = buf.sampler.window_size(n, k, big_k)  # type: ignore[attr-defined]
    wc = window_counts(buf.table.counts, c)
    ranges = buf.sampler._ranges(buf.lane_view(), wc)  # type: ignore[attr-defined]
    assert (ranges is None) == async_lanes  # async lanes: explicit window
    assert async_lanes or len(ranges) == 2  # the window wraps: two slot ranges
    allowed = np.array(sorted(window_keys(buf, wc)))
    t = buf.table
    slots = (allowed // lanes % t.T) * lanes + allowed % lanes
    p = per.priorities(slots)
    prob = p / p.sum()
    wmin = p.min()
    counts = np.zeros(len(allowed))
    draws = 0
    for _ in range(200):
        b = buf.sample(128, update=k, num_updates=big_k)
        pos = np.searchsorted(allowed, b.indices)
        assert np.array_equal(allowed[np.minimum(pos, len(allowed) - 1)], b.indices)
        np.add.at(counts, pos, 1)
        assert np.allclose(b.probabilities, prob[pos], rtol=1e-9)
        assert np.allclose(b.weights, (p[pos] / wmin) ** -0.5, rtol=1e-5)  # window-max norm
        draws += 128
    exp = draws * prob
    stat = float(((counts - exp) ** 2 / exp).sum())
    assert stat < chi2_critical(len(allowed) - 1), stat


def test_prioritized_ere_weights_use_window_size() -> None:
    per = rb.PrioritizedSampler(alpha=1.0, eps=0.0, beta=1.0, weight_norm=None)
    buf = rb.ReplayBuffer(100, seed=0, sampler=rb.RecentSampler(eta=0.5, c_min=10,
                                                                prioritized=per))
    buf.extend(**steps(100), priority=np.full(100, 2.0))
    b = buf.sample(50, update=1, num_updates=2)  # window: c_min = 10 newest
    assert b.indices.min() >= 90
    assert np.allclose(b.probabilities, 0.1)
    assert np.allclose(b.weights, (10 * 0.1) ** -1.0)
    assert buf.update_priorities(b.indices[:3], [1.0, 1.0, 1.0]) == 3


def test_protocol_and_composition() -> None:
    plain = rb.RecentSampler()
    both = rb.RecentSampler(prioritized=rb.PrioritizedSampler())
    assert not isinstance(plain, rb.PrioritySampler)
    assert isinstance(both, rb.PrioritySampler)
    buf = rb.ReplayBuffer(10, sampler=plain, seed=0)
    buf.extend(**steps(3))
    with pytest.raises(ConfigError, match="priorities"):
        buf.update_priorities([0], [1.0])
    with pytest.raises(ConfigError, match="priority"):
        buf.extend(**steps(2), priority=[1.0, 1.0])
    assert len(buf) == 3  # rejected extend left the buffer unchanged
    cfg = both.config()
    assert cfg["type"] == "recent" and cfg["prioritized"]["type"] == "prioritized"


def test_without_replacement_uniform() -> None:
    buf = rb.ReplayBuffer(100, seed=0, sampler=rb.RecentSampler(eta=0.5, c_min=20))
    buf.extend(**steps(100))
    b = buf.sample(20, replace=False, update=1, num_updates=2)
    assert sorted(b.indices.tolist()) == list(range(80, 100))


def test_adaptive_eta_rule() -> None:
    s = rb.RecentSampler(eta=0.98, adaptive=True, history=8)
    assert s.update_eta([1.0, 2.0]) == 0.98  # too few returns: unchanged
    assert s.update_eta([3.0, 4.0, 5.0, 6.0]) == pytest.approx(0.98)  # steep rise: eta_min
    assert s.update_eta({"episode_returns": [6.0] * 8}) == pytest.approx(1.0)  # plateau
    r = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.2]
    s.update_eta(r)
    arr = np.array(r)
    slope = np.polyfit(np.arange(8.0), arr, 1)[0]
    z = min(1.0, max(0.0, slope * 7 / (arr.std() + 1e-8)))
    assert s.eta == pytest.approx(1 - 0.02 * z)
    info = {"episode": {"r": np.array([1.0, 9.0]), "l": np.array([5, 5])},
            "_episode": np.array([True, False])}
    s.update_eta(info)
    assert s.returns[-1] == 1.0
    fixed = rb.RecentSampler(eta=0.97)
    assert fixed.update_eta([1.0, 2.0, 3.0, 4.0, 5.0]) == 0.97  # not adaptive


def test_state_dict_roundtrip() -> None:
    def build(seed: int) -> rb.ReplayBuffer:
        s = rb.RecentSampler(eta=0.99, c_min=5, adaptive=True,
                             prioritized=rb.PrioritizedSampler(beta_schedule="linear"))
        return rb.ReplayBuffer(50, seed=seed, sampler=s)

    a = build(0)
    a.extend(**steps(60), priority=np.linspace(0.1, 1, 60))
    a.sampler.update_eta([1.0, 3.0, 2.0, 5.0, 6.0])  # type: ignore[attr-defined]
    a.sample(8, update=1, num_updates=4)
    c = build(9)
    c.load_state_dict(a.state_dict())
    x, y = a.sample(16, update=2, num_updates=4), c.sample(16, update=2, num_updates=4)
    assert np.array_equal(x.indices, y.indices) and np.array_equal(x.weights, y.weights)
    assert c.sampler.eta == a.sampler.eta  # type: ignore[attr-defined]


@pytest.mark.parametrize("kw", [{"eta": 0.0}, {"eta": 1.5}, {"c_min": 0}, {"history": 2},
                                {"prioritized": "per"}, {"eta_min": 2.0}])
def test_bad_arguments(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(kw))):
        rb.RecentSampler(**kw)


def test_lane_view_direct() -> None:
    s = rb.RecentSampler(eta=0.5, c_min=3)
    lv = LaneView(T=10, lanes=1, written=np.array([25]), counts=np.array([10]))
    keys = s.sample(100, lv, np.random.default_rng(0), update=1, num_updates=2).keys
    assert keys.min() >= 22 and keys.max() <= 24
