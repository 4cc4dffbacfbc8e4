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

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops import ring
from replaybank.ops.continuity import bitwise_equal_rows, chunk_breaks, same_bytes
from replaybank.spec import Spec
from replaybank.storage.backend import ArrayBackend, NumpyBackend, check_fits

__all__ = ["StepTable", "bitwise_equal_rows"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
_NO_KEYS: IntArray = np.zeros((0, 0), dtype=np.int64)
_INT64 = np.dtype(np.int64)


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
        self._plan: tuple[tuple[Any, ...], Any] | None = None  # see _read_plan
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
    def write(
        self,
        lane_ids: IntArray,
        values: Mapping[str, npt.NDArray[Any]],
        next_obs: Mapping[str, npt.NDArray[Any]],
        done: BoolArray | None = None,
        want_keys: bool = True,
    ) -> IntArray:
        """Append ``n`` steps to each lane in ``lane_ids``.

        Args:
            lane_ids: Distinct lanes, ``[m]``.
            values: Every stored field, ``[n, m, *shape]``, already validated and cast.
            next_obs: Next observation of every obs field, ``[n, m, *shape]``.
            done: ``terminated | truncated``, ``[n, m]``; read from ``values`` when None.
            want_keys: Return the keys (False: an empty array, slightly faster).

        Returns:
            Item keys of the written steps, ``[n, m]``.
        """
        be, T, L = self.backend, self.T, self.lanes  # noqa: N806
        lane_ids = np.asarray(lane_ids, dtype=np.int64)
        first = next(iter(values.values()))
        n, m = int(first.shape[0]), int(first.shape[1])
        all_lanes = m == L and (L == 1 or bool(np.all(lane_ids == np.arange(L))))
        if done is None:
            done = np.asarray(values["terminated"], dtype=bool) | \
                np.asarray(values["truncated"], dtype=bool)
        if n and all_lanes and (L == 1 or (self.written.min() == self.written.max()
                                           and self.counts.min() == self.counts.max())):
            return self.write_sync(values, next_obs, done, n, want_keys)
        s0 = self.written.copy() if all_lanes else self.written[lane_ids]  # [m]
        keys = (s0[None, :] + np.arange(n)[:, None]) * L + lane_ids[None, :]  # [n, m]
        if n == 0:
            return keys
        c0 = self.counts.copy() if all_lanes else self.counts[lane_ids]  # [m]
        # steps that this same write overwrites again (n > T) are dropped
        k0 = max(0, n - T)
        nk = n - k0
        if k0:
            values = {k: v[k0:] for k, v in values.items()}
            next_obs = {k: v[k0:] for k, v in next_obs.items()}
        done_k = done[k0:]
        new_counts = np.minimum(c0 + n, T)
        # rows of the kept steps: [nk, m]; equal across lanes when the lanes are in step
        sync = bool(np.all(s0 == s0[0]))
        start = int(s0[0] + k0) % T
        if sync:
            rows1 = (start + np.arange(nk)) % T  # [nk]
            rows = np.broadcast_to(rows1[:, None], (nk, m))
        else:
            rows = (s0[None, :] + k0 + np.arange(nk)[:, None]) % T
        lanes_b = np.broadcast_to(lane_ids[None, :], (nk, m))
        if sync and all_lanes:
            index: Any = slice(start, start + nk) if start + nk <= T else rows1
        else:
            index = (rows, lanes_b)

        # 1. evict: old live steps whose rows are written now leave the ring; drop them
        #    from counts first, then free their side slots
        prev_live = (c0 > 0) & (new_counts > n)  # the previous newest step survives
        if np.any(c0 > 0):
            old_links = self.link[index].reshape(nk, m)  # [nk, m] links of rows overwritten
            evicted = ((rows - (s0 - c0)[None, :]) % T < c0[None, :]) & (old_links > 0)
            kept_old = np.maximum(c0 - np.maximum(0, c0 + n - T), 0)
            if all_lanes:
                self.counts[:] = kept_old
            else:
                self.counts[lane_ids] = kept_old
            if np.any(evicted):
                self._release(old_links[evicted])

        # 2. continuity of each lane's previous newest step with the first new obs
        cont_prev: tuple[IntArray, IntArray, Any] | None = None
        if k0 == 0 and np.any(prev_live):
            js = np.flatnonzero(prev_live)
            prow = (s0[js] - 1) % T
            plane = lane_ids[js]
            plink = self.link[prow, plane]
            pend = plink > 0
            js, prow, plane, plink = js[pend], prow[pend], plane[pend], plink[pend]
            if len(js):
                same = ~(np.asarray(be.to_numpy(be.gather(self.arrays["terminated"],
                                                          (prow, plane))), dtype=bool)
                         | np.asarray(be.to_numpy(be.gather(self.arrays["truncated"],
                                                            (prow, plane))), dtype=bool))
                for name in self.obs_fields:
                    kept = be.to_numpy(be.gather(self.side[name], plink - 1))
                    same &= bitwise_equal_rows(kept, values[name][0, js])
                # relinked after the row they will point to is written
                cont_prev = (prow[same], plane[same], plink[same])

        # 3. links inside the chunk: continue unless done or next_obs differs
        need = np.ones((nk, m), dtype=bool)  # the last step of each lane is always pending
        if nk > 1:
            cont = ~done_k[:-1]
            for name in self.obs_fields:
                a = next_obs[name][:-1].reshape((nk - 1) * m, -1)
                b = values[name][1:].reshape((nk - 1) * m, -1)
                cont &= bitwise_equal_rows(a, b).reshape(nk - 1, m)
            need[:-1] = ~cont
        links = np.zeros((nk, m), dtype=np.int32)
        if nk == 1:
            slots = self._alloc(m)
            links[0] = slots + 1
            for name in self.obs_fields:
                be.write(self.side[name], slots, next_obs[name][0])
        else:
            slots = self._alloc(int(np.count_nonzero(need)))
            links[need] = slots + 1
            for name in self.obs_fields:
                be.write(self.side[name], slots, next_obs[name][need])

        # 4. data and links, then relink the previous newest steps, then counters
        for name, v in values.items():
            be.write(self.arrays[name], index, v)
        self.link[index] = links
        if cont_prev is not None and len(cont_prev[0]):
            self.link[cont_prev[0], cont_prev[1]] = 0
            self._release(cont_prev[2])
        if all_lanes:
            self.written += n
            self.counts[:] = new_counts
            self.episodes += done.sum(axis=0)
        else:
            self.written[lane_ids] = s0 + n
            self.counts[lane_ids] = new_counts
            self.episodes[lane_ids] += done.sum(axis=0)
        return keys

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
    def rows_lanes(self, keys: IntArray) -> tuple[IntArray, IntArray]:
        """Storage coordinates (row, lane) of item keys."""
        seq, lane = ring.key_to_seq(keys, self.lanes)
        return seq % self.T, lane

    def gather(self, name: str, keys: IntArray) -> Any:
        """Field ``name`` of the steps ``keys``: ``[B, *shape]``."""
        return self.backend.gather(self.arrays[name], self.rows_lanes(keys))

    def gather_next(self, name: str, keys: IntArray) -> Any:
        """Next observation (obs field ``name``) of the steps ``keys``: ``[B, *shape]``.

        Exactly the ``next_obs`` the caller passed for each step.
        """
        return self.take_next(name, *self.next_index(self.slots_of(keys)))

    # flat-slot reads: one fancy index on axis 0 of a [T * lanes, *shape] view
    def slots_of(self, keys: IntArray) -> IntArray:
        """Storage slots (``row * lanes + lane``) of item keys, ``[B]``."""
        keys = np.asarray(keys, dtype=np.int64)
        L = self.lanes  # noqa: N806
        if L == 1:
            return keys % self.T
        return keys // L % self.T * L + keys % L

    def flat(self, array: Any) -> Any:
        """``array`` ``[T, lanes, *shape]`` viewed as ``[T * lanes, *shape]`` (cached)."""
        cached = self._flat_cache.get(id(array))
        if cached is not None and cached[0] is array:
            return cached[1]
        view = array.reshape((self.T * self.lanes, *array.shape[2:]))
        self._flat_cache[id(array)] = (array, view)
        return view

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

    def take_next(self, name: str, nxt: IntArray, pos: IntArray, side: IntArray) -> Any:
        """Next observations from :meth:`next_index`'s result: ``[B, *shape]``."""
        be = self.backend
        out = be.gather(self.flat(self.arrays[name]), nxt)
        if len(pos):
            be.write(out, pos, be.gather(self.side[name], side))
        return out

    def gather_transitions(self, keys: IntArray, live: bool = False) -> dict[str, Any]:
        """Every field of the steps ``keys`` plus ``next_<obs field>``, each ``[B, *shape]``.

        The same as :meth:`take` for every field and :meth:`take_next` for every obs field
        (exactly the ``next_obs`` the caller passed), in one pass: numpy storage does one
        flat ``take`` per field, the next observations wrapping around the ring in the
        ``take`` itself.

        Args:
            keys: Item keys ``[B]``.
            live: The keys are known to be live (just drawn by a sampler): a one-lane
                table then finds their slots without a modulo.

        Returns:
            ``{name: [B, *shape]}`` for the stored fields, then ``next_<obs field>``.

        Example:
            >>> import numpy as np
            >>> from replaybank.spec import Spec
            >>> t = StepTable(Spec.coerce({"obs": ((), "int64"), "terminated": ((), "bool"),
            ...                            "truncated": ((), "bool")}), T=2, lanes=1,
            ...               obs_fields=["obs"])
            >>> no = np.zeros((3, 1), bool)
            >>> _ = t.write(np.array([0]), {"obs": np.array([[5], [6], [7]]),
            ...             "terminated": no, "truncated": no}, {"obs": np.array([[6], [7], [8]])})
            >>> out = t.gather_transitions(np.array([1, 2]))
            >>> out["obs"].tolist(), out["next_obs"].tolist()
            ([6, 7], [7, 8])
        """
        T = self.T  # noqa: N806
        if type(self.backend) is not NumpyBackend:
            slots = self.slots_of(keys)  # [B]
            out: dict[str, Any] = {name: self.take(name, slots) for name in self.arrays}
            where = self.next_index(slots)
            for name in self.obs_fields:
                out["next_" + name] = self.take_next(name, *where)
            return out
        fresh = False
        if live and self.lanes == 1 and type(keys) is np.ndarray and keys.dtype is _INT64:
            # the live keys lie in [oldest, written) inside [base, base + 2T) with base the
            # multiple of T at or below oldest: keys - base are slots up to one wrap, which
            # take's mode="wrap" removes (cheaper than keys % T)
            written = self.written.item(0)
            oldest = written - self.counts.item(0)
            base = oldest - oldest % T
            slots = keys if base == 0 else keys - base
            fresh = written < T  # then every slot + 1 < T too
        else:
            slots = self.slots_of(keys)  # [B]
        fields, link, nexts = self._read_plan()
        out = {name: arr.take(slots, axis=0, mode="wrap") for name, arr in fields}
        if not nexts:
            return out
        lk = link.take(slots, mode="wrap")
        pos = lk.nonzero()[0]
        side_slots = lk.take(pos) - 1 if len(pos) else None
        # the next step's slot is slots + lanes, wrapped by take itself; None: slots + 1 < T,
        # take from the obs fields shifted by one row
        nxt = None if fresh else slots + self.lanes
        for name, arr, shifted, key in nexts:
            o = shifted.take(slots, axis=0) if nxt is None else \
                arr.take(nxt, axis=0, mode="wrap")
            if side_slots is not None:
                o[pos] = self.side[name].take(side_slots, axis=0)
            out[key] = o
        return out

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
            >>> t = StepTable(Spec.coerce({"obs": ((), "int64"), "reward": ((), "float32")}),
            ...               T=4, lanes=1, obs_fields=["obs"])
            >>> sorted(t.take_fields(np.array([0, 1]), obs=False))
            ['reward']
        """
        if type(self.backend) is not NumpyBackend:
            return {name: self.take(name, slots) for name in self.arrays
                    if obs or name not in self.obs_fields}
        fields = self._read_plan()[0]
        if obs:
            return {name: arr.take(slots, axis=0) for name, arr in fields}
        skip = self.obs_fields
        return {name: arr.take(slots, axis=0) for name, arr in fields if name not in skip}

    def _read_plan(self) -> tuple[list[tuple[str, Any]], Any, list[tuple[str, Any, Any, str]]]:
        """Flat views of the fields and of ``link`` for :meth:`gather_transitions` (each obs
        field also shifted by one row), rebuilt when an array is replaced."""
        plan = self._plan
        if plan is not None and plan[0][-1] is self.link and len(plan[0]) == len(self.arrays) + 1 \
                and all(map(operator.is_, self.arrays.values(), plan[0])):
            cached: tuple[list[tuple[str, Any]], Any, list[tuple[str, Any, Any, str]]] = plan[1]
            return cached
        flat = self.flat
        fields = [(name, flat(arr)) for name, arr in self.arrays.items()]
        nexts = [(name, flat(self.arrays[name]), flat(self.arrays[name])[1:], "next_" + name)
                 for name in self.obs_fields]
        body = (fields, flat(self.link), nexts)
        self._plan = ((*self.arrays.values(), self.link), body)
        return body

    def is_boundary(self, keys: IntArray) -> BoolArray:
        """Whether the next observation of each step is kept aside (episode end,
        discontinuity, or newest step of its lane)."""
        rows, lanes = self.rows_lanes(keys)
        return np.asarray(self.link[rows, lanes] > 0)

    def state_arrays(self) -> dict[str, npt.NDArray[Any]]:
        """Bookkeeping arrays by name (for checkpoints)."""
        return {"written": self.written, "counts": self.counts, "episodes": self.episodes,
                "link": self.link}
