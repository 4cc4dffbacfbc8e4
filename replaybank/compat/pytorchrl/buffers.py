"""pytorchrl's off-policy storages: ``ReplayBuffer``, ``NStepReplayBuffer``, ``PERBuffer``,
``EREBuffer``, each a thin front end over one core buffer.

The classes keep pytorchrl's documented bases (``EREBuffer`` is a ``PERBuffer`` is an
``NStepReplayBuffer`` is a ``ReplayBuffer``), so ``isinstance`` checks in user code keep
working; each level only sets its constructor, the core sampler/view it asks for and the
keys it adds to a batch. The schemes map to the core as:

* n-step: :class:`~replaybank.views.nstep.NStepView` (returns at sample time, never
  across an episode end); the batch's ``n_step`` is each row's window length ``[B, 1]``
  (``gamma ** n_step`` is the row's bootstrap discount), or ``1`` when ``n_step == 1``;
* PER (``alpha > 0``): :class:`~replaybank.samplers.prioritized.PrioritizedSampler`
  (stored priority ``(error + epsilon) ** alpha``, new steps get ``default_error``,
  weights ``(N P(i)) ** -beta`` over the buffer's largest weight); ``alpha == 0`` is
  uniform replay with ``per_weights = 1.0``, as in pytorchrl;
* ERE: :class:`~replaybank.samplers.recent.RecentSampler` (mini batch ``k`` of ``K``
  draws from the newest ``c_k = max(N * eta ** (1000 k / K), cmin)`` steps), adaptive eta.

Example:
    >>> import torch
    >>> from types import SimpleNamespace
    >>> algo = SimpleNamespace(gamma=0.9)
    >>> per = PERBuffer(size=50, device="cpu", actor=None, algorithm=algo, envs=None,
    ...                 n_step=3, alpha=0.6, beta=0.4, epsilon=1e-6, seed=0)
    >>> for t in range(20):
    ...     per.insert_transition({"Observation": torch.full((2, 1), t),
    ...                            "Action": torch.zeros(2, 1), "Reward": torch.ones(2, 1),
    ...                            "NextObservation": torch.full((2, 1), t + 1),
    ...                            "Done": torch.zeros(2, 1), "NextDone": torch.zeros(2, 1)})
    >>> per.before_gradients()
    >>> batch = next(per.generate_batches(1, 8))
    >>> sorted(k for k in batch if k[0].islower())
    ['idxs', 'n_step', 'per_weights']
    >>> info = per.after_gradients(batch, {"Algorithm": {"errors": torch.rand(8, 1)}})
    >>> "idxs" in batch   # consumed, as pytorchrl does
    False
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from types import SimpleNamespace
from typing import Any

import numpy as np

from replaybank.compat.checks import check_mapping, check_type, numbers
from replaybank.compat.pytorchrl.keys import (
    ALGORITHM,
    DONE2,
    EPISODES,
    OBS2,
    REW,
    tensor_of,
    to_numpy,
)
from replaybank.compat.pytorchrl.storage import (
    PARAMETERS,
    Storage,
    get_priority,
    get_sequence_priority,
    magnitudes,
    window_lengths,
)
from replaybank.errors import (
    ArgumentError,
    ConfigError,
    DtypeError,
    ShapeError,
    describe,
)
from replaybank.host import is_tensor
from replaybank.samplers.base import Sampler
from replaybank.samplers.prioritized import PrioritizedSampler
from replaybank.samplers.recent import RecentSampler, window_counts
from replaybank.spec import rows_array, unflatten
from replaybank.views.nstep import NStepView

__all__ = ["EREBuffer", "NStepReplayBuffer", "PERBuffer", "ReplayBuffer"]

Factory = Callable[[Any, Any, Any, Any], Any]
#: The algorithm ``create_factory`` checks its arguments with (the real one comes with
#: each call of the factory, and its ``gamma`` is checked then).
_ANY_ALGORITHM = SimpleNamespace(gamma=0.99)


class ReplayBuffer(Storage):
    """Storage class for Off-Policy algorithms (uniform replay).

    Args:
        size: Storage capacity along time axis (rows per env).
        device: CPU or GPU where batches are placed.
        actor: Actor instance (``is_recurrent``, ``sequence_overlap``), or None.
        algorithm: Algorithm instance (``gamma``, ``update_every``), or None.
        envs: Vector of environments (``num_envs``), or None.
        seed: Seed of the core buffer's draws (addition; default: fresh entropy).

    Example:
        >>> make = ReplayBuffer.create_factory(100)
        >>> make("cpu", None, None, None).max_size
        100
    """

    # the constructor is Storage's: (size, device, actor, algorithm, envs, seed=None)

    @classmethod
    def create_factory(cls, size: int, *args: Any, **kwargs: Any) -> Factory:
        """Returns a function ``(device, actor, algorithm, envs)`` that creates instances.

        Every storage class has it (pytorchrl's ``create_factory`` of each section):
        the arguments are the class's constructor arguments but ``device``, ``actor``,
        ``algorithm`` and ``envs``, in the constructor's order (e.g.
        ``PERBuffer.create_factory(size, n_step, epsilon, alpha, beta, default_error)``,
        ``HERBuffer.create_factory(size, her_function, n_step, ...)``).

        Args:
            size: Storage capacity along time axis.
            *args: Further constructor arguments, by position.
            **kwargs: Further constructor arguments, by name.

        Raises:
            ArgumentError, ConfigError: A bad argument (checked now, not at the call).
        """
        # checks the arguments now (the algorithm, and so gamma, comes with each call)
        cls(size, None, None, _ANY_ALGORITHM, None, *args, **kwargs)

        def create_buffer(device: Any, actor: Any, algorithm: Any, envs: Any) -> Any:
            """Create and return an instance of the class."""
            return cls(size, device, actor, algorithm, envs, *args, **kwargs)

        return create_buffer


class NStepReplayBuffer(ReplayBuffer):
    """Storage class for Off-Policy with multi step learning.

    Args:
        size: As :class:`ReplayBuffer`.
        device: As :class:`ReplayBuffer`.
        actor: As :class:`ReplayBuffer`.
        algorithm: As :class:`ReplayBuffer`.
        envs: As :class:`ReplayBuffer`.
        n_step: Number of future steps of the truncated n-step return.
        seed: As :class:`ReplayBuffer`.

    Raises:
        ArgumentError, ConfigError: ``n_step`` is not a whole number >= 1 (or another
            argument is bad, as :class:`ReplayBuffer`); ``n_step > 1`` and the algorithm
            has no ``gamma`` (an ArgumentError naming ``algorithm.gamma``).

    Example:
        >>> algo = SimpleNamespace(gamma=0.9)
        >>> NStepReplayBuffer.create_factory(10, n_step=3)("cpu", None, algo, None).n_step
        3
    """

    settable = ReplayBuffer.settable | {"n_step"}

    def __init__(self, size: int, device: Any, actor: Any, algorithm: Any, envs: Any,
                 n_step: int | float = 1,
                 seed: int | np.random.Generator | None = None) -> None:
        n = PARAMETERS["n_step"](type(self).__name__, "n_step", n_step)
        super().__init__(size, device, actor, algorithm, envs, seed=seed)
        self.n_step = n
        if n > 1:
            self._discount(type(self).__name__)  # n-step returns need algorithm.gamma

    def _batch_info(self, out: dict[str, Any], batch: Any, k: int, num_mini_batch: int,
                    torch: Any) -> None:
        view = self._core().view
        if self.n_step == 1 or not isinstance(view, NStepView):  # NStepView when n_step > 1
            out["n_step"] = self.n_step
            return
        # each row's window length L [B] (bootstrap discount gamma ** L)
        lengths = (self._sequence_nstep(out, batch, view, torch) if self.recurrent_actor
                   else window_lengths(batch.discount, view.gamma, self.n_step))
        out["n_step"] = torch.as_tensor(lengths[:, None], device=self.device)

    def _sequence_nstep(self, out: dict[str, Any], batch: Any, view: NStepView,
                        torch: Any) -> Any:
        """n-step returns for every step of the sampled windows, as pytorchrl stores them
        for a recurrent actor: row ``j`` of a window gets the return of the steps
        ``j .. j+L-1``, ``NextObservation`` and ``NextDone`` of step ``j+L-1`` and
        ``n_step`` ``L`` (``L = min(n_step, steps to the episode end or the newest
        step)``, returned ``[S * W]``); the rows keep their own ``Observation``,
        ``Action`` and hidden states."""
        table = self._core().table
        starts = np.asarray(batch.starts, dtype=np.int64)  # [S]
        steps = np.arange(self.sequence_length, dtype=np.int64) * table.lanes
        keys = (starts[:, None] + steps[None, :]).reshape(-1)  # [S * W], a lane's steps
        got = unflatten(view.gather(table, keys))
        out.update(tensor_of({REW: np.asarray(got["reward"])[:, None], OBS2: got["next_obs"],
                              DONE2: np.asarray(got["terminated"])[:, None]},
                             torch, self._device(torch)))
        return view.lengths(table, keys).astype(np.float32)  # [S * W]


class PERBuffer(NStepReplayBuffer):
    """Storage class for Off-Policy algorithms using PER, combinable with n-step.

    Args:
        size: As :class:`NStepReplayBuffer`.
        device: As :class:`NStepReplayBuffer`.
        actor: As :class:`NStepReplayBuffer`.
        algorithm: As :class:`NStepReplayBuffer`.
        envs: As :class:`NStepReplayBuffer`.
        n_step: As :class:`NStepReplayBuffer`.
        epsilon: PER epsilon, a finite number >= 0: priority ``(error + epsilon) **
            alpha``.
        alpha: PER alpha, a finite number >= 0 (0: uniform replay, ``per_weights =
            1.0``, as pytorchrl's default).
        beta: PER beta (importance-sampling exponent), a number in ``[0, 1]``.
        default_error: TD error given to newly added steps, a finite number >= 0.
        seed: As :class:`NStepReplayBuffer`.

    Raises:
        ArgumentError, ConfigError: A PER parameter of the wrong kind, NaN or out of
            range (or another argument is bad, as :class:`NStepReplayBuffer`).

    Example:
        >>> PERBuffer(10, "cpu", None, None, None, alpha=0.5).get_priority(np.array([3.0]))
        array([1.73205081])
    """

    settable = NStepReplayBuffer.settable | {"epsilon", "alpha", "beta", "default_error",
                                             "error"}

    def __init__(self, size: int, device: Any, actor: Any, algorithm: Any, envs: Any,
                 n_step: int | float = 1, epsilon: float = 0.0, alpha: float = 0.0,
                 beta: float = 1.0, default_error: float = 1000000,
                 seed: int | np.random.Generator | None = None) -> None:
        where = type(self).__name__
        checked = [PARAMETERS[name](where, name, value) for name, value in (
            ("epsilon", epsilon), ("alpha", alpha), ("beta", beta),
            ("default_error", default_error))]
        super().__init__(size, device, actor, algorithm, envs, n_step=n_step, seed=seed)
        self.epsilon, self.alpha, self.beta, self.error = checked

    @property
    def default_error(self) -> float:
        """TD error of newly added steps (pytorchrl keeps it as ``error``)."""
        return float(self.error)

    @default_error.setter
    def default_error(self, value: float) -> None:
        self.error = value

    @property
    def prioritized(self) -> bool:
        """PER is on (``alpha > 0``)."""
        return float(self.alpha) > 0.0

    @property
    def _per(self) -> PrioritizedSampler | None:
        """The core's prioritized sampler (ERE's inner one), if it has one."""
        sampler = None if self.buffer is None else self.buffer.sampler
        per = sampler.prioritized if isinstance(sampler, RecentSampler) else sampler
        return per if isinstance(per, PrioritizedSampler) else None

    def _per_sampler(self) -> PrioritizedSampler | None:
        if not self.prioritized:
            return None
        return PrioritizedSampler(alpha=float(self.alpha), beta=float(self.beta),
                                  eps=float(self.epsilon))

    def _sampler(self) -> Sampler | None:
        return self._per_sampler()

    def _new_priority(self) -> float | None:
        """With PER new steps get ``default_error``."""
        return float(self.error) if self.prioritized else None

    def _no_draws(self) -> str:
        """PER draws in proportion to priority: it draws nothing when every priority is 0
        (TD errors of 0 with ``epsilon == 0``, pytorchrl's default)."""
        if not self.prioritized:
            return super()._no_draws()
        return (f"every stored step has priority 0 (TD errors of 0 with epsilon="
                f"{self.epsilon!r} give (0 + epsilon) ** alpha = 0) and PER draws in "
                "proportion to priority; build the storage with epsilon > 0 (e.g. "
                "epsilon=1e-6) so that a step with TD error 0 can still be drawn, or insert "
                f"transitions with a default_error > 0 (it is {self.default_error!r})")

    def get_priority(self, error: Any) -> Any:
        """Takes in the error of one or more examples and returns the proportional
        priority ``(error + epsilon) ** alpha``: a tensor for a torch tensor (on its
        device), a numpy array otherwise.

        Raises:
            DtypeError: ``error`` holds no numbers, or negative, NaN or infinite values.
        """
        return get_priority(error, float(self.epsilon), float(self.alpha),
                            f"{type(self).__name__}.get_priority")

    def get_sequence_priority(self, sequence_data: Any, eta: float = 0.9) -> Any:
        """Priority score of a data sequence: ``eta * max + (1 - eta) * mean`` (axis 0).

        Raises:
            ArgumentError, ConfigError: ``eta`` is not a number in ``[0, 1]``.
            DtypeError: ``sequence_data`` holds no numbers, or values that are negative,
                NaN or infinite (as :meth:`get_priority` refuses them).
            ShapeError: ``sequence_data`` holds no steps.
        """
        return get_sequence_priority(sequence_data, eta,
                                     f"{type(self).__name__}.get_sequence_priority")

    def _batch_info(self, out: dict[str, Any], batch: Any, k: int, num_mini_batch: int,
                    torch: Any) -> None:
        super()._batch_info(out, batch, k, num_mini_batch, torch)
        # a recurrent actor's batch: one key per window, its weight on each of its steps
        out["idxs"] = np.asarray(batch["starts"]) if self.recurrent_actor else batch.indices
        if not self.prioritized:
            out["per_weights"] = 1.0
            return
        w = np.asarray(batch["weights"])  # [B]
        if self.recurrent_actor:
            w = np.repeat(w, self.sequence_length)  # [S * sequence_length]
        out["per_weights"] = torch.as_tensor(w[:, None], dtype=torch.float32,
                                             device=self.device)

    def after_gradients(self, batch: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        """Set the priorities of the batch's steps from ``info["Algorithm"]["errors"]``
        (``[B, 1]`` TD error magnitudes: priority ``get_priority(error)``). For a
        recurrent actor the errors are one per trained step, ``S * non_overlap_length``
        values, and each window ``i`` gets pytorchrl's sequence priority
        ``get_sequence_priority(get_priority(|errors_i|))`` (``eta = 0.9``: ``0.9 * max +
        0.1 * mean`` over its steps), set at its start. With PER on, pops ``idxs`` from
        the batch once the priorities are set.

        Everything is checked before anything changes: a rejected call leaves the
        storage and ``batch`` (its ``idxs`` included) as they were, so it can be retried.

        Args:
            batch: Data batch used to compute the gradients.
            info: Additional relevant info from gradient computation.

        Returns:
            info.

        Raises:
            ArgumentError: ``batch`` or ``info`` is not a dict; PER is on and
                ``info["Algorithm"]`` has no ``errors`` or ``batch`` no ``idxs``.
            ShapeError: Not one error per sampled step (per trained step for a recurrent
                actor).
            DtypeError: Errors that are not numbers, or negative, NaN or infinite.
        """
        update = self._priority_update(batch, info)
        if update is not None:
            self._core().update_priorities(*update)
            batch.pop("idxs")
        return info

    def _priority_update(self, batch: Any, info: Any) -> tuple[Any, Any] | None:
        """The checked ``(idxs, priorities)`` of an :meth:`after_gradients` (None: PER is
        off); nothing is changed."""
        where = f"{type(self).__name__}.after_gradients"
        check_mapping(where, "batch", batch, "a batch of generate_batches")
        check_mapping(where, "info", info, "the algorithm's info, e.g. {'Algorithm': "
                      "{'errors': td_errors}}")
        if not (self.prioritized and self._per is not None):
            return None
        algo = info.get(ALGORITHM)
        if not isinstance(algo, Mapping) or "errors" not in algo:
            raise ArgumentError(f"{where}: info[{ALGORITHM!r}] has no 'errors' (TD errors "
                                f"missing!; got {describe(algo)}); the algorithm must "
                                "report the batch's TD errors with PER")
        if "idxs" not in batch:
            raise ArgumentError(f"{where}: batch has no 'idxs' (keys {sorted(batch)}); pass "
                                "a batch of generate_batches, once: after_gradients "
                                "consumes its 'idxs'")
        idxs = np.asarray(to_numpy(_rows(batch["idxs"], f"{where}: batch['idxs']",
                                         "the integer item keys [B] that generate_batches "
                                         "put there", "pass the batch as generated")))
        if idxs.ndim != 1 or idxs.dtype.kind not in "iu":
            raise ShapeError(f"{where}: batch['idxs']={describe(idxs)}: expected the "
                             "integer item keys [B] that generate_batches put there")
        errors = _reported(algo["errors"], f"{where}: info[{ALGORITHM!r}]['errors']",
                           "pass the TD errors [B, 1]").astype(np.float64, copy=False)
        want = len(idxs) * (self.non_overlap_length if self.recurrent_actor else 1)
        if errors.size != want:
            per_what = (f"per trained (non-overlap) step: {len(idxs)} * "
                        f"{self.non_overlap_length}" if self.recurrent_actor else
                        "per sampled step, [B, 1]")
            raise ShapeError(
                f"{where}: info[{ALGORITHM!r}]['errors'] has {errors.size} values; a batch of "
                f"{len(idxs)} {'sequences' if self.recurrent_actor else 'steps'} needs one "
                f"TD error {per_what} = {want}")
        if not self.recurrent_actor:
            errors = errors.reshape(len(idxs))
            magnitudes(where, f"info[{ALGORITHM!r}]['errors']", errors,
                       "finite TD error magnitudes >= 0 (e.g. td_error.abs())")
            return idxs, errors
        if not np.isfinite(errors).all():
            raise DtypeError(f"{where}: info[{ALGORITHM!r}]['errors'] holds NaN or infinite "
                             "values; pass finite TD errors")
        # pytorchrl's sequence priority: the proportional priority of each trained step,
        # then R2D2's eta * max + (1 - eta) * mean over the window's steps
        step_priority = self.get_priority(np.abs(errors.reshape(len(idxs), -1)))  # [S, L]
        priority = np.asarray(self.get_sequence_priority(step_priority.T), np.float64)  # [S]
        # the core stores (p + epsilon) ** alpha: hand it the p that stores `priority`
        p = np.power(priority, 1.0 / float(self.alpha)) - float(self.epsilon)
        return idxs, np.maximum(p, 0.0)

    def _check_parameter(self, name: str, value: Any) -> Any:
        checked = super()._check_parameter(name, value)
        if name == "alpha" and checked > 0.0 and not self.prioritized and self.size:
            raise ConfigError(f"update_storage_parameter('alpha', {value!r}): turning "
                              "PER on needs an empty storage (build it with alpha > 0)")
        return checked

    def _parameters_changed(self, name: str) -> None:
        super()._parameters_changed(name)
        per = self._per
        if name in ("error", "default_error") and self._priority is not None:
            self._priority = float(self.error)
        elif name in ("alpha", "beta", "epsilon") and per is not None:
            per.alpha, per.beta, per.eps = (float(self.alpha), float(self.beta),
                                            float(self.epsilon))
        elif name == "alpha" and self.buffer is not None:
            self.buffer = None  # empty: rebuilt with the new scheme at the next transition


class EREBuffer(PERBuffer):
    """Storage class for Off-Policy algorithms with Emphasizing Recent Experience,
    combinable with PER and n-step.

    Args:
        size: As :class:`PERBuffer`.
        device: As :class:`PERBuffer`.
        actor: As :class:`PERBuffer`.
        algorithm: As :class:`PERBuffer`.
        envs: As :class:`PERBuffer`.
        n_step: As :class:`PERBuffer`.
        epsilon: As :class:`PERBuffer`.
        alpha: As :class:`PERBuffer`.
        beta: As :class:`PERBuffer`.
        default_error: As :class:`PERBuffer`.
        eta: ERE eta, a number in ``(0, 1]`` (1.0: uniform over the buffer); adaptive
            between ``eta`` and 1.
        cmin: ERE cmin, the smallest window, an int >= 1.
        seed: As :class:`PERBuffer`.

    Raises:
        ArgumentError, ConfigError: ``eta`` or ``cmin`` of the wrong kind or out of
            range (or another argument is bad, as :class:`PERBuffer`).

    Example:
        >>> ere = EREBuffer(100, "cpu", None, None, None, eta=0.99, cmin=10)
        >>> ere.buffer is None, ere.eta, ere.cmin
        (True, 0.99, 10)
    """

    settable = PERBuffer.settable | {"eta", "cmin"}

    def __init__(self, size: int, device: Any, actor: Any, algorithm: Any, envs: Any,
                 n_step: int | float = 1, epsilon: float = 0.0, alpha: float = 0.0,
                 beta: float = 1.0, default_error: float = 1000000, eta: float = 1.0,
                 cmin: int = 5000, seed: int | np.random.Generator | None = None) -> None:
        where = type(self).__name__
        self.eta = PARAMETERS["eta"](where, "eta", eta)
        self.cmin = PARAMETERS["cmin"](where, "cmin", cmin)
        self.initial_eta = self.eta
        super().__init__(size, device, actor, algorithm, envs, n_step=n_step, epsilon=epsilon,
                         alpha=alpha, beta=beta, default_error=default_error, seed=seed)
        self._recent = self._sampler()

    def _sampler(self) -> RecentSampler:
        self._recent = RecentSampler(eta=float(self.eta), c_min=int(self.cmin),
                                     prioritized=self._per_sampler(), adaptive=True,
                                     eta_min=float(self.initial_eta))
        return self._recent

    def _sample_kwargs(self, k: int, num_mini_batch: int) -> dict[str, Any]:
        if self.recurrent_actor:
            self._check_sequence_window(k, num_mini_batch)
        return {"update": k, "num_updates": num_mini_batch}

    def _window(self, k: int, num_mini_batch: int) -> int:
        """Steps (of all lanes) in the recent window of mini batch ``k``."""
        return self._recent_sampler().window_size(len(self._core()), k, num_mini_batch)

    def _recent_sampler(self) -> RecentSampler:
        sampler = self.buffer.sampler if self.buffer is not None else None
        return sampler if isinstance(sampler, RecentSampler) else self._recent

    def _check_sequence_window(self, k: int, num_mini_batch: int) -> None:
        """A recurrent actor's windows start among the newest ``c_k`` steps: some lane
        must hold ``sequence_length`` of them, or no window could be drawn."""
        buf = self._core()
        if not buf.allocated:
            return
        per_lane = window_counts(buf.table.counts, self._window(k, num_mini_batch))
        if int(per_lane.max()) < self.sequence_length:
            raise ConfigError(
                f"{type(self).__name__}.generate_batches(num_mini_batch={num_mini_batch}): "
                f"the recent window of mini batch {k} holds {int(per_lane.max())} steps per "
                f"env, less than one sequence of {self.sequence_length} steps (cmin="
                f"{self.cmin}, eta={self.eta}); raise cmin to at least num_envs * "
                f"sequence_length = {self._lanes * self.sequence_length}")

    def _batch_info(self, out: dict[str, Any], batch: Any, k: int, num_mini_batch: int,
                    torch: Any) -> None:
        super()._batch_info(out, batch, k, num_mini_batch, torch)
        if not self.prioritized:
            del out["per_weights"]  # pytorchrl's ERE adds them only with PER
        window = self._window(k, num_mini_batch)
        if self.recurrent_actor:  # pytorchrl counts a recurrent window in sequences per env
            window //= self._lanes * self.sequence_length
        out["ck"] = window

    def after_gradients(self, batch: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        """PER priorities (as :meth:`PERBuffer.after_gradients`), then
        :meth:`update_eta`. Pops ``idxs`` and ``ck`` from the batch once both are done
        (a rejected call changes nothing, ``batch`` included).

        Returns:
            info (with ``info["Algorithm"]["eta"]`` once eta adapts).

        Raises:
            ArgumentError, ShapeError, DtypeError: As :meth:`PERBuffer.after_gradients`
                and :meth:`update_eta`.
        """
        update = self._priority_update(batch, info)
        rewards = self._train_rewards("after_gradients", info)
        if update is not None:
            self._core().update_priorities(*update)
        batch.pop("ck", None)
        batch.pop("idxs", None)
        return self._adapt_eta(info, rewards)

    def update_eta(self, info: dict[str, Any]) -> dict[str, Any]:
        """Adjust eta based on how fast or slow the agent is learning in recent episodes:
        ``info["Episodes"]["TrainReward"]`` (one mean return per collection) feeds the
        core's adaptive rule (:meth:`~replaybank.samplers.recent.RecentSampler.
        update_eta`: eta moves between ``initial_eta`` for fast progress and 1 for a
        plateau, over the last 20 returns).

        Returns:
            info, with ``info["Algorithm"]["eta"]`` once 4 returns were seen.

        Raises:
            ArgumentError: ``info`` (or ``info["Episodes"]``) is not a dict.
            DtypeError: ``TrainReward`` is not finite numbers.
        """
        return self._adapt_eta(info, self._train_rewards("update_eta", info))

    def _train_rewards(self, call: str, info: Any) -> list[float]:
        """The checked mean train reward of ``info`` (``[]``: none reported)."""
        where = f"{type(self).__name__}.{call}"
        check_mapping(where, "info", info, "the algorithm's info, e.g. {'Episodes': "
                      "{'TrainReward': r}}")
        check_type(None, f"{where}: info[{ALGORITHM!r}]", info.get(ALGORITHM),
                   (MutableMapping, type(None)), "a dict (the adapted eta is reported there)")
        episodes = info.get(EPISODES)
        if episodes is None:
            return []
        check_mapping(where, f"info[{EPISODES!r}]", episodes, "e.g. {'TrainReward': r}")
        if "TrainReward" not in episodes:
            return []
        raw = episodes["TrainReward"]
        values = _reported(raw, f"{where}: info[{EPISODES!r}]['TrainReward']",
                           "pass the mean episode return")
        if values.size == 0 or not np.isfinite(values).all():
            raise DtypeError(f"{where}: info[{EPISODES!r}]['TrainReward']={describe(raw)}: "
                             "expected finite episode returns (one or more)")
        return [float(np.mean(values))]

    def _adapt_eta(self, info: dict[str, Any], rewards: list[float]) -> dict[str, Any]:
        sampler = self._recent_sampler()
        self.eta = sampler.update_eta(rewards)
        if len(sampler.returns) >= 4:
            info.setdefault(ALGORITHM, {})["eta"] = self.eta
        return info

    def _parameters_changed(self, name: str) -> None:
        super()._parameters_changed(name)
        sampler = None if self.buffer is None else self.buffer.sampler
        if isinstance(sampler, RecentSampler):
            if name == "eta":
                sampler.eta = float(self.eta)
            elif name == "cmin":
                sampler.c_min = int(self.cmin)


def _reported(raw: Any, label: str, fix: str) -> np.ndarray[Any, Any]:
    """A value an algorithm reported in its info dict (``label`` names it), as a numeric
    host array; None, text and dicts hold no numbers.

    Raises:
        DtypeError: ``raw`` holds no numbers, naming ``label`` and ``fix``.
        ShapeError: ``raw`` has rows of different lengths (a ragged list).
    """
    if raw is None or isinstance(raw, (str, bytes, Mapping)):
        raise DtypeError(f"{label}={describe(raw)} holds no numbers; {fix}")
    rows = _rows(raw, label, "one array of numbers", fix)
    values: np.ndarray[Any, Any] = numbers(to_numpy(rows), label)
    return values


def _rows(raw: Any, label: str, expected: str, fix: str) -> Any:
    """``raw`` ready for :func:`~replaybank.compat.pytorchrl.keys.to_numpy`: a tensor as it
    is, host values through :func:`~replaybank.spec.rows_array` (a ragged list is a
    ShapeError naming ``label``, the value, ``expected`` and ``fix``)."""
    if is_tensor(raw):
        return raw
    return rows_array(raw, lambda: f"{label}={describe(raw)}", expected, fix)
