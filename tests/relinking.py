"""A shared table's writer relinking steps, as a thread: for the tests of the gathers that
read a side row's link again after copying it (``take_steps``, the sequence gathers).

Other test files import it: ``from tests.relinking import relink_forever``.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np


def relink_forever(src: Any, side: Any, link: Any, stop: Any) -> None:
    """A writer's relinks, as fast as Python goes: step ``r``'s link goes to 0 (its next
    observation is the next row), its freed slot is reused at once (overwritten), and
    the step is linked again to a free slot holding its next observation. Freed slots
    queue up behind every other free one, so a slot is handed out again only after tens
    of thousands of relinks: a link does not come back to a value it held while one
    gather runs, and no slot is ever linked by two steps.

    Args:
        src: The flat observation rows ``[n, ...]`` of one lane (row ``r + 1`` is step
            ``r``'s next observation, ``r + 1`` taken mod ``n``).
        side: The side store ``[pool, ...]``: slots ``[0, n)`` in use, ``[n, pool)`` free.
        link: The links ``[n]`` (side slot + 1), written in place.
        stop: A ``threading.Event`` that ends the loop.
    """
    rng = np.random.default_rng(0)
    n, pool = len(link), side.shape[0]
    free = deque(range(n, pool))
    while not stop.is_set():
        r = int(rng.integers(n))
        k = int(link[r])
        link[r] = 0
        side[k - 1] = -1  # the slot reused by the writer's next step
        fresh = free.popleft()
        side[fresh] = src[(r + 1) % n]
        link[r] = fresh + 1
        free.append(k - 1)
