"""Per-env bookkeeping of the joint episode: which agents are alive or done, and what an
agent that does not act stores.

The rules (one env, one joint step):

* an agent *acts* at a step when it is in the step's dicts (and, with several envs,
  ``active`` does not say otherwise for that env); an agent that does not act stores a
  placeholder and ``active=False``, reward 0 and no end;
* an agent *ends* at a step where it acts with ``terminated`` or ``truncated``; it may not
  act again in that episode;
* the *joint episode ends* at a step where no agent is left alive: every agent that
  acted in the episode has ended. The joint ``terminated`` is True when every agent that
  ended at that step terminated, else the joint ``truncated`` is (so bootstrapping
  continues when any agent was cut off by a time limit);
* the placeholder observation of an agent that does not act is its latest stored next
  observation in this env and episode (zeros before it first acts): the joint step then
  continues bitwise where an agent leaves early, so the core links it (no observation
  kept aside, no break in sequence windows), and the leaving step's ``next_obs`` is still
  exactly the agent's final observation. Batches show zeros for an agent that did not act
  (:mod:`replaybank.multiagent.batch`).

Example:
    >>> import numpy as np
    >>> ep = Episodes(2, 1)
    >>> act = np.array([[True], [True]])
    >>> ends = ep.ends(act, np.array([[True], [False]]), np.array([[False], [False]]))
    >>> ends.ended.tolist(), ends.episode_end.tolist()  # agent 1 is still alive
    ([[True], [False]], [False])
    >>> ep.commit(act, ends, np.array([0]))  # agent 0 ended, agent 1 is alive
    >>> ep.alive.tolist(), ep.ended.tolist()
    ([[False], [True]], [[True], [False]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import ArgumentError, CheckpointError, describe

__all__ = ["Ends", "Episodes", "env_lanes"]

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


def env_lanes(call: str, env_ids: Any, num_envs: int) -> IntArray:
    """``env_ids`` (None: every env; an int or a list of distinct ints) as lanes ``[m]``.

    Raises:
        ArgumentError: Not ints, out of ``[0, num_envs)``, or repeated.

    Example:
        >>> env_lanes("end_episodes", None, 3).tolist(), env_lanes("end_episodes", 1, 3).tolist()
        ([0, 1, 2], [1])
    """
    if env_ids is None:
        return np.arange(num_envs, dtype=np.int64)
    ids = np.atleast_1d(np.asarray(env_ids))
    if ids.ndim != 1 or ids.dtype.kind not in "iu" or isinstance(env_ids, bool) \
            or bool(((ids < 0) | (ids >= num_envs)).any()) or len(set(ids.tolist())) != ids.size:
        raise ArgumentError(
            f"{call}(env_ids={describe(env_ids)}): expected distinct env indices in "
            f"[0, {num_envs}) (an int or a list of ints), or None for every env")
    return ids.astype(np.int64)


@dataclass(frozen=True)
class Ends:
    """What one joint step ends, per env of the call.

    Attributes:
        ended: ``[n_agents, n]`` bool: the agent acted and terminated or truncated.
        episode_end: ``[n]`` bool: no agent is left alive after the step.
        terminated: ``[n]`` bool: the joint episode ended and every agent that ended at
            this step terminated.
        truncated: ``[n]`` bool: the joint episode ended otherwise.
    """

    ended: BoolArray
    episode_end: BoolArray
    terminated: BoolArray
    truncated: BoolArray


class Episodes:
    """Alive and ended agents per env, and the placeholder observations.

    Args:
        n_agents: Number of agents.
        num_envs: Number of envs (lanes).

    Attributes:
        alive: ``[n_agents, num_envs]`` bool: acted in the current episode, not ended.
        ended: ``[n_agents, num_envs]`` bool: ended in the current episode.
        carry: ``{agent: [num_envs, *obs_shape]}``: the placeholder observation of each
            agent (set by :meth:`allocate`).
    """

    def __init__(self, n_agents: int, num_envs: int) -> None:
        self.alive = np.zeros((n_agents, num_envs), np.bool_)
        self.ended = np.zeros((n_agents, num_envs), np.bool_)
        self.carry: dict[str, npt.NDArray[Any]] = {}

    def allocate(self, shapes: dict[str, tuple[tuple[int, ...], np.dtype[Any]]]) -> None:
        """Create the zero placeholders: ``{agent: (obs_shape, dtype)}``."""
        lanes = self.alive.shape[1]
        self.carry = {a: np.zeros((lanes, *shape), dtype) for a, (shape, dtype) in shapes.items()}

    def ends(self, act: BoolArray, terminated: BoolArray, truncated: BoolArray,
             lanes: IntArray | None = None) -> Ends:
        """The ends of a step (nothing is changed).

        Args:
            act: ``[n_agents, n]`` bool: which agents act in each env of the call.
            terminated: ``[n_agents, n]`` bool (False where an agent does not act).
            truncated: ``[n_agents, n]`` bool (False where an agent does not act).
            lanes: The call's envs (``[n]``; None: all).
        """
        sel = slice(None) if lanes is None else lanes
        ended = act & (terminated | truncated)  # [n_agents, n]
        alive_after = (self.alive[:, sel] | act) & ~ended
        episode_end: BoolArray = np.asarray(act.any(axis=0) & ~alive_after.any(axis=0))
        all_terminated: BoolArray = np.asarray(np.all(~ended | terminated, axis=0))
        return Ends(ended, episode_end, episode_end & all_terminated,
                    episode_end & ~all_terminated)

    def commit(self, act: BoolArray, ends: Ends, lanes: IntArray,
               next_obs: dict[str, npt.NDArray[Any]] | None = None) -> None:
        """Record a step that was written to ``lanes`` (``[n]``).

        Args:
            act: ``[n_agents, n]`` bool: which agents acted.
            ends: The step's :meth:`ends`.
            lanes: The envs written, ``[n]``.
            next_obs: ``{agent: [n, *obs_shape]}``: the next observations stored (the
                agents' placeholders from now on).
        """
        alive = (self.alive[:, lanes] | act) & ~ends.ended
        ended = self.ended[:, lanes] | ends.ended
        over = ends.episode_end
        alive[:, over] = False
        ended[:, over] = False
        self.alive[:, lanes] = alive
        self.ended[:, lanes] = ended
        for a, c in self.carry.items():
            if next_obs is not None:
                c[lanes] = next_obs[a]
            c[lanes[over]] = 0

    def cut(self, lanes: IntArray) -> None:
        """The running episodes of ``lanes`` (``[m]``) are over, cut short after their
        newest step (the env was reset while they ran): no agent is alive or ended
        there any more, and the placeholders start again from zeros.

        Example:
            >>> ep = Episodes(2, 2)
            >>> ep.alive[:] = True; ep.ended[1, 1] = True
            >>> ep.cut(np.array([1]))
            >>> ep.alive.tolist(), ep.ended.tolist()
            ([[True, False], [True, False]], [[False, False], [False, False]])
        """
        self.alive[:, lanes] = False
        self.ended[:, lanes] = False
        for c in self.carry.values():
            c[lanes] = 0

    def state_dict(self) -> dict[str, Any]:
        """The arrays (copies)."""
        return {"alive": self.alive.copy(), "ended": self.ended.copy(),
                "carry": {a: c.copy() for a, c in self.carry.items()}}

    def checked(self, state: Any) -> dict[str, Any]:
        """``state`` checked to fit (nothing changes); :meth:`apply` sets it.

        Raises:
            CheckpointError: Missing or misshapen arrays.
        """
        fix = "restore the multi-agent state from a checkpoint of this buffer"
        if not isinstance(state, dict) or not {"alive", "ended", "carry"} <= set(state):
            raise CheckpointError(f"load_state_dict: multiagent={describe(state)} lacks "
                                  f"alive/ended/carry; {fix}")
        out: dict[str, Any] = {}
        for key in ("alive", "ended"):
            arr = np.asarray(state[key])
            if arr.shape != self.alive.shape or arr.dtype != np.bool_:
                raise CheckpointError(f"load_state_dict: multiagent/{key} has shape "
                                      f"{arr.shape} {arr.dtype}; expected {self.alive.shape} "
                                      f"bool; {fix}")
            out[key] = arr.copy()
        carry = state["carry"] or {}
        if not isinstance(carry, dict) or (carry and set(carry) != set(self.carry)
                                           and self.carry):
            raise CheckpointError(f"load_state_dict: multiagent/carry has agents "
                                  f"{sorted(carry) if isinstance(carry, dict) else carry}; "
                                  f"expected {sorted(self.carry)}; {fix}")
        out["carry"] = {}
        for a, c in carry.items():
            arr = np.asarray(c)
            mine = self.carry.get(a)
            if mine is not None and (arr.shape != mine.shape or arr.dtype != mine.dtype):
                raise CheckpointError(f"load_state_dict: multiagent/carry/{a} has shape "
                                      f"{arr.shape} {arr.dtype}; expected {mine.shape} "
                                      f"{mine.dtype}; {fix}")
            out["carry"][a] = np.array(arr)
        return out

    def apply(self, checked: dict[str, Any]) -> None:
        """Set a state returned by :meth:`checked`."""
        self.alive = checked["alive"]
        self.ended = checked["ended"]
        self.carry = checked["carry"]
