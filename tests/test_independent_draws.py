"""``draw_independent``: keys drawn one by one from a sampler's law (rejection needs it).

PER's ``sample`` is stratified: with two equal priorities, ``sample(2)`` always returns
one of each. ``draw_independent`` has the same marginal law but independent keys, so the
same item comes twice about half the time; the uniform sampler's draws are its sample's.
Exact window sampling over shards builds on it (``tests/test_distributed_windows.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import ConfigError, EmptyBufferError
from replaybank.samplers.base import IndependentDraws, SamplerTraits
from replaybank.samplers.prioritized import PrioritizedSampler
from replaybank.samplers.recent import RecentSampler
from replaybank.samplers.uniform import UniformSampler
from tests.stats import chi2_critical


def filled(sampler: object, n: int = 6, priority: np.ndarray | None = None) -> rb.ReplayBuffer:
    buf = rb.ReplayBuffer(capacity=16, sampler=sampler, seed=0)
    buf.extend(obs=np.arange(n, dtype=np.float32)[:, None], action=np.zeros(n),
               reward=np.zeros(n), next_obs=np.arange(1, n + 1, dtype=np.float32)[:, None],
               terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), priority=priority)
    return buf


def test_traits_declare_who_draws_independently() -> None:
    assert SamplerTraits.of(UniformSampler()).independent is not None
    assert SamplerTraits.of(PrioritizedSampler()).independent is not None
    assert isinstance(PrioritizedSampler(), IndependentDraws)
    assert SamplerTraits.of(RecentSampler()).independent is None


@pytest.mark.statistical
def test_prioritized_draws_have_the_law_and_are_independent() -> None:
    p = np.array([1.0, 2.0, 3.0, 0.5, 4.0, 1.5])
    buf = filled(PrioritizedSampler(alpha=1.0, eps=0.0), priority=p)
    sampler = buf.sampler
    calls = sampler.calls
    keys = sampler.draw_independent(60_000, buf.lane_view(), buf.rng)
    assert sampler.calls == calls  # the beta schedule does not advance
    observed = np.bincount(keys, minlength=6).astype(float)
    expected = p / p.sum() * len(keys)
    assert float(((observed - expected) ** 2 / expected).sum()) < chi2_critical(5)
    # independence: two equal priorities; stratified pairs never repeat, these do ~1/2
    two = filled(PrioritizedSampler(alpha=1.0, eps=0.0), n=2, priority=np.ones(2))
    same_iid = same_strat = 0
    for _ in range(2000):
        k = two.sampler.draw_independent(2, two.lane_view(), two.rng)
        same_iid += int(k[0] == k[1])
        s = two.sampler.sample(2, two.lane_view(), two.rng).keys
        same_strat += int(s[0] == s[1])
    assert same_strat == 0 and 900 < same_iid < 1100


def test_uniform_draws_are_its_samples() -> None:
    a, b = filled(UniformSampler()), filled(UniformSampler())
    got = a.sampler.draw_independent(50, a.lane_view(), a.rng)
    np.testing.assert_array_equal(got, b.sampler.sample(50, b.lane_view(), b.rng).keys)


def test_bad_calls_raise_before_drawing() -> None:
    buf = filled(PrioritizedSampler(alpha=1.0, eps=0.0), priority=np.zeros(6))
    state = buf.rng.bit_generator.state
    with pytest.raises(EmptyBufferError, match="every stored priority is 0"):
        buf.sampler.draw_independent(4, buf.lane_view(), buf.rng)
    with pytest.raises(ConfigError, match="batch_size"):
        buf.sampler.draw_independent(0, buf.lane_view(), buf.rng)
    assert buf.rng.bit_generator.state == state
