"""Device sampling of torch storage (issue 17, item 2): the eager ``sample`` draws its keys
on the host exactly as numpy storage does and gathers them on the device in one packed
copy plus one gather per dtype group; ``sample_fn`` draws with a device generator inside a
CUDA graph. No host conversion of a device value in either (StrictBackend proves it on the
CPU; the ``cuda`` tests prove it with ``torch.cuda.set_sync_debug_mode("error")``)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import replaybank as rb  # noqa: E402
from tests.stats import chi2_critical  # noqa: E402
from tests.strict_device import StrictBackend, host  # noqa: E402
from tests.test_torch_features import steps  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
STORAGES = ["strict", "torch", pytest.param("cuda", marks=cuda)]


def device_buffer(kind: str, capacity: int = 96, lanes: int = 3, **kw: Any) -> rb.ReplayBuffer:
    if kind == "strict":
        return rb.ReplayBuffer(capacity, num_envs=lanes, storage=StrictBackend("cpu"), **kw)
    dev = "cuda" if kind == "cuda" else "cpu"
    return rb.ReplayBuffer(capacity, num_envs=lanes, storage="torch", device=dev, **kw)


def check_against(ref: rb.ReplayBuffer, batch: Any) -> None:
    """Every field of a device batch is what the numpy buffer stores for its keys."""
    keys = host(batch["indices"])
    want = ref.table.gather_transitions(keys)
    assert set(want) | {"indices"} == set(batch)
    for k, v in want.items():
        np.testing.assert_array_equal(host(batch[k]), v, err_msg=k)


@pytest.mark.parametrize("kind", STORAGES)
def test_device_samples_are_the_stored_transitions(kind: str) -> None:
    ref = rb.ReplayBuffer(96, num_envs=3, seed=0)
    buf = device_buffer(kind, seed=0)
    rng = np.random.default_rng(0)
    for i, kw in enumerate(steps(rng, 3, 90)):  # episode ends, jumps, wraps around
        ref.add(**kw)
        buf.add(**kw)
        if i % 7 == 3:  # writes between samples: the mirror follows them
            b = buf.sample(32)
            assert isinstance(b["indices"], torch.Tensor)
            check_against(ref, b)
    for _ in range(5):
        check_against(ref, buf.sample(64))
    b = buf.sample(8)
    assert b["obs/pix"].dtype == torch.uint8 and b["logp"].dtype == torch.float64
    assert tuple(b.obs["pix"].shape) == (8, 2, 3)


def test_mirror_follows_clear_load_and_env_ids() -> None:
    ref = rb.ReplayBuffer(60, num_envs=3, seed=1)
    buf = device_buffer("strict", capacity=60, seed=1)
    data = steps(np.random.default_rng(1), 3, 40)
    for i, kw in enumerate(data):
        ids = [i % 3] if i % 4 else [0, 1, 2]
        part = {k: ({n: v[ids] for n, v in x.items()} if isinstance(x, dict) else x[ids])
                for k, x in kw.items()}
        ref.add(**part, env_ids=ids)
        buf.add(**part, env_ids=ids)
        if i % 5 == 0:
            check_against(ref, buf.sample(16))
    buf.clear()
    ref.clear()
    for kw in data[:10]:
        ref.add(**kw)
        buf.add(**kw)
    check_against(ref, buf.sample(32))
    for kw in steps(np.random.default_rng(9), 3, 25):  # links change by a load
        ref.add(**kw)
    buf.load_state_dict(ref.state_dict())
    check_against(ref, buf.sample(32))


# how the host draw reaches the device: wrapped (the CPU default), the packed copy a GPU
# takes (forced on the CPU: the copy is a no-op, the unpacked views and patches are real)
ROUTES = ["wrapped", "packed", pytest.param("cuda", marks=cuda)]


def routed_buffer(route: str, capacity: int, lanes: int, **kw: Any) -> rb.ReplayBuffer:
    buf = device_buffer("cuda" if route == "cuda" else "torch", capacity, lanes, **kw)
    if route == "packed":
        buf.store.path.packed = True
    return buf


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(("lanes", "env_ids"), [(1, False), (3, False), (3, True)])
def test_eager_device_samples_are_numpy_storage_samples(lanes: int, env_ids: bool,
                                                        route: str, tmp_path: Path) -> None:
    """The eager device ``sample`` is numpy storage's batch under the same seed, key for
    key and field for field: one lane, lanes in step and lanes apart (``env_ids``), episode
    ends (next observations patched from the side store) and the ring wrapping between
    samples, and after pickling and a save/load round trip."""
    ref = rb.ReplayBuffer(60, num_envs=lanes, seed=3)
    buf = routed_buffer(route, 60, lanes, seed=3)
    seen_aside = set()
    for i, kw in enumerate(steps(np.random.default_rng(3), lanes, 70)):
        ids = list(range(lanes)) if not env_ids or i < 25 else [i % lanes]
        part = {k: ({n: v[ids] for n, v in x.items()} if isinstance(x, dict) else x[ids])
                for k, x in kw.items()}
        for x in (ref, buf):
            x.add(**part, env_ids=ids)
        if i % 6 == 5:
            for bsz in (32, 2):  # small batches: some with no next obs aside
                want, got = ref.sample(bsz), buf.sample(bsz)
                assert set(got) == set(want)
                for k in want:
                    np.testing.assert_array_equal(host(got[k]), want[k], err_msg=k)
                seen_aside.add(_aside(buf, got.indices))
    assert seen_aside == {False, True}  # batches with and without patched next obs
    clone = pickle.loads(pickle.dumps(buf))
    rb.save(buf, tmp_path / "b")
    loaded = rb.load(tmp_path / "b")
    for x in (clone, loaded):
        x.store.path.packed = buf.store.path.packed
    for _ in range(2):
        want = ref.sample(64)
        for other in (buf, clone, loaded):
            got = other.sample(64)
            assert got["indices"].device == buf.store.path.device
            for k in want:
                np.testing.assert_array_equal(host(got[k]), want[k], err_msg=k)


@pytest.mark.parametrize("lanes", [1, 3])
def test_device_draws_are_uniform_over_live_steps(lanes: int) -> None:
    """``sample_fn`` draws on the device: chi-square of key counts against uniform over
    every live step, lanes of unequal length (writes to some lanes only), after the ring
    wrapped."""
    buf = device_buffer("torch", capacity=20 * lanes, lanes=lanes, seed=3)
    data = steps(np.random.default_rng(3), lanes, 45)
    for i, kw in enumerate(data):
        ids = list(range(lanes)) if i < 25 else [0]
        buf.add(**{k: ({n: v[ids] for n, v in x.items()} if isinstance(x, dict) else x[ids])
                   for k, x in kw.items()}, env_ids=ids)
    assert_uniform_keys(buf, 40)


def assert_uniform_keys(buf: rb.ReplayBuffer, calls: int) -> None:
    """``calls`` device draws (``sample_fn``) of 1000 keys: only live steps, and a
    chi-square against uniform over every live step."""
    t = buf.table
    live = np.concatenate([
        (np.arange(w - c, w) * t.lanes + lane)
        for lane, (w, c) in enumerate(zip(t.written.tolist(), t.counts.tolist(), strict=True))])
    fn = buf.sample_fn(1000)
    draws = np.concatenate([host(fn()["indices"]).copy() for _ in range(calls)])
    assert set(draws.tolist()) <= set(live.tolist())
    counts = np.array([np.count_nonzero(draws == k) for k in live])
    expected = len(draws) / len(live)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < chi2_critical(len(live) - 1)


# aten ops that only make a new view or allocate (no kernel on a GPU)
_NO_KERNEL = {"view", "slice", "select", "as_strided", "unsqueeze", "squeeze", "expand",
              "detach", "alias", "lift_fresh", "unbind", "t", "transpose", "permute",
              "empty", "empty_strided", "resize_", "_reshape_alias"}


class _Launches(TorchDispatchMode):
    """Counts the aten ops that would launch a kernel on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if func.overloadpacket.__name__ not in _NO_KERNEL:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _aside(buf: rb.ReplayBuffer, keys: Any) -> bool:
    """Whether any of ``keys`` has its next observation in the side store (host links)."""
    t = buf.table
    return bool((t.link.reshape(-1)[t.slots_of(host(keys))] > 0).any())


@pytest.mark.parametrize(("lanes", "env_ids", "packed"), [
    (1, False, False), (3, False, False), (3, True, False), (1, False, True),
    (3, True, True)])
def test_a_device_sample_launches_few_kernels(lanes: int, env_ids: bool,
                                              packed: bool) -> None:
    """On a GPU each torch op is a kernel launch (10 to 18 us of host time each on the
    H200 of docs/benchmarks.md), so the eager ``sample(256)`` of the benchmark's fields
    (obs f32[17], action f32[6], reward, flags: two dtype groups) is held to a kernel
    budget: one gather per dtype group, and where a next observation is kept aside (an
    episode end, each lane's newest step) two more for the observation field; on a GPU
    one copy more, the packed host draw (on the CPU the host arrays are wrapped, no
    copy; ``packed`` forces a GPU's route, whose copy to the CPU is a no-op: its unpacked
    views launch nothing). It was 21 kernels, then 11 with device draws (plus a mirror
    upload after each write)."""
    buf = rb.ReplayBuffer(3000, num_envs=lanes, seed=7, storage="torch", device="cpu")
    buf.store.path.packed = packed
    rng = np.random.default_rng(7)
    cur = rng.normal(size=(lanes, 17)).astype(np.float32)  # each lane's observation
    seen_aside = set()
    for i in range(400):
        ids = [i % lanes] if env_ids and i > 200 else list(range(lanes))
        k = len(ids)
        nxt = rng.normal(size=(k, 17)).astype(np.float32)
        term = rng.random(k) < 0.01
        buf.add(obs=cur[ids], action=rng.normal(size=(k, 6)).astype(np.float32),
                reward=rng.normal(size=k).astype(np.float32), next_obs=nxt,
                terminated=term, truncated=np.zeros(k, bool), env_ids=ids)
        cur[ids] = np.where(term[:, None], rng.normal(size=(k, 17)), nxt)  # resets
        if i % 20 == 19:
            with _Launches() as seen:
                b = buf.sample(256 if i > 100 else 4)
            aside = _aside(buf, b.indices)
            seen_aside.add(aside)
            assert len(seen.ops) == 2 + 2 * aside, seen.ops
    assert seen_aside == {False, True}  # both budgets were checked


@pytest.mark.parametrize("packed", [False, True])
def test_a_device_per_sample_launches_a_bounded_number_of_kernels(packed: bool) -> None:
    """Device PER draws on the host tree, so a ``sample(256)`` launches what the gather
    needs: one gather per dtype group (two) and two where a next observation is kept
    aside, plus on a GPU the packed copy of keys, slots, weights, probabilities and kept
    next observations: 2 or 4 here (a device sum tree took 73, device link lookups 8);
    ``update_priorities`` checks on the host (two)."""
    buf = rb.ReplayBuffer(100_000, seed=0, storage="torch", device="cpu",
                          sampler=rb.PrioritizedSampler())
    buf.store.path.packed = packed  # True: a GPU's route (see the uniform test)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(20_001, 17)).astype(np.float32)
    buf.extend(obs=obs[:-1], next_obs=obs[1:],
               action=rng.normal(size=(20_000, 6)).astype(np.float32),
               reward=np.zeros(20_000, np.float32), terminated=rng.random(20_000) < 0.001,
               truncated=np.zeros(20_000, bool))
    td = torch.rand(256) + 0.01
    seen_aside = set()
    for _ in range(12):
        with _Launches() as seen:
            b = buf.sample(256)
        with _Launches() as updated:
            buf.update_priorities(b.indices, td)
        aside = _aside(buf, b.indices)
        seen_aside.add(aside)
        assert len(seen.ops) == 2 + 2 * aside, seen.ops
        assert len(updated.ops) <= 2, updated.ops
    assert seen_aside == {False, True}


def test_save_load_and_pickle_give_the_identical_next_sample(tmp_path: Path) -> None:
    buf = device_buffer("torch", capacity=60, seed=4)
    for kw in steps(np.random.default_rng(4), 3, 30):
        buf.add(**kw)
    buf.sample(8)
    buf.sample_fn(8)()  # the device generator exists and has advanced
    rb.save(buf, tmp_path / "b")
    clone = pickle.loads(pickle.dumps(buf))
    state = buf.state_dict()
    assert "device_rng" in state
    want = buf.sample(16)
    fresh = device_buffer("torch", capacity=60, seed=99)
    fresh.load_state_dict(state)
    # the same state, the same next batches: eager (host draws) and sample_fn (the saved
    # device generator; each copy builds its static batch from the same state)
    fns = []
    for other in (rb.load(tmp_path / "b"), clone, fresh):
        got = other.sample(16)
        for k in want:
            np.testing.assert_array_equal(host(got[k]), host(want[k]), err_msg=k)
        fns.append({k: host(v).copy() for k, v in other.sample_fn(8)().items()})
    for got_fn in fns[1:]:
        for k in fns[0]:
            np.testing.assert_array_equal(got_fn[k], fns[0][k], err_msg=k)


def test_same_seed_same_stream_and_host_fallbacks() -> None:
    a, b = device_buffer("torch", seed=5), device_buffer("strict", seed=5)
    ref = rb.ReplayBuffer(96, num_envs=3, seed=5)
    data = steps(np.random.default_rng(5), 3, 50)
    for kw in data:
        for x in (a, b, ref):
            x.add(**kw)
    for _ in range(3):  # eager samples: numpy storage's keys, whatever the backend
        want = ref.sample(32)["indices"]
        np.testing.assert_array_equal(host(a.sample(32)["indices"]), want)
        np.testing.assert_array_equal(host(b.sample(32)["indices"]), want)
    # replace=False draws on the host: the numpy buffer's keys
    for x in (a, ref):
        x.rng.bit_generator.state = np.random.default_rng(0).bit_generator.state
    np.testing.assert_array_equal(host(a.sample(16, replace=False)["indices"]),
                                  ref.sample(16, replace=False)["indices"])
    # n-step draws on the host too (same samples as numpy storage)
    n1 = device_buffer("strict", seed=6, n_step=3)
    n2 = rb.ReplayBuffer(96, num_envs=3, seed=6, n_step=3)
    for kw in data:
        n1.add(**kw)
        n2.add(**kw)
    x, y = n1.sample(16), n2.sample(16)
    for k in y:
        np.testing.assert_array_equal(host(x[k]), y[k], err_msg=k)


def test_errors_come_from_the_host_path() -> None:
    buf = device_buffer("strict")
    with pytest.raises(rb.EmptyBufferError):
        buf.sample(4)
    for kw in steps(np.random.default_rng(6), 3, 5):
        buf.add(**kw)
    with pytest.raises(rb.ConfigError):
        buf.sample(0)
    # the message names the storage, not an object's repr ("<...NumpyBackend object at 0x...>")
    with pytest.raises(rb.ConfigError, match=r'sample_fn: this buffer\'s storage \("numpy"\)'):
        rb.ReplayBuffer(8).sample_fn(4)
    host_draws = rb.ReplayBuffer(8, storage=rb.TorchBackend("cpu", draws="host"))
    with pytest.raises(rb.ConfigError, match=r'storage \("torch"\) does not draw') as err:
        host_draws.sample_fn(4)
    assert " object at 0x" not in str(err.value)
    with pytest.raises(rb.ConfigError, match="positive int"):
        buf.sample_fn(-1)
    with pytest.raises(rb.ConfigError, match="draws="):
        rb.TorchBackend("cpu", draws="gpu")


@pytest.mark.parametrize("kind", STORAGES)
def test_sample_fn_writes_static_tensors(kind: str) -> None:
    ref = rb.ReplayBuffer(600, num_envs=3, seed=7)
    buf = device_buffer(kind, capacity=600, seed=7)
    data = steps(np.random.default_rng(7), 3, 200)
    for kw in data[:10]:
        ref.add(**kw)
        buf.add(**kw)
    fn = buf.sample_fn(32)
    first = fn()
    ptrs = {k: v.data_ptr() for k, v in first.items()}
    for kw in data[10:]:  # writes (and side store growth) between calls
        ref.add(**kw)
        buf.add(**kw)
        b = fn()
        if kind == "cuda":
            torch.cuda.synchronize()
        check_against(ref, b)
    assert {k: v.data_ptr() for k, v in fn().items()} == ptrs  # the same tensors throughout
    assert buf.table.side_capacity > 64  # the side store grew: a CUDA graph was recaptured
    with pytest.raises(rb.ConfigError, match="no device path"):
        buf.sampler = rb.PrioritizedSampler()
        fn()


@cuda
def test_cuda_sample_makes_no_sync() -> None:  # pragma: no cover - needs a GPU
    buf = device_buffer("cuda", capacity=3000, seed=8)
    data = steps(np.random.default_rng(8), 3, 200)
    for kw in data:
        buf.add(**kw)
    buf.sample(256)
    fn = buf.sample_fn(256)
    fn()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            buf.sample(256)
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
