"""numba twins of :func:`replaybank.ops.windows.window_extent` and
:func:`~replaybank.ops.windows.window_plan` (the numpy functions are their oracles), and
the fused kernels of the sequence fast path: :func:`draw_windows` (uniform draws ->
checked window starts), :func:`sequence_plan` (slots, flags and side patches of sampled
windows), :func:`draw_plan` (both in one call; :func:`draw_plan_into` writes into the
caller's arrays, :func:`draw_take` gathers the windows' rows too) and
:func:`sync_boundaries` (the
lane-major episode-boundary bytes the scans read); their oracles are numpy
compositions (see each docstring and ``tests/test_sequences.py``). The frame-stack
kernels are in :mod:`replaybank.ops.stack_numba`.

Importing this module raises ImportError when numba is missing;
:func:`replaybank.ops.windows.kernel` then falls back to numpy. Compiled once per
machine (``cache=True``).

Example:
    >>> import numpy as np
    >>> link = np.zeros((4, 1), np.int32); link[1, 0] = 1
    >>> window_extent(link, np.array([4]), np.array([4]), np.array([0, 2]), 3, False).tolist()
    [2, 2]
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import numpy.typing as npt

from replaybank.ops.windows import FLAG_NAMES

__all__ = ["draw_plan", "draw_plan_into", "draw_take", "draw_windows", "r2d2_priority",
           "sequence_plan", "sync_boundaries",
           "window_extent", "window_plan"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@numba.njit(cache=True, nogil=True)
def _extent(lk, written, counts, keys, width, cross, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    # lk [lanes, T]: nonzero where a step's next observation is kept aside (as _draw)
    lanes, T = lk.shape  # noqa: N806
    for b in range(keys.shape[0]):
        seq = keys[b] // lanes
        lane = keys[b] % lanes
        hi = written[lane]
        if keys[b] < 0 or seq < hi - counts[lane] or seq >= hi:
            out[b] = 0
            continue
        n = 1
        while n < width and seq + n < hi:
            if not cross and lk[lane, (seq + n - 1) % T] != 0:
                break
            n += 1
        out[b] = n


def window_extent(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                  keys: IntArray, width: int, cross: bool,
                  bounds: npt.NDArray[np.uint8] | None = None) -> IntArray:
    """Same contract as :func:`replaybank.ops.windows.window_extent`; ``bounds`` as in
    :func:`draw_plan` (the lane-major ``link != 0`` bytes, read instead of ``link``).

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[1, 0] = 1
        >>> bounds = np.ascontiguousarray((link != 0).T.astype(np.uint8))
        >>> window_extent(link, np.array([4]), np.array([4]), np.array([0]), 3, False,
        ...               bounds).tolist()
        [2]
    """
    keys = np.asarray(keys, dtype=np.int64)
    out = np.empty(keys.shape[0], dtype=np.int64)
    _extent(link.T if bounds is None else bounds, written, counts, keys, int(width),
            bool(cross), out)
    return out


@numba.njit(cache=True, nogil=True)
def _plan(link, written, counts, keys, width, slots, lk, ends, first):  # type: ignore[no-untyped-def]  # pragma: no cover
    T, lanes = link.shape  # noqa: N806
    for b in range(keys.shape[0]):
        seq = keys[b] // lanes
        lane = keys[b] % lanes
        newest = written[lane] - 1
        row = seq % T
        for j in range(width + 1):
            slots[b, j] = row * lanes + lane
            if j < width:
                v = link[row, lane]
                lk[b, j] = v
                ends[b, j] = v > 0 and seq + j != newest
            row += 1
            if row == T:
                row = 0
        prev = seq - 1
        if prev < written[lane] - counts[lane]:
            first[b] = True
        else:
            first[b] = link[prev % T, lane] > 0


def window_plan(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                keys: IntArray, width: int) -> tuple[IntArray, npt.NDArray[np.int32],
                                                     BoolArray, BoolArray]:
    """Same contract as :func:`replaybank.ops.windows.window_plan`."""
    keys = np.asarray(keys, dtype=np.int64)
    n = keys.shape[0]
    slots = np.empty((n, width + 1), dtype=np.int64)
    lk = np.empty((n, width), dtype=np.int32)
    ends = np.empty((n, width), dtype=np.bool_)
    first = np.empty(n, dtype=np.bool_)
    _plan(link, written, counts, keys, int(width), slots, lk, ends, first)
    return slots, lk, ends, first


# ---------------------------------------------------------------------- fused sequence path
@numba.njit(cache=True, nogil=True)
def _draw(lk, written, counts, flat, width, cross, min_len, keys, ext):  # type: ignore[no-untyped-def]  # pragma: no cover
    # lk [lanes, T]: nonzero where a step's next observation is kept aside (link.T, or
    # the lane-major boundary bytes of sync_boundaries)
    lanes, T = lk.shape  # noqa: N806
    m = flat.shape[0]
    nb = keys.shape[0]
    all_keys = np.empty(m, np.int64)
    all_ext = np.empty(m, np.int64)
    n_ok = 0
    for i in range(m):
        # flat position -> key, lane by lane, each lane oldest to newest (ring.uniform_keys)
        p = flat[i]
        lane = 0
        while p >= counts[lane]:
            p -= counts[lane]
            lane += 1
        hi = written[lane]
        seq = hi - counts[lane] + p
        all_keys[i] = seq * lanes + lane
        n = min(width, hi - seq)
        if not cross:
            # first cut, scanned without data-dependent branches so that the (cache
            # missing) loads of one window overlap
            row = seq % T
            cut = n
            for j in range(n - 1):
                if lk[lane, row] != 0 and cut == n:
                    cut = j + 1
                row += 1
                if row == T:
                    row = 0
            n = cut
        all_ext[i] = n
        if n >= min_len:
            keys[n_ok] = seq * lanes + lane
            ext[n_ok] = n
            n_ok += 1
            if n_ok == nb:  # enough: later draws are not needed (nor counted)
                return n_ok
    if n_ok < nb:  # too few valid draws: valid ones first, then invalid ones, in draw order
        j = n_ok
        for i in range(m):
            if j == nb:
                break
            if all_ext[i] < min_len:
                keys[j] = all_keys[i]
                ext[j] = all_ext[i]
                j += 1
    return n_ok


def draw_windows(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                 flat: IntArray, width: int, cross: bool, min_len: int,
                 batch_size: int) -> tuple[IntArray, IntArray, int]:
    """Map uniform draws to window starts and keep the first valid ones, in one pass.

    The numpy composition it replaces (its oracle): ``keys = ring.uniform_keys(flat,
    written, counts)``, ``ext = window_extent(link, written, counts, keys, width,
    cross)``, then the first ``batch_size`` draws with ``ext >= min_len`` in draw order
    (when fewer are valid: all valid draws, then the first invalid ones).

    Args:
        link: Next-observation links ``[T, lanes]``.
        written: Steps ever written per lane ``[lanes]``.
        counts: Live steps per lane ``[lanes]`` (sum > every ``flat``).
        flat: Uniform positions ``[m]`` in ``[0, counts.sum())``, ``m >= batch_size``.
        width: Window width ``W``.
        cross: Boundary mode (see :func:`~replaybank.ops.windows.window_extent`).
        min_len: Smallest acceptable extent.
        batch_size: Starts to keep ``B``.

    Returns:
        ``(keys, ext, n_valid)``: keys and extents ``[B]``, and how many of the ``m``
        draws were valid, counted up to ``B`` (the scan stops there).

    Example:
        >>> link = np.zeros((4, 2), np.int32); link[1, 0] = 1
        >>> keys, ext, n = draw_windows(link, np.array([4, 4]), np.array([4, 4]),
        ...                             np.array([0, 1, 4, 6]), 2, False, 2, 2)
        >>> keys.tolist(), ext.tolist(), n
        ([0, 1], [2, 2], 2)
    """
    keys = np.empty(batch_size, np.int64)
    ext = np.empty(batch_size, np.int64)
    n = _draw(link.T, written, counts, np.asarray(flat, np.int64), int(width), bool(cross),
              int(min_len), keys, ext)
    return keys, ext, int(n)


@numba.njit(cache=True, nogil=True)
def _seq_plan(link, lk, written, counts, term, trunc, keys, ext, width, burn_in, slots,  # type: ignore[no-untyped-def]  # pragma: no cover
              steps, flags, side):
    # flags [7, B, W]: is_first, is_last, is_terminal, mask, burn_in, terminated, truncated.
    # Per window: slots, then the terminated/truncated loads of its valid steps (all
    # independent, so their cache misses overlap), then flag rows in simple loops, then
    # the few steps whose next observation is kept aside (a scan of lk's bytes).
    T, lanes = link.shape  # noqa: N806
    n_side = 0
    tail_only = True
    for b in range(keys.shape[0]):
        seq = keys[b] // lanes
        lane = keys[b] - seq * lanes
        newest = written[lane] - 1
        m = min(ext[b], width)
        lkl = lk[lane]
        prev = seq - 1
        f = True if prev < written[lane] - counts[lane] else lkl[prev % T] != 0
        row0 = seq % T
        sl = slots[b]
        st = steps[b]
        first, last, terminal, mask = flags[0, b], flags[1, b], flags[2, b], flags[3, b]
        burn, tm, tr = flags[4, b], flags[5, b], flags[6, b]
        if row0 + width < T:  # no wrap: slots step by lanes
            base = row0 * lanes + lane
            for j in range(width + 1):
                sl[j] = base + j * lanes
        else:
            row = row0
            for j in range(width + 1):
                sl[j] = row * lanes + lane
                row += 1
                if row == T:
                    row = 0
        for j in range(width):  # the window alone, contiguous (take copies strided indices)
            st[j] = sl[j]
        for j in range(m):
            tm[j] = term[sl[j]]
            tr[j] = trunc[sl[j]]
        for j in range(m, width):
            tm[j] = False
            tr[j] = False
        for j in range(width):
            terminal[j] = tm[j]
            last[j] = tm[j] | tr[j]
            burn[j] = j < burn_in
            mask[j] = (j < m) & (j >= burn_in)
            first[j] = False
        if m > 0:
            first[0] = f
        row = row0
        for j in range(m):
            if lkl[row] != 0:  # the next observation of step j is kept aside
                if j + 1 < m:
                    first[j + 1] = True
                if seq + j != newest:
                    last[j] = True
                side[n_side, 0] = b
                side[n_side, 1] = j
                side[n_side, 2] = link[row, lane] - 1
                n_side += 1
                if j != width - 1:
                    tail_only = False
            row += 1
            if row == T:
                row = 0
    return n_side, tail_only


def sequence_plan(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                  term: BoolArray, trunc: BoolArray, keys: IntArray, ext: IntArray,
                  width: int, burn_in: int, bounds: npt.NDArray[np.uint8] | None = None
                  ) -> tuple[IntArray, IntArray, dict[str, BoolArray], IntArray, bool]:
    """Slots, flags and side patches of sampled windows, in one pass.

    Its numpy oracle is :func:`~replaybank.ops.windows.window_plan` plus the flag
    arithmetic of :mod:`replaybank.buffers.sequences`.

    Args:
        link: Next-observation links ``[T, lanes]``.
        written: Steps ever written per lane ``[lanes]``.
        counts: Live steps per lane ``[lanes]``.
        term: ``terminated`` by slot ``[T * lanes]`` bool.
        trunc: ``truncated`` by slot ``[T * lanes]`` bool.
        keys: Live window starts ``[B]``.
        ext: Extents ``[B]`` (steps past them are padding).
        width: Window width ``W``.
        burn_in: Leading burn-in steps.
        bounds: The lane-major ``link != 0`` bytes (see :func:`draw_plan`), read
            instead of ``link`` where they only tell whether a link is set.

    Returns:
        ``(slots, steps, flags, side, tail_only)``: storage slots ``[B, W + 1]`` (the
        window and the step after it); ``steps``, the window's slots alone ``[B, W]``
        (C-contiguous); ``flags`` with ``is_first``, ``is_last``,
        ``is_terminal``, ``mask``, ``burn_in``, ``terminated``, ``truncated`` ``[B, W]``
        bool (False where padded); ``side`` ``[n, 3]`` rows ``(b, j, side slot)`` of the
        valid steps whose next observation is kept aside; ``tail_only``: every such
        step is the last of its window.

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[[1, 3], 0] = 1
        >>> z = np.zeros(4, bool)
        >>> slots, _, fl, side, tail = sequence_plan(link, np.array([4]), np.array([4]), z,
        ...                                          z, np.array([0]), np.array([2]), 2, 0)
        >>> slots.tolist(), fl["is_last"].tolist(), side.tolist(), tail
        ([[0, 1, 2]], [[False, True]], [[0, 1, 0]], True)
    """
    keys = np.asarray(keys, np.int64)
    nb = keys.shape[0]
    slots = np.empty((nb, width + 1), np.int64)
    steps = np.empty((nb, width), np.int64)
    flags = np.empty((7, nb, width), np.bool_)
    side = np.empty((nb * width, 3), np.int64)
    n, tail = _seq_plan(link, link.T if bounds is None else bounds, written, counts, term,
                        trunc, keys,
                        np.asarray(ext, np.int64), int(width), int(burn_in), slots, steps,
                        flags, side)
    return slots, steps, {name: flags[i] for i, name in enumerate(FLAG_NAMES)}, side[:n], \
        bool(tail)



@numba.njit(cache=True, nogil=True)
def _draw_plan(link, lk, written, counts, flat, width, cross, min_len, term, trunc,  # type: ignore[no-untyped-def]  # pragma: no cover
               burn_in, keys, ext, slots, steps, flags, side):
    # _draw, then (when B draws were valid) _seq_plan of the kept starts
    n_ok = _draw(lk, written, counts, flat, width, cross, min_len, keys, ext)
    if n_ok < keys.shape[0]:
        return n_ok, -1, False
    n_side, tail = _seq_plan(link, lk, written, counts, term, trunc, keys, ext, width,
                             burn_in, slots, steps, flags, side)
    return n_ok, n_side, tail


def draw_plan(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
              flat: IntArray, width: int, cross: bool, min_len: int, batch_size: int,
              term: BoolArray, trunc: BoolArray, burn_in: int,
              bounds: npt.NDArray[np.uint8] | None = None) -> tuple[
                  IntArray, IntArray, int,
                  tuple[IntArray, IntArray, BoolArray, IntArray, bool] | None]:
    """:func:`draw_windows`, then :func:`sequence_plan` of its starts, in one call.

    Args:
        link, written, counts, flat, width, cross, min_len, batch_size: As
            :func:`draw_windows`.
        term, trunc, burn_in: As :func:`sequence_plan`.
        bounds: ``link != 0`` lane-major ``[lanes, T]`` (uint8), kept current by
            :func:`sync_boundaries`: a window's scan then reads a few cache lines instead
            of one ``link`` row per step. None reads ``link`` itself.

    Returns:
        ``(keys, ext, n_valid, plan)``: as :func:`draw_windows`, and when ``n_valid ==
        batch_size`` the plan ``(slots, steps, flags, side, tail_only)`` of
        :func:`sequence_plan` with ``flags`` one ``[7, B, W]`` array (rows in the order
        of its dict), else None.

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[3, 0] = 1
        >>> z = np.zeros(4, bool)
        >>> keys, ext, n, plan = draw_plan(link, np.array([4]), np.array([4]),
        ...                                np.array([3, 1]), 2, False, 2, 1, z, z, 0)
        >>> keys.tolist(), plan[0].tolist(), plan[1].tolist(), plan[3].tolist(), plan[4]
        ([1], [[1, 2, 3]], [[1, 2]], [], True)
    """
    keys = np.empty(batch_size, np.int64)
    ext = np.empty(batch_size, np.int64)
    slots = np.empty((batch_size, width + 1), np.int64)
    steps = np.empty((batch_size, width), np.int64)
    flags = np.empty((7, batch_size, width), np.bool_)
    side = np.empty((batch_size * width, 3), np.int64)
    if type(flat) is not np.ndarray or flat.dtype != np.int64:
        flat = np.asarray(flat, np.int64)
    n, n_side, tail = draw_plan_into(link, bounds, written, counts, flat, cross, min_len,
                                     keys, ext, term, trunc, width, burn_in, slots, steps,
                                     flags, side)
    if n_side < 0:
        return keys, ext, n, None
    return keys, ext, n, (slots, steps, flags, side[:n_side], tail)


def draw_plan_into(link: npt.NDArray[np.int32], bounds: npt.NDArray[np.uint8] | None,
                   written: IntArray, counts: IntArray, flat: IntArray, cross: bool,
                   min_len: int, keys: IntArray, ext: IntArray, term: BoolArray,
                   trunc: BoolArray, width: int, burn_in: int, slots: IntArray,
                   steps: IntArray, flags: BoolArray, side: IntArray
                   ) -> tuple[int, int, bool]:
    """:func:`draw_plan` into the caller's arrays (``keys``, ``ext`` ``[B]``, ``slots``
    ``[B, W + 1]``, ``steps`` ``[B, W]``, ``flags`` ``[7, B, W]``, ``side`` ``[B * W, 3]``),
    with the argument order of the C function (:mod:`~replaybank.ops.windows_c`), so that
    a caller that keeps its working arrays between calls allocates nothing.

    Returns:
        ``(n_valid, n_side, tail_only)``; ``n_side`` is -1 (no plan written) when fewer
        than ``B`` draws were valid.

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[3, 0] = 1
        >>> z = np.zeros(4, bool); keys, ext = np.empty(1, np.int64), np.empty(1, np.int64)
        >>> slots, steps = np.empty((1, 3), np.int64), np.empty((1, 2), np.int64)
        >>> flags, side = np.empty((7, 1, 2), bool), np.empty((2, 3), np.int64)
        >>> draw_plan_into(link, None, np.array([4]), np.array([4]), np.array([3, 1]),
        ...                False, 2, keys, ext, z, z, 2, 0, slots, steps, flags, side)
        (1, 0, True)
        >>> keys.tolist(), slots.tolist()
        ([1], [[1, 2, 3]])
    """
    lk = link.T if bounds is None else bounds
    n, n_side, tail = _draw_plan(link, lk, written, counts, flat, int(width), bool(cross),
                                 int(min_len), term, trunc, int(burn_in), keys, ext, slots,
                                 steps, flags, side)
    return int(n), int(n_side), bool(tail)


def draw_take(link: npt.NDArray[np.int32], bounds: npt.NDArray[np.uint8] | None,
              written: IntArray, counts: IntArray, flat: IntArray, cross: bool,
              min_len: int, keys: IntArray, ext: IntArray, term: BoolArray,
              trunc: BoolArray, width: int, burn_in: int, slots: IntArray, steps: IntArray,
              flags: BoolArray, side: IntArray, fields: tuple[tuple[Any, Any], ...],
              obs: tuple[tuple[Any, Any], ...]) -> tuple[int, int, bool]:
    """:func:`draw_plan_into`, then (when the plan was written) the rows of its windows:
    ``out[...] = src[steps]`` for each ``(src, out)`` of ``fields`` (``out`` ``[B, W,
    ...]``) and ``out[...] = src[slots]`` for each of ``obs`` (``out`` ``[B, W + 1,
    ...]``: the obs and next_obs windows of one gather); ``src`` is a table field's flat
    ``[T * lanes, ...]`` rows.

    Returns:
        As :func:`draw_plan_into`; nothing is gathered when ``n_side`` is -1.

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[3, 0] = 1
        >>> z = np.zeros(4, bool); keys, ext = np.empty(1, np.int64), np.empty(1, np.int64)
        >>> slots, steps = np.empty((1, 3), np.int64), np.empty((1, 2), np.int64)
        >>> flags, side = np.empty((7, 1, 2), bool), np.empty((2, 3), np.int64)
        >>> src, out = np.arange(4.0), np.empty((1, 3))
        >>> draw_take(link, None, np.array([4]), np.array([4]), np.array([3, 1]), False, 2,
        ...           keys, ext, z, z, 2, 0, slots, steps, flags, side, (), ((src, out),))
        (1, 0, True)
        >>> out.tolist()
        [[1.0, 2.0, 3.0]]
    """
    got = draw_plan_into(link, bounds, written, counts, flat, cross, min_len, keys, ext,
                         term, trunc, width, burn_in, slots, steps, flags, side)
    if got[1] >= 0:
        for src, out in fields:
            src.take(steps, axis=0, out=out)
        for src, out in obs:
            src.take(slots, axis=0, out=out)
    return got


@numba.njit(cache=True, nogil=True)
def _sync(link, written, seen, bounds):  # type: ignore[no-untyped-def]  # pragma: no cover
    T, lanes = link.shape  # noqa: N806
    for lane in range(lanes):
        w = written[lane]
        s = seen[lane]
        if w == s:
            continue
        if w < s or w - s >= T - 1:  # unknown history, or most of the lane rewritten
            for r in range(T):
                bounds[lane, r] = link[r, lane] != 0
        else:  # writes change links only in rows [s - 1, w): the previous newest step on
            for q in range(max(s - 1, 0), w):
                r = q % T
                bounds[lane, r] = link[r, lane] != 0
        seen[lane] = w


def sync_boundaries(link: npt.NDArray[np.int32], written: IntArray, seen: IntArray,
                    bounds: npt.NDArray[np.uint8]) -> None:
    """Bring ``bounds`` (``link != 0``, lane-major ``[lanes, T]``) up to date.

    Every write of a lane changes links only in the rows of its new steps and of its
    previous newest step, so the rows since ``seen`` (the ``written`` counts of the last
    sync, updated here) are recomputed. A lane whose ``written`` went back, or moved by
    ``T - 1`` or more, is recomputed whole; set ``seen`` to a large value to force that
    (after ``clear`` or a state load, which change links without writing).

    Example:
        >>> link = np.zeros((4, 2), np.int32); link[2, 0] = 3  # lane 0's newest step
        >>> bounds = np.zeros((2, 4), np.uint8); seen = np.full(2, 2**62)
        >>> sync_boundaries(link, np.array([3, 3]), seen, bounds)
        >>> bounds.tolist(), seen.tolist()
        ([[0, 0, 1, 0], [0, 0, 0, 0]], [3, 3])
        >>> link[2, 0] = 0; link[3, 1] = 2  # the next write continues lane 0 ...
        >>> sync_boundaries(link, np.array([4, 4]), seen, bounds)
        >>> bounds.tolist()  # ... and keeps lane 1's next obs aside
        [[0, 0, 0, 0], [0, 0, 0, 1]]
    """
    _sync(link, written, seen, bounds)


@numba.njit(cache=True, nogil=True)
def _r2d2(td, mask, eta, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    for b in range(td.shape[0]):
        n = 0
        mx = 0.0
        total = 0.0
        for j in range(td.shape[1]):
            if mask[b, j]:
                a = abs(td[b, j])
                mx = a if n == 0 or a > mx else mx
                total += a
                n += 1
        if n and total == np.inf and mx < np.inf:  # finite errors whose sum overflowed
            scaled = 0.0
            for j in range(td.shape[1]):
                if mask[b, j]:
                    scaled += abs(td[b, j]) / mx
            out[b] = min(eta * mx + (1.0 - eta) * (mx * (scaled / n)), mx)
        else:
            out[b] = eta * mx + (1.0 - eta) * (total / n) if n else np.nan


def r2d2_priority(td_errors: npt.NDArray[np.float64], mask: BoolArray,
                  eta: float) -> npt.NDArray[np.float64]:
    """Same contract as :func:`replaybank.ops.windows.r2d2_priority` (one pass per row).

    Example:
        >>> r2d2_priority(np.array([[1.0, -3.0, 9.0]]), np.array([[True, True, False]]),
        ...               0.5).tolist()
        [2.5]
    """
    td = np.ascontiguousarray(td_errors, dtype=np.float64)
    m = np.ascontiguousarray(mask, dtype=np.bool_)
    out = np.empty(td.shape[0], np.float64)
    _r2d2(td, m, float(eta), out)
    return out
