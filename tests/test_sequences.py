"""Sequence sampling: window math against plain loops, buffers against a naive reference.

The reference keeps, per lane, the plain list of transitions the caller passed (live
ones only). Episode boundaries are derived from those transitions alone (terminated,
truncated, next_obs different from the next step's obs, or the newest step), never from
the table's links, so the tests check the table, the window math and the gather together.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.errors import ConfigError, DtypeError, EmptyBufferError, ShapeError
from replaybank.ops import windows
from replaybank.samplers.base import StatelessSampler
from tests.stats import chi2_critical

# ---------------------------------------------------------------------- plain-loop oracles


def loop_extent(link: Any, written: Any, counts: Any, key: int, width: int,
                cross: bool) -> int:
    nrows, lanes = link.shape
    seq, lane = key // lanes, key % lanes
    lo, hi = written[lane] - counts[lane], written[lane]
    if not lo <= seq < hi:
        return 0
    n = 0
    for j in range(width):
        s = seq + j
        if s >= hi:
            break
        if j > 0 and not cross and link[(s - 1) % nrows, lane] > 0:
            break
        n += 1
    return n


def loop_history(link: Any, written: Any, counts: Any, cleared: Any, key: int,
                 k: int) -> tuple[list[int], bool]:
    nrows, lanes = link.shape
    seq, lane = key // lanes, key % lanes
    lo = written[lane] - counts[lane]
    frames = [seq]
    ok = True
    cur = seq
    for _ in range(k - 1):
        prev = cur - 1
        if prev < lo:
            if prev >= cleared[lane]:  # it existed (not removed by a clear): overwritten
                ok = False
            break
        if link[prev % nrows, lane] > 0:
            break
        cur = prev
        frames.insert(0, cur)
    while len(frames) < k:
        frames.insert(0, frames[0])
    return [f * lanes + lane for f in frames], ok


def random_table(rng: np.random.Generator) -> tuple[Any, Any, Any]:
    nrows, lanes = int(rng.integers(1, 9)), int(rng.integers(1, 4))
    link = (rng.random((nrows, lanes)) < 0.3).astype(np.int32)
    written = rng.integers(0, 3 * nrows, size=lanes)
    counts = np.minimum(written, rng.integers(0, nrows + 1, size=lanes))
    return link, written.astype(np.int64), counts.astype(np.int64)


def test_window_extent_and_valid_starts_match_loops() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        link, written, counts = random_table(rng)
        nrows, lanes = link.shape
        keys = np.arange(-lanes, (written.max() + 2) * lanes)
        width = int(rng.integers(1, nrows + 3))
        for cross in (False, True):
            got = windows.window_extent(link, written, counts, keys, width, cross)
            want = [loop_extent(link, written, counts, int(k), width, cross) for k in keys]
            assert got.tolist() == want
            for min_len in (1, width):
                vs = windows.valid_starts(link, written, counts, width, cross, min_len)
                ref = sorted(int(k) for k, n in zip(keys, want, strict=True) if n >= min_len)
                assert sorted(vs.tolist()) == ref
                assert len(set(vs.tolist())) == len(vs)


@pytest.mark.parametrize("kernel", ["numpy", "numba"])
def test_extent_and_plan_kernels_match_loops(kernel: str) -> None:
    if kernel == "numba":
        pytest.importorskip("numba")
    extent = windows.kernel(windows.window_extent, kernel)[0]
    plan = windows.kernel(windows.window_plan, kernel)[0]
    rng = np.random.default_rng(3)
    for _ in range(200):
        link, written, counts = random_table(rng)
        nrows, lanes = link.shape
        keys = np.arange(-lanes, (written.max() + 2) * lanes)
        width = int(rng.integers(1, nrows + 3))
        bounds = np.ascontiguousarray((link != 0).T.astype(np.uint8))  # [lanes, T]
        for cross in (False, True):
            want = [loop_extent(link, written, counts, int(k), width, cross) for k in keys]
            assert extent(link, written, counts, keys, width, cross).tolist() == want
            if kernel == "numba":  # reading the lane-major boundary bytes instead of link
                from replaybank.ops import windows_numba as wn

                got = wn.window_extent(link, written, counts, keys, width, cross, bounds)
                assert got.tolist() == want
        live = np.array([s * lanes + lane for lane in range(lanes)
                         for s in range(written[lane] - counts[lane], written[lane])],
                        dtype=np.int64)
        if len(live) == 0:
            continue
        slots, lk, ends, first = plan(link, written, counts, live, width)
        for i, key in enumerate(live.tolist()):
            seq, lane = key // lanes, key % lanes
            for j in range(width + 1):
                assert slots[i, j] == ((seq + j) % nrows) * lanes + lane
            for j in range(width):
                v = link[(seq + j) % nrows, lane]
                assert lk[i, j] == v
                assert ends[i, j] == (v > 0 and seq + j != written[lane] - 1)
            prev_live = seq - 1 >= written[lane] - counts[lane]
            assert first[i] == (not prev_live or link[(seq - 1) % nrows, lane] > 0)


def test_history_and_is_first_match_loops() -> None:
    rng = np.random.default_rng(1)
    for _ in range(300):
        link, written, counts = random_table(rng)
        nrows, lanes = link.shape
        live = [s * lanes + lane for lane in range(lanes)
                for s in range(written[lane] - counts[lane], written[lane])]
        if not live:
            continue
        keys = np.array(live)
        k = int(rng.integers(1, 6))
        # each lane's last clear: never (half the tables), or up to its oldest live step
        cleared = rng.integers(0, written - counts + 1) if rng.random() < 0.5 \
            else np.zeros_like(written)
        hist, ok = windows.history(link, written, counts, cleared, keys, k)
        first = windows.is_first(link, written, counts, keys)
        for i, key in enumerate(live):
            h, o = loop_history(link, written, counts, cleared, key, k)
            assert hist[i].tolist() == h
            assert bool(ok[i]) == o
            seq, lane = key // lanes, key % lanes
            prev_live = seq - 1 >= written[lane] - counts[lane]
            assert bool(first[i]) == (not prev_live or link[(seq - 1) % nrows, lane] > 0)


@pytest.mark.parametrize("kernel", ["numpy", "numba"])
def test_r2d2_priority_matches_loop(kernel: str) -> None:
    if kernel == "numba":
        pytest.importorskip("numba")
    rng = np.random.default_rng(2)
    td = rng.normal(size=(50, 7))
    mask = rng.random((50, 7)) < 0.6
    mask[3] = False  # a row without a counted step
    got = windows.kernel(windows.r2d2_priority, kernel)[0](td, mask, 0.9)
    for b in range(50):
        vals = [abs(td[b, j]) for j in range(7) if mask[b, j]]
        if not vals:
            assert np.isnan(got[b])
        else:
            assert got[b] == pytest.approx(0.9 * max(vals) + 0.1 * sum(vals) / len(vals))


@pytest.mark.parametrize("kernel", ["numpy", "numba"])
def test_r2d2_priority_of_huge_finite_errors_does_not_overflow(kernel: str) -> None:
    """The probe's 1e308 errors: the row sum overflowed, the priority became inf. Each
    row is checked against exact rational arithmetic."""
    from fractions import Fraction

    if kernel == "numba":
        pytest.importorskip("numba")
    rng = np.random.default_rng(3)
    td = rng.uniform(-1, 1, size=(40, 6)) * 10.0 ** rng.integers(-3, 308, size=(40, 1))
    td[0], td[1, :3], td[2] = 1e308, -1.7e308, np.finfo(np.float64).max
    mask = rng.random((40, 6)) < 0.8
    mask[:3] = True
    for eta in (0.0, 0.3, 0.9, 1.0):
        got = windows.kernel(windows.r2d2_priority, kernel)[0](td, mask, eta)
        assert got[0] == 1e308 and np.all(np.isfinite(got[mask.any(axis=1)]))
        for b in np.flatnonzero(mask.any(axis=1)):
            vals = [Fraction(abs(float(td[b, j]))) for j in range(6) if mask[b, j]]
            want = Fraction(eta) * max(vals) + (1 - Fraction(eta)) * sum(vals) / len(vals)
            assert got[b] == pytest.approx(float(want), rel=1e-12), (b, eta)


# ---------------------------------------------------------------------- naive reference


class Sim:
    """Vector env stand-in: unique observations, episode ends and data discontinuities."""

    def __init__(self, lanes: int, rng: np.random.Generator, p_term: float = 0.1,
                 p_trunc: float = 0.05, p_jump: float = 0.03) -> None:
        self.rng = rng
        self.counter = 0
        self.p = (p_term, p_trunc, p_jump)
        self.cur = [self._new() for _ in range(lanes)]

    def _new(self) -> int:
        self.counter += 1
        return self.counter

    def step(self, lane: int) -> dict[str, Any]:
        o, nxt = self.cur[lane], self._new()
        u = self.rng.random()
        term = u < self.p[0]
        trunc = not term and u < self.p[0] + self.p[1]
        jump = not (term or trunc) and self.rng.random() < self.p[2]
        self.cur[lane] = self._new() if (term or trunc or jump) else nxt
        return {"obs": np.array([o, -o], np.float32), "action": np.int64(o % 5),
                "reward": np.float32(o / 7), "next_obs": np.array([nxt, -nxt], np.float32),
                "terminated": bool(term), "truncated": bool(trunc),
                "hidden": np.full(3, o * 0.5, np.float32)}


class RefBuffer:
    """Per lane, the live transitions in order with their lane-local sequence numbers."""

    def __init__(self, nrows: int, lanes: int) -> None:
        self.T, self.lanes = nrows, lanes
        self.written = [0] * lanes
        self.items: list[list[tuple[int, dict[str, Any]]]] = [[] for _ in range(lanes)]

    def add(self, lane: int, tr: dict[str, Any]) -> None:
        self.items[lane].append((self.written[lane], tr))
        self.written[lane] += 1
        if len(self.items[lane]) > self.T:
            del self.items[lane][0]

    def boundary(self, lane: int, i: int) -> bool:
        items = self.items[lane]
        tr = items[i][1]
        if tr["terminated"] or tr["truncated"] or i == len(items) - 1:
            return True
        return not np.array_equal(items[i + 1][1]["obs"], tr["next_obs"])

    def extent(self, lane: int, i: int, width: int, cross: bool) -> int:
        n = 0
        for j in range(width):
            if i + j >= len(self.items[lane]):
                break
            if j > 0 and not cross and self.boundary(lane, i + j - 1):
                break
            n += 1
        return n

    def starts(self, width: int, cross: bool, min_len: int) -> list[int]:
        out = []
        for lane in range(self.lanes):
            for i, (seq, _) in enumerate(self.items[lane]):
                if self.extent(lane, i, width, cross) >= min_len:
                    out.append(seq * self.lanes + lane)
        return sorted(out)

    def index(self, key: int) -> tuple[int, int]:
        lane, seq = key % self.lanes, key // self.lanes
        for i, (s, _) in enumerate(self.items[lane]):
            if s == seq:
                return lane, i
        raise AssertionError(f"key {key} is not live in the reference")


def fill(buf: rb.ReplayBuffer, ref: RefBuffer, sim: Sim, n_calls: int,
         rng: np.random.Generator, async_p: float = 0.5) -> None:
    lanes = ref.lanes
    for _ in range(n_calls):
        if lanes > 1 and rng.random() < async_p:
            ids = np.sort(rng.choice(lanes, size=int(rng.integers(1, lanes + 1)),
                                     replace=False))
        else:
            ids = np.arange(lanes)
        trs = [sim.step(int(lane)) for lane in ids]
        stacked = {k: np.stack([np.asarray(tr[k]) for tr in trs]) for k in trs[0]}
        if lanes == 1:
            buf.add(**{k: v[0] for k, v in stacked.items()})
        else:
            buf.add(env_ids=ids if len(ids) < lanes else None, **stacked)
        for lane, tr in zip(ids, trs, strict=True):
            ref.add(int(lane), tr)


def check_batch(sb: rb.SequenceBatch, ref: RefBuffer, width: int, burn_in: int, cross: bool,
                min_len: int) -> None:
    nb = len(sb.starts)
    assert sb.obs.shape == (nb, width, 2) and sb.next_obs.shape == (nb, width, 2)
    for name in ("mask", "is_first", "is_last", "is_terminal", "burn_in"):
        assert sb[name].shape == (nb, width) and sb[name].dtype == bool
    for b in range(nb):
        lane, i = ref.index(int(sb.starts[b]))
        items = ref.items[lane]
        n = ref.extent(lane, i, width, cross)
        assert n >= min_len
        np.testing.assert_array_equal(sb["initial/hidden"][b], items[i][1]["hidden"])
        for j in range(width):
            assert sb.burn_in[b, j] == (j < burn_in)
            if j >= n:
                assert not sb.mask[b, j] and not sb.is_first[b, j] and not sb.is_last[b, j]
                assert not sb.is_terminal[b, j]
                assert np.all(sb.obs[b, j] == 0) and np.all(sb.next_obs[b, j] == 0)
                assert sb.reward[b, j] == 0 and not sb.terminated[b, j]
                continue
            tr = items[i + j][1]
            for k in ("obs", "next_obs", "hidden"):
                np.testing.assert_array_equal(sb[k][b, j], tr[k])
            for k in ("action", "reward", "terminated", "truncated"):
                assert sb[k][b, j] == tr[k]
            assert sb.mask[b, j] == (j >= burn_in)
            first = (i + j == 0) or ref.boundary(lane, i + j - 1)
            assert sb.is_first[b, j] == first
            last = tr["terminated"] or tr["truncated"] or (
                i + j < len(items) - 1 and ref.boundary(lane, i + j))
            assert sb.is_last[b, j] == last
            assert sb.is_terminal[b, j] == tr["terminated"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lanes=st.integers(1, 3), nrows=st.integers(3, 12), n_calls=st.integers(1, 40),
       length=st.integers(1, 5), burn_in=st.integers(0, 2), cross=st.booleans(),
       strict=st.booleans(), seed=st.integers(0, 2**16))
def test_sequences_match_reference(lanes: int, nrows: int, n_calls: int, length: int,
                                   burn_in: int, cross: bool, strict: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    buf = rb.ReplayBuffer(capacity=nrows * lanes, num_envs=lanes, seed=seed)
    ref = RefBuffer(nrows, lanes)
    fill(buf, ref, Sim(lanes, rng), n_calls, rng)
    width = burn_in + length
    min_len = width if strict else burn_in + 1
    t = buf.table
    exact = windows.valid_starts(t.link, t.written, t.counts, width, cross, min_len)
    assert sorted(exact.tolist()) == ref.starts(width, cross, min_len)
    mode = "cross" if cross else "stop"
    if strict and width > nrows:
        with pytest.raises(ConfigError):
            buf.sample_sequences(4, length, episode_boundary=mode, burn_in=burn_in)
        return
    if len(exact) == 0:
        with pytest.raises(EmptyBufferError):
            buf.sample_sequences(4, length, episode_boundary=mode, strict=strict,
                                 burn_in=burn_in)
        return
    for redraws in (16, 0):  # rejection, and the exact fallback
        sb = buf.sample_sequences(6, length, episode_boundary=mode, strict=strict,
                                  burn_in=burn_in, max_redraws=redraws)
        check_batch(sb, ref, width, burn_in, cross, min_len)


def test_padding_and_burn_in_concrete() -> None:
    buf = rb.ReplayBuffer(capacity=32, seed=0)
    for t in range(8):  # an episode of 3 steps, then one of 5 (still running)
        buf.add(obs=np.full(1, t, np.float32), action=0, reward=float(t),
                next_obs=np.full(1, t + 1, np.float32), terminated=t == 2, truncated=False)
    sb = buf.sample_sequences(64, 4, strict=False, burn_in=1)
    for b in range(64):
        s = int(sb.starts[b])
        end = 3 if s < 3 else 8
        n = min(5, end - s)
        assert sb.mask[b].tolist() == [False] + [j < n for j in range(1, 5)]
        assert sb.obs[b, :, 0].tolist() == [s + j if j < n else 0 for j in range(5)]
        assert sb.is_first[b, 0] == (s in (0, 3))
        assert sb.is_terminal[b].tolist() == [s + j == 2 and j < n for j in range(5)]
    assert set(sb.starts.tolist()) <= {0, 1, 3, 4, 5, 6}  # >= burn_in + 1 steps
    sb = buf.sample_sequences(64, 3, episode_boundary="cross")
    assert set(sb.starts.tolist()) <= set(range(6)) and sb.mask.all()
    crossing = np.flatnonzero((sb.starts >= 1) & (sb.starts < 3))
    assert len(crossing) and np.all(sb.is_first[crossing, 3 - sb.starts[crossing]])
    assert sb.is_first.sum() == len(crossing) + np.sum(sb.starts == 0) + np.sum(sb.starts == 3)


def test_cross_windows_never_cross_write_head_after_wrap() -> None:
    buf = rb.ReplayBuffer(capacity=10, seed=3)
    for t in range(27):
        buf.add(obs=np.full(1, t, np.float32), action=0, reward=0.0,
                next_obs=np.full(1, t + 1, np.float32), terminated=t % 4 == 3,
                truncated=False)
    sb = buf.sample_sequences(200, 4, episode_boundary="cross")
    assert sb.mask.all()
    starts = sb.obs[:, 0, 0]
    assert starts.min() >= 17 and starts.max() <= 23  # live 17..26, no wrap into old rows
    np.testing.assert_array_equal(sb.obs[:, :, 0], starts[:, None] + np.arange(4))
    assert set(starts.tolist()) == set(range(17, 24))


def test_statistical_uniform_over_valid_starts() -> None:
    rng = np.random.default_rng(5)
    buf = rb.ReplayBuffer(capacity=60, num_envs=2, seed=6)
    ref = RefBuffer(30, 2)
    fill(buf, ref, Sim(2, rng, p_term=0.15), 45, rng)
    valid = ref.starts(4, False, 4)
    assert len(valid) >= 8
    for redraws in (16, 0):
        n = 20 * len(valid) * 10
        sb = buf.sample_sequences(n, 4, max_redraws=redraws)
        counts = np.array([np.sum(sb.starts == v) for v in valid])
        assert counts.sum() == n
        exp = n / len(valid)
        chi2 = float(((counts - exp) ** 2 / exp).sum())
        dof = len(valid) - 1
        assert chi2 < dof + 5 * np.sqrt(2 * dof)  # ~ p < 1e-4 critical value


def test_hidden_state_and_state_fields() -> None:
    buf = rb.ReplayBuffer(capacity=20, seed=0)
    for t in range(10):
        buf.add(obs=np.zeros(1, np.float32), action=0, reward=0.0,
                next_obs=np.zeros(1, np.float32), terminated=False, truncated=False,
                memory={"h": np.full(2, t, np.float32), "c": np.full(2, -t, np.float32)})
    sb = buf.sample_sequences(5, 3, state_fields="memory", burn_in=2)
    np.testing.assert_array_equal(sb["initial/memory/h"], sb["memory/h"][:, 0])
    np.testing.assert_array_equal(sb["initial"]["memory"]["c"][:, 0], -sb.starts)
    assert "initial/hidden" not in sb
    with pytest.raises(ConfigError, match="state_fields"):
        buf.sample_sequences(5, 3, state_fields="nope")


@pytest.mark.parametrize("kwargs, err", [
    ({"batch_size": 0}, ConfigError), ({"sequence_length": 0}, ConfigError),
    ({"burn_in": -1}, ConfigError), ({"episode_boundary": "end"}, ConfigError),
    ({"strict": "yes"}, ConfigError), ({"sequence_length": 11}, ConfigError),
])
def test_bad_arguments(kwargs: dict[str, Any], err: type[Exception]) -> None:
    buf = rb.ReplayBuffer(capacity=10, seed=0)
    for _ in range(5):
        buf.add(obs=np.zeros(1, np.float32), action=0, reward=0.0,
                next_obs=np.zeros(1, np.float32), terminated=False, truncated=False)
    state = buf.rng.bit_generator.state
    args = {"batch_size": 2, "sequence_length": 3, **kwargs}
    with pytest.raises(err):
        buf.sample_sequences(**args)
    assert buf.rng.bit_generator.state == state  # nothing drawn


def test_empty_and_too_short() -> None:
    buf = rb.ReplayBuffer(capacity=10, seed=0)
    with pytest.raises(EmptyBufferError):
        buf.sample_sequences(2, 2)
    for t in range(6):
        buf.add(obs=np.zeros(1, np.float32), action=0, reward=0.0,
                next_obs=np.zeros(1, np.float32), terminated=t % 2 == 1, truncated=False)
    with pytest.raises(EmptyBufferError, match="strict=False"):
        buf.sample_sequences(2, 3)
    # (the failed call above left the generator as it was: enough windows to see a full one)
    assert buf.sample_sequences(16, 3, strict=False).mask.sum(axis=1).max() == 2
    assert buf.sample_sequences(2, 3, episode_boundary="cross").mask.all()


@pytest.mark.parametrize("kw, said, not_said", [
    ({}, ["add more data", "shorten sequence_length", "strict=False",
          "episode_boundary='cross'"], []),
    ({"episode_boundary": "cross"}, ["add more data", "strict=False"],
     ["episode_boundary='cross' (", "use episode_boundary"]),
    ({"strict": False, "burn_in": 7}, ["add more data", "shorten burn_in",
                                       "episode_boundary='cross'"], ["strict=False"]),
    ({"strict": False, "burn_in": 7, "episode_boundary": "cross"},
     ["add more data", "shorten burn_in"], ["strict=False", "use episode_boundary"]),
])
def test_no_window_error_suggests_only_options_not_in_use(
        kw: dict[str, Any], said: list[str], not_said: list[str]) -> None:
    """The probe's call used episode_boundary='cross' and was told to use it."""
    buf = rb.ReplayBuffer(capacity=64, seed=0)
    for t in range(5):
        buf.add(obs=np.full(1, t, np.float32), action=0, reward=0.0,
                next_obs=np.full(1, t + 1, np.float32), terminated=False, truncated=False)
    for replace in (True, False):
        with pytest.raises(EmptyBufferError) as err:
            buf.sample_sequences(2, 8, replace=replace, **kw)
        msg = str(err.value)
        assert "holds no window" in msg or "holds 0 distinct windows" in msg, msg
        for text in said:
            assert text in msg, (text, msg)
        for text in not_said:
            assert text not in msg, (text, msg)


def rare_windows(alpha: float = 1.0) -> rb.ReplayBuffer:
    """200 one-step episodes of priority 1e4, then a 5-step episode of priority 1e-3: its
    3 usable 3-step windows hold about 1.5e-9 of the priority mass."""
    from replaybank.samplers.prioritized import PrioritizedSampler

    n1 = 200
    term = np.ones(n1 + 5, bool)
    term[n1:n1 + 4] = False
    buf = rb.ReplayBuffer(400, seed=0, sampler=PrioritizedSampler(alpha=alpha, eps=0.0))
    buf.extend(obs=np.arange(n1 + 5, dtype=np.float32)[:, None], action=np.zeros(n1 + 5),
               reward=np.zeros(n1 + 5),
               next_obs=np.arange(1, n1 + 6, dtype=np.float32)[:, None], terminated=term,
               truncated=np.zeros(n1 + 5, bool),
               priority=np.r_[np.full(n1, 1e4), np.full(5, 1e-3)])
    return buf


def test_prioritized_rare_windows_are_drawn_exactly() -> None:
    """Redraws almost never reach windows of a tiny share of the priority mass: after
    max_redraws rounds the rest is drawn among the usable starts by priority (the same
    law), not refused with 'add more data' after 1024 rounds."""
    buf = rare_windows()
    sb = buf.sample_sequences(8, 3, beta=0.5)
    assert set(sb.starts.tolist()) <= {200, 201, 202} and sb.mask.all()
    stored = buf.sampler.key_weights(sb.starts, buf.lane_view())
    np.testing.assert_allclose(sb.probabilities, stored / buf.sampler.total)
    w = (sb.probabilities / sb.probabilities.min()) ** -0.5  # "buffer": / the buffer max
    assert np.all(sb.weights > 0)
    assert np.allclose(sb.weights / sb.weights.max(), w / w.max(), rtol=1e-5)
    counts = np.bincount(buf.sample_sequences(6000, 3).starts - 200, minlength=3)
    assert counts.sum() == 6000 and np.all(np.abs(counts / 6000 - 1 / 3) < 0.03)


def test_windows_whose_starts_have_priority_zero_name_the_cause() -> None:
    buf = rare_windows()
    buf.sampler.exclude(np.array([200, 201, 202]))  # stored priority 0: never drawn
    state = buf.rng.bit_generator.state
    with pytest.raises(EmptyBufferError) as err:
        buf.sample_sequences(8, 3)
    msg = str(err.value)
    assert "holds 3 windows of at least 3 steps" in msg and "priority of 0" in msg, msg
    assert "update their priorities" in msg and "add more data" not in msg, msg
    assert buf.rng.bit_generator.state == state


def _one_window_in_20000(sampler: Any) -> rb.ReplayBuffer:
    """Two lanes of 20000 one-step episodes, but lane 0's steps 5..7 are one episode: the
    only usable 3-step window starts at key 10 (lane 0, seq 5). A step's obs is its key."""
    n = 20_000
    buf = rb.ReplayBuffer(capacity=2 * n, num_envs=2, seed=0, sampler=sampler)
    term = np.ones((n, 2), bool)
    term[5:7, 0] = False  # lane 0: one 3-step episode (steps 5..7) among one-step ones
    obs = (2 * np.arange(n)[:, None] + np.arange(2)).astype(np.float32)[..., None]
    buf.extend(obs=obs, action=np.zeros((n, 2)), reward=np.zeros((n, 2)), next_obs=obs + 2,
               terminated=term, truncated=np.zeros((n, 2), bool))
    return buf


def test_lane_split_rare_windows_are_drawn_exactly() -> None:
    """The probe's buffer: 1 usable window among 40000 starts (a draw finds it with
    probability 1/40000). Lane split redrew 1024 rounds and raised; after max_redraws
    rounds it now draws the rest from its law among the usable starts."""
    buf = _one_window_in_20000(rb.LaneSplitSampler())
    sb = buf.sample_sequences(4, 3)
    assert sb.starts.tolist() == [10] * 4 and sb.mask.all()
    np.testing.assert_array_equal(sb.obs[..., 0], np.tile([10.0, 12.0, 14.0], (4, 1)))
    np.testing.assert_array_equal(sb.next_obs[..., 0],
                                  np.tile([12.0, 14.0, 16.0], (4, 1)))


class _NoRestrictedDraws(StatelessSampler):
    """The lane-split law without key_weights/sample_restricted (a user's own sampler)."""

    iid = True

    def sample(self, batch_size: int, lanes: Any, rng: np.random.Generator,
               replace: bool = True) -> Any:
        return rb.LaneSplitSampler().sample(batch_size, lanes, rng, replace=replace)

    def config(self) -> dict[str, Any]:
        return {"type": "no_restricted_draws"}


def test_rare_windows_of_a_sampler_without_draws_among_keys_name_the_cause() -> None:
    """A sampler that cannot draw among given starts keeps redrawing, then says why."""
    buf = _one_window_in_20000(_NoRestrictedDraws())
    state = buf.rng.bit_generator.state
    with pytest.raises(EmptyBufferError) as err:
        buf.sample_sequences(4, 3)
    msg = str(err.value)
    assert "holds 1 window of at least 3 steps" in msg and "_NoRestrictedDraws" in msg, msg
    assert "redraw rounds" in msg and "add more data" not in msg, msg
    assert buf.rng.bit_generator.state == state


@pytest.mark.statistical
def test_lane_split_fallback_follows_the_lane_split_law() -> None:
    """Lane 0 holds 2000 steps, lane 1 500, each of one-step episodes but for a 4-step one
    in lane 0 (seq 10..13: 3-step windows start at keys 20 and 22) and a 3-step one in
    lane 1 (seq 50..52: key 101). A draw picks a lane, then one of its steps, so the
    starts' law is ``1 / count_l`` each among the usable ones: 1/2000, 1/2000, 1/500, that
    is 1/6, 1/6, 2/3 (not 1/3 each). A draw is usable with probability 0.0015: nearly
    every row comes from the exact fallback after max_redraws rounds (1024 rounds left
    about a fifth of the rows short and raised)."""
    buf = rb.ReplayBuffer(capacity=4000, num_envs=2, seed=7, lane_split="random")
    for lane, n, first, last in ((0, 2000, 10, 13), (1, 500, 50, 52)):
        obs = np.arange(n + 1, dtype=np.float32)[:, None, None]
        term = np.ones((n, 1), bool)
        term[first:last, 0] = False
        buf.extend(obs=obs[:-1], action=np.zeros((n, 1)), reward=np.zeros((n, 1)),
                   next_obs=obs[1:], terminated=term, truncated=np.zeros((n, 1), bool),
                   env_ids=[lane])
    usable = [20, 22, 101]
    starts = np.concatenate([buf.sample_sequences(32, 3).starts for _ in range(150)])
    assert set(starts.tolist()) <= set(usable), sorted(set(starts.tolist()) - set(usable))
    observed = np.array([(starts == k).sum() for k in usable])

    def chi2(p: np.ndarray) -> float:
        expected = len(starts) * p
        return float(((observed - expected) ** 2 / expected).sum())

    assert chi2(np.array([1, 1, 4]) / 6) < chi2_critical(2), observed
    assert chi2(np.full(3, 1 / 3)) > 100, observed  # far from uniform over the starts


# ---------------------------------------------------------------------- priorities


def per_buffer(seed: int = 0) -> rb.ReplayBuffer:
    from replaybank.samplers.prioritized import PrioritizedSampler

    buf = rb.ReplayBuffer(capacity=40, num_envs=2, seed=seed,
                          sampler=PrioritizedSampler(alpha=1.0, eps=0.0))
    for t in range(20):
        buf.add(obs=np.full((2, 1), t, np.float32), action=[0, 0], reward=[0.0, 0.0],
                next_obs=np.full((2, 1), t + 1, np.float32),
                terminated=[t % 10 == 9, t == 12], truncated=[False, False])
    return buf


def test_update_sequence_priorities_r2d2_formula() -> None:
    buf = per_buffer()
    sb = buf.sample_sequences(8, 4, strict=False, burn_in=1)
    td = np.random.default_rng(0).normal(size=sb.mask.shape)
    uniq = {}
    for b in range(8):
        uniq[int(sb.starts[b])] = b  # the last duplicate wins
    n = buf.update_sequence_priorities(sb.starts, td, eta=0.9, mask=sb.mask)
    assert n == 8
    t = buf.table
    for key, b in uniq.items():
        vals = [abs(td[b, j]) for j in range(td.shape[1]) if sb.mask[b, j]]
        want = 0.9 * max(vals) + 0.1 * sum(vals) / len(vals)
        slot = int((key // 2) % t.T * 2 + key % 2)
        assert buf.sampler.priorities(np.array([slot]))[0] == pytest.approx(want)
    with pytest.raises(ConfigError):
        buf.update_sequence_priorities(sb.starts, td, eta=1.5)
    with pytest.raises(ShapeError):
        buf.update_sequence_priorities(sb.starts, td[:, :2], mask=sb.mask)
    no_mask = np.zeros_like(sb.mask)
    assert buf.update_sequence_priorities(sb.starts, td, mask=no_mask) == 0
    uni = rb.ReplayBuffer(capacity=8)
    with pytest.raises(ConfigError, match="PrioritizedSampler"):
        uni.update_sequence_priorities([0], np.zeros((1, 2)))


def test_update_sequence_priorities_ragged_rows_name_the_argument() -> None:
    """Ragged td_errors raised numpy's bare ValueError (from a shape check before the
    argument was validated); ragged mask a DtypeError. Both are ShapeErrors naming the
    argument, and nothing changes."""
    buf = per_buffer()
    sb = buf.sample_sequences(2, 2)
    before = buf.sampler.state_dict()["priorities"].copy()
    ragged = [[1.0, 2.0], [3.0]]
    with pytest.raises(ShapeError, match=r"^update_sequence_priorities\(td_errors=.*rows of "
                       r"different lengths \(\[1\] has shape \(1,\) but \[0\] has shape "
                       r"\(2,\)\); expected \[B=2, L\].*mask="):
        buf.update_sequence_priorities(sb.starts, ragged)
    with pytest.raises(ShapeError, match=r"^update_sequence_priorities\(mask=.*rows of "
                       "different lengths"):
        buf.update_sequence_priorities(sb.starts, np.ones((2, 2)), mask=ragged)
    with pytest.raises(ShapeError, match=r"windows sampled have \[2\] steps"):
        buf.update_sequence_priorities(sb.starts, np.ones((2, 3)))  # the width check
    # ragged starts were numpy's bare ValueError: the same check (it names batch.starts)
    with pytest.raises(ShapeError, match=r"^update_sequence_priorities\(starts=\[\[0\], "
                       r"\[1, 2\]\]\): a ragged nest, rows of different lengths \(\[1\] has "
                       r"shape \(2,\) but \[0\] has shape \(1,\)\); .*pass batch\.starts"):
        buf.update_sequence_priorities([[0], [1, 2]], np.ones((2, 2)))
    np.testing.assert_array_equal(buf.sampler.state_dict()["priorities"], before)


def test_update_sequence_priorities_refusals_name_the_call_and_the_fix() -> None:
    """A negative start was named update_priorities(indices=...) (a call the user never
    made) and let through in a row that counts no step; float starts and a mask of the
    wrong shape were refused without saying what to pass. Every refusal names
    update_sequence_priorities, the argument and the fix, and changes nothing; [B, 1]
    starts are flattened."""
    buf = per_buffer()
    sb = buf.sample_sequences(4, 3)
    before = buf.sampler.state_dict()["priorities"].copy()
    td = np.ones((4, 3))
    negative = np.r_[sb.starts[:-1], -3]
    with pytest.raises(ConfigError, match=r"^update_sequence_priorities\(starts=\.\.\.\): "
                       r"\[-3\] are negative; .*pass batch\.starts"):
        buf.update_sequence_priorities(negative, td)
    counts_nothing = np.ones((4, 3), bool)
    counts_nothing[-1] = False  # the negative start's row
    with pytest.raises(ConfigError, match=r"^update_sequence_priorities\(starts=\.\.\.\): "
                       r"\[-3\] are negative"):
        buf.update_sequence_priorities(negative, td, mask=counts_nothing)
    with pytest.raises(DtypeError, match=r"^update_sequence_priorities\(starts=array\(shape="
                       r"\(4,\), dtype=float64\)\): expected integer indices; pass "
                       r"batch\.starts as sampled"):
        buf.update_sequence_priorities(sb.starts.astype(np.float64), td)
    with pytest.raises(ShapeError, match=r"^update_sequence_priorities\(mask=array\(shape="
                       r"\(4, 2\), dtype=bool\)\): expected the shape of td_errors \(4, 3\); "
                       r"pass bools .*mask=batch\.mask"):
        buf.update_sequence_priorities(sb.starts, td, mask=np.ones((4, 2), bool))
    np.testing.assert_array_equal(buf.sampler.state_dict()["priorities"], before)
    assert buf.update_sequence_priorities(sb.starts[:, None], td) == 4


def test_update_sequence_priorities_of_huge_finite_errors() -> None:
    """1e308 TD errors: the mean overflowed and the error named update_priorities and
    values the user never passed. The priority is now 1e308; above the sampler's limit
    the error names td_errors."""
    from replaybank.samplers.prioritized import PrioritizedSampler

    def windows_buffer(alpha: float) -> rb.ReplayBuffer:
        buf = rb.ReplayBuffer(32, seed=0, sampler=PrioritizedSampler(alpha=alpha, eps=0.0))
        for t in range(10):
            buf.add(obs=np.full(1, t, np.float32), action=0, reward=0.0,
                    next_obs=np.full(1, t + 1, np.float32), terminated=False, truncated=False)
        return buf

    buf = windows_buffer(0.5)
    sb = buf.sample_sequences(2, 4, replace=False)
    assert buf.update_sequence_priorities(sb.starts, np.full((2, 4), 1e308)) == 2
    slots = sb.starts  # one lane, no wrap: key == slot
    np.testing.assert_allclose(buf.sampler.priorities(slots), 1e154)  # (1e308) ** 0.5
    strict = windows_buffer(1.0)  # limit 1e300 / 32
    sb = strict.sample_sequences(2, 4, replace=False)
    before = strict.sampler.state_dict()["priorities"].copy()
    with pytest.raises(DtypeError) as err:
        strict.update_sequence_priorities(sb.starts, np.full((2, 4), 1e308))
    msg = str(err.value)
    assert msg.startswith("update_sequence_priorities(td_errors=...): window priorities up to "
                          "1e+308") and "rescale the TD errors" in msg, msg
    assert "update_priorities(" not in msg and "inf" not in msg, msg
    np.testing.assert_array_equal(strict.sampler.state_dict()["priorities"], before)


@pytest.mark.statistical
def test_prioritized_windows_proportional_among_valid_starts() -> None:
    buf = per_buffer(seed=1)
    t = buf.table
    valid = windows.valid_starts(t.link, t.written, t.counts, 5, False, 5)
    rng = np.random.default_rng(2)
    prio = rng.uniform(0.5, 4.0, size=len(valid))
    buf.update_sequence_priorities(valid, prio[:, None] * np.ones((1, 5)))
    # invalid starts keep large priorities: they must be redrawn, never returned
    n = 20000
    sb = buf.sample_sequences(n, 5)
    assert set(sb.starts.tolist()) <= set(valid.tolist())
    counts = np.array([np.sum(sb.starts == v) for v in valid])
    exp = n * prio / prio.sum()
    chi2 = float(((counts - exp) ** 2 / exp).sum())
    dof = len(valid) - 1
    assert chi2 < dof + 5 * np.sqrt(2 * dof)
    assert sb.weights.shape == (n,) and np.all(sb.weights > 0)


def test_sequence_replay_buffer_front_end() -> None:
    seq = rb.SequenceReplayBuffer(capacity=40, num_envs=2, sequence_length=4, burn_in=1,
                                  episode_boundary="cross", seed=0)
    for t in range(12):
        seq.add(obs=np.array([[t], [100 + t]], np.float32), action=[0, 1], reward=[0.0, 1.0],
                next_obs=np.array([[t + 1], [101 + t]], np.float32), terminated=[t == 5, False],
                truncated=[False, False], hidden=np.full((2, 2), t, np.float32))
    sb = seq.sample(8)
    assert sb.obs.shape == (8, 5, 1) and sb.burn_in[:, 0].all() and not sb.mask[:, 0].any()
    assert sb.is_first[sb.obs[:, :, 0] == 6].all()  # the reset after t == 5 in lane 0 ...
    assert seq.sample(3, 2).obs.shape == (3, 3, 1)
    assert seq.sample_transitions(4).obs.shape == (4, 1)
    state = seq.state_dict()
    other = rb.SequenceReplayBuffer(capacity=40, num_envs=2, seed=9)
    other.load_state_dict(state)
    assert other.sample(8) == seq.sample(8)
    with pytest.raises(ConfigError):
        rb.SequenceReplayBuffer(capacity=8).sample(2)
    with pytest.raises(ConfigError):
        rb.SequenceReplayBuffer(capacity=8, episode_boundary="x")


def test_torch_storage_gives_the_same_sequences_and_stacks() -> None:
    pytest.importorskip("torch")
    out = []
    for storage in ("numpy", "torch"):
        buf = rb.ReplayBuffer(40, num_envs=2, seed=0, storage=storage)
        fb = rb.ReplayBuffer(40, num_envs=2, seed=0, storage=storage, frame_stack=3)
        for t in range(25):
            kw = {"action": [0, 1], "reward": [1.0, 2.0], "terminated": [t % 7 == 6, False],
                  "truncated": [False, t % 9 == 8]}
            buf.add(obs=np.full((2, 3), t, np.float32), next_obs=np.full((2, 3), t + 1,
                    np.float32), hidden=np.full((2, 4), t, np.float32), **kw)
            fb.add(obs=np.full((2, 3, 3), t, np.uint8),
                   next_obs=np.full((2, 3, 3), t + 1, np.uint8), **kw)
        out.append([buf.sample_sequences(4, 5, strict=False, burn_in=1).numpy(),
                    buf.sample_sequences(4, 5, episode_boundary="cross").numpy(),
                    fb.sample(8).numpy()])
    for a, b in zip(out[0], out[1], strict=True):
        assert a == b


@pytest.mark.parametrize("per", [False, True])
def test_sequence_replay_buffer_checkpoint_roundtrip(per: bool, tmp_path: Any) -> None:
    from replaybank.samplers.prioritized import PrioritizedSampler
    from tests.roundtrip import add_random, assert_roundtrip

    sampler = PrioritizedSampler(beta_schedule="linear", beta_steps=50) if per else None
    seq = rb.SequenceReplayBuffer(capacity=60, num_envs=2, sequence_length=3, burn_in=1,
                                  episode_boundary="cross", strict=False, seed=3,
                                  sampler=sampler)
    add_random(seq, np.random.default_rng(0), 25)
    assert seq.config().sequence_length == 3
    loaded = assert_roundtrip(seq, tmp_path, sample=lambda b: b.sample(5))
    assert isinstance(loaded, rb.SequenceReplayBuffer)
    assert (loaded.sequence_length, loaded.burn_in, loaded.episode_boundary, loaded.strict) \
        == (3, 1, "cross", False)
    assert isinstance(rb.SequenceReplayBuffer.load(tmp_path), rb.SequenceReplayBuffer)


# ---------------------------------------------------------------------- fused numba path


def test_draw_windows_kernel_matches_numpy_composition() -> None:
    from replaybank.ops import ring

    wn = pytest.importorskip("replaybank.ops.windows_numba")
    rng = np.random.default_rng(11)
    for _ in range(300):
        link, written, counts = random_table(rng)
        size = int(counts.sum())
        if size == 0:
            continue
        width = int(rng.integers(1, link.shape[0] + 2))
        cross = bool(rng.random() < 0.5)
        min_len = int(rng.integers(1, width + 1))
        nb = int(rng.integers(1, 6))
        flat = rng.integers(0, size, size=nb + int(rng.integers(0, 5)))
        keys, ext, n = wn.draw_windows(link, written, counts, flat, width, cross, min_len, nb)
        # oracle: numpy key mapping and extents, then a plain loop for the selection
        all_keys = ring.uniform_keys(flat, written, counts)
        all_ext = windows.window_extent(link, written, counts, all_keys, width, cross)
        good = [i for i in range(len(flat)) if all_ext[i] >= min_len]
        bad = [i for i in range(len(flat)) if all_ext[i] < min_len]
        order = (good + bad)[:nb]
        assert n == min(len(good), nb)
        assert keys.tolist() == all_keys[order].tolist()
        assert ext.tolist() == all_ext[order].tolist()


PLAN_FLAGS = ("is_first", "is_last", "is_terminal", "mask", "burn_in", "terminated",
              "truncated")


def assert_plan_matches_loops(link: np.ndarray, written: np.ndarray, counts: np.ndarray,
                              term: np.ndarray, trunc: np.ndarray, keys: np.ndarray,
                              ext: np.ndarray, width: int, burn_in: int,
                              plan: tuple[Any, ...]) -> None:
    """Plain-loop oracle of a window plan ``(slots, steps, flags [7, B, W] in PLAN_FLAGS
    order, side, tail_only)`` of ``keys`` with extents ``ext``."""
    slots, steps, flags, side, tail = plan
    assert steps.flags.c_contiguous and steps.tolist() == slots[:, :width].tolist()
    nrows, lanes = link.shape
    sides = []
    for i, key in enumerate(np.asarray(keys).tolist()):
        seq, lane = key // lanes, key % lanes
        for j in range(width + 1):
            assert slots[i, j] == ((seq + j) % nrows) * lanes + lane
        for j in range(width):
            ok = j < ext[i]
            slot = ((seq + j) % nrows) * lanes + lane
            v = link[(seq + j) % nrows, lane]
            if j == 0:
                prev_live = seq - 1 >= written[lane] - counts[lane]
                first = not prev_live or link[(seq - 1) % nrows, lane] > 0
            else:
                first = link[(seq + j - 1) % nrows, lane] > 0
            tm, tr = bool(term[slot]) and ok, bool(trunc[slot]) and ok
            end = v > 0 and seq + j != written[lane] - 1
            expect = [first and ok, ok and (tm or tr or end), tm, ok and j >= burn_in,
                      j < burn_in, tm, tr]
            assert flags[:, i, j].tolist() == expect
            if ok and v > 0:
                sides.append((i, j, int(v) - 1))
    assert [tuple(r) for r in side.tolist()] == sides
    assert tail == all(j == width - 1 for _, j, _ in sides)


def test_sequence_plan_kernel_matches_loops() -> None:
    wn = pytest.importorskip("replaybank.ops.windows_numba")
    rng = np.random.default_rng(12)
    for _ in range(200):
        link, written, counts = random_table(rng)
        nrows, lanes = link.shape
        live = [s * lanes + lane for lane in range(lanes)
                for s in range(written[lane] - counts[lane], written[lane])]
        if not live:
            continue
        keys = np.array(live, dtype=np.int64)
        width = int(rng.integers(1, nrows + 2))
        burn_in = int(rng.integers(0, width))
        cross = bool(rng.random() < 0.5)
        ext = windows.window_extent(link, written, counts, keys, width, cross)
        term = rng.random(nrows * lanes) < 0.3
        trunc = rng.random(nrows * lanes) < 0.2
        bounds = np.ascontiguousarray((link != 0).T.astype(np.uint8))
        for b in (None, bounds):  # link itself, or the lane-major boundary bytes
            slots, steps, fl, side, tail = wn.sequence_plan(link, written, counts, term,
                                                            trunc, keys, ext, width, burn_in,
                                                            b)
            flags = np.stack([fl[n] for n in PLAN_FLAGS])
            assert_plan_matches_loops(link, written, counts, term, trunc, keys, ext, width,
                                      burn_in, (slots, steps, flags, side, tail))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lanes=st.integers(1, 3), nrows=st.integers(3, 12), n_calls=st.integers(1, 40),
       length=st.integers(1, 5), burn_in=st.integers(0, 2), cross=st.booleans(),
       strict=st.booleans(), seed=st.integers(0, 2**16), one_call=st.booleans())
def test_fused_path_equals_numpy_path(lanes: int, nrows: int, n_calls: int, length: int,
                                      burn_in: int, cross: bool, strict: bool,
                                      seed: int, one_call: bool) -> None:
    """``one_call``: every batch takes the one-call row gather (window pairs where obs
    and next_obs differ), as large batches do, instead of one take per field. The calls
    change the batch size and back (what the fused path allocates per batch shape)."""
    pytest.importorskip("numba")
    from replaybank.buffers import sequences as seqmod
    from replaybank.views import sequence

    rng = np.random.default_rng(seed)
    bufs = [rb.ReplayBuffer(capacity=nrows * lanes, num_envs=lanes, seed=seed)
            for _ in range(2)]
    ref = RefBuffer(nrows, lanes)
    sim_state = rng.bit_generator.state
    for buf in bufs:
        rng.bit_generator.state = sim_state
        fill(buf, RefBuffer(nrows, lanes), Sim(lanes, rng), n_calls, rng)
    rng.bit_generator.state = sim_state
    fill(rb.ReplayBuffer(capacity=nrows * lanes, num_envs=lanes), ref, Sim(lanes, rng),
         n_calls, rng)
    width = burn_in + length
    if strict and width > nrows:
        return
    kw = {"episode_boundary": "cross" if cross else "stop", "strict": strict,
          "burn_in": burn_in}
    t = bufs[0].table
    if len(windows.valid_starts(t.link, t.written, t.counts, width, cross,
                                width if strict else burn_in + 1)) == 0:
        return
    out = []
    for buf, kernel in zip(bufs, ("auto", "numpy"), strict=True):
        old, old_bytes = seqmod.KERNEL, sequence._FUSED_BYTES
        seqmod.KERNEL = kernel
        sequence._FUSED_BYTES = 0 if one_call else old_bytes
        try:
            out.append([buf.sample_sequences(b, length, max_redraws=r, **kw)
                        for b, r in ((6, 16), (6, 0), (6, 16), (3, 16), (6, 16))])
        finally:
            seqmod.KERNEL, sequence._FUSED_BYTES = old, old_bytes
    for fast, slow in zip(*out, strict=True):
        assert fast == slow
        check_batch(fast, ref, width, burn_in, cross, width if strict else burn_in + 1)


@pytest.mark.parametrize("kw, named", [
    ({"n_step": 3, "gamma": 0.5}, "n_step=3"),
    ({"frame_stack": 4}, "frame_stack=4"),
    ({"view": rb.NStepView(3, 0.5)}, "view=NStepView"),
])
def test_sequence_replay_buffer_refuses_options_its_windows_would_ignore(
        kw: dict[str, Any], named: str) -> None:
    """They were accepted and ignored: sample() gave one-step rewards and single frames
    (only sample_transitions applied them)."""
    with pytest.raises(ConfigError, match=rf"^SequenceReplayBuffer\({named}\): sequence "
                                          "windows hold"):
        rb.SequenceReplayBuffer(capacity=100, sequence_length=3, seed=0, **kw)
    inner = rb.ReplayBuffer(100, seed=0, **kw)
    with pytest.raises(ConfigError, match=r"from_buffer\(buffer=\.\.\.\): the buffer's view"):
        rb.SequenceReplayBuffer.from_buffer(inner, sequence_length=3)
    plain = rb.SequenceReplayBuffer(capacity=100, sequence_length=3, seed=0, n_step=1,
                                    frame_stack=1, view=rb.TransitionView())
    assert isinstance(plain.buffer.view, rb.TransitionView)


@pytest.mark.parametrize("kw", [{"n_step": 3, "gamma": 0.5}, {"frame_stack": 4}])
def test_replay_buffer_windows_hold_the_stored_steps_whatever_the_view(
        kw: dict[str, Any]) -> None:
    """Documented: windows keep one-step rewards and one frame per step (what R2D2 and
    the pytorchrl front end's per-row n-step returns build on); sample() applies the view."""
    buf = rb.ReplayBuffer(100, seed=0, **kw)
    for t in range(10):
        buf.add(obs=np.full(2, t, np.float32), action=0, reward=1.0,
                next_obs=np.full(2, t + 1, np.float32), terminated=False, truncated=False)
    sb = buf.sample_sequences(4, 3)
    assert sb.obs.shape == (4, 3, 2) and np.all(sb.reward == 1.0)
    one = buf.sample(4)
    if "n_step" in kw:
        assert np.all(one.reward[one.obs[:, 0] <= 6] == 1.75)
    else:
        assert one.obs.shape == (4, 4, 2)


def test_per_schedule_advances_once_per_sample_call() -> None:
    from replaybank.samplers.prioritized import PrioritizedSampler

    sampler = PrioritizedSampler(beta=0.2, beta_schedule="linear", beta_steps=10)
    buf = rb.ReplayBuffer(capacity=40, num_envs=2, seed=0, sampler=sampler)
    for t in range(20):  # episodes of 4 steps: most starts of a 4-step window are invalid
        buf.add(obs=np.full((2, 1), t, np.float32), action=[0, 0], reward=[0.0, 0.0],
                next_obs=np.full((2, 1), t + 1, np.float32),
                terminated=[t % 4 == 3, t % 4 == 3], truncated=[False, False])
    seen = []
    orig = sampler.sample

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("beta"))
        return orig(*args, **kwargs)

    sampler.sample = spy  # type: ignore[method-assign]
    for call in range(3):
        before = sampler.current_beta
        seen.clear()
        sb = buf.sample_sequences(16, 4)
        assert len(seen) > 1  # invalid starts were redrawn ...
        assert seen == [before] * len(seen)  # ... all with this call's beta
        assert sampler.calls == call + 1
        assert np.all(sb.mask)
    buf.sample_sequences(4, 4, beta=0.7)
    assert sampler.calls == 4
    with pytest.raises(EmptyBufferError):
        buf.sample_sequences(4, 5)  # no 5-step window: rejected, schedule unchanged
    assert sampler.calls == 4


def test_draw_plan_kernel_matches_draw_then_plan_loops() -> None:
    """Plain-loop oracle of ``windows_numba.draw_plan``: the draw selection (as
    ``draw_windows``'s oracle) then, when enough draws are valid, the plan loops."""
    wn = pytest.importorskip("replaybank.ops.windows_numba")
    rng = np.random.default_rng(13)
    seen_plan = seen_short = 0
    for _ in range(300):
        link, written, counts = random_table(rng)
        nrows, lanes = link.shape
        size = int(counts.sum())
        if size == 0:
            continue
        width = int(rng.integers(1, nrows + 2))
        burn_in = int(rng.integers(0, width))
        cross = bool(rng.random() < 0.5)
        min_len = int(rng.integers(1, width + 1))
        nb = int(rng.integers(1, 6))
        flat = rng.integers(0, size, size=nb + int(rng.integers(0, 5)))
        term = rng.random(nrows * lanes) < 0.3
        trunc = rng.random(nrows * lanes) < 0.2
        keys, ext, n, plan = wn.draw_plan(link, written, counts, flat, width, cross, min_len,
                                          nb, term, trunc, burn_in)
        all_keys = []
        for p in flat.tolist():  # flat position -> key: lane by lane, oldest to newest
            lane = 0
            while p >= counts[lane]:
                p -= int(counts[lane])
                lane += 1
            all_keys.append((int(written[lane] - counts[lane]) + p) * lanes + lane)
        all_ext = [loop_extent(link, written, counts, k, width, cross) for k in all_keys]
        good = [i for i in range(len(flat)) if all_ext[i] >= min_len]
        bad = [i for i in range(len(flat)) if all_ext[i] < min_len]
        order = (good + bad)[:nb]
        assert n == min(len(good), nb)
        assert keys.tolist() == [all_keys[i] for i in order]
        assert ext.tolist() == [all_ext[i] for i in order]
        if len(good) < nb:
            assert plan is None
            seen_short += 1
            continue
        seen_plan += 1
        assert plan[2].shape == (7, nb, width)
        assert_plan_matches_loops(link, written, counts, term, trunc, keys, ext, width,
                                  burn_in, plan)
    assert seen_plan > 50 and seen_short > 5


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lanes=st.integers(1, 3), rows=st.integers(2, 9), seed=st.integers(0, 2**16))
def test_boundaries_follow_every_write(lanes: int, rows: int, seed: int) -> None:
    """The lane-major ``link != 0`` bytes kept current from ``written`` deltas equal a
    fresh computation after any mix of adds, extends, lane subsets, clears and loads."""
    wn = pytest.importorskip("replaybank.ops.windows_numba")
    from replaybank.views.sequence import fused_reads

    rng = np.random.default_rng(seed)
    buf = rb.ReplayBuffer(rows * lanes, num_envs=lanes, seed=0)
    other = rb.ReplayBuffer(rows * lanes, num_envs=lanes, seed=1)

    def steps(n: int, m: int) -> dict[str, Any]:
        o = rng.integers(0, 3, (n, m, 2)).astype(np.float32)
        nxt = np.where(rng.random((n, m, 1)) < 0.7, np.roll(o, -1, axis=0),
                       rng.integers(0, 3, (n, m, 2)).astype(np.float32))
        return {"obs": o, "action": np.zeros((n, m), np.int64),
                "reward": np.zeros((n, m), np.float32), "next_obs": nxt,
                "terminated": rng.random((n, m)) < 0.2, "truncated": rng.random((n, m)) < 0.1}

    for b in (buf, other):
        b.extend(**steps(3, lanes))
    reads = fused_reads(buf.table)
    assert reads is not None
    for _ in range(25):
        u = rng.random()
        if u < 0.3:
            one = steps(1, lanes)
            buf.add(**{k: v[0] for k, v in one.items()})
        elif u < 0.6:
            buf.extend(**steps(int(rng.integers(1, 2 * rows + 2)), lanes))
        elif u < 0.8:
            lane = int(rng.integers(0, lanes))
            buf.add(env_ids=[lane], **{k: v[0] for k, v in steps(1, 1).items()})
        elif u < 0.9:
            buf.clear()
        else:
            other.extend(**steps(int(rng.integers(1, rows + 2)), lanes))
            buf.load_state_dict(other.state_dict())
        if rng.random() < 0.5:  # also several writes between two syncs
            continue
        t = buf.table
        got = reads.boundaries(wn, t)
        assert got.tolist() == (t.link != 0).T.astype(np.uint8).tolist()
    got = reads.boundaries(wn, buf.table)
    assert got.tolist() == (buf.table.link != 0).T.astype(np.uint8).tolist()


def short_episodes(seed: Any, **fields: Any) -> rb.ReplayBuffer:
    """A buffer of 2-step episodes (no 3-step window fits in one)."""
    buf = rb.ReplayBuffer(capacity=12, seed=seed)
    for t in range(10):
        buf.add(obs=np.full(1, t, np.float32), action=0, reward=0.0,
                next_obs=np.full(1, t + 1, np.float32), terminated=t % 2 == 1,
                truncated=False, **fields)
    return buf


@pytest.mark.parametrize("bits", [np.random.PCG64, np.random.PCG64DXSM, np.random.MT19937,
                                  np.random.Philox])
def test_a_failed_sample_leaves_the_generator_as_it_was(bits: type) -> None:
    """The fused path draws without saving the generator's state where the bit generator
    can put its words back (PCG64, PCG64DXSM), and from a saved state elsewhere: either
    way a call that finds no window changes nothing, a buffered 32-bit half included."""
    buf = short_episodes(np.random.Generator(bits(3)))
    twin = short_episodes(np.random.Generator(bits(3)))
    for b in (buf, twin):
        b.rng.integers(0, 9, dtype=np.uint32)  # leaves half a word buffered
    with pytest.raises(EmptyBufferError):
        buf.sample_sequences(4, 3)
    with pytest.raises(EmptyBufferError):
        buf.sample_sequences(4, 3, max_redraws=0)
    assert buf.sample_sequences(5, 2) == twin.sample_sequences(5, 2)
    assert buf.rng.integers(0, 9, size=4, dtype=np.uint32).tolist() == \
        twin.rng.integers(0, 9, size=4, dtype=np.uint32).tolist()


def test_an_interrupted_gather_gives_its_draws_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception inside the fused path's kernels (here a KeyboardInterrupt raised
    after the plan was written) leaves the generator where it was: the next call draws
    what a buffer that was never interrupted draws."""
    from replaybank.buffers import sequences as seqmod

    fast = seqmod._fast_kernels()
    if fast is None:
        pytest.skip("no fused kernels")
    buf, twin = short_episodes(5), short_episodes(5)
    real = fast.draw_take

    def interrupted(*args: Any) -> Any:
        real(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(fast, "draw_take", interrupted)
    with pytest.raises(KeyboardInterrupt):
        buf.sample_sequences(3, 2)
    monkeypatch.setattr(fast, "draw_take", real)
    assert buf.sample_sequences(3, 2) == twin.sample_sequences(3, 2)


def test_a_stored_field_named_as_an_initial_state_is_refused_before_drawing() -> None:
    buf = short_episodes(0, hidden=np.zeros(2, np.float32),
                         initial={"hidden": np.zeros(2, np.float32)})
    before = buf.rng.bit_generator.state
    with pytest.raises(ConfigError, match="clashes with the initial state"):
        buf.sample_sequences(2, 2)
    assert buf.rng.bit_generator.state == before
    assert buf.sample_sequences(2, 2, state_fields=[]).obs.shape == (2, 2, 1)


def _episodes_of(steps: int, length: int) -> rb.ReplayBuffer:
    """One lane of ``steps`` steps, obs ``t``, in episodes of ``length`` steps; an
    episode's final observation (kept aside) is ``t + 0.5``, the next episode's reset
    observation ``t + 1``; the newest step's next observation (``t + 1`` unless it ends
    an episode) is kept aside too."""
    buf = rb.ReplayBuffer(capacity=2 * steps, seed=0)
    t = np.arange(steps)
    end = t % length == length - 1
    obs = np.repeat(t[:, None], 3, axis=1).astype(np.float32)
    buf.extend(obs=obs, action=np.zeros(steps, np.int64), reward=np.zeros(steps),
               next_obs=obs + np.where(end, 0.5, 1.0)[:, None].astype(np.float32),
               terminated=end, truncated=np.zeros(steps, bool))
    return buf


THREAD_TABLES = 24  # fresh tables whose first calls race (each: THREADS first calls)
THREADS = 8


def _draw_own_windows(buf: rb.ReplayBuffer, ready: Any, seed: int, bad: list[str]) -> None:
    """Four calls of :func:`sample_sequences` ``(32, 10)`` on ``buf``'s parts (a table of
    :func:`_episodes_of` with episodes of 50 steps) after ``ready`` (a barrier); the first
    window that is not its start's (obs, next_obs with each final observation, stopped at
    an episode end), or an exception, is described in ``bad``."""
    try:
        _check_own_windows(buf, ready, seed, bad)
    except BaseException as exc:  # a thread's exception would not fail the test
        bad.append(f"thread {seed}: {exc!r}")


def _check_own_windows(buf: rb.ReplayBuffer, ready: Any, seed: int, bad: list[str]) -> None:
    from replaybank.buffers.sequences import sample_sequences

    table, lanes, traits = buf.table, buf.lane_view(), buf.sampler_traits
    rng = np.random.default_rng(seed)
    ready.wait()  # the first calls start together
    for _ in range(4):
        sb = sample_sequences(table, lanes, rng, traits, 32, 10)
        want = sb.starts[:, None] + np.arange(10)  # [B, W]: obs t holds t (one lane)
        final = want % 50 == 49  # [B, W]: the last step of an episode
        ok = (sb.obs[..., 0] == want) & (sb.next_obs[..., 0]
                                         == np.where(final, want + 0.5, want + 1))
        ok[:, :-1] &= ~final[:, :-1]  # a window stops at its episode's end
        if not ok.all():
            b = int(np.flatnonzero(~ok.all(axis=1))[0])
            bad.append(f"thread {seed}: start {sb.starts[b]}: obs "
                       f"{sb.obs[b, :, 0].tolist()}, next_obs {sb.next_obs[b, :, 0].tolist()}")
            return


@pytest.mark.parametrize("kernel", ["c", "numba", "numpy"])
def test_threads_sampling_one_table_get_their_own_windows(
        kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads drawing windows of one table at once (the module function, outside any
    buffer lock; the compiled calls release the GIL) each get the windows of their own
    starts, stopped at episode ends, with each final observation. The fused path keeps
    its plan's working arrays per thread and shares the table's boundary bytes (``link
    != 0``, lane-major) under a lock: two first calls that raced used to leave a zeroed
    copy marked up to date, after which no window of that table stopped at an episode
    end (next_obs the next episode's reset observation) and the newest step's next
    observation came from the unwritten row after it. Every table here is fresh, so each
    round races the first calls again: before the fix from none to 2 tables in 3 were
    spoiled, depending on the machine's load (the next test makes that interleaving
    certain). (The newest step, 609, does not end an episode: its next observation is
    kept aside.)"""
    import threading

    _take_kernels(kernel, monkeypatch)
    bad: list[str] = []
    for _ in range(THREAD_TABLES):
        buf = _episodes_of(610, 50)
        ready = threading.Barrier(THREADS)
        threads = [threading.Thread(target=_draw_own_windows, args=(buf, ready, s, bad))
                   for s in range(THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not bad, f"{len(bad)} threads got windows not of their starts: {bad[:2]}"


class _BoundsMeet:
    """numpy for :mod:`replaybank.views.sequence` (every name passed through) whose
    allocation of a table's boundary bytes (``zeros(..., uint8)``) stops the moment two
    threads' first calls of one table meet there: the first caller waits (without the
    GIL) for a second one, at most ``patience`` seconds; a second caller waits until the
    first one's sync of the bytes has returned (``synced``), then goes on. The unlocked
    boundary cache let both through: the second one then put a zeroed copy in place of
    the synced one, marked up to date."""

    def __init__(self, patience: float) -> None:
        import threading

        self.patience = patience
        self.callers = 0
        self.second = threading.Event()
        self.synced = threading.Event()

    def zeros(self, shape: Any, dtype: Any = float, *args: Any, **kwargs: Any) -> Any:
        if np.dtype(dtype) == np.uint8:
            self.callers += 1
            if self.callers == 1:
                self.second.wait(self.patience)
            else:
                self.second.set()
                self.synced.wait(self.patience)
        return np.zeros(shape, dtype, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)


@pytest.mark.parametrize("kernel", ["c", "numba"])
def test_two_first_calls_that_meet_share_one_synced_boundary_cache(
        kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving behind the rare failure of the test above, made certain: two
    threads' first calls of one table both find no boundary bytes yet; one allocates and
    syncs them; then the other. Unlocked, the second put a zeroed copy in place, marked
    synced: from then on every window of the table ran over episode ends (next_obs the
    next episode's reset observation). Locked, the second waits for the first and finds
    its bytes."""
    import threading

    from replaybank.views import sequence as seqview

    fast = _take_kernels(kernel, monkeypatch)
    bad: list[str] = []
    # compiled (numba) and loaded before the clock of the meeting runs
    _draw_own_windows(_episodes_of(610, 50), threading.Barrier(1), 0, bad)
    meet = _BoundsMeet(patience=0.3)
    real_sync = fast.sync_boundaries

    def sync(*args: Any) -> None:
        real_sync(*args)
        meet.synced.set()

    monkeypatch.setattr(fast, "sync_boundaries", sync)
    monkeypatch.setattr(seqview, "np", meet)
    buf = _episodes_of(610, 50)
    seqview.fused_reads(buf.table)  # one cache for both threads (built before either runs)
    threads = [threading.Thread(target=_draw_own_windows,
                                args=(buf, threading.Barrier(1), s, bad)) for s in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    monkeypatch.setattr(seqview, "np", np)
    assert meet.callers >= 1
    _draw_own_windows(buf, threading.Barrier(1), 2, bad)  # later calls, one thread
    assert not bad, f"windows not of their starts: {bad[:2]}"


# ------------------------------------------------ links a writer changes during a gather


def _take_kernels(kernel: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make ``sample_sequences`` take the fused path with the ``"c"`` or ``"numba"``
    kernels, or the ``"numpy"`` path; returns the fused kernels' module (None: numpy)."""
    from replaybank.buffers import sequences as seqmod

    if kernel == "numpy":
        monkeypatch.setattr(seqmod, "KERNEL", "numpy")
        return None
    fast = pytest.importorskip(f"replaybank.ops.windows_{'c' if kernel == 'c' else 'numba'}")
    monkeypatch.setattr(seqmod, "_fast_kernels", lambda: fast)
    return fast


def _steps_with_a_pending_newest() -> rb.ReplayBuffer:
    """One lane, steps 0..9 (obs t, next obs t + 1); step 4 ends an episode (its final
    observation 50 kept aside, step 5 starts the next one); step 9, the newest, keeps its
    next observation aside until the next step arrives."""
    buf = rb.ReplayBuffer(16, seed=0)
    for t in range(10):
        buf.add(obs=np.full(2, t, np.float32), action=0, reward=0.0,
                next_obs=np.full(2, 50 if t == 4 else t + 1, np.float32), terminated=t == 4,
                truncated=False)
    return buf


def _relink_newest(buf: rb.ReplayBuffer) -> None:
    """What a writer in another process does once it committed step 10: it relinks step
    9 (its next observation is now row 10's, written before the commit) and reuses step
    9's side slot at once for another step's observation (99). (The learner's snapshot
    still ends at step 9: ``written`` does not move.)"""
    t = buf.table
    link = t.flat(t.link)
    slot = int(link[9]) - 1
    assert slot >= 0
    t.flat(t.arrays["obs"])[10] = 10
    link[9] = 0
    t.side.arrays["obs"][slot] = 99


def _check_relinked_batch(got: rb.SequenceBatch, want: rb.SequenceBatch, width: int) -> None:
    """``got`` is the batch of the buffer holding the relinked window (``want``), and
    each next observation is its step's: 50 for step 4, ``t + 1`` for every other step
    ``t`` (10 for step 9, relinked), 0 where a window is padded."""
    steps = got.starts[:, None] + np.arange(width)  # (one lane: key = step)
    assert (steps == 9).any()
    nxt = np.where(got.mask, np.where(steps == 4, 50, steps + 1), 0)
    assert np.array_equal(got.next_obs[..., 0], nxt)
    assert got == want


#: Windows sampled from :func:`_steps_with_a_pending_newest`: full stop windows of 5 steps
#: (their side rows at their ends: obs and next_obs one array; two starts are valid, so
#: most draws are redrawn and planned apart), and windows that may be cut short by an
#: episode end or the newest step (every start valid: drawn, planned and gathered in one
#: call): stop windows of 5 steps, cross windows of 10 (side rows inside, padding).
RELINK_WINDOWS = {"stop": (5, {"episode_boundary": "stop"}),
                  "stop, short": (5, {"episode_boundary": "stop", "strict": False}),
                  "cross, short": (10, {"episode_boundary": "cross", "strict": False})}


@pytest.mark.parametrize("kind", list(RELINK_WINDOWS))
@pytest.mark.parametrize("kernel", ["c", "numba", "numpy"])
def test_a_step_relinked_during_the_gather_takes_its_next_row(
        kernel: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shared memory: a writer relinks the window's newest step (link k -> 0, its next
    observation now the next row) right after the kernel that reads the links planned the
    windows (``draw_take`` or ``sequence_plan``; the numpy path's window plan), and reuses
    the freed side slot at once. The gather reads each side row's link again after copying
    it and takes the next row where it changed, so the batch is the one of a buffer
    relinked before the sample (before, the step's next observation was the reused slot's
    99)."""
    from replaybank.views import sequence

    fast = _take_kernels(kernel, monkeypatch)
    buf, twin = _steps_with_a_pending_newest(), _steps_with_a_pending_newest()
    _relink_newest(twin)  # the single-process buffer holding the window
    relinked: list[str] = []

    def relinking(name: str, plan: Any) -> Any:
        def planned(*args: Any) -> Any:
            got = plan(*args)
            if not relinked and (name != "draw_take" or got[1] >= 0):  # windows planned
                relinked.append(name)
                _relink_newest(buf)
            return got
        return planned

    if fast is None:
        plan = relinking("window_plan", sequence._plan_kernel())
        monkeypatch.setattr(sequence, "_plan_kernel", lambda: plan)
    else:
        for name in ("draw_take", "sequence_plan"):
            monkeypatch.setattr(fast, name, relinking(name, getattr(fast, name)))
    width, kw = RELINK_WINDOWS[kind]
    got = buf.sample_sequences(8, width, **kw)
    assert relinked
    _check_relinked_batch(got, twin.sample_sequences(8, width, **kw), width)


@pytest.mark.parametrize("kind", list(RELINK_WINDOWS))
@pytest.mark.parametrize("kernel", ["c", "numba", "numpy"])
def test_a_step_relinked_between_two_samples_takes_its_next_row(
        kernel: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shared memory: a writer relinks the window's newest step between two samples of
    one snapshot (``written`` unchanged) and reuses its side slot. The fused path's
    boundary bytes follow ``written``, so its plan still takes the step for one that
    keeps its next observation aside and reads its link, now 0; the gather takes the
    next row (before, it copied side slot -1, the store's last)."""
    _take_kernels(kernel, monkeypatch)
    buf, twin = _steps_with_a_pending_newest(), _steps_with_a_pending_newest()
    _relink_newest(twin)
    width, kw = RELINK_WINDOWS[kind]
    # the first sample syncs the boundary bytes (step 9's still set), the same batch
    assert buf.sample_sequences(8, width, **kw) == twin.sample_sequences(8, width, **kw)
    _relink_newest(buf)
    _check_relinked_batch(buf.sample_sequences(8, width, **kw),
                          twin.sample_sequences(8, width, **kw), width)


@pytest.mark.parametrize("kernel", ["c", "numba", "numpy"])
def test_windows_gathered_while_a_writer_relinks_hold_no_torn_next_observation(
        kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread relinks steps as fast as Python goes (link k -> 0, the freed slot
    overwritten at once, then a fresh slot linked: :func:`tests.relinking.relink_forever`)
    while cross windows are sampled; the kernels release the GIL, so relinks land between
    the plan's link reads and the side rows' copies. Every step of the lane keeps its next
    observation aside (each one ends an episode), and every next observation sampled is
    its step's own. (A short switch interval hands the GIL back and forth often: more
    relinks land inside the gathers, and fewer than the 63,488 free slots between a
    gather's link reads, so that no link comes back to a slot it named meanwhile.)"""
    import sys
    import threading

    from tests.relinking import relink_forever

    _take_kernels(kernel, monkeypatch)
    n, d, width = 2048, 64, 32
    rows = np.repeat(np.arange(n, dtype=np.float32)[:, None], d, axis=1)
    buf = rb.ReplayBuffer(n, seed=0, autoreset_mode="same_step")
    buf.extend(obs=rows, action=np.zeros(n, np.int64), reward=np.zeros(n, np.float32),
               next_obs=np.roll(rows, -1, axis=0), terminated=np.ones(n, bool),
               truncated=np.zeros(n, bool))
    t = buf.table
    t.side.resize(32 * n)  # slots [0, n) linked, [n, 32 n) free for the relinks
    src, side, link = t.flat(t.arrays["obs"]), t.side.arrays["obs"], t.flat(t.link)
    assert (link > 0).all() and sorted(link.tolist()) == list(range(1, n + 1))
    stop = threading.Event()
    writer = threading.Thread(target=relink_forever, args=(src, side, link, stop))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(2e-4)
    writer.start()
    torn = 0
    try:
        for _ in range(40):
            sb = buf.sample_sequences(64, width, episode_boundary="cross")
            want = (sb.starts[:, None] + np.arange(width) + 1) % n
            torn += int((sb.next_obs != want[..., None]).any(axis=2).sum())
    finally:
        stop.set()
        writer.join()
        sys.setswitchinterval(interval)
    assert torn == 0
