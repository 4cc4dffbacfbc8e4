"""Fill a MultiAgentReplayBuffer from PettingZoo's simple_spread (random actions) and
sample joint transitions, windows and a parameter-sharing stack.

Run: ``python examples/multiagent_simple_spread.py [--steps 500] [--seed 0]`` (needs
``pip install pettingzoo==1.27.0 mpe2``; without them it says so and exits).
"""

from __future__ import annotations

import argparse

import numpy as np

from replaybank.multiagent import MultiAgentReplayBuffer


def main(steps: int = 500, seed: int = 0) -> None:
    """Collect ``steps`` joint steps with random actions and print what a learner reads."""
    try:
        from mpe2 import simple_spread_v3
    except ImportError:
        print("this example needs PettingZoo's MPE: pip install pettingzoo==1.27.0 mpe2")
        return
    env = simple_spread_v3.parallel_env(max_cycles=25)
    agents = list(env.possible_agents)
    spec = {"obs": {a: (env.observation_space(a).shape, "float32") for a in agents},
            "action": {a: ((), "int64") for a in agents},
            "state": (env.state_space.shape, "float32")}
    buf = MultiAgentReplayBuffer(10_000, agents, seed=seed, spec=spec)
    obs, _ = env.reset(seed=seed)
    episode = 0
    for _ in range(steps):
        state = env.state()
        actions = {a: env.action_space(a).sample() for a in env.agents}
        nxt, rew, term, trunc, _ = env.step(actions)
        buf.add(obs=obs, action=actions, reward=rew, next_obs=nxt, terminated=term,
                truncated=trunc, state=state, next_state=env.state())
        obs = nxt
        if not env.agents:  # every agent is done: the joint episode ended
            episode += 1
            obs, _ = env.reset(seed=seed + episode)
    env.close()
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
    args = parser.parse_args()
    main(args.steps, args.seed)
