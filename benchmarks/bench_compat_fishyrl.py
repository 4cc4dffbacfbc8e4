"""Benchmark: the ``fishyrl.buffers`` front end (replaybank.compat.fishyrl) against the
core calls it wraps.

Each row times the same work through the front end and through the core directly (a rows
``ReplayBuffer(next_obs=False)`` of the same size, fed the same numpy dicts), in
interleaved rounds (front then core in even rounds, core then front in odd ones:
whichever runs first after other work meets colder caches); the table shows the best
round of each (the machine is shared and noisy) and the ratio front / core. Target
(issue 15): within 1.2x. The add rows also time the floor of a rows write, a plain
numpy ring in the same rounds (fishyrl's own ``add``: one assignment per key into
preallocated arrays, then the cursor moves; no checks, no episode bookkeeping), and
the ratio core / ring.

* ``Sequential add``: ``SequentialBuffer.add(row)`` vs ``core.add(fishyrl=row)``,
  ``--adds`` world-model rows ``{obs [64], action, reward, is_first, is_terminal}``.
* ``Vectorized add``: ``IndependentVectorizedBuffer.add(rows)`` (``--envs`` buffers, values
  ``[envs, ...]``) vs ``core.add(fishyrl=rows)`` on a lane-split core of ``envs`` lanes.
* ``Sequential sample``: ``SequentialBuffer.sample(16, 64)`` vs
  ``core.sample_sequences(16, 64, episode_boundary="cross")``, ``--samples`` calls.
* ``Vectorized sample``: ``IndependentVectorizedBuffer.sample(16, sequence_length=64)`` vs
  the same core call on the lane-split core.

Run: ``python benchmarks/bench_compat_fishyrl.py [--rounds 15 --adds 2000 --samples 200]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from replaybank.buffers.replay import ReplayBuffer
from replaybank.compat.fishyrl import PREFIX, IndependentVectorizedBuffer, SequentialBuffer

OBS_DIM = 64
CAPACITY = 10_000


def rows(n: int, envs: int | None, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` world-model rows (``[envs, ...]`` values when ``envs`` is given)."""
    rng = np.random.default_rng(seed)
    lead = () if envs is None else (envs,)
    out = []
    for t in range(n):
        out.append({"obs": rng.random((*lead, OBS_DIM)).astype(np.float32),
                    "action": rng.integers(0, 4, lead),
                    "reward": rng.random(lead).astype(np.float32),
                    "is_first": np.full(lead, t % 100 == 0),
                    "is_terminal": np.full(lead, t % 100 == 99)})
    return out


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def pair(best: list[float], front: Callable[[], Any], core: Callable[[], Any],
         r: int, ring: Callable[[], Any] | None = None) -> None:
    """Time each once, in an order that alternates by round; keep the best of each."""
    calls = [front, core] if ring is None else [front, core, ring]
    order = range(len(calls)) if r % 2 == 0 else reversed(range(len(calls)))
    for i in order:
        best[i] = min(best[i], timed(calls[i]))


class Ring:
    """The floor of a rows write: preallocated arrays, one assignment per key."""

    def __init__(self, capacity: int, example: dict[str, np.ndarray]) -> None:
        self.arrays = {k: np.zeros((capacity, *np.shape(v)), np.asarray(v).dtype)
                       for k, v in example.items()}
        self.capacity, self.cursor = capacity, 0

    def add(self, row: dict[str, np.ndarray]) -> None:
        for k, v in row.items():
            self.arrays[k][self.cursor] = v
        self.cursor = (self.cursor + 1) % self.capacity


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--adds", type=int, default=2000)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--envs", type=int, default=8)
    args = ap.parse_args()
    envs = args.envs
    one, many = rows(args.adds, None), rows(args.adds, envs, seed=1)

    def seq_pair() -> tuple[SequentialBuffer, ReplayBuffer]:
        return (SequentialBuffer(CAPACITY, seed=0),
                ReplayBuffer(CAPACITY, next_obs=False, seed=0))

    def vec_pair() -> tuple[IndependentVectorizedBuffer, ReplayBuffer]:
        return (IndependentVectorizedBuffer(envs, CAPACITY, seed=0),
                ReplayBuffer(CAPACITY * envs, num_envs=envs, next_obs=False,
                             lane_split="random", seed=0))

    results: dict[str, list[float]] = {}
    # filled buffers for the sample rows (the add rows start empty each round)
    fs, cs = seq_pair()
    fv, cv = vec_pair()
    for r in rows(3000, None, seed=2):
        fs.add(r)
        cs.add(**{PREFIX: r})
    for r in rows(3000, envs, seed=3):
        fv.add(r)
        cv.add(**{PREFIX: r})
    n_s = args.samples
    for r in range(args.rounds):
        f1, c1 = seq_pair()
        ring1, ring2 = Ring(CAPACITY, one[0]), Ring(CAPACITY, many[0])
        pair(results.setdefault("Sequential add", [np.inf] * 3),
             lambda f=f1: [f.add(x) for x in one],
             lambda c=c1: [c.add(**{PREFIX: x}) for x in one], r,
             lambda g=ring1: [g.add(x) for x in one])
        f2, c2 = vec_pair()
        pair(results.setdefault("Vectorized add", [np.inf] * 3),
             lambda f=f2: [f.add(x) for x in many],
             lambda c=c2: [c.add(**{PREFIX: x}) for x in many], r,
             lambda g=ring2: [g.add(x) for x in many])
        pair(results.setdefault("Sequential sample(16, 64)", [np.inf, np.inf]),
             lambda: [fs.sample(16, 64) for _ in range(n_s)],
             lambda: [cs.sample_sequences(16, 64, episode_boundary="cross")
                      for _ in range(n_s)], r)
        pair(results.setdefault("Vectorized sample(16, 64)", [np.inf, np.inf]),
             lambda: [fv.sample(16, sequence_length=64) for _ in range(n_s)],
             lambda: [cv.sample_sequences(16, 64, episode_boundary="cross")
                      for _ in range(n_s)], r)
    per = {"Sequential add": args.adds, "Vectorized add": args.adds,
           "Sequential sample(16, 64)": n_s, "Vectorized sample(16, 64)": n_s}
    print(f"best of {args.rounds} interleaved rounds; us per call")
    print(f"{'call':<28}{'front end':>12}{'core':>12}{'ratio':>8}{'numpy ring':>12}"
          f"{'core/ring':>11}")
    for name, (front, core, *ring) in results.items():
        n = per[name]
        floor = (f"{ring[0] / n * 1e6:>12.2f}{core / ring[0]:>11.2f}" if ring
                 else f"{'-':>12}{'-':>11}")
        print(f"{name:<28}{front / n * 1e6:>12.2f}{core / n * 1e6:>12.2f}"
              f"{front / core:>8.2f}{floor}")


if __name__ == "__main__":
    main()
