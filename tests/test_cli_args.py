"""Bad command-line arguments end in a usage error (status 2, a message naming the flag,
the value and the fix), never in a traceback, and before any file is read or any output
is printed: ``replaybank bench``, ``inspect`` and ``demo``, through their entry point."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest

import replaybank as rb
from replaybank.cli.main import main


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    buf = rb.ReplayBuffer(16, num_envs=2, seed=0)
    for t in range(10):
        buf.add(obs=np.full((2, 3), t, np.float32), action=np.zeros(2, np.int64),
                reward=np.ones(2, np.float32), next_obs=np.full((2, 3), t + 1, np.float32),
                terminated=np.array([t % 4 == 3, False]), truncated=np.zeros(2, bool))
    d = tmp_path_factory.mktemp("ckpt")
    rb.save(buf, d)
    return d


def _usage_error(capsys: pytest.CaptureFixture[str], status: int, *words: str) -> str:
    out = capsys.readouterr()
    assert status == 2, out
    assert out.out == "" and "Traceback" not in out.err
    for word in words:
        assert word in out.err, (word, out.err)
    return out.err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "big"])
def test_bench_scale_must_be_a_finite_positive_number(value: str,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    status = main(["bench", "--quiet", "--cases", "add", f"--scale={value}"])
    _usage_error(capsys, status, f"argument --scale: {value!r}: must be a finite number > 0; "
                                 "pass e.g. --scale 0.1")


@pytest.mark.parametrize("value", ["0", "-2", "1.5"])
def test_bench_repeats_must_be_a_positive_int(value: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["bench", "--quiet", "--cases", "add", f"--repeats={value}"])
    _usage_error(capsys, status, f"argument --repeats: {value!r}: must be an int >= 1; "
                                 "pass e.g. --repeats 5")


@pytest.mark.parametrize(("flag", "value", "words"), [
    ("--cases", "adds", "argument --cases: unknown case 'adds' (did you mean 'add'?); choose "
                        "from add, extend, sample, per,"),
    ("--cases", "add,foo,bar", "argument --cases: unknown cases 'foo', 'bar'; choose from add,"),
    ("--peers", "cprb", "argument --peers: unknown peer 'cprb' (did you mean 'cpprb'?); choose "
                        "from cpprb, sb3, tianshou, torchrl"),
    # no case at all ran nothing and printed an empty table, status 0
    ("--cases", "", "argument --cases: '' names no case; pass e.g. --cases add, or leave "
                    "--cases out for all of them"),
    ("--cases", " , ", "argument --cases: ' , ' names no case"),
])
def test_bench_names_are_checked_and_the_flag_named(flag: str, value: str, words: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["bench", "--quiet", "--scale", "0.001", "--repeats", "1", f"{flag}={value}"])
    err = _usage_error(capsys, status, "replaybank bench: error: " + words)
    assert err.count("\n") == 3, err  # the usage (2 lines) and one line of error


@pytest.mark.parametrize("value", ["-5", "1.5", "many"])
def test_inspect_draws_must_be_a_non_negative_int(value: str, checkpoint: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["inspect", "-q", str(checkpoint), f"--draws={value}"])
    _usage_error(capsys, status, f"argument --draws: {value!r}: must be an int >= 0; pass "
                                 "e.g. --draws 4096")


def test_inspect_draws_zero_draws_nothing(checkpoint: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--json", str(checkpoint), "--draws", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["sampled_age"] is None


def test_inspect_plot_into_a_missing_directory_prints_nothing(
        checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nope" / "out.png"
    status = main(["inspect", str(checkpoint), "--plot", str(out)])
    _usage_error(capsys, status, f"argument --plot: '{out}': directory {out.parent} does not "
                                 "exist; create it or pass e.g. --plot inspect.png")
    status = main(["inspect", str(checkpoint), "--plot", str(tmp_path)])
    _usage_error(capsys, status, f"'{tmp_path}': is a directory; pass a file name, e.g. "
                                 f"--plot {tmp_path / 'inspect.png'}")
    status = main(["inspect", str(checkpoint), "--plot", str(tmp_path / "out.xyz")])
    _usage_error(capsys, status, "matplotlib cannot write '.xyz' files; use one of", ".png",
                 f"--plot {tmp_path / 'out.png'}")
    assert list(tmp_path.iterdir()) == []


def test_inspect_plot_that_fails_to_write_is_an_error_not_a_traceback(
        checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails after the checks (a full disk) ends with status 2 and the fix."""
    import replaybank.cli.inspect as cli_inspect

    def full_disk(inspection: object, out: object) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cli_inspect, "plot", full_disk)
    status = main(["inspect", "--json", str(checkpoint), "--plot", str(tmp_path / "p.png")])
    out = capsys.readouterr()
    assert status == 2 and "Traceback" not in out.err
    assert json.loads(out.out)["buffer_type"] == "ReplayBuffer"  # the summary came first
    assert f"--plot {tmp_path / 'p.png'}: cannot write it" in out.err
    assert "free disk space and try again" in out.err


def test_inspect_plot_to_a_good_path_still_writes(checkpoint: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "out.png"
    assert main(["inspect", "-q", str(checkpoint), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("flag", "value", "rule"), [
    ("--num-envs", "0", "an int >= 1"), ("--steps", "-5", "an int >= 1"),
    ("--eval-episodes", "0", "an int >= 1"), ("--progress-every", "nan", "a finite number >= 0"),
    ("--target", "inf", "a finite number"), ("--seed", "-1", "an int >= 0"),
])
def test_demo_numbers_are_checked_when_parsed(flag: str, value: str, rule: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["demo", f"{flag}={value}"])
    _usage_error(capsys, int(str(info.value.code)), f"argument {flag}: {value!r}: must be {rule}")


def test_demo_out_that_cannot_be_a_directory_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--out`` naming a file (or a path under one) failed with FileExistsError's
    traceback once torch was imported; now it is refused when parsed."""
    taken = tmp_path / "results.txt"
    taken.write_text("not a directory")
    for out, words in [(taken, "is a file; pass a directory, e.g. --out replaybank_demo_out"),
                       (taken / "run1", f"{taken} is a file, so the directory cannot be "
                                        "created")]:
        with pytest.raises(SystemExit) as info:
            main(["demo", "--steps", "10", "--out", str(out)])
        _usage_error(capsys, int(str(info.value.code)), f"argument --out: {str(out)!r}: {words}")
    assert taken.read_text() == "not a directory"


def test_a_reader_that_goes_away_ends_the_output_quietly(checkpoint: Path) -> None:
    """``replaybank inspect --json | head``: the pipe's reader is gone before the first
    write; the command stops with status 1 and no traceback or 'Exception ignored'."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    read, write = os.pipe()
    os.close(read)  # every write to the pipe fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "replaybank", "inspect", str(checkpoint),
                               "--json"], stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=120, check=False, cwd=root, env=env)
    finally:
        os.close(write)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
