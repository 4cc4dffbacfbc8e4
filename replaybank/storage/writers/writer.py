"""The writer of one step table: which writer serves each ``add`` / ``extend``, chosen once.

A buffer builds one :class:`Writer` per (table, sampler, view) and hands it every call's
values (:class:`StepValues`). The writer decides with a few type and shape comparisons
whether the values already are exactly what the table stores (numpy arrays of the stored
dtype and shape, or Python scalars for scalar fields) and then writes them with the
fastest writer that applies:

* the compiled writer (``c_add`` / ``c_extend`` / ``c_add_lanes``, one step of any lanes,
  in step or not: ``env_ids``; extra fields included, up to 16 of them), when the optional
  C accelerator was built (:func:`~replaybank.storage.writers.compiled.compiled_writer`);
* for one in-memory lane, the pure-Python :class:`~replaybank.storage.writers.lean.LaneWriter`;
* else the reference writer (:func:`~replaybank.storage.writers.reference.write`) on
  zero-copy views of the arrays.

A dict observation (fields ``obs/...``) is taken as plain dicts of such arrays with
exactly the stored keys. A rows table (``ReplayBuffer(next_obs=False)``) is served by the
compiled writer alone (its fields as
:class:`~replaybank.storage.writers.formats.RowsLayout` finds them in the call), else by
the reference writer. Anything else (a missing or extra field or key, another dtype, a
list, a torch tensor, a dict subclass) returns False before a byte is written, and the
buffer takes its general path, which validates every value first. All writers leave the same table.
``REPLAYBANK_WRITER`` (:func:`writer_choice`) restricts the choice, for tests and for
comparing writers.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=10, seed=0)
    >>> kw = dict(obs=np.zeros(3, np.float32), action=np.zeros(2, np.float32), reward=1.0,
    ...           next_obs=np.ones(3, np.float32), terminated=False, truncated=False)
    >>> buf.add(**kw)  # first add: general path, allocates storage
    >>> w = Writer(buf.table, sampler=None)
    >>> w.add(**kw, extras={}, env_ids=None), len(buf)
    (True, 2)
    >>> w.add(**{**kw, "reward": [1.0]}, extras={}, env_ids=None)  # a list: general path
    False
    >>> chunk = dict(obs=np.array([[1, 1, 1], [2, 2, 2]], np.float32),
    ...              next_obs=np.array([[2, 2, 2], [3, 3, 3]], np.float32),
    ...              action=np.zeros((2, 2), np.float32), reward=np.ones(2, np.float32),
    ...              terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))
    >>> w.extend(**chunk, extras={}), len(buf)
    (True, 4)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from replaybank.errors import ConfigError, ReplayBankError
from replaybank.spec import collect_fields
from replaybank.storage.table import StepTable
from replaybank.storage.writers.compiled import accelerated, compiled_writer, not_handled
from replaybank.storage.writers.formats import ObsLayout, canonical_bools
from replaybank.storage.writers.lean import LaneWriter, fits_lane_writer
from replaybank.storage.writers.reference import write
from replaybank.storage.writers.tell import WriteListener

__all__ = ["WRITERS", "Writer", "StepValues", "writer_choice"]


class StepValues(NamedTuple):
    """The values of one ``add`` or ``extend`` call, as the user passed them (the order
    the lean and compiled writers take them in)."""

    obs: Any
    action: Any
    reward: Any
    next_obs: Any
    terminated: Any
    truncated: Any
    extras: dict[str, Any]

#: The values of ``REPLAYBANK_WRITER``.
WRITERS = ("auto", "compiled", "lean", "reference")


def writer_choice() -> str:
    """Which writers a new plan may use, from the environment (read at each plan build).

    ``REPLAYBANK_WRITER``: ``auto`` (default: the compiled writer where it applies and is
    built, else the lean Python writers, else the reference write), ``compiled`` (as
    auto, but an error when the accelerator is not built), ``lean`` (the Python writers
    only) or ``reference`` (every call takes the fully validating path and the reference
    write). ``REPLAYBANK_PURE_PYTHON=1`` (read at import) turns the accelerator off, as
    ``lean`` does. Every choice leaves the buffer in the same state.

    Raises:
        ConfigError: An unknown value, or ``compiled`` without the accelerator.

    Example:
        >>> writer_choice() in WRITERS
        True
    """
    choice = os.environ.get("REPLAYBANK_WRITER", "auto").strip().lower() or "auto"
    if choice not in WRITERS:
        raise ConfigError(f"REPLAYBANK_WRITER={choice!r}: unknown writer; choose one of "
                          f"{list(WRITERS)}")
    if choice == "compiled" and not accelerated():
        raise ConfigError("REPLAYBANK_WRITER='compiled': the C accelerator replaybank._lane is "
                          "not built (or REPLAYBANK_PURE_PYTHON=1 is set); reinstall with a C "
                          "compiler (pip install -e .) or choose 'lean'")
    return choice


def _exact(v: Any, dt: Any, full: tuple[int, ...]) -> bool:
    """``v`` is an array of exactly dtype ``dt`` and shape ``full`` (bools: 0/1 bytes)."""
    return type(v) is np.ndarray and v.shape == full and v.dtype == dt \
        and (dt.kind != "b" or canonical_bools(v))


class Writer:
    """The writers of one table and the checks that choose among them, built once.

    Args:
        table: The step table (host numpy arrays; the observation one field named ``obs``
            or the fields ``obs/...`` of a dict observation, see :class:`ObsLayout`).
        sampler: Told about writes when not None (``on_write(slots, None)``).
        compiled: Use the compiled writer where it applies (``REPLAYBANK_WRITER``).
        guard: The owning buffer's call guard, checked by the compiled writer itself
            (:mod:`replaybank.buffers.guard`); None: no check.

    Attributes:
        owner: What the writer was built for (the buffer rebuilds it when that changes).
        lane: The lean one-lane writer, or None.
        compiled_untold: The compiled ``(add, extend, add_lanes)`` that does not tell the
            sampler (writes with initial priorities, which the caller passes on), or None.
        direct: ``c_add`` / ``c_extend`` are the compiled calls themselves (no sampler to
            tell, the guard checked in C): a buffer may call them before taking its guard.
    """

    def __init__(self, table: StepTable, sampler: WriteListener | None = None,
                 compiled: bool = True, guard: Any = None) -> None:
        self.table = table
        self.sampler = sampler
        spec = table.spec
        # the observation: the field obs, or the fields obs/... of a (nested) dict
        self.layout = ObsLayout(table.obs_fields)
        obs_names = set(table.obs_fields)
        self.fields = [(n, f.dtype, f.shape) for n, f in spec.items() if n not in obs_names]
        self.obs_fields = [(n, spec[n].dtype, spec[n].shape) for n in table.obs_fields]
        self.keys = frozenset([*(n for n, _, _ in self.fields), "obs", "next_obs"])
        self.all_lanes = np.arange(table.lanes, dtype=np.int64)
        # a rows table (next_obs=False): only the compiled writer serves it
        self.rows = not table.obs_fields
        self.owner: Any = sampler
        self._expected: dict[tuple[Any, Any], tuple[list[tuple[str, Any, Any, Any]],
                                                    list[tuple[str, Any, Any, Any]]]] = {}
        # one in-memory lane with the standard fields: the lean writer
        self.lane = LaneWriter(table, sampler) if fits_lane_writer(table) else None
        # the compiled writer of the plainest calls (any number of lanes), when built
        writers = compiled_writer(table, sampler, guard) if compiled else None
        self.direct = writers is not None and sampler is None and guard is not None
        self.c_add, self.c_extend, self.c_add_lanes = writers if writers is not None \
            else (not_handled, not_handled, not_handled)
        # the same compiled writer without telling the sampler: writes with given
        # priorities, which the caller passes to the sampler itself
        self.compiled_untold = writers if sampler is None or not compiled \
            else compiled_writer(table, None, guard)

    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
            truncated: Any, extras: dict[str, Any], env_ids: Any) -> bool:
        """Write one step of every lane (or of the lanes ``env_ids``) when a lean or the
        compiled writer can take it as it is; False (nothing written): the general path.

        The compiled writer first (lanes in step, or not), then, for one in-memory lane,
        the lean writer, else the Python writes of exactly-formatted arrays. The values
        are those of :class:`StepValues`, passed by name (no record on the hot path).
        """
        if env_ids is not None:  # async envs: some lanes
            return bool(self.c_add_lanes(env_ids, obs, action, reward, next_obs, terminated,
                                         truncated, extras))
        if self.c_add(obs, action, reward, next_obs, terminated, truncated, extras) \
                or self.c_add_lanes(None, obs, action, reward, next_obs, terminated,
                                    truncated, extras):
            return True  # the compiled writer took it (lanes in step, or not)
        if self.rows:
            return False
        lane = self.lane
        if lane is not None:  # one in-memory lane: the lean writer
            return lane.add(obs, action, reward, next_obs, terminated, truncated, extras)
        fields = collect_fields(obs, action, reward, next_obs, terminated, truncated, extras)
        m = self.table.lanes
        return self.write(fields, (m,) if m > 1 else (), (1, m))

    def extend(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
               truncated: Any, extras: dict[str, Any]) -> bool:
        """Write ``n`` steps of every lane (``obs`` ``[n, ...]`` or ``[n, lanes, ...]``) when
        a lean or the compiled writer can take them as they are; False: the general path.
        The values are those of :class:`StepValues`, passed by name."""
        if self.c_extend(obs, action, reward, next_obs, terminated, truncated, extras):
            return True  # the compiled writer took it
        if self.rows:
            return False
        lane = self.lane
        if lane is not None and lane.extend(obs, action, reward, next_obs, terminated,
                                            truncated, extras):
            return True
        n = self.steps(obs)  # obs, or a dict observation's first field: [n, ...]
        if n is not None:
            m = self.table.lanes
            fields = collect_fields(obs, action, reward, next_obs, terminated, truncated,
                                    extras)
            return self.write(fields, (n,) if m == 1 else (n, m), (n, m))
        return False

    def steps(self, obs: Any) -> int | None:
        """The leading dim of a chunk's ``obs`` (a dict observation: of its first field),
        or None when it is not an array with one."""
        first = self.layout.parts(obs)
        o0 = first[0] if first else None
        return o0.shape[0] if type(o0) is np.ndarray and o0.ndim >= 1 else None

    def arrays(self, fields: dict[str, Any], lead: tuple[int, ...],
               out: tuple[int, int]) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """Zero-copy ``[n, m, *shape]`` views when every value already matches, else None.

        Args:
            fields: The user's keyword fields.
            lead: Leading dims every value must have (``(n,)``, ``(m,)``, ``(n, m)``).
            out: The ``(n_steps, n_lanes)`` leading dims to reshape to.
        """
        if fields.keys() != self.keys or not self.layout.valid:
            return None
        exp = self._expected.get((lead, out))
        if exp is None:
            exp = ([(n, dt, lead + shape, out + shape) for n, dt, shape in self.fields],
                   [(n, dt, lead + shape, out + shape) for n, dt, shape in self.obs_fields])
            if len(self._expected) > 16:
                self._expected.clear()
            self._expected[(lead, out)] = exp
        values: dict[str, Any] = {}
        nxt: dict[str, Any] = {}
        parts = self.layout.parts(fields["obs"])
        nparts = self.layout.parts(fields["next_obs"])
        if parts is None or nparts is None:
            return None
        for (name, dt, full, shaped), v, nv in zip(exp[1], parts, nparts, strict=True):
            if not (_exact(v, dt, full) and _exact(nv, dt, full)):
                return None
            values[name] = v.reshape(shaped)
            nxt[name] = nv.reshape(shaped)
        for name, dt, full, shaped in exp[0]:
            v = fields[name]
            if not _exact(v, dt, full):
                return None  # the general path (it stores bools as canonical 0/1)
            values[name] = v.reshape(shaped)
        return values, nxt

    def write(self, fields: dict[str, Any], lead: tuple[int, ...], out: tuple[int, int]) -> bool:
        """Write all lanes' ``[n, m]`` steps when the call qualifies; False otherwise."""
        ready = self.arrays(fields, lead, out)
        if ready is None:
            return False
        t, (values, nxt) = self.table, ready
        keys = write(t, self.all_lanes, values, nxt, want_keys=self.sampler is not None)
        if self.sampler is not None:
            self.sampler.on_write((keys.reshape(-1) // t.lanes % t.T) * t.lanes
                                  + keys.reshape(-1) % t.lanes, None)
        return True

    def write_prioritized(self, listener: WriteListener,
                          priorities: Callable[[tuple[int, int]], Any], env_ids: Any,
                          steps: int | None, step: StepValues) -> bool:
        """An ``add`` (``steps=None``) or ``extend`` of ``steps`` steps with initial
        priorities, in one compiled call; False when the general path must take it.

        The priorities are checked first (nothing is written when they are bad: the
        general path then raises), then ``compiled_untold`` (the compiled writer that does not tell
        the sampler) writes, then ``listener`` gets the written slots with the
        priorities, in the order the general path gives them (row-major ``[steps, lanes]``).

        Args:
            listener: The sampler that takes the initial priorities.
            priorities: The checked priorities of a write of ``(steps, lanes)`` steps
                (flat ``[steps * lanes]``); raises a ``ReplayBankError`` when they are bad.
            env_ids: The call's ``env_ids`` (adds only).
            steps: Steps of an ``extend`` (the leading dim of ``obs``), None for an ``add``.
            step: The call's values.
        """
        untold = self.compiled_untold
        if untold is None:
            return False
        t = self.table
        lanes = t.lanes
        if env_ids is None:
            ids = self.all_lanes
        elif steps is None and isinstance(env_ids, (list, tuple, np.ndarray)):
            ids = np.asarray(env_ids)
            if ids.ndim != 1 or ids.dtype.kind not in "iu":
                return False
            ids = ids.astype(np.int64)
        else:
            return False
        n = 1 if steps is None else steps
        try:
            prio = priorities((n, len(ids)))
        except ReplayBankError:
            return False  # the general path reports it (after checking the values first)
        add, extend, add_lanes = untold
        if steps is not None:
            if not extend(*step):
                return False
        elif env_ids is None:
            if not (add(*step) or add_lanes(None, *step)):
                return False
        elif not add_lanes(env_ids, *step):
            return False
        # the written steps' slots, [n, m] row-major as the general path tells them
        rows = (t.written[ids][None, :] - n + np.arange(n)[:, None]) % t.T
        listener.on_write((rows * lanes + ids[None, :]).reshape(-1), prio)
        return True
