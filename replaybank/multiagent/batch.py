"""Typed, frozen multi-agent sample containers: a core batch unpacked per agent.

A :class:`MultiAgentBatch` holds joint transitions: per agent ``obs[agent]``,
``next_obs[agent]`` (``{key: [B, *shape]}`` for an agent with dict observations),
``action[agent]`` ``[B, *shape]`` (each agent its own shape; ``{key: [B, *shape]}``
for an agent whose action is stored part by part, a gymnasium ``Tuple`` action's
``'0'``, ``'1'``, ...) and
``reward[agent]``, ``terminated[agent]``, ``truncated[agent]``, ``active[agent]`` ``[B]``;
the global ``state``/``next_state``; the joint ``joint_reward``, ``joint_terminated``,
``joint_truncated`` (``done`` is their ``or``); ``indices`` for ``update_priorities`` and,
from a prioritized sampler, ``weights``. A :class:`MultiAgentSequenceBatch` holds
``[B, L, *shape]`` windows with the core's ``mask``, ``is_first``, ``is_last``,
``is_terminal``, ``burn_in`` and ``starts``.

An agent that did not act at a step (``active[agent]`` False) shows zeros as its
``obs``, ``next_obs`` and ``action`` there, reward 0 and no end. The core batch is kept
as :attr:`MultiAgentBatch.core` (flat names, see :mod:`replaybank.multiagent.layout`);
a transition batch's per-agent values are the core batch's own arrays (no copy), except
the ``obs`` and ``next_obs`` of an agent that did not act at some step (new arrays with
those zeros).
Values are numpy arrays, or torch tensors when the buffer's storage is torch or after
:meth:`MultiAgentBatch.to_torch`.

Example:
    >>> import numpy as np
    >>> from replaybank.batch import Batch
    >>> core = Batch({"obs/a": np.ones((2, 3)), "obs/b": np.ones((2, 3)),
    ...     "next_obs/a": np.ones((2, 3)), "next_obs/b": np.ones((2, 3)),
    ...     "action/a": np.zeros(2), "action/b": np.zeros(2), "reward": np.ones(2),
    ...     "terminated": np.zeros(2, bool), "truncated": np.zeros(2, bool),
    ...     "rewards/a": np.ones(2), "rewards/b": np.zeros(2),
    ...     "terminations/a": np.zeros(2, bool), "terminations/b": np.zeros(2, bool),
    ...     "truncations/a": np.zeros(2, bool), "truncations/b": np.zeros(2, bool),
    ...     "active/a": np.array([True, True]), "active/b": np.array([True, False]),
    ...     "indices": np.arange(2)})
    >>> b = MultiAgentBatch.from_core(core, ("a", "b"))
    >>> b.obs["b"][:, 0].tolist(), b.stacked("obs").shape
    ([1.0, 0.0], (2, 2, 3))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeVar

import numpy as np

from replaybank.batch import Batch, SequenceBatch
from replaybank.errors import ShapeError, require_extra
from replaybank.host import as_numpy
from replaybank.multiagent.nstep import AGENT_DISCOUNT
from replaybank.spec import SEP

__all__ = ["MultiAgentBatch", "MultiAgentEpisodeBatch", "MultiAgentSequenceBatch", "stack_agents"]

#: Per-agent fields of every batch: batch attribute -> core field prefix.
AGENT_FIELDS = {"obs": "obs", "next_obs": "next_obs", "action": "action",
                "reward": "rewards", "terminated": "terminations",
                "truncated": "truncations", "active": "active"}
_JOINT = {"joint_reward": "reward", "joint_terminated": "terminated",
          "joint_truncated": "truncated"}
_B = TypeVar("_B", bound="_AgentFields")


def _zero_inactive(x: Any, active: Any, everywhere: bool = False) -> Any:
    """``x`` ``[B, (L,) *shape]`` with zeros where ``active`` ``[B, (L)]`` is False.

    A new array (a sequence batch's ``obs``/``next_obs`` may be read-only views, a frame
    stack's overlapping ones), except that ``x`` itself comes back when ``everywhere``
    (``active`` is True at every step of a transition batch) and ``x`` is a numpy array
    that owns its memory (gathered for this batch alone): nothing to zero then."""
    if everywhere and isinstance(x, np.ndarray) and x.base is None:
        return x
    mask = active.reshape(tuple(active.shape) + (1,) * (x.ndim - active.ndim))
    if isinstance(x, np.ndarray):
        return np.where(mask, x, np.zeros((), x.dtype))
    return x.masked_fill(~mask, 0)  # a torch tensor


def stack_agents(per: Any, name: str, all_agents: tuple[str, ...], agents: Any, lead: int,
                 fields: tuple[str, ...] = ()) -> Any:
    """The values ``per[agent]`` of ``agents`` (default: ``all_agents``) stacked on axis
    ``lead``: ``[*lead_dims, n_agents, *shape]`` (numpy, or torch for tensors).

    Args:
        per: ``{agent: [*lead_dims, *shape]}`` (anything else: ``name`` is not a per-agent
            field).
        name: The field's name, for messages.
        all_agents: Every agent of the batch, in order.
        agents: The agents to stack, in order, or None for all.
        lead: The number of leading batch dims (1: ``[B]``; 2: ``[B, L]``).
        fields: The batch's field names, for the message when ``per`` is not a dict.

    Dict observations (``{key: [*lead_dims, *shape]}`` per agent) stack per key:
    ``{key: [*lead_dims, n_agents, *shape]}``, when every agent stacked has the same keys.

    Raises:
        KeyError: Not a per-agent field, an unknown agent, or none.
        ShapeError: The agents' shapes or dtypes differ (or their dict keys, or some
            observe a dict and others an array).

    Example:
        >>> stack_agents({"a": np.zeros((4, 2)), "b": np.ones((4, 2))}, "obs", ("a", "b"),
        ...              None, 1).shape
        (4, 2, 2)
    """
    if not isinstance(per, dict):
        raise KeyError(f"stacked({name!r}): not a per-agent field; use one of {list(fields)}")
    names = list(all_agents if agents is None else agents)
    unknown = [a for a in names if a not in per]
    if unknown or not names:
        raise KeyError(f"stacked({name!r}, agents={names}): unknown agents {unknown}; "
                       f"the agents are {list(all_agents)}")
    values = [per[a] for a in names]
    if any(isinstance(v, dict) for v in values):  # dict observations: stacked per key
        keys = {a: tuple(per[a]) if isinstance(per[a], dict) else None for a in names}
        if len(set(keys.values())) > 1:
            raise ShapeError(
                f"stacked({name!r}): the agents' {name} differ in kind or keys {keys} (None: "
                "one array); stack agents with the same dict keys (pass agents=[...]) or "
                f"read batch.{name}[agent] per agent")
        return {k: stack_agents({a: per[a][k] for a in names}, f"{name}[{k!r}]", all_agents,
                                names, lead) for k in values[0]}
    kinds = {(tuple(v.shape[lead:]), str(v.dtype)) for v in values}
    if len(kinds) > 1:
        shown = {a: (tuple(per[a].shape[lead:]), str(per[a].dtype)) for a in names}
        raise ShapeError(
            f"stacked({name!r}): the agents' {name} differ in shape or dtype {shown}; "
            "stack agents that share a space (pass agents=[...]) or read "
            f"batch.{name}[agent] per agent")
    if isinstance(values[0], np.ndarray):
        return np.stack(values, axis=lead)
    torch = require_extra("torch", "torch")
    return torch.stack(values, dim=lead)


@dataclass(frozen=True)
class _AgentFields:
    """What both batch kinds hold (see the module docstring)."""

    agents: tuple[str, ...]
    obs: dict[str, Any]
    next_obs: dict[str, Any]
    action: dict[str, Any]
    reward: dict[str, Any]
    terminated: dict[str, Any]
    truncated: dict[str, Any]
    active: dict[str, Any]
    state: Any
    next_state: Any
    joint_reward: Any
    joint_terminated: Any
    joint_truncated: Any
    extras: dict[str, Any]
    weights: Any
    probabilities: Any
    core: Any = field(repr=False)

    @classmethod
    def _unpack(cls, data: Mapping[str, Any], agents: tuple[str, ...],
                fresh: bool = False) -> dict[str, Any]:
        """The constructor values of the per-agent and joint fields from core fields
        (``fresh``: the core's arrays were gathered for this batch alone, see
        :func:`_zero_inactive`)."""
        plan = _plan(agents, tuple(data))
        out: dict[str, Any] = {"agents": agents}
        for attr, pairs in plan.fields:
            out[attr] = {a: data[name] for a, name in pairs}
        # actions: one array per agent, or a dict of parts (a Tuple action's '0', '1', ...)
        out["action"] = {a: data[name] if isinstance(name, str)
                         else {k: data[n] for k, n in name} for a, name in plan.actions}
        active = out["active"]
        # agents active at every step of a transition batch (stored flags are canonical
        # 0/1 bytes): their observations need no zeros
        everywhere = {a: fresh and isinstance(v, np.ndarray) and b"\x00" not in v.tobytes()
                      for a, v in active.items()}
        for attr, obs_pairs in plan.observations:
            out[attr] = {a: _zero_inactive(data[name], active[a], everywhere[a])
                         if isinstance(name, str) else  # a dict observation: per key
                         {k: _zero_inactive(data[n], active[a], everywhere[a])
                          for k, n in name}
                         for a, name in obs_pairs}
        out["state"] = data.get(f"obs{SEP}state")
        out["next_state"] = data.get(f"next_obs{SEP}state")
        for attr, name in _JOINT.items():
            out[attr] = data[name]
        out["weights"] = data.get("weights")
        out["probabilities"] = data.get("probabilities")
        extras: dict[str, Any] = {}
        for name, top, agent in plan.extras:
            if agent is None:
                extras[name] = data[name]
            else:
                extras.setdefault(top, {})[agent] = data[name]
        out["extras"] = extras
        return out

    @classmethod
    def _made(cls: type[_B], values: dict[str, Any]) -> _B:
        """The instance holding ``values``, one per field (every field: the caller's
        promise), set at once rather than by the generated ``__init__``'s one
        ``object.__setattr__`` per field (two microseconds of every ``sample``)."""
        obj = object.__new__(cls)
        obj.__dict__.update(values)
        return obj

    @property
    def done(self) -> Any:
        """The joint ``terminated | truncated``."""
        return self.joint_terminated | self.joint_truncated

    @property
    def n_agents(self) -> int:
        """Number of agents."""
        return len(self.agents)

    def stacked(self, name: str, agents: Any = None) -> Any:
        """A per-agent field stacked over agents, for parameter sharing.

        Args:
            name: ``"obs"``, ``"next_obs"``, ``"action"``, ``"reward"``, ``"terminated"``,
                ``"truncated"``, ``"active"`` or a per-agent extra.
            agents: The agents to stack, in order (default: all).

        Returns:
            ``[B, n_agents, *shape]`` (``[B, L, n_agents, *shape]`` for sequences); for
            dict observations ``{key: [B, n_agents, *shape]}`` (every agent stacked must
            have the same keys).

        Raises:
            KeyError: No such per-agent field.
            ShapeError: The agents' shapes or dtypes differ (or their observation kinds
                or dict keys).
        """
        per = getattr(self, name) if name in AGENT_FIELDS else self.extras.get(name)
        return stack_agents(per, name, self.agents, agents, self._lead,
                            (*AGENT_FIELDS, *self.extras))

    #: Leading batch dims (1: ``[B]``; 2: ``[B, L]``).
    _lead = 1

    @property
    def batch_size(self) -> int:
        """Leading dimension B."""
        return int(self.joint_reward.shape[0])

    def _rebuilt(self: _B, core: Any) -> _B:
        return type(self).from_core(core, self.agents)  # type: ignore[attr-defined, no-any-return]

    def to_torch(self: _B, device: Any = None, non_blocking: bool = True,
                 pin_memory: bool = False) -> _B:
        """The same batch with torch tensors (see :meth:`replaybank.batch.Batch.to_torch`).

        Args:
            device: Target device (None keeps the CPU, zero-copy).
            non_blocking: Passed to ``Tensor.to``.
            pin_memory: Gather into pinned host memory first.
        """
        return self._rebuilt(self.core.to_torch(device, non_blocking, pin_memory))

    def numpy(self: _B) -> _B:
        """The same batch with numpy arrays."""
        return self._rebuilt(self.core.numpy())


#: Core fields of sequence batches that are not stored fields.
_SEQUENCE_FIELDS = {"mask", "is_first", "is_last", "is_terminal", "burn_in", "starts"}
#: Field tops that are no extra.
_TAKEN = frozenset({*_JOINT.values(), "weights", "probabilities", "indices", "discount",
                    *AGENT_FIELDS.values(), *_SEQUENCE_FIELDS, "initial"})


@dataclass(frozen=True)
class _Plan:
    """Where :meth:`_AgentFields._unpack` finds each value among a core batch's names.

    Attributes:
        fields: Per batch attribute of :data:`AGENT_FIELDS` but ``obs``, ``next_obs``
            and ``action``, the ``(agent, core name)`` of the agents' values, in agent
            order.
        actions: The same for ``action``; an agent whose action is stored part by part
            has ``((key, core name), ...)`` in place of the core name.
        observations: The same for ``obs`` and ``next_obs`` (zeroed where inactive); an
            agent with dict observations has ``((key, core name), ...)`` in place of the
            core name.
        extras: ``(name, top, agent)`` per extra core field: ``agent`` None for a joint
            extra (kept under ``name``), else the value of ``extras[top][agent]``.
    """

    fields: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    actions: tuple[tuple[str, str | tuple[tuple[str, str], ...]], ...]
    observations: tuple[tuple[str, tuple[tuple[str, str | tuple[tuple[str, str], ...]], ...]],
                        ...]
    extras: tuple[tuple[str, str, str | None], ...]


@lru_cache(maxsize=64)
def _plan(agents: tuple[str, ...], names: tuple[str, ...]) -> _Plan:
    """The :class:`_Plan` of core batches with the fields ``names`` (the same few every
    call of a buffer: cached)."""
    fields = tuple((attr, tuple((a, f"{prefix}{SEP}{a}") for a in agents))
                   for attr, prefix in AGENT_FIELDS.items()
                   if attr not in ("obs", "next_obs", "action"))
    actions = tuple((a, _obs_names("action", a, names)) for a in agents)
    observations = tuple((attr, tuple((a, _obs_names(attr, a, names)) for a in agents))
                         for attr in ("obs", "next_obs"))
    extras: list[tuple[str, str, str | None]] = []
    for name in names:
        top, _, rest = name.partition(SEP)
        if top in _TAKEN:
            continue
        extras.append((name, top, rest if rest in agents else None))
    return _Plan(fields, actions, observations, tuple(extras))


def _obs_names(prefix: str, agent: str, names: tuple[str, ...]
               ) -> str | tuple[tuple[str, str], ...]:
    """The core name of ``agent``'s observations ``prefix`` (``obs``, ``next_obs``; or
    its actions, ``action``), or ``((key, core name), ...)`` for a dict observation (an
    action of parts): ``<prefix>/<agent>/<key>``."""
    flat = f"{prefix}{SEP}{agent}"
    if flat in names:
        return flat
    head = f"{flat}{SEP}"
    keys = tuple((n[len(head):], n) for n in names if n.startswith(head))
    return keys if keys else flat


@dataclass(frozen=True)
class MultiAgentBatch(_AgentFields):
    """Joint transitions, each field ``[B, *shape]`` (see the module docstring).

    Attributes:
        agents: Agent names, in the buffer's order.
        obs: ``{agent: [B, *obs_shape]}`` (zeros where the agent did not act).
        next_obs: ``{agent: [B, *obs_shape]}``: exact, also for an agent that ended
            before the others (n steps ahead with ``n_step``; zeros where it did not act).
        action: ``{agent: [B, *action_shape]}`` (``{key: [B, *shape]}`` for an action
            of parts, e.g. a gymnasium ``Tuple`` action's ``'0'``, ``'1'``, ...).
        reward: ``{agent: [B]}`` float32: one-step rewards; with ``n_step > 1`` the
            agent's own n-step return, cut at its own end
            (:mod:`replaybank.multiagent.nstep`).
        terminated: ``{agent: [B]}`` bool: the agent terminated at this step (at the
            last step of its n-step window with ``n_step > 1``).
        truncated: ``{agent: [B]}`` bool: the agent was cut off at this step (idem).
        active: ``{agent: [B]}`` bool: the agent acted at this step.
        state: ``[B, *state_shape]`` global state, or None.
        next_state: ``[B, *state_shape]``, or None.
        joint_reward: ``[B]`` float32: the sum of the agents' rewards (the n-step return
            of that sum with ``n_step``).
        joint_terminated: ``[B]`` bool: the joint episode terminated.
        joint_truncated: ``[B]`` bool: the joint episode was cut off.
        extras: Per-agent extras ``{name: {agent: [B, ...]}}`` and joint ones
            ``{name: [B, ...]}``.
        indices: ``[B]`` int64 keys for ``update_priorities``.
        weights: ``[B]`` importance weights (prioritized samplers), else None.
        probabilities: ``[B]`` sampling probabilities (prioritized samplers), else None.
        discount: ``[B]`` ``gamma ** L`` of the joint n-step return (n-step views),
            else None.
        agent_discount: ``{agent: [B]}`` float32 ``gamma ** L_a`` of each agent's own
            n-step return (0 where the agent did not act; n-step views), else None.
        core: The core :class:`~replaybank.batch.Batch`.
    """

    indices: Any = None
    discount: Any = None
    agent_discount: dict[str, Any] | None = None

    @classmethod
    def from_core(cls, core: Batch[Any], agents: tuple[str, ...]) -> MultiAgentBatch:
        """Unpack a core batch of a multi-agent buffer."""
        data = core.to_dict(nested=False)
        per: dict[str, Any] | None = None
        if "discount" in data:  # an n-step view's batch
            names = {a: f"{AGENT_DISCOUNT}{SEP}{a}" for a in agents}
            if all(n in data for n in names.values()):
                per = {a: data.pop(n) for a, n in names.items()}
        # a transition batch's arrays were gathered for it alone: shown as they are
        # where nothing needs zeros
        values = cls._unpack(data, agents, fresh=True)
        values.update(core=core, indices=data.get("indices"), discount=data.get("discount"),
                      agent_discount=per)
        return cls._made(values)


@dataclass(frozen=True)
class MultiAgentSequenceBatch(_AgentFields):
    """Joint windows, each field ``[B, L, *shape]``, with the core's masks.

    The per-agent and joint fields are those of :class:`MultiAgentBatch` with a window
    dim (``active[agent]`` ``[B, L]``: the agent acted at that step of the window).

    Attributes:
        mask: ``[B, L]`` bool: valid steps (not padding or burn-in).
        is_first: ``[B, L]`` bool: a joint episode starts here.
        is_last: ``[B, L]`` bool: the joint episode ended here.
        is_terminal: ``[B, L]`` bool: the joint episode terminated here.
        burn_in: ``[B, L]`` bool: burn-in steps.
        starts: ``[B]`` int64: the key of each window's first step.
    """

    mask: Any = None
    is_first: Any = None
    is_last: Any = None
    is_terminal: Any = None
    burn_in: Any = None
    starts: Any = None
    _lead = 2

    @classmethod
    def from_core(cls, core: SequenceBatch[Any],
                  agents: tuple[str, ...]) -> MultiAgentSequenceBatch:
        """Unpack a core sequence batch of a multi-agent buffer."""
        data = core.to_dict(nested=False)
        seq: dict[str, Any] = {k: data.get(k) for k in _SEQUENCE_FIELDS}
        return cls(**cls._unpack(data, agents), core=core, **seq)

    @property
    def sequence_length(self) -> int:
        """The window length L (burn-in included)."""
        return int(self.joint_reward.shape[1])


@dataclass(frozen=True)
class MultiAgentEpisodeBatch(_AgentFields):
    """Whole joint episodes padded to ``L`` steps, each field ``[B, L, *shape]``.

    Row ``b`` holds the first ``min(lengths[b], L)`` steps of one joint episode from its
    first step on (:meth:`~replaybank.multiagent.buffer.MultiAgentReplayBuffer.
    sample_episodes`); every field is zero past them. Per-agent and joint fields are
    those of :class:`MultiAgentBatch` with a time dim (one-step values: n-step views
    do not apply to episodes); ``active[agent]`` ``[B, L]`` is the agent's mask.

    Attributes:
        mask: ``[B, L]`` bool: the joint step exists (not padding).
        is_first: ``[B, L]`` bool: the episode's first step (column 0 of every row).
        is_last: ``[B, L]`` bool: the joint episode ended at this step.
        is_terminal: ``[B, L]`` bool: the joint episode terminated at this step.
        starts: ``[B]`` int64 item key of each episode's first step
            (``seq * num_envs + env``).
        lengths: ``[B]`` int64 steps of each episode (more than ``L`` where it was cut;
            so far, for a running one).
        complete: ``[B]`` bool: the episode has ended (False only for running episodes,
            with ``include_running=True``).
    """

    mask: Any = None
    is_first: Any = None
    is_last: Any = None
    is_terminal: Any = None
    starts: Any = None
    lengths: Any = None
    complete: Any = None
    _lead = 2

    @classmethod
    def from_core(cls, core: SequenceBatch[Any], agents: tuple[str, ...], lengths: Any,
                  complete: Any) -> MultiAgentEpisodeBatch:
        """Unpack a core sequence batch of whole episodes.

        Args:
            core: Stored fields ``[B, L, *shape]`` with ``mask``, ``is_first``,
                ``is_last``, ``is_terminal`` and ``starts``.
            agents: Agent names.
            lengths: ``[B]`` episode lengths.
            complete: ``[B]`` bool: the episode has ended.
        """
        data = core.to_dict(nested=False)
        seq: dict[str, Any] = {k: data.get(k) for k in ("mask", "is_first", "is_last",
                                                         "is_terminal", "starts")}
        return cls(**cls._unpack(data, agents), core=core, lengths=lengths,
                   complete=complete, **seq)

    def _rebuilt(self, core: Any) -> MultiAgentEpisodeBatch:
        mask = core["mask"]
        lengths, complete = as_numpy(self.lengths), as_numpy(self.complete)
        if not isinstance(mask, np.ndarray):
            torch = require_extra("torch", "torch")
            lengths = torch.as_tensor(lengths, device=mask.device)
            complete = torch.as_tensor(complete, device=mask.device)
        return type(self).from_core(core, self.agents, lengths, complete)

    @property
    def max_length(self) -> int:
        """The padded length L."""
        return int(self.joint_reward.shape[1])
