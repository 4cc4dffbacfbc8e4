"""Window starts for sequence sampling: the sampler draws starts, the short ones are redrawn.

A start is usable when the window from it holds at least ``min_len`` steps: it stays in its
lane, below the write head and (``cross=False``) inside one episode (its *extent*,
:mod:`replaybank.ops.windows`). The starts therefore follow the sampler's distribution
*conditioned on usable starts*. After ``max_redraws`` rounds a sampler that draws among
given keys (:class:`~replaybank.samplers.base.SubsetDraws`: uniform, prioritized, ERE;
:class:`~replaybank.samplers.base.RestrictedDraws`: lane split) draws the rows still short
from its law restricted to the usable starts, the same distribution (uniform over them;
in proportion to priority among those of positive priority, with the unconditional
probabilities and weights; ERE within its window; lane split ``1 / count_l`` for each
usable start of lane ``l``); other samplers keep redrawing (at least 1024 rounds) and
raise when they fail. A call is refused
only when no window is usable, or none of their starts can be drawn (all of priority 0,
or outside an ERE window), with a message that names that cause. I.i.d. samplers draw
``B // 2 + 4`` spare starts in the first round and keep the first ``B`` usable ones in
draw order, which leaves the law unchanged. A scheduled sampler (PER's beta) resolves
beta once, so redraw rounds neither advance its schedule nor change beta inside one
batch; the call counts once.

Without replacement (``replace=False``) the windows are distinct: the starts are drawn
from the *servable* ones (usable, and of positive weight in the sampler's law: a stored
priority above 0) by successive sampling (:class:`~replaybank.samplers.base.SubsetDraws`:
uniform, a uniformly random subset; prioritized, each next start in proportion to
priority among those not drawn yet), which is the sampler's ``replace=False`` law
conditioned on usable starts. A batch larger than the servable starts is refused before
anything is drawn (:func:`servable_starts` lists them).

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=64, seed=0)
    >>> for t in range(20):
    ...     buf.add(obs=np.full(2, t, np.float32), action=0, reward=1.0,
    ...             next_obs=np.full(2, t + 1, np.float32), terminated=t == 9, truncated=False)
    >>> req = WindowRequest("sample_sequences", 4, 5, 0, False, True, None, 16, {})
    >>> res, ext = draw_starts(buf.sampler_traits, buf.lane_view(), buf.table.link, buf.rng,
    ...                        req)
    >>> res.keys.shape, bool(np.all(ext >= 5))
    ((4,), True)
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import numpy.typing as npt

from replaybank.errors import ConfigError, EmptyBufferError
from replaybank.ops import windows
from replaybank.ops.draws import uniform_ints
from replaybank.samplers.base import FloatArray, LaneView, SampleResult, SamplerTraits, SubsetDraws
from replaybank.samplers.draw import iid_among, replace_rows
from replaybank.samplers.sample_args import (
    LARGE_BATCH,
    check_batch_size,
    check_draw_size,
    check_options,
    check_replace,
    check_size_arg,
)

if TYPE_CHECKING:
    from replaybank.storage.table import StepTable

__all__ = ["WindowRequest", "draw_starts", "extent_kernel", "public_call", "redraw_short",
           "servable_starts"]

IntArray = npt.NDArray[np.int64]

#: The arguments of sample_sequences itself (the rest go to the sampler).
_SEQ_ARGS = ("batch_size", "sequence_length", "episode_boundary", "strict", "burn_in",
             "state_fields", "max_redraws")


def public_call(call: str) -> str:
    """The call a window draw's messages name: the user's. Candidates
    (``"sequence_candidates"``) are drawn only for a ``sample_sequences`` call of the
    sharded service's client, so their messages name ``sample_sequences``.

    Example:
        >>> public_call("sequence_candidates"), public_call("sample_sequences")
        ('sample_sequences', 'sample_sequences')
    """
    return "sample_sequences" if call == "sequence_candidates" else call


class WindowRequest(NamedTuple):
    """The checked arguments of one window draw
    (:func:`replaybank.buffers.sequences.draw_windows`).

    Args:
        call: The public call (``"sample_sequences"``, or ``"sequence_candidates"``: the
            starts are drawn independently and every draw is kept, usable or not).
        batch_size: Windows (or candidates) ``B``.
        sequence_length: Loss steps ``L`` per window.
        burn_in: Leading burn-in steps ``k``.
        cross: Windows run over episode ends (``episode_boundary="cross"``).
        strict: Only full windows (True) or zero-padded shorter ones (False).
        state_fields: As :func:`~replaybank.buffers.sequences.sample_sequences`.
        max_redraws: Rounds of redrawing invalid starts before the exact fallback.
        options: The sampler's keyword options (e.g. ``beta``).
        available: The live steps when the request was checked (0: not known); the
            draw of the same call reuses it.

    Example:
        >>> req = WindowRequest("sample_sequences", 4, 6, 2, False, True, None, 16, {})
        >>> req.width, req.min_len, req.candidates
        (8, 8, False)
    """

    call: str
    batch_size: int
    sequence_length: int
    burn_in: int
    cross: bool
    strict: bool
    state_fields: str | Sequence[str] | None
    max_redraws: int
    options: dict[str, Any]
    available: int = 0

    @property
    def width(self) -> int:
        """Steps per window ``W = burn_in + sequence_length``."""
        return self.burn_in + self.sequence_length

    @property
    def min_len(self) -> int:
        """The shortest usable extent: ``W`` (strict) or ``burn_in + 1``."""
        return self.width if self.strict else self.burn_in + 1

    @property
    def candidates(self) -> bool:
        """Whether this is a :func:`sequence_candidates` draw."""
        return self.call == "sequence_candidates"

    @property
    def said(self) -> str:
        """The call a message names (:func:`public_call`)."""
        return public_call(self.call)

    @classmethod
    def checked(cls, call: str, table: StepTable | None, lanes: LaneView | None,
                traits: SamplerTraits, batch_size: Any, sequence_length: Any,
                episode_boundary: Any, strict: Any, burn_in: Any, state_fields: Any,
                max_redraws: Any, options: dict[str, Any]) -> WindowRequest:
        """The request of ``call`` from its public arguments (named as in
        :func:`~replaybank.buffers.sequences.sample_sequences`), checked before anything is drawn.

        A bad argument's message names the user's call: ``sample_sequences(...)`` also for
        ``"sequence_candidates"``, whose draws serve the sharded client's
        ``sample_sequences``.

        Raises:
            ConfigError: As :func:`~replaybank.buffers.sequences.sample_sequences`
                (and, for candidates, ``replace=False`` or a sampler that cannot draw
                independently).
            ArgumentError: An unknown keyword, or a ``replace`` that is not a bool.
            CapacityError: The windows do not fit in memory.
            EmptyBufferError: Nothing to draw.
        """
        said = public_call(call)
        if not (type(batch_size) is int and type(sequence_length) is int
                and type(burn_in) is int and type(max_redraws) is int
                and batch_size >= 1 and sequence_length >= 1 and burn_in >= 0
                and max_redraws >= 0):
            batch_size = check_size_arg("batch_size", batch_size, said)
            sequence_length = check_size_arg("sequence_length", sequence_length, said)
            burn_in = check_size_arg("burn_in", burn_in, said, lo=0)
            max_redraws = check_size_arg("max_redraws", max_redraws, said, lo=0)
        if options:
            check_options(said, options, traits.options, _SEQ_ARGS, traits.sampler)
            if "replace" in options:
                check_replace(options["replace"], said)
        if episode_boundary == "stop":
            cross = False
        elif episode_boundary == "cross":
            cross = True
        else:
            raise ConfigError(
                f"{said}(episode_boundary={episode_boundary!r}): use 'stop' (windows "
                "end at episode ends, R2D2) or 'cross' (windows run over them, DreamerV3)"
            )
        if strict is not True and strict is not False and not isinstance(strict, np.bool_):
            raise ConfigError(f"{said}(strict={strict!r}): must be a bool")
        width = burn_in + sequence_length
        if batch_size * (width + 1) > (1 << 20):  # [B, W + 1] of every field: memory first
            check_draw_size(
                f"{said}(batch_size={batch_size}, sequence_length={sequence_length}, "
                f"burn_in={burn_in})", batch_size * (width + 1),
                0 if table is None else table.spec.nbytes_per_item,
                "lower batch_size, sequence_length or burn_in")
        available = 0 if lanes is None else lanes.size
        if available <= 0 or batch_size > LARGE_BATCH:  # the rest was checked above
            check_batch_size(batch_size, available, True, said)
        if call == "sequence_candidates":
            if options.get("replace", True) is not True:
                raise ConfigError(
                    f"{call}(replace={options['replace']!r}): candidates are drawn with "
                    "replacement; use sample_sequences for distinct starts")
            if traits.independent is None:
                raise ConfigError(
                    f"{call}: the sampler ({type(traits.sampler).__name__}) cannot draw keys "
                    "independently (no draw_independent); use sample_sequences")
        return cls(call, batch_size, sequence_length, burn_in, cross, bool(strict),
                   state_fields, max_redraws, options, available)


@cache
def extent_kernel() -> Any:
    """The window-extent kernel (numba when it imports, else numpy), loaded once."""
    return windows.kernel(windows.window_extent)[0]


def draw_starts(traits: SamplerTraits, lanes: LaneView, link: npt.NDArray[np.int32],
                rng: np.random.Generator, req: WindowRequest, extent: Any = None,
                fast: Any = None) -> tuple[SampleResult, IntArray]:
    """``req.batch_size`` window starts whose extent is at least ``req.min_len`` and their
    extents ``[B]``.

    Args:
        traits: The sampler's traits.
        lanes: The lane bookkeeping.
        link: Next-observation links ``[T, lanes]``.
        rng: The sampling generator.
        req: The checked request (its ``options`` go to the sampler).
        extent: The window-extent function (default: :func:`extent_kernel`).
        fast: The numba window module, for the uniform sampler's fused draw, or None.
    """
    sampler = traits.scheduled
    if sampler is None:
        return _draw_rounds(traits, lanes, link, rng, req, extent, fast)
    # a scheduled sampler (PER): resolve beta once, so that redraw rounds neither advance
    # the schedule nor change beta inside one batch; the call counts once
    calls = sampler.calls
    if req.options.get("beta") is None:
        req = req._replace(options={**req.options, "beta": sampler.current_beta})
    try:
        out = _draw_rounds(traits, lanes, link, rng, req, extent, fast)
    except BaseException:
        sampler.calls = calls
        raise
    sampler.calls = calls + 1
    return out


def _draw_rounds(traits: SamplerTraits, lanes: LaneView, link: npt.NDArray[np.int32],
                 rng: np.random.Generator, req: WindowRequest, extent: Any = None,
                 fast: Any = None) -> tuple[SampleResult, IntArray]:
    if extent is None:
        extent = extent_kernel()
    kwargs, batch_size, min_len = req.options, req.batch_size, req.min_len
    if not kwargs.get("replace", True):  # a bool: WindowRequest.checked saw to it
        return _distinct_starts(traits, lanes, link, rng, req, extent)
    # i.i.d. samplers draw a few spare starts up front and keep the first valid ones (in
    # draw order, so the accepted starts are still i.i.d. from the conditional law)
    iid = traits.iid and kwargs.get("replace", True) and req.max_redraws > 0
    m = batch_size + batch_size // 2 + 4 if iid else batch_size
    fast = fast if iid and traits.uniform is not None else None
    if fast is not None:
        # the uniform sampler's own draw (same generator calls), then key mapping,
        # extents and selection in one compiled pass
        flat = uniform_ints(rng, lanes.size, m)  # size: the live steps
        keys, ext, n_valid = fast.draw_windows(link, lanes.written, lanes.counts, flat,
                                               req.width, req.cross, min_len, batch_size)
        res = SampleResult(keys)
        if n_valid >= batch_size:
            return res, ext
    else:
        res = traits.sampler.sample(m, lanes, rng, **kwargs)
        ext = extent(link, lanes.written, lanes.counts, res.keys, req.width,
                     req.cross)  # [m]
        if m > batch_size:
            good = np.flatnonzero(ext >= min_len)
            sel = good[:batch_size] if len(good) >= batch_size else \
                np.argsort(ext < min_len, kind="stable")[:batch_size]  # valid ones first
            res, ext = SampleResult(res.keys[sel]), ext[sel]
    return redraw_short(traits, lanes, link, rng, res, ext, req, extent)


def servable_starts(traits: SamplerTraits, lanes: LaneView, link: npt.NDArray[np.int32],
                    req: WindowRequest) -> tuple[IntArray, FloatArray]:
    """The starts a distinct window draw (``replace=False``) may take and their weights.

    A start is servable when its window is usable (extent at least ``req.min_len``,
    :func:`~replaybank.ops.windows.valid_starts`) and its weight in the sampler's law is
    positive (:meth:`~replaybank.samplers.base.SubsetDraws.key_weights`: 1 for a uniform
    sampler, the stored priority for a prioritized one). ``sample_sequences(B,
    replace=False)`` serves ``B`` up to their number.

    Args:
        traits: The sampler's traits.
        lanes: The lane bookkeeping.
        link: Next-observation links ``[T, lanes]``.
        req: The checked request.

    Returns:
        Keys ``[n]`` (lane by lane, oldest first) and their weights ``[n]`` (all > 0).

    Raises:
        ConfigError: The sampler cannot draw distinct keys among given ones (not a
            :class:`~replaybank.samplers.base.SubsetDraws`).

    Example:
        >>> import replaybank as rb
        >>> buf = rb.ReplayBuffer(capacity=64, seed=0)
        >>> for t in range(12):
        ...     buf.add(obs=np.zeros(2), action=0, reward=1.0, next_obs=np.zeros(2),
        ...             terminated=t % 4 == 3, truncated=False)
        >>> req = WindowRequest("sample_sequences", 1, 3, 0, False, True, None, 16, {})
        >>> keys, w = servable_starts(buf.sampler_traits, buf.lane_view(), buf.table.link, req)
        >>> keys.tolist(), w.tolist()
        ([0, 1, 4, 5, 8, 9], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    """
    among = _subset_draws(traits, req)
    keys = windows.valid_starts(link, lanes.written, lanes.counts, req.width, req.cross,
                                req.min_len)
    weights = np.asarray(among.key_weights(keys, lanes), np.float64)
    keep = weights > 0.0
    return keys[keep], weights[keep]


def _subset_draws(traits: SamplerTraits, req: WindowRequest) -> SubsetDraws:
    """The sampler as a :class:`~replaybank.samplers.base.SubsetDraws`, or a ConfigError
    naming the call."""
    among = traits.subset
    if among is None:
        raise ConfigError(
            f"{req.said}(replace=False): the sampler ({type(traits.sampler).__name__}) "
            "cannot draw distinct windows (no key_weights/sample_among); use replace=True "
            "or a uniform or prioritized sampler")
    return among


def _distinct_starts(traits: SamplerTraits, lanes: LaneView, link: npt.NDArray[np.int32],
                     rng: np.random.Generator, req: WindowRequest,
                     extent: Any) -> tuple[SampleResult, IntArray]:
    """``req.batch_size`` distinct servable starts by successive sampling, their extents
    (see the module docs); a batch above the servable starts is refused first."""
    keys, _ = servable_starts(traits, lanes, link, req)
    if req.batch_size > len(keys):
        mode = "cross" if req.cross else "stop"
        what = " whose start has a positive priority" if traits.priority is not None else ""
        fix = (f"lower batch_size to at most {len(keys)}, use replace=True" if len(keys)
               else "add more data")
        raise EmptyBufferError(
            f"{req.said}(batch_size={req.batch_size}, width={req.width}, episode_boundary="
            f"{mode!r}, replace=False): the buffer holds {len(keys)} distinct windows of at "
            f"least {req.min_len} steps{what} (among {lanes.size} steps); "
            f"{_more_windows(req, fix)}")
    res = _subset_draws(traits, req).sample_among(keys, req.batch_size, lanes, rng,
                                                  **req.options)
    ext = extent(link, lanes.written, lanes.counts, res.keys, req.width, req.cross)
    return res, np.asarray(ext, np.int64)


def redraw_short(traits: SamplerTraits, lanes: LaneView, link: npt.NDArray[np.int32],
                 rng: np.random.Generator, res: SampleResult, ext: IntArray,
                 req: WindowRequest, extent: Any = None) -> tuple[SampleResult, IntArray]:
    """Redraw the starts of ``res`` whose extent is below ``req.min_len`` (``ext`` is
    updated in place), then draw the rest exactly among the usable starts (a sampler that
    draws among given keys, see the module docs).

    Weights that depend on the batch (PER's ``weight_norm="batch"``,
    :class:`~replaybank.samplers.base.BatchWeights`) are computed over the rows
    returned, whichever draw each row came from.

    Args:
        traits: The sampler's traits.
        lanes: The lane bookkeeping.
        link: Next-observation links ``[T, lanes]``.
        rng: The sampling generator.
        res: The drawn starts ``[B]``.
        ext: Their extents ``[B]``.
        req: The checked request (its ``options`` go to the sampler).
        extent: The window-extent function (default: :func:`extent_kernel`).

    Raises:
        EmptyBufferError: No usable window; or no usable start has a positive weight in
            the sampler's law; or (a sampler that cannot draw among given keys) the
            redraws did not finish. The message names the cause and the fixes.
    """
    if extent is None:
        extent = extent_kernel()
    width, cross, min_len, kwargs = req.width, req.cross, req.min_len, req.options
    exact = traits.uniform is not None or traits.subset is not None \
        or traits.restricted is not None
    limit = req.max_redraws if exact else max(req.max_redraws, 1024)
    bad = np.flatnonzero(ext < min_len)
    if len(bad) == 0:
        return res, ext
    for _ in range(limit):
        more = traits.sampler.sample(len(bad), lanes, rng, **kwargs)
        res = replace_rows(res, bad, more)
        ext[bad] = extent(link, lanes.written, lanes.counts, more.keys, width, cross)
        bad = np.flatnonzero(ext < min_len)
        if len(bad) == 0:
            break
    else:
        res = _among_usable(traits, lanes, link, rng, res, ext, bad, req, extent, limit)
    # rows of several draws: weights that depend on the batch are computed over the rows
    # returned, not per draw (PER's weight_norm="batch")
    batch = traits.batch
    return (res if batch is None else batch.batch_weights(res, lanes, kwargs.get("beta"))), ext


def _among_usable(traits: SamplerTraits, lanes: LaneView, link: npt.NDArray[np.int32],
                  rng: np.random.Generator, res: SampleResult, ext: IntArray, bad: IntArray,
                  req: WindowRequest, extent: Any, rounds: int) -> SampleResult:
    """``res`` with its rows ``bad`` drawn from the sampler's law restricted to the usable
    starts (``ext`` updated in place): uniformly for a uniform sampler, in proportion to
    the key weights for a :class:`~replaybank.samplers.base.SubsetDraws` or
    :class:`~replaybank.samplers.base.RestrictedDraws` (i.i.d., with the probabilities
    and weights its ``sample`` gives those keys); an error naming the cause otherwise."""
    width, cross, min_len = req.width, req.cross, req.min_len
    valid = windows.valid_starts(link, lanes.written, lanes.counts, width, cross, min_len)
    head = (f"{req.said}(batch_size={req.batch_size}, width={width}, episode_boundary="
            f"{'cross' if cross else 'stop'!r}")
    if len(valid) == 0:
        raise EmptyBufferError(
            f"{head}): the buffer holds no window of at least {min_len} steps (among "
            f"{lanes.size} steps); {_more_windows(req)}")
    keys = res.keys.copy()
    if traits.uniform is not None:  # the uniform sampler's stream: uniform over the usable
        keys[bad] = valid[uniform_ints(rng, len(valid), len(bad))]
        ext[bad] = extent(link, lanes.written, lanes.counts, keys[bad], width, cross)
        return SampleResult(keys, res.probabilities, res.weights)
    name = type(traits.sampler).__name__
    among = traits.subset if traits.subset is not None else traits.restricted
    if among is None:
        raise EmptyBufferError(
            f"{head}): the buffer holds {_windows(len(valid))} of at least {min_len} steps, "
            f"but {rounds} redraw rounds of the sampler ({name}) drew none of their starts "
            f"for {len(bad)} of the {req.batch_size} rows: its law puts (almost) no mass on "
            "them; use a sampler that draws the rest among the usable starts (uniform, "
            f"lane split, prioritized or RecentSampler){_usable_hint(req)}")
    weights = np.asarray(among.key_weights(valid, lanes), np.float64)
    servable = valid[weights > 0.0]
    if len(servable) == 0:
        raise EmptyBufferError(
            f"{head}): the buffer holds {_windows(len(valid))} of at least {min_len} steps, "
            f"but every one of their starts has weight 0 in the sampler's law ({name}: a "
            "stored priority of 0 is never drawn); update their priorities with positive "
            f"values (update_priorities) or use eps > 0{_usable_hint(req)}")
    try:
        more = iid_among(among, servable, len(bad), lanes, rng, req.options)
    except EmptyBufferError as exc:  # none in reach of the options (an ERE window)
        raise EmptyBufferError(
            f"{head}): the buffer holds {_windows(len(servable))} of at least {min_len} "
            f"steps, but the sampler ({name}) cannot draw their starts with the options of "
            f"this call ({exc}){_usable_hint(req)}") from None
    res = replace_rows(res, bad, more)
    ext[bad] = extent(link, lanes.written, lanes.counts, more.keys, width, cross)
    return res


def _windows(n: int) -> str:
    """``"1 window"``, ``"3 windows"``."""
    return f"{n} window" + ("" if n == 1 else "s")


def _fixes(req: WindowRequest) -> list[str]:
    """The options that make more windows usable, leaving out those the call already uses
    (``strict=False``, ``episode_boundary='cross'``)."""
    fixes = []
    if req.strict:
        fixes.append("shorten sequence_length" + ("/burn_in" if req.burn_in else ""))
        fixes.append("use strict=False (zero-padded windows)")
    elif req.burn_in:
        fixes.append("shorten burn_in (a padded window needs burn_in + 1 steps)")
    if not req.cross:
        fixes.append("use episode_boundary='cross' (windows over episode ends)")
    return fixes


def _more_windows(req: WindowRequest, first: str = "add more data") -> str:
    """``first``, then the options that make more windows usable, as one phrase.

    Example:
        >>> req = WindowRequest("sample_sequences", 2, 8, 0, True, True, None, 16, {})
        >>> _more_windows(req)
        'add more data, shorten sequence_length or use strict=False (zero-padded windows)'
    """
    fixes = [first, *_fixes(req)]
    return ", ".join(fixes[:-1]) + (" or " if len(fixes) > 1 else "") + fixes[-1]


def _usable_hint(req: WindowRequest) -> str:
    """``", or make more starts usable: ..."`` (empty when every option is in use)."""
    fixes = _fixes(req)
    if not fixes:
        return ""
    return ", or make more starts usable: " + ", ".join(fixes[:-1]) + (
        " or " if len(fixes) > 1 else "") + fixes[-1]
