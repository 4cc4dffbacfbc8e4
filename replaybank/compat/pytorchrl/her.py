"""pytorchrl's ``HERBuffer``: hindsight copies of each finished episode, per env.

pytorchrl's hindsight API is a whole-transition rewrite: at the end of an episode,
``her_function(obs, rhs, obs2, rhs2, rew, initial_state, final_state) -> (obs, rhs, obs2,
rhs2, rew)`` is called for each of its transitions but the last (whose next observation
already belongs to the next episode in pytorchrl's vector envs), and the rewritten
transitions are stored as extra data. pytorchrl did it only when every env ended at the
same step (fixed episode lengths); here each env's episode is relabelled when *that* env's
``NextDone`` is set, so episodes of any length work with any number of envs.

Storage: the core buffer has ``2 * num_envs`` lanes; lane ``e`` holds env ``e``'s real
steps and lane ``num_envs + e`` its hindsight copies (the last copy of an episode is
marked truncated, so n-step windows stop there and still bootstrap). Both are sampled
together, uniformly, by priority or by recency as the ERE/PER parameters say. The
``her_function`` sees arrays with an env dim of 1 (``[1, *shape]``), as pytorchrl's
single-env case passes them.

For goal-conditioned envs with dict observations, :class:`replaybank.HerReplayBuffer`
relabels at sample time instead (future/final/episode/random goals, nothing stored twice).

Example:
    >>> import torch
    >>> def her(obs, rhs, obs2, rhs2, rew, initial_state, final_state):
    ...     goal = final_state[:, :1]
    ...     return (np.concatenate([obs[:, :1], goal], 1), rhs,
    ...             np.concatenate([obs2[:, :1], goal], 1), rhs2,
    ...             (obs2[:, :1] == goal).astype(np.float32))
    >>> buf = HERBuffer(100, "cpu", None, None, None, her_function=her, seed=0)
    >>> lengths = [3, 5]   # env 0 ends every 3 steps, env 1 every 5
    >>> for t in range(15):
    ...     ends = torch.tensor([[float(t % n == n - 1)] for n in lengths])
    ...     buf.insert_transition({
    ...         "Observation": torch.tensor([[t % n, 9.0] for n in lengths]),
    ...         "Action": torch.zeros(2, 1), "Reward": torch.zeros(2, 1),
    ...         "NextObservation": torch.tensor([[t % n + 1, 9.0] for n in lengths]),
    ...         "Done": torch.zeros(2, 1), "NextDone": ends})
    >>> buf.relabelled   # (3 - 1) * 5 episodes of env 0, (5 - 1) * 3 of env 1
    22
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replaybank.compat.pytorchrl.buffers import EREBuffer, Factory
from replaybank.compat.pytorchrl.keys import (
    ACT,
    CORE_NAMES,
    DONE2,
    OBS,
    OBS2,
    REW,
    RHS,
    RHS2,
    to_numpy,
)

__all__ = ["HERBuffer", "identity_her"]

#: The name of a pytorchrl key in a recorded step.
_STEP_NAMES = {OBS: "obs", ACT: "action", REW: "reward", OBS2: "next_obs",
               DONE2: "terminated", RHS: RHS, RHS2: RHS2}


def identity_her(o: Any, rhs: Any, o2: Any, rhs2: Any, r: Any, initial_state: Any,
                 final_state: Any) -> tuple[Any, Any, Any, Any, Any]:
    """pytorchrl's default ``her_function``: the transition unchanged."""
    return o, rhs, o2, rhs2, r


class HERBuffer(EREBuffer):
    """Storage class for Off-Policy algorithms using HER, combinable with ERE, PER and
    n-step.

    Args:
        size: Storage capacity along time axis (rows per env, for the real steps and
            again for their hindsight copies).
        device, actor, algorithm, envs: As :class:`~replaybank.compat.pytorchrl.
            ReplayBuffer`.
        her_function: ``(obs, rhs, obs2, rhs2, rew, initial_state, final_state) -> (obs,
            rhs, obs2, rhs2, rew)``, arrays ``[1, *shape]``; ``initial_state`` and
            ``final_state`` are the observations of the episode's first and last step.
        n_step, epsilon, alpha, beta, default_error, eta, cmin, seed: As
            :class:`~replaybank.compat.pytorchrl.EREBuffer`.

    Example:
        >>> HERBuffer.create_factory(10)("cpu", None, None, None).her_function is identity_her
        True
    """

    def __init__(self, size: int, device: Any, actor: Any, algorithm: Any, envs: Any,
                 her_function: Callable[..., Any] = identity_her, n_step: int | float = 1,
                 epsilon: float = 0.0, alpha: float = 0.0, beta: float = 1.0,
                 default_error: float = 1000000, eta: float = 1.0, cmin: int = 5000,
                 seed: int | np.random.Generator | None = None) -> None:
        super().__init__(size, device, actor, algorithm, envs, n_step=n_step, epsilon=epsilon,
                         alpha=alpha, beta=beta, default_error=default_error, eta=eta,
                         cmin=cmin, seed=seed)
        self.her_function = her_function
        self.relabelled = 0  # hindsight transitions stored so far
        self._episodes: list[list[dict[str, Any]]] = []  # per env: its steps so far

    @classmethod
    def create_factory(cls, size: int,  # type: ignore[override]
                       her_function: Callable[..., Any] = identity_her,
                       n_step: int | float = 1, epsilon: float = 0.0, alpha: float = 0.0,
                       beta: float = 1.0, default_error: float = 1000000, eta: float = 1.0,
                       cmin: int = 5000) -> Factory:
        """Returns a function ``(device, actor, algorithm, envs)`` that creates instances
        (arguments as the constructor's)."""

        def create_buffer(device: Any, actor: Any, algorithm: Any, envs: Any) -> Any:
            """Create and return a HERBuffer instance."""
            return cls(size, device, actor, algorithm, envs, her_function, n_step, epsilon,
                       alpha, beta, default_error, eta, cmin)

        return create_buffer

    @property
    def _lanes(self) -> int:
        return 2 * self._num_envs

    def init_tensors(self, sample: dict[str, Any]) -> None:
        """As :meth:`~replaybank.compat.pytorchrl.PERBuffer.init_tensors`, with a
        hindsight lane per env."""
        super().init_tensors(sample)
        self._episodes = [[] for _ in range(self._num_envs)]

    def _after_insert(self, sample: dict[str, Any], values: dict[str, Any]) -> None:
        """Record each env's step; relabel the episodes of the envs whose episode ended."""
        rhs = {k: to_numpy(sample[k]) for k in (RHS, RHS2) if k in sample}
        for e, episode in enumerate(self._episodes):
            step = {k: _row(v, e) for k, v in values.items()}
            step.update({k: _row(v, e) for k, v in rhs.items()})
            episode.append(step)
        for e in np.flatnonzero(values["terminated"]).tolist():
            self.handle_end_of_episode(e)

    def copy_single_tensor(self, key: str, position: int, env: int = 0) -> Any:
        """A copy of tensor ``key`` (a pytorchrl key) of env ``env``'s current episode at
        step ``position``, ``[1, *shape]``."""
        name = _STEP_NAMES.get(key, CORE_NAMES.get(key, key))
        return _copy(self._episodes[env][position][name])

    def handle_end_of_episode(self, env: int = 0) -> None:
        """At the end of env ``env``'s episode, generate its hindsight transitions (all
        but the last step's) and add them to its hindsight lane."""
        steps, self._episodes[env] = self._episodes[env], []
        if len(steps) < 2:
            return
        initial_state = _copy(steps[0]["obs"])
        final_state = _copy(steps[-1]["obs"])
        rows: list[dict[str, Any]] = []
        for s in steps[:-1]:
            o, rhs, o2, rhs2, r = self.her_function(
                _copy(s["obs"]), _copy(s.get(RHS)), _copy(s["next_obs"]),
                _copy(s.get(RHS2)), _copy(s["reward"]).reshape(1, 1),
                initial_state, final_state)
            row = dict(s)
            row.update(obs=to_numpy(o), next_obs=to_numpy(o2),
                       reward=np.asarray(to_numpy(r), dtype=np.float32).reshape(1))
            if "rhs" in row:
                row["rhs"] = to_numpy(rhs)
            if "rhs2" in row:
                row["rhs2"] = to_numpy(rhs2)
            rows.append(row)
        self._write_hindsight(env, rows)

    def _write_hindsight(self, env: int, rows: list[dict[str, Any]]) -> None:
        """Write an episode's hindsight rows ``[m]`` to lane ``num_envs + env``."""
        buf = self._core()
        stored = {name: _stack([r[name] for r in rows]) for name in rows[0]
                  if name not in (RHS, RHS2)}
        m = len(rows)
        truncated = np.zeros((m, 1), dtype=bool)
        truncated[-1] = True  # the copy ends here: windows stop, bootstrapping does not
        priority = None if self._priority is None else np.full(m, float(self.error))
        buf.extend(truncated=truncated, env_ids=[self._num_envs + env], priority=priority,
                   **stored)
        self.relabelled += m


def _row(value: Any, e: int) -> Any:
    """Env ``e``'s value ``[1, *shape]`` (a copy)."""
    if isinstance(value, dict):
        return {k: _row(v, e) for k, v in value.items()}
    return np.array(value[e:e + 1])


def _copy(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return np.array(value)


def _stack(values: list[Any]) -> Any:
    """Per-step values ``[1, *shape]`` as one extend argument ``[m, 1, *shape]``."""
    if isinstance(values[0], dict):
        return {k: _stack([v[k] for v in values]) for k in values[0]}
    return np.stack(values)
