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
constant, which max-normalised weights cancel). When valid starts are rare, after
``max_redraws`` rounds a uniform sampler draws the rest directly from the exact set of
valid starts (same distribution); other samplers keep redrawing and raise if they fail.
I.i.d. samplers (uniform, lane split) draw ``B // 2 + 4`` spare starts in the first round
and keep the first ``B`` valid ones in draw order, which leaves the law unchanged and
usually saves the redraw rounds. A prioritized sampler's beta schedule advances once per
call: beta is resolved once and passed to every redraw round.

Speed: with numba and numpy storage (``KERNEL = "auto"``), the uniform sampler's draw is
mapped to starts, checked and selected, and the slots, flags and side patches of the kept
starts computed, in one compiled call (:func:`~replaybank.ops.windows_numba.draw_plan`;
other samplers and redraw rounds use :func:`~replaybank.ops.windows_numba.draw_windows`
and :func:`~replaybank.ops.windows_numba.sequence_plan`); the data is then gathered with
``ndarray.take``. The batches are identical to the numpy path's (``KERNEL = "numpy"``,
used for other storages too).

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=64, seed=0)
    >>> for t in range(20):
    ...     buf.add(obs=np.full(2, t, np.float32), action=0, reward=1.0,
    ...             next_obs=np.full(2, t + 1, np.float32), terminated=t == 9, truncated=False)
    >>> sb = sample_sequences(buf, 4, 5)
    >>> sb.obs.shape, sb.mask.shape, bool(sb.mask.all())
    ((4, 5, 2), (4, 5), True)
    >>> bool(np.all(sb.next_obs[..., 0] == sb.obs[..., 0] + 1))
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache, partial
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.batch import SequenceBatch
from replaybank.errors import ConfigError, DtypeError, EmptyBufferError, ShapeError, describe
from replaybank.ops import ring, windows
from replaybank.ops.draws import uniform_ints
from replaybank.samplers.base import SampleResult
from replaybank.samplers.draw import replace_rows
from replaybank.samplers.uniform import check_batch_size
from replaybank.spec import SEP
from replaybank.views.sequence import fused_reads, gather_fused, gather_numpy

__all__ = ["STATE_PREFIX", "sample_sequences", "update_sequence_priorities"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Batch name prefix of the stored recurrent state at each window's first step.
STATE_PREFIX = "initial"


def _check_int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ConfigError(f"sample_sequences({name}={value!r}): must be an int >= {lo}")
    return int(value)


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
def _extent_kernel() -> Any:
    """The window-extent kernel (numba when it imports, else numpy), loaded once."""
    return windows.extent_kernel("auto")[0]


@cache
def _r2d2_kernel() -> Any:
    """The R2D2 priority kernel (numba when it imports, else numpy), loaded once."""
    return windows.r2d2_kernel("auto")[0]


#: Who computes starts, slots and flags: ``"auto"`` (fused numba kernels when numba
#: imports and the storage is numpy) or ``"numpy"`` (the vectorised numpy path).
KERNEL = "auto"
@cache
def _numba_windows() -> Any:
    """The numba module of the fused path, or None when numba is missing (loaded once)."""
    try:
        from replaybank.ops import windows_numba
    except ImportError:  # pragma: no cover - numba is optional
        return None
    return windows_numba


def _fast_kernels() -> Any:
    """The numba module of the fused path, or None (numba missing, or ``KERNEL="numpy"``)."""
    return _numba_windows() if KERNEL == "auto" else None


def _draw_starts(buf: Any, batch_size: int, width: int, cross: bool, min_len: int,
                 max_redraws: int, kwargs: dict[str, Any], size: int,
                 extent: Any = None) -> tuple[SampleResult, IntArray]:
    sampler = buf.sampler_traits.scheduled
    if sampler is None:
        return _draw_rounds(buf, batch_size, width, cross, min_len, max_redraws, kwargs, size,
                            extent)
    # a scheduled sampler (PER): resolve beta once, so that redraw rounds neither advance
    # the schedule nor change beta inside one batch; the call counts once
    calls = sampler.calls
    if kwargs.get("beta") is None:
        kwargs = {**kwargs, "beta": sampler.current_beta}
    try:
        out = _draw_rounds(buf, batch_size, width, cross, min_len, max_redraws, kwargs, size,
                           extent)
    except BaseException:
        sampler.calls = calls
        raise
    sampler.calls = calls + 1
    return out


def _draw_rounds(buf: Any, batch_size: int, width: int, cross: bool, min_len: int,
                 max_redraws: int, kwargs: dict[str, Any], size: int,
                 extent: Any = None) -> tuple[SampleResult, IntArray]:
    t = buf.table
    lv = buf.lane_view()
    rng = buf.rng
    if extent is None:
        extent = _extent_kernel()
    # i.i.d. samplers draw a few spare starts up front and keep the first valid ones (in
    # draw order, so the accepted starts are still i.i.d. from the conditional law)
    traits = buf.sampler_traits
    iid = traits.iid and kwargs.get("replace", True) and max_redraws > 0
    m = batch_size + batch_size // 2 + 4 if iid else batch_size
    fast = _fast_kernels() if iid and traits.uniform is not None else None
    if fast is not None:
        # the uniform sampler's own draw (same generator calls), then key mapping,
        # extents and selection in one compiled pass
        flat = uniform_ints(rng, size, m)  # size == len(buf)
        keys, ext, n_valid = fast.draw_windows(t.link, t.written, t.counts, flat, width,
                                               cross, min_len, batch_size)
        res = SampleResult(keys)
        if n_valid >= batch_size:
            return res, ext
    else:
        res = buf.sampler.sample(m, lv, rng, **kwargs)
        ext = extent(t.link, t.written, t.counts, res.keys, width, cross)  # [m]
        if m > batch_size:
            good = np.flatnonzero(ext >= min_len)
            sel = good[:batch_size] if len(good) >= batch_size else \
                np.argsort(ext < min_len, kind="stable")[:batch_size]  # valid ones first
            res, ext = SampleResult(res.keys[sel]), ext[sel]
    return _redraw_rounds(buf, res, ext, batch_size, width, cross, min_len, max_redraws,
                          kwargs, extent)


def _redraw_rounds(buf: Any, res: SampleResult, ext: IntArray, batch_size: int, width: int,
                   cross: bool, min_len: int, max_redraws: int, kwargs: dict[str, Any],
                   extent: Any = None) -> tuple[SampleResult, IntArray]:
    """Redraw the starts of ``res`` whose extent is below ``min_len`` (``ext`` is updated
    in place), then fall back to the exact set of valid starts (uniform sampler).
    ``extent``: the window-extent function (default: the kernel of ``KERNEL``)."""
    t = buf.table
    lv = buf.lane_view()
    rng = buf.rng
    if extent is None:
        extent = _extent_kernel()
    exact = buf.sampler_traits.uniform is not None
    limit = max_redraws if exact else max(max_redraws, 1024)
    for _ in range(limit):
        bad = np.flatnonzero(ext < min_len)
        if len(bad) == 0:
            return res, ext
        more = buf.sampler.sample(len(bad), lv, rng, **kwargs)
        res = replace_rows(res, bad, more)
        ext[bad] = extent(t.link, t.written, t.counts, more.keys, width, cross)
    bad = np.flatnonzero(ext < min_len)
    if len(bad) == 0:
        return res, ext
    valid = windows.valid_starts(t.link, t.written, t.counts, width, cross, min_len)
    if len(valid) == 0 or not exact:
        mode = "cross" if cross else "stop"
        raise EmptyBufferError(
            f"sample_sequences(batch_size={batch_size}, width={width}, "
            f"episode_boundary={mode!r}): the buffer holds {len(valid)} windows of at least "
            f"{min_len} steps; add more data, shorten sequence_length/burn_in, or use "
            "strict=False (padded windows) or episode_boundary='cross'"
        )
    keys = res.keys.copy()
    keys[bad] = valid[uniform_ints(rng, len(valid), len(bad))]
    ext[bad] = extent(t.link, t.written, t.counts, keys[bad], width, cross)
    return SampleResult(keys, res.probabilities, res.weights), ext


def sample_sequences(
    buf: Any,
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
        buf: A :class:`~replaybank.buffers.replay.ReplayBuffer` (any sampler).
        batch_size: Windows ``B``.
        sequence_length: Loss steps ``L`` per window.
        episode_boundary: ``"stop"`` or ``"cross"`` (see the module docs).
        strict: Only full windows (True) or zero-padded shorter ones (False).
        burn_in: Steps ``k`` prepended to each window, flagged ``burn_in`` and excluded
            from ``mask``; a window is ``W = k + L`` steps long.
        state_fields: Stored recurrent-state fields to return at each window's first
            step as ``initial/<name>`` ``[B, *shape]``; default: the field ``hidden``
            (and ``hidden/...``) when stored.
        max_redraws: Rounds of redrawing invalid starts before the exact fallback.
        **sampler_kwargs: Passed to the sampler (e.g. ``beta``).

    Returns:
        A :class:`~replaybank.batch.SequenceBatch`: every stored field and ``next_obs``
        ``[B, W, *shape]`` (zero where padded); ``mask`` (valid loss steps),
        ``is_first`` (an episode starts here, or the table no longer holds the previous
        step), ``is_last`` (the episode ended here: terminated, truncated or a
        discontinuity), ``is_terminal`` (terminated), ``burn_in`` ``[B, W]`` bool;
        ``starts`` (item keys of the window starts, ``[B]``, for
        :func:`update_sequence_priorities`), ``initial/<field>`` and, from prioritized
        samplers, ``weights`` and ``probabilities`` ``[B]``.

    Raises:
        ConfigError: Bad arguments (nothing is drawn).
        EmptyBufferError: The buffer holds no window of the required length.

    Example:
        >>> import numpy as np
        >>> import replaybank as rb
        >>> buf = rb.ReplayBuffer(capacity=32, num_envs=2, seed=0)
        >>> for t in range(8):
        ...     buf.add(obs=np.full((2, 1), t, np.float32), action=[0, 0], reward=[0.0, 0.0],
        ...             next_obs=np.full((2, 1), t + 1, np.float32), terminated=[t == 3, False],
        ...             truncated=[False, False], hidden=np.full((2, 4), t, np.float32))
        >>> sb = sample_sequences(buf, 3, 4, episode_boundary="cross", burn_in=1)
        >>> sb.obs.shape, sb["initial/hidden"].shape, sb.burn_in[0].tolist()
        ((3, 5, 1), (3, 4), [True, False, False, False, False])
    """
    if not (type(batch_size) is int and type(sequence_length) is int
            and type(burn_in) is int and type(max_redraws) is int
            and batch_size >= 1 and sequence_length >= 1 and burn_in >= 0
            and max_redraws >= 0):
        batch_size = _check_int("batch_size", batch_size, 1)
        sequence_length = _check_int("sequence_length", sequence_length, 1)
        burn_in = _check_int("burn_in", burn_in, 0)
        max_redraws = _check_int("max_redraws", max_redraws, 0)
    if episode_boundary == "stop":
        cross = False
    elif episode_boundary == "cross":
        cross = True
    else:
        raise ConfigError(
            f"sample_sequences(episode_boundary={episode_boundary!r}): use 'stop' (windows "
            "end at episode ends, R2D2) or 'cross' (windows run over them, DreamerV3)"
        )
    if strict is not True and strict is not False and not isinstance(strict, np.bool_):
        raise ConfigError(f"sample_sequences(strict={strict!r}): must be a bool")
    width = burn_in + sequence_length
    size = len(buf)
    check_batch_size(batch_size, size, True)
    t = buf.table
    if strict and width > t.T:
        raise ConfigError(
            f"sample_sequences(sequence_length={sequence_length}, burn_in={burn_in}): a "
            f"window of {width} steps never fits in a lane of {t.T} rows; lower them, use "
            "strict=False or a larger capacity"
        )
    state_names = _cached_state_names(t.spec, state_fields)
    min_len = width if strict else burn_in + 1
    fast = _fast_kernels()
    reads = fused_reads(t) if fast is not None else None
    if reads is not None:
        bounds = reads.boundaries(fast, t)
        # extents read the lane-major boundary bytes (a cache line or two per window)
        extent = partial(fast.window_extent, bounds=bounds)
        if not sampler_kwargs and max_redraws > 0 and buf.sampler_traits.uniform is not None:
            # the uniform sampler's draw (as _draw_rounds), checked and planned in one call
            flat = uniform_ints(buf.rng, size, batch_size + batch_size // 2 + 4)
            keys, ext, _, plan = fast.draw_plan(t.link, t.written, t.counts, flat, width,
                                                cross, min_len, batch_size, reads.term,
                                                reads.trunc, burn_in, bounds)
            if plan is not None:
                out = gather_fused(fast, t, keys, ext, width, burn_in, min_len >= width, plan,
                                   reads)
                return _finish(out, None, state_names)
            res, ext = _redraw_rounds(buf, SampleResult(keys), ext, batch_size, width,
                                      cross, min_len, max_redraws, {}, extent)
        else:
            res, ext = _draw_starts(buf, batch_size, width, cross, min_len, max_redraws,
                                    sampler_kwargs, size, extent)
    else:
        res, ext = _draw_starts(buf, batch_size, width, cross, min_len, max_redraws,
                                sampler_kwargs, size)
    t = buf.table
    reads = fused_reads(t) if fast is not None else None
    if reads is not None:
        out = gather_fused(fast, t, res.keys, ext, width, burn_in, min_len >= width, None,
                           reads)
    else:
        out = gather_numpy(t, res.keys, ext, width, burn_in)
    return _finish(out, res, state_names)


def _finish(out: dict[str, Any], res: SampleResult | None,
            state_names: list[str]) -> SequenceBatch:
    for name in state_names:
        key = f"{STATE_PREFIX}{SEP}{name}"
        if key in out:
            raise ConfigError(f"sample_sequences: stored field {key!r} clashes with the "
                              f"initial state of {name!r}; rename the field")
        out[key] = out[name][:, 0]
    if res is not None:
        if res.weights is not None:
            out["weights"] = res.weights.astype(np.float32)
        if res.probabilities is not None:
            out["probabilities"] = res.probabilities
    return SequenceBatch.own(out)


def update_sequence_priorities(
    buf: Any,
    starts: Any,
    td_errors: Any,
    eta: float = 0.9,
    mask: Any = None,
) -> int:
    """Set R2D2 priorities ``eta * max|td| + (1 - eta) * mean|td|`` of sampled windows.

    Args:
        buf: The buffer the windows were sampled from (prioritized sampler).
        starts: ``batch.starts``, ``[B]`` item keys.
        td_errors: ``[B, L]`` TD errors of the window steps.
        eta: Weight of the max in ``[0, 1]`` (0.9 in R2D2).
        mask: ``[B, L]`` steps that count (e.g. ``batch.mask``: padding and burn-in
            excluded); default all. Rows without a counted step are left unchanged.

    Returns:
        Number of priorities applied (stale and empty rows excluded).

    Raises:
        ConfigError: ``eta`` outside ``[0, 1]``, or the sampler has no priorities.
        ShapeError: Shapes differ.
        DtypeError: A counted TD error is NaN or infinite.

    Example:
        >>> import numpy as np
        >>> import replaybank as rb
        >>> from replaybank.samplers.prioritized import PrioritizedSampler
        >>> buf = rb.ReplayBuffer(capacity=16, sampler=PrioritizedSampler(), seed=0)
        >>> for t in range(10):
        ...     buf.add(obs=np.zeros(2, np.float32), action=0, reward=0.0,
        ...             next_obs=np.zeros(2, np.float32), terminated=False, truncated=False)
        >>> sb = buf.sample_sequences(2, 3)
        >>> update_sequence_priorities(buf, sb.starts, np.ones((2, 3)), mask=sb.mask)
        2
    """
    if isinstance(eta, bool) or not isinstance(eta, (int, float, np.floating)) \
            or not 0.0 <= float(eta) <= 1.0:
        raise ConfigError(f"update_sequence_priorities(eta={eta!r}): must be a float in [0, 1]")
    if buf.sampler_traits.priority is None:
        raise ConfigError(
            f"update_sequence_priorities: this buffer's sampler ({type(buf.sampler).__name__}) "
            "has no priorities; build it with sampler=PrioritizedSampler(...)"
        )
    keys = ring.as_int_array(starts, "starts")
    td = np.asarray(td_errors.detach().cpu().numpy() if hasattr(td_errors, "detach")
                    else td_errors, dtype=np.float64)
    if td.ndim != 2 or td.shape[0] != len(keys):
        raise ShapeError(
            f"update_sequence_priorities(td_errors={describe(td_errors)}): expected "
            f"[B={len(keys)}, L] (one row per start)"
        )
    if mask is None:
        m = np.ones(td.shape, dtype=bool)
    else:
        m = np.asarray(mask.detach().cpu().numpy() if hasattr(mask, "detach") else mask)
        if m.shape != td.shape:
            raise ShapeError(
                f"update_sequence_priorities(mask={describe(mask)}): expected the shape of "
                f"td_errors {td.shape}"
            )
        m = m.astype(bool)
    if not np.all(np.isfinite(td[m])):
        raise DtypeError(
            "update_sequence_priorities(td_errors=...): counted TD errors contain NaN or "
            "inf; check the loss or mask those steps"
        )
    prio = _r2d2_kernel()(td, m, float(eta))
    keep = m.any(axis=1)
    if not keep.any():
        return 0
    return int(buf.update_priorities(keys[keep], prio[keep]))
