"""HerReplayBuffer on real FetchReach-v4 episodes, checked against a plain-Python record.

Fast tests: random-action episodes go into ``rb.HerReplayBuffer`` (one env, and two envs
whose episodes end at different steps, each with an unfinished episode at the end); every
sampled row is found in the record by its (unique, random) action and checked: the stored
observations, goals, flags and rewards, the relabelled goal against the later achieved goals
of the same episode, and the reward against ``env.unwrapped.compute_reward``.

Slow test (``-m slow``): ``examples/her_fetch_reach.py`` reaches >= 90% greedy success
within 20,000 env steps for seeds 0, 1 and 2.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("mujoco")
pytest.importorskip("gymnasium_robotics")
gym = pytest.importorskip("gymnasium")

import replaybank as rb  # noqa: E402

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "her_fetch_reach.py"
K = 4  # relabelled share of finished-episode rows: K / (K + 1)


def make_env(max_episode_steps: int | None = None) -> Any:
    import gymnasium_robotics

    gym.register_envs(gymnasium_robotics)
    if max_episode_steps is None:
        return gym.make("FetchReach-v4")
    return gym.make("FetchReach-v4", max_episode_steps=max_episode_steps)


@dataclass
class Step:
    episode: int  # a number unique over all envs
    t: int  # step within the episode
    obs: dict[str, np.ndarray]
    action: np.ndarray
    reward: float
    next_obs: dict[str, np.ndarray]
    terminated: bool
    truncated: bool


@dataclass
class Record:
    """Every stored step, found by its action; episodes as lists of steps."""

    steps: dict[bytes, Step] = field(default_factory=dict)
    episodes: dict[int, list[Step]] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)

    def add(self, step: Step) -> None:
        key = akey(step.action)
        assert key not in self.steps
        self.steps[key] = step
        self.episodes.setdefault(step.episode, []).append(step)
        if step.terminated or step.truncated:
            self.finished.add(step.episode)


def akey(action: np.ndarray) -> bytes:
    return np.asarray(action, np.float32).tobytes()


def collect(num_envs: int, lengths: list[int | None], steps: int, seed: int
            ) -> tuple[Any, Record, Any]:
    """``steps`` vector steps of ``num_envs`` FetchReach envs with random actions."""
    envs = [make_env(n) for n in lengths]
    reward_fn = envs[0].unwrapped.compute_reward
    buf = rb.HerReplayBuffer(10_000, num_envs=num_envs, reward_fn=reward_fn,
                             strategy="future", k=K, seed=seed)
    record = Record()
    obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    for i, env in enumerate(envs):
        env.action_space.seed(seed + 100 + i)
    episode = list(range(num_envs))
    t = [0] * num_envs
    next_episode = num_envs
    for _ in range(steps):
        out = []
        for i, env in enumerate(envs):
            action = env.action_space.sample()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            step = Step(episode[i], t[i], obs[i], action, float(reward), next_obs,
                        bool(terminated), bool(truncated))
            record.add(step)
            out.append(step)
            t[i] += 1
            obs[i] = next_obs
            if terminated or truncated:
                obs[i], _ = env.reset()
                episode[i], t[i] = next_episode, 0
                next_episode += 1
        if num_envs == 1:
            (s,) = out
            buf.add(obs=s.obs, action=s.action, reward=s.reward, next_obs=s.next_obs,
                    terminated=s.terminated, truncated=s.truncated)
        else:
            def stack(key: str, part: str, out: list[Step] = out) -> np.ndarray:
                return np.stack([getattr(s, part)[key] for s in out])

            buf.add(obs={k: stack(k, "obs") for k in out[0].obs},
                    action=np.stack([s.action for s in out]),
                    reward=np.array([s.reward for s in out], np.float32),
                    next_obs={k: stack(k, "next_obs") for k in out[0].obs},
                    terminated=np.array([s.terminated for s in out]),
                    truncated=np.array([s.truncated for s in out]))
    for env in envs:
        env.close()
    assert len(buf) == steps * num_envs
    return buf, record, reward_fn


def same(a: Any, ref: Any) -> bool:
    """Exact equality once the reference is cast to the dtype the buffer returned."""
    a = np.asarray(a)
    return bool(np.array_equal(a, np.asarray(ref, dtype=a.dtype)))


def check_batches(buf: Any, record: Record, reward_fn: Any, batches: int) -> dict[str, int]:
    counts = dict(rows=0, finished_rows=0, relabeled=0, later=0, at_t=0)
    index_of: dict[int, bytes] = {}
    for _ in range(batches):
        b = buf.sample(256)
        obs, nobs = b.obs, b.next_obs
        assert set(obs) == set(nobs) == {"observation", "achieved_goal", "desired_goal"}
        relabeled = np.asarray(b["relabeled"])
        reward = np.asarray(b.reward)
        n = reward.shape[0]
        assert n == 256 and relabeled.shape == (n,) and relabeled.dtype == bool
        # the goal is the same on both sides of the transition, relabelled or not
        np.testing.assert_array_equal(obs["desired_goal"], nobs["desired_goal"])
        # every reward, relabelled or stored, is FetchReach's reward for the row's goal
        expect = reward_fn(np.asarray(nobs["achieved_goal"]), np.asarray(obs["desired_goal"]),
                           {})
        np.testing.assert_array_equal(reward, np.asarray(expect, dtype=reward.dtype))
        for j in range(n):
            key = akey(np.asarray(b.action)[j])
            assert key in record.steps, "a sampled action that was never stored"
            s = record.steps[key]
            idx = int(np.asarray(b.indices)[j])
            assert index_of.setdefault(idx, key) == key, "one index, two different steps"
            for part, ref in ((obs, s.obs), (nobs, s.next_obs)):
                assert same(part["observation"][j], ref["observation"])
                assert same(part["achieved_goal"][j], ref["achieved_goal"])
            assert bool(np.asarray(b.terminated)[j]) == s.terminated
            assert bool(np.asarray(b.truncated)[j]) == s.truncated
            goal = np.asarray(obs["desired_goal"][j])
            counts["rows"] += 1
            finished = s.episode in record.finished
            counts["finished_rows"] += finished
            if not relabeled[j]:
                assert same(goal, s.obs["desired_goal"])
                assert same(reward[j], s.reward)
                continue
            assert finished, "a row of an unfinished episode was relabelled"
            counts["relabeled"] += 1
            later = [u.t for u in record.episodes[s.episode][s.t:]
                     if same(goal, u.next_obs["achieved_goal"])]
            assert later, "relabelled goal is no later achieved goal of the same episode"
            counts["at_t"] += later[0] == s.t
            counts["later"] += later[-1] > s.t
            r = reward_fn(np.asarray(nobs["achieved_goal"][j])[None], goal[None], {})
            assert same(reward[j], np.asarray(r).reshape(()))
    return counts


def check_counts(c: dict[str, int]) -> None:
    # k / (k + 1) of the finished-episode rows get a new goal (binomial, 6-sigma bounds)
    n, p = c["finished_rows"], K / (K + 1)
    assert n > 1000
    assert abs(c["relabeled"] - p * n) < 6 * np.sqrt(n * p * (1 - p)) + 1, c
    assert c["later"] > 0.5 * c["relabeled"], c  # "future" mostly picks a later step
    assert c["at_t"] > 0, c  # ... and the sampled step's own next observation too


def test_her_fetch_reach_one_env() -> None:
    # 3 finished 50-step episodes and 20 steps of an unfinished one
    buf, record, reward_fn = collect(1, [None], 170, seed=0)
    assert len(record.finished) == 3 and len(record.episodes) == 4
    c = check_batches(buf, record, reward_fn, batches=40)
    check_counts(c)
    assert c["rows"] - c["finished_rows"] > 0  # the unfinished episode was sampled


def test_her_fetch_reach_two_envs_different_boundaries() -> None:
    # env 0: 50-step episodes, env 1: 30-step episodes; both end with an unfinished one
    buf, record, reward_fn = collect(2, [None, 30], 125, seed=7)
    ends = {i: len(steps) for i, steps in record.episodes.items()}
    assert sorted(ends.values()) == [5, 25, 30, 30, 30, 30, 50, 50]
    assert len(record.finished) == 6
    c = check_batches(buf, record, reward_fn, batches=40)
    check_counts(c)
    assert c["rows"] - c["finished_rows"] > 0


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("her_fetch_reach", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_her_fetch_reach_learns(seed: int) -> None:
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    try:
        out = load_example().train(20_000, seed, quiet=True)
    finally:
        torch.set_num_threads(threads)
    assert out["steps"] == 20_000
    assert out["success"] >= 0.9, out
    assert out["steps_to_90"] is not None and out["steps_to_90"] <= 20_000, out
