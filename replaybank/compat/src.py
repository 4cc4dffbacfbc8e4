"""Front end for the PPO/SAC project's ``src.buffers``: switch by changing one import.

``from src.buffers.PPOBuffer import PPOBuffer`` becomes
``from replaybank.compat.src import PPOBuffer`` (likewise ``SimpleReplayBuffer`` and
``discount_cumsum``); the calls stay the same:

* :class:`PPOBuffer` ``(obs_dim, act_dim, size, batch_size, gamma=0.99, lam=0.95,
  eps=1e-3)``: ``store(buffer_dict)`` one step, ``finish_path(action_obj)`` at the end of
  each trajectory (GAE-lambda advantages and rewards-to-go of the path), ``sample_batch()``
  at the end of the epoch: all of its steps, advantages normalised. It owns a
  :class:`~replaybank.compat.trajectory.PathBuffer` (one env of a
  :class:`~replaybank.buffers.rollout.buffer.RolloutBuffer`, GAE from
  :mod:`replaybank.ops.gae`).
* :class:`SimpleReplayBuffer` ``(obs_dim, act_dim, size, batch_size)``: a FIFO replay
  buffer for SAC; ``store(buffer_dict)``, ``sample_batch()`` (``batch_size`` distinct
  transitions), ``finish_path()`` (a no-op). It owns a
  :class:`~replaybank.buffers.replay.ReplayBuffer`.
* :func:`discount_cumsum` ``(x, discount)``: :func:`replaybank.ops.gae.discount_cumsum`.
* ``instantiate_from_config(path)`` / ``instantiate_from_config_dict(config)``: as
  classmethods of both classes (that class's arguments), and as module functions that
  read the type from the config (``{"name": "PPOBuffer", "config": {...}}`` or
  ``{"type": "PPOBuffer", ...}``). Configs are validated by pydantic models
  (:class:`PPOBufferConfig`, :class:`SimpleReplayBufferConfig`, also each class's
  ``config_model``); a bad config raises :class:`~replaybank.errors.ConfigError` (a
  ``ValueError``) naming the key, the value, the rule and an example.
* ``schema`` of both classes: the reference's strictyaml ``Map`` of the arguments, so
  ``strictyaml.load(text, PPOBuffer.schema)`` reads a config as in the original
  (strictyaml, of the ``yaml`` extra, is imported when ``schema`` is first read).

Every public call checks its arguments before anything changes and raises a
:class:`~replaybank.errors.ReplayBankError` naming the argument, the value and the fix.

``buffer_dict`` holds what the project's runner passes: ``"obs"`` (array or torch tensor,
``obs_dim`` values), ``"act"`` (the project's ``ActionSample``: ``.action`` with
``act_dim`` values; PPO also reads ``.value`` = ``V(obs)`` and ``.logp``), ``"rew"``, and
for the replay buffer ``"next_obs"`` and ``"done"``. Other keys are ignored. Batches are
dicts of float32 torch tensors (torch is imported when the first batch is made).

Where this front end differs from the original, and why: ``docs/migration/src.md``.

Example:
    >>> import numpy as np
    >>> from types import SimpleNamespace as Act
    >>> buf = PPOBuffer(obs_dim=2, act_dim=1, size=4, batch_size=2, gamma=0.5, lam=1.0)
    >>> for t in range(3):
    ...     buf.store({"obs": np.full(2, t, np.float32), "rew": 1.0,
    ...                "act": Act(action=np.zeros(1), value=0.0, logp=-0.7)})
    >>> buf.finish_path(None)  # the episode terminated: nothing to bootstrap
    >>> sorted((k, tuple(v.shape)) for k, v in buf.sample_batch().items())
    [('act', (3, 1)), ('adv', (3,)), ('logp', (3,)), ('obs', (3, 2)), ('ret', (3,))]
    >>> [round(float(x), 3) for x in discount_cumsum(np.ones(3), 0.5)]
    [1.75, 1.5, 1.0]
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from replaybank.buffers.arguments import make_rng
from replaybank.buffers.replay import ReplayBuffer
from replaybank.compat.base import Core, FrontEnd
from replaybank.compat.checks import (
    check_mapping,
    check_number,
    check_type,
    done_flag,
    int_rule,
    is_int,
    is_real,
    numbers,
    one_number,
)
from replaybank.compat.devices import BatchTensors, checked_device
from replaybank.compat.trajectory import PathBuffer
from replaybank.errors import (
    ArgumentError,
    CapacityError,
    ConfigError,
    EmptyBufferError,
    ReplayBankError,
    ShapeError,
    closest,
    describe,
    require_extra,
)
from replaybank.ops import gae as _gae

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "PPOBuffer",
    "PPOBufferConfig",
    "SimpleReplayBuffer",
    "SimpleReplayBufferConfig",
    "discount_cumsum",
    "instantiate_from_config",
    "instantiate_from_config_dict",
]

AnyArray = npt.NDArray[Any]
_FLOAT = "convert the value to a float"
FloatArray = npt.NDArray[np.float64]


def discount_cumsum(x: Any, discount: float) -> FloatArray:
    """Discounted cumulative sum ``y[t] = sum_k discount**k * x[t + k]`` over axis 0.

    Args:
        x: Values ``[T]`` or ``[T, *batch]``.
        discount: The discount factor.

    Returns:
        float64 array shaped like ``x`` (:func:`replaybank.ops.gae.discount_cumsum`).

    Raises:
        DtypeError: ``x`` does not hold numbers (a string, None, objects).
        ShapeError: ``x`` is a scalar.
        ConfigError: ``discount`` is not a finite number.

    Example:
        >>> discount_cumsum([1.0, 2.0, 3.0], 0.5).tolist()
        [2.75, 3.5, 3.0]
    """
    arr = numbers(x, "discount_cumsum(x=...)", "convert the value to floats")
    d = check_number("discount_cumsum", "discount", discount, kind_error=ConfigError,
                     example=0.99)
    return _gae.discount_cumsum(arr, d)


# ---------------------------------------------------------------------- config schema
def _pos_int(v: Any) -> int:
    if not is_int(v) or v < 1:
        raise ValueError(f"must be {int_rule(1)}")
    return int(v)


def _number(v: Any) -> float:
    # YAML 1.1 (PyYAML) reads ``1e-3`` as a string; strictyaml's Float() read it as a number
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise ValueError("must be a number") from None
    if not is_real(v) or not math.isfinite(float(v)):
        raise ValueError("must be a finite number")
    return float(v)


def _within(lo: float, hi: float, rule: str) -> Callable[[Any], float]:
    """The validator of a number in ``[lo, hi]``; ``rule`` is its message."""
    def check(v: Any) -> float:
        f = _number(v)
        if not lo <= f <= hi:
            raise ValueError(rule)
        return f
    return check


PosInt = Annotated[int, BeforeValidator(_pos_int)]
Unit = Annotated[float, BeforeValidator(_within(0.0, 1.0, "must be a number in [0, 1]"))]
NonNegative = Annotated[float, BeforeValidator(_within(0.0, math.inf, "must be a number >= 0"))]

_EXAMPLES = {"obs_dim": 4, "act_dim": 1, "size": 4000, "batch_size": 64, "gamma": 0.99,
             "lam": 0.95, "eps": 0.001}


class SimpleReplayBufferConfig(BaseModel):
    """Arguments of :class:`SimpleReplayBuffer` (the original ``schema``: four ints).

    Unknown keys are refused, as strictyaml's ``Map`` refused them.

    Example:
        >>> SimpleReplayBufferConfig(obs_dim=3, act_dim=2, size=100, batch_size=8).size
        100
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    obs_dim: PosInt
    act_dim: PosInt
    size: PosInt
    batch_size: PosInt


class PPOBufferConfig(SimpleReplayBufferConfig):
    """Arguments of :class:`PPOBuffer`: four ints and optional ``gamma``, ``lam``, ``eps``.

    Example:
        >>> PPOBufferConfig(obs_dim=3, act_dim=1, size=100, batch_size=8).eps
        0.001
    """

    gamma: Unit = 0.99
    lam: Unit = 0.95
    eps: NonNegative = 1e-3


def _config_error(type_name: str, model: type[BaseModel], err: ValidationError) -> ConfigError:
    """One ConfigError naming every bad key, its value, the rule and an example."""
    allowed = list(model.model_fields)
    parts = []
    for e in err.errors():
        key = ".".join(str(x) for x in e["loc"])
        if e["type"] == "extra_forbidden":
            near = closest(key, allowed)
            hint = f"did you mean {near!r}? " if near is not None else ""
            parts.append(f"unknown key {key!r} (value {describe(e['input'])}); {hint}"
                         f"allowed keys: {allowed}")
        elif e["type"] == "missing":
            parts.append(f"missing required key {key!r}; add e.g. {key}: {_EXAMPLES[key]}")
        else:
            rule = e["msg"].removeprefix("Value error, ")
            example = f"; e.g. {key}: {_EXAMPLES[key]}" if key in _EXAMPLES else ""
            parts.append(f"{key}={describe(e['input'])}: {rule}{example}")
    return ConfigError(f"{type_name} config: " + "; ".join(parts))


def _validate(cls: type[_FromConfig],
              values: Mapping[str, Any]) -> Any:
    try:
        return cls.config_model.model_validate(dict(values))
    except ValidationError as exc:
        raise _config_error(cls.__name__, cls.config_model, exc) from None


class _StrictYamlSchema:
    """A class attribute holding the reference's strictyaml ``Map`` of a buffer's
    arguments: required ``Int()`` keys, then ``Optional(...)`` ``Float()`` keys.

    strictyaml (the ``yaml`` extra) is imported, and the Map built, when the attribute
    is first read; importing the front end imports nothing of it. The Map checks types
    only, as the original's did; the constructors check the rules (ints >= 1, ...).

    Args:
        required: Names of the required int keys.
        optional: Names of the optional float keys.

    Example:
        >>> class Buffer:
        ...     schema = _StrictYamlSchema(("size",), ("gamma",))
        >>> Buffer.schema
        Map({'size': Int(), Optional("gamma"): Float()})
    """

    def __init__(self, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
        self.required = required
        self.optional = optional
        self._map: Any = None

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if self._map is None:
            sy = require_extra("strictyaml", "yaml")
            fields: dict[Any, Any] = {name: sy.Int() for name in self.required}
            fields.update({sy.Optional(name): sy.Float() for name in self.optional})
            self._map = sy.Map(fields)
        return self._map


_INTS = ("obs_dim", "act_dim", "size", "batch_size")


def _read_config_file(path: Any) -> Any:
    """Parse a YAML (or ``.json``) config file; every failure is a ConfigError."""
    check_type(None, "config_file_location", path, (str, os.PathLike),
               "a path (str or pathlib.Path) to a .yaml, .yml or .json file", ConfigError)
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {str(p)!r}: cannot read it ({exc}); check the "
                          "path") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r}: not UTF-8 text ({exc}); pass a YAML or "
                          "JSON config file") from exc
    try:
        if p.suffix.lower() == ".json":
            return json.loads(text)
        return require_extra("yaml", "yaml").safe_load(text)
    except ImportError:
        raise
    except Exception as exc:  # the parsers' own error types
        raise ConfigError(f"config file {str(p)!r}: cannot parse it ({exc}); write one "
                          "'key: value' per line, e.g. 'obs_dim: 4'") from exc


def _split(config: Any) -> tuple[str | None, Any]:
    """``(type name or None, arguments)`` of a flat, ``name/config`` or ``type`` config."""
    check_type(None, "config", config, Mapping, "a mapping of buffer arguments, e.g. "
               "{'obs_dim': 4, 'act_dim': 1, 'size': 4000, 'batch_size': 64}", ConfigError)
    if "name" in config and "config" in config:
        extra = sorted(set(config) - {"name", "config"})
        if extra:
            raise ConfigError(f"config keys {extra}: a 'name'/'config' config holds only "
                              "those two keys; move the others under 'config'")
        return config["name"], config["config"]
    if "type" in config:
        return config["type"], {k: v for k, v in config.items() if k != "type"}
    return None, config


def instantiate_from_config_dict(config: Mapping[str, Any]) -> PPOBuffer | SimpleReplayBuffer:
    """Build the buffer a config names: ``{"name": T, "config": {...}}`` or
    ``{"type": T, **arguments}`` with ``T`` in ``"PPOBuffer"``, ``"SimpleReplayBuffer"``.

    Args:
        config: The config mapping.

    Returns:
        A new, empty buffer.

    Raises:
        ConfigError: No or an unknown type, or bad arguments (names key, value, rule).

    Example:
        >>> buf = instantiate_from_config_dict({"name": "SimpleReplayBuffer", "config": {
        ...     "obs_dim": 3, "act_dim": 1, "size": 100, "batch_size": 8}})
        >>> type(buf).__name__, buf.size
        ('SimpleReplayBuffer', 100)
    """
    name, args = _split(config)
    known: dict[str, type[PPOBuffer] | type[SimpleReplayBuffer]] = {
        "PPOBuffer": PPOBuffer, "SimpleReplayBuffer": SimpleReplayBuffer}
    if name is None:
        raise ConfigError(f"config keys {sorted(config)}: the config names no buffer type; "
                          f"wrap it as {{'name': T, 'config': {{...}}}} or add 'type': T, "
                          f"T one of {sorted(known)}; or call T.instantiate_from_config_dict")
    if not isinstance(name, str) or name not in known:
        raise ConfigError(f"buffer type {name!r}: unknown; known types: {sorted(known)}")
    return known[name].instantiate_from_config_dict(args)


def instantiate_from_config(config_file_location: Any) -> PPOBuffer | SimpleReplayBuffer:
    """Build the buffer a YAML/JSON file names (see :func:`instantiate_from_config_dict`).

    Args:
        config_file_location: Path of a ``.yaml``/``.yml`` (or ``.json``) file.

    Returns:
        A new, empty buffer.

    Raises:
        ConfigError: The file cannot be read or parsed, or its config is bad (a
            ``ValueError``, as the original raised).

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "buffer.yaml"
        >>> _ = path.write_text("name: PPOBuffer\\nconfig:\\n  obs_dim: 4\\n  act_dim: 1\\n"
        ...                     "  size: 64\\n  batch_size: 16\\n  eps: 1e-3\\n")
        >>> instantiate_from_config(path).eps
        0.001
    """
    return instantiate_from_config_dict(_read_config_file(config_file_location))


class _FromConfig:
    """What both buffers share: the reference's config constructors (the arguments of
    ``cls`` from a file or a mapping, validated by ``cls.config_model``), the checked
    arguments as attributes, and the batches as tensors on ``device``."""

    config_model: ClassVar[type[SimpleReplayBufferConfig]]
    obs_dim: int
    act_dim: int
    size: int
    batch_size: int
    device: Any

    def _configure(self, values: dict[str, Any], device: Any, seed: Any = None,
                   default_cuda: bool = False) -> dict[str, Any]:
        """Check the arguments (``values`` by the config model, then ``seed``, which
        nothing here draws from, then ``device``) and set them as attributes.

        Returns:
            The spec of the stored ``obs [obs_dim]`` and ``action [act_dim]`` (float32).
        """
        self.__dict__.update(_validate(type(self), values).model_dump())
        make_rng(seed)  # checked only
        checked_device(device)
        self.device = device
        self._tensors = BatchTensors(device, default_cuda)
        return {"obs": ((self.obs_dim,), np.float32), "action": ((self.act_dim,), np.float32)}

    @classmethod
    def instantiate_from_config(cls, config_file_location: Any) -> Self:
        """Build from a YAML (or ``.json``) file of this class's arguments.

        Args:
            config_file_location: Path of a ``.yaml``/``.yml`` (or ``.json``) file.

        Raises:
            ConfigError: The file cannot be read or parsed, or a bad key (a ValueError).

        Example:
            >>> import pathlib, tempfile
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "ppo.yaml"
            >>> _ = path.write_text("obs_dim: 4\\nact_dim: 1\\nsize: 64\\nbatch_size: 16\\n")
            >>> PPOBuffer.instantiate_from_config(path).gamma
            0.99
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "sac.json"
            >>> _ = path.write_text('{"obs_dim": 4, "act_dim": 1, "size": 64, "batch_size": 8}')
            >>> SimpleReplayBuffer.instantiate_from_config(path).batch_size
            8
        """
        return cls.instantiate_from_config_dict(_read_config_file(config_file_location))

    @classmethod
    def instantiate_from_config_dict(cls, config: Mapping[str, Any]) -> Self:
        """Build from a mapping of this class's arguments (validated by :attr:`schema`).

        Args:
            config: The arguments (``{"obs_dim": 4, ...}``), or ``{"name": this class's
                name, "config": {...}}``, or ``{"type": this class's name, ...}``.

        Raises:
            ConfigError: Missing, unknown or bad keys, or a config that names another
                type.

        Example:
            >>> PPOBuffer.instantiate_from_config_dict(
            ...     {"obs_dim": 4, "act_dim": 1, "size": 64, "batch_size": 16, "lam": 0.9}).lam
            0.9
            >>> SimpleReplayBuffer.instantiate_from_config_dict(
            ...     {"obs_dim": 4, "act_dim": 1, "size": 64, "batch_size": 8}).size
            64
        """
        name, args = _split(config)
        if name is not None and name != cls.__name__:
            raise ConfigError(f"config names type {name!r}, not {cls.__name__!r}; call "
                              f"{name}.instantiate_from_config_dict or the module function "
                              "replaybank.compat.src.instantiate_from_config_dict")
        check_type(None, "config", args, Mapping, f"a mapping of {cls.__name__} arguments",
                   ConfigError)
        return cls(**_validate(cls, args).model_dump())


# ---------------------------------------------------------------------- conversions
def _array(key: str, x: Any, dim: int) -> AnyArray:
    """``x`` as a ``[dim]`` array (torch tensors detached to numpy; anything but a numeric
    numpy array cast to float32, the dtype the original stored).

    Raises:
        DtypeError: ``x`` does not hold numbers.
        ShapeError: ``x`` does not hold ``dim`` values.
    """
    arr: AnyArray
    if type(x) is np.ndarray and x.dtype.kind in "biuf":
        arr = x
    else:
        arr = numbers(x, f"store: buffer_dict{key}", "convert the value to floats").astype(
            np.float32, copy=False)
    if arr.shape != (dim,):
        if arr.size != dim:
            raise ShapeError(f"store: buffer_dict{key}={describe(x)}: expected {dim} values "
                             f"(shape ({dim},), or (1, {dim})); check obs_dim / act_dim")
        arr = arr.reshape(dim)
    return arr


def _finite(key: str, x: Any) -> Any:
    """One number (:func:`~replaybank.compat.checks.one_number`) that enters the epoch's
    GAE: NaN or inf would make every normalised advantage of the epoch NaN, so it is
    refused (as finish_path's bootstrap value)."""
    v = one_number(x, key, _FLOAT)
    if not math.isfinite(v):
        raise ConfigError(f"{key}={v!r}: must be a finite number (it enters the advantages "
                          "of the whole epoch); check the reward and the value network")
    return v


def _bootstrap_form(call: str, action_obj: Any) -> None:
    """finish_path's ``action_obj``: None, an ActionSample (anything with ``.value``) or
    a number; a bool is refused (``finish_path(terminated)`` would bootstrap from 1.0)."""
    if action_obj is None or hasattr(action_obj, "value") or is_real(action_obj):
        return
    raise ArgumentError(
        f"{call}(action_obj={describe(action_obj)}): expected None (the episode "
        "terminated), an ActionSample whose .value is V(s_T), or that value as a number"
        + ("; a bool is not a value: pass None when the episode terminated"
           if isinstance(action_obj, (bool, np.bool_)) else ""))


def _refuse_step(buffer_dict: Any, keys: tuple[str, ...], fields: tuple[str, ...]) -> None:
    """Raise the error of a store whose ``buffer_dict`` could not be read: not a mapping,
    a key of ``keys`` missing, or an ActionSample field of ``fields`` missing (returns
    when none of these is the cause: the caller re-raises its own error).

    Raises:
        ArgumentError: Naming what is missing and what store expects.
    """
    check_mapping("store", "buffer_dict", buffer_dict, "the step, e.g. {'obs': obs, "
                  "'act': action_sample, 'rew': reward, ...}")
    for k in keys:
        if k not in buffer_dict:
            raise ArgumentError(f"store(buffer_dict): missing key {k!r}; expected keys "
                                f"{list(keys)} (got {sorted(buffer_dict)})")
    act = buffer_dict["act"]
    missing = [n for n in fields if not hasattr(act, n)]
    if missing:
        raise ArgumentError(
            f"store: buffer_dict['act']={describe(act)} has no "
            f"{', '.join('.' + n for n in missing)}; pass the ActionSample returned by the "
            f"agent's select_action (fields {', '.join(fields)})")


# ---------------------------------------------------------------------- PPOBuffer
class PPOBuffer(_FromConfig, FrontEnd):
    """On-policy buffer of one epoch with GAE-lambda advantages (the original's API).

    Args:
        obs_dim: Observation size (observations are stored as ``[obs_dim]`` float32).
        act_dim: Action size (actions are stored as ``[act_dim]`` float32).
        size: Steps per epoch (a :class:`~replaybank.errors.CapacityError` when more are
            stored before :meth:`sample_batch` starts a new epoch).
        batch_size: The minibatch size of the agent's updates (kept as an attribute, as
            in the original; :meth:`sample_batch` returns the whole epoch, as documented).
        gamma: Discount factor.
        lam: GAE lambda.
        eps: Added to the advantage std when normalising.
        seed: Accepted for code written for earlier versions of this front end (keyword
            only; checked, but nothing in PPOBuffer draws: :meth:`sample_batch` returns
            the epoch in order).
        device: Torch device of the batches (keyword only; default CPU, as the original).

    Raises:
        ConfigError: A bad argument (names it, the value and the rule), or a ``device``
            that is not a torch device available here.

    Attributes:
        schema: The reference's strictyaml ``Map`` of the arguments (strictyaml is
            imported when it is first read).
        config_model: The pydantic model that checks the arguments
            (:class:`PPOBufferConfig`).

    Example:
        >>> buf = PPOBuffer(4, 2, size=100, batch_size=32)
        >>> buf.size, buf.batch_size, buf.gamma, buf.lam, buf.eps
        (100, 32, 0.99, 0.95, 0.001)
    """

    schema = _StrictYamlSchema(_INTS, ("gamma", "lam", "eps"))
    config_model: ClassVar[type[PPOBufferConfig]] = PPOBufferConfig
    _repr_fields = ("obs_dim", "act_dim", "size", "batch_size", "gamma", "lam", "eps")
    buffer: PathBuffer
    gamma: float
    lam: float
    eps: float

    def __init__(self, obs_dim: int, act_dim: int, size: int, batch_size: int,
                 gamma: float = 0.99, lam: float = 0.95, eps: float = 1e-3, *,
                 seed: int | np.random.Generator | None = None, device: Any = None) -> None:
        spec = self._configure({"obs_dim": obs_dim, "act_dim": act_dim, "size": size,
                                "batch_size": batch_size, "gamma": gamma, "lam": lam,
                                "eps": eps}, device, seed)
        self.buffer = PathBuffer(self.size, gamma=self.gamma, lam=self.lam, eps=self.eps,
                                 spec=spec)
        self._epoch: dict[str, AnyArray] | None = None  # the closed epoch, [N, ...]

    path: Core[PathBuffer] = Core(
        "The :class:`~replaybank.compat.trajectory.PathBuffer` of the epoch being collected "
        "(:attr:`buffer`; ``len(buf)`` is its steps).", "buffer")

    def store(self, buffer_dict: Mapping[str, Any]) -> None:
        """Append one timestep: ``buffer_dict["obs"]``, ``["act"]`` (``.action``,
        ``.value`` = ``V(obs)``, ``.logp``) and ``["rew"]``; other keys are ignored.

        Everything is checked before anything is stored.

        Raises:
            ArgumentError: ``buffer_dict`` is not a mapping, or a key or an ActionSample
                field is missing.
            CapacityError: ``size`` steps are stored; call :meth:`finish_path` and
                :meth:`sample_batch` at the end of each epoch.
            ConfigError: ``rew`` or ``.value`` is NaN or infinite (it would make every
                advantage of the epoch NaN).
            DtypeError: A value is not numbers (None, a string, ...).
            ShapeError: ``obs``/``action`` do not hold ``obs_dim``/``act_dim`` values, or
                ``rew``/``.value``/``.logp`` are not one number.
        """
        try:
            obs, act, rew = buffer_dict["obs"], buffer_dict["act"], buffer_dict["rew"]
            action, value, logp = act.action, act.value, act.logp
        except (KeyError, TypeError, IndexError, AttributeError):
            _refuse_step(buffer_dict, ("obs", "act", "rew"), ("action", "value", "logp"))
            raise
        try:
            self.buffer.store(_array("['obs']", obs, self.obs_dim),
                            _array("['act'].action", action, self.act_dim),
                            _finite("store: buffer_dict['rew']", rew),
                            _finite("store: buffer_dict['act'].value", value),
                            one_number(logp, "store: buffer_dict['act'].logp", _FLOAT))
        except CapacityError as exc:
            raise CapacityError(
                f"store: the epoch is full (size={self.size} steps); call "
                "finish_path(action_obj) and sample_batch() at the end of each epoch, or "
                "build the buffer with a larger size") from exc

    def finish_path(self, action_obj: Any = None) -> None:
        """Close the current trajectory: GAE-lambda advantages and rewards-to-go of its steps.

        Args:
            action_obj: ``None`` when the episode terminated (no bootstrap); otherwise the
                ActionSample whose ``.value`` is ``V(s_T)`` of the observation after the
                last step (time limit, or the epoch's end), or that value as a number. A
                no-op on an empty path.

        Raises:
            ArgumentError: ``action_obj`` is not None, a number or an object with
                ``.value`` (a bool is refused: ``finish_path(terminated)`` is a mistake).
            DtypeError, ShapeError: The value is not one number.
            ConfigError: The value is NaN or infinite.
        """
        _bootstrap_form("finish_path", action_obj)
        if action_obj is None:
            last_val: Any = 0.0
        elif is_real(action_obj):
            last_val = _finite("finish_path: action_obj", action_obj)
        else:
            last_val = _finite("finish_path: action_obj.value", action_obj.value)
        self.buffer.finish_path(last_val)

    def _close_epoch(self) -> None:
        path = self.buffer
        if path.path_start != path.ptr:
            raise EmptyBufferError(
                f"sample_batch: steps {path.path_start}..{path.ptr - 1} belong to an "
                "unfinished trajectory; call finish_path(action_obj) first (None if the "
                "episode terminated, else the ActionSample of the last observation)")
        batch = path.get()  # normalised advantages; the path buffer starts a new epoch
        self._epoch = {"obs": batch.obs, "act": batch.action, "ret": batch["returns"],
                       "adv": batch["advantages"], "logp": batch["log_prob"]}

    def sample_batch(self) -> dict[str, Any]:
        """All of the data of the epoch, with advantages normalised, as float32 tensors.

        The reference: "call this at the end of an epoch to get all of the data from the
        buffer, with advantages appropriately normalized (shifted to have mean zero and
        std one). Also, resets some pointers in the buffer." The first call after new
        steps closes the epoch: every stored step (all must belong to finished
        trajectories), in the order stored, advantages normalised over the epoch
        (``(adv - mean) / (std + eps)``), and the storage pointers reset, so the next
        :meth:`store` starts a new epoch. Calls with no new steps return the same epoch
        again (fresh tensors each time). Minibatches of ``batch_size`` are the caller's
        (e.g. ``torch.randperm(N).split(buf.batch_size)``).

        Returns:
            ``{"obs": [N, obs_dim], "act": [N, act_dim], "ret": [N] (rewards-to-go),
            "adv": [N] (normalised), "logp": [N]}`` for the ``N`` steps of the epoch.

        Raises:
            EmptyBufferError: Nothing stored, or the last trajectory is unfinished (the
                buffer is unchanged).

        Example:
            >>> from types import SimpleNamespace as Act
            >>> buf = PPOBuffer(obs_dim=1, act_dim=1, size=8, batch_size=2, lam=1.0)
            >>> for t in range(5):
            ...     buf.store({"obs": [t], "act": Act(action=[0], value=0.0, logp=0.0),
            ...                "rew": float(t)})
            >>> buf.finish_path(None)
            >>> data = buf.sample_batch()
            >>> data["obs"][:, 0].tolist(), abs(float(data["adv"].mean())) < 1e-6, len(buf)
            ([0.0, 1.0, 2.0, 3.0, 4.0], True, 0)
        """
        if self.buffer.ptr:
            self._close_epoch()
        epoch = self._epoch
        if epoch is None:
            raise EmptyBufferError("sample_batch: the buffer is empty; store(...) steps and "
                                   "finish_path(...) each trajectory first")
        return self._tensors(epoch, copy=True)



# ---------------------------------------------------------------------- SimpleReplayBuffer
class SimpleReplayBuffer(_FromConfig, FrontEnd):
    """A FIFO replay buffer of the last ``size`` transitions for SAC (the original's API).

    Args:
        obs_dim: Observation size (``obs`` and ``next_obs`` stored as ``[obs_dim]``).
        act_dim: Action size.
        size: Capacity; the oldest transition is overwritten when full.
        batch_size: Transitions per :meth:`sample_batch` (fewer while fewer are stored).
        seed: Seed or Generator of sampling (keyword only; the original used numpy's
            global generator).
        device: Torch device of the batches (keyword only; default ``"cuda"`` when
            available, else CPU, as the original).

    Raises:
        ConfigError: A bad argument, or a ``device`` that is not a torch device
            available here.

    Attributes:
        schema: The reference's strictyaml ``Map`` of the arguments (strictyaml is
            imported when it is first read).
        config_model: The pydantic model that checks the arguments
            (:class:`SimpleReplayBufferConfig`).

    Example:
        >>> import numpy as np
        >>> from types import SimpleNamespace as Act
        >>> buf = SimpleReplayBuffer(obs_dim=3, act_dim=2, size=100, batch_size=4,
        ...                          seed=0, device="cpu")
        >>> for t in range(10):
        ...     buf.store({"obs": np.full(3, t, np.float32), "act": Act(action=np.ones(2)),
        ...                "rew": 1.0, "next_obs": np.full(3, t + 1, np.float32),
        ...                "done": t == 9})
        >>> batch = buf.sample_batch()
        >>> sorted((k, tuple(v.shape)) for k, v in batch.items())
        [('act', (4, 2)), ('done', (4,)), ('obs', (4, 3)), ('obs2', (4, 3)), ('rew', (4,))]
        >>> bool((batch["obs2"][:, 0] == batch["obs"][:, 0] + 1).all())
        True
    """

    schema = _StrictYamlSchema(_INTS)
    config_model: ClassVar[type[SimpleReplayBufferConfig]] = SimpleReplayBufferConfig
    _repr_fields = ("obs_dim", "act_dim", "size", "batch_size")
    buffer: ReplayBuffer

    def __init__(self, obs_dim: int, act_dim: int, size: int, batch_size: int, *,
                 seed: int | np.random.Generator | None = None, device: Any = None) -> None:
        spec = self._configure({"obs_dim": obs_dim, "act_dim": act_dim, "size": size,
                                "batch_size": batch_size}, device, default_cuda=True)
        # steps are stored as given: no vector-env autoreset to look for
        self.buffer = ReplayBuffer(self.size, seed=seed, spec=spec, autoreset_mode="disabled")

    def store(self, buffer_dict: Mapping[str, Any]) -> None:
        """Store one transition: ``buffer_dict["obs"]``, ``["act"]`` (``.action``),
        ``["rew"]``, ``["next_obs"]``, ``["done"]``; other keys are ignored.

        ``done`` marks a terminal step (no bootstrap from ``next_obs``), as in the original.

        Raises:
            ArgumentError: ``buffer_dict`` is not a mapping, or a key or ``act.action``
                is missing.
            ShapeError, DtypeError: Bad values, or a ``done`` that is not a bool or 0/1
                (the buffer is unchanged).
        """
        try:
            obs, act, rew = buffer_dict["obs"], buffer_dict["act"], buffer_dict["rew"]
            next_obs, done, action = buffer_dict["next_obs"], buffer_dict["done"], act.action
        except (KeyError, TypeError, IndexError, AttributeError):
            _refuse_step(buffer_dict, ("obs", "act", "rew", "next_obs", "done"), ("action",))
            raise
        if type(done) is bool:
            # the hot path: the core's add checks the values (and refuses, unchanged, what
            # needs translating first: tensors, [1, dim] rows, ...)
            try:
                self.buffer.add(obs=obs, action=action, reward=rew, next_obs=next_obs,
                                terminated=done, truncated=False)
                return
            except (ReplayBankError, TypeError, ValueError, RuntimeError):
                pass
        else:
            done = done_flag(done, "store: buffer_dict['done']", "pass done=bool(terminated)")
        self.buffer.add(obs=_array("['obs']", obs, self.obs_dim),
                        action=_array("['act'].action", action, self.act_dim),
                        reward=one_number(rew, "store: buffer_dict['rew']", _FLOAT),
                        next_obs=_array("['next_obs']", next_obs, self.obs_dim),
                        terminated=done, truncated=False)

    def sample_batch(self) -> dict[str, Any]:
        """Sample ``min(batch_size, len(self))`` distinct stored transitions uniformly.

        Returns:
            ``{"obs": [B, obs_dim], "obs2": [B, obs_dim], "act": [B, act_dim],
            "rew": [B], "done": [B]}`` float32 torch tensors (``done`` is 1.0 at terminal
            steps).

        Raises:
            EmptyBufferError: Nothing stored yet.
        """
        n = len(self.buffer)
        if n == 0:
            raise EmptyBufferError("sample_batch: the buffer is empty; store(...) "
                                   "transitions first")
        b = self.buffer.sample(self.batch_size if n >= self.batch_size else n, replace=False)
        return self._tensors({"obs": b.obs, "obs2": b.next_obs, "act": b.action,
                              "rew": b.reward, "done": b.terminated.astype(np.float32)})

    def finish_path(self, action_obj: Any = None) -> None:
        """Do nothing: a replay buffer has no per-trajectory work (kept so that runners
        can call it on any buffer, as in the original).

        Args:
            action_obj: What a runner passes to :meth:`PPOBuffer.finish_path` (None, an
                ActionSample or a number); ignored.

        Raises:
            ArgumentError: ``action_obj`` is none of those (a string, a bool, ...): the
                same check as :meth:`PPOBuffer.finish_path`, so a runner's mistake shows
                on either buffer.

        Example:
            >>> SimpleReplayBuffer(2, 1, 8, 4).finish_path()
        """
        _bootstrap_form("finish_path", action_obj)
