"""Core benchmark: ReplayBuffer against raw preallocated numpy arrays (the floor).

Measures, at capacity 1,000,000 with obs float32[17] and action float32[6]:

* ``add``: one transition at a time (obs/next_obs as fresh float32 arrays, reward a
  Python float, flags Python bools, as a gymnasium loop produces them),
* ``extend``: chunks of 256 transitions,
* ``sample(256)``,
* ``add`` of one step of 16 envs at once (``num_envs=16``: a vector-env loop),
* ``sample(256)`` of a 16-env buffer (``num_envs=16``, each lane its own sequential
  stream, as a vector env fills it), against the ``ndarray.take`` floor, and of the
  one-lane stream cut across 16 lanes (no lane's next obs is its next row: every step's
  next obs is kept aside),

and, in the same run, the floor doing the same work on six preallocated numpy arrays
(obs, action, reward, next_obs, terminated, truncated) with slice assignment and
fancy-index gathers. Speed ratio = floor_time / our_time (1.0 = as fast as the floor).
Memory: resident-set growth of a filled buffer against the bytes of obs once + action +
reward + flags.

The timing helpers are :mod:`replaybank.cli.bench_harness`'s, the ones ``replaybank bench`` times
the peer libraries with. The machine may be noisy: times are CPU time of this process
(``time.process_time``),
ours and the floor are measured interleaved, each repeated, and the best (lowest) kept.

Second table, the input kinds (``--table inputs``): ``add`` and ``extend`` fed the same
transitions in the types real environments and loops produce, not only the stored dtypes
(obs float32[17], action float32[6] given as an explicit spec; reward float32, flags bool).
Rows are the kinds of :func:`replaybank.cli.bench_harness.input_steps`:

* ``exact``: the stored dtypes (1 env: reward a Python float, flags Python bools): the base;
* ``f64 obs+reward`` (MuJoCo: float64 obs/next_obs, reward float64 / ``np.float64``),
  ``f64 reward`` (gymnasium vector envs), ``int flags`` (int64 arrays / Python ints),
  ``scalars`` (1 env: ``np.float32`` reward, ``np.bool_`` flags; 4 envs: lists of Python
  floats/bools), ``lists`` (action a list, with 4 envs the reward too), ``torch`` (obs,
  next_obs, action CPU tensors; with 4 envs reward and flags tensors too, as gymnasium's
  ``NumpyToTorch`` gives them), ``torch action`` (a torch policy's action only),
  ``non-contiguous`` (obs/next_obs strided views, action a column slice).

For 1 and 4 envs (``--envs``), per kind: replaybank ``add`` (numpy storage, and
``storage="memmap"`` in a temporary directory), SB3 ``ReplayBuffer.add`` (``n_envs=E``) and
cpprb ``ReplayBuffer.add``, us per call, with the ratios kind / exact (target <= 1.5) and
peer / replaybank (target >= 2; ``!`` marks a miss); then ``extend`` of ``[256, E, ...]``
chunks (us per step = per call / 256, and per call) against 256 SB3 adds (SB3 has no
extend; the ``obs[i]`` indexing is timed, as ``replaybank bench`` does) and one cpprb
``add`` of the chunk. Every library gets the very same objects; SB3's signature also
takes ``done`` (``terminated | truncated`` in the flags' own type) and ``infos``
(``TimeLimit.truncated``), built beforehand and not timed; cpprb's ``done`` is
``terminated``. No reshaping is done for either. A library that raises on a kind shows
``refused`` and the error type. All libraries are filled to capacity first and timed
interleaved per repeat (CPU time, the best kept). replaybank and SB3 are filled with
:func:`replaybank.cli.bench_harness.fill_stream`: each lane a sequential stream of its own, so a
lane's next_obs is its next obs except at episode ends, as in a vector env's buffer (one
stream cut across the lanes would leave replaybank a side copy of every step's next_obs
to evict in every timed 4-env write); cpprb's cost does not depend on the values. A
missing SB3 or cpprb drops its columns with a note.

Run: ``python benchmarks/bench_core.py [--capacity N] [--repeats R] [--table
all|core|inputs] [--envs 1,4] [--kinds exact,torch,...] [--input-adds N] [--input-chunks N]
[--no-memmap]``; the default prints both tables (about 2-3 minutes on 2 cores). With
``REPLAYBANK_PURE_PYTHON=1`` in the environment the compiled one-lane add/extend
(``replaybank._lane``) is off and the pure-Python fallback is measured.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import tempfile
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import replaybank as rb
from replaybank.cli.bench_harness import (  # the harness `replaybank bench` times peers with
    ACT,
    BATCH,
    CHUNK,
    INPUT_KINDS,
    OBS,
    best_of,
    chunks,
    cpprb_kw,
    filled_cpprb,
    filled_replaybank,
    filled_sb3,
    input_chunks,
    input_steps,
    make_stream,
    sb3_call,
    sb3_chunk_adder,
    single_items,
    time_adds,
    time_extends,
    time_samples,
)

LANES = 16
TARGETS = {"add": 0.5, "extend": 0.9, "sample": 0.9, "sample*": 0.9, f"add x{LANES}": 0.5,
           "add async": 0.5, f"sample x{LANES}": 0.9, f"x{LANES} side": 0.9}


class Floor:
    """Six preallocated numpy arrays: the least work any buffer can do."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.obs = np.zeros((n, OBS), np.float32)
        self.next_obs = np.zeros((n, OBS), np.float32)
        self.action = np.zeros((n, ACT), np.float32)
        self.reward = np.zeros(n, np.float32)
        self.terminated = np.zeros(n, bool)
        self.truncated = np.zeros(n, bool)
        self.pos = 0
        self.size = 0
        self.rng = np.random.default_rng(0)

    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
            truncated: Any) -> None:
        i = self.pos
        self.obs[i] = obs
        self.action[i] = action
        self.reward[i] = reward
        self.next_obs[i] = next_obs
        self.terminated[i] = terminated
        self.truncated[i] = truncated
        self.pos = (i + 1) % self.n
        self.size = min(self.size + 1, self.n)

    def extend(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
               truncated: Any) -> None:
        i = self.pos
        j = i + len(obs)
        if j > self.n:  # chunks divide the capacity; restart after single adds
            i, j = 0, len(obs)
        self.obs[i:j] = obs
        self.action[i:j] = action
        self.reward[i:j] = reward
        self.next_obs[i:j] = next_obs
        self.terminated[i:j] = terminated
        self.truncated[i:j] = truncated
        self.pos = j % self.n
        self.size = min(self.size + len(obs), self.n)

    def sample(self, b: int) -> dict[str, Any]:
        idx = self.rng.integers(0, self.size, size=b)
        return {"obs": self.obs[idx], "action": self.action[idx], "reward": self.reward[idx],
                "next_obs": self.next_obs[idx], "terminated": self.terminated[idx],
                "truncated": self.truncated[idx], "indices": idx}


class LanesFloor(Floor):
    """The floor for ``lanes`` envs stepping together: rows of ``[T, lanes, ...]``."""

    def __init__(self, n: int, lanes: int) -> None:
        super().__init__(n // lanes)
        for name in ("obs", "next_obs", "action", "reward", "terminated", "truncated"):
            old = getattr(self, name)
            setattr(self, name, np.zeros((len(old), lanes, *old.shape[1:]), old.dtype))


class AsyncLanesFloor(LanesFloor):
    """The floor for async envs: each lane has its own write row."""

    def __init__(self, n: int, lanes: int) -> None:
        super().__init__(n, lanes)
        self.rows = np.zeros(lanes, np.int64)

    def add(self, env_ids: Any = None, **kw: Any) -> None:  # type: ignore[override]
        rows = self.rows[env_ids]
        for name, v in kw.items():
            getattr(self, name)[rows, env_ids] = v
        self.rows[env_ids] = (rows + 1) % len(self.obs)


def async_items(n: int, lanes: int, seed: int = 2) -> list[dict[str, Any]]:
    """``n`` steps of a random half of ``lanes`` envs (random order): ``add(env_ids=...)``."""
    rng = np.random.default_rng(seed)
    out = []
    for kw in lane_items(n, lanes, seed):
        ids = rng.permutation(lanes)[:lanes // 2]
        out.append({"env_ids": ids, **{k: v[ids] for k, v in kw.items()}})
    return out


def lane_items(n: int, lanes: int, seed: int = 1) -> list[dict[str, Any]]:
    """``n`` steps of ``lanes`` envs as a vector-env loop passes them to ``add``."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n + 1, lanes, OBS)).astype(np.float32)
    ends = rng.random((n, lanes)) < 1e-3
    return [{"obs": obs[i], "action": rng.standard_normal((lanes, ACT)).astype(np.float32),
             "reward": rng.standard_normal(lanes).astype(np.float32),
             "next_obs": obs[i + 1].copy(), "terminated": ends[i],
             "truncated": np.zeros(lanes, bool)} for i in range(n)]


class TakeFloor(Floor):
    """The floor gathering with ``ndarray.take`` (numpy's fastest row gather)."""

    def sample(self, b: int) -> dict[str, Any]:
        idx = self.rng.integers(0, self.size, size=b)
        return {"obs": self.obs.take(idx, axis=0), "action": self.action.take(idx, axis=0),
                "reward": self.reward.take(idx), "next_obs": self.next_obs.take(idx, axis=0),
                "terminated": self.terminated.take(idx), "truncated": self.truncated.take(idx),
                "indices": idx}


def measure_memory(capacity: int, stream: dict[str, Any]) -> tuple[int, int]:
    """RSS growth of a buffer filled from ``stream`` and the ideal byte count."""
    import psutil

    proc = psutil.Process()
    gc.collect()
    before = proc.memory_info().rss
    buf = rb.ReplayBuffer(capacity=capacity, seed=0)
    for i in range(0, capacity, CHUNK):
        buf.extend(**{k: v[i:i + CHUNK] for k, v in stream.items()})
    gc.collect()
    grown = proc.memory_info().rss - before
    ideal = capacity * (OBS * 4 + ACT * 4 + 4 + 2)
    assert len(buf) == capacity
    return grown, ideal


def core_table(args: argparse.Namespace) -> None:
    """The first table: ours against the numpy floor."""
    cap = args.capacity - args.capacity % CHUNK
    stream = make_stream(cap, episode_len=1000)

    # memory first, on a fresh heap
    grown, ideal = measure_memory(cap, stream)

    n_add = min(args.adds, cap)
    items = single_items(stream, n_add)
    n_chunks = min(cap // CHUNK, 1000)
    parts = chunks(stream, n_chunks)

    ours = rb.ReplayBuffer(capacity=cap, seed=0)
    ours_lanes = rb.ReplayBuffer(capacity=cap - cap % LANES, num_envs=LANES, seed=0)
    floor_lanes = LanesFloor(cap - cap % LANES, LANES)
    items_lanes = lane_items(min(n_add // LANES, len(floor_lanes.obs)), LANES)
    ours_async = rb.ReplayBuffer(capacity=cap - cap % LANES, num_envs=LANES, seed=0)
    floor_async = AsyncLanesFloor(cap - cap % LANES, LANES)
    items_async = async_items(len(items_lanes), LANES)
    floor = Floor(cap)
    take_floor = TakeFloor(cap)
    # fill both completely first: every page is touched, and timings are steady-state
    # (the ring wraps and overwrites, as it does for most of a training run)
    for target in (ours, floor, take_floor):
        for i in range(0, cap, CHUNK):
            target.extend(**{k: v[i:i + CHUNK] for k, v in stream.items()})
    assert len(ours) == cap and floor.size == cap == take_floor.size
    # a vector env's buffer (each lane its own stream), for sample x LANES, and the same
    # transitions as the one-lane buffer in LANES lanes (every next obs kept aside)
    ours_vec = filled_replaybank(cap, LANES)
    ours_many = rb.ReplayBuffer(capacity=cap - cap % LANES, num_envs=LANES, seed=0)
    rows = (cap - cap % LANES) // LANES
    for i in range(0, rows, CHUNK):
        n = min(CHUNK, rows - i)
        ours_many.extend(**{k: v[i * LANES:(i + n) * LANES].reshape(n, LANES, *v.shape[1:])
                            for k, v in stream.items()})
    results: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeats):  # interleave ours and the floor against noise
        for op, fo, ff in (
            ("add", lambda: time_adds(ours.add, items), lambda: time_adds(floor.add, items)),
            ("extend", lambda: time_extends(ours.extend, parts),
             lambda: time_extends(floor.extend, parts)),
            ("sample", lambda: time_samples(ours.sample, args.samples),
             lambda: time_samples(floor.sample, args.samples)),
            ("sample*", lambda: time_samples(ours.sample, args.samples),
             lambda: time_samples(take_floor.sample, args.samples)),
            (f"add x{LANES}", lambda: time_adds(ours_lanes.add, items_lanes),
             lambda: time_adds(floor_lanes.add, items_lanes)),
            ("add async", lambda: time_adds(ours_async.add, items_async),
             lambda: time_adds(floor_async.add, items_async)),
            (f"sample x{LANES}", lambda: time_samples(ours_vec.sample, args.samples),
             lambda: time_samples(take_floor.sample, args.samples)),
            (f"x{LANES} side", lambda: time_samples(ours_many.sample, args.samples),
             lambda: time_samples(take_floor.sample, args.samples)),
        ):
            o, f = best_of(fo, 1), best_of(ff, 1)
            prev = results.get(op, (float("inf"), float("inf")))
            results[op] = (min(prev[0], o), min(prev[1], f))

    print(writer_line())
    print(f"capacity={cap:,}  obs float32[{OBS}]  action float32[{ACT}]  "
          f"chunk={CHUNK}  batch={BATCH}  (best of {args.repeats})")
    print(f"{'op':<10}{'ours (us)':>12}{'floor (us)':>12}{'ratio':>8}{'target':>9}  ok")
    for op, (o, f) in results.items():
        ratio = f / o
        ok = "yes" if ratio >= TARGETS[op] else "NO"
        print(f"{op:<10}{o * 1e6:>12.2f}{f * 1e6:>12.2f}{ratio:>8.2f}{TARGETS[op]:>9.2f}  {ok}")
    print("sample*: the same sample(256) against a floor that gathers with ndarray.take")
    print(f"add x{LANES}: one step of {LANES} envs at once (num_envs={LANES}) against "
          f"[T, {LANES}, ...] arrays (not an issue target; the vector-env loop)")
    print(f"add async: add(env_ids=...) of a random half of {LANES} envs per step (async "
          "vector envs; the lanes fall out of step) against per-lane rows of the same arrays")
    print(f"sample x{LANES}: sample(256) of a {LANES}-env buffer (num_envs={LANES}, each lane "
          "its own stream, as a vector env fills it) against the take floor")
    print(f"x{LANES} side: sample(256) of the one-lane stream cut across {LANES} lanes (every "
          "step's next obs kept aside: one more row read per step) against the take floor")
    mem_ratio = grown / ideal
    print(f"{'memory':<10}{grown / 2**20:>10.1f}MB{ideal / 2**20:>10.1f}MB{mem_ratio:>8.3f}"
          f"{'<=1.10':>9}  {'yes' if mem_ratio <= 1.1 else 'NO'}")



def writer_line() -> str:
    """Which writer runs one-lane add/extend: compiled C or pure Python."""
    from replaybank.storage.writers.compiled import accelerated

    return "one-lane add/extend: " + ("compiled (replaybank._lane)" if accelerated() else
                                      "pure Python (REPLAYBANK_PURE_PYTHON=1 or not built)")


# ---- the input-kinds table -------------------------------------------------------------

KIND_TARGET, PEER_TARGET = 1.5, 2.0  # replaybank kind / exact <= 1.5; peer / replaybank >= 2
Call = tuple[Callable[..., Any], list[Any]]  # (the function timed, its per-call arguments)
Key = tuple[str, str, str]  # (library, kind, "add" | "extend")


def lib_calls(lib: str, buf: Any, steps: list[dict[str, Any]],
              parts: list[dict[str, Any]]) -> tuple[Call, Call]:
    """``lib``'s (add, extend) calls of the same step and chunk objects."""
    if lib in ("replaybank", "memmap"):
        return (buf.add, steps), (buf.extend, parts)
    if lib == "sb3":
        extend, args = sb3_chunk_adder(buf.add)
        return (buf.add, [sb3_call(d) for d in steps]), (extend, [args(p) for p in parts])
    return (buf.add, [cpprb_kw(d) for d in steps]), (buf.add, [cpprb_kw(p) for p in parts])


def try_call(call: Call, n: int) -> str | None:
    """Warm ``call`` up on its first ``n`` arguments; the error type if the library raises."""
    fn, items = call
    try:
        time_adds(fn, items[:n])
    except Exception as exc:  # a refusal is a result, shown in the table
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:90] if str(exc) else ''}"
    return None


def inputs_for(envs: int, args: argparse.Namespace, kinds: list[str], libs: list[str],
               tmp: str) -> tuple[dict[Key, float], dict[Key, str]]:
    """Best per-call seconds of every (library, kind, op) with ``envs`` envs, and refusals."""
    cap = args.capacity - args.capacity % (CHUNK * envs)
    bufs: dict[str, Any] = {}
    for lib in libs:
        if lib == "replaybank":
            bufs[lib] = filled_replaybank(cap, envs)
        elif lib == "memmap":
            bufs[lib] = filled_replaybank(cap, envs, "memmap", os.path.join(tmp, f"mm{envs}"))
        elif lib == "sb3":
            bufs[lib] = filled_sb3(cap, envs)
        else:
            bufs[lib] = filled_cpprb(cap)
    calls: dict[Key, Call] = {}
    refused: dict[Key, str] = {}
    for kind in kinds:
        steps = input_steps(kind, args.input_adds, envs)
        parts = input_chunks(kind, args.input_chunks, envs)
        for lib in libs:
            for op, call in zip(("add", "extend"), lib_calls(lib, bufs[lib], steps, parts),
                                strict=True):
                err = try_call(call, 50 if op == "add" else 2)
                if err is None:
                    calls[lib, kind, op] = call
                else:
                    refused[lib, kind, op] = err
    # the filled buffers and the inputs live to the end: keep them out of the collector's
    # scans (best_of collects before every timing; a full scan of them costs ~0.1 s)
    gc.collect()
    gc.freeze()
    best: dict[Key, float] = {}
    for _ in range(args.repeats):  # interleave the libraries (and kinds) against noise
        for kind in kinds:
            for lib in libs:
                for op in ("add", "extend"):
                    if (lib, kind, op) in calls:
                        fn, items = calls[lib, kind, op]
                        t = best_of(partial(time_adds, fn, items), 1)
                        best[lib, kind, op] = min(best.get((lib, kind, op), float("inf")), t)
    gc.unfreeze()
    del bufs, calls
    gc.collect()
    return best, refused


def _cell(t: float | None, scale: float = 1e6, width: int = 9, digits: int = 2) -> str:
    return f"{'refused' if t is None else f'{t * scale:.{digits}f}':>{width}}"


def _ratio(num: float | None, den: float | None, target: float, most: bool) -> str:
    if num is None or den is None:
        return f"{'-':>9}"
    r = num / den
    miss = r > target if most else r < target
    return f"{r:>8.2f}{'!' if miss else ' '}"


def print_inputs(envs: int, kinds: list[str], libs: list[str],
                 best: dict[Key, float], refused: dict[Key, str], repeats: int) -> None:
    """The add and extend tables of one ``envs``."""
    for op in ("add", "extend"):
        per = "us per call" if op == "add" else f"us per step (per call / {CHUNK})"
        scale = 1e6 if op == "add" else 1e6 / CHUNK
        print()
        print(f"{op}, {envs} env{'s' if envs > 1 else ''} "
              f"({per}; best of {repeats})")
        head = f"{'kind':<16}{'replaybank':>10}{'/exact':>9}"
        if op == "extend":
            head += f"{'us/call':>10}"
        if "memmap" in libs:
            head += f"{'memmap':>9}{'/exact':>9}"
        for peer in ("sb3", "cpprb"):
            if peer in libs:
                head += f"{peer:>9}{'/rb':>9}"
        print(head)
        for kind in kinds:
            ours = best.get(("replaybank", kind, op))
            line = f"{kind:<16}{_cell(ours, scale, 10)}"
            line += _ratio(ours, best.get(("replaybank", "exact", op)), KIND_TARGET, True)
            if op == "extend":
                line += _cell(ours, 1e6, 10, 1)
            if "memmap" in libs:
                mm = best.get(("memmap", kind, op))
                line += _cell(mm, scale)
                line += _ratio(mm, best.get(("memmap", "exact", op)), KIND_TARGET, True)
            for peer in ("sb3", "cpprb"):
                if peer in libs:
                    t = best.get((peer, kind, op))
                    line += _cell(t, scale) + _ratio(t, ours, PEER_TARGET, False)
            print(line)
    notes = sorted({(lib, kind, err) for (lib, kind, _), err in refused.items()})
    for lib, kind, err in notes:
        ops = "/".join(op for op in ("add", "extend") if (lib, kind, op) in refused)
        print(f"  refused: {lib} {ops} of '{kind}' with {envs} env(s): {err}")


def inputs_table(args: argparse.Namespace) -> None:
    """The second table: add/extend fed the input kinds real environments produce."""
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] if args.kinds else \
        list(INPUT_KINDS)
    bad = [k for k in kinds if k not in INPUT_KINDS]
    if bad:
        raise SystemExit(f"--kinds: unknown {bad}; choose from {', '.join(INPUT_KINDS)}")
    if "exact" not in kinds:
        kinds.insert(0, "exact")  # the base of the kind / exact ratios
    envs_list = [int(e) for e in args.envs.split(",")]
    libs = ["replaybank"] + ([] if args.no_memmap else ["memmap"])
    missing = []
    for peer, module, pip in (("sb3", "stable_baselines3", "stable-baselines3"),
                              ("cpprb", "cpprb", "cpprb")):
        if importlib.util.find_spec(module) is not None:
            libs.append(peer)
        else:
            missing.append(f"{peer} columns skipped: {module} is not installed "
                           f"(pip install {pip})")
    from importlib.metadata import version

    versions = [f"replaybank {rb.__version__} ({os.path.dirname(rb.__file__)})",
                f"numpy {np.__version__}"]
    for name, module, dist in (("sb3", "stable_baselines3", "stable-baselines3"),
                               ("cpprb", "cpprb", "cpprb"), ("torch", "torch", "torch")):
        if importlib.util.find_spec(module) is not None:
            versions.append(f"{name} {version(dist)}")
    print()
    print("input kinds: add / extend fed what environments and loops produce")
    print(writer_line())
    print("; ".join(versions))
    print(f"capacity={args.capacity:,} (rounded down to a multiple of {CHUNK} x envs)  obs "
          f"float32[{OBS}]  action float32[{ACT}] (explicit spec), reward float32, flags bool; "
          f"{args.input_adds} adds and {args.input_chunks} extends of {CHUNK} per repeat; "
          "extend's us/call: replaybank's")
    print(f"targets: replaybank kind / exact <= {KIND_TARGET}, peer / replaybank >= "
          f"{PEER_TARGET} ('!' marks a miss); memmap = replaybank storage='memmap'")
    print("sb3: add(obs, next_obs, action, reward, done, infos) with done = terminated | "
          "truncated and infos built beforehand (not timed); extend = 256 adds of obs[i]...; "
          "cpprb: add(obs, act, rew, next_obs, done=terminated); no reshaping for either")
    for line in missing:
        print(line)
    with tempfile.TemporaryDirectory(prefix="rb-bench-inputs-") as tmp:
        for envs in envs_list:
            best, refused = inputs_for(envs, args, kinds, libs, tmp)
            print_inputs(envs, kinds, libs, best, refused, args.repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--adds", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=2_000)
    parser.add_argument("--table", choices=("all", "core", "inputs"), default="all",
                        help="which table(s) to print (default: both)")
    parser.add_argument("--envs", default="1,4", help="input-kinds table: env counts (1,4)")
    parser.add_argument("--kinds", default="",
                        help=f"input-kinds table: comma-separated kinds (default: all of "
                             f"{', '.join(INPUT_KINDS)})")
    parser.add_argument("--input-adds", type=int, default=2_000,
                        help="input-kinds table: adds timed per repeat (2000)")
    parser.add_argument("--input-chunks", type=int, default=16,
                        help=f"input-kinds table: extends of {CHUNK} timed per repeat (16)")
    parser.add_argument("--no-memmap", action="store_true",
                        help="input-kinds table: no storage='memmap' columns")
    args = parser.parse_args()
    if args.table in ("all", "core"):
        core_table(args)
    if args.table in ("all", "inputs"):
        inputs_table(args)


if __name__ == "__main__":
    main()
