"""Adding dict observations: replaybank's ``add`` of a goal-env observation against
Stable-Baselines3's ``DictReplayBuffer.add`` given the same objects, with and without
replaybank's C writer.

The observation is FetchReach's (``observation`` [10], ``achieved_goal`` [3],
``desired_goal`` [3]), ``action`` float32[4]; 1 env (the usual goal-env loop) and 4 envs.
Input kinds:

* ``exact``: every value in its stored dtype (float32 observations, a float32 reward);
* ``f64``: float64 observations and reward, as gymnasium-robotics' Fetch envs and
  vector envs return them (stored as float32).

One env passes its observations as ``[*shape]`` arrays, its reward and flags as Python
scalars; 4 envs pass ``[4, *shape]`` arrays. SB3 is given each field with its env dim
(``[1, *shape]`` for one env: the shape its ``add`` requires), ``done`` and ``infos``
built beforehand (not timed). Each configuration runs in its own process (the
no-compiler writer, ``REPLAYBANK_PURE_PYTHON=1``, is chosen at import), rounds
interleaved; the best round's us per add is reported, with replaybank / SB3 from the same
round pair. Targets: compiled at least 2x faster than SB3; without a compiler no slower
than 2x SB3 (issue 26).

Run: ``python benchmarks/bench_dict_obs.py [--rounds R] [--adds N] [--capacity C]``.

Measured on this 2-core machine (capacity 100,000, 2 rounds x 3 passes of 3,000 adds,
load 0.8-0.9, memory storage; us per add, best round; two runs). "no compiler, before" is
the tree before the fifteenth session, where a dict observation took the Python boundary
and the reference writer; "no compiler" is the one-step writer that serves it since:

=====  =====  ==========  ====================  ===========  ==========  ==============
envs   kind   replaybank  no compiler, before   no compiler  SB3         no compiler/SB3
=====  =====  ==========  ====================  ===========  ==========  ==============
1      exact  1.35, 1.38  30.9, 31.1            9.10, 9.16   6.18, 5.98  1.47, 1.53
1      f64    1.44, 1.52  36.3, 36.6            9.92, 9.99   6.67, 6.18  1.49, 1.62
4      exact  1.77, 1.79  30.2, 30.4            11.5, 11.6   6.64, 6.46  1.73, 1.80
4      f64    2.13, 2.25  38.1, 37.7            13.0, 13.3   7.26, 6.83  1.80, 1.94
=====  =====  ==========  ====================  ===========  ==========  ==============

With the C writer, SB3 takes 3.0-4.6x as long as replaybank.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

SHAPES = {"observation": 10, "achieved_goal": 3, "desired_goal": 3}
ACT = 4
KINDS = ("exact", "f64")
CONFIGS = ("replaybank", "no compiler", "sb3")


def steps(kind: str, n: int, envs: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` adds' keywords for replaybank: dict observations that continue from step to
    step (``[*shape]`` for one env, ``[envs, *shape]`` for more)."""
    rng = np.random.default_rng(seed)
    dt = np.float64 if kind == "f64" else np.float32
    obs = {k: rng.standard_normal((n + 1, envs, d)).astype(dt) for k, d in SHAPES.items()}
    act = rng.uniform(-1, 1, (n, envs, ACT)).astype(np.float32)
    rew = rng.standard_normal((n, envs)).astype(dt)
    out = []
    for t in range(n):
        if envs == 1:
            out.append({"obs": {k: v[t, 0] for k, v in obs.items()}, "action": act[t, 0],
                        "reward": float(rew[t, 0]),
                        "next_obs": {k: v[t + 1, 0] for k, v in obs.items()},
                        "terminated": False, "truncated": False})
        else:
            out.append({"obs": {k: v[t] for k, v in obs.items()}, "action": act[t],
                        "reward": rew[t], "next_obs": {k: v[t + 1] for k, v in obs.items()},
                        "terminated": np.zeros(envs, bool), "truncated": np.zeros(envs, bool)})
    return out


def _sb3_args(d: dict[str, Any], envs: int) -> tuple[Any, ...]:
    """SB3 ``DictReplayBuffer.add``'s arguments for one step (its env dim on each field)."""
    def lead(x: Any) -> Any:
        return np.asarray(x)[None] if envs == 1 else x
    return ({k: lead(v) for k, v in d["obs"].items()},
            {k: lead(v) for k, v in d["next_obs"].items()}, lead(d["action"]),
            lead(np.asarray(d["reward"])), np.zeros(envs, bool), [{}] * envs)


def measure(config: str, kind: str, envs: int, adds: int, capacity: int) -> float:
    """Best of three passes, us per add, in this process."""
    items = steps(kind, adds, envs)
    if config == "sb3":
        import gymnasium as gym
        from stable_baselines3.common.buffers import DictReplayBuffer

        space = gym.spaces.Dict({k: gym.spaces.Box(-10, 10, (d,), np.float32)
                                 for k, d in SHAPES.items()})
        buf = DictReplayBuffer(capacity, space, gym.spaces.Box(-1, 1, (ACT,), np.float32),
                               device="cpu", n_envs=envs)
        args = [_sb3_args(d, envs) for d in items]

        def run() -> None:
            add = buf.add
            for a in args:
                add(*a)
    else:
        import replaybank as rb

        spec = {**{f"obs/{k}": ((d,), "float32") for k, d in SHAPES.items()},
                "action": ((ACT,), "float32")}
        rbuf = rb.ReplayBuffer(capacity, num_envs=envs, seed=0, spec=spec)

        def run() -> None:
            add = rbuf.add
            for d in items:
                add(**d)
    run()  # warm: first calls, page faults
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
    return best / adds * 1e6


def _child(config: str, adds: int, capacity: int) -> dict[str, float]:
    env = dict(os.environ)
    if config == "no compiler":
        env["REPLAYBANK_PURE_PYTHON"] = "1"
    r = subprocess.run([sys.executable, __file__, "--child", config, "--adds", str(adds),
                        "--capacity", str(capacity)], env=env, capture_output=True,
                       text=True, check=True)
    out: dict[str, float] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--adds", type=int, default=3000)
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps({f"{envs} {kind}": measure(args.child, kind, envs, args.adds,
                                                    args.capacity)
                          for envs in (1, 4) for kind in KINDS}))
        return
    configs: tuple[str, ...] = CONFIGS
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        print("stable-baselines3 is not installed: replaybank rows only")
        configs = CONFIGS[:2]
    best: dict[str, dict[str, float]] = {c: {} for c in configs}
    for _ in range(args.rounds):
        for c in configs:
            for case, us in _child(c, args.adds, args.capacity).items():
                best[c][case] = min(best[c].get(case, float("inf")), us)
    print(f"{'case':<10}" + "".join(f"{c:>14}" for c in configs)
          + ("   SB3 / rb   no compiler / SB3" if "sb3" in best else ""))
    for case in best["replaybank"]:
        row = f"{case:<10}" + "".join(f"{best[c][case]:>14.2f}" for c in configs)
        if "sb3" in best:
            sb3 = best["sb3"][case]
            row += f"{sb3 / best['replaybank'][case]:>10.1f}x" \
                   f"{best['no compiler'][case] / sb3:>18.2f}"
        print(row)


if __name__ == "__main__":
    main()
