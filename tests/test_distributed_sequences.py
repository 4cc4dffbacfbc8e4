"""R2D2 sequence priorities through the sharded replay service.

``client.update_sequence_priorities(batch.starts, td, eta=..., mask=batch.mask)`` after
``client.sample_sequences``: the priorities the shards store equal one buffer's (and a
plain-loop oracle of ``eta * max|td| + (1 - eta) * mean|td|``); stale and retired starts
are skipped and not counted; a bad call is refused before any shard changes; torch
tensors that require grad are accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.distributed.keys import group_rows_by_shard, to_global
from replaybank.errors import ConfigError, DtypeError, ShapeError
from tests.distributed_ray import start, steps

ray = pytest.importorskip("ray")

PER = {"type": "prioritized", "alpha": 0.6, "beta": 0.4, "kernel": "numpy"}
#: stored priority == raw priority, so totals read the raw priorities back
PLAIN = {"type": "prioritized", "alpha": 1.0, "eps": 0.0, "kernel": "numpy"}


def step_ids(x: np.ndarray) -> np.ndarray:
    """The unique step ids (``1000 * lane + t``) of ``obs`` rows (``steps`` data)."""
    return np.asarray(x[..., 0], np.float64).astype(np.int64)


def start_ids(batch: Any) -> np.ndarray:
    """The step id of each window's first step."""
    return step_ids(batch.obs[:, 0])


def lanes_with_episode_ends() -> dict[str, Any]:
    """16 steps of 4 lanes; lanes 1 and 2 end an episode inside, so windows drawn with
    ``strict=False`` are padded there (``mask`` False)."""
    data = steps(4, 0, 16)
    data["terminated"][6, 1] = True
    data["terminated"][9, 2] = True
    return data


def oracle(td: np.ndarray, mask: np.ndarray, eta: float) -> dict[int, float]:
    """R2D2 priorities by row, in a plain loop: rows without a counted step are absent."""
    out = {}
    for b in range(td.shape[0]):
        vals = [abs(float(td[b, j])) for j in range(td.shape[1]) if mask[b, j]]
        if vals:
            out[b] = eta * max(vals) + (1.0 - eta) * sum(vals) / len(vals)
    return out


def shard_totals(svc: Any) -> list[float]:
    return [s["total"] for s in svc.stats()["shards"]]


def test_a_ragged_row_block_is_named_by_group_rows_by_shard() -> None:
    """group_rows_by_shard read each block's rows with np.shape, so a ragged block was
    numpy's bare ``ValueError: setting an array element with a sequence``; it is the one
    ragged check's ShapeError, naming the block, its value and the first unlike row."""
    keys = np.array([0, 3])
    with pytest.raises(ShapeError) as err:
        group_rows_by_shard(keys, [np.zeros((2, 2)), [[True], [True, False]]], 2)
    msg = str(err.value)
    assert msg.startswith(
        "group_rows_by_shard: rows[1]=[[True], [True, False]]: a ragged nest, rows of "
        "different lengths ([1] has shape (2,) but [0] has shape (1,)); expected [B=2, ...]"
    ), msg
    out = group_rows_by_shard(keys, [np.arange(4.0).reshape(2, 2), [[True], [False]]], 2)
    assert {s: (k.tolist(), [r.tolist() for r in rows]) for s, (k, rows) in out.items()} == {
        0: ([0], [[[0.0, 1.0]], [[True]]]),
        1: ([1], [[[2.0, 3.0]], [[False]]]),
    }


def test_priorities_equal_one_buffers_and_the_r2d2_oracle(services: Any) -> None:
    """Differential: a 2-shard PER service and one PER buffer hold the same 4 lanes;
    the same windows get the same TD errors and mask (then, without a mask, a second
    batch); every step's stored priority is the same in both and the oracle's."""
    cfg: dict[str, Any] = {"capacity": 64, "seed": 0, "sampler": PER}
    svc = start(services, 2, cfg, num_lanes=4, seed=0)
    single = rb.from_config({**cfg, "capacity": 128, "num_envs": 4})
    data = lanes_with_episode_ends()
    prio = np.random.default_rng(0).uniform(0.1, 5.0, (16, 4))
    client = svc.client(max_rows=17)
    client.extend(**data, priority=prio)
    single.extend(**data, priority=prio)
    client.flush()
    # one buffer's key of step (lane, t): seq * lanes + lane with seq = t (no wrap yet)
    ref = single.sample(64)
    np.testing.assert_array_equal(ref.indices, step_ids(ref.obs) % 1000 * 4
                                  + step_ids(ref.obs) // 1000)

    def single_keys(ids: np.ndarray) -> np.ndarray:
        return np.asarray(ids % 1000 * 4 + ids // 1000, np.int64)

    rng = np.random.default_rng(1)
    expected: dict[int, float] = {}  # step id -> raw R2D2 priority (the last write wins)
    # round 1: padded windows with burn-in, the batch's mask with some steps cleared,
    # and one row with no counted step (left unchanged)
    batch = client.sample_sequences(24, 4, strict=False, burn_in=1)
    assert not batch.mask.all() and batch.burn_in[:, 0].all()
    td = rng.normal(size=batch.mask.shape) * 3.0
    mask = batch.mask & (rng.random(batch.mask.shape) < 0.8)
    mask[0] = False
    ids = start_ids(batch)
    n = client.update_sequence_priorities(batch.starts, td, eta=0.9, mask=mask)
    n_single = single.update_sequence_priorities(single_keys(ids), td, eta=0.9, mask=mask)
    rows = oracle(td, mask, 0.9)
    assert n == n_single == len(rows) == int(mask.any(axis=1).sum())
    for b, p in rows.items():
        expected[int(ids[b])] = p
    # round 2: full windows, no mask (every step counts), another eta
    batch = client.sample_sequences(16, 3)
    td = rng.normal(size=(16, 3))
    ids = start_ids(batch)
    n = client.update_sequence_priorities(batch.starts, td, eta=0.5)
    assert n == single.update_sequence_priorities(single_keys(ids), td, eta=0.5) == 16
    for b, p in oracle(td, np.ones((16, 3), bool), 0.5).items():
        expected[int(ids[b])] = p
    # one buffer's stored priorities, by step id (slot == key: no wrap)
    alpha, eps = single.sampler.alpha, single.sampler.eps
    stored = single.sampler.priorities(np.arange(128))
    by_id = {lane * 1000 + t: float(stored[t * 4 + lane])
             for lane in range(4) for t in range(16)}
    for i, p in expected.items():
        assert by_id[i] == pytest.approx((p + eps) ** alpha, rel=1e-12)
    # the service's: each shard's total (shard s holds the lanes l with l % 2 == s) ...
    totals = shard_totals(svc)
    for s in (0, 1):
        mine = sum(v for i, v in by_id.items() if i // 1000 % 2 == s)
        assert totals[s] == pytest.approx(mine, rel=1e-12)
    # ... and every item's, read from the probabilities of following samples
    # (p_i / total), windows and single steps
    total = sum(totals)
    seen = set()
    for b in (client.sample_sequences(64, 2), client.sample(2048)):
        got = step_ids(b.obs[:, 0]) if b.obs.ndim == 3 else step_ids(b.obs)
        np.testing.assert_allclose(b.probabilities * total, [by_id[i] for i in got.tolist()],
                                   rtol=1e-12)
        seen.update(got.tolist())
    assert set(expected) <= seen  # every updated start was read back


def test_stale_starts_are_ignored_and_not_counted(services: Any) -> None:
    svc = start(services, 2, {"capacity": 8, "sampler": PLAIN}, num_lanes=2, seed=3)
    c = svc.client(max_rows=1)
    c.extend(**steps(2, 0, 8), priority=1.0)
    c.flush()
    batch = c.sample_sequences(24, 3)
    ids = start_ids(batch)
    # overwrite the three oldest steps of lane 0 (shard 0): windows starting there are stale
    c.extend(**{k: v[:, :1] for k, v in steps(2, 8, 11).items()}, env_ids=[0], priority=1.0)
    c.flush()
    assert shard_totals(svc) == pytest.approx([8.0, 8.0])
    stale = np.isin(ids, [0, 1, 2])
    assert 0 < stale.sum() < len(ids)
    n = c.update_sequence_priorities(batch.starts, np.full((24, 3), 2.0), eta=0.9)
    assert n == int((~stale).sum())
    # the live starts now hold 2.0, the stale ones changed nothing (their slots hold the
    # new steps at 1.0)
    live = set(ids[~stale].tolist())
    want = [8.0 + sum(1 for i in live if i // 1000 == s) for s in (0, 1)]
    assert shard_totals(svc) == pytest.approx(want)
    # only stale starts: nothing applied
    assert c.update_sequence_priorities(batch.starts[stale], np.ones((int(stale.sum()), 3))) \
        == 0
    assert shard_totals(svc) == pytest.approx(want)


def test_retired_starts_stay_retired(services: Any) -> None:
    """With ``max_times_sampled`` the shard's bookkeeping is kept: a start drawn that
    often is never revived by a sequence priority update (as ``update_priorities``)."""
    svc = start(services, 2, {"capacity": 8, "sampler": PLAIN}, num_lanes=2, seed=4,
                max_times_sampled=1)
    c = svc.client(max_rows=1)
    c.extend(**steps(2, 0, 8), priority=1.0)
    c.flush()
    batch = c.sample_sequences(3, 2)
    ids = set(start_ids(batch).tolist())
    before = shard_totals(svc)
    assert sum(before) == pytest.approx(16.0 - len(ids))  # drawn once: retired (0)
    assert c.update_sequence_priorities(batch.starts, np.full((3, 2), 5.0)) == 0
    assert shard_totals(svc) == before
    # a start of lane 0 (shard 0, its only lane) that was not drawn still takes one
    t = next(t for t in range(7) if t not in ids)
    key = to_global(np.array([t]), shard=0, num_shards=2)
    assert c.update_sequence_priorities(key, np.full((1, 2), 5.0)) == 1
    assert shard_totals(svc) == pytest.approx([before[0] + 4.0, before[1]])


def test_bad_calls_raise_before_any_shard_changes(services: Any) -> None:
    svc = start(services, 2, {"capacity": 8, "sampler": PLAIN}, num_lanes=2, seed=5)
    c = svc.client(max_rows=1)
    c.extend(**steps(2, 0, 8), priority=1.0)
    c.flush()
    batch = c.sample_sequences(8, 3)
    starts = batch.starts
    on_shard_1 = np.flatnonzero(starts % 2 == 1)
    assert len(on_shard_1) and len(on_shard_1) < 8  # rows for both shards
    good = np.ones((8, 3))
    before = svc.stats()["shards"]
    call = c.update_sequence_priorities
    with pytest.raises(DtypeError, match=r"starts=array\(shape=\(8,\), dtype=float64\)"):
        call(starts.astype(np.float64), good)
    with pytest.raises(ShapeError, match=r"td_errors=array\(shape=\(8, 3\).*\[B=16, L\]"):
        call(np.stack([starts, starts], axis=1), good)  # [B, 2]: 16 starts
    with pytest.raises(ConfigError, match=r"\[-2\] are negative"):
        call(np.where(np.arange(8) == 7, -2, starts), good)
    with pytest.raises(ShapeError, match=r"td_errors=array\(shape=\(7, 3\).*\[B=8, L\]"):
        call(starts, good[:7])
    with pytest.raises(ShapeError, match=r"td_errors=array\(shape=\(8,\)"):
        call(starts, good[:, 0])
    with pytest.raises(DtypeError, match=r"td_errors=.*real numbers"):
        call(starts, np.full((8, 3), "x"))
    with pytest.raises(ShapeError, match=r"windows sampled have \[3\] steps"):
        call(starts, np.ones((8, 4)))  # no mask: L must be a drawn window's width
    with pytest.raises(ShapeError, match=r"mask=array\(shape=\(8, 2\).*\(8, 3\)"):
        call(starts, good, mask=np.ones((8, 2), bool))
    for eta in (1.5, -0.1, True, "0.9", float("nan")):
        with pytest.raises(ConfigError, match=r"eta=.*\[0, 1\]"):
            call(starts, good, eta=eta)
    # NaN or inf counted only in rows of shard 1: shard 0's rows are fine, yet nothing
    # is sent to it either
    for bad in (np.nan, np.inf):
        td = good.copy()
        td[on_shard_1[0], 1] = bad
        with pytest.raises(DtypeError, match=rf"NaN or inf \(rows \[{on_shard_1[0]}\]\)"):
            call(starts, td)
    # a priority the shards cannot store (sum tree bound, alpha 1: 1e300 / 8 slots)
    td = good.copy()
    td[on_shard_1[0]] = 1e300
    with pytest.raises(DtypeError, match="exceed"):
        call(starts, td)
    # ragged lists: one buffer's ShapeError, naming the argument (starts were numpy's
    # bare ValueError, priorities a DtypeError, indices a bare ValueError)
    ragged_keys = [starts[:1].tolist(), starts[1:3].tolist()]
    with pytest.raises(ShapeError, match=r"^update_sequence_priorities\(starts=.*rows of "
                       r"different lengths.*batch\.starts"):
        call(ragged_keys, good[:2])
    with pytest.raises(ShapeError, match=r"^update_sequence_priorities\(td_errors=.*rows of "
                       "different lengths"):
        call(starts[:2], [[1.0, 1.0, 1.0], [1.0]])
    with pytest.raises(ShapeError, match=r"^update_priorities\(indices=.*rows of different "
                       r"lengths.*batch\.indices"):
        c.update_priorities(ragged_keys, [1.0, 1.0])
    with pytest.raises(ShapeError, match=r"^update_priorities\(priorities=.*rows of "
                       "different lengths"):
        c.update_priorities(starts[:2], [[1.0], [1.0, 2.0]])
    assert svc.stats()["shards"] == before  # no shard changed
    # a NaN where the mask is False does not count
    td = good.copy()
    td[on_shard_1[0], 1] = np.nan
    mask = np.ones((8, 3), bool)
    mask[on_shard_1[0], 1] = False
    assert call(starts, td, mask=mask) == 8
    # a sampler without priorities: refused on the client, as one buffer does
    uni = start(services, 1, {"capacity": 8})
    u = uni.client(max_rows=1)
    u.extend(**{k: v[:, 0] for k, v in steps(1, 0, 8).items()})  # one lane: [T, ...]
    u.flush()
    sb = u.sample_sequences(2, 3)
    with pytest.raises(ConfigError, match="no priorities"):
        u.update_sequence_priorities(sb.starts, np.ones((2, 3)))


def outcome(call: Callable[[], Any]) -> tuple[str, str]:
    """The error type and whole message of ``call``, or ``("accepted", repr(result))``."""
    try:
        result = call()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "accepted", repr(result)


def _half(b: int) -> np.ndarray:
    m = np.ones((b, 3))
    m[0, 1] = 0.5  # a loss weight, not a mask
    return m


def _nan(b: int) -> np.ndarray:
    td = np.ones((b, 3))
    td[1, 2] = np.nan
    return td


def _negative_in_an_empty_row(k: np.ndarray) -> tuple[Any, Any, Any]:
    mask = np.ones((len(k), 3), bool)
    mask[-1] = False  # the row of the negative start counts no step
    return np.r_[k[:-1], -3], np.ones((len(k), 3)), mask


#: update_sequence_priorities calls a local buffer refuses (or accepts), as
#: (name, starts -> (starts, td_errors, mask)) from 4 sampled starts of width 3
SEQUENCE_UPDATES: list[tuple[str, Callable[[np.ndarray], tuple[Any, Any, Any]]]] = [
    ("[B, 1] starts", lambda k: (k[:, None], np.full((len(k), 3), 2.0), None)),
    ("float mask 0.5", lambda k: (k, np.ones((len(k), 3)), _half(len(k)))),
    ("float 0/1 mask", lambda k: (k, np.full((len(k), 3), 2.0), np.ones((len(k), 3)))),
    ("ragged td_errors", lambda k: (k[:2], [[1.0, 1.0, 1.0], [1.0]], None)),
    ("mask of the wrong shape", lambda k: (k, np.ones((len(k), 3)), np.ones((len(k), 2), bool))),
    ("NaN td_errors", lambda k: (k, _nan(len(k)), None)),
    ("negative starts", lambda k: (np.r_[k[:-1], -3], np.ones((len(k), 3)), None)),
    ("a negative start in a row that counts nothing", _negative_in_an_empty_row),
    ("float starts", lambda k: (k.astype(np.float64), np.ones((len(k), 3)), None)),
]


@pytest.mark.parametrize("case", [c[0] for c in SEQUENCE_UPDATES])
def test_update_sequence_priorities_refuses_what_one_buffer_refuses(
    services: Any, case: str
) -> None:
    """The client checked update_sequence_priorities with copies of its own: it refused
    [B, 1] starts that one buffer flattens, turned a float mask of 0.5 into True where one
    buffer raises DtypeError, and worded every other refusal differently (one buffer even
    named update_priorities(indices=...) for a negative start, and let one through in a
    row that counts no step). Both now run buffers.sequences.checked_window_updates: the
    same error type and message, the same count when accepted, and no shard changes when
    refused."""
    make = dict(SEQUENCE_UPDATES)[case]
    svc = start(services, 2, {"capacity": 8, "sampler": PLAIN}, num_lanes=2, seed=0)
    c = svc.client(max_rows=1)
    c.extend(**steps(2, 0, 8))
    c.flush()
    local = rb.ReplayBuffer(
        16, num_envs=2, seed=0, sampler=rb.PrioritizedSampler(alpha=1.0, eps=0.0, kernel="numpy")
    )
    local.extend(**steps(2, 0, 8))
    c_starts, l_starts = c.sample_sequences(4, 3).starts, local.sample_sequences(4, 3).starts
    before = svc.stats()["shards"]
    want = outcome(lambda: local.update_sequence_priorities(*make(l_starts)[:2],
                                                            mask=make(l_starts)[2]))
    got = outcome(lambda: c.update_sequence_priorities(*make(c_starts)[:2],
                                                       mask=make(c_starts)[2]))
    assert got == want
    if want[0] == "accepted":  # applied on the shards: the updated starts went 1 -> 2
        assert sum(shard_totals(svc)) == pytest.approx(16.0 + len(np.unique(c_starts)))
    else:
        assert svc.stats()["shards"] == before


def test_torch_tensors_requiring_grad_are_accepted(services: Any) -> None:
    torch = pytest.importorskip("torch")
    svc = start(services, 2, {"capacity": 64, "sampler": PER}, num_lanes=4, seed=6)
    c = svc.client(max_rows=8)
    c.extend(**lanes_with_episode_ends())
    c.flush()
    batch = c.sample_sequences(16, 4, strict=False)
    before = shard_totals(svc)
    td = (torch.randn(batch.mask.shape, dtype=torch.float32) * 2.0).requires_grad_()
    loss = td.pow(2).sum()  # a learner's graph hangs off the TD errors
    n = c.update_sequence_priorities(torch.as_tensor(batch.starts), td, eta=0.8,
                                     mask=torch.as_tensor(batch.mask))
    assert n == int(batch.mask.any(axis=1).sum()) > 0
    after = shard_totals(svc)
    assert after != pytest.approx(before)
    loss.backward()  # the graph is intact
    # the same values as numpy set the same priorities: nothing moves
    assert c.update_sequence_priorities(batch.starts, td.detach().numpy(), eta=0.8,
                                        mask=batch.mask) == n
    assert shard_totals(svc) == pytest.approx(after, rel=1e-12)
