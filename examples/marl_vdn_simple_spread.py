"""VDN (value decomposition) on mpe2's simple_spread_v3 from a MultiAgentReplayBuffer.

    python examples/marl_vdn_simple_spread.py --steps 100000 --seed 0

Three agents share one Q-network (input: the agent's observation and a one-hot agent
id); the team's Q is the sum of the agents' Q of their chosen actions (VDN, Sunehag et al.
2017) and is regressed on the team reward, the mean of the agents' rewards (the env's
reward is half a shared coverage term and half each agent's own collision penalty), with
a double-DQN target from a Polyak-averaged target network. Experience comes from
``--num-envs`` parallel envs through ``rb.MultiAgentCollector`` (epsilon-greedy); the
buffer returns joint transitions with n-step returns of the joint reward
(``batch.joint_reward``, ``batch.discount``), every agent's ``next_obs`` stacked for
parameter sharing (``batch.stacked("next_obs")``), and the joint episode end (an episode
ends by truncation after 25 steps, so the target still bootstraps there: only
``joint_terminated`` stops it).

Every ``--eval-every`` joint steps (and at the end) the greedy policy plays
``--eval-episodes`` episodes (reset seeds 1000, 1001, ...); the score is the per-agent mean
return (random policy about -27, agent i straight to landmark i about -15.5). ``--csv``
writes the evaluation points.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812

import replaybank as rb


def _common() -> ModuleType:
    """The shared evaluation helpers (``marl_baselines_simple_spread.py`` next to this)."""
    path = Path(__file__).resolve().with_name("marl_baselines_simple_spread.py")
    spec = importlib.util.spec_from_file_location("marl_baselines_simple_spread", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100_000,
                   help="joint env steps, summed over envs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--buffer-size", type=int, default=50_000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--learning-rate", type=float, default=5e-4)
    p.add_argument("--gamma", type=float, default=0.95)
    p.add_argument("--n-step", type=int, default=3)
    p.add_argument("--tau", type=float, default=0.01)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--learning-starts", type=int, default=2_000,
                   help="joint steps before updates (at most half of --steps)")
    p.add_argument("--updates-per-step", type=float, default=1.0,
                   help="gradient steps per vector step of all envs")
    p.add_argument("--exploration-fraction", type=float, default=0.4)
    p.add_argument("--final-epsilon", type=float, default=0.05)
    p.add_argument("--eval-every", type=int, default=10_000)
    p.add_argument("--eval-episodes", type=int, default=100)
    p.add_argument("--csv", type=Path, default=None, help="write the evaluation points here")
    return p.parse_args()


class AgentQ(nn.Module):
    """Q-values of one agent from its observation and its one-hot id (shared weights)."""

    def __init__(self, obs_dim: int, n_agents: int, n_actions: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim + n_agents, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, n_actions))
        self.register_buffer("ids", torch.eye(n_agents))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs`` ``[B, n_agents, obs_dim]`` -> Q ``[B, n_agents, n_actions]``."""
        ids = self.ids.expand(obs.shape[0], -1, -1)
        return self.net(torch.cat([obs, ids], dim=-1))


def main() -> None:
    args = parse_args()
    common = _common()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    envs = [common.make_env() for _ in range(args.num_envs)]
    agents = list(envs[0].possible_agents)
    n_agents, n_actions = len(agents), int(envs[0].action_space(agents[0]).n)
    obs_dim = int(envs[0].observation_space(agents[0]).shape[0])
    q = AgentQ(obs_dim, n_agents, n_actions, args.hidden)
    q_target = AgentQ(obs_dim, n_agents, n_actions, args.hidden)
    q_target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=args.learning_rate)
    spec = {"obs": {a: ((obs_dim,), "float32") for a in agents},
            "action": {a: ((), "int64") for a in agents}}
    buf = rb.MultiAgentReplayBuffer(args.buffer_size // args.num_envs * args.num_envs,
                                    agents, num_envs=args.num_envs, seed=args.seed, spec=spec,
                                    n_step=args.n_step, gamma=args.gamma)
    epsilon = 1.0

    def greedy(obs: np.ndarray) -> np.ndarray:
        """``[N, n_agents, obs_dim]`` -> argmax actions ``[N, n_agents]``."""
        with torch.no_grad():
            return q(torch.as_tensor(obs, dtype=torch.float32)).argmax(-1).numpy()

    def policy(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Epsilon-greedy per agent; ``obs`` ``{agent: [num_envs, obs_dim]}``."""
        x = np.stack([obs[a] for a in agents], axis=1)  # [num_envs, n_agents, obs_dim]
        actions = greedy(x)
        explore = rng.random(actions.shape) < epsilon
        actions[explore] = rng.integers(0, n_actions, int(explore.sum()))
        return {a: actions[:, i] for i, a in enumerate(agents)}

    def update() -> float:
        b = buf.sample(args.batch_size).to_torch()
        obs, next_obs = b.stacked("obs").float(), b.stacked("next_obs").float()
        action = b.stacked("action").long()  # [B, n_agents]
        active = b.stacked("active").float()  # [B, n_agents]; all True in simple_spread
        reward = b.joint_reward.float() / n_agents  # team reward: mean of the agents'
        discount = b.discount.float() if b.discount is not None else \
            torch.full_like(reward, args.gamma)
        with torch.no_grad():
            next_a = q(next_obs).argmax(-1, keepdim=True)  # double DQN
            next_q = (q_target(next_obs).gather(-1, next_a).squeeze(-1) * active).sum(1)
            target = reward + discount * (~b.joint_terminated).float() * next_q
        chosen = (q(obs).gather(-1, action.unsqueeze(-1)).squeeze(-1) * active).sum(1)
        loss = F.smooth_l1_loss(chosen, target)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(q.parameters(), 10.0)
        optimizer.step()
        with torch.no_grad():
            for p, tp in zip(q.parameters(), q_target.parameters(), strict=True):
                tp.lerp_(p, args.tau)
        return float(loss.item())

    collector = rb.MultiAgentCollector(envs, policy, buf, seed=args.seed)
    evals: list[tuple[int, float, float, int, float]] = []
    train: list[float] = []
    loss, step, next_eval, credit = float("nan"), 0, args.eval_every, 0.0
    start = time.time()
    while step < args.steps:
        epsilon = max(args.final_epsilon, 1.0 - (1.0 - args.final_epsilon) * step
                      / max(1.0, args.exploration_fraction * args.steps))
        res = collector.collect(args.num_envs)  # one step of every env
        step += res.steps
        train += [float(np.mean(list(r.values()))) for r in res.agent_episode_returns]
        if step >= min(args.learning_starts, args.steps // 2):
            credit += args.updates_per_step
            while credit >= 1.0:
                loss = update()
                credit -= 1.0
        if step >= next_eval or step >= args.steps:
            next_eval += args.eval_every
            r = common.evaluate(greedy, args.eval_episodes)
            evals.append((step, float(r.mean()), float(r.std()), len(r), time.time() - start))
            recent = float(np.mean(train[-50:])) if train else float("nan")
            print(f"step {step:>7}  eval {r.mean():7.2f} +- {r.std():5.2f} "
                  f"({len(r)} greedy episodes)  train per-agent return (last 50) {recent:7.2f}"
                  f"  loss {loss:.4f}  eps {epsilon:.2f}  {time.time() - start:6.1f} s",
                  flush=True)
    for e in envs:
        e.close()
    if args.csv is not None:
        common.write_csv(args.csv, evals)
    final = evals[-1]
    print(f"done: {step} joint steps, {len(train)} episodes, {len(buf)} joint steps stored, "
          f"{time.time() - start:.1f} s")
    print(f"final greedy eval: {final[1]:.2f} +- {final[2]:.2f} over {final[3]} episodes "
          "(per-agent mean return)")


if __name__ == "__main__":
    main()
