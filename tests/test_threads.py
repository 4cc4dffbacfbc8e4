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

SECONDS = 1.5
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


def _run(workers: list[Callable[[threading.Event], None]], seconds: float) -> list[BaseException]:
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
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    guarded(workers[0])()  # the first worker runs on this (the buffer's own) thread
    for th in threads:
        th.join(10)
    timer.cancel()
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
    errors = _run(workers, SECONDS)
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

    errors = _run([_writer(buf, 1, 600), sampler], SECONDS)
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
    stop.set()
    for th in threads:
        th.join(10)
    assert len(buf) == 128 and bad[0] == 0
