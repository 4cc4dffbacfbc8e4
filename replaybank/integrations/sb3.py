"""Stable-Baselines3 replay buffers backed by replaybank: uniform, n-step and prioritized.

SB3's off-policy algorithms (DQN, SAC, TD3, DDPG) take a buffer class and its keyword
arguments; :class:`ReplayBuffer` (Box / Discrete / MultiDiscrete / MultiBinary
observations) and :class:`DictReplayBuffer` (Dict observations) plug in there::

    from stable_baselines3 import SAC
    from replaybank.integrations.sb3 import ReplayBuffer

    model = SAC("MlpPolicy", "Pendulum-v1", replay_buffer_class=ReplayBuffer,
                replay_buffer_kwargs={"n_steps": 3, "gamma": 0.99})

Each SB3 buffer owns a core :class:`replaybank.ReplayBuffer` with one lane per env of the
``VecEnv``, so every observation is stored once and an episode's true final observation
(SB3's ``infos[i]["terminal_observation"]``) is kept aside: a truncated step
(``infos[i]["TimeLimit.truncated"]``) is stored with that observation as ``next_obs`` and
sampled with ``dones = 0`` (it bootstraps), as SB3's ``handle_timeout_termination=True``
does. A time-out with ``done=False`` (other VecEnvs, hand-written adds) ends the episode
there too: its ``next_obs`` is the one given and an n-step return stops at it, as in SB3's
``NStepReplayBuffer``. ``handle_timeout_termination=False`` stores time-outs as
terminations (and ignores one without ``done``), as SB3 does.

* **n-step** (``n_steps=n``, ``gamma=``): ``rewards`` are the n-step returns
  ``sum_{k<L} gamma**k r[t+k]`` (``L`` stops at the episode's end), ``next_observations``
  and ``dones`` those of step ``t+L-1``, and ``discounts`` is ``gamma**L``; SB3 2.x's DQN,
  SAC and TD3 bootstrap with ``replay_data.discounts`` when it is set, so they need no
  change. ``gamma`` must equal the algorithm's ``gamma`` (SB3's ``NStepReplayBuffer`` has
  the same rule). With ``n_steps=1``, ``discounts`` is None (the algorithm uses its gamma).
* **Prioritized** (``prioritized=True``, ``alpha``, ``beta``, ``beta_steps``): importance
  weights and TD errors must reach the learner, which SB3's algorithms do not do, so PER
  needs :class:`PrioritizedDQN`, :class:`PrioritizedSAC` or :class:`PrioritizedTD3` (an
  importance-weighted critic loss and ``update_priorities(indices, |td|)`` after every
  gradient step). A plain SB3 algorithm given a prioritized buffer samples by priorities
  that never change after insertion: these subclasses are the documented way.
* **Checkpoints**: ``model.save_replay_buffer(path)`` / ``model.load_replay_buffer(path)``
  pickle the buffer with its core buffer, sampler and generator state, so the loaded
  buffer draws the identical next sample. Sampling uses the core buffer's own generator
  (``seed=``; by default drawn from numpy's global generator, which SB3's ``seed=`` sets).
* ``VecNormalize``: observations are stored unnormalized and normalized when sampled (as
  SB3 does); with ``n_steps > 1`` the reward normalization is applied to the n-step return
  (the scaling is exact, the clipping applies to the sum).
* ``optimize_memory_usage=True`` is refused: each observation is stored once already.
  Under ``VecFrameStack`` an observation is a whole stack, so each frame is stored ``k``
  times, as in SB3's buffer with ``optimize_memory_usage=True`` (one frame per step needs
  the core buffer's ``frame_stack=``; see docs/integrations.md).
  SB3's raw arrays (``observations``, ``dones``, ...) do not exist; read
  :attr:`ReplayBuffer.core` (a :class:`replaybank.ReplayBuffer`) instead.

Example:
    >>> import gymnasium as gym
    >>> buf = ReplayBuffer(100, gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2),
    ...                    device="cpu", n_envs=2, n_steps=3, gamma=0.9, seed=0)
    >>> for t in range(4):
    ...     buf.add(np.full((2, 3), t, np.float32), np.full((2, 3), t + 1, np.float32),
    ...             np.array([0, 1]), np.ones(2, np.float32), np.array([False, t == 3]),
    ...             [{}, {"TimeLimit.truncated": t == 3}])
    >>> s = buf.sample(5)
    >>> tuple(s.observations.shape), tuple(s.actions.shape), tuple(s.rewards.shape)
    ((5, 3), (5, 1), (5, 1))
    >>> bool((s.dones == 0).all()), s.discounts is not None, buf.size(), len(buf.core)
    (True, True, 4, 8)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch as th
import torch.nn.functional as F  # noqa: N812  (torch's own convention)
from gymnasium import spaces
from stable_baselines3 import DQN, SAC, TD3
from stable_baselines3.common import buffers as sb3_buffers
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.preprocessing import get_action_dim, get_obs_shape
from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples
from stable_baselines3.common.utils import polyak_update
from stable_baselines3.common.vec_env import VecNormalize

from replaybank.buffers.replay import ReplayBuffer as CoreBuffer
from replaybank.errors import ConfigError, ShapeError, SpecError
from replaybank.samplers.base import Sampler
from replaybank.samplers.prioritized import PrioritizedSampler
from replaybank.spec import FieldSpec, Spec

__all__ = ["DictReplayBuffer", "PrioritizedDQN", "PrioritizedSAC", "PrioritizedTD3",
           "PrioritySample", "ReplayBuffer"]


class PrioritySample(NamedTuple):
    """What a prioritized draw adds to SB3's samples.

    Attributes:
        indices: Item keys ``[B]`` int64 for :meth:`ReplayBuffer.update_priorities`.
        weights: Importance-sampling weights ``[B, 1]`` float32 on the buffer's device.
    """

    indices: npt.NDArray[np.int64]
    weights: th.Tensor


def _core_spec(observation_space: spaces.Space[Any], action_space: spaces.Space[Any]) -> Spec:
    """The core buffer's fields, shaped as SB3 stores them (``get_obs_shape``; actions
    ``[action_dim]``, float64 actions as float32: SB3 GH#1572)."""
    fields: list[FieldSpec] = []
    if isinstance(observation_space, spaces.Dict):
        shapes = get_obs_shape(observation_space)
        assert isinstance(shapes, dict)  # get_obs_shape returns a dict for a Dict space
        for key, sub in observation_space.spaces.items():
            fields.append(FieldSpec(f"obs/{key}", tuple(shapes[key]), np.dtype(sub.dtype)))
    else:
        shape = get_obs_shape(observation_space)
        assert isinstance(shape, tuple)
        fields.append(FieldSpec("obs", shape, np.dtype(observation_space.dtype)))
    act_dtype = np.dtype(action_space.dtype)
    if act_dtype == np.float64:
        act_dtype = np.dtype(np.float32)
    fields += [FieldSpec("action", (get_action_dim(action_space),), act_dtype),
               FieldSpec("reward", (), np.dtype(np.float32)),
               FieldSpec("terminated", (), np.dtype(bool)),
               FieldSpec("truncated", (), np.dtype(bool))]
    return Spec(fields)


def _wrong_keys(arg: str, obs: Any, keys: list[str]) -> str:
    """The message for a dict observation ``obs`` (passed as ``arg``) whose keys are not
    the observation space's ``keys``."""
    if not isinstance(obs, dict):
        return (f"add: {arg} is a {type(obs).__name__}, but the observation space is a Dict "
                f"of the keys {keys}; pass a dict of one [n_envs, *shape] array per key")
    missing = [k for k in keys if k not in obs]
    unknown = [k for k in obs if k not in keys]
    said = "; ".join(f"{what} {names}" for what, names in
                     (("missing", missing), ("not in the space", unknown)) if names)
    return (f"add: {arg} has the keys {list(obs)} ({said}); the observation space has the "
            f"keys {keys}: pass exactly those (add a new key to the env's observation_space "
            "as well), nothing was stored")


def _check_flat(observation_space: spaces.Dict) -> None:
    """Refuse nested spaces: SB3 stores, and its policies read, flat Dict observations.

    Raises:
        ConfigError: An entry is a Dict or Tuple space (named).
    """
    for key, sub in observation_space.spaces.items():
        if isinstance(sub, (spaces.Dict, spaces.Tuple)):
            raise ConfigError(
                f"DictReplayBuffer(observation_space=...): the entry {key!r} is a "
                f"{type(sub).__name__} space; SB3 takes a Dict of Box, Discrete, "
                "MultiDiscrete and MultiBinary spaces (its policies refuse nested ones): "
                f"flatten {key!r} (e.g. gymnasium.spaces.flatten_space), or store nested "
                "observations in a replaybank.ReplayBuffer, which takes them")


def _make_sampler(prioritized: bool, alpha: float, beta: float, beta_steps: int | None,
                  sampler: Sampler | None) -> Sampler | None:
    if sampler is not None:
        if prioritized:
            raise ConfigError("sb3.ReplayBuffer(prioritized=True, sampler=...): pass one of "
                              "them (a PrioritizedSampler in sampler= already is PER)")
        return sampler
    if not prioritized:
        return None
    if beta_steps is None:
        return PrioritizedSampler(alpha=alpha, beta=beta)
    return PrioritizedSampler(alpha=alpha, beta=beta, beta_schedule="linear",
                              beta_steps=beta_steps)


class _Buffer(sb3_buffers.ReplayBuffer):
    """The shared part of :class:`ReplayBuffer` and :class:`DictReplayBuffer`."""

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        n_steps: int = 1,
        gamma: float = 0.99,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_steps: int | None = None,
        sampler: Sampler | None = None,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        # SB3's ReplayBuffer.__init__ would allocate its own arrays: only the base's runs
        sb3_buffers.BaseBuffer.__init__(self, buffer_size, observation_space, action_space,
                                        device, n_envs=n_envs)
        if optimize_memory_usage:
            raise ConfigError(
                f"{type(self).__name__}(optimize_memory_usage=True): replaybank stores each "
                "observation once already; pass optimize_memory_usage=False (the default)")
        self.optimize_memory_usage = False
        self.handle_timeout_termination = handle_timeout_termination
        # rows per lane, as SB3 sizes its arrays ([buffer_size // n_envs, n_envs])
        self.buffer_size = max(buffer_size // n_envs, 1)
        self.n_steps = n_steps
        self.gamma = gamma
        if seed is None:  # SB3's seed= sets numpy's global generator: reproducible runs
            seed = int(np.random.randint(2**31 - 1))
        #: The replaybank buffer that holds the data (one lane per env).
        self.core = CoreBuffer(
            capacity=self.buffer_size * n_envs, num_envs=n_envs, seed=seed,
            spec=_core_spec(observation_space, action_space),
            sampler=_make_sampler(prioritized, alpha, beta, beta_steps, sampler),
            n_step=n_steps, gamma=gamma, autoreset_mode="disabled")
        self._dict_obs = isinstance(observation_space, spaces.Dict)

    @property
    def prioritized(self) -> bool:
        """The core buffer's sampler keeps priorities (PER)."""
        return self.core.sampler_traits.priority is not None

    # ------------------------------------------------------------------ writing
    def _obs(self, obs: Any, arg: str) -> Any:
        """One step of every env, each field ``[n_envs, *obs_shape]`` (SB3 passes Discrete
        observations as ``[n_envs]``).

        Raises:
            SpecError: A dict observation whose keys are not the space's (named).
        """
        if self._dict_obs:
            shapes = self.obs_shape
            assert isinstance(shapes, dict)
            if not isinstance(obs, dict) or obs.keys() != shapes.keys():
                raise SpecError(_wrong_keys(arg, obs, list(shapes)))
            return {k: np.asarray(v).reshape((self.n_envs, *shapes[k])) for k, v in obs.items()}
        return np.asarray(obs).reshape((self.n_envs, *self.obs_shape))

    def add(
        self,
        obs: Any,
        next_obs: Any,
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        """Store one step of every env (SB3's ``_store_transition`` call).

        Args:
            obs: Observations ``[n_envs, *obs_shape]`` (a dict of them for Dict spaces).
            next_obs: Next observations; for a finished episode the true final observation
                (SB3 puts ``infos[i]["terminal_observation"]`` there).
            action: Actions ``[n_envs, ...]`` (reshaped to ``[n_envs, action_dim]``).
            reward: Rewards ``[n_envs]``.
            done: Episode ends ``[n_envs]`` (terminated or truncated).
            infos: One dict per env; ``"TimeLimit.truncated"`` marks a time-out, which
                ends the episode even where ``done`` is False (as SB3's ``timeouts``),
                unless ``handle_timeout_termination=False``.

        Raises:
            ShapeError: ``done`` does not hold one value per env.
            SpecError: A dict observation's keys are not the observation space's.
        """
        n = self.n_envs
        if np.size(done) != n:
            raise ShapeError(
                f"add: done has {np.size(done)} values but this buffer holds n_envs={n} "
                "lanes; a buffer keeps the n_envs it was built with (also one loaded with "
                f"load_replay_buffer): train with {n} envs, or build a new buffer"
            )
        ended = np.asarray(done, dtype=bool).reshape(n)
        if self.handle_timeout_termination:
            # A time-out ends the episode here even without done (a VecEnv other than
            # SB3's, or a hand-written add): SB3 keeps `timeouts` apart from `dones` and
            # its NStepReplayBuffer cuts the return at the first done or time-out, serving
            # that step's next_obs with dones 0; stored as truncated, the core does that.
            truncated = np.array([bool(info.get("TimeLimit.truncated", False))
                                  for info in infos])
        else:  # SB3's rule: a time-out is a termination (and without done, no event)
            truncated = np.zeros(n, dtype=bool)
        values: dict[str, Any] = {
            "obs": self._obs(obs, "obs"), "next_obs": self._obs(next_obs, "next_obs"),
            "action": np.asarray(action).reshape((n, self.action_dim)),
            "reward": np.asarray(reward, dtype=np.float32).reshape(n),
            "terminated": ended & ~truncated, "truncated": truncated,
        }
        if n == 1:  # the core's one-env add takes unbatched values
            values = {k: ({f: a[0] for f, a in v.items()} if isinstance(v, dict) else v[0])
                      for k, v in values.items()}
        self.core.add(**values)
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full = True
            self.pos = 0

    def reset(self) -> None:
        """Drop every stored step."""
        super().reset()
        self.core.clear()

    # ------------------------------------------------------------------ sampling
    def _tensors(self, batch_size: int, env: VecNormalize | None) -> tuple[Any, ...]:
        """The core's draw as SB3's fields: ``(obs, actions, next_obs, dones, rewards,
        discounts, priority)``; flags, rewards and discounts ``[B, 1]`` float32."""
        batch = self.core.sample(batch_size)

        def obs_tensors(value: Any) -> Any:
            value = self._normalize_obs(value, env)
            if isinstance(value, dict):
                return {k: self.to_torch(v) for k, v in value.items()}
            return self.to_torch(value)

        rewards = self._normalize_reward(
            np.asarray(batch.reward, dtype=np.float32).reshape(-1, 1), env)
        discounts = None
        if "discount" in batch:
            discounts = self.to_torch(np.asarray(batch.discount, np.float32).reshape(-1, 1))
        priority = None
        if "weights" in batch:
            priority = PrioritySample(
                np.asarray(batch.indices, dtype=np.int64),
                self.to_torch(np.asarray(batch.weights, np.float32).reshape(-1, 1)))
        return (obs_tensors(batch.obs), self.to_torch(batch.action),
                obs_tensors(batch.next_obs),
                self.to_torch(batch.terminated.astype(np.float32).reshape(-1, 1)),
                self.to_torch(rewards), discounts, priority)

    def _get_samples(self, batch_inds: np.ndarray,
                     env: VecNormalize | None = None) -> ReplayBufferSamples:
        raise NotImplementedError(
            f"{type(self).__name__} draws its own keys: call sample(batch_size, env)")

    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """Set new priorities (e.g. ``|td_error|``) of sampled ``indices``; stale ones
        (overwritten since they were drawn) are ignored.

        Returns:
            Number of priorities applied.

        Raises:
            ConfigError: The buffer is not prioritized.
        """
        return self.core.update_priorities(indices, priorities)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(buffer_size={self.buffer_size * self.n_envs}, "
                f"n_envs={self.n_envs}, n_steps={self.n_steps}, core={self.core!r})")


class ReplayBuffer(_Buffer):
    """SB3 ``replay_buffer_class`` for array observations: uniform, n-step, prioritized.

    Args:
        buffer_size: Transitions over all envs (each env keeps ``buffer_size // n_envs``).
        observation_space: The env's observation space.
        action_space: The env's action space.
        device: Torch device of the sampled tensors.
        n_envs: Envs of the VecEnv (one core lane each).
        optimize_memory_usage: Must be False (each observation is stored once anyway).
        handle_timeout_termination: True: a time-out bootstraps from its final observation
            (``dones = 0``); False: it is stored as a termination (SB3's rule).
        n_steps: n-step returns (1 = one-step transitions, ``discounts`` None).
        gamma: Discount of the n-step returns; the algorithm's ``gamma``.
        prioritized: Prioritized replay (train with :class:`PrioritizedDQN`).
        alpha: PER priority exponent.
        beta: PER importance-sampling exponent (initial value with ``beta_steps``).
        beta_steps: Anneal beta linearly to 1 over this many sample calls (None: constant).
        sampler: Any replaybank sampler instead (exclusive with ``prioritized``).
        seed: Seed of the core buffer's draws (None: drawn from numpy's global generator).

    Raises:
        ConfigError: ``optimize_memory_usage=True``, or ``prioritized`` with ``sampler``.

    Example:
        >>> import gymnasium as gym
        >>> buf = ReplayBuffer(64, gym.spaces.Box(-1, 1, (2,)), gym.spaces.Box(-1, 1, (1,)),
        ...                    device="cpu", prioritized=True, seed=0)
        >>> for t in range(8):
        ...     buf.add(np.zeros((1, 2)), np.ones((1, 2)), np.zeros((1, 1)), np.ones(1),
        ...             np.array([False]), [{}])
        >>> data, prio = buf.sample_prioritized(4)
        >>> tuple(prio.weights.shape), buf.update_priorities(prio.indices, np.ones(4))
        ((4, 1), 4)
    """

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """Draw ``batch_size`` transitions as SB3's ``ReplayBufferSamples`` (``discounts``
        set with ``n_steps > 1``).

        Raises:
            EmptyBufferError: The buffer is empty.
        """
        return self.sample_prioritized(batch_size, env)[0]

    def sample_prioritized(
        self, batch_size: int, env: VecNormalize | None = None,
    ) -> tuple[ReplayBufferSamples, PrioritySample | None]:
        """:meth:`sample`, plus the item keys and IS weights of a prioritized buffer
        (None for other samplers)."""
        obs, actions, next_obs, dones, rewards, discounts, priority = self._tensors(
            batch_size, env)
        return ReplayBufferSamples(obs, actions, next_obs, dones, rewards, discounts), priority


class DictReplayBuffer(_Buffer):
    """SB3 ``replay_buffer_class`` for ``Dict`` observation spaces (SB3's own
    ``DictReplayBuffer`` has no n-step returns and no PER); arguments as
    :class:`ReplayBuffer`.

    Raises:
        ConfigError: The observation space is not a ``gymnasium.spaces.Dict``, or one of
            its entries is a Dict or Tuple space (SB3 takes flat Dict spaces).

    Example:
        >>> import gymnasium as gym
        >>> space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,)),
        ...                          "id": gym.spaces.Discrete(3)})
        >>> buf = DictReplayBuffer(32, space, gym.spaces.Discrete(2), device="cpu", seed=0)
        >>> for t in range(3):
        ...     o = {"pos": np.zeros((1, 2), np.float32), "id": np.array([t])}
        ...     buf.add(o, o, np.array([1]), np.ones(1), np.array([False]), [{}])
        >>> s = buf.sample(2)
        >>> sorted(s.observations), tuple(s.observations["id"].shape)
        (['id', 'pos'], (2, 1))
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Space[Any],
                 action_space: spaces.Space[Any], *args: Any, **kwargs: Any) -> None:
        if not isinstance(observation_space, spaces.Dict):
            raise ConfigError(
                f"DictReplayBuffer(observation_space={observation_space!r}): needs a "
                "gymnasium.spaces.Dict; use replaybank.integrations.sb3.ReplayBuffer")
        _check_flat(observation_space)
        super().__init__(buffer_size, observation_space, action_space, *args, **kwargs)

    def sample(  # type: ignore[override]  # dict samples, as SB3's DictReplayBuffer
        self, batch_size: int, env: VecNormalize | None = None,
    ) -> DictReplayBufferSamples:
        """Draw ``batch_size`` transitions as SB3's ``DictReplayBufferSamples``."""
        return self.sample_prioritized(batch_size, env)[0]

    def sample_prioritized(
        self, batch_size: int, env: VecNormalize | None = None,
    ) -> tuple[DictReplayBufferSamples, PrioritySample | None]:
        """:meth:`sample`, plus the keys and IS weights of a prioritized buffer."""
        obs, actions, next_obs, dones, rewards, discounts, priority = self._tensors(
            batch_size, env)
        return (DictReplayBufferSamples(obs, actions, next_obs, dones, rewards, discounts),
                priority)


class PrioritizedDQN(DQN):
    """SB3's DQN that trains prioritized replay: with a prioritized replaybank buffer, the
    Huber loss of each sample is weighted by its importance weight and the buffer gets
    ``|td_error|`` of every sample as its new priority after each gradient step. With any
    other buffer it is SB3's DQN. Pass the buffer as usual::

        PrioritizedDQN("MlpPolicy", env, replay_buffer_class=ReplayBuffer,
                       replay_buffer_kwargs={"prioritized": True, "n_steps": 3, "gamma": 0.99})

    Otherwise identical to :class:`stable_baselines3.DQN` (its ``train`` with the loss
    changed; n-step ``discounts`` are used as there).
    """

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        buffer = self.replay_buffer
        if not isinstance(buffer, (ReplayBuffer, DictReplayBuffer)) or not buffer.prioritized:
            super().train(gradient_steps, batch_size)
            return
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        losses = []
        for _ in range(gradient_steps):
            data, priority = buffer.sample_prioritized(batch_size, env=self._vec_normalize_env)
            assert priority is not None  # a prioritized buffer always returns it
            discounts = data.discounts if data.discounts is not None else self.gamma
            with th.no_grad():
                next_q = self.q_net_target(data.next_observations).max(dim=1)[0].reshape(-1, 1)
                target_q = data.rewards + (1 - data.dones) * discounts * next_q
            current_q = th.gather(self.q_net(data.observations), dim=1,
                                  index=data.actions.long())
            elementwise = F.smooth_l1_loss(current_q, target_q, reduction="none")  # [B, 1]
            loss = (priority.weights * elementwise).mean()
            losses.append(loss.item())
            self.policy.optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
            td = (current_q - target_q).detach().abs().cpu().numpy().reshape(-1)
            buffer.update_priorities(priority.indices, td)
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", np.mean(losses))


# ---------------------------------------------------------------- actor-critic PER
Samples = ReplayBufferSamples | DictReplayBufferSamples


def _draw(algo: OffPolicyAlgorithm, batch_size: int) -> tuple[Samples, PrioritySample | None]:
    """One batch of ``algo``'s buffer, with the keys and IS weights of a prioritized
    replaybank buffer (None for any other buffer, SB3's own included)."""
    buffer = algo.replay_buffer
    assert buffer is not None  # SB3 creates it in _setup_model
    if isinstance(buffer, (ReplayBuffer, DictReplayBuffer)):
        return buffer.sample_prioritized(batch_size, env=algo._vec_normalize_env)
    return buffer.sample(batch_size, env=algo._vec_normalize_env), None


def _critic_loss(current: Sequence[th.Tensor], target: th.Tensor,
                 priority: PrioritySample | None) -> th.Tensor:
    """Sum over the critics of the mean squared TD error; each sample's squared error
    weighted by its importance weight when ``priority`` is given (SB3's unweighted
    ``mse_loss`` otherwise, so a plain buffer trains exactly as SB3)."""
    terms = [F.mse_loss(q, target) if priority is None
             else (priority.weights * F.mse_loss(q, target, reduction="none")).mean()
             for q in current]
    loss = terms[0]
    for term in terms[1:]:
        loss = loss + term
    return loss


def _feed_back(algo: OffPolicyAlgorithm, current: Sequence[th.Tensor], target: th.Tensor,
               priority: PrioritySample | None) -> None:
    """New priorities ``max_i |Q_i(s, a) - y|`` over the critics (of this step's forward
    pass, before the critics' update) for the sampled keys."""
    if priority is None:
        return
    with th.no_grad():
        td = th.stack([(q - target).abs().reshape(-1) for q in current]).amax(dim=0)
    buffer = algo.replay_buffer
    assert isinstance(buffer, (ReplayBuffer, DictReplayBuffer))
    buffer.update_priorities(priority.indices, td.cpu().numpy())


class PrioritizedSAC(SAC):
    """SB3's SAC that trains prioritized replay (PER, Schaul et al. 2016) from a
    prioritized replaybank buffer::

        PrioritizedSAC("MlpPolicy", "Pendulum-v1", replay_buffer_class=ReplayBuffer,
                       replay_buffer_kwargs={"prioritized": True, "beta_steps": 20_000})

    Each gradient step is SB3 2.9's ``SAC.train`` step (entropy-coefficient tuning, the
    clipped double-Q target with the entropy term, n-step ``discounts`` when the buffer
    returns them, the actor update, Polyak target updates every
    ``target_update_interval`` gradient steps) with two changes when the buffer is a
    prioritized replaybank buffer:

    * the critic loss is ``0.5 * sum_i mean_b(w_b * (Q_i(s_b, a_b) - y_b) ** 2)`` with
      ``w_b`` the batch's importance-sampling weights (max-normalized, so at most 1);
      the actor and entropy losses stay unweighted means, as in Fujimoto et al.'s PER
      baselines;
    * after the critic step the sampled keys get the new priorities
      ``max(|Q_1 - y|, |Q_2 - y|)`` (over all ``n_critics``), computed from the critics'
      values of that step before their update. The maximum of the twin critics' errors is
      the choice of Fujimoto, Meger & Precup, "An Equivalence between Loss Functions and
      Non-Uniform Sampling in Experience Replay" (NeurIPS 2020, the PER-TD3 baseline of
      ``github.com/sfujim/LAP-PAL``): a transition is replayed as often as its worst
      critic needs. The buffer then stores ``(|td| + eps) ** alpha``.

    With any other buffer (SB3's own, or an unprioritized replaybank buffer) it trains
    exactly as :class:`stable_baselines3.SAC`, bit for bit under the same seed.

    Example:
        >>> model = PrioritizedSAC("MlpPolicy", "Pendulum-v1", seed=0, learning_starts=50,
        ...                        batch_size=16, policy_kwargs={"net_arch": [8]},
        ...                        replay_buffer_class=ReplayBuffer,
        ...                        replay_buffer_kwargs={"prioritized": True}).learn(60)
        >>> model._n_updates
        10
    """

    def train(self, gradient_steps: int, batch_size: int = 64) -> None:
        self.policy.set_training_mode(True)
        optimizers = [self.actor.optimizer, self.critic.optimizer]
        if self.ent_coef_optimizer is not None:
            optimizers.append(self.ent_coef_optimizer)
        self._update_learning_rate(optimizers)
        ent_coef_losses: list[float] = []
        ent_coefs: list[float] = []
        actor_losses: list[float] = []
        critic_losses: list[float] = []
        for step in range(gradient_steps):
            data, priority = _draw(self, batch_size)
            discounts = data.discounts if data.discounts is not None else self.gamma
            if self.use_sde:  # log_std may have changed since the last step
                self.actor.reset_noise()
            actions_pi, log_prob = self.actor.action_log_prob(data.observations)
            log_prob = log_prob.reshape(-1, 1)

            # entropy coefficient: tuned against the target entropy, or fixed
            if self.ent_coef_optimizer is not None and self.log_ent_coef is not None:
                ent_coef = th.exp(self.log_ent_coef.detach())
                assert isinstance(self.target_entropy, float)
                ent_coef_loss = -(self.log_ent_coef
                                  * (log_prob + self.target_entropy).detach()).mean()
                ent_coef_losses.append(ent_coef_loss.item())
                ent_coefs.append(ent_coef.item())
                self.ent_coef_optimizer.zero_grad()
                ent_coef_loss.backward()  # type: ignore[no-untyped-call]
                self.ent_coef_optimizer.step()
            else:
                ent_coef = self.ent_coef_tensor
                ent_coefs.append(ent_coef.item())

            with th.no_grad():  # soft clipped double-Q target
                next_actions, next_log_prob = self.actor.action_log_prob(
                    data.next_observations)
                next_q = th.cat(self.critic_target(data.next_observations, next_actions),
                                dim=1).min(dim=1, keepdim=True)[0]
                next_q = next_q - ent_coef * next_log_prob.reshape(-1, 1)
                target_q = data.rewards + (1 - data.dones) * discounts * next_q

            current_q = self.critic(data.observations, data.actions)
            critic_loss = 0.5 * _critic_loss(current_q, target_q, priority)
            critic_losses.append(critic_loss.item())
            self.critic.optimizer.zero_grad()
            critic_loss.backward()  # type: ignore[no-untyped-call]
            self.critic.optimizer.step()
            _feed_back(self, current_q, target_q, priority)

            q_pi = th.cat(self.critic(data.observations, actions_pi), dim=1)
            actor_loss = (ent_coef * log_prob - q_pi.min(dim=1, keepdim=True)[0]).mean()
            actor_losses.append(actor_loss.item())
            self.actor.optimizer.zero_grad()
            actor_loss.backward()  # type: ignore[no-untyped-call]
            self.actor.optimizer.step()

            if step % self.target_update_interval == 0:
                polyak_update(self.critic.parameters(), self.critic_target.parameters(),
                              self.tau)
                polyak_update(self.batch_norm_stats, self.batch_norm_stats_target, 1.0)
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/ent_coef", np.mean(ent_coefs))
        self.logger.record("train/actor_loss", np.mean(actor_losses))
        self.logger.record("train/critic_loss", np.mean(critic_losses))
        if ent_coef_losses:
            self.logger.record("train/ent_coef_loss", np.mean(ent_coef_losses))


class PrioritizedTD3(TD3):
    """SB3's TD3 that trains prioritized replay from a prioritized replaybank buffer::

        PrioritizedTD3("MlpPolicy", "Pendulum-v1", replay_buffer_class=ReplayBuffer,
                       replay_buffer_kwargs={"prioritized": True, "n_steps": 3})

    Each gradient step is SB3 2.9's ``TD3.train`` step (target policy smoothing with
    clipped noise, the clipped double-Q target, n-step ``discounts`` when the buffer
    returns them, the actor and Polyak target updates every ``policy_delay`` updates)
    with, for a prioritized replaybank buffer, the critic loss
    ``sum_i mean_b(w_b * (Q_i(s_b, a_b) - y_b) ** 2)`` (importance weights ``w_b``; the
    actor loss stays an unweighted mean) and the new priorities
    ``max_i |Q_i(s_b, a_b) - y_b|`` after each critic step: the maximum of the twin
    critics' errors, as Fujimoto, Meger & Precup's PER-TD3 (NeurIPS 2020, see
    :class:`PrioritizedSAC`). With any other buffer it trains exactly as
    :class:`stable_baselines3.TD3`, bit for bit under the same seed.

    Example:
        >>> model = PrioritizedTD3("MlpPolicy", "Pendulum-v1", seed=0, learning_starts=50,
        ...                        batch_size=16, policy_kwargs={"net_arch": [8]},
        ...                        replay_buffer_class=ReplayBuffer,
        ...                        replay_buffer_kwargs={"prioritized": True}).learn(60)
        >>> model._n_updates
        10
    """

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate([self.actor.optimizer, self.critic.optimizer])
        actor_losses: list[float] = []
        critic_losses: list[float] = []
        for _ in range(gradient_steps):
            self._n_updates += 1
            data, priority = _draw(self, batch_size)
            discounts = data.discounts if data.discounts is not None else self.gamma
            with th.no_grad():  # smoothed target action, clipped double-Q target
                noise = th.empty_like(data.actions).normal_(0, self.target_policy_noise)
                noise = noise.clamp(-self.target_noise_clip, self.target_noise_clip)
                next_actions = (self.actor_target(data.next_observations) + noise).clamp(-1, 1)
                next_q = th.cat(self.critic_target(data.next_observations, next_actions),
                                dim=1).min(dim=1, keepdim=True)[0]
                target_q = data.rewards + (1 - data.dones) * discounts * next_q

            current_q = self.critic(data.observations, data.actions)
            critic_loss = _critic_loss(current_q, target_q, priority)
            critic_losses.append(critic_loss.item())
            self.critic.optimizer.zero_grad()
            critic_loss.backward()  # type: ignore[no-untyped-call]
            self.critic.optimizer.step()
            _feed_back(self, current_q, target_q, priority)

            if self._n_updates % self.policy_delay == 0:
                obs: Any = data.observations  # a dict too: q1_forward extracts features
                actor_loss = -self.critic.q1_forward(obs, self.actor(obs)).mean()
                actor_losses.append(actor_loss.item())
                self.actor.optimizer.zero_grad()
                actor_loss.backward()  # type: ignore[no-untyped-call]
                self.actor.optimizer.step()
                polyak_update(self.critic.parameters(), self.critic_target.parameters(),
                              self.tau)
                polyak_update(self.actor.parameters(), self.actor_target.parameters(),
                              self.tau)
                polyak_update(self.critic_batch_norm_stats,
                              self.critic_batch_norm_stats_target, 1.0)
                polyak_update(self.actor_batch_norm_stats,
                              self.actor_batch_norm_stats_target, 1.0)
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        if actor_losses:
            self.logger.record("train/actor_loss", np.mean(actor_losses))
        self.logger.record("train/critic_loss", np.mean(critic_losses))
