"""Greedy evaluation: the returns of a few episodes played by a deterministic policy.

:func:`evaluate_policy` plays ``episodes`` episodes at once, one per sub-env of a
synchronous gymnasium vector env, with a batched policy (argmax Q for DQN, the mean action
for SAC, the most likely action for PPO), and returns each episode's undiscounted return.
Sub-env ``i`` is reset with ``seed + i``, so an evaluation is reproducible and every
episode starts from its own state.

Example:
    >>> import numpy as np
    >>> returns = evaluate_policy("CartPole-v1", lambda obs: np.zeros(len(obs), int),
    ...                           episodes=3, seed=0)
    >>> returns.shape, bool(np.all((returns >= 1) & (returns <= 500)))
    ((3,), True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replaybank.errors import ConfigError, describe, require_extra

__all__ = ["evaluate_policy"]


def evaluate_policy(env_id: str, policy: Callable[[np.ndarray], Any], episodes: int = 10,
                    seed: int = 0, max_steps: int = 100_000,
                    **make_kwargs: Any) -> np.ndarray:
    """Play one episode in each of ``episodes`` sub-envs and return their returns.

    Args:
        env_id: A registered gymnasium id, e.g. ``"CartPole-v1"``.
        policy: Maps a batch of observations ``[episodes, *obs_shape]`` to a batch of
            actions ``[episodes, *action_shape]`` (deterministic for a greedy evaluation).
        episodes: Episodes to play (an int >= 1), all at once.
        seed: Sub-env ``i`` is reset with ``seed + i``.
        max_steps: Vector steps at most (a guard for envs without a time limit).
        **make_kwargs: Passed to ``gymnasium.make_vec`` (e.g. env arguments).

    Returns:
        Undiscounted return of each episode, ``[episodes]`` float64.

    Raises:
        ConfigError: ``episodes`` or ``max_steps`` is not a positive int, or an episode
            was still running after ``max_steps`` steps.
        MissingDependencyError: gymnasium is not installed.
    """
    for name, value in (("episodes", episodes), ("max_steps", max_steps)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(
                f"evaluate_policy({name}={describe(value)}): {name} must be an int >= 1; "
                f"pass e.g. {name}={10 if name == 'episodes' else 100_000}"
            )
    gym = require_extra("gymnasium", "gym")
    envs = gym.make_vec(env_id, num_envs=int(episodes), vectorization_mode="sync",
                        **make_kwargs)
    try:
        obs, _ = envs.reset(seed=seed)
        returns = np.zeros(int(episodes))  # [episodes]
        running = np.ones(int(episodes), dtype=bool)
        for _ in range(int(max_steps)):
            obs, reward, terminated, truncated, _ = envs.step(policy(obs))
            # a sub-env that ended is autoreset: its later steps are not this episode's
            returns[running] += np.asarray(reward, dtype=np.float64)[running]
            running &= ~(np.asarray(terminated) | np.asarray(truncated))
            if not running.any():
                return returns
    finally:
        envs.close()
    raise ConfigError(
        f"evaluate_policy(max_steps={max_steps}): {int(running.sum())} of {episodes} "
        f"episodes of {env_id} were still running; raise max_steps or give the env a "
        "time limit"
    )
