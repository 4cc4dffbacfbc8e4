"""PPO with replaybank's RolloutBuffer (GAE) on CartPole-v1.

    python examples/ppo_cartpole.py --total-timesteps 200000

The vector env runs in SAME_STEP autoreset mode, so an ending env's true final
observation arrives in ``info["final_obs"]``; truncated episodes bootstrap from its value
(``final_value=``), terminated ones do not, and GAE is cut at every episode end.
Every ``--eval-every`` steps the greedy policy (the most likely action) plays
``--eval-episodes`` episodes; training stops once an evaluation reaches ``--target``. The
learning curve (training episodes and evaluations) is written to ``--plot``. A progress
bar shows while stdout is a terminal (``--quiet``: none).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn

import replaybank as rb
from replaybank.integrations.curves import LearningCurve
from replaybank.integrations.evaluation import evaluate_policy
from replaybank.integrations.progress import ProgressBar, progress_enabled


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--total-timesteps", "--steps", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=2.5e-3)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--eval-every", type=int, default=10_240)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--target", type=float, default=475.0, help="stop once an eval reaches it")
    p.add_argument("--plot", type=Path, default=Path("ppo_cartpole.png"),
                   help="learning-curve PNG to write")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args()


def layer(inp: int, out: int, std: float = 2**0.5) -> nn.Linear:
    lin = nn.Linear(inp, out)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.zeros_(lin.bias)
    return lin


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
                                    layer(64, 1, 1.0))
        self.actor = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
                                   layer(64, n_actions, 0.01))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.actor(obs))

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """The most likely action of each observation."""
        with torch.no_grad():
            return self.actor(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1).numpy()


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    envs = gym.make_vec("CartPole-v1", num_envs=args.num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    agent = Agent(int(np.prod(envs.single_observation_space.shape)),
                  int(envs.single_action_space.n))
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    buf = rb.RolloutBuffer(args.num_steps, args.num_envs, gamma=args.gamma,
                           gae_lambda=args.gae_lambda, seed=args.seed)
    batch_steps = args.num_steps * args.num_envs
    n_updates = max(1, args.total_timesteps // batch_steps)
    obs, _ = envs.reset(seed=args.seed)
    step, next_eval, best, start = 0, args.eval_every, -np.inf, time.time()
    returns: list[float] = []
    curve = LearningCurve(f"PPO, RolloutBuffer with GAE, CartPole-v1, seed {args.seed}",
                          target=args.target)
    ep_ret = np.zeros(args.num_envs)
    bar = ProgressBar(n_updates * batch_steps, "PPO", enabled=progress_enabled(args.quiet))
    with bar:
        for update in range(n_updates):
            for g in optimizer.param_groups:  # linear learning-rate annealing
                g["lr"] = args.learning_rate * (1.0 - update / n_updates)
            buf.reset()
            for _ in range(args.num_steps):
                with torch.no_grad():
                    x = torch.as_tensor(obs)
                    dist, value = agent.dist(x), agent.value(x)
                    action = dist.sample()
                next_obs, reward, term, trunc, info = envs.step(action.numpy())
                final_value = np.full(args.num_envs, np.nan)
                if trunc.any():  # bootstrap truncated episodes from their real last observation
                    idx = np.flatnonzero(trunc & ~term)
                    final = np.stack([info["final_obs"][i] for i in idx]) if len(idx) else None
                    if final is not None:
                        with torch.no_grad():
                            final_value[idx] = agent.value(torch.as_tensor(final)).numpy()
                buf.add(obs=obs, action=action.numpy(), reward=reward, terminated=term,
                        truncated=trunc, value=value.numpy(),
                        log_prob=dist.log_prob(action).numpy(), final_value=final_value)
                ep_ret += reward
                step += args.num_envs
                ended = term | trunc
                returns += ep_ret[ended].tolist()
                curve.add_episodes(step, ep_ret[ended])
                ep_ret[ended] = 0.0
                obs = next_obs
            with torch.no_grad():
                last_values = agent.value(torch.as_tensor(obs)).numpy()
            buf.compute_returns_and_advantage(last_values)

            for b in buf.generate_batches(num_mini_batch=args.num_minibatches,
                                          num_epochs=args.update_epochs):
                b = b.to_torch()
                dist = agent.dist(b.obs)
                logratio = dist.log_prob(b.action) - b.log_prob
                ratio = logratio.exp()
                pg_loss = torch.max(-b.advantages * ratio, -b.advantages * ratio.clamp(
                    1 - args.clip_coef, 1 + args.clip_coef)).mean()
                v_loss = 0.5 * (agent.value(b.obs) - b.returns).pow(2).mean()
                loss = pg_loss - args.ent_coef * dist.entropy().mean() + args.vf_coef * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            recent = float(np.mean(returns[-20:])) if returns else float("nan")
            bar.update(batch_steps, ret=recent)
            if step >= next_eval or update == n_updates - 1:
                next_eval += args.eval_every
                score, std = curve.add_eval(step, evaluate_policy(
                    "CartPole-v1", agent.greedy, args.eval_episodes, seed=10_000 + update))
                best = max(best, score)
                print(f"step {step:>7}  eval {score:7.1f} +- {std:5.1f} "
                      f"({args.eval_episodes} greedy episodes)  train return (last 20) "
                      f"{recent:7.1f}  {step / (time.time() - start):.0f} steps/s", flush=True)
                if score >= args.target:
                    break
    envs.close()
    print(f"done: {step} steps, best eval {best:.1f}")
    final = curve.last_eval
    if final is not None:
        print(f"final greedy eval: {final[1]:.1f} +- {final[2]:.1f} over {final[3]} episodes")
    print(f"learning curve: {curve.plot(args.plot)}")


if __name__ == "__main__":
    main()
