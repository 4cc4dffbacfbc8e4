"""replaybank: experience replay for reinforcement learning.

One composable core (lane-major ring storage that stores each observation once, samplers,
sample-time views) behind every replay scheme: uniform, n-step, prioritized, recent,
sequence, hindsight, and the on-policy rollout buffer.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=1000, seed=0)
    >>> buf.add(obs=np.zeros(4, np.float32), action=1, reward=1.0,
    ...         next_obs=np.ones(4, np.float32), terminated=False, truncated=False)
    >>> buf.sample(2).next_obs.shape
    (2, 4)
"""

from replaybank.batch import Batch, SequenceBatch
from replaybank.buffers.replay import ReplayBuffer
from replaybank.errors import (
    CapacityError,
    CheckpointError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    MissingDependencyError,
    ReplayBankError,
    ShapeError,
    SpecError,
)
from replaybank.samplers.base import LaneView, PrioritySampler, SampleResult, Sampler
from replaybank.samplers.uniform import UniformSampler
from replaybank.spec import FieldSpec, Spec
from replaybank.storage.backend import ArrayBackend, NumpyBackend
from replaybank.views.transition import TransitionView, View

__version__ = "0.1.0"

# Each section lists the public names of one part; helpers add to their own section.
_CORE = [
    "ArrayBackend",
    "Batch",
    "CapacityError",
    "CheckpointError",
    "ConfigError",
    "DtypeError",
    "EmptyBufferError",
    "FieldSpec",
    "LaneView",
    "MissingDependencyError",
    "NumpyBackend",
    "PrioritySampler",
    "ReplayBankError",
    "ReplayBuffer",
    "SampleResult",
    "Sampler",
    "SequenceBatch",
    "ShapeError",
    "Spec",
    "SpecError",
    "TransitionView",
    "UniformSampler",
    "View",
]
# --- section: prioritized / n-step / recent (issue 4) ---
_PER: list[str] = []
# --- section: sequences / lanes / frame stack (issue 5) ---
_SEQ: list[str] = []
# --- section: rollout / GAE (issue 6) ---
_ROLLOUT: list[str] = []
# --- section: io / memmap / config (issue 3) ---
_IO: list[str] = []
# --- section: torch / gymnasium (issue 7) ---
_INTEGRATIONS: list[str] = []

__all__ = sorted([*_CORE, *_PER, *_SEQ, *_ROLLOUT, *_IO, *_INTEGRATIONS])
