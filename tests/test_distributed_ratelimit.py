"""Rate limiting and max_times_sampled through the sharded service (real local Ray):
a blocked call waits with a timeout inside its shard and stalls nothing else."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from replaybank.errors import EmptyBufferError
from tests.distributed_ray import start, steps
from tests.stats import chi2_critical, hypergeometric_cells

ray = pytest.importorskip("ray")
from replaybank.distributed import RateLimit, RateLimitTimeout  # noqa: E402


def one_lane(t0: int, t1: int) -> dict[str, Any]:
    return {k: v[:, 0] for k, v in steps(1, t0, t1).items()}


def test_min_size_blocks_sampling_until_enough_rows(services: Any) -> None:
    svc = start(services, 1, {"capacity": 64}, rate_limit=RateLimit(min_size_to_sample=10))
    c = svc.client(max_rows=1, timeout=0.3)
    c.extend(**one_lane(0, 9))
    c.flush()
    t = time.monotonic()
    with pytest.raises(RateLimitTimeout, match="rate limiter"):
        c.sample(4)
    assert 0.25 < time.monotonic() - t < 10
    lim = svc.stats()["shards"][0]["limiter"]
    assert not lim["can_sample"] and lim["samples"] == 0 and lim["size"] == 9
    c.extend(**one_lane(9, 10))
    c.flush()
    assert c.sample(4).batch_size == 4
    lim = svc.stats()["shards"][0]["limiter"]
    assert lim["samples"] == 4 and lim["inserts"] == 10 and lim["size"] == 10


def test_blocked_insert_waits_without_stalling_the_shard(services: Any) -> None:
    limit = RateLimit(min_size_to_sample=4, samples_per_insert=1.0, error_buffer=4.0)
    svc = start(services, 1, {"capacity": 64}, rate_limit=limit)
    c = svc.client(max_rows=1, timeout=20.0)
    c.extend(**one_lane(0, 8))  # diff = 8, centre 4, max_diff 8: the next insert blocks
    c.flush()

    @ray.remote(num_cpus=0)
    def write(client: Any) -> float:
        client.extend(**one_lane(8, 9))
        client.flush()
        return time.monotonic()  # when the insert went through (one clock per machine)

    blocked = write.remote(c)
    deadline = time.monotonic() + 15
    while svc.stats()["shards"][0]["limiter"]["waiting_inserts"] == 0:
        assert time.monotonic() < deadline, "the insert never blocked"
        time.sleep(0.05)
    # the shard still answers everything else while the insert waits
    t = time.monotonic()
    assert len(c) == 8
    assert c.sample(4).batch_size == 4  # diff 8 -> 4: the centre, the insert may go
    assert time.monotonic() - t < 5
    # the insert went through only once the sample had made room (not after a fixed
    # delay: a sample takes about a millisecond, so it may be released within 50 ms)
    assert ray.get(blocked, timeout=20) > t
    assert svc.stats()["inserts"] == 9


def test_samples_per_insert_keeps_a_writer_and_a_reader_in_step(services: Any) -> None:
    limit = RateLimit(min_size_to_sample=8, samples_per_insert=2.0, error_buffer=16.0)
    svc = start(services, 2, {"capacity": 256}, num_lanes=2, rate_limit=limit)
    c = svc.client(max_rows=4, timeout=20.0)

    @ray.remote(num_cpus=0)
    def writer(client: Any) -> int:
        for t in range(0, 200, 2):
            client.extend(**steps(2, t, t + 2))
        client.close()
        return 1

    done = writer.remote(c)
    reader = svc.client("reader", timeout=3.0)
    reads = 0
    while not ray.wait([done], timeout=0)[0]:
        try:
            reads += reader.sample(8).batch_size // 8
        except RateLimitTimeout:  # only once the writer stopped: nothing more to sample
            assert ray.wait([done], timeout=0)[0]
        assert reads < 10_000
    ray.get(done, timeout=60)
    for shard in svc.stats()["shards"]:
        lim = shard["limiter"]
        # diff = 2 * inserts - samples stayed near the window [0, 32] (calls of 8 or 4)
        assert lim["min_diff"] - 8 <= lim["diff"] <= lim["max_diff"] + 8
        assert lim["inserts"] == 200
    assert svc.stats()["blocked_inserts"] > 0  # the writer had to wait for the reader


def test_max_times_sampled_retires_items(services: Any) -> None:
    cfg = {"capacity": 16, "sampler": {"type": "prioritized", "alpha": 0.0}}
    # one shard: replace=False draws are distinct per shard only (see ReplayClient.sample)
    svc = start(services, 1, cfg, num_lanes=2, max_times_sampled=1)
    c = svc.client(max_rows=1)
    c.extend(**steps(2, 0, 8))
    c.flush()
    seen: list[int] = []
    kept = None
    for _ in range(4):
        b = c.sample(4, replace=False)
        seen += b.obs[:, 0].astype(int).tolist()
        kept = b.indices
    assert len(seen) == len(set(seen)) == 16  # each item once, then never again
    with pytest.raises(EmptyBufferError):
        c.sample(1)
    assert c.update_priorities(kept, np.ones(4)) == 0  # retired: updates are dropped
    c.extend(**steps(2, 8, 9))  # new items are drawable
    c.flush()
    assert set(c.sample(16).obs[:, 0].astype(int).tolist()) == {8, 1008}


def test_clear_voids_the_clients_sends_a_limiter_holds(services: Any) -> None:
    """``clear()`` drops everything its client wrote before it, also sends the rate
    limiter holds at that moment (waiting to insert, or queued behind the waiting one):
    they are never written, not even once the clear has made room, the clear does not
    wait for them, and the client's later rows follow in order."""
    limit = RateLimit(min_size_to_sample=4, samples_per_insert=1.0, error_buffer=4.0)
    svc = start(services, 1, {"capacity": 64}, rate_limit=limit)
    c = svc.client(max_rows=1, timeout=20.0)
    c.extend(**one_lane(0, 8))  # diff = 8, centre 4, max_diff 8: the next insert blocks
    c.flush()
    c.extend(**one_lane(8, 11))  # three sends: the first waits in the limiter
    deadline = time.monotonic() + 15
    while svc.stats()["shards"][0]["limiter"]["waiting_inserts"] == 0:
        assert time.monotonic() < deadline, "the insert never blocked"
        time.sleep(0.05)
    t = time.monotonic()
    c.clear()
    assert time.monotonic() - t < 5  # not the limiter's 20 s
    time.sleep(0.5)  # the voided sends had their chance to land
    assert len(c) == 0 and svc.stats()["size"] == 0
    assert svc.stats()["shards"][0]["limiter"]["size"] == 0
    c.extend(**one_lane(20, 24))
    c.flush()
    assert len(c) == 4
    got = c.sample(4, replace=False)
    assert sorted(got.obs[:, 0].astype(int).tolist()) == [20, 21, 22, 23]


def test_writes_held_by_the_limiter_are_sent_again_exactly_once_in_order(
        services: Any) -> None:
    """A send the limiter holds past the timeout raises, and the rows stay queued: once
    the learner has sampled, a later write or ``flush()`` delivers every row once, in
    its lane's order (the sends behind the held one were in flight too)."""
    limit = RateLimit(min_size_to_sample=10, samples_per_insert=1.0, error_buffer=20.0)
    svc = start(services, 1, {"capacity": 256}, rate_limit=limit)
    writer = svc.client("writer", max_rows=8, timeout=0.5)  # 4 sends of 8 rows in flight
    learner = svc.client("learner", timeout=5.0)
    data = one_lane(0, 100)
    held = 0
    for t in range(100):
        try:
            writer.add(**{k: v[t] for k, v in data.items()})
        except RateLimitTimeout:
            held += 1
            learner.sample(8)  # room for one send: the queued rows go on the next try
    for _ in range(20):
        try:
            writer.flush()
            break
        except RateLimitTimeout:
            held += 1
            learner.sample(8)
    else:
        pytest.fail("flush() kept raising RateLimitTimeout after the learner sampled")
    assert held >= 1 and writer.pending_rows == 0
    assert svc.stats()["shards"][0]["limiter"]["inserts"] == len(learner) == 100
    everything = learner.sample(100, replace=False)  # diff = 100 - 8 * held >= centre 10
    order = np.argsort(everything.indices)
    assert np.array_equal(everything.obs[order, 0], np.arange(100))  # once each, in order


def test_replace_false_split_counts_only_the_items_a_shard_can_still_give(
        services: Any) -> None:
    """With ``max_times_sampled`` shards may not draw spares, so a distinct batch is split
    before they draw: never asking a shard for more than its undrawn items (retired ones
    have priority 0), and a batch above them all is refused naming what is left."""
    cfg = {"capacity": 16, "sampler": {"type": "prioritized", "alpha": 0.0}}
    svc = start(services, 2, cfg, num_lanes=2, max_times_sampled=1, seed=0)
    c = svc.client(max_rows=1)
    c.extend(**steps(2, 0, 8))  # 8 items on each shard
    c.flush()
    seen = c.sample(10, replace=False).obs[:, 0].astype(int).tolist()
    before = c.state_dict()
    with pytest.raises(EmptyBufferError, match=r"sample\(batch_size=7, replace=False\): the "
                       r"live shards hold 16 items .* of which 6 have a positive priority"):
        c.sample(7, replace=False)
    assert c.state_dict() == before  # the refusal drew nothing
    seen += c.sample(6, replace=False).obs[:, 0].astype(int).tolist()
    assert sorted(seen) == sorted(1000 * lane + t for lane in range(2) for t in range(8))


@pytest.mark.statistical
def test_replace_false_split_without_spares_is_hypergeometric_for_equal_priorities(
        services: Any) -> None:
    """Equal priorities (alpha 0): one buffer's distinct batch is a uniformly random
    subset, so shard 0's share of 48 of 32 + 32 items is hypergeometric."""
    cfg = {"capacity": 64, "sampler": {"type": "prioritized", "alpha": 0.0}}
    svc = start(services, 2, cfg, num_lanes=4, max_times_sampled=10**9, seed=0)
    c = svc.client(max_rows=17)
    c.extend(**steps(4, 0, 16))
    c.flush()
    from_shard0 = np.array([int((c.sample(48, replace=False).indices % 2 == 0).sum())
                            for _ in range(300)])
    cells_o, cells_e = hypergeometric_cells(from_shard0, 32, 32, 48)
    stat = float(((cells_o - cells_e) ** 2 / cells_e).sum())
    assert stat < chi2_critical(len(cells_o) - 1)
    assert from_shard0.var() < 4.5  # hypergeometric: 3.05; a multinomial split: 12
