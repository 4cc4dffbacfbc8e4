"""Where a window case's time above its floor goes: a fixed cost per call, or memory.

``replaybank bench`` times ``sample_sequences(16, 64)`` and a frame-stack ``sample(32)``
beside a take floor (:mod:`replaybank.cli.bench_windows`), and the uniform ``sample(256)``
beside :class:`~replaybank.cli.bench_harness.TakeFloor`. On the 2-core machine of
``docs/benchmarks.md`` all three are within 1.1x of their floors; on a 16-core H200 host
the two window cases were 1.24x and 1.13x, about 18 us above the floor instead of 4-7 us,
and uniform sampling 1.35x (before its one-call gather). This script tells the two
possible causes apart, on any machine:

* a **fixed cost** per call (Python, the C plan, allocation) is the same whether the
  stored steps fit in the cache or not: it shows as the same ``rb - floor`` at a small,
  cache-resident capacity and at the benchmark's capacity;
* a **memory** cost (episode bookkeeping the floor does not read, prefetch distance)
  grows with the capacity: ``rb - floor`` is larger at the large capacity.

For each case and capacity it prints the replaybank call, its take floor (interleaved,
best of ``--repeats`` rounds of ``--calls`` calls, wall time) and their difference, then
the top functions of a ``cProfile`` of the replaybank call at the small capacity.

Run: ``python benchmarks/bench_window_overhead.py [--repeats R] [--calls N] [--large N]
[--no-profile]`` (about a minute on 2 cores).

Example:
    >>> import subprocess, sys
    >>> out = subprocess.run([sys.executable, "benchmarks/bench_window_overhead.py",
    ...                       "--repeats", "1", "--calls", "20", "--large", "65536",
    ...                       "--no-profile"], capture_output=True, text=True, check=True)
    >>> all(c in out.stdout for c in ("uniform", "sequences", "framestack"))
    True
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import time
from collections.abc import Callable
from typing import Any

from replaybank.cli.bench_harness import CHUNK, TakeFloor, chunks, make_stream
from replaybank.cli.bench_windows import (
    framestack_buffer,
    framestack_floor,
    framestack_sample,
    sequence_buffer,
    sequence_floor,
    sequence_sample,
)

Call = Callable[..., Any]


def uniform_buffer(capacity: int) -> tuple[Any, Any]:
    """A ``ReplayBuffer(capacity)`` filled with ``make_stream(capacity)`` (obs
    float32[17], action float32[6]: ``replaybank bench``'s sample case), and its stream."""
    import replaybank as rb

    stream = make_stream(capacity)
    buf = rb.ReplayBuffer(capacity=capacity, seed=0)
    for part in chunks(stream, capacity // CHUNK):
        buf.extend(**part)
    return buf, stream


def uniform_sample(built: tuple[Any, Any]) -> Call:
    """``sample(256)`` of :func:`uniform_buffer`'s buffer."""
    buf = built[0]
    return lambda: buf.sample(256)


def uniform_floor(built: tuple[Any, Any]) -> Call:
    """The same rows taken from flat copies of the fields (``replaybank bench``'s
    :class:`~replaybank.cli.bench_harness.TakeFloor`)."""
    floor = TakeFloor(built[1]).sample
    return lambda: floor(256)


def best_pair(rb_call: Call, floor: Call, calls: int, repeats: int) -> tuple[float, float]:
    """Best-of-``repeats`` microseconds per call of ``rb_call`` and ``floor``, each round
    timing one then the other (so both see the same machine state)."""
    best_rb = best_floor = float("inf")
    for _ in range(repeats):
        for which in (0, 1):
            fn = rb_call if which == 0 else floor
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            us = (time.perf_counter() - t0) / calls * 1e6
            if which == 0:
                best_rb = min(best_rb, us)
            else:
                best_floor = min(best_floor, us)
    return best_rb, best_floor


def profile_top(fn: Call, calls: int, top: int = 12) -> str:
    """The ``top`` functions by own time of ``calls`` calls of ``fn`` (cProfile), in
    microseconds per call of ``fn`` (the profiler's own cost included)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    lines = ["   own us   cum us   calls  function"]
    for (path, line, func), (_, ncalls, tottime, cumtime, _) in rows:
        where = func if path == "~" else f"{path.rsplit('/', 2)[-1]}:{line}({func})"
        lines.append(f"{tottime / calls * 1e6:9.2f} {cumtime / calls * 1e6:8.2f} "
                     f"{ncalls / calls:7.1f}  {where}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--large", type=int, default=1_000_000,
                    help="the large capacity (steps; frame stacks use a fifth)")
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    cases: list[tuple[str, Callable[[int], Any], Call, Call, int]] = [
        ("uniform", uniform_buffer, uniform_sample, uniform_floor, 16_384),
        ("sequences", sequence_buffer, sequence_sample, sequence_floor, 16_384),
        ("framestack", framestack_buffer, framestack_sample, framestack_floor, 4_096),
    ]
    print("case        capacity   replaybank us   floor us   rb - floor us   rb / floor")
    profiles = []
    for name, build, sample, floor, small in cases:
        for cap in (small, args.large // 5 if name == "framestack" else args.large):
            buf = build(cap)
            rb_call, floor_call = sample(buf), floor(buf)
            for _ in range(20):  # warm: first-call imports and plans
                rb_call()
                floor_call()
            gc.collect()
            gc.disable()
            try:
                t_rb, t_floor = best_pair(rb_call, floor_call, args.calls, args.repeats)
            finally:
                gc.enable()
            print(f"{name:11s} {cap:9,d} {t_rb:15.1f} {t_floor:10.1f} {t_rb - t_floor:15.1f}"
                  f" {t_rb / t_floor:12.2f}")
            if cap == small and not args.no_profile:
                profiles.append((name, cap, profile_top(rb_call, args.calls)))
            del buf, rb_call, floor_call
    print("\nA difference that stays the same from the small capacity to the large one is a"
          " fixed cost per call; one that grows is memory.")
    for name, cap, text in profiles:
        call = {"uniform": "sample(256)", "sequences": "sample_sequences(16, 64)"}.get(
            name, "sample(32)")
        print(f"\n## {name}, capacity {cap:,}: cProfile of {call}, top by own time")
        print(text)


if __name__ == "__main__":
    main()
