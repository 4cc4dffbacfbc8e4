"""Unit tests of the core pieces: specs, casting, Batch, ring math, memory check, sampling."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.errors import CapacityError, DtypeError, SpecError
from replaybank.ops import ring
from replaybank.samplers.base import LaneView
from replaybank.spec import FieldSpec, Spec, cast_field, flatten, unflatten


# --------------------------------------------------------------------------- spec
def test_infer_keeps_array_dtypes_and_uses_rl_defaults() -> None:
    spec = Spec.infer({"obs": np.zeros((2, 2), np.uint8), "f64": np.zeros(3),
                       "r": 1.0, "a": 3, "d": True, "lst": [1.0, 2.0], "i8": np.int8(1)})
    assert spec["obs"] == FieldSpec("obs", (2, 2), np.dtype(np.uint8))
    assert spec["f64"].dtype == np.float64  # an explicit float64 array stays float64
    assert spec["r"].dtype == np.float32 and spec["r"].shape == ()
    assert spec["a"].dtype == np.int64
    assert spec["d"].dtype == np.bool_
    assert spec["lst"].dtype == np.float32 and spec["lst"].shape == (2,)
    assert spec["i8"].dtype == np.int8


def test_infer_strips_leading_dims() -> None:
    spec = Spec.infer({"obs": np.zeros((5, 2, 3), np.float32)}, leading=(5, 2))
    assert spec["obs"].shape == (3,)
    with pytest.raises(rb.ShapeError, match="leading dims"):
        Spec.infer({"obs": np.zeros((4, 3))}, leading=(5,))


def test_flatten_unflatten_round_trip() -> None:
    nested = {"obs": {"observation": 1, "goal": {"a": 2, "b": 3}}, "r": 4}
    flat = flatten(nested)
    assert flat == {"obs/observation": 1, "obs/goal/a": 2, "obs/goal/b": 3, "r": 4}
    assert unflatten(flat) == nested
    assert flatten(flat) == flat  # idempotent
    for bad in ({"": 1}, {"a//b": 1}, {"a": {}}, {3: 1}):
        with pytest.raises(SpecError):
            flatten(bad)  # type: ignore[arg-type]


def test_tree_map_walks_nested_dicts_only() -> None:
    """The spec's tree_map (the pytorchrl front end and the distributed writer walk dict
    observations with it): only dicts are walked, other leaves (a mapping proxy too) are
    given to the function whole."""
    from types import MappingProxyType

    from replaybank.spec import tree_map

    obs = {"a": np.zeros((2, 3)), "b": {"c": np.ones(2)}}
    shapes = tree_map(np.shape, obs)
    assert shapes == {"a": (2, 3), "b": {"c": (2,)}}
    proxy = MappingProxyType({"x": 1})
    assert tree_map(len, {"p": proxy, "q": [1, 2]}) == {"p": 1, "q": 2}


def test_spec_coerce_json_and_duplicates() -> None:
    spec = Spec.coerce({"obs": {"image": ((4, 4), "uint8"), "vec": {"shape": [3],
                                                                    "dtype": "float32"}},
                        "action": FieldSpec("x", (2,), np.float32)})
    assert list(spec) == ["obs/image", "obs/vec", "action"]
    assert spec["action"].name == "action"
    assert Spec.from_json(spec.to_json()) == spec
    assert spec.nbytes_per_item == 16 + 12 + 8
    with pytest.raises(SpecError, match="twice"):
        Spec([FieldSpec("a", (), np.float32), FieldSpec("a", (), np.float32)])
    with pytest.raises(SpecError):
        Spec.coerce({"obs": 3})


@pytest.mark.parametrize("spec, match", [
    # a misspelt or extra key of a field mapping: dropped or read as a nested field before
    ({"obs": {"shape": [3], "dtype": "float32", "dtpye": "x"}}, r"unknown key 'dtpye'"),
    ({"obs": {"shape": [3], "dtpye": "float32"}}, r"'dtpye' \(did you mean 'dtype'\?\)"),
    ({"obs": {"shape": [3], "dtype": "float32", "low": 0}}, r"unknown key 'low'"),
    ({"obs": {"shape": [3]}}, r"no 'dtype'"),
    # a dtype numpy does not know, a shape that is no tuple of ints: TypeError before
    ({"obs": {"shape": [3], "dtype": "flaot32"}}, r"did you mean 'float32'"),
    ({"obs": ((3,), "flaot32")}, r"dtype='flaot32'"),
    ({"obs": ("abc", "float32")}, r"shape='abc'.*tuple of ints"),
    ({"obs": ([3.5], "float32")}, r"shape=\[3.5\].*tuple of ints"),
])
def test_spec_coerce_refuses_what_it_cannot_mean(spec: dict, match: str) -> None:
    """Every misspelling of a field is refused with a SpecError naming it, through
    ``ReplayBuffer(spec=...)`` as through ``Spec.coerce``."""
    with pytest.raises(SpecError, match=match):
        Spec.coerce(spec)
    with pytest.raises(SpecError, match=match):
        rb.ReplayBuffer(8, spec=spec)


def test_spec_coerce_reads_an_int_shape_and_a_group_with_a_field_named_shape() -> None:
    """One int is a 1-D shape (as numpy reads it); a nested group may hold fields named
    ``shape`` or ``dtype`` (written as entries, not ints or dtypes)."""
    assert Spec.coerce({"obs": (3, "float32")})["obs"].shape == (3,)
    spec = Spec.coerce({"obs": {"pos": ((3,), "float32"), "shape": ((2,), "int64")}})
    assert list(spec) == ["obs/pos", "obs/shape"]
    assert spec["obs/shape"].dtype == np.int64


@pytest.mark.parametrize("value, dtype, expect", [
    (np.zeros(3, np.uint8), np.uint8, np.uint8),
    (1.5, np.float32, np.float32),
    ([1.0, 2.0, 3.0], np.float32, np.float32),
    (np.zeros(3), np.float32, np.float32),  # float64 -> float32: same kind
    (2.0, np.int64, np.int64),  # an integral float is accepted for an int field
    (np.array([1, 2, 3]), np.uint8, np.uint8),  # in-range ints into uint8
    (1, np.bool_, np.bool_),
    (3, np.float32, np.float32),
])
def test_cast_field_keeps_the_field_dtype(value: Any, dtype: Any, expect: Any) -> None:
    shape = np.shape(value)
    out = cast_field("x", value, FieldSpec("x", shape, np.dtype(dtype)), ())
    assert out.dtype == expect and out.shape == shape
    np.testing.assert_array_equal(out, np.asarray(value).astype(expect))


def test_cast_field_no_copy_when_matching() -> None:
    arr = np.zeros((2, 3), np.float32)
    assert cast_field("obs", arr, FieldSpec("obs", (3,), np.dtype(np.float32)), (2,)) is arr


def test_cast_field_rejects_unsafe() -> None:
    f = FieldSpec("a", (), np.dtype(np.int32))
    for bad in (0.5, float("nan"), float("inf"), 2**40, "1"):
        with pytest.raises(DtypeError, match="a="):
            cast_field("a", bad, f, ())


def test_buffer_never_widens_to_float64() -> None:
    buf = rb.ReplayBuffer(capacity=10, seed=0)
    for _ in range(3):
        buf.add(obs=[0.0, 1.0], action=1, reward=0.5, next_obs=[1.0, 2.0], terminated=0,
                truncated=False, logp=-0.1, image=np.zeros((2, 2), np.uint8))
    b = buf.sample(4)
    assert b.obs.dtype == b.next_obs.dtype == b.reward.dtype == b.logp.dtype == np.float32
    assert b.image.dtype == np.uint8 and b.action.dtype == np.int64
    assert b.terminated.dtype == b.truncated.dtype == np.bool_
    assert all(a.dtype != np.float64 for a in buf.table.arrays.values())


# --------------------------------------------------------------------------- batch
def make_batch() -> rb.Batch:
    return rb.Batch({"obs/observation": np.arange(6, dtype=np.float32).reshape(2, 3),
                     "obs/goal": np.zeros((2, 1), np.float32),
                     "reward": np.ones(2, np.float32), "terminated": np.array([True, False]),
                     "truncated": np.array([False, True]), "logp": np.zeros(2, np.float32),
                     "indices": np.array([3, 4])})


def test_batch_access() -> None:
    b = make_batch()
    assert b.reward is b["reward"]
    assert b.logp is b["logp"]
    assert set(b.obs) == {"observation", "goal"}  # nested prefix -> dict
    assert b["obs"]["observation"].shape == (2, 3)
    assert b.done.tolist() == [True, True]
    assert b.batch_size == 2
    assert "obs" in b and "obs/goal" in b and "nope" not in b
    assert b.to_dict()["obs"]["goal"].shape == (2, 1)
    assert set(b.to_dict(nested=False)) == set(b)
    with pytest.raises(KeyError, match="available"):
        b["nope"]
    with pytest.raises(AttributeError, match="no field 'nope'"):
        _ = b.nope


def test_batch_is_frozen() -> None:
    b = make_batch()
    with pytest.raises(AttributeError, match="frozen"):
        b.reward = np.zeros(2)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del b.reward
    with pytest.raises(TypeError):
        b["reward"] = 1  # type: ignore[index]
    assert b == make_batch()


def test_batch_to_torch_zero_copy() -> None:
    torch = pytest.importorskip("torch")
    b = make_batch()
    t = b.to_torch()
    assert isinstance(t, rb.Batch)
    assert isinstance(t.reward, torch.Tensor)
    assert t.reward.data_ptr() == b.reward.ctypes.data  # no copy on CPU
    assert t["obs/observation"].data_ptr() == b["obs/observation"].ctypes.data
    assert t.reward.dtype == torch.float32 and t.terminated.dtype == torch.bool


def test_sampled_batch_to_torch() -> None:
    torch = pytest.importorskip("torch")
    buf = rb.ReplayBuffer(capacity=8, seed=0)
    buf.extend(obs=np.zeros((4, 3), np.float32), action=np.zeros(4, np.int64),
               reward=np.zeros(4, np.float32), next_obs=np.ones((4, 3), np.float32),
               terminated=np.zeros(4, bool), truncated=np.zeros(4, bool))
    t = buf.sample(5).to_torch()
    assert t.obs.shape == (5, 3) and t.next_obs.dtype == torch.float32


# --------------------------------------------------------------------------- ring math
def random_lanes(rng: np.random.Generator, T: int, lanes: int) -> tuple[Any, Any]:  # noqa: N803
    written = rng.integers(0, 4 * T, size=lanes)
    counts = np.minimum(written, rng.integers(0, T + 1, size=lanes))
    return written.astype(np.int64), counts.astype(np.int64)


@pytest.mark.parametrize("seed", range(20))
def test_ring_against_loops(seed: int) -> None:
    rng = np.random.default_rng(seed)
    T, lanes = int(rng.integers(1, 7)), int(rng.integers(1, 5))  # noqa: N806
    written, counts = random_lanes(rng, T, lanes)
    live_keys, live_slots = [], []
    for lane in range(lanes):
        for s in range(int(written[lane] - counts[lane]), int(written[lane])):
            live_keys.append(s * lanes + lane)
            live_slots.append((s % T) * lanes + lane)
    live_keys_a = np.array(live_keys, dtype=np.int64)
    # key -> slot, slot -> key, liveness
    assert ring.key_to_slot(live_keys_a, T, lanes).tolist() == live_slots
    if live_slots:
        assert ring.slot_to_key(np.array(live_slots), written, counts, T).tolist() == live_keys
    all_keys = np.arange(-3, (4 * T + 2) * lanes)
    expect = [k >= 0 and int(written[k % lanes] - counts[k % lanes]) <= k // lanes
              < int(written[k % lanes]) for k in all_keys.tolist()]
    assert ring.is_live(all_keys, written, counts).tolist() == expect
    # flat positions -> keys: lane by lane, oldest first
    offsets = [0]
    for c in counts.tolist():
        offsets.append(offsets[-1] + c)
    assert ring.lane_offsets(counts).tolist() == offsets
    flat = np.arange(int(counts.sum()))
    assert ring.uniform_keys(flat, written, counts).tolist() == live_keys
    # equal counts use a search-free path: same answer
    eq = np.full(lanes, int(counts.min()))
    w2 = np.maximum(written, eq)
    loop = [(int(w2[lane] - eq[lane]) + p) * lanes + lane
            for lane in range(lanes) for p in range(int(eq[lane]))]
    assert ring.uniform_keys(np.arange(int(eq.sum())), w2, eq).tolist() == loop


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), lanes=st.integers(1, 40), T=st.integers(1, 60),
       equal=st.booleans())
def test_keys_and_slots_match_numpy_formulas(seed: int, lanes: int, T: int,  # noqa: N803
                                             equal: bool) -> None:
    """uniform_keys and key_to_slot (one C pass where built) against their numpy formulas,
    lanes equally full or not; negative keys follow numpy's floor division."""
    rng = np.random.default_rng(seed)
    written, counts = random_lanes(rng, T, lanes)
    if equal:
        counts[:] = counts.min()
    total = int(counts.sum())
    if total:
        flat = rng.integers(0, total, size=int(rng.integers(0, 300))).astype(np.int64)
        starts = ring.lane_offsets(counts)
        lane = np.searchsorted(starts, flat, side="right") - 1
        want = (written[lane] - counts[lane] + flat - starts[lane]) * lanes + lane
        assert ring.uniform_keys(flat, written, counts).tolist() == want.tolist()
    # keys about 2**51, where the C pass's reciprocal division hands over to the machine's,
    # and up to 2**62
    keys = np.concatenate([rng.integers(0, 2**40, 20), 2**51 + rng.integers(-99, 99, 20),
                           rng.integers(0, 2**62, 10), rng.integers(-50, 0, 3)])
    keys = keys.astype(np.int64)
    for k in (keys[:50], keys):  # all >= 0 (C), and with negatives (numpy)
        assert ring.key_to_slot(k, T, lanes).tolist() == \
            (k // lanes % T * lanes + k % lanes).tolist()


# --------------------------------------------------------------------------- memory check
def test_memory_check_names_both_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    from replaybank.storage.backends import base as backend

    monkeypatch.setattr(backend, "available_memory", lambda: 123_456)
    buf = rb.ReplayBuffer(capacity=100_000, seed=0)
    with pytest.raises(CapacityError) as info:
        buf.add(obs=np.zeros(8, np.float32), action=0, reward=0.0,
                next_obs=np.zeros(8, np.float32), terminated=False, truncated=False)
    msg = str(info.value)
    assert "123,456" in msg  # available
    needed = int(msg.split(" needs ")[1].split(" bytes")[0].replace(",", ""))
    assert needed >= 100_000 * (8 * 4 + 8 + 4 + 2)  # obs once + action + reward + flags
    assert "lower capacity" in msg
    assert buf.spec is None  # nothing allocated
    with pytest.raises(CapacityError, match="123,456"):
        rb.ReplayBuffer(capacity=100_000, spec={"obs": ((8,), "float32"),
                                                "action": ((), "int64")})


# --------------------------------------------------------------------------- sampling
def async_buffer(seed: int = 0) -> rb.ReplayBuffer:
    """Three lanes with different fill levels (one wrapped)."""
    buf = rb.ReplayBuffer(capacity=30, num_envs=3, seed=seed)
    rng = np.random.default_rng(1)
    for lane, n in ((0, 4), (1, 13), (2, 7)):
        for _ in range(n):
            o = rng.standard_normal(2).astype(np.float32)
            buf.add(env_ids=[lane], obs=o[None], action=np.zeros((1, 1), np.float32),
                    reward=np.zeros(1, np.float32), next_obs=o[None] + 1,
                    terminated=np.zeros(1, bool), truncated=np.zeros(1, bool))
    return buf


@pytest.mark.statistical
@pytest.mark.parametrize("kind", ["one lane", "equal lanes", "unequal lanes"])
def test_uniform_over_all_live_steps(kind: str) -> None:
    if kind == "one lane":
        buf = rb.ReplayBuffer(capacity=25, seed=3)
        buf.extend(obs=np.zeros((40, 1), np.float32), action=np.zeros(40, np.float32),
                   reward=np.zeros(40, np.float32), next_obs=np.zeros((40, 1), np.float32),
                   terminated=np.zeros(40, bool), truncated=np.zeros(40, bool))
    elif kind == "equal lanes":
        buf = rb.ReplayBuffer(capacity=24, num_envs=3, seed=3)
        buf.extend(obs=np.zeros((11, 3, 1), np.float32), action=np.zeros((11, 3), np.float32),
                   reward=np.zeros((11, 3), np.float32),
                   next_obs=np.zeros((11, 3, 1), np.float32),
                   terminated=np.zeros((11, 3), bool), truncated=np.zeros((11, 3), bool))
    else:
        buf = async_buffer(seed=3)
    t = buf.table
    live = [s * t.lanes + lane for lane in range(t.lanes)
            for s in range(int(t.written[lane] - t.counts[lane]), int(t.written[lane]))]
    assert len(live) == len(buf)
    draws = np.concatenate([buf.sample(1000).indices for _ in range(40)])
    assert set(draws.tolist()) <= set(live)
    counts = np.array([(draws == k).sum() for k in live], dtype=np.float64)
    expected = len(draws) / len(live)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # critical values of chi-square at p = 0.001 for df = k - 1 (k = 25, 24, 21 live steps)
    critical = {24: 51.18, 23: 49.73, 20: 45.31}[len(live) - 1]
    assert chi2 < critical, (chi2, critical)


def test_replace_false_gives_distinct_indices() -> None:
    buf = async_buffer()
    for b in (1, 5, len(buf)):
        idx = buf.sample(b, replace=False).indices
        assert len(set(idx.tolist())) == b
    assert sorted(buf.sample(len(buf), replace=False).indices.tolist()) == sorted(
        set(buf.sample(len(buf), replace=False).indices.tolist()))


def test_sampler_directly_with_lane_view() -> None:
    lv = LaneView(T=4, lanes=2, written=np.array([6, 2]), counts=np.array([4, 2]))
    keys = rb.UniformSampler().sample(200, lv, np.random.default_rng(0)).keys
    assert ring.is_live(keys, lv.written, lv.counts).all()
    assert set(keys.tolist()) == {4, 6, 8, 10, 1, 3}


def test_seeding_is_reproducible() -> None:
    a, b, c = async_buffer(seed=7), async_buffer(seed=7), async_buffer(seed=8)
    ba, bb, bc = a.sample(64), b.sample(64), c.sample(64)
    assert ba == bb
    assert not np.array_equal(ba.indices, bc.indices)
    g = np.random.default_rng(5)
    buf = rb.ReplayBuffer(capacity=6, seed=g)
    assert buf.rng is g
    buf2 = rb.ReplayBuffer(capacity=6, seed=np.random.default_rng(5))
    for x in (buf, buf2):
        x.extend(obs=np.zeros((6, 1), np.float32), action=np.zeros(6, np.float32),
                 reward=np.arange(6, dtype=np.float32), next_obs=np.zeros((6, 1), np.float32),
                 terminated=np.zeros(6, bool), truncated=np.zeros(6, bool))
    assert buf.sample(10) == buf2.sample(10)


# --------------------------------------------------------------------------- fast paths
def test_fast_and_general_paths_store_identical_bytes() -> None:
    rng = np.random.default_rng(0)
    fast = rb.ReplayBuffer(capacity=12, seed=0)
    slow = rb.ReplayBuffer(capacity=12, seed=0)
    obs = rng.standard_normal(3).astype(np.float32)
    for t in range(30):
        nxt = rng.standard_normal(3).astype(np.float32) if t % 7 == 3 else obs + 1
        term, trunc = t % 9 == 4, t % 11 == 5
        kw = {"obs": obs, "action": np.float32(t), "reward": float(t) / 3,
              "next_obs": nxt, "terminated": term, "truncated": trunc,
              "logp": np.array(-t, np.float32)}
        fast.add(**kw)
        slow.add(**{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in kw.items()})
        obs = rng.standard_normal(3).astype(np.float32) if (term or trunc or t % 5 == 0) \
            else nxt
    a, b = fast.state_dict()["table"], slow.state_dict()["table"]
    assert a.keys() == b.keys()
    for k in a:
        if k.startswith("side/"):
            continue  # slot numbering may differ; contents are compared through gather
        assert a[k].tobytes() == b[k].tobytes(), k
    keys = np.arange(30 - 12, 30)
    ga, gb = fast.view.gather(fast.table, keys), slow.view.gather(slow.table, keys)
    for k in ga:
        assert ga[k].tobytes() == gb[k].tobytes(), k


def test_fast_extend_matches_add() -> None:
    rng = np.random.default_rng(1)
    n = 50
    data = {"obs": rng.standard_normal((n, 2)).astype(np.float32),
            "action": rng.integers(0, 4, size=n), "reward": rng.standard_normal(n).astype(
                np.float32), "terminated": rng.random(n) < 0.1,
            "truncated": rng.random(n) < 0.05}
    data["next_obs"] = np.roll(data["obs"], -1, axis=0)
    data["next_obs"][::6] += 1  # out of order now and then
    a = rb.ReplayBuffer(capacity=20, seed=0)
    b = rb.ReplayBuffer(capacity=20, seed=0)
    for i in range(0, n, 7):
        a.extend(**{k: v[i:i + 7] for k, v in data.items()})
    for i in range(n):
        b.add(**{k: v[i] for k, v in data.items()})
    keys = np.arange(n - 20, n)
    ga, gb = a.view.gather(a.table, keys), b.view.gather(b.table, keys)
    for k in ga:
        assert ga[k].tobytes() == gb[k].tobytes(), k
    assert a.table.side_in_use() == b.table.side_in_use()


@pytest.mark.parametrize("seed", range(30))
def test_chunk_breaks_against_loop(seed: int) -> None:
    from replaybank.ops.continuity import bitwise_equal_rows, chunk_breaks

    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(2, 40)), int(rng.integers(1, 4))
    obs = rng.integers(0, 3, size=(n, m, 2)).astype(np.float32)
    nxt = np.roll(obs, -1, axis=0).copy()
    jump = rng.random((n, m)) < rng.choice([0.0, 0.1, 0.5])
    nxt[jump] = rng.integers(0, 3, size=(int(jump.sum()), 2)).astype(np.float32)
    done = rng.random((n, m)) < rng.choice([0.0, 0.05, 0.3, 0.8])
    got = chunk_breaks(["obs"], {"obs": obs}, {"obs": nxt}, done)
    want = np.zeros((n, m), dtype=bool)
    for t in range(n):
        for lane in range(m):
            want[t, lane] = t == n - 1 or bool(done[t, lane]) or \
                nxt[t, lane].tobytes() != obs[t + 1, lane].tobytes()
    if got is None:
        got = np.zeros((n, m), dtype=bool)
        got[-1] = True
    assert got.tolist() == want.tolist()
    rows = bitwise_equal_rows(nxt.reshape(n * m, 2), np.roll(obs, -1, axis=0).reshape(n * m, 2))
    assert rows.tolist() == [a.tobytes() == b.tobytes() for a, b in
                             zip(nxt.reshape(n * m, 2), np.roll(obs, -1, axis=0).reshape(n * m, 2),
                                 strict=True)]


class RecordingSampler(rb.UniformSampler):
    """A uniform sampler that records every on_write (as a priority sampler needs)."""

    def __init__(self) -> None:
        self.written: list[int] = []

    def on_write(self, slots: Any, priorities: Any = None) -> None:
        self.written.extend(np.asarray(slots).tolist())


@pytest.mark.parametrize("lanes", [1, 2])
def test_every_write_path_notifies_the_sampler(lanes: int) -> None:
    rec = RecordingSampler()
    buf = rb.ReplayBuffer(capacity=6 * lanes, num_envs=lanes, seed=0, sampler=rec)
    lead = () if lanes == 1 else (lanes,)
    one = {"obs": np.zeros((*lead, 2), np.float32), "action": np.zeros(lead, np.float32),
           "reward": np.zeros(lead, np.float32), "next_obs": np.ones((*lead, 2), np.float32),
           "terminated": np.zeros(lead, bool), "truncated": np.zeros(lead, bool)}
    expect: list[int] = []
    seq = 0
    for _ in range(4):  # add (first: general path, then the fast path)
        buf.add(**one)
        expect += [(seq % 6) * lanes + lane for lane in range(lanes)]
        seq += 1
    buf.extend(**{k: np.stack([v] * 5) for k, v in one.items()})  # fast extend, wraps
    expect += [(s % 6) * lanes + lane for s in range(seq, seq + 5) for lane in range(lanes)]
    assert rec.written == expect
    # swapping the sampler tells the new one of every live step, oldest first, and
    # rebuilds the fast path for it
    rec2 = RecordingSampler()
    buf.sampler = rec2
    live = [(s % 6) * lanes + lane for s in range(3, 9) for lane in range(lanes)]
    assert rec2.written == live
    buf.add(**one)
    assert rec2.written == live + [(9 % 6) * lanes + lane for lane in range(lanes)]


def test_load_state_into_buffer_with_larger_side_store() -> None:
    small = rb.ReplayBuffer(capacity=1000, seed=0)
    big = rb.ReplayBuffer(capacity=1000, seed=0)
    for i in range(10):
        small.add(obs=np.full(2, i, np.float32), action=0.0, reward=0.0,
                  next_obs=np.full(2, i + 1, np.float32), terminated=False, truncated=False)
    for i in range(300):  # every step out of order: big's side store grows
        big.add(obs=np.full(2, i, np.float32), action=0.0, reward=0.0,
                next_obs=np.full(2, -i, np.float32), terminated=False, truncated=False)
    assert big.table.side_capacity > small.table.side_capacity
    big.load_state_dict(small.state_dict())
    assert len(big) == 10 and big.table.side_in_use() == 1
    b = big.sample(64)
    assert np.all(b.next_obs[:, 0] == b.obs[:, 0] + 1)


@pytest.mark.parametrize("call", ["add", "extend"])
def test_one_env_with_a_lane_dim_of_one(call: str) -> None:
    """One env may pass values with the lane dim (``[T, 1, ...]`` / ``[1, ...]``): the
    spec keeps scalar flags, and every next_obs comes back exactly."""
    rng = np.random.default_rng(4)
    n = 12
    o = rng.standard_normal((n + 1, 1, 3)).astype(np.float32)
    nxt = o[1:].copy()
    term = np.zeros((n, 1), bool)
    term[4, 0] = True
    nxt[4] = rng.standard_normal((1, 3)).astype(np.float32)  # the true final obs
    kw = {"obs": o[:-1], "action": np.arange(n, dtype=np.int64)[:, None],
          "reward": np.ones((n, 1), np.float32), "next_obs": nxt, "terminated": term,
          "truncated": np.zeros((n, 1), bool)}
    buf = rb.ReplayBuffer(capacity=32, seed=0)
    if call == "extend":
        buf.extend(**kw)
        buf.extend(**{k: v[:3] for k, v in kw.items()})  # and again, through the fast path
    else:
        for i in range(n):
            buf.add(**{k: v[i] for k, v in kw.items()})
    assert buf.spec is not None and buf.spec["terminated"].shape == ()
    assert buf.spec["obs"].shape == (3,)
    got = buf.table.gather_next("obs", np.arange(n))
    assert got.tobytes() == nxt[:, 0].tobytes()
    assert buf.episodes_seen == 1


def test_flags_with_a_per_step_shape_are_rejected() -> None:
    buf = rb.ReplayBuffer(capacity=8, seed=0)
    o = np.zeros((4, 3), np.float32)
    with pytest.raises(rb.ShapeError, match=r"terminated: inferred per-step shape \(2,\)"):
        buf.extend(obs=o, action=np.zeros(4), reward=np.zeros(4), next_obs=o,
                   terminated=np.zeros((4, 2), bool), truncated=np.zeros(4, bool))
    assert buf.spec is None and len(buf) == 0


def test_a_vector_envs_first_add_without_num_envs_says_which() -> None:
    """Four envs' values added to a buffer built for one: the refusal names num_envs=4."""
    buf = rb.ReplayBuffer(capacity=8, seed=0)
    o = np.zeros((4, 3), np.float32)
    with pytest.raises(rb.ShapeError, match=r"if they are 4 envs' flags, build the buffer "
                                            r"with num_envs=4"):
        buf.add(obs=o, action=np.zeros(4), reward=np.zeros(4), next_obs=o,
                terminated=np.zeros(4, bool), truncated=np.zeros(4, bool))
    assert buf.spec is None and len(buf) == 0


@pytest.mark.parametrize("kwargs", [{}, {"n_step": 3}])
def test_a_reward_with_a_per_step_shape_is_refused_at_the_first_add(kwargs: dict) -> None:
    """A ``[1]`` reward beside an obs without the env dim was stored with shape ``(1,)``
    and every later ``sample`` failed with a numpy broadcast error (n-step too). It is
    refused at the first add (and at ``spec=``), naming the fix; nothing is stored."""
    buf = rb.ReplayBuffer(16, seed=0, **kwargs)
    o = np.zeros(3, np.float32)
    step = dict(obs=o, action=np.zeros(2, np.float32), next_obs=o, terminated=False,
                truncated=False)
    with pytest.raises(rb.ShapeError, match=r"reward: per-step shape \(1,\); expected one "
                                            r"number per step.*reward\[0\]"):
        buf.add(reward=np.array([1.0], np.float32), **step)
    assert buf.spec is None and len(buf) == 0
    for _ in range(4):
        buf.add(reward=1.0, **step)
    assert buf.sample(3).reward.shape == (3,)
    with pytest.raises(rb.ShapeError, match="if they are 2 envs' rewards, build the buffer "
                                            "with num_envs=2"):
        rb.ReplayBuffer(8, spec={"obs": ((3,), "float32"), "action": ((2,), "float32"),
                                 "reward": ((2,), "float32")})
