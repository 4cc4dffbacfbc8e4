"""The pieces the examples share with the demo: greedy evaluation (against a plain
one-env-at-a-time loop), the learning-curve record and its PNG, and when a progress bar
shows."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaybank.errors import ConfigError
from replaybank.integrations.curves import LearningCurve
from replaybank.integrations.progress import progress_enabled

gym = pytest.importorskip("gymnasium")

from replaybank.integrations.evaluation import evaluate_policy  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def plain_returns(env_id: str, policy: Any, episodes: int, seed: int) -> list[float]:
    """One env, one episode after another, sub-env i reset with seed + i."""
    out = []
    for i in range(episodes):
        env = gym.make(env_id)
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            obs, r, term, trunc, _ = env.step(policy(obs[None])[0])
            total += float(r)
            done = term or trunc
        env.close()
        out.append(total)
    return out


def lean_right_when_falling_right(obs: np.ndarray) -> np.ndarray:
    return (obs[:, 2] > 0).astype(np.int64)  # a state-dependent deterministic policy


def torque_against_velocity(obs: np.ndarray) -> np.ndarray:
    return np.clip(-obs[:, 2:3], -2.0, 2.0).astype(np.float32)


@pytest.mark.parametrize("env_id, policy, episodes, seed", [
    ("CartPole-v1", lean_right_when_falling_right, 4, 3),
    ("CartPole-v1", lambda o: np.zeros(len(o), np.int64), 3, 0),
    ("Pendulum-v1", torque_against_velocity, 2, 7),
])
def test_evaluate_policy_equals_a_plain_loop(env_id: str, policy: Any, episodes: int,
                                             seed: int) -> None:
    got = evaluate_policy(env_id, policy, episodes, seed=seed)
    assert got.shape == (episodes,) and got.dtype == np.float64
    np.testing.assert_allclose(got, plain_returns(env_id, policy, episodes, seed), rtol=1e-6)


def test_evaluate_policy_rejects_bad_arguments() -> None:
    for bad in (0, 2.0, True):
        with pytest.raises(ConfigError, match="episodes"):
            evaluate_policy("CartPole-v1", lean_right_when_falling_right, bad)
    with pytest.raises(ConfigError, match="still running; raise max_steps"):
        evaluate_policy("CartPole-v1", lean_right_when_falling_right, 2, max_steps=3)


def test_learning_curve_records_and_summarises() -> None:
    curve = LearningCurve("t", target=1.0)
    assert curve.last_eval is None
    curve.add_episodes(10, [1.0, 2.0])
    curve.add_episodes(20, np.array([3.0]))
    assert curve.episode_steps == [10, 10, 20] and curve.episode_returns == [1.0, 2.0, 3.0]
    values = np.array([3.0, 5.0, 10.0])
    mean, std = curve.add_eval(20, values)
    assert (mean, std) == (values.mean(), values.std())
    assert curve.last_eval == (20, values.mean(), values.std(), 3)
    for bad in ([], [[1.0, 2.0]], [1.0, np.nan]):
        with pytest.raises(ConfigError, match="returns"):
            curve.add_eval(30, bad)
    assert curve.eval_steps == [20]  # a rejected evaluation is not recorded


def check_png(path: Path) -> np.ndarray:
    """A real PNG: the signature, and an image matplotlib reads back with content."""
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image.reshape(-1, image.shape[2]).std(axis=0).max() > 0.05  # not a blank canvas
    return image


def test_plot_writes_a_png_and_leaves_pyplot_alone(tmp_path: Path) -> None:
    import matplotlib
    import matplotlib.pyplot as plt

    backend, figures = matplotlib.get_backend(), plt.get_fignums()
    curve = LearningCurve("DQN", target=475.0)
    curve.add_episodes(100, [10.0, 30.0])
    curve.add_eval(100, [20.0, 25.0])
    curve.add_eval(200, [200.0, 300.0])
    path = curve.plot(tmp_path / "sub" / "curve.png")
    assert path == tmp_path / "sub" / "curve.png"
    check_png(path)
    assert (matplotlib.get_backend(), plt.get_fignums()) == (backend, figures)
    check_png(LearningCurve("empty").plot(tmp_path / "empty.png"))


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_only_on_a_terminal_without_quiet() -> None:
    assert progress_enabled(False, Terminal()) is True
    assert progress_enabled(True, Terminal()) is False
    assert progress_enabled(False, io.StringIO()) is False
