"""Where each part of a joint step lives in the core buffer: the multi-agent field layout.

A :class:`~replaybank.multiagent.buffer.MultiAgentReplayBuffer` stores one joint step of
all agents of an env as one step of a core :class:`~replaybank.buffers.replay.ReplayBuffer`.
Its fields, named once here:

* ``obs/<agent>`` (and ``obs/state``, the global state): the core's dict observation, so
  every observation is stored once and ``next_obs/<agent>`` is exact (linked, or kept
  aside where the joint step does not continue bitwise);
* ``action/<agent>``: the core's dict action;
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaybank.errors import ArgumentError, SpecError, describe
from replaybank.spec import SEP, FieldSpec, Spec

__all__ = ["OUTCOMES", "RESERVED_NAMES", "STATE", "AgentLayout", "check_agents", "parse_spec"]

#: The key of the global state in the core's dict observation.
STATE = "state"
#: Per-agent outcome fields: prefix -> dtype.
OUTCOMES: dict[str, np.dtype[Any]] = {
    "rewards": np.dtype(np.float32), "terminations": np.dtype(np.bool_),
    "truncations": np.dtype(np.bool_), "active": np.dtype(np.bool_)}
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
        if top in ("obs", "action") and rest not in agents:
            raise SpecError(f"MultiAgentReplayBuffer(spec=...): {name!r} names no agent; "
                            f"the agents are {list(agents)}; use spec={{{top!r}: {{agent: "
                            "(shape, dtype)}}")
        if top in ("next_obs", "next_state", "reward", "terminated", "truncated", *OUTCOMES):
            raise SpecError(f"MultiAgentReplayBuffer(spec=...): {name!r} is not declared "
                            "(next observations are the next step's obs; rewards are float32 "
                            "and flags bool); describe obs, action, state and extras only")
        if top == STATE and rest:
            raise SpecError(f"MultiAgentReplayBuffer(spec=...): {name!r}: the state is one "
                            "array; use spec={'state': (shape, dtype)}")
        out[name] = field
    return out


@dataclass(frozen=True)
class AgentLayout:
    """The fields of one joint step: per-agent shapes and dtypes and the joint fields.

    Attributes:
        agents: Agent names, in the buffer's order.
        per_agent: Per-agent fields: ``{"obs": {agent: FieldSpec}, "action": {...},
            <extra>: {...}}`` (FieldSpec names are the flat core names ``obs/<agent>``).
        state: The global state's field (core name ``obs/state``), or None.
        joint: Joint extras by name.
    """

    agents: tuple[str, ...]
    per_agent: dict[str, dict[str, FieldSpec]]
    state: FieldSpec | None
    joint: dict[str, FieldSpec]

    @classmethod
    def build(cls, agents: tuple[str, ...], spec: Any, values: Mapping[str, Any],
              lead: tuple[int, ...]) -> AgentLayout:
        """The layout from a spec and (for what it leaves out) a first add's values.

        Args:
            agents: Agent names.
            spec: The user's spec (:func:`parse_spec` forms) or None.
            values: The first add's values: ``{"obs": {agent: v}, "action": {...},
                "state": v or None, <extra>: {agent: v} or v}``, each value
                ``[*lead, *shape]``.
            lead: The leading dims of the values (``()`` or ``(num_envs,)``).

        Raises:
            SpecError: An agent's field is neither in ``spec`` nor in ``values``.
        """
        given = parse_spec(spec, agents)
        per_agent: dict[str, dict[str, FieldSpec]] = {}
        names = ["obs", "action"]  # then the per-agent extras, in the order first seen
        for n, v in values.items():
            if n not in names and n != STATE and isinstance(v, Mapping):
                names.append(n)
        for n in given:
            top, _, rest = n.partition(SEP)
            if rest in agents and top not in names:
                names.append(top)
        for top in names:
            got = values.get(top) or {}
            fields: dict[str, FieldSpec] = {}
            for a in agents:
                flat = f"{top}{SEP}{a}"
                if flat in given:
                    fields[a] = FieldSpec(flat, given[flat].shape, given[flat].dtype)
                elif a in got:
                    fields[a] = FieldSpec.infer(flat, got[a], lead)
                else:
                    raise SpecError(
                        f"add({top}=...): agent {a!r} is not in the first add and spec= "
                        f"gives no {top!r} for it, so its shape and dtype are unknown; pass "
                        f"MultiAgentReplayBuffer(..., spec={{{top!r}: {{{a!r}: (shape, "
                        "dtype)}, ...}}) (e.g. from env.observation_space(agent) and "
                        "env.action_space(agent)), or include it in the first add")
            per_agent[top] = fields
        state: FieldSpec | None = None
        name = f"obs{SEP}{STATE}"
        if STATE in given:
            state = FieldSpec(name, given[STATE].shape, given[STATE].dtype)
        elif values.get(STATE) is not None:
            state = FieldSpec.infer(name, values[STATE], lead)
        joint: dict[str, FieldSpec] = {}
        for n, f in given.items():
            top, _, rest = n.partition(SEP)
            if top not in per_agent and top != STATE:
                joint[n] = f
        for n, v in values.items():
            if n not in per_agent and n != STATE and n not in joint and v is not None:
                joint[n] = FieldSpec.infer(n, v, lead)
        return cls(agents, per_agent, state, joint)

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
