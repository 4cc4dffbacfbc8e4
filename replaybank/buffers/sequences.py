"""Sequence (slice) sampling for recurrent and world-model agents, and R2D2 priorities.

A sequence batch holds windows of ``W = burn_in + sequence_length`` consecutive steps of
one lane each. Two boundary modes:

* ``episode_boundary="stop"`` (R2D2): a window never runs past an episode end (nor a
  discontinuity in the data). With ``strict=True`` only full windows are sampled; with
  ``strict=False`` a window may be shorter than ``W`` (at least ``burn_in + 1`` steps)
  and is zero-padded at the end, ``mask=False`` there.
* ``episode_boundary="cross"`` (DreamerV3): windows run over episode ends; ``is_first``
  marks where an episode starts so a model can reset its state. ``strict=False`` lets a
  window run into the write head (padded as above).

In both modes a window never crosses the write head, never mixes lanes and never reads
an overwritten step (see :mod:`replaybank.ops.windows`).

Windows hold the *stored* steps whatever the buffer's view: one-step rewards and one frame
per step, also on a buffer built with ``n_step=`` or ``frame_stack=`` (those shape its
one-step ``sample()`` only). That is what a recurrent learner needs: R2D2 computes its
n-step targets over the window's rewards, and the model's memory spans the frames
(``burn_in`` gives it their history). :class:`~replaybank.compat.sequence.
SequenceReplayBuffer`, whose ``sample`` returns windows, refuses those options.

Memory: ``obs`` and ``next_obs`` come from one ``[B, W + 1]`` gather. When no step inside
a window keeps its next observation aside (no episode end inside, no padding), they
are two read-only views of that array, offset by one step (``to_torch`` copies them);
otherwise ``next_obs`` is its own array.

Which windows: window starts are drawn by the buffer's sampler and every start whose
window is too short is redrawn, so the starts follow the sampler's distribution
*conditioned on valid starts*: uniform over the valid starts of all lanes for
:class:`~replaybank.samplers.uniform.UniformSampler`, proportional to priority among
valid starts for a prioritized sampler (its importance weights are computed from the
unconditional probabilities; the conditioning multiplies every probability by the same
constant, which max-normalised weights cancel; ``weight_norm="batch"`` normalises over the
windows returned, redrawn ones included). When valid starts are rare, after
``max_redraws`` rounds the uniform, prioritized, ERE and lane-split samplers draw the rest
directly from their law restricted to the valid starts (same distribution; a prioritized
sampler in proportion to priority among them, however small their share of the priority
mass; lane split ``1 / count_l`` per valid start of lane ``l``); other samplers keep
redrawing and raise if they fail.
I.i.d. samplers (uniform, lane split) draw ``B // 2 + 4`` spare starts in the first round
and keep the first ``B`` valid ones in draw order, which leaves the law unchanged and
usually saves the redraw rounds. ``replace=False`` draws ``B`` distinct windows: by
successive sampling over the *servable* starts (valid, and of positive priority for a
prioritized sampler; :func:`servable_windows` counts them), uniformly or in proportion to
priority among those not drawn yet, the sampler's ``replace=False`` law conditioned on
valid starts; a ``B`` above their number is refused before anything is drawn. A
prioritized sampler's beta schedule advances once per call: beta is resolved once and
passed to every redraw round.

Speed: with numpy storage (``KERNEL = "auto"``), the uniform sampler's draw is mapped to
starts, checked and selected, the slots, flags and side patches of the kept starts
computed, and the rows of every field gathered, in one compiled call (``draw_take`` of
:mod:`~replaybank.ops.windows_c`, in C where built, else of
:mod:`~replaybank.ops.windows_numba`: no JIT on the C path, so the first call of a
process does not import numba; other samplers and redraw rounds use ``draw_windows``,
``sequence_plan`` and :func:`~replaybank.ops.windows.take_rows`). Where the generator
can put its raw words back (PCG64, the default: :func:`~replaybank.ops.draws.rewind`),
that call does not save the generator's state first; a failure gives the words back.
The batches are identical to the numpy path's (``KERNEL = "numpy"``, used for other
storages too).

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=64, seed=0)
    >>> for t in range(20):
    ...     buf.add(obs=np.full(2, t, np.float32), action=0, reward=1.0,
    ...             next_obs=np.full(2, t + 1, np.float32), terminated=t == 9, truncated=False)
    >>> sb = buf.sample_sequences(4, 5)  # sample_sequences with the buffer's parts
    >>> sb.obs.shape, sb.mask.shape, bool(sb.mask.all())
    ((4, 5, 2), (4, 5), True)
    >>> bool(np.all(sb.next_obs[..., 0] == sb.obs[..., 0] + 1))
    True
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from functools import cache, partial
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from replaybank.batch import SequenceBatch
from replaybank.buffers.priorities import stored_lanes, to_host, update_priorities
from replaybank.errors import ConfigError, DtypeError, EmptyBufferError, ShapeError, describe
from replaybank.ops import ring, windows
from replaybank.ops.draws import counted_ints, rewind, rewinds
from replaybank.ops.jit import pick_kernel
from replaybank.samplers.base import LaneView, SampleResult, SamplerTraits
from replaybank.samplers.windows import (
    WindowRequest,
    draw_starts,
    extent_kernel,
    redraw_short,
    servable_starts,
)
from replaybank.spec import SEP, real_floats, rows_array
from replaybank.storage.table import StepTable
from replaybank.views.sequence import draw_gather, fused_reads, gather_fused, gather_numpy

__all__ = ["STATE_PREFIX", "WindowRequest", "WindowUpdates", "check_eta",
           "checked_window_updates", "draw_windows", "sample_sequences",
           "sequence_candidates", "servable_windows", "update_sequence_priorities"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Batch name prefix of the stored recurrent state at each window's first step.
STATE_PREFIX = "initial"


def _state_names(spec_names: Sequence[str], state_fields: Any) -> list[str]:
    if state_fields is None:
        wanted = ["hidden"]
        strict = False
    else:
        wanted = [state_fields] if isinstance(state_fields, str) else list(state_fields)
        strict = True
    out: list[str] = []
    for w in wanted:
        hits = [n for n in spec_names if n == w or n.startswith(w + SEP)]
        if strict and not hits:
            raise ConfigError(
                f"sample_sequences(state_fields={state_fields!r}): no stored field {w!r}; "
                f"stored fields are {sorted(spec_names)}"
            )
        out.extend(hits)
    for name in out:  # checked before anything is drawn
        key = f"{STATE_PREFIX}{SEP}{name}"
        if key in spec_names:
            raise ConfigError(f"sample_sequences: stored field {key!r} clashes with the "
                              f"initial state of {name!r}; rename the field")
    return out


_NAMES: dict[Any, tuple[Any, list[str]]] = {}


def _cached_state_names(spec: Any, state_fields: Any) -> list[str]:
    """:func:`_state_names` of a spec, memoised per (spec object, state_fields)."""
    sf = state_fields if state_fields is None or isinstance(state_fields, str) \
        else tuple(state_fields)
    key = (id(spec), sf)
    hit = _NAMES.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1]
    names = _state_names(list(spec), state_fields)
    if len(_NAMES) > 64:
        _NAMES.clear()
    _NAMES[key] = (spec, names)
    return names


@cache
def _r2d2_kernel() -> Any:
    """The R2D2 priority kernel (numba when it imports, else numpy), loaded once."""
    return windows.kernel(windows.r2d2_priority)[0]


#: Who computes starts, slots and flags: ``"auto"`` (the fused kernels, C where built,
#: else numba when it imports, for numpy storage) or ``"numpy"`` (the vectorised numpy
#: path).
KERNEL = "auto"


@cache
def _window_kernels() -> Any:
    """The module of the fused path's kernels (:mod:`~replaybank.ops.windows_c`, else
    :mod:`~replaybank.ops.windows_numba`), or None when neither imports (loaded once)."""
    return pick_kernel("auto", "replaybank.ops.windows_numba", None, None,
                       "sample_sequences", compiled="replaybank.ops.windows_c")[0]


def _fast_kernels() -> Any:
    """The module of the fused path, or None (no compiled kernels, or ``KERNEL="numpy"``)."""
    return _window_kernels() if KERNEL == "auto" else None


def sample_sequences(
    table: StepTable | None,
    lanes: LaneView | None,
    rng: np.random.Generator,
    traits: SamplerTraits,
    batch_size: int,
    sequence_length: int,
    episode_boundary: str = "stop",
    strict: bool = True,
    burn_in: int = 0,
    state_fields: str | Sequence[str] | None = None,
    max_redraws: int = 16,
    **sampler_kwargs: Any,
) -> SequenceBatch:
    """Sample ``batch_size`` windows of ``burn_in + sequence_length`` steps.

    Args:
        table: The buffer's step table (None before its first add).
        lanes: Its lane bookkeeping (None before its first add).
        rng: The sampling generator.
        traits: The buffer's sampler's traits (any sampler).
        batch_size: Windows ``B``.
        sequence_length: Loss steps ``L`` per window.
        episode_boundary: ``"stop"`` or ``"cross"`` (see the module docs).
        strict: Only full windows (True) or zero-padded shorter ones (False).
        burn_in: Steps ``k`` prepended to each window, flagged ``burn_in`` and excluded
            from ``mask``; a window is ``W = k + L`` steps long.
        state_fields: Stored recurrent-state fields to return at each window's first
            step as ``initial/<name>`` ``[B, *shape]``; default: the field ``hidden``
            (and ``hidden/...``) when stored.
        max_redraws: Rounds of redrawing invalid starts before the exact fallback (the
            sampler's law restricted to the valid starts).
        **sampler_kwargs: Passed to the sampler (e.g. ``beta``; ``replace=False``:
            distinct windows, see the module docs).

    Returns:
        A :class:`~replaybank.batch.SequenceBatch`: every stored field and ``next_obs``
        ``[B, W, *shape]`` (zero where padded; the stored one-step data, whatever the
        buffer's view: see the module docs); ``mask`` (valid loss steps),
        ``is_first`` (an episode starts here, or the table no longer holds the previous
        step), ``is_last`` (the episode ended here: terminated, truncated or a
        discontinuity), ``is_terminal`` (terminated), ``burn_in`` ``[B, W]`` bool;
        ``starts`` (item keys of the window starts, ``[B]``, for
        :func:`update_sequence_priorities`), ``initial/<field>`` and, from prioritized
        samplers, ``weights`` and ``probabilities`` ``[B]``.

    Raises:
        ConfigError: Bad arguments (nothing is drawn), or ``replace=False`` with a
            sampler that cannot draw distinct windows (not a
            :class:`~replaybank.samplers.base.SubsetDraws`).
        ArgumentError: A keyword neither this function nor the sampler takes, or a
            ``replace`` that is not a bool.
        CapacityError: ``batch_size`` windows of ``burn_in + sequence_length`` steps do
            not fit in memory.
        EmptyBufferError: The buffer holds no window of the required length, the
            sampler cannot draw any of their starts (all of priority 0, or outside an ERE
            window), or (``replace=False``) fewer servable ones than ``batch_size``
            (refused before anything is drawn). The message names the cause and the
            fixes that apply (not the options the call already uses).

    A call that raises changes no state: arguments are checked before anything is drawn,
    and when redraws fail late the generator state (saved before the draw, or its raw
    words put back) and the beta schedule are restored.

    Example:
        >>> import numpy as np
        >>> import replaybank as rb
        >>> buf = rb.ReplayBuffer(capacity=32, num_envs=2, seed=0)
        >>> for t in range(8):
        ...     buf.add(obs=np.full((2, 1), t, np.float32), action=[0, 0], reward=[0.0, 0.0],
        ...             next_obs=np.full((2, 1), t + 1, np.float32), terminated=[t == 3, False],
        ...             truncated=[False, False], hidden=np.full((2, 4), t, np.float32))
        >>> sb = sample_sequences(buf.table, buf.lane_view(), buf.rng, buf.sampler_traits,
        ...                       3, 4, episode_boundary="cross", burn_in=1)
        >>> sb.obs.shape, sb["initial/hidden"].shape, sb.burn_in[0].tolist()
        ((3, 5, 1), (3, 4), [True, False, False, False, False])
    """
    req = WindowRequest.checked("sample_sequences", table, lanes, traits, batch_size,
                                sequence_length, episode_boundary, strict, burn_in,
                                state_fields, max_redraws, sampler_kwargs)
    batch = draw_windows(table, lanes, rng, traits, req)[1]
    if batch is None:  # pragma: no cover - a sampling draw always gives B windows
        raise AssertionError("sample_sequences drew no batch")
    return batch


def sequence_candidates(
    table: StepTable | None,
    lanes: LaneView | None,
    rng: np.random.Generator,
    traits: SamplerTraits,
    batch_size: int,
    sequence_length: int,
    episode_boundary: str = "stop",
    strict: bool = True,
    burn_in: int = 0,
    state_fields: str | Sequence[str] | None = None,
    max_redraws: int = 16,
    **sampler_kwargs: Any,
) -> tuple[BoolArray, SequenceBatch | None]:
    """Candidates for exact rejection sampling of windows across several buffers.

    Draws ``batch_size`` window starts *independently* from the sampler's unconditional
    law (:class:`~replaybank.samplers.base.IndependentDraws`: uniform over the live
    steps, or ``p_i / total``), tells which of them are usable (their window holds the
    steps :func:`sample_sequences` requires) and gathers the windows of the usable ones.
    Keeping the first ``B`` usable candidates of an i.i.d. stream gives exactly the
    sampler's law conditioned on usable starts, the law :func:`sample_sequences`
    draws from; a caller that interleaves several buffers' streams by their masses
    (the sharded service's client) gets that law over all of them.

    Args:
        table, lanes, rng, traits: As :func:`sample_sequences`.
        batch_size: Candidates ``M`` to draw.
        sequence_length, episode_boundary, strict, burn_in, state_fields: As
            :func:`sample_sequences`.
        max_redraws: Accepted (and unused) for the arguments of :func:`sample_sequences`.
        **sampler_kwargs: The sampler's options; a prioritized sampler's ``beta`` is
            accepted and unused (no weights are computed), ``replace`` must be True.

    Returns:
        ``usable`` ``[M]`` bool, and a :class:`~replaybank.batch.SequenceBatch` of the
        usable candidates' windows in draw order (as :func:`sample_sequences`, without
        ``weights`` and ``probabilities``), or None when none is usable.

    Raises:
        ConfigError: Bad arguments, ``replace=False``, or a sampler that cannot draw
            independently.
        EmptyBufferError: Nothing to draw.

    Example:
        >>> import numpy as np
        >>> import replaybank as rb
        >>> buf = rb.ReplayBuffer(capacity=64, seed=0)
        >>> for t in range(12):
        ...     buf.add(obs=np.full(2, t, np.float32), action=0, reward=1.0,
        ...             next_obs=np.full(2, t + 1, np.float32), terminated=t % 3 == 2,
        ...             truncated=False)
        >>> usable, sb = sequence_candidates(buf.table, buf.lane_view(), buf.rng,
        ...                                  buf.sampler_traits, 8, 3)
        >>> usable.shape, sb.obs.shape[0] == int(usable.sum()), bool(np.all(sb.starts % 3 == 0))
        ((8,), True, True)
    """
    req = WindowRequest.checked("sequence_candidates", table, lanes, traits, batch_size,
                                sequence_length, episode_boundary, strict, burn_in,
                                state_fields, max_redraws, sampler_kwargs)
    usable, batch = draw_windows(table, lanes, rng, traits, req)
    if usable is None:  # pragma: no cover - candidates always tell which are usable
        raise AssertionError("sequence_candidates drew no candidates")
    return usable, batch


def servable_windows(
    table: StepTable | None,
    lanes: LaneView | None,
    traits: SamplerTraits,
    sequence_length: int,
    episode_boundary: str = "stop",
    strict: bool = True,
    burn_in: int = 0,
    state_fields: str | Sequence[str] | None = None,
    max_redraws: int = 16,
    **sampler_kwargs: Any,
) -> tuple[int, float]:
    """How many distinct windows ``sample_sequences(B, sequence_length, ...,
    replace=False)`` may draw (the largest ``B`` it serves), and their mass.

    Args:
        table, lanes, traits: As :func:`sample_sequences`.
        sequence_length, episode_boundary, strict, burn_in, state_fields, max_redraws:
            As :func:`sample_sequences` (checked as it checks them).
        **sampler_kwargs: The sampler's options (``replace``, ``beta``), checked.

    Returns:
        ``(n, mass)``: the servable starts (usable, of positive weight in the sampler's
        law: :func:`~replaybank.samplers.windows.servable_starts`) and the sum of their
        weights (their stored priorities, or ``n`` for a uniform sampler); ``(0, 0.0)``
        when the buffer is empty. Nothing is drawn.

    Raises:
        ConfigError: Bad arguments, as :func:`sample_sequences` refuses them, or a
            sampler that cannot draw distinct windows.
        ArgumentError: An unknown keyword, or a ``replace`` that is not a bool.

    Example:
        >>> import numpy as np
        >>> import replaybank as rb
        >>> buf = rb.ReplayBuffer(capacity=64, seed=0)
        >>> for t in range(12):
        ...     buf.add(obs=np.zeros(2), action=0, reward=1.0, next_obs=np.zeros(2),
        ...             terminated=t % 4 == 3, truncated=False)
        >>> servable_windows(buf.table, buf.lane_view(), buf.sampler_traits, 3)
        (6, 6.0)
    """
    try:
        req = WindowRequest.checked("sample_sequences", table, lanes, traits, 1,
                                    sequence_length, episode_boundary, strict, burn_in,
                                    state_fields, max_redraws, sampler_kwargs)
    except EmptyBufferError:  # the arguments were checked before: nothing is stored
        return 0, 0.0
    if table is None or lanes is None:  # pragma: no cover - checked() raised
        return 0, 0.0
    _fits(table, req)
    _cached_state_names(table.spec, req.state_fields)
    keys, weights = servable_starts(traits, lanes, table.link, req)
    return len(keys), float(weights.sum())


def _fits(table: StepTable, req: WindowRequest) -> None:
    """Refuse strict windows longer than a lane."""
    if req.strict and req.width > table.T:
        raise ConfigError(
            f"{req.said}(sequence_length={req.sequence_length}, burn_in={req.burn_in}): a "
            f"window of {req.width} steps never fits in a lane of {table.T} rows; lower them, "
            "use strict=False or a larger capacity"
        )


def draw_windows(table: StepTable | None, lanes: LaneView | None, rng: np.random.Generator,
                 traits: SamplerTraits, req: WindowRequest
                 ) -> tuple[BoolArray | None, SequenceBatch | None]:
    """The one draw of window batches, for :func:`sample_sequences` and
    :func:`sequence_candidates`.

    Args:
        table: The buffer's step table.
        lanes: Its lane bookkeeping.
        rng: The sampling generator.
        traits: The buffer's sampler's traits.
        req: The checked request (:meth:`WindowRequest.checked`).

    Returns:
        ``(usable, batch)``: for candidates, ``usable`` ``[M]`` and the batch of the
        usable ones (None when none is); else ``(None, batch)`` with ``B`` windows of
        usable starts (see :func:`sample_sequences`).

    Raises:
        ConfigError: A strict window never fits in a lane, or a stored field clashes
            with an ``initial/<name>`` state.
        EmptyBufferError: Too few usable windows (:func:`sample_sequences`); the
            generator state and the beta schedule are restored.

    Example:
        >>> import numpy as np
        >>> import replaybank as rb
        >>> buf = rb.ReplayBuffer(capacity=64, seed=0)
        >>> for t in range(12):
        ...     buf.add(obs=np.full(2, t, np.float32), action=0, reward=1.0,
        ...             next_obs=np.full(2, t + 1, np.float32), terminated=False,
        ...             truncated=False)
        >>> req = WindowRequest("sample_sequences", 2, 3, 0, False, True, None, 16, {})
        >>> usable, sb = draw_windows(buf.table, buf.lane_view(), buf.rng,
        ...                           buf.sampler_traits, req)
        >>> usable is None, sb.obs.shape
        (True, (2, 3, 2))
    """
    if table is None or lanes is None:  # pragma: no cover - check_batch_size raised
        raise AssertionError("no storage to sample from")
    width = req.width
    _fits(table, req)
    state_names = _cached_state_names(table.spec, req.state_fields)
    fast = _fast_kernels()
    if req.candidates:  # independent draws from the unconditional law, all kept
        independent = traits.independent
        if independent is None:  # pragma: no cover - WindowRequest.checked raised
            raise AssertionError("no independent draws")
        keys = independent.draw_independent(req.batch_size, lanes, rng)
        ext = extent_kernel()(table.link, lanes.written, lanes.counts, keys, width,
                              req.cross)
        usable = np.asarray(ext >= req.min_len)
        if not usable.any():
            return usable, None
        return usable, _batch(fast, table, keys[usable], ext[usable], req, None,
                              state_names)
    reads = fused_reads(table) if fast is not None else None
    if reads is not None and not req.options and req.max_redraws > 0 \
            and traits.uniform is not None:
        return None, _sample_fused(table, lanes, rng, traits, req, fast, reads, state_names)
    saved = rng.bit_generator.state  # a late failure (no window found) restores it
    try:
        return None, _sample(table, lanes, rng, traits, req, fast, reads, state_names)
    except BaseException:
        rng.bit_generator.state = saved
        raise


def _sample_fused(t: StepTable, lanes: LaneView, rng: np.random.Generator,
                  traits: SamplerTraits, req: WindowRequest, fast: Any, reads: Any,
                  state_names: list[str]) -> SequenceBatch:
    """:func:`draw_windows` of the uniform sampler with the fused kernels: its draw (as
    :func:`~replaybank.samplers.windows.draw_starts`), then the starts checked, planned and
    gathered in one compiled call (:func:`~replaybank.views.sequence.draw_gather`). Where
    the generator can put raw words back (:func:`~replaybank.ops.draws.rewinds`), its
    state is not saved first: a call that fails gives back the words it drew. Only when
    fewer than ``B`` draws are usable (the redraws may find none) is the state before the
    draw saved."""
    bsz, width = req.batch_size, req.width
    saved = None if rewinds(rng) else rng.bit_generator.state
    flat, words = counted_ints(rng, req.available or lanes.size, bsz + bsz // 2 + 4)
    try:
        out, redraw = draw_gather(fast, t, reads, flat, bsz, width, req.cross, req.min_len,
                                  req.burn_in)
        if out is not None:
            if not state_names:  # the usual batch: nothing to add
                return SequenceBatch.own(out)
            return _finish(out, None, state_names)
        assert redraw is not None  # no batch: the starts to redraw
        keys, ext = redraw
        if saved is None:  # from here on a failure restores the state before the draw
            rewind(rng, words)
            saved = rng.bit_generator.state
            rng.bit_generator.random_raw(words)  # the same words again
        # extents read the lane-major boundary bytes (a cache line or two per window)
        extent = partial(fast.window_extent, bounds=reads.boundaries(fast, t))
        res, ext = redraw_short(traits, lanes, t.link, rng, SampleResult(keys), ext, req,
                                extent)
        return _batch(fast, t, res.keys, ext, req, res, state_names)
    except BaseException:
        if saved is None:
            rewind(rng, words)
        else:
            rng.bit_generator.state = saved
        raise


def _sample(table: StepTable, lanes: LaneView, rng: np.random.Generator,
            traits: SamplerTraits, req: WindowRequest, fast: Any, reads: Any,
            state_names: list[str]) -> SequenceBatch:
    """The ``B`` usable starts of :func:`sample_sequences` and their batch (other
    samplers, options or storage than :func:`_sample_fused`'s)."""
    extent = None
    if reads is not None:
        # extents read the lane-major boundary bytes (a cache line or two per window)
        extent = partial(fast.window_extent, bounds=reads.boundaries(fast, table))
    res, ext = draw_starts(traits, lanes, table.link, rng, req, extent, fast)
    return _batch(fast, table, res.keys, ext, req, res, state_names)


def _batch(fast: Any, t: StepTable, keys: IntArray, ext: IntArray, req: WindowRequest,
           res: SampleResult | None, state_names: list[str]) -> SequenceBatch:
    """The windows of the drawn starts ``keys`` (extents ``ext``) as a batch: the fused
    gather where the numba kernels serve this table, else the numpy one."""
    reads = fused_reads(t) if fast is not None else None
    if reads is not None:
        out = gather_fused(fast, t, keys, ext, req.width, req.burn_in,
                           req.min_len >= req.width, None, reads)
    else:
        out = gather_numpy(t, keys, ext, req.width, req.burn_in)
    return _finish(out, res, state_names)


def _finish(out: dict[str, Any], res: SampleResult | None,
            state_names: list[str]) -> SequenceBatch:
    for name in state_names:  # no stored field has these names (_state_names checked)
        out[f"{STATE_PREFIX}{SEP}{name}"] = out[name][:, 0]
    if res is not None:
        if res.weights is not None:
            out["weights"] = res.weights.astype(np.float32)
        if res.probabilities is not None:
            out["probabilities"] = res.probabilities
    return SequenceBatch.own(out)


def check_eta(eta: Any) -> float:
    """``update_sequence_priorities``'s ``eta`` (the weight of the max), checked.

    Raises:
        ConfigError: ``eta`` is not a number in ``[0, 1]`` (a bool, a string, NaN).

    Example:
        >>> check_eta(1)
        1.0
    """
    if isinstance(eta, bool) or not isinstance(eta, (int, float, np.integer, np.floating)) \
            or not 0.0 <= float(eta) <= 1.0:
        raise ConfigError(f"update_sequence_priorities(eta={eta!r}): must be a float in "
                          "[0, 1] (the weight of the max; R2D2 uses 0.9)")
    return float(eta)


class WindowUpdates(NamedTuple):
    """The arguments of an ``update_sequence_priorities`` call, checked
    (:func:`checked_window_updates`): the rows with a counted step and their R2D2
    priorities. ``K`` rows of the call's ``B`` remain (rows without a counted step
    change nothing and are left out)."""

    #: ``[K]`` int64 item keys (``batch.starts``), all >= 0.
    keys: IntArray
    #: ``[K]`` float64 priorities ``eta * max|td| + (1 - eta) * mean|td|``, finite, in
    #: ``[0, limit]``.
    priorities: npt.NDArray[np.float64]
    #: ``[K, L]`` float64 TD errors (finite where counted).
    td_errors: npt.NDArray[np.float64]
    #: ``[K, L]`` bool steps that count (all True without ``mask``).
    mask: BoolArray


def checked_window_updates(starts: Any, td_errors: Any, eta: Any, mask: Any, limit: float,
                           widths: Collection[int] = ()) -> WindowUpdates:
    """The checks of :func:`update_sequence_priorities`, for a caller that knows the
    sampler's limit but holds no sampler (the sharded service's client checks a call
    before it sends any of it, with exactly one buffer's rules and messages).

    Args:
        starts: ``batch.starts``: numpy, a list or a torch tensor on any device; any
            shape (``[B]``, ``[B, 1]``: flattened).
        td_errors: ``[B, L]`` TD errors of the window steps (a torch tensor may require
            grad).
        eta: Weight of the max in ``[0, 1]``.
        mask: ``[B, L]`` steps that count (bools, or numbers all 0 or 1), or None (all).
        limit: The largest raw priority accepted (``inf``: no bound).
        widths: The window lengths (burn-in included) drawn: without ``mask``, ``L``
            must be one of them (empty: not checked).

    Returns:
        The rows with a counted step, their keys and priorities
        (:class:`WindowUpdates`).

    Raises:
        ConfigError: ``eta`` is not a number in ``[0, 1]``, or a start is negative.
        ShapeError: ``starts`` or ``td_errors`` or ``mask`` has rows of different
            lengths, ``td_errors`` is not ``[B, L]``, ``mask`` not of its shape, or (no
            ``mask``) ``L`` is none of ``widths``.
        DtypeError: ``starts`` are not integers, a TD error is not a real number (a
            string, None, complex), a counted one is NaN or infinite, a window's
            priority exceeds ``limit``, or ``mask`` holds other than bools or 0/1.

    Example:
        >>> up = checked_window_updates(np.array([[4], [9]]), [[1.0, -3.0], [0.0, 0.0]],
        ...                             0.5, [[True, True], [False, False]], 10.0)
        >>> up.keys.tolist(), up.priorities.tolist(), up.td_errors.shape
        ([4], [2.5], (1, 2))
    """
    call = "update_sequence_priorities"
    weight = check_eta(eta)
    # tensors on any device (grad or not): one transfer at most
    starts_h, td_h, mask_h = to_host(starts, td_errors, mask)
    keys = ring.as_int_array(starts_h, "starts", call)  # [B]
    if len(keys) and keys.min() < 0:
        raise ConfigError(f"{call}(starts=...): {keys[keys < 0][:4].tolist()} are negative; "
                          "item keys are >= 0: pass batch.starts as sampled")
    label = f"{call}(td_errors={describe(td_errors)})"
    rows = f"[B={len(keys)}, L] (one row of TD errors per start, one per window step)"
    td = real_floats(rows_array(td_h, label, rows, "pad the short rows (any number) and leave "
                                "the padding out with mask= (e.g. mask=batch.mask)"), label,
                     "pass the TD errors as numbers, e.g. td.abs() or np.abs(td)")
    if td.ndim != 2 or td.shape[0] != len(keys):
        raise ShapeError(f"{label}: expected {rows}")
    if mask is None and widths and td.shape[1] not in widths:
        raise ShapeError(
            f"{call}: td_errors has shape {td.shape} but the windows sampled have "
            f"{sorted(widths)} steps (burn-in included); pass one TD error per window step "
            "([B, burn_in + sequence_length]), or mask="
        )
    m = np.ones(td.shape, dtype=bool) if mask is None else _mask(mask_h, mask, td.shape)
    # [B]; NaN where no step counts, NaN or inf where a counted TD error is (the mean
    # term carries it whatever eta: 0 * inf is NaN)
    prio = _r2d2_kernel()(td, m, weight)
    keep = m.any(axis=1)  # [B]
    if not keep.all():
        keys, td, m, prio = keys[keep], td[keep], m[keep], prio[keep]
    if len(prio):
        hi = float(prio.max())  # NaN when any is
        if not hi <= limit or hi == math.inf:
            raise _bad_windows(td, m, np.flatnonzero(keep), hi, limit)
    return WindowUpdates(keys, prio, td, m)


def _bad_windows(td: npt.NDArray[np.float64], m: BoolArray, rows: IntArray, hi: float,
                 limit: float) -> DtypeError:
    """The error of :func:`checked_window_updates` for kept rows ``td`` ``[K, L]``
    (``rows``: their places in the call) whose priorities are not all in
    ``[0, limit]``: a counted NaN or inf, else a priority above ``limit``."""
    bad = (~np.isfinite(td) & m).any(axis=1)  # [K]
    if bad.any():
        return DtypeError(
            f"update_sequence_priorities(td_errors=...): counted TD errors contain NaN or "
            f"inf (rows {rows[bad][:4].tolist()}); check the loss or mask those steps"
        )
    return DtypeError(
        f"update_sequence_priorities(td_errors=...): window priorities up to {hi:.6g} "
        f"(eta * max|td| + (1 - eta) * mean|td|) exceed {limit:.6g}, the largest "
        "priority this sampler stores without its sum tree overflowing ((p + eps) ** "
        "alpha must stay <= 1e300 / capacity); rescale the TD errors (e.g. divide by "
        "their max) or lower alpha"
    )


def update_sequence_priorities(
    traits: SamplerTraits,
    lanes: LaneView | None,
    starts: Any,
    td_errors: Any,
    eta: float = 0.9,
    mask: Any = None,
    widths: Collection[int] = (),
) -> int:
    """Set R2D2 priorities ``eta * max|td| + (1 - eta) * mean|td|`` of sampled windows.

    The priority is computed without overflow for any finite TD errors (a row whose sum
    exceeds the float64 range is averaged scaled by its max), and must stay within the
    sampler's ``priority_limit``. The arguments are checked by
    :func:`checked_window_updates` (the sharded service's client runs the same checks).

    Args:
        traits: The traits of the sampler the windows were drawn by (a prioritized one).
        lanes: The buffer's lane bookkeeping.
        starts: ``batch.starts``, ``[B]`` item keys (``[B, 1]`` is flattened).
        td_errors: ``[B, L]`` TD errors of the window steps.
        eta: Weight of the max in ``[0, 1]`` (0.9 in R2D2).
        mask: ``[B, L]`` steps that count (e.g. ``batch.mask``: padding and burn-in
            excluded); default all. Rows without a counted step are left unchanged.
        widths: The window lengths (burn-in included) sampled from this buffer: without
            ``mask``, ``L`` must be one of them (empty: not checked).

    Returns:
        Number of priorities applied (stale and empty rows excluded).

    Raises:
        ConfigError: ``eta`` outside ``[0, 1]``, a negative start, or the sampler has no
            priorities.
        ShapeError: Shapes differ, ``starts``, ``td_errors`` or ``mask`` has rows of
            different lengths, (no ``mask``) ``L`` is none of ``widths``, or nothing was
            added to the buffer yet (no window was sampled: ``lanes`` is None).
        DtypeError: ``starts`` are not integers, a TD error is not a real number (a
            string, None, complex), a counted one is NaN or infinite, a window's
            priority exceeds the sampler's ``priority_limit``, or ``mask`` holds other
            than bools or 0/1.

    Example:
        >>> import numpy as np
        >>> import replaybank as rb
        >>> from replaybank.samplers.prioritized import PrioritizedSampler
        >>> buf = rb.ReplayBuffer(capacity=16, sampler=PrioritizedSampler(), seed=0)
        >>> for t in range(10):
        ...     buf.add(obs=np.zeros(2, np.float32), action=0, reward=0.0,
        ...             next_obs=np.zeros(2, np.float32), terminated=False, truncated=False)
        >>> sb = buf.sample_sequences(2, 3)
        >>> update_sequence_priorities(buf.sampler_traits, buf.lane_view(), sb.starts,
        ...                            np.ones((2, 3)), mask=sb.mask)
        2
    """
    check_eta(eta)
    if traits.priority is None:
        raise ConfigError(
            f"update_sequence_priorities: this buffer's sampler ({type(traits.sampler).__name__}) "
            "has no priorities; build it with sampler=PrioritizedSampler(...)"
        )
    limit = math.inf if traits.bounded is None else traits.bounded.priority_limit
    up = checked_window_updates(starts, td_errors, eta, mask, limit, widths)
    if not len(up.keys):  # nothing to apply (the sharded client's order too)
        return 0
    stored = stored_lanes(lanes, "update_sequence_priorities", "starts")
    return update_priorities(traits, stored, up.keys, up.priorities)


def _mask(host: Any, mask: Any, shape: tuple[int, ...]) -> BoolArray:
    """:func:`update_sequence_priorities`'s ``mask`` (``host``: on the host) as bool
    ``shape``: bools, or numbers that are all 0 or 1 (a float mask of a loss)."""
    label = f"update_sequence_priorities(mask={describe(mask)})"
    fix = "pass bools (or 0/1 numbers) shaped like td_errors, e.g. mask=batch.mask"
    m = rows_array(host, label, f"the shape of td_errors {shape}", fix)
    if not isinstance(m, np.ndarray):  # numpy could not convert it
        raise DtypeError(f"{label}: not an array of numbers; {fix}")
    if m.shape != shape:
        raise ShapeError(f"{label}: expected the shape of td_errors {shape}; {fix}")
    out: BoolArray
    if m.dtype.kind == "b":
        out = m.astype(np.bool_, copy=False)
        return out
    if m.dtype.kind in "iuf" and bool(np.all((m == 0) | (m == 1))):
        out = m != 0
        return out
    found = "values other than 0 and 1" if m.dtype.kind in "iuf" else f"dtype {m.dtype}"
    raise DtypeError(f"{label}: found {found}; {fix}")
