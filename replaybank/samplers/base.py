"""Sampler protocols: which steps a buffer returns.

A sampler never touches field data. It sees the lane bookkeeping of the step table
(:class:`LaneView`) and returns item keys (see :mod:`replaybank.ops.ring`). Samplers
that keep per-slot state (priorities) learn about writes through ``on_write``.

Two protocols, because not every sampler has priorities:

* :class:`Sampler`: ``bind``, ``on_write``, ``on_clear``, ``sample``, ``state_dict``,
  ``load_state_dict``, ``config``.
* :class:`PrioritySampler`: a Sampler that also takes ``update(slots, priorities)``.

Example:
    >>> from replaybank.samplers.uniform import UniformSampler
    >>> isinstance(UniformSampler(), Sampler), isinstance(UniformSampler(), PrioritySampler)
    (True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["LaneView", "PrioritySampler", "SampleResult", "Sampler", "StatelessSampler"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LaneView:
    """Read-only lane bookkeeping handed to samplers.

    Attributes:
        T: Rows per lane.
        lanes: Number of lanes.
        written: Steps ever written per lane, ``[lanes]``.
        counts: Live steps per lane, ``[lanes]``.
    """

    T: int
    lanes: int
    written: IntArray
    counts: IntArray

    @property
    def size(self) -> int:
        """Live steps over all lanes."""
        return int(self.counts.sum())


@dataclass(frozen=True)
class SampleResult:
    """What a sampler returns.

    Attributes:
        keys: Item keys ``[B]``.
        probabilities: Sampling probability of each key ``[B]`` (None for uniform).
        weights: Importance-sampling weights ``[B]`` (None for uniform).
    """

    keys: IntArray
    probabilities: FloatArray | None = None
    weights: FloatArray | None = None


@runtime_checkable
class Sampler(Protocol):
    """Chooses item keys to sample."""

    def bind(self, T: int, lanes: int) -> None:  # noqa: N803
        """Allocate per-slot state for a table of ``T * lanes`` slots."""
        ...

    def on_write(self, slots: IntArray, priorities: FloatArray | None = None) -> None:
        """New steps were written to ``slots`` (overwriting whatever was there)."""
        ...

    def on_clear(self) -> None:
        """Every step was dropped."""
        ...

    def sample(
        self, batch_size: int, lanes: LaneView, rng: np.random.Generator, **kwargs: Any
    ) -> SampleResult:
        """Draw ``batch_size`` item keys among the live steps."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Plain arrays and JSON-able values."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        ...

    def config(self) -> dict[str, Any]:
        """Constructor arguments as JSON-able values, with ``"type"``."""
        ...


@runtime_checkable
class PrioritySampler(Sampler, Protocol):
    """A sampler whose distribution follows per-slot priorities."""

    def update(self, slots: IntArray, priorities: FloatArray) -> None:
        """Set the priorities of live ``slots`` (already validated, stale ones removed)."""
        ...


class StatelessSampler:
    """Shared no-op bookkeeping for samplers that keep no per-slot state.

    Such samplers derive everything from the :class:`LaneView` at sampling time, so
    writes, clears and checkpoints have nothing to record. Subclasses implement
    ``sample`` and ``config``.
    """

    def bind(self, T: int, lanes: int) -> None:  # noqa: N803
        """Nothing to allocate."""
        return None

    def on_write(self, slots: IntArray, priorities: FloatArray | None = None) -> None:
        """Nothing to record."""
        return None

    def on_clear(self) -> None:
        """Nothing to drop."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """No state: ``{}``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""
        return None
