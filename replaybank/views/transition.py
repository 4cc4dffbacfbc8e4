"""What an item key becomes: the one-step transition view.

A view turns sampled item keys into batch fields. The transition view returns every
stored field of the step plus ``next_obs`` (exactly what the caller passed, from the
next step's observation or the kept final observation).

Example:
    >>> TransitionView().config()
    {'type': 'transition'}
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from replaybank.storage.table import StepTable

__all__ = ["InputTransform", "TransitionView", "View", "input_transform", "next_name"]

IntArray = npt.NDArray[np.int64]


def next_name(obs_field: str) -> str:
    """``obs`` -> ``next_obs``; ``obs/goal`` -> ``next_obs/goal``."""
    return "next_" + obs_field


@runtime_checkable
class View(Protocol):
    """Turns item keys into batch fields."""

    def gather(self, table: StepTable, keys: IntArray) -> dict[str, Any]:
        """Fields of the items ``keys`` (flat names, ``[B, *shape]``)."""
        ...

    def valid(self, table: StepTable, keys: IntArray) -> npt.NDArray[np.bool_] | None:
        """Which keys this view can serve (None: all of them)."""
        ...

    def config(self) -> dict[str, Any]:
        """JSON-able constructor arguments with ``"type"``."""
        ...


@runtime_checkable
class InputTransform(Protocol):
    """A view that also reshapes what users add (e.g. keeps the newest frame of a stack)."""

    def prepare_inputs(self, fields: dict[str, Any], steps: bool, lanes: int) -> dict[str, Any]:
        """Return the fields to store for one ``add`` (``steps=False``) or ``extend``."""
        ...


def input_transform(view: Any) -> InputTransform | None:
    """``view`` when it is an :class:`InputTransform`, else None.

    The same test as ``isinstance(view, InputTransform)`` (a callable
    ``prepare_inputs``) without the runtime-protocol machinery, which costs about
    10 us per call on the write path.

    Example:
        >>> input_transform(TransitionView()) is None
        True
    """
    return view if callable(getattr(view, "prepare_inputs", None)) else None


class TransitionView:
    """One-step transitions: stored fields plus exact ``next_obs``."""

    def gather(self, table: StepTable, keys: IntArray) -> dict[str, Any]:
        return table.gather_transitions(keys)

    def valid(self, table: StepTable, keys: IntArray) -> npt.NDArray[np.bool_] | None:
        return None

    def config(self) -> dict[str, Any]:
        return {"type": "transition"}
