"""Adding every step of a NEXT_STEP-autoreset gymnasium vector env: the false
"final obs -> reset obs" steps are detected (a warning with the fix) or dropped
(``autoreset_mode="next_step"``); real transitions are never touched."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.buffers.autoreset import AutoresetWarning, reset_steps
from replaybank.errors import ConfigError

gym = pytest.importorskip("gymnasium")


def _hand_loop(buf: Any, mode: Any, steps: int = 300, n: int = 4,
               seed: int = 0) -> tuple[int, list[tuple[np.ndarray, np.ndarray]]]:
    """The loop a user writes: add every env's step, ``obs = next_obs``. Returns how many
    steps the env's NEXT_STEP resets produced, and the real transitions (obs, next_obs)."""
    envs = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": mode})
    obs, _ = envs.reset(seed=seed)
    rng = np.random.default_rng(seed)
    ended = np.zeros(n, bool)
    resets = 0
    real: list[tuple[np.ndarray, np.ndarray]] = []
    for _ in range(steps):
        action = rng.integers(0, 2, n)
        nxt, reward, term, trunc, info = envs.step(action)
        final = nxt.copy()
        if mode == gym.vector.AutoresetMode.SAME_STEP and "final_obs" in info:
            for i in np.flatnonzero(info["_final_obs"]):  # the true last observation
                final[i] = info["final_obs"][i]
        buf.add(obs=obs, action=action, reward=reward, next_obs=final, terminated=term,
                truncated=trunc)
        if mode == gym.vector.AutoresetMode.NEXT_STEP:
            resets += int(ended.sum())
            real += [(obs[i].copy(), nxt[i].copy()) for i in range(n) if not ended[i]]
            ended = term | trunc
        else:
            real += [(obs[i].copy(), final[i].copy()) for i in range(n)]
        obs = nxt
    envs.close()
    return resets, real


def test_next_step_loop_warns_once_with_the_fix() -> None:
    buf = rb.ReplayBuffer(4000, num_envs=4, seed=0)
    resets, _ = _hand_loop(buf, gym.vector.AutoresetMode.NEXT_STEP)
    assert resets > 10
    with pytest.warns(AutoresetWarning, match=r"autoreset_mode='next_step'.*env_ids=.*rb\.collect"):
        buf.sample(8)
    assert reset_steps(buf.table) == resets  # every false step found, nothing else
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(8):  # once per buffer
            buf.sample(8)


def test_next_step_mode_drops_exactly_the_reset_steps() -> None:
    buf = rb.ReplayBuffer(4000, num_envs=4, seed=0, autoreset_mode="next_step")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resets, real = _hand_loop(buf, gym.vector.AutoresetMode.NEXT_STEP)
        buf.sample(8)
    assert resets > 10
    assert len(buf) == 300 * 4 - resets
    assert reset_steps(buf.table) == 0
    # what is stored is exactly the real transitions, next_obs included
    stored = [(o, n) for o, n in real]
    batch_obs = {o.tobytes(): n.tobytes() for o, n in stored}
    got = buf.sample(len(buf), replace=False)
    for o, n in zip(got.obs, got.next_obs, strict=True):
        assert batch_obs[o.tobytes()] == n.tobytes()


def test_same_step_data_is_never_flagged_or_dropped() -> None:
    for mode in (None, "next_step"):
        buf = rb.ReplayBuffer(4000, num_envs=4, seed=0, autoreset_mode=mode)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _hand_loop(buf, gym.vector.AutoresetMode.SAME_STEP)
            buf.sample(8)
        assert len(buf) == 1200


def test_add_extend_and_env_ids_in_next_step_mode() -> None:
    """Synthetic lanes: an episode end, then the reset step (obs = the final obs): dropped
    from add, extend and env_ids calls alike; the steps after it are kept."""
    buf = rb.ReplayBuffer(64, num_envs=2, seed=0, autoreset_mode="next_step")

    def o(*v: float) -> np.ndarray:
        return np.array(v, np.float32)[:, None].repeat(3, 1)  # [lanes, 3]

    f = np.zeros(2, bool)
    buf.add(obs=o(0, 0), action=np.zeros(2), reward=np.ones(2), next_obs=o(1, 1),
            terminated=np.array([True, False]), truncated=f)
    # lane 0 resets now (its obs is its final obs 1); lane 1 continues from 1
    buf.add(obs=o(1, 1), action=np.zeros(2), reward=np.zeros(2), next_obs=o(7, 2),
            terminated=f, truncated=f)
    assert buf.table.counts.tolist() == [1, 2]
    # lane 1 alone: an end at 2 -> 3, the reset step 3 -> 5, then 5 -> 6 (extend)
    steps = np.array([2, 3, 5], np.float32)[:, None, None].repeat(3, 2)  # [3, 1, 3]
    nxt = np.array([3, 5, 6], np.float32)[:, None, None].repeat(3, 2)
    buf.extend(env_ids=[1], obs=steps, next_obs=nxt, action=np.zeros((3, 1)),
               reward=np.ones((3, 1)), terminated=np.array([[True], [False], [False]]),
               truncated=np.zeros((3, 1), bool))
    assert buf.table.counts.tolist() == [1, 4]
    got = buf.sample(5, replace=False)
    pairs = sorted(zip(got.obs[:, 0].tolist(), got.next_obs[:, 0].tolist(), strict=True))
    assert pairs == [(0.0, 1.0), (0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (5.0, 6.0)]


def test_mode_is_checked_configured_and_kept() -> None:
    with pytest.raises(ConfigError, match="autoreset_mode='nextstep'"):
        rb.ReplayBuffer(8, autoreset_mode="nextstep")
    buf = rb.ReplayBuffer(8, autoreset_mode="next_step")
    assert rb.from_config(buf.config()).autoreset_mode == "next_step"
    assert pickle.loads(pickle.dumps(buf)).autoreset_mode == "next_step"


class _Stay(gym.Env):  # type: ignore[misc]
    """An env whose reset observation is its final one: the agent starts and ends every
    episode on one cell (a bandit's constant observation, a grid world pushed into a
    wall). Episodes of 1 to 3 steps; rewards 0 except on a terminating step."""

    observation_space = gym.spaces.Box(0, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(1, 4))
        return np.zeros(2, np.float32), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        end = self.t >= self.length
        term = end and bool(action)
        return (np.zeros(2, np.float32), float(term), term, end and not term, {})


def _stay_loop(buf: Any, steps: int, n: int = 3, seed: int = 0) -> list[tuple[int, int]]:
    """Every step of a NEXT_STEP vector env of :class:`_Stay` added; returns the real
    transitions as (lane, action) in order (an action code is stored per step)."""
    envs = gym.vector.SyncVectorEnv([_Stay] * n)
    obs, _ = envs.reset(seed=seed)
    ended = np.zeros(n, bool)
    real: list[tuple[int, int]] = []
    for t in range(steps):
        action = np.array([(t * n + i) % 2 for i in range(n)])
        code = np.arange(n) + n * t  # which step it was
        nxt, reward, term, trunc, _ = envs.step(action)
        buf.add(obs=obs, action=code, reward=reward, next_obs=nxt, terminated=term,
                truncated=trunc)
        real += [(i, int(code[i])) for i in range(n) if not ended[i]]
        ended = term | trunc
        obs = nxt
    envs.close()
    return real


def test_next_step_mode_drops_one_step_per_episode_end_when_reset_obs_is_the_final_obs(
        tmp_path: Any) -> None:
    """A reset observation equal to the final one: only the reset step after each episode
    end is dropped (before, every later step from that observation was dropped too: 20
    real steps of a bandit, 2 stored); also across a checkpoint taken right after a
    dropped reset step (the buffer saves what it dropped)."""
    buf = rb.ReplayBuffer(3000, num_envs=3, seed=0, autoreset_mode="next_step")
    real = _stay_loop(buf, 200)
    assert len(buf) == len(real) < 600
    stored = buf.sample(len(buf), replace=False)
    assert sorted(stored.action.astype(int).tolist()) == sorted(code for _, code in real)

    def reset_pending() -> Any:
        b = rb.ReplayBuffer(16, seed=0, autoreset_mode="next_step")
        z = np.zeros(2, np.float32)
        b.add(obs=z, action=0, reward=1.0, next_obs=z, terminated=True, truncated=False)
        b.add(obs=z, action=1, reward=0.0, next_obs=z, terminated=False, truncated=False)
        assert len(b) == 1  # the reset step, dropped
        return b

    b = reset_pending()
    b.save(tmp_path / "ck")
    copies = [rb.load(tmp_path / "ck"), pickle.loads(pickle.dumps(b))]
    c = rb.ReplayBuffer(16, seed=0, autoreset_mode="next_step")
    c.load_state_dict(b.state_dict())
    m = rb.ReplayBuffer(16, seed=0, autoreset_mode="next_step", storage="memmap",
                        path=tmp_path / "mm")
    m.load_state_dict(b.state_dict())
    m.flush()
    del m
    copies += [c, rb.open(tmp_path / "mm")]
    z = np.zeros(2, np.float32)
    for copy_ in copies:  # the episode's first real step, from the same observation
        copy_.add(obs=z, action=2, reward=1.0, next_obs=z, terminated=True, truncated=False)
        assert len(copy_) == 2


def test_clear_after_an_episode_end_still_drops_the_reset_step(tmp_path: Any) -> None:
    """``clear()`` right after an episode end: the env's next step is still that episode's
    reset step (final obs -> reset obs) and is dropped, also across a checkpoint taken
    between the clear and that step; a fresh start from another observation is kept
    (before, the emptied buffer kept the reset step as a transition)."""
    o = lambda v: np.full((2, 2), v, np.float32)  # noqa: E731 - two lanes

    def cleared() -> Any:
        b = rb.ReplayBuffer(16, num_envs=2, seed=0, autoreset_mode="next_step")
        b.add(obs=o(1), action=[0, 0], reward=[1.0, 1.0], next_obs=o(2),
              terminated=[False, False], truncated=[False, False])
        b.add(obs=o(2), action=[0, 0], reward=[1.0, 1.0], next_obs=o(3),
              terminated=[True, False], truncated=[False, False])  # lane 0 ends
        b.clear()
        return b

    b = cleared()
    b.save(tmp_path / "ck")
    c = rb.ReplayBuffer(16, num_envs=2, seed=0, autoreset_mode="next_step")
    c.load_state_dict(cleared().state_dict())
    m = rb.ReplayBuffer(16, num_envs=2, seed=0, autoreset_mode="next_step",
                        storage="memmap", path=tmp_path / "mm")
    m.load_state_dict(cleared().state_dict())
    m.flush()
    del m
    for buf in (b, rb.load(tmp_path / "ck"), c, rb.open(tmp_path / "mm"),
                pickle.loads(pickle.dumps(b))):
        # lane 0's reset step (obs 3, the final obs) and lane 1's real step
        buf.add(obs=o(3), action=[0, 1], reward=[0.0, 1.0], next_obs=o(100),
                terminated=[False, False], truncated=[False, False])
        buf.add(obs=o(100), action=[2, 2], reward=[1.0, 1.0], next_obs=o(101),
                terminated=[False, False], truncated=[False, False])
        got = buf.sample(len(buf), replace=False)
        pairs = sorted(zip(got.obs[:, 0].tolist(), got.next_obs[:, 0].tolist(),
                           (got.indices % 2).tolist(), strict=True))
        assert pairs == [(3.0, 100.0, 1), (100.0, 101.0, 0), (100.0, 101.0, 1)], pairs
    fresh = cleared()  # the user reset the env instead: its first step is real
    fresh.add(obs=o(7), action=[0, 0], reward=[1.0, 1.0], next_obs=o(8),
              terminated=[False, False], truncated=[False, False])
    assert len(fresh) == 2
    again = cleared()  # a second clear keeps lane 0 armed
    again.clear()
    again.add(obs=o(3), action=[0, 0], reward=[0.0, 0.0], next_obs=o(4),
              terminated=[False, False], truncated=[False, False])
    assert len(again) == 1


def test_a_damaged_autoreset_state_is_refused_and_changes_nothing() -> None:
    buf = rb.ReplayBuffer(16, seed=0, autoreset_mode="next_step")
    _stay_loop(buf, 5, n=1)
    state = buf.state_dict()
    before = len(buf)
    state["autoreset"] = {"dropped": np.zeros(2, bool)}
    with pytest.raises(rb.CheckpointError, match="autoreset/dropped"):
        buf.load_state_dict(state)
    assert len(buf) == before
    state["autoreset"] = {"dropped": np.zeros(1, bool), "armed": np.ones(1, bool)}
    with pytest.raises(rb.CheckpointError, match="autoreset/final/obs"):
        buf.load_state_dict(state)  # an armed lane without its final observation
    assert len(buf) == before
    del state["autoreset"]  # a checkpoint of an older version: nothing dropped yet
    buf.load_state_dict(state)
    assert not buf.write_route.resets.dropped.any()


def test_collect_into_a_next_step_buffer_stores_every_real_transition() -> None:
    """``rb.collect`` leaves NEXT_STEP reset steps out itself; into a buffer that drops them
    itself it hands every step over, so nothing is dropped twice."""
    out = {}
    for mode in (None, "next_step"):
        envs = gym.vector.SyncVectorEnv([_Stay] * 3)
        buf = rb.ReplayBuffer(3000, num_envs=3, seed=0, autoreset_mode=mode)
        res = rb.collect(envs, lambda o: np.ones(3, np.int64), buf, n_steps=90, seed=1)
        assert len(buf) == res.steps
        out[mode] = sorted(map(tuple, np.stack([buf.table.written, buf.table.episodes])
                               .T.tolist()))
    assert out[None] == out["next_step"]
    one = rb.ReplayBuffer(64, seed=0, autoreset_mode="next_step")
    with pytest.raises(ConfigError, match="autoreset_mode=None"):
        rb.collect(gym.vector.SyncVectorEnv([_Stay] * 3), None, one, n_steps=9)
