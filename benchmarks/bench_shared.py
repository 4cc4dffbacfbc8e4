"""Learner sample rate of a shared-memory buffer while collector processes write it.

The baseline is the single-process buffer (``storage="numpy"``, same capacity, lanes,
sampler and contents) sampling in the same run. The shared buffer is first filled by its
writers; then ``--writers`` processes keep adding steps (each ``--rate`` steps per second
per lane, 0: as fast as they can) while the learner times ``sample(batch)`` (best of
``--repeats`` rounds of ``--calls`` calls, interleaved with the baseline's rounds). Also
reported: the writers' add rate and how many draws the learner threw away because writers
overwrote them (none expected: see ``replaybank.shared.lanes``).
Target: shared / single-process sample rate >= 0.8 with 4 writers running.

On a machine with fewer cores than writers + 1, the writers take CPU time from the
learner: the wall-clock ratio then measures the machine, and the CPU-time ratio (the
learner process's own CPU time per sample) the buffer's cost.

Run: ``python benchmarks/bench_shared.py [--capacity 200000] [--writers 4] [--rate 2000]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from typing import Any

import numpy as np

import replaybank as rb

SPEC = {"obs": ((4,), "float32"), "action": ((), "int64")}


def step_values(lanes: np.ndarray, t: np.ndarray, episode: np.ndarray,
                done: np.ndarray) -> dict[str, Any]:
    """One step of ``lanes`` at times ``t`` (all ``[m]``): obs ``(lane, t, episode, 0)``,
    next obs ``(lane, t + 1, episode, done)``."""
    m = len(lanes)
    obs = np.stack([lanes, t, episode, np.zeros(m)], axis=1).astype(np.float32)
    nxt = np.stack([lanes, t + 1, episode, done.astype(np.float64)], axis=1).astype(np.float32)
    return dict(obs=obs, action=t.astype(np.int64), reward=t.astype(np.float32),
                next_obs=nxt, terminated=done.copy(), truncated=np.zeros(m, bool))


def _sampler(kind: str) -> Any:
    return rb.PrioritizedSampler() if kind == "per" else None


def _buffer(args: argparse.Namespace, storage: str) -> Any:
    return rb.ReplayBuffer(args.capacity, num_envs=args.writers, seed=0, spec=SPEC,
                           sampler=_sampler(args.sampler), n_step=args.n_step,
                           storage=storage)


def writer(handle: Any, steps: int, rate: float, go: Any, stop: Any, count: Any) -> None:
    """Fill ``steps`` steps of the lane, signal, then keep writing until ``stop``."""
    w = handle.open()
    lanes = np.asarray(handle.lanes, np.int64)
    t = np.zeros(len(lanes))
    ep = np.zeros(len(lanes))
    rng = np.random.default_rng(int(lanes[0]))
    done_all = rng.random(1 << 16) < 0.01
    i = 0
    while i < steps:
        w.add(**step_values(lanes, t, ep, done_all[i & 0xFFFF:(i & 0xFFFF) + 1]))
        t += 1
        i += 1
    go.release()
    t0 = time.perf_counter()
    n = 0
    while not stop.is_set():
        w.add(**step_values(lanes, t, ep, done_all[i & 0xFFFF:(i & 0xFFFF) + 1]))
        t += 1
        i += 1
        n += 1
        if rate:
            lag = n / rate - (time.perf_counter() - t0)
            if lag > 0:
                time.sleep(lag)
    with count.get_lock():
        count.value += n / max(time.perf_counter() - t0, 1e-9)
    w.close()


def fill_single(buf: Any, steps: int) -> None:
    lanes = np.arange(buf.num_envs)
    rng = np.random.default_rng(0)
    t = np.zeros(len(lanes))
    for _ in range(steps):
        buf.add(**step_values(lanes, t, np.zeros(len(lanes)), rng.random(len(lanes)) < 0.01))
        t += 1


def rounds(buf: Any, batch: int, calls: int) -> tuple[float, float]:
    """Seconds per ``sample(batch)``: wall clock, and this process's CPU time (which
    leaves out the time the OS gave the writers' processes)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        buf.sample(batch)
    return (time.perf_counter() - t0) / calls, (time.process_time() - c0) / calls


def run(args: argparse.Namespace, rate: float) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    single = _buffer(args, "numpy")
    per_lane = args.capacity // args.writers
    fill_single(single, per_lane)
    shared = _buffer(args, "shared")
    go, stop, count = ctx.Semaphore(0), ctx.Event(), ctx.Value("d", 0.0)
    procs = [ctx.Process(target=writer, args=(shared.writer([i]), per_lane, rate, go, stop,
                                              count)) for i in range(args.writers)]
    for p in procs:
        p.start()
    for _ in procs:
        go.acquire()
    best_single = best_shared = cpu_single = cpu_shared = float("inf")
    for _ in range(args.repeats):
        wall, cpu = rounds(single, args.batch, args.calls)
        best_single, cpu_single = min(best_single, wall), min(cpu_single, cpu)
        wall, cpu = rounds(shared, args.batch, args.calls)
        best_shared, cpu_shared = min(best_shared, wall), min(cpu_shared, cpu)
    stop.set()
    for p in procs:
        p.join(30)
    retries = shared.metadata()["shared_retries"]
    shared.close()
    return {"single_us": best_single * 1e6, "shared_us": best_shared * 1e6,
            "ratio": best_single / best_shared, "cpu_ratio": cpu_single / cpu_shared,
            "writer_rate": count.value,
            "retries": float(retries)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--capacity", type=int, default=200_000)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--rate", type=float, default=2000.0,
                    help="steps per second per writer of the paced run")
    ap.add_argument("--sampler", choices=("uniform", "per"), default="per")
    ap.add_argument("--n-step", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    print(f"capacity {args.capacity:,}, {args.writers} writer processes (one lane each), "
          f"{args.sampler} {args.n_step}-step, sample({args.batch}); {os.cpu_count()} cores")
    print(f"{'writers':>22} | {'single us':>9} | {'shared us':>9} | {'rate ratio':>10} | "
          f"{'CPU-time ratio':>14} | {'adds/s all writers':>18} | retries")
    for rate in (args.rate, 0.0):
        r = run(args, rate)
        label = f"paced {rate:,.0f}/s each" if rate else "unpaced"
        print(f"{label:>22} | {r['single_us']:9.1f} | {r['shared_us']:9.1f} | "
              f"{r['ratio']:10.2f} | {r['cpu_ratio']:14.2f} | {r['writer_rate']:18,.0f} | "
              f"{r['retries']:.0f}")


if __name__ == "__main__":
    main()
