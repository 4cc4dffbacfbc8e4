"""RolloutBuffer: storage, exact GAE at episode ends, minibatch generators, state."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.errors import (
    BufferChangedError,
    CapacityError,
    CheckpointError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    ShapeError,
    SpecError,
)

GOLDEN = [2.92979974325, 2.1624665, 2.093, 0.88317375, 1.0475]


def oracle_gae(rew: Any, val: Any, term: Any, trunc: Any, last: Any, final: Any,
               gamma: float, lam: float) -> np.ndarray:
    """Plain loops from the definition (independent of replaybank.ops.gae)."""
    steps, envs = len(rew), len(rew[0])
    adv = np.zeros((steps, envs))
    for e in range(envs):
        running = 0.0
        for t in reversed(range(steps)):
            if term[t][e]:
                next_v, running = 0.0, 0.0
            elif trunc[t][e]:
                next_v, running = float(final[t][e]), 0.0
            else:
                next_v = float(last[e]) if t == steps - 1 else float(val[t + 1][e])
            running = float(rew[t][e]) + gamma * next_v - float(val[t][e]) + gamma * lam * running
            adv[t][e] = running
    return adv


def snapshot(buf: rb.RolloutBuffer) -> dict[str, Any]:
    state = buf.state_dict()
    arrays = {k: np.array(v, copy=True) for k, v in state["arrays"].items()}
    return {"meta": json.dumps(state["metadata"]), "rng": json.dumps(state["rng"]),
            "arrays": arrays}


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["meta"] == b["meta"] and a["rng"] == b["rng"]
    assert set(a["arrays"]) == set(b["arrays"])
    for k in a["arrays"]:
        np.testing.assert_array_equal(a["arrays"][k], b["arrays"][k])


def golden_buffer(**kw: Any) -> rb.RolloutBuffer:
    buf = rb.RolloutBuffer(5, gamma=0.99, gae_lambda=0.95, **kw)
    rew, val = [1.0, 0.0, 2.0, 0.0, 1.0], [0.5, 0.4, 0.6, 0.3, 0.2]
    for t in range(5):
        buf.add(obs=np.array([float(t)]), action=0, reward=np.float64(rew[t]),
                terminated=False, truncated=t == 2, value=np.float64(val[t]),
                log_prob=0.0, final_value=0.7 if t == 2 else None)
    return buf


def fill(buf: rb.RolloutBuffer, seed: int = 0, p_end: float = 0.2,
         hidden: bool = False, dtype: Any = np.float64) -> dict[str, np.ndarray]:
    """Random multi-env rollout; returns what was added, stacked ``[T, envs]``."""
    rng = np.random.default_rng(seed)
    steps, envs = buf.num_steps, buf.num_envs
    log: dict[str, list[Any]] = {k: [] for k in ("rew", "val", "term", "trunc", "fv")}
    for t in range(steps):
        term = rng.random(envs) < p_end
        trunc = rng.random(envs) < p_end
        rew, val = rng.normal(size=envs).astype(dtype), rng.normal(size=envs).astype(dtype)
        fv = rng.normal(size=envs)
        extras = {"hidden": np.full((envs, 2), float(t))} if hidden else {}
        buf.add(obs={"pos": np.stack([np.full(3, t * 10 + e, np.float32) for e in range(envs)]),
                     "goal": np.zeros((envs, 1), np.float32)},
                action=rng.integers(0, 4, envs), reward=rew, terminated=term, truncated=trunc,
                value=val, log_prob=rng.normal(size=envs), final_value=fv, **extras)
        for k, v in zip(log, (rew, val, term, trunc, fv), strict=True):
            log[k].append(v)
    return {k: np.array(v) for k, v in log.items()}


# ------------------------------------------------------------------ GAE through the buffer
def test_golden_values_with_final_value() -> None:
    buf = golden_buffer()
    assert buf.spec is not None and buf.spec["value"].dtype == np.float64
    buf.compute_returns_and_advantage(last_values=0.25)
    assert buf.advantages.dtype == np.float64 and buf.advantages.shape == (5, 1)
    np.testing.assert_allclose(buf.advantages[:, 0], GOLDEN, rtol=0, atol=1e-9)
    values = np.array([0.5, 0.4, 0.6, 0.3, 0.2])
    np.testing.assert_allclose(buf.returns[:, 0], np.array(GOLDEN) + values, rtol=0, atol=1e-9)


def test_golden_values_with_final_obs_and_value_fn() -> None:
    buf = rb.RolloutBuffer(5, gamma=0.99, gae_lambda=0.95)
    rew, val = [1.0, 0.0, 2.0, 0.0, 1.0], [0.5, 0.4, 0.6, 0.3, 0.2]
    for t in range(5):
        buf.add(np.array([float(t)]), 0, np.float64(rew[t]), False, t == 2,
                np.float64(val[t]), 0.0, final_obs=np.array([42.0]) if t == 2 else None)
    seen: list[np.ndarray] = []

    def value_fn(obs: np.ndarray) -> np.ndarray:
        seen.append(obs)
        return np.where(obs[:, 0] == 42.0, 0.7, np.nan)

    with pytest.raises(ShapeError, match=r"value_fn=None.*step 2, env 0"):
        buf.compute_returns_and_advantage(0.25)
    buf.compute_returns_and_advantage(0.25, value_fn=value_fn)
    assert seen[0].shape == (1, 1)
    np.testing.assert_allclose(buf.advantages[:, 0], GOLDEN, rtol=0, atol=1e-9)


@pytest.mark.parametrize("backend", ["numpy", "auto"])
def test_multi_env_matches_oracle(backend: str) -> None:
    buf = rb.RolloutBuffer(24, num_envs=4, gamma=0.97, gae_lambda=0.9, seed=0,
                           spec={"obs": ((2,), "float64"), "action": ((), "int64"),
                                 "reward": ((), "float64"), "value": ((), "float64")},
                           backend=backend)  # type: ignore[arg-type]
    rng = np.random.default_rng(1)
    log: dict[str, list[Any]] = {k: [] for k in ("rew", "val", "term", "trunc", "fv")}
    fobs_values: dict[float, float] = {}
    for t in range(24):
        term, trunc = rng.random(4) < 0.2, rng.random(4) < 0.25
        rew, val, fv = rng.normal(size=4), rng.normal(size=4), rng.normal(size=4)
        # envs 0, 1 give final_value; envs 2, 3 give final_obs (key -> value via value_fn)
        given = np.where(np.arange(4) < 2, fv, np.nan)
        fobs = np.stack([np.full(2, 1000.0 * t + e) for e in range(4)])
        for e in (2, 3):
            fobs_values[1000.0 * t + e] = float(fv[e])
        buf.add(np.zeros((4, 2)), rng.integers(0, 3, 4), rew, term, trunc, val,
                np.zeros(4), final_value=given, final_obs=fobs)
        for k, v in zip(log, (rew, val, term, trunc, fv), strict=True):
            log[k].append(v)
    last = rng.normal(size=4)
    buf.compute_returns_and_advantage(
        last, value_fn=lambda o: np.array([fobs_values[float(k)] for k in o[:, 0]]))
    a = {k: np.array(v) for k, v in log.items()}
    want = oracle_gae(a["rew"], a["val"], a["term"], a["trunc"], last, a["fv"], 0.97, 0.9)
    assert a["trunc"].any() and a["term"].any()
    np.testing.assert_allclose(buf.advantages, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(buf.returns, want + a["val"], rtol=1e-12, atol=1e-12)


def test_float32_values_give_float32_outputs_computed_in_float64() -> None:
    buf = rb.RolloutBuffer(6, num_envs=3, seed=0)
    a = fill(buf, dtype=np.float32)
    buf.compute_returns_and_advantage(np.zeros(3))
    assert buf.advantages.dtype == np.float32
    want = oracle_gae(a["rew"].astype(np.float32), a["val"].astype(np.float32), a["term"],
                      a["trunc"], np.zeros(3), a["fv"], 0.99, 0.95)
    np.testing.assert_allclose(buf.advantages, want.astype(np.float32), rtol=1e-6, atol=1e-6)


def test_gymnasium_style_final_obs_list() -> None:
    buf = rb.RolloutBuffer(2, num_envs=3)
    buf.add(np.zeros((3, 2)), np.zeros(3, int), np.ones(3), np.array([False, False, True]),
            np.array([False, True, True]), np.zeros(3), np.zeros(3),
            final_obs=[None, np.array([5.0, 5.0]), None])  # env 2 terminated: not needed
    buf.add(np.zeros((3, 2)), np.zeros(3, int), np.ones(3), np.zeros(3, bool),
            np.zeros(3, bool), np.zeros(3), np.zeros(3))
    calls: list[Any] = []
    buf.compute_returns_and_advantage(
        np.zeros(3), value_fn=lambda o: calls.append(o.copy()) or np.array([2.0]))
    assert calls[0].tolist() == [[5.0, 5.0]]
    gamma = 0.99
    assert buf.advantages[0, 1] == pytest.approx(1 + gamma * 2.0)
    assert buf.advantages[0, 2] == pytest.approx(1.0)


# ------------------------------------------------------------------ storage and errors
def test_nested_obs_extras_and_shapes() -> None:
    buf = rb.RolloutBuffer(4, num_envs=2)
    fill(buf, hidden=True)
    assert buf.full and len(buf) == 8
    assert buf.spec is not None
    assert list(buf.spec)[:2] == ["obs/pos", "obs/goal"] and "hidden" in buf.spec
    assert buf.data["obs/pos"].shape == (4, 2, 3) and buf.data["hidden"].shape == (4, 2, 2)
    assert buf.data["terminated"].dtype == np.bool_ and buf.data["reward"].dtype == np.float64


def test_single_env_accepts_scalars_and_leading_one() -> None:
    buf = rb.RolloutBuffer(2)
    buf.add(np.zeros(3), 1, 1.0, False, False, 0.5, -0.1)
    buf.add(np.ones((1, 3)), [0], [0.0], [True], [False], [0.2], [-0.3])
    assert buf.data["obs"].shape == (2, 1, 3) and buf.data["action"][:, 0].tolist() == [1, 0]
    batched_first = rb.RolloutBuffer(2)  # the first add may carry the env dim too
    batched_first.add(np.ones((1, 3)), [0], [0.0], [True], [False], [0.2], [-0.3])
    batched_first.add(np.zeros(3), 1, 1.0, False, False, 0.5, -0.1)
    assert batched_first.spec == buf.spec


def test_full_buffer_raises_until_reset() -> None:
    buf = golden_buffer()
    before = snapshot(buf)
    with pytest.raises(CapacityError, match=r"rollout is full \(5 steps x 1 envs\).*reset\(\)"):
        buf.add(np.zeros(1), 0, 0.0, False, False, 0.0, 0.0)
    assert_same(before, snapshot(buf))
    buf.reset()
    assert buf.pos == 0 and len(buf) == 0
    buf.add(np.zeros(1), 0, 0.0, False, False, 0.0, 0.0)
    assert buf.pos == 1


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(obs=np.zeros((2, 4))), ShapeError, r"obs.*expected shape \(2, 3\)"),
    (dict(action=np.array([0.5, 1.0])), DtypeError, "action"),
    (dict(extra_field=np.zeros(2)), SpecError, r"unknown \['extra_field'\]"),
    (dict(truncated=np.array([True, False]), final_value=None), ShapeError,
     r"envs \[0\] were truncated but have no final_value"),
    (dict(truncated=np.array([True, False]), final_value=np.array([np.nan, 0.0])), ShapeError,
     "no final_value"),
    (dict(truncated=np.array([False, True]), final_value=None,
          final_obs=np.zeros((2, 5))), ShapeError, "final_obs"),
    (dict(final_value=np.zeros(3)), ShapeError, r"final_value=.*shape \(2,\)"),
    (dict(value=np.zeros((2, 1))), ShapeError, r"value="),
    (dict(terminated=np.array([2, 0])), DtypeError, "terminated"),
    (dict(advantages=np.zeros(2)), SpecError, "reserved"),
    # GAE reads every value: one NaN made every normalised advantage NaN (the probe)
    (dict(value=np.array([np.nan, 0.0])), DtypeError,
     r"^add\(value=.*values \[nan\] of env\(s\) \[0\] are NaN or infinite.*pass finite"),
    (dict(value=np.array([0.0, -np.inf])), DtypeError, r"values \[-inf\] of env\(s\) \[1\]"),
    (dict(value=np.array([0.0, np.nan], np.float32)), DtypeError, r"values \[nan\]"),
    # an infinite final_value was reported as missing ("no final_value (None or NaN)")
    (dict(truncated=np.array([True, False]), final_value=np.array([np.inf, 0.0])), DtypeError,
     r"^add\(final_value=.*values \[inf\] of truncated env\(s\) \[0\] are infinite; pass a "
     r"finite V\(final obs\)"),
])
def test_bad_add_is_rejected_and_leaves_buffer_unchanged(kwargs: dict[str, Any],
                                                         error: type, match: str) -> None:
    buf = rb.RolloutBuffer(3, num_envs=2)
    good = dict(obs=np.zeros((2, 3)), action=np.array([0, 1]), reward=np.ones(2),
                terminated=np.zeros(2, bool), truncated=np.zeros(2, bool), value=np.zeros(2),
                log_prob=np.zeros(2))
    buf.add(**good)
    before = snapshot(buf)
    with pytest.raises(error, match=match):
        buf.add(**{**good, **kwargs})
    assert_same(before, snapshot(buf))
    buf.add(**good)
    assert buf.pos == 2


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # 1e300 into float32
def test_non_finite_value_is_refused_on_the_plain_path_too() -> None:
    """One env, Python floats (the plain add path): NaN and inf values go to the checked
    path, which refuses them, as a float32 field's overflow of 1e300; a float64 field
    stores huge finite values."""
    buf = rb.RolloutBuffer(4)
    step = dict(obs=np.zeros(3), action=0, reward=1.0, terminated=False, truncated=False,
                log_prob=0.0)
    buf.add(**step, value=0.5)
    assert buf.spec is not None and buf.spec["value"].dtype == np.float32
    for bad in (float("nan"), float("inf"), np.array(np.nan), 1e300):
        with pytest.raises(DtypeError, match=r"env\(s\) \[0\] are NaN or infinite "
                                             r"\(stored as float32\)"):
            buf.add(**step, value=bad)
    assert buf.pos == 1
    # an infinite final_value of a step that is not truncated is not read
    buf.add(**step, value=0.5, final_value=float("inf"))
    buf.add(**step, value=0.5)
    buf.compute_returns_and_advantage(last_values=0.0)
    assert np.isfinite(buf.advantages).all()
    wide = rb.RolloutBuffer(2, spec={"obs": ((3,), np.float64), "action": ((), np.int64),
                                     "value": ((), np.float64)})
    wide.add(**step, value=np.array(1e300))  # its dot overflows: the checked path stores it
    wide.add(**step, value=1e300)
    assert wide.data["value"][:, 0].tolist() == [1e300, 1e300]


def test_bad_first_add_leaves_buffer_without_spec() -> None:
    buf = rb.RolloutBuffer(3, num_envs=2)
    with pytest.raises(ShapeError):
        buf.add(np.zeros((3, 3)), np.zeros(2, int), np.ones(2), np.zeros(2, bool),
                np.zeros(2, bool), np.zeros(2), np.zeros(2))
    assert buf.spec is None and buf.pos == 0
    with pytest.raises(SpecError, match="per-env shape"):
        buf.add(np.zeros((2, 3)), np.zeros(2, int), np.ones((2, 1)), np.zeros(2, bool),
                np.zeros(2, bool), np.zeros(2), np.zeros(2))
    assert buf.spec is None


def test_constructor_and_compute_errors() -> None:
    with pytest.raises(ConfigError, match="num_steps=0"):
        rb.RolloutBuffer(0)
    with pytest.raises(ConfigError, match=r"gamma=1\.5"):
        rb.RolloutBuffer(4, gamma=1.5)
    with pytest.raises(ConfigError, match="normalize_advantage='all'"):
        rb.RolloutBuffer(4, normalize_advantage="all")
    buf = rb.RolloutBuffer(4, num_envs=2)
    with pytest.raises(EmptyBufferError, match="empty"):
        buf.compute_returns_and_advantage(np.zeros(2))
    fill(buf)
    with pytest.raises(ShapeError, match=r"last_values=.*\(2,\)"):
        buf.compute_returns_and_advantage(np.zeros(3))
    with pytest.raises(DtypeError, match="finite"):
        buf.compute_returns_and_advantage(np.array([0.0, np.nan]))
    with pytest.raises(EmptyBufferError, match="compute_returns_and_advantage"):
        buf.generate_batches(num_mini_batch=2)
    with pytest.raises(EmptyBufferError, match="advantages: advantages are not computed"):
        _ = buf.advantages


# ------------------------------------------------------------------ minibatches
@pytest.mark.parametrize("sizes", [dict(num_mini_batch=4), dict(num_mini_batch=5),
                                   dict(mini_batch_size=7), dict(mini_batch_size=40)])
def test_minibatch_coverage_each_step_once_per_epoch(sizes: dict[str, int]) -> None:
    buf = rb.RolloutBuffer(8, num_envs=4, seed=3)
    fill(buf)
    buf.compute_returns_and_advantage(np.zeros(4))
    batches = list(buf.generate_batches(num_epochs=3, **sizes))
    per_epoch = len(batches) // 3
    for ep in range(3):
        idx = np.concatenate([b.indices for b in batches[ep * per_epoch:(ep + 1) * per_epoch]])
        assert sorted(idx.tolist()) == list(range(32))
    for b in batches:  # fields match the (step, env) named by the flat index
        t, e = np.divmod(b.indices, 4)
        np.testing.assert_array_equal(b["obs/pos"][:, 0], t * 10 + e)
        np.testing.assert_array_equal(b.returns, buf.returns[t, e])
        np.testing.assert_array_equal(b.reward, buf.data["reward"][t, e])
        assert b.obs["pos"].shape == (len(b.indices), 3)
    if "num_mini_batch" in sizes:
        assert per_epoch == sizes["num_mini_batch"]
        lens = [b.batch_size for b in batches]
        assert max(lens) - min(lens) <= 1
    orders = [np.concatenate([b.indices for b in batches[i * per_epoch:(i + 1) * per_epoch]])
              for i in range(3)]
    assert not np.array_equal(orders[0], orders[1])  # reshuffled every epoch


@settings(max_examples=30, deadline=None)
@given(steps=st.integers(1, 9), envs=st.integers(1, 4), by_count=st.booleans(),
       size=st.integers(1, 12), chunk=st.integers(1, 10), seed=st.integers(0, 99))
def test_coverage_property(steps: int, envs: int, by_count: bool, size: int, chunk: int,
                           seed: int) -> None:
    buf = rb.RolloutBuffer(steps, num_envs=envs, seed=seed)
    fill(buf, seed=seed)
    buf.compute_returns_and_advantage(np.zeros(envs))
    n, n_chunks = steps * envs, envs * -(-steps // chunk)
    flat_kw = {"num_mini_batch": min(size, n)} if by_count else {"mini_batch_size": size}
    idx = [b.indices for b in buf.generate_batches(**flat_kw)]
    assert sorted(np.concatenate(idx).tolist()) == list(range(n))
    seq_kw = {"num_mini_batch": min(size, n_chunks)} if by_count else {"mini_batch_size": size}
    seqs = list(buf.recurrent_generator(chunk_length=chunk, **seq_kw))
    got = np.concatenate([b.indices[b.mask] for b in seqs])
    assert sorted(got.tolist()) == list(range(n))
    assert sum(b.batch_size for b in seqs) == n_chunks


def test_minibatch_size_errors() -> None:
    buf = rb.RolloutBuffer(4, num_envs=2, seed=0)
    fill(buf)
    buf.compute_returns_and_advantage(np.zeros(2))
    with pytest.raises(ConfigError, match="give exactly one"):
        buf.generate_batches()
    with pytest.raises(ConfigError, match="give exactly one"):
        buf.generate_batches(num_mini_batch=2, mini_batch_size=4)
    with pytest.raises(EmptyBufferError, match=r"num_mini_batch=9.*only 8 steps"):
        buf.generate_batches(num_mini_batch=9)
    with pytest.raises(ConfigError, match="mini_batch_size=0"):
        buf.generate_batches(mini_batch_size=0)
    with pytest.raises(ConfigError, match="num_epochs=0"):
        buf.generate_batches(num_mini_batch=2, num_epochs=0)
    state = json.dumps(buf.state_dict()["rng"])
    assert state == json.dumps(buf.rng.bit_generator.state)  # failed calls drew nothing


@pytest.mark.parametrize("mode", ["batch", "minibatch", None])
def test_advantage_normalisation(mode: str | None) -> None:
    buf = rb.RolloutBuffer(16, num_envs=4, seed=1, normalize_advantage=mode,
                           advantage_eps=0.0)
    fill(buf)
    buf.compute_returns_and_advantage(np.zeros(4))
    raw = buf.advantages.astype(np.float64)
    batches = list(buf.generate_batches(num_mini_batch=4))
    allb = np.concatenate([b.advantages for b in batches]).astype(np.float64)
    idx = np.concatenate([b.indices for b in batches])
    flat_raw = raw.reshape(-1)[idx]
    if mode == "batch":  # population std over the whole rollout (ddof=0)
        want = (flat_raw - raw.mean()) / raw.std()
        np.testing.assert_allclose(allb, want, rtol=1e-5, atol=1e-5)
    elif mode == "minibatch":
        for b in batches:
            a = b.advantages.astype(np.float64)
            assert abs(a.mean()) < 1e-5 and abs(a.std() - 1) < 1e-5
        for sb in buf.recurrent_generator(num_mini_batch=2, chunk_length=5):
            a = sb.advantages[sb.mask].astype(np.float64)  # stats over valid steps only
            assert abs(a.mean()) < 1e-5 and abs(a.std() - 1) < 1e-5
            assert np.all(sb.advantages[~sb.mask] == 0)
    else:
        np.testing.assert_array_equal(allb, flat_raw)
    np.testing.assert_array_equal(buf.advantages, raw)  # stays raw


def test_seeded_batches_are_reproducible() -> None:
    def run(seed: int) -> list[list[int]]:
        buf = rb.RolloutBuffer(6, num_envs=2, seed=seed)
        fill(buf)
        buf.compute_returns_and_advantage(np.zeros(2))
        return [b.indices.tolist() for b in buf.generate_batches(mini_batch_size=4,
                                                                 num_epochs=2)]
    assert run(7) == run(7)
    assert run(7) != run(8)


def test_batches_to_torch() -> None:
    torch = pytest.importorskip("torch")
    buf = rb.RolloutBuffer(4, num_envs=2, seed=0)
    fill(buf, hidden=True)
    buf.compute_returns_and_advantage(np.zeros(2))
    b = next(buf.generate_batches(num_mini_batch=2))
    tb = b.to_torch("cpu")
    assert isinstance(tb.advantages, torch.Tensor) and tb.obs["pos"].shape == (4, 3)
    assert tb.advantages.dtype == torch.float64  # values were float64
    dev = rb.RolloutBuffer(4, num_envs=2, seed=0, device="cpu")
    fill(dev)
    dev.compute_returns_and_advantage(np.zeros(2))
    got = next(dev.generate_batches(mini_batch_size=3))
    assert isinstance(got.returns, torch.Tensor) and got.batch_size == 3
    seq = next(dev.recurrent_generator(num_mini_batch=1))
    assert isinstance(seq.mask, torch.Tensor)


# ------------------------------------------------------------------ recurrent minibatches
@pytest.mark.parametrize("chunk", [None, 3, 4])
def test_recurrent_chunks_cover_and_keep_time_order(chunk: int | None) -> None:
    steps, envs = 8, 3
    buf = rb.RolloutBuffer(steps, num_envs=envs, seed=2)
    a = fill(buf, hidden=True, p_end=0.3)
    buf.compute_returns_and_advantage(np.zeros(envs))
    length = steps if chunk is None else chunk
    n_chunks = envs * -(-steps // length)
    batches = list(buf.recurrent_generator(mini_batch_size=2, chunk_length=chunk,
                                           num_epochs=2))
    per_epoch = -(-n_chunks // 2)
    assert len(batches) == 2 * per_epoch
    done = a["term"] | a["trunc"]
    for ep in range(2):
        eb = batches[ep * per_epoch:(ep + 1) * per_epoch]
        idx = np.concatenate([b.indices[b.mask] for b in eb])
        assert sorted(idx.tolist()) == list(range(steps * envs))
    for b in batches:
        assert b.sequence_length == length and b.mask.shape == b.indices.shape
        for row in range(b.batch_size):
            valid = b.mask[row]
            assert valid[0] and valid.sum() == min(length, steps - b.starts[row] // envs)
            t, e = np.divmod(b.indices[row][valid], envs)
            assert np.all(e == e[0]) and np.all(np.diff(t) == 1)  # one env, time order
            assert b.starts[row] == t[0] * envs + e[0]
            np.testing.assert_array_equal(b.hidden[row], np.full(2, float(t[0])))
            np.testing.assert_array_equal(b["obs/pos"][row][valid][:, 0], t * 10 + e)
            np.testing.assert_allclose(b.advantages[row][valid],
                                       (buf.advantages[t, e] - buf.advantages.mean())
                                       / (buf.advantages.std() + 1e-8), rtol=1e-12, atol=1e-12)
            first = [True if tt == 0 else bool(done[tt - 1, e[0]]) for tt in t]
            assert b.is_first[row][valid].tolist() == first
            last = [bool(done[tt, e[0]]) for tt in t]
            last[-1] = True
            assert b.is_last[row][valid].tolist() == last
            assert b.is_terminal[row][valid].tolist() == a["term"][t, e[0]].tolist()
            assert not b.is_first[row][~valid].any() and np.all(b.indices[row][~valid] == -1)
            assert np.all(b["obs/pos"][row][~valid] == 0)


def test_recurrent_first_flags_carry_over_reset_and_nested_hidden() -> None:
    buf = rb.RolloutBuffer(2, num_envs=2, seed=0)
    for t in range(2):
        buf.add(np.zeros((2, 1)), np.zeros(2, int), np.zeros(2),
                np.array([False, t == 1]), np.zeros(2, bool), np.zeros(2), np.zeros(2),
                rnn={"h": np.full((2, 3), t), "c": np.full((2, 3), -t)})
    buf.reset()  # env 1 ended at the last step: its next rollout starts an episode
    for _ in range(2):
        buf.add(np.zeros((2, 1)), np.zeros(2, int), np.zeros(2), np.zeros(2, bool),
                np.zeros(2, bool), np.zeros(2), np.zeros(2),
                rnn={"h": np.ones((2, 3)), "c": np.ones((2, 3))})
    buf.compute_returns_and_advantage(np.zeros(2))
    with pytest.raises(SpecError, match="'hidden_x' is not a stored extra field"):
        buf.recurrent_generator(num_mini_batch=1, hidden_fields="hidden_x")
    b = next(buf.recurrent_generator(num_mini_batch=1, hidden_fields="rnn"))
    order = np.argsort(b.starts)
    assert b.is_first[order][:, 0].tolist() == [False, True]
    assert b.rnn["h"].shape == (2, 3) and b.rnn["c"].shape == (2, 3)
    b2 = next(buf.recurrent_generator(num_mini_batch=1))  # no 'hidden' field: rnn stays a series
    assert b2["rnn/h"].shape == (2, 2, 3)


# ------------------------------------------------------------------ state and config
def _generator(buf: rb.RolloutBuffer, kind: str) -> Any:
    if kind == "flat":
        return buf.generate_batches(num_mini_batch=4)
    return buf.recurrent_generator(num_mini_batch=4, chunk_length=2)


@pytest.mark.parametrize("kind", ["flat", "recurrent"])
@pytest.mark.parametrize("change", ["reset", "reset_and_adds", "recompute", "load"])
def test_a_generator_refuses_to_go_on_after_the_rollout_changed(kind: str,
                                                                change: str) -> None:
    """A minibatch generator resumed after the rollout changed under it raises
    ``BufferChangedError`` naming the fix, at the next ``next()``, instead of yielding
    steps of another rollout beside the old advantages. It used to go on: after
    ``reset()`` and 3 adds between batches, 2 of the 6 steps still yielded (flat) were
    steps of the new rollout; ``for b in gen: buf.reset()`` ran all 4 batches."""
    buf = rb.RolloutBuffer(8, num_envs=2, seed=0)
    fill(buf, seed=1)
    buf.compute_returns_and_advantage(np.zeros(2))
    saved = buf.state_dict()
    gen = _generator(buf, kind)
    first = next(gen)
    assert first.batch_size > 0
    if change == "reset":
        buf.reset()
    elif change == "reset_and_adds":
        buf.reset()
        for t in range(3):
            buf.add(obs={"pos": np.full((2, 3), 100.0 + t, np.float32),
                         "goal": np.zeros((2, 1), np.float32)}, action=[0, 0],
                    reward=[0.0, 0.0], terminated=[False, False], truncated=[False, False],
                    value=[0.0, 0.0], log_prob=[0.0, 0.0])
    elif change == "recompute":
        buf.compute_returns_and_advantage(np.ones(2))
    else:
        buf.load_state_dict(saved)
    call = "generate_batches" if kind == "flat" else "recurrent_generator"
    with pytest.raises(BufferChangedError, match=rf"RolloutBuffer\.{call}\(\): the rollout "
                       r"changed after this generator was made.*call " + call):
        next(gen)


@pytest.mark.parametrize("kind", ["flat", "recurrent"])
def test_a_loop_that_resets_inside_its_batches_is_refused_and_reads_go_on(kind: str) -> None:
    """``for b in buf.generate_batches(...): buf.reset()`` is refused at the second batch;
    calls that change nothing (``state_dict``, ``advantages``, a second generator) leave a
    running generator going, and a generator dropped before a change (``break``) is
    never resumed, so it raises nothing."""
    buf = rb.RolloutBuffer(8, num_envs=2, seed=0)
    fill(buf, seed=1)
    buf.compute_returns_and_advantage(np.zeros(2))
    got = []
    for b in _generator(buf, kind):
        buf.state_dict()
        _ = buf.advantages
        next(_generator(buf, kind))
        got.append(b)
    assert len(got) == 4
    for _b in _generator(buf, kind):
        break
    buf.reset()
    fill(buf, seed=3)
    buf.compute_returns_and_advantage(np.zeros(2))
    seen = 0
    with pytest.raises(BufferChangedError, match="Use the batches"):
        for _b in _generator(buf, kind):
            seen += 1
            buf.reset()
    assert seen == 1


def test_state_dict_round_trip_gives_identical_batches() -> None:
    buf = rb.RolloutBuffer(6, num_envs=2, seed=11)
    fill(buf, hidden=True)
    buf.compute_returns_and_advantage(np.ones(2))
    state = buf.state_dict()
    json.dumps({k: state[k] for k in ("metadata", "init", "rng")})  # JSON-able
    assert all(isinstance(v, np.ndarray) for v in state["arrays"].values())
    other = rb.RolloutBuffer(**buf.init_config())
    other.load_state_dict(state)
    assert_same(snapshot(buf), snapshot(other))
    for x, y in zip(buf.generate_batches(mini_batch_size=5, num_epochs=2),
                    other.generate_batches(mini_batch_size=5, num_epochs=2), strict=True):
        assert x == y


def test_state_dict_is_a_snapshot() -> None:
    """A kept state is the rollout at the call: a reset and a new rollout after it change
    neither its arrays nor what it loads (before, its arrays were the buffer's own)."""
    buf = rb.RolloutBuffer(6, num_envs=2, seed=11)
    fill(buf, hidden=True)
    buf.compute_returns_and_advantage(np.ones(2))
    state = buf.state_dict()
    want = snapshot(buf)
    buf.reset()
    fill(buf, hidden=True, seed=5)
    buf.compute_returns_and_advantage(np.zeros(2))
    other = rb.RolloutBuffer(**buf.init_config())
    other.load_state_dict(state)
    assert_same(want, snapshot(other))


def test_state_dict_round_trip_with_pending_final_obs() -> None:
    buf = rb.RolloutBuffer(3, num_envs=2, seed=0)
    buf.add(np.zeros((2, 2)), np.zeros(2, int), np.ones(2), np.zeros(2, bool),
            np.array([True, False]), np.zeros(2), np.zeros(2), final_obs=np.full((2, 2), 3.0))
    other = rb.RolloutBuffer(3, num_envs=2)
    other.load_state_dict(buf.state_dict())
    for b in (buf, other):
        b.add(np.zeros((2, 2)), np.zeros(2, int), np.ones(2), np.zeros(2, bool),
              np.zeros(2, bool), np.zeros(2), np.zeros(2))
        b.compute_returns_and_advantage(np.zeros(2), value_fn=lambda o: o[:, 0] * 2)
    np.testing.assert_array_equal(buf.advantages, other.advantages)
    assert buf.advantages[0, 0] == pytest.approx(1 + 0.99 * 6.0)


def test_load_state_dict_mismatch_is_rejected() -> None:
    buf = rb.RolloutBuffer(3, num_envs=2)
    fill(buf)
    other = rb.RolloutBuffer(4, num_envs=2)
    with pytest.raises(CheckpointError, match="num_steps=3 but this buffer has num_steps=4"):
        other.load_state_dict(buf.state_dict())
    spec_other = rb.RolloutBuffer(3, num_envs=2, spec={"obs": ((1,), "float32"),
                                                       "action": ((), "int64")})
    with pytest.raises(CheckpointError, match="spec"):
        spec_other.load_state_dict(buf.state_dict())


def test_config_is_json_and_rebuilds() -> None:
    buf = rb.RolloutBuffer(5, num_envs=3, gamma=0.9, gae_lambda=0.8, seed=4,
                           normalize_advantage="minibatch")
    fill(buf)
    cfg = buf.init_config()
    json.dumps(cfg)
    clone = rb.RolloutBuffer(**cfg)
    assert clone.spec == buf.spec and clone.init_config() == cfg
    model = buf.config()  # the validated pydantic model
    assert model.type == "RolloutBuffer" and model.num_envs == 3
    rebuilt = rb.from_config(model.model_dump())
    assert isinstance(rebuilt, rb.RolloutBuffer) and rebuilt.init_config() == cfg
    assert "RolloutBuffer(num_steps=5" in repr(buf)


def _assert_same_state(a: Any, b: Any, path: str = "") -> None:
    """Two state dicts are equal leaf by leaf (arrays exactly, NaN == NaN)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            _assert_same_state(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=path)
        assert np.asarray(a).dtype == np.asarray(b).dtype, path
    else:
        assert a == b or (a != a and b != b), path


@settings(max_examples=40, deadline=None)
@given(num_envs=st.integers(1, 3), steps=st.integers(1, 12), seed=st.integers(0, 2**16),
       batched=st.booleans())
def test_plain_adds_store_what_checked_adds_store(num_envs: int, steps: int, seed: int,
                                                  batched: bool) -> None:
    """Adds in exactly the stored format (the fast path: numpy arrays of the stored dtype,
    Python scalars with one env) leave the same state as the same values passed as lists
    and numpy scalars (the checked path), episode ends and truncations with final values
    included."""
    rng = np.random.default_rng(seed)
    spec = {"obs": ((3,), "float32"), "action": ((), "int64"), "value": ((), "float32"),
            "log_prob": ((), "float32")}
    fast = rb.RolloutBuffer(12, num_envs=num_envs, spec=spec, seed=0)
    slow = rb.RolloutBuffer(12, num_envs=num_envs, spec=spec, seed=0)
    for _ in range(steps):
        n = num_envs
        obs = rng.standard_normal((n, 3)).astype(np.float32)
        act = rng.integers(0, 5, n)
        rew = rng.standard_normal(n).astype(np.float32)
        term = rng.random(n) < 0.2
        trunc = rng.random(n) < 0.2
        val = rng.standard_normal(n).astype(np.float32)
        lp = rng.standard_normal(n).astype(np.float32)
        fv = np.where(trunc & ~term, 0.5, np.nan) if (trunc & ~term).any() else None
        if n == 1 and not batched:
            fast.add(obs=obs[0], action=int(act[0]), reward=float(rew[0]),
                     terminated=bool(term[0]), truncated=bool(trunc[0]),
                     value=val[0:1].reshape(()).copy(), log_prob=float(lp[0]),
                     final_value=fv)
        else:
            fast.add(obs=obs, action=act, reward=rew, terminated=term, truncated=trunc,
                     value=val, log_prob=lp, final_value=fv)
        slow.add(obs=obs.tolist(), action=act.tolist(), reward=rew.tolist(),
                 terminated=term.tolist(), truncated=trunc.tolist(), value=val.tolist(),
                 log_prob=lp.tolist(), final_value=fv)
    _assert_same_state(fast.state_dict(), slow.state_dict())


def test_plain_add_declines_what_the_checked_path_must_see() -> None:
    """A truncated step without a final value, an out-of-range int, non-canonical bool
    bytes and a full rollout get the checked path's answer (an error that changes
    nothing, or canonical storage)."""
    spec = {"obs": ((2,), "float32"), "action": ((), "int8")}
    buf = rb.RolloutBuffer(2, spec=spec, seed=0)
    o = np.zeros(2, np.float32)
    with pytest.raises(rb.ShapeError, match="final_value"):
        buf.add(obs=o, action=1, reward=0.0, terminated=False, truncated=True, value=0.0,
                log_prob=0.0)
    with pytest.raises(rb.DtypeError):
        buf.add(obs=o, action=300, reward=0.0, terminated=False, truncated=False, value=0.0,
                log_prob=0.0)
    assert buf.pos == 0
    odd = np.array([2], np.uint8).view(bool)  # a bool byte that is not 0/1
    buf.add(obs=o, action=1, reward=0.0, terminated=odd.reshape(()), truncated=False,
            value=0.0, log_prob=0.0)
    assert buf.data["terminated"].view(np.uint8).max() == 1
    buf.add(obs=o, action=1, reward=0.0, terminated=False, truncated=False, value=0.0,
            log_prob=0.0)
    with pytest.raises(rb.CapacityError):
        buf.add(obs=o, action=1, reward=0.0, terminated=False, truncated=False, value=0.0,
                log_prob=0.0)


def test_numpy_scalar_discounts_are_taken_and_bad_ones_named() -> None:
    """gamma / gae_lambda as numpy scalars build the same buffer as Python floats (its
    config records plain floats); a bool, NaN or a value outside [0, 1] is refused naming
    the argument and an example, for the single- and multi-agent rollout buffers alike."""
    a = rb.RolloutBuffer(8, num_envs=np.int64(2), gamma=np.float32(0.5),
                         gae_lambda=np.float64(0.25))
    b = rb.RolloutBuffer(8, num_envs=2, gamma=0.5, gae_lambda=0.25)
    assert a.config() == b.config()
    assert type(a.gamma) is float and type(a.gae_lambda) is float
    for cls, kw in ((rb.RolloutBuffer, {}),
                    (rb.MultiAgentRolloutBuffer, {"agents": ["a"]})):
        for bad in (True, np.bool_(False), float("nan"), 1.5, -0.1, "0.9"):
            with pytest.raises(rb.ConfigError,
                               match=r"gae_lambda=.*must be a number in \[0, 1\]; pass e\.g\. "
                                     r"gae_lambda=0\.95"):
                cls(8, gae_lambda=bad, **kw)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_last_values_name_the_env_and_the_fix(bad: float) -> None:
    """A value problem: DtypeError (as HER's reward_fn NaN), the values, their envs and
    what to pass; nothing changes."""
    buf = rb.RolloutBuffer(3, num_envs=3, seed=0)
    fill(buf)
    before = snapshot(buf)
    with pytest.raises(DtypeError) as info:
        buf.compute_returns_and_advantage(np.array([0.0, bad, 1.0]))
    msg = str(info.value)
    assert f"last_values=[0.0, {bad}, 1.0]" in msg and f"values [{bad}] of env(s) [1]" in msg
    assert "pass finite values" in msg and "critic(next_obs)" in msg
    assert_same(snapshot(buf), before)
    with pytest.raises(EmptyBufferError):
        _ = buf.advantages


def test_value_fn_returning_nan_names_the_values_and_their_steps() -> None:
    buf = rb.RolloutBuffer(3, num_envs=2, seed=0)
    for t in range(3):
        buf.add(obs=np.full((2, 1), t, np.float32), action=np.zeros(2, np.int64),
                reward=np.ones(2, np.float32), terminated=np.zeros(2, bool),
                truncated=np.array([t == 0, t == 1]), value=np.zeros(2, np.float32),
                log_prob=np.zeros(2, np.float32),
                final_obs=[np.ones(1, np.float32) if t == 0 else None,
                           np.ones(1, np.float32) if t == 1 else None])
    before = snapshot(buf)
    with pytest.raises(DtypeError) as info:
        buf.compute_returns_and_advantage(np.zeros(2), value_fn=lambda o: np.array([0.5, np.nan]))
    msg = str(info.value)
    assert "values [nan] (of the truncated steps at step 1 env 1)" in msg, msg
    assert "return finite values, one per final observation" in msg
    assert_same(snapshot(buf), before)
    with pytest.raises(ShapeError, match="expected 2 values, one per final observation"):
        buf.compute_returns_and_advantage(np.zeros(2), value_fn=lambda o: np.zeros(3))
    buf.compute_returns_and_advantage(np.zeros(2), value_fn=lambda o: np.array([0.5, 0.25]))
    assert np.isfinite(buf.advantages).all()
