"""Stable-Baselines3's SAC with replaybank's prioritized replay on Pendulum-v1.

SB3 has no prioritized replay. :class:`~replaybank.integrations.sb3.PrioritizedSAC` is
SB3's SAC whose critic loss is weighted by the batch's importance weights and which feeds
``max(|Q1 - y|, |Q2 - y|)`` back as the sampled transitions' priorities; give it a
prioritized replaybank buffer::

    from replaybank.integrations.sb3 import PrioritizedSAC, ReplayBuffer

    model = PrioritizedSAC("MlpPolicy", "Pendulum-v1", replay_buffer_class=ReplayBuffer,
                           replay_buffer_kwargs={"prioritized": True, "beta_steps": 10_000})

(:class:`~replaybank.integrations.sb3.PrioritizedTD3` does the same for TD3.)

This script trains SAC with SB3's own buffer ("sb3") and PrioritizedSAC with the
replaybank PER buffer ("per") under the same hyperparameters (RL Zoo's Pendulum-v1 SAC:
``learning_rate=1e-3``, otherwise SB3's defaults), then reports the mean return of 10
deterministic evaluation episodes.

Measured once (``python examples/sb3_per_sac.py --seeds 0 1 2``; 10,000 env steps;
SB3 2.9.2, torch CPU, 1 torch thread):

=====  ==================  ===============================
seed   SAC, SB3's buffer   PrioritizedSAC, replaybank PER
=====  ==================  ===============================
0      -121.9              -123.1
1      -186.1              -185.2
2      -118.1              -118.2
mean   -142.0              -142.2
=====  ==================  ===============================

The same within noise (per-seed gaps of 0.1 to 1.2 against a seed-to-seed spread of ~70;
a random policy scores about -1200): PER neither helps nor hurts SAC on Pendulum, which
every uniform-replay run already solves in 10k steps. The point here is that PER for SAC
runs correctly through SB3's training loop (tests/test_sb3.py checks the weighted loss,
the n-step discounts and the fed-back priorities by hand).

Run: ``python examples/sb3_per_sac.py [--steps 10000] [--seeds 0 1 2]``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import gymnasium as gym
import torch
from stable_baselines3 import SAC
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor

from replaybank.integrations.sb3 import PrioritizedSAC, ReplayBuffer

BUFFERS = ("sb3", "per")
# RL Zoo's hyperparameters for SAC on Pendulum-v1 (the same for both buffers)
SAC_KWARGS: dict[str, Any] = {"learning_rate": 1e-3}
# PER: SB3's priority exponent and initial beta of Schaul et al.; beta anneals to 1
PER_KWARGS: dict[str, Any] = {"prioritized": True, "alpha": 0.6, "beta": 0.4}


def sac_return(buffer: str, seed: int, steps: int, eval_episodes: int = 10,
               net_arch: list[int] | None = None, learning_starts: int = 100) -> float:
    """Train on Pendulum-v1 for ``steps`` env steps; the mean deterministic eval return.

    Args:
        buffer: ``"sb3"`` (SAC, SB3's ReplayBuffer) or ``"per"`` (PrioritizedSAC, the
            replaybank prioritized buffer, beta annealed to 1 over the run's gradient
            steps).
        seed: Seed of the model and the envs.
        steps: Env steps.
        eval_episodes: Deterministic episodes of the final evaluation.
        net_arch: Hidden layers of actor and critics (None: SB3's default [256, 256]).
        learning_starts: Random steps before training.

    Returns:
        The mean return of the evaluation episodes.

    Raises:
        ValueError: ``buffer`` is not one of :data:`BUFFERS`.
    """
    if buffer not in BUFFERS:
        raise ValueError(f"sac_return(buffer={buffer!r}): use one of {BUFFERS}")
    env = Monitor(gym.make("Pendulum-v1"))
    kwargs: dict[str, Any] = {**SAC_KWARGS, "learning_starts": learning_starts}
    if net_arch is not None:
        kwargs["policy_kwargs"] = {"net_arch": net_arch}
    if buffer == "sb3":
        model: SAC = SAC("MlpPolicy", env, seed=seed, **kwargs)
    else:
        per = {**PER_KWARGS, "beta_steps": max(steps - learning_starts, 1)}
        model = PrioritizedSAC("MlpPolicy", env, seed=seed, replay_buffer_class=ReplayBuffer,
                               replay_buffer_kwargs=per, **kwargs)
    model.learn(total_timesteps=steps)
    eval_env = Monitor(gym.make("Pendulum-v1"))
    eval_env.reset(seed=seed + 10_000)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=eval_episodes,
                              deterministic=True)
    return float(mean)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10_000, help="env steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--buffers", nargs="+", default=list(BUFFERS), choices=BUFFERS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for seed in args.seeds:
        for buffer in args.buffers:
            ret = sac_return(buffer, seed, args.steps)
            print(json.dumps({"task": "sac_pendulum", "buffer": buffer, "seed": seed,
                              "steps": args.steps, "eval_return": round(ret, 1)}), flush=True)


if __name__ == "__main__":
    main()
