"""Pure window arithmetic for sequence sampling and frame stacks.

Every function works on the lane bookkeeping of a step table (see
:mod:`replaybank.ops.ring`): ``link`` ``[T, lanes]`` (``> 0`` where the next observation
of a step is not the next step's observation: an episode end, a discontinuity, or the
newest step of a lane), ``written`` and ``counts`` ``[lanes]``, and for frame stacks
``cleared`` ``[lanes]`` (the sequence number of each lane's first step after its last
``clear()``, 0 when never cleared). Steps are named by item keys ``seq * lanes + lane``;
lane ``l`` holds the live sequence numbers ``[written[l] - counts[l], written[l])``.

A *window* of width ``W`` starting at key ``k`` is the steps ``seq, seq + 1, ...,
seq + W - 1`` of the same lane. Its *extent* is how many of its leading steps may be read:

* every step must be live (a window never crosses the write head, never reads an
  overwritten step and never leaves its lane),
* in ``"stop"`` mode it also ends after the first step with ``link > 0`` (the episode
  ended there, or the data is not continuous).

Example:
    >>> import numpy as np
    >>> link = np.zeros((6, 1), np.int32); link[[2, 5], 0] = 1   # episode ends at 2; 5 newest
    >>> written, counts = np.array([6]), np.array([6])
    >>> window_extent(link, written, counts, np.arange(6), 3, cross=False).tolist()
    [3, 2, 1, 3, 2, 1]
    >>> valid_starts(link, written, counts, 3, cross=False, min_len=3).tolist()
    [0, 3]
    >>> history(link, written, counts, np.zeros(1, np.int64), np.array([4]), 4)[0].tolist()
    [[3, 3, 3, 4]]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops.jit import pick_kernel

__all__ = [
    "FLAG_NAMES",
    "history",
    "is_first",
    "kernel",
    "r2d2_priority",
    "row_kernel",
    "stack_buffers",
    "stack_slots",
    "take_rows",
    "take_steps",
    "valid_starts",
    "window_extent",
    "window_keys",
    "window_plan",
]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]

#: The rows of a window plan's ``flags`` ``[7, B, W]`` (the fused kernels'
#: ``draw_plan``), in order.
FLAG_NAMES = ("is_first", "is_last", "is_terminal", "mask", "burn_in", "terminated",
              "truncated")

#: The output buffers of a frame-stack plan (see :func:`stack_buffers`).
StackBuffers = tuple[IntArray, IntArray, IntArray, IntArray, IntArray]


def _split(keys: IntArray, lanes: int) -> tuple[IntArray, IntArray]:
    keys = np.asarray(keys, dtype=np.int64)
    return keys // lanes, keys % lanes


def window_keys(keys: IntArray, width: int, lanes: int) -> IntArray:
    """Item keys of the ``width`` consecutive steps of each window (same lane).

    Args:
        keys: Window starts, ``[B]``.
        width: Steps per window ``W``.
        lanes: Lanes of the table.

    Returns:
        Keys ``[B, W]`` (not checked for liveness).

    Example:
        >>> window_keys(np.array([1, 4]), 3, lanes=2).tolist()
        [[1, 3, 5], [4, 6, 8]]
    """
    keys = np.asarray(keys, dtype=np.int64)
    return keys[:, None] + np.arange(width, dtype=np.int64)[None, :] * lanes  # [B, W]


def window_extent(
    link: npt.NDArray[np.int32],
    written: IntArray,
    counts: IntArray,
    keys: IntArray,
    width: int,
    cross: bool,
) -> IntArray:
    """How many leading steps of each window may be read.

    Args:
        link: Next-observation links ``[T, lanes]``.
        written: Steps ever written per lane ``[lanes]``.
        counts: Live steps per lane ``[lanes]``.
        keys: Window starts ``[B]``.
        width: Window width ``W``.
        cross: ``True``: windows may run over episode ends (``"cross"`` mode);
            ``False``: they stop after the first step with ``link > 0``.

    Returns:
        Extent ``[B]`` in ``[0, W]``; 0 where the start itself is not live.

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[3, 0] = 1
        >>> window_extent(link, np.array([6]), np.array([4]), np.array([1, 2, 4]), 3,
        ...               cross=True).tolist()
        [0, 3, 2]
    """
    T, lanes = link.shape  # noqa: N806
    seq, lane = _split(keys, lanes)
    hi = written[lane]  # [B]
    lo = hi - counts[lane]
    start_live = (seq >= lo) & (seq < hi)
    s = seq[:, None] + np.arange(width, dtype=np.int64)[None, :]  # [B, W]
    ok = s < hi[:, None]
    if not cross and width > 1:
        cut = link[s[:, :-1] % T, lane[:, None]] > 0  # [B, W-1]
        after_cut = np.cumsum(cut, axis=1) > 0
        ok[:, 1:] &= ~after_cut
    n: IntArray = ok.sum(axis=1).astype(np.int64)
    n[~start_live] = 0
    return n


def valid_starts(
    link: npt.NDArray[np.int32],
    written: IntArray,
    counts: IntArray,
    width: int,
    cross: bool,
    min_len: int,
) -> IntArray:
    """Every key whose window has extent ``>= min_len`` (exhaustive, ``O(size)``).

    Args:
        link: Next-observation links ``[T, lanes]``.
        written: Steps ever written per lane ``[lanes]``.
        counts: Live steps per lane ``[lanes]``.
        width: Window width ``W``.
        cross: Boundary mode (see :func:`window_extent`).
        min_len: Smallest acceptable extent (``W`` for strict windows).

    Returns:
        Keys ``[n]``, lane by lane, each lane oldest to newest.

    Example:
        >>> link = np.zeros((5, 2), np.int32); link[4, :] = 1; link[1, 1] = 1
        >>> valid_starts(link, np.array([5, 5]), np.array([5, 5]), 3, False, 3).tolist()
        [0, 2, 4, 5]
    """
    T, lanes = link.shape  # noqa: N806
    out: list[IntArray] = []
    for lane in range(lanes):
        c, hi = int(counts[lane]), int(written[lane])
        if c == 0:
            continue
        seqs = np.arange(hi - c, hi, dtype=np.int64)  # [c]
        if cross:
            end = np.full(c, hi, dtype=np.int64)
        else:
            cut = link[seqs % T, lane] > 0
            pos = np.where(cut, np.arange(c), c)
            nxt = np.minimum.accumulate(pos[::-1])[::-1]  # first cut at or after i
            end = np.minimum(seqs[0] + nxt + 1, hi)
        n = np.minimum(width, end - seqs)
        out.append(seqs[n >= min_len] * lanes + lane)
    if not out:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(out)


def is_first(
    link: npt.NDArray[np.int32], written: IntArray, counts: IntArray, keys: IntArray
) -> BoolArray:
    """Whether each (live) step starts an episode as far as the table knows.

    True when the previous step of the lane ended an episode or broke continuity
    (``link > 0``), and when the previous step is not live (never written, cleared or
    overwritten: the table no longer knows what came before).

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[1, 0] = 1
        >>> is_first(link, np.array([4]), np.array([4]), np.arange(4)).tolist()
        [True, False, True, False]
    """
    T, lanes = link.shape  # noqa: N806
    seq, lane = _split(keys, lanes)
    prev = seq - 1
    prev_live = prev >= written[lane] - counts[lane]
    return np.asarray(~prev_live | (link[prev % T, lane] > 0))


def history(
    link: npt.NDArray[np.int32],
    written: IntArray,
    counts: IntArray,
    cleared: IntArray,
    keys: IntArray,
    k: int,
) -> tuple[IntArray, BoolArray]:
    """Keys of the ``k``-frame history of each step, padded like ``padding_type="reset"``.

    Frame ``j`` of the stack of step ``seq`` is step ``max(start, seq - (k - 1 - j))``,
    where ``start`` is the first step of its episode: the history never reaches into the
    previous episode (or across a discontinuity), and at an episode start the first
    observation is repeated, as gymnasium's ``FrameStackObservation(padding_type="reset")``
    does.

    The steps before a lane's ``cleared[lane]`` do not exist (those before its first step
    ever, ``cleared == 0``, and those ``clear()`` removed): a history that reaches them
    starts an episode there, padded. Steps from ``cleared`` on that are no longer live
    were overwritten by the ring: a history that needs one cannot be rebuilt.

    Args:
        link: Next-observation links ``[T, lanes]``.
        written: Steps ever written per lane ``[lanes]``.
        counts: Live steps per lane ``[lanes]``.
        cleared: Each lane's first sequence number after its last clear ``[lanes]`` (0:
            never cleared; at most ``written - counts``).
        keys: Live steps ``[B]``.
        k: Stack size.

    Returns:
        ``(hist, ok)``: keys ``[B, k]`` (oldest first, the step itself last), and ``ok``
        ``[B]``, False where the needed history was overwritten (the stack cannot be
        rebuilt exactly).

    Example:
        >>> link = np.zeros((4, 1), np.int32)
        >>> h, ok = history(link, np.array([6]), np.array([4]), np.array([0]),
        ...                 np.array([3, 5]), 3)
        >>> h.tolist(), ok.tolist()
        ([[2, 2, 3], [3, 4, 5]], [False, True])
        >>> h, ok = history(link, np.array([6]), np.array([4]), np.array([2]),
        ...                 np.array([2, 3]), 3)  # a clear() at 2: nothing before it
        >>> h.tolist(), ok.tolist()
        ([[2, 2, 2], [2, 2, 3]], [True, True])
    """
    T, lanes = link.shape  # noqa: N806
    seq, lane = _split(keys, lanes)
    if k == 1:
        return seq[:, None] * lanes + lane[:, None], np.ones(len(seq), dtype=bool)
    lo = written[lane] - counts[lane]  # [B]
    cand = seq[:, None] - np.arange(1, k, dtype=np.int64)[None, :]  # [B, k-1] steps back
    live = cand >= lo[:, None]
    cont = live & (link[cand % T, lane[:, None]] == 0)  # may step back past cand
    going = np.logical_and.accumulate(cont, axis=1)  # [B, k-1] prefix of cont
    tried = np.ones_like(going)
    tried[:, 1:] = going[:, :-1]  # whether the walk reached cand at all
    # a step the walk reached that existed (at or after the clear) but is gone
    ok = ~np.any(tried & ~live & (cand >= np.asarray(cleared)[lane][:, None]), axis=1)
    depth = going.sum(axis=1)  # steps back inside the episode, [B]
    back = np.minimum(np.arange(k - 1, -1, -1, dtype=np.int64)[None, :], depth[:, None])
    return (seq[:, None] - back) * lanes + lane[:, None], ok


def stack_slots(
    link: npt.NDArray[np.int32],
    written: IntArray,
    counts: IntArray,
    cleared: IntArray,
    keys: IntArray,
    k: int,
) -> tuple[IntArray, IntArray, BoolArray]:
    """Storage slots of each step's frame stack and next frame, in one pass.

    Args:
        link: Next-observation links ``[T, lanes]``.
        written: Steps ever written per lane ``[lanes]``.
        counts: Live steps per lane ``[lanes]``.
        cleared: Each lane's first sequence number after its last clear ``[lanes]`` (see
            :func:`history`).
        keys: Live steps ``[B]``.
        k: Stack size.

    Returns:
        ``(slots, side, ok)``: ``slots`` ``[B, k + 1]`` storage slots
        (``row * lanes + lane``) of the ``k`` history frames (as :func:`history`) and of
        the next step; ``side`` ``[B]`` the side slot holding the next observation
        instead (``link - 1``; ``-1`` where the next step's observation is it); ``ok`` as
        :func:`history`.

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[3, 0] = 1
        >>> slots, side, ok = stack_slots(link, np.array([4]), np.array([4]),
        ...                               np.array([0]), np.array([1, 3]), 2)
        >>> slots.tolist(), side.tolist(), ok.tolist()
        ([[0, 1, 2], [2, 3, 0]], [-1, 0], [True, True])
    """
    T, lanes = link.shape  # noqa: N806
    keys = np.asarray(keys, dtype=np.int64)
    hist, ok = history(link, written, counts, cleared, keys, k)  # [B, k] keys
    seq, lane = _split(keys, lanes)
    slots = np.empty((len(keys), k + 1), dtype=np.int64)
    slots[:, :k] = (hist // lanes) % T * lanes + lane[:, None]
    row = seq % T
    slots[:, k] = (row + 1) % T * lanes + lane
    side = link[row, lane].astype(np.int64) - 1
    return slots, side, ok


def stack_buffers(n: int, k: int) -> StackBuffers:
    """Output buffers of a frame-stack plan (``stack_plan`` of
    :mod:`~replaybank.ops.windows_c` or :mod:`~replaybank.ops.stack_numba`) for ``n``
    keys, to reuse across calls.

    Args:
        n: Keys per call ``B``.
        k: Frames per stack.

    Returns:
        ``(flat, slots, side, ok, step)``: one flat int64 buffer ``[n * (k + 4)]`` and
        its views ``[n, k + 1]``, ``[n]``, ``[n]``, ``[n]``.

    Example:
        >>> [b.shape for b in stack_buffers(3, 2)]
        [(18,), (3, 3), (3,), (3,), (3,)]
    """
    w = k + 1
    flat = np.empty(n * (w + 3), dtype=np.int64)
    end = n * w
    return (flat, flat[:end].reshape(n, w), flat[end:end + n], flat[end + n:end + 2 * n],
            flat[end + 2 * n:])


def window_plan(
    link: npt.NDArray[np.int32],
    written: IntArray,
    counts: IntArray,
    keys: IntArray,
    width: int,
) -> tuple[IntArray, npt.NDArray[np.int32], BoolArray, BoolArray]:
    """Everything a window gather needs besides the data, in one pass.

    Args:
        link: Next-observation links ``[T, lanes]``.
        written: Steps ever written per lane ``[lanes]``.
        counts: Live steps per lane ``[lanes]``.
        keys: Live window starts ``[B]``.
        width: Window width ``W``.

    Returns:
        ``(slots, links, ends, first)``: storage slots of the ``W`` steps and of the step
        after them ``[B, W + 1]`` (positions past the extent name whatever the ring holds
        there: mask them); their links ``[B, W]``; ``ends`` ``[B, W]``, the step has
        ``link > 0`` and is not its lane's newest step (an episode end or a
        discontinuity); ``first`` ``[B]``, :func:`is_first` of the starts.

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[[1, 3], 0] = 1
        >>> slots, lk, ends, first = window_plan(link, np.array([4]), np.array([4]),
        ...                                      np.array([0, 2]), 2)
        >>> slots.tolist(), ends.tolist(), first.tolist()
        ([[0, 1, 2], [2, 3, 0]], [[False, True], [False, False]], [True, True])
    """
    T, lanes = link.shape  # noqa: N806
    keys = np.asarray(keys, dtype=np.int64)
    seq, lane = _split(keys, lanes)
    rows = (seq[:, None] + np.arange(width + 1, dtype=np.int64)[None, :]) % T  # [B, W + 1]
    slots = rows * lanes + lane[:, None]
    lk = link[rows[:, :width], lane[:, None]]  # [B, W]
    newest = (seq[:, None] + np.arange(width)[None, :]) == (written[lane] - 1)[:, None]
    ends = (lk > 0) & ~newest
    return slots, lk, ends, is_first(link, written, counts, keys)


#: The module of each numpy function's numba twin (same signature and results).
_TWINS = {"window_extent": "replaybank.ops.windows_numba",
          "r2d2_priority": "replaybank.ops.windows_numba",
          "window_plan": "replaybank.ops.windows_numba",
          "stack_slots": "replaybank.ops.stack_numba"}
#: The functions that also have a C twin (in :mod:`replaybank.ops.windows_c`).
_C_TWINS = frozenset({"window_extent", "window_plan", "stack_slots", "take_rows",
                      "take_steps"})


def kernel(fn: Callable[..., Any], prefer: str = "auto") -> tuple[Any, str]:
    """``fn`` (one of :func:`window_extent`, :func:`r2d2_priority`, :func:`window_plan`,
    :func:`stack_slots`, :func:`take_rows`, :func:`take_steps`) in C where built and it
    has a C twin, else compiled with numba when it has a numba twin that imports, else
    ``fn`` itself (:func:`~replaybank.ops.jit.pick_kernel`).

    Args:
        fn: The numpy function.
        prefer: ``"auto"``, ``"c"`` (raise if there is no built C twin), ``"numba"``
            (raise if numba is missing) or ``"numpy"``.

    Returns:
        ``(function, name)``; the C and numba functions have the same signature and
        results.

    Example:
        >>> kernel(stack_slots, "numpy") == (stack_slots, "numpy")
        True
        >>> kernel(r2d2_priority)[1] in ("numba", "numpy")  # no C twin
        True
    """
    name = fn.__name__
    return pick_kernel(prefer, _TWINS.get(name), name, fn, name,
                       compiled="replaybank.ops.windows_c" if name in _C_TWINS else None)


def take_rows(jobs: tuple[tuple[npt.NDArray[Any], ...], ...]) -> None:
    """``out[i] = src[idx[i]]`` (rows along the first axis) for every ``(src, idx, out)``,
    and the obs/next_obs windows of every window pair ``(src, idx, out, next)``.

    The oracle of the C kernel :func:`replaybank.ops.windows_c.take_rows` (one call for
    every field of a window batch). Every job is checked before any row is copied.

    Args:
        jobs: ``(src, idx, out)`` triples: ``src`` ``[N, *shape]``, ``idx`` int64 of any
            shape ``S`` with values in ``[0, N)``, ``out`` ``[*S, *shape]`` of ``src``'s
            dtype, all C-contiguous; and window pairs ``(src, idx, out, next)``: ``idx``
            ``[B, W + 1]``, ``out[b, j] = src[idx[b, j]]`` and ``next[b, j] =
            src[idx[b, j + 1]]``, both ``[B, W, *shape]`` (``obs`` and ``next_obs`` of
            windows whose next observations are not all the next step's, each row read
            once).

    Raises:
        IndexError: An index outside ``[0, N)`` (nothing is copied).
        TypeError: ``idx`` is not int64, or a job is not a triple or a pair.
        ValueError: ``out`` (or ``next``) does not hold its rows of ``src``'s row size, or
            a pair's ``idx`` is not ``[B, W + 1]`` with ``W >= 1``.

    Example:
        >>> src = np.arange(6).reshape(3, 2)
        >>> out = np.empty((2, 2), src.dtype)
        >>> take_rows(((src, np.array([2, 0]), out),))
        >>> out.tolist()
        [[4, 5], [0, 1]]
        >>> obs, nxt = np.empty((1, 2, 2), src.dtype), np.empty((1, 2, 2), src.dtype)
        >>> take_rows(((src, np.array([[0, 1, 2]]), obs, nxt),))
        >>> obs[0, :, 0].tolist(), nxt[0, :, 0].tolist()
        ([0, 2], [2, 4])
    """
    for j, job in enumerate(jobs):
        if len(job) not in (3, 4):
            raise TypeError(f"take_rows: job {j} must be a (src, idx, out) or (src, idx, "
                            "out, next) tuple")
        src, idx, out = job[:3]
        if idx.dtype != np.int64:
            raise TypeError(f"take_rows: job {j}: idx must be a contiguous int64 array")
        row = src.nbytes // src.shape[0] if src.shape[0] else 0
        n_out = idx.size
        if len(job) == 4:
            if idx.ndim != 2 or idx.shape[1] < 2:
                raise ValueError(f"take_rows: job {j}: a window pair's idx must be [B, W + 1] "
                                 "with W >= 1")
            n_out = idx.shape[0] * (idx.shape[1] - 1)
            if job[3].nbytes != n_out * row:
                raise ValueError(f"take_rows: job {j}: next holds {job[3].nbytes} bytes, "
                                 f"{n_out} rows of {row} bytes need {n_out * row}")
        if out.nbytes != n_out * row:
            raise ValueError(f"take_rows: job {j}: out holds {out.nbytes} bytes, {n_out} "
                             f"rows of {row} bytes need {n_out * row}")
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= src.shape[0]):
            raise IndexError(f"take_rows: job {j}: an index is out of bounds for "
                             f"{src.shape[0]} rows")
    for job in jobs:
        src, idx = job[0], job[1]
        # the indices are checked: "wrap" skips numpy's buffered copy of mode "raise"
        if len(job) == 3:
            src.take(idx, axis=0, out=job[2].reshape(idx.shape + src.shape[1:]), mode="wrap")
            continue
        shape = (idx.shape[0], idx.shape[1] - 1, *src.shape[1:])
        src.take(idx[:, :-1], axis=0, out=job[2].reshape(shape), mode="wrap")
        src.take(idx[:, 1:], axis=0, out=job[3].reshape(shape), mode="wrap")


def row_kernel(prefer: str = "auto") -> tuple[Any, str]:
    """:func:`take_rows` in C where the extension was built (``"c"``), else the numpy
    function itself (:func:`~replaybank.ops.jit.pick_kernel`; there is no numba twin).

    Args:
        prefer: ``"auto"``, ``"c"`` (raise if it was not built) or ``"numpy"``.

    Returns:
        ``(function, name)``.

    Example:
        >>> row_kernel("numpy") == (take_rows, "numpy")
        True
    """
    return kernel(take_rows, prefer)


def r2d2_priority(td_errors: FloatArray, mask: BoolArray, eta: float) -> FloatArray:
    """R2D2 sequence priority ``eta * max|td| + (1 - eta) * mean|td|`` over masked steps.

    Args:
        td_errors: ``[B, L]`` TD errors.
        mask: ``[B, L]`` which steps count.
        eta: Mixing weight in ``[0, 1]``.

    Returns:
        Priorities ``[B]`` (NaN for rows without any counted step). Finite TD errors give
        a finite priority, at most the row's max: a row whose sum overflows float64 is
        averaged scaled by its max, ``max * mean(|td| / max)``.

    Example:
        >>> r2d2_priority(np.array([[1.0, -3.0, 9.0]]), np.array([[True, True, False]]),
        ...               0.5).tolist()
        [2.5]
        >>> r2d2_priority(np.full((1, 4), 1e308), np.ones((1, 4), bool), 0.9).tolist()
        [1e+308]
    """
    a = np.abs(np.asarray(td_errors, dtype=np.float64))
    m = np.asarray(mask, dtype=bool)
    n = m.sum(axis=1)
    mx = np.where(m, a, -np.inf).max(axis=1, initial=-np.inf)
    with np.errstate(over="ignore"):  # an overflowing sum is averaged scaled below
        total = np.where(m, a, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):  # rows set below: empty, overflowed
        mean = total / n
        out = eta * mx + (1.0 - eta) * mean
    over = (total == np.inf) & (mx < np.inf)  # [B] finite errors whose sum overflowed
    if over.any():
        scale = mx[over, None]  # [k, 1]
        mean = scale[:, 0] * (np.where(m[over], a[over] / scale, 0.0).sum(axis=1) / n[over])
        out[over] = np.minimum(eta * mx[over] + (1.0 - eta) * mean, mx[over])
    out[n == 0] = np.nan
    return np.asarray(out, dtype=np.float64)


def take_steps(slots: npt.NDArray[np.int64], lanes: int, link: npt.NDArray[np.int32],
               fields: tuple[tuple[Any, Any], ...],
               nexts: tuple[tuple[Any, Any, Any], ...], base: int = 0,
               keys: bool = False) -> int:
    """Every field of a batch of steps and each observation field's next observation.

    The oracle of the C kernel :func:`replaybank.ops.windows_c.take_steps` (one call for
    a whole transition batch: :meth:`StepTable.gather_transitions
    <replaybank.storage.table.StepTable.gather_transitions>`). Everything is checked
    before any row is copied.

    Args:
        slots: ``[B]`` int64 storage slots of the flat table, each in ``[0, 2 n)`` with
            ``n = len(link)`` (one wrap allowed: ``slot - n`` is the slot then).
        lanes: The table's lanes (a step's next step is ``lanes`` slots on, mod ``n``).
        link: ``[n]`` int32, the table's flat link: side slot + 1 where a step's next
            observation is kept aside, else 0.
        fields: ``(src, out)`` pairs: ``out[i] = src[slot_i]``, ``src`` ``[n, *shape]``,
            ``out`` ``[B, *shape]``.
        nexts: ``(src, side, out)`` triples: ``out[i] = side[link[slot_i] - 1]`` where
            ``link[slot_i] > 0``, else ``src[(slot_i + lanes) mod n]``. A link that
            changed while the rows were copied (a writer in another process relinked the
            step, and may reuse its side slot at once) is read again after the copies:
            that step's next observations come from ``src``'s next row.
        base: Subtracted from every entry of ``slots`` first (so the item keys of one
            lane are slots: ``key - base`` with ``base`` a multiple of ``n`` at or below
            the oldest key; no subtraction pass of its own).
        keys: The entries are item keys (``>= 0``) of a table of ``lanes`` lanes: each
            is read at slot ``(key // lanes % T) * lanes + key % lanes``, ``T = n //
            lanes`` (no slot array of its own).

    Returns:
        How many next observations came from the side store.

    Raises:
        IndexError: A slot outside ``[0, 2 n)``, or a link outside the side store.
        ValueError: A ``src`` without ``n`` rows, an ``out`` of the wrong size, a side
            row of another size than its ``src`` row, or ``lanes`` outside ``[1, n]``.

    Example:
        >>> obs = np.arange(4.0).reshape(4, 1)  # T = 4, one lane
        >>> link = np.array([0, 1, 0, 0], np.int32)  # step 1's next obs is side slot 0
        >>> out, nxt = np.empty((3, 1)), np.empty((3, 1))
        >>> take_steps(np.array([0, 1, 7]), 1, link, ((obs, out),),
        ...            ((obs, np.array([[9.0]]), nxt),))
        1
        >>> out[:, 0].tolist(), nxt[:, 0].tolist()
        ([0.0, 1.0, 3.0], [1.0, 9.0, 0.0])
    """
    n = len(link)
    b = len(slots)
    if not 1 <= lanes <= n:
        raise ValueError(f"take_steps: lanes={lanes} must be in [1, {n}]")
    for j, (src, out) in enumerate([*fields, *((s, o) for s, _, o in nexts)]):
        row = src.nbytes // n if n else 0
        if src.ndim < 1 or src.shape[0] != n:
            raise ValueError(f"take_steps: job {j}: src must hold {n} rows (the link's length)")
        if out.nbytes != b * row:
            raise ValueError(f"take_steps: job {j}: out holds {out.nbytes} bytes, {b} rows of "
                             f"{row} bytes need {b * row}")
    for j, (src, side, _) in enumerate(nexts):
        if side.shape[0] and side.nbytes // side.shape[0] != src.nbytes // n:
            raise ValueError(f"take_steps: nexts[{j}]: side rows must hold as many bytes as "
                             "src's")
    if base:
        slots = slots - base
    if keys:
        if n % lanes:
            raise ValueError(f"take_steps: keys need the link's {n} slots to be a whole "
                             f"number of rows of lanes={lanes}")
        if b and int(slots.min()) < 0:
            raise IndexError("take_steps: a negative key")
        slots = slots // lanes % (n // lanes) * lanes + slots % lanes
    if b and (int(slots.min()) < 0 or int(slots.max()) >= 2 * n):
        raise IndexError(f"take_steps: a slot is out of bounds for {n} slots (one wrap "
                         "allowed)")
    ws = np.where(slots >= n, slots - n, slots)
    pos = side_slots = None
    if nexts:
        lk = link[ws]
        pos = lk.nonzero()[0]
        side_slots = lk[pos].astype(np.int64) - 1
        rows = min(side.shape[0] for _, side, _ in nexts)
        if len(pos) and (int(side_slots.min()) < 0 or int(side_slots.max()) >= rows):
            raise IndexError(f"take_steps: a link points outside the side store's {rows} rows")
    for src, out in fields:
        src.take(ws, axis=0, out=out.reshape((b, *src.shape[1:])), mode="wrap")
    if pos is None or side_slots is None:
        return 0
    nxt = ws + lanes
    for src, side, out in nexts:
        o = out.reshape((b, *src.shape[1:]))
        src.take(nxt, axis=0, out=o, mode="wrap")
        if len(pos):
            o[pos] = side[side_slots]
    if len(pos):  # links read again: one a writer relinked meanwhile names the next row
        moved = pos[link[ws[pos]] != lk[pos]]
        for src, _, out in nexts:
            if len(moved):
                out.reshape((b, *src.shape[1:]))[moved] = src.take(nxt[moved], axis=0,
                                                                   mode="wrap")
        return len(pos) - len(moved)
    return 0
