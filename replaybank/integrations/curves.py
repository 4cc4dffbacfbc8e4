"""A learning curve: training episode returns and greedy evaluations against env steps,
recorded during a run and drawn as a PNG.

:class:`LearningCurve` keeps the points; :meth:`LearningCurve.plot` draws the training
episodes as dots, each evaluation's mean as a line with its min-max range shaded, and an
optional target return as a dashed line. It draws with matplotlib's object API on an Agg
canvas (no pyplot, so the caller's backend and open figures are left alone).

Example:
    >>> curve = LearningCurve("DQN on CartPole-v1", target=475.0)
    >>> curve.add_episodes(100, [12.0, 20.0])
    >>> curve.add_eval(100, [9.0, 10.0, 11.0])
    (10.0, 0.816496580927726)
    >>> curve.last_eval
    (100, 10.0, 0.816496580927726, 3)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replaybank.errors import ConfigError, describe, require_extra

__all__ = ["LearningCurve"]


@dataclass
class LearningCurve:
    """Episode returns and greedy evaluations of one training run, by env step.

    Args:
        title: Title of the plot.
        target: A return to draw as a dashed line (e.g. 475 on CartPole-v1), or None.

    Attributes:
        episode_steps: Env step at which each training episode ended.
        episode_returns: Return of each training episode.
        eval_steps: Env step of each evaluation.
        eval_returns: Returns of the episodes of each evaluation.

    Example:
        >>> curve = LearningCurve("SAC on Pendulum-v1")
        >>> curve.add_eval(2000, [-150.0, -250.0])
        (-200.0, 50.0)
    """

    title: str = "learning curve"
    target: float | None = None
    episode_steps: list[int] = field(default_factory=list)
    episode_returns: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_returns: list[list[float]] = field(default_factory=list)

    def add_episodes(self, step: int, returns: Iterable[float]) -> None:
        """Record training episodes that ended by env step ``step``."""
        for r in returns:
            self.episode_steps.append(int(step))
            self.episode_returns.append(float(r))

    def add_eval(self, step: int, returns: Any) -> tuple[float, float]:
        """Record an evaluation at env step ``step``; returns its mean and std.

        Args:
            step: Env steps taken when the evaluation ran.
            returns: The evaluation's episode returns, ``[episodes]`` (at least one).

        Raises:
            ConfigError: ``returns`` is empty, not one-dimensional or not finite.
        """
        values = np.asarray(returns, dtype=np.float64)
        if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)):
            raise ConfigError(
                f"add_eval(returns={describe(returns)}): returns must be the finite "
                "returns of at least one episode, shape [episodes]; pass e.g. what "
                "evaluate_policy returned"
            )
        self.eval_steps.append(int(step))
        self.eval_returns.append(values.tolist())
        return float(values.mean()), float(values.std())

    @property
    def last_eval(self) -> tuple[int, float, float, int] | None:
        """``(step, mean, std, episodes)`` of the latest evaluation, or None before any."""
        if not self.eval_steps:
            return None
        values = np.asarray(self.eval_returns[-1])
        return self.eval_steps[-1], float(values.mean()), float(values.std()), values.size

    def plot(self, path: str | Path, dpi: int = 100) -> Path:
        """Draw the curve into a PNG file (parent directories are created).

        Args:
            path: File to write.
            dpi: Resolution.

        Returns:
            The path written.

        Raises:
            MissingDependencyError: matplotlib is not installed.
        """
        require_extra("matplotlib", "cli")
        from matplotlib.figure import Figure

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig = Figure(figsize=(7, 4))
        ax = fig.subplots()
        if self.episode_returns:
            ax.plot(self.episode_steps, self.episode_returns, ".", ms=2, alpha=0.4,
                    label="training episodes")
        if self.eval_steps:
            evals = [np.asarray(r) for r in self.eval_returns]
            means = [float(r.mean()) for r in evals]
            n = {r.size for r in evals}
            size = f"{n.pop()} episodes" if len(n) == 1 else "episodes"
            ax.plot(self.eval_steps, means, "o-", label=f"greedy evaluation (mean of {size})")
            ax.fill_between(self.eval_steps, [float(r.min()) for r in evals],
                            [float(r.max()) for r in evals], alpha=0.2, label="evaluation min-max")
        if self.target is not None:
            ax.axhline(self.target, color="grey", ls="--", lw=1, label=f"target {self.target:g}")
        ax.set_xlabel("env steps")
        ax.set_ylabel("episode return")
        ax.set_title(self.title)
        if self.episode_returns or self.eval_steps or self.target is not None:
            ax.legend(loc="best")
        fig.tight_layout()
        fig.savefig(path, dpi=dpi, format="png")
        return path
