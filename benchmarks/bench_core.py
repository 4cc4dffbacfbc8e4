"""Core benchmark: ReplayBuffer against raw preallocated numpy arrays (the floor).

Measures, at capacity 1,000,000 with obs float32[17] and action float32[6]:

* ``add``: one transition at a time (obs/next_obs as fresh float32 arrays, reward a
  Python float, flags Python bools, as a gymnasium loop produces them),
* ``extend``: chunks of 256 transitions,
* ``sample(256)``,
* ``add`` of one step of 16 envs at once (``num_envs=16``: a vector-env loop),

and, in the same run, the floor doing the same work on six preallocated numpy arrays
(obs, action, reward, next_obs, terminated, truncated) with slice assignment and
fancy-index gathers. Speed ratio = floor_time / our_time (1.0 = as fast as the floor).
Memory: resident-set growth of a filled buffer against the bytes of obs once + action +
reward + flags.

The timing helpers are :mod:`replaybank.cli.harness`'s, the ones ``replaybank bench`` times
the peer libraries with. The machine may be noisy: times are CPU time of this process
(``time.process_time``),
ours and the floor are measured interleaved, each repeated, and the best (lowest) kept.

Run: ``python benchmarks/bench_core.py [--capacity N] [--repeats R]``; with
``REPLAYBANK_PURE_PYTHON=1`` in the environment the compiled one-lane add/extend
(``replaybank._lane``) is off and the pure-Python fallback is measured.
"""

from __future__ import annotations

import argparse
import gc
from typing import Any

import numpy as np

import replaybank as rb
from replaybank.cli.harness import (  # the harness `replaybank bench` times peers with
    ACT,
    BATCH,
    CHUNK,
    OBS,
    best_of,
    chunks,
    make_stream,
    single_items,
    time_adds,
    time_extends,
    time_samples,
)

LANES = 16
TARGETS = {"add": 0.5, "extend": 0.9, "sample": 0.9, "sample*": 0.9, f"add x{LANES}": 0.5,
           "add async": 0.5}


class Floor:
    """Six preallocated numpy arrays: the least work any buffer can do."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.obs = np.zeros((n, OBS), np.float32)
        self.next_obs = np.zeros((n, OBS), np.float32)
        self.action = np.zeros((n, ACT), np.float32)
        self.reward = np.zeros(n, np.float32)
        self.terminated = np.zeros(n, bool)
        self.truncated = np.zeros(n, bool)
        self.pos = 0
        self.size = 0
        self.rng = np.random.default_rng(0)

    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
            truncated: Any) -> None:
        i = self.pos
        self.obs[i] = obs
        self.action[i] = action
        self.reward[i] = reward
        self.next_obs[i] = next_obs
        self.terminated[i] = terminated
        self.truncated[i] = truncated
        self.pos = (i + 1) % self.n
        self.size = min(self.size + 1, self.n)

    def extend(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
               truncated: Any) -> None:
        i = self.pos
        j = i + len(obs)
        if j > self.n:  # chunks divide the capacity; restart after single adds
            i, j = 0, len(obs)
        self.obs[i:j] = obs
        self.action[i:j] = action
        self.reward[i:j] = reward
        self.next_obs[i:j] = next_obs
        self.terminated[i:j] = terminated
        self.truncated[i:j] = truncated
        self.pos = j % self.n
        self.size = min(self.size + len(obs), self.n)

    def sample(self, b: int) -> dict[str, Any]:
        idx = self.rng.integers(0, self.size, size=b)
        return {"obs": self.obs[idx], "action": self.action[idx], "reward": self.reward[idx],
                "next_obs": self.next_obs[idx], "terminated": self.terminated[idx],
                "truncated": self.truncated[idx], "indices": idx}


class LanesFloor(Floor):
    """The floor for ``lanes`` envs stepping together: rows of ``[T, lanes, ...]``."""

    def __init__(self, n: int, lanes: int) -> None:
        super().__init__(n // lanes)
        for name in ("obs", "next_obs", "action", "reward", "terminated", "truncated"):
            old = getattr(self, name)
            setattr(self, name, np.zeros((len(old), lanes, *old.shape[1:]), old.dtype))


class AsyncLanesFloor(LanesFloor):
    """The floor for async envs: each lane has its own write row."""

    def __init__(self, n: int, lanes: int) -> None:
        super().__init__(n, lanes)
        self.rows = np.zeros(lanes, np.int64)

    def add(self, env_ids: Any = None, **kw: Any) -> None:  # type: ignore[override]
        rows = self.rows[env_ids]
        for name, v in kw.items():
            getattr(self, name)[rows, env_ids] = v
        self.rows[env_ids] = (rows + 1) % len(self.obs)


def async_items(n: int, lanes: int, seed: int = 2) -> list[dict[str, Any]]:
    """``n`` steps of a random half of ``lanes`` envs (random order): ``add(env_ids=...)``."""
    rng = np.random.default_rng(seed)
    out = []
    for kw in lane_items(n, lanes, seed):
        ids = rng.permutation(lanes)[:lanes // 2]
        out.append({"env_ids": ids, **{k: v[ids] for k, v in kw.items()}})
    return out


def lane_items(n: int, lanes: int, seed: int = 1) -> list[dict[str, Any]]:
    """``n`` steps of ``lanes`` envs as a vector-env loop passes them to ``add``."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n + 1, lanes, OBS)).astype(np.float32)
    ends = rng.random((n, lanes)) < 1e-3
    return [{"obs": obs[i], "action": rng.standard_normal((lanes, ACT)).astype(np.float32),
             "reward": rng.standard_normal(lanes).astype(np.float32),
             "next_obs": obs[i + 1].copy(), "terminated": ends[i],
             "truncated": np.zeros(lanes, bool)} for i in range(n)]


class TakeFloor(Floor):
    """The floor gathering with ``ndarray.take`` (numpy's fastest row gather)."""

    def sample(self, b: int) -> dict[str, Any]:
        idx = self.rng.integers(0, self.size, size=b)
        return {"obs": self.obs.take(idx, axis=0), "action": self.action.take(idx, axis=0),
                "reward": self.reward.take(idx), "next_obs": self.next_obs.take(idx, axis=0),
                "terminated": self.terminated.take(idx), "truncated": self.truncated.take(idx),
                "indices": idx}


def measure_memory(capacity: int, stream: dict[str, Any]) -> tuple[int, int]:
    """RSS growth of a buffer filled from ``stream`` and the ideal byte count."""
    import psutil

    proc = psutil.Process()
    gc.collect()
    before = proc.memory_info().rss
    buf = rb.ReplayBuffer(capacity=capacity, seed=0)
    for i in range(0, capacity, CHUNK):
        buf.extend(**{k: v[i:i + CHUNK] for k, v in stream.items()})
    gc.collect()
    grown = proc.memory_info().rss - before
    ideal = capacity * (OBS * 4 + ACT * 4 + 4 + 2)
    assert len(buf) == capacity
    return grown, ideal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--adds", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=2_000)
    args = parser.parse_args()
    cap = args.capacity - args.capacity % CHUNK
    stream = make_stream(cap, episode_len=1000)

    # memory first, on a fresh heap
    grown, ideal = measure_memory(cap, stream)

    n_add = min(args.adds, cap)
    items = single_items(stream, n_add)
    n_chunks = min(cap // CHUNK, 1000)
    parts = chunks(stream, n_chunks)

    ours = rb.ReplayBuffer(capacity=cap, seed=0)
    ours_lanes = rb.ReplayBuffer(capacity=cap - cap % LANES, num_envs=LANES, seed=0)
    floor_lanes = LanesFloor(cap - cap % LANES, LANES)
    items_lanes = lane_items(min(n_add // LANES, len(floor_lanes.obs)), LANES)
    ours_async = rb.ReplayBuffer(capacity=cap - cap % LANES, num_envs=LANES, seed=0)
    floor_async = AsyncLanesFloor(cap - cap % LANES, LANES)
    items_async = async_items(len(items_lanes), LANES)
    floor = Floor(cap)
    take_floor = TakeFloor(cap)
    # fill both completely first: every page is touched, and timings are steady-state
    # (the ring wraps and overwrites, as it does for most of a training run)
    for target in (ours, floor, take_floor):
        for i in range(0, cap, CHUNK):
            target.extend(**{k: v[i:i + CHUNK] for k, v in stream.items()})
    assert len(ours) == cap and floor.size == cap == take_floor.size
    results: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeats):  # interleave ours and the floor against noise
        for op, fo, ff in (
            ("add", lambda: time_adds(ours.add, items), lambda: time_adds(floor.add, items)),
            ("extend", lambda: time_extends(ours.extend, parts),
             lambda: time_extends(floor.extend, parts)),
            ("sample", lambda: time_samples(ours.sample, args.samples),
             lambda: time_samples(floor.sample, args.samples)),
            ("sample*", lambda: time_samples(ours.sample, args.samples),
             lambda: time_samples(take_floor.sample, args.samples)),
            (f"add x{LANES}", lambda: time_adds(ours_lanes.add, items_lanes),
             lambda: time_adds(floor_lanes.add, items_lanes)),
            ("add async", lambda: time_adds(ours_async.add, items_async),
             lambda: time_adds(floor_async.add, items_async)),
        ):
            o, f = best_of(fo, 1), best_of(ff, 1)
            prev = results.get(op, (float("inf"), float("inf")))
            results[op] = (min(prev[0], o), min(prev[1], f))

    from replaybank.storage.writers.compiled import accelerated

    print("one-lane add/extend: " + ("compiled (replaybank._lane)" if accelerated() else
                                     "pure Python (REPLAYBANK_PURE_PYTHON=1 or not built)"))
    print(f"capacity={cap:,}  obs float32[{OBS}]  action float32[{ACT}]  "
          f"chunk={CHUNK}  batch={BATCH}  (best of {args.repeats})")
    print(f"{'op':<10}{'ours (us)':>12}{'floor (us)':>12}{'ratio':>8}{'target':>9}  ok")
    for op, (o, f) in results.items():
        ratio = f / o
        ok = "yes" if ratio >= TARGETS[op] else "NO"
        print(f"{op:<10}{o * 1e6:>12.2f}{f * 1e6:>12.2f}{ratio:>8.2f}{TARGETS[op]:>9.2f}  {ok}")
    print("sample*: the same sample(256) against a floor that gathers with ndarray.take")
    print(f"add x{LANES}: one step of {LANES} envs at once (num_envs={LANES}) against "
          f"[T, {LANES}, ...] arrays (not an issue target; the vector-env loop)")
    print(f"add async: add(env_ids=...) of a random half of {LANES} envs per step (async "
          "vector envs; the lanes fall out of step) against per-lane rows of the same arrays")
    mem_ratio = grown / ideal
    print(f"{'memory':<10}{grown / 2**20:>10.1f}MB{ideal / 2**20:>10.1f}MB{mem_ratio:>8.3f}"
          f"{'<=1.10':>9}  {'yes' if mem_ratio <= 1.1 else 'NO'}")


if __name__ == "__main__":
    main()
