"""The Python writer's one-step add (``StepWriter``, the no-compiler ``add``) must leave a
buffer exactly as the reference writer does.

Oracle: a twin buffer built and filled under ``REPLAYBANK_WRITER=reference`` (every call
through the Python boundary and ``reference.write``). The buffer under test runs with the
compiled writer switched off (as where no compiler exists), so its ``add`` takes
``StepWriter`` where it serves the call and the Python boundary otherwise. After every
call the whole state (data, links, side store, free-slot order, counters) and the
sampler's state must match byte for byte; a call one of them refuses, the other refuses
with the same error type and message, and neither changes.
"""

from __future__ import annotations

import copy
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.storage.table import StepTable
from replaybank.storage.writers.compiled import CompiledWriter
from replaybank.storage.writers.reference import StepWriter
from tests.twins import same_sampler, same_state, under_writer

torch = pytest.importorskip("torch")


@contextmanager
def no_compiler() -> Iterator[None]:
    """Run the block as where no C compiler built ``replaybank._lane``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CompiledWriter, "of", classmethod(lambda cls, table, guard=None: None))
        mp.setenv("REPLAYBANK_WRITER", "auto")
        yield


def _call(buf: rb.ReplayBuffer, op: str, kw: dict[str, Any]) -> tuple[str, str] | None:
    try:
        getattr(buf, op)(**kw)
    except Exception as exc:  # compared between the twins
        return type(exc).__name__, str(exc)
    return None


class Pair:
    """The buffer under test (no compiler) and its reference twin."""

    def __init__(self, make: Callable[[], rb.ReplayBuffer]) -> None:
        with no_compiler():
            self.fast = make()
        with under_writer("reference"):
            self.ref = make()
        self.steps = 0  # adds that StepWriter took

    def do(self, op: str, kw: dict[str, Any]) -> tuple[str, str] | None:
        before = self.fast.state_dict() if self.fast.spec is not None else None
        with no_compiler():
            written = _written(self.fast)
            got = _call(self.fast, op, kw)
            w = self.fast.write_route.writer
            if got is None and op == "add" and w is not None \
                    and isinstance(getattr(w.fast, "__self__", None), StepWriter) \
                    and _written(self.fast) != written:
                self.steps += 1
        with under_writer("reference"):
            want = _call(self.ref, op, kw)
        assert got == want
        if got is not None and before is not None:  # refused: nothing changed
            after = self.fast.state_dict()
            for k, v in before["table"].items():
                assert np.asarray(v).tobytes() == np.asarray(after["table"][k]).tobytes(), k
        if self.fast.spec is not None:
            same_state(self.fast, self.ref)
            same_sampler(self.fast, self.ref)
            start, ref_start = self.fast.table.start, self.ref.table.start  # files only
            assert (start is None) == (ref_start is None)
            if start is not None:
                assert start.tolist() == ref_start.tolist()
        return got


@contextmanager
def storage_of(kind: str) -> Iterator[Callable[[], dict[str, Any]]]:
    """Buffer keywords for ``kind`` storage: each call a new directory for memmap (the
    no-compiler writer stores into files in the crash-safe order)."""
    if kind == "numpy":
        yield dict
        return
    with tempfile.TemporaryDirectory() as d:
        count = iter(range(1 << 30))
        yield lambda: {"storage": "memmap", "path": f"{d}/{next(count)}"}


def _pair(where: Callable[[], dict[str, Any]], spec: dict[str, Any], lanes: int, rows: int,
          prioritized: bool) -> Pair:
    """Twin buffers of ``rows`` steps per lane, PER or uniform, stored as ``where`` says."""
    def make() -> rb.ReplayBuffer:
        sampler = rb.PrioritizedSampler(alpha=0.6) if prioritized else None
        return rb.ReplayBuffer(capacity=rows * lanes, num_envs=lanes, seed=0, spec=spec,
                               sampler=sampler, **where())

    return Pair(make)


def _written(buf: rb.ReplayBuffer) -> int:
    return -1 if buf.spec is None else int(buf.table.written.sum())


SPEC = {"obs": ((3,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
        "terminated": ((), "bool"), "truncated": ((), "bool"), "h": ((2,), "float32")}
#: Input kinds of a step (one lane: ``[*shape]`` values, several: ``[lanes, *shape]``).
KINDS = ("exact", "f64", "scalars", "numpy scalars", "int flags", "lists", "flag lists",
         "odd flag lists", "torch", "non-contiguous", "lane dim", "bad nan action",
         "bad flag", "bad complex flags", "bad shape", "bad string", "missing", "unknown",
         "big int")
#: Values equal to False that a flag list may hold: the Python boundary stores the first
#: four as False; a complex zero it refuses.
_FALSY = (0, 0.0, np.False_, np.int64(0))


def _step(rng: np.random.Generator, kind: str, lanes: int, obs: np.ndarray,
          end: np.ndarray) -> dict[str, Any]:
    """One add's keywords in input kind ``kind``; ``obs``: ``[lanes, 3]`` (the lanes'
    current obs), ``end``: ``[2, lanes]`` terminated/truncated."""
    nxt = rng.standard_normal((lanes, 3)).astype(np.float32)
    if rng.random() < 0.5:  # -0.0 / NaN observations: bitwise continuity
        nxt[:, 0] = rng.choice([0.0, -0.0, np.nan, 1.0])
    kw: dict[str, Any] = {"obs": obs.copy(), "action": rng.integers(0, 5, lanes),
                          "reward": rng.standard_normal(lanes).astype(np.float32),
                          "next_obs": nxt, "terminated": end[0].copy(),
                          "truncated": end[1].copy(),
                          "h": rng.standard_normal((lanes, 2)).astype(np.float32)}
    one = lanes == 1
    if one:
        kw = {k: v[0] for k, v in kw.items()}
        if kind in ("exact", "scalars"):
            kw["reward"] = float(kw["reward"])
            kw["terminated"], kw["truncated"] = bool(end[0, 0]), bool(end[1, 0])
            kw["action"] = int(kw["action"])
    if kind == "f64":
        for k in ("obs", "next_obs", "reward", "h"):
            kw[k] = np.asarray(kw[k], np.float64) if not one or k != "reward" \
                else np.float64(kw[k])
    elif kind == "numpy scalars" and one:
        kw["reward"] = np.float32(kw["reward"])
        kw["terminated"], kw["truncated"] = np.bool_(end[0, 0]), np.bool_(end[1, 0])
        kw["action"] = np.int64(kw["action"])
    elif kind == "int flags":
        kw["terminated"] = int(end[0, 0]) if one else end[0].astype(np.int64)
        kw["truncated"] = int(end[1, 0]) if one else end[1].astype(np.int64)
    elif kind == "lists":
        kw["h"] = np.asarray(kw["h"]).tolist()
        kw["reward"] = np.asarray(kw["reward"]).tolist()
        kw["action"] = np.asarray(kw["action"]).tolist()
    elif kind == "torch":
        for k in ("obs", "next_obs", "h"):
            kw[k] = torch.from_numpy(np.array(kw[k]))
    elif kind == "non-contiguous":
        for k in ("obs", "next_obs"):
            wide = np.zeros((*np.shape(kw[k])[:-1], 6), np.float32)
            wide[..., ::2] = kw[k]
            kw[k] = wide[..., ::2]
    elif kind == "lane dim" and one:
        kw = {k: np.asarray(v)[None] for k, v in kw.items()}
        kw["reward"] = kw["reward"].astype(np.float32)
    elif kind == "bad nan action":
        kw["action"] = np.full(np.shape(kw["action"]), np.nan) if not one else float("nan")
    elif kind == "bad flag":
        kw["terminated"] = 2 if one else np.full(lanes, 2)
    elif kind == "bad shape":
        kw["obs"] = np.zeros((*np.shape(kw["obs"])[:-1], 4), np.float32)
    elif kind in ("flag lists", "odd flag lists", "bad complex flags") and not one:
        # lists of Python bools (a loop that keeps its flags in lists); "odd": each False
        # may be another value equal to it (stored as False too); "bad": a complex zero
        for k, row in (("terminated", end[0]), ("truncated", end[1])):
            flags: list[Any] = [bool(x) for x in row]
            if kind != "flag lists":
                at = int(rng.integers(lanes))
                if not flags[at]:
                    flags[at] = 0j if kind == "bad complex flags" \
                        else _FALSY[int(rng.integers(len(_FALSY)))]
            kw[k] = flags
    elif kind == "bad string":
        kw["reward"] = "x" if one else ["x"] * lanes
    elif kind == "missing":
        del kw["h"]
    elif kind == "unknown":
        kw["g"] = kw["h"]
    elif kind == "big int" and one:
        kw["action"] = 2**63
    return kw


@pytest.mark.parametrize("storage", ["numpy", "memmap"])
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), lanes=st.sampled_from([1, 3]),
       rows=st.sampled_from([2, 5, 9]), prioritized=st.booleans(),
       kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=4))
def test_one_step_add_matches_reference(storage: str, seed: int, lanes: int, rows: int,
                                        prioritized: bool, kinds: list[str]) -> None:
    """Random sequences of adds of every input kind, with wraps, episode ends, breaks in
    the data, env_ids (gaps: lanes out of step), priorities, extends and clears; in
    memory and in memmap files (there also ``start``, the crash-safe counter)."""
    with storage_of(storage) as where:
        _one_step_adds(where, seed, lanes, rows, prioritized, kinds)


def _one_step_adds(where: Callable[[], dict[str, Any]], seed: int, lanes: int, rows: int,
                   prioritized: bool, kinds: list[str]) -> None:
    rng = np.random.default_rng(seed)
    pair = _pair(where, SPEC, lanes, rows, prioritized)
    obs = rng.standard_normal((lanes, 3)).astype(np.float32)
    saved: dict[str, Any] | None = None
    for _ in range(40):
        end = rng.random((2, lanes)) < 0.15
        kind = kinds[int(rng.integers(len(kinds)))]
        kw = _step(rng, kind, lanes, obs, end)
        u = rng.random()
        if u > 0.96 and pair.fast.spec is not None:
            # a state to go back to: a load moves the table back without a write
            saved = copy.deepcopy(pair.fast.state_dict())
        elif u > 0.92 and saved is not None:
            assert pair.do("load_state_dict", {"state_dict": saved}) is None
            continue
        elif u > 0.88:  # an extend between the adds (the Python boundary writes it)
            steps = [_step(rng, "exact", lanes, obs, np.zeros((2, lanes), bool))
                     for _ in range(2)]
            assert pair.do("extend", {k: np.stack([np.asarray(s[k]) for s in steps])
                                      for k in steps[0]}) is None
            continue
        if u < 0.08 and lanes > 1:  # some lanes only: they get out of step
            ids = sorted(rng.choice(lanes, int(rng.integers(1, lanes)), replace=False))
            kw = {k: (np.asarray(v)[ids] if k in ("obs", "next_obs", "h", "action", "reward",
                                                    "terminated", "truncated") else v)
                  for k, v in _step(rng, "exact", lanes, obs, end).items()}
            kw["env_ids"] = [int(i) for i in ids]
        elif u < 0.12:
            pair.do("clear", {})
            continue
        elif u < 0.2 and prioritized:
            kw["priority"] = rng.random(lanes) + 0.1 if lanes > 1 else float(rng.random())
        if pair.do("add", kw) is None and "env_ids" not in kw:
            # each lane continues from its next obs unless its episode ended or it breaks
            fresh = rng.standard_normal((lanes, 3)).astype(np.float32)
            cont = np.asarray(kw["next_obs"], np.float32).reshape(lanes, 3)
            jump = end.any(axis=0) | (rng.random(lanes) < 0.05)
            obs = np.where(jump[:, None], fresh, cont)
    assert pair.steps > 0 or all(k.startswith("bad") or k in ("missing", "unknown", "big int")
                                 for k in kinds)


@pytest.mark.parametrize("storage", ["numpy", "memmap"])
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), lanes=st.sampled_from([2, 9]),
       rows=st.sampled_from([1, 2, 8]), shape=st.sampled_from([(3,), (2, 2)]),
       extra=st.booleans(), jumps=st.sampled_from([0.05, 1.0]),
       kinds=st.lists(st.sampled_from(["exact", "f64", "int flags", "int32 flags",
                                       "float flags", "non-contiguous"]),
                      min_size=1, max_size=3))
def test_step_writer_layouts_match_reference(storage: str, seed: int, lanes: int, rows: int,
                                             shape: tuple[int, ...], extra: bool,
                                             jumps: float, kinds: list[str]) -> None:
    """Several lanes in the table layouts StepWriter writes differently: more lanes than
    it writes a row at a time, one row (every add evicts), multi-dim obs (no void-row
    put), no extra field, float64 next obs (cast before the put), uncast 0/1 flags; with
    wraps, episode ends, frequent breaks (the side store grows), env_ids and clears; in
    memory and in memmap files."""
    with storage_of(storage) as where:
        _layouts(where, seed, lanes, rows, shape, extra, jumps, kinds)


def _layouts(where: Callable[[], dict[str, Any]], seed: int, lanes: int, rows: int,
             shape: tuple[int, ...], extra: bool, jumps: float, kinds: list[str]) -> None:
    rng = np.random.default_rng(seed)
    spec: dict[str, Any] = {"obs": (shape, "float32"), "action": ((), "int64"),
                            "reward": ((), "float32"), "terminated": ((), "bool"),
                            "truncated": ((), "bool")}
    if extra:
        spec["h"] = ((2,), "float32")
    pair = Pair(lambda: rb.ReplayBuffer(capacity=rows * lanes, num_envs=lanes, seed=0,
                                        spec=spec, **where()))
    obs = rng.standard_normal((lanes, *shape)).astype(np.float32)
    for _ in range(60):
        end = rng.random((2, lanes)) < 0.15
        nxt = rng.standard_normal((lanes, *shape)).astype(np.float32)
        kw: dict[str, Any] = {"obs": obs.copy(), "action": rng.integers(0, 5, lanes),
                              "reward": rng.standard_normal(lanes).astype(np.float32),
                              "next_obs": nxt, "terminated": end[0].copy(),
                              "truncated": end[1].copy()}
        if extra:
            kw["h"] = rng.standard_normal((lanes, 2)).astype(np.float32)
        kind = kinds[int(rng.integers(len(kinds)))]
        if kind == "f64":
            kw["obs"], kw["next_obs"] = obs.astype(np.float64), nxt.astype(np.float64)
            kw["reward"] = kw["reward"].astype(np.float64)
        elif kind in ("int flags", "int32 flags", "float flags"):
            dt = {"int flags": np.int64, "int32 flags": np.int32}.get(kind, np.float64)
            kw["terminated"], kw["truncated"] = end[0].astype(dt), end[1].astype(dt)
        elif kind == "non-contiguous":
            for k in ("obs", "next_obs"):
                wide = np.zeros((lanes, *shape[:-1], 2 * shape[-1]), np.float32)
                wide[..., ::2] = kw[k]
                kw[k] = wide[..., ::2]
        u = rng.random()
        if u < 0.08:  # some lanes only: they get out of step
            ids = sorted(rng.choice(lanes, int(rng.integers(1, lanes)), replace=False))
            kw = {k: np.asarray(v)[ids] for k, v in kw.items()}
            kw["env_ids"] = [int(i) for i in ids]
        elif u < 0.1:
            pair.do("clear", {})
            continue
        if pair.do("add", kw) is None and "env_ids" not in kw:
            jump = end.any(axis=0) | (rng.random(lanes) < jumps)
            fresh = rng.standard_normal((lanes, *shape)).astype(np.float32)
            obs = np.where(jump.reshape(lanes, *[1] * len(shape)), fresh, nxt)
    assert pair.steps > 0


def test_step_writer_takes_the_common_adds() -> None:
    """Exact, float64, scalar, flag, list, torch and strided inputs all take StepWriter."""
    rng = np.random.default_rng(1)
    for lanes in (1, 4):
        pair = Pair(lambda lanes=lanes: rb.ReplayBuffer(8 * lanes, num_envs=lanes, seed=0,
                                                         spec=SPEC))
        obs = rng.standard_normal((lanes, 3)).astype(np.float32)
        good = [k for k in KINDS if not k.startswith("bad") and k not in
                ("missing", "unknown", "big int")]
        for kind in good * 4:
            end = rng.random((2, lanes)) < 0.2
            kw = _step(rng, kind, lanes, obs, end)
            assert pair.do("add", kw) is None
            obs = np.asarray(kw["next_obs"], np.float32).reshape(lanes, 3)
        assert pair.steps == len(good) * 4


@pytest.mark.parametrize("dtype", ["int64", "float32"])
def test_scalar_obs_of_one_env(dtype: str) -> None:
    """A scalar obs field of one env given as Python numbers: the continuity check
    compares its bytes as stored (a Python int once reached it and raised)."""
    spec = {"obs": ((), dtype), "action": ((), "int64"), "reward": ((), "float32"),
            "terminated": ((), "bool"), "truncated": ((), "bool")}
    pair = Pair(lambda: rb.ReplayBuffer(4, seed=0, spec=spec))
    for i in range(10):
        obs = i if dtype == "int64" else i + 0.5
        kw: dict[str, Any] = {"obs": obs, "action": 1, "reward": 0.0,
                              "next_obs": obs + 1 if i != 5 else 0, "terminated": i == 7,
                              "truncated": False}
        assert pair.do("add", kw) is None
    assert pair.steps == 10
    # with the lane dim ([1] each): the Python boundary takes them (the writer once
    # stored some and raised, its side slots leaked)
    for i in range(3):
        kw = {"obs": np.array([i], dtype), "action": np.array([1]),
              "reward": np.array([0.0], np.float32), "next_obs": np.array([i + 1], dtype),
              "terminated": np.array([False]), "truncated": np.array([False])}
        assert pair.do("add", kw) is None
    assert len(pair.fast) == 4


def test_step_writer_declines_untouched() -> None:
    """A call StepWriter does not take returns 0 and stores nothing."""
    spec = rb.Spec.coerce({"obs": ((2,), "float32"), "action": ((), "int64"),
                           "reward": ((), "float32"), "terminated": ((), "bool"),
                           "truncated": ((), "bool")})
    t = StepTable(spec, T=4, lanes=2, obs_fields=["obs"])
    w = StepWriter(t)
    z = np.zeros((2, 2), np.float32)
    f = np.zeros(2, bool)
    assert w.serves
    assert w.write([0], False, z[:1], [1], [0.0], z[:1], f[:1], f[:1], {}) == 0  # env_ids
    assert w.write(None, True, z[None], [[1, 1]], [[0.0, 0.0]], z[None], f[None], f[None],
                   {}) == 0  # extend
    assert w.write(None, False, z, [1, 1], [0.0, 0.0], z, [2, 0], f, {}) == 0  # flag 2
    assert w.write(None, False, z, [1, 1], [0.0, 0.0], z, f, f, {"x": 1}) == 0  # unknown
    assert t.written.tolist() == [0, 0] and t.side.in_use() == 0
    assert w.write(None, False, z, [1, 1], [0.0, 0.0], z, f, f, {}) == 1
    t.written[1] += 1  # lanes out of step: the general writer takes the call
    assert w.write(None, False, z, [1, 1], [0.0, 0.0], z, f, f, {}) == 0


def test_step_writer_serves_plain_tables() -> None:
    """Flat and dict observations are served; dict extras and int flags are not."""
    std = {"action": ((), "int64"), "reward": ((), "float32"), "terminated": ((), "bool"),
           "truncated": ((), "bool")}

    def serves(spec: dict[str, Any], obs: list[str]) -> bool:
        return StepWriter(StepTable(rb.Spec.coerce(spec), T=4, lanes=1,
                                    obs_fields=obs)).serves

    assert serves({"obs/a": ((2,), "float32"), "obs/b/c": ((), "int64"), **std},
                  ["obs/a", "obs/b/c"])
    assert not serves({"obs": ((2,), "float32"), **std, "w/a": ((), "float32")}, ["obs"])
    assert not serves({"obs": ((2,), "float32"), **std, "terminated": ((), "int64")},
                      ["obs"])


#: Dict observation layouts: one level of flat rows; nested; a multi-dim uint8 field (its
#: rows are not flat: no memo of kept bytes); a scalar first field (it shows the lead).
DICT_SPECS: dict[str, dict[str, Any]] = {
    "flat rows": {"obs/pos": ((3,), "float32"), "obs/vel": ((2,), "float64")},
    "nested": {"obs/pos": ((3,), "float32"), "obs/goal/xy": ((2,), "float32")},
    "grid": {"obs/pos": ((3,), "float32"), "obs/img": ((2, 2), "uint8")},
    "scalar first": {"obs/t": ((), "int64"), "obs/pos": ((3,), "float32")},
}
DICT_KINDS = ("exact", "f64", "lists", "torch", "non-contiguous", "lane dim", "mapping",
              "bad missing key", "bad extra key", "bad shape", "bad flat obs",
              "bad nan t")


def _dict_value(spec: dict[str, Any], flat: dict[str, np.ndarray]) -> dict[str, Any]:
    """The nested plain dict a user passes for the flat fields ``obs/...``."""
    out: dict[str, Any] = {}
    for name in spec:
        if not name.startswith("obs/"):
            continue
        *path, key = name.split("/")[1:]
        node = out
        for p in path:
            node = node.setdefault(p, {})
        node[key] = flat[name]
    return out


def _dict_obs(rng: np.random.Generator, spec: dict[str, Any], lanes: int
              ) -> dict[str, np.ndarray]:
    out = {}
    for name, (shape, dt) in spec.items():
        if name.startswith("obs/"):
            x = rng.standard_normal((lanes, *shape)) * 3
            if rng.random() < 0.3 and dt.startswith("float"):
                x.reshape(lanes, -1)[:, 0] = rng.choice([0.0, -0.0, np.nan])
            out[name] = x.astype(dt)
    return out


def _dict_step(rng: np.random.Generator, spec: dict[str, Any], kind: str, lanes: int,
               obs: dict[str, np.ndarray], nxt: dict[str, np.ndarray],
               end: np.ndarray) -> dict[str, Any]:
    """One add's keywords in input kind ``kind`` (obs ``[lanes, *shape]`` by field)."""
    one = lanes == 1
    fields = {k: (v[0] if one else v).copy() for k, v in obs.items()}
    nfields = {k: (v[0] if one else v).copy() for k, v in nxt.items()}
    if kind == "f64":
        fields = {k: v.astype(np.float64) if v.dtype.kind == "f" else v
                  for k, v in fields.items()}
        nfields = {k: v.astype(np.float64) if v.dtype.kind == "f" else v
                   for k, v in nfields.items()}
    elif kind == "lists":
        fields = {k: v.tolist() for k, v in fields.items()}
    elif kind == "torch":
        nfields = {k: torch.from_numpy(np.asarray(v)) for k, v in nfields.items()}
    elif kind == "non-contiguous":
        for k, v in list(fields.items()):
            if v.ndim:
                wide = np.zeros((*v.shape[:-1], 2 * v.shape[-1]), v.dtype)
                wide[..., ::2] = v
                fields[k] = wide[..., ::2]
    elif kind == "lane dim" and one:  # [1, *shape], every value
        fields = {k: v[None] for k, v in fields.items()}
        nfields = {k: v[None] for k, v in nfields.items()}
    elif kind == "bad shape":
        k = sorted(fields)[-1]
        fields[k] = np.zeros((*np.shape(fields[k]), 2))
    elif kind == "bad nan t" and "obs/t" in fields:
        fields["obs/t"] = np.full(np.shape(fields["obs/t"]), np.nan)
    kw: dict[str, Any] = {
        "obs": _dict_value(spec, fields), "next_obs": _dict_value(spec, nfields),
        "action": rng.integers(0, 5, lanes) if not one else int(rng.integers(0, 5)),
        "reward": rng.standard_normal(lanes).astype(np.float32) if not one
        else float(rng.standard_normal()),
        "terminated": end[0].copy() if not one else bool(end[0, 0]),
        "truncated": end[1].copy() if not one else bool(end[1, 0])}
    if kind == "lane dim" and one:
        for k in ("action", "reward", "terminated", "truncated"):
            kw[k] = np.asarray(kw[k])[None]
        kw["reward"] = kw["reward"].astype(np.float32)
    elif kind == "mapping":  # not a plain dict: the Python boundary takes it
        kw["obs"] = OrderedDict(kw["obs"])
    elif kind == "bad missing key":
        kw["next_obs"].pop(sorted(kw["next_obs"])[0])
    elif kind == "bad extra key":
        kw["obs"]["extra"] = np.zeros(1, np.float32)
    elif kind == "bad flat obs":
        kw["obs"] = np.zeros((lanes, 3) if not one else 3, np.float32)
    return kw


@pytest.mark.parametrize("storage", ["numpy", "memmap"])
@pytest.mark.parametrize("layout", list(DICT_SPECS))
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), lanes=st.sampled_from([1, 3]),
       rows=st.sampled_from([1, 2, 5]), prioritized=st.booleans(),
       kinds=st.lists(st.sampled_from(DICT_KINDS), min_size=1, max_size=4))
def test_dict_obs_adds_match_reference(storage: str, layout: str, seed: int, lanes: int,
                                       rows: int, prioritized: bool, kinds: list[str]) -> None:
    """Dict observations (every field kept aside, compared bitwise for continuity): random
    adds of several input kinds, where a lane's data may break in one field only (its
    step must keep its next obs), with episode ends, wraps, env_ids, extends and clears;
    in memory and in memmap files."""
    spec = {**DICT_SPECS[layout], "action": ((), "int64"), "reward": ((), "float32"),
            "terminated": ((), "bool"), "truncated": ((), "bool")}
    with storage_of(storage) as where:
        rng = np.random.default_rng(seed)
        pair = _pair(where, spec, lanes, rows, prioritized)
        obs = _dict_obs(rng, spec, lanes)
        for _ in range(30):
            end = rng.random((2, lanes)) < 0.15
            nxt = _dict_obs(rng, spec, lanes)
            kind = kinds[int(rng.integers(len(kinds)))]
            u = rng.random()
            if u < 0.05:
                pair.do("clear", {})
                continue
            if u < 0.1:  # an extend between the adds (the Python boundary writes it)
                kw = _dict_step(rng, spec, "exact", lanes, obs, nxt, end)
                ext = {k: np.asarray(v)[None] for k, v in kw.items()
                       if k not in ("obs", "next_obs")}
                # one step: [1, lanes, *shape] ([1, *shape] for one lane: obs as held)
                ext["obs"] = _dict_value(spec, {k: v if lanes == 1 else v[None]
                                                for k, v in obs.items()})
                ext["next_obs"] = _dict_value(spec, {k: v if lanes == 1 else v[None]
                                                     for k, v in nxt.items()})
                got = pair.do("extend", ext)
            elif u < 0.16 and lanes > 1:  # some lanes only: they get out of step
                ids = [0, 2] if rng.random() < 0.5 else [1]
                kw = _dict_step(rng, spec, "exact", lanes, obs, nxt, end)
                sub = {k: v[ids] for k, v in obs.items()}
                nsub = {k: v[ids] for k, v in nxt.items()}
                kw = {k: np.asarray(v)[ids] for k, v in kw.items()
                      if k not in ("obs", "next_obs")}
                kw.update(obs=_dict_value(spec, sub), next_obs=_dict_value(spec, nsub),
                          env_ids=ids)
                pair.do("add", kw)
                continue
            else:
                got = pair.do("add", _dict_step(rng, spec, kind, lanes, obs, nxt, end))
            if got is None:
                # each lane continues from its next obs unless its episode ended; now and
                # then one field alone breaks (the others continue)
                fresh = _dict_obs(rng, spec, lanes)
                jump = end.any(axis=0)
                part = rng.random(lanes) < 0.1
                names = sorted(fresh)
                one_field = names[int(rng.integers(len(names)))]
                obs = {}
                for k in fresh:
                    cut = jump | (part if k == one_field else np.zeros(lanes, bool))
                    obs[k] = np.where(cut.reshape(lanes, *[1] * (fresh[k].ndim - 1)),
                                      fresh[k], nxt[k])
        assert pair.steps > 0 or all(k.startswith("bad") or k == "mapping" for k in kinds)


def test_guard_from_another_thread() -> None:
    """The Python direct write checks the call guard as the compiled one does: a call
    from another thread takes the locked path and still writes."""
    import threading

    with no_compiler():
        buf = rb.ReplayBuffer(16, seed=0, spec=SPEC)
        kw = {"obs": np.zeros(3, np.float32), "action": 1, "reward": 0.0,
              "next_obs": np.ones(3, np.float32), "terminated": False, "truncated": False,
              "h": np.zeros(2, np.float32)}
        buf.add(**kw)
        th = threading.Thread(target=lambda: buf.add(**kw))
        th.start()
        th.join()
        buf.add(**kw)
    assert len(buf) == 3 and buf._guard.shared and not buf._guard.busy
