"""Small things a user meets on day one (issue 18): the command line, the licence, the
extras, types of the lazily exported names, reward dtype, seeds in configs, device errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

import replaybank as rb
from replaybank.cli.demo import build_parser
from replaybank.cli.main import main


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


# --- command line -------------------------------------------------------------------------


def test_python_dash_m_replaybank_is_the_cli() -> None:
    out = _run("-m", "replaybank", "--help")
    assert out.returncode == 0, out.stderr
    assert "demo" in out.stdout and out.stdout == _run("-m", "replaybank.cli.main").stdout
    bad = _run("-m", "replaybank", "nope")
    assert bad.returncode == 2 and "unknown command" in bad.stderr


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([flag]) == 0
    assert capsys.readouterr().out == f"replaybank {rb.__version__}\n"


def test_version_matches_the_metadata() -> None:
    from importlib.metadata import version

    assert rb.__version__ == version("replaybank")
    out = _run("-m", "replaybank", "--version")
    assert out.returncode == 0 and out.stdout.strip() == f"replaybank {rb.__version__}"


def test_demo_help_is_plain_text_with_defaults() -> None:
    text = " ".join(build_parser().format_help().split())  # argparse wraps lines
    assert "`" not in text
    for default in ("(default: per)", "(default: 50000)", "(default: 0)", "(default: 4)",
                    "(default: 2000)", "(default: 10)", "(default: 475.0)",
                    "(default: replaybank_demo_out)", "(default: 1)"):
        assert default in text, default
    # every option has a help line
    parser = build_parser()
    assert all(a.help for a in parser._actions)
