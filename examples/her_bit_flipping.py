"""DQN with hindsight experience replay on bit flipping (the HER paper's Figure 1).

    python examples/her_bit_flipping.py --bits 15 --seed 0
    python examples/her_bit_flipping.py --bits 15 --seed 0 --no-her

``replaybank.envs.BitFlipping(n_bits)``: flip one bit per step until the state equals a
random goal; reward -1 per step until then, 0 on the step that reaches it (terminal);
episodes are truncated after n steps. From 15 bits on, random exploration (almost) never
reaches a goal, so (almost) all rewards are -1 and plain DQN learns nothing.
``rb.HerReplayBuffer(strategy="future", k=4)`` gives k/(k+1) = 80% of the sampled rows of
finished episodes the achieved goal of a later step of the same episode as their goal, and
recomputes their reward and termination with the env's ``compute_reward`` /
``compute_terminated`` (passed as ``reward_fn`` / ``terminated_fn``, so a relabelled row
that reaches its new goal is terminal). ``--no-her`` runs the same agent with ``k=0``: no
row is relabelled.

The agent: a Q network on ``concat(observation, desired_goal)`` (one hidden layer of
256), Double DQN targets clipped to the reachable returns ``[-1 / (1 - gamma), 0]``,
gamma 0.98, Adam lr 1e-3, batch 128, a soft-updated target network (tau 0.05),
``updates_per_episode`` optimisation steps after each episode and epsilon-greedy
exploration decaying linearly to 0.05. The greedy policy is evaluated on the same 100
episodes (reset seeds 10**6 + i) every ``eval_every`` episodes and at the end; success is
``info["is_success"]`` at the episode end.

Measured on this machine (2 shared CPU cores, ``torch.set_num_threads(1)``), 15 bits, the
default budget of 6,000 env steps (seeds 0-2, deterministic: the same numbers on every run
but the wall seconds, which vary with the load of the shared cores):

    run      seed   final success   first eval >= 0.9   best eval   episodes   wall s
                    (100 ep.)       (every 50 ep.)
    ------   ----   -------------   -----------------   ---------   --------   ------
    HER k=4  0      1.00            step 2,453          1.00        634        15-17
    HER k=4  1      1.00            step 1,984          1.00        655        24-25
    HER k=4  2      1.00            step 1,959          1.00        657        22-31
    no HER   0      0.00            never               0.00        400        11-17
    no HER   1      0.00            never               0.00        400        15
    no HER   2      0.00            never               0.00        400        9-15

Without HER the success stays 0.00 also with ten times the budget (60,000 steps, 4,000
episodes, seed 0: every evaluation 0.00, 145 s). With HER, 25 bits (``--bits 25 --steps
20000``, seed 0) reach 0.94 at step 8,231 and 1.00 at the end (49 s).

``train(bits, budget, seed, her=True, ...)`` returns ``dict(success, steps, episodes,
seconds, curve, steps_to_90, buffer)``; ``tests/test_her_bit_flipping.py`` runs it.
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812

import replaybank as rb
from replaybank.envs.bit_flipping import BitFlipping, compute_reward, compute_terminated

EVAL_SEED = 10**6
BUDGET = 6_000  # env steps: the budget of the results above (15 bits)


def q_network(bits: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(2 * bits, hidden), nn.ReLU(), nn.Linear(hidden, bits))


def inputs(obs: Any) -> torch.Tensor:
    """``concat(observation, desired_goal)`` as a float32 tensor (leading dims kept)."""
    return torch.cat([torch.as_tensor(np.asarray(obs["observation"], np.float32)),
                      torch.as_tensor(np.asarray(obs["desired_goal"], np.float32))], -1)


@torch.no_grad()
def greedy(q: nn.Module, obs: dict[str, Any]) -> int:
    return int(q(inputs(obs)).argmax())


def evaluate(q: nn.Module, bits: int, episodes: int) -> float:
    """Greedy success rate over ``episodes`` fixed episodes (reset seeds EVAL_SEED + i)."""
    env = BitFlipping(n_bits=bits)
    successes = 0
    for i in range(episodes):
        obs, info = env.reset(seed=EVAL_SEED + i)
        done = False
        while not done:
            obs, _, terminated, truncated, info = env.step(greedy(q, obs))
            done = terminated or truncated
        successes += bool(info["is_success"])
    return successes / episodes


def train(bits: int = 15, budget: int = BUDGET, seed: int = 0, her: bool = True, *,
          k: int = 4, gamma: float = 0.98, lr: float = 1e-3, batch_size: int = 128,
          hidden: int = 256, tau: float = 0.05, updates_per_episode: int | None = None,
          eps_start: float = 1.0, eps_end: float = 0.05, eps_fraction: float = 0.3,
          double: bool = True, eval_every: int = 50, eval_episodes: int = 100,
          stop_at: float | None = None, unit: str = "steps",
          quiet: bool = False) -> dict[str, Any]:
    """Train DQN (+ HER unless ``her=False``) on ``bits``-bit flipping for ``budget`` steps.

    Args:
        bits: Number of bits (episodes are ``bits`` steps).
        budget: Env steps to train for (the last episode may be cut short; its
            unfinished steps are never relabelled), or episodes with ``unit="episodes"``.
        seed: Seeds torch, the env, the buffer and exploration.
        her: ``False`` uses ``k=0``: the same buffer class, nothing relabelled.
        k: Relabelled share of finished-episode rows: ``k / (k + 1)``.
        updates_per_episode: Optimisation steps after each episode (default ``bits``).
        eps_fraction: Share of the budget over which epsilon decays to ``eps_end``.
        eval_every: Evaluate the greedy policy every this many episodes (0: only at the end).
        stop_at: Stop early once a periodic evaluation reaches this success rate.
        unit: ``"steps"`` or ``"episodes"``: what ``budget`` counts.
        quiet: Print only the final line.

    Returns:
        ``success`` (the last evaluation), ``steps``, ``episodes``, ``seconds`` (wall,
        evaluations included), ``curve`` (``(step, success)`` of every evaluation) and
        ``steps_to_90`` (the first step of the curve with success >= 0.9, or None), and
        the ``buffer`` it filled.
    """
    if unit not in ("steps", "episodes"):
        raise ValueError(f"unit must be 'steps' or 'episodes', got {unit!r}")
    start = time.time()
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    env = BitFlipping(n_bits=bits)
    q = q_network(bits, hidden)
    q_target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=lr)
    capacity = budget * (bits if unit == "episodes" else 1)
    buf = rb.HerReplayBuffer(
        capacity, reward_fn=compute_reward, terminated_fn=compute_terminated,
        strategy="future", k=k if her else 0, gamma=gamma, seed=seed)
    updates = bits if updates_per_episode is None else updates_per_episode
    q_min = -1.0 / (1.0 - gamma)

    def update() -> float:
        batch = buf.sample(batch_size)
        x, nx = inputs(batch.obs), inputs(batch.next_obs)
        action = torch.as_tensor(np.asarray(batch.action), dtype=torch.int64)
        reward = torch.as_tensor(np.asarray(batch.reward, np.float32))
        alive = 1.0 - torch.as_tensor(np.asarray(batch.terminated, np.float32))
        with torch.no_grad():
            if double:
                next_a = q(nx).argmax(1, keepdim=True)
                next_q = q_target(nx).gather(1, next_a).squeeze(1)
            else:
                next_q = q_target(nx).max(1).values
            target = (reward + gamma * alive * next_q).clamp(q_min, 0.0)
        loss = F.mse_loss(q(x).gather(1, action[:, None]).squeeze(1), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for p, tp in zip(q.parameters(), q_target.parameters(), strict=True):
                tp.lerp_(p, tau)
        return float(loss.detach())

    def report(line: str) -> None:
        if not quiet:
            print(line, flush=True)

    steps = episodes = 0
    curve: list[tuple[int, float]] = []
    train_successes: list[bool] = []
    obs, _ = env.reset(seed=seed)

    def used() -> int:
        return steps if unit == "steps" else episodes

    while used() < budget:
        epsilon = max(eps_end, eps_start + (eps_end - eps_start) * used()
                      / max(1.0, eps_fraction * budget))
        done = False
        info: dict[str, Any] = {}
        while not done and (unit == "episodes" or steps < budget):
            explore = rng.random() < epsilon
            action = int(rng.integers(bits)) if explore else greedy(q, obs)
            next_obs, reward, terminated, truncated, info = env.step(action)
            buf.add(obs=obs, action=action, reward=reward, next_obs=next_obs,
                    terminated=terminated, truncated=truncated)
            steps += 1
            obs = next_obs
            done = terminated or truncated
        episodes += 1
        train_successes.append(bool(info.get("is_success", False)))
        obs, _ = env.reset()
        if len(buf) >= batch_size:
            for _ in range(updates):
                update()
        if eval_every and episodes % eval_every == 0 and used() < budget:
            success = evaluate(q, bits, eval_episodes)
            curve.append((steps, success))
            report(f"episode {episodes:6d}  step {steps:7d}  eps {epsilon:.2f}  "
                   f"train success (last 100) {np.mean(train_successes[-100:]):.2f}  "
                   f"eval success {success:.2f}  {time.time() - start:6.1f}s")
            if stop_at is not None and success >= stop_at:
                break
    if not curve or curve[-1][0] != steps:
        curve.append((steps, evaluate(q, bits, eval_episodes)))
    seconds = time.time() - start
    success = curve[-1][1]
    steps_to_90 = next((s for s, rate in curve if rate >= 0.9), None)
    print(f"done: {bits} bits, {'HER k=' + str(k) if her else 'no HER'}, seed {seed}: "
          f"eval success {success:.2f} after {steps} steps ({episodes} episodes), "
          f"first >= 0.9 at {steps_to_90}, {seconds:.1f}s", flush=True)
    return {"success": success, "steps": steps, "episodes": episodes, "seconds": seconds,
            "curve": curve, "steps_to_90": steps_to_90, "buffer": buf}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bits", type=int, default=15)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--steps", type=int, default=None, help=f"env steps (default {BUDGET})")
    group.add_argument("--episodes", type=int, default=None, help="episodes of --bits steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-her", action="store_true", help="k=0: no relabelling")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--eval-every", type=int, default=50, help="episodes between evaluations")
    p.add_argument("--eval-episodes", type=int, default=100)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    if args.episodes is not None:
        budget, unit = args.episodes, "episodes"
    else:
        budget, unit = (BUDGET if args.steps is None else args.steps), "steps"
    train(args.bits, budget, args.seed, her=not args.no_her, k=args.k, unit=unit,
          eval_every=args.eval_every, eval_episodes=args.eval_episodes, quiet=args.quiet)


if __name__ == "__main__":
    main()
