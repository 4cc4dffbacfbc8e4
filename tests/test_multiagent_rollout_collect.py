"""MultiAgentRolloutBuffer: truncation bootstrapped from kept final observations through
``value_fn`` (against a plain-loop oracle, hypothesis), its rejected calls and
checkpoints, and ``rb.collect`` / :class:`MultiAgentRolloutCollector` from PettingZoo
parallel envs (mpe2's ``simple_spread_v3`` and :class:`Leaver`, a hand-written env whose
agents leave mid-episode), every stored step checked against what the env returned."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.errors import (
    ArgumentError,
    CapacityError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    ShapeError,
    SpecError,
)
from replaybank.multiagent import MultiAgentRolloutBuffer

GAMMA, LAM = 0.9, 0.8
OBS = 2  # observation size of every agent in the scenarios
STATE = 3


# ---------------------------------------------------------------- the plain-loop oracle
def oracle(agents: list[str], act: dict[str, np.ndarray], term: dict[str, np.ndarray],
           trunc: dict[str, np.ndarray], rew: dict[str, np.ndarray],
           val: dict[str, np.ndarray], fv: dict[str, np.ndarray],
           last: dict[str, np.ndarray], gamma: float = GAMMA,
           lam: float = LAM) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per agent and env (arrays ``[T, E]``): GAE over the agent's active steps, cut at
    its own ends, a truncated step bootstrapping from ``fv``, the last active step (when
    it did not end) from ``last`` ``[E]``."""
    adv = {a: np.zeros(act[a].shape) for a in agents}
    ret = {a: np.zeros(act[a].shape) for a in agents}
    n_t, n_e = act[agents[0]].shape
    for a in agents:
        for e in range(n_e):
            steps = [t for t in range(n_t) if act[a][t, e]]
            nxt = 0.0
            for k in reversed(range(len(steps))):
                t = steps[k]
                if term[a][t, e]:
                    nv = 0.0
                elif trunc[a][t, e]:
                    nv = fv[a][t, e]
                elif k + 1 < len(steps):
                    nv = val[a][steps[k + 1], e]
                else:
                    nv = last[a][e]
                delta = rew[a][t, e] + gamma * nv - val[a][t, e]
                cut = term[a][t, e] or trunc[a][t, e] or k + 1 == len(steps)
                nxt = delta if cut else delta + gamma * lam * nxt
                adv[a][t, e] = nxt
                ret[a][t, e] = nxt + val[a][t, e]
    return adv, ret


def agent_weight(a: str) -> float:
    return 1.0 + int(a.rsplit("_", 1)[1])


def v_agent(a: str, o: np.ndarray, s: np.ndarray | None) -> float:
    """The scenarios' per-agent critic: a function of the agent's obs and the state."""
    return float(agent_weight(a) * np.sum(o) + (0.0 if s is None else 0.5 * np.sum(s)))


def v_central(obs: dict[str, np.ndarray], s: np.ndarray | None) -> float:
    """The scenarios' centralised critic, of every agent's obs row and the state."""
    return float(sum(agent_weight(a) * np.sum(o) for a, o in obs.items())
                 + (0.0 if s is None else 0.5 * np.sum(s)))


def make_value_fn(agents: list[str], central: bool, calls: list[Any]) -> Any:
    def value_fn(obs: dict[str, np.ndarray], state: np.ndarray | None) -> Any:
        calls.append((obs, state))
        k = len(next(iter(obs.values())))
        if central:
            return np.array([v_central({a: o[r] for a, o in obs.items()},
                                       None if state is None else state[r])
                             for r in range(k)])
        return {a: np.array([v_agent(a, o[r], None if state is None else state[r])
                             for r in range(k)]) for a, o in obs.items()}
    return value_fn


# ---------------------------------------------------------------- random scenarios
def scenario(seed: int, n_agents: int, n_envs: int, n_steps: int, central: bool,
             with_state: bool) -> dict[str, Any]:
    """Agents acting in some envs, ending at different steps (terminated or truncated),
    back when the env's joint episode ends; each truncation gets its final value now
    (``final_value``) or later (``final_obs`` + ``value_fn``)."""
    rng = np.random.default_rng(seed)
    T, E = n_steps, n_envs  # noqa: N806 (the rollout's [T, E])
    agents = [f"agent_{i}" for i in range(n_agents)]
    z = {a: np.zeros((T, E), bool) for a in agents}
    act, term, trunc = ({a: z[a].copy() for a in agents} for _ in range(3))
    later = {a: z[a].copy() for a in agents}  # the truncation's value comes from value_fn
    for e in range(E):
        alive = set(agents)
        for t in range(T):
            for a in agents:
                if a in alive and rng.random() < 0.85:
                    act[a][t, e] = True
                    u = rng.random()
                    term[a][t, e] = u < 0.15
                    trunc[a][t, e] = 0.15 <= u < 0.35 or (u < 0.05 and rng.random() < .5)
                    if trunc[a][t, e] and not term[a][t, e]:
                        later[a][t, e] = rng.random() < 0.6
                    if term[a][t, e] or trunc[a][t, e]:
                        alive.discard(a)
            if not alive:
                alive = set(agents)
    if central:  # one final value per (step, env): every agent truncated there alike
        some = np.any([later[a] for a in agents], axis=0)
        later = {a: later[a] | (some & trunc[a] & ~term[a]) for a in agents}
    obs = {a: rng.normal(size=(T, E, OBS)) for a in agents}
    fobs = {a: rng.normal(size=(T, E, OBS)) for a in agents}
    state = rng.normal(size=(T, E, STATE)) if with_state else None
    fstate = rng.normal(size=(T, E, STATE)) if with_state else None
    return dict(agents=agents, T=T, E=E, central=central, act=act, term=term,
                trunc=trunc, later=later, obs=obs, fobs=fobs, state=state, fstate=fstate,
                rew={a: rng.normal(size=(T, E)) for a in agents},
                val={a: rng.normal(size=(T, E)) for a in agents}, cval=rng.normal(size=(T, E)),
                fv_now={a: rng.normal(size=(T, E)) for a in agents},
                cfv_now=rng.normal(size=(T, E)),
                last={a: rng.normal(size=E) for a in agents}, clast=rng.normal(size=E))


def new_buffer(sc: dict[str, Any], seed: int = 0) -> MultiAgentRolloutBuffer:
    spec: dict[str, Any] = {"obs": {a: ((OBS,), "float64") for a in sc["agents"]},
                            "action": {a: ((), "int64") for a in sc["agents"]},
                            "log_prob": {a: ((), "float64") for a in sc["agents"]},
                            "value": ((), "float64") if sc["central"]
                            else {a: ((), "float64") for a in sc["agents"]}}
    if sc["state"] is not None:
        spec["state"] = ((STATE,), "float64")
    return MultiAgentRolloutBuffer(sc["T"], sc["agents"], num_envs=sc["E"], gamma=GAMMA,
                                   gae_lambda=LAM, seed=seed, spec=spec,
                                   normalize_advantage=None)


def fill(buf: MultiAgentRolloutBuffer, sc: dict[str, Any]) -> None:
    agents, central = sc["agents"], sc["central"]
    for t in range(sc["T"]):
        acting = [a for a in agents if sc["act"][a][t].any()]
        now = {a: np.where(sc["later"][a][t], np.nan, sc["fv_now"][a][t]) for a in acting}
        fv: Any = now
        if central:  # one final value per env, for every agent truncated there
            fv = np.where(np.any([sc["later"][a][t] for a in acting], axis=0), np.nan,
                          sc["cfv_now"][t])
        later = [a for a in acting if sc["later"][a][t].any()]
        kw: dict[str, Any] = {}
        if later:
            kw["final_obs"] = {a: sc["fobs"][a][t] for a in later}
            if sc["state"] is not None:
                kw["final_state"] = sc["fstate"][t]
        buf.add(obs={a: sc["obs"][a][t] for a in acting},
                action={a: np.zeros(sc["E"], np.int64) for a in acting},
                reward={a: sc["rew"][a][t] for a in acting},
                terminated={a: sc["term"][a][t] for a in acting},
                truncated={a: sc["trunc"][a][t] for a in acting},
                value=sc["cval"][t] if central else {a: sc["val"][a][t] for a in acting},
                log_prob={a: np.zeros(sc["E"]) for a in acting},
                state=None if sc["state"] is None else sc["state"][t],
                active={a: sc["act"][a][t] for a in acting}, final_value=fv, **kw)


def expected(sc: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    agents, central, T, E = sc["agents"], sc["central"], sc["T"], sc["E"]  # noqa: N806
    fv = {a: np.full((T, E), np.nan) for a in agents}
    for t in range(T):
        for e in range(E):
            kept = {a: sc["fobs"][a][t, e] for a in agents if sc["later"][a][t, e]}
            s = None if sc["fstate"] is None else sc["fstate"][t, e]
            for a in agents:
                if sc["later"][a][t, e]:
                    fv[a][t, e] = v_central(kept, s) if central else v_agent(a, kept[a], s)
                elif sc["trunc"][a][t, e] and not sc["term"][a][t, e]:
                    fv[a][t, e] = sc["cfv_now"][t, e] if central else sc["fv_now"][a][t, e]
    val = {a: sc["cval"] if central else sc["val"][a] for a in agents}
    last = {a: sc["clast"] if central else sc["last"][a] for a in agents}
    return oracle(agents, sc["act"], sc["term"], sc["trunc"], sc["rew"], val, fv, last)


def acts_every_step(sc: dict[str, Any]) -> bool:
    return all(any(sc["act"][a][t].any() for a in sc["agents"]) for t in range(sc["T"]))


SCENARIOS = st.tuples(st.integers(0, 2**31), st.integers(2, 3), st.integers(1, 3),
                      st.integers(1, 9), st.booleans(), st.booleans())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SCENARIOS)
def test_value_fn_bootstrap_matches_the_plain_loop_oracle(args: tuple[Any, ...]) -> None:
    sc = scenario(*args)
    if not acts_every_step(sc):
        return
    buf = new_buffer(sc)
    fill(buf, sc)
    calls: list[Any] = []
    last: Any = sc["clast"] if sc["central"] else sc["last"]
    buf.compute_returns_and_advantage(last_values=last,
                                      value_fn=make_value_fn(sc["agents"], sc["central"], calls))
    adv, ret = expected(sc)
    for a in sc["agents"]:
        np.testing.assert_allclose(buf.advantages[a], adv[a], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(buf.returns[a], ret[a], rtol=1e-9, atol=1e-9)
    # value_fn: called once, batched over the (step, env)s that kept a final observation
    any_later = np.any([sc["later"][a] for a in sc["agents"]], axis=0)  # [T, E]
    assert len(calls) == (1 if any_later.any() else 0)
    if calls:
        obs, state = calls[0]
        k = int(any_later.sum())
        assert sorted(obs) == [a for a in sc["agents"] if sc["later"][a].any()]
        steps = np.argwhere(any_later)  # (t, e) in step-key order
        for a, o in obs.items():
            assert o.shape == (k, OBS)
            for r, (t, e) in enumerate(steps):
                want = sc["fobs"][a][t, e] if sc["later"][a][t, e] else np.zeros(OBS)
                np.testing.assert_array_equal(o[r], want)
        if sc["state"] is None:
            assert state is None
        else:
            np.testing.assert_array_equal(state, sc["fstate"][any_later])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SCENARIOS)
def test_kept_final_observations_survive_state_dict_and_reset(args: tuple[Any, ...]) -> None:
    sc = scenario(*args)
    if not acts_every_step(sc):
        return
    buf = new_buffer(sc)
    fill(buf, sc)
    state = buf.state_dict()
    other = new_buffer(sc)
    other.load_state_dict(state)
    last: Any = sc["clast"] if sc["central"] else sc["last"]
    for b in (buf, other):
        b.compute_returns_and_advantage(last, value_fn=make_value_fn(sc["agents"],
                                                                     sc["central"], []))
    for a in sc["agents"]:
        np.testing.assert_array_equal(buf.advantages[a], other.advantages[a])
    buf.reset()
    fill(buf, sc)  # a new rollout keeps only its own final observations
    calls: list[Any] = []
    buf.compute_returns_and_advantage(last, value_fn=make_value_fn(sc["agents"],
                                                                   sc["central"], calls))
    n_later = int(np.any([sc["later"][a] for a in sc["agents"]], axis=0).sum())
    assert sum(len(next(iter(c[0].values()))) for c in calls) == n_later


def test_save_and_load_keep_the_final_observations(tmp_path: Any) -> None:
    buf = two_agent_buffer(with_state=True)
    truncated_step(buf, final_obs={"a": [3.0, 4.0]}, final_state=[1.0, 1.0, 1.0])
    buf.save(tmp_path)
    loaded = rb.load(tmp_path)
    assert isinstance(loaded, MultiAgentRolloutBuffer)
    for b in (buf, loaded):
        b.compute_returns_and_advantage(last_values={"b": 0.0},
                                        value_fn=lambda o, s: {"a": o["a"].sum(1) + s.sum(1)})
    assert loaded.advantages["a"].tolist() == buf.advantages["a"].tolist() == [[11.0]]


# ---------------------------------------------------------------- rejected calls
def two_agent_buffer(with_state: bool = False, central: bool = False) -> MultiAgentRolloutBuffer:
    spec: dict[str, Any] = {"obs": {"a": ((2,), "float64"), "b": ((2,), "float64")},
                            "action": {"a": ((), "int64"), "b": ((), "int64")},
                            "log_prob": {"a": ((), "float64"), "b": ((), "float64")},
                            "value": ((), "float64") if central
                            else {"a": ((), "float64"), "b": ((), "float64")}}
    if with_state:
        spec["state"] = ((3,), "float64")
    return MultiAgentRolloutBuffer(1, ["a", "b"], gamma=1.0, gae_lambda=1.0, spec=spec,
                                   normalize_advantage=None)


def truncated_step(buf: MultiAgentRolloutBuffer, central: bool = False, **kw: Any) -> None:
    """One step: "a" truncated (reward 1, value 0), "b" goes on."""
    with_state = buf.layout is not None and buf.layout.state is not None
    buf.add(obs={"a": [0.0, 0.0], "b": [0.0, 0.0]}, action={"a": 0, "b": 0},
            reward={"a": 1.0, "b": 1.0}, terminated={"a": False, "b": False},
            truncated={"a": True, "b": False},
            value=0.0 if central else {"a": 0.0, "b": 0.0}, log_prob={"a": 0.0, "b": 0.0},
            **({"state": [0.0, 0.0, 0.0]} if with_state else {}), **kw)


def snapshot(buf: MultiAgentRolloutBuffer) -> Any:
    s = buf.state_dict()
    return s["metadata"], {k: repr(np.array(v).tolist()) for k, v in s["arrays"].items()}


@pytest.mark.parametrize(("kw", "with_state", "exc", "words"), [
    ({}, False, ShapeError, ["'a' was truncated", "final_obs=None", "value_fn"]),
    ({"final_obs": [1.0, 2.0]}, False, ArgumentError, ["final_obs=", "expected a dict"]),
    ({"final_obs": {"zed": [1.0, 2.0]}}, False, ArgumentError, ["unknown agent", "'zed'"]),
    ({"final_obs": {"b": [1.0, 2.0]}}, False, ShapeError,
     ["'a' was truncated", "no observation for it"]),
    ({"final_obs": {"a": [1.0, 2.0, 3.0]}}, False, ShapeError, ["final_obs['a']"]),
    ({"final_obs": {"a": ["x", "y"]}}, False, DtypeError, ["final_obs['a']"]),
    ({"final_obs": {"a": [1.0, 2.0]}}, True, SpecError, ["final_state=None", "env.state()"]),
    ({"final_obs": {"a": [1.0, 2.0]}, "final_state": [1.0]}, True, ShapeError,
     ["final_state"]),
    ({"final_obs": {"a": [1.0, 2.0]}, "final_state": [1.0, 2.0, 3.0]}, False, SpecError,
     ["final_state=", "stores no global state"]),
])
def test_a_rejected_add_names_the_argument_and_changes_nothing(
        kw: dict[str, Any], with_state: bool, exc: type[Exception], words: list[str]) -> None:
    buf = two_agent_buffer(with_state=with_state)
    before = snapshot(buf)
    with pytest.raises(exc) as info:
        truncated_step(buf, **kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert buf.pos == 0 and snapshot(buf) == before


@pytest.mark.parametrize(("central", "value_fn", "exc", "words"), [
    (False, None, ShapeError, ["value_fn=None", "final_obs", "value_fn(obs, state)"]),
    (False, "not callable", ArgumentError, ["value_fn='not callable'", "callable"]),
    (False, lambda o, s: np.zeros(1), ShapeError, ["one value per agent", "{agent: [1]}"]),
    (False, lambda o, s: {"b": np.zeros(1)}, ShapeError, ["no value for agent(s) ['a']"]),
    (False, lambda o, s: {"a": np.zeros(2)}, ShapeError, ["expected shape (1,)"]),
    (False, lambda o, s: {"a": np.zeros((1, 1))}, ShapeError, ["squeeze"]),
    (False, lambda o, s: {"a": np.array([np.nan])}, DtypeError, ["'a'", "nan", "finite"]),
    (False, lambda o, s: {"a": np.array([np.inf])}, DtypeError, ["'a'", "inf", "finite"]),
    (False, lambda o, s: {"a": ["x"]}, DtypeError, ["value_fn returned"]),
    (True, lambda o, s: {"a": np.zeros(1)}, ShapeError, ["a dict", "centralised", "[1]"]),
])
def test_a_rejected_value_fn_names_it_and_changes_nothing(
        central: bool, value_fn: Any, exc: type[Exception], words: list[str]) -> None:
    buf = two_agent_buffer(central=central)
    truncated_step(buf, central=central, final_obs={"a": [1.0, 2.0]})
    before = snapshot(buf)
    with pytest.raises(exc) as info:
        buf.compute_returns_and_advantage(last_values=0.0 if central else {"b": 0.0},
                                          value_fn=value_fn)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert snapshot(buf) == before
    with pytest.raises(EmptyBufferError):
        buf.advantages  # noqa: B018 (not computed)


def test_final_value_wins_over_final_obs_and_value_fn_sees_only_the_rest() -> None:
    buf = MultiAgentRolloutBuffer(1, ["a", "b"], num_envs=2, gamma=1.0, gae_lambda=1.0,
                                  normalize_advantage=None)
    calls: list[Any] = []

    def value_fn(obs: Any, state: Any) -> Any:
        calls.append(obs)
        return {a: o.sum(axis=1) for a, o in obs.items()}

    buf.add(obs={"a": np.zeros((2, 1)), "b": np.zeros((2, 1))},
            action={"a": [0, 0], "b": [0, 0]}, reward={"a": [1.0, 1.0], "b": [1.0, 1.0]},
            terminated={"a": [False, False], "b": [False, True]},
            truncated={"a": [True, True], "b": [False, True]},  # b terminated wins in env 1
            value={"a": [0.0, 0.0], "b": [0.0, 0.0]}, log_prob={"a": [0.0, 0.0],
                                                                "b": [0.0, 0.0]},
            final_value={"a": [5.0, np.nan]},
            final_obs={"a": [[7.0], [9.0]], "b": [[100.0], [100.0]]})
    buf.compute_returns_and_advantage(last_values={"b": [2.0, np.nan]}, value_fn=value_fn)
    assert buf.advantages["a"][0].tolist() == [6.0, 10.0]  # final_value 5; V(final obs) 9
    assert buf.advantages["b"][0].tolist() == [3.0, 1.0]   # last value 2; terminated
    assert len(calls) == 1 and list(calls[0]) == ["a"] and calls[0]["a"].shape == (1, 1)
    np.testing.assert_array_equal(calls[0]["a"], [[9.0]])



class CountedArray:
    """An array-like that counts its conversions to a numpy array (what a check reads)."""

    def __init__(self, value: Any) -> None:
        self.value, self.reads = np.asarray(value), 0

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        self.reads += 1
        return self.value if dtype is None else self.value.astype(dtype)


def test_check_step_checks_the_policy_outputs_and_leaves_observations_to_check_obs() -> None:
    """check_step runs add's own checks of what the policy adds (actions, values,
    log-probabilities), not of the observations and state the env gave (it used to cast
    every field of the step, as dear as an add): those are check_obs's and add's."""
    two = {k: np.zeros(2) for k in "ab"}
    step = dict(action={k: np.zeros(2, np.int64) for k in "ab"}, value=two, log_prob=two)
    outcome = dict(reward=two, terminated={k: np.zeros(2, bool) for k in "ab"},
                   truncated={k: np.zeros(2, bool) for k in "ab"})
    buf = MultiAgentRolloutBuffer(4, ["a", "b"], num_envs=2, seed=0)
    buf.add(obs={k: np.zeros((2, 3), np.float32) for k in "ab"},
            state=np.zeros((2, 4), np.float32), **outcome, **step)
    obs = {k: CountedArray(np.ones((2, 3), np.float32)) for k in "ab"}
    state = CountedArray(np.ones((2, 4), np.float32))
    buf.check_step(obs=obs, state=state, **step)
    assert [o.reads for o in obs.values()] == [0, 0] and state.reads == 0
    with pytest.raises(DtypeError, match=r"values \[nan\] of agent 'b' in envs \[1\]"):
        buf.check_step(obs=obs, state=state, action=step["action"], log_prob=two,
                       value={"a": np.zeros(2), "b": np.array([0.0, np.nan])})
    with pytest.raises(ShapeError, match="log_prob/a="):
        buf.check_step(obs=obs, state=state, action=step["action"], value=two,
                       log_prob={"a": np.zeros((2, 5)), "b": np.zeros(2)})
    with pytest.raises(SpecError, match="stores the global state"):
        buf.check_step(obs=obs, **step)
    buf.check_obs(obs, state)
    assert min(o.reads for o in obs.values()) >= 1 and state.reads >= 1
    with pytest.raises(ShapeError, match=r"obs\['b'\]"):
        buf.check_obs({"a": obs["a"], "b": np.zeros((2, 4), np.float32)}, state)
    with pytest.raises(ShapeError, match="state"):
        buf.check_obs(obs, np.zeros((2, 5), np.float32))
    assert buf.pos == 1
    buf.add(obs=obs, state=state, **outcome, **step)
    assert buf.data["obs/b"][1].tolist() == [[1.0] * 3] * 2


def test_check_step_before_the_first_add_checks_against_the_layout_it_will_fix() -> None:
    """Before the first add, check_step builds the layout that add would fix: a
    log-probability of any shape fixes the field's (nothing is stored), a NaN value is
    refused; once an add fixed a scalar log-probability, another shape is refused."""
    obs = {"a": np.zeros((2, 3), np.float32)}
    act, val = {"a": np.zeros(2, np.int64)}, {"a": np.zeros(2)}
    buf = MultiAgentRolloutBuffer(4, ["a"], num_envs=2, seed=0)
    buf.check_step(obs=obs, action=act, value=val, log_prob={"a": np.zeros((2, 5))})
    with pytest.raises(DtypeError, match="NaN or infinite"):
        buf.check_step(obs=obs, action=act, value={"a": np.array([np.nan, 0.0])},
                       log_prob={"a": np.zeros(2)})
    assert buf.layout is None and buf.pos == 0
    buf.add(obs=obs, action=act, value=val, log_prob={"a": np.zeros(2)},
            reward={"a": np.zeros(2)}, terminated={"a": np.zeros(2, bool)},
            truncated={"a": np.zeros(2, bool)})
    with pytest.raises(ShapeError, match="log_prob/a="):
        buf.check_step(obs=obs, action=act, value=val, log_prob={"a": np.zeros((2, 5))})


def test_pre_step_checks_name_the_call_made_not_add() -> None:
    """check_step and check_obs run add's checks, and used to give add's messages
    ("add(value=...)", "add: the rollout is full"), naming a call the user never made:
    each names the call made (a collector passes its own, "collect")."""
    two = {k: np.zeros(2) for k in "ab"}
    step = dict(action={k: np.zeros(2, np.int64) for k in "ab"}, log_prob=two)
    buf = MultiAgentRolloutBuffer(1, ["a", "b"], num_envs=2, seed=0)
    obs = {k: np.zeros((2, 3), np.float32) for k in "ab"}
    nan = {"a": np.zeros(2), "b": np.array([0.0, np.nan])}

    def expect(check: Any, error: type[Exception], name: str, rest: str) -> None:
        for call, made in (({}, name), ({"call": "collect"}, "collect")):
            with pytest.raises(error) as got:
                check(call)
            assert str(got.value).startswith(made + rest), str(got.value)
            assert "add(" not in str(got.value) and "add:" not in str(got.value)

    expect(lambda call: buf.check_step(obs=obs, value=nan, **step, **call), DtypeError,
           "check_step", "(value={'a': array([0., 0.]), 'b': array([ 0., nan])}): the "
           "values [nan] of agent 'b' in envs [1] are NaN or infinite")
    expect(lambda call: buf.check_step(obs=obs, value=two, action=7, log_prob=two, **call),
           ArgumentError, "check_step", "(action=7): expected a dict {agent: value}")
    buf.add(obs=obs, value=two, reward=two, terminated={k: np.zeros(2, bool) for k in "ab"},
            truncated={k: np.zeros(2, bool) for k in "ab"}, **step)
    expect(lambda call: buf.check_obs({"a": {"x": np.zeros(3)}}, **call), SpecError,
           "check_obs", "(obs['a']={'x': array([0., 0., 0.])}): agent 'a' "
           "observes one array")
    expect(lambda call: buf.check_step(obs=obs, value=two, **step, **call), CapacityError,
           "check_step", ": the rollout is full")
    assert buf.pos == 1


# ---------------------------------------------------------------- collection
pettingzoo = pytest.importorskip("pettingzoo")
mpe2 = pytest.importorskip("mpe2")

from mpe2 import simple_spread_v3  # noqa: E402

from replaybank.integrations.pettingzoo import (  # noqa: E402
    MultiAgentActorCritic,
    MultiAgentCollector,
    MultiAgentRolloutCollector,
)
from tests.pettingzoo_leavers import (  # noqa: E402
    Clock,
    DictActs,
    Fractions,
    LateJoiner,
    Leaver,
    OddFirstEpisode,
    Recorder,
    TupleActs,
    TupleNoSpace,
    TupleObs,
    Watched,
    dict_policy,
)


class Critic:
    """A deterministic actor-critic on numpy: action = argmax-free function of the obs,
    value per agent ``w_a * sum(obs) + 0.1 * sum(state)`` or centralised."""

    def __init__(self, agents: list[str], central: bool, n_actions: int = 3) -> None:
        self.agents, self.central, self.n_actions = agents, central, n_actions
        self.value_calls: list[tuple[dict[str, np.ndarray], Any]] = []

    def v(self, a: str, o: np.ndarray, s: Any) -> np.ndarray:
        extra = 0.0 if s is None else 0.1 * s.sum(axis=-1)
        return (1.0 + self.agents.index(a)) * o.sum(axis=-1) / 10 + extra

    def action(self, o: np.ndarray) -> np.ndarray:
        return (np.abs(o.sum(axis=-1) * 7).astype(np.int64)) % self.n_actions

    def log_prob(self, o: np.ndarray) -> np.ndarray:
        return -np.abs(o[..., 0]) - 0.5

    def central_v(self, obs: dict[str, np.ndarray], s: Any) -> np.ndarray:
        n = len(next(iter(obs.values())))
        out = np.zeros(n) if s is None else 0.1 * s.sum(axis=-1)
        for a, o in obs.items():
            out = out + (1.0 + self.agents.index(a)) * o.sum(axis=-1) / 10
        return out

    def __call__(self, obs: dict[str, np.ndarray], state: Any) -> Any:
        return ({a: self.action(o) for a, o in obs.items()}, self._values(obs, state),
                {a: self.log_prob(o) for a, o in obs.items()})

    def value(self, obs: dict[str, np.ndarray], state: Any) -> Any:
        self.value_calls.append((obs, state))
        return self._values(obs, state)

    def _values(self, obs: dict[str, np.ndarray], state: Any) -> Any:
        if self.central:
            return self.central_v(obs, state)
        return {a: self.v(a, o, state) for a, o in obs.items()}


def check_rollout(buf: MultiAgentRolloutBuffer, recs: list[Recorder], pol: Critic,
                  start: list[int], last_obs: list[dict[str, np.ndarray]],
                  last_state: list[np.ndarray] | None) -> None:
    """Every stored field against the envs' logs (steps ``start[i]:`` of env ``i``) and
    the advantages against the oracle, with the values a plain loop gets from ``pol``."""
    agents, T, E = list(buf.agents), buf.n_steps, buf.num_envs  # noqa: N806
    with_state = buf.layout is not None and buf.layout.state is not None
    d = buf.data
    act = {a: np.zeros((T, E), bool) for a in agents}
    term, trunc = ({a: np.zeros((T, E), bool) for a in agents} for _ in range(2))
    rew, val, fv = ({a: np.zeros((T, E)) for a in agents} for _ in range(3))
    last = {a: np.zeros(E) for a in agents}
    for e, rec in enumerate(recs):
        steps = rec.log[start[e]:start[e] + T]
        assert len(steps) == T
        for t, s in enumerate(steps):
            st_ = s["state"] if with_state else None
            if with_state:
                np.testing.assert_array_equal(d["state"][t, e], s["state"])
            c_kept = {a: s["next"][a][None] for a in s["action"]
                      if s["trunc"][a] and not s["term"][a]}
            c_obs = {a: s["obs"][a][None] for a in s["action"]}
            for a in agents:
                on = a in s["action"]
                assert bool(d[f"active/{a}"][t, e]) == on, (t, e, a)
                if not on:
                    assert not d[f"obs/{a}"][t, e].any() and d[f"reward/{a}"][t, e] == 0
                    continue
                act[a][t, e] = True
                np.testing.assert_array_equal(d[f"obs/{a}"][t, e], s["obs"][a])
                assert d[f"action/{a}"][t, e] == s["action"][a] == pol.action(s["obs"][a])
                assert d[f"reward/{a}"][t, e] == s["rew"][a]
                term[a][t, e], trunc[a][t, e] = s["term"][a], s["trunc"][a]
                assert d[f"terminated/{a}"][t, e] == s["term"][a]
                assert d[f"truncated/{a}"][t, e] == s["trunc"][a]
                assert d[f"log_prob/{a}"][t, e] == pytest.approx(pol.log_prob(s["obs"][a]))
                rew[a][t, e] = s["rew"][a]
                if pol.central:
                    val[a][t, e] = pol.central_v(c_obs, None if st_ is None else st_[None])[0]
                    assert d["value"][t, e] == pytest.approx(val[a][t, e])
                else:
                    val[a][t, e] = pol.v(a, s["obs"][a], st_)
                    assert d[f"value/{a}"][t, e] == pytest.approx(val[a][t, e])
                if a in c_kept:  # bootstraps from V(true final obs, state after the step)
                    sa = s["state_after"][None] if with_state else None
                    fv[a][t, e] = pol.central_v(c_kept, sa)[0] if pol.central \
                        else pol.v(a, s["next"][a], None if sa is None else sa[0])
        lo = {a: o[None] for a, o in last_obs[e].items()}
        ls = None if last_state is None else last_state[e][None]
        for a in agents:
            if a in last_obs[e]:
                last[a][e] = pol.central_v(lo, ls)[0] if pol.central \
                    else pol.v(a, last_obs[e][a], None if ls is None else ls[0])
    adv, ret = oracle(agents, act, term, trunc, rew, val, fv, last, buf.gamma, buf.gae_lambda)
    for a in agents:
        np.testing.assert_allclose(buf.advantages[a], adv[a], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(buf.returns[a], ret[a], rtol=1e-5, atol=1e-5)


def current(recs: list[Recorder]) -> list[dict[str, np.ndarray]]:
    return [dict(r.pending) for r in recs]


@pytest.mark.parametrize("central", [False, True])
@pytest.mark.parametrize("n_envs", [1, 3])
def test_collect_leaver_envs_matches_the_envs_and_the_oracle(central: bool,
                                                             n_envs: int) -> None:
    recs = [Recorder(Leaver(b_end=2 + i, c_end=4, a_end=5 + i)) for i in range(n_envs)]
    env: Any = recs if n_envs > 1 else recs[0]
    pol = Critic(["a", "b", "c"], central)
    buf = MultiAgentRolloutBuffer(12, ["a", "b", "c"], num_envs=n_envs, gamma=0.9,
                                  gae_lambda=0.8, seed=0)
    col = MultiAgentRolloutCollector(env, pol, buf, seed=10)
    res = col.collect()
    assert buf.full and res.steps == 12 * n_envs
    assert buf.centralised_value is central and buf.spec is not None and "state" in buf.spec
    # every env was reset on its own as its agents all ended: episode lengths 5 + i
    assert set(res.episode_lengths) <= {5 + i for i in range(n_envs)}
    assert sum(res.episode_lengths) == sum(12 // (5 + i) * (5 + i) for i in range(n_envs))
    assert res.agent_episode_lengths[0] == {"a": 5, "b": 2, "c": 4}
    # value(): once for the truncations' final observations, once for the last values
    assert len(pol.value_calls) == 2
    check_rollout(buf, recs, pol, [0] * n_envs, current(recs),
                  [r.env.state() for r in recs])
    # the next rollout continues the episodes
    buf.reset()
    col.collect(12)
    check_rollout(buf, recs, pol, [12] * n_envs, current(recs),
                  [r.env.state() for r in recs])


def test_collect_simple_spread_through_rb_collect() -> None:
    recs = [Recorder(simple_spread_v3.parallel_env(max_cycles=5)) for _ in range(2)]
    agents = list(recs[0].possible_agents)
    pol = Critic(agents, central=False, n_actions=5)
    buf = rb.MultiAgentRolloutBuffer(12, agents, num_envs=2, gamma=0.95, gae_lambda=0.9,
                                     seed=0)
    res = rb.collect(recs, pol, buf, 12, progress=False, seed=3)
    assert res.steps == 24 and res.episode_lengths == [5, 5, 5, 5]
    assert buf.full
    for a in agents:  # every agent acts every step; truncated every 5th step
        assert buf.active[a].all()
        assert buf.data[f"truncated/{a}"][:, 0].tolist() == [(t + 1) % 5 == 0
                                                             for t in range(12)]
    check_rollout(buf, recs, pol, [0, 0], current(recs), [r.env.state() for r in recs])
    # the first reset of env i used seed + i
    fresh = simple_spread_v3.parallel_env(max_cycles=5)
    np.testing.assert_array_equal(fresh.reset(seed=4)[0][agents[0]],
                                  buf.data[f"obs/{agents[0]}"][0, 1])


def test_collect_with_a_plain_function_policy_and_one_env() -> None:
    rec = Recorder(simple_spread_v3.parallel_env(max_cycles=4))
    agents = list(rec.possible_agents)
    critic = Critic(agents, central=True, n_actions=5)
    seen: list[Any] = []

    def policy(obs: dict[str, np.ndarray], state: Any) -> Any:
        seen.append((obs, state))
        return critic(obs, state)

    buf = rb.MultiAgentRolloutBuffer(6, agents, seed=0)
    rb.collect(rec, policy, buf, 6, progress=False, seed=0)
    # batched also for one env: [1, *shape]; the last values came from calling the policy
    assert all(o.shape == (1, 18) for o in seen[0][0].values()) and seen[0][1].shape == (1, 54)
    assert len(seen) == 6 + 2  # 6 steps, the truncation at step 4, the last values
    check_rollout(buf, [rec], critic, [0], current([rec]), [rec.env.state()])


def test_policy_none_collects_random_actions_with_zero_values() -> None:
    envs = [simple_spread_v3.parallel_env(max_cycles=5) for _ in range(2)]
    agents = list(envs[0].possible_agents)
    buf = rb.MultiAgentRolloutBuffer(7, agents, num_envs=2, gamma=0.5, gae_lambda=1.0,
                                     seed=0, normalize_advantage=None)
    rb.collect(envs, None, buf, 7, progress=False, seed=1)
    again = rb.MultiAgentRolloutBuffer(7, agents, num_envs=2, gamma=0.5, gae_lambda=1.0,
                                       seed=0, normalize_advantage=None)
    rb.collect([simple_spread_v3.parallel_env(max_cycles=5) for _ in range(2)], None,
               again, 7, progress=False, seed=1)
    for a in agents:
        assert not buf.data[f"value/{a}"].any() and not buf.data[f"log_prob/{a}"].any()
        np.testing.assert_array_equal(buf.data[f"action/{a}"], again.data[f"action/{a}"])
        r = buf.data[f"reward/{a}"]
        want = np.zeros((7, 2))  # discounted rewards to go, cut (bootstrap 0) at step 4
        for t in reversed(range(7)):
            cont = t not in (4, 6)
            want[t] = r[t] + (0.5 * want[t + 1] if cont else 0.0)
        np.testing.assert_allclose(buf.returns[a], want, rtol=1e-6)
    assert len({int(x) for x in buf.data[f"action/{agents[0]}"].reshape(-1)}) > 1


def test_collect_in_chunks_and_compute_by_hand() -> None:
    env = Leaver()
    pol = Critic(["a", "b", "c"], central=False)
    buf = MultiAgentRolloutBuffer(6, ["a", "b", "c"], seed=0)
    col = MultiAgentRolloutCollector(env, pol, buf, seed=0)
    col.collect(4)
    assert buf.pos == 4
    with pytest.raises(EmptyBufferError):
        buf.advantages  # noqa: B018 (the rollout is not full yet)
    col.collect(2, compute=False)
    with pytest.raises(EmptyBufferError):
        buf.advantages  # noqa: B018 (compute=False)
    obs, state = col.policy_inputs()
    assert sorted(obs) == sorted(col.active) and state is not None
    last = col.last_values()
    buf.compute_returns_and_advantage(last_values=last, value_fn=pol.value)
    want = {a: buf.advantages[a].copy() for a in buf.agents}
    col.compute_returns_and_advantage()
    for a in buf.agents:
        np.testing.assert_array_equal(buf.advantages[a], want[a])


def test_actor_critic_protocol() -> None:
    assert isinstance(Critic(["a"], False), MultiAgentActorCritic)
    assert not isinstance(lambda obs, state: None, MultiAgentActorCritic)


# ---------------------------------------------------------------- collection errors
def leaver_buffer(n_steps: int = 4, num_envs: int = 1) -> MultiAgentRolloutBuffer:
    return MultiAgentRolloutBuffer(n_steps, ["a", "b", "c"], num_envs=num_envs, seed=0)


def test_collect_refuses_bad_n_steps_and_full_rollouts() -> None:
    buf = leaver_buffer(4, num_envs=2)
    col = MultiAgentRolloutCollector([Leaver(), Leaver()], None, buf, seed=0)
    for bad in (0, -1, 2.5, True, 8):
        with pytest.raises(ConfigError, match=r"collect\(n_steps=.*steps per env"):
            col.collect(bad)  # type: ignore[arg-type]
    assert buf.pos == 0
    col.collect()
    with pytest.raises(ConfigError, match=r"is full.*buffer.reset\(\)"):
        col.collect()


def test_collect_refuses_a_mismatched_buffer() -> None:
    with pytest.raises(ConfigError, match="num_envs=2"):
        MultiAgentRolloutCollector(Leaver(), None, leaver_buffer(num_envs=2))
    with pytest.raises(ConfigError, match="MultiAgentRolloutBuffer"):
        MultiAgentRolloutCollector(Leaver(), None, rb.MultiAgentReplayBuffer(10, ["a", "b", "c"]))
    with pytest.raises(ConfigError, match="MultiAgentReplayBuffer"):
        MultiAgentCollector(Leaver(), None, leaver_buffer())
    with pytest.raises(ConfigError, match="not among the buffer's agents"):
        MultiAgentRolloutCollector(Leaver(), None, MultiAgentRolloutBuffer(4, ["a", "b"]))
    with pytest.raises(ConfigError, match="value_fn"):
        MultiAgentRolloutCollector(Leaver(), None, leaver_buffer(), value_fn=3)
    with pytest.raises(ConfigError, match="policy"):
        MultiAgentRolloutCollector(Leaver(), "policy", leaver_buffer())


@pytest.mark.parametrize(("policy", "words"), [
    (lambda o, s: {a: np.zeros(1, np.int64) for a in o}, ["returned", "(actions, values"]),
    (lambda o, s: ({}, {a: np.zeros(1) for a in o}, {a: np.zeros(1) for a in o}),
     ["actions has no entry", "'a'"]),
    (lambda o, s: ({a: np.zeros(1, np.int64) for a in o}, {a: np.zeros(1) for a in o},
                   np.zeros(1)), ["log_probs", "not a dict"]),
    (lambda o, s: ({a: np.zeros(1, np.int64) for a in o}, np.zeros(2),
                   {a: np.zeros(1) for a in o}), ["values", "shape (2,)", "always batched"]),
    (lambda o, s: ({a: np.int64(0) for a in o}, {a: np.zeros(1) for a in o},
                   {a: np.zeros(1) for a in o}), ["actions for a", "shape ()"]),
])
def test_collect_refuses_a_policy_that_breaks_the_protocol(policy: Any,
                                                           words: list[str]) -> None:
    buf = leaver_buffer()
    col = MultiAgentRolloutCollector(Leaver(), policy, buf, seed=0)
    with pytest.raises(ConfigError) as info:
        col.collect()
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert buf.pos == 0


# ---------------------------------------------------------------- odd values
def test_collect_stacks_values_in_their_common_dtype_not_the_first_envs() -> None:
    """An env of int64 observations beside one of float observations 0.25, 0.5 and the
    final 0.75: the policy's obs and state, the stored obs and the kept final obs were
    cast into the first env's dtype (all 0), so the bootstrap of env 1 was V(0) = 0."""
    seen: list[tuple[list[float], list[float]]] = []

    def policy(obs: dict[str, np.ndarray], state: np.ndarray) -> Any:
        seen.append((obs["a"][:, 0].tolist(), state[:, 0].tolist()))
        return ({"a": np.zeros(2, np.int64)}, {"a": obs["a"][:, 0].astype(np.float64)},
                {"a": np.zeros(2)})

    spec = {"obs": {"a": ((1,), "float32")}, "state": ((1,), "float32")}
    buf = MultiAgentRolloutBuffer(3, ["a"], num_envs=2, gamma=1.0, gae_lambda=1.0,
                                  normalize_advantage=None, spec=spec, seed=0)
    col = MultiAgentRolloutCollector([Fractions(np.int64), Fractions(np.float64)], policy,
                                     buf, seed=0,
                                     value_fn=lambda obs, state: {"a": 10 * obs["a"][:, 0]})
    col.collect()
    assert seen == [([0.0, 0.0], [0.0, 0.0]), ([0.0, 0.25], [0.0, 0.25]),
                    ([0.0, 0.5], [0.0, 0.5])]
    assert buf.data["obs/a"][:, :, 0].tolist() == [[0.0, 0.0], [0.0, 0.25], [0.0, 0.5]]
    assert buf.data["state"][:, :, 0].tolist() == [[0.0, 0.0], [0.0, 0.25], [0.0, 0.5]]
    # rewards 1 to the truncation at step 3, then V(final obs) = 10 * 0.75 in env 1
    assert buf.returns["a"].tolist() == [[3.0, 10.5], [2.0, 9.5], [1.0, 8.5]]


@pytest.mark.parametrize("num_envs", [1, 2])
def test_collect_tuple_observations_as_rb_collect_stores_a_tuple_space(num_envs: int) -> None:
    """A gymnasium Tuple observation (the env's observation_space says so) reaches the
    policy, the buffer and value_fn (the kept final obs) as {'0': ..., '1': ...}; it was
    stacked part-first, or a bare numpy ValueError."""
    seen: list[Any] = []

    def policy(obs: dict[str, Any], state: Any) -> Any:
        seen.append({k: v.shape for k, v in obs["a"].items()})
        return ({a: np.zeros(num_envs, np.int64) for a in obs},
                {a: o["0"][:, 0].astype(np.float64) for a, o in obs.items()},
                {a: np.zeros(num_envs) for a in obs})

    envs = [TupleObs() for _ in range(num_envs)]
    buf = MultiAgentRolloutBuffer(3, ["a", "b"], num_envs=num_envs, gamma=1.0,
                                  gae_lambda=1.0, normalize_advantage=None, seed=0)
    rb.collect(envs if num_envs > 1 else envs[0], policy, buf, 3, seed=0, progress=False)
    # 3 steps, then the values of the kept final obs and of the last obs (no value())
    assert seen == [{"0": (num_envs, 3), "1": (num_envs, 2)}] * 5
    for a in ("a", "b"):
        assert buf.data[f"obs/{a}/0"].tolist() == [[[t] * 3] * num_envs for t in range(3)]
        assert buf.data[f"obs/{a}/1"].tolist() == [[[10 + t] * 2] * num_envs
                                                   for t in range(3)]
        # truncated at step 3: rewards to go, then V(final obs) = its step, 3
        assert buf.returns[a].tolist() == [[6.0] * num_envs, [5.0] * num_envs,
                                           [4.0] * num_envs]


def test_collect_tuple_observations_without_a_tuple_space_are_refused_before_a_step() -> None:
    envs = [TupleNoSpace(), TupleNoSpace()]
    buf = MultiAgentRolloutBuffer(3, ["a", "b"], num_envs=2)
    with pytest.raises(ShapeError) as got:
        rb.collect(envs, None, buf, 3, seed=0, progress=False)
    assert str(got.value).startswith(
        "collect(env=...): env[0] gave the observation of agent 'a' as a tuple holding "
        "arrays (a gymnasium Tuple space's value), which numpy would stack part-first. The "
        "collector stores it as rb.collect stores a Tuple space, as the dict {'0': "
        "value[0], '1': value[1], ...} (the fields obs/a/0, obs/a/1, ...)")
    assert buf.pos == 0 and [e.t for e in envs] == [0, 0]


def test_collect_refuses_a_late_joiner_without_its_spec_before_the_first_step() -> None:
    """ "c" joins at step 2, so the first add holds "a" and "b": spec= must give "c"'s
    log_prob and value too. The message advised observation and action spaces, had an
    unbalanced brace, and came after the env had stepped; it names the call made,
    collect (it said add(log_prob=..., value=...), a call the user did not make)."""
    spec: dict[str, Any] = {"obs": {a: ((2,), "float32") for a in "abc"},
                            "action": {a: ((), "int64") for a in "abc"}}
    env = LateJoiner()
    buf = MultiAgentRolloutBuffer(8, ["a", "b", "c"], spec=spec, seed=0)
    with pytest.raises(SpecError) as got:
        rb.collect(env, None, buf, 8, seed=0, progress=False)
    assert str(got.value) == (
        "collect(log_prob=..., value=...): agent 'c' is not in the first add and spec= "
        "gives no 'log_prob' or 'value' for it, so those shapes and dtypes are unknown; add "
        "to spec: "
        "MultiAgentRolloutBuffer(..., spec={..., 'log_prob': {'c': ((), 'float32')}, "
        "'value': {'c': ((), 'float32')}}) (log_prob and value: one float per step), or "
        "include agent 'c' in the first add"
    )
    assert env.t == 0 and buf.pos == 0 and buf.layout is None
    with pytest.raises(SpecError, match=r"^check_first_add\(log_prob=\.\.\., value=\.\.\.\): "):
        buf.check_first_add(["a", "b"])  # called directly, it names itself
    # the example of the message, added to spec=, is what it takes
    spec.update({"log_prob": {"c": ((), "float32")}, "value": {"c": ((), "float32")}})
    ok = MultiAgentRolloutBuffer(8, ["a", "b", "c"], spec=spec, seed=0)
    rb.collect(LateJoiner(), None, ok, 8, seed=0, progress=False)
    assert ok.active["c"][:, 0].tolist() == [False, False, True, True] * 2
    # a centralised critic's value is joint: log_prob is all "c" needs then
    central = MultiAgentRolloutBuffer(8, ["a", "b", "c"], seed=0, spec={
        **spec, "value": ((), "float32")})
    central.check_first_add(["a", "b"], ("obs", "action", "log_prob"))


# ---------------------------------------------------------------------- episodes cut by a reset
def v100(obs: dict[str, Any], state: Any) -> Any:
    """Action 0, V = 100 everywhere, log-prob 0."""
    return ({k: np.zeros(len(o), np.int64) for k, o in obs.items()},
            {k: np.full(len(o), 100.0) for k, o in obs.items()},
            {k: np.zeros(len(o)) for k, o in obs.items()})


def clock_rollout() -> MultiAgentRolloutBuffer:
    return MultiAgentRolloutBuffer(4, agents=["a", "b"], gamma=1.0, gae_lambda=1.0, seed=0,
                                   normalize_advantage=None)


def test_rollout_filled_by_two_collect_calls_cuts_the_first_episode() -> None:
    """Two rb.collect calls of 2 steps (the second resets the env): episode 0's step
    t=1 bootstraps from V(its next obs) = 100 as a truncation, not from episode 1's
    rewards: returns of a are 1+2+100, 2+100 | 1+2+100, 2+100."""
    env = Clock()
    roll = clock_rollout()
    rb.collect(env, v100, roll, 2, seed=0, progress=False)
    rb.collect(env, v100, roll, 2, seed=1, progress=False)
    assert [(int(o[0, 2]), int(o[0, 0])) for o in roll.data["obs/a"]] == \
        [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert roll.returns["a"][:, 0].tolist() == [103.0, 102.0, 103.0, 102.0]
    assert roll.data["truncated/a"][:, 0].tolist() == [False, True, False, False]
    # b terminates at its 2nd step in each episode (rewards 1.5, 2.5): no bootstrap
    assert roll.returns["b"][:, 0].tolist() == [4.0, 2.5, 4.0, 2.5]


def test_rollout_collector_reset_cuts_the_running_episode() -> None:
    """A kept collector's reset() ends its running episodes in the rollout the same way."""
    roll = clock_rollout()
    col = MultiAgentRolloutCollector(Clock(), v100, roll, seed=0)
    col.collect(2)
    col.reset(seed=1)
    col.collect(2)
    assert roll.returns["a"][:, 0].tolist() == [103.0, 102.0, 103.0, 102.0]


def test_a_new_collector_refuses_an_episode_another_collector_left_running() -> None:
    """It cannot bootstrap that episode (it does not have the observation after its last
    step): a ConfigError naming the fixes, before the env is reset."""
    roll = clock_rollout()
    MultiAgentRolloutCollector(Clock(), v100, roll, seed=0).collect(2)
    env = Clock()
    with pytest.raises(ConfigError, match=r"running episode of env .*end_episodes"):
        MultiAgentRolloutCollector(env, v100, roll, seed=1).collect(2)
    assert env.ep == -1 and roll.pos == 2  # nothing happened
    with pytest.raises(ShapeError, match=r"end_episodes\(final_obs=None.*'a'"):
        roll.end_episodes(0)
    assert roll.running_agents(0) == ("a",)
    roll.end_episodes(0, final_value={"a": 100.0})
    assert roll.running_agents(0) == ()
    MultiAgentRolloutCollector(env, v100, roll, seed=1).collect(2)
    assert roll.returns["a"][:, 0].tolist() == [103.0, 102.0, 103.0, 102.0]


def test_rollout_action_the_buffer_refuses_is_caught_before_the_env_steps() -> None:
    """A float action into an int64 action field: refused before env.step; after the
    policy is fixed, the rollout goes on exactly."""
    env = Clock()
    roll = MultiAgentRolloutBuffer(2, agents=["a", "b"], gamma=1.0, gae_lambda=1.0,
                                   seed=0, normalize_advantage=None,
                                   spec={"obs": {k: ((3,), "float32") for k in "ab"},
                                         "action": {k: ((), "int64") for k in "ab"},
                                         "log_prob": {k: ((), "float64") for k in "ab"},
                                         "value": {k: ((), "float64") for k in "ab"}})
    bad = [False]

    def policy(obs: dict[str, Any], state: Any) -> Any:
        acts, vals, logp = v100(obs, state)
        return ({k: a + 1.7 for k, a in acts.items()} if bad[0] else acts), vals, logp

    col = MultiAgentRolloutCollector(env, policy, roll, seed=0)
    col.collect(1)
    bad[0] = True
    with pytest.raises(DtypeError, match=r"action\['a'\].*int64.*env\.step was not"):
        col.collect(1)
    assert (env.t, roll.pos) == (1, 1)
    bad[0] = False
    col.collect(1)
    assert roll.data["obs/a"][:, 0, 0].tolist() == [0.0, 1.0]
    assert roll.returns["a"][:, 0].tolist() == [103.0, 102.0]


class BadObsClock(Clock):
    """Once, at ``when`` = (episode, t after the step, or 0 for the reset), the
    observation of agent "a" is ``bad`` (the wrong shape, or a NaN)."""

    def __init__(self, when: tuple[int, int], bad: str = "shape", horizon: int = 10) -> None:
        super().__init__(horizon)
        self.when, self.bad, self.fired = when, bad, 0

    def _spoil(self, obs: dict[str, Any]) -> None:
        if (self.ep, self.t) == self.when and "a" in obs:
            obs["a"] = np.zeros(5, np.float32) if self.bad == "shape" \
                else np.array([np.nan, 0.0, 0.0])
            self.fired += 1

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        obs, infos = super().reset(seed, options)
        self._spoil(obs)
        return obs, infos

    def step(self, actions: dict[str, Any]) -> Any:
        obs, *rest = super().step(actions)
        self._spoil(obs)
        return (obs, *rest)


def int_clock_rollout(num_envs: int = 1) -> MultiAgentRolloutBuffer:
    """clock_rollout with integer observations: a NaN is a dtype the buffer refuses."""
    return MultiAgentRolloutBuffer(4, agents=["a", "b"], num_envs=num_envs, gamma=1.0,
                                   gae_lambda=1.0, seed=0, normalize_advantage=None,
                                   spec={"obs": {k: ((3,), "int64") for k in "ab"}})


@pytest.mark.parametrize("bad, error", [("shape", ShapeError), ("nan", DtypeError)])
def test_rollout_observation_the_buffer_refuses_loses_that_step_and_resets_the_env(
        bad: str, error: type[Exception]) -> None:
    """An observation the buffer refuses, returned by env.step: refused as it arrives,
    named as the env's; the step that returned it is lost (nothing of it is stored),
    the episode is cut at its last stored step (bootstrapping from V of the observation
    before the lost step) and the env is reset, so the next call goes on. It used to be
    refused before every later step, forever (the running episode's bootstrap was the
    refused observation itself; even the collector's reset() refused it)."""
    env = BadObsClock((0, 2), bad)
    roll = int_clock_rollout()
    col = MultiAgentRolloutCollector(env, v100, roll, seed=0)
    col.collect(1)
    before = {k: v.copy() for k, v in roll.data.items()}
    with pytest.raises(error) as got:
        col.collect(1)
    msg = str(got.value)
    assert msg.startswith("collect(env=...): the buffer refuses the observations or state "
                          "the env's step gave: obs['a']=")
    assert "the env's step is lost" in msg and "reset at the next step" in msg
    assert "not the policy" in msg and "the policy's actions" not in msg
    assert env.fired == 1 and (env.ep, env.t) == (0, 2)
    # the lost step added nothing; the stored step 0 now ends its episode (truncated)
    assert roll.pos == 1
    cut = ("truncated/a", "truncated/b")  # both agents ran: both are cut there
    assert {k: v.tolist() for k, v in roll.data.items() if k not in cut} == \
        {k: v.tolist() for k, v in before.items() if k not in cut}
    assert [roll.data[k][:, 0].tolist() for k in cut] == [[True], [True]]
    col.collect(3)  # the env is reset: episode 1
    assert [(int(o[2]), int(o[0])) for o in roll.data["obs/a"][:, 0]] == \
        [(0, 0), (1, 0), (1, 1), (1, 2)]
    # a: 1 + V(obs after step 0) | episode 1: 1+2+3 + V, 2+3 + V, 3 + V
    assert roll.returns["a"][:, 0].tolist() == [101.0, 106.0, 105.0, 103.0]


def test_rollout_refused_observation_of_one_env_loses_only_that_envs_step() -> None:
    """Two envs, env[1] returns a refused observation: env[0]'s step is stored, env[1]'s
    is lost (no agent active there in that row) and env[1] alone is reset."""
    envs = [Clock(), BadObsClock((0, 2))]
    roll = int_clock_rollout(num_envs=2)
    col = MultiAgentRolloutCollector(envs, v100, roll, seed=0)
    col.collect(1)
    with pytest.raises(ShapeError, match=r"state env\[1\]'s step gave: .*env\[1\]'s step is "
                       r"lost") as got:
        col.collect(1)
    assert "env[0]" not in str(got.value)
    assert roll.pos == 2
    assert roll.active["a"].tolist() == [[True, True], [True, False]]
    col.collect(2)
    obs = roll.data["obs/a"]  # [t, env, (t, k, episode)]
    assert [(int(o[2]), int(o[0])) for o in obs[:, 0]] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert [(int(o[2]), int(o[0])) for o in obs[[0, 2, 3], 1]] == [(0, 0), (1, 0), (1, 1)]
    assert roll.returns["a"][:, 1].tolist() == [101.0, 0.0, 103.0, 102.0]
    assert roll.returns["a"][:, 0].tolist() == [110.0, 109.0, 107.0, 104.0]


def test_rollout_refused_observation_after_the_first_step_is_checked_against_its_layout(
        ) -> None:
    """Before the first add the fields are unknown: the observation returned by the
    first env.step is checked against the layout that step's add would fix, so the
    first step is lost, not stored with a bootstrap the buffer cannot hold."""
    env = BadObsClock((0, 1))
    roll = clock_rollout()
    col = MultiAgentRolloutCollector(env, v100, roll, seed=0)
    with pytest.raises(ShapeError, match=r"obs\['a'\]=array\(shape=\(1, 5\).*expected "
                       r"shape \(1, 3\)"):
        col.collect(1)
    assert roll.pos == 0 and roll.layout is None
    col.collect(4)
    assert [(int(o[2]), int(o[0])) for o in roll.data["obs/a"][:, 0]] == \
        [(1, 0), (1, 1), (1, 2), (1, 3)]


def test_rollout_refused_observation_from_reset_resets_the_env_again() -> None:
    """The first observation of episode 1 (from reset, after episode 0 ended) is refused:
    the error comes after the step's bookkeeping, nothing of episode 1 is stored, and the
    next call resets the env again. (The plain-function policy values the one kept final
    observation: a batch of 1 row, as many as there are, also where envs are more.)"""
    env = BadObsClock((1, 0), horizon=2)  # "a" is truncated at t=2: V(final obs) = 100
    roll = clock_rollout()
    col = MultiAgentRolloutCollector(env, v100, roll, seed=0)
    with pytest.raises(ShapeError, match=r"the env's reset\(\) gave: .*no step of the env's "
                       r"new episode was stored"):
        col.collect(2)
    assert roll.pos == 2 and env.ep == 1
    col.collect(2)
    assert [(int(o[2]), int(o[0])) for o in roll.data["obs/a"][:, 0]] == \
        [(0, 0), (0, 1), (2, 0), (2, 1)]
    assert roll.returns["a"][:, 0].tolist() == [103.0, 102.0, 103.0, 102.0]


@pytest.mark.parametrize("bad_output, error, match", [
    ("value", DtypeError, r"value=.*\[nan\] of agent 'a'.*NaN or infinite"),
    ("log_prob", ShapeError, r"log-probabilities of this step: .*log_prob/a=.*shapes"),
])
def test_rollout_value_or_log_prob_the_buffer_refuses_is_caught_before_the_env_steps(
        bad_output: str, error: type[Exception], match: str) -> None:
    """A NaN value or a log-probability of the wrong shape is refused with the buffer's
    own checks before env.step (it used to step the env, then lose the step): the env,
    the rollout and the collector are as before, and once the policy is fixed the
    rollout goes on exactly; a NaN value also at the first step (before the buffer has
    a layout: there a log-probability of any shape fixes the field's)."""
    for first_step in (True, False) if bad_output == "value" else (False,):
        env = Clock()
        roll = clock_rollout()
        bad = [first_step]

        def policy(obs: dict[str, Any], state: Any, bad: list[bool] = bad) -> Any:
            acts, vals, logp = v100(obs, state)
            if bad[0] and bad_output == "value":
                vals = {k: np.full_like(v, np.nan) for k, v in vals.items()}
            elif bad[0]:
                logp = {k: np.zeros((len(v), 2)) for k, v in logp.items()}
            return acts, vals, logp

        col = MultiAgentRolloutCollector(env, policy, roll, seed=0)
        if not first_step:
            col.collect(1)
            bad[0] = True
        with pytest.raises(error, match=match) as got:
            col.collect(1)
        assert "env.step was not called" in str(got.value)
        assert "the step is lost" not in str(got.value)
        assert "add(" not in str(got.value)  # the user called collect, not add
        assert (env.t, roll.pos) == (0 if first_step else 1, 0 if first_step else 1)
        bad[0] = False
        col.collect(4 - roll.pos)
        assert roll.data["obs/a"][:, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
        assert roll.returns["a"][:, 0].tolist() == [110.0, 109.0, 107.0, 104.0]  # 1+2+3+4+V


@pytest.mark.parametrize("num_envs", [1, 2])
def test_rollout_tuple_action_is_refused_before_any_env_steps(num_envs: int) -> None:
    """A policy giving an agent's actions as a tuple of one array [n] per part (a Tuple
    action space's value): with several envs np.asarray stacked it part-first, and the
    parts were stored as the envs' actions (ragged parts: numpy's bare ValueError). The
    buffers' tuple rule refuses it before any env steps, with the flatten fix."""
    envs = [Clock() for _ in range(num_envs)]
    roll = MultiAgentRolloutBuffer(4, agents=["a", "b"], num_envs=num_envs, seed=0)
    bad = [True]

    def policy(obs: dict[str, Any], state: Any) -> Any:
        acts, vals, logp = v100(obs, state)
        parts = (np.zeros(num_envs, np.int64), np.ones(num_envs, np.int64))
        return ({k: parts for k in acts} if bad[0] else acts), vals, logp

    col = MultiAgentRolloutCollector(envs if num_envs > 1 else envs[0], policy, roll, seed=0)
    where = "for the envs" if num_envs > 1 else "in the env"
    with pytest.raises(
        ShapeError,
        match=rf"^collect\(policy=\.\.\.\): the buffer refuses "
        rf"the action of agent 'a' {where}: action\['a'\]=\(.*a tuple "
        r"holding arrays.*gymnasium\.spaces\.flatten.*env\.step was not",
    ):
        col.collect(1)
    assert [e.t for e in envs] == [0] * num_envs
    assert roll.pos == 0 and roll.layout is None
    bad[0] = False
    col.collect(1)
    assert roll.pos == 1 and roll.data["action/a"][0].tolist() == [0] * num_envs


@pytest.mark.parametrize(
    "odd, error, reset",
    [
        # the envs disagree in shape: with two, nothing says which is right: both are reset
        (np.zeros(4, np.float32), ShapeError, [True, True]),
        # a dtype numpy cannot stack with float32 (it raised its bare DTypePromotionError)
        (np.zeros(3, [("x", "f4")]), DtypeError, [True, True]),
        # a dtype no field holds: refused as it arrived, that env alone
        (np.array(["x", "y", "z"]), DtypeError, [False, True]),
    ],
)
def test_rollout_reset_observations_the_envs_disagree_on_reset_those_envs(
    odd: np.ndarray, error: type[Exception], reset: list[bool]
) -> None:
    """At the first step, before any add, two envs' reset observations of different
    shapes (or one the buffer cannot store) were refused by the collector on every
    call, nothing reset. They are refused as an env's reset the buffer refuses: named,
    nothing stored, the offending env(s) reset at the next call, which goes on."""
    envs = [Clock(), OddFirstEpisode(odd)]
    roll = MultiAgentRolloutBuffer(4, agents=["a", "b"], num_envs=2, seed=0)
    col = MultiAgentRolloutCollector(envs, v100, roll, seed=0)
    with pytest.raises(
        error,
        match=r"^collect\(env=\.\.\.\): the buffer refuses the observations or state "
        r"env\[\d\]'s reset\(\) gave: .*(agent 'a'|obs\['a'\]).*reset again at the next",
    ) as got:
        col.collect(1)
    assert "env.step" not in str(got.value)
    assert roll.pos == 0 and roll.layout is None and [e.t for e in envs] == [0, 0]
    col.collect(2)  # goes on: the refused envs are reset, their new episode stored
    assert roll.pos == 2
    episodes = roll.data["obs/a"][0, :, 2].tolist()  # [t, agent, episode] per env
    assert episodes == [float(r) for r in reset]


def test_rollout_reset_observation_of_one_env_among_three_resets_that_env_only() -> None:
    """Three envs, one of which observes another shape: the two that agree are kept,
    only the odd one is reset."""
    envs = [Clock(), OddFirstEpisode(np.zeros(4, np.float32)), Clock()]
    roll = MultiAgentRolloutBuffer(4, agents=["a", "b"], num_envs=3, seed=0)
    col = MultiAgentRolloutCollector(envs, v100, roll, seed=0)
    with pytest.raises(
        ShapeError,
        match=r"env\[1\]'s reset\(\) gave: the observation of "
        r"agent 'a' has shape \(4,\) in env\[1\] but \(3,\) in env\[0\]",
    ):
        col.collect(1)
    assert roll.pos == 0
    col.collect(1)
    assert roll.data["obs/a"][0, :, 2].tolist() == [0.0, 1.0, 0.0]


def tuple_actor(obs: dict[str, Any], state: Any) -> Any:
    """An actor-critic for :class:`TupleActs` whose outputs are functions of the
    observations ``[n, 2]`` (an oracle of any stored step): agent "t" acts with a tuple,
    one array ``[n, ...]`` per part (a gymnasium vector env's Tuple action), "x" with
    one float32[2]; values 0 (the advantages are the undiscounted returns with gamma
    1), log-probabilities ``-(step + 1)`` (agent "x": ``-(step + 1) / 2``)."""
    acts: dict[str, Any] = {}
    for a, o in obs.items():
        o = np.asarray(o)
        acts[a] = (o[:, 0].astype(np.int64) % 3,
                   np.stack([o[:, 0] / 4, o[:, 1] / 1000], -1).astype(np.float32)) \
            if a == "t" else np.stack([-o[:, 0] / 4, o[:, 1] / 1000], -1).astype(np.float32)
    return (acts, {a: np.zeros(len(o)) for a, o in obs.items()},
            {a: -(np.asarray(o)[:, 0] + 1) / (1 if a == "t" else 2) for a, o in obs.items()})


@pytest.mark.parametrize("num_envs", [1, 2])
def test_collect_tuple_actions_part_by_part_with_gae_and_minibatches(
        num_envs: int, tmp_path: Any) -> None:
    """An agent whose action space is a gymnasium Tuple beside one with a Box: the
    policy's tuple reaches each env as a tuple its action space contains (the env
    asserts it) and is stored part by part (``action/t/0``, ``action/t/1``), as
    rb.collect stores a Tuple action (it was refused: flatten it); minibatches give
    the parts with the per-agent log-probabilities, GAE gives the returns of a plain
    loop, and rb.save/rb.load keeps them."""
    envs = [TupleActs(i) for i in range(num_envs)]
    roll = MultiAgentRolloutBuffer(6, ["t", "x"], num_envs=num_envs, gamma=1.0,
                                   gae_lambda=1.0, seed=0, normalize_advantage=None)
    MultiAgentRolloutCollector(envs if num_envs > 1 else envs[0], tuple_actor, roll,
                               seed=0).collect()
    assert [n for n in roll.spec if n.startswith("action")] == [
        "action/t/0", "action/t/1", "action/x"]
    for e in envs:
        assert sum(k == "t" and type(a) is tuple for k, _, a in e.seen) == 6
    d = roll.data
    for a in ("t", "x"):  # the plain loop: rewards summed to each agent's end (V = 0)
        want = np.zeros((6, num_envs))
        for env in range(num_envs):
            running = 0.0
            for t in reversed(range(6)):
                if not d[f"active/{a}"][t, env]:
                    continue
                if d[f"truncated/{a}"][t, env] or d[f"terminated/{a}"][t, env]:
                    running = 0.0
                running += float(d[f"reward/{a}"][t, env])
                want[t, env] = running
        assert np.allclose(roll.returns[a], want)
    # the env's reward is the action's sum: it read the parts the policy gave
    on = d["active/t"]
    assert np.allclose(d["reward/t"][on], d["action/t/0"][on] + d["action/t/1"][on].sum(-1))
    rb.save(roll, tmp_path / "roll")
    for buf in (roll, rb.load(tmp_path / "roll")):
        seen = 0
        for mb in buf.get(4):
            want_acts, _, want_logp = tuple_actor(mb.obs, None)
            assert sorted(mb.action["t"]) == ["0", "1"]
            assert np.array_equal(mb.action["t"]["0"], want_acts["t"][0])
            assert np.array_equal(mb.action["t"]["1"], want_acts["t"][1])
            x_on = mb.active["x"]
            assert np.array_equal(mb.action["x"][x_on], want_acts["x"][x_on])
            assert np.allclose(mb.log_prob["t"], want_logp["t"])
            assert np.allclose(mb.log_prob["x"][x_on], want_logp["x"][x_on])
            seen += mb.batch_size
        assert seen == 6 * num_envs
    roll.reset()  # random actions: the spaces' tuples, stored part by part
    rb.collect(envs if num_envs > 1 else envs[0], None, roll, 6, progress=False, seed=1)
    assert roll.data["action/t/1"].shape == (6, num_envs, 2)
    assert (roll.data["action/t/1"] != 0).any()


def dict_actor(obs: dict[str, Any], state: Any, as_torch: bool = False) -> Any:
    """An actor-critic for :class:`DictActs`: :func:`dict_policy`'s actions ("d" a dict
    of ``[n, ...]`` parts, torch tensors with ``as_torch``), values 0, log-probabilities
    ``-(step + 1)``."""
    acts = dict_policy(obs)
    if as_torch and "d" in acts:
        import torch

        acts["d"] = {k: torch.as_tensor(v) for k, v in acts["d"].items()}
    return (acts, {a: np.zeros(len(o)) for a, o in obs.items()},
            {a: -(np.asarray(o)[:, 0] + 1) for a, o in obs.items()})


@pytest.mark.parametrize("num_envs", [1, 2])
def test_collect_dict_actions_part_by_part_and_refuse_other_dicts(num_envs: int) -> None:
    """An agent whose action space is a gymnasium Dict beside one with a Box: the
    policy's dict reaches each env as a dict its action space contains (the env asserts
    it) and is stored part by part (``action/d/move``, ``action/d/pick``) with the
    agent's log-probabilities; random actions too. A dict missing a key of the space is
    refused before any env steps (it used to reach the envs, which raised their own
    error)."""
    envs = [DictActs(i) for i in range(num_envs)]
    target = envs if num_envs > 1 else envs[0]
    roll = MultiAgentRolloutBuffer(6, ["d", "x"], num_envs=num_envs, gamma=1.0,
                                   gae_lambda=1.0, seed=0, normalize_advantage=None)
    MultiAgentRolloutCollector(target, dict_actor, roll, seed=0).collect()
    assert [n for n in roll.spec if n.startswith("action")] == [
        "action/d/move", "action/d/pick", "action/x"]
    for e in envs:
        assert sum(k == "d" and type(a) is dict for k, _, a in e.seen) == 6
    d = roll.data
    on = d["active/d"]
    assert np.allclose(d["reward/d"][on], d["action/d/pick"][on] + d["action/d/move"][on].sum(-1))
    seen = 0
    for mb in roll.get(4):
        want_acts, _, want_logp = dict_actor(mb.obs, None)
        assert np.array_equal(mb.action["d"]["move"], want_acts["d"]["move"])
        assert np.array_equal(mb.action["d"]["pick"], want_acts["d"]["pick"])
        assert np.allclose(mb.log_prob["d"], want_logp["d"])
        seen += mb.batch_size
    assert seen == 6 * num_envs
    roll.reset()  # random actions: the spaces' dicts, stored part by part
    rb.collect(target, None, roll, 6, progress=False, seed=1)
    assert roll.data["action/d/move"].shape == (6, num_envs, 2)
    assert (roll.data["action/d/move"] != 0).any()

    def missing(obs: dict[str, Any], state: Any) -> Any:
        acts, values, logp = dict_actor(obs, state)
        del acts["d"]["pick"]
        return acts, values, logp

    fresh = [DictActs(i) for i in range(num_envs)]
    other = MultiAgentRolloutBuffer(6, ["d", "x"], num_envs=num_envs, seed=0)
    with pytest.raises(ShapeError, match=r"action\['d'\].*\(missing \['pick'\]\)"):
        MultiAgentRolloutCollector(fresh if num_envs > 1 else fresh[0], missing, other,
                                   seed=0).collect()
    assert other.pos == 0 and not any(e.seen for e in fresh)
    pytest.importorskip("torch")  # a torch actor's parts reach the env as numpy
    col = MultiAgentRolloutCollector(fresh if num_envs > 1 else fresh[0],
                                     lambda o, s: dict_actor(o, s, as_torch=True), other,
                                     seed=0)
    col.collect()
    assert other.full and sum(k == "d" for k, _, _ in fresh[0].seen) == 6


# ------------------------------------------------------------- the cost of the checks on arrival
def test_rollout_arrival_checks_skip_values_stored_as_they_are_and_read_each_state_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks on arrival ran the rollout's full ``check_obs`` on ``[num_envs, ...]``
    rows of every observation an env gave, and read each env's ``state()`` for it, which
    the next step read again for the policy (and a truncation's step again for its final
    state). Once the first add fixed the fields, values that are exactly what the rollout
    stores pass without the full check, and each ``state()`` is read once per reset and
    per step; every stored field, bootstrap and advantage is still what the envs and the
    plain-loop oracle say."""
    calls: list[bool] = []
    check_obs = MultiAgentRolloutBuffer.check_obs

    def counted(self: MultiAgentRolloutBuffer, *args: Any, **kwargs: Any) -> None:
        calls.append(self.layout is None)
        check_obs(self, *args, **kwargs)

    monkeypatch.setattr(MultiAgentRolloutBuffer, "check_obs", counted)
    recs = [Recorder(Leaver(b_end=2 + i, c_end=4, a_end=5 + i)) for i in range(2)]
    envs = [Watched(r) for r in recs]
    pol = Critic(["a", "b", "c"], central=False)
    buf = MultiAgentRolloutBuffer(12, ["a", "b", "c"], num_envs=2, gamma=0.9,
                                  gae_lambda=0.8, seed=0)
    MultiAgentRolloutCollector(envs, pol, buf, seed=10).collect()
    assert calls and all(calls)  # the full check ran only before the fields were known
    assert [e.resets for e in envs] == [3, 3] and [e.steps for e in envs] == [12, 12]
    # one read per reset and per step (and one before the first reset: does it work?)
    assert [e.reads for e in envs] == [1 + 3 + 12] * 2
    check_rollout(buf, recs, pol, [0, 0], current(recs), [r.env.state() for r in recs])


@pytest.mark.parametrize("spoil, error", [
    (lambda s: s.astype(np.float64), None),  # cast by the rollout's checked cast
    (lambda s: np.zeros(4, np.float32), ShapeError),
])
def test_rollout_state_arriving_after_the_first_add_is_judged_as_add_judges_it(
        spoil: Any, error: type[Exception] | None) -> None:
    """Once the fields are known, env[1]'s third step is followed by a ``state()`` that
    is not exactly what the rollout stores (the checks on arrival skip those that are):
    the rollout's full check judges it, storing one it can cast and refusing another
    shape as env[1]'s step, which alone is lost."""
    def spoilt(obs: Any, state: Any) -> Any:
        return obs, None if state is None else spoil(state)

    envs = [Watched(Leaver()), Watched(Leaver(), at=3, spoil=spoilt)]
    buf = MultiAgentRolloutBuffer(8, ["a", "b", "c"], num_envs=2, seed=0)
    col = MultiAgentRolloutCollector(envs, v100, buf, seed=0)
    col.collect(2)
    if error is None:
        col.collect(2)
        # env[1]'s state after its third step is the next step's state (float32)
        assert buf.data["state"][3, 1].tolist() == [3.0, 0.0, 2.0]
        return
    with pytest.raises(error, match=r"^collect\(env=\.\.\.\): the buffer refuses the "
                       r"observations or state env\[1\]'s step gave: state=.*env\[1\]'s "
                       r"step is lost") as got:
        col.collect(1)
    assert "env[0]" not in str(got.value)
    assert buf.active["a"][2].tolist() == [True, False]
    col.collect(1)  # goes on: env[1] is reset
    assert [e.resets for e in envs] == [1, 2]
    assert buf.data["state"][3, 1].tolist() == [0.0, 1.0, 3.0]  # its new episode's start
