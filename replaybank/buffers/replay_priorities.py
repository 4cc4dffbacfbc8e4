"""Priorities of a replay buffer's steps: checking the initial ones an ``add``/``extend``
passes and applying the new ones a learner sends back for sampled ``batch.indices``.

Both only talk to the buffer's sampler (a :class:`~replaybank.samplers.base.
PrioritySampler`); values are checked before any of them is applied.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(8, seed=0, sampler=rb.PrioritizedSampler())
    >>> buf.extend(obs=np.zeros((4, 2)), action=np.zeros(4), reward=np.ones(4),
    ...            next_obs=np.ones((4, 2)), terminated=np.zeros(4, bool),
    ...            truncated=np.zeros(4, bool))
    >>> update_priorities(buf, buf.sample(2).indices, [0.5, 2.0])
    2
    >>> check_priority(buf.sampler, 1.0, (2, 1)).tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import ConfigError, DtypeError, ShapeError, describe
from replaybank.ops import ring
from replaybank.samplers.base import Sampler

if TYPE_CHECKING:
    from replaybank.buffers.replay import ReplayBuffer

__all__ = ["check_priority", "update_priorities"]

FloatArray = npt.NDArray[np.float64]


def check_priority(sampler: Sampler, priority: Any, out: tuple[int, int]) -> FloatArray | None:
    """The initial priorities of a write of ``out = (steps, lanes)`` steps, flat.

    Args:
        sampler: The buffer's sampler.
        priority: None, one value for every step, or one value per step.
        out: ``(steps, lanes)`` of the write.

    Returns:
        ``[steps * lanes]`` float64 priorities, or None when ``priority`` is None.

    Raises:
        ConfigError: The sampler has no priorities.
        ShapeError: The number of values is neither 1 nor one per step.
        DtypeError: A priority is negative, NaN or infinite.
    """
    if priority is None:
        return None
    if not callable(getattr(sampler, "update", None)):  # isinstance(PrioritySampler), cheaper
        raise ConfigError(
            f"priority={describe(priority)}: this buffer's sampler "
            f"({type(sampler).__name__}) has no priorities; use a PrioritizedSampler"
        )
    p = np.asarray(priority, dtype=np.float64)
    if p.size == 1:
        p = np.full(out, float(p.reshape(-1)[0]))
    if p.size != out[0] * out[1]:
        raise ShapeError(
            f"priority={describe(priority)}: expected one priority per step "
            f"({out[0] * out[1]} values)"
        )
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise DtypeError(f"priority={describe(priority)}: must be finite and >= 0")
    return p.reshape(-1)


def update_priorities(buf: ReplayBuffer, indices: Any, priorities: Any) -> int:
    """:meth:`ReplayBuffer.update_priorities <replaybank.buffers.replay.ReplayBuffer.
    update_priorities>`: set the priorities of the still-live ``indices``.

    Returns:
        Number of priorities applied (stale ones excluded).

    Raises:
        ConfigError: The sampler has no priorities.
        ShapeError: Lengths differ.
        DtypeError: A priority is negative, NaN or infinite.
    """
    # a plain attribute check: isinstance() on a runtime Protocol costs ~40 us a call
    update = getattr(buf.sampler, "update", None)
    if not callable(update):
        raise ConfigError(
            f"update_priorities: this buffer's sampler ({type(buf.sampler).__name__}) "
            "has no priorities; build it with sampler=PrioritizedSampler(...)"
        )
    keys = ring.as_int_array(indices, "indices")
    p = np.asarray(priorities, dtype=np.float64).reshape(-1)
    if len(p) != len(keys):
        raise ShapeError(
            f"update_priorities: {len(keys)} indices but {len(p)} priorities; "
            "pass one priority per index"
        )
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        bad = p[~np.isfinite(p) | (p < 0)][:4].tolist()
        raise DtypeError(
            f"update_priorities(priorities=...): values {bad} are negative, NaN or "
            "infinite; pass finite priorities >= 0 (e.g. abs(td_error))"
        )
    fused = getattr(buf.sampler, "update_keys", None)
    if fused is not None:  # PrioritizedSampler: stale filter + slots + update in one pass
        return int(fused(keys, p, buf.lane_view()))
    t = buf.table
    live = ring.is_live(keys, t.written, t.counts)
    slots = ring.key_to_slot(keys[live], t.T, t.lanes)
    update(slots, p[live])
    return int(live.sum())
