"""Lane-split sampling: the batch is divided randomly among the lanes.

This reproduces fishyrl's ``IndependentVectorizedBuffer`` (one buffer per env, the batch
divided randomly among them) on the single lane-major table: each draw first picks a
lane uniformly among the non-empty lanes, then a live step of that lane uniformly. A
lane's share of the batch is therefore multinomial with equal probabilities, whatever
its fill; each step ``i`` of lane ``l`` has probability ``1 / (n_nonempty * counts[l])``.
(The default :class:`~replaybank.samplers.uniform.UniformSampler` is uniform over every
step of every lane instead; the two agree when all lanes are equally full.)

Example:
    >>> import numpy as np
    >>> from replaybank.samplers.base import LaneView
    >>> lv = LaneView(T=4, lanes=2, written=np.array([4, 1]), counts=np.array([4, 1]))
    >>> keys = LaneSplitSampler().sample(1000, lv, np.random.default_rng(0)).keys
    >>> round(float(np.mean(keys % 2 == 1)), 1)   # half the batch from the 1-step lane
    0.5
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybank.errors import ConfigError, EmptyBufferError
from replaybank.samplers.base import (
    FloatArray,
    IntArray,
    LaneView,
    SampleResult,
    StatelessSampler,
)
from replaybank.samplers.uniform import check_batch_size

__all__ = ["LaneSplitSampler"]


class LaneSplitSampler(StatelessSampler):
    """Divides each batch randomly (multinomially, equal odds) among non-empty lanes.

    Behind a view that rejects some steps (frame stacks), rejected keys are redrawn, so a
    lane's share is proportional to the fraction of its steps the view serves (see
    ``docs/samplers/lane-split.md``); so are sequence window starts whose window is too
    short. When the redraw rounds do not finish, the rows left are drawn exactly from that
    law among the servable steps (usable starts)
    (:class:`~replaybank.samplers.base.RestrictedDraws`: :meth:`key_weights`,
    :meth:`sample_restricted`).

    Stateless apart from the buffer's generator, so its state dict is empty and a
    checkpoint of the buffer (one ``state_dict`` for all lanes) restores it exactly.

    Example:
        >>> import numpy as np
        >>> import replaybank as rb
        >>> buf = rb.ReplayBuffer(capacity=8, num_envs=2, sampler=LaneSplitSampler(), seed=0)
        >>> buf.add(obs=np.zeros((2, 3), np.float32), action=np.array([0, 1]), reward=[0.0, 1.0],
        ...         next_obs=np.ones((2, 3), np.float32), terminated=[False, False],
        ...         truncated=[False, False])
        >>> buf.sample(4).obs.shape
        (4, 3)
    """

    iid = True

    def sample(
        self,
        batch_size: int,
        lanes: LaneView,
        rng: np.random.Generator,
        replace: bool = True,
        beta: float | None = None,
        **kwargs: Any,
    ) -> SampleResult:
        """Draw ``batch_size`` keys: a uniform non-empty lane, then a uniform step of it
        (``beta`` is ignored here, and refused by a buffer's ``sample``, as for the uniform
        sampler).

        Raises:
            ConfigError: ``replace=False`` (not offered: lane quotas are random).
            EmptyBufferError: The buffer is empty.
        """
        check_batch_size(batch_size, lanes.size, True)
        if not replace:
            raise ConfigError(
                "sample(replace=False): LaneSplitSampler draws with replacement only; "
                "use UniformSampler for distinct transitions"
            )
        nonempty = np.flatnonzero(lanes.counts > 0)  # [n]
        lane = nonempty[rng.integers(0, len(nonempty), size=batch_size)]  # [B]
        c = lanes.counts[lane]
        seq = lanes.written[lane] - c + (rng.random(batch_size) * c).astype(np.int64)
        seq = np.minimum(seq, lanes.written[lane] - 1)
        return SampleResult(seq * lanes.lanes + lane)

    def key_weights(self, keys: IntArray, lanes: LaneView) -> FloatArray:
        """Each live key's weight in the lane-split law, ``1 / counts[l]`` for a step of
        lane ``l`` ``[n]`` (a draw takes it with probability ``1 / (n_nonempty *
        counts[l])``; the common factor is left out).

        Example:
            >>> lv = LaneView(T=4, lanes=2, written=np.array([4, 1]), counts=np.array([4, 1]))
            >>> LaneSplitSampler().key_weights(np.array([0, 1, 2]), lv).tolist()
            [0.25, 1.0, 0.25]
        """
        keys = np.asarray(keys, np.int64)
        out: FloatArray = 1.0 / lanes.counts[keys % lanes.lanes].astype(np.float64)
        return out

    def sample_restricted(self, keys: IntArray, batch_size: int, lanes: LaneView,
                          rng: np.random.Generator, **kwargs: Any) -> SampleResult:
        """``batch_size`` keys drawn i.i.d. among the live ``keys``, a step of lane ``l``
        with probability ``(1 / counts[l]) / sum_keys(1 / counts)``: the lane-split law
        restricted to ``keys``, which the redraw rounds behind a frame stack converge to
        (a lane's share in proportion to its keys over its count).

        Args:
            keys: Distinct live keys ``[n]`` to draw among.
            batch_size: B.
            lanes: Lane bookkeeping of the table.
            rng: Generator.
            **kwargs: Ignored (the sample call's other options).

        Returns:
            The keys ``[B]`` (no probabilities or weights, as :meth:`sample`).

        Raises:
            EmptyBufferError: ``keys`` is empty (nothing is drawn).

        Example:
            >>> lv = LaneView(T=4, lanes=2, written=np.array([4, 1]), counts=np.array([4, 1]))
            >>> res = LaneSplitSampler().sample_restricted(np.array([2, 3]), 1000, lv,
            ...                                            np.random.default_rng(0))
            >>> round(float(np.mean(res.keys == 3)), 1)  # weight 1 against 1/4
            0.8
        """
        keys = np.asarray(keys, np.int64)
        if len(keys) == 0:
            raise EmptyBufferError(f"sample(batch_size={batch_size}): no keys to draw among; "
                                   "add more data")
        cum = np.cumsum(self.key_weights(keys, lanes))  # [n]
        at = np.searchsorted(cum, rng.random(batch_size) * cum[-1], side="right")  # [B]
        return SampleResult(keys[np.minimum(at, len(keys) - 1)])

    def config(self) -> dict[str, Any]:
        return {"type": "lane_split"}

    def __repr__(self) -> str:
        return "LaneSplitSampler()"
