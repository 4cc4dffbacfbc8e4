"""Memmap storage under failed opens, crashes, forks and bad paths: a failed call changes
nothing, a crash leaves a buffer that opens and keeps adding, and misuse is a clear error."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import CheckpointError, ConfigError


def _step(t: int, lanes: int) -> dict[str, np.ndarray]:
    return dict(obs=np.full((lanes, 3), t, np.float32), action=np.zeros(lanes, np.int64),
                reward=np.ones(lanes), next_obs=np.full((lanes, 3), t + 1, np.float32),
                terminated=np.zeros(lanes, bool), truncated=np.zeros(lanes, bool))


def _filled(path: Path, steps: int = 33, lanes: int = 2, capacity: int = 40) -> None:
    buf = rb.ReplayBuffer(capacity=capacity, num_envs=lanes, storage="memmap", path=path,
                          seed=1)
    for t in range(steps):
        buf.add(**_step(t, lanes))
    buf.close()


def _digests(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.iterdir()) if p.is_file()}


@pytest.mark.parametrize("override", [{"capacity": 20}, {"capacity": 60}, {"num_envs": 4}])
def test_open_refuses_a_file_shape_override_and_changes_nothing(
        tmp_path: Path, override: dict[str, int]) -> None:
    _filled(tmp_path)
    before = _digests(tmp_path)
    key, value = next(iter(override.items()))
    with pytest.raises(ConfigError, match=rf"{key}={value}.*{key}=\d+.*drop the {key}"):
        rb.open(tmp_path, **override)
    assert _digests(tmp_path) == before
    again = rb.open(tmp_path)
    assert len(again) == 40 and again.table.written.tolist() == [33, 33]
    again.add(**_step(33, 2))  # still writable


def test_a_failed_open_undoes_what_it_wrote(tmp_path: Path) -> None:
    _filled(tmp_path)
    counts = tmp_path / "meta%2Fcounts.bin"
    link = tmp_path / "meta%2Flink.bin"
    # a stale counts (a kill between a commit's two stores) the open repairs, and links
    # that no write leaves: the open fails after the repair and the owner record
    np.array([19, 19], "<i8").tofile(counts)
    lk = np.fromfile(link, "<i4").reshape(20, 2)
    lk[32 % 20, 0] = 0
    lk.tofile(link)
    before = _digests(tmp_path)
    with pytest.raises(CheckpointError, match="links are damaged"):
        rb.open(tmp_path, seed=7)
    assert _digests(tmp_path) == before


# ------------------------------------------------------------- kill while the side store grows
# Every step ends an episode, so each keeps its final observation in the side store: the
# 33rd add of 2 lanes grows it from 64 slots, one file per dict-observation field. A child
# forks once per kill point n (1, 2, ...) of that add, builds and fills a fresh buffer,
# arms the hook and adds; it stops at the first n whose add completes.
GROW_CHILD = r"""
import os, sys
import numpy as np
import replaybank as rb
from replaybank.storage.writers import killpoint

base, limit = sys.argv[1], int(sys.argv[2])


def step(t):
    return dict(obs={"a": np.full((2, 2), t, np.float32), "b": np.full((2, 4), t % 256, np.uint8)},
                next_obs={"a": np.full((2, 2), -t, np.float32),
                          "b": np.full((2, 4), (200 - t) % 256, np.uint8)},
                action=np.full(2, t, np.int64), reward=np.full(2, float(t)),
                terminated=np.ones(2, bool), truncated=np.zeros(2, bool))


for n in range(1, limit + 1):
    d = os.path.join(base, str(n))
    pid = os.fork()
    if pid == 0:
        try:
            buf = rb.ReplayBuffer(capacity=400, num_envs=2, storage="memmap", path=d, seed=0)
            for t in range(32):
                buf.add(**step(t))
            assert buf.table.side_capacity == 64
            killpoint.arm(n)
            buf.add(**step(32))
        except BaseException:
            import traceback
            traceback.print_exc()
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        print(n - 1)
        break
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9, (n, status)
else:
    raise SystemExit(f"still killed after {limit} store points")
"""


def _grow_step(t: int) -> dict[str, Any]:
    return dict(obs={"a": np.full((2, 2), t, np.float32), "b": np.full((2, 4), t % 256, np.uint8)},
                next_obs={"a": np.full((2, 2), -t, np.float32),
                          "b": np.full((2, 4), (200 - t) % 256, np.uint8)},
                action=np.full(2, t, np.int64), reward=np.full(2, float(t)),
                terminated=np.ones(2, bool), truncated=np.zeros(2, bool))


def _check_steps(buf: Any, upto: int) -> None:
    """Each lane holds steps 0 .. upto - 1, each with its own obs and final obs."""
    assert buf.table.written.tolist() == [upto, upto]
    keys = np.arange(2 * upto)  # key = step * lanes + lane
    t = keys // 2
    assert buf.table.gather("action", keys).tolist() == t.tolist()
    assert (buf.table.gather("obs/b", keys) == (t % 256)[:, None]).all()
    assert (buf.table.gather_next("obs/a", keys) == -t[:, None]).all()
    assert (buf.table.gather_next("obs/b", keys) == ((200 - t) % 256)[:, None]).all()


def test_sigkill_while_the_side_store_grows(tmp_path: Path) -> None:
    env = {**os.environ, "REPLAYBANK_KILLPOINTS": "1"}
    r = subprocess.run([sys.executable, "-c", GROW_CHILD, str(tmp_path), "200"], env=env,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    points = int(r.stdout.split()[-1])
    assert points >= 3  # the add's stores, and one before each side file grows
    uneven = 0
    for n in range(1, points + 1):
        d = tmp_path / str(n)
        sizes = {p.stat().st_size // (8 if "obs%2Fa" in p.name else 4)
                 for p in d.glob("side%2F*.bin")}
        uneven += len(sizes) > 1
        reader = rb.open(d, mode="r")
        done = int(reader.table.written[0])
        assert done in (32, 33)
        _check_steps(reader, done)
        buf = rb.open(d)
        for t in range(done, done + 300):  # grows again, evicts, reuses slots
            buf.add(**_grow_step(t))
        _check_steps_tail(buf, done + 300)
        assert buf.sample(8).obs["b"].shape == (8, 4)
        buf.close()
    assert uneven  # some kill point left the side files of different lengths


def _check_steps_tail(buf: Any, upto: int) -> None:
    """The live steps (the newest 200 of each lane) are exact."""
    keys = np.arange(2 * (upto - 200), 2 * upto)
    t = keys // 2
    assert buf.table.gather("action", keys).tolist() == t.tolist()
    assert (buf.table.gather_next("obs/a", keys) == -t[:, None]).all()
    assert (buf.table.gather_next("obs/b", keys) == ((200 - t) % 256)[:, None]).all()


# ------------------------------------------------------------- kill while old files are cleared
# Files written before meta/cleared existed (the oldest also before meta/start) get the
# record at their first clear. A child forks once per kill point n of that clear: it
# copies the old files, reopens them, arms the hook and clears; it stops at the first n
# whose clear completes.
CLEAR_CHILD = r"""
import os, shutil, sys
import replaybank as rb
from replaybank.storage.writers import killpoint

base, limit = sys.argv[1], int(sys.argv[2])
for n in range(1, limit + 1):
    d = os.path.join(base, str(n))
    shutil.copytree(os.path.join(base, "old"), d)
    pid = os.fork()
    if pid == 0:
        try:
            buf = rb.open(d)
            killpoint.arm(n)
            buf.clear()
        except BaseException:
            import traceback
            traceback.print_exc()
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        print(n - 1)
        break
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9, (n, status)
else:
    raise SystemExit(f"still killed after {limit} store points")
"""


def _stack_step(buf: Any, t: int, base: float = 0.0) -> None:
    """One step of both lanes; lane ``l``'s frame is ``base + 100 * l + t``."""
    obs = np.repeat((base + 100.0 * np.arange(2) + t)[:, None], 3, axis=1).astype(np.float32)
    buf.add(obs=obs, action=np.full(2, t), reward=np.ones(2), next_obs=obs + 1,
            terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))


def _stacks(buf: Any) -> dict[float, list[float]]:
    """Every stack the buffer serves (its frames' first items), by its newest frame."""
    for n in range(len(buf), 0, -1):  # the largest draw without replacement that works
        try:
            b = buf.sample(n, replace=False)
        except rb.EmptyBufferError:
            continue
        return {float(o[-1, 0]): o[:, 0].tolist() for o in b.obs}
    return {}


@pytest.mark.parametrize("missing", [("meta/cleared",), ("meta/cleared", "meta/start")])
def test_sigkill_while_old_files_get_the_clear_record(tmp_path: Path,
                                                      missing: tuple[str, ...]) -> None:
    """A kill at every store of the first clear of old files (the record's creation,
    then the clear's own stores) leaves files that reopen either uncleared (every step
    kept) or emptied; steps added then are served with the stacks a fresh buffer serves
    (a clear cut short before it recorded where the lanes begin again serves fewer of
    them, never a wrong one), and the completed clear serves exactly those."""
    import json
    import shutil

    from replaybank.storage.backends.memmap import MANIFEST

    old = tmp_path / "old"
    buf = rb.ReplayBuffer(capacity=16, num_envs=2, frame_stack=3, storage="memmap",
                          path=old, seed=0)
    for t in range(5):
        _stack_step(buf, t, base=5000.0)
    buf.close()
    manifest = json.loads((old / MANIFEST).read_text())
    for name in missing:
        (old / manifest["arrays"].pop(name)["file"]).unlink()
    (old / MANIFEST).write_text(json.dumps(manifest))
    env = {**os.environ, "REPLAYBANK_KILLPOINTS": "1"}
    r = subprocess.run([sys.executable, "-c", CLEAR_CHILD, str(tmp_path), "50"], env=env,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    points = int(r.stdout.split()[-1])
    assert points == len(("record", "counts", "link", "cleared")) + ("meta/start" not in missing)
    fresh = rb.ReplayBuffer(capacity=16, num_envs=2, frame_stack=3, seed=0)
    for t in range(4):
        _stack_step(fresh, t)
    want = _stacks(fresh)
    assert len(want) == 8
    for n in range(1, points + 2):  # every kill point, and the completed clear
        again = rb.open(tmp_path / str(n))
        assert len(again) in (0, 10), n
        if len(again):  # killed before the clear's first store: nothing changed
            assert not again.table.cleared.any(), n
            again.close()
            shutil.rmtree(tmp_path / str(n))
            continue
        for t in range(4):
            _stack_step(again, t)
        got = _stacks(again)
        assert got.items() <= want.items(), n  # never a wrong stack
        if n == points + 1:
            assert got == want
        again.close()
        shutil.rmtree(tmp_path / str(n))


# ------------------------------------------------------------- a path that never held a step
def _one_add(buf: Any) -> None:
    buf.add(obs=np.zeros(3, np.float32), action=0, reward=1.0,
            next_obs=np.ones(3, np.float32), terminated=False, truncated=False)


KILLED_FIRST_ADD = r"""
import os, signal, sys
import numpy as np
import replaybank as rb
from replaybank.storage.backends.memmap import MemmapBackend

MemmapBackend.record_owner = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
buf = rb.ReplayBuffer(capacity=64, storage="memmap", path=sys.argv[1], seed=0)
buf.add(obs=np.zeros(3, np.float32), action=0, reward=1.0, next_obs=np.ones(3, np.float32),
        terminated=False, truncated=False)
"""


@pytest.mark.parametrize("how", ["closed before any add", "killed in its first add"])
def test_a_path_that_never_held_a_step_takes_a_new_buffer(tmp_path: Path, how: str) -> None:
    d = tmp_path / "buf"
    (tmp_path / "keep.txt").write_text("a user's file")
    if how == "closed before any add":
        rb.ReplayBuffer(capacity=64, storage="memmap", path=d, seed=0).close()
    else:
        r = subprocess.run([sys.executable, "-c", KILLED_FIRST_ADD, str(d)], timeout=120)
        assert r.returncode == -9 and (d / "obs.bin").exists()
    with pytest.raises(CheckpointError, match=r"holds no step.*build a new buffer there"):
        rb.open(d)
    buf = rb.ReplayBuffer(capacity=64, storage="memmap", path=d, seed=0)
    _one_add(buf)
    buf.close()
    assert len(rb.open(d)) == 1 and (tmp_path / "keep.txt").exists()


def test_a_path_that_holds_steps_is_never_taken(tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(capacity=64, storage="memmap", path=tmp_path, seed=0)
    _one_add(buf)
    buf.close()
    before = _digests(tmp_path)
    with pytest.raises(ConfigError, match=r"rb\.open\(path\).*storage=rb\.MemmapBackend\("
                                          r"path, overwrite=True\)"):
        rb.ReplayBuffer(capacity=64, storage="memmap", path=tmp_path, seed=0)
    assert _digests(tmp_path) == before
    # the way out the message names works
    new = rb.ReplayBuffer(capacity=64, storage=rb.MemmapBackend(tmp_path, overwrite=True))
    assert len(new) == 0


@pytest.mark.parametrize("path", ["", b""])
def test_an_empty_path_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  path: Any) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"path=.*needs a directory"):
        rb.ReplayBuffer(capacity=8, storage="memmap", path=path, seed=0)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------- fork
def _add_t(buf: Any, t: int) -> None:
    buf.add(obs=np.full(3, t, np.float32), action=t, reward=float(t),
            next_obs=np.full(3, t + 1, np.float32), terminated=False, truncated=False)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_forked_child_cannot_write_the_parents_files(tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(capacity=16, storage="memmap", path=tmp_path / "b", seed=0)
    for t in range(3):
        _add_t(buf, t)
    _add_t(buf, 3)  # the hot path is cached now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        out = []
        for call in (lambda: _add_t(buf, 100), lambda: buf.extend(
                obs=np.zeros((2, 3)), action=np.zeros(2), reward=np.zeros(2),
                next_obs=np.zeros((2, 3)), terminated=np.zeros(2, bool),
                truncated=np.zeros(2, bool)), buf.flush, buf.clear):
            try:
                call()
                out.append("ok")
            except ConfigError as exc:
                out.append(str(exc))
        out.append(str(len(buf)))  # reading is fine
        os.write(write, "\n".join(out).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as fh:
        lines = fh.read().split("\n")
    for line, verb in zip(lines, ("add()", "extend()", "flush", "clear()"), strict=False):
        assert f"cannot {verb}" in line and f"from the writer, process {os.getpid()}" in line
        assert "rb.open(path)" in line and "storage='shared'" in line
    assert lines[4] == "4"
    for t in range(4, 6):  # the parent goes on alone
        _add_t(buf, t)
    buf.close()
    again = rb.open(tmp_path / "b")
    keys = np.arange(6)
    assert again.table.gather("action", keys).tolist() == list(range(6))
    assert again.table.gather_next("obs", keys)[:, 0].tolist() == list(range(1, 7))


FORKING_WRITER = r"""
import multiprocessing as mp, sys, time
import numpy as np
import replaybank as rb

buf = rb.ReplayBuffer(capacity=8, storage="memmap", path=sys.argv[1], seed=0)
buf.add(obs=np.zeros(3, np.float32), action=0, reward=1.0, next_obs=np.ones(3, np.float32),
        terminated=False, truncated=False)
worker = mp.get_context("fork").Process(target=time.sleep, args=(60,))
worker.start()  # an env worker, as a vector env forks them
print(worker.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_forked_worker_does_not_keep_a_killed_writers_lock(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", FORKING_WRITER, str(tmp_path)],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        worker = int(p.stdout.readline())
        p.kill()
        p.wait()
        try:  # the worker still runs (it drops its copy as soon as it is scheduled)
            for _ in range(50):
                try:
                    again = rb.open(tmp_path)
                    break
                except ConfigError:
                    time.sleep(0.1)
            else:
                again = rb.open(tmp_path)
            assert len(again) == 1
        finally:
            os.kill(worker, 9)
    finally:
        p.kill()


# ------------------------------------------------------------- damaged or unreadable files
def test_a_data_file_replaced_by_a_directory_is_a_checkpoint_error(tmp_path: Path) -> None:
    _filled(tmp_path, steps=5)
    (tmp_path / "reward.bin").unlink()
    (tmp_path / "reward.bin").mkdir()
    for mode in ("r+", "r"):
        with pytest.raises(CheckpointError, match=r"reward\.bin.*not a regular file.*damaged"):
            rb.open(tmp_path, mode=mode)


def _as_nobody(calls: dict[str, Any]) -> dict[str, str]:
    """Run each call in a child process of an unprivileged user (root: uid 65534)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - reports through the pipe
        out = []
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            for label, call in calls.items():
                try:
                    call()
                    out.append(f"{label}\tok")
                except Exception as exc:  # reported to the parent
                    out.append(f"{label}\t{type(exc).__name__}: {exc}")
        finally:
            os.write(write, "\n".join(out).encode())
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as fh:
        return dict(line.split("\t", 1) for line in fh.read().splitlines())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_unreadable_or_read_only_data_files_are_library_errors() -> None:
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        ro, hidden = root / "ro", root / "hidden"
        _filled(ro, steps=5)
        _filled(hidden, steps=5)
        if os.geteuid() == 0:
            for p in [root, *root.rglob("*")]:
                os.chown(p, 65534, 65534)
        root.chmod(0o755)
        (ro / "obs.bin").chmod(0o444)
        (hidden / "obs.bin").chmod(0o000)
        got = _as_nobody({"ro r+": lambda: rb.open(ro), "ro r": lambda: rb.open(ro, mode="r"),
                          "hidden r": lambda: rb.open(hidden, mode="r")})
        assert got["ro r"] == "ok"
        assert got["ro r+"].startswith("ConfigError") and "obs.bin" in got["ro r+"]
        assert "cannot be read and written" in got["ro r+"]
        assert "mode='r'" in got["ro r+"]
        assert got["hidden r"].startswith("ConfigError") and "obs.bin" in got["hidden r"]
        assert "fix its permissions" in got["hidden r"]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_open_overrides_apply_to_that_open_only(tmp_path: Path) -> None:
    _filled(tmp_path, steps=5)
    buf = rb.open(tmp_path, seed=7, n_step=5)
    assert buf.config().n_step == 5 and buf.config().seed == 7
    buf.add(**_step(5, 2))
    buf.close()
    again = rb.open(tmp_path)
    assert again.config().n_step == 1 and again.config().seed == 1 and len(again) == 12
