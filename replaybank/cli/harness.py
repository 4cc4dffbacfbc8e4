"""Benchmark harness shared by ``replaybank bench`` and the scripts in ``benchmarks/``.

Numpy only at module level (no rich, no torch): peer libraries are imported inside their
adapters, in the one process that measures them.

* :func:`make_stream`: a sequential stream of transitions (obs float32[17], action
  float32[6], 1000-step episodes alternately terminated and truncated, true final obs);
* :func:`best_of`, :func:`time_adds`, :func:`time_extends`, :func:`time_samples`,
  :func:`time_calls`: per-call CPU time of this process (``time.process_time``: other
  processes on a busy machine do not count), the best (lowest) of ``repeats``;
* :data:`ADAPTERS`: per library, a builder returning a :class:`Target` (filled to
  capacity, then ``add``/``extend``/``sample``/``per`` callables in that library's API).

Example:
    >>> s = make_stream(512, episode_len=100)
    >>> s["obs"].shape, s["action"].dtype.name, int(s["terminated"].sum())
    ((512, 17), 'float32', 3)
    >>> t = build_target("replaybank", 512, "sample")
    >>> time_samples(t.sample, 3) > 0
    True
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ACT", "ADAPTERS", "BATCH", "CASES", "CHUNK", "OBS", "Target", "best_of",
           "build_target", "make_stream", "time_adds", "time_calls", "time_extends",
           "time_samples"]

OBS, ACT, CHUNK, BATCH = 17, 6, 256, 256
CASES = ("add", "extend", "sample", "per")
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


@dataclass
class Target:
    """One library's buffer, filled, with the timed operations in its own API.

    ``add`` takes the items in ``add_items``, ``extend`` the parts in ``extend_parts``;
    ``sample(B)``; ``per()`` is one PER ``sample(256)`` + ``update_priorities``. ``None``:
    the library has no such operation (``na`` says why).
    """

    version: str
    add: Callable[..., Any] | None = None
    add_items: list[Any] = field(default_factory=list)
    extend: Callable[..., Any] | None = None
    extend_parts: list[Any] = field(default_factory=list)
    sample: Callable[[int], Any] | None = None
    per: Callable[[], Any] | None = None
    na: str = ""


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


def _replaybank(capacity: int, case: str) -> Target:
    import replaybank as rb

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
    if case == "per":
        next_td = _td_cycle()

        def per() -> None:
            b = buf.sample(BATCH, beta=0.4)
            buf.update_priorities(b.indices, next_td())

        t.per = per
    return t


def _cpprb_kw(d: dict[str, Any]) -> dict[str, Any]:
    return {"obs": d["obs"], "act": d["action"], "rew": d["reward"],
            "next_obs": d["next_obs"], "done": d["terminated"]}


def _cpprb(capacity: int, case: str) -> Target:
    from importlib.metadata import version

    import cpprb

    env = {"obs": {"shape": OBS}, "act": {"shape": ACT}, "rew": {}, "next_obs": {"shape": OBS},
           "done": {}}
    buf: Any = (cpprb.PrioritizedReplayBuffer(capacity, env, alpha=0.6, eps=1e-6)
                if case == "per" else cpprb.ReplayBuffer(capacity, env))
    stream = make_stream(capacity)
    buf.add(**_cpprb_kw(stream))
    n_add, n_chunks = _sizes(capacity)
    t = Target(version("cpprb"), add=buf.add,
               add_items=[_cpprb_kw(d) for d in single_items(stream, n_add)],
               extend=buf.add, extend_parts=[_cpprb_kw(p) for p in chunks(stream, n_chunks)],
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
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    buf: Any = ReplayBuffer(
        capacity, spaces.Box(-np.inf, np.inf, (OBS,), np.float32),
        spaces.Box(-1.0, 1.0, (ACT,), np.float32), device="cpu", n_envs=1)
    stream = make_stream(capacity)
    # fill by assignment (not timed): the arrays are [capacity, n_envs, ...]
    buf.observations[:, 0] = stream["obs"]
    buf.next_observations[:, 0] = stream["next_obs"]
    buf.actions[:, 0] = stream["action"]
    buf.rewards[:, 0] = stream["reward"]
    buf.dones[:, 0] = stream["terminated"] | stream["truncated"]
    buf.timeouts[:, 0] = stream["truncated"]
    buf.full, buf.pos = True, 0
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
    if case == "add" and target.add is not None:
        add, items = target.add, target.add_items
        fn = lambda: time_adds(add, items)  # noqa: E731
    elif case == "extend" and target.extend is not None:
        ext, parts = target.extend, target.extend_parts
        fn = lambda: time_extends(ext, parts)  # noqa: E731
    elif case == "sample" and target.sample is not None:
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
