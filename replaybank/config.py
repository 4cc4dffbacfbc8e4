"""Buffers from config files: validated pydantic models and a registry of types.

``buf.config()`` returns a config model describing how to rebuild ``buf`` (its type,
capacity, lanes, spec, sampler and its parameters, view, storage); :func:`from_config`
takes such a model, a dict, or a YAML/JSON file and builds the right buffer type.
``from_config(buf.config())`` is an equivalent empty buffer.

Buffer, sampler and view types live in registries that other modules add to with
:func:`register_buffer`, :func:`register_sampler` and :func:`register_view`. The config
model of a buffer type is derived from its constructor signature (typed, validated
fields for the common arguments), so every constructor argument is reachable from a file.
The registries live in :mod:`replaybank.config_registry` and the models in
:mod:`replaybank.config_models`; this module re-exports them, validates configs, reads
config files and derives a live buffer's config.

Example:
    >>> cfg = from_config({"type": "ReplayBuffer", "capacity": 100, "num_envs": 2,
    ...                    "sampler": {"type": "uniform"}}).config()
    >>> cfg.capacity, cfg.num_envs, cfg.sampler.type
    (100, 2, 'uniform')
    >>> from_config({"type": "ReplayBuffer", "capacity": -5})
    Traceback (most recent call last):
    ...
    replaybank.errors.ConfigError: ReplayBuffer config: capacity=-5: must be a positive int
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from replaybank.config_models import (
    SIMPLE,
    BufferConfig,
    ComponentConfig,
    config_model,
    format_error,
)
from replaybank.config_registry import (
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
from replaybank.errors import ConfigError, describe, require_extra

__all__ = [
    "BufferConfig",
    "ComponentConfig",
    "ReplayBufferConfig",
    "buffer_config",
    "buffer_types",
    "config_model",
    "constructor_params",
    "from_config",
    "register_buffer",
    "register_sampler",
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
        raise ConfigError(f"type={type_name!r}: unknown buffer type; known types: "
                          f"{buffer_types()}")
    model = config_model(type_name)
    try:
        return model.model_validate({**data, "type": type_name})
    except ValidationError as exc:
        raise format_error(type_name, exc) from None


def _read_file(path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    suffix = path.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            yaml = require_extra("yaml", "yaml")
            return yaml.safe_load(text)
        if suffix == ".json":
            return json.loads(text)
    except Exception as exc:  # parser errors of either library
        raise ConfigError(f"config file {path}: cannot parse ({exc})") from exc
    raise ConfigError(f"config file {path}: unknown suffix {suffix!r}; use .yaml, .yml or "
                      ".json")


def from_config(source: Any, **overrides: Any) -> Any:
    """Build a buffer from a config model, a dict, or a YAML/JSON file.

    Args:
        source: A :class:`BufferConfig`, a dict, or a path (``str``/``Path``) to a
            ``.yaml``/``.yml``/``.json`` file. A file may hold the config at the top
            level or under a ``buffer`` key.
        **overrides: Config keys to replace (validated like the rest).

    Returns:
        A new, empty buffer of the configured type.

    Raises:
        ConfigError: Unknown type, bad or unknown keys, unreadable file.

    Example:
        >>> from_config({"capacity": 8, "n_step": 3}).config().n_step
        3
    """
    if isinstance(source, BufferConfig):
        data: Any = source.model_dump()
    elif isinstance(source, (str, os.PathLike)):
        data = _read_file(Path(source))
        if isinstance(data, dict) and "buffer" in data and isinstance(data["buffer"], dict):
            data = data["buffer"]
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


def buffer_config(buf: Any) -> BufferConfig:
    """The config that rebuilds ``buf`` empty (``buf.config()``).

    Values come from ``buf.init_config()`` when the buffer defines it; otherwise from
    its capacity, lanes, spec, sampler and view configs, the constructor arguments it
    recorded (``_init_args``), its sampler's parameters and its attributes.

    Raises:
        ConfigError: The buffer type, its sampler or its view is not registered.

    Example:
        >>> from replaybank.buffers.replay import ReplayBuffer
        >>> buffer_config(ReplayBuffer(8, n_step=3)).model_dump()["n_step"]
        3
    """
    name = type(buf).__name__
    if name not in BUFFERS or BUFFERS[name].resolve() is not type(buf):
        raise ConfigError(f"{name} is not a registered buffer type; call "
                          f"replaybank.config.register_buffer({name!r}, {name})")
    model = config_model(name)
    cand: dict[str, Any] = {}
    inner = buf if hasattr(buf, "_init_args") else getattr(buf, "buffer", None)
    if hasattr(buf, "init_config"):
        cand.update(buf.init_config())
    elif inner is not None and hasattr(inner, "_init_args"):
        cand.update(_replay_candidates(inner))
    elif callable(getattr(buf, "config", None)):
        own = buf.config()
        if isinstance(own, Mapping):
            cand.update(own)
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


def _replay_candidates(buf: Any) -> dict[str, Any]:
    """Constructor values of a ReplayBuffer (or subclass) from its state."""
    from replaybank.views import make_view

    init = dict(buf._init_args)
    cand: dict[str, Any] = {"capacity": buf.capacity, "num_envs": buf.num_envs,
                            "spec": None if buf.spec is None else buf.spec.to_json(), **init}
    sampler_cfg = buf.sampler.config()
    cand["sampler"] = sampler_cfg
    cand.update({k: v for k, v in sampler_cfg.items() if k != "type" and k not in cand})
    view_cfg = buf.view.config()
    default_view = make_view(init.get("n_step", 1), init.get("gamma", 0.99),
                             init.get("frame_stack", 1)).config()
    cand["view"] = None
    if view_cfg != default_view:  # a view passed in (or one that settled options itself)
        cand.update(view=view_cfg, n_step=1, frame_stack=1)
    if cand.get("path") is None and getattr(buf.backend, "path", None) is not None:
        cand["path"] = str(buf.backend.path)
    return cand


ReplayBufferConfig = config_model("ReplayBuffer")
