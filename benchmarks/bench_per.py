"""Prioritized replay throughput: replaybank vs cpprb vs a numpy binary sum tree.

One iteration = ``sample(256, beta=0.4)`` (indices, IS weights and every field) plus
``update_priorities`` of the 256 sampled items, on a full 1,000,000-step buffer with
``obs`` float32[17] and ``action`` float32[6]. All candidates run in one process,
interleaved round by round; the best round of each is reported (the machine is noisy),
plus the median. The sampler-only section times drawing 256 slots with weights and
updating their priorities, without touching field data.

Run: ``python benchmarks/bench_per.py [--capacity N] [--rounds R] [--iters I]``.
cpprb is optional (``pip install "replaybank[bench]"``); when it does not import, its
column is skipped with a note.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import replaybank as rb
from replaybank.samplers.base import LaneView

OBS, ACT, BATCH = 17, 6, 256


class NumpyBinaryPER:
    """Baseline: a plain vectorised-numpy binary sum tree (+ min tree) PER buffer."""

    def __init__(self, capacity: int, alpha: float = 0.6, eps: float = 1e-6) -> None:
        self.cap = 1
        while self.cap < capacity:
            self.cap *= 2
        self.n = capacity
        self.alpha, self.eps = alpha, eps
        self.sum = np.zeros(2 * self.cap)
        self.min = np.full(2 * self.cap, np.inf)
        self.obs = np.zeros((capacity, OBS), np.float32)
        self.next_obs = np.zeros((capacity, OBS), np.float32)
        self.act = np.zeros((capacity, ACT), np.float32)
        self.rew = np.zeros(capacity, np.float32)
        self.done = np.zeros(capacity, np.float32)
        self.size = 0
        self.max_p = 1.0
        self.rng = np.random.default_rng(0)

    def _set(self, idx: np.ndarray, p: np.ndarray) -> None:
        i = idx + self.cap
        self.sum[i] = p
        self.min[i] = p
        while i[0] > 1:
            i = np.unique(i // 2)
            self.sum[i] = self.sum[2 * i] + self.sum[2 * i + 1]
            self.min[i] = np.minimum(self.min[2 * i], self.min[2 * i + 1])

    def extend(self, obs: np.ndarray, act: np.ndarray, rew: np.ndarray, nxt: np.ndarray,
               done: np.ndarray) -> None:
        n = len(obs)
        idx = np.arange(self.size, self.size + n)
        self.obs[idx], self.act[idx], self.rew[idx] = obs, act, rew
        self.next_obs[idx], self.done[idx] = nxt, done
        self._set(idx, np.full(n, self.max_p))
        self.size += n

    def draw(self, b: int, beta: float) -> tuple[np.ndarray, np.ndarray]:
        total = self.sum[1]
        t = (np.arange(b) + self.rng.random(b)) * (total / b)
        i = np.ones(b, dtype=np.int64)
        while i[0] < self.cap:
            left = self.sum[2 * i]
            right = t >= left
            t = np.where(right, t - left, t)
            i = 2 * i + right
        idx = np.minimum(i - self.cap, self.size - 1)
        p = self.sum[idx + self.cap]
        w = (p / self.min[1]) ** -beta
        return idx, w

    def sample(self, b: int, beta: float) -> dict[str, np.ndarray]:
        idx, w = self.draw(b, beta)
        return {"obs": self.obs[idx], "act": self.act[idx], "rew": self.rew[idx],
                "next_obs": self.next_obs[idx], "done": self.done[idx], "weights": w,
                "indexes": idx}

    def update(self, idx: np.ndarray, td: np.ndarray) -> None:
        p = (td + self.eps) ** self.alpha
        self.max_p = max(self.max_p, float(p.max()))
        self._set(idx, p)


def make_data(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs_seq = rng.standard_normal((n + 1, OBS)).astype(np.float32)
    term = np.zeros(n, bool)
    term[999::1000] = True  # 1000-step episodes
    return {"obs": obs_seq[:-1], "next_obs": obs_seq[1:],
            "action": rng.standard_normal((n, ACT)).astype(np.float32),
            "reward": rng.standard_normal(n).astype(np.float32), "terminated": term,
            "truncated": np.zeros(n, bool)}


def time_rounds(fns: dict[str, Callable[[], None]], rounds: int,
                iters: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            out[name].append((time.perf_counter() - t0) / iters)
    return out


def report(title: str, res: dict[str, list[float]], ours: str) -> None:
    print(f"\n{title}")
    print(f"{'candidate':<36}{'best us/it':>11}{'median us/it':>13}{'it/s (best)':>12}"
          f"{'ours x faster: best':>21}{'median':>8}")
    best_ours, med_ours = min(res[ours]), float(np.median(res[ours]))
    for name, ts in res.items():
        b, m = min(ts), float(np.median(ts))
        print(f"{name:<36}{b * 1e6:>11.1f}{m * 1e6:>13.1f}{1 / b:>12.0f}"
              f"{b / best_ours:>21.2f}{m / med_ours:>8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=300)
    args = ap.parse_args()
    cap = args.capacity
    data = make_data(cap)
    beta = 0.4
    rng = np.random.default_rng(1)
    td = rng.random((64, BATCH)) * 2.0
    step = [0]

    def next_td() -> np.ndarray:
        step[0] += 1
        return td[step[0] % 64]

    # --- replaybank (public API)
    t0 = time.perf_counter()
    ours = rb.PrioritizedReplayBuffer(cap, alpha=0.6, beta=beta, seed=0)
    chunk = 100_000
    for s in range(0, cap, chunk):
        ours.extend(**{k: v[s:s + chunk] for k, v in data.items()})
    fill_ours = time.perf_counter() - t0
    print(f"replaybank kernel: {ours.sampler.kernel_name}; fill {fill_ours:.2f}s")

    def it_ours() -> None:
        b = ours.sample(BATCH, beta=beta)
        ours.update_priorities(b.indices, next_td())

    # --- numpy binary tree baseline
    base = NumpyBinaryPER(cap)
    for s in range(0, cap, chunk):
        sl = slice(s, s + chunk)
        base.extend(data["obs"][sl], data["action"][sl], data["reward"][sl],
                    data["next_obs"][sl], data["terminated"][sl].astype(np.float32))

    def it_base() -> None:
        b = base.sample(BATCH, beta)
        base.update(b["indexes"], next_td())

    fns: dict[str, Callable[[], None]] = {
        "replaybank PrioritizedReplayBuffer": it_ours,
        "numpy binary sum tree": it_base,
    }

    # --- cpprb
    try:
        import cpprb

        cp: Any = cpprb.PrioritizedReplayBuffer(
            cap, {"obs": {"shape": OBS}, "act": {"shape": ACT}, "rew": {},
                  "next_obs": {"shape": OBS}, "done": {}}, alpha=0.6, eps=1e-6)
        for s in range(0, cap, chunk):
            sl = slice(s, s + chunk)
            cp.add(obs=data["obs"][sl], act=data["action"][sl], rew=data["reward"][sl],
                   next_obs=data["next_obs"][sl], done=data["terminated"][sl])

        def it_cp() -> None:
            b = cp.sample(BATCH, beta=beta)
            cp.update_priorities(b["indexes"], next_td())

        fns["cpprb PrioritizedReplayBuffer"] = it_cp
        from importlib.metadata import version

        print(f"cpprb {version('cpprb')}")
    except Exception as exc:  # any failure (missing, build error): skip the column
        print(f"cpprb skipped: {type(exc).__name__}: {exc}")

    for fn in fns.values():  # warm-up (JIT already compiled/cached by construction)
        for _ in range(50):
            fn()
    res = time_rounds(fns, args.rounds, args.iters)
    report(f"sample({BATCH}, beta) + update_priorities({BATCH}), capacity {cap:,}", res,
           "replaybank PrioritizedReplayBuffer")

    # --- samplers alone (no field data)
    per = ours.sampler
    lv = LaneView(ours.table.T, ours.table.lanes, ours.table.written, ours.table.counts)
    srng = np.random.default_rng(2)

    def s_ours() -> None:
        r = per.sample(BATCH, lv, srng, beta=beta)
        per.update(r.keys % cap, next_td())

    np_per = rb.PrioritizedSampler(kernel="numpy")
    np_per.bind(ours.table.T, 1)
    np_per.load_state_dict(per.state_dict())

    def s_ours_numpy() -> None:
        r = np_per.sample(BATCH, lv, srng, beta=beta)
        np_per.update(r.keys % cap, next_td())

    def s_base() -> None:
        idx, _ = base.draw(BATCH, beta)
        base.update(idx, next_td())

    sres = time_rounds({"replaybank PrioritizedSampler": s_ours,
                        "replaybank sampler, numpy kernels": s_ours_numpy,
                        "numpy binary sum tree": s_base}, args.rounds, args.iters)
    report("sampler alone: draw 256 + weights + update 256", sres,
           "replaybank PrioritizedSampler")


if __name__ == "__main__":
    main()
