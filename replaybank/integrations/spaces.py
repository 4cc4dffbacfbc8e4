"""Gymnasium spaces -> replaybank field specs, and env values -> buffer fields.

Box (dtype kept), Discrete, MultiDiscrete, MultiBinary map to one field each; Dict and
Tuple spaces map to nested fields (``obs/<key>``; ``obs/0``, ``obs/1`` for a Tuple).
:func:`to_fields` arranges what an env returns (possibly batched by a vector env) in the
nested dicts the buffer flattens to those names; dtypes are left to the buffer's checked
cast.

Example:
    >>> import gymnasium as gym
    >>> spec = spec_from_spaces(gym.spaces.Dict({"pos": gym.spaces.Box(0, 1, (2,)),
    ...     "id": gym.spaces.Discrete(3)}), gym.spaces.Discrete(2))
    >>> [(n, f.dtype.name, f.shape) for n, f in spec.items()][:3]
    [('obs/id', 'int64', ()), ('obs/pos', 'float32', (2,)), ('action', 'int64', ())]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from replaybank.buffers.inputs import standard_spec
from replaybank.errors import SpecError, require_extra
from replaybank.host import is_tensor, tensor_to_numpy
from replaybank.spec import FieldSpec, Spec

__all__ = ["from_fields", "parts_mismatch", "space_fields", "spec_from_env", "spec_from_spaces",
           "to_fields"]


def _gym() -> Any:
    return require_extra("gymnasium", "gym")


def space_fields(space: Any, name: str) -> list[FieldSpec]:
    """Field specs for one (possibly nested) gymnasium space under ``name``.

    Raises:
        SpecError: A space kind that has no fixed shape (Text, Graph, Sequence, OneOf).
    """
    spaces = _gym().spaces
    if isinstance(space, spaces.Dict):
        return [f for key, sub in space.spaces.items() for f in space_fields(sub, f"{name}/{key}")]
    if isinstance(space, spaces.Tuple):
        return [f for i, sub in enumerate(space.spaces) for f in space_fields(sub, f"{name}/{i}")]
    if isinstance(space, (spaces.Box, spaces.MultiBinary, spaces.MultiDiscrete)):
        return [FieldSpec(name, tuple(space.shape), np.dtype(space.dtype))]
    if isinstance(space, spaces.Discrete):
        return [FieldSpec(name, (), np.dtype(space.dtype))]
    raise SpecError(
        f"{name}: space {space!r} ({type(space).__name__}) has no fixed shape; replaybank "
        "maps Box, Discrete, MultiDiscrete, MultiBinary, Dict and Tuple spaces. Wrap the env "
        "(e.g. gymnasium.wrappers.FlattenObservation) or pass spec= yourself"
    )


def spec_from_spaces(observation_space: Any, action_space: Any) -> Spec:
    """Build the buffer spec of an env from its (single, unbatched) spaces.

    Args:
        observation_space: The env's observation space.
        action_space: The env's action space.

    Returns:
        A :class:`~replaybank.spec.Spec` with ``obs...``, ``action...``, ``reward``
        (float32), ``terminated`` and ``truncated`` (bool).

    Raises:
        SpecError: A space kind without a fixed shape.
        MissingDependencyError: gymnasium is not installed.

    Example:
        >>> import gymnasium as gym
        >>> spec = spec_from_spaces(gym.spaces.Box(0, 255, (4, 4), np.uint8),
        ...                         gym.spaces.MultiDiscrete([3, 2]))
        >>> spec["obs"].dtype, spec["action"].shape
        (dtype('uint8'), (2,))
    """
    return standard_spec(Spec([*space_fields(observation_space, "obs"),
                               *space_fields(action_space, "action")]))


def spec_from_env(env: Any) -> Spec:
    """:func:`spec_from_spaces` of an env or vector env (its single-env spaces).

    Example:
        >>> import gymnasium as gym
        >>> env = gym.make("CartPole-v1")
        >>> spec_from_env(env)["obs"].shape
        (4,)
    """
    _gym()
    obs_space = getattr(env, "single_observation_space", None)
    act_space = getattr(env, "single_action_space", None)
    if obs_space is None or act_space is None:
        obs_space, act_space = env.observation_space, env.action_space
    return spec_from_spaces(obs_space, act_space)


def to_fields(space: Any, value: Any) -> Any:
    """Arrange an env value of ``space`` in the buffer's nested-dict layout.

    Dict spaces become dicts, Tuple spaces dicts keyed ``"0"``, ``"1"``, ...; torch
    tensors become numpy arrays. Every other leaf is passed on as it is, dtype included:
    casting it to its field's dtype is the buffer's one checked cast
    (:meth:`~replaybank.spec.FieldSpec.cast`), so a value handed over by ``rb.collect``
    obeys exactly the rules of ``buf.add`` (a float observation in a ``Box(uint8)``
    space, or a fractional action for a ``Box(int32)``, raises DtypeError into a buffer
    whose field is an integer one, instead of being truncated here). Works for single and
    vector-batched values alike.

    Example:
        >>> import gymnasium as gym
        >>> sp = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(0, 1, (2,))))
        >>> out = to_fields(sp, (np.int64(1), np.zeros(2, np.float32)))
        >>> sorted(out), out["0"].dtype, out["1"].dtype
        (['0', '1'], dtype('int64'), dtype('float32'))
        >>> to_fields(gym.spaces.Box(0, 255, (2,), np.uint8), np.array([0.2, 0.4])).dtype
        dtype('float64')
    """
    spaces = _gym().spaces
    if isinstance(space, spaces.Dict):
        return {k: to_fields(sub, value[k]) for k, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):  # a tuple, or already the dict of its parts
        parts = isinstance(value, Mapping)
        return {str(i): to_fields(sub, value[str(i)] if parts else value[i])
                for i, sub in enumerate(space.spaces)}
    return tensor_to_numpy(value) if is_tensor(value) else value


def parts_mismatch(space: Any, value: Any) -> str:
    """Why ``value`` is not an action of the gymnasium ``Tuple`` or ``Dict`` space
    ``space`` at its top level ("" when it is): a ``Tuple``'s is a tuple of its length or
    the dict of its parts ``{'0': ..., '1': ...}``, a ``Dict``'s a dict of exactly its keys.
    A value :func:`to_fields` would otherwise index wrongly, or whose extra keys it would
    silently drop.

    Example:
        >>> import gymnasium as gym
        >>> sp = gym.spaces.Dict({"move": gym.spaces.Box(0, 1, (2,)),
        ...                       "pick": gym.spaces.Discrete(3)})
        >>> parts_mismatch(sp, {"move": np.zeros(2), "pick": 1})
        ''
        >>> parts_mismatch(sp, {"move": np.zeros(2)}).endswith("(missing ['pick'])")
        True
        >>> parts_mismatch(sp, (np.zeros(2), 1))
        "a tuple, but the space is a Dict: give the dict {'move': ..., 'pick': ...}"
    """
    spaces = _gym().spaces
    if isinstance(space, spaces.Tuple):
        keys = [str(i) for i in range(len(space.spaces))]
        if type(value) is tuple:
            return "" if len(value) == len(keys) else (
                f"a tuple of {len(value)} parts, but the Tuple space has {len(keys)}")
    else:
        keys = list(space.spaces)
        if type(value) is tuple:
            shown = ", ".join(f"{k!r}: ..." for k in keys)
            return f"a tuple, but the space is a Dict: give the dict {{{shown}}}"
    if not isinstance(value, Mapping):
        return f"a {type(value).__name__}, but the space is {space!r}"
    got = list(value)
    missing = [k for k in keys if k not in value]
    unknown = [k for k in got if k not in keys]
    if not missing and not unknown:
        return ""
    which = ", ".join(f"{w} {ks}" for w, ks in (("missing", missing), ("unknown", unknown))
                      if ks)
    return f"a dict with the keys {got}, but the space's parts are {keys} ({which})"


def from_fields(space: Any, value: Any) -> Any:
    """The inverse of :func:`to_fields`: a value arranged in the buffer's nested-dict
    layout, as an env of ``space`` takes it (Tuple spaces get a tuple again, Dict spaces
    a dict; every other leaf is passed on as it is).

    A multi-agent collector stores an agent's ``Tuple`` action part by part, as the dict
    ``{'0': ..., '1': ...}``, and hands the env this tuple.

    Example:
        >>> import gymnasium as gym
        >>> sp = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(0, 1, (2,))))
        >>> act = from_fields(sp, {"0": np.int64(1), "1": np.zeros(2, np.float32)})
        >>> type(act).__name__, sp.contains(act)
        ('tuple', True)
    """
    spaces = _gym().spaces
    if isinstance(space, spaces.Dict):
        return {k: from_fields(sub, value[k]) for k, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(from_fields(sub, value[str(i)]) for i, sub in enumerate(space.spaces))
    return value
