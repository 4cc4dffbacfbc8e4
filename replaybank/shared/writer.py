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

import math
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.buffers.arguments import positional_values
from replaybank.buffers.checked_call import lane_ids
from replaybank.buffers.guard import CallGuard
from replaybank.buffers.priorities import priority_values
from replaybank.errors import ConfigError, ShapeError
from replaybank.shared.lanes import claim_side_slots, lanes_of
from replaybank.shared.reader import shared_arrays
from replaybank.spec import SEP, Spec, as_array, check_tuple
from replaybank.storage.backends.base import SharedArrayBackend

__all__ = ["SharedWriter", "SharedWriterHandle", "writer_handle"]

#: The live writers of this process, by ``(segment token, lane)``: the pid that opened
#: each (a forked child inherits the table, not the writers) and a weak reference to it
#: (a writer collected without ``close`` holds nothing). The shared claims hold pids,
#: which cannot tell two writers of one process apart.
_LIVE: dict[tuple[str, int], tuple[int, weakref.ref[SharedWriter]]] = {}
_LIVE_LOCK = threading.Lock()


def _live_writer(token: str, lane: int, pid: int) -> SharedWriter | None:
    """This process's open writer of ``lane`` of the buffer ``token``, if any."""
    entry = _LIVE.get((token, lane))
    if entry is None or entry[0] != pid:
        return None
    writer = entry[1]()
    return writer if writer is not None and not writer._closed else None


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
                before anything is attached or claimed), or another open writer holds one
                of them: of another live process, or of this one (nothing is claimed
                then).
            CheckpointError: The owner is gone (its segments were unlinked).
        """
        return SharedWriter(self)


class SharedWriter:
    """A collector's writer of some lanes of a shared buffer (from
    ``SharedWriterHandle.open()``): ``add`` / ``extend`` as on a buffer with
    ``num_envs=len(lanes)`` (``env_ids=`` are positions among its lanes), so
    :func:`replaybank.collect` fills it from a gymnasium env; ``priority=`` gives initial
    priorities (PER learners).

    Threads: the writer's calls take its buffer's call guard
    (:mod:`replaybank.buffers.guard`: no lock while only the thread that opened it calls),
    so threads of one process may share a writer: each ``add`` stores its steps with its
    own initial priorities, and ``close()`` from another thread waits for the call in
    flight (later calls raise ``ConfigError``). Unguarded, two threads adding with
    priorities gave ~2% of the steps the other thread's priority (10 runs in 10 of a
    probe), and a ``close()`` beside an ``add`` unmapped the arrays under it: a
    segmentation fault, in the first of 3 runs in 3.
    """

    def __init__(self, handle: SharedWriterHandle) -> None:
        from replaybank.config import from_config
        from replaybank.shared.backend import SharedBackend, pid_alive

        backend = SharedBackend(handle.layout)
        self._backend = backend
        try:
            self._buf = from_config({**handle.config, "seed": None}, storage=backend)
            self._guard: CallGuard = self._buf.write_route.guard
            table = self._buf.table
            # checked against the attached arrays, before any lane is claimed
            self.lanes = lanes_of(handle.lanes, table.lanes, "SharedWriterHandle.open")
        except BaseException:
            backend.close()
            raise
        self._written, _, _, self._priority, claims = shared_arrays(backend, table)
        self._token = handle.layout.token
        self._closed = False
        me = os.getpid()
        with _LIVE_LOCK:  # two threads of this process may open at once
            for lane in self.lanes.tolist():
                pid = int(claims[lane])
                if _live_writer(self._token, lane, me) is not None:
                    backend.close()
                    raise ConfigError(
                        f"writer(lanes={list(handle.lanes)}): lane {lane} is written by "
                        f"another open writer of this process (pid {me}); close that "
                        "writer first, or give each writer its own lanes")
                if pid not in (0, me) and pid_alive(pid):
                    backend.close()
                    raise ConfigError(
                        f"writer(lanes={list(handle.lanes)}): lane {lane} is written by "
                        f"process {pid}; give each writer its own lanes")
            claims[self.lanes] = me
            ref = weakref.ref(self)
            for lane in self.lanes.tolist():
                _LIVE[(self._token, lane)] = (me, ref)
        self._claims = claims
        claim_side_slots(table, self.lanes)
        self._T = table.T

    def _priorities(self, priority: Any, n: int, lanes: npt.NDArray[np.int64]) -> None:
        """Store raw initial priorities for the ``n`` rows of ``lanes`` about to be
        written, before the write commits them (NaN: none given).

        ``priority`` is read by one buffer's rule
        (:func:`~replaybank.buffers.priorities.priority_values`): one value for all, or
        one per step (``[n, len(lanes)]`` or flat), so the rows get exactly the
        priorities the buffer's check accepts.

        Raises:
            ShapeError: Neither one value nor one per step, or a ragged nest (the one
                ragged check), as ``ReplayBuffer.add`` names it; nothing is stored.
            DtypeError: A priority is not a number, negative, NaN or infinite.
        """
        m = len(lanes)
        rows = (self._written[lanes][None, :] + np.arange(n)[:, None]) % self._T
        if priority is None:
            self._priority[rows, lanes[None, :]] = np.nan
            return
        # [n * m] float64 in step-major order, as the buffer reads them (its own limit,
        # the sum tree's, is checked by its add after this)
        p = priority_values(priority, (n, m), math.inf)
        self._priority[rows, lanes[None, :]] = p.reshape(n, m)

    def _call(self, call: str, values: dict[str, Any], axis: int
              ) -> tuple[npt.NDArray[np.int64], dict[str, Any]]:
        """The buffer lanes a call writes and its values with their lane dim (``axis``):
        every lane of this writer, or those at positions ``env_ids`` among them, as on a
        buffer with ``num_envs=len(lanes)``; a one-lane writer also takes values without
        the lane dim, as a one-env buffer does.

        Raises:
            ShapeError: ``env_ids`` are not distinct positions in ``[0, len(lanes))``; a
                tuple holding arrays, or a list of them, (the tuple rule of the add
                boundary, :func:`~replaybank.spec.check_tuple`); a ragged nest.
        """
        env_ids = values.pop("env_ids", None)
        _tuple_rule(values)  # (before a one-lane writer's np.asarray stacks a tuple)
        if env_ids is None:
            if (
                len(self.lanes) == 1
                and as_array(values.get("terminated", ()), "terminated").ndim == axis
            ):
                values = {k: _lane_dim(k, v, axis) for k, v in values.items()}
            return self.lanes, values
        try:
            at = lane_ids(env_ids, len(self.lanes))
        except ShapeError as exc:
            raise ShapeError(
                f"SharedWriter.{call}(env_ids=...): env_ids are positions among this "
                f"writer's lanes {self.lanes.tolist()} (as on a buffer with num_envs="
                f"{len(self.lanes)}), not lane ids of the shared buffer; {exc}") from None
        return self.lanes[at], values

    def add(self, *args: Any, **values: Any) -> None:
        """One step of each of this writer's lanes (values ``[len(lanes), ...]``; a
        one-lane writer also takes them without the lane dim). ``env_ids=`` (positions
        among the lanes) writes some of them (values ``[len(env_ids), ...]``);
        ``priority=`` (one for all, or one per lane written) sets initial priorities.

        Raises:
            ShapeError, SpecError, DtypeError: As ``ReplayBuffer.add`` on a buffer with
                ``num_envs=len(lanes)`` (``env_ids`` index this writer's lanes); a ragged
                nest in any value (``priority`` and ``terminated`` included) is the one
                ragged check's ShapeError, as the buffer words it.
            ArgumentError: Positional values (keyword arguments only, as
                ``ReplayBuffer.add``).
        """
        if args:
            raise positional_values("add", args)
        entered = self._enter()  # the priorities and the step: one call
        try:
            priority = values.pop("priority", None)
            lanes, values = self._call("add", values, 0)
            self._priorities(priority, 1, lanes)
            self._buf.add(**values, env_ids=lanes, priority=priority)
        finally:
            self._guard.leave(entered)

    def extend(self, *args: Any, **values: Any) -> None:
        """``n`` steps of each lane (values ``[n, len(lanes), ...]``, or ``[n, ...]`` for
        a one-lane writer); ``env_ids=`` as in :meth:`add`; ``priority=`` one for all, or
        one per step (``[n, len(lanes)]``, or the same values flat), as
        ``ReplayBuffer.extend`` takes them. Raises what :meth:`add` raises."""
        if args:
            raise positional_values("extend", args)
        entered = self._enter()
        try:
            priority = values.pop("priority", None)
            lanes, values = self._call("extend", values, 1)
            shape = as_array(values.get("terminated", ()), "terminated").shape  # (ragged)
            if shape:  # else the buffer's check names the bad call
                self._priorities(priority, int(shape[0]), lanes)
            self._buf.extend(**values, env_ids=lanes, priority=priority)
        finally:
            self._guard.leave(entered)

    @property
    def num_envs(self) -> int:
        """Lanes this writer writes: its calls take values as a buffer with this many
        envs does (so :func:`replaybank.collect` fills a writer as it fills a buffer)."""
        return len(self.lanes)

    @property
    def capacity(self) -> int:
        """Steps its lanes hold (rows per lane times lanes), as a buffer's ``capacity``
        (what a collector feeding it holds back at most: :mod:`~replaybank.integrations.
        episode_stage`)."""
        return len(self.lanes) * int(self._T)

    @property
    def spec(self) -> Spec | None:
        """The fields the shared buffer stores."""
        entered = self._enter()
        try:
            spec: Spec | None = self._buf.spec
            return spec
        finally:
            self._guard.leave(entered)

    @property
    def written(self) -> npt.NDArray[np.int64]:
        """Steps ever committed to each of this writer's lanes, ``[len(lanes)]`` (a new
        writer of a killed one's lanes continues from here)."""
        entered = self._enter()
        try:
            return np.array(self._written[self.lanes], np.int64)
        finally:
            self._guard.leave(entered)

    def __len__(self) -> int:
        """Live steps of this writer's lanes."""
        entered = self._enter()
        try:
            return int(self._buf.table.counts[self.lanes].sum())
        finally:
            self._guard.leave(entered)

    def flush(self, wait: bool = True) -> None:
        """Nothing to send: every step is committed to shared memory when its ``add`` /
        ``extend`` returns. There so that a collector written for a service client
        (``client.flush()`` after each chunk, :mod:`replaybank.distributed.client`)
        runs unchanged with a shared-memory writer.

        Args:
            wait: Accepted for the client's signature; nothing waits.

        Raises:
            ConfigError: The writer was closed (as its other calls).
        """
        self._guard.leave(self._enter())

    def _enter(self) -> int:
        """Start a call under the guard (pass the result to ``self._guard.leave``).

        Raises:
            ConfigError: The writer was closed (nothing entered).
        """
        entered = self._guard.enter()
        if self._closed:  # (its buffer and mappings are gone)
            self._guard.leave(entered)
            raise ConfigError("this SharedWriter was closed; open the handle again")
        return entered

    def close(self) -> None:
        """Give back the lanes this writer holds and drop its mappings (idempotent).

        Only what this writer owns is released: a lane claimed by another process since
        (this one was taken for dead), or by this process's writer in a forked child's
        copy, stays claimed.
        """
        entered = self._guard.enter()  # another thread's call in flight returns first
        try:
            self._close()
        finally:
            self._guard.leave(entered)

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        me = os.getpid()
        with _LIVE_LOCK:
            for lane in self.lanes.tolist():
                entry = _LIVE.get((self._token, lane))
                if entry is None or entry[0] != me or entry[1]() is not self:
                    continue  # not opened by this process (a forked child's copy)
                del _LIVE[(self._token, lane)]
                if int(self._claims[lane]) == me:
                    self._claims[lane] = 0
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


def _lane_dim(name: str, value: Any, axis: int) -> Any:
    """``value`` of the argument ``name`` (a dict of them: each leaf) as an array with a
    lane dim of 1 inserted at ``axis`` (a ragged nest: the one ragged ShapeError)."""
    if isinstance(value, dict):
        return {k: _lane_dim(f"{name}{SEP}{k}", v, axis) for k, v in value.items()}
    return None if value is None else np.expand_dims(as_array(value, name), axis)


def _tuple_rule(values: dict[str, Any], prefix: str = "") -> None:
    """The tuple rule of the add boundary (:func:`~replaybank.spec.check_tuple`) on every
    tuple or list leaf of a call's ``values``, before anything is converted or written
    (a one-lane writer converts the values itself; initial priorities are set before the
    buffer's checks run), so a writer refuses what ``ReplayBuffer.add``/``extend``
    refuse, with the same error.

    Raises:
        ShapeError: A tuple holding arrays, or a list of such tuples.
    """
    for key, value in values.items():
        name = f"{prefix}{SEP}{key}" if prefix else key
        if isinstance(value, dict):
            _tuple_rule(value, name)
        elif type(value) is tuple or type(value) is list:
            check_tuple(name, value)
