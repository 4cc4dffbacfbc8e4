"""A buffer's sampler and view, their declared capabilities checked once, and sampling:
the sampler draws keys, the view serves them.

``isinstance`` against a runtime protocol costs tens of microseconds, so a buffer checks
its parts' protocols once, when a part is swapped, and :meth:`Parts.sample` reads the
answers: a uniform sampler's keys of one lane are drawn without the protocol round trip,
a one-step view gathers keys it knows are live, a fused view checks and gathers in one
pass, and keys a view cannot serve are redrawn (:func:`~replaybank.samplers.draw.draw`).

A failed sample call changes no state. Every argument is checked before the first draw
(``batch_size``, ``replace``, keyword options the sampler does not name; O(1), and only
when the call is not the plain one); a prioritized sampler checks itself before it draws
or advances its beta schedule. Only a view that may reject keys (frame stacks) can fail
after drawing (64 redraw rounds found nothing it can serve): for those views the
generator state is saved before the draw and restored on failure (one lane's uniform
draw, the common case, saves nothing up front: a failure rewinds the raw words it read,
see :meth:`Parts._one_lane`), and a scheduled
sampler's beta is resolved once per call, so redraw rounds neither advance the schedule
nor change beta within a batch. When redraws do not finish, or for distinct steps
(``replace=False``) from a prioritized sampler or of at least half the stored steps, the
keys are drawn exactly among the servable steps (:func:`~replaybank.samplers.draw.
draw_among`).

Example:
    >>> import replaybank as rb
    >>> p = Parts(rb.UniformSampler(), rb.FrameStackView(4))
    >>> p.traits.uniform is p.sampler, p.fused is p.view, p.step, p.every_step
    (True, True, None, False)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops.draws import rewind, rewinds
from replaybank.samplers.base import (
    LaneView,
    Sampler,
    SampleResult,
    SamplerTraits,
)
from replaybank.samplers.draw import draw, draw_among
from replaybank.samplers.sample_args import LARGE_BATCH, check_batch_size, check_options
from replaybank.storage.table import StepTable
from replaybank.views.base import (
    CallbackView,
    FieldsCheckedView,
    FusedView,
    InputTransform,
    LaneInputTransform,
    SpecTransform,
    StepView,
    View,
)

__all__ = ["Parts"]

IntArray = npt.NDArray[np.int64]


class Parts:
    """The declared capabilities of a buffer's sampler and view, checked once per pair.

    Attributes:
        sampler, view: The parts.
        traits: The sampler's capabilities.
        transform: The view as an input transform (frame stacks), or None.
        lane_transform: The view as an input transform that reads the lanes it writes
            to (:class:`~replaybank.views.base.LaneInputTransform`), or None.
        specs: The view as one that stores other fields than a declared spec of the
            values added (:class:`~replaybank.views.base.SpecTransform`), or None.
        fused: The view as a check-and-gather-in-one-pass view, or None.
        step: The view as a one-step transition view, or None.
        every_step: The view serves every live step (no redraws).
        restores: The view calls user functions (:class:`~replaybank.views.base.
            CallbackView`): a failed sample puts the generator and beta schedule back.
        checks: The view as one that checks the stored observation fields before the
            storage is made (:class:`~replaybank.views.base.FieldsCheckedView`), or None.
    """

    __slots__ = ("checks", "every_step", "fused", "lane_transform", "options", "restores",
                 "sampler", "specs", "step", "subset", "traits", "transform", "view")

    def __init__(self, sampler: Sampler, view: View) -> None:
        self.sampler = sampler
        self.view = view
        self.traits = SamplerTraits.of(sampler)
        self.transform = view if isinstance(view, InputTransform) else None
        self.lane_transform = view if self.transform is not None \
            and isinstance(view, LaneInputTransform) else None
        self.specs = view if isinstance(view, SpecTransform) else None
        self.fused = view if isinstance(view, FusedView) else None
        self.step = view if isinstance(view, StepView) else None
        self.every_step = bool(view.every_step)
        self.restores = isinstance(view, CallbackView)
        self.checks = view if isinstance(view, FieldsCheckedView) else None
        # draws among the servable steps when redraws cannot (see samplers.draw)
        self.subset = self.traits.subset
        # the keyword options a sample call may pass without the slow check
        self.options = frozenset(self.traits.options) - {"batch_size", "replace"}

    def sample(self, table: StepTable | None, lanes: LaneView | None,
               rng: np.random.Generator, batch_size: int, replace: bool,
               kwargs: dict[str, Any]) -> dict[str, Any]:
        """The fields of a batch of ``batch_size`` keys (``[B, *shape]``, ``indices``, and
        ``weights`` / ``probabilities`` from prioritized samplers).

        Raises:
            ConfigError: ``batch_size`` not a positive int.
            ArgumentError: ``replace`` not a bool, or an option the sampler does not take.
            CapacityError: ``batch_size`` too large to draw.
            EmptyBufferError: Nothing to sample (or too little without replacement).
        """
        if self.restores:  # user code runs in the gather: a failure changes nothing
            saved = rng.bit_generator.state
            sched = self.traits.scheduled
            calls = 0 if sched is None else sched.calls
            try:
                return self._sample(table, lanes, rng, batch_size, replace, kwargs)
            except BaseException:
                rng.bit_generator.state = saved
                if sched is not None:
                    sched.calls = calls
                raise
        return self._sample(table, lanes, rng, batch_size, replace, kwargs)

    def _sample(self, table: StepTable | None, lanes: LaneView | None,
                rng: np.random.Generator, batch_size: int, replace: bool,
                kwargs: dict[str, Any]) -> dict[str, Any]:
        if type(batch_size) is not int or not 0 < batch_size <= LARGE_BATCH \
                or (replace is not True and replace is not False) \
                or (kwargs and not self.options.issuperset(kwargs)):
            batch_size, replace = self.check(table, lanes, batch_size, replace, kwargs)
        uniform = self.traits.uniform
        if uniform is not None and table is not None:
            # the uniform sampler validates the same way itself, before it draws
            if replace is True and not kwargs and table.lanes > 1 and self.step is not None \
                    and lanes is not None:
                # several lanes into a one-step view (every key served): the same keys as
                # UniformSampler.sample, without the protocol round trip
                keys = uniform.lane_keys(batch_size, lanes, rng)
                data = self.step.gather_live(table, keys, rng)
                data["indices"] = keys
                return data
            if replace is True and not kwargs and table.lanes == 1:
                # the common case without the sampler protocol round trip: the same keys
                # as UniformSampler.sample
                if self.step is not None:  # keys just drawn: live
                    keys = uniform.one_lane_keys(batch_size, table.written, table.counts,
                                                 rng)
                    data = self.step.gather_live(table, keys, rng)
                    data["indices"] = keys
                    return data
                assert lanes is not None  # a table has lanes
                return self._one_lane(table, lanes, rng, batch_size)
        else:
            check_batch_size(batch_size, 0 if lanes is None else lanes.size, replace)
        if table is None or lanes is None:  # pragma: no cover - check_batch_size raised
            raise AssertionError("sampling without storage")
        if self.every_step:  # every key is served: nothing can fail after the draw
            res = self.sampler.sample(batch_size, lanes, rng, replace=replace, **kwargs)
            got = None
        else:
            res, got = self._draw_servable(table, lanes, rng, batch_size, replace, kwargs)
        if got is None:  # a sampler draws live keys only: a step view takes them as such
            data = self.view.gather(table, res.keys, rng) if self.step is None else \
                self.step.gather_live(table, res.keys, rng)
        else:
            data = got
        data["indices"] = res.keys
        if res.weights is not None:
            data["weights"] = res.weights.astype(np.float32)
        if res.probabilities is not None:
            data["probabilities"] = res.probabilities
        return data

    def _one_lane(self, table: StepTable, lanes: LaneView, rng: np.random.Generator,
                  batch_size: int) -> dict[str, Any]:
        """A batch of one lane's uniform keys (the same keys as ``UniformSampler.sample``)
        for a view that may reject some (frame stacks): the keys it rejects are redrawn
        (:func:`~replaybank.samplers.draw.draw`), and when that fails (no step can be
        served) the generator is put back as it was before the call.

        The successful call saves no generator state: a :class:`~replaybank.samplers.
        base.CountedDraws` sampler says how many raw words its draw read, and a generator
        that can put them back (:func:`~replaybank.ops.draws.rewinds`: PCG64, the
        default) is rewound by them after its state is restored to where the redraws
        began; other samplers or generators save the state before the draw.
        """
        uniform = self.traits.uniform
        counted = self.traits.counted
        saved = None
        if counted is not None and rewinds(rng):
            keys, words = counted.one_lane_counted(batch_size, table.written, table.counts,
                                                   rng)
        else:
            assert uniform is not None  # (only a uniform sampler takes this path)
            saved = rng.bit_generator.state
            keys, words = uniform.one_lane_keys(batch_size, table.written, table.counts,
                                                rng), 0
        # views that check and gather in one pass (frame stacks): None when a key must be
        # redrawn, which draw then does exactly as without the shortcut
        got = None if self.fused is None else self.fused.gather_valid(table, keys, rng)
        if got is None:  # the rare path: what it may need to undo is saved here
            redraw = rng.bit_generator.state if saved is None else saved
            try:
                keys = self._draw(table, lanes, rng, batch_size, SampleResult(keys),
                                  replace=True).keys
                got = self.view.gather(table, keys, rng)
            except BaseException:
                rng.bit_generator.state = redraw
                if saved is None:  # the state after the first draw: put its words back
                    rewind(rng, words)
                raise
        got["indices"] = keys
        return got

    def check(self, table: StepTable | None, lanes: LaneView | None, batch_size: Any,
              replace: Any, kwargs: dict[str, Any]) -> tuple[int, bool]:
        """Check a sample call's arguments before anything is drawn (the slow path of
        :meth:`sample`'s O(1) test): ``batch_size`` (its memory too, when large),
        ``replace`` and the keyword options.

        Returns:
            ``(batch_size, replace)`` as int and bool.
        """
        if kwargs:
            check_options("sample", kwargs, self.traits.options, sampler=self.sampler)
        item = 0
        if table is not None and type(batch_size) is int and batch_size > LARGE_BATCH:
            item = table.spec.nbytes_per_item
        size = 0 if lanes is None else lanes.size
        b = check_batch_size(batch_size, size, replace, item_bytes=item)
        return b, bool(replace)

    def _draw_servable(self, table: StepTable, lanes: LaneView, rng: np.random.Generator,
                       batch_size: int, replace: bool, kwargs: dict[str, Any]
                       ) -> tuple[SampleResult, dict[str, Any] | None]:
        """Keys the view can serve (redrawn where it cannot) and, from a fused view, their
        data; a failure restores the generator and the beta schedule."""
        saved = rng.bit_generator.state  # redraws may fail late: then nothing changed
        sched = self.traits.scheduled
        calls = 0
        if sched is not None:  # beta once per call, whatever the redraw rounds
            calls = sched.calls
            if kwargs.get("beta") is None:
                kwargs = {**kwargs, "beta": sched.current_beta}
        try:
            got = None
            subset = self.subset
            if not replace and subset is not None and (
                    self.traits.priority is not None or 2 * batch_size >= lanes.size):
                # distinct steps drawn exactly among the servable ones: a prioritized
                # sampler's successive sampling restricted to them (redraw rounds would
                # not keep its law; those of a uniform law, ERE's window included, do),
                # or a batch of at least half the stored steps (the list of servable
                # steps costs about as much as the batch)
                res = draw_among(subset, lanes, rng, batch_size, self._valid(table),
                                 replace=replace, **kwargs)
            else:
                first = None
                if self.fused is not None:  # check and gather in one pass
                    first = self.sampler.sample(batch_size, lanes, rng, replace=replace,
                                                **kwargs)
                    got = self.fused.gather_valid(table, first.keys, rng)
                if got is not None and first is not None:
                    res = first
                else:  # keys to redraw: exactly as draw alone would
                    res = self._draw(table, lanes, rng, batch_size, first, replace=replace,
                                     **kwargs)
                    batch = self.traits.batch
                    if batch is not None:  # rows of several draws, weighed as one batch
                        res = batch.batch_weights(res, lanes, kwargs.get("beta"))
        except BaseException:
            rng.bit_generator.state = saved
            if sched is not None:
                sched.calls = calls
            raise
        if sched is not None:
            sched.calls = calls + 1
        return res, got

    def _draw(self, table: StepTable, lanes: LaneView, rng: np.random.Generator,
              batch_size: int, first: SampleResult | None = None,
              **kwargs: Any) -> SampleResult:
        """The sampler's keys, the ones the view cannot serve redrawn."""
        return draw(self.sampler, lanes, rng, batch_size, self._valid(table), first, **kwargs)

    def _valid(self, table: StepTable) -> Any:
        """The view's check of keys of ``table`` (a mask of the keys it serves, or None)."""
        view = self.view
        return _all_valid if self.every_step else (lambda keys: view.valid(table, keys))


def _all_valid(keys: IntArray) -> None:
    """The check of a view that serves every live step."""
    return None
