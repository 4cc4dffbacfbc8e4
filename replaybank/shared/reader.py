"""The learner's side of shared memory: a lane snapshot refreshed before each read, and
the draw retried when writers overwrote what it read (see :mod:`replaybank.shared`).

Example:
    >>> import numpy as np, replaybank as rb
    >>> buf = rb.ReplayBuffer(8, num_envs=1, storage="shared",
    ...                       spec={"obs": ((), "float32"), "action": ((), "int64")})
    >>> type(buf.store.reader).__name__, buf.store.reader.retries
    ('SharedReader', 0)
    >>> buf.close()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from replaybank.errors import ReplayBankError
from replaybank.samplers.base import Sampler, SlotExcluding
from replaybank.shared.lanes import LaneSnapshot, default_guard
from replaybank.storage.backends.base import SharedArrayBackend
from replaybank.storage.table import StepTable

__all__ = ["ATTEMPTS", "SharedReader", "WritersOutranError", "shared_arrays"]

T_ = TypeVar("T_")
#: Draws of one sample call before :class:`WritersOutranError` (each needs writers to
#: evict more than ``guard`` steps of a lane while the learner gathers).
ATTEMPTS = 16


class WritersOutranError(ReplayBankError, RuntimeError):
    """Writers overwrote the data of every draw of a sample call: build the buffer with a
    larger capacity (its ``guard`` grows with the rows per lane, up to 1024 steps), sample
    smaller batches, or slow the writers."""


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
            try:
                out = draw()
            except ReplayBankError:
                # a snapshot torn by writers that outran it between its reads (a learner
                # descheduled after reading `written` sees a `start` past it: an empty
                # window) refuses what the data would give: draw again
                if self.snapshot.intact():
                    raise
            else:
                if self.snapshot.intact():
                    return out
            self.retries += 1
        raise self._outran()

    def _outran(self) -> WritersOutranError:
        """The error of a sample call whose every draw was overwritten, naming what
        controls the guard (the rows per lane) and what else helps."""
        guard, rows = self.snapshot.guard, self.snapshot.table.T
        what = (f"they evicted more than guard={guard} steps of a lane while it gathered; "
                f"the guard is min(1024, T // 16) of the T = capacity // num_envs = {rows} "
                "rows per lane")
        if default_guard(2 * rows) > guard:  # a larger capacity raises the guard
            fix = "build the buffer with a larger capacity, sample smaller batches"
        else:
            fix = "sample smaller batches (the guard is at its largest)"
        return WritersOutranError(
            f"shared buffer: writers overwrote the sampled data in {ATTEMPTS} draws in a "
            f"row ({what}); {fix}, or slow the writers")
