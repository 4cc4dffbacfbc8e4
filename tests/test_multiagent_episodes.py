"""Per-agent n-step returns and whole padded episodes of MultiAgentReplayBuffer against
plain loops over the recorded steps (the oracle of tests/test_multiagent.py).

The oracle records what each agent did; the loops here rebuild what the buffer stores
(an agent that does not act stores its latest observation as a placeholder), where the
joint data continues, and from that every per-agent n-step transition and every whole
joint episode, one step at a time.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank import persist
from replaybank.errors import ArgumentError, ConfigError, EmptyBufferError
from replaybank.multiagent import MultiAgentEpisodeBatch, MultiAgentReplayBuffer
from tests.test_multiagent import SHAPES, Oracle, Record, Scenario, make_spec, run

# ---------------------------------------------------------------------- plain loops


def stored(oracle: Oracle, env: int) -> list[dict[str, dict[str, np.ndarray]]]:
    """Per step of ``env``: the observations the buffer stores ({"obs"/"next_obs":
    {agent: value}}), placeholders included: an agent that does not act stores its
    latest next observation of the episode (zeros before it acts, and after a joint end).
    """
    out = []
    carry = {a: np.zeros(*SHAPES[a]) for a in oracle.agents}
    for rec in oracle.steps[env]:
        obs = {a: rec.obs[a] if rec.active[a] else carry[a] for a in oracle.agents}
        nxt = {a: rec.next_obs[a] if rec.active[a] else carry[a] for a in oracle.agents}
        if rec.state is not None:
            obs["state"], nxt["state"] = rec.state, rec.next_state
        out.append({"obs": obs, "next_obs": nxt})
        carry = {a: nxt[a] for a in oracle.agents}
        if rec.joint_terminated or rec.joint_truncated:
            carry = {a: np.zeros(*SHAPES[a]) for a in oracle.agents}
    return out


def boundary(oracle: Oracle, env: int, s: int, st_: list[Any]) -> bool:
    """The joint data does not continue after step ``s``: a joint end, the lane's newest
    step, or a next step whose stored observations differ from this step's next ones."""
    rec = oracle.steps[env][s]
    if rec.joint_terminated or rec.joint_truncated or s == len(oracle.steps[env]) - 1:
        return True
    nxt, obs = st_[s]["next_obs"], st_[s + 1]["obs"]
    return not all(np.array_equal(nxt[k], obs[k]) for k in nxt)


def nstep_oracle(oracle: Oracle, key: int, n: int, gamma: float) -> dict[str, Any]:
    """The joint and per-agent n-step transition of ``key``, one step at a time."""
    env, s = key % oracle.num_envs, key // oracle.num_envs
    recs, st_ = oracle.steps[env], stored(oracle, env)
    joint_len = 0
    for k in range(n):  # the joint window: up to and including the first boundary
        joint_len += 1
        if boundary(oracle, env, s + k, st_):
            break
    out: dict[str, Any] = {"L": joint_len, "agents": {}}
    g = 0.0
    for k in range(joint_len):
        g += gamma ** k * float(np.float32(recs[s + k].joint_reward))
    last: Record = recs[s + joint_len - 1]
    out["joint"] = (g, gamma ** joint_len, last.joint_terminated, last.joint_truncated)
    for a in oracle.agents:
        if not recs[s].active[a]:
            out["agents"][a] = (0.0, 0.0, False, False, np.zeros(*SHAPES[a]))
            continue
        g, steps = 0.0, 0
        for k in range(joint_len):
            r = recs[s + k]
            steps += 1
            if r.active[a]:
                g += gamma ** k * float(np.float32(r.reward[a]))
                if r.terminated[a] or r.truncated[a]:
                    break
        r = recs[s + steps - 1]
        out["agents"][a] = (g, gamma ** steps, r.terminated[a], r.truncated[a],
                            st_[s + steps - 1]["next_obs"][a])
    return out


def episodes_oracle(oracle: Oracle, include_running: bool) -> dict[int, tuple[int, bool]]:
    """{start key: (length, complete)} of the whole joint episodes of the live steps.

    An episode starts at a lane's first step or after a joint end; it is whole when its
    first step is live and, when that is the lane's oldest live step, the lane has lost
    no step (the buffer cannot tell otherwise).
    """
    out = {}
    for env, recs in enumerate(oracle.steps):
        if not recs:  # an env that stored no step has no episode, not even a running one
            continue
        oldest = max(0, len(recs) - oracle.rows)
        starts = [0] + [i + 1 for i, r in enumerate(recs[:-1])
                        if r.joint_terminated or r.joint_truncated]
        for i in starts:
            if i > oldest or i == oldest == 0:
                j = i
                while j < len(recs) and not (recs[j].joint_terminated
                                             or recs[j].joint_truncated):
                    j += 1
                complete = j < len(recs)
                if complete or include_running:
                    out[i * oracle.num_envs + env] = (min(j, len(recs) - 1) - i + 1, complete)
    return out


# ---------------------------------------------------------------------- checks


def check_nstep(batch: Any, oracle: Oracle, n: int, gamma: float) -> int:
    """Every joint and per-agent n-step field of ``batch`` equals the loop's; returns the
    number of (transition, agent) pairs whose agent window was cut by its own end."""
    cut = 0
    for i, key in enumerate(np.asarray(batch.indices).tolist()):
        want = nstep_oracle(oracle, key, n, gamma)
        g, disc, term, trunc = want["joint"]
        assert batch.joint_reward[i] == np.float32(g), key
        assert batch.discount[i] == np.float32(disc), key
        assert batch.joint_terminated[i] == term and batch.joint_truncated[i] == trunc
        for a in oracle.agents:
            g, disc, term, trunc, nxt = want["agents"][a]
            assert batch.reward[a][i] == np.float32(g), (key, a)
            assert batch.agent_discount[a][i] == np.float32(disc), (key, a)
            assert batch.terminated[a][i] == term, (key, a)
            assert batch.truncated[a][i] == trunc, (key, a)
            np.testing.assert_array_equal(batch.next_obs[a][i], nxt, err_msg=f"{key} {a}")
            cut += int(disc != 0 and disc != gamma ** want["L"])
    return cut


def check_episodes(ep: MultiAgentEpisodeBatch, oracle: Oracle, max_length: int,
                   want: dict[int, tuple[int, bool]]) -> None:
    """Every row equals the recorded episode; every field is zero past it."""
    n = oracle.num_envs
    assert ep.max_length == max_length
    for i, start in enumerate(np.asarray(ep.starts).tolist()):
        length, complete = want[start]
        assert ep.lengths[i] == length and ep.complete[i] == complete, start
        steps = min(length, max_length)
        assert ep.mask[i].tolist() == [k < steps for k in range(max_length)]
        assert ep.is_first[i].tolist() == [k == 0 for k in range(max_length)]
        recs = oracle.steps[start % n]
        s0 = start // n
        for k in range(steps):
            rec = recs[s0 + k]
            assert ep.is_last[i, k] == (rec.joint_terminated or rec.joint_truncated)
            assert ep.is_terminal[i, k] == rec.joint_terminated
            assert ep.joint_reward[i, k] == np.float32(rec.joint_reward)
            if rec.state is not None:
                np.testing.assert_array_equal(ep.state[i, k], rec.state)
                np.testing.assert_array_equal(ep.next_state[i, k], rec.next_state)
            for a in oracle.agents:
                assert ep.active[a][i, k] == rec.active[a]
                np.testing.assert_array_equal(ep.obs[a][i, k], rec.obs[a])
                np.testing.assert_array_equal(ep.next_obs[a][i, k], rec.next_obs[a])
                np.testing.assert_array_equal(ep.action[a][i, k], rec.action[a])
                assert ep.reward[a][i, k] == np.float32(rec.reward[a])
                assert ep.terminated[a][i, k] == rec.terminated[a]
                assert ep.truncated[a][i, k] == rec.truncated[a]
        for name, v in ep.core.items():  # zero padding, every field
            if np.ndim(v) >= 2:
                assert not np.asarray(v)[i, steps:].any(), (name, start)


# ---------------------------------------------------------------------- properties
nstep_scenarios = st.tuples(
    st.builds(Scenario, agents=st.sampled_from([("a", "b"), ("a", "b", "c"), ("b", "c")]),
              num_envs=st.integers(1, 3), rows=st.integers(2, 8), steps=st.integers(1, 30),
              seed=st.integers(0, 2**16), with_state=st.booleans(), use_spec=st.booleans()),
    st.integers(2, 4), st.sampled_from([0.5, 0.9, 1.0]))


def _buffer(sc: Scenario, **kwargs: Any) -> MultiAgentReplayBuffer:
    return MultiAgentReplayBuffer(sc.rows * sc.num_envs, sc.agents, num_envs=sc.num_envs,
                                  seed=sc.seed, spec=make_spec(sc.agents, sc.with_state)
                                  if sc.use_spec else None, **kwargs)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=nstep_scenarios)
def test_per_agent_nstep_matches_the_loop(case: tuple[Scenario, int, float]) -> None:
    sc, n, gamma = case
    n = min(n, sc.rows)  # a window fits in a lane
    buf, oracle = run(sc, _buffer(sc, n_step=n, gamma=gamma))
    if len(buf) == 0:
        return
    check_nstep(buf.sample(len(buf), replace=False), oracle, n, gamma)
    check_nstep(buf.sample(8), oracle, n, gamma)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=nstep_scenarios)
def test_per_agent_nstep_under_prioritized_sampling(case: tuple[Scenario, int, float]) -> None:
    sc, n, gamma = case
    n = min(n, sc.rows)
    buf, oracle = run(sc, _buffer(sc, n_step=n, gamma=gamma,
                                  sampler=rb.PrioritizedSampler()))
    if len(buf) == 0:
        return
    b = buf.sample(6)
    check_nstep(b, oracle, n, gamma)
    assert b.weights is not None
    buf.update_priorities(b.indices, np.arange(1.0, 7.0))  # one priority per joint step
    check_nstep(buf.sample(6), oracle, n, gamma)


episode_scenarios = st.tuples(nstep_scenarios, st.integers(1, 9), st.booleans())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=episode_scenarios)
def test_padded_episodes_match_the_recorded_episodes(
        case: tuple[tuple[Scenario, int, float], int, bool]) -> None:
    (sc, _, _), max_length, running = case
    buf, oracle = run(sc, _buffer(sc))
    want = episodes_oracle(oracle, running)
    if not want:
        if len(buf):
            with pytest.raises(EmptyBufferError, match="whole"):
                buf.sample_episodes(2, max_length, include_running=running)
        return
    # every episode once: the set is exactly the oracle's
    ep = buf.sample_episodes(len(want), max_length, replace=False, include_running=running)
    assert sorted(np.asarray(ep.starts).tolist()) == sorted(want)
    check_episodes(ep, oracle, max_length, want)
    check_episodes(buf.sample_episodes(5, max_length, include_running=running), oracle,
                   max_length, want)


# ---------------------------------------------------------------------- examples
def _step(buf: MultiAgentReplayBuffer, t: int, acting: list[str], ends: dict[str, str],
          rewards: dict[str, float] | None = None) -> None:
    buf.add(obs={k: np.full(2, t, np.float32) for k in acting},
            action={k: 0 for k in acting},
            reward={k: (rewards or {}).get(k, 1.0) for k in acting},
            next_obs={k: np.full(2, t + 1, np.float32) for k in acting},
            terminated={k: ends.get(k) == "term" for k in acting},
            truncated={k: ends.get(k) == "trunc" for k in acting})


def test_an_agent_that_ends_inside_the_window_stops_there() -> None:
    buf = MultiAgentReplayBuffer(16, ["a", "b"], n_step=4, gamma=0.5, seed=0)
    for t in range(5):  # b truncated at t = 1, a terminates at t = 4
        _step(buf, t, ["a", "b"] if t < 2 else ["a"],
              {"b": "trunc"} if t == 1 else {"a": "term"} if t == 4 else {},
              {"a": 1.0, "b": 10.0})
    b = buf.sample(5, replace=False)
    i = int(np.argmin(np.asarray(b.indices)))  # step 0
    assert b.reward["a"][i] == 1 + 0.5 + 0.25 + 0.125 and b.agent_discount["a"][i] == 0.0625
    assert b.reward["b"][i] == 10 + 5 and b.agent_discount["b"][i] == 0.25
    assert b.truncated["b"][i] and not b.terminated["b"][i]
    assert b.next_obs["b"][i].tolist() == [2.0, 2.0]  # b's final observation
    assert b.next_obs["a"][i].tolist() == [4.0, 4.0]
    j = int(np.argmax(np.asarray(b.indices) == 2))  # step 2: b no longer acts
    assert b.reward["b"][j] == 0 and b.agent_discount["b"][j] == 0
    assert b.next_obs["b"][j].tolist() == [0.0, 0.0]
    assert b.reward["a"][j] == 1.75 and b.terminated["a"][j]


def test_one_step_buffers_have_no_agent_discount() -> None:
    buf = MultiAgentReplayBuffer(8, ["a", "b"], seed=0)
    _step(buf, 0, ["a", "b"], {})
    b = buf.sample(2)
    assert b.agent_discount is None and b.discount is None


def test_nstep_config_and_checkpoint_round_trip(tmp_path: Any) -> None:
    buf = MultiAgentReplayBuffer(16, ["a", "b"], n_step=3, gamma=0.9, seed=1)
    for t in range(6):
        _step(buf, t, ["a", "b"] if t < 3 else ["a"],
              {"b": "term"} if t == 2 else {"a": "term"} if t == 5 else {})
    assert buf.buffer.metadata()["view"] == {"type": "nstep", "n": 3, "gamma": 0.9}
    again = buf.config().build()
    assert isinstance(again, MultiAgentReplayBuffer) and again.config() == buf.config()
    persist.save(buf, tmp_path)
    back = persist.load(tmp_path)
    want, got = buf.sample(5), back.sample(5)
    assert want.core == got.core and got.agent_discount is not None
    ep_want, ep_got = buf.sample_episodes(3, 4), back.sample_episodes(3, 4)
    assert ep_want.core == ep_got.core


def test_nstep_with_frame_stack_is_refused() -> None:
    with pytest.raises(ConfigError, match="per-agent n-step"):
        MultiAgentReplayBuffer(16, ["a"], n_step=3, frame_stack=2)


def test_the_discounts_extra_is_reserved_with_nstep() -> None:
    buf = MultiAgentReplayBuffer(16, ["a"], n_step=2)
    with pytest.raises(ArgumentError, match="discounts"):
        buf.add(obs={"a": np.zeros(2)}, action={"a": 0}, reward={"a": 0.0},
                next_obs={"a": np.zeros(2)}, terminated={"a": False},
                truncated={"a": False}, discounts={"a": 1.0})
    assert len(buf) == 0


def test_episodes_are_drawn_uniformly_over_episodes() -> None:
    buf = MultiAgentReplayBuffer(64, ["a", "b"], seed=3)
    t = 0
    for length in (1, 5, 2, 9):  # episodes of very different lengths
        for k in range(length):
            _step(buf, t, ["a", "b"], {"a": "term", "b": "term"} if k == length - 1 else {})
            t += 1
    ep = buf.sample_episodes(8000, 2)
    _, counts = np.unique(np.asarray(ep.starts), return_counts=True)
    assert len(counts) == 4
    assert np.abs(counts / 8000 - 0.25).max() < 0.03  # 6 sigma is 0.029


def test_long_episodes_are_cut_and_running_ones_flagged() -> None:
    buf = MultiAgentReplayBuffer(32, ["a", "b"], seed=0)
    for t in range(6):
        _step(buf, t, ["a", "b"], {"a": "term", "b": "trunc"} if t == 4 else {})
    _step(buf, 6, ["a"], {})
    ep = buf.sample_episodes(1, 3)
    assert ep.lengths.tolist() == [5] and ep.mask.all() and ep.complete.tolist() == [True]
    assert ep.obs["a"][0, :, 0].tolist() == [0.0, 1.0, 2.0]
    both = buf.sample_episodes(2, 8, replace=False, include_running=True)
    order = np.argsort(np.asarray(both.starts))
    assert both.complete[order].tolist() == [True, False]
    assert both.lengths[order].tolist() == [5, 2]
    assert both.is_last[order][0].tolist() == [False] * 4 + [True] + [False] * 3
    with pytest.raises(EmptyBufferError, match="holds 1 whole ended"):
        buf.sample_episodes(2, 8, replace=False)


def test_episodes_after_clear_and_wrap() -> None:
    buf = MultiAgentReplayBuffer(4, ["a"], seed=0)
    with pytest.raises(EmptyBufferError, match="empty"):
        buf.sample_episodes(1, 2)
    for t in range(6):  # episodes of 2 steps; the ring holds 4: steps 2..5
        buf.add(obs={"a": np.full(2, t)}, action={"a": 0}, reward={"a": 1.0},
                next_obs={"a": np.full(2, t + 1)}, terminated={"a": t % 2 == 1},
                truncated={"a": False})
    # step 2 starts an episode but the buffer cannot tell (step 1 is gone): left out
    assert np.asarray(buf.sample_episodes(4, 2).starts).tolist() == [4] * 4
    buf.clear()
    for t in range(3):
        buf.add(obs={"a": np.full(2, t)}, action={"a": 0}, reward={"a": 1.0},
                next_obs={"a": np.full(2, t + 1)}, terminated={"a": t == 2},
                truncated={"a": False})
    ep = buf.sample_episodes(2, 4)  # the first episode after a clear is whole
    assert ep.lengths.tolist() == [3, 3] and np.asarray(ep.starts).tolist() == [6, 6]
    state = copy.deepcopy(buf.state_dict())
    other = MultiAgentReplayBuffer(4, ["a"], seed=0)
    other.load_state_dict(state)
    assert other.sample_episodes(2, 4).core == buf.sample_episodes(2, 4).core


def test_sample_episodes_argument_errors() -> None:
    buf = MultiAgentReplayBuffer(8, ["a"], seed=0)
    with pytest.raises(ConfigError, match="max_length"):
        buf.sample_episodes(2, 0)
    with pytest.raises(ConfigError, match="batch_size"):
        buf.sample_episodes(1.5, 2)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="include_running"):
        buf.sample_episodes(2, 2, include_running="yes")  # type: ignore[arg-type]


def test_torch_storage_episodes_and_nstep() -> None:
    torch = pytest.importorskip("torch")
    buf = MultiAgentReplayBuffer(16, ["a", "b"], n_step=2, gamma=0.5, seed=0,
                                 storage="torch", device="cpu")
    for t in range(4):
        _step(buf, t, ["a", "b"] if t < 2 else ["a"],
              {"b": "term"} if t == 1 else {"a": "term"} if t == 3 else {})
    b = buf.sample(4)
    assert isinstance(b.reward["a"], torch.Tensor)
    assert isinstance(b.agent_discount["b"], torch.Tensor)  # type: ignore[index]
    ep = buf.sample_episodes(2, 6)
    assert isinstance(ep.obs["a"], torch.Tensor) and isinstance(ep.mask, torch.Tensor)
    assert ep.mask.sum().item() == 8 and ep.active["b"].sum().item() == 4
    assert isinstance(ep.numpy().lengths, np.ndarray)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), lanes=st.integers(1, 3), rows=st.integers(2, 9),
       ops=st.lists(st.sampled_from(["add", "add", "add", "extend", "clear", "reload"]),
                    min_size=1, max_size=30))
def test_episode_index_equals_the_full_scan(seed: int, lanes: int, rows: int,
                                            ops: list[str]) -> None:
    """The incrementally kept episode list (EpisodeIndex) equals find_episodes' scan of
    every live step after every operation: adds, extends past a ring's length, clears
    and state loads (which replace what the table holds)."""
    from replaybank.multiagent.padded import EpisodeIndex, find_episodes

    rng = np.random.default_rng(seed)
    buf = rb.ReplayBuffer(rows * lanes, num_envs=lanes, seed=0)
    index = EpisodeIndex()
    origin = np.zeros(lanes, np.int64)
    saved = None

    def step(n: int) -> dict[str, Any]:
        term = rng.random((n, lanes)) < 0.3
        return {"obs": rng.standard_normal((n, lanes, 2)).astype(np.float32),
                "action": np.zeros((n, lanes), np.int64),
                "reward": np.zeros((n, lanes), np.float32),
                "next_obs": rng.standard_normal((n, lanes, 2)).astype(np.float32),
                "terminated": term, "truncated": (rng.random((n, lanes)) < 0.2) & ~term}

    for op in ops:
        if op == "add":
            buf.add(**{k: v[0] for k, v in step(1).items()})
        elif op == "extend":
            buf.extend(**step(int(rng.integers(1, 3 * rows))))
        elif op == "clear":
            buf.clear()
            origin = buf.table.written.copy() if buf.allocated else np.zeros(lanes, np.int64)
        elif saved is None:
            saved = (copy.deepcopy(buf.state_dict()), origin.copy())
            continue
        else:
            buf.load_state_dict(saved[0])
            origin = saved[1]
        if not buf.allocated:
            continue
        t = buf.table
        done = t.arrays["terminated"] | t.arrays["truncated"]
        for running in (False, True):
            want = find_episodes(done, t.written, t.counts, origin, running)
            got = index.episodes(t, origin, running)
            assert got.starts.tolist() == want.starts.tolist()
            assert got.lengths.tolist() == want.lengths.tolist()
            assert got.complete.tolist() == want.complete.tolist()
