"""Ape-X on Ray: actor processes write a sharded replay service, one learner trains.

    python examples/apex_cartpole.py --actors 4 --shards 2 --steps 60000

``rb.distributed.ReplayService`` holds a prioritized 3-step buffer in ``--shards`` Ray
actors; every collector is a Ray actor with its own env lane and a pickled client of the
service. Collector ``i`` plays CartPole-v1 with its exploration rate from Ape-X's ladder
``eps_i = 0.4 ** (1 + 7 * i / (N - 1))`` (Horgan et al. 2018), computes an initial
priority for each step with its copy of the network (the one-step ``|td error|``) and
writes the steps with them (``client.extend(..., env_ids=[i], priority=p)``). The
learner (this process) trains the DQN of ``replaybank demo`` from the service (double
DQN, Huber loss, global PER weights, n-step targets), sends updated priorities back,
pushes its weights to the collectors every ``--sync-every`` updates, and evaluates the
greedy policy. Collection keeps ``--steps-per-update`` env steps per gradient step (the
demo's ratio): the learner waits for collectors when it is ahead, and hands out new
collection chunks only while they are not ahead.

Prints the evaluations and ``solved at <env steps>`` once the greedy return reaches
``--target`` (475, as ``replaybank demo``), or ``not solved``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import gymnasium as gym
import numpy as np
import ray
import torch

from replaybank.cli.demo import evaluate
from replaybank.cli.dqn import DQNAgent, DQNConfig
from replaybank.distributed import ReplayService

ENV_ID = "CartPole-v1"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--actors", type=int, default=4)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--steps", type=int, default=60_000, help="env steps of all actors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--capacity", type=int, default=30_000, help="per shard")
    p.add_argument("--learning-starts", type=int, default=1_000)
    p.add_argument("--steps-per-update", type=float, default=2.0)
    p.add_argument("--chunk", type=int, default=50, help="env steps per collection call")
    p.add_argument("--sync-every", type=int, default=50, help="updates between weight pushes")
    p.add_argument("--eval-every", type=int, default=2_000, help="env steps between evals")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--cpus-per-actor", type=float, default=0.25)
    return p.parse_args(argv)


def epsilon_ladder(n: int, base: float = 0.4, alpha: float = 7.0) -> list[float]:
    """Ape-X's exploration rates ``base ** (1 + alpha * i / (n - 1))``."""
    return [base ** (1 + alpha * i / max(1, n - 1)) for i in range(n)]


@ray.remote
class Collector:
    """One env lane: plays with epsilon-greedy actions, writes steps with priorities."""

    def __init__(self, lane: int, client: Any, eps: float, seed: int) -> None:
        torch.set_num_threads(1)
        self.lane, self.client, self.eps = lane, client, eps
        self.env = gym.make(ENV_ID)
        self.obs, _ = self.env.reset(seed=seed)
        self.agent = DQNAgent(4, 2, DQNConfig(), seed=seed)
        self.ret = 0.0

    def set_weights(self, weights: dict[str, Any]) -> None:
        self.agent.q.load_state_dict(weights)

    def collect(self, steps: int) -> list[float]:
        """Play ``steps`` steps, write them; the returns of the episodes that ended."""
        cols: dict[str, list[Any]] = {k: [] for k in (
            "obs", "action", "reward", "next_obs", "terminated", "truncated")}
        returns = []
        for _ in range(steps):
            a = int(self.agent.act(self.obs[None].astype(np.float32), self.eps)[0])
            nxt, r, term, trunc, _ = self.env.step(a)
            for k, v in zip(cols, (self.obs, a, r, nxt, term, trunc), strict=True):
                cols[k].append(v)
            self.ret += float(r)
            if term or trunc:
                returns.append(self.ret)
                self.ret = 0.0
                self.obs, _ = self.env.reset()
            else:
                self.obs = nxt
        data = {k: np.asarray(v) for k, v in cols.items()}
        data["obs"] = data["obs"].astype(np.float32)
        data["next_obs"] = data["next_obs"].astype(np.float32)
        data["reward"] = data["reward"].astype(np.float32)
        prio = self._priorities(data)
        self.client.extend(**{k: v[:, None] for k, v in data.items()},
                           env_ids=[self.lane], priority=prio[:, None])
        self.client.flush()
        return returns

    def _priorities(self, d: dict[str, Any]) -> Any:
        """One-step ``|r + gamma * max_a' Q(s', a') * (1 - terminated) - Q(s, a)|``."""
        with torch.no_grad():
            q = self.agent.q(torch.as_tensor(d["obs"]))
            q_next = self.agent.q(torch.as_tensor(d["next_obs"])).max(dim=1).values.numpy()
        qa = q.numpy()[np.arange(len(d["action"])), d["action"]]
        target = d["reward"] + 0.99 * q_next * (1.0 - d["terminated"])
        return np.abs(target - qa).astype(np.float64) + 1e-3


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 _temp_dir=tempfile.mkdtemp(prefix="apex", dir="/tmp"))
    torch.set_num_threads(1)
    cfg = DQNConfig()
    lanes = -(-args.actors // args.shards) * args.shards  # a multiple of the shards
    total_updates = int(args.steps / args.steps_per_update)
    service = ReplayService(args.shards, {
        "capacity": args.capacity, "n_step": cfg.n_step, "gamma": cfg.gamma,
        "sampler": {"type": "prioritized", "alpha": 0.6, "beta": 0.4,
                    "beta_schedule": "linear", "beta_steps": total_updates}},
        num_lanes=lanes, seed=args.seed, num_cpus=0.25, timeout=120.0)
    learner = DQNAgent(4, 2, cfg, seed=args.seed)
    client = service.client("learner")
    ladder = epsilon_ladder(args.actors)
    actors = [Collector.options(num_cpus=args.cpus_per_actor).remote(
        i, service.client(f"actor{i}", max_rows=args.chunk), ladder[i], args.seed + 1 + i)
        for i in range(args.actors)]
    weights = ray.put({k: v.clone() for k, v in learner.q.state_dict().items()})
    ray.get([a.set_weights.remote(weights) for a in actors], timeout=120)
    pending = {a.collect.remote(args.chunk): a for a in actors}
    env_steps = updates = 0
    evals: list[tuple[int, float]] = []
    returns: list[float] = []
    next_eval, solved = args.eval_every, None
    t0 = time.perf_counter()
    try:
        while env_steps < args.steps and solved is None:
            ready, _ = ray.wait(list(pending), num_returns=1,
                                timeout=0 if updates < _owed(env_steps, args) else 120)
            for ref in ready:
                a = pending.pop(ref)
                returns += ray.get(ref, timeout=120)
                env_steps += args.chunk
                pending[a.collect.remote(args.chunk)] = a
            while updates < _owed(env_steps, args):
                batch = client.sample(cfg.batch_size)
                _, td = learner.update(batch)
                client.update_priorities(batch.indices, td)
                updates += 1
                if updates % args.sync_every == 0:
                    weights = ray.put({k: v.clone() for k, v in learner.q.state_dict().items()})
                    for a in actors:
                        a.set_weights.remote(weights)
            if env_steps >= next_eval:
                next_eval += args.eval_every
                score = evaluate(learner, args.eval_episodes, seed=10_000 + len(evals))
                evals.append((env_steps, score))
                recent = np.mean(returns[-20:]) if returns else float("nan")
                print(f"env steps {env_steps:6d}  updates {updates:6d}  collector return "
                      f"{recent:6.1f}  greedy eval {score:6.1f}  ({time.perf_counter() - t0:.0f}"
                      " s)", flush=True)
                if score >= args.target:
                    solved = env_steps
        print(f"solved at {solved} env steps" if solved is not None else "not solved")
        stats = service.stats()
        return {"solved_at": solved, "evals": evals, "updates": updates,
                "env_steps": env_steps, "size": stats["size"],
                "wall_s": time.perf_counter() - t0}
    finally:
        for a in actors:
            ray.kill(a)
        service.shutdown()
        if started:
            ray.shutdown()


def _owed(env_steps: int, args: argparse.Namespace) -> int:
    """Gradient steps the learner owes after ``env_steps`` collected steps."""
    return max(0, int((env_steps - args.learning_starts) / args.steps_per_update))


if __name__ == "__main__":
    main()
