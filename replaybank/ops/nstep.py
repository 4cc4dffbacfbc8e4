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

import numpy as np
import numpy.typing as npt

__all__ = ["discounted_returns", "return_weights", "window_keys", "window_lengths"]

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

    Args:
        rewards: ``[B, n]`` rewards of the window steps (entries past ``L`` are ignored).
        lengths: ``[B]`` window lengths in ``[1, n]``.
        gamma: Discount factor.
    """
    r = np.asarray(rewards, dtype=np.float64)
    w = return_weights(lengths, r.shape[1], gamma)
    return np.asarray(np.sum(r * w, axis=1), dtype=np.float64)


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
