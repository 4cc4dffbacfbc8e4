"""``MultiAgentRolloutBuffer``: on-policy rollouts of PettingZoo-style agents (MAPPO, IPPO).

Each :meth:`~MultiAgentRolloutBuffer.add` stores one step of every env, with the
per-agent dicts of PettingZoo's parallel API; an agent left out of the dicts (or masked
by ``active``) did not act. Fields are stored time-aligned, ``[n_steps, num_envs,
*shape]`` per agent (agents may differ in shapes; the layout, shape inference and the
spec forms are :mod:`replaybank.multiagent.layout`'s).

An agent may observe a dict with one level of keys (PettingZoo's ``{"observation": ...,
"action_mask": ...}``, a gymnasium ``Dict`` space), as in
:class:`~replaybank.multiagent.MultiAgentReplayBuffer`: each key is stored as its own
field ``obs/<agent>/<key>`` with its own shape and dtype (fixed by the first add or
``spec={"obs": {agent: {key: (shape, dtype)}}}``), every later add must give exactly those
keys, and the observation comes back as ``{key: [B, *shape]}`` wherever one array would
(``batch.obs[agent]``; ``batch.obs`` of ``agents="flatten"`` when the agents share the
keys; the ``obs`` that ``value_fn`` gets for kept final observations).

Advantages (:meth:`~MultiAgentRolloutBuffer.compute_returns_and_advantage`) are
per-agent GAE over each agent's own sequence of active steps in each env
(:func:`replaybank.multiagent.rollout_gae.active_gae`, which runs the one
:func:`replaybank.ops.gae.gae`):

* ``delta = r_t + gamma * V_next * (1 - terminated_t) - V_t``, ``V_next`` the value at the
  agent's *next active* step in that env (an inactive step is skipped: it is part of no
  step's GAE, and never reaches a minibatch), ``final_value`` where the agent was
  truncated (the value of its true final observation: given to ``add``, or kept as
  ``final_obs`` / ``final_state`` and valued by one batched
  ``compute_returns_and_advantage(value_fn=...)`` call, :mod:`.rollout_final`),
  ``last_values`` after its last active step;
* the recursion is cut at each of the agent's own ends, so an agent that ends before the
  others stops its own recursion there. An agent that acts again after its end starts a
  new episode of its own;
* values are per agent (``value={agent: ...}``) or one centralised value per env
  (``value=array``), shared by the agents (MAPPO's centralised critic); which one is
  fixed by the first add (or ``spec``). Returns are ``advantages + value`` (TD(lambda));
  GAE runs in float64, advantages and returns take the value field's dtype.

Minibatches (:meth:`~MultiAgentRolloutBuffer.get`) are shuffled with the buffer's
generator: ``agents="together"`` yields :class:`MultiAgentRolloutBatch` es of (env, time)
steps where some agent acted, every agent's fields side by side with its ``active``
mask; ``agents="flatten"`` yields :class:`~replaybank.batch.Batch` es of the active
(env, time, agent) items, fields stacked over agents (which must then share shapes), with
an ``agent`` index. Advantage normalisation (``normalize_advantage``: ``"batch"``,
``"minibatch"`` or None) uses the active entries only.

Example:
    >>> import numpy as np
    >>> buf = MultiAgentRolloutBuffer(3, agents=["a", "b"], gamma=0.5, gae_lambda=1.0,
    ...                               normalize_advantage=None, seed=0)
    >>> for t in range(3):
    ...     acting = ["a", "b"] if t < 2 else ["a"]          # b terminates at t = 1
    ...     buf.add(obs={k: np.full(2, t, np.float32) for k in acting},
    ...             action={k: 0 for k in acting}, reward={k: 1.0 for k in acting},
    ...             terminated={k: k == "b" and t == 1 for k in acting},
    ...             truncated={k: False for k in acting},
    ...             value={k: 0.0 for k in acting}, log_prob={k: -0.5 for k in acting})
    >>> buf.compute_returns_and_advantage(last_values={"a": 4.0})
    >>> buf.advantages["a"][:, 0].tolist(), buf.advantages["b"][:, 0].tolist()
    ([2.25, 2.5, 3.0], [1.5, 1.0, 0.0])
    >>> [b.batch_size for b in buf.get(batch_size=2)]           # 3 steps, b inactive at 2
    [2, 1]
    >>> [int(b.agent.size) for b in buf.get(agents="flatten")]  # 5 active agent-steps
    [5]

    Dict observations, two envs; "b" is cut off in env 1 at step 0, its dict final
    observation valued later by ``value_fn``:

    >>> def observe(t):  # [2 envs, ...] per key
    ...     return {"observation": np.full((2, 3), t, np.float32),
    ...             "action_mask": np.array([[1, 0], [1, 1]], np.int8)}
    >>> buf = MultiAgentRolloutBuffer(2, agents=["a", "b"], num_envs=2, gamma=0.5,
    ...                               gae_lambda=1.0, normalize_advantage=None, seed=0)
    >>> two = lambda v: {k: np.full(2, v) for k in ("a", "b")}
    >>> for t in range(2):
    ...     buf.add(obs={"a": observe(t), "b": observe(t)}, reward=two(1.0),
    ...             action={k: np.zeros(2, np.int64) for k in ("a", "b")},
    ...             terminated=two(False), truncated={"a": [False] * 2,
    ...                                               "b": [False, t == 0]},
    ...             value=two(0.0), log_prob=two(0.0), final_obs={"b": observe(8)},
    ...             active={"a": [True, True], "b": [True, t == 0]})
    >>> def critic(obs, state):  # obs {agent: {key: [K, *shape]}}; V = observation[0]
    ...     return {k: o["observation"][:, 0].astype(float) for k, o in obs.items()}
    >>> buf.compute_returns_and_advantage(last_values=two(0.0), value_fn=critic)
    >>> buf.advantages["b"].tolist()  # env 1: 1 + 0.5 * V(final obs) = 1 + 0.5 * 8
    [[1.5, 5.0], [1.0, 0.0]]
    >>> mb = next(buf.get(shuffle=False))
    >>> sorted(mb.obs["b"]), mb.obs["b"]["action_mask"].dtype, mb.active["b"].tolist()
    (['action_mask', 'observation'], dtype('int8'), [True, True, True, False])
    >>> flat = next(buf.get(agents="flatten"))  # the agents share the keys: per key
    >>> flat.obs["observation"].shape, int(flat.agent.size)
    ((7, 3), 7)
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
import numpy.typing as npt

from replaybank import persist
from replaybank.batch import Batch
from replaybank.buffers.arguments import make_rng, positive_int, unit_number
from replaybank.buffers.inputs import RESERVED
from replaybank.buffers.one_thread import ThreadCheck, one_thread_call
from replaybank.buffers.rollout.batches import normalise
from replaybank.buffers.rollout.current import while_current
from replaybank.buffers.rollout.inputs import per_env_float
from replaybank.errors import (
    ArgumentError,
    CapacityError,
    CheckpointError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    ReplayBankError,
    ShapeError,
    SpecError,
    describe,
)
from replaybank.multiagent.episodes import env_lanes
from replaybank.multiagent.inputs import (
    cast_leaves,
    cast_obs,
    cast_value,
    check_action_tuples,
    check_agent_dicts,
    check_obs_values,
    check_state_given,
)
from replaybank.multiagent.layout import (
    PARTED,
    RESERVED_NAMES,
    STATE,
    AgentLayout,
    check_agents,
    missing_spec_error,
    parse_spec,
    unknown_fields,
)
from replaybank.multiagent.rollout_batch import (
    MultiAgentRolloutBatch,
    flatten_rows,
    together_rows,
)
from replaybank.multiagent.rollout_final import FinalObservations, ValueFn
from replaybank.multiagent.rollout_gae import active_gae, needs_last_value
from replaybank.ops.gae import Backend
from replaybank.spec import SEP, UNSET, FieldSpec, Spec

if TYPE_CHECKING:  # pydantic loads with the first config() call
    from replaybank.config import BufferConfig

__all__ = ["MultiAgentRolloutBuffer"]

AnyArray = npt.NDArray[Any]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: The per-agent dict arguments of ``add`` (``value`` may also be one array).
_DICT_ARGS = ("obs", "action", "reward", "terminated", "truncated", "log_prob")
#: Names no extra may take.
_RESERVED = RESERVED_NAMES | RESERVED | frozenset({
    "value", "log_prob", "final_value", "final_obs", "final_state", "advantages", "returns",
    "agent", "indices"})
_NORMS = ("batch", "minibatch", None)
_FLAG = np.dtype(np.bool_)
_OUTCOMES = ("reward", "terminated", "truncated", "active")
#: The per-agent fields that hold one float per step (examples of a missing spec entry).
_SCALARS = ("log_prob", "value")


def _renamed(exc: ReplayBankError) -> ReplayBankError:
    """The layout helpers' error, naming this class (they name the replay buffer)."""
    return type(exc)(str(exc).replace("MultiAgentReplayBuffer(", "MultiAgentRolloutBuffer("))


def _check_values(row: Mapping[str, AnyArray], layout: AgentLayout,
                  acting: tuple[str, ...], given: Any, call: str = "add") -> None:
    """Refuse a NaN or infinite value where GAE reads it: an acting agent's value in the
    envs where it acted, or a centralised value of an env where some agent acted (other
    entries are not read: stored as given, or zero). ``call``: the call the user made,
    for messages."""
    if "value" in layout.per_agent:
        for a in acting:
            v, act = row[f"value{SEP}{a}"], row[f"active{SEP}{a}"]  # [E] each
            bad = act & ~np.isfinite(v)
            if bad.any():
                envs = np.flatnonzero(bad)
                raise DtypeError(
                    f"{call}(value={describe(given)}): the values {v[envs[:4]].tolist()} "
                    f"of agent {a!r} in envs {envs[:4].tolist()} are NaN or infinite; GAE "
                    "reads the value of every step an agent acted: pass finite values, "
                    "e.g. critic(obs)")
        return
    v = row["value"]
    acted = np.zeros(len(v), bool)
    for a in acting:
        acted |= row[f"active{SEP}{a}"]
    bad = acted & ~np.isfinite(v)
    if bad.any():
        envs = np.flatnonzero(bad)
        raise DtypeError(
            f"{call}(value={describe(given)}): the centralised values "
            f"{v[envs[:4]].tolist()} "
            f"of envs {envs[:4].tolist()} (where agents acted) are NaN or infinite; GAE "
            "reads them: pass finite values, e.g. critic(state)")


def _float_field(field: FieldSpec, declared: bool, arg: str,
                 shape: tuple[int, ...] | None) -> FieldSpec:
    """A value / log-prob field: real floats (an inferred int or bool becomes float32),
    of ``shape`` when given."""
    if shape is not None and field.shape != shape:
        raise SpecError(f"{arg}: shape {field.shape} per env, but a value is one number per "
                        f"env (shape {shape}); pass V(s) as [num_envs] (squeeze the critic's "
                        "output)")
    if field.dtype.kind == "f":
        return field
    if declared:
        raise SpecError(f"spec[{field.name!r}] has dtype {field.dtype}; {arg} must be a "
                        "float field; declare float32 or float64")
    return FieldSpec(field.name, field.shape, np.dtype(np.float32))


class MultiAgentRolloutBuffer:
    """On-policy storage of ``n_steps`` joint steps of ``num_envs`` envs, per-agent GAE.

    Args:
        n_steps: Steps per env per rollout ``T``.
        agents: Agent names (e.g. ``env.possible_agents``), in the order batches use.
        num_envs: Number of parallel envs (values then have leading dim ``num_envs``).
        gamma: Discount factor.
        gae_lambda: GAE lambda.
        seed: Seed or Generator of the minibatch shuffling.
        spec: Shapes and dtypes, ``{"obs": {agent: (shape, dtype)}, "action": {...},
            "log_prob": {...}, "value": {agent: ((), dtype)} or ((), dtype), "state":
            (shape, dtype), <extra>: ...}`` (or the flat ``"obs/<agent>"`` form); what it
            leaves out is inferred from the first add (an agent missing from the first
            add then needs its entries). Rewards are stored in the dtype the first add
            gives them when it is a float, else in the agent's value dtype (float64 values
            and rewards give float64 advantages).
        normalize_advantage: ``"batch"`` (over the whole rollout's active agent-steps),
            ``"minibatch"`` (per minibatch) or None; ``(adv - mean) / (std + eps)`` with
            the population std. :attr:`advantages` stays raw.
        advantage_eps: Added to the std when normalising.
        backend: GAE backend, ``"auto"``, ``"numpy"`` or ``"numba"``.

    Raises:
        ConfigError: A bad size, discount, lambda, normalisation or backend.
        ArgumentError: Bad agent names.
        SpecError: A bad ``spec``.

    Example:
        >>> buf = MultiAgentRolloutBuffer(128, agents=["a", "b"], num_envs=4, seed=0)
        >>> buf.agents, len(buf), buf.full
        (('a', 'b'), 0, False)
    """

    def __init__(
        self,
        n_steps: int,
        agents: Any,
        num_envs: int = 1,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        seed: int | np.random.Generator | None = None,
        spec: Any = None,
        normalize_advantage: str | None = "batch",
        advantage_eps: float = 1e-8,
        backend: Backend = "auto",
    ) -> None:
        self._n_steps = positive_int("n_steps", n_steps)
        self._num_envs = positive_int("num_envs", num_envs)
        try:
            self._agents = check_agents(agents)
            # the buffer's own copy (flat fields): the caller's dict may change later
            given = None if spec is None else parse_spec(spec, self._agents)
        except ReplayBankError as exc:
            raise _renamed(exc) from None
        gamma = unit_number("gamma", gamma, 0.99)
        gae_lambda = unit_number("gae_lambda", gae_lambda, 0.95)
        if not (normalize_advantage is None or isinstance(normalize_advantage, str)) \
                or normalize_advantage not in _NORMS:
            raise ConfigError(f"normalize_advantage={normalize_advantage!r}: expected "
                              "'batch', 'minibatch' or None")
        if isinstance(advantage_eps, bool) or not isinstance(advantage_eps, (int, float)) \
                or not np.isfinite(advantage_eps) or advantage_eps < 0:
            raise ConfigError(f"advantage_eps={advantage_eps!r}: must be a finite number "
                              ">= 0; pass e.g. advantage_eps=1e-8")
        if not isinstance(backend, str) or backend not in ("auto", "numpy", "numba"):
            raise ConfigError(f"backend={backend!r}: expected 'auto', 'numpy' or 'numba'")
        self.gamma, self.gae_lambda = float(gamma), float(gae_lambda)
        self.normalize_advantage = normalize_advantage
        self.advantage_eps = float(advantage_eps)
        self.backend: Backend = backend
        self._seed = int(seed) if isinstance(seed, (int, np.integer)) \
            and not isinstance(seed, bool) else None
        self._rng = make_rng(seed)
        self._spec_arg = given
        self._layout: AgentLayout | None = None
        self._fields: Spec | None = None  # every stored field, flat names
        self._data: dict[str, AnyArray] = {}
        self._pos = 0
        n = len(self._agents)
        self._final_value = np.full((self._n_steps, self._num_envs, n), np.nan)  # [T, E, n]
        self._final_obs = FinalObservations(self._agents, self._num_envs)
        self._adv: dict[str, AnyArray] | None = None
        self._ret: dict[str, AnyArray] | None = None
        self.thread_check = ThreadCheck("MultiAgentRolloutBuffer")
        try:
            layout = AgentLayout.build(self._agents, given, {}, ())
        except SpecError:  # the spec leaves some shapes to the first add
            layout = None
        if layout is not None:
            if "value" not in layout.per_agent and "value" not in layout.joint:
                layout = None  # the first add says whether values are per agent
            elif "log_prob" not in layout.per_agent:
                layout = None
        if layout is not None:
            self._allocate(*self._checked_layout(layout, None))

    # ------------------------------------------------------------------ properties
    @property
    def agents(self) -> tuple[str, ...]:
        """Agent names, in the buffer's order."""
        return self._agents

    @property
    def n_steps(self) -> int:
        """Steps per env per rollout."""
        return self._n_steps

    @property
    def num_envs(self) -> int:
        """Number of envs."""
        return self._num_envs

    @property
    def pos(self) -> int:
        """Steps stored per env so far."""
        return self._pos

    @property
    def full(self) -> bool:
        """Whether ``n_steps`` steps are stored."""
        return self._pos == self._n_steps

    @property
    def layout(self) -> AgentLayout | None:
        """The per-agent fields (None until known)."""
        return self._layout

    @property
    def spec(self) -> Spec | None:
        """Every stored field by flat name (``obs/<agent>``, ``reward/<agent>``, ``state``,
        ``value`` or ``value/<agent>``, ...), or None until known."""
        return self._fields

    @property
    def centralised_value(self) -> bool | None:
        """Whether values are one per env (True) or one per agent (False); None until
        the first add (or ``spec``) says."""
        if self._layout is None:
            return None
        return "value" in self._layout.joint

    @property
    def rng(self) -> np.random.Generator:
        """The shuffling generator."""
        return self._rng

    def __len__(self) -> int:
        """Joint steps stored, ``pos * num_envs``."""
        return self._pos * self._num_envs

    def __repr__(self) -> str:
        return (f"MultiAgentRolloutBuffer(n_steps={self._n_steps}, "
                f"agents={list(self._agents)}, num_envs={self._num_envs}, pos={self._pos}, "
                f"gamma={self.gamma}, gae_lambda={self.gae_lambda})")

    @property
    def data(self) -> dict[str, AnyArray]:
        """Stored fields as views ``[pos, num_envs, *shape]`` keyed by flat name."""
        return {n: a[: self._pos] for n, a in self._data.items()}

    @property
    def active(self) -> dict[str, BoolArray]:
        """``{agent: [pos, num_envs] bool}``: where each agent acted."""
        return {a: self._data[f"active{SEP}{a}"][: self._pos] if self._data
                else np.zeros((0, self._num_envs), bool) for a in self._agents}

    @property
    def advantages(self) -> dict[str, AnyArray]:
        """Raw advantages ``{agent: [pos, num_envs]}`` (0 where the agent did not act).

        Raises:
            EmptyBufferError: Not computed for the current data.
        """
        return self._computed("advantages")[0]

    @property
    def returns(self) -> dict[str, AnyArray]:
        """Value targets ``{agent: [pos, num_envs]}`` (``advantages + value``; 0 where
        the agent did not act).

        Raises:
            EmptyBufferError: Not computed for the current data.
        """
        return self._computed("returns")[1]

    def _computed(self, call: str) -> tuple[dict[str, AnyArray], dict[str, AnyArray]]:
        if self._adv is None or self._ret is None:
            raise EmptyBufferError(
                f"{call}: advantages are not computed for the current data; call "
                "compute_returns_and_advantage(last_values=...) after the last add")
        return self._adv, self._ret

    # ------------------------------------------------------------------ layout
    def _checked_layout(self, layout: AgentLayout, reward: Mapping[str, Any] | None,
                        lead: tuple[int, ...] = ()) -> tuple[AgentLayout, Spec]:
        """Fix the value and log-prob fields (float, values scalar) and list every stored
        field. ``reward`` (the first add's) gives the rewards' float dtype."""
        declared = parse_spec(self._spec_arg, self._agents)
        per = {top: dict(fields) for top, fields in layout.per_agent.items()}
        joint = dict(layout.joint)
        if "log_prob" not in per:
            raise SpecError("add(log_prob=...): log_prob is per agent; pass "
                            "log_prob={agent: log-probability of its action}")
        for a, f in per["log_prob"].items():
            per["log_prob"][a] = _float_field(f, f.name in declared, "log_prob", None)
        if "value" in per:
            for a, f in per["value"].items():
                per["value"][a] = _float_field(f, f.name in declared, f"value[{a!r}]", ())
        else:
            joint["value"] = _float_field(joint["value"], "value" in declared, "value", ())
        fixed = AgentLayout(layout.agents, per, layout.state, joint)
        fields: list[FieldSpec] = []
        for per_agent in fixed.per_agent.values():
            fields.extend(per_agent.values())
        kinds = {a: FieldSpec.infer(f"reward{SEP}{a}", r, lead, f"reward[{a!r}]").dtype
                 for a, r in (reward or {}).items()}
        for a in self._agents:  # as given, else the agent's value dtype
            value_dtype = (per["value"][a] if "value" in per else joint["value"]).dtype
            dtype = kinds.get(a, value_dtype)
            fields.append(FieldSpec(f"reward{SEP}{a}", (),
                                    dtype if dtype.kind == "f" else value_dtype))
        for prefix in ("terminated", "truncated", "active"):
            fields.extend(FieldSpec(f"{prefix}{SEP}{a}", (), _FLAG) for a in self._agents)
        if fixed.state is not None:
            fields.append(FieldSpec(STATE, fixed.state.shape, fixed.state.dtype))
        fields.extend(fixed.joint.values())
        return fixed, Spec(fields)

    def _allocate(self, layout: AgentLayout, fields: Spec) -> None:
        shape = (self._n_steps, self._num_envs)
        self._layout, self._fields = layout, fields
        self._data = {n: np.zeros((*shape, *f.shape), f.dtype) for n, f in fields.items()}

    # ------------------------------------------------------------------ writing
    @one_thread_call("add")
    def add(self, /, *args: Any, obs: Any = UNSET, action: Any = UNSET, reward: Any = UNSET,
            terminated: Any = UNSET, truncated: Any = UNSET, value: Any = UNSET,
            log_prob: Any = UNSET, state: Any = None, active: Any = None,
            final_value: Any = None, final_obs: Any = None, final_state: Any = None,
            **extras: Any) -> None:
        """Store one step of every env.

        Per-agent arguments are dicts ``{agent: value}`` holding the agents that acted
        (PettingZoo's ``step`` dicts); an agent left out of them did not act (in any env).
        Values are ``[*shape]`` (``[num_envs, *shape]`` with several envs).

        Args:
            obs: ``{agent: [num_envs, *obs_shape]}``: the observations the agents acted on;
                an agent with dict observations gives ``{key: [num_envs, *shape]}`` (one
                level of keys, exactly the keys its first add or ``spec`` fixed).
            action: ``{agent: [num_envs, *action_shape]}``.
            reward: ``{agent: [num_envs]}``.
            terminated: ``{agent: [num_envs]}`` bool: the agent reached a terminal state.
            truncated: ``{agent: [num_envs]}`` bool: the agent was cut off (time limit).
            value: ``{agent: [num_envs]}`` per-agent values ``V(obs)``, or one array
                ``[num_envs]`` (a centralised value per env, shared by the agents). The
                first add (or ``spec``) fixes which.
            log_prob: ``{agent: [num_envs]}`` log-probabilities of the actions.
            state: ``[num_envs, *state_shape]`` global state (``env.state()``), or None
                when the buffer stores none.
            active: ``{agent: [num_envs] bool}``: in which envs an agent in ``obs`` acted
                (default: all); its other envs' values are not stored.
            final_value: Value of the true final observation of each agent that was
                truncated (and not terminated) at this step: ``{agent: [num_envs]}``, or
                one array ``[num_envs]`` for every agent (a centralised critic); read only
                there (other entries may be NaN).
            final_obs: The true final observation of each agent truncated (and not
                terminated) at this step without a finite ``final_value``:
                ``{agent: [num_envs, *obs_shape]}`` (PettingZoo's ``step`` observation of
                that agent; ``{key: [num_envs, *shape]}`` for dict observations); read
                only there (other rows and agents are ignored). Kept
                until :meth:`compute_returns_and_advantage`, whose ``value_fn`` values
                them all in one call.
            final_state: ``[num_envs, *state_shape]``: the global state after this step
                (``env.state()`` at the truncation), given to ``value_fn`` with the final
                observations; needed with ``final_obs`` when the buffer stores a state.
            **extras: Per-agent extras ``{agent: value}`` or joint extras
                ``[num_envs, ...]``.

        Raises:
            ArgumentError: A positional value, a missing argument, a bad dict, an unknown
                agent, an agent in ``obs`` missing from another dict, a reserved name, no
                agent acting.
            CapacityError: The rollout is full.
            SpecError: ``value`` per agent where the buffer stores one per env (or the
                reverse), a missing or unknown state or extra, an agent whose shapes are
                unknown at the first add, a dict observation (or final observation) with
                missing or unknown keys or nested dicts, a dict where the agent observes
                one array or the reverse.
            ShapeError, DtypeError: A value of the wrong shape or dtype, or a truncated
                agent with neither a finite final value nor a final observation.
            DtypeError: A ``value`` of an agent that acted (a centralised value: of an env
                where some agent acted) is NaN or infinite (GAE reads it), or a
                ``final_value`` read (truncated, not terminated) is infinite.

        A rejected call leaves the buffer exactly as it was.
        """
        if args:
            raise ArgumentError(
                f"add() takes keyword arguments only, got {len(args)} positional value(s) "
                f"({', '.join(describe(a) for a in args[:3])}); pass add(obs={{agent: ...}}, "
                "action=..., reward=..., terminated=..., truncated=..., value=..., "
                "log_prob=...)")
        given = {"obs": obs, "action": action, "reward": reward, "terminated": terminated,
                 "truncated": truncated, "value": value, "log_prob": log_prob}
        missing = [n for n, v in given.items() if v is UNSET]
        if missing:
            raise ArgumentError(f"add(): missing {', '.join(missing)}; every step takes "
                                f"{', '.join(given)} (dicts {{agent: value}}; value may be "
                                "one array [num_envs] for a centralised critic)")
        layout, fields, row = self._checked_row(given, state, active, extras)
        fv, need = self._final_values(row, final_value, final_obs)
        kept = self._kept_final(layout, need, final_obs, final_state)
        # ---- every check passed: write
        if self._layout is None:
            self._allocate(layout, fields)
        t = self._pos
        for name, arr in row.items():
            self._data[name][t] = arr
        self._final_value[t] = fv
        if kept is not None:
            self._final_obs.append(t, need, *kept)
        self._pos += 1
        self._adv = self._ret = None

    @one_thread_call("check_step")
    def check_step(self, /, *, obs: Any, action: Any, value: Any, log_prob: Any,
                   state: Any = None, active: Any = None, call: str = "check_step",
                   **extras: Any) -> None:
        """Raise what :meth:`add` would raise for the policy's outputs of a step whose
        outcome is not known yet; nothing changes.

        A collector calls it with the policy's outputs before ``env.step``, so that a
        value the buffer refuses (an action its field cannot hold, a NaN value, a
        log-probability of the wrong shape) leaves the envs as they were. It runs
        :meth:`add`'s own checks of what the policy added: the call's form (its dicts and
        agents, the value form, the extras, whether a state is given), ``active``, and
        the casts of the actions, values, log-probabilities and extras with the finite
        value rule. The observations and the state come from the env and are not cast
        here: :meth:`add` checks them with the step (an env that returns a bad observation
        loses that step, not the policy's turn). Before the first add they only give the
        layout the first add would fix (values and log-probabilities in the form of
        ``log_prob``: per env, or one scalar per agent for a single env), so its checks
        apply already.

        Args:
            obs: As :meth:`add`: its agents are the acting ones (its values are read
                only before the first add, for the layout).
            action: As :meth:`add` (the policy's actions).
            value: As :meth:`add` (the critic's values).
            log_prob: As :meth:`add` (the actions' log-probabilities).
            state: As :meth:`add` (whether it is given is checked; its value is read
                only before the first add).
            active: As :meth:`add`.
            call: The call the errors name (``check_step``; a collector passes its own,
                ``"collect"``, so that its user reads the call they made, not ``add``).
            **extras: As :meth:`add` (extras the policy returns).

        Raises:
            ArgumentError, CapacityError, SpecError, ShapeError, DtypeError: As
                :meth:`add`, for the policy's outputs and the call's form (not those
                about the observations' or the state's values, ``reward``,
                ``terminated``, ``truncated`` or the final values).

        Example:
            >>> buf = MultiAgentRolloutBuffer(4, agents=["a"], num_envs=2, seed=0)
            >>> two = lambda x: np.full(2, x)
            >>> buf.check_step(obs={"a": np.zeros((2, 3))}, action={"a": two(0)},
            ...                value={"a": np.array([0.5, np.nan])}, log_prob={"a": two(0.0)})
            Traceback (most recent call last):
            ...
            replaybank.errors.DtypeError: check_step(value={'a': array([0.5, nan])}): the values [nan] of agent 'a' in envs [1] are NaN or infinite; GAE reads the value of every step an agent acted: pass finite values, e.g. critic(obs)
            >>> len(buf), buf.layout is None
            (0, True)
        """  # noqa: E501
        given = {"obs": obs, "action": action, "value": value, "log_prob": log_prob}
        self._check_room(call)
        acting = self._check_dicts(given, active, extras, call)
        layout, fields = self._step_layout(given, state, extras, acting)
        self._check_fields(layout, value, state, extras, call)
        cast = self._policy_values(layout, fields, acting, {**given, **extras}, active, call)
        _check_values(cast, layout, acting, value, call)

    def _step_layout(self, given: Mapping[str, Any], state: Any, extras: Mapping[str, Any],
                     acting: tuple[str, ...]) -> tuple[AgentLayout, Spec]:
        """The layout and stored fields: the buffer's, or before the first add the ones an
        add of this step would fix (``given``: its ``obs``, ``action``, ``value`` and
        ``log_prob``, whose form, per env or one scalar per agent for a single env, gives
        the values' leading dims)."""
        layout, fields = self._layout, self._fields
        if layout is not None and fields is not None:
            return layout, fields
        lead = () if self._num_envs == 1 and np.ndim(given["log_prob"][acting[0]]) == 0 \
            else (self._num_envs,)
        return self._first_layout(given, state, extras, None, lead)

    @one_thread_call("check_obs")
    def check_obs(self, obs: Any, state: Any = None, *, step: Mapping[str, Any] | None = None,
                  call: str = "check_obs") -> None:
        """Raise what :meth:`add` would raise for observations and a global state from
        the env; nothing changes.

        The env's part of a step, as :meth:`check_step` is the policy's: a collector calls
        it with each observation as it arrives (from ``reset``, and from ``env.step``
        before the step is added: the next step's observations, or a truncated agent's
        final observation), so that an observation the buffer refuses is named as the
        env's and is never the one a stored step must bootstrap from (the collector loses
        that env's step and resets it). The fields are fixed by the first add; before it,
        ``step`` says which (the policy's part of the step whose add will fix them, as
        :meth:`check_step` takes it), and without ``step`` only what the values alone
        say is checked: a value whose field ``spec=`` does not give, and that no field
        can hold (text, bytes, objects: the first add's inference refuses it).

        Args:
            obs: As :meth:`add`: ``{agent: [num_envs, *obs_shape]}`` of the agents
                observed (``{key: [num_envs, *shape]}`` for dict observations).
            state: As :meth:`add`: ``[num_envs, *state_shape]``, or None when the buffer
                stores no state.
            step: Before the first add: :meth:`check_step`'s keyword arguments of the
                step whose add fixes the fields (``obs``, ``action``, ``value``,
                ``log_prob``, ``state`` and the extras; checked by :meth:`check_step`
                first). Ignored once the fields are known.
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
            >>> buf = MultiAgentRolloutBuffer(4, agents=["a"], seed=0)
            >>> step = dict(action={"a": 0}, reward={"a": 1.0}, terminated={"a": False},
            ...             truncated={"a": False}, value={"a": 0.0}, log_prob={"a": 0.0})
            >>> buf.add(obs={"a": np.zeros(3, np.float32)}, **step)
            >>> buf.check_obs({"a": np.zeros(4, np.float32)})  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            replaybank.errors.ShapeError: obs['a']=array(shape=(4,), dtype=float32): expected shape (3,) ...
            >>> buf.check_obs({"a": {"x": np.zeros(3)}})  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            replaybank.errors.SpecError: check_obs(obs['a']={'x': ...}): agent 'a' observes one array ...
            >>> len(buf)
            1
        """  # noqa: E501
        layout = self._layout
        if layout is None and step is not None:
            given = {k: step[k] for k in ("obs", "action", "value", "log_prob")}
            extras = {k: v for k, v in step.items() if k not in (*given, STATE, "active")}
            layout, _ = self._step_layout(given, step.get(STATE), extras,
                                          tuple(a for a in self._agents if a in given["obs"]))
        check_obs_values("MultiAgentRolloutBuffer", self._agents, self._num_envs, layout,
                         self._spec_arg, obs, state, call)

    def _checked_row(self, given: Mapping[str, Any], state: Any, active: Any,
                     extras: Mapping[str, Any]) -> tuple[AgentLayout, Spec,
                                                         dict[str, AnyArray]]:
        """:meth:`add`'s checks of one step's values: the layout (the buffer's, or the
        one its first add fixes), the stored fields and the step's row
        (:meth:`_row`); nothing changes."""
        self._check_room()
        acting = self._check_dicts(given, active, extras)
        layout, fields = self._layout, self._fields
        if layout is None or fields is None:
            # with one env, a reward (a scalar per env) tells whether values carry the env dim
            reward = given["reward"]
            lead = (self._num_envs,) if self._num_envs > 1 or np.ndim(
                reward[acting[0]]) == 1 else ()
            layout, fields = self._first_layout(given, state, extras, reward, lead)
        self._check_fields(layout, given["value"], state, extras)
        row = self._row(layout, fields, acting, given, state, active, extras)
        _check_values(row, layout, acting, given["value"])
        return layout, fields, row

    def _check_room(self, call: str = "add") -> None:
        """Refuse a step when the rollout is full (``call``: the call the user made)."""
        if self._pos >= self._n_steps:
            raise CapacityError(
                f"{call}: the rollout is full ({self._n_steps} steps x {self._num_envs} envs); "
                "call compute_returns_and_advantage(...), use the batches, then reset()")

    def _first_layout(self, given: Mapping[str, Any], state: Any,
                      extras: Mapping[str, Any], reward: Mapping[str, Any] | None,
                      lead: tuple[int, ...]) -> tuple[AgentLayout, Spec]:
        """The layout and fields the first add fixes from its values (``obs``,
        ``action``, ``log_prob``, ``value``, ``state``, extras; ``reward`` for the
        rewards' dtype, None: the value dtype), with the values' leading dims ``lead``."""
        values = {"obs": given["obs"], "action": given["action"],
                  "log_prob": given["log_prob"], "value": given["value"], STATE: state,
                  **extras}
        try:
            return self._checked_layout(
                AgentLayout.build(self._agents, self._spec_arg, values, lead,
                                  dict_obs=True, owner="MultiAgentRolloutBuffer",
                                  scalars=_SCALARS), reward, lead)
        except ReplayBankError as exc:
            raise _renamed(exc) from None

    @one_thread_call("check_first_add")
    def check_first_add(
        self,
        agents: Collection[str],
        per_agent: Collection[str] = ("obs", "action", "log_prob", "value"),
        call: str = "check_first_add",
    ) -> None:
        """Refuse now the first add that would hold only ``agents``, when it would leave
        the shapes of an agent not in it unknown (``spec=`` does not give them).

        A collector calls this before it steps its envs, so that an agent joining late
        is refused before anything happened. Nothing to check once the fields are
        known (after the first add, or with a ``spec`` that gives every agent's).

        Args:
            agents: The agents of the first add.
            per_agent: Its per-agent arguments (``obs``, ``action``, ``log_prob``,
                ``value`` unless it is centralised, and per-agent extras).
            call: The call the error names (``check_first_add``; a collector passes its
                own, ``"collect"``, as to :meth:`check_step` and :meth:`check_obs`).

        Raises:
            SpecError: The error that add would raise, naming the ``spec=`` entries to
                add.

        Example:
            >>> buf = MultiAgentRolloutBuffer(4, ["a", "c"], spec={
            ...     "obs": {"c": ((2,), "float32")}, "action": {"c": ((), "int64")}})
            >>> buf.check_first_add(["a"])  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            replaybank.errors.SpecError: check_first_add(log_prob=..., value=...): agent 'c' is not in the first add ... spec={..., 'log_prob': {'c': ((), 'float32')}, 'value': {'c': ((), 'float32')}}) ...
        """  # noqa: E501
        if self._layout is not None:
            return
        if "value" in parse_spec(self._spec_arg, self._agents):  # centralised
            per_agent = [name for name in per_agent if name != "value"]
        missing = unknown_fields(self._agents, self._spec_arg,
                                 {name: tuple(agents) for name in per_agent})
        if missing:
            raise missing_spec_error("MultiAgentRolloutBuffer", missing, _SCALARS, call)

    def _check_dicts(self, given: Mapping[str, Any], active: Any,
                     extras: Mapping[str, Any], call: str = "add") -> tuple[str, ...]:
        """The agents of the dict arguments in ``given`` (``obs`` first: its agents act);
        return the acting agents (in the buffer's order)."""
        dicts = {name: given[name] for name in _DICT_ARGS if name in given}
        if isinstance(given["value"], Mapping):
            dicts["value"] = given["value"]
        acting = check_agent_dicts("MultiAgentRolloutBuffer", self._agents, dicts, active,
                                   extras, _RESERVED, call)
        check_action_tuples(given["action"], self._layout)
        return acting

    def _check_fields(self, layout: AgentLayout, value: Any, state: Any,
                      extras: Mapping[str, Any], call: str = "add") -> None:
        """The call passes values in the buffer's form and exactly its state and extras."""
        per_agent = "value" in layout.per_agent
        if isinstance(value, Mapping) != per_agent:
            raise SpecError(
                f"{call}(value={describe(value)}): this buffer stores "
                + ("one value per agent (value={agent: [num_envs]}); pass a dict"
                   if per_agent else "one centralised value per env (value=[num_envs]); "
                   "pass one array")
                + " as its first add (or spec) did, or build a new buffer")
        check_state_given(layout, state, call)
        want = {*layout.extras, *layout.joint} - {"log_prob", "value"}
        got = set(extras)
        if want != got:
            raise SpecError(
                f"{call}(...): extras {sorted(got)} do not match this buffer's extras "
                f"{sorted(want)} (fixed by the first add and spec=); pass exactly those")
        for name in want:
            if isinstance(extras[name], Mapping) != (name in layout.per_agent):
                raise SpecError(
                    f"{call}({name}=...): {name!r} is a "
                    + ("per-agent extra: pass {agent: value}" if name in layout.per_agent
                       else "joint extra: pass one array [num_envs, ...], not a dict"))

    def _row(self, layout: AgentLayout, fields: Spec, acting: tuple[str, ...],
             given: Mapping[str, Any], state: Any, active: Any,
             extras: Mapping[str, Any]) -> dict[str, AnyArray]:
        """Every stored field's ``[num_envs, *shape]`` value of this step (zeros where an
        agent did not act): the policy's (:meth:`_policy_values`), then the observations,
        the outcomes and the state."""
        n_env = self._num_envs
        row = {name: np.zeros((n_env, *f.shape), f.dtype) for name, f in fields.items()}
        policy = self._policy_values(layout, fields, acting, {**given, **extras}, active)
        for a in acting:
            mask = row[f"active{SEP}{a}"] = policy[f"active{SEP}{a}"]
            got_obs: dict[str, AnyArray] = {}  # {leaf: [num_envs, *shape]}
            cast_obs(layout, a, "obs", given["obs"][a], n_env, got_obs)
            # {stored name: [num_envs, *shape]}: every observation leaf, then the others
            got_fields = {layout.per_agent["obs"][leaf].name: v for leaf, v in got_obs.items()}
            for top in layout.per_agent:
                if top != "obs":
                    for f in layout.leaves(top, a).values():  # (an action's parts)
                        got_fields[f.name] = policy[f.name]
            for name, got in got_fields.items():
                row[name] = np.where(mask.reshape((n_env,) + (1,) * (got.ndim - 1)), got,
                                     np.zeros((), got.dtype))
            for prefix in ("reward", "terminated", "truncated"):
                name = f"{prefix}{SEP}{a}"
                got = cast_value(fields[name], f"{prefix}[{a!r}]", given[prefix][a], n_env)
                row[name] = np.where(mask, got, np.zeros((), got.dtype))
        if layout.state is not None:
            row[STATE] = cast_value(fields[STATE], "state", state, n_env)
        for name in layout.joint:
            row[name] = policy[name]
        return row

    def _policy_values(self, layout: AgentLayout, fields: Spec, acting: tuple[str, ...],
                       source: Mapping[str, Any], active: Any,
                       call: str = "add") -> dict[str, AnyArray]:
        """The policy's part of a step, checked and cast by the layout's fields: what is
        known before ``env.step`` besides the observations and the state.

        Args:
            layout: The buffer's layout (or the one the first add fixes).
            fields: Its stored fields (the ``active/<agent>`` flags' and the joint
                fields').
            acting: The acting agents (in the buffer's order).
            source: ``add``'s values by argument name: ``action``, ``log_prob``,
                ``value`` and the extras (``{agent: [num_envs, *shape]}``, or
                ``[num_envs, *shape]`` for a centralised value and joint extras).
            active: ``add``'s ``active`` (``{agent: bool or bool[num_envs]}``) or None.
            call: The call the user made, for messages (``"add"``, ``"check_step"``).

        Returns:
            ``{stored name: [num_envs, *shape]}``: ``active/<agent>`` and every per-agent
            field but the observations of each acting agent (not masked by ``active``),
            and the joint fields.

        Raises:
            ShapeError, DtypeError: A value of the wrong shape or dtype.
            ArgumentError: A dict where an array is expected, or no agent acting in any
                env.
        """
        n_env = self._num_envs
        active = active or {}
        out: dict[str, AnyArray] = {}
        for a in acting:
            out[f"active{SEP}{a}"] = np.ones(n_env, np.bool_) if a not in active else \
                cast_value(fields[f"active{SEP}{a}"], f"active[{a!r}]", active[a], n_env,
                           call)
            for top, per in layout.per_agent.items():
                if top == "action":  # one array, or its parts (a Tuple action's)
                    parts: dict[str, AnyArray] = {}
                    cast_leaves(layout, top, a, top, source[top][a], n_env, parts, call)
                    out.update((per[leaf].name, v) for leaf, v in parts.items())
                elif top != "obs":
                    out[per[a].name] = cast_value(per[a], f"{top}[{a!r}]", source[top][a],
                                                  n_env, call)
        for name in layout.joint:
            out[name] = cast_value(fields[name], name, source[name], n_env, call)
        if not any(out[f"active{SEP}{a}"].any() for a in acting):
            raise ArgumentError(f"{call}(active=...): no agent acted in any env; pass the step "
                                "of at least one agent")
        return out

    def _final_values(self, row: Mapping[str, AnyArray], final_value: Any,
                      final_obs: Any) -> tuple[FloatArray, BoolArray]:
        """``[num_envs, n_agents]`` final values where an agent was truncated (NaN
        elsewhere), and where a final observation must stand in for a missing one
        (``[num_envs, n_agents]`` bool; an error when ``final_obs`` is None)."""
        agents = self._agents
        cut = np.stack([row[f"truncated{SEP}{a}"] & ~row[f"terminated{SEP}{a}"]
                        for a in agents], axis=1)  # [E, n]
        fv = self._per_agent_floats("add", "final_value", final_value)  # [E, n]
        inf = cut & np.isinf(fv)  # [E, n]: NaN there means "none given"; inf is refused
        if inf.any():
            i = int(np.argwhere(inf)[0][1])
            envs = np.flatnonzero(inf[:, i]).tolist()
            raise DtypeError(
                f"add(final_value={describe(final_value)}): agent {agents[i]!r} was "
                f"truncated in envs {envs}, where its final values "
                f"{fv[envs, i].tolist()} are infinite; pass a finite V(final obs) (or NaN "
                "there with final_obs= and a value_fn to compute_returns_and_advantage)")
        need = cut & ~np.isfinite(fv)  # [E, n]
        if need.any() and final_obs is None:
            i = int(np.argwhere(need)[0][1])
            envs = np.flatnonzero(need[:, i]).tolist()
            raise ShapeError(
                f"add(final_value={describe(final_value)}, final_obs=None): agent "
                f"{agents[i]!r} was truncated in envs {envs} but has no final value there "
                "(None or NaN); a truncated step bootstraps from the value of its true final "
                f"observation: pass final_value={{{agents[i]!r}: V(final obs)}} (or one "
                "array [num_envs] for a centralised critic), or final_obs={agent: final "
                "obs} and a value_fn to compute_returns_and_advantage, or mark the step "
                "terminated")
        out: FloatArray = np.where(cut, fv, np.nan)
        return out, need

    def _kept_final(self, layout: AgentLayout, need: BoolArray, final_obs: Any,
                    final_state: Any) -> tuple[dict[str, AnyArray], AnyArray | None] | None:
        """The checked final observations of the agents in ``need`` and the final states.

        Args:
            layout: The buffer's layout.
            need: ``[num_envs, n_agents]`` bool: where a final observation is needed.
            final_obs: ``add``'s ``final_obs`` (``{agent: [num_envs, *obs_shape]}``, a dict
                ``{key: [num_envs, *shape]}`` per agent with dict observations), or None.
            final_state: ``add``'s ``final_state`` ``[num_envs, *state_shape]``, or None.

        Returns:
            ``({leaf: [num_envs, *shape]}, final states [num_envs, *state_shape] or None)``
            per observation leaf of the agents in ``need`` (``<agent>``, or
            ``<agent>/<key>`` per key); None when nothing is kept.

        Raises:
            ArgumentError: ``final_obs`` is not a dict, or names an unknown agent.
            SpecError: A final state the buffer does not store, or one it needs; a dict
                final observation of other keys than the agent's observations.
            ShapeError, DtypeError: A missing final observation, or a wrong shape or
                dtype.
        """
        n_env, agents = self._num_envs, self._agents
        if final_state is not None and layout.state is None:
            raise SpecError(
                f"add(final_state={describe(final_state)}): this buffer stores no global "
                "state (its first add and spec had none), so value_fn gets state=None; "
                "leave final_state out, or build a new buffer with spec={'state': (shape, "
                "dtype)}")
        if final_obs is None:
            return None
        if not isinstance(final_obs, Mapping):
            raise ArgumentError(
                f"add(final_obs={describe(final_obs)}): expected a dict {{agent: [num_envs, "
                "*obs_shape]}} of the truncated agents' final observations (PettingZoo's "
                "step observations of those agents)")
        unknown = [a for a in final_obs if a not in agents]
        if unknown:
            raise ArgumentError(f"add(final_obs=...): unknown agent(s) {unknown}; this "
                                f"buffer's agents are {list(agents)}")
        if not need.any():
            return None
        rows: dict[str, AnyArray] = {}
        for i, a in enumerate(agents):
            if not need[:, i].any():
                continue
            if a not in final_obs or final_obs[a] is None:
                envs = np.flatnonzero(need[:, i]).tolist()
                raise ShapeError(
                    f"add(final_obs={describe(final_obs)}): agent {a!r} was truncated in "
                    f"envs {envs} without a final value, but final_obs has no observation "
                    f"for it; pass final_obs={{{a!r}: its step observation [num_envs, "
                    "*obs_shape]}, or final_value=")
            cast_obs(layout, a, "final_obs", final_obs[a], n_env, rows)
        state_rows = None
        if layout.state is not None:
            if final_state is None:
                envs = np.flatnonzero(need.any(axis=1)).tolist()
                raise SpecError(
                    "add(final_obs=..., final_state=None): this buffer stores the global "
                    f"state, and value_fn(obs, state) values the final observations of "
                    f"envs {envs} with the state after the step; pass final_state="
                    "env.state() after the step ([num_envs, *state_shape])")
            state_rows = cast_value(layout.state, "final_state", final_state, n_env)
        return rows, state_rows

    def _per_agent_floats(self, call: str, arg: str, value: Any) -> FloatArray:
        """``value`` (None, ``{agent: [num_envs]}`` or ``[num_envs]`` for all agents) as
        ``[num_envs, n_agents]`` float64, NaN where not given."""
        out = np.full((self._num_envs, len(self._agents)), np.nan)
        if value is None:
            return out
        if isinstance(value, Mapping):
            unknown = [a for a in value if a not in self._agents]
            if unknown:
                raise ArgumentError(f"{call}({arg}=...): unknown agent(s) {unknown}; this "
                                    f"buffer's agents are {list(self._agents)}")
            for i, a in enumerate(self._agents):
                if a in value:
                    out[:, i] = per_env_float(f"{call}({arg}[{a!r}]", value[a],
                                              self._num_envs)
            return out
        out[:] = per_env_float(f"{call}({arg}", value, self._num_envs)[:, None]
        return out

    def _check_last_values(self, last_values: Any, last: FloatArray, need: BoolArray) -> None:
        """Raise unless every needed entry of ``last_values`` was given and is finite.

        Args:
            last_values: The caller's argument (None, ``{agent: [num_envs]}``, or one
                ``[num_envs]`` array for every agent).
            last: ``[n_agents, num_envs]`` float64 (:meth:`_per_agent_floats`: NaN where
                not given).
            need: ``[n_agents, num_envs]`` bool: the agent's last active step there did
                not end its episode, so its advantages bootstrap from that entry.

        Raises:
            ShapeError: A needed agent's entry was left out (``last_values`` None, or a
                dict without the agent): a missing input, as a truncated step's missing
                final value at ``add``.
            DtypeError: A needed entry was given but is NaN or infinite: a value
                problem, as a non-finite ``last_values`` of :class:`RolloutBuffer` or a
                non-finite value from ``value_fn`` (NaN marks an entry not given, which
                only an agent or env that needs none may be).
        """
        bad = need & ~np.isfinite(last)  # [n, E]
        if not bad.any():
            return
        call = f"compute_returns_and_advantage(last_values={describe(last_values)})"
        i = int(np.argwhere(bad)[0][0])
        a, envs = self._agents[i], np.flatnonzero(bad[i])  # the first agent's bad envs
        env = int(envs[0])
        still = (f"agent {a!r} is still in its episode after its last step in env(s) "
                 f"{envs.tolist()}, so its advantages bootstrap from ")
        fix = (f"pass {{{a!r}: V of its observation after its last step}} (e.g. "
               "critic(next_obs), one value per env; NaN only where an env needs none), or "
               "one array [num_envs] for every agent (a centralised critic)")
        if last_values is None or (isinstance(last_values, Mapping) and a not in last_values):
            left = "last_values=None" if last_values is None else \
                f"last_values has no entry for {a!r} (given: {list(last_values)})"
            raise ShapeError(f"{call}: {still}last_values[{a!r}][{env}], which is missing: "
                             f"{left}; {fix}")
        entry = f"last_values[{a!r}][{env}]" if isinstance(last_values, Mapping) else \
            f"last_values[{env}] (one array for every agent)"
        raise DtypeError(
            f"{call}: {still}{entry}, which is {float(last[i, env])}, not finite (its "
            f"values there: {last[i, envs].tolist()}; NaN marks a value not given, allowed "
            f"only where none is needed); {fix}")

    def _open(self) -> tuple[BoolArray, npt.NDArray[np.int64]]:
        """``[num_envs, n_agents]``: whether each agent's last stored active step in each
        env did not end its episode (it is still running), and that step (0 where none)."""
        p, n_env = self._pos, self._num_envs
        running = np.zeros((n_env, len(self._agents)), np.bool_)
        last = np.zeros((n_env, len(self._agents)), np.int64)
        if p == 0 or self._layout is None:
            return running, last
        d, envs = self._data, np.arange(n_env)
        for i, a in enumerate(self._agents):
            act = d[f"active{SEP}{a}"][:p]  # [p, E]
            end = d[f"terminated{SEP}{a}"][:p] | d[f"truncated{SEP}{a}"][:p]  # [p, E]
            last[:, i] = p - 1 - np.argmax(act[::-1], axis=0)  # [E]
            running[:, i] = act.any(axis=0) & ~end[last[:, i], envs]
        return running, last

    @one_thread_call("running_agents")
    def running_agents(self, env_id: int = 0) -> tuple[str, ...]:
        """The agents whose episode in env ``env_id`` is still running: their last stored
        active step there did not end it (they bootstrap from ``last_values``, or from
        the final observation :meth:`end_episodes` is given).

        Raises:
            ArgumentError: ``env_id`` is not an env index of this buffer.
        """
        lane = int(env_lanes("running_agents", env_id, self._num_envs)[0])
        running, _ = self._open()
        return tuple(a for i, a in enumerate(self._agents) if running[lane, i])

    @one_thread_call("end_episodes")
    def end_episodes(self, env_ids: Any = None, final_obs: Any = None,
                     final_state: Any = None, final_value: Any = None) -> None:
        """End the running episodes of ``env_ids`` after their last stored step, cut
        short as by a time limit: the env was reset while they ran (a collector's
        ``reset()``, or ``rb.collect`` ending with the rollout not full), so they must not
        be chained to the env's next episode.

        Every agent whose last stored active step in those envs did not end its episode
        is marked ``truncated`` at that step and bootstraps from the value of its
        observation after it, as a truncated step of :meth:`add` does: ``final_value``,
        else ``final_obs`` (with ``final_state``), valued by ``value_fn`` in
        :meth:`compute_returns_and_advantage`. An env or agent with nothing running is
        left as it is; advantages computed before must be computed again.

        Args:
            env_ids: The envs (an int or a list of ints), or None for every env.
            final_obs: ``{agent: [num_envs, *obs_shape]}`` (``{key: [num_envs,
                *shape]}`` for dict observations), as :meth:`add` takes it: each
                running agent's observation after its last stored step; read only in
                the rows of ``env_ids`` and for the running agents.
            final_state: ``[num_envs, *state_shape]``: the global state there (needed
                with ``final_obs`` when the buffer stores a state).
            final_value: ``{agent: [num_envs]}`` or ``[num_envs]``: the values of those
                observations, instead of ``final_obs``.

        Raises:
            ArgumentError: Bad ``env_ids``, or a ``final_obs`` that is not a dict or
                names an unknown agent.
            ShapeError, DtypeError: A running agent with neither a finite final value
                nor a final observation, or a value of the wrong shape or dtype.
            SpecError: As for ``add``'s ``final_obs`` and ``final_state``.

        A rejected call leaves the buffer exactly as it was.

        Example:
            >>> import numpy as np
            >>> buf = MultiAgentRolloutBuffer(2, ["a"], gamma=1.0, gae_lambda=1.0,
            ...                               normalize_advantage=None, seed=0)
            >>> step = dict(action={"a": 0}, reward={"a": 1.0}, terminated={"a": False},
            ...             truncated={"a": False}, value={"a": 0.0}, log_prob={"a": 0.0})
            >>> buf.add(obs={"a": np.float32([0.0])}, **step)
            >>> buf.end_episodes(final_value={"a": 10.0})   # the env was reset here
            >>> buf.add(obs={"a": np.float32([5.0])}, **step)
            >>> buf.compute_returns_and_advantage(last_values={"a": 0.0})
            >>> buf.returns["a"][:, 0].tolist()              # 1 + 10, not 1 + 1 + 0
            [11.0, 1.0]
        """
        call = "end_episodes"
        lanes = env_lanes(call, env_ids, self._num_envs)
        running, last = self._open()
        chosen = np.zeros(self._num_envs, np.bool_)
        chosen[lanes] = True
        cut = running & chosen[:, None]  # [E, n]
        if not cut.any():
            return
        layout = self._layout
        assert layout is not None  # something runs: steps were added
        fv = self._per_agent_floats(call, "final_value", final_value)  # [E, n]
        if (cut & np.isinf(fv)).any():
            i = int(np.argwhere(cut & np.isinf(fv))[0][1])
            raise DtypeError(f"{call}(final_value={describe(final_value)}): the final value "
                             f"of agent {self._agents[i]!r} is infinite; pass a finite "
                             "V(observation after its last step), or final_obs=")
        need = cut & ~np.isfinite(fv)  # [E, n]: valued from final_obs later
        if need.any() and final_obs is None:
            i = int(np.argwhere(need)[0][1])
            envs = np.flatnonzero(need[:, i]).tolist()
            raise ShapeError(
                f"{call}(final_obs=None, final_value={describe(final_value)}): agent "
                f"{self._agents[i]!r} is still running in envs {envs}; its cut episode "
                "bootstraps from the value of its observation after its last stored step: "
                f"pass final_obs={{{self._agents[i]!r}: that observation [num_envs, "
                "*obs_shape]}} (and final_state= when the buffer stores a state), or "
                "final_value=")
        try:
            kept = self._kept_final(layout, need, final_obs, final_state)
        except ReplayBankError as exc:
            raise type(exc)(str(exc).replace("add(", f"{call}(")) from None
        # ---- every check passed: write
        for e, i in np.argwhere(cut).tolist():
            t = int(last[e, i])
            self._data[f"truncated{SEP}{self._agents[i]}"][t, e] = True
            self._final_value[t, e, i] = fv[e, i] if np.isfinite(fv[e, i]) else np.nan
        if kept is not None:
            for t in np.unique(last[need]).tolist():
                self._final_obs.append(int(t), need & (last == t), *kept)
        self._adv = self._ret = None

    @one_thread_call("reset")
    def reset(self) -> None:
        """Start a new rollout (storage stays allocated; the layout is kept)."""
        self._pos = 0
        self._final_value[:] = np.nan
        self._final_obs.clear()
        self._adv = self._ret = None

    # ------------------------------------------------------------------ GAE
    @one_thread_call("compute_returns_and_advantage")
    def compute_returns_and_advantage(self, last_values: Any, dones: Any = None,
                                      value_fn: ValueFn | None = None) -> None:
        """Per-agent GAE over each agent's active steps in each env (see the module doc).

        Args:
            last_values: Value of the observation after each agent's last stored step:
                ``{agent: [num_envs]}`` (agents or envs that do not need one, because the
                agent's last active step there ended its episode or it never acted, may be
                left out or NaN), or one array ``[num_envs]`` for every agent (a
                centralised critic). A scalar with one env.
            dones: Optional check, SB3-style: ``{agent: [num_envs]}`` or ``[num_envs]``
                bool, True where the caller's last step ended the agent's episode. The
                stored ends decide; a True where the agent's last stored active step did
                not end is an error (a forgotten ``terminated``/``truncated``).
            value_fn: ``value_fn(obs, state) -> values``, called once (when ``add`` kept
                final observations, else not at all) with every kept final observation:
                ``obs`` ``{agent: [K, *obs_shape]}`` (one row per (step, env) that kept
                one; zeros where that agent was not truncated; ``{agent: {key: [K,
                *shape]}}`` for dict observations), ``state`` ``[K,
                *state_shape]`` (the ``final_state`` rows) or None when the buffer stores
                no state. Returns ``{agent: [K]}`` (per-agent values) or ``[K]`` (a
                centralised value), as the buffer stores values; numpy or torch.

        Raises:
            EmptyBufferError: Nothing stored.
            ArgumentError: An unknown agent, or a ``value_fn`` that is not callable.
            DtypeError: Non-numeric values, or a needed value (a given ``last_values``
                entry, or one from ``value_fn``) that is NaN or infinite, as
                :class:`RolloutBuffer` (NaN marks an entry not given, which only an agent
                or env that needs none may be).
            ShapeError: A wrong shape, a needed agent left out of ``last_values`` (or
                ``last_values=None``), ``dones`` disagreeing with the stored ends,
                final observations kept but ``value_fn`` None, or ``value_fn`` returning
                the wrong form or shape.

        A rejected call changes nothing (advantages computed before stay).

        Example:
            >>> import numpy as np
            >>> buf = MultiAgentRolloutBuffer(1, ["a", "b"], gamma=0.5, seed=0)
            >>> buf.add(obs={"a": np.float32([2.0]), "b": np.float32([3.0])},
            ...         action={"a": 0, "b": 0}, reward={"a": 1.0, "b": 1.0},
            ...         terminated={"a": False, "b": False}, truncated={"a": True, "b": True},
            ...         value={"a": 0.0, "b": 0.0}, log_prob={"a": 0.0, "b": 0.0},
            ...         final_obs={"a": np.float32([4.0]), "b": np.float32([6.0])})
            >>> critic = lambda obs, state: {k: o[:, 0] for k, o in obs.items()}  # V = obs
            >>> buf.compute_returns_and_advantage(last_values=None, value_fn=critic)
            >>> buf.advantages["a"][0].tolist(), buf.advantages["b"][0].tolist()
            ([3.0], [4.0])
        """
        if self._pos == 0 or self._layout is None:
            raise EmptyBufferError("compute_returns_and_advantage: the buffer is empty; "
                                   "add steps first")
        if value_fn is not None and not callable(value_fn):
            raise ArgumentError(
                f"compute_returns_and_advantage(value_fn={describe(value_fn)}): expected a "
                "callable value_fn(obs, state) -> values, or None")
        p, n_env, agents = self._pos, self._num_envs, self._agents
        last = self._per_agent_floats("compute_returns_and_advantage", "last_values",
                                      last_values).T  # [n, E]
        d = self.data

        def lanes(prefix: str) -> AnyArray:  # [p, n * E]: column i * E + env
            return np.stack([d[f"{prefix}{SEP}{a}"] for a in agents], axis=1).reshape(
                p, len(agents) * n_env)

        act, term, trunc = lanes("active"), lanes("terminated"), lanes("truncated")
        need = needs_last_value(act, term, trunc).reshape(len(agents), n_env)  # [n, E]
        if dones is not None:
            self._check_dones(dones, act, term, trunc)
        self._check_last_values(last_values, last, need)
        central = "value" in self._layout.joint
        val = np.repeat(d["value"][:, None], len(agents), axis=1).reshape(p, -1) \
            if central else lanes("value")
        fv3 = self._final_value[:p].copy()  # [p, E, n]
        if len(self._final_obs):
            per = self._layout.per_agent["obs"]
            steps, idx, vals = self._final_obs.values(value_fn, central, per,
                                                      self._layout.state)  # [N] each
            fv3[steps // n_env, steps % n_env, idx] = vals
        fv = fv3.transpose(0, 2, 1).reshape(p, -1)  # [p, n * E]
        adv = active_gae(lanes("reward"), val, term, trunc, act, last.reshape(-1), fv,
                         gamma=self.gamma, gae_lambda=self.gae_lambda, backend=self.backend)
        adv3 = adv.reshape(p, len(agents), n_env)
        val3 = val.astype(np.float64).reshape(p, len(agents), n_env)
        act3 = act.reshape(p, len(agents), n_env)
        self._adv, self._ret = {}, {}
        for i, a in enumerate(agents):
            dtype = (d["value"] if central else d[f"value{SEP}{a}"]).dtype
            self._adv[a] = adv3[:, i].astype(dtype)
            self._ret[a] = np.where(act3[:, i], adv3[:, i] + val3[:, i], 0.0).astype(dtype)

    def _check_dones(self, dones: Any, act: AnyArray, term: AnyArray,
                     trunc: AnyArray) -> None:
        """``dones`` True only where the agent's last active step ended its episode."""
        n_env, agents = self._num_envs, self._agents
        flags = self._per_agent_floats("compute_returns_and_advantage", "dones", dones)
        said = (np.nan_to_num(flags, nan=0.0) != 0).T.reshape(-1)  # [n * E]
        open_ = needs_last_value(act, term, trunc)  # [n * E]: last active step did not end
        bad = said & open_
        if bad.any():
            c = int(np.flatnonzero(bad)[0])
            a, env = agents[c // n_env], c % n_env
            raise ShapeError(
                f"compute_returns_and_advantage(dones={describe(dones)}): dones says agent "
                f"{a!r} ended in env {env}, but its last stored step there has terminated = "
                "truncated = False; pass the step's terminated/truncated to add() (the "
                "stored ends decide the bootstrap)")

    # ------------------------------------------------------------------ batches
    @overload
    def get(self, batch_size: int | None = None, agents: Literal["together"] = "together",
            shuffle: bool = True) -> Iterator[MultiAgentRolloutBatch]: ...

    @overload
    def get(self, batch_size: int | None = None, *, agents: Literal["flatten"],
            shuffle: bool = True) -> Iterator[Batch]: ...

    def get(self, batch_size: int | None = None, agents: str = "together",
            shuffle: bool = True) -> Iterator[Any]:
        """One epoch of minibatches, every item exactly once.

        Args:
            batch_size: Items per minibatch (the last one gets the remainder); None: one
                batch of every item.
            agents: ``"together"``: an item is one (env, time) step where some agent
                acted, yielded as :class:`MultiAgentRolloutBatch` (every agent's fields
                ``[B, *shape]``, ``active[agent]`` masks, ``state``); ``"flatten"``: an
                item is one active (env, time, agent), yielded as a
                :class:`~replaybank.batch.Batch` of the agents' fields stacked
                ``[B, *shape]`` (the agents must share each field's shape and dtype; dict
                observations stack per key, ``obs/<key>``, so ``batch.obs`` is ``{key: [B,
                *shape]}`` and the agents must share the keys), with
                ``agent`` ``[B]`` (its position in :attr:`agents`) and ``indices`` ``[B]``
                (the step ``t * num_envs + env``).
            shuffle: Draw the order from the buffer's generator (one permutation per
                call, drawn now); False: time-major order.

        Returns:
            An iterator of minibatches with ``advantages`` (normalised per
            ``normalize_advantage``) and ``returns``.

        Raises:
            EmptyBufferError: Advantages not computed for the current data.
            ConfigError: A bad ``batch_size`` or ``agents``.
            ShapeError: ``"flatten"`` with agents whose fields differ in shape or dtype,
                or whose observations differ in kind (one array or a dict) or keys.
            BufferChangedError: At a ``next()`` after the rollout changed (an ``add``,
                ``end_episodes``, ``reset``, or new advantages since the call): use the
                batches before changing the buffer.
        """
        with self.thread_check.section("get"):  # the checks and the permutation
            made = self._adv
            batches = while_current(self._epoch(batch_size, agents, shuffle), made,
                                    lambda: self._adv, "MultiAgentRolloutBuffer", "get")
            return self.thread_check.iterate("get", batches)

    def _epoch(self, batch_size: int | None, agents: str, shuffle: bool) -> Iterator[Any]:
        """:meth:`get`'s checks and order, and the iterator of its minibatches."""
        adv, ret = self._computed("get")
        if agents not in ("together", "flatten"):
            raise ConfigError(f"get(agents={agents!r}): expected 'together' (one item per "
                              "(env, time), every agent) or 'flatten' (one item per active "
                              "(env, time, agent))")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(
                batch_size, (int, np.integer)) or batch_size <= 0):
            raise ConfigError(f"get(batch_size={batch_size!r}): must be a positive int or "
                              "None (one batch of everything)")
        if not isinstance(shuffle, (bool, np.bool_)):
            raise ConfigError(f"get(shuffle={shuffle!r}): must be True or False")
        names = self._agents
        act = np.stack([self.active[a] for a in names], axis=2)  # [p, E, n]
        mode = self.normalize_advantage
        adv_out = dict(adv)
        if mode == "batch":
            stacked = np.stack([adv[a] for a in names], axis=2)
            normed = normalise(stacked, self.advantage_eps, act)
            adv_out = {a: normed[..., i] for i, a in enumerate(names)}
        if agents == "flatten":
            stacked_f, joint = self._flattened(adv_out, ret)
            items = np.flatnonzero(act.reshape(-1))  # [N] j = k * n + agent
        else:
            data = dict(self.data)
            for a in names:
                data[f"advantages{SEP}{a}"] = adv_out[a]
                data[f"returns{SEP}{a}"] = ret[a]
            items = np.flatnonzero(act.any(axis=2).reshape(-1))  # [N] k
        size = len(items) if batch_size is None else int(batch_size)
        order = self._rng.permutation(len(items)) if shuffle else np.arange(len(items))
        eps = self.advantage_eps

        def gen() -> Iterator[Any]:
            for start in range(0, len(items), size):
                chosen = items[order[start:start + size]]
                if agents == "flatten":
                    rows = flatten_rows(stacked_f, joint, chosen, len(names))
                    if mode == "minibatch":
                        rows["advantages"] = normalise(rows["advantages"], eps)
                    yield Batch.own(rows)
                    continue
                rows = together_rows(data, chosen, self._num_envs)
                if mode == "minibatch":
                    keys = [f"advantages{SEP}{a}" for a in names]
                    mask = np.stack([rows[f"active{SEP}{a}"] for a in names], axis=1)
                    normed = normalise(np.stack([rows[k] for k in keys], axis=1), eps, mask)
                    rows.update({k: normed[:, i] for i, k in enumerate(keys)})
                yield MultiAgentRolloutBatch.from_core(Batch.own(rows), names)

        return gen()

    def _flattened(self, adv: Mapping[str, AnyArray], ret: Mapping[str, AnyArray]
                   ) -> tuple[dict[str, AnyArray], dict[str, AnyArray]]:
        """Per-agent fields stacked over agents and the joint fields, flat.

        Args:
            adv: ``{agent: [pos, num_envs]}`` advantages (normalised as yielded).
            ret: ``{agent: [pos, num_envs]}`` returns.

        Returns:
            ``(stacked, joint)``: ``{name: [pos * num_envs * n_agents, *shape]}`` (row ``j
            = k * n_agents + agent``; dict observations per key, ``obs/<key>``) and
            ``{name: [pos * num_envs, *shape]}`` (row ``k``).

        Raises:
            ShapeError: The agents differ in a field's shape or dtype, or in their
                observations' kind (one array or a dict) or dict keys.
        """
        layout = self._layout
        assert layout is not None  # advantages exist, so a step was added
        names, d, p = self._agents, self.data, self._pos
        groups: dict[str, list[AnyArray]] = {}
        for top in PARTED:  # observations and actions: one array, or dicts of parts
            keys = {a: layout.keys(top, a) for a in names}  # None: one array
            if len({None if k is None else frozenset(k) for k in keys.values()}) > 1:
                # refused, not flattened here: one stacked field is for one network over
                # agents that share a space, and the buffer keeps no spaces (a Discrete
                # part is one int here, gymnasium.spaces.flatten makes it a one-hot)
                kinds_of = {a: None if k is None else list(k) for a, k in keys.items()}
                what = "observations" if top == "obs" else "actions"
                one = ""
                if None in kinds_of.values():  # parts beside one array
                    space = "observation_space" if top == "obs" else "action_space"
                    one = (f", or add every agent's {what[:-1]} as one array "
                           f"(gymnasium.spaces.flatten(env.{space}(agent), value))")
                raise ShapeError(
                    f"get(agents='flatten'): the agents' {what} differ in kind or dict "
                    f"keys {kinds_of} (None: one array); flattening stacks each {top} key "
                    "over agents, so they must share them: use get(agents='together') and "
                    f"read batch.{top}[agent] per agent, or give the agents the same "
                    f"{what[:-1]} keys{one}")
            first = keys[names[0]]
            groups.update({top: [d[f"{top}{SEP}{a}"] for a in names]} if first is None else {
                f"{top}{SEP}{k}": [d[f"{top}{SEP}{a}{SEP}{k}"] for a in names]
                for k in first})
        groups.update({top: [d[per[a].name] for a in names]
                       for top, per in layout.per_agent.items() if top not in PARTED})
        for prefix in ("reward", "terminated", "truncated"):
            groups[prefix] = [d[f"{prefix}{SEP}{a}"] for a in names]
        groups["advantages"] = [adv[a] for a in names]
        groups["returns"] = [ret[a] for a in names]
        stacked: dict[str, AnyArray] = {}
        for top, arrays in groups.items():
            kinds = {(a.shape[2:], a.dtype) for a in arrays}
            if len(kinds) > 1:
                shown = {n: (tuple(a.shape[2:]), str(a.dtype))
                         for n, a in zip(names, arrays, strict=True)}
                head, _, key = top.partition(SEP)
                read = f"batch.{head}[agent][{key!r}]" if key else f"batch.{top}[agent]"
                raise ShapeError(
                    f"get(agents='flatten'): the agents' {top} differ in shape or dtype "
                    f"{shown}; flattening stacks one field over agents, so they must share "
                    f"it: use get(agents='together') and read {read} per agent, or pad "
                    f"the agents' {top} to one shape")
            stacked[top] = np.stack(arrays, axis=2).reshape(
                (p * self._num_envs * len(names), *arrays[0].shape[2:]))
        joint = {name: d[name].reshape((p * self._num_envs, *d[name].shape[2:]))
                 for name in ([STATE] if layout.state is not None else []) + list(layout.joint)}
        return stacked, joint

    # ------------------------------------------------------------------ state
    def init_config(self) -> dict[str, Any]:
        """Constructor values (JSON-able) that rebuild this buffer empty.

        Example:
            >>> MultiAgentRolloutBuffer(8, ["a"], seed=3).init_config()["seed"]
            3
        """
        layout = self._layout
        spec = layout.user_spec() if layout is not None else (
            None if self._spec_arg is None else
            {n: f.to_json() for n, f in parse_spec(self._spec_arg, self._agents).items()})
        return {"n_steps": self._n_steps, "agents": list(self._agents),
                "num_envs": self._num_envs, "gamma": self.gamma,
                "gae_lambda": self.gae_lambda, "seed": self._seed, "spec": spec,
                "normalize_advantage": self.normalize_advantage,
                "advantage_eps": self.advantage_eps, "backend": self.backend}

    def config(self) -> BufferConfig:
        """A validated config object (pydantic) that rebuilds an equivalent empty buffer
        (the type must be registered)."""
        from replaybank.config import buffer_config

        return buffer_config(self)

    def metadata(self) -> dict[str, Any]:
        """JSON-able description: type, sizes, agents, ``pos``, stored fields."""
        return {"type": type(self).__name__, "n_steps": self._n_steps,
                "num_envs": self._num_envs, "agents": list(self._agents), "pos": self._pos,
                "layout": None if self._layout is None else self._layout.user_spec(),
                "spec": None if self._fields is None else self._fields.to_json()}

    def exclusive(self) -> AbstractContextManager[None]:
        """A block in which another thread's call on the buffer is refused
        (``ConcurrentCallError``) while this thread's calls run as usual; ``rb.save``
        holds it while it writes."""
        return self.thread_check.section("exclusive")

    @one_thread_call("save")
    def save(self, dirpath: Any, prefix: str = "buffer_") -> None:
        """Write ``<prefix>metadata.json`` and ``<prefix>state.safetensors`` atomically
        (:func:`replaybank.persist.save`; the type must be registered)."""
        persist.save(self, dirpath, prefix=prefix)

    @one_thread_call("state_dict")
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to restore this buffer exactly.

        Returns:
            ``{"metadata", "init", "rng", "arrays"}``: JSON-able metadata, constructor
            values, the generator state, and copies of the arrays (``fields/<name>``
            ``[n_steps, num_envs, *shape]``, ``final_value`` ``[n_steps, num_envs,
            n_agents]``, ``advantages/<agent>`` and ``returns/<agent>`` ``[pos,
            num_envs]`` once computed, and the kept final observations:
            ``final_obs/index/<agent>`` ``[k]`` step keys ``t * num_envs + env`` with
            ``final_obs/rows/<agent>`` ``[k, *obs_shape]``, ``final_state/index`` and
            ``final_state/rows`` when any are kept).
        """
        arrays: dict[str, Any] = {f"fields/{n}": a.copy() for n, a in self._data.items()}
        arrays["final_value"] = self._final_value.copy()
        arrays.update(self._final_obs.arrays())
        if self._adv is not None and self._ret is not None:
            for a in self._agents:
                arrays[f"advantages/{a}"] = self._adv[a].copy()
                arrays[f"returns/{a}"] = self._ret[a].copy()
        return {"metadata": self.metadata(), "init": self.init_config(),
                "rng": dict(self._rng.bit_generator.state), "arrays": arrays}

    @one_thread_call("load_state_dict")
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` exactly (copies the arrays); everything is checked
        before anything changes.

        Raises:
            CheckpointError: The state does not fit this buffer (agents, sizes, fields) or
                is damaged; the buffer is then unchanged.
        """
        fix = "pass a MultiAgentRolloutBuffer.state_dict() of a buffer built alike"
        if not isinstance(state, Mapping) or not {"metadata", "arrays", "rng"} <= set(state):
            raise CheckpointError(f"load_state_dict(state={describe(state)}): expected the "
                                  f"dict of MultiAgentRolloutBuffer.state_dict(); {fix}")
        meta, arrays = state["metadata"], state["arrays"]
        if not isinstance(meta, Mapping) or not isinstance(arrays, Mapping):
            raise CheckpointError(f"load_state_dict: metadata or arrays is not a dict; {fix}")
        for key, mine in (("agents", list(self._agents)), ("n_steps", self._n_steps),
                          ("num_envs", self._num_envs)):
            if meta.get(key) != mine:
                raise CheckpointError(f"load_state_dict: the state's {key}="
                                      f"{describe(meta.get(key))} differs from this buffer's "
                                      f"{mine}; {fix}")
        pos = meta.get("pos")
        if isinstance(pos, bool) or not isinstance(pos, (int, np.integer)) \
                or not 0 <= pos <= self._n_steps:
            raise CheckpointError(f"load_state_dict: pos={describe(pos)} outside [0, "
                                  f"{self._n_steps}]; the state is damaged")
        layout, fields = None, None
        try:
            if meta.get("layout") is not None:
                layout = AgentLayout.build(self._agents, meta["layout"], {}, ())
                fields = Spec.from_json(meta["spec"])
        except (ReplayBankError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"load_state_dict: the state's layout or spec is not "
                                  f"valid ({exc}); the state is damaged") from None
        if self._fields is not None and fields != self._fields:
            raise CheckpointError(f"load_state_dict: the state's fields {fields} differ from "
                                  f"this buffer's {self._fields}; {fix}")
        shape = (self._n_steps, self._num_envs)
        try:
            data = {n: np.array(arrays[f"fields/{n}"], dtype=f.dtype)
                    for n, f in (fields or Spec()).items()}
            for n, f in (fields or Spec()).items():
                if data[n].shape != (*shape, *f.shape):
                    raise ValueError(f"fields/{n} has shape {data[n].shape}, expected "
                                     f"{(*shape, *f.shape)}")
            fv = np.array(arrays["final_value"], dtype=np.float64)
            if fv.shape != self._final_value.shape:
                raise ValueError(f"final_value has shape {fv.shape}, expected "
                                 f"{self._final_value.shape}")
            adv: dict[str, AnyArray] | None = None
            ret: dict[str, AnyArray] | None = None
            if any(k.startswith("advantages/") for k in arrays):
                adv = {a: np.array(arrays[f"advantages/{a}"]) for a in self._agents}
                ret = {a: np.array(arrays[f"returns/{a}"]) for a in self._agents}
                for a in self._agents:
                    if adv[a].shape != (pos, self._num_envs) \
                            or ret[a].shape != (pos, self._num_envs):
                        raise ValueError(f"advantages/{a} or returns/{a} is not shaped "
                                         f"{(pos, self._num_envs)}")
            kept = self._final_obs.parsed(
                arrays, None if layout is None else layout.per_agent["obs"],
                None if layout is None else layout.state, int(pos))
            probe = type(self._rng.bit_generator)()
            probe.state = state["rng"]
        except (KeyError, ValueError, TypeError, IndexError, OverflowError) as exc:
            raise CheckpointError(f"load_state_dict: missing or misshaped array ({exc}); "
                                  "the state is damaged") from None
        # ---- every check passed: apply
        self._layout, self._fields, self._data = layout, fields, data
        self._pos, self._final_value = int(pos), fv
        self._adv, self._ret = adv, ret
        self._final_obs.load(*kept)
        self._rng.bit_generator.state = state["rng"]

