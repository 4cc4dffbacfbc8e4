"""The off-policy replay buffer: a step table + a sampler + a view.

Example:
    >>> import numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=100, seed=0)
    >>> for t in range(10):
    ...     buf.add(obs=np.full(3, t, np.float32), action=t % 2, reward=1.0,
    ...             next_obs=np.full(3, t + 1, np.float32), terminated=t == 9, truncated=False)
    >>> len(buf)
    10
    >>> batch = buf.sample(4)
    >>> bool(np.all(batch.next_obs[:, 0] == batch.obs[:, 0] + 1))
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.batch import Batch
from replaybank.buffers.fastpath import FastPlan
from replaybank.buffers.inputs import (
    UNSET,
    collect_fields,
    flags_as_bool,
    leading_dims,
    obs_fields,
    one_env_lead,
    prepare,
    split_next,
    standard_spec,
)
from replaybank.buffers.sequences import sample_sequences, update_sequence_priorities
from replaybank.errors import CapacityError, ConfigError, DtypeError, ShapeError, describe
from replaybank.ops import ring
from replaybank.samplers.base import (
    LaneView,
    PrioritySampler,
    Sampler,
    SampleResult,
    StatelessSampler,
)
from replaybank.samplers.uniform import UniformSampler, check_batch_size, one_lane_keys
from replaybank.spec import Spec
from replaybank.storage import make_backend
from replaybank.storage.backend import ArrayBackend
from replaybank.storage.table import StepTable
from replaybank.storage.table_state import load_table_state, table_state
from replaybank.views import make_view
from replaybank.views.transition import InputTransform, TransitionView, View

__all__ = ["ReplayBuffer", "make_rng", "positive_int"]

IntArray = npt.NDArray[np.int64]


def make_rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    """numpy's ``default_rng`` convention: an int seed, a Generator (used as is) or None."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                             or seed < 0):
        raise ConfigError(
            f"seed={seed!r}: expected a non-negative int, a numpy Generator or None; "
            "pass e.g. seed=0"
        )
    return np.random.default_rng(seed)


def positive_int(name: str, value: Any) -> int:
    """Validate a positive integer argument."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigError(f"{name}={value!r}: must be a positive int; pass e.g. {name}=1")
    return int(value)


class ReplayBuffer:
    """Uniform (or any sampler's) experience replay over ``num_envs`` lanes.

    Storage is ``[capacity // num_envs, num_envs, *shape]`` per field; each env's steps
    are contiguous in time. Each observation is stored once; ``next_obs`` is returned
    exactly as it was passed (see :class:`~replaybank.storage.table.StepTable`).

    Args:
        capacity: Total transitions over all lanes; must divide by ``num_envs``.
        num_envs: Number of lanes (parallel environments).
        seed: Seed or Generator for sampling.
        spec: Field specs (``{name: (shape, dtype)}`` or a Spec); inferred from the
            first add when None. reward (float32), terminated and truncated (bool) are
            added when absent.
        sampler: Which steps to draw (default :class:`UniformSampler`).
        view: What a step becomes; default built from ``n_step``, ``gamma`` and
            ``frame_stack`` (:func:`replaybank.views.make_view`).
        n_step: n-step returns computed at sample time (1 = plain transitions).
        gamma: Discount for n-step returns.
        frame_stack: Rebuild k-frame stacks of obs/next_obs at sample time from single
            stored frames (1 = off).
        storage: ``"numpy"``, ``"memmap"`` (needs ``path``) or ``"torch"`` (``device``),
            or an :class:`~replaybank.storage.backend.ArrayBackend`.
        path: Directory of the memmap files.
        device: Torch device of torch storage.
        lane_split: ``"random"`` divides each batch randomly among the lanes (fishyrl's
            IndependentVectorizedBuffer; :class:`~replaybank.samplers.lane_split.
            LaneSplitSampler`) instead of uniform over all steps of all lanes.

    Raises:
        CapacityError: capacity not a positive int, not divisible by num_envs, or too
            large for the available memory.

    Example:
        >>> import numpy as np
        >>> buf = ReplayBuffer(capacity=8, num_envs=2, seed=1)
        >>> buf.add(obs=np.zeros((2, 4), np.float32), action=np.array([0, 1]),
        ...         reward=np.array([1.0, 0.5]), next_obs=np.ones((2, 4), np.float32),
        ...         terminated=np.array([False, True]), truncated=np.array([False, False]))
        >>> len(buf), buf.capacity, buf.num_envs
        (2, 8, 2)
        >>> buf.sample(3).obs.shape
        (3, 4)
    """

    def __init__(
        self,
        capacity: int,
        num_envs: int = 1,
        seed: int | np.random.Generator | None = None,
        spec: Any = None,
        sampler: Sampler | None = None,
        view: View | None = None,
        n_step: int = 1,
        gamma: float = 0.99,
        frame_stack: int = 1,
        storage: str | ArrayBackend = "numpy",
        path: Any = None,
        device: Any = None,
        lane_split: str | None = None,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) \
                or capacity <= 0:
            raise CapacityError(
                f"capacity={capacity!r}: must be a positive int (total transitions over all "
                "envs); pass e.g. capacity=100_000"
            )
        num_envs = positive_int("num_envs", num_envs)
        if capacity % num_envs:
            raise CapacityError(
                f"capacity={capacity} does not divide by num_envs={num_envs}: each env gets "
                f"capacity // num_envs rows; use a multiple of num_envs, e.g. "
                f"{(capacity // num_envs) * num_envs} or {(capacity // num_envs + 1) * num_envs}"
            )
        self._capacity = int(capacity)
        self._num_envs = num_envs
        self._rng = make_rng(seed)
        if lane_split is not None:
            if lane_split != "random" or sampler is not None:
                raise ConfigError(
                    f"lane_split={lane_split!r}: use lane_split='random' (fishyrl's "
                    "IndependentVectorizedBuffer) without a sampler=, or pass "
                    "sampler=LaneSplitSampler() yourself"
                )
            from replaybank.samplers.lane_split import LaneSplitSampler

            sampler = LaneSplitSampler()
        self.sampler: Sampler = sampler if sampler is not None else UniformSampler()
        if view is not None and (n_step != 1 or frame_stack != 1):
            raise ConfigError(
                f"view={type(view).__name__} and n_step={n_step}/frame_stack={frame_stack} "
                "both given; pass either a view or n_step/frame_stack"
            )
        self.view: View = view if view is not None else make_view(n_step, gamma, frame_stack)
        self._init_args: dict[str, Any] = {
            "n_step": n_step, "gamma": gamma, "frame_stack": frame_stack,
            "storage": storage if isinstance(storage, str) else storage.name,
            "path": None if path is None else str(path),
            "device": None if device is None else str(device),
        }
        self.backend: ArrayBackend = make_backend(storage, path, device)
        self._table: StepTable | None = None
        # the buffer persistent storage records as its owner (a wrapper, or None: self)
        self.storage_owner: Any = None
        self._fast: FastPlan | None = None
        self._lane_view: LaneView | None = None
        self.sampler.bind(self.rows, num_envs)
        if spec is not None:
            self._allocate(standard_spec(Spec.coerce(spec)))

    # ------------------------------------------------------------------ properties
    @property
    def capacity(self) -> int:
        """Total transitions over all lanes."""
        return self._capacity

    @property
    def num_envs(self) -> int:
        """Number of lanes."""
        return self._num_envs

    @property
    def rows(self) -> int:
        """Rows per lane, ``capacity // num_envs``."""
        return self._capacity // self._num_envs

    @property
    def spec(self) -> Spec | None:
        """Stored fields (None until the first add when no spec was given)."""
        return self._table.spec if self._table is not None else None

    @property
    def table(self) -> StepTable:
        """The underlying step table (raises before the first add)."""
        if self._table is None:
            raise ShapeError("the buffer has no storage yet; add a transition or pass spec=")
        return self._table

    @property
    def rng(self) -> np.random.Generator:
        """The sampling generator."""
        return self._rng

    def __len__(self) -> int:
        t = self._table
        if t is None:
            return 0
        if t.lanes == 1:
            return int(t.counts[0])
        # a Python sum of a few lanes costs less than numpy's reduction call
        return sum(t.counts.tolist()) if t.lanes <= 64 else int(t.counts.sum())

    def lane_view(self) -> LaneView:
        """Current lane bookkeeping for samplers."""
        t = self.table
        lv = self._lane_view
        if lv is None or lv.written is not t.written or lv.counts is not t.counts:
            lv = self._lane_view = LaneView(t.T, t.lanes, t.written, t.counts)
        return lv

    @property
    def episodes_seen(self) -> int:
        """Episodes that ended (terminated or truncated) since construction."""
        return 0 if self._table is None else int(self._table.episodes.sum())

    def nbytes(self) -> int:
        """Bytes held by the storage arrays (data, side store and bookkeeping)."""
        if self._table is None:
            return 0
        t = self._table
        arrays = [*t.arrays.values(), *t.side.values(), *t.state_arrays().values()]
        return int(sum(getattr(a, "nbytes", 0) for a in arrays))

    # ------------------------------------------------------------------ writing
    def _allocate(self, spec: Spec) -> None:
        self._table = StepTable(spec, self.rows, self._num_envs, obs_fields(spec),
                                backend=self.backend)
        attach = getattr(self.backend, "attach", None)
        if attach is not None:  # persistent storage records how to rebuild its owner
            attach(self if self.storage_owner is None else self.storage_owner)

    def _lane_ids(self, env_ids: Any) -> IntArray:
        if env_ids is None:
            return np.arange(self._num_envs, dtype=np.int64)
        ids = np.asarray(env_ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or len(ids) == 0:
            raise ShapeError(
                f"env_ids={describe(env_ids)}: expected a non-empty 1-D list of int env "
                f"indices in [0, {self._num_envs}); pass e.g. env_ids=[0]"
            )
        if np.any(ids < 0) or np.any(ids >= self._num_envs) or len(set(ids.tolist())) != len(ids):
            raise ShapeError(
                f"env_ids={ids.tolist()}: expected distinct env indices in "
                f"[0, {self._num_envs}) (num_envs={self._num_envs}); drop duplicates and "
                "out-of-range ids"
            )
        return ids.astype(np.int64)

    def _write(self, fields: dict[str, Any], steps: bool, env_ids: Any, priority: Any) -> IntArray:
        call = "extend" if steps else "add"
        lane_ids = self._lane_ids(env_ids)
        m = len(lane_ids)
        explicit = m > 1 or env_ids is not None
        if isinstance(self.view, InputTransform):
            fields = self.view.prepare_inputs(fields, steps, m)
        if self._table is None:
            # infer the spec, but allocate only once the whole call is known to be valid
            raw, _ = split_next(fields)
            n0 = self._steps_of(fields, 1) if steps else 0
            lead0: tuple[int, ...] = ((n0,) if steps else ()) + ((m,) if explicit else ())
            if not explicit:  # one env may still come with its lane dim of 1
                lead0 = one_env_lead(fields, lead0)
            spec = standard_spec(flags_as_bool(Spec.infer(raw, lead0)))
        else:
            spec = self._table.spec
        cands: list[tuple[int, ...]]
        if steps:
            cands = [(1, m)] if explicit else [(1,), (1, 1)]
        else:
            cands = [(m,)] if explicit else [(), (1,)]
        lead = leading_dims(spec, fields, cands, call)
        if steps:
            n = self._steps_of(fields, len(lead))
            lead = (n, *lead[1:])
            out = (n, m)
        else:
            out = (1, m)
        values, nxt = prepare(spec, fields, lead, out, call)
        prio = self._check_priority(priority, out)
        if self._table is None:
            self._allocate(spec)
        keys = self.table.write(lane_ids, values, nxt)
        if type(self.sampler) is not UniformSampler or prio is not None:
            slots = ring.key_to_slot(keys.reshape(-1), self.rows, self._num_envs)
            self.sampler.on_write(slots, prio)
        return keys

    def _plan(self) -> FastPlan | None:
        """The cached fast-path plan for the current table (None: always validate fully)."""
        t = self._table
        plan = self._fast
        if plan is not None and plan.table is t and plan.owner is self.sampler \
                and plan.view is self.view:
            return plan
        if t is None or isinstance(self.view, InputTransform) or t.obs_fields != ["obs"] \
                or not all(isinstance(a, np.ndarray) for a in t.arrays.values()) \
                or not all(isinstance(a, np.ndarray) for a in t.side.values()):
            return None
        # samplers whose on_write does nothing need not hear about writes
        quiet = getattr(type(self.sampler), "on_write", None) is StatelessSampler.on_write
        plan = FastPlan(t, None if quiet else self.sampler)
        plan.owner, plan.view = self.sampler, self.view  # rebuilt if either is swapped
        self._fast = plan
        return plan

    @staticmethod
    def _steps_of(fields: Mapping[str, Any], ndim_lead: int) -> int:
        from replaybank.errors import SpecError
        from replaybank.spec import as_array

        values, _ = split_next(fields)
        if not values:
            raise SpecError("extend: no fields given; pass obs, action, reward, next_obs, "
                            "terminated, truncated")
        first = next((k for k in values if k == "obs" or k.startswith("obs/")), next(iter(values)))
        arr = as_array(values[first])
        if arr.ndim < 1 or ndim_lead < 1:
            raise ShapeError(
                f"extend: {first}={describe(values[first])}: expected a leading step dim T; "
                "use add() for a single step"
            )
        return int(arr.shape[0])

    def _check_priority(self, priority: Any, out: tuple[int, int]) -> Any:
        if priority is None:
            return None
        if not isinstance(self.sampler, PrioritySampler):
            raise ConfigError(
                f"priority={describe(priority)}: this buffer's sampler "
                f"({type(self.sampler).__name__}) has no priorities; use a PrioritizedSampler"
            )
        p = np.asarray(priority, dtype=np.float64)
        if p.size == 1:
            p = np.full(out, float(p.reshape(-1)[0]))
        if p.size != out[0] * out[1]:
            raise ShapeError(
                f"priority={describe(priority)}: expected one priority per step "
                f"({out[0] * out[1]} values)"
            )
        if not np.all(np.isfinite(p)) or np.any(p < 0):
            raise DtypeError(f"priority={describe(priority)}: must be finite and >= 0")
        return p.reshape(-1)

    def add(self, *, obs: Any = UNSET, action: Any = UNSET, reward: Any = UNSET,
            next_obs: Any = UNSET, terminated: Any = UNSET, truncated: Any = UNSET,
            env_ids: Any = None, priority: Any = None, **extras: Any) -> None:
        """Add one step of one env (``num_envs=1``) or of every env (leading dim num_envs).

        Args:
            obs: Observation ``[*obs_shape]`` (``[num_envs, *obs_shape]`` with several
                envs); a nested dict of arrays for dict observation spaces.
            action: Action taken.
            reward: Reward received (stored as float32 unless the spec says otherwise).
            next_obs: Observation after the step; for an episode's last step, the true
                final observation (never the reset one).
            terminated: The episode ended in a terminal state.
            truncated: The episode was cut off (time limit); bootstrapping uses next_obs.
            env_ids: Lanes this step belongs to (async vector envs); values then have
                leading dim ``len(env_ids)``.
            priority: Initial priority (prioritized samplers only).
            **extras: Any other stored field (log_prob, hidden state, info arrays).

        Raises:
            SpecError, ShapeError, DtypeError: Bad input; the buffer is left unchanged.
        """
        if env_ids is None and priority is None:
            plan = self._plan()
            if plan is not None:
                if plan.c_add(obs, action, reward, next_obs, terminated, truncated, extras):
                    return  # the compiled writer took it
                lane = plan.lane
                if lane is not None:  # one in-memory lane: the lean writer
                    if lane.add(obs, action, reward, next_obs, terminated, truncated, extras):
                        return
                else:
                    fields = collect_fields(obs, action, reward, next_obs, terminated,
                                            truncated, extras)
                    m = self._num_envs
                    if plan.add_one(fields) if m == 1 else plan.write(fields, (m,), (1, m)):
                        return
        fields = collect_fields(obs, action, reward, next_obs, terminated, truncated, extras)
        self._write(fields, False, env_ids, priority)

    def extend(self, *, obs: Any = UNSET, action: Any = UNSET, reward: Any = UNSET,
               next_obs: Any = UNSET, terminated: Any = UNSET, truncated: Any = UNSET,
               env_ids: Any = None, priority: Any = None, **extras: Any) -> None:
        """Add many steps: values shaped ``[T, *shape]`` (one env) or ``[T, num_envs, *shape]``.

        Args:
            obs, action, reward, next_obs, terminated, truncated: As in :meth:`add`, with
                a leading step dimension.
            env_ids: Lanes these steps belong to; values are then ``[T, len(env_ids), ...]``.
            priority: Initial priorities (prioritized samplers only).
            **extras: As in :meth:`add`, with a leading step dimension.

        Raises:
            SpecError, ShapeError, DtypeError: Bad input; the buffer is left unchanged.
        """
        if env_ids is None and priority is None:
            plan = self._plan()
            if plan is not None:
                if plan.c_extend(obs, action, reward, next_obs, terminated, truncated, extras):
                    return  # the compiled writer took it
                lane = plan.lane
                if lane is not None and lane.extend(obs, action, reward, next_obs, terminated,
                                                    truncated, extras):
                    return
                if type(obs) is np.ndarray and obs.ndim >= 1:
                    m, n = self._num_envs, obs.shape[0]
                    fields = collect_fields(obs, action, reward, next_obs, terminated,
                                            truncated, extras)
                    if plan.write(fields, (n,) if m == 1 else (n, m), (n, m)):
                        return
        fields = collect_fields(obs, action, reward, next_obs, terminated, truncated, extras)
        self._write(fields, True, env_ids, priority)

    add_multi = extend

    def clear(self) -> None:
        """Drop every stored step (storage stays allocated)."""
        if self._table is not None:
            self._table.clear()
        self.sampler.on_clear()

    # ------------------------------------------------------------------ sampling
    def _draw(self, batch_size: int, first: Any = None, **kwargs: Any) -> Any:
        """Draw keys with the sampler (``first``: the sampler's result, already drawn),
        redrawing the ones the view cannot serve."""
        lv = self.lane_view()
        res = self.sampler.sample(batch_size, lv, self._rng, **kwargs) if first is None \
            else first
        if type(self.view) is TransitionView:  # serves every step: nothing to check
            return res
        ok = self.view.valid(self.table, res.keys)
        tries = 0
        while ok is not None and not np.all(ok):
            tries += 1
            if tries > 64:
                raise ShapeError(
                    f"sample(batch_size={batch_size}): could not find steps the view "
                    f"{type(self.view).__name__} can serve; add more data"
                )
            bad = np.flatnonzero(~ok)
            more = self.sampler.sample(len(bad), lv, self._rng, **kwargs)
            res = _replace_rows(res, bad, more)
            ok = self.view.valid(self.table, res.keys)
        return res

    def sample(self, batch_size: int, replace: bool = True, **kwargs: Any) -> Batch:
        """Sample a batch of transitions.

        Args:
            batch_size: Number of transitions B.
            replace: Draw with replacement (default) or distinct transitions.
            **kwargs: Sampler options (e.g. ``beta`` for prioritized replay).

        Returns:
            A :class:`~replaybank.batch.Batch` with fields ``[B, *shape]``, ``indices``
            (item keys for :meth:`update_priorities`) and, from prioritized samplers,
            ``weights`` and ``probabilities``.

        Raises:
            EmptyBufferError: The buffer is empty, or ``replace=False`` and
                ``batch_size > len(buf)``.
        """
        t = self._table
        if type(self.sampler) is UniformSampler and t is not None:
            # the uniform sampler validates the same way itself, before it draws
            if replace is True and not kwargs and t.lanes == 1:
                # the common case without the sampler protocol round trip: the same keys
                # as UniformSampler.sample
                keys = one_lane_keys(batch_size, t.written, t.counts, self._rng)
                if type(self.view) is TransitionView:  # and the same fields as the view
                    data = t.gather_transitions(keys, live=True)
                    data["indices"] = keys
                    return Batch.own(data)
                # views that check and gather in one pass (frame stacks): None when a key
                # must be redrawn, which _draw then does exactly as without the shortcut
                fused = getattr(self.view, "gather_valid", None)
                got: dict[str, Any] | None = None if fused is None else fused(t, keys)
                if got is None:
                    keys = self._draw(batch_size, SampleResult(keys), replace=True).keys
                    got = self.view.gather(t, keys)
                got["indices"] = keys
                return Batch.own(got)
        else:
            check_batch_size(batch_size, len(self), replace)
        fused = getattr(self.view, "gather_valid", None)
        got = None
        if fused is not None and t is not None:  # check and gather in one pass
            res = self.sampler.sample(batch_size, self.lane_view(), self._rng,
                                      replace=replace, **kwargs)
            got = fused(t, res.keys)
            if got is None:  # a key must be redrawn: exactly as _draw alone would
                res = self._draw(batch_size, res, replace=replace, **kwargs)
        else:
            res = self._draw(batch_size, replace=replace, **kwargs)
        data = self.view.gather(self.table, res.keys) if got is None else got
        data["indices"] = res.keys
        if res.weights is not None:
            data["weights"] = res.weights.astype(np.float32)
        if res.probabilities is not None:
            data["probabilities"] = res.probabilities
        return Batch.own(data)

    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """Set new priorities (e.g. ``|td_error|``) for sampled ``batch.indices``.

        Indices whose step was overwritten since it was sampled are ignored, so an
        asynchronous learner never changes the priority of new data.

        Returns:
            Number of priorities applied (stale ones excluded).

        Raises:
            ConfigError: The sampler has no priorities.
            ShapeError: Lengths differ.
            DtypeError: A priority is negative, NaN or infinite.
        """
        # a plain attribute check: isinstance() on a runtime Protocol costs ~40 us a call
        update = getattr(self.sampler, "update", None)
        if not callable(update):
            raise ConfigError(
                f"update_priorities: this buffer's sampler ({type(self.sampler).__name__}) "
                "has no priorities; build it with sampler=PrioritizedSampler(...)"
            )
        keys = ring.as_int_array(indices, "indices")
        p = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if len(p) != len(keys):
            raise ShapeError(
                f"update_priorities: {len(keys)} indices but {len(p)} priorities; "
                "pass one priority per index"
            )
        if not np.all(np.isfinite(p)) or np.any(p < 0):
            bad = p[~np.isfinite(p) | (p < 0)][:4].tolist()
            raise DtypeError(
                f"update_priorities(priorities=...): values {bad} are negative, NaN or "
                "infinite; pass finite priorities >= 0 (e.g. abs(td_error))"
            )
        fused = getattr(self.sampler, "update_keys", None)
        if fused is not None:  # PrioritizedSampler: stale filter + slots + update in one pass
            return int(fused(keys, p, self.lane_view()))
        t = self.table
        live = ring.is_live(keys, t.written, t.counts)
        slots = ring.key_to_slot(keys[live], t.T, t.lanes)
        update(slots, p[live])
        return int(live.sum())

    # ------------------------------------------------------------------ sequences
    def sample_sequences(self, batch_size: int, sequence_length: int, **kwargs: Any) -> Any:
        """Sample ``[B, L]`` windows; see :func:`replaybank.buffers.sequences.sample_sequences`."""
        return sample_sequences(self, batch_size, sequence_length, **kwargs)

    def update_sequence_priorities(self, starts: Any, td_errors: Any, eta: float = 0.9,
                                   mask: Any = None) -> int:
        """R2D2 sequence priorities; see :mod:`replaybank.buffers.sequences`."""
        return update_sequence_priorities(self, starts, td_errors, eta=eta, mask=mask)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to restore this buffer exactly.

        Returns:
            A nested dict whose leaves are numpy arrays (views, not copies) or JSON-able
            values: ``metadata``, ``init`` (constructor arguments), ``rng`` (generator
            state), ``sampler`` (its state dict), ``table`` (``fields/<name>``,
            ``side/<name>`` and ``meta/<name>`` arrays), ``side_capacity``.
        """
        state: dict[str, Any] = {
            "metadata": self.metadata(),
            "init": dict(self._init_args),
            "rng": _rng_state(self._rng),
            "sampler": self.sampler.state_dict(),
        }
        if self._table is not None:
            state["table"] = table_state(self._table)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` (spec, capacity and lanes must match).

        Raises:
            CheckpointError: The state does not match this buffer.
        """
        from replaybank.errors import CheckpointError

        meta = state["metadata"]
        for key, mine in (("capacity", self._capacity), ("num_envs", self._num_envs)):
            if meta.get(key) != mine:
                raise CheckpointError(
                    f"load_state_dict: state has {key}={meta.get(key)!r} but this buffer has "
                    f"{key}={mine}; build the buffer with the saved {key}"
                )
        spec_json = meta.get("spec")
        if spec_json is None:
            self.clear()
        else:
            spec = Spec.from_json(spec_json)
            if self._table is None:
                self._allocate(spec)
            elif self._table.spec != spec:
                raise CheckpointError(
                    f"load_state_dict: state spec {spec} differs from the buffer's "
                    f"{self._table.spec}"
                )
            load_table_state(self.table, state["table"])
        self.sampler.load_state_dict(state["sampler"])
        self._rng.bit_generator.state = state["rng"]

    def save(self, dirpath: Any, prefix: str = "buffer_") -> None:
        """Write ``<prefix>metadata.json`` and ``<prefix>state.safetensors`` atomically."""
        from replaybank.io.checkpoint import save_buffer

        save_buffer(self, dirpath, prefix=prefix)

    @classmethod
    def load(cls, dirpath: Any, prefix: str = "buffer_") -> Any:
        """Restore a buffer saved with :meth:`save` (identical next sample)."""
        from replaybank.io.checkpoint import load_buffer

        return load_buffer(dirpath, prefix=prefix)

    @classmethod
    def open(cls, path: Any) -> Any:
        """Reopen a memmap buffer at ``path`` and continue where it stopped."""
        from replaybank.storage.memmap import open_buffer

        return open_buffer(path)

    def config(self) -> Any:
        """A validated config object (pydantic) that rebuilds an equivalent empty buffer."""
        from replaybank.config import buffer_config

        return buffer_config(self)

    def warm(self, agent: Any, n_samples: int, num_envs: int = 8, **kwargs: Any) -> Any:
        """Pre-fill from a vectorized copy of the agent's env; see
        :func:`replaybank.integrations.gymnasium.warm`."""
        from replaybank.integrations.gymnasium import warm

        return warm(self, agent, n_samples, num_envs=num_envs, **kwargs)

    def metadata(self) -> dict[str, Any]:
        """JSON-able description: type, capacity, num_envs, size, spec, sampler, view."""
        return {
            "type": type(self).__name__,
            "capacity": self._capacity,
            "num_envs": self._num_envs,
            "size": len(self),
            "episodes_seen": self.episodes_seen,
            "spec": None if self._table is None else self._table.spec.to_json(),
            "sampler": self.sampler.config(),
            "view": self.view.config(),
            "storage": self.backend.name,
        }

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(capacity={self._capacity}, num_envs={self._num_envs}, "
                f"size={len(self)}, sampler={type(self.sampler).__name__}, "
                f"view={type(self.view).__name__})")


def _rng_state(rng: np.random.Generator) -> dict[str, Any]:
    state = rng.bit_generator.state
    return dict(state)


def _replace_rows(res: Any, rows: IntArray, more: Any) -> Any:
    keys = res.keys.copy()
    keys[rows] = more.keys
    probs = weights = None
    if res.probabilities is not None and more.probabilities is not None:
        probs = res.probabilities.copy()
        probs[rows] = more.probabilities
    if res.weights is not None and more.weights is not None:
        weights = res.weights.copy()
        weights[rows] = more.weights
    return SampleResult(keys, probs, weights)
