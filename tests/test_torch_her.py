"""Hindsight relabelling on torch storage x numpy storage, with host conversions refused.

Each case builds a numpy-storage HER buffer and a torch-storage one with the same seed,
feeds both the same goal-conditioned steps (several lanes stepping at different times,
episodes ending at random, discontinuities in the data, ring wrap-around) and checks that
they sample the same batches: the same rows relabelled, with the same goals, rewards,
terminations, discounts. The torch storage runs three ways: CPU tensors with host draws,
CPU tensors with device draws (the default; HER draws its keys on the host either way),
and :class:`~tests.strict_device.StrictBackend` tensors, which raise on every host
conversion, so reading device data on the host in ``add``/``sample`` fails here as it
would fail (or stall) on a GPU.

The data encodes where a goal came from (as in ``tests/test_her.py``): in lane ``l`` the
step ``s`` achieves ``[l, s]`` and its next observation ``[l, s + 1]``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import replaybank as rb  # noqa: E402
from replaybank.device.backend import TorchBackend  # noqa: E402
from replaybank.ops.episodes import EpisodeIndex  # noqa: E402
from tests.strict_device import (  # noqa: E402
    HostSyncError,
    StrictBackend,
    allow_syncs,
    host,
)

KINDS = ["torch", "device", "strict"]
GOAL = np.array([-1.0, -1.0])


def goal_reward(achieved: Any, desired: Any, info: Any) -> Any:
    """-1 unless the goal is reached: numpy arrays in, numpy out; tensors in, tensors out."""
    return (abs(achieved - desired).sum(-1) > 0) * -1.0


def goal_reached(achieved: Any, desired: Any, info: Any) -> Any:
    return abs(achieved - desired).sum(-1) == 0


rb.register_function("test_torch_her_reward", goal_reward)
rb.register_function("test_torch_her_reached", goal_reached)


def backend(kind: str) -> Any:
    if kind == "strict":
        return StrictBackend("cpu", draws="host")
    return TorchBackend("cpu", draws="host" if kind == "torch" else "device")


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def obs(lane: np.ndarray, seq: np.ndarray) -> dict[str, np.ndarray]:
    ag = np.stack([lane, seq], axis=-1).astype(np.float64)
    return {"observation": (ag * 2).astype(np.float32), "achieved_goal": ag,
            "desired_goal": np.broadcast_to(GOAL, ag.shape).copy()}


def fill(bufs: list[Any], lanes: int, steps: int, seed: int, p_end: float = 0.15) -> None:
    """Lanes step at different times (``env_ids``), end episodes at random, and now and
    then jump ahead (the next add does not continue from the last next observation)."""
    rng = np.random.default_rng(seed)
    seq = np.zeros(lanes, np.int64)
    for _ in range(steps):
        ids = np.flatnonzero(rng.random(lanes) >= 0.3)
        if len(ids) == 0:
            continue
        jump = rng.random(len(ids)) < 0.05
        seq[ids[jump]] += 5  # a discontinuity
        s = seq[ids]
        done = rng.random(len(ids)) < p_end
        term = done & (rng.random(len(ids)) < 0.5)
        kw = dict(obs=obs(ids, s), action=rng.normal(size=(len(ids), 2)).astype(np.float32),
                  reward=-np.ones(len(ids), np.float32), next_obs=obs(ids, s + 1),
                  terminated=term, truncated=done & ~term, env_ids=ids)
        for b in bufs:
            b.add(**kw)
        seq[ids] += 1


def same(a: Any, b: Any) -> None:
    assert set(a) == set(b), (sorted(a), sorted(b))
    for k in a:
        np.testing.assert_array_equal(host(a[k]), host(b[k]), err_msg=k)


def pair(kind: str, **kwargs: Any) -> tuple[rb.HerReplayBuffer, rb.HerReplayBuffer]:
    kwargs.setdefault("reward_fn", goal_reward)
    kwargs.setdefault("seed", 3)
    return (rb.HerReplayBuffer(90, num_envs=3, **kwargs),
            rb.HerReplayBuffer(90, num_envs=3, storage=backend(kind), **kwargs))


def check_batches(ref: Any, tb: Any, n: int = 3, batch: int = 64) -> None:
    relabeled = 0
    for _ in range(n):
        a, b = ref.sample(batch), tb.sample(batch)
        same(a, b)
        assert isinstance(b["relabeled"], torch.Tensor)
        assert b["relabeled"].dtype == torch.bool
        relabeled += int(host(b["relabeled"]).sum())
    assert relabeled > 0


# ---------------------------------------------------------------------- the matrix
@pytest.mark.parametrize("unfinished", [False, True])
@pytest.mark.parametrize("strategy", ["future", "final", "episode", "random"])
def test_strategies(kind: str, strategy: str, unfinished: bool) -> None:
    ref, tb = pair(kind, strategy=strategy, k=4, relabel_unfinished=unfinished)
    fill([ref, tb], 3, 70, seed=1)  # wraps around
    check_batches(ref, tb)
    fill([ref, tb], 3, 9, seed=2)  # the index follows later writes
    check_batches(ref, tb, n=2)


@pytest.mark.parametrize("terminated_fn", [None, "test_torch_her_reached"])
def test_nstep(kind: str, terminated_fn: str | None) -> None:
    ref, tb = pair(kind, strategy="future", k=3, n_step=3, gamma=0.9,
                   terminated_fn=terminated_fn)
    fill([ref, tb], 3, 70, seed=4)
    check_batches(ref, tb)


def test_terminated_fn_one_step(kind: str) -> None:
    ref, tb = pair(kind, strategy="episode", terminated_fn=goal_reached)
    fill([ref, tb], 3, 50, seed=5)
    check_batches(ref, tb)


def test_prioritized(kind: str) -> None:
    ref, tb = pair(kind, strategy="future",
                   sampler=rb.PrioritizedSampler(alpha=0.7, beta=0.5))
    fill([ref, tb], 3, 60, seed=6)
    for i in range(3):
        a, b = ref.sample(32), tb.sample(32)
        same(a, b)
        p = np.abs(np.random.default_rng(i).normal(size=32)) + 0.01
        assert ref.update_priorities(a.indices, p) == tb.update_priorities(b.indices, p)


def test_save_load(kind: str, tmp_path: Path) -> None:
    ref, tb = pair(kind, reward_fn="test_torch_her_reward", strategy="future", n_step=2,
                   sampler=rb.PrioritizedSampler(alpha=0.6))
    fill([ref, tb], 3, 50, seed=7)
    same(ref.sample(16), tb.sample(16))  # the episode index is built
    with allow_syncs(10**6):  # saving copies the tensors to the host: allowed there
        rb.save(tb, tmp_path / "t")
    tb2 = rb.load(tmp_path / "t", storage=backend(kind))
    assert isinstance(tb2, rb.HerReplayBuffer)
    a, b = ref.sample(16), tb.sample(16)
    same(a, b)
    same(b, tb2.sample(16))  # the identical next sample after the round trip
    fill([ref, tb2], 3, 12, seed=8)  # the rebuilt index follows new writes
    same(ref.sample(32), tb2.sample(32))


def test_pickle_and_clear(kind: str) -> None:
    ref, tb = pair(kind, strategy="final")
    fill([ref, tb], 3, 40, seed=9)
    same(ref.sample(16), tb.sample(16))
    if kind != "strict":  # StrictTensor has no deepcopy: the view state is what matters
        tb = copy.deepcopy(tb)
    same(ref.sample(16), tb.sample(16))
    for b in (ref, tb):
        b.clear()
    fill([ref, tb], 3, 30, seed=10)
    check_batches(ref, tb, n=2)


# ---------------------------------------------------------------------- device specifics
def test_user_functions_get_device_tensors() -> None:
    seen: list[Any] = []

    def spy(achieved: Any, desired: Any, info: Any) -> Any:
        seen.append((type(achieved).__name__, type(desired).__name__, info))
        return goal_reward(achieved, desired, info)

    _, tb = pair("strict", reward_fn=spy, strategy="final", k=1000)
    fill([tb], 3, 40, seed=11, p_end=0.5)
    b = tb.sample(32)
    assert seen and all(s == ("StrictTensor", "StrictTensor", {}) for s in seen)
    new = host(b["relabeled"])
    assert new.any()
    goals = host(b["obs/desired_goal"])[new]
    np.testing.assert_array_equal(goals, host(b["next_obs/desired_goal"])[new])
    reached = np.abs(host(b["next_obs/achieved_goal"])[new] - goals).sum(-1) == 0
    np.testing.assert_array_equal(host(b.reward)[new], np.where(reached, 0.0, -1.0))
    assert (host(b["obs/desired_goal"])[~new] == GOAL).all()


def test_host_results_are_accepted() -> None:
    """A reward function may return numpy (or a list): copied to the device."""
    ref, tb = pair("torch", reward_fn=lambda a, d, info: np.asarray(
        goal_reward(np.asarray(a), np.asarray(d), info)), strategy="future")
    fill([ref, tb], 3, 40, seed=12)
    check_batches(ref, tb, n=2)


def test_k0_and_no_finished_episodes(kind: str) -> None:
    ref, tb = pair(kind, k=0)
    fill([ref, tb], 3, 20, seed=13)
    a, b = ref.sample(16), tb.sample(16)
    same(a, b)
    assert isinstance(b["relabeled"], torch.Tensor) and not host(b["relabeled"]).any()
    ref, tb = pair(kind, strategy="future")  # no episode ended: nothing relabelled
    fill([ref, tb], 3, 10, seed=14, p_end=0.0)
    same(ref.sample(16), tb.sample(16))


def test_relabelled_rewards_are_those_of_the_goals_served(kind: str) -> None:
    """Achieved goals float64, desired goals float32: on the device too, the reward is
    ``reward_fn`` of the goal as the batch holds it, and numpy storage agrees."""
    ref, tb = pair(kind, strategy="future", k=4)
    for t in range(5):
        o = [{"observation": np.zeros((3, 2), np.float32),
              "achieved_goal": np.full((3, 1), 0.1 * (t + i)),
              "desired_goal": np.full((3, 1), 9.0, np.float32)} for i in (0, 1)]
        for b in (ref, tb):
            b.add(obs=o[0], action=np.zeros((3, 2), np.float32), reward=-np.ones(3),
                  next_obs=o[1], terminated=np.zeros(3, bool), truncated=np.full(3, t == 4))
    a, b = ref.sample(256), tb.sample(256)
    same(a, b)
    new = host(b["relabeled"])
    got = host(b.reward)[new]
    want = goal_reward(host(b["next_obs/achieved_goal"])[new],
                       host(b["obs/desired_goal"])[new], {})
    assert host(b["obs/desired_goal"]).dtype == np.float32 and new.sum() > 100
    np.testing.assert_array_equal(got, want)
    assert 0 < (want == 0).sum() < new.sum()


@pytest.mark.parametrize("terminated_fn", [None, "test_torch_her_reached"])
def test_nstep_functions_see_only_the_steps_of_the_windows(kind: str,
                                                           terminated_fn: str | None) -> None:
    """A reward that is NaN for a goal no step achieved (the zeros of slots never written,
    past the end of windows cut short by their episode's end): the device's n-step returns
    stay finite and equal numpy's (they were NaN: NaN * weight 0 past a window's end)."""
    def strict(achieved: Any, desired: Any, info: Any) -> Any:
        return goal_reward(achieved, desired, info) / (achieved[:, 1] >= 1)

    ref, tb = pair(kind, reward_fn=strict, terminated_fn=terminated_fn, n_step=3, k=1000)
    fill([ref, tb], 3, 12, seed=16, p_end=0.4)  # 90 slots: most never written
    b = tb.sample(128)
    assert np.isfinite(host(b.reward)).all() and host(b["relabeled"]).any()
    same(ref.sample(128), b)


@pytest.mark.parametrize("n_step", [1, 2])
def test_bad_reward_shape_restores_the_generator(kind: str, n_step: int) -> None:
    _, tb = pair(kind, reward_fn=lambda a, d, info: a[:, :1].repeat(1, 2), k=1000,
                 n_step=n_step)
    fill([tb], 3, 30, seed=15, p_end=1.0)
    before = copy.deepcopy(tb.rng.bit_generator.state)
    with pytest.raises(rb.ShapeError, match="reward_fn returned shape"):
        tb.sample(8)
    assert tb.rng.bit_generator.state == before


def test_sample_reads_no_device_data_on_the_host() -> None:
    """Every strategy, n-step with terminated_fn, PER: StrictBackend raises on any host
    conversion of device data (the matrix above runs the same calls and compares)."""
    for kwargs in ({"strategy": "random", "relabel_unfinished": True},
                   {"strategy": "future", "n_step": 3, "terminated_fn": goal_reached},
                   {"strategy": "episode", "sampler": rb.PrioritizedSampler()}):
        tb = rb.HerReplayBuffer(60, num_envs=2, reward_fn=goal_reward, seed=0,
                                storage=StrictBackend("cpu"), **kwargs)
        fill([tb], 2, 40, seed=16)
        b = tb.sample(64)
        assert host(b["relabeled"]).any()
    with pytest.raises(HostSyncError):  # the trap is armed
        np.asarray(b.reward)


def test_episode_index_from_the_host_tail() -> None:
    """sync_newest (device storage: the newest steps' done flags from the host tail)
    indexes exactly what sync over the flag arrays indexes."""
    ref, tb = pair("torch")
    for seed in range(3):
        fill([ref, tb], 3, 25, seed=20 + seed)
        t, d = ref.table, tb.table
        a, b = EpisodeIndex(t.T, t.lanes), EpisodeIndex(d.T, d.lanes)
        a.sync(t.link, t.arrays["terminated"], t.arrays["truncated"], t.written, t.counts,
               t.epoch)
        assert d.tail is not None
        b.sync_newest(d.link, d.tail.done, d.written, d.counts, d.epoch)
        for lane in range(3):
            live = np.arange(t.written[lane] - t.counts[lane], t.written[lane]) % t.T \
                * t.lanes + lane
            np.testing.assert_array_equal(a.end[live], b.end[live])
            np.testing.assert_array_equal(
                np.maximum(a.begin[live], t.written[lane] - t.counts[lane]),
                np.maximum(b.begin[live], t.written[lane] - t.counts[lane]))


def test_config_round_trip_keeps_the_storage() -> None:
    buf = rb.HerReplayBuffer(60, num_envs=2, reward_fn="test_torch_her_reward",
                             strategy="episode", storage="torch", device="cpu", seed=0)
    cfg = buf.init_config()
    assert cfg["storage"] == "torch" and cfg["device"] == "cpu"
    again = rb.from_config(buf.config())
    assert isinstance(again, rb.HerReplayBuffer) and again.backend.name == "torch"
    assert again.her.config() == buf.her.config()
