"""``replaybank inspect``: summaries of real checkpoints and memmap directories, checked
against plain-Python computations from what was stored, and the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.cli.inspect import episode_stats, summarize
from replaybank.errors import CheckpointError, ConfigError

ROOT = Path(__file__).resolve().parents[1]


def goal_reward(achieved: Any, desired: Any, info: Any) -> Any:
    return -(np.linalg.norm(achieved - desired, axis=-1) > 0.05).astype(np.float32)


class History:
    """What was added, per lane, in time order (plain Python)."""

    def __init__(self, lanes: int) -> None:
        self.reward: list[list[float]] = [[] for _ in range(lanes)]
        self.done: list[list[bool]] = [[] for _ in range(lanes)]

    def add(self, reward: Any, terminated: Any, truncated: Any) -> None:
        for lane in range(len(self.reward)):
            self.reward[lane].append(float(np.float32(reward[lane])))
            self.done[lane].append(bool(terminated[lane]) or bool(truncated[lane]))

    def expected(self, rows: int) -> dict[str, Any]:
        """Episodes wholly inside each lane's last ``rows`` steps, by a plain loop."""
        returns: list[float] = []
        lengths: list[int] = []
        ages = []
        for lane, (rew, done) in enumerate(zip(self.reward, self.done, strict=True)):
            n = len(rew)
            first = max(0, n - rows)
            ages.append({"lane": lane, "oldest": first, "newest": n - 1, "count": n - first})
            start: int | None = 0 if first == 0 else None
            total = 0.0
            for i in range(first, n):
                total += rew[i]
                if done[i]:
                    if start is not None:
                        returns.append(total)
                        lengths.append(i - start + 1)
                    start, total = i + 1, 0.0
        return {"returns": returns, "lengths": lengths, "age": ages,
                "ended": sum(sum(d) for d in self.done),
                "in_buffer": sum(sum(d[max(0, len(d) - rows):]) for d in self.done)}


def fill_lanes(buf: Any, steps: int, lanes: int, seed: int = 1) -> History:
    rng = np.random.default_rng(seed)
    hist = History(lanes)
    for _ in range(steps):
        reward = rng.normal(size=lanes)
        term, trunc = rng.random(lanes) < 0.1, rng.random(lanes) < 0.05
        buf.add(obs=rng.random((lanes, 3)).astype(np.float32),
                action=rng.integers(0, 4, lanes), reward=reward,
                next_obs=rng.random((lanes, 3)).astype(np.float32),
                terminated=term, truncated=trunc)
        hist.add(reward, term, trunc)
    return hist


def check_against(s: dict[str, Any], hist: History, rows: int) -> None:
    exp = hist.expected(rows)
    assert s["age"] == exp["age"]
    assert s["fill"] == sum(a["count"] for a in exp["age"])
    assert s["episodes"]["ended"] == exp["ended"]
    assert s["episodes"]["in_buffer"] == exp["in_buffer"]
    assert s["episodes"]["complete"] == len(exp["lengths"])
    r, n = exp["returns"], exp["lengths"]
    assert len(n) > 0
    assert s["lengths"]["min"] == min(n) and s["lengths"]["max"] == max(n)
    assert s["lengths"]["mean"] == pytest.approx(sum(n) / len(n))
    assert s["returns"]["mean"] == pytest.approx(sum(r) / len(r), rel=1e-5)
    assert s["returns"]["min"] == pytest.approx(min(r), rel=1e-5, abs=1e-6)
    assert s["returns"]["max"] == pytest.approx(max(r), rel=1e-5, abs=1e-6)
    var = sum((x - sum(r) / len(r)) ** 2 for x in r) / len(r)
    assert s["returns"]["std"] == pytest.approx(var ** 0.5, rel=1e-4, abs=1e-6)


def test_episode_stats_matches_loop() -> None:
    done = np.array([0, 0, 1, 0, 1, 1, 0], bool)
    r, n = episode_stats(np.arange(7.0), done, first_is_start=True)
    assert r.tolist() == [0 + 1 + 2, 3 + 4, 5] and n.tolist() == [3, 2, 1]
    r, n = episode_stats(np.arange(7.0), done, first_is_start=False)
    assert r.tolist() == [7, 5] and n.tolist() == [2, 1]
    r, n = episode_stats(None, np.zeros(4, bool), True)
    assert r.size == 0 and n.size == 0


def test_uniform_lanes_checkpoint(tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(capacity=90, num_envs=3, seed=0)
    hist = fill_lanes(buf, 70, 3)  # wraps: 30 rows per lane
    rb.save(buf, tmp_path)
    s = summarize(tmp_path).summary
    assert s["buffer_type"] == "ReplayBuffer" and s["source"] == "checkpoint"
    assert s["capacity"] == 90 and s["lanes"] == 3 and s["rows_per_lane"] == 30
    assert s["fill"] == 90 and s["fill_fraction"] == 1.0
    check_against(s, hist, 30)
    fields = {f["name"]: f for f in s["fields"]}
    assert fields["obs"] == {"name": "obs", "shape": [3], "dtype": "float32",
                             "bytes": 30 * 3 * 3 * 4}
    assert fields["reward"]["bytes"] == 30 * 3 * 4
    assert s["priorities"] is None
    assert s["memory_bytes"] == buf.nbytes()
    assert s["disk_bytes"] == sum(f.stat().st_size for f in tmp_path.iterdir())
    assert s["sampled_age"]["draws"] == 4096
    assert s["sampled_age"]["min"] >= 0 and s["sampled_age"]["max"] <= 29
    assert s["sampler"]["type"] == "uniform"


def test_episodes_after_clear_count_as_in_a_fresh_buffer(tmp_path: Path) -> None:
    """After ``clear()`` each lane's first step starts an episode, as in a fresh buffer:
    the same complete episodes, lengths and returns as a fresh buffer given the same
    steps (before, each lane's first episode after the clear was left out)."""
    buf = rb.ReplayBuffer(capacity=90, num_envs=3, seed=0)
    fill_lanes(buf, 50, 3, seed=4)
    buf.clear()
    fill_lanes(buf, 25, 3, seed=5)
    fresh = rb.ReplayBuffer(capacity=90, num_envs=3, seed=0)
    hist = fill_lanes(fresh, 25, 3, seed=5)
    rb.save(buf, tmp_path / "cleared")
    rb.save(fresh, tmp_path / "fresh")
    got, want = summarize(tmp_path / "cleared").summary, summarize(tmp_path / "fresh").summary
    for key in ("lengths", "returns"):
        assert got[key] == want[key]
    assert got["episodes"]["complete"] == want["episodes"]["complete"] == \
        len(hist.expected(30)["lengths"])


def test_prioritized_nstep_after_updates(tmp_path: Path) -> None:
    alpha, eps = 0.6, 1e-6
    buf = rb.ReplayBuffer(capacity=40, num_envs=2, seed=0, n_step=3, gamma=0.9,
                          sampler=rb.PrioritizedSampler(alpha=alpha, beta=0.4, eps=eps))
    hist = fill_lanes(buf, 33, 2, seed=3)
    buf.update_priorities(buf.sample(8).indices, np.ones(8))
    # every live key (seq * lanes + lane) gets a known priority
    keys = [seq * 2 + lane for lane in range(2) for seq in range(33 - 20, 33)]
    raw = [0.1 + 0.05 * i for i in range(len(keys))]
    assert buf.update_priorities(np.array(keys), np.array(raw)) == len(keys)
    rb.save(buf, tmp_path)
    ins = summarize(tmp_path)
    s = ins.summary
    assert s["view"]["type"] == "nstep" and s["sampler"]["type"] == "prioritized"
    check_against(s, hist, 20)  # stored rewards are per step (n-step sums at sample time)
    stored = [(p + eps) ** alpha for p in raw]
    pr = s["priorities"]
    assert pr["count"] == 40
    assert pr["min"] == pytest.approx(min(stored)) and pr["max"] == pytest.approx(max(stored))
    assert pr["mean"] == pytest.approx(sum(stored) / 40)
    assert pr["sum"] == pytest.approx(sum(stored)) and pr["total"] == pytest.approx(sum(stored))
    assert sorted(ins.arrays["priorities"].tolist()) == pytest.approx(sorted(stored))
    # sampled ages follow the priorities: the newest steps (largest priority) come more often
    assert s["sampled_age"]["mean"] < 9.5


def test_her_dict_obs_checkpoint_without_its_reward_fn(tmp_path: Path) -> None:
    rb.register_function("inspect_test_goal_reward", goal_reward)
    her = rb.HerReplayBuffer(capacity=64, num_envs=2, reward_fn="inspect_test_goal_reward",
                             seed=0)
    goal = np.zeros((2, 3), np.float32)
    pos = np.zeros((2, 3), np.float32)
    hist = History(2)
    for t in range(40):
        nxt = pos + 0.01
        reward = goal_reward(nxt, goal, {})
        trunc = np.array([t % 8 == 7, t % 13 == 12])
        her.add(obs={"observation": pos, "achieved_goal": pos, "desired_goal": goal},
                action=np.zeros((2, 3), np.float32), reward=reward,
                next_obs={"observation": nxt, "achieved_goal": nxt, "desired_goal": goal},
                terminated=np.zeros(2, bool), truncated=trunc)
        hist.add(reward, np.zeros(2, bool), trunc)
        pos = nxt
    rb.save(her, tmp_path)
    # a fresh process knows no function by that name: inspect never needs it
    out = run_cli(str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["buffer_type"] == "HerReplayBuffer" and s["view"]["type"] == "her"
    assert {f["name"] for f in s["fields"]} >= {"obs/observation", "obs/achieved_goal",
                                                "obs/desired_goal"}
    check_against(s, hist, 32)


def test_rows_without_next_obs(tmp_path: Path) -> None:
    rows = rb.ReplayBuffer(capacity=24, num_envs=2, next_obs=False, seed=0)
    hist = History(2)
    rng = np.random.default_rng(5)
    for t in range(15):
        reward, term = rng.random(2), np.array([t % 4 == 3, t % 5 == 4])
        rows.add(obs=np.full((2, 3), t, np.float32), action=np.zeros(2, np.int64),
                 reward=reward, terminated=term, truncated=np.zeros(2, bool))
        hist.add(reward, term, np.zeros(2, bool))
    rb.save(rows, tmp_path)
    s = summarize(tmp_path).summary
    assert "next_obs" not in {f["name"] for f in s["fields"]}
    check_against(s, hist, 12)


def test_memmap_directory(tmp_path: Path) -> None:
    d = tmp_path / "mm"
    buf = rb.PrioritizedReplayBuffer(60, alpha=0.6, beta=0.4, num_envs=2, storage="memmap",
                                     path=d, seed=0)
    hist = fill_lanes(buf, 45, 2, seed=7)
    buf.flush()
    s = summarize(d).summary
    assert s["source"] == "memmap" and s["storage"] == "memmap"
    check_against(s, hist, 30)
    assert s["priorities"]["count"] == 60
    assert s["disk_bytes"] >= sum(f["bytes"] for f in s["fields"])
    assert s["notes"] == []
    len(buf)  # the writer is untouched
    fill_lanes(buf, 2, 2)


# ---------------------------------------------------------------------- command line
def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "replaybank", "inspect", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.fixture
def per_checkpoint(tmp_path: Path) -> tuple[Path, History]:
    buf = rb.PrioritizedReplayBuffer(50, alpha=0.6, beta=0.4, num_envs=2, seed=0)
    hist = fill_lanes(buf, 40, 2, seed=11)
    buf.update_priorities(buf.sample(10).indices, np.arange(10.0))
    d = tmp_path / "ckpt"
    rb.save(buf, d)
    return d, hist


def test_cli_table_json_plot(per_checkpoint: tuple[Path, History], tmp_path: Path) -> None:
    d, hist = per_checkpoint
    table = run_cli(str(d))
    assert table.returncode == 0, table.stderr
    for word in ("PrioritizedReplayBuffer", "capacity", "episode return", "priorities",
                 "obs", "float32", "data age", "disk size", "memory size"):
        assert word in table.stdout
    out = run_cli(str(d), "--json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["format"] == "replaybank.inspect" and s["version"] == 1
    assert set(s) == {"format", "version", "path", "source", "buffer_type", "storage",
                      "capacity", "fill", "fill_fraction", "lanes", "rows_per_lane", "fields",
                      "episodes", "returns", "lengths", "priorities", "age", "sampled_age",
                      "sampler", "view", "disk_bytes", "memory_bytes", "notes"}
    check_against(s, hist, 25)
    assert s == json.loads(json.dumps(summarize(d).summary))
    png = tmp_path / "out.png"
    out = run_cli(str(d), "--plot", str(png), "--quiet")
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_cli_damaged_checkpoint(per_checkpoint: tuple[Path, History], damage: str) -> None:
    d, _ = per_checkpoint
    state = d / "buffer_state.safetensors"
    data = bytearray(state.read_bytes())
    if damage == "flip":
        data[len(data) - 20] ^= 0xFF
    else:
        del data[len(data) // 2:]
    state.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        rb.load(d)
    out = run_cli(str(d))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert str(info.value) in out.stderr
    assert out.stdout == ""


def test_cli_not_a_buffer(tmp_path: Path) -> None:
    out = run_cli(str(tmp_path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "neither a checkpoint" in out.stderr
    out = run_cli(str(tmp_path / "missing"), "--json")
    assert out.returncode == 2 and "no such directory" in out.stderr


WRITER = textwrap.dedent("""
    import sys, numpy as np, replaybank as rb
    buf = rb.ReplayBuffer(80, num_envs=2, storage="memmap", path=sys.argv[1], seed=0)
    rng = np.random.default_rng(0)
    def step(t):
        buf.add(obs=rng.random((2, 3)).astype(np.float32), action=np.zeros(2, np.int64),
                reward=np.ones(2), next_obs=rng.random((2, 3)).astype(np.float32),
                terminated=np.array([t % 5 == 4, t % 7 == 6]), truncated=np.zeros(2, bool))
    for t in range(30):
        step(t)
    print("ready", flush=True)
    sys.stdin.readline()          # inspected meanwhile, the lock held
    for t in range(30, 50):
        step(t)
    buf.flush()
    print(len(buf), flush=True)
""")


def test_cli_memmap_beside_a_live_writer(tmp_path: Path) -> None:
    d = tmp_path / "live"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(d)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(ConfigError, match="open for writing"):  # the writer holds the lock
            rb.open(d)
        out = run_cli(str(d), "--json")
        assert out.returncode == 0, out.stderr
        s = json.loads(out.stdout)
        assert s["source"] == "memmap" and s["fill"] == 60
        assert s["age"] == [{"lane": i, "oldest": 0, "newest": 29, "count": 30}
                            for i in range(2)]
        assert s["lengths"]["count"] == 6 + 4
        assert s["returns"]["max"] == 7.0  # rewards of 1: returns are lengths
        table = run_cli(str(d))
        assert table.returncode == 0 and "ReplayBuffer" in table.stdout
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "80"  # the writer kept working
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def goal_done(achieved: Any, desired: Any, info: Any) -> Any:
    return np.linalg.norm(achieved - desired, axis=-1) < 0.01


def _her_steps(her: Any, steps: int = 9) -> None:
    goal = np.zeros(3, np.float32)
    for t in range(steps):
        pos, nxt = np.full(3, t, np.float32), np.full(3, t + 1, np.float32)
        her.add(obs={"observation": pos, "achieved_goal": pos, "desired_goal": goal},
                action=np.zeros(3, np.float32), reward=-1.0,
                next_obs={"observation": nxt, "achieved_goal": nxt, "desired_goal": goal},
                terminated=False, truncated=t % 4 == 3)


def test_her_view_shows_the_functions_the_files_name(tmp_path: Path) -> None:
    """Inspect opens a HER buffer with stand-ins for its functions (it never runs code
    the files name), but reports the names the checkpoint saved, not the stand-in's."""
    rb.register_function("inspect_test_goal_reward", goal_reward)
    rb.register_function("inspect_test_goal_done", goal_done)
    her = rb.HerReplayBuffer(capacity=32, reward_fn="inspect_test_goal_reward",
                             terminated_fn="inspect_test_goal_done", n_step=2, seed=0)
    _her_steps(her)
    rb.save(her, tmp_path / "ckpt")
    out = run_cli(str(tmp_path / "ckpt"), "--json")  # a fresh process: no such function
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)["view"]
    assert view["reward_fn"] == "inspect_test_goal_reward"
    assert view["terminated_fn"] == "inspect_test_goal_done"
    assert view == json.loads(json.dumps(her.view.config()))
    table = run_cli(str(tmp_path / "ckpt"))
    assert table.returncode == 0 and "_no_relabel" not in table.stdout
    assert "inspect_test_goal_reward" in table.stdout
    plain = rb.HerReplayBuffer(capacity=32, reward_fn="inspect_test_goal_reward", seed=0)
    _her_steps(plain)
    rb.save(plain, tmp_path / "plain")
    s = summarize(tmp_path / "plain").summary
    assert s["view"]["reward_fn"] == "inspect_test_goal_reward"
    assert s["view"]["terminated_fn"] is None
    mm = rb.HerReplayBuffer(capacity=32, reward_fn="inspect_test_goal_reward", seed=0,
                            storage="memmap", path=tmp_path / "mm")
    _her_steps(mm)
    mm.flush()
    s = summarize(tmp_path / "mm").summary
    assert s["source"] == "memmap" and s["view"]["reward_fn"] == "inspect_test_goal_reward"
    mm.close()


# ---------------------------------------------------------------------- other buffer types
def _no_none_rows(table: str) -> None:
    """No summary row prints a missing value as None (rows that do not apply are left out)."""
    assert "None" not in table and "null" not in table.split("fields")[0], table


@pytest.mark.parametrize("mode", [None, "next_step"])
def test_rollout_capacity_fill_storage_and_episodes(tmp_path: Path, mode: str | None) -> None:
    """A RolloutBuffer holds num_steps x num_envs steps in numpy arrays; its episodes are
    counted from the stored steps (NEXT_STEP reset steps left out), checked by a loop."""
    steps, envs = 7, 2
    roll = rb.RolloutBuffer(steps, num_envs=envs, seed=0, autoreset_mode=mode)
    rng = np.random.default_rng(4)
    rewards, ends = rng.normal(size=(6, envs)), rng.random((6, envs)) < 0.3
    for t in range(6):  # 6 of 7 steps
        roll.add(obs=np.zeros((envs, 3), np.float32), action=np.zeros(envs, np.int64),
                 reward=rewards[t], terminated=ends[t], truncated=np.zeros(envs, bool),
                 value=np.zeros(envs, np.float32), log_prob=np.zeros(envs, np.float32))
    rb.save(roll, tmp_path)
    out = run_cli(str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert (s["capacity"], s["fill"], s["lanes"], s["rows_per_lane"]) == (14, 12, 2, 7)
    assert s["fill_fraction"] == pytest.approx(12 / 14) and s["storage"] == "numpy"
    assert s["sampler"] is None and s["view"] is None and s["sampled_age"] is None
    fields = {f["name"]: f["bytes"] for f in s["fields"]}
    assert fields["obs"] == 7 * 2 * 3 * 4 and fields["reward"] == 7 * 2 * 8
    assert s["memory_bytes"] == sum(fields.values())
    # a plain loop: a fresh rollout starts episodes; a step after an end is a reset step
    # (not a transition) in NEXT_STEP mode
    ended, returns, lengths = [], [], []
    for e in range(envs):
        total, n, after_end, count = 0.0, 0, False, 0
        for t in range(6):
            if mode == "next_step" and after_end:
                after_end = False
                continue
            total, n = total + rewards[t, e], n + 1
            if ends[t, e]:
                count += 1
                returns.append(total)
                lengths.append(n)
                total, n, after_end = 0.0, 0, True
        ended.append(count)
    assert s["episodes"] == {"ended": sum(ended), "ended_per_lane": ended,
                             "complete": len(lengths), "in_buffer": sum(ended)}
    assert lengths and s["lengths"]["mean"] == pytest.approx(np.mean(lengths))
    assert s["returns"]["mean"] == pytest.approx(np.mean(returns))
    table = run_cli(str(tmp_path))
    assert table.returncode == 0, table.stderr
    _no_none_rows(table.stdout)
    assert "checkpoint (numpy storage)" in table.stdout and "(85.7%)" in table.stdout
    assert f"{sum(ended)} ended, {len(lengths)} complete in buffer" in table.stdout
    for row in ("sampler", "view", "sampled age"):
        assert f" {row} " not in table.stdout, row


def test_unwritten_replay_buffer_has_no_episodes_and_no_none(tmp_path: Path) -> None:
    rb.save(rb.PrioritizedReplayBuffer(64, num_envs=2, seed=0), tmp_path)
    s = summarize(tmp_path).summary
    assert (s["capacity"], s["fill"], s["lanes"], s["rows_per_lane"]) == (64, 0, 2, 32)
    assert s["episodes"] == {"ended": 0, "ended_per_lane": [0, 0], "complete": 0,
                             "in_buffer": 0}
    assert s["fields"] == [] and s["sampler"]["type"] == "prioritized"
    assert s["notes"] == []
    table = run_cli(str(tmp_path))
    assert table.returncode == 0, table.stderr
    _no_none_rows(table.stdout)
    assert "0 ended, 0 complete in buffer" in table.stdout


def test_sequence_buffer_is_summarized_from_its_steps(tmp_path: Path) -> None:
    seq = rb.SequenceReplayBuffer(60, num_envs=2, sequence_length=4, seed=0)
    hist = fill_lanes(seq, 45, 2, seed=2)
    rb.save(seq, tmp_path)
    s = summarize(tmp_path).summary
    assert s["buffer_type"] == "SequenceReplayBuffer" and s["rows_per_lane"] == 30
    check_against(s, hist, 30)
    assert s["memory_bytes"] == seq.buffer.nbytes() and s["notes"] == []
    table = run_cli(str(tmp_path))
    assert table.returncode == 0, table.stderr
    _no_none_rows(table.stdout)


def test_nan_and_inf_rewards_give_valid_json_a_table_and_a_plot(tmp_path: Path) -> None:
    """A stored NaN or infinite reward makes its episode's return non-finite: the JSON
    stays strict JSON (no NaN/Infinity) and counts them, the table says so, and the plot
    is drawn from the finite values (before: NaN in the JSON, nan in the table, and
    ``--plot`` failed with status 2)."""
    buf = rb.ReplayBuffer(20, seed=0)
    for t, r in enumerate([1.0, np.nan, 1.0, 2.0, 3.0, np.inf, 1.0, 4.0, 4.0]):
        buf.add(obs=np.zeros(2), action=0, reward=r, next_obs=np.ones(2),
                terminated=t in (2, 4, 5, 8), truncated=False)
    d = tmp_path / "ckpt"
    rb.save(buf, d)
    out = run_cli(str(d), "--json")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    # episodes: [1, nan, 1] -> nan, [2, 3] -> 5, [inf] -> inf, [1, 4, 4] -> 9
    assert s["returns"] == {"count": 4, "nonfinite": 2, "mean": 7.0, "std": 2.0,
                            "min": 5.0, "max": 9.0}
    assert s["lengths"]["nonfinite"] == 0 and s["lengths"]["mean"] == 2.25
    table = run_cli(str(d))
    assert table.returncode == 0, table.stderr
    assert "n=4  mean=7  std=2  min=5  max=9  (2 NaN/inf, left out)" in table.stdout
    assert "=nan" not in table.stdout and "=inf" not in table.stdout
    png = tmp_path / "out.png"
    out = run_cli(str(d), "--plot", str(png), "--quiet")
    assert out.returncode == 0, out.stderr
    assert out.stderr == "" and png.read_bytes()[:4] == b"\x89PNG"


def _small(capacity: int = 8) -> rb.ReplayBuffer:
    buf = rb.ReplayBuffer(capacity, seed=0)
    fill_lanes(buf, 5, 1)
    return buf


def test_cli_names_the_fix_for_what_is_not_a_checkpoint_here(tmp_path: Path) -> None:
    """Where PATH holds something else a user saved, the one-line error says how to
    inspect it (before: only "neither a checkpoint nor a memmap buffer is there", or a
    parent directory that is no buffer either)."""
    from replaybank.distributed import checkpoint

    # rb.save with another prefix: name it
    rb.save(_small(), tmp_path / "prefixed", prefix="step100_")
    out = run_cli(str(tmp_path / "prefixed"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--prefix step100_" in out.stderr
    fixed = run_cli(str(tmp_path / "prefixed"), "--prefix", "step100_", "--json")
    assert fixed.returncode == 0 and json.loads(fixed.stdout)["fill"] == 5
    # a ReplayService checkpoint: its shards are rb.save checkpoints
    root = tmp_path / "service"
    checkpoint.begin(root)
    for shard in range(2):
        rb.save(_small(), checkpoint.shard_dir(root, shard), prefix=checkpoint.BUFFER_PREFIX)
    checkpoint.finish(root, {"num_shards": 2})
    out = run_cli(str(root), "--json")
    assert out.returncode == 2 and out.stdout == ""
    assert "ReplayService checkpoint of 2 shards" in out.stderr
    assert f"replaybank inspect {root / 'shard-000'}" in out.stderr
    # a file in a directory that is no buffer: no advice to inspect that directory
    junk = tmp_path / "notes.txt"
    junk.write_text("hello")
    out = run_cli(str(junk))
    assert out.returncode == 2 and "not a checkpoint directory" in out.stderr
    assert f"replaybank inspect {tmp_path}" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_cli_velora_save_names_how_to_inspect_it(tmp_path: Path) -> None:
    """The velora front end's own ``save`` writes rb.save's file names in velora's
    format: the error says so and how to inspect it, and that recipe works."""
    torch = pytest.importorskip("torch")
    from replaybank.compat import velora

    vb = velora.ReplayBuffer(20, 4, 1, 2, seed=0)
    for t in range(12):
        vb.add(torch.rand(4), torch.tensor([t % 2]), 1.0, torch.rand(4), t % 5 == 4,
               torch.zeros(2))
    vb.save(tmp_path / "v")
    out = run_cli(str(tmp_path / "v"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "velora front end's save" in out.stderr and "rb.save(buf.core, DIR)" in out.stderr
    meta = json.loads((tmp_path / "v" / "buffer_metadata.json").read_text())
    again = velora.ReplayBuffer.load(tmp_path / "v" / "buffer_state.safetensors", meta)
    rb.save(again.core, tmp_path / "core")
    s = summarize(tmp_path / "core").summary
    assert s["fill"] == 12 and s["returns"]["mean"] == 5.0 and s["episodes"]["complete"] == 2


def test_empty_prioritized_buffer_shows_no_priorities_yet(tmp_path: Path) -> None:
    """A prioritized buffer saved before its first add reports priorities as one saved
    after clear() does (count 0, table row "-"); before, null and no row, as for a
    sampler without priorities."""
    never = rb.ReplayBuffer(16, seed=0, sampler=rb.PrioritizedSampler())
    cleared = rb.ReplayBuffer(16, seed=0, sampler=rb.PrioritizedSampler())
    fill_lanes(cleared, 5, 1)
    cleared.clear()
    rb.save(never, tmp_path / "never")
    rb.save(cleared, tmp_path / "cleared")
    want = {"count": 0, "min": None, "mean": None, "max": None, "sum": 0.0, "total": 0.0}
    assert summarize(tmp_path / "cleared").summary["priorities"] == want
    assert summarize(tmp_path / "never").summary["priorities"] == want
    table = run_cli(str(tmp_path / "never"))
    assert table.returncode == 0 and "│ priorities " in table.stdout


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_segment_sums_match_a_plain_loop(data: st.DataObject) -> None:
    """The episode-return kernel against summing each segment in a loop (NaN and inf
    included: each stays in its own segment)."""
    from replaybank.ops.segments import segment_sums

    n = data.draw(st.integers(1, 40))
    values = np.array(data.draw(st.lists(
        st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=n, max_size=n)))
    cuts = sorted(data.draw(st.sets(st.integers(0, n), min_size=2, max_size=8)))
    keep = data.draw(st.lists(st.booleans(), min_size=len(cuts) - 1, max_size=len(cuts) - 1))
    segs = [(a, b - 1) for a, b, k in zip(cuts[:-1], cuts[1:], keep, strict=True) if k]
    starts = np.array([a for a, _ in segs], np.int64)
    ends = np.array([b for _, b in segs], np.int64)
    with np.errstate(invalid="ignore", over="ignore"):  # (inf - inf: NaN, as expected)
        want = np.array([values[a:b + 1].astype(np.float64).sum() for a, b in segs])
    np.testing.assert_allclose(segment_sums(values, starts, ends), want, rtol=1e-12,
                               equal_nan=True)
