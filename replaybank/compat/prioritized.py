"""``PrioritizedReplayBuffer``: a ReplayBuffer with a :class:`PrioritizedSampler`.

One implementation, two spellings: ``PrioritizedReplayBuffer(capacity, alpha=..)`` is
exactly ``ReplayBuffer(capacity, sampler=PrioritizedSampler(alpha=..))``.

Example:
    >>> import numpy as np
    >>> buf = PrioritizedReplayBuffer(100, alpha=0.6, beta=0.4, seed=0, n_step=3)
    >>> buf.extend(obs=np.zeros((5, 2), np.float32), action=np.zeros(5), reward=np.ones(5),
    ...            next_obs=np.zeros((5, 2), np.float32), terminated=np.zeros(5, bool),
    ...            truncated=np.zeros(5, bool))
    >>> batch = buf.sample(4)
    >>> sorted(k for k in ("weights", "probabilities", "discount") if k in batch)
    ['discount', 'probabilities', 'weights']
    >>> buf.update_priorities(batch.indices, np.abs(np.arange(4.0)))
    4
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.buffers.replay import ReplayBuffer
from replaybank.errors import ConfigError
from replaybank.samplers.prioritized import PrioritizedSampler

__all__ = ["PrioritizedReplayBuffer"]


# typed as numpy batches, its usual storage (a storage= passed through **kwargs is not
# seen by the checker: the base's overloads choose it)
class PrioritizedReplayBuffer(ReplayBuffer[npt.NDArray[Any]]):
    """Proportional prioritized replay (Schaul et al. 2016) over ``num_envs`` lanes.

    Args:
        capacity: Total transitions over all lanes.
        alpha: Priority exponent; stored priority is ``(p + eps) ** alpha``.
        beta: Importance-sampling exponent (override per call with ``sample(B, beta=..)``).
        eps: Added to every priority.
        weight_norm: ``"buffer"`` (default), ``"batch"`` or None; see
            :class:`~replaybank.samplers.prioritized.PrioritizedSampler`.
        num_envs: Number of lanes.
        seed: Seed or Generator for sampling.
        beta_schedule: ``"constant"`` or ``"linear"`` (beta to 1 over ``beta_steps`` calls).
        beta_steps: Length of the linear schedule.
        **kwargs: Any other :class:`~replaybank.buffers.replay.ReplayBuffer` argument
            (``spec``, ``n_step``, ``gamma``, ``frame_stack``, ``storage``, ...).

    Raises:
        ConfigError: ``sampler=`` given (this front end builds its own), or a bad argument.

    Example:
        >>> PrioritizedReplayBuffer(8).sampler.config()["alpha"]
        0.6
    """

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        weight_norm: str | None = "buffer",
        num_envs: int = 1,
        seed: int | np.random.Generator | None = None,
        beta_schedule: str = "constant",
        beta_steps: int = 100_000,
        **kwargs: Any,
    ) -> None:
        if "sampler" in kwargs:
            raise ConfigError(
                "PrioritizedReplayBuffer(sampler=...): this buffer builds its own "
                "PrioritizedSampler; use ReplayBuffer(sampler=...) for another sampler"
            )
        sampler = PrioritizedSampler(alpha=alpha, beta=beta, eps=eps, weight_norm=weight_norm,
                                     beta_schedule=beta_schedule, beta_steps=beta_steps)
        super().__init__(capacity, num_envs=num_envs, seed=seed, sampler=sampler, **kwargs)
