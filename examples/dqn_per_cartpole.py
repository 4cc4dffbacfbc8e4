"""Double DQN with prioritized 3-step replay on CartPole-v1.

    python examples/dqn_per_cartpole.py --total-timesteps 50000

Experience comes from 4 vectorized envs through ``rb.Collector``, which stores only real
transitions (never the reset step of gymnasium's NEXT_STEP autoreset). The buffer computes
n-step returns at sample time (``batch.reward``, ``batch.discount = gamma ** L``) and
returns importance weights; the TD errors go back as priorities.

Every ``--eval-every`` env steps (and at the end) the greedy policy (argmax Q) plays
``--eval-episodes`` episodes; the learning curve (training episodes and evaluations) is
written to ``--plot``. A progress bar shows while stdout is a terminal (``--quiet``: none).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812

import replaybank as rb
from replaybank.integrations.curves import LearningCurve
from replaybank.integrations.evaluation import evaluate_policy
from replaybank.integrations.progress import ProgressBar, progress_enabled


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--total-timesteps", "--steps", type=int, default=50_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--buffer-size", type=int, default=50_000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--n-step", type=int, default=3)
    p.add_argument("--tau", type=float, default=0.01)
    p.add_argument("--learning-starts", type=int, default=1_000)
    p.add_argument("--exploration-fraction", type=float, default=0.25)
    p.add_argument("--eval-every", type=int, default=5_000)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--plot", type=Path, default=Path("dqn_per_cartpole.png"),
                   help="learning-curve PNG to write")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args()


class QNetwork(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(),
                                 nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, n_actions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    envs = gym.make_vec("CartPole-v1", num_envs=args.num_envs, vectorization_mode="sync")
    n_actions = int(envs.single_action_space.n)
    q = QNetwork(int(np.prod(envs.single_observation_space.shape)), n_actions)
    q_target = QNetwork(int(np.prod(envs.single_observation_space.shape)), n_actions)
    q_target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=args.learning_rate)

    n_updates = max(1, args.total_timesteps // 2)
    buf = rb.ReplayBuffer(
        args.buffer_size // args.num_envs * args.num_envs, num_envs=args.num_envs,
        seed=args.seed, n_step=args.n_step, gamma=args.gamma,
        sampler=rb.PrioritizedSampler(alpha=0.6, beta=0.4, beta_schedule="linear",
                                      beta_steps=n_updates),
    )
    epsilon = 1.0

    def greedy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return q(torch.as_tensor(obs, dtype=torch.float32)).argmax(1).numpy()

    def policy(obs: np.ndarray) -> np.ndarray:
        actions = greedy(obs)
        explore = rng.random(len(actions)) < epsilon
        actions[explore] = rng.integers(0, n_actions, int(explore.sum()))
        return actions

    def update() -> float:
        batch = buf.sample(args.batch_size).to_torch()
        with torch.no_grad():
            next_a = q(batch.next_obs).argmax(1, keepdim=True)  # double DQN
            next_q = q_target(batch.next_obs).gather(1, next_a).squeeze(1)
            target = batch.reward + batch.discount * (~batch.terminated) * next_q
        pred = q(batch.obs).gather(1, batch.action.view(-1, 1)).squeeze(1)
        loss = (batch.weights * F.smooth_l1_loss(pred, target, reduction="none")).mean()
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(q.parameters(), 10.0)
        optimizer.step()
        buf.update_priorities(batch.indices, (target - pred).abs().detach().numpy())
        with torch.no_grad():
            for p, tp in zip(q.parameters(), q_target.parameters(), strict=True):
                tp.lerp_(p, args.tau)
        return float(loss.item())

    collector = rb.Collector(envs, policy, buf, seed=args.seed)
    curve = LearningCurve(f"Double DQN, prioritized {args.n_step}-step replay, CartPole-v1, "
                          f"seed {args.seed}", target=475.0)
    returns: list[float] = []
    loss = float("nan")
    step, next_eval, start = 0, args.eval_every, time.time()
    with ProgressBar(args.total_timesteps, "DQN", enabled=progress_enabled(args.quiet)) as bar:
        while step < args.total_timesteps:
            fraction = step / (args.exploration_fraction * args.total_timesteps)
            epsilon = max(0.05, 1.0 - 0.95 * fraction)
            result = collector.collect(args.num_envs)  # one step of every env
            step += result.env_steps
            returns += result.episode_returns
            curve.add_episodes(step, result.episode_returns)
            if step >= args.learning_starts:
                for _ in range(args.num_envs // 2):
                    loss = update()
            recent = float(np.mean(returns[-10:])) if returns else float("nan")
            if step >= next_eval or step >= args.total_timesteps:
                next_eval += args.eval_every
                mean, std = curve.add_eval(step, evaluate_policy(
                    "CartPole-v1", greedy, args.eval_episodes, seed=10_000 + step))
                print(f"step {step:>7}  eval {mean:7.1f} +- {std:5.1f} "
                      f"({args.eval_episodes} greedy episodes)  train return (last 10) "
                      f"{recent:7.1f}  loss {loss:.3f}  eps {epsilon:.2f}  "
                      f"{step / (time.time() - start):.0f} steps/s", flush=True)
            bar.update(result.env_steps, ret=recent, loss=loss)
    envs.close()
    print(f"done: {step} steps, {len(returns)} episodes, "
          f"mean return of the last 10: {np.mean(returns[-10:]) if returns else float('nan'):.1f}")
    final = curve.last_eval  # the loop evaluates at its last step
    if final is not None:
        print(f"final greedy eval: {final[1]:.1f} +- {final[2]:.1f} over {final[3]} episodes")
    print(f"learning curve: {curve.plot(args.plot)}")


if __name__ == "__main__":
    main()
