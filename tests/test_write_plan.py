"""The write plan against a plain-loop oracle of the ring (hypothesis over lane counters), and
its in-step branch (Python ints, arrays on first read) against the plan built from arrays."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from replaybank.storage.writers.plan import WritePlan, _arrays, plan_write


def oracle(T: int, lanes: list[int], written: list[int], counts: list[int],  # noqa: N803
           n: int) -> dict[str, list[object]]:
    """Step by step: which rows each lane's kept steps land in, which of them held a live
    old step, how many old steps stay, and whether the previous newest step survives."""
    rows, evicted, kept_old, prev = [], [], [], []
    for lane in lanes:
        w, c = written[lane], counts[lane]
        live = {s % T for s in range(w - c, w)}  # rows of the live old steps
        new_seqs = list(range(w, w + n))[-T:] if n else []  # a longer write keeps its last T
        lane_rows = [s % T for s in new_seqs]
        rows.append(lane_rows)
        evicted.append([r in live for r in lane_rows])
        overwritten = {s % T for s in range(w, w + n)}
        kept_old.append(len(live - overwritten))
        prev.append(c > 0 and n <= T and (w - 1) % T not in overwritten)
    return {"rows": rows, "evicted": evicted, "kept_old": kept_old, "prev": prev}


@st.composite
def ring_states(draw: st.DrawFn) -> tuple[int, int, list[int], list[int], list[int], int]:
    T = draw(st.integers(1, 6))  # noqa: N806
    L = draw(st.integers(1, 4))  # noqa: N806
    written = [draw(st.integers(0, 20)) for _ in range(L)]
    counts = [min(w, draw(st.integers(0, T))) for w in written]
    if draw(st.booleans()):  # lanes in step, as vector envs keep them
        written, counts = [written[0]] * L, [counts[0]] * L
    lanes = draw(st.lists(st.integers(0, L - 1), min_size=1, max_size=L, unique=True))
    if draw(st.booleans()):
        lanes = list(range(L))
    n = draw(st.integers(0, 2 * T + 1))
    return T, L, lanes, written, counts, n


@settings(max_examples=400, deadline=None)
@given(ring_states())
def test_plan_matches_a_plain_loop(state: tuple[int, int, list[int], list[int], list[int],
                                                int]) -> None:
    T, L, lanes, written, counts, n = state  # noqa: N806
    plan = plan_write(T, L, np.array(lanes, dtype=np.int64), np.array(written, np.int64),
                      np.array(counts, np.int64), n)
    want = oracle(T, lanes, written, counts, n)
    assert plan.rows.T.tolist() == want["rows"]
    got_evicted = np.zeros(plan.rows.shape, bool) if plan.evicted is None else plan.evicted
    assert got_evicted.T.tolist() == want["evicted"]
    assert plan.kept_old.tolist() == want["kept_old"]
    survives = [j in set(plan.prev_pos.tolist()) for j in range(len(lanes))]
    assert survives == want["prev"]
    for j, pos in enumerate(plan.prev_pos.tolist()):
        assert plan.prev_rows[j] == (written[lanes[pos]] - 1) % T
    assert plan.new_counts.tolist() == [min(counts[lane] + n, T) for lane in lanes]
    assert plan.new_written.tolist() == [written[lane] + n for lane in lanes]
    keys = plan.keys()  # [n, m]: sequence number * L + lane
    assert keys.T.tolist() == [[s * L + lane for s in range(written[lane], written[lane] + n)]
                               for lane in lanes]
    # the index addresses the same cells as (rows, lanes)
    grid = np.arange(T * L).reshape(T, L)
    expect = grid[plan.rows, np.array(lanes)[None, :]]
    assert np.array_equal(grid[plan.index].reshape(expect.shape), expect)


@settings(max_examples=400, deadline=None)
@given(ring_states())
def test_in_step_plan_equals_the_array_plan(state: tuple[int, int, list[int], list[int],
                                                         list[int], int]) -> None:
    """Lanes in step are planned with Python ints and compute their arrays on first read:
    every field, and what a writer reads instead of the arrays (``counter_values``,
    ``evicts``, ``continues``, ``keys``), equals the plan built from arrays at once."""
    T, L, lanes, written, counts, n = state  # noqa: N806
    ids = np.array(lanes, dtype=np.int64)
    w, c = np.array(written, np.int64), np.array(counts, np.int64)
    plan = plan_write(T, L, ids, w, c, n)
    all_lanes = lanes == list(range(L))
    s0, c0 = w[ids], c[ids]
    in_step = len(set(s0.tolist())) == 1 and len(set(c0.tolist())) == 1
    assert plan.in_step == in_step and plan.all_lanes == all_lanes
    assert (plan.lane_counters is not None) == in_step
    if in_step:
        assert plan.lane_counters == (int(s0[0]), int(c0[0]))
    # what the writer reads of a plan of lanes in step, before any array is built
    evicts, continues = plan.evicts, plan.continues
    counters = plan.counter_values
    keys = plan.keys()
    eager = WritePlan(T=T, L=L, n=n, lane_ids=ids, all_lanes=all_lanes, in_step=in_step,
                      skip=max(0, n - T), **_arrays(T, n, ids, all_lanes, in_step, s0, c0))
    for f in fields(WritePlan):
        if f.name == "lane_counters":
            continue
        got, want = getattr(plan, f.name), getattr(eager, f.name)
        if isinstance(want, tuple):  # (rows, lanes) index
            assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
        elif isinstance(want, np.ndarray) or want is None:
            assert (got is None) == (want is None)
            if want is not None:
                assert np.array_equal(got, want) and got.dtype == want.dtype, f.name
        else:
            assert got == want, f.name
    assert evicts == (eager.evicted is not None)
    assert continues == (len(eager.prev_pos) > 0)
    want_counters = (eager.start_written - eager.kept_old, eager.kept_old, eager.new_written,
                     eager.new_counts)
    for got, want in zip(counters, want_counters, strict=True):
        assert np.array_equal(np.broadcast_to(got, want.shape), want)
    assert np.array_equal(keys, eager.keys()) and keys.dtype == np.int64
    assert keys.shape == (n, len(lanes))
