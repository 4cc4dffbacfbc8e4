"""Torch storage vs numpy storage: sample(256) -> tensors, at capacity 1,000,000.

    python benchmarks/bench_torch_storage.py [--device cuda]

Measures, in the same run:
  * floor: raw preallocated torch tensors [T, lanes, ...] gathered with index_select
    (index array moved to the device each time),
  * numpy storage: buf.sample(256).to_torch(device),
  * torch storage: buf.sample(256) (already tensors on the device).
Prints the best-of-repeats time per call and ratios to the floor (floor / x, higher is better).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import replaybank as rb

OBS, ACT = 17, 6


def best(fn: Callable[[], Any], n: int, repeats: int = 5, sync: Callable[[], None] = lambda: None
         ) -> float:
    out = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / n)
    return min(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--capacity", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    torch.set_num_threads(1)
    dev = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
    cap, lanes, bsz = args.capacity, 1, args.batch
    rng = np.random.default_rng(0)
    chunk = 10_000
    bufs = {
        "numpy": rb.ReplayBuffer(cap, seed=0),
        "torch": rb.ReplayBuffer(cap, seed=0, storage="torch", device=dev),
    }
    for _ in range(0, cap, chunk):
        obs = rng.normal(size=(chunk + 1, OBS)).astype(np.float32)
        kw = dict(obs=obs[:-1], next_obs=obs[1:],
                  action=rng.normal(size=(chunk, ACT)).astype(np.float32),
                  reward=rng.normal(size=chunk).astype(np.float32),
                  terminated=np.zeros(chunk, bool), truncated=np.zeros(chunk, bool))
        for b in bufs.values():
            b.extend(**kw)
    # floor: raw tensors
    rows = cap // lanes
    shapes = {"obs": ((OBS,), torch.float32), "act": ((ACT,), torch.float32),
              "rew": ((), torch.float32), "term": ((), torch.bool), "trunc": ((), torch.bool)}
    raw = {k: torch.zeros(rows, lanes, *shp, dtype=dt, device=dev)
           for k, (shp, dt) in shapes.items()}
    flat = {k: v.reshape(rows * lanes, *v.shape[2:]) for k, v in raw.items()}

    def floor() -> None:
        idx = rng.integers(0, rows - 1, bsz)
        i = torch.from_numpy(idx).to(dev)
        j = torch.from_numpy(idx + 1).to(dev)
        _ = [v.index_select(0, i) for v in flat.values()]
        _ = flat["obs"].index_select(0, j)

    n = 300
    t_floor = best(floor, n, sync=sync)
    t_np = best(lambda: bufs["numpy"].sample(bsz).to_torch(dev), n, sync=sync)
    t_torch = best(lambda: bufs["torch"].sample(bsz), n, sync=sync)
    print(f"device={dev} capacity={cap:,} batch={bsz}")
    print(f"{'path':38s} {'us/call':>9s} {'floor/x':>8s}")
    for name, t in (("floor (raw tensors, index_select)", t_floor),
                    ("numpy storage + to_torch", t_np),
                    ("torch storage sample", t_torch)):
        print(f"{name:38s} {t * 1e6:9.1f} {t_floor / t:8.2f}")


if __name__ == "__main__":
    main()
