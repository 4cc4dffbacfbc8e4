"""Exact uniform integer draws (replaybank.ops.draws): stream, kernels, law, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.ops import draws
from replaybank.samplers.base import LaneView
from tests.stats import chi2_critical

HIGHS = [1, 2, 3, 7, 1000, 2**31 + 1, 3 * 2**30, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 7,
         2**63]


def loop_oracle(seed: int, high: int, size: int) -> list[int]:
    """The documented stream, one Python int at a time."""
    bg = np.random.default_rng(seed).bit_generator
    out: list[int] = []
    while len(out) < size:
        r = size - len(out)
        if high <= 2**32:
            words = [int(w) for w in bg.random_raw(r // 2 + 2)]
            cands = [h for w in words for h in (w & 0xFFFFFFFF, w >> 32)]
            got = [(x * high) >> 32 for x in cands if (x * high) % 2**32 >= 2**32 % high]
        else:
            mask = (1 << (high - 1).bit_length()) - 1
            got = [w & mask for w in (int(w) for w in bg.random_raw(2 * r + 8))
                   if w & mask < high]
        out.extend(got[:r])
    return out


@pytest.mark.parametrize("high", HIGHS)
@pytest.mark.parametrize("size", [0, 1, 2, 5, 64, 777])
def test_matches_plain_loop_oracle(high: int, size: int) -> None:
    seed = size * 31 + high % 1009
    want = loop_oracle(seed, high, size)
    got = draws.uniform_ints(np.random.default_rng(seed), high, size)
    assert got.dtype == np.int64 and got.shape == (size,)
    assert got.tolist() == want
    numpy_got = draws.uniform_ints(np.random.default_rng(seed), high, size, kernel=draws.map_raw)
    assert numpy_got.tolist() == want


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 2**63), st.integers(0, 300), st.integers(0, 2**32))
def test_kernels_agree_and_stay_in_range(high: int, size: int, seed: int) -> None:
    a = draws.uniform_ints(np.random.default_rng(seed), high, size)
    b = draws.uniform_ints(np.random.default_rng(seed), high, size, kernel=draws.map_raw)
    assert a.tolist() == b.tolist()
    assert all(0 <= v < high for v in a.tolist())


def test_calls_continue_the_generator_stream() -> None:
    g1, g2 = np.random.default_rng(5), np.random.default_rng(5)
    first = draws.uniform_ints(g1, 1000, 10)
    second = draws.uniform_ints(g1, 1000, 10)
    assert first.tolist() == loop_oracle(5, 1000, 10)
    draws.uniform_ints(g2, 1000, 10)
    assert draws.uniform_ints(g2, 1000, 10).tolist() == second.tolist()
    assert first.tolist() != second.tolist()


@pytest.mark.parametrize(("high", "size", "offset"),
                         [(0, 3, 0), (2**63 + 1, 3, 0), (5, -1, 0), (5, 3, 2**63 - 4),
                          (5, 3, -(2**63) - 1)])
def test_bad_arguments_raise(high: int, size: int, offset: int) -> None:
    with pytest.raises(ValueError, match="uniform_ints"):
        draws.uniform_ints(np.random.default_rng(0), high, size, offset=offset)


def test_uniform_sampler_draws_this_stream() -> None:
    lv = LaneView(T=8, lanes=3, written=np.array([8, 5, 2]), counts=np.array([8, 5, 2]))
    keys = rb.UniformSampler().sample(50, lv, np.random.default_rng(4)).keys
    flat = draws.uniform_ints(np.random.default_rng(4), 15, 50)
    # flat positions run lane by lane, each lane oldest to newest
    lane = np.searchsorted(np.cumsum([8, 5, 2]), flat, side="right")
    seq = flat - np.concatenate([[0], np.cumsum([8, 5])])[lane]
    assert keys.tolist() == (seq * 3 + lane).tolist()


@pytest.mark.statistical
@pytest.mark.parametrize("high", [7, 1000, 3 * 2**30])
def test_values_are_uniform(high: int) -> None:
    """Chi-square over 50 equal bins (or the values themselves when fewer); 3 * 2**30
    rejects a quarter of its candidates, so the rejection step is exercised."""
    n = 400_000
    v = draws.uniform_ints(np.random.default_rng(99), high, n)
    bins = min(high, 50)
    counts = np.bincount(v * bins // high, minlength=bins)
    expected = n / bins
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < chi2_critical(bins - 1)


BIT_GENERATORS = [np.random.PCG64, np.random.PCG64DXSM, np.random.MT19937, np.random.Philox,
                  np.random.SFC64]


def same_state(a: np.random.Generator, b: np.random.Generator) -> bool:
    """Whether two generators' states are equal (MT19937's key is an array)."""
    def eq(x: object, y: object) -> bool:
        if isinstance(x, dict) and isinstance(y, dict):
            return x.keys() == y.keys() and all(eq(x[k], y[k]) for k in x)
        if isinstance(x, np.ndarray):
            return bool(np.array_equal(x, y))  # type: ignore[arg-type]
        return x == y
    return eq(a.bit_generator.state, b.bit_generator.state)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 2**63), st.integers(0, 300), st.integers(0, 2**32),
       st.sampled_from(BIT_GENERATORS), st.booleans())
def test_compiled_draw_reads_the_words_random_raw_reads(high: int, size: int, seed: int,
                                                        bits: type, buffered: bool) -> None:
    """Where the C draw reads the raw words through the bit generator's C interface, it
    gives the values, the word count and the generator state after that ``random_raw``
    rounds mapped by numpy give, for every numpy bit generator, with a buffered 32-bit
    half or without."""
    a, b = np.random.Generator(bits(seed)), np.random.Generator(bits(seed))
    if buffered:  # a uint32 draw leaves half a word buffered, which raw words must not touch
        a.integers(0, 7, dtype=np.uint32)
        b.integers(0, 7, dtype=np.uint32)
    offset = (1 << 63) - high if seed % 3 == 0 else -seed  # the largest offset, or below 0
    got, words = draws.counted_ints(a, high, size, offset=offset)
    want, want_words = draws.counted_ints(b, high, size, kernel=draws.map_raw)
    assert (got - offset).tolist() == want.tolist() and words == want_words
    assert same_state(a, b)
    assert a.integers(0, 100, size=5, dtype=np.uint32).tolist() == \
        b.integers(0, 100, size=5, dtype=np.uint32).tolist()


@pytest.mark.parametrize("bits", [np.random.PCG64, np.random.PCG64DXSM])
@pytest.mark.parametrize("high", [10, 2**40])
def test_rewind_puts_the_words_back_exactly(bits: type, high: int) -> None:
    rng = np.random.Generator(bits(11))
    rng.integers(0, 7, dtype=np.uint32)  # a buffered half, which the rewind keeps
    before = rng.bit_generator.state
    first, words = draws.counted_ints(rng, high, 37)
    assert draws.rewinds(rng)
    draws.rewind(rng, words)
    assert rng.bit_generator.state == before
    assert draws.counted_ints(rng, high, 37)[0].tolist() == first.tolist()


@pytest.mark.parametrize("bits", [np.random.MT19937, np.random.Philox, np.random.SFC64])
def test_generators_without_an_exact_rewind_are_not_rewound(bits: type) -> None:
    assert not draws.rewinds(np.random.Generator(bits(0)))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 40), st.integers(1, 50), st.booleans(),
       st.integers(0, 300), st.sampled_from(BIT_GENERATORS))
def test_lane_keys_in_one_call_are_the_two_steps(seed: int, lanes: int, rows: int,
                                                 equal: bool, size: int, bits: type) -> None:
    """``lane_ints`` (one C call) gives the keys and the generator state of
    ``uniform_ints`` then ``ring.uniform_keys``; with no live step it draws nothing."""
    from replaybank.ops import ring

    rng = np.random.default_rng(seed)
    counts = rng.integers(0, rows + 1, lanes).astype(np.int64)
    if equal:
        counts[:] = counts[0]
    # written up to about 2**51 // lanes, where the kernel's reciprocal division of keys
    # hands over to the machine's
    written = counts + rng.integers(0, [10**9, 2**51 // lanes][seed % 2], lanes)
    a, b = np.random.Generator(bits(seed)), np.random.Generator(bits(seed))
    got = draws.lane_ints(a, written, counts, size)
    if int(counts.sum()) == 0:
        assert got is None and same_state(a, b)
        return
    if got is None:  # no C kernels (REPLAYBANK_PURE_PYTHON=1)
        return
    want = ring.uniform_keys(draws.uniform_ints(b, int(counts.sum()), size), written, counts)
    assert got.tolist() == want.tolist()
    assert same_state(a, b)
