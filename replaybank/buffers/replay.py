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

import contextlib
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, Literal, overload

import numpy as np
import numpy.typing as npt

from replaybank import persist, registry
from replaybank.batch import Batch, SequenceBatch
from replaybank.buffers import arguments, buffer_state
from replaybank.buffers.arguments import make_rng, positional_values, positive_int
from replaybank.buffers.autoreset import (
    ResetFreeRuns,
    check_autoreset_mode,
    reset_steps,
    warn_resets,
)
from replaybank.buffers.guard import CallGuard
from replaybank.buffers.inputs import (
    UNSET,
    rows_spec,
    standard_spec,
)
from replaybank.buffers.priorities import update_priorities
from replaybank.buffers.sampling_parts import Parts
from replaybank.buffers.sequences import sample_sequences, update_sequence_priorities
from replaybank.buffers.store import Store, make_store
from replaybank.buffers.write_route import WriteRoute
from replaybank.buffers.writer import StepValues
from replaybank.errors import ConfigError, EmptyBufferError, ShapeError
from replaybank.samplers.base import LaneView, Sampler, SamplerTraits
from replaybank.spec import Spec
from replaybank.storage.backends import make_backend
from replaybank.storage.backends.base import ArrayBackend
from replaybank.storage.table import StepTable
from replaybank.storage.table_state import checked_free_order, views_allowed
from replaybank.views import view_numbers
from replaybank.views.base import View

if TYPE_CHECKING:  # pydantic loads with the first config() call; the device and shared
    # rooms sit above the core (what it calls of them comes through the registry)
    import torch
    from typing_extensions import TypeVar

    from replaybank.config import AnyBuffer, BufferConfig
    from replaybank.device.prefetch import Prefetcher
    from replaybank.shared.writer import SharedWriterHandle
    from replaybank.storage.backends.memmap import MemmapBackend
    from replaybank.storage.backends.numpy import NumpyBackend

    #: What :meth:`ReplayBuffer.sample` returns values as: numpy arrays, or torch tensors
    #: for ``storage="torch"`` (the constructor's overloads choose it). A bare
    #: ``ReplayBuffer`` annotation means a buffer of any storage (``ReplayBuffer[Any]``).
    V = TypeVar("V", default=Any)
else:  # a TypeVar default is for type checkers (typing.TypeVar takes it from Python 3.13)
    V = typing.TypeVar("V")

__all__ = ["ReplayBuffer", "make_rng", "positive_int"]

IntArray = npt.NDArray[np.int64]


class ReplayBuffer(Generic[V]):
    """Uniform (or any sampler's) experience replay over ``num_envs`` lanes.

    Storage is ``[capacity // num_envs, num_envs, *shape]`` per field; each env's steps
    are contiguous in time. Each observation is stored once; ``next_obs`` is returned
    exactly as it was passed (see :class:`~replaybank.storage.table.StepTable`).

    Args:
        capacity: Total transitions over all lanes; must divide by ``num_envs``.
        num_envs: Number of lanes (parallel environments).
        seed: Seed or Generator for sampling. An int seed is recorded in :meth:`config`;
            a Generator cannot be (its seed is not readable), so the config records None.
        spec: Field specs (``{name: (shape, dtype)}`` or a Spec); inferred from the
            first add when None. reward (float32), terminated and truncated (bool) are
            added when absent.
        sampler: Which steps to draw (default :class:`UniformSampler`).
        view: What a step becomes; default built from ``n_step``, ``gamma`` and
            ``frame_stack`` (:func:`replaybank.views.make_view`).
        n_step: n-step returns computed at sample time (1 = plain transitions).
        gamma: Discount for n-step returns.
        frame_stack: Rebuild k-frame stacks of obs/next_obs at sample time from single
            stored frames (1 = off). ``spec=`` then describes the values added: an obs
            shaped ``(k, *frame)`` as ``FrameStackObservation`` gives it (e.g.
            ``rb.spec_from_env(env)``) is stored as ``frame`` (see
            :mod:`~replaybank.views.framestack`).
        storage: ``"numpy"``, ``"memmap"`` (needs ``path``) or ``"torch"`` (``device``),
            or an :class:`~replaybank.storage.backends.base.ArrayBackend`.
        path: Directory of the memmap files.
        device: Torch device of torch storage.
        lane_split: ``"random"`` divides each batch randomly among the lanes (fishyrl's
            IndependentVectorizedBuffer; :class:`~replaybank.samplers.lane_split.
            LaneSplitSampler`) instead of uniform over all steps of all lanes.
        autoreset_mode: How the data's vector envs reset finished episodes
            (:mod:`replaybank.buffers.autoreset`). ``None`` (default): look for the false
            "final observation -> reset observation" steps that adding every step of a
            gymnasium vector env in its default NEXT_STEP mode stores, and warn once
            (checked at the 1st, 2nd, 4th, ... sample; steps written inside
            :meth:`reset_free_writes`, as ``rb.collect`` writes, are not checked).
            ``"next_step"``: drop those steps
            as they arrive (each add then takes the fully checked write path).
            ``"same_step"`` or ``"disabled"``: the data has none; no check.
        next_obs: True (default): store transitions, each ``obs`` linked to its
            ``next_obs`` (stored once). False: store *rows* (sequence data that is not
            (obs, next_obs) pairs, e.g. a world model's ``{obs, action, reward,
            is_first, is_terminal}``): every key passed to :meth:`add`/:meth:`extend` is
            an ordinary stored field, ``obs`` and ``next_obs`` included (nothing is
            linked, required or derived; no ``action`` or ``reward`` is required either);
            ``terminated``/``truncated`` may be left out of any call (stored as False)
            and end episodes as usual (``sample_sequences(episode_boundary="stop")``
            stops at them; ``"cross"`` marks ``is_first`` after them). :meth:`sample`
            and :meth:`sample_sequences` return the stored fields. Reserved names
            (``done``, ``is_first``, ``mask``, ...) are refused: store them under a
            prefix. Frame stacks, n-step views and ``autoreset_mode="next_step"`` need
            next observations and are refused; the NEXT_STEP check is skipped.

    Raises:
        CapacityError: capacity not a positive int, not divisible by num_envs, or too
            large for the available memory.
        ConfigError: ``next_obs=False`` with frame stacks, n-step, a view or
            ``autoreset_mode="next_step"``.

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

        Rows (``next_obs=False``), e.g. a world model's sequence data:

        >>> rows = ReplayBuffer(capacity=64, num_envs=2, next_obs=False, seed=0)
        >>> for t in range(10):
        ...     rows.add(obs=np.full((2, 3), t, np.float32), action=np.zeros(2, np.int64),
        ...              first=np.full(2, t == 0))
        >>> sorted(rows.spec)
        ['action', 'first', 'obs', 'terminated', 'truncated']
        >>> seq = rows.sample_sequences(4, 5, episode_boundary="cross")
        >>> seq.obs.shape, "next_obs" in seq
        ((4, 5, 3), False)
    """

    # The overloads tell a type checker what sample() returns values as, from storage=:
    # numpy arrays for host storage, torch tensors for "torch" (given by keyword), and
    # either (Any) for a storage only known when the program runs.
    @overload
    def __init__(
        self: ReplayBuffer[npt.NDArray[Any]],
        capacity: int,
        num_envs: int = 1,
        seed: int | np.random.Generator | None = None,
        spec: Any = None,
        sampler: Sampler | None = None,
        view: View | None = None,
        n_step: int = 1,
        gamma: float = 0.99,
        frame_stack: int = 1,
        storage: Literal["numpy", "memmap"] | NumpyBackend | MemmapBackend = "numpy",
        path: Any = None,
        device: Any = None,
        lane_split: str | None = None,
        autoreset_mode: str | None = None,
        next_obs: bool = True,
    ) -> None: ...

    @overload
    def __init__(
        self: ReplayBuffer[torch.Tensor],
        capacity: int,
        num_envs: int = 1,
        seed: int | np.random.Generator | None = None,
        spec: Any = None,
        sampler: Sampler | None = None,
        view: View | None = None,
        n_step: int = 1,
        gamma: float = 0.99,
        frame_stack: int = 1,
        *,
        storage: Literal["torch"],
        path: Any = None,
        device: Any = None,
        lane_split: str | None = None,
        autoreset_mode: str | None = None,
        next_obs: bool = True,
    ) -> None: ...

    @overload
    def __init__(
        self: ReplayBuffer[Any],
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
        autoreset_mode: str | None = None,
        next_obs: bool = True,
    ) -> None: ...

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
        autoreset_mode: str | None = None,
        next_obs: bool = True,
    ) -> None:
        self._capacity, self._num_envs = arguments.check_capacity(capacity, num_envs)
        self._rng = make_rng(seed)
        self._seed = buffer_state.recorded_seed(seed)  # what config() records
        self.autoreset_mode = check_autoreset_mode(autoreset_mode)
        n_step, gamma, frame_stack = view_numbers(n_step, gamma, frame_stack)
        #: Stores rows (``next_obs=False``): every key is an ordinary field.
        self.rows_only = arguments.check_rows(next_obs, view, n_step, frame_stack,
                                              self.autoreset_mode)
        self._sampler: Sampler = arguments.replay_sampler(sampler, lane_split)
        self._view: View = arguments.replay_view(view, n_step, gamma, frame_stack,
                                                 self._capacity // self._num_envs)
        self._init_args: dict[str, Any] = buffer_state.init_args(
            n_step, gamma, frame_stack, storage, path, device, self.autoreset_mode,
            next_obs=not self.rows_only)
        self._samples = 0  # calls of sample(); the autoreset check runs at powers of two
        # rows hold no next observations: a NEXT_STEP reset step cannot be seen in them
        self._check_autoreset = self.autoreset_mode is None and not self.rows_only
        #: Steps written inside reset_free_writes() (by a collector): the check skips them.
        self._reset_free = ResetFreeRuns(self._num_envs)
        self._seq_widths: set[int] = set()  # window widths sample_sequences returned
        # the buffer whose config durable storage records (a wrapper, or None: self)
        self.storage_owner: Any = None
        self._parts = Parts(self.sampler, self.view)  # their capabilities, checked once
        # one call at a time: a sample never sees a half-written step
        self._guard = CallGuard()
        self.sampler.bind(self.rows, self._num_envs)
        if spec is not None:
            spec = Spec.coerce(spec)
            spec = rows_spec(spec) if self.rows_only else standard_spec(spec)
            if self._parts.specs is not None:  # spec= gives the values added (frame stacks)
                spec = self._parts.specs.stored_spec(spec)
            if self._parts.checks is not None:
                self._parts.checks.check_fields(spec)
        #: Where the steps live (local, device or shared memory) and how calls reach them.
        self._store: Store = make_store(make_backend(storage, path, device), self.rows,
                                        self._num_envs, self.rows_only, spec)
        #: Where each add and extend goes (the writer of the current table and parts).
        self.write_route = WriteRoute(self._store, self._guard, self._num_envs,
                                      self.rows_only, self.autoreset_mode == "next_step")
        self.record_owner()

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
    def backend(self) -> ArrayBackend:
        """Where the arrays live (numpy, memmap files, torch tensors)."""
        return self._store.backend

    @property
    def store(self) -> Store:
        """Where the steps live and how calls reach them (:mod:`~replaybank.buffers.store`)."""
        return self._store

    @property
    def spec(self) -> Spec | None:
        """Stored fields (None until the first add when no spec was given)."""
        t = self._store.table
        return t.spec if t is not None else None

    @property
    def allocated(self) -> bool:
        """Whether the storage exists (after the first add, or from the start with
        ``spec=``): :attr:`table` raises until it does.

        Example:
            >>> import numpy as np
            >>> buf = ReplayBuffer(8)
            >>> buf.allocated
            False
            >>> buf.add(obs=np.zeros(2), action=0, reward=0.0, next_obs=np.ones(2),
            ...         terminated=False, truncated=False)
            >>> buf.allocated
            True
        """
        return self._table is not None

    @property
    def table(self) -> StepTable:
        """The underlying step table (raises before the first add)."""
        t = self._store.table
        if t is None:
            raise ShapeError("the buffer has no storage yet; add a transition or pass spec=")
        return t

    @property
    def _table(self) -> StepTable | None:
        """The step table, or None before the first write."""
        return self._store.table

    @property
    def rng(self) -> np.random.Generator:
        """The sampling generator."""
        return self._rng

    @property
    def sampler(self) -> Sampler:
        """Which keys a sample draws (may be swapped: the new sampler is bound and told of
        every live step, and the writer is rebuilt)."""
        return self._sampler

    @sampler.setter
    def sampler(self, sampler: Sampler) -> None:
        new = arguments.check_part("sampler", sampler)
        entered = self._guard.enter()
        try:  # bound to this table and told of every live step, oldest first (the state
            # a sampler keeps of steps it did not see written: default priorities); a
            # sampler that cannot bind (memory) leaves the old one in place
            new.bind(self.rows, self._num_envs)
            if self._table is not None:
                new.on_write(buffer_state.live_slots(self._table), None)
            self._sampler = new
            self.write_route.drop()
        finally:
            self._guard.leave(entered)

    @property
    def view(self) -> View:
        """What a drawn key becomes (may be swapped: the writer is rebuilt)."""
        return self._view

    @view.setter
    def view(self, view: View) -> None:
        new = arguments.check_part("view", view)
        arguments.check_lane_spans(new, self._capacity // self._num_envs)
        checks = Parts(self._sampler, new).checks
        if checks is not None and self._table is not None:  # (as before the first add)
            checks.check_fields(self._table.spec)
        with self.exclusive():  # not while another thread's call serves with the old one
            self._view = new
            self.write_route.drop()

    def __len__(self) -> int:
        store = self._store
        if not store.size_syncs:  # a read of the counters (0.3 us less than a guarded call)
            return store.size(self._sampler)
        # a call like the others: a shared-memory store refreshes its snapshot and tells
        # the sampler what entered it (unguarded, beside another thread's sample)
        entered = self._guard.enter()
        try:
            return self._store.size(self._sampler)
        finally:
            self._guard.leave(entered)

    def lane_view(self) -> LaneView:
        """Current lane bookkeeping for samplers (raises before the first add)."""
        lv = self._store.lane_view()
        if lv is None:
            raise ShapeError("the buffer has no storage yet; add a transition or pass spec=")
        return lv

    def _lanes(self) -> LaneView | None:
        """:meth:`lane_view`, or None before the storage exists."""
        return self._store.lane_view()

    @property
    def episodes_seen(self) -> int:
        """Episodes that ended (terminated or truncated) since construction."""
        return 0 if self._table is None else int(self._table.episodes.sum())

    def nbytes(self) -> int:
        """Bytes held by the storage arrays (data, side store and bookkeeping)."""
        if self._table is None:
            return 0
        t = self._table
        arrays = [*t.arrays.values(), *t.side.arrays.values(), *t.state_arrays().values()]
        return int(sum(a.nbytes for a in arrays))

    @property
    def sampler_traits(self) -> SamplerTraits:
        """What the current sampler declares it can do (checked once per sampler)."""
        return self._current_parts().traits

    def _current_parts(self) -> Parts:
        """The capabilities of the current sampler and view (rebuilt when one is swapped)."""
        parts = self._parts
        if parts.sampler is not self._sampler or parts.view is not self._view:
            parts = self._parts = Parts(self._sampler, self._view)
            self.write_route.drop()
        return parts

    # ------------------------------------------------------------------ writing
    def record_owner(self) -> None:
        """Write the owner's config (this buffer's, or its wrapper's: ``storage_owner``)
        into durable storage, so that ``rb.open(path)`` can rebuild it (no-op in memory)."""
        if self._store.table is not None:
            persist.record_owner(self._store.backend,
                                 self if self.storage_owner is None else self.storage_owner)

    def add(self, *args: Any, obs: Any = UNSET, action: Any = UNSET, reward: Any = UNSET,
            next_obs: Any = UNSET, terminated: Any = UNSET, truncated: Any = UNSET,
            env_ids: Any = None, priority: Any = None, **extras: Any) -> None:
        """Add one step of one env (``num_envs=1``) or of every env (leading dim num_envs).

        Each value is cast once to its field's stored dtype (float64 observations and
        rewards, int flags, Python numbers, lists, torch CPU tensors, strided views), under
        the casting rules of :meth:`~replaybank.spec.FieldSpec.cast`.

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
            ArgumentError: Positional values (add takes keyword arguments only).
        """
        if args:  # an SB3-style add(obs, next_obs, ...): one test on the hot path
            raise positional_values("add", args)
        # the hot path: the compiled writer takes the call (it checks the call guard itself)
        if priority is None and self.write_route.direct(
                env_ids, False, obs, action, reward, next_obs, terminated, truncated, extras):
            return
        self._write(StepValues(obs, action, reward, next_obs, terminated, truncated, extras),
                    False, env_ids, priority)

    def extend(self, *args: Any, obs: Any = UNSET, action: Any = UNSET, reward: Any = UNSET,
               next_obs: Any = UNSET, terminated: Any = UNSET, truncated: Any = UNSET,
               env_ids: Any = None, priority: Any = None, **extras: Any) -> None:
        """Add many steps: values shaped ``[T, *shape]`` (one env) or ``[T, num_envs, *shape]``.

        Args:
            obs: As in :meth:`add`, with a leading step dimension (so are the others).
            action: Actions ``[T, ...]``.
            reward: Rewards ``[T, ...]``.
            next_obs: Next observations ``[T, ...]``.
            terminated: Episode-end flags ``[T, ...]``.
            truncated: Time-limit flags ``[T, ...]``.
            env_ids: Lanes these steps belong to; values are then ``[T, len(env_ids), ...]``.
            priority: Initial priorities (prioritized samplers only).
            **extras: As in :meth:`add`, with a leading step dimension.

        Raises:
            SpecError, ShapeError, DtypeError: Bad input; the buffer is left unchanged.
            ArgumentError: Positional values (extend takes keyword arguments only).
        """
        if args:
            raise positional_values("extend", args)
        if priority is None and self.write_route.direct(
                env_ids, True, obs, action, reward, next_obs, terminated, truncated, extras):
            return
        self._write(StepValues(obs, action, reward, next_obs, terminated, truncated, extras),
                    True, env_ids, priority)

    def _write(self, values: StepValues, steps: bool, env_ids: Any, priority: Any) -> None:
        """A write the hot path did not take, one call at a time (guard.py)."""
        entered = self._guard.enter()
        try:
            self.write_route.write(self._current_parts(), values, steps, env_ids, priority,
                                   self.record_owner)
        finally:
            self._guard.leave(entered)

    def writer(self, lanes: Any) -> SharedWriterHandle:
        """A picklable handle for a collector process that writes ``lanes`` of this
        ``storage="shared"`` buffer: call ``.open()`` on it in that process
        (:mod:`replaybank.shared.writer`).

        Raises:
            ConfigError: The storage is not shared, or bad lane ids.
        """
        return self._store.writer(self if self.storage_owner is None else self.storage_owner,
                                  lanes)

    def clear(self) -> None:
        """Drop every stored step (storage stays allocated).

        The buffer then serves what a fresh buffer given the same adds serves: with
        ``frame_stack=k`` the first steps of each lane written after a clear are served
        with their stacks padded by their first frame, as a fresh buffer's first steps
        (see :mod:`replaybank.views.framestack`).
        """
        entered = self._guard.enter()
        try:
            self._store.check_write("clear")
            self._clear()
        finally:
            self._guard.leave(entered)

    def _clear(self) -> None:
        if self._table is not None:
            resets = self.write_route.resets
            if resets is not None:  # the env's next step may still be a reset step
                resets.on_clear(self._table)
            self._table.clear()
        self.sampler.on_clear()

    # ------------------------------------------------------------------ sampling
    def sample(self, batch_size: int, replace: bool = True, **kwargs: Any) -> Batch[V]:
        """Sample a batch of transitions: the sampler draws, the view serves.

        Args:
            batch_size: Number of transitions B.
            replace: Draw with replacement (default) or distinct transitions.
            **kwargs: Sampler options (e.g. ``beta`` for prioritized replay).

        Returns:
            A :class:`~replaybank.batch.Batch` with fields ``[B, *shape]`` (numpy arrays, or
            torch tensors on the buffer's device for ``storage="torch"``), ``indices``
            (item keys for :meth:`update_priorities`) and, from prioritized samplers,
            ``weights`` and ``probabilities``.

        Raises:
            EmptyBufferError: The buffer is empty, or ``replace=False`` and
                ``batch_size > len(buf)``.
        """
        entered = self._guard.enter()
        try:
            parts = self._parts if self._parts.sampler is self._sampler \
                and self._parts.view is self._view else self._current_parts()
            batch: Batch[Any] = self._store.sample(parts, self._rng, batch_size, replace,
                                                   kwargs)
            self._samples += 1
            if self._samples & (self._samples - 1) == 0 and self._check_autoreset:
                self._check_resets()
            return batch
        finally:
            self._guard.leave(entered)

    def sample_fn(self, batch_size: int) -> Callable[[], Batch[torch.Tensor]]:
        """A callable that samples ``batch_size`` transitions into static tensors, for a
        training step of fixed shape (``storage="torch"`` with its device path).

        Each call draws its keys on the device, with a device generator of its own (the
        same distribution as :meth:`sample`, which draws on the host: not the same
        keys), gathers them there, and writes the batch into the same output tensors
        (overwritten by the next call: copy what must outlive it). On CUDA the draw and
        gather are captured once as a CUDA graph and replayed, so a call costs one graph
        launch plus a host-to-device copy of the bookkeeping that writes changed;
        elsewhere they run eagerly. CUDA graph warm-up draws advance the generator once.

        Args:
            batch_size: Transitions per call, a positive int.

        Returns:
            ``fn()`` -> :class:`~replaybank.batch.Batch` of static tensors.

        Raises:
            ConfigError: The storage does not draw on the device (numpy, memmap, or torch
                with ``draws="host"``), or ``batch_size`` is not a positive int. A call
                raises ConfigError when the buffer's sampler or view has no device path
                (see :mod:`~replaybank.device.path`), and EmptyBufferError when
                the buffer is empty.

        Example:
            >>> import numpy as np
            >>> buf = ReplayBuffer(16, storage="torch", device="cpu", seed=0)
            >>> for t in range(4):
            ...     buf.add(obs=np.full(2, t, np.float32), action=0, reward=1.0,
            ...             next_obs=np.full(2, t + 1, np.float32), terminated=False,
            ...             truncated=False)
            >>> fn = buf.sample_fn(8)
            >>> a = fn()["obs"]
            >>> b = fn()["obs"]
            >>> a is b, tuple(b.shape)
            (True, (8, 2))
        """
        dev = self._store.device()
        size = positive_int("sample_fn(batch_size)", batch_size)

        def fn() -> Batch[torch.Tensor]:
            entered = self._guard.enter()
            try:
                if self._table is None or len(self) == 0:
                    raise EmptyBufferError("sample_fn(): the buffer is empty; add "
                                           "transitions first")
                if not dev.serves_static(self._current_parts()):
                    raise ConfigError(
                        f"sample_fn(): {type(self.sampler).__name__} with "
                        f"{type(self.view).__name__} has no device path; use sample()")
                return typing.cast("Batch[torch.Tensor]", Batch.own(
                    dict(dev.sample_fn(self._table, self._rng, size))))
            finally:
                self._guard.leave(entered)

        return fn

    def prefetcher(self, batch_size: int, device: Any = "cuda", depth: int = 2,
                   **kwargs: Any) -> Prefetcher[Batch[torch.Tensor]]:
        """Sample ``batch_size`` transitions ``depth`` batches ahead in a background
        thread and hand them out on ``device`` (:class:`~replaybank.device.prefetch.
        Prefetcher`: pinned staging and ``non_blocking`` copies for CUDA targets).

        The batches are exactly those of calling ``sample(batch_size, **kwargs)`` in a
        loop; an error in the thread is raised by ``next()``. Close it (or use ``with``).

        Args:
            batch_size: Transitions per batch.
            device: Target device (``"cuda"``, ``"cpu"``, a ``torch.device``).
            depth: Batches sampled ahead.
            **kwargs: Passed to :meth:`sample` (``replace``, ``beta``, ...).

        Returns:
            An iterator of batches with ``close()`` and context-manager support.

        Example:
            >>> import numpy as np
            >>> buf = ReplayBuffer(32, seed=0)
            >>> for t in range(8):
            ...     buf.add(obs=np.zeros(2, np.float32), action=0, reward=1.0,
            ...             next_obs=np.zeros(2, np.float32), terminated=False,
            ...             truncated=False)
            >>> with buf.prefetcher(4, device="cpu") as pf:
            ...     tuple(next(pf).reward.shape)
            (4,)
        """
        prefetch: Callable[..., Prefetcher[Batch[torch.Tensor]]] = registry.feature("prefetcher")
        return prefetch(lambda: self.sample(batch_size, **kwargs), device, depth)

    def _check_resets(self) -> None:
        """Warn once when stored steps look like NEXT_STEP reset steps (run at the 1st,
        2nd, 4th, ... sample: :mod:`~replaybank.buffers.autoreset`)."""
        found = reset_steps(self.table, reset_free=self._reset_free)
        if found:
            self._check_autoreset = False  # warn once
            warn_resets(found, stacklevel=4)

    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """Set new priorities (e.g. ``|td_error|``) for sampled ``batch.indices``.

        Indices whose step was overwritten since it was sampled are ignored, so an
        asynchronous learner never changes the priority of new data. Both arguments may be
        torch tensors on any device, requiring grad or not (``td.abs()`` straight from the
        loss): they are detached and copied to the host together, one device
        synchronisation at most (:func:`~replaybank.buffers.priorities.to_host`).

        Returns:
            Number of priorities applied (stale ones excluded).

        Raises:
            ConfigError: The sampler has no priorities.
            ShapeError: Lengths differ.
            DtypeError: A priority is negative, NaN or infinite.
        """
        entered = self._guard.enter()
        try:
            traits, lanes = self._current_parts().traits, self._lanes()
            return self._store.updated(self._sampler,
                                       lambda k, p: update_priorities(traits, lanes, k, p),
                                       indices, priorities)
        finally:
            self._guard.leave(entered)

    # ------------------------------------------------------------------ sequences
    def sample_sequences(self, batch_size: int, sequence_length: int,
                         **kwargs: Any) -> SequenceBatch[V]:
        """Sample ``[B, L]`` windows of the stored steps (one-step rewards and one frame
        per step, whatever ``n_step``/``frame_stack``/``view``, which shape :meth:`sample`
        only); see :func:`replaybank.buffers.sequences.sample_sequences`."""
        entered = self._guard.enter()
        try:
            traits = self._current_parts().traits
            store = self._store
            # host arrays, or tensors from torch storage (Store.placed)
            batch: SequenceBatch[Any] = store.placed(store.read(
                self._sampler, lambda: sample_sequences(
                    store.table, store.lane_view(), self._rng, traits, batch_size,
                    sequence_length, **kwargs)))
            if len(self._seq_widths) < buffer_state.MAX_WIDTHS:  # update_sequence_priorities
                # checks TD errors against them (kept by state_dict and flush)
                self._seq_widths.add(int(batch.mask.shape[1]))
            return batch
        finally:
            self._guard.leave(entered)

    def update_sequence_priorities(self, starts: Any, td_errors: Any, eta: float = 0.9,
                                   mask: Any = None) -> int:
        """R2D2 sequence priorities; see :mod:`replaybank.buffers.sequences` (without
        ``mask``, ``td_errors`` must have as many columns as windows sampled from this
        buffer have steps)."""
        entered = self._guard.enter()
        try:
            traits, lanes = self._current_parts().traits, self._lanes()
            widths = frozenset(self._seq_widths)
            return self._store.updated(self._sampler, lambda k, td, m: update_sequence_priorities(
                traits, lanes, k, td, eta=eta, mask=m, widths=widths), starts, td_errors, mask)
        finally:
            self._guard.leave(entered)

    @contextlib.contextmanager
    def reset_free_writes(self) -> Iterator[None]:
        """Tell the buffer that the steps added inside this block are all real
        transitions: their writer left gymnasium's NEXT_STEP reset steps out itself
        (:class:`~replaybank.integrations.gymnasium.Collector` writes inside one). The
        reset-step check of ``autoreset_mode=None`` (:mod:`~replaybank.buffers.autoreset`)
        then does not count them, so a genuine first step that starts from the previous
        episode's final observation (a Blackjack hand dealt again) draws no
        :class:`~replaybank.buffers.autoreset.AutoresetWarning`. Steps added outside any
        block are checked as before. Each lane remembers its newest run of such steps
        (:class:`~replaybank.buffers.autoreset.ResetFreeRuns`, saved with the buffer); the
        block counts what the lanes gained, so add from one thread at a time inside it.

        Example:
            >>> import numpy as np, warnings
            >>> buf = ReplayBuffer(16, seed=0)
            >>> o = lambda v: np.full(2, v, np.float32)
            >>> with buf.reset_free_writes():  # a real episode that starts where the last ended
            ...     buf.add(obs=o(0), action=0, reward=1.0, next_obs=o(1), terminated=True,
            ...             truncated=False)
            ...     buf.add(obs=o(1), action=0, reward=0.0, next_obs=o(2), terminated=False,
            ...             truncated=False)
            >>> with warnings.catch_warnings():
            ...     warnings.simplefilter("error")
            ...     buf.sample(2).obs.shape
            (2, 2)
        """
        before = self._written()
        try:
            yield
        finally:
            self._reset_free.wrote(before, self._written())

    def _written(self) -> IntArray:
        """Each lane's ``written`` count ``[lanes]`` (zeros before the storage exists)."""
        t = self._table
        if t is None:
            return np.zeros(self._num_envs, dtype=np.int64)
        return np.array(t.written, dtype=np.int64)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold every other thread's calls on this buffer off (``rb.save`` and
        ``buf.flush()`` do: what they read is consistent while a collector thread adds).

        Example:
            >>> buf = ReplayBuffer(8)
            >>> with buf.exclusive():
            ...     len(buf)
            0
        """
        entered = self._guard.enter()
        try:
            yield
        finally:
            self._guard.leave(entered)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to restore this buffer exactly.

        The dict is a snapshot: its arrays are copies, so adds after the call change
        neither its data nor its counters, and it loads as the buffer was at the call.
        The call holds other threads' calls off (:meth:`exclusive`), so one thread may
        take it while another adds.
        That costs a copy of the stored data (as much memory again as the buffer holds,
        in RAM for memmap storage). :func:`replaybank.save` needs no such copy: it writes
        the storage's own arrays while it holds the buffer (see
        :func:`~replaybank.storage.table_state.state_views`).

        Returns:
            A nested dict whose leaves are numpy arrays or JSON-able values:
            ``metadata``, ``init`` (constructor arguments), ``rng`` (generator state),
            ``sampler`` and ``view`` (their state dicts), ``table`` (``fields/<name>``,
            ``side/<name>`` and ``meta/<name>`` arrays), and for device storage that has
            sampled on the device ``device_rng`` (the device generator's state:
            :mod:`~replaybank.device.path`). A ``storage="shared"`` buffer gives one
            snapshot of its writers' lanes (its table then holds exactly the steps its
            sampler knows: a plain buffer's state).

        Example:
            >>> buf = ReplayBuffer(4, spec={"x": ((), "float32")}, next_obs=False)
            >>> buf.add(x=1.0, terminated=False, truncated=False)
            >>> state = buf.state_dict()
            >>> buf.add(x=2.0, terminated=False, truncated=False)
            >>> state["table"]["meta/counts"].tolist(), state["table"]["fields/x"][:2, 0].tolist()
            ([1], [1.0, 0.0])
        """
        with self.exclusive():  # one snapshot while another thread adds
            return self._store.read(self._sampler, self._state)

    def _state(self) -> dict[str, Any]:
        """:meth:`state_dict` of the steps the store holds now (read by the store: a
        shared one retries when its writers overwrote what was copied)."""
        out = buffer_state.buffer_state(self.metadata(), self._init_args, self._rng,
                                        self.sampler, self.view, None)
        table = self._store.table_state(copy=not views_allowed())
        if table is not None:
            out["table"] = table
        out.update(self._store.state_dict())
        resets = self.write_route.resets
        if resets is not None:  # autoreset_mode="next_step": the reset steps dropped
            out["autoreset"] = resets.state_dict()
        reset_free = self._reset_free.state_dict()
        if reset_free is not None:  # steps a collector wrote (not checked for resets)
            out["reset_free"] = reset_free
        if self._seq_widths:  # the window widths update_sequence_priorities accepts
            out["sequence_widths"] = sorted(self._seq_widths)
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict` (spec, capacity and lanes must match).

        Everything is checked before anything changes: sizes and spec, every table array
        and the invariants of the lane counters and links, and the sampler, view and
        generator state (each loaded into a copy first). A state that fails any check
        leaves the buffer exactly as it was.

        Raises:
            CheckpointError: The state does not match this buffer, or is damaged.
        """
        with self.exclusive():
            self._store.check_write("load_state_dict")
            spec = buffer_state.checked_state(state_dict, self._capacity, self._num_envs,
                                              self.spec, self.sampler, self.view, self._rng,
                                              self.rows_only)
            resets = self.write_route.resets
            parsed = None if resets is None else resets.checked(
                state_dict.get("autoreset"), _obs_rows(state_dict.get("table")))
            reset_free = self._reset_free.checked(state_dict.get("reset_free"))
            widths = buffer_state.checked_widths(state_dict.get("sequence_widths"))
            if spec is None:
                self._clear()
            else:
                if self._table is None:
                    self.write_route.allocate(spec)
                    self.record_owner()
                buffer_state.load_table(self.table, state_dict["table"])
            self.sampler.load_state_dict(state_dict["sampler"])
            # checkpoints written before views had state hold none: the view keeps its own
            self.view.load_state_dict(state_dict.get("view", {}))
            self._rng.bit_generator.state = state_dict["rng"]
            self._store.load_state_dict(state_dict)
            if resets is not None and parsed is not None:
                resets.load(parsed)
            self._reset_free.load(reset_free)
            self._seq_widths = widths

    def resume_state(self) -> dict[str, Any] | None:
        """What :func:`replaybank.persist.flush` saves beside memmap files: generator,
        sampler and view state and the lane counters they belong to (None before the
        storage exists)."""
        if self._table is None:
            return None
        out = buffer_state.resume_state(self._rng, self.sampler, self.view, self._table)
        resets = self.write_route.resets
        if resets is not None:
            out["autoreset"] = resets.state_dict()
        reset_free = self._reset_free.state_dict()
        if reset_free is not None:
            out["reset_free"] = reset_free
        if self._seq_widths:
            out["sequence_widths"] = sorted(self._seq_widths)
        return out

    def load_resume_state(self, saved: dict[str, Any]) -> None:
        """Restore a :meth:`resume_state` whose counters match the files (checked first:
        a state that does not fit raises CheckpointError and changes nothing)."""
        t = self.table
        buffer_state.check_parts(saved, self.sampler, self.view, self._rng,
                                 (t.written, t.counts, t.T))
        resets = self.write_route.resets
        parsed = None if resets is None else resets.checked(
            saved.get("autoreset"), {name: (t.side.arrays[name].shape[1:],
                                            t.side.arrays[name].dtype)
                                     for name in t.obs_fields})
        reset_free = self._reset_free.checked(saved.get("reset_free"))
        # (resume states written before the order was kept hold none)
        free = checked_free_order(t, saved.get("free_slots"), "load_resume_state")
        widths = buffer_state.checked_widths(saved.get("sequence_widths"), "load_resume_state")
        self.sampler.load_state_dict(saved["sampler"])
        self.view.load_state_dict(saved.get("view", {}))
        self._rng.bit_generator.state = saved["rng"]
        if resets is not None and parsed is not None:
            resets.load(parsed)
        self._reset_free.load(reset_free)
        if free is not None:
            t.side.free = free
        self._seq_widths = widths

    def reopened(self) -> None:
        """The storage was reopened from its files: check them and rebuild the free side
        slots (read-only, beside a writer that may be adding: from one consistent snapshot
        of the lane counters, :meth:`~replaybank.buffers.store.Store.reopened`), and tell
        the sampler about every live step, oldest first (its default state for them).

        Raises:
            CheckpointError: The files' lane counters or links are damaged.
        """
        self._store.reopened()
        self.sampler.on_write(buffer_state.live_slots(self.table), None)

    def save(self, dirpath: Any, prefix: str = "buffer_") -> None:
        """Write ``<prefix>metadata.json`` and ``<prefix>state.safetensors`` atomically
        (:func:`replaybank.persist.save`)."""
        persist.save(self, dirpath, prefix=prefix)

    @classmethod
    def load(cls, dirpath: Any, prefix: str = "buffer_", *,
             trust_imports: bool = False) -> AnyBuffer:
        """Restore a buffer saved with :meth:`save` (identical next sample; the saved type,
        :func:`replaybank.persist.load`)."""
        return persist.load(dirpath, prefix=prefix, trust_imports=trust_imports)

    def flush(self) -> None:
        """Make a ``storage="memmap"`` buffer durable and exactly resumable.

        Syncs the files to disk and saves the generator, sampler and view state (e.g.
        PER priorities) next to them, so that :meth:`open` restores the identical next
        sample as long as nothing is added after this call (see
        :mod:`replaybank.persist`).

        Raises:
            ConfigError: The storage is not memmap (use :meth:`save` instead), or the
                buffer may not write its files: opened read-only, or closed
                (:meth:`close`; reopen it with ``rb.open(path)``).
        """
        persist.flush(self)

    def close(self) -> None:
        """Release durable storage: a memmap buffer syncs its files and drops the writer's
        lock, so another process may open the directory (no-op in memory). The buffer
        must not be written afterwards (an ``add``, ``extend``, ``clear``, ``flush`` or
        ``load_state_dict`` then raises ``ConfigError``; ``close()`` again does nothing);
        call :meth:`flush` first to resume exactly."""
        self._store.close(self._closing)

    @contextlib.contextmanager
    def _closing(self) -> Iterator[None]:
        """:meth:`exclusive` for the store's close: the write route's cached hot path is
        dropped inside it, so the next write asks the store, which refuses it (one
        section: the guard's lock, once shared, is not reentrant)."""
        with self.exclusive():
            self.write_route.drop()
            yield

    @classmethod
    def open(cls, path: Any, mode: str = "r+", *, trust_imports: bool = False) -> AnyBuffer:
        """Reopen a memmap buffer at ``path`` and continue where it stopped (with the
        generator and sampler state of its last :meth:`flush` when no step was added
        after it; :func:`replaybank.persist.open`). ``mode="r"`` opens it read-only,
        beside the process that writes it."""
        return persist.open(path, mode=mode, trust_imports=trust_imports)

    def init_config(self) -> dict[str, Any]:
        """Constructor values that rebuild this buffer empty (for :meth:`config`), with
        the int seed it was built with (None for a Generator or no seed)."""
        return buffer_state.init_config(self.capacity, self.num_envs, self.spec, self._init_args,
                                        self.sampler, self.view, self._store.backend, self._seed)

    def config(self) -> BufferConfig:
        """A validated config object (pydantic) that rebuilds an equivalent empty buffer."""
        from replaybank.config import buffer_config

        return buffer_config(self)

    def metadata(self) -> dict[str, Any]:
        """JSON-able description: type, capacity, num_envs, size, spec, sampler, view,
        storage; a ``storage="shared"`` buffer adds ``shared_retries``, the draws its
        learner threw away because writers evicted their steps meanwhile
        (:mod:`replaybank.shared.writer`)."""
        spec = self.spec
        out = {
            "type": type(self).__name__,
            "capacity": self.capacity,
            "num_envs": self.num_envs,
            "size": len(self),
            "episodes_seen": self.episodes_seen,
            "spec": None if spec is None else spec.to_json(),
            "sampler": self.sampler.config(),
            "view": self.view.config(),
            "storage": self._store.backend.name,
        }
        out.update(self._store.metadata())
        return out

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(capacity={self._capacity}, num_envs={self._num_envs}, "
                f"size={len(self)}, sampler={type(self.sampler).__name__}, "
                f"view={type(self.view).__name__})")


def _obs_rows(table_state: Any) -> dict[str, tuple[tuple[int, ...], Any]]:
    """``{obs field: (row shape, dtype)}`` of a state's table arrays (its side store holds
    one row per observation field), empty without a table."""
    if not isinstance(table_state, Mapping):
        return {}
    return {k[len("side/"):]: (tuple(np.shape(v)[1:]), np.asarray(v).dtype)
            for k, v in table_state.items() if k.startswith("side/")}
