"""Atari-sized frame-stack replay: memory and sample rate, side by side in one run.

Setup (the issue's): capacity 200,000 steps, uint8 84x84 frames, stack 4, ``sample(32)``.

Compared:

* **replaybank**: ``ReplayBuffer(200_000, frame_stack=4)``; one frame stored per step,
  stacks of obs and next_obs rebuilt at sample time (with episode-start padding).
* **numpy floor**: a preallocated ``uint8[200_000, 84, 84]`` array; one sample gathers
  32 windows of 5 frames (obs stack = frames 0..3, next stack = frames 1..4, as views)
  plus action/reward/terminated/truncated, with fancy indexing (``frames[idx]``); the
  **numpy take floor** does the same with ``ndarray.take`` (faster). No episode logic.
* **tianshou**: ``tianshou.data.ReplayBuffer(200_000, stack_num=4, ignore_obs_next=True,
  save_only_last_obs=True)`` (its memory-saving Atari setting), run in a separate
  virtual env through a subprocess (``--tianshou-python``; skipped when missing).

Each round times the three alternately, a floor then replaybank (each timed run right after
a contender that read other memory), and the best round of each is kept. Targets:
resident memory <= 1.05x one frame per transition; sample rate >= 0.8x the numpy floor
(issue 29: the take floor's time within 1.1x, i.e. >= 0.91x) and >= 2x tianshou.

Run: ``python benchmarks/bench_framestack.py [--capacity N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

H = W = 84
K = 4
B = 32
EP_LEN = 2_000


def rss() -> int:
    """Resident set size of this process in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def frames_chunk(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n + 1`` consecutive frames (obs and next_obs of n steps)."""
    return rng.integers(0, 256, size=(n + 1, H, W), dtype=np.uint8)


def best_rate(fn: Any, calls: int, rounds: int) -> float:
    """Best samples/s over ``rounds`` rounds of ``calls`` calls."""
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = max(best, calls / (time.perf_counter() - t0))
    return best


# ---------------------------------------------------------------------- tianshou worker
def tianshou_worker(capacity: int, calls: int, rounds: int) -> None:
    from tianshou.data import Batch, ReplayBuffer

    rng = np.random.default_rng(0)
    before = rss()
    buf = ReplayBuffer(capacity, stack_num=K, ignore_obs_next=True, save_only_last_obs=True)
    chunk = frames_chunk(rng, 1000 + K)
    t0 = time.perf_counter()
    for i in range(capacity):
        j = i % 1000
        end = (i + 1) % EP_LEN == 0
        # stacked observations as the wrapper gives them; tianshou keeps the last frame
        buf.add(Batch(obs=chunk[j:j + K], act=i % 6, rew=1.0, terminated=end,
                      truncated=False, obs_next=chunk[j + 1:j + 1 + K], info={}))
    fill_s = time.perf_counter() - t0
    mem = rss() - before
    batch, _ = buf.sample(B)
    assert batch.obs.shape == (B, K, H, W) and batch.obs_next.shape == (B, K, H, W)
    rate = best_rate(lambda: buf.sample(B), calls, rounds)
    print(json.dumps({"rate": rate, "mem": mem, "fill_s": fill_s}))


def run_tianshou(python: str, capacity: int, calls: int, rounds: int) -> dict[str, Any] | None:
    if not os.path.exists(python):
        print(f"tianshou: {python} not found (install tianshou in a separate venv)")
        return None
    cmd = [python, __file__, "--tianshou-worker", "--capacity", str(capacity),
           "--calls", str(calls), "--rounds", str(rounds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        print("tianshou worker failed:\n" + proc.stderr[-2000:])
        return None
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


# ---------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--capacity", type=int, default=200_000)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--tianshou-python", default="/tmp/tsvenv/bin/python")
    ap.add_argument("--tianshou-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-tianshou", action="store_true")
    args = ap.parse_args()
    if args.tianshou_worker:
        tianshou_worker(args.capacity, args.calls, args.rounds)
        return

    from replaybank.cli import bench_windows as bw

    n = args.capacity
    frame_bytes = H * W

    # --- replaybank: memory (2,000-step episodes, see bench_windows)
    gc.collect()
    before = rss()
    t0 = time.perf_counter()
    buf = bw.framestack_buffer(n)
    fill_s = time.perf_counter() - t0
    gc.collect()
    mem_rb = rss() - before
    ratio_mem = mem_rb / (n * frame_bytes)
    nbytes_ratio = buf.nbytes() / (n * frame_bytes)

    # --- numpy floors (the take floor is replaybank bench's)
    floor_take = bw.framestack_floor(buf)
    t = buf.table
    frames, actions, rewards, terms, truncs = (
        t.flat(t.arrays[k]).copy() for k in ("obs", "action", "reward", "terminated",
                                             "truncated"))
    floor_rng = np.random.default_rng(2)
    offs = np.arange(-(K - 1), 2)

    def floor_sample() -> tuple[Any, ...]:  # fancy indexing
        idx = floor_rng.integers(K - 1, n - 1, size=B)
        w = frames[idx[:, None] + offs]  # [B, 5, 84, 84]
        return (w[:, :K], w[:, 1:], actions[idx], rewards[idx], terms[idx], truncs[idx])

    sb = buf.sample(B)
    assert sb.obs.shape == (B, K, H, W) and sb.next_obs.shape == (B, K, H, W)

    # interleaved rounds (the machine is noisy), a floor and replaybank alternately: each
    # timed run comes right after a contender that read other memory (a floor right after
    # the other floor, on the same arrays, would start with their rows' caches warm,
    # replaybank never); the last replaybank run of a round only separates the floors and
    # is not counted, so that each contender has one timed run per round
    fns = [("numpy take floor", floor_take, True), ("replaybank", lambda: buf.sample(B), True),
           ("numpy floor", floor_sample, True), ("replaybank", lambda: buf.sample(B), False)]
    rates = {name: 0.0 for name, _, _ in fns}
    for _ in range(args.rounds):
        for name, fn, timed in fns:
            r = best_rate(fn, args.calls, 1)
            if timed:
                rates[name] = max(rates[name], r)
    fns.clear()  # free the floors' copies before tianshou runs
    del floor_take
    frames = np.empty((0, H, W), np.uint8)
    gc.collect()
    ts = None if args.no_tianshou else run_tianshou(args.tianshou_python, n, args.calls,
                                                    args.rounds)

    print(f"frame stack, capacity {n:,}, uint8 {H}x{W}, stack {K}, sample({B})")
    print(f"  fill: {fill_s:.1f} s ({n / fill_s:,.0f} steps/s)")
    print(f"  replaybank resident memory: {mem_rb / 2**20:,.0f} MiB = {ratio_mem:.3f}x one "
          f"frame per transition (storage arrays: {nbytes_ratio:.3f}x; target <= 1.05x)")
    for name, r in rates.items():
        print(f"  {name:>12}: {r:,.0f} samples/s")
    for floor in ("numpy floor", "numpy take floor"):
        print(f"  replaybank / {floor} = {rates['replaybank'] / rates[floor]:.2f}x "
              "(target >= 0.8x)")
    if ts is not None:
        print(f"  {'tianshou':>12}: {ts['rate']:,.0f} samples/s (resident "
              f"{ts['mem'] / (n * frame_bytes):.3f}x one frame per transition)")
        print(f"  replaybank / tianshou = {rates['replaybank'] / ts['rate']:.2f}x "
              "(target >= 2x)")
    else:
        print("  tianshou: not measured")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
