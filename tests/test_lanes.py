"""Vectorized lanes: per-env episodes, async ``env_ids`` adds, lane-split sampling.

Checked against a naive reference that keeps, per lane, the plain list of the
transitions the caller passed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.errors import ConfigError, ShapeError, SpecError
from replaybank.ops import ring
from replaybank.samplers.base import LaneView


class LaneRef:
    """Per lane: the live transitions ``(seq, transition)``, oldest first."""

    def __init__(self, nrows: int, lanes: int) -> None:
        self.T, self.lanes = nrows, lanes
        self.written = [0] * lanes
        self.dones = 0
        self.items: list[list[tuple[int, dict[str, Any]]]] = [[] for _ in range(lanes)]

    def add(self, lane: int, tr: dict[str, Any]) -> None:
        self.items[lane].append((self.written[lane], tr))
        self.written[lane] += 1
        self.dones += int(tr["terminated"] or tr["truncated"])
        if len(self.items[lane]) > self.T:
            del self.items[lane][0]

    def get(self, key: int) -> dict[str, Any]:
        lane, seq = key % self.lanes, key // self.lanes
        found = [tr for s, tr in self.items[lane] if s == seq]
        assert found, f"key {key} is not live in the reference"
        return found[0]

    def keys(self) -> set[int]:
        return {s * self.lanes + lane for lane in range(self.lanes) for s, _ in self.items[lane]}


class VecSim:
    """Each lane its own episodes: different lengths, terminations and truncations."""

    def __init__(self, lanes: int, rng: np.random.Generator) -> None:
        self.rng = rng
        self.counter = 0
        self.cur = [self._new() for _ in range(lanes)]
        self.t = [0] * lanes
        self.limit = [int(rng.integers(2, 9)) for _ in range(lanes)]  # truncation per lane

    def _new(self) -> int:
        self.counter += 1
        return self.counter

    def step(self, lane: int) -> dict[str, Any]:
        o, nxt = self.cur[lane], self._new()
        self.t[lane] += 1
        term = bool(self.rng.random() < 0.1)
        trunc = not term and self.t[lane] >= self.limit[lane]
        if term or trunc:
            self.cur[lane], self.t[lane] = self._new(), 0
        else:
            self.cur[lane] = nxt
        return {"obs": np.array([o, lane], np.float32), "action": np.int64(o % 3),
                "reward": np.float32(o), "next_obs": np.array([nxt, lane], np.float32),
                "terminated": term, "truncated": trunc}


def add_steps(buf: rb.ReplayBuffer, ref: LaneRef, sim: VecSim, ids: np.ndarray,
              use_ids: bool) -> None:
    trs = [sim.step(int(lane)) for lane in ids]
    stacked = {k: np.stack([np.asarray(tr[k]) for tr in trs]) for k in trs[0]}
    buf.add(env_ids=ids if use_ids else None, **stacked)
    for lane, tr in zip(ids, trs, strict=True):
        ref.add(int(lane), tr)


def check_all_live(buf: rb.ReplayBuffer, ref: LaneRef) -> None:
    t = buf.table
    assert t.counts.tolist() == [len(x) for x in ref.items]
    assert t.written.tolist() == ref.written
    keys = np.array(sorted(ref.keys()), dtype=np.int64)
    assert ring.is_live(keys, t.written, t.counts).all()
    if len(keys) == 0:
        return
    b = buf.view.gather(t, keys)
    for i, key in enumerate(keys.tolist()):
        tr = ref.get(key)
        for name in ("obs", "next_obs", "action", "reward", "terminated", "truncated"):
            np.testing.assert_array_equal(b[name][i], tr[name])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lanes=st.integers(2, 4), nrows=st.integers(1, 8), n_calls=st.integers(1, 40),
       seed=st.integers(0, 2**16))
def test_async_env_ids_match_reference(lanes: int, nrows: int, n_calls: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    buf = rb.ReplayBuffer(capacity=nrows * lanes, num_envs=lanes, seed=seed)
    ref = LaneRef(nrows, lanes)
    sim = VecSim(lanes, rng)
    for _ in range(n_calls):
        if rng.random() < 0.6:
            ids = rng.choice(lanes, size=int(rng.integers(1, lanes + 1)), replace=False)
            add_steps(buf, ref, sim, ids.astype(np.int64), True)  # any lane order
        else:
            add_steps(buf, ref, sim, np.arange(lanes), False)
        check_all_live(buf, ref)
    batch = buf.sample(64)
    live = ref.keys()
    for i, key in enumerate(batch.indices.tolist()):
        assert key in live
        np.testing.assert_array_equal(batch.next_obs[i], ref.get(key)["next_obs"])
    assert buf.episodes_seen == ref.dones


def test_synchronous_lanes_with_different_episode_ends() -> None:
    rng = np.random.default_rng(0)
    lanes, nrows = 4, 16
    buf = rb.ReplayBuffer(capacity=lanes * nrows, num_envs=lanes, seed=0)
    ref = LaneRef(nrows, lanes)
    sim = VecSim(lanes, rng)
    for _ in range(40):  # wraps every lane twice
        add_steps(buf, ref, sim, np.arange(lanes), False)
    check_all_live(buf, ref)
    b = buf.sample(500)
    lane = b.indices % lanes
    np.testing.assert_array_equal(b.obs[:, 1], lane)  # never mixes lanes
    np.testing.assert_array_equal(b.next_obs[:, 1], lane)
    # within an episode next_obs is the next obs; at an end it is the final obs, never reset
    for i, key in enumerate(b.indices.tolist()):
        tr = ref.get(key)
        np.testing.assert_array_equal(b.next_obs[i], tr["next_obs"])
    sb = buf.sample_sequences(64, 3)
    assert np.all(sb.obs[:, :, 1] == sb.obs[:, :1, 1])
    assert not np.any(sb.done[:, :-1])  # stop mode: no episode end inside a window


def test_extend_per_lane_and_env_ids_extend() -> None:
    buf = rb.ReplayBuffer(capacity=30, num_envs=3, seed=0)
    n = 4
    obs = np.arange(n * 2, dtype=np.float32).reshape(n, 2, 1)
    buf.extend(env_ids=[2, 0], obs=obs, action=np.zeros((n, 2), np.int64),
               reward=np.zeros((n, 2), np.float32), next_obs=obs + 100,
               terminated=np.zeros((n, 2), bool), truncated=np.zeros((n, 2), bool))
    t = buf.table
    assert t.counts.tolist() == [4, 0, 4] and t.written.tolist() == [4, 0, 4]
    keys = np.array([s * 3 + 2 for s in range(4)])
    np.testing.assert_array_equal(t.gather("obs", keys)[:, 0], obs[:, 0, 0])
    b = buf.sample(200)
    assert set((b.indices % 3).tolist()) == {0, 2}


def test_rejected_env_ids_leave_buffer_unchanged() -> None:
    buf = rb.ReplayBuffer(capacity=8, num_envs=2, seed=0)
    kw = {"obs": np.zeros((2, 1), np.float32), "action": [0, 0], "reward": [0.0, 0.0],
          "next_obs": np.zeros((2, 1), np.float32), "terminated": [False, False],
          "truncated": [False, False]}
    buf.add(**kw)
    before = {k: np.array(v, copy=True) for k, v in buf.table.state_arrays().items()}
    for ids in ([0, 0], [2], [], [[0, 1]], [0.5, 1]):
        with pytest.raises((ShapeError, SpecError)):
            buf.add(env_ids=ids, **kw)
    with pytest.raises((ShapeError, SpecError)):
        buf.add(env_ids=[1], **kw)  # two rows for one lane
    for k, v in buf.table.state_arrays().items():
        np.testing.assert_array_equal(v, before[k])


@pytest.mark.statistical
def test_uniform_over_all_lanes_vs_lane_split() -> None:
    lanes = 3
    buf = rb.ReplayBuffer(capacity=30, num_envs=lanes, seed=1)
    split = rb.ReplayBuffer(capacity=30, num_envs=lanes, seed=1, lane_split="random")
    assert isinstance(split.sampler, rb.LaneSplitSampler)
    sizes = [10, 2, 5]
    for b in (buf, split):
        for lane, k in enumerate(sizes):
            for t in range(k):
                b.add(env_ids=[lane], obs=np.full((1, 1), t, np.float32), action=[0],
                      reward=[0.0], next_obs=np.full((1, 1), t + 1, np.float32),
                      terminated=[False], truncated=[False])
    n = 30000
    crit = 2 + 5 * np.sqrt(4)  # dof 2
    lane_u = np.bincount(buf.sample(n).indices % lanes, minlength=lanes)
    exp_u = n * np.array(sizes) / sum(sizes)
    assert float(((lane_u - exp_u) ** 2 / exp_u).sum()) < crit
    idx = split.sample(n).indices
    lane_s = np.bincount(idx % lanes, minlength=lanes)
    exp_s = np.full(lanes, n / lanes)
    assert float(((lane_s - exp_s) ** 2 / exp_s).sum()) < crit
    # within a lane, uniform over its steps
    seq1 = idx[idx % lanes == 0] // lanes
    c = np.bincount(seq1, minlength=10)
    e = len(seq1) / 10
    assert float(((c - e) ** 2 / e).sum()) < 9 + 5 * np.sqrt(18)


def test_lane_split_sampler_details() -> None:
    s = rb.LaneSplitSampler()
    lv = LaneView(T=4, lanes=3, written=np.array([9, 0, 2]), counts=np.array([4, 0, 2]))
    keys = s.sample(1000, lv, np.random.default_rng(0)).keys
    assert ring.is_live(keys, lv.written, lv.counts).all()
    assert set((keys % 3).tolist()) == {0, 2}  # empty lanes get no share
    assert s.config() == {"type": "lane_split"} and s.state_dict() == {}
    with pytest.raises(ConfigError):
        s.sample(2, lv, np.random.default_rng(0), replace=False)
    with pytest.raises(ConfigError):
        rb.ReplayBuffer(capacity=4, lane_split="even")
    with pytest.raises(ConfigError):
        rb.ReplayBuffer(capacity=4, lane_split="random", sampler=rb.UniformSampler())


def test_lane_state_dict_roundtrip_single_checkpoint() -> None:
    rng = np.random.default_rng(3)
    buf = rb.ReplayBuffer(capacity=12, num_envs=3, seed=4, lane_split="random")
    ref = LaneRef(4, 3)
    sim = VecSim(3, rng)
    for _ in range(9):
        add_steps(buf, ref, sim, rng.choice(3, size=2, replace=False).astype(np.int64), True)
    state = buf.state_dict()
    other = rb.ReplayBuffer(capacity=12, num_envs=3, seed=0, lane_split="random")
    other.load_state_dict(state)
    assert other.sample(16) == buf.sample(16)
    np.testing.assert_array_equal(other.table.counts, buf.table.counts)
    np.testing.assert_array_equal(other.table.written, buf.table.written)
    check_all_live(other, ref)
    # continuing after the load keeps each lane's time order
    for _ in range(5):
        ids = np.array([2, 0])
        trs = [sim.step(int(lane)) for lane in ids]
        stacked = {k: np.stack([np.asarray(tr[k]) for tr in trs]) for k in trs[0]}
        other.add(env_ids=ids, **stacked)
        for lane, tr in zip(ids, trs, strict=True):
            ref.add(int(lane), tr)
    check_all_live(other, ref)


@pytest.mark.parametrize("n", [1, 5, 13])
def test_extend_longer_than_ring_and_single_lane_env_ids(n: int) -> None:
    rng = np.random.default_rng(n)
    lanes, nrows = 3, 5
    buf = rb.ReplayBuffer(capacity=lanes * nrows, num_envs=lanes, seed=0)
    ref = LaneRef(nrows, lanes)
    sim = VecSim(lanes, rng)
    add_steps(buf, ref, sim, np.arange(lanes), False)
    for ids in ([1], [2, 0], [0, 1, 2]):
        trs = [[sim.step(lane) for lane in ids] for _ in range(n)]  # [n][m]
        stacked = {k: np.stack([np.stack([np.asarray(tr[k]) for tr in row]) for row in trs])
                   for k in trs[0][0]}
        buf.extend(env_ids=ids, **stacked)
        for row in trs:
            for lane, tr in zip(ids, row, strict=True):
                ref.add(lane, tr)
        check_all_live(buf, ref)
    one = rb.ReplayBuffer(capacity=4, seed=0)
    one.add(env_ids=[0], obs=np.zeros((1, 2), np.float32), action=[1], reward=[0.5],
            next_obs=np.ones((1, 2), np.float32), terminated=[False], truncated=[True])
    b = one.sample(2)
    assert b.obs.shape == (2, 2) and bool(b.truncated.all())
