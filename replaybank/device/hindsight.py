"""Hindsight relabelling of a batch gathered from device storage (``storage="torch"``).

:class:`~replaybank.views.hindsight.HerView` chooses on the host which rows get a new
goal and the step each goal comes from: that choice depends only on the lane counters,
the links and the episode index (:class:`~replaybank.ops.episodes.EpisodeIndex`, kept
from host bookkeeping: :meth:`~replaybank.ops.episodes.EpisodeIndex.sync_newest`), and
uses the buffer's numpy generator, so it is the very choice numpy storage makes under the
same seed. This module does the rest where the data lives: the goals are gathered from
the device tensors with index tensors, written into the desired-goal columns, and the
rewards (and, with ``terminated_fn``, terminations, windows cut short, discounts) are
recomputed with torch ops. Only host index arrays travel to the device; no device value
is read on the host (no ``.item()``, ``.cpu()``, ``nonzero`` or boolean masks), so a
sample queues its work on the device and returns.

The user's functions get device tensors: ``reward_fn(achieved [N, *g], desired [N, *g],
{})`` with ``achieved`` and ``desired`` torch tensors on the storage's device. They may
return a tensor (on any device: it is moved) or anything ``numpy.asarray`` takes (copied
to the device), one value per pair.

torch is never imported here: device storage imported it, and it is taken from
``sys.modules`` (the core imports no torch at module level).

Example:
    >>> import numpy as np, torch
    >>> import replaybank as rb
    >>> def reward(achieved, desired, info):          # torch tensors in, a tensor out
    ...     return -((achieved - desired).abs().sum(-1) > 0).float()
    >>> buf = rb.HerReplayBuffer(64, reward_fn=reward, strategy="final", k=4, seed=0,
    ...                          storage="torch", device="cpu")
    >>> goal = np.array([9.0], np.float32)
    >>> for t in range(5):
    ...     buf.add(obs={"observation": np.array([t], np.float32),
    ...                  "achieved_goal": np.array([t], np.float32), "desired_goal": goal},
    ...             action=0, reward=-1.0,
    ...             next_obs={"observation": np.array([t + 1], np.float32),
    ...                       "achieved_goal": np.array([t + 1], np.float32),
    ...                       "desired_goal": goal},
    ...             terminated=False, truncated=t == 4)
    >>> b = buf.sample(256)
    >>> new = b["relabeled"]                            # a bool tensor on the device
    >>> b.obs["desired_goal"][new, 0].unique().tolist()  # "final": the last achieved goal
    [5.0]
    >>> bool((b.reward[new] == (b.next_obs["achieved_goal"][new, 0] == 5).float() - 1).all())
    True
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from replaybank.errors import DtypeError, ShapeError
from replaybank.ops import nstep
from replaybank.storage.table import StepTable
from replaybank.views.base import next_name
from replaybank.views.hindsight import count_message, function_values
from replaybank.views.nstep import NStepView
from replaybank.views.transition import TransitionView

__all__ = ["Relabeling", "device_relabel", "to_device"]

IntArray = npt.NDArray[np.int64]


class Relabeling(Protocol):
    """What the device relabelling reads of a hindsight view
    (:class:`~replaybank.views.hindsight.HerView` has it): the goal fields, the reward and
    termination functions, and the n-step settings of its inner view."""

    achieved: str
    desired: str
    reward_fn: Callable[..., Any]
    terminated_fn: Callable[..., Any] | None
    inner: NStepView | TransitionView
    n_step: int
    gamma: float


def _torch() -> Any:
    return sys.modules["torch"]  # device storage imported it


def to_device(values: npt.NDArray[Any], like: Any) -> Any:
    """Host array ``values`` as a tensor on ``like``'s device (a host-to-device copy)."""
    arr = np.ascontiguousarray(values)
    if not arr.flags.writeable:  # torch wraps writeable memory only
        arr = arr.copy()
    return _torch().from_numpy(arr).to(like.device, non_blocking=True)


def device_relabel(view: Relabeling, table: StepTable, out: dict[str, Any], keys: IntArray,
                   rows: IntArray, nxt: IntArray, side: IntArray) -> None:
    """Relabel the ``rows`` ``[S]`` of a device batch ``out`` in place.

    Args:
        view: The HER view (strategy, functions, n-step settings, goal fields).
        table: A table with device arrays.
        out: The inner view's fields of the batch (device tensors ``[B, ...]``).
        keys: The batch's item keys ``[B]`` (host).
        rows: The relabelled rows in batch order (host, from the goal kernel).
        nxt: The slot of the step after each goal step (host).
        side: The side slot of each goal step's next observation, or -1 (host).

    Raises:
        ShapeError: ``reward_fn`` or ``terminated_fn`` returned the wrong number of values.
        DtypeError: It returned a complex tensor, or host values that are not finite real
            numbers.
    """
    be = table.backend
    goals = table.take(view.achieved, nxt)  # [S, *g] on the device
    aside = (side >= 0).nonzero()[0]
    if len(aside):
        be.write(goals, aside, be.gather(table.side.arrays[view.achieved], side[aside]))
    # the goals as the batch holds them: the rewards are those of the goals served
    goals = goals.to(out[view.desired].dtype)
    at = to_device(rows, goals)  # [S]
    for name in (view.desired, next_name(view.desired)):
        _put(out, name, at, goals)
    s, n = len(rows), view.n_step
    if n == 1:
        achieved = out[next_name(view.achieved)].index_select(0, at)  # [S, *g]
        _put(out, "reward", at, _call(view.reward_fn, "reward_fn", achieved, goals, s))
        if view.terminated_fn is not None:
            term = _call(view.terminated_fn, "terminated_fn", achieved, goals, s) != 0
            _put(out, "terminated", at, term)
        return
    assert isinstance(view.inner, NStepView)
    wslots, length = view.inner.window(table, keys[rows])  # [S, n], [S] (host)
    flat = wslots.reshape(-1)
    where = table.next_index(flat)
    achieved = table.take_next(view.achieved, *where)  # [S * n, *g]
    repeated = goals.repeat_interleave(n, dim=0)  # [S * n, *g]
    # the window steps in [S * n] (host): the functions see these only, as on the host
    inside = to_device(np.flatnonzero(np.arange(n)[None, :] < length[:, None]), at)
    rewards = _in_windows(view.reward_fn, "reward_fn", achieved, repeated, inside, s, n)
    if view.terminated_fn is None:
        weights = to_device(nstep.return_weights(length, n, view.gamma), rewards)
    else:
        weights = _cut_windows(view, table, out, at, achieved, repeated, inside, flat,
                               where, length, s)
    returns = (rewards.double() * weights.double()).sum(dim=1)
    _put(out, "reward", at, returns)


def _in_windows(fn: Callable[..., Any], what: str, achieved: Any, desired: Any,
               inside: Any, s: int, n: int) -> Any:
    """``fn``'s values ``[S, n]`` for the window steps at ``inside`` (positions in the
    ``[S * n]`` pairs ``achieved``, ``desired``), zero past each window's end: ``fn``
    never sees those steps (other episodes' steps, or slots never written)."""
    got = _call(fn, what, achieved.index_select(0, inside), desired.index_select(0, inside),
                int(inside.numel()))
    full = _torch().zeros(s * n, dtype=got.dtype, device=got.device)
    return full.index_copy_(0, inside, got).reshape(s, n)


def _cut_windows(view: Relabeling, table: StepTable, out: dict[str, Any], at: Any,
                 achieved: Any, repeated: Any, inside: Any, flat: IntArray,
                 where: tuple[IntArray, IntArray, IntArray], length: IntArray,
                 s: int) -> Any:
    """``terminated_fn`` with n-step windows: each window ends at its first relabelled
    termination (its next observations, ``truncated``, ``terminated`` and ``discount``
    follow), all on the device; returns the return weights ``[S, n]`` float64."""
    torch = _torch()
    n = view.n_step
    assert view.terminated_fn is not None
    term = _in_windows(view.terminated_fn, "terminated_fn", achieved, repeated, inside,
                       s, n) != 0
    k = torch.arange(n, device=at.device)
    full = to_device(length, at)  # [S] the windows' lengths before relabelling
    term &= k[None, :] < full[:, None]
    hit = term.any(dim=1)
    cut = torch.where(hit, term.to(torch.uint8).argmax(dim=1) + 1, full)  # [S] in [1, n]
    moved = cut != full
    pick = torch.arange(s, device=at.device) * n + (cut - 1)  # [S] last step in [S * n]
    for name in table.obs_fields:
        if name == view.desired:
            continue  # the new goal stays
        nx = achieved if name == view.achieved else table.take_next(name, *where)
        key = next_name(name)
        kept = out[key].index_select(0, at)
        _put(out, key, at, torch.where(_rows(moved, kept), nx.index_select(0, pick), kept))
    trunc = table.take("truncated", flat).index_select(0, pick)
    kept = out["truncated"].index_select(0, at)
    _put(out, "truncated", at, torch.where(moved, trunc.to(kept.dtype), kept))
    _put(out, "terminated", at, hit)
    # gamma ** L and gamma ** k as numpy computes them (host tables, indexed on the device)
    powers = np.arange(n + 1, dtype=np.int64)
    discount = to_device((view.gamma ** powers.astype(np.float64)).astype(np.float32), at)
    _put(out, "discount", at, discount.index_select(0, cut))
    pw = to_device(float(view.gamma) ** powers[:n], at)  # [n] float64
    return torch.where(k[None, :] < cut[:, None], pw[None, :], torch.zeros_like(pw))


def _rows(mask: Any, like: Any) -> Any:
    """``mask`` ``[S]`` shaped to broadcast over ``like`` ``[S, *shape]``."""
    return mask.view(-1, *([1] * (like.dim() - 1)))


def _put(out: dict[str, Any], name: str, at: Any, values: Any) -> None:
    """``out[name][at] = values`` on the device (cast to the field's dtype, as numpy's
    assignment casts)."""
    arr = out[name]
    arr.index_copy_(0, at, values.to(arr.dtype).reshape(-1, *arr.shape[1:]))


def _call(fn: Callable[..., Any], what: str, achieved: Any, desired: Any, n: int) -> Any:
    """``fn(achieved, desired, {})`` as a device tensor ``[n]``: host values are checked
    as :func:`function_values` checks them; a device tensor must be real (its values are
    not read: that would synchronise)."""
    torch = _torch()
    got = fn(achieved, desired, {})
    if not isinstance(got, torch.Tensor):  # host values: checked, copied to the device
        got = to_device(function_values(got, what, n, tuple(achieved.shape)), achieved)
    else:
        if got.is_complex():
            raise DtypeError(f"HerView: {what} returned a complex tensor ({got.dtype}); "
                             "return real values (e.g. .abs() or .real)")
        if got.device != achieved.device:
            got = got.to(achieved.device, non_blocking=True)
    if got.numel() != n:
        raise ShapeError(count_message(what, tuple(got.shape), n, tuple(achieved.shape)))
    return got.reshape(n)
