"""Prioritized sampling of device storage: the host tree draws, the device gathers. A
device PER buffer gives numpy storage's batches under the same seed (the same keys,
probabilities, weights and fields, as device tensors), follows the host sampler's
probabilities and distribution, ignores stale updates, saves its state, and converts no
device tensor to the host in ``sample`` (StrictBackend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import replaybank as rb  # noqa: E402
from replaybank.samplers.prioritized import is_weights  # noqa: E402
from tests.stats import chi2_critical  # noqa: E402
from tests.strict_device import StrictBackend, allow_syncs, host  # noqa: E402
from tests.test_torch_features import steps  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


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


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize(("norm", "lanes", "apart"), [
    ("buffer", 3, False), ("batch", 1, False), (None, 3, True)])
def test_device_per_gives_numpy_storages_batches(norm: str | None, lanes: int,
                                                 apart: bool, packed: bool) -> None:
    """The same seed and writes, numpy storage against device storage: every batch (keys,
    probabilities, weights, every field and next observation) is the same, through
    priority updates, a beta given per call, a scheduled beta and wraps of the ring;
    ``packed``: through the one packed copy a GPU takes (a no-op copy on the CPU)."""
    ref, dev = pair(seed=9, norm=norm, lanes=lanes, apart=apart, beta_schedule="linear",
                    beta_steps=6)
    dev.store.path.packed = packed
    for i in range(6):
        kw: dict[str, Any] = {"beta": 0.9} if i == 3 else {}
        want, got = ref.sample(48, **kw), dev.sample(48, **kw)
        assert isinstance(got["indices"], torch.Tensor)
        assert got["indices"].device.type == "cpu" and got["weights"].dtype == torch.float32
        assert got["probabilities"].dtype == torch.float64
        assert set(want) == set(got)
        for k in want:
            np.testing.assert_array_equal(host(got[k]), want[k], err_msg=k)
        update_both(ref, dev, want["indices"], i)
        if i == 2:  # new steps overwrite the oldest
            for kw_ in steps(np.random.default_rng(i), lanes, 7):
                ref.add(**kw_)
                dev.add(**kw_)
    assert dev.sampler.calls == ref.sampler.calls


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


def test_stale_updates_are_ignored_and_new_writes_are_drawn() -> None:
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
