"""The shared machinery of the pytorchrl front ends: one core buffer behind pytorchrl's API.

A :class:`Storage` owns a :class:`~replaybank.buffers.replay.ReplayBuffer` (one lane
per env, built at the first transition) and translates:

* ``insert_transition(sample)``: pytorchrl's key names and ``[num_envs, 1]`` scalars
  become one core ``add`` (``NextDone`` is ``terminated``; pytorchrl has no truncation
  flag). The core stores each observation once and serves n-step returns, priorities
  and recent-experience windows at sample time.
* ``generate_batches``: core batches become dicts of float32 tensors ``[B, ...]`` on
  ``device`` under pytorchrl's names, with the scheme's extra keys (``n_step``,
  ``per_weights``, ``idxs``, ``ck``).
* The data-transfer calls a pytorchrl collector and learner make
  (``get_all_buffer_data`` -> ``reset`` -> ``insert_data_slice``) keep pytorchrl's
  counters: ``size`` (rows stored per env), ``step`` (rows added since the last
  ``reset``: the slice ``get_all_buffer_data`` returns). Positions of
  ``get_data_slice`` count from the first row added since the last reset (negative
  positions reach older rows).

Example:
    >>> import torch
    >>> from replaybank.compat.pytorchrl import ReplayBuffer
    >>> buf = ReplayBuffer(size=100, device="cpu", actor=None, algorithm=None, envs=None)
    >>> for t in range(10):
    ...     buf.insert_transition({"Observation": torch.full((2, 3), t),
    ...                            "Action": torch.zeros(2, 1), "Reward": torch.ones(2, 1),
    ...                            "NextObservation": torch.full((2, 3), t + 1),
    ...                            "Done": torch.zeros(2, 1), "NextDone": torch.zeros(2, 1)})
    >>> buf.size, buf.step
    (10, 10)
    >>> batch = next(buf.generate_batches(num_mini_batch=1, mini_batch_size=4))
    >>> batch["Observation"].shape, batch["Reward"].shape, batch["NextDone"].dtype
    (torch.Size([4, 3]), torch.Size([4, 1]), torch.float32)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from replaybank.buffers.replay import ReplayBuffer as CoreBuffer
from replaybank.compat.pytorchrl.keys import (
    ACT,
    CORE_NAMES,
    DONE,
    DONE2,
    OBS,
    OBS2,
    REW,
    RHS,
    RHS2,
    STORAGE_TENSORS,
    tensor_of,
    to_numpy,
)
from replaybank.errors import ConfigError, ShapeError, require_extra
from replaybank.samplers.base import Sampler
from replaybank.spec import unflatten

if TYPE_CHECKING:
    from replaybank.batch import Batch, SequenceBatch

__all__ = ["Storage", "get_priority", "get_sequence_priority"]

IntArray = npt.NDArray[np.int64]
#: Extras stored only for recurrent actors (pytorchrl keeps one zero row otherwise).
_RECURRENT_KEYS = (RHS, RHS2)


def _torch() -> Any:
    return require_extra("torch", "torch")


def get_priority(error: Any, epsilon: float, alpha: float) -> Any:
    """``(error + epsilon) ** alpha``: the proportional priority of TD errors."""
    return np.power(to_numpy(error) + epsilon, alpha)


def get_sequence_priority(sequence_data: Any, eta: float = 0.9) -> Any:
    """R2D2's ``eta * max + (1 - eta) * mean`` over axis 0 of ``sequence_data``."""
    data = to_numpy(sequence_data)
    return eta * np.max(data, axis=0) + (1 - eta) * np.mean(data, axis=0)


class Storage:
    """pytorchrl's off-policy storage API over one core replay buffer.

    Subclasses fix the signature and the scheme (n-step, PER, ERE, HER); this class
    holds no algorithm of its own, it translates and calls the core.

    Args:
        size: Rows per env (pytorchrl's capacity along the time axis).
        device: Torch device of the batches.
        actor: pytorchrl actor (``is_recurrent``, ``sequence_overlap`` are read), or None.
        algorithm: pytorchrl algorithm (``gamma``, ``update_every`` are read), or None.
        envs: Vector env (``num_envs`` is read when present), or None.
        seed: Seed or Generator of the core buffer's draws (an addition of this front
            end; pytorchrl draws from numpy's global generator).

    Example:
        >>> Storage(10, "cpu", None, None, None).storage_tensors[-1]
        'ActionProbs'
    """

    storage_tensors = STORAGE_TENSORS

    def __init__(self, size: int, device: Any, actor: Any, algorithm: Any, envs: Any,
                 seed: int | np.random.Generator | None = None) -> None:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ConfigError(f"{type(self).__name__}(size={size!r}): size (rows per env) "
                              "must be an int >= 1")
        self.actor = actor
        self.device = device
        self.algo = algorithm
        self.envs = envs
        self.seed = seed
        self.max_size = int(size)
        self.recurrent_actor = bool(getattr(actor, "is_recurrent", False))
        self.gamma = float(getattr(algorithm, "gamma", 0.99))
        self.n_step = 1
        self.staged_overlap: dict[str, Any] | None = None
        if self.recurrent_actor:
            self.sequence_length = int(algorithm.update_every)
            self.overlap_length = int(actor.sequence_overlap * self.sequence_length)
            self.non_overlap_length = self.sequence_length - self.overlap_length
        self.buffer: CoreBuffer | None = None  # built by init_tensors (needs num_envs)
        self._num_envs = 0
        self._extras: tuple[str, ...] = ()  # pytorchrl keys stored as core extras
        self._zeros: dict[str, Any] = {}  # RHS/RHS2 placeholders of a feed-forward actor
        self._zero_tensors: tuple[Any, dict[str, Any]] | None = None
        self._torch_device: tuple[Any, Any] | None = None
        self._fresh = 0  # rows added since the last reset
        self._export: dict[str, Any] | None = None  # the last get_all_buffer_data result
        self._pending: dict[str, Any] | None = None  # an export a reset may see again
        self._false = np.zeros(0, dtype=bool)
        self._priority: npt.NDArray[np.float64] | None = None

    # ------------------------------------------------------------------ scheme hooks
    def _sampler(self) -> Sampler | None:
        """The core sampler of this scheme (None: uniform)."""
        return None

    def _sample_kwargs(self, k: int, num_mini_batch: int) -> dict[str, Any]:
        """Core sample options of mini batch ``k`` of ``num_mini_batch``."""
        return {}

    def _batch_info(self, out: dict[str, Any], batch: Any, k: int, num_mini_batch: int,
                    torch: Any) -> None:
        """Add the scheme's extra batch keys (``n_step``, ``per_weights``, ...)."""

    @property
    def _lanes(self) -> int:
        """Core lanes per env (HER keeps its relabelled copies in lanes of their own)."""
        return self._num_envs

    # ------------------------------------------------------------------ counters
    @property
    def num_envs(self) -> int:
        """Envs of the stored data (0 before the first transition)."""
        return self._num_envs

    @property
    def size(self) -> int:
        """Rows stored per env (at most ``max_size``)."""
        if self.buffer is None or self.buffer._table is None:
            return 0
        return int(self.buffer.table.counts[0])

    @property
    def step(self) -> int:
        """Rows added since the last :meth:`reset` (what :meth:`get_all_buffer_data`
        returns), at most :attr:`size`."""
        return min(self._fresh, self.size)

    @property
    def data(self) -> dict[str, Any]:
        """Every stored row, oldest first, as pytorchrl lays it out: ``{key: [size,
        num_envs, ...] float32}`` (``None`` for keys not stored). A copy."""
        return self._rows(0, self.size)

    # ------------------------------------------------------------------ writing
    def init_tensors(self, sample: dict[str, Any]) -> None:
        """Lazy initialization from a sample: build the core buffer for its envs and
        remember which of the storage tensors it carries (the core allocates its arrays
        at the first add; fields keep their dtype, batches are float32).

        Args:
            sample: Data sample (containing all tensors of an environment transition).

        Raises:
            ShapeError: The sample lacks one of ``Observation``, ``Action``, ``Reward``,
                ``NextObservation``, ``NextDone``.
        """
        missing = [k for k in (OBS, ACT, REW, OBS2, DONE2) if k not in sample]
        if missing:
            raise ShapeError(f"{type(self).__name__}.init_tensors: the sample lacks "
                             f"{missing}; a transition needs {[OBS, ACT, REW, OBS2, DONE2]}")
        n = int(np.shape(to_numpy(sample[DONE2]))[0])
        self._num_envs = n
        extras = [k for k in (DONE, "IntrinsicReward", "ActionProbs") if k in sample]
        self._zeros = {}
        self._zero_tensors = None
        for k in _RECURRENT_KEYS:
            if k in sample:
                if self.recurrent_actor:
                    extras.append(k)
                else:  # pytorchrl keeps a single zero row of the hidden states
                    self._zeros[k] = _zeros_like(to_numpy(sample[k])[:1])
        self._extras = tuple(extras)
        self._false = np.zeros(n, dtype=bool)
        self.buffer = CoreBuffer(self.max_size * self._lanes, num_envs=self._lanes,
                                 seed=self.seed, sampler=self._sampler(),
                                 view=self._view(), autoreset_mode="same_step")
        self._fresh = 0

    def _view(self) -> Any:
        """The core view (n-step returns when ``n_step > 1``)."""
        from replaybank.views.nstep import NStepView

        return NStepView(int(self.n_step), self.gamma) if self.n_step != 1 else None

    def _values(self, sample: dict[str, Any], n: int) -> dict[str, Any]:
        """One step of ``n`` envs as core add arguments (numpy)."""
        values = {"obs": to_numpy(sample[OBS]), "action": to_numpy(sample[ACT]),
                  "reward": to_numpy(sample[REW]).reshape(n),
                  "next_obs": to_numpy(sample[OBS2]),
                  "terminated": to_numpy(sample[DONE2]).reshape(n) != 0}
        for key in self._extras:
            values[CORE_NAMES[key]] = to_numpy(sample[key])
        return values

    def insert_transition(self, sample: dict[str, Any]) -> None:
        """Store new transition sample.

        Args:
            sample: Data sample (containing all tensors of an environment transition):
                pytorchrl's keys, values ``[num_envs, ...]`` (torch tensors or arrays);
                keys that are not storage tensors are ignored.
        """
        if self.buffer is None:
            self.init_tensors(sample)
        buf = self.buffer
        assert buf is not None
        n = self._num_envs
        values = self._values(sample, n)
        if self._lanes == n:
            buf.add(truncated=self._false, priority=self._priority, **values)
        else:
            buf.add(truncated=self._false, env_ids=range(n), priority=self._priority,
                    **values)
        self._fresh += 1
        self._after_insert(sample, values)

    def _after_insert(self, sample: dict[str, Any], values: dict[str, Any]) -> None:
        """Called after every stored step (HER watches episode ends here)."""

    # ------------------------------------------------------------------ batches
    def before_gradients(self) -> None:
        """Steps required before updating actor policy model (nothing: the core keeps
        priorities current as data arrives)."""

    def after_gradients(self, batch: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        """Steps required after updating actor policy model.

        Args:
            batch: Data batch used to compute the gradients.
            info: Additional relevant info from gradient computation.

        Returns:
            info, updated with relevant info from the storage.
        """
        return info

    def generate_batches(self, num_mini_batch: int, mini_batch_size: int,
                         num_epochs: int = 1) -> Iterator[dict[str, Any]]:
        """Returns a batch iterator to update actor.

        Args:
            num_mini_batch: Number of mini batches per epoch (one is drawn per batch).
            mini_batch_size: Number of samples contained in each mini batch.
            num_epochs: Number of epochs (unused by off-policy storages, as in pytorchrl).

        Yields:
            A dict per mini batch: every storage tensor as float32 ``[B, ...]`` on
            ``device`` (``{}`` for keys not stored; ``Reward``, ``NextDone``, ``Done``
            ``[B, 1]``); for a recurrent actor ``mini_batch_size // sequence_length + 1``
            windows of ``sequence_length`` steps flattened to ``[S * sequence_length,
            ...]`` with the hidden states of each window's first step ``[S, ...]``.

        Raises:
            EmptyBufferError: Nothing stored yet (at the first ``next``).
        """
        torch = _torch()
        for k in range(num_mini_batch):
            if self.recurrent_actor:
                yield self._sequence_batch(k, num_mini_batch, mini_batch_size, torch)
            else:
                yield self._batch(k, num_mini_batch, mini_batch_size, torch)

    def _device(self, torch: Any) -> Any:
        """``device`` as a torch.device (parsed once: a string costs a parse per tensor)."""
        cached = self._torch_device
        if cached is None or cached[0] is not self.device:
            cached = self._torch_device = (self.device, torch.device(self.device)
                                           if self.device is not None else None)
        return cached[1]

    def _core(self) -> CoreBuffer:
        if self.buffer is None:
            from replaybank.errors import EmptyBufferError

            raise EmptyBufferError(f"{type(self).__name__}.generate_batches: nothing stored "
                                   "yet; insert transitions first")
        return self.buffer

    def _batch(self, k: int, num_mini_batch: int, mini_batch_size: int,
               torch: Any) -> dict[str, Any]:
        b = self._core().sample(mini_batch_size, **self._sample_kwargs(k, num_mini_batch))
        dev = self._device(torch)
        out: dict[str, Any] = {key: {} for key in self.storage_tensors}
        out[OBS] = tensor_of(b.obs, torch, dev)
        out[ACT] = tensor_of(b.action, torch, dev)
        out[REW] = tensor_of(b.reward[:, None], torch, dev)
        out[OBS2] = tensor_of(b.next_obs, torch, dev)
        out[DONE2] = tensor_of(b.terminated[:, None], torch, dev)
        for key in self._extras:
            out[key] = tensor_of(getattr(b, CORE_NAMES[key]), torch, dev)
        if self._zeros:
            zeros = self._zero_tensors
            if zeros is None or zeros[0] != dev:  # made once per device, then shared
                zeros = self._zero_tensors = (dev, {key: tensor_of(v, torch, dev)
                                                    for key, v in self._zeros.items()})
            out.update(zeros[1])
        self._batch_info(out, b, k, num_mini_batch, torch)
        return out

    def _sequence_batch(self, k: int, num_mini_batch: int, mini_batch_size: int,
                        torch: Any) -> dict[str, Any]:
        """Windows of ``overlap`` burn-in + ``non_overlap`` steps, flattened."""
        windows = mini_batch_size // self.sequence_length + 1
        state = [CORE_NAMES[key] for key in _RECURRENT_KEYS if key in self._extras]
        sb = self._core().sample_sequences(
            windows, self.non_overlap_length, burn_in=self.overlap_length,
            episode_boundary="cross", strict=True, state_fields=state,
            **self._sample_kwargs(k, num_mini_batch))
        nested = sb.to_dict()
        dev = self.device

        def flat(v: Any) -> Any:
            if isinstance(v, dict):
                return {x: flat(y) for x, y in v.items()}
            return v.reshape(-1, *v.shape[2:])  # [S, W, ...] -> [S * W, ...]

        out: dict[str, Any] = {key: {} for key in self.storage_tensors}
        out[OBS] = tensor_of(flat(nested["obs"]), torch, dev)
        out[ACT] = tensor_of(flat(nested["action"]), torch, dev)
        out[REW] = tensor_of(flat(nested["reward"])[:, None], torch, dev)
        out[OBS2] = tensor_of(flat(nested["next_obs"]), torch, dev)
        out[DONE2] = tensor_of(flat(nested["terminated"])[:, None], torch, dev)
        for key in self._extras:
            name = CORE_NAMES[key]
            value = nested["initial"][name] if key in _RECURRENT_KEYS else flat(nested[name])
            out[key] = tensor_of(value, torch, dev)
        self._batch_info(out, sb, k, num_mini_batch, torch)
        return out

    # ------------------------------------------------------------------ slices
    def _rows(self, start: int, stop: int) -> dict[str, Any]:
        """Rows ``[start, stop)`` of every env in oldest-first order (0 = the oldest row
        stored), pytorchrl's layout ``{key: [rows, num_envs, ...] float32}``."""
        out: dict[str, Any] = {key: None for key in self.storage_tensors}
        buf = self.buffer
        if buf is None or buf._table is None:
            return out
        t = buf.table
        n, lanes = self._num_envs, t.lanes
        start, stop = max(0, start), min(stop, self.size)
        rows = max(0, stop - start)
        lane = np.arange(n, dtype=np.int64)
        oldest = t.written[:n] - t.counts[:n]  # [n]
        seq = oldest[None, :] + np.arange(start, start + rows, dtype=np.int64)[:, None]
        keys = (seq * lanes + lane[None, :]).reshape(-1)  # [rows * n]

        def shaped(v: Any) -> Any:
            return np.asarray(v, dtype=np.float32).reshape(rows, n, *np.shape(v)[1:])

        def nest(prefix: str, fetch: Any) -> Any:
            names = [f for f in t.spec if f == prefix or f.startswith(prefix + "/")]
            flat = {f: shaped(fetch(f)) for f in names}
            return unflatten(flat)[prefix]

        out[OBS] = nest("obs", lambda f: t.gather(f, keys))
        nxt = unflatten({f: shaped(t.gather_next(f, keys)) for f in t.obs_fields})
        out[OBS2] = nxt["obs"]
        out[ACT] = nest("action", lambda f: t.gather(f, keys))
        out[REW] = shaped(t.gather("reward", keys))[..., None]
        out[DONE2] = shaped(t.gather("terminated", keys))[..., None]
        for key in self._extras:
            out[key] = nest(CORE_NAMES[key], lambda f: t.gather(f, keys))
        return out

    def get_all_buffer_data(self, data_to_cpu: bool = False) -> dict[str, Any]:
        """Return the rows added since the last :meth:`reset` (all currently stored data
        when the storage is the learner's own): ``{key: [step, num_envs, ...]}`` float32
        numpy, in CPU memory whatever ``data_to_cpu`` says. For a recurrent actor only
        whole sequences; with ``data_to_cpu`` the last ``overlap_length`` exported rows
        and the rows held back (those after the last whole sequence) are staged, and
        :meth:`reset` keeps them at the head of the next export, so a learner gets
        every row (pytorchrl stages the last ``overlap_length`` rows added, which loses
        the held-back rows before them when ``step`` is not a multiple of
        ``sequence_length``).

        Args:
            data_to_cpu: Whether the data will leave this process (stages the recurrent
                overlap slice).

        Returns:
            The data, one-step transitions as added (n-step returns, priorities and
            relabelled HER copies are made again by the storage that inserts them).
        """
        step = self.step
        idx = step
        if self.recurrent_actor:
            idx = step // self.sequence_length * self.sequence_length
        base = self.size - step
        data = self._rows(base, base + idx)
        if self.recurrent_actor and data_to_cpu:
            self.staged_overlap = self.get_data_slice(idx - self.overlap_length, step)
        self._export = data
        return data

    def get_data_slice(self, start_pos: int, end_pos: int) -> dict[str, Any]:
        """Makes a copy of all tensors between steps ``start_pos`` and ``end_pos``.

        Args:
            start_pos: Initial slice position (0: the first row added since the last
                :meth:`reset`; negative positions reach older rows).
            end_pos: Final slice position (exclusive).

        Returns:
            ``{key: [rows, num_envs, ...]}`` float32 copies (rows clipped to what is
            stored).
        """
        base = self.size - self.step
        return self._rows(base + int(start_pos), base + int(end_pos))

    def reset(self) -> None:
        """Set ``step`` to zero: the next :meth:`get_all_buffer_data` returns only rows
        added after this call. If the actor is recurrent and an overlap slice was staged,
        it is kept at the beginning of the next export (``step`` starts at its length).
        Stored data stays sampleable (the core keeps it; pytorchrl's own learner
        re-inserts it, which this storage recognises and skips)."""
        keep = 0
        if self.recurrent_actor and self.staged_overlap is not None:
            keep = _length(self.staged_overlap[OBS])
            self.staged_overlap = None
        self._pending = self._export
        self._export = None
        self._fresh = keep

    def insert_data_slice(self, new_data: dict[str, Any]) -> None:
        """Appends ``new_data`` (``{key: [l, num_envs, ...]}``, e.g. another storage's
        :meth:`get_all_buffer_data`) to the stored data.

        The export this storage made before its last :meth:`reset` is already stored:
        inserting it again only restores ``step`` (pytorchrl's single-process loop
        does exactly that). For a recurrent actor, leading rows that repeat the newest
        stored rows (the overlap slice a collector re-sends) are skipped.

        Raises:
            ShapeError: Tensors of different lengths, or a key the storage needs is
                missing.
        """
        pending, self._pending = self._pending, None
        if pending is not None and _same_data(pending, new_data):
            self._fresh += _length(new_data)
            return
        lengths = {_length(v) for k, v in new_data.items()
                   if v is not None and k in self.storage_tensors and not _empty(v)}
        if len(lengths) > 1:
            raise ShapeError(f"{type(self).__name__}.insert_data_slice: tensors of "
                             f"different lengths {sorted(lengths)}; every key needs the "
                             "same number of rows")
        if not lengths:
            return
        rows = lengths.pop()
        first = 0
        if self.recurrent_actor and self.overlap_length and self.size >= self.overlap_length:
            head = _slice(new_data, 0, self.overlap_length)
            if _same_data(self.get_data_slice(self.step - self.overlap_length, self.step),
                          head):
                first = self.overlap_length
        self._insert_rows(new_data, first, rows)

    def _insert_rows(self, new_data: dict[str, Any], first: int, rows: int) -> None:
        """Write rows ``[first, rows)`` of pytorchrl-layout data, row by row."""
        for i in range(first, rows):
            self.insert_transition(
                {k: _index(v, i) for k, v in new_data.items()
                 if v is not None and k in self.storage_tensors and not _empty(v)})

    def insert_single_tensor_slice(self, tensor_storage: dict[str, Any], tensor_key: str,
                                   tensor_values: Any) -> int:
        """Appends ``tensor_values`` to ``tensor_storage[tensor_key]`` (a caller's dict of
        ``[max_size, ...]`` arrays, allocated float32 when None) at position ``step``,
        circularly.

        Args:
            tensor_storage: Dict holding the array.
            tensor_key: Key to use to store the tensor.
            tensor_values: Tensor values ``[l, ...]``.

        Returns:
            ``l``, the length (time axis) of the tensor added.
        """
        values = to_numpy(tensor_values)
        length = int(values.shape[0])
        if tensor_storage.get(tensor_key) is None:
            tensor_storage[tensor_key] = np.zeros((self.max_size, *values.shape[1:]),
                                                  dtype=np.float32)
        target = tensor_storage[tensor_key]
        pos = (self.step + np.arange(length)) % len(target)
        target[pos] = values
        return length

    # ------------------------------------------------------------------ parameters
    def update_storage_parameter(self, parameter_name: str, new_parameter_value: Any) -> None:
        """If ``parameter_name`` is an attribute of the storage, change its value to
        ``new_parameter_value`` (and tell the core: ``max_size`` rebuilds an empty
        storage, ``n_step`` swaps the n-step view, PER/ERE parameters go to the sampler).

        Args:
            parameter_name: Attribute name.
            new_parameter_value: New value for ``parameter_name``.

        Raises:
            ConfigError: ``max_size`` changed while data is stored (the core's capacity
                is fixed; pytorchrl itself only shrinks empty collector storages).
        """
        if not hasattr(self, parameter_name):
            return
        if parameter_name == "max_size":
            if self.size:
                raise ConfigError(
                    f"update_storage_parameter('max_size', {new_parameter_value!r}): the "
                    f"storage holds {self.size} rows per env; change it while empty")
            self.max_size = int(new_parameter_value)
            self.buffer = None  # rebuilt at the next transition
            return
        setattr(self, parameter_name, new_parameter_value)
        self._parameters_changed(parameter_name)

    def _parameters_changed(self, name: str) -> None:
        if name == "n_step" and self.buffer is not None:
            view = self._view()
            if view is None:
                from replaybank.views.transition import TransitionView

                view = TransitionView()
            self.buffer.view = view

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_size={self.max_size}, size={self.size}, "
                f"step={self.step}, num_envs={self._num_envs}, core={self.buffer!r})")


# ---------------------------------------------------------------------- helpers
def _zeros_like(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _zeros_like(v) for k, v in value.items()}
    return np.zeros(np.shape(value), dtype=np.float32)


def _length(value: Any) -> int:
    if isinstance(value, dict):
        return _length(next(iter(value.values()))) if value else 0
    return int(np.shape(to_numpy(value))[0])


def _empty(value: Any) -> bool:
    return isinstance(value, dict) and not value


def _index(value: Any, i: int) -> Any:
    if isinstance(value, dict):
        return {k: _index(v, i) for k, v in value.items()}
    return to_numpy(value)[i]


def _slice(data: dict[str, Any], a: int, b: int) -> dict[str, Any]:
    def cut(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: cut(x) for k, x in v.items()}
        return to_numpy(v)[a:b]

    return {k: None if v is None else cut(v) for k, v in data.items()}


def _same_data(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two pytorchrl-layout dicts hold the same rows (compared on the keys that
    identify a transition)."""
    if a is b:
        return True
    for key in (OBS, ACT, REW, DONE2):
        x, y = a.get(key), b.get(key)
        if x is None or y is None:
            if x is not y:
                return False
            continue
        if not _equal(x, y):
            return False
    return True


def _equal(x: Any, y: Any) -> bool:
    if isinstance(x, dict) or isinstance(y, dict):
        if not (isinstance(x, dict) and isinstance(y, dict)) or x.keys() != y.keys():
            return False
        return all(_equal(x[k], y[k]) for k in x)
    xa, ya = to_numpy(x), to_numpy(y)
    return bool(xa.shape == ya.shape and np.array_equal(xa.astype(np.float32),
                                                        ya.astype(np.float32)))


def window_lengths(discount: Any, gamma: float, n: int) -> Any:
    """Each row's window length ``L`` from its discount ``gamma ** L`` ``[B]`` (``n`` where
    gamma is 0 or 1: the discount then does not depend on L)."""
    d = np.asarray(discount, dtype=np.float64)
    if not 0.0 < gamma < 1.0:
        return np.full(d.shape, float(n), dtype=np.float32)
    return np.rint(np.log(d) / math.log(gamma)).astype(np.float32)


def batch_field(batch: Batch | SequenceBatch, name: str) -> Any:
    """A field of a core batch (for the scheme hooks)."""
    return batch[name]
