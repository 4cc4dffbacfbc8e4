"""rb.collect / rb.Collector against a plain-Python oracle of what the env really did.

A ``VectorWrapper`` records every ``step`` of a real gymnasium vector env (deep copies);
the oracle turns that record into each sub-env's true transitions (NEXT_STEP reset steps
left out, SAME_STEP final observations swapped in) and its episodes, and the tests check
what the buffers serve against it:

* a one-lane buffer fed by several sub-envs gets every episode whole and contiguous,
  over many ``collect`` calls (n-step returns, sequences' ``is_first``, HER's "final"
  goal as with one lane per sub-env), holds at most ``max_held`` steps back, and
  ``flush`` appends them;
* what env and policy return reaches the buffer's one checked cast unchanged (no cast to
  the space's dtype first);
* vector envs built with ``copy=False`` (their observation array updated in place) are
  stored exactly;
* data that only the collector wrote draws no AutoresetWarning, while hand-written
  NEXT_STEP steps are still counted exactly.
"""

from __future__ import annotations

import copy
import re
import warnings
from typing import Any

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

import replaybank as rb  # noqa: E402
from replaybank.buffers.autoreset import AutoresetWarning, reset_steps  # noqa: E402

AM = gym.vector.AutoresetMode
GAMMA, N_STEP = 0.9, 3


class Record(gym.vector.VectorWrapper):  # type: ignore[misc]
    """Every vector step as (obs, action, reward, next_obs, terminated, truncated,
    final_obs), deep-copied (an env built with copy=False reuses its arrays)."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.log: list[tuple[Any, ...]] = []
        self.last: Any = None

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        self.last = copy.deepcopy(obs)
        return obs, info

    def step(self, action: Any) -> Any:
        obs, r, te, tr, info = self.env.step(action)
        self.log.append((self.last, copy.deepcopy(np.asarray(action)), np.array(r),
                         copy.deepcopy(obs), np.array(te), np.array(tr),
                         copy.deepcopy(info.get("final_obs"))))
        self.last = copy.deepcopy(obs)
        return obs, r, te, tr, info


def _row(tree: Any, i: int) -> Any:
    return {k: _row(v, i) for k, v in tree.items()} if isinstance(tree, dict) else tree[i]


def episodes(rec: Record, mode: Any) -> tuple[list[list[dict[str, Any]]], list[list[Any]]]:
    """The oracle: ``(finished, running)``. ``finished``: every finished episode (a list of
    true transitions) in the order a one-lane buffer receives them (by the vector step
    that ends it, then sub-env); ``running``: each sub-env's steps of its running one."""
    n = rec.num_envs
    running: list[list[Any]] = [[] for _ in range(n)]
    finished: list[list[dict[str, Any]]] = []
    pending = np.zeros(n, bool)
    for o, a, r, o2, te, tr, final in rec.log:
        for i in range(n):
            if mode == AM.NEXT_STEP and pending[i]:
                continue  # the reset step: not a transition
            nxt = final[i] if mode == AM.SAME_STEP and (te[i] or tr[i]) else _row(o2, i)
            running[i].append({"obs": _row(o, i), "action": a[i], "reward": float(r[i]),
                               "next_obs": nxt, "terminated": bool(te[i]),
                               "truncated": bool(tr[i])})
            if te[i] or tr[i]:
                finished.append(running[i])
                running[i] = []
        pending = te | tr
    return finished, running


def nstep_truth(eps: list[list[dict[str, Any]]]
                ) -> dict[bytes, tuple[float, float, bool] | None]:
    """obs bytes -> (n-step return, discount, terminated) by the documented formula, or
    None where the window runs past the known steps of a running episode."""
    out: dict[bytes, tuple[float, float, bool] | None] = {}
    for ep in eps:
        for t, step in enumerate(ep):
            g, length, known = 0.0, 0, True
            for k in range(N_STEP):
                if t + k >= len(ep):
                    known = False  # (a finished episode ends with done: never here)
                    break
                g += GAMMA ** k * ep[t + k]["reward"]
                length = k + 1
                if ep[t + k]["terminated"] or ep[t + k]["truncated"]:
                    break
            out[np.asarray(step["obs"], np.float32).tobytes()] = (
                g, GAMMA ** length, ep[t + length - 1]["terminated"]) if known else None
    return out


def cartpole(n: int, mode: Any, **kwargs: Any) -> Record:
    return Record(gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync",
                               max_episode_steps=40,
                               vector_kwargs={"autoreset_mode": mode, **kwargs}))


# ---------------------------------------------------------------- finding 2: one lane
@pytest.mark.parametrize("mode", [AM.NEXT_STEP, AM.SAME_STEP, AM.DISABLED],
                         ids=lambda m: m.value)
def test_one_lane_buffer_gets_whole_episodes_over_many_collect_calls(mode: Any) -> None:
    """3 sub-envs into one lane, collect(20) six times: the lane is exactly the finished
    episodes, whole, in the order they ended; the running ones are held (``held``) and
    flush() appends them. n-step returns and sequence starts match the oracle (they
    were cut at every collect() call before)."""
    rec = cartpole(3, mode)
    buf = rb.ReplayBuffer(3000, seed=0, n_step=N_STEP, gamma=GAMMA)
    col = rb.Collector(rec, None, buf, seed=0)
    steps = [col.collect(20).steps for _ in range(6)]
    finished, running = episodes(rec, mode)
    truth = nstep_truth([*finished, *running])
    got = buf.sample(len(buf), replace=False)
    assert len({o.tobytes() for o in got.obs}) == len(buf)
    for o, r, d, te in zip(got.obs, got.reward, got.discount, got.terminated, strict=True):
        want = truth[o.tobytes()]
        assert want is not None, "a window of a running episode is in the buffer"
        assert np.isclose(r, want[0], atol=1e-5) and np.isclose(d, want[1])
        assert te == want[2]
    # sequences crossing episode ends: is_first exactly at the episodes' first steps
    firsts = {np.asarray(ep[0]["obs"], np.float32).tobytes()
              for ep in [*finished, *running] if ep}
    seq = buf.sample_sequences(64, 8, episode_boundary="cross")
    for obs_row, first_row, mask_row in zip(seq.obs, seq.is_first, seq.mask, strict=True):
        for o, first, live in zip(obs_row, first_row, mask_row, strict=True):
            if live:
                assert bool(first) == (o.tobytes() in firsts)
    # the lane holds exactly the finished episodes; each call added >= 20 of their steps
    assert len(buf) == sum(map(len, finished)) == sum(steps) and min(steps) >= 20
    assert col.held == sum(map(len, running)) > 0
    # flush: the running episodes' steps so far, appended
    held = col.held
    assert col.flush() == held and col.held == 0 and len(buf) == sum(map(len, finished)) + held


def test_one_lane_her_final_goal_is_the_episode_final_goal() -> None:
    """HER "final" on FetchReach through a one-lane buffer fed by 2 sub-envs over six
    collect(13) calls: every relabelled row's goal is its episode's final achieved goal,
    and only finished episodes are relabelled (both failed for hundreds of rows)."""
    robotics = pytest.importorskip("gymnasium_robotics")
    gym.register_envs(robotics)
    rec = Record(gym.vector.SyncVectorEnv(  # episodes of 10 and 7 steps: out of step
        [lambda t=t: gym.make("FetchReach-v4", max_episode_steps=t) for t in (10, 7)]))
    reward_fn = gym.make("FetchReach-v4").unwrapped.compute_reward
    her = rb.HerReplayBuffer(capacity=1000, num_envs=1, reward_fn=reward_fn,
                             strategy="final", k=4, seed=0)
    col = rb.Collector(rec, None, her, seed=0)
    for _ in range(6):
        col.collect(13)
    finished, running = episodes(rec, AM.NEXT_STEP)
    final = {np.asarray(s["action"], np.float32).tobytes(): ep[-1]["next_obs"]["achieved_goal"]
             for ep in finished for s in ep}
    batch = her.sample(1000)
    rows = np.flatnonzero(batch["relabeled"])
    assert len(rows) > 500
    unfinished = [r for r in rows if batch.action[r].tobytes() not in final]
    assert not unfinished, "rows of running episodes were relabelled"
    wrong = [r for r in rows if not np.array_equal(batch.obs["desired_goal"][r],
                                                   final[batch.action[r].tobytes()])]
    assert not wrong, f"{len(wrong)} rows did not get their episode's final goal"
    assert len(her) == len(final) == sum(map(len, finished))
    assert col.held == sum(map(len, running))


class Forever(gym.Env):  # type: ignore[misc]
    """Counts up and never ends an episode: obs is the step number."""

    observation_space = gym.spaces.Box(0, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 1000.0 * self.np_random.integers(100)
        return np.array([self.t], np.float32), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        return np.array([self.t], np.float32), 1.0, False, False, {}


def test_one_lane_held_steps_are_bounded_and_reset_appends_them() -> None:
    """Episodes that never end: at most max_held steps are held (the longest sub-env's
    prefix goes in past that), so collect() returns; every stored step is a true one.
    reset() appends held steps (as flush() does: one lane per sub-env keeps a running
    episode's stored steps at a reset too), then resets the envs; a bad max_held is
    refused by name."""
    envs = gym.vector.SyncVectorEnv([Forever] * 2)
    buf = rb.ReplayBuffer(200, seed=0)
    col = rb.Collector(envs, None, buf, seed=0, max_held=10)
    res = col.collect(30)
    assert res.steps == len(buf) >= 30 and col.held <= 10
    got = buf.sample(len(buf), replace=False)
    np.testing.assert_array_equal(got.next_obs, got.obs + 1)
    held, stored = col.held, len(buf)
    assert held > 0
    col.reset()
    assert col.held == 0 and len(buf) == stored + held
    got = buf.sample(len(buf), replace=False)
    np.testing.assert_array_equal(got.next_obs, got.obs + 1)
    # the cut episodes do not continue into the new ones (the envs restart at t=0)
    col.collect(30)
    col.flush()
    got = buf.sample(len(buf), replace=False)
    np.testing.assert_array_equal(got.next_obs, got.obs + 1)
    seq = buf.sample_sequences(256, 2)  # windows never cross a cut
    np.testing.assert_array_equal(seq.obs[:, 1], seq.obs[:, 0] + 1)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(rb.ConfigError, match=rf"max_held={bad!r}.*positive int"):
            rb.Collector(envs, None, rb.ReplayBuffer(200), max_held=bad)
    # default bound: the buffer's capacity
    assert rb.Collector(envs, None, rb.ReplayBuffer(64)).stage.max_held == 64


def test_one_lane_rollout_buffer_is_refused_with_the_fix() -> None:
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    with pytest.raises(rb.ConfigError, match=r"episodes whole.*num_envs=2"):
        rb.Collector(envs, None, rb.RolloutBuffer(16, num_envs=1))


# ---------------------------------------------------------------- finding 3: one cast
class Frames(gym.Env):  # type: ignore[misc]
    """uint8 frames, a Box(int32) action space; remembers the action it executed."""

    observation_space = gym.spaces.Box(0, 255, (2, 2), np.uint8)
    action_space = gym.spaces.Box(-5, 5, (2,), np.int32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return np.full((2, 2), 51, np.uint8), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        self.last_action = np.array(action)
        return np.full((2, 2), 51 + self.t, np.uint8), 1.0, False, self.t == 4, {}


def scaled() -> Any:
    """The common wrapper slip: float observations, the uint8 space kept."""
    return gym.wrappers.TransformObservation(Frames(), lambda o: o / 255.0, None)


def test_collect_hands_observations_to_the_buffers_checked_cast() -> None:
    """Float observations of a uint8 space: stored as they are (buf.add's rule without a
    spec) instead of truncated to 0; into a uint8 field, the DtypeError buf.add raises,
    and nothing is written."""
    env = scaled()
    buf = rb.ReplayBuffer(100, seed=0)
    rb.collect(env, lambda o: np.zeros(2, np.int32), buf, n_steps=4, progress=False, seed=0)
    got = buf.sample(4, replace=False)
    assert np.allclose(np.sort(got.obs[:, 0, 0]), np.array([51, 52, 53, 54]) / 255.0)
    np.testing.assert_allclose(got.next_obs, got.obs + 1 / 255.0, rtol=1e-6)

    spec = rb.spec_from_env(env)
    direct = rb.ReplayBuffer(100, seed=0, spec=spec)
    obs, _ = env.reset(seed=0)
    nxt, *_ = env.step(np.zeros(2, np.int32))
    with pytest.raises(rb.DtypeError) as by_add:
        direct.add(obs=obs, action=np.zeros(2, np.int32), reward=1.0, next_obs=nxt,
                   terminated=False, truncated=False)
    collected = rb.ReplayBuffer(100, seed=0, spec=spec)
    with pytest.raises(rb.DtypeError, match=r"obs=.*0\.2.*'obs' is uint8") as by_collect:
        rb.collect(env, lambda o: np.zeros(2, np.int32), collected, n_steps=4,
                   progress=False, seed=0)
    # buf.add's message, then what happened to the step the env already took
    assert str(by_collect.value).startswith(str(by_add.value))
    assert "the step is lost" in str(by_collect.value)
    assert len(collected) == 0


def test_collect_hands_actions_to_the_buffers_checked_cast() -> None:
    """A policy's float actions for a Box(int32) space: stored as the env executed them
    (1.7, not 1); into an int32 field a DtypeError naming the field; integral floats are
    taken, as buf.add takes them. One lane per sub-env and one lane for all."""
    for lanes in (2, 1):
        envs = gym.vector.SyncVectorEnv([Frames] * 2)
        buf = rb.ReplayBuffer(100, num_envs=lanes, seed=0)
        rb.collect(envs, lambda o: np.full((2, 2), 1.7), buf, n_steps=4, progress=False)
        assert envs.envs[0].last_action.tolist() == [1.7, 1.7]
        assert np.all(buf.sample(4, replace=False).action == 1.7)
        spec = rb.spec_from_env(envs)
        strict = rb.ReplayBuffer(100, num_envs=lanes, seed=0, spec=spec)
        with pytest.raises(rb.DtypeError, match=r"action=.*'action' is int32 and needs"):
            rb.collect(envs, lambda o: np.full((2, 2), 1.7), strict, n_steps=4,
                       progress=False)
        assert len(strict) == 0
        rb.collect(envs, lambda o: np.full((2, 2), 2.0), strict, n_steps=4, progress=False)
        got = strict.sample(4, replace=False).action
        assert got.dtype == np.int32 and np.all(got == 2)


# ---------------------------------------------------------------- finding 4: copy=False
@pytest.mark.parametrize("vmode", ["sync", "async"])
@pytest.mark.parametrize("mode", [AM.NEXT_STEP, AM.SAME_STEP], ids=lambda m: m.value)
def test_vector_env_with_copy_false_is_stored_exactly(vmode: str, mode: Any) -> None:
    """copy=False: the env returns its own observation array and updates it in place;
    every stored transition is still the true one (all had obs == next_obs before)."""
    rec = Record(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode=vmode,
                              max_episode_steps=15,
                              vector_kwargs={"copy": False, "autoreset_mode": mode}))
    buf = rb.ReplayBuffer(400, num_envs=2, seed=0)
    rb.collect(rec, None, buf, n_steps=60, progress=False, seed=0)
    rec.close()
    finished, running = episodes(rec, mode)
    truth = {np.asarray(s["obs"]).tobytes(): s for ep in [*finished, *running] for s in ep}
    got = buf.sample(len(buf), replace=False)
    assert len(buf) == len(truth) >= 60
    for o, a, o2, te in zip(got.obs, got.action, got.next_obs, got.terminated, strict=True):
        s = truth[o.tobytes()]
        assert a == s["action"] and te == s["terminated"]
        np.testing.assert_array_equal(o2, s["next_obs"])


class InPlace(gym.Env):  # type: ignore[misc]
    """A single env that returns one array and updates it in place."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.obs = np.zeros(3)
        return self.obs, {}

    def step(self, action: Any) -> Any:
        self.obs += 1.0
        return self.obs, 0.5, bool(self.obs[0] >= 5), False, {}


def test_single_env_that_updates_its_observation_in_place() -> None:
    buf = rb.ReplayBuffer(100, seed=0)
    rb.collect(InPlace(), None, buf, n_steps=12, progress=False, seed=0)
    got = buf.sample(12, replace=False)
    np.testing.assert_array_equal(got.next_obs, got.obs + 1.0)


# ---------------------------------------------------------------- finding 7: the warning
def flagged_count(caught: list[Any]) -> int | None:
    """The step count an AutoresetWarning names (None: no such warning)."""
    for w in caught:
        if issubclass(w.category, AutoresetWarning):
            found = re.match(r"(\d+) stored step", str(w.message))
            assert found is not None, w.message
            return int(found.group(1))
    return None


def sample_often(buf: Any, times: int = 16) -> list[Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(times):  # the check runs at the 1st, 2nd, 4th, 8th, 16th sample
            buf.sample(8)
    return caught


@pytest.mark.parametrize("mode", [AM.NEXT_STEP, AM.SAME_STEP], ids=lambda m: m.value)
def test_collected_data_draws_no_autoreset_warning(mode: Any) -> None:
    """Blackjack deals the previous episode's final hand again now and then: real first
    steps that look like NEXT_STEP reset steps. The collector leaves reset steps out
    itself and says so (reset_free_writes), so its data is not flagged, also after a
    save and load; the same table without that record would be."""
    envs = gym.make_vec("Blackjack-v1", num_envs=4, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": mode})
    buf = rb.ReplayBuffer(40_000, num_envs=4, seed=0)
    rb.collect(envs, None, buf, n_steps=20_000, progress=False, seed=0)
    assert reset_steps(buf.table) > 0  # look-alikes are there
    assert flagged_count(sample_often(buf)) is None
    state = buf.state_dict()
    loaded = rb.ReplayBuffer(40_000, num_envs=4, seed=0)
    loaded.load_state_dict(state)
    assert flagged_count(sample_often(loaded)) is None
    del state["reset_free"]  # what the buffer would check without the record
    bare = rb.ReplayBuffer(40_000, num_envs=4, seed=0)
    bare.load_state_dict(state)
    assert flagged_count(sample_often(bare)) == reset_steps(buf.table)
    state["reset_free"] = {"start": np.zeros(4, np.int64), "stop": -np.ones(4, np.int64)}
    with pytest.raises(rb.CheckpointError, match="reset_free/start"):
        bare.load_state_dict(state)


def test_hand_written_steps_after_collected_ones_are_still_counted_exactly() -> None:
    """rb.collect first, then the user's own NEXT_STEP loop into the same lanes: the
    warning counts exactly the loop's reset steps (the collector's run ends where the
    loop's steps begin)."""
    n = 4
    buf = rb.ReplayBuffer(8000, num_envs=n, seed=0)
    rb.collect(gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync"), None,
               buf, n_steps=400, progress=False, seed=1)
    envs = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync")
    obs, _ = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    ended, resets = np.zeros(n, bool), 0
    for _ in range(300):
        action = rng.integers(0, 2, n)
        nxt, reward, term, trunc, _ = envs.step(action)
        buf.add(obs=obs, action=action, reward=reward, next_obs=nxt, terminated=term,
                truncated=trunc)
        resets += int(ended.sum())
        ended, obs = term | trunc, nxt
    assert resets > 10
    assert flagged_count(sample_often(buf)) == resets


# ---------------------------------------------------------------- a step the buffer refuses
class Count(gym.Env):  # type: ignore[misc]
    """obs = [t], reward 1; cut at t = 20. With ``bad_obs_at``, that step's observation
    (of the first episode only) is a float the uint8-free spec below refuses."""

    observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
    action_space = gym.spaces.Box(0, 5, (), np.float32)

    def __init__(self, bad_obs_at: int | None = None) -> None:
        self.bad_obs_at, self.episode, self.t = bad_obs_at, -1, 0

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t, self.episode = 0, self.episode + 1
        return np.array([0], np.float32), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        obs = np.array([self.t], np.float32)
        if (self.episode, self.t) == (0, self.bad_obs_at):
            obs = np.zeros(3, np.float32)  # the wrong shape
        return obs, 1.0, False, self.t >= 20, {}


def test_an_action_the_buffer_refuses_is_caught_before_env_step() -> None:
    """1.7 into an int64 action field: refused before env.step, so after the policy is
    fixed the next transition is (1 -> 2), not (1 -> 3), which never happened."""
    env = Count()
    buf = rb.ReplayBuffer(50, spec={"obs": ((1,), "float32"), "action": ((), "int64")},
                          seed=0)
    bad = [False]
    col = rb.Collector(env, lambda o: 1.7 if bad[0] else 1, buf, seed=0)
    col.collect(1)
    bad[0] = True
    with pytest.raises(rb.DtypeError, match=r"action=1\.7.*int64.*env\.step was not"):
        col.collect(1)
    assert (env.t, len(buf)) == (1, 1)
    bad[0] = False
    col.collect(1)
    b = buf.sample(2, replace=False)
    assert sorted(zip(b.obs[:, 0].tolist(), b.next_obs[:, 0].tolist(), strict=True)) == \
        [(0.0, 1.0), (1.0, 2.0)]


def test_a_step_refused_after_env_step_is_lost_and_never_bridged() -> None:
    """An observation the buffer refuses arrives with env.step: the error says the step
    is lost and the env is reset; no stored transition joins obs t=1 to a later one."""
    env = Count(bad_obs_at=2)
    buf = rb.ReplayBuffer(50, seed=0, n_step=3, gamma=1.0)
    col = rb.Collector(env, lambda o: np.float32(1.0), buf, seed=0)
    col.collect(1)
    with pytest.raises(rb.ShapeError, match="the step is lost"):
        col.collect(1)
    col.collect(2)
    assert env.episode == 1
    b = buf.sample(3, replace=False)
    assert sorted(zip(b.obs[:, 0].tolist(), b.next_obs[:, 0].tolist(),
                      b.reward.tolist(), strict=True)) == \
        [(0.0, 1.0, 1.0), (0.0, 2.0, 2.0), (1.0, 2.0, 1.0)]


class Tick(gym.Env):  # type: ignore[misc]
    """obs = [10000 * sub-env + 100 * episode + t]; episodes of ``length`` steps (then
    terminated). With ``bad``, the observation at t = 2 of the first episode is a
    fraction an int64 field refuses. Every transition it made is logged."""

    observation_space = gym.spaces.Box(0, 1e6, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, sub: int, length: int, bad: bool = False) -> None:
        self.sub, self.length, self.bad = sub, length, bad
        self.ep, self.t = -1, 0
        self.log: list[tuple[float, float]] = []

    def _obs(self) -> np.ndarray:
        v = 10000 * self.sub + 100 * self.ep + self.t
        return np.array([v + (0.5 if self.bad and (self.ep, self.t) == (0, 2) else 0.0)],
                        np.float32)

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.ep, self.t = self.ep + 1, 0
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        before = float(self._obs()[0])
        self.t += 1
        obs = self._obs()
        self.log.append((before, float(obs[0])))
        return obs, 1.0, self.t >= self.length, False, {}


@pytest.mark.parametrize("mode", [AM.SAME_STEP, AM.NEXT_STEP])
def test_one_lane_held_steps_the_buffer_refuses_lose_only_themselves(mode: Any) -> None:
    """Sub-env 1's episode, appended whole when it ends, holds a value the buffer's int64
    field refuses: only its two steps with that value are left out (its first step is
    appended, cut there as by a time limit); sub-envs 0 and 2 keep their held steps, no
    env is reset, and every real transition but the two reaches the buffer exactly once,
    none bridging the gap (it used to reset every sub-env and drop all 9 held steps)."""
    subs = [Tick(0, 10), Tick(1, 3, bad=True), Tick(2, 7)]
    envs = gym.vector.SyncVectorEnv([lambda e=e: e for e in subs], autoreset_mode=mode)
    buf = rb.ReplayBuffer(500, spec={"obs": ((1,), "int64"), "action": ((), "int64")},
                          seed=0)
    col = rb.Collector(envs, None, buf, seed=0)
    with pytest.raises(rb.DtypeError, match="found NaN, inf or a fraction") as got:
        col.collect(3)
    assert (col.held, len(buf)) == (6, 1)  # sub-envs 0 and 2: 3 steps each
    assert [e.ep for e in subs] == [0, 1 if mode == AM.SAME_STEP else 0, 0]
    col.collect(30)
    col.flush()
    stored = buf.sample(len(buf), replace=False)
    got_pairs = sorted(zip(stored.obs[:, 0].tolist(), stored.next_obs[:, 0].tolist(),
                           strict=True))
    real = sorted((int(a), int(b)) for e in subs for a, b in e.log if a % 1 == b % 1 == 0)
    assert got_pairs == real
    assert len(real) == sum(len(e.log) for e in subs) - 2
    assert re.search(r"held steps of sub-env 1 \(2 of its held steps\).*no env was reset",
                     str(got.value))
