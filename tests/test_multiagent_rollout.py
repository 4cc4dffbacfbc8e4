"""MultiAgentRolloutBuffer: per-agent GAE against a plain-loop oracle, minibatch coverage,
seeding, checkpoints, rejected calls, and a real PettingZoo (mpe2) rollout."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaybank.batch import Batch
from replaybank.errors import (
    ArgumentError,
    BufferChangedError,
    CapacityError,
    CheckpointError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    ReplayBankError,
    ShapeError,
    SpecError,
)
from replaybank.multiagent import MultiAgentRolloutBatch, MultiAgentRolloutBuffer
from replaybank.multiagent.rollout_gae import active_gae

GAMMA, LAM = 0.9, 0.8


# ---------------------------------------------------------------- the plain-loop oracle
def oracle(sc: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per env, per agent: GAE over the agent's active steps, its own ends, truncation
    bootstrapping from final values, last values after its last active step."""
    adv: dict[str, np.ndarray] = {}
    ret: dict[str, np.ndarray] = {}
    n_t, n_e = sc["T"], sc["E"]
    for a in sc["agents"]:
        adv[a] = np.zeros((n_t, n_e))
        ret[a] = np.zeros((n_t, n_e))
        for e in range(n_e):
            steps = [t for t in range(n_t) if sc["active"][a][t, e]]
            nxt = 0.0
            for k in reversed(range(len(steps))):
                t = steps[k]
                v = sc["value_of"](a, t, e)
                term, trunc = sc["term"][a][t, e], sc["trunc"][a][t, e]
                if term:
                    nv = 0.0
                elif trunc:
                    nv = sc["fv"][a][t, e]
                elif k + 1 < len(steps):
                    nv = sc["value_of"](a, steps[k + 1], e)
                else:
                    nv = sc["last"][a][e]
                delta = sc["rew"][a][t, e] + GAMMA * nv - v
                cut = term or trunc or k + 1 == len(steps)
                nxt = delta if cut else delta + GAMMA * LAM * nxt
                adv[a][t, e] = nxt
                ret[a][t, e] = nxt + v
    return adv, ret


def scenario(seed: int, n_agents: int, n_envs: int, n_steps: int, central: bool,
             same_shapes: bool = False) -> dict[str, Any]:
    """A random rollout: agents acting in some envs, ending at different steps (then
    inactive until the env's joint episode ends and everyone is back), truncations."""
    rng = np.random.default_rng(seed)
    T, E = n_steps, n_envs  # noqa: N806 (the rollout's [T, E])
    agents = [f"agent_{i}" for i in range(n_agents)]
    shapes = {a: (3,) if same_shapes else [(3,), (2, 2), ()][i] for i, a in enumerate(agents)}
    active = {a: np.zeros((T, E), bool) for a in agents}
    term = {a: np.zeros((T, E), bool) for a in agents}
    trunc = {a: np.zeros((T, E), bool) for a in agents}
    for e in range(E):
        alive = set(agents)
        for t in range(T):
            for a in agents:
                if a in alive and rng.random() < 0.85:  # sometimes skips a step
                    active[a][t, e] = True
                    u = rng.random()
                    if u < 0.15:
                        term[a][t, e] = True
                    elif u < 0.25:
                        trunc[a][t, e] = True
                    if term[a][t, e] or trunc[a][t, e]:
                        alive.discard(a)
            if not alive:
                alive = set(agents)  # the joint episode ended: reset
    rew = {a: rng.normal(size=(T, E)) for a in agents}
    vals = {a: rng.normal(size=(T, E)) for a in agents}
    cval = rng.normal(size=(T, E))
    fv = {a: np.where(trunc[a] & ~term[a], rng.normal(size=(T, E)), np.nan) for a in agents}
    last = {a: rng.normal(size=E) for a in agents}
    obs = {a: rng.normal(size=(T, E, *shapes[a])).astype(np.float32) for a in agents}
    act = {a: rng.integers(0, 5, size=(T, E)) for a in agents}
    logp = {a: rng.normal(size=(T, E)) for a in agents}
    state = rng.normal(size=(T, E, 4)).astype(np.float32)

    def value_of(a: str, t: int, e: int) -> float:
        return float(cval[t, e] if central else vals[a][t, e])

    cfv = rng.normal(size=(T, E))
    if central:  # one final value per env per step: the same for every agent
        fv = {a: np.where(trunc[a] & ~term[a], cfv, np.nan) for a in agents}
        last = {a: np.tile(last[agents[0]], 1) for a in agents}
    spec: dict[str, Any] = {
        "obs": {a: (shapes[a], "float32") for a in agents},
        "action": {a: ((), "int64") for a in agents},
        "log_prob": {a: ((), "float64") for a in agents},
        "value": ((), "float64") if central else {a: ((), "float64") for a in agents},
        "state": ((4,), "float32")}
    return dict(spec=spec, agents=agents, T=T, E=E, central=central, active=active, term=term,
                trunc=trunc, rew=rew, vals=vals, cval=cval, cfv=cfv, fv=fv, last=last, obs=obs,
                act=act, logp=logp, state=state, value_of=value_of, shapes=shapes)


def fill(buf: MultiAgentRolloutBuffer, sc: dict[str, Any], steps: int | None = None) -> None:
    n_e = sc["E"]
    for t in range(sc["T"] if steps is None else steps):
        acting = [a for a in sc["agents"] if sc["active"][a][t].any()]
        if not acting:
            continue
        d = {k: {a: sc[k][a][t] for a in acting} for k in ("obs", "act", "rew", "logp")}
        value: Any = sc["cval"][t] if sc["central"] else {a: sc["vals"][a][t] for a in acting}
        fv: Any = None
        if sc["central"]:
            cut = np.zeros(n_e, bool)
            for a in acting:
                cut |= sc["trunc"][a][t] & ~sc["term"][a][t]
            if cut.any():
                fv = np.where(cut, sc["cfv"][t], np.nan)
        else:
            fv = {a: sc["fv"][a][t] for a in acting}
        buf.add(obs=d["obs"], action=d["act"], reward=d["rew"],
                terminated={a: sc["term"][a][t] for a in acting},
                truncated={a: sc["trunc"][a][t] for a in acting}, value=value,
                log_prob=d["logp"], state=sc["state"][t],
                active={a: sc["active"][a][t] for a in acting}, final_value=fv)


def last_values(sc: dict[str, Any]) -> Any:
    return sc["last"][sc["agents"][0]] if sc["central"] else sc["last"]


def built(sc: dict[str, Any], seed: int = 0, **kw: Any) -> MultiAgentRolloutBuffer:
    buf = MultiAgentRolloutBuffer(sc["T"], sc["agents"], num_envs=sc["E"], gamma=GAMMA,
                                  gae_lambda=LAM, seed=seed, spec=sc["spec"], **kw)
    fill(buf, sc)
    buf.compute_returns_and_advantage(last_values=last_values(sc))
    return buf


def has_steps(sc: dict[str, Any]) -> bool:
    return all(any(sc["active"][a][t].any() for a in sc["agents"]) for t in range(sc["T"]))


SCENARIOS = st.builds(lambda s, n, e, t, c: (s, n, e, t, c), st.integers(0, 2**31),
                      st.integers(2, 3), st.integers(1, 3), st.integers(1, 9), st.booleans())


# ---------------------------------------------------------------- GAE
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SCENARIOS)
def test_advantages_and_returns_match_the_plain_loop_oracle(args: tuple[Any, ...]) -> None:
    sc = scenario(*args)
    if not has_steps(sc):
        return
    buf = built(sc)
    adv, ret = oracle(sc)
    for a in sc["agents"]:
        np.testing.assert_allclose(buf.advantages[a], adv[a], rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(buf.returns[a], ret[a], rtol=1e-10, atol=1e-10)
        assert buf.advantages[a].dtype == np.float64  # float64 values: float64 results


def test_active_gae_skips_inactive_steps_and_cuts_at_each_lanes_end() -> None:
    act = np.array([[True, True], [False, True], [True, True]])
    term = np.array([[False, True], [False, False], [False, False]])
    adv = active_gae(np.ones((3, 2)), np.zeros((3, 2)), term, np.zeros((3, 2), bool), act,
                     last_values=np.array([2.0, 0.0]), gamma=0.5, gae_lambda=1.0)
    assert adv[:, 0].tolist() == [2.0, 0.0, 2.0]  # 1 + .5 * (1 + .5 * 2), skip, 1 + .5 * 2
    assert adv[:, 1].tolist() == [1.0, 1.5, 1.0]  # lane 1 ends at step 0


def test_centralised_value_is_shared_and_truncation_bootstraps_per_agent() -> None:
    buf = MultiAgentRolloutBuffer(2, ["a", "b"], gamma=0.5, gae_lambda=1.0,
                                  normalize_advantage=None)
    buf.add(obs={"a": [0.0], "b": [0.0]}, action={"a": 0, "b": 0},
            reward={"a": 1.0, "b": 1.0}, terminated={"a": False, "b": False},
            truncated={"a": True, "b": False}, value=np.float64(1.0),
            log_prob={"a": 0.0, "b": 0.0}, final_value={"a": 4.0})
    buf.add(obs={"b": [1.0]}, action={"b": 0}, reward={"b": 0.0}, terminated={"b": False},
            truncated={"b": False}, value=np.float64(2.0), log_prob={"b": 0.0})
    buf.compute_returns_and_advantage(last_values=6.0)
    assert buf.centralised_value is True
    assert buf.advantages["a"][:, 0].tolist() == [2.0, 0.0]  # 1 + .5 * 4 - 1
    assert buf.advantages["b"][:, 0].tolist() == [1.5, 1.0]  # (1 + .5 * 2 - 1) + .5 * 1
    assert buf.returns["a"][:, 0].tolist() == [3.0, 0.0]


# ---------------------------------------------------------------- minibatches
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SCENARIOS, st.integers(1, 7))
def test_minibatches_cover_every_active_item_exactly_once(args: tuple[Any, ...],
                                                          batch_size: int) -> None:
    s, n, e, t, c = args
    sc = scenario(s, n, e, t, c, same_shapes=True)
    if not has_steps(sc):
        return
    buf = built(sc, normalize_advantage=None)
    n_e, agents = sc["E"], sc["agents"]
    any_active = np.stack([sc["active"][a] for a in agents]).any(axis=0)  # [T, E]
    seen: list[int] = []
    for b in buf.get(batch_size=batch_size):
        assert isinstance(b, MultiAgentRolloutBatch) and b.batch_size <= batch_size
        steps = b.indices
        seen += steps.tolist()
        tt, ee = np.divmod(steps, n_e)
        for a in agents:
            np.testing.assert_array_equal(b.active[a], sc["active"][a][tt, ee])
            np.testing.assert_array_equal(b.advantages[a], buf.advantages[a][tt, ee])
            np.testing.assert_array_equal(b.returns[a], buf.returns[a][tt, ee])
            on = b.active[a]
            np.testing.assert_array_equal(b.obs[a][on], sc["obs"][a][tt, ee][on])
            assert not b.obs[a][~on].any() and not b.advantages[a][~on].any()
        np.testing.assert_array_equal(b.state, sc["state"][tt, ee])
    assert sorted(seen) == np.flatnonzero(any_active.reshape(-1)).tolist()
    items: list[tuple[int, int]] = []
    for b in buf.get(batch_size=batch_size, agents="flatten"):
        assert isinstance(b, Batch)
        for k, i, o, adv in zip(b.indices.tolist(), b.agent.tolist(), b.obs, b.advantages,
                                strict=True):
            a = agents[i]
            tt, ee = divmod(k, n_e)
            assert sc["active"][a][tt, ee]
            np.testing.assert_array_equal(o, sc["obs"][a][tt, ee])
            assert adv == buf.advantages[a][tt, ee]
            items.append((k, i))
    want = [(k, i) for k in range(sc["T"] * n_e) for i, a in enumerate(agents)
            if sc["active"][a].reshape(-1)[k]]
    assert sorted(items) == want


def test_minibatches_are_seeded_and_reproducible() -> None:
    sc = scenario(3, 3, 2, 8, False, same_shapes=True)
    one, two, other = built(sc, seed=7), built(sc, seed=7), built(sc, seed=8)
    for mode in ("together", "flatten"):
        a = [b.indices.tolist() for b in one.get(4, agents=mode)]  # type: ignore[call-overload]
        b = [b.indices.tolist() for b in two.get(4, agents=mode)]  # type: ignore[call-overload]
        c = [b.indices.tolist() for b in other.get(4, agents=mode)]  # type: ignore[call-overload]
        assert a == b and a != c
    plain = [b.indices.tolist() for b in one.get(5, shuffle=False)]
    flat = [k for part in plain for k in part]
    assert flat == sorted(flat)


def test_advantage_normalisation_uses_active_entries() -> None:
    sc = scenario(5, 2, 2, 9, False, same_shapes=True)
    buf = built(sc, normalize_advantage="batch")
    b = next(iter(buf.get()))
    vals = np.concatenate([b.advantages[a][b.active[a]] for a in buf.agents])
    assert abs(vals.mean()) < 1e-9 and abs(vals.std() - 1) < 1e-6
    flat = next(iter(buf.get(agents="flatten")))
    assert abs(flat.advantages.mean()) < 1e-9
    for mb in buf.get(batch_size=4, agents="flatten"):
        assert mb.advantages.shape == mb.agent.shape


@pytest.mark.parametrize("mode", ["together", "flatten"])
@pytest.mark.parametrize("change", ["reset", "add", "end_episodes", "recompute"])
def test_a_get_generator_refuses_to_go_on_after_the_rollout_changed(mode: str,
                                                                    change: str) -> None:
    """``get``'s generator resumed after the rollout changed under it raises
    ``BufferChangedError`` naming the fix, as ``RolloutBuffer``'s generators do. It used
    to go on: after ``reset()`` and 4 adds between batches of ``get(2, shuffle=False)``
    (together), its next batch was 2 steps of the new rollout with the old advantages."""
    sc = scenario(3, 2, 2, 8, False, same_shapes=True)
    buf = built(sc)
    gen = buf.get(2, agents=mode)  # type: ignore[call-overload]
    seen = len(next(gen).indices)
    if change == "reset":
        buf.reset()
    elif change == "add":
        buf.reset()
        fill(buf, sc, steps=4)
    elif change == "end_episodes":
        buf.end_episodes(None, final_value={a: np.zeros(2) for a in sc["agents"]})
    else:
        buf.compute_returns_and_advantage(last_values=last_values(sc))
    with pytest.raises(BufferChangedError,
                       match=r"MultiAgentRolloutBuffer\.get\(\): the rollout changed.*get\(\)"):
        next(gen)
    assert seen == 2
    # a loop that only reads goes on; one that resets inside is refused at its next batch
    buf = built(sc)
    read = 0
    for _ in buf.get(4, agents=mode):  # type: ignore[call-overload]
        buf.state_dict()
        read += 1
    assert read > 1
    with pytest.raises(BufferChangedError):
        for _ in buf.get(4, agents=mode):  # type: ignore[call-overload]
            buf.reset()


def test_flatten_names_the_agents_whose_shapes_differ() -> None:
    buf = built(scenario(1, 2, 1, 4, False))
    with pytest.raises(ShapeError, match=r"agent_0.*agent_1.*together"):
        buf.get(agents="flatten")


def test_flatten_refuses_tuple_beside_box_actions_and_names_the_fixes() -> None:
    """``get(agents='flatten')`` stacks each field over the agents, for one network
    shared by agents of one space; an agent acting with a ``Tuple`` (parts) beside one
    acting with a ``Box`` (one array) is refused rather than flattened (the buffer keeps
    no spaces: a Discrete part is one int, gymnasium's flatten makes it a one-hot), and
    the message names both fixes: ``'together'``, or one array per agent at add time
    (it used to name only ``'together'`` and "the same action keys")."""
    buf = MultiAgentRolloutBuffer(2, ["t", "x"], seed=0)
    for _ in range(2):
        buf.add(obs={"t": np.zeros(2, np.float32), "x": np.zeros(2, np.float32)},
                action={"t": {"0": 1, "1": np.zeros(3, np.float32)},
                        "x": np.zeros(4, np.float32)},
                reward={"t": 1.0, "x": 1.0}, value={"t": 0.0, "x": 0.0},
                log_prob={"t": 0.0, "x": 0.0}, terminated={"t": False, "x": False},
                truncated={"t": False, "x": False})
    buf.compute_returns_and_advantage({"t": 0.0, "x": 0.0})
    with pytest.raises(ShapeError) as info:
        buf.get(agents="flatten")
    msg = str(info.value)
    assert "{'t': ['0', '1'], 'x': None}" in msg and "get(agents='together')" in msg, msg
    assert "gymnasium.spaces.flatten(env.action_space(agent), value)" in msg, msg
    together = next(buf.get())
    assert together.action["t"]["1"].shape == (2, 3) and together.action["x"].shape == (2, 4)


# ---------------------------------------------------------------- checkpoints
def arrays_equal(x: Any, y: Any) -> bool:
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(
            arrays_equal(x[k], y[k]) for k in x)
    if isinstance(x, np.ndarray):
        return isinstance(y, np.ndarray) and x.dtype == y.dtype \
            and np.array_equal(x, y, equal_nan=True)
    return bool(x == y)


@pytest.mark.parametrize("central", [False, True])
def test_state_dict_round_trip_gives_identical_batches(central: bool) -> None:
    sc = scenario(11, 3, 2, 6, central)
    buf = built(sc, seed=5)
    state = buf.state_dict()
    fresh = MultiAgentRolloutBuffer(sc["T"], sc["agents"], num_envs=sc["E"], gamma=GAMMA,
                                    gae_lambda=LAM, seed=99)
    fresh.load_state_dict(state)
    restored = fresh.state_dict()
    for key in ("metadata", "rng", "arrays"):  # "init" keeps the constructor's seed
        assert arrays_equal(restored[key], state[key]), key
    want = [b.core.to_dict(nested=False) for b in buf.get(3)]
    got = [b.core.to_dict(nested=False) for b in fresh.get(3)]
    assert arrays_equal(dict(enumerate(want)), dict(enumerate(got)))
    # and mid-rollout, before advantages: adding goes on identically
    part = MultiAgentRolloutBuffer(sc["T"], sc["agents"], num_envs=sc["E"], gamma=GAMMA,
                                   gae_lambda=LAM, seed=5)
    fill(part, sc, steps=3)
    again = MultiAgentRolloutBuffer(sc["T"], sc["agents"], num_envs=sc["E"], gamma=GAMMA,
                                    gae_lambda=LAM, seed=1)
    again.load_state_dict(part.state_dict())
    assert again.pos == 3 and again.centralised_value is central


@pytest.mark.parametrize("central", [False, True])
def test_save_load_and_config_through_the_package(tmp_path: Any, central: bool) -> None:
    """rb.save / rb.load (safetensors) restore the same type and identical minibatches, and
    the config rebuilds an equivalent empty buffer."""
    import replaybank as rb

    sc = scenario(7, 3, 2, 6, central)
    buf = built(sc, seed=3)
    rb.save(buf, tmp_path)
    back = rb.load(tmp_path)
    assert type(back) is MultiAgentRolloutBuffer and back.pos == buf.pos
    want = [b.core.to_dict(nested=False) for b in buf.get(4)]
    got = [b.core.to_dict(nested=False) for b in back.get(4)]
    assert arrays_equal(dict(enumerate(want)), dict(enumerate(got)))
    empty = rb.from_config(buf.config())
    assert type(empty) is MultiAgentRolloutBuffer and empty.pos == 0
    assert empty.config() == buf.config()


def test_bad_load_state_dict_changes_nothing() -> None:
    sc = scenario(2, 2, 2, 5, False)
    buf = built(sc)
    before = buf.state_dict()
    other = MultiAgentRolloutBuffer(5, ["x", "y"], num_envs=2)
    with pytest.raises(CheckpointError, match="agents"):
        buf.load_state_dict(other.state_dict())
    damaged = buf.state_dict()
    damaged["arrays"]["fields/reward/agent_0"] = np.zeros(3)
    with pytest.raises(CheckpointError, match="reward/agent_0"):
        buf.load_state_dict(damaged)
    damaged = buf.state_dict()
    damaged["metadata"]["pos"] = 99
    with pytest.raises(CheckpointError, match="pos=99"):
        buf.load_state_dict(damaged)
    damaged = buf.state_dict()
    damaged["rng"] = {"bit_generator": "nonsense"}
    with pytest.raises(CheckpointError):
        buf.load_state_dict(damaged)
    assert arrays_equal(buf.state_dict(), before)


# ---------------------------------------------------------------- rejected calls
def base_step(**over: Any) -> dict[str, Any]:
    step: dict[str, Any] = dict(
        obs={"a": np.zeros(3, np.float32), "b": np.zeros(2, np.float32)},
        action={"a": 1, "b": 0}, reward={"a": 1.0, "b": 0.5},
        terminated={"a": False, "b": False}, truncated={"a": False, "b": False},
        value={"a": 0.1, "b": 0.2}, log_prob={"a": -1.0, "b": -0.5})
    step.update(over)
    return step


BAD_ADDS = [
    (dict(reward={"a": 1.0}), ArgumentError, r"reward=.*missing \['b'\]"),
    (dict(obs={"a": np.zeros(3), "z": np.zeros(2)}), ArgumentError, r"unknown agent.*'z'"),
    (dict(obs=np.zeros(3)), ArgumentError, r"obs=.*expected a dict"),
    (dict(value=np.float32(1.0)), SpecError, r"value=.*one value per agent"),
    (dict(obs={"a": np.zeros(4, np.float32), "b": np.zeros(2, np.float32)}), ShapeError,
     r"obs\['a'\]|obs/a"),
    (dict(truncated={"a": True, "b": False}), ShapeError,
     r"final_value.*'a'.*truncated.*final_value=\{'a'"),
    (dict(action={"a": 1.5, "b": 0}), ReplayBankError, r"action"),
    # a ragged value named neither the argument nor the agent
    (dict(log_prob={"a": -1.0, "b": [[0.0], 1.0]}), ShapeError,
     r"^log_prob\['b'\]=\[\[0\.0\], 1\.0\]: a ragged nest, rows of different lengths "
     r"\(\[1\] has shape \(\) but \[0\] has shape \(1,\)\)"),
    (dict(obs={"a": [np.zeros(2), np.zeros(1)], "b": np.zeros(2, np.float32)}), ShapeError,
     r"^obs\['a'\]=\[array\(\[0\., 0\.\]\), array\(\[0\.\]\)\]: a ragged nest"),
    (dict(hidden={"a": np.zeros(2), "b": np.zeros(2)}), SpecError, r"extras \['hidden'\]"),
    (dict(state=np.zeros(2)), SpecError, r"state=.*no global state"),
    (dict(active={"a": [False], "b": [False]}), ArgumentError, "no agent acted"),
    (dict(obs={}, action={}, reward={}, terminated={}, truncated={}, value={}, log_prob={}),
     ArgumentError, "no agent acted"),
    (dict(active={"a": [True], "z": [True]}), ArgumentError, r"active=.*'z'"),
    # GAE reads the value of every step an agent acted (a NaN made its advantages NaN)
    (dict(value={"a": np.nan, "b": 0.2}), DtypeError,
     r"^add\(value=.*values \[nan\] of agent 'a' in envs \[0\] are NaN or infinite"),
    (dict(value={"a": 0.1, "b": np.inf}), DtypeError, r"agent 'b'"),
    # an infinite final_value was reported as missing ("no final value (None or NaN)")
    (dict(truncated={"a": True, "b": False}, final_value={"a": np.inf}), DtypeError,
     r"^add\(final_value=.*agent 'a' was truncated in envs \[0\], where its final values "
     r"\[inf\] are infinite"),
]


@pytest.mark.parametrize("over,err,match", BAD_ADDS)
def test_bad_adds_name_the_argument_and_leave_the_buffer_unchanged(
        over: dict[str, Any], err: type[Exception], match: str) -> None:
    buf = MultiAgentRolloutBuffer(4, ["a", "b"], seed=0)
    buf.add(**base_step())
    before = buf.state_dict()
    with pytest.raises(err, match=match):
        buf.add(**base_step(**over))
    assert arrays_equal(buf.state_dict(), before)
    buf.add(**base_step())  # still usable
    assert buf.pos == 2


def test_values_not_read_may_be_nan_and_a_centralised_nan_is_refused() -> None:
    """An agent's value where it did not act is not stored; a centralised value is refused
    in an env where some agent acted."""
    buf = MultiAgentRolloutBuffer(4, ["a", "b"], num_envs=2, seed=0)
    two = {"a": np.zeros(2), "b": np.zeros(2)}
    step = dict(obs={"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 2), np.float32)},
                action=two, reward=two, terminated={"a": [False, False], "b": [False, False]},
                truncated={"a": [False, False], "b": [False, False]}, log_prob=two)
    buf.add(**step, value={"a": np.array([0.0, np.nan]), "b": np.zeros(2)},
            active={"a": np.array([True, False]), "b": np.array([True, True])})
    assert buf.pos == 1 and buf.data["value/a"][0].tolist() == [0.0, 0.0]
    central = MultiAgentRolloutBuffer(4, ["a", "b"], num_envs=2, seed=0)
    central.add(**step, value=np.zeros(2))
    before = central.state_dict()
    with pytest.raises(DtypeError, match=r"centralised values \[nan\] of envs \[1\]"):
        central.add(**step, value=np.array([0.0, np.nan]))
    assert arrays_equal(central.state_dict(), before)


def test_bad_first_add_leaves_a_fresh_buffer_fresh() -> None:
    buf = MultiAgentRolloutBuffer(2, ["a", "b"])
    with pytest.raises(SpecError, match=r"MultiAgentRolloutBuffer\(.*spec="):
        buf.add(**base_step(**{k: {"a": v["a"]} for k, v in base_step().items()}))
    assert buf.layout is None and buf.spec is None and len(buf) == 0
    with pytest.raises(SpecError, match="one number per env"):
        buf.add(**base_step(value={"a": np.zeros(2), "b": np.zeros(2)}))
    assert buf.layout is None


def test_other_rejected_calls() -> None:
    with pytest.raises(ArgumentError, match="MultiAgentRolloutBuffer"):
        MultiAgentRolloutBuffer(4, ["a", "a"])
    with pytest.raises(ConfigError, match="n_steps"):
        MultiAgentRolloutBuffer(0, ["a"])
    with pytest.raises(ConfigError, match="gamma"):
        MultiAgentRolloutBuffer(4, ["a"], gamma=1.5)
    buf = MultiAgentRolloutBuffer(1, ["a", "b"])
    with pytest.raises(EmptyBufferError, match="empty"):
        buf.compute_returns_and_advantage(last_values={"a": 0.0, "b": 0.0})
    with pytest.raises(ArgumentError, match="positional"):
        buf.add(1)
    buf.add(**base_step())
    with pytest.raises(CapacityError, match="full"):
        buf.add(**base_step())
    with pytest.raises(EmptyBufferError, match="compute_returns_and_advantage"):
        buf.get()
    before = buf.state_dict()
    with pytest.raises(ShapeError, match=r"agent 'b'.*last_values\['b'\]\[0\]"):
        buf.compute_returns_and_advantage(last_values={"a": 0.0})
    with pytest.raises(ShapeError, match=r"dones says agent 'a'"):
        buf.compute_returns_and_advantage(last_values={"a": 0.0, "b": 0.0},
                                          dones={"a": True})
    assert arrays_equal(buf.state_dict(), before)
    buf.compute_returns_and_advantage(last_values={"a": 0.0, "b": 0.0})
    with pytest.raises(ConfigError, match="agents="):
        buf.get(agents="both")  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="batch_size"):
        buf.get(batch_size=0)
    buf.reset()
    assert len(buf) == 0 and not buf.full
    buf.add(**base_step())
    assert buf.full and len(buf) == 1


# ---------------------------------------------------------------- a real PettingZoo env
def _two_env_buffer(central: bool = False) -> MultiAgentRolloutBuffer:
    """Two envs, one step: agent 'a' ended its episode in env 0 only, 'b' in neither (so
    'a' needs a last value in env 1, 'b' in envs 0 and 1)."""
    buf = MultiAgentRolloutBuffer(2, ["a", "b"], num_envs=2, seed=0)
    step = base_step(obs={"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 2), np.float32)},
                     action={"a": [1, 1], "b": [0, 0]}, reward={"a": [1.0, 1.0], "b": [0.5, 0.5]},
                     terminated={"a": [True, False], "b": [False, False]},
                     truncated={"a": [False, False], "b": [False, False]},
                     log_prob={"a": [-1.0, -1.0], "b": [-0.5, -0.5]})
    step["value"] = [0.3, 0.3] if central else {"a": [0.1, 0.1], "b": [0.2, 0.2]}
    buf.add(**step)
    return buf


@pytest.mark.parametrize(("central", "last", "exc", "words"), [
    # a needed entry given as NaN or inf: a value problem, DtypeError as RolloutBuffer's
    (False, {"a": [0.0, np.nan], "b": [0.0, 0.0]}, DtypeError,
     ["agent 'a'", "env(s) [1]", "last_values['a'][1]", "which is nan", "not finite",
      "NaN marks a value not given", "pass {'a':"]),
    (False, {"a": [np.nan, 1.0], "b": [np.inf, np.nan]}, DtypeError,
     ["agent 'b'", "env(s) [0, 1]", "last_values['b'][0]", "which is inf", "[inf, nan]"]),
    (True, [np.nan, 0.0], DtypeError,
     ["agent 'b'", "last_values[0] (one array for every agent)", "which is nan",
      "centralised critic"]),
    # a needed agent left out (NaN inside, "not given"): a missing input, ShapeError
    (False, {"a": [np.nan, 2.0]}, ShapeError,
     ["agent 'b'", "last_values['b'][0]", "missing", "no entry for 'b'", "given: ['a']",
      "pass {'b':"]),
    (False, None, ShapeError, ["agent 'a'", "env(s) [1]", "missing", "last_values=None"]),
])
def test_a_needed_last_value_that_is_nan_or_left_out_names_it(
        central: bool, last: Any, exc: type[Exception], words: list[str]) -> None:
    """A needed ``last_values`` entry given as NaN (or inf) is a DtypeError, as the
    single-agent RolloutBuffer's non-finite ``last_values`` and a non-finite ``value_fn``
    value are (it was a ShapeError about a "missing or not finite" value); an agent left
    out stays a ShapeError, now saying so. Both name the agent, the entry, the value and
    the fix, and change nothing; an entry no agent needs may stay NaN."""
    buf = _two_env_buffer(central)
    before = buf.state_dict()
    with pytest.raises(exc) as info:
        buf.compute_returns_and_advantage(last_values=last)
    assert type(info.value) is exc
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert arrays_equal(buf.state_dict(), before)
    ok = [1.0, 1.0] if central else {"a": [np.nan, 2.0], "b": [3.0, 4.0]}  # a's env 0: unneeded
    buf.compute_returns_and_advantage(last_values=ok)
    assert np.isfinite(buf.advantages["a"]).all() and np.isfinite(buf.advantages["b"]).all()


def test_mpe2_simple_spread_rollout_with_random_actions() -> None:
    mpe2 = pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(max_cycles=25)
    obs, _ = env.reset(seed=0)
    agents = list(env.possible_agents)
    rng = np.random.default_rng(0)
    buf = MultiAgentRolloutBuffer(60, agents, seed=0, gamma=0.99, gae_lambda=0.95)
    assert mpe2 is not None
    rewards: dict[str, list[float]] = {a: [] for a in agents}
    episodes = 0
    for _ in range(60):
        acting = list(env.agents)
        state = env.state()
        actions = {a: int(rng.integers(5)) for a in acting}
        value = {a: float(-np.linalg.norm(obs[a][2:4])) for a in acting}  # a crude V
        nxt, rew, term, trunc, _ = env.step(actions)
        final = {a: float(-np.linalg.norm(nxt[a][2:4])) for a in acting if trunc[a]}
        buf.add(obs={a: obs[a] for a in acting}, action=actions, reward=rew,
                terminated=term, truncated=trunc, value=value,
                log_prob={a: float(np.log(1 / 5)) for a in acting}, state=state,
                final_value=final or None)
        for a in acting:
            rewards[a].append(float(rew[a]))
        obs = nxt
        if not env.agents:
            episodes += 1
            obs, _ = env.reset(seed=episodes)
    assert buf.full and episodes == 2
    last = {a: float(-np.linalg.norm(obs[a][2:4])) for a in env.agents}
    buf.compute_returns_and_advantage(last_values=last)
    for a in agents:
        assert np.isfinite(buf.advantages[a]).all()
        assert buf.data[f"truncated/{a}"].sum() == 2  # max_cycles=25, twice in 60 steps
    batches = list(buf.get(batch_size=16, agents="flatten"))
    assert sum(b.batch_size for b in batches) == 60 * 3
    assert batches[0].obs.shape[1:] == (18,) and batches[0].state.shape[1:] == (54,)
    env.close()


def test_stacked_fields_for_a_shared_network() -> None:
    """``stacked`` gives ``[B, n_agents, *shape]`` of agents that share a space (the
    per-agent values in agent order), and names the agents when their spaces differ."""
    buf = MultiAgentRolloutBuffer(4, ["a", "b"], num_envs=2, gamma=GAMMA, gae_lambda=LAM,
                                  seed=0)
    rng = np.random.default_rng(0)
    for t in range(4):
        per = lambda shape, dt=np.float32: {k: rng.standard_normal(shape).astype(dt)  # noqa: E731
                                            for k in ("a", "b")}
        buf.add(obs=per((2, 3)), action={k: np.zeros(2, np.int64) for k in ("a", "b")},
                reward=per(2), value=per(2), log_prob=per(2),
                terminated={k: np.full(2, t == 3) for k in ("a", "b")},
                truncated={k: np.zeros(2, bool) for k in ("a", "b")},
                hidden={"a": np.zeros((2, 4), np.float32), "b": np.zeros((2, 5), np.float32)})
    buf.compute_returns_and_advantage(last_values={k: np.zeros(2, np.float32)
                                                   for k in ("a", "b")})
    mb = next(iter(buf.get(8)))
    obs = mb.stacked("obs")
    assert obs.shape == (8, 2, 3)
    assert np.array_equal(obs[:, 1], mb.obs["b"]) and np.array_equal(obs[:, 0], mb.obs["a"])
    assert np.array_equal(mb.stacked("advantages", agents=["b"])[:, 0], mb.advantages["b"])
    assert mb.stacked("value").shape == (8, 2)
    with pytest.raises(ShapeError, match="hidden"):
        mb.stacked("hidden")
    with pytest.raises(KeyError, match="not a per-agent field"):
        mb.stacked("state")


@pytest.mark.parametrize("over,err,match", [
    (dict(log_prob={"a": -1.0, "b": [[0.0], 1.0]}), ShapeError,
     r"^log_prob\['b'\]=\[\[0\.0\], 1\.0\]: a ragged nest"),
    (dict(obs={"a": [np.zeros(2), np.zeros(1)], "b": np.zeros(2, np.float32)}), ShapeError,
     r"^obs\['a'\]=\[array\(\[0\., 0\.\]\), array\(\[0\.\]\)\]: a ragged nest"),
    (dict(reward={"a": 1.0, "b": "high"}), DtypeError, r"^reward\['b'\]='high': string"),
])
def test_the_first_add_names_a_bad_value_as_later_adds_do(
        over: dict[str, Any], err: type[Exception], match: str) -> None:
    """The first add (which infers the fields) named these ``log_prob/b``, ``obs/a`` and
    ``reward/b`` (the fields); later adds name the argument, ``log_prob['b']=...``: so
    does the first now, and nothing is stored."""
    buf = MultiAgentRolloutBuffer(4, ["a", "b"], seed=0)
    with pytest.raises(err, match=match):
        buf.add(**base_step(**over))
    assert len(buf) == 0
    buf.add(**base_step())
    assert len(buf) == 1


def test_the_callers_spec_dict_changed_after_construction_changes_nothing() -> None:
    """The buffer kept the caller's ``spec`` dict: an entry added to it after
    construction (an action shape) was read by the first add, which then refused the
    values the buffer was built for. The buffer keeps its own copy."""
    spec: dict[str, Any] = {"obs": {"a": ((3,), "float32")}}
    buf = MultiAgentRolloutBuffer(4, agents=["a"], spec=spec, seed=0)
    config = buf.init_config()
    spec["obs"]["a"] = ((5,), "float32")
    spec["action"] = {"a": ((2,), "float32")}
    assert buf.init_config() == config
    buf.add(obs={"a": np.zeros(3, np.float32)}, action={"a": 0}, reward={"a": 1.0},
            terminated={"a": False}, truncated={"a": False}, value={"a": 0.0},
            log_prob={"a": 0.0})
    assert buf.spec is not None
    assert (buf.spec["obs/a"].shape, buf.spec["action/a"].shape) == ((3,), ())
