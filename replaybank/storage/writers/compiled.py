"""The compiled writer: ``replaybank._lane`` loaded once, and its writer of one table.

``replaybank/_lane.c`` is built at install time where a C compiler and the Python headers
exist (``setup.py``, ``optional=True``). Its ``Appender`` takes a call's values at the
boundary (bringing each to its field's stored dtype under the spec's casting rules:
arrays of any numeric dtype, byte order and strides, numpy and Python scalars, nested
lists, torch CPU tensors through :func:`tensor_to_host`), plans the write with the C twin
of :func:`~replaybank.storage.writers.plan.plan_write` and applies the plan in the order
of :func:`~replaybank.storage.writers.reference.apply`: both leave identical tables. A
value it does not take (a casting rule broken, an unknown type) makes the call return 0
before a byte is written; the caller's Python boundary then names the error, or casts
the value and hands the checked arrays back to :meth:`CompiledWriter.write_arrays`.

``REPLAYBANK_PURE_PYTHON=1`` (read at import) switches the module off; the Python writer
(:mod:`~replaybank.storage.writers.reference`) then gives the same results. The crash
tests load the kill-point build ``replaybank._lane_killpoints`` instead (same source,
compiled with ``REPLAYBANK_KILLPOINTS``: see :mod:`~replaybank.storage.writers.killpoint`)
when ``REPLAYBANK_KILLPOINTS=1`` or ``REPLAYBANK_KILL_AT`` is set at import.

Example:
    >>> import numpy as np
    >>> from replaybank.spec import Spec
    >>> from replaybank.storage.table import StepTable
    >>> spec = Spec.coerce({"obs": ((2,), "float32"), "action": ((), "int64"),
    ...     "reward": ((), "float32"), "terminated": ((), "bool"),
    ...     "truncated": ((), "bool")})
    >>> t = StepTable(spec, T=4, lanes=2, obs_fields=["obs"])
    >>> w = CompiledWriter.of(t)
    >>> if w is not None:  # built: float64 obs and int flags are cast at the boundary
    ...     z = np.zeros((2, 2))
    ...     assert w.write(None, False, z, [0, 1], [0.5, 1.0], z + 1, np.zeros(2, int),
    ...                    [False, True], {}) == 1
    ...     assert w.write([1], False, z[:1], [2], [0.0], z[:1] + 2, [0], [0], {}) == 1
    ...     assert t.size == 3 and t.written.tolist() == [1, 2]
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import SpecError
from replaybank.host import tensor_to_numpy
from replaybank.ops.jit import pick_kernel
from replaybank.spec import SEP, flatten
from replaybank.storage.table import StepTable
from replaybank.storage.writers.layouts import ObsLayout, RowsLayout

__all__ = ["ACCEL", "MAX_EXTRAS", "MAX_OBS", "CompiledWriter", "accelerated",
           "killpoints_wanted", "not_handled", "tensor_to_host"]

#: The most extra fields the compiled writer takes (``MAXEXTRA`` in ``_lane.c``); a table
#: with more takes the Python writer.
MAX_EXTRAS = 32
#: The most fields of a dict observation the compiled writer takes (``MAXOBS``).
MAX_OBS = 16
#: The standard fields after the observation, in the order the compiled writer takes them.
_STD = ("action", "reward", "terminated", "truncated")
#: ``write_fields`` modes: one step, a leading step dim, checked ``[n, m, ...]`` arrays.
ADD, EXTEND, ARRAYS = 0, 1, 2


def killpoints_wanted() -> bool:
    """Whether this process loads the kill-point build (the crash tests' switch:
    ``REPLAYBANK_KILLPOINTS=1`` or ``REPLAYBANK_KILL_AT`` set, read at import)."""
    return os.environ.get("REPLAYBANK_KILLPOINTS", "") not in ("", "0") \
        or os.environ.get("REPLAYBANK_KILL_AT", "") not in ("", "0")


def _load() -> Any:
    """The built C writer module (the kill-point build when wanted), or None where it is
    not built or ``REPLAYBANK_PURE_PYTHON`` is set (:func:`~replaybank.ops.jit.pick_kernel`
    decides, as for every compiled kernel)."""
    name = "replaybank._lane_killpoints" if killpoints_wanted() else "replaybank._lane"
    return pick_kernel("auto", None, None, None, "CompiledWriter", compiled=name)[0]


ACCEL: Any = _load()


def accelerated() -> bool:
    """Whether the compiled writer (``replaybank._lane``) is built and switched on."""
    return ACCEL is not None


def not_handled(*args: Any) -> int:
    """Stands in for a compiled write that is not available: nothing written (0)."""
    return 0


def tensor_to_host(value: Any) -> npt.NDArray[Any] | None:
    """A torch tensor as a numpy array for the compiled writer's boundary, else None.

    :func:`replaybank.host.tensor_to_numpy`, the conversion of every boundary: a plain
    CPU tensor is viewed without a copy (tried first: the fast path), others are
    detached and copied to the host. torch is never imported here: a value can only be
    a tensor when torch is already loaded. None (the Python boundary then takes the
    value and names any error) for everything else and for tensors numpy cannot hold
    even so (e.g. sparse tensors).

    Example:
        >>> import torch
        >>> tensor_to_host(torch.ones(2, requires_grad=True)).tolist(), tensor_to_host([1])
        ([1.0, 1.0], None)
    """
    try:  # one isinstance check (in tensor_to_numpy): a non-tensor raises TypeError
        return tensor_to_numpy(value)
    except (RuntimeError, TypeError):
        return None


#: ``write(lanes, steps, obs, action, reward, next_obs, terminated, truncated, extras)``.
WriteCall = Callable[..., int]


class CompiledWriter:
    """The compiled writer of one host table (numpy, memmap or shared-memory arrays).

    Build it with :meth:`of`. Every call returns the steps it wrote, or 0 when it wrote
    nothing because a value is not for it (the caller's Python boundary then checks and
    casts the call, and passes the checked arrays to :meth:`write_arrays`).

    Attributes:
        write: ``write(lanes, steps, obs, action, reward, next_obs, terminated,
            truncated, extras) -> int``: one call as the user made it (``lanes``: None or
            the ``env_ids``; ``steps``: an extend). For a flat or one-level dict
            observation the C method itself; for rows tables and deeper dict observations
            a Python function that finds the values first
            (:class:`~replaybank.storage.writers.layouts.RowsLayout`,
            :class:`~replaybank.storage.writers.layouts.ObsLayout`).
        order: The field names in the writer's order; ``obs_names`` those of the
            observation (their next observations, in that order).
    """

    def __init__(self, app: Any, order: tuple[str, ...], obs_names: tuple[str, ...],
                 write: WriteCall) -> None:
        self.app = app
        self.order = order
        self.obs_names = obs_names
        self.write = write

    @classmethod
    def of(cls, table: StepTable, guard: Any = None) -> CompiledWriter | None:
        """The compiled writer of ``table``, or None (not built, not host numpy storage,
        a zero-size field, more than :data:`MAX_EXTRAS` extras or :data:`MAX_OBS`
        observation fields, flags that are not bool scalars, a rows table with fewer than
        three fields besides its flags).

        Args:
            table: The step table.
            guard: The owning buffer's call guard (a ``GuardState``, see
                :mod:`replaybank.buffers.guard`), or None: the compiled calls then return
                0 for a thread the guard does not let through.
        """
        if ACCEL is None or not table.backend.host_numpy:
            return None
        if not table.obs_fields:
            return _rows(table, guard)
        spec = table.spec
        layout = ObsLayout(table.obs_fields)
        names = layout.names
        # a one-level dict action (action/<key> fields): its first field takes the C
        # writer's action slot, the others ride as extras (_dict_action)
        acts = tuple(n for n in spec if n.startswith("action" + SEP))
        slot = "action" if "action" in spec else acts[0] if acts and all(
            n.count(SEP) == 1 for n in acts) else ""
        std = (slot, *_STD[1:])
        if not layout.valid or len(names) > MAX_OBS or not slot or not set(std) <= set(spec):
            return None
        extras = tuple(n for n in spec if n not in std and n not in names)
        order = (names[0], *std, *extras, *names[1:])
        # a one-level dict observation: the C method finds obs/<key> in plain dicts; a
        # deeper one: Python finds the fields (the C method's keys are then never met)
        keys = None if layout.flat else layout.keys or names
        obs_keys = None if keys is None else tuple(zip(keys, names, strict=True))
        app = _appender(table, order, extras, guard, obs_keys, rows=False)
        if app is None:
            return None
        write = app.write if layout.flat or layout.keys is not None \
            else _nested_write(app, layout, extras)
        grouped = frozenset(n.split(SEP, 1)[0] for n in extras if SEP in n) - {"action"}
        if grouped:
            write = _flat_extras(write, grouped)
        if slot != "action":
            write = _dict_action(write, tuple(n.split(SEP, 1)[1] for n in acts))
        return cls(app, order, names, write)

    def write_arrays(self, lanes: Any, values: Mapping[str, Any],
                     next_obs: Mapping[str, Any]) -> int:
        """Write checked values ``[n, m, *shape]`` (every stored field, cast to the
        spec) with next observations ``[n, m, *shape]`` of every observation field, to
        the lanes ``lanes`` ``[m]`` (None: every lane). Returns n, or 0 (nothing written)
        when a value is not of the stored format."""
        return int(self.app.write_fields(
            lanes, ARRAYS, tuple(values[n] for n in self.order),
            tuple(next_obs[n] for n in self.obs_names)))


def _appender(table: StepTable, order: tuple[str, ...], extras: tuple[str, ...], guard: Any,
              obs_keys: Any, rows: bool) -> Any:
    """The C Appender of ``table`` with its fields in ``order``, or None."""
    spec = table.spec
    if len(extras) > MAX_EXTRAS or any(spec[n].shape != () or spec[n].dtype != np.bool_
                                       for n in ("terminated", "truncated")):
        return None
    flat = table.flat
    extra = set(extras)
    fields = tuple((flat(table.arrays[n]), spec[n].shape, *((n,) if n in extra else ()))
                   for n in order)
    try:  # files (memmap), shared memory: the crash-safe order of the step table
        return ACCEL.Appender(table.side, np.ndarray, np.generic, tensor_to_host, fields,
                              flat(table.link), table.written, table.counts, table.episodes,
                              table.lanes, table.durable, table.start, table.chunk, guard,
                              obs_keys, rows)
    except (ValueError, TypeError):  # a zero-size field, a format without a buffer form
        return None


def _nested_write(app: Any, layout: ObsLayout, extra_names: tuple[str, ...]) -> WriteCall:
    """``write`` of a table whose dict observation nests deeper than one level: the
    observation's fields are found in Python, the rest in C."""
    fields = app.write_fields
    wanted = frozenset(extra_names)

    def write(lanes: Any, steps: Any, obs: Any, action: Any, reward: Any, next_obs: Any,
              terminated: Any, truncated: Any, extras: dict[str, Any]) -> int:
        parts = layout.parts(obs)
        nparts = layout.parts(next_obs)
        if parts is None or nparts is None or extras.keys() != wanted:
            return 0
        return int(fields(lanes, EXTEND if steps else ADD,
                          (parts[0], action, reward, terminated, truncated,
                           *(extras[n] for n in extra_names), *parts[1:]), tuple(nparts)))

    return write


def _flat_extras(inner: WriteCall, grouped: frozenset[str]) -> WriteCall:
    """``inner`` for a table whose extras include dict fields (``rewards/<agent>``): a call
    that passes such an extra as a dict (``rewards={agent: ...}``) has its extras
    flattened to the stored names first, so that it takes the compiled path too."""

    def write(lanes: Any, steps: Any, obs: Any, action: Any, reward: Any, next_obs: Any,
              terminated: Any, truncated: Any, extras: dict[str, Any]) -> int:
        if not grouped.isdisjoint(extras):
            try:
                extras = flatten(extras)
            except SpecError:  # the Python boundary names the bad field
                return 0
        return inner(lanes, steps, obs, action, reward, next_obs, terminated, truncated,
                     extras)

    return write


def _dict_action(inner: WriteCall, keys: tuple[str, ...]) -> WriteCall:
    """``inner`` for a table whose action is a one-level dict (``action/<key>`` fields,
    ``keys`` in table order): the first key's value goes in the action slot, the others
    as the extras ``action/<key>``. An action that is not a plain dict of exactly those
    keys is not for the compiled writer."""
    first, rest = keys[0], tuple((k, "action" + SEP + k) for k in keys[1:])
    wanted = frozenset(keys)

    def write(lanes: Any, steps: Any, obs: Any, action: Any, reward: Any, next_obs: Any,
              terminated: Any, truncated: Any, extras: dict[str, Any]) -> int:
        if type(action) is not dict or action.keys() != wanted:
            return 0
        extras = dict(extras)
        for k, name in rest:
            extras[name] = action[k]
        return inner(lanes, steps, obs, action[first], reward, next_obs, terminated,
                     truncated, extras)

    return write


def _rows(table: StepTable, guard: Any) -> CompiledWriter | None:
    """The compiled writer of a rows table (``ReplayBuffer(next_obs=False)``), or None."""
    spec = table.spec
    layout = RowsLayout(list(spec), {n: len(f.shape) for n, f in spec.items()})
    order = layout.order
    if order is None or any(spec[k].shape != () or spec[k].dtype != np.bool_
                            for k in order[3:5]):
        return None
    app = _appender(table, order, order[5:], guard, None, rows=True)
    if app is None:
        return None
    values, fields = layout.values, app.write_fields

    def write(lanes: Any, steps: Any, obs: Any, action: Any, reward: Any, next_obs: Any,
              terminated: Any, truncated: Any, extras: dict[str, Any]) -> int:
        v = values((obs, action, reward, next_obs, terminated, truncated), extras)
        return 0 if v is None else int(fields(lanes, EXTEND if steps else ADD, v, ()))

    return CompiledWriter(app, order, (), write)
