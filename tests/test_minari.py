"""Minari in and out: datasets recorded with Minari's own DataCollector on CartPole, Pendulum
and the goal-conditioned BitFlipping env, loaded with ``from_minari`` into uniform (1 and 2
lanes), sequence and hindsight buffers, and written back with ``to_minari``; the round trip
Minari -> buffer -> Minari is checked step by step, episode by episode."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("gymnasium")
minari = pytest.importorskip("minari")
pytest.importorskip("h5py")

import gymnasium as gym  # noqa: E402

import replaybank as rb  # noqa: E402
from replaybank.envs import BIT_FLIPPING_ID, compute_reward  # noqa: E402
from replaybank.errors import ConfigError, EmptyBufferError, SpecError  # noqa: E402
from replaybank.integrations.minari import from_minari, to_minari  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _datasets_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every dataset of this module lives in a temporary MINARI_DATASETS_PATH."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINARI_DATASETS_PATH", str(tmp_path_factory.mktemp("minari")))
        yield


_IDS = iter(range(10_000))


def _new_id(name: str) -> str:
    return f"test/{name}-{next(_IDS)}-v0"


def _record(env_id: str, episodes: int, max_episode_steps: int, seed: int,
            **env_kwargs: Any) -> Any:
    """A dataset of ``episodes`` random-policy episodes recorded with DataCollector."""
    env = minari.DataCollector(gym.make(env_id, max_episode_steps=max_episode_steps,
                                        **env_kwargs))
    env.action_space.seed(seed)
    for i in range(episodes):
        env.reset(seed=seed + i)
        done = False
        while not done:
            *_, term, trunc, _ = env.step(env.action_space.sample())
            done = bool(term or trunc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # author, code_permalink, ... not set
        ds = env.create_dataset(_new_id(env_id.split("/")[-1]), algorithm_name="random")
    env.close()
    return ds


@pytest.fixture(scope="module")
def cartpole() -> Any:
    # random CartPole episodes last ~22 steps: at most 15, some terminate, some truncate
    ds = _record("CartPole-v1", episodes=9, max_episode_steps=15, seed=3)
    flags = [(ep.terminations[-1], ep.truncations[-1]) for ep in ds.iterate_episodes()]
    assert any(t for t, _ in flags) and any(tr for _, tr in flags)
    return ds


@pytest.fixture(scope="module")
def pendulum() -> Any:
    return _record("Pendulum-v1", episodes=5, max_episode_steps=11, seed=7)


@pytest.fixture(scope="module")
def bitflip() -> Any:
    # 5 bits, 7 steps at most: random flips reach the goal (terminated) or run out (truncated)
    return _record(BIT_FLIPPING_ID, episodes=12, max_episode_steps=7, seed=1, n_bits=5)


def _write(buf: Any, ds: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_minari(buf, _new_id("copy"), env=ds.env_spec,
                         observation_space=ds.observation_space,
                         action_space=ds.action_space, **kwargs)


def _assert_tree_equal(a: Any, b: Any, what: str, dtypes: bool) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), what
        for k in a:
            _assert_tree_equal(a[k], b[k], f"{what}/{k}", dtypes)
        return
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_array_equal(a, b, err_msg=what)
    if dtypes:
        assert a.dtype == b.dtype, (what, a.dtype, b.dtype)


def _assert_same_episodes(expected: list[Any], actual: Any, dtypes: bool = True) -> None:
    got = list(actual.iterate_episodes())
    assert len(got) == len(expected)
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        assert len(g) == len(e), i
        assert len(g.rewards) + 1 == len(np.asarray(
            g.observations if not isinstance(g.observations, dict)
            else next(iter(g.observations.values()))))
        for name in ("observations", "actions", "rewards", "terminations", "truncations"):
            _assert_tree_equal(getattr(e, name), getattr(g, name), f"episode {i} {name}",
                               dtypes)


@pytest.mark.parametrize("num_envs", [1, 2])
@pytest.mark.parametrize("name", ["cartpole", "pendulum"])
def test_round_trip_step_by_step(name: str, num_envs: int, request: pytest.FixtureRequest
                                 ) -> None:
    ds = request.getfixturevalue(name)
    buf = from_minari(ds, num_envs=num_envs, seed=0)
    assert isinstance(buf, rb.ReplayBuffer) and buf.num_envs == num_envs
    assert len(buf) == ds.total_steps and buf.episodes_seen == ds.total_episodes
    out = _write(buf, ds)
    _assert_same_episodes(list(ds.iterate_episodes()), out)
    assert out.total_steps == ds.total_steps
    # and once more: the written dataset loads into the same buffer contents
    _assert_same_episodes(list(ds.iterate_episodes()), _write(from_minari(out), out))


def test_transitions_pair_each_step_with_its_own_next_observation(cartpole: Any) -> None:
    buf = from_minari(cartpole, num_envs=2, seed=0)
    steps = {}
    for ep in cartpole.iterate_episodes():
        for t in range(len(ep)):
            steps[ep.observations[t].tobytes()] = (ep.observations[t + 1], ep.actions[t],
                                                   ep.terminations[t], ep.truncations[t])
    b = buf.sample(256)
    for i in range(256):
        nxt, act, term, trunc = steps[b.obs[i].tobytes()]
        np.testing.assert_array_equal(b.next_obs[i], nxt)  # the true final obs at the end
        assert (b.action[i], b.terminated[i], b.truncated[i]) == (act, term, trunc)


def test_lanes_get_episodes_round_robin(cartpole: Any) -> None:
    buf = from_minari(cartpole, num_envs=3)
    lengths = [len(ep) for ep in cartpole.iterate_episodes()]
    counts = buf.table.counts.tolist()
    assert counts == [sum(lengths[lane::3]) for lane in range(3)]
    assert buf.capacity == 3 * max(counts)


def test_sequences_never_cross_an_episode(cartpole: Any) -> None:
    seq = rb.SequenceReplayBuffer(cartpole.total_steps, sequence_length=4,
                                  episode_boundary="stop", strict=True, seed=0)
    assert from_minari(cartpole, seq) is seq
    b = seq.sample(128)
    assert b.mask.all()
    # inside a window every step continues from the one before, and only the last may end
    np.testing.assert_array_equal(b.obs[:, 1:], b.next_obs[:, :-1])
    assert not (b.terminated[:, :-1] | b.truncated[:, :-1]).any()
    # rewards were inferred as float32 (the buffer's rule); the values are the dataset's
    _assert_same_episodes(list(cartpole.iterate_episodes()), _write(seq, cartpole),
                          dtypes=False)


def test_her_buffer_from_a_goal_conditioned_dataset(bitflip: Any) -> None:
    her = rb.HerReplayBuffer(2 * bitflip.total_steps, num_envs=2, reward_fn=compute_reward,
                             strategy="future", k=4, seed=0)
    from_minari(bitflip, her)
    assert sorted(her.spec) == ["action", "obs/achieved_goal", "obs/desired_goal",
                                "obs/observation", "reward", "terminated", "truncated"]
    b = her.sample(256)
    # relabelled rewards are the env's reward of the new goal
    np.testing.assert_array_equal(
        b.reward, compute_reward(b.next_obs["achieved_goal"], b.obs["desired_goal"]))
    assert b["relabeled"].any()
    _assert_same_episodes(list(bitflip.iterate_episodes()), _write(her, bitflip),
                          dtypes=False)


def test_only_complete_episodes_are_written(cartpole: Any) -> None:
    eps = list(cartpole.iterate_episodes())
    lengths = [len(ep) for ep in eps]
    keep = sum(lengths[-3:])
    # a ring holding the last 3 episodes and 2 steps of the one before: that one is partial
    buf = from_minari(cartpole, capacity=keep + 2)
    assert len(buf) == keep + 2
    _assert_same_episodes(eps[-3:], _write(buf, cartpole))
    # a running episode (no flag yet) at the end is not written either (the step it
    # evicts belongs to the partial episode)
    first = eps[0]
    buf.add(obs=first.observations[0], action=first.actions[0], reward=1.0,
            next_obs=first.observations[1], terminated=False, truncated=False)
    _assert_same_episodes(eps[-3:], _write(buf, cartpole))
    # one more evicts the last partial step: the oldest stored step now starts an episode,
    # but nothing stored says so (the step that ended the episode before is gone), so that
    # episode is left out too
    buf.add(obs=first.observations[1], action=first.actions[1], reward=1.0,
            next_obs=first.observations[2], terminated=False, truncated=False)
    _assert_same_episodes(eps[-2:], _write(buf, cartpole))


@pytest.mark.parametrize("num_envs", [1, 2])
def test_a_cleared_buffer_writes_the_episodes_added_after_the_clear(
        cartpole: Any, num_envs: int) -> None:
    """After ``clear()`` a lane's first step starts an episode, as in a fresh buffer (the
    steps before it do not exist): every complete episode added after the clear is written
    (before, the first of each lane was taken for the remains of an evicted one)."""
    eps = list(cartpole.iterate_episodes())
    buf = from_minari(cartpole, num_envs=num_envs, seed=0)
    buf.clear()
    for i, ep in enumerate(eps):  # the same episodes again, each to its round-robin lane
        kw = {"env_ids": [i % num_envs]} if num_envs > 1 else {}
        lead = (slice(None), None) if num_envs > 1 else (slice(None),)
        buf.extend(obs=ep.observations[:-1][lead], action=ep.actions[lead],
                   reward=ep.rewards[lead], next_obs=ep.observations[1:][lead],
                   terminated=ep.terminations[lead], truncated=ep.truncations[lead],
                   **kw)
    assert len(buf) == cartpole.total_steps
    _assert_same_episodes(eps, _write(buf, cartpole))


def test_episode_indices_and_reward_dtype(pendulum: Any) -> None:
    buf = from_minari(pendulum, episode_indices=[3, 1], reward_dtype=np.float32)
    assert buf.spec["reward"].dtype == np.float32
    eps = list(pendulum.iterate_episodes([3, 1]))
    assert len(buf) == sum(len(ep) for ep in eps)
    out = _write(buf, pendulum)
    got = list(out.iterate_episodes())
    for e, g in zip(eps, got, strict=True):
        np.testing.assert_array_equal(e.observations, g.observations)
        np.testing.assert_array_equal(g.rewards, e.rewards.astype(np.float32))


def test_load_by_id(pendulum: Any) -> None:
    assert len(from_minari(pendulum.id)) == pendulum.total_steps


def test_errors_are_clear(cartpole: Any) -> None:
    wrong = rb.ReplayBuffer(100, spec={"obs": ((3,), "float32"), "action": ((), "int64")})
    with pytest.raises(SpecError, match=r"'obs' has shape \(3,\) in the buffer but \(4,\)"):
        from_minari(cartpole, wrong)
    assert len(wrong) == 0
    extra = rb.ReplayBuffer(100, spec={"obs": ((4,), "float32"), "action": ((), "int64"),
                                       "log_prob": ((), "float32")})
    with pytest.raises(SpecError, match="not in the dataset: \\['log_prob'\\]"):
        from_minari(cartpole, extra)
    ints = rb.ReplayBuffer(100, spec={"obs": ((4,), "int32"), "action": ((), "int64")})
    with pytest.raises(SpecError, match="holds float32 values but the buffer stores int32"):
        from_minari(cartpole, ints)
    with pytest.raises(ConfigError, match="the buffer has 1 lanes"):
        from_minari(cartpole, rb.ReplayBuffer(100), num_envs=2)
    with pytest.raises(ConfigError, match=r"capacity=\.\.\.\): these build a new buffer"):
        from_minari(cartpole, rb.ReplayBuffer(100), capacity=10)
    with pytest.raises(ConfigError, match="MinariDataset or the id"):
        from_minari(object())
    with pytest.raises(ConfigError, match="num_envs=0"):
        from_minari(cartpole, num_envs=0)
    buf = from_minari(cartpole)
    with pytest.raises(ConfigError, match="pass the env"):
        to_minari(buf, _new_id("no-env"))
    with pytest.raises(SpecError, match="'obs' has shape \\(4,\\) in the buffer but \\(3,\\)"):
        to_minari(buf, _new_id("pendulum-spaces"), env="Pendulum-v1")
    rows = rb.ReplayBuffer(16, next_obs=False)
    rows.add(obs=np.zeros(4, np.float32), action=0)
    with pytest.raises(SpecError, match="stores rows"):
        to_minari(rows, _new_id("rows"), env="CartPole-v1")


def test_bad_ids_indices_and_empty_buffers_are_refused_before_anything_is_written(
        cartpole: Any) -> None:
    """Minari's own errors for these were a bare TypeError (an id without a version), an
    h5py KeyError (an episode the dataset does not hold), a hint to a ``download=True``
    that ``from_minari`` does not take, and an empty dataset written from a buffer with no
    complete episode (Minari's ``sample_episodes`` then fails on it)."""
    root = os.environ["MINARI_DATASETS_PATH"]
    before = sorted(os.walk(root))
    buf = from_minari(cartpole)
    for bad in ("test/no-version", "../outside-v0", "test/a b-v0", 3):
        with pytest.raises(ConfigError, match=r"to_minari\(dataset_id=.*not a Minari "
                                              r"dataset id.*name-vN"):
            to_minari(buf, bad, env="CartPole-v1")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=rf"dataset_id='{cartpole.id}'.*exists.*delete_dataset"):
        to_minari(buf, cartpole.id, env="CartPole-v1")
    with pytest.raises(ConfigError, match=r"no-version.*not a Minari dataset id"):
        from_minari("test/no-version")
    with pytest.raises(ConfigError, match=r"test/absent-v0.*no such dataset.*download_dataset"):
        from_minari("test/absent-v0")
    held = cartpole.total_episodes
    for bad_ids in ([held], [-1], [0, held + 5]):
        with pytest.raises(ConfigError, match=f"episode {bad_ids[-1]} is not in the dataset, "
                                              f"which holds ids 0..{held - 1}"):
            from_minari(cartpole, episode_indices=bad_ids)
    for bad_ids in ([0.5], [[0, 1]], ["0"]):
        with pytest.raises(ConfigError, match="episode ids are ints"):
            from_minari(cartpole, episode_indices=bad_ids)  # type: ignore[list-item]
    given = rb.ReplayBuffer(100, spec={"obs": ((4,), "float32"), "action": ((), "int64")})
    with pytest.raises(ConfigError, match=f"episode {held} is not in the dataset"):
        from_minari(cartpole, given, episode_indices=[0, held])
    assert len(given) == 0
    empty = rb.ReplayBuffer(100, spec={"obs": ((4,), "float32"), "action": ((), "int64")})
    empty.add(obs=np.zeros(4, np.float32), action=0, reward=1.0,
              next_obs=np.ones(4, np.float32), terminated=False, truncated=False)
    with pytest.raises(EmptyBufferError, match=r"no complete episode \(1 steps stored"):
        to_minari(empty, _new_id("empty"), env="CartPole-v1")
    assert sorted(os.walk(root)) == before  # nothing written, nothing created


def test_nothing_written_outside_the_temporary_path() -> None:
    assert os.environ["MINARI_DATASETS_PATH"].startswith(os.path.realpath("/tmp")) or \
        "minari" in os.environ["MINARI_DATASETS_PATH"]
