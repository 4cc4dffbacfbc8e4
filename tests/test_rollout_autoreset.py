"""RolloutBuffer(autoreset_mode="next_step"): NEXT_STEP reset steps are stored but never
yielded and never enter GAE; truncated steps bootstrap from the next step's value.

Every GAE check compares with ``oracle``: a plain loop per env over the real transitions
only (the reset steps are left out before it runs), written from the definition.
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.config import from_config
from replaybank.errors import (
    CheckpointError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    ShapeError,
)
from tests.roundtrip import assert_roundtrip, assert_same, assert_same_state

GAMMA, LAM = 0.99, 0.95


# ------------------------------------------------------------------ the oracle
@dataclass
class Real:
    """One real transition of one env (what the oracle sees)."""

    t: int  # stored step index in its rollout
    r: float
    v: float
    term: bool = False
    trunc: bool = False
    boot: float = float("nan")  # V(final obs), read only when truncated and not terminated
    obs: Any = None


def oracle(real: list[Real], last_value: float, gamma: float = GAMMA,
           lam: float = LAM) -> list[float]:
    """GAE of one env's real transitions (consecutive in time within an episode)."""
    adv = [0.0] * len(real)
    running = 0.0
    for i in reversed(range(len(real))):
        tr = real[i]
        if tr.term:
            next_v, running = 0.0, 0.0
        elif tr.trunc:
            next_v, running = tr.boot, 0.0
        elif i == len(real) - 1:
            next_v = last_value
        else:
            next_v = real[i + 1].v
        running = tr.r + gamma * next_v - tr.v + gamma * lam * running
        adv[i] = running
    return adv


def check_against_oracle(buf: rb.RolloutBuffer, real: list[list[Real]],
                         last: Any) -> None:
    for e, steps in enumerate(real):
        ts = [tr.t for tr in steps]
        assert np.flatnonzero(buf.valid[:, e]).tolist() == ts, f"env {e}"
        want = oracle(steps, float(last[e]))
        np.testing.assert_allclose(buf.advantages[ts, e], want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(buf.returns[ts, e],
                                   np.array(want) + [tr.v for tr in steps], rtol=1e-12,
                                   atol=1e-12)
    resets = ~buf.valid
    assert np.all(buf.advantages[resets] == 0.0)
    np.testing.assert_array_equal(buf.returns[resets], buf.data["value"][resets])


def make(num_steps: int, num_envs: int, **kw: Any) -> rb.RolloutBuffer:
    kw.setdefault("normalize_advantage", None)
    return rb.RolloutBuffer(num_steps, num_envs=num_envs, gamma=GAMMA, gae_lambda=LAM,
                            autoreset_mode="next_step", seed=0, **kw)


def step(buf: rb.RolloutBuffer, r: Any, v: Any, term: Any = None, trunc: Any = None,
         **kw: Any) -> None:
    e = buf.num_envs
    buf.add(obs=np.zeros((e, 2), np.float32), action=np.zeros(e, np.int64),
            reward=np.asarray(r, np.float64), terminated=np.zeros(e, bool) if term is None
            else np.asarray(term, bool), truncated=np.zeros(e, bool) if trunc is None
            else np.asarray(trunc, bool), value=np.asarray(v, np.float64),
            log_prob=np.zeros(e), **kw)


# ------------------------------------------------------------------ real gymnasium envs
W = np.array([0.3, -0.2, 1.5, 0.4])


def value_of(obs: np.ndarray) -> np.ndarray:
    """A fixed value function ``[E, 4] -> [E]`` (float64)."""
    out: np.ndarray = np.asarray(obs, np.float64) @ W + 0.1
    return out


def policy(obs: np.ndarray) -> np.ndarray:
    """Actions that depend only on the observation (so both autoreset modes act alike on
    real steps) and look random (episodes end often)."""
    bits = np.frombuffer(np.ascontiguousarray(obs, np.float32).tobytes(), np.uint32)
    out: np.ndarray = (bits.reshape(len(obs), -1).astype(np.uint64).sum(axis=1) // 7 % 2)
    return out.astype(np.int64)


@dataclass
class Run:
    """What a vector-env loop stored, stacked ``[T, E, ...]``, plus its real transitions."""

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    term: np.ndarray
    trunc: np.ndarray
    value: np.ndarray
    final_value: np.ndarray  # V(info["final_obs"]) at SAME_STEP truncations, else NaN
    last_obs: np.ndarray
    real: list[list[Real]] = field(default_factory=list)


def collect(mode_name: str, num_steps: int, max_episode_steps: int | None,
            num_envs: int = 4, seed: int = 0) -> Run:
    """The usual on-policy loop (``obs = next_obs``) on CartPole-v1 vector envs."""
    gym = pytest.importorskip("gymnasium")
    mode = getattr(gym.vector.AutoresetMode, mode_name)
    kw = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    envs = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": mode}, **kw)
    obs, _ = envs.reset(seed=seed)
    cols: dict[str, list[Any]] = {k: [] for k in ("obs", "action", "reward", "term", "trunc",
                                                  "value", "final_value")}
    real: list[list[Real]] = [[] for _ in range(num_envs)]
    ended = np.zeros(num_envs, bool)
    for t in range(num_steps):
        value, action = value_of(obs), policy(obs)
        nxt, rew, term, trunc, info = envs.step(action)
        final = nxt.copy()  # NEXT_STEP: next_obs of an ended step is its final obs
        if "_final_obs" in info:  # SAME_STEP: next_obs is the reset obs
            for j in np.flatnonzero(info["_final_obs"]):
                final[j] = info["final_obs"][j]
        boot = value_of(final)
        fv = np.where(trunc & ~term, boot, np.nan)
        for k, v in zip(cols, (obs, action, rew, term, trunc, value, fv), strict=True):
            cols[k].append(np.array(v))
        for e in range(num_envs):
            if mode_name == "NEXT_STEP" and ended[e]:
                continue  # the reset step: not a transition
            real[e].append(Real(t, float(rew[e]), float(value[e]), bool(term[e]),
                                bool(trunc[e]), float(boot[e]), obs[e].copy()))
        ended = term | trunc
        obs = nxt
    envs.close()
    arrays = {k: np.stack(v) for k, v in cols.items()}
    return Run(**arrays, last_obs=obs, real=real)


def fill(buf: rb.RolloutBuffer, run: Run, final_values: bool = False) -> None:
    for t in range(len(run.obs)):
        buf.add(obs=run.obs[t], action=run.action[t], reward=run.reward[t],
                terminated=run.term[t], truncated=run.trunc[t], value=run.value[t],
                log_prob=np.zeros(len(run.value[t])),
                final_value=run.final_value[t] if final_values else None)


@pytest.mark.parametrize("max_episode_steps", [None, 20])
def test_cartpole_next_step_matches_the_oracle(max_episode_steps: int | None) -> None:
    run = collect("NEXT_STEP", 96, max_episode_steps)
    assert run.term.any()
    if max_episode_steps is not None:
        assert (run.trunc & ~run.term).any()
    buf = make(96, 4)
    fill(buf, run)  # no final_value anywhere: NEXT_STEP needs none
    last = value_of(run.last_obs)
    buf.compute_returns_and_advantage(last_values=last)
    assert (~buf.valid).sum() == sum(96 - len(r) for r in run.real) > 0
    check_against_oracle(buf, run.real, last)


@pytest.mark.parametrize("max_episode_steps", [None, 20])
def test_cartpole_next_step_equals_same_step_on_the_same_episodes(
        max_episode_steps: int | None) -> None:
    steps = 80
    nxt, same = collect("NEXT_STEP", steps, max_episode_steps), \
        collect("SAME_STEP", steps, max_episode_steps)
    buf = make(steps, 4)
    fill(buf, nxt)
    buf.compute_returns_and_advantage(last_values=value_of(nxt.last_obs))
    for e in range(4):
        n = len(nxt.real[e])
        ours, theirs = nxt.real[e], same.real[e][:n]
        assert [tr.t for tr in theirs] == list(range(n))  # SAME_STEP: every step is real
        for a, b in zip(ours, theirs, strict=True):  # the same transitions
            assert (a.r, a.v, a.term, a.trunc) == (b.r, b.v, b.term, b.trunc)
            np.testing.assert_array_equal(a.obs, b.obs)
        # SAME_STEP data of env e through the buffer's own same_step path
        one = rb.RolloutBuffer(n, gamma=GAMMA, gae_lambda=LAM, autoreset_mode="same_step",
                               normalize_advantage=None)
        for t in range(n):
            one.add(obs=same.obs[t, e], action=same.action[t, e], reward=same.reward[t, e],
                    terminated=same.term[t, e], truncated=same.trunc[t, e],
                    value=same.value[t, e], log_prob=0.0, final_value=same.final_value[t, e])
        after = same.obs[n, e] if n < steps else same.last_obs[e]
        one.compute_returns_and_advantage(last_values=float(value_of(after[None])[0]))
        np.testing.assert_allclose(buf.advantages[buf.valid[:, e], e], one.advantages[:, 0],
                                   rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(buf.returns[buf.valid[:, e], e], one.returns[:, 0],
                                   rtol=1e-12, atol=1e-12)


def test_same_step_default_is_unchanged_on_same_step_data() -> None:
    run = collect("SAME_STEP", 48, 20)
    out = []
    for mode in (None, "same_step"):
        buf = rb.RolloutBuffer(48, num_envs=4, autoreset_mode=mode, seed=0)
        fill(buf, run, final_values=True)
        buf.compute_returns_and_advantage(value_of(run.last_obs))
        assert buf.valid.all()
        out.append(buf.advantages)
    np.testing.assert_array_equal(out[0], out[1])
    with pytest.raises(ShapeError, match="truncated but have no final_value"):
        fill(rb.RolloutBuffer(48, num_envs=4, autoreset_mode="same_step"), run)


def epochs_of(batches: list[Any], per_epoch: int) -> list[list[Any]]:
    return [batches[i:i + per_epoch] for i in range(0, len(batches), per_epoch)]


@pytest.mark.parametrize("norm", [None, "batch", "minibatch"])
def test_generate_batches_yield_every_valid_step_once_per_epoch(norm: str | None) -> None:
    run = collect("NEXT_STEP", 64, 20)
    buf = make(64, 4, normalize_advantage=norm)
    fill(buf, run)
    buf.compute_returns_and_advantage(value_of(run.last_obs))
    valid_ids = np.flatnonzero(buf.valid.reshape(-1))
    n = len(valid_ids)
    assert 0 < n < 64 * 4
    k, s = 5, 37
    cases = [({"num_mini_batch": k}, [n // k + 1] * (n % k) + [n // k] * (k - n % k)),
             ({"mini_batch_size": s}, [s] * (n // s) + ([n % s] if n % s else []))]
    flat_adv = buf.advantages.reshape(-1)
    for kw, sizes in cases:
        batches = list(buf.generate_batches(num_epochs=3, **kw))
        assert len(batches) == 3 * len(sizes)
        for epoch in epochs_of(batches, len(sizes)):
            assert [b.batch_size for b in epoch] == sizes
            idx = np.concatenate([b.indices for b in epoch])
            assert sorted(idx.tolist()) == valid_ids.tolist()  # each valid step, once
            for b in epoch:
                assert buf.valid.reshape(-1)[b.indices].all()  # never a reset step
                np.testing.assert_array_equal(b.obs, buf.data["obs"].reshape(-1, 4)[b.indices])
                np.testing.assert_array_equal(b.returns, buf.returns.reshape(-1)[b.indices])
            adv = np.concatenate([b.advantages for b in epoch])
            if norm is None:
                np.testing.assert_array_equal(adv, flat_adv[idx])
            elif norm == "batch":  # statistics of the valid steps only
                assert abs(adv.mean()) < 1e-9 and abs(adv.std() - 1.0) < 1e-6
                want = (flat_adv[idx] - flat_adv[valid_ids].mean()) \
                    / (flat_adv[valid_ids].std() + 1e-8)
                np.testing.assert_allclose(adv, want, rtol=1e-9, atol=1e-12)
            else:
                for b in epoch:
                    if b.batch_size > 1:
                        assert abs(b.advantages.mean()) < 1e-9


def test_recurrent_generator_masks_reset_steps_and_restarts_after_them() -> None:
    run = collect("NEXT_STEP", 64, 20)
    buf = make(64, 4)
    fill(buf, run)
    buf.compute_returns_and_advantage(value_of(run.last_obs))
    valid = buf.valid
    done = (buf.data["terminated"] | buf.data["truncated"]) & valid
    first = np.concatenate([np.ones((1, 4), bool), (done | ~valid)[:-1]])  # [T, E]
    for length in (8, 13, None):
        batches = list(buf.recurrent_generator(num_mini_batch=2, chunk_length=length,
                                               num_epochs=2))
        for epoch in epochs_of(batches, 2):
            idx = np.concatenate([b.indices[b.mask] for b in epoch])
            assert sorted(idx.tolist()) == np.flatnonzero(valid.reshape(-1)).tolist()
            for b in epoch:
                assert np.all(b.indices[~b.mask] == -1)
                assert np.all(b.advantages[~b.mask] == 0) and np.all(b.obs[~b.mask] == 0)
                assert not (b.is_first | b.is_last | b.is_terminal)[~b.mask].any()
                ids = b.indices[b.mask]
                np.testing.assert_array_equal(b.is_first[b.mask], first.reshape(-1)[ids])
                np.testing.assert_array_equal(b.is_last[b.mask] & done.reshape(-1)[ids],
                                              done.reshape(-1)[ids])
    # chunks of one step: the reset steps' chunks are dropped
    n_valid = int(valid.sum())
    assert sum(b.batch_size for b in buf.recurrent_generator(mini_batch_size=10,
                                                             chunk_length=1)) == n_valid
    with pytest.raises(EmptyBufferError, match=f"only {n_valid} chunks"):
        buf.recurrent_generator(num_mini_batch=n_valid + 1, chunk_length=1)


# ------------------------------------------------------------------ small synthetic cases
def test_episode_end_at_the_last_step_of_a_rollout() -> None:
    buf = make(4, 3)
    # env 0: terminated at the last step; env 1: truncated at 1 (reset step 2 holds
    # V(final obs) = 0.8), then truncated at the last step -> last_values; env 2: truncated
    # at 1 and at the last step with explicit final values (they win)
    step(buf, [1.0, 0.5, 0.2], [0.1, 0.2, 0.3])
    step(buf, [2.0, 1.5, 1.2], [0.4, 0.5, 0.6], trunc=[False, True, True],
         final_value=[np.nan, np.nan, 3.0])
    step(buf, [0.3, 0.0, 0.0], [0.7, 0.8, 0.9])  # envs 1 and 2: reset steps
    step(buf, [1.0, 2.0, 3.0], [0.2, 0.3, 0.4], term=[True, False, False],
         trunc=[False, True, True], final_value=[np.nan, np.nan, 7.0])
    last = np.array([100.0, 5.0, 100.0])
    buf.compute_returns_and_advantage(last_values=last)
    real = [
        [Real(0, 1.0, 0.1), Real(1, 2.0, 0.4), Real(2, 0.3, 0.7), Real(3, 1.0, 0.2, term=True)],
        [Real(0, 0.5, 0.2), Real(1, 1.5, 0.5, trunc=True, boot=0.8),
         Real(3, 2.0, 0.3, trunc=True, boot=5.0)],
        [Real(0, 0.2, 0.3), Real(1, 1.2, 0.6, trunc=True, boot=3.0),
         Real(3, 3.0, 0.4, trunc=True, boot=7.0)],
    ]
    check_against_oracle(buf, real, last)
    assert buf.valid[:, 1].tolist() == [True, True, False, True]


def test_two_rollouts_in_a_row_with_an_end_at_the_boundary() -> None:
    buf = make(3, 3)
    # rollout 1: env 0 terminates and env 1 is truncated at the last step (bootstrap:
    # last_values); env 2 terminates at step 1, so its last step is a reset step
    step(buf, [1.0, 1.0, 1.0], [0.5, 0.5, 0.5])
    step(buf, [1.0, 1.0, 1.0], [0.4, 0.4, 0.4], term=[False, False, True])
    step(buf, [1.0, 1.0, 0.0], [0.3, 0.3, 9.0], term=[True, False, False],
         trunc=[False, True, False])
    last = np.array([50.0, 2.5, 60.0])
    buf.compute_returns_and_advantage(last)
    check_against_oracle(buf, [
        [Real(0, 1.0, 0.5), Real(1, 1.0, 0.4), Real(2, 1.0, 0.3, term=True)],
        [Real(0, 1.0, 0.5), Real(1, 1.0, 0.4), Real(2, 1.0, 0.3, trunc=True, boot=2.5)],
        [Real(0, 1.0, 0.5), Real(1, 1.0, 0.4, term=True)],
    ], last)
    buf.reset()
    # rollout 2: envs 0 and 1 start with their reset step; it may not end an episode
    before = copy.deepcopy(buf.state_dict())
    with pytest.raises(ShapeError, match=r"envs \[1\].*reset step.*autoreset_mode='same_step'"):
        step(buf, [0.0, 0.0, 1.0], [2.5, 2.5, 0.6], trunc=[False, True, False])
    assert_same_state(before, buf)
    step(buf, [-3.0, 7.0, 1.0], [np.nan, 2.5, 0.6])  # reset-step values are never read
    step(buf, [1.0, 1.0, 1.0], [0.2, 0.2, 0.7])
    step(buf, [1.0, 1.0, 1.0], [0.1, 0.1, 0.8])
    assert buf.valid.tolist() == [[False, False, True], [True, True, True], [True, True, True]]
    last = np.array([0.9, 0.9, 0.9])
    buf.compute_returns_and_advantage(last)
    check_against_oracle(buf, [
        [Real(1, 1.0, 0.2), Real(2, 1.0, 0.1)],
        [Real(1, 1.0, 0.2), Real(2, 1.0, 0.1)],
        [Real(0, 1.0, 0.6), Real(1, 1.0, 0.7), Real(2, 1.0, 0.8)],
    ], last)
    (batch,) = buf.recurrent_generator(num_mini_batch=1)
    order = np.argsort(batch.starts)
    # env 2's step 0 follows its reset step of rollout 1: an episode starts there
    assert batch.is_first[order].tolist() == [[False, True, False], [False, True, False],
                                              [True, False, False]]
    assert batch.mask[order].tolist() == buf.valid.T.tolist()
    assert sorted(np.concatenate([b.indices for b in buf.generate_batches(
        num_mini_batch=2)]).tolist()) == [2, 3, 4, 5, 6, 7, 8]


def test_all_envs_reset_at_once() -> None:
    buf = make(5, 3)
    step(buf, [1.0, 2.0, 3.0], [0.1, 0.2, 0.3])
    step(buf, [1.0, 2.0, 3.0], [0.1, 0.2, 0.3])
    step(buf, [1.0, 2.0, 3.0], [0.4, 0.5, 0.6], term=[True, False, True],
         trunc=[False, True, True])
    step(buf, [0.0, 0.0, 0.0], [1.1, 1.2, 1.3])  # every env: reset step
    step(buf, [1.0, 1.0, 1.0], [0.7, 0.8, 0.9])
    assert buf.valid[3].tolist() == [False] * 3 and buf.valid.sum() == 12
    last = np.array([2.0, 2.0, 2.0])
    buf.compute_returns_and_advantage(last)
    check_against_oracle(buf, [
        [Real(0, 1.0, 0.1), Real(1, 1.0, 0.1), Real(2, 1.0, 0.4, term=True), Real(4, 1.0, 0.7)],
        [Real(0, 2.0, 0.2), Real(1, 2.0, 0.2), Real(2, 2.0, 0.5, trunc=True, boot=1.2),
         Real(4, 1.0, 0.8)],
        [Real(0, 3.0, 0.3), Real(1, 3.0, 0.3), Real(2, 3.0, 0.6, term=True), Real(4, 1.0, 0.9)],
    ], last)
    assert [b.batch_size for b in buf.generate_batches(num_mini_batch=5)] == [3, 3, 2, 2, 2]
    assert [b.batch_size for b in buf.generate_batches(mini_batch_size=5)] == [5, 5, 2]
    with pytest.raises(EmptyBufferError, match="only 12 steps"):
        buf.generate_batches(num_mini_batch=13)
    assert len(list(buf.recurrent_generator(num_mini_batch=12, chunk_length=1))) == 12


def test_reset_step_contents_never_leak_into_other_steps() -> None:
    results = []
    for junk in (0.0, np.nan, 1e300):
        buf = make(12, 2)
        rng = np.random.default_rng(5)
        for t in range(12):
            term = np.array([t % 4 == 1, t % 5 == 2])
            r, v = rng.standard_normal(2), rng.standard_normal(2)
            if t:  # a reset step after each end: junk reward and value
                prev = buf.data["terminated"][t - 1]
                r, v = np.where(prev, junk, r), np.where(prev, junk, v)
                term &= ~prev
            step(buf, r, v, term=term)
        buf.compute_returns_and_advantage(rng.standard_normal(2))
        assert np.isfinite(buf.advantages).all()
        results.append(buf.advantages)
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])


def test_truncated_step_needs_a_finite_value_at_its_reset_step() -> None:
    buf = make(3, 2)
    step(buf, [1.0, 1.0], [0.1, 0.1], trunc=[False, True])
    step(buf, [0.0, 0.0], [0.2, np.nan])
    step(buf, [1.0, 1.0], [0.3, 0.3])
    with pytest.raises(DtypeError, match=r"truncated step 0 of env 1.*step 1.*is nan, not "
                                         "finite"):
        buf.compute_returns_and_advantage(np.zeros(2))
    with pytest.raises(EmptyBufferError):
        _ = buf.advantages


def test_a_nan_value_is_refused_except_at_a_reset_step() -> None:
    """A reset step's value is read by no valid step (NaN is fine there, see above); any
    other step's NaN value is refused at add, naming the env, and nothing changes."""
    buf = make(4, 2)
    step(buf, [1.0, 1.0], [0.1, 0.1], term=[True, False])
    before = buf.state_dict()
    with pytest.raises(DtypeError, match=r"values \[nan\] of env\(s\) \[1\]"):
        step(buf, [0.0, 1.0], [np.nan, np.nan])  # env 0: reset step; env 1: a real step
    assert buf.pos == before["metadata"]["pos"] == 1
    step(buf, [0.0, 1.0], [np.nan, 0.2])  # the reset step's NaN is accepted
    step(buf, [1.0, 1.0], [0.3, 0.3])
    buf.compute_returns_and_advantage(np.zeros(2))
    assert np.isfinite(buf.advantages).all()


def test_final_obs_and_value_fn_still_win() -> None:
    buf = make(3, 2)
    buf.add(obs=np.zeros((2, 2), np.float32), action=np.zeros(2, np.int64),
            reward=np.ones(2), terminated=np.zeros(2, bool),
            truncated=np.array([True, True]), value=np.full(2, 0.1), log_prob=np.zeros(2),
            final_obs=np.full((2, 2), 4.0, np.float32))
    step(buf, [0.0, 0.0], [0.2, 0.2])
    step(buf, [1.0, 1.0], [0.3, 0.3])
    with pytest.raises(ShapeError, match="value_fn=None"):
        buf.compute_returns_and_advantage(np.zeros(2))
    buf.compute_returns_and_advantage(np.zeros(2), value_fn=lambda o: o[:, 0])
    check_against_oracle(buf, [[Real(0, 1.0, 0.1, trunc=True, boot=4.0), Real(2, 1.0, 0.3)]] * 2,
                         np.zeros(2))


# ------------------------------------------------------------------ config and state
@pytest.mark.parametrize("bad", ["NEXT_STEP", "nextstep", "", 1, True])
def test_bad_autoreset_mode_is_rejected(bad: Any) -> None:
    with pytest.raises(ConfigError, match=r"autoreset_mode=.*'same_step'.*'next_step'") as err:
        rb.RolloutBuffer(4, autoreset_mode=bad)
    assert repr(bad) in str(err.value)


def test_config_rebuilds_the_mode() -> None:
    buf = make(4, 2)
    assert buf.init_config()["autoreset_mode"] == "next_step"
    twin = from_config(buf.config())
    assert twin.autoreset_mode == "next_step"
    assert rb.RolloutBuffer(4).init_config()["autoreset_mode"] is None


def _next_step_add(buf: Any, i: int) -> None:
    """Random steps that follow the NEXT_STEP contract (no end right after an end)."""
    rng = np.random.default_rng(100 + i)
    e = buf.num_envs
    prev = np.ones(e, bool)  # the first step of a rollout may be a reset step: no ends
    if buf.pos:
        prev = buf.data["terminated"][-1] | buf.data["truncated"][-1]
    buf.add(obs=rng.standard_normal((e, 3)), action=rng.integers(0, 2, e),
            reward=rng.standard_normal(e), terminated=(rng.random(e) < 0.3) & ~prev,
            truncated=(rng.random(e) < 0.3) & ~prev, value=rng.standard_normal(e),
            log_prob=rng.standard_normal(e))


def _sample(b: Any) -> Any:
    try:
        return [dict(x) for x in b.generate_batches(num_mini_batch=2)]
    except rb.EmptyBufferError:
        return b.pos


def test_checkpoint_roundtrip(tmp_path: Path) -> None:
    buf = make(8, 3, normalize_advantage="batch")
    for i in range(5):
        _next_step_add(buf, i)
    assert not buf.valid.all()
    assert_roundtrip(buf, tmp_path / "a", sample=_sample, add=_next_step_add, steps=3)
    buf.compute_returns_and_advantage(last_values=np.zeros(3))
    assert_roundtrip(buf, tmp_path / "b", sample=_sample, add=None)
    # across reset(): the pending reset steps are saved and restored
    for seed in range(10, 1000, 8):  # a rollout whose last step ends an episode
        buf.reset()
        for i in range(8):
            _next_step_add(buf, seed + i)
        ended = buf.data["terminated"][-1] | buf.data["truncated"][-1]
        if ended.any():
            break
    assert ended.any()
    buf.reset()
    loaded = assert_roundtrip(buf, tmp_path / "c", sample=None, add=_next_step_add, steps=1)
    np.testing.assert_array_equal(loaded.valid[0], ~ended)
    np.testing.assert_array_equal(buf.valid[0], ~ended)


def test_load_state_dict_refuses_another_mode_and_damaged_resets() -> None:
    buf = make(4, 2)
    step(buf, [1.0, 1.0], [0.1, 0.1], term=[True, False])
    state = buf.state_dict()
    other = rb.RolloutBuffer(4, num_envs=2)
    with pytest.raises(CheckpointError, match=r"autoreset_mode='next_step'.*autoreset_mode=None"):
        other.load_state_dict(state)
    with pytest.raises(CheckpointError, match=r"autoreset_mode=None.*'next_step'"):
        make(4, 2).load_state_dict(rb.RolloutBuffer(4, num_envs=2).state_dict())
    fresh = make(4, 2)
    before = copy.deepcopy(fresh.state_dict())
    damaged = dict(state, arrays={k: v for k, v in state["arrays"].items()
                                  if k != "start_reset"})
    with pytest.raises(CheckpointError, match="start_reset"):
        fresh.load_state_dict(damaged)
    flipped = dict(state, arrays=dict(state["arrays"], start_reset=np.array([True, False])))
    with pytest.raises(CheckpointError, match="step 0, env 0"):
        fresh.load_state_dict(flipped)
    assert_same_state(before, fresh)
    fresh.load_state_dict(state)
    assert_same_state(buf, fresh)


def test_pickle_keeps_the_pending_reset_steps() -> None:
    buf = make(2, 2)
    step(buf, [1.0, 1.0], [0.1, 0.1])
    step(buf, [1.0, 1.0], [0.2, 0.2], trunc=[True, False])
    buf.compute_returns_and_advantage(np.array([3.0, 0.0]))
    buf.reset()
    twin = pickle.loads(pickle.dumps(buf))
    assert_same_state(buf, twin)
    for b in (buf, twin):
        with pytest.raises(ShapeError, match="reset step"):
            step(b, [0.0, 0.0], [3.0, 0.3], term=[True, False])
        step(b, [0.0, 1.0], [3.0, 0.3])
        step(b, [1.0, 1.0], [0.4, 0.4])
        assert b.valid.tolist() == [[False, True], [True, True]]
        b.compute_returns_and_advantage(np.zeros(2))
    assert_same([dict(x) for x in buf.generate_batches(num_mini_batch=3)],
                [dict(x) for x in twin.generate_batches(num_mini_batch=3)])
