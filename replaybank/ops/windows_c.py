"""C kernels of window batches (``replaybank._windows``): the row gather and the window
and frame-stack plans, with the signatures of their numba twins.

* :func:`take_rows` copies the rows of every field of a batch in one call (rows a few
  steps ahead prefetched, the GIL released), instead of one ``ndarray.take`` per field;
  its numpy oracle is :func:`replaybank.ops.windows.take_rows`.
* :func:`take_steps` does the same for a batch of one-step transitions, next observations
  included (from the next step's row, or the side store where the link says so); its
  numpy oracle is :func:`replaybank.ops.windows.take_steps`.
* :func:`nstep_windows` finds the n-step windows of a batch (their last steps, lengths
  and discounted returns) in one pass; its numpy oracle is
  :func:`replaybank.ops.nstep.nstep_windows`.
* :func:`draw_plan`, :func:`draw_plan_into`, :func:`draw_take`, :func:`draw_windows`,
  :func:`sequence_plan`,
  :func:`window_extent`, :func:`window_plan` and :func:`sync_boundaries` are the
  functions of :mod:`replaybank.ops.windows_numba` (same arguments, same results; the
  numpy oracles are named in their docstrings), and :func:`stack_plan`,
  :func:`stack_slots` and :func:`stack_slots_counted` those of
  :mod:`replaybank.ops.stack_numba`. Each is one call into C per batch: nothing is
  compiled or loaded on first use, so the first ``sample_sequences`` or frame-stack
  ``sample`` of a process does not import numba.

Every C function checks all of its arguments before it writes anything and raises
(TypeError, ValueError, IndexError) instead of reading or writing out of bounds.
Importing this module raises ImportError where the extension was not built (no C
compiler at install); :func:`replaybank.ops.jit.pick_kernel` then takes the numba (or
numpy) twin. ``REPLAYBANK_PURE_PYTHON=1`` leaves it out too.

Example:
    >>> import numpy as np
    >>> src = np.arange(12, dtype=np.float32).reshape(6, 2)
    >>> out = np.empty((2, 2, 2), np.float32)
    >>> take_rows(((src, np.array([[5, 0], [1, 1]]), out),))
    >>> out[:, :, 0].tolist()
    [[10.0, 0.0], [2.0, 2.0]]
    >>> link = np.zeros((4, 1), np.int32); link[1, 0] = 1
    >>> window_extent(link, np.array([4]), np.array([4]), np.array([0, 2]), 3, False).tolist()
    [2, 2]
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops.windows import FLAG_NAMES, StackBuffers, stack_buffers

# the C extension (ImportError where it was not built); loaded by name, as a module of
# this layer: the package root above it is not imported for it
_windows: Any = importlib.import_module("replaybank._windows")

__all__ = ["FLAG_NAMES", "draw_plan", "draw_plan_into", "draw_take", "draw_windows",
           "sequence_plan", "stack_buffers",
           "stack_plan", "stack_slots", "stack_slots_counted", "sync_boundaries",
           "nstep_windows", "take_rows", "take_steps", "window_extent", "window_plan"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


#: ``take_rows(jobs)``: ``out[i] = src[idx[i]]`` for every ``(src, idx, out)`` of the
#: tuple ``jobs``, and the obs/next_obs windows of every window pair ``(src, idx, out,
#: next)`` (same contract as :func:`replaybank.ops.windows.take_rows`).
take_rows: Any = _windows.take_rows

#: ``take_steps(slots, lanes, link, fields, nexts[, base[, keys]]) -> n_side``: every field
#: of a batch of steps and each observation field's next observation in one call (same
#: contract as
#: :func:`replaybank.ops.windows.take_steps`).
take_steps: Any = _windows.take_steps

#: ``nstep_windows(slots, lanes, link, weights, rewards, last, length, returns)``: the
#: n-step windows of a batch in one call (same contract as
#: :func:`replaybank.ops.nstep.nstep_windows`).
nstep_windows: Any = _windows.nstep

#: ``draw_plan_into(link, bounds, written, counts, flat, cross, min_len, keys, ext, term,
#: trunc, width, burn_in, slots, steps, flags, side) -> (n_valid, n_side, tail_only)``:
#: :func:`draw_plan` into the caller's arrays (same contract as
#: :func:`replaybank.ops.windows_numba.draw_plan_into`; int64 counters and draws only).
draw_plan_into: Any = _windows.draw_plan

#: ``draw_take(link, bounds, written, counts, flat, cross, min_len, keys, ext, term, trunc,
#: width, burn_in, slots, steps, flags, side, fields, obs) -> (n_valid, n_side,
#: tail_only)``: :func:`draw_plan_into`, then the rows of the planned windows (same
#: contract as :func:`replaybank.ops.windows_numba.draw_take`).
draw_take: Any = _windows.draw_take

_extent = _windows.extent
_draw = _windows.draw
_plan = _windows.plan
_sync = _windows.sync
_window_plan = _windows.window_plan
_stack = _windows.stack


def _i64(a: Any) -> IntArray:
    """``a`` as a C-contiguous int64 array (itself when it is one)."""
    if type(a) is np.ndarray and a.dtype == np.int64 and a.flags.c_contiguous:
        return a
    return np.ascontiguousarray(a, dtype=np.int64)


def window_extent(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                  keys: IntArray, width: int, cross: bool,
                  bounds: npt.NDArray[np.uint8] | None = None) -> IntArray:
    """Same contract as :func:`replaybank.ops.windows.window_extent`; ``bounds`` as in
    :func:`draw_plan` (the lane-major ``link != 0`` bytes, read instead of ``link``).

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[1, 0] = 1
        >>> window_extent(link, np.array([4]), np.array([4]), np.array([0, -1]), 3,
        ...               True).tolist()
        [3, 0]
    """
    keys = _i64(keys)
    out = np.empty(keys.shape[0], np.int64)
    _extent(link, bounds, _i64(written), _i64(counts), keys, int(width), bool(cross), out)
    return out


def draw_windows(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                 flat: IntArray, width: int, cross: bool, min_len: int,
                 batch_size: int) -> tuple[IntArray, IntArray, int]:
    """Same contract as :func:`replaybank.ops.windows_numba.draw_windows`: uniform draws
    ``flat`` ``[m]`` mapped to window starts, the first ``batch_size`` valid ones kept.

    Example:
        >>> link = np.zeros((4, 2), np.int32); link[1, 0] = 1
        >>> keys, ext, n = draw_windows(link, np.array([4, 4]), np.array([4, 4]),
        ...                             np.array([0, 1, 4, 6]), 2, False, 2, 2)
        >>> keys.tolist(), ext.tolist(), n
        ([0, 1], [2, 2], 2)
    """
    keys = np.empty(batch_size, np.int64)
    ext = np.empty(batch_size, np.int64)
    n = _draw(link, None, _i64(written), _i64(counts), _i64(flat), int(width), bool(cross),
              int(min_len), keys, ext)
    return keys, ext, int(n)


def sequence_plan(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                  term: BoolArray, trunc: BoolArray, keys: IntArray, ext: IntArray,
                  width: int, burn_in: int, bounds: npt.NDArray[np.uint8] | None = None
                  ) -> tuple[IntArray, IntArray, dict[str, BoolArray], IntArray, bool]:
    """Same contract as :func:`replaybank.ops.windows_numba.sequence_plan`.

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[[1, 3], 0] = 1
        >>> z = np.zeros(4, bool)
        >>> slots, _, fl, side, tail = sequence_plan(link, np.array([4]), np.array([4]), z,
        ...                                          z, np.array([0]), np.array([2]), 2, 0)
        >>> slots.tolist(), fl["is_last"].tolist(), side.tolist(), tail
        ([[0, 1, 2]], [[False, True]], [[0, 1, 0]], True)
    """
    keys = _i64(keys)
    nb = keys.shape[0]
    slots = np.empty((nb, width + 1), np.int64)
    steps = np.empty((nb, width), np.int64)
    flags = np.empty((7, nb, width), np.bool_)
    side = np.empty((nb * width, 3), np.int64)
    n, tail = _plan(link, bounds, _i64(written), _i64(counts), keys, _i64(ext), term, trunc,
                    int(width), int(burn_in), slots, steps, flags, side)
    return slots, steps, {name: flags[i] for i, name in enumerate(FLAG_NAMES)}, side[:n], bool(tail)


def draw_plan(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
              flat: IntArray, width: int, cross: bool, min_len: int, batch_size: int,
              term: BoolArray, trunc: BoolArray, burn_in: int,
              bounds: npt.NDArray[np.uint8] | None = None) -> tuple[
                  IntArray, IntArray, int,
                  tuple[IntArray, IntArray, BoolArray, IntArray, bool] | None]:
    """Same contract as :func:`replaybank.ops.windows_numba.draw_plan`: the draw of
    :func:`draw_windows`, then (when ``batch_size`` draws were valid) the plan of
    :func:`sequence_plan` with ``flags`` one ``[7, B, W]`` array, in one C call.

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
    args = (bool(cross), int(min_len), keys, ext, term, trunc, int(width), int(burn_in),
            slots, steps, flags, side)
    try:  # the table's counters and a draw are int64 arrays already: no conversion
        n, n_side, tail = draw_plan_into(link, bounds, written, counts, flat, *args)
    except TypeError:  # another sequence or dtype: converted (C checks before writing)
        n, n_side, tail = draw_plan_into(link, bounds, _i64(written), _i64(counts),
                                         _i64(flat), *args)
    if n_side < 0:
        return keys, ext, n, None
    return keys, ext, n, (slots, steps, flags, side[:n_side], tail)


def sync_boundaries(link: npt.NDArray[np.int32], written: IntArray, seen: IntArray,
                    bounds: npt.NDArray[np.uint8]) -> None:
    """Same contract as :func:`replaybank.ops.windows_numba.sync_boundaries`.

    Example:
        >>> link = np.zeros((4, 2), np.int32); link[2, 0] = 3
        >>> bounds = np.zeros((2, 4), np.uint8); seen = np.full(2, 2**62)
        >>> sync_boundaries(link, np.array([3, 3]), seen, bounds)
        >>> bounds.tolist(), seen.tolist()
        ([[0, 0, 1, 0], [0, 0, 0, 0]], [3, 3])
    """
    try:  # the table's counter is an int64 array already: no conversion
        _sync(link, written, seen, bounds)
    except TypeError:  # another sequence or dtype: converted (C checks before writing)
        _sync(link, _i64(written), seen, bounds)


def window_plan(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                keys: IntArray, width: int) -> tuple[IntArray, npt.NDArray[np.int32],
                                                     BoolArray, BoolArray]:
    """Same contract as :func:`replaybank.ops.windows.window_plan`.

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[[1, 3], 0] = 1
        >>> slots, lk, ends, first = window_plan(link, np.array([4]), np.array([4]),
        ...                                      np.array([0, 2]), 2)
        >>> slots.tolist(), ends.tolist(), first.tolist()
        ([[0, 1, 2], [2, 3, 0]], [[False, True], [False, False]], [True, True])
    """
    keys = _i64(keys)
    n = keys.shape[0]
    slots = np.empty((n, width + 1), dtype=np.int64)
    lk = np.empty((n, width), dtype=np.int32)
    ends = np.empty((n, width), dtype=np.bool_)
    first = np.empty(n, dtype=np.bool_)
    _window_plan(link, _i64(written), _i64(counts), keys, int(width), slots, lk, ends, first)
    return slots, lk, ends, first


def stack_plan(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
               cleared: IntArray, keys: IntArray, k: int,
               buffers: StackBuffers | None = None) -> tuple[
                   IntArray, IntArray, IntArray, BoolArray | None, int, int]:
    """Same contract as :func:`replaybank.ops.stack_numba.stack_plan`: ``(slots, side,
    step, ok, n_not_ok, n_side)`` of the frame stacks of ``keys`` (``ok`` None when all
    are True), in ``buffers`` from :func:`~replaybank.ops.windows.stack_buffers` when
    their size fits.

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[3, 0] = 1
        >>> stack_plan(link, np.array([4]), np.array([4]), np.array([0]), np.array([1, 3]),
        ...            2)[2].tolist()
        [1, 3]
    """
    keys = _i64(keys)
    if buffers is None or buffers[1].shape != (keys.shape[0], k + 1):
        buffers = stack_buffers(keys.shape[0], k)
    flat, slots, side, ok, step = buffers
    n_bad, n_side = _stack(link, written, counts, cleared, keys, k, flat)
    return slots, side, step, ok != 0 if n_bad else None, n_bad, n_side


def stack_slots_counted(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                        cleared: IntArray, keys: IntArray, k: int) -> tuple[
                            IntArray, IntArray, BoolArray | None, int, int]:
    """Same contract as :func:`replaybank.ops.stack_numba.stack_slots_counted`.

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[3, 0] = 1
        >>> stack_slots_counted(link, np.array([4]), np.array([4]), np.array([0]),
        ...                     np.array([1, 3]), 2)[2:]
        (None, 0, 1)
    """
    slots, side, _, ok, n_bad, n_side = stack_plan(link, _i64(written), _i64(counts),
                                                   _i64(cleared), keys, int(k))
    return slots, side, ok, n_bad, n_side


def stack_slots(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                cleared: IntArray, keys: IntArray, k: int) -> tuple[IntArray, IntArray,
                                                                    BoolArray]:
    """Same contract as :func:`replaybank.ops.windows.stack_slots`.

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[3, 0] = 1
        >>> slots, side, ok = stack_slots(link, np.array([4]), np.array([4]), np.array([0]),
        ...                               np.array([1, 3]), 2)
        >>> slots.tolist(), side.tolist(), ok.tolist()
        ([[0, 1, 2], [2, 3, 0]], [-1, 0], [True, True])
    """
    slots, side, ok, _, _ = stack_slots_counted(link, written, counts, cleared, keys, k)
    return slots, side, np.ones(len(slots), np.bool_) if ok is None else ok
