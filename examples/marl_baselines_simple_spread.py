"""Baselines and the shared greedy evaluation of the simple_spread MARL examples.

    python examples/marl_baselines_simple_spread.py --episodes 200 --seed-start 0

mpe2's ``simple_spread_v3`` (3 agents, 3 landmarks, 25-step episodes that end by
truncation, discrete actions). Every agent's reward is ``0.5 * global + 0.5 * local``: the
global part (minus the sum over landmarks of the distance of the closest agent) is the same
for all agents, the local part is -1 per collision of that agent. The score of these
examples is the *per-agent mean return*: each episode's undiscounted return averaged over
the agents, then averaged over episodes.

This module is also imported (by path) by ``marl_vdn_simple_spread.py`` and
``marl_mappo_simple_spread.py`` for :func:`evaluate` (reset seeds ``1000 .. 1000 + N - 1``
by default), :func:`write_csv` and :func:`plot_curves`. Run as a script it prints the
random policy's and the fixed-assignment heuristic's scores (agent ``i`` moves straight
toward landmark ``i``), and with ``--plot OUT --csv FILE ...`` draws learning curves from
the examples' evaluation CSVs.

Discrete actions (mpe2 ``_mpe_utils/simple_env.py``, ``_set_action``): 0 no-op,
1 ``u_x = -1``, 2 ``u_x = +1``, 3 ``u_y = -1``, 4 ``u_y = +1``. Observation of agent ``i``
(18 floats): own velocity [0:2], own position [2:4], the 3 landmarks relative to the agent
[4:10], the 2 other agents relative to it [10:14], communication [14:18] (zeros).
"""

from __future__ import annotations

import argparse
import csv
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

N_AGENTS = 3
MAX_CYCLES = 25
EVAL_SEED = 1000
#: Per-agent mean return over 200 episodes (reset seeds 0-199), measured by issue 30's author.
ISSUE_RANDOM, ISSUE_HEURISTIC, TARGET = -27.0, -15.5, -23.2

BatchPolicy = Callable[[np.ndarray], np.ndarray]  # obs [N, n_agents, 18] -> actions [N, n_agents]


def make_env():  # type: ignore[no-untyped-def]
    """A fresh ``simple_spread_v3`` parallel env (25-step episodes, discrete actions)."""
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=N_AGENTS, max_cycles=MAX_CYCLES,
                                         continuous_actions=False)


def evaluate(policy: BatchPolicy, episodes: int = 100, seed: int = EVAL_SEED) -> np.ndarray:
    """Play ``episodes`` episodes in lockstep (episode ``k`` reset with ``seed + k``).

    Args:
        policy: Maps the stacked observations ``[episodes, n_agents, 18]`` (agents in
            ``env.possible_agents`` order) to actions ``[episodes, n_agents]``.
        episodes: Episodes to play.
        seed: Reset seed of the first episode.

    Returns:
        The per-agent mean return of each episode, ``[episodes]`` float64.
    """
    envs = [make_env() for _ in range(episodes)]
    agents = list(envs[0].possible_agents)
    obs = [e.reset(seed=seed + k)[0] for k, e in enumerate(envs)]
    returns = np.zeros((episodes, len(agents)))  # [episodes, n_agents]
    running = np.ones(episodes, dtype=bool)
    while running.any():
        live = np.flatnonzero(running)
        x = np.stack([np.stack([obs[k][a] for a in agents]) for k in live])
        actions = np.asarray(policy(x.astype(np.float32)))  # [live, n_agents]
        for row, k in enumerate(live):
            o, r, term, trunc, _ = envs[k].step(
                {a: int(actions[row, i]) for i, a in enumerate(agents)})
            returns[k] += [r[a] for a in agents]
            obs[k] = o
            if all(term[a] or trunc[a] for a in agents) or not envs[k].agents:
                running[k] = False
    for e in envs:
        e.close()
    return returns.mean(axis=1)


def random_policy(seed: int) -> BatchPolicy:
    """Uniform random actions."""
    rng = np.random.default_rng(seed)
    return lambda obs: rng.integers(0, 5, obs.shape[:2])


def heuristic_policy(obs: np.ndarray) -> np.ndarray:
    """Agent ``i`` moves straight toward landmark ``i``: the action along the axis where
    the landmark is farther, in its direction.

    Args:
        obs: ``[N, n_agents, 18]``.

    Returns:
        ``[N, n_agents]`` int64 actions.
    """
    n = obs.shape[1]
    idx = np.arange(n)
    rel = obs[:, idx[:, None], 4 + 2 * idx[:, None] + np.arange(2)]  # [N, n_agents, 2]: landmark i
    dx, dy = rel[..., 0], rel[..., 1]
    x_axis = np.abs(dx) >= np.abs(dy)
    return np.where(x_axis, np.where(dx < 0, 1, 2), np.where(dy < 0, 3, 4)).astype(np.int64)


def write_csv(path: Path, rows: Sequence[tuple[int, float, float, int, float]]) -> Path:
    """Write evaluation points ``(step, mean, std, episodes, seconds)`` to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "eval_mean", "eval_std", "episodes", "seconds"])
        for row in rows:
            w.writerow([row[0], f"{row[1]:.4f}", f"{row[2]:.4f}", row[3], f"{row[4]:.1f}"])
    return path


def plot_curves(csvs: Sequence[Path], out: Path, random: float = ISSUE_RANDOM,
                heuristic: float = ISSUE_HEURISTIC, target: float = TARGET) -> Path:
    """Draw every CSV's evaluation means against env steps, one panel per algorithm (the
    file name's ``vdn``/``mappo``), with the baselines and the target as lines."""
    from matplotlib.figure import Figure

    groups: dict[str, list[Path]] = {}
    for p in csvs:
        algo = "VDN (MultiAgentReplayBuffer)" if "vdn" in p.name.lower() else \
            "MAPPO (MultiAgentRolloutBuffer)"
        groups.setdefault(algo, []).append(p)
    fig = Figure(figsize=(6 * len(groups), 4.2))
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    for ax, (algo, paths) in zip(axes, sorted(groups.items(), reverse=True), strict=True):
        for p in sorted(paths):
            with p.open() as f:
                rows = list(csv.DictReader(f))
            steps = [int(r["step"]) for r in rows]
            means = [float(r["eval_mean"]) for r in rows]
            ax.plot(steps, means, "o-", ms=3, label=p.stem.split("_")[-1])
        ax.axhline(heuristic, color="green", ls=":", label=f"heuristic {heuristic:g}")
        ax.axhline(target, color="grey", ls="--", label=f"target {target:g}")
        ax.axhline(random, color="red", ls=":", label=f"random {random:g}")
        ax.set_title(f"{algo}, simple_spread_v3")
        ax.set_xlabel("joint env steps (summed over envs)")
        ax.set_ylabel("greedy eval: per-agent mean return")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, format="png")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--steps", type=int, default=None,
                   help="env steps per policy instead (episodes = steps // 25)")
    p.add_argument("--seed-start", type=int, default=0, help="reset seed of the first episode")
    p.add_argument("--seed", type=int, default=0, help="seed of the random policy")
    p.add_argument("--plot", type=Path, default=None, help="draw these CSVs into this PNG")
    p.add_argument("--csv", type=Path, nargs="*", default=[])
    args = p.parse_args()
    if args.plot is not None:
        print(f"learning curves: {plot_curves(args.csv, args.plot)}")
        return
    episodes = args.episodes if args.steps is None else max(1, args.steps // MAX_CYCLES)
    for name, policy in (("random", random_policy(args.seed)), ("heuristic", heuristic_policy)):
        start = time.time()
        r = evaluate(policy, episodes, seed=args.seed_start)
        print(f"{name:9s}: per-agent mean return {r.mean():7.2f} (standard error "
              f"{r.std(ddof=1) / np.sqrt(len(r)) if len(r) > 1 else 0.0:.2f}) over {len(r)} "
              f"episodes, reset seeds {args.seed_start}-{args.seed_start + len(r) - 1} "
              f"({time.time() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
