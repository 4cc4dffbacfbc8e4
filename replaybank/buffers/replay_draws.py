"""Drawing steps a replay buffer's view can serve: the sampler draws, the view checks, and
the rows it rejects are redrawn (the others keep their keys, probabilities and weights).

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> class OddSteps(rb.TransitionView):  # a view that serves odd keys only
    ...     def valid(self, table, keys):
    ...         return keys % 2 == 1
    >>> buf = rb.ReplayBuffer(16, seed=0, view=OddSteps())
    >>> buf.extend(obs=np.zeros((6, 2)), action=np.zeros(6), reward=np.ones(6),
    ...            next_obs=np.ones((6, 2)), terminated=np.zeros(6, bool),
    ...            truncated=np.zeros(6, bool))
    >>> sorted(set(draw(buf, 32).keys.tolist()))
    [1, 3, 5]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import ShapeError
from replaybank.samplers.base import SampleResult
from replaybank.views.transition import TransitionView

if TYPE_CHECKING:
    from replaybank.buffers.replay import ReplayBuffer

__all__ = ["draw", "replace_rows"]

IntArray = npt.NDArray[np.int64]

_MAX_TRIES = 64


def draw(buf: ReplayBuffer, /, batch_size: int, first: Any = None, **kwargs: Any) -> Any:
    """Draw keys with the sampler (``first``: the sampler's result, already drawn),
    redrawing the ones the view cannot serve.

    Args:
        buf: The replay buffer.
        batch_size: Number of keys B.
        first: A :class:`~replaybank.samplers.base.SampleResult` the sampler already
            drew for this batch, or None to draw it here.
        **kwargs: Sampler options (``replace``, ``beta``, ...).

    Returns:
        A ``SampleResult`` whose ``[B]`` keys the view can all serve.

    Raises:
        ShapeError: 64 redraws found no servable steps.
    """
    lv = buf.lane_view()
    res = buf.sampler.sample(batch_size, lv, buf.rng, **kwargs) if first is None \
        else first
    if type(buf.view) is TransitionView:  # serves every step: nothing to check
        return res
    ok = buf.view.valid(buf.table, res.keys)
    tries = 0
    while ok is not None and not np.all(ok):
        tries += 1
        if tries > _MAX_TRIES:
            raise ShapeError(
                f"sample(batch_size={batch_size}): could not find steps the view "
                f"{type(buf.view).__name__} can serve; add more data"
            )
        bad = np.flatnonzero(~ok)
        more = buf.sampler.sample(len(bad), lv, buf.rng, **kwargs)
        res = replace_rows(res, bad, more)
        ok = buf.view.valid(buf.table, res.keys)
    return res


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
