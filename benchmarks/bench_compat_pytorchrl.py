"""Overhead of the pytorchrl front end over the core calls it wraps.

Two storages, each against the core buffer it owns, built alike:

* ``replay``: ``compat.pytorchrl.ReplayBuffer`` vs ``rb.ReplayBuffer`` (uniform);
* ``per3``: ``compat.pytorchrl.PERBuffer(n_step=3, alpha=0.6)`` vs ``rb.ReplayBuffer(
  n_step=3, sampler=PrioritizedSampler(alpha=0.6))`` with initial priorities.

Operations (4 envs, obs float32[8], pytorchrl's torch tensors ``[4, ...]``):

* ``insert``: ``insert_transition(sample)`` vs ``buf.add(...)`` given the same tensors
  converted with ``.numpy()`` by hand (what a core user with torch data writes); the
  ``add(numpy)`` row is the core call on ready numpy arrays (a floor, no conversion);
* ``batch``: ``next(generate_batches(1, 256))`` vs ``buf.sample(256)`` plus the same
  float32 tensors made by hand (``torch.as_tensor`` per field, rewards and dones
  ``[B, 1]``); ``sample`` is the core call alone.

Interleaved rounds, best round (us per call) and the ratio front end / core call.
Target: ratios within 1.2.

Run: ``python benchmarks/bench_compat_pytorchrl.py [--rounds R] [--iters I]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

import replaybank as rb
from replaybank.compat import pytorchrl as prl
from replaybank.samplers.prioritized import PrioritizedSampler

N_ENVS, OBS_DIM, B = 4, 8, 256


def samples(count: int) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(count):
        out.append({
            "Observation": torch.rand(N_ENVS, OBS_DIM, generator=g),
            "RecurrentHiddenStates": torch.zeros(N_ENVS, 1), "Done": torch.zeros(N_ENVS, 1),
            "Action": torch.randint(0, 2, (N_ENVS, 1), generator=g).float(),
            "Reward": torch.rand(N_ENVS, 1, generator=g),
            "NextObservation": torch.rand(N_ENVS, OBS_DIM, generator=g),
            "NextRecurrentHiddenStates": torch.zeros(N_ENVS, 1),
            "NextDone": (torch.rand(N_ENVS, 1, generator=g) < 0.01).float()})
    return out


def core_add(buf: rb.ReplayBuffer, priority: Any) -> Callable[[dict[str, Any]], None]:
    false = np.zeros(N_ENVS, bool)

    def add(s: dict[str, Any]) -> None:
        buf.add(obs=s["Observation"].numpy(), action=s["Action"].numpy(),
                reward=s["Reward"].numpy().reshape(N_ENVS),
                next_obs=s["NextObservation"].numpy(),
                terminated=s["NextDone"].numpy().reshape(N_ENVS) != 0, truncated=false,
                priority=priority, prev_done=s["Done"].numpy())
    return add


def core_add_numpy(buf: rb.ReplayBuffer, priority: Any,
                   data: list[dict[str, Any]]) -> Callable[[int], None]:
    false = np.zeros(N_ENVS, bool)
    ready = [{"obs": s["Observation"].numpy(), "action": s["Action"].numpy(),
              "reward": s["Reward"].numpy().reshape(N_ENVS),
              "next_obs": s["NextObservation"].numpy(),
              "terminated": s["NextDone"].numpy().reshape(N_ENVS) != 0,
              "prev_done": s["Done"].numpy()} for s in data]

    def add(i: int) -> None:
        buf.add(truncated=false, priority=priority, **ready[i])
    return add


def core_batch(buf: rb.ReplayBuffer) -> Callable[[], dict[str, Any]]:
    def batch() -> dict[str, Any]:
        b = buf.sample(B)
        f = torch.float32
        out = {"Observation": torch.as_tensor(b.obs, dtype=f),
               "Action": torch.as_tensor(b.action, dtype=f),
               "Reward": torch.as_tensor(b.reward[:, None], dtype=f),
               "NextObservation": torch.as_tensor(b.next_obs, dtype=f),
               "NextDone": torch.as_tensor(b.terminated[:, None], dtype=f),
               "Done": torch.as_tensor(b["prev_done"], dtype=f)}
        if "weights" in b:
            out["per_weights"] = torch.as_tensor(b.weights[:, None], dtype=f)
            out["n_step"] = torch.as_tensor(b.discount[:, None])
            out["idxs"] = b.indices
        return out
    return batch


def timed(fn: Callable[[], Any], iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    data = samples(args.iters)
    cap = 100_000
    rows: dict[str, list[float]] = {}

    def record(name: str, us: float) -> None:
        rows.setdefault(name, []).append(us)

    for _ in range(args.rounds):
        for scheme in ("replay", "per3"):
            if scheme == "replay":
                front = prl.ReplayBuffer(cap, "cpu", None, None, None, seed=0)
                core = rb.ReplayBuffer(cap * N_ENVS, num_envs=N_ENVS, seed=0,
                                       autoreset_mode="same_step")
                floor = rb.ReplayBuffer(cap * N_ENVS, num_envs=N_ENVS, seed=0,
                                        autoreset_mode="same_step")
                prio = None
            else:
                front = prl.PERBuffer(cap, "cpu", None, SimpleNamespace(gamma=0.99), None,
                                      n_step=3, alpha=0.6, beta=0.4, epsilon=1e-6, seed=0)
                core, floor = (rb.ReplayBuffer(
                    cap * N_ENVS, num_envs=N_ENVS, seed=0, n_step=3,
                    sampler=PrioritizedSampler(alpha=0.6, beta=0.4, eps=1e-6),
                    autoreset_mode="same_step") for _ in range(2))
                prio = np.full(N_ENVS, 1e6)
            it = iter(data)
            record(f"{scheme} insert: front end",
                   timed(lambda: front.insert_transition(next(it)), args.iters))  # noqa: B023
            add = core_add(core, prio)
            it = iter(data)
            record(f"{scheme} insert: core add(.numpy())",
                   timed(lambda: add(next(it)), args.iters))  # noqa: B023
            addn = core_add_numpy(floor, prio, data)
            k = iter(range(args.iters))
            record(f"{scheme} insert: core add(numpy)",
                   timed(lambda: addn(next(k)), args.iters))  # noqa: B023
            n = max(1, args.iters // 10)
            record(f"{scheme} batch: front end",
                   timed(lambda: next(front.generate_batches(1, B)), n))  # noqa: B023
            cb = core_batch(core)
            record(f"{scheme} batch: core sample + tensors", timed(cb, n))
            record(f"{scheme} batch: core sample", timed(lambda: core.sample(B), n))  # noqa: B023

    best = {k: min(v) for k, v in rows.items()}
    print(f"{'case':44s} {'best us':>9s} {'median us':>10s} {'ratio':>7s}")
    for name, vals in rows.items():
        scheme, op = name.split(":")[0].split()
        base = best[f"{scheme} {op}: " + ("core add(.numpy())" if op == "insert"
                                          else "core sample + tensors")]
        ratio = best[name] / base
        print(f"{name:44s} {best[name]:9.2f} {float(np.median(vals)):10.2f} {ratio:7.2f}")


if __name__ == "__main__":
    main()
