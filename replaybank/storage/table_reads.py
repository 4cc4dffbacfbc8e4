"""Reads of a step table: item keys to storage slots, fields and next observations.

Each function takes the :class:`~replaybank.storage.table.StepTable` first and is bound
as the table method of the same name, so a call through the table goes straight here
with no wrapper in between (these run on every sample).

Keys are ``seq * lanes + lane`` (see :mod:`replaybank.ops.ring`); storage slots are
``row * lanes + lane`` into flat ``[T * lanes, *shape]`` views of the fields, so a batch
read is one fancy index on axis 0. A step's next observation is the next slot of its
lane unless its link points into the side store (see :mod:`replaybank.storage.table`).

Example:
    >>> import numpy as np
    >>> from replaybank.storage.writers.reference import write
    >>> from replaybank.spec import Spec
    >>> from replaybank.storage.table import StepTable
    >>> t = StepTable(Spec.coerce({"obs": ((), "int64"), "terminated": ((), "bool"),
    ...                            "truncated": ((), "bool")}), T=4, lanes=1,
    ...               obs_fields=["obs"])
    >>> no, end = np.zeros((2, 1), bool), np.array([[True], [False]])
    >>> _ = write(t, np.array([0]), {"obs": np.array([[1], [5]]), "terminated": end,
    ...             "truncated": no}, {"obs": np.array([[2], [6]])})
    >>> keys = np.array([0, 1])
    >>> gather(t, "obs", keys).tolist(), gather_next(t, "obs", keys).tolist()
    ([1, 5], [2, 6])
    >>> is_boundary(t, keys).tolist()  # an episode end, then the newest step
    [True, True]
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from replaybank.ops import ring

if TYPE_CHECKING:
    from replaybank.storage.table import StepTable

__all__ = ["gather", "gather_next", "gather_transitions", "is_boundary", "next_index",
           "rows_lanes", "slots_of", "take", "take_fields", "take_next"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
# flat views: (name, field) pairs, link, and (name, field, field shifted by one row, key)
# for each obs field
ReadPlan = tuple[list[tuple[str, Any]], Any, list[tuple[str, Any, Any, str]]]
_INT64 = np.dtype(np.int64)


def rows_lanes(table: StepTable, keys: IntArray) -> tuple[IntArray, IntArray]:
    """Storage coordinates (row, lane) of item keys."""
    seq, lane = ring.key_to_seq(keys, table.lanes)
    return seq % table.T, lane


def gather(table: StepTable, name: str, keys: IntArray) -> Any:
    """Field ``name`` of the steps ``keys``: ``[B, *shape]``."""
    return table.backend.gather(table.arrays[name], table.rows_lanes(keys))


def gather_next(table: StepTable, name: str, keys: IntArray) -> Any:
    """Next observation (obs field ``name``) of the steps ``keys``: ``[B, *shape]``.

    Exactly the ``next_obs`` the caller passed for each step.
    """
    return table.take_next(name, *table.next_index(table.slots_of(keys)))


# flat-slot reads: one fancy index on axis 0 of a [T * lanes, *shape] view
def slots_of(table: StepTable, keys: IntArray) -> IntArray:
    """Storage slots (``row * lanes + lane``) of item keys, ``[B]``."""
    keys = np.asarray(keys, dtype=np.int64)
    L = table.lanes  # noqa: N806
    if L == 1:
        return keys % table.T
    return keys // L % table.T * L + keys % L


def take(table: StepTable, name: str, slots: IntArray) -> Any:
    """Field ``name`` at storage ``slots``: ``[B, *shape]``."""
    return table.backend.gather(table.flat(table.arrays[name]), slots)


def next_index(table: StepTable, slots: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """Where the next observations of ``slots`` live.

    Returns:
        ``(next_slots [B], pos [k], side_slots [k])``: the next step's slot for every
        item, and for the ``k`` items whose next observation is kept aside, their
        positions in the batch and their side slots.
    """
    nxt = (slots + table.lanes) % (table.T * table.lanes)
    lk = table.flat(table.link)[slots]
    pos = lk.nonzero()[0]
    return nxt, pos, lk[pos].astype(np.int64) - 1


def take_next(table: StepTable, name: str, nxt: IntArray, pos: IntArray,
              side: IntArray) -> Any:
    """Next observations from :meth:`next_index`'s result: ``[B, *shape]``."""
    be = table.backend
    out = be.gather(table.flat(table.arrays[name]), nxt)
    if len(pos):
        be.write(out, pos, be.gather(table.side.arrays[name], side))
    return out


def gather_transitions(table: StepTable, keys: IntArray, live: bool = False) -> dict[str, Any]:
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
        >>> from replaybank.storage.table import StepTable
        >>> t = StepTable(Spec.coerce({"obs": ((), "int64"), "terminated": ((), "bool"),
        ...                            "truncated": ((), "bool")}), T=2, lanes=1,
        ...               obs_fields=["obs"])
        >>> no = np.zeros((3, 1), bool)
        >>> from replaybank.storage.writers.reference import write
        >>> _ = write(t, np.array([0]), {"obs": np.array([[5], [6], [7]]),
        ...             "terminated": no, "truncated": no}, {"obs": np.array([[6], [7], [8]])})
        >>> out = t.gather_transitions(np.array([1, 2]))
        >>> out["obs"].tolist(), out["next_obs"].tolist()
        ([6, 7], [7, 8])
    """
    T = table.T  # noqa: N806
    if not table.plain_numpy:
        slots = table.slots_of(keys)  # [B]
        out: dict[str, Any] = {name: table.take(name, slots) for name in table.arrays}
        where = table.next_index(slots)
        for name in table.obs_fields:
            out["next_" + name] = table.take_next(name, *where)
        return out
    fresh = False
    if live and table.lanes == 1 and type(keys) is np.ndarray and keys.dtype is _INT64:
        # the live keys lie in [oldest, written) inside [base, base + 2T) with base the
        # multiple of T at or below oldest: keys - base are slots up to one wrap, which
        # take's mode="wrap" removes (cheaper than keys % T)
        written = table.written.item(0)
        oldest = written - table.counts.item(0)
        base = oldest - oldest % T
        slots = keys if base == 0 else keys - base
        fresh = written < T  # then every slot + 1 < T too
    else:
        slots = table.slots_of(keys)  # [B]
    fields, link, nexts = _read_plan(table)
    out = {name: arr.take(slots, axis=0, mode="wrap") for name, arr in fields}
    if not nexts:
        return out
    lk = link.take(slots, mode="wrap")
    pos = lk.nonzero()[0]
    side_slots = lk.take(pos) - 1 if len(pos) else None
    # the next step's slot is slots + lanes, wrapped by take itself; None: slots + 1 < T,
    # take from the obs fields shifted by one row
    nxt = None if fresh else slots + table.lanes
    for name, arr, shifted, key in nexts:
        o = shifted.take(slots, axis=0) if nxt is None else \
            arr.take(nxt, axis=0, mode="wrap")
        if side_slots is not None:
            o[pos] = table.side.arrays[name].take(side_slots, axis=0)
        out[key] = o
    return out


def take_fields(table: StepTable, slots: IntArray, obs: bool = True) -> dict[str, Any]:
    """Every stored field at storage ``slots`` (the obs fields only when ``obs``).

    Args:
        slots: Storage slots ``[B]`` (see :meth:`slots_of`).
        obs: Include the observation fields.

    Returns:
        ``{name: [B, *shape]}`` in spec order.

    Example:
        >>> import numpy as np
        >>> from replaybank.spec import Spec
        >>> from replaybank.storage.table import StepTable
        >>> t = StepTable(Spec.coerce({"obs": ((), "int64"), "reward": ((), "float32")}),
        ...               T=4, lanes=1, obs_fields=["obs"])
        >>> sorted(t.take_fields(np.array([0, 1]), obs=False))
        ['reward']
    """
    if not table.plain_numpy:
        return {name: table.take(name, slots) for name in table.arrays
                if obs or name not in table.obs_fields}
    fields = _read_plan(table)[0]
    if obs:
        return {name: arr.take(slots, axis=0) for name, arr in fields}
    skip = table.obs_fields
    return {name: arr.take(slots, axis=0) for name, arr in fields if name not in skip}


def _read_plan(table: StepTable) -> ReadPlan:
    """Flat views of the fields and of ``link`` for :meth:`gather_transitions` (each obs
    field also shifted by one row), rebuilt when an array is replaced."""
    plan = table._plan
    if plan is not None and plan[0][-1] is table.link \
            and len(plan[0]) == len(table.arrays) + 1 \
            and all(map(operator.is_, table.arrays.values(), plan[0])):
        cached: ReadPlan = plan[1]
        return cached
    flat = table.flat
    fields = [(name, flat(arr)) for name, arr in table.arrays.items()]
    nexts = [(name, flat(table.arrays[name]), flat(table.arrays[name])[1:], "next_" + name)
             for name in table.obs_fields]
    body = (fields, flat(table.link), nexts)
    table._plan = ((*table.arrays.values(), table.link), body)
    return body


def is_boundary(table: StepTable, keys: IntArray) -> BoolArray:
    """Whether the next observation of each step is kept aside (episode end,
    discontinuity, or newest step of its lane)."""
    rows, lanes = table.rows_lanes(keys)
    return np.asarray(table.link[rows, lanes] > 0)
