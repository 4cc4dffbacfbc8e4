"""n-step return arithmetic over ``[B, n]`` windows of stored one-step data.

For a sampled step ``t`` the window is steps ``t .. t+n-1`` of the same lane. It stops
at (and includes) the first step that is a *boundary* (its next observation is not the
next step's observation: an episode end, a discontinuity, or the lane's newest step),
so ``L = min(n, steps up to and including the first boundary)``, and

``G = sum_{k<L} gamma**k * r[t+k]``, ``discount = gamma**L``.

Example:
    >>> import numpy as np
    >>> boundary = np.array([[False, False, False], [False, True, False]])
    >>> L = window_lengths(boundary)
    >>> L.tolist()
    [3, 2]
    >>> rewards = np.ones((2, 3))
    >>> discounted_returns(rewards, L, 0.5).tolist()
    [1.75, 1.5]
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops.jit import pick_kernel

__all__ = ["discounted_returns", "nstep_kernel", "nstep_windows", "return_powers",
           "return_weights", "window_keys", "window_lengths"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def window_keys(keys: IntArray, n: int, lanes: int) -> IntArray:
    """Item keys of the steps ``t, t+1, .., t+n-1`` of each key's lane, ``[B, n]``.

    Keys past a lane's newest step name no stored step; callers mask them out with
    :func:`window_lengths` before use.

    Example:
        >>> window_keys(np.array([1, 4]), 3, lanes=2).tolist()
        [[1, 3, 5], [4, 6, 8]]
    """
    keys = np.asarray(keys, dtype=np.int64)
    return keys[:, None] + np.arange(n, dtype=np.int64)[None, :] * lanes


def window_lengths(boundary: BoolArray) -> IntArray:
    """Window lengths ``L`` ``[B]``: steps up to and including the first boundary, at most n.

    Args:
        boundary: ``[B, n]``; ``boundary[b, k]`` says step ``t+k`` ends the window.
    """
    boundary = np.asarray(boundary, dtype=bool)
    n = boundary.shape[1]
    first = np.argmax(boundary, axis=1)  # 0 when none
    has = boundary[np.arange(boundary.shape[0]), first]
    return np.asarray(np.where(has, first + 1, n), dtype=np.int64)


def discounted_returns(rewards: npt.NDArray[np.floating], lengths: IntArray,
                       gamma: float) -> FloatArray:
    """``sum_{k < L} gamma**k * rewards[:, k]`` in float64, ``[B]``.

    The terms ``gamma**k * r`` (``0.0`` from ``k = L`` on, whatever the reward there:
    a NaN past the window stays out) are added from ``k = 0`` upwards as ``np.cumsum``
    adds them, the order the compiled n-step gather (:func:`nstep_windows`) uses too, so
    both give the same bits.

    Args:
        rewards: ``[B, n]`` rewards of the window steps (entries past ``L`` are ignored).
        lengths: ``[B]`` window lengths in ``[1, n]``.
        gamma: Discount factor.

    Example:
        >>> discounted_returns(np.array([[1.0, 1.0, np.nan]]), np.array([2]), 0.5).tolist()
        [1.5]
    """
    r = np.asarray(rewards, dtype=np.float64)
    return _summed(r, np.asarray(lengths), return_powers(r.shape[1], gamma))


def return_powers(n: int, gamma: float) -> FloatArray:
    """``gamma ** k`` for ``k < n``, float64 ``[n]``: the weights of every n-step return.

    Example:
        >>> return_powers(3, 0.5).tolist()
        [1.0, 0.5, 0.25]
    """
    return float(gamma) ** np.arange(n, dtype=np.float64)


def _summed(r: FloatArray, lengths: IntArray, weights: FloatArray) -> FloatArray:
    """The returns of float64 window rewards ``r`` ``[B, n]``: the terms ``r * weights``
    (0.0 from ``k = L`` on) added in ``np.cumsum`` order, ``[B]``."""
    k = np.arange(r.shape[1])
    terms = np.where(k[None, :] < lengths[:, None], r * weights[None, :], 0.0)
    return np.asarray(np.cumsum(terms, axis=1)[:, -1], dtype=np.float64)


def return_weights(lengths: IntArray, n: int, gamma: float) -> FloatArray:
    """Weights ``w[b, k] = gamma**k if k < L[b] else 0``, ``[B, n]`` float64.

    ``sum_k w[b, k] * r[b, k]`` is the n-step return; device storage applies the same
    weights to rewards that never leave the device.

    Example:
        >>> return_weights(np.array([1, 3]), 3, 0.5).tolist()
        [[1.0, 0.0, 0.0], [1.0, 0.5, 0.25]]
    """
    k = np.arange(n)
    return np.where(k[None, :] < np.asarray(lengths)[:, None], float(gamma) ** k[None, :], 0.0)


def nstep_windows(slots: IntArray, lanes: int, link: npt.NDArray[np.int32],
                  weights: FloatArray, rewards: npt.NDArray[np.floating], last: IntArray,
                  length: IntArray, returns: npt.NDArray[np.floating]) -> None:
    """The n-step windows of a batch of steps, written into ``last``, ``length`` and
    ``returns``: :func:`window_lengths` and :func:`discounted_returns` on a flat table.

    The oracle of the C kernel ``replaybank.ops.windows_c.nstep_windows`` (one call per
    batch: :class:`~replaybank.views.nstep.NStepView`). Step ``k`` of the window of slot
    ``s`` is ``(s + k * lanes) mod N``; a window stops at (and includes) its first step
    whose next observation is kept aside (``link > 0``). Every slot and link is checked
    before anything is written.

    Args:
        slots: ``[B]`` int64 storage slots of the first steps, each in ``[0, 2 N)`` with
            ``N = len(link)`` (one wrap allowed).
        lanes: The table's lanes.
        link: ``[N]`` int32, the table's flat link (side slot + 1, else 0).
        weights: ``[n]`` float64 ``gamma ** k`` (``n``: the longest window).
        rewards: ``[N]`` float32 or float64, the flat reward field.
        last: Out ``[B]`` int64: the slot of each window's last step (wrapped).
        length: Out ``[B]`` int64: the window lengths ``L`` in ``[1, n]``.
        returns: Out ``[B]`` of ``rewards``' dtype: the discounted returns.

    Raises:
        IndexError: A slot outside ``[0, 2 N)`` or a negative link in a window.
        TypeError, ValueError: Wrong dtypes or sizes.

    Example:
        >>> link = np.array([0, 0, 1, 0], np.int32)  # one lane; step 2 ends an episode
        >>> last, length, ret = np.empty(2, np.int64), np.empty(2, np.int64), np.empty(2)
        >>> nstep_windows(np.array([1, 3]), 1, link, np.array([1.0, 0.5, 0.25]),
        ...               np.array([1.0, 2.0, 4.0, 8.0]), last, length, ret)
        >>> last.tolist(), length.tolist(), ret.tolist()
        ([2, 1], [2, 3], [4.0, 9.0])
    """
    N = len(link)  # noqa: N806
    if weights.dtype != np.float64 or weights.ndim != 1 or len(weights) < 1:
        raise TypeError("nstep_windows: weights must be a float64 array of n >= 1 values")
    if rewards.dtype not in (np.float32, np.float64) or rewards.shape != (N,):
        raise TypeError(f"nstep_windows: rewards must be a float32 or float64 array of the "
                        f"link's {N} slots")
    if returns.dtype != rewards.dtype:
        raise TypeError("nstep_windows: returns must have the rewards' dtype")
    b = len(slots)
    if len(last) != b or len(length) != b or len(returns) != b:
        raise ValueError(f"nstep_windows: last, length and returns must hold {b} values")
    if b and (int(slots.min()) < 0 or int(slots.max()) >= 2 * N):
        raise IndexError(f"nstep_windows: a slot is out of bounds for {N} slots (one wrap "
                         "allowed)")
    n = len(weights)
    first = np.where(slots >= N, slots - N, slots)
    ks = (first[:, None] + np.arange(n, dtype=np.int64)[None, :] * int(lanes)) % N  # [B, n]
    lk = link[ks]
    lengths = window_lengths(lk != 0)
    if b and (lk[np.arange(b), lengths - 1] < 0).any():
        raise IndexError("nstep_windows: a negative link in a window")
    returns[:] = _summed(rewards[ks].astype(np.float64), lengths, weights)
    last[:] = ks[np.arange(b), lengths - 1]
    length[:] = lengths


@cache
def nstep_kernel(prefer: str = "auto") -> tuple[Any, str]:
    """:func:`nstep_windows` in C where the extension was built (``"c"``), else the
    numpy function itself (:func:`~replaybank.ops.jit.pick_kernel`; no numba twin).

    Example:
        >>> nstep_kernel("numpy") == (nstep_windows, "numpy")
        True
    """
    return pick_kernel(prefer, None, "nstep_windows", nstep_windows, "nstep_windows",
                       compiled="replaybank.ops.windows_c")
