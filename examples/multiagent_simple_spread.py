"""Fill a MultiAgentReplayBuffer from PettingZoo's simple_spread (random actions) with
``rb.collect`` and sample joint transitions, windows and a parameter-sharing stack.

Run: ``python examples/multiagent_simple_spread.py [--steps 500] [--envs 2] [--seed 0]``
(needs ``pip install pettingzoo==1.27.0 mpe2``; without them it says so and exits).
"""

from __future__ import annotations

import argparse

import numpy as np

import replaybank as rb
from replaybank.multiagent import MultiAgentReplayBuffer


def main(steps: int = 500, seed: int = 0, envs: int = 2) -> None:
    """Collect ``steps`` joint steps from ``envs`` copies of simple_spread with random
    actions and print what a learner reads."""
    try:
        from mpe2 import simple_spread_v3
    except ImportError:
        print("this example needs PettingZoo's MPE: pip install pettingzoo==1.27.0 mpe2")
        return
    # a list of parallel envs runs as vector envs: one buffer lane each, each resets alone
    env_list = [simple_spread_v3.parallel_env(max_cycles=25) for _ in range(envs)]
    env = env_list[0]
    agents = list(env.possible_agents)
    spec = {"obs": {a: (env.observation_space(a).shape, "float32") for a in agents},
            "action": {a: ((), "int64") for a in agents},
            "state": (env.state_space.shape, "float32")}
    buf = MultiAgentReplayBuffer(10_000, agents, num_envs=envs, seed=seed, spec=spec)
    # policy=None: each agent samples env.action_space(agent), seeded from seed
    res = rb.collect(env_list, None, buf, steps, progress=False, seed=seed)
    for e in env_list:
        e.close()
    print(f"{res.steps} joint steps, {len(res.episode_lengths)} episodes, mean joint return "
          f"{np.mean(res.episode_returns) if res.episode_returns else float('nan'):.2f}")
    batch = buf.sample(256)
    print(buf)
    print("obs per agent:", {a: batch.obs[a].shape for a in agents})
    print("stacked obs (parameter sharing):", batch.stacked("obs").shape)
    print("global state:", batch.state.shape, "joint reward mean:",
          float(np.mean(batch.joint_reward)))
    seq = buf.sample_sequences(8, 25, strict=False)
    print("episode windows:", seq.stacked("obs").shape, "valid steps:", int(seq.mask.sum()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="joint steps to collect")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--envs", type=int, default=2, help="parallel envs (buffer lanes)")
    args = parser.parse_args()
    main(args.steps, args.seed, args.envs)
