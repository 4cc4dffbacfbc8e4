"""fishyrl's ``fishyrl.buffers`` front end, section by section of its reference:
``Buffer``, ``IndependentVectorizedBuffer``, ``SequentialBuffer``,
``convert_samples_to_tensors``; then a fishyrl-style world-model sequence loop on
CartPole-v1 (one import changed).
"""

from __future__ import annotations

import inspect
import warnings
from collections import Counter
from typing import Any

import numpy as np
import pytest

from replaybank.compat import fishyrl
from replaybank.compat.fishyrl import (
    Buffer,
    IndependentVectorizedBuffer,
    SequentialBuffer,
    convert_samples_to_tensors,
)
from replaybank.errors import (
    ArgumentError,
    CheckpointError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    ReplayBankError,
    ShapeError,
    SpecError,
)


def _fill(buf: SequentialBuffer, n: int, start: int = 0) -> None:
    for t in range(start, start + n):
        buf.add({"x": np.array(t), "obs": np.full(3, t, np.float32),
                 "done": np.array(t % 7 == 6), "is_first": np.array(t % 7 == 0)})


# ====================================================================== Buffer


def test_buffer_is_an_abc_of_the_documented_methods() -> None:
    """Section: class fishyrl.buffers.Buffer (abstract add, load_state_dict, reset,
    sample, state_dict, size)."""
    assert Buffer.__abstractmethods__ == frozenset(
        {"add", "load_state_dict", "reset", "sample", "state_dict", "size"})
    with pytest.raises(TypeError):
        Buffer()
    assert isinstance(SequentialBuffer(4), Buffer)
    assert isinstance(IndependentVectorizedBuffer(2, 4), Buffer)
    assert list(inspect.signature(Buffer.sample).parameters) == ["self", "batch_size"]
    assert list(inspect.signature(Buffer.add).parameters) == ["self", "experience"]


def test_all_is_the_documented_api() -> None:
    assert set(fishyrl.__all__) == {"PREFIX", "Buffer", "IndependentVectorizedBuffer",
                                    "SequentialBuffer", "convert_samples_to_tensors"}


# ====================================================================== SequentialBuffer


def test_sequential_init_signature_and_defaults() -> None:
    """Section: SequentialBuffer(capacity, validate_keys=True, seed=None)."""
    params = inspect.signature(SequentialBuffer).parameters
    assert list(params) == ["capacity", "validate_keys", "seed"]
    assert params["validate_keys"].default is True and params["seed"].default is None
    buf = SequentialBuffer(10)
    assert buf.capacity == 10 and buf.size == 0 and buf.is_full is False
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="capacity"):
            SequentialBuffer(bad)


def test_sequential_add_takes_arbitrary_keys() -> None:
    """Section: SequentialBuffer.add(experience): a dict of numpy arrays, any keys (done
    and is_first are user keys; no next_obs/terminated/truncated needed)."""
    buf = SequentialBuffer(20, seed=0)
    _fill(buf, 5)
    assert buf.size == 5
    assert sorted(buf.buffer.spec) == ["fishyrl/done", "fishyrl/is_first", "fishyrl/obs",
                                       "fishyrl/x", "terminated", "truncated"]
    out = buf.sample(2, 5)
    assert sorted(out) == ["done", "is_first", "obs", "x"]
    assert out["x"][0].tolist() == [0, 1, 2, 3, 4]


def test_sequential_validate_keys_names_the_difference() -> None:
    """Section: SequentialBuffer(validate_keys=True): every experience has the same keys;
    a mismatch raises ValueError naming the missing and unexpected keys and adds nothing."""
    buf = SequentialBuffer(8)
    buf.add({"a": np.zeros(2), "b": np.array(1)})
    with pytest.raises(ValueError, match=r"missing \['b'\], unexpected \['c'\]"):
        buf.add({"a": np.zeros(2), "c": np.array(1)})
    with pytest.raises(ValueError, match=r"missing \['a'\]"):
        buf.add({"b": np.array(1)})
    assert buf.size == 1


def test_sequential_without_key_validation() -> None:
    """Section: SequentialBuffer(validate_keys=False): keys may be left out (stored as
    zeros here); a key unseen at the first add cannot join (named in the error)."""
    buf = SequentialBuffer(8, validate_keys=False, seed=0)
    buf.add({"a": np.ones(2), "b": np.array(5)})
    buf.add({"a": np.full(2, 2.0)})
    out = buf.sample(1, 2)
    assert out["b"][0].tolist() == [5, 0] and out["a"][0, :, 0].tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match=r"unexpected \['c'\]"):
        buf.add({"a": np.ones(2), "c": np.array(1)})
    assert buf.size == 2


def test_sequential_sample_layout_and_windows() -> None:
    """Section: SequentialBuffer.sample(batch_size, sequence_length) -> dict of numpy
    arrays [batch_size, sequence_length, *shape] of consecutive experiences."""
    buf = SequentialBuffer(50, seed=1)
    _fill(buf, 120)  # wrapped: holds 70..119
    out = buf.sample(16, 9)
    assert out["obs"].shape == (16, 9, 3) and out["obs"].dtype == np.float32
    assert out["x"].shape == (16, 9) and out["done"].dtype == np.bool_
    x = out["x"]
    assert (np.diff(x, axis=1) == 1).all()  # consecutive, never across the write head
    assert x.min() >= 70 and x.max() <= 119
    assert out["is_first"].any(axis=1).any()  # windows run over episode starts


def test_sequential_sample_is_uniform_over_window_starts() -> None:
    """Every window start of the stored experiences is equally likely (fishyrl draws
    ``choice(size - sequence_length + 1)``)."""
    buf = SequentialBuffer(10, seed=2)
    _fill(buf, 14)  # holds 4..13; windows of 4 start at 4..10
    starts = Counter(buf.sample(7000, 4)["x"][:, 0].tolist())
    assert sorted(starts) == list(range(4, 11))
    assert max(starts.values()) / min(starts.values()) < 1.15


def test_sequential_sample_errors() -> None:
    buf = SequentialBuffer(10, seed=0)
    with pytest.raises(ValueError):
        buf.sample(2, 3)  # empty
    _fill(buf, 3)
    with pytest.raises(EmptyBufferError):  # a ValueError, as fishyrl's
        buf.sample(2, 4)
    with pytest.raises(ValueError, match="sequence_length"):
        buf.sample(2, 11)  # longer than the capacity
    with pytest.raises(ValueError, match="batch_size"):
        buf.sample(0, 2)
    assert buf.sample(5, 3)["x"].tolist() == [[0, 1, 2]] * 5


def test_sequential_seed_reproduces_samples() -> None:
    """Section: SequentialBuffer(seed=...)."""
    a, b = SequentialBuffer(30, seed=7), SequentialBuffer(30, seed=7)
    for buf in (a, b):
        _fill(buf, 40)
    np.testing.assert_array_equal(a.sample(8, 5)["x"], b.sample(8, 5)["x"])


def test_sequential_properties() -> None:
    """Section: properties capacity, is_full, size."""
    buf = SequentialBuffer(5)
    _fill(buf, 4)
    assert (buf.size, buf.capacity, buf.is_full) == (4, 5, False)
    _fill(buf, 3, start=4)
    assert (buf.size, buf.capacity, buf.is_full) == (5, 5, True)


def test_sequential_state_dict_round_trip() -> None:
    """Section: state_dict() / load_state_dict(state_dict): the identical next sample,
    the keys and the capacity restored."""
    buf = SequentialBuffer(40, seed=3)
    _fill(buf, 55)
    sd = buf.state_dict()
    other = SequentialBuffer(12, seed=99)
    other.add({"unrelated": np.zeros(1)})
    other.load_state_dict(sd)
    assert other.capacity == 40 and other.size == 40 and other.is_full
    a, b = buf.sample(6, 4), other.sample(6, 4)
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    with pytest.raises(ValueError, match="missing"):
        other.add({"unrelated": np.zeros(1)})  # the saved keys came with the state
    with pytest.raises(CheckpointError):
        other.load_state_dict({"_buffer": {}, "_curptr": 0})  # fishyrl's own layout
    assert other.size == 40


def test_state_dict_is_a_snapshot() -> None:
    """Section: state_dict() - "the state of the buffer for saving": a state kept in
    memory is the buffer as it was at the call. Adds after it (a wrap of the ring
    included) change nothing in it, and it loads that buffer (it held live views of the
    storage beside counters copied at the call: it loaded later data, or was refused as
    damaged)."""
    seq = SequentialBuffer(4, seed=0)
    for t in range(4):
        seq.add({"o": np.float32(t)})
    kept = seq.state_dict()
    for t in range(4, 6):
        seq.add({"o": np.float32(t)})
    back = SequentialBuffer(4, seed=0)
    back.load_state_dict(kept)
    assert back.sample(1, 4)["o"][0].tolist() == [0.0, 1.0, 2.0, 3.0]
    partial = SequentialBuffer(4, seed=0)
    for t in range(3):
        partial.add({"o": np.full(2, t, np.float32)})
    kept = partial.state_dict()
    for t in range(3, 8):
        partial.add({"o": np.full(2, t, np.float32)})
    back = SequentialBuffer(4, seed=0)
    back.load_state_dict(kept)  # was: CheckpointError "free_slots ... damaged"
    assert back.size == 3 and back.sample(1, 3)["o"][0, :, 0].tolist() == [0.0, 1.0, 2.0]
    vec = IndependentVectorizedBuffer(2, 4, seed=0)
    for t in range(3):
        vec.add({"o": np.array([[t], [10 + t]], np.float32)})
    kept = vec.state_dict()
    vec.add({"o": np.array([[99], [99]], np.float32)})
    other = IndependentVectorizedBuffer(2, 4, seed=0)
    other.load_state_dict(kept)
    assert other.size == 6
    windows = other.sample(8, sequence_length=3)["o"][:, :, 0].tolist()
    assert {tuple(w) for w in windows} <= {(0.0, 1.0, 2.0), (10.0, 11.0, 12.0)}


def test_sequential_reset() -> None:
    """Section: reset(): empty, keys forgotten, generator kept going."""
    buf = SequentialBuffer(10, seed=0)
    _fill(buf, 6)
    buf.reset()
    assert buf.size == 0 and not buf.is_full
    buf.add({"other": np.array([1.0])})
    buf.add({"other": np.array([2.0])})
    assert buf.sample(1, 2)["other"][0, :, 0].tolist() == [1.0, 2.0]


# ====================================================================== IndependentVectorizedBuffer


def _vec_fill(buf: IndependentVectorizedBuffer, n: int, envs: int) -> None:
    for t in range(n):
        buf.add({"env": np.arange(envs), "t": np.full(envs, t),
                 "obs": np.full((envs, 2), t, np.float32)})


def test_vectorized_init_signature_and_capacity_per_buffer() -> None:
    """Section: IndependentVectorizedBuffer(num_buffers, *buffer_args,
    buffer_class=SequentialBuffer, seed=None, **buffer_kwargs); capacity is per buffer."""
    params = inspect.signature(IndependentVectorizedBuffer).parameters
    assert list(params) == ["num_buffers", "buffer_args", "buffer_class", "seed",
                            "buffer_kwargs"]
    assert params["buffer_class"].default is SequentialBuffer
    assert params["seed"].default is None
    for buf in (IndependentVectorizedBuffer(3, 10), IndependentVectorizedBuffer(3, capacity=10),
                IndependentVectorizedBuffer(3, 10, False, seed=1)):
        assert buf.buffer.capacity == 30 and buf.buffer.num_envs == 3
        _vec_fill(buf, 25, 3)
        assert buf.size == 30  # each of the 3 buffers keeps its newest 10
    with pytest.raises(TypeError, match="SequentialBuffer"):
        IndependentVectorizedBuffer(2, 10, unknown=1)
    with pytest.raises(ValueError, match="num_buffers"):
        IndependentVectorizedBuffer(0, 10)


def test_vectorized_validate_keys_passes_through() -> None:
    strict = IndependentVectorizedBuffer(2, 8)
    loose = IndependentVectorizedBuffer(2, 8, validate_keys=False, seed=0)
    for buf in (strict, loose):
        buf.add({"a": np.ones((2, 3)), "b": np.ones(2)})
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        strict.add({"a": np.ones((2, 3))})
    loose.add({"a": np.ones((2, 3))})
    assert loose.sample(4, sequence_length=2)["b"][:, 1].tolist() == [0.0] * 4


def test_vectorized_add_takes_arrays_with_a_buffer_dim() -> None:
    """Section: IndependentVectorizedBuffer.add(experience): [num_buffers, ...] arrays,
    row i to buffer i; a bad shape adds nothing to any buffer."""
    buf = IndependentVectorizedBuffer(4, 20, seed=0)
    _vec_fill(buf, 6, 4)
    assert buf.size == 24
    with pytest.raises(ValueError):
        buf.add({"env": np.arange(3), "t": np.zeros(3), "obs": np.zeros((3, 2), np.float32)})
    assert buf.size == 24
    one = IndependentVectorizedBuffer(1, 5, seed=0)
    one.add({"obs": np.zeros((1, 2), np.float32)})
    one.add({"obs": np.ones((1, 2), np.float32)})
    assert one.sample(2, sequence_length=2)["obs"].shape == (2, 2, 2)


def test_vectorized_sample_splits_the_batch_randomly_among_buffers() -> None:
    """Section: IndependentVectorizedBuffer.sample(batch_size, **sample_kwargs): the batch
    divided randomly among the buffers; each sequence from one buffer."""
    buf = IndependentVectorizedBuffer(4, 30, seed=5)
    _vec_fill(buf, 40, 4)
    out = buf.sample(4000, sequence_length=6)
    assert out["obs"].shape == (4000, 6, 2) and out["t"].shape == (4000, 6)
    env = out["env"]
    assert (env == env[:, :1]).all()  # one buffer per sequence
    assert (np.diff(out["t"], axis=1) == 1).all() and out["t"].min() >= 10
    share = np.bincount(env[:, 0], minlength=4) / 4000
    assert np.abs(share - 0.25).max() < 0.03
    starts = Counter(out["t"][:, 0].tolist())  # uniform over each buffer's 25 starts
    assert sorted(starts) == list(range(10, 35))


def test_vectorized_sample_arguments() -> None:
    buf = IndependentVectorizedBuffer(4, 10, seed=0)
    _vec_fill(buf, 5, 4)
    with pytest.warns(UserWarning, match="not divisible"):
        assert buf.sample(6, sequence_length=2)["t"].shape == (6, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        buf.sample(8, sequence_length=2)
    with pytest.raises(TypeError, match="sequence_length"):
        buf.sample(8, seq_len=2)


def test_vectorized_seed_state_dict_and_reset() -> None:
    """Sections: seed, state_dict(), load_state_dict(state_dict), reset(), size."""
    a, b = IndependentVectorizedBuffer(3, 12, seed=4), IndependentVectorizedBuffer(3, 12, seed=4)
    for buf in (a, b):
        _vec_fill(buf, 20, 3)
    np.testing.assert_array_equal(a.sample(9, sequence_length=3)["t"],
                                  b.sample(9, sequence_length=3)["t"])
    c = IndependentVectorizedBuffer(3, 12, seed=0)
    c.load_state_dict(a.state_dict())
    assert c.size == a.size == 36
    np.testing.assert_array_equal(a.sample(9, sequence_length=3)["obs"],
                                  c.sample(9, sequence_length=3)["obs"])
    with pytest.raises(CheckpointError, match="num_buffers=2"):
        IndependentVectorizedBuffer(2, 18).load_state_dict(a.state_dict())
    a.reset()
    assert a.size == 0
    a.add({"new": np.zeros((3, 1))})
    assert a.size == 3


class _ListBuffer(Buffer):
    """A user's own Buffer class (fishyrl allows any)."""

    def __init__(self, capacity: int, seed: int | None = None) -> None:
        self.capacity, self.seed, self.rows = capacity, seed, list[dict[str, Any]]()

    @property
    def size(self) -> int:
        return len(self.rows)

    def state_dict(self) -> dict[str, Any]:
        return {"rows": list(self.rows)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rows = list(state_dict["rows"])

    def reset(self) -> None:
        self.rows = []

    def add(self, experience: dict[str, np.ndarray]) -> None:
        self.rows = [*self.rows, experience][-self.capacity:]

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:  # the newest rows
        return {k: np.stack([r[k] for r in self.rows[-batch_size:]]) for k in self.rows[0]}


def test_vectorized_other_buffer_class() -> None:
    """Section: buffer_class: any Buffer class, one instance per buffer, seed + i."""
    buf = IndependentVectorizedBuffer(3, 5, buffer_class=_ListBuffer, seed=10)
    assert [b.seed for b in buf._buffers or []] == [10, 11, 12]
    for t in range(7):
        buf.add({"v": np.full(3, t)})
    assert buf.size == 15
    out = buf.sample(3)
    assert out["v"].shape == (3,)
    sd = buf.state_dict()
    buf.reset()
    assert buf.size == 0
    buf.load_state_dict(sd)
    assert buf.size == 15


# ====================================================================== convert_samples_to_tensors


def test_convert_samples_to_tensors() -> None:
    """Section: convert_samples_to_tensors(samples, **tensor_kwargs): dtype= and device=."""
    torch = pytest.importorskip("torch")
    buf = SequentialBuffer(20, seed=0)
    _fill(buf, 10)
    samples = buf.sample(4, 3)
    plain = convert_samples_to_tensors(samples)
    assert set(plain) == set(samples)
    assert plain["obs"].dtype == torch.float32 and plain["done"].dtype == torch.bool
    assert plain["obs"].data_ptr() == samples["obs"].ctypes.data  # no copy
    cast = convert_samples_to_tensors(samples, dtype=torch.float64, device="cpu")
    assert all(t.dtype == torch.float64 and t.device.type == "cpu" for t in cast.values())
    np.testing.assert_array_equal(cast["x"].numpy(), samples["x"].astype(np.float64))
    ro = np.zeros(3)
    ro.flags.writeable = False
    assert convert_samples_to_tensors({"a": ro})["a"].tolist() == [0.0] * 3


def test_convert_samples_to_tensors_takes_torch_tensor_constructor_kwargs() -> None:
    """Section: convert_samples_to_tensors(samples, **tensor_kwargs): "keyword arguments to
    pass to the torch.tensor constructor". torch.tensor's own keywords (requires_grad,
    pin_memory) give what torch.tensor(array, **kwargs) gives, alone or with dtype and
    device; Tensor.to's keywords (non_blocking, copy) keep working; a bad value raises
    ArgumentError naming it."""
    torch = pytest.importorskip("torch")
    buf = SequentialBuffer(20, seed=0)
    _fill(buf, 10)
    samples = buf.sample(4, 3)
    floats = {k: v for k, v in samples.items() if v.dtype.kind == "f"}
    for kwargs in (
        {"requires_grad": True},
        {"requires_grad": False},
        {"dtype": torch.float64, "device": "cpu", "requires_grad": True},
        {"pin_memory": False},
        {"dtype": torch.float64, "pin_memory": False},
    ):
        out = convert_samples_to_tensors(floats, **kwargs)
        for key, value in floats.items():
            want = torch.tensor(value, **kwargs)
            got = out[key]
            assert (got.dtype, got.device, got.requires_grad, got.is_leaf) == (
                want.dtype,
                want.device,
                want.requires_grad,
                True,
            ), (kwargs, key)
            assert torch.equal(got.detach(), want.detach()), (kwargs, key)
    grads = convert_samples_to_tensors(floats, requires_grad=True)
    grads["obs"].sum().backward()  # a leaf that collects its gradient
    assert grads["obs"].grad is not None
    moved = convert_samples_to_tensors(floats, non_blocking=False, copy=True)
    assert moved["obs"].data_ptr() != floats["obs"].ctypes.data
    with pytest.raises(ArgumentError, match="requires_grad"):
        convert_samples_to_tensors(floats, requires_grad="yes")
    with pytest.raises(ArgumentError, match="requires_grad"):  # as torch.tensor: floats only
        convert_samples_to_tensors({"n": np.arange(3)}, requires_grad=True)


# ====================================================================== world-model loop


def _world_model_loop(iterations: int = 30) -> tuple[list[float], int]:
    """A fishyrl-style world-model loop; only the import differs from fishyrl's."""
    import gymnasium as gym
    import torch

    from replaybank.compat.fishyrl import (  # was: from fishyrl.buffers import ...
        IndependentVectorizedBuffer,
        convert_samples_to_tensors,
    )

    num_envs, batch_size, seq_len = 4, 8, 16
    envs = [gym.make("CartPole-v1") for _ in range(num_envs)]
    obs = np.stack([env.reset(seed=i)[0] for i, env in enumerate(envs)])
    is_first = np.ones(num_envs, bool)
    reward = np.zeros(num_envs, np.float32)
    is_terminal = np.zeros(num_envs, bool)
    buffer = IndependentVectorizedBuffer(num_envs, 1000, seed=0)
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 32), torch.nn.ELU(), torch.nn.Linear(32, 5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(iterations):
        for _ in range(8):  # collect: one row per env per step
            action = rng.integers(0, 2, num_envs)
            buffer.add({"obs": obs.astype(np.float32), "action": action,
                        "reward": reward.copy(), "is_first": is_first.copy(),
                        "is_terminal": is_terminal.copy()})
            for i, env in enumerate(envs):
                o, r, term, trunc, _ = env.step(int(action[i]))
                reward[i], is_terminal[i], is_first[i] = r, term, False
                if term or trunc:  # the next row starts a new episode
                    o, _ = env.reset()
                    is_first[i] = True
                obs[i] = o
        if buffer.size < num_envs * seq_len:
            continue
        data = convert_samples_to_tensors(buffer.sample(batch_size, sequence_length=seq_len),
                                          dtype=torch.float32)
        x = torch.cat([data["obs"], data["action"].unsqueeze(-1)], -1)  # [B, L, 5]
        pred = model(x[:, :-1])
        target = torch.cat([data["obs"][:, 1:], data["reward"][:, 1:].unsqueeze(-1)], -1)
        keep = (1 - data["is_first"][:, 1:]).unsqueeze(-1)  # no target across a reset
        loss = ((pred - target) ** 2 * keep).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    for env in envs:
        env.close()
    return losses, buffer.size


def test_world_model_sequence_loop_on_cartpole() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    losses, size = _world_model_loop()
    assert size == 30 * 8 * 4
    assert len(losses) >= 25 and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < np.mean(losses[:5])  # the model learns


# ====================================================================== hardening (issue items)


def _snapshot(buf: Any) -> dict[str, Any]:
    """Everything a call could change: the state dict (arrays as bytes) and the keys."""
    out: dict[str, Any] = {"size": buf.size, "keys": repr(getattr(buf, "_keys", None)),
                           "validate": repr(getattr(buf, "_validate_keys", None)),
                           "rng": repr(buf._rng.bit_generator.state)}

    def walk(d: Any, prefix: str) -> None:
        items = d.items() if isinstance(d, dict) else enumerate(d)
        for k, v in items:
            if isinstance(v, (dict, list)) and not (isinstance(v, list) and v
                                                    and isinstance(v[0], str)):
                walk(v, f"{prefix}{k}/")
            else:
                out[f"{prefix}{k}"] = (v.dtype.str, v.shape, v.tobytes()) \
                    if isinstance(v, np.ndarray) else repr(v)

    walk(buf.state_dict(), "")
    return out


def _rejects(buf: Any, call: Any, exc: type[Exception] = ReplayBankError) -> str:
    before = _snapshot(buf)
    with pytest.raises(exc) as info:
        call(buf)
    assert isinstance(info.value, ReplayBankError), type(info.value)
    assert str(info.value)
    assert _snapshot(buf) == before
    return str(info.value)


def test_sequential_first_add_of_a_non_dict_is_refused() -> None:
    """Issue 6: a first add() of a non-dict was accepted (``add([1, 2])`` fixed the keys
    to {1, 2}) and every correct add after it was refused until reset(). Now it raises
    a library error and the buffer stays empty and keyless."""
    for bad in ([1, 2], (1, 2), "xy", None, 5, np.zeros(3), {1: np.zeros(1)}):
        buf = SequentialBuffer(8, seed=0)
        msg = _rejects(buf, lambda b, bad=bad: b.add(bad), ArgumentError)
        assert "experience" in msg
        assert buf.size == 0 and buf._keys is None
        buf.add({"x": np.array(1)})  # a correct add works at once
        assert buf.size == 1
    vec = IndependentVectorizedBuffer(2, 8, seed=0)
    _rejects(vec, lambda b: b.add([1, 2]), ArgumentError)
    vec.add({"x": np.zeros(2)})
    assert vec.size == 2


def test_vectorized_sample_concatenates_buffer_by_buffer() -> None:
    """Issue 13: fishyrl's reference: sample "a batch of experiences from each buffer and
    concatenate them": buffer 0's sequences first, then buffer 1's, ... (they came back
    in draw order). Still a random split with each buffer equally likely."""
    buf = IndependentVectorizedBuffer(4, 30, seed=5)
    _vec_fill(buf, 40, 4)
    for batch_size in (8, 64, 4000):
        env = buf.sample(batch_size, sequence_length=6)["env"][:, 0]
        assert (np.diff(env) >= 0).all(), env  # grouped by buffer, in buffer order
    out = buf.sample(4000, sequence_length=6)
    share = np.bincount(out["env"][:, 0], minlength=4) / 4000
    assert np.abs(share - 0.25).max() < 0.03
    assert (out["env"] == out["env"][:, :1]).all()
    for k in ("t", "obs"):  # every field reordered together
        assert (out[k][:, 0] == out["t"][:, 0].reshape(-1, *([1] * (out[k].ndim - 2)))).all()
    c, d = IndependentVectorizedBuffer(4, 30, seed=9), IndependentVectorizedBuffer(4, 30, seed=9)
    for b in (c, d):
        _vec_fill(b, 40, 4)
    np.testing.assert_array_equal(c.sample(16, sequence_length=3)["t"],
                                  d.sample(16, sequence_length=3)["t"])


#: Words of the core's API that a fishyrl user never meets.
_CORE_WORDS = ("fishyrl/", "sample_sequences", "strict=", "burn_in", "width=",
               "episode_boundary", "declare", "field shape", "leading dims", "num_envs",
               "env_ids", "last_val", "capacity=8", "capacity=12")


def _message(call: Any, exc: type[Exception]) -> str:
    with pytest.raises(exc) as info:
        call()
    assert isinstance(info.value, ReplayBankError)
    msg = str(info.value)
    assert not [w for w in _CORE_WORDS if w in msg], msg
    return msg


def test_errors_speak_the_front_ends_api() -> None:
    """A fishyrl user's mistakes are told in fishyrl's terms: the experience's keys,
    sample's sequence_length, num_buffers and capacity, and what to do with this API
    (they named core internals: sample_sequences(...), strict=False, burn_in, the field
    'fishyrl/obs', 'declare the field as float', total capacities of the lanes)."""
    seq = SequentialBuffer(4, seed=0)
    for t in range(3):
        seq.add({"obs": np.full(2, t, np.float32), "r": np.int64(t), "a": np.uint8(1)})
    msg = _message(lambda: seq.add({"obs": np.zeros(3, np.float32), "r": 0, "a": 1}),
                   ShapeError)
    assert "experience['obs']" in msg and "(2,)" in msg and "first add" in msg
    msg = _message(lambda: seq.add({"obs": np.zeros(2, np.float32), "r": 0.5, "a": 1}),
                   DtypeError)
    assert "experience['r']" in msg and "int64" in msg and "reset()" in msg
    msg = _message(lambda: seq.add({"obs": np.zeros(2, np.float32), "r": 0, "a": 300}),
                   DtypeError)
    assert "experience['a']" in msg and "uint8" in msg
    msg = _message(lambda: seq.add({"obs": np.zeros(2, np.float32), "r": 0,
                                    "a": np.array("abc")}), DtypeError)
    assert "experience['a']" in msg
    assert seq.size == 3
    msg = _message(lambda: seq.sample(2, 5), ConfigError)
    assert "sequence_length=5" in msg and "capacity=4" in msg
    msg = _message(lambda: seq.sample(2, 0), ConfigError)
    assert "sequence_length=0" in msg
    msg = _message(lambda: seq.sample(2, 4), EmptyBufferError)
    assert "sequence_length=4" in msg and "holds 3 experiences" in msg
    msg = _message(lambda: SequentialBuffer(4).add({}), SpecError)
    assert "experience={}" in msg
    nested = SequentialBuffer(4)
    nested.add({"obs": {"pos": np.zeros(2, np.float32)}})
    msg = _message(lambda: nested.add({"obs": {"pos": np.zeros(3, np.float32)}}), ShapeError)
    assert "experience['obs']['pos']" in msg
    vec = IndependentVectorizedBuffer(2, 4, seed=0)
    vec.add({"o": np.zeros((2, 3), np.float32)})
    for bad in (np.zeros((3, 3), np.float32), np.zeros(2, np.float32)):
        msg = _message(lambda bad=bad: vec.add({"o": bad}), ShapeError)
        assert "experience['o']" in msg and "num_buffers" in msg
    msg = _message(lambda: vec.sample(4, sequence_length=2), EmptyBufferError)
    assert "each buffer holds 1 experiences" in msg
    three = IndependentVectorizedBuffer(3, 4, seed=0)
    msg = _message(lambda: three.load_state_dict(vec.state_dict()), CheckpointError)
    assert "2 buffers of capacity=4" in msg and "num_buffers=3" in msg
    assert "IndependentVectorizedBuffer(2, 4)" in msg and three.size == 0
    msg = _message(lambda: IndependentVectorizedBuffer(2, 6).load_state_dict(
        vec.state_dict()), CheckpointError)
    assert "capacity=4" in msg and "capacity=6" in msg
    msg = _message(lambda: SequentialBuffer(4).load_state_dict(vec.state_dict()),
                   CheckpointError)
    assert "2 buffers" in msg and "IndependentVectorizedBuffer(2, 4)" in msg
    msg = _message(lambda: IndependentVectorizedBuffer(2, 4).load_state_dict(
        seq.state_dict()), CheckpointError)
    assert "1 buffer of capacity=4" in msg and "num_buffers=2" in msg


def _seq() -> SequentialBuffer:
    buf = SequentialBuffer(10, seed=0)
    _fill(buf, 6)
    return buf


def _vec() -> IndependentVectorizedBuffer:
    buf = IndependentVectorizedBuffer(2, 10, seed=0)
    _vec_fill(buf, 6, 2)
    return buf


def _list_vec() -> IndependentVectorizedBuffer:
    buf = IndependentVectorizedBuffer(2, 5, buffer_class=_ListBuffer, seed=0)
    for t in range(3):
        buf.add({"v": np.full(2, t)})
    return buf


_GOOD = {"x": np.array(9), "obs": np.zeros(3, np.float32), "done": np.array(False),
         "is_first": np.array(False)}
#: (name, buffer, call, the library error expected)
_HOSTILE: list[tuple[str, Any, Any, type[Exception]]] = [
    ("add(None)", _seq, lambda b: b.add(None), ArgumentError),
    ("add('x')", _seq, lambda b: b.add("x"), ArgumentError),
    ("add([1, 2])", _seq, lambda b: b.add([1, 2]), ArgumentError),
    ("add({})", _seq, lambda b: b.add({}), SpecError),
    ("add(obs None)", _seq, lambda b: b.add({**_GOOD, "obs": None}), ReplayBankError),
    ("add(obs 'abc')", _seq, lambda b: b.add({**_GOOD, "obs": "abc"}), ReplayBankError),
    ("add(obs [4])", _seq, lambda b: b.add({**_GOOD, "obs": np.zeros(4, np.float32)}),
     ShapeError),
    ("add(x nan)", _seq, lambda b: b.add({**_GOOD, "x": np.array(np.nan)}), DtypeError),
    ("sample(None, 2)", _seq, lambda b: b.sample(None, 2), ArgumentError),
    ("sample('x', 2)", _seq, lambda b: b.sample("x", 2), ArgumentError),
    ("sample(2.5, 2)", _seq, lambda b: b.sample(2.5, 2), ArgumentError),
    ("sample(nan, 2)", _seq, lambda b: b.sample(float("nan"), 2), ArgumentError),
    ("sample(0, 2)", _seq, lambda b: b.sample(0, 2), ConfigError),
    ("sample(-1, 2)", _seq, lambda b: b.sample(-1, 2), ConfigError),
    ("sample(2, None)", _seq, lambda b: b.sample(2, None), ConfigError),
    ("sample(2, 0)", _seq, lambda b: b.sample(2, 0), ConfigError),
    ("sample(2, 11)", _seq, lambda b: b.sample(2, 11), ConfigError),
    ("sample(2, 7) (6 stored)", _seq, lambda b: b.sample(2, 7), EmptyBufferError),
    ("load_state_dict(None)", _seq, lambda b: b.load_state_dict(None), CheckpointError),
    ("load_state_dict({})", _seq, lambda b: b.load_state_dict({}), CheckpointError),
    ("load_state_dict(buffer None)", _seq, lambda b: b.load_state_dict({"buffer": None}),
     CheckpointError),
    ("load_state_dict(capacity 'x')", _seq,
     lambda b: b.load_state_dict({**b.state_dict(), "capacity": "x"}), ConfigError),
    ("load_state_dict(keys 5)", _seq,
     lambda b: b.load_state_dict({**b.state_dict(), "keys": 5}), CheckpointError),
    ("load_state_dict(keys of other fields)", _seq,
     lambda b: b.load_state_dict({**b.state_dict(), "keys": ["zz"]}), CheckpointError),
    ("load_state_dict(validate_keys 'x')", _seq,
     lambda b: b.load_state_dict({**b.state_dict(), "validate_keys": "x"}), CheckpointError),
    ("vec add(None)", _vec, lambda b: b.add(None), ArgumentError),
    ("vec add([1, 2])", _vec, lambda b: b.add([1, 2]), ArgumentError),
    ("vec add(3 rows)", _vec,
     lambda b: b.add({"env": np.arange(3), "t": np.zeros(3), "obs": np.zeros((3, 2))}),
     ShapeError),
    ("vec add(t 5)", _vec, lambda b: b.add({"env": np.arange(2), "t": 5,
                                            "obs": np.zeros((2, 2), np.float32)}), ShapeError),
    ("vec sample(None)", _vec, lambda b: b.sample(None, sequence_length=2), ArgumentError),
    ("vec sample(0)", _vec, lambda b: b.sample(0, sequence_length=2), ConfigError),
    ("vec sample(-2)", _vec, lambda b: b.sample(-2, sequence_length=2), ConfigError),
    ("vec sample(sequence_length None)", _vec, lambda b: b.sample(2, sequence_length=None),
     ConfigError),
    ("vec sample(no sequence_length)", _vec, lambda b: b.sample(2), ArgumentError),
    ("vec load_state_dict(None)", _vec, lambda b: b.load_state_dict(None), CheckpointError),
    ("list add(None)", _list_vec, lambda b: b.add(None), ArgumentError),
    ("list add(1 row)", _list_vec, lambda b: b.add({"v": np.zeros(1)}), ShapeError),
    ("list sample(None)", _list_vec, lambda b: b.sample(None), ArgumentError),
    ("list sample(0)", _list_vec, lambda b: b.sample(0), ConfigError),
    ("list load_state_dict(None)", _list_vec, lambda b: b.load_state_dict(None),
     CheckpointError),
    ("list load_state_dict({})", _list_vec, lambda b: b.load_state_dict({}), CheckpointError),
    ("list load_state_dict(second damaged)", _list_vec,
     lambda b: b.load_state_dict({**b.state_dict(),
                                  "_buffers": [b.state_dict()["_buffers"][0], {}]}),
     CheckpointError),
]


@pytest.mark.parametrize("name, make, call, exc", _HOSTILE, ids=[h[0] for h in _HOSTILE])
def test_hostile_arguments_raise_library_errors_and_change_nothing(
        name: str, make: Any, call: Any, exc: type[Exception]) -> None:
    """Every public call of the fishyrl front end, given None, strings, NaN, wrong
    shapes or kinds, or non-positive sizes, raises a library error and leaves the
    buffer (and its generator) as it was."""
    _rejects(make(), call, exc)


_BAD_CONSTRUCTORS: list[tuple[str, Any, type[Exception]]] = [
    ("capacity=None", lambda: SequentialBuffer(None), ConfigError),
    ("capacity='x'", lambda: SequentialBuffer("x"), ConfigError),
    ("capacity=nan", lambda: SequentialBuffer(float("nan")), ConfigError),
    ("validate_keys='x'", lambda: SequentialBuffer(4, validate_keys="x"), ArgumentError),
    ("validate_keys=None", lambda: SequentialBuffer(4, validate_keys=None), ArgumentError),
    ("seed='x'", lambda: SequentialBuffer(4, seed="x"), ConfigError),
    ("seed=-1", lambda: SequentialBuffer(4, seed=-1), ConfigError),
    ("num_buffers=None", lambda: IndependentVectorizedBuffer(None, 4), ConfigError),
    ("num_buffers=2.5", lambda: IndependentVectorizedBuffer(2.5, 4), ConfigError),
    ("capacity missing", lambda: IndependentVectorizedBuffer(2), ArgumentError),
    ("buffer_class=None", lambda: IndependentVectorizedBuffer(2, 4, buffer_class=None),
     ArgumentError),
    ("buffer_class=int", lambda: IndependentVectorizedBuffer(2, 4, buffer_class=int),
     ArgumentError),
    ("group validate_keys=0", lambda: IndependentVectorizedBuffer(2, 4, validate_keys=0),
     ArgumentError),
    ("convert(None)", lambda: convert_samples_to_tensors(None), ArgumentError),
    ("convert({'a': 'x'})", lambda: convert_samples_to_tensors({"a": "x"}), DtypeError),
    ("convert({'a': None})", lambda: convert_samples_to_tensors({"a": None}), DtypeError),
    ("convert(device='bogus')",
     lambda: convert_samples_to_tensors({"a": np.zeros(2)}, device="bogus"), ArgumentError),
    ("convert(bogus=1)", lambda: convert_samples_to_tensors({"a": np.zeros(2)}, bogus=1),
     ArgumentError),
]


@pytest.mark.parametrize("name, make, exc", _BAD_CONSTRUCTORS,
                         ids=[c[0] for c in _BAD_CONSTRUCTORS])
def test_hostile_constructor_arguments_raise_library_errors(
        name: str, make: Any, exc: type[Exception]) -> None:
    pytest.importorskip("torch")
    with pytest.raises(exc) as info:
        make()
    assert isinstance(info.value, ReplayBankError) and str(info.value)
