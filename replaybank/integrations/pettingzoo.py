"""Fill a :class:`~replaybank.multiagent.MultiAgentReplayBuffer` from PettingZoo parallel envs.

:class:`MultiAgentCollector` steps one PettingZoo ``ParallelEnv``, or a list of them as
vector envs (one buffer lane per env), with a policy and adds one joint step of every env
per env step. ``rb.collect(env, policy, buffer, n_steps)`` dispatches here when it is given
a parallel env, a list of them or a multi-agent buffer.

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

Policies: ``policy(obs) -> actions``. With one env (not a list), ``obs`` is the env's own
dict ``{agent: obs}`` of the acting agents and the policy returns ``{agent: action}`` for
each. With a list of ``n`` envs, ``obs`` is ``{agent: [n, *obs_shape]}`` for every agent
acting in at least one env (zeros in the envs where it does not act;
:attr:`MultiAgentCollector.active` says where it does) and the policy returns
``{agent: [n, *action_shape]}`` for the same agents (the values of envs where an agent does
not act are ignored). numpy arrays or torch tensors. ``policy=None`` samples
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
from typing import Any

import numpy as np

from replaybank.errors import ConfigError, describe
from replaybank.host import is_tensor, tensor_to_numpy
from replaybank.integrations.gymnasium import CollectResult
from replaybank.integrations.progress import ProgressBar
from replaybank.multiagent import MultiAgentReplayBuffer

__all__ = ["MultiAgentCollectResult", "MultiAgentCollector", "collect_multiagent",
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


def _is_env_list(env: Any) -> bool:
    return (isinstance(env, (list, tuple)) and len(env) > 0
            and all(is_parallel_env(e) or is_aec_env(e) for e in env))


def wants_multiagent(env: Any, buffer: Any) -> bool:
    """Whether ``collect(env, ..., buffer)`` is a multi-agent collection: ``env`` is a
    parallel (or AEC) env or a list of them, or ``buffer`` is a
    :class:`~replaybank.multiagent.MultiAgentReplayBuffer`."""
    return (is_parallel_env(env) or is_aec_env(env) or _is_env_list(env)
            or isinstance(buffer, MultiAgentReplayBuffer))


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
def _check_envs(env: Any, buffer: Any) -> tuple[list[Any], bool]:
    """The envs and whether they came as a list (vector envs), checked against
    ``buffer``."""
    fix_buf = ("build rb.MultiAgentReplayBuffer(capacity, agents=env.possible_agents, "
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
                f"collect({where}={describe(e)}): a MultiAgentReplayBuffer is filled from "
                "a PettingZoo ParallelEnv (possible_agents, action_space(agent), step "
                "returning five dicts) or a list of them; pass one, or fill a "
                "gymnasium env into rb.ReplayBuffer")
    if not isinstance(buffer, MultiAgentReplayBuffer):
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


def _rows(values: dict[int, Any], n: int) -> np.ndarray:
    """``[n, *shape]``: ``values[i]`` in row ``i``, zeros in the rows not given (the
    dtype and shape of the first value)."""
    first = np.asarray(next(iter(values.values())))
    out = np.zeros((n, *first.shape), first.dtype)
    for i, v in values.items():
        out[i] = v
    return out


def _copy(x: Any) -> Any:
    """A private copy of an observation (an env may reuse its arrays)."""
    return np.array(x) if isinstance(x, np.ndarray) else x


# ---------------------------------------------------------------------- collector
class MultiAgentCollector:
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
        self.envs, self.vector = _check_envs(env, buffer)
        self.env = env
        self.buffer: MultiAgentReplayBuffer = buffer
        if policy is not None and not callable(policy):
            raise ConfigError(f"collect(policy={describe(policy)}): expected a callable "
                              "policy(obs_dict) -> action_dict, or None for random actions")
        self.policy = policy
        self.seed = seed
        self.n = len(self.envs)
        self._agents = tuple(buffer.agents)  # the buffer's order
        # whether each env has a working state(), known after its first reset
        self._env_state: list[bool | None] = [
            None if callable(getattr(e, "state", None)) else False for e in self.envs]
        if self._layout_state() and False in self._env_state:
            self._no_state(self._env_state.index(False))
        self._spaces: list[dict[str, Any]] = [{} for _ in range(self.n)]
        if policy is None:
            seqs = np.random.SeedSequence(seed).spawn(self.n * len(self._agents)) \
                if seed is not None else None
            for i, e in enumerate(self.envs):
                for j, a in enumerate(self._agents):
                    if a not in e.possible_agents:
                        continue
                    space = e.action_space(a)
                    space.seed(None if seqs is None else
                               int(seqs[i * len(self._agents) + j].generate_state(1)[0]))
                    self._spaces[i][a] = space
        self._obs: list[dict[str, Any] | None] = [None] * self.n
        self._state: list[Any] = [None] * self.n
        self._ended: list[set[str]] = [set() for _ in range(self.n)]
        self._ret: list[dict[str, float]] = [{} for _ in range(self.n)]
        self._alen: list[dict[str, int]] = [{} for _ in range(self.n)]
        self._len = np.zeros(self.n, np.int64)
        self.episodes = 0

    # ------------------------------------------------------------------ state
    def _layout_state(self) -> bool | None:
        """Whether the buffer stores a global state (None: its first add decides)."""
        layout = self.buffer.layout
        return None if layout is None else layout.state is not None

    def _no_state(self, i: int) -> None:
        raise ConfigError(
            f"collect(buffer=...): the buffer stores a global state but "
            f"env{f'[{i}]' if self.vector else ''} has no working state(); build the "
            "buffer without spec['state'], or use an env with state()")

    def _stores_state(self) -> bool:
        """Whether this step stores ``state``/``next_state`` (every env was reset)."""
        known = self._layout_state()
        if known is None:  # the first add decides: a state when every env has one
            return all(self._env_state)
        if known and not all(self._env_state):
            self._no_state(self._env_state.index(False))
        return known

    def _reset_env(self, i: int, seed: int | None) -> None:
        env = self.envs[i]
        obs, _ = env.reset(seed=seed)
        agents = list(getattr(env, "agents", ()))
        where = f"env[{i}]" if self.vector else "env"
        if not agents:
            raise ConfigError(f"collect(env=...): {where}.reset() left env.agents empty; "
                              "a parallel env lists its live agents in env.agents")
        missing = [a for a in agents if a not in obs]
        if missing:
            raise ConfigError(f"collect(env=...): {where}.reset() returned no observation "
                              f"for agent(s) {missing} of env.agents")
        self._obs[i] = {a: _copy(obs[a]) for a in agents}
        if self._env_state[i] is None:
            self._env_state[i] = _has_state(env)
        self._state[i] = None  # read before the next step when the buffer stores it
        self._ended[i] = set()
        self._ret[i] = {}
        self._alen[i] = {}
        self._len[i] = 0

    def reset(self, seed: int | None = None) -> Any:
        """Reset every env (env ``i`` with ``seed + i``; episode statistics restart) and
        return :attr:`obs`."""
        for i in range(self.n):
            self._reset_env(i, None if seed is None else seed + i)
        return self.obs

    @property
    def obs(self) -> Any:
        """The current observations: the env's ``{agent: obs}`` (one env), or one such
        dict per env (a list of envs); None before the first step."""
        if self._obs[0] is None:
            return None
        return list(self._obs) if self.vector else self._obs[0]

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

    # ------------------------------------------------------------------ actions
    def _actions(self, acting: list[list[str]]) -> list[dict[str, Any]]:
        """One action dict per env for its acting agents."""
        if self.policy is None:
            return [{a: self._spaces[i][a].sample() for a in acting[i]} for i in range(self.n)]
        if not self.vector:
            obs = {a: self._obs[0][a] for a in acting[0]} if self._obs[0] else {}
            out = self.policy(obs)
            self._check_actions(out, acting[0])
            return [{a: _numpy(out[a]) for a in acting[0]}]
        batch = self._batch_obs(acting)
        out = self.policy(batch)
        self._check_actions(out, list(batch))
        per_env: list[dict[str, Any]] = [{} for _ in range(self.n)]
        for a in batch:
            values = np.asarray(_numpy(out[a]))
            if values.ndim == 0 or values.shape[0] != self.n:
                raise ConfigError(
                    f"collect(policy=...): the action of agent {a!r} has shape "
                    f"{values.shape}; with {self.n} envs the policy returns "
                    f"{{agent: [{self.n}, *action_shape]}} (one row per env)")
            for i in range(self.n):
                if a in acting[i]:
                    per_env[i][a] = values[i]
        return per_env

    def _batch_obs(self, acting: list[list[str]]) -> dict[str, np.ndarray]:
        """``{agent: [n, *obs_shape]}`` of the agents acting in some env (zeros in the
        envs where they do not act)."""
        obs: dict[str, np.ndarray] = {}
        for a in self._agents:
            rows = {i: cur[a] for i, cur in enumerate(self._obs)
                    if cur is not None and a in acting[i]}
            if rows:
                obs[a] = _rows(rows, self.n)
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
    def step(self, result: MultiAgentCollectResult) -> int:
        """One step of every env; returns the number of joint steps stored."""
        for i in range(self.n):
            if self._obs[i] is None:
                self._reset_env(i, None if self.seed is None else self.seed + i)
        store_state = self._stores_state()
        acting = [self._acting(i) for i in range(self.n)]
        actions = self._actions(acting)
        steps: list[dict[str, Any] | None] = []
        for i, env in enumerate(self.envs):
            if not acting[i]:
                steps.append(None)
                continue
            if store_state and self._state[i] is None:
                self._state[i] = _copy(env.state())
            out = env.step(actions[i])
            steps.append(self._outcome(i, acting[i], actions[i], out, store_state))
        self._store(steps, store_state)
        stored = sum(s is not None for s in steps)
        result.steps += stored
        result.env_steps += stored
        for i, s in enumerate(steps):
            if s is not None:
                self._after(i, s, result)
        return stored

    def _outcome(self, i: int, acting: list[str], actions: dict[str, Any], out: Any,
                 store_state: bool) -> dict[str, Any]:
        """Env ``i``'s step, checked: ``{obs, action, reward, next_obs, terminated,
        truncated: {agent: value}, state, next_state, raw_next}``."""
        where = f"env[{i}]" if self.vector else "env"
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
        cur = self._obs[i]
        assert cur is not None  # set by _reset_env
        step = {
            "obs": {a: cur[a] for a in acting},
            "action": {a: actions[a] for a in acting},
            "reward": {a: float(rew[a]) for a in acting},
            "next_obs": {a: nxt[a] for a in acting},
            "terminated": {a: bool(term[a]) for a in acting},
            "truncated": {a: bool(trunc[a]) for a in acting},
            "raw_next": nxt,
        }
        if store_state:
            step["state"] = self._state[i]
            step["next_state"] = _copy(self.envs[i].state())
        return step

    def _store(self, steps: list[dict[str, Any] | None], store_state: bool) -> None:
        keys = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
        if not self.vector:
            s = steps[0]
            if s is None:
                return
            joint = {"state": s["state"], "next_state": s["next_state"]} if store_state \
                else {}
            self.buffer.add(**{k: s[k] for k in keys}, **joint)
            return
        live = {i: s for i, s in enumerate(steps) if s is not None}
        if not live:
            return
        values: dict[str, dict[str, np.ndarray]] = {k: {} for k in keys}
        active: dict[str, np.ndarray] = {}
        for a in self._agents:
            acted = {i: s for i, s in live.items() if a in s["obs"]}
            if not acted:
                continue
            active[a] = np.isin(np.arange(self.n), list(acted))
            for k in keys:
                values[k][a] = _rows({i: s[k][a] for i, s in acted.items()}, self.n)
        state = {k: _rows({i: s[k] for i, s in live.items()}, self.n)
                 for k in ("state", "next_state")} if store_state else {}
        self.buffer.add(**values, active=active, **state)

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
            self._obs[i] = {a: _copy(nxt[a]) for a in live}
            self._state[i] = s.get("next_state")  # the next step's state
            return
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


def collect_multiagent(env: Any, policy: MultiAgentPolicy | None, buffer: Any, n_steps: int,
                       progress: bool = True,
                       seed: int | None = None) -> MultiAgentCollectResult:
    """Reset the parallel env(s), step them with ``policy`` and add ``n_steps`` joint steps
    to ``buffer`` (what ``rb.collect`` does for a parallel env).

    For repeated collection that continues episodes across calls, keep a
    :class:`MultiAgentCollector`.

    Args:
        env: A PettingZoo ``ParallelEnv`` or a list of them (vector envs).
        policy: ``policy(obs_dict) -> action_dict`` (None: random actions).
        buffer: A :class:`~replaybank.multiagent.MultiAgentReplayBuffer` with
            ``num_envs`` equal to the number of envs.
        n_steps: Joint steps to add (whole vector steps; may overshoot by < num envs).
        progress: Show a rich progress bar.
        seed: Seed of the first resets (env ``i``: ``seed + i``) and of random actions.

    Returns:
        :class:`MultiAgentCollectResult` with steps and the joint and per-agent returns
        and lengths of finished episodes.

    Raises:
        ConfigError: See :class:`MultiAgentCollector` and :meth:`MultiAgentCollector.collect`.
    """
    return MultiAgentCollector(env, policy, buffer, seed=seed).collect(n_steps,
                                                                       progress=progress)

