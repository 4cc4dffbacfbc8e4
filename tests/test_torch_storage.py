"""Torch device storage, Batch.to_torch, and torch staying optional."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import replaybank as rb  # noqa: E402
from replaybank.device.backend import TorchBackend, torch_dtype  # noqa: E402
from replaybank.errors import ConfigError, DtypeError, MissingDependencyError  # noqa: E402
from replaybank.storage.backends import make_backend  # noqa: E402
from tests.strict_device import StrictBackend, host  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def fill(bufs: list[Any], steps: int, lanes: int, seed: int = 0) -> None:
    """Same random stream of steps (episode ends, discontinuities) into every buffer."""
    rng = np.random.default_rng(seed)
    obs = {"pix": rng.integers(0, 255, (lanes, 2, 3), dtype=np.uint8),
           "vec": rng.normal(size=(lanes, 4)).astype(np.float32)}
    for _ in range(steps):
        nxt = {"pix": rng.integers(0, 255, (lanes, 2, 3), dtype=np.uint8),
               "vec": rng.normal(size=(lanes, 4)).astype(np.float32)}
        term = rng.random(lanes) < 0.1
        trunc = rng.random(lanes) < 0.05
        kw = dict(obs=obs, action=rng.integers(0, 4, lanes), reward=rng.normal(size=lanes),
                  next_obs=nxt, terminated=term, truncated=trunc,
                  logp=rng.normal(size=lanes).astype(np.float64))
        for b in bufs:
            b.add(**kw)
        if rng.random() < 0.1:  # out-of-order data: the next obs does not continue
            nxt = {k: v.copy() + 1 for k, v in nxt.items()}
        obs = nxt


def as_np(x: Any) -> Any:
    return host(x)


@pytest.mark.parametrize("device", [*DEVICES, "strict"])
@pytest.mark.parametrize("n_step", [1, 3])
def test_torch_storage_samples_what_numpy_storage_samples(device: str, n_step: int) -> None:
    """"strict": CPU tensors that refuse every host conversion (tests/strict_device.py),
    so that converting device data on the host fails here as it does on a GPU."""
    ref = rb.ReplayBuffer(96, num_envs=3, seed=7, n_step=n_step)
    # host draws: the same keys as numpy storage (device draws: tests/test_device_sampling.py)
    backend = StrictBackend("cpu", draws="host") if device == "strict" else \
        TorchBackend(device, draws="host")
    tb = rb.ReplayBuffer(96, num_envs=3, seed=7, n_step=n_step, storage=backend)
    device = "cpu" if device == "strict" else device
    fill([ref, tb], 70, 3)  # wraps around
    assert len(ref) == len(tb)
    for _ in range(3):
        a, b = ref.sample(64), tb.sample(64)
        assert set(a) == set(b)
        for k in a:
            np.testing.assert_array_equal(as_np(a[k]), as_np(b[k]), err_msg=k)
    b = tb.sample(8)
    device_fields = ["obs/pix", "obs/vec", "next_obs/vec", "action", "logp", "terminated"]
    if n_step > 1:  # n-step returns are summed on the device: no host round trip
        device_fields += ["reward", "discount"]
    for name in device_fields:
        assert isinstance(b[name], torch.Tensor) and b[name].device.type == device
    for name in b:  # the keys a sampler draws on the host too
        assert isinstance(b[name], torch.Tensor) and b[name].device.type == device, name
    assert b["obs/pix"].dtype == torch.uint8 and b["logp"].dtype == torch.float64
    assert b.obs["pix"].shape == (8, 2, 3)



@pytest.mark.parametrize("draws", ["device", "host"])
@pytest.mark.parametrize("n_step", [1, 3])
def test_a_torch_storage_batch_lists_its_keys_as_numpy_storage_does(draws: str,
                                                                    n_step: int) -> None:
    """Code that walks a batch (``torch.cat([v.flatten(1) for v in b.obs.values()])``)
    gets the features in the same order whatever the storage: the fields in the order
    they were added, nested dicts kept, not grouped by dtype (the packed device storage
    once listed them by dtype: ``z, a/deep/disc, a/deep/pos, a/flag, image, state``)."""
    def step(t: int) -> dict[str, Any]:  # dtypes interleaved, keys not in sorted order
        return {"z": np.int64(t), "image": np.full((2, 2), t, np.uint8),
                "state": np.full(3, t, np.float32),
                "a": {"flag": np.array([t % 2], np.int8),
                      "deep": {"pos": np.full(2, t, np.float64), "disc": np.int64(t % 5)}}}

    backend = TorchBackend("cpu", draws=draws)
    ref = rb.ReplayBuffer(64, seed=0, n_step=n_step)
    tb = rb.ReplayBuffer(64, seed=0, n_step=n_step, storage=backend)
    for t in range(20):
        for b in (ref, tb):
            b.add(obs=step(t), action=t % 3, reward=1.0, next_obs=step(t + 1),
                  terminated=False, truncated=t % 7 == 6, logp=np.float64(0.5))
    a, b = ref.sample(8), tb.sample(8)
    assert list(b) == list(a)
    assert list(b.obs) == list(a.obs) == ["z", "image", "state", "a"]
    assert list(b.obs["a"]) == ["flag", "deep"] and list(b.obs["a"]["deep"]) == ["pos", "disc"]
    assert list(b.next_obs) == list(a.next_obs)
    assert list(tb.spec) == list(ref.spec)
    if n_step == 1 and draws == "device":  # the fixed-batch path gathers the same way
        assert list(tb.sample_fn(8)()) == list(a)

def _her_reward(achieved: Any, desired: Any, info: Any) -> Any:
    if isinstance(achieved, torch.Tensor):
        return -(achieved - desired).abs().sum(-1)
    return -np.abs(achieved - desired).sum(-1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["one-step", "n-step", "her", "host draws", "sequences"])
def test_every_field_of_a_torch_storage_batch_is_a_tensor(device: str, kind: str) -> None:
    """What the sampler computes on the host (``indices``, ``weights``, ``probabilities``,
    a sequence batch's ``starts``) comes as tensors on the storage's device beside the
    gathered fields, equal to numpy storage's, and a training step uses them as they
    are: a PER loss, ``update_priorities``, ``update_sequence_priorities``."""
    per = {"sampler": rb.PrioritizedSampler(alpha=0.6, beta=0.4)}
    kw: dict[str, Any] = {"n-step": {"n_step": 3, **per}}.get(kind, per)
    storage: Any = TorchBackend(device, draws="host") if kind == "host draws" else "torch"
    dev: dict[str, Any] = {} if kind == "host draws" else {"device": device}
    if kind == "her":
        make = lambda **more: rb.HerReplayBuffer(64, reward_fn=_her_reward, seed=3, **kw,  # noqa: E731
                                                 **more)
    else:
        make = lambda **more: rb.ReplayBuffer(64, seed=3, **kw, **more)  # noqa: E731
    ref, tb = make(), make(storage=storage, **dev)
    for t in range(30):
        goal = {"observation": np.full(2, t, np.float32),
                "achieved_goal": np.full(2, t, np.float32),
                "desired_goal": np.full(2, 9, np.float32)}
        nxt = {k: v + (k != "desired_goal") for k, v in goal.items()}
        obs, next_obs = (goal, nxt) if kind == "her" else (goal["observation"],
                                                           nxt["observation"])
        for b in (ref, tb):
            b.add(obs=obs, action=t % 3, reward=1.0, next_obs=next_obs, terminated=False,
                  truncated=t % 10 == 9)
    if kind == "sequences":
        a, b = ref.sample_sequences(4, 3), tb.sample_sequences(4, 3)
    else:
        a, b = ref.sample(8), tb.sample(8)
    assert set(a) == set(b)
    for name in b:
        assert isinstance(b[name], torch.Tensor) and b[name].device.type == device, name
        if kind != "one-step":  # (one-step batches are drawn on the device: other keys)
            np.testing.assert_array_equal(host(a[name]), host(b[name]), err_msg=name)
    if kind == "sequences":
        assert tb.update_sequence_priorities(b.starts, torch.ones(4, 3, device=device),
                                             mask=b.mask) == 4
        return
    td = torch.ones(8, device=device, requires_grad=True)
    (b.weights * td ** 2).mean().backward()
    assert td.grad is not None
    assert tb.update_priorities(b.indices, td.detach() + 1) == len(np.unique(host(b.indices)))


def test_storage_arrays_are_preallocated_device_tensors() -> None:
    buf = rb.ReplayBuffer(40, num_envs=2, storage="torch", device="cpu", seed=0)
    fill([buf], 5, 2)
    t = buf.table
    assert all(isinstance(a, torch.Tensor) for a in t.arrays.values())
    assert t.arrays["obs/vec"].shape == (20, 2, 4)
    assert isinstance(t.link, np.ndarray) and isinstance(t.written, np.ndarray)
    ptr = t.arrays["obs/vec"].data_ptr()
    fill([buf], 30, 2, seed=1)
    assert t.arrays["obs/vec"].data_ptr() == ptr  # written in place, never reallocated
    assert buf.nbytes() > 0 and buf.metadata()["storage"] == "torch"


def test_gather_moves_only_index_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    be = TorchBackend("cpu")
    arr = be.allocate("x", (5, 2, 3), np.dtype(np.float32))
    be.write(arr, (np.array([1, 4]), np.array([0, 1])), np.ones((2, 3), np.float32))
    moved: list[np.ndarray] = []
    real = torch.from_numpy

    def spy(a: np.ndarray) -> Any:
        moved.append(a)
        return real(a)

    monkeypatch.setattr(torch, "from_numpy", spy)
    out = be.gather(arr, (np.array([4, 1, 0]), np.array([1, 0, 0])))
    assert out.tolist() == [[1.0] * 3, [1.0] * 3, [0.0] * 3]
    assert len(moved) == 1 and moved[0].dtype == np.int64 and moved[0].shape == (3,)


def test_state_dict_round_trip_between_storages() -> None:
    tb = rb.ReplayBuffer(32, num_envs=2, seed=3, storage=TorchBackend("cpu", draws="host"))
    fill([tb], 25, 2)
    nb = rb.ReplayBuffer(32, num_envs=2, seed=0)
    nb.load_state_dict(tb.state_dict())
    a, b = tb.sample(16), nb.sample(16)
    for k in a:
        np.testing.assert_array_equal(as_np(a[k]), as_np(b[k]))
    tb2 = rb.ReplayBuffer(32, num_envs=2, seed=0, storage=TorchBackend("cpu", draws="host"))
    tb2.load_state_dict(nb.state_dict())
    a, b = nb.sample(16), tb2.sample(16)
    for k in a:
        np.testing.assert_array_equal(as_np(a[k]), as_np(b[k]))


@pytest.mark.parametrize("device", ["meta", torch.device("meta")])
def test_a_device_without_data_is_refused_where_the_buffer_is_built(device: Any) -> None:
    """A 'meta' tensor has no values: a torch-storage buffer there was built and filled,
    and its sample served data-less tensors whose first read raised torch's bare
    NotImplementedError. The buffer (or backend) is refused as it is built, naming
    device= and the fix."""
    fix = r"holds shapes, not values.*use device='cpu', 'cuda' or another device"
    named = rf"^device={re.escape(repr(device))}: a 'meta' tensor {fix}"
    with pytest.raises(ConfigError, match=named):
        rb.ReplayBuffer(8, storage="torch", device=device)
    with pytest.raises(ConfigError, match=named):
        TorchBackend(device)
    assert rb.ReplayBuffer(8, storage="torch", device="cpu").backend.name == "torch"


def test_backend_errors() -> None:
    with pytest.raises(ConfigError, match="device='nope'"):
        TorchBackend("nope")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            rb.ReplayBuffer(8, storage="torch", device="cuda")
    with pytest.raises(DtypeError, match="torch storage"):
        torch_dtype("U4")
    assert torch_dtype(np.dtype(">f4")) == torch.float32
    assert make_backend("torch", device="cpu").name == "torch"
    assert repr(TorchBackend(None)) == "TorchBackend(device='cpu')"


def test_resize_keeps_content() -> None:
    be = TorchBackend("cpu")
    a = be.allocate("s", (2, 3), np.dtype(np.int32))
    be.write(a, slice(None), np.arange(6, dtype=np.int32).reshape(2, 3))
    b = be.resize("s", a, 5)
    assert b.shape == (5, 3) and b[:2].flatten().tolist() == list(range(6))
    assert b[2:].abs().sum().item() == 0
    # non-writeable, non-contiguous numpy input
    v = np.arange(6, dtype=np.int32).reshape(3, 2).T
    v.flags.writeable = False
    be.write(b, slice(3, 5), v)
    assert b[3:].tolist() == v.tolist()


def test_to_torch_is_zero_copy_on_cpu() -> None:
    buf = rb.ReplayBuffer(64, seed=0)
    for t in range(20):
        buf.add(obs=np.full(3, t, np.float32), action=t % 2, reward=1.0,
                next_obs=np.full(3, t + 1, np.float32), terminated=False, truncated=False)
    batch = buf.sample(8)
    tb = batch.to_torch()
    assert type(tb) is rb.Batch
    for k in batch:
        arr = batch[k]
        assert tb[k].data_ptr() == arr.ctypes.data, k  # shares memory
        np.testing.assert_array_equal(tb[k].numpy(), arr)
    # to_torch on a batch that already holds tensors keeps them
    assert tb.to_torch()["obs"] is tb["obs"]
    back = tb.numpy()
    assert isinstance(back["obs"], np.ndarray) and back == batch


def test_pinned_stager_cpu_fallback() -> None:
    from replaybank.integrations.torch import PinnedStager

    buf = rb.ReplayBuffer(64, num_envs=2, seed=0)
    fill([buf], 10, 2)
    batch = buf.sample(4)
    st = PinnedStager(device="cpu")
    out = st(batch)
    for k in batch:
        np.testing.assert_array_equal(as_np(out[k]), batch[k])
    assert st.pinned is False


@cuda
def test_pinned_stager_and_to_torch_on_cuda() -> None:
    from replaybank.integrations.torch import PinnedStager

    buf = rb.ReplayBuffer(64, num_envs=2, seed=0)
    fill([buf], 10, 2)
    batch = buf.sample(4)
    st = PinnedStager(device="cuda")
    out = st(batch)
    torch.cuda.synchronize()
    assert st.pinned is True
    for k in batch:
        assert out[k].device.type == "cuda"
        np.testing.assert_array_equal(out[k].cpu().numpy(), batch[k])
    g = batch.to_torch("cuda", pin_memory=True)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(g["obs/vec"].cpu().numpy(), batch["obs/vec"])


def test_missing_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingDependencyError, match=r'pip install "replaybank\[torch\]"'):
        rb.ReplayBuffer(8, storage="torch")
    with pytest.raises(ImportError, match=r"replaybank\[torch\]"):
        rb.Batch({"x": np.zeros(2)}).to_torch()
    with pytest.raises(ImportError, match=r"replaybank\[torch\]"):
        rb.TorchBackend("cpu")


def test_import_replaybank_without_torch_or_gymnasium() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "sys.modules['gymnasium'] = None\n"
        "import replaybank as rb\n"
        "assert 'TorchBackend' in rb.__all__ and 'collect' in rb.__all__\n"
        "try:\n"
        "    rb.spec_from_env\n"
        "    rb.spec_from_env(None)\n"
        "except ImportError as e:\n"
        "    assert 'replaybank[gym]' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
