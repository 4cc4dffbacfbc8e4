"""A user's typed script passes ``mypy --strict`` against replaybank as the README installs it.

The README installs the package editable (``pip install torch==2.13.0 -e ".[dev]"``). Type
checkers read the installed packages' paths, ``.pth`` files included, but run no import
hooks, so an editable install must put the project root on the path with a plain ``.pth``
file (``pyproject.toml``: ``[tool.setuptools] package-dir``), not through setuptools' import
hook. The script below uses what a training loop does (add, sample, PER priorities,
``to_torch``, save/load, configs) with the types a user writes, and no ``type: ignore``:
``Batch[torch.Tensor]`` fields are tensors, ``rb.load`` / ``rb.from_config`` return one of
the package's buffer types (narrowed with ``isinstance``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import replaybank

ROOT = Path(__file__).resolve().parents[1]

USER_SCRIPT = '''\
"""A user's typed training-loop fragment: add, sample, PER, to_torch, save/load, configs."""

from __future__ import annotations

import tempfile

import numpy as np
import torch
from numpy.typing import NDArray

import replaybank as rb


def fill(buf: rb.ReplayBuffer, steps: int) -> None:
    obs = np.zeros(4, np.float32)
    for t in range(steps):
        next_obs = np.random.rand(4).astype(np.float32)
        buf.add(obs=obs, action=t % 2, reward=1.0, next_obs=next_obs, terminated=False,
                truncated=t % 50 == 49)
        obs = next_obs


def td_errors(batch: rb.Batch[torch.Tensor]) -> NDArray[np.float64]:
    q: torch.Tensor = batch.reward + 0.99 * batch.next_obs.sum(dim=-1)
    err: NDArray[np.float64] = np.abs(q.numpy()).astype(np.float64)
    return err


def main() -> int:
    buf = rb.ReplayBuffer(capacity=1_000, seed=0, n_step=3,
                          sampler=rb.PrioritizedSampler(alpha=0.6, beta=0.4))
    fill(buf, 200)
    batch: rb.Batch = buf.sample(32)
    obs: NDArray[np.float32] = batch.obs
    weights: NDArray[np.float32] = batch.weights
    tensors = batch.to_torch()
    done: torch.Tensor = tensors.done
    buf.update_priorities(batch.indices, td_errors(tensors))

    ckpt = tempfile.mkdtemp()
    buf.save(ckpt)
    restored = rb.load(ckpt)
    assert isinstance(restored, rb.ReplayBuffer)  # rb.load may rebuild any buffer type
    same: bool = restored.sample(32) == buf.sample(32)

    empty = rb.from_config(buf.config())
    assert isinstance(empty, rb.ReplayBuffer)
    fill(empty, 10)
    seq: rb.SequenceBatch[torch.Tensor] = buf.sample_sequences(4, 8).to_torch()
    mask: torch.Tensor = seq.mask
    assert same and len(obs) == len(weights) == 32
    return len(empty) + int(done.sum()) + int(mask.sum())


if __name__ == "__main__":
    print(main())
'''


def _env() -> dict[str, str]:
    """The environment without paths that would find replaybank some other way."""
    return {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}


@pytest.mark.slow  # imports torch and compiles the PER kernels in a new process
def test_the_user_script_runs(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "user_script.py").write_text(USER_SCRIPT)
    out = subprocess.run([sys.executable, "user_script.py"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.strip()) >= 10


def test_replaybank_is_on_the_path_that_type_checkers_read(tmp_path: Path) -> None:
    """Found by the plain path search (``sys.path``, ``.pth`` files applied), without the
    import hooks of ``sys.meta_path`` that an editable install may add and mypy ignores.
    Fails in an install made before ``[tool.setuptools] package-dir``: reinstall with the
    README's command."""
    code = ("import sys, importlib.machinery as m; "
            "paths = [p for p in sys.path if p not in ('', '.')]; "
            "spec = m.PathFinder.find_spec('replaybank', paths); "
            "print(spec.origin if spec else None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, env=_env())
    assert out.returncode == 0, out.stderr
    found = out.stdout.strip()
    assert found != "None", (
        "replaybank is importable only through an import hook, which type checkers do not "
        "run: reinstall it with the README's command (pip install -e .)")
    assert Path(found).resolve() == Path(replaybank.__file__).resolve()


@pytest.mark.slow  # mypy reads torch's sources: ~40 s without a cache
def test_a_typed_user_script_passes_mypy_strict(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    pytest.importorskip("torch")
    (tmp_path / "user_script.py").write_text(USER_SCRIPT)
    assert "type: ignore" not in USER_SCRIPT
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / ".mypy"),
         "user_script.py"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=_env())
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success: no issues found in 1 source file" in out.stdout
