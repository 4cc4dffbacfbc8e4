"""Rows buffers (``ReplayBuffer(next_obs=False)``): every key an ordinary stored field.

The windows of ``sample_sequences`` are compared with a plain-Python model of the lanes
(a list of rows per lane, the newest ``capacity // num_envs`` kept) over random sequences
of ``add`` / ``extend`` calls with and without ``env_ids`` (hypothesis), and every way of
saving a buffer (state dict, ``rb.save``/``rb.load``, memmap ``flush``/``open``, pickle)
must restore the identical next sample.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.errors import CheckpointError, ConfigError, EmptyBufferError, SpecError
from replaybank.views.transition import TransitionView

# ---------------------------------------------------------------------- the model


class Model:
    """Per lane, the rows written so far (sequence number = position in the list)."""

    def __init__(self, T: int, lanes: int) -> None:  # noqa: N803
        self.T = T
        self.lanes = [list[dict[str, Any]]() for _ in range(lanes)]

    def write(self, lane: int, row: dict[str, Any]) -> None:
        self.lanes[lane].append(row)

    def live(self, lane: int) -> tuple[int, int]:
        """``[oldest, written)`` sequence numbers of the lane's live rows."""
        w = len(self.lanes[lane])
        return max(0, w - self.T), w

    def done(self, lane: int, seq: int) -> bool:
        r = self.lanes[lane][seq]
        return bool(r["terminated"] or r["truncated"])

    def valid_start(self, lane: int, seq: int, width: int, cross: bool) -> bool:
        lo, hi = self.live(lane)
        if not lo <= seq or seq + width > hi:
            return False
        return cross or not any(self.done(lane, s) for s in range(seq, seq + width - 1))

    def window(self, lane: int, seq: int, width: int) -> dict[str, np.ndarray]:
        rows = self.lanes[lane][seq:seq + width]
        lo, _ = self.live(lane)
        first = [(s == lo) or self.done(lane, s - 1) for s in range(seq, seq + width)]
        return {
            "x": np.array([r["x"] for r in rows]),
            "y": np.array([r["y"] for r in rows]),
            "terminated": np.array([r["terminated"] for r in rows]),
            "truncated": np.array([r["truncated"] for r in rows]),
            "is_first": np.array(first),
            "is_last": np.array([r["terminated"] or r["truncated"] for r in rows]),
            "is_terminal": np.array([r["terminated"] for r in rows]),
        }


# one call: (kind, lanes written or None for all, steps, seed of its values, flags given)
CALL = st.tuples(st.sampled_from(["add", "extend"]), st.none() | st.integers(0, 7),
                 st.integers(1, 6), st.integers(0, 2**16), st.booleans())


def _apply(buf: rb.ReplayBuffer, model: Model, call: tuple[Any, ...], counter: list[int]
           ) -> None:
    kind, pick, n, seed, flags = call
    lanes = buf.num_envs
    rng = np.random.default_rng(seed)
    if pick is None:
        ids = list(range(lanes))
        env_ids = None
    else:
        ids = sorted({pick % lanes, (pick * 7 + 1) % lanes})
        env_ids = ids
    n = n if kind == "extend" else 1
    m = len(ids)
    x = np.arange(counter[0], counter[0] + n * m, dtype=np.int64).reshape(n, m)
    counter[0] += n * m
    y = rng.random((n, m, 2)).astype(np.float32)
    term = rng.random((n, m)) < 0.2 if flags else np.zeros((n, m), bool)
    trunc = rng.random((n, m)) < 0.1 if flags else np.zeros((n, m), bool)
    values: dict[str, Any] = {"x": x, "y": y}
    if flags:
        values.update(terminated=term, truncated=trunc)
    if kind == "add":
        values = {k: v[0] for k, v in values.items()}
        if env_ids is None and lanes == 1:
            values = {k: v[0] for k, v in values.items()}
        buf.add(env_ids=env_ids, **values)
    else:
        if env_ids is None and lanes == 1:
            values = {k: v[:, 0] for k, v in values.items()}
        buf.extend(env_ids=env_ids, **values)
    for i in range(n):
        for j, lane in enumerate(ids):
            model.write(lane, {"x": int(x[i, j]), "y": y[i, j], "terminated": bool(term[i, j]),
                               "truncated": bool(trunc[i, j])})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lanes=st.integers(1, 3), T=st.integers(2, 6), calls=st.lists(CALL, min_size=1,
                                                                        max_size=12),
       width=st.integers(1, 6), cross=st.booleans(), seed=st.integers(0, 1000))
def test_windows_match_the_model(lanes: int, T: int, calls: list[Any], width: int,  # noqa: N803
                                 cross: bool, seed: int) -> None:
    """Section: sample_sequences over rows: every window holds the model's rows of one
    lane, never crosses the write head, stops at episode ends with "stop", and the
    flags are the model's."""
    buf = rb.ReplayBuffer(T * lanes, num_envs=lanes, next_obs=False, seed=seed)
    model = Model(T, lanes)
    counter = [0]
    for call in calls:
        _apply(buf, model, call, counter)
    assert len(buf) == sum(min(len(rows), T) for rows in model.lanes)
    width = min(width, T)
    valid = [(lane, s) for lane in range(lanes) for s in range(len(model.lanes[lane]))
             if model.valid_start(lane, s, width, cross)]
    mode = "cross" if cross else "stop"
    if not valid:
        with pytest.raises(EmptyBufferError):
            buf.sample_sequences(4, width, episode_boundary=mode)
        return
    sb = buf.sample_sequences(8, width, episode_boundary=mode)
    assert "next_obs" not in sb and "next_x" not in sb
    assert sb["x"].shape == (8, width) and sb["y"].shape == (8, width, 2)
    assert sb.mask.all()
    for b, key in enumerate(sb.starts.tolist()):
        lane, seq = key % lanes, key // lanes
        assert (lane, seq) in valid
        want = model.window(lane, seq, width)
        for name, value in want.items():
            np.testing.assert_array_equal(np.asarray(sb[name][b]), value, err_msg=name)
    # one-step samples are stored rows too
    batch = buf.sample(16)
    for b, key in enumerate(batch.indices.tolist()):
        row = model.lanes[key % lanes][key // lanes]
        assert int(batch["x"][b]) == row["x"]
        assert bool(batch.terminated[b]) == row["terminated"]


# ---------------------------------------------------------------------- plain fields


def _world_model_rows(buf: rb.ReplayBuffer, steps: int, seed: int = 0) -> None:
    """Rows as a world-model agent writes them: obs, action, reward, first/terminal."""
    rng = np.random.default_rng(seed)
    n = buf.num_envs
    first = np.ones(n, bool)
    for _ in range(steps):
        end = rng.random(n) < 0.1
        buf.add(obs=rng.random((n, 3)).astype(np.float32), action=rng.integers(0, 2, n),
                reward=rng.random(n).astype(np.float32), first=first.copy(),
                terminal=end, terminated=end)
        first = end


def test_every_key_is_an_ordinary_field() -> None:
    """Section: next_obs=False: obs is just a field, next_obs is a field, no action or
    reward is required, terminated/truncated default to False."""
    buf = rb.ReplayBuffer(16, next_obs=False, seed=0)
    buf.add(obs=np.ones(2, np.float32), next_obs=np.zeros(2, np.float32))
    buf.add(obs=np.full(2, 2, np.float32), next_obs=np.full(2, 5, np.float32))
    assert sorted(buf.spec) == ["next_obs", "obs", "terminated", "truncated"]
    assert buf.table.obs_fields == []
    b = buf.sample_sequences(1, 2, episode_boundary="cross")
    assert b.obs[0, :, 0].tolist() == [1.0, 2.0]
    assert b.next_obs[0, :, 0].tolist() == [0.0, 5.0]  # stored, not derived
    assert not b.terminated.any() and not b.truncated.any()
    only = rb.ReplayBuffer(8, next_obs=False)
    only.add(h=np.zeros(4, np.float32))
    assert sorted(only.spec) == ["h", "terminated", "truncated"]
    assert "reward" not in only.spec and "action" not in only.spec


def test_flags_may_be_left_out_of_any_call() -> None:
    buf = rb.ReplayBuffer(16, next_obs=False, seed=0)
    buf.add(x=1, terminated=True)
    buf.add(x=2)
    buf.extend(x=np.array([3, 4]), truncated=np.array([False, True]))
    seq = buf.sample_sequences(1, 4, episode_boundary="cross")
    assert seq["x"][0].tolist() == [1, 2, 3, 4]
    assert seq.terminated[0].tolist() == [True, False, False, False]
    assert seq.truncated[0].tolist() == [False, False, False, True]
    assert seq.is_first[0].tolist() == [True, True, False, False]
    stop = buf.sample_sequences(1, 3, episode_boundary="stop")  # ends at most at its end
    assert stop["x"][0].tolist() == [2, 3, 4]
    with pytest.raises(EmptyBufferError):  # the one 4-step window runs past an end
        buf.sample_sequences(1, 4, episode_boundary="stop")


def test_wrong_field_set_names_the_difference() -> None:
    buf = rb.ReplayBuffer(8, next_obs=False)
    buf.add(a=1.0, b=2.0)
    with pytest.raises(SpecError, match=r"missing \['b'\]; unknown \['c'\]"):
        buf.add(a=1.0, c=2.0)
    assert len(buf) == 1


@pytest.mark.parametrize("name", ["done", "is_first", "is_terminal", "mask", "starts"])
def test_reserved_names_are_refused_with_the_fix(name: str) -> None:
    buf = rb.ReplayBuffer(8, next_obs=False)
    with pytest.raises(SpecError, match="prefix"):
        buf.add(**{name: True})
    buf.add(user={name: True})  # nested under a prefix: an ordinary field
    assert f"user/{name}" in buf.spec


@pytest.mark.parametrize("kwargs", [dict(frame_stack=2), dict(n_step=3),
                                    dict(view=TransitionView()),
                                    dict(autoreset_mode="next_step"),
                                    dict(next_obs=0)])
def test_options_that_need_next_obs_are_refused(kwargs: dict[str, Any]) -> None:
    kwargs = {"next_obs": False, **kwargs}
    with pytest.raises(ConfigError, match="next_obs"):
        rb.ReplayBuffer(8, **kwargs)


def test_autoreset_check_is_skipped() -> None:
    """Rows with reward 0 and repeated values after an episode end look like NEXT_STEP
    reset steps to a transition buffer; a rows buffer has no next obs and never warns."""
    buf = rb.ReplayBuffer(64, next_obs=False, seed=0)
    for t in range(20):
        buf.add(obs=np.zeros(2, np.float32), reward=0.0, terminated=t % 5 == 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(4):
            buf.sample(8)


def test_spec_given_up_front() -> None:
    buf = rb.ReplayBuffer(8, next_obs=False, spec={"x": ((2,), "float32")})
    assert sorted(buf.spec) == ["terminated", "truncated", "x"]
    buf.add(x=[1.0, 2.0])
    assert buf.sample(1)["x"].dtype == np.float32


def test_prioritized_and_lane_split_samplers() -> None:
    pri = rb.ReplayBuffer(32, next_obs=False, sampler=rb.PrioritizedSampler(), seed=0)
    _world_model_rows(pri, 20)
    sb = pri.sample_sequences(4, 3, episode_boundary="cross")
    assert pri.update_sequence_priorities(sb.starts, np.ones((4, 3))) == 4
    split = rb.ReplayBuffer(32, num_envs=4, next_obs=False, lane_split="random", seed=0)
    _world_model_rows(split, 8)
    assert split.sample_sequences(6, 5, episode_boundary="cross")["obs"].shape == (6, 5, 3)


# ---------------------------------------------------------------------- save / load


def _same(a: Any, b: Any) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def _next_samples(buf: Any) -> list[Any]:
    return [buf.sample_sequences(5, 4, episode_boundary="cross"),
            buf.sample_sequences(3, 2, episode_boundary="stop"), buf.sample(7)]


def _filled(**kwargs: Any) -> rb.ReplayBuffer:
    # 1000 steps over 2 lanes of 300 rows with ~10% episode ends: the side store grows
    buf = rb.ReplayBuffer(600, num_envs=2, next_obs=False, seed=3, **kwargs)
    _world_model_rows(buf, 500)
    return buf


def test_state_dict_round_trip_is_identical() -> None:
    buf = _filled()
    assert buf.table.side_capacity > 64  # grew past its first allocation
    twin = rb.ReplayBuffer(600, num_envs=2, next_obs=False)
    twin.load_state_dict(buf.state_dict())
    for x, y in zip(_next_samples(buf), _next_samples(twin), strict=True):
        _same(x, y)
    _world_model_rows(buf, 30, seed=5)  # later adds match too (side slots in order)
    _world_model_rows(twin, 30, seed=5)
    for x, y in zip(_next_samples(buf), _next_samples(twin), strict=True):
        _same(x, y)


def test_save_load_and_config(tmp_path: Path) -> None:
    buf = _filled()
    rb.save(buf, tmp_path / "ck")
    again = rb.load(tmp_path / "ck")
    assert again.rows_only and again.config() == buf.config()
    for x, y in zip(_next_samples(buf), _next_samples(again), strict=True):
        _same(x, y)
    cfg = buf.config()
    assert cfg.model_dump()["next_obs"] is False
    empty = rb.from_config(cfg)
    assert empty.rows_only and len(empty) == 0 and empty.spec == buf.spec
    assert rb.ReplayBuffer(8).config().model_dump()["next_obs"] is True


def test_pickle_round_trip() -> None:
    buf = _filled()
    twin = pickle.loads(pickle.dumps(buf))
    for x, y in zip(_next_samples(buf), _next_samples(twin), strict=True):
        _same(x, y)


def test_memmap_flush_and_open(tmp_path: Path) -> None:
    buf = _filled(storage="memmap", path=tmp_path / "mm")
    buf.flush()
    want = _next_samples(buf)
    buf.close()
    again = rb.open(tmp_path / "mm")
    assert again.rows_only and len(again) == 600
    for x, y in zip(want, _next_samples(again), strict=True):
        _same(x, y)
    _world_model_rows(again, 10)  # keeps writing (the side array grows with its file)
    assert len(again) == 600


def test_states_do_not_cross_between_kinds() -> None:
    rows = _filled()
    plain = rb.ReplayBuffer(600, num_envs=2)
    with pytest.raises(CheckpointError, match="next_obs=False"):
        plain.load_state_dict(rows.state_dict())
    src = rb.ReplayBuffer(600, num_envs=2)
    src.add(obs=np.zeros((2, 1), np.float32), action=[0, 0], reward=[0.0, 0.0],
            next_obs=np.ones((2, 1), np.float32), terminated=[False, False],
            truncated=[False, False])
    target = rb.ReplayBuffer(600, num_envs=2, next_obs=False)
    with pytest.raises(CheckpointError, match="next_obs=True"):
        target.load_state_dict(src.state_dict())
    assert len(target) == 0


def test_damaged_rows_state_is_refused_and_changes_nothing() -> None:
    buf = _filled()
    state = buf.state_dict()
    table = dict(state["table"])
    table["meta/link"] = np.zeros_like(table["meta/link"])  # newest steps lose their slot
    twin = rb.ReplayBuffer(600, num_envs=2, next_obs=False)
    with pytest.raises(CheckpointError, match="meta/link"):
        twin.load_state_dict({**state, "table": table})
    assert len(twin) == 0
