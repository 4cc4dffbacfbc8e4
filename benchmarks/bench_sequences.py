"""Sequence sampling for recurrent / world-model agents against a raw numpy window gather.

Setup (the issue's): capacity 1,000,000 steps over 16 lanes, obs float32[64],
``sample_sequences(16, 64)``; each lane has its own episode lengths.

Compared, side by side in one run (interleaved rounds, best round of each):

* **replaybank**: ``buf.sample_sequences(16, 64)`` in both boundary modes: valid-start
  rejection, obs/next_obs/action/reward/terminated/truncated windows ``[16, 64, ...]``,
  masks and is_first/is_last/is_terminal flags.
* **numpy floor**: preallocated ``[T * 16, ...]`` arrays; one sample draws 16 (lane,
  start) pairs that fit below the end and gathers a 65-step obs window (obs and
  next_obs as views) plus the action/reward/terminated/truncated windows. No episode
  logic, no masks. With fancy indexing (``obs[slots]``), and as **numpy take floor**
  with ``ndarray.take`` (faster); and the take floor with next_obs its own array (a
  copy), **next apart**: the least numpy work for exact next observations where they
  differ from the next step's, as cross windows need at the episode ends they hold.

Each round runs them alternately, a floor then a replaybank call (each right after a
contender that read other memory, so none starts with the previous one's rows cached),
and the best round of each is kept. Target: replaybank >= 0.8x the floor (issue 29: the
take floor's time within 1.1x, i.e. >= 0.91x).

Run: ``python benchmarks/bench_sequences.py [--capacity N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

LANES = 16
D = 64
B = 16
L = 64


def best_rate(fn: Any, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return calls / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=60)
    args = ap.parse_args()

    from replaybank.cli import bench_windows as bw

    n = args.capacity
    T = n // LANES  # noqa: N806
    t0 = time.perf_counter()
    buf = bw.sequence_buffer(n)  # per-lane episode lengths (see bench_windows)
    fill_s = time.perf_counter() - t0

    # --- numpy floors: the same data laid out flat (the take floor is replaybank bench's)
    floor_take = bw.sequence_floor(buf)
    t = buf.table
    obs, act, rew, ter, tru = (t.flat(t.arrays[k]).copy() for k in
                               ("obs", "action", "reward", "terminated", "truncated"))
    frng = np.random.default_rng(2)
    steps65 = np.arange(L + 1) * LANES

    def floor() -> tuple[Any, ...]:  # fancy indexing
        lane = frng.integers(0, LANES, size=B)
        start = frng.integers(0, T - L - 1, size=B)
        slots = (start * LANES + lane)[:, None] + steps65  # [B, L + 1]
        o = obs[slots]
        s = slots[:, :L]
        return o[:, :L], o[:, 1:], act[s], rew[s], ter[s], tru[s]

    def floor_take_next() -> tuple[Any, ...]:
        """The take floor with next_obs its own array (a copy of the window one step
        on): the least numpy work for exact next observations where they differ from
        the next step's, as at the episode ends inside cross windows."""
        lane = frng.integers(0, LANES, size=B)
        start = frng.integers(0, T - L - 1, size=B)
        slots = (start * LANES + lane)[:, None] + steps65  # [B, L + 1]
        o = obs.take(slots, axis=0)
        s = slots[:, :L]
        return (o[:, :L], o[:, 1:].copy(), act.take(s), rew.take(s), ter.take(s),
                tru.take(s))

    sb = buf.sample_sequences(B, L)
    assert sb.obs.shape == (B, L, D) and sb.next_obs.shape == (B, L, D) and sb.mask.all()
    # the order alternates a floor and a replaybank call, so that each runs right after a
    # contender that read other memory: a floor run right after the other floor (the same
    # arrays) would start with their rows' caches and TLB entries warm, replaybank never
    # (the last replaybank call of a round only separates two floors: not counted)
    stop = lambda: buf.sample_sequences(B, L)  # noqa: E731
    fns = [
        ("numpy take floor", floor_take, True),
        ("replaybank stop", stop, True),
        ("numpy floor", floor, True),
        ("replaybank cross", lambda: buf.sample_sequences(B, L, episode_boundary="cross"),
         True),
        ("numpy take floor, next apart", floor_take_next, True),
        ("replaybank stop", stop, False),
    ]
    rates = {name: 0.0 for name, _, _ in fns}
    for _ in range(args.rounds):
        for name, fn, timed in fns:
            r = best_rate(fn, args.calls)
            if timed:
                rates[name] = max(rates[name], r)

    print(f"sequences: capacity {n:,}, {LANES} lanes, obs float32[{D}], "
          f"sample_sequences({B}, {L})")
    print(f"  fill: {fill_s:.1f} s ({n / fill_s:,.0f} steps/s)")
    for name, r in rates.items():
        print(f"  {name:>16}: {r:,.0f} batches/s")
    for name in ("replaybank stop", "replaybank cross"):
        for fl in ("numpy floor", "numpy take floor"):
            print(f"  {name} / {fl} = {rates[name] / rates[fl]:.2f}x (target >= 0.8x)")
    print(f"  replaybank cross / numpy take floor, next apart = "
          f"{rates['replaybank cross'] / rates['numpy take floor, next apart']:.2f}x "
          "(exact next_obs at episode ends inside windows)")


if __name__ == "__main__":
    main()
