"""The Ape-X example on shared memory: collector processes + one learner, no Ray."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "apex_shared_cartpole.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("apex_shared_cartpole", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["apex_shared_cartpole"] = mod
    if str(SCRIPT.parent) not in sys.path:  # spawned actors import it by this name
        sys.path.insert(0, str(SCRIPT.parent))
    spec.loader.exec_module(mod)
    return mod


def test_epsilon_ladder_follows_apex() -> None:
    ladder = _example().epsilon_ladder(4, base=0.4, alpha=7.0)
    assert ladder[0] == pytest.approx(0.4) and ladder[-1] == pytest.approx(0.4 ** 8)
    assert ladder == sorted(ladder, reverse=True)


def test_actors_and_learner_run_together() -> None:
    out = _example().main(["--actors", "2", "--steps", "2500", "--learning-starts", "500",
                           "--eval-every", "1200", "--eval-episodes", "2"])
    assert out["updates"] > 100  # the learner sampled what the actor processes wrote
    assert [s for s, _ in out["evals"]][:1] and out["evals"][0][0] >= 1200


@pytest.mark.slow
def test_apex_on_shared_memory_solves_cartpole() -> None:
    out = _example().main(["--actors", "3", "--steps", "60000"])
    assert out["solved_at"] is not None, out["evals"]
