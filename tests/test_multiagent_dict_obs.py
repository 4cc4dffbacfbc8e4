"""Per-agent dict observations in MultiAgentReplayBuffer (issue 30)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from replaybank.errors import ReplayBankError
from replaybank.multiagent import MultiAgentReplayBuffer
from replaybank.multiagent.inputs import DirectAdd

AGENTS = ("a", "b", "c")
#: a: one array; b and c: dicts with their own keys, shapes and dtypes.
SPACES: dict[str, Any] = {
    "a": ((3,), np.float32),
    "b": {"observation": ((2, 2), np.float32), "action_mask": ((4,), np.int8)},
    "c": {"obs": ((5,), np.float64), "mask": ((2,), np.bool_)},
}


def _value(space: Any, rng: np.random.Generator, lead: tuple[int, ...]) -> Any:
    if isinstance(space, dict):
        return {k: _value(v, rng, lead) for k, v in space.items()}
    shape, dtype = space
    if np.dtype(dtype) == np.bool_:
        return rng.random((*lead, *shape)) < 0.5
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-5, 5, (*lead, *shape)).astype(dtype)
    return rng.standard_normal((*lead, *shape)).astype(dtype)


def _lane(v: Any, env: int, num_envs: int) -> Any:
    if isinstance(v, dict):
        return {k: _lane(x, env, num_envs) for k, x in v.items()}
    return np.array(v[env] if num_envs > 1 else v)


def _zeros(space: Any) -> Any:
    if isinstance(space, dict):
        return {k: _zeros(v) for k, v in space.items()}
    return np.zeros(space[0], space[1])


def _assert_same(got: Any, want: Any) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want)
        for k in want:
            _assert_same(got[k], want[k])
        return
    np.testing.assert_array_equal(np.asarray(got), want)
    assert np.asarray(got).dtype == want.dtype


class Feeder:
    """Random joint steps: agents end at different steps of each env's episode; an
    oracle ``records[env][seq]`` of what each stored joint step holds."""

    def __init__(self, num_envs: int, seed: int) -> None:
        self.n = num_envs
        self.rng = np.random.default_rng(seed)
        self.alive = np.ones((len(AGENTS), num_envs), bool)
        self.records: list[list[dict[str, Any]]] = [[] for _ in range(num_envs)]

    def step(self) -> dict[str, Any]:
        rng, n = self.rng, self.n
        lead = (n,) if n > 1 else ()
        acting = [a for i, a in enumerate(AGENTS) if self.alive[i].any()]
        obs = {a: _value(SPACES[a], rng, lead) for a in acting}
        nxt = {a: _value(SPACES[a], rng, lead) for a in acting}
        ends = {a: rng.random(n) < 0.25 for a in acting}
        cut = {a: rng.random(n) < 0.3 for a in acting}
        term = {a: ends[a] & ~cut[a] for a in acting}
        trunc = {a: ends[a] & cut[a] for a in acting}
        active = {a: self.alive[AGENTS.index(a)].copy() for a in acting}
        for env in range(n):
            act = {a: bool(a in acting and active[a][env]) for a in AGENTS}
            rec = {"active": act,
                   "obs": {a: _lane(obs[a], env, n) if act[a] else _zeros(SPACES[a])
                           for a in AGENTS},
                   "next_obs": {a: _lane(nxt[a], env, n) if act[a] else _zeros(SPACES[a])
                                for a in AGENTS},
                   "ended": {a: act[a] and bool(ends[a][env]) for a in AGENTS}}
            self.records[env].append(rec)
        for a in acting:
            i = AGENTS.index(a)
            self.alive[i] &= ~(ends[a] & active[a])
        over = ~self.alive.any(axis=0)
        self.alive[:, over] = True  # the joint episode ended: all act again
        return dict(obs=obs, next_obs=nxt, action={a: rng.integers(0, 3, lead) for a in acting},
                    reward={a: rng.random(lead).astype(np.float32) for a in acting},
                    terminated={a: term[a].reshape(lead) for a in acting},
                    truncated={a: trunc[a].reshape(lead) for a in acting},
                    active=None if n == 1 else active)


def _row(v: Any, index: Any) -> Any:
    """Row ``index`` of a batch value (per key of a dict observation)."""
    return {k: x[index] for k, x in v.items()} if isinstance(v, dict) else v[index]


def _check_batch(batch: Any, feeder: Feeder) -> int:
    """Every row equals the oracle; returns the agent ends seen."""
    n = feeder.n
    ends = 0
    for r, key in enumerate(np.asarray(batch.indices)):
        env, seq = int(key) % n, int(key) // n
        rec = feeder.records[env][seq]
        for a in AGENTS:
            assert bool(batch.active[a][r]) == rec["active"][a]
            _assert_same(_row(batch.obs[a], r), rec["obs"][a])
            _assert_same(_row(batch.next_obs[a], r), rec["next_obs"][a])
            ended = bool(batch.terminated[a][r] | batch.truncated[a][r])
            assert ended == rec["ended"][a]
            ends += ended
    return ends


def _fill(num_envs: int, steps: int, seed: int = 0, **kwargs: Any
          ) -> tuple[MultiAgentReplayBuffer, Feeder]:
    buf = MultiAgentReplayBuffer(16 * num_envs, AGENTS, num_envs=num_envs, seed=seed, **kwargs)
    feeder = Feeder(num_envs, seed)
    for _ in range(steps):
        buf.add(**feeder.step())
    return buf, feeder


@pytest.mark.parametrize("num_envs", [1, 3])
def test_samples_equal_what_was_added_across_wrap(num_envs: int) -> None:
    buf, feeder = _fill(num_envs, 50)  # 16 steps per env: wrapped
    assert len(buf) == 16 * num_envs
    ends = 0
    for _ in range(5):
        batch = buf.sample(32)
        assert isinstance(batch.obs["b"], dict) and isinstance(batch.next_obs["c"], dict)
        assert batch.obs["b"]["observation"].shape == (32, 2, 2)
        assert batch.next_obs["c"]["mask"].dtype == np.bool_
        assert batch.obs["a"].shape == (32, 3)
        ends += _check_batch(batch, feeder)
    assert ends > 0  # exact next_obs at agents' own ends was checked
    # inactive agents were seen (zeros checked by _check_batch)
    assert any(not np.asarray(buf.sample(32).active[a]).all() for a in AGENTS)


def test_spec_gives_dict_layout_and_late_agent() -> None:
    spec = {"obs": {a: ({k: (s, np.dtype(d).name) for k, (s, d) in v.items()}
                        if isinstance(v, dict) else (v[0], np.dtype(v[1]).name))
                    for a, v in SPACES.items()},
            "action": {a: ((), "int64") for a in AGENTS}}
    buf = MultiAgentReplayBuffer(32, AGENTS, seed=0, spec=spec)
    assert buf.layout is not None and buf.layout.obs_keys("b") == ("observation", "action_mask")
    assert buf.layout.obs_keys("a") is None
    rng = np.random.default_rng(1)
    o = _value(SPACES["c"], rng, ())
    nx = _value(SPACES["c"], rng, ())
    buf.add(obs={"c": o}, action={"c": 1}, reward={"c": 1.0}, next_obs={"c": nx},
            terminated={"c": True}, truncated={"c": False})
    batch = buf.sample(1)
    _assert_same({k: v[0] for k, v in batch.obs["c"].items()}, o)
    _assert_same({k: v[0] for k, v in batch.next_obs["c"].items()}, nx)
    _assert_same({k: v[0] for k, v in batch.obs["b"].items()}, _zeros(SPACES["b"]))


@pytest.mark.parametrize("num_envs", [1, 3])
def test_state_dict_round_trip(num_envs: int) -> None:
    buf, feeder = _fill(num_envs, 30, seed=3)
    for spec in (None, buf.layout.user_spec()):  # type: ignore[union-attr]
        back = MultiAgentReplayBuffer(16 * num_envs, AGENTS, num_envs=num_envs, seed=9,
                                      spec=spec)
        back.load_state_dict(buf.state_dict())
        assert back.layout is not None
        b1, b2 = buf.sample(8), back.sample(8)
        np.testing.assert_array_equal(b1.indices, b2.indices)
        for a in AGENTS:
            _assert_same(b2.obs[a], b1.obs[a])
            _assert_same(b2.next_obs[a], b1.next_obs[a])
        # both continue identically (placeholders and episode state were restored)
        back.load_state_dict(buf.state_dict())
        step = feeder.step()
        buf.add(**step)
        back.add(**step)
        b1, b2 = buf.sample(16), back.sample(16)
        for a in AGENTS:
            _assert_same(b2.next_obs[a], b1.next_obs[a])
        _check_batch(b1, feeder)


def _flat_state(state: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(_flat_state(v, f"{prefix}/{k}"))
    else:
        out[prefix] = state
    return out


def _assert_states_equal(s1: Any, s2: Any) -> None:
    f1, f2 = _flat_state(s1), _flat_state(s2)
    assert f1.keys() == f2.keys()
    for k in f1:
        if isinstance(f1[k], np.ndarray):
            np.testing.assert_array_equal(f1[k], f2[k])
        else:
            assert f1[k] == f2[k], k


def _good(rng: np.random.Generator) -> dict[str, Any]:
    obs = {a: _value(SPACES[a], rng, ()) for a in AGENTS}
    return dict(obs=obs, next_obs={a: _value(SPACES[a], rng, ()) for a in AGENTS},
                action={a: 0 for a in AGENTS}, reward={a: 0.0 for a in AGENTS},
                terminated={a: False for a in AGENTS}, truncated={a: False for a in AGENTS})


@pytest.mark.parametrize("arg", ["obs", "next_obs"])
@pytest.mark.parametrize("bad, words", [
    ("missing", ["missing ['action_mask']"]),
    ("shape", ["expected shape (4,)"]),
    ("extra", ["unknown ['extra']"]),
    ("dict_for_flat", ["observes one array"]),
    ("array_for_dict", ["observes a dict"]),
])
def test_bad_inputs_raise_and_change_nothing(arg: str, bad: str, words: list[str]) -> None:
    buf = MultiAgentReplayBuffer(16, AGENTS, seed=0)
    rng = np.random.default_rng(5)
    for _ in range(5):  # nobody ends
        buf.add(**_good(rng))
    before = buf.state_dict()
    step = _good(np.random.default_rng(2))
    agent = "a" if bad == "dict_for_flat" else "b"
    value = step[arg][agent]
    if bad == "missing":
        del value["action_mask"]
    elif bad == "shape":
        value["action_mask"] = np.zeros(5, np.int8)
    elif bad == "extra":
        value["extra"] = np.zeros(1)
    elif bad == "dict_for_flat":
        step[arg]["a"] = {"x": value}
    else:
        step[arg]["b"] = np.zeros(4, np.float32)
    with pytest.raises(ReplayBankError) as info:
        buf.add(**step)
    msg = str(info.value)
    assert f"{arg}[{agent!r}]" in msg
    for w in words:
        assert w in msg
    _assert_states_equal(buf.state_dict(), before)
    buf.add(**_good(np.random.default_rng(2)))  # and it still takes good steps
    assert len(buf) == 6


def test_first_add_rejected_leaves_buffer_empty() -> None:
    buf = MultiAgentReplayBuffer(8, AGENTS, seed=0)
    step = _good(np.random.default_rng(0))
    del step["next_obs"]["b"]["observation"]
    with pytest.raises(ReplayBankError, match=r"next_obs\['b'\]"):
        buf.add(**step)
    assert len(buf) == 0 and buf.layout is None
    buf.add(**_good(np.random.default_rng(0)))
    assert len(buf) == 1 and buf.layout is not None
    assert buf.layout.obs_keys("c") == ("obs", "mask")


def test_fast_path_declines_dict_observations() -> None:
    buf, _ = _fill(1, 3)
    assert buf.layout is not None and buf.layout.dict_obs
    assert DirectAdd(buf.layout, 1)._plain is False


def test_stacked_per_key_and_clear_error() -> None:
    buf, _ = _fill(1, 20)
    batch = buf.sample(4)
    with pytest.raises(ReplayBankError, match="differ in kind or keys"):
        batch.stacked("obs")
    assert batch.stacked("obs", agents=["a"]).shape == (4, 1, 3)
    per_key = batch.stacked("next_obs", agents=["b"])
    assert set(per_key) == {"observation", "action_mask"}
    assert per_key["observation"].shape == (4, 1, 2, 2)
    assert batch.stacked("action").shape == (4, 3)


def test_sequences_and_episodes_follow_the_layout() -> None:
    buf, feeder = _fill(1, 40, seed=7)
    seq = buf.sample_sequences(3, 4, strict=False)
    assert seq.obs["b"]["action_mask"].shape == (3, 4, 4)
    assert seq.next_obs["c"]["obs"].shape == (3, 4, 5)
    ep = buf.sample_episodes(4, 6)
    mask = np.asarray(ep.mask)
    for r, start in enumerate(np.asarray(ep.starts)):
        for t in range(mask.shape[1]):
            if not mask[r, t]:
                continue
            rec = feeder.records[0][int(start) + t]
            for a in AGENTS:
                _assert_same(_row(ep.obs[a], (r, t)), rec["obs"][a])
                _assert_same(_row(ep.next_obs[a], (r, t)), rec["next_obs"][a])


def test_n_step_next_obs_per_key() -> None:
    buf = MultiAgentReplayBuffer(32, AGENTS, seed=0, n_step=2, gamma=0.5)
    rng = np.random.default_rng(4)
    steps = [_good(rng) for _ in range(6)]
    for prev, s in zip([None, *steps], steps, strict=False):
        if prev is not None:  # continuous: each step starts where the last ended
            s["obs"] = prev["next_obs"]
        buf.add(**s)
    batch = buf.sample(16)
    assert np.asarray(batch.agent_discount["b"]).min() == 0.25  # two-step windows
    for r, key in enumerate(np.asarray(batch.indices)):
        want = steps[min(int(key) + 1, 5)]["next_obs"]
        for a in AGENTS:
            _assert_same(_row(batch.next_obs[a], r), _value_like(want[a], SPACES[a]))


def _value_like(v: Any, space: Any) -> Any:
    if isinstance(space, dict):
        return {k: _value_like(v[k], space[k]) for k in space}
    return np.asarray(v, space[1])


def test_save_load_and_memmap_reopen(tmp_path: Any) -> None:
    import replaybank as rb

    buf, _ = _fill(3, 30, seed=3)
    buf.save(tmp_path / "saved")
    back = MultiAgentReplayBuffer.load(tmp_path / "saved")
    b1, b2 = buf.sample(8), back.sample(8)
    for a in AGENTS:
        _assert_same(b2.obs[a], b1.obs[a])
        _assert_same(b2.next_obs[a], b1.next_obs[a])
    path = tmp_path / "mm"
    mm = MultiAgentReplayBuffer(48, AGENTS, num_envs=3, storage="memmap", path=path, seed=0)
    feeder = Feeder(3, 1)
    for _ in range(20):
        mm.add(**feeder.step())
    mm.flush()
    s1 = mm.sample(8)
    mm.close()
    opened = rb.open(path)
    s2 = opened.sample(8)
    for a in AGENTS:
        _assert_same(s2.next_obs[a], s1.next_obs[a])
    opened.add(**feeder.step())
    _check_batch(opened.sample(32), feeder)
    opened.close()
