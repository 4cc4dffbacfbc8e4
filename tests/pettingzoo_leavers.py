"""Hand-written PettingZoo parallel envs whose agents leave mid-episode, and a recorder of
what an env returned: for the multi-agent rollout collection tests. Also envs of odd
values for both collectors: different dtypes per env (:class:`Fractions`), gymnasium
``Tuple`` observations (:class:`TupleObs`, :class:`TupleNoSpace`), a ``Tuple`` action
space beside a ``Box`` one (:class:`TupleActs`), a ``Dict`` one (:class:`DictActs`) and
an agent that joins late (:class:`LateJoiner`).

Other test files import them: ``from tests.pettingzoo_leavers import Leaver, Recorder``.
:class:`Clock` is one whose episodes are easy to follow (for collections that reset it
mid-episode).
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from pettingzoo.utils.env import ParallelEnv


class Leaver(ParallelEnv):  # type: ignore[misc]
    """Three agents: "b" terminates at step ``b_end``, "c" is truncated at ``c_end``, "a"
    is truncated at ``a_end`` (the episode's end). Observations differ every step
    (step, episode, noise); ``state()`` is (step, episode, live agents)."""

    metadata: ClassVar[dict[str, Any]] = {"name": "leaver_v1"}

    def __init__(self, b_end: int = 2, c_end: int = 4, a_end: int = 5) -> None:
        self.possible_agents = ["a", "b", "c"]
        self.ends = {"a": a_end, "b": b_end, "c": c_end}
        self.episode = -1
        self.rng = np.random.default_rng()

    def action_space(self, agent: str) -> Any:
        return gym.spaces.Discrete(3)

    def observation_space(self, agent: str) -> Any:
        return gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)

    def _observe(self, agent: str) -> np.ndarray:
        return np.array([self.t, self.episode, self.rng.normal()], np.float32)

    def state(self) -> np.ndarray:
        return np.array([self.t, self.episode, len(self.agents)], np.float32)

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.episode += 1
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: self._observe(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> Any:
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.t += 1
        obs = {a: self._observe(a) for a in actions}
        rew = {a: float(actions[a]) + self.rng.normal() for a in actions}
        term = {a: a == "b" and self.t >= self.ends[a] for a in actions}
        trunc = {a: a != "b" and self.t >= self.ends[a] for a in actions}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, {a: {} for a in actions}


class DictLeaver(Leaver):
    """Three agents with their own spaces: "a" observes ``{"observation": float32[3],
    "action_mask": int8[3]}`` (the mask changes with the step), "b" a plain float32[2],
    "c" ``{"pos": float64[2], "legal": bool[3]}``. "b" terminates at ``b_end``, "c" is
    truncated at ``c_end``, "a" at ``a_end`` (the episode's end). With ``reuse``, "a"'s
    dict and its arrays are one object overwritten in place at every step."""

    metadata: ClassVar[dict[str, Any]] = {"name": "dict_leaver_v0"}

    def __init__(self, b_end: int = 2, c_end: int = 4, a_end: int = 5,
                 reuse: bool = False) -> None:
        super().__init__(b_end, c_end, a_end)
        self.reuse = reuse
        self._a: dict[str, Any] = {"observation": np.zeros(3, np.float32),
                                   "action_mask": np.zeros(3, np.int8)}

    def observation_space(self, agent: str) -> Any:
        if agent == "a":
            return gym.spaces.Dict({"observation": gym.spaces.Box(-np.inf, np.inf, (3,),
                                                                  np.float32),
                                    "action_mask": gym.spaces.MultiBinary(3)})
        if agent == "b":
            return gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        return gym.spaces.Dict({"pos": gym.spaces.Box(-np.inf, np.inf, (2,), np.float64),
                                "legal": gym.spaces.MultiBinary(3)})

    def _observe(self, agent: str) -> Any:
        noise = self.rng.normal()
        if agent == "a":
            base = np.array([self.t, self.episode, noise], np.float32)
            mask = np.array([1, self.t % 2, self.episode % 2], np.int8)
            if not self.reuse:
                return {"observation": base, "action_mask": mask}
            self._a["observation"][:] = base
            self._a["action_mask"][:] = mask
            return self._a
        if agent == "b":
            return np.array([self.t + 100, noise], np.float32)
        return {"pos": np.array([self.t, noise]),
                "legal": np.array([True, self.t % 2 == 0, self.t % 3 == 0])}


def _copy(o: Any) -> Any:
    """A private copy of an observation (a dict observation's arrays too)."""
    return {k: np.array(v) for k, v in o.items()} if isinstance(o, dict) else np.array(o)


class Recorder:
    """Forwards to ``env`` and logs each step: the observations and state before it,
    the actions, the four dicts it returned and the state after it."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.log: list[dict[str, Any]] = []
        self.pending: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        obs, info = self.env.reset(seed=seed, options=options)
        self.pending = {a: _copy(o) for a, o in obs.items()}
        return obs, info

    def step(self, actions: dict[str, Any]) -> Any:
        before = self.env.state()
        out = self.env.step(actions)
        obs, rew, term, trunc, _ = out
        self.log.append(dict(obs=self.pending, action=dict(actions),
                             next={a: _copy(o) for a, o in obs.items()}, rew=dict(rew),
                             term=dict(term), trunc=dict(trunc), state=np.array(before),
                             state_after=np.array(self.env.state())))
        self.pending = {a: _copy(o) for a, o in obs.items() if a in self.env.agents}
        return out


class Fractions(ParallelEnv):  # type: ignore[misc]
    """One agent "a" observing ``[0.25 * t]`` as ``dtype`` (an int dtype gives zeros),
    with ``state()`` the same; it is truncated at step 3 (the episode's end). Two of
    them with different dtypes, as vector envs, stack values of different dtypes."""

    metadata: ClassVar[dict[str, Any]] = {"name": "fractions_v0"}

    def __init__(self, dtype: Any) -> None:
        self.possible_agents = ["a"]
        self.dtype = dtype
        self.t = 0

    def action_space(self, agent: str) -> Any:
        return gym.spaces.Discrete(2)

    def observation_space(self, agent: str) -> Any:
        return gym.spaces.Box(0, 1, (1,), self.dtype)

    def state(self) -> np.ndarray:
        return np.array([0.25 * self.t], self.dtype)

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        self.t = 0
        self.agents = ["a"]
        return {"a": self.state()}, {"a": {}}

    def step(self, actions: dict[str, Any]) -> Any:
        self.t += 1
        end = self.t == 3
        self.agents = [] if end else ["a"]
        return ({"a": self.state()}, {"a": 1.0}, {"a": False}, {"a": end}, {"a": {}})


class TupleNoSpace:
    """Agents "a" and "b" observe a gymnasium ``Tuple`` value ``(float32[3] of t,
    float32[2] of 10 + t)`` and are truncated at step 3; the env declares no observation
    space (:class:`TupleObs` does)."""

    def __init__(self) -> None:
        self.possible_agents = ["a", "b"]
        self.t = 0

    def action_space(self, agent: str) -> Any:
        return gym.spaces.Discrete(2)

    def _observe(self) -> tuple[np.ndarray, np.ndarray]:
        return np.full(3, self.t, np.float32), np.full(2, 10 + self.t, np.float32)

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        self.t = 0
        self.agents = ["a", "b"]
        return {a: self._observe() for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> Any:
        self.t += 1
        end = self.t == 3
        self.agents = [] if end else ["a", "b"]
        return ({a: self._observe() for a in actions}, {a: 1.0 for a in actions},
                {a: False for a in actions}, {a: end for a in actions},
                {a: {} for a in actions})


class TupleObs(TupleNoSpace):
    """:class:`TupleNoSpace` with its ``Tuple`` observation space."""

    def observation_space(self, agent: str) -> Any:
        return gym.spaces.Tuple((gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
                                 gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)))


class LateJoiner(ParallelEnv):  # type: ignore[misc]
    """Agents "a" and "b" act from the reset; "c" joins at step 2 (its first observation
    comes with step 2's); all are truncated at step 4. Observations are ``[t, agent
    index]`` float32."""

    metadata: ClassVar[dict[str, Any]] = {"name": "late_joiner_v0"}

    def __init__(self) -> None:
        self.possible_agents = ["a", "b", "c"]
        self.t = 0

    def action_space(self, agent: str) -> Any:
        return gym.spaces.Discrete(2)

    def observation_space(self, agent: str) -> Any:
        return gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def _observe(self, agent: str) -> np.ndarray:
        return np.array([self.t, self.possible_agents.index(agent)], np.float32)

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        self.t = 0
        self.agents = ["a", "b"]
        return {a: self._observe(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> Any:
        self.t += 1
        end = self.t == 4
        self.agents = [] if end else ["a", "b", "c"] if self.t >= 2 else ["a", "b"]
        obs = {a: self._observe(a) for a in {*actions, *self.agents}}
        return (obs, {a: 1.0 for a in actions}, {a: False for a in actions},
                {a: end for a in actions}, {a: {} for a in actions})


class Clock:
    """A parallel env whose observation of agent ``k`` is ``[t, k, episode]``; agent "b"
    terminates at its 2nd step, "a" runs to ``horizon``; rewards ``t`` (``t + 0.5`` for
    "b"). Its action spaces sample int64 actions in ``[0, 3)``."""

    possible_agents: ClassVar[list[str]] = ["a", "b"]

    def __init__(self, horizon: int = 10) -> None:
        self.horizon, self.ep, self.t = horizon, -1, 0
        self.agents: list[str] = []

    def action_space(self, agent: str) -> Any:
        return gym.spaces.Discrete(3)

    def _obs(self, agents: list[str]) -> dict[str, np.ndarray]:
        return {k: np.array([self.t, i, self.ep], np.float32)
                for i, k in enumerate(self.possible_agents) if k in agents}

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        self.t, self.ep = 0, self.ep + 1
        self.agents = list(self.possible_agents)
        return self._obs(self.agents), {k: {} for k in self.agents}

    def step(self, actions: dict[str, Any]) -> Any:
        self.t += 1
        acting = list(actions)
        term = {k: k == "b" and self.t == 2 for k in acting}
        trunc = {k: k == "a" and self.t == self.horizon for k in acting}
        rew = {k: self.t + (0.5 if k == "b" else 0.0) for k in acting}
        self.agents = [k for k in self.agents if not (term[k] or trunc[k])]
        return self._obs(acting), rew, term, trunc, {k: {} for k in acting}


class OddFirstEpisode(Clock):
    """Agent "a" observes ``odd`` (another shape or dtype than Clock's float32[3]) in
    the first episode only."""

    def __init__(self, odd: np.ndarray) -> None:
        super().__init__()
        self.odd = odd

    def _obs(self, agents: list[str]) -> dict[str, np.ndarray]:
        obs = super()._obs(agents)
        if self.ep == 0 and "a" in obs:
            obs["a"] = self.odd
        return obs


class TupleActs:
    """Agent "t" acts with a gymnasium ``Tuple(Discrete(3), Box(-9, 9, (2,), float32))``
    and "x" with a ``Box(-9, 9, (2,), float32)``; both observe ``[step, 100 * env_id +
    episode]`` float32. "x" is truncated at step 2 and "t" at step 3 (the episode's
    end). ``step`` asserts that every action is one its ``action_space(agent).contains``
    (for "t": a tuple again) and keeps them in :attr:`seen` with the observation the
    agent acted on; the reward is the action's sum (a tuple's parts summed)."""

    possible_agents: ClassVar[list[str]] = ["t", "x"]

    def __init__(self, env_id: int = 0) -> None:
        self.env_id, self.ep, self.step_no = env_id, -1, 0
        self.agents: list[str] = []
        self.seen: list[tuple[str, tuple[float, ...], Any]] = []

    def action_space(self, agent: str) -> Any:
        box = gym.spaces.Box(-9, 9, (2,), np.float32)
        return gym.spaces.Tuple((gym.spaces.Discrete(3), box)) if agent == "t" else box

    def observation_space(self, agent: str) -> Any:
        return gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def _obs(self, agents: list[str]) -> dict[str, np.ndarray]:
        return {k: np.array([self.step_no, 100 * self.env_id + self.ep], np.float32)
                for k in agents}

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        self.step_no, self.ep = 0, self.ep + 1
        self.agents = list(self.possible_agents)
        return self._obs(self.agents), {k: {} for k in self.agents}

    def step(self, actions: dict[str, Any]) -> Any:
        assert set(actions) == set(self.agents), (actions, self.agents)
        acted_on = (float(self.step_no), float(100 * self.env_id + self.ep))
        for k, act in actions.items():
            assert self.action_space(k).contains(act), (k, act)
            self.seen.append((k, acted_on, act))
        self.step_no += 1
        parted = self.possible_agents[0]  # the agent whose action comes in parts
        rew = {k: self._parts_sum(a) if k == parted else float(np.sum(a))
               for k, a in actions.items()}
        trunc = {k: self.step_no == (3 if k == parted else 2) for k in actions}
        self.agents = [k for k in self.agents if not trunc[k]]
        return (self._obs(list(actions)), rew, {k: False for k in actions}, trunc,
                {k: {} for k in actions})

    @staticmethod
    def _parts_sum(action: Any) -> float:
        """The reward of a tuple action: its parts summed."""
        return float(int(action[0]) + np.sum(action[1]))


class DictActs(TupleActs):
    """:class:`TupleActs` with agent "d" acting with a gymnasium ``Dict({"move":
    Box(-9, 9, (2,), float32), "pick": Discrete(3)})`` beside "x"'s ``Box``; ``step``
    asserts every action is one its ``action_space(agent).contains`` (for "d": a dict)
    and the reward is the action's sum (``pick + sum(move)`` for "d")."""

    possible_agents: ClassVar[list[str]] = ["d", "x"]

    def action_space(self, agent: str) -> Any:
        box = gym.spaces.Box(-9, 9, (2,), np.float32)
        if agent == "d":
            return gym.spaces.Dict({"move": box, "pick": gym.spaces.Discrete(3)})
        return box

    @staticmethod
    def _parts_sum(action: Any) -> float:
        """The reward of a dict action: ``pick + sum(move)``."""
        return float(int(action["pick"]) + np.sum(action["move"]))


def dict_policy(obs: dict[str, Any]) -> dict[str, Any]:
    """Actions of :class:`DictActs`' agents as functions of their observations ``[...,
    2]``: "d" a dict ``{"move": float32[2], "pick": int}`` (with several envs, ``[n,
    ...]`` per key, as a gymnasium vector env's Dict action), "x" one float32[2]."""
    out: dict[str, Any] = {}
    if "d" in obs:
        o = np.asarray(obs["d"])
        out["d"] = {"move": np.stack([o[..., 0] / 4, o[..., 1] / 1000], -1).astype(np.float32),
                    "pick": o[..., 0].astype(np.int64) % 3}
    if "x" in obs:
        o = np.asarray(obs["x"])
        out["x"] = np.stack([-o[..., 0] / 4, o[..., 1] / 1000], -1).astype(np.float32)
    return out


def tuple_policy(obs: dict[str, Any]) -> dict[str, Any]:
    """Actions of :class:`TupleActs`' agents as functions of their observations ``[...,
    2]`` (an oracle of any stored row): "t" a tuple ``(Discrete, float32[2])`` (with
    several envs: one array ``[n, ...]`` per part, as a gymnasium vector env's Tuple
    action), "x" one float32[2]."""
    out: dict[str, Any] = {}
    if "t" in obs:
        o = np.asarray(obs["t"])
        out["t"] = (o[..., 0].astype(np.int64) % 3,
                    np.stack([o[..., 0] / 4, o[..., 1] / 1000], -1).astype(np.float32))
    if "x" in obs:
        o = np.asarray(obs["x"])
        out["x"] = np.stack([-o[..., 0] / 4, o[..., 1] / 1000], -1).astype(np.float32)
    return out


class Forwarding:
    """A parallel env that forwards to ``env``: its agents, spaces and ``state()``
    (the wrappers below override what they count, log or change)."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.possible_agents = list(env.possible_agents)

    @property
    def agents(self) -> list[str]:
        return list(self.env.agents)

    def action_space(self, agent: str) -> Any:
        return self.env.action_space(agent)

    def observation_space(self, agent: str) -> Any:
        return self.env.observation_space(agent)

    def state(self) -> Any:
        return self.env.state()

    def close(self) -> None:
        self.env.close()


class Watched(Forwarding):
    """Forwards to a parallel env ``env`` and counts the calls a collector makes:
    ``reads`` of ``state()``, ``resets`` and ``steps``. With ``spoil``, what the env gives
    at its ``at``-th step (1 = its first, counted over its whole life) is passed through
    ``spoil(obs, state) -> (obs, state)`` first: the observations that step returns, and
    ``state()`` from then until the env steps or is reset again."""

    def __init__(self, env: Any, at: int = 0, spoil: Any = None) -> None:
        super().__init__(env)
        self.at, self.spoil = at, spoil
        self.reads = self.resets = self.steps = 0
        self._spoilt = False

    def state(self) -> Any:
        self.reads += 1
        state = self.env.state()
        return self.spoil({}, state)[1] if self._spoilt else state

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        self.resets += 1
        self._spoilt = False
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: dict[str, Any]) -> Any:
        self.steps += 1
        obs, *rest = self.env.step(actions)
        self._spoilt = self.spoil is not None and self.steps == self.at
        if self._spoilt:
            obs = self.spoil(dict(obs), None)[0]
        return (obs, *rest)
