"""Hardening of sampling and priorities: extreme PER priorities, argument checks that
raise library errors at the call, and failed calls that change no state (generator,
beta schedule, priorities): after each failure the next sample equals the one a buffer
that never saw the failing call draws."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import (
    CapacityError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    ReplayBankError,
)
from tests.roundtrip import assert_same_state


def steps(n: int, done_every: int = 0) -> dict[str, Any]:
    term = np.zeros(n, bool)
    if done_every:
        term[done_every - 1::done_every] = True
    obs = np.arange(2 * n + 2, dtype=np.float32).reshape(n + 1, 2)
    return dict(obs=obs[:-1], action=np.zeros(n), reward=np.ones(n, np.float32),
                next_obs=obs[1:],
                terminated=term, truncated=np.zeros(n, bool))


def per(kernel: str = "auto", capacity: int = 16, n: int = 8, **kw: Any) -> rb.ReplayBuffer:
    buf = rb.ReplayBuffer(capacity, seed=0, sampler=rb.PrioritizedSampler(kernel=kernel, **kw))
    buf.extend(**steps(n))
    return buf


def uniform(n: int = 8, done_every: int = 0, **kw: Any) -> rb.ReplayBuffer:
    buf = rb.ReplayBuffer(16, seed=0, **kw)
    buf.extend(**steps(n, done_every))
    return buf


def unchanged(make: Callable[[], rb.ReplayBuffer], fail: Callable[[rb.ReplayBuffer], Any],
              exc: type[Exception], then: Callable[[rb.ReplayBuffer], Any],
              *fragments: str) -> None:
    """``fail`` raises ``exc`` (a library error naming ``fragments``) and the next ``then``
    equals that of a buffer that never saw the failing call (generator, schedule, data)."""
    a, b = make(), make()
    with pytest.raises(exc) as info:
        fail(a)
    assert isinstance(info.value, ReplayBankError)
    for frag in fragments:
        assert frag in str(info.value), (frag, str(info.value))
    calls = getattr(a.sampler, "calls", None)
    assert calls == getattr(b.sampler, "calls", None)
    x, y = then(a), then(b)
    for name in x:
        assert np.array_equal(np.asarray(x[name]), np.asarray(y[name])), name
    assert a.rng.bit_generator.state == b.rng.bit_generator.state


def next_sample(buf: rb.ReplayBuffer) -> Any:
    return buf.sample(8)


# ---------------------------------------------------------------------- extreme PER
@pytest.mark.parametrize("kernel", ["numpy", "numba"])
def test_priorities_that_would_overflow_the_tree_are_rejected(kernel: str) -> None:
    make = lambda: per(kernel, alpha=1.0, eps=0.0)  # noqa: E731
    huge = np.array([1e308, 1e308, 1, 1, 1, 1, 1, 1.0])
    unchanged(make, lambda b: b.update_priorities(np.arange(8), huge), DtypeError, next_sample,
              "1e+308", "rescale")
    unchanged(make, lambda b: b.add(**{k: v[0] for k, v in steps(1).items()}, priority=1e308),
              DtypeError, next_sample, "priority=1e+308")
    buf = make()
    assert buf.sampler.priority_limit == pytest.approx(1e300 / 16)
    assert np.isfinite(buf.sampler.total)


@pytest.mark.parametrize("kernel", ["numpy", "numba"])
def test_extreme_allowed_priorities_draw_with_the_right_probabilities(kernel: str) -> None:
    buf = per(kernel, alpha=1.0, eps=0.0, beta=1.0)
    top = buf.sampler.priority_limit
    p = np.array([top, top, top / 2, top / 4, top * 1e-3, 1.0, 1e-300, 0.0])
    buf.update_priorities(np.arange(8), p)
    assert np.isfinite(buf.sampler.total)
    b = buf.sample(40_000)
    freq = np.bincount(b.indices, minlength=8) / len(b.indices)
    want = p / p.sum()
    assert np.allclose(freq, want, atol=0.01)
    assert freq[0] > 0.3 and freq[1] > 0.3  # the dominant slots are drawn
    assert np.allclose(b.probabilities, want[b.indices], rtol=1e-9)
    assert np.all(b.weights > 0) and b.weights.dtype == np.float32


@pytest.mark.parametrize("kernel", ["numpy", "numba"])
@pytest.mark.parametrize("norm", ["buffer", "batch", None])
def test_weights_never_underflow_to_zero(kernel: str, norm: str | None) -> None:
    buf = per(kernel, alpha=1.0, eps=0.0, weight_norm=norm)
    buf.update_priorities(np.arange(8), np.array([1e-30, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30,
                                                  1e30]))
    w = buf.sample(64, beta=1.0).weights
    assert w.dtype == np.float32 and np.all(w > 0) and np.all(np.isfinite(w))


@pytest.mark.parametrize("arg", ["eps", "alpha", "beta"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1.0, "x", True])
def test_non_finite_or_bad_per_arguments_are_rejected(arg: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=arg):
        rb.PrioritizedSampler(**{arg: value})


@pytest.mark.parametrize("beta", [float("nan"), float("inf"), 1.5, -0.1, "x"])
def test_bad_beta_at_sample_changes_nothing(beta: Any) -> None:
    unchanged(lambda: per(beta_schedule="linear", beta_steps=10),
              lambda b: b.sample(4, beta=beta), ConfigError, next_sample, "beta=")


# ---------------------------------------------------------------------- silent accepts
@pytest.mark.parametrize("make", [uniform, per], ids=["uniform", "per"])
def test_unknown_sample_keyword_is_a_type_error_naming_it(make: Any) -> None:
    unchanged(make, lambda b: b.sample(4, betta=0.5), TypeError, next_sample, "betta",
              "replace")
    with pytest.raises(TypeError, match="beta"):  # the accepted ones are listed
        make().sample(4, betta=0.5)


def test_unknown_sample_sequences_keyword_lists_the_accepted_ones() -> None:
    def fail(b: rb.ReplayBuffer) -> Any:
        return b.sample_sequences(2, 3, betta=0.5)

    unchanged(per, fail, TypeError, next_sample, "betta", "burn_in", "beta")
    unchanged(uniform, fail, TypeError, next_sample, "betta", "episode_boundary")


def test_recent_sampler_accepts_its_options_only() -> None:
    make = lambda: uniform(sampler=rb.RecentSampler(c_min=2))  # noqa: E731
    assert make().sample(4, update=1, num_updates=4).obs.shape == (4, 2)
    unchanged(make, lambda b: b.sample(4, updates=1), TypeError, next_sample, "updates",
              "num_updates")


@pytest.mark.parametrize("make", [uniform, per], ids=["uniform", "per"])
@pytest.mark.parametrize("replace", ["no", 0, 1, None, "False"])
def test_replace_must_be_a_bool(make: Any, replace: Any) -> None:
    unchanged(make, lambda b: b.sample(4, replace=replace), TypeError, next_sample,
              "replace=", "bool")
    assert make().sample(4, replace=np.bool_(False)).indices.shape == (4,)


def test_negative_indices_are_not_keys() -> None:
    unchanged(per, lambda b: b.update_priorities(np.array([3, -1]), [1.0, 2.0]), ConfigError,
              next_sample, "[-1]", "negative")


@pytest.mark.parametrize("prio", [["a"], "a", np.array(["1.0x"])])
def test_string_priorities_are_dtype_errors(prio: Any) -> None:
    unchanged(per, lambda b: b.update_priorities(np.array([1]), prio), DtypeError,
              next_sample, "priorities", "numbers")
    unchanged(per, lambda b: b.add(**{k: v[0] for k, v in steps(1).items()}, priority=prio),
              DtypeError, next_sample, "priority=")


def test_sequence_td_errors_must_match_the_mask() -> None:
    buf = per()
    sb = buf.sample_sequences(2, 3)
    with pytest.raises(rb.ShapeError, match="td_errors"):
        buf.update_sequence_priorities(sb.starts, np.ones((2, 2)), mask=sb.mask)


# ---------------------------------------------------------------------- sizes
@pytest.mark.parametrize("make", [uniform, per], ids=["uniform", "per"])
def test_huge_batch_is_rejected_before_anything_changes(make: Any) -> None:
    unchanged(make, lambda b: b.sample(10**12), CapacityError, next_sample,
              "batch_size=1000000000000")
    unchanged(make, lambda b: b.sample_sequences(10**12, 2), CapacityError, next_sample,
              "batch_size=1000000000000")
    unchanged(make, lambda b: b.sample_sequences(2, 10**12, strict=False), CapacityError,
              next_sample, "sequence_length=1000000000000")


@pytest.mark.parametrize("make", [uniform, per], ids=["uniform", "per"])
@pytest.mark.parametrize("bad", [True, 2.0, 0, -1, None, "8"])
def test_every_size_argument_is_checked(make: Any, bad: Any) -> None:
    unchanged(make, lambda b: b.sample(bad), ConfigError, next_sample, "batch_size=")
    unchanged(make, lambda b: b.sample_sequences(bad, 2), ConfigError, next_sample,
              "batch_size=")
    unchanged(make, lambda b: b.sample_sequences(2, bad), ConfigError, next_sample,
              "sequence_length=")


def test_huge_capacities_are_capacity_errors_up_front() -> None:
    with pytest.raises(CapacityError, match="capacity"):
        rb.PrioritizedReplayBuffer(10**12)
    with pytest.raises(CapacityError, match="num_steps"):
        rb.RolloutBuffer(10**12)
    with pytest.raises(CapacityError, match="n_step=1099511627776"):
        rb.ReplayBuffer(16, n_step=2**40)
    with pytest.raises(CapacityError, match="frame_stack=2147483648"):
        rb.ReplayBuffer(16, frame_stack=2**31)


@pytest.mark.parametrize("eps", ["x", None, float("nan"), -1.0, True])
def test_rollout_advantage_eps_is_checked(eps: Any) -> None:
    with pytest.raises(ConfigError, match="advantage_eps"):
        rb.RolloutBuffer(4, advantage_eps=eps)


# ---------------------------------------------------------------------- late failures
@pytest.mark.parametrize("make", [uniform, per], ids=["uniform", "per"])
def test_failed_sample_sequences_leaves_the_generator_and_schedule(make: Any) -> None:
    def short() -> rb.ReplayBuffer:  # episodes of 2 steps: no strict window of 3
        buf = make()
        buf.clear()
        buf.extend(**steps(8, done_every=2))
        if isinstance(buf.sampler, rb.PrioritizedSampler):
            buf.sampler.beta_schedule = "linear"
        return buf

    unchanged(short, lambda b: b.sample_sequences(2, 3), EmptyBufferError,
              lambda b: b.sample_sequences(4, 2), "strict=False")


@pytest.mark.parametrize("kernel", ["numpy", "numba"])
@pytest.mark.parametrize("replace", [True, False])
def test_zero_total_priority_does_not_advance_beta(kernel: str, replace: bool) -> None:
    def make() -> rb.ReplayBuffer:
        buf = per(kernel, eps=0.0, beta_schedule="linear", beta_steps=5)
        buf.update_priorities(np.arange(8), np.zeros(8))
        return buf

    def then(b: rb.ReplayBuffer) -> Any:
        b.update_priorities(np.arange(8), np.arange(1.0, 9.0))
        return b.sample(8)

    unchanged(make, lambda b: b.sample(4, replace=replace), EmptyBufferError, then,
              "priority is 0")


def test_per_without_replacement_too_few_positive_changes_nothing() -> None:
    def make() -> rb.ReplayBuffer:
        buf = per(eps=0.0, beta_schedule="linear", beta_steps=5)
        buf.update_priorities(np.arange(8), np.array([1.0, 1.0, 0, 0, 0, 0, 0, 0]))
        return buf

    unchanged(make, lambda b: b.sample(4, replace=False), EmptyBufferError, next_sample,
              "positive priority")


def test_frame_stack_per_schedule_advances_once_per_call() -> None:
    buf = rb.ReplayBuffer(16, seed=0, frame_stack=4,
                          sampler=rb.PrioritizedSampler(beta_schedule="linear", beta_steps=10))
    buf.extend(**steps(16))
    buf.extend(**steps(3))  # wrapped: the oldest steps lost their history (redraws)
    for i in range(5):
        buf.sample(32)
        assert buf.sampler.calls == i + 1


def test_sequence_td_errors_one_step_short_are_refused() -> None:
    """``[B, L-1]`` TD errors (one per transition of an ``L``-step window, a common slip)
    are refused without a mask, naming the widths the buffer sampled; priorities and the
    next sample are unchanged."""
    buf = rb.PrioritizedReplayBuffer(64, seed=0)
    for t in range(30):
        buf.add(obs=np.full(2, t, np.float32), action=0, reward=0.0,
                next_obs=np.full(2, t + 1, np.float32), terminated=False, truncated=False)
    batch = buf.sample_sequences(4, 5, burn_in=1)
    twin = copy.deepcopy(buf)
    with pytest.raises(rb.ShapeError, match=r"\[6\] steps"):
        buf.update_sequence_priorities(batch.starts, np.ones((4, 5)))
    assert_same_state(buf, twin)
    assert buf.update_sequence_priorities(batch.starts, np.ones((4, 6))) == 4
