"""``MultiAgentReplayBuffer``: joint steps of all agents, stored in one core buffer.

Each ``add`` takes one step of every agent of each env (PettingZoo's parallel API: dicts
keyed by agent) and writes it as one step of a core
:class:`~replaybank.buffers.replay.ReplayBuffer` (composition: :attr:`buffer`), whose
observation is the dict ``{agent: obs, ..., "state": global_state}``. So each joint
observation is stored once, ``next_obs`` is exact for every agent (also one that ended
before the others), and the core's samplers (uniform, prioritized: one priority per
joint step), n-step returns of the joint reward, sequence windows, storages and
checkpoints work unchanged. With ``n_step > 1`` each agent also gets its own n-step
return, cut at its own end (:mod:`replaybank.multiagent.nstep`); :meth:`sample_episodes`
serves whole joint episodes padded to a length (:mod:`replaybank.multiagent.padded`).
An agent may observe a dict (one level of keys, e.g. PettingZoo's ``{"observation",
"action_mask"}``): it is stored as the core's nested dict observation, and the batches'
``obs[agent]`` and ``next_obs[agent]`` are then dicts ``{key: [B, *shape]}``.
The layout of the core fields is in :mod:`replaybank.multiagent.layout`, the joint
episode's rules in
:mod:`replaybank.multiagent.episodes`.

Example:
    >>> import numpy as np
    >>> buf = MultiAgentReplayBuffer(100, agents=["a", "b"], seed=0)
    >>> for t in range(5):
    ...     acting = ["a", "b"] if t < 3 else ["a"]       # b ends at t = 2
    ...     buf.add(obs={k: np.full(2, t, np.float32) for k in acting},
    ...             action={k: 0 for k in acting}, reward={k: 1.0 for k in acting},
    ...             next_obs={k: np.full(2, t + 1, np.float32) for k in acting},
    ...             terminated={k: k == "b" and t == 2 or t == 4 for k in acting},
    ...             truncated={k: False for k in acting},
    ...             state=np.full(3, t, np.float32), next_state=np.full(3, t + 1, np.float32))
    >>> len(buf)
    5
    >>> batch = buf.sample(5, replace=False)
    >>> batch.obs["b"].shape, batch.state.shape, batch.active["b"].sum()
    ((5, 2), (5, 3), np.int64(3))
    >>> ended = batch.terminated["b"]
    >>> batch.next_obs["b"][ended, 0].tolist()          # b's exact final observation
    [3.0]
    >>> batch.joint_terminated.sum(), batch.stacked("obs").shape
    (np.int64(1), (5, 2, 2))
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from replaybank import persist
from replaybank.batch import SequenceBatch
from replaybank.buffers.replay import ReplayBuffer
from replaybank.errors import (
    ArgumentError,
    CheckpointError,
    ConfigError,
    EmptyBufferError,
    SpecError,
    describe,
)
from replaybank.host import as_numpy
from replaybank.multiagent.batch import (
    MultiAgentBatch,
    MultiAgentEpisodeBatch,
    MultiAgentSequenceBatch,
)
from replaybank.multiagent.cuts import Cuts
from replaybank.multiagent.episodes import Episodes, env_lanes
from replaybank.multiagent.inputs import DirectAdd, check_obs_values, prepare, step_layout
from replaybank.multiagent.layout import (
    AgentLayout,
    check_agents,
    check_first_add_fields,
    parse_spec,
)
from replaybank.multiagent.nstep import AGENT_DISCOUNT, AgentNStepView
from replaybank.multiagent.padded import EpisodeIndex, gather_episodes
from replaybank.multiagent.resume import (
    checked_resume_part,
    episodes_from_table,
    layout_from_core,
    origin_from_table,
    resume_part,
)
from replaybank.samplers.base import Sampler
from replaybank.samplers.sample_args import check_replace, check_size_arg
from replaybank.spec import UNSET, Spec
from replaybank.storage.backends.base import ArrayBackend, SharedArrayBackend
from replaybank.views.nstep import NStepView

if TYPE_CHECKING:  # pydantic loads with the first config() call
    from replaybank.config import AnyBuffer, BufferConfig

__all__ = ["MultiAgentReplayBuffer"]


class MultiAgentReplayBuffer:
    """Replay of joint multi-agent steps (MADDPG, QMIX/VDN, MAPPO-style critics).

    Args:
        capacity: Joint steps over all envs; must divide by ``num_envs``.
        agents: Agent names (e.g. ``env.possible_agents``), in the order batches and
            :meth:`MultiAgentBatch.stacked` use.
        num_envs: Envs (lanes); values then have leading dim ``num_envs``.
        seed: Seed or Generator of the sampling generator.
        spec: Shapes and dtypes, ``{"obs": {agent: (shape, dtype)}, "action": {agent:
            ...}, "state": (shape, dtype), <extra>: {agent: ...} or (shape, dtype)}`` (or
            the flat form ``{"obs/<agent>": ...}``); what it leaves out is inferred from
            the first add (an agent missing from the first add then needs its entries).
        sampler: Which joint steps to draw (uniform by default; prioritized: one priority
            per joint step).
        storage: ``"numpy"``, ``"memmap"`` (with ``path``) or ``"torch"`` (``device``).
        path: Directory of memmap files.
        device: Torch device of torch storage.
        n_step: n-step returns (1: one-step transitions): of the joint reward, and of
            each agent's reward, cut at the agent's own end
            (:mod:`replaybank.multiagent.nstep`).
        gamma: Discount of n-step returns.
        **kwargs: Further :class:`~replaybank.buffers.replay.ReplayBuffer` arguments
            (``view``, ``frame_stack``, ``lane_split``, ``autoreset_mode``).

    Raises:
        ArgumentError: Bad agent names, or a keyword the core does not take.
        ConfigError: ``n_step > 1`` with a view other than the plain n-step view (e.g.
            ``frame_stack``): per-agent n-step returns need it; ``storage="shared"``
            (refused before any shared memory is made: its owner never adds, and there
            is no multi-agent writer for collector processes; the Ray service,
            :class:`~replaybank.distributed.ReplayService`, serves this buffer to them).
        SpecError: A bad ``spec``.
        CapacityError: As :class:`~replaybank.buffers.replay.ReplayBuffer`.

    Example:
        >>> buf = MultiAgentReplayBuffer(64, agents=["a", "b"], num_envs=2,
        ...     spec={"obs": {"a": ((3,), "float32"), "b": ((5,), "float32")},
        ...           "action": {"a": ((), "int64"), "b": ((2,), "float32")}})
        >>> buf.agents, buf.capacity, len(buf)
        (('a', 'b'), 64, 0)
    """

    def __init__(
        self,
        capacity: int,
        agents: Any,
        num_envs: int = 1,
        seed: int | np.random.Generator | None = None,
        spec: Any = None,
        sampler: Sampler | None = None,
        storage: str | ArrayBackend = "numpy",
        path: Any = None,
        device: Any = None,
        n_step: int = 1,
        gamma: float = 0.99,
        **kwargs: Any,
    ) -> None:
        self._agents = check_agents(agents)
        unknown = sorted(set(kwargs) - _BUFFER_ARGUMENTS)
        if unknown:
            raise ArgumentError(f"MultiAgentReplayBuffer() got keyword arguments {unknown}; "
                                f"it passes on only {sorted(_BUFFER_ARGUMENTS)}")
        _check_storage(storage)
        # checked now, used at the first add: the buffer's own copy (flat fields), so
        # that changing the caller's dict afterwards changes nothing here
        self._spec = None if spec is None else parse_spec(spec, self._agents)
        self._layout: AgentLayout | None = None
        #: The common add's route to the core's compiled write (of ``_layout``; built
        #: by the first add that finds the layout).
        self._direct: DirectAdd | None = None
        try:
            layout = AgentLayout.build(self._agents, self._spec, {}, ())
        except SpecError:  # the spec leaves some shapes to the first add
            layout = None
        self.buffer = ReplayBuffer(
            capacity, num_envs=num_envs, seed=seed, sampler=sampler, storage=storage,
            path=path, device=device, n_step=n_step, gamma=gamma,
            spec=None if layout is None else layout.core_spec(), **kwargs)
        view = self.buffer.view
        if isinstance(view, NStepView):  # per-agent returns beside the joint one
            self.buffer.view = AgentNStepView(view, self._agents)
        elif n_step > 1:
            raise ConfigError(
                f"MultiAgentReplayBuffer(n_step={n_step}): the core's view is "
                f"{type(view).__name__}, but per-agent n-step returns need the plain "
                "n-step view; drop frame_stack/view, or use n_step=1")
        self._episodes = Episodes(len(self._agents), self.buffer.num_envs)
        #: Per env, the sequence number of the first step stored since the buffer was
        #: built or cleared: a joint episode starts there (see sample_episodes).
        self._origin: npt.NDArray[np.int64] = np.zeros(self.buffer.num_envs, np.int64)
        # the whole joint episodes sample_episodes draws from, kept up to date per call
        self._episode_index = EpisodeIndex()
        #: Where end_episodes cut a running joint episode, beside the core's steps
        #: (None until needed; see _table_cuts).
        self._cuts: Cuts | None = None
        if layout is not None:
            self._set_layout(layout)
        # memmap files record this buffer's config, not the core's: rb.open(path)
        # rebuilds a MultiAgentReplayBuffer (see reopened)
        self.buffer.storage_owner = self
        self.buffer.record_owner()

    def _set_layout(self, layout: AgentLayout) -> None:
        self._layout = layout
        self._episodes.allocate({a: (f.shape, f.dtype)
                                 for a, f in layout.per_agent["obs"].items()})

    # ------------------------------------------------------------------ properties
    @property
    def agents(self) -> tuple[str, ...]:
        """Agent names, in the buffer's order."""
        return self._agents

    @property
    def capacity(self) -> int:
        """Joint steps over all envs."""
        return self.buffer.capacity

    @property
    def num_envs(self) -> int:
        """Envs (lanes)."""
        return self.buffer.num_envs

    @property
    def layout(self) -> AgentLayout | None:
        """The per-agent fields (None before the first add when ``spec`` left some out)."""
        return self._layout

    @property
    def spec(self) -> Spec | None:
        """The core buffer's stored fields (:mod:`replaybank.multiagent.layout`)."""
        return self.buffer.spec

    @property
    def sampler(self) -> Sampler:
        """The core's sampler."""
        return self.buffer.sampler

    @property
    def backend(self) -> ArrayBackend:
        """Where the core's arrays live."""
        return self.buffer.backend

    @property
    def rng(self) -> np.random.Generator:
        """The sampling generator."""
        return self.buffer.rng

    def __len__(self) -> int:
        """Joint steps stored."""
        return len(self.buffer)

    def __repr__(self) -> str:
        return (f"MultiAgentReplayBuffer(capacity={self.capacity}, agents={list(self.agents)}, "
                f"num_envs={self.num_envs}, size={len(self)}, "
                f"sampler={type(self.sampler).__name__})")

    # ------------------------------------------------------------------ writing
    def add(self, *args: Any, obs: Any = UNSET, action: Any = UNSET, reward: Any = UNSET,
            next_obs: Any = UNSET, terminated: Any = UNSET, truncated: Any = UNSET,
            state: Any = None, next_state: Any = None, active: Any = None,
            priority: Any = None, **extras: Any) -> None:
        """Add one joint step of every env.

        Every per-agent argument is a dict ``{agent: value}`` holding the agents that
        acted (PettingZoo's ``step`` dicts); an agent left out of the dicts did not act
        (in any env). Values are ``[*shape]`` (``[num_envs, *shape]`` with several envs).

        Args:
            obs: ``{agent: [num_envs, *obs_shape]}`` observations the agents acted on (or
                ``{agent: {key: [num_envs, *shape]}}`` for an agent with dict
                observations: its keys are fixed by the first add or ``spec``).
            action: ``{agent: [num_envs, *action_shape]}``.
            reward: ``{agent: [num_envs]}`` rewards (stored float32).
            next_obs: ``{agent: [num_envs, *obs_shape]}``: the observation after the step
                (the true final one where the agent ended).
            terminated: ``{agent: [num_envs]}`` bool: the agent reached a terminal state.
            truncated: ``{agent: [num_envs]}`` bool: the agent was cut off (time limit).
            state: ``[num_envs, *state_shape]`` global state (``env.state()``) before the
                step, or None when the buffer stores none.
            next_state: ``[num_envs, *state_shape]`` global state after the step.
            active: ``{agent: [num_envs] bool}``: in which envs an agent in ``obs``
                acted (default: all); the values of the other envs are not stored.
            priority: Initial priority of each env's joint step (prioritized samplers).
            **extras: Per-agent extras as ``{agent: value}`` dicts (e.g. ``log_prob``)
                or joint extras as arrays ``[num_envs, ...]``.

        Raises:
            ArgumentError: A bad dict, an unknown agent, an agent in ``obs`` but missing
                from another dict, an agent acting after its end in the same episode.
            SpecError: Missing or unknown state or extras, or an agent whose shapes are
                unknown at the first add.
            ShapeError, DtypeError: A value of the wrong shape or dtype.

        A rejected call leaves the buffer exactly as it was.
        """
        if args:
            raise ArgumentError(
                f"add() takes keyword arguments only, got {len(args)} positional value(s) "
                f"({', '.join(describe(a) for a in args[:3])}); pass add(obs={{agent: ...}}, "
                "action=..., reward=..., next_obs=..., terminated=..., truncated=...)")
        # the core's write and the episode bookkeeping of the step are one call of the
        # core's guard (replaybank/buffers/guard.py): a state_dict or rb.save from
        # another thread never sees the step without its bookkeeping (the core's own
        # write inside runs nested; the guard costs the owner thread no lock)
        guard = self.buffer.write_route.guard
        entered = guard.enter()
        try:
            direct = self._direct
            if direct is None or direct.layout is not self._layout:
                direct = self._direct = None if self._layout is None else DirectAdd(
                    self._layout, self.num_envs)
            # the common call (every agent acts everywhere) straight to the compiled write;
            # anything it does not take changed nothing and is checked below (inputs.py)
            if (direct is not None and active is None and priority is None and not extras
                    and direct.write(self.buffer.write_route, self._episodes, obs, action,
                                     reward, next_obs, terminated, truncated, state,
                                     next_state)):
                return
            values = {"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                      "terminated": terminated, "truncated": truncated, "state": state,
                      "next_state": next_state, "active": active}
            for name, v in values.items():
                if v is UNSET:
                    raise ArgumentError(f"add(): missing {name}=; pass {name}={{agent: value}} "
                                        "for the agents that acted")
            if AGENT_DISCOUNT in extras and isinstance(self.buffer.view, AgentNStepView):
                raise ArgumentError(f"add({AGENT_DISCOUNT}=...): {AGENT_DISCOUNT!r} holds the "
                                    "per-agent n-step discounts of this n-step buffer; rename "
                                    "the extra")
            step = prepare(self._agents, self.num_envs, self._layout, self._spec,
                           self._episodes, values, extras)
            core = step.core
            if priority is not None and not step.all_lanes and np.ndim(priority) >= 1:
                priority = np.asarray(priority)[step.lanes]
            self.buffer.add(**core, env_ids=None if step.all_lanes else step.lanes,
                            priority=priority)
            if self._layout is None:
                self._set_layout(step.layout)
            self._episodes.commit(step.act, step.ends, step.lanes, step.next_obs)
        finally:
            guard.leave(entered)

    def check_first_add(
        self,
        agents: Collection[str],
        per_agent: Collection[str] = ("obs", "action"),
        call: str = "check_first_add",
    ) -> None:
        """Refuse now the first add that would hold only ``agents``, when it would leave
        the shapes of an agent not in it unknown (``spec=`` does not give them).

        A collector calls this before it steps its envs, so that an agent joining late
        is refused before anything happened. Nothing to check once the fields are
        known (after the first add, or with a ``spec`` that gives every agent's).

        Args:
            agents: The agents of the first add.
            per_agent: Its per-agent arguments (``obs``, ``action`` and per-agent
                extras).
            call: The call the error names (``check_first_add``; a collector passes its
                own, ``"collect"``, so that its user reads the call they made, not
                ``add``).

        Raises:
            SpecError: The error that add would raise, naming the ``spec=`` entries to
                add.

        Example:
            >>> buf = MultiAgentReplayBuffer(8, ["a", "c"], spec={"obs": {"c": ((2,), "float32")}})
            >>> buf.check_first_add(["a"])  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            replaybank.errors.SpecError: check_first_add(action=...): agent 'c' ...
        """
        if self._layout is None:
            check_first_add_fields("MultiAgentReplayBuffer", self._agents, self._spec,
                                   agents, per_agent, call)

    def check_obs(self, obs: Any, state: Any = None, *, step: Mapping[str, Any] | None = None,
                  call: str = "check_obs") -> None:
        """Raise what :meth:`add` would raise for observations and a global state from
        the env; nothing changes.

        A collector calls it with each observation as it arrives (from ``reset``, and
        from ``env.step`` before the step is added: the step's ``next_obs`` and
        ``next_state``, which are the next step's ``obs`` and ``state``), so that an
        observation the buffer refuses is named as the env's and costs that env's step
        only (the collector resets that env), as
        :meth:`MultiAgentRolloutBuffer.check_obs
        <replaybank.multiagent.MultiAgentRolloutBuffer.check_obs>` does, with the same
        checks (:func:`~replaybank.multiagent.inputs.check_obs_values`). The fields are
        fixed by the first add; before it, ``step`` says which (the step whose add will
        fix them: its ``obs``, ``action``, ``state`` and extras as :meth:`add` takes
        them), and without ``step`` only what the values alone say is checked: a value
        whose field ``spec=`` does not give, and that no field can hold (text, bytes,
        objects: the first add's inference refuses it).

        Args:
            obs: ``{agent: [num_envs, *obs_shape]}`` of the agents observed (``{key:
                [num_envs, *shape]}`` for dict observations).
            state: ``[num_envs, *state_shape]``, or None when the buffer stores no state.
            step: Before the first add: the keyword values of the add that fixes the
                fields. Ignored once they are known.
            call: The call the errors name (``check_obs``; a collector passes its own,
                ``"collect"``).

        Raises:
            ArgumentError: ``obs`` is not a dict, is empty or names an unknown agent.
            SpecError: A state the buffer does not store, or none where it stores one; a
                dict observation of other keys, or a dict where the agent observes one
                array (or the reverse).
            ShapeError, DtypeError: An observation or state of the wrong shape or dtype
                (before the first add, without ``step``: a DtypeError for a value no
                field can hold).

        Example:
            >>> buf = MultiAgentReplayBuffer(8, agents=["a"], seed=0)
            >>> buf.check_obs({"a": np.array(["x", "y"])})  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            replaybank.errors.DtypeError: obs['a']=array(shape=(2,), dtype=<U1): string ...
            >>> len(buf), buf.layout is None
            (0, True)
        """
        layout = self._layout
        if layout is None and step is not None:
            layout = step_layout(self._agents, self.num_envs, self._spec, step)
        check_obs_values("MultiAgentReplayBuffer", self._agents, self.num_envs, layout,
                         self._spec, obs, state, call)

    def end_episodes(self, env_ids: Any = None) -> None:
        """End the running joint episodes of ``env_ids`` after their newest stored step:
        the env was reset while they ran (a collector's ``reset()``, a new collector on
        this buffer), so they were cut short, as by a time limit.

        The stored steps do not change: the newest step of each env keeps its next
        observation (the true one, where that episode stopped), and the step the next
        ``add`` stores in that env, which does not continue from it, starts a new episode
        for the core (n-step returns and ``sample_sequences`` end the cut episode there
        and bootstrap from that next observation, as for a single-agent buffer). The cut
        is recorded beside them, so that ``sample_episodes`` ends the joint episode there
        too (complete, as at a time limit), and the episode bookkeeping forgets which
        agents were alive or ended in it, so an agent that had ended may act again in the
        new episode. An env with no running episode is left as it is.
        :class:`~replaybank.integrations.pettingzoo.MultiAgentCollector` calls this
        whenever it resets an env. The cuts are kept by ``state_dict`` and ``rb.save``,
        and a memmap buffer keeps them in its files as it writes them
        (:mod:`replaybank.multiagent.cuts`), so ``rb.open(path)`` ends the episodes
        there, with or without a ``flush()`` since.

        Args:
            env_ids: The envs (an int or a list of ints), or None for every env.

        Raises:
            ArgumentError: ``env_ids`` are not distinct env indices of this buffer.
            ConfigError: A memmap buffer opened read-only (or closed) has a running
                episode to cut (nothing changes).

        Example:
            >>> import numpy as np
            >>> buf = MultiAgentReplayBuffer(10, agents=["a", "b"], seed=0)
            >>> step = lambda t, acting, b_ends: dict(
            ...     obs={k: np.full(1, t, np.float32) for k in acting},
            ...     action={k: 0 for k in acting}, reward={k: 1.0 for k in acting},
            ...     next_obs={k: np.full(1, t + 1, np.float32) for k in acting},
            ...     terminated={k: k == "b" and b_ends for k in acting},
            ...     truncated={k: False for k in acting})
            >>> buf.add(**step(0, ["a", "b"], True))   # b ends, a runs on
            >>> buf.end_episodes()                      # ... but the env is reset
            >>> buf.add(**step(10, ["a", "b"], False))  # b acts in the new episode
            >>> buf.sample_episodes(2, 3, replace=False, include_running=True).lengths.tolist()
            [1, 1]
        """
        lanes = env_lanes("end_episodes", env_ids, self.num_envs)
        with self.buffer.exclusive():  # the cuts and the bookkeeping at once (see add)
            ep = self._episodes
            if self.buffer.allocated:
                table = self.buffer.table
                cut = [lane for lane in lanes.tolist() if int(table.counts[lane])
                       and bool(ep.alive[:, lane].any() or ep.ended[:, lane].any())]
                if cut:
                    cuts = self._table_cuts()
                    cuts.check_writable("end_episodes")
                    created = False
                    for lane in cut:  # after the lane's newest step
                        created |= cuts.add(lane, int(table.written[lane]) - 1)
                    if created:  # durable files: the new record is complete (see Cuts.add)
                        self._record_owner()
            ep.cut(lanes)

    def _table_cuts(self) -> Cuts:
        """The cuts of the core's (allocated) step table."""
        table = self.buffer.table
        if self._cuts is None or self._cuts.table is not table:
            self._cuts = Cuts(table)
        return self._cuts

    def clear(self) -> None:
        """Drop every stored step and the episode bookkeeping."""
        with self.buffer.exclusive():  # the core and the bookkeeping at once (see add)
            self.buffer.clear()
            self._episodes = Episodes(len(self._agents), self.num_envs)
            if self._cuts is not None:
                self._cuts.clear()
            if self.buffer.allocated:
                self._origin = np.array(self.buffer.table.written, np.int64)
            if self._layout is not None:
                self._set_layout(self._layout)

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int, **kwargs: Any) -> MultiAgentBatch:
        """Sample ``batch_size`` joint transitions.

        Args:
            batch_size: Joint transitions B.
            **kwargs: Core sample options (``replace``, ``beta``, ...).

        Returns:
            A :class:`~replaybank.multiagent.batch.MultiAgentBatch`.

        Raises:
            EmptyBufferError: Nothing stored (or fewer than B with ``replace=False``).
        """
        return MultiAgentBatch.from_core(self.buffer.sample(batch_size, **kwargs),
                                         self._agents)

    def sample_episodes(self, batch_size: int, max_length: int, replace: bool = True,
                        include_running: bool = False) -> MultiAgentEpisodeBatch:
        """Sample whole joint episodes, padded (or cut) to ``max_length`` steps.

        The episodes are those of :func:`~replaybank.multiagent.padded.find_episodes`:
        the joint episodes of every env whose first step is still stored (an episode
        is split by joint ends, and where the env was reset while it ran, see
        :meth:`end_episodes`; not by one agent's end), ended ones only unless
        ``include_running``. Each is drawn with equal probability (uniform over
        episodes, not over steps), from the buffer's generator. Row ``b`` holds the
        episode's first ``min(length, max_length)`` steps from its first step on;
        longer episodes are cut (``lengths`` tells), and every field is zero past the
        episode's steps (``mask``) or where an agent did not act (``active[agent]``).

        Args:
            batch_size: Episodes B.
            max_length: Steps L per row.
            replace: Draw with replacement (default) or B distinct episodes.
            include_running: Also draw episodes that have not ended yet
                (``complete`` False).

        Returns:
            A :class:`~replaybank.multiagent.batch.MultiAgentEpisodeBatch`, fields
            ``[B, L, *shape]``.

        Raises:
            ConfigError: ``batch_size`` or ``max_length`` is not a positive int.
            ArgumentError: ``replace`` or ``include_running`` is not a bool.
            EmptyBufferError: No episode to draw (or fewer than B with
                ``replace=False``).

        Example:
            >>> import numpy as np
            >>> buf = MultiAgentReplayBuffer(32, ["a", "b"], seed=0)
            >>> for t in range(7):         # episodes of 3 steps; b leaves after 2 steps
            ...     acting = ["a", "b"] if t % 3 < 2 else ["a"]
            ...     buf.add(obs={k: np.full(2, t, np.float32) for k in acting},
            ...             action={k: 0 for k in acting}, reward={k: 1.0 for k in acting},
            ...             next_obs={k: np.full(2, t + 1, np.float32) for k in acting},
            ...             terminated={k: (k == "b" and t % 3 == 1) or t % 3 == 2
            ...                         for k in acting},
            ...             truncated={k: False for k in acting})
            >>> ep = buf.sample_episodes(2, 4, replace=False)
            >>> ep.mask.astype(int).tolist()
            [[1, 1, 1, 0], [1, 1, 1, 0]]
            >>> ep.active["b"].astype(int).tolist()
            [[1, 1, 0, 0], [1, 1, 0, 0]]
            >>> sorted(ep.obs["a"][:, 0, 0].tolist()), ep.lengths.tolist()
            ([0.0, 3.0], [3, 3])
        """
        call = "sample_episodes"
        b = check_size_arg("batch_size", batch_size, call)
        length = check_size_arg("max_length", max_length, call)
        replace = check_replace(replace, call)
        if not isinstance(include_running, (bool, np.bool_)):
            raise ArgumentError(f"{call}(include_running={describe(include_running)}): "
                                "pass True or False")
        with self.buffer.exclusive():
            if not self.buffer.allocated:
                raise EmptyBufferError(f"{call}(batch_size={b}): the buffer is empty; add "
                                       "joint steps first")
            table = self.buffer.table
            eps = self._episode_index.episodes(table, self._origin, bool(include_running),
                                               self._table_cuts().lanes)
            if len(eps) == 0 or (not replace and b > len(eps)):
                raise EmptyBufferError(
                    f"{call}(batch_size={b}{'' if replace else ', replace=False'}): the "
                    f"buffer holds {len(eps)} whole "
                    f"{'' if include_running else 'ended '}joint episodes; add more"
                    + ("" if include_running else ", or pass include_running=True")
                    + ("" if replace else ", or use replace=True"))
            pick = self.buffer.rng.choice(len(eps), size=b, replace=replace)  # [B]
            starts, lengths = eps.starts[pick], eps.lengths[pick]
            out = gather_episodes(table, starts, lengths, length)
        mask = out["mask"]
        steps = np.arange(length)
        out["is_first"] = mask & (steps == 0)[None, :]
        # an episode's last step, where it ended (a joint end, or cut by a reset)
        out["is_last"] = mask & (steps[None, :] == (lengths - 1)[:, None]) \
            & eps.complete[pick][:, None]
        out["is_terminal"] = mask & as_numpy(out["terminated"])
        if not isinstance(out["terminated"], np.ndarray):  # torch storage: all tensors
            torch = sys.modules["torch"]
            dev = out["terminated"].device
            for k in ("mask", "is_first", "is_last", "is_terminal", "starts"):
                out[k] = torch.as_tensor(out[k], device=dev)
            return MultiAgentEpisodeBatch.from_core(
                SequenceBatch.own(out), self._agents,
                torch.as_tensor(lengths, device=dev),
                torch.as_tensor(eps.complete[pick], device=dev))
        return MultiAgentEpisodeBatch.from_core(SequenceBatch.own(out), self._agents,
                                                lengths, eps.complete[pick])

    def sample_sequences(self, batch_size: int, sequence_length: int,
                         **kwargs: Any) -> MultiAgentSequenceBatch:
        """Sample ``[B, L]`` windows of joint steps (recurrent agents, QMIX episodes).

        Args:
            batch_size: Windows B.
            sequence_length: Steps L per window.
            **kwargs: Core options (``episode_boundary``, ``strict``, ``burn_in``, ...:
                :func:`~replaybank.buffers.sequences.sample_sequences`).

        Returns:
            A :class:`~replaybank.multiagent.batch.MultiAgentSequenceBatch`.
        """
        return MultiAgentSequenceBatch.from_core(
            self.buffer.sample_sequences(batch_size, sequence_length, **kwargs), self._agents)

    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """Set the priorities of sampled joint steps (``batch.indices``); see
        :meth:`ReplayBuffer.update_priorities`.

        Returns:
            Number applied (keys of overwritten steps are ignored).
        """
        return self.buffer.update_priorities(indices, priorities)

    # ------------------------------------------------------------------ state
    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold other threads' calls on the core off (``rb.save`` uses it)."""
        with self.buffer.exclusive():
            yield

    def state_dict(self) -> dict[str, Any]:
        """The core's state under ``core`` and the episode bookkeeping under
        ``multiagent`` (leaves are arrays or JSON-able values)."""
        with self.buffer.exclusive():  # one moment of the core and the bookkeeping (see add)
            own = self._episodes.state_dict()
            own["agents"] = list(self._agents)
            own["origin"] = self._origin.copy()
            own["cuts"] = self._table_cuts().pairs() if self.buffer.allocated \
                else np.zeros((0, 2), np.int64)
            return {"core": self.buffer.state_dict(), "multiagent": own}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`; a state that does not fit changes nothing.

        Raises:
            CheckpointError: The state does not fit this buffer or is damaged.
        """
        if not isinstance(state, dict) or not {"core", "multiagent"} <= set(state):
            raise CheckpointError(f"load_state_dict(state={describe(state)}): expected the "
                                  "dict of MultiAgentReplayBuffer.state_dict()")
        own = state["multiagent"]
        if not isinstance(own, dict) or list(own.get("agents", ())) != list(self._agents):
            raise CheckpointError(
                f"load_state_dict: the state's agents {describe(own.get('agents')) if isinstance(own, dict) else own} "  # noqa: E501
                f"differ from this buffer's {list(self._agents)}; load it into a buffer with "
                "the same agents")
        with self.buffer.exclusive():  # not beside another thread's call
            episodes = Episodes(len(self._agents), self.num_envs)
            layout = self._layout
            if layout is None and self.buffer.spec is None:
                spec = state["core"].get("metadata", {}).get("spec")
                if spec is not None:
                    layout = _layout_of(self._agents, spec)
            if layout is not None:
                episodes.allocate({a: (f.shape, f.dtype)
                                   for a, f in layout.per_agent["obs"].items()})
            checked = episodes.checked(own)
            origin = np.zeros(self.num_envs, np.int64)  # states from before it was kept
            if "origin" in own:
                origin = np.asarray(own["origin"])
                if origin.shape != (self.num_envs,) or origin.dtype.kind not in "iu":
                    raise CheckpointError(
                        f"load_state_dict: multiagent/origin has shape {origin.shape} "
                        f"{origin.dtype}; expected ({self.num_envs},) int64; restore the "
                        "multi-agent state from a checkpoint of this buffer")
            pairs = np.zeros((0, 2), np.int64)  # states from before they were kept: none
            if "cuts" in own:
                pairs = np.asarray(own["cuts"])
                if pairs.ndim != 2 or pairs.shape[1:] != (2,) or (
                        pairs.size and (pairs.dtype.kind not in "iu" or pairs[:, 0].min() < 0
                                        or pairs[:, 0].max() >= self.num_envs)):
                    raise CheckpointError(
                        f"load_state_dict: multiagent/cuts has shape {pairs.shape} "
                        f"{pairs.dtype}; expected [k, 2] int64 (env, step) pairs; restore the "
                        "multi-agent state from a checkpoint of this buffer")
            self.buffer.load_state_dict(state["core"])
            episodes.apply(checked)
            self._origin = origin.astype(np.int64)
            if self.buffer.allocated:
                self._table_cuts().load(pairs)
            if layout is not None and self._layout is None:
                self._layout = layout
            self._episodes = episodes

    def save(self, dirpath: Any, prefix: str = "buffer_") -> None:
        """Write ``<prefix>metadata.json`` and ``<prefix>state.safetensors`` atomically
        (:func:`replaybank.persist.save`; the type must be registered)."""
        persist.save(self, dirpath, prefix=prefix)

    @classmethod
    def load(cls, dirpath: Any, prefix: str = "buffer_", *,
             trust_imports: bool = False) -> AnyBuffer:
        """Restore a buffer saved with :meth:`save` (identical next sample)."""
        return persist.load(dirpath, prefix=prefix, trust_imports=trust_imports)

    # ------------------------------------------------------------------ memmap resume
    def resume_state(self) -> dict[str, Any] | None:
        """What :func:`replaybank.persist.flush` saves beside the memmap files: the
        core's generator, sampler and view state and lane counters, and the joint
        episode bookkeeping under ``multiagent`` (None before the storage exists)."""
        with self.buffer.exclusive():  # one moment, as state_dict
            core = self.buffer.resume_state()
            if core is None:
                return None
            return {**core, "multiagent": resume_part(self._episodes, self._origin, self._agents)}

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`resume_state` whose counters match the files (checked first:
        a state that does not fit raises CheckpointError and changes nothing)."""
        if not isinstance(state, dict) or "multiagent" not in state:
            raise CheckpointError(f"load_resume_state(state={describe(state)}): expected the "
                                  "dict of MultiAgentReplayBuffer.resume_state()")
        with self.buffer.exclusive():  # not beside another thread's call
            episodes, origin = checked_resume_part(state["multiagent"], self._agents,
                                                   self.num_envs, self._layout)
            self.buffer.load_resume_state({k: v for k, v in state.items() if k != "multiagent"})
            if self.buffer.allocated:  # a cut after the flush (kept in the files) ends them
                episodes.cut(self._table_cuts().newest_cut())
            self._episodes, self._origin = episodes, origin

    def reopened(self) -> None:
        """The core was reopened from its memmap files: rebuild the core's free slots and
        sampler, then the agent layout, the joint episode bookkeeping and the episode
        origins from the stored steps (:mod:`replaybank.multiagent.resume`).

        Raises:
            CheckpointError: The files' lane counters or links are damaged, or they do
                not hold a multi-agent core.
        """
        self.buffer.reopened()
        spec = self.buffer.spec
        if self._layout is None and spec is not None:
            try:
                layout = layout_from_core(self._agents, spec)
            except SpecError as exc:
                raise CheckpointError(f"the memmap files at {self.backend!r} do not hold "
                                      f"the agents {list(self._agents)}: {exc}") from exc
            self._set_layout(layout)
        if self.buffer.allocated:
            self._cuts = Cuts(self.buffer.table, reopened=True)
            self._episodes = episodes_from_table(self.buffer.table, self._agents, self._layout,
                                                 self._cuts.lanes)
            self._origin = origin_from_table(self.buffer.table)
            self.buffer.record_owner()  # now with every agent's fields

    def flush(self) -> None:
        """Make a ``storage="memmap"`` buffer durable and exactly resumable: sync the
        files and save the generator, sampler and episode bookkeeping beside them, so
        that :meth:`open` (``rb.open(path)``) continues with the identical next sample and
        episodes as long as nothing is added after this call
        (:func:`replaybank.persist.flush`).

        Raises:
            ConfigError: The storage is not memmap (use :meth:`save` instead), or the
                buffer may not write its files: opened read-only, or closed
                (:meth:`close`; reopen it with ``rb.open(path)``).
            CheckpointError: The state could not be written (the previous one is kept).

        Example:
            >>> import tempfile, numpy as np
            >>> import replaybank as rb
            >>> d = tempfile.mkdtemp()
            >>> buf = MultiAgentReplayBuffer(16, ["a", "b"], storage="memmap", path=d,
            ...                              seed=0)
            >>> for t in range(4):
            ...     buf.add(obs={k: np.full(2, t, np.float32) for k in "ab"},
            ...             action={k: 0 for k in "ab"}, reward={k: 1.0 for k in "ab"},
            ...             next_obs={k: np.full(2, t + 1, np.float32) for k in "ab"},
            ...             terminated={k: t == 3 for k in "ab"},
            ...             truncated={k: False for k in "ab"})
            >>> buf.flush()
            >>> buf.close()                          # or the process ends
            >>> back = rb.open(d)
            >>> type(back).__name__, back.agents, len(back)
            ('MultiAgentReplayBuffer', ('a', 'b'), 4)
        """
        persist.flush(self, before=self._record_owner)

    def _record_owner(self) -> None:
        """Record the config (now with every agent's fields) in the files, if they exist."""
        if self.buffer.allocated:
            self.buffer.record_owner()

    def close(self) -> None:
        """Release memmap storage: sync the files and drop the writer's lock (no-op in
        memory); call :meth:`flush` first to resume exactly."""
        self.buffer.close()

    @classmethod
    def open(cls, path: Any, mode: str = "r+", *, trust_imports: bool = False) -> AnyBuffer:
        """Reopen the memmap multi-agent buffer at ``path``
        (:func:`replaybank.persist.open`): every stored joint step, the agents, and, when
        nothing was added after its last :meth:`flush`, the identical next sample and
        episode bookkeeping. ``mode="r"`` opens it read-only, beside the writer."""
        return persist.open(path, mode=mode, trust_imports=trust_imports)

    def metadata(self) -> dict[str, Any]:
        """The core's description, with this type's name and the agents."""
        return {**self.buffer.metadata(), "type": type(self).__name__,
                "agents": list(self._agents)}

    def init_config(self) -> dict[str, Any]:
        """Constructor values that rebuild this buffer empty (for :meth:`config`)."""
        out = self.buffer.init_config()
        out["agents"] = list(self._agents)
        layout = self._layout
        if layout is None and self.buffer.spec is not None:
            # the core allocated its storage in the first add, before the layout is
            # kept: its fields give the layout (memmap files record this config then)
            layout = layout_from_core(self._agents, self.buffer.spec)
        out["spec"] = layout.user_spec() if layout is not None else (
            None if self._spec is None else _flat_json(self._spec, self._agents))
        out.pop("next_obs", None)
        return out

    def config(self) -> BufferConfig:
        """A validated config object (pydantic) that rebuilds an equivalent empty buffer."""
        from replaybank.config import buffer_config

        return buffer_config(self)


def _flat_json(spec: Any, agents: tuple[str, ...]) -> dict[str, Any]:
    return {n: f.to_json() for n, f in parse_spec(spec, agents).items()}


def _layout_of(agents: tuple[str, ...], core_spec: dict[str, Any]) -> AgentLayout | None:
    """The layout behind a saved core spec (every field: the global state and the
    extras too), or None when it is not one."""
    def observes(a: str) -> bool:  # one array, or a dict observation's leaves
        return f"obs/{a}" in core_spec or any(n.startswith(f"obs/{a}/") for n in core_spec)

    if not all(observes(a) and f"action/{a}" in core_spec for a in agents):
        return None
    return layout_from_core(agents, Spec.from_json(core_spec))


#: The ReplayBuffer keywords a MultiAgentReplayBuffer passes on through ``**kwargs``.
_BUFFER_ARGUMENTS = frozenset(inspect.signature(ReplayBuffer.__init__).parameters) - {
    "self", "capacity", "num_envs", "seed", "spec", "sampler", "storage", "path", "device",
    "n_step", "gamma", "next_obs"}


def _check_storage(storage: str | ArrayBackend) -> None:
    """Refuse ``storage="shared"`` (a name or a backend of that kind): its owner only
    samples, and collector processes get no multi-agent writer.

    Raises:
        ConfigError: Naming the storages and the service that work.
    """
    if storage == "shared" or isinstance(storage, SharedArrayBackend):
        raise ConfigError(
            "MultiAgentReplayBuffer(storage='shared'): a multi-agent buffer cannot live in "
            "shared memory (its owner only samples, and there is no multi-agent writer for "
            'collector processes); use storage="numpy", "memmap" or "torch" in one process, '
            "or rb.distributed.ReplayService(num_shards, {'type': "
            "'MultiAgentReplayBuffer', ...}) for collectors in other processes")
