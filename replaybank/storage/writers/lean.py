"""Lean writers of in-memory step tables: ``add`` and ``extend`` in few steps.

Most single-env training loops add steps whose values already are numpy arrays of the
stored dtype and shape (or Python scalars for scalar fields; a dict observation, e.g. a
goal-conditioned env's ``{"observation", "achieved_goal", "desired_goal"}``, as plain dicts
of such arrays with exactly the stored keys, see
:class:`~replaybank.storage.writers.formats.ObsLayout`). :class:`LaneWriter`
recognises such calls with a handful of type, shape and dtype comparisons (unrolled
for the standard fields: no per-call lists or dicts) and writes them straight into
flat ``[T, *shape]`` views of the table. Anything else returns ``False`` before a
single byte is written, and the caller takes the general, fully validating path.

``extend`` decides the continuity of a chunk (is ``next_obs[i]`` bitwise
``obs[i + 1]`` within each run between episode ends?) with one byte comparison per run
(and observation field): a step continues only when every observation field does, and its
side slot holds every observation field, as in the reference writer.

When the optional C accelerator ``replaybank._lane`` was built (``setup.py``; it needs
only a C compiler and the Python headers), the plainest calls of any in-memory table
(every lane at once, C-contiguous arrays of exactly the stored format, Python scalars for
the scalar fields of one lane; extra fields held to the same rule) are decided and
written in one C call,
:func:`~replaybank.storage.writers.compiled.compiled_writer`; :class:`LaneWriter` is its
pure-Python twin. Either way the table ends up exactly as
:func:`~replaybank.storage.writers.reference.write` leaves it: same data, links, side
slots, free-slot order and counters (``tests/test_fastpath.py`` checks the whole state
against the reference writer under every ``REPLAYBANK_WRITER``).

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

from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.storage.table import StepTable
from replaybank.storage.writers.formats import ND as _ND
from replaybank.storage.writers.formats import (
    FieldFormat,
    ObsLayout,
    canonical_bools,
    count_nonzero,
)
from replaybank.storage.writers.tell import WriteListener, announce_last_steps

__all__ = ["LaneWriter", "fits_lane_writer"]

MAX_ENDS = 16  # chunks with more episode ends than this take the general path


def fits_lane_writer(table: StepTable) -> bool:
    """Whether :class:`LaneWriter` can serve ``table``: one in-memory numpy lane whose
    observation is the plain field ``obs`` or a (nested) dict observation (fields
    ``obs/...``), with a plain ``action`` field and scalar ``reward``/``terminated``/
    ``truncated`` fields (a persistent backend orders its writes for crash safety: it keeps
    the general path)."""
    spec = table.spec
    return (table.lanes == 1 and table.plain_numpy
            and bool(table.obs_fields) and ObsLayout(table.obs_fields).valid
            and "action" in spec
            and all(k in spec and spec[k].shape == () for k in ("reward", "terminated",
                                                                 "truncated")))


class LaneWriter:
    """Appends steps to a one-lane in-memory table (see :func:`fits_lane_writer`).

    Args:
        table: The step table.
        sampler: Told about writes when not None (``on_write(slots, None)``).
    """

    def __init__(self, table: StepTable, sampler: WriteListener | None = None) -> None:
        if not fits_lane_writer(table):
            raise ValueError("LaneWriter needs a one-lane numpy table with obs, action and "
                             "scalar reward/terminated/truncated fields; use StepTable.write")
        self.table = table
        self.sampler = sampler
        self._tell = announce_last_steps(table, sampler) if sampler is not None else None
        spec = table.spec
        f = {n: FieldFormat(s.shape, s.dtype) for n, s in spec.items()}
        self.layout = ObsLayout(table.obs_fields)
        self.flat_obs = self.layout.flat
        self.obs_names = tuple(table.obs_fields)
        self.f_parts = tuple(f[n] for n in self.obs_names)  # the obs fields, table order
        self.f_obs = self.f_parts[0]
        self.f_act, self.f_rew = f["action"], f["reward"]
        self.f_term, self.f_trunc = f["terminated"], f["truncated"]
        # bool obs/action arrays are checked for canonical 0/1 bytes (decided once)
        self.bool_arrays = self.f_obs.bools or self.f_act.bools
        std = ("action", "reward", "terminated", "truncated")
        self.extras = {n: f[n] for n in spec if n not in std and n not in self.obs_names}
        self.T = table.T
        flat = table.flat
        self.obs_data = tuple(flat(table.arrays[n]) for n in self.obs_names)
        # obs (the first obs field), action, reward, terminated, truncated
        self.data = (self.obs_data[0], *(flat(table.arrays[n]) for n in std))
        self.extra_data = {n: flat(table.arrays[n]) for n in self.extras}
        self.link: npt.NDArray[np.int32] = flat(table.link)
        self.written, self.counts, self.episodes = table.written, table.counts, table.episodes

    def _parts(self, obs: Any) -> list[Any] | None:
        """One step's dict observation as its fields' arrays (table order), or None
        unless every one is an array of exactly the stored format."""
        parts = self.layout.parts(obs)
        if parts is None:
            return None
        for v, fo in zip(parts, self.f_parts, strict=True):
            if type(v) is not _ND or v.shape != fo.shape or v.dtype != fo.dtype \
                    or (fo.bools and not canonical_bools(v)):
                return None
        return parts

    def _parts_many(self, obs: Any, n: int) -> list[Any] | None:
        """``n`` steps of a dict observation as its fields' ``[n, *shape]`` arrays."""
        parts = self.layout.parts(obs)
        if parts is None:
            return None
        for v, fo in zip(parts, self.f_parts, strict=True):
            if not fo.many(v, n):
                return None
        return parts

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
        parts: list[Any] | None = None
        nparts: list[Any] | None = None
        if self.flat_obs:
            fo = self.f_obs
            if type(obs) is not _ND or obs.shape != fo.shape or (obs.dtype is not fo.dtype
                                                                and obs.dtype != fo.dtype):
                return False
            if type(next_obs) is not _ND or next_obs.shape != fo.shape or (
                    next_obs.dtype is not fo.dtype and next_obs.dtype != fo.dtype):
                return False
        else:
            parts = self._parts(obs)
            if parts is None:
                return False
            nparts = self._parts(next_obs)
            if nparts is None:
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
        if self.bool_arrays and not self._canonical(obs, next_obs, action):
            return False
        # decided: write (the write plan's order and side-slot use)
        t = self.table
        link, T, free = self.link, self.T, t.side.free  # noqa: N806
        w, c = self.written.item(0), self.counts.item(0)
        row = w % T
        if c == T:  # the oldest step leaves the ring: free its side slot
            old = link.item(row)
            if old:
                free.append(old - 1)
        relink = 0
        prow = row - 1 if row else T - 1
        d_obs, d_act, d_rew, d_term, d_trunc = self.data
        if c and T > 1:  # does the previous newest step continue into this one?
            relink = link.item(prow)
            if relink and (d_term.item(prow) or d_trunc.item(prow)
                           or not self._kept_is(relink - 1, obs, parts)):
                relink = 0
        slot = free.pop() if free else int(t.side.alloc(1)[0])
        if parts is None:
            t.side.arrays["obs"][slot] = next_obs
            d_obs[row] = obs
        else:
            side = t.side.arrays
            for name, arr, v, nv in zip(self.obs_names, self.obs_data, parts, nparts or (),
                                        strict=True):
                side[name][slot] = nv
                arr[row] = v
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

    def _kept_is(self, slot: int, obs: Any, parts: list[Any] | None) -> bool:
        """Whether side slot ``slot`` holds exactly (bitwise) the observation ``obs`` (a
        flat one) or ``parts`` (every field of a dict observation)."""
        side = self.table.side.arrays
        if parts is None:
            return bool(side["obs"][slot].tobytes() == obs.tobytes())
        return all(side[name][slot].tobytes() == v.tobytes()
                   for name, v in zip(self.obs_names, parts, strict=True))

    def _canonical(self, obs: Any, next_obs: Any, action: Any) -> bool:
        """Bool observations and actions hold only 0/1 bytes (else: the general path; the
        fields of a dict observation were checked with their format)."""
        if self.flat_obs and self.f_obs.bools \
                and not (canonical_bools(obs) and canonical_bools(next_obs)):
            return False
        return not (self.f_act.bools and type(action) is _ND and not canonical_bools(action))

    # ------------------------------------------------------------------ extend
    def extend(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
               truncated: Any, extras: dict[str, Any]) -> bool:
        """Append ``n`` steps ``[n, *shape]``; False (nothing written): general path.

        Chunks that wrap around the ring, have fewer than 2 steps, more than
        :data:`MAX_ENDS` episode ends, or an out-of-order step are left to the general
        path (which finds exactly which next observations to keep aside).

        Args:
            obs, action, reward, next_obs, terminated, truncated: ``[n, *shape]`` arrays
                (a dict observation: dicts of them).
            extras: The other stored fields (exactly the table's extra fields).

        Returns:
            True when the chunk was written.
        """
        if self.flat_obs:
            if type(obs) is not _ND or not obs.ndim:
                return False
            n = obs.shape[0]
            parts, nparts = [obs], [next_obs]
        else:
            first = self.layout.parts(obs)
            if first is None or type(first[0]) is not _ND or not first[0].ndim:
                return False
            n = first[0].shape[0]
        start = self.written.item(0) % self.T
        end = start + n
        if n < 2 or end > self.T:
            return False
        if self.flat_obs:
            fo = self.f_obs
            dt = fo.dtype
            if obs.shape[1:] != fo.shape or (obs.dtype is not dt and obs.dtype != dt) \
                    or type(next_obs) is not _ND or next_obs.shape != obs.shape \
                    or (next_obs.dtype is not dt and next_obs.dtype != dt):
                return False
        else:
            got = self._parts_many(obs, n)
            ngot = self._parts_many(next_obs, n)
            if got is None or ngot is None:
                return False
            parts, nparts = got, ngot
        if not (self.f_act.many(action, n) and self.f_rew.many(reward, n)
                and self.f_term.many(terminated, n) and self.f_trunc.many(truncated, n)):
            return False
        if extras.keys() != self.extras.keys():
            return False
        if extras:
            for name, field in self.extras.items():
                if not field.many(extras[name], n):
                    return False
        if self.flat_obs and self.f_obs.bools \
                and not (canonical_bools(obs) and canonical_bools(next_obs)):
            return False
        ends = count_nonzero(terminated) + count_nonzero(truncated)
        if ends > MAX_ENDS:
            return False
        return self._append(parts, action, reward, nparts, terminated, truncated, extras,
                            n, start, ends)

    def _append(self, parts: list[Any], action: Any, reward: Any, nparts: list[Any],
                terminated: Any, truncated: Any, extras: dict[str, Any], n: int, start: int,
                ends: int) -> bool:
        """Write a validated chunk (the write plan's order and side-slot use); ``parts``
        and ``nparts``: the ``[n, *shape]`` obs and next obs of every obs field."""
        t = self.table
        T, link, free = self.T, self.link, t.side.free  # noqa: N806
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
            if hi > lo:
                for o, no in zip(parts, nparts, strict=True):
                    if no[lo:hi].tobytes() != o[lo + 1:hi + 1].tobytes():
                        return False
            lo = hi + 1
        prow = (start - 1 if start else T - 1) if c and n < T else -1
        relink = link.item(prow) if prow >= 0 else 0
        d = self.data
        if relink and (d[3].item(prow) or d[4].item(prow)
                       or not self._kept_is(relink - 1, parts[0][0],
                                            None if self.flat_obs else [o[0] for o in parts])):
            relink = 0
        for arr, v in zip(self.obs_data, parts, strict=True):
            arr[start:end] = v
        for arr, v in zip(d[1:], (action, reward, term, trunc), strict=True):
            arr[start:end] = v
        link[start:end] = 0
        for name, arr in self.extra_data.items():
            arr[start:end] = extras[name]
        # 3. side slots and links of the chunk: only episode ends and the newest step
        free.extend(evicted)
        names = self.obs_names
        if not ends:
            slot = free.pop() if free else int(t.side.alloc(1)[0])
            side = t.side.arrays
            for name, no in zip(names, nparts, strict=True):
                side[name][slot] = no[-1]
            link[end - 1] = slot + 1
        else:
            k = len(stops) + 1
            if len(free) >= k:  # same slots, same order as t.side.alloc(k)
                side = t.side.arrays
                for row in (*stops, n - 1):
                    slot = free.pop()
                    for name, no in zip(names, nparts, strict=True):
                        side[name][slot] = no[row]
                    link[start + row] = slot + 1
            else:
                slots = t.side.alloc(k)
                at = np.array([*stops, n - 1], dtype=np.int64)
                side = t.side.arrays
                for name, no in zip(names, nparts, strict=True):
                    side[name][slots] = no[at]
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
