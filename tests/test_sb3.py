"""replaybank.integrations.sb3: SB3's DQN/SAC train with the replaybank buffers (uniform,
n-step, PER); what a DummyVecEnv returned is what the buffer serves (truncation included,
checked against a plain record of every env step and a plain-loop n-step reference);
save_replay_buffer / load_replay_buffer restore the identical next sample; and (slow) the
learning proof of examples/sb3_per_dqn.py.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")
torch = pytest.importorskip("torch")

from stable_baselines3 import DQN, SAC, TD3  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

from replaybank.errors import ConfigError, ShapeError, SpecError  # noqa: E402
from replaybank.integrations.sb3 import (  # noqa: E402
    DictReplayBuffer,
    PrioritizedDQN,
    PrioritizedSAC,
    PrioritizedTD3,
    ReplayBuffer,
)
from replaybank.ops import ring  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE = EXAMPLES / "sb3_per_dqn.py"

DQN_SMALL: dict[str, Any] = {"learning_starts": 100, "train_freq": 4, "batch_size": 32,
                             "buffer_size": 1000, "policy_kwargs": {"net_arch": [16]}}


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


BUFFER_KWARGS = {
    "uniform": {},
    "nstep": {"n_steps": 3, "gamma": 0.99},
    "per": {"prioritized": True, "n_steps": 3, "gamma": 0.99, "beta_steps": 100},
}


# ---------------------------------------------------------------- SB3 trains with them
@pytest.mark.parametrize("kind", sorted(BUFFER_KWARGS))
def test_dqn_trains(kind: str) -> None:
    cls = PrioritizedDQN if kind == "per" else DQN
    model = cls("MlpPolicy", "CartPole-v1", seed=0, replay_buffer_class=ReplayBuffer,
                replay_buffer_kwargs=BUFFER_KWARGS[kind], **DQN_SMALL)
    model.learn(300)
    buf = model.replay_buffer
    assert isinstance(buf, ReplayBuffer)
    assert len(buf.core) == 300 and buf.size() == 300
    assert model._n_updates == 50  # (300 - 100) / train_freq gradient steps
    if kind == "per":  # |td| went back as priorities: they are no longer all equal
        _, prio = buf.sample_prioritized(256)
        assert prio is not None and float(prio.weights.std()) > 0
        assert float(prio.weights.max()) <= 1.0 + 1e-6


@pytest.mark.parametrize("kind", ["uniform", "nstep"])
def test_sac_trains(kind: str) -> None:
    model = SAC("MlpPolicy", "Pendulum-v1", seed=0, learning_starts=100, batch_size=32,
                buffer_size=1000, policy_kwargs={"net_arch": [16]},
                replay_buffer_class=ReplayBuffer, replay_buffer_kwargs=BUFFER_KWARGS[kind])
    model.learn(250)
    data = model.replay_buffer.sample(8)  # type: ignore[union-attr]
    assert tuple(data.actions.shape) == (8, 1) and data.actions.dtype == torch.float32
    assert (data.discounts is None) == (kind == "uniform")


def test_prioritized_dqn_with_a_plain_buffer_is_dqn() -> None:
    ours = PrioritizedDQN("MlpPolicy", "CartPole-v1", seed=0, **DQN_SMALL).learn(150)
    theirs = DQN("MlpPolicy", "CartPole-v1", seed=0, **DQN_SMALL).learn(150)
    assert ours._n_updates == theirs._n_updates > 0
    for x, y in zip(ours.q_net.parameters(), theirs.q_net.parameters(), strict=True):
        assert torch.equal(x, y)


def test_refusals() -> None:
    box = gym.spaces.Box(-1, 1, (2,))
    with pytest.raises(ConfigError, match="optimize_memory_usage"):
        ReplayBuffer(10, box, gym.spaces.Discrete(2), optimize_memory_usage=True)
    with pytest.raises(ConfigError, match="Dict"):
        DictReplayBuffer(10, box, gym.spaces.Discrete(2))
    with pytest.raises(ConfigError, match="priorities"):
        ReplayBuffer(10, box, gym.spaces.Discrete(2), seed=0).update_priorities([0], [1.0])
    # a buffer of 4 envs (e.g. loaded with load_replay_buffer) fed a 1-env model's step:
    # named, not numpy's reshape error, and nothing stored
    four = ReplayBuffer(40, box, gym.spaces.Discrete(2), n_envs=4, seed=0)
    with pytest.raises(ShapeError, match="done has 1 values but this buffer holds n_envs=4"):
        four.add(np.zeros((1, 2)), np.zeros((1, 2)), np.zeros(1), np.zeros(1),
                 np.zeros(1, bool), [{}])
    assert four.size() == 0


# ---------------------------------------------------------------- exact semantics
class Recorder(gym.Wrapper):  # type: ignore[misc]
    """Keeps every step the env returned: (obs, action, reward, next_obs, term, trunc)."""

    def __init__(self, env: Any, log: list[tuple[Any, ...]]) -> None:
        super().__init__(env)
        self.log = log
        self.last: Any = None

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        self.last = obs.copy()
        return obs, info

    def step(self, action: Any) -> Any:
        obs, reward, term, trunc, info = self.env.step(action)
        self.log.append((self.last, int(action), float(reward), obs.copy(), term, trunc))
        self.last = obs.copy()
        return obs, reward, term, trunc, info


def recorded_run(n_steps: int, steps: int = 300) -> tuple[Any, list[list[tuple[Any, ...]]]]:
    """Random-action DQN collection on 2 CartPole envs with time limits 12 and 30."""
    logs: list[list[tuple[Any, ...]]] = [[], []]

    def make(i: int) -> Any:
        return lambda: Recorder(gym.make("CartPole-v1", max_episode_steps=(12, 30)[i]), logs[i])

    env = DummyVecEnv([make(0), make(1)])
    model = DQN("MlpPolicy", env, seed=1, learning_starts=10_000, buffer_size=10_000,
                replay_buffer_class=ReplayBuffer,
                replay_buffer_kwargs={"n_steps": n_steps, "gamma": 0.5})
    model.learn(steps)
    return model.replay_buffer, logs


def nstep_reference(log: list[tuple[Any, ...]], t: int, n: int, gamma: float) -> tuple[Any, ...]:
    """Plain loop: (G, discount, next_obs, done) of step t of one env's record."""
    g, k = 0.0, 0
    while True:
        _, _, r, nxt, term, trunc = log[t + k]
        g += gamma**k * r
        k += 1
        if term or trunc or k == n or t + k == len(log):
            return g, gamma**k, nxt, float(term)


@pytest.mark.parametrize("n_steps", [1, 3])
def test_vector_env_truncation_matches_the_record(n_steps: int) -> None:
    buf, logs = recorded_run(n_steps)
    assert len(buf.core) == sum(len(log) for log in logs) == 304  # 152 steps of 2 envs
    truncs = sum(1 for log in logs for s in log if s[5] and not s[4])
    terms = sum(1 for log in logs for s in log if s[4])
    assert truncs >= 3 and terms >= 3  # both kinds of episode end were seen
    ref = {}
    for log in logs:
        for t, (obs, action, *_rest) in enumerate(log):
            ref[obs.tobytes() + bytes([action])] = nstep_reference(log, t, n_steps, 0.5)
    data = buf.sample(4000)
    seen = set()
    for i in range(4000):
        obs = data.observations[i].numpy()
        key = obs.tobytes() + bytes([int(data.actions[i, 0])])
        g, discount, nxt, done = ref[key]  # every sample is a real step
        seen.add(key)
        assert float(data.rewards[i, 0]) == pytest.approx(g)
        np.testing.assert_array_equal(data.next_observations[i].numpy(), nxt)
        assert float(data.dones[i, 0]) == done  # a truncation bootstraps: dones 0
        if n_steps == 1:
            assert data.discounts is None
        else:
            assert float(data.discounts[i, 0]) == pytest.approx(discount)
    assert seen == set(ref)  # every stored step was drawn


# Time-outs without done (issue: hardening, SB3 semantics): a step whose info says
# TimeLimit.truncated=True while done=False (SB3's own VecEnvs never produce it; other
# VecEnvs and hand-written adds can). SB3 stores `timeouts` apart from `dones`: its
# NStepReplayBuffer cuts the n-step return at the first step with done OR timeout and
# serves `dones * (1 - timeout)` of that step; its ReplayBuffer serves the step's own
# next_obs with dones 0. Each kind of step below, per env: (done, TimeLimit.truncated,
# next obs continues into the next add).
TIMEOUT_EVENTS: dict[tuple[int, int], tuple[bool, bool, bool]] = {
    (1, 0): (False, True, True),    # time-out without done, the env goes on
    (2, 1): (False, True, False),   # time-out without done, the next add starts elsewhere
    (3, 2): (True, True, False),    # SB3's usual time-out: done and truncated
    (4, 0): (True, False, False),   # termination
    (5, 0): (False, True, True),    # a time-out right after a reset
    (5, 1): (True, False, False),
    (7, 2): (False, True, True),
    (8, 1): (False, True, False),
    (9, 0): (True, True, False),
    (10, 2): (True, False, False),
    (11, 1): (False, True, True),
    (12, 0): (False, True, False),  # the newest step: a time-out without done
}


def _timeout_adds(steps: int, n_envs: int = 3, jumps: bool = True) -> list[tuple[Any, ...]]:
    """SB3 ``add`` arguments of ``steps`` steps of ``n_envs`` envs: observation
    ``[t, env]`` (each step's own key), integer rewards (exact sums with gamma 0.5), and
    the episode ends and time-outs of :data:`TIMEOUT_EVENTS` (a final observation that
    is not the next add's observation has ``+ 0.5``; ``jumps=False``: a time-out without
    done always continues)."""
    adds = []
    for t in range(steps):
        obs = np.array([[t, e] for e in range(n_envs)], np.float32)
        nxt = np.array([[t + 1, e] for e in range(n_envs)], np.float32)
        done = np.zeros(n_envs, bool)
        infos: list[dict[str, Any]] = []
        for e in range(n_envs):
            ended, timeout, goes_on = TIMEOUT_EVENTS.get((t, e), (False, False, True))
            goes_on = goes_on or (not ended and not jumps)
            done[e] = ended
            if not goes_on:
                nxt[e, 0] += 0.5
            infos.append({"TimeLimit.truncated": timeout} if ended or timeout else {})
        action = np.array([(t + e) % 4 for e in range(n_envs)])
        reward = np.array([1 + (t + 2 * e) % 3 for e in range(n_envs)], np.float32)
        adds.append((obs, nxt, action, reward, done, infos))
    return adds


def _sb3_full_read(buf: Any, monkeypatch: pytest.MonkeyPatch) -> dict[bytes, tuple[Any, ...]]:
    """Every stored (row, env) of an SB3 buffer through its own ``_get_samples`` (the env
    of each index pinned), keyed by the observation's bytes: (obs, action, next_obs, done,
    reward, discount)."""
    rows = buf.buffer_size if buf.full else buf.pos
    inds = np.repeat(np.arange(rows), buf.n_envs)
    envs = np.tile(np.arange(buf.n_envs), rows)
    with monkeypatch.context() as m:  # SB3 draws the env of each index with randint
        m.setattr(np.random, "randint", lambda *args, **kwargs: envs.copy())
        data = buf._get_samples(inds)
    out = {}
    for i in range(len(inds)):
        obs = data.observations[i].numpy()
        disc = None if data.discounts is None else float(data.discounts[i, 0])
        out[obs.tobytes()] = (obs, float(data.actions[i, 0]), data.next_observations[i].numpy(),
                              float(data.dones[i, 0]), float(data.rewards[i, 0]), disc)
    return out


@pytest.mark.parametrize("handle_timeouts", [True, False])
@pytest.mark.parametrize("steps", [8, 13])  # 8 rows per env: filling, then wrapped
@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("n_steps", [1, 3])
def test_timeout_without_done_is_served_as_sb3_serves_it(
        n_steps: int, prioritized: bool, steps: int, handle_timeouts: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same adds into SB3's buffer (NStepReplayBuffer for n > 1) and ours: every
    stored transition gives the same obs, action, next_obs, dones, reward and discount
    (with ``handle_timeout_termination=False`` SB3 ignores the time-outs: a done is a
    termination, a time-out without done nothing; there a time-out without done continues
    into the next add, since a next_obs that does not, without an episode end, is a break
    that SB3 bridges and replaybank's n-step window stops at)."""
    from stable_baselines3.common.buffers import NStepReplayBuffer
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    box, act = gym.spaces.Box(-100, 100, (2,)), gym.spaces.Discrete(4)
    common: dict[str, Any] = {"device": "cpu", "n_envs": 3,
                              "handle_timeout_termination": handle_timeouts}
    theirs = (NStepReplayBuffer(24, box, act, n_steps=n_steps, gamma=0.5, **common)
              if n_steps > 1 else SB3ReplayBuffer(24, box, act, **common))
    ours = ReplayBuffer(24, box, act, n_steps=n_steps, gamma=0.5, prioritized=prioritized,
                        seed=0, **common)
    for args in _timeout_adds(steps, jumps=handle_timeouts):
        theirs.add(*args)
        ours.add(*args)
    ref = _sb3_full_read(theirs, monkeypatch)
    assert len(ref) == len(ours.core) == 3 * min(steps, 8)
    data = ours.sample(3000)
    seen = set()
    for i in range(3000):
        obs = data.observations[i].numpy()
        key = obs.tobytes()
        seen.add(key)
        _, action, nxt, done, reward, discount = ref[key]  # one of SB3's transitions
        where = f"step {obs.tolist()}"
        assert float(data.actions[i, 0]) == action, where
        np.testing.assert_array_equal(data.next_observations[i].numpy(), nxt, err_msg=where)
        assert float(data.dones[i, 0]) == done, where
        assert float(data.rewards[i, 0]) == reward, where  # integer rewards: exact
        if discount is None:
            assert data.discounts is None
        else:
            assert float(data.discounts[i, 0]) == discount, where
    assert seen == set(ref)  # every stored transition was compared


def test_timeout_without_done_ends_the_nstep_return() -> None:
    """The issue's numbers: rewards 1, gamma 0.5, 3 steps, a time-out without done at the
    first step: SB3's return is 1.0 (discount 0.5, next_obs that step's), not 1.75."""
    box = gym.spaces.Box(-10, 10, (1,))
    buf = ReplayBuffer(16, box, gym.spaces.Discrete(2), device="cpu", n_steps=3, gamma=0.5,
                       seed=0)
    for t in range(4):
        buf.add(np.full((1, 1), t), np.full((1, 1), t + 1), np.array([0]), np.ones(1),
                np.array([False]), [{"TimeLimit.truncated": t == 0}])
    data = buf.sample(64)
    first = data.observations[:, 0] == 0
    assert bool(first.any())
    assert data.rewards[first].unique().tolist() == [1.0]
    assert data.discounts[first].unique().tolist() == [0.5]
    assert data.next_observations[first].unique().tolist() == [1.0]
    assert data.dones[first].unique().tolist() == [0.0]


def test_timeouts_as_terminations_when_asked() -> None:
    box = gym.spaces.Box(-10, 10, (1,))
    buf = ReplayBuffer(16, box, gym.spaces.Discrete(2), device="cpu",
                       handle_timeout_termination=False, seed=0)
    buf.add(np.zeros((1, 1)), np.ones((1, 1)), np.array([0]), np.ones(1), np.array([True]),
            [{"TimeLimit.truncated": True}])
    assert float(buf.sample(4).dones.min()) == 1.0


def test_dict_observations() -> None:
    space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,)), "b": gym.spaces.Discrete(4)})
    buf = DictReplayBuffer(32, space, gym.spaces.Box(-1, 1, (3,)), device="cpu", n_envs=2,
                           n_steps=2, gamma=0.5, prioritized=True, seed=0)
    for t in range(6):
        o = {"a": np.full((2, 2), t, np.float32), "b": np.array([t % 4, (t + 1) % 4])}
        n = {"a": np.full((2, 2), t + 1, np.float32), "b": np.array([(t + 1) % 4, t % 4])}
        buf.add(o, n, np.zeros((2, 3)), np.ones(2), np.array([t == 5, False]),
                [{}, {"TimeLimit.truncated": False}])
    data, prio = buf.sample_prioritized(16)
    assert prio is not None
    assert tuple(data.observations["a"].shape) == (16, 2)
    assert tuple(data.observations["b"].shape) == (16, 1)
    lane0 = prio.indices % 2 == 0
    a0 = data.observations["a"][lane0, 0].numpy()
    nxt0 = data.next_observations["a"][lane0, 0].numpy()
    np.testing.assert_array_equal(nxt0, np.minimum(a0 + 2, 6))  # 2 steps, ended at t=5



def test_dict_observation_keys_that_are_not_the_space_s_are_named() -> None:
    """A key the space lacks was a bare ``KeyError: 'extra'`` from the reshape; a nested
    space failed in ``FieldSpec`` ("shape=('deep', 'flag'): expected a tuple of ints")."""
    space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,)), "id": gym.spaces.Discrete(3)})
    buf = DictReplayBuffer(32, space, gym.spaces.Discrete(2), device="cpu", seed=0)
    good = {"pos": np.zeros((1, 2), np.float32), "id": np.array([1])}
    step = (np.array([1]), np.ones(1), np.array([False]), [{}])
    with pytest.raises(SpecError, match=r"next_obs has the keys \['pos', 'id', 'extra'\] "
                                        r"\(not in the space \['extra'\]\)"):
        buf.add(good, {**good, "extra": np.zeros((1, 2))}, *step)
    with pytest.raises(SpecError, match=r"obs has the keys \['pos'\] \(missing \['id'\]\)"):
        buf.add({"pos": good["pos"]}, good, *step)
    with pytest.raises(SpecError, match="obs is a ndarray, but the observation space is a Dict"):
        buf.add(good["pos"], good, *step)
    assert buf.size() == 0 and len(buf.core) == 0  # nothing stored
    buf.add(good, good, *step)
    assert buf.size() == 1
    nested = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,)),
                              "goal": gym.spaces.Dict({"xy": gym.spaces.Box(-1, 1, (2,))})})
    with pytest.raises(ConfigError, match="the entry 'goal' is a Dict space; SB3 takes a Dict"):
        DictReplayBuffer(32, nested, gym.spaces.Discrete(2), device="cpu", seed=0)

# ---------------------------------------------------------------- save / load
@pytest.mark.parametrize("kind", ["uniform", "per"])
def test_save_load_replay_buffer_gives_the_identical_next_sample(kind: str,
                                                                 tmp_path: Path) -> None:
    cls = PrioritizedDQN if kind == "per" else DQN
    env = DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2)
    model = cls("MlpPolicy", env, seed=0, replay_buffer_class=ReplayBuffer,
                replay_buffer_kwargs=BUFFER_KWARGS[kind], **DQN_SMALL)
    model.learn(300)
    model.save_replay_buffer(tmp_path / "rb.pkl")
    other = cls("MlpPolicy", env, seed=5, replay_buffer_class=ReplayBuffer,
                replay_buffer_kwargs=BUFFER_KWARGS[kind], **DQN_SMALL)
    other.load_replay_buffer(tmp_path / "rb.pkl")
    a, b = model.replay_buffer, other.replay_buffer
    assert isinstance(a, ReplayBuffer) and isinstance(b, ReplayBuffer)
    assert b.size() == a.size() and b.pos == a.pos and len(b.core) == len(a.core)
    for _ in range(3):
        (sa, pa), (sb, pb) = a.sample_prioritized(64), b.sample_prioritized(64)
        for x, y in zip(sa, sb, strict=True):
            assert (x is None and y is None) or torch.equal(x, y)
        if kind == "per":
            assert pa is not None and pb is not None
            np.testing.assert_array_equal(pa.indices, pb.indices)
            assert torch.equal(pa.weights, pb.weights)
            a.update_priorities(pa.indices, np.arange(64.0))
            b.update_priorities(pb.indices, np.arange(64.0))
    before = other.num_timesteps
    other.learn(50, reset_num_timesteps=False)  # training goes on with the loaded buffer
    assert len(b.core) == len(a.core) + other.num_timesteps - before > len(a.core)


# ---------------------------------------------------------------- PER for SAC and TD3


def ac_small() -> dict[str, Any]:
    """Small SAC/TD3 settings (a new policy_kwargs each time: SB3 writes into it)."""
    return {"learning_starts": 100, "batch_size": 32, "buffer_size": 1000,
            "policy_kwargs": {"net_arch": [16]}}

AC = {"sac": (SAC, PrioritizedSAC), "td3": (TD3, PrioritizedTD3)}
# what each loop has to get right: gradient steps per call, target updates every other
# step (SAC), the policy delay (TD3), a fixed or tuned entropy coefficient, gSDE
AC_VARIANTS: dict[str, dict[str, Any]] = {
    "sac": {"gradient_steps": 3, "target_update_interval": 2},
    "sac_fixed_ent": {"ent_coef": 0.1, "train_freq": 2},
    "sac_sde": {"use_sde": True, "sde_sample_freq": 4},
    "td3": {"gradient_steps": 3, "policy_delay": 2},
}


def _state(model: Any) -> list[Any]:
    """Every learned tensor of an SB3 model (policy, targets, entropy coefficient)."""
    out = [p.detach().clone() for p in model.policy.state_dict().values()]
    if getattr(model, "log_ent_coef", None) is not None:
        out.append(model.log_ent_coef.detach().clone())
    return out


@pytest.mark.parametrize("buffer", ["sb3", "uniform", "nstep"])
@pytest.mark.parametrize("variant", sorted(AC_VARIANTS))
def test_prioritized_sac_td3_with_a_plain_buffer_are_sb3(variant: str, buffer: str) -> None:
    """Same seed, a buffer without priorities: our training loop is SB3's, bit for bit."""
    theirs_cls, ours_cls = AC[variant.split("_")[0]]
    kwargs = {**ac_small(), **AC_VARIANTS[variant]}
    if buffer != "sb3":
        kwargs.update(replay_buffer_class=ReplayBuffer,
                      replay_buffer_kwargs=BUFFER_KWARGS[buffer])
    ours = ours_cls("MlpPolicy", "Pendulum-v1", seed=3, **copy.deepcopy(kwargs)).learn(160)
    theirs = theirs_cls("MlpPolicy", "Pendulum-v1", seed=3, **kwargs).learn(160)
    assert ours._n_updates == theirs._n_updates >= 30
    for x, y in zip(_state(ours), _state(theirs), strict=True):
        assert torch.equal(x, y)
    assert ours.logger.name_to_value == theirs.logger.name_to_value


def test_critic_loss_weights_by_hand() -> None:
    """Two critics, a batch of 2: 0.5 * sum_i mean_b(w_b (Q_i - y_b)^2), max |td|."""
    from replaybank.integrations.sb3 import PrioritySample, _critic_loss

    q1, q2 = torch.tensor([[1.0], [2.0]]), torch.tensor([[0.0], [4.0]])
    y = torch.tensor([[2.0], [1.0]])
    w = PrioritySample(np.array([7, 9]), torch.tensor([[1.0], [0.5]]))
    # Q1: errors -1, 1 -> (1*1 + 0.5*1)/2 = 0.75; Q2: errors -2, 3 -> (1*4 + 0.5*9)/2 = 4.25
    assert float(_critic_loss([q1, q2], y, w)) == pytest.approx(5.0)
    # unweighted: SB3's mse sum (1 + 6.5)
    assert float(_critic_loss([q1, q2], y, None)) == pytest.approx(7.5)


def _filled(cls: type, gamma: float = 0.5, **kwargs: Any) -> Any:
    """A prioritized 3-step model with 40 random Pendulum steps (short episodes, so the
    batch mixes full windows with cut ones) and unequal priorities, not yet trained."""
    env = gym.make("Pendulum-v1", max_episode_steps=7)
    model = cls("MlpPolicy", env, seed=0, learning_starts=10**6, gamma=gamma,
                policy_kwargs={"net_arch": [8]}, replay_buffer_class=ReplayBuffer,
                replay_buffer_kwargs={"prioritized": True, "alpha": 1.0, "n_steps": 3,
                                      "gamma": gamma, "seed": 1}, **kwargs)
    model.learn(40)
    model.replay_buffer.update_priorities(np.arange(40), np.arange(1.0, 41.0))
    return model


def _spy(model: Any) -> dict[str, Any]:
    """Record what train() draws and what it feeds back as priorities."""
    buf = model.replay_buffer
    seen: dict[str, Any] = {}
    draw, update = buf.sample_prioritized, buf.update_priorities

    def sample_prioritized(*args: Any, **kwargs: Any) -> Any:
        seen["data"], seen["prio"] = out = draw(*args, **kwargs)
        return out

    def update_priorities(indices: Any, priorities: Any) -> int:
        seen["keys"], seen["td"] = np.asarray(indices), np.asarray(priorities)
        return update(indices, priorities)

    buf.sample_prioritized, buf.update_priorities = sample_prioritized, update_priorities
    return seen


def _check_feedback(model: Any, seen: dict[str, Any], q: list[Any], y: Any) -> None:
    """The priorities fed back are max_i |Q_i - y| and the buffer stores |td| + eps."""
    td = torch.maximum((q[0] - y).abs(), (q[1] - y).abs()).reshape(-1).numpy()
    np.testing.assert_array_equal(seen["keys"], seen["prio"].indices)
    np.testing.assert_allclose(seen["td"], td, rtol=1e-5, atol=1e-6)
    core = model.replay_buffer.core
    keys, counts = np.unique(seen["keys"], return_counts=True)
    once = np.isin(seen["keys"], keys[counts == 1])  # drawn once: no ambiguity
    assert once.sum() >= 4
    stored = core.sampler.priorities(ring.key_to_slot(seen["keys"][once], core.rows, 1))
    np.testing.assert_allclose(stored, td[once] + core.sampler.eps, rtol=1e-5)


def _check_discounts(data: Any, gamma: float) -> None:
    """The batch carries n-step discounts: gamma**3 for full windows, less cut ones."""
    d = data.discounts.reshape(-1).numpy()
    assert (d == np.float32(gamma**3)).any() and (d != np.float32(gamma**3)).any()


def test_prioritized_td3_weights_discounts_and_priorities_by_hand() -> None:
    model = _filled(PrioritizedTD3, target_policy_noise=0.0, policy_delay=2)
    critic, critic_t, actor_t = (copy.deepcopy(m) for m in
                                 (model.critic, model.critic_target, model.actor_target))
    seen = _spy(model)
    model.train(1, batch_size=16)
    data, prio = seen["data"], seen["prio"]
    w = prio.weights
    assert float(w.std()) > 0 and float(w.max()) <= 1.0 + 1e-6
    _check_discounts(data, 0.5)
    with torch.no_grad():  # the TD3 target by hand (noise 0: the target actor's action)
        a2 = actor_t(data.next_observations).clamp(-1, 1)
        q_next = torch.minimum(*critic_t(data.next_observations, a2))
        y = data.rewards + (1 - data.dones) * data.discounts * q_next
        q = list(critic(data.observations, data.actions))
        expected = sum(float((w * (qi - y) ** 2).mean()) for qi in q)
        unweighted = sum(float(((qi - y) ** 2).mean()) for qi in q)
    assert model.logger.name_to_value["train/critic_loss"] == pytest.approx(expected, 1e-5)
    assert abs(expected - unweighted) > 1e-3 * abs(unweighted)  # the weights mattered
    _check_feedback(model, seen, q, y)


def test_prioritized_sac_weights_discounts_and_priorities_by_hand() -> None:
    model = _filled(PrioritizedSAC)
    actor, critic, critic_t = (copy.deepcopy(m) for m in
                               (model.actor, model.critic, model.critic_target))
    ent_coef = float(torch.exp(model.log_ent_coef.detach()))
    rng = torch.get_rng_state()
    seen = _spy(model)
    model.train(1, batch_size=16)
    data, prio = seen["data"], seen["prio"]
    w = prio.weights
    assert float(w.std()) > 0
    _check_discounts(data, 0.5)
    torch.set_rng_state(rng)  # the actor's draws again: pi(s), then pi(s')
    with torch.no_grad():
        actor.action_log_prob(data.observations)
        a2, logp2 = actor.action_log_prob(data.next_observations)
        q_next = torch.minimum(*critic_t(data.next_observations, a2))
        v_next = q_next - ent_coef * logp2.reshape(-1, 1)
        y = data.rewards + (1 - data.dones) * data.discounts * v_next
        q = list(critic(data.observations, data.actions))
        expected = 0.5 * sum(float((w * (qi - y) ** 2).mean()) for qi in q)
    assert model.logger.name_to_value["train/critic_loss"] == pytest.approx(expected, 1e-5)
    _check_feedback(model, seen, q, y)


@pytest.mark.parametrize("algo", sorted(AC))
def test_prioritized_sac_td3_train(algo: str) -> None:
    """A few hundred steps of PER + 3-step: every gradient step feeds priorities back."""
    cls = AC[algo][1]
    model = cls("MlpPolicy", "Pendulum-v1", seed=0, replay_buffer_class=ReplayBuffer,
                replay_buffer_kwargs=BUFFER_KWARGS["per"], **ac_small())
    buf = model.replay_buffer
    calls = []
    update = buf.update_priorities
    buf.update_priorities = lambda k, p: calls.append(len(k)) or update(k, p)  # type: ignore
    model.learn(300)
    assert model._n_updates == 200 and calls == [32] * 200
    _, prio = buf.sample_prioritized(256)
    assert prio is not None and float(prio.weights.std()) > 0
    assert np.isfinite(model.logger.name_to_value["train/critic_loss"])


@pytest.mark.parametrize("algo", sorted(AC))
def test_prioritized_sac_td3_save_load(algo: str, tmp_path: Path) -> None:
    """model.save / load keeps the class; the replay buffer's priorities come back and
    training goes on feeding them."""
    cls = AC[algo][1]
    model = cls("MlpPolicy", "Pendulum-v1", seed=0, replay_buffer_class=ReplayBuffer,
                replay_buffer_kwargs=BUFFER_KWARGS["per"], **ac_small()).learn(200)
    model.save(tmp_path / "model.zip")
    model.save_replay_buffer(tmp_path / "rb.pkl")
    loaded = cls.load(tmp_path / "model.zip", env=gym.make("Pendulum-v1"))
    assert type(loaded) is cls
    for x, y in zip(_state(model), _state(loaded), strict=True):
        assert torch.equal(x, y)
    loaded.load_replay_buffer(tmp_path / "rb.pkl")
    a, b = model.replay_buffer, loaded.replay_buffer
    assert isinstance(b, ReplayBuffer) and b.prioritized
    (_, pa), (_, pb) = a.sample_prioritized(64), b.sample_prioritized(64)
    np.testing.assert_array_equal(pa.indices, pb.indices)  # same priorities, same draw
    assert torch.equal(pa.weights, pb.weights)
    before = loaded._n_updates
    loaded.learn(50, reset_num_timesteps=False)
    assert loaded._n_updates == before + 50


def test_sac_example_smoke() -> None:
    ex = _example(EXAMPLES / "sb3_per_sac.py")
    for buffer in ex.BUFFERS:
        ret = ex.sac_return(buffer, seed=0, steps=300, eval_episodes=1,
                            net_arch=[16], learning_starts=200)
        assert -2000 < ret <= 0


# ---------------------------------------------------------------- the learning proof
def _example(path: Path = EXAMPLE) -> Any:
    spec = importlib.util.spec_from_file_location(f"{path.stem}_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_per_nstep_dqn_solves_cartpole_in_fewer_steps_on_average() -> None:
    """Seeds 0-2, 50k-step budgets: PER + 3-step solves every seed, in fewer env steps on
    average than SB3's own buffer (measured: 11k/12k/15k against 5k/36k/28k). The issue's
    stronger claim, fewer steps on every seed, does not hold for seed 0: SB3's 5k there is
    a lucky draw (replaybank's uniform one-step buffer, the same algorithm, needs 28k), and
    no shared PER setting tried solves seed 0 before 7k (uniform 3-step: 7k/6k/7k); the
    ablation table is in examples/sb3_per_dqn.py."""
    ex = _example()
    ours = [ex.steps_to_solve("replaybank", s, 50_000) for s in range(3)]
    theirs = [ex.steps_to_solve("sb3", s, 50_000) for s in range(3)]
    assert all(o is not None for o in ours), ours
    budget = 50_000
    assert np.mean(ours) < np.mean([budget if t is None else t for t in theirs]), (ours, theirs)


@pytest.mark.slow
def test_sac_matches_sb3_buffer_on_pendulum() -> None:
    ex = _example()
    ours = [ex.sac_return("replaybank", s, 10_000) for s in range(3)]
    theirs = [ex.sac_return("sb3", s, 10_000) for s in range(3)]
    # within noise: the means differ by less than the spread of the runs (or 100)
    spread = max(np.std(ours), np.std(theirs), 100.0)
    assert abs(np.mean(ours) - np.mean(theirs)) < 2 * spread, (ours, theirs)
    assert np.mean(ours) > -400, ours  # solved-ish (random policy: about -1200)


@pytest.mark.slow
def test_per_sac_matches_sb3_buffer_on_pendulum() -> None:
    """PrioritizedSAC with the replaybank PER buffer against SAC with SB3's own buffer,
    seeds 0-2, 10k env steps (examples/sb3_per_sac.py). Measured: PER -123.1 / -185.2 /
    -118.2 (mean -142.2) against SB3's buffer -121.9 / -186.1 / -118.1 (mean -142.0)."""
    ex = _example(EXAMPLES / "sb3_per_sac.py")
    ours = [ex.sac_return("per", s, 10_000) for s in range(3)]
    theirs = [ex.sac_return("sb3", s, 10_000) for s in range(3)]
    # within noise: the means differ by less than the spread of the runs (or 100)
    spread = max(np.std(ours), np.std(theirs), 100.0)
    assert abs(np.mean(ours) - np.mean(theirs)) < 2 * spread, (ours, theirs)
    assert np.mean(ours) > -400, ours  # solved-ish (random policy: about -1200)
