"""A drop-in front end for pytorchrl's off-policy storages.

Switch by changing one import::

    # from pytorchrl.agent.storages import PERBuffer
    from replaybank.compat.pytorchrl import PERBuffer

``ReplayBuffer``, ``NStepReplayBuffer``, ``PERBuffer``, ``EREBuffer`` and ``HERBuffer``
take pytorchrl's constructor and ``create_factory`` arguments, its transition dicts
(``insert_transition`` with ``prl.OBS``, ... keys and ``[num_envs, ...]`` values) and
yield its batch dicts; each owns a :class:`replaybank.ReplayBuffer` with the matching
sampler and view. ``docs/migration/pytorchrl.md`` lists where they differ from pytorchrl.

Example:
    >>> import torch
    >>> from types import SimpleNamespace
    >>> from replaybank.compat.pytorchrl import NStepReplayBuffer
    >>> algo = SimpleNamespace(gamma=0.5)
    >>> make = NStepReplayBuffer.create_factory(size=100, n_step=2)
    >>> buf = make("cpu", None, algo, None)
    >>> for t in range(3):
    ...     buf.insert_transition({"Observation": torch.full((1, 2), t),
    ...                            "Action": torch.zeros(1, 1), "Reward": torch.ones(1, 1),
    ...                            "NextObservation": torch.full((1, 2), t + 1),
    ...                            "Done": torch.zeros(1, 1),
    ...                            "NextDone": torch.tensor([[float(t == 2)]])})
    >>> batch = next(buf.generate_batches(num_mini_batch=1, mini_batch_size=64))
    >>> first = batch["Observation"][:, 0] == 0    # rows of step 0: 1 + 0.5 * 1
    >>> batch["Reward"][first][0].item(), batch["n_step"][first][0].item()
    (1.5, 2.0)
"""

from replaybank.compat.pytorchrl.buffers import (
    EREBuffer,
    NStepReplayBuffer,
    PERBuffer,
    ReplayBuffer,
)
from replaybank.compat.pytorchrl.her import HERBuffer
from replaybank.compat.pytorchrl.keys import STORAGE_TENSORS
from replaybank.compat.pytorchrl.storage import Storage

__all__ = [
    "STORAGE_TENSORS",
    "EREBuffer",
    "HERBuffer",
    "NStepReplayBuffer",
    "PERBuffer",
    "ReplayBuffer",
    "Storage",
]
