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

from replaybank.ops import ring
from replaybank.spec import Spec
from replaybank.storage.backend import ArrayBackend, NumpyBackend, check_fits

__all__ = ["StepTable", "bitwise_equal_rows"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def bitwise_equal_rows(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> BoolArray:
    """Row-wise bitwise equality of two numpy arrays ``[n, ...]`` (NaN-safe, -0.0 != 0.0).

    Example:
        >>> bitwise_equal_rows(np.array([[np.nan], [1.0]]), np.array([[np.nan], [2.0]])).tolist()
        [True, False]
    """
    n = a.shape[0]
    if n == 0:
        return np.zeros(0, dtype=bool)
    av = np.ascontiguousarray(a).reshape(n, -1).view(np.uint8)
    bv = np.ascontiguousarray(b).reshape(n, -1).view(np.uint8)
    return np.asarray(np.all(av == bv, axis=1))


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
            self._free[:0] = list(range(new - 1, cap - 1, -1))
        out = np.array([self._free.pop() for _ in range(k)], dtype=np.int64)
        return out

    def _release(self, links: npt.NDArray[Any]) -> None:
        for v in np.asarray(links).reshape(-1):
            if v > 0:
                self._free.append(int(v) - 1)

    # ------------------------------------------------------------------ write
    def write(
        self,
        lane_ids: IntArray,
        values: Mapping[str, npt.NDArray[Any]],
        next_obs: Mapping[str, npt.NDArray[Any]],
        done: BoolArray | None = None,
    ) -> IntArray:
        """Append ``n`` steps to each lane in ``lane_ids``.

        Args:
            lane_ids: Distinct lanes, ``[m]``.
            values: Every stored field, ``[n, m, *shape]``, already validated and cast.
            next_obs: Next observation of every obs field, ``[n, m, *shape]``.
            done: ``terminated | truncated``, ``[n, m]``; read from ``values`` when None.

        Returns:
            Item keys of the written steps, ``[n, m]``.
        """
        be, T, L = self.backend, self.T, self.lanes
        lane_ids = np.asarray(lane_ids, dtype=np.int64)
        first = next(iter(values.values()))
        n, m = int(first.shape[0]), int(first.shape[1])
        if done is None:
            done = np.asarray(values["terminated"]) | np.asarray(values["truncated"])
        s0 = self.written[lane_ids].copy()  # [m]
        seq = s0[None, :] + np.arange(n)[:, None]  # [n, m]
        keys = seq * L + lane_ids[None, :]
        # drop steps that this same write overwrites again (n > T)
        k0 = max(0, n - T)
        vals = {k: v[k0:] for k, v in values.items()}
        nxts = {k: v[k0:] for k, v in next_obs.items()}
        done_k = np.asarray(done)[k0:]
        seq_k = seq[k0:]
        nk = n - k0
        rows = seq_k % T  # [nk, m]
        lanes_b = np.broadcast_to(lane_ids[None, :], rows.shape)

        # 1. evict: steps leaving the ring, and drop them from counts first
        new_written = s0 + n
        new_counts = np.minimum(self.counts[lane_ids] + n, T)
        oldest_after = new_written - new_counts  # [m]
        old_oldest = s0 - self.counts[lane_ids]
        for j, lane in enumerate(lane_ids):
            lo, hi = int(old_oldest[j]), min(int(s0[j]), int(oldest_after[j]))
            if hi > lo:
                ev_rows = np.arange(lo, hi) % T
                self._release(self.link[ev_rows, lane])
                self.link[ev_rows, lane] = 0
        self.counts[lane_ids] = np.minimum(self.counts[lane_ids], s0 - oldest_after)
        self.counts[lane_ids] = np.maximum(self.counts[lane_ids], 0)

        # 2. continuity of each lane's previous newest step with the first new obs
        prev_live = (s0 >= 1) & (s0 - 1 >= oldest_after) & (self.counts[lane_ids] > 0)
        if k0 == 0 and np.any(prev_live):
            js = np.flatnonzero(prev_live)
            prow = (s0[js] - 1) % T
            plane = lane_ids[js]
            plink = self.link[prow, plane]
            pend = plink > 0
            if np.any(pend):
                js, prow, plane, plink = js[pend], prow[pend], plane[pend], plink[pend]
                same = np.ones(len(js), dtype=bool)
                for name in self.obs_fields:
                    kept = be.to_numpy(be.gather(self.side[name], plink - 1))
                    same &= bitwise_equal_rows(kept, vals[name][0, js])
                prev_done = np.asarray(be.to_numpy(be.gather(self.arrays["terminated"],
                                                             (prow, plane))), dtype=bool)
                prev_done |= np.asarray(be.to_numpy(be.gather(self.arrays["truncated"],
                                                              (prow, plane))), dtype=bool)
                same &= ~prev_done
                if np.any(same):
                    self._release(plink[same])
                    self.link[prow[same], plane[same]] = 0

        # 3. links inside the chunk: continue unless done or next_obs differs
        links = np.zeros((nk, m), dtype=np.int32)
        cont = np.zeros((nk, m), dtype=bool)
        if nk > 1:
            cont[:-1] = ~done_k[:-1]
            for name in self.obs_fields:
                a = nxts[name][:-1].reshape((nk - 1) * m, -1)
                b = vals[name][1:].reshape((nk - 1) * m, -1)
                cont[:-1] &= bitwise_equal_rows(a, b).reshape(nk - 1, m)
        need = ~cont  # [nk, m]; the last step of each lane is always pending
        n_need = int(need.sum())
        slots = self._alloc(n_need)
        links[need] = (slots + 1).astype(np.int32)
        for name in self.obs_fields:
            be.write(self.side[name], slots, nxts[name][need])

        # 4. data, links, then counters
        if rows.shape[1] == L and np.all(rows == rows[:, :1]) and nk > 0 and \
                np.array_equal(lane_ids, np.arange(L)):
            r = rows[:, 0]
            start = int(r[0])
            if start + nk <= T:
                index: Any = slice(start, start + nk)
            else:
                index = r
            for name, v in vals.items():
                be.write(self.arrays[name], index, v)
            self.link[index] = links
        else:
            for name, v in vals.items():
                be.write(self.arrays[name], (rows, lanes_b), v)
            self.link[rows, lanes_b] = links
        self.episodes[lane_ids] += np.asarray(done, dtype=bool).sum(axis=0)
        self.written[lane_ids] = new_written
        self.counts[lane_ids] = new_counts
        return keys

    def clear(self) -> None:
        """Drop every step (sequence numbers keep counting, so old keys turn stale)."""
        self.counts[:] = 0
        self.link[:] = 0
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
        be = self.backend
        rows, lanes = self.rows_lanes(keys)
        lk = self.link[rows, lanes]
        out = be.gather(self.arrays[name], ((rows + 1) % self.T, lanes))
        side = lk > 0
        if np.any(side):
            pos = np.flatnonzero(side)
            be.write(out, pos, be.gather(self.side[name], lk[pos] - 1))
        return out

    def is_boundary(self, keys: IntArray) -> BoolArray:
        """Whether the next observation of each step is kept aside (episode end,
        discontinuity, or newest step of its lane)."""
        rows, lanes = self.rows_lanes(keys)
        return np.asarray(self.link[rows, lanes] > 0)

    def state_arrays(self) -> dict[str, npt.NDArray[Any]]:
        """Bookkeeping arrays by name (for checkpoints)."""
        return {"written": self.written, "counts": self.counts, "episodes": self.episodes,
                "link": self.link}
