"""Fill buffers from gymnasium environments: ``collect`` and ``warm``.

:class:`Collector` steps a single env or a vector env (``SyncVectorEnv``,
``AsyncVectorEnv``, wrapped or not) with a policy and adds every real transition to a
buffer, in all three autoreset modes of gymnasium 1.x:

* ``NEXT_STEP`` (default): the step after an episode end only resets that sub-env; it
  returns the reset observation with reward 0 and is *not* a transition. Only the lanes
  that produced real transitions are added (``add(env_ids=...)``).
* ``SAME_STEP``: an ending sub-env is reset within the same step; its true final
  observation arrives in ``info["final_obs"]`` and is stored as ``next_obs``.
* ``DISABLED``: the collector resets ending sub-envs itself (``reset_mask``).

No stored transition ever pairs observations of two episodes. Each buffer lane holds
one sub-env (``buffer.num_envs == env.num_envs``); a one-lane buffer also works: each
sub-env's steps are held until its episode ends and then appended whole
(:mod:`~replaybank.integrations.episode_stage`), so every episode in the lane is
contiguous and complete, as n-step returns, frame stacks, sequences and HER need.

What the collector hands the buffer is what the env and the policy returned (Dict and
Tuple values arranged as nested dicts, tensors as numpy arrays): the buffer casts it with
its one checked cast, under the rules of ``buf.add``. The observation it keeps across
``env.step`` is a copy (vector envs built with ``copy=False`` update theirs in place).
It writes inside the buffer's :meth:`~replaybank.ReplayBuffer.reset_free_writes`, so
the buffer's NEXT_STEP reset-step check does not count its steps.

Example:
    >>> import gymnasium as gym
    >>> import replaybank as rb
    >>> envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    >>> buf = rb.ReplayBuffer(1000, num_envs=2, seed=0)
    >>> out = collect(envs, None, buf, 100, progress=False, seed=0)
    >>> len(buf) >= 100, out.steps == len(buf)
    (True, True)
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from replaybank.buffers.autoreset import ResetFreeWrites
from replaybank.errors import ConfigError, ReplayBankError, describe, require_extra
from replaybank.host import is_tensor, tensor_to_numpy
from replaybank.integrations.episode_stage import EpisodeStage, check_max_held
from replaybank.integrations.progress import ProgressBar
from replaybank.integrations.spaces import spec_from_env, spec_from_spaces, to_fields
from replaybank.spec import check_tuple, flatten, tree_map

__all__ = ["AgentPolicy", "CollectResult", "Collector", "StatefulPolicy", "collect",
           "spec_from_env", "spec_from_spaces", "warm"]

Policy = Callable[[Any], Any]


@runtime_checkable
class AutoresetAware(Protocol):
    """A buffer that knows how its envs autoreset (``ReplayBuffer``, ``RolloutBuffer``):
    with ``"next_step"`` it drops or masks the NEXT_STEP reset steps itself."""

    autoreset_mode: str | None


@runtime_checkable
class EpisodeSink(Protocol):
    """A buffer that takes whole episodes: what a one-lane buffer fed by several
    sub-envs must be (``ReplayBuffer``, ``HerReplayBuffer``, ...)."""

    @property
    def capacity(self) -> int:
        """The most steps the buffer holds."""
        ...

    def extend(self, **fields: Any) -> None:
        """Add ``[T, *shape]`` steps."""
        ...


@dataclass
class CollectResult:
    """What one collection run did.

    Attributes:
        steps: Transitions added to the buffer (with a one-lane buffer fed by a vector
            env: those of the episodes that ended, see :class:`Collector`).
        env_steps: Sub-env steps taken (autoreset steps included).
        episode_returns: Undiscounted return of every episode that ended, in order.
        episode_lengths: Length of those episodes.
    """

    steps: int = 0
    env_steps: int = 0
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)


def _numpy(x: Any) -> Any:
    """A torch tensor (a policy's output) as a host array; anything else as it is."""
    return tensor_to_numpy(x) if is_tensor(x) else x


def _autoreset_mode(env: Any) -> Any:
    gym = require_extra("gymnasium", "gym")
    mode = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
    return mode if isinstance(mode, gym.vector.AutoresetMode) else gym.vector.AutoresetMode(mode)


class Collector:
    """Steps an env with a policy and adds real transitions to a buffer.

    Keeps the env's current observations and running episode statistics between
    :meth:`collect` calls, so training loops can alternate collection and updates.

    **One-lane buffer, vector env.** A buffer with ``num_envs=1`` fed by ``N`` sub-envs
    receives whole episodes: each sub-env's steps are held until its episode ends
    (terminated or truncated) and then appended in one piece, in the order the episodes
    end, so every episode in the lane is contiguous and complete (n-step returns, frame
    stacks, sequences and HER's ``"final"`` goal are exact, as with one lane per
    sub-env). Therefore:

    * ``collect(n)`` steps until the episodes that ended hold at least ``n`` transitions:
      ``len(buf)`` grows by at least ``n`` (until the buffer is full), like with ``N``
      lanes, but it may take more env steps and overshoot by the episodes that end on its
      last step. The steps of running episodes stay held (:attr:`held`) and continue in
      the next call.
    * :meth:`flush` appends the held steps now: each running episode is cut there (its
      prefix ends like a time limit, its rest is appended later as an episode of its
      own). Call it when collection stops for good; :meth:`reset` does it too, before it
      resets the envs; garbage collection drops held steps (nothing is written from a
      finalizer).
    * At most ``max_held`` steps are held; past that, the sub-env holding the most appends
      its prefix (cut as by :meth:`flush`), so an env whose episodes never end still
      fills the buffer in bounded memory.
    * Held steps the buffer refuses when they are appended (a value its fields cannot
      hold) are the only steps lost: that sub-env's other held steps are appended around
      them (its episode is cut there, as by a time limit), the other sub-envs' held steps
      are kept, no env is reset, and the buffer's error says so after the step (or
      :meth:`flush`) is complete, so collection can go on.

    Args:
        env: A ``gymnasium.Env`` (buffer with one lane) or a ``gymnasium.vector.VectorEnv``.
        policy: ``policy(obs) -> action`` on what the env returns (batched for vector
            envs); numpy arrays or torch tensors. None: uniformly random actions.
        buffer: Any replaybank buffer with ``add`` and ``num_envs`` (and ``extend`` and
            ``capacity`` for a one-lane buffer fed by a vector env).
        seed: Seed of the first ``env.reset`` and of random actions.
        max_held: The most steps of running episodes held for a one-lane buffer fed by a
            vector env (None: ``buffer.capacity``, so holding never costs more memory
            than the buffer). Unused otherwise.

    Raises:
        ConfigError: ``buffer.num_envs`` is neither the env's number of sub-envs nor 1; a
            one-lane buffer fed by a vector env that cannot take whole episodes; a bad
            ``max_held``.

    Example:
        >>> import gymnasium as gym
        >>> import replaybank as rb
        >>> env = gym.make("CartPole-v1")
        >>> col = Collector(env, None, rb.ReplayBuffer(500, seed=0), seed=0)
        >>> res = col.collect(50)
        >>> res.steps, len(col.buffer)
        (50, 50)
    """

    def __init__(self, env: Any, policy: Policy | None, buffer: Any,
                 seed: int | None = None, max_held: int | None = None) -> None:
        from replaybank.integrations import pettingzoo  # imports this module

        if pettingzoo.wants_multiagent(env, buffer):
            raise ConfigError(
                f"Collector(env={describe(env)}, buffer={describe(buffer)}): Collector "
                "drives gymnasium envs into single-agent buffers; for a PettingZoo "
                "parallel env (or a list of them) and a MultiAgentReplayBuffer use "
                "replaybank.integrations.pettingzoo.MultiAgentCollector(env, policy, "
                "buffer, seed=...) (rb.collect dispatches to it)")
        gym = require_extra("gymnasium", "gym")
        sb3_vec = sys.modules.get("stable_baselines3.common.vec_env")
        if sb3_vec is not None and isinstance(env, sb3_vec.VecEnv):
            raise ConfigError(
                f"Collector(env={type(env).__name__}): an SB3 VecEnv steps by SB3's API "
                "(reset() without seed=, 4-tuple step); collect drives gymnasium envs: pass "
                "gymnasium.vector.SyncVectorEnv([...]) (or gym.make_vec), or train with SB3 "
                "and replay_buffer_class=replaybank.integrations.sb3.ReplayBuffer")
        self.env = env
        self.buffer = buffer
        self.vector = isinstance(env, gym.vector.VectorEnv)
        self.n = int(env.num_envs) if self.vector else 1
        self.mode = _autoreset_mode(env) if self.vector else None
        lanes = int(buffer.num_envs)
        if lanes not in (self.n, 1):
            raise ConfigError(
                f"buffer.num_envs={lanes} but the env has {self.n} sub-envs; build the "
                f"buffer with num_envs={self.n} (one lane per sub-env) or num_envs=1"
                if self.n > 1 else
                f"buffer.num_envs={lanes} but the env is a single env; build the buffer "
                "with num_envs=1, or pass a gymnasium vector env of that many sub-envs"
            )
        self.staged = lanes == 1 and self.n > 1
        gym_modes = gym.vector.AutoresetMode
        #: The buffer drops (or masks) NEXT_STEP reset steps itself: it is given every
        #: step, reset steps included (else they are left out here).
        self.whole = self.mode == gym_modes.NEXT_STEP and isinstance(buffer, AutoresetAware) \
            and buffer.autoreset_mode == "next_step"
        if self.whole and self.staged:
            raise ConfigError(
                f"Collector(buffer={describe(buffer)}): a one-lane buffer fed by "
                f"{self.n} sub-envs gets each sub-env's steps in turn, so it cannot tell "
                "their NEXT_STEP reset steps apart; build it with autoreset_mode=None "
                "(collect leaves the reset steps out itself) or with "
                f"num_envs={self.n}")
        #: One-lane buffer, several sub-envs: their episodes wait here until they end.
        self.stage: EpisodeStage | None = None
        if self.staged:
            if not isinstance(buffer, EpisodeSink):
                raise ConfigError(
                    f"Collector(buffer={describe(buffer)}): a one-lane buffer fed by "
                    f"{self.n} sub-envs is given each sub-env's episodes whole, with "
                    "extend(), and this buffer has no extend/capacity; build it with "
                    f"num_envs={self.n} (one lane per sub-env)")
            self.stage = EpisodeStage(self.n, check_max_held(max_held, buffer.capacity),
                                      buffer.extend)
        # the buffer's reset-step check skips what this collector writes
        self._reset_free: Callable[[], contextlib.AbstractContextManager[Any]] = \
            buffer.reset_free_writes if isinstance(buffer, ResetFreeWrites) \
            else contextlib.nullcontext
        self.obs_space = env.single_observation_space if self.vector else env.observation_space
        self.act_space = env.single_action_space if self.vector else env.action_space
        self.seed = seed
        if policy is None:
            env.action_space.seed(seed)
            policy = self._random
        self.policy: Policy = policy
        # a recurrent state to store beside each step (the buffer's "hidden" field)
        self.stateful = policy if isinstance(policy, StatefulPolicy) else None
        self._obs: Any = None
        self._started = False  # reset once: a later reset continues the env's generator
        self._pending = np.zeros(self.n, dtype=bool)  # NEXT_STEP: lane resets next step
        self._ret = np.zeros(self.n, dtype=np.float64)
        self._len = np.zeros(self.n, dtype=np.int64)
        self.episodes = 0

    def _random(self, obs: Any) -> Any:
        return self.env.action_space.sample()

    def reset(self, seed: int | None = None) -> Any:
        """Reset the env (episode statistics restart) and return its observation.

        The running episodes end unfinished, cut where they are: their stored steps stay
        (the next step's observation does not continue them), and with a one-lane buffer
        fed by a vector env their held steps are appended first, as :meth:`flush` does.

        Raises:
            ReplayBankError: The buffer refused some of the held steps it was given (see
                :meth:`flush`); raised after the reset, which is done.
        """
        if self.stage is not None:
            with self._reset_free():
                self.stage.flush()
        self._obs, _ = self.env.reset(seed=seed)
        self._started = True
        self._pending[:] = False
        self._ret[:] = 0.0
        self._len[:] = 0
        self._raise_refused(reset=True)
        return self._obs

    @property
    def obs(self) -> Any:
        """The env's current observation (what the policy sees next)."""
        return self._obs

    @property
    def held(self) -> int:
        """Steps of running episodes held for a one-lane buffer (0 otherwise)."""
        return 0 if self.stage is None else self.stage.held

    # ------------------------------------------------------------------ one step
    def _action(self, obs: Any) -> Any:
        return _numpy(self.policy(obs))

    def _check_action(self, act_fields: Any) -> None:
        """Check the policy's action (and the recurrent state the buffer stores with it)
        before ``env.step``: the tuple rule of the add boundary
        (:func:`~replaybank.spec.check_tuple`) always, also before the first add (a
        one-lane buffer fed by a vector env holds the steps, and would have taken the
        tuple's parts as its envs' values), and the buffer's checked cast of its action
        fields once the buffer knows them.

        Raises:
            ShapeError, DtypeError: An action the buffer's ``add`` would refuse; the env
                has not stepped, so nothing changed.
        """
        spec = self.buffer.spec
        lead = (self.n,) if self.vector else ()
        values = flatten({"action": act_fields})
        if self.stateful is not None and spec is not None and "hidden" in spec:
            values["hidden"] = self.stateful.hidden
        for name, value in values.items():
            try:
                if type(value) is tuple or type(value) is list:
                    check_tuple(name, value)
                if spec is not None and name in spec and name != "hidden":
                    spec[name].cast(name, value, lead)
            except ReplayBankError as exc:
                whose = "recurrent state" if name == "hidden" else "action"
                raise type(exc)(
                    f"collect(policy=...): the buffer refuses the policy's {whose}: "
                    f"{exc} [env.step was not called: the env and the collector are "
                    "as before this step, so collect can go on once the policy is "
                    "fixed]") from None

    def _extras(self) -> dict[str, Any]:
        """The policy's recurrent state, when the buffer stores a ``hidden`` field:
        ``{"hidden": [n, ...]}`` (``[...]`` for a single env), else ``{}``."""
        spec = self.buffer.spec
        if self.stateful is None or spec is None or "hidden" not in spec:
            return {}
        hidden = self.stateful.hidden
        if hidden is None:
            raise ConfigError(
                "the buffer stores a 'hidden' field but the policy returned no hidden "
                "state; its predict(obs, hidden, train_mode=True) must return "
                "(actions, hidden) with hidden [num_envs, ...]")
        hidden = np.asarray(hidden)  # (its dtype: the buffer's checked cast)
        return {"hidden": hidden.reshape(self.n, *spec["hidden"].shape) if self.vector
                else hidden.reshape(spec["hidden"].shape)}

    def _store(self, fields: dict[str, Any], real: np.ndarray, done: np.ndarray) -> int:
        """Hand one step's transitions (lanes ``real`` ``[n]``) to the buffer; returns
        how many it took now."""
        # rewards (float64 here) in a float stored dtype (float32 by default): the
        # buffer's compiled writer takes values of exactly the stored format; a float
        # narrowing is what its cast does too (any other kind: the buffer's checked cast)
        spec = self.buffer.spec
        dtype = np.dtype(np.float32) if spec is None or "reward" not in spec \
            else spec["reward"].dtype
        if dtype.kind == "f":
            fields["reward"] = np.asarray(fields["reward"], dtype=dtype)
        with self._reset_free():
            if not self.vector:
                self.buffer.add(**fields)
                return 1
            if self.stage is not None:
                return self.stage.hold(fields, real, done)
            if real.all():
                self.buffer.add(**fields)
            elif real.any():
                ids = np.flatnonzero(real)
                self.buffer.add(env_ids=ids, **tree_map(lambda x: _take(x, ids), fields))
        return int(real.sum())

    def flush(self) -> int:
        """Append the held steps of running episodes now (a one-lane buffer fed by a
        vector env; nothing otherwise): each of those episodes is cut there (its prefix
        ends like a time limit, its rest is appended later as an episode of its own).
        Call it when collection stops for good, e.g. before saving the buffer.

        Returns:
            The steps appended.
        """
        if self.stage is None:
            return 0
        with self._reset_free():
            appended = self.stage.flush()
        self._raise_refused()
        return appended

    def _raise_refused(self, reset: bool = False) -> None:
        """Raise the buffer's error for held steps it refused when they were appended
        (a one-lane buffer fed by a vector env): only those steps are left out, so the
        envs and the other held steps go on (:mod:`~replaybank.integrations.episode_stage`;
        ``reset``: they were appended by :meth:`reset`, which reset every env).
        """
        refused = [] if self.stage is None else self.stage.take_refused()
        if not refused:
            return
        exc = refused[0].error
        which = ", ".join(f"sub-env {r.env} ({r.steps} of its held steps)" for r in refused)
        raise type(exc)(
            f"{exc} [collect: the buffer refused held steps of {which} when they were "
            "appended; only the steps it refuses are left out (that episode is cut around "
            "them, as by a time limit, and nothing that bridges them is stored), the "
            + ("other held steps were appended, and the envs were reset (reset()), so "
               if reset else "other held steps were appended or stay held, and no env "
               "was reset, so ") + "collect can go on]") from exc

    def step(self, result: CollectResult) -> int:
        """One env step for every sub-env; returns the number of transitions added to the
        buffer (with a one-lane buffer fed by a vector env: those of the episodes that
        ended, and any prefix the ``max_held`` bound appended)."""
        if self._obs is None:  # the first step, or the one after a lost step
            self.reset(None if self._started else self.seed)
        obs = self._obs
        # a copy, taken before env.step: a vector env built with copy=False returns its
        # own observation array and overwrites it in place on the next step
        obs_fields = tree_map(_copy_leaf, to_fields(self.obs_space, obs))
        action = self._action(obs)
        act_fields = to_fields(self.act_space, action)
        self._check_action(act_fields)
        nxt, reward, term, trunc, info = self.env.step(action)
        reward = np.asarray(reward, dtype=np.float64).reshape(self.n)
        term = np.asarray(term, dtype=bool).reshape(self.n)
        trunc = np.asarray(trunc, dtype=bool).reshape(self.n)
        done = term | trunc
        real = ~self._pending
        next_fields = to_fields(self.obs_space, nxt)
        carry = nxt
        gym = require_extra("gymnasium", "gym")
        modes = gym.vector.AutoresetMode
        if self.vector and self.mode == modes.SAME_STEP and done.any():
            final = info["final_obs"]
            next_fields = tree_map(np.array, next_fields)  # copy: lanes get replaced
            for i in np.flatnonzero(done):
                fin = to_fields(self.obs_space, final[i])
                next_fields = _with_lane(next_fields, fin, int(i))
        elif self.vector and self.mode == modes.DISABLED and done.any():
            next_fields = tree_map(np.array, next_fields)
            carry, _ = self.env.reset(options={"reset_mask": done})
        extras = self._extras()
        fields: dict[str, Any] = {
            "obs": obs_fields,
            "action": act_fields,
            "reward": reward if self.vector else reward[0],
            "next_obs": next_fields,
            "terminated": term if self.vector else term[0],
            "truncated": trunc if self.vector else trunc[0],
            **extras,
        }
        try:
            stored = self._store(fields, np.ones(self.n, bool) if self.whole else real, done)
        except ReplayBankError as exc:
            # the env stepped but the buffer refused the step: it is lost, and no later
            # transition may bridge it (obs before it, next_obs after it): reset next step
            self._obs = None
            raise type(exc)(
                f"{exc} [collect: the buffer refused this step after the env had already "
                "stepped, so the step is lost: the running episode ends at its last "
                "stored step (cut short, as by a time limit) and the env is reset at the "
                "next step; nothing that bridges the lost step is stored]") from exc
        if self.whole:
            stored = int(real.sum())  # (the buffer drops the reset steps it was given)
        result.steps += stored
        result.env_steps += self.n
        self._ret[real] += reward[real]
        self._len[real] += 1
        ended = np.flatnonzero(done & real)
        for i in ended:
            result.episode_returns.append(float(self._ret[i]))
            result.episode_lengths.append(int(self._len[i]))
        self._ret[ended] = 0.0
        self._len[ended] = 0
        self.episodes += len(ended)
        if not self.vector:
            carry = self.env.reset()[0] if done[0] else nxt
        elif self.mode == modes.NEXT_STEP:
            self._pending = done & real
        self._obs = carry
        self._raise_refused()  # after the step's bookkeeping: collection goes on from here
        return stored

    # ------------------------------------------------------------------ many steps
    def collect(self, n_steps: int, progress: bool = False,
                description: str = "collect") -> CollectResult:
        """Step until at least ``n_steps`` transitions were added (whole vector steps).

        Args:
            n_steps: Transitions to add to the buffer (may overshoot by less than
                ``num_envs``; with a one-lane buffer fed by a vector env, by the episodes
                that end on the last step, and held steps of running episodes carry over
                to the next call: see the class docstring).
            progress: Show a progress bar (rich).
            description: Text of the progress bar.

        Returns:
            A :class:`CollectResult` for this call.

        Raises:
            ConfigError: ``n_steps`` is not a positive int.
        """
        if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) \
                or n_steps <= 0:
            raise ConfigError(f"collect(n_steps={n_steps!r}): must be a positive int")
        result = CollectResult()
        with ProgressBar(int(n_steps), description, enabled=progress) as bar:
            while result.steps < n_steps:
                k = self.step(result)
                last = result.episode_returns[-1] if result.episode_returns else None
                bar.update(min(k, n_steps - bar.completed), episodes=len(result.episode_returns),
                           ret=last)
        return result


def _with_lane(tree: Any, value: Any, i: int) -> Any:
    """``tree`` (copies, leading dim ``n``) with lane ``i`` set to ``value``; a leaf whose
    dtype cannot hold ``value`` exactly is widened first (the buffer's cast judges it)."""
    if isinstance(tree, dict):
        return {k: _with_lane(v, value[k], i) for k, v in tree.items()}
    v = np.asarray(value)
    dtype = np.result_type(tree.dtype, v.dtype)
    out = tree if dtype == tree.dtype else tree.astype(dtype)
    out[i] = v
    return out


def _take(x: Any, ids: np.ndarray) -> Any:
    """Rows ``ids`` of a vector value: of an array, or of a policy's list (kept a list,
    which the buffer's inference reads as it reads it in ``add``)."""
    return x[ids] if isinstance(x, np.ndarray) else [x[i] for i in ids.tolist()]


def _copy_leaf(x: Any) -> Any:
    """A copy of an observation leaf that the env cannot change (arrays keep their dtype;
    Python numbers and lists stay Python values for the buffer's inference)."""
    return x.copy() if isinstance(x, np.ndarray) else copy.deepcopy(x)


def collect(env: Any, policy: Policy | None, buffer: Any, n_steps: int, progress: bool = True,
            seed: int | None = None) -> CollectResult:
    """Reset ``env``, step it with ``policy`` and add ``n_steps`` transitions to ``buffer``.

    For repeated collection that continues episodes across calls, keep a
    :class:`Collector`. With a one-lane buffer fed by a vector env the buffer receives
    whole episodes only: collection goes on until the episodes that ended hold
    ``n_steps`` transitions, and the steps of the episodes still running at the end are
    not stored (their episodes never end; a :class:`Collector` continues them, or
    appends them with :meth:`Collector.flush`). A PettingZoo parallel env, a list of them, or a
    :class:`~replaybank.multiagent.MultiAgentReplayBuffer` is collected by
    :func:`replaybank.integrations.pettingzoo.collect_multiagent` (joint steps; see there
    for the multi-agent policy, ``policy(obs_dict) -> action_dict``).

    Args:
        env: A gymnasium env (buffer of one lane) or vector env (any autoreset mode), or a
            PettingZoo ``ParallelEnv`` or a list of them (a multi-agent buffer).
        policy: ``policy(obs) -> action`` (None: random actions).
        buffer: The buffer to fill (``num_envs`` equal to the env's, or 1; one lane per
            env for parallel envs).
        n_steps: Transitions to add (whole vector steps; may overshoot by < num_envs, or
            with a one-lane buffer by the episodes that end on the last step).
        progress: Show a rich progress bar.
        seed: Seed of ``env.reset`` and of random actions.

    Returns:
        :class:`CollectResult` with steps and the returns/lengths of finished episodes
        (a :class:`~replaybank.integrations.pettingzoo.MultiAgentCollectResult`, with
        per-agent returns and lengths, for parallel envs).

    Raises:
        ConfigError: A bad ``n_steps``, a buffer that does not fit the env (for example
            a parallel env with a single-agent buffer, or the reverse), or an env or
            policy that breaks its API.

    Example:
        >>> import gymnasium as gym
        >>> import replaybank as rb
        >>> buf = rb.ReplayBuffer(300, seed=0)
        >>> res = collect(gym.make("CartPole-v1"), None, buf, 200, progress=False, seed=1)
        >>> res.steps, sum(res.episode_lengths) <= 200
        (200, True)
    """
    from replaybank.integrations import pettingzoo  # imports this module

    if pettingzoo.wants_multiagent(env, buffer):
        return pettingzoo.collect_multiagent(env, policy, buffer, n_steps,
                                             progress=progress, seed=seed)
    return Collector(env, policy, buffer, seed=seed).collect(n_steps, progress=progress)


@runtime_checkable
class StatefulPolicy(Protocol):
    """A policy that carries a recurrent state between calls: ``hidden`` is the state it
    returned with its last actions (``[num_envs, ...]``), which a buffer with a
    ``hidden`` field stores beside each step (velora's agents)."""

    hidden: Any

    def __call__(self, obs: Any) -> Any:
        """Actions for ``obs``."""
        ...


class AgentPolicy:
    """``agent.predict(obs, hidden, train_mode=True) -> actions`` or ``(actions, hidden)``
    as a :class:`StatefulPolicy` (inputs as tensors on ``agent.device`` when it has one).

    Args:
        agent: An object with ``predict`` (and optional ``device``).
    """

    def __init__(self, agent: Any) -> None:
        self.predict = agent.predict
        self.device = getattr(agent, "device", None)
        #: The state ``predict`` returned with the last actions (None before, or when
        #: ``predict`` returns actions only).
        self.hidden: Any = None
        self._state: Any = None

    def __call__(self, obs: Any) -> Any:
        x = obs
        if self.device is not None:
            torch = require_extra("torch", "torch")
            x = torch.as_tensor(np.asarray(obs), device=self.device)
        try:
            out = self.predict(x, self._state, train_mode=True)
        except TypeError:
            out = self.predict(x)
        if isinstance(out, tuple) and len(out) == 2:
            out, self._state = out
            self.hidden = None if self._state is None else _numpy(self._state)
        return _numpy(out)


def _agent_policy(agent: Any) -> Policy | None:
    if agent is None:
        return None
    if getattr(agent, "predict", None) is None:
        if not callable(agent):
            raise ConfigError(
                f"agent_or_policy={describe(agent)}: expected a callable policy(obs) -> action "
                "or an agent with predict(obs, hidden, train_mode=True)"
            )
        return agent  # type: ignore[no-any-return]
    return AgentPolicy(agent)


def _make_vec_env(agent: Any, env: Any, num_envs: int) -> tuple[Any, bool]:
    """The vector env to warm from, and whether warm() owns (must close) it."""
    gym = require_extra("gymnasium", "gym")
    if isinstance(env, gym.vector.VectorEnv):
        return env, False
    if env is None:
        agent_env = getattr(agent, "env", None)
        env_id = getattr(getattr(agent_env, "spec", None), "id", None)
        if env_id is None:
            raise ConfigError(
                f"warm(env=None): cannot find agent.env.spec.id on {describe(agent)}; pass "
                "env=<gymnasium env id>, an env factory, or a vector env"
            )
        env = env_id
    if isinstance(env, gym.Env):
        if env.spec is None:
            raise ConfigError(f"env={env!r} has no spec id; pass an env id or a factory")
        env = env.spec.id
    if isinstance(env, str):
        return gym.make_vec(env, num_envs=num_envs, vectorization_mode="sync"), True
    if callable(env):
        return gym.vector.SyncVectorEnv([env for _ in range(num_envs)]), True
    raise ConfigError(
        f"env={describe(env)}: expected an env id, an env factory, an env or a vector env"
    )


def warm(buffer: Any, agent_or_policy: Any, n_samples: int, num_envs: int = 8,
         env: Any = None, progress: bool = True, seed: int | None = None) -> CollectResult:
    """Fill ``buffer`` to at least ``n_samples`` transitions from a vectorized env.

    The env is ``agent.env.spec.id`` (velora's convention) unless ``env`` names one: an
    env id, an env factory, an env (its spec id) or a ready vector env. A one-lane buffer
    receives whole episodes only (see :func:`collect`).

    Args:
        buffer: The buffer (``num_envs`` lanes, or 1: then each sub-env's episodes are
            appended whole, and the steps of those still running at the end are dropped).
        agent_or_policy: ``policy(obs) -> action``, an agent with
            ``predict(obs, hidden, train_mode=True)`` (and optional ``device``), or None
            for random actions. When ``predict`` returns ``(actions, hidden)`` and the
            buffer's spec has a ``hidden`` field, each step is stored with the hidden
            state returned for it (velora's buffers).
        n_samples: Target ``len(buffer)``; nothing happens if it already holds that many.
        num_envs: Sub-envs of the vector env built here.
        env: Which env to run (see above).
        progress: Show a rich progress bar.
        seed: Seed of the env reset and random actions.

    Returns:
        :class:`CollectResult` of the collection.

    Raises:
        ConfigError: Bad ``n_samples``/``num_envs``, more samples than capacity, or no env.

    Example:
        >>> import replaybank as rb
        >>> buf = rb.ReplayBuffer(400, num_envs=4, seed=0)
        >>> _ = rb.warm(buf, None, 200, num_envs=4, env="CartPole-v1", progress=False, seed=0)
        >>> len(buf) >= 200
        True
    """
    for name, value in (("n_samples", n_samples), ("num_envs", num_envs)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ConfigError(f"warm({name}={value!r}): must be a positive int")
    if n_samples > buffer.capacity:
        raise ConfigError(
            f"warm(n_samples={n_samples}): the buffer holds at most capacity="
            f"{buffer.capacity} transitions; lower n_samples"
        )
    missing = int(n_samples) - len(buffer)
    if missing <= 0:
        return CollectResult()
    policy = _agent_policy(agent_or_policy)
    vec, owned = _make_vec_env(agent_or_policy, env, int(num_envs))
    try:
        col = Collector(vec, policy, buffer, seed=seed)
        return col.collect(missing, progress=progress, description="warm")
    finally:
        if owned:
            vec.close()
