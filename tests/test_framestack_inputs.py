"""What a frame-stack buffer takes as inputs: a declared spec of stacks, and stacks whose
padding contradicts the stacks the buffer rebuilds.

* ``spec=rb.spec_from_env(env)`` of a ``FrameStackObservation(env, k)`` env declares obs
  ``(k, *frame)``; with ``frame_stack=k`` it means stacks of ``frame``: one frame per
  step is stored, and the buffer takes the env's stacks (a buffer rebuilt from its config,
  checkpoint or files stores the same fields).
* A stack given at a lane's episode start (its first step, also the first after
  ``clear()``, or a step after an episode end) whose older frames are not its first frame
  repeated, as ``FrameStackObservation(padding_type="zero")`` gives them, would be
  replayed otherwise than the agent saw it: refused, naming ``padding_type`` and the fix,
  nothing changed.
  A NEXT_STEP vector env's reset step (final frame -> reset frame) is not an episode's
  first step and is taken.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import ConfigError
from replaybank.views.framestack import FrameStackView
from tests.test_framestack import FrameEnv, K, Recorder, check_buffer, frame_env
from tests.twins import same_state


def snapshot(buf: rb.ReplayBuffer) -> dict[str, bytes]:
    """Every array of the buffer's state, as bytes (and the view's state)."""
    state = buf.state_dict()
    out = {k: np.asarray(v).tobytes() for k, v in state.get("table", {}).items()}
    out["view"] = repr(state["view"]).encode()
    return out


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


# ---------------------------------------------------------------- padding at episode starts
def zero_padded(seed: int = 0, max_steps: int = 6) -> gym.Env[Any, Any]:
    env = gym.wrappers.TimeLimit(FrameEnv(p_term=0.0, seed=seed), max_episode_steps=max_steps)
    return gym.wrappers.FrameStackObservation(env, K, padding_type="zero")


def test_a_zero_padded_first_stack_is_refused() -> None:
    env = zero_padded()
    obs, _ = env.reset(seed=0)
    nxt, r, term, trunc, _ = env.step(0)
    buf = rb.ReplayBuffer(32, frame_stack=K, seed=0)
    with pytest.raises(ConfigError) as info:
        buf.add(obs=obs, action=0, reward=r, next_obs=nxt, terminated=term, truncated=trunc)
    msg = str(info.value)
    for frag in ("add: obs=array(shape=(4, 12, 10), dtype=uint8)", "lane 0",
                 "not its first frame repeated", 'padding_type="zero"',
                 'FrameStackObservation(env, 4, padding_type="reset")', "drop frame_stack"):
        assert frag in msg, (frag, msg)
    assert buf.spec is None and len(buf) == 0


def test_a_zero_padded_stack_after_an_episode_end_is_refused_unchanged() -> None:
    """One lane ends its episode (reset-padded stacks so far); its next step's stack is
    zero-padded: refused, naming that lane, and the buffer is as it was. The other lane,
    mid-episode, is not at a start."""
    good = [frame_env(s, max_steps=5) for s in range(2)]
    rec = Recorder(good, seed=0)
    buf = rb.ReplayBuffer(40, num_envs=2, frame_stack=K, seed=0)
    while not any(e["done"] for e in rec.log[1]):
        rec.step([(buf, False)])
    ended = [lane for lane in range(2) if rec.log[lane][-1]["done"]]
    lane = ended[0]
    zero, _ = zero_padded(seed=9).reset(seed=1)
    before = snapshot(buf)
    with pytest.raises(ConfigError, match=f"lane {lane}.*padding_type"):
        buf.add(env_ids=[lane], obs=zero[None], action=[0], reward=[0.0], next_obs=zero[None],
                terminated=[False], truncated=[False])
    assert snapshot(buf) == before
    # the same stack padded as the buffer rebuilds it is taken
    padded = np.repeat(zero[-1:], K, axis=0)
    buf.add(env_ids=[lane], obs=padded[None], action=[0], reward=[0.0],
            next_obs=padded[None], terminated=[False], truncated=[False])


def test_a_lanes_first_step_after_clear_is_checked_as_a_start() -> None:
    """After clear() a lane's next step is padded as in a fresh buffer, so its stack is
    checked as a first step's: zero padding is refused, unchanged; reset padding taken."""
    env = frame_env(seed=2)
    rec = Recorder([env], seed=1)
    buf = rb.ReplayBuffer(32, frame_stack=K, seed=0)
    for _ in range(6):
        rec.step([(buf, False)])
    buf.clear()
    zero, _ = zero_padded(seed=4).reset(seed=2)
    before = snapshot(buf)
    with pytest.raises(ConfigError, match=r"it starts an episode \(the first step of lane "
                                          r"0\).*after clear\(\)"):
        buf.add(obs=zero, action=0, reward=0.0, next_obs=zero, terminated=False,
                truncated=False)
    assert snapshot(buf) == before
    padded = np.repeat(zero[-1:], K, axis=0)
    buf.add(obs=padded, action=0, reward=0.0, next_obs=padded, terminated=False,
            truncated=False)
    assert len(buf) == 1 and np.array_equal(buf.sample(1).obs[0], padded)


def test_extend_refuses_a_zero_padded_start_inside_the_chunk() -> None:
    """An extend whose chunk ends an episode and starts the next zero-padded: refused at
    that step (the steps before it are not written either)."""
    env = zero_padded(max_steps=3)
    obs, nxt, term = [], [], []
    o, _ = env.reset(seed=0)
    o[:-1] = o[-1]  # the first stack padded as the buffer rebuilds it
    for _ in range(5):
        n, _, te, tr, _ = env.step(0)
        obs.append(o)
        nxt.append(n)
        term.append(te or tr)
        o = env.reset()[0] if te or tr else n
    buf = rb.ReplayBuffer(32, frame_stack=K, seed=0)
    kw = {"obs": np.stack(obs), "action": np.zeros(5, np.int64),
          "reward": np.zeros(5, np.float32), "next_obs": np.stack(nxt),
          "terminated": np.array(term), "truncated": np.zeros(5, bool)}
    with pytest.raises(ConfigError, match=r"extend: obs=.*its step 3 starts an episode "
                                          r"\(after an episode end in lane 0\).*padding_type"):
        buf.extend(**kw)
    assert buf.spec is None
    buf.extend(**{k: v[:3] for k, v in kw.items()})  # up to the episode end: taken
    assert len(buf) == 3


@pytest.mark.parametrize("buffer_mode", [None, "next_step"])
def test_a_next_step_reset_step_is_not_an_episode_start(buffer_mode: str | None) -> None:
    """A NEXT_STEP vector env adds, after each episode end, a step from the final stack
    to the reset stack: its stack is the final one, not padded, and it is taken (stored,
    or dropped with autoreset_mode="next_step"), while the episodes' real first stacks
    are checked."""
    envs = gym.vector.SyncVectorEnv([lambda s=s: frame_env(s, max_steps=4) for s in range(2)],
                                    autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    buf = rb.ReplayBuffer(80, num_envs=2, frame_stack=K, seed=0, autoreset_mode=buffer_mode)
    obs, _ = envs.reset(seed=0)
    ends = 0
    for _ in range(30):
        act = envs.action_space.sample()
        nxt, r, term, trunc, _ = envs.step(act)
        buf.add(obs=obs, action=act, reward=r, next_obs=nxt, terminated=term, truncated=trunc)
        ends += int(np.sum(term | trunc))
        obs = nxt
    assert ends >= 4
    if buffer_mode is None:
        assert len(buf) == 60
    else:  # one reset step dropped per episode end (but those ending at the last step)
        assert ends - 2 <= 60 - len(buf) <= ends


# ---------------------------------------------------------------- a refused first add
def single_frames(buf: rb.ReplayBuffer, n: int = 6) -> None:
    """``n`` steps of single ``(12, 10)`` frames: frame ``t`` is all ``t``."""
    for t in range(n):
        buf.add(obs=np.full((12, 10), t, np.uint8), action=0, reward=0.0,
                next_obs=np.full((12, 10), t + 1, np.uint8), terminated=False,
                truncated=False)


def test_a_refused_first_stack_leaves_the_inputs_undecided() -> None:
    """The first add decides whether obs values are stacks or single frames. A first add
    refused for its zero-padded stack decides nothing: the buffer then takes single
    frames exactly as a fresh one does, and its config records the frames added, not
    stacks (it recorded (4, 12, 10) stacks, and the view's state said "stacks")."""
    obs, _ = zero_padded().reset(seed=0)
    buf = rb.ReplayBuffer(32, frame_stack=K, seed=0)
    fresh_state = buf.view.state_dict()
    with pytest.raises(ConfigError, match="padding_type"):
        buf.add(obs=obs, action=0, reward=0.0, next_obs=obs, terminated=False,
                truncated=False)
    assert buf.view.state_dict() == fresh_state
    fresh = rb.ReplayBuffer(32, frame_stack=K, seed=0)
    for b in (buf, fresh):
        single_frames(b)
    assert buf.view.state_dict() == fresh.view.state_dict()
    spec = buf.config().spec
    assert spec is not None and spec == fresh.config().spec
    assert tuple(spec["obs"]["shape"]) == (12, 10)
    same_state(buf, fresh)


def test_a_first_add_refused_after_the_view_leaves_the_inputs_undecided() -> None:
    """A first add of stacks refused by the checks that follow the view's (a reward
    that is no number) leaves the view as it was too."""
    stack = np.zeros((K, 12, 10), np.uint8)
    buf = rb.ReplayBuffer(32, frame_stack=K, seed=0)
    fresh_state = buf.view.state_dict()
    with pytest.raises(rb.ReplayBankError):
        buf.add(obs=stack, action=0, reward="high", next_obs=stack, terminated=False,
                truncated=False)
    assert buf.spec is None and buf.view.state_dict() == fresh_state
    single_frames(buf)
    spec = buf.config().spec
    assert spec is not None and tuple(spec["obs"]["shape"]) == (12, 10)


def test_a_channels_first_frame_taken_as_a_stack_names_stacked_inputs() -> None:
    """A (3, H, W) RGB frame with frame_stack=3 has the shape of a stack: its refusal
    names the fix for single frames too, which then stores the whole frame."""
    rgb = np.stack([np.full((12, 10), c, np.uint8) for c in (10, 20, 30)])
    buf = rb.ReplayBuffer(32, frame_stack=3, seed=0)
    with pytest.raises(ConfigError, match=r"view=rb\.FrameStackView\(3, "
                                          r"stacked_inputs=False\) in place of frame_stack=3"):
        buf.add(obs=rgb, action=0, reward=0.0, next_obs=rgb, terminated=False,
                truncated=False)
    frames = rb.ReplayBuffer(32, view=FrameStackView(3, stacked_inputs=False), seed=0)
    frames.add(obs=rgb, action=0, reward=0.0, next_obs=rgb, terminated=False,
               truncated=False)
    assert frames.spec is not None and frames.spec["obs"].shape == (3, 12, 10)
    np.testing.assert_array_equal(frames.sample(1).obs[0], np.stack([rgb] * 3))
    # declared stacks (stacked_inputs=True) get no such hint: their shape was not guessed
    stacked = rb.ReplayBuffer(32, view=FrameStackView(3, stacked_inputs=True), seed=0)
    with pytest.raises(ConfigError) as info:
        stacked.add(obs=rgb, action=0, reward=0.0, next_obs=rgb, terminated=False,
                    truncated=False)
    assert "stacked_inputs=False" not in str(info.value)
