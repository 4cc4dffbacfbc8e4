"""Buffers pickle: ``pickle``, ``copy.deepcopy``, ``torch.save`` and multiprocessing give an
equal, independent buffer whose next sample is identical; memmap buffers refuse clearly."""

from __future__ import annotations

import copy
import io
import multiprocessing as mp
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import ConfigError
from tests.roundtrip import add_random, assert_same, assert_same_state
from tests.test_checkpoint import REPLAY_CASES, _rollout_add, filled


def _further(buf: Any, i: int) -> None:
    add_random(buf, np.random.default_rng(500 + i), 1)


def assert_twin(buf: Any, twin: Any, add: Any = _further, steps: int = 3) -> None:
    """``twin`` holds ``buf``'s state, shares none of its memory, and stays equal to it
    through the same further adds (each add is checked against the next sample)."""
    assert type(twin) is type(buf)
    assert_same_state(buf, twin)
    for i in range(steps + 1):
        if len(buf):
            assert_same(buf.sample(8), twin.sample(8), f"sample after {i} adds")
        if i < steps:
            add(buf, i)
            add(twin, i)
            assert_same_state(buf, twin)
    if getattr(buf, "_table", None) is not None:
        for name, arr in buf.table.arrays.items():
            assert not np.shares_memory(np.asarray(arr), np.asarray(twin.table.arrays[name]))


def _filled_case(name: str) -> Any:
    buf = filled(REPLAY_CASES[name](), 45)
    if isinstance(buf.sampler, rb.PrioritySampler):
        batch = buf.sample(6)
        buf.update_priorities(batch.indices, np.linspace(0.1, 3.0, 6))
    return buf


@pytest.mark.parametrize("writer", ["auto", "reference"])
@pytest.mark.parametrize("name", sorted(REPLAY_CASES))
def test_pickle_every_replay_type(name: str, writer: str,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAYBANK_WRITER", writer)
    buf = _filled_case(name)
    assert_twin(buf, pickle.loads(pickle.dumps(buf)))


@pytest.mark.parametrize(
    "copier", [lambda b: pickle.loads(pickle.dumps(b)), copy.deepcopy], ids=["pickle", "deepcopy"]
)
@pytest.mark.parametrize("name", sorted(REPLAY_CASES))
def test_copy_after_a_sample_draws_the_same_next_sample(name: str, copier: Any) -> None:
    """A buffer that has sampled (as every buffer in training has) copies exactly: a frame
    stack's plan buffers are views of one flat array that the kernel fills, and pickling
    copied them apart, so the copy served stale slots (other steps' frames and fields)."""
    buf = _filled_case(name)
    buf.sample(8)
    assert_twin(buf, copier(buf))


def test_torch_storage_frame_stack_copy_after_a_sample() -> None:
    pytest.importorskip("torch")
    buf = filled(
        rb.PrioritizedReplayBuffer(
            30, num_envs=2, frame_stack=2, storage="torch", device="cpu", seed=3
        ),
        40,
    )
    batch = buf.sample(8)
    buf.update_priorities(batch.indices, batch.weights + 0.5)
    assert_twin(buf, pickle.loads(pickle.dumps(buf)))


@pytest.mark.parametrize("name", ["single", "per_lanes", "recent_per", "framestack"])
def test_deepcopy_is_independent(name: str) -> None:
    buf = _filled_case(name)
    twin = copy.deepcopy(buf)
    assert_twin(buf, twin)
    before = twin.state_dict()
    _further(buf, 99)  # the original moves on: the copy does not
    assert_same_state(twin, before)


def test_pickle_empty_spec_only_and_unused_buffers() -> None:
    for buf in (rb.ReplayBuffer(8, seed=0), rb.PrioritizedReplayBuffer(8, seed=0),
                rb.ReplayBuffer(8, num_envs=2, seed=0,
                                spec={"obs": ((2,), "float32"), "action": ((), "int64")})):
        twin = pickle.loads(pickle.dumps(buf))
        assert_twin(buf, twin)


def test_pickle_sequence_path_and_rollout_buffers() -> None:
    seq = filled(rb.SequenceReplayBuffer(60, num_envs=2, sequence_length=4, burn_in=1,
                                         seed=0), 50)
    twin = pickle.loads(pickle.dumps(seq))
    assert_same_state(seq, twin)
    assert_same(seq.sample(5), twin.sample(5))

    paths = rb.PathBuffer(10, gamma=0.9)
    rng = np.random.default_rng(0)
    for t in range(6):
        paths.store(rng.standard_normal(3), int(t % 2), 1.0, 0.5, -0.1)
    paths.finish_path(0.0)
    twin_p = pickle.loads(pickle.dumps(paths))
    assert_same_state(paths, twin_p)

    roll = rb.RolloutBuffer(8, num_envs=2, gamma=0.9, gae_lambda=0.8, seed=3)
    for i in range(8):
        _rollout_add(roll, i)
    roll.compute_returns_and_advantage(last_values=np.zeros(2))
    twin_r = pickle.loads(pickle.dumps(roll))
    assert_same_state(roll, twin_r)
    want = [dict(b) for b in roll.generate_batches(num_mini_batch=2)]
    assert_same(want, [dict(b) for b in twin_r.generate_batches(num_mini_batch=2)])


def test_torch_save_and_torch_storage() -> None:
    torch = pytest.importorskip("torch")
    for buf in (_filled_case("per_lanes"),
                filled(rb.ReplayBuffer(24, num_envs=2, storage="torch", device="cpu",
                                       seed=0), 30)):
        stream = io.BytesIO()
        torch.save(buf, stream)
        stream.seek(0)
        assert_twin(buf, torch.load(stream, weights_only=False))


def _child_sample(payload: bytes) -> bytes:
    buf = pickle.loads(payload)
    return pickle.dumps((len(buf), buf.sample(8)))


def test_multiprocessing_child_draws_the_same_sample() -> None:
    buf = _filled_case("per")
    payload = pickle.dumps(buf)
    with mp.get_context("spawn").Pool(1) as pool:
        n, batch = pickle.loads(pool.apply(_child_sample, (payload,)))
    assert n == len(buf)
    assert_same(batch, buf.sample(8))


def test_memmap_buffer_refuses_with_the_fix(tmp_path: Path) -> None:
    buf = filled(rb.ReplayBuffer(16, storage="memmap", path=tmp_path / "mm", seed=0), 5)
    with pytest.raises(ConfigError, match=r"rb\.open"):
        pickle.dumps(buf)
    with pytest.raises(ConfigError, match="memmap"):
        copy.deepcopy(buf)
    assert len(buf) == 5  # still usable
    buf.sample(2)
