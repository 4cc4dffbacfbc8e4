"""Views take the sampling generator and save what they learned (through the public API)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb


class NoisyView(rb.StatelessView):
    """A view that draws: adds generator noise to the reward and counts its gathers (state)."""

    every_step = True

    def __init__(self) -> None:
        self.inner = rb.TransitionView()
        self.gathers = 0

    def gather(self, table: Any, keys: np.ndarray, rng: Any = None) -> dict[str, Any]:
        assert isinstance(rng, np.random.Generator)  # the buffer passes its generator
        out = self.inner.gather(table, keys, rng)
        out["noise"] = rng.standard_normal(len(keys))
        self.gathers += 1
        return out

    def valid(self, table: Any, keys: np.ndarray) -> None:
        return None

    def config(self) -> dict[str, Any]:
        return {"type": "noisy"}

    def state_dict(self) -> dict[str, Any]:
        return {"gathers": self.gathers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gathers = int(state["gathers"])


def fill(buf: Any, n: int = 40, stacked: int = 0) -> None:
    rng = np.random.default_rng(1)
    for t in range(n):
        shape = (stacked, 2, 3) if stacked else (3,)  # stacks of [2, 3] frames
        obs = rng.standard_normal(shape).astype(np.float32)
        if stacked and t % 9 == 0:  # an episode's first stack: its first frame repeated
            obs[:-1] = obs[-1]
        buf.add(obs=obs, action=t % 2, reward=1.0, next_obs=obs + 1,
                terminated=t % 9 == 8, truncated=False)


@pytest.fixture()
def noisy_registered() -> Any:
    rb.register_view("noisy", NoisyView)
    yield
    from replaybank import registry

    registry.VIEWS.pop("noisy")


def test_view_draws_from_the_buffer_generator(noisy_registered: Any, tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(64, seed=3, view=NoisyView())
    fill(buf)
    buf.sample(8)
    buf.save(tmp_path)
    back = rb.load(tmp_path)
    assert isinstance(back.view, NoisyView) and back.view.gathers == 1  # its state came back
    a, b = buf.sample(8), back.sample(8)
    assert np.array_equal(a.indices, b.indices)
    assert np.array_equal(a["noise"], b["noise"])  # same generator state: same draws
    c = rb.ReplayBuffer(64, seed=4, view=NoisyView())
    fill(c)
    assert not np.array_equal(c.sample(8)["noise"], a["noise"])


def test_frame_stack_layout_is_saved_and_restored(tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(64, seed=0, frame_stack=4)
    fill(buf, stacked=4)  # stacked [4, 2, 3] observations: the layout is decided here
    state = buf.view.state_dict()
    assert state["layout"] == {"": [True, 2]}  # a stack of 2-d frames
    buf.save(tmp_path)
    back = rb.load(tmp_path)
    assert back.view.state_dict() == state
    a, b = buf.sample(6), back.sample(6)
    assert np.array_equal(a.obs, b.obs) and a.obs.shape == (6, 4, 2, 3)
    # the restored view reads the next stacked add exactly as the original does
    nxt = np.ones((4, 2, 3), np.float32)
    for x in (buf, back):
        x.add(obs=nxt, action=0, reward=0.0, next_obs=nxt + 1, terminated=False,
              truncated=False)
    assert np.array_equal(buf.sample(5).obs, back.sample(5).obs)


def test_a_state_of_another_view_kind_is_refused() -> None:
    view = rb.FrameStackView(4)
    with pytest.raises(rb.CheckpointError, match="layout"):
        view.load_state_dict({"layout": [1, 2]})


def test_memmap_resume_restores_the_view_state(tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(64, seed=0, frame_stack=4, storage="memmap", path=tmp_path / "m")
    fill(buf, stacked=4)
    buf.flush()
    again = rb.open(tmp_path / "m", mode="r")
    assert again.view.state_dict() == buf.view.state_dict()
    assert np.array_equal(again.sample(5).obs, buf.sample(5).obs)


@pytest.mark.parametrize("view, name", [
    (lambda: rb.NStepView(20, 0.9), "n_step=20"),
    (lambda: rb.FrameStackView(20), "frame_stack=20"),
    (lambda: rb.FrameStackView(2, inner=rb.NStepView(20, 0.9)), "n_step=20"),
    (lambda: rb.HerView(lambda a, d, info: np.zeros(len(a), np.float32), n_step=20), "n_step=20"),
])
def test_a_view_longer_than_a_lane_is_refused_however_it_is_passed(view: Any, name: str) -> None:
    """``n_step=20`` on 10 rows per lane is a CapacityError; the same window given as
    ``view=`` or swapped in (``buf.view = ...``) was accepted, and a frame stack longer than
    the ring then served no step at all once the ring wrapped."""
    with pytest.raises(rb.CapacityError, match=f"{name} exceeds the 10 rows per lane"):
        rb.ReplayBuffer(10, seed=0, view=view())
    buf = rb.ReplayBuffer(20, num_envs=2, seed=0)   # 10 rows per lane
    old = buf.view
    with pytest.raises(rb.CapacityError, match=f"{name} exceeds the 10 rows per lane"):
        buf.view = view()
    assert buf.view is old                              # the failed swap left the old view
    fits = rb.FrameStackView(10)                        # as long as a lane: accepted
    buf.view = fits
    assert rb.ReplayBuffer(10, seed=0, view=rb.NStepView(10, 0.9)).view.n == 10
