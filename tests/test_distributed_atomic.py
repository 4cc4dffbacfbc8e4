"""A call of the sharded replay service's client is all or nothing (real local Ray).

``update_priorities``: a bad call is refused on the client before any shard changes,
and a call that fails on a shard waits for every shard's reply first (no abandoned
reference). ``add``/``extend``: the field set, trailing shapes, dtypes (a local buffer's
casting rules) and initial priorities are checked on the client before anything is
queued, so the call that passes bad rows raises and a later valid call stores exactly its
own rows; rows a shard still refuses (it learned another spec from another client, or
its view reshapes the inputs) are reported once, naming their call, and never raised by
a later call.
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import ConfigError, DtypeError, ShapeError, SpecError
from tests.distributed_ray import start, steps

ray = pytest.importorskip("ray")
from replaybank.distributed.errors import RowsRejectedWarning  # noqa: E402

#: stored priority == raw priority: the shard totals read the raw priorities back
PLAIN = {"type": "prioritized", "alpha": 1.0, "eps": 0.0, "kernel": "numpy"}


def shard_state(svc: Any) -> list[tuple[int, float, int]]:
    """(size, total, inserts) of every shard."""
    return [(s["size"], s["total"], s["inserts"]) for s in svc.stats()["shards"]]


def one_step(lanes: int, t: int) -> dict[str, Any]:
    """``add`` values of step ``t`` of ``lanes`` lanes."""
    return {k: v[0] for k, v in steps(lanes, t, t + 1).items()}


# ---------------------------------------------------------------- update_priorities
def test_rejected_update_priorities_changes_no_shard(services: Any) -> None:
    svc = start(services, 2, {"capacity": 8, "sampler": PLAIN}, num_lanes=2, seed=3)
    c = svc.client(max_rows=1)
    c.extend(**steps(2, 0, 8), priority=1.0)
    c.flush()
    keys = np.unique(c.sample(64).indices)
    on_1 = np.flatnonzero(keys % 2 == 1)
    assert len(on_1) and len(on_1) < len(keys)  # keys of both shards
    good = np.full(len(keys), 2.0)
    before = shard_state(svc)
    # a value the shards refuse, only among shard 1's items (shard 0's part is fine);
    # 1e300 is above what the sum tree of 8 slots holds (alpha 1: 1e300 / 8)
    for bad in (np.nan, -1.0, np.inf, 1e300):
        p = good.copy()
        p[on_1[0]] = bad
        with pytest.raises(DtypeError, match=r"update_priorities\(priorities="):
            c.update_priorities(keys, p)
        assert shard_state(svc) == before, f"priority {bad}: a shard changed"
    with pytest.raises(ShapeError, match="one priority per index"):
        c.update_priorities(keys, good[:-1])
    with pytest.raises(DtypeError, match="expected integer indices"):
        c.update_priorities(keys.astype(np.float64), good)
    assert shard_state(svc) == before
    # a valid call applies to both shards
    assert c.update_priorities(keys, good) == len(keys)
    assert sum(t for _, t, _ in shard_state(svc)) == pytest.approx(16.0 + len(keys))
    # a sampler without priorities: refused on the client, as one buffer refuses it
    uni = start(services, 2, {"capacity": 8}, num_lanes=2)
    u = uni.client(max_rows=1)
    u.extend(**steps(2, 0, 4))
    u.flush()
    with pytest.raises(ConfigError, match="no priorities"):
        u.update_priorities(u.sample(4).indices, np.ones(4))


def refusal(call: Callable[[], Any]) -> tuple[type, str]:
    """The error type of ``call`` and the call and argument its message names first
    (``update_priorities(indices=``, the values left out); ``(NoneType, repr(result))``
    when it was accepted."""
    try:
        result = call()
    except Exception as exc:
        return type(exc), re.sub(r"=.*", "=", str(exc).split(": ")[0])
    return type(None), repr(result)


#: update_priorities calls a local buffer refuses (or accepts): (name, keys, priorities)
#: from the sampled keys ``k`` (4 of them)
UPDATES: list[tuple[str, Callable[[np.ndarray], tuple[Any, Any]]]] = [
    ("negative index", lambda k: (np.r_[k[:-1], -1], np.ones(4))),
    ("float indices", lambda k: (k + 0.5, np.ones(4))),
    ("bool indices", lambda k: (np.ones(4, bool), np.ones(4))),
    ("priorities=None", lambda k: (k, None)),
    ("string priorities", lambda k: (k, ["x"] * 4)),
    ("a priority too many", lambda k: (k, np.ones(5))),
    ("ragged indices", lambda k: ([k[:1].tolist(), k[1:].tolist()], np.ones(4))),
    ("NaN priority", lambda k: (k, np.r_[1.0, 1.0, 1.0, np.nan])),
    ("[B, 1] indices", lambda k: (k[:, None], np.full(4, 2.0))),
]


@pytest.mark.parametrize("case", [c[0] for c in UPDATES])
def test_update_priorities_refuses_what_one_buffer_refuses(services: Any, case: str) -> None:
    """The client ran checks of its own: a negative index was a ShapeError (one buffer:
    ConfigError), float or bool indices and priorities=None too (DtypeError), and [B, 1]
    indices (a learner's idx.unsqueeze(1)), which one buffer accepts, were refused. It
    now runs the local buffer's checks (priorities.checked_updates): the same error type
    naming the same call and argument, and no shard changes when it refuses."""
    make = dict(UPDATES)[case]
    svc = start(services, 2, {"capacity": 8, "sampler": PLAIN}, num_lanes=2, seed=0)
    c = svc.client(max_rows=1)
    c.extend(**steps(2, 0, 4))
    c.flush()
    local = rb.ReplayBuffer(
        16, num_envs=2, seed=0, sampler=rb.PrioritizedSampler(alpha=1.0, eps=0.0, kernel="numpy")
    )
    local.extend(**steps(2, 0, 4))
    c_keys, l_keys = c.sample(4).indices, local.sample(4).indices
    before = svc.stats()["shards"]
    want = refusal(lambda: local.update_priorities(*make(l_keys)))
    got = refusal(lambda: c.update_priorities(*make(c_keys)))
    assert got == want
    if want[0] is type(None):  # accepted (the same count): applied to the shards
        total = 8.0 + len(np.unique(c_keys))  # the updated items went from 1 to 2
        assert sum(s["total"] for s in svc.stats()["shards"]) == pytest.approx(total)
    else:
        assert svc.stats()["shards"] == before


def test_update_priorities_on_an_empty_service_is_refused_as_on_an_empty_buffer(
    services: Any,
) -> None:
    """A service nothing was written to returned 0 silently where one buffer raises
    ShapeError (nothing added yet); the refusal is one buffer's message, naming the call
    and its keys argument, with "service" for "buffer"; once a client wrote, the update
    runs (0: no key is live)."""
    svc = start(services, 2, {"capacity": 8, "sampler": PLAIN}, num_lanes=2, seed=0)
    c = svc.client(max_rows=1)
    local = rb.ReplayBuffer(16, num_envs=2, sampler=rb.PrioritizedSampler(kernel="numpy"))
    keys, prio = np.array([0, 1]), np.array([1.0, 2.0])
    for call in (
        lambda b: b.update_priorities(keys, prio),
        lambda b: b.update_sequence_priorities(keys, np.ones((2, 3))),
    ):
        with pytest.raises(ShapeError) as own:
            call(local)
        assert re.match(
            r"^update_\w+\((indices|starts)=\.\.\.\): the buffer is empty", str(own.value)
        )
        with pytest.raises(ShapeError) as served:
            call(c)
        assert str(served.value) == str(own.value).replace("buffer", "service")
    # another client's rows give the service storage: this client asks the shards again
    other = svc.client("other", max_rows=1)
    other.extend(**steps(2, 0, 2))
    other.flush()
    assert c.update_priorities(np.array([10_000]), np.array([1.0])) == 0  # stale key
    assert len(c) == 4


def test_a_call_that_fails_on_a_shard_waits_for_every_reply(services: Any) -> None:
    """A shard that still fails after the client's checks: the call raises that error
    only once every other shard of the call has replied (none is left abandoned)."""
    svc = start(services, 2, {"capacity": 8, "sampler": PLAIN}, num_lanes=2)
    c = svc.client()

    @ray.remote(num_cpus=0)
    def fails() -> None:
        raise DtypeError("refused by the shard")

    @ray.remote(num_cpus=0)
    def slow() -> int:
        time.sleep(1.5)
        return 1

    failing = fails.remote()
    ray.wait([failing], timeout=30)
    late = slow.remote()  # still running when the failure is seen
    with pytest.raises(DtypeError, match="refused by the shard"):
        c._gather({0: failing, 1: late})
    ready, _ = ray.wait([late], timeout=0)
    assert ready == [late], "the call raised before every reply was in"


# ---------------------------------------------------------------- add / extend
def _shape(d: dict[str, Any]) -> dict[str, Any]:
    """Observations of 3 numbers (the spec's have 2)."""
    wide = np.zeros((*d["obs"].shape[:-1], 3), np.float32)
    return {**d, "obs": wide, "next_obs": wide + 1}


def _fraction(d: dict[str, Any]) -> dict[str, Any]:
    return {**d, "action": d["action"] + 0.5}


def _strings(d: dict[str, Any]) -> dict[str, Any]:
    return {**d, "reward": np.full(d["reward"].shape, "x")}


def _missing(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != "reward"}


def _unknown(d: dict[str, Any]) -> dict[str, Any]:
    return {**d, "bonus": np.zeros(d["reward"].shape)}


BAD_ROWS: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]], type, str]] = [
    ("trailing shape", _shape, ShapeError, r"obs=.*expected shape"),
    ("fraction into an int field", _fraction, DtypeError, r"action=.*int64"),
    ("strings", _strings, DtypeError, r"reward=.*float32"),
    ("missing field", _missing, SpecError, "reward"),
    ("unknown field", _unknown, SpecError, "bonus"),
]
BAD_PRIORITIES = [np.nan, -1.0, np.inf, 1e300]


@pytest.mark.parametrize("call", ["add", "extend"])
def test_bad_rows_raise_in_their_own_call_and_later_calls_store_exactly_theirs(
        services: Any, call: str) -> None:
    svc = start(services, 2, {"capacity": 256, "sampler": PLAIN}, num_lanes=4, seed=1)
    c = svc.client(max_age_s=60.0)
    c.extend(**steps(4, 0, 2), priority=1.0)  # the shards learn the spec
    c.flush()
    t = 2

    def rows(t: int) -> dict[str, Any]:
        return one_step(4, t) if call == "add" else steps(4, t, t + 2)

    write = c.add if call == "add" else c.extend
    per_call = 4 if call == "add" else 8
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is reported late either
        for name, make, error, match in BAD_ROWS:
            with pytest.raises(error, match=match):
                write(**make(rows(t)), priority=1.0)
            assert c.pending_rows == 0, f"{name}: rows were queued"
            before = len(c)
            write(**rows(t), priority=1.0)  # a valid call: stores exactly its rows
            c.flush()
            assert len(c) == before + per_call, name
            t += 2
        for bad in BAD_PRIORITIES:
            n = (4,) if call == "add" else (2, 4)
            p = np.ones(n)
            p[(..., 3)] = bad  # lane 3 (shard 1) only
            with pytest.raises(DtypeError, match=r"priority="):
                write(**rows(t), priority=p)
            assert c.pending_rows == 0, f"priority {bad}: rows were queued"
            before = len(c)
            write(**rows(t), priority=1.0)
            c.flush()
            assert len(c) == before + per_call
            t += 2
    assert svc.stats()["inserts"] == 8 + (len(BAD_ROWS) + len(BAD_PRIORITIES)) * per_call


RAGGED: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "obs": lambda d: {**d, "obs": [[0.0, 1.0], [0.0], [1.0, 1.0], [2.0, 2.0]]},
    "reward": lambda d: {**d, "reward": [1.0, [1.0, 2.0], 1.0, 1.0]},
}


@pytest.mark.parametrize("known", [False, True], ids=["fresh service", "spec known"])
@pytest.mark.parametrize("field", sorted(RAGGED))
def test_a_ragged_list_is_named_as_one_buffer_names_it(
    services: Any, field: str, known: bool
) -> None:
    """A ragged list in add was refused with a message that named no argument
    (``ShapeError: [[0.0, 1.0], [0.0], ...]: a ragged nest ...``); one buffer's names it
    (``obs=[[0.0, 1.0], ...]``). The client's message is now one buffer's, on a fresh
    service and once the shards know the fields, and nothing is queued or stored."""
    svc = start(services, 2, {"capacity": 16}, num_lanes=4)
    c = svc.client(max_rows=1)
    local = rb.ReplayBuffer(16, num_envs=4)
    if known:
        c.add(**one_step(4, 0))
        c.flush()
        local.add(**one_step(4, 0))
    bad = RAGGED[field](one_step(4, 1))
    with pytest.raises(ShapeError) as want:
        local.add(**bad)
    assert str(want.value).startswith(f"{field}=[")
    shards = svc.stats()["shards"]
    with pytest.raises(ShapeError) as got:
        c.add(**bad)
    assert str(got.value) == str(want.value)
    assert c.pending_rows == 0
    c.flush()
    assert svc.stats()["shards"] == shards


@pytest.mark.parametrize("call", ["add", "extend"])
def test_a_ragged_priority_while_no_shard_answers_is_the_one_ragged_error(
    services: Any, call: str
) -> None:
    """While no shard answers (the only one is dead, not restarted), the client reads
    ``priority`` with its own conversion, which caught numpy's ValueError for a ragged
    list and called it ``DtypeError: ... priorities must be numbers``. It is the one
    ragged check's ShapeError, worded as a shard-checked write's (priority_values), and
    nothing is queued; values that are not numbers are still a DtypeError."""
    import os
    import signal

    svc = start(services, 1, {"capacity": 16}, num_lanes=2, max_restarts=0)
    c = svc.client(max_rows=1)
    pid = svc.shard_pids()[0]
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    values = one_step(2, 0) if call == "add" else steps(2, 0, 1)
    write = getattr(c, call)
    with pytest.raises(ShapeError) as err:
        write(**values, priority=[[1.0], [1.0, 2.0]])
    assert str(err.value) == (
        f"{call}(priority=[[1.0], [1.0, 2.0]]): a ragged nest, rows of different lengths "
        "([1] has shape (2,) but [0] has shape (1,)); expected one priority per step (2 "
        "values) or one for all: pass a flat list or array of numbers, e.g. np.abs(td_errors)"
    )
    assert c.write_rule() is None  # (the path checked: no shard said its rule)
    assert c.pending_rows == 0
    with pytest.raises(DtypeError, match=rf"^{call}\(priority=\['a', 'b'\]\): priorities must"):
        write(**values, priority=["a", "b"])
    assert c.pending_rows == 0


@pytest.mark.parametrize("call", ["add", "extend"])
def test_ragged_env_ids_are_the_one_ragged_error(services: Any, call: str) -> None:
    """The client read ``env_ids`` with np.asarray (distributed.writer.lanes_of), so a
    ragged list was numpy's bare ValueError naming nothing; it is the one ragged check's
    ShapeError naming the call and ``env_ids``, and nothing is queued or stored."""
    svc = start(services, 2, {"capacity": 16}, num_lanes=2)
    c = svc.client(max_rows=1)
    values = one_step(2, 0) if call == "add" else steps(2, 0, 1)
    shards = svc.stats()["shards"]
    with pytest.raises(ShapeError) as err:
        getattr(c, call)(**values, env_ids=[[0], [0, 1]])
    assert str(err.value).startswith(
        f"{call}(env_ids=[[0], [0, 1]]): a ragged nest, rows of different lengths ([1] has "
        "shape (2,) but [0] has shape (1,)); expected [k] distinct lane ids"
    ), str(err.value)
    assert c.pending_rows == 0
    c.flush()
    assert svc.stats()["shards"] == shards


def test_bad_rows_are_refused_before_the_shards_have_a_spec(services: Any) -> None:
    """The first call implies the spec (as one buffer's first add does); a later call of
    another shape is refused by the client before anything reaches a shard."""
    svc = start(services, 2, {"capacity": 64}, num_lanes=2)
    c = svc.client(max_age_s=60.0)
    c.add(**one_step(2, 0))
    with pytest.raises(ShapeError, match="obs="):
        c.add(**_shape(one_step(2, 1)))
    assert c.pending_rows == 2
    with pytest.raises(ConfigError, match="no priorities"):
        c.add(**one_step(2, 1), priority=1.0)
    c.add(**one_step(2, 1))
    c.flush()
    assert len(c) == 4 and svc.stats()["inserts"] == 4


def test_rows_a_shard_still_refuses_are_reported_once_and_never_by_a_later_call(
        services: Any) -> None:
    """Two writers race to define the spec: the loser's queued rows are refused by the
    shards. Its flush reports that once (naming the call), raises nothing, and its later
    valid calls store exactly their rows."""
    svc = start(services, 2, {"capacity": 64}, num_lanes=2)
    late = svc.client("late", max_age_s=60.0)
    first = svc.client("first", max_age_s=60.0)
    late.add(**_shape(one_step(2, 0)))  # obs of 3: the spec late infers (no shard has one)
    late.add(**_shape(one_step(2, 1)))
    first.add(**one_step(2, 0))  # obs of 2 reaches the shards first
    first.flush()
    with pytest.warns(RowsRejectedWarning) as got:
        late.flush()  # both shards refuse both calls: reported once per call
    messages = [str(w.message) for w in got]
    assert len(messages) == 2, messages
    assert "add call 1" in messages[0] and "add call 2" in messages[1]
    assert all("shards [0, 1]" in m and "obs=" in m for m in messages)
    assert sorted(late.rejected) == [1, 2]
    assert len(late) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        late.flush()  # nothing is reported twice
        # the client now checks against the spec the shards hold
        with pytest.raises(ShapeError, match="obs="):
            late.add(**_shape(one_step(2, 2)))
        late.add(**one_step(2, 1))
        late.flush()
    assert len(late) == 4 and svc.stats()["inserts"] == 4


def test_a_refused_call_in_a_batch_keeps_the_other_calls_rows(services: Any) -> None:
    """A view that reshapes the inputs (frame stacks): the shard checks the fields, and
    refuses only the bad call of a batch; the rest of the batch is stored."""
    svc = start(services, 2, {"capacity": 64, "frame_stack": 2}, num_lanes=2)
    c = svc.client(max_age_s=60.0)
    c.add(**one_step(2, 0))
    c.flush()
    floats = {**one_step(2, 1), "action": np.ones(2)}  # integral floats: cast to int64
    c.add(**floats)
    c.add(**_fraction(floats))  # action 1.5: refused by the shards
    c.add(**{**one_step(2, 2), "action": np.ones(2)})
    assert c.pending_rows == 6
    with pytest.warns(RowsRejectedWarning, match=r"add call 3 .*action=") as got:
        c.flush()
    assert len(got) == 1
    assert sorted(c.rejected) == [3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c.add(**one_step(2, 3))
        c.flush()
    assert len(c) == 2 + 2 + 2 + 2 and svc.stats()["inserts"] == 8


def test_a_shard_writes_the_calls_of_a_refused_batch_one_by_one() -> None:
    """The shard itself (no Ray): a batch of three calls whose second the buffer refuses
    stores the first and third, in order, and names the second."""
    from replaybank.distributed.shard import Shard, ShardSpec
    from replaybank.distributed.writer import RowBatcher

    shard = Shard(ShardSpec(index=0, num_shards=1, config={"capacity": 16}, lanes=2))
    batcher = RowBatcher(num_shards=1, max_rows=100, max_age_s=60.0)
    for number, t in ((1, 0), (2, 1), (3, 2)):
        rows = {k: v.astype(np.float64) if k == "action" else v
                for k, v in steps(2, t, t + 1).items()}
        if number == 2:
            rows["action"] = rows["action"] + 0.5  # not integral: refused
        batcher.append(rows, np.arange(2), None, steps=True, call=("extend", number))
    first = steps(2, 9, 10)  # sets the spec: int64 actions
    assert shard.extend_now({"env_ids": [0, 1], "values": first, "priority": None}) == []
    batcher.close_all()
    payload = batcher.take(0)
    assert payload is not None and [c[0] for c in payload["calls"]] == [
        ("extend", 1), ("extend", 2), ("extend", 3)]
    refused = shard.extend_now(payload)
    assert [(call, rows) for call, rows, _ in refused] == [(("extend", 2), 2)]
    assert "action=" in str(refused[0][2])
    stored = shard.buf.table.arrays["obs"][:3, :, 0].tolist()  # [T, lanes]
    assert stored == [[9.0, 1009.0], [0.0, 1000.0], [2.0, 1002.0]]
    assert shard.inserts == 6
