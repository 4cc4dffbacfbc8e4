"""Sampling speed of a memmap buffer (pages in the page cache) vs the in-memory buffer.

Both buffers hold the same steps; the memmap files are read once first so their pages
are cached. Times ``sample(batch)`` (best of several repeats of many calls, both
buffers interleaved so machine noise hits them alike) and prints the ratio.
Target: memmap / numpy <= 1.5.

Run: ``python benchmarks/bench_memmap.py [--steps 200000] [--obs 256] [--batch 256]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import numpy as np

import replaybank as rb


def fill(buf: Any, steps: int, obs: int, num_envs: int) -> None:
    chunk = 4096
    rng = np.random.default_rng(0)
    for i in range(0, steps // num_envs, chunk):
        n = min(chunk, steps // num_envs - i)
        o = rng.standard_normal((n + 1, num_envs, obs)).astype(np.float32)
        done = rng.random((n, num_envs)) < 0.002
        buf.extend(obs=o[:-1], action=rng.integers(0, 6, (n, num_envs)),
                   reward=rng.standard_normal((n, num_envs)).astype(np.float32),
                   next_obs=o[1:], terminated=done, truncated=np.zeros((n, num_envs), bool))


def time_sampling(buf: Any, batch: int, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        buf.sample(batch)
    return (time.perf_counter() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--obs", type=int, default=256)
    ap.add_argument("--num-envs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        mem = rb.ReplayBuffer(args.steps, num_envs=args.num_envs, seed=0)
        disk = rb.ReplayBuffer(args.steps, num_envs=args.num_envs, seed=0, storage="memmap",
                               path=d)
        for buf in (mem, disk):
            fill(buf, args.steps, args.obs, args.num_envs)
        for arr in [*disk.table.arrays.values(), *disk.table.side.arrays.values()]:
            float(np.asarray(arr, dtype=np.float64).sum()) if arr.dtype.kind == "f" else None
        size = mem.nbytes() / 2**20
        print(f"{len(mem):,} steps, obs float32[{args.obs}], {args.num_envs} envs, "
              f"{size:.0f} MiB; sample({args.batch}) x {args.calls}, best of {args.repeats}")
        for buf in (mem, disk):  # warm-up: caches, lazy imports, first-touch faults
            time_sampling(buf, args.batch, args.calls)
        best = {"numpy": np.inf, "memmap": np.inf}
        ratios = []
        for _ in range(args.repeats):
            t_mem = time_sampling(mem, args.batch, args.calls)
            t_disk = time_sampling(disk, args.batch, args.calls)
            best["numpy"], best["memmap"] = min(best["numpy"], t_mem), min(best["memmap"],
                                                                          t_disk)
            ratios.append(t_disk / t_mem)
        for name, t in best.items():
            print(f"{name:>7}: {t * 1e6:8.1f} us per sample call (best)")
        ratio = best["memmap"] / best["numpy"]
        med = float(np.median(ratios))
        print(f"memmap / numpy = {ratio:.2f}x best-vs-best, {med:.2f}x median of "
              f"interleaved pairs  [{'ok' if min(ratio, med) <= 1.5 else 'OVER 1.5x'}]")


if __name__ == "__main__":
    main()
