"""The window cases of ``replaybank bench``: sequence windows and frame stacks, each beside
its floor (the same batch gathered by hand with ``ndarray.take``).

* ``sequences``: ``sample_sequences(16, 64)`` of a buffer of 16 lanes (every lane its own
  episode lengths, 900 + 37 x lane steps, a truncation every fifth episode and three
  steps), obs float32[64], int64 actions. Its floor (:func:`sequence_floor`): flat
  ``[T * 16, ...]`` copies of the stored fields; 16 (lane, start) pairs from
  ``rng.integers`` whose 65 steps fit below the newest; one ``take`` of the 65 obs rows
  (obs and next_obs as its views) and one of each other field's 64 rows. No episode
  logic, no masks, no exact final observations.
* ``framestack``: ``sample(32)`` of ``ReplayBuffer(frame_stack=4)`` over uint8 84x84
  frames (one stored per step, 2,000-step episodes), at a fifth of the capacity the other
  cases use (one frame is 7 KB). Its floor (:func:`framestack_floor`): the frames in one
  preallocated array; 32 indices from ``rng.integers``; one ``take`` of their 5-frame
  windows (the obs stack and next stack as views) and one of each other field. No
  episode-start padding.

:func:`sequence_buffer` and :func:`framestack_buffer` build and fill the buffers (also
for ``benchmarks/bench_sequences.py`` and ``benchmarks/bench_framestack.py``).

Example:
    >>> buf = sequence_buffer(4_096)
    >>> sample, floor = sequence_sample(buf), sequence_floor(buf)
    >>> sample().obs.shape, floor()[0].shape
    ((16, 64, 64), (16, 64, 64))
    >>> fs = framestack_buffer(2_048)
    >>> framestack_sample(fs)().obs.shape, framestack_floor(fs)()[1].shape
    ((32, 4, 84, 84), (32, 4, 84, 84))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["FS_BATCH", "FS_EPISODE", "FS_HW", "FS_STACK", "SEQ_BATCH", "SEQ_LANES",
           "SEQ_LENGTH", "SEQ_OBS", "framestack_buffer", "framestack_floor",
           "framestack_sample", "sequence_buffer", "sequence_floor", "sequence_sample"]

#: Lanes, obs width, windows per batch and window length of the ``sequences`` case.
SEQ_LANES, SEQ_OBS, SEQ_BATCH, SEQ_LENGTH = 16, 64, 16, 64
#: Frame side, stack depth, batch and episode length of the ``framestack`` case.
FS_HW, FS_STACK, FS_BATCH, FS_EPISODE = 84, 4, 32, 2_000


def sequence_buffer(capacity: int, chunk: int = 4_096) -> Any:
    """A ``ReplayBuffer(capacity, num_envs=16)`` of obs float32[64] and int64 actions,
    filled to capacity with per-lane episodes (see the module doc).

    Args:
        capacity: Steps over all lanes (a multiple of 16 is used).
        chunk: Steps per lane per ``extend``.

    Returns:
        The filled :class:`~replaybank.buffers.replay.ReplayBuffer`.
    """
    import replaybank as rb

    lanes = SEQ_LANES
    rows = capacity // lanes
    rng = np.random.default_rng(0)
    buf = rb.ReplayBuffer(rows * lanes, num_envs=lanes, seed=0,
                          spec={"obs": ((SEQ_OBS,), "float32"), "action": ((), "int64")})
    pool = rng.standard_normal((chunk + 1, lanes, SEQ_OBS)).astype(np.float32)
    period = 900 + 37 * np.arange(lanes)  # per-lane episode lengths
    done = 0
    while done < rows:
        m = min(chunk, rows - done)
        steps = np.arange(done, done + m)[:, None]
        term = (steps + 1) % period[None, :] == 0
        trunc = (steps + 1) % (5 * period[None, :] + 3) == 0
        buf.extend(obs=pool[:m], action=np.zeros((m, lanes), np.int64),
                   reward=np.ones((m, lanes), np.float32), next_obs=pool[1:m + 1],
                   terminated=term, truncated=trunc & ~term)
        done += m
    return buf


def sequence_sample(buf: Any, episode_boundary: str = "stop") -> Callable[..., Any]:
    """``sample_sequences(16, 64)`` of ``buf`` as a call (any arguments ignored)."""

    def sample(*_: Any) -> Any:
        return buf.sample_sequences(SEQ_BATCH, SEQ_LENGTH, episode_boundary=episode_boundary)

    return sample


def sequence_floor(buf: Any, seed: int = 1) -> Callable[..., tuple[Any, ...]]:
    """The floor of :func:`sequence_sample`: the same windows' rows gathered with
    ``ndarray.take`` from flat copies of ``buf``'s fields (see the module doc).

    Returns:
        A call (any arguments ignored) returning ``(obs, next_obs, action, reward,
        terminated, truncated)``, each ``[16, 64, ...]``.
    """
    t = buf.table
    obs, act, rew, ter, tru = (t.flat(t.arrays[n]).copy() for n in
                               ("obs", "action", "reward", "terminated", "truncated"))
    lanes, rows, length = t.lanes, t.T, SEQ_LENGTH
    rng = np.random.default_rng(seed)
    offsets = np.arange(length + 1) * lanes

    def floor(*_: Any) -> tuple[Any, ...]:
        lane = rng.integers(0, lanes, size=SEQ_BATCH)
        start = rng.integers(0, rows - length - 1, size=SEQ_BATCH)
        slots = (start * lanes + lane)[:, None] + offsets  # [B, L + 1]
        o = obs.take(slots, axis=0)
        s = slots[:, :length]
        return o[:, :length], o[:, 1:], act.take(s), rew.take(s), ter.take(s), tru.take(s)

    return floor


def framestack_buffer(capacity: int, chunk: int = 5_000) -> Any:
    """A ``ReplayBuffer(capacity, frame_stack=4)`` of uint8 84x84 frames and int64
    actions, filled to capacity (2,000-step episodes).

    Args:
        capacity: Steps (one frame each).
        chunk: Steps per ``extend``.

    Returns:
        The filled :class:`~replaybank.buffers.replay.ReplayBuffer`.
    """
    import replaybank as rb

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(chunk + 1, FS_HW, FS_HW), dtype=np.uint8)
    act = (np.arange(chunk) % 6).astype(np.int64)
    rew = np.ones(chunk, np.float32)
    trunc = np.zeros(chunk, bool)
    buf = rb.ReplayBuffer(capacity, frame_stack=FS_STACK, seed=0,
                          spec={"obs": ((FS_HW, FS_HW), "uint8"), "action": ((), "int64")})
    done = 0
    while done < capacity:
        m = min(chunk, capacity - done)
        term = (np.arange(done, done + m) + 1) % FS_EPISODE == 0
        buf.extend(obs=frames[:m], action=act[:m], reward=rew[:m], next_obs=frames[1:m + 1],
                   terminated=term, truncated=trunc[:m])
        done += m
    return buf


def framestack_sample(buf: Any) -> Callable[..., Any]:
    """``sample(32)`` of ``buf`` as a call (any arguments ignored)."""

    def sample(*_: Any) -> Any:
        return buf.sample(FS_BATCH)

    return sample


def framestack_floor(buf: Any, seed: int = 1) -> Callable[..., tuple[Any, ...]]:
    """The floor of :func:`framestack_sample`: 32 five-frame windows gathered with
    ``ndarray.take`` from a copy of ``buf``'s frames (see the module doc).

    Returns:
        A call (any arguments ignored) returning ``(obs, next_obs, action, reward,
        terminated, truncated)``: stacks ``[32, 4, 84, 84]``, the rest ``[32]``.
    """
    t = buf.table
    frames, act, rew, ter, tru = (t.flat(t.arrays[n]).copy() for n in
                                  ("obs", "action", "reward", "terminated", "truncated"))
    n, k = len(frames), FS_STACK
    rng = np.random.default_rng(seed)
    offsets = np.arange(-(k - 1), 2)

    def floor(*_: Any) -> tuple[Any, ...]:
        idx = rng.integers(k - 1, n - 1, size=FS_BATCH)
        w = frames.take(idx[:, None] + offsets, axis=0)  # [B, k + 1, H, W]
        return (w[:, :k], w[:, 1:], act.take(idx), rew.take(idx), ter.take(idx),
                tru.take(idx))

    return floor
