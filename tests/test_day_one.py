"""Small things a user meets on day one (issue 18): the command line, the licence, the
extras, types of the lazily exported names, reward dtype, seeds in configs, device errors."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import replaybank as rb
from replaybank.cli.demo import build_parser
from replaybank.cli.main import C_MODULES, main


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
def test_version(flag: str, capsys: pytest.CaptureFixture[str],
                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REPLAYBANK_PURE_PYTHON", raising=False)
    assert main([flag]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert first == f"replaybank {rb.__version__}"  # (the line scripts read)
    built = []
    for name, _ in C_MODULES:
        try:
            importlib.import_module(f"replaybank.{name}")
            built.append(name)
        except ImportError:
            pass
    if len(built) == len(C_MODULES):
        assert second == "C modules: built (_lane, _sampling, _windows)"
    else:  # an install without a compiler
        assert second.startswith("C modules: not built: ") and "reinstall" in second


def test_version_names_the_c_modules_missing(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """An install whose build found no compiler is told which modules it lacks and how to
    get them; REPLAYBANK_PURE_PYTHON=1 is named as the switch that turned them off."""
    monkeypatch.delenv("REPLAYBANK_PURE_PYTHON", raising=False)
    monkeypatch.setitem(sys.modules, "replaybank._sampling", None)  # (import fails)
    assert main(["--version"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith("C modules: not built: _sampling (sampling kernels); ")
    assert "build-essential python3-dev" in line and "_lane" not in line
    monkeypatch.setenv("REPLAYBANK_PURE_PYTHON", "1")
    assert main(["--version"]) == 0
    assert "switched off (REPLAYBANK_PURE_PYTHON is set)" in capsys.readouterr().out


def test_version_matches_the_metadata() -> None:
    from importlib.metadata import version

    assert rb.__version__ == version("replaybank")
    out = _run("-m", "replaybank", "--version")
    assert out.returncode == 0
    assert out.stdout.splitlines()[0] == f"replaybank {rb.__version__}"


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


# --- licence and extras ---------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
# the module each third-party distribution of an extra is imported as
IMPORT_NAME = {"pyyaml": "yaml", "gymnasium-robotics": "gymnasium_robotics",
               "stable-baselines3": "stable_baselines3"}


def _pyproject() -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(ROOT / "pyproject.toml", "rb") as f:
        data: dict[str, Any] = tomllib.load(f)
    return data


def test_license_file_is_the_declared_mit_licence() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert _pyproject()["project"]["license"] == "MIT"
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the replaybank authors" in text
    assert "THE SOFTWARE IS PROVIDED \"AS IS\"" in text


def test_every_extra_installs_something_the_project_imports() -> None:
    extras: dict[str, list[str]] = _pyproject()["project"]["optional-dependencies"]
    sources = "\n".join(p.read_text() for folder in ("replaybank", "tests", "examples")
                        for p in (ROOT / folder).rglob("*.py"))
    for extra, reqs in extras.items():
        for req in reqs:
            dist = re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower()
            if dist == "replaybank" or extra in ("dev", "bench", "docs"):
                continue  # meta extras, and the tools of the development setup and docs
            module = IMPORT_NAME.get(dist, dist)
            assert re.search(rf"(import|from) {module}\b|\"{module}\"", sources), (extra, dist)


# --- types of the lazily exported names ------------------------------------------------------

USER_CODE = """
from __future__ import annotations

import gymnasium as gym
import numpy as np

import replaybank as rb


def policy(obs: np.ndarray) -> np.ndarray:
    return np.zeros(len(obs), np.int64)


def main() -> int:
    env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    spec: rb.Spec = rb.spec_from_env(env)
    spec = rb.spec_from_spaces(env.single_observation_space, env.single_action_space)
    buf = rb.ReplayBuffer(100, num_envs=2, spec=spec, seed=0)
    res: rb.CollectResult = rb.collect(env, policy, buf, n_steps=10, progress=False)
    more: rb.CollectResult = rb.Collector(env, policy, buf, seed=0).collect(5)
    warmed: rb.CollectResult = rb.warm(buf, policy, 20, num_envs=2, env="CartPole-v1",
                                       progress=False)
    cfg: rb.BufferConfig = buf.config()
    again = rb.from_config(cfg)
    model: type[rb.BufferConfig] = rb.config_model("ReplayBuffer")
    typed: rb.ReplayBufferConfig = rb.ReplayBufferConfig(capacity=10, num_envs=2)
    capacity: int = typed.capacity
    component: type[rb.ComponentConfig] = rb.ComponentConfig
    rb.register_buffer("MyBuffer", rb.ReplayBuffer)
    rb.register_sampler("my_uniform", rb.UniformSampler)
    rb.register_view("my_transition", rb.TransitionView)
    backend: rb.TorchBackend = rb.TorchBackend(device="cpu")
    stager: rb.PinnedStager = rb.PinnedStager(device="cpu")
    del more, warmed, again, model, component, backend, stager
    return res.steps + capacity
"""


def _mypy(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mypy")
    (tmp_path / "user.py").write_text(code)
    # as for an installed package: replaybank is read, its own errors are not the user's
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--cache-dir", str(tmp_path / ".mypy_cache"), "--no-error-summary", "user.py"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)


def test_user_code_calling_the_lazy_names_passes_mypy_strict(tmp_path: Path) -> None:
    out = _mypy(tmp_path, USER_CODE)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_misspelt_name_is_a_type_error(tmp_path: Path) -> None:
    out = _mypy(tmp_path, "import replaybank as rb\n\nrb.colect\nrb.ReplayBufer\n")
    assert out.returncode == 1
    assert 'has no attribute "colect"' in out.stdout
    assert 'has no attribute "ReplayBufer"' in out.stdout


def test_type_checking_block_imports_every_lazy_name_from_its_module() -> None:
    tree = ast.parse((ROOT / "replaybank" / "__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and ast.unparse(node.test) == "typing.TYPE_CHECKING")
    typed = {alias.name: node.module for node in block.body
             if isinstance(node, ast.ImportFrom) for alias in node.names}
    # lazily imported subpackages: `from replaybank import distributed`
    lazy: dict[str, str] = {**rb._LAZY, **{name: "replaybank" for name in rb._LAZY_MODULES}}
    assert typed == lazy
    assert set(lazy) <= set(rb.__all__)


def test_import_replaybank_imports_neither_torch_nor_gymnasium() -> None:
    code = ("import sys, replaybank as rb; rb.ReplayBuffer(8, seed=0); "
            "print(sorted(m for m in ('torch', 'gymnasium') if m in sys.modules))")
    out = _run("-c", code)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


# --- reward dtype ----------------------------------------------------------------------------


def _steps(buf: rb.ReplayBuffer, n: int, reward_dtype: Any = np.float64, seed: int = 1) -> None:
    g = np.random.default_rng(seed)
    e = buf.num_envs
    for _ in range(n):
        buf.add(obs=g.random((e, 3)).astype(np.float32), action=g.integers(0, 2, e),
                reward=g.random(e).astype(reward_dtype), next_obs=g.random((e, 3)).astype(
                    np.float32), terminated=g.random(e) < 0.1, truncated=np.zeros(e, bool))


@pytest.mark.parametrize("n_step", [1, 3])
def test_an_inferred_float64_reward_is_stored_and_sampled_as_float32(n_step: int) -> None:
    buf = rb.ReplayBuffer(64, num_envs=2, seed=0, n_step=n_step)
    _steps(buf, 20)  # a gymnasium vector env's rewards are float64
    assert buf.spec is not None and buf.spec["reward"].dtype == np.float32
    batch = buf.sample(16)
    assert batch.reward.dtype == np.float32
    torch = pytest.importorskip("torch")
    assert batch.to_torch()["reward"].dtype == torch.float32


@pytest.mark.parametrize("reward", [1, np.float64(0.5), True, np.int32(2)])
def test_an_inferred_reward_is_float32_whatever_its_first_value(reward: Any) -> None:
    buf = rb.ReplayBuffer(8, seed=0)
    buf.add(obs=np.zeros(2), action=0, reward=reward, next_obs=np.ones(2), terminated=False,
            truncated=False)
    buf.add(obs=np.zeros(2), action=0, reward=0.25, next_obs=np.ones(2), terminated=False,
            truncated=False)
    assert buf.spec is not None and buf.spec["reward"].dtype == np.float32
    assert sorted(buf.sample(8).reward.tolist()) in ([0.25] * k + [float(reward)] * (8 - k)
                                                     for k in range(9))


def test_extend_and_her_infer_a_float32_reward_too() -> None:
    buf = rb.ReplayBuffer(16, seed=0)
    buf.extend(obs=np.zeros((4, 2)), action=np.zeros(4, np.int64), reward=np.ones(4),
               next_obs=np.ones((4, 2)), terminated=np.zeros(4, bool),
               truncated=np.zeros(4, bool))
    assert buf.spec is not None and buf.spec["reward"].dtype == np.float32

    def reward_fn(achieved: Any, desired: Any, info: Any) -> Any:
        return -(np.abs(achieved - desired).sum(-1) > 0.1).astype(np.float64)

    her = rb.HerReplayBuffer(32, num_envs=1, reward_fn=reward_fn, seed=0)
    goal = np.ones(2)
    for t in range(6):
        o = {"observation": np.full(2, t), "achieved_goal": np.full(2, t * 0.1),
             "desired_goal": goal}
        her.add(obs=o, action=np.zeros(2), reward=np.float64(-1.0), next_obs=o,
                terminated=False, truncated=t == 5)
    assert her.spec is not None and her.spec["reward"].dtype == np.float32
    assert her.sample(8).reward.dtype == np.float32


def test_an_explicit_float64_reward_spec_is_kept(tmp_path: Path) -> None:
    spec = {"obs": ((3,), "float32"), "action": ((), "int64"), "reward": ((), "float64")}
    buf = rb.ReplayBuffer(32, num_envs=2, seed=0, spec=spec)
    _steps(buf, 10)
    assert buf.spec is not None and buf.spec["reward"].dtype == np.float64
    assert buf.sample(4).reward.dtype == np.float64
    # the config and a checkpoint carry the declared dtype
    again = rb.from_config(buf.config())
    assert again.spec["reward"].dtype == np.float64
    buf.save(tmp_path / "ckpt")
    loaded = rb.load(tmp_path / "ckpt")
    assert loaded.spec["reward"].dtype == np.float64
    assert loaded.sample(4).reward.dtype == np.float64


def test_a_checkpoint_of_an_inferred_float64_reward_still_loads(tmp_path: Path) -> None:
    # what a buffer that inferred float64 rewards (before float32 was applied) saved
    old = rb.ReplayBuffer(32, num_envs=2, seed=0, spec={
        "obs": ((3,), "float32"), "action": ((), "int64"), "reward": ((), "float64")})
    _steps(old, 10)
    old.save(tmp_path / "old")
    loaded = rb.load(tmp_path / "old")
    assert loaded.spec == old.spec and loaded.spec["reward"].dtype == np.float64
    assert np.array_equal(loaded.sample(8).reward, old.sample(8).reward)
    _steps(loaded, 2)  # and takes more float64 rewards


# --- the seed in a buffer's config ---------------------------------------------------------


def test_config_records_an_int_seed_and_rebuilds_the_same_samples() -> None:
    buf = rb.ReplayBuffer(64, num_envs=2, seed=np.int64(7), n_step=3,
                          sampler=rb.PrioritizedSampler(alpha=0.6, beta=0.4))
    cfg = buf.config()
    assert cfg.seed == 7 and cfg.model_dump(mode="json")["seed"] == 7
    again = rb.from_config(cfg)
    for b in (buf, again):
        _steps(b, 20)
    for _ in range(3):
        x, y = buf.sample(16), again.sample(16)
        assert np.array_equal(x.indices, y.indices) and np.array_equal(x.reward, y.reward)
        buf.update_priorities(x.indices, np.arange(16.0))
        again.update_priorities(y.indices, np.arange(16.0))
    # through a JSON dict too (what a config file holds)
    assert rb.from_config(cfg.model_dump(mode="json")).config().seed == 7


@pytest.mark.parametrize("seed", [None, np.random.default_rng(3)])
def test_config_records_none_for_no_seed_or_a_generator(seed: Any) -> None:
    assert rb.ReplayBuffer(8, seed=seed).config().seed is None


def test_other_buffer_types_record_their_seed() -> None:
    assert rb.PrioritizedReplayBuffer(16, alpha=0.6, beta=0.4, seed=3).config().seed == 3
    assert rb.SequenceReplayBuffer(16, seed=4).config().seed == 4
    her = rb.HerReplayBuffer(16, reward_fn="builtins:max", strategy="final", seed=5)
    assert her.config().seed == 5
    assert rb.RolloutBuffer(8, num_envs=2, seed=6).config().seed == 6


def test_a_seeded_buffer_saves_and_loads_as_before(tmp_path: Path) -> None:
    buf = rb.ReplayBuffer(64, num_envs=2, seed=11)
    _steps(buf, 30)
    buf.sample(8)  # the generator moved on: the checkpoint carries its state, not the seed's
    buf.save(tmp_path / "ckpt")
    loaded = rb.load(tmp_path / "ckpt")
    assert loaded.config().seed == 11
    assert np.array_equal(loaded.sample(32).indices, buf.sample(32).indices)


# --- devices -----------------------------------------------------------------------------------


def _batch() -> rb.Batch:
    buf = rb.ReplayBuffer(16, seed=0)
    _steps(buf, 4)
    return buf.sample(4)


def test_to_torch_gpu_names_the_argument_and_the_fix() -> None:
    pytest.importorskip("torch")
    with pytest.raises(rb.ConfigError, match=r"to_torch\(device='gpu'\): not a torch device; "
                       r"torch calls the GPU 'cuda'"):
        _batch().to_torch(device="gpu")
    with pytest.raises(rb.ConfigError, match=r"to_torch\(device='nope'\): not a torch device"):
        _batch().to_torch(device="nope")


def test_to_torch_cuda_without_cuda_is_a_library_error() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for device in ("cuda", "cuda:0", torch.device("cuda")):
        with pytest.raises(rb.ConfigError, match=r"to_torch\(device=.*cuda.*\): CUDA is not "
                           r"available on this machine; use device='cpu'"):
            _batch().to_torch(device=device)
    with pytest.raises(rb.ConfigError, match="device='cuda': CUDA is not available"):
        rb.ReplayBuffer(8, storage="torch", device="cuda")
    with pytest.raises(rb.ConfigError, match="device='gpu': not a torch device; torch calls"):
        rb.TorchBackend("gpu")


def test_to_torch_on_good_devices_still_works() -> None:
    torch = pytest.importorskip("torch")
    for device in (None, "cpu", torch.device("cpu")):
        t = _batch().to_torch(device=device)
        assert t.reward.device.type == "cpu" and t.reward.dtype == torch.float32
    if torch.cuda.is_available():
        t = _batch().to_torch(device="cuda")
        assert t.reward.device.type == "cuda"
        with pytest.raises(rb.ConfigError, match="CUDA device"):
            _batch().to_torch(device=f"cuda:{torch.cuda.device_count()}")


def test_rollout_keeps_the_inferred_float_dtypes_as_documented() -> None:
    """RolloutBuffer documents the other choice: GAE in the precision of the values given."""
    for dtype in (np.float64, np.float32):
        buf = rb.RolloutBuffer(2, num_envs=2, seed=0)
        for _ in range(2):
            buf.add(obs=np.zeros((2, 3), np.float32), action=np.zeros(2, np.int64),
                    reward=np.ones(2, dtype), terminated=np.zeros(2, bool),
                    truncated=np.zeros(2, bool), value=np.zeros(2, dtype),
                    log_prob=np.zeros(2, dtype))
        assert buf.spec is not None
        assert {buf.spec[n].dtype for n in ("reward", "value", "log_prob")} == {np.dtype(dtype)}
    assert "stay float64" in (rb.RolloutBuffer.__init__.__doc__ or rb.RolloutBuffer.__doc__ or "")
