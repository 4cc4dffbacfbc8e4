"""Ape-X on one machine: collector processes write a shared-memory buffer, one learner trains.

    python examples/apex_shared_cartpole.py --actors 3 --steps 60000

The learner owns ``rb.ReplayBuffer(..., storage="shared")`` (prioritized, 3-step) and
hands each actor process a writer of its own lane (``buf.writer([i])``). Actor ``i`` plays
CartPole-v1 with its own exploration rate from Ape-X's ladder
``eps_i = base ** (1 + alpha * i / (N - 1))`` (Horgan et al. 2018; ``base = 0.4``,
``alpha = 7`` in the paper, here a gentler ``alpha = 3`` for so few actors), computes an
initial priority for each step with its copy of the network (the one-step ``|td error|``)
and adds the step with it. The learner trains the DQN of ``replaybank demo`` from the
buffer (double DQN, Huber loss, PER weights, n-step targets), sends its weights to the
actors every ``--sync-every`` updates, and plays greedy evaluation episodes. The actors keep
``--steps-per-update`` env steps per gradient step (the demo's ratio) by waiting for the
learner when they get ahead. Plain ``multiprocessing``: no Ray.

Prints the evaluation returns and ``solved at <env steps>`` once the greedy return
reaches ``--target`` (475, as the demo), or ``not solved``.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import queue
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import replaybank as rb
from replaybank.cli.demo import evaluate
from replaybank.cli.dqn import DQNAgent, DQNConfig

ENV_ID = "CartPole-v1"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--actors", type=int, default=3)
    p.add_argument("--steps", type=int, default=60_000, help="env steps of all actors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--capacity", type=int, default=60_000)
    p.add_argument("--learning-starts", type=int, default=1_000)
    p.add_argument("--steps-per-update", type=float, default=2.0)
    p.add_argument("--sync-every", type=int, default=50, help="updates between weight pushes")
    p.add_argument("--eval-every", type=int, default=2_000, help="env steps between evals")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--target", type=float, default=475.0)
    return p.parse_args(argv)


def epsilon_ladder(n: int, base: float = 0.4, alpha: float = 3.0) -> list[float]:
    """Ape-X's per-actor exploration rates."""
    return [base ** (1 + alpha * i / max(1, n - 1)) for i in range(n)]


def actor(i: int, handle: Any, weights: Any, eps: float, seed: int, budget: int,
          env_steps: Any, updates: Any, stop: Any, args: argparse.Namespace) -> None:
    """Play CartPole with epsilon ``eps`` and write each step to the shared buffer."""
    torch.set_num_threads(1)
    writer = handle.open()
    env = gym.make(ENV_ID)
    agent = DQNAgent(4, 2, DQNConfig(), seed=seed)
    gamma = agent.config.gamma
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        with contextlib.suppress(queue.Empty):  # newest weights, if the learner sent any
            agent.q.load_state_dict(weights.get_nowait())
        with env_steps.get_lock():
            done_steps = env_steps.value
            if done_steps >= budget:
                break
            ahead = done_steps > args.learning_starts and \
                done_steps > args.learning_starts + args.steps_per_update * updates.value + 256
            if not ahead:
                env_steps.value += 1
        if ahead:  # keep the demo's ratio of env steps to gradient steps
            time.sleep(0.0005)
            continue
        warm = done_steps < args.learning_starts
        action = int(rng.integers(2)) if warm or rng.random() < eps else \
            int(agent.greedy(obs[None])[0])
        nxt, reward, term, trunc, _ = env.step(action)
        with torch.no_grad():  # initial priority: one-step |td error| of this actor's net
            q = agent.q(torch.as_tensor(np.stack([obs, nxt]), dtype=torch.float32))
            td = reward + gamma * (not term) * float(q[1].max()) - float(q[0, action])
        writer.add(obs=obs[None].astype(np.float32), action=np.array([action]),
                   reward=np.array([reward], np.float32), next_obs=nxt[None].astype(np.float32),
                   terminated=np.array([term]), truncated=np.array([trunc]),
                   priority=np.array([abs(td)]))
        obs = nxt
        if term or trunc:
            obs, _ = env.reset()
    writer.close()
    env.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    cfg = DQNConfig()
    n = args.actors
    total_updates = int((args.steps - args.learning_starts) / args.steps_per_update)
    sampler = rb.PrioritizedSampler(alpha=0.6, beta=0.4, beta_schedule="linear",
                                    beta_steps=max(1, total_updates))
    spec = {"obs": ((4,), "float32"), "action": ((), "int64")}
    buf = rb.ReplayBuffer(args.capacity // n * n, num_envs=n, seed=args.seed, spec=spec,
                          sampler=sampler, n_step=cfg.n_step, gamma=cfg.gamma,
                          storage="shared")
    agent = DQNAgent(4, 2, cfg, seed=args.seed)
    env_steps, updates, stop = ctx.Value("q", 0), ctx.Value("q", 0), ctx.Event()
    queues = [ctx.Queue(maxsize=2) for _ in range(n)]
    procs = [ctx.Process(target=actor, args=(i, buf.writer([i]), queues[i], eps,
                                             args.seed * 100 + i, args.steps, env_steps,
                                             updates, stop, args))
             for i, eps in enumerate(epsilon_ladder(n))]
    for p in procs:
        p.start()
    evals: list[tuple[int, float]] = []
    solved_at = None
    next_eval = args.eval_every
    t0 = time.perf_counter()
    try:
        while True:
            steps = env_steps.value
            if steps >= args.learning_starts and len(buf) >= cfg.batch_size:
                batch = buf.sample(cfg.batch_size)
                _, td = agent.update(batch)
                buf.update_priorities(batch.indices, td)
                with updates.get_lock():
                    updates.value += 1
                if agent.updates % args.sync_every == 0:
                    state = {k: v.clone() for k, v in agent.q.state_dict().items()}
                    for q in queues:
                        with contextlib.suppress(queue.Full):  # the actor has enough
                            q.put_nowait(state)
            else:
                time.sleep(0.001)
            if steps >= next_eval:
                next_eval += args.eval_every
                score = evaluate(agent, args.eval_episodes, seed=10_000 + len(evals))
                evals.append((steps, score))
                print(f"env steps {steps:6d}  updates {agent.updates:6d}  "
                      f"buffer {len(buf):6d}  eval {score:6.1f}", flush=True)
                if score >= args.target:
                    solved_at = steps
                    break
            if not any(p.is_alive() for p in procs):
                failed = [p.exitcode for p in procs if p.exitcode]
                if failed:
                    raise RuntimeError(f"actor processes failed (exit codes {failed})")
                break
    finally:
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        buf.close()
    wall = time.perf_counter() - t0
    print(f"solved at {solved_at} env steps" if solved_at is not None else "not solved",
          f"({agent.updates} updates, {wall:.1f} s)")
    return {"solved_at": solved_at, "evals": evals, "updates": agent.updates, "wall_s": wall}


if __name__ == "__main__":
    main()
