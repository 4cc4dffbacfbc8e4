"""Device replay (issue 17): the rows of the issue's table, on the CPU and, when present, CUDA.

    python benchmarks/bench_torch_storage.py [--capacity 1000000] [--batch 256]

Each row is timed (best of repeats, per call) on every device this machine has: ``cpu``
always, ``cuda`` when ``torch.cuda.is_available()``; a CUDA column without a GPU says
"not measured: no GPU" (never an estimate). CUDA times synchronise once per timed loop,
not per call. Rows:

* uniform ``sample(256)``, obs f32[17], action f32[6] (the issue's spec):
  - ``floor``: raw tensors, every float field packed in one ``[T, 41]`` tensor, indices
    drawn on the device (``torch.randint``), one gather (+ one for next obs);
  - ``torch storage sample``: ``buf.sample(256)`` (host draws, one packed copy, grouped
    gathers);
  - ``torch storage sample_fn``: ``buf.sample_fn(256)()`` (a CUDA graph on CUDA);
  - ``numpy storage + to_torch``: ``buf.sample(256).to_torch(device)``;
* PER ``sample(256)`` + ``update_priorities(256)``: torch storage (host tree draws, one
  packed copy, device gather; priorities as device tensors) vs numpy storage with the
  same ``PrioritizedSampler``;
* ``sample_sequences(16, 64)``: torch storage (host draws, device gather and flags) vs
  numpy storage + ``to_torch``;
* prefetch: the mean time ``next(prefetcher)`` waits in a loop whose step takes twice the
  host ``sample`` time or 1 ms, whichever is longer (``time.sleep``, which releases the
  GIL as a GPU step does), vs the host ``sample`` + ``to_torch`` time: best of a tight
  loop (issue 17's ratio), and the mean of the same call right after the same step. A
  host that sleeps through the step comes back with cold caches and clocks: on the 2-core
  machine the same ``sample(256)`` takes about 25 us in a tight loop and 65-80 us right
  after a 1 ms sleep, so only the second ratio says what prefetching saves.

CPU rows run with ``torch.set_num_threads(1)`` (small ops; the machine may be shared).
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
NO_GPU = "not measured: no GPU"


def best(fn: Callable[[], Any], n: int, sync: Callable[[], None], repeats: int = 5) -> float:
    """Best-of-``repeats`` seconds per call of ``n`` calls."""
    fn()
    out = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / n)
    return min(out)


def fill(bufs: list[rb.ReplayBuffer], cap: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    chunk = 20_000
    for lo in range(0, cap, chunk):
        k = min(chunk, cap - lo)
        obs = rng.normal(size=(k + 1, OBS)).astype(np.float32)
        term = rng.random(k) < 0.001  # episodes of ~1000 steps (sequences stop there)
        kw = dict(obs=obs[:-1], next_obs=obs[1:],
                  action=rng.normal(size=(k, ACT)).astype(np.float32),
                  reward=rng.normal(size=k).astype(np.float32),
                  terminated=term, truncated=np.zeros(k, bool))
        for b in bufs:
            b.extend(**kw)


def rows_for(dev: torch.device, cap: int, bsz: int, n: int) -> dict[str, float]:
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    out: dict[str, float] = {}
    # ---- uniform sample
    npb = rb.ReplayBuffer(cap, seed=0)
    tb = rb.ReplayBuffer(cap, seed=0, storage="torch", device=dev)
    fill([npb, tb], cap)
    packed = torch.zeros(cap, OBS + ACT + 1, device=dev)  # the floor's [T, 41]-like table
    flags = torch.zeros(cap, 2, dtype=torch.bool, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)

    def floor() -> None:
        i = torch.randint(0, cap - 1, (bsz,), device=dev, generator=gen)
        packed.index_select(0, i)
        flags.index_select(0, i)
        packed[:, :OBS].index_select(0, i + 1)

    fn = tb.sample_fn(bsz)
    out["floor"] = best(floor, n, sync)
    out["torch sample"] = best(lambda: tb.sample(bsz), n, sync)
    out["torch sample_fn"] = best(fn, n, sync)
    out["numpy + to_torch"] = best(lambda: npb.sample(bsz).to_torch(dev), n, sync)
    host_sample = best(lambda: npb.sample(bsz), n, sync)
    # ---- sequences
    out["torch sample_sequences"] = best(lambda: tb.sample_sequences(16, 64), n // 4, sync)
    out["numpy sample_sequences + to_torch"] = best(
        lambda: npb.sample_sequences(16, 64).to_torch(dev), n // 4, sync)
    # ---- PER
    tper = rb.ReplayBuffer(cap, seed=0, storage="torch", device=dev,
                           sampler=rb.PrioritizedSampler())
    nper = rb.ReplayBuffer(cap, seed=0, sampler=rb.PrioritizedSampler())
    fill([tper, nper], cap)
    td = torch.rand(bsz, device=dev) + 0.01

    def per_dev() -> None:
        b = tper.sample(bsz)
        tper.update_priorities(b.indices, td)

    tdn = td.cpu().numpy()

    def per_host() -> None:
        b = nper.sample(bsz)
        nper.update_priorities(b.indices, tdn)

    out["torch PER sample+update"] = best(per_dev, n, sync)
    out["numpy PER sample+update"] = best(per_host, n, sync)
    # ---- prefetch
    step = max(2 * host_sample, 1e-3)

    def after_step(fn: Callable[[], Any]) -> float:
        """Mean time of ``fn`` right after a ``step``-long sleep (a training step that
        leaves the host idle: its caches and clocks are as cold as the prefetcher's)."""
        waits = []
        for _ in range(n):
            time.sleep(step)  # the training step
            t0 = time.perf_counter()
            fn()
            waits.append(time.perf_counter() - t0)
        return float(np.mean(waits))

    with npb.prefetcher(bsz, device=dev, depth=2) as pf:
        next(pf)
        out["prefetch wait"] = after_step(lambda: next(pf))
    out["host after step"] = after_step(lambda: npb.sample(bsz).to_torch(dev))
    out["host sample + to_torch"] = best(lambda: npb.sample(bsz).to_torch(dev), n, sync)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--capacity", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args()
    torch.set_num_threads(1)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    res = {d: rows_for(torch.device(d), args.capacity, args.batch, args.calls) for d in devices}

    def cell(d: str, key: str) -> str:
        if d not in res:
            return NO_GPU
        return f"{res[d][key] * 1e6:.1f}"

    def ratio(d: str, a: str, b: str) -> str:
        if d not in res:
            return NO_GPU
        return f"{res[d][a] / res[d][b]:.2f}"

    print(f"capacity={args.capacity:,} batch={args.batch} torch {torch.__version__}; "
          "us per call (best of 5)")
    rows = [
        ("floor: packed one-gather, device draws", "floor"),
        ('storage="torch" sample(256)', "torch sample"),
        ('storage="torch" sample_fn(256)()', "torch sample_fn"),
        ("numpy storage sample(256) + to_torch", "numpy + to_torch"),
        ("torch PER sample(256) + update(256)", "torch PER sample+update"),
        ("numpy PER sample(256) + update(256)", "numpy PER sample+update"),
        ("torch sample_sequences(16, 64)", "torch sample_sequences"),
        ("numpy sample_sequences(16, 64) + to_torch", "numpy sample_sequences + to_torch"),
        ("prefetch: wait for next batch", "prefetch wait"),
        ("host sample(256) + to_torch", "host sample + to_torch"),
        ("the same after the step (mean)", "host after step"),
    ]
    print(f"| {'path':45s} | {'cpu':>10s} | {'cuda':>22s} |")
    print(f"|{'-' * 47}|{'-' * 12}|{'-' * 24}|")
    for label, key in rows:
        print(f"| {label:45s} | {cell('cpu', key):>10s} | {cell('cuda', key):>22s} |")
    print("\ntargets (issue 17)                              cpu        cuda")
    checks = [
        ("device sample / floor (<= 1.3)", "torch sample", "floor"),
        ("numpy+to_torch / device sample (>= 2)", "numpy + to_torch", "torch sample"),
        ("numpy PER / device PER (>= 3)", "numpy PER sample+update", "torch PER sample+update"),
        ("host seq+transfer / device seq (>= 2)", "numpy sample_sequences + to_torch",
         "torch sample_sequences"),
        ("prefetch wait / host sample (<= 0.10)", "prefetch wait", "host sample + to_torch"),
        ("prefetch wait / host after the step", "prefetch wait", "host after step"),
    ]
    for label, a, b in checks:
        print(f"{label:45s} {ratio('cpu', a, b):>8s}   {ratio('cuda', a, b)}")


if __name__ == "__main__":
    main()
