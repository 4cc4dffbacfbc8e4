"""The on-policy rollout buffer: fixed ``[num_steps, num_envs]`` storage, GAE, minibatches.

Fields are stored as ``[num_steps, num_envs, *shape]`` arrays (spec given or inferred from
the first add; nested dict observations become ``obs/<key>`` fields; any extra keyword,
e.g. ``hidden=`` for recurrent states, is stored as a field too).

GAE (:func:`replaybank.ops.gae.gae`) is exact at episode ends: ``terminated`` steps do not
bootstrap, ``truncated`` steps bootstrap from the value of their true final observation
(``final_value=`` at add time, or ``final_obs=`` plus a ``value_fn`` at compute time), and
the recursion is cut at every episode end. Returns (value targets) are
``advantages + values`` (TD(lambda) returns). GAE runs in float64; the stored advantages
and returns take the dtype of the ``value`` field (store float64 values for float64 results).

Advantage normalisation (``normalize_advantage``): ``"batch"`` (whole rollout),
``"minibatch"`` (per minibatch) or ``None``; ``(adv - mean) / (std + advantage_eps)`` with
the population std (``ddof=0``). Only yielded batches are normalised; :attr:`advantages`
stays raw.

Example:
    >>> import numpy as np
    >>> buf = RolloutBuffer(num_steps=4, num_envs=2, seed=0)
    >>> for t in range(4):
    ...     buf.add(obs=np.zeros((2, 3), np.float32), action=np.array([0, 1]),
    ...             reward=np.ones(2), terminated=np.array([t == 3, False]),
    ...             truncated=np.zeros(2, bool), value=np.zeros(2), log_prob=np.zeros(2))
    >>> buf.full
    True
    >>> buf.compute_returns_and_advantage(last_values=np.zeros(2))
    >>> [b.obs.shape for b in buf.generate_batches(num_mini_batch=2)]
    [(4, 3), (4, 3)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank import persist
from replaybank.batch import Batch, SequenceBatch
from replaybank.buffers.arguments import make_rng, positive_int
from replaybank.buffers.inputs import leading_dims
from replaybank.buffers.rollout.batches import flat_batches, recurrent_batches
from replaybank.buffers.rollout.inputs import (
    ROLLOUT_RESERVED,
    FinalObsStore,
    check_names,
    final_obs_rows,
    per_env_float,
    rollout_spec,
)
from replaybank.buffers.rollout.state import pack_arrays, unpack_state
from replaybank.config import BufferConfig, buffer_config
from replaybank.errors import (
    CapacityError,
    ConfigError,
    EmptyBufferError,
    ShapeError,
    SpecError,
)
from replaybank.ops.gae import Backend, gae
from replaybank.spec import Spec, cast_field, flatten
from replaybank.storage.backends.base import available_memory, check_fits

__all__ = ["RolloutBuffer"]

AnyArray = npt.NDArray[Any]
_NORMS = ("batch", "minibatch", None)


class RolloutBuffer:
    """On-policy storage of ``num_steps`` steps of ``num_envs`` envs, with GAE.

    Args:
        num_steps: Steps per env per rollout ``T``.
        num_envs: Number of parallel envs.
        gamma: Discount factor.
        gae_lambda: GAE lambda.
        spec: Field specs (``{name: (shape, dtype)}`` or a Spec); inferred from the first
            add when None. reward/value/log_prob (float32) and terminated/truncated (bool)
            are added when absent.
        seed: Seed or Generator for minibatch shuffling.
        normalize_advantage: ``"batch"``, ``"minibatch"`` or ``None`` (see module doc).
        advantage_eps: Added to the std when normalising.
        device: Torch device; when given, minibatches are yielded as torch tensors there
            (``Batch.to_torch(device)``). Storage stays numpy.
        backend: GAE backend, ``"auto"``, ``"numpy"`` or ``"numba"``.

    Raises:
        ConfigError: A bad argument.

    Example:
        >>> buf = RolloutBuffer(num_steps=2)
        >>> buf.add(obs=np.zeros(3), action=0, reward=1.0, terminated=False,
        ...         truncated=True, value=0.5, log_prob=-0.7, final_value=2.0)
        >>> buf.add(obs=np.ones(3), action=1, reward=0.0, terminated=False,
        ...         truncated=False, value=0.2, log_prob=-0.7)
        >>> buf.compute_returns_and_advantage(last_values=1.0)
        >>> [round(float(a), 4) for a in buf.advantages[:, 0]]  # step 0 bootstraps from 2.0
        [2.48, 0.79]
    """

    def __init__(
        self,
        num_steps: int,
        num_envs: int = 1,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        spec: Any = None,
        seed: int | np.random.Generator | None = None,
        normalize_advantage: str | None = "batch",
        advantage_eps: float = 1e-8,
        device: Any = None,
        backend: Backend = "auto",
    ) -> None:
        self._num_steps = positive_int("num_steps", num_steps)
        self._num_envs = positive_int("num_envs", num_envs)
        for name, val in (("gamma", gamma), ("gae_lambda", gae_lambda)):
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 <= val <= 1:
                raise ConfigError(f"{name}={val!r}: must be a number in [0, 1]")
        if normalize_advantage not in _NORMS:
            raise ConfigError(
                f"normalize_advantage={normalize_advantage!r}: expected 'batch', "
                "'minibatch' or None"
            )
        if isinstance(advantage_eps, (bool, np.bool_)) \
                or not isinstance(advantage_eps, (int, float, np.integer, np.floating)) \
                or not np.isfinite(advantage_eps) or advantage_eps < 0:
            raise ConfigError(
                f"advantage_eps={advantage_eps!r}: must be a finite number >= 0; pass e.g. "
                "advantage_eps=1e-8"
            )
        # [T, E] bookkeeping (final values, flags) is allocated now: check it fits first
        cells = self._num_steps * self._num_envs
        avail = available_memory()
        if avail is not None and cells * 16 > avail:
            raise CapacityError(
                f"RolloutBuffer(num_steps={self._num_steps}, num_envs={self._num_envs}): "
                f"{cells:,} steps need at least {cells * 16:,} bytes of bookkeeping but only "
                f"{avail:,} bytes of memory are available; lower num_steps or num_envs"
            )
        if backend not in ("auto", "numpy", "numba"):
            raise ConfigError(f"backend={backend!r}: expected 'auto', 'numpy' or 'numba'")
        self.gamma, self.gae_lambda = float(gamma), float(gae_lambda)
        self.normalize_advantage = normalize_advantage
        self.advantage_eps = float(advantage_eps)
        self.device, self.backend = device, backend
        self._seed = int(seed) if isinstance(seed, (int, np.integer)) else None
        self._rng = make_rng(seed)
        self._spec: Spec | None = None
        self._data: dict[str, AnyArray] = {}
        self._pos = 0
        self._final_value = np.full((self._num_steps, self._num_envs), np.nan)  # [T, E]
        self._final_obs: FinalObsStore | None = None  # final obs of truncated steps, no value yet
        self._first_done = np.ones(self._num_envs, dtype=bool)  # an episode starts at step 0
        self._adv: AnyArray | None = None
        self._ret: AnyArray | None = None
        if spec is not None:
            self._allocate(rollout_spec(Spec.coerce(spec)))

    # ------------------------------------------------------------------ properties
    @property
    def num_steps(self) -> int:
        """Steps per env per rollout."""
        return self._num_steps

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
        """Whether ``num_steps`` steps are stored."""
        return self._pos == self._num_steps

    @property
    def spec(self) -> Spec | None:
        """Stored fields (None until the first add when no spec was given)."""
        return self._spec

    @property
    def rng(self) -> np.random.Generator:
        """The shuffling generator."""
        return self._rng

    def __len__(self) -> int:
        return self._pos * self._num_envs

    @property
    def data(self) -> dict[str, AnyArray]:
        """Stored fields as views ``[pos, num_envs, *shape]`` keyed by flat name."""
        return {n: a[: self._pos] for n, a in self._data.items()}

    @property
    def advantages(self) -> AnyArray:
        """Raw (unnormalised) advantages ``[pos, num_envs]``."""
        return self._computed("advantages")[0]

    @property
    def returns(self) -> AnyArray:
        """Value targets ``advantages + values``, ``[pos, num_envs]``."""
        return self._computed("returns")[1]

    def _computed(self, call: str) -> tuple[AnyArray, AnyArray]:
        if self._adv is None or self._ret is None:
            raise EmptyBufferError(
                f"{call}: advantages are not computed for the current data; call "
                "compute_returns_and_advantage(last_values) after the last add"
            )
        return self._adv, self._ret

    # ------------------------------------------------------------------ writing
    def _allocate(self, spec: Spec) -> None:
        shape = (self._num_steps, self._num_envs)
        check_fits(self._num_steps * self._num_envs * spec.nbytes_per_item,
                   f"RolloutBuffer(num_steps={self._num_steps}, num_envs={self._num_envs})")
        self._spec = spec
        self._data = {n: np.zeros((*shape, *f.shape), f.dtype) for n, f in spec.items()}
        self._final_obs = FinalObsStore(spec)

    def add(self, obs: Any, action: Any, reward: Any, terminated: Any, truncated: Any,
            value: Any, log_prob: Any, final_value: Any = None, final_obs: Any = None,
            **extras: Any) -> None:
        """Store one step of every env (values shaped ``[num_envs, *shape]``, or unbatched
        when ``num_envs == 1``).

        Args:
            obs: Observation ``s_t`` (array or nested dict of arrays).
            action: Action taken.
            reward: Reward ``r_t``.
            terminated: The episode ended in a terminal state at this step.
            truncated: The episode was cut by a time limit at this step.
            value: ``V(s_t)``.
            log_prob: Log-probability of the action under the behaviour policy.
            final_value: ``V`` of the true final observation, per env (read only where
                ``truncated & ~terminated``; other entries are ignored and may be NaN).
            final_obs: The true final observation (batched like ``obs``, or one entry per
                env with ``None`` for the others) for truncated envs without a finite
                ``final_value``; valued later by ``compute_returns_and_advantage``'s
                ``value_fn``.
            **extras: Further fields, e.g. recurrent ``hidden`` states (the state fed to
                the policy at this step).

        Raises:
            CapacityError: The rollout is full.
            SpecError, ShapeError, DtypeError: Bad input, or a truncated env has neither a
                final value nor a final observation. The buffer is left unchanged.
        """
        if self._pos >= self._num_steps:
            raise CapacityError(
                f"add: the rollout is full ({self._num_steps} steps x {self._num_envs} envs); call "
                "compute_returns_and_advantage(...), use the batches, then reset()"
            )
        for n in extras:
            if n in ROLLOUT_RESERVED:
                raise SpecError(f"add({n}=...): {n!r} is reserved by RolloutBuffer; rename it")
        fields = {"obs": obs, "action": action, "reward": reward, "terminated": terminated,
                  "truncated": truncated, "value": value, "log_prob": log_prob, **extras}
        spec = self._spec
        if spec is None:
            # with one env, reward (a scalar per env) tells whether values carry the env dim
            lead0 = (self._num_envs,) if self._num_envs > 1 or np.ndim(reward) == 1 else ()
            spec = rollout_spec(Spec.infer(fields, lead0))
        lead = (self._num_envs,) if self._num_envs > 1 \
            else leading_dims(spec, fields, [(), (1,)], "add")
        flat = flatten(fields)
        check_names(spec, flat)
        row = {n: cast_field(n, flat[n], f, lead).reshape((self._num_envs, *f.shape))
               for n, f in spec.items()}
        cut = row["truncated"] & ~row["terminated"]  # [E]
        fv = np.full(self._num_envs, np.nan)
        if final_value is not None:
            fv = per_env_float("final_value", final_value, self._num_envs)
        need = cut & ~np.isfinite(fv)
        fobs: dict[str, AnyArray] = {}
        if need.any():
            if final_obs is None:
                envs = np.flatnonzero(need).tolist()
                raise ShapeError(
                    f"add: envs {envs} were truncated but have no final_value (None or NaN) "
                    "and final_obs=None; truncated steps bootstrap from their final "
                    "observation: pass final_value=V(final_obs), or final_obs= and a "
                    "value_fn to compute_returns_and_advantage (or mark the step terminated)"
                )
            fobs = final_obs_rows(spec, final_obs, need, lead)
        # ---- every check passed: write
        if self._spec is None:
            self._allocate(spec)
        t = self._pos
        for n, arr in row.items():
            self._data[n][t] = arr
        self._final_value[t] = np.where(cut, fv, np.nan)
        if fobs and self._final_obs is not None:
            self._final_obs.append((t * self._num_envs + np.flatnonzero(need)).tolist(), fobs)
        self._pos += 1
        self._adv = self._ret = None

    def reset(self) -> None:
        """Start a new rollout (storage stays allocated; episode-start flags carry over)."""
        if self._pos and self._spec is not None:
            self._first_done = self._data["terminated"][self._pos - 1] | \
                self._data["truncated"][self._pos - 1]
        self._pos = 0
        self._final_value[:] = np.nan
        if self._final_obs is not None:
            self._final_obs.clear()
        self._adv = self._ret = None

    # ------------------------------------------------------------------ GAE
    def compute_returns_and_advantage(
        self, last_values: Any, value_fn: Callable[[Any], Any] | None = None
    ) -> None:
        """Compute GAE advantages and returns over the stored steps (all envs at once).

        Args:
            last_values: ``V(s_T)`` of the observation after the last stored step, per env
                ``[num_envs]`` (a scalar when ``num_envs == 1``). Ignored for envs whose
                last step ended an episode.
            value_fn: Called once with the final observations of the truncated steps that
                were stored with ``final_obs`` (``[k, *obs_shape]``, a dict for dict obs);
                must return ``k`` values.

        Raises:
            EmptyBufferError: Nothing stored.
            ShapeError: ``last_values`` or ``value_fn``'s output has the wrong shape or is
                not finite; final observations are stored but ``value_fn`` is None.
        """
        if self._pos == 0:
            raise EmptyBufferError("compute_returns_and_advantage: the buffer is empty; add steps")
        last = per_env_float("last_values", last_values, self._num_envs)
        if not np.all(np.isfinite(last)):
            raise ShapeError(f"last_values={last.tolist()}: must be finite")
        p = self._pos
        fv = self._final_value[:p].copy()  # [pos, E]
        if self._final_obs is not None and len(self._final_obs):
            fv.reshape(-1)[np.asarray(self._final_obs.index)] = \
                self._final_obs.values(value_fn, self._num_envs)
        d = self._data
        adv = gae(d["reward"][:p], d["value"][:p], d["terminated"][:p], d["truncated"][:p],
                  last, fv, gamma=self.gamma, gae_lambda=self.gae_lambda, backend=self.backend)
        dtype = d["value"].dtype
        self._ret = (adv + d["value"][:p].astype(np.float64)).astype(dtype)
        self._adv = adv.astype(dtype)

    # ------------------------------------------------------------------ batches
    def _emit(self, batch: Any) -> Any:
        return batch if self.device is None else batch.to_torch(self.device)

    def generate_batches(self, num_mini_batch: int | None = None,
                         mini_batch_size: int | None = None,
                         num_epochs: int = 1) -> Iterator[Batch]:
        """Yield shuffled minibatches of single steps over the flat ``[pos * num_envs]`` data.

        Each epoch is a fresh permutation (from the buffer's generator) split so that every
        (step, env) appears exactly once per epoch.

        Args:
            num_mini_batch: Minibatches per epoch (sizes differ by at most one).
            mini_batch_size: Steps per minibatch (the last one may be smaller).
            num_epochs: Passes over the data.

        Returns:
            An iterator of :class:`~replaybank.batch.Batch` with every stored field
            ``[B, *shape]``, ``advantages`` (normalised per ``normalize_advantage``),
            ``returns`` and ``indices`` (flat ``t * num_envs + env``).

        Raises:
            ConfigError: Not exactly one size given, or a bad count (raised at the call).
            EmptyBufferError: Advantages not computed, or more minibatches than steps.
        """
        adv, ret = self._computed("generate_batches")
        return flat_batches(self.data, adv, ret, self._rng, num_mini_batch, mini_batch_size,
                            num_epochs, self.normalize_advantage, self.advantage_eps,
                            self._emit)

    def recurrent_generator(self, num_mini_batch: int | None = None,
                            mini_batch_size: int | None = None,
                            chunk_length: int | None = None, num_epochs: int = 1,
                            hidden_fields: Any = None) -> Iterator[SequenceBatch]:
        """Yield shuffled minibatches of time-ordered chunks for recurrent policies.

        Every env's timeline is cut into chunks of ``chunk_length`` consecutive steps
        (default: the whole rollout); minibatches are sets of whole chunks, and every
        (step, env) appears exactly once per epoch. A short last chunk is zero-padded
        with ``mask`` False.

        Args:
            num_mini_batch: Minibatches per epoch (counted in chunks).
            mini_batch_size: Chunks per minibatch.
            chunk_length: Steps per chunk ``L``.
            num_epochs: Passes over the data.
            hidden_fields: Names of recurrent-state fields (a name selects its nested
                sub-fields too); default: the ``hidden`` field(s), if stored.

        Returns:
            An iterator of :class:`~replaybank.batch.SequenceBatch`: stored fields
            ``[B, L, *shape]`` except hidden fields, which are ``[B, *shape]`` (the state
            stored at each chunk's first step); ``advantages``, ``returns``, ``indices``
            (flat, -1 on padding) ``[B, L]``; ``mask`` (valid), ``is_first`` (an episode
            starts here: reset the recurrent state), ``is_last`` (last valid step of its
            episode in the chunk), ``is_terminal``, ``burn_in`` (all False) ``[B, L]``
            bool; ``starts`` (flat index of each chunk's first step) ``[B]``.

        Raises:
            ConfigError, EmptyBufferError: As :meth:`generate_batches`.
            SpecError: An unknown hidden field.
        """
        adv, ret = self._computed("recurrent_generator")
        return recurrent_batches(self.data, adv, ret, self._first_done, self._rng,
                                 num_mini_batch, mini_batch_size, chunk_length, num_epochs,
                                 hidden_fields, self.normalize_advantage, self.advantage_eps,
                                 self._emit)

    # ------------------------------------------------------------------ state
    def init_config(self) -> dict[str, Any]:
        """Constructor arguments (JSON-able) that rebuild an equivalent empty buffer.

        Example:
            >>> RolloutBuffer(8, num_envs=2, seed=3).init_config()["seed"]
            3
        """
        return {
            "num_steps": self._num_steps, "num_envs": self._num_envs, "gamma": self.gamma,
            "gae_lambda": self.gae_lambda,
            "spec": None if self._spec is None else self._spec.to_json(),
            "seed": self._seed, "normalize_advantage": self.normalize_advantage,
            "advantage_eps": self.advantage_eps,
            "device": None if self.device is None else str(self.device),
            "backend": self.backend,
        }

    def config(self) -> BufferConfig:
        """A validated config model (pydantic) that rebuilds an equivalent empty buffer.

        Example:
            >>> RolloutBuffer(8, num_envs=2, seed=3).config().type
            'RolloutBuffer'
        """
        return buffer_config(self)

    def save(self, dirpath: Any, prefix: str = "buffer_") -> None:
        """Write ``<prefix>metadata.json`` and ``<prefix>state.safetensors`` atomically.

        Restore with :func:`replaybank.load`.
        """
        persist.save(self, dirpath, prefix=prefix)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to restore this buffer exactly.

        Returns:
            ``{"metadata", "init", "rng", "arrays"}``: JSON-able metadata (type, sizes,
            ``pos``, spec), constructor args, generator state, and numpy arrays
            (``fields/<name>``, ``final_value``, ``first_done``, ``final_obs/index``,
            ``final_obs/<obs field>``, and ``advantages``/``returns`` once computed).
        """
        arrays = pack_arrays(self._data, self._final_value, self._first_done, self._final_obs,
                             self._adv, self._ret)
        return {
            "metadata": self.metadata(),
            "init": self.init_config(),
            "rng": dict(self._rng.bit_generator.state),
            "arrays": arrays,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` (copies the arrays).

        Raises:
            CheckpointError: Sizes or spec differ, or arrays are missing or misshaped
                (the buffer is then left unchanged).
        """
        parsed = unpack_state(state, self._num_steps, self._num_envs, self._spec,
                              type(self._rng.bit_generator))
        self._spec, self._data, self._final_obs = parsed.spec, parsed.fields, parsed.fobs
        self._pos = parsed.pos
        self._final_value, self._first_done = parsed.final_value, parsed.first_done
        self._adv, self._ret = parsed.adv, parsed.ret
        self._rng.bit_generator.state = state["rng"]

    def metadata(self) -> dict[str, Any]:
        """JSON-able description: type, sizes, ``pos``, spec."""
        return {"type": type(self).__name__, "num_steps": self._num_steps,
                "num_envs": self._num_envs,
                "pos": self._pos, "spec": None if self._spec is None else self._spec.to_json()}

    def __repr__(self) -> str:
        return (f"RolloutBuffer(num_steps={self._num_steps}, num_envs={self._num_envs}, "
                f"pos={self._pos}, "
                f"gamma={self.gamma}, gae_lambda={self.gae_lambda})")

