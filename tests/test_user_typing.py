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


# ---------------------------------------------------------------------------------------
# What a user's type checker infers (reveal_type), checked against what the same program
# gets when it runs: where the two disagreed, mypy accepted code that fails at run time
# (``.astype`` on a torch batch) or rejected code that works (``buf.config().capacity``).

TYPES_SCRIPT = '''\
"""Types a user's checker infers for replaybank's calls; the runtime asserts say they hold.

Each probe is a function of its own: an assert that the checker believes false (an
``isinstance`` of a tensor typed as an array) makes the rest of its function unreachable,
which mypy then skips without a word.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

import replaybank as rb


def fill(add: Callable[..., None]) -> None:
    for t in range(8):
        add(obs=np.full(2, t, np.float32), action=0, reward=1.0,
            next_obs=np.full(2, t + 1, np.float32), terminated=False, truncated=False)


def host_storage() -> None:
    host = rb.ReplayBuffer(capacity=64, seed=0)
    fill(host.add)
    host_batch = host.sample(4)
    if TYPE_CHECKING:
        reveal_type(host_batch.obs)
    assert isinstance(host_batch.obs, np.ndarray)


def torch_storage() -> None:
    dev = rb.ReplayBuffer(capacity=64, seed=0, storage="torch", device="cpu")
    fill(dev.add)
    dev_batch, dev_seq, static = dev.sample(4), dev.sample_sequences(2, 3), dev.sample_fn(4)()
    if TYPE_CHECKING:
        reveal_type(dev_batch.obs)
        reveal_type(dev_seq.mask)
        reveal_type(static.obs)
    assert isinstance(dev_batch.obs, torch.Tensor)
    assert isinstance(dev_seq.mask, torch.Tensor)
    assert isinstance(static.obs, torch.Tensor)


def prefetched() -> None:
    host = rb.ReplayBuffer(capacity=64, seed=0)
    fill(host.add)
    with host.prefetcher(4, device="cpu") as pf:
        fetched = next(pf)
    if TYPE_CHECKING:
        reveal_type(fetched.obs)
    assert isinstance(fetched.obs, torch.Tensor)


def rollout() -> None:
    roll = rb.RolloutBuffer(4, device="cpu", seed=0)
    for _ in range(4):
        roll.add(obs=np.zeros(2, np.float32), action=0, reward=1.0, terminated=False,
                 truncated=False, value=0.0, log_prob=0.0)
    roll.compute_returns_and_advantage(0.0)
    minibatch = next(roll.generate_batches(num_mini_batch=1))
    if TYPE_CHECKING:
        reveal_type(minibatch.obs)
    assert isinstance(minibatch.obs, torch.Tensor)


def configs() -> None:
    capacity: int = rb.ReplayBuffer(64).config().capacity  # each config has its fields
    num_steps: int = rb.RolloutBuffer(4).config().num_steps
    assert (capacity, num_steps) == (64, 4)


def persisted() -> int:
    d = tempfile.mkdtemp()
    host = rb.ReplayBuffer(capacity=64, seed=0)
    fill(host.add)
    host.save(d)
    again = rb.load_into(rb.ReplayBuffer(64), d)  # the buffer passed in comes back
    if TYPE_CHECKING:
        reveal_type(again)
    size: int = len(again)

    agents = rb.MultiAgentReplayBuffer(agents=["a", "b"], capacity=16, seed=0)
    zeros = {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)}
    agents.add(obs=zeros, action={"a": 0, "b": 1}, reward={"a": 1.0, "b": 0.0},
               next_obs=zeros, terminated={"a": False, "b": False},
               truncated={"a": False, "b": False})
    agents.save(Path(d) / "agents")
    loaded = rb.load(Path(d) / "agents")
    found = 0
    if isinstance(loaded, rb.MultiAgentReplayBuffer):  # a type rb.load may return
        if TYPE_CHECKING:
            reveal_type(loaded)
        found = len(loaded.sample(2).agents)
    assert found == 2
    return size


def reopened_memmap() -> None:
    d = tempfile.mkdtemp()
    mm = rb.ReplayBuffer(16, storage="memmap", path=d,
                         spec={"obs": ((2,), "float32"), "action": ((), "int64")})
    mm.close()
    reopened = rb.open(d)
    if TYPE_CHECKING:
        reveal_type(reopened)
    assert isinstance(reopened, rb.ReplayBuffer)


def main() -> int:
    host_storage()
    torch_storage()
    prefetched()
    rollout()
    configs()
    reopened_memmap()
    return persisted()


if __name__ == "__main__":
    print(main())
'''

#: Code that fails when it runs, which the checker must refuse: numpy calls on tensors.
WRONG_SCRIPT = '''\
import numpy as np

import replaybank as rb


def wrong() -> None:
    dev = rb.ReplayBuffer(capacity=64, storage="torch", device="cpu")
    dev.sample(4).obs.astype(np.float64)
    roll = rb.RolloutBuffer(4, device="cpu")
    for b in roll.generate_batches(num_mini_batch=1):
        b.obs.astype(np.float64)
'''

NDARRAY = "numpy.ndarray[tuple[Any, ...], numpy.dtype[Any]]"
TENSOR = "torch._tensor.Tensor"


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, list[str]]]:
    """mypy --strict's notes and errors per file and line, replaybank read from this
    checkout (as an installed package: its own errors are not the user's)."""
    pytest.importorskip("mypy")
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("typing")
    (tmp / "types_script.py").write_text(TYPES_SCRIPT)
    (tmp / "wrong_script.py").write_text(WRONG_SCRIPT)
    (tmp / "docs_torch.py").write_text(_docs_torch_block())
    env = {**_env(), "MYPYPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--cache-dir", str(tmp / ".mypy"), "--no-error-summary", "types_script.py",
         "wrong_script.py", "docs_torch.py"],
        capture_output=True, text=True, timeout=600, cwd=tmp, env=env)
    found: dict[str, dict[int, list[str]]] = {
        name: {} for name in ("types_script.py", "wrong_script.py", "docs_torch.py")}
    for line in out.stdout.splitlines():
        name, lineno, rest = line.split(":", 2)
        found[name].setdefault(int(lineno), []).append(rest.strip())
    return found


def _docs_torch_block() -> str:
    """The torch section's example of docs/integrations.md (a user's first torch loop)."""
    text = (ROOT / "docs" / "integrations.md").read_text()
    blocks = text.split("```python\n")[1:]
    return next(b.split("```")[0] for b in blocks if "on_device = rb.ReplayBuffer(" in b)


def _revealed(checked: dict[str, dict[int, list[str]]], expr: str) -> str:
    """The type mypy revealed for ``reveal_type(expr)`` in TYPES_SCRIPT."""
    lines = TYPES_SCRIPT.splitlines()
    lineno = next(i for i, line in enumerate(lines, 1) if line.strip() == f"reveal_type({expr})")
    notes = checked["types_script.py"].get(lineno, [])
    assert notes, f"mypy revealed nothing at reveal_type({expr}): the line is unreachable to it"
    return notes[0].removeprefix('note: Revealed type is "').removesuffix('"')


@pytest.mark.slow  # mypy reads torch's sources: ~40 s without a cache
def test_the_types_script_passes_mypy_strict(checked: dict[str, dict[int, list[str]]]) -> None:
    errors = [f"{n}: {m}" for n, ms in checked["types_script.py"].items() for m in ms
              if m.startswith("error")]
    assert not errors


@pytest.mark.slow  # imports torch in a new process
def test_the_types_script_runs(tmp_path: Path) -> None:
    """The types revealed below are what the program gets (its asserts check them)."""
    pytest.importorskip("torch")
    (tmp_path / "types_script.py").write_text(TYPES_SCRIPT)
    out = subprocess.run([sys.executable, "types_script.py"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env={**_env(), "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "8"


@pytest.mark.slow
@pytest.mark.parametrize(("expr", "expected"), [
    ("host_batch.obs", NDARRAY),
    # storage="torch": batches, windows and sample_fn's static batches hold tensors
    ("dev_batch.obs", TENSOR),
    ("dev_seq.mask", TENSOR),
    ("static.obs", TENSOR),
    # a prefetcher hands out batches of tensors (it was Any)
    ("fetched.obs", TENSOR),
    # RolloutBuffer(device=...) yields tensor minibatches
    ("minibatch.obs", TENSOR),
    # load_into returns the buffer passed in (it was the Persistable protocol)
    ("again", f"replaybank.buffers.replay.ReplayBuffer[{NDARRAY}]"),
    # rb.load may return a multi-agent buffer: narrowing to it is not unreachable code
    ("loaded", "replaybank.multiagent.buffer.MultiAgentReplayBuffer"),
])
def test_revealed_types(checked: dict[str, dict[int, list[str]]], expr: str,
                        expected: str) -> None:
    assert _revealed(checked, expr) == expected


@pytest.mark.slow
def test_open_returns_a_buffer_type(checked: dict[str, dict[int, list[str]]]) -> None:
    """rb.open's result is the union rb.load returns (it was Any)."""
    revealed = _revealed(checked, "reopened")
    assert revealed.startswith("replaybank.buffers.replay.ReplayBuffer[Any] | ")
    assert "replaybank.multiagent.buffer.MultiAgentReplayBuffer" in revealed


@pytest.mark.slow
def test_numpy_calls_on_tensor_batches_are_type_errors(
        checked: dict[str, dict[int, list[str]]]) -> None:
    errors = checked["wrong_script.py"]
    assert errors.get(8) == ['error: "Tensor" has no attribute "astype"  [attr-defined]']
    assert errors.get(11) == ['error: "Tensor" has no attribute "astype"  [attr-defined]']


@pytest.mark.slow
def test_the_docs_torch_example_passes_mypy_strict(
        checked: dict[str, dict[int, list[str]]]) -> None:
    """Its ``on_device.sample(32).obs.device.type`` was read as numpy's ``ndarray.device``
    (the string "cpu"), an error on correct code."""
    assert checked["docs_torch.py"] == {}
