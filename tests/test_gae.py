"""GAE and discounted sums (replaybank.ops.gae) against plain-Python-loop oracles."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.errors import ConfigError, ShapeError
from replaybank.ops.gae import discount_cumsum, gae, numba_available, reverse_scan

BACKENDS = ["numpy", pytest.param("numba", marks=pytest.mark.skipif(
    not numba_available(), reason="numba not installed"))]


def oracle_gae(rew: Any, val: Any, term: Any, trunc: Any, last: Any, final: Any,
               gamma: float, lam: float) -> np.ndarray:
    """Plain Python loops over envs and steps, written from the definition."""
    steps, envs = len(rew), len(rew[0])
    adv = [[0.0] * envs for _ in range(steps)]
    for e in range(envs):
        running = 0.0
        for t in reversed(range(steps)):
            if term[t][e]:
                next_v = 0.0
            elif trunc[t][e]:
                next_v = float(final[t][e])
            elif t == steps - 1:
                next_v = float(last[e])
            else:
                next_v = float(val[t + 1][e])
            delta = float(rew[t][e]) + gamma * next_v - float(val[t][e])
            if term[t][e] or trunc[t][e]:
                running = 0.0  # the recursion does not cross an episode end
            running = delta + gamma * lam * running
            adv[t][e] = running
    return np.array(adv)


def oracle_cumsum(x: list[float], d: float) -> list[float]:
    return [sum(d ** k * x[t + k] for k in range(len(x) - t)) for t in range(len(x))]


def random_rollout(rng: np.random.Generator, steps: int, envs: int,
                   p_end: float = 0.15) -> dict[str, Any]:
    term = rng.random((steps, envs)) < p_end
    trunc = rng.random((steps, envs)) < p_end  # some steps are both: terminated wins
    final = np.where(trunc & ~term, rng.normal(size=(steps, envs)), np.nan)
    return dict(rewards=rng.normal(size=(steps, envs)), values=rng.normal(size=(steps, envs)),
                terminated=term, truncated=trunc, last_values=rng.normal(size=envs),
                final_values=final)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("steps,envs", [(1, 1), (7, 3), (64, 5)])
def test_gae_matches_loop_oracle(backend: str, steps: int, envs: int) -> None:
    rng = np.random.default_rng(steps * 100 + envs)
    for gamma, lam in [(0.99, 0.95), (0.9, 1.0), (0.5, 0.0), (1.0, 1.0)]:
        r = random_rollout(rng, steps, envs)
        got = gae(**r, gamma=gamma, gae_lambda=lam, backend=backend)  # type: ignore[arg-type]
        want = oracle_gae(r["rewards"], r["values"], r["terminated"], r["truncated"],
                          r["last_values"], r["final_values"], gamma, lam)
        assert got.dtype == np.float64 and got.shape == (steps, envs)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(steps=st.integers(1, 20), envs=st.integers(1, 4), seed=st.integers(0, 2**31),
       gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0))
def test_gae_property_against_oracle(steps: int, envs: int, seed: int, gamma: float,
                                     lam: float) -> None:
    r = random_rollout(np.random.default_rng(seed), steps, envs, p_end=0.3)
    got = gae(**r, gamma=gamma, gae_lambda=lam, backend="numpy")  # type: ignore[arg-type]
    want = oracle_gae(r["rewards"], r["values"], r["terminated"], r["truncated"],
                      r["last_values"], r["final_values"], gamma, lam)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_golden_values(backend: str) -> None:
    # step 2 ends by time limit (V(final obs) = 0.7); step 3 starts a new episode;
    # the rollout is cut after step 4 (not done) with V(s_5) = 0.25.
    rew = np.array([1, 0, 2, 0, 1], np.float64)[:, None]
    val = np.array([0.5, 0.4, 0.6, 0.3, 0.2], np.float64)[:, None]
    trunc = np.array([0, 0, 1, 0, 0], bool)[:, None]
    final = np.array([np.nan, np.nan, 0.7, np.nan, np.nan])[:, None]
    adv = gae(rew, val, np.zeros_like(trunc), trunc, np.array([0.25]), final,
              gamma=0.99, gae_lambda=0.95, backend=backend)  # type: ignore[arg-type]
    expected = [2.92979974325, 2.1624665, 2.093, 0.88317375, 1.0475]
    np.testing.assert_allclose(adv[:, 0], expected, rtol=0, atol=1e-9)


def test_gae_one_dimensional_and_float32_inputs() -> None:
    rng = np.random.default_rng(3)
    r = random_rollout(rng, 12, 1)
    one_d = gae(r["rewards"][:, 0].astype(np.float32), r["values"][:, 0].astype(np.float32),
                r["terminated"][:, 0], r["truncated"][:, 0], float(r["last_values"][0]),
                r["final_values"][:, 0], gamma=0.97, gae_lambda=0.9)
    want = oracle_gae(r["rewards"].astype(np.float32), r["values"].astype(np.float32),
                      r["terminated"], r["truncated"], r["last_values"], r["final_values"],
                      0.97, 0.9)[:, 0]
    assert one_d.shape == (12,) and one_d.dtype == np.float64
    np.testing.assert_allclose(one_d, want, rtol=1e-12, atol=1e-12)


def test_terminated_last_step_ignores_nonfinite_last_value_and_final() -> None:
    adv = gae(np.array([1.0, 2.0]), np.array([0.0, 0.0]), np.array([False, True]),
              np.array([False, True]), last_values=np.inf, final_values=None,
              gamma=0.5, gae_lambda=0.5)
    assert adv.tolist() == [1.5, 2.0]


def test_truncated_without_final_value_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"step \(1,\) was truncated but final_values=None"):
        gae(np.ones(3), np.zeros(3), np.zeros(3, bool), np.array([0, 1, 0], bool), 0.0)
    with pytest.raises(ValueError, match=r"final_values at truncated step \(1,\) is not finite"):
        gae(np.ones(3), np.zeros(3), np.zeros(3, bool), np.array([0, 1, 0], bool), 0.0,
            np.array([0.0, np.nan, 0.0]))


def test_gae_shape_errors() -> None:
    with pytest.raises(ShapeError, match="values="):
        gae(np.ones((3, 2)), np.zeros((3, 3)), np.zeros((3, 2), bool), np.zeros((3, 2), bool),
            np.zeros(2))
    with pytest.raises(ShapeError, match="last_values="):
        gae(np.ones((3, 2)), np.zeros((3, 2)), np.zeros((3, 2), bool), np.zeros((3, 2), bool),
            np.zeros(3))
    with pytest.raises(ShapeError, match="terminated="):
        gae(np.ones((3, 2)), np.zeros((3, 2)), np.zeros(3, bool), np.zeros((3, 2), bool),
            np.zeros(2))
    with pytest.raises(ShapeError, match="leading time axis"):
        gae(1.0, 0.0, False, False, 0.0)


#: gae's arguments for two steps of two envs, every step truncated (final_values read)
GAE_ARGS = {
    "rewards": np.ones((2, 2)),
    "values": np.zeros((2, 2)),
    "terminated": np.zeros((2, 2), bool),
    "truncated": np.ones((2, 2), bool),
    "last_values": np.zeros(2),
    "final_values": np.zeros((2, 2)),
}
RAGGED = [[1.0, 2.0], [3.0]]  # numpy's bare ValueError before: no argument named


def assert_ragged_named(err: pytest.ExceptionInfo[ShapeError], arg: str) -> None:
    msg = str(err.value)
    assert msg.startswith(f"{arg}=[["), msg
    assert "a ragged nest, rows of different lengths ([1] has shape" in msg


@pytest.mark.parametrize("arg", sorted(GAE_ARGS))
def test_a_ragged_gae_argument_is_named(arg: str) -> None:
    """A ragged list given to gae was numpy's bare ``ValueError: setting an array element
    with a sequence``; it is the one ragged check's ShapeError (host.as_numpy), naming the
    argument, its value and the first unlike row."""
    with pytest.raises(ShapeError) as err:
        rb.gae(**{**GAE_ARGS, arg: RAGGED})
    assert_ragged_named(err, arg)


def test_a_ragged_scan_argument_is_named() -> None:
    """discount_cumsum and reverse_scan: a ragged ``x`` was numpy's bare ValueError, a
    ragged ``coef`` a misleading "does not broadcast to x's shape"."""
    with pytest.raises(ShapeError) as err:
        rb.discount_cumsum(RAGGED, 0.5)
    assert_ragged_named(err, "x")
    with pytest.raises(ShapeError) as err:
        reverse_scan(RAGGED, 0.5)
    assert_ragged_named(err, "x")
    with pytest.raises(ShapeError) as err:
        reverse_scan(np.ones((2, 2)), RAGGED)
    assert_ragged_named(err, "coef")


def test_discount_cumsum_golden_and_public() -> None:
    assert rb.discount_cumsum([1, 2, 3], 0.5).tolist() == [2.75, 3.5, 3.0]
    assert discount_cumsum(np.array([1.0]), 0.3).tolist() == [1.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_discount_cumsum_oracle(backend: str) -> None:
    rng = np.random.default_rng(0)
    for n in (1, 5, 40):
        x = rng.normal(size=n)
        for d in (0.0, 0.5, 0.99, 1.0):
            got = discount_cumsum(x, d, backend=backend)  # type: ignore[arg-type]
            np.testing.assert_allclose(got, oracle_cumsum(x.tolist(), d), rtol=1e-12,
                                       atol=1e-12)
    batched = rng.normal(size=(9, 3))
    got = discount_cumsum(batched, 0.9, backend=backend)  # type: ignore[arg-type]
    for j in range(3):
        np.testing.assert_allclose(got[:, j], oracle_cumsum(batched[:, j].tolist(), 0.9),
                                   rtol=1e-12, atol=1e-12)


def test_discount_cumsum_long_array_is_stable() -> None:
    x = np.ones(5000)
    got = discount_cumsum(x, 0.5)
    # a rescaled cumsum (x * d**t, cumsum, / d**t) would under/overflow here
    np.testing.assert_allclose(got[:-60], 2.0, rtol=1e-15)
    assert got[-3:].tolist() == [1.75, 1.5, 1.0] and np.all(np.isfinite(got))


@pytest.mark.skipif(not numba_available(), reason="numba not installed")
def test_numba_and_numpy_backends_agree() -> None:
    rng = np.random.default_rng(5)
    x, c = rng.normal(size=(300, 7)), rng.random((300, 7))
    np.testing.assert_allclose(reverse_scan(x, c, "numba"), reverse_scan(x, c, "numpy"),
                               rtol=1e-13, atol=1e-13)
    assert reverse_scan(np.zeros((0, 3)), 0.5, "numba").shape == (0, 3)


def test_backend_and_argument_errors() -> None:
    with pytest.raises(ConfigError, match="backend='cuda'"):
        reverse_scan(np.ones(3), 0.5, "cuda")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="discount=nan"):
        discount_cumsum([1.0], float("nan"))
    with pytest.raises(ShapeError, match="does not broadcast"):
        reverse_scan(np.ones((3, 2)), np.ones(4))
    with pytest.raises(ShapeError, match="leading time axis"):
        discount_cumsum(1.0, 0.5)
