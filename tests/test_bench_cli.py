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
    keys = {"case", "library", "version", "us_per_call", "ratio", "na", "error", "floor_us",
            "over_floor"}
    assert len(report["results"]) == 2 * len(report["libraries"])
    for r in report["results"]:
        assert set(r) == keys
    assert report["build"].startswith("C modules: ")  # (the line of replaybank --version)


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


# ---- the floor column: sample against numpy take gathers of the same fields


def test_sample_rows_carry_their_floor(report: dict[str, Any]) -> None:
    assert report["floors"] == {"sample": report["floors"]["sample"]}
    assert "ndarray.take" in report["floors"]["sample"]
    assert report["no_floor"] == {} and report["floor_target"] == 1.1
    rows = [r for r in report["results"] if r["case"] == "sample"]
    floor = rows[0]["floor_us"]
    assert rows[0]["library"] == "replaybank" and floor > 0
    for r in rows:  # one floor per case, timed in replaybank's worker; every row over it
        assert r["floor_us"] == floor
        assert r["over_floor"] == pytest.approx(r["us_per_call"] / floor)
    for r in report["results"]:
        if r["case"] == "add":
            assert r["floor_us"] is None and r["over_floor"] is None


def test_floor_column_and_per_note_in_the_table() -> None:
    proc = _run("--scale", "0.002", "--cases", "sample,per", "--repeats", "1", "--peers", "")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    head = next(ln for ln in lines if ln.startswith("case "))
    assert head.split() == ["case", "replaybank", "floor"]
    sample = next(ln for ln in lines if ln.startswith("sample ")).split()
    us, floor, over = float(sample[1]), float(sample[2]), sample[4].rstrip("!")
    assert sample[3] == "(rb" and over.endswith("x)")
    assert float(over[:-2]) == pytest.approx(us / floor, abs=0.02)
    assert sample[4].endswith("!") == (float(over[:-2]) > 1.1)
    per = next(ln for ln in lines if ln.startswith("per ")).split()
    assert per[2] == "-"
    assert any(ln.startswith("floor (sample): ") and "target <= 1.1" in ln for ln in lines)
    assert any(ln.startswith("per: no floor: ") and "sum tree" in ln for ln in lines)
    proc = _run("--scale", "0.002", "--cases", "sample,per", "--repeats", "1", "--peers", "",
                "--json")
    rep = json.loads(proc.stdout)
    assert set(rep["floors"]) == {"sample"} and set(rep["no_floor"]) == {"per"}
    per_row = next(r for r in rep["results"] if r["case"] == "per")
    assert per_row["floor_us"] is None and per_row["us_per_call"] > 0


def test_no_floor_column_without_a_floored_case() -> None:
    proc = _run("--scale", "0.002", "--cases", "add", "--repeats", "1", "--peers", "")
    assert proc.returncode == 0, proc.stderr
    head = next(ln for ln in proc.stdout.splitlines() if ln.startswith("case "))
    assert head.split() == ["case", "replaybank"] and "floor" not in proc.stdout


@pytest.mark.parametrize("envs", [1, 4])
def test_filled_buffers_are_sequential_per_lane(envs: int) -> None:
    """The benchmarks' filled buffer keeps about one side obs per episode end and lane (as
    a vector env's buffer does), not one per step: each lane is a stream of its own."""
    import numpy as np

    from replaybank.cli.bench_harness import fill_stream, filled_replaybank

    cap = 8192
    buf = filled_replaybank(cap, envs)
    s = fill_stream(cap, envs)
    assert s["obs"].shape == (cap // envs, envs, 17) and s["obs"].dtype == np.float32
    ends = int((s["terminated"] | s["truncated"]).sum())
    assert ends >= envs  # episodes of 1000 steps end in every lane
    assert len(buf) == cap and buf.table.side_in_use() <= ends + envs
    # within a lane, next_obs is the next step's obs except at an episode end
    same = np.all(s["next_obs"][:-1] == s["obs"][1:], axis=-1)
    assert np.array_equal(~same, (s["terminated"] | s["truncated"])[:-1])


# ---- the input-kind cases (float64, int, torch inputs): every library takes the same objects

INPUT_CASES = ("add-x4", "add-f64", "add-f64x4", "add-int-flags", "add-torch")


def test_input_cases_are_listed_and_run_from_the_command() -> None:
    from replaybank.cli.bench_harness import CASES
    from replaybank.cli.bench_harness import INPUT_CASES as HARNESS_CASES

    assert tuple(HARNESS_CASES) == INPUT_CASES and set(INPUT_CASES) <= set(CASES)
    proc = _run("--scale", "0.002", "--cases", "add-f64,add-torch", "--repeats", "1",
                "--peers", "", "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["cases"] == ["add-f64", "add-torch"] and rep["libraries"] == ["replaybank"]
    for r in rep["results"]:
        assert r["error"] is None and r["us_per_call"] > 0 and r["ratio"] == 1.0, r
    proc = _run("--scale", "0.002", "--cases", "add-int-flags", "--repeats", "1", "--peers", "")
    assert proc.returncode == 0, proc.stderr
    assert any(line.startswith("add-int-flags ") for line in proc.stdout.splitlines())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SB3's np.array(tensor), numpy 2
@pytest.mark.parametrize("case", INPUT_CASES)
def test_input_cases_time_every_installed_library(case: str) -> None:
    from replaybank.cli.bench_worker import run

    installed = [p for p in ("cpprb", "sb3") if importlib.util.find_spec(PEER_MODULES[p])]
    for lib in ("replaybank", *installed):
        rec = run(lib, case, 1024, 1)
        assert rec["na"] is None and rec["us_per_call"] > 0, rec
        assert len(rec["repeats_us"]) == 1


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    import numpy as np

    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    else:
        assert a == b, where


@pytest.mark.parametrize("envs", [1, 4])
def test_input_kinds_carry_the_same_transitions(envs: int) -> None:
    """Every kind stores bit for bit what the exact kind stores (add and extend), so the
    benchmark times the same work in every row."""
    pytest.importorskip("torch")
    import replaybank as rb
    from replaybank.cli.bench_harness import INPUT_KINDS, SPEC, input_chunks, input_steps

    def state(kind: str, extend: bool) -> dict[str, Any]:
        buf = rb.ReplayBuffer(512 * envs, num_envs=envs, seed=0, spec=SPEC)
        if extend:
            for part in input_chunks(kind, 2, envs, chunk=100):
                buf.extend(**part)
        else:
            for step in input_steps(kind, 150, envs):
                buf.add(**step)
        sd: dict[str, Any] = buf.state_dict()
        return sd

    for extend in (False, True):
        base = state("exact", extend)
        assert base["metadata"]["size"] == (200 if extend else 150) * envs
        for kind in INPUT_KINDS[1:]:
            _assert_same(base, state(kind, extend), f"{kind} extend={extend}")


def test_input_kinds_have_the_documented_types() -> None:
    torch = pytest.importorskip("torch")
    import numpy as np

    from replaybank.cli.bench_harness import input_chunks, input_steps

    def one(kind: str, envs: int) -> dict[str, Any]:
        out: dict[str, Any] = input_steps(kind, 1, envs)[0]
        return out

    assert type(one("exact", 1)["reward"]) is float and one("exact", 1)["terminated"] is False
    assert one("exact", 4)["reward"].dtype == np.float32
    f64 = one("f64 obs+reward", 1)
    assert f64["obs"].dtype == np.float64 and type(f64["reward"]) is np.float64
    assert one("f64 reward", 4)["reward"].dtype == np.float64
    assert one("f64 reward", 4)["obs"].dtype == np.float32
    assert type(one("int flags", 1)["terminated"]) is int
    assert one("int flags", 4)["truncated"].dtype == np.int64
    sc = one("scalars", 1)
    assert type(sc["reward"]) is np.float32 and type(sc["terminated"]) is np.bool_
    sc4 = one("scalars", 4)
    assert type(sc4["reward"]) is list and type(sc4["reward"][0]) is float
    assert type(sc4["terminated"][0]) is bool
    assert type(one("lists", 1)["action"]) is list and len(one("lists", 1)["action"]) == 6
    assert np.asarray(one("lists", 4)["action"]).shape == (4, 6)
    t1, t4 = one("torch", 1), one("torch", 4)
    assert isinstance(t1["obs"], torch.Tensor) and type(t1["reward"]) is float
    assert t4["terminated"].dtype == torch.bool and t4["reward"].dtype == torch.float32
    ta = one("torch action", 4)
    assert isinstance(ta["action"], torch.Tensor) and isinstance(ta["obs"], np.ndarray)
    for envs in (1, 4):
        nc = one("non-contiguous", envs)
        assert not nc["obs"].flags.c_contiguous and not nc["action"].flags.c_contiguous
        assert nc["obs"].dtype == np.float32 and nc["obs"].shape == ((17,) if envs == 1
                                                                     else (4, 17))
    part = input_chunks("non-contiguous", 1, 4, chunk=8)[0]
    assert part["obs"].shape == (8, 4, 17) and not part["obs"].flags.c_contiguous
    with pytest.raises(ValueError, match="input kind"):
        input_steps("nope", 1)


def test_window_cases_carry_their_floors() -> None:
    """``sequences`` and ``framestack``: replaybank's windows beside the same windows
    gathered by hand; the peers' rows say why they have none."""
    proc = _run("--scale", "0.002", "--cases", "sequences,framestack", "--repeats", "2",
                "--json", "--peers", "cpprb,sb3")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert set(rep["floors"]) == {"sequences", "framestack"}
    assert "ndarray.take" in rep["floors"]["sequences"]
    assert "five-frame windows" in rep["floors"]["framestack"]
    for case in ("sequences", "framestack"):
        rows = [r for r in rep["results"] if r["case"] == case]
        ours = rows[0]
        assert ours["library"] == "replaybank" and ours["error"] is None
        assert ours["us_per_call"] > 0 and ours["floor_us"] > 0
        assert ours["over_floor"] == pytest.approx(ours["us_per_call"] / ours["floor_us"])
        for r in rows[1:]:  # the installed peers: n/a with the reason
            assert r["us_per_call"] is None and r["library"] in r["na"].replace(
                "stable-baselines3", "sb3")


def test_window_floors_gather_what_replaybank_returns() -> None:
    """The floors' windows have the batch's shapes, and the sequence floor's next_obs
    is the obs window one step on (what a window without episode ends holds)."""
    from replaybank.cli import bench_windows as bw

    buf = bw.sequence_buffer(4_096)
    sb = bw.sequence_sample(buf)()
    obs, nxt, act, rew, term, trunc = bw.sequence_floor(buf)()
    assert obs.shape == sb.obs.shape and nxt.shape == sb.next_obs.shape
    assert act.shape == sb.action.shape and rew.shape == sb.reward.shape
    assert term.shape == trunc.shape == sb.terminated.shape
    assert (nxt[:, :-1] == obs[:, 1:]).all()
    fs = bw.framestack_buffer(2_048)
    b = bw.framestack_sample(fs)()
    f_obs, f_nxt, f_act, *_ = bw.framestack_floor(fs)()
    assert f_obs.shape == b.obs.shape and f_nxt.shape == b.next_obs.shape
    assert f_act.shape == b.action.shape and (f_nxt[:, :-1] == f_obs[:, 1:]).all()
