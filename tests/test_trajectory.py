"""PathBuffer (SpinningUp-style store / finish_path / get) against a plain-loop oracle."""

from __future__ import annotations

import json

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import CapacityError, CheckpointError, ConfigError, EmptyBufferError


def oracle_path(rews: list[float], vals: list[float], last_val: float, gamma: float,
                lam: float) -> tuple[list[float], list[float]]:
    """SpinningUp's finish_path written as loops: GAE advantages and rewards-to-go."""
    r = [*rews, last_val]
    v = [*vals, last_val]
    deltas = [r[t] + gamma * v[t + 1] - v[t] for t in range(len(rews))]
    adv = [sum((gamma * lam) ** k * deltas[t + k] for k in range(len(deltas) - t))
           for t in range(len(deltas))]
    ret = [sum(gamma ** k * r[t + k] for k in range(len(r) - t)) for t in range(len(r))][:-1]
    return adv, ret


def run_epoch(buf: rb.PathBuffer, rng: np.random.Generator,
              lengths: list[int]) -> tuple[list[float], list[float], list[float]]:
    advs: list[float] = []
    rets: list[float] = []
    obs_keys: list[float] = []
    for length in lengths:
        rews = rng.normal(size=length).tolist()
        vals = rng.normal(size=length).tolist()
        last = float(rng.normal()) if rng.random() < 0.5 else 0.0
        for t in range(length):
            obs_keys.append(float(len(obs_keys)))
            buf.store(np.array([obs_keys[-1], 0.0]), int(t % 3), np.float64(rews[t]),
                      np.float64(vals[t]), -0.5)
        buf.finish_path(last)
        a, r = oracle_path(rews, vals, last, buf.gamma, buf.lam)
        advs += a
        rets += r
    return advs, rets, obs_keys


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (0.8, 0.0)])
def test_paths_match_spinningup_oracle(gamma: float, lam: float) -> None:
    rng = np.random.default_rng(0)
    buf = rb.PathBuffer(20, gamma=gamma, lam=lam, eps=0.0)
    advs, rets, keys = run_epoch(buf, rng, [6, 1, 9, 4])
    np.testing.assert_allclose(buf.advantages, advs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(buf.returns_to_go, rets, rtol=1e-12, atol=1e-12)
    batch = buf.get()
    a = np.array(advs)
    # population std (ddof=0), as SpinningUp
    np.testing.assert_allclose(batch.advantages, (a - a.mean()) / a.std(), rtol=1e-10,
                               atol=1e-10)
    np.testing.assert_allclose(batch.returns, rets, rtol=1e-12, atol=1e-12)
    assert batch.obs[:, 0].tolist() == keys and batch.indices.tolist() == list(range(20))
    assert abs(float(batch.advantages.mean())) < 1e-12
    assert abs(float(batch.advantages.std(ddof=0)) - 1.0) < 1e-12
    assert buf.ptr == 0 and buf.path_start == 0  # get() starts a new epoch


def test_eps_and_partial_epoch_and_alias() -> None:
    rng = np.random.default_rng(1)
    buf = rb.PathBuffer(50, eps=1e-3)
    advs, _, _ = run_epoch(buf, rng, [5, 7])
    batch = buf.sample_batch()  # partial epochs are allowed once every path is finished
    a = np.array(advs)
    np.testing.assert_allclose(batch.advantages, (a - a.mean()) / (a.std() + 1e-3),
                               rtol=1e-10, atol=1e-10)
    assert batch.batch_size == 12


def test_get_errors_leave_buffer_unchanged() -> None:
    buf = rb.PathBuffer(4)
    with pytest.raises(EmptyBufferError, match="empty"):
        buf.get()
    buf.store(np.zeros(2), 0, 1.0, 0.0, 0.0)
    buf.store(np.zeros(2), 0, 1.0, 0.0, 0.0)
    buf.finish_path(0.0)
    buf.store(np.zeros(2), 0, 1.0, 0.0, 0.0)
    with pytest.raises(EmptyBufferError, match=r"steps 2\.\.2 belong to an unfinished path"):
        buf.get()
    assert buf.ptr == 3 and buf.path_start == 2
    buf.finish_path(0.5)
    assert buf.get().batch_size == 3


def test_store_full_and_finish_path_errors() -> None:
    buf = rb.PathBuffer(2)
    buf.store(np.zeros(2), 0, 1.0, 0.0, 0.0)
    buf.store(np.zeros(2), 0, 1.0, 0.0, 0.0)
    with pytest.raises(CapacityError, match=r"full \(2 steps\).*get\(\)"):
        buf.store(np.zeros(2), 0, 1.0, 0.0, 0.0)
    with pytest.raises(ConfigError, match="last_val=nan"):
        buf.finish_path(float("nan"))
    assert buf.path_start == 0
    buf.finish_path(0.0)
    buf.finish_path(0.0)  # empty path: no-op
    assert buf.path_start == 2
    with pytest.raises(ConfigError, match="size=0"):
        rb.PathBuffer(0)
    with pytest.raises(ConfigError, match="eps=-1"):
        rb.PathBuffer(3, eps=-1)


def test_returned_batch_is_a_copy() -> None:
    buf = rb.PathBuffer(2)
    buf.store(np.full(2, 1.0), 0, 1.0, 0.0, 0.0)
    buf.finish_path()
    batch = buf.get()
    buf.store(np.full(2, 9.0), 1, 5.0, 0.0, 0.0)
    assert batch.obs[0].tolist() == [1.0, 1.0] and batch.reward.tolist() == [1.0]


def test_extras_dict_obs_and_torch() -> None:
    torch = pytest.importorskip("torch")
    buf = rb.PathBuffer(3)
    for t in range(3):
        buf.store({"a": np.full(2, t, np.float32), "b": np.zeros(1, np.float32)}, t, 1.0,
                  0.5, -0.1, hidden=np.zeros(4, np.float32))
    buf.finish_path(0.2)
    batch = buf.get()
    assert batch.obs["a"][:, 0].tolist() == [0.0, 1.0, 2.0] and batch.hidden.shape == (3, 4)
    assert batch.advantages.dtype == np.float32  # the value field's dtype
    tb = batch.to_torch()
    assert isinstance(tb.advantages, torch.Tensor) and tb["obs/a"].shape == (3, 2)


def test_state_dict_round_trip_mid_path() -> None:
    rng = np.random.default_rng(2)
    buf = rb.PathBuffer(10, gamma=0.9, lam=0.8)
    run_epoch(buf, rng, [3])
    buf.store(np.array([100.0, 0.0]), 0, np.float64(2.0), np.float64(0.1), -0.5)
    state = buf.state_dict()
    json.dumps(state["init"])
    other = rb.PathBuffer(**buf.init_config())
    other.load_state_dict(state)
    for b in (buf, other):
        b.finish_path(0.3)
    x, y = buf.get(), other.get()
    assert x == y
    with pytest.raises(CheckpointError, match="size=5"):
        rb.PathBuffer(5).load_state_dict(state)


def test_paths_equal_rollout_with_truncation_bootstrap() -> None:
    """A path closed with last_val is a RolloutBuffer episode truncated with that value."""
    rng = np.random.default_rng(3)
    rews, vals = rng.normal(size=6), rng.normal(size=6)
    paths = rb.PathBuffer(6, gamma=0.95, lam=0.9)
    roll = rb.RolloutBuffer(6, gamma=0.95, gae_lambda=0.9)
    for t in range(6):
        paths.store(np.zeros(1), 0, rews[t], vals[t], 0.0)
        roll.add(np.zeros(1), 0, rews[t], False, t == 3, vals[t], 0.0,
                 final_value=0.4 if t == 3 else None)
        if t == 3:
            paths.finish_path(0.4)
    paths.finish_path(-0.2)
    roll.compute_returns_and_advantage(-0.2)
    np.testing.assert_allclose(paths.advantages, roll.advantages[:, 0], rtol=1e-12)
