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

from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.batch import Batch
from replaybank.buffers import arguments, replay_priorities, replay_state
from replaybank.buffers.arguments import make_rng, positive_int
from replaybank.buffers.fastpath import FastPlan
from replaybank.buffers.inputs import (
    UNSET,
    collect_fields,
    leading_dims,
    obs_fields,
    prepare,
    standard_spec,
)
from replaybank.buffers.replay_draws import draw
from replaybank.buffers.replay_inputs import call_spec, lane_ids, steps_of
from replaybank.buffers.replay_priorities import check_priority
from replaybank.buffers.sequences import sample_sequences, update_sequence_priorities
from replaybank.errors import ShapeError
from replaybank.ops import ring
from replaybank.samplers.base import LaneView, Sampler, SampleResult, StatelessSampler
from replaybank.samplers.uniform import UniformSampler, check_batch_size, one_lane_keys
from replaybank.spec import Spec
from replaybank.storage import make_backend
from replaybank.storage.backend import ArrayBackend
from replaybank.storage.table import StepTable
from replaybank.storage.table_state import load_table_state
from replaybank.views.transition import TransitionView, View, input_transform

__all__ = ["ReplayBuffer", "make_rng", "positive_int"]

IntArray = npt.NDArray[np.int64]


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
        self._capacity, self._num_envs = arguments.check_capacity(capacity, num_envs)
        self._rng = make_rng(seed)
        self.sampler: Sampler = arguments.replay_sampler(sampler, lane_split)
        self.view: View = arguments.replay_view(view, n_step, gamma, frame_stack)
        self._init_args: dict[str, Any] = replay_state.init_args(
            n_step, gamma, frame_stack, storage, path, device)
        self.backend: ArrayBackend = make_backend(storage, path, device)
        self._table: StepTable | None = None
        # the buffer persistent storage records as its owner (a wrapper, or None: self)
        self.storage_owner: Any = None
        self._fast: FastPlan | None = None
        self._lane_view: LaneView | None = None
        # the view's input transform (frame stacks keep the newest frame), per view object
        self._tview: Any = None
        self._transform: Any = None
        self.sampler.bind(self.rows, self._num_envs)
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

    def _prepare(self, steps: bool, env_ids: Any, obs: Any, action: Any, reward: Any,
                 next_obs: Any, terminated: Any, truncated: Any, extras: dict[str, Any]
                 ) -> tuple[Any, ...]:
        """The call's values as the view's input transform rewrites them (e.g. the newest
        frame of stacked observations), split again into the standard fields and extras,
        so that every write path after it sees what is stored."""
        # bad env_ids: the general path's error
        m = self._num_envs if env_ids is None else len(lane_ids(env_ids, self._num_envs))
        fields = self._transform.prepare_inputs(
            collect_fields(obs, action, reward, next_obs, terminated, truncated, extras),
            steps, m)
        std = tuple(fields.pop(k, UNSET) for k in
                    ("obs", "action", "reward", "next_obs", "terminated", "truncated"))
        return (*std, fields)

    def _write(self, fields: dict[str, Any], steps: bool, env_ids: Any, priority: Any) -> IntArray:
        """The general (fully validated) write; an input transform was already applied."""
        call = "extend" if steps else "add"
        lanes = lane_ids(env_ids, self._num_envs)
        m = len(lanes)
        explicit = m > 1 or env_ids is not None
        # infer the spec, but allocate only once the whole call is known to be valid
        spec = call_spec(fields, steps, m, explicit) if self._table is None \
            else self._table.spec
        cands: list[tuple[int, ...]]
        if steps:
            cands = [(1, m)] if explicit else [(1,), (1, 1)]
        else:
            cands = [(m,)] if explicit else [(), (1,)]
        lead = leading_dims(spec, fields, cands, call)
        if steps:
            n = steps_of(fields, len(lead))
            lead = (n, *lead[1:])
            out = (n, m)
        else:
            out = (1, m)
        values, nxt = prepare(spec, fields, lead, out, call)
        prio = check_priority(self.sampler, priority, out)
        if self._table is None:
            self._allocate(spec)
        keys = self.table.write(lanes, values, nxt)
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
        if t is None or t.obs_fields != ["obs"] \
                or not all(isinstance(a, np.ndarray) for a in t.arrays.values()) \
                or not all(isinstance(a, np.ndarray) for a in t.side.values()):
            return None
        # samplers whose on_write does nothing need not hear about writes
        quiet = getattr(type(self.sampler), "on_write", None) is StatelessSampler.on_write
        plan = FastPlan(t, None if quiet else self.sampler)
        plan.owner, plan.view = self.sampler, self.view  # rebuilt if either is swapped
        self._fast = plan
        return plan

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
        if self.view is not self._tview:
            self._tview, self._transform = self.view, input_transform(self.view)
        if self._transform is not None:  # e.g. frame stacks: store the newest frame
            obs, action, reward, next_obs, terminated, truncated, extras = self._prepare(
                False, env_ids, obs, action, reward, next_obs, terminated, truncated, extras)
        if priority is None:
            plan = self._plan()
            if plan is not None and env_ids is not None:  # async envs: some lanes
                if plan.c_add_lanes(env_ids, obs, action, reward, next_obs, terminated,
                                    truncated, extras):
                    return
            elif plan is not None:
                if plan.c_add(obs, action, reward, next_obs, terminated, truncated, extras) \
                        or plan.c_add_lanes(None, obs, action, reward, next_obs, terminated,
                                            truncated, extras):
                    return  # the compiled writer took it (lanes in step, or not)
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
        else:  # initial priorities (e.g. computed by actors): compiled write, then priorities
            plan = self._plan()
            if plan is not None and replay_priorities.write_prioritized(
                    self, plan, env_ids, priority, None,
                    (obs, action, reward, next_obs, terminated, truncated, extras)):
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
        if self.view is not self._tview:
            self._tview, self._transform = self.view, input_transform(self.view)
        if self._transform is not None:  # e.g. frame stacks: store the newest frame
            obs, action, reward, next_obs, terminated, truncated, extras = self._prepare(
                True, env_ids, obs, action, reward, next_obs, terminated, truncated, extras)
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
        elif env_ids is None and type(obs) is np.ndarray and obs.ndim >= 1:
            plan = self._plan()
            if plan is not None and replay_priorities.write_prioritized(
                    self, plan, None, priority, obs.shape[0],
                    (obs, action, reward, next_obs, terminated, truncated, extras)):
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
                # must be redrawn, which draw then does exactly as without the shortcut
                fused = getattr(self.view, "gather_valid", None)
                got: dict[str, Any] | None = None if fused is None else fused(t, keys)
                if got is None:
                    keys = draw(self, batch_size, SampleResult(keys), replace=True).keys
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
            if got is None:  # a key must be redrawn: exactly as draw alone would
                res = draw(self, batch_size, res, replace=replace, **kwargs)
        else:
            res = draw(self, batch_size, replace=replace, **kwargs)
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
        return replay_priorities.update_priorities(self, indices, priorities)

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
        return replay_state.buffer_state(self.metadata(), self._init_args, self._rng,
                                         self.sampler, self._table)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` (spec, capacity and lanes must match).

        Raises:
            CheckpointError: The state does not match this buffer.
        """
        spec = replay_state.checked_spec(state["metadata"], self._capacity, self._num_envs,
                                         self.spec)
        if spec is None:
            self.clear()
        else:
            if self._table is None:
                self._allocate(spec)
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

    def flush(self) -> None:
        """Make a ``storage="memmap"`` buffer durable and exactly resumable.

        Syncs the files to disk and saves the generator and sampler state (e.g. PER
        priorities) next to them, so that :meth:`open` restores the identical next
        sample as long as nothing is added after this call (see
        :mod:`replaybank.io.resume`).

        Raises:
            ConfigError: The storage is not memmap (use :meth:`save` instead).
        """
        from replaybank.io.resume import save_resume

        save_resume(self)

    @classmethod
    def open(cls, path: Any) -> Any:
        """Reopen a memmap buffer at ``path`` and continue where it stopped (with the
        generator and sampler state of its last :meth:`flush` when no step was added
        after it)."""
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
        return replay_state.buffer_metadata(self)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(capacity={self._capacity}, num_envs={self._num_envs}, "
                f"size={len(self)}, sampler={type(self.sampler).__name__}, "
                f"view={type(self.view).__name__})")
