"""What a sampler declares to hear about writes: which slots a write filled.

The buffer's writer (:class:`~replaybank.buffers.writer.Writer`) tells a listener once
per write, after the data is stored: ``on_write(slots, priorities)`` with the slots in
row-major ``[steps, lanes]`` order, or, for one lane's contiguous steps without initial
priorities, ``on_write_range(lo, hi)`` of a :class:`RangeListener` (no index array).

Example:
    >>> import numpy as np
    >>> class Log:
    ...     def on_write(self, slots, priorities=None):
    ...         print(slots.tolist())
    >>> isinstance(Log(), WriteListener), isinstance(Log(), RangeListener)
    (True, False)
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["RangeListener", "WriteListener"]


@runtime_checkable
class WriteListener(Protocol):
    """Hears which slots a write filled (a sampler with per-slot state)."""

    def on_write(self, slots: npt.NDArray[np.int64],
                 priorities: npt.NDArray[np.float64] | None = None) -> None:
        """``slots`` ``[k]`` were written (with initial ``priorities`` ``[k]``, or None)."""
        ...


@runtime_checkable
class RangeListener(WriteListener, Protocol):
    """A listener that also takes one contiguous range of slots (no index array)."""

    def on_write_range(self, lo: int, hi: int) -> None:
        """Slots ``lo .. hi - 1`` were written, without initial priorities."""
        ...
