"""The rate limiter of the replay service (replaybank.distributed.limiter), against a
plain-Python oracle written from the documented rule: Reverb's per-call checks plus the
centre clause for large calls, with exact rational arithmetic."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
import math
import random
import re
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank
from replaybank.distributed.limiter import RateLimit, RateLimiter, RateLimitTimeout
from replaybank.errors import CheckpointError, ConfigError, ReplayBankError

# --------------------------------------------------------------------------- the oracle


class Oracle:
    """The rule of the module docstring, written out naively.

    Reverb: an insert of n goes while ``size + n <= min_size`` or ``(I + n) * spi - S <=
    max_diff``; a sample of n goes when ``size >= min_size`` and ``I * spi - S - n >=
    min_diff``. replaybank adds: an insert also goes while ``size < min_size`` or ``diff <=
    centre``, a sample also when ``size >= min_size`` and ``diff >= centre``.
    """

    def __init__(self, min_size: int, spi: float | None, error_buffer: Any) -> None:
        self.min_size, self.ratio = min_size, spi
        self.inserts = self.samples = self.deletes = 0
        if spi is None:
            self.spi = Fraction(1)
            self.lo: Fraction | float = -math.inf
            self.hi: Fraction | float = math.inf
            return
        self.spi = Fraction(spi)
        if isinstance(error_buffer, (tuple, list)):
            self.lo, self.hi = Fraction(error_buffer[0]), Fraction(error_buffer[1])
        else:
            half = Fraction(max(1.0, spi)) if error_buffer is None else Fraction(error_buffer)
            self.lo = self.spi * min_size - half
            self.hi = self.spi * min_size + half

    @property
    def size(self) -> int:
        return self.inserts - self.deletes

    @property
    def diff(self) -> Fraction:
        return self.inserts * self.spi - self.samples

    @property
    def centre(self) -> Fraction | float:
        return (self.lo + self.hi) / 2

    def reverb_insert(self, n: int) -> bool:
        if self.ratio is None:
            return True
        return (self.inserts + n - self.deletes <= self.min_size
                or (self.inserts + n) * self.spi - self.samples <= self.hi)

    def reverb_sample(self, n: int) -> bool:
        if self.inserts - self.deletes < self.min_size:
            return False
        return self.ratio is None or self.inserts * self.spi - self.samples - n >= self.lo

    def exactly_wide_enough(self) -> bool:
        """The window is at least ``2 * max(1, spi)`` wide in exact arithmetic (the limit
        also accepts windows narrower by float rounding, ``limiter.ROUNDING_ULPS``)."""
        return self.ratio is None or self.hi - self.lo >= 2 * max(1, self.spi)

    def can_insert(self, n: int) -> bool:
        if self.ratio is None:
            return True
        return self.reverb_insert(n) or self.size < self.min_size or self.diff <= self.centre

    def can_sample(self, n: int) -> bool:
        extra = self.ratio is not None and self.size >= self.min_size \
            and self.diff >= self.centre
        return self.reverb_sample(n) or extra


def limiter_and_oracle(min_size: int, spi: float | None,
                       error_buffer: Any) -> tuple[RateLimiter, Oracle]:
    return (RateLimiter(RateLimit(min_size, spi, error_buffer)),
            Oracle(min_size, spi, error_buffer))


SIZES = (1, 2, 3, 5, 7, 16, 33, 100, 256, 1000)


def assert_agree(limiter: RateLimiter, oracle: Oracle) -> None:
    stats = limiter.stats()
    assert limiter.size == oracle.size == stats["size"]
    assert stats["diff"] == float(oracle.diff)
    assert (stats["min_diff"], stats["max_diff"]) == (float(oracle.lo), float(oracle.hi))
    for n in SIZES:
        assert limiter.can_insert(n) == oracle.can_insert(n), ("insert", n, stats)
        assert limiter.can_sample(n) == oracle.can_sample(n), ("sample", n, stats)


def apply(limiter: RateLimiter, oracle: Oracle, kind: str, n: int) -> None:
    if kind == "insert":
        limiter.on_insert(n)
        oracle.inserts += n
    elif kind == "sample":
        limiter.on_sample(n)
        oracle.samples += n
    else:
        n = min(n, oracle.size)
        limiter.on_delete(n)
        oracle.deletes += n


# --------------------------------------------------------------------------- truth tables

# (min_size, spi, error_buffer, ops, n, can_insert(n), can_sample(n)); expectations worked
# out by hand from the rule, the comment gives the numbers
TABLE = [
    # min size only: inserts always go, samples once size >= 3
    (3, None, None, [("insert", 2)], 1, True, False),
    (3, None, None, [("insert", 3)], 500, True, True),
    (3, None, None, [("insert", 3), ("delete", 1)], 1, True, False),
    (3, None, None, [("insert", 3), ("sample", 10**6)], 10**6, True, True),
    # spi 1, e 3, min 10: window [7, 13], centre 10
    (10, 1.0, 3.0, [("insert", 9)], 1, True, False),  # filling, size 9 < 10
    (10, 1.0, 3.0, [("insert", 9)], 50, True, False),  # size < min: any insert goes
    (10, 1.0, 3.0, [("insert", 10)], 3, True, True),  # diff 10: +3 = 13 <= 13, -3 = 7 >= 7
    (10, 1.0, 3.0, [("insert", 10)], 4, True, True),  # both over the edge, diff at centre
    (10, 1.0, 3.0, [("insert", 12)], 1, True, True),  # diff 12: 13 <= 13
    (10, 1.0, 3.0, [("insert", 12)], 2, False, True),  # 14 > 13 and 12 > centre
    (10, 1.0, 3.0, [("insert", 13)], 1, False, True),  # diff 13: 14 > 13
    (10, 1.0, 3.0, [("insert", 12), ("sample", 3)], 2, True, True),  # diff 9: 7 >= 7
    (10, 1.0, 3.0, [("insert", 12), ("sample", 3)], 3, True, False),  # 6 < 7, 9 < centre
    (10, 1.0, 3.0, [("insert", 10), ("sample", 3)], 1, True, False),  # diff 7: 6 < 7
    # deletes lower size (back to filling) but not diff
    (10, 1.0, 3.0, [("insert", 13), ("delete", 4)], 1, True, False),  # size 9: filling
    (10, 1.0, 3.0, [("insert", 13), ("delete", 3)], 1, False, True),  # size 10, diff 13
    # spi 4, e 8, min 2: window [0, 16], centre 8
    (2, 4.0, 8.0, [("insert", 2)], 2, True, True),  # diff 8: 16 <= 16 and 6 >= 0
    (2, 4.0, 8.0, [("insert", 3)], 1, True, True),  # diff 12: 12 + 4 = 16 <= 16
    (2, 4.0, 8.0, [("insert", 3)], 2, False, True),  # 20 > 16 and 12 > centre 8
    (2, 4.0, 8.0, [("insert", 4)], 1, False, True),  # diff 16: 20 > 16
    (2, 4.0, 8.0, [("insert", 2), ("sample", 7)], 2, True, False),  # diff 1: -1 < 0
    (2, 4.0, 8.0, [("insert", 2), ("sample", 7)], 1, True, True),  # diff 1: 0 >= 0
    # a window given as a pair, not centred on spi * min_size: [0, 2], centre 1
    (1, 1.0, (0.0, 2.0), [("insert", 1)], 256, True, True),  # diff 1 = centre
    (1, 1.0, (0.0, 2.0), [("insert", 2)], 256, False, True),  # diff 2 > centre
    (1, 1.0, (0.0, 2.0), [("insert", 1), ("sample", 1)], 256, True, False),  # diff 0
    # spi below 1: window spi * min +- 1 (the narrowest allowed), min 4, spi 0.25: [0, 2]
    (4, 0.25, None, [("insert", 4)], 1, True, True),  # diff 1: 1.25 <= 2, 0 >= 0
    (4, 0.25, None, [("insert", 8)], 1, False, True),  # diff 2: 2.25 > 2, 2 > centre 1
]


@pytest.mark.parametrize("min_size, spi, buf, ops, n, want_insert, want_sample", TABLE)
def test_truth_table(min_size: int, spi: float | None, buf: Any, ops: list[tuple[str, int]],
                     n: int, want_insert: bool, want_sample: bool) -> None:
    limiter, oracle = limiter_and_oracle(min_size, spi, buf)
    for kind, count in ops:
        apply(limiter, oracle, kind, count)
    assert limiter.can_insert(n) is want_insert
    assert limiter.can_sample(n) is want_sample
    assert (oracle.can_insert(n), oracle.can_sample(n)) == (want_insert, want_sample)
    assert_agree(limiter, oracle)


# --------------------------------------------------------------------------- properties


@st.composite
def limits(draw: st.DrawFn) -> tuple[int, float | None, Any]:
    min_size = draw(st.integers(1, 30))
    spi = draw(st.sampled_from([None, 0.1, 0.25, 1.0, 1.5, 3.0, 7.5, 32.0]))
    if spi is None:
        return min_size, None, None
    need = max(1.0, spi)
    form = draw(st.sampled_from(["none", "half", "pair"]))
    if form == "none":
        return min_size, spi, None
    if form == "half":
        return min_size, spi, need * draw(st.sampled_from([1.0, 1.5, 4.0, 40.0]))
    lo = spi * min_size - draw(st.sampled_from([0.0, 1.0, 10.0, 100.0]))
    return min_size, spi, (lo, lo + 2 * need * draw(st.sampled_from([1.0, 3.0, 20.0])))


ops_strategy = st.lists(
    st.tuples(st.sampled_from(["insert", "sample", "delete"]),
              st.sampled_from([1, 1, 2, 3, 7, 32, 256])),
    max_size=60)


@settings(max_examples=300, deadline=None)
@given(limit=limits(), ops=ops_strategy)
def test_random_ops_agree_with_the_oracle(limit: tuple[int, float | None, Any],
                                          ops: list[tuple[str, int]]) -> None:
    limiter, oracle = limiter_and_oracle(*limit)
    assert_agree(limiter, oracle)
    for kind, n in ops:
        apply(limiter, oracle, kind, n)
        assert_agree(limiter, oracle)
        # one item at a time, the decisions are Reverb's own, for every window Reverb
        # accepts (the strategy's float windows may be an ulp narrower: see below)
        if oracle.exactly_wide_enough():
            assert limiter.can_insert(1) == oracle.reverb_insert(1)
            assert limiter.can_sample(1) == oracle.reverb_sample(1)
        # an insert and a sample are never both blocked, whatever their sizes (both
        # decisions only get harder as n grows, so the largest n is the test)
        assert limiter.can_insert(10**9) or limiter.can_sample(10**9)


@settings(max_examples=300, deadline=None)
@given(limit=limits(), ops=ops_strategy)
def test_allowed_calls_stay_in_the_window_or_overshoot_by_the_documented_bound(
        limit: tuple[int, float | None, Any], ops: list[tuple[str, int]]) -> None:
    """Only allowed calls: from inside the window (past the filling stage) a call of n
    items leaves diff in [min_diff - max(0, n - w/2), max_diff + max(0, n*spi - w/2)]."""
    limiter, oracle = limiter_and_oracle(*limit)
    if oracle.ratio is None:
        return
    half = (oracle.hi - oracle.lo) / 2
    for kind, n in ops:
        inside = oracle.lo <= oracle.diff <= oracle.hi and oracle.size >= oracle.min_size
        if kind == "insert" and limiter.can_insert(n):
            apply(limiter, oracle, kind, n)
            if inside:
                assert oracle.diff <= oracle.hi + max(0, n * oracle.spi - half)
        elif kind == "sample" and limiter.can_sample(n):
            apply(limiter, oracle, kind, n)
            if inside:
                assert oracle.diff >= oracle.lo - max(0, n - half)
                if n <= half:
                    assert oracle.diff >= oracle.lo
        elif kind == "delete":
            apply(limiter, oracle, kind, n)


# --------------------------------------------------------------------------- the limit


def test_error_buffer_forms() -> None:
    assert (RateLimit(100, 4.0, 40.0).min_diff, RateLimit(100, 4.0, 40.0).max_diff) == (360, 440)
    assert (RateLimit(5, 2.0, (-3, 9)).min_diff, RateLimit(5, 2.0, (-3, 9)).max_diff) == (-3, 9)
    assert RateLimit(5, 2.0, [-3, 9]).error_buffer == (-3.0, 9.0)  # type: ignore[arg-type]
    narrow = RateLimit(5, 2.0)  # spi * min +- max(1, spi)
    assert (narrow.min_diff, narrow.max_diff) == (8.0, 12.0)
    assert (RateLimit(5, 0.5).min_diff, RateLimit(5, 0.5).max_diff) == (1.5, 3.5)
    only_size = RateLimit(7)
    assert (only_size.min_diff, only_size.max_diff) == (-math.inf, math.inf)
    limit = RateLimit(np.int64(5), np.float32(0.5), np.float64(1.0))
    assert limit == RateLimit(5, 0.5, 1.0) and type(limit.min_size_to_sample) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        limit.min_size_to_sample = 3  # type: ignore[misc]


@pytest.mark.parametrize("kwargs, names", [
    ({"min_size_to_sample": 0}, ["min_size_to_sample=0", "min_size_to_sample=1000"]),
    ({"min_size_to_sample": True}, ["min_size_to_sample=True"]),
    ({"min_size_to_sample": 2.0}, ["min_size_to_sample=2.0"]),
    ({"samples_per_insert": 0.0}, ["samples_per_insert=0.0", "> 0"]),
    ({"samples_per_insert": math.nan}, ["samples_per_insert=nan"]),
    ({"samples_per_insert": "4"}, ["samples_per_insert='4'"]),
    ({"error_buffer": 4.0}, ["error_buffer=4.0", "samples_per_insert=None"]),
    ({"samples_per_insert": 4.0, "error_buffer": 3.9}, ["error_buffer=3.9", ">= max(1"]),
    ({"samples_per_insert": 0.5, "error_buffer": 0.5}, ["error_buffer=0.5", "= 1"]),
    ({"samples_per_insert": 1.0, "error_buffer": math.inf}, ["error_buffer=inf"]),
    ({"samples_per_insert": 1.0, "error_buffer": (0.0, 1.5)}, ["1.5 wide", "(0, 2)"]),
    ({"samples_per_insert": 1.0, "error_buffer": (0.0, 2.0, 4.0)}, ["pair"]),
    ({"min_size_to_sample": 10, "samples_per_insert": 1.0, "error_buffer": (11.0, 20.0)},
     ["min_diff 11", "at most 10"]),
])
def test_bad_limits_raise_config_errors_naming_the_value(kwargs: dict[str, Any],
                                                         names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        RateLimit(**kwargs)
    for text in names:
        assert text in str(info.value)


# windows written in decimals at exactly the minimum width (or bottom), which binary floats
# round to a hair narrower (or higher): 3.3 - 1.3 == 1.9999999999999998, 0.7 * 3 ==
# 2.0999999999999996; the hypothesis strategy above builds such windows as lo + width
EDGE_WINDOWS = [
    (2, 1.0, (1.3, 3.3)),
    (13, 0.1, (0.1 * 13, 0.1 * 13 + 2.0)),
    (3, 0.1, (0.1 * 3, 0.1 * 3 + 2.0)),
    (3, 0.7, (2.1, 4.1)),  # bottom 2.1 written at spi * min_size = 0.7 * 3
    (1, 1.1, (0.0, 2.2)),
    (1_000_001, 1.0, (1e6 + 0.3, 1e6 + 2.3)),
    (10, 0.3, 1.0),
]


@pytest.mark.parametrize("min_size, spi, buf", EDGE_WINDOWS)
def test_windows_at_the_minimum_width_up_to_float_rounding_are_accepted(
        min_size: int, spi: float, buf: Any) -> None:
    limit = RateLimit(min_size, spi, buf)
    limiter = RateLimiter(limit)
    limiter.on_insert(min_size)
    # every call of one item is decided, and an insert and a sample are never both blocked
    for _ in range(50):
        assert limiter.can_insert(1) or limiter.can_sample(1)
        if limiter.can_sample(1):
            limiter.on_sample(1)
        else:
            limiter.on_insert(1)


SUGGESTION = re.compile(r"error_buffer=(\([^()]*\)|[-+0-9.e]+)$|at most ([-+0-9.e]+)$")


@st.composite
def near_limits(draw: st.DrawFn) -> tuple[int, float, Any]:
    """Limits near the validation's edges, as a user would write them in decimals."""
    min_size = draw(st.integers(1, 40))
    spi = draw(st.sampled_from([0.1, 0.3, 0.7, 1.0, 1.1, 1.2345678, 3.0, 7.5]))
    need = 2 * max(1.0, spi)
    if draw(st.booleans()):
        return min_size, spi, need / 2 + draw(st.sampled_from([-0.5, -1e-3, -1e-9, 0.0]))
    lo = round(spi * min_size - draw(st.sampled_from([0.0, 0.05, 1.0, -0.1, -1e-9, -3.0])), 6)
    width = need + draw(st.sampled_from([-1.0, -0.01, -1e-9, 0.0, 0.5]))
    return min_size, spi, (lo, round(lo + width, 6))


@settings(max_examples=300, deadline=None)
@given(limit=near_limits())
def test_the_fix_an_error_suggests_is_accepted(limit: tuple[int, float, Any]) -> None:
    """A rejected limit's message suggests a value, never the rejected one, that passes."""
    min_size, spi, buf = limit
    try:
        RateLimit(min_size, spi, buf)
        return
    except ConfigError as exc:
        message = str(exc)
    m = SUGGESTION.search(message)
    assert m is not None, message
    if m.group(2) is not None:  # "lower min_diff to at most x"
        lo = float(m.group(2))
        fixed: Any = (lo, max(buf[1], lo + 2 * max(1.0, spi)))
    else:
        fixed = ast.literal_eval(m.group(1))
    assert fixed != buf, message
    RateLimit(min_size, spi, fixed)


def test_bad_counts_raise_and_change_nothing() -> None:
    limiter = RateLimiter(RateLimit(2, 1.0, 2.0))
    limiter.on_insert(3)
    before = limiter.state_dict()
    for call, arg in [(limiter.on_insert, -1), (limiter.on_sample, 1.0),
                      (limiter.on_delete, True), (limiter.on_delete, 4),
                      (limiter.can_insert, 0), (limiter.can_sample, np.float64(2))]:
        with pytest.raises(ConfigError):
            call(arg)
    assert limiter.state_dict() == before
    limiter.on_insert(0)
    limiter.on_delete(np.int64(3))
    assert limiter.size == 0
    with pytest.raises(ConfigError, match="limit must be a RateLimit"):
        RateLimiter({"min_size_to_sample": 3})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="timeout"):
        asyncio.run(limiter.wait_insert(1, timeout=-1.0))
    with pytest.raises(ConfigError, match="n counts items"):
        asyncio.run(limiter.wait_sample(0))


def test_min_size_rule() -> None:
    limiter = RateLimiter(RateLimit(min_size_to_sample=4))
    for _ in range(3):
        limiter.on_insert(1)
        assert not limiter.can_sample(1)
    limiter.on_insert(1)
    assert limiter.can_sample(1) and limiter.can_sample(10**9)
    limiter.on_sample(10**9)  # no ratio: sampling is free past the minimum size
    assert limiter.can_sample(1) and limiter.can_insert(10**9)
    limiter.on_delete(1)  # overwritten/removed items count against the minimum size
    assert not limiter.can_sample(1)
    stats = limiter.stats()
    assert (stats["inserts"], stats["samples"], stats["deletes"], stats["size"]) == \
        (4, 10**9, 1, 3)


# --------------------------------------------------------------------------- waiting


def test_wait_times_out_without_counting_and_says_what_unblocks_it() -> None:
    limiter = RateLimiter(RateLimit(3, 2.0, 2.0))  # window [4, 8], centre 6
    limiter.on_insert(1)
    start = time.monotonic()
    with pytest.raises(RateLimitTimeout) as info:
        asyncio.run(limiter.wait_sample(1, timeout=0.05))
    assert 0.04 <= time.monotonic() - start < 2.0
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, ReplayBankError)
    text = str(info.value)
    for part in ("RateLimit(min_size_to_sample=3", "inserts=1", "samples=0", "size=1",
                 "insert 2 more"):
        assert part in text, text
    stats = limiter.stats()
    assert (stats["samples"], stats["sample_timeouts"], stats["blocked_samples"],
            stats["waiting_samples"]) == (0, 1, 1, 0)


@pytest.mark.parametrize("kind, n", [("insert", 1), ("insert", 3), ("sample", 1),
                                     ("sample", 5), ("sample", 40)])
def test_timeout_message_counts_are_exactly_what_unblocks(kind: str, n: int) -> None:
    # spi 2, e 4, min 3: window [2, 10], centre 6; insert-blocked from diff 10, sample-
    # blocked from diff 2
    limiter = RateLimiter(RateLimit(3, 2.0, 4.0))
    limiter.on_insert(5)
    if kind == "sample":
        limiter.on_sample(8)
    wait = limiter.wait_insert if kind == "insert" else limiter.wait_sample
    with pytest.raises(RateLimitTimeout) as info:
        asyncio.run(wait(n, timeout=0))
    text = str(info.value)
    other = "sample" if kind == "insert" else "insert"
    more = int(text.split(f"{other} ")[-1].split(" more")[0])
    state = limiter.state_dict()
    can = limiter.can_insert if kind == "insert" else limiter.can_sample
    count = limiter.on_sample if kind == "insert" else limiter.on_insert
    count(more - 1)
    assert not can(n), text  # one fewer is not enough
    count(1)
    assert can(n), text
    limiter.load_state_dict(state)


def test_timeout_zero_checks_once_and_counts_an_allowed_call() -> None:
    limiter = RateLimiter(RateLimit(1, 1.0, 1.0))
    asyncio.run(limiter.wait_insert(1, timeout=0))
    asyncio.run(limiter.wait_sample(1, timeout=0))
    limiter.wait_insert_blocking(1, timeout=0)
    stats = limiter.stats()
    assert (stats["inserts"], stats["samples"], stats["blocked_inserts"]) == (2, 1, 0)


def test_blocking_wait_times_out() -> None:
    limiter = RateLimiter(RateLimit(2))
    start = time.monotonic()
    with pytest.raises(RateLimitTimeout, match="insert 2 more"):
        limiter.wait_sample_blocking(3, timeout=0.05)
    assert 0.04 <= time.monotonic() - start < 2.0
    assert limiter.stats()["sample_timeouts"] == 1


def test_async_waiter_is_woken_by_synchronous_counting_on_its_loop() -> None:
    limiter = RateLimiter(RateLimit(2))

    async def main() -> list[str]:
        log: list[str] = []

        async def sampler() -> None:
            await limiter.wait_sample(5, timeout=2.0)
            log.append("sampled")

        task = asyncio.create_task(sampler())
        await asyncio.sleep(0.01)
        assert limiter.stats()["waiting_samples"] == 1
        limiter.on_insert(1)
        await asyncio.sleep(0.01)
        log.append("one inserted")
        limiter.on_insert(1)
        await asyncio.wait_for(task, 2.0)
        return log

    assert asyncio.run(main()) == ["one inserted", "sampled"]
    stats = limiter.stats()
    assert (stats["samples"], stats["blocked_samples"], stats["waiting_samples"]) == (5, 1, 0)


def test_async_waiter_is_woken_from_another_thread_and_thread_waiter_from_async() -> None:
    limiter = RateLimiter(RateLimit(1, 1.0, 1.0))  # window [0, 2], centre 1

    async def main() -> None:
        timer = threading.Timer(0.05, limiter.on_insert, args=(1,))
        timer.start()
        await limiter.wait_sample(1, timeout=2.0)  # woken by the thread's insert
        timer.join()
        limiter.on_insert(2)  # diff 2: inserts blocked
        done = threading.Event()

        def thread_insert() -> None:
            limiter.wait_insert_blocking(1, timeout=2.0)
            done.set()

        thread = threading.Thread(target=thread_insert)
        thread.start()
        await asyncio.sleep(0.05)
        assert not done.is_set()
        await limiter.wait_sample(1, timeout=2.0)  # diff 1: the thread may go
        await asyncio.get_running_loop().run_in_executor(None, thread.join, 2.0)
        assert done.is_set()

    asyncio.run(main())
    assert limiter.stats()["inserts"] == 4


def _run_pair(limit: RateLimit, insert_n: int, insert_calls: int, sample_n: int,
              sample_calls: int, check_window: bool) -> RateLimiter:
    limiter = RateLimiter(limit)
    rng = random.Random(0)
    violations: list[dict[str, Any]] = []

    def check() -> None:
        stats = limiter.stats()
        if check_window and stats["size"] >= limit.min_size_to_sample \
                and not stats["min_diff"] <= stats["diff"] <= stats["max_diff"]:
            violations.append(stats)

    async def inserter() -> None:
        for _ in range(insert_calls):
            await limiter.wait_insert(insert_n, timeout=5.0)
            check()
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)

    async def sampler() -> None:
        for _ in range(sample_calls):
            await limiter.wait_sample(sample_n, timeout=5.0)
            check()
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(inserter(), sampler()), timeout=20.0)

    asyncio.run(main())
    assert not violations, violations[:3]
    stats = limiter.stats()
    assert (stats["inserts"], stats["samples"]) == (insert_n * insert_calls,
                                                    sample_n * sample_calls)
    assert (stats["waiting_inserts"], stats["waiting_samples"]) == (0, 0)
    return limiter


def test_concurrent_inserter_and_sampler_finish_and_keep_the_ratio_in_the_window() -> None:
    # spi 4, e 40, min 50: window [160, 240]; calls of 8 items (32 of diff) and 30 samples
    # are within half the window, so diff never leaves it; the totals end at the centre
    limit = RateLimit(50, 4.0, 40.0)
    limiter = _run_pair(limit, 8, 250, 30, 260, check_window=True)
    stats = limiter.stats()
    assert stats["diff"] == 200.0
    assert stats["blocked_inserts"] > 0 and stats["blocked_samples"] > 0


def test_calls_far_larger_than_the_window_do_not_deadlock() -> None:
    # window [-1, 3] (spi 1, e 2, min 1): inserts of 96 and samples of 256 items
    limiter = _run_pair(RateLimit(1, 1.0, 2.0), 96, 8, 256, 3, check_window=False)
    assert limiter.stats()["diff"] == 0.0


def test_concurrent_threads_with_blocking_waits() -> None:
    limit = RateLimit(10, 2.0, 8.0)  # window [12, 28]
    limiter = RateLimiter(limit)
    errors: list[BaseException] = []

    def loop(call: Any, n: int, times: int) -> None:
        try:
            for _ in range(times):
                call(n, timeout=5.0)
                stats = limiter.stats()
                if stats["size"] >= 10:
                    assert 12 <= stats["diff"] <= 28, stats
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(limiter.wait_insert_blocking, 2, 300)),
               threading.Thread(target=loop, args=(limiter.wait_sample_blocking, 4, 295))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20.0)
    assert not errors, errors[0]
    assert limiter.stats()["diff"] == 20.0


# --------------------------------------------------------------------------- state


@settings(max_examples=100, deadline=None)
@given(limit=limits(), ops=ops_strategy)
def test_state_dict_round_trip_is_exact(limit: tuple[int, float | None, Any],
                                        ops: list[tuple[str, int]]) -> None:
    limiter, oracle = limiter_and_oracle(*limit)
    for kind, n in ops:
        apply(limiter, oracle, kind, n)
    state = json.loads(json.dumps(limiter.state_dict()))
    other = RateLimiter(RateLimit(*limit))
    other.load_state_dict(state)
    assert other.state_dict() == limiter.state_dict()
    assert other.stats() == limiter.stats()
    assert_agree(other, oracle)


def test_load_state_dict_rejects_bad_state_and_keeps_its_own() -> None:
    limiter = RateLimiter(RateLimit(2, 1.0, 2.0))
    limiter.on_insert(5)
    asyncio.run(limiter.wait_sample(1))
    state = limiter.state_dict()
    other = RateLimiter(RateLimit(2, 1.0, 3.0))
    with pytest.raises(CheckpointError, match="saved under limit"):
        other.load_state_dict(state)
    for bad in ([1, 2], {**state, "inserts": -1}, {**state, "deletes": 9},
                {k: v for k, v in state.items() if k != "samples"}, {**state, "samples": 1.5}):
        with pytest.raises(CheckpointError):
            limiter.load_state_dict(bad)  # type: ignore[arg-type]
    assert limiter.state_dict() == state


def test_module_imports_no_ray() -> None:
    source = Path(replaybank.__file__).parent / "distributed" / "limiter.py"
    tree = ast.parse(source.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert not imported & {"ray", "torch", "numpy", "gymnasium"}, imported
