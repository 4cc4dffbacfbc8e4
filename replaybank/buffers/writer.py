"""The writer of a buffer: every ``add`` and ``extend``, from the user's values to steps.

A buffer builds one :class:`Writer` per (table, sampler) and hands it each call's values
(:class:`StepValues`). A write goes through three stages, whichever language runs them:

1. **the boundary**: every value is brought once to its field's stored dtype and shape,
   under the spec's casting rules (:meth:`~replaybank.spec.FieldSpec.cast`). The compiled
   writer (:class:`~replaybank.storage.writers.compiled.CompiledWriter`) does this in C
   for what real loops pass (arrays of any numeric dtype, byte order and strides, numpy
   and Python scalars, lists, torch CPU tensors) and writes the call at once. A value it
   does not take (a broken rule, an unknown type) leaves it untouched and the Python
   boundary (:func:`~replaybank.buffers.checked_call.check_call`) checks and casts the call,
   raising the error that names a bad value;
2. **the plan**: :func:`~replaybank.storage.writers.plan.plan_write` (or its C twin)
   decides from the lane counters where the steps go;
3. **the applier**: the compiled applier, or where no compiler exists the Python applier
   (:func:`~replaybank.storage.writers.reference.apply`), carries the plan out. Both
   leave identical tables (``tests/test_fastpath.py``). Where no compiler exists, the
   common ``add`` (one step of every lane, lanes in step, a flat observation) takes the
   Python writer's one-step add instead
   (:class:`~replaybank.storage.writers.reference.StepWriter`: the boundary, plan and
   apply of that call with Python ints, declining everything else untouched, as the
   compiled writer does), which leaves the same tables as :func:`~replaybank.storage.
   writers.reference.write` (``tests/test_pure_python_writer.py``).

Then the sampler hears which slots were written, once, with the initial priorities if
any. Priorities are checked before anything is written. A buffer with
``autoreset_mode="next_step"`` drops each lane's NEXT_STEP reset step before it is
written, one per episode end (:class:`~replaybank.buffers.autoreset.ResetSteps`).

``REPLAYBANK_WRITER`` (:func:`writer_choice`) picks the writers, for tests and for
comparing them: ``reference`` sends every call through the Python boundary and applier.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=10, seed=0)
    >>> kw = dict(obs=np.zeros(3), action=[0.0, 1.0], reward=1, next_obs=np.ones(3),
    ...           terminated=0, truncated=False)
    >>> buf.add(**kw)  # the first add sets the spec (obs float64, action float32)
    >>> w = Writer(buf.table, traits=buf.sampler_traits)
    >>> w.write(StepValues(**kw, extras={}), False, None, None), len(buf)
    (None, 2)
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from replaybank.buffers.autoreset import ResetSteps
from replaybank.buffers.checked_call import CheckedCall, check_call
from replaybank.buffers.priorities import check_priority
from replaybank.errors import ConfigError, ReplayBankError
from replaybank.samplers.base import SamplerTraits
from replaybank.spec import collect_fields
from replaybank.storage.table import StepTable
from replaybank.storage.writers.compiled import (
    CompiledWriter,
    WriteCall,
    accelerated,
    not_handled,
)
from replaybank.storage.writers.layouts import ObsLayout, RowsLayout
from replaybank.storage.writers.reference import StepWriter
from replaybank.storage.writers.reference import write as write_reference
from replaybank.storage.writers.tell import RangeListener, WriteListener

__all__ = ["WRITERS", "StepValues", "Writer", "writer_choice"]

IntArray = npt.NDArray[np.int64]


class StepValues(NamedTuple):
    """The values of one ``add`` or ``extend`` call, as the user passed them (the order
    the compiled writer takes them in)."""

    obs: Any
    action: Any
    reward: Any
    next_obs: Any
    terminated: Any
    truncated: Any
    extras: dict[str, Any]


#: The values of ``REPLAYBANK_WRITER``.
WRITERS = ("auto", "compiled", "reference")


def writer_choice() -> str:
    """Which writers a new :class:`Writer` may use, from the environment (read at each
    build).

    ``REPLAYBANK_WRITER``: ``auto`` (default: the compiled writer where it is built and
    serves the table, else the Python one), ``compiled`` (as auto, but an error when the
    accelerator is not built) or ``reference`` (every call through the Python boundary
    and the Python applier: the oracle). ``REPLAYBANK_PURE_PYTHON=1`` (read at import)
    turns the accelerator off. Every choice leaves the buffer in the same state.

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
                          "compiler (pip install -e .) or choose 'auto'")
    return choice


_BAD = object()  # initial priorities the checks refuse: the Python boundary reports them


class Writer:
    """The writer of one step table: the boundary, the plan, the applier, the telling.

    Args:
        table: The step table.
        listener: Told about writes when not None (``on_write(slots, priorities)``).
        traits: The sampler's capabilities (initial priorities are checked against them).
        compiled: Use the fast writers: the compiled writer where it is built and serves
            the table, else the Python writer's one-step add
            (:class:`~replaybank.storage.writers.reference.StepWriter`); False: every call
            through the Python boundary and :func:`~replaybank.storage.writers.reference.
            write` (the oracle).
        guard: The owning buffer's call guard, checked by the fast writers themselves
            (:mod:`replaybank.buffers.guard`); None: no check.
        drop_resets: Drop each lane's NEXT_STEP reset step (``autoreset_mode=
            "next_step"``), remembering per lane that it did in this (the buffer's), or
            None.

    Attributes:
        fast: The fast write of a whole call (compiled, or the Python one-step add), or
            a stand-in that writes nothing (it returns the steps written, 0 when the call
            is not for it).
        direct: :attr:`fast` when nothing else must happen around it (no listener, no
            reset steps to drop), checking the guard itself: a buffer may call it before
            taking its guard.
    """

    def __init__(self, table: StepTable, listener: WriteListener | None = None, *,
                 traits: SamplerTraits, compiled: bool = True,
                 guard: Any = None, drop_resets: ResetSteps | None = None) -> None:
        self.table = table
        self.listener = listener
        self.traits = traits
        self.drop_resets = drop_resets
        self.rows = not table.obs_fields
        self.compiled = CompiledWriter.of(table, guard) if compiled else None
        self.fast: WriteCall = not_handled
        direct: WriteCall = not_handled
        if drop_resets is not None:
            pass
        elif self.compiled is not None:  # it checks the guard itself
            self.fast = direct = self.compiled.write
        elif compiled:  # no compiler: the Python writer's one-step add
            step = StepWriter(table)
            if step.serves:  # (direct: one that checks the guard, as the compiled writer)
                self.fast = step.write
                direct = step.write if guard is None else StepWriter(table, guard).write
        self.direct: WriteCall = direct if listener is None else not_handled
        self.by_range = listener.on_write_range if isinstance(listener, RangeListener) \
            else None
        self.all_lanes = np.arange(table.lanes, dtype=np.int64)
        # the field whose leading dim is an extend's number of steps (priorities need it)
        if self.rows:
            spec = table.spec
            self._rows = RowsLayout(list(spec), {n: len(f.shape) for n, f in spec.items()})
        else:
            self._obs = ObsLayout(table.obs_fields)

    def write(self, values: StepValues, steps: bool, env_ids: Any, priority: Any) -> None:
        """Write one ``add`` (``steps=False``: values ``[*shape]`` or ``[lanes, *shape]``)
        or ``extend`` (a leading step dim), to every lane or the lanes ``env_ids``, with
        initial ``priority`` (None: the sampler's default).

        Raises:
            SpecError, ShapeError, DtypeError: A bad value (nothing written).
            ConfigError, ShapeError, DtypeError: Bad priorities (nothing written).
        """
        prio: Any = None
        if priority is not None:
            out = self._out(values, steps, env_ids)
            try:
                prio = _BAD if out is None else check_priority(self.traits, priority, out)
            except ReplayBankError:
                prio = _BAD  # the Python boundary checks the values first, then reports it
        if prio is not _BAD:
            n = self.fast(env_ids, steps, *values)
            if n:
                self._tell(n, env_ids, prio)
                return
        call = check_call(self.table.spec, collect_fields(*values), steps, env_ids,
                          self.table.lanes, self.rows)
        self.write_checked(call, priority)

    def write_checked(self, call: CheckedCall, priority: Any) -> None:
        """Write a call whose values the Python boundary checked and cast
        (:func:`~replaybank.buffers.checked_call.check_call`); its priorities are checked first.

        Raises:
            ConfigError, ShapeError, DtypeError: Bad priorities (nothing written).
        """
        prio = None if priority is None else check_priority(self.traits, priority, call.out)
        if self.drop_resets is not None:
            self._write_dropping_resets(self.drop_resets, call, prio)
            return
        self._apply(call.lanes, call.values, call.next_obs)
        self._tell(call.out[0], call.lanes, prio)

    def _apply(self, lanes: IntArray, values: dict[str, Any],
               next_obs: dict[str, Any]) -> None:
        """The applier: checked ``[n, m, *shape]`` values to the lanes ``lanes``."""
        compiled = self.compiled
        if compiled is not None and compiled.write_arrays(lanes, values, next_obs):
            return
        write_reference(self.table, lanes, values, next_obs, want_keys=False)

    def _write_dropping_resets(self, resets: ResetSteps, call: CheckedCall,
                               prio: Any) -> None:
        """``autoreset_mode="next_step"``: write a checked call step by step, leaving out
        each lane's NEXT_STEP reset step (decided against what is stored and what
        ``resets`` remembers, so only one step per episode end is dropped)."""
        t = self.table
        n, m = call.out
        for i in range(n):  # [1, m] at a time: a step's check sees the step before it
            drop = resets.due(t, call.lanes,
                              {name: call.values[name][i] for name in t.obs_fields})
            keep = np.flatnonzero(~drop)
            if len(keep):
                self._apply(call.lanes[keep],
                            {k: v[i:i + 1, keep] for k, v in call.values.items()},
                            {k: v[i:i + 1, keep] for k, v in call.next_obs.items()})
                self._tell(1, call.lanes[keep], None if prio is None else prio[i * m + keep])
            resets.written(call.lanes, drop)

    def _out(self, values: StepValues, steps: bool, env_ids: Any) -> tuple[int, int] | None:
        """``(steps, lanes)`` of a call as its values show them (None: unclear, the
        Python boundary finds out)."""
        if env_ids is None:
            m = self.table.lanes
        elif isinstance(env_ids, (list, tuple, np.ndarray)):
            m = len(env_ids)
        else:
            return None
        if not steps:
            return (1, m)
        if self.rows:
            got = self._rows.values(tuple(values[:6]), values.extras)
            first = None if got is None else got[0]
        else:
            parts = self._obs.parts(values.obs)
            first = None if parts is None else parts[0]
        shape: tuple[int, ...] = np.shape(first) if first is not None else ()
        return (int(shape[0]), m) if shape else None

    def _tell(self, n: int, lanes: Any, prio: Any) -> None:
        """Tell the listener the slots of the ``n`` steps just written to ``lanes`` (None:
        every lane), row-major ``[n, m]``, with their initial priorities."""
        listener = self.listener
        if listener is None:
            return
        t = self.table
        T, L = t.T, t.lanes  # noqa: N806
        if lanes is None and L == 1:
            lo = (t.written.item(0) - n) % T
            if prio is None and self.by_range is not None and lo + n <= T:
                self.by_range(lo, lo + n)
                return
            slots = (lo + np.arange(n, dtype=np.int64)) % T
        else:
            ids = self.all_lanes if lanes is None else np.asarray(lanes, dtype=np.int64)
            rows = (t.written[ids][None, :] - n + np.arange(n)[:, None]) % T  # [n, m]
            slots = (rows * L + ids[None, :]).reshape(-1)
        listener.on_write(slots, prio)
