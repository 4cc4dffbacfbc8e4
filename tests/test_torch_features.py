"""Torch storage x every feature of numpy storage, with host conversions refused (issue 17).

Each case builds a numpy-storage buffer and a torch-storage buffer with the same seed, feeds
both the same steps (several lanes, episode ends, out-of-order data, ring wrap-around) and
checks that they sample the same batches (the host generator draws the keys in both:
``draws="host"``; device draws are tested in ``tests/test_device_sampling.py``, hindsight
relabelling in ``tests/test_torch_her.py``).
The torch case runs twice: on plain CPU tensors, and on :class:`~tests.strict_device.
StrictBackend` tensors, which raise on every host conversion, so a device-to-host copy in
``add``/``extend``/``sample``/``sample_sequences`` fails on this CPU-only machine just as
it would fail (or stall) on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import replaybank as rb  # noqa: E402
from replaybank.device.backend import TorchBackend  # noqa: E402
from tests.strict_device import HostSyncError, StrictBackend, allow_syncs, host, strict  # noqa: E402

STORAGES = ["torch", "strict"]


def backend(kind: str) -> Any:
    """Torch storage drawing keys on the host: the same samples as numpy storage."""
    return StrictBackend("cpu", draws="host") if kind == "strict" else \
        TorchBackend("cpu", draws="host")


def steps(rng: np.random.Generator, lanes: int, n: int) -> list[dict[str, Any]]:
    """``n`` steps of ``lanes`` envs: dict obs, episode ends, out-of-order jumps."""
    out = []
    obs = {"pix": rng.integers(0, 255, (lanes, 2, 3), dtype=np.uint8),
           "vec": rng.normal(size=(lanes, 4)).astype(np.float32)}
    for _ in range(n):
        nxt = {"pix": rng.integers(0, 255, (lanes, 2, 3), dtype=np.uint8),
               "vec": rng.normal(size=(lanes, 4)).astype(np.float32)}
        out.append(dict(obs=obs, action=rng.integers(0, 4, lanes), reward=rng.normal(size=lanes),
                        next_obs=nxt, terminated=rng.random(lanes) < 0.08,
                        truncated=rng.random(lanes) < 0.04,
                        logp=rng.normal(size=lanes).astype(np.float64)))
        if rng.random() < 0.1:
            nxt = {k: v.copy() + 1 for k, v in nxt.items()}
        obs = nxt
    return out


def flat_steps(rng: np.random.Generator, lanes: int, n: int) -> list[dict[str, Any]]:
    """Steps with a flat float observation (frame stacks, sequences)."""
    out = []
    obs = rng.normal(size=(lanes, 3)).astype(np.float32)
    for _ in range(n):
        nxt = rng.normal(size=(lanes, 3)).astype(np.float32)
        out.append(dict(obs=obs, action=rng.integers(0, 4, lanes),
                        reward=rng.normal(size=lanes).astype(np.float32), next_obs=nxt,
                        terminated=rng.random(lanes) < 0.06, truncated=rng.random(lanes) < 0.03))
        obs = nxt
    return out


def same(a: Any, b: Any) -> None:
    assert set(a) == set(b), (sorted(a), sorted(b))
    for k in a:
        np.testing.assert_array_equal(host(a[k]), host(b[k]), err_msg=k)


def feed(bufs: list[Any], data: list[dict[str, Any]]) -> None:
    for kw in data:
        for b in bufs:
            b.add(**kw)


def pair(kind: str, make: Callable[..., Any]) -> tuple[Any, Any]:
    return make("numpy"), make(backend(kind))


@pytest.fixture(params=STORAGES)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# ---------------------------------------------------------------------- the matrix
@pytest.mark.parametrize("n_step", [1, 3])
def test_lanes_and_nstep(kind: str, n_step: int) -> None:
    ref, tb = pair(kind, lambda s: rb.ReplayBuffer(96, num_envs=3, seed=7, n_step=n_step,
                                                   storage=s))
    feed([ref, tb], steps(np.random.default_rng(0), 3, 70))  # wraps around
    for _ in range(3):
        same(ref.sample(64), tb.sample(64))
    b = tb.sample(8)
    assert isinstance(b["obs/vec"], torch.Tensor) and b["logp"].dtype == torch.float64


def test_env_ids_and_extend(kind: str) -> None:
    ref, tb = pair(kind, lambda s: rb.ReplayBuffer(60, num_envs=3, seed=1, storage=s))
    rng = np.random.default_rng(1)
    data = steps(rng, 3, 30)
    for i, kw in enumerate(data):
        ids = [i % 3, (i + 1) % 3]
        part = {k: ({n: v[ids] for n, v in x.items()} if isinstance(x, dict) else x[ids])
                for k, x in kw.items()}
        for b in (ref, tb):
            b.add(**part, env_ids=ids)
    ext = steps(rng, 3, 12)
    stacked = {k: ({n: np.stack([d[k][n] for d in ext]) for n in ext[0][k]}
                   if isinstance(ext[0][k], dict) else np.stack([d[k] for d in ext]))
               for k in ext[0]}
    for b in (ref, tb):
        b.extend(**stacked)
    for _ in range(3):
        same(ref.sample(32), tb.sample(32))


def test_frame_stack(kind: str) -> None:
    ref, tb = pair(kind, lambda s: rb.ReplayBuffer(80, num_envs=2, seed=3, frame_stack=4,
                                                   storage=s))
    rng = np.random.default_rng(2)  # frame stacks: the caller passes stacked observations
    frames = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(4)]
    for t in range(50):
        new = rng.normal(size=(2, 3)).astype(np.float32)
        st, nx = np.stack(frames[-4:], 1), np.stack([*frames[-3:], new], 1)
        kw = dict(obs=st, action=np.array([t % 3, 1]), reward=np.ones(2, np.float32),
                  next_obs=nx, terminated=np.array([t % 11 == 10, False]),
                  truncated=np.zeros(2, bool))
        for b in (ref, tb):
            b.add(**kw)
        frames = [*frames[-3:], new] if t % 11 != 10 else \
            [rng.normal(size=(2, 3)).astype(np.float32)] * 4
    for _ in range(3):
        same(ref.sample(24), tb.sample(24))


@pytest.mark.parametrize("boundary", ["stop", "cross"])
def test_sequences(kind: str, boundary: str) -> None:
    ref, tb = pair(kind, lambda s: rb.ReplayBuffer(120, num_envs=3, seed=4, storage=s))
    feed([ref, tb], flat_steps(np.random.default_rng(3), 3, 60))
    for strict_windows in (True, False):
        a = ref.sample_sequences(8, 5, episode_boundary=boundary, strict=strict_windows,
                                 burn_in=2)
        b = tb.sample_sequences(8, 5, episode_boundary=boundary, strict=strict_windows,
                                burn_in=2)
        same(a, b)


def test_prioritized(kind: str) -> None:
    ref, tb = pair(kind, lambda s: rb.ReplayBuffer(
        90, num_envs=3, seed=5, storage=s, sampler=rb.PrioritizedSampler(alpha=0.7, beta=0.5)))
    feed([ref, tb], steps(np.random.default_rng(4), 3, 40))
    for i in range(3):
        a, b = ref.sample(32), tb.sample(32)
        same(a, b)
        p = np.abs(np.random.default_rng(i).normal(size=32)) + 0.01
        assert ref.update_priorities(a.indices, p) == tb.update_priorities(b.indices, p)


def test_recent(kind: str) -> None:
    ref, tb = pair(kind, lambda s: rb.ReplayBuffer(
        90, num_envs=3, seed=6, storage=s, sampler=rb.RecentSampler(eta=0.9, c_min=10)))
    feed([ref, tb], steps(np.random.default_rng(5), 3, 50))
    for k in range(3):
        same(ref.sample(16, update=k, num_updates=3), tb.sample(16, update=k, num_updates=3))


def test_save_load(kind: str, tmp_path: Path) -> None:
    make = lambda s: rb.ReplayBuffer(  # noqa: E731
        60, num_envs=3, seed=8, n_step=2, storage=s,
        sampler=rb.PrioritizedSampler(alpha=0.6))
    ref, tb = pair(kind, make)
    feed([ref, tb], steps(np.random.default_rng(6), 3, 30))
    with allow_syncs(10**6):  # saving copies the tensors to the host: allowed there
        rb.save(tb, tmp_path / "t")
    tb2 = rb.load(tmp_path / "t", storage=backend(kind))
    a, b = ref.sample(16), tb.sample(16)
    same(a, b)
    same(b, tb2.sample(16))  # the identical next sample after the round trip
    same(ref.sample(16), tb2.sample(16))


# ---------------------------------------------------------------------- the trap itself
def test_strict_backend_refuses_host_conversions() -> None:
    """The stand-in fails on exactly the calls a real device would fail on (or sync)."""
    t = strict(torch.arange(6.0))
    for bad in (lambda: np.asarray(t), t.numpy, lambda: t[0].item(), t.tolist, t.cpu,
                lambda: bool(t[0] > 1), t.nonzero, lambda: t[t > 2], lambda: t.to("cpu"),
                lambda: int(t[0]), lambda: float(t.sum())):
        with pytest.raises(HostSyncError):
            bad()
    u = (t * 2).index_select(0, torch.tensor([1, 2]))  # device ops are fine
    assert type(u).__name__ == "StrictTensor" and host(u).tolist() == [2.0, 4.0]
    with allow_syncs(1) as box:
        assert t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        with pytest.raises(HostSyncError):
            t.tolist()
    assert box[1] == 1
