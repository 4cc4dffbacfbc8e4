"""``rb.collect`` on PettingZoo parallel envs into a MultiAgentReplayBuffer.

Every env is wrapped in a :class:`Recorder` that logs what it returned (resets, actions,
the five step dicts, ``state()`` before and after each step, ``env.agents`` before and
after); every stored joint transition (all of them, found by key) must equal the log.
Envs: mpe2's ``simple_spread_v3`` (3 agents, truncation at ``max_cycles``) and
:class:`Leaver`, a tiny ParallelEnv where agent "b" terminates at step 3 and "a" goes on
to step 6 (different observation and action spaces).
"""

from __future__ import annotations

import copy
import re
from typing import Any, ClassVar

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
mpe2 = pytest.importorskip("mpe2")

import gymnasium as gym  # noqa: E402  (pettingzoo depends on it)
from mpe2 import simple_spread_v3  # noqa: E402
from pettingzoo.utils.env import ParallelEnv  # noqa: E402

import replaybank as rb  # noqa: E402
from replaybank.errors import ConfigError, DtypeError, ShapeError, SpecError  # noqa: E402
from replaybank.integrations.pettingzoo import (  # noqa: E402
    MultiAgentCollector,
    MultiAgentCollectResult,
    is_parallel_env,
)
from tests.pettingzoo_leavers import (  # noqa: E402
    Clock,
    DictActs,
    Forwarding,
    Fractions,
    LateJoiner,
    OddFirstEpisode,
    TupleActs,
    TupleNoSpace,
    TupleObs,
    Watched,
    dict_policy,
    tuple_policy,
)


# ---------------------------------------------------------------------- envs
class Leaver(ParallelEnv):  # type: ignore[misc]
    """Agent "b" ends at step ``b_end``, "a" at ``a_end`` (terminated, or truncated with
    ``a_truncates``). Observations carry (step, episode, agent) so every one differs."""

    metadata: ClassVar[dict[str, Any]] = {"name": "leaver_v0"}

    def __init__(self, b_end: int = 3, a_end: int = 6, a_truncates: bool = False) -> None:
        self.possible_agents = ["a", "b"]
        self.b_end, self.a_end, self.a_truncates = b_end, a_end, a_truncates
        self._act = {"a": gym.spaces.Discrete(3),
                     "b": gym.spaces.Box(-1, 1, (2,), np.float32)}
        self._obs = {"a": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
                     "b": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)}
        self.episode = -1
        self.rng = np.random.default_rng()

    def action_space(self, agent: str) -> Any:
        return self._act[agent]

    def observation_space(self, agent: str) -> Any:
        return self._obs[agent]

    def _observe(self, agent: str) -> np.ndarray:
        noise = self.rng.normal()
        if agent == "a":
            return np.array([self.t, self.episode, noise], np.float32)
        return np.array([self.t + 100, noise], np.float32)

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
        rew = {a: float(actions[a]) if a == "a" else float(np.sum(actions[a]))
               for a in actions}
        end = {"a": self.t >= self.a_end, "b": self.t >= self.b_end}
        term = {a: end[a] and not (a == "a" and self.a_truncates) for a in actions}
        trunc = {a: end[a] and a == "a" and self.a_truncates for a in actions}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, {a: {} for a in actions}


class DictLeaver(Leaver):
    """:class:`Leaver` where "a" observes a dict, as PettingZoo's classic envs do:
    ``{"observation": float32[3], "action_mask": int8[3]}`` (the mask changes with the
    step); "b" observes a plain array. ``mask_key`` renames the mask key (an env whose
    observations have other keys than its neighbour's); with ``reuse`` "a"'s dict and its
    arrays are one object, overwritten in place at every step (as some envs do)."""

    def __init__(self, b_end: int = 3, a_end: int = 6, a_truncates: bool = False,
                 mask_key: str = "action_mask", reuse: bool = False) -> None:
        super().__init__(b_end, a_end, a_truncates)
        self.mask_key = mask_key
        self._obs["a"] = gym.spaces.Dict({"observation": self._obs["a"],
                                          mask_key: gym.spaces.MultiBinary(3)})
        self.reuse = reuse
        self._a_obs = {"observation": np.zeros(3, np.float32),
                       mask_key: np.zeros(3, np.int8)}

    def _observe(self, agent: str) -> Any:
        base = super()._observe(agent)
        if agent == "b":
            return base
        mask = np.array([1, self.t % 2, self.episode % 2], np.int8)
        if self.reuse:
            self._a_obs["observation"][:] = base
            self._a_obs[self.mask_key][:] = mask
            return self._a_obs
        return {"observation": base, self.mask_key: mask}


class Recorder(Forwarding):
    """A parallel env that forwards to ``env`` and logs everything it returned."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.log: list[dict[str, Any]] = []

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        obs, info = self.env.reset(seed=seed, options=options)
        self.log.append({"kind": "reset", "seed": seed, "obs": copy.deepcopy(obs)})
        return obs, info

    def step(self, actions: dict[str, Any]) -> Any:
        before = list(self.env.agents)
        s0 = np.array(self.env.state())
        out = self.env.step(actions)
        self.log.append({"kind": "step", "actions": copy.deepcopy(dict(actions)),
                         "out": copy.deepcopy(out[:4]), "before": before,
                         "after": list(self.env.agents), "state": s0,
                         "next_state": np.array(self.env.state())})
        return out

def spread(max_cycles: int = 25) -> Recorder:
    return Recorder(simple_spread_v3.parallel_env(max_cycles=max_cycles))


# ---------------------------------------------------------------------- the check
def expected(rec: Recorder) -> list[dict[str, Any]]:
    """The joint transitions the env produced, in order (from its log)."""
    out: list[dict[str, Any]] = []
    cur: dict[str, Any] = {}
    for ev in rec.log:
        if ev["kind"] == "reset":
            cur = ev["obs"]
            continue
        nxt, rew, term, trunc = ev["out"]
        acts = ev["actions"]
        assert list(acts) == [a for a in rec.possible_agents if a in ev["before"]]
        ended = [a for a in acts if term[a] or trunc[a]]
        over = not ev["after"]
        out.append({"obs": {a: cur[a] for a in acts}, "action": acts,
                    "reward": {a: rew[a] for a in acts},
                    "next_obs": {a: nxt[a] for a in acts},
                    "terminated": {a: term[a] for a in acts},
                    "truncated": {a: trunc[a] for a in acts},
                    "state": ev["state"], "next_state": ev["next_state"],
                    "joint_terminated": over and all(term[a] for a in ended),
                    "joint_truncated": over and not all(term[a] for a in ended)})
        cur = {a: nxt[a] for a in ev["after"]}
    return out


def assert_row(stored: Any, i: int, want: Any, msg: str) -> None:
    """Row ``i`` of a batch field equals ``want`` (a dict observation: per key, with the
    env's own dtype)."""
    if isinstance(want, dict):
        assert isinstance(stored, dict) and sorted(stored) == sorted(want), msg
        for k, v in want.items():
            assert_row(stored[k], i, v, f"{msg}[{k!r}]")
        return
    assert np.asarray(stored).dtype == np.asarray(want).dtype, msg
    np.testing.assert_array_equal(stored[i], want, err_msg=msg)


def check_buffer(buf: rb.MultiAgentReplayBuffer, recs: list[Recorder]) -> list[list[int]]:
    """Every stored joint transition equals the envs' logs; returns, per env, the stored
    step indices where the joint episode ended."""
    n = len(recs)
    exp = [expected(r) for r in recs]
    assert len(buf) == sum(len(e) for e in exp)
    assert len(buf) < buf.capacity  # keys are step * num_envs + env (no wrap)
    batch = buf.sample(len(buf), replace=False)
    ends: list[list[int]] = [[] for _ in range(n)]
    for i, key in enumerate(np.asarray(batch.indices).tolist()):
        e = exp[key % n][key // n]
        for a in buf.agents:
            acted = a in e["action"]
            assert bool(batch.active[a][i]) == acted, (key, a)
            if not acted:
                continue
            assert_row(batch.obs[a], i, e["obs"][a], f"obs {key} {a}")
            assert_row(batch.next_obs[a], i, e["next_obs"][a], f"next_obs {key} {a}")
            np.testing.assert_array_equal(batch.action[a][i], e["action"][a])
            assert batch.reward[a][i] == np.float32(e["reward"][a])
            assert bool(batch.terminated[a][i]) == bool(e["terminated"][a])
            assert bool(batch.truncated[a][i]) == bool(e["truncated"][a])
        np.testing.assert_array_equal(batch.state[i], e["state"])
        np.testing.assert_array_equal(batch.next_state[i], e["next_state"])
        assert bool(batch.joint_terminated[i]) == e["joint_terminated"], key
        assert bool(batch.joint_truncated[i]) == e["joint_truncated"], key
        if e["joint_terminated"] or e["joint_truncated"]:
            ends[key % n].append(key // n)
    return [sorted(x) for x in ends]


def resets(rec: Recorder) -> list[tuple[int, Any]]:
    """(steps taken before it, seed) of every reset."""
    out, steps = [], 0
    for ev in rec.log:
        if ev["kind"] == "reset":
            out.append((steps, ev["seed"]))
        else:
            steps += 1
    return out


# ---------------------------------------------------------------------- simple_spread
def test_spread_single_env_stores_exactly_what_the_env_returned() -> None:
    env = spread()
    agents = env.possible_agents
    buf = rb.MultiAgentReplayBuffer(200, agents, seed=0)
    res = rb.collect(env, None, buf, 60, progress=False, seed=3)
    assert isinstance(res, MultiAgentCollectResult)
    assert res.steps == res.env_steps == len(buf) == 60
    assert res.episode_lengths == [25, 25]
    assert res.agent_episode_lengths == [{a: 25 for a in agents}] * 2
    ends = check_buffer(buf, [env])
    assert ends == [[24, 49]]  # truncation at max_cycles, nothing else
    # an env whose agents are all gone is reset at once, continuing its generator
    assert resets(env) == [(0, 3), (25, None), (50, None)]
    exp = expected(env)
    for a in agents:  # the final next_obs is the truncation step's, not the reset's
        assert not np.array_equal(exp[24]["next_obs"][a], exp[25]["obs"][a])
    b = buf.sample(60, replace=False)
    assert b.joint_truncated.sum() == 2 and not b.joint_terminated.any()
    for k, ret in enumerate(res.episode_returns):
        steps = exp[25 * k:25 * (k + 1)]
        per_agent = {a: sum(s["reward"][a] for s in steps) for a in agents}
        assert res.agent_episode_returns[k] == pytest.approx(per_agent)
        assert ret == pytest.approx(sum(per_agent.values()))


def test_spread_two_envs_as_vector_envs_reset_on_their_own() -> None:
    envs = [spread(25), spread(10)]
    buf = rb.MultiAgentReplayBuffer(200, envs[0].possible_agents, num_envs=2, seed=0)
    res = rb.collect(envs, None, buf, 60, progress=False, seed=5)
    assert res.steps == res.env_steps == len(buf) == 60
    ends = check_buffer(buf, envs)
    assert ends == [[24], [9, 19, 29]]
    assert resets(envs[0]) == [(0, 5), (25, None)]
    assert resets(envs[1]) == [(0, 6), (10, None), (20, None), (30, None)]
    assert sorted(res.episode_lengths) == [10, 10, 10, 25]
    first = [r.log[0]["obs"]["agent_0"] for r in envs]
    assert not np.array_equal(first[0], first[1])  # env i is seeded with seed + i


def test_spread_reproducible_with_a_seed() -> None:
    def run(seed: int) -> dict[str, np.ndarray]:
        buf = rb.MultiAgentReplayBuffer(100, ["agent_0", "agent_1", "agent_2"],
                                        num_envs=2, seed=0)
        rb.collect([spread(), spread()], None, buf, 40, progress=False, seed=seed)
        return buf.state_dict()

    a, b, c = run(11), run(11), run(12)
    flat_a = {k: v for k, v in _leaves(a)}
    flat_b = {k: v for k, v in _leaves(b)}
    flat_c = {k: v for k, v in _leaves(c)}
    assert flat_a.keys() == flat_b.keys()
    for k in flat_a:
        np.testing.assert_array_equal(flat_a[k], flat_b[k], err_msg=k)
    assert any(not np.array_equal(flat_a[k], flat_c[k]) for k in flat_a
               if k.startswith("action") or "action" in k)


def _leaves(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(tree, dict):
        return [x for k, v in tree.items() for x in _leaves(v, f"{prefix}{k}/")]
    if isinstance(tree, np.ndarray):
        return [(prefix, tree)]
    return []


def test_spread_with_a_policy_and_a_collector_across_calls() -> None:
    env = spread()
    seen: list[dict[str, np.ndarray]] = []

    def policy(obs: dict[str, np.ndarray]) -> dict[str, int]:
        seen.append(obs)
        return {a: int(np.argmax(o[:5])) for a, o in obs.items()}

    buf = rb.MultiAgentReplayBuffer(200, env.possible_agents, seed=0)
    col = MultiAgentCollector(env, policy, buf, seed=0)
    r1, r2 = col.collect(20), col.collect(20)
    assert (r1.episode_lengths, r2.episode_lengths) == ([], [25])  # continues the episode
    assert len(buf) == 40 and col.episodes == 1
    check_buffer(buf, [env])
    assert set(seen[0]) == set(env.possible_agents) and seen[0]["agent_0"].shape == (18,)


# ---------------------------------------------------------------------- agents that leave
@pytest.mark.parametrize("a_truncates", [False, True])
def test_agent_leaving_early_single_env(a_truncates: bool) -> None:
    env = Recorder(Leaver(b_end=3, a_end=6, a_truncates=a_truncates))
    buf = rb.MultiAgentReplayBuffer(100, ["a", "b"], seed=0)
    res = rb.collect(env, None, buf, 12, progress=False, seed=1)
    assert isinstance(res, MultiAgentCollectResult)
    assert res.steps == 12 and res.episode_lengths == [6, 6]
    assert res.agent_episode_lengths == [{"a": 6, "b": 3}] * 2
    assert check_buffer(buf, [env]) == [[5, 11]]
    b = buf.sample(12, replace=False)
    order = np.argsort(b.indices)
    active_b = b.active["b"][order]
    assert active_b.tolist() == [True] * 3 + [False] * 3 + [True] * 3 + [False] * 3
    term_b = b.terminated["b"][order]
    assert np.flatnonzero(term_b).tolist() == [2, 8]
    # b's final next_obs is exactly what step 3 returned for it
    exp = expected(env)
    np.testing.assert_array_equal(b.next_obs["b"][order][2], exp[2]["next_obs"]["b"])
    assert b.next_obs["b"][order][2][0] == 103
    joint_end = b.joint_truncated if a_truncates else b.joint_terminated
    assert np.flatnonzero(joint_end[order]).tolist() == [5, 11]
    assert not (b.joint_terminated if a_truncates else b.joint_truncated).any()
    assert resets(env) == [(0, 1), (6, None), (12, None)]  # reset as soon as it ends


def test_agent_leaving_early_in_vector_envs_with_active_masks() -> None:
    envs = [Recorder(Leaver(b_end=3, a_end=6)),
            Recorder(Leaver(b_end=4, a_end=2, a_truncates=True))]
    buf = rb.MultiAgentReplayBuffer(100, ["a", "b"], num_envs=2, seed=0)
    seen: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = []
    col: MultiAgentCollector

    def policy(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append((obs, col.active))
        return {"a": np.array([1, 2]), "b": np.full((2, 2), 0.25, np.float32)}

    col = MultiAgentCollector(envs, policy, buf, seed=0)
    res = col.collect(24)
    assert res.steps == 24 and len(buf) == 24
    ends = check_buffer(buf, envs)
    assert ends == [[5, 11], [3, 7, 11]]
    assert resets(envs[0]) == [(0, 0), (6, None), (12, None)]
    assert resets(envs[1]) == [(0, 1), (4, None), (8, None), (12, None)]
    # env 1: "a" is truncated at step 2 (stored as its own truncation), "b" terminates at
    # step 4, which ends the joint episode as terminated (the agents ending at that step)
    b = buf.sample(24, replace=False)
    lane1 = np.asarray(b.indices) % 2 == 1
    steps1 = np.asarray(b.indices)[lane1] // 2
    assert sorted(steps1[np.asarray(b.joint_terminated)[lane1]].tolist()) == [3, 7, 11]
    assert sorted(steps1[np.asarray(b.truncated["a"])[lane1]].tolist()) == [1, 5, 9]
    assert not np.asarray(b.joint_truncated).any()
    # the policy sees {agent: [2, *shape]}, zeros where an agent does not act
    obs, active = seen[3]  # step 4: env 0 has "a" only, env 1 has "b" only
    assert active["a"].tolist() == [True, False] and active["b"].tolist() == [False, True]
    assert obs["a"].shape == (2, 3) and not obs["a"][1].any()
    assert obs["b"].shape == (2, 2) and not obs["b"][0].any()
    # actions of envs where an agent does not act are not stored
    assert b.action["a"][~np.asarray(b.active["a"])].tolist() == \
        [0] * int((~np.asarray(b.active["a"])).sum())


def test_dict_observations_in_vector_envs_stored_per_key_and_batched_per_key() -> None:
    """A list of envs whose agent "a" observes {"observation", "action_mask"}: every key
    is stored with its own dtype exactly as the envs returned it, and the policy gets
    {agent: {key: [n, *shape]}} (zeros where the agent does not act)."""
    envs = [Recorder(DictLeaver(b_end=3, a_end=6)),
            Recorder(DictLeaver(b_end=4, a_end=2, a_truncates=True))]
    buf = rb.MultiAgentReplayBuffer(100, ["a", "b"], num_envs=2, seed=0)
    seen: list[tuple[dict[str, Any], dict[str, np.ndarray]]] = []
    col: MultiAgentCollector

    def policy(obs: dict[str, Any]) -> dict[str, np.ndarray]:
        seen.append((obs, col.active))
        return {"a": np.array([1, 2]), "b": np.full((2, 2), 0.25, np.float32)}

    col = MultiAgentCollector(envs, policy, buf, seed=0)
    res = col.collect(24)
    assert res.steps == 24 and len(buf) == 24
    assert check_buffer(buf, envs) == [[5, 11], [3, 7, 11]]
    b = buf.sample(4)
    assert b.obs["a"]["action_mask"].dtype == np.int8 and b.obs["a"]["action_mask"].shape == (4, 3)
    assert b.next_obs["a"]["observation"].dtype == np.float32
    # every policy call: per-key arrays [2, *shape] holding what each env observed
    exp = [expected(r) for r in envs]
    assert len(seen) == 12
    for t, (obs, active) in enumerate(seen):
        assert isinstance(obs["a"], dict) and sorted(obs["a"]) == ["action_mask", "observation"]
        assert obs["a"]["observation"].shape == (2, 3)
        assert obs["a"]["action_mask"].shape == (2, 3)
        assert obs["a"]["action_mask"].dtype == np.int8
        for e in range(2):
            if active.get("a", np.zeros(2, bool))[e]:
                for k in ("observation", "action_mask"):
                    np.testing.assert_array_equal(obs["a"][k][e], exp[e][t]["obs"]["a"][k])
            elif "a" in obs:
                assert not obs["a"]["observation"][e].any()
                assert not obs["a"]["action_mask"][e].any()
    assert seen[3][1]["a"].tolist() == [True, False]  # env 1's "a" was cut off at step 2
    # random actions through rb.collect store the same way
    envs2 = [Recorder(DictLeaver(b_end=2, a_end=5)), Recorder(DictLeaver(b_end=4, a_end=3))]
    buf2 = rb.MultiAgentReplayBuffer(100, ["a", "b"], num_envs=2, seed=0)
    rb.collect(envs2, None, buf2, 30, progress=False, seed=4)
    assert len(buf2) == 30
    check_buffer(buf2, envs2)


@pytest.mark.parametrize("n_envs", [1, 2])
def test_dict_observations_an_env_overwrites_in_place_are_stored_as_returned(
        n_envs: int) -> None:
    envs = [Recorder(DictLeaver(b_end=3, a_end=5, reuse=True)) for _ in range(n_envs)]
    buf = rb.MultiAgentReplayBuffer(100, ["a", "b"], num_envs=n_envs, seed=0)
    rb.collect(envs if n_envs > 1 else envs[0], None, buf, 20, progress=False, seed=0)
    assert len(buf) == 20
    check_buffer(buf, envs)


def test_dict_observations_with_other_keys_in_another_env_are_refused() -> None:
    envs = [DictLeaver(), DictLeaver(mask_key="legal_moves")]
    buf = rb.MultiAgentReplayBuffer(100, ["a", "b"], num_envs=2, seed=0)
    with pytest.raises(ConfigError, match=r"env\[0\]'s reset\(\) gave: env\[1\] gave "
                       r"the observation of agent 'a' as a dict "
                       r"with keys \['observation', 'legal_moves'\] but env\[0\].*"
                       r"'action_mask'.*same dict keys in every env"):
        rb.collect(envs, None, buf, 4, progress=False, seed=0)
    assert len(buf) == 0


def test_state_left_out_when_the_buffer_stores_none() -> None:
    env = Recorder(Leaver())
    spec = {"obs": {"a": ((3,), "float32"), "b": ((2,), "float32")},
            "action": {"a": ((), "int64"), "b": ((2,), "float32")}}
    buf = rb.MultiAgentReplayBuffer(50, ["a", "b"], spec=spec, seed=0)
    rb.collect(env, None, buf, 6, progress=False, seed=0)
    assert buf.layout is not None and buf.layout.state is None
    assert len(buf) == 6


# ---------------------------------------------------------------------- errors
def test_errors_name_the_argument_and_the_fix() -> None:
    env = spread()
    with pytest.raises(ConfigError, match=r"buffer=.*MultiAgentReplayBuffer\(capacity"):
        rb.collect(env, None, rb.ReplayBuffer(100), 10, progress=False)
    with pytest.raises(ConfigError, match=r"env=.*ParallelEnv"):
        rb.collect(gym.make("CartPole-v1"), None,
                   rb.MultiAgentReplayBuffer(100, ["a"]), 10, progress=False)
    with pytest.raises(ConfigError, match=r"agents \['agent_2'\].*possible_agents"):
        rb.collect(env, None, rb.MultiAgentReplayBuffer(100, ["agent_0", "agent_1"]), 10,
                   progress=False)
    two = rb.MultiAgentReplayBuffer(100, env.possible_agents, num_envs=2)
    with pytest.raises(ConfigError, match=r"num_envs=2.*one env.*num_envs=1"):
        rb.collect(env, None, two, 10, progress=False)
    with pytest.raises(ConfigError, match=r"list of 3 envs.*num_envs=3"):
        rb.collect([spread(), spread(), spread()], None, two, 10, progress=False)
    with pytest.raises(ConfigError, match="aec_to_parallel"):
        rb.collect(simple_spread_v3.env(), None, rb.MultiAgentReplayBuffer(
            100, env.possible_agents), 10, progress=False)
    one = rb.MultiAgentReplayBuffer(100, env.possible_agents)
    with pytest.raises(ConfigError, match="n_steps=0"):
        rb.collect(env, None, one, 0, progress=False)
    with pytest.raises(ConfigError, match=r"policy=.*callable"):
        rb.collect(env, "greedy", one, 10, progress=False)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"no action for agent\(s\) \['agent_2'\]"):
        rb.collect(env, lambda o: {"agent_0": 0, "agent_1": 0}, one, 10, progress=False)
    with pytest.raises(ConfigError, match="MultiAgentCollector"):
        rb.Collector(env, None, one)
    assert len(one) == 0 and len(two) == 0
    with pytest.raises(ConfigError, match=r"with 2 envs the policy returns"):
        rb.collect([spread(), spread()], lambda o: {a: 0 for a in o}, two, 10,
                   progress=False)


def test_env_that_drops_an_agent_without_ending_it() -> None:
    class Dropper(Leaver):
        def step(self, actions: dict[str, Any]) -> Any:
            obs, rew, term, trunc, info = super().step(actions)
            if self.t == 2:
                self.agents = []
            return obs, rew, term, trunc, info

    buf = rb.MultiAgentReplayBuffer(50, ["a", "b"])
    with pytest.raises(ConfigError, match=r"removed agent\(s\) \['a', 'b'\].*terminations"):
        rb.collect(Dropper(), None, buf, 10, progress=False, seed=0)


def test_buffer_with_a_state_and_an_env_without_one() -> None:
    class NoState(Leaver):
        def state(self) -> np.ndarray:
            raise NotImplementedError

    spec = {"obs": {"a": ((3,), "float32"), "b": ((2,), "float32")},
            "action": {"a": ((), "int64"), "b": ((2,), "float32")},
            "state": ((3,), "float32")}
    buf = rb.MultiAgentReplayBuffer(50, ["a", "b"], spec=spec)
    with pytest.raises(ConfigError, match=r"stores a global state.*state\(\)"):
        rb.collect(NoState(), None, buf, 10, progress=False, seed=0)
    assert len(buf) == 0
    free = rb.MultiAgentReplayBuffer(50, ["a", "b"])  # no spec: the first add decides
    rb.collect(NoState(), None, free, 6, progress=False, seed=0)
    assert free.layout is not None and free.layout.state is None


def test_recognition_by_what_the_env_has() -> None:
    assert is_parallel_env(simple_spread_v3.parallel_env())
    assert is_parallel_env(Leaver()) and is_parallel_env(Recorder(Leaver()))
    assert not is_parallel_env(simple_spread_v3.env())  # AEC
    assert not is_parallel_env(gym.make("CartPole-v1"))


def test_single_env_policy_sees_the_acting_agents_and_may_return_tensors() -> None:
    torch = pytest.importorskip("torch")
    keys: list[list[str]] = []

    def policy(obs: dict[str, np.ndarray]) -> dict[str, Any]:
        keys.append(sorted(obs))
        out: dict[str, Any] = {"a": torch.tensor(2)}
        if "b" in obs:
            out["b"] = torch.full((2,), 0.5)
        return out

    env = Recorder(Leaver(b_end=3, a_end=6))
    buf = rb.MultiAgentReplayBuffer(50, ["a", "b"], seed=0)
    rb.collect(env, policy, buf, 6, progress=False, seed=0)
    assert keys == [["a", "b"]] * 3 + [["a"]] * 3  # "b" left after step 3
    check_buffer(buf, [env])
    b = buf.sample(6, replace=False)
    assert b.action["a"].tolist() == [2] * 6


def test_rb_collect_fills_a_multiagent_rollout_buffer_with_torch_outputs() -> None:
    """A rollout buffer goes to the on-policy collector (the policy's protocol and the
    checks are in tests/test_multiagent_rollout_collect.py): agents with their own spaces,
    "b" leaving at step 3, "a" cut off at step 6 and bootstrapped from its final obs."""
    torch = pytest.importorskip("torch")
    from replaybank.integrations.pettingzoo import wants_multiagent

    def policy(obs: dict[str, np.ndarray], state: np.ndarray) -> Any:
        actions = {"a": torch.ones(len(state), dtype=torch.int64)}
        if "b" in obs:
            actions["b"] = torch.zeros((len(state), 2))
        values = {a: torch.as_tensor(o[:, 0], dtype=torch.float32) for a, o in obs.items()}
        return actions, values, {a: torch.zeros(len(state)) for a in obs}

    envs = [Recorder(Leaver(b_end=3, a_end=6, a_truncates=True)) for _ in range(2)]
    buf = rb.MultiAgentRolloutBuffer(8, ["a", "b"], num_envs=2, gamma=1.0, gae_lambda=1.0,
                                     seed=0, normalize_advantage=None)
    assert wants_multiagent(None, buf)
    res = rb.collect(envs, policy, buf, 8, progress=False, seed=0)
    assert res.steps == 16 and res.episode_lengths == [6, 6]
    assert buf.active["b"][:, 0].tolist() == [True] * 3 + [False] * 3 + [True] * 2
    assert buf.data["obs/b"].shape == (8, 2, 2) and buf.data["action/b"].shape == (8, 2, 2)
    for e, rec in enumerate(envs):
        assert rec.log[0]["kind"] == "reset" and rec.log[0]["seed"] == e
        first = rec.log[1:7]  # the first episode's six steps
        seen = [rec.log[0]["obs"]["a"]] + [s["out"][0]["a"] for s in first]
        np.testing.assert_array_equal(buf.data["obs/a"][:6, e], seen[:6])
        rew = [s["out"][1]["a"] for s in first]
        assert buf.data["reward/a"][:6, e].tolist() == rew
        # gamma = lambda = 1: rewards to go, then V("a"'s true final obs) = its step, 6
        assert buf.returns["a"][:6, e].tolist() == pytest.approx(
            [sum(rew[t:]) + float(seen[6][0]) for t in range(6)])
        assert float(seen[6][0]) == 6.0


# ---------------------------------------------------------------------- odd values
def test_vector_envs_stack_values_in_their_common_dtype_not_the_first_envs() -> None:
    """An env of int64 observations beside one of float observations 0.25, 0.5, 0.75: the
    rows were cast into the first env's dtype with numpy's unchecked cast, so the policy
    saw 0 and every stored obs, next_obs, state and next_state was 0."""
    seen: list[list[float]] = []

    def policy(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append(obs["a"][:, 0].tolist())
        return {"a": np.zeros(2, np.int64)}

    spec = {"obs": {"a": ((1,), "float32")}, "action": {"a": ((), "int64")},
            "state": ((1,), "float32")}
    buf = rb.MultiAgentReplayBuffer(20, ["a"], num_envs=2, spec=spec, seed=0)
    rb.collect([Fractions(np.int64), Fractions(np.float64)], policy, buf, 6, seed=0,
               progress=False)
    assert seen == [[0.0, 0.0], [0.0, 0.25], [0.0, 0.5]]
    b = buf.sample(6, replace=False)
    stored = sorted((int(k) % 2, float(b.obs["a"][i, 0]), float(b.next_obs["a"][i, 0]),
                     float(b.state[i, 0]), float(b.next_state[i, 0]))
                    for i, k in enumerate(np.asarray(b.indices).tolist()))
    assert stored == [(0, 0.0, 0.0, 0.0, 0.0)] * 3 + [
        (1, 0.0, 0.25, 0.0, 0.25), (1, 0.25, 0.5, 0.25, 0.5), (1, 0.5, 0.75, 0.5, 0.75)]


def test_vector_envs_values_an_int_field_cannot_hold_are_refused_as_add_refuses_them() -> None:
    """Into an int64 field, env 1's 0.25 is refused with the DtypeError of ``buf.add`` (it
    was stored as 0), as it arrives: env 1's step is lost, env 0's is stored."""
    spec = {"obs": {"a": ((1,), "int64")}}
    buf = rb.MultiAgentReplayBuffer(20, ["a"], num_envs=2, spec=spec)
    col = MultiAgentCollector([Fractions(np.int64), Fractions(np.float64)], None, buf, seed=0)
    with pytest.raises(DtypeError) as got:
        col.collect(2)
    ref = rb.MultiAgentReplayBuffer(20, ["a"], num_envs=2, spec=spec)
    with pytest.raises(DtypeError) as direct:
        ref.add(obs={"a": np.zeros((2, 1))}, action={"a": np.zeros(2, np.int64)},
                reward={"a": np.ones(2)}, next_obs={"a": np.array([[0.0], [0.25]])},
                terminated={"a": np.zeros(2, bool)}, truncated={"a": np.zeros(2, bool)})
    assert str(direct.value) == (
        "next_obs['a']=[[0.0], [0.25]]: field 'obs/a' is int64 and needs finite integral "
        "values (found NaN, inf or a fraction); round or fix the value, or declare the "
        "field as float")
    # (checked as it arrived: named as env[1]'s, whose step alone is lost)
    said = str(direct.value).removeprefix("next_")
    assert str(got.value).startswith("collect(env=...): the buffer refuses the observations "
                                     f"or state env[1]'s step gave: {said} [")
    assert "env[1]'s step is lost" in str(got.value)
    assert len(buf) == 1 and buf.sample(1).active["a"].tolist() == [True]


@pytest.mark.parametrize("num_envs", [1, 2])
def test_tuple_observations_are_stored_as_rb_collect_stores_a_tuple_space(
        num_envs: int) -> None:
    """A gymnasium Tuple observation (the env's observation_space says so) is the dict
    {'0': ..., '1': ...}, fields obs/<agent>/0, obs/<agent>/1, as the single-agent
    rb.collect stores it (it was stacked part-first, or refused with advice that did not
    apply, or a bare numpy ValueError)."""
    seen: list[Any] = []

    def policy(obs: dict[str, Any]) -> dict[str, Any]:
        seen.append({k: np.shape(v) for k, v in obs["a"].items()})
        return {a: np.zeros(num_envs, np.int64) if num_envs > 1 else 0 for a in obs}

    envs = [TupleObs() for _ in range(num_envs)]
    buf = rb.MultiAgentReplayBuffer(50, ["a", "b"], num_envs=num_envs, seed=0)
    rb.collect(envs if num_envs > 1 else envs[0], policy, buf, 3 * num_envs, seed=0,
               progress=False)
    lead = (num_envs,) if num_envs > 1 else ()
    assert seen == [{"0": (*lead, 3), "1": (*lead, 2)}] * 3
    assert buf.spec is not None
    assert [(n, buf.spec[n].shape) for n in buf.spec if n.startswith("obs/")] == [
        ("obs/a/0", (3,)), ("obs/a/1", (2,)), ("obs/b/0", (3,)), ("obs/b/1", (2,))]
    b = buf.sample(len(buf), replace=False)
    steps = []
    for i in range(len(buf)):
        t = float(b.obs["a"]["0"][i, 0])
        steps.append(t)
        for a in ("a", "b"):
            assert b.obs[a]["0"][i].tolist() == [t] * 3
            assert b.obs[a]["1"][i].tolist() == [10 + t] * 2
            assert b.next_obs[a]["0"][i].tolist() == [t + 1] * 3
            assert b.next_obs[a]["1"][i].tolist() == [11 + t] * 2
    assert sorted(steps) == sorted([0.0, 1.0, 2.0] * num_envs)


@pytest.mark.parametrize("num_envs", [1, 2])
def test_tuple_observations_without_a_tuple_space_are_refused_before_a_step(
        num_envs: int) -> None:
    envs = [TupleNoSpace() for _ in range(num_envs)]
    buf = rb.MultiAgentReplayBuffer(50, ["a", "b"], num_envs=num_envs)
    where = "env[0]" if num_envs > 1 else "env"
    with pytest.raises(ShapeError) as got:
        rb.collect(envs if num_envs > 1 else envs[0], None, buf, 3, seed=0, progress=False)
    assert str(got.value) == (
        f"collect(env=...): {where} gave the observation of agent 'a' as a tuple holding "
        "arrays (a gymnasium Tuple space's value), which numpy would stack part-first. The "
        "collector stores it as rb.collect stores a Tuple space, as the dict {'0': "
        "value[0], '1': value[1], ...} (the fields obs/a/0, obs/a/1, ...), when "
        "env.observation_space('a') is a gymnasium.spaces.Tuple; "
        f"{where} has no observation_space(agent): give it one, or have the env return a "
        "dict or one array")
    assert len(buf) == 0 and [e.t for e in envs] == [0] * num_envs


def test_an_agent_joining_late_without_its_spec_is_refused_before_the_first_step() -> None:
    """The first add holds "a" and "b" only: the message names the call made (collect,
    not add) and the spec entries "c" needs, and the env is not stepped (it was, and the
    refused step was lost)."""
    env = LateJoiner()
    buf = rb.MultiAgentReplayBuffer(50, ["a", "b", "c"], seed=0)
    with pytest.raises(SpecError) as got:
        rb.collect(env, None, buf, 8, seed=0, progress=False)
    assert str(got.value) == (
        "collect(obs=..., action=...): agent 'c' is not in the first add and spec= gives no "
        "'obs' or 'action' for it, so those shapes and dtypes are unknown; add to spec: "
        "MultiAgentReplayBuffer(..., spec={..., 'obs': {'c': (shape, dtype)}, 'action': "
        "{'c': (shape, dtype)}}) (env.observation_space(agent) and env.action_space(agent) "
        "give the shape and dtype), or include agent 'c' in the first add")
    assert env.t == 0 and len(buf) == 0 and buf.layout is None
    with pytest.raises(SpecError, match=r"^check_first_add\(obs=\.\.\., action=\.\.\.\)"):
        buf.check_first_add(["a", "b"])  # called directly, it names itself
    spec = {"obs": {"c": ((2,), "float32")}, "action": {"c": ((), "int64")}}
    ok = rb.MultiAgentReplayBuffer(50, ["a", "b", "c"], spec=spec, seed=0)
    rb.collect(LateJoiner(), None, ok, 8, seed=0, progress=False)
    b = ok.sample(8, replace=False)
    joined = sorted(float(b.obs["a"][i, 0]) for i in range(8) if b.active["c"][i])
    assert joined == [2.0, 2.0, 3.0, 3.0] and len(ok) == 8


# ---------------------------------------------------------------------- episodes cut by a reset
def test_collect_twice_ends_the_abandoned_episode_for_every_sampler() -> None:
    """A second rb.collect resets the env in the middle of a joint episode: the episode
    ends there (as a time limit), so sample_episodes returns it alone (1 step) and the
    next one alone (3 steps), as the n-step returns do."""
    env = Clock()
    buf = rb.MultiAgentReplayBuffer(100, agents=["a", "b"], seed=0, n_step=3, gamma=1.0)
    rb.collect(env, None, buf, 1, seed=0, progress=False)  # episode 0: its step t=0
    rb.collect(env, None, buf, 3, seed=1, progress=False)  # reset: episode 1, t=0..2
    b = buf.sample(4, replace=False)
    first = int(np.flatnonzero(np.asarray(b.indices) == 0)[0])
    assert b.joint_reward[first] == 2.5  # 1 + 1.5, not run into episode 1
    assert b.next_obs["a"][first].tolist() == [1.0, 0.0, 0.0]
    ep = buf.sample_episodes(8, 5, include_running=True)
    assert sorted(set(np.asarray(ep.lengths).tolist())) == [1, 3]
    for i in range(8):
        steps = ep.obs["a"][i][ep.mask[i]]  # [length, 3]: (t, id, episode)
        assert len(set(steps[:, 2].tolist())) == 1  # one episode per row
        assert steps[:, 0].tolist() == list(range(len(steps)))
        assert bool(ep.is_last[i][int(ep.lengths[i]) - 1]) == bool(ep.complete[i])
    assert np.asarray(ep.complete)[np.asarray(ep.lengths) == 1].all()  # cut: it ended
    # the cut is part of the buffer's state: a restored buffer splits there too
    back = rb.MultiAgentReplayBuffer(100, agents=["a", "b"], seed=0, n_step=3, gamma=1.0)
    back.load_state_dict(copy.deepcopy(buf.state_dict()))
    ep = back.sample_episodes(2, 5, replace=False, include_running=True)
    assert sorted(np.asarray(ep.lengths).tolist()) == [1, 3]


def test_an_agent_joining_late_does_not_cut_the_joint_episode() -> None:
    """A late joiner's first observation does not continue its zero placeholder (the
    core sees a discontinuity), but the joint episode goes on: only a reset cuts it."""
    buf = rb.MultiAgentReplayBuffer(100, agents=["a", "c"], seed=0, spec={
        "obs": {"c": ((3,), "float32")}, "action": {"c": ((), "int64")}})
    obs = {"a": np.zeros(3, np.float32)}
    for t in range(3):
        acting = ["a"] if t == 0 else ["a", "c"]
        nxt = {k: np.full(3, t + 1, np.float32) for k in acting}
        buf.add(obs={k: obs.get(k, np.full(3, 9, np.float32)) for k in acting},
                action={k: 0 for k in acting}, reward={k: 1.0 for k in acting},
                next_obs=nxt, terminated={k: t == 2 for k in acting},
                truncated={k: False for k in acting})
        obs = nxt
    assert np.asarray(buf.sample_episodes(1, 4).lengths).tolist() == [3]


def test_collect_again_after_an_agent_ended_in_the_abandoned_episode() -> None:
    """Agent "b" ended in the running joint episode; a second rb.collect (or reset()
    then collect()) resets the env, and b acts again in the new episode: no
    ArgumentError, every step stored."""
    env = Clock()
    buf = rb.MultiAgentReplayBuffer(100, agents=["a", "b"], seed=0)
    rb.collect(env, None, buf, 2, seed=0, progress=False)  # b ended, a runs on
    rb.collect(env, None, buf, 3, seed=1, progress=False)
    assert len(buf) == 5
    assert env.ep == 1 and env.t == 3
    other = rb.MultiAgentReplayBuffer(100, agents=["a", "b"], seed=0)
    col = MultiAgentCollector(Clock(), None, other, seed=0)
    col.collect(2)
    col.reset(seed=5)
    col.collect(2)
    assert len(other) == 4
    b = other.sample(4, replace=False)
    assert b.active["b"].sum() == 4  # b acted at both steps of both episodes


def test_an_action_the_buffer_refuses_leaves_env_and_collector_as_they_were() -> None:
    """1.7 into an int64 action field is refused before env.step: the env has not
    moved, and once the policy is fixed every stored next_obs follows its obs."""
    env = Clock()
    buf = rb.MultiAgentReplayBuffer(50, agents=["a", "b"], seed=0, spec={
        "obs": {k: ((3,), "float32") for k in "ab"}, "action": {k: ((), "int64") for k in "ab"}})
    bad = [False]
    col = MultiAgentCollector(env, lambda obs: {k: 1.7 if bad[0] else 1 for k in obs}, buf,
                              seed=0)
    col.collect(1)
    bad[0] = True
    with pytest.raises(rb.DtypeError, match=r"action\['a'\]=1\.7.*int64.*env\.step was not"):
        col.collect(1)
    assert (len(buf), env.t) == (1, 1)
    bad[0] = False
    col.collect(1)
    b = buf.sample(2, replace=False)
    assert sorted(zip(b.obs["a"][:, 0].tolist(), b.next_obs["a"][:, 0].tolist(),
                      b.reward["a"].tolist(), strict=True)) == [(0.0, 1.0, 1.0),
                                                                (1.0, 2.0, 2.0)]


class BadObsClock(Clock):
    """The observation of agent "a" at step 2 of the first episode has the wrong shape."""

    bad_at = (0, 2)  # (episode, step)

    def step(self, actions: dict[str, Any]) -> Any:
        obs, *rest = super().step(actions)
        if (self.ep, self.t) == self.bad_at and "a" in obs:
            obs["a"] = np.zeros(5, np.float32)
        return (obs, *rest)


def test_a_step_refused_after_the_env_stepped_is_never_bridged() -> None:
    """The env returns an observation the buffer refuses: the error says the step is
    lost, the episode ends at the last stored step and the env is reset; no stored
    transition joins the observations around the lost step."""
    env = BadObsClock()
    buf = rb.MultiAgentReplayBuffer(50, agents=["a", "b"], seed=0)
    col = MultiAgentCollector(env, None, buf, seed=0)
    col.collect(1)
    with pytest.raises(rb.ShapeError, match=r"the env's step gave: .*the env's step is lost"):
        col.collect(1)
    assert len(buf) == 1
    col.collect(2)  # a new episode (1), its steps t=0, 1
    b = buf.sample(3, replace=False)
    pairs = sorted(zip(b.obs["a"][:, 2].tolist(), b.obs["a"][:, 0].tolist(),
                       b.next_obs["a"][:, 2].tolist(), b.next_obs["a"][:, 0].tolist(),
                       strict=True))
    assert pairs == [(0.0, 0.0, 0.0, 1.0), (1.0, 0.0, 1.0, 1.0), (1.0, 1.0, 1.0, 2.0)]
    ep = buf.sample_episodes(2, 4, replace=False, include_running=True)
    assert sorted(np.asarray(ep.lengths).tolist()) == [1, 2]


@pytest.mark.parametrize("num_envs", [1, 2])
def test_a_tuple_action_is_refused_before_any_env_steps(num_envs: int) -> None:
    """A policy giving an agent's action as a tuple of arrays (a Tuple action space's
    value): one env was stepped before the add refused it (the step lost); with several
    envs the tuple of one array [n] per part was stacked part-first and stored, each
    part as an env's actions. It is refused by the buffers' tuple rule before any env
    steps, with the flatten fix; the envs and the buffer are as they were, and once the
    policy is fixed collection goes on."""
    envs = [Clock() for _ in range(num_envs)]
    buf = rb.MultiAgentReplayBuffer(50, agents=["a", "b"], num_envs=num_envs, seed=0)
    bad = [True]

    def policy(obs: dict[str, Any]) -> dict[str, Any]:
        if num_envs == 1:
            return {k: (1, np.zeros(2)) if bad[0] else 1 for k in obs}
        parts = (np.zeros(num_envs, np.int64), np.ones(num_envs, np.int64))
        return {k: parts if bad[0] else np.ones(num_envs, np.int64) for k in obs}

    col = MultiAgentCollector(envs if num_envs > 1 else envs[0], policy, buf, seed=0)
    where = "for the envs" if num_envs > 1 else "in the env"
    for _ in range(2):  # before the first add, and again: nothing moved
        with pytest.raises(
            ShapeError,
            match=rf"^collect\(policy=\.\.\.\): the buffer refuses "
            rf"the action of agent 'a' {where}: action\['a'\]=\(.*a tuple "
            r"holding arrays.*gymnasium\.spaces\.flatten.*env\.step was not",
        ):
            col.collect(1)
        assert [e.t for e in envs] == [0] * num_envs
        assert len(buf) == 0 and buf.layout is None
    bad[0] = False
    col.collect(num_envs)
    b = buf.sample(num_envs, replace=False)
    assert b.action["a"].tolist() == [1] * num_envs
    assert b.obs["a"][:, 0].tolist() == [0.0] * num_envs


def _ones(obs: dict[str, Any]) -> dict[str, Any]:
    return {k: np.ones(len(v), np.int64) for k, v in obs.items()}


@pytest.mark.parametrize("random_actions", [False, True])
@pytest.mark.parametrize(
    "odd, error",
    [
        (np.zeros(4, np.float32), ShapeError),  # another shape
        (np.zeros(3, [("x", "f4")]), DtypeError),  # a dtype numpy cannot stack with float32
    ],
)
def test_reset_observations_the_envs_disagree_on_reset_those_envs(
    odd: np.ndarray, error: type[Exception], random_actions: bool
) -> None:
    """At the first step, before any add, two envs' reset observations that do not stack
    were refused on every call with a policy (nothing reset them), and with random
    actions only after both envs had stepped (the step lost). They are refused as the
    rollout collector refuses them: named as the envs' reset, before any env steps,
    nothing stored, the envs reset at the next call, which goes on."""
    envs = [Clock(), OddFirstEpisode(odd)]
    buf = rb.MultiAgentReplayBuffer(50, agents=["a", "b"], num_envs=2, seed=0)
    col = MultiAgentCollector(envs, None if random_actions else _ones, buf, seed=0)
    with pytest.raises(
        error,
        match=r"^collect\(env=\.\.\.\): the buffer refuses the observations or state "
        r"env\[0\]'s reset\(\) gave: the observation of agent 'a' has .* in env\[1\] but "
        r".*reset again at the next step.*\[and 1 more env",
    ):
        col.collect(2)
    assert len(buf) == 0 and buf.layout is None and [e.t for e in envs] == [0, 0]
    col.collect(2)  # goes on: both envs reset (two that disagree: nothing says which)
    b = buf.sample(2, replace=False)
    assert sorted(b.obs["a"][:, 1:].tolist()) == [[0.0, 1.0], [0.0, 1.0]]  # [agent, ep]


def test_reset_observation_of_one_env_among_three_resets_that_env_only() -> None:
    """Three envs, one of which observes another shape at its first reset: the two that
    agree keep their episodes, only the odd one is reset."""
    envs = [Clock(), OddFirstEpisode(np.zeros(4, np.float32)), Clock()]
    buf = rb.MultiAgentReplayBuffer(60, agents=["a", "b"], num_envs=3, seed=0)
    col = MultiAgentCollector(envs, _ones, buf, seed=0)
    with pytest.raises(ShapeError, match=r"env\[1\]'s reset\(\) gave: .*shape \(4,\) in env\[1\]"):
        col.collect(3)
    col.collect(3)
    b = buf.sample(3, replace=False)
    assert sorted(b.obs["a"][:, 2].tolist()) == [0.0, 0.0, 1.0]  # env 1's second episode


# ------------------------------------------------------------- observations checked on arrival
class OddResetIn(Clock):
    """Agent "a" observes ``odd`` at the reset of episode ``ep`` only."""

    def __init__(self, odd: np.ndarray, ep: int, horizon: int = 10) -> None:
        super().__init__(horizon)
        self.odd, self.odd_ep = odd, ep

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        obs, infos = super().reset(seed, options)
        if self.ep == self.odd_ep:
            obs["a"] = self.odd
        return obs, infos


@pytest.mark.parametrize("random_actions", [False, True])
def test_a_reset_observation_the_fixed_fields_refuse_resets_that_env_again(
        random_actions: bool) -> None:
    """Once the first add fixed the fields, env[0]'s second episode starts with an
    observation of another shape: it was refused on every later call with a policy (calls
    3, 4, 5, ...: nothing reset the env), and with random actions only after both envs
    had stepped (both steps lost). It is refused as it arrives, named as env[0]'s reset,
    after the step's bookkeeping; the next call resets env[0] again and goes on."""
    envs = [OddResetIn(np.zeros(4, np.float32), 1, horizon=2), Clock(horizon=2)]
    buf = rb.MultiAgentReplayBuffer(100, agents=["a", "b"], num_envs=2, seed=0)
    col = MultiAgentCollector(envs, None if random_actions else _ones, buf, seed=0)
    col.collect(2)
    with pytest.raises(
        ShapeError,
        match=r"^collect\(env=\.\.\.\): the buffer refuses the observations or state "
        r"env\[0\]'s reset\(\) gave: obs\['a'\]=array\(shape=\(2, 4\).*no step of "
        r"env\[0\]'s new episode was stored, and env\[0\] is reset again at the next step",
    ):
        col.collect(2)  # episode 0 ends in both envs; env[0]'s reset gives shape (4,)
    assert len(buf) == 4 and [e.ep for e in envs] == [1, 1]
    for call in range(3):
        col.collect(2)
        assert len(buf) == 6 + 2 * call
    b = buf.sample(len(buf), replace=False)
    per_env = sorted((int(k) % 2, float(b.obs["a"][i, 2]), float(b.obs["a"][i, 0]))
                     for i, k in enumerate(np.asarray(b.indices).tolist()))
    # env 0: episodes 0 and 2 (episode 1's reset was refused); env 1: episodes 0 to 2
    assert [e for e in per_env if e[0] == 0] == [(0, 0.0, 0.0), (0, 0.0, 1.0),
                                                 (0, 2.0, 0.0), (0, 2.0, 1.0),
                                                 (0, 3.0, 0.0)]
    assert [e for e in per_env if e[0] == 1] == [(1, 0.0, 0.0), (1, 0.0, 1.0),
                                                 (1, 1.0, 0.0), (1, 1.0, 1.0),
                                                 (1, 2.0, 0.0)]


@pytest.mark.parametrize("num_envs", [1, 2])
def test_a_text_reset_observation_is_refused_before_the_policy_sees_it(num_envs: int) -> None:
    """A reset observation no field can hold (text), before the first add: it was stacked
    into a string array, handed to the policy, and refused by the add after the envs had
    stepped (the step lost). It is refused as it arrives, before the policy is called and
    before any env steps; that env is reset again, and the next call goes on."""
    envs: list[Clock] = [OddResetIn(np.array(["x", "y", "z"]), 0)]
    envs += [Clock() for _ in range(num_envs - 1)]
    seen: list[Any] = []

    def policy(obs: dict[str, Any]) -> dict[str, Any]:
        seen.append({k: np.asarray(v).dtype for k, v in obs.items()})
        return {k: np.ones(num_envs, np.int64) if num_envs > 1 else 1 for k in obs}

    buf = rb.MultiAgentReplayBuffer(50, agents=["a", "b"], num_envs=num_envs, seed=0)
    col = MultiAgentCollector(envs if num_envs > 1 else envs[0], policy, buf, seed=0)
    where = re.escape("env[0]" if num_envs > 1 else "the env")
    with pytest.raises(DtypeError, match=rf"^collect\(env=\.\.\.\): the buffer refuses the "
                       rf"observations or state {where}'s reset\(\) gave: obs\['a'\]=.*"
                       r"string \(unicode\) values"):
        col.collect(num_envs)
    assert seen == [] and [e.t for e in envs] == [0] * num_envs
    assert len(buf) == 0 and buf.layout is None
    col.collect(num_envs)
    assert seen == [{"a": np.float32, "b": np.float32}]
    b = buf.sample(num_envs, replace=False)
    assert sorted(b.obs["a"][:, 2].tolist()) == [0.0] * (num_envs - 1) + [1.0]


def test_a_step_observation_refused_in_one_env_loses_only_that_envs_step() -> None:
    """Before the first add, env[1]'s env.step returns an observation of another shape than
    the step's add fixes: the add refused the whole step (both envs' steps lost). It is
    checked as it arrives against the fields that add fixes: env[0]'s step is stored
    (and fixes them), env[1]'s alone is lost, its episode cut and the env reset."""
    envs = [Clock(), BadObsClock()]
    envs[1].bad_at = (0, 1)  # its first step
    buf = rb.MultiAgentReplayBuffer(50, agents=["a", "b"], num_envs=2, seed=0)
    col = MultiAgentCollector(envs, _ones, buf, seed=0)
    with pytest.raises(ShapeError, match=r"env\[1\]'s step gave: .*shape=\(2, 5\).*env\[1\]'s "
                       r"step is lost") as got:
        col.collect(2)
    assert "env[0]" not in str(got.value)
    assert len(buf) == 1 and buf.layout is not None
    assert buf.sample(1).active["a"].tolist() == [True]
    col.collect(4)
    b = buf.sample(5, replace=False)
    rows = sorted((int(k) % 2, float(b.obs["a"][i, 2]), float(b.obs["a"][i, 0]))
                  for i, k in enumerate(np.asarray(b.indices).tolist()) if b.active["a"][i])
    assert rows == [(0, 0.0, 0.0), (0, 0.0, 1.0), (0, 0.0, 2.0), (1, 1.0, 0.0),
                    (1, 1.0, 1.0)]


def _stored_tuple_actions_are_the_policys(buf: Any) -> None:
    """Every stored joint step holds ``tuple_policy``'s actions for its observations:
    "t"'s as the parts ``{'0', '1'}``, "x"'s where it acted."""
    b = buf.sample(len(buf), replace=False)
    want = tuple_policy(b.obs)
    assert sorted(b.action["t"]) == ["0", "1"] and b.action["t"]["0"].dtype == np.int64
    assert np.array_equal(b.action["t"]["0"], want["t"][0])
    assert np.array_equal(b.action["t"]["1"], want["t"][1])
    on = b.active["x"]
    assert np.array_equal(b.action["x"][on], want["x"][on])
    assert not b.action["x"][~on].any() and not on.all()


@pytest.mark.parametrize("num_envs", [1, 2])
def test_tuple_actions_are_stored_part_by_part_and_the_env_gets_its_tuple(
        num_envs: int, tmp_path: Any) -> None:
    """An agent whose action space is a gymnasium Tuple (beside one with a Box): the
    policy's tuple (per part ``[n, ...]`` with several envs) reaches the env as a tuple
    its action space contains, and the buffer stores it as rb.collect stores a Tuple
    action, the parts ``action/t/0``, ``action/t/1`` (it was refused: flatten it).
    Random actions too; the memmap buffer reopened goes on with a new collector."""
    envs = [TupleActs(i) for i in range(num_envs)]
    target = envs if num_envs > 1 else envs[0]
    buf = rb.MultiAgentReplayBuffer(64, ["t", "x"], num_envs=num_envs, seed=0,
                                    storage="memmap", path=tmp_path / "mm")
    res = MultiAgentCollector(target, tuple_policy, buf, seed=0).collect(6 * num_envs)
    assert res.episode_lengths == [3] * (2 * num_envs)
    assert [n for n in buf.spec if n.startswith("action")] == [
        "action/t/0", "action/t/1", "action/x"]
    _stored_tuple_actions_are_the_policys(buf)
    for e in envs:  # what each env was given: the policy's actions, "t"'s a tuple
        assert {k for k, _, _ in e.seen} == {"t", "x"}
        for k, code, act in e.seen:
            want = tuple_policy({k: np.array(code, np.float32)})[k]
            if k == "t":
                assert type(act) is tuple and int(act[0]) == int(want[0])
                assert np.array_equal(act[1], want[1])
            else:
                assert np.array_equal(act, want)
    # the reward is the action's sum: the env read the parts the policy meant
    b = buf.sample(len(buf), replace=False)
    assert np.allclose(b.reward["t"], b.action["t"]["0"] + b.action["t"]["1"].sum(-1))
    col = MultiAgentCollector(target, tuple_policy, buf, seed=0)
    col.collect(2 * num_envs)  # mid-episode now
    buf.flush()
    buf.close()
    back = rb.open(tmp_path / "mm")
    MultiAgentCollector(target, tuple_policy, back, seed=1).collect(4 * num_envs)
    assert len(back) == 12 * num_envs
    _stored_tuple_actions_are_the_policys(back)
    for e in envs:
        e.seen.clear()
    rand = rb.MultiAgentReplayBuffer(64, ["t", "x"], num_envs=num_envs, seed=0)
    rb.collect(target, None, rand, 6, progress=False, seed=2)  # the spaces' samples
    b = rand.sample(len(rand), replace=False)
    sent = sorted((int(a[0]), *a[1].tolist()) for e in envs for k, _, a in e.seen
                  if k == "t")
    assert sorted(zip(b.action["t"]["0"].tolist(), *b.action["t"]["1"].T.tolist(),
                      strict=True)) == sent


def _torch_dict_policy(obs: dict[str, Any]) -> dict[str, Any]:
    """:func:`dict_policy` with "d"'s parts as torch tensors (a torch policy's)."""
    import torch

    out = dict_policy(obs)
    if "d" in out:
        out["d"] = {k: torch.as_tensor(v) for k, v in out["d"].items()}
    return out


@pytest.mark.parametrize("num_envs", [1, 2])
def test_dict_actions_are_stored_part_by_part_and_the_env_gets_its_dict(
        num_envs: int) -> None:
    """An agent whose action space is a gymnasium Dict (beside one with a Box) acts as a
    Tuple agent does: the policy's dict (per key ``[n, ...]`` with several envs) reaches
    the env as a dict its action space contains, and the buffer stores the parts
    ``action/d/move``, ``action/d/pick``; random actions too. A torch policy's parts
    reach the env as numpy (one env used to get the tensors, which the Dict space does
    not contain), and a dict that is not the space's (a key missing or unknown, or a
    dict for a Box agent) is refused before any env steps (it used to reach the envs)."""
    envs = [DictActs(i) for i in range(num_envs)]
    target = envs if num_envs > 1 else envs[0]
    buf = rb.MultiAgentReplayBuffer(64, ["d", "x"], num_envs=num_envs, seed=0)
    MultiAgentCollector(target, dict_policy, buf, seed=0).collect(6 * num_envs)
    assert [n for n in buf.spec if n.startswith("action")] == [
        "action/d/move", "action/d/pick", "action/x"]
    b = buf.sample(len(buf), replace=False)
    want = dict_policy(b.obs)
    assert sorted(b.action["d"]) == ["move", "pick"] and b.action["d"]["pick"].dtype == np.int64
    assert np.array_equal(b.action["d"]["move"], want["d"]["move"])
    assert np.array_equal(b.action["d"]["pick"], want["d"]["pick"])
    on = b.active["x"]
    assert np.array_equal(b.action["x"][on], want["x"][on]) and not on.all()
    # the reward is the action's sum: the env read the parts the policy meant
    assert np.allclose(b.reward["d"], b.action["d"]["pick"] + b.action["d"]["move"].sum(-1))
    for e in envs:
        assert {k for k, _, _ in e.seen} == {"d", "x"}
        assert all(type(a) is dict for k, _, a in e.seen if k == "d")
        e.seen.clear()
    rand = rb.MultiAgentReplayBuffer(64, ["d", "x"], num_envs=num_envs, seed=0)
    rb.collect(target, None, rand, 6, progress=False, seed=2)  # the spaces' samples
    b = rand.sample(len(rand), replace=False)
    sent = sorted((int(a["pick"]), *a["move"].tolist()) for e in envs for k, _, a in e.seen
                  if k == "d")
    assert sorted(zip(b.action["d"]["pick"].tolist(), *b.action["d"]["move"].T.tolist(),
                      strict=True)) == sent
    pytest.importorskip("torch")
    fresh = [DictActs(i) for i in range(num_envs)]
    torch_buf = rb.MultiAgentReplayBuffer(64, ["d", "x"], num_envs=num_envs, seed=0)
    MultiAgentCollector(fresh if num_envs > 1 else fresh[0], _torch_dict_policy, torch_buf,
                        seed=0).collect(3 * num_envs)
    assert len(torch_buf) == 3 * num_envs and sum(k == "d" for k, _, _ in fresh[0].seen) == 3


@pytest.mark.parametrize(("change", "words"), [
    ("missing", ["action['d']", "keys ['move']", "(missing ['pick'])", "Dict("]),
    ("unknown", ["action['d']", "(unknown ['spare'])"]),
    ("tuple", ["action['d']", "a tuple, but the space is a Dict", "{'move': ..., 'pick': ...}"]),
    ("box", ["action['x']", "a dict of parts ['a']", "no gymnasium.spaces.Dict or Tuple",
             "gymnasium.spaces.flatten"]),
])
def test_a_dict_action_that_is_not_the_spaces_is_refused_before_any_env_steps(
        change: str, words: list[str]) -> None:
    """A policy dict that does not hold the agent's Dict space parts, a tuple for a
    Dict agent, or a dict for a Box agent raises a ShapeError naming the agent, the
    parts and the space before any env steps; the envs and the buffer stay as they were
    and collection goes on once the policy is fixed (these dicts used to reach the
    envs, which raised their own errors, or lost a key silently)."""
    def policy(obs: dict[str, Any]) -> dict[str, Any]:
        out = dict_policy(obs)
        if change == "missing" and "d" in out:
            del out["d"]["pick"]
        elif change == "unknown" and "d" in out:
            out["d"]["spare"] = out["d"]["pick"]
        elif change == "tuple" and "d" in out:
            out["d"] = (out["d"]["move"], out["d"]["pick"])
        elif change == "box" and "x" in out:
            out["x"] = {"a": out["x"]}
        return out

    envs = [DictActs(i) for i in range(2)]
    buf = rb.MultiAgentReplayBuffer(64, ["d", "x"], num_envs=2, seed=0)
    col = MultiAgentCollector(envs, policy, buf, seed=0)
    with pytest.raises(ShapeError) as info:
        col.collect(2)
    msg = str(info.value)
    assert all(w in msg for w in words), msg
    assert [e.step_no for e in envs] == [0, 0] and not any(e.seen for e in envs)
    assert len(buf) == 0
    MultiAgentCollector(envs, dict_policy, buf, seed=0).collect(2)
    assert len(buf) == 2


# ------------------------------------------------------------- the cost of the checks on arrival
def test_arrival_checks_skip_values_stored_as_they_are_and_read_each_state_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks on arrival cost about 10 % of a collector step (simple_spread, 4 envs):
    every observation an env gave was stacked into ``[num_envs, ...]`` rows and run
    through the buffer's full ``check_obs``, and a reset env's ``state()`` was read twice
    (for the check, then again before its first step). Once the first add fixed the
    fields, values that are exactly what the buffer stores (numpy arrays of the fields'
    shapes and dtypes) pass without the full check, and each ``state()`` is read once;
    what is stored is still exactly what the envs gave."""
    calls: list[bool] = []
    check_obs = rb.MultiAgentReplayBuffer.check_obs

    def counted(self: rb.MultiAgentReplayBuffer, *args: Any, **kwargs: Any) -> None:
        calls.append(self.layout is None)
        check_obs(self, *args, **kwargs)

    monkeypatch.setattr(rb.MultiAgentReplayBuffer, "check_obs", counted)
    recs = [Recorder(Leaver()) for _ in range(2)]
    envs = [Watched(r) for r in recs]
    buf = rb.MultiAgentReplayBuffer(100, ["a", "b"], num_envs=2, seed=0)
    MultiAgentCollector(envs, None, buf, seed=0).collect(40)
    assert calls and all(calls)  # the full check ran only before the fields were known
    assert [e.resets for e in envs] == [4, 4] and [e.steps for e in envs] == [20, 20]
    # one read per reset and per step (and one before the first reset: does it work?)
    assert [e.reads for e in envs] == [1 + 4 + 20] * 2
    check_buffer(buf, recs)
    # values the buffer must cast ("a" observes float32 into a float64 field) still go
    # through its full check at every arrival
    calls.clear()
    spec = {"obs": {"a": ((3,), "float64")}}
    cast = rb.MultiAgentReplayBuffer(100, ["a", "b"], num_envs=2, spec=spec, seed=0)
    MultiAgentCollector([Leaver(), Leaver()], None, cast, seed=0).collect(40)
    # every arrival after the first add: 4 resets and 20 steps per env, less the first
    assert calls.count(False) == 2 * (4 + 20 - 2)


def _spoil_obs(fn: Any) -> Any:
    return lambda obs, state: ({**obs, "a": fn(obs["a"])} if "a" in obs else obs, state)


def _spoil_state(fn: Any) -> Any:
    return lambda obs, state: (obs, None if state is None else fn(state))


@pytest.mark.parametrize("dict_obs, spoil, error", [
    # values the buffer casts (or reads as arrays) are stored as add stores them
    (False, _spoil_obs(lambda o: o.astype(np.float64)), None),
    (False, _spoil_obs(lambda o: o.tolist()), None),
    (False, _spoil_state(lambda s: s.astype(np.float64)), None),
    (True, _spoil_obs(lambda o: {**o, "action_mask": o["action_mask"].astype(np.int64)}),
     None),
    # values it refuses cost that env's step alone
    (False, _spoil_obs(lambda o: np.zeros(4, np.float32)), ShapeError),
    (False, _spoil_state(lambda s: np.zeros(4, np.float32)), ShapeError),
    (False, _spoil_state(lambda s: s.astype(np.complex64)), DtypeError),
    (True, _spoil_obs(lambda o: {**o, "extra": np.zeros(1)}), SpecError),
    (True, _spoil_obs(lambda o: o["observation"]), SpecError),
])
def test_values_arriving_after_the_first_add_are_judged_as_add_judges_them(
        dict_obs: bool, spoil: Any, error: type[Exception] | None) -> None:
    """Once the fields are known, env[1]'s third step gives an observation or state that
    is not exactly what the buffer stores (the checks on arrival skip those that are):
    the buffer's full check judges it as its add would, storing what it can cast and
    refusing the rest as env[1]'s step, which alone is lost."""
    kind = DictLeaver if dict_obs else Leaver
    envs = [Watched(kind()), Watched(kind(), at=3, spoil=spoil)]
    ref = [Watched(kind()), Watched(kind())]
    buf = rb.MultiAgentReplayBuffer(100, ["a", "b"], num_envs=2, seed=0)
    want = rb.MultiAgentReplayBuffer(100, ["a", "b"], num_envs=2, seed=0)
    col = MultiAgentCollector(envs, None, buf, seed=0)
    col.collect(4)
    if error is None:
        col.collect(6)
        MultiAgentCollector(ref, None, want, seed=0).collect(10)
        got, exp = buf.sample(10, replace=False), want.sample(10, replace=False)
        for name in ("obs", "next_obs"):
            for a in ("a", "b"):
                assert_row_all(getattr(got, name)[a], getattr(exp, name)[a])
        np.testing.assert_array_equal(got.state, exp.state)
        np.testing.assert_array_equal(got.next_state, exp.next_state)
        return
    with pytest.raises(error, match=r"^collect\(env=\.\.\.\): the buffer refuses the "
                       r"observations or state env\[1\]'s step gave: .*env\[1\]'s step "
                       r"is lost") as got_error:
        col.collect(2)
    assert "env[0]" not in str(got_error.value)
    assert len(buf) == 5 and [e.resets for e in envs] == [1, 1]
    col.collect(4)  # goes on: env[1] is reset
    assert len(buf) == 9 and [e.resets for e in envs] == [1, 2]


def assert_row_all(got: Any, want: Any) -> None:
    """Two batch fields are equal (a dict observation: per key)."""
    if isinstance(want, dict):
        assert sorted(got) == sorted(want)
        for k in want:
            assert_row_all(got[k], want[k])
        return
    np.testing.assert_array_equal(got, want)
