"""The sharded replay service on a real local Ray: global sampling against one buffer,
weights, stale updates, lanes, pickled clients, concurrent use, checkpoints."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import CheckpointError, ConfigError, ShapeError
from tests.distributed_ray import SHARD_CPUS, start, steps
from tests.stats import chi2_critical, hypergeometric_cells

ray = pytest.importorskip("ray")
from replaybank.distributed import ReplayService  # noqa: E402

PER = {"type": "prioritized", "alpha": 0.6, "beta": 0.4, "kernel": "numpy"}


def ids(batch: Any) -> np.ndarray:
    return batch.obs[:, 0].astype(np.int64)


def chi2_pvalue_ok(observed: np.ndarray, expected: np.ndarray) -> bool:
    """Goodness of fit at the 0.1% level (scipy when installed, else Wilson-Hilferty)."""
    stat = float(((observed - expected) ** 2 / expected).sum())
    df = len(observed) - 1
    try:
        from scipy import stats
    except ImportError:  # pragma: no cover
        return stat < chi2_critical(df)
    return float(stats.chi2.sf(stat, df)) > 1e-3


def filled(services: list[ReplayService], sampler: Any, weight_norm: str = "buffer",
           seed: int = 0) -> tuple[ReplayService, Any, Any]:
    """A 2-shard service and one buffer with the same 64 steps (4 lanes) and priorities."""
    cfg: dict[str, Any] = {"capacity": 64, "seed": seed}
    if sampler is not None:
        cfg["sampler"] = {**sampler, "weight_norm": weight_norm}
    svc = start(services, 2, cfg, num_lanes=4, seed=seed)
    single = rb.from_config({**cfg, "capacity": 128, "num_envs": 4})
    data = steps(4, 0, 16)
    prio = np.random.default_rng(seed).uniform(0.1, 5.0, (16, 4))
    client = svc.client(max_rows=17)
    if sampler is None:
        client.extend(**data)
        single.extend(**data)
    else:
        client.extend(**data, priority=prio)
        single.extend(**data, priority=prio)
    client.flush()
    return svc, client, single


@pytest.mark.statistical
@pytest.mark.parametrize("sampler", [PER, None], ids=["per", "uniform"])
def test_sampled_distribution_matches_one_buffer(services: Any, sampler: Any) -> None:
    _, client, single = filled(services, sampler)
    assert len(client) == len(single) == 64
    ref = single.sample(20_000)
    if sampler is None:
        probs = {i: 1 / 64 for i in ids(ref).tolist()}
    else:
        probs = dict(zip(ids(ref).tolist(), ref.probabilities.tolist(), strict=True))
    assert len(probs) == 64
    counts: dict[int, int] = dict.fromkeys(probs, 0)
    draws = 0
    for _ in range(120):
        b = client.sample(256)
        assert b.batch_size == 256
        for i in ids(b).tolist():
            counts[i] += 1
        draws += 256
    keys = sorted(probs)
    observed = np.array([counts[k] for k in keys], float)
    expected = np.array([probs[k] for k in keys]) * draws
    assert math.isclose(expected.sum(), draws, rel_tol=1e-9)
    assert chi2_pvalue_ok(observed, expected)
    # and the same test fails for a clearly different law (the test has power)
    skewed = expected * np.linspace(0.7, 1.3, len(expected))
    assert not chi2_pvalue_ok(observed, skewed * draws / skewed.sum())


@pytest.mark.parametrize("norm", ["buffer", "batch", None])
def test_weights_and_probabilities_are_one_buffers(services: Any, norm: Any) -> None:
    _, client, single = filled(services, PER, weight_norm=norm)
    ref = single.sample(20_000, beta=0.7)
    prob = dict(zip(ids(ref).tolist(), ref.probabilities.tolist(), strict=True))
    p = single.sampler.priorities(np.arange(128))  # stored priorities, by slot
    for _ in range(5):
        b = client.sample(64, beta=0.7)
        got = ids(b)
        np.testing.assert_allclose(b.probabilities, [prob[i] for i in got.tolist()],
                                   rtol=1e-12)
        # the single buffer's formula with its own total, size and minimum
        mine = np.array([prob[i] for i in got.tolist()]) * p.sum()
        want = rb.samplers.prioritized.is_weights(mine, float(p[p > 0].min()), 0.7, norm,
                                                  64, float(p.sum())).astype(np.float32)
        np.testing.assert_allclose(b.weights, want, rtol=1e-6)
        if norm == "buffer":  # and exactly the weights the single buffer gives each item
            w = dict(zip(ids(ref).tolist(), ref.weights.tolist(), strict=True))
            assert b.weights.tolist() == [w[i] for i in got.tolist()]


def test_stale_priority_updates_are_ignored(services: Any) -> None:
    cfg = {"capacity": 8, "sampler": {"type": "prioritized", "alpha": 1.0, "eps": 0.0}}
    svc = start(services, 2, cfg, num_lanes=2, seed=1)
    c = svc.client(max_rows=1)
    c.extend(**steps(2, 0, 8), priority=1.0)
    c.flush()
    assert svc.stats()["total"] == pytest.approx(16.0)
    b = c.sample(32)
    keys, first = np.unique(b.indices, return_index=True)
    sampled = ids(b)[first]
    # overwrite the three oldest steps of lane 0 (shard 0)
    c.extend(**{k: v[:, :1] for k, v in steps(2, 8, 11).items()}, env_ids=[0], priority=1.0)
    c.flush()
    live = ~np.isin(sampled, [0, 1, 2])
    applied = c.update_priorities(keys, np.full(len(keys), 5.0))
    assert applied == int(live.sum()) and applied < len(keys)
    # stale updates changed nothing: 16 live steps, the live sampled ones at 5
    assert svc.stats()["total"] == pytest.approx(16.0 + 4.0 * live.sum())


def test_initial_priorities_reach_the_shards(services: Any) -> None:
    cfg = {"capacity": 16, "sampler": {"type": "prioritized", "alpha": 0.5, "eps": 0.0}}
    svc = start(services, 2, cfg, num_lanes=2)
    c = svc.client(max_rows=4)
    for t in range(6):
        d = {k: v[0] for k, v in steps(2, t, t + 1).items()}
        c.add(**d, priority=[4.0, 9.0])
    c.flush()
    per = [s["total"] for s in svc.stats()["shards"]]
    assert per == pytest.approx([6 * 2.0, 6 * 3.0])
    with pytest.raises(ShapeError, match="priority"):
        c.add(**{k: v[0] for k, v in steps(2, 0, 1).items()}, priority=[1.0, 2.0, 3.0])


def test_lanes_stay_on_one_shard_so_nstep_is_exact(services: Any) -> None:
    cfg = {"capacity": 64, "n_step": 3, "gamma": 0.5, "seed": 3}
    svc = start(services, 2, cfg, num_lanes=4, seed=3)
    single = rb.from_config({**cfg, "capacity": 128, "num_envs": 4})
    data = steps(4, 0, 20)
    data["terminated"][[4, 11, 12], [0, 1, 3]] = True  # episode ends in some lanes
    data["reward"] = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    c = svc.client(max_rows=8)
    for t in range(20):  # one step at a time, batched by the client
        c.add(**{k: v[t] for k, v in data.items()})
    c.flush()
    single.extend(**data)
    ref = single.sample(5000)
    want = {i: (r, d, n) for i, r, d, n in zip(ids(ref).tolist(), ref.reward.tolist(),
                                               ref.discount.tolist(),
                                               ref.next_obs[:, 0].tolist(), strict=True)}
    b = c.sample(512)
    for i, r, d, n in zip(ids(b).tolist(), b.reward.tolist(), b.discount.tolist(),
                          b.next_obs[:, 0].tolist(), strict=True):
        assert want[i] == (r, d, n)
    seq = c.sample_sequences(16, 4)
    lanes = seq.obs[..., 0] // 1000
    assert seq.obs.shape == (16, 4, 2) and bool(np.all(lanes == lanes[:, :1]))
    assert bool(np.all(np.diff(seq.obs[..., 0], axis=1) == 1))


def test_client_pickles_into_a_ray_task(services: Any) -> None:
    svc = start(services, 2, {"capacity": 32}, num_lanes=2)
    c = svc.client(max_rows=1000)
    c.add(**{k: v[0] for k, v in steps(2, 0, 1).items()})
    assert c.pending_rows == 2

    @ray.remote(num_cpus=0)
    def write(client: Any, t0: int) -> int:
        for t in range(t0, t0 + 5):
            client.add(**{k: v[0] for k, v in steps(2, t, t + 1).items()})
        client.close()
        return len(client)

    assert ray.get(write.remote(c, 1), timeout=60) == 12  # pickling flushed our 2 rows
    assert c.pending_rows == 0 and len(c) == 12


def test_concurrent_writer_and_reader(services: Any) -> None:
    svc = start(services, 2, {"capacity": 256, "sampler": PER}, num_lanes=4)
    c = svc.client(max_rows=64, max_age_s=0.05)
    c.extend(**steps(4, 0, 4))
    c.flush()

    @ray.remote(num_cpus=0)
    def writer(client: Any) -> int:
        for t0 in range(4, 400, 4):
            client.extend(**steps(4, t0, t0 + 4))
        client.close()
        return len(client)

    done = writer.remote(c)
    reads = 0
    while not ray.wait([done], timeout=0)[0]:
        b = c.sample(128)
        assert bool(np.all(b.next_obs[:, 0] == b.obs[:, 0] + 1))
        c.update_priorities(b.indices, np.abs(np.random.default_rng(reads).normal(size=128)))
        reads += 1
        assert reads < 5000
    assert ray.get(done, timeout=60) == 2 * 256  # capacity is per shard
    assert reads > 0 and svc.stats()["inserts"] == 400 * 4


def test_checkpoint_round_trip_gives_the_same_next_sample(services: Any, tmp_path: Any
                                                           ) -> None:
    svc, client, _ = filled(services, PER, seed=5)
    client.sample(32)
    client.update_priorities(client.sample(16).indices, np.linspace(0.1, 3, 16))
    path = svc.checkpoint(tmp_path / "ck")
    a = [client.sample(48) for _ in range(3)]
    svc.shutdown()
    back = ReplayService.restore(path, num_shards=2, num_cpus=SHARD_CPUS, timeout=30.0)
    services.append(back)
    again = back.client()
    b = [again.sample(48) for _ in range(3)]
    assert a == b
    assert back.stats()["size"] == 64
    with pytest.raises(CheckpointError, match="2 shards"):
        ReplayService.restore(path, num_shards=3)
    (path / "DONE").unlink()
    with pytest.raises(CheckpointError, match="DONE"):
        ReplayService.restore(path)


def test_bad_arguments_are_named(services: Any) -> None:
    with pytest.raises(ConfigError, match="num_lanes=3"):
        ReplayService(2, {"capacity": 8}, num_lanes=3)
    with pytest.raises(ConfigError, match="num_shards=0"):
        ReplayService(0, {"capacity": 8})
    svc = start(services, 1, {"capacity": 8})
    with pytest.raises(ConfigError, match="max_times_sampled"):
        start(services, 1, {"capacity": 8}, max_times_sampled=2)
    with pytest.raises(ShapeError, match="env_ids"):
        svc.client().add(**{k: v[0, 0] for k, v in steps(1, 0, 1).items()}, env_ids=[3])


def test_more_shards_than_the_cluster_can_run_are_refused_at_once(services: Any) -> None:
    """Shards that can never all run (each asks for 1 CPU, one more than the cluster's
    CPUs) are refused as they start, naming the ones left out and the fixes, instead of
    a bare GetTimeoutError after the timeout."""
    cpus = ray.cluster_resources()["CPU"]
    n = int(cpus) + 1
    t = time.monotonic()
    with pytest.raises(ConfigError, match=(
            rf"ReplayService\(num_shards={n}, num_cpus=1\.0\): shards \[{n - 1}\] could "
            rf"not be scheduled: each shard asks for 1 CPU and the Ray cluster has {cpus:g} "
            rf"CPU in all .* Pass num_cpus=[0-9.]+ per shard .*, or fewer shards "
            rf"\(num_shards <= {n - 1}\)")):
        start(services, n, {"capacity": 8}, num_lanes=n, num_cpus=1.0, timeout=20.0)
    assert time.monotonic() - t < 10.0  # not after the timeout
    with pytest.raises(ConfigError, match=r"num_cpus=-1\): must be a number >= 0"):
        start(services, 1, {"capacity": 8}, num_cpus=-1)


def test_a_shard_that_cannot_start_in_time_is_named(services: Any) -> None:
    """When other actors hold the CPUs a shard needs, the start-up timeout names the
    shards that did not start and the free resources."""
    cpus = ray.cluster_resources()["CPU"]
    start(services, 1, {"capacity": 8}, num_cpus=cpus - SHARD_CPUS)  # holds all but 0.25
    with pytest.raises(rb.distributed.ShardUnavailableError, match=(
            r"shards \[[0-9, ]+\] did not start within timeout=2s; each shard asks for "
            r"0\.25 CPU and the Ray cluster has [0-9.]+ CPU \([0-9.]+ free\)")):
        start(services, 2, {"capacity": 8}, num_lanes=2, num_cpus=SHARD_CPUS, timeout=2.0)


@pytest.mark.statistical
def test_one_round_trip_path_is_taken_and_exact_even_when_spares_fall_short(
        services: Any) -> None:
    svc, client, single = filled(services, PER)
    ref = single.sample(20_000, beta=0.7)
    prob = dict(zip(ids(ref).tolist(), ref.probabilities.tolist(), strict=True))
    weight = dict(zip(ids(ref).tolist(), ref.weights.tolist(), strict=True))
    paths = dict(client.draw_paths)
    b = client.sample(64, beta=0.7)
    assert client.draw_paths["one_trip"] == paths["one_trip"] + 1
    assert client.draw_paths["two_trips"] == paths["two_trips"] == 0
    assert b.weights.tolist() == [weight[i] for i in ids(b).tolist()]
    # shard 1 looked empty in the "previous reply": it draws only SPARE_ITEMS spares,
    # too few for its share, so each call needs the top-up trip with the same split;
    # the law and the weights stay one buffer's
    counts: dict[int, int] = dict.fromkeys(prob, 0)
    draws = 0
    for _ in range(60):
        client._seen = [1.0, 0.0]
        b = client.sample(256, beta=0.7)
        np.testing.assert_allclose(b.probabilities, [prob[i] for i in ids(b).tolist()],
                                   rtol=1e-12)
        assert b.weights.tolist() == [weight[i] for i in ids(b).tolist()]
        for i in ids(b).tolist():
            counts[i] += 1
        draws += 256
    assert client.draw_paths["top_up"] >= 55 and client.draw_paths["two_trips"] == 0
    keys = sorted(prob)
    observed = np.array([counts[k] for k in keys], float)
    assert chi2_pvalue_ok(observed, np.array([prob[k] for k in keys]) * draws)
    # the masses that size the spares are part of the sampling state (checkpoints)
    assert client.state_dict()["shard_masses"] == pytest.approx(
        [s["total"] for s in svc.stats()["shards"]])


def test_replace_false_takes_the_two_trip_protocol(services: Any) -> None:
    _, client, _ = filled(services, None)
    b = client.sample(40, replace=False)
    assert client.draw_paths["two_trips"] == 1 and client.draw_paths["one_trip"] == 0
    assert len(set(b.indices.tolist())) == 40  # distinct over all shards
    # every item may be drawn at once (a multinomial split would ask a shard for more
    # than it holds); one more is refused with the sizes
    everything = sorted(1000 * lane + t for lane in range(4) for t in range(16))
    assert sorted(ids(client.sample(64, replace=False)).tolist()) == everything
    with pytest.raises(rb.errors.EmptyBufferError, match="hold 64 items"):
        client.sample(65, replace=False)


@pytest.mark.statistical
def test_uniform_replace_false_is_a_uniform_subset(services: Any) -> None:
    """One buffer's ``sample(B, replace=False)`` is a uniformly random B-subset: how
    many items of shard 0 a batch holds is hypergeometric(32 of 64, B), not binomial."""
    _, client, _ = filled(services, None)
    from_shard0 = np.array([int((client.sample(48, replace=False).indices % 2 == 0).sum())
                            for _ in range(400)])
    # 48 drawn of 32 + 32: shard 0 gives 16..32
    assert chi2_pvalue_ok(*hypergeometric_cells(from_shard0, 32, 32, 48))
    assert from_shard0.var() < 4.0  # hypergeometric: 3.05; a multinomial split: 12


@pytest.mark.statistical
def test_prioritized_replace_false_is_one_buffers_successive_sampling(
        services: Any) -> None:
    """One buffer's prioritized ``sample(B, replace=False)`` draws each next item in
    proportion to priority among those not drawn yet (Gumbel top-k). With B = 56 of 64
    items on two shards of 32 a shard's share often exceeds what it holds under a
    multinomial split; the service's batches have one buffer's law: which items are
    left out is compared item by item with that law (simulated)."""
    _, client, single = filled(services, PER)
    every = single.sample(64, replace=False)  # every item, with P(i) = p_i / total
    item, prob = ids(every), every.probabilities.astype(np.float64)
    rng = np.random.default_rng(1)
    keys = np.log(prob)[None, :] + rng.gumbel(size=(100_000, 64))  # one buffer's draws
    left_out = np.argsort(-keys, axis=1)[:, 56:]
    p_out = np.bincount(left_out.ravel(), minlength=64) / len(keys)  # [64]
    calls = 400
    out = dict.fromkeys(item.tolist(), 0)
    for _ in range(calls):
        b = client.sample(56, replace=False)
        got = ids(b).tolist()
        assert len(set(got)) == 56
        for i in set(out) - set(got):
            out[i] += 1
    observed = np.array([out[i] for i in item.tolist()], float)
    assert chi2_pvalue_ok(observed, p_out * calls)
    # the test has power: the law is far from leaving out every item equally often
    assert not chi2_pvalue_ok(observed, np.full(64, 8 / 64 * calls))
    assert client.draw_paths["two_trips"] == calls


def test_too_large_prioritized_replace_false_batch_is_refused_before_anything_changes(
        services: Any) -> None:
    """``sample(B, replace=False)`` with B above every shard's items together names the
    call's batch_size and the total (not one shard's share of it), and changes nothing:
    a twin service sampled without the refused call gives the same next batches."""
    svc, client, _ = filled(services, PER)
    _, twin, _ = filled(services, PER)
    before = (client.state_dict(), svc.stats()["samples"])
    with pytest.raises(rb.errors.EmptyBufferError,
                       match=r"sample\(batch_size=1000, replace=False\): the live shards "
                             r"hold 64 items \(sizes \[32, 32\]\); lower batch_size"):
        client.sample(1000, replace=False)
    assert (client.state_dict(), svc.stats()["samples"]) == before
    for replace in (False, True):
        assert client.sample(48, replace=replace).indices.tolist() == \
            twin.sample(48, replace=replace).indices.tolist()


def test_torch_tensors_in_and_priorities_from_a_grad_tensor(services: Any) -> None:
    """A learner holding torch tensors: rows keep their dtype, and priorities may be a
    tensor that requires grad (detached on the way)."""
    torch = pytest.importorskip("torch")
    svc = start(services, 2, {"capacity": 64, "sampler": PER}, num_lanes=4, seed=0)
    client = svc.client(max_rows=8)
    data = {k: torch.as_tensor(v) for k, v in steps(4, 0, 8).items()}
    client.extend(**data)
    client.flush()
    batch = client.sample(16)
    assert batch.obs.dtype == np.float32 and len(client) == 32
    td = torch.rand(16, requires_grad=True) * 2.0
    assert client.update_priorities(torch.as_tensor(batch.indices), td) == 16


def test_client_refuses_tuples_holding_arrays_as_one_buffer_does(services: Any) -> None:
    """The client converted its values with np.asarray before its checks: a list of
    per-step tuples (a vector env's Tuple observations, collected step by step) or a
    tuple of per-lane arrays was stacked part-first and sent to the shards, which stored
    each part in a lane (with 2 parts over 2 lanes: accepted). Every such call is refused
    with ReplayBuffer.extend's ShapeError (spec.check_tuple) and no shard changes, before
    and after the shards know the fields."""
    svc = start(services, 2, {"capacity": 16}, num_lanes=2)
    c = svc.client(max_rows=1)
    good = steps(2, 0, 2)  # obs [T=2, lanes=2, 2]
    per_step = [(o[:, 0], o[:, 1]) for o in good["obs"]]  # each part [lanes]
    calls = {
        "extend, per-step tuples": (lambda: c.extend(**{**good, "obs": per_step}),
                                    r"^obs=\[2 items: \(array.*are tuples holding arrays"),
        "extend, a tuple": (lambda: c.extend(**{**good, "obs": tuple(good["obs"][..., i]
                                                                     for i in range(2))}),
                            r"^obs=\(array\(shape=\(2, 2\).*a tuple holding arrays is"),
        "add, a tuple": (lambda: c.add(**{**{k: v[0] for k, v in good.items()},
                                          "obs": (good["obs"][0, :, 0], good["obs"][0, :, 1])}),
                         r"^obs=\(array\(shape=\(2,\).*a tuple holding arrays is"),
    }
    for known in (False, True):
        if known:
            c.extend(**good)
            c.flush()
        size = len(c)
        for name, (call, said) in calls.items():
            with pytest.raises(ShapeError, match=said + r".*obs=\{'0': "):
                call()
            c.flush()
            assert len(c) == size, name
    assert len(c) == 4


def test_a_damaged_client_state_is_refused_and_changes_nothing(services: Any) -> None:
    """load_state_dict raised a bare KeyError for a state without 'rng' and a bare
    ValueError for a bad 'calls', after it had already replaced the generator: the
    failed call changed the client's sampling state. Every entry is now checked first
    and a bad one raises CheckpointError (as one buffer's load_state_dict does), naming
    the entry, and the client's state (generator, beta calls, masses) is as it was."""
    svc, client, _ = filled(services, PER, seed=1)
    client.sample(8)  # shard masses and beta calls recorded
    mine = client.state_dict()
    other = svc.client("other", seed=123)
    other.sample(3)
    good = other.state_dict()
    local = rb.ReplayBuffer(16, sampler=rb.PrioritizedSampler())
    with pytest.raises(CheckpointError):
        local.load_state_dict({})
    bad_states = {
        "no rng": ({}, r"no 'rng' entry"),
        "not a dict": ([1, 2], r"load_state_dict\(state=\[1, 2\]\)"),
        "rng of another generator": (
            {**good, "rng": {"bit_generator": "MT19937"}},
            "rng state does not fit a PCG64",
        ),
        "calls='x'": ({**good, "calls": "x"}, r"state\['calls'\]='x'"),
        "calls=-1": ({**good, "calls": -1}, r"state\['calls'\]=-1"),
        "shard_masses of 3 shards": (
            {**good, "shard_masses": [1.0, 2.0, 3.0]},
            r"state\['shard_masses'\]=.*one finite number >= 0 "
            r"per shard \(2\)",
        ),
        "shard_masses 'ab'": ({**good, "shard_masses": "ab"}, r"state\['shard_masses'\]"),
        "window_rates rows of 3": (
            {**good, "window_rates": [[2, "k", 1.0]]},
            r"state\['window_rates'\]",
        ),
    }
    before = svc.stats()["shards"]
    for name, (state, said) in bad_states.items():
        with pytest.raises(CheckpointError, match=said):
            client.load_state_dict(state)
        assert client.state_dict() == mine, name
    assert svc.stats()["shards"] == before
    client.load_state_dict(good)  # a good state still loads
    assert client.state_dict() == good


@pytest.mark.parametrize("lost", ["shard.json", "times.npy", "buffer_state.safetensors"])
def test_restore_with_a_shard_file_missing_names_it(
    services: Any, tmp_path: Any, lost: str
) -> None:
    """A checkpoint without shard-001/times.npy raised Ray's ActorDiedError (the shard
    died loading it), and without shard.json Ray's RayTaskError(CheckpointError), whose
    message is Ray's remote traceback. The files are checked before any shard starts:
    a CheckpointError naming the file and the fix, no Ray error, no actor left."""
    svc = start(services, 2, {"capacity": 8}, num_lanes=2, seed=0)
    c = svc.client(max_rows=1)
    c.extend(**steps(2, 0, 4))
    path = svc.checkpoint(tmp_path / "ck")
    (path / "shard-001" / lost).unlink()
    with pytest.raises(CheckpointError) as got:
        ReplayService.restore(path, num_cpus=SHARD_CPUS, timeout=30.0)
    assert type(got.value) is CheckpointError  # not Ray's wrapper of it
    assert str(got.value).startswith(
        f"ReplayService.restore(path={str(path)!r}): shard 1's file "
        f"{path / 'shard-001' / lost} is missing"
    )
    assert "restore another checkpoint" in str(got.value)


def test_restore_of_a_damaged_shard_file_raises_the_shards_error(
    services: Any, tmp_path: Any
) -> None:
    """A shard file that is there but damaged is found by the shard as it loads: its
    CheckpointError reaches the caller as itself (it was Ray's ActorDiedError for
    times.npy, and a RayTaskError wrapper, whose message is Ray's traceback, for
    shard.json)."""
    svc = start(services, 2, {"capacity": 8}, num_lanes=2, seed=0)
    c = svc.client(max_rows=1)
    c.extend(**steps(2, 0, 4))
    path = svc.checkpoint(tmp_path / "ck")
    damages = {
        "times.npy": (b"not an array", r"times\.npy: cannot read the shard's sample"),
        "shard.json": (b"{}", r"shard\.json: not a shard state \(KeyError"),
    }
    for name, (text, said) in damages.items():
        saved = (path / "shard-001" / name).read_bytes()
        (path / "shard-001" / name).write_bytes(text)
        with pytest.raises(
            CheckpointError, match="^" + str(path / "shard-001") + ".*" + said
        ) as got:
            ReplayService.restore(path, num_cpus=SHARD_CPUS, timeout=30.0)
        assert type(got.value) is CheckpointError, name
        (path / "shard-001" / name).write_bytes(saved)
    back = ReplayService.restore(path, num_cpus=SHARD_CPUS, timeout=30.0)  # intact again
    services.append(back)
    assert len(back.client()) == 8


def test_rb_save_of_a_client_points_to_the_service_checkpoint(services: Any, tmp_path: Any) -> None:
    """rb.save(client) advised registering ReplayClient as a buffer type; a client holds
    no rows, its service's checkpoint() saves them. Nothing is written."""
    svc = start(services, 2, {"capacity": 8}, num_lanes=2)
    c = svc.client()
    for call in (rb.save, rb.persist.load_into):
        with pytest.raises(
            ConfigError,
            match=r"\(buf=ReplayClient\): a service client holds "
            r"no rows .* service\.checkpoint\(path\) .* "
            r"ReplayService\.restore\(path\)",
        ):
            call(c, tmp_path / "d")
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_a_training_loop_written_for_a_buffer_runs_unchanged_on_a_client(
        services: Any) -> None:
    """The same loop, only the construction line changed. rb.collect / rb.warm raised
    AttributeError on a client (no ``num_envs``, ``spec``, ``capacity``), and a client
    that added and then sampled got EmptyBufferError ("the live shards hold nothing")
    and ``len() == 0`` while its own rows sat in its write queue: a local loop needed
    ``flush()`` calls to run on the cluster. A client now reads its own writes."""
    gym = pytest.importorskip("gymnasium")

    def loop(buf: Any) -> tuple[int, Any, Any]:
        envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        res = rb.collect(envs, None, buf, 40, progress=False, seed=0)
        envs.close()
        assert len(buf) == res.steps >= 40  # no flush() anywhere
        batch = buf.sample(8)
        buf.update_priorities(batch.indices, np.full(8, 2.0))
        rb.warm(buf, None, 60, num_envs=2, env="CartPole-v1", progress=False, seed=1)
        return len(buf), batch, buf.spec

    local = rb.ReplayBuffer(128, num_envs=2, n_step=3, sampler=rb.PrioritizedSampler(),
                            seed=0)
    svc = start(services, 2, {"capacity": 64, "n_step": 3, "sampler": PER}, num_lanes=2)
    client = svc.client(max_age_s=1e3)  # nothing is sent by age during the test
    assert (client.num_envs, client.capacity) == (local.num_envs, local.capacity) == (2, 128)
    assert client.spec is None and local.spec is None  # nothing written yet
    n_local, b_local, spec_local = loop(local)
    n_client, b_client, spec_client = loop(client)
    assert n_client == n_local >= 60
    assert spec_client == spec_local
    assert sorted(b_client) == sorted(b_local)
    assert {k: (v.shape, v.dtype) for k, v in b_client.items()} \
        == {k: (v.shape, v.dtype) for k, v in b_local.items()}
    assert client.pending_rows == 0


@pytest.mark.slow
def test_a_client_refuses_positional_values_and_save_as_a_buffer_does(
        services: Any, tmp_path: Any) -> None:
    """``client.add(obs)`` took the array as ``obs`` and failed with a SpecError about
    missing fields (``extend(obs)``: Python's TypeError), and ``client.save(d)`` was an
    AttributeError; a buffer raises an ArgumentError naming the keyword form, and
    ``rb.save(client, d)`` a ConfigError naming the service checkpoint. Nothing is
    queued or written."""
    svc = start(services, 2, {"capacity": 8}, num_lanes=2)
    client = svc.client()
    local = rb.ReplayBuffer(16, num_envs=2)
    one = {k: v[0] for k, v in steps(2, 0, 1).items()}
    for call, values in (("add", one), ("extend", steps(2, 0, 1))):
        with pytest.raises(rb.ArgumentError) as want:
            getattr(local, call)(values["obs"], **values)
        with pytest.raises(rb.ArgumentError) as got:
            getattr(client, call)(values["obs"], **values)
        assert str(got.value) == str(want.value)
    assert client.pending_rows == 0 and len(client) == 0
    with pytest.raises(ConfigError, match=r"save\(dirpath=.*service\.checkpoint\(path\)"):
        client.save(tmp_path / "d")
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_a_client_refuses_sample_fn_as_a_host_buffer_does(services: Any) -> None:
    """``client.sample_fn(B)`` was an AttributeError; a buffer whose storage draws on the
    host raises a ConfigError naming the fix (call sample()), and so does the client,
    with the same message naming itself."""
    svc = start(services, 2, {"capacity": 8}, num_lanes=2)
    client = svc.client()
    with pytest.raises(ConfigError) as want:
        rb.ReplayBuffer(16, num_envs=2).sample_fn(4)
    with pytest.raises(ConfigError) as got:
        client.sample_fn(4)
    assert str(got.value) == str(want.value).replace(
        'this buffer\'s storage ("numpy")', "a ReplayClient (its shards sample on their own hosts)"
    )
    assert "or call sample()" in str(got.value)


@pytest.mark.parametrize("sampler", [None, PER])
def test_an_empty_service_says_what_an_empty_buffer_says(services: Any, sampler: Any) -> None:
    """A sample from an empty service (never written, or cleared) raises the local
    buffer's ``EmptyBufferError`` message, word for word, then what only a service can
    add. It used to say ``the live shards hold nothing to draw (masses [0.0, 0.0]); add
    data, or wait for the writers``, and named ``sample_sequences`` ``sample``."""
    cfg: dict[str, Any] = {"capacity": 64, "seed": 0}
    if sampler is not None:
        cfg["sampler"] = sampler
    local = rb.from_config({**cfg, "capacity": 128, "num_envs": 4})
    svc = start(services, 2, cfg, num_lanes=4, seed=0)
    client = svc.client()
    calls = {"sample": lambda buf: buf.sample(8),
             "replace=False": lambda buf: buf.sample(8, replace=False),
             "sample_sequences": lambda buf: buf.sample_sequences(2, 3)}
    for when in ("new", "cleared"):
        for name, call in calls.items():
            with pytest.raises(rb.EmptyBufferError) as want:
                call(local)
            with pytest.raises(rb.EmptyBufferError) as got:
                call(client)
            head, _, tail = str(want.value).partition(": ")
            assert tail == "the buffer is empty; add transitions first", (when, name)
            msg = str(got.value)
            assert msg.startswith(head.rstrip(")")), (when, name, msg)
            assert msg.endswith(f": {tail}, or wait for the writers' rows (the live shards "
                                "hold 0 items)"), (when, name, msg)
        for buf in (local, client):
            buf.extend(**steps(4, 0, 3))
            buf.clear()


@pytest.mark.slow
def test_clear_empties_the_service_as_a_buffer_and_restores_after(
        services: Any, tmp_path: Any) -> None:
    """A client had no ``clear()`` (AttributeError), so a loop that clears its buffer
    between tasks could not move to the service. It drops every shard's rows and the
    client's own queued rows, as ``buf.clear()``: a sample raises EmptyBufferError,
    later rows alone are sampled, and a checkpoint taken after it restores them with the
    identical next sample."""
    local = rb.ReplayBuffer(128, num_envs=4, seed=0)
    svc = start(services, 2, {"capacity": 64, "seed": 0}, num_lanes=4, seed=0,
                checkpoint_dir=tmp_path / "ck")
    client = svc.client("learner", max_age_s=1e3)
    for buf in (local, client):
        buf.extend(**steps(4, 0, 10))
        assert len(buf) == 40
        buf.extend(**steps(4, 10, 12))  # queued in the client (not sent yet)
    assert client.pending_rows == 8
    for buf in (local, client):
        buf.clear()
        assert len(buf) == 0
        with pytest.raises(rb.EmptyBufferError):
            buf.sample(4)
    assert client.pending_rows == 0
    client.flush()  # the queued rows were dropped, not sent later
    assert svc.stats()["size"] == 0 and len(client) == 0
    for buf in (local, client):
        buf.extend(**steps(4, 20, 26))
    assert len(client) == len(local) == 24
    new = {1000 * lane + t for lane in range(4) for t in range(20, 26)}
    assert set(ids(client.sample(256)).tolist()) == new
    assert set(ids(local.sample(256)).tolist()) == new
    path = svc.checkpoint()
    back = ReplayService.restore(path, num_cpus=SHARD_CPUS, timeout=30.0)
    services.append(back)
    again = back.client("learner")
    assert len(again) == 24
    one, two = client.sample(64), again.sample(64)
    assert np.array_equal(one.indices, two.indices) and np.array_equal(ids(one), ids(two))
    assert set(ids(two).tolist()) <= new


@pytest.mark.slow
def test_clear_resets_priorities_as_a_buffer_does(services: Any) -> None:
    """After a clear the shards' PER state is a fresh buffer's: old priorities and the
    running max priority are gone (new rows start at the max a cleared buffer gives),
    keys drawn before are stale, and probabilities and weights equal a local
    buffer's that saw the same calls."""
    per = {**PER, "alpha": 1.0, "beta": 0.5}
    local = rb.ReplayBuffer(128, num_envs=4, seed=0, sampler=rb.PrioritizedSampler(
        **{k: v for k, v in per.items() if k != "type"}))
    svc = start(services, 2, {"capacity": 64, "sampler": per}, num_lanes=4, seed=0)
    client = svc.client()
    old = {}
    for name, buf in (("local", local), ("client", client)):
        buf.extend(**steps(4, 0, 8), priority=7.0)
        b = buf.sample(16)
        buf.update_priorities(b.indices, np.full(16, 50.0))  # the running max is 50 now
        old[name] = b.indices
        buf.clear()
        buf.extend(**steps(4, 10, 12), priority=np.full((2, 4), 0.5))
        buf.extend(**steps(4, 12, 14))  # the running max of a cleared buffer: 1
    assert client.update_priorities(old["client"], np.full(16, 9.0)) == 0  # stale keys
    assert local.update_priorities(old["local"], np.full(16, 9.0)) == 0

    def law(batch: Any) -> dict[int, tuple[float, float]]:
        return {int(i): (float(p), float(w)) for i, p, w
                in zip(ids(batch), batch.probabilities, batch.weights, strict=True)}

    want, got = law(local.sample(512)), law(client.sample(512))
    assert set(want) == set(got) == {1000 * lane + t for lane in range(4) for t in range(10, 14)}
    for key, (p, w) in got.items():
        assert p == pytest.approx(want[key][0], rel=1e-6)
        assert w == pytest.approx(want[key][1], rel=1e-6)
    # 8 rows at 0.5 and 8 at the max of a cleared buffer, 1 (not 50): total 12
    assert got[10][0] == pytest.approx(0.5 / 12.0, rel=1e-4)
    assert got[12][0] == pytest.approx(1.0 / 12.0, rel=1e-4)


@pytest.mark.slow
def test_clear_with_another_client_writing(services: Any) -> None:
    """Two clients: rows the other client wrote before the clear are gone, rows it sends
    after are kept; and with the other client sending while the shards clear again and
    again, each of its sends lands wholly before a shard's clear or wholly after it,
    never half (each shard holds whole sends, the ones after its latest clear)."""
    import threading

    svc = start(services, 2, {"capacity": 512}, num_lanes=2, seed=0)
    a, b = svc.client("a", max_age_s=1e3), svc.client("b", max_age_s=1e3)
    b.extend(**steps(2, 0, 5))
    b.flush()
    a.extend(**steps(2, 5, 10))   # a's own, queued
    b.extend(**steps(2, 10, 15))  # b's, queued while a clears: sent after it
    a.clear()
    assert len(a) == 0
    b.flush()
    assert set(ids(a.sample(128)).tolist()) == {1000 * lane + t for lane in range(2)
                                                  for t in range(10, 15)}
    a.clear()
    writer = svc.client("w", max_rows=5)  # one send per shard per 5-step extend
    late, stopped = threading.Event(), threading.Event()

    def write() -> None:
        for j in range(60):
            if j == 40:  # the clears stop; 20 more sends follow the last one
                late.set()
                stopped.wait(60)
            writer.extend(**steps(2, 100 + 5 * j, 105 + 5 * j))
        writer.flush()

    thread = threading.Thread(target=write)
    thread.start()
    clears = 0
    while not late.is_set():  # every clear runs while the writer sends
        a.clear()
        clears += 1
    stopped.set()
    thread.join()
    n = len(a)
    held = set(ids(a.sample(n, replace=False)).tolist())
    assert clears >= 1 and len(held) == n
    for lane in range(2):
        t = sorted(k - 1000 * lane for k in held if k // 1000 == lane)
        assert len(t) >= 100, (lane, len(t))  # the sends after the last clear
        assert t[0] % 5 == 0 and t == list(range(t[0], 400)), (lane, t[:10])


def test_a_client_refuses_a_second_threads_call_while_one_runs(services: Any) -> None:
    """A client serves one thread at a time: a collector thread's ``extend`` made while
    the learner's ``sample`` waits on the rate limiter raises ``ConcurrentCallError``
    naming both calls, both threads and the fix, and queues nothing. It used to go
    through: a collector adding beside a learner sampling and updating priorities broke
    the client's acknowledgement queue (``IndexError`` in 2 runs of 3). A client for each
    thread is the fix: the collector's rows let the learner's waiting sample through."""
    import threading

    from replaybank.distributed import RateLimit, RateLimitTimeout

    svc = start(services, 1, {"capacity": 64}, rate_limit=RateLimit(min_size_to_sample=10))
    learner = svc.client("learner", max_rows=1, timeout=4.0)
    one_lane = {k: v[:, 0] for k, v in steps(1, 0, 10).items()}
    learner.extend(**{k: v[:9] for k, v in one_lane.items()})
    learner.flush()
    got: list[Any] = []

    def learn() -> None:
        try:
            got.append(learner.sample(4))
        except BaseException as exc:  # reported by the test
            got.append(exc)

    th = threading.Thread(target=learn, name="learner")
    th.start()
    time.sleep(1.0)  # the sample waits for a 10th row
    with pytest.raises(rb.ConcurrentCallError) as info:
        learner.extend(**{k: v[9:] for k, v in one_lane.items()})
    msg = str(info.value)
    assert "ReplayClient.extend()" in msg and "'learner'" in msg and "sample()" in msg
    assert "'MainThread'" in msg and "service.client(" in msg
    assert learner.pending_rows == 0
    th.join(30)
    assert isinstance(got[0], RateLimitTimeout), got  # no 10th row came
    # one client per thread
    got.clear()
    th = threading.Thread(target=learn, name="learner")
    th.start()
    time.sleep(1.0)
    collector = svc.client("collector", max_rows=1)
    collector.extend(**{k: v[9:] for k, v in one_lane.items()})
    collector.flush()
    th.join(30)
    assert not isinstance(got[0], BaseException), got
    assert got[0].batch_size == 4 and len(learner) == 10
