"""Drawing steps a replay buffer's view can serve: the sampler draws, the view checks, and
the rows it rejects are redrawn (the others keep their keys, probabilities and weights).

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(16, seed=0)
    >>> buf.extend(obs=np.zeros((6, 2)), action=np.zeros(6), reward=np.ones(6),
    ...            next_obs=np.ones((6, 2)), terminated=np.zeros(6, bool),
    ...            truncated=np.zeros(6, bool))
    >>> odd = lambda keys: keys % 2 == 1  # a view that serves odd keys only
    >>> res = draw(buf.sampler, buf.lane_view(), buf.rng, 32, odd)
    >>> sorted(set(res.keys.tolist()))
    [1, 3, 5]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import EmptyBufferError
from replaybank.samplers.base import LaneView, Sampler, SampleResult

__all__ = ["draw", "replace_rows"]

IntArray = npt.NDArray[np.int64]

_MAX_TRIES = 64


def draw(sampler: Sampler, lanes: LaneView, rng: np.random.Generator, batch_size: int,
         valid: Callable[[IntArray], npt.NDArray[np.bool_] | None], first: Any = None,
         **kwargs: Any) -> SampleResult:
    """Draw keys with ``sampler``, redrawing the ones ``valid`` rejects.

    Args:
        sampler: Draws the keys.
        lanes: The table's lane bookkeeping.
        rng: The sampling generator.
        batch_size: Number of keys B.
        valid: The view's check: a ``[B]`` mask of the keys it can serve, or None for
            all of them.
        first: A :class:`~replaybank.samplers.base.SampleResult` the sampler already
            drew for this batch, or None to draw it here.
        **kwargs: Sampler options (``replace``, ``beta``, ...).

    Returns:
        A ``SampleResult`` whose ``[B]`` keys the view can all serve (distinct keys when
        ``replace=False``: a redrawn key that a kept row already holds is redrawn too).

    Raises:
        EmptyBufferError: 64 redraws found no servable steps (without replacement: not
            ``batch_size`` distinct ones).
    """
    res = sampler.sample(batch_size, lanes, rng, **kwargs) if first is None else first
    ok = valid(res.keys)
    distinct = kwargs.get("replace", True) is False
    tries = 0
    while ok is not None and not np.all(ok):
        tries += 1
        if tries > _MAX_TRIES:
            raise EmptyBufferError(
                f"sample(batch_size={batch_size}, replace=False): after {_MAX_TRIES} "
                f"redraws fewer than {batch_size} distinct steps the view can serve were "
                "found (steps without the history a frame stack needs are not served); "
                "lower batch_size or add more data" if distinct else
                f"sample(batch_size={batch_size}): after {_MAX_TRIES} redraws the buffer "
                "still holds no steps the view can serve (e.g. too short a history for a "
                "frame stack); add more data"
            )
        bad = np.flatnonzero(~ok)
        more = sampler.sample(len(bad), lanes, rng, **kwargs)
        res = replace_rows(res, bad, more)
        ok = valid(res.keys)
        if distinct:  # (the sampler's draw of the redrawn rows knows nothing of the kept)
            ok = _first_of_each(res.keys, ok)
    return res


def _first_of_each(keys: IntArray, ok: npt.NDArray[np.bool_] | None) -> npt.NDArray[np.bool_]:
    """``ok`` (None: every row) without the rows whose key an earlier usable row holds.

    Example:
        >>> _first_of_each(np.array([4, 4, 2, 4]), np.array([False, True, True, True]))
        array([False,  True,  True, False])
    """
    usable = np.ones(len(keys), bool) if ok is None else ok.copy()
    rows = np.flatnonzero(usable)
    _, first = np.unique(keys[rows], return_index=True)
    usable[rows] = False
    usable[rows[first]] = True
    return usable


def replace_rows(res: Any, rows: IntArray, more: Any) -> SampleResult:
    """``res`` with its ``rows`` taken from ``more`` (a draw of ``len(rows)`` keys).

    Probabilities and weights are kept only when both results carry them.

    Example:
        >>> old = SampleResult(np.array([1, 2, 3]))
        >>> replace_rows(old, np.array([1]), SampleResult(np.array([9]))).keys.tolist()
        [1, 9, 3]
    """
    keys = res.keys.copy()
    keys[rows] = more.keys
    probs = weights = None
    if res.probabilities is not None and more.probabilities is not None:
        probs = res.probabilities.copy()
        probs[rows] = more.probabilities
    if res.weights is not None and more.weights is not None:
        weights = res.weights.copy()
        weights[rows] = more.weights
    return SampleResult(keys, probs, weights)
