"""A collector's side of shared memory: a picklable handle, and the writer it opens in
the collector's process (see :mod:`replaybank.shared` for the whole picture).

Example:
    >>> import pickle
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(16, num_envs=2, storage="shared",
    ...                       spec={"obs": ((), "float32"), "action": ((), "int64")})
    >>> handle = pickle.loads(pickle.dumps(buf.writer(lanes=[1])))  # crosses processes
    >>> w = handle.open()
    >>> w.lanes.tolist(), handle.lanes
    ([1], (1,))
    >>> w.add(obs=np.ones(1, np.float32), action=np.zeros(1, np.int64),
    ...       reward=np.zeros(1, np.float32), next_obs=np.full(1, 2, np.float32),
    ...       terminated=np.ones(1, bool), truncated=np.zeros(1, bool))
    >>> len(buf)  # an episode's last step is complete: the learner sees it
    1
    >>> w.close(); buf.close()
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import ConfigError
from replaybank.shared.lanes import claim_side_slots, lanes_of
from replaybank.shared.reader import shared_arrays
from replaybank.storage.backends.base import SharedArrayBackend

__all__ = ["SharedWriter", "SharedWriterHandle", "writer_handle"]


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
        from replaybank.shared.backend import SharedBackend, pid_alive

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
