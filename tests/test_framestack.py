"""Frame stacks rebuilt from single frames, checked against gymnasium's real wrapper.

Every test runs ``gymnasium.wrappers.FrameStackObservation(env, 4, padding_type="reset")``
over a real environment (Atari Pong through ale-py when it is installed, and a small
frame-rendering env with frequent terminations and truncations), stores what the
wrapper returned into a replay buffer, and asserts that each sampled ``obs`` /
``next_obs`` stack equals the wrapper's observation at that step, across episode
boundaries, lanes and ring wrap-around.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import ConfigError
from replaybank.ops import ring, windows
from replaybank.views.framestack import FrameStackView

K = 4


class FrameEnv(gym.Env[np.ndarray, int]):
    """Renders a small uint8 frame per step; every frame differs from every other."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, p_term: float = 0.08, seed: int = 0) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (12, 10), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.p_term = p_term
        self.count = 0
        self.uid = seed * 7919

    def _frame(self) -> np.ndarray:
        self.count += 1
        f = np.zeros((12, 10), np.uint8)
        v = self.uid + self.count
        f[0, 0], f[0, 1], f[0, 2] = v % 256, (v // 256) % 256, v // 65536
        f[1:, :] = (np.arange(110).reshape(11, 10) * v) % 251
        return f

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return self._frame(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        term = bool(self.np_random.random() < self.p_term)
        return self._frame(), float(action), term, False, {}


def frame_env(seed: int, max_steps: int = 9) -> gym.Env[Any, Any]:
    env = gym.wrappers.TimeLimit(FrameEnv(seed=seed), max_episode_steps=max_steps)
    return gym.wrappers.FrameStackObservation(env, K, padding_type="reset")


def atari_env(seed: int) -> gym.Env[Any, Any]:
    ale_py = pytest.importorskip("ale_py")
    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", obs_type="grayscale", frameskip=2,
                   repeat_action_probability=0.0, max_episode_steps=12 + 5 * seed)
    return gym.wrappers.FrameStackObservation(env, K, padding_type="reset")


class Recorder:
    """Steps vector lanes (async order), adds to buffers, records the wrapper's stacks."""

    def __init__(self, envs: list[gym.Env[Any, Any]], seed: int) -> None:
        self.envs = envs
        self.rng = np.random.default_rng(seed)
        self.cur = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
        self.written = [0] * len(envs)
        # per lane: episode step index t, stacks of obs and next_obs, done, by seq
        self.log: list[list[dict[str, Any]]] = [[] for _ in envs]
        self.t = [0] * len(envs)

    def step(self, bufs: list[tuple[rb.ReplayBuffer, bool]]) -> None:
        lanes = len(self.envs)
        ids = np.sort(self.rng.choice(lanes, size=int(self.rng.integers(1, lanes + 1)),
                                      replace=False))
        rows = []
        for lane in ids:
            env = self.envs[lane]
            a = int(env.action_space.sample())
            nxt, r, term, trunc, _ = env.step(a)
            rows.append((lane, self.cur[lane], a, r, nxt, term, trunc))
            self.log[lane].append({"t": self.t[lane], "obs": np.array(self.cur[lane]),
                                   "next_obs": np.array(nxt), "done": term or trunc})
            self.written[lane] += 1
            if term or trunc:
                self.cur[lane], self.t[lane] = env.reset()[0], 0
            else:
                self.cur[lane], self.t[lane] = nxt, self.t[lane] + 1
        for buf, single in bufs:
            pick = (lambda x: np.asarray(x)[-1]) if single else np.asarray
            buf.add(env_ids=ids,
                    obs=np.stack([pick(r[1]) for r in rows]),
                    action=np.array([r[2] for r in rows]),
                    reward=np.array([r[3] for r in rows], np.float32),
                    next_obs=np.stack([pick(r[4]) for r in rows]),
                    terminated=np.array([r[5] for r in rows]),
                    truncated=np.array([r[6] for r in rows]))

    def entry(self, key: int) -> dict[str, Any]:
        lanes = len(self.envs)
        return self.log[key % lanes][key // lanes]

    def history_live(self, key: int, nrows: int) -> bool:
        """Whether the table can rebuild this step's stack exactly.

        Every frame the wrapper stacked must still be stored and, when the stack is
        padded (episode step ``t < K - 1``), so must the previous episode's last step,
        which tells the table where the episode began (the very first step of a lane
        needs nothing before it).
        """
        lanes = len(self.envs)
        lane, seq = key % lanes, key // lanes
        oldest = self.written[lane] - min(self.written[lane], nrows)
        t = self.log[lane][seq]["t"]
        if t >= K - 1:
            return seq - (K - 1) >= oldest
        return seq - t >= oldest and (seq - t == 0 or seq - t - 1 >= oldest)


def live_keys(buf: rb.ReplayBuffer) -> np.ndarray:
    t = buf.table
    return np.array([s * t.lanes + lane for lane in range(t.lanes)
                     for s in range(t.written[lane] - t.counts[lane], t.written[lane])])


def check_buffer(buf: rb.ReplayBuffer, rec: Recorder) -> int:
    t = buf.table
    keys = live_keys(buf)
    ok = buf.view.valid(t, keys)
    if ok is None:  # None: the view serves every key
        ok = np.ones(len(keys), dtype=bool)
    want_ok = np.array([rec.history_live(int(k), t.T) for k in keys])
    np.testing.assert_array_equal(ok, want_ok)
    good = keys[ok]
    b = buf.view.gather(t, good)
    for i, key in enumerate(good.tolist()):
        e = rec.entry(key)
        np.testing.assert_array_equal(b["obs"][i], e["obs"])
        np.testing.assert_array_equal(b["next_obs"][i], e["next_obs"])
    batch = buf.sample(32)
    assert ring.is_live(batch.indices, t.written, t.counts).all()
    for i, key in enumerate(batch.indices.tolist()):
        e = rec.entry(key)
        np.testing.assert_array_equal(batch.obs[i], e["obs"])
        np.testing.assert_array_equal(batch.next_obs[i], e["next_obs"])
    return len(good)


@pytest.mark.parametrize("make", [frame_env, atari_env], ids=["frame_env", "atari_pong"])
def test_stacks_equal_frame_stack_observation(make: Any) -> None:
    lanes, nrows = 2, 24
    rec = Recorder([make(s) for s in range(lanes)], seed=0)
    stacked = rb.ReplayBuffer(capacity=lanes * nrows, num_envs=lanes, frame_stack=K, seed=1)
    single = rb.ReplayBuffer(capacity=lanes * nrows, num_envs=lanes, frame_stack=K, seed=1)
    checked = 0
    n_steps = 70 if make is frame_env else 45
    for step in range(n_steps):
        rec.step([(stacked, False), (single, True)])
        if step % 7 == 6:
            checked += check_buffer(stacked, rec)
            checked += check_buffer(single, rec)
    frame = np.asarray(rec.log[0][0]["obs"][-1])
    assert stacked.table.spec["obs"].shape == frame.shape  # one frame per step is stored
    assert single.table.spec == stacked.table.spec
    assert min(stacked.table.written) > nrows  # the ring wrapped
    assert checked > 100
    # stacks at episode starts (reset padding) and after episode ends were covered
    assert sum(e["done"] for lane in rec.log for e in lane) >= 4


def test_nstep_next_stack_is_the_wrappers_at_the_last_step() -> None:
    lanes, nrows, n = 2, 30, 3
    rec = Recorder([frame_env(s + 5, max_steps=6) for s in range(lanes)], seed=3)
    buf = rb.ReplayBuffer(capacity=lanes * nrows, num_envs=lanes, frame_stack=K, n_step=n,
                          gamma=0.5, seed=0)
    for _ in range(80):
        rec.step([(buf, False)])
    t = buf.table
    keys = live_keys(buf)
    ok = buf.view.valid(t, keys)
    keys = keys if ok is None else keys[ok]
    b = buf.view.gather(t, keys)
    for i, key in enumerate(keys.tolist()):
        lane, seq = key % lanes, key // lanes
        last = seq
        for _ in range(n - 1):  # the n-step window ends at an episode end or the head
            if rec.log[lane][last]["done"] or last + 1 >= t.written[lane]:
                break
            last += 1
        np.testing.assert_array_equal(b["obs"][i], rec.log[lane][seq]["obs"])
        np.testing.assert_array_equal(b["next_obs"][i], rec.log[lane][last]["next_obs"])
        assert b["discount"][i] == pytest.approx(0.5 ** (last - seq + 1))


def test_input_forms_and_errors() -> None:
    v = FrameStackView(3)
    out = v.prepare_inputs({"obs": np.zeros((3, 5, 5)), "next_obs": np.ones((3, 5, 5))},
                           False, 1)
    assert out["obs"].shape == (5, 5) and out["next_obs"].shape == (5, 5)
    v = FrameStackView(3)  # a vector env: leading lane dim
    out = v.prepare_inputs({"obs": np.arange(2 * 3 * 4 * 4).reshape(2, 3, 4, 4)}, False, 2)
    np.testing.assert_array_equal(out["obs"], np.arange(96).reshape(2, 3, 4, 4)[:, -1])
    v = FrameStackView(3)  # single frames pass through
    assert v.prepare_inputs({"obs": np.zeros((5, 5))}, False, 1)["obs"].shape == (5, 5)
    v = FrameStackView(2, stacked_inputs=True)  # 2-D stacks of vectors need the flag
    assert v.prepare_inputs({"obs": np.zeros((2, 6))}, False, 1)["obs"].shape == (6,)
    v = FrameStackView(2)  # dict observations: every obs field is stacked
    out = v.prepare_inputs({"obs": {"px": np.zeros((2, 4, 4)), "v": np.zeros(3)},
                            "action": 1}, False, 1)
    assert out["obs"]["px"].shape == (4, 4) and out["obs"]["v"].shape == (3,)
    with pytest.raises(ConfigError):
        FrameStackView(0)
    with pytest.raises(ConfigError):
        FrameStackView(4, stacked_inputs=True).prepare_inputs({"obs": np.zeros((3, 5))},
                                                               False, 1)
    assert FrameStackView(4).config() == {"type": "framestack", "k": 4,
                                          "inner": {"type": "transition"}}


def test_history_overwritten_is_never_served() -> None:
    buf = rb.ReplayBuffer(capacity=6, frame_stack=4, seed=0)
    for t in range(20):  # one long episode: the oldest live steps lost their history
        buf.add(obs=np.full((2, 2), t, np.uint8), action=0, reward=0.0,
                next_obs=np.full((2, 2), t + 1, np.uint8), terminated=False, truncated=False)
    b = buf.sample(200)
    seqs = b.indices
    assert seqs.min() >= 17  # live 14..19; 14, 15, 16 need frames before 14
    np.testing.assert_array_equal(b.obs[:, :, 0, 0], seqs[:, None] + np.arange(-3, 1))
    np.testing.assert_array_equal(b.next_obs[:, :, 0, 0], seqs[:, None] + np.arange(-2, 2))


@pytest.mark.parametrize("kernel", ["numpy", "numba"])
def test_stack_slots_kernels_match_history(kernel: str) -> None:
    pytest.importorskip("numba") if kernel == "numba" else None
    fn = windows.kernel(windows.stack_slots, kernel)[0]
    rng = np.random.default_rng(7)
    for _ in range(200):
        nrows, lanes = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        link = (rng.random((nrows, lanes)) < 0.3).astype(np.int32) * rng.integers(
            1, 9, (nrows, lanes), dtype=np.int32)
        written = rng.integers(0, 3 * nrows, size=lanes)
        counts = np.minimum(written, rng.integers(0, nrows + 1, size=lanes))
        cleared = rng.integers(0, written - counts + 1) if rng.random() < 0.5 \
            else np.zeros_like(written)
        keys = np.array([s * lanes + lane for lane in range(lanes)
                         for s in range(written[lane] - counts[lane], written[lane])],
                        dtype=np.int64)
        k = int(rng.integers(1, 6))
        slots, side, ok = fn(link, written, counts, cleared, keys, k)
        hist, ok_h = windows.history(link, written, counts, cleared, keys, k)
        np.testing.assert_array_equal(ok, ok_h)
        np.testing.assert_array_equal(slots[:, :k], (hist // lanes) % nrows * lanes + hist % lanes)
        for i, key in enumerate(keys.tolist()):
            seq, lane = key // lanes, key % lanes
            assert slots[i, k] == ((seq + 1) % nrows) * lanes + lane
            assert side[i] == link[seq % nrows, lane] - 1
        if kernel == "numba":
            from replaybank.ops.stack_numba import stack_slots_counted

            *_, ok_c, n_bad, n_side = stack_slots_counted(link, written, counts, cleared,
                                                          keys, k)
            assert n_bad == int((~ok_h).sum()) and n_side == int((side >= 0).sum())
            assert (ok_c is None) == (n_bad == 0)
            if ok_c is not None:
                np.testing.assert_array_equal(ok_c, ok_h)


def test_numpy_kernel_view_gives_the_same_batches() -> None:
    lanes, nrows = 2, 20
    rec = Recorder([frame_env(s + 11) for s in range(lanes)], seed=5)
    a = rb.ReplayBuffer(capacity=lanes * nrows, num_envs=lanes, seed=2,
                        view=FrameStackView(K, kernel="numpy"))
    b = rb.ReplayBuffer(capacity=lanes * nrows, num_envs=lanes, seed=2, frame_stack=K)
    for _ in range(50):
        rec.step([(a, False), (b, False)])
    assert check_buffer(a, rec) > 10
    assert check_buffer(b, rec) > 10
    assert a.sample(64) == b.sample(64)


def _oracle_windows(link: np.ndarray, written: np.ndarray, counts: np.ndarray,
                    cleared: np.ndarray, keys: np.ndarray, k: int, frames: np.ndarray,
                    side_frames: np.ndarray) -> np.ndarray | None:
    """Plain-loop oracle of ``stack_numba.stack_gather`` (through windows.history)."""
    nrows, lanes = link.shape
    hist, ok = windows.history(link, written, counts, cleared, keys, k)
    if not ok.all():
        return None
    out = np.empty((len(keys), k + 1, *frames.shape[1:]), frames.dtype)
    for i, key in enumerate(keys.tolist()):
        seq, lane = key // lanes, key % lanes
        for c in range(k):
            h = int(hist[i, c])
            out[i, c] = frames[(h // lanes) % nrows * lanes + lane]
        v = int(link[seq % nrows, lane])
        out[i, k] = side_frames[v - 1] if v > 0 else frames[(seq + 1) % nrows * lanes + lane]
    return out


@pytest.mark.parametrize("dtype,shape", [(np.uint8, (3, 2)), (np.float32, (3,)),
                                         (np.int16, ()), (np.bool_, (2,))])
def test_stack_gather_matches_loop_oracle(dtype: Any, shape: tuple[int, ...]) -> None:
    pytest.importorskip("numba")
    from replaybank.ops.stack_numba import stack_buffers, stack_gather

    rng = np.random.default_rng(11)
    bufs = stack_buffers(0, 1)
    n_none = 0
    for _ in range(300):
        nrows, lanes = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        n_side = int(rng.integers(1, 6))
        link = (rng.random((nrows, lanes)) < 0.3).astype(np.int32) * rng.integers(
            1, n_side + 1, (nrows, lanes), dtype=np.int32)
        written = rng.integers(1, 3 * nrows + 1, size=lanes)
        counts = np.minimum(written, rng.integers(1, nrows + 1, size=lanes))
        cleared = rng.integers(0, written - counts + 1) if rng.random() < 0.5 \
            else np.zeros_like(written)
        live = np.array([s * lanes + lane for lane in range(lanes)
                         for s in range(written[lane] - counts[lane], written[lane])])
        keys = rng.choice(live, size=int(rng.integers(1, 8)))
        k = int(rng.integers(1, 6))
        frames = (rng.random((nrows * lanes, *shape)) * 100).astype(dtype)
        side = (rng.random((n_side, *shape)) * 100).astype(dtype)
        if bufs[1].shape != (len(keys), k + 1):
            bufs = stack_buffers(len(keys), k)
        got = stack_gather(link, written, counts, cleared, keys, k, frames, side, bufs)
        want = _oracle_windows(link, written, counts, cleared, keys, k, frames, side)
        if want is None:
            n_none += 1
            assert got is None
        else:
            assert got is not None and got.dtype == frames.dtype
            np.testing.assert_array_equal(got, want)
    assert 10 < n_none < 290  # both outcomes covered


class _PlainView:
    """A frame-stack view without ``gather_valid``: the buffer takes the old path
    (``valid``, redraws, then ``gather``)."""

    every_step = False

    def __init__(self, view: FrameStackView) -> None:
        self.v = view

    def gather(self, table: Any, keys: np.ndarray, rng: Any = None) -> dict[str, Any]:
        return self.v.gather(table, keys, rng)

    def state_dict(self) -> dict[str, Any]:
        return self.v.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.v.load_state_dict(state)

    def valid(self, table: Any, keys: np.ndarray) -> Any:
        return self.v.valid(table, keys)

    def config(self) -> dict[str, Any]:
        return self.v.config()

    def prepare_inputs(self, fields: dict[str, Any], steps: bool, lanes: int) -> dict[str, Any]:
        return self.v.prepare_inputs(fields, steps, lanes)


@pytest.mark.parametrize("lanes,sampler,kernel", [
    (1, None, "auto"), (1, None, "numpy"), (3, None, "auto"),
    (2, "prioritized", "auto"), (1, "lane_split", "auto")])
def test_fused_sampling_equals_valid_then_gather(lanes: int, sampler: str | None,
                                                 kernel: str) -> None:
    """The one-pass path draws the same keys (redraws included) and gathers the same
    stacks as valid-then-gather, while the ring wraps and the side store grows."""
    def make(view: Any) -> rb.ReplayBuffer:
        kw: dict[str, Any] = {}
        if sampler == "prioritized":
            kw["sampler"] = rb.PrioritizedSampler()
        elif sampler == "lane_split":
            kw["lane_split"] = "random"
        return rb.ReplayBuffer(capacity=lanes * 150, num_envs=lanes, seed=3, view=view, **kw)

    fast = make(FrameStackView(K, kernel=kernel))
    slow = make(_PlainView(FrameStackView(K, kernel=kernel)))
    rng = np.random.default_rng(4)
    t = 0
    for step in range(60):
        n = int(rng.integers(1, 9))
        obs = (np.arange(t, t + n + 1)[:, None, None, None] * np.ones((1, lanes, 3, 2))
               + np.arange(lanes)[None, :, None, None] * 1000).astype(np.float32)
        term = rng.random((n, lanes)) < 0.6  # short episodes: the side store grows
        nxt = obs[1:] + 0.5 * term[..., None, None]  # episode ends keep their own next obs
        fields = {"obs": obs[:-1], "action": np.zeros((n, lanes), np.int64),
                  "reward": np.ones((n, lanes), np.float32), "next_obs": nxt,
                  "terminated": term, "truncated": np.zeros((n, lanes), bool)}
        if lanes == 1:  # one env: no lane dim
            fields = {name: a[:, 0] for name, a in fields.items()}
        for buf in (fast, slow):
            buf.extend(**fields)
        t += n
        if step % 3 == 2:
            for b in (1, 7, 32):
                got, want = fast.sample(b), slow.sample(b)
                assert got == want
                keys = got.indices
                assert fast.view.valid(fast.table, keys) is None
                ref = fast.view.gather(fast.table, keys)
                np.testing.assert_array_equal(got.obs, ref["obs"])
                np.testing.assert_array_equal(got.next_obs, ref["next_obs"])
            assert fast.rng.bit_generator.state == slow.rng.bit_generator.state
    assert fast.table.side_capacity > 64  # the side store was replaced while cached


def test_gather_valid_is_none_exactly_when_valid_rejects() -> None:
    rec = Recorder([frame_env(s + 21) for s in range(2)], seed=9)
    buf = rb.ReplayBuffer(capacity=2 * 16, num_envs=2, frame_stack=K, seed=0)
    for _ in range(40):
        rec.step([(buf, False)])
    t, v = buf.table, buf.view
    keys = live_keys(buf)
    ok = v.valid(t, keys)
    assert ok is not None and not ok.all() and ok.any()
    for key, good in zip(keys.tolist(), ok.tolist(), strict=True):
        got = v.gather_valid(t, np.array([key]))
        assert (got is not None) == good
        if got is not None:
            e = rec.entry(key)
            np.testing.assert_array_equal(got["obs"][0], e["obs"])
            np.testing.assert_array_equal(got["next_obs"][0], e["next_obs"])
            assert sorted(got) == sorted(v.gather(t, np.array([key])))


def test_stack_gather_never_reads_past_the_side_store() -> None:
    pytest.importorskip("numba")
    from replaybank.ops.stack_numba import stack_gather

    link = np.zeros((4, 1), np.int32)
    link[3, 0] = 7  # names side slot 6 of 2: a corrupt table
    frames, side = np.arange(4, dtype=np.uint8), np.zeros(2, np.uint8)
    with pytest.raises(IndexError, match="side slot"):
        stack_gather(link, np.array([4]), np.array([4]), np.array([0]), np.array([3]), 2,
                     frames, side)
    buf = rb.ReplayBuffer(capacity=8, frame_stack=2, seed=0)
    for t in range(5):
        buf.add(obs=np.full(2, t, np.uint8), action=0, reward=0.0,
                next_obs=np.full(2, t + 1, np.uint8), terminated=False, truncated=False)
    buf.table.link[4, 0] = 10_000  # the newest step's link, corrupted
    assert buf.view.gather_valid(buf.table, np.array([4])) is None
    with pytest.raises(IndexError):
        buf.view.gather(buf.table, np.array([4]))


@pytest.mark.parametrize("sampler", [None, "per"])
def test_without_replacement_draws_distinct_servable_steps(sampler: str | None) -> None:
    """``replace=False``: keys a stack cannot serve (history overwritten) are redrawn among
    the keys not yet in the batch, so the batch is distinct steps, each servable one
    equally likely; fewer servable steps than the batch is an error that draws nothing."""
    from tests.stats import chi2_critical

    per = rb.PrioritizedSampler(alpha=1.0, eps=0.0) if sampler else None
    buf = rb.ReplayBuffer(12, seed=5, frame_stack=3, sampler=per)
    for t in range(15):  # one episode, wrapped: the 2 oldest live steps lack history
        buf.add(obs=np.full(2, t, np.uint8), action=0, reward=0.0,
                next_obs=np.full(2, t + 1, np.uint8), terminated=False, truncated=False)
    servable = list(range(5, 15))
    counts = dict.fromkeys(servable, 0)
    for _ in range(1500):
        b = buf.sample(6, replace=False)
        keys = b.indices.tolist()
        assert len(set(keys)) == 6 and set(keys) <= set(servable)
        assert b.obs[:, -1, 0].tolist() == keys  # (the newest frame of key k is k)
        for k in keys:
            counts[k] += 1
    expected = 1500 * 6 / 10
    stat = sum((c - expected) ** 2 / expected for c in counts.values())
    assert stat < chi2_critical(9), stat
    assert sorted(buf.sample(10, replace=False).indices.tolist()) == servable
    before = buf.rng.bit_generator.state
    with pytest.raises(rb.EmptyBufferError,
                       match=r"holds 10 distinct steps.*lower batch_size to at most 10"):
        buf.sample(11, replace=False)
    assert buf.rng.bit_generator.state == before


def test_a_step_relinked_after_the_plan_takes_its_next_row() -> None:
    """Shared memory: a writer relinks a step (link k -> 0, its next observation now the
    next row) after the learner planned its stacks, and reuses the freed side slot at
    once. The gather reads the links again after copying and takes the next row where
    one changed (before, the stale plan handed out the reused slot's data)."""
    buf = rb.ReplayBuffer(16, seed=0, frame_stack=2)
    for t in range(10):  # one episode, every next observation continuous
        buf.add(obs=np.full(3, t, np.uint8), action=0, reward=0.0,
                next_obs=np.full(3, t + 1, np.uint8), terminated=False, truncated=False)
    table = buf.table
    link, kept = table.flat(table.link), table.side.arrays["obs"]
    newest = 9  # (one lane, no wrap: key = slot) the newest step keeps its next obs aside
    assert np.flatnonzero(link).tolist() == [newest]
    keys = np.array([newest, newest, 3])
    ok = buf.view.valid(table, keys)  # the plan is made (and cached) here
    assert ok is None or ok.all()
    slot = int(link[newest]) - 1
    link[newest] = 0  # the writer relinks it...
    buf.table.arrays["obs"][(newest + 1) % 16] = newest + 1  # (its next row, committed)
    kept[slot] = 99  # ...and reuses the freed slot for another step
    got = buf.view.gather(table, keys)
    assert got["next_obs"][:, -1, 0].tolist() == [newest + 1, newest + 1, 4]


def _one_episode(buf: rb.ReplayBuffer, steps: int, lanes: int = 1) -> None:
    """``steps`` adds of one long episode per lane; the obs of step ``t`` of lane ``l`` is
    ``100 * l + t``."""
    for t in range(steps):
        obs = (100.0 * np.arange(lanes) + t)[:, None].astype(np.float32)
        if lanes == 1:
            buf.add(obs=obs[0], action=0, reward=0.0, next_obs=obs[0] + 1,
                    terminated=False, truncated=False)
        else:
            buf.add(obs=obs, action=np.zeros(lanes, np.int64), reward=np.zeros(lanes),
                    next_obs=obs + 1, terminated=np.zeros(lanes, bool),
                    truncated=np.zeros(lanes, bool))


def test_without_replacement_up_to_every_servable_step_never_fails() -> None:
    """``replace=False`` with a batch of (nearly) every servable step: the redraw rounds
    used to give up at random (after 64 redraws fewer distinct steps than the batch);
    the draw is now exact among the servable steps, uniform over their subsets, and a
    batch above their number is refused with the exact count, drawing nothing."""
    from tests.stats import chi2_critical

    for seed in range(300):  # 2 lanes of 8, wrapped: 3 oldest steps per lane not served
        buf = rb.ReplayBuffer(16, num_envs=2, frame_stack=4, seed=seed)
        _one_episode(buf, 20, lanes=2)
        b = buf.sample(10, replace=False)
        assert sorted(b.indices.tolist()) == [k for k in range(30, 40)]
    counts = np.zeros(40, int)
    for _ in range(2000):
        keys = buf.sample(9, replace=False).indices
        assert len(set(keys.tolist())) == 9
        counts[keys] += 1
    servable = counts[30:]
    assert counts[:30].sum() == 0
    expected = 2000 * 9 / 10
    stat = float(((servable - expected) ** 2 / expected).sum())
    assert stat < chi2_critical(9), stat
    before = buf.rng.bit_generator.state
    with pytest.raises(rb.EmptyBufferError,
                       match=r"batch_size=11, replace=False\): the buffer holds 10 distinct "
                             r"steps.*at most 10"):
        buf.sample(11, replace=False)
    assert buf.rng.bit_generator.state == before


def test_without_replacement_small_batch_above_the_servable_steps_names_the_count() -> None:
    """A batch below half the stored steps but above the servable ones: the redraw rounds
    fail, then the refusal gives the exact number of servable steps (no state change)."""
    buf = rb.ReplayBuffer(16, num_envs=2, frame_stack=8, seed=0)
    _one_episode(buf, 12, lanes=2)  # per lane of 8: only the newest step has its history
    assert sorted(buf.sample(2, replace=False).indices.tolist()) == [22, 23]
    before = buf.rng.bit_generator.state
    with pytest.raises(rb.EmptyBufferError,
                       match=r"holds 2 distinct steps the view can serve \(among 16 steps"):
        buf.sample(3, replace=False)
    assert buf.rng.bit_generator.state == before


def test_with_replacement_falls_back_to_the_servable_steps() -> None:
    """Most stored steps unservable (a long stack over a wrapped ring): the redraw rounds
    do not finish, and the rows they leave are drawn uniformly among the servable steps
    (before: "after 64 redraws ... add more data" although two steps are servable)."""
    from tests.stats import chi2_critical

    buf = rb.ReplayBuffer(128, num_envs=2, frame_stack=64, seed=3)
    _one_episode(buf, 70, lanes=2)  # per lane of 64: only the newest step is servable
    counts = np.zeros(2, int)
    for _ in range(50):
        b = buf.sample(32)
        assert set(b.indices.tolist()) <= {138, 139}
        assert b.obs[:, -1, 0].tolist() == [69.0 + 100 * (k % 2) for k in b.indices]
        counts += np.bincount(b.indices - 138, minlength=2)
    expected = 50 * 32 / 2
    assert float(((counts - expected) ** 2 / expected).sum()) < chi2_critical(1)


def _per_wrapped(seed: int) -> rb.ReplayBuffer:
    """PER (alpha 1, eps 0), frame stack 4 over a ring of 8 that wrapped: steps 4, 5, 6
    lack their history; they hold priority 1000 each, the servable 7..11 priorities
    1..5."""
    buf = rb.ReplayBuffer(8, frame_stack=4, seed=seed,
                          sampler=rb.PrioritizedSampler(alpha=1.0, eps=0.0, beta=0.5))
    _one_episode(buf, 12)
    buf.update_priorities(np.arange(4, 12), np.r_[[1000.0] * 3, 1.0, 2.0, 3.0, 4.0, 5.0])
    return buf


def test_prioritized_mass_on_unservable_steps_draws_among_the_servable() -> None:
    """PER whose mass sits on steps a frame stack cannot serve: the draws that the redraw
    rounds leave come i.i.d. in proportion to priority among the servable steps, with
    ``P(i) = p_i / total`` and the sampler's weights (before: an EmptyBufferError)."""
    from tests.stats import chi2_critical

    buf = _per_wrapped(0)
    total = 3000.0 + 15.0
    counts = np.zeros(5, int)
    for _ in range(100):
        b = buf.sample(32)
        keys = b.indices
        assert set(keys.tolist()) <= set(range(7, 12))
        np.testing.assert_allclose(b.probabilities, (keys - 6) / total)
        # weights (N P(i))^-beta over the largest possible weight (of the smallest
        # stored priority, 1): sqrt(1 / p_i)
        np.testing.assert_allclose(b.weights, np.sqrt(1.0 / (keys - 6)), rtol=1e-6)
        counts += np.bincount(keys - 7, minlength=5)
    expected = counts.sum() * np.arange(1, 6) / 15.0
    assert float(((counts - expected) ** 2 / expected).sum()) < chi2_critical(4)


def test_prioritized_no_servable_step_with_priority_is_refused_unchanged() -> None:
    """Every servable step at priority 0: refused, naming the positive priority the
    servable steps lack; the generator and the beta schedule are as before."""
    buf = _per_wrapped(1)
    buf.update_priorities(np.arange(7, 12), np.zeros(5))
    sampler = buf.sampler
    assert isinstance(sampler, rb.PrioritizedSampler)
    before, calls = buf.rng.bit_generator.state, sampler.calls
    with pytest.raises(rb.EmptyBufferError,
                       match=r"none of the 8 stored steps can be served with a positive "
                             r"priority.*update priorities"):
        buf.sample(4)
    assert buf.rng.bit_generator.state == before and sampler.calls == calls


# ---------------------------------------------------------------------- after clear()
# A cleared buffer must serve exactly what a fresh buffer given the same adds serves: the
# steps before the first one after a clear do not exist, as in a fresh buffer, so the
# first k - 1 steps of each lane are served, padded with their first frame (before the
# fix they were treated as steps whose history the ring overwrote, and not served).

CK = 3  # frames per stack in the clear() tests
#: The adds before and after the clear of each case: (adds before, ends before, adds
#: after, ends after); an end is the add (counted from 0) that terminates an episode.
CLEAR_CASES = {
    "mid_episode": (5, (), 7, (2,)),         # a running episode cut by the clear
    "episode_boundary": (5, (4,), 7, (1, 5)),  # cleared right after an episode ended
    "wrapped": (21, (9,), 7, (3,)),          # the ring (8 per lane) wrapped before
}


def _feed(buf: rb.ReplayBuffer, adds: int, ends: tuple[int, ...], lanes: int,
          base: float = 0.0) -> None:
    """``adds`` adds to every lane; the frame of add ``t`` in lane ``l`` is ``base + 1000
    * l + t`` (every stored frame names its step); the adds in ``ends`` terminate their
    episode (final frame ``+ 0.5``; the next add starts the next episode), the others
    continue into the next add's frame."""
    for t in range(adds):
        obs = np.repeat((base + 1000.0 * np.arange(lanes) + t)[:, None], 2, axis=1)
        end = np.full(lanes, t in ends)
        nxt = obs + (0.5 if t in ends else 1.0)
        if lanes == 1:
            buf.add(obs=obs[0].astype(np.float32), action=t, reward=float(t),
                    next_obs=nxt[0].astype(np.float32), terminated=bool(end[0]),
                    truncated=False)
        else:
            buf.add(obs=obs.astype(np.float32), action=np.full(lanes, t),
                    reward=np.full(lanes, float(t)), next_obs=nxt.astype(np.float32),
                    terminated=end, truncated=np.zeros(lanes, bool))


def _clear_pair(case: str, lanes: int, sampler: str, **kwargs: Any) -> tuple[
        rb.ReplayBuffer, rb.ReplayBuffer]:
    """``(cleared, fresh)``: a buffer given the case's adds, cleared, then given the adds
    after; and a fresh buffer given only those (same seed, sampler and frame stack)."""
    before, ends_before, after, ends_after = CLEAR_CASES[case]

    def make(**more: Any) -> rb.ReplayBuffer:
        extra: dict[str, Any] = {"sampler": rb.PrioritizedSampler()} if sampler == "per" \
            else {}
        return rb.ReplayBuffer(8 * lanes, num_envs=lanes, frame_stack=CK, seed=0,
                               **extra, **more)

    cleared, fresh = make(**kwargs), make()
    _feed(cleared, before, ends_before, lanes, base=500_000.0)  # frames never served again
    cleared.clear()
    _feed(cleared, after, ends_after, lanes)
    _feed(fresh, after, ends_after, lanes)
    return cleared, fresh


def _servable(buf: rb.ReplayBuffer) -> dict[float, tuple[list[float], list[float]]]:
    """Every step the buffer serves, by the frame it stores: its obs and next_obs stacks
    (first component of each frame), from one draw of all of them without replacement
    (which draws exactly the servable steps)."""
    t = buf.table
    keys = live_keys(buf)
    ok = buf.view.valid(t, keys)
    n = len(keys) if ok is None else int(ok.sum())
    if n == 0:
        return {}
    b = buf.sample(n, replace=False)
    with pytest.raises(rb.EmptyBufferError):
        buf.sample(n + 1, replace=False)  # no other step is servable
    return {float(o[-1, 0]): (o[:, 0].tolist(), x[:, 0].tolist())
            for o, x in zip(b.obs, b.next_obs, strict=True)}


def _assert_serves_as_fresh(buf: rb.ReplayBuffer, fresh: rb.ReplayBuffer, lanes: int,
                            sampler: str) -> None:
    """``buf`` serves the steps ``fresh`` serves, with the same stacks; its batches are
    the fresh buffer's (uniform: the same draws, up to the keys' sequence numbers)."""
    want = _servable(fresh)
    assert want and _servable(buf) == want
    for lane in range(lanes):  # a lane's first step: served, padded with its first frame
        first = 1000.0 * lane
        if fresh.table.written[lane] <= fresh.table.T:  # (not yet overwritten)
            assert want[first] == ([first] * CK, [first] * (CK - 1) + [first + 1])
    buf.rng.bit_generator.state = fresh.rng.bit_generator.state
    a, b = buf.sample(64), fresh.sample(64)
    for name in ("obs", "next_obs", "action", "reward", "terminated"):
        if sampler == "uniform":
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    for o, x in zip(a.obs, a.next_obs, strict=True):  # every row a stack fresh serves
        assert want[float(o[-1, 0])] == (o[:, 0].tolist(), x[:, 0].tolist())


@pytest.mark.parametrize("case", sorted(CLEAR_CASES))
@pytest.mark.parametrize("lanes,sampler", [(1, "uniform"), (3, "uniform"), (1, "per"),
                                           (3, "per")])
def test_a_cleared_buffer_serves_what_a_fresh_buffer_serves(case: str, lanes: int,
                                                            sampler: str) -> None:
    cleared, fresh = _clear_pair(case, lanes, sampler)
    _assert_serves_as_fresh(cleared, fresh, lanes, sampler)
    for buf in (cleared, fresh):  # the ring wraps after the clear too
        _feed(buf, 12, (6,), lanes, base=0.25)
    _assert_serves_as_fresh(cleared, fresh, lanes, sampler)
    # the oldest steps of each lane lost their history to the ring: not served
    assert len(_servable(fresh)) < len(fresh)


@pytest.mark.parametrize("sampler", ["uniform", "per"])
def test_a_cleared_buffer_holding_only_first_steps_samples(sampler: str) -> None:
    """Only steps whose stacks reach back to the clear (before the fix: refused, "none
    of the 2 stored steps can be served ... removed by clear()")."""
    extra: dict[str, Any] = {"sampler": rb.PrioritizedSampler()} if sampler == "per" else {}
    buf = rb.ReplayBuffer(16, num_envs=2, frame_stack=3, seed=0, **extra)
    _one_episode(buf, 2, lanes=2)
    buf.clear()
    _one_episode(buf, 1, lanes=2)
    b = buf.sample(8)
    assert {tuple(o) for o in b.obs[:, :, 0].tolist()} <= {(0.0, 0.0, 0.0),
                                                           (100.0, 100.0, 100.0)}
    assert {tuple(x) for x in b.next_obs[:, :, 0].tolist()} <= {(0.0, 0.0, 1.0),
                                                                (100.0, 100.0, 101.0)}
    assert sorted(buf.sample(2, replace=False).obs[:, -1, 0].tolist()) == [0.0, 100.0]


@pytest.mark.parametrize("lanes,sampler", [(1, "uniform"), (3, "per")])
def test_a_cleared_buffer_serves_as_fresh_after_state_dict_save_and_load(
        tmp_path: Any, lanes: int, sampler: str) -> None:
    """What records the clear survives ``state_dict`` / ``load_state_dict`` and
    ``rb.save`` / ``rb.load``."""
    cleared, fresh = _clear_pair("mid_episode", lanes, sampler)
    state = cleared.state_dict()
    assert "meta/cleared" in state["table"]
    copy = _clear_pair("wrapped", lanes, sampler)[0]  # another clear, other counters
    copy.load_state_dict(state)
    _assert_serves_as_fresh(copy, fresh, lanes, sampler)
    rb.save(cleared, tmp_path / "ckpt")
    _assert_serves_as_fresh(rb.load(tmp_path / "ckpt"), fresh, lanes, sampler)
    _assert_serves_as_fresh(cleared, fresh, lanes, sampler)


@pytest.mark.parametrize("lanes", [1, 3])
def test_a_cleared_memmap_buffer_serves_as_fresh_after_reopen(tmp_path: Any,
                                                              lanes: int) -> None:
    """A memmap buffer keeps the clear in its files: reopened for writing, or read-only
    beside its writer, it serves what a fresh buffer serves."""
    path = tmp_path / "m"
    cleared, fresh = _clear_pair("episode_boundary", lanes, "uniform", storage="memmap",
                                 path=str(path))
    _assert_serves_as_fresh(cleared, fresh, lanes, "uniform")
    cleared.flush()
    reader = rb.open(path, mode="r")
    _assert_serves_as_fresh(reader, fresh, lanes, "uniform")
    reader.close()
    cleared.close()
    again = rb.open(path)
    _assert_serves_as_fresh(again, fresh, lanes, "uniform")
    _feed(again, 3, (), lanes, base=0.25)  # later adds continue the lanes
    _feed(fresh, 3, (), lanes, base=0.25)
    _assert_serves_as_fresh(again, fresh, lanes, "uniform")
    again.close()


def test_old_state_without_the_clear_record_loads_as_before() -> None:
    """A state saved before the table recorded clears (no ``meta/cleared``) loads, with no
    clear recorded: a never-cleared buffer's state serves as it did, a cleared one's
    keeps its first ``k - 1`` steps after the clear unserved, as the old code did; the
    same state with the record serves them. A record that breaks the counters (a clear
    after a live step) is refused."""
    lanes = 2
    cleared, fresh = _clear_pair("mid_episode", lanes, "uniform")
    never = fresh.state_dict()
    del never["table"]["meta/cleared"]
    back = _clear_pair("wrapped", lanes, "uniform")[0]
    back.load_state_dict(never)
    _assert_serves_as_fresh(back, fresh, lanes, "uniform")
    old = cleared.state_dict()
    del old["table"]["meta/cleared"]
    back.load_state_dict(old)
    served = set(_servable(back))
    lost = {1000.0 * lane + t for lane in range(lanes) for t in range(CK - 1)}
    assert served == set(_servable(fresh)) - lost
    back.load_state_dict(cleared.state_dict())
    _assert_serves_as_fresh(back, fresh, lanes, "uniform")
    bad = cleared.state_dict()
    bad["table"]["meta/cleared"] = bad["table"]["meta/written"] + 1
    with pytest.raises(rb.CheckpointError,
                       match=r"meta/cleared\[0\] = 13 is outside \[0, written - counts = 5\]"):
        back.load_state_dict(bad)
    _assert_serves_as_fresh(back, fresh, lanes, "uniform")  # unchanged


def _as_old_files(path: Any, arrays: tuple[str, ...]) -> None:
    """Make the memmap files at ``path`` as a version before ``arrays`` (``meta/...``)
    existed wrote them: no manifest entry, no file."""
    import json

    from replaybank.storage.backends.memmap import MANIFEST

    manifest = json.loads((path / MANIFEST).read_text())
    for name in arrays:
        (path / manifest["arrays"].pop(name)["file"]).unlink()
    (path / MANIFEST).write_text(json.dumps(manifest))


def _file_bytes(path: Any) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


@pytest.mark.parametrize("lanes", [1, 3])
@pytest.mark.parametrize("missing", [("meta/cleared",), ("meta/cleared", "meta/start")])
def test_a_clear_of_old_memmap_files_outlives_a_reopen(tmp_path: Any, lanes: int,
                                                       missing: tuple[str, ...]) -> None:
    """Files written before the table recorded clears (no ``meta/cleared``; the oldest
    also without ``meta/start``) reopen with no clear recorded, and a clear made on them
    is kept in the files: after the next reopen they serve exactly what files of this
    version given the same calls serve, and ``inspect`` reports the same episodes
    (before, the clear lived in memory only, and the reopened files left each lane's
    first k - 1 steps after it unserved, taking them for mid-episode steps). A read-only
    open of the old files writes nothing, and refuses to clear them."""
    from replaybank.cli.inspect import summarize
    from replaybank.storage.backends.memmap import MemmapBackend

    old, new = tmp_path / "old", tmp_path / "new"
    for path in (old, new):
        buf = rb.ReplayBuffer(8 * lanes, num_envs=lanes, frame_stack=CK, seed=0,
                              storage="memmap", path=str(path))
        _feed(buf, 5, (), lanes, base=500_000.0)
        buf.close()
    _as_old_files(old, missing)
    # a kill between the two stores that give old files the record leaves its file
    # unnamed by the manifest: ignored, and replaced by the clear
    (old / MemmapBackend.file_name("meta/cleared")).write_bytes(b"\xff" * 8 * lanes)
    before = _file_bytes(old)
    reader = rb.open(old, mode="r")
    assert len(reader) == 5 * lanes and not reader.table.cleared.any()
    with pytest.raises(ConfigError, match="read-only"):
        reader.clear()
    reader.close()
    assert _file_bytes(old) == before
    for path in (old, new):
        buf = rb.open(path)
        _feed(buf, 2, (), lanes, base=600_000.0)
        buf.clear()
        _feed(buf, 7, (2,), lanes)
        buf.close()
    fresh = rb.ReplayBuffer(8 * lanes, num_envs=lanes, frame_stack=CK, seed=0)
    _feed(fresh, 7, (2,), lanes)
    again = {path: rb.open(path) for path in (old, new)}
    assert _servable(again[old]) == _servable(again[new])
    np.testing.assert_array_equal(again[old].table.cleared, again[new].table.cleared)
    for buf in again.values():
        _assert_serves_as_fresh(buf, fresh, lanes, "uniform")
        buf.close()
    got, want = summarize(old).summary, summarize(new).summary
    for key in ("episodes", "lengths", "returns"):
        assert got[key] == want[key], key


@pytest.mark.parametrize("generator", ["pcg64", "pcg64_half_word", "mt19937"])
def test_a_failed_one_lane_sample_leaves_the_generator_as_it_was(generator: str) -> None:
    """One lane, uniform sampler (the buffer's shortcut past the sampler protocol): a
    buffer loaded from a cleared buffer's state saved before clears were recorded (no
    ``meta/cleared``: the steps after the clear lack their history) serves none. The
    failed call puts the generator back exactly (before, the first draw and the redraw
    rounds stayed consumed, so a failed call changed every later batch): PCG64 (the
    default) is rewound by the raw words the first draw read, with its buffered 32-bit
    half kept; other generators are restored from a state saved before the draw."""
    def make() -> rb.ReplayBuffer:
        rng = np.random.Generator(np.random.MT19937(7)) if generator == "mt19937" \
            else np.random.default_rng(7)
        buf = rb.ReplayBuffer(16, frame_stack=3, seed=rng)
        _one_episode(buf, 5)
        buf.sample(4)  # the shortcut's first call
        buf.clear()
        _one_episode(buf, 2)
        state = buf.state_dict()
        del state["table"]["meta/cleared"]  # as saved before clears were recorded
        buf.load_state_dict(state)  # both steps lack the history clear() removed
        if generator == "pcg64_half_word":
            buf.rng.integers(0, 9, dtype=np.uint32)  # leaves half a raw word buffered
        return buf

    buf, twin = make(), make()
    before = repr(buf.rng.bit_generator.state)
    for batch in (1, 4, 64):
        with pytest.raises(rb.EmptyBufferError, match=r"none of the 2 stored steps can be "
                                                      r"served"):
            buf.sample(batch)
        assert repr(buf.rng.bit_generator.state) == before
    _one_episode(buf, 3)
    _one_episode(twin, 3)
    assert buf.sample(8) == twin.sample(8)  # later batches as if no call had failed
    assert repr(buf.rng.bit_generator.state) == repr(twin.rng.bit_generator.state)
