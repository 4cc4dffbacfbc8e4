"""One packed copy to the device (replaybank.transfer): every field arrives bitwise equal,
aligned, typed and shaped as its array, through ``Batch.to_torch`` and the prefetcher.

The GPU copy itself needs CUDA (the cuda-marked tests of test_torch_storage and
test_prefetch); here the packed buffer goes to the CPU, or to torch's ``meta`` device,
which has no data but checks every view's dtype and shape."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

torch = pytest.importorskip("torch")

import replaybank as rb  # noqa: E402
from replaybank.transfer import ALIGN, PackedLayout, to_device  # noqa: E402

DTYPES = [np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64,
          np.uint8, np.bool_, np.complex64]


def odd_arrays(rng: np.random.Generator) -> dict[str, Any]:
    """Arrays as users and samplers hand them over: big-endian, strided, read-only,
    0-d, empty, bool, wide and narrow dtypes."""
    base = rng.normal(size=(8, 6))
    ro = rng.integers(0, 9, 5)
    ro.flags.writeable = False
    return {"obs": base.astype(np.float32), "big": base.astype(">f8"),
            "strided": base[::2, ::3], "flags": rng.random(8) < 0.5, "ro": ro,
            "scalar": np.array(3.5), "empty": np.zeros((0, 4), np.int16),
            "half": base[:, 0].astype(np.float16), "byte": np.arange(7, dtype=np.uint8)}


def check_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for name, arr in want.items():
        t = got[name]
        assert tuple(t.shape) == arr.shape, name
        assert t.dtype == torch.from_numpy(np.empty(0, arr.dtype.newbyteorder("="))).dtype
        np.testing.assert_array_equal(t.numpy(), arr, err_msg=name)


def test_every_field_arrives_bitwise_equal_and_aligned() -> None:
    arrays = odd_arrays(np.random.default_rng(0))
    out = to_device(torch, arrays, torch.device("cpu"))
    assert out is not None
    check_equal(out, arrays)
    layout = PackedLayout.of(torch, arrays)
    assert layout is not None
    assert all(off % ALIGN == 0 for off in layout.offsets)
    # one allocation: every field is a view of the same storage
    ptrs = {t.untyped_storage().data_ptr() for t in out.values()}
    assert len(ptrs) == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(DTYPES),
                          hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)),
                min_size=1, max_size=6), st.integers(0, 2**32 - 1))
def test_random_layouts_round_trip(fields: list[tuple[Any, tuple[int, ...]]],
                                   seed: int) -> None:
    rng = np.random.default_rng(seed)
    arrays = {f"f{i}": np.asarray(rng.normal(size=shape) * 50).astype(dt)
              for i, (dt, shape) in enumerate(fields)}
    out = to_device(torch, arrays, torch.device("cpu"))
    assert out is not None
    check_equal(out, arrays)


def test_layouts_refuse_what_torch_cannot_hold_and_fit_only_their_own() -> None:
    assert PackedLayout.of(torch, {"s": np.array(["a", "b"])}) is None
    assert PackedLayout.of(torch, {"o": np.array([object()])}) is None
    assert PackedLayout.of(torch, {"t": torch.zeros(2)}) is None
    assert to_device(torch, {"s": np.array(["a"])}, torch.device("cpu")) is None
    arrays = {"a": np.zeros((4, 2), np.float32), "b": np.zeros(4, bool)}
    layout = PackedLayout.of(torch, arrays)
    assert layout is not None and layout.fits(arrays)
    assert layout.fits({"a": np.zeros((4, 2), ">f4"), "b": np.ones(4, bool)})  # byte order
    assert not layout.fits({"b": arrays["b"], "a": arrays["a"]})  # order
    assert not layout.fits({"a": np.zeros((5, 2), np.float32), "b": arrays["b"]})  # shape
    assert not layout.fits({"a": np.zeros((4, 2), np.float64), "b": arrays["b"]})  # dtype
    assert not layout.fits({"a": arrays["a"]})  # fields


def filled(**kw: Any) -> rb.ReplayBuffer:
    """Continuous trajectories with dict observations, int actions, float64 rewards."""
    buf = rb.ReplayBuffer(64, num_envs=2, seed=0, **kw)
    rng = np.random.default_rng(1)
    obs = {"vec": rng.normal(size=(2, 3)), "img": rng.integers(0, 255, (2, 2, 2))}
    for t in range(30):
        nxt = {"vec": rng.normal(size=(2, 3)), "img": rng.integers(0, 255, (2, 2, 2))}
        buf.add(obs=obs, action=rng.integers(0, 4, 2), reward=rng.normal(size=2),
                next_obs=nxt, terminated=[t % 13 == 12, False], truncated=[False, False])
        obs = nxt
    return buf


def test_to_torch_on_another_device_takes_the_packed_copy() -> None:
    b = filled().sample(16)
    meta = b.to_torch("meta")  # no data on the meta device: dtypes and shapes only
    cpu = b.to_torch()
    for name in b:
        assert meta[name].device.type == "meta", name
        assert meta[name].dtype == cpu[name].dtype and meta[name].shape == cpu[name].shape
    # views of one copied buffer, at the layout's byte offsets (a copy per field: all 0)
    layout = PackedLayout.of(torch, dict(b))
    assert layout is not None
    assert [t.storage_offset() * t.element_size() for t in meta.values()] \
        == list(layout.offsets)
    seq = filled().sample_sequences(4, 5)
    meta_seq = seq.to_torch("meta")
    assert isinstance(meta_seq, rb.SequenceBatch)
    for name in seq:
        assert meta_seq[name].dtype == seq.to_torch()[name].dtype, name


def test_prefetched_batches_keep_their_values_after_later_batches() -> None:
    ref, buf = filled(), filled()
    with buf.prefetcher(8, device="cpu", depth=2) as pf:
        got = [next(pf) for _ in range(10)]  # buffers of later batches must not alias
    for b in got:
        want = ref.sample(8)
        for name in want:
            np.testing.assert_array_equal(b[name].numpy(), want[name], err_msg=name)


def test_prefetcher_to_another_device_takes_the_packed_copy() -> None:
    buf = filled()
    with buf.prefetcher(8, device="meta", depth=2) as pf:
        got = [next(pf) for _ in range(3)]
    want = filled().sample(8)
    layout = PackedLayout.of(torch, dict(want))
    assert layout is not None
    for b in got:
        assert list(b) == list(want)
        for name, t in b.items():
            assert t.device.type == "meta" and t.shape == want[name].shape, name
        assert [t.storage_offset() * t.element_size() for t in b.values()] \
            == list(layout.offsets)


def test_pinned_stager_to_another_device_takes_the_packed_copy() -> None:
    from replaybank.integrations.torch import PinnedStager

    buf = filled()
    stager = PinnedStager("meta")
    for _ in range(3):
        b = buf.sample(8)
        out = stager(b)
        assert isinstance(out, rb.Batch) and list(out) == list(b)
        layout = PackedLayout.of(torch, dict(b))
        assert layout is not None
        assert [t.storage_offset() * t.element_size() for t in out.values()] \
            == list(layout.offsets)
    cpu = PinnedStager("cpu")(b)  # the CPU wraps the arrays
    for name in b:
        np.testing.assert_array_equal(cpu[name].numpy(), b[name], err_msg=name)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("pin", [False, True])
def test_packed_copies_to_cuda_are_bitwise_equal(pin: bool) -> None:  # pragma: no cover
    from replaybank.integrations.torch import PinnedStager

    rng = np.random.default_rng(3)
    arrays = odd_arrays(rng)
    out = to_device(torch, arrays, torch.device("cuda"), pin=pin)
    assert out is not None
    torch.cuda.synchronize()
    check_equal({k: v.cpu() for k, v in out.items()}, arrays)
    buf, stager = filled(), PinnedStager("cuda")
    kept = []
    for _ in range(6):  # the pinned buffer is reused: each batch must arrive intact
        b = buf.sample(16)
        kept.append((b, stager(b), b.to_torch("cuda", pin_memory=pin)))
    torch.cuda.synchronize()
    for b, staged, moved in kept:
        for name in b:
            np.testing.assert_array_equal(staged[name].cpu().numpy(), b[name], err_msg=name)
            np.testing.assert_array_equal(moved[name].cpu().numpy(), b[name], err_msg=name)
