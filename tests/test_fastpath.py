"""The lean add/extend paths must leave a buffer exactly as the general path does.

Oracle: the same calls on a twin buffer whose fast paths are switched off (every call
validated and written by ``StepTable.write``); the full ``state_dict`` (data, links,
side store, free-slot order, counters) must match after every call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.errors import ShapeError


def _general(buf: rb.ReplayBuffer) -> rb.ReplayBuffer:
    buf._plan = lambda: None  # type: ignore[method-assign]
    return buf


def _same_state(a: rb.ReplayBuffer, b: rb.ReplayBuffer) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["metadata"] == sb["metadata"]
    ta, tb = sa["table"], sb["table"]
    assert ta.keys() == tb.keys()
    for k in ta:
        assert np.array_equal(np.asarray(ta[k]), np.asarray(tb[k])), k


def _chunk(rng: np.random.Generator, obs0: np.ndarray, n: int, p_end: float,
           p_break: float) -> tuple[dict[str, Any], np.ndarray]:
    obs = np.empty((n, 3), np.float32)
    nxt = np.empty((n, 3), np.float32)
    term = rng.random(n) < p_end / 2
    trunc = rng.random(n) < p_end / 2
    cur = obs0
    for i in range(n):
        obs[i] = cur
        nxt[i] = rng.standard_normal(3).astype(np.float32)
        cur = nxt[i] if not (term[i] or trunc[i]) else rng.standard_normal(3).astype(np.float32)
        if rng.random() < p_break:
            cur = rng.standard_normal(3).astype(np.float32)
    kw = {"obs": obs, "action": rng.integers(0, 4, n).astype(np.int64),
          "reward": rng.standard_normal(n).astype(np.float32), "next_obs": nxt,
          "terminated": term, "truncated": trunc}
    return kw, cur


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), cap=st.sampled_from([7, 16, 50]),
       p_end=st.sampled_from([0.0, 0.05, 0.3]), p_break=st.sampled_from([0.0, 0.02]))
def test_extend_and_add_match_general_path(seed: int, cap: int, p_end: float,
                                           p_break: float) -> None:
    rng = np.random.default_rng(seed)
    fast = rb.ReplayBuffer(capacity=cap, seed=0)
    fast.add(**_one(_chunk(rng, rng.standard_normal(3).astype(np.float32), 1, 0, 0)[0], 0))
    slow = _general(rb.ReplayBuffer(capacity=cap, seed=0))
    slow.load_state_dict(fast.state_dict())
    plan = fast._plan()
    assert plan is not None and plan.lean
    cur = rng.standard_normal(3).astype(np.float32)
    for _ in range(12):
        n = int(rng.integers(1, cap + 3))
        kw, cur = _chunk(rng, cur, n, p_end, p_break)
        if rng.random() < 0.3:  # single adds
            for i in range(n):
                one = _one(kw, i)
                fast.add(**one)
                slow.add(**one)
        else:
            fast.extend(**kw)
            slow.extend(**kw)
        _same_state(fast, slow)
        if rng.random() < 0.1:
            fast.clear()
            slow.clear()
    assert fast._fast is plan  # the lean plan served every call


def _one(kw: dict[str, Any], i: int) -> dict[str, Any]:
    one = {k: v[i] for k, v in kw.items()}
    one["reward"] = float(one["reward"])
    one["terminated"] = bool(one["terminated"])
    return one


def test_extend_next_obs_roundtrip() -> None:
    rng = np.random.default_rng(0)
    buf = rb.ReplayBuffer(capacity=64, seed=0)
    cur = rng.standard_normal(3).astype(np.float32)
    seen: dict[int, np.ndarray] = {}
    for _ in range(20):
        kw, cur = _chunk(rng, cur, 16, 0.1, 0.05)
        w = 0 if buf.spec is None else int(buf.table.written[0])
        buf.extend(**kw)
        for i in range(16):
            seen[w + i] = kw["next_obs"][i]
    keys = np.arange(int(buf.table.written[0]) - 64, int(buf.table.written[0]))
    got = buf.table.gather_next("obs", keys)
    want = np.stack([seen[int(k)] for k in keys])
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_rejected_extend_leaves_buffer_unchanged() -> None:
    rng = np.random.default_rng(1)
    buf = rb.ReplayBuffer(capacity=32, seed=0)
    kw, cur = _chunk(rng, rng.standard_normal(3).astype(np.float32), 8, 0.1, 0.0)
    buf.extend(**kw)
    before = buf.state_dict()
    before = {k: np.array(v, copy=True) for k, v in before["table"].items()}
    bad, _ = _chunk(rng, cur, 8, 0.1, 0.0)
    bad["reward"] = bad["reward"][:5]
    with pytest.raises(ShapeError, match="reward"):
        buf.extend(**bad)
    after = buf.state_dict()["table"]
    for k, v in before.items():
        assert np.array_equal(v, np.asarray(after[k])), k
