"""Fast paths for the common ``add`` / ``extend`` calls of :class:`ReplayBuffer`.

Once a buffer's storage exists, most calls pass exactly the fields it stores, as numpy
arrays of the stored dtype and shape (or Python scalars for scalar fields). A
:class:`FastPlan` recognises such calls with a few type and shape comparisons and
writes them without the general validation machinery. Anything else (a missing or
extra field, another dtype, a list, a torch tensor, nested observations, ``env_ids``,
priorities) returns ``None``/``False`` here and takes the general path, which validates
every value before anything is written. The fast path never writes partially: it
decides first, then writes.

One in-memory lane (the common single-env case) has lean paths: :meth:`FastPlan.add_lane`
and :meth:`FastPlan.extend_lane` write straight into flat ``[T, *shape]`` views with
Python-int bookkeeping, and decide the continuity of a chunk with one byte comparison
per run between episode ends. They produce exactly the links, side slots and counters
of :meth:`StepTable.add_one` / :meth:`StepTable.write_sync` (``tests/test_fastpath.py``
checks the whole state against the general path).

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=10, seed=0)
    >>> kw = dict(obs=np.zeros(3, np.float32), action=np.zeros(2, np.float32), reward=1.0,
    ...           next_obs=np.ones(3, np.float32), terminated=False, truncated=False)
    >>> buf.add(**kw)  # first add: general path, allocates storage
    >>> plan = FastPlan(buf.table, sampler=None)
    >>> plan.add_one(kw), len(buf)
    (True, 2)
    >>> plan.add_one({**kw, "reward": [1.0]})  # a list: leave it to the general path
    False
    >>> plan.add_lane(kw), len(buf)
    (True, 3)
    >>> chunk = dict(obs=np.array([[1, 1, 1], [2, 2, 2]], np.float32),
    ...              next_obs=np.array([[2, 2, 2], [3, 3, 3]], np.float32),
    ...              action=np.zeros((2, 2), np.float32), reward=np.ones(2, np.float32),
    ...              terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))
    >>> plan.extend_lane(chunk), len(buf)
    (True, 5)
    >>> plan.extend_lane({**chunk, "reward": chunk["reward"].astype(np.float64)})
    False
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from replaybank.storage.backend import NumpyBackend
from replaybank.storage.table import StepTable

__all__ = ["FastPlan"]


def _raw_count_nonzero() -> Callable[[Any], int]:
    """numpy's C ``count_nonzero`` without the Python dispatch wrapper (~5x cheaper)."""
    for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            fn = getattr(importlib.import_module(mod), "count_nonzero", None)
        except ImportError:  # pragma: no cover - depends on the numpy version
            continue
        if callable(fn):
            return fn  # type: ignore[no-any-return]
    return np.count_nonzero  # pragma: no cover


_count_nonzero = _raw_count_nonzero()
_MAX_ENDS = 16  # chunks with more episode ends than this take the general path


_FLOAT_SCALARS = (float, np.float64, np.float32, np.float16)


def _scalar_types(dtype: np.dtype[Any]) -> tuple[type, ...]:
    """Python/numpy scalar types that cast to ``dtype`` exactly as the general path does."""
    if dtype.kind == "f":
        return (*_FLOAT_SCALARS, dtype.type)
    if dtype.kind == "b":
        return (bool, np.bool_)
    return (dtype.type,)  # ints: only the exact numpy type (no range check needed)


class FastPlan:
    """Precomputed checks for one table: which calls may skip full validation.

    Args:
        table: The step table (one obs field named ``obs``, numpy arrays).
        sampler: Told about writes when not None (``on_write(slots, None)``).
    """

    def __init__(self, table: StepTable, sampler: Any = None) -> None:
        self.table = table
        self.sampler = sampler
        spec = table.spec
        self.names = list(spec)
        self.fields = [(n, f.dtype, f.shape) for n, f in spec.items()]
        self.singles = [(n, f.dtype, f.shape, _scalar_types(f.dtype) if f.shape == () else ())
                        for n, f in spec.items()]
        self.obs = (spec["obs"].dtype, spec["obs"].shape)
        self.keys = frozenset([*spec, "next_obs"])
        self.all_lanes = np.arange(table.lanes, dtype=np.int64)
        # what the plan was built for (the buffer rebuilds it when these change)
        self.owner: Any = sampler
        self.view: Any = None
        self._expected: dict[tuple[Any, Any], list[tuple[str, Any, Any, Any]]] = {}
        # lean single-lane add/extend: in-memory numpy only (a persistent backend records
        # its owner on the first write and orders writes for crash safety: general path)
        flags = [spec[k].shape if k in spec else None for k in ("terminated", "truncated")]
        self.lean = table.lanes == 1 and type(table.backend) is NumpyBackend \
            and table.obs_fields == ["obs"] and flags == [(), ()]
        self._steps: dict[int, list[tuple[tuple[int, ...], Any]]] = {}
        self.order = [*self.names, "next_obs"]
        self.n_keys = len(self.order)
        self.T = table.T
        self.obs_at = self.names.index("obs")
        self.term_at = self.names.index("terminated") if self.lean else -1
        self.trunc_at = self.names.index("truncated") if self.lean else -1
        self._lane: tuple[Any, Any, Any, Any, Any, list[Any]] | None = None
        # single adds: the value types of the last accepted call, and its array checks
        self._sig: list[type] = []
        self._nd: list[tuple[int, tuple[int, ...], Any]] = []

    def arrays(self, fields: dict[str, Any], lead: tuple[int, ...],
               out: tuple[int, int]) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """Zero-copy ``[n, m, *shape]`` views when every value already matches, else None.

        Args:
            fields: The user's keyword fields.
            lead: Leading dims every value must have (``(n,)``, ``(m,)``, ``(n, m)``).
            out: The ``(n_steps, n_lanes)`` leading dims to reshape to.
        """
        if fields.keys() != self.keys:
            return None
        exp = self._expected.get((lead, out))
        if exp is None:
            exp = [(n, dt, lead + shape, out + shape) for n, dt, shape in self.fields]
            exp.append(("next_obs", self.obs[0], lead + self.obs[1], out + self.obs[1]))
            if len(self._expected) > 16:
                self._expected.clear()
            self._expected[(lead, out)] = exp
        values: dict[str, Any] = {}
        for name, dt, full, shaped in exp:
            v = fields[name]
            if type(v) is not np.ndarray or v.shape != full or v.dtype != dt:
                return None
            values[name] = v.reshape(shaped)
        return values, {"obs": values.pop("next_obs")}

    def write(self, fields: dict[str, Any], lead: tuple[int, ...], out: tuple[int, int]) -> bool:
        """Write all lanes' ``[n, m]`` steps when the call qualifies; False otherwise."""
        ready = self.arrays(fields, lead, out)
        if ready is None:
            return False
        t, (values, nxt) = self.table, ready
        if t.lanes == 1:  # one lane is always in step: skip the general dispatch
            done = np.logical_or(values["terminated"], values["truncated"])
            keys = t.write_sync(values, nxt, done, out[0], self.sampler is not None) \
                if out[0] else t.write(self.all_lanes, values, nxt)
        else:
            keys = t.write(self.all_lanes, values, nxt, want_keys=self.sampler is not None)
        if self.sampler is not None:
            self.sampler.on_write((keys.reshape(-1) // t.lanes % t.T) * t.lanes
                                  + keys.reshape(-1) % t.lanes, None)
        return True

    def add_one(self, fields: dict[str, Any]) -> bool:
        """Add one step to a single-lane table when the call qualifies; False otherwise."""
        if fields.keys() != self.keys:
            return False
        vals = []
        for name, dt, shape, scalars in self.singles:
            v = fields[name]
            tv = type(v)
            if tv is np.ndarray:
                if v.shape != shape or (v.dtype is not dt and v.dtype != dt):
                    return False
            elif tv not in scalars:
                return False
            vals.append(v)
        nv = fields["next_obs"]
        if type(nv) is not np.ndarray or nv.shape != self.obs[1] or (
                nv.dtype is not self.obs[0] and nv.dtype != self.obs[0]):
            return False
        key = self.table.add_one(vals, nv, bool(fields["terminated"])
                                 or bool(fields["truncated"]))
        if self.sampler is not None:
            self.sampler.on_write(np.array([key % self.table.T], dtype=np.int64), None)
        return True

    def extend_lane(self, fields: dict[str, Any]) -> bool:
        """Append ``n`` steps to a single-lane in-memory table; False: not handled.

        The lean path behind ``ReplayBuffer.extend`` with one env: exact-dtype numpy
        values ``[n, *shape]`` whose chunk does not wrap around the ring. Continuity is
        decided with one byte comparison per run between episode ends; a chunk with an
        out-of-order step (or many episode ends) goes to the general path, which finds
        exactly which steps to keep aside. Same semantics, links and side-slot order as
        :meth:`StepTable.write_sync`.

        Args:
            fields: The user's keyword fields.

        Returns:
            True when the chunk was written; False when the call must be validated and
            written by the general path (nothing was changed).
        """
        if len(fields) != self.n_keys:
            return False
        try:  # same count and every name present: exactly the stored fields
            vals = list(map(fields.__getitem__, self.order))  # spec order, then next_obs
        except KeyError:
            return False
        obs = vals[self.obs_at]
        if type(obs) is not np.ndarray:
            return False
        lead = obs.shape
        n = lead[0] if lead else 0
        want = self._steps.get(n)
        if want is None:  # (shape, dtype) of every value for chunks of n steps
            want = [((n, *shape), dt) for _, dt, shape in self.fields]
            want.append(((n, *self.obs[1]), self.obs[0]))
            if len(self._steps) > 16:
                self._steps.clear()
            self._steps[n] = want
        for v, (shape, dt) in zip(vals, want):  # noqa: B905 - same length
            if type(v) is not np.ndarray or v.shape != shape or (v.dtype is not dt
                                                                 and v.dtype != dt):
                return False
        t = self.table
        lane = self._lane
        if lane is None:
            lane = self._lane = self._lane_arrays()
        link, written, counts, term_s, trunc_s, flats = lane
        T = t.T  # noqa: N806
        w, c = written.item(0), counts.item(0)
        start = w % T
        end = start + n
        if n < 2 or end > T:  # tiny or wrapping chunks: the general slice/index logic
            return self.write(fields, (n,), (n, 1))
        nobs = vals[-1]
        term, trunc = vals[self.term_at], vals[self.trunc_at]
        ends = _count_nonzero(term) + _count_nonzero(trunc)
        stops: list[int] | None = None
        if ends:
            done = term | trunc
            stops = done[:-1].nonzero()[0].tolist()
            if len(stops) > _MAX_ENDS:
                return self.write(fields, (n,), (n, 1))
            lo = 0
            for hi in (*stops, n - 1):  # runs between episode ends continue step to step
                if hi > lo and nobs[lo:hi].tobytes() != obs[lo + 1:hi + 1].tobytes():
                    return self.write(fields, (n,), (n, 1))
                lo = hi + 1
            ends = _count_nonzero(done)
        elif nobs[:-1].tobytes() != obs[1:].tobytes():
            return self.write(fields, (n,), (n, 1))
        # decided: write (same order as StepTable.write_sync)
        free = t._free
        side = t.side["obs"]
        # 1. evict: live steps whose rows are overwritten free their side slots
        old = link[start:end]
        dirty = _count_nonzero(old)
        if dirty and c + n > T:
            old = old[T - c:]  # rows before T - c held no live step
            if _count_nonzero(old):
                free.extend((old[old > 0] - 1).tolist())
        # 2. does the previous newest step (if it survives) continue into this chunk?
        relink = 0
        prow = start - 1 if start else T - 1
        if c and n < T:  # (n == T overwrites every old step, the previous newest too)
            relink = link.item(prow)
            if relink and (term_s.item(prow) or trunc_s.item(prow)
                           or side[relink - 1].tobytes() != obs[0].tobytes()):
                relink = 0
        # 3. side slots and links of the chunk: only episode ends and the newest step
        if dirty:
            link[start:end] = 0
        if stops is None:
            if free:
                slot = free.pop()
                side[slot] = nobs[-1]
            else:
                slot = int(t._alloc(1)[0])
                t.side["obs"][slot] = nobs[-1]
            link[end - 1] = slot + 1
        elif len(free) > len(stops):  # same slots, same order as t._alloc(len(stops) + 1)
            for row in (*stops, n - 1):
                slot = free.pop()
                side[slot] = nobs[row]
                link[start + row] = slot + 1
        else:
            slots = t._alloc(len(stops) + 1)
            at = np.array([*stops, n - 1], dtype=np.int64)
            t.side["obs"][slots] = nobs[at]
            link[start + at] = slots + 1
        # 4. data, then relink the previous newest step, then the counters
        for arr, v in zip(flats, vals):  # noqa: B905 - vals ends with next_obs
            arr[start:end] = v
        if relink:
            link[prow] = 0
            free.append(relink - 1)
        written[0] = w + n
        if c != T:
            counts[0] = c + n if c + n < T else T
        if ends:
            t.episodes[0] += ends
        if self.sampler is not None:
            self.sampler.on_write(np.arange(start, end, dtype=np.int64), None)
        return True

    def add_lane(self, fields: dict[str, Any]) -> bool:
        """Add one step to a single-lane in-memory table; False: not handled.

        The lean path behind ``ReplayBuffer.add`` with one env: same semantics, links
        and side-slot order as :meth:`StepTable.add_one`. Values must be numpy arrays of
        the stored dtype and shape, or Python/numpy scalars of a matching kind for scalar
        fields; when the value types are those of the previous accepted call, only the
        arrays' shapes and dtypes are checked again.

        Args:
            fields: The user's keyword fields.

        Returns:
            True when the step was written; False when the general path must validate
            and write it (nothing was changed).
        """
        if len(fields) != self.n_keys:
            return False
        try:  # same count and every name present: exactly the stored fields
            vals = list(map(fields.__getitem__, self.order))  # spec order, then next_obs
        except KeyError:
            return False
        if list(map(type, vals)) == self._sig:
            for i, shape, dt in self._nd:
                v = vals[i]
                if v.shape != shape or (v.dtype is not dt and v.dtype != dt):
                    return False
        elif not self._accept_one(vals):
            return False
        t = self.table
        lane = self._lane
        if lane is None:
            lane = self._lane = self._lane_arrays()
        link, written, counts, term_s, trunc_s, flats = lane
        T, free, side = self.T, t._free, t.side["obs"]  # noqa: N806
        w, c = written.item(0), counts.item(0)
        row = w % T
        if c == T:  # the oldest step leaves the ring: free its side slot
            old = link.item(row)
            if old:
                free.append(old - 1)
        relink = 0
        prow = row - 1 if row else T - 1
        if c and T > 1:  # does the previous newest step continue into this one?
            relink = link.item(prow)
            if relink and (term_s.item(prow) or trunc_s.item(prow)
                           or side[relink - 1].tobytes() != vals[self.obs_at].tobytes()):
                relink = 0
        if free:
            slot = free.pop()
            side[slot] = vals[-1]
        else:
            slot = int(t._alloc(1)[0])
            t.side["obs"][slot] = vals[-1]
        for arr, v in zip(flats, vals):  # noqa: B905 - vals ends with next_obs
            arr[row] = v
        link[row] = slot + 1
        if relink:
            link[prow] = 0
            free.append(relink - 1)
        written[0] = w + 1
        if c < T:
            counts[0] = c + 1
        if vals[self.term_at] or vals[self.trunc_at]:
            t.episodes[0] += 1
        if self.sampler is not None:
            self.sampler.on_write(np.array([row], dtype=np.int64), None)
        return True

    def _accept_one(self, vals: list[Any]) -> bool:
        """Full check of one add's values (spec order, then next_obs); remembers the
        value types and array checks of an accepted call for the next one."""
        at: list[int] = []
        for i, (v, (_, dt, shape, scalars)) in enumerate(zip(vals, self.singles, strict=False)):
            if type(v) is np.ndarray:
                if v.shape != shape or v.dtype != dt:
                    return False
                at.append(i)
            elif type(v) not in scalars:
                return False
        nv = vals[-1]
        if type(nv) is not np.ndarray or nv.shape != self.obs[1] or nv.dtype != self.obs[0]:
            return False
        at.append(len(vals) - 1)
        self._sig = list(map(type, vals))
        self._nd = [(i, vals[i].shape, vals[i].dtype) for i in at]
        return True

    def _lane_arrays(self) -> tuple[Any, Any, Any, Any, Any, list[Any]]:
        """Flat ``[T]`` views of a single-lane table: link, written, counts, terminated,
        truncated, and every field in spec order (numpy tables never replace them)."""
        t = self.table
        return (t.flat(t.link), t.written, t.counts, t.flat(t.arrays["terminated"]),
                t.flat(t.arrays["truncated"]), [t.flat(t.arrays[nm]) for nm in self.names])
