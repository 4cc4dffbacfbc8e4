"""Priorities from torch (issue 17, item 5): ``update_priorities`` and
``update_sequence_priorities`` take tensors on any device, requiring grad or not, with one
device-to-host transfer at most (counted on :class:`~tests.strict_device.StrictTensor`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import replaybank as rb  # noqa: E402
from replaybank.buffers.priorities import to_host  # noqa: E402
from tests.strict_device import HostSyncError, allow_syncs, strict  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def filled(storage: Any = "numpy", seed: int = 0) -> rb.ReplayBuffer:
    buf = rb.ReplayBuffer(64, num_envs=2, seed=seed, storage=storage,
                          sampler=rb.PrioritizedSampler(alpha=0.8))
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(2, 3)).astype(np.float32)
    for t in range(40):
        nxt = rng.normal(size=(2, 3)).astype(np.float32)
        buf.add(obs=obs, action=[0, 1], reward=[1.0, 0.0], next_obs=nxt,
                terminated=[t % 9 == 8, False], truncated=[False, t % 13 == 12])
        obs = nxt
    return buf


def priorities_of(buf: rb.ReplayBuffer) -> np.ndarray:
    return np.asarray(buf.sampler.state_dict()["priorities"], dtype=np.float64)


def as_tensors(kind: str, keys: np.ndarray, p: np.ndarray) -> tuple[Any, Any]:
    k, q = torch.from_numpy(keys.copy()), torch.from_numpy(p.astype(np.float32))
    if kind == "grad":
        q = (q * torch.ones_like(q, requires_grad=True))  # a non-leaf that requires grad
        assert q.requires_grad
    if kind == "strict":
        k, q = strict(k), strict(q)
    if kind == "cuda":
        k, q = k.cuda(), q.cuda()
    if kind == "half":
        q = q.to(torch.bfloat16)
    return k, q


KINDS = ["cpu", "grad", "strict", "half", pytest.param("cuda", marks=cuda)]


@pytest.mark.parametrize("kind", KINDS)
def test_update_priorities_takes_tensors(kind: str) -> None:
    ref, buf = filled(), filled()
    b = buf.sample(16)
    p = np.abs(np.random.default_rng(1).normal(size=16)).astype(np.float32) + 0.1
    if kind == "half":
        p = torch.from_numpy(p).to(torch.bfloat16).to(torch.float32).numpy()
    keys, q = as_tensors(kind, b.indices, p)
    with allow_syncs(1) as box:  # indices and priorities: one transfer together
        n = buf.update_priorities(keys, q)
    assert box[1] <= 1
    assert n == ref.update_priorities(b.indices, p)
    np.testing.assert_array_equal(priorities_of(buf), priorities_of(ref))


def test_update_priorities_strict_tensor_needs_exactly_one_transfer() -> None:
    buf = filled()
    b = buf.sample(8)
    keys, q = as_tensors("strict", b.indices, np.ones(8))
    with pytest.raises(HostSyncError):  # no budget: the transfer is seen
        buf.update_priorities(keys, q)
    with allow_syncs(1) as box:
        buf.update_priorities(keys, q)
    assert box[1] == 1
    with allow_syncs(1) as box:  # numpy indices, tensor priorities: one transfer
        buf.update_priorities(b.indices, q)
    assert box[1] == 1


def test_bad_tensor_priorities_are_refused_and_change_nothing() -> None:
    buf = filled()
    b = buf.sample(4)
    before = priorities_of(buf).copy()
    with pytest.raises(rb.DtypeError, match="negative, NaN or infinite"):
        buf.update_priorities(torch.from_numpy(b.indices),
                              torch.tensor([1.0, float("nan"), 1.0, 1.0], requires_grad=True))
    with pytest.raises(rb.DtypeError, match="integer indices"):
        buf.update_priorities(torch.tensor([0.0, 1.0, 2.0, 3.0]), torch.ones(4))
    with pytest.raises(rb.ShapeError, match="4 indices but 3 priorities"):
        buf.update_priorities(torch.from_numpy(b.indices), torch.ones(3))
    np.testing.assert_array_equal(priorities_of(buf), before)


@pytest.mark.parametrize("kind", ["cpu", "grad", "strict", pytest.param("cuda", marks=cuda)])
def test_update_sequence_priorities_takes_tensors(kind: str) -> None:
    ref, buf = filled(), filled()
    sb = buf.sample_sequences(4, 3)
    td = np.random.default_rng(2).normal(size=(4, 3)).astype(np.float32)
    starts, t = as_tensors(kind, sb.starts, td)
    mask = torch.from_numpy(np.asarray(sb.mask))
    if kind == "strict":
        mask = strict(mask)
    if kind == "cuda":
        mask = mask.cuda()
    with allow_syncs(1) as box:
        n = buf.update_sequence_priorities(starts, t, mask=mask)
    assert box[1] <= 1
    assert n == ref.update_sequence_priorities(sb.starts, td, mask=np.asarray(sb.mask))
    np.testing.assert_array_equal(priorities_of(buf), priorities_of(ref))


def test_to_host_packs_one_device_into_one_copy() -> None:
    k = strict(torch.tensor([5, 7, 9]))
    p = strict(torch.tensor([0.5, 1.5, 2.5], dtype=torch.float16))
    m = strict(torch.tensor([True, False, True]))
    with allow_syncs(1) as box:
        hk, hp, hm, other = to_host(k, p, m, [1, 2])
    assert box[1] == 1
    assert hk.dtype == np.int64 and hk.tolist() == [5, 7, 9]
    assert hp.dtype == np.float64 and hp.tolist() == [0.5, 1.5, 2.5]
    assert hm.dtype == np.bool_ and hm.tolist() == [True, False, True]
    assert other == [1, 2]
