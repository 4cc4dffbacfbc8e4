"""Fast paths for the common ``add`` / ``extend`` calls of :class:`ReplayBuffer`.

Once a buffer's storage exists, most calls pass exactly the fields it stores, as numpy
arrays of the stored dtype and shape (or Python scalars for scalar fields). A
:class:`FastPlan` recognises such calls with a few type and shape comparisons and
writes them without the general validation machinery. Anything else (a missing or
extra field, another dtype, a list, a torch tensor, nested observations, ``env_ids``,
priorities) returns ``None``/``False`` here and takes the general path, which validates
every value before anything is written. The fast path never writes partially: it
decides first, then writes.

Leaner writers still, which :class:`ReplayBuffer` calls with the standard fields as
arguments: the compiled ``plan.c_add`` / ``plan.c_extend`` / ``plan.c_add_lanes`` (one
step of any lanes, in step or not: ``env_ids``) of in-memory tables
(:func:`~replaybank.storage.lane_writer.compiled_writer`, when the optional C
accelerator was built) and, for one in-memory lane, the pure-Python
:class:`~replaybank.storage.lane_writer.LaneWriter` (``plan.lane``).

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
    >>> chunk = dict(obs=np.array([[1, 1, 1], [2, 2, 2]], np.float32),
    ...              next_obs=np.array([[2, 2, 2], [3, 3, 3]], np.float32),
    ...              action=np.zeros((2, 2), np.float32), reward=np.ones(2, np.float32),
    ...              terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))
    >>> plan.write(chunk, (2,), (2, 1)), len(buf)
    (True, 4)
    >>> plan.write({**chunk, "reward": chunk["reward"].astype(np.float64)}, (2,), (2, 1))
    False
    >>> plan.lane is not None  # one in-memory lane: the lean writer serves add/extend
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybank.storage.lane_writer import (
    LaneWriter,
    compiled_writer,
    lean_table,
    not_handled,
    scalar_types,
)
from replaybank.storage.table import StepTable

__all__ = ["FastPlan"]


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
        self.singles = [(n, f.dtype, f.shape, scalar_types(f.dtype) if f.shape == () else ())
                        for n, f in spec.items()]
        self.obs = (spec["obs"].dtype, spec["obs"].shape)
        self.keys = frozenset([*spec, "next_obs"])
        self.all_lanes = np.arange(table.lanes, dtype=np.int64)
        # what the plan was built for (the buffer rebuilds it when these change)
        self.owner: Any = sampler
        self.view: Any = None
        self._expected: dict[tuple[Any, Any], list[tuple[str, Any, Any, Any]]] = {}
        # one in-memory lane with the standard fields: the lean writer
        self.lane = LaneWriter(table, sampler) if lean_table(table) else None
        # the compiled writer of the plainest calls (any number of lanes), when built
        trio = compiled_writer(table, sampler)
        self.c_add, self.c_extend, self.c_add_lanes = trio if trio is not None \
            else (not_handled, not_handled, not_handled)
        # the same compiled writer without telling the sampler: writes with given
        # priorities, which the caller passes to the sampler itself
        self.quiet = trio if sampler is None else compiled_writer(table, None)

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
