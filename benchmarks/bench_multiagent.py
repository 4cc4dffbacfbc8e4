"""Multi-agent replay: ``MultiAgentReplayBuffer.add`` of one joint step and ``sample(256)``
against a floor of preallocated per-agent numpy arrays written and gathered by hand.

Setup (issue 30's): 3 agents of simple_spread's sizes (obs float32[18], a discrete action
int64), a global state float32[54], 4 envs, capacity ``--capacity`` joint steps (default
1,000,000), 25-step episodes ending by truncation (every agent at once). Candidates:

* ``floor add``: per agent, ``obs``, ``next_obs``, ``action``, ``reward``,
  ``terminated``, ``truncated`` and ``active`` rows written into preallocated
  ``[T, envs, ...]`` arrays, plus ``state`` and ``next_state``: what a hand-written
  buffer that stores every value as given does (it stores next observations twice, and
  checks nothing);
* ``replaybank add``: ``buf.add(obs={...}, action={...}, reward={...}, next_obs={...},
  terminated={...}, truncated={...}, state=..., next_state=...)`` with the same values
  (float64 rewards and Python-bool flags, as PettingZoo gives them, cast once);
* ``floor sample``: 256 uniform (step, env) pairs and one ``take`` per per-agent array
  and for the state;
* ``replaybank sample``: ``buf.sample(256)`` (per-agent obs, next_obs, action, reward,
  ends, active; state and next state; indices).

Interleaved round by round; the best round (us per call) is reported. Target: replaybank
within 1.5x of the floor for both.

Run: ``python benchmarks/bench_multiagent.py [--capacity N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import replaybank as rb

AGENTS = ("agent_0", "agent_1", "agent_2")
OBS, STATE, ENVS, EPISODE, BATCH = 18, 54, 4, 25, 256


def best_us(fn: Callable[[], Any], calls: int) -> float:
    """Mean us per call of ``calls`` calls."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def joint_steps(n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """``n`` joint steps of every env, as a vector of PettingZoo envs gives them."""
    out = []
    obs = {a: rng.standard_normal((ENVS, OBS)).astype(np.float32) for a in AGENTS}
    state = rng.standard_normal((ENVS, STATE)).astype(np.float32)
    for t in range(n):
        nxt = {a: rng.standard_normal((ENVS, OBS)).astype(np.float32) for a in AGENTS}
        nstate = rng.standard_normal((ENVS, STATE)).astype(np.float32)
        end = (t + 1) % EPISODE == 0
        out.append({
            "obs": obs, "next_obs": nxt, "state": state, "next_state": nstate,
            "action": {a: rng.integers(0, 5, ENVS) for a in AGENTS},
            "reward": {a: rng.standard_normal(ENVS) for a in AGENTS},  # float64
            "terminated": {a: np.zeros(ENVS, bool) for a in AGENTS},
            "truncated": {a: np.full(ENVS, end) for a in AGENTS},
        })
        obs, state = nxt, nstate
    return out


class Floor:
    """Preallocated per-agent arrays ``[T, envs, ...]`` written and gathered by hand."""

    def __init__(self, capacity: int) -> None:
        self.T = capacity // ENVS
        self.t = 0
        self.size = 0
        self.arrays: dict[str, np.ndarray[Any, Any]] = {}
        for a in AGENTS:
            self.arrays[f"obs/{a}"] = np.zeros((self.T, ENVS, OBS), np.float32)
            self.arrays[f"next_obs/{a}"] = np.zeros((self.T, ENVS, OBS), np.float32)
            self.arrays[f"action/{a}"] = np.zeros((self.T, ENVS), np.int64)
            self.arrays[f"reward/{a}"] = np.zeros((self.T, ENVS), np.float32)
            self.arrays[f"terminated/{a}"] = np.zeros((self.T, ENVS), bool)
            self.arrays[f"truncated/{a}"] = np.zeros((self.T, ENVS), bool)
            self.arrays[f"active/{a}"] = np.zeros((self.T, ENVS), bool)
        self.arrays["state"] = np.zeros((self.T, ENVS, STATE), np.float32)
        self.arrays["next_state"] = np.zeros((self.T, ENVS, STATE), np.float32)
        self.flat = {k: v.reshape(self.T * ENVS, *v.shape[2:]) for k, v in self.arrays.items()}
        self.rng = np.random.default_rng(1)

    def add(self, step: dict[str, Any]) -> None:
        t, arr = self.t, self.arrays
        for a in AGENTS:
            arr[f"obs/{a}"][t] = step["obs"][a]
            arr[f"next_obs/{a}"][t] = step["next_obs"][a]
            arr[f"action/{a}"][t] = step["action"][a]
            arr[f"reward/{a}"][t] = step["reward"][a]
            arr[f"terminated/{a}"][t] = step["terminated"][a]
            arr[f"truncated/{a}"][t] = step["truncated"][a]
            arr[f"active/{a}"][t] = True
        arr["state"][t] = step["state"]
        arr["next_state"][t] = step["next_state"]
        self.t = (t + 1) % self.T
        self.size = min(self.size + 1, self.T)

    def sample(self) -> dict[str, Any]:
        idx = self.rng.integers(0, self.size * ENVS, BATCH)
        return {k: v.take(idx, axis=0) for k, v in self.flat.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--adds", type=int, default=2_000)
    ap.add_argument("--samples", type=int, default=500)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    steps = joint_steps(EPISODE * 40, rng)
    buf = rb.MultiAgentReplayBuffer(args.capacity, agents=list(AGENTS), num_envs=ENVS,
                                    seed=0)
    floor = Floor(args.capacity)
    t0 = time.perf_counter()
    fill = args.capacity // ENVS
    for i in range(fill):
        s = steps[i % len(steps)]
        buf.add(**s)
        floor.add(s)
    fill_s = time.perf_counter() - t0

    cursor = {"rb": 0, "floor": 0}

    def rb_add() -> None:
        buf.add(**steps[cursor["rb"] % len(steps)])
        cursor["rb"] += 1

    def floor_add() -> None:
        floor.add(steps[cursor["floor"] % len(steps)])
        cursor["floor"] += 1

    cases: dict[str, tuple[Callable[[], Any], int]] = {
        "floor add": (floor_add, args.adds),
        "replaybank add": (rb_add, args.adds),
        "floor sample": (floor.sample, args.samples),
        "replaybank sample": (lambda: buf.sample(BATCH), args.samples),
    }
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(args.rounds):
        for name, (fn, calls) in cases.items():
            best[name] = min(best[name], best_us(fn, calls))
    print(f"multi-agent: {len(AGENTS)} agents, obs float32[{OBS}], state float32[{STATE}], "
          f"{ENVS} envs, capacity {args.capacity:,} joint steps (fill {fill_s:.0f} s)")
    for name, us in best.items():
        print(f"  {name:>18}: {us:9.2f} us")
    for what in ("add", "sample"):
        ratio = best[f"replaybank {what}"] / best[f"floor {what}"]
        print(f"  replaybank {what} / floor = {ratio:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
