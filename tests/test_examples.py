"""Each example script runs for a few hundred steps (CI smoke test)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

CASES = {
    "dqn_per_cartpole.py": ["--total-timesteps", "400", "--learning-starts", "100"],
    "ppo_cartpole.py": ["--total-timesteps", "512", "--num-steps", "64", "--eval-every", "256"],
    "sac_pendulum.py": ["--total-timesteps", "300", "--learning-starts", "150",
                        "--batch-size", "32"],
}


SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))


def test_the_three_examples_exist() -> None:
    assert set(CASES) <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs(script: str, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    threads = torch.get_num_threads()
    # every example takes --steps; the ones listed in CASES get tailored short settings
    monkeypatch.setattr(sys, "argv", [script, *CASES.get(script, ["--steps", "300"])])
    try:
        runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    if script in CASES:
        assert "done:" in out
