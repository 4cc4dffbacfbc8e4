"""``weight_norm="batch"`` importance weights are normalised over the batch returned, in every
path that puts a batch together from several draws: sequence windows whose short starts are
redrawn (and their exact fallback), frame stacks whose unservable steps are redrawn (and
their exact fallback), each with a prioritized sampler and an ERE sampler over one. Before,
each redraw round normalised over its own draws (the first one also over rows it threw
away): one start got two weights in one batch, several rows weight 1.

Every test compares each returned weight with the formula computed from the returned
probabilities, ``(N P_i) ** -beta / max_j (N P_j) ** -beta = (P_i / min_j P_j) ** -beta``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import replaybank as rb


def assert_batch_weights(batch: Any, beta: float) -> None:
    """Every weight is ``(P_i / min P) ** -beta`` over the batch (so the smallest
    probability has weight 1 and equal keys equal weights)."""
    p = np.asarray(batch.probabilities, np.float64)
    expected = (p / p.min()) ** -beta
    np.testing.assert_allclose(batch.weights, expected, rtol=2e-6)
    keys = np.asarray(batch.starts if "starts" in batch else batch.indices)
    for k in np.unique(keys):
        assert len(set(np.asarray(batch.weights)[keys == k].tolist())) == 1, k


def episodes_of_six(sampler: Any, num_envs: int = 1, steps: int = 30) -> rb.ReplayBuffer:
    """``steps`` steps per lane in 6-step episodes, distinct priorities: a 3-step window
    starts at 4 of every 6 steps, so most batches redraw some starts."""
    buf = rb.ReplayBuffer(64 * num_envs, num_envs=num_envs, seed=0, sampler=sampler)
    prio = np.linspace(0.5, 4.0, steps * num_envs).reshape(steps, num_envs)
    for t in range(steps):
        buf.add(obs=np.full((num_envs, 1), t, np.float32), action=np.zeros(num_envs),
                reward=np.zeros(num_envs), next_obs=np.full((num_envs, 1), t + 1, np.float32),
                terminated=np.full(num_envs, t % 6 == 5), truncated=np.zeros(num_envs, bool),
                priority=prio[t])
    return buf


def per(**kw: Any) -> rb.PrioritizedSampler:
    return rb.PrioritizedSampler(alpha=0.5, eps=0.0, weight_norm="batch", **kw)


@pytest.mark.parametrize("num_envs", [1, 3])
def test_sequence_windows_redrawn_starts(num_envs: int) -> None:
    buf = episodes_of_six(per(), num_envs)
    t = buf.table
    width = 3
    for _ in range(20):
        sb = buf.sample_sequences(16, width, beta=0.7)
        assert_batch_weights(sb, 0.7)
        assert sb.mask.all()
    # and the probabilities are the unconditional ones, p_i / total
    stored = buf.sampler.key_weights(sb.starts, buf.lane_view())
    np.testing.assert_allclose(sb.probabilities, stored / buf.sampler.total)
    assert t.size == 30 * num_envs


def test_sequence_windows_probe_batch() -> None:
    """The probe's batch: start 6 got 1.0 and 0.839, start 26 0.821 and 0.683."""
    buf = episodes_of_six(per())
    sb = buf.sample_sequences(16, 3, beta=0.7)
    assert_batch_weights(sb, 0.7)
    prio = np.linspace(0.5, 4.0, 30)
    big_p = prio ** 0.5 / (prio ** 0.5).sum()
    w = (30 * big_p[sb.starts]) ** -0.7
    np.testing.assert_allclose(sb.weights, w / w.max(), rtol=2e-6)


def test_sequence_windows_exact_fallback() -> None:
    """``max_redraws=0``: the short starts are drawn among the usable ones at once (the
    exact fallback), and all rows weighed as one batch."""
    buf = episodes_of_six(per())
    for _ in range(10):
        sb = buf.sample_sequences(16, 3, beta=0.4, max_redraws=0)
        assert_batch_weights(sb, 0.4)
        assert np.all(sb.starts % 6 <= 3)


def test_sequence_windows_of_a_prioritized_ere_sampler() -> None:
    ere = rb.RecentSampler(eta=0.999, c_min=1, prioritized=per())  # update 1 of 2: ~18 steps
    buf = episodes_of_six(ere)
    for update in (0, 1):
        for _ in range(10):
            sb = buf.sample_sequences(16, 3, beta=0.6, update=update, num_updates=2)
            assert_batch_weights(sb, 0.6)


def test_identical_starts_identical_weights_across_buffers() -> None:
    """Two buffers built alike give the same batches, weights included."""
    a, b = episodes_of_six(per()), episodes_of_six(per())
    for _ in range(5):
        assert a.sample_sequences(16, 3, beta=0.7) == b.sample_sequences(16, 3, beta=0.7)


def wrapped_frame_stack(sampler: Any, capacity: int = 20, steps: int = 26) -> rb.ReplayBuffer:
    """Live steps ``steps - capacity .. steps - 1``, priority ``t + 1``; the oldest three
    lost their history, so a 4-frame stack redraws them."""
    buf = rb.ReplayBuffer(capacity, seed=0, frame_stack=4, sampler=sampler)
    for t in range(steps):
        buf.add(obs=np.full(2, t, np.uint8), action=0, reward=0.0,
                next_obs=np.full(2, t + 1, np.uint8), terminated=False, truncated=False,
                priority=float(t + 1))
    return buf


def test_frame_stack_redrawn_steps() -> None:
    buf = wrapped_frame_stack(rb.PrioritizedSampler(alpha=1.0, eps=0.0, weight_norm="batch"))
    live = np.arange(6, 26)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(20):
            b = buf.sample(8, beta=1.0)
            assert_batch_weights(b, 1.0)
            p = (b.indices + 1.0) / (live + 1.0).sum()  # key t holds step t here
            np.testing.assert_allclose(b.probabilities, p)
            w = (20 * p) ** -1.0
            np.testing.assert_allclose(b.weights, w / w.max(), rtol=2e-6)


def test_frame_stack_of_a_prioritized_ere_sampler() -> None:
    ere = rb.RecentSampler(eta=1.0, c_min=1,
                           prioritized=rb.PrioritizedSampler(alpha=1.0, eps=0.0,
                                                             weight_norm="batch"))
    buf = wrapped_frame_stack(ere)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(20):
            assert_batch_weights(buf.sample(8, beta=0.5), 0.5)


def test_frame_stack_exact_fallback() -> None:
    """Most of the mass on steps a long stack cannot serve: some rows are served in the
    redraw rounds, the others drawn among the servable steps after them; all rows are
    weighed as one batch."""
    sampler = rb.PrioritizedSampler(alpha=1.0, eps=0.0, weight_norm="batch")
    buf = rb.ReplayBuffer(16, seed=0, frame_stack=12, sampler=sampler)
    for t in range(24):  # live 8..23; 8..18 lost their history: 99% of the mass there
        buf.add(obs=np.full(2, t, np.uint8), action=0, reward=0.0,
                next_obs=np.full(2, t + 1, np.uint8), terminated=False, truncated=False,
                priority=100.0 if t < 19 else float(t - 18))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(5):
            b = buf.sample(16, beta=0.8)
            assert set(b.indices.tolist()) <= set(range(19, 24))
            assert_batch_weights(b, 0.8)


def test_prioritized_ere_schedule_advances_once_per_call() -> None:
    """Each redraw round of an ERE sampler over PER was a PER call: a linear schedule
    advanced by the rounds, and rows of one batch took different betas."""
    inner = rb.PrioritizedSampler(alpha=0.5, eps=0.0, beta=0.2, beta_schedule="linear",
                                  beta_steps=10, weight_norm="batch")
    buf = episodes_of_six(rb.RecentSampler(eta=1.0, c_min=1, prioritized=inner))
    for call in range(6):
        beta = inner.current_beta
        assert inner.calls == call
        sb = buf.sample_sequences(16, 3)
        assert_batch_weights(sb, beta)
    fs = wrapped_frame_stack(rb.RecentSampler(eta=1.0, c_min=1, prioritized=rb.PrioritizedSampler(
        alpha=1.0, eps=0.0, beta=0.2, beta_schedule="linear", beta_steps=10,
        weight_norm="batch")))
    inner = fs.sampler.prioritized
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for call in range(6):
            beta = inner.current_beta
            assert inner.calls == call
            assert_batch_weights(fs.sample(8), beta)


@pytest.mark.parametrize("norm", ["buffer", None])
def test_other_norms_unchanged_by_redraws(norm: str | None) -> None:
    """Weights that do not depend on the batch keep the per-draw formula."""
    buf = episodes_of_six(rb.PrioritizedSampler(alpha=0.5, eps=0.0, weight_norm=norm))
    prio = np.linspace(0.5, 4.0, 30) ** 0.5
    big_p = prio / prio.sum()
    sb = buf.sample_sequences(16, 3, beta=0.7)
    w = (30 * big_p[sb.starts]) ** -0.7
    expected = w if norm is None else w / (30 * big_p.min()) ** -0.7
    np.testing.assert_allclose(sb.weights, expected, rtol=2e-6)


def test_batch_weights_protocol() -> None:
    assert isinstance(rb.PrioritizedSampler(), rb.BatchWeights)
    assert isinstance(rb.RecentSampler(), rb.BatchWeights)
    assert not isinstance(rb.UniformSampler(), rb.BatchWeights)
    ere = rb.RecentSampler(prioritized=rb.PrioritizedSampler())
    assert isinstance(ere, rb.InnerSchedule) and ere.schedule is ere.prioritized
    assert rb.RecentSampler().schedule is None


def test_subnormal_probabilities_are_weighed_without_float_warnings() -> None:
    """Usable windows of priority 1e-300 beside 1e10 elsewhere: their P(i) are subnormal,
    the exact fallback draws them, and the batch ratios are computed without warnings."""
    n1 = 50
    term = np.ones(n1 + 4, bool)
    term[n1:n1 + 3] = False  # one 4-step episode at the end: starts n1, n1 + 1 usable
    buf = rb.ReplayBuffer(128, seed=0, sampler=rb.PrioritizedSampler(
        alpha=1.0, eps=0.0, weight_norm="batch"))
    buf.extend(obs=np.zeros((n1 + 4, 1), np.float32), action=np.zeros(n1 + 4),
               reward=np.zeros(n1 + 4), next_obs=np.zeros((n1 + 4, 1), np.float32),
               terminated=term, truncated=np.zeros(n1 + 4, bool),
               priority=np.r_[np.full(n1, 1e10), [1e-300, 2e-300, 1e-300, 1e-300]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sb = buf.sample_sequences(8, 3, beta=1.0)
    assert set(sb.starts.tolist()) <= {n1, n1 + 1}
    assert np.all(sb.probabilities < np.finfo(np.float64).tiny)
    expected = np.where(sb.starts == n1 + 1, 0.5, 1.0) if (sb.starts == n1).any() else 1.0
    np.testing.assert_allclose(sb.weights, expected, rtol=1e-6)
