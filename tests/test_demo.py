"""Smoke tests of the ``replaybank`` CLI and the DQN demo (a few hundred steps)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")
pytest.importorskip("matplotlib")

from replaybank.cli import demo as demo_mod
from replaybank.cli.dqn import DQNAgent, DQNConfig
from replaybank.cli.main import main


@pytest.mark.parametrize("buffer", ["per", "uniform", "nstep"])
def test_demo_smoke(buffer: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["demo", "--buffer", buffer, "--steps", "400", "--seed", "1", "--out",
                 str(out), "--no-progress", "--eval-every", "200", "--eval-episodes", "2"])
    assert code == 0
    text = capsys.readouterr().out
    for key in ("episodes seen", "buffer memory", "best eval", "final eval",
                "checkpoint reloads identically", "True"):
        assert key in text
    png = out / "learning_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any((out / "buffer").iterdir())


def test_run_demo_result(tmp_path: Path) -> None:
    args = demo_mod.build_parser().parse_args(
        ["--steps", "300", "--out", str(tmp_path), "--no-progress", "--eval-every", "150",
         "--eval-episodes", "2", "--seed", "2"])
    res = demo_mod.run_demo(args)
    assert res.env_steps >= 300 and res.updates > 0
    assert len(res.evals) == 2 and res.checkpoint_identical is True
    assert 0 < res.fill <= res.env_steps and res.episodes_seen == len(res.episode_returns)
    assert res.best_eval == max(r for _, r in res.evals) and res.final_eval == res.evals[-1][1]
    assert all(r >= 8 for r in res.episode_returns)  # a CartPole episode lasts >= 8 steps


@pytest.mark.parametrize("num_envs", [1, 3, 4])
def test_every_number_of_envs_trains_one_update_per_two_env_steps(num_envs: int,
                                                                  tmp_path: Path) -> None:
    """``--num-envs 1`` trained nothing (``n_envs // 2`` updates per step of the envs: 0)
    and 3 envs got one update per 3 steps. 400 steps, learning from step 200 (the steps of
    the envs' step that reaches it count): 100 updates, up to 2 more."""
    args = demo_mod.build_parser().parse_args(
        ["--steps", "400", "--num-envs", str(num_envs), "--out", str(tmp_path), "--quiet",
         "--eval-every", "400", "--eval-episodes", "1", "--no-early-stop"])
    res = demo_mod.run_demo(args)
    assert res.env_steps - num_envs < 400 <= res.env_steps
    assert 100 <= res.updates <= 102, res.updates


def test_dqn_update_moves_q_towards_target() -> None:
    import replaybank as rb

    agent = DQNAgent(2, 2, DQNConfig(lr=1e-2, n_step=1), seed=0)
    buf = rb.ReplayBuffer(64, seed=0)
    for t in range(32):
        buf.add(obs=np.array([t % 2, 1], np.float32), action=t % 2, reward=1.0,
                next_obs=np.array([0, 0], np.float32), terminated=True, truncated=False)
    batch = buf.sample(32)
    losses = [agent.update(batch)[0] for _ in range(200)]
    assert losses[-1] < 0.1 * losses[0]
    _, td = agent.update(batch)
    assert td.shape == (32,) and np.all(td < 0.2)  # Q(s, a) -> 1 for terminal steps


def test_cli_help_and_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0 and "demo" in capsys.readouterr().out
    assert main(["nope"]) == 2 and "unknown command" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--buffer", "bogus"])


@pytest.mark.parametrize(("missing", "argv", "line"), [
    ("torch", ["demo", "--steps", "10", "--quiet"],
     'replaybank demo: error: torch is required for this feature but is not installed; run: '
     'pip install "replaybank[torch]" (everything replaybank demo needs: pip install '
     '"replaybank[demo]")'),
    ("matplotlib", ["demo", "--steps", "10", "--quiet"],
     'replaybank demo: error: matplotlib is required for this feature but is not installed; '
     'run: pip install "replaybank[cli]" (everything replaybank demo needs: pip install '
     '"replaybank[demo]")'),
    ("rich", ["inspect", "{ckpt}"],
     'replaybank inspect: error: rich is required for this feature but is not installed; run: '
     'pip install "replaybank[cli]"'),
])
def test_a_missing_extra_is_one_line_not_a_traceback(missing: str, argv: list[str], line: str,
                                                     tmp_path: Path) -> None:
    """``pip install replaybank`` alone, then ``replaybank demo`` (or ``inspect`` with its
    table): status 1 and one line naming the extra, before any training (the demo's plot
    needs matplotlib at its end: it is asked for at the start)."""
    import replaybank as rb

    rb.ReplayBuffer(8, seed=0).save(tmp_path / "ckpt")
    argv = [a.replace("{ckpt}", str(tmp_path / "ckpt")) for a in argv]
    if argv[0] == "demo":
        argv += ["--out", str(tmp_path / "out")]
    code = (f"import sys; sys.modules[{missing!r}] = None\n"  # as if not installed
            "from replaybank.cli.main import main\n"
            f"raise SystemExit(main({argv!r}))\n")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=root, check=False)
    assert done.returncode == 1, done.stderr
    assert done.stderr == line + "\n" and done.stdout == ""
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_console_entry_point_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "replaybank.cli.main", "demo", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--buffer" in out.stdout and "--no-progress" in out.stdout


def test_quiet_turns_the_progress_bar_off_and_a_pipe_does_too() -> None:
    import io

    from replaybank.cli.demo import build_parser
    from replaybank.integrations.progress import progress_enabled

    assert build_parser().parse_args(["--quiet"]).no_progress is True
    assert build_parser().parse_args(["--no-progress"]).no_progress is True
    assert build_parser().parse_args([]).no_progress is False
    assert progress_enabled(False, io.StringIO()) is False  # not a terminal
    assert progress_enabled(True) is False


def test_piped_demo_prints_progress_lines_while_it_runs(tmp_path: Path) -> None:
    """With stdout a pipe (CI logs, nohup) there is no bar: plain lines come every
    ``--progress-every`` seconds while the run goes on, not only the summary at the end."""
    cmd = [sys.executable, "-m", "replaybank", "demo", "--steps", "800", "--eval-every", "400",
           "--eval-episodes", "2", "--seed", "3", "--out", str(tmp_path / "out"),
           "--progress-every", "0.2"]
    err = (tmp_path / "stderr.txt").open("w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    arrived: list[tuple[str, bool]] = []  # (line, whether the demo was still running)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            arrived.append((line.rstrip("\n"), proc.poll() is None))
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        err.close()
    assert proc.returncode == 0, (tmp_path / "stderr.txt").read_text()[-2000:]
    text = [line for line, _ in arrived]
    assert text[0] == "DQN per: training for 800 env steps", text[:3]
    progress = [(line, live) for line, live in arrived
                if line.startswith("DQN per: ") and " env steps (" in line]
    assert len(progress) >= 2, text
    assert all(live for _, live in progress)  # printed (and flushed) during the run
    assert any("steps/s" in line and "loss" in line for line, _ in progress), progress
    assert sum("greedy evaluation at" in line for line in text) == 2
    assert any("checkpoint reloads identically" in line for line in text)  # the summary


def test_quiet_demo_prints_only_the_summary(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--steps", "200", "--out", str(tmp_path), "--quiet",
                 "--eval-every", "200", "--eval-episodes", "1", "--progress-every", "0"]) == 0
    assert "env steps (" not in capsys.readouterr().out
