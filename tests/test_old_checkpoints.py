"""Checkpoints written by replaybank 0.1 before the redesign (``tests/data/v0_1_checkpoints``,
made by the release before it) still load, and draw the same next sample they drew then."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import replaybank as rb

DATA = Path(__file__).parent / "data" / "v0_1_checkpoints"
EXPECTED = json.loads((DATA / "expected_next_samples.json").read_text())


@pytest.fixture()
def copy_of(tmp_path: Path):  # type: ignore[no-untyped-def]
    def make(name: str) -> Path:
        shutil.copytree(DATA / name, tmp_path / name)  # never touch the committed files
        return tmp_path / name
    return make


def test_prioritized_nstep_checkpoint(copy_of) -> None:  # type: ignore[no-untyped-def]
    buf = rb.load(copy_of("per_nstep"))
    assert isinstance(buf, rb.PrioritizedReplayBuffer) and buf.num_envs == 2
    b, want = buf.sample(6), EXPECTED["per_nstep"]
    assert b.indices.tolist() == want["indices"]
    np.testing.assert_allclose(b.reward, want["reward"], rtol=1e-6)
    np.testing.assert_allclose(b.weights, want["weights"], rtol=1e-6)


def test_frame_stack_checkpoint(copy_of) -> None:  # type: ignore[no-untyped-def]
    buf = rb.load(copy_of("framestack"))
    b, want = buf.sample(5), EXPECTED["framestack"]
    assert b.indices.tolist() == want["indices"]
    np.testing.assert_array_equal(b.obs, np.asarray(want["obs"], np.float32))


def test_sequence_checkpoint(copy_of) -> None:  # type: ignore[no-untyped-def]
    buf = rb.load(copy_of("sequence"))
    assert isinstance(buf, rb.SequenceReplayBuffer) and buf.burn_in == 1
    s, want = buf.sample(3), EXPECTED["sequence"]
    np.testing.assert_array_equal(s.obs, np.asarray(want["obs"], np.float32))
    np.testing.assert_array_equal(s.mask, np.asarray(want["mask"]))
