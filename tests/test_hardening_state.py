"""Loading state never trusts it: counters, links and sampler state are checked, a failed
load changes nothing, and a checkpoint never chooses where files are written.

Damaged checkpoints are made as a buggy writer would make them: the state is read, edited
and saved again, so every CRC is valid and only the checks of the loader stand between the
damage and the buffer (the compiled writer uses counters and links as memory offsets).
"""

from __future__ import annotations

import copy
import gc
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import CheckpointError, ConfigError
from replaybank.io.checkpoint import load_state, save_state
from replaybank.persist import load_into
from tests.roundtrip import add_random, assert_same_state


def filled(buf: Any, steps: int = 40, seed: int = 0) -> Any:
    add_random(buf, np.random.default_rng(seed), steps)
    if isinstance(buf.sampler, rb.PrioritySampler):
        batch = buf.sample(8)
        buf.update_priorities(batch.indices, np.linspace(0.1, 4.0, 8))
    return buf


def resave(d: Path, edit: Callable[[dict[str, Any]], None], prefix: str = "buffer_") -> None:
    """Edit a saved state and save it again with valid checksums (a buggy writer)."""
    manifest, state = load_state(d, prefix)
    edit(state)
    info = {k: v for k, v in manifest.items()
            if k not in ("format", "format_version", "checkpoint_id", "created", "state_file",
                         "state", "tensors")}
    save_state(state, d, prefix, info)


def edited(arr: Any, index: Any, value: Any) -> np.ndarray:
    out = np.array(arr)
    out[index] = value
    return out


def live_rows(state: dict[str, Any], lane: int) -> np.ndarray:
    """Rows of the live steps of ``lane``, oldest first."""
    t = state["table"]
    w, c = int(np.asarray(t["meta/written"])[lane]), int(np.asarray(t["meta/counts"])[lane])
    rows = np.asarray(t["meta/link"]).shape[0]
    return np.asarray(np.arange(w - c, w) % rows)


# ---------------------------------------------------------------------- table invariants
def _set_meta(name: str, index: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(state: dict[str, Any]) -> None:
        state["table"][f"meta/{name}"] = edited(state["table"][f"meta/{name}"], index, value)
    return edit


def _newest_link(value: Callable[[dict[str, Any]], int]) -> Callable[[dict[str, Any]], None]:
    def edit(state: dict[str, Any]) -> None:
        row = live_rows(state, 1)[-1]
        state["table"]["meta/link"] = edited(state["table"]["meta/link"], (row, 1),
                                             value(state))
    return edit


def _shared_slot(state: dict[str, Any]) -> None:
    rows = live_rows(state, 0)
    link = np.array(state["table"]["meta/link"])
    link[rows[0], 0] = link[rows[-1], 0]  # the oldest step takes the newest one's slot
    state["table"]["meta/link"] = link


def _drop_free_slot(state: dict[str, Any]) -> None:
    state["table"]["free_slots"] = np.asarray(state["table"]["free_slots"])[1:]


def _side_len(state: dict[str, Any]) -> int:
    return int(np.asarray(state["table"]["side/obs"]).shape[0])


TABLE_DAMAGE: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "counts_past_capacity": (_set_meta("counts", 0, 9), "meta/counts[0] = 9 is outside [0, 8]"),
    "counts_negative": (_set_meta("counts", 2, -1), "meta/counts[2] = -1"),
    "written_below_counts": (_set_meta("written", 1, 3), "meta/written[1] = 3"),
    "written_negative": (_set_meta("written", 0, -(2**40)), "meta/written[0]"),
    "written_overflows_keys": (_set_meta("written", 0, 2**62), "meta/written[0]"),
    "episodes_negative": (_set_meta("episodes", 1, -4), "meta/episodes[1] = -4"),
    "link_negative": (_newest_link(lambda s: -(2**31)), "= -2147483648 is outside"),
    "link_past_side_store": (_newest_link(lambda s: _side_len(s) + 1), "is outside [0, "),
    "newest_link_zero": (_newest_link(lambda s: 0), "newest of lane 1"),
    "slot_shared": (_shared_slot, "linked from two live steps"),
    "free_slots_stale": (_drop_free_slot, "free_slots lists"),
}


@pytest.mark.parametrize("damage", sorted(TABLE_DAMAGE))
def test_damaged_counters_and_links_are_refused_at_load(damage: str, tmp_path: Path) -> None:
    buf = filled(rb.ReplayBuffer(24, num_envs=3, seed=0), 30)  # wrapped, episodes ended
    rb.save(buf, tmp_path)
    edit, needle = TABLE_DAMAGE[damage]
    resave(tmp_path, edit)
    with pytest.raises(CheckpointError, match=r"meta/|free_slots|side slot") as info:
        rb.load(tmp_path)
    assert needle in str(info.value)
    # the same state handed to load_state_dict directly
    _, state = load_state(tmp_path)
    target = filled(rb.ReplayBuffer(24, num_envs=3, seed=1), 11, seed=5)
    before = copy.deepcopy(target)
    with pytest.raises(CheckpointError):
        target.load_state_dict(state)
    assert_same_state(target, before)


def test_lanes_out_of_step_are_valid_state(tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(24, num_envs=3, seed=0)
    rng = np.random.default_rng(0)
    for t in range(30):  # async envs: lane 2 steps twice as often
        env_ids = [2] if t % 2 else [0, 1, 2]
        m = len(env_ids)
        buf.add(obs=rng.standard_normal((m, 3)), action=np.zeros(m, np.int64),
                reward=np.ones(m), next_obs=rng.standard_normal((m, 3)),
                terminated=rng.random(m) < 0.1, truncated=np.zeros(m, bool), env_ids=env_ids)
    assert len(set(buf.table.written.tolist())) > 1
    rb.save(buf, tmp_path)
    back = rb.load(tmp_path)
    assert np.array_equal(back.sample(8).indices, buf.sample(8).indices)


def _memmap_dir(d: Path, sampler: Any = None) -> None:
    buf = filled(rb.ReplayBuffer(16, num_envs=2, storage="memmap", path=d, seed=0,
                                 sampler=sampler), 12)
    close = getattr(buf.backend, "close", None)
    if callable(close):
        close()
    del buf
    gc.collect()


def _poke(path: Path, dtype: Any, index: int, value: int) -> None:
    arr = np.memmap(path, dtype=dtype, mode="r+")
    arr[index] = value
    arr.flush()
    del arr


@pytest.mark.parametrize(("file", "dtype", "index", "value", "needle"), [
    ("meta%2Fepisodes.bin", np.int64, 1, -3, "meta/episodes[1] = -3"),
    ("meta%2Fwritten.bin", np.int64, 0, -(2**40), "meta/"),
    ("meta%2Flink.bin", np.int32, 5 * 2 + 0, 2**30, "meta/link[5, 0] = 1073741824"),
    ("meta%2Flink.bin", np.int32, 3 * 2 + 1, 0, "meta/link[3, 1] = 0"),
])
@pytest.mark.parametrize("mode", ["r+", "r"])
def test_damaged_memmap_counters_and_links_are_refused_at_open(
        file: str, dtype: Any, index: int, value: int, needle: str, mode: str,
        tmp_path: Path) -> None:
    """Also read-only (which reads the counters as a live writer's snapshot): files that
    no writer changes meanwhile are damaged, not mid-add."""
    _memmap_dir(tmp_path)  # 8 rows, 12 steps per lane: row 3 holds each lane's newest step
    _poke(tmp_path / file, dtype, index, value)
    with pytest.raises(CheckpointError) as info:
        rb.open(tmp_path, mode=mode)
    assert needle in str(info.value) and str(tmp_path) in str(info.value)


def test_damaged_resume_state_is_skipped_with_a_warning(tmp_path: Path) -> None:
    buf = filled(rb.PrioritizedReplayBuffer(16, num_envs=2, storage="memmap", path=tmp_path,
                                            seed=0), 12)
    buf.flush()
    close = getattr(buf.backend, "close", None)
    if callable(close):
        close()
    del buf
    gc.collect()

    def nan_priority(state: dict[str, Any]) -> None:
        state["sampler"]["priorities"] = edited(state["sampler"]["priorities"], 0, np.nan)

    resave(tmp_path, nan_priority, prefix="replaybank_resume_")
    with pytest.warns(rb.ResumeWarning, match="does not fit"):
        again = rb.open(tmp_path)
    assert len(again) == 16 and np.isfinite(again.sample(8).weights).all()


# ---------------------------------------------------------------------- sampler state
def _sampler_edit(key: str, value: Any, sub: str | None = None
                  ) -> Callable[[dict[str, Any]], None]:
    def edit(state: dict[str, Any]) -> None:
        s = state["sampler"] if sub is None else state["sampler"][sub]
        s[key] = edited(s[key], 3, value) if isinstance(value, float) and \
            key in ("priorities", "returns") else value
    return edit


SAMPLER_DAMAGE: dict[str, tuple[Callable[[], Any], Callable[[dict[str, Any]], None], str]] = {
    "per_nan": (lambda: rb.PrioritizedReplayBuffer(16, seed=0),
                _sampler_edit("priorities", np.nan), "priorities[3] = nan"),
    "per_negative": (lambda: rb.PrioritizedReplayBuffer(16, seed=0),
                     _sampler_edit("priorities", -1.0), "priorities[3] = -1.0"),
    "per_inf": (lambda: rb.PrioritizedReplayBuffer(16, seed=0),
                _sampler_edit("priorities", np.inf), "priorities[3] = inf"),
    "per_shape": (lambda: rb.PrioritizedReplayBuffer(16, seed=0),
                  _sampler_edit("priorities", np.ones((4, 4))), "shape (4, 4)"),
    "per_max_zero": (lambda: rb.PrioritizedReplayBuffer(16, seed=0),
                     _sampler_edit("max_priority", 0.0), "max_priority = 0.0"),
    "per_calls": (lambda: rb.PrioritizedReplayBuffer(16, seed=0),
                  _sampler_edit("calls", -2), "calls = -2"),
    "recent_eta": (lambda: rb.ReplayBuffer(16, sampler=rb.RecentSampler(c_min=4), seed=0),
                   _sampler_edit("eta", 1.5), "eta = 1.5"),
    "recent_per_nan": (lambda: rb.ReplayBuffer(16, sampler=rb.RecentSampler(
        c_min=4, prioritized=rb.PrioritizedSampler()), seed=0),
        _sampler_edit("priorities", np.nan, sub="prioritized"), "priorities[3] = nan"),
}


@pytest.mark.parametrize("damage", sorted(SAMPLER_DAMAGE))
def test_damaged_sampler_state_is_refused(damage: str, tmp_path: Path) -> None:
    make, edit, needle = SAMPLER_DAMAGE[damage]
    rb.save(filled(make(), 20), tmp_path)
    resave(tmp_path, edit)
    with pytest.raises(CheckpointError) as info:
        rb.load(tmp_path)
    assert needle in str(info.value)


@pytest.mark.parametrize("sampler", ["per", "recent_per"])
def test_priorities_of_slots_without_a_live_step_are_refused(sampler: str,
                                                             tmp_path: Path) -> None:
    """A sampler state that would draw a slot holding no step (a hand-edited checkpoint,
    or one of other data): refused before anything changes, where before it loaded and
    sampled never-written zero rows as transitions."""
    def make() -> Any:
        per = rb.PrioritizedSampler()
        return rb.ReplayBuffer(12, num_envs=3, seed=0, sampler=per if sampler == "per" else
                               rb.RecentSampler(c_min=2, prioritized=per))

    buf = make()
    for t in range(2):  # lane 0 only: slots 0 and 3 live
        buf.add(obs=np.full((1, 2), t + 1, np.float32), action=np.zeros(1),
                reward=np.ones(1), next_obs=np.full((1, 2), t + 2, np.float32),
                terminated=np.zeros(1, bool), truncated=np.zeros(1, bool), env_ids=[0])
    rb.save(buf, tmp_path)

    def everywhere(state: dict[str, Any]) -> None:
        s = state["sampler"] if sampler == "per" else state["sampler"]["prioritized"]
        s["priorities"] = np.ones(12)

    resave(tmp_path, everywhere)
    with pytest.raises(CheckpointError, match=r"slot 1 \(row 0 of lane 1\).*lane 1 holds "
                                              "no steps"):
        rb.load(tmp_path)
    state = buf.state_dict()
    everywhere(state)
    other = make()
    with pytest.raises(CheckpointError, match="no live step"):
        other.load_state_dict(state)
    assert not other.allocated and len(other) == 0
    assert sorted(set(buf.sample(64).obs[:, 0].tolist())) == [1.0, 2.0]


def test_recent_returns_must_be_finite() -> None:
    buf = filled(rb.ReplayBuffer(16, sampler=rb.RecentSampler(c_min=4), seed=0), 20)
    state = buf.state_dict()
    state["sampler"] = {**state["sampler"], "returns": np.array([1.0, np.nan])}
    with pytest.raises(CheckpointError, match=r"returns\[1\] = nan"):
        buf.load_state_dict(state)


# ---------------------------------------------------------------------- failed loads
def _rng_damage(state: dict[str, Any]) -> None:
    state["rng"] = {**state["rng"], "bit_generator": "MT19937"}


def _rng_garbage(state: dict[str, Any]) -> None:
    state["rng"] = {**state["rng"], "state": "x"}


def _view_damage(state: dict[str, Any]) -> None:
    state["view"] = {"layout": {"obs": [True, "three"]}}


def _sampler_damage(state: dict[str, Any]) -> None:
    state["sampler"]["priorities"] = edited(state["sampler"]["priorities"], 0, np.nan)


def _sampler_missing(state: dict[str, Any]) -> None:
    del state["sampler"]["calls"]


def _table_damage(state: dict[str, Any]) -> None:
    _set_meta("counts", 0, 99)(state)


ATOMIC_CASES: dict[str, tuple[Callable[[int], Any], Callable[[dict[str, Any]], None]]] = {
    "sampler": (lambda s: rb.PrioritizedReplayBuffer(32, seed=s), _sampler_damage),
    "sampler_missing": (lambda s: rb.PrioritizedReplayBuffer(32, seed=s), _sampler_missing),
    "rng_type": (lambda s: rb.PrioritizedReplayBuffer(32, seed=s), _rng_damage),
    "rng_garbage": (lambda s: rb.ReplayBuffer(32, seed=s), _rng_garbage),
    "view": (lambda s: rb.ReplayBuffer(32, frame_stack=3, seed=s), _view_damage),
    "table": (lambda s: rb.PrioritizedReplayBuffer(32, seed=s), _table_damage),
}


@pytest.mark.parametrize("case", sorted(ATOMIC_CASES))
def test_failed_load_into_leaves_the_buffer_as_it_was(case: str, tmp_path: Path) -> None:
    make, damage = ATOMIC_CASES[case]
    rb.save(filled(make(1), 50, seed=1), tmp_path)  # another buffer's data
    resave(tmp_path, damage)
    buf = filled(make(0), 20, seed=0)
    twin = copy.deepcopy(buf)
    with pytest.raises(CheckpointError):
        load_into(buf, tmp_path)
    assert_same_state(buf, twin)
    a, b = buf.sample(8), twin.sample(8)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.obs, b.obs)
    # and it still works: the same add and sample as its twin
    add_random(buf, np.random.default_rng(9), 3)
    add_random(twin, np.random.default_rng(9), 3)
    assert np.array_equal(buf.sample(8).indices, twin.sample(8).indices)


def test_failed_load_into_an_empty_buffer_allocates_nothing(tmp_path: Path) -> None:
    d = tmp_path / "files"
    rb.save(filled(rb.PrioritizedReplayBuffer(32, seed=1), 20), tmp_path / "ckpt")
    resave(tmp_path / "ckpt", _sampler_damage)
    buf = rb.PrioritizedReplayBuffer(32, seed=0, storage="memmap", path=d)
    with pytest.raises(CheckpointError):
        load_into(buf, tmp_path / "ckpt")
    assert buf.spec is None and len(buf) == 0
    assert not any(p.suffix == ".bin" for p in d.glob("*")) if d.exists() else True


def test_sequence_buffer_checks_its_options_first(tmp_path: Path) -> None:
    src = rb.SequenceReplayBuffer(32, sequence_length=4, seed=1)
    add_random(src, np.random.default_rng(1), 30)
    state = src.state_dict()
    state["sequence"] = {**state["sequence"], "episode_boundary": "sideways"}
    buf = rb.SequenceReplayBuffer(32, sequence_length=2, seed=0)
    add_random(buf, np.random.default_rng(0), 10)
    twin = copy.deepcopy(buf)
    with pytest.raises(CheckpointError, match="episode_boundary='sideways'"):
        buf.load_state_dict(state)
    assert buf.sequence_length == 2 and len(buf) == 10
    assert_same_state(buf, twin)


def test_rollout_final_obs_index_outside_the_data_is_refused() -> None:
    buf = rb.RolloutBuffer(4, num_envs=2)
    for t in range(3):
        buf.add(np.zeros((2, 3)), np.zeros(2), np.ones(2), np.zeros(2, bool),
                np.array([t == 1, False]), np.zeros(2), np.zeros(2),
                final_obs=np.ones((2, 3)) if t == 1 else None)
    state = buf.state_dict()
    state["arrays"] = {**state["arrays"], "final_obs/index": np.array([1000])}
    with pytest.raises(CheckpointError, match="final_obs/index"):
        rb.RolloutBuffer(4, num_envs=2).load_state_dict(state)


# ---------------------------------------------------------------------- paths from files
def test_load_never_writes_where_the_checkpoint_says(tmp_path: Path) -> None:
    live = tmp_path / "live"
    buf = filled(rb.ReplayBuffer(16, storage="memmap", path=live, seed=0), 10)
    rb.save(buf, tmp_path / "ckpt")
    close = getattr(buf.backend, "close", None)
    if callable(close):
        close()
    del buf
    gc.collect()
    # the saved config names `live`; its files (and a foreign obs.bin) must survive
    (live / "obs.bin").write_bytes(b"not replay data")
    before = {p.name: p.read_bytes() for p in live.iterdir() if p.is_file()}
    elsewhere = tmp_path / "elsewhere"

    def point_elsewhere(state: dict[str, Any]) -> None:
        state["init"]["path"] = str(elsewhere)
    resave(tmp_path / "ckpt", point_elsewhere)
    meta_path = tmp_path / "ckpt" / "buffer_metadata.json"
    manifest = json.loads(meta_path.read_text())
    assert manifest["config"]["path"] == str(live)
    back = rb.load(tmp_path / "ckpt")
    assert back.backend.name == "numpy" and len(back) == 10
    back.add(obs=np.zeros(3, np.float32), action=0, reward=1.0,
             next_obs=np.ones(3, np.float32), terminated=False, truncated=False)
    assert {p.name: p.read_bytes() for p in live.iterdir() if p.is_file()} == before
    assert not elsewhere.exists()
    # a memmap copy only where the caller says
    moved = rb.load(tmp_path / "ckpt", path=tmp_path / "copy")
    assert moved.backend.name == "memmap" and (tmp_path / "copy" / "obs.bin").exists()


def test_open_uses_the_callers_path_only(tmp_path: Path) -> None:
    d, other = tmp_path / "buf", tmp_path / "other"
    _memmap_dir(d)
    manifest_path = d / "replaybank_memmap.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["config"]["path"] = str(other)
    manifest_path.write_text(json.dumps(manifest))
    again = rb.open(d)
    filled(again, 3, seed=4)
    assert Path(again.backend.path) == d and not other.exists()
    assert again.config().path == str(d)
    with pytest.raises(ConfigError, match="storage"):
        rb.open(d, storage="numpy")
