"""Gymnasium integration: spaces -> spec, collect in every autoreset mode, warm."""

from __future__ import annotations

import copy
import sys
from typing import Any

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

import replaybank as rb  # noqa: E402
from replaybank.errors import ConfigError, MissingDependencyError, SpecError  # noqa: E402
from replaybank.integrations.gymnasium import Collector, collect, warm  # noqa: E402
from replaybank.integrations.spaces import spec_from_env, spec_from_spaces  # noqa: E402
from replaybank.views.transition import TransitionView  # noqa: E402

MODES = [gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP]


class DictEnv(gym.Env):  # type: ignore[misc]
    """Dict observations, random-length episodes that terminate (and a TimeLimit truncates)."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict({
            "pos": gym.spaces.Box(-10, 10, (2,), np.float32),
            "t": gym.spaces.Discrete(1000),
            "pair": gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.MultiBinary(2))),
        })
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0
        self._pos = np.zeros(2, np.float32)

    def _obs(self) -> dict[str, Any]:
        return {"pos": self._pos.copy(), "t": self._t,
                "pair": (self._t % 3, np.array([self._t % 2, 1], np.int8))}

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self._t = 0
        self._pos = self.np_random.normal(size=2).astype(np.float32)
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        self._t += 1
        self._pos = self._pos + np.float32(int(action) - 0.5)
        reward = float(self.np_random.normal())
        terminated = bool(self.np_random.random() < 0.08)
        return self._obs(), reward, terminated, False, {}


class Recorder(gym.Wrapper):  # type: ignore[misc]
    """Logs every real transition (obs, action, reward, next_obs, term, trunc) of one env."""

    def __init__(self, env: Any, log: list[Any]) -> None:
        super().__init__(env)
        self.log = log
        self.prev: Any = None

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        self.prev = copy.deepcopy(obs)
        return obs, info

    def step(self, action: Any) -> Any:
        obs, r, te, tr, info = self.env.step(action)
        self.log.append((self.prev, copy.deepcopy(action), r, copy.deepcopy(obs), te, tr))
        self.prev = copy.deepcopy(obs)
        return obs, r, te, tr, info


def make_env(name: str) -> Any:
    if name == "dict":
        return gym.wrappers.TimeLimit(DictEnv(), max_episode_steps=15)
    return gym.make(name)


def flat_obs(space: Any, obs: Any) -> dict[str, Any]:
    """Single observation -> {flat field name: array} like the buffer stores it."""
    from replaybank.integrations.spaces import to_fields
    from replaybank.spec import flatten

    return flatten({"obs": to_fields(space, obs)})


def lane_items(buf: Any, lane: int) -> dict[str, Any]:
    t = buf.table
    w, c = int(t.written[lane]), int(t.counts[lane])
    keys = np.arange(w - c, w, dtype=np.int64) * t.lanes + lane
    return TransitionView().gather(t, keys)


def episode_returns_from_buffer(buf: Any) -> list[list[float]]:
    out = []
    for lane in range(buf.num_envs):
        items = lane_items(buf, lane)
        done = items["terminated"] | items["truncated"]
        rets, acc = [], 0.0
        for r, d in zip(items["reward"], done, strict=True):
            acc += float(r)
            if d:
                rets.append(acc)
                acc = 0.0
        out.append(rets)
    return out


def run_vector(name: str, mode: Any, n_envs: int = 3, steps: int = 240) -> Any:
    logs: list[list[Any]] = [[] for _ in range(n_envs)]
    fns = [lambda i=i: Recorder(make_env(name), logs[i]) for i in range(n_envs)]
    envs = gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs, buffer_length=10_000)
    buf = rb.ReplayBuffer(4 * steps * n_envs, num_envs=n_envs, seed=0)
    res = collect(envs, None, buf, steps * n_envs, progress=False, seed=3)
    return envs, buf, res, logs


@pytest.mark.parametrize("mode", [*MODES, gym.vector.AutoresetMode.DISABLED],
                         ids=lambda m: m.value)
@pytest.mark.parametrize("name", ["CartPole-v1", "Pendulum-v1", "dict"])
def test_vector_collect_matches_env_exactly(name: str, mode: Any) -> None:
    steps = 450 if name == "Pendulum-v1" else 120
    envs, buf, res, logs = run_vector(name, mode, steps=steps)
    space = envs.single_observation_space
    assert res.steps == len(buf) == sum(len(lg) for lg in logs)
    for lane, log in enumerate(logs):
        items = lane_items(buf, lane)
        assert len(items["reward"]) == len(log)
        for k, (o, a, r, o2, te, tr) in enumerate(log):
            for fname, val in flat_obs(space, o).items():
                assert np.array_equal(items[fname][k], val), (lane, k, fname)
            for fname, val in flat_obs(space, o2).items():
                assert np.array_equal(items["next_" + fname][k], val), (lane, k, fname)
            assert items["action"][k] == a
            assert items["reward"][k] == np.float32(r)
            assert bool(items["terminated"][k]) == te and bool(items["truncated"][k]) == tr
    # returns: collect's report == RecordEpisodeStatistics == sums of stored rewards
    assert len(res.episode_returns) > 0
    from_buf = sorted(x for lane in episode_returns_from_buffer(buf) for x in lane)
    np.testing.assert_allclose(from_buf, sorted(res.episode_returns), rtol=1e-5, atol=1e-4)
    if mode == gym.vector.AutoresetMode.DISABLED:
        # gymnasium's RecordEpisodeStatistics treats DISABLED like NEXT_STEP (drops the
        # first reward after a masked reset), so only the transition log is the oracle here
        ref, acc = [], 0.0
        for lg in logs:
            for x in lg:
                acc += x[2]
                if x[4] or x[5]:
                    ref.append(acc)
                    acc = 0.0
            acc = 0.0
        assert sorted(res.episode_returns) == sorted(ref)
        return
    assert sorted(res.episode_returns) == sorted(envs.return_queue)
    assert sorted(res.episode_lengths) == sorted(envs.length_queue)
    envs.close()


@pytest.mark.parametrize("name", ["CartPole-v1", "dict"])
def test_single_env_collect(name: str) -> None:
    log: list[Any] = []
    env = gym.wrappers.RecordEpisodeStatistics(Recorder(make_env(name), log), buffer_length=999)
    buf = rb.ReplayBuffer(1000, seed=0)
    res = collect(env, None, buf, 150, progress=False, seed=0)
    assert res.steps == len(buf) == len(log) == 150
    items = lane_items(buf, 0)
    for k, (o, _a, r, o2, te, tr) in enumerate(log):
        for fname, val in flat_obs(env.observation_space, o2).items():
            assert np.array_equal(items["next_" + fname][k], val)
        for fname, val in flat_obs(env.observation_space, o).items():
            assert np.array_equal(items[fname][k], val)
        assert items["reward"][k] == np.float32(r)
        assert bool(items["terminated"][k]) == te and bool(items["truncated"][k]) == tr
    assert res.episode_returns == list(env.return_queue)


def whole_episodes(logs: list[list[Any]], mode: Any) -> tuple[list[Any], int]:
    """The finished episodes of Recorder logs (one per sub-env) in the order a one-lane
    buffer receives them (by the vector step that ends them, then sub-env), concatenated;
    and how many logged steps belong to episodes still running."""
    ends, running = [], 0
    for i, log in enumerate(logs):
        start, resets = 0, 0
        for k, (*_, te, tr) in enumerate(log):
            if te or tr:
                # NEXT_STEP: each earlier episode end cost its sub-env one reset step
                ends.append((k + resets, i, log[start:k + 1]))
                start = k + 1
                resets += mode == gym.vector.AutoresetMode.NEXT_STEP
        running += len(log) - start
    return [tr for *_, ep in sorted(ends, key=lambda e: e[:2]) for tr in ep], running


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_staged_single_lane_buffer_from_vector_env(mode: Any) -> None:
    """A one-lane buffer fed by 2 sub-envs holds their finished episodes, each whole and
    contiguous, in the order they ended; rb.collect leaves the running ones out."""
    logs: list[list[Any]] = [[] for _ in range(2)]
    envs = gym.vector.SyncVectorEnv([lambda i=i: Recorder(gym.make("CartPole-v1"), logs[i])
                                     for i in range(2)], autoreset_mode=mode)
    buf = rb.ReplayBuffer(2000, num_envs=1, seed=0)
    res = collect(envs, None, buf, 200, progress=False, seed=0)
    expected, running = whole_episodes(logs, mode)
    assert res.steps == len(buf) == len(expected) == sum(map(len, logs)) - running >= 200
    items = lane_items(buf, 0)
    np.testing.assert_array_equal(items["next_obs"], np.stack([e[3] for e in expected]))
    np.testing.assert_array_equal(items["obs"], np.stack([e[0] for e in expected]))
    np.testing.assert_array_equal(items["terminated"], [e[4] for e in expected])


def test_collector_continues_across_calls() -> None:
    logs: list[list[Any]] = [[] for _ in range(2)]
    envs = gym.vector.SyncVectorEnv([lambda i=i: Recorder(gym.make("CartPole-v1"), logs[i])
                                     for i in range(2)])
    buf = rb.ReplayBuffer(1000, num_envs=2, seed=0)
    col = Collector(envs, lambda obs: np.zeros(len(obs), np.int64), buf, seed=0)
    total = sum(col.collect(10).steps for _ in range(10))
    assert total == len(buf) == sum(map(len, logs))
    for lane in range(2):
        items = lane_items(buf, lane)
        np.testing.assert_array_equal(items["next_obs"], np.stack([e[3] for e in logs[lane]]))
        assert np.all(items["action"] == 0)


def test_async_vector_env_returns() -> None:
    envs = gym.vector.AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2,
                                     autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs, buffer_length=999)
    buf = rb.ReplayBuffer(1000, num_envs=2, seed=0)
    res = collect(envs, None, buf, 300, progress=False, seed=0)
    envs.close()
    assert sorted(res.episode_returns) == sorted(envs.return_queue)
    from_buf = [x for lane in episode_returns_from_buffer(buf) for x in lane]
    assert sorted(from_buf) == sorted(envs.return_queue)
    # an episode end never links to the next episode's reset observation
    for lane in range(2):
        items = lane_items(buf, lane)
        done = np.flatnonzero(items["terminated"] | items["truncated"])
        done = done[done + 1 < len(items["obs"])]
        assert not np.any(np.all(items["next_obs"][done] == items["obs"][done + 1], axis=1))


def test_spec_from_spaces_all_kinds() -> None:
    sp = gym.spaces
    obs = sp.Dict({"img": sp.Box(0, 255, (3, 4), np.uint8),
                   "tup": sp.Tuple((sp.Discrete(3), sp.MultiDiscrete([2, 5]))),
                   "bits": sp.MultiBinary(4),
                   "f64": sp.Box(-1, 1, (2,), np.float64)})
    spec = spec_from_spaces(obs, sp.Box(-1, 1, (6,), np.float32))
    got = {n: (f.shape, f.dtype.name) for n, f in spec.items()}
    assert got == {
        "obs/img": ((3, 4), "uint8"), "obs/tup/0": ((), "int64"),
        "obs/tup/1": ((2,), "int64"), "obs/bits": ((4,), "int8"),
        "obs/f64": ((2,), "float64"), "action": ((6,), "float32"),
        "reward": ((), "float32"), "terminated": ((), "bool"), "truncated": ((), "bool"),
    }
    with pytest.raises(SpecError, match="Text"):
        spec_from_spaces(sp.Text(5), sp.Discrete(2))


def test_spec_from_env_vector_and_buffer_accepts_it() -> None:
    envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    spec = spec_from_env(envs)
    assert spec["obs"].shape == (4,) and spec["action"].dtype == np.int64
    buf = rb.ReplayBuffer(100, num_envs=2, spec=spec, seed=0)
    collect(envs, None, buf, 20, progress=False, seed=0)
    assert buf.spec == spec


@pytest.mark.parametrize("num_envs", [3, 2])
def test_a_vector_envs_tuple_observation_is_refused_naming_the_dict(num_envs: int) -> None:
    """Blackjack-v1's Tuple observation, from a vector env: a tuple of one array per part
    (each ``[num_envs]``). Added as it comes it would be stacked part-first (with 3 envs,
    each lane would hold one part of every env): refused, naming the dict, which then
    stores each env's own observation in its lane."""
    envs = gym.make_vec("Blackjack-v1", num_envs=num_envs, vectorization_mode="sync")
    obs, _ = envs.reset(seed=0)
    act = np.zeros(num_envs, np.int64)  # stick: every episode ends this step
    nxt, rew, term, trunc, _ = envs.step(act)
    buf = rb.ReplayBuffer(30, num_envs=num_envs, seed=0)
    with pytest.raises(rb.ShapeError, match=r"^obs=\(array\(shape=\(" + str(num_envs)
                       + r",\).*a tuple holding arrays.*obs=\{'0': obs\[0\], '1': obs\[1\], "
                       r"'2': obs\[2\]\}"):
        buf.add(obs=obs, action=act, reward=rew, next_obs=nxt, terminated=term,
                truncated=trunc)
    assert buf.spec is None

    def parts(value: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        return {str(i): v for i, v in enumerate(value)}

    buf.add(obs=parts(obs), action=act, reward=rew, next_obs=parts(nxt), terminated=term,
            truncated=trunc)
    b = buf.sample(num_envs, replace=False)
    for row, lane in enumerate(b.indices % num_envs):
        assert [int(b.obs[str(i)][row]) for i in range(3)] == [int(x[lane]) for x in obs]


class Agent:
    """velora-style agent: .env with a spec id, .predict(obs, hidden, train_mode)."""

    def __init__(self) -> None:
        self.env = gym.make("CartPole-v1")
        self.calls = 0

    def predict(self, obs: Any, hidden: Any, train_mode: bool = False) -> Any:
        self.calls += 1
        return np.ones(len(obs), np.int64), hidden


def test_warm_from_agent_env_id() -> None:
    agent = Agent()
    buf = rb.ReplayBuffer(512, num_envs=4, seed=0)
    res = rb.warm(buf, agent, 100, num_envs=4, progress=False, seed=0)
    assert len(buf) >= 100 and res.steps == len(buf) and agent.calls > 0
    assert np.all(lane_items(buf, 0)["action"] == 1)
    assert rb.warm(buf, agent, 50, num_envs=4, progress=False).steps == 0  # already full enough


def test_warm_factory_single_lane_and_progress() -> None:
    buf = rb.ReplayBuffer(300, seed=0)
    warm(buf, None, 120, num_envs=3, env=lambda: gym.make("Pendulum-v1"), progress=True)
    assert len(buf) >= 120
    assert buf.spec is not None and buf.spec["action"].shape == (1,)


def test_warm_errors_leave_buffer_unchanged() -> None:
    buf = rb.ReplayBuffer(100, num_envs=2, seed=0)
    with pytest.raises(ConfigError, match="capacity=100"):
        rb.warm(buf, None, 101, num_envs=2, env="CartPole-v1")
    with pytest.raises(ConfigError, match="env="):
        rb.warm(buf, lambda obs: obs, 10, num_envs=2)  # a policy has no agent.env
    with pytest.raises(ConfigError, match="agent_or_policy="):
        rb.warm(buf, object(), 10, num_envs=2, env="CartPole-v1")
    with pytest.raises(ConfigError, match="num_envs=2"):
        rb.warm(buf, None, 10, num_envs=3, env="CartPole-v1")
    with pytest.raises(ConfigError, match="n_samples"):
        rb.warm(buf, None, 0, num_envs=2, env="CartPole-v1")
    assert len(buf) == 0


def test_missing_gymnasium_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    with pytest.raises(MissingDependencyError, match=r'pip install "replaybank\[gym\]"'):
        spec_from_spaces(None, None)
    with pytest.raises(ImportError):
        Collector(None, None, rb.ReplayBuffer(10))


def test_warm_torch_agent_gets_tensors_and_returns_tensors() -> None:
    torch = pytest.importorskip("torch")

    class TorchAgent:
        def __init__(self) -> None:
            self.device = torch.device("cpu")
            self.env = gym.make("CartPole-v1")
            self.seen: list[Any] = []

        def predict(self, obs: Any, hidden: Any, train_mode: bool = False) -> Any:
            self.seen.append(type(obs))
            return torch.zeros(obs.shape[0], dtype=torch.int64), hidden

    agent = TorchAgent()
    buf = rb.ReplayBuffer(64, num_envs=2, seed=0)
    rb.warm(buf, agent, 20, num_envs=2, progress=False, seed=0)
    assert len(buf) >= 20 and set(agent.seen) == {torch.Tensor}
    assert np.all(lane_items(buf, 1)["action"] == 0)


class _RecurrentAgent:
    """velora's agent interface: ``env`` and ``predict(states, hidden, train_mode)``
    returning ``(actions, hidden)``; the hidden state encodes how many calls came before."""

    def __init__(self, hidden_dim: int = 3) -> None:
        self.env = gym.make("CartPole-v1")
        self.hidden_dim = hidden_dim
        self.returned: list[np.ndarray] = []

    def predict(self, states: Any, hidden: Any, train_mode: bool = False) -> Any:
        n = len(states)
        prev = np.zeros((n, self.hidden_dim), np.float32) if hidden is None else hidden
        new = (prev + 1).astype(np.float32)
        new[:, 1] = np.asarray(states)[:, 0]  # tie the state to this step's observation
        self.returned.append(new.copy())
        return (np.asarray(states)[:, 2] > 0).astype(np.int64), new


def test_warm_stores_the_hidden_state_the_agent_returns() -> None:
    """rb.warm with a velora-style agent and a buffer that has a ``hidden`` field stores,
    beside each step, the hidden state predict returned for that step's observation."""
    spec = {"obs": ((4,), "float32"), "action": ((), "int64"), "hidden": ((3,), "float32")}
    buf = rb.ReplayBuffer(400, num_envs=4, spec=spec, seed=0, autoreset_mode="next_step")
    agent = _RecurrentAgent()
    res = rb.warm(buf, agent, 200, num_envs=4, progress=False, seed=0)
    assert res.steps >= 200 and len(buf) == res.steps
    t = buf.table
    rows = int(t.written[0])
    hidden = t.arrays["hidden"][:rows]  # [rows, 4, 3], lane-major like every field
    obs = t.arrays["obs"][:rows]
    # column 1 of the stored hidden state is the stored step's obs[0]: stored together
    np.testing.assert_array_equal(hidden[:, :, 1], obs[:, :, 0])
    # column 0 counts the predict calls: one per vector step
    assert hidden[:, :, 0].max() == len(agent.returned)


def test_warm_without_a_hidden_field_and_a_stateless_policy() -> None:
    """Without a ``hidden`` field the state is not stored; a policy returning no state
    for a buffer that wants one gets a clear error."""
    buf = rb.ReplayBuffer(200, num_envs=2, seed=0)
    rb.warm(buf, _RecurrentAgent(), 50, num_envs=2, progress=False, seed=0)
    assert "hidden" not in buf.spec

    class Stateless:
        env = gym.make("CartPole-v1")

        def predict(self, states: Any, hidden: Any, train_mode: bool = False) -> Any:
            return np.zeros(len(states), np.int64)

    spec = {"obs": ((4,), "float32"), "action": ((), "int64"), "hidden": ((3,), "float32")}
    want = rb.ReplayBuffer(200, num_envs=2, spec=spec, seed=0)
    with pytest.raises(rb.ConfigError, match="no hidden state"):
        rb.warm(want, Stateless(), 50, num_envs=2, progress=False, seed=0)
    assert len(want) == 0


def test_collect_names_envs_it_cannot_drive() -> None:
    """An SB3 VecEnv (SB3's step API) and a single env into a buffer of several lanes
    are refused with what to pass (the first said the env had 1 sub-env, then failed in
    reset(seed=); the second advised 'num_envs=1 ... or num_envs=1')."""
    vec_env = pytest.importorskip("stable_baselines3.common.vec_env")
    venv = vec_env.DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2)
    for lanes in (2, 1):
        buf = rb.ReplayBuffer(64, num_envs=lanes, seed=0)
        with pytest.raises(ConfigError, match=r"SB3 VecEnv.*SyncVectorEnv.*replay_buffer_cl"):
            rb.collect(venv, None, buf, n_steps=8)
        assert not buf.allocated
    with pytest.raises(ConfigError, match="the env is a single env; build the buffer with "
                                          "num_envs=1, or pass a gymnasium vector env"):
        rb.collect(gym.make("CartPole-v1"), None, rb.ReplayBuffer(64, num_envs=2), n_steps=8)


@pytest.mark.parametrize("lanes", [2, 1], ids=["buffer per env", "one-lane buffer"])
def test_collect_refuses_a_tuple_of_actions_before_env_step(lanes: int) -> None:
    """A policy giving a vector env's actions as a tuple of arrays: refused by the tuple
    rule of the add boundary before ``env.step``, also on the first step (the buffer has
    no fields yet). A one-lane buffer fed by a vector env holds the steps, and took the
    tuple's parts as its envs' actions: it stored them."""
    envs = gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync")
    stepped: list[Any] = []
    step = envs.step

    def counted(action: Any) -> Any:
        stepped.append(action)
        return step(action)

    envs.step = counted  # type: ignore[method-assign]
    buf = rb.ReplayBuffer(64, num_envs=lanes, seed=0)
    with pytest.raises(rb.ShapeError, match=r"^collect\(policy=\.\.\.\): the buffer refuses "
                       r"the policy's action: action=\(array\(shape=\(1,\).*a tuple holding "
                       r"arrays is.*\[env\.step was not called"):
        collect(envs, lambda obs: (np.zeros(1, np.float32), np.ones(1, np.float32)), buf,
                10, progress=False, seed=0)
    assert stepped == [] and len(buf) == 0 and buf.spec is None
