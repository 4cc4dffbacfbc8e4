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

NEXT_STEP autoreset (``autoreset_mode="next_step"``, for gymnasium vector envs in their
default ``AutoresetMode.NEXT_STEP``, filled by the usual loop that adds every step and sets
``obs = next_obs``): after an env's episode ends at step ``t``, its step ``t + 1`` is a
*reset step*: ``obs`` is the final observation of the ended episode, the action was
ignored, reward 0, no episode end. The buffer

* stores reset steps but marks them invalid (:attr:`valid`): no minibatch yields them,
  their advantage is 0 and their return their stored value, and they enter no other step's
  GAE (the episode end at ``t`` cuts the recursion, and the reset step's own reward and
  value are not read by any valid step);
* lets a truncated step go without ``final_value``: it bootstraps from the ``value``
  added at its reset step (``V(final obs)``), or, when the truncated step is the last one
  of the rollout, from ``last_values`` (in this loop ``last_values = V(obs)`` evaluates
  the final observation). An explicit finite ``final_value`` (or ``final_obs`` +
  ``value_fn``) still wins;
* remembers per env whether its last add ended an episode, across :meth:`reset`, in
  :meth:`state_dict` and through pickling, so a rollout can start with a reset step.

The first add of a new buffer is never a reset step (it follows ``envs.reset()``).

Threads: the buffer serves one thread at a time (:mod:`replaybank.buffers.one_thread`).
A call made while another thread's call runs raises
:class:`~replaybank.errors.ConcurrentCallError` and changes nothing; handing the buffer
to another thread between calls (a collector fills it, the learner trains on it) is fine.
A minibatch generator resumed after the rollout changed (``for b in
buf.generate_batches(...): buf.reset()``, or an ``add`` between two batches, from any
thread) raises :class:`~replaybank.errors.BufferChangedError` instead of yielding steps
of another rollout (:mod:`replaybank.buffers.rollout.current`).

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

import math
import typing
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import numpy as np
import numpy.typing as npt

from replaybank import persist
from replaybank.batch import Batch, SequenceBatch
from replaybank.buffers.arguments import make_rng, positive_int, unit_number
from replaybank.buffers.autoreset import check_autoreset_mode
from replaybank.buffers.inputs import leading_dims
from replaybank.buffers.one_thread import ThreadCheck, one_thread_call
from replaybank.buffers.rollout.autoreset import next_step_bootstrap, reset_mask
from replaybank.buffers.rollout.batches import flat_batches, recurrent_batches
from replaybank.buffers.rollout.current import while_current
from replaybank.buffers.rollout.inputs import (
    ROLLOUT_RESERVED,
    FinalObsStore,
    check_names,
    final_obs_rows,
    per_env_float,
    rollout_spec,
)
from replaybank.buffers.rollout.rollout_state import pack_arrays, unpack_state
from replaybank.errors import (
    CapacityError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    ShapeError,
    SpecError,
    describe,
)
from replaybank.ops.gae import Backend, gae
from replaybank.spec import UNSET, Spec, flatten
from replaybank.storage.backends.base import available_memory, check_fits

if TYPE_CHECKING:  # pydantic loads with the first config() call; torch is optional
    import torch
    from typing_extensions import TypeVar as DefaultTypeVar

    from replaybank.config import BufferConfig

    #: What the minibatches hold: numpy arrays, or torch tensors on ``device=`` (a bare
    #: ``RolloutBuffer`` annotation: either, ``RolloutBuffer[Any]``).
    V = DefaultTypeVar("V", default=Any)
else:  # a TypeVar default is for type checkers (typing.TypeVar takes it from Python 3.13)
    V = typing.TypeVar("V")

__all__ = ["RolloutBuffer"]

#: The values every :meth:`RolloutBuffer.add` takes, in its order.
_STEP_ARGS = ("obs", "action", "reward", "terminated", "truncated", "value", "log_prob")

AnyArray = npt.NDArray[Any]
_B = TypeVar("_B")
_NORMS = ("batch", "minibatch", None)


class RolloutBuffer(Generic[V]):
    """On-policy storage of ``num_steps`` steps of ``num_envs`` envs, with GAE.

    Args:
        num_steps: Steps per env per rollout ``T``.
        num_envs: Number of parallel envs.
        gamma: Discount factor.
        gae_lambda: GAE lambda.
        spec: Field specs (``{name: (shape, dtype)}`` or a Spec); inferred from the first
            add when None, keeping the dtypes given there (float64 rewards, values and
            log-probs stay float64, so GAE runs in the precision the caller chose; pass
            ``spec=`` or float32 values for float32 storage). reward/value/log_prob
            (float32) and terminated/truncated (bool) are added when absent.
        seed: Seed or Generator for minibatch shuffling.
        normalize_advantage: ``"batch"``, ``"minibatch"`` or ``None`` (see module doc).
        advantage_eps: Added to the std when normalising.
        device: Torch device; when given, minibatches are yielded as torch tensors there
            (``Batch.to_torch(device)``). Storage stays numpy.
        backend: GAE backend, ``"auto"``, ``"numpy"`` or ``"numba"``.
        autoreset_mode: How the envs reset finished episodes: ``None``, ``"same_step"`` or
            ``"disabled"``
            (every added step is a transition: SAME_STEP vector envs, or envs reset by
            hand) or ``"next_step"`` (gymnasium's default vector-env autoreset: the step
            after each episode end is a reset step; see the module doc).

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

    # The overloads tell a type checker what the minibatches hold, from device=: numpy
    # arrays without a device, torch tensors with one (given by keyword), either (Any)
    # for a value only known when the program runs.
    @overload
    def __init__(
        self: RolloutBuffer[npt.NDArray[Any]],
        num_steps: int,
        num_envs: int = 1,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        spec: Any = None,
        seed: int | np.random.Generator | None = None,
        normalize_advantage: str | None = "batch",
        advantage_eps: float = 1e-8,
        device: None = None,
        backend: Backend = "auto",
        autoreset_mode: str | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: RolloutBuffer[torch.Tensor],
        num_steps: int,
        num_envs: int = 1,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        spec: Any = None,
        seed: int | np.random.Generator | None = None,
        normalize_advantage: str | None = "batch",
        advantage_eps: float = 1e-8,
        *,
        device: str | int | torch.device,
        backend: Backend = "auto",
        autoreset_mode: str | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: RolloutBuffer[Any],
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
        autoreset_mode: str | None = None,
    ) -> None: ...

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
        autoreset_mode: str | None = None,
    ) -> None:
        self._num_steps = positive_int("num_steps", num_steps)
        self._num_envs = positive_int("num_envs", num_envs)
        gamma = unit_number("gamma", gamma, 0.99)
        gae_lambda = unit_number("gae_lambda", gae_lambda, 0.95)
        if not (normalize_advantage is None or isinstance(normalize_advantage, str)) \
                or normalize_advantage not in _NORMS:
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
        if not isinstance(backend, str) or backend not in ("auto", "numpy", "numba"):
            raise ConfigError(f"backend={backend!r}: expected 'auto', 'numpy' or 'numba'")
        self.autoreset_mode = check_autoreset_mode(autoreset_mode)
        self._next_step = self.autoreset_mode == "next_step"
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
        # next_step mode: the env's last add before this rollout ended an episode, so its
        # step 0 here is a reset step (the first add ever follows envs.reset(): False)
        self._start_reset = np.zeros(self._num_envs, dtype=bool)  # [E]
        self._adv: AnyArray | None = None
        self._ret: AnyArray | None = None
        self._plain: Any = None  # see _plain_format
        self.thread_check = ThreadCheck("RolloutBuffer")
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

    @property
    def first_done(self) -> AnyArray:
        """``[num_envs]`` bool: whether each env's step 0 of this rollout begins an
        episode (no rollout came before, or the one before ended an episode there); a copy.

        Example:
            >>> buf = RolloutBuffer(2, num_envs=2)
            >>> for t in range(2):
            ...     buf.add(obs=np.zeros((2, 1)), action=[0, 0], reward=[1.0, 1.0],
            ...             terminated=[t == 1, False], truncated=[False, False],
            ...             value=[0.0, 0.0], log_prob=[0.0, 0.0])
            >>> buf.reset()
            >>> buf.first_done.tolist()  # env 0 ended the last rollout's episode
            [True, False]
        """
        out: AnyArray = self._first_done.copy()
        return out

    @property
    def valid(self) -> AnyArray:
        """``[pos, num_envs]`` bool: False at NEXT_STEP reset steps (never yielded by the
        generators), True everywhere else (always, unless ``autoreset_mode="next_step"``).

        Example:
            >>> buf = RolloutBuffer(3, autoreset_mode="next_step")
            >>> for t in range(3):
            ...     buf.add(obs=np.zeros(2), action=0, reward=1.0, terminated=t == 0,
            ...             truncated=False, value=0.0, log_prob=0.0)
            >>> buf.valid[:, 0].tolist()  # step 1: the reset step after the end at step 0
            [True, False, True]
        """
        if not self._next_step:
            return np.ones((self._pos, self._num_envs), dtype=bool)
        return ~self._resets()

    def _resets(self) -> AnyArray:
        """``[pos, num_envs]`` bool, the NEXT_STEP reset steps (next_step mode only)."""
        if self._spec is None:
            return np.zeros((self._pos, self._num_envs), dtype=bool)
        d, p = self._data, self._pos
        return reset_mask(d["terminated"][:p] | d["truncated"][:p], self._start_reset)

    def _ended(self) -> AnyArray:
        """``[num_envs]`` bool: the env's newest add ended an episode (so its next add is
        a NEXT_STEP reset step). A reset step never ends one."""
        if self._pos == 0 or self._spec is None:
            start: AnyArray = self._start_reset.copy()
            return start
        t = self._pos - 1
        ended: AnyArray = self._data["terminated"][t] | self._data["truncated"][t]
        return ended

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

    def add(self, obs: Any = UNSET, action: Any = UNSET, reward: Any = UNSET,
            terminated: Any = UNSET, truncated: Any = UNSET, value: Any = UNSET,
            log_prob: Any = UNSET, final_value: Any = None, final_obs: Any = None,
            **extras: Any) -> None:
        """Store one step of every env (values shaped ``[num_envs, *shape]``, or unbatched
        when ``num_envs == 1``).

        Args:
            obs: Observation ``s_t`` (array or nested dict of arrays).
            action: Action taken.
            reward: Reward ``r_t``.
            terminated: The episode ended in a terminal state at this step.
            truncated: The episode was cut by a time limit at this step.
            value: ``V(s_t)``, finite (except at a NEXT_STEP reset step).
            log_prob: Log-probability of the action under the behaviour policy.
            final_value: ``V`` of the true final observation, per env (read only where
                ``truncated & ~terminated``; other entries are ignored and may be NaN).
                Optional with ``autoreset_mode="next_step"`` (see the module doc).
            final_obs: The true final observation (batched like ``obs``, or one entry per
                env with ``None`` for the others) for truncated envs without a finite
                ``final_value``; valued later by ``compute_returns_and_advantage``'s
                ``value_fn``. Optional with ``autoreset_mode="next_step"``; when given,
                it must cover every such env.
            **extras: Further fields, e.g. recurrent ``hidden`` states (the state fed to
                the policy at this step).

        Raises:
            CapacityError: The rollout is full.
            SpecError: One of ``obs`` .. ``log_prob`` is missing (``done=`` is not a field:
                pass ``terminated=`` and ``truncated=``).
            SpecError, ShapeError, DtypeError: Bad input, or a truncated env has neither a
                final value nor a final observation (unless ``autoreset_mode=
                "next_step"``), or (``"next_step"``) a reset step is marked terminated or
                truncated. The buffer is left unchanged.
            DtypeError: A ``value`` is NaN or infinite (GAE reads it; with
                ``autoreset_mode="next_step"`` a reset step's value may be anything), or a
                ``final_value`` read (truncated, not terminated) is infinite.
            ConcurrentCallError: Another thread's call on the buffer is under way.
        """
        check = self.thread_check
        entered = check.enter("add")
        try:
            if not extras and final_value is None and final_obs is None \
                    and self._pos < self._num_steps \
                    and self._add_plain((obs, action, reward, terminated, truncated, value,
                                         log_prob)):
                return
            self._add_checked(obs, action, reward, terminated, truncated, value, log_prob,
                              final_value, final_obs, extras)
        finally:
            check.leave(entered)

    def _add_checked(self, obs: Any, action: Any, reward: Any, terminated: Any,
                     truncated: Any, value: Any, log_prob: Any, final_value: Any,
                     final_obs: Any, extras: dict[str, Any]) -> None:
        """:meth:`add` for what the plain path did not take: every check, then the write."""
        missing = [n for n, v in zip(_STEP_ARGS, (obs, action, reward, terminated, truncated,
                                                    value, log_prob), strict=True)
                   if v is UNSET]
        if missing:
            hint = "; done= is not a field: pass terminated= and truncated= (done = " \
                "terminated | truncated)" if "done" in extras else ""
            raise SpecError(f"add: missing {', '.join(missing)}{hint}; every step takes "
                            f"{', '.join(_STEP_ARGS)}")
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
        row = {n: f.cast(n, flat[n], lead).reshape((self._num_envs, *f.shape))
               for n, f in spec.items()}
        self._check_values(row["value"], value)
        cut = row["truncated"] & ~row["terminated"]  # [E]
        fv = np.full(self._num_envs, np.nan)
        if final_value is not None:
            fv = per_env_float("final_value", final_value, self._num_envs)
            _check_final_values(fv, cut, final_value)
        need = cut & ~np.isfinite(fv)
        if self._next_step:
            self._check_reset_step(row)
            if final_obs is None:  # bootstraps from the next step's value (module doc)
                need[:] = False
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

    def _plain_format(self) -> _PlainFormat | None:
        """What :meth:`_add_plain` accepts for the current spec: per standard field its
        name, dtype, item shape and batched shape, and ``[num_envs]`` ones of the value
        dtype (its finiteness check) (None: every add takes the checked path: no storage
        yet, nested observations or extra fields, ``next_step`` mode)."""
        fmt: _PlainFormat | None = self._plain
        spec = self._spec
        if fmt is not None and fmt[0] is spec:
            return fmt
        self._plain = None
        if spec is None or self._next_step or set(spec) != set(_PLAIN_FIELDS):
            return None
        n = self._num_envs
        entries = [(name, spec[name].dtype, spec[name].shape, (n, *spec[name].shape))
                   for name in _PLAIN_FIELDS]
        self._plain = fmt = (spec, entries, np.ones(n, spec["value"].dtype))
        return fmt

    def _add_plain(self, values: tuple[Any, ...]) -> bool:
        """Write one step given in exactly the stored format, with no final values:
        numpy arrays of the stored dtype shaped ``[num_envs, *shape]`` (one env: also the
        item shape), or, with one env, Python scalars of the field's kind (float, int in
        range, bool) for scalar fields. Returns False before writing anything when a value
        is not like that, a ``value`` may not be finite, or a step is truncated without
        being terminated (it needs a final value): the checked path then takes the call.
        Writes exactly what it would."""
        fmt = self._plain_format()
        if fmt is None:
            return False
        one = self._num_envs == 1
        for (_, dtype, shape, batched), v in zip(fmt[1], values, strict=True):
            if type(v) is np.ndarray:
                if v.dtype != dtype or (v.shape != batched and not (one and v.shape == shape)):
                    return False
                if dtype.kind == "b" and v.size and v.view(np.uint8).max() > 1:
                    return False  # bool bytes other than 0/1: the checked path stores 0/1
            elif not (one and not shape and _plain_scalar(v, dtype)):
                return False
        # GAE reads the value: NaN or inf goes to the checked path, which refuses what is
        # not finite as stored (so do a float too large for float32 storage and values
        # whose sum overflows, which it may accept). The sum is one dot with ones.
        val = values[5]
        if type(val) is float or val.ndim == 0:
            if not -_F32_MAX < val < _F32_MAX:  # (NaN fails both)
                return False
        elif not math.isfinite(val.dot(fmt[2])):
            return False
        term, trunc = values[3], values[4]
        if trunc is True:  # a truncated step needs its final value: the checked path asks
            if term is not True:
                return False
        elif trunc is not False and (trunc & ~np.asarray(term)).any():
            return False
        t = self._pos
        data = self._data
        for (name, _, _, _), v in zip(fmt[1], values, strict=True):
            data[name][t] = v
        self._final_value[t] = np.nan
        self._pos = t + 1
        self._adv = self._ret = None
        return True

    def _check_values(self, stored: AnyArray, given: Any) -> None:
        """Refuse a NaN or infinite ``value`` (as stored, ``[num_envs]``): GAE reads every
        value of a valid step, so one would make every normalised advantage NaN. With
        ``autoreset_mode="next_step"`` a reset step's value is not checked here: no valid
        step reads it, unless it bootstraps the truncated step before it, which
        ``compute_returns_and_advantage`` checks."""
        bad = ~np.isfinite(stored)  # [E]
        if not bad.any():
            return
        if self._next_step:
            bad &= ~self._ended()  # reset steps
            if not bad.any():
                return
        envs = np.flatnonzero(bad)
        raise DtypeError(
            f"add(value={describe(given)}): values {stored[envs[:4]].tolist()} of env(s) "
            f"{envs[:4].tolist()}{', ...' if len(envs) > 4 else ''} are NaN or infinite "
            f"(stored as {stored.dtype}); GAE reads every stored value (V(s_t) enters the "
            "advantages of the whole rollout): pass finite values, e.g. critic(obs)"
        )

    def _check_reset_step(self, row: dict[str, AnyArray]) -> None:
        """next_step mode: refuse an add that ends an episode at a reset step."""
        bad = self._ended() & (row["terminated"] | row["truncated"])  # [E]
        if bad.any():
            envs = np.flatnonzero(bad).tolist()
            raise ShapeError(
                f"add: envs {envs} ended an episode at their previous step, so this is their "
                "NEXT_STEP reset step, but terminated/truncated is True; with gymnasium's "
                "NEXT_STEP autoreset a reset step never ends an episode. If the envs reset "
                "in the same step (AutoresetMode.SAME_STEP, or by hand), build the buffer "
                "with autoreset_mode='same_step'"
            )

    @one_thread_call("reset")
    def reset(self) -> None:
        """Start a new rollout (storage stays allocated; episode-start flags and, with
        ``autoreset_mode="next_step"``, the pending reset steps carry over)."""
        if self._pos and self._spec is not None:
            last = self._pos - 1
            ended = self._data["terminated"][last] | self._data["truncated"][last]
            self._first_done = ended
            if self._next_step:  # the step after a reset step starts an episode too
                self._first_done = ended | self._resets()[last]
                self._start_reset = ended.copy()
        self._pos = 0
        self._final_value[:] = np.nan
        if self._final_obs is not None:
            self._final_obs.clear()
        self._adv = self._ret = None

    # ------------------------------------------------------------------ GAE
    @one_thread_call("compute_returns_and_advantage")
    def compute_returns_and_advantage(
        self, last_values: Any, value_fn: Callable[[Any], Any] | None = None
    ) -> None:
        """Compute GAE advantages and returns over the stored steps (all envs at once).

        Args:
            last_values: ``V(s_T)`` of the observation after the last stored step, per env
                ``[num_envs]`` (a scalar when ``num_envs == 1``). Ignored for envs whose
                last step ended an episode, except with ``autoreset_mode="next_step"``
                where an env whose last step was truncated (without ``final_value``)
                bootstraps from it: there the observation after that step is the final
                observation.
            value_fn: Called once with the final observations of the truncated steps that
                were stored with ``final_obs`` (``[k, *obs_shape]``, a dict for dict obs);
                must return ``k`` values.

        Raises:
            EmptyBufferError: Nothing stored.
            DtypeError: ``last_values`` or ``value_fn``'s output is not real numbers
                (strings, also numbers as text, None, complex values) or holds NaN or
                infinite values (the message lists them and where they are);
                (``"next_step"``) the value a truncated step bootstraps from is not finite.
            ShapeError: ``last_values`` or ``value_fn``'s output has the wrong shape;
                final observations are stored but ``value_fn`` is None.
        """
        if self._pos == 0:
            raise EmptyBufferError("compute_returns_and_advantage: the buffer is empty; add steps")
        last = per_env_float("last_values", last_values, self._num_envs)
        bad_envs = np.flatnonzero(~np.isfinite(last))
        if bad_envs.size:
            raise DtypeError(
                f"compute_returns_and_advantage(last_values={describe(last.tolist())}): "
                f"values {last[bad_envs].tolist()} of env(s) {bad_envs.tolist()} are NaN or "
                "infinite; pass finite values: V of each env's observation after its last "
                "step (e.g. critic(next_obs)), any finite number such as 0.0 where that "
                "step ended the episode"
            )
        p = self._pos
        fv = self._final_value[:p].copy()  # [pos, E]
        if self._final_obs is not None and len(self._final_obs):
            fv.reshape(-1)[np.asarray(self._final_obs.index)] = \
                self._final_obs.values(value_fn, self._num_envs)
        d = self._data
        rew, val = d["reward"][:p], d["value"][:p]  # [pos, E]
        term, trunc = d["terminated"][:p], d["truncated"][:p]  # [pos, E]
        if self._next_step:
            resets = self._resets()  # [pos, E]
            missing = trunc & ~term & ~np.isfinite(fv)
            boot = next_step_bootstrap(val, last, missing)  # [pos, E], NaN where not missing
            bad = missing & ~np.isfinite(boot)
            if bad.any():
                t, e = (int(i) for i in np.argwhere(bad)[0])
                raise DtypeError(
                    f"compute_returns_and_advantage: truncated step {t} of env {e} bootstraps "
                    f"from V(final obs) = value added at step {t + 1} (its NEXT_STEP reset "
                    f"step), which is {float(boot[t, e])}, not finite; pass a finite value "
                    "there, or final_value= when adding the truncated step"
                )
            fv = np.where(missing, boot, fv)
            # a reset step is made a zero-reward terminal step of value 0: its advantage is
            # exactly 0 and nothing of it (not even a NaN value) reaches a valid step
            rew, val = np.where(resets, 0.0, rew), np.where(resets, 0.0, val)
            term, trunc = term | resets, trunc & ~resets
        adv = gae(rew, val, term, trunc, last, fv, gamma=self.gamma,
                  gae_lambda=self.gae_lambda, backend=self.backend)
        dtype = d["value"].dtype
        self._ret = (adv + d["value"][:p].astype(np.float64)).astype(dtype)
        self._adv = adv.astype(dtype)

    # ------------------------------------------------------------------ batches
    def _emit(self, batch: Any) -> Any:
        return batch if self.device is None else batch.to_torch(self.device)

    @one_thread_call("generate_batches")
    def generate_batches(self, num_mini_batch: int | None = None,
                         mini_batch_size: int | None = None,
                         num_epochs: int = 1) -> Iterator[Batch[V]]:
        """Yield shuffled minibatches of single steps over the flat ``[pos * num_envs]`` data.

        Each epoch is a fresh permutation (from the buffer's generator) split so that every
        (step, env) appears exactly once per epoch. With ``autoreset_mode="next_step"`` only
        the valid steps (:attr:`valid`, ``n = valid.sum()``, which varies from rollout to
        rollout) are permuted and split; reset steps are never yielded.

        Args:
            num_mini_batch: Minibatches per epoch: ``n`` split into parts whose sizes differ
                by at most one, larger ones first (``n % k`` parts of ``n // k + 1``).
            mini_batch_size: Steps per minibatch (the last one gets the remainder
                ``n % mini_batch_size`` when that is not 0).
            num_epochs: Passes over the data.

        Returns:
            An iterator of :class:`~replaybank.batch.Batch` with every stored field
            ``[B, *shape]``, ``advantages`` (normalised per ``normalize_advantage``),
            ``returns`` and ``indices`` (flat ``t * num_envs + env``).

        Raises:
            ConfigError: Not exactly one size given, or a bad count (raised at the call).
            EmptyBufferError: Advantages not computed, or more minibatches than steps.
            BufferChangedError: At a ``next()`` after the rollout changed (an ``add``,
                ``reset``, or new advantages since the call): use the batches before
                changing the buffer.
        """
        adv, ret = self._computed("generate_batches")
        batches = flat_batches(self.data, adv, ret, self._rng, num_mini_batch,
                               mini_batch_size, num_epochs, self.normalize_advantage,
                               self.advantage_eps, self._emit, self._valid_or_none())
        return self.thread_check.iterate("generate_batches", self._while_current(
            batches, adv, "generate_batches"))

    def _while_current(self, batches: Iterator[_B], adv: AnyArray, call: str
                       ) -> Iterator[_B]:
        """``batches`` until the rollout changes (see :mod:`.current`)."""
        return while_current(batches, adv, lambda: self._adv, "RolloutBuffer", call)

    def _valid_or_none(self) -> AnyArray | None:
        return ~self._resets() if self._next_step else None

    @one_thread_call("recurrent_generator")
    def recurrent_generator(self, num_mini_batch: int | None = None,
                            mini_batch_size: int | None = None,
                            chunk_length: int | None = None, num_epochs: int = 1,
                            hidden_fields: Any = None) -> Iterator[SequenceBatch[V]]:
        """Yield shuffled minibatches of time-ordered chunks for recurrent policies.

        Every env's timeline is cut into chunks of ``chunk_length`` consecutive steps
        (default: the whole rollout); minibatches are sets of whole chunks, and every
        (step, env) appears exactly once per epoch. A short last chunk is zero-padded
        with ``mask`` False. With ``autoreset_mode="next_step"``, reset steps keep their
        place in time but read like padding (``mask`` False, ``indices`` -1, zeroed), the
        step after one is ``is_first``, and chunks holding only reset steps are dropped.

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
            ConfigError, EmptyBufferError, BufferChangedError: As
                :meth:`generate_batches`.
            SpecError: An unknown hidden field.
        """
        adv, ret = self._computed("recurrent_generator")
        chunks = recurrent_batches(self.data, adv, ret, self._first_done, self._rng,
                                   num_mini_batch, mini_batch_size, chunk_length, num_epochs,
                                   hidden_fields, self.normalize_advantage,
                                   self.advantage_eps, self._emit, self._valid_or_none())
        return self.thread_check.iterate("recurrent_generator", self._while_current(
            chunks, adv, "recurrent_generator"))

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
            "backend": self.backend, "autoreset_mode": self.autoreset_mode,
        }

    def config(self) -> BufferConfig:
        """A validated config model (pydantic) that rebuilds an equivalent empty buffer.

        Example:
            >>> RolloutBuffer(8, num_envs=2, seed=3).config().type
            'RolloutBuffer'
        """
        from replaybank.config import buffer_config

        return buffer_config(self)

    def exclusive(self) -> AbstractContextManager[None]:
        """A block in which another thread's call on the buffer is refused
        (``ConcurrentCallError``) while this thread's calls run as usual; ``rb.save``
        holds it while it writes.

        Example:
            >>> buf = RolloutBuffer(4)
            >>> with buf.exclusive():
            ...     state = buf.state_dict()
        """
        return self.thread_check.section("exclusive")

    @one_thread_call("save")
    def save(self, dirpath: Any, prefix: str = "buffer_") -> None:
        """Write ``<prefix>metadata.json`` and ``<prefix>state.safetensors`` atomically.

        Restore with :func:`replaybank.load`.
        """
        persist.save(self, dirpath, prefix=prefix)

    @one_thread_call("state_dict")
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to restore this buffer exactly.

        Returns:
            ``{"metadata", "init", "rng", "arrays"}``: JSON-able metadata (type, sizes,
            ``pos``, spec), constructor args, generator state, and numpy arrays
            (``fields/<name>``, ``final_value``, ``first_done``, ``final_obs/index``,
            ``final_obs/<obs field>``, ``advantages``/``returns`` once computed, and
            ``start_reset`` with ``autoreset_mode="next_step"``).
        """
        arrays = pack_arrays(self._data, self._final_value, self._first_done, self._final_obs,
                             self._adv, self._ret,
                             self._start_reset if self._next_step else None)
        return {
            "metadata": self.metadata(),
            "init": self.init_config(),
            "rng": dict(self._rng.bit_generator.state),
            "arrays": arrays,
        }

    @one_thread_call("load_state_dict")
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` (copies the arrays).

        Raises:
            CheckpointError: Sizes, spec or ``autoreset_mode`` differ, or arrays are
                missing or misshaped (the buffer is then left unchanged).
        """
        parsed = unpack_state(state, self._num_steps, self._num_envs, self._spec,
                              type(self._rng.bit_generator), self.autoreset_mode)
        self._spec, self._data, self._final_obs = parsed.spec, parsed.fields, parsed.fobs
        self._pos = parsed.pos
        self._final_value, self._first_done = parsed.final_value, parsed.first_done
        self._adv, self._ret = parsed.adv, parsed.ret
        self._start_reset = parsed.start_reset
        self._rng.bit_generator.state = state["rng"]

    def metadata(self) -> dict[str, Any]:
        """JSON-able description: type, sizes, ``pos``, spec, ``autoreset_mode``."""
        return {"type": type(self).__name__, "num_steps": self._num_steps,
                "num_envs": self._num_envs, "autoreset_mode": self.autoreset_mode,
                "pos": self._pos, "spec": None if self._spec is None else self._spec.to_json()}

    def __repr__(self) -> str:
        return (f"RolloutBuffer(num_steps={self._num_steps}, num_envs={self._num_envs}, "
                f"pos={self._pos}, "
                f"gamma={self.gamma}, gae_lambda={self.gae_lambda})")


#: A spec and, per standard field, its name, dtype, item shape and batched shape.
_PlainFormat = tuple[Spec, list[tuple[str, "np.dtype[Any]", tuple[int, ...], tuple[int, ...]]],
                     AnyArray]

def _check_final_values(fv: npt.NDArray[np.float64], cut: AnyArray, given: Any) -> None:
    """Refuse an infinite ``final_value`` where it is read (truncated, not terminated
    envs); NaN there means "none given" (a final observation or the NEXT_STEP reset step
    stands in)."""
    bad = cut & np.isinf(fv)  # [E]
    if bad.any():
        envs = np.flatnonzero(bad)
        raise DtypeError(
            f"add(final_value={describe(given)}): values {fv[envs[:4]].tolist()} of "
            f"truncated env(s) {envs[:4].tolist()}{', ...' if len(envs) > 4 else ''} are "
            "infinite; pass a finite V(final obs) (or NaN/None there with final_obs= and a "
            "value_fn to compute_returns_and_advantage)"
        )


#: Below the largest float32 (a Python float within it stays finite in any float field).
_F32_MAX = 3.4e38
#: The fields of a plain rollout add, in ``add``'s argument order.
_PLAIN_FIELDS = ("obs", "action", "reward", "terminated", "truncated", "value", "log_prob")


def _plain_scalar(v: Any, dtype: np.dtype[Any]) -> bool:
    """A Python scalar the checked path would store unchanged in a scalar field of
    ``dtype``: a float for a float field, an int (not a bool) in range for an int field,
    a bool for a bool field."""
    kind = dtype.kind
    if kind == "f":
        return type(v) is float
    if kind == "b":
        return type(v) is bool
    if kind in "iu" and type(v) is int:
        lo, hi = _INT_RANGE.get(dtype.str) or _int_range(dtype)
        return lo <= v <= hi
    return False


_INT_RANGE: dict[str, tuple[int, int]] = {}


def _int_range(dtype: np.dtype[Any]) -> tuple[int, int]:
    info = np.iinfo(dtype)
    r = _INT_RANGE[dtype.str] = (int(info.min), int(info.max))
    return r
