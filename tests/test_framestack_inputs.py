"""What a frame-stack buffer takes as inputs: a declared spec of stacks.

* ``spec=rb.spec_from_env(env)`` of a ``FrameStackObservation(env, k)`` env declares obs
  ``(k, *frame)``; with ``frame_stack=k`` it means stacks of ``frame``: one frame per
  step is stored, and the buffer takes the env's stacks (a buffer rebuilt from its config,
  checkpoint or files stores the same fields).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import replaybank as rb
from replaybank.views.framestack import FrameStackView
from tests.test_framestack import K, Recorder, check_buffer, frame_env
from tests.twins import same_state


# ---------------------------------------------------------------- a declared spec of stacks
def test_a_spec_of_stacks_stores_one_frame_per_step(tmp_path: Path) -> None:
    env = frame_env(seed=1)
    spec = rb.spec_from_env(env)
    assert spec["obs"].shape == (K, 12, 10)
    buf = rb.ReplayBuffer(64, frame_stack=K, spec=spec, seed=0)
    assert buf.spec is not None and buf.spec["obs"].shape == (12, 10)  # one frame per step
    rec = Recorder([env], seed=2)
    for _ in range(50):
        rec.step([(buf, False)])  # the wrapper's stacks, as the env gives them
    assert check_buffer(buf, rec) > 0  # sampled stacks are the wrapper's
    assert rb.from_config(buf.config()).spec == buf.spec  # the config means the same
    buf.save(tmp_path / "ckpt")
    back = rb.load(tmp_path / "ckpt")
    assert back.spec == buf.spec
    np.testing.assert_array_equal(back.sample(8).obs, buf.sample(8).obs)


def test_a_spec_of_stacks_on_memmap_reopens_with_the_same_fields(tmp_path: Path) -> None:
    env = frame_env(seed=3)
    buf = rb.ReplayBuffer(32, frame_stack=K, spec=rb.spec_from_env(env), seed=0,
                          storage="memmap", path=tmp_path / "m")
    rec = Recorder([env], seed=4)
    for _ in range(20):
        rec.step([(buf, False)])
    buf.flush()
    again = rb.open(tmp_path / "m", mode="r")
    assert again.spec == buf.spec and again.spec is not None
    assert again.spec["obs"].shape == (12, 10)
    np.testing.assert_array_equal(again.sample(5).obs, buf.sample(5).obs)
    buf.close()


@pytest.mark.parametrize("mode", [gym.vector.AutoresetMode.NEXT_STEP,
                                  gym.vector.AutoresetMode.SAME_STEP])
def test_collect_into_a_spec_of_stacks_stores_what_an_inferred_spec_stores(mode: Any) -> None:
    """rb.collect of a vector env of FrameStackObservation envs into a buffer built with
    its spec_from_env: the same table as a buffer whose spec the first add inferred."""
    def envs() -> gym.vector.SyncVectorEnv:
        return gym.vector.SyncVectorEnv([lambda s=s: frame_env(s) for s in range(3)],
                                        autoreset_mode=mode)

    declared = rb.ReplayBuffer(90, num_envs=3, frame_stack=K, seed=0,
                               spec=rb.spec_from_env(envs()))
    inferred = rb.ReplayBuffer(90, num_envs=3, frame_stack=K, seed=0)
    for buf in (declared, inferred):
        rb.collect(envs(), None, buf, 60, progress=False, seed=5)
    assert declared.spec == inferred.spec
    same_state(declared, inferred)
    assert declared.sample(4).obs.shape == (4, K, 12, 10)


def test_single_frames_keep_a_spec_that_only_looks_like_stacks() -> None:
    """stacked_inputs=False: a (k, *frame) spec is the frame (4-channel images)."""
    spec = {"obs": ((K, 3, 3), "uint8"), "action": ((), "int64")}
    buf = rb.ReplayBuffer(16, seed=0, spec=spec, view=FrameStackView(K, stacked_inputs=False))
    assert buf.spec is not None and buf.spec["obs"].shape == (K, 3, 3)
    buf.add(obs=np.ones((K, 3, 3), np.uint8), action=0, reward=0.0,
            next_obs=np.ones((K, 3, 3), np.uint8), terminated=False, truncated=False)
    assert buf.sample(1).obs.shape == (1, K, K, 3, 3)
    assert rb.from_config(buf.config()).spec == buf.spec


def test_frames_that_look_like_stacks_rebuild_from_the_config() -> None:
    """Stacks of (k, 3, 3) frames: the stored frame looks like a stack itself, and the
    config records the stacks added, so a rebuilt buffer stores (k, 3, 3) frames too."""
    buf = rb.ReplayBuffer(16, frame_stack=K, seed=0)
    stack = np.ones((K, K, 3, 3), np.uint8)
    buf.add(obs=stack, action=0, reward=0.0, next_obs=stack, terminated=False,
            truncated=False)
    assert buf.spec is not None and buf.spec["obs"].shape == (K, 3, 3)
    back = rb.from_config(buf.config())
    assert back.spec == buf.spec
    back.add(obs=stack, action=0, reward=0.0, next_obs=stack, terminated=False,
             truncated=False)
