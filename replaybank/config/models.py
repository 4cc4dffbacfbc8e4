"""Pydantic config models of buffers and their components, and the checks on their fields.

Every registered buffer type (:mod:`replaybank.registry`) gets a config model,
made by :func:`config_model` from its constructor signature: the common arguments
(``capacity``, ``num_envs``, ``seed``, ``spec``, ``sampler``, ``view``, ``n_step``,
``gamma``, ``frame_stack``, ``storage``, ...) are typed and validated, other simple
types are kept, everything else is ``Any``. Samplers and views are
:class:`ComponentConfig` (``type`` plus their arguments, checked against the registered
class). :func:`format_error` turns pydantic's errors into one
:class:`~replaybank.errors.ConfigError` that names each bad key, its value and the rule.

Example:
    >>> model = config_model("ReplayBuffer")
    >>> model.model_validate({"type": "ReplayBuffer", "capacity": 8}).gamma
    0.99
    >>> sorted(ComponentConfig(type="nstep", n=3, gamma=0.9).params())
    ['gamma', 'n']
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    create_model,
    model_validator,
)

from replaybank.config.strict import simple_kinds, strict, strict_value
from replaybank.errors import ConfigError, ReplayBankError, closest, describe
from replaybank.registry import (
    BUFFER_LISTENERS,
    BUFFERS,
    SAMPLERS,
    VIEWS,
    Entry,
    buffer_types,
    canonical_type,
    constructor_params,
)

__all__ = ["SIMPLE", "BufferConfig", "ComponentConfig", "config_model", "format_error",
           "unknown_buffer_type"]


# ---------------------------------------------------------------------- field types
# every int, float, bool and text field goes through strict_value (replaybank.config.strict):
# a value is taken as written, never parsed from text, and a refusal says what to write
def _positive(name: str, minimum: int = 1) -> Callable[[Any], int]:
    rule = "a positive int" if minimum == 1 else f"an int >= {minimum}"

    def check(v: Any) -> int:
        n: int = strict_value(v, (int,), rule, minimum)
        if n < minimum:
            raise ValueError(f"must be {rule}")
        return n
    return check


def _pos_int(name: str) -> Any:
    return Annotated[int, BeforeValidator(_positive(name))]


def _gamma(v: Any) -> float:
    # checked before pydantic's lax parsing, which would read the text "0.5" as a number
    rule = "a float in [0, 1]"
    f: float = strict_value(v, (float,), rule)
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"must be {rule}")
    return f


def _spec(v: Any) -> Any:
    if v is None:
        return None
    from replaybank.spec import Spec

    try:
        return Spec.coerce(v).to_json()
    except (ReplayBankError, TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"not a valid spec ({exc}); use {{name: {{shape: [...], dtype: "
                         "...}}") from exc


def _seed(v: Any) -> Any:
    rule = "a non-negative int or null"
    n = strict_value(v, (int, type(None)), rule, 0)
    if n is not None and n < 0:
        raise ValueError(f"must be {rule}")
    return n


def _text(optional: bool = False) -> Any:
    """A text field (``str``, or ``str | None``): refused when not text."""
    kinds: tuple[type, ...] = (str, type(None)) if optional else (str,)
    return BeforeValidator(strict(kinds))


def _storage(v: Any) -> Any:
    from replaybank.registry import storage_names

    if v not in storage_names():
        raise ValueError(f"unknown storage; choose one of {list(storage_names())}")
    return v


class ComponentConfig(BaseModel):
    """A sampler or view: ``type`` plus its constructor arguments (checked on build)."""

    model_config = ConfigDict(extra="allow")
    type: str

    def params(self) -> dict[str, Any]:
        """Constructor arguments (everything but ``type``)."""
        return {k: v for k, v in self.model_dump().items() if k != "type"}


def _component(kind: str, registry: dict[str, Entry]) -> Callable[[Any], Any]:
    """A before-validator of a ``sampler`` or ``view`` field: a mapping (or a model) or
    null passes on; anything else, a bare name above all (``sampler: prioritized``), is
    refused with the mapping to write instead."""
    def check(v: Any) -> Any:
        if v is None or isinstance(v, (dict, BaseModel)):
            return v
        name = canonical_type(registry, v) if isinstance(v, str) else None
        known = "" if name in registry else f" (known types: {sorted(registry)})"
        name = name if name in registry else "..."
        raise ValueError(f"must be a mapping of the {kind}'s type and arguments; write "
                         f"{kind}: {{type: {name}}} (YAML) or \"{kind}\": {{\"type\": "
                         f"\"{name}\"}} (JSON), its arguments beside type{known}")
    return check


_COMMON: dict[str, Any] = {
    "capacity": _pos_int("capacity"),
    "num_envs": _pos_int("num_envs"),
    "seed": Annotated[Any, AfterValidator(_seed)],
    "spec": Annotated[Any, BeforeValidator(_spec)],
    "sampler": Annotated[ComponentConfig | None,
                         BeforeValidator(_component("sampler", SAMPLERS))],
    "view": Annotated[ComponentConfig | None, BeforeValidator(_component("view", VIEWS))],
    "n_step": _pos_int("n_step"),
    "gamma": Annotated[float, BeforeValidator(_gamma)],
    "frame_stack": _pos_int("frame_stack"),
    "storage": Annotated[str, _text(), AfterValidator(_storage)],
    "path": Annotated[str | None, _text(optional=True)],
    "device": Annotated[str | None, _text(optional=True)],
}
SIMPLE = (int, float, bool, str)


def _derived_type(annotation: Any) -> Any:
    """A pydantic type for a constructor annotation: an int, float, bool or str (or a
    union of them and None) checked by :func:`~replaybank.config.strict.strict_value`,
    anything else Any (left to the constructor).

    Example:
        >>> from pydantic import TypeAdapter, ValidationError
        >>> try:
        ...     TypeAdapter(_derived_type(int | None)).validate_python("4")
        ... except ValidationError as exc:
        ...     print(exc.errors()[0]["msg"])
        Value error, must be an int or null; write 4 (a number, not text)
    """
    kinds = simple_kinds(annotation)
    if kinds is None:
        return Any
    return Annotated[annotation, BeforeValidator(strict(kinds))]


def _check_params(cls: type, data: dict[str, Any], loc: str) -> None:
    """The int, float, bool and str arguments of a sampler or view config, checked as a
    buffer config's fields are (:func:`~replaybank.config.strict.strict_value`)."""
    params = inspect.signature(cls).parameters
    for key, value in data.items():
        kinds = simple_kinds(params[key].annotation) if key in params else None
        if kinds is not None:
            try:
                strict_value(value, kinds)
            except ValueError as exc:
                raise ValueError(f"{loc}.{key}={describe(value)}: {exc}") from None


def _check_component(kind: str, value: Any, registry: dict[str, Entry], loc: str) -> None:
    if value is None:
        return
    data = value.model_dump() if isinstance(value, BaseModel) else value
    if data["type"] not in registry:
        aliases = sorted({e.class_name for e in registry.values()} - {""})
        raise ValueError(f"{loc}.type={data['type']!r}: unknown {kind} type"
                         f"{_meant(data['type'], [*registry, *aliases])}; known types: "
                         f"{sorted(registry)} (or their class names {aliases})")
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
    _check_params(cls, data, loc)
    for key, sub in data.items():
        if isinstance(sub, dict) and "type" in sub:
            _check_component(kind, sub, registry, f"{loc}.{key}")


def _canonical_component(value: Any, registry: dict[str, Entry]) -> Any:
    """``value`` (a component config or its dict) with every ``type`` in it, nested ones
    included, written as the registered name (a class name is an alias of it)."""
    if isinstance(value, ComponentConfig):
        value = value.model_dump()
    if not isinstance(value, dict) or "type" not in value:
        return value
    return {k: canonical_type(registry, v) if k == "type" else _canonical_component(v, registry)
            for k, v in value.items()}


class BufferConfig(BaseModel):
    """Base of every buffer config model (one per registered type, see
    :func:`config_model`). Unknown keys are rejected. A sampler or view may be named by its
    class name (``{"type": "PrioritizedSampler"}``); the model holds the registered name
    (``"prioritized"``), as ``buf.config()`` does."""

    model_config = ConfigDict(extra="forbid")
    type: str

    if TYPE_CHECKING:
        # The other fields are the registered type's constructor arguments, made when the
        # program runs (config_model): a type checker reads each as Any, so that
        # ``buf.config().capacity`` type-checks for every buffer's config.
        def __getattr__(self, name: str) -> Any: ...

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for key, registry in (("sampler", SAMPLERS), ("view", VIEWS)):
            if key in out:
                out[key] = _canonical_component(out[key], registry)
        return out

    @model_validator(mode="after")
    def _components(self) -> BufferConfig:
        _check_component("sampler", getattr(self, "sampler", None), SAMPLERS, "sampler")
        _check_component("view", getattr(self, "view", None), VIEWS, "view")
        if getattr(self, "storage", None) == "memmap" and getattr(self, "path", None) is None:
            raise ValueError('storage="memmap" needs path: a directory for the array files')
        return self

    def build(self, **overrides: Any) -> Any:
        """Construct the buffer this config describes.

        Args:
            **overrides: Constructor arguments to pass instead (e.g. a ready backend
                object as ``storage``).
        """
        cls = BUFFERS[self.type].resolve()
        kwargs: dict[str, Any] = {}
        for name in type(self).model_fields:
            if name == "type":
                continue
            value = getattr(self, name)
            if name in ("sampler", "view") and isinstance(value, ComponentConfig):
                reg = SAMPLERS if name == "sampler" else VIEWS
                value = _build_component(value.model_dump(), reg, name)
            elif name in ("sampler", "view") and value is None:
                continue
            kwargs[name] = value
        kwargs.update(overrides)
        return cls(**kwargs)


def _build_component(data: dict[str, Any], registry: dict[str, Entry], loc: str) -> Any:
    cls = registry[data["type"]].resolve()
    kwargs = {k: _build_component(v, registry, f"{loc}.{k}")
              if isinstance(v, dict) and "type" in v else v
              for k, v in data.items() if k != "type"}
    return cls(**kwargs)


@cache
def config_model(type_name: str) -> type[BufferConfig]:
    """The pydantic config model of a registered buffer type.

    Fields are the constructor's arguments (through ``**kwargs`` to the base class),
    typed and validated for the common ones, plus ``type``.

    Raises:
        ConfigError: Unknown type (the message lists the known ones).

    Example:
        >>> sorted(config_model("ReplayBuffer").model_fields)[:3]
        ['autoreset_mode', 'capacity', 'device']
    """
    if type_name not in BUFFERS:
        raise unknown_buffer_type(type_name)
    cls = BUFFERS[type_name].resolve()
    fields: dict[str, Any] = {"type": (Literal[type_name], type_name)}
    for name, p in constructor_params(type_name).items():
        ann = _COMMON.get(name, _derived_type(p.annotation))
        default = ... if p.default is p.empty else p.default
        if name in ("sampler", "view"):
            default = None
        fields[name] = (ann, default)
    # models belong to replaybank.config, where ReplayBufferConfig can be pickled from
    model: type[BufferConfig] = create_model(
        f"{type_name}Config", __base__=BufferConfig, __module__="replaybank.config",
        **fields)
    model.__doc__ = f"Config of :class:`{cls.__module__}.{cls.__name__}`."
    return model


BUFFER_LISTENERS.append(config_model.cache_clear)  # a re-registered type gets a new model


def _meant(name: Any, names: list[str]) -> str:
    """``" (did you mean 'x'?)"`` for a misspelt ``name`` close to one of ``names``."""
    near = closest(name, names) if isinstance(name, str) else None
    return f" (did you mean {near!r}?)" if near is not None else ""


def unknown_buffer_type(type_name: Any) -> ConfigError:
    """The error of a config whose ``type`` names no registered buffer: the known types,
    and the one probably meant.

    Example:
        >>> print(unknown_buffer_type("ReplayBufer"))  # doctest: +ELLIPSIS
        type='ReplayBufer': unknown buffer type (did you mean 'ReplayBuffer'?); known ...
    """
    return ConfigError(f"type={type_name!r}: unknown buffer type"
                       f"{_meant(type_name, buffer_types())}; known types: {buffer_types()}")


def format_error(type_name: str, err: ValidationError) -> ConfigError:
    """One :class:`~replaybank.errors.ConfigError` naming every bad key of ``err``.

    Example:
        >>> from pydantic import ValidationError
        >>> try:
        ...     config_model("ReplayBuffer").model_validate({"capacity": 0})
        ... except ValidationError as exc:
        ...     print(format_error("ReplayBuffer", exc))
        ReplayBuffer config: capacity=0: must be a positive int
    """
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            allowed = sorted(config_model(type_name).model_fields)
            parts.append(f"unknown key {loc!r} (value {describe(e['input'])})"
                         f"{_meant(loc, allowed)}; allowed keys: {allowed}")
        elif e["type"] == "missing":
            parts.append(f"missing required key {loc!r}")
        elif loc:
            parts.append(f"{loc}={describe(e['input'])}: {msg}")
        else:
            parts.append(msg)
    return ConfigError(f"{type_name} config: " + "; ".join(parts))
