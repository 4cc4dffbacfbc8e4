"""Small environments for examples and tests (needs the ``gym`` extra: gymnasium).

The package root does not import this module; import it to register the envs with
gymnasium:

* ``"replaybank/BitFlipping-v0"``: :class:`BitFlipping`, the goal-conditioned bit-flipping
  task of the HER paper (kwargs ``n_bits``, ``max_steps``, ``render_mode``).

Example:
    >>> import gymnasium as gym
    >>> import replaybank.envs
    >>> env = gym.make("replaybank/BitFlipping-v0", n_bits=5)
    >>> obs, info = env.reset(seed=0)
    >>> obs["desired_goal"].shape, env.unwrapped.max_steps
    ((5,), 5)
"""

from __future__ import annotations

import gymnasium

from replaybank.envs.bit_flipping import (
    BitFlipping,
    compute_reward,
    compute_terminated,
    compute_truncated,
)

__all__ = ["BIT_FLIPPING_ID", "BitFlipping", "compute_reward", "compute_terminated",
           "compute_truncated"]

BIT_FLIPPING_ID = "replaybank/BitFlipping-v0"

if BIT_FLIPPING_ID not in gymnasium.registry:
    gymnasium.register(id=BIT_FLIPPING_ID,
                       entry_point="replaybank.envs.bit_flipping:BitFlipping")
