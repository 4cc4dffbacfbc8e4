"""Uniform sampling over every live step of every lane.

Example:
    >>> import numpy as np
    >>> from replaybank.samplers.base import LaneView
    >>> lv = LaneView(T=4, lanes=2, written=np.array([4, 2]), counts=np.array([4, 2]))
    >>> keys = UniformSampler().sample(6, lv, np.random.default_rng(0)).keys
    >>> bool(np.all((keys >= 0) & (keys < 8)))
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybank.errors import EmptyBufferError
from replaybank.ops import ring
from replaybank.ops.draws import counted_ints, lane_ints, uniform_ints
from replaybank.samplers.base import (
    FloatArray,
    IntArray,
    LaneView,
    SampleResult,
    StatelessSampler,
)
from replaybank.samplers.sample_args import LARGE_BATCH, check_batch_size, check_replace

__all__ = ["UniformSampler", "check_batch_size", "one_lane_counted", "one_lane_keys"]


def one_lane_keys(batch_size: Any, written: IntArray, counts: IntArray,
                  rng: np.random.Generator) -> IntArray:
    """Uniform item keys of a one-lane table, with replacement (validates ``batch_size``).

    The live keys of the lane are ``[written - counts, written)``: ``oldest +
    uniform_ints(rng, counts, B)`` (:func:`~replaybank.ops.draws.uniform_ints`, the
    stream every uniform draw of replaybank uses).

    Args:
        batch_size: Number of keys B.
        written: Steps ever written, ``[1]``.
        counts: Live steps, ``[1]``.
        rng: The generator to draw from.

    Returns:
        Item keys ``[B]`` (int64).

    Raises:
        ConfigError: ``batch_size`` is not a positive int.
        CapacityError: ``batch_size`` is too large to draw.
        EmptyBufferError: The lane is empty.

    Example:
        >>> keys = one_lane_keys(5, np.array([12]), np.array([4]), np.random.default_rng(0))
        >>> bool(np.all((keys >= 8) & (keys < 12)))
        True
    """
    size = counts.item(0)
    if type(batch_size) is not int or not 0 < batch_size <= LARGE_BATCH or size <= 0:
        batch_size = check_batch_size(batch_size, size, True)
    return uniform_ints(rng, size, batch_size, offset=written.item(0) - size)


def one_lane_counted(batch_size: Any, written: IntArray, counts: IntArray,
                     rng: np.random.Generator) -> tuple[IntArray, int]:
    """:func:`one_lane_keys` and the raw words it read from the generator
    (:func:`~replaybank.ops.draws.counted_ints`: what :func:`~replaybank.ops.draws.rewind`
    puts back).

    Example:
        >>> w, c = np.array([12]), np.array([4])
        >>> keys, words = one_lane_counted(5, w, c, np.random.default_rng(0))
        >>> keys.tolist() == one_lane_keys(5, w, c, np.random.default_rng(0)).tolist()
        True
    """
    size = counts.item(0)
    if type(batch_size) is not int or not 0 < batch_size <= LARGE_BATCH or size <= 0:
        batch_size = check_batch_size(batch_size, size, True)
    return counted_ints(rng, size, batch_size, offset=written.item(0) - size)


class UniformSampler(StatelessSampler):
    """Draws live steps uniformly, with replacement by default.

    ``replace=False`` draws distinct steps (the batch must not exceed the size).
    """

    iid = True

    def one_lane_keys(self, batch_size: Any, written: IntArray, counts: IntArray,
                      rng: np.random.Generator) -> IntArray:
        """The keys :meth:`sample` returns for a one-lane table (:func:`one_lane_keys`)."""
        return one_lane_keys(batch_size, written, counts, rng)

    def one_lane_counted(self, batch_size: Any, written: IntArray, counts: IntArray,
                         rng: np.random.Generator) -> tuple[IntArray, int]:
        """:meth:`one_lane_keys` and the raw words it read (:func:`one_lane_counted`)."""
        return one_lane_counted(batch_size, written, counts, rng)

    def lane_keys(self, batch_size: Any, lanes: LaneView,
                  rng: np.random.Generator) -> IntArray:
        """The keys ``sample(batch_size, lanes, rng)`` returns (with replacement), for any
        number of lanes, without the result wrapper (validates ``batch_size``)."""
        if lanes.lanes == 1:
            return one_lane_keys(batch_size, lanes.written, lanes.counts, rng)
        if type(batch_size) is int and 0 < batch_size <= LARGE_BATCH:
            keys = lane_ints(rng, lanes.written, lanes.counts, batch_size)  # one C call
            if keys is not None:
                return keys
        size = lanes.size
        batch_size = check_batch_size(batch_size, size, True)
        return ring.uniform_keys(uniform_ints(rng, size, batch_size), lanes.written,
                                 lanes.counts)

    def sample(
        self,
        batch_size: int,
        lanes: LaneView,
        rng: np.random.Generator,
        replace: bool = True,
        beta: float | None = None,
        **kwargs: Any,
    ) -> SampleResult:
        """Draw ``batch_size`` live steps uniformly. ``beta`` is ignored here; a buffer
        refuses ``sample(beta=...)`` for this sampler (it has no priorities), so a PER
        option never goes silently unused."""
        if replace is not True:
            replace = check_replace(replace)
        if replace:
            return SampleResult(self.lane_keys(batch_size, lanes, rng))
        size = lanes.size
        check_batch_size(batch_size, size, replace)
        flat = rng.choice(size, size=batch_size, replace=False).astype(np.int64)
        return SampleResult(ring.uniform_keys(flat, lanes.written, lanes.counts))

    def draw_independent(self, batch_size: int, lanes: LaneView,
                         rng: np.random.Generator) -> IntArray:
        """``batch_size`` keys drawn independently and uniformly over the live steps (the
        keys of ``sample(batch_size, lanes, rng)``, whose draws are already i.i.d.)."""
        return self.sample(batch_size, lanes, rng).keys

    def key_weights(self, keys: IntArray, lanes: LaneView) -> FloatArray:
        """Weight 1 for each of ``keys`` (every live step is equally likely)."""
        return np.ones(len(keys), np.float64)

    def sample_among(self, keys: IntArray, batch_size: int, lanes: LaneView,
                     rng: np.random.Generator, replace: bool = False,
                     **kwargs: Any) -> SampleResult:
        """``batch_size`` distinct keys of ``keys``, a uniformly random ordered subset
        (successive uniform draws without replacement), or with ``replace=True``
        ``batch_size`` keys drawn uniformly and independently among ``keys``.

        Args:
            keys: Distinct live keys ``[n]`` to draw among.
            batch_size: B.
            lanes: Lane bookkeeping of the table.
            rng: Generator.
            replace: Draw independently (True) or distinct keys (False).
            **kwargs: Ignored (the sample call's other options).

        Returns:
            The keys ``[B]`` in draw order.

        Raises:
            EmptyBufferError: ``batch_size`` exceeds ``len(keys)`` (``replace=True``:
                ``keys`` is empty); nothing is drawn.

        Example:
            >>> lv = LaneView(T=8, lanes=1, written=np.array([8]), counts=np.array([8]))
            >>> res = UniformSampler().sample_among(np.array([1, 3, 5]), 3, lv,
            ...                                     np.random.default_rng(0))
            >>> sorted(res.keys.tolist())
            [1, 3, 5]
        """
        keys = np.asarray(keys, np.int64)
        if replace and len(keys):
            return SampleResult(keys[uniform_ints(rng, len(keys), batch_size)])
        if batch_size > len(keys):
            raise EmptyBufferError(
                f"sample(batch_size={batch_size}, replace=False): only {len(keys)} keys to "
                "draw among; lower batch_size or use replace=True")
        pick = rng.choice(len(keys), size=batch_size, replace=False)
        return SampleResult(keys[pick])

    def config(self) -> dict[str, Any]:
        return {"type": "uniform"}
