"""One ``add`` of a multi-agent buffer, checked and turned into one core ``add``.

Everything is checked before the core is called (:func:`prepare`), so a rejected call
leaves the buffer exactly as it was: the dict arguments and their agents, the shapes and
dtypes (:meth:`~replaybank.spec.FieldSpec.cast`), the ``active`` masks and the
agents that ended earlier in the episode. The result, :class:`JointStep`, holds the core
call's keyword values (every value ``[n, *shape]`` for the ``n`` envs written) and what
the episode bookkeeping records once the core has stored it. An agent's observation
is one array or, where the layout says so, a dict ``{key: array}`` of exactly the
layout's keys (:func:`cast_obs`); the core call nests it (``obs={agent: {key: ...}}``).

The common call (every agent acts in every env; no ``active``, extras or priority) takes
:class:`DirectAdd` instead: the core call's dicts are built as given and the core's
compiled writer checks and casts every value under the same rules; a call it does not
take changes nothing and comes back to :func:`prepare`, which names the error (the same
error as always) or writes.

Example:
    >>> import numpy as np
    >>> from replaybank.multiagent.episodes import Episodes
    >>> step = prepare(("a", "b"), 1, None, None, Episodes(2, 1), dict(
    ...     obs={"a": np.zeros(2, np.float32)}, action={"a": 1}, reward={"a": 0.5},
    ...     next_obs={"a": np.ones(2, np.float32)}, terminated={"a": False},
    ...     truncated={"a": False}, state=None, next_state=None, active=None), {})
    Traceback (most recent call last):
    ...
    replaybank.errors.SpecError: add(obs=..., action=...): agent 'b' is not in the first add and spec= gives no 'obs' or 'action' for it, so those shapes and dtypes are unknown; add to spec: MultiAgentReplayBuffer(..., spec={..., 'obs': {'b': (shape, dtype)}, 'action': {'b': (shape, dtype)}}) (env.observation_space(agent) and env.action_space(agent) give the shape and dtype), or include agent 'b' in the first add
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.buffers.inputs import RESERVED
from replaybank.buffers.write_route import WriteRoute
from replaybank.errors import ArgumentError, SpecError, describe
from replaybank.multiagent.episodes import Ends, Episodes
from replaybank.multiagent.layout import (
    OUTCOMES,
    RESERVED_NAMES,
    STATE,
    AgentLayout,
    parse_spec,
)
from replaybank.spec import SEP, FieldSpec, as_array, check_tuple
from replaybank.storage.writers.compiled import not_handled

__all__ = ["PER_AGENT_ARGS", "TUPLE_ACTION_FIX", "DirectAdd", "JointStep", "cast_obs",
           "cast_value", "check_action_tuples", "check_agent_dicts", "check_obs_values",
           "check_state_given", "obs_as_stored", "prepare", "step_layout"]

#: The dict arguments of ``add`` that hold one value per acting agent.
PER_AGENT_ARGS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")

_REWARD = np.dtype(np.float32)
_FLAG = np.dtype(np.bool_)


@dataclass(frozen=True)
class JointStep:
    """A checked joint step, ready for the core.

    Attributes:
        layout: The buffer's layout (built by this call when the buffer had none).
        core: The core ``add``'s keyword values, each ``[n, *shape]``.
        lanes: ``[n]`` int64: the envs written (those where some agent acted).
        all_lanes: Every env is written (the core call needs no ``env_ids``).
        act: ``[n_agents, n]`` bool: which agents acted.
        ends: The ends of the step.
        next_obs: ``{leaf: [n, *obs_shape]}``: the next observations stored, per
            observation leaf (``<agent>``, or ``<agent>/<key>`` for a dict observation).
    """

    layout: AgentLayout
    core: dict[str, Any]
    lanes: npt.NDArray[np.int64]
    all_lanes: bool
    act: npt.NDArray[np.bool_]
    ends: Ends
    next_obs: dict[str, npt.NDArray[Any]]


def check_agent_dicts(owner: str, agents: tuple[str, ...], dicts: Mapping[str, Any],
                      active: Any, extras: Mapping[str, Any],
                      reserved: frozenset[str], call: str = "add") -> tuple[str, ...]:
    """Check the per-agent dict arguments of an ``add``; return the acting agents.

    Args:
        owner: The buffer class, for messages.
        agents: The buffer's agents.
        dicts: The arguments that must be ``{agent: value}`` dicts (``obs`` first: its
            agents are the acting ones), by argument name.
        active: ``{agent: bool or bool[num_envs]}`` or None.
        extras: The other keyword values: a dict is per agent, anything else joint.
        reserved: Names an extra may not have.
        call: The call the user made, for messages (``"add"``; ``"check_step"`` or a
            collector's ``"collect"`` for a check before the step).

    Returns:
        The agents in ``obs``, in the buffer's order.

    Raises:
        ArgumentError: Not a dict, an unknown agent, agents that differ between the
            dicts, ``active`` naming an agent not in obs, no acting agent, or a reserved
            extra name.

    Example:
        >>> check_agent_dicts("B", ("a", "b"), {"obs": {"b": 0}, "reward": {"b": 1.0}},
        ...                   None, {}, frozenset())
        ('b',)
    """
    for name, v in dicts.items():
        if not isinstance(v, Mapping):
            raise ArgumentError(
                f"{call}({name}={describe(v)}): expected a dict {{agent: value}} (PettingZoo's "
                f"per-agent dicts); for one agent pass {name}={{{agents[0]!r}: value}}")
        _known(owner, name, v, agents, call)
    acting = tuple(a for a in agents if a in dicts["obs"])
    if not acting:
        raise ArgumentError(f"{call}(obs={{}}): no agent acted; pass the step of at least one "
                            "agent (an agent left out of the dicts did not act)")
    for name, v in dicts.items():
        _same_agents(name, v, acting, call)
    if active is not None:
        if not isinstance(active, Mapping):
            raise ArgumentError(f"{call}(active={describe(active)}): expected a dict {{agent: "
                                "bool or bool[num_envs]}} of the agents in obs")
        stray = [a for a in active if a not in acting]
        if stray:
            raise ArgumentError(
                f"{call}(active=...): agent(s) {stray} are not in obs; active says in which envs "
                "an agent in obs acted (an agent left out of obs acted in none)")
    for name, v in extras.items():
        if not isinstance(name, str) or name in reserved:
            raise ArgumentError(f"{call}({name}=...): {name!r} is reserved by {owner} or the "
                                "core; rename the extra")
        if isinstance(v, Mapping):
            _known(owner, name, v, agents, call)
            _same_agents(name, v, acting, call)
    return acting


def _known(owner: str, name: str, v: Mapping[str, Any], agents: tuple[str, ...],
           call: str) -> None:
    unknown = [a for a in v if a not in agents]
    if unknown:
        raise ArgumentError(f"{call}({name}=...): unknown agent(s) {unknown}; this buffer's "
                            f"agents are {list(agents)} ({owner}(agents=))")


def _same_agents(name: str, v: Mapping[str, Any], acting: tuple[str, ...], call: str) -> None:
    missing = [a for a in acting if a not in v]
    if missing:
        raise ArgumentError(
            f"{call}({name}=...): missing {missing}: agent(s) in obs but missing from {name}; "
            f"pass {name} for every agent in obs, or leave the agent out of every dict (it "
            "did not act at this step)")
    extra = [a for a in v if a not in acting]
    if extra:
        raise ArgumentError(
            f"{call}({name}=...): agent(s) {extra} are in {name} but not in obs; an agent "
            "that acts is in every dict (obs, action, reward, next_obs, terminated, "
            "truncated)")


#: The fix of a tuple action of an agent whose action this buffer stores as one array
#: (its first add or ``spec=`` said so): flatten it, or store the action part by part.
TUPLE_ACTION_FIX = (
    "This buffer stores the agent's action as one array (its first add or spec=): pass "
    "one array, e.g. gymnasium.spaces.flatten(env.action_space(agent), action), or build "
    "the buffer to store the action part by part (the dict {'0': v[0], '1': v[1], ...} in "
    "its first add, or spec={'action': {agent: {'0': (shape, dtype), '1': ...}}})")


def _parts_fix(arg: str, agent: str, keys: tuple[str, ...] | int) -> str:
    """The tuple rule's fix for ``arg[agent]`` (``action['a']``) where the agent's value
    is (or may become) a dict of parts: ``keys``, or the number of parts."""
    names = tuple(str(i) for i in range(keys)) if isinstance(keys, int) else keys
    more = ", ..." if len(names) > 3 else ""
    parts = ", ".join(f"'{k}': v[{k}]" if k.isdigit() else f"{k!r}: v[{k!r}]"
                      for k in names[:3]) + more
    fields = ", ".join(f"{arg}{SEP}{agent}{SEP}{k}" for k in names[:3]) + more
    return (f"Pass its parts as a dict, {arg}[{agent!r}]={{{parts}}} (stored as the fields "
            f"{fields}, as rb.collect stores a Tuple space; with several envs each part "
            "holds one row per env)")


def check_action_tuples(actions: Mapping[str, Any], layout: AgentLayout | None = None
                        ) -> None:
    """The tuple rule (:func:`~replaybank.spec.check_tuple`) for the actions of a
    multi-agent ``add``, ``{agent: action}``, before anything infers or casts them.

    A tuple holding arrays (a gymnasium ``Tuple`` space's value) is refused, as the
    single-agent buffers refuse it, with the fix that the agent's field takes: the dict
    of parts ``{'0': v[0], '1': v[1], ...}`` (stored part by part, as ``rb.collect``
    stores a Tuple space) before the first add or where the agent's action is stored
    part by part, and :data:`TUPLE_ACTION_FIX` (flatten it) where ``layout`` stores the
    agent's action as one array.

    Args:
        actions: ``{agent: action}`` as the call gave them.
        layout: The buffer's layout, or None before its first add.

    Raises:
        ShapeError: An agent's action is a tuple holding arrays, or a list of them.

    Example:
        >>> check_action_tuples({"a": (0, 1)})  # one number per env: a list's reading
        >>> check_action_tuples({"a": (0, np.zeros(2))})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        replaybank.errors.ShapeError: action['a']=(0, array(shape=(2,), dtype=float64)): a tuple holding arrays ... Pass its parts as a dict, action['a']={'0': v[0], '1': v[1]} (stored as the fields action/a/0, action/a/1, ...
    """  # noqa: E501
    for a, v in actions.items():
        if type(v) is tuple or type(v) is list:
            where = f"action[{a!r}]"
            if layout is not None and a in layout.per_agent["action"]:
                fix = TUPLE_ACTION_FIX
            else:
                keys = None if layout is None else layout.keys("action", a)
                fix = _parts_fix("action", a, len(v) if keys is None else keys)
            check_tuple(where, v, fix)


#: Names an extra of MultiAgentReplayBuffer may not have.
_RESERVED = RESERVED_NAMES | RESERVED

_SCALARS: dict[tuple[str, str, Any], FieldSpec] = {}


def _scalar(prefix: str, agent: str, dtype: Any) -> FieldSpec:
    """The scalar field ``<prefix>/<agent>`` of ``dtype`` (built once per name)."""
    key = (prefix, agent, dtype)
    field = _SCALARS.get(key)
    if field is None:
        field = _SCALARS[key] = FieldSpec(f"{prefix}{SEP}{agent}", (), dtype)
    return field


def cast_value(field: FieldSpec, arg: str, value: Any, num_envs: int,
               call: str = "add") -> npt.NDArray[Any]:
    """``value`` checked and cast to ``field``, shaped ``[num_envs, *shape]`` (``call``:
    the call the user made, for messages)."""
    if isinstance(value, Mapping):
        raise ArgumentError(f"{call}({arg}={describe(value)}): a dict where an array is "
                            "expected; only observations and actions may be dicts {key: "
                            "array}")
    arr = as_array(value, arg)  # (a ragged nest: a ShapeError naming arg)
    lead = field.leading_of(call, value, [(), (1,)] if num_envs == 1 else [(num_envs,)],
                            arr)
    out = field.cast(arg, value, lead, arr)
    return out.reshape((num_envs, *field.shape))


def _layout(agents: tuple[str, ...], num_envs: int, spec: Any, args: Mapping[str, Any],
            extras: Mapping[str, Any]) -> AgentLayout:
    lead = () if num_envs == 1 else (num_envs,)
    values: dict[str, Any] = {"obs": args["obs"], "action": args["action"],
                              STATE: args["state"]}
    values.update(extras)
    return AgentLayout.build(agents, spec, values, lead, dict_obs=True)


def cast_obs(layout: AgentLayout, agent: str, arg: str, value: Any, num_envs: int,
             out: dict[str, npt.NDArray[Any]], call: str = "add") -> None:
    """Check and cast one agent's observation into its observation leaves.

    Both multi-agent buffers store an observation this way (``obs`` and ``next_obs`` of
    the replay buffer; ``obs`` and ``final_obs`` of the rollout buffer):
    :func:`cast_leaves` of the field ``obs``.

    Args:
        layout: The buffer's layout (it says whether ``agent`` observes one array or a
            dict, and with which keys, shapes and dtypes).
        agent: The agent.
        arg: The ``add`` argument, for messages (``"obs"``, ``"final_obs"``).
        value: The agent's observation: ``[num_envs, *shape]`` (no env dim with one
            env), or ``{key: [num_envs, *shape]}`` of exactly the layout's keys.
        num_envs: The buffer's envs.
        out: Receives ``out[leaf]`` ``[num_envs, *shape]`` per observation leaf
            (``<agent>``, or ``<agent>/<key>`` for each key); written only when every
            leaf was cast (a rejected value leaves ``out`` as it was).
        call: The call the user made, for messages (``"add"``, ``"check_obs"``, ...).

    Raises:
        SpecError: A dict for an agent that observes one array, an array for one that
            observes a dict, or a dict with missing or unknown keys.
        ShapeError, DtypeError: A value of the wrong shape or dtype.
    """
    cast_leaves(layout, "obs", agent, arg, value, num_envs, out, call)


def cast_leaves(layout: AgentLayout, top: str, agent: str, arg: str, value: Any,
                num_envs: int, out: dict[str, npt.NDArray[Any]], call: str = "add") -> None:
    """Check and cast one agent's value of ``top`` (``obs`` or ``action``: the fields
    stored part by part, :data:`~replaybank.multiagent.layout.PARTED`) into its leaves.

    Args:
        layout: The buffer's layout (it says whether ``agent``'s value is one array or a
            dict of parts, and with which keys, shapes and dtypes).
        top: ``"obs"`` or ``"action"``.
        agent: The agent.
        arg: The ``add`` argument, for messages (``"obs"``, ``"final_obs"``,
            ``"action"``).
        value: ``[num_envs, *shape]`` (no env dim with one env), or ``{key: [num_envs,
            *shape]}`` of exactly the layout's keys (an action of parts: a gymnasium
            ``Tuple`` space's ``{'0': ..., '1': ...}``).
        num_envs: The buffer's envs.
        out: Receives ``out[leaf]`` ``[num_envs, *shape]`` per leaf (``<agent>``, or
            ``<agent>/<key>`` for each key); written only when every leaf was cast (a
            rejected value leaves ``out`` as it was).
        call: The call the user made, for messages.

    Raises:
        SpecError: A dict where the agent's value is one array, an array (or a tuple)
            where it is a dict of parts, or a dict with missing or unknown keys.
        ShapeError, DtypeError: A value of the wrong shape or dtype.

    Example:
        >>> from replaybank.multiagent.layout import AgentLayout
        >>> lay = AgentLayout.build(("a",), {"obs": {"a": ((), "float32")}, "action": {
        ...     "a": {"0": ((), "int64"), "1": ((2,), "float32")}}}, {}, ())
        >>> got = {}
        >>> cast_leaves(lay, "action", "a", "action", {"0": 2, "1": [0.5, 1.0]}, 1, got)
        >>> sorted(got), got["a/1"].dtype.name
        (['a/0', 'a/1'], 'float32')
    """
    keys = layout.keys(top, agent)
    per = layout.per_agent[top]
    where = f"{arg}[{agent!r}]"
    what = "observes" if top == "obs" else "acts with"
    noun = "observation" if top == "obs" else "action"
    if keys is None:
        if isinstance(value, Mapping):
            field = per[agent]
            parts = ("dict observations (spec={'obs': {" f"{agent!r}" ": {key: (shape, "
                     "dtype)}}} or a dict in the first add)") if top == "obs" else (
                "an action of parts (spec={'action': {" f"{agent!r}" ": {'0': (shape, "
                "dtype), '1': ...}}} or the dict of parts in the first add)")
            raise SpecError(
                f"{call}({where}={describe(value)}): agent {agent!r} {what} one array in "
                f"this buffer (shape {field.shape}, {field.dtype}: its first add or spec=), "
                f"not a dict; pass that array, or build the buffer with {parts}")
        out[agent] = cast_value(per[agent], where, value, num_envs, call)
        return
    if not isinstance(value, Mapping):
        if type(value) is tuple or type(value) is list:
            check_tuple(where, value, _parts_fix(arg, agent, keys))
        raise SpecError(f"{call}({where}={describe(value)}): agent {agent!r} {what} a dict "
                        f"with keys {list(keys)} in this buffer (its first add or spec=); "
                        "pass {key: array} with exactly those keys"
                        + ("" if top == "obs" else " (a gymnasium Tuple action as "
                           "{'0': v[0], '1': v[1], ...}, as rb.collect stores it)"))
    missing = [k for k in keys if k not in value]
    unknown = [k for k in value if k not in keys]
    if missing or unknown:
        raise SpecError(f"{call}({where}=...): the dict {noun} has keys {list(value)}; "
                        f"agent {agent!r} {what} exactly {list(keys)} in this buffer"
                        + (f"; missing {missing}" if missing else "")
                        + (f"; unknown {unknown}" if unknown else "")
                        + "; pass a dict with exactly those keys")
    leaves: dict[str, npt.NDArray[Any]] = {}
    for k in keys:
        if isinstance(value[k], Mapping):
            raise SpecError(f"{call}({where}[{k!r}]={describe(value[k])}): a nested dict; dict "
                            f"{noun}s have one level of keys in a multi-agent buffer; "
                            f"flatten the deeper ones (e.g. '{k}_<subkey>' keys)")
        leaf = f"{agent}{SEP}{k}"
        leaves[leaf] = cast_value(per[leaf], f"{where}[{k!r}]", value[k], num_envs, call)
    out.update(leaves)


def check_state_given(layout: AgentLayout, state: Any, call: str = "add") -> None:
    """A state is given exactly when the buffer stores one (``call``: the call the user
    made, for messages).

    Raises:
        SpecError: A state the buffer does not store, or none where it stores one.
    """
    if (state is not None) != (layout.state is not None):
        raise SpecError(
            f"{call}(state={describe(state)}): this buffer "
            + ("stores the global state: pass state= at every add"
               if layout.state is not None else "stores no global state (its first add "
               "and spec had none); leave state out, or build a new buffer with "
               "spec={'state': (shape, dtype)}"))


def step_layout(agents: tuple[str, ...], num_envs: int, spec: Any,
                step: Mapping[str, Any]) -> AgentLayout:
    """The layout the first ``add`` of a replay buffer (or its Ray client) fixes from a
    step's ``obs``, ``action``, ``state`` and extras (``step``: those keyword values as
    ``add`` takes them; its other keys, ``reward``, ``next_obs``, ... are not read).

    Raises:
        SpecError, ShapeError, DtypeError: What the first add's inference raises.
    """
    extras = {k: v for k, v in step.items()
              if k not in (*PER_AGENT_ARGS, STATE, "next_state", "active", "priority")}
    return _layout(agents, num_envs, spec, {"obs": step["obs"], "action": step["action"],
                                            STATE: step.get(STATE)}, extras)


def check_obs_values(owner: str, agents: tuple[str, ...], num_envs: int,
                     layout: AgentLayout | None, spec: Any, obs: Any, state: Any,
                     call: str) -> None:
    """The checks of both multi-agent buffers' ``check_obs`` (and the Ray client's): the
    observations ``{agent: [num_envs, *shape]}`` and the global state an env just gave,
    as ``add`` would check them; nothing changes.

    With a ``layout`` (the buffer's, or the one the first add will fix) every
    observation is cast into its leaves (:func:`cast_obs`) and the state into its field.
    Without one (before the first add, nothing says which fields), each observation leaf
    (and the state) whose field ``spec`` does not give is read as the first add infers
    fields (:meth:`~replaybank.spec.FieldSpec.infer`), so that a value no field can hold
    (text, bytes, objects) is refused now; shapes and the rest wait for the first add.

    Args:
        owner: The buffer class, for messages.
        agents: The buffer's agents.
        num_envs: Its envs.
        layout: Its fields, or None before they are known.
        spec: Its parsed ``spec=`` (read when ``layout`` is None).
        obs: ``{agent: [num_envs, *obs_shape]}`` (``{key: [num_envs, *shape]}`` for dict
            observations).
        state: ``[num_envs, *state_shape]``, or None.
        call: The call the errors name.

    Raises:
        ArgumentError: ``obs`` is not a dict, is empty or names an unknown agent.
        SpecError: A state the buffer does not store, or none where it stores one; a
            dict observation of other keys, or a dict where the agent observes one array
            (or the reverse).
        ShapeError, DtypeError: A value of the wrong shape or dtype (without a layout: a
            value no field can hold).
    """
    acting = check_agent_dicts(owner, agents, {"obs": obs}, None, {}, frozenset(), call)
    if layout is None:
        given = parse_spec(spec, agents)

        def lead(value: Any) -> tuple[int, ...]:  # one env: with or without its dim
            one = num_envs == 1 and tuple(getattr(value, "shape", ()))[:1] != (1,)
            return () if one else (num_envs,)

        for a in acting:
            value = obs[a]
            leaves = value.items() if isinstance(value, Mapping) else [(None, value)]
            for key, leaf in leaves:
                name = f"obs{SEP}{a}" + ("" if key is None else f"{SEP}{key}")
                if name not in given and not isinstance(leaf, Mapping):  # (nested: add's)
                    label = f"obs[{a!r}]" + ("" if key is None else f"[{key!r}]")
                    FieldSpec.infer(name, leaf, lead(leaf), label)
        if state is not None and STATE not in given:
            FieldSpec.infer(f"obs{SEP}{STATE}", state, lead(state), STATE)
        return
    check_state_given(layout, state, call)
    cast: dict[str, npt.NDArray[Any]] = {}  # {leaf: [num_envs, *shape]}, discarded
    for a in acting:
        cast_obs(layout, a, "obs", obs[a], num_envs, cast, call)
    if layout.state is not None:
        cast_value(layout.state, "state", state, num_envs, call)


def obs_as_stored(layout: AgentLayout, obs: Mapping[str, Any]) -> bool:
    """Whether one env's observations ``{agent: value}``, without an env dim, are exactly
    what ``layout`` stores, so that :func:`check_obs_values` passes them in that env's
    row of ``[num_envs, *shape]`` arrays (the other rows zeros) with no cast to check.

    That is: ``obs`` names at least one of the layout's agents and no other, and each
    observation is one numpy array of its field's shape and dtype
    (:meth:`~replaybank.spec.FieldSpec.stores_as_is`), or a dict observation with
    exactly the layout's keys, each such an array. (A global state is tested the same
    way with ``layout.state.stores_as_is``.) A collector tests each env's values as they
    arrive with this first and runs the buffer's full ``check_obs``, which names what
    is wrong, only when it says False; False says only that the full check must judge
    the values.

    Args:
        layout: The buffer's fields.
        obs: ``{agent: [*obs_shape]}`` of one env (``{key: [*shape]}`` for dict
            observations).

    Returns:
        True when the full check would pass the observations unchanged.

    Example:
        >>> layout = AgentLayout.build(("a",), None, {"obs": {"a": np.zeros(3, np.float32)},
        ...                            "action": {"a": 0}, "state": None}, ())
        >>> obs_as_stored(layout, {"a": np.ones(3, np.float32)})
        True
        >>> obs_as_stored(layout, {"a": np.ones(3)})  # float64: a cast to check
        False
    """
    if not obs:
        return False  # (no acting agent: check_agent_dicts refuses it)
    fields = layout.per_agent["obs"]
    for agent, value in obs.items():
        if agent not in layout.agents:
            return False
        field = fields.get(agent)
        if field is not None:
            if not field.stores_as_is(value):
                return False
            continue
        keys = layout.obs_keys(agent)
        if not keys or not isinstance(value, Mapping) or len(value) != len(keys):
            return False
        for key in keys:
            leaf = fields.get(f"{agent}{SEP}{key}")
            if leaf is None or key not in value or not leaf.stores_as_is(value[key]):
                return False
    return True


def prepare(agents: tuple[str, ...], num_envs: int, layout: AgentLayout | None, spec: Any,
            episodes: Episodes, args: Mapping[str, Any],
            extras: Mapping[str, Any]) -> JointStep:
    """Check one ``add`` and build the core call (nothing is changed).

    Args:
        agents: The buffer's agents.
        num_envs: Its envs (lanes).
        layout: Its layout, or None before its first add.
        spec: The user's spec (used when ``layout`` is None).
        episodes: Its episode bookkeeping.
        args: ``obs``, ``action``, ``reward``, ``next_obs``, ``terminated``,
            ``truncated`` (``{agent: [*lead, *shape]}``), ``state``, ``next_state``
            (``[*lead, *state_shape]`` or None) and ``active`` (``{agent: bool or
            bool[num_envs]}`` or None).
        extras: The other keyword values (per agent as dicts, or joint).

    Returns:
        The :class:`JointStep`.

    Raises:
        ArgumentError: A bad dict, an unknown or inconsistent agent, a reserved name.
        SpecError: A field this buffer does not have, or lacks, or an unknown shape.
        ShapeError, DtypeError: A value of the wrong shape or dtype.
    """
    acting = check_agent_dicts("MultiAgentReplayBuffer", agents,
                               {name: args[name] for name in PER_AGENT_ARGS}, args["active"],
                               extras, _RESERVED)
    check_action_tuples(args["action"], layout)
    if layout is None:
        layout = _layout(agents, num_envs, spec, args, extras)
    _fields_match(layout, args, extras)
    n_agents = len(agents)
    act = np.zeros((n_agents, num_envs), np.bool_)  # [n_agents, num_envs]
    term = np.zeros_like(act)
    trunc = np.zeros_like(act)
    rewards = np.zeros((n_agents, num_envs), _REWARD)
    cast: dict[str, dict[str, npt.NDArray[Any]]] = {name: {} for name in
                                                     ("obs", "next_obs", *layout.per_agent)}
    active = args["active"] or {}
    for i, a in enumerate(agents):
        if a not in acting:
            continue
        mask = np.ones(num_envs, np.bool_) if a not in active else cast_value(
            _scalar("active", a, _FLAG), f"active[{a!r}]", active[a], num_envs)
        act[i] = mask
        for name in ("obs", "next_obs"):
            cast_obs(layout, a, name, args[name][a], num_envs, cast[name])
        cast_leaves(layout, "action", a, "action", args["action"][a], num_envs,
                    cast["action"])
        for name in layout.extras:
            cast[name][a] = cast_value(layout.per_agent[name][a], f"{name}[{a!r}]",
                                  extras[name][a], num_envs)
        rewards[i] = cast_value(_scalar("rewards", a, _REWARD), f"reward[{a!r}]",
                           args["reward"][a], num_envs)
        term[i] = cast_value(_scalar("terminations", a, _FLAG), f"terminated[{a!r}]",
                        args["terminated"][a], num_envs)
        trunc[i] = cast_value(_scalar("truncations", a, _FLAG), f"truncated[{a!r}]",
                         args["truncated"][a], num_envs)
    states = {}
    if layout.state is not None:
        for name in (STATE, "next_state"):
            states[name] = cast_value(layout.state, name, args[name], num_envs)
    joint = {n: cast_value(f, n, extras[n], num_envs) for n, f in layout.joint.items()}
    rewards[~act] = 0
    term &= act
    trunc &= act
    again = act & episodes.ended
    if again.any():
        i, lane = (int(x[0]) for x in np.nonzero(again))
        raise ArgumentError(
            f"add(obs=...): agent {agents[i]!r} acts in env {lane}, but it ended (terminated "
            "or truncated) earlier in this episode of that env; an agent that ended does "
            "not act again until every agent has ended (the joint episode's end); leave "
            "it out (or active=False for that env)")
    lanes = np.flatnonzero(act.any(axis=0)).astype(np.int64)  # [n]
    if lanes.size == 0:
        raise ArgumentError("add(active=...): no agent acted in any env; pass the step of "
                            "at least one agent")
    all_lanes = lanes.size == num_envs
    act_n = act[:, lanes]  # [n_agents, n]
    ends = episodes.ends(act_n, term[:, lanes], trunc[:, lanes], lanes)
    core, stored_next = _core_values(layout, episodes, act_n, lanes, cast, states, joint,
                                     rewards[:, lanes], term[:, lanes], trunc[:, lanes],
                                     ends)
    return JointStep(layout, core, lanes, all_lanes, act_n, ends, stored_next)


def _fields_match(layout: AgentLayout, args: Mapping[str, Any],
                  extras: Mapping[str, Any]) -> None:
    """The call passes exactly the buffer's state and extras."""
    has_state = layout.state is not None
    for name in (STATE, "next_state"):
        if (args[name] is not None) != has_state:
            raise SpecError(
                f"add({name}={describe(args[name])}): this buffer "
                + ("stores the global state: pass state= and next_state= at every add"
                   if has_state else "stores no global state (its first add and spec had "
                   "none); leave state and next_state out, or build a new buffer with "
                   "spec={'state': (shape, dtype)}"))
    want = {*layout.extras, *layout.joint}
    got = set(extras)
    if want != got:
        raise SpecError(
            f"add(...): extras {sorted(got)} do not match this buffer's extras "
            f"{sorted(want)} (fixed by the first add and spec=); pass exactly those"
            + (f"; missing {sorted(want - got)}" if want - got else "")
            + (f"; unknown {sorted(got - want)}" if got - want else ""))
    for name in layout.extras:
        if not isinstance(extras[name], Mapping):
            raise SpecError(f"add({name}={describe(extras[name])}): {name!r} is a per-agent "
                            f"extra of this buffer; pass {name}={{agent: value}}")
    for name in layout.joint:
        if isinstance(extras[name], Mapping):
            raise SpecError(f"add({name}=...): {name!r} is a joint extra of this buffer; "
                            "pass one array (leading dim num_envs), not a dict")


def _placeholder(field: FieldSpec, n: int) -> npt.NDArray[Any]:
    return np.zeros((n, *field.shape), field.dtype)


def _per_agent(layout: AgentLayout, name: str, spec_name: str, act: npt.NDArray[np.bool_],
               lanes: npt.NDArray[np.int64], cast: dict[str, dict[str, npt.NDArray[Any]]],
               fill: dict[str, npt.NDArray[Any]] | None) -> dict[str, npt.NDArray[Any]]:
    """``{agent: [n, *shape]}``: the values of agents that acted, placeholders elsewhere
    (``fill[agent]``, else zeros)."""
    out: dict[str, npt.NDArray[Any]] = {}
    for i, a in enumerate(layout.agents):
        given = cast[name].get(a)  # [num_envs, *shape]
        mask = act[i]
        if given is not None and mask.all():  # acted in every env written: no placeholder
            # lanes are sorted distinct envs: as many as num_envs means all of them
            out[a] = given if given.shape[0] == lanes.size else given[lanes]
            continue
        field = layout.per_agent[spec_name][a]
        base = _placeholder(field, lanes.size) if fill is None else fill[a][lanes].copy()
        if given is not None:
            base[mask] = given[lanes][mask]
        out[a] = base
    return out


def _leaf_values(layout: AgentLayout, name: str, act: npt.NDArray[np.bool_],
                lanes: npt.NDArray[np.int64], cast: dict[str, dict[str, npt.NDArray[Any]]],
                fill: dict[str, npt.NDArray[Any]] | None, top: str = "obs"
                ) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """The observations ``name`` (``obs`` or ``next_obs``; with ``top="action"`` the
    actions, ``name`` ``"action"``) of the core call: nested ``{agent: [n, *shape] or
    {key: [n, *shape]}}`` and flat ``{leaf: [n, *shape]}`` (the same arrays), the
    agents' values where they acted, ``fill[leaf]`` elsewhere (None: zeros)."""
    index = {a: i for i, a in enumerate(layout.agents)}
    flat: dict[str, npt.NDArray[Any]] = {}
    nested: dict[str, Any] = {}
    for leaf, field in layout.per_agent[top].items():
        agent, _, key = leaf.partition(SEP)
        given = cast[name].get(leaf)  # [num_envs, *shape]
        mask = act[index[agent]]
        if given is not None and mask.all():  # acted in every env written
            value = given if given.shape[0] == lanes.size else given[lanes]
        else:
            value = _placeholder(field, lanes.size) if fill is None \
                else fill[leaf][lanes].copy()
            if given is not None:
                value[mask] = given[lanes][mask]
        flat[leaf] = value
        if key:
            nested.setdefault(agent, {})[key] = value
        else:
            nested[agent] = value
    return nested, flat


def _carry(layout: AgentLayout, episodes: Episodes) -> dict[str, npt.NDArray[Any]]:
    if episodes.carry:
        return episodes.carry
    n = episodes.alive.shape[1]
    return {a: _placeholder(f, n) for a, f in layout.per_agent["obs"].items()}


def _core_values(layout: AgentLayout, episodes: Episodes, act: npt.NDArray[np.bool_],
                 lanes: npt.NDArray[np.int64], cast: dict[str, dict[str, npt.NDArray[Any]]],
                 states: dict[str, npt.NDArray[Any]], joint: dict[str, npt.NDArray[Any]],
                 rewards: npt.NDArray[np.float32], term: npt.NDArray[np.bool_],
                 trunc: npt.NDArray[np.bool_], ends: Ends
                 ) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """The core ``add``'s keyword values, in the order of :meth:`AgentLayout.core_spec`,
    and the next observations stored per observation leaf."""
    carry = _carry(layout, episodes)
    obs, _ = _leaf_values(layout, "obs", act, lanes, cast, carry)
    nxt, stored_next = _leaf_values(layout, "next_obs", act, lanes, cast, carry)
    if states:
        obs[STATE] = states[STATE][lanes]
        nxt[STATE] = states["next_state"][lanes]
    total = np.zeros(lanes.size, np.float64)
    for r in rewards:  # in agent order, in float64: the documented joint reward
        total += r
    out: dict[str, Any] = {
        "obs": obs,
        "action": _leaf_values(layout, "action", act, lanes, cast, None, "action")[0],
        "reward": total.astype(np.float32),
        "next_obs": nxt,
        "terminated": ends.terminated,
        "truncated": ends.truncated,
    }
    agents = layout.agents
    flags = {"rewards": rewards, "terminations": term, "truncations": trunc, "active": act}
    for prefix in OUTCOMES:
        out[prefix] = {a: flags[prefix][i] for i, a in enumerate(agents)}
    for name in layout.extras:
        out[name] = _per_agent(layout, name, name, act, lanes, cast, None)
    for name, v in joint.items():
        out[name] = v[lanes]
    return out, stored_next



class _One:
    """``itemgetter`` of one key that still returns a tuple (picklable, unlike a lambda)."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __call__(self, d: Mapping[str, Any]) -> tuple[Any, ...]:
        return (d[self.key],)


class DirectAdd:
    """The common ``add`` of one layout, straight to the core's compiled write.

    The common call: every agent acts in every env (all six dicts hold every agent,
    ``active`` is None), no extras, no priority, next observations as numpy arrays, values
    without a lane dim when ``num_envs`` is 1. :meth:`write` checks what only the
    multi-agent boundary can see (the dicts and their agents, the state, no agent ended
    earlier in the episode), computes the joint values (the summed reward, the joint ends)
    and hands the core call, with the values as given, to the core's compiled writer,
    which checks and casts each of them under the rules of
    :meth:`~replaybank.spec.FieldSpec.cast` (those :func:`prepare` applies). Anything else
    (another kind of call, a value the compiled writer does not take, no compiled writer)
    returns False having changed nothing; the caller then takes :func:`prepare`, which
    raises its usual error or writes. Both ways store identical data.

    Args:
        layout: The buffer's layout.
        num_envs: The buffer's envs (lanes).

    Example:
        >>> import numpy as np
        >>> from replaybank.multiagent import MultiAgentReplayBuffer
        >>> buf = MultiAgentReplayBuffer(8, ["a", "b"], seed=0, spec={"obs": {
        ...     "a": ((2,), "float32"), "b": ((2,), "float32")}, "action": {
        ...     "a": ((), "int64"), "b": ((), "int64")}})
        >>> step = dict(obs={"a": np.zeros(2), "b": np.ones(2)}, action={"a": 1, "b": 0},
        ...     reward={"a": 1.0, "b": 0.5}, next_obs={"a": np.ones(2), "b": np.ones(2)},
        ...     terminated={"a": False, "b": False}, truncated={"a": False, "b": False})
        >>> direct = DirectAdd(buf.layout, 1)
        >>> direct.write(buf.buffer.write_route, buf._episodes, **step,
        ...              state=None, next_state=None)  # no compiled writer before a write
        False
        >>> buf.add(**step)
        >>> done = direct.write(buf.buffer.write_route, buf._episodes, **step,
        ...                     state=None, next_state=None)
        >>> len(buf) == (2 if done else 1)
        True
    """

    def __init__(self, layout: AgentLayout, num_envs: int) -> None:
        agents = layout.agents
        n = len(agents)
        self.layout = layout
        self._agents = agents
        self._n = n
        self._num_envs = num_envs
        self._pick: Callable[[Mapping[str, Any]], tuple[Any, ...]] = \
            itemgetter(*agents) if n > 1 else _One(agents[0])
        # (dict observations take prepare)
        self._plain = not layout.extras and not layout.joint and not layout.dict_obs \
            and not layout.dict_action  # (an action of parts, too)
        self._state = layout.state is not None
        #: The core extras' names: rewards/<agent>, ..., active/<agent> (OUTCOMES order).
        self._outcomes = tuple(f"{prefix}{SEP}{a}" for prefix in OUTCOMES for a in agents)
        self._bool_obs = tuple(a for a, f in layout.per_agent["obs"].items()
                               if f.dtype == np.bool_)
        self._none_ended = bytes(n * num_envs)
        self._all_alive = b"\x01" * (n * num_envs)
        #: Values' leading dims (one env: none; a lane dim of 1 takes prepare).
        self._lead: tuple[int, ...] = (num_envs,) if num_envs > 1 else ()
        self._shape = (1 + 3 * n, *self._lead)
        self._calm = bytes(np.zeros((2 * n, *self._lead), np.float32).nbytes)
        self._zero: Any = 0.0
        self._no_end: Any = False
        self._active: tuple[Any, ...] = (True,) * n
        if num_envs > 1:
            self._zero = np.zeros(num_envs, np.float32)
            self._no_end = np.zeros(num_envs, np.bool_)
            yes = np.ones(num_envs, np.bool_)
            self._zero.flags.writeable = self._no_end.flags.writeable = False
            yes.flags.writeable = False
            self._active = (yes,) * n

    def write(self, route: WriteRoute, episodes: Episodes, obs: Any, action: Any,
              reward: Any, next_obs: Any, terminated: Any, truncated: Any, state: Any,
              next_state: Any) -> bool:
        """Write one common joint step, or change nothing and return False.

        Args:
            route: The core buffer's write route (its compiled write).
            episodes: The buffer's episode bookkeeping (updated after the write).
            obs: As in ``add`` (so are the others).
            action: As in ``add``.
            reward: As in ``add``.
            next_obs: As in ``add``.
            terminated: As in ``add``.
            truncated: As in ``add``.
            state: As in ``add``.
            next_state: As in ``add``.

        Returns:
            True when the step was written (and recorded in ``episodes``); False when
            nothing changed (the call is for :func:`prepare`).
        """
        direct = route.direct
        n = self._n
        # six dicts of n values each; that they hold every agent: pick below, and for obs
        # and action the compiled writer (exact keys of plain dicts; a 'state' key in obs
        # leaves n keys with the state's)
        if (direct is not_handled or not self._plain
                or not isinstance(obs, dict) or len(obs) != n
                or not isinstance(action, dict) or len(action) != n
                or not isinstance(reward, dict) or len(reward) != n
                or not isinstance(next_obs, dict) or len(next_obs) != n
                or not isinstance(terminated, dict) or len(terminated) != n
                or not isinstance(truncated, dict) or len(truncated) != n
                or (state is None) == self._state or (next_state is None) == self._state
                or episodes.ended.tobytes() != self._none_ended):
            return False  # (an agent that ended acts again: prepare names it)
        pick = self._pick
        try:
            nxt, rewards = pick(next_obs), pick(reward)
            term, trunc = pick(terminated), pick(truncated)
            # the placeholders (none in a state loaded from a buffer before its first
            # add: prepare keeps none then)
            carry = pick(episodes.carry)
        except KeyError:  # another key in place of an agent
            return False
        for v in nxt:  # the bookkeeping copies them after the write: that cannot fail
            if not isinstance(v, np.ndarray):
                return False
        try:  # each value cast as FieldSpec.cast casts it where the compiled writer takes
            # it (the writer refuses the others, and prepare names them); row 0 is 0.0
            values = np.array((self._zero, *rewards, *term, *trunc), np.float32)
        except (TypeError, ValueError, RuntimeError):  # ragged, objects, grad tensors
            return False
        if values.shape != self._shape:  # [1 + 3 * n_agents, *lead]
            return False
        ends: tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]] | None = None
        if values.tobytes().endswith(self._calm):  # no flag set: the step ends nothing
            joint_terminated = joint_truncated = self._no_end
        else:  # (flags of other values than 0 and 1 are refused by the writer)
            # Episodes.ends where every agent acts and none had ended before
            flags = (values[n + 1:] != 0).reshape(2 * n, self._num_envs)  # [2n, envs]
            terminates, cuts = flags[:n], flags[n:]
            ended = terminates | cuts  # [n_agents, envs]
            over = ended.all(axis=0)  # [envs]: no agent left alive, the joint end
            # truncated, not terminated: some agent was cut off
            cut_off = (cuts > terminates).any(axis=0)  # [envs]
            joint_terminated = (over > cut_off).reshape(self._lead)
            joint_truncated = (over & cut_off).reshape(self._lead)
            ends = (ended, over)
        # the joint reward as prepare sums it: 0.0 + r_0 + r_1 + ... in float64, in agent
        # order, of the float32 rewards (the writer stores it as float32, as prepare does)
        total = np.add.accumulate(values[:n + 1], 0, np.float64)[n]
        core_obs, core_next = obs, next_obs
        if self._state:
            core_obs, core_next = dict(obs), dict(next_obs)
            core_obs[STATE] = state
            core_next[STATE] = next_state
        # (no strict=: it costs a fifth of a microsecond here, and the lengths match)
        extras = dict(zip(self._outcomes, (*rewards, *term, *trunc,  # noqa: B905
                                           *self._active)))
        if not direct(None, False, core_obs, action, total, core_next, joint_terminated,
                      joint_truncated, extras):
            return False
        for c, v in zip(carry, nxt):  # noqa: B905 - both n_agents long
            c[...] = v
        if ends is None:
            if episodes.alive.tobytes() != self._all_alive:
                episodes.alive[...] = True
        else:  # Episodes.commit of that step: an agent that ended is no longer alive; a
            # joint end resets the env (nobody ended, zero placeholders)
            ended, over = ends
            episodes.alive[...] = ~ended
            episodes.ended[...] = ended > over
            if over.any():
                for c in carry:
                    c[over] = 0
        for a in self._bool_obs:  # stored as canonical 0/1 bytes, as the writer stores them
            c = episodes.carry[a]
            np.not_equal(c.view(np.uint8), 0, out=c)
        return True
