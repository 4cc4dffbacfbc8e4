"""MultiAgentRolloutBuffer with per-agent dict observations (PettingZoo's
``{"observation": ..., "action_mask": ...}``).

Every rollout is also kept in plain Python (one record per step, env and agent); GAE is
computed from it by a plain loop, and every minibatch field (each observation key with its
dtype, zeros where an agent did not act) is compared with it. Also: the buffer built from
gymnasium ``Dict`` spaces, ``value_fn`` getting the kept dict final observations, save /
load, the rejected calls, and ``rb.collect`` from hand-written PettingZoo parallel envs
whose agents observe dicts (and mpe2's ``simple_spread_v3`` with its observations wrapped
in a dict). No PettingZoo parallel env with dict observations is installed: the classic
envs that have them are turn-based AEC envs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.batch import Batch
from replaybank.errors import (
    CheckpointError,
    DtypeError,
    ShapeError,
    SpecError,
)
from replaybank.multiagent import MultiAgentRolloutBatch, MultiAgentRolloutBuffer
from tests.test_multiagent_dict_obs import _value

GAMMA, LAM = 0.9, 0.8
AGENTS = ("a", "b", "c")
#: a: one array; b and c: dicts with their own keys, shapes and dtypes.
SPACES: dict[str, Any] = {
    "a": ((3,), np.float32),
    "b": {"observation": ((2, 2), np.float32), "action_mask": ((4,), np.int8)},
    "c": {"obs": ((5,), np.float64), "mask": ((2,), np.bool_)},
}
#: every agent observes the same dict (what get(agents="flatten") stacks).
SHARED: dict[str, Any] = {
    a: {"observation": ((3,), np.float32), "action_mask": ((4,), np.int8)} for a in AGENTS}
STATE = 2


# ---------------------------------------------------------------- values
def _lane(v: Any, env: int, lead: tuple[int, ...]) -> Any:
    if isinstance(v, dict):
        return {k: _lane(x, env, lead) for k, x in v.items()}
    return np.array(v[env] if lead else v)


def _zeros(space: Any) -> Any:
    if isinstance(space, dict):
        return {k: _zeros(v) for k, v in space.items()}
    return np.zeros(space[0], space[1])


def _assert_same(got: Any, want: Any, msg: str = "") -> None:
    """Equal bitwise, with the same dtype (per key of a dict observation)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), msg
        for k in want:
            _assert_same(got[k], want[k], f"{msg}[{k!r}]")
        return
    got = np.asarray(got)
    assert got.dtype == want.dtype, msg
    np.testing.assert_array_equal(got, want, err_msg=msg)


def _row(v: Any, r: int) -> Any:
    return {k: _row(x, r) for k, x in v.items()} if isinstance(v, dict) else v[r]


def v_obs(agent: str, o: Any) -> float:
    """The scenarios' critic of one observation (0 for zeros)."""
    w = 1.0 + AGENTS.index(agent)
    if isinstance(o, dict):
        return w * sum(float(np.sum(np.asarray(x, np.float64))) * (i + 1)
                       for i, x in enumerate(o[k] for k in sorted(o)))
    return w * float(np.sum(np.asarray(o, np.float64)))


def v_state(s: Any) -> float:
    return 0.0 if s is None else 0.5 * float(np.sum(s))


# ---------------------------------------------------------------- the plain-loop oracle
def gae_oracle(recs: list[list[dict[str, dict[str, Any]]]], agents: tuple[str, ...],
               last: dict[str, np.ndarray], gamma: float = GAMMA, lam: float = LAM
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per agent and env: GAE over the agent's active steps, cut at its own ends, a
    truncated step bootstrapping from ``rec["fv"]``, its last active step (when it did
    not end) from ``last[agent][env]``. ``recs[t][env][agent]`` (absent: did not act)."""
    n_t, n_e = len(recs), len(recs[0])
    adv = {a: np.zeros((n_t, n_e)) for a in agents}
    ret = {a: np.zeros((n_t, n_e)) for a in agents}
    for a in agents:
        for e in range(n_e):
            steps = [t for t in range(n_t) if a in recs[t][e]]
            nxt = 0.0
            for k in reversed(range(len(steps))):
                t = steps[k]
                r = recs[t][e][a]
                if r["term"]:
                    nv = 0.0
                elif r["trunc"]:
                    nv = r["fv"]
                elif k + 1 < len(steps):
                    nv = recs[steps[k + 1]][e][a]["value"]
                else:
                    nv = float(last[a][e])
                delta = r["reward"] + gamma * nv - r["value"]
                cut = r["term"] or r["trunc"] or k + 1 == len(steps)
                nxt = delta if cut else delta + gamma * lam * nxt
                adv[a][t, e] = nxt
                ret[a][t, e] = nxt + r["value"]
    return adv, ret


# ---------------------------------------------------------------- random rollouts
class Play:
    """A random rollout of ``n_steps`` adds: agents act in some envs, end at different
    steps (terminated, or truncated with the final value given now or from ``value_fn``
    over the kept dict final observation), and come back when the env's joint episode
    ends. ``recs[t][env][agent]`` keeps what each add said, in plain Python; lanes of
    envs where an agent does not act hold junk (ignored by the buffer)."""

    def __init__(self, seed: int, n_envs: int, n_steps: int, central: bool,
                 with_state: bool, spaces: dict[str, Any] = SPACES) -> None:
        rng = np.random.default_rng(seed)
        self.spaces, self.central, self.with_state = spaces, central, with_state
        self.n_envs, self.n_steps = n_envs, n_steps
        lead = (n_envs,) if n_envs > 1 else ()
        self.lead = lead
        self.adds: list[dict[str, Any]] = []
        self.recs: list[list[dict[str, dict[str, Any]]]] = []
        alive = [set(AGENTS) for _ in range(n_envs)]
        while len(self.adds) < n_steps:
            act = {a: np.array([a in alive[e] and rng.random() < 0.85 for e in range(n_envs)])
                   for a in AGENTS}
            acting = [a for a in AGENTS if act[a].any()]
            if not acting:
                continue
            u = {a: rng.random(n_envs) for a in acting}
            term = {a: act[a] & (u[a] < 0.15) for a in acting}
            trunc = {a: act[a] & (u[a] >= 0.15) & (u[a] < 0.35) for a in acting}
            cut = {a: trunc[a] & ~term[a] for a in acting}
            later = {a: cut[a] & (rng.random(n_envs) < 0.6) for a in acting}
            if central:  # one final value per env: every agent cut there alike
                some = np.any([later[a] for a in acting], axis=0)
                later = {a: cut[a] & some for a in acting}
            obs = {a: _value(spaces[a], rng, lead) for a in acting}
            fobs = {a: _value(spaces[a], rng, lead) for a in acting}
            value = rng.normal(size=n_envs) if central else {
                a: rng.normal(size=n_envs) for a in acting}
            fv_now = rng.normal(size=n_envs) if central else {
                a: rng.normal(size=n_envs) for a in acting}
            kw: dict[str, Any] = dict(
                obs=obs, action={a: rng.integers(0, 4, n_envs).reshape(lead) for a in acting},
                reward={a: rng.normal(size=n_envs).reshape(lead) for a in acting},
                terminated={a: term[a].reshape(lead) for a in acting},
                truncated={a: trunc[a].reshape(lead) for a in acting},
                value=value.reshape(lead) if central else
                {a: value[a].reshape(lead) for a in acting},
                log_prob={a: rng.normal(size=n_envs).reshape(lead) for a in acting},
                active={a: act[a] for a in acting} if n_envs > 1 else None)
            if central:
                kw["final_value"] = np.where(np.any([later[a] for a in acting], axis=0),
                                             np.nan, fv_now).reshape(lead)
            else:
                kw["final_value"] = {a: np.where(later[a], np.nan, fv_now[a]).reshape(lead)
                                     for a in acting}
            kept = [a for a in acting if later[a].any()]
            state = fstate = None
            if with_state:
                state = rng.normal(size=(*lead, STATE))
                fstate = rng.normal(size=(*lead, STATE))
                kw["state"] = state
            if kept:
                kw["final_obs"] = {a: fobs[a] for a in kept}
                if with_state:
                    kw["final_state"] = fstate
            step: list[dict[str, dict[str, Any]]] = []
            for e in range(n_envs):
                per: dict[str, dict[str, Any]] = {}
                finals = {a: _lane(fobs[a], e, lead) for a in acting if later[a][e]}
                s_after = None if fstate is None else _lane(fstate, e, lead)
                for a in acting:
                    if not act[a][e]:
                        continue
                    r = {"obs": _lane(obs[a], e, lead),
                         "action": int(_lane(kw["action"][a], e, lead)),
                         "reward": float(_lane(kw["reward"][a], e, lead)),
                         "term": bool(term[a][e]), "trunc": bool(trunc[a][e]),
                         "value": float(value[e] if central else value[a][e]),
                         "log_prob": float(_lane(kw["log_prob"][a], e, lead))}
                    if cut[a][e]:
                        if later[a][e]:  # valued by value_fn over the kept observations
                            r["fv"] = (sum(v_obs(b, o) for b, o in finals.items())
                                       if central else v_obs(a, finals[a])) + v_state(s_after)
                        else:
                            r["fv"] = float(fv_now[e] if central else fv_now[a][e])
                    per[a] = r
                step.append(per)
                for a in acting:
                    if act[a][e] and (term[a][e] or trunc[a][e]):
                        alive[e].discard(a)
                if not alive[e]:
                    alive[e] = set(AGENTS)
            self.adds.append(kw)
            self.recs.append(step)
        self.last = {a: rng.normal(size=n_envs) for a in AGENTS}
        if central:
            self.last = dict.fromkeys(AGENTS, self.last["a"])
        self.value_fn_calls: list[tuple[dict[str, Any], Any]] = []

    def spec(self) -> dict[str, Any]:
        def entry(space: Any) -> Any:
            if isinstance(space, dict):
                return {k: entry(v) for k, v in space.items()}
            return (space[0], np.dtype(space[1]).name)

        spec: dict[str, Any] = {
            "obs": {a: entry(self.spaces[a]) for a in AGENTS},
            "action": {a: ((), "int64") for a in AGENTS},
            "log_prob": {a: ((), "float64") for a in AGENTS},
            "value": ((), "float64") if self.central else {a: ((), "float64") for a in AGENTS}}
        if self.with_state:
            spec["state"] = ((STATE,), "float64")
        return spec

    def value_fn(self, obs: dict[str, Any], state: Any) -> Any:
        """The scenarios' critic, batched; checks the form it is given."""
        self.value_fn_calls.append((obs, state))
        k = len(state) if state is not None else len(next(iter(
            o if not isinstance(o, dict) else next(iter(o.values())) for o in obs.values())))
        for a, o in obs.items():
            want = self.spaces[a]
            if isinstance(want, dict):
                assert isinstance(o, dict) and list(o) == list(want), (a, o)
                for key, (shape, dtype) in want.items():
                    assert o[key].shape == (k, *shape) and o[key].dtype == np.dtype(dtype)
            else:
                assert o.shape == (k, *want[0]) and o.dtype == np.dtype(want[1])
        rows = [v_state(None if state is None else state[r]) for r in range(k)]
        if self.central:
            return np.array([rows[r] + sum(v_obs(a, _row(o, r)) for a, o in obs.items())
                             for r in range(k)])
        return {a: np.array([rows[r] + v_obs(a, _row(o, r)) for r in range(k)])
                for a, o in obs.items()}

    def last_values(self) -> Any:
        return self.last["a"] if self.central else self.last

    def build(self, seed: int = 0, steps: int | None = None, spec: bool = True,
              **kw: Any) -> MultiAgentRolloutBuffer:
        buf = MultiAgentRolloutBuffer(self.n_steps, list(AGENTS), num_envs=self.n_envs,
                                      gamma=GAMMA, gae_lambda=LAM, seed=seed,
                                      spec=self.spec() if spec else None, **kw)
        for add in self.adds[:steps]:
            buf.add(**add)
        return buf


def _kept(play: Play) -> bool:
    return any("final_obs" in add for add in play.adds)


def check_together(buf: MultiAgentRolloutBuffer, play: Play, batch_size: int,
                   adv: dict[str, np.ndarray], ret: dict[str, np.ndarray]) -> None:
    """Every "together" minibatch row against the plain records; each step once."""
    n_e, seen = play.n_envs, []
    for b in buf.get(batch_size=batch_size):
        assert isinstance(b, MultiAgentRolloutBatch) and b.batch_size <= batch_size
        for r, key in enumerate(np.asarray(b.indices).tolist()):
            t, e = divmod(key, n_e)
            rec = play.recs[t][e]
            assert rec, (t, e)  # a yielded step has some agent acting
            seen.append(key)
            for a in AGENTS:
                on = a in rec
                assert bool(b.active[a][r]) == on, (t, e, a)
                if not on:
                    _assert_same(_row(b.obs[a], r), _zeros(play.spaces[a]), f"obs {a}")
                    assert b.reward[a][r] == 0 and b.advantages[a][r] == 0
                    assert b.returns[a][r] == 0 and not b.terminated[a][r]
                    continue
                want = rec[a]
                _assert_same(_row(b.obs[a], r), want["obs"], f"obs {t} {e} {a}")
                assert b.action[a][r] == want["action"]
                assert b.log_prob[a][r] == want["log_prob"]
                assert b.reward[a][r] == want["reward"]
                assert bool(b.terminated[a][r]) == want["term"]
                assert bool(b.truncated[a][r]) == want["trunc"]
                value = b.value[r] if play.central else b.value[a][r]
                assert value == want["value"]
                assert b.advantages[a][r] == pytest.approx(adv[a][t, e], rel=1e-10, abs=1e-10)
                assert b.returns[a][r] == pytest.approx(ret[a][t, e], rel=1e-10, abs=1e-10)
            if play.with_state:
                np.testing.assert_array_equal(b.state[r], _lane(play.adds[t]["state"], e,
                                                                play.lead))
    want_steps = [t * n_e + e for t in range(play.n_steps) for e in range(n_e)
                  if play.recs[t][e]]
    assert sorted(seen) == want_steps


# ---------------------------------------------------------------- oracle tests
CASES = [(seed, n_envs, central, with_state) for seed, n_envs, central, with_state in (
    (0, 1, False, False), (1, 3, False, True), (2, 3, True, False), (3, 1, True, True),
    (4, 2, False, False), (5, 2, True, True))]


@pytest.mark.parametrize("seed,n_envs,central,with_state", CASES)
def test_minibatches_match_the_plain_loop_oracle(seed: int, n_envs: int, central: bool,
                                                 with_state: bool) -> None:
    play = Play(seed, n_envs, 9, central, with_state)
    assert _kept(play)  # every case values some kept dict final observation
    buf = play.build(normalize_advantage=None)
    buf.compute_returns_and_advantage(last_values=play.last_values(), value_fn=play.value_fn)
    adv, ret = gae_oracle(play.recs, AGENTS, play.last)
    for a in AGENTS:
        np.testing.assert_allclose(buf.advantages[a], adv[a], rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(buf.returns[a], ret[a], rtol=1e-10, atol=1e-10)
    # value_fn got every kept dict final observation once, in one call
    assert len(play.value_fn_calls) == (1 if _kept(play) else 0)
    for batch_size in (1, 4, 100):
        check_together(buf, play, batch_size, adv, ret)
    # the same rollout with the layout inferred from the first add stores the same
    if all(a in play.adds[0]["obs"] for a in AGENTS):
        inferred = play.build(spec=False, normalize_advantage=None)
        assert inferred.spec == buf.spec
        inferred.compute_returns_and_advantage(last_values=play.last_values(),
                                               value_fn=play.value_fn)
        check_together(inferred, play, 5, adv, ret)


def test_batch_normalisation_uses_the_active_entries_of_the_oracle() -> None:
    play = Play(8, 3, 8, False, False)
    buf = play.build(normalize_advantage="batch")
    buf.compute_returns_and_advantage(last_values=play.last_values(), value_fn=play.value_fn)
    adv, _ = gae_oracle(play.recs, AGENTS, play.last)
    act = {a: np.array([[a in play.recs[t][e] for e in range(3)] for t in range(8)])
           for a in AGENTS}
    flat = np.concatenate([adv[a][act[a]] for a in AGENTS])
    normed = {a: (adv[a] - flat.mean()) / (flat.std() + buf.advantage_eps) for a in AGENTS}
    for b in buf.get(batch_size=5):
        tt, ee = np.divmod(np.asarray(b.indices), 3)
        for a in AGENTS:
            on = np.asarray(b.active[a])
            np.testing.assert_allclose(b.advantages[a][on], normed[a][tt, ee][on], rtol=1e-9)


@pytest.mark.parametrize("n_envs,central", [(1, False), (3, True)])
def test_flatten_stacks_each_observation_key_over_agents(n_envs: int, central: bool) -> None:
    """Agents with the same dict keys: one item per active (env, time, agent), ``obs``
    a dict ``{key: [B, *shape]}`` as a single-agent rollout batch gives it."""
    play = Play(11, n_envs, 7, central, True, spaces=SHARED)
    buf = play.build(normalize_advantage=None)
    buf.compute_returns_and_advantage(last_values=play.last_values(), value_fn=play.value_fn)
    adv, ret = gae_oracle(play.recs, AGENTS, play.last)
    items = []
    for b in buf.get(batch_size=6, agents="flatten"):
        assert isinstance(b, Batch)
        assert sorted(b.obs) == ["action_mask", "observation"]
        assert b.obs["action_mask"].dtype == np.int8 and b.obs["observation"].shape[1:] == (3,)
        for r, (key, i) in enumerate(zip(np.asarray(b.indices).tolist(),
                                         np.asarray(b.agent).tolist(), strict=True)):
            a = AGENTS[i]
            t, e = divmod(key, n_envs)
            want = play.recs[t][e][a]  # only active items are yielded
            _assert_same(_row(b.obs, r), want["obs"], f"obs {t} {e} {a}")
            assert b.action[r] == want["action"] and b.reward[r] == want["reward"]
            assert b.log_prob[r] == want["log_prob"] and b.value[r] == want["value"]
            assert bool(b.terminated[r]) == want["term"]
            assert bool(b.truncated[r]) == want["trunc"]
            assert b.advantages[r] == pytest.approx(adv[a][t, e], rel=1e-10, abs=1e-10)
            assert b.returns[r] == pytest.approx(ret[a][t, e], rel=1e-10, abs=1e-10)
            np.testing.assert_array_equal(b.state[r], _lane(play.adds[t]["state"], e,
                                                            play.lead))
            items.append((key, i))
    want_items = [(t * n_envs + e, i) for t in range(7) for e in range(n_envs)
                  for i, a in enumerate(AGENTS) if a in play.recs[t][e]]
    assert sorted(items) == want_items
    # "together" batches stack per key for a shared network, and move to torch
    b = next(iter(buf.get()))
    stacked = b.stacked("obs")
    assert stacked["action_mask"].shape == (b.batch_size, 3, 4)
    np.testing.assert_array_equal(stacked["observation"][:, 1], b.obs["b"]["observation"])
    torch = pytest.importorskip("torch")
    tb = b.to_torch()
    assert isinstance(tb.obs["c"]["action_mask"], torch.Tensor)
    assert tb.obs["c"]["action_mask"].dtype == torch.int8


def test_flatten_refuses_agents_whose_observations_differ_in_keys() -> None:
    play = Play(1, 2, 4, False, False)
    buf = play.build()
    buf.compute_returns_and_advantage(last_values=play.last_values(), value_fn=play.value_fn)
    with pytest.raises(ShapeError, match=r"observations differ in kind or dict keys "
                       r"\{'a': None, 'b': \['observation', 'action_mask'\], 'c': "
                       r"\['obs', 'mask'\]\}.*get\(agents='together'\)"):
        buf.get(agents="flatten")
    # the same keys with other shapes: named per key
    other = dict(SHARED, c={"observation": ((2,), np.float32),
                            "action_mask": ((4,), np.int8)})
    play = Play(1, 2, 4, False, False, spaces=other)
    buf = play.build()
    buf.compute_returns_and_advantage(last_values=play.last_values(), value_fn=play.value_fn)
    with pytest.raises(ShapeError, match=r"obs/observation differ in shape.*"
                       r"batch\.obs\[agent\]\['observation'\]"):
        buf.get(agents="flatten")


# ---------------------------------------------------------------- spaces and checkpoints
def test_built_from_gymnasium_dict_spaces() -> None:
    """A spec from each agent's ``observation_space`` (``Dict`` spaces): the buffer is
    allocated at once, each key with the space's shape and dtype."""
    gym = pytest.importorskip("gymnasium")
    from replaybank.integrations.spaces import space_fields

    spaces = {"a": gym.spaces.Box(-1, 1, (3,), np.float32),
              "b": gym.spaces.Dict({"observation": gym.spaces.Box(0, 1, (2, 2), np.float32),
                                    "action_mask": gym.spaces.MultiBinary(4)})}
    fields = [f for a, sp in spaces.items() for f in space_fields(sp, f"obs/{a}")]
    fields += [f for a in spaces for f in space_fields(gym.spaces.Discrete(4), f"action/{a}")]
    spec = rb.Spec([*fields, *(rb.FieldSpec(f"{top}/{a}", (), np.dtype(np.float32))
                               for top in ("value", "log_prob") for a in spaces)])
    buf = MultiAgentRolloutBuffer(4, ["a", "b"], num_envs=2, spec=spec, seed=0)
    assert buf.layout is not None and buf.layout.obs_keys("b") == ("action_mask", "observation")
    assert buf.spec is not None and buf.spec["obs/b/action_mask"].dtype == np.int8
    assert buf.data["obs/b/observation"].shape == (0, 2, 2, 2)
    obs = {"a": np.ones((2, 3), np.float32),
           "b": {"observation": np.ones((2, 2, 2), np.float32),
                 "action_mask": np.array([[1, 0, 1, 0], [0, 1, 0, 1]], np.int8)}}
    two = {a: np.zeros(2) for a in ("a", "b")}
    no = {a: np.zeros(2, bool) for a in ("a", "b")}
    buf.add(obs=obs, action={a: np.zeros(2, np.int64) for a in ("a", "b")}, reward=two,
            terminated=no, truncated=no, value=two, log_prob=two)
    np.testing.assert_array_equal(buf.data["obs/b/action_mask"][0], obs["b"]["action_mask"])


def _flat(state: dict[str, Any]) -> dict[str, Any]:
    out = {f"metadata/{k}": v for k, v in state["metadata"].items()}
    out.update({f"arrays/{k}": v for k, v in state["arrays"].items()})
    out["rng"] = state["rng"]
    return out


def _assert_states_equal(s1: dict[str, Any], s2: dict[str, Any]) -> None:
    f1, f2 = _flat(s1), _flat(s2)
    assert f1.keys() == f2.keys()
    for k in f1:
        if isinstance(f1[k], np.ndarray):
            assert f1[k].dtype == f2[k].dtype, k
            np.testing.assert_array_equal(f1[k], f2[k])
        else:
            assert f1[k] == f2[k], k


@pytest.mark.parametrize("central", [False, True])
def test_save_load_keeps_dict_observations_and_kept_final_observations(
        tmp_path: Any, central: bool) -> None:
    """Mid-rollout with kept dict final observations: rb.save / rb.load and
    load_state_dict restore them per key, and compute the same advantages and
    minibatches; the config rebuilds an equivalent empty buffer."""
    play = Play(2 if central else 1, 3, 9, central, True)
    assert _kept(play)
    buf = play.build(seed=4, normalize_advantage=None)
    state = buf.state_dict()
    assert any(k.startswith("final_obs/rows/b/") or k.startswith("final_obs/rows/c/")
               for k in state["arrays"])
    rb.save(buf, tmp_path)
    back = rb.load(tmp_path)
    assert type(back) is MultiAgentRolloutBuffer
    fresh = MultiAgentRolloutBuffer(9, list(AGENTS), num_envs=3, gamma=GAMMA, gae_lambda=LAM,
                                    normalize_advantage=None)
    fresh.load_state_dict(state)
    _assert_states_equal(back.state_dict(), state)
    _assert_states_equal(fresh.state_dict(), state)
    for other in (buf, back, fresh):
        other.compute_returns_and_advantage(last_values=play.last_values(),
                                            value_fn=play.value_fn)
    adv, ret = gae_oracle(play.recs, AGENTS, play.last)
    want = [b.core.to_dict(nested=False) for b in buf.get(4)]
    for other in (back, fresh):
        for a in AGENTS:
            np.testing.assert_allclose(other.advantages[a], adv[a], rtol=1e-10, atol=1e-10)
        got = [b.core.to_dict(nested=False) for b in other.get(4)]
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_same(g, w)
    # after compute, the advantages travel too
    rb.save(buf, tmp_path / "done")
    again = rb.load(tmp_path / "done")
    check_together(again, play, 7, adv, ret)
    empty = rb.from_config(buf.config())
    assert type(empty) is MultiAgentRolloutBuffer and empty.spec == buf.spec
    assert empty.config() == buf.config()


def test_a_damaged_dict_final_observation_changes_nothing() -> None:
    play = Play(1, 3, 9, False, True)
    buf = play.build()
    before = buf.state_dict()
    name = next(k for k in before["arrays"] if k.startswith("final_obs/rows/b/")
                or k.startswith("final_obs/rows/c/"))
    for damage in ("drop", "shape"):
        state = buf.state_dict()
        if damage == "drop":
            del state["arrays"][name]
        else:
            state["arrays"][name] = np.zeros((1, 7))
        target = MultiAgentRolloutBuffer(9, list(AGENTS), num_envs=3, seed=0)
        with pytest.raises(CheckpointError, match=r"missing or misshaped"):
            target.load_state_dict(state)
        assert target.layout is None and target.pos == 0
        with pytest.raises(CheckpointError):
            buf.load_state_dict(state)
        _assert_states_equal(buf.state_dict(), before)


# ---------------------------------------------------------------- rejected calls
def good_step(rng: np.random.Generator, **over: Any) -> dict[str, Any]:
    step: dict[str, Any] = dict(
        obs={a: _value(SPACES[a], rng, ()) for a in AGENTS},
        action={a: 1 for a in AGENTS}, reward={a: 0.5 for a in AGENTS},
        terminated={a: False for a in AGENTS}, truncated={a: False for a in AGENTS},
        value={a: 0.1 for a in AGENTS}, log_prob={a: -1.0 for a in AGENTS})
    step.update(over)
    return step


def _obs_with(agent: str, value: Any) -> dict[str, Any]:
    obs = {a: _value(SPACES[a], np.random.default_rng(1), ()) for a in AGENTS}
    obs[agent] = value
    return obs


_B = _value(SPACES["b"], np.random.default_rng(2), ())
BAD_ADDS = [  # (overrides, error, words the message must hold)
    (dict(obs=_obs_with("b", {"observation": _B["observation"]})), SpecError,
     ["obs['b']", "missing ['action_mask']", "exactly those keys"]),
    (dict(obs=_obs_with("b", {**_B, "extra": np.zeros(1)})), SpecError,
     ["obs['b']", "unknown ['extra']", "exactly those keys"]),
    (dict(obs=_obs_with("b", {**_B, "action_mask": np.zeros(5, np.int8)})), ShapeError,
     ["obs['b']['action_mask']", "expected shape (4,)"]),
    (dict(obs=_obs_with("c", {"obs": np.zeros(5), "mask": np.array(["x", "y"])})),
     DtypeError, ["obs['c']['mask']", "bool", "string"]),
    (dict(obs=_obs_with("a", {"x": np.zeros(3, np.float32)})), SpecError,
     ["obs['a']", "observes one array", "pass that array"]),
    (dict(obs=_obs_with("b", np.zeros(4, np.float32))), SpecError,
     ["obs['b']", "observes a dict", "['observation', 'action_mask']"]),
    (dict(obs=_obs_with("b", {**_B, "action_mask": {"x": np.zeros(4)}})), SpecError,
     ["obs['b']['action_mask']", "nested dict", "one level of keys", "flatten"]),
    (dict(truncated={a: a == "b" for a in AGENTS},
          final_obs={"b": {"observation": _B["observation"]}}), SpecError,
     ["final_obs['b']", "missing ['action_mask']"]),
    (dict(truncated={a: a == "c" for a in AGENTS}, final_obs={"b": _B}), ShapeError,
     ["final_obs", "'c'", "no observation"]),
    (dict(truncated={a: a == "b" for a in AGENTS},
          final_obs={"b": {**_B, "observation": np.zeros((2, 3), np.float32)}}), ShapeError,
     ["final_obs['b']['observation']", "expected shape (2, 2)"]),
]


@pytest.mark.parametrize("over,err,words", BAD_ADDS)
def test_bad_adds_name_the_argument_and_change_nothing(over: dict[str, Any],
                                                       err: type[Exception],
                                                       words: list[str]) -> None:
    rng = np.random.default_rng(0)
    buf = MultiAgentRolloutBuffer(4, list(AGENTS), seed=0)
    buf.add(**good_step(rng))
    before = buf.state_dict()
    with pytest.raises(err) as info:
        buf.add(**good_step(rng, **over))
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    _assert_states_equal(buf.state_dict(), before)
    buf.add(**good_step(rng))  # still takes good steps
    assert buf.pos == 2


def test_a_bad_first_add_or_spec_leaves_nothing_behind() -> None:
    buf = MultiAgentRolloutBuffer(4, list(AGENTS), seed=0)
    bad = good_step(np.random.default_rng(0), obs=_obs_with("b", {**_B, "inner": {
        "x": np.zeros(2)}}))
    with pytest.raises(SpecError, match=r"obs\['b'\]\['inner'\].*nested dict.*one level"):
        buf.add(**bad)
    with pytest.raises(SpecError, match=r"obs\['c'\]=\{\}.*empty dict"):
        buf.add(**good_step(np.random.default_rng(0), obs=_obs_with("c", {})))
    assert buf.layout is None and buf.spec is None and buf.pos == 0
    with pytest.raises(SpecError, match=r"MultiAgentRolloutBuffer\(spec=\.\.\.\): "
                       r"'obs/b/x/y' is a nested key of the dict observation of agent "
                       r"'b'.*one level of keys"):
        MultiAgentRolloutBuffer(4, list(AGENTS),
                                spec={"obs": {"b": {"x": {"y": ((2,), "float32")}}}})
    with pytest.raises(SpecError, match=r"'obs/b' is given both as one array and as a dict"):
        MultiAgentRolloutBuffer(4, list(AGENTS), spec={"obs/b": ((2,), "float32"),
                                                       "obs/b/x": ((2,), "float32")})
    buf.add(**good_step(np.random.default_rng(0)))
    assert buf.layout is not None and buf.layout.obs_keys("c") == ("obs", "mask")


# ---------------------------------------------------------------- collecting
pytest.importorskip("pettingzoo")
import gymnasium as gym  # noqa: E402  (pettingzoo depends on it)

from replaybank.integrations.pettingzoo import MultiAgentRolloutCollector  # noqa: E402
from tests.pettingzoo_leavers import DictLeaver, Recorder  # noqa: E402


def _sum(o: Any) -> Any:
    """Per row: the sum of every key's values (one array: its values), float64."""
    if isinstance(o, dict):
        return sum(np.asarray(v, np.float64).reshape(len(v), -1).sum(axis=1)
                   for _, v in sorted(o.items()))
    return np.asarray(o, np.float64).reshape(len(o), -1).sum(axis=1)


class DictCritic:
    """A deterministic actor-critic reading dict observations per key: the first legal
    action of "a" (from its ``action_mask``), values ``w_a * sum of the keys / 10 +
    sum(state) / 10``."""

    def __init__(self, agents: list[str]) -> None:
        self.agents = agents
        self.value_calls: list[tuple[dict[str, Any], Any]] = []

    def action(self, a: str, o: Any) -> np.ndarray:
        if isinstance(o, dict) and "action_mask" in o:
            return np.argmax(o["action_mask"], axis=1).astype(np.int64)
        return (np.abs(_sum(o) * 7).astype(np.int64)) % 3

    def v(self, a: str, o: Any, s: Any) -> np.ndarray:
        out = (1.0 + self.agents.index(a)) * _sum(o) / 10
        return out if s is None else out + np.asarray(s, np.float64).sum(axis=-1) / 10

    def __call__(self, obs: dict[str, Any], state: Any) -> Any:
        return ({a: self.action(a, o) for a, o in obs.items()}, self._values(obs, state),
                {a: -0.1 * _sum(o) for a, o in obs.items()})

    def value(self, obs: dict[str, Any], state: Any) -> Any:
        self.value_calls.append((obs, state))
        return self._values(obs, state)

    def _values(self, obs: dict[str, Any], state: Any) -> Any:
        return {a: self.v(a, o, state) for a, o in obs.items()}


def _one(o: Any) -> Any:
    """A one-row batch of an observation."""
    return {k: np.asarray(v)[None] for k, v in o.items()} if isinstance(o, dict) \
        else np.asarray(o)[None]


def check_collected(buf: MultiAgentRolloutBuffer, recs: list[Recorder], pol: DictCritic,
                    start: int) -> None:
    """Every stored field and minibatch row against the envs' logs (steps ``start:`` of
    each env), and the advantages against the plain-loop oracle."""
    agents, n_t, n_e = tuple(buf.agents), buf.n_steps, buf.num_envs
    d = buf.data
    records: list[list[dict[str, dict[str, Any]]]] = [[{} for _ in range(n_e)]
                                                      for _ in range(n_t)]
    for e, rec in enumerate(recs):
        steps = rec.log[start:start + n_t]
        assert len(steps) == n_t
        for t, s in enumerate(steps):
            np.testing.assert_array_equal(d["state"][t, e], s["state"])
            for a in agents:
                if a not in s["action"]:
                    assert not d[f"active/{a}"][t, e]
                    continue
                assert d[f"active/{a}"][t, e]
                o = s["obs"][a]
                action = int(pol.action(a, _one(o))[0])
                assert s["action"][a] == action
                r = {"obs": o, "action": action, "reward": float(s["rew"][a]),
                     "term": bool(s["term"][a]), "trunc": bool(s["trunc"][a]),
                     "value": float(pol.v(a, _one(o), s["state"][None])[0]),
                     "log_prob": float(-0.1 * _sum(_one(o))[0])}
                if r["trunc"] and not r["term"]:  # V(true final obs, state after the step)
                    r["fv"] = float(pol.v(a, _one(s["next"][a]), s["state_after"][None])[0])
                records[t][e][a] = r
    last = {a: np.zeros(n_e) for a in agents}
    for e, rec in enumerate(recs):
        for a, o in rec.pending.items():
            last[a][e] = pol.v(a, _one(o), np.array(rec.env.state())[None])[0]
    adv, ret = gae_oracle(records, agents, last, buf.gamma, buf.gae_lambda)
    for a in agents:
        np.testing.assert_allclose(buf.advantages[a], adv[a], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(buf.returns[a], ret[a], rtol=1e-6, atol=1e-6)
    zeros = {"a": {"observation": np.zeros(3, np.float32), "action_mask": np.zeros(3, np.int8)},
             "b": np.zeros(2, np.float32),
             "c": {"pos": np.zeros(2), "legal": np.zeros(3, bool)}}
    seen = []
    for b in buf.get(batch_size=5):
        for r, key in enumerate(np.asarray(b.indices).tolist()):
            t, e = divmod(key, n_e)
            seen.append(key)
            for a in agents:
                if a not in records[t][e]:
                    assert not b.active[a][r]
                    _assert_same(_row(b.obs[a], r), zeros[a], f"obs {t} {e} {a}")
                    continue
                want = records[t][e][a]
                # the env's own dtypes: MultiBinary masks of "c" stored as given (bool)
                got = _row(b.obs[a], r)
                _assert_same(got, want["obs"], f"obs {t} {e} {a}")
                assert b.action[a][r] == want["action"]
                assert b.reward[a][r] == want["reward"]
                assert b.log_prob[a][r] == pytest.approx(want["log_prob"])
    assert sorted(seen) == list(range(n_t * n_e))


@pytest.mark.parametrize("n_envs", [1, 3])
def test_collect_dict_observations_matches_the_envs_and_the_oracle(n_envs: int) -> None:
    recs = [Recorder(DictLeaver(b_end=2 + i, c_end=4, a_end=5 + i, reuse=i == 1))
            for i in range(n_envs)]
    env: Any = recs if n_envs > 1 else recs[0]
    pol = DictCritic(["a", "b", "c"])
    buf = MultiAgentRolloutBuffer(12, ["a", "b", "c"], num_envs=n_envs, gamma=0.9,
                                  gae_lambda=0.8, seed=0, normalize_advantage=None)
    col = MultiAgentRolloutCollector(env, pol, buf, seed=10)
    res = col.collect()
    assert buf.full and res.steps == 12 * n_envs
    assert buf.layout is not None and buf.layout.obs_keys("a") == ("observation", "action_mask")
    assert buf.spec is not None and buf.spec["obs/a/action_mask"].dtype == np.int8
    assert buf.spec["obs/c/legal"].dtype == np.bool_ and buf.spec["obs/b"].shape == (2,)
    # value(): once for the truncated agents' dict final observations, once for the
    # last values; both get {agent: {key: [K, *shape]}}
    assert len(pol.value_calls) == 2
    finals, _ = pol.value_calls[1]  # (the first: the last values)
    assert sorted(finals) == ["a", "c"]  # "b" terminates: never kept
    assert finals["a"]["action_mask"].dtype == np.int8 and finals["c"]["pos"].ndim == 2
    check_collected(buf, recs, pol, 0)
    buf.reset()  # the next rollout continues the episodes
    col.collect(12)
    check_collected(buf, recs, pol, 12)


def test_collect_random_actions_with_dict_observations() -> None:
    """``policy=None``: zero values of the batches' row count (not the dict's keys), so
    the advantages are the discounted rewards to go, bootstrapped with 0."""
    recs = [Recorder(DictLeaver(b_end=2, c_end=3, a_end=4)) for _ in range(3)]
    buf = rb.MultiAgentRolloutBuffer(6, ["a", "b", "c"], num_envs=3, gamma=0.5,
                                     gae_lambda=1.0, seed=0, normalize_advantage=None)
    res = rb.collect(recs, None, buf, 6, progress=False, seed=3)
    assert res.steps == 18 and buf.full
    for e, rec in enumerate(recs):
        for a in ("a", "b", "c"):
            steps = [(t, s) for t, s in enumerate(rec.log[:6]) if a in s["action"]]
            for i, (t, s) in enumerate(steps):
                _assert_same({k: buf.data[f"obs/{a}/{k}"][t, e] for k in s["obs"][a]}
                             if isinstance(s["obs"][a], dict) else buf.data[f"obs/{a}"][t, e],
                             s["obs"][a])
                want, disc = 0.0, 1.0
                for _, later in steps[i:]:
                    want += disc * later["rew"][a]
                    disc *= 0.5
                    if later["term"][a] or later["trunc"][a]:
                        break
                assert buf.returns[a][t, e] == pytest.approx(want)


def test_collect_mpe2_simple_spread_with_dict_observations() -> None:
    """mpe2's simple_spread_v3 with each agent's observation wrapped as PettingZoo's
    classic envs give it, ``{"observation": float32[18], "action_mask": int8[5]}``:
    every stored key equals what the env returned; the truncation at ``max_cycles``
    bootstraps from the dict final observations."""
    pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3

    from tests.pettingzoo_leavers import Forwarding

    class DictObs(Forwarding):
        def __init__(self, env: Any) -> None:
            super().__init__(env)
            self.metadata = env.metadata

        def observation_space(self, agent: str) -> Any:
            return gym.spaces.Dict({"observation": self.env.observation_space(agent),
                                    "action_mask": gym.spaces.MultiBinary(5)})

        def _wrap(self, obs: dict[str, Any]) -> dict[str, Any]:
            return {a: {"observation": o, "action_mask": np.array(
                [1, 1, 1, 1, int(np.sum(o) > 0)], np.int8)} for a, o in obs.items()}

        def reset(self, seed: int | None = None, options: Any = None) -> Any:
            obs, info = self.env.reset(seed=seed, options=options)
            return self._wrap(obs), info

        def step(self, actions: dict[str, Any]) -> Any:
            obs, *rest = self.env.step(actions)
            return (self._wrap(obs), *rest)

    recs = [Recorder(DictObs(simple_spread_v3.parallel_env(max_cycles=4)))
            for _ in range(2)]
    agents = list(recs[0].possible_agents)
    pol = DictCritic(agents)
    buf = rb.MultiAgentRolloutBuffer(6, agents, num_envs=2, gamma=0.9, gae_lambda=0.8,
                                     seed=0, normalize_advantage=None)
    res = rb.collect(recs, pol, buf, 6, progress=False, seed=0)
    assert res.episode_lengths == [4, 4] and buf.full
    assert buf.spec is not None and buf.spec["obs/agent_0/observation"].shape == (18,)
    finals, _ = pol.value_calls[1]  # every agent truncated at step 4: kept, valued once
    assert finals["agent_1"]["observation"].shape == (2, 18)
    check_collected(buf, recs, pol, 0)
