"""Sampler protocols: which steps a buffer returns.

A sampler never touches field data. It sees the lane bookkeeping of the step table
(:class:`LaneView`) and returns item keys (see :mod:`replaybank.ops.ring`). Samplers
that keep per-slot state (priorities) learn about writes through ``on_write``.

:class:`Sampler` is what every sampler does: ``bind``, ``on_write``, ``on_clear``,
``sample``, ``state_dict``, ``load_state_dict``, ``config``. Further capabilities are
declared protocols that a buffer checks once, when it builds its plans:

* :class:`PrioritySampler`: also takes ``update(slots, priorities)``;
* :class:`KeyUpdates`: a priority sampler that filters stale keys and updates in one pass;
* :class:`BoundedPriorities`: a priority sampler with a largest raw priority it stores
  without overflow (``priority_limit``), checked by the buffer before anything is written;
* :class:`ScheduledSampler`: a sampler whose options follow a schedule of sample calls
  (PER's beta annealing): ``current_beta``, ``calls``;
* :class:`InnerSchedule`: a sampler whose sample calls follow the schedule of a sampler
  it wraps (ERE over PER): ``schedule``;
* :class:`BatchWeights`: a sampler whose importance weights depend on the whole batch
  (PER's ``weight_norm="batch"``): ``batch_weights`` weighs a batch put together from
  several draws (redraw rounds) as one;
* :class:`UniformDraws`: draws exactly uniform keys over the live steps, with the
  documented stream of :func:`replaybank.ops.draws.uniform_ints`;
* :class:`CountedDraws`: a :class:`UniformDraws` sampler whose one-lane draw also says
  how many raw words of the bit generator it read, so a call that fails later can put
  exactly those back instead of saving the generator state before every draw;
* :class:`IndependentDraws`: draws keys independently of each other from its own
  (unconditional) law, even where ``sample`` correlates them (PER's strata): what exact
  rejection (the sharded service's sequence windows) needs;
* :class:`SubsetDraws`: weighs given keys by its law and draws keys among them (distinct
  ones by successive sampling, or i.i.d.): sequence windows without replacement draw from
  the usable starts only, and frame stacks from the servable steps when redraws do not
  finish;
* :class:`RestrictedDraws`: weighs given keys by its law and draws keys i.i.d. among them
  only (a sampler that draws with replacement only, as lane split): frame stacks draw
  from the servable steps, and sequence windows from the usable starts, so when redraws
  do not finish;
* :class:`StatelessSampler` (a base class): keeps no per-slot state, so writes need not
  be told to it; ``iid`` says its draws are independent of each other.

Example:
    >>> from replaybank.samplers.uniform import UniformSampler
    >>> isinstance(UniformSampler(), Sampler), isinstance(UniformSampler(), PrioritySampler)
    (True, False)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["BatchWeights", "BoundedPriorities", "CountedDraws", "DrawableSlots",
           "IndependentDraws", "InnerSchedule", "KeyUpdates", "LaneView", "PrioritySampler",
           "RestrictedDraws", "SampleResult", "Sampler", "SamplerTraits", "SlotExcluding",
           "ScheduledSampler", "StatelessSampler", "SubsetDraws", "UniformDraws"]

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
        # one lane's item, or a Python sum of a few lanes, costs less than numpy's
        # reduction call (~2 us)
        if self.lanes == 1:
            return int(self.counts.item(0))
        return sum(self.counts.tolist()) if self.lanes <= 64 else int(self.counts.sum())


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


@runtime_checkable
class DrawableSlots(Sampler, Protocol):
    """A sampler with per-slot state that says which slots a draw may return: a buffer
    checks a loaded state's against the slots of its live steps (a slot that holds no
    step must never be drawn)."""

    def drawable(self) -> npt.NDArray[np.bool_] | None:
        """``[T * lanes]``: the slots a draw may return (None: only live ones, by
        construction)."""
        ...


@runtime_checkable
class SlotExcluding(Sampler, Protocol):
    """A sampler with per-slot state that can leave slots out until they are written again
    (a shared buffer's learner: steps that left its snapshot, see
    :mod:`replaybank.shared`; the sharded service's ``max_times_sampled``)."""

    def exclude(self, slots: IntArray) -> None:
        """Never draw ``slots`` until the next :meth:`on_write` of them."""
        ...


@runtime_checkable
class KeyUpdates(PrioritySampler, Protocol):
    """A priority sampler that maps item keys to slots, drops stale ones and updates in
    one pass."""

    def update_keys(self, keys: IntArray, priorities: FloatArray, lanes: LaneView) -> int:
        """Set the priorities of the live ``keys`` ``[B]``; returns how many were live."""
        ...


@runtime_checkable
class BoundedPriorities(PrioritySampler, Protocol):
    """A priority sampler whose stored priorities must stay below a bound (a sum tree
    whose total must stay finite)."""

    @property
    def priority_limit(self) -> float:
        """The largest raw priority (before ``eps`` and ``alpha``) it accepts."""
        ...


@runtime_checkable
class ScheduledSampler(Sampler, Protocol):
    """A sampler whose importance-sampling exponent follows a schedule of sample calls."""

    #: Sample calls so far (each ``sample`` call advances the schedule by one).
    calls: int

    @property
    def current_beta(self) -> float:
        """The exponent the next ``sample`` call uses when none is passed."""
        ...


@runtime_checkable
class InnerSchedule(Sampler, Protocol):
    """A sampler whose sample calls follow the schedule of a sampler it wraps (an ERE
    sampler drawing by a prioritized one: each of its draws advances the wrapped
    sampler's beta schedule). A caller that redraws within one call (sequence windows,
    frame stacks) resolves beta once from that schedule and counts the call once, as for
    a :class:`ScheduledSampler`."""

    @property
    def schedule(self) -> ScheduledSampler | None:
        """The wrapped sampler whose schedule the draws follow, or None (no schedule)."""
        ...


@runtime_checkable
class BatchWeights(Sampler, Protocol):
    """A sampler whose importance weights may depend on the whole batch (PER's
    ``weight_norm="batch"``: every weight divided by the batch's largest). A caller that
    puts one batch together from several draws (rows a view or a window length rejects
    are drawn again) has the returned batch weighed once more as one, so that every row's
    weight is normalised over the rows returned (not over the draw it came from)."""

    def batch_weights(self, res: SampleResult, lanes: LaneView, beta: float | None = None,
                      **kwargs: Any) -> SampleResult:
        """``res`` with the importance weights its keys get as one batch drawn with
        ``beta`` (None: the schedule's); ``res`` itself when its weights do not depend on
        the batch (or it has none). Draws nothing and does not advance a schedule."""
        ...


@runtime_checkable
class UniformDraws(Sampler, Protocol):
    """A sampler whose keys are exactly uniform over the live steps, drawn with
    :func:`~replaybank.ops.draws.uniform_ints` (so fused kernels may draw the same keys
    themselves)."""

    def one_lane_keys(self, batch_size: Any, written: IntArray, counts: IntArray,
                      rng: np.random.Generator) -> IntArray:
        """The keys ``sample(batch_size, ..., replace=True)`` returns for one lane."""
        ...

    def lane_keys(self, batch_size: Any, lanes: LaneView,
                  rng: np.random.Generator) -> IntArray:
        """The keys ``sample(batch_size, lanes, rng, replace=True)`` returns, any lanes."""
        ...


@runtime_checkable
class CountedDraws(UniformDraws, Protocol):
    """A :class:`UniformDraws` sampler whose one-lane draw also returns the number of raw
    64-bit words it read from the bit generator: a caller whose later step fails (a
    frame stack that serves none of the steps) puts exactly those words back
    (:func:`~replaybank.ops.draws.rewind`, where the generator allows it), so the
    successful call pays for no saved generator state."""

    def one_lane_counted(self, batch_size: Any, written: IntArray, counts: IntArray,
                         rng: np.random.Generator) -> tuple[IntArray, int]:
        """The keys :meth:`~UniformDraws.one_lane_keys` returns, and the raw words read
        (:func:`~replaybank.ops.draws.counted_ints`)."""
        ...


@runtime_checkable
class IndependentDraws(Sampler, Protocol):
    """A sampler that can draw keys independently of each other from the law of its
    ``sample`` (each key's marginal is the same; ``sample`` may correlate them, as PER's
    strata do). A caller can then keep the first draws that pass a test and get exactly
    the sampler's law conditioned on passing it (rejection sampling)."""

    def draw_independent(self, batch_size: int, lanes: LaneView,
                         rng: np.random.Generator) -> IntArray:
        """``batch_size`` item keys ``[B]``, i.i.d. from the sampler's law.

        Raises:
            EmptyBufferError: Nothing to draw (empty, or zero total priority).
        """
        ...


@runtime_checkable
class SubsetDraws(Sampler, Protocol):
    """A sampler that can draw distinct keys among given ones by successive sampling from
    its own law restricted to them: each next key with probability proportional to its
    weight in the law among the given keys not drawn yet. Sequence windows without
    replacement (``sample_sequences(replace=False)``) draw so from the usable window
    starts, which is the sampler's ``replace=False`` law conditioned on usable starts."""

    def key_weights(self, keys: IntArray, lanes: LaneView) -> FloatArray:
        """Each of the live ``keys``' unnormalised weight in the sampler's law ``[n]``: a
        draw takes key ``i`` with probability ``w_i / sum(w)`` (uniform: 1 each;
        prioritized: the stored priority; 0: never drawn)."""
        ...

    def sample_among(self, keys: IntArray, batch_size: int, lanes: LaneView,
                     rng: np.random.Generator, replace: bool = False,
                     **kwargs: Any) -> SampleResult:
        """``batch_size`` distinct keys of the distinct live ``keys``, in draw order, by
        successive sampling (see the class docs), or with ``replace=True`` ``batch_size``
        keys drawn i.i.d. from the law restricted to ``keys`` (key ``i`` with probability
        ``w_i / sum(w)``: what a frame stack's draw falls back to, see
        :mod:`replaybank.samplers.draw`), with the probabilities and weights ``sample``
        gives those keys. A scheduled sampler's schedule is not advanced (the caller
        counts the call).

        Raises:
            EmptyBufferError: Fewer than ``batch_size`` of ``keys`` (``replace=True``:
                none) have a positive weight (nothing is drawn).
        """
        ...


@runtime_checkable
class RestrictedDraws(Sampler, Protocol):
    """A sampler that can draw keys i.i.d. from its own law restricted to given keys
    (with replacement only: for distinct draws among given keys see
    :class:`SubsetDraws`, which does both). A frame stack's draw
    (:mod:`replaybank.samplers.draw`) and a sequence window draw
    (:mod:`replaybank.samplers.windows`) fall back to it when redraw rounds do not
    finish: the redraw rounds converge to that same law, the sampler's law conditioned on
    servable steps (usable window starts)."""

    def key_weights(self, keys: IntArray, lanes: LaneView) -> FloatArray:
        """Each of the live ``keys``' unnormalised weight in the sampler's law ``[n]``
        (see :meth:`SubsetDraws.key_weights`)."""
        ...

    def sample_restricted(self, keys: IntArray, batch_size: int, lanes: LaneView,
                          rng: np.random.Generator, **kwargs: Any) -> SampleResult:
        """``batch_size`` keys drawn i.i.d. among the distinct live ``keys``, key ``i``
        with probability ``w_i / sum(w)``, with the probabilities and weights ``sample``
        gives those keys (``kwargs``: the sample call's options).

        Raises:
            EmptyBufferError: None of ``keys`` has a positive weight (nothing is drawn).
        """
        ...


class StatelessSampler:
    """Shared no-op bookkeeping for samplers that keep no per-slot state.

    Such samplers derive everything from the :class:`LaneView` at sampling time, so
    writes, clears and checkpoints have nothing to record. Subclasses implement
    ``sample`` and ``config``.

    Attributes:
        iid: The keys of one ``sample`` call are drawn independently of each other (a
            caller may draw spare keys and keep the first it can use).
    """

    iid: bool = False

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


@dataclass(frozen=True)
class SamplerTraits:
    """What a sampler declares it can do, checked once (``isinstance`` on a runtime
    protocol costs tens of microseconds: never per call).

    Attributes:
        sampler: The sampler.
        priority: The sampler as a :class:`PrioritySampler`, or None.
        keyed: The sampler as a :class:`KeyUpdates`, or None.
        scheduled: The schedule of the sampler's draws: the sampler as a
            :class:`ScheduledSampler`, the sampler it wraps (an :class:`InnerSchedule`),
            or None.
        uniform: The sampler as a :class:`UniformDraws`, or None.
        stateless: Keeps no per-slot state (a :class:`StatelessSampler`): writes need not
            be told to it.
        iid: Its keys are drawn independently within one call.
        bounded: The sampler as a :class:`BoundedPriorities`, or None.
        options: The keyword options its ``sample`` names (``replace``, ``beta``, ...):
            a sample call with any other keyword is rejected. ``beta`` only counts for a
            sampler with priorities (uniform, lane-split and non-prioritized ERE samplers
            name it in their signature, but a buffer refuses it for them).
        independent: The sampler as an :class:`IndependentDraws`, or None.
        counted: The sampler as a :class:`CountedDraws`, or None.
        batch: The sampler as a :class:`BatchWeights`, or None.
        subset: The sampler as a :class:`SubsetDraws`, or None.
        restricted: The sampler as a :class:`RestrictedDraws`, or None.

    Example:
        >>> from replaybank.samplers.uniform import UniformSampler
        >>> t = SamplerTraits.of(UniformSampler())
        >>> t.uniform is t.sampler, t.priority, t.stateless, t.iid
        (True, None, True, True)
    """

    sampler: Sampler
    priority: PrioritySampler | None
    keyed: KeyUpdates | None
    scheduled: ScheduledSampler | None
    uniform: UniformDraws | None
    stateless: bool
    iid: bool
    bounded: BoundedPriorities | None = None
    options: tuple[str, ...] = ()
    independent: IndependentDraws | None = None
    counted: CountedDraws | None = None
    batch: BatchWeights | None = None
    subset: SubsetDraws | None = None
    restricted: RestrictedDraws | None = None

    @classmethod
    def of(cls, sampler: Sampler) -> SamplerTraits:
        """The traits of ``sampler``."""
        # a StatelessSampler subclass that records writes after all is not stateless
        on_write: Any = type(sampler).on_write
        stateless = isinstance(sampler, StatelessSampler) \
            and on_write is StatelessSampler.on_write
        priority = sampler if isinstance(sampler, PrioritySampler) else None
        options = sample_options(sampler)
        if priority is None:  # beta is PER's: refused where there are no priorities
            options = tuple(o for o in options if o != "beta")
        scheduled: ScheduledSampler | None = None
        if isinstance(sampler, ScheduledSampler):
            scheduled = sampler
        elif isinstance(sampler, InnerSchedule):
            scheduled = sampler.schedule
        return cls(
            sampler=sampler,
            priority=priority,
            keyed=sampler if isinstance(sampler, KeyUpdates) else None,
            scheduled=scheduled,
            uniform=sampler if isinstance(sampler, UniformDraws) else None,
            stateless=stateless,
            iid=stateless and bool(sampler.iid),  # type: ignore[attr-defined]
            bounded=sampler if isinstance(sampler, BoundedPriorities) else None,
            options=options,
            independent=sampler if isinstance(sampler, IndependentDraws) else None,
            counted=sampler if isinstance(sampler, CountedDraws) else None,
            batch=sampler if isinstance(sampler, BatchWeights) else None,
            subset=sampler if isinstance(sampler, SubsetDraws) else None,
            restricted=sampler if isinstance(sampler, RestrictedDraws) else None,
        )


def sample_options(sampler: Any) -> tuple[str, ...]:
    """The keyword options a sampler's ``sample`` names (besides ``batch_size``, ``lanes``
    and ``rng``), read once from its signature.

    Example:
        >>> from replaybank.samplers.prioritized import PrioritizedSampler
        >>> sample_options(PrioritizedSampler())
        ('beta', 'replace')
    """
    try:
        params = inspect.signature(sampler.sample).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return ()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(n for n, p in params.items()
                 if p.kind in kinds and n not in ("batch_size", "lanes", "rng"))
