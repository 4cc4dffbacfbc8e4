"""``replaybank bench``: the command runs its workers and reports every installed peer."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from typing import Any

import pytest

PEER_MODULES = {"cpprb": "cpprb", "sb3": "stable_baselines3", "tianshou": "tianshou",
                "torchrl": "torchrl"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replaybank", "bench", *args],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    proc = _run("--scale", "0.002", "--cases", "add,sample", "--repeats", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def test_structure(report: dict[str, Any]) -> None:
    assert report["format"] == "replaybank.bench" and report["version"] == 1
    assert report["cases"] == ["add", "sample"]
    assert report["libraries"][0] == "replaybank"
    assert 1000 <= report["capacity"] <= 2000
    keys = {"case", "library", "version", "us_per_call", "ratio", "na", "error"}
    assert len(report["results"]) == 2 * len(report["libraries"])
    for r in report["results"]:
        assert set(r) == keys


def test_every_installed_peer_has_numbers(report: dict[str, Any]) -> None:
    installed = [p for p, m in PEER_MODULES.items() if importlib.util.find_spec(m)]
    assert report["libraries"] == ["replaybank", *installed]
    for r in report["results"]:
        assert r["error"] is None, r
        assert r["us_per_call"] > 0 and r["ratio"] > 0, r
        if r["library"] == "replaybank":
            assert r["ratio"] == 1.0
    skipped = {s["library"]: s["install"] for s in report["skipped"]}
    assert skipped == {p: f"pip install {'stable-baselines3' if p == 'sb3' else p}"
                       for p in PEER_MODULES if p not in installed}


@pytest.mark.skipif(importlib.util.find_spec("tianshou") is not None,
                    reason="tianshou is installed")
def test_missing_peer_is_listed_with_pip_line() -> None:
    proc = _run("--scale", "0.002", "--cases", "add", "--repeats", "1", "--peers", "tianshou")
    assert proc.returncode == 0, proc.stderr
    assert "tianshou skipped" in proc.stdout and "pip install tianshou" in proc.stdout
    assert proc.stdout.splitlines()[-1].endswith("(pip install tianshou)")
    proc = _run("--scale", "0.002", "--cases", "add", "--repeats", "1", "--peers", "tianshou",
                "--json")
    rep = json.loads(proc.stdout)
    assert rep["libraries"] == ["replaybank"]
    assert rep["skipped"] == [{"library": "tianshou", "reason": "tianshou is not installed",
                               "install": "pip install tianshou"}]
    assert [r["library"] for r in rep["results"]] == ["replaybank"]


def test_help_and_bad_arguments() -> None:
    proc = _run("--help")
    assert proc.returncode == 0
    for word in ("--peers", "--cases", "--scale", "--json", "--quiet"):
        assert word in proc.stdout
    assert _run("--cases", "nope").returncode == 2
    assert _run("--peers", "nope").returncode == 2


def test_sb3_per_is_not_applicable() -> None:
    if importlib.util.find_spec("stable_baselines3") is None:
        pytest.skip("stable-baselines3 is not installed")
    from replaybank.cli.bench_worker import run

    rec = run("sb3", "per", 1024, 1)
    assert rec["us_per_call"] is None and "prioritized" in rec["na"]
