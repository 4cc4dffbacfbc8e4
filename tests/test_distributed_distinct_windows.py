"""Distinct windows over shards: ``client.sample_sequences(B, L, replace=False)``.

One buffer holding every shard's steps draws ``B`` distinct windows by successive
sampling over its servable starts (usable, of positive priority;
``tests/test_distinct_windows.py``). The client counts each shard's servable starts in
its first trip, refuses a larger ``B`` before anything is drawn, and splits ``B`` with
the distinct-item split functions over those counts (uniform: hypergeometric;
prioritized: each shard's own successive draws merged, or without spares the depleting
split), so no shard is asked for more windows than it can serve. Checked on a real
local Ray with shards whose usable fractions and masses differ.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import EmptyBufferError
from tests.distributed_ray import start, steps
from tests.stats import chi2_critical, hypergeometric_cells, successive_inclusion
from tests.test_distinct_windows import PLAIN, L, episodes, usable

ray = pytest.importorskip("ray")

PER = {"type": "prioritized", "alpha": 0.6, "beta": 0.4, "kernel": "numpy"}


def starts(batch: Any) -> list[int]:
    """The step id (``1000 * lane + t``) of each window's first step."""
    return batch.obs[:, 0, 0].astype(np.int64).tolist()


def uneven(services: list[Any], sampler: Any) -> Any:
    """Lane 0 (shard 0): 8 steps of priority 10; lane 1 (shard 1): 30 of priority 1.
    Windows of 3: 6 + 28 servable starts; by mass shard 0 has 80 of 110."""
    cfg: dict[str, Any] = {"capacity": 64, "seed": 0}
    if sampler is not None:
        cfg["sampler"] = sampler
    svc = start(services, 2, cfg, num_lanes=2, seed=1)
    client = svc.client(max_rows=7)
    for lane, n, p in ((0, 8, 10.0), (1, 30, 1.0)):
        data = steps(1, 0, n)
        data["obs"][..., 0] += 1000 * lane  # step ids 1000 * lane + t
        data["next_obs"][..., 0] += 1000 * lane
        kw = {} if sampler is None else {"priority": np.full((n, 1), p)}
        client.extend(**data, env_ids=[lane], **kw)
    client.flush()
    return client


def filled(services: list[Any], sampler: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
    """A 2-shard service and one buffer with ``episodes()`` (lane 0, shard 0: 10 usable
    starts of 30 steps; lane 1, shard 1: 28) and the same priorities."""
    cfg: dict[str, Any] = {"capacity": 64, "seed": 0}
    if sampler is not None:
        cfg["sampler"] = sampler
    svc = start(services, 2, cfg, num_lanes=2, seed=1, **kwargs)
    single = rb.from_config({**cfg, "num_envs": 2})
    kw = {} if sampler is None else \
        {"priority": np.random.default_rng(2).uniform(0.2, 4.0, (30, 2))}
    client = svc.client(max_rows=7)
    client.extend(**episodes(), **kw)
    single.extend(**episodes(), **kw)
    client.flush()
    return svc, client, single


@pytest.mark.parametrize("sampler", [None, PLAIN], ids=["uniform", "per"])
def test_uneven_shards_serve_every_batch_one_buffer_serves(services: Any,
                                                           sampler: Any) -> None:
    """The old split (by steps, or a multinomial by mass) asked shard 0 for more
    windows than its 6 servable starts: with PER 94% of B=10 calls and every B>=20 call
    raised, naming the shard's share as batch_size; uniform batches repeated windows."""
    client = uneven(services, sampler)
    servable = {i for i in range(6)} | {1000 + t for t in range(28)}
    for b in (4, 10, 20, 33):
        for _ in range(10):
            got = starts(client.sample_sequences(b, L, replace=False))
            assert len(set(got)) == b and set(got) <= servable
    every = client.sample_sequences(34, L, replace=False)
    assert set(starts(every)) == servable and bool(every.mask.all())


@pytest.mark.statistical
def test_uniform_split_is_hypergeometric_over_usable_starts(services: Any) -> None:
    """12 windows of 10 + 28 usable starts: shard 0's share is hypergeometric as one
    buffer's (the old split by steps, 30 + 30, gave it 6 on average, not 3.2)."""
    _, client, _ = filled(services, None)
    from_shard0 = []
    for _ in range(300):
        got = starts(client.sample_sequences(12, L, replace=False))
        assert len(set(got)) == 12 and all(usable(i) for i in got)
        from_shard0.append(sum(i < 1000 for i in got))
    cells_o, cells_e = hypergeometric_cells(from_shard0, 10, 28, 12)
    stat = float(((cells_o - cells_e) ** 2 / cells_e).sum())
    assert stat < chi2_critical(len(cells_o) - 1)


@pytest.mark.statistical
def test_prioritized_windows_are_one_buffers_successive_sampling(services: Any) -> None:
    """How often each usable start is left out of 30 distinct windows of 38 matches a
    Gumbel top-k simulation over the usable starts' priorities (one buffer's law, not
    equal odds); probabilities and weights are one buffer's single-draw ones."""
    _, client, single = filled(services, PER)
    ref = single.sample_sequences(4000, L, beta=0.7)
    prob = dict(zip(starts(ref), ref.probabilities.tolist(), strict=True))
    weight = dict(zip(starts(ref), ref.weights.tolist(), strict=True))
    keys = sorted(prob)
    assert len(keys) == 38 and all(usable(i) for i in keys)
    p_out = 1.0 - successive_inclusion(np.array([prob[i] for i in keys]), 30)
    calls = 300
    out = dict.fromkeys(keys, 0)
    paths = client.draw_paths["two_trips"]
    for _ in range(calls):
        b = client.sample_sequences(30, L, replace=False, beta=0.7)
        got = starts(b)
        assert len(set(got)) == 30
        np.testing.assert_allclose(b.probabilities, [prob[i] for i in got], rtol=1e-12)
        np.testing.assert_allclose(b.weights, [weight[i] for i in got], rtol=1e-6)
        for i in set(out) - set(got):
            out[i] += 1
    observed = np.array([out[i] for i in keys], float)
    stat = float(((observed - p_out * calls) ** 2 / (p_out * calls)).sum())
    assert stat < chi2_critical(len(keys) - 1)
    flat = np.full(len(keys), 8 / 38 * calls)
    assert float(((observed - flat) ** 2 / flat).sum()) > chi2_critical(len(keys) - 1)
    assert client.draw_paths["two_trips"] == paths + calls


@pytest.mark.parametrize("sampler", [None, PER], ids=["uniform", "per"])
def test_too_large_batch_is_refused_before_anything_changes(services: Any,
                                                            sampler: Any) -> None:
    """B above every shard's servable starts together names the call's batch_size, the
    total and the fixes, and changes nothing: a twin service sampled without the refused
    call gives the same next batches."""
    svc, client, _ = filled(services, sampler)
    _, twin, _ = filled(services, sampler)
    before = (client.state_dict(), svc.stats()["samples"])
    prio = "" if sampler is None else " with a positive priority"
    with pytest.raises(EmptyBufferError, match=(
            r"sample_sequences\(batch_size=39, sequence_length=3, replace=False\): the live "
            r"shards hold 60 items \(sizes \[30, 30\]\), of which 38 start a usable window"
            rf"{prio} \(per shard \[10, 28\]; .*lower batch_size to at most 38 or use "
            r"replace=True, or shorten sequence_length/burn_in")):
        client.sample_sequences(39, L, replace=False)
    assert (client.state_dict(), svc.stats()["samples"]) == before
    for replace in (False, True):
        assert starts(client.sample_sequences(20, L, replace=replace)) == \
            starts(twin.sample_sequences(20, L, replace=replace))


def test_without_spares_windows_are_split_by_what_each_shard_can_still_serve(
        services: Any) -> None:
    """``max_times_sampled=1`` (no spare draws: the split comes first, by the shards'
    servable starts depleted as they are taken): 30 then 8 distinct windows take every
    usable start once, and a 9th window past them is refused naming the 8 left."""
    cfg = {**PER, "alpha": 0.0}
    _, client, _ = filled(services, cfg, max_times_sampled=1)
    seen = starts(client.sample_sequences(30, L, replace=False))
    before = client.state_dict()
    with pytest.raises(EmptyBufferError, match=r"sample_sequences\(batch_size=9, "
                       r"sequence_length=3, replace=False\): .* of which 8 start a usable "
                       r"window with a positive priority"):
        client.sample_sequences(9, L, replace=False)
    assert client.state_dict() == before
    seen += starts(client.sample_sequences(8, L, replace=False))
    assert sorted(seen) == sorted(i for lane in range(2) for t in range(30)
                                  if usable(i := 1000 * lane + t))
    assert client.draw_paths["two_trips"] == 2
