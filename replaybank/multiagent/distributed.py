"""The Ray service of multi-agent replay: each shard a ``MultiAgentReplayBuffer``.

``rb.distributed.ReplayService(num_shards, {"type": "MultiAgentReplayBuffer", "agents":
[...], ...}, num_lanes=...)`` serves joint steps as a local
:class:`~replaybank.multiagent.buffer.MultiAgentReplayBuffer` of ``num_lanes`` envs
does. This module is what the service runs for that buffer type
(:class:`MultiAgentServing`, registered by ``replaybank.distributed``); it imports nothing
of the service (that package is a layer above this room): the service passes its parts
in.

* Shards: each shard holds a ``MultiAgentReplayBuffer`` over its envs (global env ``l``
  on shard ``l % num_shards``), with its own joint episode bookkeeping (which agents
  ended in each env's running episode), saved and restored with it. Every draw, mass
  and priority update uses its core buffer (``buf.buffer``), exactly as for a
  single-agent service (:class:`MultiAgentServed`): uniform and prioritized sampling
  over all shards' joint steps, global PER weights, stale keys ignored, exact windows.
* Writes: :meth:`MultiAgentReplayClient.add` takes the local buffer's arguments
  (``{agent: [num_lanes, *shape]}`` dicts; an agent left out did not act) and checks
  them with the local buffer's own rules and messages
  (:func:`~replaybank.multiagent.inputs.prepare`) before anything is queued, so a bad
  call raises there and changes nothing. The rows it queues name every agent, with
  ``active[agent]`` ``[num_lanes]`` saying where it acted (zeros elsewhere), so every
  add has the same fields and the service's write batching sends many adds at once.
  Each shard adds each step to its buffer with those masks, which stores exactly what
  the local buffer stores: an agent in the dicts with ``active`` False in an env is one
  that did not act there, and a shard in none of whose envs any agent acted stores
  nothing for that step (as the local buffer writes no step in such an env).
* An agent that acts again after its own end in the running episode of an env: the
  client keeps a copy of each env's joint-episode bookkeeping (which agents ended) from
  the steps it queued, so such a call raises the local buffer's error and nothing of it
  is queued. Its copy knows only the steps this client wrote (one writer per env, the
  usual case; a client built after a restore starts knowing no ended agent): the
  bookkeeping that decides is the shards', which refuse such a step for their envs
  (nothing of it stored there) and the client then reports it once with a
  :class:`~replaybank.distributed.errors.RowsRejectedWarning` (and in ``rejected``),
  naming the call, as for rows a single-agent client could not check.
* Env resets and clears: :meth:`MultiAgentReplayClient.end_episodes` cuts the running
  joint episodes of envs as the local buffer's does; the cut is queued in the client's
  write stream after the steps before it (a write of no rows), so each shard cuts
  between the same steps as a local buffer and ``rb.collect`` may be called again on the
  same envs mid-episode. :meth:`~MultiAgentReplayClient.clear` clears every shard's
  buffer (steps, episode bookkeeping, cuts) and this client's copy.
* Reads: :meth:`~MultiAgentReplayClient.sample` returns a
  :class:`~replaybank.multiagent.batch.MultiAgentBatch` and
  :meth:`~MultiAgentReplayClient.sample_sequences` a
  :class:`~replaybank.multiagent.batch.MultiAgentSequenceBatch`, unpacked from the
  core batches the service draws (global keys in ``indices`` / ``starts``).

Example (needs Ray)::

    import numpy as np
    import replaybank as rb

    svc = rb.distributed.ReplayService(
        2, {"type": "MultiAgentReplayBuffer", "agents": ["a", "b"], "capacity": 1000,
            "sampler": {"type": "prioritized"}}, num_lanes=4, seed=0)
    client = svc.client()
    client.add(obs={k: np.zeros((4, 3)) for k in "ab"}, action={k: np.zeros(4) for k in "ab"},
               reward={k: np.ones(4) for k in "ab"}, next_obs={k: np.ones((4, 3)) for k in "ab"},
               terminated={k: np.zeros(4, bool) for k in "ab"},
               truncated={k: np.zeros(4, bool) for k in "ab"})
    batch = client.sample(8)                   # MultiAgentBatch: batch.obs["a"] [8, 3]
    client.update_priorities(batch.indices, np.ones(8))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from replaybank.buffers.inputs import UNSET
from replaybank.buffers.one_thread import ThreadCheck, one_thread_call
from replaybank.errors import ArgumentError, ReplayBankError, describe
from replaybank.multiagent.batch import MultiAgentBatch, MultiAgentSequenceBatch
from replaybank.multiagent.buffer import MultiAgentReplayBuffer
from replaybank.multiagent.episodes import Episodes, env_lanes
from replaybank.multiagent.inputs import (
    PER_AGENT_ARGS,
    JointStep,
    check_obs_values,
    prepare,
    step_layout,
)
from replaybank.multiagent.layout import (
    STATE,
    AgentLayout,
    check_agents,
    check_first_add_fields,
    parse_spec,
)
from replaybank.multiagent.nstep import AGENT_DISCOUNT
from replaybank.spec import Spec
from replaybank.views.base import InputTransform

__all__ = ["SERVING", "MultiAgentReplayClient", "MultiAgentServed", "MultiAgentServing"]

#: A call whose rows a shard refused: (the call's tag, its rows there, the error).
Refusal = tuple[Any, int, ReplayBankError]
#: The per-agent rows a client sends, by the name the shard passes them to ``add`` with,
#: and the core field (of :attr:`JointStep.core`) they come from (``rewards``, ...:
#: :data:`~replaybank.multiagent.layout.OUTCOMES`).
#: The fix a second thread's call is told (see :class:`MultiAgentReplayClient`, Threads).
_ONE_THREAD_FIX = (
    "a MultiAgentReplayClient is for one thread at a time (its copy of the episode "
    "bookkeeping is checked and updated around the core client's queue, unlocked); give "
    "each thread its own client: service.client(name) with its own name in each (e.g. "
    "'learner' and 'collector'), or pickle.loads(pickle.dumps(client))")
_ROWS = {"obs": "obs", "next_obs": "next_obs", "action": "action", "reward": "rewards",
         "terminated": "terminations", "truncated": "truncations", "active": "active"}


class CoreClient(Protocol):
    """What the front needs of the service's core client
    (:class:`~replaybank.distributed.client.ReplayClient`, passed in by the service)."""

    num_lanes: int
    rejected: dict[int, str]

    @property
    def pending_rows(self) -> int: ...

    @property
    def spec(self) -> Spec | None: ...

    @property
    def capacity(self) -> int: ...

    def __len__(self) -> int: ...

    def add(self, *args: Any, obs: Any = ..., action: Any = ..., reward: Any = ...,
            next_obs: Any = ..., terminated: Any = ..., truncated: Any = ...,
            env_ids: Any = None, priority: Any = None, **extras: Any) -> None: ...

    def write_rule(self) -> dict[str, Any] | None: ...

    def flush(self, wait: bool = True) -> None: ...

    def cut_episodes(self, env_ids: Any) -> None: ...

    def clear(self) -> None: ...

    def sample(self, batch_size: int, replace: bool = True, **kwargs: Any) -> Any: ...

    def sample_sequences(self, /, batch_size: int, sequence_length: int,
                         **kwargs: Any) -> Any: ...

    def update_priorities(self, indices: Any, priorities: Any) -> int: ...

    def update_sequence_priorities(self, starts: Any, td_errors: Any, eta: float = 0.9,
                                   mask: Any = None) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def how_to_save(self) -> str: ...


class MultiAgentServed:
    """A shard's ``MultiAgentReplayBuffer``: samples from its core, writes joint steps.

    A payload holds ``T`` joint steps of this shard's envs as a
    :class:`MultiAgentReplayClient` queues them: ``{agent: [T, k, *shape]}`` for every
    agent of ``obs``, ``next_obs``, ``action``, ``reward``, ``terminated``,
    ``truncated``, ``active`` and the per-agent extras; ``state``/``next_state`` and
    joint extras ``[T, k, *shape]``. Each step is one :meth:`MultiAgentReplayBuffer.add`
    of the buffer, with ``active=None`` where every agent acts in every env (the
    buffer's fast path), and no add where no agent acts in any of them.

    Args:
        buf: The shard's buffer.

    Attributes:
        core: ``buf.buffer``, the core every draw, mass and priority update uses.

    Example:
        >>> import numpy as np
        >>> buf = MultiAgentReplayBuffer(8, ["a", "b"], num_envs=2, seed=0)
        >>> served = MultiAgentServed(buf)
        >>> row = lambda v, shape=(): {k: np.full((1, 2, *shape), v) for k in "ab"}
        >>> served.write([0, 1], None, {
        ...     "obs": row(0.0, (3,)), "next_obs": row(1.0, (3,)), "action": row(0),
        ...     "reward": row(1.0), "terminated": row(False), "truncated": row(False),
        ...     "active": {"a": np.ones((1, 2), bool), "b": np.array([[True, False]])}},
        ...     [(("add", 1), 0, 1)])
        (2, [])
        >>> len(buf), buf.sample(4).active["b"].sum() <= 4
        (2, np.True_)
    """

    def __init__(self, buf: MultiAgentReplayBuffer) -> None:
        self.buf = buf
        self.core: Any = buf.buffer

    def write(self, env_ids: list[int], priority: Any, values: dict[str, Any],
              calls: list[tuple[Any, int, int]] | None) -> tuple[int, list[Refusal]]:
        """Add each step of the payload (see the class docs).

        Args:
            env_ids: The payload's envs: every env of this shard, in order.
            priority: ``[T, k]`` initial priorities, or None.
            values: The rows ``[T, k, *shape]``.
            calls: ``(call tag, first step, end step)`` per client call, or None.

        Returns:
            ``(joint steps written, refused calls)``: a step the buffer refuses changes
            nothing; the other steps are written.

        Raises:
            ArgumentError: ``env_ids`` are not all of this shard's envs in order.
            ReplayBankError: The buffer refused a step of an untagged payload (the
                steps before it are stored).
        """
        k = self.buf.num_envs
        if [int(e) for e in env_ids] != list(range(k)):
            raise ArgumentError(
                f"MultiAgentServed.write(env_ids={list(env_ids)}): a multi-agent shard "
                f"takes every one of its {k} envs at each step (the buffer's add has no "
                "env_ids); write through the service's MultiAgentReplayClient")
        active = values["active"]  # {agent: [T, k]}
        acting = np.stack([np.asarray(active[a], bool) for a in self.buf.agents])  # [n, T, k]
        steps = acting.shape[1]
        tags = _tags(calls, steps)
        one = k == 1
        written = 0
        refused: list[Refusal] = []
        for t in range(steps):
            here = acting[:, t]  # [n_agents, k]
            envs = int(here.any(axis=0).sum())
            if envs == 0:
                continue  # no agent acted in this shard's envs: the local buffer adds none
            step = _step(values, t, one)
            if here.all():
                step["active"] = None  # every agent everywhere: the buffer's fast path
            pr = None if priority is None else (priority[t, 0] if one else priority[t])
            try:
                self.buf.add(**step, priority=pr)
            except ReplayBankError as exc:  # a refused add leaves the buffer as it was
                if tags[t] is None:
                    raise
                refused.append((tags[t], k, exc))
                continue
            written += envs
        return written, refused

    def write_rule(self) -> dict[str, Any]:
        """``{"spec", "rows", "transform", "layout"}``: the core's fields, ``transform``
        True (the client checks the agent dicts, not the core fields) and the agent
        layout (None before the first add when the config's spec left shapes out)."""
        return {"spec": self.core.spec, "rows": False, "transform": True,
                "layout": self.buf.layout}

    def clear(self) -> None:
        """:meth:`MultiAgentReplayBuffer.clear`: every joint step, the episode
        bookkeeping and the cuts."""
        self.buf.clear()

    def end_episodes(self, env_ids: list[int]) -> None:
        """:meth:`MultiAgentReplayBuffer.end_episodes` of this shard's envs ``env_ids``
        (a client's cut, in the order of its writes)."""
        self.buf.end_episodes([int(e) for e in env_ids])


class MultiAgentReplayClient:
    """Reads and writes a multi-agent :class:`~replaybank.distributed.service.ReplayService`
    with :class:`~replaybank.multiagent.buffer.MultiAgentReplayBuffer`'s interface.

    Built by ``service.client()`` for a ``MultiAgentReplayBuffer`` config; it wraps the
    service's core client (:attr:`client`, a
    :class:`~replaybank.distributed.client.ReplayClient`), which batches the writes,
    draws over the shards and applies priorities. It pickles (pending rows are flushed
    first), so writer actors get their own copy.

    Threads: a client serves one thread at a time, as its core client does. Its ``add``
    checks a step against its copy of the episode bookkeeping, queues it on the core
    client and then records it, so the whole call, not only the core client's part, is
    one call (:mod:`replaybank.buffers.one_thread`): another thread's call made while it
    runs raises :class:`~replaybank.errors.ConcurrentCallError` naming both calls and
    both threads, and changes neither the queue nor the bookkeeping. (Only the core
    client's part used to be checked: another thread's ``add``, ``end_episodes`` or
    ``clear`` made while this one's values were being checked went through, queued and
    recorded in the middle of it.) Give each thread its own client
    (``service.client("collector")``).

    Args:
        client: The service's core client.
        config: One shard's buffer config (``agents``, ``spec``, ``n_step``).

    Attributes:
        client: The core client (``draw_paths``, ``masses()``, ``degraded_shards``).
    """

    def __init__(self, client: CoreClient, config: dict[str, Any]) -> None:
        self.client = client
        self._agents = check_agents(config["agents"])
        spec = config.get("spec")
        self._spec = None if spec is None else parse_spec(spec, self._agents)  # its own copy
        self._n_step = int(config.get("n_step") or 1)
        self._layout: AgentLayout | None = None  # implied by this client's first add
        # which agents ended in each env's running episode, from the steps this client
        # queued (its placeholders stay zeros: the shards store their own)
        self._episodes = Episodes(len(self._agents), client.num_lanes)
        # envs whose shards may hold a running episode this client did not write (until
        # its first add or end_episodes there): a restored service's, another client's
        self._unknown = np.ones(client.num_lanes, np.bool_)
        self.thread_check = ThreadCheck("MultiAgentReplayClient", _ONE_THREAD_FIX)

    # ------------------------------------------------------------------ properties
    @property
    def agents(self) -> tuple[str, ...]:
        """Agent names, in the buffer's order."""
        return self._agents

    @property
    def num_lanes(self) -> int:
        """Envs of the service (each ``add`` writes one joint step of every env)."""
        return int(self.client.num_lanes)

    @property
    def num_envs(self) -> int:
        """The same as :attr:`num_lanes` (the local buffer's name)."""
        return self.num_lanes

    @property
    def capacity(self) -> int:
        """Joint steps all shards hold together (the core client's
        :attr:`~replaybank.distributed.client.ReplayClient.capacity`), as the local
        buffer's ``capacity``."""
        return int(self.client.capacity)

    @property
    def spec(self) -> Spec | None:
        """The core fields, as the local buffer's ``spec``: those the shards store (the
        core client's :attr:`~replaybank.distributed.client.ReplayClient.spec`), or the
        ones this client's first add implied (as :attr:`layout`); None before either."""
        held = self.client.spec
        if held is None and self._layout is not None:
            return self._layout.core_spec()
        return held

    @property
    def layout(self) -> AgentLayout | None:
        """The per-agent fields: the shards', or the ones this client's first add implied."""
        return self._current_layout()

    @property
    def rejected(self) -> dict[int, str]:
        """Calls whose rows a shard refused after this client queued them (see the
        module docs)."""
        return self.client.rejected

    @property
    def pending_rows(self) -> int:
        """Rows queued here and not yet sent."""
        return int(self.client.pending_rows)

    def __len__(self) -> int:
        """Joint steps stored in the live shards, this client's own queued rows included
        (sent first, as :meth:`sample` sends them); rows other clients queue are not
        counted."""
        return len(self.client)

    def __repr__(self) -> str:
        return (f"MultiAgentReplayClient(agents={list(self._agents)}, "
                f"num_lanes={self.num_lanes}, pending_rows={self.pending_rows})")

    # ------------------------------------------------------------------ writes
    @one_thread_call("add")
    def add(self, /, *args: Any, obs: Any = UNSET, action: Any = UNSET, reward: Any = UNSET,
            next_obs: Any = UNSET, terminated: Any = UNSET, truncated: Any = UNSET,
            state: Any = None, next_state: Any = None, active: Any = None,
            priority: Any = None, **extras: Any) -> None:
        """Queue one joint step of every env (as :meth:`MultiAgentReplayBuffer.add`).

        Args:
            obs: ``{agent: [num_lanes, *obs_shape]}`` (``[*obs_shape]`` with one env)
                of the agents that acted.
            action: ``{agent: [num_lanes, *action_shape]}``.
            reward: ``{agent: [num_lanes]}``.
            next_obs: ``{agent: [num_lanes, *obs_shape]}`` (the true final one where the
                agent ended).
            terminated: ``{agent: [num_lanes]}`` bool.
            truncated: ``{agent: [num_lanes]}`` bool.
            state: ``[num_lanes, *state_shape]`` global state, or None.
            next_state: ``[num_lanes, *state_shape]``, or None.
            active: ``{agent: [num_lanes] bool}``: where an agent in ``obs`` acted.
            priority: Initial priority of each env's joint step (prioritized shards).
            **extras: Per-agent (``{agent: value}``) or joint extras.

        Raises:
            ArgumentError, SpecError, ShapeError, DtypeError: As the local buffer's
                ``add``, with its messages; nothing of the call is queued.
            ConfigError: ``priority`` given while the shards' sampler has none.
            ShardUnavailableError: A send of earlier rows could not be delivered.
        """
        if args:
            raise ArgumentError(
                f"add() takes keyword arguments only, got {len(args)} positional value(s) "
                f"({', '.join(describe(a) for a in args[:3])}); pass add(obs={{agent: ...}}, "
                "action=..., reward=..., next_obs=..., terminated=..., truncated=...)")
        values = {"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                  "terminated": terminated, "truncated": truncated, "state": state,
                  "next_state": next_state, "active": active}
        for name in PER_AGENT_ARGS:
            if values[name] is UNSET:
                raise ArgumentError(f"add(): missing {name}=; pass {name}={{agent: value}} "
                                    "for the agents that acted")
        if AGENT_DISCOUNT in extras and self._n_step > 1:
            raise ArgumentError(f"add({AGENT_DISCOUNT}=...): {AGENT_DISCOUNT!r} holds the "
                                "per-agent n-step discounts of this n-step buffer; rename "
                                "the extra")
        layout = self._current_layout()
        step = prepare(self._agents, self.num_lanes, layout, self._spec, self._episodes,
                       values, extras)
        rows = _rows(step, self.num_lanes)
        self.client.add(**rows, env_ids=np.arange(self.num_lanes), priority=priority)
        self._episodes.commit(step.act, step.ends, step.lanes)
        self._unknown[:] = False  # its copy now follows every env's episode
        if layout is None:
            self._layout = step.layout

    @one_thread_call("check_first_add")
    def check_first_add(self, agents: Any, per_agent: Any = ("obs", "action"),
                        call: str = "check_first_add") -> None:
        """Refuse now the first add that would hold only ``agents`` and leave the shapes
        of an agent not in it unknown, as
        :meth:`MultiAgentReplayBuffer.check_first_add
        <replaybank.multiagent.buffer.MultiAgentReplayBuffer.check_first_add>` does (the
        same check and message; the collector calls it before its envs step). Nothing to
        check once the fields are known (the shards', or this client's first add).

        Raises:
            SpecError: The error that add would raise, naming the ``spec=`` entries to
                add to the service's buffer config.
        """
        if self._current_layout() is None:
            check_first_add_fields("MultiAgentReplayBuffer", self._agents, self._spec,
                                   agents, per_agent, call)

    @one_thread_call("check_obs")
    def check_obs(self, obs: Any, state: Any = None, *, step: Any = None,
                  call: str = "check_obs") -> None:
        """Raise what :meth:`add` would raise for observations and a global state from
        the env, as :meth:`MultiAgentReplayBuffer.check_obs
        <replaybank.multiagent.buffer.MultiAgentReplayBuffer.check_obs>` does (the same
        checks, against the shards' fields or this client's first add's; before either,
        ``step``'s); nothing changes.

        Raises:
            ArgumentError, SpecError, ShapeError, DtypeError: As the local buffer's.
        """
        layout = self._current_layout()
        if layout is None and step is not None:
            layout = step_layout(self._agents, self.num_lanes, self._spec, step)
        check_obs_values("MultiAgentReplayBuffer", self._agents, self.num_lanes, layout,
                         self._spec, obs, state, call)

    @one_thread_call("end_episodes")
    def end_episodes(self, env_ids: Any = None) -> None:
        """End the running joint episodes of ``env_ids`` after their newest step, as
        :meth:`MultiAgentReplayBuffer.end_episodes
        <replaybank.multiagent.buffer.MultiAgentReplayBuffer.end_episodes>` does: the env
        was reset while they ran (a collector's ``reset()``, ``rb.collect`` called
        again), so they were cut short, as by a time limit.

        The same semantics on the shards: the stored steps do not change, the step the
        next ``add`` stores in that env starts a new joint episode (n-step returns and
        ``sample_sequences`` end the cut one there), and the episode bookkeeping forgets
        which agents were alive or ended in it, so an agent that had ended may act again
        in the new episode. The cut is a write of this client, queued after the steps
        it queued for those envs (:meth:`~replaybank.distributed.client.ReplayClient.cut_episodes`):
        nothing waits for the shards, and each env's shard cuts its episode between the
        same two steps as a local buffer given the same calls. An env with no running
        episode is left as it is (nothing is sent for an env whose episode this client
        saw end; before its first add it sends the cut, so a running episode a restored
        service holds is cut too).

        Args:
            env_ids: The envs (an int or a list of ints), or None for every env.

        Raises:
            ArgumentError: ``env_ids`` are not distinct env indices of the service.
            ShardUnavailableError: A send of earlier rows could not be delivered (the
                cut stays queued behind them).
        """
        lanes = env_lanes("end_episodes", env_ids, self.num_lanes)
        ep = self._episodes
        running = ep.alive[:, lanes].any(axis=0) | ep.ended[:, lanes].any(axis=0) \
            | self._unknown[lanes]
        if running.any():
            self.client.cut_episodes(lanes[running])
        ep.cut(lanes)
        self._unknown[lanes] = False

    @one_thread_call("clear")
    def clear(self) -> None:
        """Drop every joint step of the service and the episode bookkeeping, as
        :meth:`MultiAgentReplayBuffer.clear
        <replaybank.multiagent.buffer.MultiAgentReplayBuffer.clear>` does (each shard
        clears its buffer); see :meth:`~replaybank.distributed.client.ReplayClient.clear`
        for this client's queued rows, other clients and shards that are down.

        Raises:
            ShardUnavailableError: A shard was down and did not come back in time.
        """
        self.client.clear()
        self._episodes = Episodes(len(self._agents), self.num_lanes)
        self._unknown[:] = False  # the shards hold no episode now

    def _current_layout(self) -> AgentLayout | None:
        rule = self.client.write_rule()
        held = None if rule is None else rule.get("layout")
        return held if isinstance(held, AgentLayout) else self._layout

    @one_thread_call("flush")
    def flush(self, wait: bool = True) -> None:
        """Send every pending row (and with ``wait`` wait until written); see
        :meth:`~replaybank.distributed.client.ReplayClient.flush`."""
        self.client.flush(wait)

    @one_thread_call("close")
    def close(self) -> None:
        """Flush and wait; the client may still be used afterwards."""
        self.flush()

    # ------------------------------------------------------------------ reads
    @one_thread_call("sample")
    def sample(self, /, batch_size: int, **kwargs: Any) -> MultiAgentBatch:
        """Sample ``batch_size`` joint transitions over every live shard (one buffer's
        law; prioritized: global probabilities and weights).

        Args:
            batch_size: Joint transitions B.
            **kwargs: ``replace``, ``beta`` (as the service's core client).

        Returns:
            A :class:`~replaybank.multiagent.batch.MultiAgentBatch` (``indices``: global
            keys for :meth:`update_priorities`).
        """
        return MultiAgentBatch.from_core(self.client.sample(batch_size, **kwargs),
                                         self._agents)

    @one_thread_call("sample_sequences")
    def sample_sequences(self, /, batch_size: int, sequence_length: int,
                         **kwargs: Any) -> MultiAgentSequenceBatch:
        """Sample ``[B, L]`` windows of joint steps (each env's steps stay on one shard,
        so windows are one buffer's; see
        :meth:`~replaybank.distributed.client.ReplayClient.sample_sequences`).

        Returns:
            A :class:`~replaybank.multiagent.batch.MultiAgentSequenceBatch` (``starts``:
            global keys).
        """
        return MultiAgentSequenceBatch.from_core(
            self.client.sample_sequences(batch_size, sequence_length, **kwargs),
            self._agents)

    @one_thread_call("update_priorities")
    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """Set the priorities of sampled joint steps (``batch.indices``; one per joint
        step); see :meth:`~replaybank.distributed.client.ReplayClient.update_priorities`.

        Returns:
            Number applied (stale keys and shards that are down are skipped).
        """
        return int(self.client.update_priorities(indices, priorities))

    @one_thread_call("update_sequence_priorities")
    def update_sequence_priorities(self, starts: Any, td_errors: Any, eta: float = 0.9,
                                   mask: Any = None) -> int:
        """R2D2 priorities of sampled windows; see
        :meth:`~replaybank.distributed.client.ReplayClient.update_sequence_priorities`."""
        return int(self.client.update_sequence_priorities(starts, td_errors, eta=eta,
                                                          mask=mask))

    # ------------------------------------------------------------------ state
    @one_thread_call("state_dict")
    def state_dict(self) -> dict[str, Any]:
        """The core client's sampling state (what ``service.checkpoint()`` keeps)."""
        return self.client.state_dict()

    @one_thread_call("load_state_dict")
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a damaged state raises CheckpointError and changes
        nothing, as the core client's)."""
        self.client.load_state_dict(state)

    def how_to_save(self) -> str:
        """Why ``rb.save`` cannot save a client, and what does (the core client's
        advice: :class:`~replaybank.persist.SavedElsewhere`)."""
        return self.client.how_to_save()


class MultiAgentServing:
    """The :class:`~replaybank.distributed.served.ServiceKind` of
    ``MultiAgentReplayBuffer``: shards write through :class:`MultiAgentServed`, users get
    a :class:`MultiAgentReplayClient`.

    Example:
        >>> buf = MultiAgentReplayBuffer(8, ["a"], seed=0)
        >>> MultiAgentServing().serve(buf).core is buf.buffer
        True
    """

    def serve(self, buf: Any) -> MultiAgentServed:
        """The shard side of ``buf`` (a ``MultiAgentReplayBuffer``)."""
        if not isinstance(buf, MultiAgentReplayBuffer):
            raise ArgumentError(f"MultiAgentServing.serve(buf={describe(buf)}): expected a "
                                "MultiAgentReplayBuffer (the config's type)")
        if isinstance(buf.buffer.view, InputTransform):
            raise ArgumentError("ReplayService: a MultiAgentReplayBuffer whose core view "
                                "reshapes its inputs (frame_stack) is not served; drop "
                                "frame_stack")
        return MultiAgentServed(buf)

    def client(self, core: Any, config: dict[str, Any]) -> MultiAgentReplayClient:
        """The front users get over the service's core client ``core``."""
        return MultiAgentReplayClient(core, config)


#: The one :class:`MultiAgentServing` (``replaybank.distributed`` registers it).
SERVING = MultiAgentServing()


def _tags(calls: list[tuple[Any, int, int]] | None, steps: int) -> list[Any]:
    """The call tag of each step (None: untagged)."""
    out: list[Any] = [None] * steps
    for tag, t0, t1 in calls or ():
        for t in range(t0, t1):
            out[t] = tag
    return out


def _step(values: dict[str, Any], t: int, one: bool) -> dict[str, Any]:
    """Step ``t`` of ``[T, k, *shape]`` rows as ``add`` keywords (``[k, *shape]``; with
    one env ``[*shape]``: the local buffer's form)."""
    def pick(v: Any) -> Any:
        if isinstance(v, dict):
            return {a: pick(x) for a, x in v.items()}
        return v[t, 0] if one else v[t]
    return {name: pick(v) for name, v in values.items()}


def _rows(step: JointStep, n: int) -> dict[str, Any]:
    """The rows a client queues for a checked step: every agent's values
    ``[n, *shape]`` (zeros where it did not act), ``active`` masks, the state and extras,
    every env (envs where nobody acted: all inactive)."""
    core = step.core
    lanes = None if step.all_lanes else step.lanes

    def full(v: Any) -> Any:  # [k, *shape], or a dict of them (an action's parts)
        if lanes is None:
            return v
        if isinstance(v, Mapping):
            return {key: full(x) for key, x in v.items()}
        out = np.zeros((n, *v.shape[1:]), v.dtype)
        out[lanes] = v
        return out

    layout = step.layout
    rows: dict[str, Any] = {name: {a: full(core[src][a]) for a in layout.agents}
                            for name, src in _ROWS.items()}
    if layout.state is not None:
        rows[STATE] = full(core["obs"][STATE])
        rows["next_state"] = full(core["next_obs"][STATE])
    for name in layout.extras:
        rows[name] = {a: full(v) for a, v in core[name].items()}
    for name in layout.joint:
        rows[name] = full(core[name])
    return rows
