"""Hindsight experience replay: goal choice, relabel fraction, rewards, composition, state.

The data encodes where every goal came from: in lane ``l`` the step with sequence number
``s`` observes ``achieved_goal = [l, s]`` and its next observation achieves ``[l, s + 1]``,
so a relabelled goal ``[l', j + 1]`` names the step ``j`` of lane ``l'`` it was taken from.
A plain-Python model of the stored episodes (:class:`Model`) gives the exact support of
each strategy.
"""

from __future__ import annotations

import copy
import pickle
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.ops.episodes import EpisodeIndex
from tests.stats import chi2_critical

GOAL = np.array([-1.0, -1.0])  # the stored desired goal: never achieved


def reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    return -(np.abs(achieved - desired).sum(-1) > 0).astype(np.float32)


def reached(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    return np.abs(achieved - desired).sum(-1) == 0


rb.register_function("test_her_reward", reward)
rb.register_function("test_her_reached", reached)


def obs(lane: np.ndarray, seq: np.ndarray) -> dict[str, np.ndarray]:
    ag = np.stack([lane, seq], axis=-1).astype(np.float64)
    return {"observation": ag * 2, "achieved_goal": ag,
            "desired_goal": np.broadcast_to(GOAL, ag.shape).copy()}


class Model:
    """Every written step per lane: (seq, episode id, ended here) in write order."""

    def __init__(self, lanes: int, T: int) -> None:  # noqa: N803
        self.lanes, self.T = lanes, T
        self.steps: list[list[tuple[int, int, bool]]] = [[] for _ in range(lanes)]
        self.episode = [0] * lanes
        self.next_id = lanes

    def live(self, lane: int) -> list[tuple[int, int, bool]]:
        return self.steps[lane][-self.T:]

    def episode_of(self, lane: int, seq: int) -> tuple[list[int], bool]:
        """Surviving steps of the episode of (lane, seq) and whether it ended."""
        live = self.live(lane)
        eid = next(e for s, e, _ in live if s == seq)
        steps = [s for s, e, _ in live if e == eid]
        ended = any(d for s, e, d in live if e == eid)
        return steps, ended

    def support(self, strategy: str, lane: int, seq: int, unfinished: bool
                ) -> set[tuple[int, int]] | None:
        steps, ended = self.episode_of(lane, seq)
        if not ended and not unfinished:
            return None
        if strategy == "future":
            return {(lane, s) for s in steps if s >= seq}
        if strategy == "final":
            return {(lane, max(steps))}
        if strategy == "episode":
            return {(lane, s) for s in steps}
        return {(ln, s) for ln in range(self.lanes) for s, _, _ in self.live(ln)}


def fill(buf: rb.ReplayBuffer, model: Model, steps: int, seed: int, p_end: float = 0.2,
         skip: float = 0.3) -> None:
    """Lanes step at different times (``env_ids``) and end episodes at random."""
    rng = np.random.default_rng(seed)
    lanes = model.lanes
    for _ in range(steps):
        ids = np.flatnonzero(rng.random(lanes) >= skip)
        if len(ids) == 0:
            continue
        seq = np.array([len(model.steps[i]) for i in ids])
        done = rng.random(len(ids)) < p_end
        term = done & (rng.random(len(ids)) < 0.5)
        buf.add(obs=obs(ids, seq), action=np.zeros((len(ids), 1), np.float32),
                reward=-np.ones(len(ids), np.float32), next_obs=obs(ids, seq + 1),
                terminated=term, truncated=done & ~term, env_ids=ids)
        for i, s, d in zip(ids, seq, done, strict=False):
            model.steps[i].append((int(s), model.episode[i], bool(d)))
            if d:
                model.episode[i] = model.next_id
                model.next_id += 1


def origin(goal: np.ndarray) -> tuple[int, int]:
    """The step a relabelled goal was taken from: its next achieved goal is [l, j + 1]."""
    return int(goal[0]), int(goal[1]) - 1


def buffer(capacity: int = 96, lanes: int = 3, seed: int = 0, **kwargs: Any
           ) -> tuple[rb.HerReplayBuffer, Model]:
    kwargs.setdefault("reward_fn", reward)
    buf = rb.HerReplayBuffer(capacity, num_envs=lanes, seed=seed, **kwargs)
    return buf, Model(lanes, capacity // lanes)


# ---------------------------------------------------------------- the episode index
def _index_oracle(link: np.ndarray, term: np.ndarray, trunc: np.ndarray,
                  written: np.ndarray, counts: np.ndarray, T: int  # noqa: N803
                  ) -> dict[tuple[int, int], tuple[int, int]]:
    out = {}
    for lane in range(link.shape[1]):
        w, c = int(written[lane]), int(counts[lane])
        begin, run = w - c, []
        for s in range(w - c, w):
            run.append(s)
            r = s % T
            end = bool(term[r, lane] or trunc[r, lane]) if s == w - 1 else link[r, lane] > 0
            if end:
                out.update({(x, lane): (begin, s) for x in run})
                begin, run = s + 1, []
        out.update({(x, lane): (begin, -1) for x in run})
    return out


@pytest.mark.parametrize("kernel", ["numpy", "numba"])
@pytest.mark.parametrize("seed", range(4))
def test_episode_index_matches_a_plain_loop(seed: int, kernel: str) -> None:
    """Synced at random moments (wrap-around, clears, discontinuities, lanes that write
    at different times), the index (vectorised numpy or the compiled loop) answers as a
    loop over the live steps does."""
    if kernel == "numba":
        pytest.importorskip("numba")
    rng = np.random.default_rng(seed)
    for _ in range(150):
        T, lanes = int(rng.integers(1, 9)), int(rng.integers(1, 4))  # noqa: N806
        link = np.zeros((T, lanes), np.int32)
        term, trunc = np.zeros((T, lanes), bool), np.zeros((T, lanes), bool)
        written, counts = np.zeros(lanes, np.int64), np.zeros(lanes, np.int64)
        idx, epoch = EpisodeIndex(T, lanes, prefer=kernel), 0
        for _ in range(int(rng.integers(1, 40))):
            for lane in range(lanes):
                for _ in range(int(rng.integers(0, 3))):
                    s, r = written[lane], written[lane] % T
                    if counts[lane]:  # relink the previous newest step
                        p = (s - 1) % T
                        keep = term[p, lane] or trunc[p, lane] or rng.random() < 0.1
                        link[p, lane] = int(keep)
                    d = rng.random()
                    term[r, lane], trunc[r, lane] = d < 0.15, 0.15 <= d < 0.25
                    link[r, lane] = 1
                    written[lane] += 1
                    counts[lane] = min(counts[lane] + 1, T)
            if rng.random() < 0.05:
                counts[:], link[:] = 0, 0
                epoch += 1
            if rng.random() < 0.6:
                idx.sync(link, term, trunc, written, counts, epoch)
                for (s, lane), want in _index_oracle(link, term, trunc, written, counts,
                                                     T).items():
                    got = idx.extents(np.array([s % T * lanes + lane]), np.array([lane]),
                                      written, counts)
                    assert (int(got[0][0]), int(got[1][0])) == want


# ---------------------------------------------------------------- goal choice
@pytest.mark.parametrize("strategy", ["future", "final", "episode", "random"])
@pytest.mark.parametrize("unfinished", [False, True])
def test_goals_come_from_the_exact_support(strategy: str, unfinished: bool) -> None:
    """Every relabelled goal is in the strategy's support (the plain-loop model, after the
    ring wrapped and with lanes of different lengths); a row is relabelled only when its
    episode ended (or with relabel_unfinished); each support is covered."""
    buf, model = buffer(strategy=strategy, relabel_unfinished=unfinished, k=3)
    fill(buf, model, 80, seed=1)  # 3 lanes x 32 rows: the ring has wrapped
    assert all(len(s) > model.T for s in model.steps)
    seen: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for _ in range(60):
        b = buf.sample(256)
        lane = b.indices % 3
        seq = b.indices // 3
        for i in range(256):
            key = (int(lane[i]), int(seq[i]))
            sup = model.support(strategy, *key, unfinished)
            if not b["relabeled"][i]:
                assert b.obs["desired_goal"][i].tolist() == GOAL.tolist()
                continue
            assert sup is not None, f"row of a running episode relabelled: {key}"
            got = origin(b.obs["desired_goal"][i])
            assert got in sup, (strategy, key, got, sup)
            seen.setdefault(key, set()).add(got)
    assert seen
    for key, goals in seen.items():
        sup = model.support(strategy, *key, unfinished)
        assert sup is not None
        if len(sup) <= 3:  # small supports are covered by now
            assert goals == sup, (key, goals, sup)


@settings(max_examples=40, deadline=None)
@given(lanes=st.integers(1, 4), rows=st.integers(1, 12), steps=st.integers(1, 60),
       p_end=st.floats(0.0, 1.0), skip=st.floats(0.0, 0.8), seed=st.integers(0, 2**16),
       strategy=st.sampled_from(["future", "final", "episode", "random"]),
       unfinished=st.booleans())
def test_goal_support_property(lanes: int, rows: int, steps: int, p_end: float,
                               skip: float, seed: int, strategy: str,
                               unfinished: bool) -> None:
    """Any sizes, write patterns and episode ends: every relabelled goal lies in the
    model's support, and only eligible rows are relabelled."""
    buf, model = buffer(capacity=rows * lanes, lanes=lanes, seed=seed, strategy=strategy,
                        relabel_unfinished=unfinished, k=3)
    fill(buf, model, steps, seed=seed, p_end=p_end, skip=skip)
    if len(buf) == 0:
        return
    for _ in range(3):
        b = buf.sample(64)
        for i in range(64):
            key = (int(b.indices[i] % lanes), int(b.indices[i] // lanes))
            sup = model.support(strategy, *key, unfinished)
            if b["relabeled"][i]:
                assert sup is not None and origin(b.obs["desired_goal"][i]) in sup
            else:
                assert b.obs["desired_goal"][i].tolist() == GOAL.tolist()


def test_unfinished_rows_keep_their_goal_by_default() -> None:
    buf, model = buffer(capacity=30, lanes=1, k=1000)
    fill(buf, model, 12, seed=3, p_end=0.0, skip=0.0)  # one running episode
    b = buf.sample(500)
    assert not b["relabeled"].any()
    assert np.all(b.obs["desired_goal"] == GOAL) and np.all(b.reward == -1)


@pytest.mark.statistical
@pytest.mark.parametrize("k", [1, 4])
def test_relabel_fraction_is_k_over_k_plus_1(k: int) -> None:
    buf, model = buffer(capacity=200, lanes=2, k=k)
    fill(buf, model, 60, seed=4, p_end=1.0, skip=0.0)  # every episode one step: all ended
    n = 200 * 256
    got = sum(int(buf.sample(256)["relabeled"].sum()) for _ in range(200)) / n
    p = k / (k + 1)
    assert abs(got - p) < 4 * np.sqrt(p * (1 - p) / n)


@pytest.mark.statistical
@pytest.mark.parametrize("strategy", ["future", "episode"])
def test_goal_draws_are_uniform_on_their_support(strategy: str) -> None:
    """One finished 8-step episode: from step 0, ``future`` and ``episode`` draw each of
    the 8 next achieved goals equally often (chi-square, 0.1% level)."""
    buf, _model = buffer(capacity=16, lanes=1, strategy=strategy, k=4)
    seq = np.arange(8)
    buf.extend(obs=obs(np.zeros((8, 1), int), seq[:, None]),
               action=np.zeros((8, 1, 1), np.float32), reward=-np.ones((8, 1), np.float32),
               next_obs=obs(np.zeros((8, 1), int), seq[:, None] + 1),
               terminated=np.zeros((8, 1), bool), truncated=(seq == 7)[:, None])
    counts: Counter[int] = Counter()
    for _ in range(400):
        b = buf.sample(256)
        rows = np.flatnonzero(b["relabeled"] & (b.indices == 0))
        counts.update(int(g) - 1 for g in b.obs["desired_goal"][rows, 1])
    assert set(counts) == set(range(8))
    n = sum(counts.values())
    chi2 = sum((counts[j] - n / 8) ** 2 / (n / 8) for j in range(8))
    assert chi2 < chi2_critical(7)


def test_final_strategy_after_the_ring_overwrote_the_start() -> None:
    """An episode whose first steps were overwritten: ``episode`` goals come only from its
    surviving steps; ``final`` is its last next observation."""
    for strategy, want in (("episode", set(range(4, 10))), ("final", {9})):
        buf, _ = buffer(capacity=6, lanes=1, strategy=strategy, k=1000)
        seq = np.arange(10)
        buf.extend(obs=obs(np.zeros((10, 1), int), seq[:, None]),
                   action=np.zeros((10, 1, 1), np.float32),
                   reward=-np.ones((10, 1), np.float32),
                   next_obs=obs(np.zeros((10, 1), int), seq[:, None] + 1),
                   terminated=np.zeros((10, 1), bool), truncated=(seq == 9)[:, None])
        goals = set()
        for _ in range(50):
            b = buf.sample(64)
            goals |= {origin(g)[1] for g in b.obs["desired_goal"][b["relabeled"]]}
        assert goals == want


# ---------------------------------------------------------------- rewards
def test_rewards_and_goals_of_relabelled_rows() -> None:
    buf, model = buffer()
    fill(buf, model, 60, seed=5)
    b = buf.sample(512)
    new = b["relabeled"]
    assert new.any() and (~new).any()
    np.testing.assert_array_equal(b.obs["desired_goal"], b.next_obs["desired_goal"])
    np.testing.assert_array_equal(
        b.reward[new], reward(b.next_obs["achieved_goal"][new], b.obs["desired_goal"][new], {}))
    assert np.all(b.reward[~new] == -1)  # stored
    assert b.reward.dtype == np.float32
    # some relabelled goals are the step's own next achieved goal: reward 0
    assert (b.reward[new] == 0).any()


def test_terminated_fn_decides_relabelled_terminations() -> None:
    buf, model = buffer(terminated_fn="test_her_reached")
    fill(buf, model, 60, seed=6, p_end=0.1)
    b = buf.sample(512)
    new = b["relabeled"]
    want = reached(b.next_obs["achieved_goal"][new], b.obs["desired_goal"][new], {})
    np.testing.assert_array_equal(b.terminated[new], want)
    assert want.any()


def _nstep_oracle(model: Model, lane: int, seq: int, goal: tuple[int, int], n: int,
                  gamma: float, stop_at_goal: bool) -> tuple[float, int]:
    """Relabelled n-step return and window length by a loop over the model's steps."""
    steps, _ = model.episode_of(lane, seq)
    live = {s: d for s, _, d in model.live(lane)}
    total, length = 0.0, 0
    for i in range(n):
        s = seq + i
        if s not in steps:
            break
        hit = (lane, s + 1) == (goal[0], goal[1] + 1)
        total += gamma ** i * (0.0 if hit else -1.0)
        length += 1
        if live[s] or s == len(model.steps[lane]) - 1 or (stop_at_goal and hit):
            break
    return total, length


@pytest.mark.parametrize("stop", [False, True])
def test_nstep_sums_relabelled_rewards(stop: bool) -> None:
    """With n_step=3 the relabelled reward of every window step enters the n-step sum; a
    terminated_fn cuts the window at the first relabelled success."""
    gamma = 0.9
    buf, model = buffer(n_step=3, gamma=gamma, terminated_fn=reached if stop else None)
    fill(buf, model, 70, seed=7, p_end=0.15)
    for _ in range(5):
        b = buf.sample(256)
        for i in np.flatnonzero(b["relabeled"]):
            lane, seq = int(b.indices[i] % 3), int(b.indices[i] // 3)
            goal = origin(b.obs["desired_goal"][i])
            want, length = _nstep_oracle(model, lane, seq, goal, 3, gamma, stop)
            assert b.reward[i] == pytest.approx(want, rel=1e-6)
            assert b["discount"][i] == pytest.approx(gamma ** length, rel=1e-6)
            assert b.next_obs["achieved_goal"][i].tolist() == [lane, seq + length]
            assert b.next_obs["desired_goal"][i].tolist() == b.obs["desired_goal"][i].tolist()
            if stop:
                assert bool(b.terminated[i]) == ((lane, seq + length - 1) == goal)


@pytest.mark.parametrize("stop", [False, True])
def test_nstep_functions_see_only_the_steps_of_the_windows(stop: bool) -> None:
    """Windows that end before ``n`` steps (at their episode's end): ``reward_fn`` and
    ``terminated_fn`` get the pairs of the window's steps only. They used to get the
    slots past the end too (here never written: achieved goal [0, 0]), so a function
    that gives NaN for a goal no step achieved failed every sample."""
    seen: list[np.ndarray] = []

    def strict(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
        seen.append(achieved.copy())  # a next achieved goal is [lane, seq + 1]: seq + 1 >= 1
        return np.where(achieved[:, 1] >= 1, reward(achieved, desired, info), np.nan)

    gamma = 0.9
    buf, model = buffer(capacity=300, n_step=3, gamma=gamma, reward_fn=strict,
                        terminated_fn=reached if stop else None, k=1000)
    fill(buf, model, 20, seed=8, p_end=0.3, skip=0.0)  # the ring has not wrapped
    b = buf.sample(256)
    assert seen and all((a[:, 1] >= 1).all() for a in seen)
    for i in np.flatnonzero(b["relabeled"]):
        lane, seq = int(b.indices[i] % 3), int(b.indices[i] // 3)
        want, length = _nstep_oracle(model, lane, seq, origin(b.obs["desired_goal"][i]), 3,
                                     gamma, stop)
        assert b.reward[i] == pytest.approx(want, rel=1e-6)
        assert b["discount"][i] == pytest.approx(gamma ** length, rel=1e-6)


def test_prioritized_her() -> None:
    buf, model = buffer(sampler=rb.PrioritizedSampler(alpha=1.0, beta=1.0))
    fill(buf, model, 60, seed=8)
    b = buf.sample(64)
    assert {"weights", "probabilities", "relabeled"} <= set(b.keys())
    new = b["relabeled"]
    np.testing.assert_array_equal(
        b.reward[new], reward(b.next_obs["achieved_goal"][new], b.obs["desired_goal"][new], {}))
    # priorities follow the learner's TD errors of the relabelled batch
    keys = b.indices[:1]
    assert buf.update_priorities(keys, np.array([1e6])) == 1
    hits = sum(int(np.sum(buf.sample(64).indices == keys[0])) for _ in range(20))
    assert hits > 20 * 64 * 0.5


# ---------------------------------------------------------------- state and config
def _same(a: rb.Batch, b: rb.Batch) -> bool:
    return set(a.keys()) == set(b.keys()) and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kwargs", [{}, {"n_step": 3}, {"strategy": "random"},
                                    {"sampler": "per"}, {"relabel_unfinished": True}])
def test_save_load_and_pickle_give_the_identical_next_sample(tmp_path: Any,
                                                             kwargs: dict[str, Any]) -> None:
    if kwargs.get("sampler") == "per":
        kwargs = {"sampler": rb.PrioritizedSampler()}
    buf, model = buffer(reward_fn="test_her_reward", **kwargs)
    fill(buf, model, 50, seed=9)
    buf.sample(32)
    rb.save(buf, tmp_path)
    clones = [rb.load(tmp_path), pickle.loads(pickle.dumps(buf)), copy.deepcopy(buf)]
    want = buf.sample(128)
    for other in clones:
        assert type(other) is rb.HerReplayBuffer
        assert _same(want, other.sample(128))


def test_memmap_resume_gives_the_identical_next_sample(tmp_path: Any) -> None:
    path = tmp_path / "buf"
    buf, model = buffer(storage="memmap", path=path)
    fill(buf, model, 50, seed=10)
    buf.sample(16)
    buf.flush()
    want = buf.sample(64)
    buf.close()
    # the reward function is a plain module function: the config names it by import path
    again = rb.open(path)
    assert _same(want, again.sample(64))
    fill(again, model, 5, seed=11)  # and it keeps writing
    assert len(again) == sum(len(model.live(i)) for i in range(3))


def test_config_names_the_functions() -> None:
    buf, _ = buffer(reward_fn="test_her_reward", terminated_fn=reached, strategy="episode",
                    k=2, n_step=2, gamma=0.5)
    cfg = buf.config().model_dump()
    assert cfg["reward_fn"] == "test_her_reward"
    assert cfg["terminated_fn"] == "test_her_reached"
    assert (cfg["strategy"], cfg["k"], cfg["n_step"], cfg["gamma"]) == ("episode", 2, 2, 0.5)
    again = rb.from_config(cfg)
    assert type(again) is rb.HerReplayBuffer and again.view.config() == buf.view.config()
    # as a plain dict, as a config file holds it
    built = rb.from_config({"type": "HerReplayBuffer", "capacity": 8,
                            "reward_fn": "tests.test_her:reward"})
    assert built.her.reward_fn is reward


def test_goal_keys_of_other_names(tmp_path: Any) -> None:
    """``achieved_key=``/``desired_key=`` (the fix the missing-key error names): goals are
    read from those keys, relabelled rewards computed from them, and the names survive a
    config and a checkpoint."""
    seen: list[Any] = []

    def dist(achieved: Any, desired: Any, info: Any) -> Any:
        seen.append(achieved)
        return -np.abs(achieved - desired).sum(-1)

    buf = rb.HerReplayBuffer(64, reward_fn=dist, seed=0, strategy="final", k=1_000_000,
                             achieved_key="pos", desired_key="target")
    for t in range(8):  # one episode: positions 0..7, target 5
        obs = {"state": np.full(1, t, np.float32), "pos": np.full(2, t, np.float32),
               "target": np.full(2, 5, np.float32)}
        nxt = {**obs, "state": obs["state"] + 1, "pos": obs["pos"] + 1}
        buf.add(obs=obs, action=0, reward=-1.0, next_obs=nxt, terminated=False,
                truncated=t == 7)
    b = buf.sample(16)
    assert b.relabeled.all() and len(seen) == 1
    assert (b.obs["target"] == 8).all() and (b.next_obs["target"] == 8).all()  # the final pos
    np.testing.assert_array_equal(b.reward, -np.abs(b.next_obs["pos"] - 8).sum(-1))
    cfg = buf.config().model_dump()
    assert (cfg["achieved_key"], cfg["desired_key"]) == ("pos", "target")
    assert rb.from_config(cfg, reward_fn=dist).view.config() == buf.view.config()
    rb.save(buf, tmp_path)
    again = rb.load(tmp_path, reward_fn=dist)
    assert _same(buf.sample(16), again.sample(16))
    with pytest.raises(rb.ShapeError, match="achieved_key="):  # the default names are absent
        fresh = rb.HerReplayBuffer(8, reward_fn=dist)
        fresh.add(obs={"pos": np.zeros(2, np.float32)}, action=0, reward=0.0,
                  next_obs={"pos": np.zeros(2, np.float32)}, terminated=False, truncated=False)


def test_an_unnamed_function_is_recorded_as_none_and_given_back_on_load(tmp_path: Any
                                                                        ) -> None:
    fn = lambda a, d, info: reward(a, d, info)  # noqa: E731
    buf, model = buffer(reward_fn=fn)
    assert buf.config().model_dump()["reward_fn"] is None
    fill(buf, model, 20, seed=12)
    rb.save(buf, tmp_path)
    with pytest.raises(rb.CheckpointError, match="reward_fn"):
        rb.load(tmp_path)
    again = rb.load(tmp_path, reward_fn=fn)
    assert _same(buf.sample(32), again.sample(32))


def test_her_view_composes_with_a_plain_replay_buffer() -> None:
    view = rb.HerView(reward, "future", k=4)
    buf = rb.ReplayBuffer(96, num_envs=3, seed=0, view=view)
    fill(buf, Model(3, 32), 40, seed=13)
    b = buf.sample(256)
    assert b["relabeled"].any()
    assert rb.ReplayBuffer(96, num_envs=3, view=rb.from_config(buf.config()).view).view \
        .config() == view.config()


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"strategy": "best"}, "strategy='best'"),
    ({"k": -1}, "k=-1"),
    ({"k": 1.5}, "k=1.5"),
    ({"reward_fn": None}, "reward_fn=None"),
    ({"reward_fn": "no_such_function"}, "no_such_function"),
    ({"reward_fn": "math:no_such"}, "cannot import"),
    ({"relabel_unfinished": "yes"}, "relabel_unfinished"),
    ({"n_step": 0}, "n=0"),
])
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    kwargs.setdefault("reward_fn", reward)
    with pytest.raises(rb.ConfigError, match=match):
        rb.HerReplayBuffer(8, **kwargs)


def test_observations_without_goals_and_bad_reward_functions() -> None:
    # observations without the goal keys are refused at the first add (once at the first
    # sample, after every add of a run had been stored), and by spec=; nothing is stored
    buf = rb.HerReplayBuffer(8, reward_fn=reward, seed=0)
    for obs in (np.zeros(2, np.float32), {"observation": np.zeros(2, np.float32),
                                          "achieved": np.zeros(1, np.float32),
                                          "desired_goal": np.zeros(1, np.float32)}):
        with pytest.raises(rb.ShapeError, match="achieved_goal"):
            buf.add(obs=obs, action=0, reward=0.0, next_obs=obs, terminated=True,
                    truncated=False)
        assert not buf.allocated and len(buf) == 0
    with pytest.raises(rb.ShapeError, match="'desired' key"):
        rb.ReplayBuffer(8, spec={"obs/achieved_goal": ((1,), "float32"),
                                 "obs/desired_goal": ((1,), "float32"),
                                 "action": ((), "int64")},
                        view=rb.HerView(reward, desired_key="desired"))
    flat = rb.ReplayBuffer(8, seed=0)  # swapped onto a buffer of flat observations
    flat.add(obs=np.zeros(2, np.float32), action=0, reward=0.0,
             next_obs=np.ones(2, np.float32), terminated=False, truncated=False)
    old = flat.view
    with pytest.raises(rb.ShapeError, match="achieved_goal"):
        flat.view = rb.HerView(reward)
    assert flat.view is old and flat.sample(4).obs.shape == (4, 2)
    bad, model = buffer(reward_fn=lambda a, d, info: np.zeros((len(a), 2)), k=1000)
    fill(bad, model, 30, seed=14, p_end=1.0)
    before = copy.deepcopy(bad.rng.bit_generator.state)
    with pytest.raises(rb.ShapeError, match="reward_fn returned shape"):
        bad.sample(8)
    assert bad.rng.bit_generator.state == before  # the failed call drew nothing


def goal_step(achieved: Any, desired: Any, reward: Any = -1.0) -> dict[str, Any]:
    """One step whose observations carry the given goals."""
    o = {"observation": np.zeros(2, np.float32), "achieved_goal": achieved,
         "desired_goal": desired}
    return dict(obs=o, action=0, reward=reward, next_obs=o, terminated=False,
                truncated=True)


@pytest.mark.parametrize(("goals", "reward_value", "error", "match"), [
    ((np.zeros(2), np.zeros(3)), -1.0, rb.ShapeError, r"shapes \(2,\) and \(3,\)"),
    ((np.zeros(2, np.float32), np.zeros(2, np.int64)), -1.0, rb.DtypeError,
     "int64 cannot hold float32"),
    ((np.zeros(2), np.zeros(2)), np.array([-1.0], np.float32), rb.ShapeError,
     r"reward: per-step shape \(1,\); expected one number per step"),
])
def test_fields_that_cannot_be_relabelled_are_refused_at_the_first_add(
        goals: tuple[np.ndarray, np.ndarray], reward_value: Any, error: type[Exception],
        match: str) -> None:
    """Goals of two shapes, float achieved goals with integer desired goals, or a reward
    of a per-step shape: refused by the first add (by ``spec=`` and a view swap too), with
    nothing stored. They used to be stored, then every sample failed with numpy's
    broadcast error, or relabelled goals 5.5 were served as 5 (with the reward of 5.5)."""
    buf = rb.HerReplayBuffer(8, reward_fn=reward, strategy="final", k=1000, seed=0)
    step = goal_step(*goals, reward=reward_value)
    with pytest.raises(error, match=match):
        buf.add(**step)
    assert not buf.allocated and len(buf) == 0
    spec = {"obs/observation": ((2,), "float32"),
            "obs/achieved_goal": (goals[0].shape, goals[0].dtype),
            "obs/desired_goal": (goals[1].shape, goals[1].dtype),
            "action": ((), "int64"),
            "reward": (np.shape(reward_value), "float32")}
    with pytest.raises(error, match=match):
        rb.HerReplayBuffer(8, reward_fn=reward, spec=spec)
    plain = rb.ReplayBuffer(8, seed=0)  # a HER view swapped onto such a buffer
    if np.shape(reward_value):  # (no buffer stores a reward of a per-step shape)
        with pytest.raises(error, match=match):
            plain.add(**step)
        return
    plain.add(**step)
    old = plain.view
    with pytest.raises(error, match=match):
        plain.view = rb.HerView(reward)
    assert plain.view is old and len(plain.sample(4).indices) == 4


def test_relabelled_rewards_are_those_of_the_goals_served() -> None:
    """Achieved goals stored as float64, desired goals as float32: a relabelled row's
    reward is ``reward_fn`` of the goal as the batch holds it (float32), so the batch
    agrees with itself (the float64 goal gave 113 of 412 rows reward 0 beside a goal
    that ``reward_fn`` finds not reached)."""
    buf = rb.HerReplayBuffer(64, reward_fn=reward, strategy="future", k=4, seed=0)
    for t in range(5):
        now, nxt = goal_step(np.array([0.1 * t]), np.array([9], np.float32)), \
            goal_step(np.array([0.1 * (t + 1)]), np.array([9], np.float32))
        buf.add(obs=now["obs"], action=0, reward=-1.0, next_obs=nxt["obs"],
                terminated=False, truncated=t == 4)
    b = buf.sample(512)
    new = b["relabeled"]
    assert b.obs["desired_goal"].dtype == np.float32 and new.sum() > 300
    want = reward(b.next_obs["achieved_goal"][new], b.obs["desired_goal"][new], {})
    np.testing.assert_array_equal(b.reward[new], want)
    assert 0 < (want == 0).sum() < new.sum()  # both reached and missed goals


@pytest.mark.parametrize("seed", range(3))
def test_compiled_goal_sources_match_the_numpy_oracle(seed: int) -> None:
    """Both kernels of ops.hindsight pick the same rows and goal steps from the same draws
    (buffers of several lanes after wrap-around, every strategy, both eligibility rules)."""
    numba_mod = pytest.importorskip("replaybank.ops.hindsight_numba")
    from replaybank.ops.hindsight import STRATEGY_CODES, goal_sources

    buf, model = buffer(capacity=60, lanes=3, seed=seed)
    fill(buf, model, 70, seed=seed)
    t = buf.table
    idx = buf.view.episode_index(t)
    rng = np.random.default_rng(seed)
    for code in STRATEGY_CODES.values():
        for unfinished in (False, True):
            keys = buf.sample(200).indices
            u = rng.random(400)
            args = (keys, u, 0.7, idx.end, idx.begin, t.written, t.counts,
                    t.flat(t.link), t.T, t.lanes, code, unfinished)
            for want, got in zip(goal_sources(*args), numba_mod.goal_sources(*args),
                                 strict=True):
                np.testing.assert_array_equal(want, got)
