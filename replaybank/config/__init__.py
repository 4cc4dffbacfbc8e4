"""Buffers from config files: validated pydantic models and a registry of types.

``buf.config()`` returns a config model describing how to rebuild ``buf`` (its type,
capacity, lanes, spec, sampler and its parameters, view, storage); :func:`from_config`
takes such a model, a dict, or a YAML/JSON file and builds the right buffer type.
``from_config(buf.config())`` is an equivalent empty buffer, seeded with the int seed
``buf`` was built with (a buffer given a ``numpy.random.Generator`` records ``seed=None``),
so fed the same data it draws the same samples.

Buffer, sampler and view types live in registries that other modules add to with
:func:`register_buffer`, :func:`register_sampler` and :func:`register_view`. The config
model of a buffer type is derived from its constructor signature (typed, validated
fields for the common arguments), so every constructor argument is reachable from a file.
The registries live in :mod:`replaybank.registry` and the models in
:mod:`replaybank.config.models`; this module re-exports them, validates configs, reads
config files and derives a live buffer's config.

A sampler or view is named by its registered name (``"prioritized"``, ``"nstep"``) or by
its class name (``"PrioritizedSampler"``, ``"NStepView"``), as a buffer type is.

Example:
    >>> cfg = from_config({"type": "ReplayBuffer", "capacity": 100, "num_envs": 2,
    ...                    "sampler": {"type": "uniform"}}).config()
    >>> cfg.capacity, cfg.num_envs, cfg.sampler.type
    (100, 2, 'uniform')
    >>> per = from_config({"type": "ReplayBuffer", "capacity": 100,
    ...                    "sampler": {"type": "PrioritizedSampler", "alpha": 0.7}})
    >>> type(per.sampler).__name__, per.config().sampler.type
    ('PrioritizedSampler', 'prioritized')
    >>> from_config({"type": "ReplayBuffer", "capacity": -5})
    Traceback (most recent call last):
    ...
    replaybank.errors.ConfigError: ReplayBuffer config: capacity=-5: must be a positive int
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, overload, runtime_checkable

from pydantic import ValidationError

from replaybank.config.files import read_config_file
from replaybank.config.models import (
    SIMPLE,
    BufferConfig,
    ComponentConfig,
    config_model,
    format_error,
    unknown_buffer_type,
)
from replaybank.errors import ConfigError, describe
from replaybank.registry import (
    BUFFERS,
    SAMPLERS,
    VIEWS,
    Entry,
    buffer_types,
    constructor_params,
    register_buffer,
    register_sampler,
    register_view,
    sampler_types,
    view_types,
)
from replaybank.views.named_functions import register_function

if TYPE_CHECKING:  # for annotations only: the config layer imports no buffer when it runs
    from typing import TypeAlias

    from replaybank.buffers.replay import ReplayBuffer
    from replaybank.buffers.rollout.buffer import RolloutBuffer
    from replaybank.compat.sequence import SequenceReplayBuffer
    from replaybank.compat.trajectory import PathBuffer
    from replaybank.multiagent.buffer import MultiAgentReplayBuffer
    from replaybank.multiagent.rollout import MultiAgentRolloutBuffer

    #: What :func:`from_config`, :func:`replaybank.load` and :func:`replaybank.open`
    #: return, for a type checker: one of the package's registered buffer types
    #: (``PrioritizedReplayBuffer`` and ``HerReplayBuffer`` are ``ReplayBuffer``
    #: subclasses). A rebuilt ``ReplayBuffer`` (``RolloutBuffer``) is ``ReplayBuffer[Any]``
    #: (``RolloutBuffer[Any]``): its config may name torch storage (a device), whose
    #: batches hold tensors.
    AnyBuffer: TypeAlias = (ReplayBuffer[Any] | SequenceReplayBuffer | RolloutBuffer[Any]
                            | PathBuffer | MultiAgentReplayBuffer | MultiAgentRolloutBuffer)

__all__ = [
    "BufferConfig",
    "ComponentConfig",
    "Configurable",
    "ReplayBufferConfig",
    "buffer_config",
    "buffer_types",
    "config_model",
    "constructor_params",
    "from_config",
    "register_buffer",
    "register_sampler",
    "register_function",
    "register_view",
    "sampler_types",
    "view_types",
]
# the names these had when they lived here (replaybank.config._BUFFERS, ...)
_BUFFERS, _SAMPLERS, _VIEWS, _Entry = BUFFERS, SAMPLERS, VIEWS, Entry


def validate_config(data: Mapping[str, Any]) -> BufferConfig:
    """Validate a config dict (``type`` defaults to ``"ReplayBuffer"``).

    Raises:
        ConfigError: Names the bad key, its value and what is allowed.

    Example:
        >>> validate_config({"capacity": 10, "num_envs": 2}).num_envs
        2
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"config={describe(data)}: expected a mapping of buffer arguments")
    type_name = data.get("type", "ReplayBuffer")
    if not isinstance(type_name, str) or type_name not in BUFFERS:
        raise unknown_buffer_type(type_name)
    model = config_model(type_name)
    try:
        return model.model_validate({**data, "type": type_name})
    except ValidationError as exc:
        raise format_error(type_name, exc) from None


@overload
def from_config(source: BufferConfig | str | os.PathLike[str], **overrides: Any) -> AnyBuffer:
    ...


@overload
def from_config(source: Mapping[str, Any], **overrides: Any) -> Any:
    ...


def from_config(source: Any, **overrides: Any) -> Any:
    """Build a buffer from a config model, a dict, or a YAML/JSON file.

    Args:
        source: A :class:`BufferConfig`, a dict, or a path (``str``/``Path``) to a
            ``.yaml``/``.yml``/``.json`` file. A file may hold the config at the top
            level or under a ``buffer`` key (:func:`~replaybank.config.files.
            read_config_file`: a key given twice is refused).
        **overrides: Config keys to replace (validated like the rest).

    Returns:
        A new, empty buffer of the configured type. From a config model or a file, a type
        checker sees ``AnyBuffer``, the union of the package's buffer types
        (``ReplayBuffer | SequenceReplayBuffer | RolloutBuffer | PathBuffer |
        MultiAgentReplayBuffer | MultiAgentRolloutBuffer``): narrow it
        with ``isinstance(buf, rb.ReplayBuffer)``; a buffer type of your own, registered
        with :func:`register_buffer`, is returned as what it is. From a dict (a config
        passed around as data) it sees ``Any``.

    Raises:
        ConfigError: Unknown type, bad or unknown keys; a file that is missing, a
            directory, unreadable, not UTF-8, unparsable, or gives a key twice.

    Example:
        >>> from_config({"capacity": 8, "n_step": 3}).config().n_step
        3
    """
    if isinstance(source, BufferConfig):
        data: Any = source.model_dump()
    elif isinstance(source, (str, os.PathLike)):
        data = read_config_file(Path(source))
    else:
        data = source
    if not isinstance(data, Mapping):
        raise ConfigError(f"config={describe(data)}: expected a mapping of buffer arguments")
    passthrough = {k: v for k, v in overrides.items() if k == "storage" and not isinstance(
        v, str)}
    data = {**data, **{k: v for k, v in overrides.items() if k not in passthrough}}
    if overrides.get("storage") in ("numpy", "torch") and "path" not in overrides:
        data["path"] = None  # moving a memmap buffer's config into memory
    cfg = validate_config(data)
    try:
        return cfg.build(**passthrough)
    except ImportError as exc:
        raise ConfigError(f"type={cfg.type!r}: cannot import it ({exc})") from exc


@runtime_checkable
class Configurable(Protocol):
    """A buffer that can say how to rebuild itself: its constructor values."""

    def init_config(self) -> dict[str, Any]:
        """JSON-able constructor arguments that rebuild the buffer empty."""
        ...


def buffer_config(buf: Any) -> BufferConfig:
    """The config that rebuilds ``buf`` empty (``buf.config()``).

    Values come from ``buf.init_config()`` (:class:`Configurable`), validated by the config
    model of the buffer's registered type.

    Raises:
        ConfigError: The buffer type, its sampler or its view is not registered, or it
            cannot describe itself.

    Example:
        >>> from replaybank.buffers.replay import ReplayBuffer
        >>> buffer_config(ReplayBuffer(8, n_step=3)).model_dump()["n_step"]
        3
    """
    name = type(buf).__name__
    if name not in BUFFERS or BUFFERS[name].resolve() is not type(buf):
        raise ConfigError(f"{name} is not a registered buffer type; call "
                          f"replaybank.config.register_buffer({name!r}, {name})")
    if not isinstance(buf, Configurable):
        raise ConfigError(f"{name} has no init_config(); a registered buffer type says how "
                          "to rebuild itself with init_config() -> dict of constructor values")
    model = config_model(name)
    cand = buf.init_config()
    # arguments a subclass adds (e.g. ``tag``) and its init_config() does not list are
    # read from the attribute of the same name (the convention of sklearn's get_params)
    for field in model.model_fields:
        if field not in cand:
            for attr in (field, f"_{field}"):
                v = getattr(buf, attr, None)
                if isinstance(v, (*SIMPLE, type(None), list, dict)):
                    cand[field] = v
                    break
    values = {k: v for k, v in cand.items() if k in model.model_fields}
    try:
        return model.model_validate({**values, "type": name})
    except ValidationError as exc:
        raise format_error(name, exc) from None


if TYPE_CHECKING:

    class ReplayBufferConfig(BufferConfig):
        """What a type checker knows of ``config_model("ReplayBuffer")``: a
        :class:`BufferConfig` whose fields are ``ReplayBuffer``'s constructor arguments."""

        def __init__(self, **data: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

else:

    def __getattr__(name: str) -> Any:
        # the model is derived from ReplayBuffer's signature: built on first use, so that
        # importing the config package imports no buffer
        if name == "ReplayBufferConfig":
            return config_model("ReplayBuffer")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
