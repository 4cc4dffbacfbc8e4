"""Fuzzed checkpoints and memmap directories: a damaged file gives a library error or a
buffer that works, never a crash.

Saved checkpoints (``rb.save``) and memmap directories (``storage="memmap"``) of several
buffer types are mutated: bit flips, truncation, files swapped between buffers or
deleted, and edits of counters, links, priorities and JSON state rewritten with valid
checksums (as a buggy writer would). Each mutated copy is loaded (``rb.load``) or reopened
(``rb.open``) and used (``len``, ``sample``, ``add``, ``sample``) in a child process, one
child per batch of mutations, so a segfault fails the test (naming the mutation) instead
of killing pytest. The outcome of each mutation must be a
:class:`~replaybank.errors.ReplayBankError` (normally ``CheckpointError``) or a buffer that
works.

The mutations are seeded (the bit-flip offsets land on the same bytes; only a checkpoint's
id and timestamp differ between runs). ``REPLAYBANK_FUZZ_COUNT`` raises the default count;
the ``slow`` test runs 1,000 more.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import textwrap
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.io.checkpoint import load_state, save_state
from tests.roundtrip import add_random, random_fields

ROOT = Path(__file__).resolve().parents[1]
BATCH = 20  # mutations per child process
DEFAULT_COUNT = int(os.environ.get("REPLAYBANK_FUZZ_COUNT", "160"))
CHILD_TIMEOUT_S = 240

# ---------------------------------------------------------------------- base buffers
CKPT_BASES: dict[str, Callable[[], Any]] = {
    "single": lambda: rb.ReplayBuffer(32, seed=1),
    "lanes_nstep": lambda: rb.ReplayBuffer(24, num_envs=3, n_step=3, gamma=0.9, seed=2),
    "per": lambda: rb.PrioritizedReplayBuffer(32, num_envs=2, seed=3),
    "recent_per": lambda: rb.ReplayBuffer(
        32, sampler=rb.RecentSampler(c_min=4, prioritized=rb.PrioritizedSampler()), seed=4),
    "framestack": lambda: rb.ReplayBuffer(30, frame_stack=3, seed=5),
}
MEMMAP_BASES: dict[str, Callable[[Path], Any]] = {
    "mm_single": lambda d: rb.ReplayBuffer(32, storage="memmap", path=d, seed=6),
    "mm_per": lambda d: rb.PrioritizedReplayBuffer(24, num_envs=2, storage="memmap", path=d,
                                                   seed=7),
}


def _fill(buf: Any, seed: int) -> Any:
    add_random(buf, np.random.default_rng(seed), 45)  # wraps the ring
    if isinstance(buf.sampler, rb.PrioritySampler):
        batch = buf.sample(8)
        buf.update_priorities(batch.indices, np.linspace(0.1, 4.0, 8))
    return buf


def build_bases(root: Path) -> dict[str, Path]:
    """One checkpoint directory per CKPT_BASES entry and one memmap directory (flushed:
    with a resume state) per MEMMAP_BASES entry, under ``root``."""
    out: dict[str, Path] = {}
    for i, (name, make) in enumerate(CKPT_BASES.items()):
        out[name] = root / name
        rb.save(_fill(make(), i), out[name])
    for i, (name, make_mm) in enumerate(MEMMAP_BASES.items()):
        out[name] = root / name
        buf = _fill(make_mm(out[name]), 100 + i)
        buf.flush()
        close = getattr(buf.backend, "close", None)
        if callable(close):
            close()
        del buf
    gc.collect()
    return out


# ---------------------------------------------------------------------- mutations
CKPT_KINDS = ("flip_state", "flip_manifest", "truncate_state", "truncate_manifest",
              "swap_state", "swap_manifest", "edit_array", "edit_json", "drop_key",
              "reshape_array")
MEMMAP_KINDS = ("mm_flip_meta", "mm_flip_file", "mm_truncate", "mm_set_counter",
                "mm_delete", "mm_swap", "mm_flip_resume")

_INT_VALUES = (-1, 0, 1, 2, 23, 24, 31, 32, 33, 10**6, 2**31 - 1, -(2**31), 2**40, -(2**62))
_FLOAT_VALUES = (np.nan, np.inf, -np.inf, -1.0, 0.0, 1e308, -1e-300)
_JSON_VALUES: tuple[Any, ...] = (None, -1, 0, 1, 10**6, 2**70, -1.5, 1e308, -1e308,
                                 "x", "", [], {}, True, [1, 2], {"a": 1})


def make_mutations(seed: int, count: int) -> list[dict[str, Any]]:
    """``count`` mutation descriptions (JSON-able), deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    out = []
    ckpts, mms = sorted(CKPT_BASES), sorted(MEMMAP_BASES)
    for i in range(count):
        if rng.random() < 0.7:
            kind = str(rng.choice(CKPT_KINDS))
            base = str(rng.choice(ckpts))
            other = str(rng.choice([b for b in ckpts if b != base]))
        else:
            kind = str(rng.choice(MEMMAP_KINDS))
            base = str(rng.choice(mms))
            other = base
        out.append({"id": f"{seed}-{i}", "kind": kind, "base": base, "other": other,
                    "seed": int(rng.integers(2**31))})
    return out


def _flip(path: Path, rng: np.random.Generator, head_bias: int = 0) -> str:
    data = bytearray(path.read_bytes())
    if not data:
        return f"{path.name} empty"
    hi = min(len(data), head_bias) if head_bias and rng.random() < 0.5 else len(data)
    at = int(rng.integers(hi))
    bit = int(rng.integers(8))
    data[at] ^= 1 << bit
    path.write_bytes(bytes(data))
    return f"{path.name} byte {at} bit {bit}"


def _truncate(path: Path, rng: np.random.Generator) -> str:
    size = path.stat().st_size
    keep = int(rng.integers(max(1, size)))
    with open(path, "r+b") as fh:
        fh.truncate(keep)
    return f"{path.name} to {keep} of {size} bytes"


def _leaves(tree: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(tree, dict):
        for k in sorted(tree, key=str):
            yield from _leaves(tree[k], (*path, k))
    elif isinstance(tree, list) and tree and not isinstance(tree[0], (int, float)):
        for i, v in enumerate(tree):
            yield from _leaves(v, (*path, i))
    else:
        yield path, tree


def _get(tree: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        tree = tree[k]
    return tree


def _set(tree: Any, path: tuple[Any, ...], value: Any) -> None:
    _get(tree, path[:-1])[path[-1]] = value


def _resave(d: Path, edit: Callable[[dict[str, Any]], str]) -> str:
    """Load the checkpoint in ``d``, edit its state and save it again (valid CRCs)."""
    manifest, state = load_state(d)
    state = _copy(state)
    what = edit(state)
    info: dict[str, Any] = {k: manifest[k] for k in ("buffer_type", "config", "metadata")
                            if k in manifest}
    save_state(state, d, info=info)
    return what


def _copy(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _copy(v) for k, v in tree.items()}
    if isinstance(tree, np.ndarray):
        return np.array(tree)
    return tree


def _edit_array(state: dict[str, Any], rng: np.random.Generator) -> str:
    arrays = [(p, v) for p, v in _leaves(state) if isinstance(v, np.ndarray) and v.size]
    # most edits go to the bookkeeping the writers index with
    meta = [(p, v) for p, v in arrays if "meta" in str(p[-1]) or p[-1] in (
        "free_slots", "priorities", "returns")]
    pool = meta if meta and rng.random() < 0.8 else arrays
    path, arr = pool[int(rng.integers(len(pool)))]
    at = tuple(int(rng.integers(n)) for n in arr.shape)
    if arr.dtype.kind == "f":
        value: Any = _FLOAT_VALUES[int(rng.integers(len(_FLOAT_VALUES)))]
    elif arr.dtype.kind == "b":
        value = not bool(arr[at])
    else:
        value = _INT_VALUES[int(rng.integers(len(_INT_VALUES)))]
        info = np.iinfo(arr.dtype)
        value = int(np.clip(value, info.min, info.max))
    arr[at] = value
    return f"{'/'.join(map(str, path))}{list(at)} = {value}"


def _edit_json(state: dict[str, Any], rng: np.random.Generator) -> str:
    leaves = [(p, v) for p, v in _leaves(state) if not isinstance(v, np.ndarray)]
    path, old = leaves[int(rng.integers(len(leaves)))]
    value = _JSON_VALUES[int(rng.integers(len(_JSON_VALUES)))]
    if isinstance(old, list) and old and rng.random() < 0.5:  # an inline array's element
        value = list(old)
        value[int(rng.integers(len(old)))] = _INT_VALUES[int(rng.integers(len(_INT_VALUES)))]
    _set(state, path, value)
    return f"{'/'.join(map(str, path))}: {old!r:.40} -> {value!r:.40}"


def _drop_key(state: dict[str, Any], rng: np.random.Generator) -> str:
    paths = [p for p, _ in _leaves(state)]
    path = paths[int(rng.integers(len(paths)))]
    path = path[:int(rng.integers(1, len(path) + 1))]
    parent = _get(state, path[:-1])
    del parent[path[-1]]
    return f"deleted {'/'.join(map(str, path))}"


def _reshape_array(state: dict[str, Any], rng: np.random.Generator) -> str:
    arrays = [(p, v) for p, v in _leaves(state) if isinstance(v, np.ndarray) and v.size > 1]
    path, arr = arrays[int(rng.integers(len(arrays)))]
    new = arr.reshape(-1)[: int(rng.integers(1, arr.size))] if rng.random() < 0.5 \
        else np.concatenate([arr.reshape(-1), arr.reshape(-1)[:3]])
    _set(state, path, np.ascontiguousarray(new))
    return f"{'/'.join(map(str, path))} {arr.shape} -> {new.shape}"


def apply_mutation(m: dict[str, Any], bases: dict[str, Path], work: Path) -> dict[str, Any]:
    """Copy the base directory to ``work`` and damage it; returns the job for the child."""
    rng = np.random.default_rng(m["seed"])
    d = work / m["id"]
    shutil.copytree(bases[m["base"]], d)
    kind = m["kind"]
    meta, state = d / "buffer_metadata.json", d / "buffer_state.safetensors"
    if kind == "flip_state":
        what = _flip(state, rng, head_bias=4096)
    elif kind == "flip_manifest":
        what = _flip(meta, rng)
    elif kind == "truncate_state":
        what = _truncate(state, rng)
    elif kind == "truncate_manifest":
        what = _truncate(meta, rng)
    elif kind in ("swap_state", "swap_manifest"):
        name = state.name if kind == "swap_state" else meta.name
        shutil.copyfile(bases[m["other"]] / name, d / name)
        what = f"{name} of {m['other']}"
    elif kind in ("edit_array", "edit_json", "drop_key", "reshape_array"):
        edit = {"edit_array": _edit_array, "edit_json": _edit_json, "drop_key": _drop_key,
                "reshape_array": _reshape_array}[kind]
        what = _resave(d, lambda s: edit(s, rng))
    else:
        what = _mutate_memmap(kind, d, rng)
    target = "open" if kind.startswith("mm_") else "load"
    return {"id": m["id"], "dir": str(d), "target": target,
            "label": f"{m['id']} {kind} {m['base']}: {what}"}


def _mutate_memmap(kind: str, d: Path, rng: np.random.Generator) -> str:
    files = sorted(p for p in d.iterdir() if p.is_file() and not p.name.endswith(".lock"))
    metas = [p for p in files if p.name.startswith("meta%2F")]
    bins = [p for p in files if p.suffix == ".bin"]
    if kind == "mm_flip_meta":
        return _flip(metas[int(rng.integers(len(metas)))], rng)
    if kind == "mm_flip_file":
        return _flip(files[int(rng.integers(len(files)))], rng)
    if kind == "mm_flip_resume":
        resume = [p for p in files if p.name.startswith("replaybank_resume_")]
        return _flip(resume[int(rng.integers(len(resume)))], rng, head_bias=2048)
    if kind == "mm_truncate":
        return _truncate(bins[int(rng.integers(len(bins)))], rng)
    if kind == "mm_delete":
        p = files[int(rng.integers(len(files)))]
        p.unlink()
        return f"deleted {p.name}"
    if kind == "mm_swap":
        a, b = (bins[int(i)] for i in rng.choice(len(bins), 2, replace=False))
        da, db = a.read_bytes(), b.read_bytes()
        a.write_bytes(db)
        b.write_bytes(da)
        return f"swapped {a.name} and {b.name}"
    assert kind == "mm_set_counter", kind
    p = metas[int(rng.integers(len(metas)))]
    dtype = np.int32 if "link" in p.name else np.int64
    arr = np.memmap(p, dtype=dtype, mode="r+")
    at = int(rng.integers(len(arr)))
    value = int(np.clip(_INT_VALUES[int(rng.integers(len(_INT_VALUES)))],
                        np.iinfo(dtype).min, np.iinfo(dtype).max))
    arr[at] = value
    arr.flush()
    del arr
    return f"{p.name}[{at}] = {value}"


# ---------------------------------------------------------------------- the child
def use(buf: Any, rng: np.random.Generator) -> None:
    """What a training loop does with a loaded buffer: len, sample, add, sample."""
    n = len(buf)
    if n:
        buf.sample(4)
    buf.add(**random_fields(buf, rng))
    buf.sample(4)


def run_jobs(jobfile: str) -> None:
    """Child entry point: load/open and use each job's directory, one JSON line each."""
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(0)
    for job in json.loads(Path(jobfile).read_text()):
        out: dict[str, Any] = {"id": job["id"]}
        try:
            buf = rb.load(job["dir"]) if job["target"] == "load" else rb.open(job["dir"])
            use(buf, rng)
            close = getattr(buf.backend, "close", None)
            if callable(close):
                close()
            del buf
            out["outcome"] = "ok"
        except rb.ReplayBankError as exc:
            out.update(outcome="library", error=type(exc).__name__)
        except Exception as exc:
            out.update(outcome="foreign", error=f"{type(exc).__name__}: {exc}"[:300],
                       where=traceback.format_exc()[-1500:])
        print(json.dumps(out), flush=True)


_CHILD = "import sys; from tests.test_fuzz_checkpoints import run_jobs; run_jobs(sys.argv[1])"


def run_batch(jobs: list[dict[str, Any]], jobfile: Path) -> tuple[list[dict[str, Any]], str]:
    """Run ``jobs`` in one child; returns the results and a failure description ('' when
    the child exited normally)."""
    jobfile.write_text(json.dumps(jobs))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(jobfile)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    results = [json.loads(line) for line in proc.stdout.splitlines()
               if line.startswith("{")]
    if proc.returncode == 0 and len(results) == len(jobs):
        return results, ""
    culprit = jobs[len(results)]["label"] if len(results) < len(jobs) else "(after the last)"
    how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    return results, (f"the child died ({how}) on mutation {culprit}\n"
                     f"stderr: {proc.stderr[-2000:]}")


def fuzz(seed: int, count: int, tmp: Path) -> None:
    bases = build_bases(tmp / "bases")
    work = tmp / "work"
    work.mkdir()
    mutations = make_mutations(seed, count)
    problems: list[str] = []
    outcomes: dict[str, int] = {}
    for start in range(0, len(mutations), BATCH):
        jobs = [apply_mutation(m, bases, work) for m in mutations[start:start + BATCH]]
        results, died = run_batch(jobs, tmp / f"jobs-{start}.json")
        labels = {j["id"]: j["label"] for j in jobs}
        for r in results:
            outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
            if r["outcome"] == "foreign":
                problems.append(f"{labels[r['id']]}: {r['error']}\n{r['where']}")
        if died:
            problems.append(died)
        for j in jobs:
            shutil.rmtree(j["dir"], ignore_errors=True)
    assert not problems, f"{len(problems)} mutations were not handled ({outcomes}):\n" + \
        "\n\n".join(problems)
    # the fuzz must reach the loaders: some mutations load and work, most are refused
    assert outcomes.get("ok", 0) > 0 and outcomes.get("library", 0) > 0, outcomes


def test_fuzzed_checkpoints_and_memmap_dirs(tmp_path: Path) -> None:
    fuzz(seed=20240611, count=DEFAULT_COUNT, tmp=tmp_path)


@pytest.mark.slow
def test_fuzzed_checkpoints_and_memmap_dirs_many(tmp_path: Path) -> None:
    fuzz(seed=7, count=1000, tmp=tmp_path)


# ---------------------------------------------------------------------- crash regressions
def run_child(code: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (which gets ``d``, an empty directory) in a fresh interpreter."""
    prelude = textwrap.dedent(f"""
        import numpy as np, replaybank as rb
        from pathlib import Path
        d = Path({str(tmp)!r})
        def fill(buf, n=10):
            for t in range(n):
                buf.add(obs=np.full(2, t, np.float32), action=t, reward=1.0,
                        next_obs=np.full(2, t + 1, np.float32), terminated=False,
                        truncated=False)
        """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def assert_refused(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 0, (
        f"the child died (return code {proc.returncode}; negative: a signal)\n"
        f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}")
    out = proc.stdout
    assert out.startswith("CheckpointError"), out + proc.stderr[-2000:]
    for needle in needles:
        assert needle in out, out


_MEMMAP_EDIT = """
    buf = rb.ReplayBuffer(32, storage="memmap", path=d, seed=0)
    fill(buf)
    del buf
    import gc; gc.collect()
    arr = np.memmap(d / {file!r}, dtype={dtype}, mode="r+")
    {edit}
    arr.flush(); del arr
    try:
        again = rb.open(d)
        fill(again, 1)   # segfaulted before: the compiled writer used the value as an offset
        print("opened and added", len(again), again.sample(4).obs.shape)
    except rb.CheckpointError as exc:
        print("CheckpointError", exc)
"""


def test_memmap_counts_past_capacity_is_refused_or_repaired_at_open(tmp_path: Path) -> None:
    proc = run_child(_MEMMAP_EDIT.format(file="meta%2Fcounts.bin", dtype="np.int64",
                                         edit="arr[0] = 1_000_000"), tmp_path)
    assert proc.returncode == 0, f"the child died ({proc.returncode}): {proc.stderr[-2000:]}"
    # files that keep each lane's window start rebuild counts from it (written - start);
    # a table without it refuses the counter
    if proc.stdout.startswith("opened"):
        assert proc.stdout.split()[3:5] == ["11", "(4,"], proc.stdout
    else:
        assert_refused(proc, "meta/counts[0] = 1000000", "[0, 32]")


def test_memmap_counts_past_capacity_without_window_start_is_refused(tmp_path: Path) -> None:
    proc = run_child(_MEMMAP_EDIT.format(
        file="meta%2Fcounts.bin", dtype="np.int64",
        edit="arr[0] = 1_000_000; (d / 'meta%2Fstart.bin').unlink(missing_ok=True)"), tmp_path)
    assert_refused(proc, "meta/counts[0] = 1000000", "[0, 32]")


def test_memmap_flipped_high_bit_of_newest_link_is_refused_at_open(tmp_path: Path) -> None:
    # 10 steps in lane 0: the newest (row 9) links to the side store
    proc = run_child(_MEMMAP_EDIT.format(file="meta%2Flink.bin", dtype="np.int32",
                                         edit="assert arr[9] > 0; arr[9] ^= np.int32(-2**31)"),
                     tmp_path)
    assert_refused(proc, "meta/link[9, 0]")


def test_checkpoint_with_negative_link_and_valid_crcs_is_refused_at_load(
        tmp_path: Path) -> None:
    proc = run_child("""
        from replaybank.io.checkpoint import load_state, save_state
        buf = rb.ReplayBuffer(32, seed=0)
        fill(buf)
        rb.save(buf, d)
        manifest, state = load_state(d)
        link = np.array(state["table"]["meta/link"])
        link[9, 0] = -(2**31) + 1
        state["table"]["meta/link"] = link
        save_state(state, d, info={k: manifest[k] for k in ("buffer_type", "config",
                                                             "metadata")})
        try:
            back = rb.load(d)
            fill(back, 1)   # segfaulted before
            print("loaded and added")
        except rb.CheckpointError as exc:
            print("CheckpointError", exc)
        """, tmp_path)
    assert_refused(proc, "meta/link[9, 0] = -2147483647")
