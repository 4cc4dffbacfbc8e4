"""Reopening a multi-agent buffer from its memmap files: what lives in memory, rebuilt.

A :class:`~replaybank.multiagent.buffer.MultiAgentReplayBuffer` with
``storage="memmap"`` keeps every joint step in the core's files; what it keeps in memory
beside them is the agent layout (:mod:`replaybank.multiagent.layout`), the joint
episode bookkeeping (:class:`~replaybank.multiagent.episodes.Episodes`: which agents are
alive or ended in each env's running episode, and their placeholder observations) and
each env's *origin* (where its first joint episode starts, for ``sample_episodes``).
``rb.open(path)`` rebuilds the core from its files and then:

* :func:`layout_from_core`: the layout from the core's stored fields (every per-agent
  field, extras included, and the global state);
* :func:`episodes_from_table`: the bookkeeping from the stored steps, exactly as the
  adds left it. Per env, the *running* joint episode is the live steps after the newest
  joint end or cut (the record of :mod:`replaybank.multiagent.cuts`, kept in the files
  too; none runs when the newest step is one): an agent is ``ended`` when it ended at
  one of those steps, ``alive`` when it acted at one and did not end; its placeholder is
  the next observation stored with the env's newest step (zeros when that step ended
  the joint episode). A running episode longer than the ring forgot its oldest steps:
  an agent that acted or ended only in those counts as neither alive nor ended (flush
  before the process stops to keep them);
* :func:`origin_from_table`: the origins: a lane that holds fewer steps than it has rows
  (or every step it ever wrote) starts an episode at its oldest live step; a full lane
  that lost steps does not (as :func:`~replaybank.multiagent.padded.find_episodes` then
  assumes).

``buf.flush()`` saves the bookkeeping and the origins too (the cuts live in the files
already) (:func:`resume_part`, beside
the core's generator and sampler state), and a reopen whose files still hold exactly the
flushed steps restores them from there (:func:`checked_resume_part`); both ways give the
same values for steps written by ``add``.

Example:
    >>> import numpy as np
    >>> from replaybank.multiagent import MultiAgentReplayBuffer
    >>> buf = MultiAgentReplayBuffer(8, ["a", "b"], seed=0)
    >>> for t in range(3):                      # b ends at t = 1; a is still running
    ...     acting = ["a", "b"] if t < 2 else ["a"]
    ...     buf.add(obs={k: np.full(2, t, np.float32) for k in acting},
    ...             action={k: 0 for k in acting}, reward={k: 1.0 for k in acting},
    ...             next_obs={k: np.full(2, t + 1, np.float32) for k in acting},
    ...             terminated={k: k == "b" and t == 1 for k in acting},
    ...             truncated={k: False for k in acting})
    >>> ep = episodes_from_table(buf.buffer.table, buf.agents, buf.layout)
    >>> ep.alive.tolist(), ep.ended.tolist(), ep.carry["b"][0].tolist()
    ([[True], [False]], [[False], [True]], [2.0, 2.0])
    >>> origin_from_table(buf.buffer.table).tolist()
    [0]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import CheckpointError
from replaybank.host import as_numpy
from replaybank.multiagent.episodes import Episodes
from replaybank.multiagent.layout import OUTCOMES, STATE, AgentLayout
from replaybank.spec import SEP, Spec
from replaybank.storage.table import StepTable

__all__ = ["checked_resume_part", "episodes_from_table", "layout_from_core",
           "origin_from_table", "resume_part"]

IntArray = npt.NDArray[np.int64]
#: The joint fields the layout adds itself (never user fields).
_JOINT = ("reward", "terminated", "truncated")


def layout_from_core(agents: tuple[str, ...], spec: Spec) -> AgentLayout:
    """The agent layout whose :meth:`~AgentLayout.core_spec` holds the fields of ``spec``.

    Args:
        agents: Agent names, in the buffer's order.
        spec: The core buffer's stored fields (``obs/<agent>``, ``obs/state``,
            ``action/<agent>``, extras, outcomes).

    Raises:
        SpecError: ``spec`` lacks an agent's ``obs`` or ``action`` field (not a
            multi-agent core).

    Example:
        >>> from replaybank.multiagent.layout import AgentLayout
        >>> lay = AgentLayout.build(("a",), {"obs": {"a": ((3,), "float32")},
        ...     "action": {"a": ((), "int64")}, "state": ((4,), "float32"),
        ...     "logp": {"a": ((), "float32")}}, {}, ())
        >>> back = layout_from_core(("a",), lay.core_spec())
        >>> back.extras, back.state.shape, set(back.core_spec()) == set(lay.core_spec())
        (('logp',), (4,), True)
    """
    flat: dict[str, Any] = {}
    for name, f in spec.items():
        top, _, rest = name.partition(SEP)
        if name in _JOINT or (top in OUTCOMES and rest in agents):
            continue
        entry = (f.shape, str(np.dtype(f.dtype)))
        flat[STATE if name == f"obs{SEP}{STATE}" else name] = entry
    return AgentLayout.build(agents, flat, {}, ())


def episodes_from_table(table: StepTable, agents: tuple[str, ...],
                        layout: AgentLayout | None,
                        cuts: list[IntArray] | None = None) -> Episodes:
    """The joint episode bookkeeping the adds of ``table``'s live steps left (module doc).

    Args:
        table: The core's step table (``[T, lanes]`` fields).
        agents: Agent names, in the buffer's order.
        layout: The agent layout (None: no placeholders are allocated).
        cuts: Per lane, the sequence numbers of the steps after which ``end_episodes``
            cut the running episode (None: none).

    Returns:
        The :class:`~replaybank.multiagent.episodes.Episodes` (``alive``, ``ended``
        ``[n_agents, lanes]``, ``carry`` ``{agent: [lanes, *obs_shape]}``).
    """
    lanes, T = table.lanes, table.T  # noqa: N806
    ep = Episodes(len(agents), lanes)
    if layout is not None:
        ep.allocate({a: (f.shape, f.dtype) for a, f in layout.per_agent["obs"].items()})
    written = np.array(table.written, np.int64)
    counts = np.array(table.counts, np.int64)
    arrays = table.arrays
    for lane in range(lanes):
        w, c = int(written[lane]), int(counts[lane])
        if c == 0:
            continue
        rows = np.arange(w - c, w, dtype=np.int64) % T  # [c] live slots of the lane, oldest first
        done = as_numpy(arrays["terminated"][rows, lane]) \
            | as_numpy(arrays["truncated"][rows, lane])
        if cuts is not None:  # an episode cut by a reset ended there too
            done = done | np.isin(np.arange(w - c, w, dtype=np.int64), cuts[lane])
        if done[-1]:
            continue  # the newest step ended its joint episode: nothing is running
        ends = np.flatnonzero(done)
        run = rows[int(ends[-1]) + 1:] if ends.size else rows  # [r] the running episode
        for i, a in enumerate(agents):
            act = as_numpy(arrays[f"active{SEP}{a}"][run, lane])  # [r]
            end = act & (as_numpy(arrays[f"terminations{SEP}{a}"][run, lane])
                         | as_numpy(arrays[f"truncations{SEP}{a}"][run, lane]))
            ep.ended[i, lane] = bool(end.any())
            ep.alive[i, lane] = bool(act.any()) and not end.any()
        newest = np.array([(w - 1) * lanes + lane], np.int64)  # its item key
        for a, carry in ep.carry.items():
            carry[lane] = as_numpy(table.gather_next(f"obs{SEP}{a}", newest))[0]
    return ep


def origin_from_table(table: StepTable) -> IntArray:
    """Per lane, the sequence number where the first stored joint episode starts
    (module doc), ``[lanes]`` int64.

    Example:
        >>> from replaybank.spec import Spec
        >>> t = StepTable(Spec.coerce({"obs": ((), "int64"), "terminated": ((), "bool"),
        ...                            "truncated": ((), "bool")}), T=4, lanes=1,
        ...               obs_fields=["obs"])
        >>> origin_from_table(t).tolist()
        [0]
    """
    written = np.array(table.written, np.int64)
    counts = np.array(table.counts, np.int64)
    oldest = written - counts
    lost = (counts >= table.T) & (written > counts)  # a full lane that overwrote steps
    return np.asarray(np.where(lost, oldest - 1, oldest), np.int64)


def resume_part(episodes: Episodes, origin: IntArray, agents: tuple[str, ...]) -> dict[str, Any]:
    """What ``flush()`` saves of the multi-agent bookkeeping: ``alive``, ``ended``,
    ``carry``, ``origin`` and ``agents`` (copies)."""
    return {**episodes.state_dict(), "origin": np.array(origin, np.int64),
            "agents": list(agents)}


def checked_resume_part(part: Any, agents: tuple[str, ...], num_envs: int,
                        layout: AgentLayout | None) -> tuple[Episodes, IntArray]:
    """A saved :func:`resume_part`, checked to fit (nothing changes).

    Returns:
        ``(episodes, origin)`` to install.

    Raises:
        CheckpointError: Another buffer's agents, or missing or misshapen arrays.
    """
    fix = "reopen the directory of this buffer, or delete its replaybank_resume_* files"
    if not isinstance(part, dict) or list(part.get("agents", ())) != list(agents):
        got = part.get("agents") if isinstance(part, dict) else part
        raise CheckpointError(f"load_resume_state: the saved agents {got!r} differ from "
                              f"this buffer's {list(agents)}; {fix}")
    ep = Episodes(len(agents), num_envs)
    if layout is not None:
        ep.allocate({a: (f.shape, f.dtype) for a, f in layout.per_agent["obs"].items()})
    ep.apply(ep.checked(part))
    origin = np.asarray(part.get("origin"))
    if origin.shape != (num_envs,) or origin.dtype.kind not in "iu":
        raise CheckpointError(f"load_resume_state: multiagent/origin has shape "
                              f"{origin.shape} {origin.dtype}; expected ({num_envs},) int64; "
                              f"{fix}")
    return ep, origin.astype(np.int64)

