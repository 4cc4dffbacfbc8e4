"""Shared-memory replay (``storage="shared"``): collector processes write, one learner samples.

Real processes (``multiprocessing`` spawn), real shared-memory segments, real SIGKILLs.
Every step written carries its identity (``tests/shared_workers.py``), so each sampled
row is checked on its own for being one complete step with its exact next observation.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.errors import CheckpointError, ConfigError
from replaybank.shared.backend import segment_names, sweep_stale
from replaybank.shared.lanes import default_guard
from tests.shared_workers import SPEC, check_batch, owner_then_wait, step_values, write_lanes
from tests.stats import chi2_critical

CTX = mp.get_context("spawn")
ROOT = Path(__file__).resolve().parents[1]


def _owner(capacity: int = 64, num_envs: int = 2, **kw: Any) -> Any:
    return rb.ReplayBuffer(capacity, num_envs=num_envs, seed=0, spec=SPEC, storage="shared",
                           **kw)


def _window(written: int, T: int, pending: bool) -> tuple[int, int]:  # noqa: N803
    """The model of a lane's snapshot window ``[lo, hi)`` (module docstring of
    replaybank.shared.lanes), from the lane's steps alone."""
    start = max(0, written - T)
    lo = max(start, written - T + default_guard(T))
    hi = written - int(pending and written > 0)
    return min(lo, max(hi, 0)), hi


def test_owner_refuses_writes_and_pickling_and_writer_checks_lanes() -> None:
    buf = _owner()
    values = step_values(np.array([0, 1]), np.zeros(2), np.zeros(2), np.zeros(2, bool))
    for call in (lambda: buf.add(**values), lambda: buf.extend(**{
            k: v[None] for k, v in values.items()}), buf.clear):
        with pytest.raises(ConfigError, match="writer"):
            call()
    assert len(buf) == 0
    with pytest.raises(ConfigError, match="pickled"):
        pickle.dumps(buf)
    for bad in ([2], [0, 0], [], [[0]], ["a"]):
        with pytest.raises(ConfigError, match="lanes="):
            buf.writer(lanes=bad)
    with pytest.raises(ConfigError, match='only a storage="shared"'):
        rb.ReplayBuffer(8).writer([0])
    with pytest.raises(ConfigError, match="spec="):
        rb.ReplayBuffer(8, storage="shared")
    with pytest.raises(ConfigError, match="path"):
        rb.ReplayBuffer(8, storage="shared", path="x", spec=SPEC)
    handle = buf.writer(lanes=[1])
    assert pickle.loads(pickle.dumps(handle)) == handle  # it travels to other processes
    buf.close()


def test_a_ragged_lanes_list_is_the_one_ragged_shape_error() -> None:
    """lanes_of caught numpy's ValueError for a ragged list itself and called it a
    ConfigError that said nothing of the rows; it is the one ragged check's ShapeError
    (host.as_numpy), naming the lanes, the first unlike row and the fix. Nothing is
    claimed: the lanes stay free for a writer."""
    buf = _owner()
    with pytest.raises(rb.ShapeError) as err:
        buf.writer(lanes=[[0], [0, 1]])
    assert str(err.value) == (
        "writer(lanes=[[0], [0, 1]]): a ragged nest, rows of different lengths ([1] has "
        "shape (2,) but [0] has shape (1,)); expected [k] lane ids (one int per lane): give "
        "distinct lane ids in [0, 2) (each writer owns some lanes of the buffer)"
    )
    w = buf.writer(lanes=[0, 1]).open()
    assert w.lanes.tolist() == [0, 1]
    w.close()
    buf.close()


def test_a_lane_has_one_writer_at_a_time() -> None:
    buf = _owner()
    w = buf.writer([0, 1]).open()
    other = buf.writer([1])
    # another live process may not open lanes that a writer holds
    q = CTX.Queue()
    proc = CTX.Process(target=_open_and_report, args=(other, q))
    proc.start()
    proc.join(30)
    assert "written by process" in q.get(timeout=5)
    w.close()
    proc = CTX.Process(target=_open_and_report, args=(other, q))
    proc.start()
    proc.join(30)
    assert q.get(timeout=5) == "ok"
    buf.close()


def test_a_second_writer_of_a_lane_in_the_same_process_is_refused() -> None:
    buf = _owner(64, 2)
    lanes = np.array([0])
    w = buf.writer([0]).open()
    with pytest.raises(ConfigError, match=r"lane 0 is written by another open writer of "
                                          r"this process .*close that writer first"):
        buf.writer([0]).open()
    with pytest.raises(ConfigError, match="lane 0"):
        buf.writer([1, 0]).open()
    other = buf.writer([1]).open()  # the refused open claimed nothing: lane 1 is free
    other.close()
    for t in range(10):
        w.add(**step_values(lanes, np.full(1, t), np.zeros(1), np.zeros(1, bool)))
    b = buf.sample(256)
    check_batch(b)  # one writer's steps only: none torn by a second one
    assert sorted(set(b.obs[:, 1].astype(int).tolist())) == list(range(9))
    w.close()
    # closed: the lane is free again, and the next writer continues it
    w = buf.writer([0]).open()
    assert w.written.tolist() == [10]
    del w
    gc.collect()  # a writer dropped without close holds nothing either
    buf.writer([0]).open().close()
    buf.close()


def _open_and_report(handle: Any, q: Any) -> None:
    try:
        handle.open().close()
        q.put("ok")
    except ConfigError as exc:
        q.put(str(exc))


def test_a_multi_agent_buffer_refuses_shared_memory_before_making_any() -> None:
    spec = {"obs": {"a": ((3,), "float32"), "b": ((3,), "float32")},
            "action": {"a": ((), "int64"), "b": ((), "int64")}}
    before = segment_names()
    for build in (
            lambda: rb.MultiAgentReplayBuffer(100, agents=["a", "b"], num_envs=2, spec=spec,
                                              storage="shared"),
            lambda: rb.from_config({"type": "MultiAgentReplayBuffer", "capacity": 100,
                                    "agents": ["a", "b"], "storage": "shared"}, spec=spec)):
        with pytest.raises(ConfigError, match=r"storage='shared'.*storage=\"numpy\".*"
                                              r"ReplayService"):
            build()
    assert segment_names() == before  # nothing was allocated


def test_snapshot_window_and_uniform_sampling() -> None:
    buf = _owner(64, 2)
    T = 32  # noqa: N806
    w = buf.writer([0, 1]).open()
    lanes = np.array([0, 1])
    for t in range(100):
        w.add(**step_values(lanes, np.full(2, t), np.zeros(2), np.zeros(2, bool)))
    lo, hi = _window(100, T, pending=True)
    assert len(buf) == 2 * (hi - lo)
    n = 200 * len(buf)
    batch = buf.sample(n)
    check_batch(batch)
    cells = (batch.obs[:, 0].astype(int) * T + batch.obs[:, 1].astype(int) - lo)
    counts = np.bincount(cells, minlength=2 * T)
    support = np.concatenate([np.arange(hi - lo), T + np.arange(hi - lo)])
    assert counts.sum() == counts[support].sum()  # nothing outside the window
    expected = n / len(support)
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    assert chi2 < chi2_critical(len(support) - 1)
    # an episode's last step is not pending: it is sampled at once
    w.add(**step_values(lanes, np.full(2, 100), np.zeros(2), np.ones(2, bool)))
    assert len(buf) == 2 * (101 - _window(101, T, pending=False)[0])
    w.close()
    buf.close()


def test_writer_initial_priorities_reach_the_learner() -> None:
    buf = _owner(64, 2, sampler=rb.PrioritizedSampler(alpha=1.0, eps=0.0))
    w = buf.writer([0, 1]).open()
    lanes = np.array([0, 1])
    for t in range(10):
        w.add(**step_values(lanes, np.full(2, t), np.zeros(2), np.zeros(2, bool)),
              priority=np.array([1.0 + t, 100.0]))
    batch = buf.sample(4000)
    check_batch(batch)
    # lane 1 holds 9 live steps of priority 100, lane 0 steps 1..9 (t = 0..8)
    lane1 = float(np.mean(batch.obs[:, 0] == 1))
    assert abs(lane1 - 900 / (900 + sum(range(1, 10)))) < 0.03
    got = np.asarray(batch.probabilities)[batch.obs[:, 0] == 0]
    t0 = batch.obs[batch.obs[:, 0] == 0, 1].astype(np.float64)
    np.testing.assert_allclose(got, (1.0 + t0) / (900 + 45), rtol=1e-9)
    # learner updates apply; with the snapshot, a late update of an overwritten step
    # is ignored
    assert buf.update_priorities(batch.indices[:5], np.ones(5)) == 5
    w.close()
    buf.close()


def test_writer_extend_priorities_one_per_step_flat_reach_the_learner() -> None:
    """A writer read ``priority`` with its own np.asarray and broadcast it to
    ``[n, lanes]``; the flat ``n * lanes`` values one buffer's extend takes (one per
    step) did not broadcast, so the writer stored none and the learner drew the steps
    uniformly (each 1/6 where one buffer draws step i with p_i / 21). The writer now
    reads them by one buffer's rule (buffers.priorities.priority_values)."""
    buf = _owner(16, 2, sampler=rb.PrioritizedSampler(alpha=1.0, eps=0.0))
    w = buf.writer([0, 1]).open()
    lanes = np.array([0, 1])
    steps = [step_values(lanes, np.full(2, t), np.zeros(2), np.full(2, t == 2)) for t in range(3)]
    values = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
    flat = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # step-major: (t, lane) -> flat[2 * t + lane]
    w.extend(**values, priority=flat)
    batch = buf.sample(64)
    check_batch(batch)
    t, lane = batch.obs[:, 1].astype(int), batch.obs[:, 0].astype(int)
    want = np.asarray(flat)[2 * t + lane] / sum(flat)
    np.testing.assert_allclose(batch.probabilities, want, rtol=1e-9)
    w.close()
    buf.close()


@pytest.mark.parametrize("lanes", [[0], [0, 1]], ids=["one lane", "two lanes"])
@pytest.mark.parametrize("arg", ["priority", "terminated"])
def test_a_writer_refuses_a_ragged_list_as_the_buffer_does(lanes: list[int], arg: str) -> None:
    """The writer read ``priority`` and ``terminated`` with np.asarray/np.shape of its
    own: a ragged ``terminated`` was numpy's bare ValueError naming nothing, and a ragged
    ``priority`` was swallowed for the buffer to name. Both are the one ragged check's
    ShapeError, as ReplayBuffer.extend words it; nothing is written."""
    buf = _owner(16, 2, sampler=rb.PrioritizedSampler())
    w = buf.writer(lanes).open()
    m = len(lanes)
    ids = np.array(lanes)
    steps = [step_values(ids, np.full(m, t), np.zeros(m), np.zeros(m, bool)) for t in range(2)]
    values: dict[str, Any] = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
    ragged: list[list[Any]] = [[1.0] * m, [1.0] * (m + 1)]
    if arg == "terminated":
        ragged = [[False] * m, [False] * (m + 1)]
    bad = {**values, arg: ragged}
    local = rb.ReplayBuffer(16, num_envs=m, sampler=rb.PrioritizedSampler())
    with pytest.raises(rb.ShapeError) as want:
        local.extend(**bad)
    with pytest.raises(rb.ShapeError) as got:
        w.extend(**bad)
    assert str(got.value) == str(want.value)
    assert str(got.value).startswith(f"{arg}=[[")
    assert len(w) == 0 and w.written.tolist() == [0] * m
    w.extend(**values)  # still usable
    assert w.written.tolist() == [2] * m
    w.close()
    buf.close()


class _OutrunningSampler(rb.PrioritizedSampler):
    """Has the writer write ``n`` more steps while each draw is being made (a writer
    process far faster than the learner, made deterministic)."""

    def __init__(self, writer: Any, n: int) -> None:
        super().__init__()
        self.writer, self.n = writer, n

    def sample(self, batch_size: int, lanes: Any, rng: np.random.Generator,
               replace: bool = True, beta: float | None = None, **kw: Any) -> Any:
        _extend(self.writer, self.n)
        return super().sample(batch_size, lanes, rng, replace=replace, beta=beta, **kw)


def _extend(w: Any, n: int) -> None:
    """``n`` more steps of the writer's one lane, continuing it."""
    t = np.arange(n) + int(w.written[0])
    v = step_values(np.zeros(n), t, np.zeros(n), np.zeros(n, bool))
    w.extend(**{k: x[:, None] for k, x in v.items()})


@pytest.mark.parametrize(("capacity", "fix"), [
    (64, "build the buffer with a larger capacity, sample smaller batches"),
    (32768, "sample smaller batches (the guard is at its largest)")])
def test_writers_outrunning_every_draw_name_what_controls_the_guard(capacity: int,
                                                                     fix: str) -> None:
    buf = _owner(capacity, 1)
    w = buf.writer([0]).open()
    _extend(w, capacity + 10)  # a full lane: each new step evicts one
    guard = default_guard(capacity)
    buf.sampler = _OutrunningSampler(w, guard + 1)
    with pytest.raises(rb.WritersOutranError) as err:
        buf.sample(4)
    msg = str(err.value)
    assert f"more than guard={guard} steps" in msg
    assert f"T = capacity // num_envs = {capacity} rows per lane" in msg
    assert fix in msg and "shared_guard" not in msg
    assert buf.metadata()["shared_retries"] == 16
    buf.sampler = rb.UniformSampler()  # nothing else changed: it samples again
    check_batch(buf.sample(64))
    w.close()
    buf.close()


class _TornOnceSampler(rb.PrioritizedSampler):
    """Its first draw finds the snapshot torn: the writer evicts past it, and the draw
    refuses (as a draw over an empty window does), as when a learner is descheduled
    between its reads of ``written`` and ``start``."""

    def __init__(self, writer: Any, n: int) -> None:
        super().__init__()
        self.writer, self.n, self.torn = writer, n, False

    def sample(self, batch_size: int, lanes: Any, rng: np.random.Generator,
               replace: bool = True, beta: float | None = None, **kw: Any) -> Any:
        if not self.torn:
            self.torn = True
            _extend(self.writer, self.n)
            raise rb.EmptyBufferError("sample: the buffer is empty (a torn snapshot)")
        return super().sample(batch_size, lanes, rng, replace=replace, beta=beta, **kw)


def test_a_draw_refused_over_a_snapshot_writers_outran_is_drawn_again() -> None:
    """A draw that raises while writers evicted past the snapshot is retried on a fresh
    one (it raised EmptyBufferError to a learner sampling beside fast writers); the same
    error over an intact snapshot is the caller's."""
    buf = _owner(64, 1)
    w = buf.writer([0]).open()
    _extend(w, 80)
    buf.sampler = _TornOnceSampler(w, 64)
    check_batch(buf.sample(32))
    assert buf.metadata()["shared_retries"] == 1
    buf.sampler = _TornOnceSampler(w, 0)  # nothing evicted: a real refusal
    with pytest.raises(rb.EmptyBufferError, match="torn snapshot"):
        buf.sample(32)
    w.close()
    buf.close()


def test_a_late_priority_update_of_overwritten_steps_is_ignored_and_not_counted() -> None:
    buf = _owner(64, 2, sampler=rb.PrioritizedSampler(alpha=1.0))
    w = buf.writer([0, 1]).open()
    lanes = np.array([0, 1])

    def write(steps: int) -> None:
        for _ in range(steps):  # no initial priorities: new steps get the running max
            t = np.full(2, int(w.written[0]))
            w.add(**step_values(lanes, t, np.zeros(2), np.zeros(2, bool)))

    write(20)
    old, seq = buf.sample(32), buf.sample_sequences(4, 3)
    write(40)  # every row of both lanes (T = 32) rewritten since: all of them stale
    assert buf.update_priorities(old.indices, np.full(32, 1000.0)) == 0
    assert buf.update_sequence_priorities(seq.starts, np.ones((4, 3))) == 0
    write(8)  # and no step's priority changed
    b = buf.sample(2000)
    check_batch(b)
    np.testing.assert_allclose(b.probabilities, 1 / len(buf))
    fresh = buf.sample(16)  # an update of live steps still applies, each one counted
    assert buf.update_priorities(fresh.indices, np.ones(16)) == 16
    w.close()
    buf.close()


def test_nstep_and_sequences_read_exact_windows() -> None:
    gamma = 0.5
    buf = _owner(256, 2, n_step=3, gamma=gamma)
    w = buf.writer([0, 1]).open()
    lanes = np.array([0, 1])
    rng = np.random.default_rng(1)
    ep = np.zeros(2)
    for t in range(300):
        done = rng.random(2) < 0.1
        w.add(**step_values(lanes, np.full(2, t), ep, done))
        ep = np.where(done, ep + 1, ep)
    b = buf.sample(512)
    t0 = b.obs[:, 1].astype(np.int64)
    steps = np.rint(np.log(np.asarray(b.discount)) / np.log(gamma)).astype(np.int64)
    assert steps.min() >= 1 and steps.max() <= 3
    expect = np.array([sum(gamma ** k * (t + k) for k in range(L))
                       for t, L in zip(t0.tolist(), steps.tolist(), strict=True)])
    np.testing.assert_allclose(b.reward, expect, rtol=1e-5)
    np.testing.assert_array_equal(b.next_obs[:, 1], b.obs[:, 1] + steps)
    seq = buf.sample_sequences(32, 8)
    obs = np.asarray(seq.obs)
    mask = np.asarray(seq.mask, bool)
    ts = obs[:, :, 1]
    assert np.all(np.diff(ts, axis=1)[mask[:, 1:]] == 1)
    w.close()
    buf.close()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2]), st.integers(1, 40),
                          st.floats(0.0, 0.5)), min_size=1, max_size=8))
def test_property_learner_sees_exactly_the_model_window(
        ops: list[tuple[int, int, float]]) -> None:
    """Random bursts of writes by three writers (lanes {0}, {1, 2}, {3}), each burst
    followed by a learner sample: ``len`` equals the model's windows and every sampled
    row is one exact step inside them."""
    T = 16  # noqa: N806
    buf = _owner(64, 4)
    groups = [np.array([0]), np.array([1, 2]), np.array([3])]
    writers = [buf.writer(g).open() for g in groups]
    t = np.zeros(4, np.int64)
    ep = np.zeros(4)
    last_done = np.zeros(4, bool)
    rng = np.random.default_rng(0)
    for g, n, p in ops:
        lanes = groups[g]
        for _ in range(n):
            done = rng.random(len(lanes)) < p
            writers[g].add(**step_values(lanes, t[lanes].astype(np.float64), ep[lanes], done))
            t[lanes] += 1
            ep[lanes] = np.where(done, ep[lanes] + 1, ep[lanes])
            last_done[lanes] = done
        wins = [_window(int(t[lane]), T, pending=not last_done[lane]) for lane in range(4)]
        assert len(buf) == sum(hi - lo for lo, hi in wins)
        if len(buf):
            b = buf.sample(64)
            check_batch(b)
            for lane, step in zip(b.obs[:, 0].astype(int), b.obs[:, 1].astype(int),
                                  strict=True):
                lo, hi = wins[lane]
                assert lo <= step < hi
    for w in writers:
        w.close()
    buf.close()


def _all_steps(buf: Any, lanes: int, to_local: Any = None) -> dict[int, tuple[Any, ...]]:
    """Every step a buffer samples, by item key (``to_local(seq, lane)``: the key in
    another buffer's lanes)."""
    b = buf.sample(len(buf), replace=False)
    out = {}
    for i, key in enumerate(np.asarray(b.indices).tolist()):
        seq, lane = divmod(key, lanes)
        k = key if to_local is None else to_local(seq, lane)
        out[k] = tuple(np.asarray(b[f])[i].tolist() for f in
                       ("obs", "action", "reward", "next_obs", "terminated", "truncated"))
    return out


@pytest.mark.parametrize(("sub_envs", "lanes"), [(2, [2, 0]), (None, [1]), (2, [1])])
def test_collect_fills_a_writer_as_it_fills_a_buffer(sub_envs: int | None,
                                                     lanes: list[int]) -> None:
    """rb.collect into a writer of some lanes of a 3-lane shared buffer stores what it
    stores into a local buffer of len(lanes) envs: a vector env (its default autoreset
    adds some sub-envs only: env_ids), one env (values without a lane dim), and a vector
    env into one lane (staged extends)."""
    gym = pytest.importorskip("gymnasium")

    def env() -> Any:
        return gym.make("CartPole-v1") if sub_envs is None else \
            gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * sub_envs)

    T = 512  # noqa: N806
    spec = rb.spec_from_env(env())
    local = rb.ReplayBuffer(T * len(lanes), num_envs=len(lanes), seed=0, spec=spec)
    want = rb.collect(env(), None, local, 300, progress=False, seed=3)
    buf = rb.ReplayBuffer(3 * T, num_envs=3, seed=0, spec=spec, storage="shared")
    w = buf.writer(lanes).open()
    assert w.num_envs == len(lanes) and w.spec == buf.spec
    got = rb.collect(env(), None, w, 300, progress=False, seed=3)
    assert (got.steps, got.episode_lengths) == (want.steps, want.episode_lengths)
    mine = _all_steps(buf, 3, lambda seq, lane: seq * len(lanes) + lanes.index(lane))
    theirs = _all_steps(local, len(lanes))
    # the same steps, less the newest of each lane while it waits for its next obs
    assert set(mine) <= set(theirs) and len(theirs) - len(mine) <= len(lanes)
    assert all(mine[k] == theirs[k] for k in mine)
    w.close()
    buf.close()


def test_writer_env_ids_are_positions_among_its_lanes() -> None:
    buf = _owner(48, 3)
    w = buf.writer([2, 0]).open()
    one = step_values(np.array([0]), np.zeros(1), np.zeros(1), np.ones(1, bool))
    w.add(**one, env_ids=[1])  # its second lane: lane 0 of the buffer
    w.extend(**{k: v[None] for k, v in step_values(
        np.array([2]), np.zeros(1), np.zeros(1), np.ones(1, bool)).items()}, env_ids=[0])
    assert w.written.tolist() == [1, 1] and len(buf) == 2
    check_batch(buf.sample(16))
    for bad in ([2], [0, 0], [-1]):
        with pytest.raises(rb.ShapeError, match=r"env_ids are positions among this "
                                                r"writer's lanes \[2, 0\]"):
            w.add(**one, env_ids=bad)
    assert w.written.tolist() == [1, 1] and len(buf) == 2
    w.close()
    buf.close()


def test_writer_processes_never_show_a_torn_step() -> None:
    """Two collector processes write as fast as they can while the learner samples."""
    buf = _owner(4096, 4, sampler=rb.PrioritizedSampler())
    procs = [CTX.Process(target=write_lanes, args=(buf.writer(lanes), 30_000, i))
             for i, lanes in enumerate(([0, 1], [2, 3]))]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 60
    samples = 0
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        if len(buf) >= 64:
            b = buf.sample(64)
            check_batch(b)
            buf.update_priorities(b.indices, np.abs(b.reward) + 1.0)
            samples += 1
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert samples > 50
    check_batch(buf.sample(1024))
    assert buf.table.written.tolist() == [4000 - 1] * 4 or len(buf) > 0
    # the draws thrown away because writers outran them are counted (and reported)
    retries = buf.metadata()["shared_retries"]
    assert isinstance(retries, int) and 0 <= retries <= samples * 16
    assert "shared_retries" not in rb.ReplayBuffer(8).metadata()
    buf.close()


@pytest.mark.parametrize("sampler", [None, rb.PrioritizedSampler(alpha=1.0)])
def test_a_saved_shared_buffer_loads_into_memory_as_the_steps_its_learner_sampled(
        tmp_path: Path, sampler: Any) -> None:
    """rb.save writes one snapshot: the loaded (numpy) buffer holds exactly the learner's
    steps, each as its writer wrote it, with the learner's sampler state and generator."""
    buf = _owner(64, 2, **({} if sampler is None else {"sampler": sampler}))
    w = buf.writer([0, 1]).open()
    lanes = np.array([0, 1])
    rng = np.random.default_rng(3)
    ep = np.zeros(2)
    for t in range(70):  # both lanes full (T = 32), episodes ending now and then
        done = rng.random(2) < 0.15
        prio = None if sampler is None else rng.random(2) + 0.5
        w.add(**step_values(lanes, np.full(2, t), ep, done), priority=prio)
        ep = np.where(done, ep + 1, ep)
    if sampler is not None:
        b = buf.sample(16)
        buf.update_priorities(b.indices, np.arange(16) + 1.0)
    buf.save(tmp_path)
    back = rb.load(tmp_path)
    assert back.backend.name == "numpy" and len(back) == len(buf) > 0
    mine, theirs = buf.sample(64), back.sample(64)  # the same draw from the same state
    for key in mine:
        np.testing.assert_array_equal(theirs[key], mine[key])
    everything = back.sample(len(back), replace=False)
    check_batch(everything)  # every step exact, the newest of each lane included
    assert _all_steps(back, 2) == _all_steps(buf, 2)
    # the loaded buffer goes on as a local one: the next steps continue its lanes
    back.add(**step_values(lanes, np.full(2, 70), ep, np.ones(2, bool)))
    check_batch(back.sample(256))
    w.close()
    buf.close()


def test_saves_beside_writer_processes_are_each_one_consistent_snapshot(
        tmp_path: Path) -> None:
    buf = _owner(4096, 4, sampler=rb.PrioritizedSampler())
    procs = [CTX.Process(target=write_lanes, args=(buf.writer(lanes), 20_000, i))
             for i, lanes in enumerate(([0, 1], [2, 3]))]
    for p in procs:
        p.start()
    saved = 0
    deadline = time.monotonic() + 60
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        if len(buf) >= 64:
            rb.save(buf, tmp_path / str(saved))
            back = rb.load(tmp_path / str(saved))
            check_batch(back.sample(len(back), replace=False))
            saved += 1
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert saved >= 3
    buf.close()


def test_writer_killed_mid_add_leaves_no_torn_step_and_its_lanes_are_taken_over() -> None:
    buf = _owner(512, 2)
    handle = buf.writer([0, 1])
    for kill_at in (3, 17, 40, 91):
        env = {"REPLAYBANK_KILL_AT": str(kill_at)}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # spawn children read it at import
        try:
            p = CTX.Process(target=write_lanes, args=(handle, 10_000, kill_at))
            p.start()
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v
        p.join(60)
        assert p.exitcode == -signal.SIGKILL
        if len(buf):
            check_batch(buf.sample(256))
    # a healthy writer takes the lanes over and continues them
    p = CTX.Process(target=write_lanes, args=(handle, 300, 0))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    check_batch(buf.sample(2048))
    assert len(buf) > 0
    buf.close()


def test_segments_are_removed_when_the_owner_closes() -> None:
    buf = _owner()
    token = buf.backend.token
    mine = [n for n in segment_names() if token in n]
    assert len(mine) >= 8  # fields, side store, counters, links, priorities, claims
    handle = buf.writer([0])
    handle.open().close()
    buf.close()
    assert not [n for n in segment_names() if token in n]
    with pytest.raises(CheckpointError, match="gone"):
        handle.open()  # the owner is gone


#: An owner forks children that exit the ordinary way (their interpreter's exit hooks
#: run: they inherited the owner's), then checks that its segments are still there.
_FORK_SCRIPT = """
import os, sys
import numpy as np
import replaybank as rb
from replaybank.shared.backend import segment_names
from tests.shared_workers import SPEC, step_values

buf = rb.ReplayBuffer(64, num_envs=1, seed=0, spec=SPEC, storage="shared")
token = buf.backend.token
handle = buf.writer([0])
before = [n for n in segment_names() if token in n]
for close_owner in (False, True):
    pid = os.fork()
    if pid == 0:
        w = handle.open()
        for t in range(5):
            w.add(**step_values(np.array([0]), np.full(1, t), np.zeros(1), np.zeros(1, bool)))
        w.close()
        if close_owner:
            buf.close()  # the child's copy of the owner: drops the child's mappings only
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [n for n in segment_names() if token in n] == before, "segments unlinked"
    w = handle.open()  # the segments still serve new writers
    w.close()
print("len", len(buf))
buf.close()
print("left", len([n for n in segment_names() if token in n]))
"""


def test_a_forked_child_that_exits_normally_leaves_the_owners_segments() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], capture_output=True,
                         text=True, timeout=120, cwd=ROOT, env=env, check=False)
    assert out.returncode == 0, out.stderr
    # 5 + 5 steps, the newest pending; then the owner's close removes them all
    assert out.stdout.split() == ["len", "9", "left", "0"]


def test_segments_of_a_sigkilled_owner_are_reclaimed() -> None:
    parent, child = CTX.Pipe()
    p = CTX.Process(target=owner_then_wait, args=(SPEC, child))
    p.start()
    pid, names = parent.recv()
    assert names and all(n in segment_names() for n in names)
    os.kill(pid, signal.SIGKILL)
    p.join(30)
    # its resource tracker (a separate process) unlinks them; a new owner sweeps what
    # is left of dead owners in any case
    deadline = time.monotonic() + 10
    while any(n in segment_names() for n in names) and time.monotonic() < deadline:
        sweep_stale()
        time.sleep(0.1)
    assert not any(n in segment_names() for n in names)


def test_a_segment_name_with_an_impossible_pid_neither_crashes_nor_outlives_a_sweep() -> None:
    """Anyone may create files in /dev/shm: one named like this namespace's segments with a
    pid beyond the platform's range made the sweep a new owner runs raise OverflowError
    (no shared buffer could be built), and one with pid 0 (which ``kill`` reads as this
    process group) was taken for a live owner and never swept."""
    from replaybank.shared.backend import PREFIX, pid_namespace

    ns = pid_namespace()
    if ns is None:
        pytest.skip("this system does not show PID namespaces: nothing is swept")
    crafted = [f"{PREFIX}{2**64:x}_{ns:x}_0badc0de_0", f"{PREFIX}0_{ns:x}_0badc0de_1"]
    for name in crafted:
        (Path("/dev/shm") / name).write_bytes(b"")
    try:
        buf = rb.ReplayBuffer(16, num_envs=1, storage="shared", spec=SPEC, seed=0)
        assert len(buf) == 0
        assert not any(name in segment_names() for name in crafted)
    finally:
        for name in crafted:
            (Path("/dev/shm") / name).unlink(missing_ok=True)


def _her_reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    return -(np.abs(achieved - desired).sum(-1) > 0).astype(np.float32)


def test_hindsight_and_frame_stacks_on_shared_memory() -> None:
    """The learner's views work on the snapshot: HER goals come from the same episode's
    future (within what the learner sees) and frame stacks are consecutive frames."""
    spec = {"obs": {"observation": ((3,), "float32"), "achieved_goal": ((2,), "float32"),
                    "desired_goal": ((2,), "float32")}, "action": ((), "int64")}
    her = rb.HerReplayBuffer(256, num_envs=2, reward_fn=_her_reward, seed=0,
                             storage="shared", spec=spec, autoreset_mode="same_step")
    w = her.writer([0, 1]).open()
    episode_of = np.zeros((2, 60), int)
    ep = np.zeros(2, int)
    for t in range(60):
        def part(v: float) -> dict[str, np.ndarray]:
            return {"observation": np.full((2, 3), v, np.float32),
                    "achieved_goal": np.full((2, 2), v, np.float32),
                    "desired_goal": np.full((2, 2), 99, np.float32)}
        done = np.array([t % 10 == 9, t % 7 == 6])
        episode_of[:, t] = ep
        w.add(obs=part(t), action=np.array([0, 1]), reward=np.zeros(2, np.float32),
              next_obs=part(t + 1), terminated=np.zeros(2, bool), truncated=done)
        ep += done
    b = her.sample(256)
    assert 0.6 < float(np.mean(b.relabeled)) < 0.9  # k=4: 4/5 of rows of ended episodes
    t = b.obs["achieved_goal"][:, 0].astype(int)
    g = b.obs["desired_goal"][:, 0].astype(int)
    lane = np.asarray(b.action)
    rel = np.asarray(b.relabeled, bool)
    # future strategy: the goal is the achieved goal after a step j >= t of the same episode
    assert np.all(g[rel] >= t[rel] + 1)
    assert all(episode_of[ln, gg - 1] == episode_of[ln, tt]
               for ln, gg, tt in zip(lane[rel], g[rel], t[rel], strict=True))
    np.testing.assert_array_equal(b.reward[rel], _her_reward(
        b.next_obs["achieved_goal"], b.obs["desired_goal"], {})[rel])
    assert np.all(b.reward[~rel] == 0)  # as stored
    w.close()
    her.close()

    stack = rb.ReplayBuffer(128, num_envs=1, frame_stack=3, storage="shared", seed=0,
                            spec={"obs": ((3,), "float32"), "action": ((), "int64")})
    w = stack.writer([0]).open()
    for t in range(40):
        w.add(**{**step_values(np.array([0]), np.array([t]), np.zeros(1), np.zeros(1, bool)),
                 "obs": np.full((1, 3), t, np.float32),
                 "next_obs": np.full((1, 3), t + 1, np.float32)})
    b = stack.sample(64)
    frames = b.obs[:, :, 0]
    # consecutive frames; the first steps of the lane repeat frame 0 (padding)
    expect = np.maximum(frames[:, -1:] - np.array([2, 1, 0]), 0)
    np.testing.assert_array_equal(frames, expect)
    np.testing.assert_array_equal(b.next_obs[:, -1, 0], frames[:, -1] + 1)
    w.close()
    stack.close()


@pytest.mark.parametrize("lanes", [[0], [0, 1]], ids=["one lane", "two lanes"])
@pytest.mark.parametrize("form", ["per-step tuples", "tuple"])
def test_a_writer_refuses_tuples_holding_arrays_as_the_buffer_does(lanes: list[int],
                                                                   form: str) -> None:
    """A one-lane writer converted its values itself (np.asarray), past the buffer's tuple
    rule: ``extend(obs=[(a0, b0), ...])`` or a tuple of arrays was stacked part-first and
    refused as a shape misfit (or, where the shapes fit, stored). Every writer refuses it
    with the buffer's ShapeError (spec.check_tuple); nothing is written."""
    buf = _owner(16, 2)
    w = buf.writer(lanes).open()
    m = len(lanes)
    ids = np.array(lanes)
    steps = [step_values(ids, np.full(m, t), np.zeros(m), np.zeros(m, bool)) for t in range(3)]
    values = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
    if m == 1:
        values = {k: v[:, 0] for k, v in values.items()}
    if form == "tuple":
        obs: Any = (values["obs"][..., :2], values["obs"][..., 2:])
        said = r"^obs=\(array\(shape=.*a tuple holding arrays is a structured value"
    else:
        obs = [(o[..., :2], o[..., 2:]) for o in values["obs"]]
        said = r"^obs=\[3 items: \(array\(shape=.*are tuples holding arrays"
    with pytest.raises(rb.ShapeError, match=said + r".*obs=\{'0': "):
        w.extend(**{**values, "obs": obs}, priority=np.ones((3, m)))
    assert len(w) == 0 and w.written.tolist() == [0] * m
    w.extend(**values)  # still usable
    assert w.written.tolist() == [3] * m
    w.close()
    buf.close()


@pytest.mark.parametrize("call", ["add", "extend"])
def test_a_writer_refuses_positional_values_as_the_buffer_does(call: str) -> None:
    """``SharedWriter.add(obs)`` (values by position, SB3's order) was Python's bare
    TypeError ("takes 1 positional argument but 2 were given"), where ReplayBuffer.add
    raises an ArgumentError naming the keyword form and the SB3 front end. A writer now
    raises the buffer's own error, word for word; nothing is written."""
    buf = _owner(16, 2)
    w = buf.writer([0, 1]).open()
    values = step_values(np.arange(2), np.zeros(2), np.zeros(2), np.zeros(2, bool))
    if call == "extend":
        values = {k: v[None] for k, v in values.items()}
    local = rb.ReplayBuffer(16, num_envs=2, spec=SPEC)
    with pytest.raises(rb.ArgumentError) as want:
        getattr(local, call)(values["obs"], **values)
    with pytest.raises(rb.ArgumentError) as got:
        getattr(w, call)(values["obs"], **values)
    assert str(got.value) == str(want.value)
    assert str(got.value).startswith(f"{call}() takes keyword arguments only")
    assert len(w) == 0 and w.written.tolist() == [0, 0]
    getattr(w, call)(**values)  # still usable
    assert w.written.tolist() == [1, 1]
    w.close()
    buf.close()


def test_a_writer_flushes_as_a_service_client_does() -> None:
    """A collector written for a Ray client calls ``writer.flush()`` after each chunk
    (examples/apex_cartpole.py); with a SharedWriter that was an AttributeError. Its
    steps are committed when add returns, so flush() is a no-op that the learner's view
    confirms; on a closed writer it is refused as the writer's other calls are."""
    buf = _owner(16, 2)
    w = buf.writer([0, 1]).open()
    done = np.ones(2, bool)
    w.add(**step_values(np.arange(2), np.zeros(2), np.zeros(2), done))
    assert len(buf) == 2  # committed before any flush
    w.flush()
    w.flush(wait=False)
    assert len(buf) == 2 and w.written.tolist() == [1, 1]
    w.close()
    with pytest.raises(ConfigError, match="SharedWriter was closed"):
        w.flush()
    buf.close()


# ------------------------------------------------------- threads of one process
#: Calls on a closed writer or owner from threads: run in a child process, whose
#: segmentation fault (what these calls were) fails the test instead of the session.
_THREADS_SCRIPT = """
import sys, threading, time
import numpy as np
import replaybank as rb
from tests.shared_workers import SPEC, step_values

def values(t):
    return step_values(np.array([0, 1]), np.full(2, t), np.zeros(2), np.zeros(2, bool))

refused = 0
for run in range(20):
    buf = rb.ReplayBuffer(64, num_envs=2, seed=0, spec=SPEC, storage="shared",
                          sampler=rb.PrioritizedSampler())
    w = buf.writer([0, 1]).open()
    going, out = threading.Event(), []
    def add():
        t = 0
        try:
            while True:
                w.add(**values(t), priority=1.0)
                t += 1
                going.set()
        except rb.ConfigError as exc:
            out.append(str(exc))
            going.set()
    def sample():
        try:
            while True:
                if len(buf) > 4:
                    buf.sample(4)
        except rb.ConfigError as exc:
            out.append(str(exc))
    threads = [threading.Thread(target=add), threading.Thread(target=sample)]
    for th in threads:
        th.start()
    going.wait(10)
    time.sleep(0.001 * (run % 4))
    buf.close()  # the sampler thread's next call is refused
    w.close()  # the adding thread's call in flight returns first, its next is refused
    for th in threads:
        th.join(10)
    assert not any(th.is_alive() for th in threads)
    assert any("SharedWriter was closed" in m for m in out), out
    assert any('storage="shared" buffer was closed' in m for m in out), out
    refused += len(out)
print("ok", refused)
"""


def test_closing_a_writer_or_owner_beside_another_threads_calls_is_refused_not_a_crash(
) -> None:
    """A writer closed from one thread while another thread adds, and an owner closed
    while another thread samples: the call in flight finishes first and the next call
    of that thread raises ``ConfigError``. Both used to unmap the shared memory under
    the other thread's call: a segmentation fault in the first of 3 runs in 3 (and
    ``len(buf)`` of a closed owner crashed in one thread too)."""
    out = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT], capture_output=True,
                         text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.startswith("ok")


def _add_marked(w: Any, start: Any, errors: list[BaseException], mark: float) -> None:
    """800 steps through writer ``w`` with priority ``mark``, marked in the observation's
    episode entry (after ``start``, a barrier)."""
    start.wait()
    try:
        for t in range(800):
            w.add(**step_values(np.array([0, 1]), np.full(2, t), np.full(2, mark),
                                np.zeros(2, bool)), priority=mark)
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def test_one_writer_shared_by_two_threads_keeps_each_steps_priority() -> None:
    """Two threads adding through one writer, each with its own initial priority: every
    step reaches the learner with the priority its ``add`` gave. The priorities were
    stored before the add took the buffer's guard, in rows read from the lane counters:
    a thread's priority landed on the other thread's step (about 2% of the steps, in 10
    runs of 10)."""
    import threading

    for _ in range(3):
        buf = _owner(4096, sampler=rb.PrioritizedSampler(alpha=1.0, eps=0.0))
        w = buf.writer([0, 1]).open()
        start = threading.Barrier(2)
        errors: list[BaseException] = []
        threads = [threading.Thread(target=_add_marked, args=(w, start, errors, m))
                   for m in (1.0, 2.0)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not errors, errors
        batch = buf.sample(4000)
        # P(i) = p_i / sum p: a step of priority 2 is drawn with twice the probability
        mark = np.asarray(batch.obs)[:, 2]
        unit = np.median(batch.probabilities[mark == 1.0])
        assert np.allclose(batch.probabilities / unit, mark), \
            int((~np.isclose(batch.probabilities / unit, mark)).sum())
        w.close()
        buf.close()
