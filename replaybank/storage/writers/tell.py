"""Telling a sampler which slots a write filled.

Example:
    >>> import numpy as np
    >>> from replaybank.spec import Spec
    >>> from replaybank.storage.table import StepTable
    >>> spec = Spec.coerce({"obs": ((), "float32"), "terminated": ((), "bool"),
    ...                     "truncated": ((), "bool")})
    >>> t = StepTable(spec, T=4, lanes=2, obs_fields=["obs"])
    >>> class Log:
    ...     def on_write(self, slots, priorities=None):
    ...         print(slots.tolist())
    >>> t.written[:] = 3  # three steps of both lanes were just written
    >>> announce_last_steps(t, Log())(2)
    [2, 3, 4, 5]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from replaybank.storage.table import StepTable

__all__ = ["RangeListener", "WriteListener", "announce_last_steps"]


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


def announce_last_steps(table: StepTable, sampler: WriteListener) -> Callable[[int], None]:
    """``tell(n)``: tell ``sampler`` that the last ``n`` steps of every lane were just
    written without wrapping around the ring: slots ``[start * L, (start + n) * L)``,
    one contiguous range (``on_write_range`` of a :class:`RangeListener`, else
    ``on_write`` with the slots in row-major order)."""
    T, L, written = table.T, table.lanes, table.written  # noqa: N806
    by_range = sampler.on_write_range if isinstance(sampler, RangeListener) else None

    def tell(n: int) -> None:
        lo = (written.item(0) - n) % T * L
        if by_range is not None:
            by_range(lo, lo + n * L)
        else:
            sampler.on_write(np.arange(lo, lo + n * L, dtype=np.int64), None)

    return tell
