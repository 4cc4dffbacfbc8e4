"""Shared-memory and memmap storage under stress: owners in other PID namespaces, writer
handles naming lanes out of range, hand-edited ``start`` counters, and constructions that
fail for want of disk space."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import CapacityError, CheckpointError, ConfigError
from replaybank.shared import backend as shared_backend
from replaybank.shared.backend import segment_names, sweep_stale
from replaybank.storage.backends.memmap import LOCK, MANIFEST, MemmapBackend
from replaybank.storage.table import StepTable
from tests.shared_workers import SPEC, check_batch, step_values
from tests.test_hardening_files import dead_pid, digest, fill


# ---------------------------------------------------------------------- helpers
class _OsAs:
    """``os`` as a process with another pid sees it (only ``getpid`` differs)."""

    def __init__(self, pid: int) -> None:
        self._pid = pid

    def getpid(self) -> int:
        return self._pid

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def _owner_as(monkeypatch: pytest.MonkeyPatch, pid: int, namespace: int | None) -> Any:
    """A shared owner whose segments are named as an owner with ``pid`` in the PID
    namespace ``namespace`` (None: this one) names them: a process in another namespace
    (another container sharing ``/dev/shm``) has a pid that means nothing here."""
    with monkeypatch.context() as m:
        m.setattr(shared_backend, "os", _OsAs(pid))
        if namespace is not None:
            m.setattr(shared_backend, "pid_namespace", lambda: namespace, raising=False)
        return rb.ReplayBuffer(64, num_envs=2, seed=0, spec=SPEC, storage="shared")


def _forget(names: list[str]) -> None:
    """Tell this process's resource tracker that segments someone else unlinked are gone
    (else it warns about them at exit)."""
    from multiprocessing import resource_tracker

    for name in names:
        resource_tracker.unregister("/" + name, "shared_memory")


def _write_some(buf: Any, lanes: list[int], steps: int = 6) -> None:
    w = buf.writer(lanes).open()
    ids = np.asarray(lanes)
    for t in range(steps):
        w.add(**step_values(ids, np.full(len(ids), t), np.zeros(len(ids)),
                            np.zeros(len(ids), bool)))
    w.close()


# ---------------------------------------------------------------------- 3: PID namespaces
def test_sweep_leaves_the_segments_of_an_owner_in_another_pid_namespace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    own = getattr(shared_backend, "pid_namespace", lambda: None)()
    other = (own or 0) + 0x5EED  # any id but ours: another container's namespace
    buf = _owner_as(monkeypatch, dead_pid(), other)  # its pid is not alive *here*
    try:
        mine = [n for n in segment_names() if buf.backend.token in n]
        assert len(mine) >= 8
        removed = sweep_stale()  # what the next owner started here does first
        assert not set(removed) & set(mine), removed
        assert all(n in segment_names() for n in mine)
        rb.ReplayBuffer(8, num_envs=1, spec=SPEC, storage="shared").close()  # a new owner
        assert all(n in segment_names() for n in mine)
        _write_some(buf, [0, 1])  # its writers still work ...
        assert len(buf) == 10
        check_batch(buf.sample(32))  # ... and its learner reads what they wrote
    finally:
        buf.close()
    assert not [n for n in segment_names() if buf.backend.token in n]


def test_sweep_removes_the_segments_of_a_dead_owner_of_this_namespace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    buf = _owner_as(monkeypatch, dead_pid(), None)
    mine = [n for n in segment_names() if buf.backend.token in n]
    assert len(mine) >= 8
    try:
        removed = sweep_stale()
        assert set(mine) <= set(removed), (mine, removed)
        assert not any(n in segment_names() for n in mine)
        with pytest.raises(CheckpointError, match="gone"):
            buf.writer([0]).open()
    finally:
        _forget(mine)
        buf.close()  # nothing left to unlink: no error


def test_segment_names_record_the_pid_namespace() -> None:
    own = shared_backend.pid_namespace()
    if own is None:
        pytest.skip("this system does not expose PID namespaces (/proc/self/ns/pid)")
    buf = rb.ReplayBuffer(8, num_envs=1, spec=SPEC, storage="shared")
    try:
        mine = [n for n in segment_names() if buf.backend.token in n]
        assert mine and all(n.startswith(f"rbk{os.getpid():x}_{own:x}_") for n in mine)
        assert not set(sweep_stale()) & set(mine)  # a live owner: never swept
    finally:
        buf.close()


def test_sweep_leaves_segments_whose_namespace_it_cannot_tell() -> None:
    """Names without a namespace (written before it was recorded, or where /proc is not
    mounted) cannot be proved dead: they are left to their owner's resource tracker."""
    dead = dead_pid()
    legacy = f"rbk{dead:x}_0badc0de_0"
    unknown = f"rbk{dead:x}_0_0badc0df_0"
    made = []
    try:
        for name in (legacy, unknown):
            fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.close(fd)
            made.append(name)
        assert set(made) <= set(segment_names())
        assert not set(sweep_stale()) & set(made)
        assert set(made) <= set(segment_names())
    finally:
        for name in made:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{name}")


# ---------------------------------------------------------------------- 9: writer lanes
@pytest.mark.parametrize("lanes", [(2,), (5,), (-1,), (0, 0), (), (1.5,), (True,), ("a",),
                                   ((0, 1),)])
def test_a_handle_naming_bad_lanes_is_refused_before_anything_changes(lanes: Any) -> None:
    buf = rb.ReplayBuffer(64, num_envs=2, seed=0, spec=SPEC, storage="shared")
    try:
        claims = buf.backend.shared("claims", (2,), np.int64)
        bad = dataclasses.replace(buf.writer([0]), lanes=lanes)
        with pytest.raises(ConfigError) as info:
            bad.open()
        msg = str(info.value)
        assert "lanes=" in msg and "[0, 2)" in msg, msg
        assert not claims.any()  # no lane was claimed
        _write_some(buf, [0, 1])  # both lanes are free for a writer
        assert len(buf) == 10
    finally:
        buf.close()


# ---------------------------------------------------------------------- 7: start counter
def _closed(d: Path, n: int, lanes: int = 1, capacity: int = 32) -> None:
    buf = rb.ReplayBuffer(capacity, num_envs=lanes, storage="memmap", path=d, seed=0,
                          spec={"obs": ((4,), "float32"), "action": ((), "int64")})
    for t in range(n):
        buf.add(obs=np.full((lanes, 4), t, np.float32), action=np.full(lanes, t),
                reward=np.ones(lanes), next_obs=np.full((lanes, 4), -t, np.float32),
                terminated=np.full(lanes, t % 3 == 2), truncated=np.zeros(lanes, bool))
    buf.close()


def _counter(d: Path, name: str) -> np.memmap[Any, Any]:
    return np.memmap(d / MemmapBackend.file_name(f"meta/{name}"), dtype=np.int64, mode="r+")


def _set(d: Path, name: str, lane: int, value: int) -> None:
    arr = _counter(d, name)
    arr[lane] = value
    arr.flush()
    del arr


@pytest.mark.parametrize("mode", ["r+", "r"])
@pytest.mark.parametrize("start, rule", [
    (45, "written"),   # past written: the buffer reopened empty
    (41, "written"),
    (33, "counts"),    # hides 25 of the 32 steps the lane holds
    (-1, "negative"),  # accepted before
])
def test_a_hand_edited_start_counter_gives_checkpoint_error(tmp_path: Path, mode: str,
                                                            start: int, rule: str) -> None:
    _closed(tmp_path, 40)  # T = 32: written 40, counts 32, start 8
    assert _counter(tmp_path, "start")[0] == 8 and _counter(tmp_path, "written")[0] == 40
    _set(tmp_path, "start", 0, start)
    before = digest(tmp_path)
    for _ in range(2):  # and again: the failed open changed nothing on disk
        with pytest.raises(CheckpointError) as info:
            rb.open(tmp_path, mode=mode)
        msg = str(info.value)
        assert MemmapBackend.file_name("meta/start") in msg and "start[0]" in msg, msg
        assert f"= {start}" in msg and "written[0] = 40" in msg and rule in msg, msg
        assert digest(tmp_path) == before


def test_a_hand_edited_start_names_its_lane(tmp_path: Path) -> None:
    _closed(tmp_path, 20, lanes=2, capacity=32)  # T = 16: written 20, counts 16, start 4
    _set(tmp_path, "start", 1, 18)
    with pytest.raises(CheckpointError, match=r"start\[1\] = 18"):
        rb.open(tmp_path)
    _set(tmp_path, "start", 1, 4)
    assert len(rb.open(tmp_path, mode="r")) == 32


@pytest.mark.parametrize("state", ["steady", "cleared", "evicting", "committed", "big"])
def test_every_start_a_write_can_leave_still_opens(tmp_path: Path, state: str) -> None:
    """The states a kill can leave (see replaybank.storage.table's write order) and the
    steady ones stay readable: only impossible counters are refused."""
    T = 32  # noqa: N806
    chunk = max(1, T // 4)  # StepTable.chunk (test_the_chunk_rule_matches_the_step_table)
    _closed(tmp_path, 40)  # written 40, counts 32, start 8
    want = {"steady": 32, "cleared": 0, "evicting": 32 - chunk, "committed": 32,
            "big": 32}[state]
    if state == "cleared":  # killed in clear(): start = written, counts not yet 0
        _set(tmp_path, "start", 0, 40)
    elif state == "evicting":  # killed after start advanced, before counts dropped
        _set(tmp_path, "start", 0, 8 + chunk)
    elif state == "committed":  # killed after written advanced, before counts followed
        _set(tmp_path, "counts", 0, 30)
    elif state == "big":  # one extend of more than T steps into an empty lane
        _set(tmp_path, "start", 0, 0)
    buf = rb.open(tmp_path)
    assert len(buf) == want
    if want:
        buf.sample(4)
    buf.close()


def test_the_chunk_rule_matches_the_step_table() -> None:
    from replaybank.spec import Spec

    spec = Spec.coerce({"obs": ((1,), "float32"), "terminated": ((), "bool"),
                        "truncated": ((), "bool")})
    for T in (1, 3, 4, 7, 32, 1000):  # noqa: N806
        assert StepTable(spec, T=T, lanes=1, obs_fields=["obs"]).chunk == max(1, T // 4)


# ---------------------------------------------------------------------- 8: failed builds
def _too_big(d: Path) -> int:
    return shutil.disk_usage(d).free + 1_000_000


def test_a_construction_that_does_not_fit_leaves_a_reusable_path(tmp_path: Path) -> None:
    d = tmp_path / "m"
    with pytest.raises(CapacityError) as info:
        rb.ReplayBuffer(_too_big(tmp_path), storage="memmap", path=d, spec=SPEC)
    assert "free" in str(info.value)
    # (`info` still holds the traceback, and with it the failed buffer's storage)
    left = sorted(p.name for p in d.iterdir())
    assert MANIFEST not in left and not [n for n in left if n.endswith(".bin")], left
    assert set(left) <= {LOCK}, left
    with pytest.raises(CheckpointError, match="missing"):  # not "no recorded config"
        rb.open(d)
    buf = fill(rb.ReplayBuffer(32, storage="memmap", path=d, seed=0, spec=SPEC), 5)
    assert len(buf) == 5
    buf.close()
    assert len(rb.open(d)) == 5


def test_a_failed_construction_removes_only_what_it_created(tmp_path: Path) -> None:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep me")
    (d / "data.bin").write_bytes(b"\x01" * 10)  # a user's file with a .bin name
    with pytest.raises(CapacityError):
        rb.ReplayBuffer(_too_big(tmp_path), storage="memmap", path=d, spec=SPEC)
    assert (d / "notes.txt").read_text() == "keep me"
    assert (d / "data.bin").read_bytes() == b"\x01" * 10
    assert not (d / MANIFEST).exists()
    assert sorted(p.name for p in d.iterdir()) == sorted(["notes.txt", "data.bin", LOCK])


def test_a_lazy_buffer_whose_first_add_does_not_fit_gives_the_path_back(
        tmp_path: Path) -> None:
    d = tmp_path / "lazy"
    buf = rb.ReplayBuffer(_too_big(tmp_path), storage="memmap", path=d)
    with pytest.raises(CapacityError):
        fill(buf, 1)
    assert len(buf) == 0
    assert sorted(p.name for p in d.iterdir()) == [LOCK]
    with pytest.raises(CapacityError):  # a retry tries again, and cleans up again
        fill(buf, 1)
    assert sorted(p.name for p in d.iterdir()) == [LOCK]
    other = fill(rb.ReplayBuffer(32, storage="memmap", path=d, seed=0, spec=SPEC), 3)
    assert len(other) == 3  # the path was free for another buffer
    with pytest.raises(ConfigError, match="open for writing"):
        fill(buf, 1)  # the first buffer may not take it back now
    assert len(buf) == 0 and len(other) == 3
    other.close()
    assert len(rb.open(d)) == 3


def test_a_field_name_too_long_for_a_file_name_is_a_spec_error(tmp_path: Path) -> None:
    """Memmap storage names a file after each field: a name the file system refuses is
    named as such (it was a raw OSError), nothing is allocated, and the buffer then takes
    a call without that field."""
    buf = rb.ReplayBuffer(8, storage="memmap", path=tmp_path / "b", seed=0)
    step = {"obs": np.zeros(2, np.float32), "action": 0, "reward": 0.0,
            "next_obs": np.ones(2, np.float32), "terminated": False, "truncated": False}
    with pytest.raises(rb.SpecError, match=r"\(300 characters\).*use a shorter field name"):
        buf.add(**step, **{"h" * 300: np.ones(2, np.float32)})
    assert not buf.allocated
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["replaybank_memmap.lock"]
    buf.add(**step)
    assert len(buf) == 1
