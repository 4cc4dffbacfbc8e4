"""buf.prefetcher (issue 17, item 4): background sampling in the order of a sample loop,
errors re-raised in the caller, clean shutdown, memmap storage; CPU here (pinned staging
and non_blocking copies need CUDA: the cuda-marked test)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import replaybank as rb  # noqa: E402
from tests.test_torch_features import steps  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def filled(seed: int = 0, **kw: Any) -> rb.ReplayBuffer:
    buf = rb.ReplayBuffer(120, num_envs=3, seed=seed, **kw)
    for s in steps(np.random.default_rng(seed), 3, 30):
        buf.add(**s)
    return buf


def same(a: Any, b: Any) -> None:
    assert set(a) == set(b)
    for k in a:
        x = a[k].cpu().numpy() if isinstance(a[k], torch.Tensor) else a[k]
        y = b[k].cpu().numpy() if isinstance(b[k], torch.Tensor) else b[k]
        np.testing.assert_array_equal(x, y, err_msg=k)


@pytest.mark.parametrize("depth", [1, 3])
def test_batches_come_in_the_order_of_a_sample_loop(depth: int) -> None:
    ref, buf = filled(), filled()
    with buf.prefetcher(16, device="cpu", depth=depth) as pf:
        assert pf.pinned is False
        got = [next(pf) for _ in range(12)]
    for b in got:
        assert isinstance(b, rb.Batch) and isinstance(b.obs["vec"], torch.Tensor)
        same(ref.sample(16), b)


def test_prioritized_options_and_memmap_storage(tmp_path: Path) -> None:
    kw: dict[str, Any] = {"sampler": rb.PrioritizedSampler(beta_schedule="linear",
                                                           beta_steps=5)}
    ref = filled(1, **kw)
    buf = filled(1, storage="memmap", path=tmp_path / "m",
                 sampler=rb.PrioritizedSampler(beta_schedule="linear", beta_steps=5))
    with buf.prefetcher(8, device="cpu", depth=2) as pf:
        for _, b in zip(range(6), pf, strict=False):
            same(ref.sample(8), b)
    buf.close()


def test_errors_in_the_thread_are_raised_by_next() -> None:
    empty = rb.ReplayBuffer(8, seed=0)
    pf = empty.prefetcher(4, device="cpu")
    with pytest.raises(rb.EmptyBufferError):
        next(pf)
    with pytest.raises(StopIteration):  # closed after the error
        next(pf)
    assert not pf._thread.is_alive()
    with pytest.raises(rb.ConfigError, match="depth=0"):
        filled().prefetcher(4, device="cpu", depth=0)
    with pytest.raises(rb.ConfigError, match="prefetcher"):
        filled().prefetcher(4, device="gpu")


def test_close_stops_the_thread_and_is_idempotent() -> None:
    buf = filled()
    before = threading.active_count()
    pf = buf.prefetcher(8, device="cpu", depth=2)
    next(pf)
    time.sleep(0.05)  # the thread fills the queue and blocks on it
    pf.close()
    pf.close()
    assert not pf._thread.is_alive()
    assert threading.active_count() <= before
    with pytest.raises(StopIteration):
        next(pf)
    # a buffer that keeps being written while the prefetcher samples
    with buf.prefetcher(8, device="cpu") as pf:
        for s in steps(np.random.default_rng(5), 3, 20):
            buf.add(**s)
            assert next(pf).reward.shape == (8,)


def test_device_storage_batches_pass_through() -> None:
    ref = filled(2, storage=rb.TorchBackend("cpu", draws="host"))
    buf = filled(2, storage=rb.TorchBackend("cpu", draws="host"))
    with buf.prefetcher(8, device="cpu") as pf:
        for _ in range(4):
            same(ref.sample(8), next(pf))


@cuda
def test_pinned_prefetch_to_cuda() -> None:  # pragma: no cover - needs a GPU
    ref, buf = filled(3), filled(3)
    with buf.prefetcher(32, device="cuda", depth=2) as pf:
        assert pf.pinned
        for _ in range(10):
            b = next(pf)
            assert b.obs["vec"].device.type == "cuda"
            torch.cuda.synchronize()
            same(ref.sample(32), b)
