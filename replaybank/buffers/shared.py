"""Replay in shared memory: collector processes write their own lanes, one learner samples.

``buf = rb.ReplayBuffer(capacity, num_envs, spec=..., storage="shared")`` is the owner
and learner: it creates the shared-memory arrays
(:mod:`replaybank.storage.backends.shared`) and samples them like any buffer (uniform,
PER, n-step, sequences, frame stacks, HER: every sampler and view). It does not write:
each collector process gets a picklable handle, ``buf.writer(lanes)``, and calls its
``open()`` to get a :class:`SharedWriter` whose ``add`` / ``extend`` write its lanes
(values ``[len(lanes), ...]``, as for ``num_envs=len(lanes)``). A writer owns its lanes
(a second writer of the same lane is refused while the first one's process lives), so
writes need no lock. Initial priorities (Ape-X: ``add(..., priority=td)``) go through a
shared array and reach the learner's PER sampler with the step.

The learner samples a consistent snapshot of what the writers committed (:mod:`replaybank
.storage.shared_lanes`): never a step before it is complete, never a step being
overwritten. Before each sample it refreshes the snapshot and tells its sampler which
steps entered and left; after the gather it checks that no writer overwrote what it read
(else it draws again). Left out of each lane's window: the ``guard`` oldest steps of a full
lane (:func:`~replaybank.storage.shared_lanes.default_guard`) and the newest step while
its next observation has not arrived.

A writer process killed mid-``add`` (even with SIGKILL) leaves its lanes consistent: the
learner sees the steps committed before, and a new writer may take the lanes over
(``buf.writer(lanes).open()`` again). When the owner closes, is collected or exits, the
segments are unlinked; after a SIGKILL of the owner its resource tracker, or else the
next owner started on the machine, removes them.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(64, num_envs=2, seed=0, storage="shared",
    ...                       spec={"obs": ((3,), "float32"), "action": ((), "int64")})
    >>> w = buf.writer(lanes=[0, 1]).open()  # normally in a collector process
    >>> for t in range(5):
    ...     w.add(obs=np.full((2, 3), t, np.float32), action=np.array([t, t]),
    ...           reward=np.ones(2, np.float32), next_obs=np.full((2, 3), t + 1, np.float32),
    ...           terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))
    >>> len(buf)  # the newest step of each lane waits for its next observation
    8
    >>> batch = buf.sample(4)
    >>> bool(np.all(batch.next_obs == batch.obs + 1))
    True
    >>> w.close(); buf.close()
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from replaybank.errors import ConfigError, ReplayBankError
from replaybank.samplers.base import Sampler, SlotExcluding
from replaybank.storage.backends.base import SharedArrayBackend
from replaybank.storage.shared_lanes import LaneSnapshot, claim_side_slots, lanes_of
from replaybank.storage.table import StepTable

__all__ = ["SharedReader", "SharedWriter", "SharedWriterHandle", "WritersOutranError"]

T_ = TypeVar("T_")
#: Draws of one sample call before :class:`WritersOutranError` (each needs writers to
#: evict more than ``guard`` steps of a lane while the learner gathers).
ATTEMPTS = 16


class WritersOutranError(ReplayBankError, RuntimeError):
    """Writers overwrote the data of every draw of a sample call (raise ``guard``)."""


def shared_arrays(backend: SharedArrayBackend, table: StepTable
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                             npt.NDArray[np.int64], npt.NDArray[np.float64],
                             npt.NDArray[np.int64]]:
    """The shared lane counters ``written, start, episodes [lanes]``, the initial
    priorities ``[T, lanes]`` and the lane claims (writer pids) ``[lanes]`` of a table
    (created by the owner, attached by writers)."""
    lanes, T = table.lanes, table.T  # noqa: N806
    i64 = np.dtype(np.int64)
    return (backend.shared("written", (lanes,), i64), backend.shared("start", (lanes,), i64),
            backend.shared("episodes", (lanes,), i64),
            backend.shared("priority", (T, lanes), np.dtype(np.float64)),
            backend.shared("claims", (lanes,), i64))


class SharedReader:
    """The owner's side: a lane snapshot, refreshed before each read, and the sampler
    told what entered and left it.

    Args:
        backend: The owner's shared backend.
        table: The owner's table (local counters, shared data).
        guard: Steps left out at the old end of a full lane (None: the default).
    """

    def __init__(self, backend: SharedArrayBackend, table: StepTable,
                 guard: int | None = None) -> None:
        written, start, episodes, priority, self.claims = shared_arrays(backend, table)
        priority[...] = np.nan
        self.snapshot = LaneSnapshot(table, written, start, episodes, priority, guard)
        self.backend = backend
        self.retries = 0  # draws thrown away because writers outran the guard
        self._checked: tuple[Any, bool] = (None, False)

    def sync(self, sampler: Sampler) -> None:
        """Refresh the snapshot; the sampler hears the slots that left (its per-slot
        state, e.g. a priority, stops counting) and the new steps (with their writers'
        initial priorities)."""
        delta = self.snapshot.refresh()
        if len(delta.left) and self._excludes(sampler):
            cast(SlotExcluding, sampler).exclude(delta.left)
        if len(delta.new):
            given = ~np.isnan(delta.priorities)
            if not given.any():
                sampler.on_write(delta.new, None)
            else:
                if not given.all():
                    sampler.on_write(delta.new[~given], None)
                sampler.on_write(delta.new[given], delta.priorities[given])

    def _excludes(self, sampler: Sampler) -> bool:
        """Whether ``sampler`` keeps per-slot state to leave out (checked once per
        sampler object)."""
        if sampler is not self._checked[0]:
            self._checked = (sampler, isinstance(sampler, SlotExcluding))
        return self._checked[1]

    def read(self, sampler: Sampler, draw: Callable[[], T_]) -> T_:
        """``draw()`` on a fresh snapshot, again until no writer overwrote what it read.

        Raises:
            WritersOutranError: Every one of :data:`ATTEMPTS` draws was overwritten.
        """
        for _ in range(ATTEMPTS):
            self.sync(sampler)
            out = draw()
            if self.snapshot.intact():
                return out
            self.retries += 1
        raise WritersOutranError(
            f"shared buffer: writers overwrote the sampled data in {ATTEMPTS} draws in a "
            f"row (they evicted more than guard={self.snapshot.guard} steps of a lane "
            "during one sample); build the buffer with a larger shared_guard= or capacity")


@dataclass(frozen=True)
class SharedWriterHandle:
    """What a collector process needs to write lanes of a shared buffer (picklable).

    Attributes:
        layout: The owner's shared-memory layout.
        config: The owner's config (rebuilds its view and spec in the writer).
        lanes: The lanes this writer owns.
    """

    layout: Any
    config: dict[str, Any]
    lanes: tuple[int, ...]

    def open(self) -> SharedWriter:
        """Attach the shared arrays in this process and claim the lanes.

        Raises:
            ConfigError: :attr:`lanes` are not distinct lanes of the buffer (checked
                before anything is attached or claimed), or another live process writes
                one of them.
            CheckpointError: The owner is gone (its segments were unlinked).
        """
        return SharedWriter(self)


class SharedWriter:
    """A collector's writer of some lanes of a shared buffer (from
    ``SharedWriterHandle.open()``): ``add`` / ``extend`` as on a buffer with
    ``num_envs=len(lanes)``; ``priority=`` gives initial priorities (PER learners).
    """

    def __init__(self, handle: SharedWriterHandle) -> None:
        from replaybank.config import from_config
        from replaybank.storage.backends.shared import SharedBackend, pid_alive

        backend = SharedBackend(handle.layout)
        self._backend = backend
        try:
            self._buf = from_config({**handle.config, "seed": None}, storage=backend)
            table = self._buf.table
            # checked against the attached arrays, before any lane is claimed
            self.lanes = lanes_of(handle.lanes, table.lanes, "SharedWriterHandle.open")
        except BaseException:
            backend.close()
            raise
        self._written, _, _, self._priority, claims = shared_arrays(backend, table)
        me = os.getpid()
        for lane in self.lanes.tolist():
            pid = int(claims[lane])
            if pid not in (0, me) and pid_alive(pid):
                backend.close()
                raise ConfigError(f"writer(lanes={list(handle.lanes)}): lane {lane} is "
                                  f"written by process {pid}; give each writer its own lanes")
        claims[self.lanes] = me
        self._claims = claims
        claim_side_slots(table, self.lanes)
        self._T = table.T
        self._closed = False

    def _priorities(self, priority: Any, n: int) -> bool:
        """Store raw initial priorities for the rows about to be written, before the
        write commits them (NaN: none given). False: bad shape, for the buffer to name."""
        m = len(self.lanes)
        rows = (self._written[self.lanes][None, :] + np.arange(n)[:, None]) % self._T
        if priority is None:
            self._priority[rows, self.lanes[None, :]] = np.nan
            return True
        try:
            p = np.broadcast_to(np.asarray(priority, np.float64), (n, m) if n > 1 else (m,))
        except (ValueError, TypeError):
            return False
        self._priority[rows, self.lanes[None, :]] = p.reshape(n, m)
        return True

    def add(self, **values: Any) -> None:
        """One step of each of this writer's lanes (values ``[len(lanes), ...]``);
        ``priority=`` (``[len(lanes)]``) sets initial priorities."""
        self._check_open()
        priority = values.pop("priority", None)
        if "env_ids" in values:
            raise ConfigError("SharedWriter.add(env_ids=...): a writer writes its own lanes "
                              f"{self.lanes.tolist()}; open one writer per set of lanes")
        self._priorities(priority, 1)  # bad ones: the buffer's check names them
        self._buf.add(**values, env_ids=self.lanes, priority=priority)

    def extend(self, **values: Any) -> None:
        """``n`` steps of each lane (values ``[n, len(lanes), ...]``)."""
        self._check_open()
        priority = values.pop("priority", None)
        shape = np.shape(values.get("terminated", ()))
        if shape:  # else the buffer's check names the bad call
            self._priorities(priority, int(shape[0]))
        self._buf.extend(**values, env_ids=self.lanes, priority=priority)

    @property
    def written(self) -> npt.NDArray[np.int64]:
        """Steps ever committed to each of this writer's lanes, ``[len(lanes)]`` (a new
        writer of a killed one's lanes continues from here)."""
        self._check_open()
        return np.asarray(self._written[self.lanes], np.int64)

    def __len__(self) -> int:
        """Live steps of this writer's lanes."""
        self._check_open()
        return int(self._buf.table.counts[self.lanes].sum())

    def _check_open(self) -> None:
        if self._closed:  # (its buffer and mappings are gone)
            raise ConfigError("this SharedWriter was closed; open the handle again")

    def close(self) -> None:
        """Give the lanes back and drop this process's mappings (idempotent)."""
        if self._closed:
            return
        self._closed = True
        mine = self._claims[self.lanes] == os.getpid()
        self._claims[self.lanes[mine]] = 0
        del self._claims, self._written, self._priority
        del self._buf
        self._backend.close()

    def __enter__(self) -> SharedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def writer_handle(backend: SharedArrayBackend, config: dict[str, Any], lanes: Any,
                  num_envs: int) -> SharedWriterHandle:
    """The handle of a writer of ``lanes`` (checked) of the owner's buffer."""
    ids = lanes_of(lanes, num_envs)
    return SharedWriterHandle(backend.layout(), config, tuple(int(x) for x in ids))
