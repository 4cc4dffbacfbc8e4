"""Buffers from config files: validated pydantic models and a registry of types.

``buf.config()`` returns a config model describing how to rebuild ``buf`` (its type,
capacity, lanes, spec, sampler and its parameters, view, storage); :func:`from_config`
takes such a model, a dict, or a YAML/JSON file and builds the right buffer type.
``from_config(buf.config())`` is an equivalent empty buffer.

Buffer, sampler and view types live in registries that other modules add to with
:func:`register_buffer`, :func:`register_sampler` and :func:`register_view`. The config
model of a buffer type is derived from its constructor signature (typed, validated
fields for the common arguments), so every constructor argument is reachable from a file.

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

import importlib
import inspect
import json
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    create_model,
    model_validator,
)

from replaybank.errors import ConfigError, ReplayBankError, describe, require_extra

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


# ---------------------------------------------------------------------- registries
@dataclass(frozen=True)
class _Entry:
    target: Any  # a class, or "module:attr" imported on first use
    exclude: tuple[str, ...] = ()
    kwargs_to: Any = None  # where the class's **kwargs go (default: its base class)

    def resolve(self) -> Any:
        if not isinstance(self.target, str):
            return self.target
        mod, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(mod), attr)


_BUFFERS: dict[str, _Entry] = {}
_SAMPLERS: dict[str, _Entry] = {}
_VIEWS: dict[str, _Entry] = {}


def register_buffer(name: str, target: Any, exclude: tuple[str, ...] = (),
                    kwargs_to: Any = None) -> None:
    """Make a buffer type buildable from configs.

    Args:
        name: The ``type`` value in configs (the class name by convention).
        target: The class, or ``"module:ClassName"`` (imported on first use).
        exclude: Constructor arguments its ``**kwargs`` does not accept (e.g. ``sampler``
            for a buffer that builds its own).
        kwargs_to: The class (or import path) its ``**kwargs`` are passed to, when that
            is not its base class (a front end that wraps a ReplayBuffer).

    Example:
        >>> register_buffer("ReplayBuffer", "replaybank.buffers.replay:ReplayBuffer")
        >>> "ReplayBuffer" in buffer_types()
        True
    """
    _BUFFERS[name] = _Entry(target, tuple(exclude), kwargs_to)
    if "config_model" in globals():
        config_model.cache_clear()


def register_sampler(name: str, target: Any) -> None:
    """Register a sampler type (its ``config()["type"]``) and its class or import path.

    Example:
        >>> register_sampler("uniform", "replaybank.samplers.uniform:UniformSampler")
        >>> "uniform" in sampler_types()
        True
    """
    _SAMPLERS[name] = _Entry(target)


def register_view(name: str, target: Any) -> None:
    """Register a view type (its ``config()["type"]``) and its class or import path.

    Example:
        >>> register_view("nstep", "replaybank.views.nstep:NStepView")
        >>> "nstep" in view_types()
        True
    """
    _VIEWS[name] = _Entry(target)


def buffer_types() -> list[str]:
    """Registered buffer type names."""
    return sorted(_BUFFERS)


def sampler_types() -> list[str]:
    """Registered sampler type names."""
    return sorted(_SAMPLERS)


def view_types() -> list[str]:
    """Registered view type names."""
    return sorted(_VIEWS)


_REPLAY = "replaybank.buffers.replay:ReplayBuffer"
for _n, _t in (("ReplayBuffer", _REPLAY),
               ("RolloutBuffer", "replaybank.buffers.rollout:RolloutBuffer"),
               ("PathBuffer", "replaybank.buffers.paths:PathBuffer")):
    register_buffer(_n, _t)
register_buffer("SequenceReplayBuffer",
                "replaybank.buffers.sequence_buffer:SequenceReplayBuffer", kwargs_to=_REPLAY)
register_buffer("PrioritizedReplayBuffer",
                "replaybank.buffers.prioritized:PrioritizedReplayBuffer", exclude=("sampler",))
for _n, _t in (("uniform", "replaybank.samplers.uniform:UniformSampler"),
               ("prioritized", "replaybank.samplers.prioritized:PrioritizedSampler"),
               ("recent", "replaybank.samplers.recent:RecentSampler"),
               ("lane_split", "replaybank.samplers.lane_split:LaneSplitSampler")):
    register_sampler(_n, _t)
for _n, _t in (("transition", "replaybank.views.transition:TransitionView"),
               ("nstep", "replaybank.views.nstep:NStepView"),
               ("framestack", "replaybank.views.framestack:FrameStackView")):
    register_view(_n, _t)


# ---------------------------------------------------------------------- field types
def _positive(name: str, minimum: int = 1) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError("must be a positive int" if minimum == 1 else
                             f"must be an int >= {minimum}")
        return v
    return check


def _pos_int(name: str) -> Any:
    return Annotated[int, BeforeValidator(_positive(name))]


def _gamma(v: float) -> float:
    if not 0.0 <= v <= 1.0:
        raise ValueError("must be a float in [0, 1]")
    return v


def _spec(v: Any) -> Any:
    if v is None:
        return None
    from replaybank.spec import Spec

    try:
        return Spec.coerce(v).to_json()
    except (ReplayBankError, TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"not a valid spec ({exc}); use {{name: {{shape: [...], dtype: "
                         "...}}}") from exc


def _seed(v: Any) -> Any:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise ValueError("must be a non-negative int or null")
    return v


def _storage(v: Any) -> Any:
    from replaybank.storage import STORAGES

    if v not in STORAGES:
        raise ValueError(f"unknown storage; choose one of {list(STORAGES)}")
    return v


class ComponentConfig(BaseModel):
    """A sampler or view: ``type`` plus its constructor arguments (checked on build)."""

    model_config = ConfigDict(extra="allow")
    type: str

    def params(self) -> dict[str, Any]:
        """Constructor arguments (everything but ``type``)."""
        return {k: v for k, v in self.model_dump().items() if k != "type"}


_COMMON: dict[str, Any] = {
    "capacity": _pos_int("capacity"),
    "num_envs": _pos_int("num_envs"),
    "seed": Annotated[Any, AfterValidator(_seed)],
    "spec": Annotated[Any, BeforeValidator(_spec)],
    "sampler": ComponentConfig | None,
    "view": ComponentConfig | None,
    "n_step": _pos_int("n_step"),
    "gamma": Annotated[float, AfterValidator(_gamma)],
    "frame_stack": _pos_int("frame_stack"),
    "storage": Annotated[str, AfterValidator(_storage)],
    "path": str | None,
    "device": str | None,
}
_SIMPLE = (int, float, bool, str)


def _derived_type(annotation: Any) -> Any:
    """A pydantic type for a constructor annotation: simple types kept, others Any."""
    if annotation in _SIMPLE:
        return annotation
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and args and \
            all(a in (*_SIMPLE, type(None)) for a in args):
        return annotation
    return Any


def _check_component(kind: str, value: Any, registry: dict[str, _Entry], loc: str) -> None:
    if value is None:
        return
    data = value.model_dump() if isinstance(value, BaseModel) else value
    if data["type"] not in registry:
        raise ValueError(f"{loc}.type={data['type']!r}: unknown {kind} type; known types: "
                         f"{sorted(registry)}")
    try:
        cls = registry[data["type"]].resolve()
    except ImportError as exc:
        raise ValueError(f"{loc}.type={data['type']!r}: cannot import it ({exc})") from exc
    params = inspect.signature(cls).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(data) - {"type"} - set(params))
        if unknown:
            raise ValueError(f"{loc}: unknown {kind} argument(s) {unknown} for "
                             f"{data['type']!r}; allowed: {sorted(params)}")
    for key, sub in data.items():
        if isinstance(sub, dict) and "type" in sub:
            _check_component(kind, sub, registry, f"{loc}.{key}")


class BufferConfig(BaseModel):
    """Base of every buffer config model (one per registered type, see
    :func:`config_model`). Unknown keys are rejected."""

    model_config = ConfigDict(extra="forbid")
    type: str

    @model_validator(mode="after")
    def _components(self) -> BufferConfig:
        _check_component("sampler", getattr(self, "sampler", None), _SAMPLERS, "sampler")
        _check_component("view", getattr(self, "view", None), _VIEWS, "view")
        if getattr(self, "storage", None) == "memmap" and getattr(self, "path", None) is None:
            raise ValueError('storage="memmap" needs path: a directory for the array files')
        return self

    def build(self, **overrides: Any) -> Any:
        """Construct the buffer this config describes.

        Args:
            **overrides: Constructor arguments to pass instead (e.g. a ready backend
                object as ``storage``).
        """
        cls = _BUFFERS[self.type].resolve()
        kwargs: dict[str, Any] = {}
        for name in type(self).model_fields:
            if name == "type":
                continue
            value = getattr(self, name)
            if name in ("sampler", "view") and isinstance(value, ComponentConfig):
                reg = _SAMPLERS if name == "sampler" else _VIEWS
                value = _build_component(value.model_dump(), reg, name)
            elif name in ("sampler", "view") and value is None:
                continue
            kwargs[name] = value
        kwargs.update(overrides)
        return cls(**kwargs)


def _build_component(data: dict[str, Any], registry: dict[str, _Entry], loc: str) -> Any:
    cls = registry[data["type"]].resolve()
    kwargs = {k: _build_component(v, registry, f"{loc}.{k}")
              if isinstance(v, dict) and "type" in v else v
              for k, v in data.items() if k != "type"}
    return cls(**kwargs)


def constructor_params(type_name: str) -> dict[str, inspect.Parameter]:
    """Every constructor argument of a registered buffer type, following ``**kwargs``
    to the base class (or the registered ``kwargs_to`` class), minus ``exclude``.

    Example:
        >>> "alpha" in constructor_params("PrioritizedReplayBuffer")
        True
    """
    entry = _BUFFERS[type_name]
    chain = [entry.resolve()]
    if entry.kwargs_to is not None:
        chain.append(_Entry(entry.kwargs_to).resolve())
    else:
        chain.extend(chain[0].__mro__[1:])
    return _signature_params(chain, entry.exclude)


def _signature_params(chain: list[type], exclude: tuple[str, ...]
                      ) -> dict[str, inspect.Parameter]:
    out: dict[str, inspect.Parameter] = {}
    for klass in chain:
        if "__init__" not in vars(klass) or klass is object:
            continue
        sig = inspect.signature(klass.__init__, eval_str=True)  # type: ignore[misc]
        more = False
        for name, p in list(sig.parameters.items())[1:]:
            if p.kind is p.VAR_KEYWORD:
                more = True
            elif p.kind is not p.VAR_POSITIONAL and name not in out and name not in exclude:
                out[name] = p
        if not more:
            break
    return out


@cache
def config_model(type_name: str) -> type[BufferConfig]:
    """The pydantic config model of a registered buffer type.

    Fields are the constructor's arguments (through ``**kwargs`` to the base class),
    typed and validated for the common ones, plus ``type``.

    Raises:
        ConfigError: Unknown type (the message lists the known ones).

    Example:
        >>> sorted(config_model("ReplayBuffer").model_fields)[:3]
        ['capacity', 'device', 'frame_stack']
    """
    if type_name not in _BUFFERS:
        raise ConfigError(f"type={type_name!r}: unknown buffer type; known types: "
                          f"{buffer_types()}")
    cls = _BUFFERS[type_name].resolve()
    fields: dict[str, Any] = {"type": (Literal[type_name], type_name)}
    for name, p in constructor_params(type_name).items():
        ann = _COMMON.get(name, _derived_type(p.annotation))
        default = ... if p.default is p.empty else p.default
        if name in ("sampler", "view"):
            default = None
        fields[name] = (ann, default)
    model: type[BufferConfig] = create_model(
        f"{type_name}Config", __base__=BufferConfig, **fields)
    model.__doc__ = f"Config of :class:`{cls.__module__}.{cls.__name__}`."
    return model


def _fmt(type_name: str, err: ValidationError) -> ConfigError:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            allowed = sorted(config_model(type_name).model_fields)
            parts.append(f"unknown key {loc!r} (value {describe(e['input'])}); allowed keys: "
                         f"{allowed}")
        elif e["type"] == "missing":
            parts.append(f"missing required key {loc!r}")
        elif loc:
            parts.append(f"{loc}={describe(e['input'])}: {msg}")
        else:
            parts.append(msg)
    return ConfigError(f"{type_name} config: " + "; ".join(parts))


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
    if not isinstance(type_name, str) or type_name not in _BUFFERS:
        raise ConfigError(f"type={type_name!r}: unknown buffer type; known types: "
                          f"{buffer_types()}")
    model = config_model(type_name)
    try:
        return model.model_validate({**data, "type": type_name})
    except ValidationError as exc:
        raise _fmt(type_name, exc) from None


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
    if name not in _BUFFERS or _BUFFERS[name].resolve() is not type(buf):
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
                if isinstance(v, (*_SIMPLE, type(None), list, dict)):
                    cand[field] = v
                    break
    values = {k: v for k, v in cand.items() if k in model.model_fields}
    try:
        return model.model_validate({**values, "type": name})
    except ValidationError as exc:
        raise _fmt(name, exc) from None


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
