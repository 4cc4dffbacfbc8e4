"""NEXT_STEP autoreset in a rollout: which stored steps are reset steps, and where the
truncated steps before them bootstrap from.

gymnasium's vector envs reset a finished sub-env on the *next* ``step()`` by default
(``AutoresetMode.NEXT_STEP``): that call ignores the action and returns the reset
observation with reward 0 and ``terminated = truncated = False``. An on-policy loop that
adds every step (``obs = next_obs``) therefore stores, right after each episode end, one
step that is not a transition: its ``obs`` is the ended episode's final observation and
its ``value`` is ``V(final obs)``. With ``autoreset_mode="next_step"`` the rollout buffer
keeps such *reset steps* but marks them invalid (:func:`reset_mask`), and uses their
``value`` as the bootstrap of the truncated step before them (:func:`next_step_bootstrap`).

Every function here is pure: arrays in, arrays out, shapes ``[pos, num_envs]``.

Example:
    >>> import numpy as np
    >>> done = np.array([[False, True], [True, False], [False, False]])  # [pos=3, E=2]
    >>> reset_mask(done, start=np.array([False, False]))[:, 1].tolist()
    [False, True, False]
    >>> values = np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])
    >>> cut = np.array([[False, True], [True, False], [False, False]])
    >>> next_step_bootstrap(values, np.array([9.0, 9.0]), cut).tolist()
    [[nan, 0.4], [0.5, nan], [nan, nan]]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["next_step_bootstrap", "reset_mask"]

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


def reset_mask(done: BoolArray, start: BoolArray) -> BoolArray:
    """Which stored steps are NEXT_STEP reset steps.

    A step is a reset step when the same env's previous step ended an episode. Reset
    steps never end an episode themselves (the buffer refuses such adds), so step ``t``
    is a reset step exactly when step ``t - 1`` is done.

    Args:
        done: ``terminated | truncated`` ``[pos, num_envs]``.
        start: ``[num_envs]``: the env's last step before this rollout ended an episode
            (its step 0 here is then a reset step).

    Returns:
        ``[pos, num_envs]`` bool, True at reset steps.
    """
    out: BoolArray = np.concatenate([start[None].astype(bool), done[:-1].astype(bool)])
    return out[: len(done)]


def next_step_bootstrap(values: Any, last_values: FloatArray, cut: BoolArray) -> FloatArray:
    """``V(final obs)`` of the truncated steps ``cut``: the value stored at the next step
    (the reset step, whose ``obs`` is the final observation), or ``last_values`` when the
    truncated step is the last stored one.

    Args:
        values: Stored values ``[pos, num_envs]``.
        last_values: Values after the last stored step ``[num_envs]``.
        cut: ``[pos, num_envs]`` bool, the truncated steps that need a bootstrap.

    Returns:
        ``[pos, num_envs]`` float64: the bootstrap where ``cut``, NaN elsewhere.
    """
    val = np.asarray(values, dtype=np.float64)
    nxt = np.concatenate([val[1:], last_values[None].astype(np.float64)])  # [pos, E]
    out: FloatArray = np.where(cut, nxt, np.nan)
    return out
