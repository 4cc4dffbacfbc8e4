"""``replaybank inspect`` on multi-agent buffers, through the command line: the joint
summary a single-agent buffer gets, plus per-agent statistics checked against plain
loops over what was added (the oracle of ``tests/test_multiagent.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from tests.test_inspect import run_cli
from tests.test_multiagent import SHAPES, Oracle, Scenario, fill_tuple_steps, run

JOINT_KEYS = {"format", "version", "path", "source", "buffer_type", "storage", "capacity",
              "fill", "fill_fraction", "lanes", "rows_per_lane", "fields", "episodes",
              "returns", "lengths", "priorities", "age", "sampled_age", "sampler", "view",
              "disk_bytes", "memory_bytes", "notes", "agents"}


def expected_agents(oracle: Oracle) -> dict[str, dict[str, Any]]:
    """Per agent, by plain loops over each env's live steps (oldest first)."""
    out = {}
    for a in oracle.agents:
        active = term = trunc = total = 0
        rewards: list[float] = []
        returns: list[float] = []
        lengths: list[int] = []
        per_lane = []
        for recs in oracle.steps:
            first = max(0, len(recs) - oracle.rows)
            whole = first == 0  # the agent's first episode here has its start
            ret, n, lane_active = 0.0, 0, 0
            for rec in recs[first:]:
                total += 1
                if not rec.active[a]:
                    continue
                lane_active += 1
                rewards.append(rec.reward[a])
                ret += rec.reward[a]
                n += 1
                term += rec.terminated[a]
                trunc += rec.truncated[a]
                if rec.terminated[a] or rec.truncated[a]:
                    if whole:
                        returns.append(ret)
                        lengths.append(n)
                    whole, ret, n = True, 0.0, 0
            active += lane_active
            per_lane.append(lane_active)
        out[a] = {"active_steps": active, "active_per_lane": per_lane,
                  "active_fraction": active / total, "terminated": term,
                  "truncated": trunc, "rewards": rewards, "returns": returns,
                  "lengths": lengths}
    return out


def check_agents(got: dict[str, Any], oracle: Oracle) -> None:
    want = expected_agents(oracle)
    assert list(got) == list(oracle.agents)
    for a, w in want.items():
        g = got[a]
        for k in ("active_steps", "active_per_lane", "terminated", "truncated"):
            assert g[k] == w[k], (a, k)
        assert g["active_fraction"] == pytest.approx(w["active_fraction"])
        assert g["episodes"] == len(w["lengths"])
        for key, values in (("reward", w["rewards"]), ("returns", w["returns"]),
                            ("lengths", w["lengths"])):
            if not values:
                assert g[key] is None, (a, key)
                continue
            assert g[key]["count"] == len(values)
            assert g[key]["mean"] == pytest.approx(np.mean(values), rel=1e-5, abs=1e-6)
            assert g[key]["min"] == pytest.approx(min(values), rel=1e-5, abs=1e-6)
            assert g[key]["max"] == pytest.approx(max(values), rel=1e-5, abs=1e-6)
            assert g[key]["std"] == pytest.approx(np.std(values), rel=1e-4, abs=1e-6)
        fields = {f["name"]: f for f in g["fields"]}
        assert fields["obs"]["core"] == f"obs/{a}"
        assert fields["obs"]["shape"] == list(SHAPES[a][0])
        assert fields["obs"]["dtype"] == np.dtype(SHAPES[a][1]).name
        assert fields["obs"]["bytes"] > 0


def joint_returns(oracle: Oracle) -> list[float]:
    """Joint episodes wholly in each env's live steps, by a plain loop."""
    out = []
    for recs in oracle.steps:
        first = max(0, len(recs) - oracle.rows)
        start_known, total = first == 0, 0.0
        for rec in recs[first:]:
            total += np.float32(rec.joint_reward)
            if rec.joint_terminated or rec.joint_truncated:
                if start_known:
                    out.append(float(total))
                start_known, total = True, 0.0
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_checkpoint_json_per_agent(tmp_path: Path, seed: int) -> None:
    sc = Scenario(("a", "b", "c"), 3, 9, 40, seed, True, False)  # wraps: 40 > 9 rows
    buf, oracle = run(sc)
    rb.save(buf, tmp_path)
    out = run_cli(str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert set(s) == JOINT_KEYS
    assert s["buffer_type"] == "MultiAgentReplayBuffer" and s["fill"] == len(buf)
    assert s["lanes"] == 3 and s["rows_per_lane"] == 9 and s["notes"] == []
    assert {"obs/a", "obs/b", "obs/state", "action/c", "active/b"} <= {
        f["name"] for f in s["fields"]}
    check_agents(s["agents"], oracle)
    joint = joint_returns(oracle)
    assert s["episodes"]["complete"] == len(joint)
    if joint:
        assert s["returns"]["mean"] == pytest.approx(np.mean(joint), rel=1e-5, abs=1e-5)


def test_memmap_directory_beside_the_writer_and_the_table(tmp_path: Path) -> None:
    sc = Scenario(("a", "b"), 2, 12, 30, 5, False, False)
    buf = rb.MultiAgentReplayBuffer(24, sc.agents, num_envs=2, seed=5, storage="memmap",
                                    path=tmp_path)
    buf, oracle = run(sc, buf)
    buf.flush()  # the writer keeps its lock: inspect opens the files read-only
    out = run_cli(str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["source"] == "memmap" and s["buffer_type"] == "MultiAgentReplayBuffer"
    assert s["notes"] == []
    check_agents(s["agents"], oracle)
    table = run_cli(str(tmp_path))
    assert table.returncode == 0, table.stderr
    for word in ("MultiAgentReplayBuffer", "agents (own episodes)", "reward/step",
                 "term/trunc", "agent fields", "(2, 2)", "float64", "episode return"):
        assert word in table.stdout, word
    rows = [line.split("│")[1:-1] for line in table.stdout.splitlines() if "│" in line]
    a_row = next(r for r in rows if len(r) == 7 and r[0].strip() == "a")
    assert a_row[1].strip().startswith(f"{s['agents']['a']['active_steps']:,} (")
    len(buf)  # the writer is untouched
    run(Scenario(("a", "b"), 2, 12, 2, 6, False, True), buf, oracle)


def test_rollout_checkpoint_per_agent(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    roll = rb.MultiAgentRolloutBuffer(6, agents=["a", "b"], num_envs=2, seed=0)
    act = {"a": np.ones((6, 2), bool), "b": rng.random((6, 2)) < 0.7}
    rew = {k: rng.normal(size=(6, 2)).astype(np.float32) for k in act}
    term = {k: rng.random((6, 2)) < 0.3 for k in act}
    for t in range(6):
        acting = [k for k in act if act[k][t].any()]
        roll.add(obs={k: np.zeros((2, 3), np.float32) for k in acting},
                 action={k: np.zeros(2, np.int64) for k in acting},
                 reward={k: rew[k][t] for k in acting},
                 value={k: np.zeros(2, np.float32) for k in acting},
                 log_prob={k: np.zeros(2, np.float32) for k in acting},
                 terminated={k: term[k][t] for k in acting},
                 truncated={k: np.zeros(2, bool) for k in acting},
                 active={k: act[k][t] for k in acting})
    rb.save(roll, tmp_path)
    out = run_cli(str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["buffer_type"] == "MultiAgentRolloutBuffer" and s["fill"] == 12
    # n_steps x num_envs in numpy arrays; joint episodes do not apply (null, no table row)
    assert (s["capacity"], s["fill_fraction"], s["storage"]) == (12, 1.0, "numpy")
    assert (s["lanes"], s["rows_per_lane"], s["episodes"]) == (2, 6, None)
    table = run_cli(str(tmp_path))
    assert table.returncode == 0 and "None" not in table.stdout
    assert "capacity    │ 12 " in table.stdout and "│ episodes " not in table.stdout
    for k in act:
        g = s["agents"][k]
        assert g["active_steps"] == int(act[k].sum())
        assert g["terminated"] == int((act[k] & term[k]).sum())
        assert g["reward"]["mean"] == pytest.approx(float(rew[k][act[k]].mean()), rel=1e-5)
        returns = []
        for e in range(2):  # plain loop: the agent's own episodes, env by env
            total = 0.0
            for t in range(6):
                if act[k][t, e]:
                    total += float(rew[k][t, e])
                    if term[k][t, e]:
                        returns.append(total)
                        total = 0.0
        assert g["episodes"] == len(returns)
        if returns:
            assert g["returns"]["mean"] == pytest.approx(np.mean(returns), rel=1e-5)
        assert [f["name"] for f in g["fields"]][:2] == ["obs", "action"]


def test_dict_observations_list_one_field_per_key(tmp_path: Path) -> None:
    """An agent with a dict observation shows one field per key, beside a flat agent."""
    buf = rb.MultiAgentReplayBuffer(16, agents=["p", "q"], seed=0)
    for t in range(5):
        obs = {"p": {"observation": np.full(3, t, np.float32),
                     "action_mask": np.array([1, 0, 1, 1], bool)},
               "q": np.full(2, t, np.float32)}
        nxt = {"p": {"observation": np.full(3, t + 1, np.float32),
                     "action_mask": np.array([1, 1, 0, 1], bool)},
               "q": np.full(2, t + 1, np.float32)}
        buf.add(obs=obs, action={"p": 1, "q": 0}, reward={"p": 1.0, "q": 2.0},
                next_obs=nxt, terminated={"p": t == 4, "q": t == 4},
                truncated={"p": False, "q": False})
    rb.save(buf, tmp_path)
    out = run_cli(str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    agents = json.loads(out.stdout)["agents"]  # {agent: summary}
    p_fields = {f["name"]: f for f in agents["p"]["fields"]}
    assert p_fields["obs/observation"]["shape"] == [3]
    assert p_fields["obs/action_mask"]["dtype"] == "bool"
    assert [f["name"] for f in agents["q"]["fields"]][:1] == ["obs"]
    assert run_cli(str(tmp_path)).returncode == 0  # the table too


def test_tuple_actions_list_one_field_per_part(tmp_path: Path) -> None:
    """An agent whose action is stored part by part (a Tuple action) shows one field
    per part (``inspect`` failed with a KeyError on its ``action/<agent>`` field)."""
    buf = rb.MultiAgentReplayBuffer(32, ["t", "x"], num_envs=2, seed=3)
    fill_tuple_steps(buf)
    rb.save(buf, tmp_path)
    out = run_cli(str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    agents = json.loads(out.stdout)["agents"]
    t_fields = {f["name"]: f for f in agents["t"]["fields"]}
    assert t_fields["action/0"]["dtype"] == "int64" and t_fields["action/1"]["shape"] == [2]
    assert t_fields["action/1"]["core"] == "action/t/1"
    assert "action" in [f["name"] for f in agents["x"]["fields"]]
    assert run_cli(str(tmp_path)).returncode == 0  # the table too


def test_a_nan_reward_spoils_only_its_own_episode(tmp_path: Path) -> None:
    """An agent's NaN reward makes that episode's return non-finite, not every later one
    (returns were differences of running sums, so NaN reached all later episodes), and
    the JSON stays strict JSON."""
    buf = rb.MultiAgentReplayBuffer(32, agents=["a", "b"], seed=0)
    for t, r in enumerate([1.0, np.nan, 1.0, 2.0, 3.0, 4.0]):
        buf.add(obs={k: np.full(2, t, np.float32) for k in "ab"}, action={k: 0 for k in "ab"},
                reward={"a": r, "b": 1.0},
                next_obs={k: np.full(2, t + 1, np.float32) for k in "ab"},
                terminated={k: t in (1, 3, 5) for k in "ab"},
                truncated={k: False for k in "ab"})
    rb.save(buf, tmp_path)
    out = run_cli(str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    # agent a's episodes: [1, nan] -> nan, [1, 2] -> 3, [3, 4] -> 7
    assert s["agents"]["a"]["returns"] == {"count": 3, "nonfinite": 1, "mean": 5.0,
                                           "std": 2.0, "min": 3.0, "max": 7.0}
    assert s["agents"]["a"]["reward"]["nonfinite"] == 1
    assert s["agents"]["b"]["returns"]["mean"] == 2.0
    assert s["returns"]["nonfinite"] == 1 and s["returns"]["mean"] == 7.0  # joint: 5 and 9
    assert run_cli(str(tmp_path)).returncode == 0  # the table too
