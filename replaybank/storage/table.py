"""The step table: fields in a lane-major ring, with each observation stored once.

Layout (see :mod:`replaybank.spec`): every field is an array ``[T, lanes, *shape]``
and the steps of one lane are contiguous in time (mod T). Lane bookkeeping
(``written``, ``counts``: see :mod:`replaybank.ops.ring`) and the next-observation
links live in small meta arrays beside the data.

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
live window ``[start, written)``. Evicted steps leave first (``start`` advances, and
``counts`` drops), then side slots, data and links are written outside the window, then
``written`` advances (the commit), then the previous newest step is relinked (a lane's
newest step always keeps its next observation aside), then ``counts`` and ``episodes``
follow. A write that evicts more than :attr:`StepTable.chunk`
steps goes in chunks of at most that many (a long ``extend`` never empties the window
first). So a process killed (even with SIGKILL) at any instant leaves every step that
a completed write stored (unless the interrupted write was evicting it) and at most a
complete prefix of the interrupted write. ``REPLAYBANK_KILL_AT``
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

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError
from replaybank.spec import Spec
from replaybank.storage import table_reads
from replaybank.storage.backends.base import (
    ArrayBackend,
    GroupedBackend,
    SharedArrayBackend,
    check_fits,
)
from replaybank.storage.backends.numpy import NumpyBackend
from replaybank.storage.host_tail import HostTail
from replaybank.storage.side_store import SideStore

__all__ = ["StepTable"]

IntArray = npt.NDArray[np.int64]


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
        self.side = SideStore(spec, self.obs_fields, be, side0, n_steps)
        #: Device storage: each lane's newest done flag and next obs on the host, so that
        #: a write's continuity check reads no device data (None: arrays in host memory).
        self.tail: HostTail | None = None if be.host_numpy \
            else HostTail(spec, self.obs_fields, self.lanes)
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
        self._plan: tuple[tuple[Any, ...], Any] | None = None  # see table_reads._read_plan
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
        """Drop every step (sequence numbers keep counting, so old keys turn stale)."""
        if self.start is not None:  # durable: the window empties first
            self.start[:] = self.written
        self.counts[:] = 0
        self.link[:] = 0
        self.epoch += 1
        self.side.reset()

    # ------------------------------------------------------------------ read
    # bound from replaybank.storage.table_reads (they run on every sample: no wrapper)
    rows_lanes = table_reads.rows_lanes
    gather = table_reads.gather
    gather_next = table_reads.gather_next
    slots_of = table_reads.slots_of
    take = table_reads.take
    next_index = table_reads.next_index
    take_next = table_reads.take_next
    gather_transitions = table_reads.gather_transitions
    take_fields = table_reads.take_fields
    is_boundary = table_reads.is_boundary

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
                "link": self.link}
