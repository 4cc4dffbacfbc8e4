"""Exact resume of memmap buffers: flush() saves generator and sampler state by the files,
ReplayBuffer.open restores it only while the files hold what they held at that flush."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.errors import ConfigError
from replaybank.persist import ResumeWarning
from replaybank.storage.backends.memmap import RESUME_PREFIX, MemmapBackend


def fill(buf: Any, n: int, lanes: int = 2, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(n):
        obs = rng.standard_normal((lanes, 3)).astype(np.float32)
        buf.add(obs=obs, action=rng.integers(0, 4, lanes), reward=rng.random(lanes),
                next_obs=obs + 1, terminated=rng.random(lanes) < 0.1,
                truncated=np.zeros(lanes, bool))


def same_sampler_state(a: Any, b: Any) -> bool:
    sa, sb = a.sampler.state_dict(), b.sampler.state_dict()
    return sa.keys() == sb.keys() and all(
        np.array_equal(np.asarray(sa[k]), np.asarray(sb[k])) for k in sa)


def test_flush_then_open_draws_the_identical_next_samples(tmp_path: Path) -> None:
    buf = rb.PrioritizedReplayBuffer(40, num_envs=2, seed=3, storage="memmap", path=tmp_path,
                                     alpha=0.7, beta=0.4)
    fill(buf, 30)
    for _ in range(5):  # priorities and the beta schedule move away from their defaults
        b = buf.sample(8)
        buf.update_priorities(b.indices, np.abs(b.reward) + 0.1)
    buf.flush()
    buf.backend.close()  # releases the writer's lock, as when the process stops
    again = rb.ReplayBuffer.open(tmp_path)
    assert type(again) is type(buf) and same_sampler_state(again, buf)
    for _ in range(3):
        x, y = buf.sample(16), again.sample(16)
        assert x.indices.tolist() == y.indices.tolist()
        assert np.array_equal(x.weights, y.weights) and np.array_equal(x.obs, y.obs)
        buf.update_priorities(x.indices, x.reward + 1.0)
        again.update_priorities(y.indices, y.reward + 1.0)


def test_steps_added_after_the_flush_give_fresh_state_and_a_warning(tmp_path: Path) -> None:
    buf = rb.PrioritizedReplayBuffer(40, num_envs=2, seed=3, storage="memmap", path=tmp_path)
    fill(buf, 10)
    buf.update_priorities(np.arange(6), np.full(6, 9.0))
    buf.flush()
    fill(buf, 2, seed=1)
    with pytest.warns(ResumeWarning, match="added .* after its last flush"):
        again = rb.ReplayBuffer.open(tmp_path, mode="r")  # read-only, beside the writer
    assert len(again) == len(buf) == 24
    # as without a flush: every live step holds the default (running max) priority
    fresh = rb.PrioritizedReplayBuffer(40, num_envs=2, seed=3)
    fill(fresh, 10)
    fill(fresh, 2, seed=1)
    assert same_sampler_state(again, fresh)


def test_clear_after_the_flush_is_not_resumed(tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(20, num_envs=2, seed=0, storage="memmap", path=tmp_path)
    fill(buf, 5)
    buf.flush()
    buf.clear()
    with pytest.warns(ResumeWarning):
        again = rb.ReplayBuffer.open(tmp_path, mode="r")
    assert len(again) == 0


def test_no_flush_opens_silently(tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    buf = rb.ReplayBuffer(20, num_envs=2, seed=0, storage="memmap", path=tmp_path)
    fill(buf, 5)
    again = rb.ReplayBuffer.open(tmp_path, mode="r")
    assert len(again) == 10 and not [w for w in recwarn if w.category is ResumeWarning]


def test_an_overwritten_buffer_drops_the_old_resume_state(tmp_path: Path) -> None:
    old = rb.ReplayBuffer(20, num_envs=2, seed=0, storage="memmap", path=tmp_path)
    fill(old, 5)
    old.flush()
    assert list(tmp_path.glob(RESUME_PREFIX + "*"))
    old.backend.close()  # a buffer open for writing cannot be overwritten
    new = rb.ReplayBuffer(20, num_envs=2, seed=1,
                          storage=MemmapBackend(tmp_path, overwrite=True))
    assert not list(tmp_path.glob(RESUME_PREFIX + "*"))
    fill(new, 5)
    again = rb.ReplayBuffer.open(tmp_path, mode="r")
    assert len(again) == 10


def test_resume_state_of_another_buffer_is_refused(tmp_path: Path) -> None:
    a = rb.ReplayBuffer(20, num_envs=2, seed=0, storage="memmap", path=tmp_path / "a")
    b = rb.ReplayBuffer(20, num_envs=2, seed=0, storage="memmap", path=tmp_path / "b")
    fill(a, 5)
    fill(b, 5)
    a.flush()
    for f in (tmp_path / "a").glob(RESUME_PREFIX + "*"):  # same counters, other buffer
        (tmp_path / "b" / f.name).write_bytes(f.read_bytes())
    with pytest.warns(ResumeWarning, match="another buffer"):
        rb.ReplayBuffer.open(tmp_path / "b", mode="r")


def test_a_damaged_resume_state_is_reported_not_fatal(tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(20, num_envs=2, seed=0, storage="memmap", path=tmp_path)
    fill(buf, 5)
    buf.flush()
    state = next(tmp_path.glob(RESUME_PREFIX + "*.safetensors"))
    raw = bytearray(state.read_bytes())
    raw[-1] ^= 0xFF
    state.write_bytes(bytes(raw))
    with pytest.warns(ResumeWarning, match="cannot be read"):
        again = rb.ReplayBuffer.open(tmp_path, mode="r")
    assert len(again) == 10


def test_flush_needs_memmap_storage() -> None:
    buf = rb.ReplayBuffer(8, seed=0)
    with pytest.raises(ConfigError, match="storage='memmap'"):
        buf.flush()


def test_sequence_buffer_resumes_exactly(tmp_path: Path) -> None:
    buf = rb.SequenceReplayBuffer(60, num_envs=2, sequence_length=3, seed=5,
                                  episode_boundary="cross", storage="memmap", path=tmp_path)
    fill(buf, 25)
    buf.flush()
    again = rb.ReplayBuffer.open(tmp_path, mode="r")
    assert isinstance(again, rb.SequenceReplayBuffer)
    x, y = buf.sample(4), again.sample(4)
    assert x.starts.tolist() == y.starts.tolist() and np.array_equal(x.obs, y.obs)


def test_resume_in_a_new_process(tmp_path: Path) -> None:
    """A child process fills a PER buffer, flushes and records the sample it draws next;
    the parent reopens the files and draws the same sample."""
    code = textwrap.dedent(f"""
        import numpy as np, replaybank as rb
        buf = rb.PrioritizedReplayBuffer(64, num_envs=2, seed=7, storage="memmap",
                                         path={str(tmp_path)!r})
        rng = np.random.default_rng(0)
        for t in range(40):
            o = rng.standard_normal((2, 3)).astype(np.float32)
            buf.add(obs=o, action=np.zeros(2, np.int64), reward=rng.random(2),
                    next_obs=o + 1, terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))
        b = buf.sample(10)
        buf.update_priorities(b.indices, rng.random(10) * 5)
        buf.flush()
        np.save({str(tmp_path / "next.npy")!r}, buf.sample(16).indices)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)
    again = rb.ReplayBuffer.open(tmp_path)
    assert again.sample(16).indices.tolist() == np.load(tmp_path / "next.npy").tolist()


def test_reopened_buffer_stays_bit_identical_to_the_uninterrupted_one(tmp_path: Path) -> None:
    """The resume state keeps the order in which free side slots are reused: adds after
    the reopen keep each episode's final observation in the slot the buffer that was
    not stopped uses, so the two states stay identical (the free list a reopen rebuilds
    has another order)."""
    from tests.roundtrip import assert_same_state

    def build(path: Path) -> Any:
        return rb.PrioritizedReplayBuffer(16, num_envs=2, seed=0, storage="memmap", path=path)

    def episodes(buf: Any, steps: int, seed: int) -> None:  # next_obs continues
        rng = np.random.default_rng(seed)
        obs = rng.standard_normal((2, 3)).astype(np.float32)
        for _ in range(steps):
            nxt = rng.standard_normal((2, 3)).astype(np.float32)
            term = rng.random(2) < 0.25
            buf.add(obs=obs, action=np.zeros(2, np.int64), reward=np.ones(2), next_obs=nxt,
                    terminated=term, truncated=np.zeros(2, bool))
            obs = np.where(term[:, None], rng.standard_normal((2, 3)), nxt).astype(np.float32)

    steady, stopped = build(tmp_path / "steady"), build(tmp_path / "stopped")
    for buf in (steady, stopped):
        episodes(buf, 20, seed=0)  # wraps: overwritten steps free their side slots
    stopped.flush()
    stopped.close()
    resumed = rb.open(tmp_path / "stopped")
    for buf in (steady, resumed):
        episodes(buf, 9, seed=1)
    assert_same_state(steady, resumed, ignore=("init.path",))
    x, y = steady.sample(8), resumed.sample(8)
    assert x.indices.tolist() == y.indices.tolist() and np.array_equal(x.obs, y.obs)


def test_reopened_buffer_checks_sequence_td_errors_as_before(tmp_path: Path) -> None:
    """The flush keeps the window widths sample_sequences returned: after rb.open, TD
    errors without the burn-in step are refused as the stopped buffer refused them."""
    buf = rb.PrioritizedReplayBuffer(24, num_envs=2, seed=0, storage="memmap", path=tmp_path)
    fill(buf, 10)
    batch = buf.sample_sequences(4, 3, burn_in=1, episode_boundary="cross")
    buf.flush()
    buf.close()
    again = rb.open(tmp_path)
    with pytest.raises(rb.ShapeError, match=r"windows sampled have \[4\] steps"):
        again.update_sequence_priorities(batch.starts, np.ones((4, 3)))
    assert again.update_sequence_priorities(batch.starts, np.ones((4, 4))) == 4
