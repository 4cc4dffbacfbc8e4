"""Hindsight replay sampling: replaybank's HER ``sample(256)`` vs its own plain sample, one
``compute_reward`` call, and Stable-Baselines3's ``HerReplayBuffer.sample(256)``.

One buffer of ``--capacity`` transitions (default 1,000,000) with FetchReach-sized
observations (``observation`` float32[10], ``achieved_goal`` and ``desired_goal``
float32[3]), ``action`` float32[4], 50-step truncated episodes. Candidates:

* ``plain``: the same replaybank buffer sampled with the one-step transition view (no
  relabelling);
* ``reward``: one vectorised ``FetchReach-v4`` ``env.unwrapped.compute_reward`` call on
  205 goal pairs (``k / (k + 1)`` of 256 with ``k = 4``), when gymnasium-robotics imports
  (else the same arithmetic in numpy);
* ``her``: ``HerReplayBuffer(strategy="future", k=4).sample(256)``;
* ``sb3``: SB3's ``HerReplayBuffer(n_sampled_goal=4, goal_selection_strategy="future")``
  ``.sample(256)`` over a ``DummyVecEnv`` of FetchReach-v4 (its reward goes through
  ``env_method``), when stable-baselines3 imports.

All run in one process, interleaved round by round; the best round (us per call) is
reported, plus the median. Targets: ``her <= 2 * (plain + reward)`` and ``her < sb3``.

Run: ``python benchmarks/bench_her.py [--capacity N] [--rounds R] [--iters I]``.

Measured on this 2-core machine (capacity 1,000,000, 9 rounds x 200 calls; another
process was running beside it), with numba installed:

==========  =============  ===============
case        best us/call   median us/call
==========  =============  ===============
plain                57.8             75.1
reward                8.1              8.7
her                 121.0            173.2
sb3               1,384.0          1,728.8
==========  =============  ===============

``her / (plain + reward) = 1.83`` (target <= 2); SB3 / replaybank HER = 11.4x.
Most of the HER cost over ``plain`` is memory: three more random reads per relabelled row
at 1M steps (the episode end of the sampled step, the goal's next row, the new goal) and
the two goal columns written back.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import replaybank as rb
from replaybank.views.transition import TransitionView

OBS, GOAL, ACT, EP, BATCH, K = 10, 3, 4, 50, 256, 4


def fetch_reward() -> tuple[Callable[..., Any], Any]:
    """FetchReach's compute_reward and its env (None without gymnasium-robotics)."""
    try:
        import gymnasium as gym
        import gymnasium_robotics

        gym.register_envs(gymnasium_robotics)
        env = gym.make("FetchReach-v4")
        return env.unwrapped.compute_reward, env
    except Exception:
        def reward(achieved: Any, desired: Any, info: Any) -> Any:
            d = np.linalg.norm(achieved - desired, axis=-1)
            return -(d > 0.05).astype(np.float32)

        return reward, None


def episodes(n: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` transitions of 50-step episodes whose observations continue within episodes."""
    rng = np.random.default_rng(seed)
    n_ep = -(-n // EP)
    states = rng.random((n_ep, EP + 1, OBS), dtype=np.float32)
    goals = np.repeat(rng.random((n_ep, 1, GOAL), dtype=np.float32), EP + 1, axis=1)
    ag = states[..., :GOAL]
    flat = lambda a: a.reshape(n_ep * EP, *a.shape[2:])[:n]  # noqa: E731
    trunc = np.zeros((n_ep, EP), bool)
    trunc[:, -1] = True
    return {"obs": flat(states[:, :-1]), "next_obs": flat(states[:, 1:]),
            "ag": flat(ag[:, :-1]), "next_ag": flat(ag[:, 1:]),
            "goal": flat(goals[:, :-1]), "trunc": trunc.reshape(-1)[:n],
            "action": rng.uniform(-1, 1, (n, ACT)).astype(np.float32),
            "reward": -np.ones(n, np.float32)}


def replaybank_buffer(data: dict[str, np.ndarray], reward: Callable[..., Any]
                      ) -> rb.HerReplayBuffer:
    n = len(data["action"])
    buf = rb.HerReplayBuffer(n, reward_fn=reward, strategy="future", k=K, seed=0)
    chunk = 100_000
    for lo in range(0, n, chunk):
        s = slice(lo, lo + chunk)
        buf.extend(obs={"observation": data["obs"][s], "achieved_goal": data["ag"][s],
                        "desired_goal": data["goal"][s]},
                   action=data["action"][s], reward=data["reward"][s],
                   next_obs={"observation": data["next_obs"][s],
                             "achieved_goal": data["next_ag"][s],
                             "desired_goal": data["goal"][s]},
                   terminated=np.zeros(len(data["action"][s]), bool),
                   truncated=data["trunc"][s])
    return buf


def sb3_buffer(data: dict[str, np.ndarray], env: Any) -> Any:
    """SB3's HerReplayBuffer filled with the same episodes (None when SB3 or the env is
    missing)."""
    if env is None:
        return None
    try:
        from stable_baselines3 import HerReplayBuffer
        from stable_baselines3.common.vec_env import DummyVecEnv
    except ImportError:
        return None
    import gymnasium as gym

    n = len(data["action"])
    venv = DummyVecEnv([lambda: gym.make("FetchReach-v4")])
    buf = HerReplayBuffer(n, venv.observation_space, venv.action_space, env=venv,
                          device="cpu", n_sampled_goal=K, goal_selection_strategy="future")
    info = [{}]
    for t in range(n):
        buf.add({"observation": data["obs"][t:t + 1], "achieved_goal": data["ag"][t:t + 1],
                 "desired_goal": data["goal"][t:t + 1]},
                {"observation": data["next_obs"][t:t + 1],
                 "achieved_goal": data["next_ag"][t:t + 1],
                 "desired_goal": data["goal"][t:t + 1]},
                data["action"][t:t + 1], data["reward"][t:t + 1],
                data["trunc"][t:t + 1], info)
    return buf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--no-sb3", action="store_true")
    args = ap.parse_args()
    reward, env = fetch_reward()
    data = episodes(args.capacity, seed=0)
    t0 = time.perf_counter()
    buf = replaybank_buffer(data, reward)
    print(f"replaybank fill: {time.perf_counter() - t0:.1f} s")
    her_view, plain_view = buf.view, TransitionView()
    t0 = time.perf_counter()
    sb3 = None if args.no_sb3 else sb3_buffer(data, env)
    if sb3 is not None:
        print(f"sb3 fill: {time.perf_counter() - t0:.1f} s")
    rng = np.random.default_rng(1)
    m = round(BATCH * K / (K + 1))
    ag = rng.random((m, GOAL), dtype=np.float32)
    g = rng.random((m, GOAL), dtype=np.float32)

    def plain() -> None:
        buf.view = plain_view
        for _ in range(args.iters):
            buf.sample(BATCH)

    def her() -> None:
        buf.view = her_view
        for _ in range(args.iters):
            buf.sample(BATCH)

    def rew() -> None:
        for _ in range(args.iters):
            reward(ag, g, {})

    def sb3_sample() -> None:
        for _ in range(args.iters):
            sb3.sample(BATCH)

    cases: dict[str, Callable[[], None]] = {"plain": plain, "reward": rew, "her": her}
    if sb3 is not None:
        cases["sb3"] = sb3_sample
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) / args.iters * 1e6)
    best = {k: min(v) for k, v in times.items()}
    med = {k: float(np.median(v)) for k, v in times.items()}
    base = best["plain"] + best["reward"]
    print(f"{'case':<10} {'best us':>10} {'median us':>10}")
    for k in cases:
        print(f"{k:<10} {best[k]:>10.1f} {med[k]:>10.1f}")
    print(f"her / (plain + reward) = {best['her'] / base:.2f}  (target <= 2)")
    if "sb3" in best:
        print(f"sb3 / her = {best['sb3'] / best['her']:.2f}  (target > 1)")


if __name__ == "__main__":
    main()
