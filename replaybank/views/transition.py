"""What an item key becomes: the one-step transition view.

The transition view returns every stored field of the step plus ``next_obs`` (exactly
what the caller passed, from the next step's observation or the kept final observation).

Example:
    >>> TransitionView().config()
    {'type': 'transition'}
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.storage.table import StepTable
from replaybank.views.base import IntArray, StatelessView

__all__ = ["TransitionView"]


class TransitionView(StatelessView):
    """One-step transitions: stored fields plus exact ``next_obs``."""

    every_step = True

    def gather(self, table: StepTable, keys: IntArray,
               rng: np.random.Generator | None = None) -> dict[str, Any]:
        return table.gather_transitions(keys)

    def gather_live(self, table: StepTable, keys: IntArray,
                    rng: np.random.Generator | None = None) -> dict[str, Any]:
        return table.gather_transitions(keys, live=True)

    def valid(self, table: StepTable, keys: IntArray) -> npt.NDArray[np.bool_] | None:
        return None

    def config(self) -> dict[str, Any]:
        return {"type": "transition"}
