"""rb.collect / rb.Collector against a plain-Python oracle of what the env really did.

A ``VectorWrapper`` records every ``step`` of a real gymnasium vector env (deep copies);
the oracle turns that record into each sub-env's true transitions (NEXT_STEP reset steps
left out, SAME_STEP final observations swapped in) and its episodes, and the tests check
what the buffers serve against it:

* vector envs built with ``copy=False`` (their observation array updated in place) are
  stored exactly.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

import replaybank as rb  # noqa: E402

AM = gym.vector.AutoresetMode
GAMMA, N_STEP = 0.9, 3


class Record(gym.vector.VectorWrapper):  # type: ignore[misc]
    """Every vector step as (obs, action, reward, next_obs, terminated, truncated,
    final_obs), deep-copied (an env built with copy=False reuses its arrays)."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.log: list[tuple[Any, ...]] = []
        self.last: Any = None

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        self.last = copy.deepcopy(obs)
        return obs, info

    def step(self, action: Any) -> Any:
        obs, r, te, tr, info = self.env.step(action)
        self.log.append((self.last, copy.deepcopy(np.asarray(action)), np.array(r),
                         copy.deepcopy(obs), np.array(te), np.array(tr),
                         copy.deepcopy(info.get("final_obs"))))
        self.last = copy.deepcopy(obs)
        return obs, r, te, tr, info


def _row(tree: Any, i: int) -> Any:
    return {k: _row(v, i) for k, v in tree.items()} if isinstance(tree, dict) else tree[i]


def episodes(rec: Record, mode: Any) -> tuple[list[list[dict[str, Any]]], list[list[Any]]]:
    """The oracle: ``(finished, running)``. ``finished``: every finished episode (a list of
    true transitions) in the order a one-lane buffer receives them (by the vector step
    that ends it, then sub-env); ``running``: each sub-env's steps of its running one."""
    n = rec.num_envs
    running: list[list[Any]] = [[] for _ in range(n)]
    finished: list[list[dict[str, Any]]] = []
    pending = np.zeros(n, bool)
    for o, a, r, o2, te, tr, final in rec.log:
        for i in range(n):
            if mode == AM.NEXT_STEP and pending[i]:
                continue  # the reset step: not a transition
            nxt = final[i] if mode == AM.SAME_STEP and (te[i] or tr[i]) else _row(o2, i)
            running[i].append({"obs": _row(o, i), "action": a[i], "reward": float(r[i]),
                               "next_obs": nxt, "terminated": bool(te[i]),
                               "truncated": bool(tr[i])})
            if te[i] or tr[i]:
                finished.append(running[i])
                running[i] = []
        pending = te | tr
    return finished, running


def nstep_truth(eps: list[list[dict[str, Any]]]
                ) -> dict[bytes, tuple[float, float, bool] | None]:
    """obs bytes -> (n-step return, discount, terminated) by the documented formula, or
    None where the window runs past the known steps of a running episode."""
    out: dict[bytes, tuple[float, float, bool] | None] = {}
    for ep in eps:
        for t, step in enumerate(ep):
            g, length, known = 0.0, 0, True
            for k in range(N_STEP):
                if t + k >= len(ep):
                    known = False  # (a finished episode ends with done: never here)
                    break
                g += GAMMA ** k * ep[t + k]["reward"]
                length = k + 1
                if ep[t + k]["terminated"] or ep[t + k]["truncated"]:
                    break
            out[np.asarray(step["obs"], np.float32).tobytes()] = (
                g, GAMMA ** length, ep[t + length - 1]["terminated"]) if known else None
    return out


def cartpole(n: int, mode: Any, **kwargs: Any) -> Record:
    return Record(gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync",
                               max_episode_steps=40,
                               vector_kwargs={"autoreset_mode": mode, **kwargs}))


# ---------------------------------------------------------------- finding 4: copy=False
@pytest.mark.parametrize("vmode", ["sync", "async"])
@pytest.mark.parametrize("mode", [AM.NEXT_STEP, AM.SAME_STEP], ids=lambda m: m.value)
def test_vector_env_with_copy_false_is_stored_exactly(vmode: str, mode: Any) -> None:
    """copy=False: the env returns its own observation array and updates it in place;
    every stored transition is still the true one (all had obs == next_obs before)."""
    rec = Record(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode=vmode,
                              max_episode_steps=15,
                              vector_kwargs={"copy": False, "autoreset_mode": mode}))
    buf = rb.ReplayBuffer(400, num_envs=2, seed=0)
    rb.collect(rec, None, buf, n_steps=60, progress=False, seed=0)
    rec.close()
    finished, running = episodes(rec, mode)
    truth = {np.asarray(s["obs"]).tobytes(): s for ep in [*finished, *running] for s in ep}
    got = buf.sample(len(buf), replace=False)
    assert len(buf) == len(truth) >= 60
    for o, a, o2, te in zip(got.obs, got.action, got.next_obs, got.terminated, strict=True):
        s = truth[o.tobytes()]
        assert a == s["action"] and te == s["terminated"]
        np.testing.assert_array_equal(o2, s["next_obs"])


class InPlace(gym.Env):  # type: ignore[misc]
    """A single env that returns one array and updates it in place."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.obs = np.zeros(3)
        return self.obs, {}

    def step(self, action: Any) -> Any:
        self.obs += 1.0
        return self.obs, 0.5, bool(self.obs[0] >= 5), False, {}


def test_single_env_that_updates_its_observation_in_place() -> None:
    buf = rb.ReplayBuffer(100, seed=0)
    rb.collect(InPlace(), None, buf, n_steps=12, progress=False, seed=0)
    got = buf.sample(12, replace=False)
    np.testing.assert_array_equal(got.next_obs, got.obs + 1.0)
