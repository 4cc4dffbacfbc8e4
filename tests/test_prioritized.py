"""Prioritized replay: distribution, IS weights, updates, stale keys, schedules, state."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import ConfigError, DtypeError, EmptyBufferError, ShapeError
from replaybank.ops.jit import pure_python
from tests.stats import chi2_critical


def steps(n: int, start: int = 0, dim: int = 2) -> dict[str, Any]:
    obs = np.arange(start, start + n + 1, dtype=np.float32)[:, None].repeat(dim, 1)
    return {"obs": obs[:-1], "action": np.zeros(n, np.int64),
            "reward": np.arange(start, start + n, dtype=np.float32),
            "next_obs": obs[1:], "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}


def make(capacity: int = 8, **kw: Any) -> rb.PrioritizedReplayBuffer:
    return rb.PrioritizedReplayBuffer(capacity, seed=kw.pop("seed", 0), **kw)


# ---------------------------------------------------------------------- IS weights
KERNEL_MODULES = {"c": "replaybank.ops.sumtree_c", "numba": "numba"}


def _kernel_or_skip(kernel: str) -> None:
    """Skip a case of a kernel this run does not have: not installed, or the C kernels
    switched off (``REPLAYBANK_PURE_PYTHON=1``, which CI's pure-Python run sets)."""
    if kernel == "c" and pure_python():
        pytest.skip("REPLAYBANK_PURE_PYTHON=1: the C kernels are off")
    if kernel in KERNEL_MODULES:
        pytest.importorskip(KERNEL_MODULES[kernel])


@pytest.mark.parametrize("kernel", ["c", "numba", "numpy"])
def test_is_weights_hand_computed(kernel: str) -> None:
    """4 items, priorities [1, 2, 3, 4], alpha 0.6, beta 0.4 (eps 0)."""
    _kernel_or_skip(kernel)
    sampler = rb.PrioritizedSampler(alpha=0.6, beta=0.4, eps=0.0, kernel=kernel)
    buf = rb.ReplayBuffer(4, sampler=sampler, seed=3)
    buf.extend(**steps(4), priority=[1.0, 2.0, 3.0, 4.0])
    # by hand: p_i = i ** 0.6 = [1, 1.515717, 1.933182, 2.297397], sum 6.746296
    p = [1.0, 2.0**0.6, 3.0**0.6, 4.0**0.6]
    total = sum(p)
    probs = [x / total for x in p]
    raw = [(4 * q) ** -0.4 for q in probs]
    assert total == pytest.approx(6.746296, abs=1e-6)
    # raw (N P)^-beta = [1.23254, 1.04365, 0.94688, 0.88371]; buffer-normalised:
    hand = [1.0, 0.84675, 0.76823, 0.71698]
    assert raw == pytest.approx([1.23254, 1.04365, 0.94688, 0.88371], abs=1e-5)
    b = buf.sample(64)
    for key, w, q in zip(b.indices.tolist(), b.weights.tolist(), b.probabilities.tolist(),
                         strict=True):
        assert q == pytest.approx(probs[key], rel=1e-12)
        assert w == pytest.approx(hand[key], abs=1e-5)  # buffer-max norm
    # the other norms
    sampler.weight_norm = None
    b = buf.sample(64)
    assert np.allclose(b.weights, np.array(raw)[b.indices], rtol=1e-6)
    sampler.weight_norm = "batch"
    b = buf.sample(64)
    want = np.array(raw)[b.indices]
    assert np.allclose(b.weights, want / want.max(), rtol=1e-6)
    assert b.weights.max() == pytest.approx(1.0)


def test_buffer_norm_uses_whole_buffer_max() -> None:
    buf = make(16, alpha=1.0, beta=1.0, eps=0.0)
    buf.extend(**steps(16), priority=np.r_[np.full(15, 10.0), 0.5])
    b = buf.sample(32)
    # the small-priority item may not be drawn, but it sets the normalisation
    assert np.allclose(b.weights[b.indices < 15], 0.5 / 10.0)


# ---------------------------------------------------------------------- distribution
@pytest.mark.statistical
@pytest.mark.parametrize(("kernel", "lanes"), [("numba", 1), ("numba", 3), ("numpy", 1)])
def test_sampling_frequencies_match_priorities(kernel: str, lanes: int) -> None:
    if kernel == "numba":
        pytest.importorskip("numba")
    n = 48
    rng = np.random.default_rng(7)
    raw = rng.random(n) * 3 + 0.05
    sampler = rb.PrioritizedSampler(alpha=0.7, eps=0.0, kernel=kernel)
    buf = rb.ReplayBuffer(n, num_envs=lanes, sampler=sampler, seed=11)
    k = n // lanes
    data = steps(k)
    if lanes > 1:
        data = {key: np.stack([v] * lanes, axis=1) for key, v in data.items()}
    buf.extend(**data, priority=raw.reshape(k, lanes))
    # key = seq * lanes + lane, written in [k, lanes] order, so raw[key] is its priority
    p = raw**0.7
    prob = p / p.sum()
    counts = np.zeros(n)
    draws = 0
    for _ in range(300):
        b = buf.sample(200)
        np.add.at(counts, b.indices, 1)
        draws += 200
        assert np.allclose(b.probabilities, prob[b.indices])
    expected = draws * prob
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < chi2_critical(n - 1), stat


def test_zero_priority_and_unfilled_slots_are_never_drawn() -> None:
    buf = make(1000, eps=0.0)
    buf.extend(**steps(10), priority=[0, 1, 0, 1, 0, 1, 0, 1, 0, 0])
    b = buf.sample(4000)
    assert set(b.indices.tolist()) == {1, 3, 5, 7}


def test_all_zero_priorities_raise() -> None:
    buf = make(10, eps=0.0)
    buf.extend(**steps(3), priority=0.0)
    with pytest.raises(EmptyBufferError, match="priority"):
        buf.sample(2)


# ---------------------------------------------------------------------- priorities
def test_new_items_get_running_max() -> None:
    buf = make(10, alpha=0.5, eps=0.0)
    buf.extend(**steps(3))
    sampler = buf.sampler
    assert isinstance(sampler, rb.PrioritizedSampler)
    assert np.allclose(sampler.priorities(np.arange(3)), 1.0)
    assert buf.update_priorities(np.array([0, 1]), np.array([16.0, 0.25])) == 2
    assert np.allclose(sampler.priorities(np.arange(3)), [4.0, 0.5, 1.0])
    buf.extend(**steps(2, start=3))
    assert np.allclose(sampler.priorities(np.arange(5)), [4.0, 0.5, 1.0, 4.0, 4.0])
    buf.add(**{k: v[0] for k, v in steps(1, start=5).items()}, priority=9.0)
    assert sampler.priorities(np.array([5]))[0] == pytest.approx(3.0)
    assert sampler.max_priority == pytest.approx(4.0)


@pytest.mark.parametrize("kernel", ["c", "numba", "numpy"])
def test_duplicate_keys_in_one_update_apply_in_order(kernel: str) -> None:
    """A key given several times in one update (a batch drawn with replacement) ends with
    its last priority, as a plain loop over the batch leaves it, whatever the kernel; the
    running maximum has seen every value (docs/samplers/prioritized.md); stale keys count
    nowhere, not even in the running maximum."""
    _kernel_or_skip(kernel)
    rng = np.random.default_rng(0)
    buf = rb.ReplayBuffer(
        256, num_envs=4, seed=0, sampler=rb.PrioritizedSampler(alpha=1.0, eps=0.0, kernel=kernel)
    )
    buf.extend(**{k: np.stack([v] * 4, axis=1) for k, v in steps(64).items()})
    keys = rng.integers(0, 256, 5000).astype(np.int64)  # [5000], every key ~20 times
    values = rng.random(5000) * 5.0
    assert buf.update_priorities(keys, values) == 5000
    want = np.ones(256)
    for k, v in zip(keys.tolist(), values.tolist(), strict=True):  # the plain loop
        want[k] = v
    sampler = buf.sampler
    assert isinstance(sampler, rb.PrioritizedSampler)
    assert np.array_equal(sampler.priorities(np.arange(256)), want)  # keys = slots here
    assert sampler.total == pytest.approx(want.sum(), rel=1e-12)
    assert sampler.max_priority == pytest.approx(values.max())
    assert buf.update_priorities(np.array([7, 7]), np.array([60.0, 0.5])) == 2
    assert sampler.priorities(np.array([7])).tolist() == [0.5]
    assert sampler.max_priority == pytest.approx(60.0)
    buf.extend(**{k: np.stack([v] * 4, axis=1) for k, v in steps(64, start=64).items()})
    assert buf.update_priorities(np.array([3]), np.array([99.0])) == 0  # overwritten
    assert sampler.max_priority == pytest.approx(60.0)


@pytest.mark.parametrize("kernel", ["auto", "numpy"])
def test_stale_updates_after_wraparound_are_ignored(kernel: str) -> None:
    buf = rb.ReplayBuffer(4, seed=0, sampler=rb.PrioritizedSampler(alpha=1.0, eps=0.0,
                                                                   kernel=kernel))
    buf.extend(**steps(4))
    old = buf.sample(8).indices.copy()
    buf.extend(**steps(3, start=4))  # slots 0..2 now hold new steps
    sampler = buf.sampler
    assert isinstance(sampler, rb.PrioritizedSampler)
    before = sampler.state_dict()["priorities"].copy()
    applied = buf.update_priorities(np.array([0, 1, 2]), np.array([50.0, 60.0, 70.0]))
    assert applied == 0
    assert np.array_equal(sampler.state_dict()["priorities"], before)
    live = buf.update_priorities(np.array([3, 4, 0]), np.array([5.0, 6.0, 7.0]))
    assert live == 2  # key 3 (slot 3) and key 4 (slot 0) are live, key 0 is stale
    assert np.allclose(sampler.priorities(np.array([0, 3])), [6.0, 5.0])
    assert len(old) == 8


@pytest.mark.parametrize(("prio", "err"), [
    ([1.0, np.nan], DtypeError), ([1.0, -1.0], DtypeError), ([1.0, np.inf], DtypeError),
    ([1.0], ShapeError),
])
def test_update_validation_leaves_state(prio: list[float], err: type) -> None:
    buf = make(8)
    buf.extend(**steps(4))
    state = buf.sampler.state_dict()
    with pytest.raises(err):
        buf.update_priorities(np.array([0, 1]), np.array(prio))
    after = buf.sampler.state_dict()
    assert np.array_equal(state["priorities"], after["priorities"])


@pytest.mark.parametrize("storage", ["numpy", "torch"])
def test_updates_on_a_buffer_never_added_to_name_the_call_and_the_fix(storage: str) -> None:
    """Before any add no step was sampled: both update calls name themselves, their keys
    argument and the fix (the bare "no storage yet ... pass spec=" named neither), and
    the buffer stays empty and usable."""
    if storage == "torch":
        pytest.importorskip("torch")
    buf = make(8, storage=storage)
    calls = {
        "update_priorities(indices=...)": lambda: buf.update_priorities([0], [1.0]),
        "update_sequence_priorities(starts=...)": lambda: buf.update_sequence_priorities(
            [0], np.ones((1, 3))
        ),
    }
    for named, call in calls.items():
        with pytest.raises(ShapeError) as info:
            call()
        message = str(info.value)
        assert message.startswith(f"{named}: the buffer is empty (nothing was added yet)")
        keys = named.split("(")[1].split("=")[0]
        assert message.endswith(
            f"add transitions, sample a batch, then pass batch.{keys} of that sample"
        )
    assert len(buf) == 0 and not buf.allocated
    buf.extend(**steps(4))
    assert buf.update_priorities(buf.sample(2).indices, [1.0, 2.0]) == 2


def test_uniform_buffer_rejects_priorities() -> None:
    buf = rb.ReplayBuffer(8, seed=0)
    buf.extend(**steps(2))
    with pytest.raises(ConfigError, match="PrioritizedSampler"):
        buf.update_priorities([0], [1.0])
    # beta= is an option of prioritized samplers only: refused, naming the fix
    with pytest.raises(rb.ArgumentError, match="PrioritizedSampler"):
        buf.sample(2, beta=0.5)
    assert buf.sample(2).obs.shape == (2, 2)


# ---------------------------------------------------------------------- beta
def test_linear_beta_schedule_and_override() -> None:
    s = rb.PrioritizedSampler(beta=0.4, beta_schedule="linear", beta_steps=4, eps=0.0,
                              alpha=1.0, weight_norm=None)
    buf = rb.ReplayBuffer(4, sampler=s, seed=0)
    buf.extend(**steps(2), priority=[1.0, 3.0])
    seen = []
    for _ in range(6):
        beta = s.current_beta
        b = buf.sample(8)
        seen.append(beta)
        want = (2 * (np.array([1.0, 3.0]) / 4.0)[b.indices]) ** -beta
        assert np.allclose(b.weights, want, rtol=1e-6)
    assert seen == pytest.approx([0.4, 0.55, 0.7, 0.85, 1.0, 1.0])
    b = buf.sample(8, beta=0.0)
    assert np.allclose(b.weights, 1.0)


def test_both_spellings_give_identical_samples() -> None:
    a = rb.PrioritizedReplayBuffer(32, alpha=0.5, beta=0.3, seed=5, n_step=2)
    b = rb.ReplayBuffer(32, seed=5, n_step=2,
                        sampler=rb.PrioritizedSampler(alpha=0.5, beta=0.3))
    for buf in (a, b):
        buf.extend(**steps(20), priority=np.linspace(0.1, 2, 20))
    x, y = a.sample(16), b.sample(16)
    assert np.array_equal(x.indices, y.indices) and np.array_equal(x.weights, y.weights)
    assert a.sampler.config() == b.sampler.config()
    with pytest.raises(ConfigError, match="sampler"):
        rb.PrioritizedReplayBuffer(8, sampler=rb.UniformSampler())


def test_without_replacement() -> None:
    buf = make(64, eps=0.0)
    buf.extend(**steps(20), priority=np.r_[np.zeros(5), np.ones(15)])
    b = buf.sample(15, replace=False)
    assert sorted(b.indices.tolist()) == list(range(5, 20))
    with pytest.raises(EmptyBufferError, match="replace=False"):
        buf.sample(16, replace=False)


@pytest.mark.parametrize("kernel", ["c", "numba"])
def test_compiled_and_numpy_kernels_sample_identically(kernel: str) -> None:
    _kernel_or_skip(kernel)
    bufs = [rb.ReplayBuffer(300, num_envs=3, seed=9,
                            sampler=rb.PrioritizedSampler(kernel=k)) for k in (kernel, "numpy")]
    rng = np.random.default_rng(0)
    prio = rng.random((50, 3))
    for buf in bufs:
        data = {k: np.stack([v] * 3, axis=1) for k, v in steps(50).items()}
        buf.extend(**data, priority=prio)
    for _ in range(5):
        x, y = bufs[0].sample(64), bufs[1].sample(64)
        assert np.array_equal(x.indices, y.indices)
        assert np.array_equal(x.weights, y.weights)
        np.testing.assert_allclose(x.probabilities, y.probabilities, rtol=1e-14)
        td = rng.random(64)
        for buf, batch in zip(bufs, (x, y), strict=True):
            buf.update_priorities(batch.indices, td)
    # numpy's vectorised ** may round the stored (p + eps) ** alpha differently from
    # libm's pow (the compiled kernels') in the last bit
    states = [buf.sampler.state_dict() for buf in bufs]
    np.testing.assert_allclose(states[0]["priorities"], states[1]["priorities"], rtol=1e-15)
    assert states[0]["max_priority"] == pytest.approx(states[1]["max_priority"], rel=1e-15)


# ---------------------------------------------------------------------- composition
def test_per_with_nstep() -> None:
    buf = make(40, n_step=3, gamma=0.5, alpha=1.0, eps=0.0, weight_norm=None)
    data = steps(30)
    data["terminated"][9] = True
    data["obs"][10:] += 100.0
    data["next_obs"][10:] += 100.0
    data["next_obs"][9] = 999.0
    buf.extend(**data, priority=np.arange(30) + 1.0)
    b = buf.sample(256)
    r = data["reward"].astype(np.float64)
    for key, rew, disc, term in zip(b.indices, b.reward, b["discount"], b.terminated,
                                    strict=True):
        length = min(3, 10 - key) if key < 10 else min(3, 30 - key)
        want = sum(0.5**k * r[key + k] for k in range(length))
        assert rew == pytest.approx(want)
        assert disc == pytest.approx(0.5**length)
        assert bool(term) == (key + length - 1 == 9)
        assert b.probabilities[list(b.indices).index(key)] == pytest.approx(
            (key + 1) / (30 * 31 / 2))


def test_state_dict_roundtrip_gives_identical_next_sample() -> None:
    a = make(64, num_envs=2, beta_schedule="linear", beta_steps=10)
    data = {k: np.stack([v, v], axis=1) for k, v in steps(40).items()}
    a.extend(**data)
    for _ in range(3):
        b = a.sample(16)
        a.update_priorities(b.indices, np.abs(np.sin(b.indices)) + 0.1)
    state = a.state_dict()
    c = make(64, num_envs=2, beta_schedule="linear", beta_steps=10, seed=123)
    c.load_state_dict(state)
    x, y = a.sample(32), c.sample(32)
    assert np.array_equal(x.indices, y.indices)
    assert np.array_equal(x.weights, y.weights)
    assert np.array_equal(x.obs, y.obs)
    sa, sc = a.sampler.state_dict(), c.sampler.state_dict()
    assert np.array_equal(sa["priorities"], sc["priorities"]) and sa["calls"] == sc["calls"]


def test_clear_resets_priorities() -> None:
    buf = make(8)
    buf.extend(**steps(4))
    buf.update_priorities([0], [100.0])
    buf.clear()
    assert buf.sampler.total == 0.0  # type: ignore[attr-defined]
    buf.extend(**steps(2, start=10))
    assert set(buf.sample(50).indices.tolist()) <= {4, 5}


@pytest.mark.parametrize("kw", [{"alpha": -1}, {"beta": 2.0}, {"weight_norm": "max"},
                                {"beta_schedule": "cosine"}, {"beta_steps": 0},
                                {"fanout": 1}, {"kernel": "cuda"}])
def test_bad_arguments(kw: dict[str, Any]) -> None:
    name = next(iter(kw))
    with pytest.raises(ConfigError, match=name):
        rb.PrioritizedSampler(**kw)


def test_config_and_metadata() -> None:
    buf = make(8, alpha=0.7)
    cfg = buf.metadata()["sampler"]
    assert cfg["type"] == "prioritized" and cfg["alpha"] == 0.7 and cfg["weight_norm"] == "buffer"
    assert isinstance(buf.sampler, rb.PrioritySampler)


@pytest.mark.parametrize(("lanes", "kernel"), [(1, "auto"), (3, "auto"), (2, "numpy")])
def test_against_naive_reference(lanes: int, kernel: str) -> None:
    """Random extends (sync and async), updates (some stale) and samples vs a dict model."""
    rng = np.random.default_rng(lanes)
    alpha, eps = 0.7, 0.01
    rows = 12
    buf = rb.ReplayBuffer(rows * lanes, num_envs=lanes, seed=1,
                          sampler=rb.PrioritizedSampler(alpha=alpha, eps=eps, kernel=kernel))
    ref: dict[int, float] = {}  # live key -> stored priority
    written = [0] * lanes
    top = 1.0
    for _ in range(60):
        op = rng.integers(3)
        if op == 0:  # one step into a random subset of lanes, maybe with priorities
            ids = np.sort(rng.choice(lanes, size=int(rng.integers(1, lanes + 1)), replace=False))
            m = len(ids)
            prio = rng.random(m) * 3 if rng.random() < 0.5 else None
            buf.add(env_ids=ids, obs=rng.random((m, 2)).astype(np.float32),
                    action=np.zeros(m), reward=np.zeros(m), next_obs=np.zeros((m, 2), np.float32),
                    terminated=np.zeros(m, bool), truncated=np.zeros(m, bool), priority=prio)
            for j, lane in enumerate(ids.tolist()):
                key = written[lane] * lanes + lane
                ref.pop((written[lane] - rows) * lanes + lane, None)  # overwritten
                written[lane] += 1
                v = top if prio is None else (prio[j] + eps) ** alpha
                ref[key] = v
                top = max(top, v)
        elif op == 1 and ref:  # update sampled keys plus some stale ones
            keys = np.r_[buf.sample(5).indices, rng.integers(0, max(written) * lanes + 1, 3)]
            p = rng.random(len(keys)) * 5
            applied = buf.update_priorities(keys, p)
            want = 0
            for key, v in zip(keys.tolist(), p.tolist(), strict=True):
                if key in ref:
                    ref[key] = (v + eps) ** alpha
                    top = max(top, ref[key])
                    want += 1
            assert applied == want
        elif ref:
            b = buf.sample(32)
            total = sum(ref.values())
            for key, q in zip(b.indices.tolist(), b.probabilities.tolist(), strict=True):
                assert key in ref
                assert q == pytest.approx(ref[key] / total, rel=1e-9)
            pmin = min(ref.values())
            want_w = np.array([(ref[k] / pmin) ** -0.4 for k in b.indices.tolist()])
            assert np.allclose(b.weights, want_w, rtol=1e-5)


def test_on_write_range_equals_on_write() -> None:
    a, b = rb.PrioritizedSampler(alpha=0.7), rb.PrioritizedSampler(alpha=0.7)
    for s in (a, b):
        s.bind(50, 2)
        s.update(np.array([3, 7]), np.array([5.0, 0.5]))  # running max above 1
    for lo, hi in ((0, 1), (10, 11), (20, 36), (99, 100)):
        a.on_write(np.arange(lo, hi, dtype=np.int64), None)
        b.on_write_range(lo, hi)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert np.array_equal(np.asarray(sa[k]), np.asarray(sb[k])), k


@pytest.mark.parametrize("lanes", [1, 3])
def test_sampler_swapped_onto_a_filled_buffer_serves_every_live_step(lanes: int) -> None:
    """``buf.sampler = PrioritizedSampler()`` after steps were stored (the documented swap):
    the new sampler is bound to the table and holds every live step at the default
    priority, so draws are uniform over them; priorities given afterwards rule."""
    buf = rb.ReplayBuffer(8 * lanes, num_envs=lanes, seed=3)
    data = steps(11)  # wraps: 8 live steps per lane, 3 evicted
    if lanes > 1:
        data = {key: np.stack([v] * lanes, axis=1) for key, v in data.items()}
    buf.extend(**data)
    buf.sampler = rb.PrioritizedSampler(alpha=1.0, eps=0.0)
    assert len(buf) == 8 * lanes
    live = sorted(buf.sample(8 * lanes, replace=False).indices.tolist())
    assert live == sorted(s * lanes + lane for s in range(3, 11) for lane in range(lanes))
    counts = np.zeros(11 * lanes)
    for _ in range(200):
        b = buf.sample(64)
        assert np.allclose(b.probabilities, 1 / (8 * lanes))
        assert np.allclose(b.weights, 1.0)
        np.add.at(counts, b.indices, 1)
    expected = np.full(8 * lanes, 200 * 64 / (8 * lanes))
    stat = float(((counts[3 * lanes:] - expected) ** 2 / expected).sum())
    assert counts[:3 * lanes].sum() == 0 and stat < chi2_critical(8 * lanes - 1), stat
    keys = np.arange(3 * lanes, 11 * lanes)
    buf.update_priorities(keys, np.where(keys == keys[-1], 1.0, 0.0))
    assert set(buf.sample(32).indices.tolist()) == {int(keys[-1])}


def test_sampler_swap_onto_an_empty_buffer_and_a_refused_swap() -> None:
    buf = rb.ReplayBuffer(8, seed=0)
    buf.sampler = rb.RecentSampler(prioritized=rb.PrioritizedSampler())
    buf.extend(**steps(5))
    assert sorted(set(buf.sample(64).obs[:, 0].tolist())) == [0.0, 1.0, 2.0, 3.0, 4.0]
    old = buf.sampler
    with pytest.raises(ConfigError, match="eps"):  # cannot bind: the old sampler stays
        buf.sampler = rb.PrioritizedSampler(eps=1e300, alpha=1.0)
    assert buf.sampler is old and len(buf) == 5
    buf.add(**{k: v[0] for k, v in steps(1, start=5).items()})
    assert len(buf) == 6 and 5.0 in buf.sample(256).obs[:, 0]


def test_unsigned_keys_beyond_int64_are_named_not_wrapped() -> None:
    buf = make()
    buf.extend(**steps(5))
    before = buf.sampler.state_dict()["priorities"].copy()
    for key in (2**63, 2**64 - 1):  # (wrapped to int64 they read as negative keys)
        with pytest.raises(DtypeError, match=f"holds {key}, beyond int64"):
            buf.update_priorities(np.array([key], np.uint64), np.ones(1))
    assert np.array_equal(buf.sampler.state_dict()["priorities"], before)
    assert buf.update_priorities(np.arange(5, dtype=np.uint64), np.full(5, 2.0)) == 5


def _per_core(kind: str) -> tuple[Any, rb.ReplayBuffer]:
    """A front end whose update_priorities forwards to a prioritized core, and the core,
    holding 4 steps."""
    if kind == "multiagent":
        ma = rb.MultiAgentReplayBuffer(16, ["a", "b"], seed=0, sampler=rb.PrioritizedSampler())
        for t in range(4):
            obs = {k: np.full(2, t, np.float32) for k in "ab"}
            ma.add(obs=obs, action=dict.fromkeys("ab", 0), reward=dict.fromkeys("ab", 0.0),
                   next_obs={k: v + 1 for k, v in obs.items()},
                   terminated=dict.fromkeys("ab", False), truncated=dict.fromkeys("ab", False))
        return ma, ma.buffer
    if kind == "sequence":
        seq = rb.SequenceReplayBuffer(capacity=16, sequence_length=2, seed=0,
                                      sampler=rb.PrioritizedSampler())
        seq.extend(**steps(4))
        return seq, seq.buffer
    buf = make(8) if kind == "per" else rb.ReplayBuffer(8, seed=0,
                                                        sampler=rb.PrioritizedSampler())
    buf.extend(**steps(4))
    return buf, buf


@pytest.mark.parametrize("kind", ["replay", "per", "sequence", "multiagent"])
@pytest.mark.parametrize(("indices", "priorities", "named"), [
    ([0, 1], [[1.0], [1.0, 2.0]], r"priorities=\[\[1\.0\], \[1\.0, 2\.0\]\]\): a ragged nest, "
     r"rows of different lengths \(\[1\] has shape \(2,\) but \[0\] has shape \(1,\)\); "
     r"expected \[B=2\] \(one priority per index\): pass a flat list"),
    ([[0], [1, 2]], [1.0, 2.0], r"indices=\[\[0\], \[1, 2\]\]\): a ragged nest, rows of "
     r"different lengths \(\[1\] has shape \(2,\) but \[0\] has shape \(1,\)\); "
     r"expected \[B\] item keys .*: pass batch\.indices as sampled"),
])
def test_ragged_update_is_a_shape_error_naming_the_argument(
        kind: str, indices: Any, priorities: Any, named: str) -> None:
    """A ragged priorities list was a DtypeError ('expected real numbers (setting an array
    element with a sequence...)'), ragged indices numpy's bare ValueError. Both are a
    ShapeError naming the argument, its value and the fix, through every front end that
    forwards to the core, and nothing changes."""
    front, core = _per_core(kind)
    before = core.state_dict()
    with pytest.raises(ShapeError, match=rf"^update_priorities\({named}"):
        front.update_priorities(indices, priorities)
    after = core.state_dict()
    assert np.array_equal(before["sampler"]["priorities"], after["sampler"]["priorities"])
    assert before["rng"] == after["rng"]
    assert front.update_priorities([0, 1], [1.0, 2.0]) == 2  # the flat call still works


def test_ragged_initial_priorities_are_a_shape_error() -> None:
    """The same check for extend(priority=...): nothing is written."""
    buf = make(8)
    buf.extend(**steps(2))
    before = buf.state_dict()
    with pytest.raises(ShapeError, match=r"^priority=\[\[1\.0\], \[1\.0, 2\.0\]\]: a ragged "
                       r"nest, rows of different lengths \(\[1\] has shape \(2,\) but \[0\] has "
                       r"shape \(1,\)\); expected one priority per step \(2 values\)"):
        buf.extend(**steps(2, start=2), priority=[[1.0], [1.0, 2.0]])
    assert len(buf) == 2
    assert np.array_equal(before["sampler"]["priorities"],
                          buf.state_dict()["sampler"]["priorities"])
