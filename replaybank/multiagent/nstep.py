"""Per-agent n-step returns of joint steps: each agent's own return, cut at its own end.

The core's :class:`~replaybank.views.nstep.NStepView` sums the *joint* reward over a
window of ``L`` joint steps (``L = min(n, steps up to and including the first step whose
next observation is not the next step's``: the joint episode's end, a discontinuity in
the data, or the lane's newest step). :class:`AgentNStepView` wraps it and serves, for
each agent ``a`` and sampled joint step ``t``, the agent's own n-step transition over
the same window, cut where the agent ended:

* ``L_a = min(L, steps up to and including the first step of the window where agent a
  terminated or truncated)``, ``1 <= L_a <= L``;
* ``rewards/<a>`` = ``sum_{k < L_a} gamma**k r_a[t+k]`` (the stored per-agent rewards,
  which are 0 at steps where the agent did not act, so the sum runs over its active
  steps; discounted by :func:`replaybank.ops.nstep.discounted_returns`, float32);
* ``discounts/<a>`` = ``gamma ** L_a`` float32;
* ``terminations/<a>``, ``truncations/<a>``: the agent's flags at step ``t + L_a - 1``
  (True there only where the agent ended at that step);
* ``next_obs/<a>``: the agent's observation after step ``t + L_a - 1``: its exact final
  observation where it ended there; where it did not act at that step, its latest
  observation (the placeholder :mod:`replaybank.multiagent.episodes` stores).

An agent that did not act at ``t`` (``active/<a>`` False) has nothing to learn from:
reward 0, discount 0, no end (and zero observations in the batch). Bootstrap with
``reward[a] + discount[a] * (1 - terminated[a]) * V_a(next_obs[a])``. Since the joint
episode ends only when every agent that acted in it has ended, an agent active at ``t``
always ends at or before the joint end: its window never runs past it.

Example:
    >>> import numpy as np
    >>> from replaybank.multiagent import MultiAgentReplayBuffer
    >>> buf = MultiAgentReplayBuffer(16, ["a", "b"], n_step=3, gamma=0.5, seed=0)
    >>> for t in range(4):               # b terminates at t = 1, a at t = 3
    ...     acting = ["a", "b"] if t < 2 else ["a"]
    ...     buf.add(obs={k: np.full(2, t, np.float32) for k in acting},
    ...             action={k: 0 for k in acting}, reward={k: 1.0 for k in acting},
    ...             next_obs={k: np.full(2, t + 1, np.float32) for k in acting},
    ...             terminated={k: (k == "b" and t == 1) or t == 3 for k in acting},
    ...             truncated={k: False for k in acting})
    >>> out = buf.buffer.view.gather(buf.buffer.table, np.array([0]))
    >>> out["rewards/a"].tolist(), out["discounts/a"].tolist()  # 1 + .5 + .25
    ([1.75], [0.125])
    >>> out["rewards/b"].tolist(), out["discounts/b"].tolist(), out["terminations/b"].tolist()
    ([1.5], [0.25], [True])
    >>> out["next_obs/b"][:, 0].tolist()  # b's final observation
    [2.0]
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.host import as_numpy
from replaybank.ops import nstep
from replaybank.spec import SEP
from replaybank.storage.table import StepTable
from replaybank.views.nstep import NStepView

__all__ = ["AGENT_DISCOUNT", "AgentNStepView", "agent_windows"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Core field prefix of the per-agent discounts a :class:`AgentNStepView` adds.
AGENT_DISCOUNT = "discounts"


def _like(ref: Any, values: npt.NDArray[Any]) -> Any:
    """``values`` in the form of ``ref``: numpy, or a tensor on ``ref``'s device (torch is
    taken from ``sys.modules``: torch storage imported it already)."""
    if isinstance(ref, np.ndarray):
        return values
    return sys.modules["torch"].as_tensor(values, device=ref.device)


def agent_windows(ended: BoolArray, length: IntArray) -> IntArray:
    """The agents' window lengths ``L_a`` ``[B]``: steps up to and including the first
    step where the agent ended, at most the joint window length.

    Args:
        ended: ``[B, n]`` bool: the agent terminated or truncated at window step ``k``
            (entries at ``k >= length`` are ignored).
        length: ``[B]`` joint window lengths in ``[1, n]``.

    Example:
        >>> ended = np.array([[False, True, False], [False, False, True]])
        >>> agent_windows(ended, np.array([3, 2])).tolist()
        [2, 2]
    """
    n = ended.shape[1]
    last = np.arange(n)[None, :] == (np.asarray(length) - 1)[:, None]  # [B, n]
    return nstep.window_lengths(np.asarray(ended, bool) | last)


def _obs_leaves(table: StepTable, agent: str) -> list[str]:
    """The stored observation fields of ``agent``: ``obs/<agent>``, or
    ``obs/<agent>/<key>`` per key of a dict observation."""
    flat = f"obs{SEP}{agent}"
    if flat in table.arrays:
        return [flat]
    return [n for n in table.arrays if n.startswith(f"{flat}{SEP}")]


class AgentNStepView:
    """The core n-step view plus per-agent n-step fields (see the module docstring).

    It serves every field of the wrapped view and overrides ``rewards/<a>``,
    ``terminations/<a>``, ``truncations/<a>`` and ``next_obs/<a>`` (each
    ``next_obs/<a>/<key>`` of a dict observation) with the agents' own
    n-step values, adding ``discounts/<a>``. Its config and state are the wrapped view's,
    so configs and checkpoints are those of a plain n-step buffer.

    Args:
        inner: The core's n-step view.
        agents: Agent names.

    Example:
        >>> v = AgentNStepView(NStepView(3, 0.9), ("a", "b"))
        >>> v.config(), v.every_step
        ({'type': 'nstep', 'n': 3, 'gamma': 0.9}, True)
    """

    every_step = True

    def __init__(self, inner: NStepView, agents: tuple[str, ...]) -> None:
        self.inner = inner
        self.agents = tuple(agents)

    def gather(self, table: StepTable, keys: IntArray,
               rng: np.random.Generator | None = None) -> dict[str, Any]:
        """Fields of the n-step transitions starting at ``keys`` ``[B]`` (``[B, *shape]``)."""
        keys = np.asarray(keys, dtype=np.int64)
        out = self.inner.gather(table, keys, rng)
        wslots, length = self.inner.window(table, keys)  # [B, n], [B]
        rows = np.arange(len(keys))
        gamma = self.inner.gamma
        for a in self.agents:
            ended = as_numpy(table.take(f"terminations{SEP}{a}", wslots)) \
                | as_numpy(table.take(f"truncations{SEP}{a}", wslots))  # [B, n]
            la = agent_windows(ended, length)  # [B]
            acted = as_numpy(out[f"active{SEP}{a}"])  # [B]: the agent acted at t
            rewards = table.take(f"rewards{SEP}{a}", wslots)  # [B, n]
            ret = nstep.discounted_returns(as_numpy(rewards), la, gamma)  # [B] float64
            disc = gamma ** la.astype(np.float64)
            last = wslots[rows, la - 1]  # [B] slots of step t + L_a - 1
            for prefix in ("terminations", "truncations"):
                name = f"{prefix}{SEP}{a}"
                flag = as_numpy(table.take(name, last)) & acted
                out[name] = _like(out[name], flag)
            name = f"rewards{SEP}{a}"
            out[name] = _like(out[name], np.where(acted, ret, 0.0).astype(np.float32))
            out[f"{AGENT_DISCOUNT}{SEP}{a}"] = _like(
                out[name], np.where(acted, disc, 0.0).astype(np.float32))
            nxt = table.next_index(last)
            for leaf in _obs_leaves(table, a):  # obs/<a>, or obs/<a>/<key> per key
                out[f"next_{leaf}"] = table.take_next(leaf, *nxt)
        return out

    def last_keys(self, table: StepTable, keys: IntArray) -> IntArray:
        """Keys ``[B]`` of the last step of each key's joint window."""
        return self.inner.last_keys(table, keys)

    def valid(self, table: StepTable, keys: IntArray) -> npt.NDArray[np.bool_] | None:
        """Every live step starts a window: always None."""
        return None

    def config(self) -> dict[str, Any]:
        """The wrapped view's config (a buffer rebuilt from it wraps it again)."""
        return self.inner.config()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped view's state."""
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.inner.load_state_dict(state)
