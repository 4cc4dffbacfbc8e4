"""Multi-agent replay: joint steps of PettingZoo-style agents in one core buffer.

* :class:`MultiAgentReplayBuffer` (:mod:`.buffer`): ``add`` one joint step of every env,
  ``sample`` joint transitions (per-agent n-step returns: :mod:`.nstep`),
  ``sample_sequences`` joint windows, ``sample_episodes`` whole padded episodes
  (:mod:`.padded`);
* :class:`MultiAgentBatch`, :class:`MultiAgentSequenceBatch`,
  :class:`MultiAgentEpisodeBatch` (:mod:`.batch`): per-agent views of a core batch, with
  ``stacked`` for parameter sharing;
* :mod:`.layout` (the core fields), :mod:`.episodes` (joint episode rules),
  :mod:`.inputs` (checking an ``add``).

This room sits above :mod:`replaybank.buffers` and imports nothing above it.

Example:
    >>> import numpy as np
    >>> from replaybank.multiagent import MultiAgentReplayBuffer
    >>> buf = MultiAgentReplayBuffer(10, agents=["x", "y"], seed=0)
    >>> buf.add(obs={"x": np.zeros(2), "y": np.zeros(4)}, action={"x": 1, "y": 0},
    ...         reward={"x": 1.0, "y": 2.0}, next_obs={"x": np.ones(2), "y": np.ones(4)},
    ...         terminated={"x": True, "y": False}, truncated={"x": False, "y": True})
    >>> b = buf.sample(1)
    >>> b.joint_reward.tolist(), b.obs["y"].shape, b.joint_truncated.tolist()
    ([3.0], (1, 4), [True])

    Every agent ended (x terminated, y was cut off), so the joint episode ended,
    truncated: one agent's time limit keeps the joint value bootstrapping.
"""

from replaybank.multiagent.batch import (
    MultiAgentBatch,
    MultiAgentEpisodeBatch,
    MultiAgentSequenceBatch,
)
from replaybank.multiagent.buffer import MultiAgentReplayBuffer
from replaybank.multiagent.rollout import MultiAgentRolloutBuffer
from replaybank.multiagent.rollout_batch import MultiAgentRolloutBatch

__all__ = ["MultiAgentBatch", "MultiAgentEpisodeBatch", "MultiAgentReplayBuffer",
           "MultiAgentSequenceBatch"]
__all__ += ["MultiAgentRolloutBatch", "MultiAgentRolloutBuffer"]
