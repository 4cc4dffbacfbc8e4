"""MultiAgentReplayBuffer against a plain-loop oracle (a naive per-agent list model).

The oracle records every add per env and per agent (obs, action, reward, next_obs,
flags, active, state) with the joint-episode rules written as plain loops; every joint
transition the buffer samples (found by its key) must equal the oracle's record.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank import persist
from replaybank.errors import ArgumentError, CheckpointError, DtypeError, ShapeError, SpecError
from replaybank.multiagent import MultiAgentBatch, MultiAgentReplayBuffer
from replaybank.multiagent.layout import AgentLayout

SHAPES = {"a": ((3,), np.float32), "b": ((2, 2), np.float64), "c": ((1,), np.float32)}
ACTIONS = {"a": ((), np.int64), "b": ((2,), np.float32), "c": ((), np.int64)}
STATE = ((4,), np.float32)


# ---------------------------------------------------------------------- the oracle
@dataclass
class Record:
    """One joint step of one env, as the oracle expects a sample to show it."""

    obs: dict[str, np.ndarray]
    next_obs: dict[str, np.ndarray]
    action: dict[str, np.ndarray]
    reward: dict[str, float]
    terminated: dict[str, bool]
    truncated: dict[str, bool]
    active: dict[str, bool]
    state: np.ndarray | None
    next_state: np.ndarray | None
    joint_reward: float
    joint_terminated: bool
    joint_truncated: bool


@dataclass
class Oracle:
    """Plain lists per env; the joint-episode rules as loops."""

    agents: tuple[str, ...]
    num_envs: int
    rows: int
    steps: list[list[Record]] = field(default_factory=list)
    alive: list[set[str]] = field(default_factory=list)
    ended: list[set[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.steps = [[] for _ in range(self.num_envs)]
        self.alive = [set() for _ in range(self.num_envs)]
        self.ended = [set() for _ in range(self.num_envs)]

    def add(self, env: int, acted: dict[str, dict[str, Any]], state: Any,
            next_state: Any) -> None:
        """``acted``: {agent: {obs, action, reward, next_obs, terminated, truncated}}."""
        rec = Record({}, {}, {}, {}, {}, {}, {}, state, next_state, 0.0, False, False)
        total = 0.0
        for a in self.agents:
            obs_shape, obs_dtype = SHAPES[a]
            act_shape, act_dtype = ACTIONS[a]
            if a in acted:
                v = acted[a]
                rec.obs[a] = np.asarray(v["obs"], obs_dtype)
                rec.next_obs[a] = np.asarray(v["next_obs"], obs_dtype)
                rec.action[a] = np.asarray(v["action"], act_dtype)
                rec.reward[a] = float(np.float32(v["reward"]))
                rec.terminated[a] = bool(v["terminated"])
                rec.truncated[a] = bool(v["truncated"])
                rec.active[a] = True
                total += rec.reward[a]
            else:
                rec.obs[a] = np.zeros(obs_shape, obs_dtype)
                rec.next_obs[a] = np.zeros(obs_shape, obs_dtype)
                rec.action[a] = np.zeros(act_shape, act_dtype)
                rec.reward[a] = 0.0
                rec.terminated[a] = rec.truncated[a] = rec.active[a] = False
        rec.joint_reward = float(np.float32(total))
        ending = [a for a in acted if rec.terminated[a] or rec.truncated[a]]
        for a in acted:
            self.alive[env].add(a)
        for a in ending:
            self.alive[env].discard(a)
            self.ended[env].add(a)
        if not self.alive[env]:  # the joint episode ends
            rec.joint_terminated = all(rec.terminated[a] for a in ending)
            rec.joint_truncated = not rec.joint_terminated
            self.ended[env] = set()
        self.steps[env].append(rec)

    def live_keys(self) -> set[int]:
        keys = set()
        for env, recs in enumerate(self.steps):
            for s in range(max(0, len(recs) - self.rows), len(recs)):
                keys.add(s * self.num_envs + env)
        return keys

    def record(self, key: int) -> Record:
        return self.steps[key % self.num_envs][key // self.num_envs]


def check_batch(batch: MultiAgentBatch, oracle: Oracle) -> None:
    """Every sampled joint transition equals the oracle's record of its key."""
    for i, key in enumerate(np.asarray(batch.indices).tolist()):
        rec = oracle.record(key)
        for a in oracle.agents:
            assert batch.active[a][i] == rec.active[a], (key, a)
            np.testing.assert_array_equal(batch.obs[a][i], rec.obs[a], err_msg=f"{key} {a}")
            np.testing.assert_array_equal(batch.next_obs[a][i], rec.next_obs[a],
                                          err_msg=f"next_obs {key} {a}")
            np.testing.assert_array_equal(batch.action[a][i], rec.action[a])
            assert batch.reward[a][i] == np.float32(rec.reward[a])
            assert batch.terminated[a][i] == rec.terminated[a]
            assert batch.truncated[a][i] == rec.truncated[a]
        if rec.state is not None:
            np.testing.assert_array_equal(batch.state[i], rec.state)
            np.testing.assert_array_equal(batch.next_state[i], rec.next_state)
        assert batch.joint_reward[i] == np.float32(rec.joint_reward)
        assert batch.joint_terminated[i] == rec.joint_terminated, key
        assert batch.joint_truncated[i] == rec.joint_truncated, key


# ---------------------------------------------------------------------- scenarios
@dataclass
class Scenario:
    agents: tuple[str, ...]
    num_envs: int
    rows: int
    steps: int
    seed: int
    with_state: bool
    use_spec: bool


scenarios = st.builds(
    Scenario,
    agents=st.sampled_from([("a", "b"), ("a", "b", "c"), ("b", "c")]),
    num_envs=st.integers(1, 3),
    rows=st.integers(2, 7),
    steps=st.integers(1, 25),
    seed=st.integers(0, 2**16),
    with_state=st.booleans(),
    use_spec=st.booleans(),
)


def make_spec(agents: tuple[str, ...], with_state: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"obs": {a: SHAPES[a] for a in agents},
                            "action": {a: ACTIONS[a] for a in agents}}
    if with_state:
        spec["state"] = STATE
    return spec


def run(sc: Scenario, buf: MultiAgentReplayBuffer | None = None,
        oracle: Oracle | None = None) -> tuple[MultiAgentReplayBuffer, Oracle]:
    """Random joint steps into a buffer and the oracle (agents missing at some steps,
    ending at different steps, truncation, data that does not continue)."""
    rng = np.random.default_rng(sc.seed)
    n = sc.num_envs
    if buf is None:
        buf = MultiAgentReplayBuffer(sc.rows * n, sc.agents, num_envs=n, seed=sc.seed,
                                     spec=make_spec(sc.agents, sc.with_state)
                                     if sc.use_spec else None)
    if oracle is None:
        oracle = Oracle(sc.agents, n, sc.rows)
    ended = copy.deepcopy(oracle.ended)  # the scenario's own view, to pick who may act
    cur = [{a: rng.normal(size=SHAPES[a][0]) for a in sc.agents} for _ in range(n)]
    state = [rng.normal(size=STATE[0]).astype(np.float32) for _ in range(n)]
    first = True
    for _ in range(sc.steps):
        acts = np.zeros((len(sc.agents), n), bool)
        for i, a in enumerate(sc.agents):
            for e in range(n):
                acts[i, e] = a not in ended[e] and rng.random() < 0.8
        if first and not sc.use_spec:
            acts[:, 0] = True  # the first add must show every agent (or spec=)
        if not acts.any():
            acts[0, 0] = sc.agents[0] not in ended[0]
            if not acts.any():
                continue
        obs, action, reward, next_obs, term, trunc, active = {}, {}, {}, {}, {}, {}, {}
        per_env: list[dict[str, dict[str, Any]]] = [{} for _ in range(n)]
        for i, a in enumerate(sc.agents):
            if not acts[i].any():
                continue
            o = np.zeros((n, *SHAPES[a][0]))
            no = np.zeros_like(o)
            ac = np.zeros((n, *ACTIONS[a][0]), ACTIONS[a][1])
            r = np.zeros(n)
            te = np.zeros(n, bool)
            tr = np.zeros(n, bool)
            for e in range(n):
                if not acts[i, e]:
                    o[e] = rng.normal(size=SHAPES[a][0]) + 100  # garbage: never stored
                    no[e] = o[e]
                    ac[e] = 7
                    r[e] = 9.0
                    continue
                if rng.random() < 0.1:  # data that does not continue
                    cur[e][a] = rng.normal(size=SHAPES[a][0])
                o[e] = cur[e][a]
                no[e] = rng.normal(size=SHAPES[a][0])
                cur[e][a] = no[e]
                ac[e] = rng.integers(0, 5, size=ACTIONS[a][0])
                r[e] = float(rng.normal())
                te[e] = rng.random() < 0.15
                tr[e] = not te[e] and rng.random() < 0.1
                per_env[e][a] = {"obs": o[e].astype(SHAPES[a][1]), "action": ac[e],
                                 "reward": r[e], "next_obs": no[e].astype(SHAPES[a][1]),
                                 "terminated": te[e], "truncated": tr[e]}
            squeeze = n == 1

            def pick(x: np.ndarray, squeeze: bool = squeeze) -> Any:
                return x[0] if squeeze else x

            obs[a], next_obs[a] = pick(o.astype(SHAPES[a][1])), pick(no.astype(SHAPES[a][1]))
            action[a], reward[a] = pick(ac), pick(r)
            term[a], trunc[a] = pick(te), pick(tr)
            if n > 1 and not acts[i].all():
                active[a] = acts[i]
        states = np.stack(state)
        next_states = rng.normal(size=(n, *STATE[0])).astype(np.float32)
        kwargs: dict[str, Any] = {}
        if sc.with_state:
            kwargs = {"state": states[0] if n == 1 else states,
                      "next_state": next_states[0] if n == 1 else next_states}
        buf.add(obs=obs, action=action, reward=reward, next_obs=next_obs, terminated=term,
                truncated=trunc, active=active or None, **kwargs)
        first = False
        for e in range(n):
            if not acts[:, e].any():
                continue
            oracle.add(e, per_env[e], states[e] if sc.with_state else None,
                       next_states[e] if sc.with_state else None)
            state[e] = next_states[e]
            for a, v in per_env[e].items():
                if v["terminated"] or v["truncated"]:
                    ended[e].add(a)
            if not oracle.alive[e]:  # the joint episode ended: reset
                ended[e] = set()
                cur[e] = {a: rng.normal(size=SHAPES[a][0]) for a in sc.agents}
                state[e] = rng.normal(size=STATE[0]).astype(np.float32)
    return buf, oracle


# ---------------------------------------------------------------------- properties
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios)
def test_every_sampled_transition_matches_the_oracle(sc: Scenario) -> None:
    buf, oracle = run(sc)
    keys = oracle.live_keys()
    assert len(buf) == len(keys)
    if not keys:
        return
    batch = buf.sample(len(buf), replace=False)
    assert set(np.asarray(batch.indices).tolist()) == keys
    check_batch(batch, oracle)
    check_batch(buf.sample(8), oracle)  # with replacement too


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios)
def test_save_load_gives_the_identical_sample(sc: Scenario, tmp_path_factory: Any) -> None:
    buf, oracle = run(sc)
    if len(buf) == 0:
        return
    d = tmp_path_factory.mktemp("ma")
    persist.save(buf, d)
    back = persist.load(d)
    assert isinstance(back, MultiAgentReplayBuffer)
    want, got = buf.sample(6), back.sample(6)
    assert want.core == got.core
    check_batch(got, oracle)
    # adds continue identically (the episode bookkeeping is restored too)
    rest = Scenario(sc.agents, sc.num_envs, sc.rows, 6, sc.seed + 1, sc.with_state, True)
    run(rest, buf, copy.deepcopy(oracle))
    run(rest, back, copy.deepcopy(oracle))
    assert buf.sample(6).core == back.sample(6).core


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios)
def test_sequence_windows_match_the_oracle(sc: Scenario) -> None:
    buf, oracle = run(sc)
    if len(buf) == 0:
        return
    seq = buf.sample_sequences(4, 2, strict=False)
    n = sc.num_envs
    starts = np.asarray(seq.starts)
    for i in range(4):
        for k in range(seq.sequence_length):
            if not seq.mask[i, k]:
                continue
            rec = oracle.record(int(starts[i]) + k * n)
            for a in sc.agents:
                assert seq.active[a][i, k] == rec.active[a]
                np.testing.assert_array_equal(seq.obs[a][i, k], rec.obs[a])
                np.testing.assert_array_equal(seq.next_obs[a][i, k], rec.next_obs[a])
                assert seq.reward[a][i, k] == np.float32(rec.reward[a])
            assert seq.joint_reward[i, k] == np.float32(rec.joint_reward)


# ---------------------------------------------------------------------- examples
def _step(buf: MultiAgentReplayBuffer, t: int, acting: list[str], ends: dict[str, str],
          **kwargs: Any) -> None:
    """One step of agents 'a' (obs [2]) and 'b' (obs [3]) in one env; obs = t."""
    dims = {"a": 2, "b": 3}
    buf.add(obs={k: np.full(dims[k], t, np.float32) for k in acting},
            action={k: t for k in acting}, reward={k: 1.0 for k in acting},
            next_obs={k: np.full(dims[k], t + 1, np.float32) for k in acting},
            terminated={k: ends.get(k) == "term" for k in acting},
            truncated={k: ends.get(k) == "trunc" for k in acting}, **kwargs)


def test_an_agent_that_ends_early_keeps_its_final_obs_and_windows_do_not_break() -> None:
    buf = MultiAgentReplayBuffer(64, ["a", "b"], seed=0)
    for t in range(8):
        acting = ["a", "b"] if t <= 2 else ["a"]
        _step(buf, t, acting, {"b": "term"} if t == 2 else {"a": "trunc"} if t == 7 else {})
    b = buf.sample(8, replace=False)
    order = np.argsort(np.asarray(b.indices))
    assert b.active["b"][order].tolist() == [True] * 3 + [False] * 5
    assert b.next_obs["b"][order][:, 0].tolist() == [1, 2, 3] + [0] * 5  # exact, then zeros
    assert b.obs["b"][order][3:].sum() == 0
    assert b.joint_truncated[order].tolist() == [False] * 7 + [True]
    assert b.joint_terminated.sum() == 0
    assert b.joint_reward[order].tolist() == [2.0] * 3 + [1.0] * 5
    # the agent's end is no break in the joint data: one side copy (the newest step) and
    # the whole episode is one window
    assert buf.buffer.table.side_in_use() == 1
    seq = buf.sample_sequences(2, 8)
    assert bool(seq.mask.all())
    assert seq.active["b"][0].tolist() == [True] * 3 + [False] * 5
    assert seq.next_obs["b"][0, 2, 0] == 3.0


def test_joint_end_is_terminated_when_every_ending_agent_terminated() -> None:
    buf = MultiAgentReplayBuffer(16, ["a", "b"], seed=0)
    _step(buf, 0, ["a", "b"], {"a": "term"})
    _step(buf, 1, ["b"], {"b": "term"})
    _step(buf, 2, ["a", "b"], {"a": "term", "b": "trunc"})
    b = buf.sample(3, replace=False)
    order = np.argsort(np.asarray(b.indices))
    assert b.joint_terminated[order].tolist() == [False, True, False]
    assert b.joint_truncated[order].tolist() == [False, False, True]
    assert buf.buffer.episodes_seen == 2


def test_nstep_joint_return_runs_over_an_agents_end() -> None:
    buf = MultiAgentReplayBuffer(16, ["a", "b"], seed=0, n_step=3, gamma=0.5)
    for t in range(4):
        _step(buf, t, ["a", "b"] if t < 2 else ["a"],
              {"b": "term"} if t == 1 else {"a": "term"} if t == 3 else {})
    b = buf.sample(4, replace=False)
    first = int(np.argmin(np.asarray(b.indices)))
    assert b.joint_reward[first] == 2 + 0.5 * 2 + 0.25 * 1
    assert b.discount[first] == 0.125


def test_vector_envs_with_active_masks_and_lanes_without_agents() -> None:
    buf = MultiAgentReplayBuffer(12, ["a", "b"], num_envs=3, seed=0)
    obs = {"a": np.zeros((3, 2)), "b": np.ones((3, 3))}
    buf.add(obs=obs, action={"a": np.zeros(3, np.int64), "b": np.zeros(3, np.int64)},
            reward={"a": np.ones(3), "b": np.ones(3)}, next_obs=obs,
            terminated={"a": np.zeros(3, bool), "b": np.zeros(3, bool)},
            truncated={"a": np.zeros(3, bool), "b": np.zeros(3, bool)},
            active={"a": [True, False, False], "b": [True, True, False]})
    assert len(buf) == 2  # env 2: no agent acted, nothing written there
    assert buf.buffer.table.written.tolist() == [1, 1, 0]
    b = buf.sample(2, replace=False)
    lane = np.asarray(b.indices) % 3
    assert b.active["a"][lane == 1].tolist() == [False]
    assert b.obs["a"][lane == 1].sum() == 0


def test_prioritized_sampling_of_joint_steps() -> None:
    buf = MultiAgentReplayBuffer(16, ["a", "b"], seed=0, sampler=rb.PrioritizedSampler())
    for t in range(6):
        _step(buf, t, ["a", "b"], {})
    b = buf.sample(4)
    assert b.weights is not None and b.weights.shape == (4,)
    assert buf.update_priorities(b.indices, np.arange(1.0, 5.0)) == 4


def test_stacked_and_its_error() -> None:
    buf = MultiAgentReplayBuffer(16, ["x", "y", "z"], seed=0)
    obs = {"x": np.zeros(4, np.float32), "y": np.ones(4, np.float32), "z": np.ones(2)}
    buf.add(obs=obs, action=dict.fromkeys(obs, 0), reward=dict.fromkeys(obs, 0.0),
            next_obs=obs, terminated=dict.fromkeys(obs, False),
            truncated=dict.fromkeys(obs, False))
    b = buf.sample(5)
    assert b.stacked("obs", ["x", "y"]).shape == (5, 2, 4)
    assert b.stacked("reward").shape == (5, 3)
    assert b.stacked("obs", ["x", "y"])[:, 1].tolist() == [[1.0] * 4] * 5
    with pytest.raises(ShapeError, match="differ in shape or dtype"):
        b.stacked("obs")


def test_extras_per_agent_and_joint() -> None:
    buf = MultiAgentReplayBuffer(16, ["a", "b"], seed=0)
    _step(buf, 0, ["a", "b"], {}, log_prob={"a": -1.0, "b": -2.0}, team=np.float32(5))
    _step(buf, 1, ["a"], {}, log_prob={"a": -3.0}, team=np.float32(6))
    b = buf.sample(2, replace=False)
    order = np.argsort(np.asarray(b.indices))
    assert b.extras["log_prob"]["b"][order].tolist() == [-2.0, 0.0]
    assert b.extras["team"][order].tolist() == [5.0, 6.0]
    assert b.stacked("log_prob").shape == (2, 2)


def test_spec_and_inferred_layouts_give_the_same_core_spec() -> None:
    spec = make_spec(("a", "b"), True)
    given_ = MultiAgentReplayBuffer(8, ["a", "b"], spec=spec)
    inferred = MultiAgentReplayBuffer(8, ["a", "b"])
    partial = MultiAgentReplayBuffer(8, ["a", "b"], spec={"obs": {"b": SHAPES["b"]},
                                                          "action": {"b": ACTIONS["b"]}})
    for buf in (given_, inferred, partial):
        acting = ["a", "b"] if buf is not partial else ["a"]
        buf.add(obs={a: np.zeros(*SHAPES[a]) for a in acting},
                action={a: np.zeros(*ACTIONS[a]) for a in acting},
                reward=dict.fromkeys(acting, 0.0),
                next_obs={a: np.zeros(*SHAPES[a]) for a in acting},
                terminated=dict.fromkeys(acting, False), truncated=dict.fromkeys(acting, False),
                state=np.zeros(*STATE), next_state=np.zeros(*STATE))
    assert given_.spec == inferred.spec == partial.spec
    assert given_.layout is not None
    assert given_.spec == AgentLayout.build(("a", "b"), spec, {}, ()).core_spec()


def test_config_rebuilds_an_equivalent_buffer() -> None:
    buf = MultiAgentReplayBuffer(12, ["a", "b"], num_envs=2, seed=3, n_step=2)
    assert buf.config().build().config() == buf.config()  # no spec yet
    both = {"a": np.zeros((2, 2)), "b": np.zeros((2, 3), np.float32)}
    buf.add(obs=both, action={"a": np.zeros(2, np.int64), "b": np.zeros(2, np.int64)},
            reward={"a": np.zeros(2), "b": np.zeros(2)}, next_obs=both,
            terminated={"a": np.zeros(2, bool), "b": np.zeros(2, bool)},
            truncated={"a": np.zeros(2, bool), "b": np.zeros(2, bool)})
    cfg = buf.config()
    assert cfg.agents == ["a", "b"] and cfg.n_step == 2 and cfg.seed == 3
    again = cfg.build()
    assert isinstance(again, MultiAgentReplayBuffer)
    assert again.spec == buf.spec and again.agents == buf.agents and len(again) == 0


def test_torch_storage_gives_tensors() -> None:
    torch = pytest.importorskip("torch")
    buf = MultiAgentReplayBuffer(16, ["a", "b"], seed=0, storage="torch", device="cpu")
    for t in range(3):
        _step(buf, t, ["a", "b"] if t < 2 else ["a"], {"b": "term"} if t == 1 else {})
    b = buf.sample(6)
    assert isinstance(b.obs["a"], torch.Tensor) and isinstance(b.active["b"], torch.Tensor)
    assert b.stacked("reward").shape == (6, 2)
    inactive = ~b.active["b"]
    assert bool((b.next_obs["b"][inactive] == 0).all())
    n = MultiAgentBatch.from_core(buf.buffer.sample(2), buf.agents).to_torch()
    assert isinstance(n.obs["b"], torch.Tensor)


# ---------------------------------------------------------------------- errors
def _filled() -> MultiAgentReplayBuffer:
    buf = MultiAgentReplayBuffer(16, ["a", "b"], seed=0)
    _step(buf, 0, ["a", "b"], {"b": "term"})
    _step(buf, 1, ["a"], {})
    return buf


def _state(buf: MultiAgentReplayBuffer) -> Any:
    return copy.deepcopy(buf.state_dict())


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, dict):
        return isinstance(y, dict) and set(x) == set(y) and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, np.ndarray):
        return bool(np.array_equal(x, y))
    return bool(x == y)


GOOD = dict(obs={"a": np.zeros(2, np.float32)}, action={"a": 0}, reward={"a": 0.0},
            next_obs={"a": np.ones(2, np.float32)}, terminated={"a": False},
            truncated={"a": False})
BAD_CALLS = [
    (ArgumentError, "unknown agent", {"obs": {"a": np.zeros(2), "q": np.zeros(2)}}),
    (ArgumentError, "missing from action", {"action": {}}),
    (ArgumentError, "in reward but not in obs", {"reward": {"a": 0.0, "b": 1.0}}),
    (ArgumentError, "expected a dict", {"obs": np.zeros(2)}),
    (ArgumentError, "ended .* earlier in this episode",
     {k: {**v, "b": v["a"] if k != "obs" and k != "next_obs" else np.zeros(3)}
      for k, v in GOOD.items()}),
    (ShapeError, "obs\\['a'\\]", {"obs": {"a": np.zeros(5)}}),
    # a ragged value named neither the argument nor the agent
    (ShapeError, r"^obs\['a'\]=\[array\(\[0\., 0\.\]\), array\(\[0\.\]\)\]: a ragged nest, rows "
     r"of different lengths \(\[1\] has shape \(1,\) but \[0\] has shape \(2,\)\)",
     {"obs": {"a": [np.zeros(2), np.zeros(1)]}}),
    (ShapeError, r"^next_obs\['a'\]=\[array\(\[0\., 0\.\]\), array\(\[0\.\]\)\]: a ragged nest",
     {"next_obs": {"a": [np.zeros(2), np.zeros(1)]}}),
    (DtypeError, "action\\['a'\\]", {"action": {"a": 0.5}}),
    (SpecError, "no global state", {"state": np.zeros(2), "next_state": np.zeros(2)}),
    (SpecError, "extras", {"info": np.zeros(1)}),
    (ArgumentError, "reserved", {"rewards": {"a": 1.0}}),
    (ArgumentError, "no agent acted", {k: {} for k in GOOD}),
]


@pytest.mark.parametrize(("error", "match", "change"), BAD_CALLS)
def test_a_bad_add_raises_and_changes_nothing(error: type, match: str,
                                              change: dict[str, Any]) -> None:
    buf = _filled()
    before, size = _state(buf), len(buf)
    with pytest.raises(error, match=match):
        buf.add(**{**GOOD, **change})
    assert len(buf) == size
    assert _same(before, buf.state_dict())
    buf.add(**GOOD)  # still usable
    assert len(buf) == size + 1


def test_first_add_without_an_agent_needs_spec() -> None:
    buf = MultiAgentReplayBuffer(8, ["a", "b"])
    with pytest.raises(SpecError, match="agent 'b' is not in the first add"):
        buf.add(**GOOD)
    assert len(buf) == 0 and buf.layout is None and not buf.buffer.allocated


def test_constructor_errors() -> None:
    with pytest.raises(ArgumentError, match="non-empty list"):
        MultiAgentReplayBuffer(8, "a")
    with pytest.raises(ArgumentError, match="given twice"):
        MultiAgentReplayBuffer(8, ["a", "a"])
    with pytest.raises(ArgumentError, match="'state'"):
        MultiAgentReplayBuffer(8, ["state"])
    with pytest.raises(SpecError, match="names no agent"):
        MultiAgentReplayBuffer(8, ["a"], spec={"obs": {"z": ((2,), "float32")}})
    with pytest.raises(ArgumentError, match="passes on only"):
        MultiAgentReplayBuffer(8, ["a"], next_obs=False)


def test_load_state_dict_of_other_agents_changes_nothing() -> None:
    buf = _filled()
    other = MultiAgentReplayBuffer(16, ["a", "c"])
    with pytest.raises(CheckpointError, match="agents"):
        other.load_state_dict(buf.state_dict())
    assert len(other) == 0


# ---------------------------------------------------------------------- PettingZoo
def test_pettingzoo_simple_spread_every_step() -> None:
    pytest.importorskip("pettingzoo")
    mpe2 = pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(max_cycles=10)
    agents = list(env.possible_agents)
    spec = {"obs": {a: (env.observation_space(a).shape, "float32") for a in agents},
            "action": {a: ((), "int64") for a in agents},
            "state": (env.state_space.shape, "float32")}
    buf = MultiAgentReplayBuffer(64, agents, seed=0, spec=spec)
    obs, _ = env.reset(seed=0)
    last: dict[str, np.ndarray] = {}
    for steps in range(1, 26):
        state = env.state()
        actions = {a: env.action_space(a).sample() for a in env.agents}
        nxt, rew, term, trunc, _ = env.step(actions)
        buf.add(obs=obs, action=actions, reward=rew, next_obs=nxt, terminated=term,
                truncated=trunc, state=state, next_state=env.state())
        last = nxt
        obs = nxt
        if not env.agents:
            obs, _ = env.reset(seed=steps)
    env.close()
    assert len(buf) == 25 and buf.buffer.episodes_seen == 2
    b = buf.sample(25, replace=False)
    order = np.argsort(np.asarray(b.indices))
    assert b.joint_truncated[order].tolist() == [t % 10 == 9 for t in range(25)]
    np.testing.assert_array_equal(b.next_obs[agents[0]][order][-1], last[agents[0]])
    assert mpe2 is not None


#: values the first add infers a field from, named as a later add names them
FIRST_ADD_NAMES = [
    ({"obs": {**GOOD["obs"], "b": [np.zeros(2), np.zeros(1)]}}, ShapeError,
     r"^obs\['b'\]=\[array\(\[0\., 0\.\]\), array\(\[0\.\]\)\]: a ragged nest"),
    ({"action": {"a": 0, "b": [[0], 1]}}, ShapeError, r"^action\['b'\]=\[\[0\], 1\]: a ragged"),
    ({"obs": {**GOOD["obs"], "b": {"x": [np.zeros(2), np.zeros(1)]}}}, ShapeError,
     r"^obs\['b'\]\['x'\]=\[array"),
    ({"action": {"a": 0, "b": "left"}}, DtypeError, r"^action\['b'\]='left': string"),
    ({"state": [np.zeros(2), np.zeros(1)], "next_state": np.zeros(2)}, ShapeError,
     r"^state=\[array"),
]


@pytest.mark.parametrize(("change", "error", "match"), FIRST_ADD_NAMES)
def test_the_first_add_names_a_bad_value_as_later_adds_do(change: dict[str, Any],
                                                          error: type, match: str) -> None:
    """The first add (which infers the fields) named a ragged value ``obs/b`` (its field),
    later adds ``obs['b']=...`` (the argument); both name the argument, and the buffer
    stays empty."""
    two = {k: {**v, "b": v["a"]} for k, v in GOOD.items()}
    buf = MultiAgentReplayBuffer(8, ["a", "b"], seed=0)
    with pytest.raises(error, match=match):
        buf.add(**{**two, **change})
    assert len(buf) == 0 and buf.spec is None
    buf.add(**two)  # still usable
    assert len(buf) == 1


def test_a_tuple_action_is_refused_with_the_fix_the_agent_takes() -> None:
    """A raw gymnasium Tuple action (a tuple holding arrays) in either multi-agent
    buffer keeps the tuple rule's error, as a single-agent buffer's: before the fields
    are known (and for an agent whose action is stored part by part) its fix is the dict
    of parts, which the buffer now stores (it said to flatten, and refused the dict);
    for an agent whose action is one array, the fix is to flatten (or to build the
    buffer with parts). Nothing is stored by a refused call."""
    z = np.zeros(2, np.float32)
    tup = (1, np.zeros(2, np.float32))
    step = dict(obs={"a": z}, action={"a": tup}, reward={"a": 1.0},
                terminated={"a": False}, truncated={"a": False})
    replay = rb.MultiAgentReplayBuffer(10, ["a"], seed=0)
    roll = rb.MultiAgentRolloutBuffer(4, ["a"], seed=0)
    adds = (lambda s: replay.add(next_obs={"a": z}, **s),
            lambda s: roll.add(value={"a": 0.0}, log_prob={"a": 0.0}, **s),
            lambda s: roll.check_step(obs=s["obs"], action=s["action"],
                                      value={"a": 0.0}, log_prob={"a": 0.0}))
    for add in adds:
        with pytest.raises(ShapeError) as got:
            add(step)
        msg = str(got.value)
        assert msg.startswith("action['a']=(1, array(shape=(2,), dtype=float32)): a tuple "
                              "holding arrays")
        assert "Pass its parts as a dict, action['a']={'0': v[0], '1': v[1]} (stored as " \
            "the fields action/a/0, action/a/1, as rb.collect stores a Tuple space" in msg
    assert len(replay) == 0 and roll.pos == 0 and roll.layout is None
    # a flat action: a tuple gets the flatten fix; its dict of parts is refused too
    flat = {**step, "action": {"a": np.zeros(3, np.float32)}}
    replay.add(next_obs={"a": z}, **flat)
    roll.add(value={"a": 0.0}, log_prob={"a": 0.0}, **flat)
    for add in adds:
        with pytest.raises(ShapeError, match=r"stores the agent's action as one array.*"
                           r"gymnasium\.spaces\.flatten\(env\.action_space\(agent\), "
                           r"action\)"):
            add(step)
        with pytest.raises(SpecError, match=r"agent 'a' acts with one array in this "
                           r"buffer \(shape \(3,\), float32.*an action of parts"):
            add({**step, "action": {"a": {"0": 1, "1": z}}})
    assert len(replay) == 1 and roll.pos == 1


TUPLE_SPEC = {"obs": {"t": ((2,), "float32"), "x": ((2,), "float32")},
              "action": {"t": {"0": ((), "int64"), "1": ((2,), "float32")},
                         "x": ((2,), "float32")}}


def _tuple_action(code: np.ndarray) -> dict[str, np.ndarray]:
    """Agent "t"'s action (the parts of a Tuple(Discrete(3), Box(2))) at observation
    ``code`` ``[..., 2]``: a function of it, so any sampled row can be checked."""
    return {"0": code[..., 0].astype(np.int64) % 3,
            "1": np.stack([code[..., 0] + 0.5, -code[..., 1]], -1).astype(np.float32)}


def fill_tuple_steps(buf: Any, steps: int = 7, start: int = 0) -> None:
    """Joint steps of two envs: "x" acts every other step in env 1 and ends at step 3
    of env 0 (the joint episode of env 0 ends at step 4, both agents cut off)."""
    for t in range(start, start + steps):
        code = np.array([[t, 0], [t, 1]], np.float32)  # [env, (t, env)]
        x_on = np.array([t % 4 < 3, t % 2 == 0])  # "x" left env 0 at its step 3
        end_t = np.array([t % 4 == 3, False])
        nxt = code + np.array([1, 0], np.float32)
        buf.add(obs={"t": code, "x": code}, next_obs={"t": nxt, "x": nxt},
                action={"t": _tuple_action(code), "x": code * 2},
                reward={"t": np.ones(2), "x": np.ones(2)},
                terminated={"t": np.zeros(2, bool), "x": np.zeros(2, bool)},
                truncated={"t": end_t, "x": np.array([t % 4 == 2, False])},
                active={"x": x_on})


def _check_tuple_rows(obs: dict[str, Any], action: dict[str, Any], active: dict[str, Any],
                      valid: Any) -> None:
    """Every valid row shows the actions added for its observation, the parts of "t"'s
    as a dict; "x" shows zeros where it did not act."""
    assert sorted(action["t"]) == ["0", "1"]
    want = _tuple_action(obs["t"])
    for key in ("0", "1"):
        assert np.array_equal(action["t"][key][valid], want[key][valid])
    on = valid & active["x"]
    assert np.array_equal(action["x"][on], obs["x"][on] * 2)
    assert not action["x"][valid & ~active["x"]].any()


@pytest.mark.parametrize("storage", ["numpy", "memmap"])
def test_tuple_actions_are_stored_part_by_part(storage: str, tmp_path: Any) -> None:
    """An agent with a Tuple action, stored as its parts ``action/t/0``, ``action/t/1``,
    beside an agent with one array: transitions, windows and episodes give
    ``action['t']`` as ``{'0': ..., '1': ...}`` with the values added (an oracle of the
    observation), padding zero; state_dict, rb.save/rb.load and a reopened memmap buffer
    give the identical sample. (Such actions were refused: flatten them.)"""
    kw: dict[str, Any] = {"storage": "memmap", "path": tmp_path / "mm"} \
        if storage == "memmap" else {}
    buf = MultiAgentReplayBuffer(32, ["t", "x"], num_envs=2, seed=3, **kw)
    fill_tuple_steps(buf)
    assert [n for n in buf.spec if n.startswith("action")] == [
        "action/t/0", "action/t/1", "action/x"]
    assert buf.layout is not None and buf.layout.keys("action", "t") == ("0", "1")
    b = buf.sample(len(buf), replace=False)
    assert b.action["t"]["0"].dtype == np.int64 and b.action["t"]["1"].shape == (14, 2)
    _check_tuple_rows(b.obs, b.action, b.active, np.ones(14, bool))
    assert set(map(int, b.obs["t"][:, 0])) == set(range(7))  # every step, once per env
    seq = buf.sample_sequences(6, 3)
    assert seq.action["t"]["1"].shape == (6, 3, 2)
    _check_tuple_rows(seq.obs, seq.action, seq.active, seq.mask)
    ep = buf.sample_episodes(3, 6, replace=False, include_running=True)
    assert ep.action["t"]["0"].shape == (3, 6)
    _check_tuple_rows(ep.obs, ep.action, ep.active, ep.mask)
    assert not ep.action["t"]["1"][~ep.mask].any()  # padding is zero
    assert buf.sample(4).stacked("action", ["t"])["1"].shape == (4, 1, 2)

    def same(x: Any, y: Any) -> None:
        assert np.array_equal(x.indices, y.indices)
        for key in ("0", "1"):
            assert np.array_equal(x.action["t"][key], y.action["t"][key])
        assert np.array_equal(x.action["x"], y.action["x"])

    def peek(target: Any) -> Any:  # the next sample, the generator left where it was
        state = target.rng.bit_generator.state
        out = target.sample(8)
        target.rng.bit_generator.state = state
        return out

    fresh = MultiAgentReplayBuffer(32, ["t", "x"], num_envs=2, seed=0)
    fresh.load_state_dict(copy.deepcopy(buf.state_dict()))
    same(fresh.sample(8), peek(buf))
    rb.save(buf, tmp_path / "saved")
    same(rb.load(tmp_path / "saved").sample(8), peek(buf))
    if storage == "memmap":
        buf.flush()
        want = peek(buf)
        buf.close()
        back = rb.open(tmp_path / "mm")
        same(back.sample(8), want)
        fill_tuple_steps(back, 2, start=7)  # the running episodes go on
        _check_tuple_rows(*(lambda x: (x.obs, x.action, x.active))(
            back.sample(len(back), replace=False)), np.ones(len(back), bool))


def test_tuple_actions_from_spec_and_their_refusals() -> None:
    """``spec={'action': {agent: {'0': ..., '1': ...}}}`` declares an action of parts
    (the config rebuilds it); a call without a part, with another one, with a nested
    dict, or with one array for it is refused naming the agent and the fix, and
    changes nothing."""
    buf = MultiAgentReplayBuffer(8, ["t", "x"], seed=0, spec=TUPLE_SPEC)
    assert buf.layout is not None and buf.layout.keys("action", "t") == ("0", "1")
    assert buf.init_config()["spec"]["action/t/1"] == {"shape": [2], "dtype": "float32"}
    z = np.zeros(2, np.float32)
    step = dict(obs={"t": z, "x": z}, next_obs={"t": z, "x": z}, reward={"t": 0, "x": 0},
                terminated={"t": False, "x": False}, truncated={"t": False, "x": False})
    bad = [({"0": 1}, SpecError, r"action\['t'\]=\.\.\.\): the dict action has keys "
            r"\['0'\]; agent 't' acts with exactly \['0', '1'\].*missing \['1'\]"),
           ({"0": 1, "1": z, "2": 0}, SpecError, r"unknown \['2'\]"),
           ({"0": 1, "1": {"y": z}}, SpecError, r"action\['t'\]\['1'\]=.*a nested dict"),
           (np.zeros(3, np.float32), SpecError, r"agent 't' acts with a dict with keys "
            r"\['0', '1'\].*\{'0': v\[0\], '1': v\[1\], \.\.\.\}"),
           ({"0": 1.5, "1": z}, DtypeError, r"action\['t'\]\['0'\]")]
    for action, error, match in bad:
        with pytest.raises(error, match=match):
            buf.add(action={"t": action, "x": z}, **step)
        assert len(buf) == 0
    buf.add(action={"t": {"0": 2, "1": z + 1}, "x": z}, **step)
    assert buf.sample(1).action["t"]["0"].tolist() == [2]
    with pytest.raises(SpecError, match=r"'action/t/0/y' is a nested key of the dict "
                       r"action of agent 't'"):
        MultiAgentReplayBuffer(8, ["t"], spec={"action": {"t": {"0": {"y": ((), "int64")}}}})


def test_the_callers_spec_dict_changed_after_construction_changes_nothing() -> None:
    """The buffer kept the caller's ``spec`` dict: changing it after construction (a
    nested entry, a new agent entry) changed the shapes the first add fixed and the
    config. The buffer keeps its own copy."""
    spec: dict[str, Any] = {"obs": {"a": ((3,), "float32")}}
    buf = MultiAgentReplayBuffer(8, ["a", "b"], spec=spec)
    config = buf.init_config()
    spec["obs"]["a"] = ((5,), "float32")
    spec["obs"]["b"] = ((7,), "float32")
    assert buf.init_config() == config
    buf.add(obs={"a": np.zeros(3, np.float32), "b": np.zeros(2, np.float32)},
            action={"a": 0, "b": 0}, reward={"a": 1.0, "b": 1.0},
            next_obs={"a": np.zeros(3, np.float32), "b": np.zeros(2, np.float32)},
            terminated={"a": False, "b": False}, truncated={"a": False, "b": False})
    assert buf.spec is not None
    assert (buf.spec["obs/a"].shape, buf.spec["obs/b"].shape) == ((3,), (2,))


def test_check_obs_refuses_what_add_refuses_and_changes_nothing() -> None:
    """The replay buffer checks an env's observations as the rollout buffer does (the
    collectors call it as they arrive): before the first add only a value no field can
    hold, with ``step`` against the fields that add fixes, then against its fields."""
    buf = MultiAgentReplayBuffer(8, agents=["a"], num_envs=2, seed=0)
    with pytest.raises(DtypeError, match=r"^obs\['a'\]=.*string"):
        buf.check_obs({"a": np.array([["x"], ["y"]])})
    buf.check_obs({"a": np.zeros((2, 4))})  # the shape waits for the first add
    step = {"obs": {"a": np.zeros((2, 3), np.float32)}, "action": {"a": np.zeros(2)}}
    with pytest.raises(ShapeError, match=r"^obs\['a'\]=.*expected shape \(2, 3\)"):
        buf.check_obs({"a": np.zeros((2, 4))}, step=step, call="collect")
    assert buf.layout is None and len(buf) == 0
    buf.add(**step, reward={"a": np.ones(2)}, next_obs={"a": np.ones((2, 3), np.float32)},
            terminated={"a": np.zeros(2, bool)}, truncated={"a": np.zeros(2, bool)})
    layout, before = buf.layout, copy.deepcopy(buf.state_dict())
    with pytest.raises(ShapeError, match=r"expected shape \(2, 3\)"):
        buf.check_obs({"a": np.zeros((2, 4))})
    with pytest.raises(SpecError, match=r"^check_obs\(state=.*stores no global state"):
        buf.check_obs({"a": np.zeros((2, 3))}, np.zeros((2, 1)))
    with pytest.raises(ArgumentError, match=r"unknown agent\(s\) \['c'\]"):
        buf.check_obs({"c": np.zeros((2, 3))})
    buf.check_obs({"a": np.ones((2, 3))})  # what add takes passes
    assert buf.layout is layout and len(buf) == 2
    back = MultiAgentReplayBuffer(8, agents=["a"], num_envs=2, seed=0)
    back.load_state_dict(before)
    assert buf.sample(2, replace=False).obs["a"].tolist() == \
        back.sample(2, replace=False).obs["a"].tolist()
