"""Every bad input of the core raises a clear error and leaves the buffer as it was.

A message must name the argument, show the bad value, say what was expected and how to
fix it. After a rejected call the buffer's full state (every array of ``state_dict``,
the RNG state, the side-store free list) is exactly what it was before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.storage.writers.compiled import CompiledWriter
from tests.twins import under_writer


def good(**over: Any) -> dict[str, Any]:
    kw: dict[str, Any] = {"obs": np.zeros(3, np.float32), "action": np.int64(1), "reward": 1.0,
                          "next_obs": np.ones(3, np.float32), "terminated": False,
                          "truncated": False}
    kw.update(over)
    return kw


def steps(n: int = 5, **over: Any) -> dict[str, Any]:
    kw: dict[str, Any] = {"obs": np.zeros((n, 3), np.float32), "action": np.zeros(n, np.int64),
                          "reward": np.zeros(n, np.float32),
                          "next_obs": np.ones((n, 3), np.float32),
                          "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
    kw.update(over)
    return kw


def filled(capacity: int = 4, **kw: Any) -> rb.ReplayBuffer:
    """A wrapped buffer with episode ends and an out-of-order step (side slots in use)."""
    buf = rb.ReplayBuffer(capacity=capacity, seed=0, **kw)
    for i in range(6):
        buf.add(**good(obs=np.full(3, i, np.float32), next_obs=np.full(3, i + 1, np.float32),
                       terminated=i == 3, action=np.int64(i % 2)))
    return buf


def snapshot(buf: rb.ReplayBuffer) -> dict[str, Any]:
    state = buf.state_dict()
    out: dict[str, Any] = {"rng": repr(state["rng"]), "meta": repr(state["metadata"]),
                           "len": len(buf)}
    for k, v in state.get("table", {}).items():
        out[k] = np.array(v, copy=True)
    if buf.spec is not None:
        out["free"] = list(buf.table.side.free)
        out["side_in_use"] = buf.table.side_in_use()
    return out


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k
        else:
            assert a[k] == b[k], k


def rejects(buf: rb.ReplayBuffer, call: Callable[[], Any], exc: type[Exception],
            *fragments: str) -> str:
    """Run ``call``, expect ``exc`` whose message holds every fragment, state unchanged."""
    before = snapshot(buf)
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, (frag, msg)
    assert_same(before, snapshot(buf))
    return msg


# --------------------------------------------------------------------------- add / extend
BAD_ADDS: list[tuple[str, dict[str, Any], type[Exception], tuple[str, ...]]] = [
    ("missing field", {k: v for k, v in good().items() if k != "reward"}, rb.SpecError,
     ("add", "missing ['reward']", "pass exactly those")),
    ("unknown field", good(foo=1.0), rb.SpecError, ("unknown ['foo']", "pass exactly those")),
    ("missing next_obs", {k: v for k, v in good().items() if k != "next_obs"}, rb.SpecError,
     ("missing next_obs",)),
    ("wrong obs shape", good(obs=np.zeros(4, np.float32)), rb.ShapeError,
     ("obs=array(shape=(4,)", "expected shape (3,)", "reshape")),
    ("wrong next_obs shape", good(next_obs=np.zeros((2, 3), np.float32)), rb.ShapeError,
     ("next_obs=array(shape=(2, 3)", "expected shape (3,)", "reshape")),
    ("fraction into int", good(action=2.5), rb.DtypeError,
     ("action=2.5", "int64", "integral", "declare the field as float")),
    ("NaN into int", good(action=float("nan")), rb.DtypeError,
     ("action=nan", "int64", "NaN", "round or fix")),
    ("float64 array with fraction into int", good(action=np.array(1.5)), rb.DtypeError,
     ("action=1.5", "int64", "integral")),
    ("int array into bool", good(terminated=np.int64(2)), rb.DtypeError,
     ("terminated=2", "bool", "pass a bool")),
    ("string into float", good(reward="a"), rb.DtypeError,
     ("reward='a'", "float32", "convert the value")),
    ("complex into float", good(reward=1 + 2j), rb.DtypeError,
     ("reward=", "complex128", "float32")),
    ("float into int via list", good(action=[0.5]), rb.ShapeError, ("action=[0.5]",)),
]


@pytest.mark.parametrize("case", BAD_ADDS, ids=[c[0] for c in BAD_ADDS])
def test_bad_add_is_rejected_and_changes_nothing(case: Any) -> None:
    _, kw, exc, fragments = case
    buf = filled()
    rejects(buf, lambda: buf.add(**kw), exc, *fragments)
    buf.add(**good())  # the buffer still works


# with an explicit spec, the very first add is checked against it as well
SPEC_CASES = [c for c in BAD_ADDS if c[0] not in ("missing field", "missing next_obs")]


@pytest.mark.parametrize("case", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_bad_first_add_against_given_spec(case: Any) -> None:
    _, kw, exc, fragments = case
    spec = {"obs": ((3,), "float32"), "action": ((), "int64")}
    fresh = rb.ReplayBuffer(capacity=4, seed=0, spec=spec)
    rejects(fresh, lambda: fresh.add(**kw), exc, *fragments)
    fresh.add(**good())
    assert len(fresh) == 1


def test_first_add_that_fails_leaves_no_storage() -> None:
    buf = rb.ReplayBuffer(capacity=4, seed=0)
    with pytest.raises(rb.ShapeError):
        buf.add(**good(next_obs=np.zeros(4, np.float32)))  # obs (3,) but next_obs (4,)
    assert buf.spec is None and len(buf) == 0
    with pytest.raises(rb.DtypeError):
        buf.add(**good(terminated=np.int64(5)))
    assert buf.spec is None
    buf.add(**good())
    assert len(buf) == 1 and buf.spec["terminated"].dtype == np.bool_


def test_uint8_range() -> None:
    buf = rb.ReplayBuffer(capacity=4, seed=0)
    buf.add(**good(obs=np.zeros(2, np.uint8), next_obs=np.zeros(2, np.uint8)))
    assert buf.spec["obs"].dtype == np.uint8
    rejects(buf, lambda: buf.add(**good(obs=np.array([300, 1]), next_obs=np.zeros(2, np.uint8))),
            rb.DtypeError, "obs=[300, 1]", "uint8", "[0, 255]", "clip the value")
    rejects(buf, lambda: buf.add(**good(obs=np.zeros(2, np.uint8), next_obs=np.array([-1, 0]))),
            rb.DtypeError, "next_obs=[-1, 0]", "uint8")
    buf.add(**good(obs=np.array([255, 1]), next_obs=np.array([0, 7])))  # in range: fine
    assert buf.table.arrays["obs"].dtype == np.uint8 and len(buf) == 2


def test_bad_extend_leading_dims() -> None:
    buf = filled()
    rejects(buf, lambda: buf.extend(**steps(5, action=np.zeros(4, np.int64))), rb.ShapeError,
            "action=array(shape=(4,)", "expected shape (5,)", "number of steps")
    rejects(buf, lambda: buf.extend(**steps(5, next_obs=np.zeros((6, 3), np.float32))),
            rb.ShapeError, "next_obs", "expected shape (5, 3)")
    rejects(buf, lambda: buf.extend(**good()), rb.ShapeError, "expected", "leading")
    # a bad value in the middle of a chunk: nothing of the chunk is written
    rejects(buf, lambda: buf.extend(**steps(5, action=np.array([0, 1, 2.5, 3, 4]))),
            rb.DtypeError, "action", "integral")


def test_bad_vector_add() -> None:
    buf = rb.ReplayBuffer(capacity=8, num_envs=2, seed=0)
    two = {k: np.stack([np.asarray(v)] * 2) for k, v in good().items()}
    buf.add(**two)
    rejects(buf, lambda: buf.add(**good()), rb.ShapeError, "obs", "expected", "(2, 3)")
    rejects(buf, lambda: buf.add(**{**two, "reward": np.zeros(3, np.float32)}), rb.ShapeError,
            "reward=array(shape=(3,)", "expected shape (2,)")


@pytest.mark.parametrize("env_ids, fragments", [
    ([2], ("env_ids=[2]", "[0, 2)", "out-of-range")),
    ([0, 0], ("env_ids=[0, 0]", "distinct", "drop duplicates")),
    ([[0]], ("env_ids=[[0]]", "1-D", "env_ids=[0]")),
    ([0.5], ("env_ids=[0.5]", "int")),
    ([], ("env_ids=[]", "non-empty")),
    ([-1], ("env_ids=[-1]", "[0, 2)")),
])
def test_bad_env_ids(env_ids: Any, fragments: tuple[str, ...]) -> None:
    buf = rb.ReplayBuffer(capacity=8, num_envs=2, seed=0)
    buf.add(**{k: np.stack([np.asarray(v)] * 2) for k, v in good().items()})
    rejects(buf, lambda: buf.add(env_ids=env_ids, **good()), rb.ShapeError, *fragments)


def test_env_ids_length_must_match_values() -> None:
    buf = rb.ReplayBuffer(capacity=8, num_envs=2, seed=0)
    buf.add(env_ids=[1], **{k: np.asarray(v)[None] for k, v in good().items()})
    rejects(buf, lambda: buf.add(env_ids=[0, 1], **{k: np.asarray(v)[None]
                                                    for k, v in good().items()}),
            rb.ShapeError, "obs", "expected", "(2, 3)")


# --------------------------------------------------------------------------- tuples
WRITERS = ["compiled", "python", "reference"]


@contextmanager
def writer(name: str) -> Iterator[None]:
    """Run the block under one of the writers: the compiled one (``auto``), the Python
    one-step add of a build without a C compiler (as ``REPLAYBANK_PURE_PYTHON=1``), or
    the reference (every call through the Python boundary)."""
    if name == "reference":
        with under_writer("reference"):
            yield
        return
    with pytest.MonkeyPatch.context() as mp:
        if name == "python":
            mp.setattr(CompiledWriter, "of", classmethod(lambda cls, table, guard=None: None))
        mp.setenv("REPLAYBANK_WRITER", "auto")
        yield


def lanes3(t: int = 0) -> dict[str, Any]:
    """One step of 3 lanes whose obs is [3, 3]: lane i holds (t + i, 10 + i, 20 + i)."""
    obs = np.array([[t + i, 10 + i, 20 + i] for i in range(3)], np.int64)
    return {"obs": obs, "action": np.arange(3), "reward": np.zeros(3, np.float32),
            "next_obs": obs + 1, "terminated": np.zeros(3, bool),
            "truncated": np.zeros(3, bool)}


def columns(a: np.ndarray) -> tuple[np.ndarray, ...]:
    """``[..., lanes, parts]`` as a gymnasium vector env's Tuple value: one array
    ``[..., lanes]`` per part."""
    return tuple(np.ascontiguousarray(a[..., i]) for i in range(a.shape[-1]))


TUPLE_CALLS: dict[str, Callable[[rb.ReplayBuffer], Any]] = {
    # a vector env's Tuple observation: 3 parts of [3 envs]; np.asarray would store each
    # part (every env's value of it) in one lane
    "obs": lambda b: b.add(**{**lanes3(5), "obs": columns(lanes3(5)["obs"])}),
    "next_obs": lambda b: b.add(**{**lanes3(5), "next_obs": columns(lanes3(5)["next_obs"])}),
    "extend": lambda b: b.extend(**{**{k: v[None] for k, v in lanes3(5).items()},
                                    "obs": columns(lanes3(5)["obs"][None])}),
    "env_ids": lambda b: b.add(env_ids=[2, 0], **{
        **{k: v[[2, 0]] for k, v in lanes3(5).items()},
        "obs": columns(lanes3(5)["obs"][[2, 0]])}),
    "extra": lambda b: b.add(**lanes3(5), hidden=(np.zeros((3, 2)), np.ones((3, 2)))),
}


@pytest.mark.parametrize("first", [False, True], ids=["later", "first"])
@pytest.mark.parametrize("name", WRITERS)
@pytest.mark.parametrize("call", list(TUPLE_CALLS))
def test_a_tuple_holding_arrays_is_refused_naming_the_dict(call: str, name: str,
                                                           first: bool) -> None:
    """A tuple of arrays (a gymnasium Tuple space's value from a vector env: one array
    per part, each ``[num_envs]``) is refused whichever writer runs, naming the field, the
    tuple and the dict to pass; nothing changes (on a first add: no storage is made)."""
    arg = {"extend": "obs", "env_ids": "obs", "extra": "hidden"}.get(call, call)
    field = {"next_obs": "obs"}.get(arg, arg)  # (a next observation is stored as obs)
    with writer(name):
        buf = rb.ReplayBuffer(12, num_envs=3, seed=0)
        if not first:
            buf.add(**lanes3(), hidden=np.zeros((3, 2))) if call == "extra" \
                else buf.add(**lanes3())
        rejects(buf, lambda: TUPLE_CALLS[call](buf), rb.ShapeError,
                f"{arg}=(array(shape=", "a tuple holding arrays",
                f"{arg}={{'0': {arg}[0], '1': {arg}[1]", f"stored as the fields {field}/0")
        assert buf.spec is None if first else len(buf) == 3


@pytest.mark.parametrize("name", WRITERS)
def test_the_dict_of_a_tuple_stores_each_env_in_its_lane(name: str) -> None:
    """The dict the error names stores every env's parts in its own lane."""
    with writer(name):
        buf = rb.ReplayBuffer(12, num_envs=3, seed=0)
        for t in range(2):
            kw = lanes3(t)
            buf.add(**{**kw, "obs": {str(i): c for i, c in enumerate(columns(kw["obs"]))},
                       "next_obs": {str(i): c for i, c in enumerate(columns(kw["next_obs"]))}})
    b = buf.sample(6, replace=False)
    got = np.stack([b.obs[str(i)] for i in range(3)], axis=-1)  # [6, 3]
    lane, t = b.indices % 3, b.indices // 3
    np.testing.assert_array_equal(got, np.stack([t + lane, 10 + lane, 20 + lane], axis=-1))


@pytest.mark.parametrize("name", WRITERS)
def test_a_tuple_of_numbers_reads_as_a_list(name: str) -> None:
    """A tuple of numbers is no structured value: one number per env (``action=(0, 1,
    2)``), or one env's vector (a ``Tuple(Discrete, ...)`` value of a single env) is
    stored as the list would be."""
    with writer(name):
        buf = rb.ReplayBuffer(12, num_envs=3, seed=0)
        buf.add(**{**lanes3(), "action": (2, 0, 1), "reward": (0.5, 1.5, 2.5)})
        one = rb.ReplayBuffer(4, seed=0)
        for _ in range(2):
            one.add(obs=(11, 10, 0), action=1, reward=0.0, next_obs=(12, 10, 0),
                    terminated=False, truncated=False)
    np.testing.assert_array_equal(buf.table.arrays["action"][0], [2, 0, 1])
    np.testing.assert_array_equal(buf.table.arrays["reward"][0], [0.5, 1.5, 2.5])
    np.testing.assert_array_equal(one.table.arrays["obs"][:2, 0], [[11, 10, 0]] * 2)



def steps3(n: int = 2) -> dict[str, Any]:
    """``n`` steps of :func:`lanes3` (step t at t), each field ``[n, 3, ...]``."""
    rows = [lanes3(t) for t in range(n)]
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def per_step(a: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """``[steps, lanes, parts]`` as a list of one vector env Tuple value per step (what a
    rollout loop that appends each step's observation collects)."""
    return [columns(step) for step in a]


#: extend given a list of per-step tuples of arrays: np.asarray stacks it [steps, parts,
#: lanes], so with as many parts as lanes each lane stored one part of every env
LIST_CALLS: dict[str, Callable[[rb.ReplayBuffer], Any]] = {
    "obs": lambda b: b.extend(**{**steps3(), "obs": per_step(steps3()["obs"])}),
    "next_obs": lambda b: b.extend(**{**steps3(), "next_obs": per_step(steps3()["next_obs"])}),
    "env_ids": lambda b: b.extend(env_ids=[2, 0], **{
        **{k: v[:, [2, 0]] for k, v in steps3().items()},
        "obs": per_step(steps3()["obs"][:, [2, 0]])}),
    "extra": lambda b: b.extend(**steps3(), hidden=[(np.zeros((3, 2)), np.ones((3, 2)))] * 2),
}


@pytest.mark.parametrize("first", [False, True], ids=["later", "first"])
@pytest.mark.parametrize("name", WRITERS)
@pytest.mark.parametrize("call", list(LIST_CALLS))
def test_extend_refuses_a_list_of_tuples_holding_arrays(call: str, name: str,
                                                        first: bool) -> None:
    """``extend`` given a list of per-step tuples of arrays (a vector env's Tuple
    observations, or (h, c) states, collected step by step) is refused by the tuple rule
    as a lone tuple is, whichever writer runs, naming the dict of one sequence per part;
    nothing changes (before, it was stacked part-first: with as many parts as envs,
    accepted with every lane holding one part of every env)."""
    arg = {"env_ids": "obs", "extra": "hidden"}.get(call, call)
    field = {"next_obs": "obs"}.get(arg, arg)
    with writer(name):
        buf = rb.ReplayBuffer(12, num_envs=3, seed=0)
        if not first:
            buf.add(**lanes3(), hidden=np.zeros((3, 2))) if call == "extra" \
                else buf.add(**lanes3())
        rejects(buf, lambda: LIST_CALLS[call](buf), rb.ShapeError,
                f"{arg}=[2 items: (array(shape=", "are tuples holding arrays",
                f"{arg}={{'0': [s[0] for s in {arg}], '1': [s[1] for s in {arg}]",
                f"stored as the fields {field}/0")
        assert buf.spec is None if first else len(buf) == 3


@pytest.mark.parametrize("name", WRITERS)
def test_extend_with_the_dict_of_per_step_tuples_stores_each_env_in_its_lane(
        name: str) -> None:
    """The dict the error names (one list of per-step arrays per part) stores every env's
    parts in its own lane; a one-env list of tuples of arrays is refused alike."""
    kw = steps3()
    with writer(name):
        buf = rb.ReplayBuffer(12, num_envs=3, seed=0)
        obs, nxt = per_step(kw["obs"]), per_step(kw["next_obs"])
        buf.extend(**{**kw, "obs": {str(i): [s[i] for s in obs] for i in range(3)},
                      "next_obs": {str(i): [s[i] for s in nxt] for i in range(3)}})
        one = rb.ReplayBuffer(4, seed=0)
        rejects(one, lambda: one.extend(
            obs=[(np.zeros(2), np.ones(2))] * 3, next_obs=np.zeros((3, 4)), action=np.zeros(3),
            reward=np.zeros(3), terminated=np.zeros(3, bool), truncated=np.zeros(3, bool)),
            rb.ShapeError, "obs=[3 items: (array(shape=(2,)", "obs={'0': [s[0] for s in obs]")
    for part in range(3):
        np.testing.assert_array_equal(buf.table.arrays[f"obs/{part}"][:2], kw["obs"][..., part])


@pytest.mark.parametrize("name", WRITERS)
def test_extend_takes_a_list_of_tuples_of_numbers_as_a_list(name: str) -> None:
    """A list of tuples of numbers (one per step: each env's action, or one env's vector)
    is no structured value: stored as the nested list would be."""
    with writer(name):
        buf = rb.ReplayBuffer(12, num_envs=3, seed=0)
        buf.extend(**{**steps3(), "action": [(2, 0, 1), (1, 2, 0)]})
        one = rb.ReplayBuffer(4, seed=0)
        one.extend(obs=[(11, 10, 0), (12, 10, 0)], action=[1, 1], reward=[0.0, 0.0],
                   next_obs=[(12, 10, 0), (13, 10, 0)], terminated=[False, False],
                   truncated=[False, False])
    np.testing.assert_array_equal(buf.table.arrays["action"][:2], [[2, 0, 1], [1, 2, 0]])
    np.testing.assert_array_equal(one.table.arrays["obs"][:2, 0], [[11, 10, 0], [12, 10, 0]])

# --------------------------------------------------------------------------- sampling
def test_sample_empty() -> None:
    buf = rb.ReplayBuffer(capacity=4, seed=0)
    rejects(buf, lambda: buf.sample(2), rb.EmptyBufferError,
            "sample(batch_size=2)", "empty", "add transitions first")
    buf = filled()
    buf.clear()
    rejects(buf, lambda: buf.sample(1), rb.EmptyBufferError, "empty")


def test_sample_without_replacement_too_many() -> None:
    buf = filled()
    rejects(buf, lambda: buf.sample(5, replace=False), rb.EmptyBufferError,
            "sample(batch_size=5, replace=False)", "holds 4", "lower batch_size",
            "replace=True")
    assert len(buf.sample(4, replace=False).indices) == 4


@pytest.mark.parametrize("bs", [0, -3, 2.5, True, "8", None])
def test_bad_batch_size(bs: Any) -> None:
    buf = filled()
    rejects(buf, lambda: buf.sample(bs), rb.ConfigError, f"batch_size={bs!r}",
            "positive int", "sample(256)")


# --------------------------------------------------------------------------- construction
@pytest.mark.parametrize("cap", [0, -5, 2.5, True, "100", None])
def test_bad_capacity(cap: Any) -> None:
    with pytest.raises(rb.CapacityError) as info:
        rb.ReplayBuffer(capacity=cap)
    msg = str(info.value)
    assert f"capacity={cap!r}" in msg and "positive int" in msg and "capacity=100_000" in msg


@pytest.mark.parametrize(("kw", "error"), [
    ({"info": {}}, rb.SpecError), ({"infos": [{}]}, rb.DtypeError),
    ({"info": [{"is_success": 1.0}]}, rb.DtypeError)])
def test_a_gymnasium_info_says_what_to_pass_instead(kw: dict[str, Any], error: type) -> None:
    """An env's info (or SB3's infos) passed to add: the refusal says to pass its values
    as fields of their own and the time limit as truncated=; nothing is stored."""
    buf = rb.ReplayBuffer(8, seed=0)
    o = np.zeros(3, np.float32)
    with pytest.raises(error) as info:
        buf.add(obs=o, action=0, reward=0.0, next_obs=o, terminated=False, truncated=False,
                **kw)
    msg = str(info.value)
    assert "is_success=info['is_success']" in msg and "truncated=" in msg, msg
    assert not buf.allocated


@pytest.mark.parametrize("cap", [1e6, np.float32(5e4)])
def test_a_whole_float_capacity_says_which_int(cap: Any) -> None:
    """``capacity=1e6`` (as configs write it) is refused, naming the int it means."""
    with pytest.raises(rb.CapacityError) as info:
        rb.ReplayBuffer(capacity=cap)
    msg = str(info.value)
    assert "positive int" in msg and f"(= {int(cap):_})" in msg, msg


def test_capacity_not_divisible() -> None:
    with pytest.raises(rb.CapacityError) as info:
        rb.ReplayBuffer(capacity=10, num_envs=3)
    msg = str(info.value)
    for frag in ("capacity=10", "num_envs=3", "does not divide", "9 or 12"):
        assert frag in msg


@pytest.mark.parametrize("n", [0, -1, 1.5, "2"])
def test_bad_num_envs(n: Any) -> None:
    with pytest.raises(rb.ConfigError, match=r"num_envs=.*positive int.*num_envs=1"):
        rb.ReplayBuffer(capacity=12, num_envs=n)


@pytest.mark.parametrize("seed", [-1, 1.5, "x", True, [1]])
def test_bad_seed(seed: Any) -> None:
    with pytest.raises(rb.ConfigError) as info:
        rb.ReplayBuffer(capacity=4, seed=seed)
    msg = str(info.value)
    assert f"seed={seed!r}" in msg and "non-negative int" in msg and "seed=0" in msg


def test_errors_are_builtin_subclasses() -> None:
    assert issubclass(rb.ShapeError, ValueError) and issubclass(rb.DtypeError, TypeError)
    assert issubclass(rb.EmptyBufferError, ValueError)
    assert all(issubclass(e, rb.ReplayBankError) for e in (
        rb.ShapeError, rb.DtypeError, rb.SpecError, rb.CapacityError, rb.ConfigError,
        rb.EmptyBufferError, rb.CheckpointError, rb.MissingDependencyError))
