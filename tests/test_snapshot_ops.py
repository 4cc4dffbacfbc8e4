"""The shared-memory learner's window arithmetic (replaybank.shared.snapshot) against a plain
loop, and its numba twin against it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybank.shared import snapshot

numba_twin = pytest.importorskip("replaybank.shared.snapshot_numba")


def plain(written: list[int], start: list[int], link: np.ndarray, done: np.ndarray, T: int,  # noqa: N803
          guard: int, lo: list[int], hi: list[int]) -> tuple[list[int], list[int],
                                                             list[int], list[int]]:
    """One lane at a time, one step at a time, from the rule in the module docstring."""
    left, new, out_lo, out_hi = [], [], [], []
    lanes = len(written)
    for lane in range(lanes):
        w = written[lane]
        row = (w - 1) % T
        pending = w > 0 and link[row, lane] > 0 and not done[row, lane]
        h = w - int(pending)
        low = min(max(start[lane], w - T + guard), max(h, 0))
        for s in range(lo[lane], hi[lane]):  # old window steps below the new low end
            if s < low:
                left.append(s % T * lanes + lane)
        for s in range(low, h):  # new window steps above the old high end
            if s >= hi[lane]:
                new.append(s % T * lanes + lane)
        out_lo.append(low)
        out_hi.append(h)
    return left, new, out_lo, out_hi


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.integers(2, 12), st.data())
def test_advance_matches_a_plain_loop_and_the_numba_twin(lanes: int, T: int,  # noqa: N803
                                                         data: st.DataObject) -> None:
    guard = data.draw(st.integers(1, T))
    written_before = [data.draw(st.integers(0, 40)) for _ in range(lanes)]
    written = [w + data.draw(st.integers(0, 2 * T)) for w in written_before]
    start = [max(0, w - T) + data.draw(st.integers(0, 2)) for w in written]
    start = [min(s, w) for s, w in zip(start, written, strict=True)]
    link = np.asarray(data.draw(st.lists(st.integers(0, 3), min_size=T * lanes,
                                         max_size=T * lanes)), np.int32).reshape(T, lanes)
    term = np.asarray(data.draw(st.lists(st.booleans(), min_size=T * lanes,
                                         max_size=T * lanes))).reshape(T, lanes)
    trunc = np.zeros((T, lanes), bool)
    # an earlier window of the same lanes (as a previous advance left it)
    lo0 = np.zeros(lanes, np.int64)
    hi0 = np.zeros(lanes, np.int64)
    snapshot.advance(np.array(written_before, np.int64),
                     np.array([max(0, w - T) for w in written_before], np.int64),
                     link, term, trunc, T, guard, lo0, hi0)
    want = plain(written, start, link, term, T, guard, lo0.tolist(), hi0.tolist())
    for fn in (snapshot.advance, numba_twin.advance):
        lo, hi = lo0.copy(), hi0.copy()
        left, new = fn(np.array(written, np.int64), np.array(start, np.int64), link, term,
                       trunc, T, guard, lo, hi)
        assert (left.tolist(), new.tolist(), lo.tolist(), hi.tolist()) == want
