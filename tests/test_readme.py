"""The README's Python examples run as written, each on its own, and what they claim holds.

Each ```python block runs alone, in a fresh namespace (as a reader pasting just that block
would run it), with ``np.random`` seeded, in a temporary working directory. A block that
needs an optional package says so on the line before its fence (``<!-- needs:
stable_baselines3 -->``, invisible on GitHub) and is skipped where it is missing. The tests
below then check the README's concrete claims on the objects each block leaves behind.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SEED = 1234  # seeds np.random before each block, so the first block's data can be rebuilt
FENCE = re.compile(r"^(?:<!--\s*needs:(?P<needs>[^>]*?)-->\n)?```python[^\n]*\n(?P<code>.*?)"
                   r"^```[ \t]*$", flags=re.S | re.M)

# CartPole-v1 ends an episode (terminated) once |x| > 2.4 or |theta| > 12 degrees
CART_X_LIMIT = 2.4
CART_THETA_LIMIT = 12 * 2 * np.pi / 360


@dataclass(frozen=True)
class Block:
    code: str
    needs: tuple[str, ...]  # import names of the optional packages it needs


def python_blocks() -> list[Block]:
    return [Block(m["code"], tuple(n.strip() for n in (m["needs"] or "").split(",")
                                   if n.strip()))
            for m in FENCE.finditer(README.read_text())]


@dataclass
class Run:
    """What running one block alone left: its namespace, or why it did not run."""

    namespace: dict[str, Any]
    error: BaseException | None = None
    missing: str | None = None  # an optional package the block needs and this install lacks


def test_readme_has_examples() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 9
    assert README.read_text().count("```python") == len(blocks)


def test_no_python_hides_in_other_blocks() -> None:
    """Blocks not fenced ``python`` (shell commands, the layer diagram) are not Python, so
    no example escapes these tests behind a ``text`` fence."""
    for m in re.finditer(r"^```(?P<lang>\w*)\n(?P<code>.*?)^```", README.read_text(),
                         flags=re.S | re.M):
        if m["lang"] == "python":
            continue
        try:
            ast.parse(m["code"])
        except SyntaxError:
            continue
        raise AssertionError(f"a ```{m['lang']} block is Python; fence it as python:\n"
                             f"{m['code']}")


INSTALL_AND_TEST = ('python3 -m venv .venv && . .venv/bin/activate && pip install '
                    'torch==2.13.0 -e ".[dev]" && python -m pytest')


def test_test_commands_full_and_fast() -> None:
    """The full command stays as CI runs it; a fast subset is documented beside it, and the
    marker it deselects is registered (``--strict-markers``)."""
    import tomllib

    text = README.read_text()
    assert f"```bash\n{INSTALL_AND_TEST}\n```" in text
    assert '```bash\npython -m pytest -m "not slow and not ray"\n```' in text
    config = tomllib.loads((README.parent / "pyproject.toml").read_text())
    markers = config["tool"]["pytest"]["ini_options"]["markers"]
    assert {m.split(":")[0] for m in markers} >= {"slow", "ray"}
    assert "-m 'not slow'" in config["tool"]["pytest"]["ini_options"]["addopts"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Run]]:
    """Run every README block alone, each in a fresh namespace."""
    pytest.importorskip("gymnasium")
    pytest.importorskip("torch")
    cwd, state = os.getcwd(), np.random.get_state()
    os.chdir(tmp_path_factory.mktemp("readme"))
    out: list[Run] = []
    try:
        for i, block in enumerate(python_blocks()):
            missing = next((n for n in block.needs if importlib.util.find_spec(n) is None),
                           None)
            run = Run({"__name__": "__readme__"}, missing=missing)
            out.append(run)
            if missing is not None:
                continue
            np.random.seed(SEED)
            try:
                exec(compile(block.code, f"{README}:block{i}", "exec"), run.namespace)
            except Exception as exc:  # reported by test_every_block_runs_alone
                run.error = exc
        yield out
    finally:
        os.chdir(cwd)
        np.random.set_state(state)
        for run in out:
            ns = run.namespace
            if isinstance(ns.get("ckpt"), str):
                shutil.rmtree(ns["ckpt"], ignore_errors=True)
            big = ns.get("big")
            if big is not None and getattr(big.backend, "path", None) is not None:
                shutil.rmtree(Path(big.backend.path).parent, ignore_errors=True)


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_every_block_runs_alone(runs: list[Run], index: int) -> None:
    run = runs[index]
    if run.missing is not None:
        pytest.skip(f"README block {index} needs {run.missing}")
    if run.error is not None:
        raise AssertionError(f"README block {index} fails when run on its own: "
                             f"{type(run.error).__name__}: {run.error}") from run.error


@pytest.fixture(scope="module")
def after(runs: list[Run]) -> list[dict[str, Any]]:
    """The namespace each block left (blocks that failed leave what they had defined)."""
    return [run.namespace for run in runs]


def block_defining(after: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The namespace of the first block that defined ``name``."""
    for ns in after:
        if name in ns:
            return ns
    raise AssertionError(f"no README block defines {name!r}")


def assert_same(a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
    """Two batches hold the same fields with identical values (indices included)."""
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


def test_readme_examples_run(after: list[dict[str, Any]]) -> None:
    defined = {name for ns in after for name in ns}
    for name in ("buf", "batch", "tensors", "seq", "atari", "roll", "ckpt", "restored", "cfg",
                 "empty_copy", "big", "cart", "result", "gpu_ready", "her", "hb", "learner"):
        assert name in defined, name


def test_usage_next_obs_is_exact(after: list[dict[str, Any]]) -> None:
    """First block: every sampled step returns exactly the obs/next_obs that were added."""
    ns = after[0]
    buf, batch = ns["buf"], ns["batch"]
    # rebuild the block's loop: next_obs of step t is np.random.rand(4), obs is the previous one
    rs = np.random.RandomState(SEED)
    next_obs = np.stack([rs.rand(4).astype(np.float32) for _ in range(1000)])
    obs = np.concatenate([np.zeros((1, 4), np.float32), next_obs[:-1]])
    step_of = {row.tobytes(): t for t, row in enumerate(next_obs)}
    assert len(step_of) == 1000 and len(buf) == 1000

    def check(b: Any) -> np.ndarray:
        t = np.array([step_of[row.tobytes()] for row in np.asarray(b["next_obs"])])
        np.testing.assert_array_equal(b["obs"], obs[t])
        np.testing.assert_array_equal(b["next_obs"], next_obs[t])
        np.testing.assert_array_equal(b["action"], t % 2)
        np.testing.assert_array_equal(b["reward"], np.ones(len(t)))
        np.testing.assert_array_equal(b["terminated"], np.zeros(len(t), bool))
        np.testing.assert_array_equal(b["truncated"], t % 200 == 199)
        np.testing.assert_array_equal(b.done, t % 200 == 199)
        return t

    assert batch.obs.shape == batch.next_obs.shape == (256, 4)
    assert batch.action.shape == batch.reward.shape == batch.indices.shape == (256,)
    check(batch)
    # every step was stored once: a draw of all of them without replacement finds each one
    everything = buf.sample(1000, replace=False)
    assert sorted(check(everything).tolist()) == list(range(1000))
    assert len(set(everything.indices.tolist())) == 1000

    # "frozen, typed, attribute + mapping access"; to_torch: "zero-copy on CPU"
    assert batch["next_obs"] is batch.next_obs
    with pytest.raises(AttributeError):
        batch.obs = batch.next_obs
    tensors = ns["tensors"]
    assert set(tensors) == set(batch)
    for key in batch:
        np.testing.assert_array_equal(tensors[key].numpy(), batch[key], err_msg=key)
    assert np.shares_memory(tensors.obs.numpy(), batch.obs)


def test_prioritized_nstep_batch(after: list[dict[str, Any]]) -> None:
    ns = after[1]
    buf, batch = ns["buf"], ns["batch"]
    assert len(buf) == 400  # 100 steps of 4 envs
    assert batch.obs.shape == batch.next_obs.shape == (32, 8)
    # "batch.weights, batch.probabilities, batch.discount"
    assert batch.weights.shape == batch.probabilities.shape == batch.discount.shape == (32,)
    assert np.all(np.isfinite(batch.weights)) and np.all(batch.weights > 0)
    assert np.all((batch.probabilities > 0) & (batch.probabilities <= 1))
    # 3-step returns: the discount is gamma ** (steps taken), 1 to 3 of them
    powers = 0.99 ** np.arange(1, 4)
    assert np.all(np.isclose(batch.discount[:, None], powers[None, :]).any(axis=1))


def test_sequences_shapes(after: list[dict[str, Any]]) -> None:
    """``seq.obs.shape, seq.mask.shape, seq.is_first.shape  # [B, L, ...], [B, L], [B, L]``.

    With ``burn_in=4`` a window holds the 4 burn-in steps before the 16 loss steps: the
    time axis is 20 long and ``mask`` excludes the burn-in.
    """
    seq = block_defining(after, "seq")["seq"]
    assert seq.obs.shape == (8, 4 + 16, 8)
    assert seq.mask.shape == seq.is_first.shape == (8, 4 + 16)
    assert not seq.mask[:, :4].any()
    assert seq.burn_in[:, :4].all() and not seq.burn_in[:, 4:].any()
    # episode_boundary="stop": inside a window, next_obs of a step is the obs of the next one
    real = np.asarray(seq.mask | seq.burn_in)  # the rest is padding (strict=False)
    assert real[:, :5].all()
    cont = ~seq.is_last[:, :-1] & real[:, :-1] & real[:, 1:]
    np.testing.assert_array_equal(seq.next_obs[:, :-1][cont], seq.obs[:, 1:][cont])
    assert not seq.is_first[:, 1:][cont].any()


def test_frame_stack_stores_single_frames(after: list[dict[str, Any]]) -> None:
    atari = block_defining(after, "atari")["atari"]
    assert atari.capacity == 10_000 and len(atari) == 0
    for t in range(6):  # the README builds it empty; store a few 2x2 frames
        atari.add(obs=np.full((2, 2), t, np.uint8), action=0, reward=0.0,
                  next_obs=np.full((2, 2), t + 1, np.uint8), terminated=False, truncated=False)
    assert atari.spec["obs"].shape == (2, 2)  # one frame stored per step
    b = atari.sample(16)
    assert b.obs.shape == b.next_obs.shape == (16, 4, 2, 2)
    last = b.obs[:, -1, 0, 0].astype(int)
    for k in range(4):  # the stack ends at the sampled step; early steps repeat frame 0
        np.testing.assert_array_equal(b.obs[:, k, 0, 0], np.maximum(last - 3 + k, 0))
    np.testing.assert_array_equal(b.next_obs[:, -1, 0, 0], last + 1)


def test_rollout_gae_minibatches(after: list[dict[str, Any]]) -> None:
    roll = block_defining(after, "roll")["roll"]
    batches = list(roll.generate_batches(num_mini_batch=4, num_epochs=2))
    assert len(batches) == 4 * 2
    for epoch in (batches[:4], batches[4:]):  # each epoch covers all 128 x 4 steps once
        seen = np.concatenate([mb.indices for mb in epoch])
        assert sorted(seen.tolist()) == list(range(128 * 4))
    gl = 0.99 * 0.95
    for mb in batches:
        n = len(mb.indices)
        assert n == 128 * 4 // 4
        assert mb.advantages.shape == mb.returns.shape == mb.log_prob.shape == (n,)
        assert np.all(np.isfinite(mb.advantages)) and np.all(np.isfinite(mb.returns))
        # reward 1, value 0, last value 0, no episode end: GAE return of step t is
        # sum_{k < 128 - t} (gamma * lambda) ** k
        t = mb.indices // 4
        np.testing.assert_allclose(mb.returns, (1 - gl ** (128 - t)) / (1 - gl), rtol=1e-5)


def test_checkpoint_restores_the_next_sample(after: list[dict[str, Any]],
                                             tmp_path: Path) -> None:
    """``restored = rb.load(ckpt)  # the next sample equals the original's next sample``."""
    import replaybank as rb

    ns = block_defining(after, "restored")
    buf, restored = ns["buf"], ns["restored"]
    assert sorted(os.listdir(ns["ckpt"])) == ["buffer_metadata.json",
                                              "buffer_state.safetensors"]

    def same_next_samples(a: Any, b: Any) -> None:
        assert type(a) is type(b) and len(a) == len(b) == 400
        assert (a.capacity, a.num_envs) == (b.capacity, b.num_envs)
        for _ in range(3):
            x, y = a.sample(64, beta=0.5), b.sample(64, beta=0.5)
            assert_same(x, y)
            prio = np.abs(np.sin(np.arange(64.0))) + 0.1
            assert a.update_priorities(x.indices, prio) == b.update_priorities(y.indices, prio)
        assert_same(a.sample_sequences(8, 4), b.sample_sequences(8, 4))

    # the README's own pair: nothing was drawn from buf between save and load
    same_next_samples(buf, restored)
    # and again from the state reached now (priorities updated, generators advanced)
    buf.save(tmp_path / "again")
    same_next_samples(buf, rb.load(tmp_path / "again"))


def test_config_builds_an_empty_copy(after: list[dict[str, Any]]) -> None:
    ns = block_defining(after, "empty_copy")
    buf, cfg, empty_copy = ns["buf"], ns["cfg"], ns["empty_copy"]
    assert type(empty_copy) is type(buf)
    assert (empty_copy.capacity, empty_copy.num_envs) == (buf.capacity, buf.num_envs) \
        == (50_000, 4)
    assert len(empty_copy) == 0
    assert type(empty_copy.sampler) is type(buf.sampler)
    assert type(empty_copy.view) is type(buf.view)
    assert empty_copy.config() == cfg


def test_memmap_reopens_with_the_identical_next_sample(after: list[dict[str, Any]]) -> None:
    """``rb.ReplayBuffer.open(path)`` continues where it stopped, with the identical next
    sample when nothing was added after the last flush."""
    import replaybank as rb

    big = block_defining(after, "big")["big"]
    assert big.capacity == 1_000_000 and len(big) == 0
    for t in range(50):
        big.add(obs=np.full(3, t, np.float32), action=t % 2, reward=1.0,
                next_obs=np.full(3, t + 1, np.float32), terminated=t % 10 == 9, truncated=False)
    big.flush()
    big.backend.close()  # releases the writer's lock, as the README's process ending does
    reopened = rb.ReplayBuffer.open(big.backend.path)
    assert len(reopened) == 50
    for _ in range(3):
        assert_same(big.sample(32), reopened.sample(32))


def test_collect_stores_real_transitions_only(after: list[dict[str, Any]]) -> None:
    """``collect``: no stored transition pairs the last observation of one episode with the
    reset observation of the next; ``next_obs`` is exact."""
    ns = block_defining(after, "cart")
    cart, result = ns["cart"], ns["result"]
    lengths = np.asarray(result.episode_lengths)
    returns = np.asarray(result.episode_returns)

    # n_steps=500 over 4 envs: whole vector steps, every added transition stored
    assert 500 <= result.steps < 504 and len(cart) == result.steps
    assert result.env_steps % 4 == 0 and result.env_steps >= result.steps
    # the only env steps not stored are the autoreset steps after an episode ended
    assert len(returns) - 4 <= result.env_steps - result.steps <= len(returns)
    # CartPole pays 1 per step, at most 500 steps
    assert len(returns) == len(lengths) == cart.episodes_seen > 0
    np.testing.assert_array_equal(returns, lengths)
    assert np.all((returns >= 1) & (returns <= 500))
    assert lengths.sum() <= result.steps

    def inside(o: np.ndarray) -> np.ndarray:  # the states where CartPole keeps running
        return (np.abs(o[..., 0]) <= CART_X_LIMIT) & (np.abs(o[..., 2]) <= CART_THETA_LIMIT)

    everything = cart.sample(len(cart), replace=False)
    assert len(set(everything.indices.tolist())) == len(cart)
    np.testing.assert_array_equal(everything.reward, 1.0)
    assert inside(everything.obs).all()  # no step starts from a terminal state
    ended = everything.terminated | everything.truncated
    assert int(ended.sum()) == len(returns)
    # a terminated step keeps its true final observation, past CartPole's limits
    assert not inside(everything.next_obs[everything.terminated]).any()
    assert inside(everything.next_obs[~everything.terminated]).all()

    # consecutive stored steps of a lane: next_obs of a step is the obs of the next one ...
    stop = cart.sample_sequences(1024, 2, episode_boundary="stop")
    assert stop.mask.all() and not stop.is_last[:, 0].any()
    np.testing.assert_array_equal(stop.next_obs[:, 0], stop.obs[:, 1])
    # ... except across an episode end, where the next step starts from a reset observation
    cross = cart.sample_sequences(4096, 2, episode_boundary="cross")
    end = np.asarray(cross.is_last[:, 0] & cross.mask[:, 1])
    assert end.any()
    cont = np.asarray(~cross.is_last[:, 0] & cross.mask[:, 1])
    np.testing.assert_array_equal(cross.next_obs[:, 0][cont], cross.obs[:, 1][cont])
    assert cross.is_first[:, 1][end].all()
    assert np.all(np.abs(cross.obs[:, 1][end]) <= 0.05)  # CartPole resets to U(-0.05, 0.05)
    assert not np.any(np.all(cross.next_obs[:, 0][end] == cross.obs[:, 1][end], axis=-1))

    gpu_ready = ns["gpu_ready"]
    assert tuple(gpu_ready.obs.shape) == (64, 4) and tuple(gpu_ready.next_obs.shape) == (64, 4)
