"""The lane-split and recent (ERE) samplers behind a view that serves few steps: when the
redraw rounds do not finish, the batch is finished exactly from the sampler's law restricted
to the servable steps (:mod:`replaybank.samplers.draw`), as the uniform and prioritized
samplers do. Before, both raised "after 64 redraws ... no steps the view can serve".

The law tests use a view that serves a chosen handful of keys (so lanes of unequal fill, an
ERE window and priorities can be set exactly); the frame-stack tests use a real frame stack
over wrapped lanes, where only each lane's newest step has its history.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.samplers.base import LaneView
from replaybank.views.transition import TransitionView
from tests.stats import chi2_critical


class _Serves:
    """A one-step view that serves only ``keys`` (every other live step is redrawn)."""

    every_step = False

    def __init__(self, keys: list[int]) -> None:
        self.keys = np.array(sorted(keys), np.int64)
        self.inner = TransitionView()

    def valid(self, table: Any, keys: np.ndarray) -> np.ndarray:
        return np.isin(keys, self.keys)

    def gather(self, table: Any, keys: np.ndarray, rng: Any = None) -> dict[str, Any]:
        return self.inner.gather(table, keys, rng)

    def config(self) -> dict[str, Any]:
        return {"type": "serves"}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


def _unequal_lanes(view: Any, **kw: Any) -> rb.ReplayBuffer:
    """Two lanes of 100 rows: lane 0 got 150 steps (count 100, wrapped: seq 50 to 149),
    lane 1 got 50 (key of lane ``l``'s step ``s``: ``2 * s + l``)."""
    buf = rb.ReplayBuffer(200, num_envs=2, seed=11, view=view, **kw)
    for lane, n in ((0, 150), (1, 50)):
        obs = np.arange(n + 1, dtype=np.float32)[:, None, None]
        buf.extend(obs=obs[:-1], action=np.zeros((n, 1), np.int64),
                   reward=np.ones((n, 1)), next_obs=obs[1:],
                   terminated=np.zeros((n, 1), bool), truncated=np.zeros((n, 1), bool),
                   env_ids=[lane])
    assert buf.table.counts.tolist() == [100, 50]
    return buf


def _counts(buf: rb.ReplayBuffer, keys: list[int], calls: int, **kw: Any
            ) -> tuple[np.ndarray, list[rb.Batch]]:
    batches = [buf.sample(32, **kw) for _ in range(calls)]
    drawn = np.concatenate([b.indices for b in batches])
    assert set(drawn.tolist()) <= set(keys), sorted(set(drawn.tolist()) - set(keys))
    return np.array([(drawn == k).sum() for k in keys]), batches


def _chi2(observed: np.ndarray, p: np.ndarray) -> float:
    expected = observed.sum() * p
    return float(((observed - expected) ** 2 / expected).sum())


@pytest.mark.statistical
def test_lane_split_finishes_from_its_law_among_the_servable_steps() -> None:
    """Lane split: a step of lane ``l`` has weight ``1 / count_l`` (a lane is picked
    uniformly, then a step of it), so among the servable keys 100 (lane 0, seq 50), 140
    (lane 0, seq 70) and 61 (lane 1, seq 30) the law is 1/4, 1/4 and 1/2, not uniform
    (1/3 each). 2% of a draw's mass is servable: most batches need the exact fallback
    after 64 redraw rounds."""
    served = [100, 140, 61]
    buf = _unequal_lanes(_Serves(served), lane_split="random")
    observed, _ = _counts(buf, served, 300)
    assert _chi2(observed, np.array([1, 1, 2]) / 4) < chi2_critical(2), observed
    assert _chi2(observed, np.full(3, 1 / 3)) > 100  # far from uniform over the keys


@pytest.mark.statistical
@pytest.mark.parametrize("window", [True, False])
def test_recent_finishes_from_its_window_among_the_servable_steps(window: bool) -> None:
    """ERE, update 1 of 2 (eta 0.5, c_min 100): the window is the newest 67 steps of lane
    0 and 34 of lane 1 (``ceil(count * 100 / 150)``), uniform. Servable: 200 and 280
    (lane 0, seq 100 and 140) and 61 (lane 1, seq 30) inside it, 120 and 21 (lane 0 seq
    60, lane 1 seq 10) outside: each of the three inside has probability 1/3 and the two
    outside are never drawn. With the whole buffer as the window (no update option) all
    five are drawn uniformly."""
    served = [200, 280, 61, 120, 21]
    buf = _unequal_lanes(_Serves(served), sampler=rb.RecentSampler(eta=0.5, c_min=100))
    kw = {"update": 1, "num_updates": 2} if window else {}
    observed, _ = _counts(buf, served, 300, **kw)
    if window:
        assert observed[3:].sum() == 0
        assert _chi2(observed[:3], np.full(3, 1 / 3)) < chi2_critical(2), observed
    else:
        assert _chi2(observed, np.full(5, 1 / 5)) < chi2_critical(4), observed


@pytest.mark.statistical
def test_prioritized_recent_finishes_in_proportion_to_priority_in_its_window() -> None:
    """Prioritized ERE (alpha 1, eps 0, beta 0.5), the window of the test above: its
    unservable steps hold priority 10, the servable 200, 280 and 61 inside it 1, 3 and 4,
    the servable 120 and 21 outside it 50. The draws are 1/8, 3/8 and 4/8, with ``P(i) =
    p_i / 988`` (the window's mass) and weights ``(p_i / 1) ** -0.5`` on every row,
    whether a redraw round or the fallback drew it."""
    served = [200, 280, 61, 120, 21]
    per = rb.PrioritizedSampler(alpha=1.0, eps=0.0, beta=0.5)
    buf = _unequal_lanes(_Serves(served), sampler=rb.RecentSampler(eta=0.5, c_min=100,
                                                                  prioritized=per))
    live = np.r_[np.arange(100, 300, 2), np.arange(1, 100, 2)]  # lane 0 seq 50.., lane 1
    buf.update_priorities(live, np.full(len(live), 10.0))
    prio = {200: 1.0, 280: 3.0, 61: 4.0, 120: 50.0, 21: 50.0}
    buf.update_priorities(np.array(list(prio)), np.array(list(prio.values())))
    mass = 10.0 * (101 - 3) + 1.0 + 3.0 + 4.0
    observed, batches = _counts(buf, served, 300, update=1, num_updates=2)
    assert observed[3:].sum() == 0
    assert _chi2(observed[:3], np.array([1, 3, 4]) / 8) < chi2_critical(2), observed
    for b in batches:
        p = np.array([prio[k] for k in b.indices.tolist()])
        np.testing.assert_allclose(b.probabilities, p / mass, rtol=1e-12)
        np.testing.assert_allclose(b.weights, p ** -0.5, rtol=1e-6)


def _wrapped_frame_stack(**kw: Any) -> rb.ReplayBuffer:
    """Two lanes of 64 rows, 70 steps of one episode each, frames of 64: only the newest
    step of each lane (keys 138 and 139) has its history."""
    buf = rb.ReplayBuffer(128, num_envs=2, frame_stack=64, seed=3, **kw)
    for t in range(70):
        obs = (100.0 * np.arange(2) + t)[:, None].astype(np.float32)
        buf.add(obs=obs, action=np.zeros(2, np.int64), reward=np.zeros(2), next_obs=obs + 1,
                terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))
    return buf


@pytest.mark.statistical
@pytest.mark.parametrize("sampler", ["lane_split", "recent", "recent_per"])
def test_a_frame_stack_over_wrapped_lanes_is_served(sampler: str) -> None:
    """A frame stack whose lanes hold one servable step each: the redraw rounds do not
    finish and the rows they leave come from the sampler's law among keys 138 and 139
    (both lanes hold 64 steps: 1/2 each; prioritized, 1/4 and 3/4 by priority), each
    with the newest frame of its lane."""
    kw: dict[str, Any] = {"lane_split": "random"} if sampler == "lane_split" else {
        "sampler": rb.RecentSampler(c_min=10, prioritized=rb.PrioritizedSampler(
            alpha=1.0, eps=0.0) if sampler == "recent_per" else None)}
    buf = _wrapped_frame_stack(**kw)
    want = np.full(2, 0.5)
    if sampler == "recent_per":
        buf.update_priorities(np.array([138, 139]), np.array([1.0, 3.0]))
        want = np.array([0.25, 0.75])
    counts = np.zeros(2, int)
    for _ in range(50):
        b = buf.sample(32)
        assert set(b.indices.tolist()) <= {138, 139}
        assert b.obs[:, -1, 0].tolist() == [69.0 + 100 * (k % 2) for k in b.indices]
        counts += np.bincount(b.indices - 138, minlength=2)
    assert _chi2(counts, want) < chi2_critical(1), counts
    if sampler == "recent":  # distinct steps too: exactly the two servable ones
        assert sorted(buf.sample(2, replace=False).indices.tolist()) == [138, 139]
        with pytest.raises(rb.EmptyBufferError, match=r"holds 2 distinct steps"):
            buf.sample(3, replace=False)


def test_a_failed_fallback_changes_nothing() -> None:
    """No servable step in the ERE window: refused (naming the window), the generator as
    before; lane split with no servable step at all: refused with the count."""
    buf = _unequal_lanes(_Serves([120, 21]), sampler=rb.RecentSampler(eta=0.5, c_min=100))
    before = buf.rng.bit_generator.state
    with pytest.raises(rb.EmptyBufferError, match=r"0 of the 2 keys to draw among lie in "
                                                  r"the window of the newest 101 steps"):
        buf.sample(4, update=1, num_updates=2)
    assert buf.rng.bit_generator.state == before
    assert set(buf.sample(8).indices.tolist()) <= {120, 21}  # the whole buffer: served
    split = _unequal_lanes(_Serves([]), lane_split="random")
    before = split.rng.bit_generator.state
    with pytest.raises(rb.EmptyBufferError, match=r"none of the 150 stored steps can be "
                                                  r"served"):
        split.sample(4)
    assert split.rng.bit_generator.state == before


def test_restricted_draws_by_hand() -> None:
    """Exact expectations of the two samplers' draws among given keys, on a lane view."""
    lv = LaneView(T=8, lanes=2, written=np.array([8, 2]), counts=np.array([8, 2]))
    split = rb.LaneSplitSampler()
    assert isinstance(split, rb.RestrictedDraws) and not isinstance(split, rb.SubsetDraws)
    assert split.key_weights(np.array([0, 1, 14, 3]), lv).tolist() == [0.125, 0.5, 0.125, 0.5]
    res = split.sample_restricted(np.array([14, 3]), 40_000, lv, np.random.default_rng(0))
    assert abs(float(np.mean(res.keys == 3)) - 0.8) < 0.01  # 0.5 / (0.5 + 0.125)
    recent = rb.RecentSampler(eta=0.5, c_min=4)
    assert isinstance(recent, rb.SubsetDraws)
    # update 1 of 2: c = 4 of 10, per lane ceil(8 * 4 / 10) = 4 and ceil(2 * 4 / 10) = 1
    got = recent.sample_among(np.array([2, 8, 14, 1, 3]), 3, lv, np.random.default_rng(0),
                              update=1, num_updates=2)
    assert sorted(got.keys.tolist()) == [3, 8, 14]
    with pytest.raises(rb.ConfigError, match="replace=False"):
        rb.RecentSampler(prioritized=rb.PrioritizedSampler()).sample_among(
            np.array([1]), 1, lv, np.random.default_rng(0))


def test_recent_distinct_windows_come_from_its_window() -> None:
    """Drawing among given keys makes ERE a sampler of distinct sequence windows too
    (before: refused as one that cannot draw among given keys): ``replace=False`` starts
    are distinct usable starts of the window, a batch above the usable starts in the
    window is refused with their count; prioritized ERE draws with replacement only."""
    def filled(sampler: rb.RecentSampler) -> rb.ReplayBuffer:
        buf = rb.ReplayBuffer(200, seed=0, sampler=sampler)
        obs = np.arange(101, dtype=np.float32)[:, None]
        term = np.zeros(100, bool)
        term[9::10] = True  # episodes of 10 steps
        buf.extend(obs=obs[:-1], action=np.zeros(100, np.int64), reward=np.ones(100),
                   next_obs=obs[1:], terminated=term, truncated=np.zeros(100, bool))
        return buf

    buf = filled(rb.RecentSampler(eta=0.5, c_min=20))  # update 1 of 2: the newest 20
    usable = {s for s in range(80, 100) if s % 10 <= 6}  # 4-step windows in one episode
    seen: set[int] = set()
    for _ in range(50):
        starts = buf.sample_sequences(5, 4, replace=False, update=1, num_updates=2).starts
        assert len(set(starts.tolist())) == 5 and set(starts.tolist()) <= usable
        seen |= set(starts.tolist())
    assert seen == usable
    with pytest.raises(rb.EmptyBufferError, match=r"14 of the 70 keys to draw among lie in "
                                                  r"the window of the newest 20 steps"):
        buf.sample_sequences(15, 4, replace=False, update=1, num_updates=2)
    per = filled(rb.RecentSampler(c_min=20, prioritized=rb.PrioritizedSampler()))
    with pytest.raises(rb.ConfigError, match="prioritized ERE draws with replacement only"):
        per.sample_sequences(3, 4, replace=False)
