"""Checkpoints: exact round trips for every buffer type, atomic writes, clear errors."""

from __future__ import annotations

import copy
import errno
import json
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open

import replaybank as rb
from replaybank import persist
from replaybank.errors import CheckpointError
from replaybank.io import checkpoint as ck
from replaybank.io import safetensors_stream as sts
from replaybank.io.state_tree import join_state, split_state
from tests.roundtrip import add_random, assert_roundtrip, assert_same, assert_same_state


def filled(buf: Any, steps: int = 40, seed: int = 0, **kw: Any) -> Any:
    add_random(buf, np.random.default_rng(seed), steps, **kw)
    return buf


# ---------------------------------------------------------------------- round trips
REPLAY_CASES = {
    "single": lambda: rb.ReplayBuffer(32, seed=1),
    "lanes": lambda: rb.ReplayBuffer(24, num_envs=3, seed=2),
    "nstep": lambda: rb.ReplayBuffer(30, num_envs=2, n_step=3, gamma=0.9, seed=3),
    "framestack": lambda: rb.ReplayBuffer(30, frame_stack=3, seed=4),
    "lane_split": lambda: rb.ReplayBuffer(20, num_envs=2, lane_split="random", seed=5),
    "per": lambda: rb.PrioritizedReplayBuffer(32, alpha=0.7, beta=0.5, seed=6),
    "per_lanes": lambda: rb.PrioritizedReplayBuffer(32, num_envs=4, n_step=2, seed=7),
    "recent": lambda: rb.ReplayBuffer(32, sampler=rb.RecentSampler(c_min=4), seed=8),
    "recent_per": lambda: rb.ReplayBuffer(
        32, sampler=rb.RecentSampler(c_min=4, prioritized=rb.PrioritizedSampler()), seed=9),
}


@pytest.mark.parametrize("name", sorted(REPLAY_CASES))
@pytest.mark.parametrize("steps", [5, 70])  # partly filled, wrapped around several times
def test_roundtrip_replay_types(name: str, steps: int, tmp_path: Path) -> None:
    buf = filled(REPLAY_CASES[name](), steps)
    if isinstance(buf.sampler, rb.PrioritySampler):
        batch = buf.sample(6)
        buf.update_priorities(batch.indices, np.linspace(0.1, 3.0, 6))
    assert_roundtrip(buf, tmp_path)


@pytest.mark.parametrize("kwargs", [
    {}, {"strategy": "episode", "n_step": 3, "sampler": "per"},
    {"strategy": "random", "relabel_unfinished": True}])
@pytest.mark.parametrize("steps", [5, 70])
def test_roundtrip_her_buffers(kwargs: dict[str, Any], steps: int, tmp_path: Path) -> None:
    """HerReplayBuffer: identical state, next sample (goal draws included) and further
    adds; the episode index is rebuilt from the loaded table."""
    from tests.test_her import Model, fill

    kwargs = dict(kwargs)
    if kwargs.pop("sampler", None):
        kwargs["sampler"] = rb.PrioritizedSampler(alpha=0.7)
    model = Model(3, 10)
    buf = rb.HerReplayBuffer(30, num_envs=3, reward_fn="test_her_reward", seed=11, **kwargs)
    fill(buf, model, steps, seed=12)
    buf.sample(8)  # the index exists before the save

    def add(b: Any, i: int) -> None:
        fill(b, copy.deepcopy(model), 1, seed=100 + i)

    assert_roundtrip(buf, tmp_path, add=add, sample=lambda b: b.sample(64))


def test_roundtrip_empty_and_spec_only(tmp_path: Path) -> None:
    assert_roundtrip(rb.ReplayBuffer(8, seed=0), tmp_path / "a", sample=None)
    spec = {"obs": ((2,), "float32"), "action": ((), "int64")}
    loaded = assert_roundtrip(rb.ReplayBuffer(8, num_envs=2, spec=spec, seed=0),
                              tmp_path / "b", sample=None)
    assert loaded.spec == rb.ReplayBuffer(8, num_envs=2, spec=spec).spec


def test_roundtrip_nested_obs_and_odd_dtypes(tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(16, num_envs=2, seed=3)
    rng = np.random.default_rng(0)
    for t in range(25):
        obs = {"pos": rng.standard_normal((2, 2)).astype(np.float16),
               "img": rng.integers(0, 255, (2, 3, 3), dtype=np.uint8)}
        buf.add(obs=obs, action=rng.standard_normal((2, 2)).astype(np.complex64),
                reward=rng.standard_normal(2), terminated=np.array([t % 5 == 0, False]),
                truncated=np.array([False, t % 7 == 0]),
                next_obs={"pos": rng.standard_normal((2, 2)).astype(np.float16),
                          "img": rng.integers(0, 255, (2, 3, 3), dtype=np.uint8)},
                extra=np.full(2, t, dtype=np.uint16))
    assert_roundtrip(buf, tmp_path, add=None)


def test_roundtrip_async_env_ids_and_side_store_growth(tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(400, num_envs=4, seed=0)
    rng = np.random.default_rng(1)
    for _ in range(150):  # every step is an episode end: the side store must grow
        ids = np.sort(rng.choice(4, size=int(rng.integers(1, 5)), replace=False))
        buf.add(env_ids=ids, obs=rng.standard_normal((len(ids), 2)).astype(np.float32),
                action=rng.integers(0, 3, len(ids)), reward=np.ones(len(ids)),
                next_obs=rng.standard_normal((len(ids), 2)).astype(np.float32),
                terminated=np.ones(len(ids), bool), truncated=np.zeros(len(ids), bool))
    assert buf.table.side_capacity > 64
    assert_roundtrip(buf, tmp_path)


def test_roundtrip_sequence_buffer(tmp_path: Path) -> None:
    buf = filled(rb.SequenceReplayBuffer(60, num_envs=2, sequence_length=4, burn_in=1,
                                         seed=0), 50)
    assert_roundtrip(buf, tmp_path, sample=lambda b: b.sample(5))


def _rollout_add(buf: Any, i: int) -> None:
    rng = np.random.default_rng(i)
    e = buf.num_envs
    buf.add(obs=rng.standard_normal((e, 3)), action=rng.integers(0, 2, e),
            reward=rng.standard_normal(e), terminated=rng.random(e) < 0.2,
            truncated=np.zeros(e, bool), value=rng.standard_normal(e),
            log_prob=rng.standard_normal(e))


def test_roundtrip_rollout_buffer(tmp_path: Path) -> None:
    buf = rb.RolloutBuffer(8, num_envs=2, gamma=0.9, gae_lambda=0.8, seed=3)
    for i in range(5):
        _rollout_add(buf, i)

    def sample(b: Any) -> Any:
        try:
            return [dict(x) for x in b.generate_batches(num_mini_batch=2)]
        except rb.EmptyBufferError:
            return b.pos

    assert_roundtrip(buf, tmp_path, sample=sample, add=_rollout_add, steps=3)
    buf.compute_returns_and_advantage(last_values=np.zeros(2))
    assert_roundtrip(buf, tmp_path / "full", sample=sample, add=None)


def test_roundtrip_path_buffer(tmp_path: Path) -> None:
    buf = rb.PathBuffer(10, gamma=0.9)
    rng = np.random.default_rng(0)
    for t in range(6):
        buf.store(rng.standard_normal(3), int(t % 2), 1.0, 0.5, -0.1)
    buf.finish_path(0.0)
    buf.store(rng.standard_normal(3), 1, 1.0, 0.5, -0.1)
    assert_roundtrip(buf, tmp_path, sample=None, add=None)


def test_roundtrip_torch_storage(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    buf = filled(rb.ReplayBuffer(24, num_envs=2, storage="torch", device="cpu", seed=0), 30)
    loaded = assert_roundtrip(buf, tmp_path)
    assert loaded.backend.name == "torch"
    as_numpy = rb.load(tmp_path, storage="numpy", device=None)
    # host draws: the same samples as numpy storage (storage="torch" draws on the device)
    host_draws = rb.load(tmp_path, storage=rb.TorchBackend("cpu", draws="host"))
    assert_same(as_numpy.sample(4), host_draws.sample(4))


def test_load_onto_a_device_without_data_is_refused_naming_load_device(tmp_path: Path) -> None:
    """``rb.load(path, device="meta")`` built a buffer whose sample raised torch's bare
    NotImplementedError ("Cannot copy out of meta tensor"): it is load's argument that
    is refused, as a ConfigError naming load(device=...) and the fix, before anything is
    built; the checkpoint still loads on a device that holds data."""
    pytest.importorskip("torch")
    filled(rb.ReplayBuffer(24, num_envs=2, storage="torch", device="cpu", seed=0), 30).save(
        tmp_path
    )
    with pytest.raises(
        rb.ConfigError,
        match=r"^load\(device='meta'\): a 'meta' tensor holds "
        r"shapes, not values.*use device='cpu'",
    ) as info:
        rb.load(tmp_path, device="meta")
    assert not isinstance(info.value, CheckpointError)  # the caller's argument, not the file
    want = rb.load(tmp_path, storage="numpy").sample(4)
    assert_same(want, rb.load(tmp_path, storage=rb.TorchBackend("cpu", draws="host")).sample(4))


def test_torch_checkpoint_loads_into_another_storage_without_device_none(
    tmp_path: Path,
) -> None:
    """The saved device belongs to the saved (torch) storage: ``storage="numpy"`` or a
    memmap ``path=`` loads the checkpoint without the user also passing ``device=None``
    (before: CheckpointError 'storage="numpy" takes neither path=None nor device='cpu'')."""
    pytest.importorskip("torch")
    buf = filled(rb.PrioritizedReplayBuffer(24, num_envs=2, storage="torch", device="cpu",
                                            seed=0), 30)
    buf.save(tmp_path / "ckpt")
    want = rb.load(tmp_path / "ckpt", storage="numpy", device=None).sample(4)
    as_numpy = rb.load(tmp_path / "ckpt", storage="numpy")
    assert as_numpy.backend.name == "numpy" and as_numpy.config().device is None
    assert_same(want, as_numpy.sample(4))
    on_disk = rb.load(tmp_path / "ckpt", path=tmp_path / "mm")
    assert on_disk.backend.name == "memmap"
    assert_same(want, on_disk.sample(4))
    on_disk.close()


def test_same_sample_after_load_beyond_first(tmp_path: Path) -> None:
    buf = filled(rb.PrioritizedReplayBuffer(64, num_envs=2, seed=11), 50)
    buf.save(tmp_path)
    back = rb.load(tmp_path)
    for _ in range(5):
        a, b = buf.sample(16), back.sample(16)
        assert_same(a, b)
        buf.update_priorities(a.indices, np.abs(a.reward) + 0.1)
        back.update_priorities(b.indices, np.abs(b.reward) + 0.1)
    assert_same_state(buf, back)


def test_classmethod_load_and_prefix(tmp_path: Path) -> None:
    buf = filled(rb.ReplayBuffer(16, seed=0), 10)
    buf.save(tmp_path, prefix="agent1_")
    assert {p.name for p in tmp_path.iterdir()} == {"agent1_metadata.json",
                                                    "agent1_state.safetensors"}
    assert_same_state(buf, rb.ReplayBuffer.load(tmp_path, prefix="agent1_"))


# ---------------------------------------------------------------------- file format
def test_files_open_with_safetensors_package(tmp_path: Path) -> None:
    buf = filled(rb.PrioritizedReplayBuffer(32, num_envs=2, seed=0), 30)
    buf.save(tmp_path)
    manifest = json.loads((tmp_path / "buffer_metadata.json").read_text())
    assert manifest["format_version"] == ck.FORMAT_VERSION
    assert manifest["metadata"]["spec"] == buf.spec.to_json()
    _, arrays = split_state(buf.state_dict())
    with safe_open(str(tmp_path / "buffer_state.safetensors"), framework="numpy") as f:
        assert set(f.keys()) == set(arrays) == set(manifest["tensors"])
        assert json.loads(f.metadata()["replaybank_manifest"]) == manifest
        for name, arr in arrays.items():
            assert_same(f.get_tensor(name), arr, name)


def test_state_split_join_all_dtypes(tmp_path: Path) -> None:
    state = {
        "a": {"f64": np.array([np.nan, -0.0, 1e300]), "bool": np.array([[True, False]]),
              "c": np.arange(4).astype(np.complex128), "be": np.arange(300, dtype=">i8"),
              "rec": np.zeros(3, dtype=[("x", "<f4"), ("y", "u1", (2,))]),
              "empty": np.zeros((0, 5), np.float32), "scalar": np.array(2.5, np.float32),
              "strided": np.arange(40, dtype=np.int32).reshape(8, 5)[::2, 1:4]},
        "json": {"big": 2**100, "neg": -3, "f": 0.1, "s": "x", "n": None, "l": [1, [2.5]]},
        "small": np.array([3, 4], np.int64),
    }
    tree, tensors = split_state(state)
    assert "small" not in tensors and "json" not in tensors
    assert_same(join_state(json.loads(json.dumps(tree)), tensors), state)
    ck.save_state(state, tmp_path, info={"note": "x"}, chunk_bytes=7)  # many tiny chunks
    manifest, back = ck.load_state(tmp_path)
    assert manifest["note"] == "x"
    assert_same(back, state)


def test_bad_state_leaves_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"object"):
        ck.save_state({"x": object()}, tmp_path)
    with pytest.raises(CheckpointError, match="keys must be str"):
        ck.save_state({"x": {1: 2}}, tmp_path)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- atomic writes
def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir()}


@pytest.mark.parametrize("fail_at", [1, 2, 3, 6])
def test_failed_save_leaves_previous_checkpoint(tmp_path: Path, fail_at: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    old = filled(rb.ReplayBuffer(64, num_envs=2, seed=0), 20)
    old.save(tmp_path)
    before = _snapshot(tmp_path)
    new = filled(rb.ReplayBuffer(64, num_envs=2, seed=1), 50, seed=5)
    calls = {"n": 0}
    real = sts.write_bytes

    def flaky(fh: Any, data: Any) -> None:
        calls["n"] += 1
        if calls["n"] == fail_at:
            real(fh, bytes(memoryview(data).cast("B")[: len(memoryview(data).cast("B")) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fh, data)

    monkeypatch.setattr(sts, "write_bytes", flaky)
    monkeypatch.setattr(ck, "write_bytes", flaky)
    with pytest.raises(CheckpointError, match=r"No space left.*free disk space"):
        new.save(tmp_path)
    monkeypatch.undo()
    assert _snapshot(tmp_path) == before  # no temp files, nothing changed
    assert_same_state(rb.load(tmp_path), old)


def test_a_save_refused_by_permissions_says_so(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The fix a failed save names is the one for its cause (a read-only directory was
    told to free disk space)."""
    buf = filled(rb.ReplayBuffer(16, seed=0), 5)

    def refused(fh: Any, data: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(sts, "write_bytes", refused)
    with pytest.raises(CheckpointError, match=r"Permission denied.*not writable by this "
                                              "process: save to a writable path") as info:
        buf.save(tmp_path)
    assert "disk space" not in str(info.value)
    assert not list(tmp_path.iterdir())


def test_interrupt_between_renames_uses_new_state(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    old = filled(rb.ReplayBuffer(32, seed=0), 10)
    old.save(tmp_path)
    new = filled(rb.ReplayBuffer(32, seed=1), 30, seed=3)
    real, calls = os.replace, {"n": 0}

    def crash_second(a: Any, b: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.EIO, "simulated crash")
        real(a, b)

    monkeypatch.setattr(ck.os, "replace", crash_second)
    with pytest.raises(CheckpointError):
        new.save(tmp_path)
    monkeypatch.undo()
    with pytest.warns(RuntimeWarning, match="interrupted save"):
        back = rb.load(tmp_path)
    assert_same_state(back, new)  # never a mix of the two


def test_overwrite_checkpoint(tmp_path: Path) -> None:
    buf = filled(rb.ReplayBuffer(32, seed=0), 10)
    buf.save(tmp_path)
    filled(buf, 30, seed=9)
    buf.save(tmp_path)
    assert_same_state(rb.load(tmp_path), buf)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["buffer_metadata.json",
                                                          "buffer_state.safetensors"]


# ---------------------------------------------------------------------- bad files
@pytest.fixture()
def saved(tmp_path: Path) -> tuple[Path, Any]:
    buf = filled(rb.ReplayBuffer(48, num_envs=2, seed=0), 30)
    buf.save(tmp_path)
    return tmp_path, buf


def _load_fails(d: Path, match: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(CheckpointError, match=match):
            rb.load(d)


def test_missing_files(saved: tuple[Path, Any], tmp_path_factory: Any) -> None:
    d, _ = saved
    _load_fails(tmp_path_factory.mktemp("empty"), "does not exist")
    (d / "buffer_metadata.json").rename(d / "x.json")
    with pytest.warns(RuntimeWarning, match="interrupted save"):  # the state file has a copy
        rb.load(d)
    (d / "x.json").rename(d / "buffer_metadata.json")
    (d / "buffer_state.safetensors").unlink()
    _load_fails(d, "state file does not exist")


@pytest.mark.parametrize("keep", [0, 5, 8, 100, -1])
def test_truncated_state_file(saved: tuple[Path, Any], keep: int) -> None:
    d, _ = saved
    p = d / "buffer_state.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[:keep] if keep >= 0 else data[:-1])
    _load_fails(d, "truncated|not valid JSON|not a safetensors")


def test_flipped_data_byte_is_a_checksum_mismatch(saved: tuple[Path, Any]) -> None:
    d, _ = saved
    p = d / "buffer_state.safetensors"
    data = bytearray(p.read_bytes())
    data[-3] ^= 0x40
    p.write_bytes(bytes(data))
    _load_fails(d, "checksum mismatch")


def test_flipped_header_byte(saved: tuple[Path, Any]) -> None:
    d, _ = saved
    p = d / "buffer_state.safetensors"
    data = bytearray(p.read_bytes())
    data[12] = ord("}")
    p.write_bytes(bytes(data))
    _load_fails(d, "not valid JSON|corrupt")


@pytest.mark.parametrize("text,match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a replaybank checkpoint manifest"),
    ('{"capacity": 4}', "not a replaybank checkpoint manifest"),
])
def test_manifest_not_a_manifest(saved: tuple[Path, Any], text: str, match: str) -> None:
    d, _ = saved
    (d / "buffer_metadata.json").write_text(text)
    _load_fails(d, match)


def test_edited_manifest_and_newer_version(saved: tuple[Path, Any]) -> None:
    d, _ = saved
    p = d / "buffer_metadata.json"
    original = p.read_text()
    m = json.loads(original)
    m["config"]["capacity"] = 96
    p.write_text(json.dumps(m))
    _load_fails(d, r"modified after saving: entries \['config'\]")
    m = json.loads(original)
    m["format_version"] = ck.FORMAT_VERSION + 1
    p.write_text(json.dumps(m))
    _load_fails(d, "newer replaybank")


def test_spec_not_matching_state_file(tmp_path: Path) -> None:
    buf = filled(rb.ReplayBuffer(16, seed=0), 5)
    meta = buf.metadata()
    meta["spec"]["obs"]["shape"] = [4]  # a self-consistent pair whose spec is wrong
    ck.save_state(buf.state_dict(), tmp_path, info={"config": buf.config().model_dump(),
                                                    "metadata": meta})
    _load_fails(tmp_path, "spec field 'obs' is")
    meta["spec"].pop("obs")
    ck.save_state(buf.state_dict(), tmp_path / "b", info={"metadata": meta})
    _load_fails(tmp_path / "b", "does not list")


def test_corrupt_load_into_leaves_buffer_unchanged(saved: tuple[Path, Any]) -> None:
    d, _ = saved
    target = filled(rb.ReplayBuffer(48, num_envs=2, seed=7), 12, seed=7)
    before = split_state(target.state_dict())
    before = (before[0], {k: v.copy() for k, v in before[1].items()})
    p = d / "buffer_state.safetensors"
    data = bytearray(p.read_bytes())
    data[-10] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        persist.load_into(target, d)
    assert_same(split_state(target.state_dict()), before)


def test_load_into_wrong_capacity(saved: tuple[Path, Any]) -> None:
    d, _ = saved
    with pytest.raises(CheckpointError, match="capacity"):
        persist.load_into(rb.ReplayBuffer(10, num_envs=2), d)


def test_load_state_dict_with_wrong_shapes_changes_nothing() -> None:
    buf = filled(rb.ReplayBuffer(16, num_envs=2, seed=0), 6)
    other = filled(rb.ReplayBuffer(16, num_envs=2, seed=1), 20, seed=3)
    state = other.state_dict()
    state["table"] = dict(state["table"])
    state["table"]["fields/reward"] = state["table"]["fields/reward"][:4]
    before = split_state(buf.state_dict())
    before = (before[0], {k: v.copy() for k, v in before[1].items()})
    with pytest.raises(CheckpointError, match="fields/reward has shape"):
        buf.load_state_dict(state)
    assert_same(split_state(buf.state_dict()), before)
    del state["table"]["side/obs"]
    with pytest.raises(CheckpointError, match="side/obs is missing"):
        buf.load_state_dict(state)
    assert_same(split_state(buf.state_dict()), before)


@pytest.mark.parametrize("name", ["single", "lanes", "per_lanes"])
def test_state_dict_is_a_snapshot(name: str) -> None:
    """A kept state_dict() is the buffer as it was at the call: adds after it (past a
    wrap of the ring) change neither its data nor its counters, and it loads as that
    buffer (it held live views of the storage beside counters copied at the call, so a
    kept state loaded later data or was refused as damaged)."""
    buf = filled(REPLAY_CASES[name](), 20)
    state = buf.state_dict()
    frozen = split_state(copy.deepcopy(state))
    twin = REPLAY_CASES[name]()
    twin.load_state_dict(copy.deepcopy(state))
    filled(buf, 50, seed=9)  # wraps every lane
    assert_same(split_state(state), frozen)
    loaded = REPLAY_CASES[name]()
    loaded.load_state_dict(state)
    assert_same_state(loaded, twin)
    assert_same(loaded.sample(16), twin.sample(16))


def test_save_writes_the_storage_without_a_copy(tmp_path: Path) -> None:
    """rb.save writes the storage's own arrays under the buffer's lock (state_views), so
    a large buffer needs no second copy to be saved; the saved buffer is unchanged."""
    from replaybank.storage.table_state import state_views

    buf = filled(rb.ReplayBuffer(32, num_envs=2, seed=0), 20)
    with state_views():
        views = buf.state_dict()["table"]["fields/reward"]
    assert np.shares_memory(views, buf.table.arrays["reward"])
    assert not np.shares_memory(buf.state_dict()["table"]["fields/reward"],
                                buf.table.arrays["reward"])
    buf.save(tmp_path)
    assert_same_state(rb.load(tmp_path), buf)


def test_frame_stack_with_stacked_image_inputs(tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(20, frame_stack=4, seed=0)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (40, 6, 6), dtype=np.uint8)

    def stack(t: int, start: int) -> np.ndarray:  # FrameStackObservation's stack at t
        return frames[np.maximum(np.arange(t - 3, t + 1), start)]

    start = 3  # episodes of frames 3..11, 12..22, 23..
    for t in range(3, 29):
        buf.add(obs=stack(t, start), action=t % 3, reward=1.0, next_obs=stack(t + 1, start),
                terminated=t % 11 == 0, truncated=False)
        start = t + 1 if t % 11 == 0 else start
    assert buf.spec["obs"].shape == (6, 6)

    def add(b: Any, i: int) -> None:
        t = 30 + i
        b.add(obs=frames[t - 4:t], action=1, reward=0.5, next_obs=frames[t - 3:t + 1],
              terminated=False, truncated=False)

    loaded = assert_roundtrip(buf, tmp_path, add=add)
    assert loaded.sample(3).obs.shape == (3, 4, 6, 6)


def test_state_files_round_trip_property() -> None:
    import tempfile

    from hypothesis import given, settings
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    dtypes = st.sampled_from(["<f8", "<f4", "<f2", "<i8", "<i4", "u1", "?", "<c8", ">f4",
                              "<u2"])
    arrays = dtypes.flatmap(lambda dt: hnp.arrays(
        np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)))
    keys = st.text("abc/_", min_size=1, max_size=4).filter(
        lambda k: k not in ("__tensor__", "__array__"))
    leaves = arrays | st.integers(-2**70, 2**70) | st.floats(allow_nan=False,
                                                             allow_infinity=False) | \
        st.none() | st.booleans() | st.text(max_size=5)
    trees = st.recursive(leaves, lambda sub: st.dictionaries(keys, sub, max_size=3),
                         max_leaves=8).map(lambda t: {"root": t})

    @settings(max_examples=25, deadline=None)
    @given(trees, st.integers(1, 64))
    def check(state: dict[str, Any], chunk: int) -> None:
        with tempfile.TemporaryDirectory() as d:
            ck.save_state(state, d, chunk_bytes=chunk)
            _, back = ck.load_state(d)
            assert_same(back, state)

    check()


@pytest.mark.parametrize("route", ["state_dict", "save"])
def test_restored_buffer_checks_sequence_td_errors_as_the_saved_one(
        route: str, tmp_path: Path) -> None:
    """update_sequence_priorities checks TD errors given without mask against the window
    widths sample_sequences returned; a restored buffer keeps them, so TD errors that
    leave out the burn-in step are refused after a resume as before it (they were
    applied to the wrong steps)."""
    buf = filled(rb.PrioritizedReplayBuffer(24, num_envs=2, seed=0), steps=12)
    batch = buf.sample_sequences(4, 3, burn_in=1)  # windows of 1 + 3 steps
    if route == "state_dict":
        restored = rb.PrioritizedReplayBuffer(24, num_envs=2, seed=5)
        restored.load_state_dict(buf.state_dict())
    else:
        buf.save(tmp_path)
        restored = rb.load(tmp_path)
    short = np.ones((4, 3))
    for b in (buf, restored):
        with pytest.raises(rb.ShapeError, match=r"windows sampled have \[4\] steps"):
            b.update_sequence_priorities(batch.starts, short)
    td = np.random.default_rng(1).random((4, 4)) + 0.1
    assert buf.update_sequence_priorities(batch.starts, td) == \
        restored.update_sequence_priorities(batch.starts, td)
    assert_same_state(buf, restored)


def test_a_damaged_sequence_widths_entry_is_refused() -> None:
    buf = filled(rb.PrioritizedReplayBuffer(24, num_envs=2, seed=0), steps=12)
    buf.sample_sequences(2, 3)
    state = buf.state_dict()
    state["sequence_widths"] = ["three"]
    other = filled(rb.PrioritizedReplayBuffer(24, num_envs=2, seed=0), steps=5, seed=1)
    before = other.state_dict()
    with pytest.raises(CheckpointError, match=r"sequence_widths=\['three'\]"):
        other.load_state_dict(state)
    assert_same_state(other, before)
