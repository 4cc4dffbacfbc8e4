"""The lean sampling path: table.gather_transitions / take_fields against a plain-Python
oracle, and ReplayBuffer.sample's one-lane uniform shortcut against the generic path."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import ConfigError, EmptyBufferError
from replaybank.samplers.uniform import UniformSampler


class _Uniform(UniformSampler):
    """The same sampler under another type: the buffer takes its generic path."""


def _fill(buf: rb.ReplayBuffer, n: int, seed: int = 0, ep: int = 7) -> None:
    rng = np.random.default_rng(seed)
    m = buf.num_envs
    for t in range(n):
        obs = rng.standard_normal((m, 3)).astype(np.float32)
        term = (np.arange(m) + t) % ep == ep - 1
        buf.add(obs=obs if m > 1 else obs[0], action=rng.integers(0, 4, m) if m > 1 else t % 4,
                reward=rng.standard_normal(m) if m > 1 else 0.5 * t,
                next_obs=(obs + 1) if m > 1 else obs[0] + 1,
                terminated=term if m > 1 else bool(term[0]),
                truncated=np.zeros(m, bool) if m > 1 else False)


def _oracle(t: Any, keys: np.ndarray) -> dict[str, np.ndarray]:
    out: dict[str, list[Any]] = {name: [] for name in t.arrays}
    for name in t.obs_fields:
        out["next_" + name] = []
    for key in keys.tolist():
        row, lane = (key // t.lanes) % t.T, key % t.lanes
        for name, arr in t.arrays.items():
            out[name].append(arr[row, lane])
        for name in t.obs_fields:
            lk = int(t.link[row, lane])
            nxt = t.side.arrays[name][lk - 1] if lk > 0 else t.arrays[name][(row + 1) % t.T, lane]
            out["next_" + name].append(nxt)
    return {k: np.asarray(v) for k, v in out.items()}


@pytest.mark.parametrize("num_envs,capacity,n", [(1, 50, 30), (1, 50, 50), (1, 50, 100),
                                                 (1, 50, 133), (3, 48, 40), (2, 20, 57)])
def test_gather_transitions_matches_oracle(num_envs: int, capacity: int, n: int) -> None:
    buf = rb.ReplayBuffer(capacity, num_envs=num_envs, seed=0)
    _fill(buf, n)
    t = buf.table
    keys = rb.UniformSampler().sample(64, buf.lane_view(), np.random.default_rng(1)).keys
    want = _oracle(t, keys)
    # batch sizes change and come back (the gather keeps the outputs' shapes of the last)
    for b, live in ((64, False), (64, True), (5, True), (64, True), (5, False)):
        got = t.gather_transitions(keys[:b], live=live)
        assert list(got) == list(want)
        for name in want:
            assert got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name][:b])
    slots = t.slots_of(keys)
    fields = t.take_fields(slots, obs=False)
    assert set(fields) == set(t.arrays) - set(t.obs_fields)
    for name, value in fields.items():
        np.testing.assert_array_equal(value, want[name])


@pytest.mark.parametrize("num_envs,capacity,n", [(1, 64, 20), (1, 64, 64), (1, 64, 200),
                                                 (2, 64, 50), (3, 48, 40), (4, 64, 300),
                                                 (-3, 48, 10)])
def test_sample_shortcut_equals_generic_path(num_envs: int, capacity: int, n: int) -> None:
    """``num_envs < 0``: that many lanes, filled unequally (one lane skips steps)."""
    lanes = abs(num_envs)
    fast = rb.ReplayBuffer(capacity, num_envs=lanes, seed=5)
    slow = rb.ReplayBuffer(capacity, num_envs=lanes, seed=5, sampler=_Uniform())
    _fill(fast, n)
    _fill(slow, n)
    if num_envs < 0:
        for buf in (fast, slow):
            for t in range(5):
                buf.add(obs=np.full((1, 3), t, np.float32), action=[0], reward=[0.0],
                        next_obs=np.full((1, 3), t + 1, np.float32), terminated=[False],
                        truncated=[False], env_ids=[1])
        assert len(set(fast.table.counts.tolist())) > 1
    for b in (1, 7, 64):
        a, c = fast.sample(b), slow.sample(b)
        assert a == c
        assert list(a) == list(c)
    assert fast.rng.bit_generator.state == slow.rng.bit_generator.state


def test_sample_shortcut_rejects_like_the_sampler() -> None:
    buf = rb.ReplayBuffer(10, seed=0, spec={"obs": ((3,), "float32"), "action": ((), "int64")})
    with pytest.raises(EmptyBufferError, match="empty"):
        buf.sample(4)
    _fill(buf, 3)
    state = buf.rng.bit_generator.state
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigError, match="batch_size"):
            buf.sample(bad)  # type: ignore[arg-type]
    assert buf.rng.bit_generator.state == state  # a rejected call draws nothing
    assert buf.sample(np.int64(2)).obs.shape == (2, 3)


def test_batch_own_does_not_copy() -> None:
    data = {"reward": np.zeros(3, np.float32)}
    b = rb.Batch.own(data)
    assert b["reward"] is data["reward"] and b == rb.Batch(data)
    with pytest.raises(AttributeError):
        b.reward = 1


@pytest.mark.parametrize("kw", [{"frame_stack": 3}, {"n_step": 3}, {"n_step": 2, "frame_stack": 2}])
def test_sample_shortcut_with_other_views_equals_generic_path(kw: dict[str, Any]) -> None:
    # a wrapped ring with short episodes: frame stacks at the oldest end get redrawn
    fast = rb.ReplayBuffer(40, seed=2, **kw)
    slow = rb.ReplayBuffer(40, seed=2, sampler=_Uniform(), **kw)
    _fill(fast, 97, ep=5)
    _fill(slow, 97, ep=5)
    for b in (1, 16, 64):
        assert fast.sample(b) == slow.sample(b)
    assert fast.rng.bit_generator.state == slow.rng.bit_generator.state
