"""MultiAgentReplayBuffer's two ways in: the common ``add`` straight to the core's compiled
write (:class:`~replaybank.multiagent.inputs.DirectAdd`) and the checked path
(:func:`~replaybank.multiagent.inputs.prepare`).

Both must store bitwise identical data (the whole ``state_dict``) on random scenarios,
and a bad value that the fast path meets must raise exactly the checked path's error and
leave the buffer as it was. The checked path is forced by making ``DirectAdd.write``
decline every call.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaybank.multiagent import MultiAgentBatch, MultiAgentReplayBuffer
from replaybank.multiagent.inputs import DirectAdd
from replaybank.storage.writers.compiled import accelerated

SHAPES = {"a": ((3,), np.float32), "b": ((2, 2), np.float64), "c": ((2,), np.bool_)}
ACTIONS = {"a": ((), np.int64), "b": ((2,), np.float32), "c": ((), np.int64)}
STATE = ((4,), np.float32)

needs_compiled = pytest.mark.skipif(not accelerated(), reason="the compiled writer is not "
                                    "built (or REPLAYBANK_PURE_PYTHON is set)")


# ---------------------------------------------------------------------- helpers
@contextmanager
def checked_path() -> Iterator[None]:
    """Every add takes the checked path (DirectAdd declines)."""
    with mock.patch.object(DirectAdd, "write", return_value=False):
        yield


@contextmanager
def counting(hits: list[bool]) -> Iterator[None]:
    """Record what each DirectAdd.write returned."""
    original = DirectAdd.write

    def spy(self: DirectAdd, *args: Any, **kwargs: Any) -> bool:
        done = original(self, *args, **kwargs)
        hits.append(done)
        return done

    with mock.patch.object(DirectAdd, "write", spy):
        yield


def bits(x: Any) -> Any:
    """``x`` with every array replaced by its dtype, shape and bytes (bitwise equality)."""
    if isinstance(x, dict):
        return {k: bits(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(bits(v) for v in x)
    if isinstance(x, np.ndarray):
        return (x.dtype.str, x.shape, np.ascontiguousarray(x).tobytes())
    return x


def same_state(a: MultiAgentReplayBuffer, b: MultiAgentReplayBuffer) -> None:
    assert bits(a.state_dict()) == bits(b.state_dict())


def spec_of(agents: tuple[str, ...], with_state: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"obs": {a: SHAPES[a] for a in agents},
                            "action": {a: ACTIONS[a] for a in agents}}
    if with_state:
        spec["state"] = STATE
    return spec


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
    all_act: float  # probability that every agent acts in every env (the fast path's call)
    lane_dim: bool  # one env: values with a lane dim of 1 (the checked path's call)
    python_values: bool  # one env: Python floats and bools as PettingZoo gives them


scenarios = st.builds(
    Scenario,
    agents=st.sampled_from([("a", "b"), ("a", "b", "c"), ("c",), ("a",), ("b", "c")]),
    num_envs=st.integers(1, 3),
    rows=st.integers(2, 6),
    steps=st.integers(1, 40),
    seed=st.integers(0, 2**16),
    with_state=st.booleans(),
    use_spec=st.booleans(),
    all_act=st.sampled_from([0.5, 0.9, 1.0]),
    lane_dim=st.booleans(),
    python_values=st.booleans(),
)


def _obs(rng: np.random.Generator, agent: str, lead: tuple[int, ...]) -> np.ndarray:
    shape, dtype = SHAPES[agent]
    if dtype == np.bool_:
        raw = rng.integers(0, 2, (*lead, *shape)).astype(np.uint8)
        if rng.random() < 0.3:  # non-canonical bool bytes: stored as 0/1
            raw = raw * rng.integers(1, 4, raw.shape).astype(np.uint8)
        return raw.view(np.bool_)
    value = rng.normal(size=(*lead, *shape))
    # as given by an env: float64, or already the stored dtype
    return value if rng.random() < 0.5 else value.astype(dtype)


def joint_steps(sc: Scenario) -> Iterator[dict[str, Any]]:
    """Random add calls that are all valid: agents ending at different steps, joint
    ends by termination and truncation (every agent at once or one by one), data that
    does not continue, and mostly calls where every agent acts in every env."""
    rng = np.random.default_rng(sc.seed)
    n = sc.num_envs
    one = n == 1
    lead: tuple[int, ...] = (1,) if one and sc.lane_dim else () if one else (n,)
    ended: list[set[str]] = [set() for _ in range(n)]
    alive: list[set[str]] = [set() for _ in range(n)]
    cur = {a: _obs(rng, a, (n,)) for a in sc.agents}
    first = True
    for _ in range(sc.steps):
        every = not any(ended) and (rng.random() < sc.all_act or (first and not sc.use_spec))
        acts = np.ones((len(sc.agents), n), bool)
        if not every:
            for i, a in enumerate(sc.agents):
                for e in range(n):
                    acts[i, e] = a not in ended[e] and rng.random() < 0.7
            if not acts.any():
                continue
            if first and not sc.use_spec and not acts.all():
                continue  # the first add of a buffer without spec shows every agent
        first = False
        time_limit = rng.random() < 0.08  # every acting agent truncated at once
        kw: dict[str, Any] = {k: {} for k in ("obs", "action", "reward", "next_obs",
                                              "terminated", "truncated")}
        active: dict[str, Any] = {}
        for i, a in enumerate(sc.agents):
            if not acts[i].any():
                continue
            if not acts[i].all():
                active[a] = acts[i].copy()
            if rng.random() < 0.1:  # data that does not continue
                cur[a] = _obs(rng, a, (n,))
            nxt = _obs(rng, a, (n,))
            shape, dtype = ACTIONS[a]
            action = rng.integers(0, 5, (n, *shape))
            reward = rng.normal(size=n)
            reward[rng.random(n) < 0.1] = -0.0
            term = (rng.random(n) < 0.1) & acts[i]
            trunc = ((rng.random(n) < 0.06) | time_limit) & ~term & acts[i]
            for e in range(n):
                if term[e] or trunc[e]:
                    ended[e].add(a)
                    alive[e].discard(a)
                elif acts[i, e]:
                    alive[e].add(a)

            def shaped(x: Any) -> Any:
                if not one:
                    return x
                return x if sc.lane_dim else x[0]

            kw["obs"][a] = shaped(np.asarray(cur[a]))
            kw["next_obs"][a] = shaped(np.asarray(nxt))
            if dtype == np.float32:
                kw["action"][a] = shaped(action.astype(np.float32))
            else:
                kw["action"][a] = shaped(action)
            if one and not sc.lane_dim and sc.python_values:
                kw["reward"][a] = float(reward[0])
                kw["terminated"][a] = bool(term[0])
                kw["truncated"][a] = bool(trunc[0])
            else:
                kw["reward"][a] = shaped(reward if rng.random() < 0.8 else
                                         reward.astype(np.float32))
                kw["terminated"][a] = shaped(term)
                kw["truncated"][a] = shaped(trunc if rng.random() < 0.8 else
                                            trunc.astype(np.int64))
            cur[a] = nxt
        if sc.with_state:
            kw["state"] = rng.normal(size=(*lead, *STATE[0])).astype(np.float32)
            kw["next_state"] = rng.normal(size=(*lead, *STATE[0]))
        if active:
            kw["active"] = active
        for e in range(n):  # a joint end: every agent that acted has ended
            if acts[:, e].any() and not alive[e]:
                ended[e] = set()
                cur = {a: v.copy() for a, v in cur.items()}
                for a in sc.agents:
                    cur[a][e] = _obs(rng, a, (n,))[e]
        yield kw


def buffer_of(sc: Scenario) -> MultiAgentReplayBuffer:
    return MultiAgentReplayBuffer(sc.rows * sc.num_envs, sc.agents, num_envs=sc.num_envs,
                                  seed=sc.seed, spec=spec_of(sc.agents, sc.with_state)
                                  if sc.use_spec else None)


# ---------------------------------------------------------------------- same data
@needs_compiled
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios)
def test_fast_and_checked_paths_store_identical_data(sc: Scenario) -> None:
    fast, checked = buffer_of(sc), buffer_of(sc)
    hits: list[bool] = []
    for kw in joint_steps(sc):
        with checked_path():
            checked.add(**kw)
        with counting(hits):
            fast.add(**kw)
        same_state(fast, checked)
    if len(fast):
        with counting(hits):
            a, b = fast.sample(8), checked.sample(8)
        for name, value in a.core.to_dict(nested=False).items():
            np.testing.assert_array_equal(value, b.core[name])
    if sc.num_envs == 1 and sc.lane_dim:
        assert not any(hits)  # a lane dim of 1 is the checked path's


@needs_compiled
@pytest.mark.parametrize("num_envs", [1, 4])
def test_the_common_call_takes_the_fast_path(num_envs: int) -> None:
    """PettingZoo's step dicts (float64 rewards, bool flags; Python numbers with one
    env), episodes cut by a time limit: every add but the first (which finds no layout
    and allocates the storage) goes straight to the compiled write."""
    agents = ("a", "b", "c")
    bufs = [MultiAgentReplayBuffer(8 * num_envs, agents, num_envs=num_envs, seed=0)
            for _ in range(2)]
    calls = []
    for t in range(30):
        step = good_step(t, num_envs)
        end = t % 5 == 4
        for a in agents:
            step["truncated"][a] = np.full(num_envs, end)
        if num_envs == 1:
            step = {k: {a: v[0] for a, v in d.items()} if isinstance(d, dict) else d[0]
                    for k, d in step.items()}
            for k in ("reward", "terminated", "truncated"):
                step[k] = {a: v.item() for a, v in step[k].items()}
        calls.append(step)
    hits: list[bool] = []
    for step in calls:
        with checked_path():
            bufs[0].add(**step)
        with counting(hits):
            bufs[1].add(**step)
    assert hits == [True] * 29
    same_state(bufs[0], bufs[1])


# ---------------------------------------------------------------------- errors
def _setup(ended_agent: bool = False) -> MultiAgentReplayBuffer:
    """Three agents, two envs, a state; three common steps (and agent a terminated in env 0
    when ``ended_agent``)."""
    buf = MultiAgentReplayBuffer(16, ("a", "b", "c"), num_envs=2, seed=0,
                                 spec=spec_of(("a", "b", "c"), True))
    for t in range(3):
        step = good_step(t)
        if ended_agent and t == 2:
            step["terminated"]["a"] = np.array([True, False])
        buf.add(**step)
    return buf


def good_step(t: int, n: int = 2) -> dict[str, Any]:
    """A valid step of the agents a, b, c in ``n`` envs, every agent acting."""
    rng = np.random.default_rng(t)
    agents = ("a", "b", "c")
    return {
        "obs": {a: rng.normal(size=(n, *SHAPES[a][0])) > 0 if a == "c"
                else rng.normal(size=(n, *SHAPES[a][0])) for a in agents},
        "action": {a: rng.integers(0, 5, (n, *ACTIONS[a][0])) for a in agents},
        "reward": {a: rng.normal(size=n) for a in agents},
        "next_obs": {a: rng.normal(size=(n, *SHAPES[a][0])) > 0 if a == "c"
                     else rng.normal(size=(n, *SHAPES[a][0])) for a in agents},
        "terminated": {a: np.zeros(n, bool) for a in agents},
        "truncated": {a: np.zeros(n, bool) for a in agents},
        "state": rng.normal(size=(n, 4)).astype(np.float32),
        "next_state": rng.normal(size=(n, 4)).astype(np.float32),
    }


def _set(arg: str, agent: str | None, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(step: dict[str, Any]) -> None:
        if agent is None:
            step[arg] = value
        else:
            step[arg][agent] = value
    return change


def _drop(arg: str, agent: str) -> Callable[[dict[str, Any]], None]:
    def change(step: dict[str, Any]) -> None:
        del step[arg][agent]
    return change


BAD_VALUES = {
    "obs shape": _set("obs", "a", np.zeros((2, 5))),
    "obs lane dim": _set("obs", "b", np.zeros((2, 2))),
    "obs strings": _set("obs", "a", np.full((2, 3), "x")),
    "obs nested dict": _set("obs", "a", {"x": np.zeros((2, 3))}),
    "obs bool field 2": _set("obs", "c", np.full((2, 2), 2)),
    "next_obs shape": _set("next_obs", "b", np.zeros((2, 2, 3))),
    "next_obs list": _set("next_obs", "a", [[0.0] * 3] * 3),
    "next_obs fraction into bool": _set("next_obs", "c", np.full((2, 2), 0.5)),
    "action fraction": _set("action", "a", np.array([0.5, 1.0])),
    "action nan": _set("action", "c", np.array([np.nan, 1.0])),
    "action shape": _set("action", "b", np.zeros((2, 3))),
    "reward strings": _set("reward", "b", np.array(["1", "2"])),
    "reward shape": _set("reward", "a", np.zeros(3)),
    "reward scalar": _set("reward", "c", 1.0),
    "reward dict": _set("reward", "c", {"x": 1.0}),
    "reward None": _set("reward", "a", None),
    "terminated 2": _set("terminated", "b", np.array([2, 0])),
    "terminated fraction": _set("terminated", "a", np.array([0.5, 0.0])),
    "truncated shape": _set("truncated", "c", np.zeros((2, 1), bool)),
    "truncated strings": _set("truncated", "a", np.array(["no", "no"])),
    "state shape": _set("state", None, np.zeros((2, 3))),
    "state missing": _set("state", None, None),
    "next_state strings": _set("next_state", None, np.full((2, 4), "s")),
    "an unknown agent": _set("reward", "q", np.zeros(2)),
    "'state' in obs": _set("obs", "state", np.zeros((2, 4))),
    "a missing agent": _drop("truncated", "b"),
    "obs not a dict": _set("obs", None, np.zeros((2, 3))),
}


@needs_compiled
@pytest.mark.parametrize("change", list(BAD_VALUES.values()), ids=list(BAD_VALUES))
def test_a_bad_value_raises_the_checked_paths_error_and_changes_nothing(
        change: Callable[[dict[str, Any]], None]) -> None:
    errors = []
    for force_checked in (True, False):
        buf = _setup()
        before = bits(buf.state_dict())
        step = good_step(7)
        change(step)
        with pytest.raises(Exception) as info:
            if force_checked:
                with checked_path():
                    buf.add(**step)
            else:
                buf.add(**step)
        errors.append((type(info.value), str(info.value)))
        assert bits(buf.state_dict()) == before
        buf.add(**good_step(8))  # still usable
        assert len(buf) == 8
    assert errors[0] == errors[1]
    assert errors[0][0].__module__ == "replaybank.errors"


@needs_compiled
def test_an_agent_acting_after_its_end_raises_and_changes_nothing() -> None:
    errors = []
    for force_checked in (True, False):
        buf = _setup(ended_agent=True)
        before = bits(buf.state_dict())
        with pytest.raises(Exception) as info:
            if force_checked:
                with checked_path():
                    buf.add(**good_step(7))
            else:
                buf.add(**good_step(7))
        errors.append((type(info.value), str(info.value)))
        assert bits(buf.state_dict()) == before
    assert errors[0] == errors[1]
    assert "ended (terminated or truncated) earlier in this episode" in errors[0][1]


def test_ending_steps_through_the_fast_path_keep_the_bookkeeping() -> None:
    """Agents ending one by one and together, through both paths."""
    agents = ("a", "b")
    spec = spec_of(agents, False)
    bufs = [MultiAgentReplayBuffer(12, agents, num_envs=2, seed=1, spec=spec)
            for _ in range(2)]
    calls = []
    for t in range(9):
        step = {k: {a: v for a, v in d.items() if a in agents}
                for k, d in good_step(t).items() if k not in ("state", "next_state")}
        if t % 3 == 2:  # a joint end: a terminated, b truncated in env 0; both in env 1
            step["terminated"]["a"] = np.array([True, True])
            step["truncated"]["b"] = np.array([True, False])
            step["terminated"]["b"] = np.array([False, True])
        calls.append(step)
    for i, buf in enumerate(bufs):
        for step in calls:
            if i:
                buf.add(**step)
            else:
                with checked_path():
                    buf.add(**step)
    same_state(bufs[0], bufs[1])
    batch = bufs[1].sample(len(bufs[1]), replace=False)
    ends = np.asarray(batch.indices) // 2 % 3 == 2
    assert (batch.joint_terminated | batch.joint_truncated).tolist() == ends.tolist()
    env0 = np.asarray(batch.indices) % 2 == 0
    assert batch.joint_truncated.tolist() == (ends & env0).tolist()


# ---------------------------------------------------------------------- batches
def test_a_batch_shows_stored_arrays_where_every_agent_acted() -> None:
    """No copy where nothing needs zeros; zeros (in a new array) where an agent did not
    act, the core batch untouched."""
    buf = MultiAgentReplayBuffer(16, ("a", "b"), seed=0, spec=spec_of(("a", "b"), False))
    for t in range(4):
        step = {k: {a: v[0] for a, v in d.items() if a in ("a", "b")}
                for k, d in good_step(t).items() if k not in ("state", "next_state")}
        if t >= 2:  # b ended at t = 1
            step = {k: {"a": d["a"]} for k, d in step.items()}
        if t == 1:
            step["terminated"]["b"] = True
        buf.add(**step)
    batch = buf.sample(4, replace=False)
    assert isinstance(batch, MultiAgentBatch)
    assert batch.obs["a"] is batch.core["obs/a"]  # a acted everywhere
    inactive = ~batch.active["b"]
    assert inactive.sum() == 2
    assert (batch.obs["b"][inactive] == 0).all() and (batch.next_obs["b"][inactive] == 0).all()
    assert (batch.core["obs/b"][inactive] != 0).any()  # b's placeholder, kept in the core
    seq = buf.sample_sequences(2, 2, strict=False)
    assert seq.obs["a"] is not seq.core["obs/a"]  # windows may share memory: copies


def test_a_frame_stacked_batch_copies_its_overlapping_views() -> None:
    buf = MultiAgentReplayBuffer(16, ("a", "b"), seed=0, frame_stack=2,
                                 spec=spec_of(("a", "b"), False))
    for t in range(4):
        step = {k: {a: v[0] for a, v in d.items() if a in ("a", "b")}
                for k, d in good_step(t).items() if k not in ("state", "next_state")}
        buf.add(**step)
    batch = buf.sample(4)
    a, b = batch.obs["a"], batch.next_obs["a"]
    assert not np.shares_memory(a, b)
    copy.deepcopy(batch.obs)


def test_a_sampled_batch_holds_every_field_and_stays_frozen() -> None:
    buf = _setup()
    b = buf.sample(4)
    names = [f.name for f in dataclasses.fields(MultiAgentBatch)]
    assert sorted(vars(b)) == sorted(names)
    same = MultiAgentBatch(**{n: getattr(b, n) for n in names})
    assert repr(same) == repr(b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.obs = {}  # type: ignore[misc]


def test_a_state_without_placeholders_takes_the_checked_path() -> None:
    """The state of a buffer before its first add has no placeholder observations; a
    buffer that loads it keeps none (prepare's rule): the fast path leaves it to
    prepare, and both store the same."""
    state = MultiAgentReplayBuffer(16, ("a", "b", "c"), num_envs=2, seed=0).state_dict()
    bufs = []
    for force_checked in (True, False):
        buf = MultiAgentReplayBuffer(16, ("a", "b", "c"), num_envs=2, seed=0,
                                     spec=spec_of(("a", "b", "c"), True))
        buf.load_state_dict(state)
        for t in range(4):
            if force_checked:
                with checked_path():
                    buf.add(**good_step(t))
            else:
                buf.add(**good_step(t))
        bufs.append(buf)
    same_state(bufs[0], bufs[1])


def _one_env_step(t: int) -> dict[str, Any]:
    """A valid one-env step as PettingZoo gives it: arrays without a lane dim, Python
    floats and bools."""
    step = {k: {a: v[0] for a, v in d.items()} if isinstance(d, dict) else d[0]
            for k, d in good_step(t, 1).items()}
    for k in ("reward", "terminated", "truncated"):
        step[k] = {a: v.item() for a, v in step[k].items()}
    return step


ONE_ENV_CHANGES = {
    "reward string": _set("reward", "a", "x"),
    "reward complex": _set("reward", "b", 1 + 2j),
    "terminated 2": _set("terminated", "c", 2),
    "truncated None": _set("truncated", "a", None),
    "obs shape": _set("obs", "b", np.zeros(4)),
    "action fraction": _set("action", "a", 0.5),
    "a lane dim on one value (valid)": _set("obs", "a", np.zeros((1, 3))),
    "a lane dim on every value (valid)": lambda step: step.update(
        {k: {a: np.asarray(v)[None] for a, v in d.items()} if isinstance(d, dict)
         else d[None] for k, d in step.items()}),
    "int rewards and flags (valid)": lambda step: step.update(
        reward={a: 1 for a in step["reward"]},
        terminated={a: 0 for a in step["terminated"]}),
}


@needs_compiled
# a complex reward: the fast path's float32 conversion warns before the writer refuses it
# and prepare raises the same DtypeError as ever
@pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning")
@pytest.mark.parametrize("change", list(ONE_ENV_CHANGES.values()), ids=list(ONE_ENV_CHANGES))
def test_one_env_calls_give_the_checked_paths_result(
        change: Callable[[dict[str, Any]], None]) -> None:
    results, states = [], []
    for force_checked in (True, False):
        buf = MultiAgentReplayBuffer(8, ("a", "b", "c"), seed=0,
                                     spec=spec_of(("a", "b", "c"), True))
        for t in range(2):
            buf.add(**_one_env_step(t))
        before = bits(buf.state_dict())
        step = _one_env_step(5)
        change(step)
        try:
            if force_checked:
                with checked_path():
                    buf.add(**step)
            else:
                buf.add(**step)
            results.append(None)
        except Exception as exc:  # compared below
            results.append((type(exc), str(exc)))
            assert bits(buf.state_dict()) == before
        states.append(bits(buf.state_dict()))
    assert results[0] == results[1]
    assert states[0] == states[1]
