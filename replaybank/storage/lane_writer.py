"""Lean writers of in-memory step tables: ``add`` and ``extend`` in few steps.

Most single-env training loops add steps whose values already are numpy arrays of the
stored dtype and shape (or Python scalars for scalar fields). :class:`LaneWriter`
recognises such calls with a handful of type, shape and dtype comparisons (unrolled
for the standard fields: no per-call lists or dicts) and writes them straight into
flat ``[T, *shape]`` views of the table. Anything else returns ``False`` before a
single byte is written, and the caller takes the general, fully validating path.

``extend`` decides the continuity of a chunk (is ``next_obs[i]`` bitwise
``obs[i + 1]`` within each run between episode ends?) with one byte comparison per run.

When the optional C accelerator ``replaybank._lane`` was built (``setup.py``; it needs
only a C compiler and the Python headers), the plainest calls of any in-memory table
(every lane at once, C-contiguous arrays of exactly the stored format, Python scalars for
the scalar fields of one lane, no extra fields) are decided and written in one C call,
:func:`compiled_writer`; :class:`LaneWriter` and ``StepTable.write_sync`` are its
reference and fallback.
Either way the table ends up exactly as :meth:`StepTable.add_one` /
:meth:`StepTable.write_sync` leave it: same data, links, side slots, free-slot order and
counters (``tests/test_fastpath.py`` checks the whole state against the general path,
with and without the accelerator).

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=10, seed=0)
    >>> o = np.zeros(3, np.float32)
    >>> buf.add(obs=o, action=np.zeros(2, np.float32), reward=1.0, next_obs=o + 1,
    ...         terminated=False, truncated=False)  # first add allocates the table
    >>> w = LaneWriter(buf.table, sampler=None)
    >>> w.add(o + 1, np.zeros(2, np.float32), 0.5, o + 2, False, False, {}), len(buf)
    (True, 2)
    >>> w.add(o + 2, [0.0, 0.0], 0.5, o + 3, False, False, {})  # a list: not handled here
    False
    >>> obs = np.arange(12, dtype=np.float32).reshape(4, 3) + 2
    >>> w.extend(obs, np.zeros((4, 2), np.float32), np.ones(4, np.float32), obs + 3,
    ...          np.zeros(4, bool), np.zeros(4, bool), {}), len(buf)
    (True, 6)
    >>> buf.sample(2).obs.shape
    (2, 3)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.storage.accel import ACCEL as _ACCEL
from replaybank.storage.accel import accelerated
from replaybank.storage.backend import NumpyBackend
from replaybank.storage.memmap import MemmapBackend
from replaybank.storage.table import StepTable

__all__ = ["LaneWriter", "accelerated", "compiled_writer", "lean_table", "not_handled",
           "scalar_types", "write_teller"]

_ND = np.ndarray
_FLOAT_SCALARS = (float, np.float64, np.float32, np.float16)
MAX_ENDS = 16  # chunks with more episode ends than this take the general path


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


count_nonzero = _raw_count_nonzero()


def scalar_types(dtype: np.dtype[Any]) -> tuple[type, ...]:
    """Python/numpy scalar types that cast to ``dtype`` exactly as the general path does.

    Python ints are not listed: they need a range check (see :class:`LaneWriter`).
    """
    if dtype.kind == "f":
        return (*_FLOAT_SCALARS, dtype.type)
    if dtype.kind == "b":
        return (bool, np.bool_)
    return (dtype.type,)  # ints: only the exact numpy type (no range check needed)


def lean_table(table: StepTable) -> bool:
    """Whether :class:`LaneWriter` can serve ``table``: one in-memory numpy lane whose
    observation is the plain field ``obs``, with a plain ``action`` field and scalar
    ``terminated``/``truncated`` flags (a persistent backend orders its writes for
    crash safety: it keeps the general path)."""
    spec = table.spec
    return (table.lanes == 1 and type(table.backend) is NumpyBackend
            and table.obs_fields == ["obs"] and "action" in spec
            and all(k in spec and spec[k].shape == () for k in ("reward", "terminated",
                                                                 "truncated")))


class _Field:
    """What one stored field accepts: ``shape``, ``dtype``, scalar types, int range."""

    __slots__ = ("dtype", "hi", "lo", "scalars", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self.shape = shape
        self.dtype = dtype
        self.scalars = scalar_types(dtype) if shape == () else ()
        ints = shape == () and dtype.kind in "iu"
        self.lo = int(np.iinfo(dtype).min) if ints else 1
        self.hi = int(np.iinfo(dtype).max) if ints else 0

    def one(self, v: Any) -> bool:
        """Whether ``v`` is one step's value, stored without any conversion check."""
        tv = type(v)
        if tv is _ND:
            return bool(v.shape == self.shape and v.dtype == self.dtype)
        return tv in self.scalars or (tv is int and self.lo <= v <= self.hi)

    def many(self, v: Any, n: int) -> bool:
        """Whether ``v`` is an array of ``n`` steps of exactly this field."""
        return type(v) is _ND and v.shape == (n, *self.shape) and v.dtype == self.dtype


def not_handled(*args: Any) -> bool:
    """Stands in for the compiled add/extend/add_lanes when the accelerator is off."""
    return False


def _c_field(store: Any, field: _Field) -> tuple[Any, str, tuple[int, ...], str, int, int]:
    """What the compiled Appender needs to know of one field."""
    kind = field.dtype.kind if field.shape == () and field.dtype.kind in "fiub" else "-"
    lo = max(field.lo, -(2**63)) if kind in "iu" else 0
    hi = min(field.hi, 2**63 - 1) if kind in "iu" else 0
    fmt = memoryview(np.empty(0, field.dtype)).format  # type: ignore[arg-type]
    return store, fmt, field.shape, kind, lo, hi


def compiled_writer(table: StepTable, sampler: Any = None
                    ) -> tuple[Callable[..., bool], Callable[..., bool],
                               Callable[..., bool]] | None:
    """The compiled ``(add, extend, add_lanes)`` of a numpy or memmap table, or None.

    ``add`` and ``extend`` take ``(obs, action, reward, next_obs, terminated, truncated,
    extras)`` and return True when they wrote the call (every lane at once, lanes in
    step, values of exactly the stored format; see ``replaybank/_lane.c``), False when
    the Python paths must take it (nothing was written). ``add_lanes(lanes, obs, ...,
    extras)`` writes one step of the lanes ``lanes`` (distinct ints; None: every lane),
    in step or not: async vector envs (``env_ids``), and every add once lanes fell out
    of step. On memmap files the writes keep the crash-safe order of
    :meth:`StepTable.write_sync` (counts drop before rows are rewritten). None when the
    accelerator is not built or off, or the table has fields beyond the standard ones
    (the compiled writer never writes extras), a nested observation or another storage
    (torch).

    Args:
        table: The step table.
        sampler: Told about writes (``on_write(slots, None)``) when not None.

    Example:
        >>> import numpy as np
        >>> from replaybank.spec import Spec
        >>> spec = Spec.coerce({"obs": ((2,), "float32"), "action": ((), "int64"),
        ...     "reward": ((), "float32"), "terminated": ((), "bool"),
        ...     "truncated": ((), "bool")})
        >>> t = StepTable(spec, T=4, lanes=2, obs_fields=["obs"])
        >>> pair = compiled_writer(t)
        >>> if pair is not None:  # built: one step of both lanes in one call
        ...     z = np.zeros((2, 2), np.float32)
        ...     assert pair[0](z, np.array([0, 1]), np.zeros(2, np.float32), z + 1,
        ...                    np.zeros(2, bool), np.zeros(2, bool), {})
        ...     assert pair[2]([1], z[:1], np.array([0]), np.zeros(1, np.float32), z[:1],
        ...                    np.zeros(1, bool), np.zeros(1, bool), {})  # lane 1 alone
        ...     assert t.size == 3 and t.written.tolist() == [1, 2]
    """
    spec = table.spec
    std = ("obs", "action", "reward", "terminated", "truncated")
    if _ACCEL is None or type(table.backend) not in (NumpyBackend, MemmapBackend) \
            or table.obs_fields != ["obs"] or set(spec) != set(std) \
            or any(spec[k].shape != () for k in std[2:]) \
            or any(spec[k].dtype != np.bool_ for k in std[3:]):
        return None
    flat = table.flat
    try:
        fields = tuple(_c_field(flat(table.arrays[n]), _Field(spec[n].shape, spec[n].dtype))
                       for n in std)
        # files (memmap): counts drop before evicted rows are rewritten (crash safety,
        # as StepTable.write_sync orders it)
        app = _ACCEL.Appender(table, np.ndarray, np.bool_, fields, flat(table.link),
                              table.written, table.counts, table.episodes, table.lanes,
                              type(table.backend) is MemmapBackend)
    except (ValueError, TypeError):  # e.g. a dtype without a buffer format
        return None
    if sampler is None:
        return app.add, app.extend, app.add_lanes
    tell = write_teller(table, sampler)
    T, L, written = table.T, table.lanes, table.written  # noqa: N806
    every = np.arange(L, dtype=np.int64)

    def add(*args: Any) -> bool:
        if app.add(*args):
            tell(1)
            return True
        return False

    def extend(*args: Any) -> bool:
        if app.extend(*args):
            tell(len(args[0]))
            return True
        return False

    def add_lanes(lanes: Any, *args: Any) -> bool:
        if app.add_lanes(lanes, *args):  # the lanes were checked: distinct, in range
            ids = every if lanes is None else np.asarray(lanes, dtype=np.int64)
            sampler.on_write((written[ids] - 1) % T * L + ids, None)
            return True
        return False

    return add, extend, add_lanes


def write_teller(table: StepTable, sampler: Any) -> Callable[[int], None]:
    """``tell(n)``: tell ``sampler`` that the last ``n`` steps of every lane were just
    written without wrapping around the ring: slots ``[start * L, (start + n) * L)``,
    one contiguous range (``sampler.on_write_range`` when it has one, else
    ``on_write`` with the slots in row-major order)."""
    T, L, written = table.T, table.lanes, table.written  # noqa: N806
    by_range = getattr(sampler, "on_write_range", None)

    def tell(n: int) -> None:
        lo = (written.item(0) - n) % T * L
        if by_range is not None:
            by_range(lo, lo + n * L)
        else:
            sampler.on_write(np.arange(lo, lo + n * L, dtype=np.int64), None)

    return tell


class LaneWriter:
    """Appends steps to a one-lane in-memory table (see :func:`lean_table`).

    Args:
        table: The step table.
        sampler: Told about writes when not None (``on_write(slots, None)``).
    """

    def __init__(self, table: StepTable, sampler: Any = None) -> None:
        if not lean_table(table):
            raise ValueError("LaneWriter needs a one-lane numpy table with obs, action and "
                             "scalar reward/terminated/truncated fields; use StepTable.write")
        self.table = table
        self.sampler = sampler
        self._tell = write_teller(table, sampler) if sampler is not None else None
        self.owner: Any = sampler  # what the writer was built for (see ReplayBuffer)
        self.view: Any = None
        spec = table.spec
        f = {n: _Field(s.shape, s.dtype) for n, s in spec.items()}
        self.f_obs, self.f_act, self.f_rew = f["obs"], f["action"], f["reward"]
        self.f_term, self.f_trunc = f["terminated"], f["truncated"]
        std = ("obs", "action", "reward", "terminated", "truncated")
        self.extras = {n: f[n] for n in spec if n not in std}
        self.T = table.T
        flat = table.flat
        self.data = tuple(flat(table.arrays[n]) for n in std)
        self.extra_data = {n: flat(table.arrays[n]) for n in self.extras}
        self.link: npt.NDArray[np.int32] = flat(table.link)
        self.written, self.counts, self.episodes = table.written, table.counts, table.episodes

    # ------------------------------------------------------------------ add
    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
            truncated: Any, extras: dict[str, Any]) -> bool:
        """Add one step; False (nothing written) when the call needs the general path.

        Args:
            obs, action, reward, next_obs, terminated, truncated: One step's values.
            extras: The other stored fields (exactly the table's extra fields).

        Returns:
            True when the step was written.
        """
        fo = self.f_obs
        if type(obs) is not _ND or obs.shape != fo.shape or (obs.dtype is not fo.dtype
                                                            and obs.dtype != fo.dtype):
            return False
        if type(next_obs) is not _ND or next_obs.shape != fo.shape or (
                next_obs.dtype is not fo.dtype and next_obs.dtype != fo.dtype):
            return False
        fa = self.f_act
        if type(action) is _ND:
            if action.shape != fa.shape or (action.dtype is not fa.dtype
                                            and action.dtype != fa.dtype):
                return False
        elif type(action) not in fa.scalars and not fa.one(action):
            return False
        if (type(reward) not in self.f_rew.scalars and not self.f_rew.one(reward)) \
                or (type(terminated) not in self.f_term.scalars
                    and not self.f_term.one(terminated)) \
                or (type(truncated) not in self.f_trunc.scalars
                    and not self.f_trunc.one(truncated)):
            return False
        if extras.keys() != self.extras.keys():
            return False
        if extras:
            for name, field in self.extras.items():
                if not field.one(extras[name]):
                    return False
        # decided: write (same order and side-slot use as StepTable.add_one)
        t = self.table
        link, T, free, side = self.link, self.T, t._free, t.side["obs"]  # noqa: N806
        w, c = self.written.item(0), self.counts.item(0)
        row = w % T
        if c == T:  # the oldest step leaves the ring: free its side slot
            old = link.item(row)
            if old:
                free.append(old - 1)
        relink = 0
        prow = row - 1 if row else T - 1
        if c and T > 1:  # does the previous newest step continue into this one?
            relink = link.item(prow)
            d = self.data
            if relink and (d[3].item(prow) or d[4].item(prow)
                           or side[relink - 1].tobytes() != obs.tobytes()):
                relink = 0
        if free:
            slot = free.pop()
        else:
            slot = int(t._alloc(1)[0])
            side = t.side["obs"]
        side[slot] = next_obs
        d_obs, d_act, d_rew, d_term, d_trunc = self.data
        d_obs[row] = obs
        d_act[row] = action
        d_rew[row] = reward
        d_term[row] = terminated
        d_trunc[row] = truncated
        if extras:
            for name, arr in self.extra_data.items():
                arr[row] = extras[name]
        link[row] = slot + 1
        if relink:
            link[prow] = 0
            free.append(relink - 1)
        self.written[0] = w + 1
        if c < T:
            self.counts[0] = c + 1
        if terminated or truncated:
            self.episodes[0] += 1
        if self._tell is not None:
            self._tell(1)
        return True

    # ------------------------------------------------------------------ extend
    def extend(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
               truncated: Any, extras: dict[str, Any]) -> bool:
        """Append ``n`` steps ``[n, *shape]``; False (nothing written): general path.

        Chunks that wrap around the ring, have fewer than 2 steps, more than
        :data:`MAX_ENDS` episode ends, or an out-of-order step are left to the general
        path (which finds exactly which next observations to keep aside).

        Args:
            obs, action, reward, next_obs, terminated, truncated: ``[n, *shape]`` arrays.
            extras: The other stored fields (exactly the table's extra fields).

        Returns:
            True when the chunk was written.
        """
        if type(obs) is not _ND or not obs.ndim:
            return False
        n = obs.shape[0]
        start = self.written.item(0) % self.T
        end = start + n
        if n < 2 or end > self.T:
            return False
        fo = self.f_obs
        dt = fo.dtype
        if obs.shape[1:] != fo.shape or (obs.dtype is not dt and obs.dtype != dt) \
                or type(next_obs) is not _ND or next_obs.shape != obs.shape \
                or (next_obs.dtype is not dt and next_obs.dtype != dt):
            return False
        if not (self.f_act.many(action, n) and self.f_rew.many(reward, n)
                and self.f_term.many(terminated, n) and self.f_trunc.many(truncated, n)):
            return False
        if extras.keys() != self.extras.keys():
            return False
        if extras:
            for name, field in self.extras.items():
                if not field.many(extras[name], n):
                    return False
        ends = count_nonzero(terminated) + count_nonzero(truncated)
        if ends > MAX_ENDS:
            return False
        return self._append(obs, action, reward, next_obs, terminated, truncated, extras,
                            n, start, ends)

    def _append(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
                truncated: Any, extras: dict[str, Any], n: int, start: int, ends: int) -> bool:
        """Write a validated chunk (same order and side-slot use as StepTable.write_sync)."""
        t = self.table
        T, link, free = self.T, self.link, t._free  # noqa: N806
        c = self.counts.item(0)
        end = start + n
        # 1. evicted steps (rows overwritten) will free their side slots
        evicted: list[int] = []
        if c + n > T:
            old = link[start:end][T - c:]  # rows before T - c held no live step
            if count_nonzero(old):
                evicted = (old[old > 0] - 1).tolist()
        # 2. continuity, whether the previous newest step continues, then the data
        term, trunc = terminated, truncated
        stops: list[int] = []
        if ends:
            done = term | trunc
            stops = np.flatnonzero(done[:-1]).tolist()
        lo = 0
        for hi in (*stops, n - 1):  # runs between episode ends continue step to step
            if hi > lo and next_obs[lo:hi].tobytes() != obs[lo + 1:hi + 1].tobytes():
                return False
            lo = hi + 1
        side = t.side["obs"]
        prow = (start - 1 if start else T - 1) if c and n < T else -1
        relink = link.item(prow) if prow >= 0 else 0
        d = self.data
        if relink and (d[3].item(prow) or d[4].item(prow)
                       or side[relink - 1].tobytes() != obs[0].tobytes()):
            relink = 0
        for arr, v in zip(d, (obs, action, reward, term, trunc), strict=True):
            arr[start:end] = v
        link[start:end] = 0
        for name, arr in self.extra_data.items():
            arr[start:end] = extras[name]
        # 3. side slots and links of the chunk: only episode ends and the newest step
        free.extend(evicted)
        if not ends:
            if free:
                slot = free.pop()
            else:
                slot = int(t._alloc(1)[0])
                side = t.side["obs"]
            side[slot] = next_obs[-1]
            link[end - 1] = slot + 1
        else:
            k = len(stops) + 1
            if len(free) >= k:  # same slots, same order as t._alloc(k)
                for row in (*stops, n - 1):
                    slot = free.pop()
                    side[slot] = next_obs[row]
                    link[start + row] = slot + 1
            else:
                slots = t._alloc(k)
                at = np.array([*stops, n - 1], dtype=np.int64)
                t.side["obs"][slots] = next_obs[at]
                link[start + at] = slots + 1
            ends = count_nonzero(term | trunc)
        # 4. release the previous newest step's slot, then the counters
        if relink:
            link[prow] = 0
            free.append(relink - 1)
        self.written[0] += n
        if c != T:
            self.counts[0] = c + n if c + n < T else T
        if ends:
            self.episodes[0] += ends
        if self._tell is not None:
            self._tell(n)
        return True
