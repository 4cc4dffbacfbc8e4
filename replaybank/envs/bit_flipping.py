"""The bit-flipping environment of the HER paper (Andrychowicz et al., 2017, section 3.1).

The state is a vector of ``n_bits`` bits; an action flips one bit. Each episode starts from
a random state with a random, different goal. The reward is ``-1`` on every step that does
not end in the goal and ``0`` on the step that reaches it, which also terminates the
episode; after ``max_steps`` steps (default ``n_bits``) the episode is truncated. With a
dozen bits or more, random exploration almost never sees the goal, so plain DQN learns
nothing; relabelling goals in hindsight (``replaybank.HerReplayBuffer``) solves it.

The env follows the goal-conditioned API of ``gymnasium_robotics.GoalEnv`` with plain
gymnasium (no extra dependency): a ``Dict`` observation with ``"observation"``,
``"achieved_goal"`` and ``"desired_goal"`` (float32 arrays of 0/1; the achieved goal is
the state itself), and ``compute_reward`` / ``compute_terminated`` / ``compute_truncated``
that work on batches of goals. The module-level :func:`compute_reward` and
:func:`compute_terminated` do the same arithmetic, so a config can name them
(``"replaybank.envs.bit_flipping:compute_reward"``) as a hindsight buffer's ``reward_fn``.

Example:
    >>> import numpy as np
    >>> env = BitFlipping(n_bits=4)
    >>> obs, info = env.reset(seed=0)
    >>> sorted(obs), info["is_success"]
    (['achieved_goal', 'desired_goal', 'observation'], False)
    >>> bool((obs["observation"] != obs["desired_goal"]).any())
    True
    >>> action = int(np.flatnonzero(obs["observation"] != obs["desired_goal"])[0])
    >>> obs, reward, terminated, truncated, info = env.step(action)
    >>> reward == env.compute_reward(obs["achieved_goal"], obs["desired_goal"], info)
    True
    >>> compute_reward(np.array([[0, 1], [1, 1]]), np.array([[0, 1], [0, 1]]), {})
    array([ 0., -1.], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt
from gymnasium import spaces

__all__ = ["BitFlipping", "compute_reward", "compute_terminated", "compute_truncated"]

Obs = dict[str, npt.NDArray[np.float32]]


def _reached(achieved_goal: npt.ArrayLike, desired_goal: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Where all bits of ``achieved_goal`` equal ``desired_goal`` (last axis: the bits)."""
    a, d = np.asarray(achieved_goal), np.asarray(desired_goal)
    if a.ndim == 0 or d.ndim == 0:
        raise ValueError("goals need at least one axis (the bits)")
    if a.shape[-1] != d.shape[-1]:
        raise ValueError(f"goals of {a.shape[-1]} and {d.shape[-1]} bits do not compare")
    return np.asarray(np.all(a == d, axis=-1))


def compute_reward(achieved_goal: npt.ArrayLike, desired_goal: npt.ArrayLike,
                   info: Any = None) -> npt.NDArray[np.float32] | float:
    """The bit-flipping reward: ``0.0`` where the goals are equal on all bits, else ``-1.0``.

    Args:
        achieved_goal: Achieved goals, ``[..., n_bits]``.
        desired_goal: Desired goals, broadcastable to ``achieved_goal``.
        info: Ignored (the ``GoalEnv`` signature; a dict or a batch of them).

    Returns:
        float32 rewards of shape ``[...]`` (the leading dims); a Python float for 1-D goals.

    Example:
        >>> compute_reward(np.array([1.0, 0.0]), np.array([1.0, 0.0]), {})
        0.0
        >>> compute_reward(np.zeros((2, 3)), np.array([[0, 0, 0], [0, 1, 0]]), {})
        array([ 0., -1.], dtype=float32)
    """
    reached = _reached(achieved_goal, desired_goal)
    reward = np.where(reached, 0.0, -1.0).astype(np.float32)
    return float(reward) if reward.ndim == 0 else reward


def compute_terminated(achieved_goal: npt.ArrayLike, desired_goal: npt.ArrayLike,
                       info: Any = None) -> npt.NDArray[np.bool_] | bool:
    """Whether the goal is reached: ``True`` where the goals are equal on all bits.

    Args:
        achieved_goal: Achieved goals, ``[..., n_bits]``.
        desired_goal: Desired goals, broadcastable to ``achieved_goal``.
        info: Ignored.

    Returns:
        Booleans of shape ``[...]``; a Python bool for 1-D goals.

    Example:
        >>> compute_terminated(np.array([[1, 0], [1, 1]]), np.array([1, 0]), {})
        array([ True, False])
    """
    reached = _reached(achieved_goal, desired_goal)
    return bool(reached) if reached.ndim == 0 else reached


def compute_truncated(achieved_goal: npt.ArrayLike, desired_goal: npt.ArrayLike,
                      info: Any = None) -> npt.NDArray[np.bool_] | bool:
    """Never from the goals: the env truncates on its step count only (all ``False``).

    Args:
        achieved_goal: Achieved goals, ``[..., n_bits]``.
        desired_goal: Desired goals, broadcastable to ``achieved_goal``.
        info: Ignored.

    Returns:
        ``False`` of shape ``[...]``; a Python bool for 1-D goals.

    Example:
        >>> compute_truncated(np.zeros((3, 2)), np.ones(2), {})
        array([False, False, False])
    """
    reached = _reached(achieved_goal, desired_goal)
    return False if reached.ndim == 0 else np.zeros(reached.shape, np.bool_)


class BitFlipping(gym.Env[dict[str, Any], np.int64]):
    """Flip bits until the state equals the goal (goal-conditioned, sparse reward).

    Args:
        n_bits: Number of bits (the HER paper solves up to 50 with DQN + HER).
        max_steps: Steps before the episode is truncated; ``None`` means ``n_bits``,
            enough to reach any goal.
        render_mode: ``None`` or ``"ansi"`` (``render()`` returns the state and goal as
            bit strings).

    Episodes: :meth:`reset` draws a random state and a different random goal from the
    env's ``np_random`` (seeded by ``reset(seed=...)``). :meth:`step` flips bit
    ``action``; the reward is ``0.0`` if the new state equals the goal (and the episode
    terminates), else ``-1.0``; ``truncated`` is ``True`` from step ``max_steps`` on (as
    gymnasium's ``TimeLimit`` sets it, also on a step that terminates). ``info`` holds
    ``"is_success"``.

    Example:
        >>> env = BitFlipping(n_bits=3, render_mode="ansi")
        >>> obs, _ = env.reset(seed=1)
        >>> env.observation_space.contains(obs), env.action_space
        (True, Discrete(3))
        >>> env.render() == f"state {env.state_bits()}  goal {env.goal_bits()}"
        True
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}  # noqa: RUF012 (gymnasium API)

    def __init__(self, n_bits: int = 10, max_steps: int | None = None,
                 render_mode: str | None = None) -> None:
        if int(n_bits) != n_bits or n_bits < 1:
            raise ValueError(f"n_bits must be a positive integer, got {n_bits!r}")
        if max_steps is None:
            max_steps = int(n_bits)
        if int(max_steps) != max_steps or max_steps < 1:
            raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.n_bits = int(n_bits)
        self.max_steps = int(max_steps)
        self.render_mode = render_mode
        bits = spaces.Box(0.0, 1.0, (self.n_bits,), np.float32)
        self.observation_space = spaces.Dict(
            {"observation": bits, "achieved_goal": bits, "desired_goal": bits})
        self.action_space = spaces.Discrete(self.n_bits)
        self._state = np.zeros(self.n_bits, np.float32)
        self._goal = np.ones(self.n_bits, np.float32)
        self._steps = 0

    def _obs(self) -> Obs:
        return {"observation": self._state.copy(), "achieved_goal": self._state.copy(),
                "desired_goal": self._goal.copy()}

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Obs, dict[str, Any]]:
        """Start an episode from a random state with a different random goal.

        Args:
            seed: Seeds the env's ``np_random`` (same seed, same episodes).
            options: Unused.

        Returns:
            The observation and ``{"is_success": False}``.
        """
        super().reset(seed=seed)
        self._state = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self._goal = self._state
        while np.array_equal(self._goal, self._state):
            self._goal = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self._steps = 0
        return self._obs(), {"is_success": False}

    def step(self, action: np.int64 | int) -> tuple[Obs, float, bool, bool, dict[str, Any]]:
        """Flip bit ``action``.

        Args:
            action: The bit to flip, in ``[0, n_bits)``.

        Returns:
            ``(obs, reward, terminated, truncated, info)`` with ``info["is_success"]``.
        """
        if not self.action_space.contains(action):
            raise ValueError(f"action must be an int in [0, {self.n_bits}), got {action!r}")
        self._state = self._state.copy()
        self._state[int(action)] = 1.0 - self._state[int(action)]
        self._steps += 1
        success = bool(np.array_equal(self._state, self._goal))
        info = {"is_success": success}
        reward = 0.0 if success else -1.0
        return self._obs(), reward, success, self._steps >= self.max_steps, info

    def compute_reward(self, achieved_goal: npt.ArrayLike, desired_goal: npt.ArrayLike,
                       info: Any = None) -> npt.NDArray[np.float32] | float:
        """See :func:`compute_reward` (vectorised over leading dims)."""
        return compute_reward(achieved_goal, desired_goal, info)

    def compute_terminated(self, achieved_goal: npt.ArrayLike, desired_goal: npt.ArrayLike,
                           info: Any = None) -> npt.NDArray[np.bool_] | bool:
        """See :func:`compute_terminated` (vectorised over leading dims)."""
        return compute_terminated(achieved_goal, desired_goal, info)

    def compute_truncated(self, achieved_goal: npt.ArrayLike, desired_goal: npt.ArrayLike,
                          info: Any = None) -> npt.NDArray[np.bool_] | bool:
        """See :func:`compute_truncated` (vectorised over leading dims)."""
        return compute_truncated(achieved_goal, desired_goal, info)

    def state_bits(self) -> str:
        """The current state as a bit string, e.g. ``"0110"``."""
        return "".join(str(int(b)) for b in self._state)

    def goal_bits(self) -> str:
        """The goal as a bit string."""
        return "".join(str(int(b)) for b in self._goal)

    def render(self) -> str | None:
        """``"state 0110  goal 1010"`` in ``"ansi"`` mode; ``None`` without a render mode."""
        if self.render_mode == "ansi":
            return f"state {self.state_bits()}  goal {self.goal_bits()}"
        return None
