"""replaybank.envs.BitFlipping against a plain-loop reference of the HER paper's task."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import replaybank.envs as envs  # noqa: E402
from replaybank.envs import BitFlipping, compute_reward, compute_terminated  # noqa: E402
from replaybank.envs.bit_flipping import compute_truncated  # noqa: E402

KEYS = ("achieved_goal", "desired_goal", "observation")


def bits(obs: dict[str, np.ndarray], key: str) -> list[int]:
    return [int(b) for b in obs[key]]


class Reference:
    """The task written as a plain loop over lists of ints."""

    def __init__(self, state: list[int], goal: list[int], max_steps: int) -> None:
        self.state, self.goal, self.max_steps, self.t = list(state), list(goal), max_steps, 0

    def step(self, action: int) -> tuple[list[int], float, bool, bool, bool]:
        self.state[action] = 1 - self.state[action]
        self.t += 1
        same = all(s == g for s, g in zip(self.state, self.goal, strict=True))
        return list(self.state), (0.0 if same else -1.0), same, self.t >= self.max_steps, same


def check_obs(env: BitFlipping, obs: dict[str, np.ndarray]) -> None:
    assert sorted(obs) == list(KEYS)
    for key in KEYS:
        assert obs[key].dtype == np.float32 and obs[key].shape == (env.n_bits,)
        assert set(np.unique(obs[key]).tolist()) <= {0.0, 1.0}
    np.testing.assert_array_equal(obs["observation"], obs["achieved_goal"])
    assert env.observation_space.contains(obs)


@pytest.mark.parametrize(("n_bits", "max_steps"), [(1, None), (3, None), (5, 2), (6, 20)])
def test_steps_match_the_reference(n_bits: int, max_steps: int | None) -> None:
    env = BitFlipping(n_bits=n_bits, max_steps=max_steps)
    limit = n_bits if max_steps is None else max_steps
    rng = np.random.default_rng(n_bits)
    ends = {"terminated": 0, "truncated": 0}
    for episode in range(60):
        obs, info = env.reset(seed=1000 * n_bits + episode)
        check_obs(env, obs)
        assert info == {"is_success": False}
        state, goal = bits(obs, "observation"), bits(obs, "desired_goal")
        assert state != goal  # the goal is never the start state
        ref = Reference(state, goal, limit)
        for t in range(1, limit + 1):
            # mostly steps towards the goal, so that episodes also end by reaching it
            wrong = [i for i in range(n_bits) if ref.state[i] != ref.goal[i]]
            a = int(rng.choice(wrong)) if rng.random() < 0.7 else int(rng.integers(n_bits))
            obs, reward, terminated, truncated, info = env.step(a)
            r_state, r_reward, r_term, r_trunc, r_success = ref.step(a)
            check_obs(env, obs)
            assert bits(obs, "observation") == r_state
            assert bits(obs, "desired_goal") == goal
            assert (reward, terminated, truncated) == (r_reward, r_term, r_trunc)
            assert type(reward) is float and type(terminated) is bool and type(truncated) is bool
            assert info == {"is_success": r_success}
            # the GoalEnv contract: the step's reward/termination recomputed from its goals
            assert reward == env.compute_reward(obs["achieved_goal"], obs["desired_goal"], info)
            assert terminated == env.compute_terminated(obs["achieved_goal"],
                                                        obs["desired_goal"], info)
            assert truncated == (t >= limit)
            if terminated or truncated:
                ends["terminated"] += terminated
                ends["truncated"] += truncated
                break
    assert ends["terminated"] > 0
    assert ends["truncated"] > 0 or limit > 2 * n_bits  # a long limit: every episode ends


def test_truncates_after_max_steps_by_default_n_bits() -> None:
    env = BitFlipping(n_bits=4)
    assert env.max_steps == 4
    obs, _ = env.reset(seed=3)
    state = bits(obs, "observation")
    # flip bit 0 back and forth: never more than one bit changed, so truncation decides
    differ = sum(s != g for s, g in zip(state, bits(obs, "desired_goal"), strict=True))
    a = 0 if differ > 1 or state[0] == bits(obs, "desired_goal")[0] else 1
    flags = []
    for _ in range(4):
        _, reward, terminated, truncated, _ = env.step(a)
        flags.append((reward, terminated, truncated))
    assert flags == [(-1.0, False, False)] * 3 + [(-1.0, False, True)]


def test_reaching_the_goal_on_the_last_step_terminates_and_truncates() -> None:
    env = BitFlipping(n_bits=8)
    obs, _ = env.reset(seed=5)
    wrong = np.flatnonzero(obs["observation"] != obs["desired_goal"])
    env.max_steps = len(wrong)
    for i, a in enumerate(wrong):
        _, reward, terminated, truncated, info = env.step(int(a))
        last = i == len(wrong) - 1
        assert (reward, terminated, truncated, info["is_success"]) == (
            0.0 if last else -1.0, last, last, last)


def test_seeding_reproduces_episodes() -> None:
    def rollout(seed: int | None, env: BitFlipping | None = None) -> list[Any]:
        env = env or BitFlipping(n_bits=12)
        out: list[Any] = []
        obs, _ = env.reset(seed=seed)
        for episode in range(5):
            if episode:
                obs, _ = env.reset()  # unseeded resets continue the seeded generator
            out.append((bits(obs, "observation"), bits(obs, "desired_goal")))
            for a in range(3):
                obs, reward, *_ = env.step(a)
                out.append((bits(obs, "observation"), reward))
        return out

    assert rollout(7) == rollout(7)
    env = BitFlipping(n_bits=12)
    rollout(123, env)
    assert rollout(7, env) == rollout(7)  # reseeding an used env starts over
    assert rollout(7) != rollout(8)


def test_start_states_and_goals_are_uniform_and_differ() -> None:
    env = BitFlipping(n_bits=3)
    env.reset(seed=0)
    pairs = []
    for _ in range(4000):
        obs, _ = env.reset()
        pairs.append((tuple(bits(obs, "observation")), tuple(bits(obs, "desired_goal"))))
    assert all(s != g for s, g in pairs)
    # 8 states x 7 other goals, each about 4000 / 56 = 71 times
    counts = np.array([pairs.count((s, g)) for s, g in set(pairs)])
    assert len(counts) == 56 and counts.min() > 35 and counts.max() < 115


def test_one_bit_goal_is_the_other_state() -> None:
    env = BitFlipping(n_bits=1)
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        assert obs["desired_goal"][0] == 1.0 - obs["observation"][0]
        _, reward, terminated, truncated, _ = env.step(0)
        assert (reward, terminated, truncated) == (0.0, True, True)


@settings(max_examples=60, deadline=None)
@given(n_bits=st.integers(1, 6), lead=st.lists(st.integers(0, 4), min_size=0, max_size=2),
       seed=st.integers(0, 2**16))
def test_vectorised_goal_functions_equal_per_row(n_bits: int, lead: list[int],
                                                 seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = (*lead, n_bits)
    achieved = rng.integers(0, 2, shape).astype(np.float32)
    desired = rng.integers(0, 2, shape).astype(np.float32)
    # make about half the rows equal
    same = rng.random(tuple(lead)) < 0.5
    desired[same] = achieved[same]
    info: dict[str, Any] = {}
    reward = compute_reward(achieved, desired, info)
    term = compute_terminated(achieved, desired, info)
    trunc = compute_truncated(achieved, desired, info)
    if not lead:
        assert type(reward) is float and type(term) is bool and trunc is False
    else:
        assert isinstance(reward, np.ndarray) and reward.dtype == np.float32
        assert isinstance(term, np.ndarray) and term.dtype == np.bool_
        assert isinstance(trunc, np.ndarray) and not trunc.any()
        assert reward.shape == term.shape == trunc.shape == tuple(lead)
    flat_a, flat_d = achieved.reshape(-1, n_bits), desired.reshape(-1, n_bits)
    rows_r = [0.0 if list(a) == list(d) else -1.0 for a, d in zip(flat_a, flat_d, strict=True)]
    rows_t = [list(a) == list(d) for a, d in zip(flat_a, flat_d, strict=True)]
    assert np.reshape(reward, -1).tolist() == rows_r
    assert np.reshape(term, -1).tolist() == rows_t
    for a, d, r, t in zip(flat_a, flat_d, rows_r, rows_t, strict=True):
        assert compute_reward(a, d, info) == r and compute_terminated(a, d, info) == t
    # the methods are the module functions
    env = BitFlipping(n_bits=n_bits)
    np.testing.assert_array_equal(env.compute_reward(achieved, desired, info), reward)
    np.testing.assert_array_equal(env.compute_terminated(achieved, desired, info), term)
    np.testing.assert_array_equal(env.compute_truncated(achieved, desired, info), trunc)


def test_goal_functions_broadcast_and_refuse_mismatched_bits() -> None:
    achieved = np.array([[0, 1, 1], [1, 1, 1]], np.float32)
    np.testing.assert_array_equal(compute_reward(achieved, np.ones(3), {}), [-1.0, 0.0])
    with pytest.raises(ValueError, match="bits"):
        compute_reward(achieved, np.ones(4), {})
    with pytest.raises(ValueError, match="axis"):
        compute_terminated(np.float32(1.0), np.float32(1.0), {})


def test_bad_arguments_and_actions_are_refused() -> None:
    for kwargs in ({"n_bits": 0}, {"n_bits": 2.5}, {"n_bits": 3, "max_steps": 0},
                   {"n_bits": 3, "render_mode": "human"}):
        with pytest.raises(ValueError):
            BitFlipping(**kwargs)
    env = BitFlipping(n_bits=3)
    env.reset(seed=0)
    for action in (3, -1, 1.5):
        with pytest.raises(ValueError, match="action"):
            env.step(action)  # type: ignore[arg-type]


def test_render_ansi() -> None:
    env = BitFlipping(n_bits=4, render_mode="ansi")
    obs, _ = env.reset(seed=2)
    text = env.render()
    assert text == (f"state {''.join(str(int(b)) for b in obs['observation'])}  "
                    f"goal {''.join(str(int(b)) for b in obs['desired_goal'])}")
    assert BitFlipping(n_bits=4).render() is None


@pytest.mark.parametrize("n_bits", [2, 4, 15])  # 1 bit: every episode is 1 step
def test_gymnasium_env_checker_passes(n_bits: int) -> None:
    from gymnasium.utils.env_checker import check_env

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no checker warning either
        check_env(BitFlipping(n_bits=n_bits), skip_render_check=True)
        # made through gymnasium (with a spec), the checker also tries the render modes
        for mode in (None, "ansi"):
            env = gym.make(envs.BIT_FLIPPING_ID, n_bits=n_bits, render_mode=mode)
            check_env(env.unwrapped, skip_render_check=False)


def test_registered_with_gymnasium() -> None:
    import importlib

    assert envs.BIT_FLIPPING_ID == "replaybank/BitFlipping-v0"
    importlib.reload(envs)  # registering again is harmless
    env = gym.make("replaybank/BitFlipping-v0", n_bits=5)
    assert isinstance(env.unwrapped, BitFlipping)
    assert env.unwrapped.n_bits == 5 and env.unwrapped.max_steps == 5
    obs, info = env.reset(seed=0)
    assert obs["observation"].shape == (5,) and info == {"is_success": False}
    obs, reward, *_, info = env.step(env.action_space.sample())
    assert reward in (0.0, -1.0) and "is_success" in info
    env7 = gym.make("replaybank/BitFlipping-v0", n_bits=7, max_steps=3)
    assert env7.unwrapped.max_steps == 3 and env7.action_space.n == 7
    # the vector API works too
    vec = gym.make_vec("replaybank/BitFlipping-v0", num_envs=2, vectorization_mode="sync",
                       n_bits=4)
    obs, _ = vec.reset(seed=0)
    assert obs["desired_goal"].shape == (2, 4)
    vec.close()


def test_package_root_does_not_import_envs() -> None:
    import subprocess
    import sys

    code = "import sys, replaybank; print('replaybank.envs' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
