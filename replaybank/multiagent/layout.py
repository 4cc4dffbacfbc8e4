"""Where each part of a joint step lives in the core buffer: the multi-agent field layout.

A :class:`~replaybank.multiagent.buffer.MultiAgentReplayBuffer` stores one joint step of
all agents of an env as one step of a core :class:`~replaybank.buffers.replay.ReplayBuffer`.
Its fields, named once here:

* ``obs/<agent>`` (and ``obs/state``, the global state): the core's dict observation, so
  every observation is stored once and ``next_obs/<agent>`` is exact (linked, or kept
  aside where the joint step does not continue bitwise); an agent with dict
  observations (one level of keys, e.g. PettingZoo's ``{"observation", "action_mask"}``)
  has one field per key, ``obs/<agent>/<key>`` (the core's nested dict observation):
  ``per_agent["obs"]`` is then keyed by *observation leaf* (``<agent>`` for a flat
  observation, ``<agent>/<key>`` for each key of a dict one; :meth:`AgentLayout.obs_keys`);
* ``action/<agent>``: the core's dict action; an agent whose action comes in parts (a
  gymnasium ``Tuple`` space's, arranged as ``rb.collect`` arranges it: ``{'0': ...,
  '1': ...}``; or a ``Dict`` space's keys) has one field per part,
  ``action/<agent>/<key>``, and ``per_agent["action"]`` is keyed by *action leaf* as
  ``per_agent["obs"]`` is (:meth:`AgentLayout.keys`);
* ``rewards/<agent>`` float32, ``terminations/<agent>``, ``truncations/<agent>`` and
  ``active/<agent>`` bool: per-agent outcomes, named as PettingZoo's ``step`` returns them
  (plural names, so they never collide with the core's joint ``reward``,
  ``terminated`` and ``truncated`` leaves when a batch is unflattened);
* ``<name>/<agent>`` for a per-agent extra (a dict keyed by agents), ``<name>`` for a
  joint extra;
* ``reward``, ``terminated``, ``truncated``: the joint ones (sum of rewards; the joint
  episode's end, see :mod:`replaybank.multiagent.episodes`).

Shapes: each agent field's item shape is its own (agents may differ); storage is
``[T, num_envs, *shape]`` as in the core.

Example:
    >>> import numpy as np
    >>> layout = AgentLayout.build(("a", "b"), {"obs": {"a": ((3,), "float32"),
    ...     "b": ((2,), "float32")}, "action": {"a": ((), "int64"), "b": ((), "int64")}},
    ...     {}, ())
    >>> list(layout.core_spec())[:4]
    ['obs/a', 'obs/b', 'action/a', 'action/b']
    >>> layout.user_spec()["obs/b"]
    {'shape': [2], 'dtype': 'float32'}
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaybank.errors import ArgumentError, SpecError, describe
from replaybank.spec import SEP, FieldSpec, Spec

__all__ = ["OUTCOMES", "PARTED", "RESERVED_NAMES", "STATE", "AgentLayout", "check_agents",
           "check_first_add_fields", "missing_spec_error", "obs_leaf", "parse_spec",
           "unknown_fields"]

#: The key of the global state in the core's dict observation.
STATE = "state"
#: Per-agent outcome fields: prefix -> dtype.
OUTCOMES: dict[str, np.dtype[Any]] = {
    "rewards": np.dtype(np.float32), "terminations": np.dtype(np.bool_),
    "truncations": np.dtype(np.bool_), "active": np.dtype(np.bool_)}
#: The per-agent fields whose value may be a dict of parts, stored one field per part
#: (``<top>/<agent>/<key>``): a dict observation, and an action of parts (a gymnasium
#: ``Tuple`` space's ``{'0': ..., '1': ...}``, or a ``Dict`` space's keys).
PARTED = ("obs", "action")
#: Names no extra may take (the layout's own, the core's standard ones, ``add``'s
#: arguments).
RESERVED_NAMES = frozenset({"obs", "next_obs", "action", "reward", "terminated", "truncated",
                            "state", "next_state", "env_ids", "priority", "discounts",
                            *OUTCOMES})


def check_agents(agents: Any) -> tuple[str, ...]:
    """The agent names, checked: a non-empty sequence of distinct field-name strings.

    Raises:
        ArgumentError: Not a sequence of strings, empty, duplicates, ``"state"``, or a
            name with ``/``.

    Example:
        >>> check_agents(["agent_0", "agent_1"])
        ('agent_0', 'agent_1')
    """
    fix = "pass agents=['agent_0', 'agent_1', ...] (e.g. env.possible_agents)"
    if isinstance(agents, (str, bytes)) or not isinstance(agents, Sequence) or not agents:
        raise ArgumentError(f"MultiAgentReplayBuffer(agents={describe(agents)}): expected a "
                            f"non-empty list of agent names; {fix}")
    names = tuple(agents)
    for a in names:
        if not isinstance(a, str) or not a or SEP in a or a == STATE:
            raise ArgumentError(
                f"MultiAgentReplayBuffer(agents=...): agent name {a!r} is not allowed: names "
                f"are non-empty strings without {SEP!r}, and {STATE!r} is the global state's "
                "key; rename the agent")
    if len(set(names)) != len(names):
        dup = sorted({a for a in names if names.count(a) > 1})
        raise ArgumentError(f"MultiAgentReplayBuffer(agents={list(names)}): {dup} given "
                            "twice; give each agent once")
    return names


def obs_leaf(name: str, agents: tuple[str, ...]) -> tuple[str, str | None] | None:
    """``(agent, key)`` of an observation leaf name (``<agent>`` or ``<agent>/<key>``:
    key None for a flat observation), or None when it names no agent.

    Example:
        >>> obs_leaf("b/action_mask", ("a", "b")), obs_leaf("a", ("a",)), obs_leaf("c", ("a",))
        (('b', 'action_mask'), ('a', None), None)
    """
    if name in agents:
        return name, None
    agent, _, key = name.partition(SEP)
    if agent in agents and key and SEP not in key:
        return agent, key
    return None


def parse_spec(spec: Any, agents: tuple[str, ...]) -> dict[str, FieldSpec]:
    """The user's ``spec=`` as flat fields, each name checked against the layout.

    Accepts ``{"obs": {agent: (shape, dtype)}, "action": {...}, "state": (shape, dtype),
    <extra>: {agent: ...} or (shape, dtype)}`` or its flat form (``"obs/<agent>"``: what
    :meth:`AgentLayout.user_spec` and configs hold). What it leaves out is inferred from
    the first add (:meth:`AgentLayout.build`).

    Raises:
        SpecError: A bad entry, an unknown agent, or a reserved name.
    """
    if spec is None:
        return {}
    flat = Spec.coerce(spec)
    out: dict[str, FieldSpec] = {}
    for name, field in flat.items():
        top, _, rest = name.partition(SEP)
        if top in PARTED and obs_leaf(rest, agents) is None \
                and rest.partition(SEP)[0] in agents:
            what = "observation" if top == "obs" else "action"
            raise SpecError(f"MultiAgentReplayBuffer(spec=...): {name!r} is a nested key of "
                            f"the dict {what} of agent {rest.partition(SEP)[0]!r}; dict "
                            f"{what}s have one level of keys in a multi-agent buffer: "
                            f"flatten the deeper ones (e.g. spec={{{top!r}: {{agent: "
                            "{'<key>_<subkey>': (shape, dtype)}}})")
        if top in PARTED and obs_leaf(rest, agents) is None:
            raise SpecError(f"MultiAgentReplayBuffer(spec=...): {name!r} names no agent; "
                            f"the agents are {list(agents)}; use spec={{{top!r}: {{agent: "
                            "(shape, dtype)}} (or {agent: {key: (shape, dtype)}} for "
                            + ("a dict observation)" if top == "obs" else
                               "an action of parts: a gymnasium Tuple space's '0', '1', "
                               "..., or a Dict space's keys)"))
        if top in ("next_obs", "next_state", "reward", "terminated", "truncated", *OUTCOMES):
            raise SpecError(f"MultiAgentReplayBuffer(spec=...): {name!r} is not declared "
                            "(next observations are the next step's obs; rewards are float32 "
                            "and flags bool); describe obs, action, state and extras only")
        if top == STATE and rest:
            raise SpecError(f"MultiAgentReplayBuffer(spec=...): {name!r}: the state is one "
                            "array; use spec={'state': (shape, dtype)}")
        out[name] = field
    for name in out:  # an agent's observation (action) is one array or a dict, not both
        top, _, rest = name.partition(SEP)
        if top in PARTED and rest in agents and any(
                n.startswith(f"{name}{SEP}") for n in out):
            what = "observation" if top == "obs" else "action"
            raise SpecError(f"MultiAgentReplayBuffer(spec=...): {name!r} is given both as "
                            "one array and as a dict of keys; describe the agent's "
                            f"{what} one way")
    return out


@dataclass(frozen=True)
class AgentLayout:
    """The fields of one joint step: per-agent shapes and dtypes and the joint fields.

    Attributes:
        agents: Agent names, in the buffer's order.
        per_agent: Per-agent fields: ``{"obs": {leaf: FieldSpec}, "action": {leaf:
            FieldSpec}, <extra>: {agent: ...}}`` (FieldSpec names are the flat core names
            ``obs/<agent>``, ``obs/<agent>/<key>``; observation leaves: ``<agent>`` or
            ``<agent>/<key>``, agent-major, see the module docstring).
        state: The global state's field (core name ``obs/state``), or None.
        joint: Joint extras by name.
    """

    agents: tuple[str, ...]
    per_agent: dict[str, dict[str, FieldSpec]]
    state: FieldSpec | None
    joint: dict[str, FieldSpec]

    @classmethod
    def build(cls, agents: tuple[str, ...], spec: Any, values: Mapping[str, Any],
              lead: tuple[int, ...], dict_obs: bool = False,
              owner: str = "MultiAgentReplayBuffer",
              scalars: Collection[str] = ()) -> AgentLayout:
        """The layout from a spec and (for what it leaves out) a first add's values.

        Args:
            agents: Agent names.
            spec: The user's spec (:func:`parse_spec` forms) or None.
            values: The first add's values: ``{"obs": {agent: v}, "action": {...},
                "state": v or None, <extra>: {agent: v} or v}``, each value
                ``[*lead, *shape]``.
            lead: The leading dims of the values (``()`` or ``(num_envs,)``).
            dict_obs: A dict observation (or action) in ``values`` makes the agent's
                observation (action) a dict one (``obs/<agent>/<key>``,
                ``action/<agent>/<key>`` fields); otherwise it is inferred as one array
                (and refused). ``spec`` entries ``obs/<agent>/<key>`` (``action/...``)
                always describe a dict one.
            owner: The buffer class, for the message of a missing entry.
            scalars: Per-agent fields that hold one float per step (the rollout's
                ``log_prob`` and ``value``), for the example of a missing entry.

        Raises:
            SpecError: An agent's field is neither in ``spec`` nor in ``values``
                (:func:`missing_spec_error`).
        """
        given = parse_spec(spec, agents)
        per_agent: dict[str, dict[str, FieldSpec]] = {}
        # the per-agent arguments of the first add -> the agents they hold
        present = {n: tuple(v) for n, v in values.items()
                   if n != STATE and isinstance(v, Mapping)}
        missing = _unknown(agents, given, present)
        if missing:
            raise missing_spec_error(owner, missing, scalars)
        for top in _per_agent_names(agents, given, present):
            got = values.get(top) or {}
            fields: dict[str, FieldSpec] = {}
            for a in agents:
                flat = f"{top}{SEP}{a}"
                if top in PARTED:
                    leaves = _leaves(top, a, given, got.get(a) if dict_obs else None, lead)
                    if leaves is not None:
                        fields.update(leaves)
                        continue
                if flat in given:
                    fields[a] = FieldSpec(flat, given[flat].shape, given[flat].dtype)
                else:  # (in the first add: _unknown said so)
                    fields[a] = FieldSpec.infer(flat, got[a], lead, f"{top}[{a!r}]")
            per_agent[top] = fields
        state: FieldSpec | None = None
        name = f"obs{SEP}{STATE}"
        if STATE in given:
            state = FieldSpec(name, given[STATE].shape, given[STATE].dtype)
        elif values.get(STATE) is not None:
            state = FieldSpec.infer(name, values[STATE], lead, STATE)
        joint: dict[str, FieldSpec] = {}
        for n, f in given.items():
            top = n.partition(SEP)[0]
            if top not in per_agent and top != STATE:
                joint[n] = f
        for n, v in values.items():
            if n not in per_agent and n != STATE and n not in joint and v is not None:
                joint[n] = FieldSpec.infer(n, v, lead)
        return cls(agents, per_agent, state, joint)

    def obs_keys(self, agent: str) -> tuple[str, ...] | None:
        """The keys of ``agent``'s dict observation, or None for a flat one."""
        return self.keys("obs", agent)

    def keys(self, top: str, agent: str) -> tuple[str, ...] | None:
        """The keys of ``agent``'s value of the field ``top`` stored part by part
        (``obs``: a dict observation; ``action``: an action of parts, e.g. a gymnasium
        ``Tuple`` space's ``'0'``, ``'1'``, ...), or None for one array.

        Example:
            >>> lay = AgentLayout.build(("a", "b"), {"obs": {"a": ((), "float32"),
            ...     "b": ((), "float32")}, "action": {"a": {"0": ((), "int64"),
            ...     "1": ((2,), "float32")}, "b": ((), "int64")}}, {}, ())
            >>> lay.keys("action", "a"), lay.keys("action", "b"), lay.dict_action
            (('0', '1'), None, True)
        """
        per = self.per_agent[top]
        if agent in per:
            return None
        return tuple(leaf[len(agent) + 1:] for leaf in per
                     if leaf.startswith(f"{agent}{SEP}"))

    def leaves(self, top: str, agent: str) -> dict[str, FieldSpec]:
        """``{leaf: FieldSpec}`` of ``agent``'s value of the per-agent field ``top``: one
        leaf ``<agent>``, or ``<agent>/<key>`` per part of a value stored part by part
        (:meth:`keys`)."""
        per = self.per_agent[top]
        if agent in per:
            return {agent: per[agent]}
        head = f"{agent}{SEP}"
        return {leaf: f for leaf, f in per.items() if leaf.startswith(head)}

    @property
    def dict_obs(self) -> bool:
        """Some agent has dict observations."""
        return any(a not in self.per_agent["obs"] for a in self.agents)

    @property
    def dict_action(self) -> bool:
        """Some agent's action is stored part by part (``action/<agent>/<key>``)."""
        return any(a not in self.per_agent["action"] for a in self.agents)

    def core_spec(self) -> Spec:
        """The core buffer's spec, in the order the core infers it from an add."""
        fields = [*self.per_agent["obs"].values()]
        if self.state is not None:
            fields.append(self.state)
        fields.extend(self.per_agent["action"].values())
        fields.append(FieldSpec("reward", (), np.dtype(np.float32)))
        fields.append(FieldSpec("terminated", (), np.dtype(np.bool_)))
        fields.append(FieldSpec("truncated", (), np.dtype(np.bool_)))
        for prefix, dtype in OUTCOMES.items():
            fields.extend(FieldSpec(f"{prefix}{SEP}{a}", (), dtype) for a in self.agents)
        for top, per in self.per_agent.items():
            if top not in ("obs", "action"):
                fields.extend(per.values())
        fields.extend(self.joint.values())
        return Spec(fields)

    @property
    def extras(self) -> tuple[str, ...]:
        """Names of the per-agent extras."""
        return tuple(t for t in self.per_agent if t not in ("obs", "action"))

    def user_spec(self) -> dict[str, Any]:
        """The flat JSON spec the user would pass to rebuild this layout (for configs)."""
        fields = [f for per in self.per_agent.values() for f in per.values()]
        if self.state is not None:
            fields.append(FieldSpec(STATE, self.state.shape, self.state.dtype))
        fields.extend(self.joint.values())
        return Spec(fields).to_json()


def _per_agent_names(agents: tuple[str, ...], given: Mapping[str, FieldSpec],
                     present: Mapping[str, Collection[str]]) -> list[str]:
    """The per-agent fields: obs, action, then the per-agent extras of the first add
    (in its order), then those only ``spec`` gives."""
    names = ["obs", "action"]
    names.extend(n for n in present if n not in names)
    for n in given:
        top, _, rest = n.partition(SEP)
        if rest in agents and top not in names:
            names.append(top)
    return names


def _unknown(agents: tuple[str, ...], given: Mapping[str, FieldSpec],
             present: Mapping[str, Collection[str]]) -> dict[str, list[str]]:
    """``{field: [agent, ...]}``: the per-agent fields whose shape and dtype neither the
    parsed spec ``given`` nor the first add (``present``: per-agent argument -> the
    agents it holds) gives, in the buffer's order."""
    out: dict[str, list[str]] = {}
    for top in _per_agent_names(agents, given, present):
        have = present.get(top, ())
        for a in agents:
            flat = f"{top}{SEP}{a}"
            if a in have or flat in given or (top in PARTED and any(
                    n.startswith(f"{flat}{SEP}") for n in given)):
                continue
            out.setdefault(top, []).append(a)
    return out


def unknown_fields(agents: tuple[str, ...], spec: Any,
                   present: Mapping[str, Collection[str]]) -> dict[str, list[str]]:
    """The per-agent fields a first add holding only the agents ``present`` names would
    leave unknown: ``{field: [agent, ...]}``, empty when ``spec`` gives them all.

    Args:
        agents: The buffer's agents.
        spec: The user's ``spec=`` (:func:`parse_spec` forms) or None.
        present: Per-agent argument of the first add (``"obs"``, ``"action"`` and the
            per-agent extras) -> the agents it will hold.

    Example:
        >>> unknown_fields(("a", "c"), {"obs": {"c": ((2,), "float32")}},
        ...                {"obs": ["a"], "action": ["a"], "log_prob": ["a"]})
        {'action': ['c'], 'log_prob': ['c']}
    """
    return _unknown(agents, parse_spec(spec, agents), present)


def check_first_add_fields(owner: str, agents: tuple[str, ...], spec: Any,
                           acting: Collection[str], per_agent: Collection[str],
                           call: str) -> None:
    """Raise the :class:`~replaybank.errors.SpecError` of a first add that holds only the
    agents ``acting`` (in its per-agent arguments ``per_agent``) and so leaves fields of
    the other agents unknown (``spec`` does not give them); the one check of
    ``MultiAgentReplayBuffer.check_first_add`` and of the service's multi-agent client.

    Example:
        >>> spec = {"obs": {"c": ((2,), "float32")}, "action": {"c": ((), "int64")}}
        >>> check_first_add_fields("B", ("a", "c"), spec, ["a"], ["obs", "action"], "add")
    """
    missing = unknown_fields(agents, spec, {name: tuple(acting) for name in per_agent})
    if missing:
        raise missing_spec_error(owner, missing, call=call)


def missing_spec_error(owner: str, missing: Mapping[str, Sequence[str]],
                       scalars: Collection[str] = (), call: str = "add") -> SpecError:
    """The error of a first add that leaves fields of absent agents unknown, naming the
    ``spec=`` entries to add with a complete example.

    Args:
        owner: The buffer class (``"MultiAgentRolloutBuffer"``).
        missing: ``{field: [agent, ...]}`` (:func:`unknown_fields`).
        scalars: Fields that hold one float per step (example ``((), 'float32')``).
        call: The call the error names (``add``; ``check_first_add``, or a collector's
            ``collect``, when the first add is checked before it is made).

    Example:
        >>> print(missing_spec_error("B", {"obs": ["c"], "log_prob": ["c"]}, ["log_prob"]))
        add(obs=..., log_prob=...): agent 'c' is not in the first add and spec= gives no 'obs' or 'log_prob' for it, so those shapes and dtypes are unknown; add to spec: B(..., spec={..., 'obs': {'c': (shape, dtype)}, 'log_prob': {'c': ((), 'float32')}}) (log_prob: one float per step; env.observation_space(agent) gives the shape and dtype), or include agent 'c' in the first add
    """  # noqa: E501
    who = list(dict.fromkeys(a for agents in missing.values() for a in agents))
    named = f"agent {who[0]!r}" if len(who) == 1 else f"agents {who}"

    def example(top: str) -> str:
        return "((), 'float32')" if top in scalars else "(shape, dtype)"

    entries = ", ".join(f"{top!r}: {{" + ", ".join(f"{a!r}: {example(top)}" for a in agents)
                        + "}" for top, agents in missing.items())
    floats = [top for top in missing if top in scalars]
    notes = [f"{' and '.join(floats)}: one float per step"] if floats else []
    spaces = [f"env.{top.replace('obs', 'observation')}_space(agent)"
              for top in ("obs", "action") if top in missing]
    if spaces:
        notes.append(f"{' and '.join(spaces)} give{'s' if len(spaces) == 1 else ''} the "
                     "shape and dtype")
    if any(top not in scalars and top not in ("obs", "action") for top in missing):
        notes.append("an extra: the shape and dtype of one agent's value")
    return SpecError(
        f"{call}({', '.join(f'{top}=...' for top in missing)}): {named} "
        f"{'is' if len(who) == 1 else 'are'} not in the first add and spec= gives no "
        f"{' or '.join(repr(top) for top in missing)} for {'it' if len(who) == 1 else 'them'}"
        ", so those shapes and dtypes are unknown; add to spec: "
        f"{owner}(..., spec={{..., {entries}}}) ({'; '.join(notes)}), or include {named} "
        "in the first add")


def _leaves(top: str, agent: str, given: Mapping[str, FieldSpec], value: Any,
            lead: tuple[int, ...]) -> dict[str, FieldSpec] | None:
    """The leaves ``{<agent>/<key>: FieldSpec}`` of ``agent``'s value of ``top`` stored
    part by part (a dict observation, an action of parts; from ``spec`` entries
    ``<top>/<agent>/<key>``, else from a dict first value), or None for one array.

    Raises:
        SpecError: A dict value with no keys, a key that is no field name, or a nested
            dict (one level of keys).
    """
    prefix = f"{top}{SEP}{agent}"
    if prefix in given:
        return None
    from_spec = {n: f for n, f in given.items() if n.startswith(f"{prefix}{SEP}")}
    if from_spec:
        return {n[len(top) + 1:]: FieldSpec(n, f.shape, f.dtype)
                for n, f in from_spec.items()}
    if not isinstance(value, Mapping):
        return None
    what = "observation" if top == "obs" else "action"
    if not value:
        raise SpecError(f"add({top}[{agent!r}]={{}}): an empty dict {what}; pass an "
                        "array, or a dict {key: array} with at least one key")
    out: dict[str, FieldSpec] = {}
    for key, v in value.items():
        if not isinstance(key, str) or not key or SEP in key:
            raise SpecError(f"add({top}[{agent!r}]=...): key {key!r} is not allowed: keys of "
                            f"a dict {what} are non-empty strings without {SEP!r}")
        if isinstance(v, Mapping):
            raise SpecError(f"add({top}[{agent!r}][{key!r}]=...): a nested dict; dict "
                            f"{what}s have one level of keys in a multi-agent buffer "
                            "(flatten the deeper ones, e.g. '<key>_<subkey>' keys, or "
                            "gymnasium.spaces.flatten that part)")
        out[f"{agent}{SEP}{key}"] = FieldSpec.infer(f"{prefix}{SEP}{key}", v, lead,
                                                    f"{top}[{agent!r}][{key!r}]")
    return out
