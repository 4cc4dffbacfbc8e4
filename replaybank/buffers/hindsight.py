"""``HerReplayBuffer``: a ReplayBuffer whose view relabels goals (hindsight experience replay).

One implementation, two spellings: ``HerReplayBuffer(capacity, num_envs, reward_fn, ...)``
is ``ReplayBuffer(capacity, num_envs, view=HerView(reward_fn, ...))``; see
:mod:`replaybank.views.hindsight` for what is relabelled and where goals come from.
Episodes of different lanes may have any lengths and end at any time.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> def reward(achieved, desired, info):
    ...     return -(np.linalg.norm(achieved - desired, axis=-1) > 0.05).astype(np.float32)
    >>> buf = rb.HerReplayBuffer(1000, num_envs=2, reward_fn=reward, strategy="future", k=4,
    ...                          seed=0)
    >>> def obs(t):
    ...     return {"observation": np.full((2, 5), t, np.float32),
    ...             "achieved_goal": np.full((2, 3), t, np.float32),
    ...             "desired_goal": np.ones((2, 3), np.float32) * 9}
    >>> for t in range(10):
    ...     buf.add(obs=obs(t), action=np.zeros((2, 4), np.float32), reward=-np.ones(2),
    ...             next_obs=obs(t + 1), terminated=np.zeros(2, bool),
    ...             truncated=np.array([t % 5 == 4, t == 9]))
    >>> b = buf.sample(128)
    >>> b.obs["desired_goal"].shape, b["relabeled"].dtype.name
    ((128, 3), 'bool')
    >>> new = b["relabeled"]      # future goals: achieved at or after the sampled step
    >>> bool(np.all(b.obs["desired_goal"][new, 0] >= b.obs["achieved_goal"][new, 0] + 1))
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.buffers.replay import ReplayBuffer
from replaybank.samplers.base import Sampler
from replaybank.storage.backends.base import ArrayBackend
from replaybank.views.hindsight import HerView

__all__ = ["HerReplayBuffer"]


# typed as numpy batches, its usual storage (a storage= passed through **kwargs is not
# seen by the checker: the base's overloads choose it)
class HerReplayBuffer(ReplayBuffer[npt.NDArray[Any]]):
    """Hindsight experience replay over ``num_envs`` lanes of goal-conditioned episodes.

    Observations are dicts ``{"observation", "achieved_goal", "desired_goal"}`` (the
    gymnasium-robotics GoalEnv convention; with ``num_envs > 1`` each value has a leading
    env dim). Each step is stored once; goals are relabelled at sample time.

    Args:
        capacity: Total transitions over all lanes (divisible by ``num_envs``).
        num_envs: Number of lanes (parallel environments).
        reward_fn: ``reward_fn(achieved_goal [N, *g], desired_goal [N, *g], info) -> [N]``:
            a callable (``env.unwrapped.compute_reward``), a name registered with
            :func:`replaybank.register_function`, or ``"module:attr"``.
        strategy: ``"future"`` (default), ``"final"``, ``"episode"`` or ``"random"``.
        k: New goals per real goal: a row of a finished episode is relabelled with
            probability ``k / (k + 1)`` (SB3's ``n_sampled_goal``).
        terminated_fn: Optional ``-> [N]`` bool of the same signature; decides
            ``terminated`` of relabelled rows (None: keep the stored flag).
        relabel_unfinished: Also relabel rows of running episodes (goals from their steps
            so far).
        n_step: n-step returns of the relabelled rewards (1: one-step transitions).
        gamma: Discount of the n-step returns.
        seed: Seed or Generator for sampling and goal draws.
        sampler: Which steps to draw (default uniform; a
            :class:`~replaybank.samplers.prioritized.PrioritizedSampler` for PER).
        spec: Field specs (inferred from the first add when None).
        storage: ``"numpy"``, ``"memmap"`` (with ``path``) or ``"torch"`` (with
            ``device``): on torch storage the goals are gathered and the rewards
            recomputed on the device, and ``reward_fn`` / ``terminated_fn`` receive torch
            tensors there (:mod:`replaybank.device.hindsight`); the relabelled rows
            and goal steps are those numpy storage picks under the same seed.
        path: Directory of the memmap files.
        autoreset_mode: As in :class:`~replaybank.buffers.replay.ReplayBuffer`.
        device: Torch device of torch storage (``"cuda"``, ``"cpu"``, ...).
        achieved_key: The observation key of the achieved goal (for observations that
            do not follow the GoalEnv names).
        desired_key: The observation key of the desired goal.

    Raises:
        ConfigError: A bad strategy, ``k`` or function, or any ReplayBuffer argument.

    Example:
        >>> HerReplayBuffer(100, reward_fn="builtins:max", strategy="final").view.strategy
        'final'
    """

    def __init__(
        self,
        capacity: int,
        num_envs: int = 1,
        reward_fn: Callable[..., Any] | str | None = None,
        strategy: str = "future",
        k: int = 4,
        terminated_fn: Callable[..., Any] | str | None = None,
        relabel_unfinished: bool = False,
        n_step: int = 1,
        gamma: float = 0.99,
        seed: int | np.random.Generator | None = None,
        sampler: Sampler | None = None,
        spec: Any = None,
        storage: str | ArrayBackend = "numpy",
        path: Any = None,
        autoreset_mode: str | None = None,
        device: Any = None,
        achieved_key: str = "achieved_goal",
        desired_key: str = "desired_goal",
    ) -> None:
        view = HerView(reward_fn,  # type: ignore[arg-type]  # None: HerView's clear error
                       strategy, k, terminated_fn=terminated_fn,
                       relabel_unfinished=relabel_unfinished, n_step=n_step, gamma=gamma,
                       achieved_key=achieved_key, desired_key=desired_key)
        super().__init__(capacity, num_envs=num_envs, seed=seed, spec=spec, sampler=sampler,
                         view=view, storage=storage, path=path, device=device,
                         autoreset_mode=autoreset_mode)
        self.her: HerView = view
        self._init_args.update(n_step=n_step, gamma=float(gamma))

    def init_config(self) -> dict[str, Any]:
        """Constructor values that rebuild this buffer empty: the HER arguments by name
        (``reward_fn`` None when the function has no name: pass it to ``from_config`` /
        ``rb.load`` / ``rb.open`` as an override, or register it)."""
        cand = super().init_config()
        view = self.view.config() if isinstance(self.view, HerView) else self.her.config()
        cand.pop("view", None)
        cand.pop("frame_stack", None)
        cand.update({k: v for k, v in view.items() if k != "type"})
        return cand
