"""Where an env reset cut a running joint episode: a record kept beside the steps.

:meth:`~replaybank.multiagent.MultiAgentReplayBuffer.end_episodes` ends the running
joint episode of an env after its newest stored step (the env was reset while it ran).
Nothing stored says so (a late-joining agent makes the same break in the core's links,
inside a joint episode), so :class:`Cuts` records it: per lane, the sequence numbers of
the live steps after which an episode was cut, in memory for ``sample_episodes``, and in
a bookkeeping array beside the core's step table, ``meta/multiagent_cuts``
``[T, lanes]`` int64. Row ``seq % T`` of a lane holds ``seq + 1`` when step ``seq`` was
cut; any other value (0, or the mark of an older step the ring has overwritten since)
means no cut. A mark therefore needs no update when its step is overwritten or the
buffer cleared (sequence numbers never repeat), and a memmap buffer keeps the record in
its files, as it keeps the lane counters: ``rb.open(path)``, after ``flush()`` or after
a crash, ends the joint episodes where they were cut.

The record is created at the first cut (a buffer whose episodes were never cut has
none). Files written before it existed read as "no cuts", and get it at their first cut
(:class:`~replaybank.storage.backends.base.MetaAddingBackend`: zero-filled, complete on
disk before the manifest names it, so a process killed at any instant leaves files that
read as before or hold a valid record).

Example:
    >>> import numpy as np
    >>> from replaybank.spec import Spec
    >>> from replaybank.storage.table import StepTable
    >>> t = StepTable(Spec.coerce({"obs": ((), "int64"), "terminated": ((), "bool"),
    ...                            "truncated": ((), "bool")}), T=4, lanes=2,
    ...               obs_fields=["obs"])
    >>> t.written[:] = [3, 6]; t.counts[:] = [3, 4]
    >>> cuts = Cuts(t)
    >>> cuts.add(1, 5)
    True
    >>> [c.tolist() for c in cuts.lanes], cuts.pairs().tolist()
    ([[], [5]], [[1, 5]])
    >>> cuts.newest_cut().tolist()  # lane 1's newest step is 5: nothing runs there
    [1]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError
from replaybank.storage.backends.base import DurableBackend, MetaAddingBackend
from replaybank.storage.table import StepTable

__all__ = ["RECORD", "Cuts"]

IntArray = npt.NDArray[np.int64]
_INT64 = np.dtype(np.int64)
#: The name of the record among the table's bookkeeping arrays (``meta/<name>``).
RECORD = "multiagent_cuts"


class Cuts:
    """The cuts of one step table (module docstring).

    Args:
        table: The core's step table (its backend holds the record).
        reopened: The table was reopened from durable storage: read the record its
            files hold (none: files of an older version, no cuts).

    Attributes:
        lanes: Per lane, the sequence numbers of the cut steps (sorted; those
            overwritten since may remain: readers keep the live ones).
    """

    def __init__(self, table: StepTable, reopened: bool = False) -> None:
        self.table = table
        self._shape = (table.T, table.lanes)
        #: The record (None until the first cut, or the one reopened files hold).
        self._record: Any = None
        self.lanes: list[IntArray] = [np.zeros(0, np.int64) for _ in range(table.lanes)]
        if reopened:
            try:
                self._record = table.backend.allocate_meta(RECORD, self._shape, _INT64)
            except CheckpointError:  # files of an older version: no cut recorded
                return
            self.lanes = self._read()

    def _live(self, lane: int) -> IntArray:
        """``[c]`` the sequence numbers of the lane's live steps, oldest first."""
        end = int(self.table.written[lane])
        return np.arange(end - int(self.table.counts[lane]), end, dtype=np.int64)

    def _read(self) -> list[IntArray]:
        """Per lane, the live cut steps the record marks."""
        T = self.table.T  # noqa: N806
        out = []
        for lane in range(self.table.lanes):
            seqs = self._live(lane)  # [c]
            marks = np.asarray(self._record[seqs % T, lane])  # [c]
            out.append(seqs[marks == seqs + 1])
        return out

    def check_writable(self, call: str) -> None:
        """Raise ConfigError (naming ``call``) when the table's files may not be written
        here (opened read-only, or closed); nothing changes."""
        be = self.table.backend
        if be.durable and isinstance(be, DurableBackend):
            be.check_writable(f"{call}()")

    def _keep(self) -> bool:
        """Make sure the record exists; True when this call created it."""
        if self._record is not None:
            return False
        be = self.table.backend
        self._record = (
            be.add_meta(RECORD, self._shape, _INT64)
            if isinstance(be, MetaAddingBackend)
            else be.allocate_meta(RECORD, self._shape, _INT64)
        )
        return True

    def add(self, lane: int, seq: int) -> bool:
        """Record that the episode of ``lane`` was cut after step ``seq`` (the lane's
        newest, live) and forget the cuts the ring has overwritten.

        Returns:
            Whether the record was created now (a durable buffer then records its owner
            again, which completes the new file's creation).

        Raises:
            ConfigError: Durable files opened read-only or closed (nothing changes).
            CapacityError: The disk has no room for a new record (nothing changes).
        """
        created = self._keep()
        self._record[seq % self.table.T, lane] = seq + 1
        oldest = int(self.table.written[lane]) - int(self.table.counts[lane])
        c = self.lanes[lane]
        self.lanes[lane] = np.append(c[c >= oldest], np.int64(seq))
        return created

    def pairs(self) -> IntArray:
        """``[k, 2]`` the live cuts as ``(lane, seq)`` pairs (``state_dict``'s form)."""
        out = [
            (lane, seq)
            for lane in range(self.table.lanes)
            for seq in np.intersect1d(self.lanes[lane], self._live(lane)).tolist()
        ]
        return np.array(out, np.int64).reshape(-1, 2)

    def load(self, pairs: IntArray) -> None:
        """Replace every cut with ``pairs`` (``[k, 2]`` ``(lane, seq)``, lanes in range;
        those not live in the table now are dropped): after a state load."""
        keep = []
        for lane, seq in np.asarray(pairs, np.int64).reshape(-1, 2).tolist():
            end = int(self.table.written[lane])
            if end - int(self.table.counts[lane]) <= seq < end:
                keep.append((lane, seq))
        lanes = [np.zeros(0, np.int64) for _ in range(self.table.lanes)]
        for lane, seq in keep:
            lanes[lane] = np.append(lanes[lane], np.int64(seq))
        if keep or self._record is not None:
            self._keep()
            self._record[...] = 0  # marks of the steps before the load may match again
            for lane, seq in keep:
                self._record[seq % self.table.T, lane] = seq + 1
        self.lanes = [np.unique(c) for c in lanes]

    def clear(self) -> None:
        """Forget every cut (the buffer was cleared: the record's marks no longer match
        a live step)."""
        self.lanes = [np.zeros(0, np.int64) for _ in range(self.table.lanes)]

    def newest_cut(self) -> IntArray:
        """``[m]`` the lanes whose newest live step is a cut (nothing runs there)."""
        out = [
            lane
            for lane in range(self.table.lanes)
            if int(self.table.counts[lane])
            and int(self.table.written[lane]) - 1 in self.lanes[lane].tolist()
        ]
        return np.array(out, np.int64)
