"""MAPPO on mpe2's simple_spread_v3 with a MultiAgentRolloutBuffer (per-agent GAE).

    python examples/marl_mappo_simple_spread.py --steps 200000 --seed 0

One actor shared by the three agents (input: the agent's observation and a one-hot agent
id) and a centralised critic that reads the global state (the three observations
concatenated, stored in the buffer as ``state``) and outputs one value per agent (each
agent's reward has its own collision term). ``--num-envs`` envs run in lockstep; each
rollout of ``--num-steps`` steps per env goes into ``rb.MultiAgentRolloutBuffer``, which
computes per-agent GAE: an episode ends by truncation after 25 steps, so the advantage of
the last step bootstraps from the value of the true final observation
(``final_obs=``, valued by the critic), and the recursion is cut there. Minibatches come from
``buf.get(batch_size, agents="together")`` (every agent of a sampled (env, time) step side
by side, advantages normalised over the rollout); the loss is PPO's clipped surrogate, a
value loss and an entropy bonus.

The rollouts are collected by ``rb.MultiAgentRolloutCollector``: the ``Policy`` below
answers ``policy(obs, state) -> (actions, values, log_probs)`` for a batch of envs and
``policy.value(obs, state)``; the collector steps the envs, resets the finished ones,
adds each step with the truncated agents' true final observations (``final_obs``), and
once the rollout is full computes the advantages, valuing those final observations and
the next observations with ``policy.value``.

Every ``--eval-every`` joint steps (and at the end) the greedy policy (each agent's most
likely action) plays ``--eval-episodes`` episodes (reset seeds 1000, 1001, ...); the score
is the per-agent mean return (random policy about -27, agent i straight to landmark i
about -15.5). ``--csv`` writes the evaluation points.
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
    p.add_argument("--steps", type=int, default=200_000,
                   help="joint env steps, summed over envs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--num-steps", type=int, default=50, help="rollout steps per env")
    p.add_argument("--learning-rate", type=float, default=7e-4)
    p.add_argument("--gamma", type=float, default=0.95)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=10)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--eval-every", type=int, default=20_000)
    p.add_argument("--eval-episodes", type=int, default=100)
    p.add_argument("--csv", type=Path, default=None, help="write the evaluation points here")
    return p.parse_args()


def layer(inp: int, out: int, std: float = 2**0.5) -> nn.Linear:
    lin = nn.Linear(inp, out)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.zeros_(lin.bias)
    return lin


class Actor(nn.Module):
    """Shared policy: logits ``[..., n_agents, n_actions]`` from ``[..., n_agents, obs]``."""

    def __init__(self, obs_dim: int, n_agents: int, n_actions: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(layer(obs_dim + n_agents, hidden), nn.Tanh(),
                                 layer(hidden, hidden), nn.Tanh(),
                                 layer(hidden, n_actions, 0.01))
        self.register_buffer("ids", torch.eye(n_agents))

    def forward(self, obs: torch.Tensor) -> torch.distributions.Categorical:
        ids = self.ids.expand(*obs.shape[:-2], -1, -1)
        return torch.distributions.Categorical(logits=self.net(torch.cat([obs, ids], -1)))


class Critic(nn.Module):
    """Centralised critic: the global state ``[..., state_dim]`` -> one value per agent
    ``[..., n_agents]``."""

    def __init__(self, state_dim: int, n_agents: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(layer(state_dim, hidden), nn.Tanh(), layer(hidden, hidden),
                                 nn.Tanh(), layer(hidden, n_agents, 1.0))

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.net(state)


class Policy:
    """The collector's policy: ``(actions, values, log_probs)`` of a batch of envs, each a
    dict by agent (``obs[agent]`` ``[n_env, obs_dim]``, ``state`` ``[n_env, state_dim]``)."""

    def __init__(self, actor: Actor, critic: Critic, agents: list[str]) -> None:
        self.actor, self.critic, self.agents = actor, critic, agents

    def __call__(self, obs: dict[str, np.ndarray], state: np.ndarray) -> tuple[
            dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
        x = torch.as_tensor(np.stack([obs[a] for a in self.agents], 1))  # [n, agents, obs]
        with torch.no_grad():
            dist = self.actor(x)
            action = dist.sample()  # [n_env, n_agents]
            log_prob = dist.log_prob(action).numpy()
        return ({a: action[:, j].numpy() for j, a in enumerate(self.agents)},
                self.value(obs, state),
                {a: log_prob[:, j] for j, a in enumerate(self.agents)})

    def value(self, obs: dict[str, np.ndarray], state: np.ndarray) -> dict[str, np.ndarray]:
        """One value per agent from the centralised critic on the global state."""
        with torch.no_grad():
            v = self.critic(torch.as_tensor(state)).numpy()  # [n, n_agents]
        return {a: v[:, j] for j, a in enumerate(self.agents)}


def main() -> None:
    args = parse_args()
    common = _common()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    # a short run (the smoke test's --steps 300) takes one shorter rollout
    n_env = args.num_envs
    n_steps = max(1, min(args.num_steps, args.steps // n_env))
    envs = [common.make_env() for _ in range(n_env)]
    agents = list(envs[0].possible_agents)
    n_agents, n_actions = len(agents), int(envs[0].action_space(agents[0]).n)
    obs_dim = int(envs[0].observation_space(agents[0]).shape[0])
    actor = Actor(obs_dim, n_agents, n_actions, args.hidden)
    critic = Critic(obs_dim * n_agents, n_agents, args.hidden)
    params = [*actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(params, lr=args.learning_rate, eps=1e-5)
    buf = rb.MultiAgentRolloutBuffer(n_steps, agents, num_envs=n_env, gamma=args.gamma,
                                     gae_lambda=args.gae_lambda, seed=args.seed,
                                     normalize_advantage="batch")
    # env i's first reset uses seed args.seed * 1_000_003 + i; the state stored is
    # env.state(), the three observations concatenated
    collector = rb.MultiAgentRolloutCollector(envs, Policy(actor, critic, agents), buf,
                                              seed=args.seed * 1_000_003)

    def greedy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return actor(torch.as_tensor(obs, dtype=torch.float32)).probs.argmax(-1).numpy()

    train: list[float] = []
    evals: list[tuple[int, float, float, int, float]] = []
    batch_steps = n_steps * n_env
    n_updates = max(1, args.steps // batch_steps)
    mb_size = max(1, batch_steps // args.num_minibatches)
    step, next_eval, start = 0, args.eval_every, time.time()
    for update in range(n_updates):
        for g in optimizer.param_groups:  # linear learning-rate annealing
            g["lr"] = args.learning_rate * (1.0 - update / n_updates)
        buf.reset()
        # n_steps steps of every env, then per-agent GAE (policy.value bootstraps)
        res = collector.collect(n_steps)
        train += [float(np.mean(list(r.values()))) for r in res.agent_episode_returns]
        step += res.steps

        for _ in range(args.update_epochs):
            for b in buf.get(mb_size, agents="together"):
                b = b.to_torch()
                x = torch.stack([b.obs[a] for a in agents], 1)  # [B, n_agents, obs_dim]
                act = torch.stack([b.action[a] for a in agents], 1).long()
                old = torch.stack([b.log_prob[a] for a in agents], 1)
                adv = torch.stack([b.advantages[a] for a in agents], 1).float()
                ret = torch.stack([b.returns[a] for a in agents], 1).float()
                mask = torch.stack([b.active[a] for a in agents], 1).float()
                dist = actor(x)
                ratio = (dist.log_prob(act) - old).exp()
                pg = torch.max(-adv * ratio,
                               -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef))
                v_err = (critic(b.state.float()) - ret).pow(2)
                n = mask.sum().clamp(min=1.0)
                loss = ((pg - args.ent_coef * dist.entropy() + args.vf_coef * 0.5 * v_err)
                        * mask).sum() / n
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, args.max_grad_norm)
                optimizer.step()

        if step >= next_eval or update == n_updates - 1:
            next_eval += args.eval_every
            r = common.evaluate(greedy, args.eval_episodes)
            evals.append((step, float(r.mean()), float(r.std()), len(r), time.time() - start))
            recent = float(np.mean(train[-50:])) if train else float("nan")
            print(f"step {step:>7}  eval {r.mean():7.2f} +- {r.std():5.2f} "
                  f"({len(r)} greedy episodes)  train per-agent return (last 50) {recent:7.2f}"
                  f"  {time.time() - start:6.1f} s", flush=True)
    for e in envs:
        e.close()
    if args.csv is not None:
        common.write_csv(args.csv, evals)
    final_eval = evals[-1]
    print(f"done: {step} joint steps, {len(train)} episodes, {n_updates} updates, "
          f"{time.time() - start:.1f} s")
    print(f"final greedy eval: {final_eval[1]:.2f} +- {final_eval[2]:.2f} over "
          f"{final_eval[3]} episodes (per-agent mean return)")


if __name__ == "__main__":
    main()
