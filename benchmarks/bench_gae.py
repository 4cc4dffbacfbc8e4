"""Benchmark: GAE on a [2048, 64] float32 rollout (replaybank.ops.gae.gae).

Baselines measured in the same run:

* ``python loop``: plain Python loops over envs and time steps on Python floats (the data
  is converted to lists before timing, so this is the fastest form of that loop);
* ``numpy time loop``: a loop over time steps vectorised over envs in float32 (the usual
  PPO implementation), with the same truncation semantics.

replaybank is timed with the numpy backend (the same loop, computing in float64) and the
numba kernel. Timings are the best and the median of several repeats (the machine is
noisy). Run: ``python benchmarks/bench_gae.py [--steps 2048 --envs 64 --repeats 15]``.

Targets (issue 6): >= 10x the python loop; within 2x of the numpy time loop.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from replaybank.ops.gae import gae, numba_available

GAMMA, LAM = 0.99, 0.95


def make_data(steps: int, envs: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    term = rng.random((steps, envs)) < 0.01
    trunc = rng.random((steps, envs)) < 0.005
    return {
        "rewards": rng.normal(size=(steps, envs)).astype(np.float32),
        "values": rng.normal(size=(steps, envs)).astype(np.float32),
        "terminated": term,
        "truncated": trunc,
        "last_values": rng.normal(size=envs).astype(np.float32),
        "final_values": np.where(trunc & ~term, rng.normal(size=(steps, envs)),
                                 np.nan).astype(np.float32),
    }


def python_loop(d: dict[str, Any]) -> Callable[[], Any]:
    rew, val = d["rewards"].tolist(), d["values"].tolist()
    term, trunc = d["terminated"].tolist(), d["truncated"].tolist()
    last, final = d["last_values"].tolist(), d["final_values"].tolist()
    steps, envs = len(rew), len(rew[0])

    def run() -> list[list[float]]:
        adv = [[0.0] * envs for _ in range(steps)]
        for e in range(envs):
            running = 0.0
            for t in range(steps - 1, -1, -1):
                if term[t][e]:
                    nv, running = 0.0, 0.0
                elif trunc[t][e]:
                    nv, running = final[t][e], 0.0
                else:
                    nv = last[e] if t == steps - 1 else val[t + 1][e]
                running = rew[t][e] + GAMMA * nv - val[t][e] + GAMMA * LAM * running
                adv[t][e] = running
        return adv

    return run


def numpy_time_loop(d: dict[str, Any]) -> Callable[[], Any]:
    rew, val, last = d["rewards"], d["values"], d["last_values"]
    term, trunc, final = d["terminated"], d["truncated"], d["final_values"]

    def run() -> np.ndarray:
        steps = rew.shape[0]
        nonterm = 1.0 - term.astype(np.float32)
        notdone = 1.0 - (term | trunc).astype(np.float32)
        cut = trunc & ~term
        adv = np.zeros_like(rew)
        running = np.zeros_like(last)
        for t in range(steps - 1, -1, -1):
            nv = last if t == steps - 1 else val[t + 1]
            nv = np.where(cut[t], final[t], nv)
            delta = rew[t] + GAMMA * nv * nonterm[t] - val[t]
            running = delta + GAMMA * LAM * notdone[t] * running
            adv[t] = running
        return adv

    return run


def ours(d: dict[str, Any], backend: str) -> Callable[[], Any]:
    def run() -> Any:
        return gae(**d, gamma=GAMMA, gae_lambda=LAM, backend=backend)  # type: ignore[arg-type]

    return run


def timeit(fn: Callable[[], Any], repeats: int) -> tuple[float, float, Any]:
    out = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2048)
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    d = make_data(args.steps, args.envs)
    rows: dict[str, tuple[float, float]] = {}
    results: dict[str, Any] = {}
    cases: list[tuple[str, Callable[[], Any], int]] = [
        ("python loop", python_loop(d), max(2, args.repeats // 5)),
        ("numpy time loop (float32)", numpy_time_loop(d), args.repeats),
        ("replaybank gae, numpy", ours(d, "numpy"), args.repeats),
    ]
    if numba_available():
        cases.append(("replaybank gae, numba", ours(d, "numba"), args.repeats))
    for name, fn, reps in cases:
        best, med, out = timeit(fn, reps)
        rows[name] = (best, med)
        results[name] = np.asarray(out, dtype=np.float64)
    ref = results["python loop"]
    for name, out in results.items():
        tol = 1e-3 if "float32" in name else 1e-5
        if not np.allclose(out, ref, rtol=tol, atol=tol):
            raise SystemExit(f"{name}: results differ from the python loop")
    print(f"GAE on [{args.steps}, {args.envs}] float32 (gamma={GAMMA}, lambda={LAM})")
    print(f"{'method':32s} {'best ms':>9s} {'median ms':>10s}")
    for name, (best, med) in rows.items():
        print(f"{name:32s} {best * 1e3:9.2f} {med * 1e3:10.2f}")
    py, vec = rows["python loop"], rows["numpy time loop (float32)"]
    print("\nratios (best / median):")
    for name in [n for n in rows if n.startswith("replaybank")]:
        b, m = rows[name]
        print(f"  {name}: {py[0] / b:7.1f}x / {py[1] / m:7.1f}x faster than the python loop "
              f"(target >= 10x); time vs numpy time loop {b / vec[0]:.2f} / {m / vec[1]:.2f} "
              "(target <= 2)")


if __name__ == "__main__":
    main()
