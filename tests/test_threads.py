"""Threads: one thread adding while others sample and update priorities never returns a
transition mixed from two steps (every field of a step encodes the step's number)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.multiagent import MultiAgentReplayBuffer

SECONDS = 1.5
MAX_SECONDS = 30.0  # a run that has not done its share by then fails its count
EP_LEN = 7


def _step(lanes: int, t: int) -> dict[str, Any]:
    """Step ``t`` of every lane: obs = (lane, t, first), next_obs = (lane, t + 1, 0),
    action = t, reward = t, an episode end every EP_LEN steps (the reset observation
    after it differs from the final one in its third entry)."""
    lane = np.arange(lanes, dtype=np.float64)
    first = np.full(lanes, float(t % EP_LEN == 0))
    obs = np.stack([lane, np.full(lanes, t, np.float64), first], axis=-1)
    nxt = np.stack([lane, np.full(lanes, t + 1, np.float64), np.zeros(lanes)], axis=-1)
    end = np.full(lanes, t % EP_LEN == EP_LEN - 1)
    if lanes == 1:
        return {"obs": obs[0], "next_obs": nxt[0], "action": t, "reward": float(t),
                "terminated": bool(end[0]), "truncated": False}
    return {"obs": obs, "next_obs": nxt, "action": np.full(lanes, t),
            "reward": np.full(lanes, float(t)), "terminated": end,
            "truncated": np.zeros(lanes, bool)}


def _bad_transitions(batch: Any) -> int:
    t = batch.obs[:, 1]
    ok = (batch.next_obs[:, 1] == t + 1) & (batch.next_obs[:, 0] == batch.obs[:, 0]) \
        & (batch.action == t) & (batch.reward == t)
    return int((~ok).sum())


def _run(workers: list[Callable[[threading.Event], None]], seconds: float,
         enough: Callable[[], bool] = lambda: True) -> list[BaseException]:
    """Run ``workers`` (the first on this thread) for ``seconds``, and on until
    ``enough()`` (every worker has done its share: on a loaded machine a thread may get
    few turns in ``seconds``), at most ``MAX_SECONDS``."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def guarded(fn: Callable[[threading.Event], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn(stop)
            except BaseException as exc:  # reported by the test
                errors.append(exc)
                stop.set()
        return run

    threads = [threading.Thread(target=guarded(w), daemon=True) for w in workers[1:]]
    for th in threads:
        th.start()
    def watch() -> None:
        start = time.monotonic()
        while not stop.wait(0.05):
            took = time.monotonic() - start
            if (took >= seconds and enough()) or took >= MAX_SECONDS:
                stop.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    guarded(workers[0])()  # the first worker runs on this (the buffer's own) thread
    for th in threads:
        th.join(10)
    stop.set()
    watcher.join(10)
    assert not any(th.is_alive() for th in threads), "a worker hung"
    return errors


def _writer(buf: Any, lanes: int, warm: int) -> Callable[[threading.Event], None]:
    def write(stop: threading.Event) -> None:
        t = warm
        while not stop.is_set():
            buf.add(**_step(lanes, t))
            t += 1
            if t % 50 == 0:  # chunks too: extend takes the same guard
                chunk = [_step(lanes, t + i) for i in range(5)]
                buf.extend(**{k: np.stack([np.asarray(c[k]) for c in chunk])
                              for k in chunk[0]})
                t += 5
    return write


@pytest.mark.parametrize("case", ["uniform", "lanes", "per", "nstep_per"])
def test_writer_sampler_updater_threads_never_mix_steps(case: str) -> None:
    lanes = 3 if case == "lanes" else 1
    if case == "per":
        buf: Any = rb.PrioritizedReplayBuffer(256, seed=0)
    elif case == "nstep_per":
        buf = rb.PrioritizedReplayBuffer(256, n_step=1, seed=0)
    else:
        buf = rb.ReplayBuffer(255 if lanes == 3 else 256, num_envs=lanes, seed=0)
    warm = 300  # the ring has wrapped: every add overwrites a step a sampler may draw
    for t in range(warm):
        buf.add(**_step(lanes, t))
    buf.sample(32)  # compile what the first sample compiles before the clock runs
    bad, samples, updates = [0], [0], [0]

    def sampler(stop: threading.Event) -> None:
        while not stop.is_set():
            batch = buf.sample(32)
            bad[0] += _bad_transitions(batch)
            samples[0] += 1

    def updater(stop: threading.Event) -> None:
        rng = np.random.default_rng(1)
        while not stop.is_set():
            batch = buf.sample(16)
            buf.update_priorities(batch.indices, rng.random(16) + 0.01)
            updates[0] += 1

    workers = [_writer(buf, lanes, warm), sampler]
    if isinstance(buf.sampler, rb.PrioritySampler):
        workers.append(updater)
    priority = isinstance(buf.sampler, rb.PrioritySampler)
    errors = _run(workers, SECONDS, lambda: samples[0] > 20 and (updates[0] > 5 or not priority))
    assert not errors, errors
    assert samples[0] > 20, "the sampler hardly ran"
    assert bad[0] == 0, f"{bad[0]} mixed transitions in {samples[0]} batches"
    if isinstance(buf.sampler, rb.PrioritySampler):
        assert updates[0] > 5
        # the tree is still a sum tree: probabilities of one batch add up as drawn
        batch = buf.sample(64)
        assert np.all(batch.probabilities > 0) and np.all(np.isfinite(batch.weights))


def test_sequences_from_another_thread_are_contiguous() -> None:
    buf = rb.ReplayBuffer(512, seed=0)
    for t in range(600):
        buf.add(**_step(1, t))
    bad, n = [0], [0]

    def sampler(stop: threading.Event) -> None:
        while not stop.is_set():
            seq = buf.sample_sequences(8, 4)
            t = seq.obs[:, :, 1]
            bad[0] += int((np.diff(t, axis=1) != 1).sum())
            bad[0] += int((seq.action != t).sum())
            n[0] += 1

    errors = _run([_writer(buf, 1, 600), sampler], SECONDS, lambda: n[0] > 10)
    assert not errors, errors
    assert n[0] > 10 and bad[0] == 0


def test_two_threads_that_did_not_build_the_buffer() -> None:
    """Neither thread is the owner: both take the lock from their first call."""
    buf = rb.ReplayBuffer(128, seed=0)
    bad = [0]

    def writer(stop: threading.Event) -> None:
        _writer(buf, 1, 0)(stop)

    def sampler(stop: threading.Event) -> None:
        while not stop.is_set():
            if len(buf) > 8:
                bad[0] += _bad_transitions(buf.sample(16))
            else:
                time.sleep(0.001)

    stop = threading.Event()
    threads = [threading.Thread(target=w, args=(stop,)) for w in (writer, sampler)]
    for th in threads:
        th.start()
    time.sleep(1.0)
    deadline = time.monotonic() + MAX_SECONDS  # (a loaded machine: the writer's turns)
    while len(buf) < 128 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    for th in threads:
        th.join(10)
    assert len(buf) == 128 and bad[0] == 0


# ------------------------------------------- the lock switch while the owner is mid-call
HOLD = 0.5  # seconds the owner's call waits inside for the second thread's call to finish


def _goal_step(t: int) -> dict[str, Any]:
    """Step ``t`` of a goal env whose episodes last 4 steps (every one ends)."""
    o = {"observation": np.full(2, t, np.float32), "achieved_goal": np.full(1, t, np.float32),
         "desired_goal": np.full(1, -1.0, np.float32)}
    n = {"observation": np.full(2, t + 1, np.float32),
         "achieved_goal": np.full(1, t + 1, np.float32),
         "desired_goal": np.full(1, -1.0, np.float32)}
    return {"obs": o, "next_obs": n, "action": t, "reward": 0.0,
            "terminated": t % 4 == 3, "truncated": False}


class _Holder:
    """A HER reward function that holds the owner thread inside its first ``sample`` call
    (up to ``HOLD`` seconds) until the second thread's call returns, and records every
    moment two threads' calls ran at once."""

    def __init__(self) -> None:
        self.owner = threading.get_ident()
        self.inside = threading.Event()  # the owner's call is under way
        self.done = threading.Event()  # the second thread's call returned
        self.done_while_held = False
        self.active: set[int] = set()
        self.overlaps = 0

    def __call__(self, achieved: Any, desired: Any, info: Any) -> Any:
        me = threading.get_ident()
        self.overlaps += bool(self.active)
        self.active.add(me)
        try:
            if me == self.owner and not self.inside.is_set():
                self.inside.set()
                self.done_while_held = self.done.wait(HOLD)
            return -np.abs(achieved - desired)[..., 0]
        finally:
            self.active.discard(me)


@pytest.mark.parametrize("writer", ["compiled", "python"])
@pytest.mark.parametrize("call", ["sample", "add"])
def test_a_second_threads_first_call_waits_for_the_owners_call_in_flight(
        call: str, writer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first call of a second thread switches the guard to its lock and must wait
    for the call the owner thread has in flight. It used to raise and lower the owner's
    ``busy`` flag itself (``enter``, and the Python direct write's own check), so the
    switch found the owner idle and both calls ran at once: in a probe where the owner
    sampled in a loop, 183 switches in 200 overlapped a call of the owner."""
    if writer == "python":  # the Python direct write (where no C compiler built _lane)
        from replaybank.storage.writers.compiled import CompiledWriter

        monkeypatch.setattr(CompiledWriter, "of", classmethod(lambda cls, t, guard=None: None))
    hold = _Holder()
    buf = rb.HerReplayBuffer(64, reward_fn=hold, strategy="final", k=4, seed=0,
                             autoreset_mode="same_step")
    for t in range(16):
        buf.add(**_goal_step(t))
    errors: list[BaseException] = []

    def second() -> None:
        try:
            hold.inside.wait(10)
            if call == "sample":
                buf.sample(8)
            else:
                buf.add(**_goal_step(16))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            hold.done.set()

    th = threading.Thread(target=second)
    th.start()
    buf.sample(8)  # the owner's call: holds inside until the second call returns
    th.join(10)
    assert not errors, errors
    assert not hold.done_while_held, f"the second thread's {call} ran inside the owner's sample"
    assert hold.overlaps == 0
    assert len(buf) == (16 if call == "sample" else 17)


def test_calls_inside_exclusive_keep_other_threads_out(tmp_path: Any) -> None:
    """A call made inside ``with buf.exclusive():`` is part of that section: the owner's
    ``sample`` in it used to lower the guard's ``busy`` flag on return, letting a second
    thread's first call in while the section still ran; once the guard is shared, any
    call inside the section waited for the lock the section holds (a deadlock)."""
    buf = rb.ReplayBuffer(64, seed=0)
    for t in range(20):
        buf.add(**_step(1, t))
    done = threading.Event()
    second = threading.Thread(target=lambda: (buf.sample(4), done.set()))
    with buf.exclusive():
        buf.sample(4)
        second.start()
        assert not done.wait(0.3), "another thread's call ran inside the owner's section"
    second.join(10)
    assert done.is_set()
    # the guard is shared now: a thread's section and the calls inside it
    inner = threading.Event()

    def section() -> None:
        with buf.exclusive():
            buf.sample(4)
            buf.add(**_step(1, 20))
            buf.state_dict()
            rb.save(buf, tmp_path)
        inner.set()

    th = threading.Thread(target=section, daemon=True)
    th.start()
    assert inner.wait(5), "a call inside exclusive() waited for its own section's lock"
    assert len(buf) == 21


class _PausingSampler(rb.UniformSampler):
    """A uniform sampler whose ``state_dict`` (asked for by the buffer's, before the
    table is copied) waits up to ``HOLD`` seconds, when another thread asks, for the
    owner thread to add a step."""

    def __init__(self) -> None:
        super().__init__()
        self.owner = threading.get_ident()
        self.asked = threading.Event()
        self.added = threading.Event()

    def state_dict(self) -> dict[str, Any]:
        if threading.get_ident() != self.owner:
            self.asked.set()
            self.added.wait(HOLD)
        return super().state_dict()


def test_state_dict_from_another_thread_is_one_snapshot() -> None:
    """``state_dict()`` is a snapshot even while the owner thread adds: the call holds
    the buffer's guard, as ``rb.save`` does. Unguarded, an add landed between the parts
    it copies: in a probe (a writer thread, a thread calling ``state_dict()`` and loading
    it into a fresh buffer) 3 runs in 3 of a PER buffer got states that did not load
    (``CheckpointError``: links or free side slots damaged) or held steps mixed from two
    adds; here the metadata counts 20 steps and the table 21."""
    sampler = _PausingSampler()
    buf = rb.ReplayBuffer(64, seed=0, sampler=sampler)
    for t in range(20):
        buf.add(**_step(1, t))
    got: list[dict[str, Any]] = []
    th = threading.Thread(target=lambda: got.append(buf.state_dict()))
    th.start()
    assert sampler.asked.wait(10)
    buf.add(**_step(1, 20))  # waits for the state_dict call to return
    sampler.added.set()
    th.join(10)
    state = got[0]
    assert state["metadata"]["size"] == int(state["table"]["meta/counts"].sum()) == 20
    fresh = rb.ReplayBuffer(64, seed=0)
    fresh.load_state_dict(state)
    assert len(fresh) == 20 and len(buf) == 21
    assert _bad_transitions(fresh.sample(64)) == 0


def test_a_view_swapped_from_another_thread_waits_for_the_call_in_flight() -> None:
    """``buf.view = ...`` is a call like the others (as ``buf.sampler = ...`` was): set
    from another thread, it waits for the owner's sample in flight, which serves its
    batch with the view it started with. It used to swap the view (and drop the writer)
    in the middle of that call."""
    hold = _Holder()
    buf = rb.HerReplayBuffer(64, reward_fn=hold, strategy="final", k=4, seed=0,
                             autoreset_mode="same_step")
    for t in range(16):
        buf.add(**_goal_step(t))
    her = buf.view
    plain = rb.TransitionView()

    def swap() -> None:
        hold.inside.wait(10)
        buf.view = plain
        hold.done.set()

    th = threading.Thread(target=swap)
    th.start()
    batch = buf.sample(8)
    th.join(10)
    assert not hold.done_while_held, "the view changed inside the owner's sample"
    assert "relabeled" in batch and buf.view is plain and her is not plain
    assert "relabeled" not in buf.sample(8)


class _PausingWriteSampler(rb.UniformSampler):
    """A uniform sampler whose ``on_write`` (heard inside the core's write), once armed,
    tells another thread the owner's add is under way and gives it ``PAUSE`` seconds."""

    PAUSE = 0.3

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.writing = threading.Event()

    def on_write(self, *args: Any, **kwargs: Any) -> Any:
        out = super().on_write(*args, **kwargs)
        if self.armed:
            self.armed = False
            self.writing.set()
            time.sleep(self.PAUSE)
        return out


def _joint_step(t: int, acting: tuple[str, ...], b_ends: bool) -> dict[str, Any]:
    return {"obs": {k: np.full(2, t, np.float32) for k in acting},
            "action": {k: 0 for k in acting}, "reward": {k: 1.0 for k in acting},
            "next_obs": {k: np.full(2, t + 1, np.float32) for k in acting},
            "terminated": {k: k == "b" and b_ends for k in acting},
            "truncated": {k: False for k in acting}}


def test_multiagent_state_dict_from_another_thread_is_one_snapshot() -> None:
    """A multi-agent ``state_dict()`` from another thread holds the owner's add off as
    a whole: the core's step and the episode bookkeeping of that step (which agents are
    alive or ended, the placeholder observations) come from the same moment. It read
    the bookkeeping before it took the core's guard, and the add recorded it after the
    core's write: in a probe (a writer, two samplers, a thread calling ``state_dict()``)
    48 of 132 states held a core step without its bookkeeping (20 of 40 with PER), and
    14 of 133 taken inside ``exclusive()`` as ``rb.save`` takes them. Here the state held
    the step where ``b`` terminated but said ``b`` was alive: a buffer loaded from it let
    ``b`` act again in the same episode."""
    sampler = _PausingWriteSampler()
    buf = MultiAgentReplayBuffer(32, ["a", "b"], seed=0, sampler=sampler)
    for t in range(3):
        buf.add(**_joint_step(t, ("a", "b"), False))
    got: list[dict[str, Any]] = []

    def take() -> None:
        assert sampler.writing.wait(10)
        got.append(buf.state_dict())

    th = threading.Thread(target=take)
    th.start()
    sampler.armed = True
    buf.add(**_joint_step(3, ("a", "b"), True))  # b terminates; a runs on
    th.join(10)
    state = got[0]
    want = buf.state_dict()
    assert state["multiagent"]["ended"].tolist() == want["multiagent"]["ended"].tolist() \
        == [[False], [True]]
    fresh = MultiAgentReplayBuffer(32, ["a", "b"], seed=0)
    fresh.load_state_dict(state)
    assert len(fresh) == 4
    with pytest.raises(rb.errors.ArgumentError):
        fresh.add(**_joint_step(4, ("a", "b"), False))  # b ended in this episode
    assert len(fresh) == 4


# ------------------------------------------------ rollout buffers: one thread at a time
def _rollout_step(v: float) -> dict[str, Any]:
    return {"obs": np.full(2, v, np.float32), "action": 0, "reward": 1.0,
            "terminated": False, "truncated": False, "value": 0.0, "log_prob": 0.0}


def _ma_step(v: float) -> dict[str, Any]:
    def both(x: Any) -> dict[str, Any]:
        return {"a": x, "b": x}
    return {"obs": both(np.full(2, v, np.float32)), "action": both(0), "reward": both(1.0),
            "terminated": both(False), "truncated": both(False), "value": both(0.0),
            "log_prob": both(0.0)}


def _call_from_thread(fn: Callable[[], Any], name: str) -> list[BaseException]:
    """Run ``fn`` in a thread named ``name`` (now, to its end); what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # reported by the test
            raised.append(exc)

    th = threading.Thread(target=run, name=name)
    th.start()
    th.join(10)
    return raised


@pytest.mark.parametrize("kind", ["rollout", "multiagent"])
def test_a_rollout_buffer_refuses_a_call_while_another_threads_call_runs(kind: str) -> None:
    """A rollout buffer serves one thread at a time: a collector thread's ``add`` made
    while the learner's ``compute_returns_and_advantage`` runs (here: inside its
    ``value_fn``) raises ``ConcurrentCallError`` naming both calls, both threads and the
    fix, and changes nothing. It used to write: in a probe of two threads adding 1,000
    steps each, 16 runs in 20 of a ``RolloutBuffer(2000)`` lost steps (19 in 20 of a
    ``MultiAgentRolloutBuffer``, whose first adds raised ``KeyError``)."""
    from replaybank.multiagent import MultiAgentRolloutBuffer

    buf: Any
    if kind == "rollout":
        buf = rb.RolloutBuffer(4, seed=0)
        step = _rollout_step
        buf.add(**{**step(0), "truncated": True}, final_obs=np.full(2, 9, np.float32))
        last: Any = 0.0
    else:
        buf = MultiAgentRolloutBuffer(4, ["a", "b"], seed=0)
        step = _ma_step
        first = step(0)
        buf.add(**{**first, "truncated": {"a": True, "b": False}},
                final_obs={"a": np.full(2, 9, np.float32)})
        last = {"a": 0.0, "b": 0.0}
    buf.add(**step(1))
    before = {k: v.copy() for k, v in buf.data.items()}
    raised: list[BaseException] = []

    def value_fn(obs: Any, *state: Any) -> Any:  # runs inside the learner's call
        raised.extend(_call_from_thread(lambda: buf.add(**step(2)), "collector"))
        k = len(obs) if kind == "rollout" else len(obs["a"])
        return np.zeros(k) if kind == "rollout" else {"a": np.zeros(k)}

    buf.compute_returns_and_advantage(last, value_fn=value_fn)
    assert len(raised) == 1 and isinstance(raised[0], rb.ConcurrentCallError), raised
    msg = str(raised[0])
    assert "add()" in msg and "compute_returns_and_advantage()" in msg, msg
    assert "'collector'" in msg and "'MainThread'" in msg and "one thread at a time" in msg
    assert buf.pos == 2 and all(np.array_equal(before[k], v) for k, v in buf.data.items())
    # handed to another thread between calls: allowed
    assert not _call_from_thread(lambda: buf.add(**step(2)), "collector")
    assert buf.pos == 3


def _two_adders(buf: Any, step: Callable[[float], dict[str, Any]], n: int
                ) -> tuple[list[float], list[BaseException]]:
    """Two threads add steps ``1..n`` and ``-1..-n`` to ``buf`` at once, going on after a
    refused add: the values whose add returned, and any other error."""
    stored: list[float] = []
    other: list[BaseException] = []
    start = threading.Barrier(2)

    def adder(sign: int) -> None:
        start.wait()
        for k in range(1, n + 1):
            try:
                buf.add(**step(sign * k))
                stored.append(sign * k)
            except rb.ConcurrentCallError:
                pass
            except BaseException as exc:  # reported by the test
                other.append(exc)

    threads = [threading.Thread(target=adder, args=(s,)) for s in (1, -1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    return stored, other


@pytest.mark.parametrize("kind", ["rollout", "multiagent"])
def test_two_threads_adding_to_a_rollout_buffer_store_exactly_the_adds_that_returned(
        kind: str) -> None:
    """Two threads add to one rollout buffer at once and go on after a refused add: the
    buffer holds exactly the steps whose ``add`` returned, each whole (unchecked, adds of
    the two threads interleaved inside one another: lost steps, rows of two steps)."""
    from replaybank.multiagent import MultiAgentRolloutBuffer

    n = 600
    for run in range(4):
        buf: Any = rb.RolloutBuffer(2 * n, seed=0) if kind == "rollout" \
            else MultiAgentRolloutBuffer(2 * n, ["a", "b"], seed=0)
        stored, other = _two_adders(buf, _rollout_step if kind == "rollout" else _ma_step, n)
        assert not other, other
        if kind == "rollout":
            got = buf.data["obs"][:, 0, 0]
        else:
            got = buf.data["obs/a"][:, 0, 0]
            assert np.array_equal(got, buf.data["obs/b"][:, 0, 0]), f"run {run}: torn rows"
        assert buf.pos == len(stored), f"run {run}: {len(stored)} adds returned"
        assert sorted(got.tolist()) == sorted(stored), f"run {run}: steps lost"


class _ObsHook:
    """An observation whose first conversion (inside ``store``) runs ``hook`` first."""

    def __init__(self, hook: Callable[[], None]) -> None:
        self.hook: Callable[[], None] | None = hook

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return np.zeros(2, dtype or np.float64)


def test_a_path_buffer_refuses_a_call_while_another_threads_call_runs() -> None:
    """``PathBuffer`` serves one thread at a time, as its ``RolloutBuffer`` does: a
    learner thread's ``finish_path`` made while the collector's ``store`` runs raises
    ``ConcurrentCallError`` naming both calls and both threads, and moves no pointer.
    It used to run (only the inner ``RolloutBuffer`` calls were checked): here it closed
    the path under the ``store``; in a probe of a collector storing 3,000 steps while a
    learner called ``get``, 3 runs in 5 lost 58-125 steps and left ``path_start`` past
    the pointer."""
    buf = rb.PathBuffer(8, gamma=0.9)
    buf.store(np.ones(2), 0, 1.0, 0.0, 0.0)
    raised: list[BaseException] = []
    hook = _ObsHook(lambda: raised.extend(
        _call_from_thread(lambda: buf.finish_path(0.0), "learner")))
    buf.store(hook, 0, 1.0, 0.0, 0.0)
    assert len(raised) == 1 and isinstance(raised[0], rb.ConcurrentCallError), raised
    msg = str(raised[0])
    assert "PathBuffer.finish_path()" in msg and "store()" in msg, msg
    assert "'learner'" in msg and "'MainThread'" in msg and "one thread at a time" in msg
    assert (buf.ptr, buf.path_start) == (2, 0)
    assert "finished" in msg and "get()" in msg, msg  # the fix speaks of paths
    # inside exclusive() (what rb.save holds) another thread's store is refused too
    with buf.exclusive():
        raised.extend(_call_from_thread(
            lambda: buf.store(np.ones(2), 0, 1.0, 0.0, 0.0), "collector"))
    assert isinstance(raised[1], rb.ConcurrentCallError) and buf.ptr == 2
    # handed to another thread between calls: allowed
    assert not _call_from_thread(lambda: buf.finish_path(0.0), "learner")
    assert buf.path_start == 2 and len(buf.get().obs) == 2


@pytest.mark.parametrize("kind", ["rollout", "multiagent"])
@pytest.mark.parametrize("call", ["reset", "add"])
def test_another_threads_change_between_batches_stops_the_generator(kind: str,
                                                                    call: str) -> None:
    """Between two batches of a running minibatch generator the buffer is free, so
    another thread's ``reset`` or ``add`` runs; the generator's next ``next()`` then
    raises ``BufferChangedError`` instead of yielding steps of another rollout beside the
    old advantages (it used to go on: only each ``next()`` was one call)."""
    from replaybank.multiagent import MultiAgentRolloutBuffer

    buf: Any
    if kind == "rollout":
        buf, step, last = rb.RolloutBuffer(8, seed=0), _rollout_step, 0.0
        batches = lambda: buf.generate_batches(mini_batch_size=2)  # noqa: E731
    else:
        buf, step = MultiAgentRolloutBuffer(8, ["a", "b"], seed=0), _ma_step
        last = {"a": 0.0, "b": 0.0}
        batches = lambda: buf.get(2)  # noqa: E731
    for t in range(6):
        buf.add(**step(t))
    buf.compute_returns_and_advantage(last)
    gen = batches()
    next(gen)
    change = buf.reset if call == "reset" else lambda: buf.add(**step(100))
    assert not _call_from_thread(change, "collector")
    with pytest.raises(rb.BufferChangedError, match="the rollout changed after"):
        next(gen)
