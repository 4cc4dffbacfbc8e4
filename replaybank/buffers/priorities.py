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
    >>> traits = SamplerTraits.of(buf.sampler)
    >>> update_priorities(traits, buf.lane_view(), buf.sample(2).indices, [0.5, 2.0])
    2
    >>> check_priority(traits, 1.0, (2, 1)).tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import ConfigError, DtypeError, ShapeError, describe
from replaybank.host import is_tensor, tensor_to_numpy
from replaybank.ops import ring
from replaybank.ops.jit import pick_kernel
from replaybank.samplers.base import LaneView, SamplerTraits
from replaybank.spec import real_floats, rows_array

__all__ = [
    "check_priority",
    "checked_updates",
    "nothing_sampled",
    "priority_values",
    "stored_lanes",
    "to_host",
    "update_priorities",
]

FloatArray = npt.NDArray[np.float64]


def to_host(*values: Any) -> tuple[Any, ...]:
    """``values`` with every torch tensor among them as a host numpy array, in one transfer.

    Tensors may live on any device and may require grad: they are detached, floats made
    float64 and integers int64 on their device, and all tensors of one device travel in a
    single device-to-host copy (floats bit-cast to int64 beside the integers), so a GPU
    learner's ``update_priorities(batch.indices, td.abs())`` costs one synchronisation at
    most. Anything else (lists, numpy arrays, numbers) is returned unchanged. Built on
    :mod:`replaybank.host` (:func:`~replaybank.host.is_tensor` finds the tensors,
    :func:`~replaybank.host.tensor_to_numpy` copies those that travel alone), so torch is
    never imported here.

    Example:
        >>> import torch
        >>> keys, prio = to_host(torch.tensor([3, 1]), torch.ones(2, requires_grad=True))
        >>> keys.tolist(), prio.dtype.name
        ([3, 1], 'float64')
    """
    where = [i for i, v in enumerate(values) if is_tensor(v)]
    if not where:
        return values
    torch = sys.modules["torch"]  # loaded: there is a tensor
    out = list(values)
    parts = []
    for i in where:
        t = out[i].detach()
        if t.is_complex():  # as it is: the checks after refuse complex values
            out[i] = tensor_to_numpy(t)
            continue
        if t.is_floating_point():
            t = t.to(torch.float64)
        elif t.dtype != torch.bool:
            t = t.to(torch.int64)
        parts.append((i, t))
    if not parts:
        return tuple(out)
    devices = {t.device for _, t in parts}
    if len(parts) == 1 or len(devices) > 1:
        for i, t in parts:
            out[i] = tensor_to_numpy(t)
        return tuple(out)
    # one copy: every tensor flattened to int64 words
    words = [t.reshape(-1).view(torch.int64) if t.dtype == torch.float64 else
             t.reshape(-1).to(torch.int64) for _, t in parts]
    host = torch.cat(words).to("cpu").numpy()
    lo = 0
    for i, t in parts:
        n = t.numel()
        chunk = host[lo:lo + n]
        lo += n
        if t.dtype == torch.float64:
            chunk = chunk.view(np.float64)
        elif t.dtype == torch.bool:
            chunk = chunk != 0
        out[i] = chunk.reshape(tuple(t.shape))
    return tuple(out)


def _floats(value: Any, label: str, expected: str) -> FloatArray:
    """``value`` as float64 (a list, array, tensor or number of real numbers), a
    ShapeError for rows of different lengths (``expected``: the shape wanted, in words),
    or a DtypeError (strings, also numbers as text, None, complex values)."""
    (value,) = to_host(value)
    rows = rows_array(value, label, expected, "pass a flat list or array of numbers, e.g. "
                      "np.abs(td_errors)")
    return real_floats(rows, label, "pass priorities as numbers, e.g. np.abs(td_errors)")


def _bad_values(p: FloatArray, limit: float, call: str) -> DtypeError:
    """The error for priorities outside ``[0, limit]`` (NaN and +-inf included), showing
    the first four of them."""
    bad = p[~((p >= 0.0) & (p <= limit) & (p < math.inf))][:4].tolist()
    if limit < math.inf and all(math.isfinite(v) and v > limit for v in bad):
        return DtypeError(
            f"{call}: values {bad} exceed {limit:.6g}, the largest priority this "
            "sampler stores without its sum tree overflowing ((p + eps) ** alpha must stay "
            "<= 1e300 / capacity); rescale the priorities (e.g. divide by their max) or "
            "lower alpha"
        )
    return DtypeError(
        f"{call}: values {bad} are negative, NaN or infinite; pass finite priorities >= 0 "
        "(e.g. abs(td_error))"
    )


def check_priority(traits: SamplerTraits, priority: Any, out: tuple[int, int]
                   ) -> FloatArray | None:
    """The initial priorities of a write of ``out = (steps, lanes)`` steps, flat.

    Args:
        traits: The buffer's sampler's traits.
        priority: None, one value for every step, or one value per step.
        out: ``(steps, lanes)`` of the write.

    Returns:
        ``[steps * lanes]`` float64 priorities, or None when ``priority`` is None.

    Raises:
        ConfigError: The sampler has no priorities.
        ShapeError: The number of values is neither 1 nor one per step.
        DtypeError: A priority is not a number, negative, NaN, infinite or above the
            sampler's ``priority_limit``.
    """
    if priority is None:
        return None
    if traits.priority is None:
        raise ConfigError(
            f"priority={describe(priority)}: this buffer's sampler "
            f"({type(traits.sampler).__name__}) has no priorities; use a PrioritizedSampler"
        )
    limit = math.inf if traits.bounded is None else traits.bounded.priority_limit
    return priority_values(priority, out, limit)


def priority_values(priority: Any, out: tuple[int, int], limit: float,
                    label: str | None = None) -> FloatArray:
    """:func:`check_priority`'s rule for a sampler with priorities whose largest raw
    priority is ``limit`` (for a caller that knows the limit, not the sampler: the
    sharded service's client checks rows before it sends them).

    Args:
        priority: One value for every step, or one value per step.
        out: ``(steps, lanes)`` of the write.
        limit: The largest raw priority accepted (``inf``: no bound).
        label: What the messages call the value (default ``priority=<value>``).

    Returns:
        ``[steps * lanes]`` float64 priorities.

    Raises:
        ShapeError: The number of values is neither 1 nor one per step.
        DtypeError: A priority is not a number, negative, NaN, infinite or above
            ``limit``.

    Example:
        >>> priority_values([1.0, 2.0], (1, 2), 10.0).tolist()
        [1.0, 2.0]
    """
    size = out[0] * out[1]
    if type(priority) is float or type(priority) is int:  # one Python number: no array ops
        if not 0.0 <= priority <= limit or priority == math.inf:
            raise _bad_values(np.array([float(priority)]), limit,
                              label or f"priority={describe(priority)}")
        return np.full(size, float(priority))
    if label is None:
        label = f"priority={describe(priority)}"
    p = _floats(priority, label, f"one priority per step ({size} values) or one for all")
    if p.size == 1:
        p = np.full(out, float(p.reshape(-1)[0]))
    if p.size != size:
        raise ShapeError(f"{label}: expected one priority per step ({size} values)")
    # NaN fails the first test, -inf and negatives too, +inf the second
    if size and not (p.min() >= 0.0 and (hi := p.max()) < math.inf and hi <= limit):
        raise _bad_values(p.reshape(-1), limit, label)
    return p.reshape(-1)


def _valid_numpy(keys: npt.NDArray[np.int64], p: FloatArray, limit: float) -> bool:
    """Every key >= 0 and every priority in ``[0, limit]`` (NaN and +inf refused)."""
    hi = p.max()
    return bool(keys.min() >= 0 and p.min() >= 0.0 and hi <= limit and hi != math.inf)


@cache
def _valid() -> Callable[[npt.NDArray[np.int64], FloatArray, float], bool]:
    """The checks of :func:`update_priorities` (every key >= 0, every priority in
    ``[0, limit]``): one compiled pass where the C kernels are built, else
    :func:`_valid_numpy` (chosen once)."""
    mod = pick_kernel("auto", None, None, None, "update_priorities",
                      compiled="replaybank._sampling")[0]
    return _valid_numpy if mod is None else mod.valid_update


def checked_updates(indices: Any, priorities: Any, limit: float
                    ) -> tuple[npt.NDArray[np.int64], FloatArray]:
    """The arguments of an ``update_priorities`` call, checked: item keys and priorities,
    both flat ``[B]``. The checks of :func:`update_priorities`, for a caller that knows
    the sampler's limit but holds no sampler (the sharded service's client checks a call
    before it sends any of it).

    Args:
        indices: Item keys (``batch.indices``): numpy, a list or a torch tensor on any
            device; any shape (``[B]``, ``[B, 1]``: flattened).
        priorities: New priorities, one per key (a torch tensor may require grad).
        limit: The largest raw priority accepted (``inf``: no bound).

    Returns:
        ``(keys, priorities)``: ``[B]`` int64 and ``[B]`` float64.

    Raises:
        ConfigError: An index is negative (not a key).
        ShapeError: Lengths differ, or ``indices`` or ``priorities`` has rows of
            different lengths (a ragged list).
        DtypeError: Indices are not integers; a priority is not a number, negative, NaN,
            infinite or above ``limit``.

    Example:
        >>> keys, p = checked_updates(np.array([[3], [5]]), [0.5, 2.0], 10.0)
        >>> keys.tolist(), p.tolist()
        ([3, 5], [0.5, 2.0])
    """
    if type(indices) is np.ndarray and indices.dtype == np.int64 \
            and type(priorities) is np.ndarray and priorities.dtype.kind == "f":
        # the usual call (batch.indices and a float array): no tensors to move
        keys = indices.reshape(-1)
        p = priorities.astype(np.float64, copy=False).reshape(-1)
    else:
        indices, priorities = to_host(indices, priorities)  # tensors: one transfer at most
        keys = ring.as_int_array(indices, "indices", "update_priorities")
        if type(priorities) is np.ndarray and priorities.dtype.kind == "f":
            p = priorities.astype(np.float64, copy=False).reshape(-1)
        else:
            p = _floats(priorities, f"update_priorities(priorities={describe(priorities)})",
                        f"[B={len(keys)}] (one priority per index)").reshape(-1)
    if len(p) != len(keys):
        raise ShapeError(
            f"update_priorities: {len(keys)} indices but {len(p)} priorities; "
            "pass one priority per index"
        )
    if len(keys) and not _valid()(keys, p, limit):  # one pass where compiled; then name it
        if keys.min() < 0:
            raise ConfigError(
                f"update_priorities(indices=...): {keys[keys < 0][:4].tolist()} are negative; "
                "item keys are >= 0: pass batch.indices as sampled"
            )
        # NaN fails both tests, negatives the first, +inf and too large values the second
        hi = p.max()
        if not (p.min() >= 0.0 and hi <= limit) or hi == math.inf:
            raise _bad_values(p, limit, "update_priorities(priorities=...)")
    return keys, p


def nothing_sampled(method: str, keys: str, holder: str = "buffer") -> ShapeError:
    """The refusal of a priority update on a ``holder`` nothing was ever added to: no step
    was sampled from it, so no key can be one of its steps. One message for every update
    call (the buffer's, its sequence form, the sharded service's client).

    Args:
        method: The call refused (``"update_priorities"``).
        keys: Its argument of sampled keys (``"indices"``; the batch attribute of the
            same name holds them).
        holder: What is empty (``"buffer"``, ``"service"``).

    Returns:
        The :class:`~replaybank.errors.ShapeError` to raise.

    Example:
        >>> str(nothing_sampled("update_priorities", "indices")).split(";")[0]
        'update_priorities(indices=...): the buffer is empty (nothing was added yet)'
    """
    return ShapeError(
        f"{method}({keys}=...): the {holder} is empty (nothing was added yet); no step was "
        f"sampled from it whose priority could be set: add transitions, sample a batch, then "
        f"pass batch.{keys} of that sample"
    )


def stored_lanes(lanes: LaneView | None, method: str, keys: str) -> LaneView:
    """``lanes``, refusing an update on a buffer without storage (``lanes`` is None: nothing
    was added yet) with :func:`nothing_sampled`.

    Raises:
        ShapeError: ``lanes`` is None.
    """
    if lanes is None:
        raise nothing_sampled(method, keys)
    return lanes


def update_priorities(traits: SamplerTraits, lanes: LaneView | None, indices: Any,
                      priorities: Any) -> int:
    """Set the priorities of the still-live ``indices``; stale ones (overwritten since they
    were sampled) are skipped. The body of :meth:`ReplayBuffer.update_priorities
    <replaybank.buffers.replay.ReplayBuffer.update_priorities>` (returns, raises and all).

    Args:
        traits: The buffer's sampler's traits (its priorities are needed).
        lanes: The table's lane bookkeeping (None: the buffer has no storage yet).
        indices: Item keys ``[B]`` (``batch.indices``, all >= 0).
        priorities: New priorities ``[B]``.

    Raises:
        ConfigError: The sampler has no priorities, or an index is negative (not a key).
        ShapeError: Nothing was added yet (no step was sampled: :func:`nothing_sampled`),
            lengths differ, or ``indices`` or ``priorities`` has rows of different
            lengths (a ragged list).
        DtypeError: Indices are not integers; a priority is not a number, negative, NaN,
            infinite or above the sampler's ``priority_limit``.
    """
    sampler = traits.priority
    if sampler is None:
        raise ConfigError(
            f"update_priorities: this buffer's sampler ({type(traits.sampler).__name__}) "
            "has no priorities; build it with sampler=PrioritizedSampler(...)"
        )
    lanes = stored_lanes(lanes, "update_priorities", "indices")
    limit = math.inf if traits.bounded is None else traits.bounded.priority_limit
    keys, p = checked_updates(indices, priorities, limit)
    if traits.keyed is not None:  # stale filter + slots + update in one pass
        return int(traits.keyed.update_keys(keys, p, lanes))
    live = ring.is_live(keys, lanes.written, lanes.counts)
    slots = ring.key_to_slot(keys[live], lanes.T, lanes.lanes)
    sampler.update(slots, p[live])
    return int(live.sum())
