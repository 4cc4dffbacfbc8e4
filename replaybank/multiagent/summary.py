"""Per-agent statistics of stored multi-agent steps (what ``replaybank inspect`` shows).

For each agent, over the steps a buffer holds now (a replay buffer's live steps, a
rollout's rows ``[0, pos)``), lane by lane in time order:

* ``fields``: the agent's stored fields (``obs``, ``action``, per-agent extras) with
  their core names, item shapes, dtypes and bytes;
* ``active_steps`` (``active_per_lane``, ``active_fraction`` of the stored joint steps):
  the steps where the agent acted;
* ``terminated``, ``truncated``: the agent's own ends among them;
* ``reward``: statistics of its reward per active step;
* ``episodes``, ``returns``, ``lengths``: the agent's *own* episodes wholly stored: from
  the step after its previous end (or the lane's first stored step, when nothing before
  it was lost) up to and including its next end; the return sums its rewards there, the
  length counts its active steps. (The joint episodes are the core's:
  ``replaybank inspect`` shows them as for a single-agent buffer.)

Statistics are ``{"count", "nonfinite", "mean", "std", "min", "max"}`` (:func:`stats`:
NaN and infinite values are counted in ``nonfinite`` and left out of the others) or None
when there is nothing to count.

Example:
    >>> import numpy as np
    >>> steps = AgentSteps(active=[np.array([1, 1, 0, 1, 1], bool)],
    ...                    reward=[np.array([1.0, 2.0, 0.0, 4.0, 5.0])],
    ...                    terminated=[np.array([0, 1, 0, 0, 0], bool)],
    ...                    truncated=[np.array([0, 0, 0, 0, 1], bool)])
    >>> s = agent_summary(steps, [True], [])
    >>> s["active_steps"], s["terminated"], s["truncated"], s["episodes"]
    (4, 1, 1, 2)
    >>> s["returns"]["min"], s["returns"]["max"], s["lengths"]["mean"], s["reward"]["mean"]
    (3.0, 9.0, 2.0, 3.0)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.multiagent.layout import PARTED, AgentLayout
from replaybank.ops.segments import segment_sums
from replaybank.spec import SEP

__all__ = ["AgentSteps", "agent_summary", "layout_fields", "stats"]

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class AgentSteps:
    """One agent's stored steps, one array per lane, oldest first (``[n_lane]`` each).

    Attributes:
        active: The agent acted.
        reward: Its reward (0 where it did not act).
        terminated: It terminated at the step.
        truncated: It was truncated at the step.
    """

    active: list[BoolArray]
    reward: list[FloatArray]
    terminated: list[BoolArray]
    truncated: list[BoolArray]

    @classmethod
    def of(cls, columns: Callable[[str], list[npt.NDArray[Any]]], agent: str,
           names: Mapping[str, str]) -> AgentSteps:
        """Read the four columns of ``agent``: ``columns(core_name)`` gives a field's
        per-lane arrays; ``names`` maps ``active``, ``reward``, ``terminated`` and
        ``truncated`` to the prefix the buffer stores them under."""
        def col(key: str, dtype: Any) -> list[Any]:
            return [np.asarray(c, dtype) for c in columns(f"{names[key]}{SEP}{agent}")]

        return cls(col("active", np.bool_), col("reward", np.float64),
                   col("terminated", np.bool_), col("truncated", np.bool_))


def stats(values: npt.NDArray[Any]) -> dict[str, Any] | None:
    """``{"count", "nonfinite", "mean", "std", "min", "max"}`` of ``values``, or None when
    empty.

    ``count`` counts every value; ``nonfinite`` those that are NaN or infinite (a NaN
    reward makes its episode's return NaN), which the other four leave out (they are None
    when no value is finite). So the summary shows that such values are stored, and stays
    valid JSON (``NaN`` and ``Infinity`` are not JSON).

    Example:
        >>> stats(np.array([1.0, np.nan, 3.0, np.inf]))
        {'count': 4, 'nonfinite': 2, 'mean': 2.0, 'std': 1.0, 'min': 1.0, 'max': 3.0}
    """
    if values.size == 0:
        return None
    v = values.astype(np.float64).reshape(-1)
    finite = v[np.isfinite(v)]
    out: dict[str, Any] = {"count": int(v.size), "nonfinite": int(v.size - finite.size)}
    if finite.size == 0:
        return {**out, "mean": None, "std": None, "min": None, "max": None}
    return {**out, "mean": float(finite.mean()), "std": float(finite.std()),
            "min": float(finite.min()), "max": float(finite.max())}


def layout_fields(layout: AgentLayout | None, agent: str,
                  nbytes: Callable[[str], int | None]) -> list[dict[str, Any]]:
    """The agent's stored fields: ``[{"name", "core", "shape", "dtype", "bytes"}]``
    (``name``: ``obs`` (``obs/<key>`` for each key of a dict observation), ``action``
    (``action/<key>`` for each part of an action stored part by part, e.g. a Tuple
    action's ``action/0``) or the extra's; ``core``: the stored name)."""
    if layout is None:
        return []
    out = []
    for top, per in layout.per_agent.items():
        keys = layout.keys(top, agent) if top in PARTED else None
        # a dict observation (an action of parts): one field per key (``obs/<key>``,
        # ``action/<key>``), stored as its leaves
        leaves = [(top, per[agent])] if keys is None else \
            [(f"{top}{SEP}{k}", per[f"{agent}{SEP}{k}"]) for k in keys]
        for name, f in leaves:
            out.append({"name": name, "core": f.name, "shape": list(f.shape),
                        "dtype": str(np.dtype(f.dtype)), "bytes": nbytes(f.name)})
    return out


def agent_summary(steps: AgentSteps, first_is_start: list[bool],
                  fields: list[dict[str, Any]]) -> dict[str, Any]:
    """One agent's statistics (module doc) from its steps.

    Args:
        steps: The agent's stored steps per lane.
        first_is_start: Per lane, whether its first stored step followed nothing lost
            (so the agent's first episode there is whole).
        fields: The agent's fields (:func:`layout_fields`).

    Returns:
        The JSON-able summary.
    """
    rets: list[FloatArray] = []
    lens: list[npt.NDArray[np.int64]] = []
    rewards: list[FloatArray] = []
    per_lane: list[int] = []
    n_term = n_trunc = total = 0
    for lane, act in enumerate(steps.active):
        term = act & steps.terminated[lane]
        trunc = act & steps.truncated[lane]
        r = np.where(act, steps.reward[lane], 0.0)
        per_lane.append(int(act.sum()))
        total += int(act.size)
        n_term += int(term.sum())
        n_trunc += int(trunc.sum())
        rewards.append(r[act])
        ends = np.flatnonzero(term | trunc)
        if ends.size == 0:
            continue
        starts = np.concatenate([[0], ends[:-1] + 1])
        if not first_is_start[lane]:
            starts, ends = starts[1:], ends[1:]
        # each episode summed on its own: a NaN reward spoils its episode's return only
        rets.append(segment_sums(r, starts, ends))
        lens.append(segment_sums(act, starts, ends).astype(np.int64))
    returns = np.concatenate(rets) if rets else np.zeros(0)
    lengths = np.concatenate(lens) if lens else np.zeros(0, np.int64)
    active = sum(per_lane)
    return {
        "fields": fields, "active_steps": active, "active_per_lane": per_lane,
        "active_fraction": active / total if total else 0.0,
        "terminated": n_term, "truncated": n_trunc,
        "reward": stats(np.concatenate(rewards) if rewards else np.zeros(0)),
        "episodes": int(lengths.size), "returns": stats(returns), "lengths": stats(lengths),
    }
