"""Window starts for sequence sampling: the sampler draws starts, the short ones are redrawn.

A start is usable when the window from it holds at least ``min_len`` steps: it stays in its
lane, below the write head and (``cross=False``) inside one episode (its *extent*,
:mod:`replaybank.ops.windows`). The starts therefore follow the sampler's distribution
*conditioned on usable starts*. A uniform sampler falls back to the exact set of usable
starts after ``max_redraws`` rounds (the same distribution); other samplers keep
redrawing (at least 1024 rounds) and raise when they fail. I.i.d. samplers draw
``B // 2 + 4`` spare starts in the first round and keep the first ``B`` usable ones in
draw order, which leaves the law unchanged. A scheduled sampler (PER's beta) resolves
beta once, so redraw rounds neither advance its schedule nor change beta inside one
batch; the call counts once.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=64, seed=0)
    >>> for t in range(20):
    ...     buf.add(obs=np.full(2, t, np.float32), action=0, reward=1.0,
    ...             next_obs=np.full(2, t + 1, np.float32), terminated=t == 9, truncated=False)
    >>> res, ext = draw_starts(buf.sampler_traits, buf.lane_view(), buf.table.link, buf.rng,
    ...                        batch_size=4, width=5, cross=False, min_len=5, max_redraws=16,
    ...                        kwargs={}, size=len(buf))
    >>> res.keys.shape, bool(np.all(ext >= 5))
    ((4,), True)
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import EmptyBufferError
from replaybank.ops import windows
from replaybank.ops.draws import uniform_ints
from replaybank.samplers.base import LaneView, SampleResult, SamplerTraits
from replaybank.samplers.draw import replace_rows

__all__ = ["draw_starts", "extent_kernel", "redraw_short"]

IntArray = npt.NDArray[np.int64]


@cache
def extent_kernel() -> Any:
    """The window-extent kernel (numba when it imports, else numpy), loaded once."""
    return windows.kernel(windows.window_extent)[0]


def draw_starts(traits: SamplerTraits, lanes: LaneView, link: npt.NDArray[np.int32],
                rng: np.random.Generator, batch_size: int, width: int, cross: bool,
                min_len: int, max_redraws: int, kwargs: dict[str, Any], size: int,
                extent: Any = None, fast: Any = None) -> tuple[SampleResult, IntArray]:
    """``batch_size`` window starts whose extent is at least ``min_len`` and their extents
    ``[B]`` (``fast``: the numba window module, for the uniform sampler's fused draw)."""
    sampler = traits.scheduled
    if sampler is None:
        return _draw_rounds(traits, lanes, link, rng, batch_size, width, cross, min_len,
                            max_redraws, kwargs, size, extent, fast)
    # a scheduled sampler (PER): resolve beta once, so that redraw rounds neither advance
    # the schedule nor change beta inside one batch; the call counts once
    calls = sampler.calls
    if kwargs.get("beta") is None:
        kwargs = {**kwargs, "beta": sampler.current_beta}
    try:
        out = _draw_rounds(traits, lanes, link, rng, batch_size, width, cross, min_len,
                           max_redraws, kwargs, size, extent, fast)
    except BaseException:
        sampler.calls = calls
        raise
    sampler.calls = calls + 1
    return out


def _draw_rounds(traits: SamplerTraits, lanes: LaneView, link: npt.NDArray[np.int32],
                 rng: np.random.Generator, batch_size: int, width: int, cross: bool,
                 min_len: int, max_redraws: int, kwargs: dict[str, Any], size: int,
                 extent: Any = None, fast: Any = None) -> tuple[SampleResult, IntArray]:
    if extent is None:
        extent = extent_kernel()
    # i.i.d. samplers draw a few spare starts up front and keep the first valid ones (in
    # draw order, so the accepted starts are still i.i.d. from the conditional law)
    iid = traits.iid and kwargs.get("replace", True) and max_redraws > 0
    m = batch_size + batch_size // 2 + 4 if iid else batch_size
    fast = fast if iid and traits.uniform is not None else None
    if fast is not None:
        # the uniform sampler's own draw (same generator calls), then key mapping,
        # extents and selection in one compiled pass
        flat = uniform_ints(rng, size, m)  # size: the live steps
        keys, ext, n_valid = fast.draw_windows(link, lanes.written, lanes.counts, flat, width,
                                               cross, min_len, batch_size)
        res = SampleResult(keys)
        if n_valid >= batch_size:
            return res, ext
    else:
        res = traits.sampler.sample(m, lanes, rng, **kwargs)
        ext = extent(link, lanes.written, lanes.counts, res.keys, width, cross)  # [m]
        if m > batch_size:
            good = np.flatnonzero(ext >= min_len)
            sel = good[:batch_size] if len(good) >= batch_size else \
                np.argsort(ext < min_len, kind="stable")[:batch_size]  # valid ones first
            res, ext = SampleResult(res.keys[sel]), ext[sel]
    return redraw_short(traits, lanes, link, rng, res, ext, batch_size, width, cross, min_len,
                        max_redraws, kwargs, extent)


def redraw_short(traits: SamplerTraits, lanes: LaneView, link: npt.NDArray[np.int32],
                 rng: np.random.Generator, res: SampleResult, ext: IntArray, batch_size: int,
                 width: int, cross: bool, min_len: int, max_redraws: int,
                 kwargs: dict[str, Any], extent: Any = None) -> tuple[SampleResult, IntArray]:
    """Redraw the starts of ``res`` whose extent is below ``min_len`` (``ext`` is updated
    in place), then fall back to the exact set of valid starts (uniform sampler).
    ``extent``: the window-extent function (default: the kernel of ``KERNEL``)."""
    if extent is None:
        extent = extent_kernel()
    exact = traits.uniform is not None
    limit = max_redraws if exact else max(max_redraws, 1024)
    for _ in range(limit):
        bad = np.flatnonzero(ext < min_len)
        if len(bad) == 0:
            return res, ext
        more = traits.sampler.sample(len(bad), lanes, rng, **kwargs)
        res = replace_rows(res, bad, more)
        ext[bad] = extent(link, lanes.written, lanes.counts, more.keys, width, cross)
    bad = np.flatnonzero(ext < min_len)
    if len(bad) == 0:
        return res, ext
    valid = windows.valid_starts(link, lanes.written, lanes.counts, width, cross, min_len)
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
    ext[bad] = extent(link, lanes.written, lanes.counts, keys[bad], width, cross)
    return SampleResult(keys, res.probabilities, res.weights), ext
