"""GAE over each lane's *active* steps: the per-agent advantages of a multi-agent rollout.

A multi-agent rollout is stored time-aligned, ``[T, lanes]`` per agent (a lane is one
(agent, env) pair), with ``active`` False where the agent did not act. Each lane's
advantages are those of :func:`replaybank.ops.gae.gae` run over the lane's own sequence of
active steps: an inactive step is skipped (it is part of no step's GAE, and the active
step before it bootstraps from the value at the lane's *next active* step, discounted
once), and each lane's own ``terminated`` / ``truncated`` ends cut its recursion.

The skip is index arithmetic, not a second GAE: every lane's active steps are moved, in
time order, to the *end* of the time axis (a stable sort on ``active``), the inactive
ones before them become zero-reward terminal padding of value 0 (advantage exactly 0,
and nothing flows out of them, since every step looks forward only), the one GAE runs on
that array, and the results go back to their steps. Right-aligning keeps each lane's
last active step at ``T - 1``, where ``last_values`` bootstraps it.

Example:
    >>> import numpy as np
    >>> act = np.array([[True], [False], [True]])      # [T=3, lanes=1]: step 1 skipped
    >>> adv = active_gae(np.ones((3, 1)), np.zeros((3, 1)), np.zeros((3, 1), bool),
    ...                  np.zeros((3, 1), bool), act, last_values=np.zeros(1),
    ...                  gamma=0.5, gae_lambda=1.0)
    >>> adv[:, 0].tolist()                              # 1 + 0.5 * 1, 0, 1
    [1.5, 0.0, 1.0]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops.gae import Backend, gae

__all__ = ["active_gae", "needs_last_value"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def needs_last_value(active: BoolArray, terminated: BoolArray,
                     truncated: BoolArray) -> BoolArray:
    """Which lanes bootstrap from ``last_values``: their last active step exists and did
    not end their episode.

    Args:
        active: ``[T, lanes]`` bool.
        terminated: ``[T, lanes]`` bool.
        truncated: ``[T, lanes]`` bool.

    Returns:
        ``[lanes]`` bool.

    Example:
        >>> act = np.array([[True, True, False], [False, True, False]])
        >>> end = np.array([[False, False, False], [False, True, False]])
        >>> needs_last_value(act, end, np.zeros_like(end)).tolist()
        [True, False, False]
    """
    steps = active.shape[0]
    any_active = active.any(axis=0)  # [lanes]
    last = steps - 1 - np.argmax(active[::-1], axis=0)  # [lanes]: last active step
    cols = np.arange(active.shape[1])
    ended = (terminated | truncated)[last, cols] if steps else np.zeros_like(any_active)
    out: BoolArray = any_active & ~ended
    return out


def active_gae(rewards: Any, values: Any, terminated: Any, truncated: Any, active: Any,
               last_values: Any, final_values: Any = None, *, gamma: float = 0.99,
               gae_lambda: float = 0.95, backend: Backend = "auto") -> FloatArray:
    """GAE advantages of every lane over its active steps only.

    Args:
        rewards: ``r_t`` ``[T, lanes]`` (read only where active).
        values: ``V(s_t)`` ``[T, lanes]`` (read only where active).
        terminated: ``[T, lanes]`` bool: the lane's episode ended in a terminal state.
        truncated: ``[T, lanes]`` bool: the lane's episode was cut off (bootstraps from
            ``final_values``).
        active: ``[T, lanes]`` bool: the lane acted at the step.
        last_values: ``[lanes]``: value after the lane's last active step (read only
            where :func:`needs_last_value`; other entries may be NaN).
        final_values: ``[T, lanes]``: value of the true final observation of each active
            ``truncated & ~terminated`` step (other entries may be NaN), or None when there
            are none.
        gamma: Discount factor.
        gae_lambda: GAE lambda.
        backend: See :func:`replaybank.ops.gae.reverse_scan`.

    Returns:
        Advantages ``[T, lanes]`` float64, exactly 0 at inactive steps.

    Raises:
        ValueError: An active truncated step without a finite final value (from
            :func:`~replaybank.ops.gae.gae`).
    """
    act = np.asarray(active, dtype=bool)  # [T, lanes]
    order = np.argsort(act, axis=0, kind="stable")  # [T, lanes]: inactive, then active

    def moved(x: Any, fill: Any) -> npt.NDArray[Any]:
        """``x`` with each lane's active steps right-aligned, ``fill`` before them."""
        arr = np.where(act, x, fill)
        out: npt.NDArray[Any] = np.take_along_axis(arr, order, axis=0)
        return out

    pad = ~np.take_along_axis(act, order, axis=0)  # [T, lanes]: padding rows
    term = moved(np.asarray(terminated, dtype=bool), True)  # padding is terminal
    trunc = moved(np.asarray(truncated, dtype=bool), False)
    fv = None if final_values is None else moved(np.asarray(final_values, np.float64), np.nan)
    last = np.where(needs_last_value(act, np.asarray(terminated, dtype=bool),
                                     np.asarray(truncated, dtype=bool)),
                    np.asarray(last_values, dtype=np.float64), 0.0)  # [lanes]
    adv_moved = gae(moved(np.asarray(rewards, np.float64), 0.0),
                    moved(np.asarray(values, np.float64), 0.0), term | pad, trunc, last, fv,
                    gamma=gamma, gae_lambda=gae_lambda, backend=backend)
    adv = np.zeros(act.shape, dtype=np.float64)
    np.put_along_axis(adv, order, adv_moved, axis=0)
    adv[~act] = 0.0
    return adv
