"""examples/apex_cartpole.py: Ape-X on the sharded service solves CartPole (slow)."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")
pytest.importorskip("ray")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "apex_cartpole.py"


@pytest.mark.slow
def test_apex_example_reaches_the_demo_threshold(ray_cluster: Any) -> None:
    main = runpy.run_path(str(EXAMPLE))["main"]
    out = main(["--actors", "4", "--shards", "2", "--steps", "40000", "--seed", "0"])
    assert out["solved_at"] is not None, out["evals"]
    assert max(score for _, score in out["evals"]) >= 475.0
    assert out["size"] > 0 and out["updates"] > 1000
