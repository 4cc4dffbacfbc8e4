"""Property tests of the core ReplayBuffer against a naive reference buffer.

The reference keeps, per lane, a plain list of the transition dicts the caller passed
(with their lane-local sequence numbers). Every live step of the real buffer must
return exactly the reference's transition, ``next_obs`` included, in every add order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.ops import ring
from replaybank.spec import flatten

FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "logp")


class RefBuffer:
    """Naive reference: per lane a list of ``(seq, transition)`` of the live steps."""

    def __init__(self, capacity: int, lanes: int) -> None:
        self.T = capacity // lanes
        self.lanes = lanes
        self.written = [0] * lanes
        self.items: list[list[tuple[int, dict[str, Any]]]] = [[] for _ in range(lanes)]

    def add(self, lane: int, tr: dict[str, Any]) -> None:
        self.items[lane].append((self.written[lane], tr))
        self.written[lane] += 1
        if len(self.items[lane]) > self.T:
            del self.items[lane][0]

    def clear(self) -> None:
        self.items = [[] for _ in range(self.lanes)]

    def __len__(self) -> int:
        return sum(len(x) for x in self.items)

    def live(self) -> dict[int, dict[str, Any]]:
        """Item key -> flat transition."""
        out = {}
        for lane, items in enumerate(self.items):
            for seq, tr in items:
                out[seq * self.lanes + lane] = flatten(tr)
        return out

    def boundaries(self) -> int:
        """Live steps whose next observation cannot be the next stored obs."""
        n = 0
        for items in self.items:
            for i, (_, tr) in enumerate(items):
                if i == len(items) - 1 or tr["terminated"] or tr["truncated"]:
                    n += 1
                    continue
                nxt = flatten({"o": tr["next_obs"]})
                cur = flatten({"o": items[i + 1][1]["obs"]})
                if any(nxt[k].tobytes() != cur[k].tobytes() for k in nxt):
                    n += 1
        return n


class Env:
    """Generates per-lane transitions: episodes, truncations and out-of-order jumps."""

    def __init__(self, rng: np.random.Generator, lanes: int, nested: bool,
                 p_done: float, p_jump: float) -> None:
        self.rng, self.nested, self.p_done, self.p_jump = rng, nested, p_done, p_jump
        self.cur = [self._obs() for _ in range(lanes)]

    def _obs(self) -> Any:
        # small integers so that equal values (and -0.0) occur now and then
        a = self.rng.integers(-2, 3, size=2).astype(np.float32)
        if self.rng.random() < 0.05:
            a[0] = -0.0
        if not self.nested:
            return a
        return {"a": a, "b": self.rng.integers(0, 4, size=(1,)).astype(np.uint8)}

    def step(self, lane: int) -> dict[str, Any]:
        r = self.rng
        if r.random() < self.p_jump:
            self.cur[lane] = self._obs()  # the caller's data does not continue
        obs = self.cur[lane]
        nxt = self._obs()
        u = r.random()
        term, trunc = bool(u < self.p_done / 2), bool(self.p_done / 2 <= u < self.p_done)
        self.cur[lane] = self._obs() if (term or trunc) else nxt
        action: Any = r.integers(0, 3, size=(1,)).astype(np.float32)
        if r.random() < 0.3:
            action = action.tolist()  # a list takes the general (validating) write path
        return {
            "obs": obs, "action": action,
            "reward": np.float32(r.integers(-5, 5)), "next_obs": nxt,
            "terminated": term, "truncated": trunc, "logp": np.float32(r.random()),
        }


def stack(trs: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack transitions along a new leading axis (nested dicts kept nested)."""
    out: dict[str, Any] = {}
    for k in trs[0]:
        if isinstance(trs[0][k], dict):
            out[k] = stack([t[k] for t in trs])
        else:
            out[k] = np.stack([np.asarray(t[k]) for t in trs])
    return out


def check_buffer(buf: rb.ReplayBuffer, ref: RefBuffer, side0: int, peak: int) -> None:
    assert len(buf) == len(ref)
    if len(ref) == 0:
        return
    t = buf.table
    live = ref.live()
    keys = np.array(sorted(live), dtype=np.int64)
    assert ring.is_live(keys, t.written, t.counts).all()
    got = buf.view.gather(t, keys)
    for i, key in enumerate(keys):
        want = live[int(key)]
        for name, value in want.items():
            g = np.asarray(got[name][i])
            w = np.asarray(value)
            assert g.dtype == t.spec[name.replace("next_", "", 1)].dtype, name
            assert g.tobytes() == w.astype(g.dtype).tobytes(), (name, int(key), g, w)
    # sampling returns the same transitions, by index
    batch = buf.sample(16)
    for i, key in enumerate(batch.indices):
        want = live[int(key)]
        for name, value in want.items():
            assert np.asarray(batch[name][i]).tobytes() == \
                np.asarray(value).astype(batch[name].dtype).tobytes(), name
        assert bool(batch.done[i]) == bool(want["terminated"] or want["truncated"])
    # side store: exactly one slot per live boundary step, and bounded growth
    assert t.side_in_use() == ref.boundaries()
    assert t.side_capacity <= max(side0, 2 * peak)


OPS = st.sampled_from(["add", "add_ids", "extend", "extend_ids", "clear"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lanes=st.integers(1, 4),
    rows=st.integers(1, 6),
    nested=st.booleans(),
    p_done=st.sampled_from([0.0, 0.2, 0.6]),
    p_jump=st.sampled_from([0.0, 0.2, 0.7]),
    seed=st.integers(0, 2**31 - 1),
    ops=st.lists(st.tuples(OPS, st.sampled_from([0, 1, 2, 3, 5, 9, 20, 40]),
                           st.integers(0, 15)), min_size=1,
                 max_size=25),
)
def test_matches_reference(lanes: int, rows: int, nested: bool, p_done: float, p_jump: float,
                           seed: int, ops: list[tuple[str, int, int]]) -> None:
    capacity = rows * lanes
    rng = np.random.default_rng(seed)
    env = Env(rng, lanes, nested, p_done, p_jump)
    buf = rb.ReplayBuffer(capacity=capacity, num_envs=lanes, seed=seed)
    ref = RefBuffer(capacity, lanes)
    side0 = min(capacity, max(4 * lanes, 64))
    peak = 0
    for op, n, pick in ops:
        if op == "clear":
            buf.clear()
            ref.clear()
        elif op in ("add", "add_ids"):
            if op == "add":
                ids = list(range(lanes))
            else:
                ids = [int(i) for i in rng.permutation(lanes)[: 1 + pick % lanes]]
            trs = [env.step(lane) for lane in ids]
            if op == "add" and lanes == 1:
                buf.add(**trs[0])
            elif op == "add":
                buf.add(**stack(trs))
            else:
                buf.add(env_ids=ids, **stack(trs))
            for lane, tr in zip(ids, trs, strict=True):
                ref.add(lane, tr)
        else:
            ids = list(range(lanes)) if op == "extend" else \
                [int(i) for i in rng.permutation(lanes)[: 1 + pick % lanes]]
            steps = [[env.step(lane) for lane in ids] for _ in range(n)]
            if n == 0:
                continue
            per_step = [stack(s) for s in steps]
            data = stack(per_step)  # [n, m, ...]
            if op == "extend" and lanes == 1:
                data = {k: v[:, 0] if not isinstance(v, dict) else
                        {kk: vv[:, 0] for kk, vv in v.items()} for k, v in data.items()}
                buf.extend(**data)
            elif op == "extend":
                buf.extend(**data)
            else:
                buf.extend(env_ids=ids, **data)
            for s in steps:
                for lane, tr in zip(ids, s, strict=True):
                    ref.add(lane, tr)
        peak = max(peak, ref.boundaries())
        check_buffer(buf, ref, side0, peak)


def _sequential(buf: rb.ReplayBuffer, n: int, episode_len: int, lanes: int) -> None:
    obs = np.zeros((lanes, 3), np.float32)
    for t in range(n):
        nxt = obs + 1
        done = np.full(lanes, (t + 1) % episode_len == 0)
        kw = {"obs": obs, "action": np.zeros((lanes, 1), np.float32),
              "reward": np.ones(lanes, np.float32), "next_obs": nxt,
              "terminated": done, "truncated": np.zeros(lanes, bool)}
        if lanes == 1:
            kw = {k: v[0] for k, v in kw.items()}
        buf.add(**kw)
        obs = np.where(done[:, None], -1.0, nxt).astype(np.float32)


@pytest.mark.parametrize("lanes", [1, 3])
def test_side_store_stays_small_for_sequential_data(lanes: int) -> None:
    rows, episode_len = 2000, 100
    buf = rb.ReplayBuffer(capacity=rows * lanes, num_envs=lanes, seed=0)
    _sequential(buf, 3 * rows, episode_len, lanes)
    t = buf.table
    # one slot per episode end in the ring plus one pending slot per lane
    episodes_live = rows // episode_len
    assert t.side_in_use() <= lanes * (episodes_live + 1)
    assert t.side_capacity <= max(64, 2 * lanes * (episodes_live + 2))
    obs_bytes = t.T * t.lanes * 3 * 4
    side_bytes = t.side_capacity * 3 * 4
    assert side_bytes <= 0.1 * obs_bytes


def test_released_side_slots_are_reused() -> None:
    buf = rb.ReplayBuffer(capacity=8, seed=0)
    for i in range(200):
        # every step is out of order: every live step needs a side slot
        buf.add(obs=np.full(2, i, np.float32), action=0.0, reward=0.0,
                next_obs=np.full(2, -i, np.float32), terminated=False, truncated=False)
    assert buf.table.side_in_use() == 8
    assert buf.table.side_capacity == 8  # capped at one slot per step, never more
