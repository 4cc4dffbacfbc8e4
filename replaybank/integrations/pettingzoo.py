"""Fill multi-agent buffers from PettingZoo parallel envs: replay and on-policy rollouts.

:class:`MultiAgentCollector` steps one PettingZoo ``ParallelEnv``, or a list of them as
vector envs (one buffer lane per env), with a policy and adds one joint step of every env
per env step to a :class:`~replaybank.multiagent.MultiAgentReplayBuffer`.
:class:`MultiAgentRolloutCollector` does the same for a
:class:`~replaybank.multiagent.MultiAgentRolloutBuffer` (MAPPO, IPPO) with an actor-critic
policy (:class:`MultiAgentActorCritic`: ``policy(obs, state) -> (actions, values,
log_probs)``, always batched), keeping truncated agents' final observations for the
bootstrap; its rules and policy are in its docstring. ``rb.collect(env, policy, buffer,
n_steps)`` dispatches here when it is given a parallel env, a list of them or a
multi-agent buffer.

An env is recognised by what it has, not by its class: ``possible_agents``, ``agents``
(after ``reset``), ``action_space(agent)``, ``reset(seed=)`` returning ``(obs, infos)`` and
``step(actions)`` returning five dicts keyed by agent. (An AEC env, which has ``last()``, is
refused with the conversion to use.) PettingZoo itself is never imported.

The rules, per env:

* the agents that act at a step are those in ``env.agents`` (minus any the env reported
  ended in this episode); the others are left out of the buffer's dicts (one env) or
  marked ``active=False`` for that env (several envs);
* the observation a step returns for an agent that terminated or truncated is stored as
  its exact final ``next_obs``; PettingZoo then removes the agent from ``env.agents``, and
  the remaining agents go on;
* an env whose ``env.agents`` is empty (every agent ended) is reset at once, on its own:
  the first reset of env ``i`` uses ``seed + i``, later resets continue the env's
  generator (``reset(seed=None)``);
* when the buffer stores a global state (its spec, or its first add: an env with a
  working ``state()``), ``env.state()`` before and after each step goes in ``state`` and
  ``next_state``.

Replay policies: ``policy(obs) -> actions``. With one env (not a list), ``obs`` is the
env's own dict ``{agent: obs}`` of the acting agents and the policy returns ``{agent:
action}`` for each. With a list of ``n`` envs, ``obs`` is ``{agent: [n, *obs_shape]}``
for every agent acting in at least one env (zeros in the envs where it does not act;
:attr:`MultiAgentCollector.active` says where it does); an agent that observes a dict
(PettingZoo's ``{"observation": ..., "action_mask": ...}``) gets ``{key: [n, *shape]}``,
one array per key with its own dtype, and is stored per key; an agent whose
``env.observation_space(agent)`` is a gymnasium ``Tuple`` space observes, and is stored,
as ``rb.collect`` stores a single-agent Tuple space: the dict ``{'0': ..., '1': ...}``.
The rows of the envs are stacked in their common dtype (``numpy.result_type``); the
buffer's one checked cast turns them into the stored dtype. The policy returns
``{agent: [n, *action_shape]}`` for the same agents (the values of envs where an agent does
not act are ignored). numpy arrays or torch tensors. An agent whose
``env.action_space(agent)`` is a gymnasium ``Tuple`` space acts as in single-agent
``rb.collect``: the policy returns the env's tuple (with a list of envs, one array
``[n, ...]`` per part), each env is given a tuple again, and the buffer stores the dict of
parts ``{'0': ..., '1': ...}`` (fields ``action/<agent>/0``, ...); a ``Dict`` action
space alike, with the dict of its keys (fields ``action/<agent>/<key>``). ``policy=None`` samples
``env.action_space(agent)`` for each acting agent, the spaces seeded from the collector's
seed (one seed per env and agent, from ``numpy.random.SeedSequence(seed)``).

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> class Countdown:  # agent "b" ends at step 2, "a" at step 3
    ...     possible_agents = ["a", "b"]
    ...     def action_space(self, agent): return None
    ...     def state(self): return np.array([self.t], np.float32)
    ...     def reset(self, seed=None, options=None):
    ...         self.t, self.agents = 0, ["a", "b"]
    ...         return {k: np.zeros(2, np.float32) for k in self.agents}, {}
    ...     def step(self, actions):
    ...         self.t += 1
    ...         obs = {k: np.full(2, self.t, np.float32) for k in actions}
    ...         term = {k: self.t == (3 if k == "a" else 2) for k in actions}
    ...         self.agents = [k for k in self.agents if not term[k]]
    ...         return (obs, {k: 1.0 for k in actions}, term,
    ...                 {k: False for k in actions}, {k: {} for k in actions})
    >>> buf = rb.MultiAgentReplayBuffer(100, agents=["a", "b"], seed=0)
    >>> res = collect_multiagent(Countdown(), lambda obs: {k: 0 for k in obs}, buf, 6,
    ...                          progress=False, seed=0)
    >>> res.steps, res.episode_lengths, res.episode_returns, res.agent_episode_returns[0]
    (6, [3, 3], [5.0, 5.0], {'a': 3.0, 'b': 2.0})
    >>> batch = buf.sample(6, replace=False)
    >>> int(batch.active["b"].sum()), int(batch.state.shape[1])
    (4, 1)

    On mpe2's ``simple_spread_v3`` with random actions, through ``rb.collect``:

    >>> from mpe2 import simple_spread_v3  # doctest: +SKIP
    >>> envs = [simple_spread_v3.parallel_env(max_cycles=25)
    ...         for _ in range(2)]  # doctest: +SKIP
    >>> agents = envs[0].possible_agents  # doctest: +SKIP
    >>> buf = rb.MultiAgentReplayBuffer(1000, agents, num_envs=2)  # doctest: +SKIP
    >>> res = rb.collect(envs, None, buf, 100, progress=False, seed=0)  # doctest: +SKIP
    >>> res.steps, res.episode_lengths  # doctest: +SKIP
    (100, [25, 25, 25, 25])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from replaybank.errors import (
    ConfigError,
    DtypeError,
    ReplayBankError,
    ShapeError,
    describe,
    require_extra,
)
from replaybank.host import as_numpy, is_tensor, tensor_to_numpy
from replaybank.integrations.gymnasium import CollectResult
from replaybank.integrations.progress import ProgressBar
from replaybank.integrations.spaces import from_fields, parts_mismatch, to_fields
from replaybank.multiagent import MultiAgentReplayBuffer, MultiAgentRolloutBuffer
from replaybank.multiagent.inputs import cast_leaves, obs_as_stored
from replaybank.multiagent.layout import AgentLayout
from replaybank.spec import check_tuple, holds_array, tree_map

__all__ = ["JointStepBuffer", "MultiAgentActorCritic", "MultiAgentCollectResult",
           "MultiAgentCollector", "MultiAgentRolloutCollector", "collect_multiagent",
           "is_aec_env", "is_parallel_env", "wants_multiagent"]

MultiAgentPolicy = Callable[[dict[str, Any]], Mapping[str, Any]]


# ---------------------------------------------------------------------- recognition
def is_parallel_env(env: Any) -> bool:
    """Whether ``env`` looks like a PettingZoo ``ParallelEnv``: ``possible_agents``, a
    callable ``action_space(agent)``, ``reset`` and ``step``, and no AEC ``last()``.

    (``env.agents`` is checked after ``reset``: some envs create it there.)

    Example:
        >>> import gymnasium as gym
        >>> is_parallel_env(gym.make("CartPole-v1"))
        False
    """
    return (hasattr(env, "possible_agents") and callable(getattr(env, "action_space", None))
            and callable(getattr(env, "step", None)) and callable(getattr(env, "reset", None))
            and not is_aec_env(env))


def is_aec_env(env: Any) -> bool:
    """Whether ``env`` looks like a PettingZoo AEC env (``possible_agents`` and ``last()``)."""
    return hasattr(env, "possible_agents") and callable(getattr(env, "last", None))


@runtime_checkable
class ObservationSpaces(Protocol):
    """A parallel env that says what its agents observe (PettingZoo's
    ``observation_space(agent)``); the collector reads it to arrange a gymnasium
    ``Tuple`` observation as the dict ``{'0': ..., '1': ...}``."""

    def observation_space(self, agent: str) -> Any:
        """The gymnasium space of ``agent``'s observations."""


def _is_env_list(env: Any) -> bool:
    return (isinstance(env, (list, tuple)) and len(env) > 0
            and all(is_parallel_env(e) or is_aec_env(e) for e in env))


def wants_multiagent(env: Any, buffer: Any) -> bool:
    """Whether ``collect(env, ..., buffer)`` is a multi-agent collection: ``env`` is a
    parallel (or AEC) env or a list of them, or ``buffer`` is a
    :class:`~replaybank.multiagent.MultiAgentReplayBuffer` or
    :class:`~replaybank.multiagent.MultiAgentRolloutBuffer`."""
    return (is_parallel_env(env) or is_aec_env(env) or _is_env_list(env)
            or isinstance(buffer, (MultiAgentReplayBuffer, MultiAgentRolloutBuffer)))


class ObservationChecks(Protocol):
    """What both collectors' env bookkeeping (:class:`_ParallelEnvs`) reads and calls of
    the buffer they fill: its fields, and its checks of what an env gives as it arrives
    (``check_obs`` of :class:`~replaybank.multiagent.MultiAgentReplayBuffer`, its Ray
    client and :class:`~replaybank.multiagent.MultiAgentRolloutBuffer`)."""

    @property
    def layout(self) -> AgentLayout | None:
        """The per-agent fields (None before the first add fixes them); values that are
        exactly what they store pass the checks on arrival without ``check_obs``
        (:func:`~replaybank.multiagent.inputs.obs_as_stored`)."""

    def check_obs(self, obs: Any, state: Any = None, *, step: Any = None,
                  call: str = ...) -> None:
        """Refuse observations (and a state) from the env as ``add`` would."""


@runtime_checkable
class JointStepBuffer(Protocol):
    """What :class:`MultiAgentCollector` reads and calls of the buffer it fills: a
    :class:`~replaybank.multiagent.MultiAgentReplayBuffer`, or the Ray service's
    :class:`~replaybank.multiagent.distributed.MultiAgentReplayClient` (so
    ``rb.collect`` fills either the same way)."""

    @property
    def agents(self) -> tuple[str, ...]:
        """The agents, in the buffer's order."""

    @property
    def num_envs(self) -> int:
        """Envs (one lane each)."""

    @property
    def layout(self) -> AgentLayout | None:
        """The per-agent fields (None before the first add fixes them)."""

    def add(self, *args: Any, **kwargs: Any) -> None:
        """One joint step of every env (``MultiAgentReplayBuffer.add``)."""

    def check_first_add(self, agents: Any, per_agent: Any = ..., call: str = ...) -> None:
        """Refuse a first add that leaves an absent agent's fields unknown."""

    def check_obs(self, obs: Any, state: Any = None, *, step: Any = None,
                  call: str = ...) -> None:
        """Refuse observations (and a state) from the env as ``add`` would
        (``MultiAgentReplayBuffer.check_obs``)."""

    def end_episodes(self, env_ids: Any = None) -> None:
        """The envs ``env_ids`` are reset: their running joint episodes end."""

    def sample(self, batch_size: int, **kwargs: Any) -> Any:
        """A batch of joint transitions (what a rollout buffer does not have)."""


# ---------------------------------------------------------------------- result
@dataclass
class MultiAgentCollectResult(CollectResult):
    """What one multi-agent collection run did.

    Attributes:
        steps: Joint steps added to the buffer (one per env and env step).
        env_steps: Env steps taken, summed over envs.
        episode_returns: Joint (summed over agents) undiscounted return of every episode
            that ended, in the order they ended.
        episode_lengths: Joint steps of those episodes.
        agent_episode_returns: ``{agent: return}`` of those episodes (the agents that
            acted in them).
        agent_episode_lengths: ``{agent: steps it acted}`` of those episodes.
    """

    agent_episode_returns: list[dict[str, float]] = field(default_factory=list)
    agent_episode_lengths: list[dict[str, int]] = field(default_factory=list)


# ---------------------------------------------------------------------- checks
def _check_envs(env: Any, buffer: Any, rollout: bool = False) -> tuple[list[Any], bool]:
    """The envs and whether they came as a list (vector envs), checked against
    ``buffer`` (a replay buffer, or with ``rollout`` a rollout buffer)."""
    fix_buf = ("build rb.MultiAgentRolloutBuffer(n_steps, agents=env.possible_agents, "
               "num_envs=<number of envs>)" if rollout else
               "build rb.MultiAgentReplayBuffer(capacity, agents=env.possible_agents, "
               "num_envs=<number of envs>)")
    envs = list(env) if isinstance(env, (list, tuple)) else [env]
    vector = isinstance(env, (list, tuple))
    if not envs:
        raise ConfigError("collect(env=[]): an empty list of envs; pass a PettingZoo "
                          "ParallelEnv or a non-empty list of them")
    for i, e in enumerate(envs):
        where = f"env[{i}]" if vector else "env"
        if is_aec_env(e):
            raise ConfigError(
                f"collect({where}={describe(e)}): a PettingZoo AEC env (it has last()); "
                "the collector drives parallel envs: pass module.parallel_env(...) or "
                "pettingzoo.utils.conversions.aec_to_parallel(env)")
        if not is_parallel_env(e):
            raise ConfigError(
                f"collect({where}={describe(e)}): a multi-agent buffer is filled from "
                "a PettingZoo ParallelEnv (possible_agents, action_space(agent), step "
                "returning five dicts) or a list of them; pass one, or fill a "
                "gymnasium env into rb.ReplayBuffer")
    if not (isinstance(buffer, MultiAgentRolloutBuffer) if rollout
            else isinstance(buffer, JointStepBuffer)):
        raise ConfigError(
            f"collect(buffer={describe(buffer)}): a PettingZoo parallel env fills a "
            f"multi-agent buffer (joint steps of dicts keyed by agent); {fix_buf}")
    for i, e in enumerate(envs):
        unknown = [a for a in e.possible_agents if a not in buffer.agents]
        if unknown:
            where = f"env[{i}]" if vector else "env"
            raise ConfigError(
                f"collect(buffer=...): {where} has agents {unknown} that are not among the "
                f"buffer's agents {list(buffer.agents)}; build the buffer with "
                f"agents=env.possible_agents ({list(e.possible_agents)})")
    if int(buffer.num_envs) != len(envs):
        raise ConfigError(
            f"collect(buffer=...): buffer.num_envs={buffer.num_envs} but "
            + (f"env is a list of {len(envs)} envs" if vector else "env is one env")
            + f"; build the buffer with num_envs={len(envs)} (one lane per env)")
    return envs, vector


def _has_state(env: Any) -> bool:
    """Whether ``env.state()`` works (PettingZoo's base raises NotImplementedError)."""
    fn = getattr(env, "state", None)
    if not callable(fn):
        return False
    try:
        fn()
    except NotImplementedError:
        return False
    return True


def _numpy(x: Any) -> Any:
    return tensor_to_numpy(x) if is_tensor(x) else x


def _seeded_spaces(envs: list[Any], agents: tuple[str, ...],
                   seed: int | None) -> list[dict[str, Any]]:
    """``env.action_space(agent)`` per env and agent, each seeded from
    ``numpy.random.SeedSequence(seed)`` (one child per env and agent)."""
    seqs = np.random.SeedSequence(seed).spawn(len(envs) * len(agents)) \
        if seed is not None else None
    spaces: list[dict[str, Any]] = [{} for _ in envs]
    for i, e in enumerate(envs):
        for j, a in enumerate(agents):
            if a not in e.possible_agents:
                continue
            space = e.action_space(a)
            space.seed(None if seqs is None else
                       int(seqs[i * len(agents) + j].generate_state(1)[0]))
            spaces[i][a] = space
    return spaces


def _reset_obs(env: Any, seed: int | None, where: str) -> dict[str, Any]:
    """``env.reset(seed=seed)``'s observations of ``env.agents``, checked and copied."""
    obs, _ = env.reset(seed=seed)
    agents = list(getattr(env, "agents", ()))
    if not agents:
        raise ConfigError(f"collect(env=...): {where}.reset() left env.agents empty; "
                          "a parallel env lists its live agents in env.agents")
    missing = [a for a in agents if a not in obs]
    if missing:
        raise ConfigError(f"collect(env=...): {where}.reset() returned no observation "
                          f"for agent(s) {missing} of env.agents")
    return {a: _copy(obs[a]) for a in agents}


def _checked_step(out: Any, acting: list[str], where: str) -> tuple[Any, Any, Any, Any]:
    """``env.step``'s ``(observations, rewards, terminations, truncations)``, checked to
    be dicts holding every acting agent."""
    if not isinstance(out, tuple) or len(out) != 5:
        raise ConfigError(f"collect(env=...): {where}.step returned {describe(out)}; a "
                          "parallel env returns (obs, rewards, terminations, "
                          "truncations, infos), five dicts keyed by agent")
    nxt, rew, term, trunc, _ = out
    for name, d in (("observations", nxt), ("rewards", rew), ("terminations", term),
                    ("truncations", trunc)):
        missing = [a for a in acting if not isinstance(d, Mapping) or a not in d]
        if missing:
            raise ConfigError(f"collect(env=...): {where}.step returned no {name} for "
                              f"agent(s) {missing} that acted")
    return nxt, rew, term, trunc


def _rows(values: dict[int, Any], n: int, what: str) -> Any:
    """``[n, *shape]``: ``values[i]`` in row ``i``, zeros in the rows not given.

    The rows are stacked without a cast: the array's dtype is the values' common one
    (``numpy.result_type``, as the single-agent collector widens a lane), so an int64
    value of one env and a float value 0.25 of another give a float array holding 0.25.
    Casting to the stored dtype is the buffer's one checked cast, in ``add``: a value
    the field cannot hold exactly is refused there (``DtypeError``), as ``buf.add``
    refuses it, never truncated here.

    Dict values (a dict observation such as PettingZoo's ``{"observation": ...,
    "action_mask": ...}``) give a dict of such arrays, one per key (nested dicts too),
    so that every leaf keeps its own shape and dtype.

    Args:
        values: ``{env index: value}`` of the envs that give one.
        n: The number of envs (rows).
        what: What the values are, for the error message (``"obs of agent 'p0'"``).

    Returns:
        ``[n, *shape]``, or for dict values ``{key: [n, *shape]}`` (nested likewise).

    Raises:
        ConfigError: The envs give the values in different forms: a dict in one env and
            not in another, or dicts with different keys.
        ShapeError: The envs give values of different shapes, a value is a ragged nest,
            or a tuple holding arrays (which numpy would stack part-first).

    Example:
        >>> _rows({0: np.array([1], np.int64), 1: np.array([0.25])}, 3, "the obs")
        array([[1.  ],
               [0.25],
               [0.  ]])
    """
    j, first = next(iter(values.items()))
    if isinstance(first, Mapping):
        keys = list(first)
        for i, v in values.items():
            if not isinstance(v, Mapping) or set(v) != set(keys):
                got = f"a dict with keys {list(v)}" if isinstance(v, Mapping) \
                    else describe(v)
                raise ConfigError(
                    f"collect(env=...): env[{i}] gave {what} as {got} but env[{j}] as a "
                    f"dict with keys {keys}; the envs of one buffer give each agent the "
                    "same form (the same dict keys in every env)")
        return {k: _rows({i: v[k] for i, v in values.items()}, n, f"{what}[{k!r}]")
                for k in keys}
    for i, v in values.items():
        if isinstance(v, Mapping):
            raise ConfigError(
                f"collect(env=...): env[{i}] gave {what} as a dict with keys {list(v)} "
                f"but env[{j}] as {describe(first)}; the envs of one buffer give each "
                "agent the same form (the same dict keys in every env)")
    arrays = {i: _row_array(v, i, what) for i, v in values.items()}
    shape = arrays[j].shape
    for i, arr in arrays.items():
        if arr.shape != shape:
            raise ShapeError(
                f"collect(env=...): {what} has shape {arr.shape} in env[{i}] but {shape} "
                f"in env[{j}]; the buffer stores one shape per agent and field: every env "
                "gives an agent's values the same shape")
    try:
        dtype = np.result_type(*arrays.values())
    except TypeError:  # numpy finds no dtype that holds them all (dates beside numbers)
        i = next(i for i, arr in arrays.items() if not _promotes(arr.dtype, arrays[j].dtype))
        raise DtypeError(
            f"collect(env=...): {what} has dtype {arrays[i].dtype} in env[{i}] but "
            f"{arrays[j].dtype} in env[{j}], which no one array holds; every env gives an "
            "agent's values as numbers (or bools) the buffer can store"
        ) from None
    out = np.zeros((n, *shape), dtype)  # [n, *shape]
    for i, arr in arrays.items():
        out[i] = arr  # numpy's promotion, no narrowing: add's checked cast judges it
    return out


def _env_row(values: Any, i: int) -> Any:
    """Row ``i`` (env ``i``'s) of ``[n, *shape]`` values, or of each part of a dict of
    them (an action of parts).

    Example:
        >>> _env_row({"0": np.arange(2), "1": np.eye(2)}, 1)["1"].tolist()
        [0.0, 1.0]
    """
    if isinstance(values, Mapping):
        return {k: _env_row(v, i) for k, v in values.items()}
    return values[i]


def _promotes(a: np.dtype[Any], b: np.dtype[Any]) -> bool:
    """Whether numpy has a dtype that holds values of both ``a`` and ``b``."""
    try:
        np.result_type(a, b)
    except TypeError:
        return False
    return True


def _disagreeing(values: dict[int, Any], n: int, what: str) -> list[int]:
    """The envs whose values :func:`_rows` cannot stack with the others' (it refused
    them all): those it refuses alone (a tuple holding arrays, a ragged nest), and among
    the rest those that do not stack with the values most of the envs give (shape, form,
    dtype). When no strict majority agrees, nothing says which env is right (the first
    add fixes the fields from these values), so every env of the rest is named.

    Example:
        >>> _disagreeing({0: np.zeros(3), 1: np.zeros(4), 2: np.zeros(3)}, 3, "obs")
        [1]
        >>> _disagreeing({0: np.zeros(3), 1: np.zeros(4)}, 2, "obs")
        [0, 1]
    """

    def stacks(*ids: int) -> bool:
        try:
            _rows({i: values[i] for i in ids}, n, what)
        except ReplayBankError:
            return False
        return True

    alone = [i for i in values if stacks(i)]
    refused = [i for i in values if i not in alone]
    agree = {i: [j for j in alone if j == i or stacks(i, j)] for i in alone}
    best = max(alone, key=lambda i: len(agree[i]), default=None)
    keep = agree[best] if best is not None and 2 * len(agree[best]) > len(alone) else []
    return sorted(refused + [i for i in alone if i not in keep])


def _row_array(value: Any, i: int, what: str) -> npt.NDArray[Any]:
    """One env's value for :func:`_rows`, as a host array of its own dtype.

    Raises:
        ShapeError: A tuple holding arrays, or a ragged nest.
    """
    if type(value) is tuple and holds_array(value):
        raise ShapeError(
            f"collect(env=...): {what} in env[{i}] is {_tuple_shown(value)}, a tuple "
            "holding arrays (a gymnasium Tuple space's value), which numpy would stack "
            "part-first; a multi-agent buffer stores one array per agent and field: give "
            "one array (e.g. gymnasium.spaces.flatten(space, value))")
    return as_numpy(value, label=lambda: f"collect(env=...): {what} in env[{i}] is "
                    f"{describe(value)}", expected="one array per env",
                    fix="give one array (e.g. gymnasium.spaces.flatten(space, value))")


def _tuple_shown(value: tuple[Any, ...]) -> str:
    """A tuple's parts, described (``(array(shape=(3,), dtype=float32), ...)``)."""
    more = ", ..." if len(value) > 3 else ""
    return "(" + ", ".join(describe(v) for v in value[:3]) + more + ")"


def _batch_rows(obs: Mapping[str, Any]) -> int:
    """The rows ``K`` of a batch of observations ``{agent: [K, *shape]}`` (a dict
    observation ``{key: [K, *shape]}``: its first key's); 0 for no agent.

    Example:
        >>> _batch_rows({"a": {"observation": np.zeros((4, 3)), "mask": np.ones((4, 2))}})
        4
    """
    if not obs:
        return 0
    first = next(iter(obs.values()))
    while isinstance(first, Mapping):
        first = next(iter(first.values()))
    return len(first)


def _holds_tuple(x: Any, arrays: bool = False) -> bool:
    """Whether ``x`` is a tuple or a dict (nested too) that holds one (with ``arrays``:
    a tuple that holds arrays, :func:`~replaybank.spec.holds_array`)."""
    if type(x) is tuple:
        return not arrays or holds_array(x)
    if isinstance(x, Mapping):
        return any(_holds_tuple(v, arrays) for v in x.values())
    return False


def _copy(x: Any) -> Any:
    """A private copy of an observation (an env may reuse its arrays), a dict
    observation's arrays included (nested dicts too)."""
    if isinstance(x, Mapping):
        return {k: _copy(v) for k, v in x.items()}
    return np.array(x) if isinstance(x, np.ndarray) else x


# ---------------------------------------------------------------------- env bookkeeping
class _ParallelEnvs:
    """What both collectors keep about their envs: each env's current observations, the
    agents that ended in its running episode, its episode statistics, whether it has a
    working ``state()``, and the seeded action spaces of random actions.

    Args:
        env: A parallel env or a list of them (checked with ``buffer``).
        buffer: The multi-agent buffer the collector fills.
        seed: Seed of the first reset of env ``i`` (``seed + i``) and of random actions.
        random_actions: Seed the agents' action spaces (the policy is None).
        rollout: ``buffer`` is a rollout buffer.
    """

    def __init__(self, env: Any, buffer: Any, seed: int | None, random_actions: bool,
                 rollout: bool) -> None:
        self.envs, self.vector = _check_envs(env, buffer, rollout=rollout)
        self.env = env
        self.seed = seed
        self.n = len(self.envs)
        self._agents = tuple(buffer.agents)  # the buffer's order
        #: The buffer: its layout says whether a state is stored, its check_obs what it
        #: refuses of what an env gives.
        self._target: ObservationChecks = buffer
        # whether each env has a working state(), known after its first reset
        self._env_state: list[bool | None] = [
            None if callable(getattr(e, "state", None)) else False for e in self.envs]
        if self._layout_state() and False in self._env_state:
            self._no_state(self._env_state.index(False))
        self._spaces = _seeded_spaces(self.envs, self._agents, seed) if random_actions \
            else [{} for _ in self.envs]
        #: Per env, ``{agent: its Tuple or Dict action space, or None}``
        #: (:meth:`_parted_space`).
        self._parted_spaces: list[dict[str, Any]] = [{} for _ in self.envs]
        self._obs: list[dict[str, Any] | None] = [None] * self.n
        #: Env i's ``state()`` as of its current observations (a private copy), read once
        #: when first needed (the check on arrival, the next step) and kept until the env
        #: steps or is reset; None: not read yet.
        self._state: list[Any] = [None] * self.n
        #: Env i was reset once (a later reset continues its generator: seed=None).
        self._started = [False] * self.n
        self._ended: list[set[str]] = [set() for _ in range(self.n)]
        self._ret: list[dict[str, float]] = [{} for _ in range(self.n)]
        self._alen: list[dict[str, int]] = [{} for _ in range(self.n)]
        self._len = np.zeros(self.n, np.int64)
        self.episodes = 0
        #: Observations the buffer refused as they arrived, raised after the bookkeeping.
        self._refused: list[ReplayBankError] = []

    def _layout_state(self) -> bool | None:
        """Whether the buffer stores a global state (None: its first add decides)."""
        layout = self._target.layout
        return None if layout is None else layout.state is not None

    def _no_state(self, i: int) -> None:
        raise ConfigError(
            f"collect(buffer=...): the buffer stores a global state but "
            f"env{f'[{i}]' if self.vector else ''} has no working state(); build the "
            "buffer without spec['state'], or use an env with state()")

    def _stores_state(self) -> bool:
        """Whether this step stores the global state (every env was reset)."""
        known = self._layout_state()
        if known is None:  # the first add decides: a state when every env has one
            return all(self._env_state)
        if known and not all(self._env_state):
            self._no_state(self._env_state.index(False))
        return known

    def _arrival_state(self, i: int) -> bool:
        """Whether what env ``i`` gives comes with its state (:meth:`_stores_state` for
        one env: the other envs may not be reset yet). Before the first add: env ``i``
        has a working ``state()`` and no env is known to have none."""
        known = self._layout_state()
        if known is None:
            return bool(self._env_state[i]) and False not in self._env_state
        if known and not self._env_state[i]:
            self._no_state(i)
        return known

    def _reset_env(self, i: int, seed: int | None) -> None:
        """Reset env ``i`` (with ``seed``) and restart its episode statistics."""
        obs = _reset_obs(self.envs[i], seed, f"env[{i}]" if self.vector else "env")
        self._obs[i] = {a: self._fields(i, a, v) for a, v in obs.items()}
        self._state[i] = None  # (the check below reads it when the buffer stores one)
        self._started[i] = True
        if self._env_state[i] is None:
            self._env_state[i] = _has_state(self.envs[i])
        self._ended[i] = set()
        self._ret[i] = {}
        self._alen[i] = {}
        self._len[i] = 0
        refused = self._check_arrival(i, obs, None)
        if refused is not None:  # nothing of the new episode is stored: reset it again
            self._obs[i] = None
            self._refused.append(self._env_refused(refused, i, lost=False))

    def _ready(self) -> None:
        """Reset the envs that have no current observation; raise when the buffer refuses
        what a reset gave (that env is reset again at the next call)."""
        for i in range(self.n):
            self._ready_env(i)
        self._raise_refused()

    def _current_state(self, i: int) -> Any:
        """Env ``i``'s ``state()`` as of its current observations: read (and copied) the
        first time it is needed after the env stepped or was reset, then kept."""
        if self._state[i] is None:
            self._state[i] = _copy(self.envs[i].state())
        return self._state[i]

    def _check_arrival(self, i: int, obs: Mapping[str, Any],
                       step: Mapping[str, Any] | None,
                       state: Any = None) -> ReplayBankError | None:
        """The buffer's checks of what env ``i`` just gave (``obs``: ``{agent: its
        observation}`` as the env returned it, and ``env.state()`` when the buffer stores
        a state: ``state`` when the caller has read it, else :meth:`_current_state`), as
        its ``check_obs`` runs them (``step``: before the first add, the part of the step
        whose add fixes the fields); the error, or None. Nothing changes.

        Once the fields are known, values that are exactly what the buffer stores (numpy
        arrays of the fields' shapes and dtypes:
        :func:`~replaybank.multiagent.inputs.obs_as_stored`,
        :meth:`~replaybank.spec.FieldSpec.stores_as_is`) pass at once, as the buffer's
        check would pass them; only other values (and every value before the first add)
        go through ``check_obs``, in ``[num_envs, *shape]`` rows."""
        if not obs:
            return None
        try:
            layout = self._target.layout
            if layout is not None and obs_as_stored(layout, obs):
                # check_obs would pass these unchanged (and _rows would not refuse them):
                # only the state is left, checked alike
                if not self._arrival_state(i):  # (the layout stores none)
                    return None
                state = self._arrival_value(i, state)
                if layout.state is not None and layout.state.stores_as_is(state):
                    return None
            rows = {a: _rows({i: self._fields(i, a, v)}, self.n,
                             f"the observation of agent {a!r}") for a, v in obs.items()}
            if self._arrival_state(i):
                state = _rows({i: self._arrival_value(i, state)}, self.n, "the state")
            else:
                state = None
            self._target.check_obs(rows, state, step=step, call="collect")
        except ReplayBankError as exc:
            return exc
        return None

    def _arrival_value(self, i: int, state: Any) -> Any:
        """The state that arrived with env ``i``'s observations: ``state`` when the caller
        read it, else :meth:`_current_state`."""
        return self._current_state(i) if state is None else state

    def _ready_env(self, i: int) -> None:
        """Reset env ``i`` when it has no current observation: its first reset (with
        ``seed + i``), or after a step the buffer refused (``seed=None``)."""
        if self._obs[i] is None:
            first = not self._started[i]
            self._reset_env(i, self.seed + i if first and self.seed is not None else None)

    def _lost_step(self, exc: ReplayBankError, envs: list[int]) -> ReplayBankError:
        """The buffer refused a step after ``envs`` were stepped: their current
        observations are dropped (they are reset at the next step, so that no stored
        transition bridges the lost step) and the error says so."""
        for i in envs:
            self._obs[i] = None
        where = ", ".join(f"env[{i}]" for i in envs) if self.vector else "the env"
        return type(exc)(
            f"{exc} [collect: the buffer refused this step after {where} had already "
            "stepped, so the step is lost: the running episode ends at its last stored "
            "step (cut short, as by a time limit) and the env is reset at the next "
            "step; nothing that bridges the lost step is stored]")

    @staticmethod
    def _not_stepped(exc: ReplayBankError, what: str, where: str) -> ReplayBankError:
        """A policy output (``what``, of ``where``) the buffer refuses, found before
        ``env.step``."""
        return type(exc)(
            f"collect(policy=...): the buffer refuses {what} {where}: {exc} [env.step "
            "was not called: the envs and the collector are as before this step, so "
            "collect can go on once the policy is fixed]")

    def _stacked(self, values: dict[int, Any], what: str) -> Any:
        """:func:`_rows` of the envs' current ``values``. Before the first add nothing
        fixes the fields yet (the rollout collector checks each env's values alone as
        they arrive), so the envs may disagree (shapes, dict keys, dtypes): then the envs
        whose values do not stack with the others' (:func:`_disagreeing`) are refused as
        an env whose ``reset()`` gave values the buffer refuses: reset again at the next
        call, so that it can go on. Both collectors stack the first step's observations
        here, before any env steps.

        Raises:
            ConfigError, ShapeError, DtypeError: The envs' values do not stack.
        """
        try:
            return _rows(values, self.n, what)
        except ReplayBankError as exc:
            if self._target.layout is not None:  # the fields, not a majority, judge
                raise
            said = type(exc)(str(exc).removeprefix("collect(env=...): "))
            for i in _disagreeing(values, self.n, what):
                self._obs[i] = None  # nothing of its episode is stored: reset it again
                self._refused.append(self._env_refused(said, i, lost=False))
            self._raise_refused()
            raise

    def _env_refused(self, exc: ReplayBankError, i: int, lost: bool) -> ReplayBankError:
        """Env ``i`` gave an observation or state the buffer refuses (``lost``: from
        ``env.step``, whose step is then lost; else from ``reset``)."""
        where = f"env[{i}]" if self.vector else "the env"
        how = f"{where}'s step" if lost else f"{where}'s reset()"
        note = (f"{where}'s step is lost: its running episode ends at its last stored "
                "step (cut short, as by a time limit, bootstrapping from the observation "
                f"before the lost step), nothing of the lost step is stored, and {where} is "
                "reset at the next step" if lost else
                f"no step of {where}'s new episode was stored, and {where} is reset again "
                "at the next step")
        return type(exc)(
            f"collect(env=...): the buffer refuses the observations or state {how} gave: "
            f"{exc} [{note}; so collect can go on; the env gave them, so fix the env's "
            "observations (or the buffer's spec), not the policy]")

    def _raise_refused(self) -> None:
        """Raise the first refusal of an env's observations since the last call (after
        the step's bookkeeping, so collection goes on from here), naming the others."""
        refused, self._refused = self._refused, []
        if len(refused) == 1:
            raise refused[0]
        if refused:
            raise type(refused[0])(f"{refused[0]} [and {len(refused) - 1} more env(s) "
                                   "whose observations the buffer refused, handled alike]")

    def _parted_space(self, i: int, agent: str) -> Any:
        """``env[i].action_space(agent)`` when it is a gymnasium ``Tuple`` or ``Dict``
        space (an action of parts), else None (read once per env and agent; only for an
        action that comes as a tuple or a dict, so that other agents' actions cost
        nothing here)."""
        spaces = self._parted_spaces[i]
        if agent not in spaces:
            space = self.envs[i].action_space(agent)
            gym = require_extra("gymnasium", "gym")
            parted = isinstance(space, (gym.spaces.Tuple, gym.spaces.Dict))
            spaces[agent] = space if parted else None
        return spaces[agent]

    def _action_fields(self, i: int, agent: str, value: Any) -> Any:
        """``agent``'s action (the policy's, or a random one) in the buffer's form: the
        action of an agent whose ``env[i].action_space(agent)`` is a gymnasium ``Tuple``
        or ``Dict`` space arranged by :func:`~replaybank.integrations.spaces.to_fields`
        as ``rb.collect`` stores a single-agent one, the dict of its parts (``{'0':
        value[0], '1': value[1], ...}`` for a tuple, the space's keys for a dict; each
        part ``[n, ...]`` when batched over ``n`` envs; torch tensors as numpy); any
        other value as it is (a tuple that stays one meets the buffers' tuple rule, a
        dict the collector's check in :meth:`_policy_actions`).

        Raises:
            ShapeError: A tuple or dict that does not hold the space's parts (another
                number of parts, keys missing or unknown).
        """
        if type(value) is not tuple and not isinstance(value, Mapping):
            return value
        space = self._parted_space(i, agent)
        if space is None:
            return value
        wrong = parts_mismatch(space, value)
        if wrong:
            raise ShapeError(
                f"action[{agent!r}]: {wrong}; env.action_space({agent!r}) is {space!r}, and "
                "the env is given an action of exactly its parts (a tuple for a Tuple "
                "space, a dict of its keys for a Dict space)")
        return to_fields(space, value)

    def _env_action(self, i: int, agent: str, fields: Any) -> Any:
        """The action env ``i`` takes from ``agent``'s action in the buffer's form: the
        tuple again for a ``Tuple`` action space, the dict of its keys for a ``Dict``
        one (:func:`~replaybank.integrations.spaces.from_fields`), what its
        ``action_space(agent).contains`` accepts; any other value as it is."""
        if not isinstance(fields, Mapping):
            return fields
        space = self._parted_space(i, agent)
        return fields if space is None else from_fields(space, fields)

    def _policy_actions(self, actions: Mapping[str, Any], agents: list[str],
                        acting: list[list[str]]) -> dict[str, Any]:
        """The policy's ``{agent: action}`` in the buffer's form
        (:meth:`_action_fields`, the space of the first env where the agent acts),
        checked with the buffers' tuple rule (:func:`~replaybank.spec.check_tuple`,
        which their ``add`` and ``check_step`` run, with the collector's fix) before they
        are stacked and before any env steps: a
        tuple of one array per part that no ``Tuple`` action space arranges would else
        be stacked part-first, each part read as an env's actions, or be refused only
        after the envs stepped.

        Raises:
            ShapeError: An agent's action is a tuple holding arrays and its action space
                is no ``Tuple`` space, a dict and its action space is no ``Dict`` or
                ``Tuple`` space, or does not hold its space's parts (nothing changed).
        """
        out: dict[str, Any] = {}
        for a in agents:
            i = next((j for j, x in enumerate(acting) if a in x), 0)
            try:
                value = self._action_fields(i, a, _numpy(actions[a]))
                if isinstance(value, Mapping) and self._parted_space(i, a) is None:
                    raise ShapeError(
                        f"action[{a!r}]: a dict of parts {list(value)}, but "
                        f"env.action_space({a!r}) is {self.envs[i].action_space(a)!r}, no "
                        "gymnasium.spaces.Dict or Tuple: the env would be given the dict. "
                        "Return one array (e.g. gymnasium.spaces.flatten(space, action)), "
                        "or have env.action_space(agent) return the Dict space")
                if type(value) is tuple or type(value) is list:  # no Tuple space took it
                    check_tuple(f"action[{a!r}]", value, (
                        f"env.action_space({a!r}) is {self.envs[i].action_space(a)!r}, no "
                        "gymnasium.spaces.Tuple: the collector stores a tuple action part "
                        "by part ({'0': v[0], '1': v[1], ...}, as rb.collect does) and "
                        "hands the env the tuple again only for a Tuple action space; "
                        "return one array (e.g. gymnasium.spaces.flatten(space, action)), "
                        "or have env.action_space(agent) return that Tuple space"))
            except ReplayBankError as exc:
                raise self._not_stepped(
                    exc,
                    f"the action of agent {a!r}",
                    "for the envs" if self.vector else "in the env",
                ) from None
            out[a] = value
        return out

    def _end_episode(self, i: int, result: MultiAgentCollectResult) -> None:
        """Env ``i``'s joint episode is over (no agent left in ``env.agents``): check that
        every agent that acted ended, record the episode in ``result``, reset the env."""
        alive = [a for a in self._alen[i] if a not in self._ended[i]]
        if alive:
            where = f"env[{i}]" if self.vector else "env"
            raise ConfigError(
                f"collect(env=...): {where} removed agent(s) {alive} from env.agents "
                "without reporting them terminated or truncated; a parallel env ends an "
                "agent with terminations[agent] or truncations[agent] True at the step "
                "that removes it")
        result.episode_returns.append(float(sum(self._ret[i][a] for a in self._agents
                                                if a in self._ret[i])))
        result.episode_lengths.append(int(self._len[i]))
        result.agent_episode_returns.append({a: self._ret[i][a] for a in self._agents
                                             if a in self._ret[i]})
        result.agent_episode_lengths.append({a: self._alen[i][a] for a in self._agents
                                             if a in self._alen[i]})
        self.episodes += 1
        self._reset_env(i, None)

    def _fields(self, i: int, agent: str, value: Any) -> Any:
        """``agent``'s observation from env ``i`` in the buffer's form: a value that holds
        a tuple (a gymnasium ``Tuple`` space's) arranged by
        :func:`~replaybank.integrations.spaces.to_fields` as ``rb.collect`` stores it for
        a single-agent env, ``{'0': value[0], '1': value[1], ...}`` (a private copy);
        any other value as it is.

        Raises:
            ShapeError: A tuple holding arrays that the env's
                ``observation_space(agent)`` does not arrange (the env has none, or it is
                no ``Tuple`` space).
        """
        if not _holds_tuple(value):
            return value
        env = self.envs[i]
        space = env.observation_space(agent) if isinstance(env, ObservationSpaces) else None
        if space is not None:
            value = _copy(to_fields(space, value))
        if _holds_tuple(value, arrays=True):
            where = f"env[{i}]" if self.vector else "env"
            found = f"{where} has no observation_space(agent): give it one" \
                if space is None else f"{where}.observation_space({agent!r}) is {space!r}, " \
                "no Tuple space: return the gymnasium.spaces.Tuple there"
            raise ShapeError(
                f"collect(env=...): {where} gave the observation of agent {agent!r} as a "
                "tuple holding arrays (a gymnasium Tuple space's value), which numpy would "
                "stack part-first. The collector stores it as rb.collect stores a Tuple "
                "space, as the dict {'0': value[0], '1': value[1], ...} (the fields "
                f"obs/{agent}/0, obs/{agent}/1, ...), when env.observation_space({agent!r}) "
                f"is a gymnasium.spaces.Tuple; {found}, or have the env return a dict or "
                "one array")
        return value

    @property
    def active(self) -> dict[str, np.ndarray]:
        """``{agent: bool[num_envs]}``: in which envs each agent acts at the next step."""
        out = {a: np.zeros(self.n, np.bool_) for a in self._agents}
        for i in range(self.n):
            for a in self._acting(i):
                out[a][i] = True
        return {a: m for a, m in out.items() if m.any()}

    def _acting(self, i: int) -> list[str]:
        """The agents of env ``i`` that act next (in the buffer's order)."""
        cur = self._obs[i] or {}
        return [a for a in self._agents if a in cur and a not in self._ended[i]]


# ---------------------------------------------------------------------- collector
class MultiAgentCollector(_ParallelEnvs):
    """Steps PettingZoo parallel envs with a policy and adds joint steps to a buffer.

    Keeps every env's current observations and running episode statistics between
    :meth:`collect` calls. The rules and the policy's inputs and outputs are in the
    module docstring (:mod:`replaybank.integrations.pettingzoo`).

    Args:
        env: A PettingZoo ``ParallelEnv`` (buffer with ``num_envs=1``) or a list of them
            (vector envs: ``buffer.num_envs == len(env)``).
        policy: ``policy(obs_dict) -> action_dict`` (see the module docstring), or None
            for random actions from ``env.action_space(agent)``.
        buffer: A :class:`~replaybank.multiagent.MultiAgentReplayBuffer` whose agents
            include every env's ``possible_agents``.
        seed: Seed of the first reset of env ``i`` (``seed + i``) and of random actions.

    Raises:
        ConfigError: ``env`` is not a parallel env or a list of them, ``buffer`` is not a
            multi-agent buffer, or does not have the envs' agents or their number of envs,
            or the buffer stores a global state and an env has no ``state()``, or
            ``policy`` is not callable.

    Example:
        >>> from mpe2 import simple_spread_v3  # doctest: +SKIP
        >>> env = simple_spread_v3.parallel_env(max_cycles=25)  # doctest: +SKIP
        >>> buf = MultiAgentReplayBuffer(500, agents=env.possible_agents)  # doctest: +SKIP
        >>> col = MultiAgentCollector(env, None, buf, seed=0)  # doctest: +SKIP
        >>> col.collect(50).episode_lengths  # doctest: +SKIP
        [25, 25]
    """

    def __init__(self, env: Any, policy: MultiAgentPolicy | None, buffer: Any,
                 seed: int | None = None) -> None:
        super().__init__(env, buffer, seed, random_actions=policy is None, rollout=False)
        self.buffer: JointStepBuffer = buffer
        if policy is not None and not callable(policy):
            raise ConfigError(f"collect(policy={describe(policy)}): expected a callable "
                              "policy(obs_dict) -> action_dict, or None for random actions")
        self.policy = policy

    def _reset_env(self, i: int, seed: int | None) -> None:
        # a joint episode of this env still running in the buffer (this collector's, or
        # one a collector before it left: rb.collect called twice) is cut short here
        self.buffer.end_episodes(i)
        super()._reset_env(i, seed)

    def reset(self, seed: int | None = None) -> Any:
        """Reset every env (env ``i`` with ``seed + i``; episode statistics restart) and
        return :attr:`obs`.

        Raises:
            ShapeError, DtypeError, SpecError: The buffer refuses what a reset gave (after
                every env was reset; that env is reset again at the next step)."""
        for i in range(self.n):
            self._reset_env(i, None if seed is None else seed + i)
        self._raise_refused()
        return self.obs

    @property
    def obs(self) -> Any:
        """The current observations: the env's ``{agent: obs}`` (one env), or one such
        dict per env (a list of envs); None before the first step."""
        if self._obs[0] is None:
            return None
        return list(self._obs) if self.vector else self._obs[0]

    # ------------------------------------------------------------------ actions
    def _actions(self, acting: list[list[str]]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Per env, the action dict of its acting agents as the env takes it, and as the
        buffer stores it (the same values, but a ``Tuple`` action: the env gets a tuple,
        the buffer the dict of parts, :meth:`_action_fields`)."""
        if self.policy is None:
            if self.vector and self.buffer.layout is None:
                self._batch_obs(acting)  # the first add's rows stack: refused before a step
            sampled = [{a: self._spaces[i][a].sample() for a in acting[i]}
                       for i in range(self.n)]
            return sampled, [{a: self._action_fields(i, a, v) for a, v in acts.items()}
                             for i, acts in enumerate(sampled)]
        if not self.vector:
            obs = {a: self._obs[0][a] for a in acting[0]} if self._obs[0] else {}
            out = self.policy(obs)
            self._check_actions(out, acting[0])
            fields = self._policy_actions(out, acting[0], acting)
            return [{a: self._env_action(0, a, v) for a, v in fields.items()}], [fields]
        batch = self._batch_obs(acting)
        out = self.policy(batch)
        self._check_actions(out, list(batch))
        fields = self._policy_actions(out, list(batch), acting)  # before rows are stacked
        per_env: list[dict[str, Any]] = [{} for _ in range(self.n)]
        per_env_fields: list[dict[str, Any]] = [{} for _ in range(self.n)]
        for a in batch:
            value = fields[a]  # [n, *action_shape], or {key: [n, *shape]} (its parts)
            values = tree_map(np.asarray, value)
            for key, arr in (values.items() if isinstance(values, Mapping)
                             else [(None, values)]):
                if isinstance(arr, np.ndarray) and (arr.ndim == 0 or arr.shape[0] != self.n):
                    part = "" if key is None else f" part {key!r}"
                    raise ConfigError(
                        f"collect(policy=...): the action of agent {a!r}{part} has shape "
                        f"{arr.shape}; with {self.n} envs the policy returns "
                        f"{{agent: [{self.n}, *action_shape]}} (one row per env; a Tuple "
                        "action: a tuple of such rows, one per part)")
            for i in range(self.n):
                if a in acting[i]:
                    row = _env_row(values, i)
                    per_env_fields[i][a] = row
                    per_env[i][a] = self._env_action(i, a, row)
        return per_env, per_env_fields

    def _batch_obs(self, acting: list[list[str]]) -> dict[str, Any]:
        """``{agent: [n, *obs_shape]}`` of the agents acting in some env (zeros in the
        envs where they do not act; ``{key: [n, *shape]}`` for a dict observation).

        Raises:
            ConfigError, ShapeError, DtypeError: The envs' observations do not stack
                (before the first add, the envs that disagree are reset at the next
                call: :meth:`_stacked`).
        """
        obs: dict[str, Any] = {}
        for a in self._agents:
            rows = {i: cur[a] for i, cur in enumerate(self._obs)
                    if cur is not None and a in acting[i]}
            if rows:
                obs[a] = self._stacked(rows, f"the observation of agent {a!r}")
        return obs

    def _check_actions(self, out: Any, agents: list[str]) -> None:
        if not isinstance(out, Mapping):
            raise ConfigError(f"collect(policy=...): the policy returned {describe(out)}; "
                              "a multi-agent policy returns a dict {agent: action}")
        missing = [a for a in agents if a not in out]
        if missing:
            raise ConfigError(f"collect(policy=...): the policy returned no action for "
                              f"agent(s) {missing}; return {{agent: action}} for every "
                              "agent in obs")

    # ------------------------------------------------------------------ one step
    def _check_actions_fit(self, actions: list[dict[str, Any]]) -> None:
        """Cast every action with the buffer's checked cast of its action field (once
        the buffer knows it), before any env steps.

        Raises:
            ShapeError, DtypeError: An action the buffer's ``add`` would refuse.
        """
        layout = self.buffer.layout
        if layout is None:  # the first add infers the action fields
            return
        for i, acts in enumerate(actions):
            for a, v in acts.items():
                if a in layout.agents:
                    try:  # one array, or its parts (a Tuple action's)
                        cast_leaves(layout, "action", a, "action", v, 1, {})
                    except ReplayBankError as exc:
                        raise self._not_stepped(
                            exc, f"the action of agent {a!r}",
                            f"in env[{i}]" if self.vector else "in the env") from None

    def step(self, result: MultiAgentCollectResult) -> int:
        """One step of every env; returns the number of joint steps stored.

        Every observation (and state) is checked with the buffer's checks as it arrives
        (its ``check_obs``), as :class:`MultiAgentRolloutCollector` checks it: from
        ``reset``, and from ``env.step`` before the step is added. An env whose
        ``reset`` gave one the buffer refuses is reset again at the next step (nothing of
        its new episode is stored); an env whose ``env.step`` gave one loses that step
        (its episode ends at its last stored step, and it is reset at the next step),
        while the other envs' steps are stored. The error is raised after the step's
        bookkeeping, so the next call goes on.

        Raises:
            ShapeError, DtypeError, SpecError: The buffer refuses an action (checked
                before any env steps: nothing changed), or an env's observations (see
                above), or the step after the envs stepped (the step is lost in every
                env: see :meth:`_lost_step`).
        """
        self._ready()
        store_state = self._stores_state()
        acting = [self._acting(i) for i in range(self.n)]
        if self.buffer.layout is None:  # an agent not in the first add needs spec=
            # entries: refused now, before the envs step, not by the add after the step
            self.buffer.check_first_add([a for a in self._agents
                                         if any(a in x for x in acting)], call="collect")
        actions, act_fields = self._actions(acting)  # as the envs take them, as stored
        self._check_actions_fit(act_fields)
        for i in range(self.n):
            if acting[i] and store_state:
                self._current_state(i)  # the state before the step (read at most once)
        first = self._first_step(acting, act_fields, store_state)
        steps: list[dict[str, Any] | None] = []
        lost: list[int] = []
        for i, env in enumerate(self.envs):
            if not acting[i]:
                steps.append(None)
                continue
            out = env.step(actions[i])
            step = self._outcome(i, acting[i], act_fields[i], out, store_state)
            self._state[i] = step.get("next_state")  # the env moved on
            refused = self._check_arrival(i, {a: step["raw_next"][a] for a in acting[i]},
                                          first, step.get("next_state"))
            if refused is not None:  # that env's step is lost, the others' are stored
                lost.append(i)
                self._refused.append(self._env_refused(refused, i, lost=True))
                steps.append(None)
                continue
            steps.append(step)
        try:
            self._store(steps, store_state)
        except ReplayBankError as exc:
            self._refused = []
            stepped = [i for i in range(self.n) if acting[i]]
            self.buffer.end_episodes(stepped)
            raise self._lost_step(exc, stepped) from exc
        stored = sum(s is not None for s in steps)
        result.steps += stored
        result.env_steps += stored + len(lost)
        for i, s in enumerate(steps):
            if s is not None:
                self._after(i, s, result)
        if lost:  # cut at their last stored step; reset at the next step
            for i in lost:
                self._obs[i] = None
            self.buffer.end_episodes(lost)
        self._raise_refused()
        return stored

    def _first_step(self, acting: list[list[str]], actions: list[dict[str, Any]],
                    store_state: bool) -> dict[str, Any] | None:
        """Before the first add: the ``obs``, ``action`` (and ``state``) of this step in
        the form ``add`` takes them, which fix the buffer's fields (the envs' next
        observations are checked against those), checked by the buffer's ``check_obs``
        before any env steps; None once the fields are known.

        Raises:
            ShapeError, DtypeError, SpecError: The buffer refuses this step's actions
                (the observations were checked as they arrived): nothing changed.
        """
        if self.buffer.layout is None and any(acting):
            part = [{"obs": {a: cur[a] for a in acting[i]}, "action": actions[i],
                     "state": self._state[i]} if acting[i] and (cur := self._obs[i])
                    else None for i in range(self.n)]
            try:
                first = self._add_args(part, ("obs", "action"),
                                       ("state",) if store_state else ())
                self.buffer.check_obs(first["obs"], first.get("state"), step=first,
                                      call="collect")
            except ReplayBankError as exc:
                raise self._not_stepped(exc, "the actions",
                                        "for the envs" if self.vector else "in the env"
                                        ) from None
            return first
        return None

    def _outcome(self, i: int, acting: list[str], actions: dict[str, Any], out: Any,
                 store_state: bool) -> dict[str, Any]:
        """Env ``i``'s step, checked: ``{obs, action, reward, next_obs, terminated,
        truncated: {agent: value}, state, next_state, raw_next}``."""
        nxt, rew, term, trunc = _checked_step(out, acting,
                                              f"env[{i}]" if self.vector else "env")
        cur = self._obs[i]
        assert cur is not None  # set by _reset_env
        step = {
            "obs": {a: cur[a] for a in acting},
            "action": {a: actions[a] for a in acting},
            "reward": {a: float(rew[a]) for a in acting},
            "next_obs": {a: self._fields(i, a, nxt[a]) for a in acting},
            "terminated": {a: bool(term[a]) for a in acting},
            "truncated": {a: bool(trunc[a]) for a in acting},
            "raw_next": nxt,
        }
        if store_state:
            step["state"] = self._state[i]
            step["next_state"] = _copy(self.envs[i].state())
        return step

    def _store(self, steps: list[dict[str, Any] | None], store_state: bool) -> None:
        if any(s is not None for s in steps):
            self.buffer.add(**self._add_args(
                steps, ("obs", "action", "reward", "next_obs", "terminated", "truncated"),
                ("state", "next_state") if store_state else ()))

    def _add_args(self, steps: list[dict[str, Any] | None], keys: tuple[str, ...],
                  joint: tuple[str, ...]) -> dict[str, Any]:
        """The keyword values of ``buffer.add`` for the envs' ``steps`` (None: an env
        that adds nothing; at least one does): the per-agent ``keys`` and the ``joint``
        ones (``state``, ``next_state``). One env: its own values; several: ``{agent:
        [n, *shape]}`` and ``active`` masks (:func:`_rows`)."""
        if not self.vector:
            s = steps[0]
            assert s is not None  # (the caller's rule)
            return {k: s[k] for k in (*keys, *joint)}
        live = {i: s for i, s in enumerate(steps) if s is not None}
        values: dict[str, Any] = {k: {} for k in keys}
        active: dict[str, np.ndarray] = {}
        for a in self._agents:
            acted = {i: s for i, s in live.items() if a in s["obs"]}
            if not acted:
                continue
            active[a] = np.isin(np.arange(self.n), list(acted))
            for k in keys:
                values[k][a] = _rows({i: s[k][a] for i, s in acted.items()}, self.n,
                                     f"the {k} of agent {a!r}")
        for k in joint:
            values[k] = _rows({i: s[k] for i, s in live.items()}, self.n, f"the {k}")
        return {**values, "active": active}

    def _after(self, i: int, s: dict[str, Any], result: MultiAgentCollectResult) -> None:
        """Env ``i``'s bookkeeping after its step was stored; reset it when it is over."""
        env = self.envs[i]
        for a, r in s["reward"].items():
            self._ret[i][a] = self._ret[i].get(a, 0.0) + r
            self._alen[i][a] = self._alen[i].get(a, 0) + 1
            if s["terminated"][a] or s["truncated"][a]:
                self._ended[i].add(a)
        self._len[i] += 1
        agents = list(getattr(env, "agents", ()))
        live = [a for a in agents if a not in self._ended[i]]
        if live:
            nxt = s["raw_next"]
            missing = [a for a in live if a not in nxt]
            if missing:
                where = f"env[{i}]" if self.vector else "env"
                raise ConfigError(f"collect(env=...): {where}.step returned no observation "
                                  f"for agent(s) {missing} of env.agents")
            self._obs[i] = {a: _copy(self._fields(i, a, nxt[a])) for a in live}
            self._state[i] = s.get("next_state")  # the next step's state
            return
        self._end_episode(i, result)

    # ------------------------------------------------------------------ many steps
    def collect(self, n_steps: int, progress: bool = False,
                description: str = "collect") -> MultiAgentCollectResult:
        """Step until at least ``n_steps`` joint steps were added (whole vector steps).

        Args:
            n_steps: Joint steps to add (may overshoot by less than the number of envs).
            progress: Show a progress bar (rich).
            description: Text of the progress bar.

        Returns:
            A :class:`MultiAgentCollectResult` for this call.

        Raises:
            ConfigError: ``n_steps`` is not a positive int, or an env or the policy breaks
                the parallel API (the message says which and how).
        """
        if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) \
                or n_steps <= 0:
            raise ConfigError(f"collect(n_steps={n_steps!r}): must be a positive int")
        result = MultiAgentCollectResult()
        with ProgressBar(int(n_steps), description, enabled=progress) as bar:
            while result.steps < n_steps:
                k = self.step(result)
                if k == 0:
                    raise ConfigError("collect(env=...): no agent acted in any env; a "
                                      "parallel env lists its live agents in env.agents")
                last = result.episode_returns[-1] if result.episode_returns else None
                bar.update(min(k, n_steps - bar.completed), episodes=len(result.episode_returns),
                           ret=last)
        return result


def collect_multiagent(env: Any, policy: Any, buffer: Any, n_steps: int,
                       progress: bool = True,
                       seed: int | None = None) -> MultiAgentCollectResult:
    """Reset the parallel env(s), step them with ``policy`` and add ``n_steps`` joint steps
    to ``buffer`` (what ``rb.collect`` does for a parallel env).

    For repeated collection that continues episodes across calls, keep a
    :class:`MultiAgentCollector` (or a :class:`MultiAgentRolloutCollector`).

    Args:
        env: A PettingZoo ``ParallelEnv`` or a list of them (vector envs).
        policy: Replay buffer: ``policy(obs_dict) -> action_dict``. Rollout buffer:
            ``policy(obs, state) -> (actions, values, log_probs)``, always batched
            (:class:`MultiAgentActorCritic`). None: random actions (values and
            log-probabilities 0 for a rollout).
        buffer: A :class:`~replaybank.multiagent.MultiAgentReplayBuffer` or
            :class:`~replaybank.multiagent.MultiAgentRolloutBuffer` with ``num_envs``
            equal to the number of envs.
        n_steps: Replay buffer: joint steps to add, summed over envs (whole vector steps;
            may overshoot by < num envs). Rollout buffer: steps per env (the rollout's
            unit, at most ``buffer.n_steps - buffer.pos``); a rollout filled to
            ``n_steps`` is then given its advantages
            (:meth:`MultiAgentRolloutCollector.compute_returns_and_advantage`).
        progress: Show a rich progress bar.
        seed: Seed of the first resets (env ``i``: ``seed + i``) and of random actions.

    Returns:
        :class:`MultiAgentCollectResult` with steps (joint steps added) and the joint and
        per-agent returns and lengths of finished episodes.

    Raises:
        ConfigError: See :class:`MultiAgentCollector`, :meth:`MultiAgentCollector.collect`
            and :meth:`MultiAgentRolloutCollector.collect`.
    """
    if isinstance(buffer, MultiAgentRolloutBuffer):
        col = MultiAgentRolloutCollector(env, policy, buffer, seed=seed)
        result = col.collect(n_steps, progress=progress)
        col.end_episodes()  # no collector continues them (a later call resets the envs)
        return result
    return MultiAgentCollector(env, policy, buffer, seed=seed).collect(n_steps,
                                                                       progress=progress)


# ---------------------------------------------------------------------- on-policy
#: ``policy(obs, state) -> (actions, values, log_probs)`` (see :class:`MultiAgentActorCritic`).
RolloutPolicy = Callable[[dict[str, Any], Any], Any]


@runtime_checkable
class MultiAgentActorCritic(Protocol):
    """A MAPPO / IPPO policy for :class:`MultiAgentRolloutCollector`.

    Always batched over envs (``n`` = the number of envs, 1 for a single env), in the
    form :meth:`~replaybank.multiagent.MultiAgentRolloutBuffer.compute_returns_and_advantage`
    gives its ``value_fn``, so that one network serves both:

    * ``obs``: ``{agent: [n, *obs_shape]}`` for every agent acting in at least one env
      (zeros in the envs where it does not act; the collector's
      :attr:`~MultiAgentRolloutCollector.active` says where it does);
    * ``state``: ``[n, *state_shape]`` the global state (``env.state()``), or None when
      the buffer stores none.

    ``__call__`` returns ``(actions, values, log_probs)``: ``{agent: [n, *action_shape]}``,
    ``{agent: [n]}`` (per-agent values) or ``[n]`` (one centralised value per env, shared
    by the agents), and ``{agent: [n]}``, for the agents in ``obs`` (numpy or torch; rows of
    envs where an agent does not act are ignored). ``value`` returns the values alone,
    for the bootstrap of truncated agents and of the rollout's last step. A plain
    function ``policy(obs, state)`` is a policy too: its values then come from calling it
    (or from the collector's ``value_fn``).

    Example:
        >>> import numpy as np
        >>> class Zero:
        ...     def __call__(self, obs, state):
        ...         n = len(next(iter(obs.values())))
        ...         return ({a: np.zeros(n, np.int64) for a in obs}, self.value(obs, state),
        ...                 {a: np.zeros(n) for a in obs})
        ...     def value(self, obs, state):
        ...         return {a: np.zeros(len(o)) for a, o in obs.items()}
        >>> isinstance(Zero(), MultiAgentActorCritic)
        True
    """

    def __call__(self, obs: dict[str, Any], state: Any) -> Any:
        """``(actions, values, log_probs)`` of a batch of acting agents."""

    def value(self, obs: dict[str, Any], state: Any) -> Any:
        """``{agent: [n]}`` or ``[n]``: the values of a batch of observations."""


class MultiAgentRolloutCollector(_ParallelEnvs):
    """Steps PettingZoo parallel envs with an actor-critic policy into a
    :class:`~replaybank.multiagent.MultiAgentRolloutBuffer` (MAPPO, IPPO).

    Each step of every env is one ``add``: the observations the agents acted on, the
    policy's actions, values and log-probabilities, the env's rewards and per-agent ends,
    the global state before the step (when the buffer stores one: its spec, or, at its
    first add, every env has a working ``state()``), and ``active`` masks. The rules of
    the replay collector (:class:`MultiAgentCollector`) hold: agents that leave
    (terminated or truncated) are inactive from then on, an env whose agents have all
    ended is reset on its own (the first reset of env ``i`` with ``seed + i``), episodes
    continue across :meth:`collect` calls.

    Truncation: an agent truncated (and not terminated) at a step bootstraps from its true
    final observation, PettingZoo's ``step`` observation of it, which is added as
    ``final_obs`` (with ``final_state``, ``env.state()`` after the step) and valued by
    ``value_fn`` in :meth:`compute_returns_and_advantage`, in one batched call.

    Dict observations (PettingZoo's ``{"observation": ..., "action_mask": ...}``, one
    level of keys): the policy and ``value_fn`` get ``{agent: {key: [n, *shape]}}``, one
    array per key with its own dtype (as the replay collector gives them), and the buffer
    stores each key as its own field.

    Args:
        env: A PettingZoo ``ParallelEnv`` (buffer with ``num_envs=1``) or a list of them.
        policy: ``policy(obs, state) -> (actions, values, log_probs)``, always batched
            (:class:`MultiAgentActorCritic`), or None: random actions from
            ``env.action_space(agent)`` (seeded as :class:`MultiAgentCollector` does),
            values and log-probabilities 0, so the advantages are the discounted returns
            (GAE with a zero baseline) and the ratios of a first PPO epoch 1.
        buffer: A :class:`~replaybank.multiagent.MultiAgentRolloutBuffer` with the envs'
            agents and ``num_envs`` equal to the number of envs.
        seed: Seed of the first reset of env ``i`` (``seed + i``) and of random actions.
        value_fn: ``value_fn(obs, state) -> values`` (same batched form) for the bootstrap
            values; default: the policy's ``value`` method, else the values that
            ``policy(obs, state)`` returns, 0 with ``policy=None``.

    Raises:
        ConfigError: See :class:`MultiAgentCollector`; also a ``value_fn`` that is not
            callable.

    Example:
        >>> import numpy as np
        >>> from replaybank.multiagent import MultiAgentRolloutBuffer
        >>> class Countdown:  # agent "b" ends at step 2, "a" is cut off at step 3
        ...     possible_agents = ["a", "b"]
        ...     def action_space(self, agent): return None
        ...     def reset(self, seed=None, options=None):
        ...         self.t, self.agents = 0, ["a", "b"]
        ...         return {k: np.zeros(1, np.float32) for k in self.agents}, {}
        ...     def step(self, actions):
        ...         self.t += 1
        ...         obs = {k: np.full(1, self.t, np.float32) for k in actions}
        ...         term = {k: k == "b" and self.t == 2 for k in actions}
        ...         trunc = {k: k == "a" and self.t == 3 for k in actions}
        ...         self.agents = [k for k in self.agents if not (term[k] or trunc[k])]
        ...         return (obs, {k: 1.0 for k in actions}, term, trunc,
        ...                 {k: {} for k in actions})
        >>> def policy(obs, state):  # V(o) = o, a deterministic action, log-prob 0
        ...     return ({a: np.zeros(len(o), np.int64) for a, o in obs.items()},
        ...             {a: o[:, 0].astype(np.float64) for a, o in obs.items()},
        ...             {a: np.zeros(len(o)) for a, o in obs.items()})
        >>> buf = MultiAgentRolloutBuffer(4, agents=["a", "b"], gamma=1.0, gae_lambda=1.0,
        ...                               seed=0)
        >>> col = MultiAgentRolloutCollector(Countdown(), policy, buf, seed=0)
        >>> res = col.collect()  # fills the rollout (4 steps), then computes advantages
        >>> buf.active["b"][:, 0].tolist(), res.agent_episode_returns
        ([True, True, False, True], [{'a': 3.0, 'b': 2.0}])
        >>> buf.returns["a"][:, 0].tolist()  # 1 + 1 + 1 + V(final obs) 3; 1 + V(next obs) 1
        [6.0, 5.0, 4.0, 2.0]
    """

    def __init__(self, env: Any, policy: RolloutPolicy | None, buffer: Any,
                 seed: int | None = None, value_fn: Any = None) -> None:
        super().__init__(env, buffer, seed, random_actions=policy is None, rollout=True)
        self.buffer: MultiAgentRolloutBuffer = buffer
        if policy is not None and not callable(policy):
            raise ConfigError(f"collect(policy={describe(policy)}): expected a callable "
                              "policy(obs, state) -> (actions, values, log_probs), or None "
                              "for random actions with values and log-probabilities 0")
        if value_fn is not None and not callable(value_fn):
            raise ConfigError(f"MultiAgentRolloutCollector(value_fn={describe(value_fn)}): "
                              "expected a callable value_fn(obs, state) -> values, or None")
        self.policy = policy
        self.value_fn: Callable[[dict[str, Any], Any], Any] = \
            self._default_value if value_fn is None else value_fn

    # ------------------------------------------------------------------ values
    def _default_value(self, obs: dict[str, Any], state: Any) -> Any:
        """The policy's ``value``, else the values part of ``policy(obs, state)``, else 0."""
        if self.policy is None:
            return self._zeros(list(obs), _batch_rows(obs))
        if isinstance(self.policy, MultiAgentActorCritic):
            return self.policy.value(obs, state)
        # (kept final observations: as many rows as there are, not one per env)
        return self._unpack(self.policy(obs, state), list(obs), _batch_rows(obs))[1]

    def _zeros(self, agents: list[str], k: int) -> Any:
        """Zero values in the buffer's form (per agent unless it stores one per env)."""
        if self.buffer.centralised_value:
            return np.zeros(k)
        return {a: np.zeros(k) for a in agents}

    # ------------------------------------------------------------------ envs
    def reset(self, seed: int | None = None) -> None:
        """Reset every env (env ``i`` with ``seed + i``; episode statistics restart).

        The running episodes end in the buffer, cut short as by a time limit
        (:meth:`end_episodes`)."""
        for i in range(self.n):
            self._reset_env(i, None if seed is None else seed + i)
        self._raise_refused()

    def end_episodes(self) -> None:
        """End the running episodes in the buffer now, cut short as by a time limit:
        every agent still running is marked truncated at its last stored step and
        bootstraps from its current observation
        (:meth:`~replaybank.multiagent.MultiAgentRolloutBuffer.end_episodes`); the envs
        are reset at the next step. ``rb.collect`` calls this before it returns a
        rollout that is not full, whose episodes no collector continues. Nothing
        happens to a full rollout (its last steps bootstrap from ``last_values``)."""
        for i in range(self.n):
            self._cut(i, None)
            self._obs[i] = None

    def _cut(self, i: int, state: Any) -> None:
        """End env ``i``'s running episode in the buffer after its last stored step, from
        this collector's current observation of it (and ``state`` ``[n, *shape]``, the
        global state rows; None: the env's current state, when the buffer stores one)."""
        cur = self._obs[i]
        if cur is None or self.buffer.full or not self.buffer.running_agents(i):
            return
        final = {a: _rows({i: cur[a]}, self.n, f"the final observation of agent {a!r}")
                 for a in cur}
        if state is None and self.buffer.layout is not None \
                and self.buffer.layout.state is not None:
            state = _rows({i: self._current_state(i)}, self.n, "the final state")
        self.buffer.end_episodes(i, final_obs=final, final_state=state)

    def _reset_env(self, i: int, seed: int | None) -> None:
        if self._obs[i] is not None:
            self._cut(i, None)  # this collector's running episode, abandoned
        elif not self.buffer.full and self.buffer.running_agents(i):
            where = f"env[{i}]" if self.vector else "env"
            raise ConfigError(
                f"collect(buffer=...): the rollout holds a running episode of {where} "
                f"(agents {list(self.buffer.running_agents(i))}) that another collector "
                "left, and this collector does not have the observation after its last "
                "stored step, which its bootstrap needs; continue with that collector, or "
                "call its end_episodes() first (rb.collect does so when it returns), or "
                f"buffer.end_episodes({i}, final_obs=...), or buffer.reset()")
        super()._reset_env(i, seed)

    def policy_inputs(self) -> tuple[dict[str, Any], np.ndarray | None]:
        """``(obs, state)`` of the next step, as the policy and ``value_fn`` take them:
        ``{agent: [num_envs, *obs_shape]}`` (``{agent: {key: [num_envs, *shape]}}`` for
        dict observations) and ``[num_envs, *state_shape]`` or None (resets the envs not
        reset yet)."""
        self._ready()
        acting = [self._acting(i) for i in range(self.n)]
        obs: dict[str, Any] = {}
        for a in self._agents:
            rows = {i: cur[a] for i, cur in enumerate(self._obs)
                    if cur is not None and a in acting[i]}
            if rows:
                obs[a] = self._stacked(rows, f"the observation of agent {a!r}")
        state = (
            self._stacked({i: self._current_state(i) for i in range(self.n)}, "the state")
            if self._stores_state()
            else None
        )
        return obs, state

    # ------------------------------------------------------------------ policy
    def _unpack(self, out: Any, agents: list[str], rows: int | None = None,
                acting: list[list[str]] | None = None
                ) -> tuple[dict[str, Any], Any, dict[str, Any]]:
        """The policy's ``(actions, values, log_probs)`` for ``rows`` observations (None:
        one per env; ``acting``: the agents acting in each env), checked, as host arrays
        (a ``Tuple`` action as the dict of its parts, :meth:`_action_fields`)."""
        k = self.n if rows is None else rows
        fix = ("a rollout policy returns (actions, values, log_probs): {agent: [n, "
               "*action_shape]}, {agent: [n]} or [n] (centralised), {agent: [n]}")
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            raise ConfigError(f"collect(policy=...): the policy returned {describe(out)}; {fix}")
        actions, values, log_probs = out
        for name, d in (("actions", actions), ("log_probs", log_probs)) + (
                (("values", values),) if isinstance(values, Mapping) else ()):
            if not isinstance(d, Mapping):
                raise ConfigError(f"collect(policy=...): the policy's {name} is "
                                  f"{describe(d)}, not a dict {{agent: ...}}; {fix}")
            missing = [a for a in agents if a not in d]
            if missing:
                raise ConfigError(f"collect(policy=...): the policy's {name} has no entry "
                                  f"for agent(s) {missing}; return one for every agent in obs")
        # a Tuple action as its parts; the tuple rule before np.asarray stacks a tuple
        parts = self._policy_actions(actions, agents, acting or [agents] * self.n)
        per = {"actions": {a: tree_map(np.asarray, parts[a]) for a in agents},
               "log_probs": {a: np.asarray(_numpy(log_probs[a])) for a in agents}}
        vals: Any = {a: np.asarray(_numpy(values[a])) for a in agents} \
            if isinstance(values, Mapping) else np.asarray(_numpy(values))
        for name, arrays in (*per.items(), ("values", vals if isinstance(vals, dict)
                                            else {"(centralised)": vals})):
            leaves: list[tuple[str, Any]] = []  # (whose, [k, ...]): a Tuple action per part
            for a, arr in arrays.items():
                leaves.extend([(f"{a} part {key!r}", x) for key, x in arr.items()]
                              if isinstance(arr, Mapping) else [(a, arr)])
            for a, arr in leaves:
                if arr.ndim == 0 or arr.shape[0] != k:
                    raise ConfigError(
                        f"collect(policy=...): the policy's {name} for {a} has shape "
                        f"{arr.shape}; for {k} observation(s) every output has a leading dim "
                        f"of {k} (the policy is always batched, also for one env)")
        return per["actions"], vals, per["log_probs"]

    def _act(self, obs: dict[str, np.ndarray], state: Any,
             acting: list[list[str]]) -> tuple[dict[str, Any], Any, dict[str, Any]]:
        agents = list(obs)
        if self.policy is None:
            actions = {}
            for a in agents:  # (a Tuple action: the dict of its parts, stacked per part)
                rows = {i: self._action_fields(i, a, self._spaces[i][a].sample())
                        for i in range(self.n) if a in acting[i]}
                actions[a] = _rows(rows, self.n, f"the action of agent {a!r}")
            return actions, self._zeros(agents, self.n), {a: np.zeros(self.n) for a in agents}
        return self._unpack(self.policy(obs, state), agents, acting=acting)

    # ------------------------------------------------------------------ one step
    def step(self, result: MultiAgentCollectResult) -> int:
        """One step of every env, added to the buffer; returns the joint steps stored
        (``num_envs`` less the envs whose step was lost).

        Every observation (and state) is checked with the buffer's checks as it arrives:
        from ``reset``, and from ``env.step`` before the step is added. An env whose
        ``env.step`` gave one the buffer refuses loses that step (its episode is cut at
        its last stored step, bootstrapping from the observation before the lost step,
        and it is reset at the next step); the other envs' steps are stored. The error
        is raised after the step's bookkeeping, so the next call goes on.

        Raises:
            ShapeError, DtypeError, SpecError: The buffer refuses the policy's outputs
                (before any env steps: nothing changed), or an env's observations (see
                above), or the step after the envs stepped (the step is lost in every
                env).
        """
        obs, state = self.policy_inputs()
        acting = [self._acting(i) for i in range(self.n)]
        actions, values, log_probs = self._act(obs, state, acting)
        if self.buffer.layout is None:  # an agent not in the first add needs spec=
            # entries: refused now, before the envs step, not by the add after the step
            self.buffer.check_first_add(list(obs), ("obs", "action", "log_prob") + (
                ("value",) if isinstance(values, Mapping) else ()), call="collect")
        names = list(obs)
        active = {a: np.isin(np.arange(self.n), [i for i in range(self.n) if a in acting[i]])
                  for a in names}
        # the buffer's own checks of what the policy added, before any env steps (the
        # observations and state were checked as they arrived)
        policy_part = {"obs": obs, "action": actions, "value": values, "log_prob": log_probs,
                       "state": state, "active": active}
        try:
            self.buffer.check_step(**policy_part, call="collect")
        except ReplayBankError as exc:
            raise self._not_stepped(exc, "the policy's actions, values or "
                                    "log-probabilities", "of this step") from None
        outs = []
        for i, env in enumerate(self.envs):
            out = env.step({a: self._env_action(i, a, _env_row(actions[a], i))
                            for a in acting[i]})
            self._state[i] = None  # the env moved on (read again when needed)
            outs.append(_checked_step(out, acting[i], f"env[{i}]" if self.vector else "env"))
        first = policy_part if self.buffer.layout is None else None
        lost: list[int] = []
        for i, (nxt, _, te, tr) in enumerate(outs):
            ended = {a for a in acting[i] if te[a] or tr[a]}
            keep = [a for a in getattr(self.envs[i], "agents", ())
                    if a not in self._ended[i] and a not in ended]
            keep += [a for a in acting[i] if tr[a] and not te[a]]  # their final obs
            refused = self._check_arrival(i, {a: nxt[a] for a in self._agents
                                              if a in keep and a in nxt}, first)
            if refused is not None:
                lost.append(i)
                self._refused.append(self._env_refused(refused, i, lost=True))
        reward = {a: np.zeros(self.n) for a in names}
        term = {a: np.zeros(self.n, np.bool_) for a in names}
        trunc = {a: np.zeros(self.n, np.bool_) for a in names}
        final: dict[int, dict[str, Any]] = {}
        for i, (nxt, rew, te, tr) in enumerate(outs):
            if i in lost:
                for a in names:
                    active[a][i] = False
                continue
            for a in acting[i]:
                reward[a][i], term[a][i], trunc[a][i] = float(rew[a]), bool(te[a]), bool(tr[a])
                if trunc[a][i] and not term[a][i]:
                    final.setdefault(i, {})[a] = _copy(self._fields(i, a, nxt[a]))
        extra: dict[str, Any] = {}
        if final:
            extra["final_obs"] = {a: _rows({i: f[a] for i, f in final.items() if a in f},
                                           self.n, f"the final observation of agent {a!r}")
                                  for a in names if any(a in f for f in final.values())}
            if state is not None:
                extra["final_state"] = _rows({i: self._current_state(i)
                                              for i in final}, self.n,
                                             "the final state")
        for i in lost:  # from the observations before the lost step (checked on arrival)
            self._cut(i, state)
        kept = [i for i in range(self.n) if i not in lost]
        if kept:
            try:
                self.buffer.add(obs=obs, action=actions, reward=reward, terminated=term,
                                truncated=trunc, value=values, log_prob=log_probs,
                                state=state, active=active, **extra)
            except ReplayBankError as exc:
                self._refused = []
                for i in range(self.n):  # from the observations before the lost step
                    self._cut(i, state)
                raise self._lost_step(exc, list(range(self.n))) from exc
        for i in lost:
            self._obs[i] = None  # reset at the next step
        result.steps += len(kept)
        result.env_steps += self.n
        for i in kept:
            nxt, rew, te, tr = outs[i]
            self._after(i, acting[i], nxt, rew, te, tr, result)
        self._raise_refused()
        return len(kept)

    def _after(self, i: int, acting: list[str], nxt: Mapping[str, Any],
               rew: Mapping[str, Any], term: Mapping[str, Any], trunc: Mapping[str, Any],
               result: MultiAgentCollectResult) -> None:
        """Env ``i``'s bookkeeping after its step was stored; reset it when it is over."""
        where = f"env[{i}]" if self.vector else "env"
        for a in acting:
            self._ret[i][a] = self._ret[i].get(a, 0.0) + float(rew[a])
            self._alen[i][a] = self._alen[i].get(a, 0) + 1
            if term[a] or trunc[a]:
                self._ended[i].add(a)
        self._len[i] += 1
        live = [a for a in getattr(self.envs[i], "agents", ()) if a not in self._ended[i]]
        if live:
            missing = [a for a in live if a not in nxt]
            if missing:
                raise ConfigError(f"collect(env=...): {where}.step returned no observation "
                                  f"for agent(s) {missing} of env.agents")
            self._obs[i] = {a: _copy(self._fields(i, a, nxt[a])) for a in live}
            return
        self._end_episode(i, result)

    # ------------------------------------------------------------------ rollouts
    def collect(self, n_steps: int | None = None, progress: bool = False,
                description: str = "collect", compute: bool = True
                ) -> MultiAgentCollectResult:
        """Add ``n_steps`` steps of every env to the rollout.

        Args:
            n_steps: Steps per env (the rollout's own unit, as the buffer's ``n_steps``),
                at most the room left (``buffer.n_steps - buffer.pos``); None: fill it.
            progress: Show a progress bar (rich).
            description: Text of the progress bar.
            compute: When the rollout is full afterwards, end with
                :meth:`compute_returns_and_advantage` (so ``buffer.get`` works at once).

        Returns:
            A :class:`MultiAgentCollectResult` for this call (``steps``: joint steps
            added, ``n_steps * num_envs``).

        Raises:
            ConfigError: A bad ``n_steps`` (not a positive int, more than the room left,
                a full rollout), or an env or the policy breaks its API.
        """
        room = self.buffer.n_steps - self.buffer.pos
        if n_steps is None:
            n_steps = room
        if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) \
                or n_steps <= 0 or n_steps > room:
            state = "is full" if room == 0 else f"has room for {room} more steps per env"
            raise ConfigError(
                f"collect(n_steps={n_steps!r}): the rollout {state} (buffer.n_steps="
                f"{self.buffer.n_steps}, pos={self.buffer.pos}); for a rollout buffer "
                "n_steps counts steps per env (not summed over envs): pass 1.."
                f"{room} (or None to fill it)" + (", after buffer.reset()" if room == 0
                                                   else ""))
        result = MultiAgentCollectResult()
        with ProgressBar(int(n_steps) * self.n, description, enabled=progress) as bar:
            for _ in range(int(n_steps)):
                k = self.step(result)
                last = result.episode_returns[-1] if result.episode_returns else None
                bar.update(k, episodes=len(result.episode_returns), ret=last)
        if compute and self.buffer.full:
            self.compute_returns_and_advantage()
        return result

    def last_values(self, value_fn: Any = None) -> Any:
        """The values of the next observations (what the rollout's last steps bootstrap
        from): ``value_fn(*policy_inputs())`` (default: the collector's ``value_fn``), as
        host arrays, ``{agent: [num_envs]}`` or ``[num_envs]``."""
        fn = self.value_fn if value_fn is None else value_fn
        out = _numpy(fn(*self.policy_inputs()))
        if isinstance(out, Mapping):
            return {a: np.asarray(_numpy(v)) for a, v in out.items()}
        return np.asarray(out)

    def compute_returns_and_advantage(self, value_fn: Any = None) -> None:
        """``buffer.compute_returns_and_advantage`` with :meth:`last_values` and
        ``value_fn`` (default: the collector's) for the kept final observations.

        Raises:
            ReplayBankError: What the buffer's ``compute_returns_and_advantage`` raises
                (a missing or misshaped value from ``value_fn``).
        """
        fn = self.value_fn if value_fn is None else value_fn
        self.buffer.compute_returns_and_advantage(last_values=self.last_values(fn),
                                                  value_fn=fn)
