"""The compiled planner (``plan_write`` in ``replaybank/_lane.c``) takes the decisions of
the Python planner (:func:`replaybank.storage.writers.plan.plan_write`), the one
contract of a write: the same rows, evictions, counters and continuing previous steps on
random lane states (in step or not, full, wrapping, empty), lane subsets in any order
(``env_ids``) and writes shorter than, as long as and longer than the ring."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybank.storage.writers.compiled import ACCEL
from replaybank.storage.writers.plan import WritePlan, plan_write

pytestmark = pytest.mark.skipif(ACCEL is None, reason="_lane not built")


@st.composite
def _states(draw: Any) -> tuple[int, int, list[int], list[int], list[int], int]:
    """``(T, lanes, lane_ids, written, counts, n)``: counters a table can hold (counts <=
    T and <= written), lanes often in step."""
    T = draw(st.integers(1, 12))  # noqa: N806
    lanes = draw(st.integers(1, 5))
    in_step = draw(st.booleans())
    w0 = draw(st.integers(0, 40))
    written = [w0 if in_step else draw(st.integers(0, 40)) for _ in range(lanes)]
    counts = [min(w, T) if draw(st.booleans()) else draw(st.integers(0, min(w, T)))
              for w in written]
    if in_step:
        counts = [counts[0]] * lanes
    ids = draw(st.permutations(range(lanes)))
    m = draw(st.integers(1, lanes))
    lane_ids = list(ids[:m]) if draw(st.booleans()) else list(range(lanes))
    n = draw(st.integers(0, 2 * T + 2))
    return T, lanes, lane_ids, written, counts, n


def _python(T: int, lanes: int, lane_ids: list[int], written: list[int],  # noqa: N803
            counts: list[int], n: int) -> dict[str, Any]:
    p: WritePlan = plan_write(T, lanes, np.array(lane_ids, np.int64),
                              np.array(written, np.int64), np.array(counts, np.int64), n)
    return {"skip": p.skip, "kept": p.kept, "in_step": p.in_step, "all_lanes": p.all_lanes,
            "kept_old": p.kept_old.tolist(), "new_counts": p.new_counts.tolist(),
            "new_written": p.new_written.tolist(), "rows": p.rows.tolist(),
            "evicted": None if p.evicted is None else p.evicted.tolist(),
            "prev_pos": p.prev_pos.tolist(), "prev_rows": p.prev_rows.tolist()}


@settings(max_examples=600, deadline=None)
@given(state=_states())
def test_compiled_planner_matches_the_python_planner(
        state: tuple[int, int, list[int], list[int], list[int], int]) -> None:
    assert ACCEL.plan_write(*state) == _python(*state)


@pytest.mark.parametrize("state", [
    (4, 2, [1], [0, 3], [0, 3], 2),          # the plan.py example: one lane evicts
    (4, 1, [0], [9], [4], 1),                # a full ring: the oldest step leaves
    (4, 1, [0], [9], [4], 4),                # as long as the ring: no previous step
    (4, 1, [0], [9], [4], 7),                # longer: the write skips its own first 3
    (5, 3, [2, 0], [7, 3, 5], [5, 3, 5], 3),  # lanes out of step, in any order
    (3, 2, [0, 1], [0, 0], [0, 0], 0),       # nothing to write
])
def test_compiled_planner_matches_on_named_cases(
        state: tuple[int, int, list[int], list[int], list[int], int]) -> None:
    assert ACCEL.plan_write(*state) == _python(*state)


def test_compiled_planner_refuses_bad_arguments() -> None:
    for bad in [(0, 1, [0], [0], [0], 1), (4, 1, [1], [0], [0], 1), (4, 2, [0], [0], [0], 1),
                (4, 1, [0], [0], [0], -1), (4, 1, ["a"], [0], [0], 1)]:
        with pytest.raises((ValueError, TypeError)):
            ACCEL.plan_write(*bad)
