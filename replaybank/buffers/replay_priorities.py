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

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import ConfigError, DtypeError, ReplayBankError, ShapeError, describe
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
    size = out[0] * out[1]
    if type(priority) is float or type(priority) is int:  # one Python number: no array ops
        if not 0.0 <= priority < math.inf:
            raise DtypeError(f"priority={describe(priority)}: must be finite and >= 0")
        return np.full(size, float(priority))
    p = np.asarray(priority, dtype=np.float64)
    if p.size == 1:
        p = np.full(out, float(p.reshape(-1)[0]))
    if p.size != size:
        raise ShapeError(
            f"priority={describe(priority)}: expected one priority per step "
            f"({size} values)"
        )
    # NaN fails the first test, -inf and negatives too, +inf the second
    if size and not (p.min() >= 0.0 and p.max() < math.inf):
        raise DtypeError(f"priority={describe(priority)}: must be finite and >= 0")
    return p.reshape(-1)


def update_priorities(buf: ReplayBuffer, indices: Any, priorities: Any) -> int:
    """:meth:`ReplayBuffer.update_priorities <replaybank.buffers.replay.ReplayBuffer.
    update_priorities>` (returns, raises and all): set the priorities of the still-live
    ``indices``; stale ones (overwritten since they were sampled) are skipped."""
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


def write_prioritized(buf: ReplayBuffer, plan: Any, env_ids: Any, priority: Any,
                      steps: int | None, args: tuple[Any, ...]) -> bool:
    """An ``add`` (``steps=None``) or ``extend`` of ``steps`` steps with initial
    priorities, in one compiled call; False when the general path must take it.

    The priorities are checked first (nothing is written when they are bad: the
    general path then raises), then ``quiet`` (the compiled writer that does not tell
    the sampler) writes, then the sampler gets the written slots with the priorities,
    in the order the general path gives them (row-major ``[steps, lanes]``).

    Args:
        buf: The buffer.
        plan: The buffer's :class:`~replaybank.buffers.fastpath.FastPlan`; its
            ``quiet`` compiled ``(add, extend, add_lanes)`` (or None) writes.
        env_ids: The call's ``env_ids`` (adds only).
        priority: The call's priorities.
        steps: Steps of an ``extend`` (the leading dim of ``obs``), None for an ``add``.
        args: ``(obs, action, reward, next_obs, terminated, truncated, extras)``.
    """
    quiet = plan.quiet
    if quiet is None:
        return False
    t = buf.table
    lanes = t.lanes
    if env_ids is None:
        ids = plan.all_lanes
    elif steps is None and isinstance(env_ids, (list, tuple, np.ndarray)):
        ids = np.asarray(env_ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            return False
        ids = ids.astype(np.int64)
    else:
        return False
    n = 1 if steps is None else steps
    try:
        prio = check_priority(buf.sampler, priority, (n, len(ids)))
    except ReplayBankError:
        return False  # the general path reports it (after checking the values first)
    add, extend, add_lanes = quiet
    if steps is not None:
        if not extend(*args):
            return False
    elif env_ids is None:
        if not (add(*args) or add_lanes(None, *args)):
            return False
    elif not add_lanes(env_ids, *args):
        return False
    # the written steps' slots, [n, m] row-major as the general path tells them
    rows = (t.written[ids][None, :] - n + np.arange(n)[:, None]) % t.T
    buf.sampler.on_write((rows * lanes + ids[None, :]).reshape(-1), prio)
    return True
