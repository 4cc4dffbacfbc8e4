"""Benchmark harness shared by ``replaybank bench`` and the scripts in ``benchmarks/``.

Numpy only at module level (no rich, no torch): peer libraries are imported inside their
adapters, in the one process that measures them.

* :func:`make_stream`: a sequential stream of transitions (obs float32[17], action
  float32[6], 1000-step episodes alternately terminated and truncated, true final obs);
* :func:`best_of`, :func:`time_adds`, :func:`time_extends`, :func:`time_samples`,
  :func:`time_calls`: per-call CPU time of this process (``time.process_time``: other
  processes on a busy machine do not count), the best (lowest) of ``repeats``;
* :data:`ADAPTERS`: per library, a builder returning a :class:`Target` (filled to
  capacity, then ``add``/``extend``/``sample``/``per`` callables in that library's API);
* input kinds (:data:`INPUT_KINDS`, :func:`input_steps`, :func:`input_chunks`): the same
  transitions in the types real environments and training loops hand to ``add``/``extend``
  (float64 MuJoCo observations, float64 vector-env rewards, int flags, numpy and Python
  scalars, lists, torch CPU tensors, strided views), one set of Python objects fed to every
  library; :data:`INPUT_CASES` names the ones ``replaybank bench`` times
  (``add-f64``, ``add-f64x4``, ...); :func:`filled_replaybank`, :func:`filled_sb3`,
  :func:`filled_cpprb`, :func:`sb3_call`, :func:`sb3_chunk_adder` and :func:`cpprb_kw` build
  each library's filled buffer and call for them (also used by ``benchmarks/bench_core.py``);
  replaybank and SB3 are filled with :func:`fill_stream`, one sequential stream per lane;
* floors (:data:`FLOORS`, :class:`TakeFloor`, :func:`measure_floor`): the least work a case
  can do, timed beside replaybank's (``sample``: ``ndarray.take`` gathers of six numpy
  arrays; the window cases :data:`WINDOW_CASES`, ``sequences`` and ``framestack``: the
  same windows gathered with ``ndarray.take``, :mod:`replaybank.cli.bench_windows`);
  :data:`NO_FLOOR` says why ``per`` has none.

Example:
    >>> s = make_stream(512, episode_len=100)
    >>> s["obs"].shape, s["action"].dtype.name, int(s["terminated"].sum())
    ((512, 17), 'float32', 3)
    >>> t = build_target("replaybank", 512, "sample")
    >>> time_samples(t.sample, 3) > 0
    True
    >>> steps = input_steps("f64 obs+reward", 2, envs=4)
    >>> steps[0]["obs"].dtype.name, steps[0]["reward"].shape, steps[0]["terminated"].dtype.name
    ('float64', (4,), 'bool')
    >>> type(input_steps("exact", 1)[0]["reward"]).__name__
    'float'
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ACT", "ADAPTERS", "BATCH", "CASES", "CHUNK", "FLOORS", "FLOOR_TARGET",
           "INPUT_CASES", "INPUT_KINDS", "NO_FLOOR", "OBS", "SPEC", "TakeFloor", "Target",
           "best_of", "build_target", "cpprb_kw", "fill_stream", "filled_cpprb",
           "filled_replaybank", "filled_sb3", "input_chunks", "input_steps", "make_stream",
           "sb3_call", "sb3_chunk_adder", "time_adds", "time_calls", "time_extends",
           "time_samples", "WINDOW_CASES"]

OBS, ACT, CHUNK, BATCH = 17, 6, 256, 256
#: The stored fields, given explicitly (reward float32 and the flags bool by default).
SPEC = {"obs": ((OBS,), "float32"), "action": ((ACT,), "float32")}
#: Input kinds: the same transitions in the types real environments and loops produce.
INPUT_KINDS = ("exact", "f64 obs+reward", "f64 reward", "int flags", "scalars", "lists",
               "torch", "torch action", "non-contiguous")
#: ``replaybank bench`` cases that ``add`` one input kind: case -> (input kind, envs).
INPUT_CASES: dict[str, tuple[str, int]] = {
    "add-x4": ("exact", 4), "add-f64": ("f64 obs+reward", 1),
    "add-f64x4": ("f64 obs+reward", 4), "add-int-flags": ("int flags", 1),
    "add-torch": ("torch", 1)}
#: ``replaybank bench`` cases that sample windows (:mod:`replaybank.cli.bench_windows`).
WINDOW_CASES = ("sequences", "framestack")
CASES = ("add", "extend", "sample", "per", *INPUT_CASES, *WINDOW_CASES)
_clock = time.process_time

Stream = dict[str, Any]


def make_stream(n: int, episode_len: int = 1000, seed: int = 0) -> Stream:
    """A sequential stream of ``n`` steps with episode ends every ``episode_len`` steps."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n + 1, OBS)).astype(np.float32)
    nxt = obs[1:].copy()
    term = np.zeros(n, bool)
    trunc = np.zeros(n, bool)
    ends = np.arange(episode_len - 1, n, episode_len)
    term[ends[::2]] = True
    trunc[ends[1::2]] = True
    nxt[ends] = rng.standard_normal((len(ends), OBS)).astype(np.float32)  # true final obs
    return {"obs": obs[:n].copy(), "action": rng.standard_normal((n, ACT)).astype(np.float32),
            "reward": rng.standard_normal(n).astype(np.float32), "next_obs": nxt,
            "terminated": term, "truncated": trunc}


def single_items(stream: Stream, n: int) -> list[dict[str, Any]]:
    """``n`` single transitions as a gymnasium loop produces them (fresh arrays, Python
    float reward, Python bool flags)."""
    return [{"obs": stream["obs"][i].copy(), "action": stream["action"][i].copy(),
             "reward": float(stream["reward"][i]), "next_obs": stream["next_obs"][i].copy(),
             "terminated": bool(stream["terminated"][i]),
             "truncated": bool(stream["truncated"][i])} for i in range(n)]


def chunks(stream: Stream, n_chunks: int) -> list[Stream]:
    """The first ``n_chunks`` chunks of :data:`CHUNK` steps of ``stream``."""
    return [{k: v[i * CHUNK:(i + 1) * CHUNK] for k, v in stream.items()}
            for i in range(n_chunks)]


def best_of(fn: Callable[[], float], repeats: int) -> float:
    """Lowest per-op time over ``repeats`` runs of ``fn`` (which returns a per-op time)."""
    times = []
    for _ in range(repeats):
        gc.collect()
        times.append(fn())
    return min(times)


def time_adds(add: Callable[..., Any], items: list[Any]) -> float:
    """Seconds per ``add(**item)`` (items are dicts) or ``add(*item)`` (tuples)."""
    if items and isinstance(items[0], dict):
        t0 = _clock()
        for kw in items:
            add(**kw)
    else:
        t0 = _clock()
        for a in items:
            add(*a)
    return (_clock() - t0) / max(len(items), 1)


def time_extends(extend: Callable[..., Any], parts: list[Any]) -> float:
    """Seconds per ``extend`` of one chunk (see :func:`time_adds` for the call forms)."""
    return time_adds(extend, parts)


def time_samples(sample: Callable[[int], Any], n: int, batch: int = BATCH) -> float:
    """Seconds per ``sample(batch)``."""
    t0 = _clock()
    for _ in range(n):
        sample(batch)
    return (_clock() - t0) / n


def time_calls(fn: Callable[[], Any], n: int) -> float:
    """Seconds per ``fn()``."""
    t0 = _clock()
    for _ in range(n):
        fn()
    return (_clock() - t0) / n


def lane_stream(n: int, envs: int = 1, episode_len: int = 1000, seed: int = 0) -> Stream:
    """The float64 master stream of ``n`` steps of ``envs`` envs that every input kind is
    made from: ``obs``/``next_obs`` ``[n, envs, 17]`` and ``action`` ``[n, envs, 6]`` float64
    (not float32-exact, as MuJoCo gives them), ``reward`` ``[n, envs]`` float64, flags
    ``[n, envs]`` bool. Lane ``j``'s episodes end ``j * 97`` steps later than lane 0's,
    alternately terminated and truncated, with a true final ``next_obs``."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n + 1, envs, OBS))
    nxt = obs[1:].copy()
    term = np.zeros((n, envs), bool)
    trunc = np.zeros((n, envs), bool)
    for j in range(envs):
        ends = np.arange(episode_len - 1 - (j * 97) % episode_len, n, episode_len)
        term[ends[::2], j] = True
        trunc[ends[1::2], j] = True
        nxt[ends, j] = rng.standard_normal((len(ends), OBS))  # true final obs
    return {"obs": obs[:n].copy(), "action": rng.standard_normal((n, envs, ACT)),
            "reward": rng.standard_normal((n, envs)), "next_obs": nxt,
            "terminated": term, "truncated": trunc}


def _f32(a: np.ndarray) -> np.ndarray:
    return np.array(a, np.float32)  # a fresh contiguous array, as an env step returns


def _strided(a: np.ndarray) -> np.ndarray:
    """``a`` as every other column of a twice as wide float32 array (a strided view)."""
    wide = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), np.float32)
    wide[..., ::2] = a
    return wide[..., ::2]


def _column_slice(a: np.ndarray) -> np.ndarray:
    """``a`` as the first columns of a wider float32 array (rows not contiguous); a 1-d
    ``a`` (whose column slice would be contiguous) as a strided view."""
    if a.ndim == 1:
        return _strided(a)
    wide = np.zeros((*a.shape[:-1], a.shape[-1] + 2), np.float32)
    wide[..., :a.shape[-1]] = a
    return wide[..., :a.shape[-1]]


def _as_kind(kind: str, d: Stream, scalar: bool) -> dict[str, Any]:
    """One step or chunk ``d`` of :func:`lane_stream` (lane axis dropped for one env) as
    ``kind`` gives it; ``scalar``: one step of one env (reward and flags are 0-d)."""
    rew, term, trunc = d["reward"], d["terminated"], d["truncated"]
    out: dict[str, Any] = {
        "obs": _f32(d["obs"]), "action": _f32(d["action"]),
        "reward": float(np.float32(rew)) if scalar else _f32(rew),
        "next_obs": _f32(d["next_obs"]),
        "terminated": bool(term) if scalar else term.copy(),
        "truncated": bool(trunc) if scalar else trunc.copy()}
    if kind == "f64 obs+reward":  # MuJoCo: float64 observations and rewards
        out["obs"], out["next_obs"] = d["obs"].copy(), d["next_obs"].copy()
        out["reward"] = np.float64(rew) if scalar else rew.copy()
    elif kind == "f64 reward":  # gymnasium vector envs: float64 rewards
        out["reward"] = np.float64(rew) if scalar else rew.copy()
    elif kind == "int flags":  # int(done) / dones.astype(int)
        out["terminated"] = int(term) if scalar else term.astype(np.int64)
        out["truncated"] = int(trunc) if scalar else trunc.astype(np.int64)
    elif kind == "scalars":
        if scalar:  # rewards[i], terminations[i] of a vector env's arrays
            out["reward"] = np.float32(rew)
            out["terminated"], out["truncated"] = np.bool_(term), np.bool_(trunc)
        else:  # lists of Python floats and bools
            out["reward"] = _f32(rew).tolist()
            out["terminated"], out["truncated"] = term.tolist(), trunc.tolist()
    elif kind == "lists":
        out["action"] = _f32(d["action"]).tolist()
        if not scalar:
            out["reward"] = _f32(rew).tolist()
    elif kind in ("torch", "torch action"):
        import torch

        out["action"] = torch.from_numpy(out["action"])
        if kind == "torch":  # gymnasium's NumpyToTorch (the 1-env one keeps float/bool)
            out["obs"] = torch.from_numpy(out["obs"])
            out["next_obs"] = torch.from_numpy(out["next_obs"])
            if not scalar:
                out["reward"] = torch.from_numpy(out["reward"])
                out["terminated"] = torch.from_numpy(out["terminated"])
                out["truncated"] = torch.from_numpy(out["truncated"])
    elif kind == "non-contiguous":
        out["obs"], out["next_obs"] = _strided(d["obs"]), _strided(d["next_obs"])
        out["action"] = _column_slice(d["action"])
    elif kind != "exact":
        raise ValueError(f"input kind {kind!r}: unknown; choose from {', '.join(INPUT_KINDS)}")
    return out


def input_steps(kind: str, n: int, envs: int = 1, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` steps of ``envs`` envs as ``add`` keyword dicts, in input kind ``kind``.

    Values are ``[envs, *shape]`` (``[*shape]`` for one env); every step owns its objects.
    The kinds (one env / several envs where they differ):

    * ``exact``: obs, next_obs, action float32 arrays; reward float32 array / a Python
      float; flags bool arrays / Python bools (the stored dtypes; the baseline);
    * ``f64 obs+reward``: obs and next_obs float64; reward float64 array / ``np.float64``;
    * ``f64 reward``: reward float64 array / ``np.float64``;
    * ``int flags``: terminated, truncated int64 arrays / Python ints;
    * ``scalars``: reward ``np.float32`` and flags ``np.bool_`` (``rewards[i]``) / reward
      and flags as lists of Python floats and bools;
    * ``lists``: action a list of floats (lists of lists); reward a list of floats with
      several envs;
    * ``torch``: obs, next_obs, action float32 CPU tensors; reward float32 and flags bool
      tensors with several envs, a Python float and bools with one (as gymnasium's
      ``NumpyToTorch`` wrappers give them);
    * ``torch action``: only the action a float32 tensor (a torch policy);
    * ``non-contiguous``: obs, next_obs every other column of a float32 array twice as
      wide; action the first 6 columns of a float32 ``[envs, 8]`` array (one env: a
      strided view).

    All kinds carry the same values (float32-rounded where stored as float32).
    """
    s = lane_stream(n, envs, seed=seed)
    if envs == 1:
        s = {k: v[:, 0] for k, v in s.items()}
    return [_as_kind(kind, {k: v[t] for k, v in s.items()}, envs == 1) for t in range(n)]


def input_chunks(kind: str, n_chunks: int, envs: int = 1, chunk: int = CHUNK,
                 seed: int = 0) -> list[dict[str, Any]]:
    """``n_chunks`` chunks of ``chunk`` steps as ``extend`` keyword dicts in input kind
    ``kind`` (see :func:`input_steps`): values ``[chunk, envs, *shape]`` (``[chunk, *shape]``
    for one env); the ``scalars`` kind gives reward and flags as (nested) lists."""
    s = lane_stream(n_chunks * chunk, envs, seed=seed)
    if envs == 1:
        s = {k: v[:, 0] for k, v in s.items()}
    return [_as_kind(kind, {k: v[i * chunk:(i + 1) * chunk] for k, v in s.items()}, False)
            for i in range(n_chunks)]


def _either(a: Any, b: Any) -> Any:
    """``a or b`` elementwise, in the type of the flags (lists stay lists)."""
    if isinstance(a, list):
        return [_either(x, y) for x, y in zip(a, b, strict=True)]
    return a | b


def _infos(truncated: Any) -> list[dict[str, Any]]:
    return [{"TimeLimit.truncated": bool(u)} for u in np.asarray(truncated).reshape(-1)]


def sb3_call(d: dict[str, Any]) -> tuple[Any, ...]:
    """SB3 ``ReplayBuffer.add``'s positional arguments for the step ``d``: its own objects,
    plus what SB3's signature asks for beyond them, built here (not timed): ``done =
    terminated | truncated`` in the flags' own type and ``infos`` with
    ``TimeLimit.truncated`` per env."""
    return (d["obs"], d["next_obs"], d["action"], d["reward"],
            _either(d["terminated"], d["truncated"]), _infos(d["truncated"]))


def sb3_chunk_adder(add: Callable[..., Any]) -> tuple[Callable[..., Any],
                                                      Callable[[dict[str, Any]], tuple[Any, ...]]]:
    """SB3 has no ``extend``: a function adding a chunk step by step (``add(obs[i], ...)``,
    as ``BaseBuffer.extend`` would; the indexing is timed) and the converter of a chunk
    dict to its arguments (``done`` and per-step ``infos`` built beforehand)."""

    def extend(obs: Any, next_obs: Any, action: Any, reward: Any, done: Any,
               infos: list[list[dict[str, Any]]]) -> None:
        for i in range(len(infos)):
            add(obs[i], next_obs[i], action[i], reward[i], done[i], infos[i])

    def args(p: dict[str, Any]) -> tuple[Any, ...]:
        trunc = np.asarray(p["truncated"])
        return (p["obs"], p["next_obs"], p["action"], p["reward"],
                _either(p["terminated"], p["truncated"]), [_infos(u) for u in trunc])

    return extend, args


def cpprb_kw(d: dict[str, Any]) -> dict[str, Any]:
    """cpprb ``add``'s keywords for the step or chunk ``d``: the same objects (cpprb has
    no truncation: ``done`` is ``terminated``)."""
    return {"obs": d["obs"], "act": d["action"], "rew": d["reward"],
            "next_obs": d["next_obs"], "done": d["terminated"]}


def fill_stream(capacity: int, envs: int = 1) -> Stream:
    """What :func:`filled_replaybank` and :func:`filled_sb3` are filled with: ``capacity //
    envs`` steps of ``envs`` envs in the stored dtypes, every field ``[T, envs, ...]``.

    Each lane is a sequential stream of its own, as a vector env gives it: a lane's
    ``next_obs`` is its next step's ``obs`` except at an episode end (a true final obs).
    One env: :func:`make_stream`; several: :func:`lane_stream` (episodes of 1000 steps,
    staggered by 97 steps from lane to lane) cast to float32 obs/action/reward. (Not one
    stream cut across the lanes, where no lane's ``next_obs`` is its next ``obs``: replaybank
    would keep every step's next_obs aside, and every timed write would pay for evicting
    them.)
    """
    rows = capacity // envs
    if envs == 1:
        return {k: v[:, None] for k, v in make_stream(rows).items()}
    s = lane_stream(rows, envs, seed=1)
    return {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in s.items()}


def filled_replaybank(capacity: int, envs: int = 1, storage: str = "numpy",
                      path: Any = None) -> Any:
    """A replaybank ``ReplayBuffer`` (spec :data:`SPEC`, ``num_envs=envs``) filled to
    ``capacity`` (rounded down to a multiple of ``envs``) with :func:`fill_stream` (each
    lane sequential: one side obs per episode end and lane, not one per step)."""
    import replaybank as rb

    capacity -= capacity % envs
    kw: dict[str, Any] = {"storage": storage} if storage == "numpy" else \
        {"storage": storage, "path": path}
    buf = rb.ReplayBuffer(capacity, num_envs=envs, seed=0, spec=SPEC, **kw)
    stream = fill_stream(capacity, envs)
    if envs == 1:
        stream = {k: v[:, 0] for k, v in stream.items()}
    for i in range(0, len(stream["obs"]), CHUNK):
        buf.extend(**{k: v[i:i + CHUNK] for k, v in stream.items()})
    return buf


def filled_sb3(capacity: int, envs: int = 1) -> Any:
    """An SB3 ``ReplayBuffer`` (``n_envs=envs``) filled to ``capacity`` by assignment, with
    the data of :func:`filled_replaybank` (:func:`fill_stream`)."""
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    buf: Any = ReplayBuffer(
        capacity, spaces.Box(-np.inf, np.inf, (OBS,), np.float32),
        spaces.Box(-1.0, 1.0, (ACT,), np.float32), device="cpu", n_envs=envs)
    s = fill_stream(buf.buffer_size * envs, envs)  # arrays are [T, n_envs, ...]
    buf.observations[:] = s["obs"]
    buf.next_observations[:] = s["next_obs"]
    buf.actions[:] = s["action"]
    buf.rewards[:] = s["reward"]
    buf.dones[:] = s["terminated"] | s["truncated"]
    buf.timeouts[:] = s["truncated"]
    buf.full, buf.pos = True, 0
    return buf


def filled_cpprb(capacity: int) -> Any:
    """A cpprb ``ReplayBuffer`` filled to ``capacity``."""
    import cpprb

    env = {"obs": {"shape": OBS}, "act": {"shape": ACT}, "rew": {}, "next_obs": {"shape": OBS},
           "done": {}}
    buf = cpprb.ReplayBuffer(capacity, env)
    buf.add(**cpprb_kw(make_stream(capacity)))
    return buf


#: The floor of each case that has one (what ``replaybank bench`` prints beside it), and why
#: the others have none. A floor runs in replaybank's worker, interleaved with its case.
FLOORS: dict[str, str] = {
    "sample": "the same batch gathered with ndarray.take from six preallocated numpy arrays "
              "(obs, action, reward, next_obs, terminated, truncated), indices from "
              "rng.integers: the memory-latency floor of a random row gather",
    "sequences": "16 windows at rng.integers (lane, start) pairs gathered with ndarray.take "
                 "from flat copies of the stored fields: the 65 obs rows (obs and next_obs "
                 "as views) and 64 rows of the others; no episode logic, masks or final "
                 "observations",
    "framestack": "32 five-frame windows at rng.integers indices gathered with "
                  "ndarray.take from a copy of the frames (obs and next stacks as views), "
                  "and the other fields; no episode-start padding",
}
NO_FLOOR: dict[str, str] = {
    "per": "beyond the sample floor's gather, a PER call is a sum tree's stratified draw "
           "and its priority update (about log2(capacity) levels per item, IS weights): "
           "work with no implementation-free lower bound, so a gather-only floor would time "
           "the tree, not replaybank's overhead; benchmarks/bench_per.py compares it with "
           "cpprb and a numpy sum tree",
}
#: replaybank / floor at most this much is the target.
FLOOR_TARGET = 1.1


class TakeFloor:
    """The floor of ``sample(B)``: six preallocated numpy arrays (the fields of
    :func:`make_stream`), gathered with ``ndarray.take`` at ``rng.integers`` indices.

    Example:
        >>> f = TakeFloor(make_stream(1024))
        >>> b = f.sample(256)
        >>> b["obs"].shape, b["next_obs"].dtype.name, b["truncated"].shape
        ((256, 17), 'float32', (256,))
    """

    def __init__(self, stream: Stream, seed: int = 0) -> None:
        self.fields = {k: np.ascontiguousarray(v) for k, v in stream.items()}  # [N, ...]
        self.size = len(self.fields["obs"])
        self.rng = np.random.default_rng(seed)

    def sample(self, batch: int) -> dict[str, np.ndarray]:
        """``batch`` random rows of every field (``[batch, *shape]``) and their indices."""
        idx = self.rng.integers(0, self.size, size=batch)
        out = {k: v.take(idx, axis=0) for k, v in self.fields.items()}
        out["indices"] = idx
        return out


@dataclass
class Target:
    """One library's buffer, filled, with the timed operations in its own API.

    ``add`` takes the items in ``add_items``, ``extend`` the parts in ``extend_parts``;
    ``sample(B)``; ``per()`` is one PER ``sample(256)`` + ``update_priorities``. ``None``:
    the library has no such operation (``na`` says why). ``floor(B)``: the least work that
    ``sample(B)`` can do (:class:`TakeFloor`; set on replaybank's targets of the cases in
    :data:`FLOORS` only). For a window case, ``sample`` draws its batch (``B`` ignored).
    """

    version: str
    add: Callable[..., Any] | None = None
    add_items: list[Any] = field(default_factory=list)
    extend: Callable[..., Any] | None = None
    extend_parts: list[Any] = field(default_factory=list)
    sample: Callable[[int], Any] | None = None
    per: Callable[[], Any] | None = None
    na: str = ""
    floor: Callable[[int], Any] | None = None


def _sizes(capacity: int) -> tuple[int, int]:
    """Adds and extend chunks timed per repeat at ``capacity``."""
    return min(capacity, 10_000), max(1, min(capacity // CHUNK, 200))


def _td_cycle() -> Callable[[], np.ndarray]:
    td = np.random.default_rng(1).random((64, BATCH)) * 2.0
    step = [0]

    def next_td() -> np.ndarray:
        step[0] += 1
        row: np.ndarray = td[step[0] % 64]
        return row

    return next_td


def _inputs(library: str, capacity: int, case: str) -> Target:
    """``library``'s buffer, filled, whose ``add`` takes :data:`INPUT_CASES`'s ``case``
    steps (the same objects for every library, converted to its call form only)."""
    from importlib.metadata import version

    kind, envs = INPUT_CASES[case]
    steps = input_steps(kind, _sizes(capacity)[0], envs)
    buf: Any
    if library == "replaybank":
        import replaybank as rb

        buf = filled_replaybank(capacity, envs)
        return Target(rb.__version__, add=buf.add, add_items=steps)
    if library == "sb3":
        buf = filled_sb3(capacity, envs)
        return Target(version("stable-baselines3"), add=buf.add,
                      add_items=[sb3_call(d) for d in steps])
    if library == "cpprb":
        buf = filled_cpprb(capacity)
        return Target(version("cpprb"), add=buf.add, add_items=[cpprb_kw(d) for d in steps])
    return Target(version(library), na=f"input-kind cases are not wired for {library}")


def _windows(capacity: int, case: str) -> Target:
    """replaybank's target of a :data:`WINDOW_CASES` case: its sample call and its floor
    (:mod:`replaybank.cli.bench_windows`; the frame-stack buffer holds a fifth of
    ``capacity`` frames)."""
    import replaybank as rb
    from replaybank.cli import bench_windows as bw

    if case == "sequences":
        buf = bw.sequence_buffer(capacity)
        return Target(rb.__version__, sample=bw.sequence_sample(buf),
                      floor=bw.sequence_floor(buf))
    buf = bw.framestack_buffer(max(capacity // 5, 1_024))
    return Target(rb.__version__, sample=bw.framestack_sample(buf),
                  floor=bw.framestack_floor(buf))


#: Why each peer has no window case: (library, case) -> reason.
_NO_WINDOWS = {
    ("cpprb", "sequences"): "cpprb has no sequence-window sampler",
    ("cpprb", "framestack"): "cpprb's stack_compress is not wired here",
    ("sb3", "sequences"): "stable-baselines3 has no sequence-window sampler",
    ("sb3", "framestack"): "stable-baselines3 stacks frames in the env (VecFrameStack) and "
                           "stores whole stacks: no frame-stack sampler",
    ("tianshou", "sequences"): "tianshou has no sequence-window sampler",
    ("tianshou", "framestack"): "tianshou's stack_num is not wired here "
                                "(benchmarks/bench_framestack.py times it)",
    ("torchrl", "sequences"): "torchrl's SliceSampler is not wired here",
    ("torchrl", "framestack"): "torchrl's CatFrames is not wired here",
}


def _replaybank(capacity: int, case: str) -> Target:
    import replaybank as rb

    if case in INPUT_CASES:
        return _inputs("replaybank", capacity, case)
    if case in WINDOW_CASES:
        return _windows(capacity, case)
    stream = make_stream(capacity)
    if case == "per":
        buf: Any = rb.PrioritizedReplayBuffer(capacity, alpha=0.6, beta=0.4, seed=0)
    else:
        buf = rb.ReplayBuffer(capacity=capacity, seed=0)
    for part in chunks(stream, capacity // CHUNK):
        buf.extend(**part)
    n_add, n_chunks = _sizes(capacity)
    t = Target(rb.__version__, add=buf.add, add_items=single_items(stream, n_add),
               extend=buf.extend, extend_parts=chunks(stream, n_chunks), sample=buf.sample)
    if case in FLOORS:
        t.floor = TakeFloor(stream).sample
    if case == "per":
        next_td = _td_cycle()

        def per() -> None:
            b = buf.sample(BATCH, beta=0.4)
            buf.update_priorities(b.indices, next_td())

        t.per = per
    return t


def _cpprb(capacity: int, case: str) -> Target:
    from importlib.metadata import version

    import cpprb

    if case in INPUT_CASES:
        return _inputs("cpprb", capacity, case)
    if case in WINDOW_CASES:
        return Target(version("cpprb"), na=_NO_WINDOWS["cpprb", case])
    env = {"obs": {"shape": OBS}, "act": {"shape": ACT}, "rew": {}, "next_obs": {"shape": OBS},
           "done": {}}
    buf: Any = (cpprb.PrioritizedReplayBuffer(capacity, env, alpha=0.6, eps=1e-6)
                if case == "per" else cpprb.ReplayBuffer(capacity, env))
    stream = make_stream(capacity)
    buf.add(**cpprb_kw(stream))
    n_add, n_chunks = _sizes(capacity)
    t = Target(version("cpprb"), add=buf.add,
               add_items=[cpprb_kw(d) for d in single_items(stream, n_add)],
               extend=buf.add, extend_parts=[cpprb_kw(p) for p in chunks(stream, n_chunks)],
               sample=buf.sample)
    if case == "per":
        next_td = _td_cycle()

        def per() -> None:
            b = buf.sample(BATCH, beta=0.4)
            buf.update_priorities(b["indexes"], next_td())

        t.per = per
    return t


def _sb3(capacity: int, case: str) -> Target:
    import stable_baselines3

    if case in INPUT_CASES:
        return _inputs("sb3", capacity, case)
    if case in WINDOW_CASES:
        return Target(stable_baselines3.__version__, na=_NO_WINDOWS["sb3", case])
    buf = filled_sb3(capacity)  # by assignment (not timed): arrays are [capacity, 1, ...]
    stream = make_stream(capacity)
    n_add, n_chunks = _sizes(capacity)

    def sb3_args(d: dict[str, Any]) -> tuple[Any, ...]:
        done = np.asarray([bool(d["terminated"]) or bool(d["truncated"])])
        return (d["obs"][None], d["next_obs"][None], d["action"][None],
                np.asarray([d["reward"]], np.float32), done,
                [{"TimeLimit.truncated": bool(d["truncated"])}])

    def extend(obs: Any, next_obs: Any, action: Any, reward: Any, done: Any,
               infos: list[dict[str, Any]]) -> None:
        for i in range(len(obs)):  # SB3's BaseBuffer.extend: one add per step
            buf.add(obs[i:i + 1], next_obs[i:i + 1], action[i:i + 1], reward[i:i + 1],
                    done[i:i + 1], infos[i:i + 1])

    parts = [(p["obs"], p["next_obs"], p["action"], p["reward"],
              p["terminated"] | p["truncated"],
              [{"TimeLimit.truncated": bool(x)} for x in p["truncated"]])
             for p in chunks(stream, n_chunks)]
    return Target(stable_baselines3.__version__, add=buf.add,
                  add_items=[sb3_args(d) for d in single_items(stream, n_add)],
                  extend=extend, extend_parts=parts, sample=buf.sample,
                  na="no prioritized replay in stable-baselines3")


def _tianshou(capacity: int, case: str) -> Target:  # pragma: no cover - not installed in CI
    from importlib import import_module
    from importlib.metadata import version

    if case in INPUT_CASES:
        return _inputs("tianshou", capacity, case)
    if case in WINDOW_CASES:
        return Target(version("tianshou"), na=_NO_WINDOWS["tianshou", case])
    data = import_module("tianshou.data")  # untyped, optional: imported by name
    Batch, PrioritizedReplayBuffer, ReplayBuffer = (  # noqa: N806
        data.Batch, data.PrioritizedReplayBuffer, data.ReplayBuffer)

    buf: Any = (PrioritizedReplayBuffer(capacity, alpha=0.6, beta=0.4) if case == "per"
                else ReplayBuffer(capacity))
    stream = make_stream(capacity)

    def batch(d: dict[str, Any]) -> Any:
        return Batch(obs=d["obs"], act=d["action"], rew=d["reward"], obs_next=d["next_obs"],
                     terminated=d["terminated"], truncated=d["truncated"])

    for p in chunks(stream, capacity // CHUNK):
        for i in range(CHUNK):
            buf.add(batch({k: v[i] for k, v in p.items()}))
    n_add, n_chunks = _sizes(capacity)

    def extend(b: Any) -> None:
        for i in range(len(b)):
            buf.add(b[i])

    t = Target(version("tianshou"), add=buf.add,
               add_items=[(batch(d),) for d in single_items(stream, n_add)],
               extend=extend, extend_parts=[(batch(p),) for p in chunks(stream, n_chunks)],
               sample=buf.sample)
    if case == "per":
        next_td = _td_cycle()

        def per() -> None:
            _, idx = buf.sample(BATCH)
            buf.update_weight(idx, next_td())

        t.per = per
    return t


def _torchrl(capacity: int, case: str) -> Target:  # pragma: no cover - not installed in CI
    from importlib import import_module
    from importlib.metadata import version

    import torch

    if case in INPUT_CASES:
        return _inputs("torchrl", capacity, case)
    if case in WINDOW_CASES:
        return Target(version("torchrl"), na=_NO_WINDOWS["torchrl", case])
    TensorDict = import_module("tensordict").TensorDict  # noqa: N806  (optional, untyped)
    data = import_module("torchrl.data")
    LazyTensorStorage, PrioritizedReplayBuffer, ReplayBuffer = (  # noqa: N806
        data.LazyTensorStorage, data.PrioritizedReplayBuffer, data.ReplayBuffer)

    storage = LazyTensorStorage(capacity)
    buf: Any = (PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=storage, batch_size=BATCH)
                if case == "per" else ReplayBuffer(storage=storage, batch_size=BATCH))
    stream = make_stream(capacity)

    def td(d: dict[str, Any], bs: tuple[int, ...]) -> Any:
        return TensorDict({k: torch.as_tensor(np.asarray(v)) for k, v in d.items()},
                          batch_size=bs)

    buf.extend(td(stream, (capacity,)))
    n_add, n_chunks = _sizes(capacity)
    t = Target(version("torchrl"), add=buf.add,
               add_items=[(td(d, ()),) for d in single_items(stream, n_add)],
               extend=buf.extend,
               extend_parts=[(td(p, (CHUNK,)),) for p in chunks(stream, n_chunks)],
               sample=buf.sample)
    if case == "per":
        next_td = _td_cycle()

        def per() -> None:
            b = buf.sample(BATCH)
            buf.update_priority(b["index"], torch.as_tensor(next_td()))

        t.per = per
    return t


ADAPTERS: dict[str, Callable[[int, str], Target]] = {
    "replaybank": _replaybank, "cpprb": _cpprb, "sb3": _sb3, "tianshou": _tianshou,
    "torchrl": _torchrl}


def build_target(library: str, capacity: int, case: str) -> Target:
    """``library``'s buffer of ``capacity`` transitions, filled, ready for ``case``."""
    return ADAPTERS[library](capacity, case)


def measure(target: Target, case: str, repeats: int, calls: int = 500) -> list[float] | None:
    """Seconds per call of ``case`` on ``target`` for each of ``repeats`` repeats (after one
    warm-up), or ``None`` when the library has no such operation."""
    fn: Callable[[], float]
    if (case == "add" or case in INPUT_CASES) and target.add is not None:
        add, items = target.add, target.add_items
        fn = lambda: time_adds(add, items)  # noqa: E731
    elif case == "extend" and target.extend is not None:
        ext, parts = target.extend, target.extend_parts
        fn = lambda: time_extends(ext, parts)  # noqa: E731
    elif (case == "sample" or case in WINDOW_CASES) and target.sample is not None:
        sample = target.sample
        fn = lambda: time_samples(sample, calls)  # noqa: E731
    elif case == "per" and target.per is not None:
        per = target.per
        fn = lambda: time_calls(per, calls)  # noqa: E731
    else:
        return None
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        gc.collect()
        out.append(fn())
    return out


def measure_floor(target: Target, case: str, repeats: int,
                  calls: int = 500) -> tuple[list[float], list[float]] | None:
    """Seconds per call of ``case`` on ``target`` and of its floor (:data:`FLOORS`), each
    repeat timing one then the other (interleaved against noise, after one warm-up each),
    or ``None`` when ``case`` has no floor or ``target`` none for it."""
    if case not in FLOORS or target.sample is None or target.floor is None:
        return None
    sample, floor = target.sample, target.floor
    ours: list[float] = []
    low: list[float] = []
    time_samples(sample, calls)  # warm-up
    time_samples(floor, calls)
    for _ in range(repeats):
        for fn, out in ((sample, ours), (floor, low)):
            gc.collect()
            out.append(time_samples(fn, calls))
    return ours, low
