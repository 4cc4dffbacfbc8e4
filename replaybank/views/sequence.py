"""Window gathers of :mod:`replaybank.buffers.sequences`: the numpy path (any backend)
and the fused path (numba slots and flags, numpy storage).

Observations: one ``[B, W + 1]`` gather serves ``obs`` (columns ``:W``) and
``next_obs`` (``1:``); where a step's next observation is kept aside (episode ends,
discontinuities, the newest step) it is patched into ``next_obs``, which is then its own
array (the fused path gathers each row once into both, a window pair of
:func:`~replaybank.ops.windows.take_rows`); otherwise both are read-only views of one
array. Each patched step's link is read again after the copy and the next row taken where
it changed: a writer in another process (shared memory) may relink the step and reuse its
side slot while the learner gathers (:mod:`replaybank.shared.lanes`, :func:`_relinked`).
"""

from __future__ import annotations

import operator
import sys
import threading
import weakref
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops import windows
from replaybank.views.base import next_name

__all__ = ["draw_gather", "fused_reads", "gather_fused", "gather_numpy"]

IntArray = npt.NDArray[np.int64]

#: Observation bytes of a window batch from which one fused row copy beats a take per field
#: (measured: 16 windows of 65 float32[64] rows, 266 KB, gain 2-3 %; 16 x 65 small rows lose
#: 10 % to the preallocation).
_FUSED_BYTES = 1 << 17


@cache
def _row_kernel() -> Any:
    """The row gather of every field of a batch (C where built, else numpy), loaded once."""
    return windows.row_kernel()[0]


@cache
def _plan_kernel() -> Any:
    """The window-plan kernel (numba when it imports, else numpy), loaded once."""
    return windows.kernel(windows.window_plan)[0]


class _FusedReads:
    """The flat ``[T * lanes, ...]`` views :func:`gather_fused` reads from one table with
    numpy storage and bool ``terminated``/``truncated``, built once (:func:`fused_reads`)."""

    __slots__ = ("arrays", "bounds", "epoch", "fields", "layouts", "lock", "obs",
                 "obs_row_bytes", "outs", "seen", "term", "trunc")

    def __init__(self, table: Any) -> None:
        arrays = table.arrays
        self.arrays = tuple(arrays.values())
        obs_fields = table.obs_fields
        self.fields = [(name, table.flat(arr)) for name, arr in arrays.items()
                       if name not in obs_fields and name != "terminated"
                       and name != "truncated"]
        self.obs = [(name, next_name(name), table.flat(arrays[name])) for name in obs_fields]
        #: Bytes of one row of every observation field (the bulk of a window batch).
        self.obs_row_bytes = sum(arr.nbytes // max(arr.shape[0], 1) for _, _, arr in self.obs)
        #: Per field and observation field: the row shape and dtype of its batch arrays.
        self.outs = ([(name, arr, arr.shape[1:], arr.dtype) for name, arr in self.fields],
                     [(name, nname, arr, arr.shape[1:], arr.dtype)
                      for name, nname, arr in self.obs])
        self.term = table.flat(arrays["terminated"])
        self.trunc = table.flat(arrays["truncated"])
        # link != 0, lane-major [lanes, T] (see boundaries); allocated at first use
        self.bounds: npt.NDArray[np.uint8] | None = None
        self.seen = np.full(table.lanes, _UNSEEN, np.int64)
        self.epoch = table.epoch
        #: Held while :meth:`boundaries` allocates and syncs ``bounds``, ``seen``, ``epoch``.
        self.lock = threading.Lock()
        #: Per ``(B, W)``: the :class:`_Layout` of such batches.
        self.layouts: dict[tuple[int, int], _Layout] = {}

    def layout(self, batch: int, width: int) -> _Layout:
        """The :class:`_Layout` of ``[batch, width]`` window batches (kept for the last
        few shapes asked for)."""
        lay = self.layouts.get((batch, width))
        if lay is None:
            if len(self.layouts) >= _LAYOUTS:
                self.layouts.clear()
            lay = self.layouts[(batch, width)] = _Layout(self, batch, width)
        return lay

    def boundaries(self, fast: Any, table: Any) -> npt.NDArray[np.uint8]:
        """``link != 0`` of ``table`` lane-major ``[lanes, T]``, brought up to date with
        the rows written since the last call (all of it after a clear or a state load,
        which bump ``table.epoch``).

        One thread at a time (``lock``): threads sampling one table share these bytes and
        ``seen``, the rows they are up to date with, and the sync runs without the GIL.
        Unlocked, a thread's sync could mark the rows seen in one array while a second
        thread's first call put a fresh zeroed one in its place: every later call then
        read no boundary (no window stopped at an episode end, and the newest step's next
        observation was taken from the unwritten row after it). The lock also orders each
        thread's reads after the bytes another thread's sync wrote.
        """
        lock = self.lock
        lock.acquire()  # not `with`: 0.1 us less per sample, most of the lock's cost
        try:
            if self.bounds is None:
                self.bounds = np.zeros((table.lanes, table.T), np.uint8)
            if table.epoch != self.epoch:
                self.seen[:] = _UNSEEN
                self.epoch = table.epoch
            fast.sync_boundaries(table.link, table.written, self.seen, self.bounds)
            return self.bounds
        finally:
            lock.release()


_UNSEEN = 2**62  # a "written" no lane reaches: the next sync recomputes the lane whole
_LAYOUTS = 8  # batch shapes whose layout a table keeps
_KEPT_WORK = 1 << 20  # bytes of a layout's working arrays kept between calls, per thread


class _Layout:
    """The arrays of ``[B, W]`` window batches of one table: each output's shape and
    dtype, the observation bytes of a batch, and the plan's working arrays
    (``ext``, ``slots``, ``steps``, ``side``: never handed out), one set per thread."""

    __slots__ = ("batch", "fields", "local", "obs", "obs_bytes", "srcs", "width")

    def __init__(self, reads: _FusedReads, batch: int, width: int) -> None:
        self.batch, self.width = batch, width
        lead, lead1 = (batch, width), (batch, width + 1)
        fields, obs = reads.outs
        #: (name, source, [B, W, ...] shape, dtype) per field
        self.fields = [(name, arr, lead + row, dt) for name, arr, row, dt in fields]
        #: (name, next name, source, [B, W + 1, ...] shape, [B, W, ...] shape, dtype)
        self.obs = [(name, nname, arr, lead1 + row, lead + row, dt)
                    for name, nname, arr, row, dt in obs]
        #: The sources of the fields and of the observation fields, in those orders.
        self.srcs = (tuple(arr for _, arr, _, _ in fields),
                     tuple(arr for _, _, arr, _, _ in obs))
        #: Observation bytes of a batch (:data:`_FUSED_BYTES` decides the gather).
        self.obs_bytes = batch * (width + 1) * reads.obs_row_bytes
        self.local = threading.local()

    def work(self) -> tuple[IntArray, IntArray, IntArray, IntArray]:
        """This thread's ``(ext [B], slots [B, W + 1], steps [B, W], side [B * W, 3])``:
        kept between calls when they are small (:data:`_KEPT_WORK` bytes at most), new
        ones for a large batch (which would otherwise hold their memory)."""
        try:
            got: tuple[IntArray, IntArray, IntArray, IntArray] = self.local.work
        except AttributeError:
            b, w = self.batch, self.width
            got = (np.empty(b, np.int64), np.empty((b, w + 1), np.int64),
                   np.empty((b, w), np.int64), np.empty((b * w, 3), np.int64))
            if sum(a.nbytes for a in got) <= _KEPT_WORK:
                self.local.work = got
        return got


#: Per live table (weakly keyed: the views never keep a dropped table's arrays alive).
_READS: weakref.WeakKeyDictionary[Any, _FusedReads] = weakref.WeakKeyDictionary()


def fused_reads(table: Any) -> _FusedReads | None:
    """The :class:`_FusedReads` of ``table`` (cached per table and rebuilt when one of its
    arrays is replaced), or None when :func:`gather_fused` cannot serve it (another
    backend, non-bool flags).

    Example:
        >>> import numpy as np, replaybank as rb
        >>> buf = rb.ReplayBuffer(8, seed=0)
        >>> buf.add(obs=np.zeros(2, np.float32), action=0, reward=0.0,
        ...         next_obs=np.ones(2, np.float32), terminated=False, truncated=False)
        >>> r = fused_reads(buf.table)
        >>> [n for n, _ in r.fields], r is fused_reads(buf.table)
        (['action', 'reward'], True)
    """
    arrays = table.arrays
    r = _READS.get(table)
    if r is not None and len(arrays) == len(r.arrays) \
            and all(map(operator.is_, arrays.values(), r.arrays)):
        return r
    if not table.plain_numpy or "terminated" not in arrays \
            or "truncated" not in arrays or arrays["terminated"].dtype != np.bool_ \
            or arrays["truncated"].dtype != np.bool_:
        _READS.pop(table, None)
        return None
    r = _READS[table] = _FusedReads(table)
    return r


def _zeros(field: Any, n: int) -> npt.NDArray[Any]:
    return np.zeros((n, *field.shape), dtype=field.dtype)


def gather_fused(fast: Any, t: Any, starts: IntArray, ext: IntArray, width: int,
                 burn_in: int, full: bool = False, plan: Any = None,
                 reads: _FusedReads | None = None) -> dict[str, Any]:
    """:func:`gather_numpy` with slots, flags and side patches from one compiled pass.

    Args:
        fast: The :mod:`replaybank.ops.windows_numba` module (or its C twin).
        t: A step table with numpy storage and bool ``terminated``/``truncated``.
        starts: Window starts ``[B]`` (item keys).
        ext: Their extents ``[B]``.
        width: Window width ``W``.
        burn_in: Leading burn-in steps.
        full: Every extent is known to be ``W`` (skips the check).
        plan: The plan of ``starts`` from
            :func:`~replaybank.ops.windows_numba.draw_plan`, or None (computed here).
        reads: ``fused_reads(t)`` when the caller has it.

    Returns:
        The batch fields (as :func:`gather_numpy`).

    Example:
        >>> import numpy as np, replaybank as rb
        >>> from replaybank.ops import windows_numba
        >>> buf = rb.ReplayBuffer(8, seed=0)
        >>> for i in range(5):
        ...     buf.add(obs=np.full(1, i, np.float32), action=0, reward=0.0,
        ...             next_obs=np.full(1, i + 1, np.float32), terminated=False,
        ...             truncated=False)
        >>> out = gather_fused(windows_numba, buf.table, np.array([1]), np.array([3]), 3, 0)
        >>> out["obs"][0, :, 0].tolist(), out["next_obs"][0, :, 0].tolist()
        ([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])
    """
    if reads is None:
        reads = fused_reads(t)
        if reads is None:
            raise TypeError("gather_fused: needs numpy storage and bool terminated/truncated; "
                            "use gather_numpy")
    if plan is None:
        slots, steps, fl, side, tail_only = fast.sequence_plan(
            t.link, t.written, t.counts, reads.term, reads.trunc, starts, ext, width, burn_in,
            reads.boundaries(fast, t))
        flags = tuple(map(fl.__getitem__, windows.FLAG_NAMES))
    else:
        slots, steps, flags, side, tail_only = plan  # flags [7, B, W]: windows.FLAG_NAMES
    full = full or int(ext.min()) >= width
    return _gathered(t, reads.layout(len(starts), width), starts, ext, full, slots, steps,
                     flags, side, tail_only)


def draw_gather(fast: Any, t: Any, reads: _FusedReads, flat: IntArray, batch: int,
                width: int, cross: bool, min_len: int, burn_in: int
                ) -> tuple[dict[str, Any] | None, tuple[IntArray, IntArray] | None]:
    """The uniform draws ``flat`` mapped to window starts, checked, planned and gathered
    in one compiled call (``draw_take``).

    Args:
        fast: The :mod:`replaybank.ops.windows_numba` module (or its C twin).
        t: A step table with numpy storage and bool ``terminated``/``truncated``.
        reads: ``fused_reads(t)``.
        flat: Uniform draws over the live steps ``[M]``, ``M >= batch`` (int64).
        batch: Windows ``B``.
        width, cross, min_len, burn_in: As the request
            (:class:`~replaybank.samplers.windows.WindowRequest`).

    Returns:
        ``(out, None)``: the batch fields (as :func:`gather_fused`) when ``B`` draws were
        usable; else ``(None, (keys, ext))``, the usable starts first in ``keys`` and
        ``ext`` ``[B]``, the rest to redraw.

    Example:
        >>> import numpy as np, replaybank as rb
        >>> from replaybank.ops import windows_numba
        >>> buf = rb.ReplayBuffer(8, seed=0)
        >>> steps = np.arange(6, dtype=np.float32)[:, None]  # obs 0..4, each next one on
        >>> buf.extend(obs=steps[:-1], action=np.zeros(5, np.int64), reward=np.zeros(5),
        ...            next_obs=steps[1:], terminated=np.zeros(5, bool),
        ...            truncated=np.zeros(5, bool))
        >>> t = buf.table
        >>> out, _ = draw_gather(windows_numba, t, fused_reads(t), np.array([1, 4]), 1, 3,
        ...                      False, 3, 0)
        >>> out["starts"].tolist(), out["obs"][0, :, 0].tolist()
        ([1], [1.0, 2.0, 3.0])
    """
    lay = reads.layout(batch, width)
    ext, slots, steps, side = lay.work()
    keys = np.empty(batch, np.int64)
    flags = np.empty((7, batch, width), np.bool_)  # [7, B, W]: windows.FLAG_NAMES
    outs = [np.empty(shape, dt) for _, _, shape, dt in lay.fields]  # [B, W, ...]
    gs = [np.empty(shape1, dt) for _, _, _, shape1, _, dt in lay.obs]  # [B, W + 1, ...]
    fields, obs = lay.srcs
    _, n_side, tail_only = fast.draw_take(
        t.link, reads.boundaries(fast, t), t.written, t.counts, flat, cross, min_len, keys,
        ext, reads.term, reads.trunc, width, burn_in, slots, steps, flags, side,
        tuple(zip(fields, outs)), tuple(zip(obs, gs)))  # noqa: B905 - one each
    if n_side < 0:
        return None, (keys, ext.copy())
    return _gathered(t, lay, keys, ext, min_len >= width or int(ext.min()) >= width, slots,
                     steps, flags, side[:n_side], tail_only, (outs, gs)), None


def _gathered(t: Any, lay: _Layout, starts: IntArray, ext: IntArray, full: bool,
              slots: IntArray, steps: IntArray, flags: Any, side: IntArray,
              tail_only: bool, taken: Any = None) -> dict[str, Any]:
    """The fields of planned windows (:func:`gather_fused`); ``flags`` is ``[7, B, W]``
    (an array, or a tuple of its rows), rows in the order of ``windows.FLAG_NAMES``.
    ``taken``: the rows already gathered (:func:`draw_gather`), ``[B, W, ...]`` per field
    and ``[B, W + 1, ...]`` per observation field, in the layout's orders."""
    width = lay.width
    # windows cut short (few per batch): (b, extent), zeroed by slices, cheaper than one
    # fancy-indexed assignment per field
    short = [] if full else [(b, e) for b, e in enumerate(ext.tolist()) if e < width]
    # obs and next_obs are views of one [B, W + 1] gather unless a next observation kept
    # aside inside a window (or a window cut short) makes them differ
    n_side = len(side)
    shared = not short and (n_side == 0 or tail_only)
    out: dict[str, Any] = {}
    pairs: list[tuple[Any, Any]] = []  # per observation field: ([B, W + 1], None) when
    # shared, else (obs, next_obs) [B, W, ...]
    if taken is not None:
        outs, gs = taken
        for (name, _, _, _), g in zip(lay.fields, outs):  # noqa: B905 - one each
            out[name] = g
        for g in gs:
            pairs.append((g, None) if shared else (g[:, :width], g[:, 1:].copy()))
    elif lay.obs_bytes >= _FUSED_BYTES:
        # a large batch: every field of every window in one C call (rows prefetched, no
        # GIL), a few per cent under one take per field
        jobs: list[tuple[Any, ...]] = []
        for name, arr, shape, dt in lay.fields:
            out[name] = g = np.empty(shape, dt)  # [B, W, ...]
            jobs.append((arr, steps, g))
        for _, _, arr, shape1, shape, dt in lay.obs:
            if shared:
                g = np.empty(shape1, dt)  # [B, W + 1, ...]
                jobs.append((arr, slots, g))
                pairs.append((g, None))
            else:  # a window pair: each row read once and stored in obs and next_obs
                o = np.empty(shape, dt)
                x = np.empty(shape, dt)
                jobs.append((arr, slots, o, x))
                pairs.append((o, x))
        _row_kernel()(tuple(jobs))
    else:  # a small one: one take per field costs less Python than preallocating
        for name, arr, _, _ in lay.fields:
            out[name] = arr.take(steps, axis=0)  # [B, W, *shape]
        for _, _, arr, _, _, _ in lay.obs:
            g = arr.take(slots, axis=0)  # [B, W + 1, *shape]
            pairs.append((g, None) if shared else (g[:, :width], g[:, 1:].copy()))
    for b, e in short:
        for name, _, _, _ in lay.fields:
            out[name][b, e:] = 0
    link = t.link
    for (name, nname, src, _, _, _), (obs, nxt) in zip(lay.obs, pairs):  # noqa: B905 - one each
        kept = t.side.arrays[name] if n_side else None
        if nxt is None:  # obs and next_obs share memory: hand them out read-only
            if n_side:  # patches at window ends only (tail_only)
                _patch(obs[:, 1:], side, kept, link, steps, slots, src)
            obs.flags.writeable = False  # the views below inherit it
            obs, nxt = obs[:, :width], obs[:, 1:]
        else:
            if n_side:
                _patch(nxt, side, kept, link, steps, slots, src)
            for b, e in short:
                obs[b, e:] = 0
                nxt[b, e:] = 0
        out[name] = obs
        out[nname] = nxt
    # indexed, not unpacked: unpacking iterates an ndarray until its IndexError, an
    # exception formatted on every call
    out["terminated"] = flags[5]
    out["truncated"] = flags[6]
    out["is_first"] = flags[0]
    out["is_last"] = flags[1]
    out["is_terminal"] = flags[2]
    out["mask"] = flags[3]
    out["burn_in"] = flags[4]
    out["starts"] = starts
    return out


def _patch(nxt: Any, side: IntArray, kept: Any, link: npt.NDArray[np.int32],
           steps: IntArray, slots: IntArray, src: Any) -> None:
    """``nxt[b, j] = kept[slot]`` for each side row ``(b, j, slot)``; then each side row's
    link read again, and ``nxt[b, j] = src[slots[b, j + 1]]`` (the next row) where
    :func:`_relinked` finds it changed.

    Args:
        nxt: One observation field's next observations ``[B, W, ...]``.
        side: The side rows of the plan ``[n, 3]``.
        kept: That field's side store.
        link: The table's links ``[T, lanes]``.
        steps: The window steps' slots ``[B, W]``.
        slots: The plan's slots ``[B, W + 1]`` (each step's next row at ``j + 1``).
        src: That field's flat rows ``[T * lanes, ...]``.
    """
    if len(side) > 8:
        nxt[side[:, 0], side[:, 1]] = kept.take(side[:, 2], axis=0)
        moved = _relinked(link, steps, side)
    else:  # a few patches (usually at most one per window end): row by row
        moved = []
        for i, (b, j, v) in enumerate(side.tolist()):
            nxt[b, j] = kept[v]
            if v < 0 or link.item(steps.item(b, j)) != v + 1:  # as _relinked
                moved.append(i)
    if moved:
        _take_next(moved, side, slots, [src], [nxt])


def _relinked(link: npt.NDArray[np.int32], steps: IntArray, side: IntArray) -> list[int]:
    """The side rows ``(b, j, slot)`` (``side`` ``[n, 3]``) whose step (slot
    ``steps[b, j]``) no longer links side slot ``slot``, read after the side rows were
    copied.

    A table written by another process (shared memory) changes one kind of link while a
    learner reads: a writer relinks its previous newest step (``k -> 0``: its next
    observation is now the next row, committed first) and may reuse the freed slot at
    once, so a side row copied after the plan read the link may hold another step's
    data. A slot of -1 is such a relink seen by the plan itself (its boundary bytes,
    :meth:`_FusedReads.boundaries`, follow ``written``, which a relink does not move).
    In one process links never change during a gather: always empty.

    Args:
        link: The table's links ``[T, lanes]`` (side slot + 1, or 0).
        steps: The window steps' slots ``[B, W]`` (or the plan's ``[B, W + 1]`` slots).
        side: The side rows of the plan ``[n, 3]``.

    Returns:
        Positions in ``side`` of the steps to take from the next row instead.
    """
    now = link.reshape(-1).take(steps[side[:, 0], side[:, 1]])
    slot = side[:, 2]
    moved: list[int] = np.flatnonzero((now != slot + 1) | (slot < 0)).tolist()
    return moved


def _take_next(moved: list[int], side: IntArray, slots: IntArray, srcs: list[Any],
               nexts: list[Any]) -> None:
    """``nxt[b, j] = src[slots[b, j + 1]]`` (the next row) for the side rows ``side[i]``
    ``= (b, j, slot)``, ``i`` in ``moved``, and each ``(src, nxt)`` of ``srcs`` (flat
    ``[T * lanes, ...]`` observation fields) and ``nexts`` (their ``[B, W, ...]`` next
    observations): the steps :func:`_relinked` found relinked, whose next observation is
    the next row's (committed before the relink)."""
    for i in moved:
        b, j = int(side[i, 0]), int(side[i, 1])
        nxt_slot = int(slots[b, j + 1])
        for src, nxt in zip(srcs, nexts):  # noqa: B905 - one each
            nxt[b, j] = src[nxt_slot]


def gather_numpy(t: Any, starts: IntArray, ext: IntArray, width: int,
                 burn_in: int) -> dict[str, Any]:
    """Every field of the windows ``[B, W, ...]``, flags, masks and ``starts`` (any backend).

    Args:
        t: A step table.
        starts: Window starts ``[B]`` (item keys, live).
        ext: Their extents ``[B]``: steps past them are zero-padded and masked.
        width: Window width ``W``.
        burn_in: Leading burn-in steps.

    Returns:
        A dict of batch fields: stored fields and ``next_<obs>``, ``mask``, ``is_first``,
        ``is_last``, ``is_terminal``, ``burn_in`` and ``starts``.

    Example:
        >>> import numpy as np, replaybank as rb
        >>> buf = rb.ReplayBuffer(8, seed=0)
        >>> for i in range(5):
        ...     buf.add(obs=np.full(1, i, np.float32), action=0, reward=0.0,
        ...             next_obs=np.full(1, i + 1, np.float32), terminated=i == 2,
        ...             truncated=False)
        >>> out = gather_numpy(buf.table, np.array([1]), np.array([2]), 3, 0)
        >>> out["obs"][0, :, 0].tolist(), out["mask"][0].tolist()
        ([1.0, 2.0, 0.0], [True, True, False])
    """
    be = t.backend
    B = len(starts)  # noqa: N806
    plan = _plan_kernel()
    # slots of the W window steps plus the step after the last one [B, W + 1], their
    # links [B, W], real episode ends / discontinuities [B, W], is_first of the starts [B]
    slots, lk, ends, first0 = plan(t.link, t.written, t.counts, starts, width)
    full = bool(ext.min() >= width)
    valid = None if full else np.arange(width) < ext[:, None]  # [B, W]
    pad = None if valid is None else np.nonzero(~valid)
    cut = lk > 0
    out: dict[str, Any] = {}
    # each index in the backend's form once (device storage: one upload each, not one
    # per field); the steps are the slots' first W columns
    slots_at = be.index(slots)
    steps_at = slots_at[:, :width]
    pad_at = None if pad is None else tuple(be.index(p) for p in pad)
    n_pad = 0 if pad is None else len(pad[0])
    for name, arr in t.arrays.items():
        if name in t.obs_fields:
            continue
        g = be.gather(t.flat(arr), steps_at)  # [B, W, *shape]
        if pad_at is not None:
            be.write(g, pad_at, _zeros(t.spec[name], n_pad))
        out[name] = g
    # observations: one [B, W + 1] gather serves obs (columns :W) and next_obs (1:);
    # where a step's next observation is kept aside it is patched into next_obs
    side_pos = np.nonzero(cut if valid is None else cut & valid)
    shared = pad is None and t.plain_numpy and (
        len(side_pos[1]) == 0 or int(side_pos[1].min()) == width - 1)
    kept_at = None
    if len(side_pos[0]) and t.obs_fields:
        kept_at = (tuple(be.index(p) for p in side_pos), be.index(lk[side_pos] - 1))
    srcs, nexts = [], []
    for name in t.obs_fields:
        frames = t.flat(t.arrays[name])
        g = be.gather(frames, slots_at)  # [B, W + 1, *shape]
        nxt = g[:, 1:]
        if not shared:
            nxt = nxt.clone() if hasattr(nxt, "clone") else nxt.copy()  # torch or numpy
        if kept_at is not None:
            be.write(nxt, kept_at[0], be.gather(t.side.arrays[name], kept_at[1]))
        obs = g[:, :width]
        if pad_at is not None:
            zeros = _zeros(t.spec[name], n_pad)
            be.write(g, pad_at, zeros)
            be.write(nxt, pad_at, zeros)
        srcs.append(frames)
        nexts.append(nxt)
        out[name] = obs
        out[next_name(name)] = nxt
    if kept_at is not None and be.host_numpy:  # links read again (see _relinked): host
        # storage only, which another process may write (shared memory, memmap)
        side = np.stack((*side_pos, lk[side_pos].astype(np.int64) - 1), axis=1)
        moved = _relinked(t.link, slots, side)
        if moved:
            _take_next(moved, side, slots, srcs, nexts)
    if shared:  # obs and next_obs share memory: hand them out read-only
        for name in t.obs_fields:
            out[name].flags.writeable = False
            out[next_name(name)].flags.writeable = False
    if not be.host_numpy:  # device storage: the flags are computed where the data is
        out.update(_device_flags(out["terminated"], out["truncated"], first0, cut, ends,
                                 valid, burn_in))
        out["starts"] = starts
        return out
    term = np.asarray(be.to_numpy(out["terminated"]), dtype=bool)
    trunc = np.asarray(be.to_numpy(out["truncated"]), dtype=bool)
    first = np.empty((B, width), dtype=bool)
    first[:, 0] = first0
    first[:, 1:] = cut[:, :-1]
    last = term | trunc
    last |= ends
    burn = np.zeros((B, width), dtype=bool)
    burn[:, :burn_in] = True
    if valid is None:
        out["mask"] = ~burn
        out["is_terminal"] = term.copy()
    else:
        first &= valid
        last &= valid
        out["mask"] = valid & ~burn
        out["is_terminal"] = valid & term
    out["is_first"] = first
    out["is_last"] = last
    out["burn_in"] = burn
    out["starts"] = starts
    return out


def _device_flags(term: Any, trunc: Any, first0: npt.NDArray[np.bool_],
                  cut: npt.NDArray[np.bool_], ends: npt.NDArray[np.bool_],
                  valid: npt.NDArray[np.bool_] | None, burn_in: int) -> dict[str, Any]:
    """:func:`gather_numpy`'s flags for device storage: the host parts (from the links,
    ``[B, W]`` each) travel in one copy, the stored ``terminated``/``truncated`` tensors
    ``[B, W]`` never leave the device. Same values as the numpy path, as tensors on the
    data's device (torch storage imported torch already: taken from ``sys.modules``)."""
    torch = sys.modules["torch"]
    B, W = cut.shape  # noqa: N806
    host = np.zeros((4, B, W), dtype=bool)  # is_first, ends, burn-in, valid
    host[0, :, 0] = first0
    host[0, :, 1:] = cut[:, :-1]
    host[1] = ends
    host[2, :, :burn_in] = True
    host[3] = True if valid is None else valid
    if valid is not None:
        host[0] &= valid
    first, end, burn, ok = torch.from_numpy(host).to(term.device, non_blocking=True)
    t = term.bool()
    last = t | trunc.bool() | end
    if valid is None:
        return {"mask": ~burn, "is_terminal": t.clone(), "is_first": first, "is_last": last,
                "burn_in": burn}
    return {"mask": ok & ~burn, "is_terminal": ok & t, "is_first": first, "is_last": ok & last,
            "burn_in": burn}
