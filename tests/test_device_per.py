"""Prioritized sampling on the device (issue 17, item 3): the torch sum tree against a
plain reference, and a device PER buffer against the host PrioritizedSampler (same
per-slot probabilities and weights, the same distribution by chi-square, stale updates
ignored, state saved), with no host conversion in ``sample`` (StrictBackend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import replaybank as rb  # noqa: E402
from replaybank.device import sumtree as sumtree_torch  # noqa: E402
from replaybank.samplers.prioritized import is_weights  # noqa: E402
from tests.stats import chi2_critical  # noqa: E402
from tests.strict_device import StrictBackend, allow_syncs, host  # noqa: E402
from tests.test_torch_features import steps  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("fanout", [2, 3, 8, 1024])
@pytest.mark.parametrize("n", [1, 2, 5, 37, 64, 1000])
def test_sum_tree_matches_a_plain_reference(n: int, fanout: int) -> None:
    """Totals, smallest positive leaf, leaves and the prefix-mass search against numpy
    (searchsorted on the cumsum), through random updates that zero leaves too; fanout
    1024 is the CUDA layout, run here on the CPU."""
    rng = np.random.default_rng(n * 7 + fanout)
    leaves = rng.random(n) * (rng.random(n) < 0.7)
    tree = sumtree_torch.TorchSumTree(torch, torch.from_numpy(leaves), fanout)
    assert all(len(level) <= fanout or len(level) % fanout == 0 for level in tree.sums)
    assert len(tree.sums[-1]) <= fanout
    for _ in range(5):
        k = int(rng.integers(1, n + 1))
        slots = rng.choice(n, size=k, replace=False)
        vals = rng.random(k) * (rng.random(k) < 0.8)
        leaves[slots] = vals
        tree.update(torch.from_numpy(slots), torch.from_numpy(vals))
        assert float(tree.total()) == pytest.approx(leaves.sum(), rel=1e-12, abs=1e-300)
        pos = leaves[leaves > 0]
        assert float(tree.min_positive()) == (pos.min() if len(pos) else np.inf)
        np.testing.assert_array_equal(tree.leaves(torch.arange(n)).numpy(), leaves)
        if leaves.sum() > 0:  # prefix masses -> leaves, as searchsorted on the cumsum
            cum = np.cumsum(leaves)
            t = np.sort(rng.random(200)) * leaves.sum()
            want = np.searchsorted(cum, t, side="right")
            got = tree.find(torch.from_numpy(t)).numpy()
            assert (leaves[got] > 0).all()  # never an empty leaf
            np.testing.assert_array_equal(got, want)
            # exact boundaries (measure zero: either neighbour), 0, a rounding below 0
            # and the total and past it (the last positive leaf)
            edge = np.concatenate([cum[leaves > 0][:20],
                                   [0.0, -1e-12, leaves.sum(), leaves.sum() * (1 + 1e-9)]])
            got = tree.find(torch.from_numpy(edge)).numpy()
            assert (leaves[got] > 0).all()
            lo, hi = cum[got] - leaves[got], cum[got]
            tol = 1e-9 * leaves.sum()
            assert np.all((lo - tol <= np.clip(edge, 0, leaves.sum()))
                          & (np.clip(edge, 0, leaves.sum()) <= hi + tol))


def pair(seed: int = 0, norm: str | None = "buffer", lanes: int = 3, apart: bool = False,
         **kw: Any) -> tuple[Any, Any]:
    """A numpy buffer and a strict device buffer with the same writes (``apart``: some
    writes to one lane only, so the lanes hold different steps)."""
    def make(storage: Any) -> rb.ReplayBuffer:
        return rb.ReplayBuffer(30 * lanes, num_envs=lanes, seed=seed, storage=storage,
                               sampler=rb.PrioritizedSampler(alpha=0.7, beta=0.4,
                                                             weight_norm=norm, **kw))
    ref, dev = make("numpy"), make(StrictBackend("cpu"))
    for i, kw_ in enumerate(steps(np.random.default_rng(seed), lanes, 50)):  # wraps around
        ids = [i % lanes] if apart and i % 3 else list(range(lanes))
        part = {k: ({n: v[ids] for n, v in x.items()} if isinstance(x, dict) else x[ids])
                for k, x in kw_.items()}
        ref.add(**part, env_ids=ids)
        dev.add(**part, env_ids=ids)
    return ref, dev


def update_both(ref: Any, dev: Any, keys: np.ndarray, seed: int) -> None:
    p = np.abs(np.random.default_rng(seed).normal(size=len(keys))) * 3 + 0.01
    n_ref = ref.update_priorities(keys, p)
    with allow_syncs(1):
        n_dev = dev.update_priorities(torch.from_numpy(keys), torch.from_numpy(p))
    assert n_ref == n_dev


@pytest.mark.parametrize(("norm", "lanes", "apart"), [
    ("buffer", 3, False), ("batch", 3, False), (None, 3, False), ("buffer", 1, False),
    ("buffer", 3, True), (None, 3, True)])
def test_probabilities_and_weights_match_the_host_sampler(norm: str | None, lanes: int,
                                                          apart: bool) -> None:
    """Lanes in step, one lane, lanes apart: the keys (the live step of each drawn slot),
    probabilities, weights and fields are the host sampler's."""
    ref, dev = pair(norm=norm, lanes=lanes, apart=apart)
    assert apart == bool((ref.table.written != ref.table.written[0]).any())
    for i in range(4):
        b = dev.sample(64)  # StrictBackend: any host conversion raises
        assert isinstance(b["indices"], torch.Tensor) and b["weights"].dtype == torch.float32
        keys = host(b["indices"])
        sampler = ref.sampler
        t, lanes = ref.table.T, ref.num_envs
        slots = keys // lanes % t * lanes + keys % lanes
        p = sampler.priorities(slots)
        assert (p > 0).all()
        np.testing.assert_allclose(host(b["probabilities"]), p / sampler.total, rtol=1e-12)
        p_min = float(sampler.range_min(0, t * lanes))
        want = is_weights(p, p_min, 0.4, norm, len(ref), sampler.total).astype(np.float32)
        np.testing.assert_allclose(host(b["weights"]), want, rtol=1e-6)
        # and the fields are the stored transitions of those keys
        for k, v in ref.table.gather_transitions(keys).items():
            np.testing.assert_array_equal(host(b[k]), v, err_msg=k)
        update_both(ref, dev, keys, i)
        ref.sample(4)  # both schedules advance by one call per sample
    assert dev.sampler.calls == ref.sampler.calls


def test_device_draws_follow_the_host_distribution() -> None:
    ref, dev = pair(seed=1)
    update_both(ref, dev, ref.sample(90, replace=False).indices, 5)
    sampler, t, lanes = ref.sampler, ref.table.T, ref.num_envs
    prob = sampler.priorities(np.arange(t * lanes)) / sampler.total
    draws = np.concatenate([host(dev.sample(512)["indices"]) for _ in range(40)])
    slots = draws // lanes % t * lanes + draws % lanes
    counts = np.bincount(slots, minlength=t * lanes)
    live = prob > 0
    expected = prob[live] * len(draws)
    chi2 = float(((counts[live] - expected) ** 2 / expected).sum())
    assert counts[~live].sum() == 0
    assert chi2 < chi2_critical(int(live.sum()) - 1)


def test_stale_updates_are_ignored_and_writes_reach_the_device_tree() -> None:
    ref, dev = pair(seed=2)
    old = host(dev.sample(16)["indices"])
    for kw in steps(np.random.default_rng(7), 3, 40):  # overwrites most of the ring
        ref.add(**kw)
        dev.add(**kw)
    update_both(ref, dev, old, 3)  # stale keys: counted alike, nothing applied
    b = dev.sample(64)
    keys = host(b["indices"])
    t, lanes = ref.table.T, ref.num_envs
    p = ref.sampler.priorities(keys // lanes % t * lanes + keys % lanes)
    np.testing.assert_allclose(host(b["probabilities"]), p / ref.sampler.total, rtol=1e-12)
    dev.clear()
    ref.clear()
    for kw in steps(np.random.default_rng(8), 3, 5):
        ref.add(**kw)
        dev.add(**kw)
    b = dev.sample(32)
    np.testing.assert_allclose(host(b["probabilities"]), 1 / 15, rtol=1e-12)


def test_state_round_trip_gives_the_identical_next_sample(tmp_path: Path) -> None:
    _, dev = pair(seed=3)
    update_both(_, dev, host(dev.sample(32)["indices"]), 1)
    with allow_syncs(10**6):
        rb.save(dev, tmp_path / "b")
    back = rb.load(tmp_path / "b", storage=StrictBackend("cpu"))
    a, b = dev.sample(32), back.sample(32)
    for k in a:
        np.testing.assert_array_equal(host(a[k]), host(b[k]), err_msg=k)


def test_host_fallbacks_and_errors() -> None:
    ref, dev = pair(seed=4)
    with pytest.raises(rb.ConfigError, match="beta"):
        dev.sample(8, beta=2.0)
    assert dev.sampler.calls == 0  # a refused call changes nothing
    for x in (ref, dev):  # replace=False draws on the host: the same keys as numpy
        x.rng.bit_generator.state = np.random.default_rng(0).bit_generator.state
    np.testing.assert_array_equal(host(dev.sample(8, replace=False)["indices"]),
                                  ref.sample(8, replace=False)["indices"])


@cuda
def test_cuda_per_sample_makes_no_sync() -> None:  # pragma: no cover - needs a GPU
    buf = rb.ReplayBuffer(3000, num_envs=3, seed=0, storage="torch", device="cuda",
                          sampler=rb.PrioritizedSampler())
    for kw in steps(np.random.default_rng(0), 3, 200):
        buf.add(**kw)
    b = buf.sample(256)
    buf.update_priorities(b.indices, b.weights.abs() + 0.1)
    buf.sample(256)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            buf.sample(256)
    finally:
        torch.cuda.set_sync_debug_mode("default")
