"""Disk-backed (memmap) storage: same behaviour as numpy, reopen, SIGKILL safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import CheckpointError, ConfigError
from replaybank.storage.backends.base import available_memory
from replaybank.storage.backends.memmap import MANIFEST, MemmapBackend
from tests.roundtrip import add_random, assert_roundtrip, assert_same, assert_same_state

STORAGE_KEYS = ("init.storage", "init.path", "metadata.storage")


def test_memmap_matches_numpy(tmp_path: Path) -> None:
    a = rb.ReplayBuffer(40, num_envs=2, seed=0)
    b = rb.ReplayBuffer(40, num_envs=2, seed=0, storage="memmap", path=tmp_path / "m")
    assert isinstance(b.backend, MemmapBackend)
    for buf in (a, b):
        add_random(buf, np.random.default_rng(1), 70)
    assert_same_state(a, b, STORAGE_KEYS)
    for _ in range(3):
        assert_same(a.sample(16), b.sample(16))
    assert isinstance(b.table.arrays["obs"].base, np.memmap)
    files = {p.name for p in (tmp_path / "m").iterdir()}
    assert {MANIFEST, "obs.bin", "side%2Fobs.bin", "meta%2Flink.bin"} <= files


def test_reopen_continues_where_it_stopped(tmp_path: Path) -> None:
    ref = rb.ReplayBuffer(30, num_envs=3, seed=0)
    buf = rb.ReplayBuffer(30, num_envs=3, seed=0, storage="memmap", path=tmp_path)
    for b in (ref, buf):
        add_random(b, np.random.default_rng(2), 25)
    buf.backend.close()  # flushes and releases the writer's lock (as the process ending)
    again = rb.ReplayBuffer.open(tmp_path)
    assert len(again) == len(ref) and again.spec == ref.spec
    assert_same_state(ref, again, (*STORAGE_KEYS, "rng", "table.free_slots"))
    for b in (ref, again):  # later adds (continuing episodes, evictions) agree exactly
        add_random(b, np.random.default_rng(3), 20)
    assert_same_state(ref, again, (*STORAGE_KEYS, "rng", "table.free_slots",
                                   "table.meta/link", "table.side/obs"))
    keys = np.concatenate([np.arange(ref.table.written[i] - ref.table.counts[i],
                                     ref.table.written[i]) * 3 + i for i in range(3)])
    for name in ("obs", "action", "reward"):
        assert_same(ref.table.gather(name, keys), again.table.gather(name, keys))
    assert_same(ref.table.gather_next("obs", keys), again.table.gather_next("obs", keys))


def test_reopen_with_prioritized_sampler_and_nested_obs(tmp_path: Path) -> None:
    buf = rb.PrioritizedReplayBuffer(16, num_envs=2, seed=0, storage="memmap", path=tmp_path)
    rng = np.random.default_rng(0)
    for t in range(10):
        buf.add(obs={"a": rng.standard_normal((2, 2)), "b": np.full((2, 1), t, np.uint8)},
                action=np.array([t, -t]), reward=np.ones(2),
                next_obs={"a": rng.standard_normal((2, 2)), "b": np.full((2, 1), t + 1,
                                                                          np.uint8)},
                terminated=np.array([t % 4 == 3, False]), truncated=np.zeros(2, bool))
    del buf
    again = rb.ReplayBuffer.open(tmp_path)
    assert type(again) is rb.PrioritizedReplayBuffer and len(again) == 16
    batch = again.sample(32)
    assert np.allclose(batch.weights, 1.0)  # every live step got the same (max) priority
    assert batch["obs"]["b"].shape == (32, 1)
    again.update_priorities(batch.indices, np.arange(32) / 7.0)


def test_path_rules(tmp_path: Path) -> None:
    rb.ReplayBuffer(8, storage="memmap", path=tmp_path, spec={"obs": ((2,), "float32"),
                                                              "action": ((), "int64")})
    with pytest.raises(ConfigError, match="already holds a replaybank memmap buffer"):
        rb.ReplayBuffer(8, storage="memmap", path=tmp_path)
    with pytest.raises(ConfigError, match="needs path"):
        rb.ReplayBuffer(8, storage="memmap")
    fresh = rb.ReplayBuffer(8, storage=MemmapBackend(tmp_path, overwrite=True))
    assert len(fresh) == 0
    with pytest.raises(CheckpointError, match="no memmap buffer"):
        rb.ReplayBuffer.open(tmp_path / "nothing")
    empty = tmp_path / "e"
    rb.ReplayBuffer(8, storage="memmap", path=empty)  # nothing added: nothing to rebuild
    with pytest.raises(CheckpointError, match="no recorded config"):
        rb.ReplayBuffer.open(empty)


def test_checkpoint_of_memmap_buffer(tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(24, num_envs=2, seed=0, storage="memmap", path=tmp_path / "live")
    add_random(buf, np.random.default_rng(0), 30)
    loaded = assert_roundtrip(buf, tmp_path / "ckpt", storage="numpy", ignore=STORAGE_KEYS)
    assert loaded.backend.name == "numpy"
    moved = rb.load(tmp_path / "ckpt", path=str(tmp_path / "copy"))
    assert moved.backend.name == "memmap"
    assert_same_state(moved, rb.load(tmp_path / "ckpt", storage="numpy"), STORAGE_KEYS)
    # a checkpoint never chooses where files go: without path= it loads into memory
    # and the live buffer's directory (named in its config) is left alone
    before = {p.name: p.read_bytes() for p in (tmp_path / "live").iterdir()}
    assert rb.load(tmp_path / "ckpt").backend.name == "numpy"
    assert {p.name: p.read_bytes() for p in (tmp_path / "live").iterdir()} == before


def test_capacity_larger_than_ram(tmp_path: Path) -> None:
    avail = available_memory()
    if avail is None:
        pytest.skip("available memory unknown")
    obs = 16384  # float32 values per step: 64 KiB
    cap = int(avail * 1.5) // (obs * 4) + 1
    # sparse files (reserve=False): the test needs no free disk of 1.5x the RAM
    buf = rb.ReplayBuffer(cap, storage=MemmapBackend(tmp_path, reserve=False), seed=0)
    for t in range(3):
        buf.add(obs=np.full(obs, t, np.float32), action=t, reward=1.0,
                next_obs=np.full(obs, t + 1, np.float32), terminated=False, truncated=False)
    assert buf.nbytes() > avail
    assert float(buf.sample(4).next_obs.mean()) >= 1.0
    del buf
    assert len(rb.ReplayBuffer.open(tmp_path)) == 3


# ---------------------------------------------------------------------- SIGKILL
CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import replaybank as rb

    path, lanes, pad = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "pad"
    try:
        buf = rb.ReplayBuffer.open(path)
    except rb.CheckpointError:
        buf = rb.ReplayBuffer(capacity=30 * lanes, num_envs=lanes, storage="memmap",
                              path=path, seed=0)
    t = 0 if len(buf) == 0 else int(buf.table.written[0])
    print("start", t, flush=True)
    ids = np.arange(lanes)
    while True:
        term = (ids == 0) & (t % 7 == 6)
        trunc = (ids == 1) & (t % 5 == 4)
        obs = np.stack([ids, np.full(lanes, t)], axis=1).astype(np.float32)
        nxt = obs.copy()
        nxt[:, 1] = t + 1
        nxt[term | trunc, 1] = -(t + 1)  # true final observation, unlike the reset obs
        one = (lambda a: a[0]) if lanes == 1 else (lambda a: a)
        # without the pad field, the values have exactly the stored format: the compiled
        # writer (crash-safe order on files) takes every add
        extra = {"pad": one(np.full((lanes, 4096), t, np.float32))} if pad else {}
        buf.add(obs=one(obs), action=one(np.full(lanes, t)),
                reward=one(obs[:, 1].astype(np.float32)), next_obs=one(nxt),
                terminated=one(term), truncated=one(trunc), **extra)
        print(t, flush=True)
        t += 1
""")


def check_consistent(buf: Any) -> int:
    """Every live step holds exactly what the child added for it."""
    t = buf.table
    assert np.all(t.written == t.written[0])
    n = int(t.written[0])
    for lane in range(t.lanes):
        # killed after an eviction left counts and before the add finished: one step less
        assert min(n, t.T) - 1 <= t.counts[lane] <= min(n, t.T)
        seq = np.arange(n - t.counts[lane], n)
        keys = seq * t.lanes + lane
        obs = t.gather("obs", keys)
        assert np.array_equal(obs[:, 0], np.full(len(seq), lane))
        assert np.array_equal(obs[:, 1], seq)
        if "pad" in t.arrays:
            assert np.array_equal(t.gather("pad", keys)[:, ::1000], np.repeat(
                seq[:, None], 5, axis=1).astype(np.float32))
        end = (seq % 7 == 6) if lane == 0 else (seq % 5 == 4) if lane == 1 else seq < 0
        nxt = t.gather_next("obs", keys)
        assert np.array_equal(nxt[:, 1], np.where(end, -(seq + 1), seq + 1)), lane
    return n


@pytest.mark.parametrize(("lanes", "pad"), [(1, "pad"), (2, "pad"), (1, "plain"),
                                           (3, "plain")])
def test_sigkill_between_and_during_adds(tmp_path: Path, lanes: int, pad: str) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    path = tmp_path / "replay"
    rng = np.random.default_rng(0)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    total = 0
    for round_ in range(3):
        proc = subprocess.Popen([sys.executable, str(script), str(path), str(lanes), pad],
                                stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        start = int(proc.stdout.readline().split()[1])
        assert start == total
        target = start + int(rng.integers(20, 150))
        last = -1
        while last < target:
            last = int(proc.stdout.readline())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        buf = rb.ReplayBuffer.open(path)
        total = check_consistent(buf)
        assert total >= last + 1, (round_, total, last)  # every completed add is there
        assert buf.sample(8).obs.shape == (8, 2)
        assert buf.num_envs == lanes
        del buf


@pytest.mark.parametrize("with_spec", [False, True])
def test_reopen_sequence_buffer_as_itself(tmp_path: Path, with_spec: bool) -> None:
    """A memmap SequenceReplayBuffer reopens as a SequenceReplayBuffer with its options."""
    spec = {"obs": ((3,), "float32"), "action": ((), "int64")} if with_spec else None
    buf = rb.SequenceReplayBuffer(40, num_envs=2, sequence_length=4, episode_boundary="cross",
                                  burn_in=1, seed=0, spec=spec, storage="memmap",
                                  path=tmp_path)
    rng = np.random.default_rng(5)
    o = rng.standard_normal((2, 3)).astype(np.float32)
    for t in range(15):
        nxt = rng.standard_normal((2, 3)).astype(np.float32)
        buf.add(obs=o, action=np.array([t, t]), reward=np.ones(2, np.float32), next_obs=nxt,
                terminated=np.array([t % 6 == 5, False]), truncated=np.zeros(2, bool))
        o = nxt
    buf.buffer.backend.close()  # flushes and releases the writer's lock
    again = rb.ReplayBuffer.open(tmp_path)
    assert isinstance(again, rb.SequenceReplayBuffer)
    assert (again.sequence_length, again.episode_boundary, again.burn_in) == (4, "cross", 1)
    assert len(again) == len(buf) == 30
    got = again.sample(3)
    assert got.obs.shape == (3, 5, 3)  # burn-in 1 + 4 steps


# ---------------------------------------------------------------------- beside a writer
LIVE_WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    import replaybank as rb

    path, lanes, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    buf = rb.ReplayBuffer(T * lanes, num_envs=lanes, storage="memmap", path=path, seed=0)
    ids = np.arange(lanes)
    one = (lambda a: a[0]) if lanes == 1 else (lambda a: a)
    t = 0
    while True:  # as fast as it can, until killed
        term = (ids % 2 == 0) & (t % 7 == 6)
        trunc = (ids % 2 == 1) & (t % 11 == 10)
        obs = np.stack([ids, np.full(lanes, t)], axis=1)  # the step number, exactly
        nxt = obs.copy()
        nxt[:, 1] = np.where(term | trunc, -(t + 1), t + 1)  # a final obs: not the reset's
        buf.add(obs=one(obs), action=one(np.full(lanes, t)),
                reward=one(np.full(lanes, t % 1000, np.float32)), next_obs=one(nxt),
                terminated=one(term), truncated=one(trunc))
        t += 1
        if t == T + 50:  # the ring is full: every add evicts a step from now on
            print("ready", flush=True)
""")


def live_writer(tmp_path: Path, lanes: int, rows: int, writer: str) -> subprocess.Popen[str]:
    """A process adding to a memmap buffer in a loop; returns once its ring is full."""
    script = tmp_path / "writer.py"
    script.write_text(LIVE_WRITER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "REPLAYBANK_WRITER": writer}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "live"), str(lanes),
                             str(rows)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.poll()
    return proc


@pytest.mark.parametrize(("lanes", "writer"),
                         [(1, "auto"), (1, "reference"), (2, "auto"), (3, "reference")])
def test_read_only_opens_beside_a_live_writer_see_what_it_wrote(
        tmp_path: Path, lanes: int, writer: str) -> None:
    """``rb.open(path, mode="r")`` while another process adds without pause: every open
    succeeds, and every sampled transition is one the writer wrote (its step number is
    in the obs; a step the writer evicted after the open may hold a newer one)."""
    rows = 4096
    proc = live_writer(tmp_path, lanes, rows, writer)
    start_file = tmp_path / "live" / MemmapBackend.file_name("meta/start")
    checked = drawn = 0
    try:
        for _ in range(30):
            reader = rb.open(tmp_path / "live", mode="r")
            assert 0 < len(reader) <= rows * lanes
            batch = reader.sample(128)
            start = np.fromfile(start_file, np.int64)  # the writer's, after the sample
            reader.close()
            keys = np.asarray(batch.indices)
            seq, lane = keys // lanes, keys % lanes
            kept = seq >= start[lane]  # not evicted yet: the row still holds step seq
            drawn += len(keys)
            checked += int(kept.sum())
            obs = np.asarray(batch.obs)[kept].reshape(-1, 2)
            nxt = np.asarray(batch.next_obs)[kept].reshape(-1, 2)
            s, ln = seq[kept], lane[kept]
            term = (ln % 2 == 0) & (s % 7 == 6)
            trunc = (ln % 2 == 1) & (s % 11 == 10)
            np.testing.assert_array_equal(obs, np.stack([ln, s], axis=1))
            np.testing.assert_array_equal(nxt[:, 0], ln)
            np.testing.assert_array_equal(nxt[:, 1], np.where(term | trunc, -(s + 1), s + 1))
            np.testing.assert_array_equal(np.asarray(batch.action)[kept], s)
            np.testing.assert_array_equal(np.asarray(batch.reward)[kept], s % 1000)
            np.testing.assert_array_equal(np.asarray(batch.terminated)[kept], term)
            np.testing.assert_array_equal(np.asarray(batch.truncated)[kept], trunc)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert checked > drawn // 2, (checked, drawn)  # the writer did not outrun most draws


def test_inspect_beside_a_live_writer(tmp_path: Path) -> None:
    """``replaybank inspect`` opens a memmap directory read-only while its writer adds."""
    proc = live_writer(tmp_path, 2, 512, "auto")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    try:
        for _ in range(3):
            out = subprocess.run([sys.executable, "-m", "replaybank", "inspect",
                                  str(tmp_path / "live"), "--json"], capture_output=True,
                                 text=True, env=env, timeout=120)
            assert out.returncode == 0, out.stderr[-500:]
            summary = json.loads(out.stdout)
            assert summary["lanes"] == 2 and 0 < summary["fill"] <= 1024
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_path_starting_with_tilde_is_the_home_directory(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``~`` in a path (a config file's above all, where no shell expands it) is the user's
    home, as in a shell: never a directory named ``~`` in the working directory."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    buf = rb.from_config({"capacity": 16, "storage": "memmap", "path": "~/replay"})
    add_random(buf, np.random.default_rng(0), 5)
    buf.flush()
    rb.save(buf, "~/ckpt")
    assert (home / "replay").is_dir() and (home / "ckpt").is_dir()
    assert not (cwd / "~").exists()
    assert len(rb.load("~/ckpt")) == 5
    buf.close()
    assert len(rb.open("~/replay", mode="r")) == 5
