"""Lanes written by other processes: the learner's snapshot, and the writers' shares.

A shared buffer (:mod:`replaybank.shared.backend`) is written by collector
processes, each owning a set of lanes, and sampled by one learner. Nothing is locked.
Correctness rests on the write order every writer keeps (the crash-safe order of
durable storage, :mod:`replaybank.storage.table`), per lane:

1. ``start`` (the sequence number of the oldest live step) advances past the steps
   about to be overwritten;
2. side slots, data and links of the new steps are written;
3. ``written`` advances (the commit);
4. the previous newest step is relinked (its next observation is now the next row).

Writers' stores reach other processes in program order: the compiled writer puts a
release fence before each of them, and x86-64 keeps stores and loads in order (TSO).
(On weakly ordered CPUs such as ARM, numpy's reads carry no acquire fence; there the
validation below is what we rely on, and a torn read is not excluded in theory.)

**The learner's snapshot** (:class:`LaneSnapshot`). Before each sample the learner reads
each lane's ``written`` w, *then* its ``start`` s (so every step below w is complete and
none above s has been overwritten yet), and exposes to its samplers and views the window
``[s', w')`` as the lane's live steps, where

* ``s' = max(s, w - T + guard)``: near a full lane, the ``guard`` oldest steps are left
  out, so that a writer may evict up to ``guard`` more steps while the learner gathers
  without touching anything the learner reads;
* ``w' = w - 1`` when the newest step's next observation is still *pending* (kept aside
  until the lane's next step arrives, when its slot is freed and may be reused at once);
  ``w' = w`` when the newest step ended an episode (its final observation stays put).

After the gather the learner re-reads ``start``: if a writer evicted past ``s'`` in any
lane meanwhile (it outran the guard), the sample is drawn again from a fresh snapshot
(:meth:`LaneSnapshot.intact`). Inside ``[s', w')`` data rows change only after eviction
and a side slot only after the step holding it let go. One link may still change: a
writer relinks its previous newest step (``k -> 0``) after the next step's commit, so
the window's newest steps may be relinked while the learner gathers, and the freed slot
reused at once. The one-step and n-step gathers (``take_steps``), the frame-stack gathers
and the sequence gathers therefore read each side row's link again after copying it and
take the next row where it changed (the next observation is that row's, committed before
the relink). So a batch is exactly what a single-process buffer holding the window would
return (an n-step window, a stack's history or a sequence window may end at a step
relinked during the draw, as at a gap in the data), and a sampled step is always
complete. (A relink does not move ``written``: the sequence plans' boundary bytes, kept
per ``written``, may still mark a relinked step as keeping its next observation aside;
its link, read as 0, is taken as a relink too.)

**The writers' shares.** The side store has one slot per step, and lane ``l`` hands out
only slots ``[l * T, (l + 1) * T)`` (:func:`claim_side_slots`): a lane never holds more
aside than it has live steps, so writers never share a free list.

The window arithmetic is :func:`replaybank.shared.snapshot.advance` (with a numba twin).

Example:
    >>> default_guard(T=16)
    1
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from replaybank.errors import ConfigError
from replaybank.host import as_numpy
from replaybank.ops.jit import pick_kernel
from replaybank.shared import snapshot
from replaybank.storage.table import StepTable

__all__ = ["LaneSnapshot", "SnapshotDelta", "claim_side_slots", "default_guard"]

IntArray = npt.NDArray[np.int64]


def default_guard(T: int) -> int:  # noqa: N803
    """Steps left out at the old end of a full lane: ``min(1024, max(1, T // 16))``.

    Example:
        >>> default_guard(1000), default_guard(10**6)
        (62, 1024)
    """
    return int(min(1024, max(1, T // 16)))


class SnapshotDelta(NamedTuple):
    """What changed between two snapshots, for the sampler.

    Attributes:
        left: Storage slots whose steps left the window (evicted or under the guard),
            ``[k]``; their per-slot state (e.g. priority) must stop counting.
        new: Storage slots of steps that entered the window, oldest first, ``[n]``.
        priorities: Raw initial priorities of the new steps from their writers (NaN: none
            given), ``[n]``.
    """

    left: IntArray
    new: IntArray
    priorities: npt.NDArray[np.float64]


_NONE = np.zeros(0, np.int64)
_NO_PRIO = np.zeros(0, np.float64)
_NO_CHANGE = SnapshotDelta(_NONE, _NONE, _NO_PRIO)


class LaneSnapshot:
    """The owner's (learner's) consistent view of lanes written by other processes.

    Args:
        table: The owner's step table: its ``written`` / ``counts`` / ``episodes`` are
            local arrays this object refreshes; data, links and side store are shared.
        written: The shared ``written`` counters ``[lanes]``.
        start: The shared ``start`` counters ``[lanes]``.
        episodes: The shared episode counters ``[lanes]``.
        priority: The shared initial priorities ``[T, lanes]`` (NaN: none given).
        guard: Steps left out at the old end of a full lane (:func:`default_guard`).
        kernel: ``"auto"`` (numba when installed), ``"numba"`` or ``"numpy"``.
    """

    def __init__(self, table: StepTable, written: IntArray, start: IntArray,
                 episodes: IntArray, priority: npt.NDArray[np.float64],
                 guard: int | None = None, kernel: str = "auto") -> None:
        self.table = table
        self.shared_written, self.shared_start = written, start
        self.shared_episodes, self.priority = episodes, priority
        self.guard = default_guard(table.T) if guard is None else int(guard)
        if not 1 <= self.guard <= table.T:
            raise ConfigError(f"guard={guard}: must be in [1, T={table.T}] (steps left out "
                              "at the old end of a full lane while writers write)")
        self.lo = np.zeros(table.lanes, np.int64)  # s' of the current snapshot
        self.hi = np.zeros(table.lanes, np.int64)  # w'
        self._seen_written = np.full(table.lanes, -1, np.int64)  # as last read
        self._seen_start = np.full(table.lanes, -1, np.int64)
        self._term = table.arrays["terminated"]
        self._trunc = table.arrays["truncated"]
        self._advance, self.kernel = pick_kernel(kernel, "replaybank.shared.snapshot_numba",
                                                 "advance", snapshot.advance, "LaneSnapshot")

    def refresh(self) -> SnapshotDelta:
        """Take a new snapshot: update the table's local counters and return what left
        and entered the window since the last one."""
        t = self.table
        written = self.shared_written.copy()  # written first, then start (see module)
        start = self.shared_start.copy()
        if np.array_equal(written, self._seen_written) and \
                np.array_equal(start, self._seen_start):
            return _NO_CHANGE  # the window depends on nothing else
        self._seen_written, self._seen_start = written, start
        lo, hi = self.lo, self.hi
        left, new_slots = self._advance(written, start, t.link, self._term, self._trunc, t.T,
                                        self.guard, lo, hi)
        t.written[:] = hi
        t.counts[:] = hi - lo
        t.episodes[:] = self.shared_episodes
        prio = self.priority.reshape(-1).take(new_slots) if len(new_slots) else _NO_PRIO
        return SnapshotDelta(left, new_slots, prio)

    def intact(self) -> bool:
        """Whether everything the snapshot exposes is still unchanged: no writer evicted
        past its low end (re-read ``start`` after a gather)."""
        return bool(np.all(self.shared_start <= self.lo))


def claim_side_slots(table: StepTable, lanes: IntArray) -> None:
    """Make ``table``'s side store hand out only the slots of ``lanes``
    (``[l * T, (l + 1) * T)`` for each lane ``l``) that their live steps do not hold.

    Args:
        table: A writer's table over a shared buffer (side store of ``T * lanes`` slots).
        lanes: The lanes this writer owns, ``[m]``.

    Example:
        >>> from replaybank.spec import Spec
        >>> t = StepTable(Spec.coerce({"obs": ((), "int64"), "terminated": ((), "bool"),
        ...                            "truncated": ((), "bool")}), T=2, lanes=2,
        ...               obs_fields=["obs"])
        >>> t.side.resize(4)
        >>> claim_side_slots(t, np.array([1])); sorted(t.side.free)
        [2, 3]
    """
    T = table.T  # noqa: N806
    if table.side.capacity < T * table.lanes:
        raise ConfigError(f"the side store holds {table.side.capacity} slots; a shared "
                          f"table needs one per step ({T * table.lanes})")
    used = np.ones(table.side.capacity, dtype=bool)
    for lane in np.asarray(lanes, np.int64).tolist():
        used[lane * T:(lane + 1) * T] = False
        c, w = int(table.counts[lane]), int(table.written[lane])
        if c:
            lk = table.link[np.arange(w - c, w) % T, lane]
            used[lk[lk > 0] - 1] = True
    table.side.rebuild(used)


def lanes_of(value: Any, num_envs: int, where: str = "writer") -> IntArray:
    """``value`` as distinct lane ids in ``[0, num_envs)`` (a writer's lanes).

    Args:
        value: The lanes: an int or a 1-d sequence of ints.
        num_envs: Lanes of the buffer.
        where: The call named in the error.

    Raises:
        ConfigError: Naming the lanes and the range, for anything but distinct ints in
            range (negative ids, which numpy would wrap to the last lanes, included).
        ShapeError: A ragged nest (``[[0], [0, 1]]``), naming the lanes, the first unlike
            row and the fix (the one ragged check, :func:`~replaybank.host.as_numpy`).

    Example:
        >>> lanes_of((1, 0), 2).tolist()
        [1, 0]
        >>> lanes_of((2,), 2)
        Traceback (most recent call last):
        ...
        replaybank.errors.ConfigError: writer(lanes=(2,)): give distinct lane ids in [0, 2) (each writer owns some lanes of the buffer)
    """  # noqa: E501
    rule = "each writer owns some lanes of the buffer"
    fix = f"give distinct lane ids in [0, {num_envs}) ({rule})"
    try:
        arr = as_numpy(
            value,
            label=lambda: f"{where}(lanes={value!r})",
            expected="[k] lane ids (one int per lane)",
            fix=fix,
        )
    except TypeError:  # not numbers at all: the ConfigError below names them
        arr = np.zeros((0, 0))
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or len(arr) == 0 or \
            len(np.unique(arr)) != len(arr) or arr.min() < 0 or arr.max() >= num_envs:
        raise ConfigError(f"{where}(lanes={value!r}): {fix}")
    return arr.astype(np.int64)
