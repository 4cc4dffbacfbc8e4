"""Soft actor-critic with a uniform ReplayBuffer on Pendulum-v1.

    python examples/sac_pendulum.py --total-timesteps 20000

A plain single-env loop: each step is added with its true ``next_obs`` and separate
``terminated`` / ``truncated`` flags (Pendulum only truncates, so every target
bootstraps). The buffer stores each observation once and returns ``next_obs`` exactly.

Every ``--eval-every`` env steps (and at the end) the greedy policy (the actor's mean
action, squashed) plays ``--eval-episodes`` episodes; the learning curve (training episodes
and evaluations) is written to ``--plot``. A progress bar shows while stdout is a terminal
(``--quiet``: none).
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
    p.add_argument("--total-timesteps", "--steps", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--buffer-size", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--learning-starts", type=int, default=1_000)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--tau", type=float, default=0.005)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-every", type=int, default=2_000)
    p.add_argument("--eval-episodes", type=int, default=5)
    p.add_argument("--plot", type=Path, default=Path("sac_pendulum.png"),
                   help="learning-curve PNG to write")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args()


def mlp(inp: int, out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(inp, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, out))


class Actor(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, scale: float) -> None:
        super().__init__()
        self.net = mlp(obs_dim, 2 * act_dim)
        self.scale = scale

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        std = log_std.clamp(-5, 2).exp()
        u = mean + std * torch.randn_like(mean)
        a = torch.tanh(u)
        log_prob = torch.distributions.Normal(mean, std).log_prob(u)
        log_prob = (log_prob - torch.log(self.scale * (1 - a.pow(2)) + 1e-6)).sum(-1)
        return a * self.scale, log_prob

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action: the squashed mean."""
        mean, _ = self.net(obs).chunk(2, dim=-1)
        return torch.tanh(mean) * self.scale


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("Pendulum-v1"))
    obs_dim = env.observation_space.shape[0]
    act_dim = env.action_space.shape[0]
    scale = float(env.action_space.high[0])
    actor = Actor(obs_dim, act_dim, scale)
    q1, q2 = mlp(obs_dim + act_dim, 1), mlp(obs_dim + act_dim, 1)
    q1_t, q2_t = mlp(obs_dim + act_dim, 1), mlp(obs_dim + act_dim, 1)
    q1_t.load_state_dict(q1.state_dict())
    q2_t.load_state_dict(q2.state_dict())
    q_opt = torch.optim.Adam([*q1.parameters(), *q2.parameters()], lr=args.lr)
    a_opt = torch.optim.Adam(actor.parameters(), lr=args.lr)
    log_alpha = torch.zeros(1, requires_grad=True)
    alpha_opt = torch.optim.Adam([log_alpha], lr=args.lr)
    target_entropy = -float(act_dim)

    buf = rb.ReplayBuffer(args.buffer_size, seed=args.seed,
                          spec=rb.spec_from_env(env))  # obs float32[3], action float32[1]
    def greedy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return actor.greedy(torch.as_tensor(obs, dtype=torch.float32)).numpy()

    def update() -> float:
        b = buf.sample(args.batch_size).to_torch()
        alpha = log_alpha.exp().detach()
        with torch.no_grad():
            next_a, next_logp = actor(b.next_obs)
            sa_next = torch.cat([b.next_obs, next_a], 1)
            q_next = torch.min(q1_t(sa_next), q2_t(sa_next)).squeeze(1) - alpha * next_logp
            target = b.reward + args.gamma * (~b.terminated) * q_next
        sa = torch.cat([b.obs, b.action], 1)
        q_loss = F.mse_loss(q1(sa).squeeze(1), target) + F.mse_loss(q2(sa).squeeze(1), target)
        q_opt.zero_grad()
        q_loss.backward()
        q_opt.step()

        a, logp = actor(b.obs)
        sa_pi = torch.cat([b.obs, a], 1)
        a_loss = (alpha * logp - torch.min(q1(sa_pi), q2(sa_pi)).squeeze(1)).mean()
        a_opt.zero_grad()
        a_loss.backward()
        a_opt.step()
        alpha_loss = -(log_alpha * (logp.detach() + target_entropy)).mean()
        alpha_opt.zero_grad()
        alpha_loss.backward()
        alpha_opt.step()
        with torch.no_grad():
            for net, tgt in ((q1, q1_t), (q2, q2_t)):
                for p, tp in zip(net.parameters(), tgt.parameters(), strict=True):
                    tp.lerp_(p, args.tau)
        return float(q_loss.item())

    obs, _ = env.reset(seed=args.seed)
    env.action_space.seed(args.seed)
    curve = LearningCurve(f"SAC, uniform replay, Pendulum-v1, seed {args.seed}")
    returns: list[float] = []
    q_loss = float("nan")
    next_eval, start = args.eval_every, time.time()
    with ProgressBar(args.total_timesteps, "SAC", enabled=progress_enabled(args.quiet)) as bar:
        for step in range(1, args.total_timesteps + 1):
            if step <= args.learning_starts:
                action = env.action_space.sample()
            else:
                with torch.no_grad():
                    action = actor(torch.as_tensor(obs)[None])[0][0].numpy()
            next_obs, reward, terminated, truncated, info = env.step(action)
            buf.add(obs=obs, action=action, reward=reward, next_obs=next_obs,
                    terminated=terminated, truncated=truncated)
            obs = next_obs
            if terminated or truncated:
                returns.append(float(info["episode"]["r"]))
                curve.add_episodes(step, returns[-1:])
                obs, _ = env.reset()
            if step > args.learning_starts:
                q_loss = update()
            recent = float(np.mean(returns[-5:])) if returns else float("nan")
            if step >= next_eval or step == args.total_timesteps:
                next_eval += args.eval_every
                mean, std = curve.add_eval(step, evaluate_policy(
                    "Pendulum-v1", greedy, args.eval_episodes, seed=10_000 + step))
                print(f"step {step:>7}  eval {mean:7.1f} +- {std:5.1f} "
                      f"({args.eval_episodes} greedy episodes)  train return (last 5) "
                      f"{recent:7.1f}  q_loss {q_loss:.3f}  "
                      f"{step / (time.time() - start):.0f} steps/s", flush=True)
            bar.update(1, ret=recent, q_loss=q_loss)
    env.close()
    print(f"done: {args.total_timesteps} steps, {len(returns)} episodes, "
          f"last return {returns[-1] if returns else float('nan'):.1f}")
    final = curve.last_eval  # the loop evaluates at its last step
    if final is not None:
        print(f"final greedy eval: {final[1]:.1f} +- {final[2]:.1f} over {final[3]} episodes")
    print(f"learning curve: {curve.plot(args.plot)}")


if __name__ == "__main__":
    main()
