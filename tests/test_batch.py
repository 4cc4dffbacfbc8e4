"""Typed standard fields of Batch and SequenceBatch, through the public API."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import numpy as np
import pytest

import replaybank as rb
from replaybank.samplers.prioritized import PrioritizedSampler

BATCH_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "done",
                "indices", "weights", "probabilities", "discount")
SEQUENCE_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "done",
                   "mask", "is_first", "is_last", "is_terminal", "burn_in", "starts",
                   "indices", "weights", "probabilities")


def _fill(buf: rb.ReplayBuffer, steps: int = 20, **extras: object) -> None:
    for t in range(steps):
        buf.add(obs=np.full(3, t, np.float32), action=t % 2, reward=float(t),
                next_obs=np.full(3, t + 1, np.float32), terminated=t % 7 == 6,
                truncated=t % 11 == 10, **extras)


@pytest.fixture
def uniform_buf() -> rb.ReplayBuffer:
    buf = rb.ReplayBuffer(capacity=64, seed=0)
    _fill(buf, log_prob=np.float32(-1.0))
    return buf


@pytest.fixture
def per_buf() -> rb.ReplayBuffer:
    buf = rb.ReplayBuffer(capacity=64, sampler=PrioritizedSampler(), seed=0)
    _fill(buf)
    return buf


def test_typed_fields_are_the_mapping_values(uniform_buf: rb.ReplayBuffer) -> None:
    b = uniform_buf.sample(5)
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "indices"):
        assert getattr(b, name) is b[name], name
    assert b.obs.shape == (5, 3) and b.reward.shape == (5,) and b.indices.dtype == np.int64
    np.testing.assert_array_equal(b.done, b["terminated"] | b["truncated"])
    np.testing.assert_array_equal(b.next_obs[:, 0], b.obs[:, 0] + 1)
    # extras: mapping and (untyped) attribute access as before
    assert b["log_prob"] is b.log_prob and "log_prob" in b
    assert set(b.keys()) == {"obs", "action", "reward", "next_obs", "terminated",
                             "truncated", "indices", "log_prob"}
    assert len(b) == 8 and dict(b.items())["obs"] is b.obs and list(b) == list(b.keys())


def test_prioritized_and_nstep_fields(per_buf: rb.ReplayBuffer) -> None:
    b = per_buf.sample(4)
    assert b.weights is b["weights"] and b.weights.dtype == np.float32
    assert b.probabilities is b["probabilities"] and b.probabilities.shape == (4,)
    buf = rb.ReplayBuffer(capacity=64, n_step=3, gamma=0.9, seed=0)
    _fill(buf)
    nb = buf.sample(4)
    assert nb.discount is nb["discount"] and nb.discount.shape == (4,)


@pytest.mark.parametrize("name", ["weights", "probabilities", "discount"])
def test_missing_optional_fields_raise_attribute_error(uniform_buf: rb.ReplayBuffer,
                                                       name: str) -> None:
    b = uniform_buf.sample(3)
    assert name not in b
    # (discount: with a hint, as n_step=1 gives one-step transitions, which carry none)
    with pytest.raises(AttributeError, match=f"Batch has no field {name!r}( \\(.*\\))?; "
                                             "available: "):
        getattr(b, name)
    with pytest.raises(KeyError):
        b[name]
    assert not hasattr(b, name) and getattr(b, name, None) is None


@pytest.mark.parametrize(("name", "meant"), [
    ("observations", "obs"), ("next_observations", "next_obs"), ("actions", "action"),
    ("rewards", "reward"), ("dones", "done"), ("rewrd", "reward"),
    ("to", "to_torch(device=...)"), ("discount", "view=rb.NStepView(n=1, gamma=...)")])
def test_other_libraries_field_names_say_which_one(uniform_buf: rb.ReplayBuffer, name: str,
                                                   meant: str) -> None:
    """SB3's batch names (observations, dones, ...), a typo and torch's .to() name the
    replaybank field or method meant, as attributes and as keys."""
    b = uniform_buf.sample(3)
    with pytest.raises(AttributeError) as info:
        getattr(b, name)
    assert f"has no field {name!r} (" in str(info.value) and meant in str(info.value)
    if name not in ("to", "discount"):
        with pytest.raises(KeyError, match=f"did you mean {meant}"):
            b[name]


def test_missing_fields_of_hand_built_batches() -> None:
    b = rb.Batch({"reward": np.zeros(2, np.float32)})
    for name in BATCH_FIELDS:
        if name == "reward":
            continue
        # done is computed from terminated | truncated and raises KeyError as before
        with pytest.raises(KeyError if name == "done" else AttributeError):
            getattr(b, name)
    with pytest.raises(AttributeError, match="no field 'nope'"):
        b.nope  # noqa: B018
    sb = rb.SequenceBatch({"reward": np.zeros((2, 3), np.float32)})
    for name in SEQUENCE_FIELDS:
        if name == "reward":
            continue
        with pytest.raises(KeyError if name == "done" else AttributeError):
            getattr(sb, name)


def test_stored_done_and_nested_observations() -> None:
    b = rb.Batch({"done": np.array([True, False])})
    assert b.done is b["done"]
    goal = rb.Batch({"obs/observation": np.zeros((2, 3)), "obs/desired_goal": np.ones((2, 2)),
                     "next_obs/observation": np.ones((2, 3))})
    assert set(goal.obs) == {"observation", "desired_goal"}  # nested dict, as before
    np.testing.assert_array_equal(goal.obs["desired_goal"], goal["obs/desired_goal"])
    assert set(goal.next_obs) == {"observation"}
    assert "obs" in goal and "action" not in goal


def test_frozen_equality_repr_pickle(uniform_buf: rb.ReplayBuffer) -> None:
    b = uniform_buf.sample(3)
    for name in ("obs", "weights", "extra"):
        with pytest.raises(AttributeError, match="frozen"):
            setattr(b, name, 1)
    with pytest.raises(AttributeError, match="frozen"):
        del b.obs
    same = rb.Batch(b.to_dict(nested=False))
    assert same == b and same is not b and rb.Batch.own(dict(b.items())) == b
    assert repr(b).startswith("Batch(obs: float32[3, 3]")
    back = pickle.loads(pickle.dumps(b))
    assert back == b and back.obs.shape == (3, 3)


def test_sequence_fields_are_the_mapping_values(per_buf: rb.ReplayBuffer) -> None:
    sb = per_buf.sample_sequences(3, 4, episode_boundary="cross", burn_in=1)
    assert isinstance(sb, rb.SequenceBatch)
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "mask",
                 "is_first", "is_last", "is_terminal", "burn_in", "starts", "weights",
                 "probabilities"):
        assert getattr(sb, name) is sb[name], name
    assert sb.obs.shape == (3, 5, 3) and sb.mask.shape == (3, 5) and sb.starts.shape == (3,)
    assert sb.burn_in[:, 0].all() and not sb.mask[:, 0].any()
    np.testing.assert_array_equal(sb.done, sb.terminated | sb.truncated)
    with pytest.raises(AttributeError, match="SequenceBatch has no field 'indices'"):
        sb.indices  # noqa: B018  (only rollout sequence batches carry indices)


def test_sequence_uniform_has_no_weights(uniform_buf: rb.ReplayBuffer) -> None:
    sb = uniform_buf.sample_sequences(2, 3)
    assert sb.mask is sb["mask"] and sb.is_first.dtype == np.bool_
    for name in ("weights", "probabilities"):
        with pytest.raises(AttributeError):
            getattr(sb, name)


def test_rollout_sequence_indices() -> None:
    buf = rb.RolloutBuffer(num_steps=6, num_envs=2, gamma=0.9, gae_lambda=0.95)
    for t in range(6):
        buf.add(obs=np.full((2, 3), t, np.float32), action=np.zeros(2, np.int64),
                reward=np.ones(2, np.float32), terminated=np.array([t == 2, False]),
                truncated=np.zeros(2, bool), value=np.zeros(2, np.float32),
                log_prob=np.zeros(2, np.float32))
    buf.compute_returns_and_advantage(last_values=np.zeros(2, np.float32))
    sb = next(iter(buf.recurrent_generator(num_mini_batch=1, chunk_length=3)))
    assert sb.indices is sb["indices"] and sb.indices.shape == sb.mask.shape


def test_to_torch_keeps_typed_access(uniform_buf: rb.ReplayBuffer) -> None:
    torch = pytest.importorskip("torch")
    tb = uniform_buf.sample(3).to_torch()
    assert isinstance(tb, rb.Batch) and isinstance(tb.obs, torch.Tensor)
    assert tb.obs is tb["obs"]
    with pytest.raises(AttributeError):
        tb.weights  # noqa: B018


@pytest.mark.parametrize(("cls", "fields"), [(rb.Batch, BATCH_FIELDS),
                                             (rb.SequenceBatch, SEQUENCE_FIELDS)])
def test_standard_fields_are_typed(cls: type, fields: tuple[str, ...]) -> None:
    for name in fields:
        field = cls.__dict__[name]
        if isinstance(field, property):  # a computed field (done)
            assert field.fset is None, name
            hints = typing.get_type_hints(field.fget)
        else:  # a stored one: a descriptor whose __set__ accepts nothing (frozen)
            assert typing.get_type_hints(type(field).__set__)["value"] is typing.NoReturn
            hints = typing.get_type_hints(type(field).__get__)
        assert hints["return"] == np.typing.NDArray[typing.Any], name
        assert "[B" in (field.__doc__ or ""), name  # shapes are documented


@pytest.mark.slow
def test_fields_type_check_under_mypy_strict(tmp_path: Path) -> None:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent("""\
        import numpy as np
        import replaybank as rb

        buf = rb.ReplayBuffer(capacity=8)
        b: rb.Batch = buf.sample(2)
        x: np.ndarray = b.obs
        w: np.ndarray = b.weights
        sb: rb.SequenceBatch = buf.sample_sequences(2, 3)
        m: np.ndarray = sb.mask
        s: np.ndarray = sb.starts
        reveal_type(b.reward)
        """))
    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent("""\
        import replaybank as rb

        def f(b: rb.Batch) -> None:
            b.obs = b.reward
        """))
    # replaybank's own errors are `mypy replaybank`'s business: only the snippets count
    run = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
           "--cache-dir", str(tmp_path / ".mypy_cache")]
    env = {**os.environ, "MYPYPATH": str(Path(rb.__file__).resolve().parent.parent)}
    ok = subprocess.run([*run, str(snippet)], capture_output=True, text=True, cwd=tmp_path,
                        env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert 'Revealed type is "numpy.ndarray[' in ok.stdout, ok.stdout  # not "Any"
    ro = subprocess.run([*run, str(bad)], capture_output=True, text=True, cwd=tmp_path,
                        env=env)
    # the assignment is an error (the field accepts no value: batches are frozen)
    assert ro.returncode == 1 and "bad.py:4: error" in ro.stdout, ro.stdout + ro.stderr
