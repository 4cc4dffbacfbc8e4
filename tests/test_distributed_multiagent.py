"""The Ray service serving a ``MultiAgentReplayBuffer`` (issue 30, item 5), on a real
local Ray: the same joint steps as a local buffer, exact per-agent transitions and
windows, global PER over the shards, checkpoint and restore, and the local buffer's
errors raised by the client."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.distributed.errors import RowsRejectedWarning
from replaybank.errors import ReplayBankError
from tests.distributed_ray import start
from tests.stats import chi2_critical

ray = pytest.importorskip("ray")
from replaybank.multiagent.distributed import MultiAgentReplayClient  # noqa: E402

AGENTS = ("a", "b", "c")
SHAPES = {"a": (3,), "b": (2,), "c": (3,)}


def code(agent: str, env: int, t: int) -> float:
    """A unique id of an agent's observation at step ``t`` of env ``env``."""
    return float(100_000 * AGENTS.index(agent) + 1000 * env + t)


def scenario(lanes: int, steps: int, seed: int) -> list[dict[str, Any]]:
    """Joint steps of ``lanes`` envs (keyword arguments of ``add``): episodes of 4-7
    steps; ``b`` often terminates early, leaving ``a`` and ``c``; an episode ends with
    every agent left terminated or truncated (mixed). Observations hold
    :func:`code`; a true final observation is ``-code`` of the next step; the state's
    first entry is ``1000 * env + t`` (a key of the joint step)."""
    rng = np.random.default_rng(seed)
    ep_t = np.zeros(lanes, int)
    ep_len = rng.integers(4, 8, lanes)
    b_end = rng.integers(1, 4, lanes)
    b_gone = np.zeros(lanes, bool)
    out = []
    for t in range(steps):
        obs = {a: np.zeros((lanes, *SHAPES[a]), np.float32) for a in AGENTS}
        nxt = {a: np.zeros((lanes, *SHAPES[a]), np.float32) for a in AGENTS}
        act = {a: np.zeros(lanes, bool) for a in AGENTS}
        term = {a: np.zeros(lanes, bool) for a in AGENTS}
        trunc = {a: np.zeros(lanes, bool) for a in AGENTS}
        reward = {a: np.zeros(lanes, np.float32) for a in AGENTS}
        action = {a: np.zeros(lanes, np.int64) for a in AGENTS}
        ends = np.zeros(lanes, bool)
        for e in range(lanes):
            last = ep_t[e] == ep_len[e] - 1
            for a in AGENTS:
                if a == "b" and b_gone[e]:
                    continue
                act[a][e] = True
                obs[a][e] = code(a, e, t)
                nxt[a][e] = code(a, e, t + 1)
                reward[a][e] = rng.normal()
                action[a][e] = rng.integers(0, 5)
                if a == "b" and ep_t[e] == b_end[e] and not last:
                    term[a][e] = True
                elif last:
                    (trunc if rng.random() < 0.4 else term)[a][e] = True
                if term[a][e] or trunc[a][e]:
                    nxt[a][e] = -code(a, e, t + 1)  # the true final observation
            b_gone[e] |= term["b"][e]
            ends[e] = last
        state = np.stack([1000.0 * np.arange(lanes) + t, np.full(lanes, seed)], 1)
        acting = [a for a in AGENTS if act[a].any()]
        out.append(dict(
            obs={a: obs[a] for a in acting}, next_obs={a: nxt[a] for a in acting},
            action={a: action[a] for a in acting}, reward={a: reward[a] for a in acting},
            terminated={a: term[a] for a in acting}, truncated={a: trunc[a] for a in acting},
            active={a: act[a] for a in acting}, state=state.astype(np.float32),
            next_state=(state + np.array([1.0, 0.0])).astype(np.float32)))
        ep_t = np.where(ends, 0, ep_t + 1)
        ep_len = np.where(ends, rng.integers(4, 8, lanes), ep_len)
        b_end = np.where(ends, rng.integers(1, 4, lanes), b_end)
        b_gone &= ~ends
    return out


def config(capacity: int, **more: Any) -> dict[str, Any]:
    return {"type": "MultiAgentReplayBuffer", "agents": list(AGENTS), "capacity": capacity,
            "seed": 0, **more}


def rows_by_key(batch: Any) -> dict[int, dict[str, Any]]:
    """Each row of a MultiAgentBatch by its joint step key (``state[:, 0]``)."""
    out = {}
    for i, key in enumerate(batch.state[:, 0].astype(np.int64).tolist()):
        row: dict[str, Any] = {"state": batch.state[i], "next_state": batch.next_state[i],
                               "joint": (float(batch.joint_reward[i]),
                                         bool(batch.joint_terminated[i]),
                                         bool(batch.joint_truncated[i]))}
        for f in ("obs", "next_obs", "action", "reward", "terminated", "truncated", "active"):
            row[f] = {a: np.asarray(getattr(batch, f)[a][i]) for a in AGENTS}
        out[key] = row
    return out


def same_row(got: dict[str, Any], want: dict[str, Any]) -> bool:
    if got["joint"] != want["joint"]:
        return False
    if not (np.array_equal(got["state"], want["state"])
            and np.array_equal(got["next_state"], want["next_state"])):
        return False
    return all(np.array_equal(got[f][a], want[f][a]) for f in got if isinstance(got[f], dict)
               for a in AGENTS)


def feed(target: Any, steps: list[dict[str, Any]], priority: Any = None) -> None:
    for t, s in enumerate(steps):
        target.add(**s, priority=None if priority is None else priority[t])


def test_service_serves_the_local_buffers_joint_steps(services: list[Any]) -> None:
    lanes, steps = 4, 24
    data = scenario(lanes, steps, seed=1)
    local = rb.MultiAgentReplayBuffer(lanes * steps, agents=AGENTS, num_envs=lanes, seed=0)
    feed(local, data)
    svc = start(services, 2, config(lanes * steps // 2), num_lanes=lanes, seed=0)
    client = svc.client(max_rows=20)  # several sends, and the rest on flush
    assert isinstance(client, MultiAgentReplayClient)
    feed(client, data[:12])
    client = pickle.loads(pickle.dumps(client))  # a writer actor's copy goes on
    feed(client, data[12:])
    client.flush()
    assert len(client) == len(local) == lanes * steps
    want = rows_by_key(local.sample(len(local), replace=False))
    assert len(want) == lanes * steps

    batch = client.sample(256)
    assert isinstance(batch, rb.MultiAgentBatch)
    assert batch.obs["a"].shape == (256, 3) and batch.obs["b"].shape == (256, 2)
    got = rows_by_key(batch)
    for key, row in got.items():  # every sampled joint transition is one that was added
        assert same_row(row, want[key]), key
    # exact next_obs at each agent's own end (b ends before a and c)
    for a in AGENTS:
        ended = batch.terminated[a] | batch.truncated[a]
        assert np.array_equal(batch.next_obs[a][ended, 0], -(batch.obs[a][ended, 0] + 1))
        going = batch.active[a] & ~ended
        assert np.array_equal(batch.next_obs[a][going, 0], batch.obs[a][going, 0] + 1)
    assert (batch.terminated["b"] & ~batch.joint_terminated & ~batch.joint_truncated).any()
    assert not batch.active["b"].all() and batch.active["a"].all()
    # keys are global: both shards' envs are drawn
    envs = set((batch.state[:, 0] // 1000).astype(int).tolist())
    assert envs == set(range(lanes))

    seq = client.sample_sequences(32, 3, episode_boundary="stop")
    assert isinstance(seq, rb.MultiAgentSequenceBatch) and seq.obs["a"].shape == (32, 3, 3)
    for i in range(32):
        keys = seq.state[i, :, 0][seq.mask[i]].astype(np.int64)
        assert np.array_equal(np.diff(keys), np.ones(len(keys) - 1))  # one env, in order
        for j, key in enumerate(keys.tolist()):
            w = want[key]
            for a in AGENTS:
                assert bool(seq.active[a][i, j]) == bool(w["active"][a])
                assert np.array_equal(seq.next_obs[a][i, j], w["next_obs"][a])


def test_prioritized_sampling_over_shards_follows_client_priorities(
        services: list[Any]) -> None:
    lanes, steps = 4, 8
    data = scenario(lanes, steps, seed=2)
    per = {"type": "prioritized", "alpha": 1.0, "beta": 0.5, "eps": 0.0, "kernel": "numpy"}
    svc = start(services, 2, config(lanes * steps // 2, sampler=per), num_lanes=lanes,
                seed=3)
    client = svc.client()
    feed(client, data, priority=np.ones((steps, lanes)))
    client.flush()
    n = lanes * steps
    # every joint step's key (a draw of 2000 misses none of 32 items but with ~1e-13)
    first = client.sample(2000)
    keys = first.state[:, 0].astype(np.int64)
    uniq, at = np.unique(keys, return_index=True)
    assert len(uniq) == n
    prio = 1.0 + (uniq % 7) + (uniq // 1000)  # a priority per joint step
    assert client.update_priorities(first.indices[at], prio) == n
    p = prio / prio.sum()
    counts = np.zeros(n)
    for _ in range(8):
        batch = client.sample(1000)
        pos = np.searchsorted(uniq, batch.state[:, 0].astype(np.int64))
        np.add.at(counts, pos, 1)
        assert np.allclose(batch.probabilities, p[pos], rtol=1e-5)
        # weights: (N P(i))^-beta over the buffer's max (the smallest priority)
        w = (n * p[pos]) ** -0.5 / (n * p.min()) ** -0.5
        assert np.allclose(batch.weights, w, rtol=1e-5)
    expected = 8000 * p
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < chi2_critical(n - 1), stat


def test_checkpoint_and_restore_keep_contents_and_episodes(
        services: list[Any], tmp_path: Any) -> None:
    lanes, steps = 2, 20
    data = scenario(lanes, steps + 6, seed=4)
    svc = start(services, 2, config(64), num_lanes=lanes, seed=5,
                checkpoint_dir=tmp_path / "ckpt")
    client = svc.client("learner")
    feed(client, data[:steps])
    path = svc.checkpoint()
    restored = rb.distributed.ReplayService.restore(path, num_cpus=0.25, timeout=30.0)
    services.append(restored)
    again = restored.client("learner")
    assert len(again) == len(client) == lanes * steps
    # the identical next sample (shards' generators and the client's split restored)
    one, two = client.sample(64), again.sample(64)
    assert np.array_equal(one.indices, two.indices)
    assert same_contents(rows_by_key(one), rows_by_key(two))
    # the joint episode bookkeeping went with the shards: the next steps continue
    # every env's episode in both services alike (joint ends, placeholders)
    feed(client, data[steps:])
    feed(again, data[steps:])
    client.flush()
    again.flush()
    one, two = client.sample(256), again.sample(256)
    assert np.array_equal(one.indices, two.indices)
    assert same_contents(rows_by_key(one), rows_by_key(two))


def same_contents(x: dict[int, Any], y: dict[int, Any]) -> bool:
    return set(x) == set(y) and all(same_row(x[k], y[k]) for k in x)


BAD = [
    ("unknown agent", lambda s: {**s, "reward": {**s["reward"], "z": np.zeros(2)}}),
    ("missing from reward", lambda s: {**s, "reward": {"a": s["reward"]["a"]}}),
    ("obs not a dict", lambda s: {**s, "obs": np.zeros((2, 3))}),
    ("bad shape", lambda s: {**s, "obs": {**s["obs"], "a": np.zeros((2, 4))}}),
    ("state missing", lambda s: {**s, "state": None, "next_state": None}),
    ("active stray", lambda s: {**s, "active": {**s["active"], "z": np.ones(2, bool)}}),
    ("positional", None),
]


@pytest.mark.parametrize("lanes", [2])
def test_bad_calls_raise_the_local_error_and_change_nothing(
        services: list[Any], lanes: int) -> None:
    data = scenario(lanes, 12, seed=6)
    local = rb.MultiAgentReplayBuffer(64, agents=AGENTS, num_envs=lanes, seed=0)
    svc = start(services, 2, config(32), num_lanes=lanes, seed=0)
    client = svc.client()
    feed(local, data[:6])
    feed(client, data[:6])
    client.flush()
    before, pending = len(client), client.pending_rows
    for name, bad in BAD:
        errors = []
        for target in (local, client):
            with pytest.raises(ReplayBankError) as info:
                if bad is None:
                    target.add(data[6]["obs"])
                else:
                    target.add(**bad(data[6]))
            errors.append(info.value)
        assert type(errors[0]) is type(errors[1]), name
        assert str(errors[0]) == str(errors[1]), name
        assert client.pending_rows == pending, name
    client.flush()
    assert len(client) == before == len(local)
    # an agent acting again after its own end in the episode: the client knows it from
    # the steps it queued and raises the local error, with nothing queued
    gone = next(t for t in range(6, 12) if "b" in data[t]["active"]
                and not data[t]["active"]["b"].all())
    for t in range(6, gone):
        feed(local, [data[t]])
        feed(client, [data[t]])
    client.flush()
    again = {**data[gone], "active": {**data[gone]["active"], "b": np.ones(lanes, bool)}}
    again = {k: ({**v, "b": v.get("b", np.zeros_like(v["a"]))} if isinstance(v, dict)
                 else v) for k, v in again.items()}
    rule = "ended (terminated or truncated) earlier in this episode"
    errors = []
    n = len(client)
    for target in (local, client):
        with pytest.raises(ReplayBankError, match=rule.replace("(", r"\(").replace(")", r"\)")
                           ) as info:
            target.add(**again)
        errors.append(info.value)
    assert type(errors[0]) is type(errors[1]) and str(errors[0]) == str(errors[1])
    assert client.pending_rows == 0
    client.flush()
    assert len(client) == n
    # a client that did not write those steps (another writer, or built after a restore)
    # does not know b ended: the shards of the envs where it had ended refuse the step
    # (nothing of it stored there), the client reports it, the other shards store theirs
    other = svc.client()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        other.add(**again)
        other.flush()
    reports = [w for w in caught if issubclass(w.category, RowsRejectedWarning)]
    assert len(reports) == 1 and rule in str(reports[0].message)
    # each shard holds one env here
    assert len(client) == n + int(data[gone]["active"]["b"].sum())


def test_load_state_dict_into_a_buffer_without_spec_keeps_state_and_extras() -> None:
    """What a restored shard does (its buffer is built from the config, then loaded):
    the layout comes back whole, the global state and per-agent extras included."""
    step = dict(obs={k: np.zeros(2, np.float32) for k in "ab"}, action={k: 0 for k in "ab"},
                reward={k: 1.0 for k in "ab"}, next_obs={k: np.ones(2, np.float32) for k in "ab"},
                terminated={k: False for k in "ab"}, truncated={k: False for k in "ab"},
                state=np.zeros(3, np.float32), next_state=np.ones(3, np.float32),
                logp={k: 0.5 for k in "ab"})
    saved = rb.MultiAgentReplayBuffer(8, agents=["a", "b"], seed=0)
    saved.add(**step)
    fresh = rb.MultiAgentReplayBuffer(8, agents=["a", "b"], seed=0)
    fresh.load_state_dict(saved.state_dict())
    assert fresh.layout is not None and fresh.layout.state is not None
    assert fresh.layout.extras == ("logp",)
    fresh.add(**step)
    assert len(fresh) == 2


def test_rb_collect_fills_the_client_as_the_local_buffer(services: list[Any]) -> None:
    """``rb.collect(parallel envs, policy, client, n)`` was refused (the collector took
    only a MultiAgentReplayBuffer, and the client had no check_first_add, end_episodes,
    capacity or spec): it fills the service with the joint steps a local buffer gets
    from the same envs and seed. A second ``rb.collect`` would reset envs whose joint
    episodes run on the shards cuts them there, as the local buffer's end_episodes does."""
    pytest.importorskip("pettingzoo")
    from tests.pettingzoo_leavers import Clock

    local = rb.MultiAgentReplayBuffer(40, agents=["a", "b"], num_envs=2, seed=0)
    svc = start(services, 2, {"type": "MultiAgentReplayBuffer", "agents": ["a", "b"],
                              "capacity": 20, "seed": 0}, num_lanes=2, seed=0)
    client = svc.client()
    assert client.capacity == local.capacity and client.spec is None
    for target in (local, client):
        rb.collect([Clock(), Clock()], None, target, 12, progress=False, seed=3)
    client.flush()
    assert len(client) == len(local) == 12 and client.spec == local.spec

    def stored(batch: Any) -> list[tuple[Any, ...]]:
        return sorted(
            (*batch.obs[a][i].tolist(), *batch.next_obs[a][i].tolist(),
             int(batch.action[a][i]), float(batch.reward[a][i]), bool(batch.active[a][i]))
            for a in ("a", "b") for i in range(len(batch.indices)))

    assert stored(client.sample(12, replace=False)) == stored(local.sample(12, replace=False))
    # a second rb.collect resets envs whose joint episodes run: it was refused on the
    # service (ConfigError: the shards could not cut them); now they are cut as the
    # local buffer cuts them, and both hold the same joint steps
    for target in (local, client):
        rb.collect([Clock(), Clock()], None, target, 6, progress=False, seed=5)
    assert len(client) == len(local) == 18
    assert stored(client.sample(18, replace=False)) == stored(local.sample(18, replace=False))


def test_the_client_stores_tuple_actions_part_by_part(services: list[Any]) -> None:
    """A Tuple action (agent "t", beside "x" with a Box) through the service: the
    client's rows are built from the layout the local buffer uses, so the shards store
    its parts ``action/t/0``, ``action/t/1`` and the client's sample gives them as the
    local buffer's (with "x" inactive in some envs: its rows are filled per part)."""
    pytest.importorskip("pettingzoo")
    from tests.pettingzoo_leavers import TupleActs, tuple_policy

    local = rb.MultiAgentReplayBuffer(40, agents=["t", "x"], num_envs=2, seed=0)
    svc = start(services, 2, {"type": "MultiAgentReplayBuffer", "agents": ["t", "x"],
                              "capacity": 20, "seed": 0}, num_lanes=2, seed=0)
    client = svc.client()
    for target in (local, client):
        rb.collect([TupleActs(0), TupleActs(1)], tuple_policy, target, 12, progress=False,
                   seed=3)
    client.flush()
    assert len(client) == len(local) == 12 and client.spec == local.spec
    assert [n for n in client.spec if n.startswith("action")] == [
        "action/t/0", "action/t/1", "action/x"]

    def stored(batch: Any) -> list[tuple[Any, ...]]:
        return sorted((*batch.obs["t"][i].tolist(), int(batch.action["t"]["0"][i]),
                       *batch.action["t"]["1"][i].tolist(), *batch.action["x"][i].tolist(),
                       bool(batch.active["x"][i])) for i in range(len(batch.indices)))

    got = stored(client.sample(12, replace=False))
    assert got == stored(local.sample(12, replace=False))
    assert not all(row[-1] for row in got)  # "x" sat out some steps


def joint(t: int, acting: list[tuple[str, ...]], ended: tuple[tuple[str, int], ...] = (),
          reset: tuple[int, ...] = ()) -> dict[str, Any]:
    """One joint step of ``len(acting)`` envs (``add`` keywords): ``acting[e]`` act in env
    ``e``; ``(agent, env)`` in ``ended`` terminates there; an env in ``reset`` starts
    from a reset observation (never a step's next one). The state's first entry is
    ``1000 * env + t`` (a key of the joint step)."""
    lanes = len(acting)
    names = sorted({a for act in acting for a in act})
    shapes = {"a": (3,), "b": (2,)}
    act = {a: np.array([a in acting[e] for e in range(lanes)]) for a in names}
    obs, nxt = {}, {}
    for a in names:
        base = np.array([code(a, e, t) + 500.0 * (e in reset) for e in range(lanes)])
        obs[a] = np.repeat(base[:, None], shapes[a][0], 1).astype(np.float32)
        step = np.array([code(a, e, t + 1) * (-1 if (a, e) in ended else 1)
                         for e in range(lanes)])
        nxt[a] = np.repeat(step[:, None], shapes[a][0], 1).astype(np.float32)
    term = {a: np.array([(a, e) in ended for e in range(lanes)]) for a in names}
    state = np.stack([1000.0 * np.arange(lanes) + t, np.zeros(lanes)], 1).astype(np.float32)
    return dict(obs=obs, next_obs=nxt, action={a: np.zeros(lanes, np.int64) for a in names},
                reward={a: np.full(lanes, 1.0 + t, np.float32) for a in names},
                terminated=term, truncated={a: np.zeros(lanes, bool) for a in names},
                active=act, state=state, next_state=state + np.float32([1.0, 0.0]))


def test_end_episodes_cuts_running_episodes_on_the_shards_as_locally(
        services: list[Any]) -> None:
    """``end_episodes`` of an env whose joint episode runs was refused by the client
    (ConfigError: the shards' writes carried steps only). It is now queued in the
    client's write stream and cuts the episode on the env's shard between the same two
    steps as a local buffer: an agent that had ended acts again in the new episode, the
    n-step returns and joint flags end at the cut, and windows stop there; every joint
    transition equals the local buffer's fed the same calls."""
    both = ("a", "b")
    calls: list[Any] = [
        joint(0, [both, both]),
        joint(1, [both, both], ended=(("b", 0), ("b", 1))),  # b ends, a runs on
        joint(2, [("a",), ("a",)]),
        ("end", [0]),                                         # env 0 reset mid-episode
        joint(3, [both, ("a",)], reset=(0,)),                 # b acts again in env 0
        joint(4, [both, ("a",)], ended=(("a", 1),)),          # env 1's episode ends
        ("end", None),                                        # env 0 cut again; 1: none
        joint(5, [both, both], reset=(0, 1)),
        joint(6, [both, both]),
    ]
    cfg = config(16, n_step=3, gamma=0.5, agents=["a", "b"])
    local = rb.MultiAgentReplayBuffer(32, agents=["a", "b"], num_envs=2, seed=0, n_step=3,
                                      gamma=0.5)
    svc = start(services, 2, cfg, num_lanes=2, seed=0)
    client = svc.client(max_age_s=1e3)  # the cuts travel with the queued steps
    for target in (local, client):
        for c in calls:
            if isinstance(c, tuple):
                target.end_episodes(c[1])
            else:
                target.add(**c)
    assert len(client) == len(local) == 14

    def rows(batch: Any) -> dict[int, tuple[Any, ...]]:
        out = {}
        for i, key in enumerate(batch.state[:, 0].astype(np.int64).tolist()):
            out[key] = (float(batch.joint_reward[i]), float(batch.discount[i]),
                        bool(batch.joint_terminated[i]), bool(batch.joint_truncated[i]),
                        *(batch.next_obs[a][i].tolist() for a in ("a", "b")),
                        *(bool(batch.active[a][i]) for a in ("a", "b")),
                        *(float(batch.agent_discount[a][i]) for a in ("a", "b")))
        return out

    want, got = rows(local.sample(14, replace=False)), rows(client.sample(14, replace=False))
    assert got == want
    assert want[2][1] == 0.5  # env 0, t = 2: its return stops at the cut (1 step)
    # windows stop at the cut: no window of env 0 holds both t = 2 and t = 3
    for target in (local, client):
        seq = target.sample_sequences(64, 3, episode_boundary="stop")
        for i in range(64):
            keys = seq.state[i, :, 0][seq.mask[i]].astype(int).tolist()
            assert not {2, 3} <= set(keys) and not {4, 5} <= set(keys), keys


def test_clear_drops_every_joint_step_and_the_episode_bookkeeping(
        services: list[Any]) -> None:
    """A multi-agent client had no ``clear()``. It clears every shard's buffer and its
    own copy of the episode bookkeeping, as the local buffer's: a sample raises
    EmptyBufferError, and an agent that had ended in the running episode may act
    again."""
    both = ("a", "b")
    local = rb.MultiAgentReplayBuffer(32, agents=["a", "b"], num_envs=2, seed=0)
    svc = start(services, 2, config(16, agents=["a", "b"]), num_lanes=2, seed=0)
    client = svc.client()
    for target in (local, client):
        target.add(**joint(0, [both, both], ended=(("b", 0),)))
        target.add(**joint(1, [("a",), both]))
        target.clear()
        assert len(target) == 0
        with pytest.raises(rb.EmptyBufferError):
            target.sample(2)
        target.add(**joint(2, [both, both]))  # b acts in env 0 again
    assert len(client) == len(local) == 2
    for target in (local, client):
        batch = target.sample(2, replace=False)
        assert set(batch.state[:, 0].astype(int).tolist()) == {2, 1002}
        assert batch.active["b"].all()


class _HookedObs:
    """An agent's observations whose first conversion (inside ``add``'s checks) runs
    ``hook`` first."""

    def __init__(self, values: np.ndarray, hook: Any) -> None:
        self.values, self.hook = values, hook

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return self.values if dtype is None else self.values.astype(dtype)


def test_a_second_threads_call_is_refused_and_changes_no_bookkeeping(
        services: list[Any]) -> None:
    """A multi-agent client serves one thread at a time, its whole call: another
    thread's ``add``, ``end_episodes`` or ``clear`` made while this thread's ``add`` is
    being checked raises ``ConcurrentCallError`` naming both calls and both threads,
    queues nothing and leaves the episode bookkeeping as it was, so the client goes on
    as a local buffer given the calls that went through. Only the core client's part
    used to be checked: the other thread's ``add`` (and the others) went through in the
    middle of this thread's ``add``."""
    import threading

    both = ("a", "b")
    local = rb.MultiAgentReplayBuffer(32, agents=["a", "b"], num_envs=2, seed=0)
    svc = start(services, 2, config(16, agents=["a", "b"]), num_lanes=2, seed=0)
    client = svc.client()
    other_calls = {
        "add": lambda: client.add(**joint(1, [("b",), ("b",)], ended=(("b", 0), ("b", 1)))),
        "end_episodes": lambda: client.end_episodes([0]),
        "clear": client.clear,
    }
    raised: dict[str, BaseException | None] = {}

    def others() -> None:  # in the middle of the main thread's add
        for name, call in other_calls.items():
            def run(name: str = name, call: Any = call) -> None:
                try:
                    call()
                    raised[name] = None
                except BaseException as exc:  # reported by the test
                    raised[name] = exc
            th = threading.Thread(target=run, name="collector")
            th.start()
            th.join(30)

    for target in (local, client):
        target.add(**joint(0, [both, both]))
    a_ends = joint(1, [("a",), ("a",)], ended=(("a", 0), ("a", 1)))  # b acts on later
    local.add(**a_ends)
    client.add(**{**a_ends, "obs": {"a": _HookedObs(a_ends["obs"]["a"], others)}})
    assert set(raised) == set(other_calls)
    for name, exc in raised.items():
        assert isinstance(exc, rb.ConcurrentCallError), (name, exc)
        msg = str(exc)
        assert f"MultiAgentReplayClient.{name}()" in msg and "add()" in msg, msg
        assert "'collector'" in msg and "'MainThread'" in msg and "service.client(" in msg
    # the bookkeeping is the local buffer's: a ended, b still runs in both envs
    again = joint(2, [("a",), ("a",)])
    with pytest.raises(ReplayBankError) as want:
        local.add(**again)
    with pytest.raises(type(want.value)):
        client.add(**again)
    for target in (local, client):
        target.add(**joint(2, [("b",), ("b",)], ended=(("b", 0), ("b", 1))))
        target.add(**joint(3, [both, both]))  # a new episode: a acts again
    assert len(client) == len(local) == 8
    got = client.sample(8, replace=False)
    assert sorted(got.state[:, 0].tolist()) == sorted(local.sample(8, replace=False)
                                                      .state[:, 0].tolist())
