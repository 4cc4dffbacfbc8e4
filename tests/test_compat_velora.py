"""The velora front end (``replaybank.compat.velora``) against velora's documentation.

Tests follow the ``velora.buffer`` API reference section by section (BatchExperience,
BufferBase and each of its methods, ReplayBuffer and each of its methods), then the user
guide ("Working with Buffers"); each test's docstring names the section it checks. A
plain reimplementation of the storage rules the reference documents is the oracle of the
property test. The agent of ``warm`` is a small fake that follows velora's documented
agent interface (``env``, ``device``, ``predict(states, hidden, train_mode=True) ->
(actions, hidden)``) on real gymnasium vector envs.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import replaybank as rb
from replaybank.compat import velora
from replaybank.compat.velora import BatchExperience, BufferBase, BufferConfig, ReplayBuffer

S, A, H = 4, 2, 3
KEYS = ["states", "actions", "rewards", "next_states", "dones", "hiddens"]


def item(i: int, done: bool = False) -> tuple[Any, ...]:
    """Experience number ``i``: every value encodes ``i`` (rows are told apart)."""
    return (torch.full((S,), float(i)), torch.full((A,), i + 0.5), float(i) / 10,
            torch.full((S,), i + 1.0), done, torch.full((H,), -float(i)))


def items(start: int, n: int) -> tuple[torch.Tensor, ...]:
    """Experiences ``start .. start + n - 1`` as add_multi's tensors (1-D rewards/dones)."""
    i = torch.arange(start, start + n, dtype=torch.float32)
    return (i[:, None].repeat(1, S), (i + 0.5)[:, None].repeat(1, A), i / 10,
            (i + 1)[:, None].repeat(1, S), (i % 3 == 2).float(), (-i)[:, None].repeat(1, H))


class Reference:
    """The storage rules velora's reference documents, written plainly (the oracle)."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.position, self.size = capacity, 0, 0
        widths = {"states": S, "actions": A, "rewards": 1, "next_states": S, "dones": 1,
                  "hiddens": H}
        self.data = {k: torch.zeros((capacity, w)) for k, w in widths.items()}

    def add(self, *values: Any) -> None:
        for key, v in zip(KEYS, values, strict=True):
            self.data[key][self.position] = torch.as_tensor(v, dtype=torch.float32)
        self.position = (self.position + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def add_multi(self, *values: torch.Tensor) -> None:
        for row in zip(*values, strict=True):
            self.add(*row)


class FakeAgent:
    """velora's agent interface: ``env``, ``device`` and ``predict(states, hidden,
    train_mode)`` returning ``(actions, hidden)``; records every call."""

    def __init__(self, env_id: str, hidden_dim: int = H, device: str = "cpu") -> None:
        self.env = gym.make(env_id)
        self.device = torch.device(device)
        self.hidden_dim = hidden_dim
        self.discrete = isinstance(self.env.action_space, gym.spaces.Discrete)
        self.calls: list[dict[str, Any]] = []

    def predict(self, states: torch.Tensor, hidden: torch.Tensor | None,
                train_mode: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        n = states.shape[0]
        prev = torch.zeros(n, self.hidden_dim) if hidden is None else hidden
        new = torch.tanh(0.5 * prev + states.float().sum(-1, keepdim=True)
                         + torch.arange(self.hidden_dim, dtype=torch.float32))
        actions = (new[:, 0] > new[:, 1]).long() if self.discrete else 2 * new[:, :1]
        self.calls.append({"states": states.clone(), "hidden_in": hidden, "hidden": new,
                           "actions": actions, "train_mode": train_mode})
        return actions, new


def filled(n: int = 6, capacity: int = 10) -> ReplayBuffer:
    buf = ReplayBuffer(capacity, S, A, H)
    for i in range(n):
        buf.add(*item(i, done=i % 3 == 2))
    return buf


# ---------------------------------------------------------------- API reference


def test_module_exports_every_public_name() -> None:
    """velora.buffer (the page): BatchExperience, BufferBase, ReplayBuffer, the config
    model of ReplayBuffer.config and the key types of metadata/state_dict are exported, and
    the error BufferBase.sample raises; every public class of the module is exported."""
    assert set(velora.__all__) == {"AbstractSampleError", "BatchExperience", "BufferBase",
                                   "BufferConfig", "BufferKeys", "MetaDataKeys",
                                   "ReplayBuffer"}
    classes = {n for n, v in vars(velora).items() if isinstance(v, type)
               and not n.startswith("_") and v.__module__ == velora.__name__}
    assert classes <= set(velora.__all__)
    for name in velora.__all__:
        assert getattr(velora, name) is not None
    assert issubclass(ReplayBuffer, BufferBase)


def test_batch_experience_fields() -> None:
    """BatchExperience (dataclass): attributes states, actions, rewards, next_states,
    dones, hiddens, all tensors."""
    assert dataclasses.is_dataclass(BatchExperience)
    assert [f.name for f in dataclasses.fields(BatchExperience)] == KEYS
    t = torch.zeros(2, 1)
    b = BatchExperience(states=t, actions=t, rewards=t, next_states=t, dones=t, hiddens=t)
    assert b.hiddens is t
    b.states = torch.ones(2, 1)  # a plain (mutable) dataclass, as velora's
    assert b.states.sum() == 2


def test_buffer_base_init_parameters_and_defaults() -> None:
    """BufferBase.__init__(capacity, state_dim, action_dim, hidden_dim, *, device=None):
    attributes as given, position and size 0, storage zero-filled (capacity, dim). The
    front end adds one keyword-only argument after velora's: seed=None."""
    sig = inspect.signature(BufferBase.__init__)
    assert list(sig.parameters)[1:] == ["capacity", "state_dim", "action_dim", "hidden_dim",
                                        "device", "seed"]
    for name in ("device", "seed"):
        assert sig.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert sig.parameters[name].default is None
    buf = ReplayBuffer(7, S, A, H)
    assert (buf.capacity, buf.state_dim, buf.action_dim, buf.hidden_dim, buf.device) \
        == (7, S, A, H, None)
    assert (buf.position, buf.size, len(buf)) == (0, 0, 0)
    shapes = {k: tuple(v.shape) for k, v in buf.state_dict().items()}
    assert shapes == {"states": (7, S), "actions": (7, A), "rewards": (7, 1),
                      "next_states": (7, S), "dones": (7, 1), "hiddens": (7, H)}
    assert all(float(v.abs().sum()) == 0 for v in buf.state_dict().values())
    with pytest.raises(TypeError):
        ReplayBuffer(7, S, A, H, "cpu")  # type: ignore[misc]  # device is keyword-only
    dev = ReplayBuffer(7, S, A, H, device=torch.device("cpu"))
    assert dev.device == torch.device("cpu")


def test_buffer_base_is_the_customization_base() -> None:
    """BufferBase (Customization: Buffers): a subclass that supplies sample gets
    add/add_multi/len/metadata/state_dict/save/load and velora's attributes."""

    class Newest(BufferBase):
        def sample(self, batch_size: int) -> BatchExperience:
            idx = (torch.arange(batch_size) + self.position - batch_size) % self.capacity
            return BatchExperience(self.states[idx], self.actions[idx], self.rewards[idx],
                                   self.next_states[idx], self.dones[idx], self.hiddens[idx])

    buf = Newest(5, S, A, H)
    for i in range(7):
        buf.add(*item(i))
    assert buf.sample(2).states[:, 0].tolist() == [5.0, 6.0]


def test_len() -> None:
    """BufferBase.__len__(): the current size, at most capacity."""
    buf = ReplayBuffer(3, S, A, H)
    sizes = []
    for i in range(5):
        buf.add(*item(i))
        sizes.append(len(buf))
    assert sizes == [1, 2, 3, 3, 3]
    assert buf.size == len(buf)


def test_add_stores_one_item_at_position() -> None:
    """BufferBase.add(state, action, reward, next_state, done, hidden): one experience at
    `position`, float32, position then advances deque style and size grows to capacity."""
    buf = ReplayBuffer(3, S, A, H)
    buf.add(torch.arange(S, dtype=torch.float64), torch.tensor([1, 2]), 0.5,
            torch.ones(S, dtype=torch.float64), True, torch.full((H,), 2.0))
    sd = buf.state_dict()
    assert all(v.dtype == torch.float32 for v in sd.values())
    assert sd["states"][0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert sd["actions"][0].tolist() == [1.0, 2.0]
    assert sd["rewards"][0].tolist() == [0.5]
    assert sd["next_states"][0].tolist() == [1.0] * S
    assert sd["dones"][0].tolist() == [1.0]
    assert sd["hiddens"][0].tolist() == [2.0] * H
    positions = []
    for i in range(1, 5):
        buf.add(*item(i))
        positions.append(buf.position)
    assert positions == [2, 0, 1, 2]
    assert buf.states[:, 0].tolist() == [3.0, 4.0, 2.0]  # the oldest went first


def test_add_accepts_what_velora_assignment_accepts() -> None:
    """BufferBase.add: values are assigned into float32 rows (tensor[i] = value), so
    Python numbers, numpy arrays, leading size-1 dims, a broadcast action and tensors
    that require grad are taken; a value of the wrong size raises and stores nothing."""
    buf = ReplayBuffer(4, S, A, H)
    hidden = torch.ones(1, H, requires_grad=True)  # e.g. an actor's output
    buf.add(np.zeros(S), 1, torch.tensor(2.0), torch.ones(1, S), torch.tensor(True), hidden)
    assert buf.actions[0].tolist() == [1.0, 1.0]
    assert buf.rewards[0].item() == 2.0 and buf.dones[0].item() == 1.0
    assert buf.hiddens[0].tolist() == [1.0] * H
    with pytest.raises(rb.ShapeError, match="state"):
        buf.add(torch.zeros(S + 1), torch.zeros(A), 0.0, torch.zeros(S), False,
                torch.zeros(H))
    assert len(buf) == 1


def test_add_multi_rows_in_order_and_1d_values() -> None:
    """BufferBase.add_multi(states, actions, rewards, next_states, dones, hiddens): rows
    go in order from `position`; 1-D rewards, dones and actions become one column."""
    buf = ReplayBuffer(10, S, 1, H)
    i = torch.arange(4, dtype=torch.float32)
    buf.add_multi(i[:, None].repeat(1, S), torch.tensor([0, 1, 0, 1]), i / 10,
                  (i + 1)[:, None].repeat(1, S), torch.tensor([False, False, True, False]),
                  torch.zeros(4, H))
    assert (len(buf), buf.position) == (4, 4)
    assert buf.actions[:4, 0].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert buf.rewards[:4, 0].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert buf.dones[:4, 0].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert buf.next_states[:4, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    # (n, 1) columns are taken as they are
    buf.add_multi(torch.zeros(2, S), torch.ones(2, 1), torch.ones(2, 1), torch.zeros(2, S),
                  torch.ones(2, 1), torch.zeros(2, H))
    assert buf.rewards[4:6, 0].tolist() == [1.0, 1.0] and buf.dones[4:6, 0].tolist() == [1, 1]
    with pytest.raises(rb.ShapeError, match="rewards"):
        buf.add_multi(torch.zeros(2, S), torch.ones(2, 1), torch.ones(3), torch.zeros(2, S),
                      torch.ones(2), torch.zeros(2, H))
    assert len(buf) == 6


def test_add_multi_wraps_around() -> None:
    """BufferBase.add_multi: indices wrap at capacity (deque style), position and size
    follow; more rows than capacity keep the newest."""
    ref, buf = Reference(5), ReplayBuffer(5, S, A, H)
    for start, n in ((0, 3), (3, 4), (7, 12)):
        ref.add_multi(*items(start, n))
        buf.add_multi(*items(start, n))
        assert (buf.position, len(buf)) == (ref.position, ref.size)
        for key, value in buf.state_dict().items():
            assert torch.equal(value, ref.data[key]), key


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(1, 8),
       ops=st.lists(st.one_of(st.just(0), st.integers(1, 11)), min_size=1, max_size=12))
def test_adds_match_the_documented_storage(capacity: int, ops: list[int]) -> None:
    """BufferBase.add / add_multi / state_dict / metadata: any sequence of adds (0: one
    add, n: add_multi of n rows) leaves exactly the tensors, position and size of the
    storage rules the reference documents; sample draws stored rows whole."""
    ref, buf = Reference(capacity), ReplayBuffer(capacity, S, A, H)
    k = 0
    for n in ops:
        if n == 0:
            ref.add(*item(k, done=k % 2 == 1))
            buf.add(*item(k, done=k % 2 == 1))
            k += 1
        else:
            ref.add_multi(*items(k, n))
            buf.add_multi(*items(k, n))
            k += n
    meta = buf.metadata()
    assert (meta["position"], meta["size"]) == (ref.position, ref.size)
    for key, value in buf.state_dict().items():
        assert torch.equal(value, ref.data[key]), key
    batch = buf.sample(len(buf))
    live = {tuple(torch.cat([ref.data[key][i] for key in KEYS]).tolist())
            for i in range(ref.size)}
    rows = torch.cat([getattr(batch, key) for key in KEYS], dim=1)
    assert {tuple(r) for r in rows.tolist()} <= live


def test_metadata() -> None:
    """BufferBase.metadata(): capacity, state_dim, action_dim, hidden_dim, position, size
    and device (its str, or None)."""
    buf = filled(6, capacity=4)
    assert buf.metadata() == {"capacity": 4, "state_dim": S, "action_dim": A,
                              "hidden_dim": H, "position": 2, "size": 4, "device": None}
    cpu = ReplayBuffer(4, S, A, H, device=torch.device("cpu"))
    assert cpu.metadata()["device"] == "cpu"
    json.dumps(buf.metadata())


def test_state_dict() -> None:
    """BufferBase.state_dict(): tensors states, actions, rewards, next_states, dones,
    hiddens, each (capacity, features), indexed by insertion position."""
    buf = filled(3, capacity=5)
    sd = buf.state_dict()
    assert list(sd) == KEYS
    assert sd["states"][:3, 0].tolist() == [0.0, 1.0, 2.0]
    assert sd["next_states"][:3, 0].tolist() == [1.0, 2.0, 3.0]
    assert sd["dones"][:, 0].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert sd["hiddens"][:3, 0].tolist() == [0.0, -1.0, -2.0]
    assert float(sd["states"][3:].abs().sum()) == 0.0


def test_save_writes_velora_files(tmp_path: Path) -> None:
    """BufferBase.save(dirpath, prefix='buffer_'): <prefix>metadata.json (the metadata,
    indented JSON) and <prefix>state.safetensors (the state_dict); folders are created."""
    assert inspect.signature(BufferBase.save).parameters["prefix"].default == "buffer_"
    buf = filled(6, capacity=4)
    target = tmp_path / "a" / "b"
    buf.save(target)
    assert sorted(p.name for p in target.iterdir()) == ["buffer_metadata.json",
                                                        "buffer_state.safetensors"]
    text = (target / "buffer_metadata.json").read_text()
    assert json.loads(text) == buf.metadata() and "\n  " in text
    tensors = load_file(target / "buffer_state.safetensors")
    assert set(tensors) == set(KEYS)
    for key, value in buf.state_dict().items():
        assert torch.equal(tensors[key], value), key
    buf.save(target, prefix="run1_")
    assert (target / "run1_metadata.json").exists()
    assert (target / "run1_state.safetensors").exists()


def test_save_files_are_byte_for_byte_velora_files(tmp_path: Path) -> None:
    """BufferBase.save (reference source): the metadata file is exactly
    ``json.dumps(self.metadata(), indent=2)`` and the state file exactly
    ``safetensors.torch.save_file(self.state_dict(), ...)``: the files velora writes for the
    same items are the files written here, byte for byte (wrapped buffer included)."""
    buf = filled(7, capacity=5)
    buf.save(tmp_path)
    text = (tmp_path / "buffer_metadata.json").read_text()
    assert text == json.dumps(buf.metadata(), indent=2)
    save_file(buf.state_dict(), tmp_path / "velora_state.safetensors")
    assert (tmp_path / "buffer_state.safetensors").read_bytes() == (
        tmp_path / "velora_state.safetensors"
    ).read_bytes()


def test_save_names_files_with_velora_path_rules(tmp_path: Path) -> None:
    """BufferBase.save (reference source): the files are
    ``Path(dirpath, f"{prefix}metadata").with_suffix(".json")`` and
    ``Path(dirpath, f"{prefix}state").with_suffix(".safetensors")``, so a prefix holding a
    dot is cut at it, as in velora; load finds the state by the same rule."""
    buf = filled(3)
    for prefix in ("run.v1_", "ckpt-", ""):
        folder = tmp_path / (prefix or "plain")
        buf.save(folder, prefix=prefix)
        want = {
            Path(folder, f"{prefix}metadata").with_suffix(".json").name,
            Path(folder, f"{prefix}state").with_suffix(".safetensors").name,
        }
        assert {p.name for p in folder.iterdir()} == want, prefix
    assert want == {"metadata.json", "state.safetensors"}
    assert {p.name for p in (tmp_path / "run.v1_").iterdir()} == {"run.json", "run.safetensors"}
    again = ReplayBuffer.load(tmp_path / "run.v1_" / "run", buf.metadata())
    assert torch.equal(again.states, buf.states)


def test_load_is_a_classmethod_that_builds_the_calling_class(tmp_path: Path) -> None:
    """BufferBase.load (classmethod, returns Self): called on a subclass it returns an
    instance of that subclass (velora builds ``cls(...)``), holding the saved items."""

    class Tagged(ReplayBuffer):
        tag = "mine"

    buf = filled(4)
    buf.save(tmp_path)
    meta = json.loads((tmp_path / "buffer_metadata.json").read_text())
    again = Tagged.load(tmp_path / "buffer_state.safetensors", meta)
    assert type(again) is Tagged and again.tag == "mine"
    assert torch.equal(again.hiddens, buf.hiddens) and len(again) == 4
    base = BufferBase.load(tmp_path / "buffer_state.safetensors", meta)
    assert type(base) is BufferBase and len(base) == 4


def test_load_round_trip(tmp_path: Path) -> None:
    """BufferBase.load(state_path, metadata) (classmethod): a new buffer of the same type
    with the saved items, position and size; the suffix of state_path may be left out;
    a None device loads on the CPU."""
    buf = filled(7, capacity=5)  # wrapped: position 2
    buf.save(tmp_path)
    meta = json.loads((tmp_path / "buffer_metadata.json").read_text())
    for path in (tmp_path / "buffer_state.safetensors", str(tmp_path / "buffer_state")):
        again = ReplayBuffer.load(path, meta)
        assert type(again) is ReplayBuffer
        assert again.metadata() == {**meta, "device": "cpu"}
        assert again.device == torch.device("cpu")
        for key, value in buf.state_dict().items():
            assert torch.equal(again.state_dict()[key], value), key
    # it continues where it stopped: the next add overwrites the oldest (position 2)
    again.add(*item(100))
    assert again.states[:, 0].tolist() == [5.0, 6.0, 100.0, 3.0, 4.0]
    assert again.position == 3


def test_load_files_written_by_velora_scheme(tmp_path: Path) -> None:
    """BufferBase.load: files in velora's documented format (save_file of the six
    tensors + the metadata dict), not written by this front end, load exactly."""
    ref = Reference(6)
    ref.add_multi(*items(0, 8))
    save_file({k: v.contiguous() for k, v in ref.data.items()}, tmp_path / "x_state.safetensors")
    meta = {"capacity": 6, "state_dim": S, "action_dim": A, "hidden_dim": H,
            "position": ref.position, "size": ref.size, "device": None}
    buf = ReplayBuffer.load(tmp_path / "x_state.safetensors", meta)
    assert (buf.position, len(buf)) == (2, 6)
    for key, value in buf.state_dict().items():
        assert torch.equal(value, ref.data[key]), key
    bad = dict(meta, state_dim=S + 1)
    with pytest.raises(rb.CheckpointError, match="states"):
        ReplayBuffer.load(tmp_path / "x_state.safetensors", bad)
    with pytest.raises(rb.CheckpointError, match="position"):
        ReplayBuffer.load(tmp_path / "x_state.safetensors", dict(meta, size=3))


def test_replay_buffer_init_and_config() -> None:
    """ReplayBuffer.__init__ (same parameters as BufferBase) and ReplayBuffer.config():
    a BufferConfig with type 'ReplayBuffer', capacity and the three dimensions."""
    sig = inspect.signature(ReplayBuffer.__init__)
    assert sig == inspect.signature(BufferBase.__init__)
    cfg = ReplayBuffer(9, S, A, H).config()
    assert isinstance(cfg, BufferConfig)
    assert cfg.model_dump() == {"type": "ReplayBuffer", "capacity": 9, "state_dim": S,
                                "action_dim": A, "hidden_dim": H}


def test_sample_shapes_and_rows() -> None:
    """ReplayBuffer.sample(batch_size): a BatchExperience whose items all have the shape
    (batch_size, features), float32, rows of stored experiences."""
    buf = filled(40, capacity=64)
    batch = buf.sample(32)
    assert isinstance(batch, BatchExperience)
    shapes = {k: tuple(getattr(batch, k).shape) for k in KEYS}
    assert shapes == {"states": (32, S), "actions": (32, A), "rewards": (32, 1),
                      "next_states": (32, S), "dones": (32, 1), "hiddens": (32, H)}
    assert all(getattr(batch, k).dtype == torch.float32 for k in KEYS)
    i = batch.states[:, 0]
    assert torch.equal(batch.next_states[:, 0], i + 1)
    assert torch.allclose(batch.rewards[:, 0], i / 10)
    assert torch.equal(batch.dones[:, 0], (i % 3 == 2).float())
    assert torch.equal(batch.hiddens[:, 0], -i)
    assert set(i.tolist()) <= set(range(40))


def test_sample_raises_when_too_few() -> None:
    """ReplayBuffer.sample: ValueError when the buffer holds fewer experiences than
    batch_size (user guide, Get Samples: only after enough experience)."""
    buf = filled(6)
    with pytest.raises(ValueError, match="6"):
        buf.sample(7)
    with pytest.raises(ValueError):
        ReplayBuffer(10, S, A, H).sample(1)
    assert tuple(buf.sample(6).states.shape) == (6, S)  # exactly enough is fine


def test_sample_too_few_says_what_velora_says() -> None:
    """ReplayBuffer.sample (reference source): the ValueError reads "Buffer does not
    contain enough experiences. Available: {len}, Requested: {batch_size}"; the message
    keeps that text word for word (code that matches on it still works), names
    batch_size and says the fix."""
    buf = filled(6)
    before = buf.metadata()
    with pytest.raises(rb.EmptyBufferError) as info:
        buf.sample(7)
    text = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "Buffer does not contain enough experiences. Available: 6, Requested: 7" in text
    assert "batch_size=7" in text and "lower batch_size" in text
    assert buf.metadata() == before
    with pytest.raises(ValueError, match=re.escape("Available: 0, Requested: 1")):
        ReplayBuffer(10, S, A, H).sample(1)


def test_sample_is_uniform_and_follows_torch_seed() -> None:
    """ReplayBuffer.sample: a uniform draw over the stored items; with torch.manual_seed
    set before the buffer is built, its samples repeat."""
    buf = filled(4)
    drawn = torch.cat([buf.sample(4).states[:, 0] for _ in range(5000)]).long()
    counts = torch.bincount(drawn, minlength=4)
    assert torch.allclose(counts / 20_000, torch.full((4,), 0.25), atol=0.015)
    draws = []
    for _ in range(2):
        torch.manual_seed(3)
        b = filled(6)
        draws.append(torch.cat([b.sample(6).states[:, 0] for _ in range(3)]))
    assert torch.equal(draws[0], draws[1])


def test_warm_stores_the_agents_hidden_states() -> None:
    """ReplayBuffer.warm(agent, n_samples, num_envs): runs num_envs copies of agent.env,
    calls predict(states, hidden, train_mode=True) with the previous hidden (None first)
    on tensors on agent.device, stores each step with the hidden predict returned for it,
    until the buffer holds n_samples."""
    agent = FakeAgent("CartPole-v1")
    buf = ReplayBuffer(500, 4, 1, H)
    buf.warm(agent, 200, num_envs=4)
    assert 200 <= len(buf) < 204
    assert agent.calls[0]["hidden_in"] is None
    for prev, call in zip(agent.calls, agent.calls[1:], strict=False):
        assert call["hidden_in"] is prev["hidden"]
    assert all(c["train_mode"] is True for c in agent.calls)
    assert all(c["states"].shape == (4, 4) and c["states"].device == agent.device
               for c in agent.calls)
    logged = {tuple(c["states"][j].tolist()): (c["hidden"][j].tolist(), c["actions"][j].item())
              for c in agent.calls for j in range(4)}
    n = len(buf)
    for s, h, a in zip(buf.states[:n], buf.hiddens[:n], buf.actions[:n], strict=True):
        hidden, action = logged[tuple(s.tolist())]
        assert h.tolist() == pytest.approx(hidden) and a.item() == action


def test_warm_never_stores_a_reset_step() -> None:
    """ReplayBuffer.warm: a stored step never starts from a final observation (the next
    step of an ended copy only resets it, and is not an experience), and an ended step
    keeps its true final observation as next_state."""
    agent = FakeAgent("CartPole-v1")
    buf = ReplayBuffer(2000, 4, 1, H)
    buf.warm(agent, 1500, num_envs=3)
    n = len(buf)
    states, nxt, dones = buf.states[:n], buf.next_states[:n], buf.dones[:n, 0]
    assert dones.sum() > 10
    # CartPole ends when |x| > 2.4 or |angle| > 12 degrees: no action is taken from there
    limit = 12 * 2 * math.pi / 360
    beyond = (states[:, 0].abs() > 2.4) | (states[:, 2].abs() > limit)
    assert not beyond.any()
    ended = dones == 1
    # a terminated step ends beyond the limits (a truncated one, at 500 steps, need not)
    term = torch.as_tensor(buf.core.table.arrays["terminated"][:n, 0])
    assert ((nxt[term, 0].abs() > 2.4) | (nxt[term, 2].abs() > limit)).all()
    # every ended copy's next step (a reset) is left out, unless the run stopped first
    env_steps, n_ended = 3 * len(agent.calls), int(ended.sum())
    assert env_steps - n_ended <= n <= env_steps - n_ended + 3


def test_warm_truncation_is_a_done_and_kept_apart() -> None:
    """ReplayBuffer.warm (Pendulum-v1, time limit 200): a truncated step has dones 1 in
    batches, as velora's dones = terminated | truncated; the core keeps it truncated."""
    agent = FakeAgent("Pendulum-v1")
    buf = ReplayBuffer(1000, 3, 1, H)
    buf.warm(agent, 420, num_envs=2)
    assert len(buf) == 420 and len(agent.calls) == 211  # the two reset steps not stored
    table = buf.core.table.arrays
    assert int(table["truncated"].sum()) == 2 and int(table["terminated"].sum()) == 0
    assert float(buf.dones.sum()) == 2.0
    assert buf.hiddens[:420].abs().sum() > 0
    batch = buf.sample(420)
    assert set(batch.dones[:, 0].tolist()) <= {0.0, 1.0}


def test_warm_arguments() -> None:
    """ReplayBuffer.warm: num_envs defaults to 8 and cannot be smaller than 2 (ValueError);
    nothing is stepped when the buffer already holds n_samples."""
    sig = inspect.signature(ReplayBuffer.warm)
    assert list(sig.parameters) == ["self", "agent", "n_samples", "num_envs"]
    assert sig.parameters["num_envs"].default == 8
    agent = FakeAgent("CartPole-v1")
    buf = ReplayBuffer(100, 4, 1, H)
    for bad in (1, 0):
        with pytest.raises(ValueError, match="num_envs"):
            buf.warm(agent, 10, num_envs=bad)
    buf.warm(agent, 20)  # the default: 8 copies per predict call
    assert agent.calls[0]["states"].shape[0] == 8 and len(buf) >= 20
    calls = len(agent.calls)
    buf.warm(agent, 10)
    assert len(agent.calls) == calls


def test_warm_num_envs_below_two_says_what_velora_says() -> None:
    """ReplayBuffer.warm (reference source): num_envs < 2 raises ValueError
    "'num_envs=1' cannot be smaller than 2."; the message keeps that text word for word
    and says the fix; no env is made and nothing is stored."""
    agent = FakeAgent("CartPole-v1")
    buf = ReplayBuffer(100, 4, 1, H)
    for bad in (1, 0, -3):
        with pytest.raises(rb.ConfigError) as info:
            buf.warm(agent, 10, num_envs=bad)
        assert isinstance(info.value, ValueError)
        assert f"'num_envs={bad}' cannot be smaller than 2." in str(info.value)
        assert "num_envs=2 or more" in str(info.value)
    assert agent.calls == [] and len(buf) == 0


def test_warm_beyond_capacity_raises() -> None:
    """ReplayBuffer.warm: n_samples is the size to reach; more than capacity can never be
    reached, and raises ValueError instead of running forever."""
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(10, 4, 1, H).warm(FakeAgent("CartPole-v1"), 11, num_envs=2)


def test_torch_storage_path_matches_numpy_path(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    """BufferBase(device=...): off the CPU the core keeps torch tensors on the device;
    that path (forced here on the CPU) gives the same state, batches and files."""
    bufs = []
    for numpy_storage in (True, False):
        monkeypatch.setattr(velora, "_uses_numpy", lambda device, v=numpy_storage: v)
        torch.manual_seed(0)
        buf = ReplayBuffer(6, S, A, H)
        assert buf.core.backend.name == ("numpy" if numpy_storage else "torch")
        for i in range(4):
            buf.add(*item(i, done=i == 1))
        buf.add_multi(*items(4, 5))
        bufs.append(buf)
    a, b = bufs
    for key in KEYS:
        assert torch.equal(a.state_dict()[key], b.state_dict()[key]), key
    # both draw velora's indices from torch's global generator: the same batches
    for seed in range(3):
        batches = []
        for buf in (a, b):
            torch.manual_seed(seed)
            batches.append(buf.sample(6))
        for key in KEYS:
            assert torch.equal(getattr(batches[0], key), getattr(batches[1], key)), key
    b.save(tmp_path)
    meta = json.loads((tmp_path / "buffer_metadata.json").read_text())
    again = ReplayBuffer.load(tmp_path / "buffer_state.safetensors", meta)
    assert torch.equal(again.state_dict()["next_states"], a.state_dict()["next_states"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device() -> None:  # pragma: no cover - needs a GPU
    """BufferBase(device=cuda): storage and batches on the GPU."""
    buf = ReplayBuffer(10, S, A, H, device=torch.device("cuda"))
    buf.add(*item(0))
    buf.add_multi(*(t.cuda() for t in items(1, 3)))
    assert buf.core.backend.name == "torch"
    batch = buf.sample(4)
    assert all(getattr(batch, k).device.type == "cuda" for k in KEYS)
    assert buf.metadata()["device"] == "cuda"
    torch.manual_seed(2)  # velora's draw: torch.randint on the device's generator
    batch = buf.sample(4)
    torch.manual_seed(2)
    idx = torch.randint(0, len(buf), (4,), device="cuda")
    assert torch.equal(batch.states, buf.states[idx])


# ---------------------------------------------------------------- user guide

GUIDE = '''
import json
from pathlib import Path

import gymnasium as gym
import torch
import torch.nn as nn

from velora.buffer import ReplayBuffer, BatchExperience

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)

capacity, state_dim, action_dim, hidden_dim = 5_000, 4, 1, 8
batch_size, gamma = 64, 0.99

buffer = ReplayBuffer(capacity, state_dim, action_dim, hidden_dim, device=device)


class Agent:
    """The agent warm() runs: env, device and predict(states, hidden, train_mode)."""

    def __init__(self) -> None:
        self.env = gym.make("CartPole-v1")
        self.device = device
        self.q = nn.Sequential(nn.Linear(state_dim, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
        self.cell = nn.RNNCell(state_dim, hidden_dim).to(device)

    def predict(self, states, hidden=None, train_mode=False):
        with torch.no_grad():
            hidden = self.cell(states.float(), hidden)
            return self.q(states.float()).argmax(-1), hidden


agent = Agent()
optim = torch.optim.Adam(agent.q.parameters(), lr=1e-3)

# Warming the Buffer
buffer.warm(agent, batch_size * 2)
assert len(buffer) >= batch_size * 2

# Add One Item: a Tuple of experience, or the individual items
env = agent.env
state, _ = env.reset(seed=0)
state = torch.tensor(state, device=device)
hidden = None
for step in range(300):
    action, hidden = agent.predict(state.unsqueeze(0), hidden)
    next_state, reward, terminated, truncated, _ = env.step(int(action.item()))
    next_state = torch.tensor(next_state, device=device)
    done = terminated or truncated
    experience = (state, action.float(), float(reward), next_state, done, hidden[0])
    if step % 2:
        buffer.add(*experience)
    else:
        buffer.add(state, action.float(), float(reward), next_state, done, hidden[0])
    state = torch.tensor(env.reset()[0], device=device) if done else next_state

    # Get Samples, and a DQN update with BatchExperience
    batch: BatchExperience = buffer.sample(batch_size)
    q = agent.q(batch.states).gather(1, batch.actions.long())
    with torch.no_grad():
        next_q = agent.q(batch.next_states).max(1, keepdim=True).values
    target = batch.rewards + gamma * (1 - batch.dones) * next_q
    loss = nn.functional.mse_loss(q, target)
    optim.zero_grad()
    loss.backward()
    optim.step()

# Add Multiple Items: everything a torch.Tensor
n = 10
buffer.add_multi(torch.zeros((n, state_dim)), torch.zeros((n, action_dim)), torch.ones(n),
                 torch.zeros((n, state_dim)), torch.zeros(n), torch.zeros((n, hidden_dim)))

# Check Size
size = len(buffer)

# Saving and Loading
buffer.save("checkpoints/buffer", prefix="buffer_")
with Path("checkpoints/buffer/buffer_metadata.json").open("r") as f:
    metadata = json.load(f)
loaded = ReplayBuffer.load("checkpoints/buffer/buffer_state.safetensors", metadata)
assert len(loaded) == size
'''


def test_user_guide_runs_with_one_import_changed(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """User guide (Replay Buffer, Add One Item, Add Multiple Items, Get Samples, Warming
    the Buffer, Check Size, Full Replay Example, Saving, Loading, BatchExperience): a DQN
    loop in the guide's style runs with only its velora import changed."""
    source = GUIDE.replace("from velora.buffer import", "from replaybank.compat.velora import")
    assert source.count("\n") == GUIDE.count("\n") and source != GUIDE
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {"__name__": "velora_guide"}
    exec(compile(source, "velora_guide.py", "exec"), scope)
    loaded, buffer = scope["loaded"], scope["buffer"]
    for key, value in buffer.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert loaded.metadata()["position"] == buffer.metadata()["position"]
    assert torch.isfinite(scope["loss"])
    assert (tmp_path / "checkpoints/buffer/buffer_state.safetensors").exists()


# ---------------------------------------------------------------- hardening (issue items 4,
# 9, 18, 19): hostile arguments raise library errors and leave the buffer unchanged


def snapshot(buf: BufferBase) -> dict[str, Any]:
    """Everything a call could change: the velora tensors, position/size, the core's
    flags and generator state."""
    arrays = buf.core.table.arrays if buf.core.allocated else {}
    return {"sd": {k: v.clone() for k, v in buf.state_dict().items()},
            "meta": buf.metadata(),
            "flags": {k: np.array(arrays[k], copy=True) for k in ("terminated", "truncated")
                      if k in arrays},
            "rng": json.dumps(buf.core.rng.bit_generator.state, default=str)}


def assert_unchanged(buf: BufferBase, before: dict[str, Any]) -> None:
    after = snapshot(buf)
    assert after["meta"] == before["meta"]
    assert after["rng"] == before["rng"]
    for key, value in before["sd"].items():
        assert torch.equal(after["sd"][key].nan_to_num(7.0), value.nan_to_num(7.0)), key
    for key, value in before["flags"].items():
        assert np.array_equal(after["flags"][key], value), key


def with_field(i: int, value: Any) -> tuple[Any, ...]:
    """A good experience (item 3) with argument number ``i`` of add replaced."""
    args = list(item(3))
    args[i] = value
    return tuple(args)


ADD_ARGS = ["state", "action", "reward", "next_state", "done", "hidden"]


@pytest.mark.parametrize("index,value", [
    (0, None), (1, None), (3, None), (5, None),
    (0, "abcd"), (1, [None, 1.0]), (3, object()), (5, np.array(["a", "b", "c"])),
])
def test_add_refuses_none_and_non_numbers(index: int, value: Any) -> None:
    """Issue item 4: add(state=None) (action, next_state, hidden likewise) was stored as a
    row of NaN; velora's tensor assignment raises. Now a DtypeError naming the argument;
    nothing is stored."""
    buf = filled(3)
    before = snapshot(buf)
    with pytest.raises(rb.DtypeError, match=rf"add\({ADD_ARGS[index]}="):
        buf.add(*with_field(index, value))
    assert_unchanged(buf, before)


@pytest.mark.parametrize("done", ["False", "x", float("nan"), 2, 0.5, -1, None, [1, 2],
                                  torch.zeros(3), np.array([1.0, 0.0])])
def test_add_refuses_a_done_that_is_not_a_flag(done: Any) -> None:
    """Issue item 4: done="False", nan and 2 were stored as 1.0. A done is a bool or 0/1
    (a number, or a one-element tensor/array); anything else raises naming done."""
    buf = filled(3)
    before = snapshot(buf)
    with pytest.raises(rb.ReplayBankError, match=r"add\(done="):
        buf.add(*with_field(4, done))
    assert_unchanged(buf, before)


def test_add_takes_every_form_of_flag_and_number() -> None:
    """BufferBase.add: the done forms velora's assignment takes as 0/1 (bools, 0/1
    numbers, one-element tensors and arrays) and the reward forms (numbers, one-element
    tensors/arrays) are stored as before."""
    buf = ReplayBuffer(16, S, A, H)
    dones = [True, False, 1, 0, 1.0, np.bool_(True), np.int64(1), torch.tensor(True),
             torch.tensor([1.0]), np.array([[0]])]
    rewards = [1.5, 2, np.float32(0.5), torch.tensor(3.0), torch.tensor([4.0]),
               np.array([[5.0]]), True, float("nan")]  # NaN is data, as in velora
    for k, (d, r) in enumerate(zip(dones, rewards + [0.0] * 2, strict=True)):
        buf.add(*with_field(2, r)[:4], d, torch.zeros(H))
        assert buf.dones[k].item() == float(bool(np.asarray(d).item()))
    got = buf.rewards[:8, 0]
    assert got[:7].tolist() == [1.5, 2.0, 0.5, 3.0, 4.0, 5.0, 1.0] and got[7].isnan()


def _bad_agent(**kwargs: Any) -> Any:
    agent = FakeAgent("CartPole-v1")
    for key, value in kwargs.items():
        setattr(agent, key, value)
    return agent


def _predicting(result: Any) -> Any:
    agent = FakeAgent("CartPole-v1")
    agent.predict = lambda states, hidden, train_mode=False: result  # type: ignore[method-assign]
    return agent


def _corrupt_file(tmp: Path) -> Path:
    path = tmp / "corrupt_state.safetensors"
    path.write_bytes(b"\x00\x01 not a safetensors file")
    return path


META = {"capacity": 10, "state_dim": S, "action_dim": A, "hidden_dim": H, "position": 3,
        "size": 3, "device": None}

#: (label, call on a buffer holding 3 items (and a temporary folder), error type, message)
BAD_CALLS: list[tuple[str, Any, type[Exception], str]] = [
    # constructors
    ("capacity=None", lambda b, t: ReplayBuffer(None, S, A, H), rb.CapacityError, "capacity"),
    ("capacity='10'", lambda b, t: ReplayBuffer("10", S, A, H), rb.CapacityError, "capacity"),
    ("capacity=0", lambda b, t: ReplayBuffer(0, S, A, H), rb.CapacityError, "capacity"),
    ("capacity=nan", lambda b, t: ReplayBuffer(float("nan"), S, A, H), rb.CapacityError,
     "capacity"),
    ("state_dim=0", lambda b, t: ReplayBuffer(10, 0, A, H), rb.ConfigError, "state_dim"),
    ("state_dim=-1", lambda b, t: ReplayBuffer(10, -1, A, H), rb.ConfigError, "state_dim"),
    ("action_dim=None", lambda b, t: ReplayBuffer(10, 4, None, 3), rb.ConfigError,
     "action_dim"),
    ("action_dim=2.0", lambda b, t: ReplayBuffer(10, 4, 2.0, 3), rb.ConfigError, "action_dim"),
    ("hidden_dim=-1", lambda b, t: ReplayBuffer(10, 4, 1, -1), rb.ConfigError, "hidden_dim"),
    ("hidden_dim=True", lambda b, t: ReplayBuffer(10, 4, 1, True), rb.ConfigError,
     "hidden_dim"),
    ("device='nope'", lambda b, t: ReplayBuffer(10, S, A, H, device="nope"), rb.ConfigError,
     "device"),
    ("device=3.5", lambda b, t: ReplayBuffer(10, S, A, H, device=3.5), rb.ConfigError,
     "device"),
    ("seed=-1", lambda b, t: ReplayBuffer(10, S, A, H, seed=-1), rb.ConfigError, "seed"),
    ("seed='x'", lambda b, t: ReplayBuffer(10, S, A, H, seed="x"), rb.ConfigError, "seed"),
    # add
    ("add(state=None)", lambda b, t: b.add(*with_field(0, None)), rb.DtypeError, "state"),
    ("add(state=[5])", lambda b, t: b.add(*with_field(0, torch.zeros(5))), rb.ShapeError,
     "state"),
    ("add(action=None)", lambda b, t: b.add(*with_field(1, None)), rb.DtypeError, "action"),
    ("add(next_state=None)", lambda b, t: b.add(*with_field(3, None)), rb.DtypeError,
     "next_state"),
    ("add(hidden=None)", lambda b, t: b.add(*with_field(5, None)), rb.DtypeError, "hidden"),
    ("add(hidden=[4])", lambda b, t: b.add(*with_field(5, torch.zeros(H + 1))), rb.ShapeError,
     "hidden"),
    ("add(reward=None)", lambda b, t: b.add(*with_field(2, None)), rb.DtypeError, "reward"),
    ("add(reward='x')", lambda b, t: b.add(*with_field(2, "x")), rb.DtypeError, "reward"),
    ("add(reward=[1, 2])", lambda b, t: b.add(*with_field(2, [1, 2])), rb.ShapeError,
     "reward"),
    ("add(reward=tensor[3])", lambda b, t: b.add(*with_field(2, torch.zeros(3))),
     rb.ShapeError, "reward"),
    ("add(done='False')", lambda b, t: b.add(*with_field(4, "False")), rb.DtypeError, "done"),
    ("add(done=nan)", lambda b, t: b.add(*with_field(4, float("nan"))), rb.DtypeError,
     "done"),
    ("add(done=2)", lambda b, t: b.add(*with_field(4, 2)), rb.DtypeError, "done"),
    ("add(done=None)", lambda b, t: b.add(*with_field(4, None)), rb.DtypeError, "done"),
    # add_multi
    ("add_multi(states=None)", lambda b, t: b.add_multi(None, *items(0, 2)[1:]),
     rb.ReplayBankError, "states"),
    ("add_multi(actions=None)", lambda b, t: b.add_multi(*(lambda x: (x[0], None, *x[2:]))(
        items(0, 2))), rb.DtypeError, "actions"),
    ("add_multi(rewards='ab')", lambda b, t: b.add_multi(*(lambda x: (*x[:2], np.array(
        ["a", "b"]), *x[3:]))(items(0, 2))), rb.DtypeError, "rewards"),
    ("add_multi(rewards=[3])", lambda b, t: b.add_multi(*(lambda x: (*x[:2], torch.zeros(3),
                                                                      *x[3:]))(items(0, 2))),
     rb.ShapeError, "rewards"),
    ("add_multi(dones=nan)", lambda b, t: b.add_multi(*(lambda x: (*x[:4], torch.tensor(
        [0.0, float("nan")]), x[5]))(items(0, 2))), rb.DtypeError, "dones"),
    ("add_multi(dones=2)", lambda b, t: b.add_multi(*(lambda x: (*x[:4], torch.tensor(
        [0, 2]), x[5]))(items(0, 2))), rb.DtypeError, "dones"),
    ("add_multi(dones=str)", lambda b, t: b.add_multi(*(lambda x: (*x[:4], np.array(
        ["a", "b"]), x[5]))(items(0, 2))), rb.DtypeError, "dones"),
    ("add_multi(hiddens=None)", lambda b, t: b.add_multi(*items(0, 2)[:5], None),
     rb.DtypeError, "hiddens"),
    # sample
    ("sample(None)", lambda b, t: b.sample(None), rb.ConfigError, "batch_size"),
    ("sample('4')", lambda b, t: b.sample("4"), rb.ConfigError, "batch_size"),
    ("sample(2.0)", lambda b, t: b.sample(2.0), rb.ConfigError, "batch_size"),
    ("sample(0)", lambda b, t: b.sample(0), rb.ConfigError, "batch_size"),
    ("sample(-1)", lambda b, t: b.sample(-1), rb.ConfigError, "batch_size"),
    ("sample(True)", lambda b, t: b.sample(True), rb.ConfigError, "batch_size"),
    ("sample(nan)", lambda b, t: b.sample(float("nan")), rb.ConfigError, "batch_size"),
    ("sample(4) of 3", lambda b, t: b.sample(4), rb.EmptyBufferError, "batch_size"),
    # warm
    ("warm(None)", lambda b, t: b.warm(None, 5), rb.ArgumentError, "agent"),
    ("warm(agent without env)", lambda b, t: b.warm(_bad_agent(env=None), 5),
     rb.ArgumentError, "agent"),
    ("warm(agent without predict)", lambda b, t: b.warm(_bad_agent(predict=None), 5),
     rb.ArgumentError, "predict"),
    ("warm(agent.device='nope')", lambda b, t: b.warm(_bad_agent(device="nope"), 5),
     rb.ArgumentError, "device"),
    ("warm(n_samples=None)", lambda b, t: b.warm(FakeAgent("CartPole-v1"), None),
     rb.ConfigError, "n_samples"),
    ("warm(n_samples='5')", lambda b, t: b.warm(FakeAgent("CartPole-v1"), "5"),
     rb.ConfigError, "n_samples"),
    ("warm(n_samples=-1)", lambda b, t: b.warm(FakeAgent("CartPole-v1"), -1),
     rb.ConfigError, "n_samples"),
    ("warm(n_samples=11)", lambda b, t: b.warm(FakeAgent("CartPole-v1"), 11),
     rb.ConfigError, "n_samples"),
    ("warm(num_envs=None)", lambda b, t: b.warm(FakeAgent("CartPole-v1"), 5, None),
     rb.ConfigError, "num_envs"),
    ("warm(num_envs=1)", lambda b, t: b.warm(FakeAgent("CartPole-v1"), 5, 1),
     rb.ConfigError, "num_envs"),
    ("warm(num_envs=2.5)", lambda b, t: b.warm(FakeAgent("CartPole-v1"), 5, 2.5),
     rb.ConfigError, "num_envs"),
    ("warm(predict -> one value)", lambda b, t: b.warm(_predicting(torch.zeros(2)), 5, 2),
     rb.ArgumentError, "predict"),
    ("warm(predict -> no hidden)", lambda b, t: b.warm(_predicting(
        (torch.zeros(2, dtype=torch.long), None)), 5, 2), rb.ArgumentError, "hidden"),
    ("warm(predict -> 3 actions)", lambda b, t: b.warm(_predicting(
        (torch.zeros(3, dtype=torch.long), torch.zeros(2, H))), 5, 2), rb.ShapeError,
     "actions"),
    ("warm(predict -> hidden [2, 4])", lambda b, t: b.warm(_predicting(
        (torch.zeros(2, dtype=torch.long), torch.zeros(2, H + 1))), 5, 2), rb.ShapeError,
     "hidden"),
    ("warm(predict -> action 7)", lambda b, t: b.warm(_predicting(
        (torch.full((2,), 7, dtype=torch.long), torch.zeros(2, H))), 5, 2), rb.ArgumentError,
     "actions"),
    # save / load
    ("save(None)", lambda b, t: b.save(None), rb.ArgumentError, "dirpath"),
    ("save(prefix=None)", lambda b, t: b.save(t, prefix=None), rb.ArgumentError, "prefix"),
    ("save(a file)", lambda b, t: b.save(_corrupt_file(t)), rb.CheckpointError, "dirpath"),
    ("load(None, meta)", lambda b, t: ReplayBuffer.load(None, META), rb.ArgumentError,
     "state_path"),
    ("load(path, {})", lambda b, t: ReplayBuffer.load(t / "x.safetensors", {}),
     rb.CheckpointError, "device"),
    ("load(path, None)", lambda b, t: ReplayBuffer.load(t / "x.safetensors", None),
     rb.CheckpointError, "metadata"),
    ("load(capacity='x')", lambda b, t: ReplayBuffer.load(t / "x.safetensors", dict(
        META, capacity="x")), rb.CheckpointError, "capacity"),
    ("load(position=-1)", lambda b, t: ReplayBuffer.load(t / "x.safetensors", dict(
        META, position=-1)), rb.CheckpointError, "position"),
    ("load(device=3)", lambda b, t: ReplayBuffer.load(t / "x.safetensors", dict(
        META, device=3)), rb.CheckpointError, "device"),
    ("load(missing file)", lambda b, t: ReplayBuffer.load(t / "missing.safetensors", META),
     rb.CheckpointError, "missing"),
    ("load(generator=x)", lambda b, t: ReplayBuffer.load(t / "x.safetensors", dict(
        META, generator={"bit_generator": "x"})), rb.CheckpointError, "generator"),
    ("load(generator damaged)", lambda b, t: ReplayBuffer.load(t / "x.safetensors", dict(
        META, generator={"bit_generator": "PCG64", "state": 3})), rb.CheckpointError,
     "generator"),
    ("load(corrupt file)", lambda b, t: ReplayBuffer.load(_corrupt_file(t), META),
     rb.CheckpointError, "corrupt"),
]


@pytest.mark.parametrize("label,call,error,name", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_hostile_arguments_raise_library_errors(label: str, call: Any, error: type[Exception],
                                                name: str, tmp_path: Path) -> None:
    """Issue item 9: every public entry point (constructor, add, add_multi, sample, warm,
    save, load) refuses hostile arguments with a replaybank error of the documented kind
    whose message names the argument; the buffer is unchanged."""
    buf = filled(3)
    before = snapshot(buf)
    with pytest.raises(error, match=name) as info:
        call(buf, tmp_path)
    assert isinstance(info.value, rb.ReplayBankError), type(info.value)
    assert_unchanged(buf, before)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 12), picks=st.lists(st.sampled_from(
    [c for c in BAD_CALLS if not c[0].startswith(("warm", "save", "load"))]),
    min_size=1, max_size=6))
def test_any_sequence_of_hostile_calls_leaves_the_buffer_as_it_was(
        n: int, picks: list[tuple[str, Any, type[Exception], str]]) -> None:
    """Issue item 9 (property): after any number of good adds, any sequence of hostile
    calls raises replaybank errors and leaves exactly the state a plain reference holds;
    the buffer then works as before."""
    ref, buf = Reference(10), ReplayBuffer(10, S, A, H)
    for k in range(n):
        ref.add(*item(k, done=k % 2 == 1))
        buf.add(*item(k, done=k % 2 == 1))
    before = snapshot(buf)
    for label, call, _error, _name in picks:
        if label == "sample(4) of 3" and n >= 4:
            continue
        with pytest.raises(rb.ReplayBankError):
            call(buf, None)
        assert_unchanged(buf, before)
    for key, value in buf.state_dict().items():
        assert torch.equal(value, ref.data[key]), key
    buf.add(*item(99))
    assert len(buf) == min(n + 1, 10)


def test_buffer_base_is_constructible_as_in_velora() -> None:
    """Issue item 18 (BufferBase, Customization: Buffers): velora's BufferBase is a plain
    class (sample is marked abstract but nothing stops construction): BufferBase(...)
    builds a working store; its sample says to use ReplayBuffer or define sample, as a
    replaybank error that is also a NotImplementedError."""
    base = BufferBase(4, S, A, H)
    base.add(*item(0))
    base.add_multi(*items(1, 2))
    assert (len(base), base.position, base.metadata()["size"]) == (3, 3, 3)
    assert base.states[:3, 0].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(NotImplementedError, match="ReplayBuffer") as info:
        base.sample(2)
    assert isinstance(info.value, rb.ReplayBankError)


def test_buffer_base_sample_takes_velora_abstract_signature() -> None:
    """BufferBase.sample() (reference: the abstract ``sample(self)``, no parameters):
    called as velora documents it, with no argument, it raises the front end's
    AbstractSampleError (a NotImplementedError saying to use ReplayBuffer), not a
    TypeError about a missing batch_size; with a batch size it raises the same."""
    base = BufferBase(4, S, A, H)
    base.add(*item(0))
    for args in ((), (2,)):
        with pytest.raises(velora.AbstractSampleError, match="ReplayBuffer") as info:
            base.sample(*args)
        assert isinstance(info.value, NotImplementedError)
    assert len(base) == 1
    inspect.signature(BufferBase.sample).bind(base)  # velora's call binds


def test_sample_follows_torch_global_generator_like_velora() -> None:
    """Issue item 19 (ReplayBuffer.sample uses torch.randint): torch.manual_seed(s) right
    before sample() reproduces the draw, and the draw is velora's own:
    states[torch.randint(0, size, (batch_size,))]."""
    buf = filled(7, capacity=10)
    torch.manual_seed(5)
    a = buf.sample(6)
    torch.manual_seed(5)
    b = buf.sample(6)
    for key in KEYS:
        assert torch.equal(getattr(a, key), getattr(b, key)), key
    torch.manual_seed(5)
    idx = torch.randint(0, len(buf), (6,))
    for key in KEYS:
        assert torch.equal(getattr(a, key), buf.state_dict()[key][idx]), key
    # wrapped: every slot is live, indexed as velora's
    full = filled(13, capacity=5)
    torch.manual_seed(1)
    batch = full.sample(5)
    torch.manual_seed(1)
    idx = torch.randint(0, 5, (5,))
    assert torch.equal(batch.next_states, full.next_states[idx])
    assert torch.equal(batch.dones, full.dones[idx])


def test_own_seed_keeps_its_generator_and_save_load_stays_exact(tmp_path: Path) -> None:
    """Issue item 19: a buffer given its own seed ignores torch's global generator (two
    buffers with one seed draw alike); save -> load gives the identical next batch, for
    the own generator (its state travels in the metadata file) and for torch's (the
    same torch seed before each sample)."""
    own = [ReplayBuffer(10, S, A, H, seed=4) for _ in range(2)]
    for buf in own:
        for i in range(6):
            buf.add(*item(i))
    torch.manual_seed(0)
    a = own[0].sample(5)
    torch.manual_seed(1)
    b = own[1].sample(5)
    assert torch.equal(a.states, b.states)
    own[0].save(tmp_path / "own")
    meta = json.loads((tmp_path / "own" / "buffer_metadata.json").read_text())
    again = ReplayBuffer.load(tmp_path / "own" / "buffer_state.safetensors", meta)
    for _ in range(3):
        x, y = own[0].sample(5), again.sample(5)
        for key in KEYS:
            assert torch.equal(getattr(x, key), getattr(y, key)), key
    for bits in (np.random.MT19937(2), np.random.Philox(2), np.random.SFC64(2)):
        mine = ReplayBuffer(10, S, A, H, seed=np.random.Generator(bits))
        for i in range(6):
            mine.add(*item(i))
        mine.save(tmp_path / type(bits).__name__)
        meta = json.loads((tmp_path / type(bits).__name__ / "buffer_metadata.json").read_text())
        same = ReplayBuffer.load(tmp_path / type(bits).__name__ / "buffer_state", meta)
        assert torch.equal(mine.sample(5).states, same.sample(5).states)
    glob = filled(8, capacity=6)
    glob.save(tmp_path / "glob")
    meta = json.loads((tmp_path / "glob" / "buffer_metadata.json").read_text())
    assert meta == glob.metadata()  # velora's keys only: no generator of its own
    loaded = ReplayBuffer.load(tmp_path / "glob" / "buffer_state.safetensors", meta)
    torch.manual_seed(9)
    x = glob.sample(6)
    torch.manual_seed(9)
    y = loaded.sample(6)
    for key in KEYS:
        assert torch.equal(getattr(x, key), getattr(y, key)), key


def test_load_refuses_dones_that_are_not_flags(tmp_path: Path) -> None:
    """BufferBase.load: a file whose dones hold a value other than 0/1 among the stored
    items (velora's add stored any float) raises CheckpointError naming 'dones'; rows
    beyond size are not read."""
    ref = Reference(6)
    ref.add_multi(*items(0, 4))
    ref.data["dones"][1] = 2.0
    save_file({k: v.contiguous() for k, v in ref.data.items()}, tmp_path / "b_state.safetensors")
    meta = {"capacity": 6, "state_dim": S, "action_dim": A, "hidden_dim": H, "position": 4,
            "size": 4, "device": None}
    with pytest.raises(rb.CheckpointError, match="dones"):
        ReplayBuffer.load(tmp_path / "b_state.safetensors", meta)
    ref.data["dones"][1] = 0.0
    ref.data["dones"][5] = float("nan")  # beyond size: never read
    save_file({k: v.contiguous() for k, v in ref.data.items()}, tmp_path / "b_state.safetensors")
    assert len(ReplayBuffer.load(tmp_path / "b_state.safetensors", meta)) == 4


def _multi(n: int = 3) -> dict[str, Any]:
    return dict(states=torch.zeros(n, 4), actions=torch.zeros(n, 1), rewards=torch.zeros(n),
                next_states=torch.ones(n, 4), dones=torch.zeros(n), hiddens=torch.zeros(n, 1))


@pytest.mark.parametrize(("arg", "value", "said"), [
    ("states", [(torch.zeros(2), torch.ones(2))] * 3,
     r"^states=\[3 items: \(Tensor\(shape=\(2,\).*are tuples holding arrays"),
    ("states", (torch.zeros(4), torch.ones(4), torch.ones(4)),
     r"^states=\(Tensor\(shape=\(4,\).*a tuple holding arrays is"),
    ("hiddens", (np.zeros((3, 1), np.float32),), r"^hiddens=\(array\(shape=\(3, 1\).*a tuple"),
])
def test_add_multi_refuses_tuples_holding_arrays_as_the_core_does(arg: str, value: Any,
                                                                  said: str) -> None:
    """add_multi converted its values itself (np.asarray), past the core's tuple rule: a
    tuple of per-step rows was stacked and stored, a list of per-step tuples refused as
    a shape misfit. Both raise the core's ShapeError (spec.check_tuple), with velora's
    fix, and nothing is stored."""
    buf = ReplayBuffer(8, 4, 1, 1)
    buf.add_multi(**_multi(2))
    fields = ("states", "actions", "rewards", "next_states", "dones", "hiddens")
    before = [getattr(buf, f).clone() for f in fields]
    with pytest.raises(rb.ShapeError, match=said + r".*which numpy would stack part-first.*"
                       rf"Pass {arg} as one tensor \(n, dim\)"):
        buf.add_multi(**{**_multi(), arg: value})
    assert len(buf) == 2
    assert all(torch.equal(getattr(buf, f), b) for f, b in zip(fields, before, strict=True))


VELORA_FIELDS = ("states", "actions", "rewards", "next_states", "dones", "hiddens")


@pytest.mark.parametrize(("arg", "value"), [
    ("state", (np.array([1.0, 2.0], np.float32),)),  # stacked to (1, 2): fit and stored
    ("state", (torch.ones(1), torch.ones(1))),  # stacked to (2, 1): a shape misfit
    ("hidden", (torch.zeros(1),)),
    ("reward", (np.ones(1, np.float32),)),  # read as the number 1.0 and stored
    ("done", (np.ones(1),)),
])
def test_add_refuses_tuples_holding_arrays_as_the_core_does(arg: str, value: Any) -> None:
    """add (one experience) converted its values itself, past the core's tuple rule that
    add_multi applies: a tuple of arrays was stacked part-first, and where that fit the
    field (``state=(array([1.0, 2.0]),)``, ``reward=(array([1.0]),)``) it was stored. It
    raises the core's ShapeError (spec.check_tuple) naming the argument and velora's fix;
    nothing is stored."""
    buf = ReplayBuffer(8, 2, 1, 1)
    buf.add(torch.zeros(2), torch.zeros(1), 0.0, torch.ones(2), False, torch.zeros(1))
    before = [getattr(buf, f).clone() for f in VELORA_FIELDS]
    args = {"state": torch.zeros(2), "action": torch.zeros(1), "reward": 1.0,
            "next_state": torch.ones(2), "done": False, "hidden": torch.zeros(1)}
    with pytest.raises(rb.ShapeError, match=rf"^{arg}=\(.*a tuple holding arrays is .*"
                       rf"Pass {arg} as one (tensor \(dim,\)|number), as velora's add"):
        buf.add(**{**args, arg: value})
    assert len(buf) == 1
    assert all(torch.equal(getattr(buf, f), b)
               for f, b in zip(VELORA_FIELDS, before, strict=True))


@pytest.mark.parametrize("arg", ["state", "action", "next_state", "hidden", "states",
                                 "actions", "rewards", "next_states", "dones", "hiddens"])
def test_a_ragged_list_is_named_by_add_and_add_multi(arg: str) -> None:
    """A ragged list got the one ragged check's ShapeError without the argument
    (``[[1.0, 2.0], [3.0]]: a ragged nest ...``); it names the call and argument
    (``add(state=...): got [[1.0, 2.0], [3.0]]: a ragged nest ...``); nothing is stored."""
    buf = ReplayBuffer(8, 2, 1, 1)
    buf.add(torch.zeros(2), torch.zeros(1), 0.0, torch.ones(2), False, torch.zeros(1))
    before = [getattr(buf, f).clone() for f in VELORA_FIELDS]
    ragged = [[1.0, 2.0], [3.0]]
    if arg.endswith("s"):
        good = dict(states=torch.zeros(2, 2), actions=torch.zeros(2, 1), rewards=torch.zeros(2),
                    next_states=torch.ones(2, 2), dones=torch.zeros(2), hiddens=torch.zeros(2, 1))
        call, run = "add_multi", lambda: buf.add_multi(**{**good, arg: ragged})
    else:
        one = {"state": torch.zeros(2), "action": torch.zeros(1), "reward": 1.0,
               "next_state": torch.ones(2), "done": False, "hidden": torch.zeros(1)}
        call, run = "add", lambda: buf.add(**{**one, arg: ragged})
    with pytest.raises(rb.ShapeError) as err:
        run()
    assert str(err.value).startswith(
        f"{call}({arg}=...): got [[1.0, 2.0], [3.0]]: a ragged nest, rows of different "
        "lengths ([1] has shape (1,) but [0] has shape (2,))"), str(err.value)
    assert len(buf) == 1
    assert all(torch.equal(getattr(buf, f), b)
               for f, b in zip(VELORA_FIELDS, before, strict=True))


@pytest.mark.parametrize("clone", ["pickle", "deepcopy", "torch.save"])
def test_a_pickled_buffer_draws_what_the_original_draws(clone: str, tmp_path: Path) -> None:
    """Pickling (pickle, copy.deepcopy, torch.save) gives an equal, independent buffer
    that goes on exactly as the original (it raised TypeError: cannot pickle 'module')."""
    import copy
    import pickle

    buf = ReplayBuffer(6, state_dim=3, action_dim=1, hidden_dim=2, seed=0)
    for i in range(8):  # wraps
        buf.add(torch.full((3,), float(i)), torch.zeros(1), float(i), torch.ones(3) * i,
                i % 3 == 2, torch.zeros(2))
    buf.sample(4)
    if clone == "pickle":
        twin = pickle.loads(pickle.dumps(buf))
    elif clone == "deepcopy":
        twin = copy.deepcopy(buf)
    else:
        torch.save(buf, tmp_path / "buf.pt")
        twin = torch.load(tmp_path / "buf.pt", weights_only=False)
    for i in range(3):
        a, b = buf.sample(5), twin.sample(5)
        assert all(torch.equal(getattr(a, f.name), getattr(b, f.name))
                   for f in dataclasses.fields(a))
        for x in (buf, twin):
            x.add(torch.full((3,), -float(i)), torch.ones(1), 1.0, torch.zeros(3), False,
                  torch.ones(2))
    assert (twin.position, len(twin)) == (buf.position, len(buf))
    assert all(torch.equal(v, twin.state_dict()[k]) for k, v in buf.state_dict().items())
