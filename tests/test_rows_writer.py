"""The compiled writer of rows buffers (``ReplayBuffer(next_obs=False)``) must leave a
buffer exactly as the reference writer does, and decline every call it cannot take
without writing a byte.

Oracle: a twin buffer filled under ``REPLAYBANK_WRITER=reference`` (every call
validated by the general path and written by the reference write); after every call the
full ``state_dict`` (data, links, side store, free-slot order, counters) and the sampler's
state must match. Calls: adds of every lane, adds of some lanes (``env_ids``: the lanes
fall out of step), extends, episode ends, ring wrap-around and eviction, flags given or
left out, flat and nested (front-end style ``prefix/key``) fields, prioritized samplers
with and without initial priorities, memory and memmap storage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.storage.writers.compiled import CompiledWriter, accelerated
from tests.test_fastpath import _same_sampler, _same_state, _table_bytes, _twins

pytestmark = pytest.mark.skipif(not accelerated(), reason="_lane not built")


def _values(rng: np.random.Generator, lead: tuple[int, ...], nested: bool, flags: bool,
            p_end: float) -> dict[str, Any]:
    """One call's fields with leading dims ``lead`` (``()``: one step of one lane)."""
    row = {"obs": rng.standard_normal((*lead, 3)).astype(np.float32),
           "action": rng.integers(0, 4, lead).astype(np.int64),
           "reward": rng.standard_normal(lead).astype(np.float32),
           "first": rng.random(lead) < 0.1}
    out: dict[str, Any] = {"w": row} if nested else dict(row)
    if flags:
        out["terminated"] = rng.random(lead) < p_end
        out["truncated"] = rng.random(lead) < p_end / 2
    return out


def _make(lanes: int, rows: int, prioritized: bool, storage: str = "numpy",
          path: Any = None) -> Callable[[], rb.ReplayBuffer]:
    def make() -> rb.ReplayBuffer:
        sampler = rb.PrioritizedSampler(alpha=0.6) if prioritized else None
        kw: dict[str, Any] = {"storage": storage, "path": path} if path is not None else {}
        return rb.ReplayBuffer(capacity=rows * lanes, num_envs=lanes, seed=0,
                               sampler=sampler, next_obs=False, **kw)
    return make


def _lead(lanes: int, steps: int | None) -> tuple[int, ...]:
    one = () if lanes == 1 else (lanes,)
    return one if steps is None else (steps, *one)


@pytest.mark.parametrize("prioritized", [False, True])
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), lanes=st.sampled_from([1, 2, 3]),
       rows=st.sampled_from([3, 8, 20]), p_end=st.sampled_from([0.0, 0.1, 0.5]),
       nested=st.booleans(), flags=st.booleans())
def test_rows_writes_match_the_reference_writer(prioritized: bool, seed: int, lanes: int,
                                                rows: int, p_end: float, nested: bool,
                                                flags: bool) -> None:
    rng = np.random.default_rng(seed)
    fast, slow = _twins("compiled", _make(lanes, rows, prioritized))
    first = _values(rng, _lead(lanes, None), nested, flags, p_end)
    for b in (fast, slow):
        b.add(**first)
    for _ in range(12):
        n = int(rng.integers(1, rows + 3))
        u = rng.random()
        given = prioritized and rng.random() < 0.5  # Ape-X style initial priorities

        def prio(*shape: int, given: bool = given) -> dict[str, Any]:
            return {"priority": rng.random(shape) * 3 + 0.1} if given else {}

        if u < 0.3:  # every lane, one step at a time
            for _ in range(n):
                one = {**_values(rng, _lead(lanes, None), nested, flags, p_end),
                       **prio(lanes)}
                fast.add(**one)
                slow.add(**one)
        elif u < 0.5:  # some lanes, in any order (async envs): the lanes fall out of step
            ids = rng.permutation(lanes)[:int(rng.integers(1, lanes + 1))]
            env_ids = ids.tolist() if rng.random() < 0.5 else ids
            for _ in range(n):
                one = {**_values(rng, (len(ids),), nested, flags, p_end), **prio(len(ids))}
                fast.add(env_ids=env_ids, **one)
                slow.add(env_ids=env_ids, **one)
        else:
            kw = {**_values(rng, _lead(lanes, n), nested, flags, p_end), **prio(n, lanes)}
            fast.extend(**kw)
            slow.extend(**kw)
        _same_state(fast, slow)
        _same_sampler(fast, slow)
        if rng.random() < 0.1:
            fast.clear()
            slow.clear()
    # the same batches and sequences come out of both
    outs = []
    for b in (fast.buf, slow.buf):
        try:
            outs.append(b.sample_sequences(4, 2, episode_boundary="cross"))
        except rb.errors.ReplayBankError as e:  # no window of 2 steps: the same error
            outs.append(type(e))
    a, b = outs
    if isinstance(a, type):
        assert a is b
    else:
        assert not isinstance(b, type) and a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k], b[k]), k


@pytest.mark.parametrize("prioritized", [False, True])
def test_rows_on_memmap_files_match_the_reference_writer(tmp_path: Any,
                                                        prioritized: bool) -> None:
    """Memmap rows tables are written by the compiled writer too, in the crash-safe
    order: same files as the general path's, through evictions and env_ids subsets."""
    rng = np.random.default_rng(5)
    names = iter(["fast", "general"])

    def make() -> rb.ReplayBuffer:
        return _make(3, 5, prioritized, "memmap", tmp_path / next(names))()

    fast, slow = _twins("compiled", make)
    first = _values(rng, (3,), True, True, 0.2)
    for b in (fast, slow):
        b.add(**first)
    for step in range(30):
        if step % 3 == 0:
            kw = _values(rng, (3, 3), True, step % 2 == 0, 0.2)
            fast.extend(**kw)
            slow.extend(**kw)
        elif step % 3 == 1:
            kw = _values(rng, (3,), True, True, 0.2)
            fast.add(**kw)
            slow.add(**kw)
        else:
            ids = rng.permutation(3)[:int(rng.integers(1, 4))]
            kw = _values(rng, (len(ids),), True, False, 0.2)
            fast.add(env_ids=ids, **kw)
            slow.add(env_ids=ids, **kw)
        _same_state(fast, slow)
        _same_sampler(fast, slow)
    assert fast.backend.name == "memmap"


def _writers(lanes: int, nested: bool) -> tuple[rb.ReplayBuffer, Any, Any]:
    rng = np.random.default_rng(0)
    buf = rb.ReplayBuffer(capacity=6 * lanes, num_envs=lanes, seed=0, next_obs=False)
    buf.add(**_values(rng, _lead(lanes, None), nested, True, 0.0))  # allocates
    w = CompiledWriter.of(buf.table)
    assert w is not None
    return buf, w.write, rng


_NAMED = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def _call(fields: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """A buffer call's (obs, action, reward, next_obs, terminated, truncated) and extras."""
    named = [fields.get(k, rb.spec.UNSET) for k in _NAMED]
    return named, {k: v for k, v in fields.items() if k not in _NAMED}


def _odd_calls(good: dict[str, Any], lead: tuple[int, ...], nested: bool
               ) -> list[tuple[str, dict[str, Any], bool]]:
    """Calls other than exactly the stored format: ``(name, call, taken)``, taken when the
    compiled rows writer's boundary casts them itself, else declined (the Python boundary
    converts, or raises)."""
    row = good["w"] if nested else good

    def with_row(**change: Any) -> dict[str, Any]:
        new = {**row, **change}
        for k in [k for k, v in change.items() if v is None]:
            del new[k]
        return {**good, "w": new} if nested else {**{k: v for k, v in good.items()
                                                       if k not in row}, **new}

    nc = np.zeros((*lead, 3, 2), np.float32)[..., 0]
    out = [
        ("obs float64", with_row(obs=row["obs"].astype(np.float64)), True),
        ("obs shape", with_row(obs=np.zeros((*lead, 4), np.float32)), False),
        ("obs non-contiguous", with_row(obs=nc), True),
        ("obs list", with_row(obs=row["obs"].tolist()), True),
        ("obs complex", with_row(obs=row["obs"] + 1j), False),
        ("action int32", with_row(action=np.asarray(row["action"], np.int32)), True),
        ("action fraction", with_row(action=np.full(lead, 0.5)), False),
        ("first bytes 2", with_row(first=np.full(lead, 2, np.uint8).view(bool)), True),
        ("first int 2", with_row(first=np.full(lead, 2, np.int64)), False),
        ("missing key", with_row(first=None), False),
        ("unknown key", with_row(other=row["reward"]), False),
        ("terminated int", {**good, "terminated": np.zeros(lead, np.int64)}, True),
        ("terminated 2", {**good, "terminated": np.full(lead, 2, np.int64)}, False),
        ("next_obs not stored", {**good, "next_obs": row["obs"]}, False),
    ]
    if nested:
        class D(dict):  # type: ignore[type-arg]
            pass
        out += [("dict subclass", {**good, "w": D(row)}, False),
                ("no prefix", {k: v for k, v in good.items() if k != "w"}, False),
                ("flat instead of nested", {**{k: v for k, v in good.items() if k != "w"},
                                            **row}, False)]
    return out


@pytest.mark.parametrize("lanes", [1, 3])
@pytest.mark.parametrize("nested", [False, True])
def test_rows_writer_takes_exact_calls_and_declines_the_rest_untouched(
        lanes: int, nested: bool) -> None:
    """The compiled writer of a rows table writes the calls it can cast (the flags may be
    left out) and declines anything else (0) before writing a byte; what it writes is
    the reference writer's table (``test_rows_writes_match_the_reference_writer``)."""
    buf, write, rng = _writers(lanes, nested)
    lead = _lead(lanes, None)
    every = list(range(lanes))
    for i in range(15):  # round the ring several times: evictions, wrap-around adds
        good = _values(rng, lead, nested, True, 0.3)
        for name, odd, taken in _odd_calls(good, lead, nested):
            if taken:
                continue
            before = _table_bytes(buf)
            named, extras = _call(odd)
            assert write(None, False, *named, extras) == 0, name
            assert write(every, False, *named, extras) == 0, name
            assert _table_bytes(buf) == before, name
        before_len = len(buf)
        named, extras = _call(good)
        assert write(None, False, *named, extras) == 1
        assert len(buf) == min(before_len + lanes, 6 * lanes)
        # the flags left out are stored as False
        named, extras = _call({k: v for k, v in good.items()
                               if k not in ("terminated", "truncated")})
        ends = buf.table.episodes.copy()
        assert write(None, False, *named, extras) == 1
        assert np.array_equal(buf.table.episodes, ends)
        ids = [lanes - 1]
        one = _values(rng, (1,), nested, i % 2 == 0, 0.3)
        named, extras = _call(one)
        assert write(ids, False, *named, extras) == 1  # lanes out of step
        chunk = _values(rng, _lead(lanes, 2), nested, i % 2 == 1, 0.3)
        named, extras = _call(chunk)
        before_w = buf.table.written.copy()
        assert write(None, True, *named, extras) == 2  # wrapping the ring or not
        assert np.array_equal(buf.table.written, before_w + 2)


@pytest.mark.parametrize("lanes", [1, 3])
@pytest.mark.parametrize("nested", [False, True])
def test_rows_odd_calls_match_the_reference_writer(lanes: int, nested: bool) -> None:
    """Every odd call gets the reference writer's answer: the same error, or the same
    stored bytes."""
    rng = np.random.default_rng(3)
    make = lambda: rb.ReplayBuffer(capacity=5 * lanes, num_envs=lanes, seed=0,  # noqa: E731
                                   next_obs=False)
    fast, slow = _twins("compiled", make)
    lead = _lead(lanes, None)
    first = _values(rng, lead, nested, True, 0.0)
    for b in (fast, slow):
        b.add(**first)
    for _ in range(3):
        good = _values(rng, lead, nested, True, 0.3)
        for name, odd, _ in _odd_calls(good, lead, nested):
            errs = []
            for b in (fast, slow):
                try:
                    b.add(**odd)
                    errs.append(None)
                except rb.ReplayBankError as e:
                    errs.append(type(e))
            assert errs[0] == errs[1], name
            _same_state(fast, slow)


def test_small_rows_tables_keep_the_python_paths() -> None:
    """A rows table with fewer than three fields besides the flags is served by the
    reference writer (the compiled writer declines to build), and still stores exactly."""
    buf = rb.ReplayBuffer(capacity=8, next_obs=False, seed=0)
    buf.add(x=np.zeros(2, np.float32), y=1.0)
    assert CompiledWriter.of(buf.table) is None
    for t in range(10):
        buf.add(x=np.full(2, t, np.float32), y=float(t), terminated=t % 4 == 3)
    sb = buf.sample_sequences(3, 2, episode_boundary="cross")
    assert np.array_equal(sb["x"][:, 1, 0] - sb["x"][:, 0, 0], np.ones(3))
