"""Proportional prioritized experience replay (Schaul et al. 2016) on a wide sum tree.

Leaves are storage slots ``[0, T * lanes)`` (see :mod:`replaybank.ops.ring`). A slot's
stored priority is ``(p + eps) ** alpha``; a new step gets the running maximum of the
stored priorities (1.0 before any update) unless ``priority=`` is given on add/extend.
Slots never written (or cleared) hold 0 and are never drawn.

Sampling is stratified: the total mass is cut into ``B`` equal segments and one target
is drawn uniformly in each; :func:`replaybank.ops.sumtree.find` maps targets to slots
(float64 sums, clamped so a zero-priority slot is never returned). The importance
weights are ``w_i = (N * P(i)) ** -beta`` with ``N`` the number of live steps, then

* ``weight_norm="buffer"`` (default): divided by the largest weight any live step could
  get, ``(N * p_min / total) ** -beta``, i.e. ``w_i = (p_i / p_min) ** -beta``;
* ``"batch"``: divided by the batch maximum (over the rows returned: a batch put together
  from several draws, as frame stacks and sequence windows redraw rows they cannot use, is
  weighed once more as one, :meth:`PrioritizedSampler.batch_weights`);
* ``None``: returned as is.

``beta`` is the ``beta=`` argument of ``sample`` when given, else the schedule:
``"constant"`` keeps ``beta``; ``"linear"`` goes from ``beta`` to 1 over ``beta_steps``
calls to ``sample`` (counted by the sampler and saved with it). A call that fails (bad
arguments, nothing drawable) neither advances the schedule nor draws from the generator.

Extreme priorities. The sum tree must keep a finite total, so a stored priority may not
exceed ``MAX_TOTAL / n_slots`` (``MAX_TOTAL = 1e300``): a raw priority ``p`` is accepted
when ``(p + eps) ** alpha <= 1e300 / n_slots`` (:attr:`PrioritizedSampler.priority_limit`,
the largest such ``p``); the buffer rejects larger ones with a ``DtypeError`` before
anything is written. Every accepted priority is drawn with probability ``p_i / total``
computed in float64 (a stored priority below ``total * 2**-53`` of a huge total is
then practically never drawn, as its probability says). Importance weights are
computed in float64 as ratios (``(p_i / p_min) ** -beta`` for ``"buffer"``,
``(p_i / p_batch_min) ** -beta`` for ``"batch"``) and then clamped to
``[2**-126, float32 max]`` (the smallest normal and the largest float32), so a drawn
item never gets a weight of exactly 0 (or inf) when cast to float32.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=100, seed=0, sampler=PrioritizedSampler(kernel="numpy"))
    >>> buf.extend(obs=np.zeros((4, 2), np.float32), action=np.zeros(4), reward=np.zeros(4),
    ...            next_obs=np.zeros((4, 2), np.float32), terminated=np.zeros(4, bool),
    ...            truncated=np.zeros(4, bool), priority=[1.0, 2.0, 3.0, 4.0])
    >>> batch = buf.sample(8, beta=0.4)
    >>> batch.weights.shape, bool(np.all(batch.weights <= 1.0))
    ((8,), True)
    >>> buf.update_priorities(batch.indices, np.full(8, 0.5))
    8
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from replaybank.errors import (
    CapacityError,
    CheckpointError,
    ConfigError,
    EmptyBufferError,
    describe,
)
from replaybank.ops import ring, sumtree
from replaybank.ops.jit import PREFERENCES
from replaybank.samplers.base import FloatArray, IntArray, LaneView, SampleResult
from replaybank.samplers.sample_args import LARGE_BATCH, check_batch_size
from replaybank.storage.backends.base import available_memory

__all__ = ["MAX_TOTAL", "PrioritizedSampler", "importance_weights", "is_weights", "raw_limit"]

_NORMS = ("buffer", "batch", None)
#: The compiled kernels' code of each ``weight_norm``.
_NORM_CODES = {"buffer": 0, "batch": 1, None: 2}
_SCHEDULES = ("constant", "linear")


#: The largest total of stored priorities (the sum tree's root stays finite below it).
MAX_TOTAL = 1e300
#: Weights are clamped to the float32 range of normal numbers before the cast.
_W_LO = float(np.finfo(np.float32).tiny)
_W_HI = float(np.finfo(np.float32).max)
#: The smallest normal float64 (a ratio to a larger number cannot overflow from 1).
_SMALLEST_NORMAL = float(np.finfo(np.float64).tiny)
#: An array kind with ``/``, ``**``, ``.min()`` and ``.clip``: a numpy array or a torch tensor.
W = TypeVar("W")


def _number(name: str, value: Any, lo: float, hi: float = np.inf,
            call: str = "PrioritizedSampler") -> float:
    if isinstance(value, (bool, np.bool_)) \
            or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not lo <= float(value) <= hi or not math.isfinite(float(value)):
        rng = f"[{lo}, {hi}]" if math.isfinite(hi) else f"a finite number >= {lo}"
        raise ConfigError(f"{call}({name}={value!r}): must be a number in {rng}"
                          if math.isfinite(hi) else f"{call}({name}={value!r}): must be {rng}")
    return float(value)


def raw_limit(n_slots: int, eps: float, alpha: float) -> float:
    """The largest raw priority ``p`` with ``(p + eps) ** alpha <= MAX_TOTAL / n_slots``
    (inf when every finite ``p`` fits, as for ``alpha < 1``).

    Example:
        >>> f"{raw_limit(10, 0.0, 1.0):.6g}"
        '1e+299'
        >>> raw_limit(10, 0.0, 0.6)
        inf
    """
    if alpha == 0.0:
        return math.inf
    log_max = math.log(MAX_TOTAL / n_slots) / alpha  # log of the largest p + eps
    if log_max >= math.log(np.finfo(np.float64).max):
        return math.inf
    return math.exp(log_max) - eps


def importance_weights(priorities: W, p_min: Any, beta: float, weight_norm: str | None,
                       n_items: Any, total: Any) -> W:
    """The importance-weight formula, written once for numpy arrays and torch tensors.

    ``(N * P(i)) ** -beta`` normalised per ``weight_norm`` and clamped to
    ``[2**-126, float32 max]``, using only operations both array kinds have (``/``,
    ``**``, ``.min()``, ``.clip``): :func:`is_weights` runs it on the host sampler's numpy
    arrays; torch tensors take the same formula. The compiled twins (``sumtree_numba``,
    ``_sampling.c``) are tested against it.

    Args:
        priorities: Stored priorities of the drawn items ``[B]`` (all > 0), float64.
        p_min: Smallest positive stored priority among the items that could be drawn
            (a number, or a 0-d tensor on the priorities' device).
        beta: Correction exponent in ``[0, 1]``.
        weight_norm: ``"buffer"``, ``"batch"`` or None (see the module docs).
        n_items: ``N``, the number of items that could be drawn (a number or 0-d tensor).
        total: Sum of their priorities (a number or 0-d tensor).

    Returns:
        Weights ``[B]`` of the priorities' kind and dtype, clamped (never 0 or inf as
        float32).

    Example:
        >>> import torch
        >>> p = np.array([1.0, 2.0])
        >>> w = importance_weights(p, 1.0, 0.5, "buffer", 2, 3.0)  # numpy in, numpy out
        >>> wt = importance_weights(torch.from_numpy(p), 1.0, 0.5, "buffer", 2, 3.0)
        >>> w.round(4).tolist(), type(wt).__name__, np.allclose(wt.numpy(), w)
        ([1.0, 0.7071], 'Tensor', True)
    """
    p: Any = priorities  # [B]
    if weight_norm == "buffer":
        w = (p / p_min) ** -beta
    elif weight_norm == "batch":
        w = (p / p.min()) ** -beta
    else:
        w = (n_items * (p / total)) ** -beta
    return w.clip(_W_LO, _W_HI)  # type: ignore[no-any-return]


def is_weights(priorities: FloatArray, p_min: float, beta: float,
               weight_norm: str | None, n_items: int, total: float) -> FloatArray:
    """Importance-sampling weights ``(N * P(i)) ** -beta`` normalised per ``weight_norm``
    (:func:`importance_weights` on numpy arrays, with float over/underflow silenced: the
    clamp handles it).

    Args:
        priorities: Stored priorities of the drawn items ``[B]`` (all > 0).
        p_min: Smallest positive stored priority among the items that could be drawn.
        beta: Correction exponent in ``[0, 1]``.
        weight_norm: ``"buffer"``, ``"batch"`` or None (see the module docs).
        n_items: ``N``, the number of items that could be drawn.
        total: Sum of their priorities.

    Returns:
        Weights ``[B]`` float64, clamped to ``[2**-126, float32 max]`` (never 0 or inf
        as float32). ``"batch"`` divides by the batch maximum as the ratio
        ``(p_i / min_batch p) ** -beta``, which cannot overflow.

    Example:
        >>> p = np.array([1.0, 2.0]) ** 0.6
        >>> is_weights(p, float(p[0]), 0.4, None, 2, float(p.sum())).round(4).tolist()
        [1.0961, 0.9281]
        >>> float(is_weights(np.array([1e300]), 1e-300, 1.0, "buffer", 1, 1e300)[0]) > 0
        True
    """
    with np.errstate(over="ignore", under="ignore", divide="ignore"):  # clamped
        w = importance_weights(priorities, p_min, beta, weight_norm, n_items, total)
    return np.asarray(w, dtype=np.float64)


class PrioritizedSampler:
    """Draws slots with probability ``P(i) = p_i / sum_k p_k`` (see the module docs).

    Args:
        alpha: Priority exponent (0 = uniform).
        beta: Importance-sampling exponent (initial value of the schedule).
        eps: Added to every priority before ``** alpha`` (keeps zero-error steps drawable).
        weight_norm: ``"buffer"`` (default), ``"batch"`` or None.
        beta_schedule: ``"constant"`` or ``"linear"`` (``beta`` to 1 over ``beta_steps``
            sample calls).
        beta_steps: Length of the linear schedule in sample calls.
        fanout: Children per sum-tree node (16: a 1M-slot tree is 5 levels deep).
        kernel: ``"auto"`` (the C kernels where built, else numba when it imports, else
            numpy), ``"c"``, ``"numba"`` or ``"numpy"``; all give the same draws.

    ``replace=False`` draws distinct steps with probability proportional to priority by
    successive sampling (Gumbel top-k over every slot, O(N)); weights use the same
    formula with the single-draw ``P(i)``.

    Raises:
        ConfigError: An argument is out of range or not finite.

    Example:
        >>> s = PrioritizedSampler(beta=0.4, beta_schedule="linear", beta_steps=10)
        >>> s.current_beta
        0.4
        >>> s.config()["type"]
        'prioritized'
    """

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        weight_norm: str | None = "buffer",
        beta_schedule: str = "constant",
        beta_steps: int = 100_000,
        fanout: int = 16,
        kernel: str = "auto",
    ) -> None:
        self.alpha = _number("alpha", alpha, 0.0)
        self.beta = _number("beta", beta, 0.0, 1.0)
        self.eps = _number("eps", eps, 0.0)
        if not (weight_norm is None or isinstance(weight_norm, str)) or weight_norm not in _NORMS:
            raise ConfigError(
                f"PrioritizedSampler(weight_norm={weight_norm!r}): use 'buffer', 'batch' or None"
            )
        if not isinstance(beta_schedule, str) or beta_schedule not in _SCHEDULES:
            raise ConfigError(
                f"PrioritizedSampler(beta_schedule={beta_schedule!r}): use 'constant' or "
                "'linear' (beta to 1 over beta_steps sample calls)"
            )
        if isinstance(beta_steps, bool) or not isinstance(beta_steps, (int, np.integer)) \
                or beta_steps < 1:
            raise ConfigError(f"PrioritizedSampler(beta_steps={beta_steps!r}): must be an int >= 1")
        if isinstance(fanout, bool) or not isinstance(fanout, (int, np.integer)) \
                or not 2 <= fanout <= 64:
            raise ConfigError(f"PrioritizedSampler(fanout={fanout!r}): must be an int in [2, 64]")
        if not isinstance(kernel, str) or kernel not in PREFERENCES:
            raise ConfigError(
                f"PrioritizedSampler(kernel={kernel!r}): use 'auto', 'c', 'numba' or 'numpy'"
            )
        self.weight_norm = weight_norm
        self.beta_schedule = beta_schedule
        self.beta_steps = int(beta_steps)
        self.fanout = int(fanout)
        self.kernel = kernel
        self.calls = 0
        self.max_priority = 1.0
        self._n = 0
        self._off = np.zeros(2, dtype=np.int64)
        self._sum = np.zeros(1)
        self._min = np.full(1, np.inf)
        self._kernels: sumtree.Kernels | None = None
        self._one = (np.zeros(1, np.int64), np.zeros(1, np.float64))  # see on_write_range
        self._fused: sumtree.FusedKernels | None = None  # C or numba fused kernels
        self._root = 0  # where the sum tree's total is (see bind)
        self.kernel_name = "unbound"
        self._limit = math.inf

    # ------------------------------------------------------------------ protocol
    def bind(self, T: int, lanes: int) -> None:  # noqa: N803
        """Allocate the sum and min trees over ``T * lanes`` slots.

        Raises:
            CapacityError: The trees do not fit in the available memory.
            ConfigError: ``eps ** alpha`` (the stored priority of a zero priority)
                already exceeds the per-slot bound (see the module docs).
        """
        n = int(T) * int(lanes)
        off = sumtree.layout(n, self.fanout)
        need = int(off[-1] + off[-2]) * 8  # float64 sum tree + min tree (internal levels)
        avail = available_memory()
        if avail is not None and need > avail:
            raise CapacityError(
                f"PrioritizedSampler over capacity={n:,} slots: its sum and min trees need "
                f"{need:,} bytes ({need / 2**30:.2f} GiB) but only {avail:,} bytes "
                f"({avail / 2**30:.2f} GiB) of memory are available; lower capacity"
            )
        limit = raw_limit(n, self.eps, self.alpha)
        if limit < 0.0:
            raise ConfigError(
                f"PrioritizedSampler(eps={self.eps}, alpha={self.alpha}): the stored priority "
                f"eps ** alpha exceeds {MAX_TOTAL:g} / {n} slots; lower eps or alpha"
            )
        self._limit = limit
        self._n = n
        self._off = off
        self._root = int(off[0])
        self._sum = sumtree.new_tree(self._off, 0.0)
        self._min = sumtree.new_tree(self._off, np.inf, internal_only=True)
        self._kernels, self.kernel_name = sumtree.kernels(self.kernel)
        self._fused = sumtree.fused(self.kernel_name)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle support: the trees and schedule; kernels are looked up again."""
        state = self.__dict__.copy()
        state["_kernels"] = None
        state["_fused"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_root", 0)  # pickled before it was kept
        if self.kernel_name != "unbound":
            self._kernels, self.kernel_name = sumtree.kernels(self.kernel)
            self._fused = sumtree.fused(self.kernel_name)

    def _bound(self) -> sumtree.Kernels:
        if self._kernels is None:
            raise ConfigError(
                "PrioritizedSampler: not bound to a buffer; pass it as "
                "ReplayBuffer(sampler=...) (or call bind(T, lanes))"
            )
        return self._kernels

    def _store(self, slots: IntArray, stored: FloatArray, top: float | None = None) -> None:
        if len(stored):
            top = float(stored.max()) if top is None else top
            self.max_priority = max(self.max_priority, top)
        self._bound()[1](self._sum, self._min, self._off, self.fanout, slots, stored)

    def transform(self, priorities: FloatArray) -> FloatArray:
        """Stored priority ``(p + eps) ** alpha`` of raw priorities."""
        return np.asarray((np.asarray(priorities, np.float64) + self.eps) ** self.alpha,
                          dtype=np.float64)

    def _transform_max(self, priorities: FloatArray) -> tuple[FloatArray, float | None]:
        if self._fused is not None:
            out, top = self._fused.transform(np.asarray(priorities, np.float64).reshape(-1),
                                             self.eps, self.alpha)
            return out, top
        return self.transform(priorities), None

    def on_write(self, slots: IntArray, priorities: FloatArray | None = None) -> None:
        """New steps in ``slots`` get ``priorities`` (transformed) or the running max."""
        slots = np.asarray(slots, dtype=np.int64)
        if priorities is None:
            stored = np.full(len(slots), self.max_priority)
            self._store(slots, stored)
        else:
            self._store(slots, *self._transform_max(priorities))

    def on_write_range(self, lo: int, hi: int) -> None:
        """``on_write(np.arange(lo, hi))`` without priorities: the running max for each
        new step (the writers' fast path: one call per add, no per-call arrays for one
        slot)."""
        n = hi - lo
        if n == 1:
            slots, stored = self._one
            slots[0] = lo
            stored[0] = self.max_priority
        else:
            slots = np.arange(lo, hi, dtype=np.int64)
            stored = np.full(n, self.max_priority)
        self._bound()[1](self._sum, self._min, self._off, self.fanout, slots, stored)

    def on_clear(self) -> None:
        """Every slot back to zero priority; the running max back to 1."""
        self._sum[:] = 0.0
        self._min[:] = np.inf
        self.max_priority = 1.0

    def update(self, slots: IntArray, priorities: FloatArray) -> None:
        """Set the priorities of live ``slots`` (validated by the buffer)."""
        self._store(np.asarray(slots, dtype=np.int64), *self._transform_max(priorities))

    def exclude(self, slots: IntArray) -> None:
        """Stored priority 0 for ``slots`` (live ones): never drawn, and left out of the
        minimum, until the slot is written again or its priority updated (the sharded
        service's ``max_times_sampled``, :mod:`replaybank.distributed`).

        Example:
            >>> s = PrioritizedSampler(kernel="numpy"); s.bind(4, 1)
            >>> s.on_write(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]))
            >>> s.exclude(np.array([0])); s.priorities(np.arange(2)).round(3).tolist()
            [0.0, 1.516]
        """
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        self._bound()[1](self._sum, self._min, self._off, self.fanout, slots,
                         np.zeros(len(slots)))

    def update_keys(self, keys: IntArray, priorities: FloatArray, lanes: LaneView) -> int:
        """Set priorities by item key, ignoring keys whose step was overwritten (stale).

        The buffer validates ``priorities`` first; this is the fused fast path of
        ``ReplayBuffer.update_priorities``.

        Returns:
            Number of priorities applied.
        """
        fused = self._fused  # set by bind: None unbound or with the numpy kernels
        if fused is None:
            self._bound()
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        p = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if fused is not None:
            m, top = fused.update_keys(self._sum, self._min, self._off, self.fanout, keys, p,
                                       lanes.written, lanes.counts, lanes.T, self.eps,
                                       self.alpha)
            if m:
                self.max_priority = max(self.max_priority, top)
            return int(m)
        live = ring.is_live(keys, lanes.written, lanes.counts)
        self.update(ring.key_to_slot(keys[live], lanes.T, lanes.lanes), p[live])
        return int(live.sum())

    # ------------------------------------------------------------------ queries
    @property
    def priority_limit(self) -> float:
        """The largest raw priority accepted: ``(p + eps) ** alpha`` stays at most
        ``MAX_TOTAL / n_slots``, so the tree's total stays finite (inf: no bound)."""
        return self._limit

    @property
    def current_beta(self) -> float:
        """The schedule's beta for the next sample call."""
        if self.beta_schedule == "constant":
            return self.beta
        frac = min(1.0, self.calls / self.beta_steps)
        return self.beta + (1.0 - self.beta) * frac

    def resolve_beta(self, beta: float | None) -> float:
        """Beta for this sample call (``beta`` if given, else the schedule's), checked;
        the schedule is not advanced.

        Raises:
            ConfigError: ``beta`` is not a finite number in ``[0, 1]``.
        """
        if beta is None:
            return self.current_beta
        return _number("beta", beta, 0.0, 1.0, call="sample")

    def next_beta(self, beta: float | None) -> float:
        """Beta for this sample call (``beta`` if given), advancing the schedule."""
        b = self.resolve_beta(beta)
        self.calls += 1
        return b

    @property
    def total(self) -> float:
        """Sum of all stored priorities."""
        return sumtree.total(self._sum, self._off)

    def priorities(self, slots: IntArray) -> FloatArray:
        """Stored priorities of ``slots``, ``[m]``."""
        return np.asarray(sumtree.leaves(self._sum, self._off)[np.asarray(slots, np.int64)])

    def range_sum(self, a: int, b: int) -> float:
        """Sum of the stored priorities of slots ``[a, b)``."""
        return sumtree.range_reduce(self._sum, self._off, self.fanout, a, b, "sum")

    def range_min(self, a: int, b: int) -> float:
        """Smallest positive stored priority of slots ``[a, b)`` (inf if none)."""
        return sumtree.range_min(self._sum, self._min, self._off, self.fanout, a, b)

    def find(self, targets: FloatArray) -> IntArray:
        """Slots at the prefix masses ``targets`` (see :func:`replaybank.ops.sumtree.find`)."""
        return self._bound()[0](self._sum, self._off, self.fanout, targets)

    def draw_independent(self, batch_size: int, lanes: LaneView,
                         rng: np.random.Generator) -> IntArray:
        """``batch_size`` keys, each drawn independently with probability ``p_i / total``
        (one uniform target over the whole mass per key, not one per stratum as in
        :meth:`sample`); no weights, and the beta schedule does not advance.

        Raises:
            ConfigError: ``batch_size`` is not a positive int.
            EmptyBufferError: Empty buffer or zero total priority.
        """
        batch_size = check_batch_size(batch_size, lanes.size, True, "draw_independent")
        tot = self.total
        if not tot > 0.0:
            raise EmptyBufferError(
                f"draw_independent(batch_size={batch_size}): every stored priority is 0; "
                "update priorities with positive values or use eps > 0"
            )
        slots = self.find(rng.random(batch_size) * tot)
        return ring.slot_to_key(slots, lanes.written, lanes.counts, lanes.T)

    # ------------------------------------------------------------------ sampling
    def sample(
        self,
        batch_size: int,
        lanes: LaneView,
        rng: np.random.Generator,
        beta: float | None = None,
        replace: bool = True,
        **kwargs: Any,
    ) -> SampleResult:
        """Draw ``batch_size`` keys proportionally to priority, with IS weights.

        Args:
            batch_size: B.
            lanes: Lane bookkeeping of the table.
            rng: Generator.
            beta: IS exponent for this call (None: the schedule's).
            replace: False draws distinct steps (Gumbel top-k, O(N)).
            **kwargs: Ignored (other samplers' options).

        Returns:
            Keys, probabilities ``P(i)`` and weights, each ``[B]``.

        Raises:
            ConfigError: Bad ``batch_size`` or ``beta``.
            EmptyBufferError: Empty buffer, zero total priority, or too few drawable steps
                for ``replace=False``.

        Every check comes before the schedule advances and before the generator is read.
        """
        fused = self._fused
        if fused is not None and replace is True and type(batch_size) is int \
                and 0 < batch_size <= LARGE_BATCH:
            # the usual call, checked as below in fewer steps: a float beta in [0, 1]
            # (NaN fails the comparison) or the schedule's, a positive total
            b = beta if type(beta) is float and 0.0 <= beta <= 1.0 else self.resolve_beta(beta)
            size = lanes.size
            if size > 0 and self._sum[self._root] > 0.0:
                self.calls += 1
                norm = _NORM_CODES.get(self.weight_norm, 2)
                keys, probs, w = fused.sample_stratified(
                    self._sum, self._min, self._off, self.fanout, rng.random(batch_size),
                    lanes.written, lanes.counts, lanes.T, b, norm, size)
                return SampleResult(keys, probs, w)
        size = lanes.size
        if type(batch_size) is not int or not 0 < batch_size <= LARGE_BATCH \
                or replace is not True or size <= 0:
            batch_size = check_batch_size(batch_size, size, replace)
            replace = bool(replace)
        kernels = self._bound()
        b = self.resolve_beta(beta)
        tot = self.total
        if not tot > 0.0:
            raise EmptyBufferError(
                f"sample(batch_size={batch_size}): every stored priority is 0; "
                "update priorities with positive values or use eps > 0"
            )
        if not replace:
            slots = self._without_replacement(batch_size, rng)  # checks, then draws
        self.calls += 1  # every check passed: the call counts
        if replace and self._fused is not None:
            u = rng.random(batch_size)
            norm = _NORM_CODES.get(self.weight_norm, 2)
            keys, probs, w = self._fused.sample_stratified(
                self._sum, self._min, self._off, self.fanout, u, lanes.written, lanes.counts,
                lanes.T, b, norm, size)
            return SampleResult(keys, probs, w)
        if replace:
            u = rng.random(batch_size)
            targets = (np.arange(batch_size) + u) * (tot / batch_size)
            slots = kernels[0](self._sum, self._off, self.fanout, targets)
        keys = ring.slot_to_key(slots, lanes.written, lanes.counts, lanes.T)
        return self._weighed(keys, self.priorities(slots), b, lanes)

    def _weighed(self, keys: IntArray, p: FloatArray, beta: float,
                 lanes: LaneView) -> SampleResult:
        """``keys`` of stored priorities ``p`` with their single-draw ``P(i) = p_i /
        total`` and importance weights (the total is positive)."""
        tot = self.total
        p_min = sumtree.total(self._min, self._off)
        w = is_weights(p, p_min, beta, self.weight_norm, lanes.size, tot)
        return SampleResult(keys, p / tot, w)

    def _without_replacement(self, batch_size: int, rng: np.random.Generator) -> IntArray:
        leaf = sumtree.leaves(self._sum, self._off)[:self._n]
        nz = np.flatnonzero(leaf > 0)
        if len(nz) < batch_size:
            raise EmptyBufferError(
                f"sample(batch_size={batch_size}, replace=False): only {len(nz)} steps have a "
                "positive priority; lower batch_size or use replace=True"
            )
        return np.asarray(nz[_successive(leaf[nz], batch_size, rng)], dtype=np.int64)

    def batch_weights(self, res: SampleResult, lanes: LaneView, beta: float | None = None,
                      **kwargs: Any) -> SampleResult:
        """``res``, a batch of keys this sampler drew, weighed as one batch: with
        ``weight_norm="batch"`` every weight is ``(p_i / min_batch p) ** -beta`` over the
        rows of ``res`` (from their probabilities ``P(i) = p_i / total``, whose ratios are
        those of the stored priorities); ``res`` itself for the other norms (their weights
        do not depend on the batch) or without weights. A batch put together from several
        draws (the rows a frame stack or a window length rejects are drawn again) is
        weighed so once, over the rows it returns. Nothing is drawn and the schedule is
        not advanced.

        Args:
            res: Keys ``[B]`` (live) with their probabilities and weights.
            lanes: Lane bookkeeping of the table.
            beta: IS exponent the rows were drawn with (None: the schedule's).
            **kwargs: Ignored (the sample call's other options).

        Returns:
            ``res`` with its weights ``[B]`` normalised over its rows.

        Example:
            >>> s = PrioritizedSampler(alpha=1.0, eps=0.0, weight_norm="batch", kernel="numpy")
            >>> s.bind(4, 1); s.on_write(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]))
            >>> lv = LaneView(T=4, lanes=1, written=np.array([4]), counts=np.array([4]))
            >>> rows = SampleResult(np.array([1, 3]), np.array([0.2, 0.4]), np.ones(2))
            >>> s.batch_weights(rows, lv, beta=1.0).weights.tolist()  # (p / 2) ** -1
            [1.0, 0.5]
        """
        probs = res.probabilities
        if self.weight_norm != "batch" or res.weights is None or probs is None \
                or len(probs) == 0:
            return res
        b = beta if type(beta) is float and 0.0 <= beta <= 1.0 else self.resolve_beta(beta)
        # P(i) = p_i / total: the batch ratio P_i / min P is p_i / min p, the formula of
        # sample (the constant total cancels; no priority lookup needed). The ratios are
        # >= 1 and P <= 1, so nothing can overflow unless min P is subnormal: only then
        # are float warnings silenced (is_weights), which costs more than the formula
        if float(probs.min()) > _SMALLEST_NORMAL:
            w = np.asarray(importance_weights(probs, 0.0, b, "batch", lanes.size, 1.0))
        else:
            w = is_weights(probs, 0.0, b, "batch", lanes.size, 1.0)
        return SampleResult(res.keys, probs, w)

    def key_weights(self, keys: IntArray, lanes: LaneView) -> FloatArray:
        """The stored priorities of the live ``keys`` ``[n]`` (a draw takes key ``i`` with
        probability ``p_i / total``)."""
        keys = np.asarray(keys, np.int64)
        return self.priorities(ring.key_to_slot(keys, lanes.T, lanes.lanes))

    def sample_among(self, keys: IntArray, batch_size: int, lanes: LaneView,
                     rng: np.random.Generator, beta: float | None = None,
                     replace: bool = False, **kwargs: Any) -> SampleResult:
        """``batch_size`` distinct keys of ``keys`` by successive sampling in proportion to
        priority among those not drawn yet (Gumbel top-k over the keys' stored
        priorities, as ``sample(replace=False)`` over every slot), in draw order, or with
        ``replace=True`` ``batch_size`` keys drawn independently, key ``i`` with
        probability ``p_i / sum(p)`` among ``keys``; with ``P(i)`` and weights as
        :meth:`sample` gives them (``P(i) = p_i / total`` over every live step, the
        weights from the smallest stored priority). The schedule is not advanced.

        Args:
            keys: Distinct live keys ``[n]`` to draw among.
            batch_size: B.
            lanes: Lane bookkeeping of the table.
            rng: Generator.
            beta: IS exponent (None: the schedule's).
            replace: Draw independently (True) or distinct keys (False).
            **kwargs: Ignored (the sample call's other options).

        Returns:
            Keys, probabilities ``P(i)`` and weights, each ``[B]``.

        Raises:
            ConfigError: Bad ``beta``.
            EmptyBufferError: Fewer than ``batch_size`` of ``keys`` (``replace=True``:
                none) have a positive priority (nothing is drawn).

        Example:
            >>> s = PrioritizedSampler(alpha=1.0, eps=0.0, kernel="numpy"); s.bind(4, 1)
            >>> s.on_write(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]))
            >>> lv = LaneView(T=4, lanes=1, written=np.array([4]), counts=np.array([4]))
            >>> res = s.sample_among(np.array([0, 2]), 2, lv, np.random.default_rng(0))
            >>> sorted(res.keys.tolist()), bool(np.allclose(res.probabilities.sum(), 0.4))
            ([0, 2], True)
        """
        b = self.resolve_beta(beta)
        keys = np.asarray(keys, np.int64)
        p = self.key_weights(keys, lanes)
        nz = np.flatnonzero(p > 0)
        if replace and len(nz):
            cum = np.cumsum(p[nz])
            at = np.searchsorted(cum, rng.random(batch_size) * cum[-1], side="right")
            pick = nz[np.minimum(at, len(nz) - 1)]
            return self._weighed(keys[pick], p[pick], b, lanes)
        if len(nz) < batch_size:
            raise EmptyBufferError(
                f"sample(batch_size={batch_size}, replace=False): only {len(nz)} of the "
                f"{len(keys)} keys to draw among have a positive priority; lower batch_size "
                "or use replace=True")
        pick = nz[_successive(p[nz], batch_size, rng)]
        return self._weighed(keys[pick], p[pick], b, lanes)

    # ------------------------------------------------------------------ state
    def drawable(self) -> npt.NDArray[np.bool_]:
        """``[T * lanes]``: the slots whose stored priority is positive.

        Example:
            >>> s = PrioritizedSampler(kernel="numpy"); s.bind(3, 1)
            >>> s.on_write(np.array([1])); s.drawable().tolist()
            [False, True, False]
        """
        self._bound()
        out: npt.NDArray[np.bool_] = sumtree.leaves(self._sum, self._off)[:self._n] > 0
        return out

    def state_dict(self) -> dict[str, Any]:
        """``priorities`` (stored, one per slot), ``max_priority``, ``calls``."""
        return {
            "priorities": sumtree.leaves(self._sum, self._off)[:self._n].copy(),
            "max_priority": self.max_priority,
            "calls": self.calls,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` (rebuilds both trees).

        Everything is checked before anything changes.

        Raises:
            CheckpointError: An entry is missing, the number of slots differs from the
                bound buffer's, a priority is negative, NaN or infinite, ``max_priority``
                is not positive and finite, or ``calls`` is not an int >= 0.
        """
        self._bound()
        where = "PrioritizedSampler.load_state_dict"
        damaged = "the sampler state is damaged, restore it from a checkpoint"
        if not isinstance(state, dict) or not {"priorities", "max_priority", "calls"} <= set(
                state):
            raise CheckpointError(f"{where}: state {describe(state)} lacks priorities, "
                                  "max_priority or calls; pass a PrioritizedSampler.state_dict()")
        try:
            p = np.asarray(state["priorities"], dtype=np.float64)
            top = float(state["max_priority"])
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: priorities or max_priority are not numbers "
                                  f"({exc}); {damaged}") from exc
        if p.shape != (self._n,):
            raise CheckpointError(
                f"{where}: priorities have shape {p.shape} but the buffer has {self._n} "
                "slots; load into a buffer of the same capacity"
            )
        bad = np.flatnonzero(~np.isfinite(p) | (p < 0))
        if len(bad):
            raise CheckpointError(f"{where}: priorities[{bad[0]}] = {p[bad[0]]}; stored "
                                  f"priorities must be finite and >= 0: {damaged}")
        if not (np.isfinite(top) and top > 0):
            raise CheckpointError(f"{where}: max_priority = {top}; must be finite and > 0: "
                                  f"{damaged}")
        calls = state["calls"]
        if isinstance(calls, (bool, np.bool_)) or not isinstance(calls, (int, np.integer)) \
                or calls < 0:
            raise CheckpointError(f"{where}: calls = {calls!r}; must be an int >= 0: {damaged}")
        sumtree.build_pair(self._sum, self._min, self._off, self.fanout, p)
        self.max_priority = top
        self.calls = int(calls)

    def config(self) -> dict[str, Any]:
        """Constructor arguments (JSON-able) with ``"type": "prioritized"``."""
        return {
            "type": "prioritized", "alpha": self.alpha, "beta": self.beta, "eps": self.eps,
            "weight_norm": self.weight_norm, "beta_schedule": self.beta_schedule,
            "beta_steps": self.beta_steps, "fanout": self.fanout,
        }

    def __repr__(self) -> str:
        return (f"PrioritizedSampler(alpha={self.alpha}, beta={self.beta}, eps={self.eps}, "
                f"weight_norm={self.weight_norm!r}, kernel={self.kernel_name!r})")


def _successive(weights: FloatArray, batch_size: int, rng: np.random.Generator) -> IntArray:
    """Positions ``[B]`` of a successive sample of ``batch_size`` of the positive
    ``weights`` (each next in proportion to its weight among those not drawn yet), in
    draw order: the ``B`` largest Gumbel-perturbed log weights (Gumbel top-k).

    Example:
        >>> sorted(_successive(np.array([1.0, 5.0, 2.0]), 3, np.random.default_rng(0)).tolist())
        [0, 1, 2]
    """
    keys = np.log(weights) + rng.gumbel(size=len(weights))
    top = np.argpartition(-keys, batch_size - 1)[:batch_size]
    return np.asarray(top[np.argsort(-keys[top])], np.int64)
