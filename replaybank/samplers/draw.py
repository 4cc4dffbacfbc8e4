"""Drawing steps a replay buffer's view can serve: the sampler draws, the view checks, and
the rows it rejects are redrawn (the others keep their keys, probabilities and weights).

When 64 redraw rounds do not finish (most of the sampler's mass on steps the view cannot
serve, or ``replace=False`` with a batch close to the number of servable steps), a
sampler that can draw among given keys (:class:`~replaybank.samplers.base.SubsetDraws`:
the uniform, prioritized and recent (ERE) ones; with replacement only,
:class:`~replaybank.samplers.base.RestrictedDraws`: the lane-split one) finishes the
batch exactly from its law restricted to the *servable* steps (:func:`servable_keys`,
:func:`draw_among`), as sequence windows do
(:func:`~replaybank.samplers.windows.servable_starts`): with replacement, the rows still
rejected are drawn i.i.d. from that law; without, the whole batch is a successive sample
of the servable steps. Probabilities and importance weights stay those the sampler gives
the drawn keys (prioritized: ``P(i) = p_i / total`` over every live step, as for rows the
redraw rounds accept), so every row of a batch is weighted alike. Only when no servable
step has a positive weight (or, without replacement, fewer than ``batch_size``) is the
call refused, with the exact count.

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

from replaybank.errors import ArgumentError, EmptyBufferError
from replaybank.ops import ring
from replaybank.samplers.base import (
    LaneView,
    PrioritySampler,
    RestrictedDraws,
    Sampler,
    SampleResult,
    SubsetDraws,
)

__all__ = ["draw", "draw_among", "iid_among", "replace_rows", "servable_keys"]

IntArray = npt.NDArray[np.int64]
Valid = Callable[[IntArray], "npt.NDArray[np.bool_] | None"]

_MAX_TRIES = 64
# live keys checked per call of the view's check when listing servable steps (bounds the
# check's temporary arrays)
_CHUNK = 1 << 16
# why a frame stack leaves steps out, for the errors
_WHY = ("a frame stack does not serve a step whose history the ring overwrote: up to "
        "k - 1 steps per lane at its old end")


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
        EmptyBufferError: 64 redraws did not finish and (a sampler that draws among given
            keys) no servable step has a positive weight (without replacement: fewer than
            ``batch_size``), or (any other sampler, and without replacement one that
            draws among given keys with replacement only) 64 redraws did not finish.
    """
    res = sampler.sample(batch_size, lanes, rng, **kwargs) if first is None else first
    ok = valid(res.keys)
    distinct = kwargs.get("replace", True) is False
    tries = 0
    while ok is not None and not np.all(ok):
        tries += 1
        if tries > _MAX_TRIES:
            if isinstance(sampler, SubsetDraws) or (
                    not distinct and isinstance(sampler, RestrictedDraws)):
                # exact: the law among servable steps
                return draw_among(sampler, lanes, rng, batch_size, valid,
                                  None if distinct else (res, ok), **kwargs)
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


def servable_keys(lanes: LaneView, valid: Valid) -> IntArray:
    """Every live key the view can serve, lane by lane, oldest first.

    Args:
        lanes: The table's lane bookkeeping.
        valid: The view's check (a mask of the keys it can serve, or None for all).

    Returns:
        Keys ``[n]``.

    Example:
        >>> lv = LaneView(T=4, lanes=2, written=np.array([4, 3]), counts=np.array([4, 3]))
        >>> servable_keys(lv, lambda keys: keys % 3 != 0).tolist()
        [2, 4, 1, 5]
    """
    size = lanes.size
    out = []
    for lo in range(0, size, _CHUNK):
        flat = np.arange(lo, min(size, lo + _CHUNK), dtype=np.int64)
        keys = ring.uniform_keys(flat, lanes.written, lanes.counts)
        ok = valid(keys)
        out.append(keys if ok is None else keys[ok])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def draw_among(sampler: SubsetDraws | RestrictedDraws, lanes: LaneView,
               rng: np.random.Generator, batch_size: int, valid: Valid,
               partial: tuple[SampleResult, npt.NDArray[np.bool_]] | None = None,
               **kwargs: Any) -> SampleResult:
    """An exact draw from the sampler's law restricted to the steps the view can serve.

    Without replacement (``replace=False`` in ``kwargs``): ``batch_size`` distinct
    servable steps by successive sampling
    (:meth:`~replaybank.samplers.base.SubsetDraws.sample_among`), refused first when
    fewer are servable. With replacement: the rows of ``partial`` that the view rejects
    (all ``batch_size`` rows when None) are drawn i.i.d. from the law among servable steps;
    the others keep their keys, probabilities and weights.

    Args:
        sampler: Draws among given keys (without replacement: a
            :class:`~replaybank.samplers.base.SubsetDraws`).
        lanes: The table's lane bookkeeping.
        rng: The sampling generator.
        batch_size: Number of keys B.
        valid: The view's check.
        partial: ``(result, ok)``: a draw of ``batch_size`` keys and the mask of its rows
            to keep (with replacement only), or None.
        **kwargs: Sampler options (``replace``, ``beta``, ...).

    Returns:
        A ``SampleResult`` of ``[B]`` keys the view can serve.

    Raises:
        EmptyBufferError: No servable step has a positive weight in the sampler's law
            (without replacement: fewer than ``batch_size``); the message gives the count.
        ArgumentError: ``replace=False`` for a sampler that draws among given keys with
            replacement only (not a :class:`~replaybank.samplers.base.SubsetDraws`).

    Example:
        >>> from replaybank.samplers.uniform import UniformSampler
        >>> lv = LaneView(T=8, lanes=1, written=np.array([8]), counts=np.array([8]))
        >>> res = draw_among(UniformSampler(), lv, np.random.default_rng(0), 2,
        ...                  lambda keys: keys >= 6, replace=False)
        >>> sorted(res.keys.tolist())
        [6, 7]
    """
    distinct = kwargs.get("replace", True) is False
    if distinct and not isinstance(sampler, SubsetDraws):  # pragma: no cover - draw never asks
        raise ArgumentError(
            f"draw_among(replace=False): {type(sampler).__name__} draws among given keys "
            "with replacement only; pass replace=True or a SubsetDraws sampler")
    keys = servable_keys(lanes, valid)
    weights = np.asarray(sampler.key_weights(keys, lanes), np.float64)
    keys = keys[weights > 0.0]
    n = len(keys)
    prio = n < (batch_size if distinct else 1) and isinstance(sampler, PrioritySampler)
    what = " with a positive priority" if prio else ""
    if distinct and batch_size > n:
        fix = f"lower batch_size to at most {n}, use replace=True, " if n else ""
        raise EmptyBufferError(
            f"sample(batch_size={batch_size}, replace=False): the buffer holds {n} "
            f"distinct steps the view can serve{what} (among {lanes.size} steps; {_WHY}); "
            f"{fix}or add more data")
    if n == 0:
        raise EmptyBufferError(
            f"sample(batch_size={batch_size}): none of the {lanes.size} stored steps can "
            f"be served{what} ({_WHY}); add more data" + (
                ", or update priorities of servable steps with positive values" if prio
                else ""))
    if distinct:
        assert isinstance(sampler, SubsetDraws)  # (checked above)
        return sampler.sample_among(keys, batch_size, lanes, rng, **kwargs)
    if partial is None:
        return iid_among(sampler, keys, batch_size, lanes, rng, kwargs)
    res, ok = partial
    bad = np.flatnonzero(~ok)
    return replace_rows(res, bad, iid_among(sampler, keys, len(bad), lanes, rng, kwargs))


def iid_among(sampler: SubsetDraws | RestrictedDraws, keys: IntArray, batch_size: int,
              lanes: LaneView, rng: np.random.Generator,
              kwargs: dict[str, Any]) -> SampleResult:
    """``batch_size`` keys i.i.d. from the sampler's law restricted to ``keys``, through
    the protocol it declares (:meth:`~replaybank.samplers.base.SubsetDraws.sample_among`
    with ``replace=True``, or :meth:`~replaybank.samplers.base.RestrictedDraws.
    sample_restricted`): the exact fallback of a frame stack's draw (:func:`draw_among`)
    and of sequence windows (:mod:`replaybank.samplers.windows`).

    Args:
        sampler: Draws among given keys.
        keys: Distinct live keys ``[n]``, each of positive weight in the sampler's law.
        batch_size: Number of keys B.
        lanes: The table's lane bookkeeping.
        rng: The sampling generator.
        kwargs: The sample call's options (``beta``, ERE's ``update``, ...).

    Returns:
        A ``SampleResult`` of ``[B]`` keys among ``keys``, with the probabilities and
        weights the sampler gives them.

    Raises:
        EmptyBufferError: None of ``keys`` can be drawn with these options (nothing is
            drawn).

    Example:
        >>> from replaybank.samplers.lane_split import LaneSplitSampler
        >>> lv = LaneView(T=4, lanes=2, written=np.array([4, 1]), counts=np.array([4, 1]))
        >>> res = iid_among(LaneSplitSampler(), np.array([0, 1]), 6, lv,
        ...                 np.random.default_rng(0), {})
        >>> sorted(set(res.keys.tolist()))
        [0, 1]
    """
    if isinstance(sampler, SubsetDraws):
        return sampler.sample_among(keys, batch_size, lanes, rng, **{**kwargs, "replace": True})
    return sampler.sample_restricted(keys, batch_size, lanes, rng, **kwargs)


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
