"""Files on disk under stress: full disks, two writers, paths outside the directory, killed
saves and damaged memmap manifests. Anything that could crash (SIGBUS, SIGSEGV) runs in a
child process, so a crash fails the test instead of killing pytest."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import CapacityError, CheckpointError, ConfigError
from replaybank.storage.backends.memmap import LOCK, MANIFEST, MemmapBackend

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SPEC = {"obs": ((4,), "float32"), "action": ((), "int64")}


def run_child(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; a signal death shows as a negative returncode."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def fill(buf: Any, n: int, end_every: int = 3, obs_dim: int = 4) -> Any:
    for t in range(n):
        buf.add(obs=np.full(obs_dim, t, np.float32), action=t, reward=1.0,
                next_obs=np.full(obs_dim, -t, np.float32),
                terminated=t % end_every == end_every - 1, truncated=False)
    return buf


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.iterdir()) if p.is_file() and p.name != LOCK}


def closed_buffer(d: Path, n: int = 20) -> None:
    buf = fill(rb.ReplayBuffer(32, storage="memmap", path=d, seed=0), n)
    buf.backend.close()


# ---------------------------------------------------------------------- 3: full disk
def test_capacity_beyond_the_free_disk_is_refused_up_front(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    cap = free + 1_000_000  # every array (even of one byte per step) needs more than is free
    with pytest.raises(CapacityError) as info:
        rb.ReplayBuffer(cap, storage="memmap", path=tmp_path / "m", spec=SPEC)
    msg = str(info.value)
    assert f"capacity {cap:,} steps" in msg and "are free on that disk" in msg
    assert f"{16 * cap:,} bytes" in msg or f"{8 * cap:,} bytes" in msg or \
        f"{cap:,} bytes" in msg  # the bytes the first array needs
    used = sum(p.stat().st_blocks * 512 for p in (tmp_path / "m").iterdir())
    sizes = [p.stat().st_size for p in (tmp_path / "m").iterdir()]
    assert used < 1 << 20 and max(sizes) < 1 << 20  # no huge (sparse) file left behind
    # without a spec the first add allocates: the same error, and the buffer stays empty
    buf = rb.ReplayBuffer(cap, storage="memmap", path=tmp_path / "lazy")
    with pytest.raises(CapacityError, match="free"):
        fill(buf, 1)
    assert len(buf) == 0


def test_new_files_take_their_disk_blocks_at_creation(tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(4096, storage="memmap", path=tmp_path, spec=SPEC)
    obs = tmp_path / MemmapBackend.file_name("obs")
    assert obs.stat().st_size == 4096 * 16
    assert obs.stat().st_blocks * 512 >= 4096 * 16  # reserved, not sparse
    assert len(buf) == 0


FSIZE_CHILD = """
    import os, resource, signal, sys
    import numpy as np
    import replaybank as rb

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: EFBIG, not a signal
    path = sys.argv[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    try:  # obs alone: 100_000 x 16 bytes > 1 MiB
        rb.ReplayBuffer(100_000, storage="memmap", path=path + "/big",
                        spec={"obs": ((4,), "float32"), "action": ((), "int64")})
        print("construction: no error")
    except Exception as exc:
        print("construction:", type(exc).__name__, exc)
    print("files:", sorted(p for p in os.listdir(path + "/big") if p.endswith(".bin")))
    # a buffer that fits; then the side store (one slot per episode end) cannot grow
    buf = rb.ReplayBuffer(1024, storage="memmap", path=path + "/grow", seed=0,
                          spec={"obs": ((256,), "float32"), "action": ((), "int64")})
    side = path + "/grow/side%2Fobs.bin"
    before = os.path.getsize(side)
    try:
        for t in range(200):  # every step ends an episode: its final obs takes a slot
            buf.add(obs=np.full(256, t, np.float32), action=t, reward=1.0,
                    next_obs=np.full(256, -t, np.float32), terminated=True, truncated=False)
            if t == 10:  # now the side file (64 slots of 1 KiB) may not grow
                resource.setrlimit(resource.RLIMIT_FSIZE, (before + 1000, before + 1000))
        print("growth: no error")
    except Exception as exc:
        print("growth:", type(exc).__name__, exc)
    print("after:", len(buf), os.path.getsize(side) == before,
          float(buf.sample(8, ).next_obs.max()) <= 0)
"""


def test_a_file_size_limit_gives_capacity_error_not_a_crash(tmp_path: Path) -> None:
    """RLIMIT_FSIZE stands in for a full disk: growing a file past it fails (EFBIG)."""
    out = run_child(FSIZE_CHILD, str(tmp_path))
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("construction: CapacityError"), out.stdout
    assert "capacity 100,000" in lines[0]
    assert lines[1] == "files: []", out.stdout  # the arrays that fitted were removed again
    lines.pop(1)
    assert lines[1].startswith("growth: CapacityError") and "side" in lines[1], out.stdout
    assert lines[2] == "after: 64 True True", out.stdout  # the rejected add changed nothing


REOPEN_READ_CHILD = """
    import sys
    import replaybank as rb
    try:
        buf = rb.open(sys.argv[1])
        for _ in range(20):
            b = buf.sample(16)
            float(b.obs.sum() + b.next_obs.sum())
        print("opened", len(buf))
    except Exception as exc:
        print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize("name", ["side/obs", "obs", "meta/link", "meta/counts"])
def test_a_truncated_file_gives_checkpoint_error_never_sigbus(tmp_path: Path,
                                                              name: str) -> None:
    closed_buffer(tmp_path, 30)
    file = tmp_path / MemmapBackend.file_name(name)
    with open(file, "r+b") as fh:  # the side store's file: every page past the end
        fh.truncate(0 if name == "side/obs" else file.stat().st_size // 3)
    out = run_child(REOPEN_READ_CHILD, str(tmp_path))
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)  # -7: SIGBUS
    assert out.stdout.startswith("CheckpointError"), out.stdout
    assert "truncated" in out.stdout or "shorter" in out.stdout


# ---------------------------------------------------------------------- 9: one writer
WRITER_CHILD = """
    import sys
    import numpy as np
    import replaybank as rb
    buf = rb.ReplayBuffer(32, storage="memmap", path=sys.argv[1], seed=0)
    for t in range(5):
        buf.add(obs=np.full(4, t, np.float32), action=t, reward=1.0,
                next_obs=np.full(4, t + 1, np.float32), terminated=False, truncated=False)
    print("ready", flush=True)
    sys.stdin.readline()  # hold the buffer open until the parent says so
"""


def test_a_second_process_cannot_write_a_buffer_that_is_open(tmp_path: Path) -> None:
    d = tmp_path / "m"
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER_CHILD), str(d)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(ConfigError) as info:
            rb.open(d)
        assert str(d) in str(info.value) and f"process {child.pid}" in str(info.value)
        assert "mode='r'" in str(info.value)  # the fix for a reader
        with pytest.raises(ConfigError, match=f"process {child.pid}"):
            MemmapBackend(d, overwrite=True)  # never deletes a live writer's files
        assert (d / "obs.bin").exists()
        reader = rb.open(d, mode="r")  # reading beside the writer is fine
        assert len(reader) == 5 and reader.sample(4).obs.shape == (4, 4)
        del reader
        child.stdin.write("done\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0
    finally:
        child.kill()
        child.wait()
    again = rb.open(d)  # the writer exited: its lock went with it
    assert len(again) == 5


def test_a_second_writer_in_the_same_process_is_refused(tmp_path: Path) -> None:
    buf = fill(rb.ReplayBuffer(32, storage="memmap", path=tmp_path, seed=0), 6)
    with pytest.raises(ConfigError, match=f"this process \\(pid {os.getpid()}\\)"):
        rb.open(tmp_path)
    with pytest.raises(ConfigError, match="open for writing"):
        MemmapBackend(tmp_path, overwrite=True)
    assert len(buf) == 6 and (tmp_path / "obs.bin").exists()
    buf.backend.close()
    assert buf.backend.closed
    again = rb.open(tmp_path)
    assert len(again) == 6
    del again  # garbage collection releases the lock too
    assert len(rb.open(tmp_path)) == 6


READER_CHILD = """
    import sys
    import numpy as np
    import replaybank as rb
    buf = rb.open(sys.argv[1], mode="r")
    print("len", len(buf), buf.sample(4).obs.shape)
    one = dict(obs=np.zeros(4, np.float32), action=0, reward=1.0,
               next_obs=np.ones(4, np.float32), truncated=False)
    for name, call in [
        ("add", lambda: buf.add(**one, terminated=False)),
        ("add_end", lambda: buf.add(**one, terminated=True)),
        ("extend", lambda: buf.extend(**{k: np.stack([np.asarray(v)] * 40)
                                       for k, v in one.items()},
                                     terminated=np.zeros(40, bool))),
        ("flush", lambda: buf.flush()),
    ]:
        try:
            call()
            print(name, "no error")
        except Exception as exc:
            print(name, type(exc).__name__, exc)
    print("len", len(buf))
"""


def test_a_read_only_buffer_refuses_writes_clearly(tmp_path: Path) -> None:
    closed_buffer(tmp_path, 20)
    before = digest(tmp_path)
    out = run_child(READER_CHILD, str(tmp_path))
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    lines = out.stdout.splitlines()
    assert lines[0] == "len 20 (4, 4)" and lines[-1] == "len 20", out.stdout
    for line in lines[1:-1]:
        assert line.split()[1] == "ConfigError" and "read-only" in line, out.stdout
    assert digest(tmp_path) == before  # nothing reached the files


def test_mode_is_checked(tmp_path: Path) -> None:
    closed_buffer(tmp_path)
    with pytest.raises(ConfigError, match="mode='w'"):
        rb.open(tmp_path, mode="w")
    with pytest.raises(ConfigError, match="reopen=True"):
        MemmapBackend(tmp_path / "new", mode="r")


# ---------------------------------------------------------------------- 11: paths
def edit_manifest(d: Path, change: Callable[[dict[str, Any]], None]) -> None:
    m = json.loads((d / MANIFEST).read_text())
    change(m)
    (d / MANIFEST).write_text(json.dumps(m))


def test_files_outside_the_directory_are_never_touched(tmp_path: Path) -> None:
    d = tmp_path / "replay"
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    closed_buffer(d)

    def point_outside(m: dict[str, Any]) -> None:
        m["arrays"]["obs"]["file"] = "../precious.txt"
        m["arrays"]["../precious.txt"] = dict(m["arrays"]["action"], file="../precious.txt")

    edit_manifest(d, point_outside)
    with pytest.raises(CheckpointError, match="precious"):
        rb.open(d)
    assert precious.read_text() == "keep me"
    fresh = MemmapBackend(d, overwrite=True)  # deletes the old buffer's own files only
    assert precious.read_text() == "keep me"
    assert not (d / "obs.bin").exists()
    fresh.close()


def test_a_link_out_of_the_directory_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "replay"
    precious = tmp_path / "precious.bin"
    closed_buffer(d)
    shutil.copy(d / "obs.bin", precious)
    (d / "obs.bin").unlink()
    (d / "obs.bin").symlink_to(precious)
    with pytest.raises(CheckpointError, match="outside"):
        rb.open(d)
    before = precious.read_bytes()
    MemmapBackend(d, overwrite=True).close()  # removes the link, not its target
    assert precious.read_bytes() == before and not (d / "obs.bin").is_symlink()


# ---------------------------------------------------------------------- 2: manifests
def _set(path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(m: dict[str, Any]) -> None:
        node = m
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


def _drop(path: tuple[str, ...]) -> Callable[[dict[str, Any]], None]:
    def change(m: dict[str, Any]) -> None:
        node = m
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return change


MUTATIONS: dict[str, Callable[[dict[str, Any]], None] | bytes] = {
    "not_utf8": b'{"format": "replaybank.memmap", "x": "\xff\xfe"}',
    "not_json": b"{'format': ",
    "deep_json": b"[" * 100_000 + b"]" * 100_000,
    "list": b"[1, 2]",
    "arrays_list": _set(("arrays",), [1]),
    "entry_not_dict": _set(("arrays", "obs"), "obs.bin"),
    "missing_dtype": _drop(("arrays", "obs", "dtype")),
    "missing_file": _drop(("arrays", "meta/link", "file")),
    "bad_dtype": _set(("arrays", "obs", "dtype"), "nope"),
    "object_dtype": _set(("arrays", "obs", "dtype"), "|O"),
    "dtype_number": _set(("arrays", "obs", "dtype"), 7),
    "rows_str": _set(("arrays", "obs", "rows"), "32"),
    "negative_rows": _set(("arrays", "side/obs", "rows"), -5),
    "huge_row_shape": _set(("arrays", "obs", "row_shape"), [10**12, 10**12]),
    "negative_dim": _set(("arrays", "obs", "row_shape"), [1, -4]),
    "row_shape_str": _set(("arrays", "obs", "row_shape"), "4"),
    "growable_int": _set(("arrays", "side/obs", "growable"), 1),
    "config_list": _set(("config",), [1, 2]),
    "version_str": _set(("version",), "1"),
    "newer_version": _set(("version",), 99),
    "side_rows_beyond_file": _set(("arrays", "side/obs", "rows"), 10**6),
}

MANIFEST_CHILD = """
    import sys
    import replaybank as rb
    for d in sys.argv[1:]:
        try:
            buf = rb.open(d)
            buf.sample(8)
            print(d, "opened")
        except Exception as exc:
            print(d, type(exc).__name__, str(exc).replace(chr(10), " ")[:300])
        finally:
            buf = None
"""


def test_damaged_manifests_give_checkpoint_error(tmp_path: Path) -> None:
    base = tmp_path / "base"
    closed_buffer(base)
    dirs = []
    for name, change in MUTATIONS.items():
        d = tmp_path / name
        shutil.copytree(base, d)
        if isinstance(change, bytes):
            (d / MANIFEST).write_bytes(change)
        else:
            edit_manifest(d, change)
        dirs.append(str(d))
    out = run_child(MANIFEST_CHILD, *dirs, timeout=300)
    assert out.returncode == 0, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    got = {Path(line.split()[0]).name: line for line in out.stdout.splitlines()}
    for name in MUTATIONS:
        assert name in got, (name, out.stdout)
        kind = got[name].split()[1]
        assert kind == "CheckpointError", got[name]
        assert str(tmp_path / name) in got[name], got[name]  # names the path


# ---------------------------------------------------------------------- 14: temp files
SAVE_CHILD = """
    import sys
    import numpy as np
    import replaybank as rb
    n = 60_000
    buf = rb.ReplayBuffer(n, seed=0)
    obs = np.random.default_rng(0).standard_normal((n, 512)).astype(np.float32)
    buf.extend(obs=obs, action=np.zeros(n, np.int64), reward=np.ones(n, np.float32),
               next_obs=obs + 1, terminated=np.zeros(n, bool), truncated=np.zeros(n, bool))
    print("saving", flush=True)
    while True:
        rb.save(buf, sys.argv[1])
"""


def kill_mid_save(d: Path) -> list[Path]:
    """SIGKILL a child while its save is writing; the temporaries it left."""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SAVE_CHILD), str(d)],
                             stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "saving"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            tmps = list(d.glob(f"*.tmp-{child.pid}-*")) if d.exists() else []
            if tmps and tmps[0].stat().st_size > 1 << 20:
                os.kill(child.pid, signal.SIGKILL)
                break
            time.sleep(0.001)
        child.wait(timeout=30)
    finally:
        child.kill()
        child.wait()
    return list(d.glob(f"*.tmp-{child.pid}-*"))


def test_the_next_save_removes_the_temporaries_of_a_killed_save(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    left = kill_mid_save(d)
    assert left, "the child was not killed mid-save"
    live = d / f"buffer_state.safetensors.tmp-{os.getppid()}-0123abcd"  # a live process
    live.write_bytes(b"in flight elsewhere")
    mine = d / f"buffer_metadata.json.tmp-{os.getpid()}-89abcdef"  # ours, not in flight
    mine.write_bytes(b"left by an error")
    dead = d / f"buffer_state.safetensors.tmp-{dead_pid()}-00ff00ff"
    dead.write_bytes(b"dead")
    other = d / f"other_state.safetensors.tmp-{dead_pid()}-00ff00ff"  # another prefix
    other.write_bytes(b"dead, another checkpoint's")
    small = fill(rb.ReplayBuffer(16, seed=0), 5)
    rb.save(small, d)
    assert not [p for p in left if p.exists()]
    assert not mine.exists() and not dead.exists()
    assert live.exists() and other.exists()
    assert len(rb.load(d)) == 5


def test_stale_memmap_manifest_temporaries_are_removed(tmp_path: Path) -> None:
    closed_buffer(tmp_path)
    old_style = tmp_path / f"{MANIFEST}.tmp-{dead_pid()}"
    tagged = tmp_path / f"{MANIFEST}.tmp-{dead_pid()}-0badcafe"
    live = tmp_path / f"{MANIFEST}.tmp-{os.getppid()}-0badcafe"
    for p in (old_style, tagged, live):
        p.write_text("{}")
    reader = rb.open(tmp_path, mode="r")  # a reader removes nothing
    assert old_style.exists() and tagged.exists()
    del reader
    buf = rb.open(tmp_path)
    assert not old_style.exists() and not tagged.exists() and live.exists()
    assert len(buf) == 20


def test_buffer_close_releases_the_writer_lock(tmp_path: Path) -> None:
    """``buf.close()`` (and a sequence buffer's) syncs and frees the directory for the next
    writer, which continues with the same steps."""
    d = tmp_path / "mm"
    buf = rb.ReplayBuffer(16, storage="memmap", path=d, seed=0)
    for t in range(5):
        buf.add(obs=np.full(2, t, np.float32), action=t, reward=1.0,
                next_obs=np.full(2, t + 1, np.float32), terminated=False, truncated=False)
    with pytest.raises(ConfigError, match="open for writing"):
        rb.open(d)
    buf.close()
    buf.close()  # idempotent
    again = rb.open(d)
    assert len(again) == 5
    seq = rb.SequenceReplayBuffer(16, sequence_length=2, storage="memmap", path=tmp_path / "s")
    seq.add(obs=np.zeros(2, np.float32), action=0, reward=1.0,
            next_obs=np.ones(2, np.float32), terminated=False, truncated=False)
    seq.close()
    rb.open(tmp_path / "s").close()
    rb.ReplayBuffer(8).close()  # in memory: nothing to release


def _writes(buf: Any, state: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """Each public call that writes the table, with good values."""
    step = {"obs": np.full(4, 7, np.float32), "action": 3, "reward": 1.0,
            "next_obs": np.full(4, 8, np.float32), "terminated": False, "truncated": False}
    chunk = {k: np.stack([np.asarray(v)] * 3) for k, v in step.items()}
    return {"add": lambda: buf.add(**step), "extend": lambda: buf.extend(**chunk),
            "clear": buf.clear, "flush": buf.flush,
            "load_state_dict": lambda: buf.load_state_dict(state)}


def _table_bytes(buf: Any) -> dict[str, bytes]:
    t = buf.table
    out = {k: np.asarray(v).tobytes() for k, v in buf.state_dict()["table"].items()}
    out["free"] = repr(t.side.free).encode()  # the in-memory free list too
    return out


@pytest.mark.parametrize("writer", ["auto", "reference"])
@pytest.mark.parametrize("call", ["add", "extend", "clear", "flush", "load_state_dict"])
def test_a_closed_buffer_refuses_writes(tmp_path: Path, writer: str, call: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """After ``buf.close()`` the lock is gone and another process may write the files: a
    write (its hot path built by earlier adds included) raises ConfigError naming the call
    and the fix, and changes nothing in memory or on disk; ``rb.open`` then continues."""
    monkeypatch.setenv("REPLAYBANK_WRITER", writer)
    d = tmp_path / "mm"
    buf = fill(rb.ReplayBuffer(8, storage="memmap", path=d, seed=0), 11)
    state = buf.state_dict()
    buf.close()
    files, before = digest(d), _table_bytes(buf)
    with pytest.raises(ConfigError, match=rf"cannot {call}\(\): it was closed.*rb\.open"):
        _writes(buf, state)[call]()
    assert _table_bytes(buf) == before and digest(d) == files and len(buf) == 8
    again = rb.open(d)
    fill(again, 2)
    assert len(again) == 8 and int(again.table.written[0]) == 13


@pytest.mark.parametrize("writer", ["auto", "reference"])
@pytest.mark.parametrize("call", ["add", "extend", "clear", "flush", "load_state_dict"])
def test_a_read_only_buffer_refuses_writes_unchanged(tmp_path: Path, writer: str, call: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader opened with ``mode="r"`` beside a full buffer: a write is refused before
    anything changes; before the check, a refused evicting add moved the reader's own
    counters (one step fewer) and used up its free side slots."""
    monkeypatch.setenv("REPLAYBANK_WRITER", writer)
    d = tmp_path / "mm"
    buf = fill(rb.ReplayBuffer(8, storage="memmap", path=d, seed=0), 11)
    buf.flush()
    reader = rb.open(d, mode="r")
    before, files = _table_bytes(reader), digest(d)
    for _ in range(2):
        with pytest.raises(ConfigError, match=rf"cannot {call}\(\): it was opened read-only"):
            _writes(reader, buf.state_dict())[call]()
    assert _table_bytes(reader) == before and digest(d) == files and len(reader) == 8
    assert reader.sample(4).obs.shape == (4, 4)


def test_flush_after_close_leaves_the_next_writers_files_alone(tmp_path: Path) -> None:
    """``close()`` releases the lock, so the files may have a new writer: a late
    ``flush()`` of the closed buffer (before the fix it was allowed) raises ConfigError
    naming the path and ``rb.open(path)``, and neither the new writer's resume state nor
    its data change. ``close()`` again is a no-op; an open buffer's flush still works,
    with nothing added too (it saves nothing and returns)."""
    d = tmp_path / "mm"
    empty = rb.ReplayBuffer(8, storage="memmap", path=tmp_path / "empty", seed=0)
    empty.flush()  # nothing added yet: no files to resume, nothing raised
    buf = fill(rb.ReplayBuffer(8, storage="memmap", path=d, seed=0), 11)
    buf.flush()
    buf.close()
    buf.close()  # idempotent
    assert buf.backend.closed
    nxt = fill(rb.open(d), 3)  # the next writer of the files
    nxt.sample(2)
    nxt.flush()
    files = digest(d)
    with pytest.raises(ConfigError, match=rf"memmap buffer at {re.escape(str(d))}: cannot "
                                          r"flush\(\): it was closed.*rb\.open\(path\)"):
        buf.flush()
    assert digest(d) == files
    want = nxt.sample(4)
    nxt.close()
    back = rb.open(d)  # resumes from the next writer's flush: the identical next sample
    assert len(back) == 8 and np.array_equal(back.sample(4).obs, want.obs)


def test_a_closed_multiagent_buffer_refuses_flush(tmp_path: Path) -> None:
    """The multi-agent wrapper's flush is refused before it records its config."""
    buf = rb.MultiAgentReplayBuffer(8, ["a", "b"], storage="memmap", path=tmp_path / "m",
                                    seed=0)
    for t in range(3):
        buf.add(obs={k: np.full(2, t, np.float32) for k in "ab"},
                action={k: 0 for k in "ab"}, reward={k: 1.0 for k in "ab"},
                next_obs={k: np.full(2, t + 1, np.float32) for k in "ab"},
                terminated={k: False for k in "ab"}, truncated={k: False for k in "ab"})
    buf.flush()
    buf.close()
    files = digest(tmp_path / "m")
    with pytest.raises(ConfigError, match=r"cannot flush\(\): it was closed"):
        buf.flush()
    assert digest(tmp_path / "m") == files and len(rb.open(tmp_path / "m")) == 3


def test_close_after_another_thread_called(tmp_path: Path) -> None:
    """Once a second thread has called the buffer, every call takes the guard's lock,
    which is not reentrant: ``close()`` must take it once (a nested take hung here)."""
    import threading

    buf = fill(rb.ReplayBuffer(8, storage="memmap", path=tmp_path / "mm", seed=0), 5)
    t = threading.Thread(target=lambda: buf.sample(2))
    t.start()
    t.join()
    done = threading.Event()
    closer = threading.Thread(target=lambda: (buf.close(), done.set()), daemon=True)
    closer.start()
    assert done.wait(30), "close() deadlocked on the buffer's own lock"
    with pytest.raises(ConfigError, match="closed"):
        fill(buf, 1)


# ---------------------------------------------------------------- modules a file names
_NAMED_MODULE = '''
import pathlib

import numpy as np

pathlib.Path(__file__).with_name("IMPORTED").write_text("this module's code ran")


def reward(achieved, desired, info):
    return -(np.abs(achieved - desired).sum(-1) > 0).astype(np.float32)
'''

_GOAL_STEPS = '''
def fill_goals(buf):
    z, one = np.zeros(1, np.float32), np.ones(1, np.float32)
    for t in range(6):
        o = {"observation": np.full(2, t, np.float32), "achieved_goal": z + t,
             "desired_goal": one}
        n = {"observation": np.full(2, t + 1, np.float32), "achieved_goal": z + t + 1,
             "desired_goal": one}
        buf.add(obs=o, action=t % 2, reward=0.0, next_obs=n, terminated=t == 5,
                truncated=False)
'''


def test_a_file_never_makes_a_load_import_a_module(tmp_path: Path) -> None:
    """A HER reward function saved by import path (``module:attr``): loading the
    checkpoint or reopening the memmap directory in a fresh process whose working
    directory holds that module refuses to import it (its code never runs) and says how
    to proceed; ``trust_imports=True`` loads it, as does importing it first."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "rb_named_reward.py").write_text(_NAMED_MODULE)
    ckpt, mm, marker = tmp_path / "ckpt", tmp_path / "mm", mods / "IMPORTED"
    made = run_child(_GOAL_STEPS + textwrap.dedent('''
        import sys
        import numpy as np
        import replaybank as rb
        sys.path.insert(0, sys.argv[1])
        import rb_named_reward
        her = rb.HerReplayBuffer(capacity=50, reward_fn=rb_named_reward.reward, seed=0)
        fill_goals(her)
        her.save(sys.argv[2])
        disk = rb.HerReplayBuffer(capacity=50, reward_fn=rb_named_reward.reward, seed=0,
                                  storage="memmap", path=sys.argv[3])
        fill_goals(disk)
        disk.flush()
        disk.close()
        print(her.config().model_dump()["reward_fn"])
    '''), str(mods), str(ckpt), str(mm))
    assert made.returncode == 0, made.stderr
    assert made.stdout.split()[-1] == "rb_named_reward:reward"
    marker.unlink()

    def child(code: str) -> subprocess.CompletedProcess[str]:  # cwd: the module's dir
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(ckpt),
                               str(mm)], env=ENV, cwd=mods, capture_output=True, text=True,
                              timeout=120)

    refused = child('''
        import sys
        import replaybank as rb
        from replaybank.errors import CheckpointError, ConfigError
        for call, err in ((lambda: rb.load(sys.argv[1]), CheckpointError),
                          (lambda: rb.open(sys.argv[2], mode="r"), ConfigError)):
            try:
                call()
            except err as e:
                assert "rb_named_reward" in str(e) and "trust_imports=True" in str(e), e
            else:
                raise SystemExit("loaded")
        assert "rb_named_reward" not in sys.modules
        print("refused")
    ''')
    assert refused.returncode == 0 and refused.stdout.split()[-1] == "refused", \
        refused.stdout + refused.stderr
    assert not marker.exists()  # the module's code never ran
    trusted = child('''
        import sys
        import replaybank as rb
        buf = rb.load(sys.argv[1], trust_imports=True)
        import rb_named_reward
        assert buf.view.reward_fn is rb_named_reward.reward
        assert rb.open(sys.argv[2], mode="r").view.reward_fn is rb_named_reward.reward
        buf.sample(4)
        print("loaded")
    ''')
    assert trusted.returncode == 0 and trusted.stdout.split()[-1] == "loaded", trusted.stderr
    assert marker.exists()
    marker.unlink()
    imported_first = child('''
        import sys
        import rb_named_reward
        import replaybank as rb
        assert rb.load(sys.argv[1]).view.reward_fn is rb_named_reward.reward
        print("loaded")
    ''')
    assert imported_first.returncode == 0, imported_first.stderr
    assert imported_first.stdout.split()[-1] == "loaded"
