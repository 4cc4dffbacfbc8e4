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

import typing

from replaybank import registry as _registry
from replaybank.batch import Batch, SequenceBatch
from replaybank.buffers.autoreset import AutoresetWarning
from replaybank.buffers.hindsight import HerReplayBuffer
from replaybank.buffers.replay import ReplayBuffer
from replaybank.buffers.rollout.buffer import RolloutBuffer
from replaybank.buffers.store import Store
from replaybank.compat.prioritized import PrioritizedReplayBuffer
from replaybank.compat.sequence import SequenceReplayBuffer
from replaybank.compat.trajectory import PathBuffer
from replaybank.device.backend import TorchBackend, torch_backend
from replaybank.device.hindsight import device_relabel, to_device
from replaybank.device.prefetch import Prefetcher
from replaybank.device.store import DeviceStore, device_store
from replaybank.errors import (
    ArgumentError,
    BufferChangedError,
    CapacityError,
    CheckpointError,
    ConcurrentCallError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    MissingDependencyError,
    ReplayBankError,
    ShapeError,
    SpecError,
)
from replaybank.multiagent import (
    MultiAgentBatch,
    MultiAgentEpisodeBatch,
    MultiAgentReplayBuffer,
    MultiAgentRolloutBatch,
    MultiAgentRolloutBuffer,
    MultiAgentSequenceBatch,
)
from replaybank.ops.gae import discount_cumsum, gae
from replaybank.persist import ResumeWarning, load, load_into, open, save
from replaybank.samplers.base import (
    BatchWeights,
    BoundedPriorities,
    CountedDraws,
    DrawableSlots,
    IndependentDraws,
    InnerSchedule,
    KeyUpdates,
    LaneView,
    PrioritySampler,
    RestrictedDraws,
    Sampler,
    SampleResult,
    ScheduledSampler,
    SlotExcluding,
    StatelessSampler,
    SubsetDraws,
    UniformDraws,
)
from replaybank.samplers.lane_split import LaneSplitSampler
from replaybank.samplers.prioritized import PrioritizedSampler
from replaybank.samplers.recent import RecentSampler
from replaybank.samplers.uniform import UniformSampler
from replaybank.shared.backend import SharedBackend, shared_backend
from replaybank.shared.reader import WritersOutranError
from replaybank.shared.store import SharedStore, shared_store
from replaybank.shared.writer import SharedWriter, SharedWriterHandle
from replaybank.spec import FieldSpec, Spec
from replaybank.storage.backends.base import (
    ArrayBackend,
    DurableBackend,
    GroupedBackend,
    MetaAddingBackend,
    SharedArrayBackend,
)
from replaybank.storage.backends.memmap import MemmapBackend
from replaybank.storage.backends.numpy import NumpyBackend
from replaybank.views.base import (
    CallbackView,
    FieldsCheckedView,
    FusedView,
    InputTransform,
    LaneInputTransform,
    LaneSpanView,
    ShiftedView,
    SpecTransform,
    StatelessView,
    StepView,
    View,
)
from replaybank.views.framestack import FrameStackView
from replaybank.views.hindsight import HerView
from replaybank.views.named_functions import register_function
from replaybank.views.nstep import NStepView
from replaybank.views.transition import TransitionView

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "ArrayBackend",
    "AutoresetWarning",
    "Batch",
    "BatchWeights",
    "BoundedPriorities",
    "BufferChangedError",
    "BufferConfig",
    "CallbackView",
    "CapacityError",
    "CheckpointError",
    "CollectResult",
    "Collector",
    "ComponentConfig",
    "ConcurrentCallError",
    "ConfigError",
    "CountedDraws",
    "DeviceStore",
    "DrawableSlots",
    "DtypeError",
    "DurableBackend",
    "EmptyBufferError",
    "FieldSpec",
    "FieldsCheckedView",
    "FrameStackView",
    "FusedView",
    "GroupedBackend",
    "HerReplayBuffer",
    "HerView",
    "IndependentDraws",
    "InnerSchedule",
    "InputTransform",
    "KeyUpdates",
    "LaneInputTransform",
    "LaneSpanView",
    "LaneSplitSampler",
    "LaneView",
    "MemmapBackend",
    "MetaAddingBackend",
    "MissingDependencyError",
    "MultiAgentBatch",
    "MultiAgentCollectResult",
    "MultiAgentCollector",
    "MultiAgentEpisodeBatch",
    "MultiAgentReplayBuffer",
    "MultiAgentRolloutBatch",
    "MultiAgentRolloutBuffer",
    "MultiAgentRolloutCollector",
    "MultiAgentSequenceBatch",
    "NStepView",
    "NumpyBackend",
    "PathBuffer",
    "PinnedStager",
    "Prefetcher",
    "PrioritizedReplayBuffer",
    "PrioritizedSampler",
    "PrioritySampler",
    "RecentSampler",
    "ReplayBankError",
    "ReplayBuffer",
    "ReplayBufferConfig",
    "RestrictedDraws",
    "ResumeWarning",
    "RolloutBuffer",
    "SampleResult",
    "Sampler",
    "ScheduledSampler",
    "SequenceBatch",
    "SequenceReplayBuffer",
    "ShapeError",
    "SharedArrayBackend",
    "SharedBackend",
    "SharedStore",
    "SharedWriter",
    "SharedWriterHandle",
    "ShiftedView",
    "SlotExcluding",
    "Spec",
    "SpecError",
    "SpecTransform",
    "StatelessSampler",
    "StatelessView",
    "StepView",
    "Store",
    "SubsetDraws",
    "TorchBackend",
    "TransitionView",
    "UniformDraws",
    "UniformSampler",
    "View",
    "WritersOutranError",
    "collect",
    "config_model",
    "discount_cumsum",
    "distributed",
    "from_config",
    "from_minari",
    "gae",
    "load",
    "load_into",
    "open",
    "open_buffer",
    "register_buffer",
    "register_function",
    "register_sampler",
    "register_view",
    "save",
    "spec_from_env",
    "spec_from_spaces",
    "to_minari",
    "warm",
]

# the built-in types that configs name (their "type"), registered here, where every layer
# is imported, rather than named as import strings in the registry below every layer
_registry.register_buffer("ReplayBuffer", ReplayBuffer)
_registry.register_buffer("RolloutBuffer", RolloutBuffer)
_registry.register_buffer("PathBuffer", PathBuffer)
_registry.register_buffer("SequenceReplayBuffer", SequenceReplayBuffer, kwargs_to=ReplayBuffer)
_registry.register_buffer("HerReplayBuffer", HerReplayBuffer)
_registry.register_buffer("MultiAgentReplayBuffer", MultiAgentReplayBuffer,
                          kwargs_to=ReplayBuffer, exclude=("next_obs",))
_registry.register_buffer("MultiAgentRolloutBuffer", MultiAgentRolloutBuffer)
_registry.register_buffer("PrioritizedReplayBuffer", PrioritizedReplayBuffer,
                          exclude=("sampler",))
for _name, _sampler in (("uniform", UniformSampler), ("prioritized", PrioritizedSampler),
                        ("recent", RecentSampler), ("lane_split", LaneSplitSampler)):
    _registry.register_sampler(_name, _sampler)
for _name, _view in (("transition", TransitionView), ("nstep", NStepView),
                     ("framestack", FrameStackView), ("her", HerView)):
    _registry.register_view(_name, _view)
del _name, _sampler, _view
# the storages and features of the rooms above the core (which imports neither room)
_registry.register_storage("torch", torch_backend, device_store)
_registry.register_storage("shared", shared_backend, shared_store)
_registry.register_feature("prefetcher", Prefetcher)
_registry.register_feature("her_device_relabel", device_relabel)
_registry.register_feature("to_device", to_device)
del torch_backend, device_store, shared_backend, shared_store, device_relabel, to_device

# torch and gymnasium stay optional: these names import their module on first access (the
# ``__getattr__`` below); a type checker reads their real types from the block after it
_LAZY = {
    "CollectResult": "replaybank.integrations.gymnasium",
    "Collector": "replaybank.integrations.gymnasium",
    "MultiAgentCollectResult": "replaybank.integrations.pettingzoo",
    "MultiAgentCollector": "replaybank.integrations.pettingzoo",
    "MultiAgentRolloutCollector": "replaybank.integrations.pettingzoo",
    "collect": "replaybank.integrations.gymnasium",
    "warm": "replaybank.integrations.gymnasium",
    "from_minari": "replaybank.integrations.minari",
    "to_minari": "replaybank.integrations.minari",
    "spec_from_env": "replaybank.integrations.spaces",
    "spec_from_spaces": "replaybank.integrations.spaces",
    "PinnedStager": "replaybank.integrations.torch",
    "BufferConfig": "replaybank.config",
    "ComponentConfig": "replaybank.config",
    "ReplayBufferConfig": "replaybank.config",
    "config_model": "replaybank.config",
    "from_config": "replaybank.config",
    "register_buffer": "replaybank.config",
    "register_sampler": "replaybank.config",
    "register_view": "replaybank.config",
}
#: Subpackages imported on first access (ray is imported when a service starts).
_LAZY_MODULES = {"distributed": "replaybank.distributed"}

if typing.TYPE_CHECKING:  # the same names as _LAZY, from the same modules (tests/test_day_one.py)
    from replaybank import distributed
    from replaybank.config import (
        BufferConfig,
        ComponentConfig,
        ReplayBufferConfig,
        config_model,
        from_config,
        register_buffer,
        register_sampler,
        register_view,
    )
    from replaybank.integrations.gymnasium import Collector, CollectResult, collect, warm
    from replaybank.integrations.minari import from_minari, to_minari
    from replaybank.integrations.pettingzoo import (
        MultiAgentCollector,
        MultiAgentCollectResult,
        MultiAgentRolloutCollector,
    )
    from replaybank.integrations.spaces import spec_from_env, spec_from_spaces
    from replaybank.integrations.torch import PinnedStager
else:  # hidden from type checkers, so that a misspelt name is an error there

    def __getattr__(name: str) -> object:
        import importlib

        if name in _LAZY_MODULES:
            value = importlib.import_module(_LAZY_MODULES[name])
            globals()[name] = value
            return value
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'replaybank' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value


#: The name ``rb.open`` had before :mod:`replaybank.persist` (kept for old code).
open_buffer = open
