"""n-step sampling: replaybank's ``sample(256)`` with ``n_step=n`` beside cpprb's and SB3's.

The same stream goes into each library (capacity ``--capacity`` one-env steps, obs
float32[17], action float32[6], float32 rewards, episodes of 1000 steps):

* replaybank: ``ReplayBuffer(n_step=n, gamma=0.99)``; the windows are found and their
  returns summed when sampled (``NStepView``);
* cpprb: ``ReplayBuffer(Nstep={"size": n, "gamma": 0.99, ...})``, which folds the
  returns at ``add`` time, so its ``sample`` is a plain gather;
* SB3: ``NStepReplayBuffer(n_steps=n, gamma=0.99)`` (measured with stable-baselines3 2.9.2), which
  computes the returns when sampled, as replaybank does.

Each prints us per ``sample(256)`` (best of ``--repeats`` rounds, the libraries
interleaved in each round) and peer / replaybank (> 1: replaybank faster), with
replaybank's uniform ``sample(256)`` of the same data as the baseline of the same run.

Usage::

    python benchmarks/bench_nstep.py [--capacity 200000] [--n 3,10] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import replaybank as rb

EPISODE = 1000
CHUNK = 1000


def stream(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` steps of one env: a chain of observations cut every ``EPISODE`` steps."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n + 1, 17)).astype(np.float32)
    done = np.zeros(n, bool)
    done[EPISODE - 1::EPISODE] = True
    return {"obs": obs[:-1], "next_obs": obs[1:], "action": rng.standard_normal((n, 6))
            .astype(np.float32), "reward": rng.standard_normal(n).astype(np.float32),
            "done": done}


def replaybank_sampler(s: dict[str, np.ndarray], n: int | None) -> Callable[[], Any]:
    kw: dict[str, Any] = {"n_step": n, "gamma": 0.99} if n else {}
    buf = rb.ReplayBuffer(capacity=len(s["done"]), seed=0, **kw)
    for lo in range(0, len(s["done"]), CHUNK):
        part = slice(lo, lo + CHUNK)
        buf.extend(obs=s["obs"][part], action=s["action"][part], reward=s["reward"][part],
                   next_obs=s["next_obs"][part], terminated=s["done"][part],
                   truncated=np.zeros(len(s["done"][part]), bool))
    return lambda: buf.sample(256)


def cpprb_sampler(s: dict[str, np.ndarray], n: int) -> Callable[[], Any]:
    import cpprb  # type: ignore[import-untyped]

    buf = cpprb.ReplayBuffer(
        len(s["done"]), {"obs": {"shape": 17}, "act": {"shape": 6}, "rew": {},
                         "next_obs": {"shape": 17}, "done": {}},
        Nstep={"size": n, "gamma": 0.99, "rew": "rew", "next": "next_obs"})
    for lo in range(0, len(s["done"]), CHUNK):
        part = slice(lo, lo + CHUNK)
        buf.add(obs=s["obs"][part], act=s["action"][part], rew=s["reward"][part],
                next_obs=s["next_obs"][part], done=s["done"][part])
    return lambda: buf.sample(256)


def sb3_sampler(s: dict[str, np.ndarray], n: int) -> Callable[[], Any]:
    import gymnasium as gym
    from stable_baselines3.common.buffers import NStepReplayBuffer

    box = gym.spaces.Box(-np.inf, np.inf, (17,), np.float32)
    act = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
    buf = NStepReplayBuffer(len(s["done"]), box, act, device="cpu", n_envs=1, n_steps=n,
                            gamma=0.99)
    for i in range(len(s["done"])):
        buf.add(s["obs"][i:i + 1], s["next_obs"][i:i + 1], s["action"][i:i + 1],
                s["reward"][i:i + 1], s["done"][i:i + 1], [{}])
    return lambda: buf.sample(256)


def best_us(fns: dict[str, Callable[[], Any]], repeats: int, calls: int) -> dict[str, float]:
    """Best us per call of each function over ``repeats`` interleaved rounds."""
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        for _ in range(20):
            fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t) / calls * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capacity", type=int, default=200_000)
    ap.add_argument("--n", default="3,10", help="comma-separated n-step lengths")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    s = stream(args.capacity)
    print(f"n-step sample(256): capacity {args.capacity:,} (one env), obs float32[17], "
          f"action float32[6], episodes of {EPISODE}; us per call, best of {args.repeats}")
    print(f"{'n':>3} {'uniform':>9} {'replaybank':>11} {'cpprb':>18} {'sb3':>18}")
    for n in (int(x) for x in args.n.split(",")):
        fns: dict[str, Callable[[], Any]] = {"uniform": replaybank_sampler(s, None),
                                             "replaybank": replaybank_sampler(s, n)}
        notes = {}
        for name, make in (("cpprb", cpprb_sampler), ("sb3", sb3_sampler)):
            try:
                fns[name] = make(s, n)
            except Exception as exc:  # a peer not installed (or without n-step)
                notes[name] = f"{type(exc).__name__}: {exc}"[:60]
        t = best_us(fns, args.repeats, args.calls)
        rbt = t["replaybank"]
        cols = [f"{t[p]:8.1f} ({t[p] / rbt:4.2f}x)" if p in t else f"{'-':>18}"
                for p in ("cpprb", "sb3")]
        print(f"{n:>3} {t['uniform']:9.1f} {rbt:11.1f} {cols[0]:>18} {cols[1]:>18}")
        for name, why in notes.items():
            print(f"    {name}: {why}")


if __name__ == "__main__":
    main()
