"""numba kernels of frame stacks: :func:`stack_slots` (the twin of
:func:`replaybank.ops.windows.stack_slots`, its oracle), :func:`stack_slots_counted`,
:func:`stack_plan` and :func:`stack_gather` (check, plan and copy the frames of sampled
stacks in one pass; its oracle is a numpy composition, see its docstring and
``tests/test_framestack.py``).

Importing this module raises ImportError when numba is missing;
:func:`replaybank.ops.windows.kernel` then falls back to numpy. Compiled once per
machine (``cache=True``).

Example:
    >>> import numpy as np
    >>> link = np.zeros((4, 1), np.int32); link[3, 0] = 1
    >>> slots, side, ok = stack_slots(link, np.array([4]), np.array([4]), np.array([0]),
    ...                               np.array([1, 3]), 2)
    >>> slots.tolist(), side.tolist(), ok.tolist()
    ([[0, 1, 2], [2, 3, 0]], [-1, 0], [True, True])
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
import numpy.typing as npt

from replaybank.ops.windows import StackBuffers, stack_buffers

__all__ = ["StackBuffers", "as_bytes", "stack_buffers", "stack_gather", "stack_plan",
           "stack_slots", "stack_slots_counted"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@numba.njit(cache=True, nogil=True)
def _stack(link, written, counts, cleared, keys, k, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    # out (flat, B * (k + 4)): slots [B, k + 1], then side [B], ok [B], step slot [B]
    T, lanes = link.shape  # noqa: N806
    nb = keys.shape[0]
    w = k + 1
    o_side = nb * w
    o_ok = o_side + nb
    o_step = o_ok + nb
    n_bad = 0
    n_side = 0
    for b in range(nb):
        seq = keys[b] // lanes
        lane = keys[b] % lanes
        lo = written[lane] - counts[lane]
        depth = 0
        good = 1
        for d in range(1, k):
            cand = seq - d
            if cand < lo:
                if cand >= cleared[lane]:  # it existed (not before the last clear): gone
                    good = 0
                break
            if link[cand % T, lane] != 0:
                break
            depth += 1
        base = b * w
        for c in range(k):
            back = k - 1 - c
            if back > depth:
                back = depth
            out[base + c] = ((seq - back) % T) * lanes + lane
        row = seq % T
        out[base + k] = ((row + 1) % T) * lanes + lane
        out[o_step + b] = row * lanes + lane
        v = link[row, lane]
        out[o_side + b] = v - 1
        out[o_ok + b] = good
        n_bad += 1 - good
        n_side += v > 0
    return n_bad, n_side


def stack_slots(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                cleared: IntArray, keys: IntArray, k: int) -> tuple[IntArray, IntArray,
                                                                    BoolArray]:
    """Same contract as :func:`replaybank.ops.windows.stack_slots`."""
    slots, side, ok, _, _ = stack_slots_counted(link, written, counts, cleared, keys, k)
    return slots, side, np.ones(len(slots), np.bool_) if ok is None else ok


def stack_plan(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
               cleared: IntArray, keys: IntArray, k: int,
               buffers: StackBuffers | None = None) -> tuple[
                   IntArray, IntArray, IntArray, BoolArray | None, int, int]:
    """:func:`stack_slots_counted` plus the steps' own slots, all in one buffer.

    Args:
        link: Next-observation links ``[T, lanes]`` (int32).
        written: Steps ever written per lane ``[lanes]`` (int64).
        counts: Live steps per lane ``[lanes]`` (int64).
        cleared: Each lane's first sequence number after its last clear ``[lanes]``
            (int64; see :func:`replaybank.ops.windows.history`).
        keys: Item keys ``[B]`` (int64).
        k: Frames per stack.
        buffers: Output buffers from :func:`stack_buffers` to fill (the results are
            their views, valid until the next call with them); None (or buffers of
            another size) allocates new ones.

    Returns:
        ``(slots, side, step, ok, n_not_ok, n_side)``: ``slots``, ``side`` and ``ok`` as
        :func:`stack_slots_counted` gives them, and ``step`` ``[B]``, the contiguous
        slots of the steps themselves (``slots[:, k - 1]``).

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[3, 0] = 1
        >>> stack_plan(link, np.array([4]), np.array([4]), np.array([0]), np.array([1, 3]),
        ...            2)[2].tolist()
        [1, 3]
    """
    if type(keys) is not np.ndarray or keys.dtype != np.int64:
        keys = np.asarray(keys, dtype=np.int64)
    if buffers is None or buffers[1].shape != (keys.shape[0], k + 1):
        buffers = stack_buffers(keys.shape[0], k)
    flat, slots, side, ok, step = buffers
    n_bad, n_side = _stack(link, written, counts, cleared, keys, k, flat)
    return slots, side, step, ok != 0 if n_bad else None, n_bad, n_side


@numba.njit(cache=True, nogil=True)
def _stack_gather(link, written, counts, cleared, keys, k, plan, frames, side_frames, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    # plan as _stack; frames [T * lanes, F] and side_frames [S, F] raw bytes; out [B, k + 1, F]
    n_bad = _stack(link, written, counts, cleared, keys, k, plan)[0]
    if n_bad:  # nothing is copied: the caller redraws
        return n_bad
    nb = keys.shape[0]
    w = k + 1
    o_side = nb * w
    f = frames.shape[1]
    n_kept = side_frames.shape[0]
    for b in range(nb):  # a link naming no side slot (a corrupt table): copy nothing
        if plan[o_side + b] >= n_kept:
            return -1
    for b in range(nb):
        base = b * w
        for c in range(k):
            s = plan[base + c]
            for j in range(f):
                out[b, c, j] = frames[s, j]
        v = plan[o_side + b]
        if v >= 0:  # the next observation was kept aside
            for j in range(f):
                out[b, k, j] = side_frames[v, j]
        else:
            s = plan[base + k]
            for j in range(f):
                out[b, k, j] = frames[s, j]
    return 0


def as_bytes(array: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    """A C-contiguous array ``[n, *shape]`` as its raw bytes ``[n, nbytes(shape)]`` (a view).

    Example:
        >>> as_bytes(np.zeros((3, 2), np.float32)).shape
        (3, 8)
    """
    if not array.flags.c_contiguous:
        raise ValueError(f"as_bytes: array of shape {array.shape} is not C-contiguous; "
                         "pass np.ascontiguousarray(array)")
    flat = array.reshape(array.shape[0], math.prod(array.shape[1:]))
    return flat if flat.dtype == np.uint8 else flat.view(np.uint8)


def stack_gather(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                 cleared: IntArray, keys: IntArray, k: int, frames: npt.NDArray[Any],
                 side_frames: npt.NDArray[Any],
                 buffers: StackBuffers | None = None) -> npt.NDArray[Any] | None:
    """Check, plan and gather the frame windows of ``keys`` in one pass.

    Its numpy oracle: ``slots, side, ok = windows.stack_slots(...)``; None unless ``ok``
    is all True, else ``frames[slots]`` with ``[b, k]`` replaced by
    ``side_frames[side[b]]`` where ``side[b] >= 0``.

    Args:
        link: Next-observation links ``[T, lanes]`` (int32).
        written: Steps ever written per lane ``[lanes]`` (int64).
        counts: Live steps per lane ``[lanes]`` (int64).
        cleared: Each lane's first sequence number after its last clear ``[lanes]``
            (int64; see :func:`replaybank.ops.windows.history`).
        keys: Item keys ``[B]`` (int64).
        k: Frames per stack.
        frames: The obs field by slot ``[T * lanes, *frame]`` (C-contiguous numpy).
        side_frames: The kept-aside next observations ``[S, *frame]`` (C-contiguous).
        buffers: Plan buffers from :func:`stack_buffers` (as :func:`stack_plan`); after
            the call they hold the plan of ``keys``.

    Returns:
        Windows ``[B, k + 1, *frame]`` (frames ``0..k-1`` the obs stack, ``1..k`` the
        next-obs stack), or None when some key's history is gone (nothing gathered).

    Raises:
        IndexError: ``link`` names a side slot past ``side_frames`` (nothing is read
            out of bounds).

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[3, 0] = 1
        >>> frames = np.arange(4, dtype=np.int16); side = np.array([9, 0], np.int16)
        >>> stack_gather(link, np.array([4]), np.array([4]), np.array([0]), np.array([1, 3]),
        ...              2, frames, side).tolist()
        [[0, 1, 2], [2, 3, 9]]
    """
    if type(keys) is not np.ndarray or keys.dtype != np.int64:
        keys = np.asarray(keys, dtype=np.int64)
    nb = keys.shape[0]
    if buffers is None or buffers[1].shape != (nb, k + 1):
        buffers = stack_buffers(nb, k)
    out = np.empty((nb, k + 1, *frames.shape[1:]), dtype=frames.dtype)
    raw = out.reshape(nb, k + 1, math.prod(frames.shape[1:]))
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    rc = _stack_gather(link, written, counts, cleared, keys, int(k), buffers[0],
                       as_bytes(frames), as_bytes(side_frames), raw)
    if rc < 0:
        raise IndexError(f"stack_gather: link names a side slot past the {len(side_frames)} "
                         "kept next observations; the table is corrupt")
    return None if rc else out


def stack_slots_counted(link: npt.NDArray[np.int32], written: IntArray, counts: IntArray,
                        cleared: IntArray, keys: IntArray, k: int) -> tuple[
                            IntArray, IntArray, BoolArray | None, int, int]:
    """:func:`stack_slots` plus how many ``ok`` are False and how many ``side >= 0``.

    ``ok`` is None when it would be all True (the common case; saves an array op).

    Example:
        >>> link = np.zeros((4, 1), np.int32); link[3, 0] = 1
        >>> stack_slots_counted(link, np.array([4]), np.array([4]), np.array([0]),
        ...                     np.array([1, 3]), 2)[2:]
        (None, 0, 1)
    """
    slots, side, _, ok, n_bad, n_side = stack_plan(link, written, counts, cleared, keys,
                                                   int(k))
    return slots, side, ok, n_bad, n_side
