"""Overhead of the velora front end (``replaybank.compat.velora``) over the core calls it makes.

    python benchmarks/bench_compat_velora.py [--capacity N] [--rounds R]

Each front-end call is timed against the core call it wraps, on two buffers filled alike:

* ``add``: ``buf.add(state, action, reward, next_state, done, hidden)`` with float32 CPU
  tensors, a Python float and a Python bool (a velora training loop) against
  ``buf.core.add(obs=..., ..., hidden=...)`` with the numpy arrays the front end passes on,
* ``add_multi``: 64 rows of tensors against ``buf.core.extend`` of the same 64 rows as numpy,
* ``sample(128)``: the front end's ``BatchExperience`` of tensors against
  ``buf.core.sample(128)`` (a numpy ``Batch``).

For context it also times velora's documented storage scheme (six preallocated torch
tensors written by index and gathered with ``torch.randint``), the work the front end
replaces. Rounds are interleaved (front end, core, tensors, front end, ...) and the best
(lowest) CPU time per call of each is kept: the machine may be shared.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from replaybank.compat.velora import ReplayBuffer

S, A, H, ROWS, BATCH = 11, 3, 16, 64, 128
_clock = time.process_time  # CPU time of this process: other processes do not count


class TensorRing:
    """velora's documented storage scheme: six preallocated tensors and a position."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.position, self.size = capacity, 0, 0
        self.states = torch.zeros((capacity, S))
        self.actions = torch.zeros((capacity, A))
        self.rewards = torch.zeros((capacity, 1))
        self.next_states = torch.zeros((capacity, S))
        self.dones = torch.zeros((capacity, 1))
        self.hiddens = torch.zeros((capacity, H))

    def add(self, s: Any, a: Any, r: float, ns: Any, d: bool, h: Any) -> None:
        i = self.position
        self.states[i] = s
        self.actions[i] = a
        self.rewards[i] = r
        self.next_states[i] = ns
        self.dones[i] = d
        self.hiddens[i] = h
        self.position = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def add_multi(self, s: Any, a: Any, r: Any, ns: Any, d: Any, h: Any) -> None:
        n = s.shape[0]
        idx = torch.arange(self.position, self.position + n) % self.capacity
        self.states[idx] = s
        self.actions[idx] = a
        self.rewards[idx] = r.unsqueeze(-1)
        self.next_states[idx] = ns
        self.dones[idx] = d.unsqueeze(-1).float()
        self.hiddens[idx] = h
        self.position = (self.position + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, n: int) -> tuple[Any, ...]:
        i = torch.randint(0, self.size, (n,))
        return (self.states[i], self.actions[i], self.rewards[i], self.next_states[i],
                self.dones[i], self.hiddens[i])


def per_call(fn: Callable[[], Any], n: int) -> float:
    t0 = _clock()
    for _ in range(n):
        fn()
    return (_clock() - t0) / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--capacity", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=20_000, help="add calls per round")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cap = args.capacity
    rng = np.random.default_rng(0)
    # a sequential stream: each next_state is the following state (episode ends aside)
    n_obs = 4096
    obs = torch.from_numpy(rng.standard_normal((n_obs + 1, S)).astype(np.float32))
    acts = torch.from_numpy(rng.standard_normal((n_obs, A)).astype(np.float32))
    hids = torch.from_numpy(rng.standard_normal((n_obs, H)).astype(np.float32))
    front = ReplayBuffer(cap, S, A, H)
    core_owner = ReplayBuffer(cap, S, A, H)
    core = core_owner.core
    ring = TensorRing(cap)
    rows = [(obs[i], acts[i], 1.0, obs[i + 1], i % 200 == 199, hids[i]) for i in range(n_obs)]
    np_rows = [tuple(x.numpy() if isinstance(x, torch.Tensor) else x for x in r) for r in rows]
    k = [0, 0, 0]

    def add_front() -> None:
        i = k[0] = (k[0] + 1) % n_obs
        front.add(*rows[i])

    def add_core() -> None:
        i = k[1] = (k[1] + 1) % n_obs
        s, a, r, ns, d, h = np_rows[i]
        core.add(obs=s, action=a, reward=r, next_obs=ns, terminated=d, truncated=False,
                 hidden=h)

    def add_ring() -> None:
        i = k[2] = (k[2] + 1) % n_obs
        ring.add(*rows[i])

    def add_core_torch() -> None:  # the core call a user makes from the same tensors
        i = k[1] = (k[1] + 1) % n_obs
        s, a, r, ns, d, h = rows[i]
        core.add(obs=s.numpy(), action=a.numpy(), reward=r, next_obs=ns.numpy(),
                 terminated=d, truncated=False, hidden=h.numpy())

    starts = list(range(0, n_obs - ROWS, ROWS))
    chunks = [(obs[j:j + ROWS], acts[j:j + ROWS], torch.ones(ROWS), obs[j + 1:j + ROWS + 1],
               torch.zeros(ROWS, dtype=torch.bool), hids[j:j + ROWS]) for j in starts]
    no = np.zeros(ROWS, dtype=bool)
    np_chunks = [tuple(x.numpy() for x in c) for c in chunks]
    m = [0, 0, 0]

    def multi_front() -> None:
        i = m[0] = (m[0] + 1) % len(chunks)
        front.add_multi(*chunks[i])

    def multi_core() -> None:
        i = m[1] = (m[1] + 1) % len(chunks)
        s, a, r, ns, d, h = np_chunks[i]
        core.extend(obs=s, action=a, reward=r, next_obs=ns, terminated=d, truncated=no,
                    hidden=h)

    def multi_ring() -> None:
        i = m[2] = (m[2] + 1) % len(chunks)
        ring.add_multi(*chunks[i])

    def multi_core_torch() -> None:
        i = m[1] = (m[1] + 1) % len(chunks)
        s, a, r, ns, d, h = chunks[i]
        core.extend(obs=s.numpy(), action=a.numpy(), reward=r.numpy(), next_obs=ns.numpy(),
                    terminated=d.numpy(), truncated=no, hidden=h.numpy())

    def sample_core_torch() -> None:  # a numpy batch turned into tensors, as a user would
        b = core.sample(BATCH)
        for v in b.values():
            torch.from_numpy(v)

    # fill all three to capacity first (sampling then draws from a full buffer)
    while len(front) < cap:
        multi_front()
        multi_core()
        multi_ring()

    ops: dict[str, tuple[Callable[[], Any], ...]] = {
        "add": (add_front, add_core, add_core_torch, add_ring),
        f"add_multi({ROWS})": (multi_front, multi_core, multi_core_torch, multi_ring),
        f"sample({BATCH})": (lambda: front.sample(BATCH), lambda: core.sample(BATCH),
                             sample_core_torch, lambda: ring.sample(BATCH)),
    }
    calls = {"add": args.calls, f"add_multi({ROWS})": args.calls // 10,
             f"sample({BATCH})": args.calls // 10}
    best: dict[str, list[float]] = {name: [np.inf] * 4 for name in ops}
    for _ in range(args.rounds):
        for name, fns in ops.items():
            for j, fn in enumerate(fns):
                best[name][j] = min(best[name][j], per_call(fn, calls[name]))
    print(f"capacity={cap:,}  state_dim={S} action_dim={A} hidden_dim={H}  "
          f"best of {args.rounds} interleaved rounds, CPU time per call")
    print(f"{'op':<15}{'front':>8}{'core':>8}{'ratio':>7}{'core+torch':>12}{'ratio':>7}"
          f"{'velora tensors':>16}   (us per call)")
    for name, (f_t, c_t, ct_t, r_t) in best.items():
        print(f"{name:<15}{f_t * 1e6:>8.2f}{c_t * 1e6:>8.2f}{f_t / c_t:>7.2f}"
              f"{ct_t * 1e6:>12.2f}{f_t / ct_t:>7.2f}{r_t * 1e6:>16.2f}")
    print("core: the wrapped core call on numpy inputs; core+torch: the same call made from "
          "the same torch tensors (.numpy() in, torch.from_numpy out), as a user of the core "
          "API with tensors writes it; target: front / core+torch <= 1.2. velora tensors: "
          "six preallocated torch tensors written by index (the scheme velora documents)")


if __name__ == "__main__":
    main()
