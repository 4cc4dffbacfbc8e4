"""Where a buffer's ``add`` and ``extend`` go: the one route from a call to its writer.

A :class:`~replaybank.buffers.replay.ReplayBuffer` keeps one :class:`WriteRoute`. It holds
the :class:`~replaybank.buffers.writer.Writer` of the current table, sampler and view
(built on the first write after any of them changed), and offers two ways in:

* :attr:`WriteRoute.direct`: the compiled writer's whole call, for the hot path (a call
  it does not take returns False and changes nothing);
* :meth:`WriteRoute.write`: everything else, in order: the store may refuse the write (a
  shared owner is written by its collectors), the view's input transform (frame stacks
  store the newest frame), then the writer. The first write of a buffer built without a
  spec checks the call, allocates the storage from it and then writes.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(8, seed=0)
    >>> buf.add(obs=np.zeros(2, np.float32), action=0, reward=1.0,
    ...         next_obs=np.ones(2, np.float32), terminated=False, truncated=False)
    >>> route = buf.write_route
    >>> route.writer is not None, route.direct is route.writer.direct
    (True, True)
    >>> buf.sampler = rb.UniformSampler()  # a new part: the writer is rebuilt on use
    >>> route.writer is None
    True
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from replaybank.buffers.autoreset import ResetSteps
from replaybank.buffers.checked_call import check_call, lane_ids
from replaybank.buffers.guard import CallGuard
from replaybank.buffers.inputs import UNSET, collect_fields
from replaybank.buffers.priorities import check_priority
from replaybank.buffers.sampling_parts import Parts
from replaybank.buffers.store import Store
from replaybank.buffers.writer import StepValues, Writer, writer_choice
from replaybank.spec import Spec
from replaybank.storage.table import StepTable
from replaybank.storage.writers.compiled import WriteCall, not_handled

__all__ = ["WriteRoute"]


class WriteRoute:
    """The writer of a buffer's current table and parts, and the route of each write.

    Args:
        store: Where the steps live (allocated by the first write when it has no table).
        guard: The buffer's call guard (the compiled writer checks it on the hot path).
        num_envs: Lanes of the buffer.
        rows_only: The buffer stores rows (no next observations).
        drop_resets: Drop NEXT_STEP reset steps as they arrive
            (``autoreset_mode="next_step"``).

    Attributes:
        resets: What the writers remember of the reset steps they dropped (None: none
            are dropped); the buffer saves it with its state.
    """

    def __init__(self, store: Store, guard: CallGuard, num_envs: int, rows_only: bool,
                 drop_resets: bool) -> None:
        self.store = store
        self.guard = guard
        self.num_envs = num_envs
        self.rows_only = rows_only
        self.resets = ResetSteps(num_envs) if drop_resets else None
        self._all_lanes = np.arange(num_envs, dtype=np.int64)  # [num_envs], every lane
        #: The writer of the current table and parts (None: built on the next write).
        self.writer: Writer | None = None
        #: The compiled write of a whole call when nothing must happen around it.
        self.direct: WriteCall = not_handled
        if store.backend.durable:
            _FILE_ROUTES.add(self)  # a forked child's first write asks the files

    def drop(self) -> None:
        """Forget the writer (the table or a part changed): the next write builds one."""
        self.writer = None
        self.direct = not_handled

    def allocate(self, spec: Spec) -> StepTable:
        """Allocate the storage for ``spec`` (the writer is rebuilt on the next write)."""
        self.drop()
        return self.store.allocate(spec)

    def write(self, parts: Parts, values: StepValues, steps: bool, env_ids: Any,
              priority: Any, allocated: Callable[[], None]) -> None:
        """A write the hot path did not take (the caller holds the guard).

        Args:
            parts: The buffer's current sampler and view, with their capabilities.
            values: The call's values.
            steps: ``extend`` (a leading step dimension) rather than ``add``.
            env_ids: The lanes written (None: every lane).
            priority: Initial priorities (prioritized samplers), or None.
            allocated: Called when this write allocated the storage, before anything is
                written to it (the buffer records its config in durable storage, so that
                a process killed during its first write leaves files ``rb.open`` reads).
                Passed per call, not kept: the route holds no reference to its buffer.
        """
        self.store.check_write("extend" if steps else "add")
        if parts.transform is not None and self.store.table is None:
            # the view decides how it reads the values (frame stacks: stacks or single
            # frames) at the first write: a refused first write leaves it undecided
            state = parts.view.state_dict()
            try:
                self._write(parts, values, steps, env_ids, priority, allocated)
            except BaseException:
                if self.store.table is None:
                    parts.view.load_state_dict(state)
                raise
        else:
            self._write(parts, values, steps, env_ids, priority, allocated)

    def _write(self, parts: Parts, values: StepValues, steps: bool, env_ids: Any,
               priority: Any, allocated: Callable[[], None]) -> None:
        """:meth:`write` after the storage check."""
        if parts.transform is not None:
            # bad env_ids: the Python boundary's error
            ids = self._all_lanes if env_ids is None else lane_ids(env_ids, self.num_envs)
            if parts.lane_transform is not None:  # (it reads the lanes' stored steps)
                fields = parts.lane_transform.prepare_lane_inputs(
                    collect_fields(*values), steps, ids, self.store.table)
            else:
                fields = parts.transform.prepare_inputs(collect_fields(*values), steps,
                                                        len(ids))
            pop = fields.pop
            values = StepValues(pop("obs", UNSET), pop("action", UNSET), pop("reward", UNSET),
                                pop("next_obs", UNSET), pop("terminated", UNSET),
                                pop("truncated", UNSET), fields)
        table = self.store.table
        if self.writer is not None:
            self.writer.write(values, steps, env_ids, priority)
        elif table is not None:
            self._new_writer(parts, table).write(values, steps, env_ids, priority)
        else:  # the first write sets the spec: the call is checked before allocating
            call = check_call(None, collect_fields(*values), steps, env_ids, self.num_envs,
                              self.rows_only)
            check_priority(parts.traits, priority, call.out)
            if parts.checks is not None:  # (HER: goal keys, named now, not at a sample)
                parts.checks.check_fields(call.spec)
            writer_choice()  # a bad REPLAYBANK_WRITER too
            table = self.allocate(call.spec)
            allocated()
            self._new_writer(parts, table).write_checked(call, priority)

    def _new_writer(self, parts: Parts, table: StepTable) -> Writer:
        """The writer of ``table`` and the current parts (``REPLAYBANK_WRITER`` is read
        here)."""
        writer = Writer(table, None if parts.traits.stateless else parts.sampler,
                        traits=parts.traits, compiled=writer_choice() != "reference",
                        guard=self.guard, drop_resets=self.resets)
        self.writer = writer
        self.direct = writer.direct if parts.transform is None else not_handled
        return writer

    def __getstate__(self) -> dict[str, Any]:
        """Pickle support: the writer holds the compiled writer; it is rebuilt on use."""
        state = self.__dict__.copy()
        state["writer"] = None
        state["direct"] = not_handled
        return state


#: Routes of buffers in files (durable storage): a forked child drops them
#: (:func:`_after_fork_in_child`).
_FILE_ROUTES: weakref.WeakSet[WriteRoute] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """The hot path (:attr:`WriteRoute.direct`) asks nothing before it writes: in a child
    forked from a file-backed buffer's writer, each route is dropped, so the child's next
    write goes through :meth:`WriteRoute.write`, whose storage check refuses it (the
    files have one writer: the parent). The hot path itself pays nothing for this."""
    for route in list(_FILE_ROUTES):
        route.drop()


if hasattr(os, "register_at_fork"):  # POSIX: os.fork and multiprocessing's "fork"
    os.register_at_fork(after_in_child=_after_fork_in_child)
