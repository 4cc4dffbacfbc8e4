"""pytorchrl's data key names and the conversions at the torch/numpy boundary.

pytorchrl names the tensors of a transition with the module constants of ``pytorchrl``
(``prl.OBS == "Observation"``, ...); every value has a leading env dim ``[num_envs, ...]``
and scalars per env are ``[num_envs, 1]``. The core stores the same data under its own
names, one lane per env: this module holds the mapping, written once.

Example:
    >>> STORAGE_TENSORS[:3]
    ('Observation', 'RecurrentHiddenStates', 'Done')
    >>> CORE_NAMES[IREW]
    'irew'
    >>> [key for key, name, column in FIELDS if column]
    ['Reward', 'NextDone']
    >>> to_numpy({"a": [1.0, 2.0]})["a"].dtype.name
    'float64'
    >>> tree_map(len, {"a": [1, 2], "b": {"c": [3]}})
    {'a': 2, 'b': {'c': 1}}
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybank.host import as_numpy
from replaybank.spec import tree_map

__all__ = [
    "ACT", "ACTPROBS", "ALGORITHM", "CORE_NAMES", "DONE", "DONE2", "EPISODES", "FIELDS",
    "IREW", "OBS", "OBS2", "REW", "RHS", "RHS2", "STORAGE_TENSORS", "tensor_of", "to_numpy",
    "tree_map",
]

OBS = "Observation"
RHS = "RecurrentHiddenStates"
DONE = "Done"
ACT = "Action"
REW = "Reward"
IREW = "IntrinsicReward"
OBS2 = "NextObservation"
RHS2 = "NextRecurrentHiddenStates"
DONE2 = "NextDone"
ACTPROBS = "ActionProbs"
#: info dict sections (``prl.ALGORITHM``, ``prl.EPISODES``)
ALGORITHM = "Algorithm"
EPISODES = "Episodes"

#: The documented ``storage_tensors`` of every off-policy storage, in order.
STORAGE_TENSORS = (OBS, RHS, DONE, ACT, REW, IREW, OBS2, RHS2, DONE2, ACTPROBS)

#: Core field of each pytorchrl key stored as an extra (obs, action, reward, next_obs and
#: terminated are the core's standard fields; ``Done`` is the done flag that came with
#: the observation, i.e. the previous step ended).
CORE_NAMES = {DONE: "prev_done", IREW: "irew", ACTPROBS: "act_probs", RHS: "rhs",
              RHS2: "rhs2"}

#: The keys every transition has: ``(pytorchrl key, core field, per-env scalar)``; a
#: per-env scalar is ``[..., 1]`` in pytorchrl's data and ``[...]`` in the core's.
FIELDS = ((OBS, "obs", False), (ACT, "action", False), (REW, "reward", True),
          (OBS2, "next_obs", False), (DONE2, "terminated", True))


def to_numpy(value: Any) -> Any:
    """A torch tensor, array or nested dict of them as numpy (:func:`replaybank.host.
    as_numpy`: CPU, zero-copy when the tensor is on the CPU and needs no grad)."""
    return value if type(value) is np.ndarray else tree_map(as_numpy, value)


def tensor_of(value: Any, torch: Any, device: Any) -> Any:
    """numpy arrays (or a nested dict of them) as float32 torch tensors on ``device``,
    as pytorchrl's batches hold them."""
    if isinstance(value, dict):
        return {k: tensor_of(v, torch, device) for k, v in value.items()}
    return torch.as_tensor(value, dtype=torch.float32, device=device)
