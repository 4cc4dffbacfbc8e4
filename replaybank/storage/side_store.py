"""The side store: next observations kept aside, in slots handed out from a free list.

A step's next observation is usually the next step's observation in the same lane and is
not stored twice. Where it is not (an episode ended, the data jumped, or the step is its
lane's newest), the step table keeps it here: one slot per kept observation, for every
observation field, and ``link[row, lane] = slot + 1`` points at it.

The store grows on demand (doubling, capped at ``max_slots``, one slot per step). Slots
are taken from the end of :attr:`SideStore.free` and freed slots are appended to it, so
the slot order is deterministic: the Python writers and the compiled writer
(``replaybank/_lane.c``, which reads :attr:`arrays` and :attr:`free` and calls
:meth:`alloc`) produce the same slots for the same writes.

Example:
    >>> import numpy as np
    >>> from replaybank.spec import Spec
    >>> from replaybank.storage.backends.numpy import NumpyBackend
    >>> spec = Spec.coerce({"obs": ((2,), "float32")})
    >>> side = SideStore(spec, ["obs"], NumpyBackend(), slots=2, max_slots=8)
    >>> side.alloc(3).tolist(), side.capacity, side.in_use()
    ([0, 1, 2], 5, 3)
    >>> side.release(np.array([0, 2, 3]))  # links: 0 is "no slot", k is slot k - 1
    >>> side.free
    [4, 3, 1, 2]
    >>> side.take(), side.free
    (2, [4, 3, 1])
    >>> side.take_many(2), side.free  # alloc as Python ints
    ([1, 3], [4])
    >>> side.release([4, 0, 2])  # a list of links too
    >>> side.free
    [4, 3, 1]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.spec import Spec
from replaybank.storage.backends.base import ArrayBackend

__all__ = ["SideStore"]

IntArray = npt.NDArray[np.int64]

#: Called before each side array of durable storage grows: the crash tests' kill-point
#: hook, which :mod:`replaybank.storage.writers.killpoint` sets while it is armed (the
#: writers sit above this module and hand it down); None otherwise.
GROW_POINT: list[Callable[[], None] | None] = [None]


class SideStore:
    """Slots of kept-aside next observations, one array ``[slots, *shape]`` per obs field.

    Args:
        spec: The stored fields (the observation fields' shapes and dtypes are used).
        obs_fields: Names of the observation fields.
        backend: Where the arrays live (``side/<name>`` arrays).
        slots: Slots allocated at first.
        max_slots: The most slots the store grows to.

    Attributes:
        arrays: ``{obs field: [capacity, *shape]}``; replaced (not resized in place) when
            the store grows, so readers look the array up again after a write.
        free: Free slots; :meth:`take` and :meth:`alloc` hand out from its end.
    """

    def __init__(self, spec: Spec, obs_fields: Sequence[str], backend: ArrayBackend,
                 slots: int, max_slots: int) -> None:
        self.backend = backend
        self.max_slots = int(max_slots)
        self.arrays: dict[str, Any] = {
            name: backend.allocate(f"side/{name}", (slots, *spec[name].shape), spec[name].dtype)
            for name in obs_fields
        }
        self._even()
        # (no observation field: a rows table sizes its side array from the free list)
        cap = self.capacity if self.arrays else int(slots)
        self.free: list[int] = list(range(cap - 1, -1, -1))

    # ------------------------------------------------------------------ sizes
    @property
    def capacity(self) -> int:
        """Allocated slots."""
        return int(next(iter(self.arrays.values())).shape[0]) if self.arrays else 0

    def in_use(self) -> int:
        """Slots holding a next observation."""
        return self.capacity - len(self.free)

    def remap(self) -> None:
        """Map every array again from the backend at its current size: a store reopened
        read-only beside the process that writes its files, which may have grown them
        since (a reopening backend's ``allocate`` maps the existing file, all of it)."""
        cap = self.capacity
        for name, arr in self.arrays.items():
            self.arrays[name] = self.backend.allocate(f"side/{name}", (cap, *arr.shape[1:]),
                                                      arr.dtype)
        self._even()

    def _even(self) -> None:
        """Give every array the length of the shortest one that holds bytes.

        Arrays reopened from files map each whole file, and a process killed while the
        store grew (:meth:`resize` grows the files one after another) leaves some files
        longer than others. The slots past the shortest never held an observation: the
        free list takes the new slots only after every array grew (:meth:`take_many`),
        so the store continues at the shortest length and grows the others again later.
        """
        rows = [int(a.shape[0]) for a in self.arrays.values() if a.dtype.itemsize
                and int(np.prod(a.shape[1:], dtype=np.int64)) > 0]
        if not rows or min(rows) == max(rows) == self.capacity:
            return
        n = min(rows)
        for name, arr in self.arrays.items():
            if arr.shape[0] > n:
                self.arrays[name] = arr[:n]
            elif arr.shape[0] < n:  # a field of zero bytes per row: nothing to keep
                self.arrays[name] = np.zeros((n, *arr.shape[1:]), dtype=arr.dtype)

    # ------------------------------------------------------------------ slots
    def resize(self, slots: int) -> None:
        """Grow (or shrink, when a smaller state is loaded) every array to ``slots``.

        Durable storage grows one file after another; a process killed in between
        leaves files of different lengths, which a reopened store evens out
        (:meth:`_even`)."""
        point = GROW_POINT[0] if self.backend.durable else None
        for name, arr in self.arrays.items():
            if point is not None:
                point()
            self.arrays[name] = self.backend.resize(f"side/{name}", arr, slots)

    def alloc(self, k: int) -> IntArray:
        """Take ``k`` free slots (the store grows first when too few are free).

        Returns:
            The slots ``[k]``, in the order they were taken from the end of :attr:`free`.
        """
        return np.array(self.take_many(k), dtype=np.int64)

    def take_many(self, k: int) -> list[int]:
        """:meth:`alloc` as a list of Python ints."""
        free = self.free
        if k > len(free):
            cap = self.capacity
            new = min(self.max_slots, max(cap * 2, cap + k))
            self.resize(new)
            free[:0] = range(new - 1, cap - 1, -1)
        if k == 0:
            return []
        out = free[-k:][::-1]
        del free[-k:]
        return out

    def take(self) -> int:
        """Take one free slot (``alloc(1)`` as a Python int)."""
        return self.free.pop() if self.free else int(self.alloc(1)[0])

    def release(self, links: npt.NDArray[Any] | list[int]) -> None:
        """Free the slots that ``links`` (an array or a list) point at (``k > 0`` is slot
        ``k - 1``), in their order."""
        if type(links) is not list:
            lk = np.asarray(links).reshape(-1)
            if lk.size > 64:
                self.free.extend((lk[lk > 0] - 1).tolist())
                return
            links = lk.tolist()
        self.free.extend([k - 1 for k in links if k > 0])

    def reset(self) -> None:
        """Every slot free, in the order of a new store."""
        self.free = list(range(self.capacity - 1, -1, -1))

    def rebuild(self, used: npt.NDArray[np.bool_]) -> None:
        """Free list of every slot not marked in ``used`` ``[capacity]`` (after a load)."""
        self.free = [int(i) for i in np.flatnonzero(~used)[::-1]]
