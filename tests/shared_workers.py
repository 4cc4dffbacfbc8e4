"""Collector processes for the shared-memory tests (importable by spawned children).

Every step carries its identity, so a learner can check any sampled transition on its
own: ``obs = [lane, t, episode, 0]``, ``action = t``, ``reward = t``, and ``next_obs =
[lane, t + 1, episode, 0]``, except at an episode's last step, whose true final
observation is ``[lane, t + 1, episode, 1]`` (the next episode restarts at
``[lane, t + 1, episode + 1, 0]``). A torn step (fields of two different steps, or a
reset observation paired with a final step) breaks one of these equalities.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

SPEC = {"obs": ((4,), "float32"), "action": ((), "int64")}


def step_values(lanes: np.ndarray, t: np.ndarray, episode: np.ndarray,
                done: np.ndarray) -> dict[str, Any]:
    """The values of one step of ``lanes`` at times ``t`` (all ``[m]``)."""
    m = len(lanes)
    obs = np.stack([lanes, t, episode, np.zeros(m)], axis=1).astype(np.float32)
    nxt = np.stack([lanes, t + 1, episode, done.astype(np.float64)], axis=1).astype(np.float32)
    return dict(obs=obs, action=t.astype(np.int64), reward=t.astype(np.float32),
                next_obs=nxt, terminated=done.copy(), truncated=np.zeros(m, bool))


def check_batch(batch: Any) -> None:
    """Assert every row of a sampled (one-step) batch is one complete, exact step."""
    obs, nxt = np.asarray(batch.obs), np.asarray(batch.next_obs)
    done = np.asarray(batch.terminated, bool)
    assert np.all(obs[:, 3] == 0)
    assert np.all(nxt[:, 0] == obs[:, 0]) and np.all(nxt[:, 2] == obs[:, 2])
    assert np.all(nxt[:, 1] == obs[:, 1] + 1)
    assert np.all(nxt[:, 3] == done.astype(np.float32))
    assert np.all(np.asarray(batch.action) == obs[:, 1].astype(np.int64))
    assert np.all(np.asarray(batch.reward) == obs[:, 1])


def write_lanes(handle: Any, steps: int, seed: int, pace: float = 0.0,
                p_done: float = 0.05, ready: Any = None) -> None:
    """Open ``handle`` and write ``steps`` steps to each of its lanes (episodes end with
    probability ``p_done``), sleeping ``pace`` seconds between adds."""
    rng = np.random.default_rng(seed)
    w = handle.open()
    lanes = np.asarray(handle.lanes, np.int64)
    m = len(lanes)
    # continue a lane where a previous (killed) writer stopped
    t = w.written.copy()
    episode = t.copy()  # any distinct per-lane episode ids work
    if ready is not None:
        ready.set()
    for _ in range(steps):
        done = rng.random(m) < p_done
        w.add(**step_values(lanes, t, episode, done))
        t = t + 1
        episode = np.where(done, episode + 1, episode)
        if pace:
            time.sleep(pace)
    w.close()


def owner_then_wait(spec: dict[str, Any], conn: Any) -> None:
    """Build a shared owner, send its segment names and pid, then wait to be killed."""
    import replaybank as rb
    from replaybank.shared.backend import segment_names

    buf = rb.ReplayBuffer(64, num_envs=2, spec=spec, storage="shared")
    token = buf.backend.token
    conn.send((os.getpid(), [n for n in segment_names() if token in n]))
    time.sleep(60)
    del buf
