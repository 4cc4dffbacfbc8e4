"""n-step returns against a plain-loop oracle: episodes, truncations, wrap-around, lanes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.errors import ConfigError
from replaybank.ops import nstep


# ---------------------------------------------------------------------- ops
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 8), st.floats(0.0, 1.0), st.integers(0, 10_000))
def test_ops_match_loop(n: int, b: int, gamma: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    boundary = rng.random((b, n)) < 0.3
    rewards = rng.standard_normal((b, n))
    lengths = nstep.window_lengths(boundary)
    got = nstep.discounted_returns(rewards, lengths, gamma)
    for i in range(b):
        length = n
        for k in range(n):
            if boundary[i, k]:
                length = k + 1
                break
        assert lengths[i] == length
        g = 0.0
        for k in range(length):
            g += gamma**k * rewards[i, k]
        assert got[i] == pytest.approx(g, rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------------- oracle
class Oracle:
    """Every step as passed, per lane, oldest to newest (the last T kept)."""

    def __init__(self, lanes: int, rows: int) -> None:
        self.steps: list[list[dict[str, Any]]] = [[] for _ in range(lanes)]
        self.written = [0] * lanes
        self.rows = rows

    def add(self, lane: int, step: dict[str, Any]) -> None:
        self.steps[lane].append(step)
        self.written[lane] += 1
        if len(self.steps[lane]) > self.rows:
            self.steps[lane].pop(0)

    def nstep(self, key: int, lanes: int, n: int, gamma: float) -> dict[str, Any]:
        seq, lane = divmod(key, lanes)
        steps = self.steps[lane]
        i = seq - (self.written[lane] - len(steps))
        g, length = 0.0, 0
        for k in range(n):
            s = steps[i + k]
            g += gamma**k * float(s["reward"])
            length = k + 1
            newest = i + k == len(steps) - 1
            if s["terminated"] or s["truncated"] or newest or \
                    not np.array_equal(s["next_obs"], steps[i + k + 1]["obs"]):
                break
        last = steps[i + length - 1]
        return {"reward": g, "discount": gamma**length, "next_obs": last["next_obs"],
                "terminated": last["terminated"], "truncated": last["truncated"],
                "obs": steps[i]["obs"], "action": steps[i]["action"], "length": length,
                "last_key": key + (length - 1) * lanes}


class Env:
    """A toy vector env: random obs chains with terminations, truncations and the odd
    discontinuity (the next step's obs is not the previous next_obs)."""

    def __init__(self, lanes: int, rng: np.random.Generator) -> None:
        self.rng = rng
        self.obs = rng.standard_normal((lanes, 3)).astype(np.float32)

    def step(self, lane_ids: np.ndarray) -> dict[str, np.ndarray]:
        m = len(lane_ids)
        r = self.rng
        nxt = r.standard_normal((m, 3)).astype(np.float32)
        u = r.random(m)
        term, trunc = u < 0.08, (u >= 0.08) & (u < 0.13)
        out = {"obs": self.obs[lane_ids].copy(), "action": r.integers(0, 4, m),
               "reward": r.standard_normal(m).astype(np.float32), "next_obs": nxt,
               "terminated": term, "truncated": trunc}
        reset = r.standard_normal((m, 3)).astype(np.float32)
        jump = r.random(m) < 0.03
        self.obs[lane_ids] = np.where((term | trunc | jump)[:, None], reset, nxt)
        return out


def fill(buf: rb.ReplayBuffer, oracle: Oracle, lanes: int, rng: np.random.Generator,
         rounds: int) -> None:
    env = Env(lanes, rng)
    for _ in range(rounds):
        mode = rng.integers(3)
        if mode == 0:  # extend [T, lanes]
            t = int(rng.integers(1, 7))
            steps = [env.step(np.arange(lanes)) for _ in range(t)]
            data = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
            if lanes == 1:
                data = {k: v[:, 0] for k, v in data.items()}
            buf.extend(**data)
            for s in steps:
                for lane in range(lanes):
                    oracle.add(lane, {k: v[lane] for k, v in s.items()})
        elif mode == 1:  # add one step of every lane
            s = env.step(np.arange(lanes))
            buf.add(**({k: v[0] for k, v in s.items()} if lanes == 1 else s))
            for lane in range(lanes):
                oracle.add(lane, {k: v[lane] for k, v in s.items()})
        else:  # async add: a random subset of lanes
            ids = np.sort(rng.choice(lanes, size=int(rng.integers(1, lanes + 1)),
                                     replace=False))
            s = env.step(ids)
            buf.add(env_ids=ids, **s)
            for j, lane in enumerate(ids):
                oracle.add(int(lane), {k: v[j] for k, v in s.items()})


def live_keys(buf: rb.ReplayBuffer) -> np.ndarray:
    t = buf.table
    keys = [np.arange(w - c, w) * t.lanes + lane
            for lane, (w, c) in enumerate(zip(t.written, t.counts, strict=True))]
    return np.concatenate(keys).astype(np.int64)


@pytest.mark.parametrize(("lanes", "capacity", "n"), [
    (1, 40, 1), (1, 40, 3), (1, 37, 5), (3, 60, 3), (4, 48, 4), (2, 30, 8),
])
def test_nstep_view_matches_oracle(lanes: int, capacity: int, n: int) -> None:
    gamma = 0.9
    rng = np.random.default_rng(lanes * 100 + n)
    buf = rb.ReplayBuffer(capacity, num_envs=lanes, n_step=n, gamma=gamma, seed=0) \
        if n > 1 else rb.ReplayBuffer(capacity, num_envs=lanes, seed=0,
                                      view=rb.NStepView(1, gamma))
    oracle = Oracle(lanes, capacity // lanes)
    for check in range(4):
        fill(buf, oracle, lanes, rng, rounds=15)  # wraps around the ring several times
        keys = live_keys(buf)
        out = buf.view.gather(buf.table, keys)
        last = buf.view.last_keys(buf.table, keys)  # type: ignore[attr-defined]
        for i, key in enumerate(keys.tolist()):
            want = oracle.nstep(key, lanes, n, gamma)
            assert out["reward"][i] == pytest.approx(want["reward"], rel=1e-5, abs=1e-5)
            assert out["discount"][i] == pytest.approx(want["discount"], rel=1e-6)
            assert out["discount"].dtype == np.float32
            assert np.array_equal(out["next_obs"][i], want["next_obs"])
            assert np.array_equal(out["obs"][i], want["obs"])
            assert out["action"][i] == want["action"]
            assert bool(out["terminated"][i]) == bool(want["terminated"])
            assert bool(out["truncated"][i]) == bool(want["truncated"])
            assert last[i] == want["last_key"]
        assert check >= 0


def test_windows_reach_the_write_head_and_grow_when_data_arrives() -> None:
    buf = rb.ReplayBuffer(100, n_step=5, gamma=0.5, seed=0)
    for t in range(3):
        buf.add(obs=np.array([t], np.float32), action=0, reward=1.0,
                next_obs=np.array([t + 1], np.float32), terminated=False, truncated=False)
    out = buf.view.gather(buf.table, np.array([0, 1, 2]))
    assert out["reward"].tolist() == [1.75, 1.5, 1.0]  # cut at the newest step
    assert out["next_obs"][:, 0].tolist() == [3.0, 3.0, 3.0]
    for t in range(3, 6):
        buf.add(obs=np.array([t], np.float32), action=0, reward=1.0,
                next_obs=np.array([t + 1], np.float32), terminated=False, truncated=False)
    out = buf.view.gather(buf.table, np.array([0]))
    assert out["reward"][0] == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)
    assert out["discount"][0] == pytest.approx(0.5**5)
    assert out["next_obs"][0, 0] == 5.0


def test_sample_through_buffer_has_discount() -> None:
    buf = rb.ReplayBuffer(50, n_step=3, gamma=0.99, seed=1)
    buf.extend(obs=np.zeros((20, 2), np.float32), action=np.zeros(20), reward=np.ones(20),
               next_obs=np.zeros((20, 2), np.float32), terminated=np.zeros(20, bool),
               truncated=np.zeros(20, bool))
    b = buf.sample(16)
    assert b["discount"].shape == (16,)
    allowed = np.float32([0.99, 0.99**2, 0.99**3])
    assert np.all(np.isin(b["discount"], allowed))
    assert buf.view.config() == {"type": "nstep", "n": 3, "gamma": 0.99}


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_n(bad: Any) -> None:
    with pytest.raises(ConfigError, match="n"):
        rb.NStepView(bad, 0.9)


def test_bad_gamma() -> None:
    with pytest.raises(ConfigError, match="gamma"):
        rb.NStepView(3, 1.5)


@pytest.mark.parametrize("n, gamma", [(2, 0.99), (3, 0.99), (5, 0.9), (7, 1.0), (4, 0.0)])
def test_discount_is_gamma_to_the_window_length_bitwise(n: int, gamma: float) -> None:
    """``discount`` is ``float32(gamma ** L)`` exactly for every window length, episode
    ends cutting windows short, and follows a gamma set after the first sample."""
    buf = rb.ReplayBuffer(64, n_step=n, gamma=gamma, seed=3)
    ends = np.arange(40) % 5 == 4
    buf.extend(obs=np.zeros((40, 2), np.float32), action=np.zeros(40), reward=np.ones(40),
               next_obs=np.zeros((40, 2), np.float32), terminated=ends,
               truncated=np.zeros(40, bool))
    for g in (gamma, 0.5):
        buf.view.gamma = g
        keys = np.arange(40)
        out = buf.view.gather(buf.table, keys)
        lengths = buf.view.lengths(buf.table, keys)
        want = np.array([np.float64(g) ** np.float64(k) for k in lengths]).astype(np.float32)
        assert out["discount"].dtype == np.float32
        assert out["discount"].tobytes() == want.tobytes()


# ---------------------------------------------------------------------- one-pass windows
def _window_kernels() -> list[Any]:
    """The numpy oracle, and the C kernel where it was built."""
    kernels: list[Any] = [nstep.nstep_windows]
    try:
        from replaybank.ops import windows_c
    except ImportError:
        return kernels
    return [*kernels, windows_c.nstep_windows]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), lanes=st.integers(1, 4), rows=st.integers(1, 12),
       n=st.integers(1, 12), b=st.integers(0, 20), f64=st.booleans(),
       gamma=st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0, 0.3711]))
def test_nstep_windows_kernels_agree_bitwise(seed: int, lanes: int, rows: int, n: int,
                                             b: int, f64: bool, gamma: float) -> None:
    """C and numpy give the same last slots, lengths and returns bit for bit (NaN and
    -0.0 rewards, every window length, wraps, one wrap of the slots), and match a
    plain loop over the window."""
    rng = np.random.default_rng(seed)
    size = rows * lanes
    link = np.where(rng.random(size) < 0.25, rng.integers(1, 5, size), 0).astype(np.int32)
    rewards = rng.standard_normal(size).astype(np.float64 if f64 else np.float32)
    rewards[rng.random(size) < 0.1] = np.nan
    rewards[rng.random(size) < 0.1] = -0.0
    slots = rng.integers(0, 2 * size, b).astype(np.int64)
    weights = gamma ** np.arange(n, dtype=np.float64)
    got = []
    for kernel in _window_kernels():
        last, length = np.full(b, -1, np.int64), np.full(b, -1, np.int64)
        ret = np.full(b, 7, rewards.dtype)
        kernel(slots, lanes, link, weights, rewards, last, length, ret)
        got.append((last.tolist(), length.tolist(), ret.tobytes()))
    assert all(g == got[0] for g in got)
    last_want, length_want = [], []
    for s in slots.tolist():
        s %= size
        for k in range(n):
            at = (s + k * lanes) % size
            if link[at] > 0 or k == n - 1:
                break
        last_want.append(at)
        length_want.append(k + 1)
    assert got[0][0] == last_want and got[0][1] == length_want


def test_nstep_windows_refuse_bad_input_and_write_nothing() -> None:
    link = np.array([0, 0, 1, 0], np.int32)
    rew = np.ones(4, np.float32)
    w = np.array([1.0, 0.5])
    for kernel in _window_kernels():
        for slots, lk, error in ((np.array([0, 8]), link, IndexError),
                                 (np.array([-1]), link, IndexError),
                                 (np.array([1]), np.array([0, 0, -2, 0], np.int32),
                                  IndexError)):
            last = np.full(len(slots), -5, np.int64)
            with pytest.raises(error):
                kernel(slots, 1, lk, w, rew, last, last.copy(), np.zeros(len(slots),
                                                                         np.float32))
            assert (last == -5).all()
        with pytest.raises(TypeError):  # returns of another dtype than the rewards
            kernel(np.array([0]), 1, link, w, rew, np.empty(1, np.int64),
                   np.empty(1, np.int64), np.empty(1, np.float64))


@pytest.mark.parametrize(("lanes", "n", "reward_dtype"), [
    (1, 3, "float32"), (3, 5, "float32"), (2, 4, "float64"), (4, 1, "float32"),
])
def test_host_gather_matches_the_general_path_bitwise(tmp_path: Any, lanes: int, n: int,
                                                      reward_dtype: str) -> None:
    """In-memory numpy storage (one-pass windows, two gathers) and file storage (the
    general path: window slots, per-field takes) sample the same n-step batches, byte for
    byte, through wraps, async adds, episode ends, truncations and discontinuities."""
    spec = {"obs": ((3,), "float32"), "action": ((), "int64"),
            "reward": ((), reward_dtype), "terminated": ((), "bool"),
            "truncated": ((), "bool")}
    capacity = 12 * lanes
    view = rb.NStepView(n, 0.97)
    bufs = [rb.ReplayBuffer(capacity, num_envs=lanes, seed=5, spec=spec, view=view),
            rb.ReplayBuffer(capacity, num_envs=lanes, seed=5, spec=spec, view=view,
                            storage="memmap", path=str(tmp_path / "buf"))]
    assert bufs[0].table.plain_numpy and not bufs[1].table.plain_numpy
    for buf in bufs:
        fill(buf, Oracle(lanes, capacity // lanes), lanes, np.random.default_rng(n), 30)
    for _ in range(5):
        a, b = (buf.sample(32) for buf in bufs)
        assert list(a.keys()) == list(b.keys())
        for key in a:
            assert np.asarray(a[key]).dtype == np.asarray(b[key]).dtype, key
            assert np.asarray(a[key]).tobytes() == np.asarray(b[key]).tobytes(), key
