"""Generalized advantage estimation and discounted sums as pure array functions.

Every function works on time-major arrays ``[T, *batch]`` (``batch`` is usually
``(num_envs,)``) and loops over time only, vectorised over the batch dims. The one
recursion they share is the *reverse scan*

``y[t] = x[t] + coef[t] * y[t + 1]``,  ``y[T] = 0``,

which runs either as a numpy loop over ``t`` (``backend="numpy"``) or as a compiled numba
kernel (``backend="numba"``; same operations in the same order). ``backend="auto"`` uses
numba when it is installed and falls back to numpy otherwise. The kernel is compiled on its
first use and cached next to this module (``cache=True``).

GAE conventions (see :func:`gae`):

* ``delta_t = r_t + gamma * V_next_t * (1 - terminated_t) - V(s_t)``,
* ``V_next_t = V(s_{t+1})`` inside an episode, ``final_values[t]`` (the value of the true
  final observation) where step ``t`` was truncated, ``last_values`` after the last step,
* ``A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}`` with
  ``done = terminated | truncated``: the recursion is cut at every episode end,
* returns (value targets) are ``A_t + V(s_t)``, i.e. TD(lambda) returns.

Everything is computed in float64 whatever the input dtype.

Example:
    >>> import numpy as np
    >>> discount_cumsum(np.array([1.0, 2.0, 3.0]), 0.5).tolist()
    [2.75, 3.5, 3.0]
    >>> adv = gae(np.array([1.0, 1.0]), np.zeros(2), np.array([False, True]),
    ...           np.zeros(2, bool), last_values=5.0, gamma=0.5, gae_lambda=1.0)
    >>> adv.tolist()
    [1.5, 1.0]
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import cache
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from replaybank.errors import ConfigError, ShapeError, describe
from replaybank.host import as_numpy
from replaybank.ops.jit import pick_kernel

__all__ = ["Backend", "discount_cumsum", "gae", "numba_available", "reverse_scan"]

Backend = Literal["auto", "numpy", "numba"]
FloatArray = npt.NDArray[np.float64]


def numba_available() -> bool:
    """Whether numba is installed (``backend="auto"`` then uses the compiled kernel).

    Example:
        >>> isinstance(numba_available(), bool)
        True
    """
    return importlib.util.find_spec("numba") is not None


def _scan_numpy(x: FloatArray, coef: FloatArray, out: FloatArray) -> None:
    """``out[t] = x[t] + coef[t] * out[t + 1]`` backwards over axis 0 (the numpy loop:
    over time, vectorised over the batch; the oracle of :mod:`replaybank.ops.gae_numba`)."""
    steps = x.shape[0]
    if steps:
        out[-1] = x[-1]
    for t in range(steps - 2, -1, -1):
        np.multiply(coef[t], out[t + 1], out=out[t])
        out[t] += x[t]


@cache
def _kernel(backend: str) -> Callable[[FloatArray, FloatArray, FloatArray], None]:
    """The scan of a checked ``backend`` (:func:`~replaybank.ops.jit.pick_kernel`)."""
    try:
        fn: Callable[[FloatArray, FloatArray, FloatArray], None] = pick_kernel(
            backend, "replaybank.ops.gae_numba", "scan", _scan_numpy, "reverse_scan")[0]
    except ImportError:
        raise ConfigError(
            'backend="numba": numba is not installed; run: pip install "replaybank[fast]" '
            'or use backend="numpy"'
        ) from None
    return fn


def _check_backend(backend: Any) -> str:
    if backend not in ("auto", "numpy", "numba"):
        raise ConfigError(f"backend={backend!r}: expected 'auto', 'numpy' or 'numba'")
    return str(backend)


def reverse_scan(x: Any, coef: Any, backend: Backend = "auto") -> FloatArray:
    """Compute ``y[t] = x[t] + coef[t] * y[t + 1]`` backwards over axis 0 (``y[T] = 0``).

    Args:
        x: Values ``[T, *batch]``.
        coef: Per-step coefficients, broadcastable to ``x``'s shape (a scalar discount or
            ``[T, *batch]``).
        backend: ``"numpy"`` (loop over time, vectorised over the batch), ``"numba"``
            (compiled kernel) or ``"auto"`` (numba when installed).

    Returns:
        ``y`` as float64, shaped like ``x``.

    Raises:
        ShapeError: ``x`` has no time axis or ``coef`` does not broadcast to it, or
            either is a ragged nest (rows of different lengths).
        ConfigError: Unknown backend, or numba requested but not installed.

    Example:
        >>> reverse_scan(np.ones((3, 2)), 0.5, backend="numpy")[:, 0].tolist()
        [1.75, 1.5, 1.0]
    """
    xs = _floats("x", x, "[T, *batch]")
    if xs.ndim < 1:
        raise ShapeError(f"x={describe(x)}: needs a leading time axis [T, *batch]")
    c = _floats("coef", coef, f"a scalar or {xs.shape} like x")  # (ragged: a ShapeError)
    try:
        cs = np.broadcast_to(c, xs.shape)
    except ValueError:
        raise ShapeError(
            f"coef={describe(coef)}: does not broadcast to x's shape {xs.shape}; pass a "
            "scalar or an array shaped like x"
        ) from None
    scan = _kernel(_check_backend(backend))
    steps, width = xs.shape[0], int(np.prod(xs.shape[1:], dtype=np.int64))
    x2 = np.ascontiguousarray(xs.reshape(steps, width))  # [T, M]
    c2 = np.ascontiguousarray(cs.reshape(steps, width))  # [T, M]
    out = np.empty_like(x2)
    if x2.size:
        scan(x2, c2, out)
    return out.reshape(xs.shape)


def discount_cumsum(x: Any, discount: float, backend: Backend = "auto") -> FloatArray:
    """Discounted cumulative sum over axis 0: ``y[t] = sum_k discount**k * x[t + k]``.

    The rewards-to-go of SpinningUp-style buffers. Exact (a reverse recursion, not a
    rescaled cumsum, so no under/overflow for long arrays).

    Args:
        x: Values ``[T]`` or ``[T, *batch]`` (summed along the first axis).
        discount: The discount factor.
        backend: See :func:`reverse_scan`.

    Returns:
        float64 array shaped like ``x``.

    Raises:
        ShapeError: ``x`` is a scalar or a ragged nest (rows of different lengths).
        ConfigError: ``discount`` is not a finite number.

    Example:
        >>> discount_cumsum([1, 2, 3], 0.5).tolist()
        [2.75, 3.5, 3.0]
    """
    if isinstance(discount, bool) or not np.isfinite(np.float64(discount)):
        raise ConfigError(f"discount={discount!r}: must be a finite number, e.g. 0.99")
    return reverse_scan(x, float(discount), backend)


def _floats(name: str, value: Any, expected: str) -> FloatArray:
    """The argument ``name``'s ``value`` as float64, through the one ragged check
    (:func:`~replaybank.host.as_numpy`): a ragged nest is a ShapeError naming ``name``, its
    value, the first unlike row and ``expected`` (the shape wanted, in words)."""
    return as_numpy(
        value,
        name,
        expected=expected,
        fix="pass an array (or a list whose rows all have one length)",
    ).astype(np.float64, copy=False)


def _as_float(name: str, value: Any, shape: tuple[int, ...]) -> FloatArray:
    arr = _floats(name, value, f"shape {shape}")
    if arr.shape != shape:
        try:
            arr = np.broadcast_to(arr, shape)
        except ValueError:
            raise ShapeError(
                f"{name}={describe(value)}: expected shape {shape} (rewards' shape "
                "[T, *batch]; last_values is [*batch])"
            ) from None
    return arr


def _as_bool(name: str, value: Any, shape: tuple[int, ...]) -> npt.NDArray[np.bool_]:
    arr = as_numpy(
        value,
        name,
        expected=f"shape {shape} like rewards",
        fix="pass an array of bools (or a list whose rows all have one length)",
    )
    if arr.shape != shape:
        raise ShapeError(f"{name}={describe(value)}: expected shape {shape} like rewards")
    return arr.astype(bool, copy=False)


def gae(
    rewards: Any,
    values: Any,
    terminated: Any,
    truncated: Any,
    last_values: Any,
    final_values: Any = None,
    *,
    gamma: float = 0.99,
    gae_lambda: float = 0.95,
    backend: Backend = "auto",
) -> FloatArray:
    """Generalized advantage estimates with exact episode ends.

    Args:
        rewards: ``r_t``, shaped ``[T, *batch]``.
        values: ``V(s_t)``, ``[T, *batch]``.
        terminated: Step ``t`` ended its episode in a terminal state (no bootstrap),
            ``[T, *batch]`` bool.
        truncated: Step ``t`` ended its episode by a time limit (bootstrap from
            ``final_values[t]``), ``[T, *batch]`` bool. A step both terminated and
            truncated counts as terminated.
        last_values: ``V(s_T)`` of the observation after the last step, ``[*batch]``
            (ignored for lanes whose last step ended an episode).
        final_values: Value of the true final observation of each truncated step,
            ``[T, *batch]``; read only where ``truncated & ~terminated`` (other entries
            may be anything, e.g. NaN). Required when such steps exist.
        gamma: Discount factor.
        gae_lambda: GAE lambda (1 gives Monte-Carlo advantages, 0 one-step TD errors).
        backend: See :func:`reverse_scan`.

    Returns:
        Advantages ``[T, *batch]`` float64. Returns (value targets) are
        ``advantages + values``.

    Raises:
        ShapeError: Shapes disagree, or an argument is a ragged nest (rows of
            different lengths), naming it.
        ValueError: A truncated step has no final value (None or NaN there).

    Example:
        >>> r, v = np.array([1.0, 0.0]), np.array([0.5, 0.4])
        >>> gae(r, v, np.zeros(2, bool), np.array([True, False]), last_values=0.0,
        ...     final_values=np.array([2.0, np.nan]), gamma=0.5, gae_lambda=0.5).tolist()
        [1.5, -0.4]
    """
    rew = _floats("rewards", rewards, "[T, *batch]")
    if rew.ndim < 1:
        raise ShapeError(f"rewards={describe(rewards)}: needs a leading time axis [T, *batch]")
    shape = rew.shape
    val = _as_float("values", values, shape)
    term = _as_bool("terminated", terminated, shape)
    trunc = _as_bool("truncated", truncated, shape)
    last = _as_float("last_values", last_values, shape[1:])
    # [T, *batch]: value of the next state, before the terminated mask
    # [T, *batch]: V_next, then overwritten in place by delta (whole-array ops, no masks copies)
    next_v = np.empty(shape, dtype=np.float64)
    next_v[:-1] = val[1:]
    next_v[-1] = last
    cut = trunc & ~term
    if cut.any():
        if final_values is None:
            first = tuple(int(i) for i in np.argwhere(cut)[0])
            raise ValueError(
                f"gae: step {first} was truncated but final_values=None; pass the value "
                "of each truncated step's final observation as final_values"
            )
        fv = _as_float("final_values", final_values, shape)
        bad = cut & ~np.isfinite(fv)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"gae: final_values at truncated step {first} is not finite; give the value "
                "of that step's final observation"
            )
        np.copyto(next_v, fv, where=cut)
    np.copyto(next_v, 0.0, where=term)
    delta = np.multiply(next_v, float(gamma), out=next_v)
    delta += rew
    delta -= val  # delta = r + gamma * V_next * (1 - terminated) - V
    coef = np.multiply(~(term | trunc), float(gamma) * float(gae_lambda))  # [T, *batch]
    return reverse_scan(delta, coef, backend)
