"""``replaybank demo``: train DQN on CartPole-v1 from replay filled by ``collect``.

Prioritized 3-step replay by default (``--buffer per``); ``uniform`` (one-step) and
``nstep`` (uniform, 3-step) for comparison. Shows a progress bar (steps/s, episode
return, loss) on a terminal, and a plain progress line every ``--progress-every`` seconds
when its output is piped or redirected (CI logs, nohup); evaluates the greedy policy every
``--eval-every`` env steps on
``--eval-episodes`` episodes, stops once an evaluation reaches ``--target`` (unless
``--no-early-stop``), writes a learning curve PNG and a buffer checkpoint into ``--out``,
reloads the checkpoint and checks that it samples identically, and prints a summary.

Example:
    >>> args = build_parser().parse_args(["--steps", "100", "--buffer", "uniform"])
    >>> args.steps, args.buffer, args.seed
    (100, 'uniform', 0)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from replaybank.cli.args import (
    finite_float,
    non_negative_float,
    non_negative_int,
    positive_int,
    writable_dir,
)
from replaybank.errors import require_extra

__all__ = ["DemoResult", "ProgressLines", "build_parser", "evaluate", "run_demo"]

ENV_ID = "CartPole-v1"


@dataclass
class DemoResult:
    """What a demo run measured (also printed as the summary)."""

    seed: int
    buffer: str
    env_steps: int = 0
    updates: int = 0
    evals: list[tuple[int, float]] = field(default_factory=list)
    episode_returns: list[float] = field(default_factory=list)
    episode_steps: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    checkpoint_identical: bool | None = None
    fill: int = 0
    capacity: int = 0
    episodes_seen: int = 0
    nbytes: int = 0
    out: str = ""

    @property
    def best_eval(self) -> float:
        """Best mean evaluation return (nan before any evaluation)."""
        return max((r for _, r in self.evals), default=float("nan"))

    @property
    def final_eval(self) -> float:
        """Last mean evaluation return."""
        return self.evals[-1][1] if self.evals else float("nan")

    @property
    def steps_to_target(self) -> int | None:
        """Env steps at the first evaluation >= 475 (None if never)."""
        return next((s for s, r in self.evals if r >= 475.0), None)


class _ParagraphFormatter(argparse.HelpFormatter):
    """Argparse's formatter, but the description keeps its paragraphs."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        fill = super()._fill_text  # bound here: zero-argument super() fails in a genexpr
        return "\n\n".join(fill(par, width, indent) for par in text.split("\n\n"))


def build_parser() -> argparse.ArgumentParser:
    """Arguments of ``replaybank demo``; ``--help`` is plain text and shows every default."""
    # the module docstring's first two paragraphs, without reST markup
    description = "\n\n".join((__doc__ or "").split("\n\n")[:2]).replace("``", "")
    p = argparse.ArgumentParser(prog="replaybank demo", description=description,
                                formatter_class=_ParagraphFormatter)
    p.add_argument("--buffer", choices=("uniform", "per", "nstep"), default="per",
                   help="replay scheme: per = prioritized 3-step, nstep = uniform 3-step, "
                        "uniform = uniform one-step (default: %(default)s)")
    p.add_argument("--steps", type=positive_int("--steps", "50000"), default=50_000,
                   help="env steps budget (default: %(default)s)")
    p.add_argument("--seed", type=non_negative_int("--seed", "0"), default=0,
                   help="seed of the envs, the network and the buffer (default: %(default)s)")
    p.add_argument("--out", default="replaybank_demo_out",
                   type=writable_dir("--out", "replaybank_demo_out"),
                   help="output directory for the plot and the checkpoint, created if missing "
                        "(default: %(default)s)")
    p.add_argument("--quiet", "--no-progress", dest="no_progress", action="store_true",
                   help="no progress output (default: a bar when stdout is a terminal, "
                        "else a plain line every --progress-every seconds)")
    p.add_argument("--progress-every", type=non_negative_float("--progress-every", "5"),
                   default=5.0, metavar="SECONDS",
                   help="seconds between the plain progress lines printed when stdout is "
                        "not a terminal (default: %(default)s)")
    p.add_argument("--num-envs", type=positive_int("--num-envs", "4"), default=4,
                   help="vectorized CartPole envs; one gradient update per two env steps "
                        "(default: %(default)s)")
    p.add_argument("--eval-every", type=positive_int("--eval-every", "2000"), default=2_000,
                   help="env steps between evaluations (default: %(default)s)")
    p.add_argument("--eval-episodes", type=positive_int("--eval-episodes", "10"), default=10,
                   help="greedy episodes per evaluation (default: %(default)s)")
    p.add_argument("--target", type=finite_float("--target", "475"), default=475.0,
                   help="mean evaluation return to reach (default: %(default)s)")
    p.add_argument("--no-early-stop", action="store_true",
                   help="keep training after the target is reached (default: stop)")
    p.add_argument("--threads", type=positive_int("--threads", "1"), default=1,
                   help="torch CPU threads (default: %(default)s)")
    return p


class ProgressLines:
    """Plain progress lines for output that is not a terminal (a pipe, a log file), where a
    live bar shows nothing until the end: one line when the run starts, then one every
    ``every`` seconds (steps done, their rate since the previous line, the values given,
    the time since the start), each flushed at once.

    Args:
        total: Env steps of the run.
        description: The text each line starts with.
        every: Seconds between two lines (``0``: a line at every update).
        stream: Where the lines go (default: ``sys.stdout`` at the time of each write).
        clock: The time source, in seconds (``time.monotonic``; a test passes its own).

    Example:
        >>> import io
        >>> ticks = iter([0.0, 1.0, 6.0])
        >>> out = io.StringIO()
        >>> lines = ProgressLines(1000, "DQN per", every=5.0, stream=out,
        ...                       clock=lambda: next(ticks))
        >>> lines.start()
        >>> lines.update(100, loss=0.5)  # 1 s later: too soon
        >>> lines.update(400, loss=0.25, ret=None)  # 6 s after the start
        >>> print(out.getvalue(), end="")
        DQN per: training for 1,000 env steps
        DQN per: 400/1,000 env steps (40%), 67 steps/s, loss 0.25, 6 s
    """

    def __init__(self, total: int, description: str, every: float = 5.0,
                 stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = int(total)
        self.description = description
        self.every = float(every)
        self._stream = stream
        self._clock = clock
        self._t0 = self._last = 0.0
        self._last_done = 0

    def _print(self, text: str) -> None:
        stream = sys.stdout if self._stream is None else self._stream
        print(f"{self.description}: {text}", file=stream, flush=True)

    def start(self) -> None:
        """Print the first line and start the clock."""
        self._t0 = self._last = self._clock()
        self._print(f"training for {self.total:,} env steps")

    def note(self, text: str) -> None:
        """Print ``text`` as a line now (an evaluation's result)."""
        self._print(text)

    def update(self, done: int, **values: float | None) -> None:
        """Print a line if ``every`` seconds have passed since the last one.

        Args:
            done: Env steps done so far.
            **values: Values shown after the rate (``None`` and ``nan`` left out).
        """
        now = self._clock()
        if now - self._last < self.every:
            return
        since, self._last = now - self._last, now
        rate = f", {(done - self._last_done) / since:,.0f} steps/s" if since > 0 else ""
        self._last_done = done
        elapsed = now - self._t0
        info = "".join(f", {k} {v:.4g}" for k, v in values.items()
                       if v is not None and v == v)  # None and nan left out
        self._print(f"{done:,}/{self.total:,} env steps ({100 * done / max(1, self.total):.0f}%)"
                    f"{rate}{info}, {elapsed:.0f} s")


def evaluate(agent: Any, n_episodes: int, seed: int) -> float:
    """Mean undiscounted return of ``n_episodes`` greedy episodes (one per sub-env)."""
    gym = require_extra("gymnasium", "gym")
    envs = gym.make_vec(ENV_ID, num_envs=n_episodes, vectorization_mode="sync")
    obs, _ = envs.reset(seed=seed)
    returns = np.zeros(n_episodes)
    running = np.ones(n_episodes, dtype=bool)
    while running.any():
        obs, r, term, trunc, _ = envs.step(agent.greedy(obs))
        returns[running] += r[running]
        running &= ~(term | trunc)
    envs.close()
    return float(returns.mean())


def _make_buffer(kind: str, capacity: int, num_envs: int, seed: int, gamma: float,
                 n_step: int, total_updates: int) -> Any:
    from replaybank.buffers.replay import ReplayBuffer

    if kind == "uniform":
        return ReplayBuffer(capacity, num_envs=num_envs, seed=seed)
    if kind == "nstep":
        return ReplayBuffer(capacity, num_envs=num_envs, seed=seed, n_step=n_step,
                               gamma=gamma)
    from replaybank.samplers.prioritized import PrioritizedSampler

    sampler = PrioritizedSampler(alpha=0.6, beta=0.4, beta_schedule="linear",
                                 beta_steps=max(1, total_updates))
    return ReplayBuffer(capacity, num_envs=num_envs, seed=seed, sampler=sampler,
                           n_step=n_step, gamma=gamma)


def _plot(result: DemoResult, path: Path) -> None:
    require_extra("matplotlib", "cli")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if result.episode_returns:
        ax.plot(result.episode_steps, result.episode_returns, ".", ms=2, alpha=0.4,
                label="training episodes")
    if result.evals:
        s, r = zip(*result.evals, strict=True)
        ax.plot(s, r, "o-", label="greedy evaluation (10 episodes)")
    ax.axhline(475, color="grey", ls="--", lw=1)
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    ax.set_title(f"DQN on {ENV_ID}, {result.buffer} replay, seed {result.seed}")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _check_checkpoint(buf: Any, out: Path) -> bool:
    """Save, reload, and compare one batch from each (same rng and sampler state)."""
    from replaybank.buffers.replay import ReplayBuffer

    ckpt = out / "buffer"
    buf.save(ckpt)
    loaded = ReplayBuffer.load(ckpt)  # the saved type: narrowed for the type checker
    if not isinstance(loaded, ReplayBuffer):
        return False
    a, b = buf.sample(256), loaded.sample(256)
    return bool(a == b) and len(loaded) == len(buf)


def run_demo(args: argparse.Namespace) -> DemoResult:
    """Train, evaluate, plot, checkpoint; returns the measurements."""
    from replaybank.integrations.progress import ProgressBar, progress_enabled

    t0 = time.perf_counter()
    bar_shown = progress_enabled(args.no_progress)
    # piped or redirected output gets plain lines (a bar would show only at the end),
    # the first one before torch is imported
    lines = None if bar_shown or args.no_progress else ProgressLines(
        max(args.steps, args.num_envs), f"DQN {args.buffer}", every=args.progress_every)
    if lines is not None:
        lines.start()
    torch = require_extra("torch", "torch")
    gym = require_extra("gymnasium", "gym")
    require_extra("matplotlib", "cli")  # for the plot at the end: refused before training
    from replaybank.cli.dqn import DQNAgent, DQNConfig
    from replaybank.integrations.gymnasium import Collector

    torch.set_num_threads(max(1, args.threads))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = DQNConfig()
    n_envs = args.num_envs
    steps = max(args.steps, n_envs)
    learning_starts = min(1_000, steps // 2)
    eps_decay_steps = max(1, int(0.25 * steps))
    # two env steps per gradient step, for any number of envs: the updates owed are
    # counted in halves, so one env gets one update every other step (n_envs // 2 per
    # collect gave none at all) and three envs get 1 and 2 in turn
    total_updates = (steps - learning_starts) // n_envs * n_envs // 2
    buf = _make_buffer(args.buffer, min(steps, 100_000) // n_envs * n_envs, n_envs, args.seed,
                       cfg.gamma, cfg.n_step if args.buffer != "uniform" else 1, total_updates)
    envs = gym.make_vec(ENV_ID, num_envs=n_envs, vectorization_mode="sync")
    agent = DQNAgent(int(np.prod(envs.single_observation_space.shape)),
                     int(envs.single_action_space.n), cfg, seed=args.seed)
    result = DemoResult(seed=args.seed, buffer=args.buffer, out=str(out))
    eps = [1.0]
    col = Collector(envs, lambda o: agent.act(o, eps[0]), buf, seed=args.seed)
    loss = float("nan")
    owed = 0  # env steps not yet paid for with gradient updates (two per update)
    next_eval = args.eval_every
    prioritized = args.buffer == "per"
    with ProgressBar(steps, f"DQN {args.buffer}", enabled=bar_shown) as bar:
        while result.env_steps < steps:
            eps[0] = max(0.05, 1.0 - 0.95 * result.env_steps / eps_decay_steps)
            res = col.collect(n_envs)
            result.env_steps += res.env_steps
            for r in res.episode_returns:
                result.episode_returns.append(r)
                result.episode_steps.append(result.env_steps)
            if result.env_steps >= learning_starts:
                owed += res.env_steps
                for _ in range(owed // 2):
                    batch = buf.sample(cfg.batch_size)
                    loss, td = agent.update(batch)
                    if prioritized:
                        buf.update_priorities(batch.indices, td)
                owed %= 2
            recent = result.episode_returns[-10:]
            mean_return = float(np.mean(recent)) if recent else None
            bar.update(res.env_steps, **{"return": mean_return}, loss=loss)
            if lines is not None:
                lines.update(result.env_steps, **{"return": mean_return}, loss=loss)
            if result.env_steps >= next_eval or result.env_steps >= steps:
                next_eval += args.eval_every
                score = evaluate(agent, args.eval_episodes, seed=10_000 + len(result.evals))
                result.evals.append((result.env_steps, score))
                if lines is not None:
                    lines.note(f"greedy evaluation at {result.env_steps:,} env steps: "
                               f"mean return {score:.1f} over {args.eval_episodes} episodes")
                if score >= args.target and not args.no_early_stop:
                    break
    envs.close()
    result.updates = agent.updates
    result.fill, result.capacity = len(buf), buf.capacity
    result.episodes_seen, result.nbytes = buf.episodes_seen, buf.nbytes()
    _plot(result, out / "learning_curve.png")
    try:
        result.checkpoint_identical = _check_checkpoint(buf, out)
    except ModuleNotFoundError as exc:  # checkpoint support not installed in this tree
        if "replaybank.io" not in str(exc):
            raise
        result.checkpoint_identical = None
    result.wall_s = time.perf_counter() - t0
    return result


def print_summary(result: DemoResult) -> None:
    """Print the final summary (rich table when rich is installed)."""
    rows = [
        ("env steps", f"{result.env_steps:,}"),
        ("gradient updates", f"{result.updates:,}"),
        ("buffer", f"{result.buffer} ({result.fill:,} / {result.capacity:,} transitions)"),
        ("episodes seen", f"{result.episodes_seen:,}"),
        ("mean episode return (last 20)",
         f"{np.mean(result.episode_returns[-20:]):.1f}" if result.episode_returns else "-"),
        ("buffer memory", f"{result.nbytes / 2**20:.2f} MiB"),
        ("best eval (10 episodes)", f"{result.best_eval:.1f}"),
        ("final eval", f"{result.final_eval:.1f}"),
        ("steps to eval >= 475",
         f"{result.steps_to_target:,}" if result.steps_to_target is not None else "not reached"),
        ("checkpoint reloads identically", str(result.checkpoint_identical)),
        ("wall time", f"{result.wall_s:.1f} s"),
        ("outputs", f"{result.out}/learning_curve.png, {result.out}/buffer/"),
    ]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for k, v in rows:
            print(f"{k:32s} {v}")
        return
    table = Table(title="replaybank demo", show_header=False)
    for k, v in rows:
        table.add_row(k, v)
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``replaybank demo``; returns the exit status."""
    args = build_parser().parse_args(argv)
    result = run_demo(args)
    print_summary(result)
    return 1 if result.checkpoint_identical is False else 0
