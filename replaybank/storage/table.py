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

Write order keeps a persistent table consistent if the process dies mid-write: evicted
steps are dropped from ``counts`` first, then data and links are written, then the
counters advance.

Example:
    >>> import numpy as np
    >>> from replaybank.spec import Spec
    >>> spec = Spec.coerce({"obs": ((2,), "float32"), "reward": ((), "float32"),
    ...                     "terminated": ((), "bool"), "truncated": ((), "bool")})
    >>> t = StepTable(spec, T=4, lanes=1, obs_fields=["obs"])
    >>> obs = np.arange(6, dtype=np.float32).reshape(3, 1, 2)
    >>> nxt = np.arange(2, 8, dtype=np.float32).reshape(3, 1, 2)
    >>> flags = np.zeros((3, 1), bool)
    >>> keys = t.write(np.array([0]), {"obs": obs, "reward": np.zeros((3, 1), np.float32),
    ...     "terminated": flags, "truncated": flags}, {"obs": nxt})
    >>> t.gather_next("obs", np.array([0, 1, 2]))[:, 1].tolist()
    [3.0, 5.0, 7.0]
    >>> t.side_in_use()  # only the newest step's next obs is kept aside
    1
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops.continuity import bitwise_equal_rows, chunk_breaks, same_bytes
from replaybank.spec import Spec
from replaybank.storage import table_reads, table_write
from replaybank.storage.backend import ArrayBackend, NumpyBackend, check_fits

__all__ = ["StepTable", "bitwise_equal_rows"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
_NO_KEYS: IntArray = np.zeros((0, 0), dtype=np.int64)


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
        self._side_cap_max = n_steps
        side0 = min(n_steps, max(4 * self.lanes, 64))
        if check_memory and be.requires_memory():
            obs_bytes = sum(spec[n].nbytes for n in self.obs_fields)
            need = n_steps * (spec.nbytes_per_item + 4) + side0 * obs_bytes
            check_fits(need, f"replay storage ({n_steps:,} steps x {spec.nbytes_per_item} bytes)")
        self.arrays: dict[str, Any] = {
            name: be.allocate(name, (self.T, self.lanes, *f.shape), f.dtype)
            for name, f in spec.items()
        }
        # bookkeeping (numpy, persistent with the data)
        self.written: IntArray = be.allocate_meta("written", (self.lanes,), np.dtype(np.int64))
        self.counts: IntArray = be.allocate_meta("counts", (self.lanes,), np.dtype(np.int64))
        self.episodes: IntArray = be.allocate_meta("episodes", (self.lanes,), np.dtype(np.int64))
        self.link: npt.NDArray[np.int32] = be.allocate_meta(
            "link", (self.T, self.lanes), np.dtype(np.int32)
        )
        self.side: dict[str, Any] = {
            name: be.allocate(f"side/{name}", (side0, *spec[name].shape), spec[name].dtype)
            for name in self.obs_fields
        }
        self._free: list[int] = list(range(side0 - 1, -1, -1))
        self._names = list(spec)
        # numpy storage dies with the process: no need to order writes for crash safety
        self._durable = type(be) is not NumpyBackend
        self._flat_cache: dict[int, tuple[Any, Any]] = {}
        self._plan: tuple[tuple[Any, ...], Any] | None = None  # see table_reads._read_plan
        # bumped when links change other than by writes (clear, state load): structures
        # derived from link and kept current from the `written` counts start over
        self.epoch = 0
        self._obs_pos = self._names.index("obs") if "obs" in spec else -1
        self._term_pos = self._names.index("terminated") if "terminated" in spec else -1
        self._trunc_pos = self._names.index("truncated") if "truncated" in spec else -1
        # flat [T * lanes] views of the fields (spec order) and of link, for add_one
        self._flat1: list[Any] | None = None

    # ------------------------------------------------------------------ sizes
    @property
    def size(self) -> int:
        """Live steps over all lanes."""
        return int(self.counts.sum())

    @property
    def side_capacity(self) -> int:
        """Allocated side slots."""
        return int(next(iter(self.side.values())).shape[0]) if self.side else 0

    def side_in_use(self) -> int:
        """Side slots holding a next observation."""
        return self.side_capacity - len(self._free)

    def rebuild_free_list(self) -> None:
        """Recompute free side slots from the links of live steps (after a load/reopen)."""
        used = np.zeros(self.side_capacity, dtype=bool)
        for lane in range(self.lanes):
            c, w = int(self.counts[lane]), int(self.written[lane])
            if c == 0:
                continue
            rows = np.arange(w - c, w) % self.T
            lk = self.link[rows, lane]
            used[lk[lk > 0] - 1] = True
        self._free = [int(i) for i in np.flatnonzero(~used)[::-1]]

    # ------------------------------------------------------------------ side store
    def _alloc(self, k: int) -> IntArray:
        if k > len(self._free):
            cap = self.side_capacity
            new = min(self._side_cap_max, max(cap * 2, cap + k))
            for name in self.obs_fields:
                self.side[name] = self.backend.resize(f"side/{name}", self.side[name], new)
            self._free[:0] = range(new - 1, cap - 1, -1)
        if k == 0:
            return np.zeros(0, dtype=np.int64)
        out = np.array(self._free[-k:][::-1], dtype=np.int64)
        del self._free[-k:]
        return out

    def _release(self, links: npt.NDArray[Any]) -> None:
        lk = np.asarray(links).reshape(-1)
        self._free.extend((lk[lk > 0] - 1).tolist())

    # ------------------------------------------------------------------ write
    # any lanes, in step or not (hands over to write_sync when all lanes are in step);
    # bound from replaybank.storage.table_write, no wrapper in between
    write = table_write.write

    def write_sync(self, values: Mapping[str, Any], next_obs: Mapping[str, Any],
                    done: BoolArray, n: int, want_keys: bool = True) -> IntArray:
        """:meth:`write` for every lane at once when all lanes are in step (the common case).

        Same steps as the general path with Python-int bookkeeping and slice writes.
        Precondition: every lane has the same ``written`` and ``counts`` (always true with
        one lane) and ``n >= 1``.

        Args:
            values: Every stored field, ``[n, lanes, *shape]``.
            next_obs: Next observation of every obs field, ``[n, lanes, *shape]``.
            done: ``terminated | truncated``, ``[n, lanes]`` bool.
            n: Number of steps.
            want_keys: Return the keys (False: an empty array).

        Returns:
            Item keys ``[n, lanes]``.
        """
        be, T, L = self.backend, self.T, self.lanes  # noqa: N806
        w, c = int(self.written[0]), int(self.counts[0])
        keys = np.arange(w * L, (w + n) * L, dtype=np.int64).reshape(n, L) if want_keys \
            else _NO_KEYS
        k0 = max(0, n - T)
        if k0:
            values = {k: v[k0:] for k, v in values.items()}
            next_obs = {k: v[k0:] for k, v in next_obs.items()}
        nk = n - k0
        done_k = done[k0:] if k0 else done
        start = (w + k0) % T
        wraps = start + nk > T
        index: Any = (start + np.arange(nk)) % T if wraps else slice(start, start + nk)
        link = self.link
        new_c = min(c + n, T)
        kept_old = max(c - max(0, c + n - T), 0)
        free = self._free

        # 1. evict: drop leaving steps from counts first, then free their side slots
        if kept_old < c:
            if self._durable or L > 1:
                self.counts[:] = kept_old
            if k0 == 0:
                j0 = T - c  # new steps j >= j0 overwrite live old steps
                old = link[(start + j0 + np.arange(n - j0)) % T] if wraps else \
                    link[start + j0:start + n]
            else:
                rows = (start + np.arange(nk)) % T
                old = link[rows][((rows - (w - c)) % T) < c]
            if np.count_nonzero(old):
                old = old[old > 0]
                free.extend((old - 1).tolist())

        # 2. continuity of the previous newest steps with the first new obs
        relink: Any = None
        if kept_old:
            prow = (w - 1) % T
            if L == 1:
                p = int(link[prow, 0])
                if p and not (self.arrays["terminated"][prow, 0]
                              or self.arrays["truncated"][prow, 0]) and all(
                        same_bytes(be.to_numpy(self.side[nm][p - 1]), values[nm][0, 0])
                        for nm in self.obs_fields):
                    relink = p
            else:
                plink = link[prow]  # [L]
                same = (plink > 0) & ~(np.asarray(self.arrays["terminated"][prow], dtype=bool)
                                       | np.asarray(self.arrays["truncated"][prow], dtype=bool))
                if same.any():
                    for nm in self.obs_fields:
                        same &= bitwise_equal_rows(be.to_numpy(be.gather(
                            self.side[nm], np.maximum(plink - 1, 0))), values[nm][0])
                    if same.any():
                        relink = np.where(same, plink, 0)

        # 3. links inside the chunk: continue unless done or next_obs differs
        need = chunk_breaks(self.obs_fields, values, next_obs, done_k) if nk > 1 else None
        if need is None:  # only the newest step of each lane is kept aside
            if L == 1:
                slot = free.pop() if free else int(self._alloc(1)[0])
                for nm in self.obs_fields:
                    be.write(self.side[nm], slot, next_obs[nm][-1, 0])
                link[index] = 0
                last = (start + nk - 1) % T
                link[last, 0] = slot + 1
            else:
                slots = self._alloc(L)
                for nm in self.obs_fields:
                    be.write(self.side[nm], slots, next_obs[nm][-1])
                link[index] = 0
                link[(start + nk - 1) % T] = slots + 1
        else:
            links = np.zeros((nk, L), dtype=np.int32)
            slots = self._alloc(int(np.count_nonzero(need)))
            links[need] = slots + 1
            for nm in self.obs_fields:
                be.write(self.side[nm], slots, next_obs[nm][need])
            link[index] = links

        # 4. data (links are in place), then relink the previous newest steps, then counters
        for nm, v in values.items():
            be.write(self.arrays[nm], index, v)
        if relink is not None:
            prow = (w - 1) % T
            if L == 1:
                link[prow, 0] = 0
                free.append(relink - 1)
            else:
                link[prow][relink > 0] = 0
                free.extend((relink[relink > 0] - 1).tolist())
        self.written[:] = w + n
        self.counts[:] = new_c
        if L == 1:
            ends = int(np.count_nonzero(done))
            if ends:
                self.episodes[0] += ends
        else:
            self.episodes += done.sum(axis=0)
        return keys

    def add_one(self, vals: Sequence[Any], next_obs: Any, done: bool) -> int:
        """Append one step to a single-lane table whose only obs field is ``obs``.

        The lean path behind ``ReplayBuffer.add`` for one env: same semantics as
        :meth:`write` with ``n = m = 1``, without array bookkeeping.

        Args:
            vals: One value per spec field, in spec order (already of the field's dtype
                and shape, or a Python scalar of a matching kind).
            next_obs: The step's next observation (``obs`` field dtype and shape).
            done: ``terminated or truncated``.

        Returns:
            The item key of the step.
        """
        flats = self._flat1
        if flats is None:
            flats = self._flat1 = [*(self.flat(self.arrays[nm]) for nm in self._names),
                                   self.flat(self.link)]
        T, free = self.T, self._free  # noqa: N806
        link = flats[-1]
        w, c = int(self.written[0]), int(self.counts[0])
        row = w % T
        if c == T:  # the oldest step leaves the ring: drop it from counts, free its slot
            if self._durable:
                self.counts[0] = c - 1
            old = int(link[row])
            if old:
                free.append(old - 1)
        relink = 0
        prow = row - 1 if row else T - 1
        if c and T > 1:
            pl = int(link[prow])
            if pl and not (flats[self._term_pos][prow] or flats[self._trunc_pos][prow]) \
                    and self.side["obs"][pl - 1].tobytes() == vals[self._obs_pos].tobytes():
                relink = pl
        slot = free.pop() if free else int(self._alloc(1)[0])
        self.side["obs"][slot] = next_obs
        for arr, v in zip(flats, vals):  # noqa: B905 - flats has one more entry (link)
            arr[row] = v
        link[row] = slot + 1
        if relink:
            link[prow] = 0
            free.append(relink - 1)
        self.written[0] = w + 1
        if c < T or self._durable:
            self.counts[0] = c + 1 if c < T else T
        if done:
            self.episodes[0] += 1
        return w

    def clear(self) -> None:
        """Drop every step (sequence numbers keep counting, so old keys turn stale)."""
        self.counts[:] = 0
        self.link[:] = 0
        self.epoch += 1
        self._free = list(range(self.side_capacity - 1, -1, -1))

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

    def state_arrays(self) -> dict[str, npt.NDArray[Any]]:
        """Bookkeeping arrays by name (for checkpoints)."""
        return {"written": self.written, "counts": self.counts, "episodes": self.episodes,
                "link": self.link}
