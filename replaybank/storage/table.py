"""The step table: fields in a lane-major ring, with each observation stored once.

Layout (see :mod:`replaybank.spec`): every field is an array ``[T, lanes, *shape]``
and the steps of one lane are contiguous in time (mod T). Lane bookkeeping
(``written``, ``counts``: see :mod:`replaybank.ops.ring`; ``cleared``, where each lane
began after its last :meth:`StepTable.clear`) and the next-observation links live in
small meta arrays beside the data.

Next observations are stored once. ``link[row, lane]`` says where the next observation
of a step is:

* ``0``: it is the observation of the next step of the same lane (the common case),
* ``k > 0``: it is side slot ``k - 1`` of the *final-observation store* ``side``. This is
  used when the episode ended at the step (terminated or truncated: the true final
  observation is kept, never the reset observation), when the caller's next add did not
  continue from it (out-of-order data), and for the newest step of each lane (pending:
  released as soon as the next add in that lane continues from it).

The side store grows on demand (doubling, capped at one slot per step), so sequential
data costs one observation per step plus a few slots per episode.

Write order keeps a persistent (``durable``) table consistent if the process dies
mid-write. Such a table also keeps ``start`` (per lane, the sequence number of its oldest
live step; ``counts == written - start``) in its files, and a table reopened from them
takes ``counts = written - start``: every single store then moves one end of a lane's
live window ``[start, written)``. Evicted steps leave first (``start`` advances; the
stored ``counts`` of a full lane stay ``T``, files written before ``start`` existed drop
them instead), then side slots, data and links are written outside the window, then
``written`` advances (the commit), then the previous newest step is relinked (a lane's
newest step always keeps its next observation aside), then ``counts`` and ``episodes``
follow. A write that evicts more than :attr:`StepTable.chunk` steps goes in chunks of at
most that many (a long ``extend`` never empties the window first). ``clear()`` empties
the window first (``start = written``), then records ``cleared = written``, so ``cleared
<= start`` holds at every instant (a clear cut short leaves the older ``cleared``: fewer
frame stacks served, never a wrong one). Files written before ``cleared`` existed get
its file (zeros: no clear recorded, as they read) at their first clear, before its
first store (:meth:`StepTable.keep_cleared`). So a process killed (even with SIGKILL) at any
instant leaves every step that a completed write stored (unless the interrupted write was
evicting it) and at most a complete prefix of the interrupted write. ``REPLAYBANK_KILL_AT``
(:mod:`replaybank.storage.writers.killpoint`) is the test hook that checks it.

Example:
    >>> import numpy as np
    >>> from replaybank.spec import Spec
    >>> spec = Spec.coerce({"obs": ((2,), "float32"), "reward": ((), "float32"),
    ...                     "terminated": ((), "bool"), "truncated": ((), "bool")})
    >>> t = StepTable(spec, T=4, lanes=1, obs_fields=["obs"])
    >>> obs = np.arange(6, dtype=np.float32).reshape(3, 1, 2)
    >>> nxt = np.arange(2, 8, dtype=np.float32).reshape(3, 1, 2)
    >>> flags = np.zeros((3, 1), bool)
    >>> from replaybank.storage.writers.reference import write
    >>> keys = write(t, np.array([0]), {"obs": obs, "reward": np.zeros((3, 1), np.float32),
    ...     "terminated": flags, "truncated": flags}, {"obs": nxt})
    >>> t.gather_next("obs", np.array([0, 1, 2]))[:, 1].tolist()
    [3.0, 5.0, 7.0]
    >>> t.side_in_use()  # only the newest step's next obs is kept aside
    1
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError
from replaybank.ops import ring, windows
from replaybank.spec import Spec
from replaybank.storage.backends.base import (
    ArrayBackend,
    GroupedBackend,
    MetaAddingBackend,
    SharedArrayBackend,
    check_fits,
)
from replaybank.storage.backends.numpy import NumpyBackend
from replaybank.storage.newest_steps import NewestSteps
from replaybank.storage.side_store import SideStore

__all__ = ["StepTable"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
_INT64 = np.dtype(np.int64)
#: Fields plus next observations one C gather takes (``MAXSTEPJOBS`` of _windows.c).
_MAX_STEP_JOBS = 48

#: Called before each store of :meth:`StepTable.clear` to durable storage: the crash
#: tests' kill-point hook, which :mod:`replaybank.storage.writers.killpoint` sets while it
#: is armed (the writers sit above this module and hand it down); None otherwise.
CLEAR_POINT: list[Callable[[], None] | None] = [None]


@dataclass(frozen=True)
class _StepJobs:
    """The one-call gather of a table's transitions (see :meth:`StepTable._read_plan`):
    the kernel (:func:`~replaybank.ops.windows.take_steps` or its C twin), the flat field
    arrays, the flat obs arrays with their names (their side arrays are looked up per
    call: the side store grows), each output's row shape and dtype, and the batch's keys
    in order (fields, then ``next_<obs field>``)."""

    kernel: Any
    srcs: tuple[Any, ...]
    next_srcs: tuple[Any, ...]
    next_names: tuple[str, ...]
    rows: tuple[tuple[tuple[int, ...], np.dtype[Any]], ...]
    keys: tuple[str, ...]
    #: ``[(B, ((B, *row shape), dtype) of each output)]`` of the last batch size (one
    #: item, replaced whole)
    sized: list[Any] = field(default_factory=lambda: [(0, ())], compare=False, repr=False)
    #: :meth:`StepTable.gather_spans`' split of the outputs per ``(at_last, skip)``
    spans: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    def outputs(self, b: int) -> list[Any]:
        """New outputs ``[b, *row shape]`` of every field, then of every next obs."""
        n, shapes = self.sized[0]
        if n != b:
            shapes = tuple(((b, *shape), dt) for shape, dt in self.rows)
            self.sized[0] = (b, shapes)
        return [np.empty(shape, dt) for shape, dt in shapes]


#: :meth:`StepTable._read_plan`: the flat ``(name, field)`` pairs, the flat link and the
#: one-call gather's jobs.
ReadPlan = tuple[list[tuple[str, Any]], Any, _StepJobs]


@cache
def _steps_kernel() -> Any:
    """:func:`~replaybank.ops.windows.take_steps` in C where built, else in numpy."""
    return windows.kernel(windows.take_steps)[0]


class StepTable:
    """Ring storage of steps ``[T, lanes]`` with next-observation links.

    Args:
        spec: Stored fields (observations, actions, rewards, flags, extras).
        T: Rows per lane (``capacity // lanes``).
        lanes: Number of lanes (environments).
        obs_fields: Names of the observation fields whose next value is linked.
        backend: Where arrays live (default: in-memory numpy).
        check_memory: Compare the bytes needed with available memory first.
    """

    def __init__(
        self,
        spec: Spec,
        T: int,  # noqa: N803
        lanes: int,
        obs_fields: Sequence[str],
        backend: ArrayBackend | None = None,
        check_memory: bool = True,
    ) -> None:
        self.spec = spec
        self.T = int(T)
        self.lanes = int(lanes)
        self.obs_fields = list(obs_fields)
        self.backend: ArrayBackend = backend if backend is not None else NumpyBackend()
        be = self.backend
        n_steps = self.T * self.lanes
        side0 = min(n_steps, max(4 * self.lanes, 64))
        if isinstance(be, SharedArrayBackend):  # mapped by other processes: never grows
            side0 = n_steps
        if check_memory and be.requires_memory():
            obs_bytes = sum(spec[n].nbytes for n in self.obs_fields)
            need = n_steps * (spec.nbytes_per_item + 4) + side0 * obs_bytes
            check_fits(need, f"replay storage ({n_steps:,} steps x {spec.nbytes_per_item} bytes)")
        shapes = {name: ((self.T, self.lanes, *f.shape), f.dtype) for name, f in spec.items()}
        # device storage packs fields of one dtype together (one gather per group)
        self.arrays: dict[str, Any] = be.allocate_fields(shapes) \
            if isinstance(be, GroupedBackend) else \
            {name: be.allocate(name, shape, dt) for name, (shape, dt) in shapes.items()}
        # bookkeeping (numpy, persistent with the data)
        self.written: IntArray = be.allocate_meta("written", (self.lanes,), np.dtype(np.int64))
        self.counts: IntArray = be.allocate_meta("counts", (self.lanes,), np.dtype(np.int64))
        self.episodes: IntArray = be.allocate_meta("episodes", (self.lanes,), np.dtype(np.int64))
        self.link: npt.NDArray[np.int32] = be.allocate_meta(
            "link", (self.T, self.lanes), np.dtype(np.int32)
        )
        #: Per lane, the sequence number of its first step after the last :meth:`clear`
        #: (``written`` then; 0 when never cleared), ``[lanes]``: the steps before it do
        #: not exist for history lookups (a frame stack pads there, as at a fresh
        #: buffer's first step), while live history lost after it was overwritten.
        #: Always ``<= written - counts``.
        self.cleared: IntArray
        #: Whether :attr:`cleared` lives where the data does (False: reopened files of an
        #: older version, until :meth:`keep_cleared` gives them the record).
        self.cleared_kept: bool
        self.cleared, self.cleared_kept = self._cleared_array()
        self.side = SideStore(spec, self.obs_fields, be, side0, n_steps)
        #: Device storage: each lane's newest done flag and next obs on the host, so that
        #: a write's continuity check reads no device data (None: arrays in host memory).
        self.tail: NewestSteps | None = None if be.host_numpy \
            else NewestSteps(spec, self.obs_fields, self.lanes)
        # storage that outlives the process orders its writes for crash safety
        self.durable = bool(be.durable)
        #: Durable tables: the sequence number of each lane's oldest live step, ``[lanes]``
        #: (None in memory, and for files written before it existed).
        self.start: IntArray | None = self._start_array() if self.durable else None
        #: Durable tables: the most steps of a lane one write chunk evicts.
        self.chunk = max(1, self.T // 4)
        # plain in-memory numpy arrays: the numpy fast reads apply
        self.plain_numpy = bool(be.host_numpy) and not self.durable
        self._flat_cache: dict[int, tuple[Any, Any]] = {}
        self._plan: tuple[tuple[Any, ...], Any] | None = None  # see _read_plan
        # bumped when links change other than by writes (clear, state load): structures
        # derived from link and kept current from the `written` counts start over
        self.epoch = 0

    # ------------------------------------------------------------------ sizes
    @property
    def size(self) -> int:
        """Live steps over all lanes."""
        return int(self.counts.sum())

    @property
    def side_capacity(self) -> int:
        """Allocated side slots."""
        return self.side.capacity

    def side_in_use(self) -> int:
        """Side slots holding a next observation."""
        return self.side.in_use()

    def _start_array(self) -> IntArray | None:
        """The durable ``start`` counters; reopened files give the truth of ``counts``
        (``written - start``: a process killed between the two stores of a commit left
        the stored ``counts`` stale). None for files written before ``start`` existed."""
        try:
            start: IntArray = self.backend.allocate_meta("start", (self.lanes,),
                                                         np.dtype(np.int64))
        except CheckpointError:  # reopened files of an older version: no start array
            return None
        live = np.clip(self.written - start, 0, np.minimum(self.written, self.T))
        if not np.array_equal(live, self.counts):
            self.counts[:] = live
        return start

    def _cleared_array(self) -> tuple[IntArray, bool]:
        """The ``cleared`` counters and whether they persist with the data: zeros in
        memory (False) for reopened files of an older version that have none (no clear
        recorded), until :meth:`keep_cleared` gives them the record."""
        try:
            cleared: IntArray = self.backend.allocate_meta("cleared", (self.lanes,),
                                                           np.dtype(np.int64))
        except CheckpointError:  # reopened files of an older version: no cleared array
            return np.zeros(self.lanes, dtype=np.int64), False
        return cleared, True

    def keep_cleared(self) -> None:
        """Make :attr:`cleared` persist with the data before a store changes it.

        Reopened files of an older version have no ``cleared`` record: a clear kept only
        in memory would be forgotten at the next reopen (whose frame stacks would then
        take the first steps after the clear for mid-episode steps and not serve them).
        A backend that can add arrays (:class:`~replaybank.storage.backends.base.
        MetaAddingBackend`) creates it here, zero-filled and complete before its files
        name it, then takes the values held in memory so far (valid for the counters
        stored now): a process killed at any instant leaves files that read as before or
        hold a valid record. Called by :meth:`clear` and by state loads; a no-op once
        kept, in memory, or where the backend cannot add arrays.

        Raises:
            ConfigError: The files are read-only here or closed (nothing is written).
            CapacityError: The disk has no room for the record (nothing changed).
        """
        if self.cleared_kept or not isinstance(self.backend, MetaAddingBackend):
            return
        point = CLEAR_POINT[0]
        if point is not None:
            point()
        kept: IntArray = self.backend.add_meta("cleared", (self.lanes,), _INT64)
        if self.cleared.any():
            kept[:] = self.cleared
        self.cleared = kept
        self.cleared_kept = True

    def rebuild_free_list(self) -> None:
        """Recompute free side slots from the links of live steps (after a load/reopen);
        a durable table's ``start`` is set from the counters first."""
        if self.start is not None:
            self.start[:] = self.written - self.counts
        used = np.zeros(self.side.capacity, dtype=bool)
        for lane in range(self.lanes):
            c, w = int(self.counts[lane]), int(self.written[lane])
            if c == 0:
                continue
            rows = np.arange(w - c, w) % self.T
            lk = self.link[rows, lane]
            used[lk[lk > 0] - 1] = True
        self.side.rebuild(used)

    def clear(self) -> None:
        """Drop every step (sequence numbers keep counting, so old keys turn stale) and
        record where each lane begins again (:attr:`cleared`): the steps before do not
        exist, as before a fresh table's first step.

        Raises:
            CapacityError: Files of an older version need the ``cleared`` record and
                the disk has no room for it (:meth:`keep_cleared`; nothing changed).
        """
        self.keep_cleared()  # old files: the record exists before the first store
        point = CLEAR_POINT[0] if self.durable else None
        if self.start is not None:  # durable: the window empties first
            if point is not None:
                point()
            self.start[:] = self.written
        if point is not None:
            point()
        self.counts[:] = 0
        if point is not None:
            point()
        self.link[:] = 0
        if point is not None:
            point()
        self.cleared[:] = self.written  # after the window emptied: cleared <= start
        self.epoch += 1
        self.side.reset()

    # ------------------------------------------------------------------ read
    def rows_lanes(self, keys: IntArray) -> tuple[IntArray, IntArray]:
        """Storage coordinates (row, lane) of item keys."""
        seq, lane = ring.key_to_seq(keys, self.lanes)
        return seq % self.T, lane

    def gather(self, name: str, keys: IntArray) -> Any:
        """Field ``name`` of the steps ``keys``: ``[B, *shape]``."""
        return self.backend.gather(self.arrays[name], self.rows_lanes(keys))

    def gather_next(self, name: str, keys: IntArray) -> Any:
        """Next observation (obs field ``name``) of the steps ``keys``: ``[B, *shape]``.

        Exactly the ``next_obs`` the caller passed for each step: the next slot of its
        lane, unless its link points into the side store (an episode end, a
        discontinuity, the newest step of the lane).

        Example:
            >>> from replaybank.storage.writers.reference import write
            >>> t = StepTable(Spec.coerce({"obs": ((), "int64"), "terminated": ((), "bool"),
            ...                            "truncated": ((), "bool")}), T=4, lanes=1,
            ...               obs_fields=["obs"])
            >>> no, end = np.zeros((2, 1), bool), np.array([[True], [False]])
            >>> _ = write(t, np.array([0]), {"obs": np.array([[1], [5]]), "terminated": end,
            ...             "truncated": no}, {"obs": np.array([[2], [6]])})
            >>> keys = np.array([0, 1])
            >>> t.gather("obs", keys).tolist(), t.gather_next("obs", keys).tolist()
            ([1, 5], [2, 6])
            >>> t.is_boundary(keys).tolist()  # an episode end, then the newest step
            [True, True]
        """
        return self.take_next(name, *self.next_index(self.slots_of(keys)))

    # flat-slot reads: one fancy index on axis 0 of a [T * lanes, *shape] view

    def slots_of(self, keys: IntArray) -> IntArray:
        """Storage slots (``row * lanes + lane``) of item keys, ``[B]``."""
        keys = np.asarray(keys, dtype=np.int64)
        L = self.lanes  # noqa: N806
        if L == 1:
            return keys % self.T
        return ring.key_to_slot(keys, self.T, L)

    def take(self, name: str, slots: IntArray) -> Any:
        """Field ``name`` at storage ``slots``: ``[B, *shape]``."""
        return self.backend.gather(self.flat(self.arrays[name]), slots)

    def next_index(self, slots: IntArray) -> tuple[IntArray, IntArray, IntArray]:
        """Where the next observations of ``slots`` live.

        Returns:
            ``(next_slots [B], pos [k], side_slots [k])``: the next step's slot for every
            item, and for the ``k`` items whose next observation is kept aside, their
            positions in the batch and their side slots.
        """
        nxt = (slots + self.lanes) % (self.T * self.lanes)
        lk = self.flat(self.link)[slots]
        pos = lk.nonzero()[0]
        return nxt, pos, lk[pos].astype(np.int64) - 1

    def take_next(self, name: str, nxt: IntArray, pos: IntArray,
                  side: IntArray) -> Any:
        """Next observations from :meth:`next_index`'s result: ``[B, *shape]``."""
        be = self.backend
        out = be.gather(self.flat(self.arrays[name]), nxt)
        if len(pos):
            be.write(out, pos, be.gather(self.side.arrays[name], side))
        return out

    def gather_transitions(self, keys: IntArray, live: bool = False) -> dict[str, Any]:
        """Every field of the steps ``keys`` plus ``next_<obs field>``, each ``[B, *shape]``.

        The same as :meth:`take` for every field and :meth:`take_next` for every obs field
        (exactly the ``next_obs`` the caller passed), in one pass: in-memory numpy storage
        gathers every field and next observation with one call of
        :func:`~replaybank.ops.windows.take_steps` (C where built).

        Args:
            keys: Item keys ``[B]``.
            live: The keys are known to be live (just drawn by a sampler): a one-lane
                table then finds their slots without a modulo.

        Returns:
            ``{name: [B, *shape]}`` for the stored fields, then ``next_<obs field>``.

        Example:
            >>> import numpy as np
            >>> from replaybank.spec import Spec
            >>> from replaybank.storage.table import StepTable
            >>> t = StepTable(Spec.coerce({"obs": ((), "int64"), "terminated": ((), "bool"),
            ...                            "truncated": ((), "bool")}), T=2, lanes=1,
            ...               obs_fields=["obs"])
            >>> no = np.zeros((3, 1), bool)
            >>> from replaybank.storage.writers.reference import write
            >>> _ = write(t, np.array([0]), {"obs": np.array([[5], [6], [7]]),
            ...             "terminated": no, "truncated": no}, {"obs": np.array([[6], [7], [8]])})
            >>> out = t.gather_transitions(np.array([1, 2]))
            >>> out["obs"].tolist(), out["next_obs"].tolist()
            ([6, 7], [7, 8])
        """
        T = self.T  # noqa: N806
        if not self.plain_numpy:
            slots = self.slots_of(keys)  # [B]
            out: dict[str, Any] = {name: self.take(name, slots) for name in self.arrays}
            where = self.next_index(slots)
            for name in self.obs_fields:
                out["next_" + name] = self.take_next(name, *where)
            return out
        base, by_key = 0, False
        if live and type(keys) is np.ndarray and keys.dtype is _INT64:
            slots = keys
            if self.lanes == 1:
                # the live keys lie in [oldest, written) inside [base, base + 2T) with base
                # the multiple of T at or below oldest: keys - base are slots up to one
                # wrap, which the gather subtracts and removes (cheaper than keys % T)
                oldest = self.written.item(0) - self.counts.item(0)
                base = oldest - oldest % T
            else:  # the gather finds each live key's slot itself (no slot array)
                by_key = True
        else:
            slots = self.slots_of(keys)  # [B]
        _, link, steps = self._read_plan()
        if not slots.flags.c_contiguous:
            slots = np.ascontiguousarray(slots)
        outs = steps.outputs(len(slots))
        # the jobs' tuples built by C iterators (no Python frame per job)
        steps.kernel(slots, self.lanes, link, tuple(zip(steps.srcs, outs, strict=False)),
                     tuple(zip(steps.next_srcs,
                               map(self.side.arrays.__getitem__, steps.next_names),
                               outs[len(steps.srcs):], strict=False)), base, by_key)
        return dict(zip(steps.keys, outs, strict=True))

    def gather_spans(self, first: IntArray, last: IntArray, at_last: frozenset[str],
                     skip: frozenset[str] = frozenset()) -> dict[str, Any]:
        """The fields of spans of steps: each field at ``first`` ``[B]`` storage slots,
        except the fields named in ``at_last`` (and the next observations), read at
        ``last`` ``[B]`` (an n-step transition: the first step's obs and action, the last
        step's flags and next obs). Fields in ``skip`` are left out.

        In-memory numpy storage gathers with two calls of
        :func:`~replaybank.ops.windows.take_steps` (C where built); other storage with
        :meth:`take` and :meth:`take_next`.

        Args:
            first: Storage slots of the spans' first steps ``[B]`` (:meth:`slots_of`).
            last: Storage slots of their last steps ``[B]``.
            at_last: Fields read at ``last``.
            skip: Fields not read.

        Returns:
            ``{name: [B, *shape]}`` in spec order, then ``next_<obs field>``.

        Example:
            >>> import numpy as np
            >>> from replaybank.spec import Spec
            >>> from replaybank.storage.writers.reference import write
            >>> t = StepTable(Spec.coerce({"obs": ((), "int64"), "terminated": ((), "bool"),
            ...                            "truncated": ((), "bool")}), T=4, lanes=1,
            ...               obs_fields=["obs"])
            >>> no = np.zeros((3, 1), bool)
            >>> _ = write(t, np.array([0]), {"obs": np.array([[5], [6], [7]]),
            ...             "terminated": no, "truncated": no}, {"obs": np.array([[6], [7], [8]])})
            >>> out = t.gather_spans(np.array([0]), np.array([2]), frozenset({"truncated"}))
            >>> out["obs"].tolist(), out["next_obs"].tolist()
            ([5], [8])
        """
        if not self.plain_numpy:
            out: dict[str, Any] = {name: self.take(name, last if name in at_last else first)
                                   for name in self.arrays if name not in skip}
            where = self.next_index(last)
            for name in self.obs_fields:
                out["next_" + name] = self.take_next(name, *where)
            return out
        _, link, steps = self._read_plan()
        split = steps.spans.get((at_last, skip))
        if split is None:  # which outputs each gather fills (kept per read plan)
            names = list(self.arrays)
            firsts = [i for i, n in enumerate(names) if n not in skip and n not in at_last]
            lasts = [i for i, n in enumerate(names) if n not in skip and n in at_last]
            kept = [i for i, n in enumerate(names) if n not in skip] + \
                list(range(len(names), len(steps.keys)))
            split = steps.spans[(at_last, skip)] = (
                tuple(steps.srcs[i] for i in firsts), firsts,
                tuple(steps.srcs[i] for i in lasts), lasts,
                tuple(steps.keys[i] for i in kept), kept)
        first_srcs, firsts, last_srcs, lasts, keys, kept = split
        outs = steps.outputs(len(first))
        nexts = tuple(zip(steps.next_srcs, map(self.side.arrays.__getitem__, steps.next_names),
                          outs[len(steps.srcs):], strict=True))
        steps.kernel(np.ascontiguousarray(first, dtype=np.int64), self.lanes, link,
                     tuple(zip(first_srcs, [outs[i] for i in firsts], strict=True)), ())
        steps.kernel(np.ascontiguousarray(last, dtype=np.int64), self.lanes, link,
                     tuple(zip(last_srcs, [outs[i] for i in lasts], strict=True)), nexts)
        return dict(zip(keys, [outs[i] for i in kept], strict=True))

    def take_fields(self, slots: IntArray, obs: bool = True) -> dict[str, Any]:
        """Every stored field at storage ``slots`` (the obs fields only when ``obs``).

        Args:
            slots: Storage slots ``[B]`` (see :meth:`slots_of`).
            obs: Include the observation fields.

        Returns:
            ``{name: [B, *shape]}`` in spec order.

        Example:
            >>> import numpy as np
            >>> from replaybank.spec import Spec
            >>> from replaybank.storage.table import StepTable
            >>> t = StepTable(Spec.coerce({"obs": ((), "int64"), "reward": ((), "float32")}),
            ...               T=4, lanes=1, obs_fields=["obs"])
            >>> sorted(t.take_fields(np.array([0, 1]), obs=False))
            ['reward']
        """
        if not self.plain_numpy:
            return {name: self.take(name, slots) for name in self.arrays
                    if obs or name not in self.obs_fields}
        fields = self._read_plan()[0]
        if obs:
            return {name: arr.take(slots, axis=0) for name, arr in fields}
        skip = self.obs_fields
        return {name: arr.take(slots, axis=0) for name, arr in fields if name not in skip}

    def _read_plan(self) -> ReadPlan:
        """Flat views of the fields and of ``link``, and the jobs of the one-call gather of
        :meth:`gather_transitions`, rebuilt when an array is replaced."""
        plan = self._plan
        if plan is not None and plan[0][-1] is self.link \
                and len(plan[0]) == len(self.arrays) + 1 \
                and all(map(operator.is_, self.arrays.values(), plan[0])):
            cached: ReadPlan = plan[1]
            return cached
        flat = self.flat
        fields = [(name, flat(arr)) for name, arr in self.arrays.items()]
        next_srcs = tuple(flat(self.arrays[name]) for name in self.obs_fields)
        srcs = [arr for _, arr in fields] + list(next_srcs)
        kernel = _steps_kernel()
        if any(arr.dtype.hasobject for arr in srcs) or len(srcs) > _MAX_STEP_JOBS:
            kernel = windows.take_steps  # the C kernel copies bytes: no objects
        steps = _StepJobs(
            kernel=kernel, srcs=tuple(arr for _, arr in fields), next_srcs=next_srcs,
            next_names=tuple(self.obs_fields),
            rows=tuple((arr.shape[1:], arr.dtype) for arr in srcs),
            keys=(*self.arrays, *("next_" + name for name in self.obs_fields)))
        body = (fields, flat(self.link), steps)
        self._plan = ((*self.arrays.values(), self.link), body)
        return body

    def is_boundary(self, keys: IntArray) -> BoolArray:
        """Whether the next observation of each step is kept aside (episode end,
        discontinuity, or newest step of its lane)."""
        rows, lanes = self.rows_lanes(keys)
        return np.asarray(self.link[rows, lanes] > 0)

    def flat(self, array: Any) -> Any:
        """``array`` ``[T, lanes, *shape]`` viewed as ``[T * lanes, *shape]`` (cached)."""
        cached = self._flat_cache.get(id(array))
        if cached is not None and cached[0] is array:
            return cached[1]
        view = array.reshape((self.T * self.lanes, *array.shape[2:]))
        self._flat_cache[id(array)] = (array, view)
        return view

    def __getstate__(self) -> dict[str, Any]:
        """Pickle support: the arrays and counters; views derived from them (flat views,
        the read plan) are rebuilt on use, since a pickled view is a copy."""
        state = self.__dict__.copy()
        state["_flat_cache"] = {}
        state["_plan"] = None
        return state

    def state_arrays(self) -> dict[str, npt.NDArray[Any]]:
        """Bookkeeping arrays by name (for checkpoints)."""
        return {"written": self.written, "counts": self.counts, "episodes": self.episodes,
                "link": self.link, "cleared": self.cleared}
