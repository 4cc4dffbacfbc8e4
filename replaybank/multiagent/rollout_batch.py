"""Minibatches of a multi-agent rollout: the typed "together" batch and the two gathers.

:class:`MultiAgentRolloutBatch` is one minibatch of (env, time) items with every agent's
fields side by side (a centralised critic or a MAPPO learner reads all agents of a step at
once). Its values are kept as a flat core :class:`~replaybank.batch.Batch`
(:attr:`MultiAgentRolloutBatch.core`, names ``obs/<agent>``, ``advantages/<agent>``,
``value`` or ``value/<agent>``, ``state``, ...), so ``to_torch`` is the core's. An agent
with dict observations has one core field per key, ``obs/<agent>/<key>``, and
``batch.obs[agent]`` is ``{key: [B, *shape]}`` (as in
:class:`~replaybank.multiagent.MultiAgentBatch`).

The "flatten" form (one item per active (env, time, agent)) is a plain core
:class:`~replaybank.batch.Batch`: its fields are the agents' fields stacked, as a
parameter-shared single-agent learner reads them (dict observations stacked per key:
``obs/<key>``, so ``batch.obs`` is ``{key: [B, *shape]}`` as a single-agent
:class:`~replaybank.RolloutBuffer` gives it).

Index conventions (row-major, as :mod:`replaybank.ops.minibatch`): a step is
``k = t * num_envs + env``; an (env, time, agent) item is ``j = k * n_agents + agent``.

Example:
    >>> import numpy as np
    >>> core = Batch({"obs/a": np.ones((2, 3)), "obs/b": np.ones((2, 1)),
    ...               "active/a": np.array([True, False]), "active/b": np.ones(2, bool),
    ...               "advantages/a": np.zeros(2), "advantages/b": np.zeros(2),
    ...               "value": np.zeros(2), "indices": np.arange(2)})
    >>> b = MultiAgentRolloutBatch.from_core(core, ("a", "b"))
    >>> b.obs["a"].shape, b.active["a"].tolist(), b.value.shape, b.batch_size
    ((2, 3), [True, False], (2,), 2)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.batch import Batch
from replaybank.multiagent.batch import stack_agents
from replaybank.multiagent.layout import PARTED, obs_leaf
from replaybank.spec import SEP

__all__ = ["AGENT_FIELDS", "MultiAgentRolloutBatch", "flatten_rows", "together_rows"]

AnyArray = npt.NDArray[Any]
IntArray = npt.NDArray[np.int64]

#: Per-agent fields every rollout batch holds (besides per-agent extras and values).
AGENT_FIELDS = ("obs", "action", "log_prob", "reward", "terminated", "truncated", "active",
                "advantages", "returns")


@dataclass(frozen=True)
class MultiAgentRolloutBatch:
    """One minibatch of (env, time) steps with every agent's fields, ``[B, *shape]``.

    An agent that did not act at a step (``active[agent]`` False) shows zeros there,
    advantage and return 0.

    Attributes:
        agents: Agent names, in the buffer's order.
        obs: ``{agent: [B, *obs_shape]}``; an agent with dict observations has
            ``{key: [B, *shape]}`` (each key its own shape and dtype).
        action: ``{agent: [B, *action_shape]}``; an agent whose action is stored part
            by part (a gymnasium ``Tuple`` action) has ``{key: [B, *shape]}``
            (``'0'``, ``'1'``, ...).
        log_prob: ``{agent: [B, *log_prob_shape]}`` under the behaviour policy.
        reward: ``{agent: [B]}``.
        terminated: ``{agent: [B]}`` bool: the agent's episode terminated at this step.
        truncated: ``{agent: [B]}`` bool: the agent was cut off at this step.
        active: ``{agent: [B]}`` bool: the agent acted at this step (the loss mask).
        advantages: ``{agent: [B]}`` (normalised as the buffer's
            ``normalize_advantage`` says).
        returns: ``{agent: [B]}`` value targets (``advantages + value``, raw).
        value: ``{agent: [B]}`` per-agent values, or ``[B]`` with a centralised value.
        state: ``[B, *state_shape]`` global state, or None.
        extras: Per-agent extras ``{name: {agent: [B, ...]}}`` and joint ones
            ``{name: [B, ...]}``.
        indices: ``[B]`` int64 step keys ``t * num_envs + env``.
        core: The flat core :class:`~replaybank.batch.Batch`.
    """

    agents: tuple[str, ...]
    obs: dict[str, Any]
    action: dict[str, Any]
    log_prob: dict[str, Any]
    reward: dict[str, Any]
    terminated: dict[str, Any]
    truncated: dict[str, Any]
    active: dict[str, Any]
    advantages: dict[str, Any]
    returns: dict[str, Any]
    value: Any
    state: Any
    extras: dict[str, Any]
    indices: Any
    core: Any = field(repr=False)

    @classmethod
    def from_core(cls, core: Batch[Any], agents: tuple[str, ...]) -> MultiAgentRolloutBatch:
        """Unpack a flat core batch (names ``<field>/<agent>`` and joint names).

        Args:
            core: The flat batch.
            agents: The agents, in order.

        Returns:
            The typed batch (a field the core lacks is an empty dict, or None).
        """
        data = core.to_dict(nested=False)
        per: dict[str, dict[str, Any]] = {}
        joint: dict[str, Any] = {}
        for name, v in data.items():
            top, _, rest = name.partition(SEP)
            if rest in agents:
                per.setdefault(top, {})[rest] = v
                continue
            leaf = obs_leaf(rest, agents) if top in PARTED else None
            if leaf is not None and leaf[1] is not None:  # obs/<agent>/<key>, action/...
                per.setdefault(top, {}).setdefault(leaf[0], {})[leaf[1]] = v
            else:
                joint[name] = v
        fields = {f: per.pop(f, {}) for f in AGENT_FIELDS}
        value = per.pop("value", None)
        extras: dict[str, Any] = dict(per)
        extras.update({k: v for k, v in joint.items()
                       if k not in ("value", "state", "indices")})
        return cls(agents=agents, **fields,
                   value=joint.get("value") if value is None else value,
                   state=joint.get("state"), extras=extras, indices=joint.get("indices"),
                   core=core)

    @property
    def batch_size(self) -> int:
        """Leading dimension B."""
        return int(self.indices.shape[0])

    @property
    def n_agents(self) -> int:
        """Number of agents."""
        return len(self.agents)

    def stacked(self, name: str, agents: Any = None) -> Any:
        """A per-agent field stacked over agents, for a shared actor or critic.

        Args:
            name: One of ``obs``, ``action``, ``log_prob``, ``reward``, ``terminated``,
                ``truncated``, ``active``, ``advantages``, ``returns``, ``value`` (per-agent
                values) or a per-agent extra.
            agents: The agents to stack, in order (default: all).

        Returns:
            ``[B, n_agents, *shape]``; dict observations stack per key, ``{key: [B,
            n_agents, *shape]}``.

        Raises:
            KeyError: No such per-agent field, or an unknown agent.
            ShapeError: The agents' shapes or dtypes differ (or their dict keys, or some
                observe a dict and others an array).
        """
        per = getattr(self, name) if name in AGENT_FIELDS or name == "value" \
            else self.extras.get(name)
        return stack_agents(per, name, self.agents, agents, 1,
                            (*AGENT_FIELDS, "value", *self.extras))

    def to_torch(self, device: Any = None, non_blocking: bool = True,
                 pin_memory: bool = False) -> MultiAgentRolloutBatch:
        """The same batch with torch tensors (see :meth:`replaybank.batch.Batch.to_torch`).

        Args:
            device: Target device (None keeps the CPU, zero-copy).
            non_blocking: Passed to ``Tensor.to``.
            pin_memory: Gather into pinned host memory first.
        """
        return type(self).from_core(self.core.to_torch(device, non_blocking, pin_memory),
                                    self.agents)


def together_rows(data: Mapping[str, AnyArray], steps: IntArray,
                  num_envs: int) -> dict[str, AnyArray]:
    """Gather the stored fields at flat steps, for a "together" batch.

    Args:
        data: Stored fields ``[pos, num_envs, *shape]`` by flat name.
        steps: ``[B]`` flat steps ``t * num_envs + env``.
        num_envs: Envs of the rollout.

    Returns:
        ``{name: [B, *shape]}`` and ``indices`` (= ``steps``).

    Example:
        >>> rows = together_rows({"x": np.arange(6).reshape(3, 2)}, np.array([5, 0]), 2)
        >>> rows["x"].tolist(), rows["indices"].tolist()
        ([5, 0], [5, 0])
    """
    t, env = np.divmod(steps, num_envs)  # [B], [B]
    out = {name: arr[t, env] for name, arr in data.items()}
    out["indices"] = steps
    return out


def flatten_rows(stacked: Mapping[str, AnyArray], joint: Mapping[str, AnyArray],
                 items: IntArray, n_agents: int) -> dict[str, AnyArray]:
    """Gather (env, time, agent) items, for a "flatten" batch.

    Args:
        stacked: Per-agent fields stacked over agents, ``[pos * num_envs * n_agents,
            *shape]`` (row ``j`` is item ``j``).
        joint: Joint fields ``[pos * num_envs, *shape]`` (row ``k`` is step ``k``).
        items: ``[B]`` items ``j = k * n_agents + agent``.
        n_agents: Number of agents.

    Returns:
        ``{name: [B, *shape]}``, ``agent`` ``[B]`` int64 (the agent's position) and
        ``indices`` ``[B]`` int64 (the step ``k``).

    Example:
        >>> rows = flatten_rows({"r": np.arange(4.0)}, {"s": np.array([7, 8])},
        ...                     np.array([3, 0]), 2)
        >>> rows["r"].tolist(), rows["s"].tolist(), rows["agent"].tolist()
        ([3.0, 0.0], [8, 7], [1, 0])
    """
    steps, agent = np.divmod(items, n_agents)  # [B], [B]
    out = {name: arr[items] for name, arr in stacked.items()}
    out.update({name: arr[steps] for name, arr in joint.items()})
    out["agent"] = agent.astype(np.int64)
    out["indices"] = steps.astype(np.int64)
    return out
