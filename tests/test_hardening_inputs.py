"""Hardening of add/extend inputs and of the crash-safe memmap write order.

Each test fails on the code before the fix: zero-size observations (SIGFPE in the C
writer), big-endian fields (native-order scalars in the C writer), int64 range checked
in float64, non-canonical bools, string/object values and fields, and the memmap write
order (a kill between two counter stores, or in the middle of a long extend). Crashes run
in a subprocess so that a segfault fails the test instead of killing pytest. Every check
runs under each writer (``REPLAYBANK_WRITER``: the compiled C writer where it is built,
and the reference Python writer), and the crash-safety matrix also with the C
accelerator off (``REPLAYBANK_PURE_PYTHON=1``); the crash tests load the compiled
writer's kill-point build (``REPLAYBANK_KILLPOINTS=1``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import DtypeError, SpecError
from replaybank.storage.writers.compiled import accelerated

WRITERS = ["auto", "compiled", "reference"]
ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("REPLAYBANK_WRITER", "REPLAYBANK_PURE_PYTHON", "REPLAYBANK_KILL_AT")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _run(code: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=_env(**env), cwd=str(ROOT))


@pytest.fixture(params=WRITERS)
def writer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each writer choice (the compiled one only where the accelerator is built)."""
    name = str(request.param)
    if name == "compiled" and not accelerated():
        pytest.skip("the C accelerator is not built (or REPLAYBANK_PURE_PYTHON=1)")
    monkeypatch.setenv("REPLAYBANK_WRITER", name)
    return name


def _step(k: float, **kw: Any) -> dict[str, Any]:
    """One step whose obs names it: obs = [k, k], next_obs = [k + 1, k + 1]."""
    out: dict[str, Any] = dict(obs=np.full(2, k, np.float32), action=int(k), reward=float(k),
                               next_obs=np.full(2, k + 1, np.float32), terminated=False,
                               truncated=False)
    out.update(kw)
    return out


def _stored(buf: Any, field: str) -> dict[float, Any]:
    """``{obs[0]: value of field}`` of every live step, read through sample()."""
    b = buf.sample(256)
    return {float(o[0]): v for o, v in zip(b.obs, getattr(b, field), strict=True)}


# ---------------------------------------------------------------- 1. zero-size fields
def test_zero_size_observations_store_and_sample_under_every_writer() -> None:
    """A ``(3, 0)`` observation killed the process with SIGFPE in the C writer (second add;
    first add with a spec): now every writer stores and samples it, one lane or three,
    in memory and in memmap files, inferred or declared."""
    r = _run("""
        import os, tempfile, numpy as np, replaybank as rb
        from replaybank.storage.writers.compiled import accelerated
        writers = ["auto", "reference"] + (["compiled"] if accelerated() else [])
        for w in writers:
            os.environ["REPLAYBANK_WRITER"] = w
            for lanes in (1, 3):
                for spec in (None, {"obs": ((3, 0), "float32"), "action": ((), "int64")}):
                    for storage in ("numpy", "memmap"):
                        kw = {"path": tempfile.mkdtemp()} if storage == "memmap" else {}
                        buf = rb.ReplayBuffer(capacity=4 * lanes, num_envs=lanes, spec=spec,
                                              storage=storage, seed=0, **kw)
                        lead = (lanes,) if lanes > 1 else ()
                        o = np.zeros(lead + (3, 0), np.float32)
                        act = np.arange(lanes) if lanes > 1 else 1
                        flag = np.zeros(lanes, bool) if lanes > 1 else False
                        for _ in range(6):
                            buf.add(obs=o, action=act, reward=np.ones(lanes, np.float32)
                                    if lanes > 1 else 1.0, next_obs=o, terminated=flag,
                                    truncated=flag)
                        buf.extend(obs=np.zeros((5,) + lead + (3, 0), np.float32),
                                   action=np.zeros((5,) + lead, np.int64),
                                   reward=np.zeros((5,) + lead, np.float32),
                                   next_obs=np.zeros((5,) + lead + (3, 0), np.float32),
                                   terminated=np.zeros((5,) + lead, bool),
                                   truncated=np.zeros((5,) + lead, bool))
                        b = buf.sample(5)
                        assert len(buf) == 4 * lanes and b.obs.shape == (5, 3, 0)
                        assert b.next_obs.shape == (5, 3, 0), b.next_obs.shape
        print("ok")
    """)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "ok"


# ---------------------------------------------------------------- 4. byte order
def test_big_endian_first_add_then_python_scalars_store_exact_values(writer: str) -> None:
    """A first add with a big-endian reward array made a ``>f4`` field, into which the C
    writer stored Python floats in native byte order (1e6 became 3.35e-39). Inferred
    fields are native now; a declared big-endian field still stores exact values."""
    buf = rb.ReplayBuffer(capacity=16, seed=0)
    buf.add(**_step(0, reward=np.array(0.0, ">f4"), obs=np.full(2, 0, ">f4"),
                    next_obs=np.full(2, 1, ">f4")))
    assert buf.spec is not None and buf.spec["reward"].dtype.isnative
    assert buf.spec["obs"].dtype == np.dtype(np.float32)
    for k in range(1, 5):
        buf.add(**_step(k, reward=1e6 * k))
    buf.add(**_step(5, reward=np.array(5e6, ">f4"), obs=np.full(2, 5, ">f4"),
                    next_obs=np.full(2, 6, ">f4")))
    got = _stored(buf, "reward")
    assert got == {float(k): 1e6 * k for k in range(6)}
    nxt = {float(o[0]): float(n[0]) for o, n in zip(*(lambda b: (b.obs, b.next_obs))(
        buf.sample(64)), strict=True)}
    assert nxt == {float(k): k + 1.0 for k in range(6)}

    declared = rb.ReplayBuffer(capacity=8, seed=0, spec={
        "obs": ((2,), ">f4"), "action": ((), ">i8"), "reward": ((), ">f4")})
    for k in range(4):
        declared.add(**_step(k, reward=1e6 + k, action=k * 1000))
    assert _stored(declared, "reward") == {float(k): 1e6 + k for k in range(4)}
    assert {o: int(a) for o, a in _stored(declared, "action").items()} == \
        {float(k): k * 1000 for k in range(4)}


# ---------------------------------------------------------------- 7. integer range
@pytest.mark.parametrize("bad", [2.0**63, 2**63, np.float64(2.0**63), -(2.0**63) - 2048.0,
                                 2**64, 1e300])
def test_out_of_range_int64_values_raise_and_leave_the_buffer(writer: str, bad: Any) -> None:
    """``add(action=2.0**63)`` stored -2**63 (the range check rounded in float64)."""
    buf = rb.ReplayBuffer(capacity=8, seed=0)
    buf.add(**_step(0))
    with pytest.raises(DtypeError, match="action"):
        buf.add(**_step(1, action=bad))
    assert len(buf) == 1
    with pytest.raises(DtypeError, match="action"):
        buf.extend(obs=np.zeros((2, 2), np.float32), next_obs=np.ones((2, 2), np.float32),
                   action=np.array([1.0, bad]) if not isinstance(bad, int) else [1, bad],
                   reward=np.zeros(2, np.float32), terminated=np.zeros(2, bool),
                   truncated=np.zeros(2, bool))
    assert len(buf) == 1
    buf.add(**_step(1, action=-(2.0**63)))  # exactly the minimum: fits
    buf.add(**_step(2, action=2**63 - 1))
    got = {o: int(a) for o, a in _stored(buf, "action").items()}
    assert got == {0.0: 0, 1.0: -(2**63), 2.0: 2**63 - 1}


def test_small_int_fields_check_their_exact_range(writer: str) -> None:
    buf = rb.ReplayBuffer(capacity=8, seed=0, spec={"obs": ((2,), "float32"),
                                                     "action": ((), "int8")})
    with pytest.raises(DtypeError, match="action"):
        buf.add(**_step(0, action=128.0))
    with pytest.raises(DtypeError, match="action"):
        buf.add(**_step(0, action=np.uint64(2**64 - 1)))
    buf.add(**_step(0, action=127.0))
    buf.add(**_step(1, action=-128))
    assert {o: int(a) for o, a in _stored(buf, "action").items()} == {0.0: 127, 1.0: -128}


# ---------------------------------------------------------------- 8. bools, strings, objects
def _bad_bool(shape: tuple[int, ...] = ()) -> Any:
    """A bool array whose bytes are 2 (numpy lets them through a view)."""
    return np.full(shape, 2, np.uint8).view(bool)


@pytest.mark.parametrize("lanes", [1, 3])
def test_bools_with_other_bytes_are_stored_as_canonical_0_1(writer: str, lanes: int) -> None:
    """A bool whose byte is 2 was stored as 2 (flags, and bool observations)."""
    lead = (lanes,) if lanes > 1 else ()
    buf = rb.ReplayBuffer(capacity=8 * lanes, num_envs=lanes, seed=0, autoreset_mode="same_step")

    def one(k: int, term: Any, obs_bool: Any) -> dict[str, Any]:
        o = np.zeros((*lead, 3), bool)
        return dict(obs=o | obs_bool, next_obs=o | obs_bool,
                    action=np.full(lead, k, np.int64) if lanes > 1 else k,
                    reward=np.zeros(lead, np.float32) if lanes > 1 else 0.0,
                    terminated=term, truncated=np.zeros(lead, bool) if lanes > 1 else False)

    buf.add(**one(0, np.zeros(lead, bool), np.zeros((*lead, 3), bool)))
    buf.add(**one(1, _bad_bool(lead), np.zeros((*lead, 3), bool)))
    buf.add(**one(2, np.zeros(lead, bool), _bad_bool((*lead, 3))))
    buf.extend(obs=_bad_bool((4, *lead, 3)), next_obs=_bad_bool((4, *lead, 3)),
               action=np.zeros((4, *lead), np.int64), reward=np.zeros((4, *lead), np.float32),
               terminated=_bad_bool((4, *lead)), truncated=np.zeros((4, *lead), bool))
    b = buf.sample(200)
    for name in ("obs", "next_obs", "terminated", "truncated"):
        raw = np.ascontiguousarray(getattr(b, name)).view(np.uint8)
        assert raw.max() <= 1, name
    assert b.terminated.any() and b.obs.any()
    t = buf.table
    for name in ("obs", "terminated"):  # what is stored, not only what is served
        assert np.asarray(t.arrays[name]).view(np.uint8).max() <= 1, name


@pytest.mark.parametrize("field, value", [("reward", "abc"), ("action", "x"),
                                          ("reward", np.array("1.0")), ("terminated", "no"),
                                          ("action", None), ("reward", object())])
def test_string_and_object_values_raise_dtype_error_naming_the_field(
        writer: str, field: str, value: Any) -> None:
    buf = rb.ReplayBuffer(capacity=8, seed=0)
    buf.add(**_step(0))
    with pytest.raises(DtypeError, match=field) as info:
        buf.add(**_step(1, **{field: value}))
    assert "could not convert" not in str(info.value)
    assert len(buf) == 1


@pytest.mark.parametrize("obs", [np.array(["a", "b"]), np.array([object(), 1], dtype=object),
                                 np.array([b"ab", b"c"]),
                                 np.array(["2024-01-01", "2024-01-02"], "datetime64[D]")])
def test_string_and_object_fields_are_refused_at_the_first_add(writer: str, obs: Any) -> None:
    """They trained fine but could never be saved: refused before the buffer allocates."""
    buf = rb.ReplayBuffer(capacity=8, seed=0)
    with pytest.raises(DtypeError, match="obs") as info:
        buf.add(**_step(0, obs=obs, next_obs=obs))
    assert "numeric" in str(info.value)
    assert buf.spec is None and len(buf) == 0
    with pytest.raises(DtypeError, match="info"):
        buf.add(**_step(0), info=np.array(["x"]))
    assert buf.spec is None
    buf.add(**_step(0))  # the buffer still works
    assert len(buf) == 1


@pytest.mark.parametrize("dtype", ["U3", "O", "S2", "datetime64[s]"])
def test_string_and_object_fields_are_refused_in_a_spec(dtype: str) -> None:
    with pytest.raises(SpecError, match=r"'obs'.*numeric array"):
        rb.ReplayBuffer(capacity=8, spec={"obs": ((2,), dtype), "action": ((), "int64")})
    with pytest.raises(SpecError, match="tag"):
        rb.Spec.coerce({"tag": ((), dtype)})


# ---------------------------------------------------------------- 13. memmap kill matrix
# A child process (one per writer configuration: its environment is read at import)
# runs the same sequence of adds and extends once per kill point: for n = 1, 2, ... it
# forks, arms the test hook to kill before the n-th durable store and runs the sequence
# in a fresh directory; it stops at the first n whose run completes. This process then
# reopens every directory with rb.open and checks the steps.
CHILD = r"""
import json, os, shutil, sys
import numpy as np
import replaybank as rb
from replaybank.storage.writers import killpoint

base, lanes, per, ops, limit = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", \
    json.loads(sys.argv[4]), int(sys.argv[5])
WIDE = int(sys.argv[6]) if len(sys.argv) > 6 else 0  # obs float64 [WIDE] into float32
DICT = len(sys.argv) > 7 and sys.argv[7] == "1"  # obs as {"a": obs[:2], "b": obs[2:]}
# files written before meta/start existed (reopened: counts drop first when evicting)
OLD = len(sys.argv) > 8 and sys.argv[8] == "1"
T = 8
ENDS = {5, 13, 22}  # lane-local steps whose episode ends (next_obs is a final obs)
ODT = np.float64 if WIDE else np.float32


def pad(x):
    return np.concatenate([x, np.zeros(WIDE - 3, ODT)]) if WIDE else x


def obs_of(k, lane):
    return pad(np.array([k, lane, 0.5 * k], ODT))


def next_of(k, lane):
    return pad(np.array([k + 0.25, lane, -1.0], ODT)) if k in ENDS else obs_of(k + 1, lane)


def values(ks, lane_ids):
    # [n, m] steps: lane_ids[j] at its own step ks[i][j]
    def arr(f, dt):
        return np.array([[f(k, lane) for k, lane in zip(row, lane_ids)] for row in ks], dt)
    return dict(obs=arr(obs_of, ODT), next_obs=arr(next_of, ODT),
                action=arr(lambda k, lane: 100 * k + lane, np.int64),
                reward=arr(lambda k, lane: k + lane / 10, np.float32),
                terminated=arr(lambda k, lane: k in ENDS and k % 2 == 1, bool),
                truncated=arr(lambda k, lane: k in ENDS and k % 2 == 0, bool))


def old_files(d):
    # a buffer's files without the start counter, as versions before it wrote them
    buf = rb.ReplayBuffer(capacity=T * lanes, num_envs=lanes, storage="memmap", path=d,
                          seed=0, spec={"obs": ((3,), "float32"), "action": ((), "int64")})
    buf.close()
    manifest = os.path.join(d, "replaybank_memmap.json")
    with open(manifest) as f:
        m = json.load(f)
    del m["arrays"]["meta/start"]
    with open(manifest, "w") as f:
        json.dump(m, f)
    os.remove(os.path.join(d, "meta%2Fstart.bin"))


def run(d):
    if OLD:
        shutil.copytree(os.path.join(base, "old"), d, dirs_exist_ok=True)
        buf = rb.open(d)
        assert buf.table.start is None
    else:
        buf = None
    kw = {}
    if per:
        kw["sampler"] = rb.PrioritizedSampler(alpha=0.6, beta=0.4)
    if WIDE:
        kw["spec"] = {"obs": ((WIDE,), "float32"), "action": ((), "int64")}
    if buf is None:
        buf = rb.ReplayBuffer(capacity=T * lanes, num_envs=lanes, storage="memmap", path=d,
                              seed=0, **kw)
    done = open(os.path.join(d, "progress"), "ab", buffering=0)
    k = [0] * lanes
    for kind, n, ids in ops:
        ids = list(range(lanes)) if ids is None else ids
        ks = [[k[lane] + i for lane in ids] for i in range(n)]
        v = values(ks, ids)
        env = None if len(ids) == lanes and ids == list(range(lanes)) else ids
        if kind == "add":
            one = {f: a[0] if lanes > 1 or env is not None else a[0, 0] for f, a in v.items()}
            if lanes == 1 and env is None:  # Python scalars, as training loops pass them
                for f in ("action", "reward", "terminated", "truncated"):
                    one[f] = one[f].item()
        else:
            one = {f: a if lanes > 1 or env is not None else a[:, 0] for f, a in v.items()}
        if DICT:  # two fields, each a strided view
            for f in ("obs", "next_obs"):
                one[f] = {"a": one[f][..., :2], "b": one[f][..., 2:]}
        (buf.add if kind == "add" else buf.extend)(env_ids=env, **one)
        for lane in ids:
            k[lane] += n
        done.write(b".")


if per:  # compile the sampler's kernels once, before the forks (they inherit them)
    warm = rb.ReplayBuffer(capacity=8, sampler=rb.PrioritizedSampler(), seed=0)
    for i in range(4):
        warm.add(obs=np.zeros(3, np.float32), action=0, reward=0.0,
                 next_obs=np.zeros(3, np.float32), terminated=False, truncated=False)
    warm.update_priorities(warm.sample(2).indices, np.ones(2))
if OLD:
    old_files(os.path.join(base, "old"))
points = 0
for n in range(1, limit + 1):
    d = os.path.join(base, str(n))
    os.makedirs(d)
    pid = os.fork()
    if pid == 0:
        try:
            killpoint.arm(n)
            run(d)
        except BaseException:
            import traceback
            traceback.print_exc()
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        points = n - 1
        break
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9, (n, status)
else:
    raise SystemExit(f"still killed after {limit} store points")
print(json.dumps({"points": points}))
"""

T = 8
ENDS = {5, 13, 22}


def _obs(k: int, lane: int) -> list[float]:
    return [k, lane, 0.5 * k]


def _next(k: int, lane: int) -> list[float]:
    return [k + 0.25, lane, -1.0] if k in ENDS else _obs(k + 1, lane)


def _per_lane(ops: list[Any], lanes: int) -> list[list[int]]:
    """Steps each op writes per lane: ``[op][lane]``."""
    out = []
    for _kind, n, ids in ops:
        ids = list(range(lanes)) if ids is None else ids
        out.append([n if lane in ids else 0 for lane in range(lanes)])
    return out


def _check_dir(d: Path, ops: list[Any], lanes: int, per: bool, wide: int = 0,
               dict_obs: bool = False, old: bool = False) -> None:
    """The reopened buffer holds every step of the completed ops (unless the interrupted
    op evicts it) and at most a complete prefix of the interrupted op, all exact (``wide``:
    obs of that many items, zero past the third; ``dict_obs``: the obs split in two
    fields, ``obs/a`` its first two items and ``obs/b`` the rest; ``old``: files without
    ``start``, whose stored ``counts`` may lag a commit by the interrupted op's steps, so
    the window may end on its steps and leave as many of the oldest out: what they hold
    is still exact)."""
    width = wide or 3
    progress = d / "progress"
    completed = len(progress.read_bytes()) if progress.exists() else 0
    steps = _per_lane(ops, lanes)
    if not (d / "replaybank_memmap.json").exists():
        assert completed == 0
        return
    buf = rb.open(d)
    t = buf.table
    for lane in range(lanes):
        k_done = sum(s[lane] for s in steps[:completed])
        n_in = steps[completed][lane] if completed < len(ops) else 0
        w, c = int(t.written[lane]), int(t.counts[lane])
        where = f"{d.name}: lane {lane}, {completed} ops done, w={w} c={c}"
        assert k_done <= w <= k_done + n_in, where
        assert 0 <= c <= min(T, w), where
        old_first = max(0, k_done - T)
        first = w - c
        assert first >= old_first, where  # nothing stale comes back
        lag = n_in if old else 0
        assert first <= max(old_first, k_done + n_in - T) + lag, where  # lost: evictions
        assert c >= min(k_done, T) - min(n_in, max(1, T // 4)) - lag, where  # never emptied
        if not c:
            continue
        seq = np.arange(first, w)
        keys = seq * lanes + lane
        if dict_obs:
            obs = np.concatenate([t.gather("obs/a", keys), t.gather("obs/b", keys)], axis=1)
            nxt = np.concatenate([t.gather_next("obs/a", keys), t.gather_next("obs/b", keys)],
                                 axis=1)
        else:
            obs, nxt = t.gather("obs", keys), t.gather_next("obs", keys)
        assert not obs[:, 3:].any() and not nxt[:, 3:].any(), where
        np.testing.assert_array_equal(obs[:, :3], [_obs(int(k), lane) for k in seq],
                                      err_msg=where)
        np.testing.assert_array_equal(nxt[:, :3], [_next(int(k), lane) for k in seq],
                                      err_msg=where)
        np.testing.assert_array_equal(t.gather("action", keys), 100 * seq + lane,
                                      err_msg=where)
        np.testing.assert_array_equal(t.gather("reward", keys),
                                      (seq + lane / 10).astype(np.float32), err_msg=where)
        ends = np.array([int(k) in ENDS for k in seq])
        np.testing.assert_array_equal(t.gather("terminated", keys), ends & (seq % 2 == 1),
                                      err_msg=where)
        np.testing.assert_array_equal(t.gather("truncated", keys), ends & (seq % 2 == 0),
                                      err_msg=where)
    if len(buf):
        b = buf.sample(16)  # the sampler (PER: rebuilt priorities) serves live steps only
        seen = np.concatenate([b.obs["a"], b.obs["b"]], axis=1) if dict_obs else b.obs
        assert seen.shape == (16, width)
        if per:
            assert np.all(np.isfinite(b.weights))
        k, lane = seen[:, 0].astype(np.int64), seen[:, 1].astype(np.int64)
        live = (k >= t.written[lane] - t.counts[lane]) & (k < t.written[lane])
        assert live.all()
    # the reopened buffer takes new writes
    one = (lanes, width) if lanes > 1 else (width,)
    o, no = np.zeros(one, np.float32), np.ones(one, np.float32)
    if dict_obs:
        o, no = {"a": o[..., :2], "b": o[..., 2:]}, {"a": no[..., :2], "b": no[..., 2:]}
    buf.add(obs=o, next_obs=no,
            action=np.zeros(lanes, np.int64) if lanes > 1 else 0,
            reward=np.zeros(lanes, np.float32) if lanes > 1 else 0.0,
            terminated=np.zeros(lanes, bool) if lanes > 1 else False,
            truncated=np.zeros(lanes, bool) if lanes > 1 else False)


# adds until full, an extend that fills, adds that evict, a short evicting extend, one
# longer than the ring (in chunks), with episode ends (steps 5 and 13)
OPS_FAST: list[Any] = [["add", 1, None]] * 2 + [["extend", 5, None], ["add", 1, None],
                                                ["add", 1, None], ["extend", 2, None],
                                                ["extend", 10, None]]
# PER: a fill, an evicting add, a long extend
OPS_PER: list[Any] = [["add", 1, None], ["extend", 6, None], ["add", 1, None],
                      ["add", 1, None], ["extend", 10, None]]
# more: a wrapping extend, out-of-step lanes (env_ids), a long wrap with an episode end
OPS_SLOW: list[Any] = [*OPS_FAST, ["add", 1, None], ["extend", 3, None], ["extend", 6, None],
                      ["add", 1, [0]], ["add", 1, None], ["extend", 20, None], ["add", 1, None]]

CONFIGS = [  # (writer env, pure python)
    ("auto", False), ("reference", False), ("auto", True),
]


def _matrix(tmp_path: Path, writer: str, pure: bool, lanes: int, per: bool,
            ops: list[Any], wide: int = 0, dict_obs: bool = False, old: bool = False) -> int:
    if not pure and writer == "auto" and not accelerated():
        pytest.skip("the C accelerator is not built")
    # the kill-point build of the compiled writer counts its durable stores
    env = {"REPLAYBANK_WRITER": writer, "REPLAYBANK_KILLPOINTS": "1"}
    if pure:
        env["REPLAYBANK_PURE_PYTHON"] = "1"
    base = tmp_path / "runs"
    base.mkdir()
    r = subprocess.run([sys.executable, "-c", CHILD, str(base), str(lanes),
                        "1" if per else "0", json.dumps(ops), "2000", str(wide),
                        "1" if dict_obs else "0", "1" if old else "0"],
                       capture_output=True, text=True, timeout=300, env=_env(**env),
                       cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    points = int(json.loads(r.stdout.strip().splitlines()[-1])["points"])
    assert points > 20
    for n in range(1, points + 2):  # every kill point, and the completed run
        _check_dir(base / str(n), ops, lanes, per, wide, dict_obs, old)
    return points


@pytest.mark.parametrize("writer, pure, lanes", [("auto", False, 1), ("auto", True, 3)])
def test_memmap_kill_at_every_store_keeps_completed_steps(
        tmp_path: Path, writer: str, pure: bool, lanes: int) -> None:
    """Kill at every durable store of adds and extends (including one longer than the
    ring): the reopened files hold every completed step exactly, and never an empty
    buffer in the middle of a long extend (counts once dropped to 0 first). The compiled
    writer with one lane and the pure-Python writers with three here; every writer
    choice, lane count and sampler in the slow matrix."""
    _matrix(tmp_path, writer, pure, lanes, False, OPS_FAST)


@pytest.mark.parametrize("writer, pure, lanes", [
    ("auto", True, 3), pytest.param("auto", True, 1, marks=pytest.mark.slow),
    pytest.param("auto", False, 3, marks=pytest.mark.slow)])
def test_memmap_kill_at_every_store_of_dict_observations(
        tmp_path: Path, writer: str, pure: bool, lanes: int) -> None:
    """The same with a dict observation of two fields (each kept aside and stored in
    turn): the pure-Python writer (its one-step add serves dict observations) and the
    compiled one."""
    _matrix(tmp_path, writer, pure, lanes, False, OPS_FAST, dict_obs=True)


@pytest.mark.parametrize("writer, pure, lanes", [
    ("auto", True, 3), ("auto", False, 3), pytest.param("auto", True, 1, marks=pytest.mark.slow),
    pytest.param("reference", False, 2, marks=pytest.mark.slow)])
def test_memmap_kill_at_every_store_of_files_without_start(
        tmp_path: Path, writer: str, pure: bool, lanes: int) -> None:
    """Files written before ``meta/start`` existed, reopened and written on: their writes
    drop ``counts`` before they overwrite evicted rows (there is no ``start`` to say which
    steps are live), so a kill at any store still leaves every completed step."""
    _matrix(tmp_path, writer, pure, lanes, False, OPS_FAST, old=True)


def test_memmap_kill_at_every_store_of_float64_chunks(tmp_path: Path) -> None:
    """As above with float64 observations of 128 items into float32: the extend of 10
    steps (1,280 items) is converted where written (rows and kept next observations in
    place); a kill at any store leaves the same exact prefix."""
    _matrix(tmp_path, "auto", False, 1, False, OPS_FAST, wide=128)


def test_memmap_kill_matrix_with_a_prioritized_sampler(tmp_path: Path) -> None:
    """The same with PER (the compiled writer, three lanes): the reopened sampler serves
    live steps only."""
    _matrix(tmp_path, "auto", False, 3, True, OPS_PER)


def test_the_production_build_counts_no_stores() -> None:
    """The production compiled writer has no kill points (the crash tests load the
    kill-point build): arming the hook there is an error, not a silently dead test."""
    r = _run("""
        import replaybank as rb
        from replaybank.errors import ConfigError
        from replaybank.storage.writers import compiled, killpoint
        if compiled.ACCEL is None:
            print("pure")
        else:
            assert compiled.ACCEL.__name__ == "replaybank._lane", compiled.ACCEL.__name__
            assert not compiled.ACCEL.KILLPOINTS and not hasattr(compiled.ACCEL, "arm")
            try:
                killpoint.arm(3)
            except ConfigError as e:
                assert "REPLAYBANK_KILLPOINTS=1" in str(e)
                print("refused")
        """)
    assert r.returncode == 0, r.stderr
    built = importlib.util.find_spec("replaybank._lane") is not None  # the child's view
    assert r.stdout.strip() == ("refused" if built else "pure")
    r = _run("""
        from replaybank.storage.writers import compiled
        print(compiled.ACCEL.__name__ if compiled.ACCEL else "pure", compiled.ACCEL.KILLPOINTS
              if compiled.ACCEL else "")
        """, REPLAYBANK_KILLPOINTS="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == (["replaybank._lane_killpoints", "True"] if built
                                else ["pure"])


@pytest.mark.slow
@pytest.mark.parametrize("writer, pure", CONFIGS)
@pytest.mark.parametrize("lanes, per", [(1, False), (3, False), (1, True), (3, True)])
def test_memmap_kill_matrix_long(tmp_path: Path, writer: str, pure: bool, lanes: int,
                                 per: bool) -> None:
    _matrix(tmp_path, writer, pure, lanes, per, OPS_SLOW)


def test_kill_hook_env_var_is_read_at_import(tmp_path: Path) -> None:
    """``REPLAYBANK_KILL_AT`` kills a plain run at the n-th store; unset, nothing happens."""
    code = f"""
        import numpy as np, replaybank as rb
        buf = rb.ReplayBuffer(capacity=8, storage="memmap", path={str(tmp_path / 'b')!r})
        for k in range(12):
            buf.add(obs=np.full(3, k, np.float32), action=k, reward=1.0,
                    next_obs=np.full(3, k + 1, np.float32), terminated=False, truncated=False)
        print(len(buf))
    """
    r = _run(code, REPLAYBANK_KILL_AT="7")  # it also loads the kill-point build
    assert r.returncode == -9 and r.stdout == ""
    again = rb.open(tmp_path / "b")
    assert 0 <= len(again) <= 1
    r = _run(code.replace("'b'", "'c'").replace("/b'", "/c'"))
    assert r.returncode == 0 and r.stdout.strip() == "8"
