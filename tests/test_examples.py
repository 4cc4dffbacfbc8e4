"""Each example script runs for a few hundred steps (CI smoke test) and shows what it promises.

A run this short cannot show learning; it shows what each script's docstring promises of
its data and bookkeeping: the step counts it reports, sane returns, finite gradients, and
a buffer that holds exactly the real transitions (checked on the buffer the script built,
recorded by wrapping the ``rb`` constructor it calls); the DQN, PPO and SAC examples also
print their greedy evaluations and write a learning-curve PNG. Under ``-m slow`` each of
those three runs at its default budget and must reach the result its docstring states.
"""

from __future__ import annotations

import math
import re
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

CASES = {
    "dqn_per_cartpole.py": ["--total-timesteps", "400", "--learning-starts", "100",
                            "--eval-every", "200", "--eval-episodes", "3"],
    "ppo_cartpole.py": ["--total-timesteps", "512", "--num-steps", "64", "--eval-every", "256",
                        "--eval-episodes", "3"],
    "sac_pendulum.py": ["--total-timesteps", "300", "--learning-starts", "150",
                        "--batch-size", "32", "--eval-every", "150", "--eval-episodes", "2"],
}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))

# CartPole-v1: reward 1 per step, at most 500 steps; it terminates once |x| > 2.4 or
# |theta| > 12 degrees. Pendulum-v1: 200 steps, reward in [-(pi^2 + 0.1 * 8^2 + 0.001 * 2^2), 0]
CART_MAX_RETURN = 500.0
PENDULUM_MIN_REWARD = -(math.pi**2 + 0.1 * 8**2 + 0.001 * 2**2)


class Run:
    """What one script run left behind: its stdout, its plot and what the test recorded."""

    def __init__(self, plot: Path) -> None:
        self.out = ""
        self.plot = plot
        self.made: dict[str, list[Any]] = {}
        self.grad_norms: list[float] = []
        self.mse_losses: list[float] = []

    def only(self, name: str) -> Any:
        made = self.made.get(name, [])
        assert len(made) == 1, f"the script built {len(made)} {name}, expected 1"
        return made[0]


def record(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wrap what the scripts call through their module attributes, keeping the results."""
    import torch

    import replaybank as rb

    def recorded(name: str) -> Callable[..., Any]:
        cls = getattr(rb, name)

        def make(*args: Any, **kwargs: Any) -> Any:
            obj = cls(*args, **kwargs)
            run.made.setdefault(name, []).append(obj)
            return obj

        return make

    for name in ("ReplayBuffer", "RolloutBuffer"):
        monkeypatch.setattr(rb, name, recorded(name))

    clip = torch.nn.utils.clip_grad_norm_

    def clip_recorded(*args: Any, **kwargs: Any) -> Any:
        norm = clip(*args, **kwargs)
        run.grad_norms.append(float(norm))
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_recorded)
    mse = torch.nn.functional.mse_loss

    def mse_recorded(*args: Any, **kwargs: Any) -> Any:
        loss = mse(*args, **kwargs)
        if loss.numel() == 1:  # a mean loss (reduction="none" gives one per row)
            run.mse_losses.append(float(loss.detach()))
        return loss

    monkeypatch.setattr(torch.nn.functional, "mse_loss", mse_recorded)


def done_line(out: str, pattern: str) -> re.Match[str]:
    lines = [line for line in out.splitlines() if line.startswith("done:")]
    assert len(lines) == 1, out
    match = re.fullmatch(pattern, lines[0])
    assert match is not None, lines[0]
    return match


def check_png(path: Path) -> None:
    """A real PNG: the signature, and an image matplotlib reads back with content."""
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and min(image.shape[:2]) > 100
    assert image.reshape(-1, image.shape[2]).std(axis=0).max() > 0.05  # not a blank canvas


def greedy_evals(run: Run, episodes: int, lo: float, hi: float) -> list[tuple[int, float]]:
    """The evaluation lines, the final-evaluation line and the plot the script wrote:
    ``episodes`` greedy episodes each, means and spreads within ``[lo, hi]``."""
    evals = re.findall(r"^step\s+(\d+)\s+eval\s+(\S+) \+-\s+(\S+) \((\d+) greedy episodes\)"
                       r"\s+train return \(last \d+\)\s+(\S+)", run.out, flags=re.M)
    assert evals, run.out
    for _, mean, std, n, _ in evals:
        assert int(n) == episodes
        assert lo <= float(mean) <= hi and 0.0 <= float(std) <= (hi - lo) / 2
    final = re.findall(r"^final greedy eval: (\S+) \+- (\S+) over (\d+) episodes$", run.out,
                       flags=re.M)
    assert final == [evals[-1][1:4]], run.out  # the last evaluation, printed once more
    assert re.findall(r"^learning curve: (.+)$", run.out, flags=re.M) == [str(run.plot)]
    check_png(run.plot)
    return [(int(step), float(mean)) for step, mean, _, _, _ in evals]


def cart_inside(obs: np.ndarray) -> np.ndarray:
    """States where CartPole keeps running (not past its termination limits)."""
    return (np.abs(obs[..., 0]) <= 2.4) & (np.abs(obs[..., 2]) <= 12 * 2 * math.pi / 360)


def check_dqn(run: Run) -> None:
    """Prioritized 3-step replay through rb.Collector: only real transitions are stored,
    n-step returns and importance weights come from the buffer, TD errors become
    priorities."""
    m = done_line(run.out, r"done: (\d+) steps, (\d+) episodes, mean return of the last 10: "
                           r"(\S+)")
    steps, episodes, mean_return = int(m[1]), int(m[2]), float(m[3])
    # whole vector steps of 4 envs; one collect call takes at most 2 of them
    assert steps % 4 == 0 and 400 <= steps < 400 + 8
    assert episodes >= 1 and 1.0 <= mean_return <= CART_MAX_RETURN
    # greedy (argmax Q) evaluations of 3 episodes at the first step >= 200 and at the end
    evals = greedy_evals(run, 3, 1.0, CART_MAX_RETURN)
    assert len(evals) == 2 and 200 <= evals[0][0] < 208 and evals[0][0] % 4 == 0
    assert evals[1][0] == steps
    buf = run.only("ReplayBuffer")
    assert buf.episodes_seen == episodes
    # the steps not stored are the autoreset steps, one after each episode end (the last
    # ends of the 4 envs may not have reached theirs)
    assert steps - episodes <= len(buf) <= steps - max(0, episodes - 4)
    # updates began at --learning-starts 100: two per collect call, gradients finite
    assert len(run.grad_norms) >= 2 * (400 - 100) // 8
    assert np.all(np.isfinite(run.grad_norms))

    everything = buf.sample(len(buf), replace=False)
    assert len(set(everything.indices.tolist())) == len(buf)
    assert cart_inside(everything.obs).all()  # no stored step starts from a terminal state
    assert int((everything.terminated | everything.truncated).sum()) >= episodes - 4
    # 3-step returns: discount = gamma ** n, reward the discounted sum of n rewards of 1
    n = np.rint(np.log(everything.discount) / np.log(0.99)).astype(int)
    assert set(n.tolist()) <= {1, 2, 3} and 3 in n
    np.testing.assert_allclose(everything.discount, 0.99**n, rtol=1e-6)
    np.testing.assert_allclose(everything.reward, (1 - 0.99**n) / (1 - 0.99), rtol=1e-5)
    # an n-step window that terminated ends on the true final observation
    assert not cart_inside(everything.next_obs[everything.terminated]).any()
    assert cart_inside(everything.next_obs[~everything.terminated]).all()
    # importance weights, and priorities that the TD errors changed (no longer all equal)
    w, p = everything.weights, everything.probabilities
    assert np.all(np.isfinite(w)) and np.all(w > 0) and np.all(np.isfinite(p) & (p > 0))
    assert p.max() > p.min()


def check_ppo(run: Run) -> None:
    """RolloutBuffer with GAE cut at every episode end (terminated steps do not bootstrap);
    the greedy policy is evaluated every --eval-every steps."""
    evals = greedy_evals(run, 3, 1.0, CART_MAX_RETURN)
    assert [s for s, _ in evals] == [256, 512], run.out
    scores = [score for _, score in evals]
    train = re.findall(r"train return \(last 20\)\s+(\S+)", run.out)
    assert len(train) == 2 and all(1.0 <= float(r) <= CART_MAX_RETURN for r in train)
    m = done_line(run.out, r"done: (\d+) steps, best eval (\S+)")
    assert int(m[1]) == 512 and float(m[2]) == pytest.approx(max(scores), abs=0.05)
    # 2 updates x 4 epochs x 4 minibatches, finite gradients
    assert len(run.grad_norms) == 2 * 4 * 4 and np.all(np.isfinite(run.grad_norms))

    buf = run.only("RolloutBuffer")  # holds the last rollout: 64 steps of 4 envs
    (b,) = buf.generate_batches(num_mini_batch=1, num_epochs=1)
    order = np.argsort(b.indices)
    assert b.indices[order].tolist() == list(range(64 * 4))

    def grid(x: Any) -> np.ndarray:  # [T, num_envs]
        return np.asarray(x, np.float64)[order].reshape(64, 4)

    reward, value, returns = grid(b.reward), grid(b.value), grid(b.returns)
    term, trunc = grid(b.terminated).astype(bool), grid(b.truncated).astype(bool)
    adv = returns - value  # raw GAE advantages
    np.testing.assert_array_equal(reward, 1.0)
    assert term.any() and not trunc.any()  # 256 steps: CartPole ends only by terminating
    gl = 0.99 * 0.95
    # GAE recursion inside the rollout: an ended step neither bootstraps nor sees the next
    nxt = ~term[:-1]
    expect = reward[:-1] - value[:-1] + nxt * (0.99 * value[1:] + gl * adv[1:])
    np.testing.assert_allclose(adv[:-1], expect, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(adv[term], reward[term] - value[term], rtol=1e-4, atol=1e-4)


def check_sac(run: Run) -> None:
    """Uniform replay on Pendulum: separate terminated / truncated flags (it only
    truncates) and next_obs returned exactly."""
    m = done_line(run.out, r"done: (\d+) steps, (\d+) episodes, last return (\S+)")
    assert int(m[1]) == 300 and int(m[2]) == 300 // 200
    assert 200 * PENDULUM_MIN_REWARD <= float(m[3]) <= 0.0
    # greedy (mean action) evaluations of 2 episodes of 200 steps at 150 and 300
    evals = greedy_evals(run, 2, 200 * PENDULUM_MIN_REWARD, 0.0)
    assert [s for s, _ in evals] == [150, 300]
    # an update per step from --learning-starts 150 on: two critic losses each, finite
    assert len(run.mse_losses) == 2 * (300 - 150) and np.all(np.isfinite(run.mse_losses))

    buf = run.only("ReplayBuffer")
    assert len(buf) == 300 and buf.episodes_seen == 1
    everything = buf.sample(300, replace=False)
    assert len(set(everything.indices.tolist())) == 300
    assert not everything.terminated.any() and int(everything.truncated.sum()) == 1
    r = everything.reward
    assert np.all((r >= PENDULUM_MIN_REWARD - 1e-4) & (r <= 0.0))
    for o in (everything.obs, everything.next_obs):  # [cos theta, sin theta, theta dot]
        np.testing.assert_allclose(o[:, 0] ** 2 + o[:, 1] ** 2, 1.0, rtol=1e-5)
        assert np.all(np.abs(o[:, 2]) <= 8.0)
    # next_obs is exact: the obs of the next stored step within the episode ...
    stop = buf.sample_sequences(256, 2, episode_boundary="stop")
    np.testing.assert_array_equal(stop.next_obs[:, 0], stop.obs[:, 1])
    # ... and at the truncation the true final observation, not the next reset
    final = everything.next_obs[everything.truncated][0]
    assert not np.any(np.all(everything.obs == final, axis=1))


CHECKS: dict[str, Callable[[Run], None]] = {
    "dqn_per_cartpole.py": check_dqn,
    "ppo_cartpole.py": check_ppo,
    "sac_pendulum.py": check_sac,
}


def test_the_three_examples_exist() -> None:
    assert set(CASES) <= set(SCRIPTS)
    assert set(CHECKS) == set(CASES)


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs(script: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    threads = torch.get_num_threads()
    run = Run(tmp_path / "curves" / "learning_curve.png")
    record(run, monkeypatch)
    # every example takes --steps; the ones listed in CASES get tailored short settings
    # (and write their learning curve under tmp_path)
    argv = CASES.get(script, ["--steps", "300"])
    if script in CASES:
        argv = [*argv, "--plot", str(run.plot), "--quiet"]
    monkeypatch.setattr(sys, "argv", [script, *argv])
    try:
        runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    run.out = capsys.readouterr().out
    if script in CHECKS:
        CHECKS[script](run)


# default budget of each script -> (what it must reach, as its final greedy evaluation)
LEARNING = {
    # measured (seed 0): 500.0 +- 0.0 over 10 episodes at 50,000 steps; >= 475 from 10,000
    "dqn_per_cartpole.py": 475.0,
    # stops at its first evaluation >= --target 475: 476.8 +- 37.2 at 10,240 steps
    "ppo_cartpole.py": 475.0,
    # -142.3 +- 39.6 over 5 episodes at 20,000 steps; every evaluation from 4,000 steps on
    # was between -208 and -117; the random policy of the first 2,000 steps scores -1,566
    "sac_pendulum.py": -250.0,
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(LEARNING))
def test_example_learns_at_its_default_budget(script: str, monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    threads = torch.get_num_threads()
    plot = tmp_path / "curve.png"
    monkeypatch.setattr(sys, "argv", [script, "--quiet", "--plot", str(plot)])
    try:
        runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    final = re.findall(r"^final greedy eval: (\S+) \+- (\S+) over (\d+) episodes$", out,
                       flags=re.M)
    assert len(final) == 1, out
    assert float(final[0][0]) >= LEARNING[script], out
    check_png(plot)
