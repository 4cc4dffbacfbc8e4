"""examples/her_bit_flipping.py: DQN + HerReplayBuffer solves bit flipping, DQN alone does not.

Fast (default suite): 10 bits, 2,500 env steps, seed 0: greedy success >= 0.9 with HER and
<= 0.1 without (k=0); the rows the buffer returns to the agent are checked against the
env's goal functions and the bit-flip dynamics. Random episodes of two BitFlipping envs
(episodes of different lengths, each with a running episode at the end) go into a two-lane
buffer whose goal functions are named as in a config; every sampled row is found in a
plain-Python record and its goal checked against the strategy "future".

Slow (``-m slow``): the HER paper's Figure 1 point at 15 bits: >= 0.9 for seeds 0, 1, 2
with HER within the example's default budget, <= 0.1 for the same seeds without.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

import replaybank as rb
from replaybank.envs.bit_flipping import BitFlipping, compute_reward, compute_terminated

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "her_bit_flipping.py"
FULL_BITS, FULL_BUDGET = 15, 6_000  # the budget stated in the example's docstring


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("her_bit_flipping_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_rows(buf: Any, bits: int, her: bool) -> None:
    """What the agent learned from: goals, rewards, flags and the one flipped bit."""
    b = buf.sample(2048)
    obs, nxt = b.obs, b.next_obs
    relabeled = np.asarray(b["relabeled"], bool)
    for o in (obs, nxt):
        assert o["observation"].shape == o["desired_goal"].shape == (2048, bits)
        np.testing.assert_array_equal(o["observation"], o["achieved_goal"])
    # a step flips exactly the bit of its action; the goal stays the goal of the row
    flipped = obs["observation"] != nxt["observation"]
    assert (flipped.sum(1) == 1).all()
    np.testing.assert_array_equal(np.argmax(flipped, 1), np.asarray(b.action).reshape(-1))
    np.testing.assert_array_equal(obs["desired_goal"], nxt["desired_goal"])
    # every row's reward / termination are the env's, for the goal the row now has
    reward = np.asarray(b.reward, np.float32)
    terminated = np.asarray(b.terminated, bool)
    np.testing.assert_array_equal(reward, compute_reward(nxt["achieved_goal"],
                                                         nxt["desired_goal"], {}))
    np.testing.assert_array_equal(terminated, compute_terminated(nxt["achieved_goal"],
                                                                 nxt["desired_goal"], {}))
    if her:
        # k=4: about 4/5 of the rows (nearly all from finished episodes) get a new goal
        assert 0.7 < relabeled.mean() < 0.9
        assert (reward[relabeled] == 0.0).mean() > 0.05  # hindsight successes exist
    else:
        assert not relabeled.any()


def test_her_solves_10_bits_and_plain_dqn_does_not(example: ModuleType) -> None:
    her = example.train(10, 2_500, seed=0, her=True, eval_every=0, quiet=True)
    assert her["steps"] == 2_500 and her["success"] >= 0.9, her
    check_rows(her["buffer"], 10, her=True)
    plain = example.train(10, 2_500, seed=0, her=False, eval_every=0, quiet=True)
    assert plain["steps"] == 2_500 and plain["success"] <= 0.1, plain
    check_rows(plain["buffer"], 10, her=False)


def test_future_goals_of_two_lanes_against_a_record() -> None:
    bits = 12
    envs = [BitFlipping(n_bits=bits, max_steps=6), BitFlipping(n_bits=bits, max_steps=9)]
    obs = [env.reset(seed=10 + i)[0] for i, env in enumerate(envs)]
    rb.register_function("bit_flipping_terminated",
                         "replaybank.envs.bit_flipping:compute_terminated")
    buf = rb.HerReplayBuffer(2_000, num_envs=2,
                             reward_fn="replaybank.envs.bit_flipping:compute_reward",
                             terminated_fn="bit_flipping_terminated", strategy="future", k=4,
                             seed=0)
    rng = np.random.default_rng(0)
    # record: (obs bits, next_obs bits) -> (episode id, t); episodes: id -> next achieved goals
    where: dict[tuple[bytes, bytes], tuple[int, int]] = {}
    achieved: dict[int, list[bytes]] = {0: [], 1: []}
    goal: dict[int, bytes] = {i: obs[i]["desired_goal"].tobytes() for i in range(2)}
    finished: set[int] = set()
    current, next_id = [0, 1], 2
    for step in range(203):
        actions = rng.integers(bits, size=2)
        results = [env.step(int(a)) for env, a in zip(envs, actions, strict=True)]
        stack = {key: np.stack([r[0][key] for r in results]) for key in obs[0]}
        buf.add(obs={key: np.stack([o[key] for o in obs]) for key in obs[0]}, action=actions,
                reward=np.array([r[1] for r in results], np.float32), next_obs=stack,
                terminated=np.array([r[2] for r in results]),
                truncated=np.array([r[3] for r in results]))
        for i, (o, r) in enumerate(zip(obs, results, strict=True)):
            ep = current[i]
            pair = (o["observation"].tobytes(), r[0]["observation"].tobytes())
            # a pair seen twice cannot be told apart: forget it
            where[pair] = (-1, -1) if pair in where else (ep, len(achieved[ep]))
            achieved[ep].append(r[0]["achieved_goal"].tobytes())
            if (r[2] or r[3]) and step < 202:
                finished.add(ep)
                current[i], next_id = next_id, next_id + 1
                achieved[current[i]] = []
                obs[i] = envs[i].reset()[0]
                goal[current[i]] = obs[i]["desired_goal"].tobytes()
            else:
                obs[i] = r[0]
    assert len(buf) == 406 and len(finished) < next_id - 1  # some episodes still running
    b = buf.sample(4096)
    relabeled = np.asarray(b["relabeled"], bool)
    found = relabeled_unfinished = 0
    for row in range(4096):
        pair = (b.obs["observation"][row].tobytes(), b.next_obs["observation"][row].tobytes())
        ep, t = where[pair]
        if ep < 0:
            continue
        found += 1
        g = b.obs["desired_goal"][row].tobytes()
        assert b.next_obs["desired_goal"][row].tobytes() == g
        if relabeled[row]:
            relabeled_unfinished += ep not in finished
            assert g in achieved[ep][t:], (ep, t)  # a later (or this) next achieved goal
        else:
            assert g == goal[ep]
    assert found > 3_900 and relabeled_unfinished == 0
    in_finished = np.array([where[(o.tobytes(), n.tobytes())][0] in finished
                            for o, n in zip(b.obs["observation"], b.next_obs["observation"],
                                            strict=True)])
    assert abs(relabeled[in_finished].mean() - 0.8) < 0.05
    check_rows(buf, bits, her=True)


def test_command_line(example: ModuleType, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.argv", ["her_bit_flipping.py", "--bits", "4", "--episodes", "60",
                                      "--seed", "1", "--eval-every", "20",
                                      "--eval-episodes", "10"])
    example.main()
    out = capsys.readouterr().out.splitlines()
    assert len([line for line in out if line.startswith("episode")]) == 2  # 20, 40 (not 60)
    assert out[-1].startswith("done: 4 bits, HER k=4, seed 1: eval success")
    assert "(60 episodes)" in out[-1]
    monkeypatch.setattr("sys.argv", ["her_bit_flipping.py", "--bits", "4", "--steps", "50",
                                      "--no-her", "--quiet", "--eval-episodes", "5"])
    example.main()
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("done: 4 bits, no HER, seed 0")
    assert "after 50 steps" in out[0]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_figure_1_at_15_bits(example: ModuleType, seed: int) -> None:
    her = example.train(FULL_BITS, FULL_BUDGET, seed=seed, her=True, quiet=True)
    assert her["success"] >= 0.9, her
    plain = example.train(FULL_BITS, FULL_BUDGET, seed=seed, her=False, quiet=True)
    assert plain["success"] <= 0.1, plain
    # no periodic evaluation without HER got anywhere either
    assert max(rate for _, rate in plain["curve"]) <= 0.1, plain["curve"]
