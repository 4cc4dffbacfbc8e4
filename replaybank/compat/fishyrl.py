"""fishyrl's buffer API (``fishyrl.buffers``) over the replaybank core.

A fishyrl user switches by changing one import::

    from fishyrl.buffers import SequentialBuffer, IndependentVectorizedBuffer   # before
    from replaybank.compat.fishyrl import SequentialBuffer, IndependentVectorizedBuffer

Everything fishyrl's reference documents is here under the same names and signatures:
the :class:`Buffer` ABC, :class:`SequentialBuffer` (``add``, ``sample(batch_size,
sequence_length)``, ``state_dict``, ``load_state_dict``, ``reset``, ``size``,
``capacity``, ``is_full``), :class:`IndependentVectorizedBuffer` and
:func:`convert_samples_to_tensors`. The data live in a rows
:class:`replaybank.ReplayBuffer` (``next_obs=False``) the front end owns
(:attr:`SequentialBuffer.buffer`): every key of an experience is an ordinary stored
field, nested under :data:`PREFIX` so that keys the core reserves (``done``,
``is_first``, ``is_terminal``, ...) are plain user keys here. An
:class:`IndependentVectorizedBuffer` of ``SequentialBuffer`` s is one core buffer with one
lane per buffer, ``capacity`` rows each, whose batches are split randomly among the
lanes (:class:`~replaybank.samplers.lane_split.LaneSplitSampler`).

``sample`` returns ``{key: [batch_size, sequence_length, *shape]}``: windows of
consecutive experiences of one buffer, running over episode ends as fishyrl's do (the
user's own ``is_first`` marks them), never over the write head. Where this front end
behaves differently from fishyrl, and why: ``docs/migration/fishyrl.md``.

Example:
    >>> import numpy as np
    >>> buf = SequentialBuffer(capacity=100, seed=0)
    >>> for t in range(20):
    ...     buf.add({"obs": np.full(3, t, np.float32), "action": np.array(t % 2),
    ...              "is_first": np.array(t == 0)})
    >>> buf.size, buf.capacity, buf.is_full
    (20, 100, False)
    >>> batch = buf.sample(4, 5)
    >>> sorted(batch), batch["obs"].shape, batch["is_first"].shape
    (['action', 'is_first', 'obs'], (4, 5, 3), (4, 5))
"""

from __future__ import annotations

import inspect
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

from replaybank.buffers.arguments import make_rng
from replaybank.buffers.replay import ReplayBuffer
from replaybank.errors import CheckpointError, ConfigError, SpecError, require_extra
from replaybank.spec import SEP

__all__ = ["PREFIX", "Buffer", "IndependentVectorizedBuffer", "SequentialBuffer",
           "convert_samples_to_tensors"]

#: The core field every experience key is stored under (``fishyrl/<key>``).
PREFIX = "fishyrl"
_PRE = PREFIX + SEP


class Buffer(ABC):
    """Class template for buffers (fishyrl's ``Buffer``): ``size``, ``state_dict``,
    ``load_state_dict``, ``reset``, ``add`` and ``sample``.

    Example:
        >>> class Tiny(Buffer):
        ...     def __init__(self): self.rows = []
        ...     size = property(lambda self: len(self.rows))
        ...     def state_dict(self): return {"rows": list(self.rows)}
        ...     def load_state_dict(self, state_dict): self.rows = list(state_dict["rows"])
        ...     def reset(self): self.rows = []
        ...     def add(self, experience): self.rows.append(experience)
        ...     def sample(self, batch_size): return {}
        >>> Tiny().size
        0
    """

    @property
    @abstractmethod
    def size(self) -> int:
        """The current number of experiences stored in the buffer."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Return a dictionary containing the state of the buffer for saving."""

    @abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the state of the buffer from a dictionary (from :meth:`state_dict`)."""

    @abstractmethod
    def reset(self) -> None:
        """Reset/initialize the buffer."""

    @abstractmethod
    def add(self, experience: dict[str, np.ndarray]) -> None:
        """Add an experience, a dictionary of numpy arrays, to the buffer."""

    @abstractmethod
    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """Sample a batch of experiences, a dictionary of numpy arrays."""


def _capacity(capacity: Any, where: str) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) \
            or capacity <= 0:
        raise ConfigError(f"{where}(capacity={capacity!r}): must be a positive int (the "
                          "most experiences a buffer stores); pass e.g. capacity=100_000")
    return int(capacity)


class _Rows:
    """The key bookkeeping and core calls that both fishyrl buffers share: one rows
    :class:`~replaybank.buffers.replay.ReplayBuffer` of ``lanes`` lanes."""

    buffer: ReplayBuffer
    _keys: frozenset[str] | None
    _validate_keys: bool
    _lanes: int
    _zeros: dict[str, Any]

    def _fresh(self, capacity: int, lanes: int, rng: np.random.Generator) -> None:
        self._lanes = lanes
        self.buffer = ReplayBuffer(capacity * lanes, num_envs=lanes, seed=rng,
                                   next_obs=False,
                                   lane_split="random" if lanes > 1 else None)
        # one lane: values carry no lane dim; several: [lanes, ...] (env_ids spells
        # out a lane dim of 1 for a group of one buffer)
        self._env_ids = [0] if isinstance(self, IndependentVectorizedBuffer) and lanes == 1 \
            else None
        self._keys = None
        self._zeros = {}

    def _checked(self, experience: Any) -> Any:
        """``experience`` as the core stores it (key set checked, or completed with zeros
        when keys are not validated)."""
        keys = self._keys
        if keys is None or experience.keys() == keys:
            return experience
        if not isinstance(experience, Mapping):
            raise SpecError(f"add(experience={type(experience).__name__}): expected a dict "
                            "of numpy arrays")
        got = set(experience)
        missing, unexpected = sorted(keys - got), sorted(got - keys)
        if self._validate_keys or unexpected:
            why = ("the buffer was built with validate_keys=True; pass the same keys in "
                   "every add, or build it with validate_keys=False to leave keys out"
                   if self._validate_keys else
                   "a key cannot join after the first add (its earlier rows would hold "
                   "nothing); include it from the first add, or reset() the buffer")
            raise SpecError(
                f"add: the experience's keys differ from the buffer's {sorted(keys)} "
                f"(missing {missing}, unexpected {unexpected}): {why}")
        out = dict(experience)
        for k in missing:  # validate_keys=False: a key left out is stored as zeros
            out[k] = self._zero(k)
        return out

    def _zero(self, key: str) -> Any:
        z = self._zeros.get(key)
        if z is None:
            f = self.buffer.table.spec[_PRE + key]
            lead = () if self._lanes == 1 and self._env_ids is None else (self._lanes,)
            z = self._zeros[key] = np.zeros(lead + f.shape, f.dtype)
        return z

    def _add(self, experience: dict[str, np.ndarray]) -> None:
        self.buffer.add(env_ids=self._env_ids, **{PREFIX: self._checked(experience)})
        if self._keys is None:  # the first add set the keys (a rejected one did not)
            self._keys = frozenset(experience)

    def _sample(self, batch_size: int, sequence_length: int) -> dict[str, np.ndarray]:
        sb = self.buffer.sample_sequences(batch_size, sequence_length,
                                          episode_boundary="cross")
        n = len(_PRE)
        return {k[n:]: sb[k] for k in sb if k.startswith(_PRE)}

    def _state(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict(), "validate_keys": self._validate_keys,
                "keys": None if self._keys is None else sorted(self._keys)}

    def _load(self, state_dict: Mapping[str, Any], capacity: int,
              rng: np.random.Generator) -> None:
        if not isinstance(state_dict, Mapping) or "buffer" not in state_dict:
            raise CheckpointError(
                f"load_state_dict: expected the dict of a state_dict() of this front end "
                f"(keys 'buffer', 'validate_keys', 'keys'); got "
                f"{sorted(state_dict) if isinstance(state_dict, Mapping) else state_dict!r}"
                " (fishyrl's own state dicts do not load: see docs/migration/fishyrl.md)")
        keys = state_dict.get("keys")
        old = (self.buffer, self._keys, self._zeros)
        self._fresh(capacity, self._lanes, rng)  # the saved keys replace the current ones
        try:
            self.buffer.load_state_dict(state_dict["buffer"])
        except BaseException:
            self.buffer, self._keys, self._zeros = old
            raise
        self._keys = None if keys is None else frozenset(keys)
        self._validate_keys = bool(state_dict.get("validate_keys", self._validate_keys))


class SequentialBuffer(_Rows, Buffer):
    """A buffer that stores experiences sequentially (fishyrl's ``SequentialBuffer``).

    Args:
        capacity: The maximum number of experiences to store (the oldest are overwritten).
        validate_keys: Every experience must have the keys of the first one (True), or
            may leave keys out (False: stored as zeros).
        seed: Seed of the sampling generator (None: fresh entropy).

    Attributes:
        buffer: The core rows :class:`~replaybank.buffers.replay.ReplayBuffer` (its
            fields are ``fishyrl/<key>``).

    Raises:
        ConfigError: capacity is not a positive int, or seed is not a non-negative int.

    Example:
        >>> import numpy as np
        >>> buf = SequentialBuffer(3, seed=0)
        >>> for t in range(5):
        ...     buf.add({"x": np.array(t)})
        >>> buf.size, buf.is_full, buf.sample(2, 3)["x"].tolist()
        (3, True, [[2, 3, 4], [2, 3, 4]])
    """

    def __init__(self, capacity: int, validate_keys: bool = True, seed: int | None = None
                 ) -> None:
        self._capacity = _capacity(capacity, "SequentialBuffer")
        self._validate_keys = bool(validate_keys)
        self._rng = make_rng(seed)
        self.reset()

    @property
    def capacity(self) -> int:
        """The maximum number of experiences the buffer can store."""
        return self._capacity

    @property
    def is_full(self) -> bool:
        """Whether the buffer is full (holds ``capacity`` experiences)."""
        return len(self.buffer) >= self._capacity

    @property
    def size(self) -> int:
        """The current number of experiences stored in the buffer."""
        return len(self.buffer)

    def reset(self) -> None:
        """Reset/initialize the buffer: nothing stored, no keys (the generator goes on)."""
        self._fresh(self._capacity, 1, self._rng)

    def add(self, experience: dict[str, np.ndarray]) -> None:
        """Add an experience to the buffer.

        Args:
            experience: ``{key: array}``, one experience; the keys of the first add are
                the buffer's (``validate_keys``).

        Raises:
            SpecError: Keys differ (naming the missing and unexpected ones); a value's
                shape differs from the first add's. The buffer is then unchanged.
        """
        self._add(experience)

    def sample(self, batch_size: int, sequence_length: int) -> dict[str, np.ndarray]:  # type: ignore[override]
        """Sample a batch of sequences of consecutive experiences.

        Args:
            batch_size: The number of sequences ``B`` (drawn with replacement).
            sequence_length: The length ``L`` of each sequence.

        Returns:
            ``{key: [B, L, *shape]}``; every window start is equally likely.

        Raises:
            ConfigError: batch_size or sequence_length not a positive int, or
                ``sequence_length > capacity``.
            EmptyBufferError: Fewer than ``sequence_length`` experiences are stored.
        """
        return self._sample(batch_size, sequence_length)

    def state_dict(self) -> dict[str, Any]:
        """Return the state of the buffer: ``{"buffer": core state dict, "validate_keys",
        "keys", "capacity"}`` (arrays are views of the storage, not copies)."""
        return {**self._state(), "capacity": self._capacity}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a :meth:`state_dict`: its capacity, keys, data and generator state.

        Raises:
            CheckpointError: Not a state dict of this front end, or damaged (the buffer
                is then unchanged).
        """
        capacity = self._capacity
        if isinstance(state_dict, Mapping) and "capacity" in state_dict:
            capacity = _capacity(state_dict["capacity"], "load_state_dict")
        self._load(state_dict, capacity, self._rng)
        self._capacity = capacity

    def __repr__(self) -> str:
        return (f"SequentialBuffer(capacity={self._capacity}, "
                f"validate_keys={self._validate_keys}, size={self.size})")


class IndependentVectorizedBuffer(_Rows, Buffer):
    """Independent buffers for vectorized environments (fishyrl's
    ``IndependentVectorizedBuffer``), one per env.

    Args:
        num_buffers: The number of buffers (envs).
        *buffer_args: Positional arguments of ``buffer_class`` (``capacity``: the most
            experiences *each* buffer stores; ``validate_keys``).
        buffer_class: The class of the buffers; :class:`SequentialBuffer` (default)
            makes one core buffer with a lane per buffer; any other :class:`Buffer`
            class gets a list of ``num_buffers`` instances.
        seed: Seed of the sampling generator (other classes: buffer ``i`` gets
            ``seed + i``).
        **buffer_kwargs: Keyword arguments of ``buffer_class``.

    Raises:
        ConfigError: num_buffers not a positive int; arguments that ``buffer_class``
            does not take (TypeError too).

    Example:
        >>> import numpy as np
        >>> buf = IndependentVectorizedBuffer(4, 50, seed=0)
        >>> for t in range(10):
        ...     buf.add({"obs": np.full((4, 2), t, np.float32), "done": np.zeros(4, bool)})
        >>> buf.size
        40
        >>> batch = buf.sample(8, sequence_length=5)
        >>> batch["obs"].shape, batch["done"].shape
        ((8, 5, 2), (8, 5))
    """

    def __init__(self, num_buffers: int, *buffer_args: Any,
                 buffer_class: type[Buffer] = SequentialBuffer, seed: int | None = None,
                 **buffer_kwargs: Any) -> None:
        if isinstance(num_buffers, bool) or not isinstance(num_buffers, (int, np.integer)) \
                or num_buffers <= 0:
            raise ConfigError(f"IndependentVectorizedBuffer(num_buffers={num_buffers!r}): "
                              "must be a positive int (one buffer per env)")
        self.num_buffers = int(num_buffers)
        self._rng = make_rng(seed)
        self._buffers: list[Buffer] | None = None
        if buffer_class is SequentialBuffer:
            try:
                bound = inspect.signature(SequentialBuffer).bind(*buffer_args,
                                                                 **buffer_kwargs)
            except TypeError as exc:
                raise _ArgumentError(
                    f"IndependentVectorizedBuffer: buffer arguments {buffer_args!r}, "
                    f"{buffer_kwargs!r} do not fit SequentialBuffer(capacity, "
                    f"validate_keys=True) ({exc})") from None
            if "seed" in bound.arguments:
                raise _ArgumentError("IndependentVectorizedBuffer: pass seed= to the group, "
                                     "not to its buffers")
            bound.apply_defaults()
            self._capacity = _capacity(bound.arguments["capacity"], "SequentialBuffer")
            self._validate_keys = bool(bound.arguments["validate_keys"])
            self._fresh(self._capacity, self.num_buffers, self._rng)
        else:  # any other Buffer class: fishyrl's list of buffers, sampled the same way
            self._buffers = [buffer_class(*buffer_args,  # type: ignore[call-arg]
                                          seed=None if seed is None else seed + i,
                                          **buffer_kwargs) for i in range(self.num_buffers)]

    @property
    def size(self) -> int:
        """The current number of experiences stored in all buffers."""
        if self._buffers is not None:
            return sum(b.size for b in self._buffers)
        return len(self.buffer)

    def reset(self) -> None:
        """Reset/initialize all buffers (the generator goes on)."""
        if self._buffers is not None:
            for b in self._buffers:
                b.reset()
            return
        self._fresh(self._capacity, self.num_buffers, self._rng)

    def add(self, experience: dict[str, np.ndarray]) -> None:
        """Add one experience to every buffer: ``experience[key][i]`` goes to buffer ``i``.

        Args:
            experience: ``{key: [num_buffers, *shape]}``.

        Raises:
            SpecError, ShapeError: Keys differ (naming the missing and unexpected ones),
                or a value's leading dim is not ``num_buffers``; nothing is added to any
                buffer (fishyrl's buffers could desync here; these cannot).
        """
        if self._buffers is not None:
            for i, b in enumerate(self._buffers):
                b.add({k: v[i] for k, v in experience.items()})
            return
        self._add(experience)

    def sample(self, batch_size: int, **sample_kwargs: Any) -> dict[str, np.ndarray]:
        """Sample a batch divided randomly among the buffers (each buffer equally likely
        per sequence) and concatenated.

        Args:
            batch_size: The number of sequences ``B``.
            **sample_kwargs: The buffers' ``sample`` arguments (``sequence_length``).

        Returns:
            ``{key: [B, L, *shape]}``.

        Raises:
            TypeError: A keyword ``SequentialBuffer.sample`` does not take.
            ConfigError, EmptyBufferError: As :meth:`SequentialBuffer.sample`.

        Warns:
            UserWarning: ``batch_size`` does not divide by ``num_buffers`` (as fishyrl;
                the batch still has ``batch_size`` sequences).
        """
        n = self.num_buffers
        if type(batch_size) is int and batch_size % n:
            warnings.warn(f"sample(batch_size={batch_size}): not divisible by the number of "
                          f"buffers {n}; the buffers' shares of the batch differ",
                          stacklevel=2)
        if self._buffers is not None:
            counts = np.bincount(self._rng.integers(0, n, size=batch_size), minlength=n)
            parts = [b.sample(int(c), **sample_kwargs)
                     for b, c in zip(self._buffers, counts, strict=True) if c > 0]
            return {k: np.concatenate([p[k] for p in parts], axis=0) for k in parts[0]}
        if set(sample_kwargs) != {"sequence_length"}:
            raise _ArgumentError(
                f"sample() got keyword arguments {sorted(sample_kwargs)}; the buffers' "
                "sample takes sequence_length= (e.g. sample(16, sequence_length=64))")
        return self._sample(batch_size, sample_kwargs["sequence_length"])

    def state_dict(self) -> dict[str, Any]:
        """Return the state of all buffers: ``{"buffer": core state dict,
        "validate_keys", "keys"}`` (other buffer classes: ``{"_buffers": [...],
        "_rng": ...}`` as fishyrl)."""
        if self._buffers is not None:
            return {"_buffers": [b.state_dict() for b in self._buffers],
                    "_rng": self._rng.bit_generator.state}
        return self._state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a :meth:`state_dict` of a group of the same number of buffers and capacity.

        Raises:
            CheckpointError: Not a state dict of this front end, of another size, or
                damaged (the buffers are then unchanged).
        """
        if self._buffers is not None:
            for b, s in zip(self._buffers, state_dict["_buffers"], strict=True):
                b.load_state_dict(s)
            self._rng.bit_generator.state = state_dict["_rng"]
            return
        self._load(state_dict, self._capacity, self._rng)

    def __repr__(self) -> str:
        return f"IndependentVectorizedBuffer(num_buffers={self.num_buffers}, size={self.size})"


class _ArgumentError(ConfigError, TypeError):
    """A call's arguments do not fit its signature (a TypeError, as Python raises)."""


def convert_samples_to_tensors(samples: dict[str, np.ndarray],
                               **tensor_kwargs: Any) -> dict[str, Any]:
    """Convert sampled experiences from numpy arrays to tensors.

    Args:
        samples: A batch, ``{key: array}``.
        **tensor_kwargs: ``Tensor.to`` arguments, e.g. ``device=``, ``dtype=``.

    Returns:
        ``{key: torch.Tensor}``; without ``tensor_kwargs`` (or ones that change nothing) a
        tensor shares memory with its array (a read-only array is copied first).

    Raises:
        MissingDependencyError: torch is not installed.

    Example:
        >>> import numpy as np, torch
        >>> out = convert_samples_to_tensors({"obs": np.zeros((2, 3), np.float64)},
        ...                                  dtype=torch.float32, device="cpu")
        >>> out["obs"].dtype, tuple(out["obs"].shape), out["obs"].device.type
        (torch.float32, (2, 3), 'cpu')
    """
    torch = require_extra("torch", "torch")
    out: dict[str, Any] = {}
    for k, v in samples.items():
        if isinstance(v, np.ndarray):
            t = torch.from_numpy(v if v.flags.writeable else v.copy())
        else:
            t = torch.as_tensor(v)
        out[k] = t.to(**tensor_kwargs) if tensor_kwargs else t
    return out
