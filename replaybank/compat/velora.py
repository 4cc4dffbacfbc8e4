"""velora's replay buffer API (``velora.buffer``) over the replaybank core.

A velora user switches by changing one import::

    from velora.buffer import ReplayBuffer          # before
    from replaybank.compat.velora import ReplayBuffer  # after

Everything velora's reference documents is here under the same names and signatures:
:class:`BatchExperience`, :class:`BufferBase`, :class:`ReplayBuffer` (``add``,
``add_multi``, ``sample``, ``warm``, ``__len__``, ``metadata``, ``state_dict``, ``save``,
``load``, ``config``), :class:`BufferConfig` and the key literals :data:`MetaDataKeys`
and :data:`BufferKeys`. The front end only translates names, shapes and defaults; the
data live in a :class:`replaybank.ReplayBuffer` it owns (:attr:`BufferBase.core`): one
lane, fields ``obs [state_dim]``, ``action [action_dim]``, ``reward``, ``terminated``,
``truncated`` and ``hidden [hidden_dim]``, each observation stored once.

Storage: on the CPU (``device=None`` or a CPU device) the core keeps numpy arrays and
batches become tensors without a copy (``torch.from_numpy``); measured faster than torch
storage on the CPU for every call (``benchmarks/bench_compat_velora.py``). On any other
device (``cuda``, ...) the core keeps torch tensors on that device, so batches never
leave it.

velora's ``done`` is the core's ``terminated``; :meth:`ReplayBuffer.warm` also stores
the env's truncation apart, and ``BatchExperience.dones`` is ``terminated | truncated``
as in velora. :meth:`ReplayBuffer.sample` draws its indices as velora does,
``torch.randint(0, size, (batch_size,))`` on torch's global generator (so
``torch.manual_seed`` reproduces velora's draws), unless the buffer was given a
``seed=`` of its own. Every public call checks its arguments first and raises a
:class:`~replaybank.errors.ReplayBankError` naming the argument, leaving the buffer
unchanged. Where this front end behaves differently from velora, and why:
``docs/migration/velora.md``.

Example:
    >>> import torch
    >>> buf = ReplayBuffer(100, state_dim=4, action_dim=2, hidden_dim=3)
    >>> buf.add(torch.zeros(4), torch.ones(2), 1.0, torch.ones(4), False, torch.zeros(3))
    >>> buf.add_multi(torch.ones(5, 4), torch.zeros(5, 2), torch.ones(5), torch.ones(5, 4),
    ...               torch.zeros(5), torch.zeros(5, 3))
    >>> len(buf), buf.metadata()["position"]
    (6, 6)
    >>> batch = buf.sample(4)
    >>> tuple(batch.states.shape), tuple(batch.rewards.shape), tuple(batch.dones.shape)
    ((4, 4), (4, 1), (4, 1))
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from replaybank.buffers.arguments import make_rng
from replaybank.buffers.replay import ReplayBuffer as CoreBuffer
from replaybank.compat.base import Core, FrontEnd
from replaybank.compat.checks import (
    check_int,
    check_type,
    done_flag,
    flag_values,
    host_array,
    is_int,
    numbers,
    one_number,
    saved_generator,
)
from replaybank.compat.devices import batch_device, checked_device, torch_module
from replaybank.errors import (
    ArgumentError,
    CapacityError,
    CheckpointError,
    ConfigError,
    EmptyBufferError,
    ReplayBankError,
    ShapeError,
    describe,
    require_extra,
)
from replaybank.host import tensor_to_numpy
from replaybank.io.atomic import temp_path
from replaybank.spec import check_tuple

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "AbstractSampleError",
    "BatchExperience",
    "BufferBase",
    "BufferConfig",
    "BufferKeys",
    "MetaDataKeys",
    "ReplayBuffer",
]

#: Keys of :meth:`BufferBase.metadata` (and of ``<prefix>metadata.json``).
MetaDataKeys = Literal["capacity", "state_dim", "action_dim", "hidden_dim", "position",
                       "size", "device"]
#: Keys of :meth:`BufferBase.state_dict` (and of ``<prefix>state.safetensors``).
BufferKeys = Literal["states", "actions", "rewards", "next_states", "dones", "hiddens"]

#: ``Tensor``; torch is imported only where it is used (the core imports nothing
#: heavy at module level: the import-linter contract), so annotations name it by alias.
Tensor: TypeAlias = Any
#: ``torch.device`` (or a device string).
Device: TypeAlias = Any

_F32 = np.dtype(np.float32)
_BOOL = np.dtype(np.bool_)
_KEYS: tuple[BufferKeys, ...] = ("states", "actions", "rewards", "next_states", "dones",
                                 "hiddens")
#: The constructor's sizes: :meth:`ReplayBuffer.config` and the start of the metadata.
_SIZES: tuple[MetaDataKeys, ...] = ("capacity", "state_dim", "action_dim", "hidden_dim")
Array = npt.NDArray[Any]


@dataclass
class BatchExperience:
    """A batch of experience; every field is a tensor ``(batch_size, features)``.

    Attributes:
        states: Observations ``(B, state_dim)``.
        actions: Actions taken in them ``(B, action_dim)``.
        rewards: Rewards received ``(B, 1)``.
        next_states: Observations after the actions ``(B, state_dim)`` (for a step that
            ended an episode, its true final observation).
        dones: ``1.0`` where the episode ended at the step, else ``0.0`` ``(B, 1)``.
        hiddens: Hidden states of the prediction network ``(B, hidden_dim)``.

    Example:
        >>> import torch
        >>> b = BatchExperience(*(torch.zeros(2, 1) for _ in range(6)))
        >>> b.rewards.shape
        torch.Size([2, 1])
    """

    states: Tensor
    actions: Tensor
    rewards: Tensor
    next_states: Tensor
    dones: Tensor
    hiddens: Tensor


class BufferConfig(BaseModel):
    """What :meth:`ReplayBuffer.config` returns: the buffer's type and dimensions.

    Attributes:
        type: The buffer class name (``"ReplayBuffer"``).
        capacity: Maximum number of stored experiences.
        state_dim: Dimension of state observations.
        action_dim: Dimension of actions.
        hidden_dim: Dimension of hidden states.

    Example:
        >>> BufferConfig(type="ReplayBuffer", capacity=10, state_dim=4, action_dim=1,
        ...              hidden_dim=8).model_dump()["capacity"]
        10
    """

    model_config = ConfigDict(frozen=True)

    type: Literal["ReplayBuffer"]
    capacity: int
    state_dim: int
    action_dim: int
    hidden_dim: int


class AbstractSampleError(ReplayBankError, NotImplementedError):
    """:meth:`BufferBase.sample` was called on a buffer that defines no sampling scheme
    (velora's abstract ``sample``); also a ``NotImplementedError``."""


#: Metadata keys :meth:`BufferBase.load` needs, with the smallest value each may hold.
_META_MIN: dict[str, int] = {"capacity": 1, "state_dim": 1, "action_dim": 1, "hidden_dim": 0,
                             "position": 0, "size": 0}


def _uses_numpy(device: Any) -> bool:
    """Whether a buffer on ``device`` keeps numpy storage (the CPU) or torch storage."""
    return batch_device(torch_module(), device) is None


def _floats(x: Any, what: str, shape: tuple[int, ...]) -> Array:
    """``x`` as a float32 array of ``shape``, by torch's assignment rules (what velora's
    ``tensor[i] = x`` accepts): leading size-1 dims dropped, then broadcast.

    Raises:
        DtypeError: ``x`` does not hold numbers.
        ShapeError: ``x`` does not fit ``shape``.
    """
    a = numbers(x, what, "convert the value to a float tensor").astype(np.float32, copy=False)
    if a.shape == shape:
        return a
    while a.ndim > len(shape) and a.shape[0] == 1:
        a = a[0]
    try:
        return np.broadcast_to(a, shape)
    except ValueError:
        raise ShapeError(
            f"{what}: shape {tuple(np.shape(a))} does not fit the buffer's {shape}; pass "
            "a value of that shape (the dimensions were fixed at construction)"
        ) from None


def _flags(x: Any, what: str, n: int) -> Array:
    """``x`` (``(n,)`` or ``(n, 1)``: bools, or numbers 0/1) as ``n`` bools.

    Raises:
        DtypeError: A value other than 0/1 (NaN, 2, strings, None).
        ShapeError: Not ``n`` rows.
    """
    a = numbers(x, what, "pass bools (e.g. terminated | truncated) or 0/1 numbers")
    return flag_values(_column(a, what, n), what)


def _checked_metadata(where: str, metadata: Any) -> dict[str, Any]:
    """The values :meth:`BufferBase.load` needs from ``metadata``, checked.

    Raises:
        CheckpointError: Not a mapping, a key missing, or a value of the wrong kind.
    """
    check_type(None, f"{where}: metadata", metadata, Mapping, "the dict loaded from "
               "<prefix>metadata.json (json.load of the file)", CheckpointError)
    missing = [k for k in (*_META_MIN, "device") if k not in metadata]
    if missing:
        raise CheckpointError(f"{where}: metadata has no {', '.join(map(repr, missing))}; "
                              "pass the dict loaded from the <prefix>metadata.json saved with "
                              f"this file (keys {[*_META_MIN, 'device']})")
    out: dict[str, Any] = {}
    for key, least in _META_MIN.items():
        out[key] = check_int(None, f"{where}: metadata {key}", metadata[key], least,
                             error=CheckpointError, kind_error=CheckpointError,
                             fix="pass the metadata saved with this file")
    device = metadata["device"]
    if device is not None and not isinstance(device, str):
        raise CheckpointError(f"{where}: metadata device={describe(device)} must be a "
                              "device name (e.g. 'cpu', 'cuda:0') or None")
    out["device"] = device
    cap, pos, size = out["capacity"], out["position"], out["size"]
    if not (size <= cap and pos < cap and (size == cap or pos == size)):
        raise CheckpointError(
            f"{where}: position={pos}, size={size} are impossible for capacity={cap}; pass "
            "the metadata saved with this file")
    gen = metadata.get("generator")
    out["seed"] = None if gen is None else saved_generator(
        gen, f"{where}: 'generator'", "pass the metadata saved with this file")
    return out


class BufferBase(FrontEnd):
    """The storage of every velora buffer: experiences as individual items.

    Items are ``(state, action, reward, next_state, done, hidden)``; the buffer is a ring
    of ``capacity`` items (the oldest is overwritten first). As in velora, the base class
    can be built and filled on its own; it defines no sampling scheme (its
    :meth:`sample` raises), which :class:`ReplayBuffer` and subclasses provide.

    Args:
        capacity: Maximum number of stored experiences.
        state_dim: Dimension of state observations (>= 1).
        action_dim: Dimension of actions (>= 1).
        hidden_dim: Dimension of the hidden states (>= 0; 0: no hidden state).
        device: Where the data and the sampled tensors live (None: the CPU).
        seed: The buffer's own generator (an int seed or a numpy Generator; keyword
            only, not in velora). None (the default): :meth:`ReplayBuffer.sample` draws
            with torch's global generator, as velora does, so ``torch.manual_seed(s)``
            before a sample reproduces it.

    Raises:
        CapacityError: ``capacity`` is not a positive int, or does not fit in memory.
        ConfigError: A dimension is not an int of its minimum, ``device`` is not a torch
            device or is not available, or ``seed`` is not a seed.

    Example:
        >>> import torch
        >>> buf = BufferBase(10, 3, 1, 2)
        >>> buf.add(torch.zeros(3), torch.ones(1), 0.5, torch.ones(3), True, torch.zeros(2))
        >>> buf.metadata()["size"], buf.dones[0].item(), buf.next_states[0].tolist()
        (1, 1.0, [1.0, 1.0, 1.0])
    """

    _repr_fields = ("capacity", "state_dim", "action_dim", "hidden_dim", "size=len", "device")
    buffer: CoreBuffer

    def __init__(self, capacity: int, state_dim: int, action_dim: int, hidden_dim: int, *,
                 device: Device | None = None,
                 seed: int | np.random.Generator | None = None) -> None:
        self.capacity = check_int(None, "capacity", capacity, error=CapacityError,
                                  kind_error=CapacityError, example="100_000")
        dims = tuple(check_int(None, name, value, least, kind_error=ConfigError, example=4)
                     for name, value, least in (("state_dim", state_dim, 1),
                                                ("action_dim", action_dim, 1),
                                                ("hidden_dim", hidden_dim, 0)))
        dev = checked_device(device)
        torch = torch_module()
        # the buffer's own generator, or (None) torch's global one, as velora; the core
        # then gets a seed that reads torch's without drawing from it (buf.core.sample)
        own = seed is not None
        rng = make_rng(seed if own else torch.initial_seed() % 2**63)
        self.state_dim, self.action_dim, self.hidden_dim = dims
        self.device = device
        self._numpy = _uses_numpy(dev)
        spec = {"obs": ((dims[0],), "float32"), "action": ((dims[1],), "float32"),
                "reward": ((), "float32"), "terminated": ((), "bool"),
                "truncated": ((), "bool"), "hidden": ((dims[2],), "float32")}
        self.buffer = CoreBuffer(self.capacity, seed=rng, spec=spec,
                                storage="numpy" if self._numpy else "torch",
                                device=None if self._numpy else dev)
        self._own_rng = own
        self._cache_torch()
        self._shapes = ((dims[0],), (dims[1],), (dims[2],))
        self._no_trunc: dict[int, Array] = {}  # add_multi's truncated=False, by rows

    def _cache_torch(self) -> None:
        """Keep the torch parts the hot paths use (module, Tensor, from_numpy)."""
        torch = torch_module()
        self._torch_mod = torch
        self._tensor_type = torch.Tensor
        self._from_numpy = torch.from_numpy

    def __getstate__(self) -> dict[str, Any]:
        """What ``pickle``, ``copy.deepcopy`` and ``torch.save`` keep: everything but the
        cached torch parts (a module cannot be pickled; :meth:`__setstate__` fetches them
        again). The core buffer and its generator travel, so a clone draws the same.

        Example:
            >>> import pickle
            >>> buf = ReplayBuffer(4, state_dim=2, action_dim=1, hidden_dim=0, seed=0)
            >>> len(pickle.loads(pickle.dumps(buf)))
            0
        """
        state = dict(self.__dict__)
        for name in ("_torch_mod", "_tensor_type", "_from_numpy"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`__getstate__` and fetch the torch parts again."""
        self.__dict__.update(state)
        self._cache_torch()

    core: Core[CoreBuffer] = Core(
        "The :class:`replaybank.ReplayBuffer` holding the data (terminated and truncated "
        "apart, ``sample_sequences``, ``rb.save``, ...); also :attr:`buffer`.", "buffer")

    # ------------------------------------------------------------------ writing
    def add(self, state: Tensor, action: Tensor, reward: float,
            next_state: Tensor, done: bool, hidden: Tensor) -> None:
        """Add one experience (the oldest is overwritten when the buffer is full).

        Values are stored as float32. Tensors on any device, numpy arrays and Python
        numbers are accepted; a value with extra leading size-1 dims, or one that
        broadcasts (e.g. a scalar action), is stored as torch's assignment would.
        Everything is checked before anything is written.

        Args:
            state: Observation ``(state_dim,)``.
            action: Action taken ``(action_dim,)``.
            reward: Reward received (one number; NaN is stored as velora stores it).
            next_state: Observation after the action ``(state_dim,)``.
            done: Whether the episode ended: a bool or 0/1 (stored as the core's
                ``terminated``).
            hidden: Hidden state of the prediction network ``(hidden_dim,)``.

        Raises:
            DtypeError: A value is not numbers (None, a string, ...), or ``done`` is not
                a bool or 0/1; nothing is stored.
            ShapeError: A value does not fit its field, is a ragged nest (naming it), or
                is a tuple holding arrays (the core's tuple rule,
                :func:`~replaybank.spec.check_tuple`, which numpy would stack
                part-first); nothing is stored.

        Example:
            >>> import torch
            >>> buf = ReplayBuffer(4, 2, 1, 1)
            >>> buf.add(torch.ones(2), torch.tensor(1), 1.0, torch.ones(2), False,
            ...         torch.zeros(1))
            >>> len(buf), buf.actions[0].tolist()
            (1, [1.0])
        """
        tensor = self._tensor_type
        ss, sa, sh = self._shapes
        try:  # the common case: host tensors (or arrays) of the stored format
            s = state.numpy() if type(state) is tensor else state
            a = action.numpy() if type(action) is tensor else action
            ns = next_state.numpy() if type(next_state) is tensor else next_state
            h = hidden.numpy() if type(hidden) is tensor else hidden
            if s.dtype is not _F32 or s.shape != ss or a.dtype is not _F32 \
                    or a.shape != sa or ns.dtype is not _F32 or ns.shape != ss \
                    or h.dtype is not _F32 or h.shape != sh:
                raise TypeError
        except (AttributeError, TypeError, RuntimeError):  # other types, devices, grads
            _parts_rule("add", (("state", state), ("action", action),
                                ("next_state", next_state), ("hidden", hidden)))
            s = _floats(state, "add(state=...)", ss)
            a = _floats(action, "add(action=...)", sa)
            ns = _floats(next_state, "add(next_state=...)", ss)
            h = _floats(hidden, "add(hidden=...)", sh)
        if type(reward) is not float:
            _parts_rule("add", (("reward", reward),))
            # one number (NaN is data, as in velora)
            reward = float(one_number(reward, "add(reward=...)", "convert the value to a float"))
        if type(done) is not bool:
            _parts_rule("add", (("done", done),))
            done = done_flag(done, "add(done=...)")
        self.buffer.add(obs=s, action=a, reward=reward, next_obs=ns, terminated=done,
                       truncated=False, hidden=h)

    def add_multi(self, states: Tensor, actions: Tensor, rewards: Tensor,
                  next_states: Tensor, dones: Tensor,
                  hiddens: Tensor) -> None:
        """Add ``n`` experiences at once, in row order (as ``n`` calls of :meth:`add`).

        1-D ``rewards``, ``dones`` and ``actions`` are read as one column each.

        Args:
            states: Observations ``(n, state_dim)``.
            actions: Actions ``(n, action_dim)``, or ``(n,)`` when ``action_dim == 1``.
            rewards: Rewards ``(n,)`` or ``(n, 1)``.
            next_states: Observations after the actions ``(n, state_dim)``.
            dones: Episode ends ``(n,)`` or ``(n, 1)``: bools, or 0/1 numbers.
            hiddens: Hidden states ``(n, hidden_dim)``.

        Raises:
            DtypeError: A value is not numbers, or a done is not 0/1; nothing is stored.
            ShapeError: A value does not fit its field; nothing is stored.

        Example:
            >>> import torch
            >>> buf = ReplayBuffer(4, 2, 1, 1)
            >>> buf.add_multi(torch.ones(3, 2), torch.tensor([0, 1, 0]), torch.ones(3),
            ...               torch.ones(3, 2), torch.tensor([0, 0, 1]), torch.zeros(3, 1))
            >>> len(buf), buf.dones.flatten().tolist()
            (3, [0.0, 0.0, 1.0, 0.0])
        """
        tensor = self._tensor_type
        ss, sa, sh = self._shapes
        try:  # the common case: host tensors (or arrays) of the stored format
            s, a, r, ns, d, h = [x.numpy() if type(x) is tensor else x for x in
                                 (states, actions, rewards, next_states, dones, hiddens)]
            n = s.shape[0]
            if a.ndim == 1:
                a = a[:, None]
            if r.ndim == 2:
                r = r.reshape(-1)
            if d.ndim == 2:
                d = d.reshape(-1)
            if s.dtype is not _F32 or s.shape[1:] != ss or a.dtype is not _F32 \
                    or a.shape[1:] != sa or len(a) != n or r.dtype is not _F32 \
                    or r.ndim != 1 or len(r) != n or ns.dtype is not _F32 \
                    or ns.shape != s.shape or h.dtype is not _F32 or h.shape[1:] != sh \
                    or len(h) != n or d.ndim != 1 or len(d) != n:
                raise TypeError
            if d.dtype is not _BOOL:
                d = flag_values(d, "add_multi(dones=...)")  # raises: the checked path
        except (AttributeError, TypeError, RuntimeError, ValueError):  # other formats
            s, a, r, ns, d, h = _rows(states, actions, rewards, next_states, dones, hiddens,
                                      self._shapes)
            n = s.shape[0]
        no = self._no_trunc.get(n)
        if no is None:
            no = np.zeros(n, dtype=bool)
            if len(self._no_trunc) < 8:
                self._no_trunc[n] = no
        self.buffer.extend(obs=s, action=a, reward=r, next_obs=ns, terminated=d,
                          truncated=no, hidden=h)

    # ------------------------------------------------------------------ reading
    def sample(self, *args: Any, **kwargs: Any) -> BatchExperience:
        """Sample experiences; every field of the batch is ``(batch_size, features)``.

        velora's abstract method, documented as ``sample()`` without parameters: the base
        class defines no sampling scheme (velora's returned None); :class:`ReplayBuffer`
        and subclasses define it (``sample(batch_size)``). Any arguments are accepted, so
        both velora's call and a subclass's reach this error.

        Args:
            *args: What a subclass's ``sample`` would take (e.g. ``batch_size``).
            **kwargs: Likewise, by keyword.

        Raises:
            AbstractSampleError: Always (a ``NotImplementedError``).

        Example:
            >>> BufferBase(4, 2, 1, 1).sample()
            Traceback (most recent call last):
            ...
            replaybank.compat.velora.AbstractSampleError: BufferBase.sample(): the base class stores experiences but defines no sampling scheme; use ReplayBuffer, or subclass BufferBase and define sample(batch_size)
        """  # noqa: E501
        shown = ", ".join(
            [*map(describe, args), *(f"{k}={describe(v)}" for k, v in kwargs.items())]
        )
        raise AbstractSampleError(
            f"{type(self).__name__}.sample({shown}): the base class stores experiences but "
            "defines no sampling scheme; use ReplayBuffer, or subclass BufferBase and define "
            "sample(batch_size)"
        )

    def _uniform(self, batch_size: Any) -> BatchExperience:
        """``batch_size`` experiences drawn uniformly with replacement, as velora's
        ``ReplayBuffer.sample``: slots ``torch.randint(0, size, (batch_size,))`` from
        torch's global generator (on the buffer's device), or from the buffer's own
        generator when it was given a seed.

        Raises:
            ConfigError: ``batch_size`` is not a positive int.
            EmptyBufferError: The buffer holds fewer than ``batch_size`` experiences.
        """
        b = check_int("sample", "batch_size", batch_size, kind_error=ConfigError, example=64)
        core = self.buffer
        n = len(core)
        if n < b:
            # velora's message word for word (code may match on it), then the fix
            raise EmptyBufferError(
                f"sample(batch_size={b}): Buffer does not contain enough experiences. "
                f"Available: {n}, Requested: {b}; add more experiences or lower batch_size"
            )
        if self._own_rng:
            slots = core.rng.integers(0, n, size=b)  # [B]
        else:
            idx = self._torch_mod.randint(0, n, (b,), device=self.device)  # velora's draw
            slots = tensor_to_numpy(idx)
        # one lane, never wrapped before it is full: slots 0..size-1 are the live items
        f = core.table.gather_transitions(slots)
        ended = f["terminated"] | f["truncated"]
        if self._numpy:
            t = self._from_numpy
            return BatchExperience(t(f["obs"]), t(f["action"]), t(f["reward"][:, None]),
                                   t(f["next_obs"]), t(ended.astype(np.float32)[:, None]),
                                   t(f["hidden"]))
        return BatchExperience(f["obs"], f["action"], f["reward"][:, None], f["next_obs"],
                               ended.float()[:, None], f["hidden"])

    size: Core[int] = Core("Number of stored experiences (velora's attribute; as "
                           "``len(buf)``).", "len")

    @property
    def position(self) -> int:
        """Index where the next experience is written (wraps at ``capacity``)."""
        return int(self.buffer.table.written[0]) % self.buffer.rows

    def _field(self, name: str, width: int) -> Any:
        """Storage of field ``name`` as ``(capacity, width)``: a view, not a copy."""
        a = self.buffer.table.arrays[name].reshape(self.buffer.rows, width)
        return self._from_numpy(a) if self._numpy else a

    @property
    def states(self) -> Tensor:
        """All observations ``(capacity, state_dim)`` (a view of the storage)."""
        return self._field("obs", self.state_dim)

    @property
    def actions(self) -> Tensor:
        """All actions ``(capacity, action_dim)`` (a view of the storage)."""
        return self._field("action", self.action_dim)

    @property
    def rewards(self) -> Tensor:
        """All rewards ``(capacity, 1)`` (a view of the storage)."""
        return self._field("reward", 1)

    @property
    def hiddens(self) -> Tensor:
        """All hidden states ``(capacity, hidden_dim)`` (a view of the storage)."""
        return self._field("hidden", self.hidden_dim)

    @property
    def dones(self) -> Tensor:
        """All episode ends ``(capacity, 1)`` as float32, ``terminated | truncated``
        (a copy)."""
        t = self.buffer.table.arrays
        ended = (t["terminated"] | t["truncated"]).reshape(-1, 1)
        return self._from_numpy(ended.astype(np.float32)) if self._numpy else ended.float()

    @property
    def next_states(self) -> Tensor:
        """All next observations ``(capacity, state_dim)``, exactly as added; zeros where
        nothing is stored yet (a copy: the core stores each observation once)."""
        core = self.buffer
        n, w = len(core), int(core.table.written[0])
        keys = np.arange(w - n, w, dtype=np.int64)
        rows = keys % core.rows
        if self._numpy:
            out = np.zeros((core.rows, self.state_dim), dtype=np.float32)
            if n:
                out[rows] = core.table.gather_next("obs", keys)
            return self._from_numpy(out)
        torch = torch_module()
        dev = core.table.arrays["obs"].device
        res = torch.zeros((core.rows, self.state_dim), dtype=torch.float32, device=dev)
        if n:
            res[torch.from_numpy(rows).to(dev)] = core.table.gather_next("obs", keys)
        return res

    def metadata(self) -> dict[MetaDataKeys, Any]:
        """The buffer's description (JSON-able; ``<prefix>metadata.json`` of :meth:`save`).

        Returns:
            ``capacity``, ``state_dim``, ``action_dim``, ``hidden_dim``, ``position``
            (where the next item goes), ``size`` and ``device`` (its ``str``, or None).

        Example:
            >>> ReplayBuffer(8, 3, 1, 2).metadata()
            {'capacity': 8, 'state_dim': 3, 'action_dim': 1, 'hidden_dim': 2, 'position': 0, 'size': 0, 'device': None}
        """  # noqa: E501
        meta: dict[MetaDataKeys, Any] = {k: getattr(self, k)
                                         for k in (*_SIZES, "position", "size")}
        meta["device"] = str(self.device) if self.device else None
        return meta

    def state_dict(self) -> dict[BufferKeys, Tensor]:
        """The buffer's tensors, each ``(capacity, features)`` and indexed as velora's.

        Returns:
            ``states``, ``actions``, ``rewards``, ``next_states``, ``dones`` and
            ``hiddens`` (float32). ``states``, ``actions``, ``rewards`` and ``hiddens``
            are views of the storage; ``next_states`` and ``dones`` are built (copies).

        Example:
            >>> sd = ReplayBuffer(8, 3, 1, 2).state_dict()
            >>> {k: tuple(v.shape) for k, v in sd.items()}["next_states"]
            (8, 3)
        """
        return {k: getattr(self, k) for k in _KEYS}

    # ------------------------------------------------------------------ files
    def save(self, dirpath: str | Path, prefix: str = "buffer_") -> None:
        """Write ``<prefix>metadata.json`` and ``<prefix>state.safetensors`` in ``dirpath``.

        The files are velora's (velora loads them, and :meth:`load` loads velora's); each
        is written to a temporary name and renamed, so a crash never leaves half a file.
        A buffer with its own generator (``seed=``) also writes the generator's state
        under the key ``"generator"`` of the metadata file (velora ignores it), so that
        :meth:`load` draws the same next batches.

        Args:
            dirpath: Folder of the files (created with its parents when missing).
            prefix: Start of both file names.

        Raises:
            ArgumentError: ``dirpath`` is not a path or ``prefix`` not a string.
            CheckpointError: The folder or a file cannot be written.

        Example:
            >>> import tempfile, torch
            >>> d = tempfile.mkdtemp()
            >>> ReplayBuffer(8, 3, 1, 2).save(d, prefix="b_")
            >>> sorted(p.name for p in Path(d).iterdir())
            ['b_metadata.json', 'b_state.safetensors']
        """
        check_type("save", "dirpath", dirpath, (str, os.PathLike),
                   "a folder path (str or pathlib.Path)")
        check_type("save", "prefix", prefix, str, "a string, e.g. prefix='buffer_'")
        storch = require_extra("safetensors.torch", "torch")
        folder = Path(dirpath)
        meta_path = Path(folder, f"{prefix}metadata").with_suffix(".json")
        state_path = Path(folder, f"{prefix}state").with_suffix(".safetensors")
        meta: dict[str, Any] = {str(k): v for k, v in self.metadata().items()}
        if self._own_rng:
            meta["generator"] = self.buffer.rng.bit_generator.state
        # a bit generator's state may hold numpy arrays and ints: JSON lists and ints
        text = json.dumps(meta, indent=2, default=lambda x: x.tolist())
        tensors = {k: v.contiguous() for k, v in self.state_dict().items()}
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with temp_path(state_path) as tmp:
                storch.save_file(tensors, str(tmp))
                os.replace(tmp, state_path)
            with temp_path(meta_path) as tmp:
                tmp.write_text(text)
                os.replace(tmp, meta_path)
        except OSError as exc:
            raise CheckpointError(f"save(dirpath={str(dirpath)!r}, prefix={prefix!r}): cannot "
                                  f"write the files ({exc}); pass a folder you can write "
                                  "to") from exc

    @classmethod
    def load(cls, state_path: str | Path, metadata: dict[MetaDataKeys, Any]) -> Self:
        """A new buffer holding a saved state (files of :meth:`save`, or of velora).

        Args:
            state_path: The ``.safetensors`` file (its suffix may be left out).
            metadata: The dict of the matching ``<prefix>metadata.json``, already loaded.

        Returns:
            A buffer on ``metadata["device"]`` (the CPU when it is None) whose items,
            ``position`` and ``size`` are those saved; with the saved generator when the
            metadata holds one (a buffer saved with ``seed=``), else drawing with torch's
            global generator.

        Raises:
            ArgumentError: ``state_path`` is not a path.
            CheckpointError: The metadata is not velora's dict (a key missing, a value of
                the wrong kind, ``position``/``size`` impossible, a device that is not
                available), the file is missing or not a safetensors file, a tensor is
                missing or its shape does not match the metadata, or a done is not 0/1;
                nothing is built.

        Example:
            >>> import json, tempfile, torch
            >>> d = Path(tempfile.mkdtemp())
            >>> buf = ReplayBuffer(8, 3, 1, 2)
            >>> buf.add(torch.ones(3), torch.ones(1), 2.0, torch.ones(3), False, torch.ones(2))
            >>> buf.save(d)
            >>> meta = json.loads((d / "buffer_metadata.json").read_text())
            >>> again = ReplayBuffer.load(d / "buffer_state.safetensors", meta)
            >>> len(again), again.rewards[0].item()
            (1, 2.0)
        """
        check_type("load", "state_path", state_path, (str, os.PathLike),
                   "the path of a <prefix>state.safetensors file (str or pathlib.Path)")
        path = Path(state_path).with_suffix(".safetensors")
        where = f"load({str(path)!r})"
        meta = _checked_metadata(where, metadata)
        torch = torch_module()
        snp = require_extra("safetensors.numpy", "torch")
        if not path.is_file():
            raise CheckpointError(f"{where}: the file is missing; pass the path of the "
                                  "<prefix>state.safetensors file that save wrote")
        try:
            data = snp.load_file(str(path))
        except Exception as exc:  # safetensors' own error types: a corrupt or foreign file
            raise CheckpointError(f"{where}: cannot read it as safetensors, the file is "
                                  f"corrupt or not a buffer state ({exc})") from exc
        cap, pos, size = meta["capacity"], meta["position"], meta["size"]
        widths = {"states": meta["state_dim"], "actions": meta["action_dim"], "rewards": 1,
                  "next_states": meta["state_dim"], "dones": 1, "hiddens": meta["hidden_dim"]}
        for key, width in widths.items():
            got = data.get(key)
            if got is None or got.shape != (cap, width) or got.dtype.kind not in "biuf":
                have = None if got is None else f"{got.shape} {got.dtype}"
                raise CheckpointError(
                    f"{where}: tensor {key!r} is {have} but the metadata says ({cap}, "
                    f"{width}) numbers; pass the metadata saved with this file")
        if size == cap:
            # the rows before `position` first, then all in age order: each row lands at
            # its saved index and the next write goes to `position`, as in velora
            order = np.concatenate([np.arange(pos), (np.arange(cap) + pos) % cap])
        else:
            order = np.arange(size)
        f32 = {k: np.ascontiguousarray(v[order], dtype=np.float32)
               for k, v in data.items() if k in widths}
        dones = f32["dones"][:, 0]
        if not ((dones == 0) | (dones == 1)).all():
            raise CheckpointError(f"{where}: tensor 'dones' holds values other than 0/1; a "
                                  "done is a flag (velora's add stored any float there)")
        device = meta["device"] or "cpu"
        # velora's constructor call; seed= only for a buffer saved with its own generator
        own = {} if meta["seed"] is None else {"seed": meta["seed"]}
        try:
            buf = cls(**{k: meta[k] for k in _SIZES}, device=torch.device(device), **own)
        except (ReplayBankError, RuntimeError, TypeError) as exc:
            raise CheckpointError(f"{where}: the metadata does not build a buffer: "
                                  f"{exc}") from exc
        if len(order):
            buf.buffer.extend(obs=f32["states"], action=f32["actions"],
                             reward=f32["rewards"][:, 0], next_obs=f32["next_states"],
                             terminated=dones != 0,
                             truncated=np.zeros(len(order), dtype=bool),
                             hidden=f32["hiddens"])
        return buf


def _column(x: Any, what: str, n: int) -> Any:
    """``x`` (``(n,)`` or ``(n, 1)``) as ``(n,)``, on the host (a ragged nest: the one
    ragged ShapeError, naming ``what``)."""
    a = host_array(x, what)
    if np.shape(a) == (n, 1):
        return np.reshape(a, n)
    if np.shape(a) != (n,):
        raise ShapeError(f"{what}: shape {tuple(np.shape(a))} but {n} rows; pass ({n},) or "
                         f"({n}, 1)")
    return a


def _parts_rule(call: str, values: tuple[tuple[str, Any], ...]) -> None:
    """The core's tuple rule (:func:`~replaybank.spec.check_tuple`) on each tuple or list
    among a call's ``(argument, value)`` pairs, before anything is converted: numpy would
    stack a tuple of arrays part-first (a state of two parts ``(pos, vel)`` into ``[2,
    ...]``), which may even fit the field's shape and be stored.

    Raises:
        ShapeError: A tuple holding arrays (or a list of them), naming the argument and
            the one tensor to pass instead.
    """
    many = call == "add_multi"
    for arg, value in values:
        if type(value) is tuple or type(value) is list:
            if arg in ("reward", "done"):
                fix = f"Pass {arg} as one number, as velora's add takes it"
            elif many:
                fix = (f"Pass {arg} as one tensor (n, dim), as velora's add_multi takes it: "
                       "join each step's parts (torch.cat) and stack the steps (torch.stack)")
            else:
                fix = (f"Pass {arg} as one tensor (dim,), as velora's add takes it: join its "
                       "parts (torch.cat)")
            check_tuple(arg, value, fix)


def _rows(states: Any, actions: Any, rewards: Any, next_states: Any, dones: Any,
          hiddens: Any, shapes: tuple[tuple[int, ...], ...]) -> tuple[Array, ...]:
    """:meth:`BufferBase.add_multi`'s values of any type, device or dtype, as the stored
    float32 (bool ``dones``) arrays, each with ``n`` rows.

    Raises:
        ShapeError: A value does not fit its field; a tuple holding arrays, or a list of
            them (the tuple rule of the core's add boundary,
            :func:`~replaybank.spec.check_tuple`).
    """
    ss, sa, sh = shapes
    _parts_rule("add_multi", (("states", states), ("actions", actions), ("rewards", rewards),
                              ("next_states", next_states), ("dones", dones),
                              ("hiddens", hiddens)))
    s = host_array(states, "add_multi(states=...)")
    n = int(np.shape(s)[0]) if np.ndim(s) else -1
    s = _floats(s, "add_multi(states=...)", (n, *ss))
    a = host_array(actions, "add_multi(actions=...)")
    if np.ndim(a) == 1:
        a = np.reshape(a, (n, 1))
    return (s, _floats(a, "add_multi(actions=...)", (n, *sa)),
            _floats(_column(rewards, "add_multi(rewards=...)", n), "add_multi(rewards=...)",
                    (n,)),
            _floats(next_states, "add_multi(next_states=...)", (n, *ss)),
            _flags(dones, "add_multi(dones=...)", n),
            _floats(hiddens, "add_multi(hiddens=...)", (n, *sh)))


class ReplayBuffer(BufferBase):
    """Experience replay for off-policy agents (DQN's replay memory), velora's API.

    Args:
        capacity: Maximum number of stored experiences.
        state_dim: Dimension of state observations (>= 1).
        action_dim: Dimension of actions (>= 1).
        hidden_dim: Dimension of the hidden states (>= 0).
        device: Where the data and the sampled tensors live (None: the CPU).
        seed: The buffer's own generator (keyword only, not in velora); None: torch's
            global generator, as velora.

    Raises:
        CapacityError, ConfigError: A bad argument (see :class:`BufferBase`).

    Example:
        >>> import torch
        >>> buf = ReplayBuffer(1000, 4, 1, 8, device=torch.device("cpu"))
        >>> for t in range(10):
        ...     buf.add(torch.rand(4), torch.tensor([t % 2]), 1.0, torch.rand(4), t == 9,
        ...             torch.zeros(8))
        >>> len(buf), buf.config().type
        (10, 'ReplayBuffer')
    """

    def config(self) -> BufferConfig:
        """The buffer's type and dimensions.

        Returns:
            A :class:`BufferConfig` (type ``"ReplayBuffer"``).

        Example:
            >>> ReplayBuffer(10, 4, 2, 8).config().action_dim
            2
        """
        return BufferConfig(type="ReplayBuffer", **{k: getattr(self, k) for k in _SIZES})

    def sample(self, batch_size: int) -> BatchExperience:
        """Draw ``batch_size`` experiences uniformly (with replacement), as velora.

        The items are velora's: ``torch.randint(0, size, (batch_size,))`` on torch's
        global generator (on the buffer's device), so ``torch.manual_seed(s)`` right
        before a call reproduces it, and the draw is the one velora makes. A buffer built
        with ``seed=`` draws from its own generator instead.

        Args:
            batch_size: Number of experiences (a positive int).

        Returns:
            A :class:`BatchExperience`; every field ``(batch_size, features)`` on the
            buffer's device.

        Raises:
            ConfigError: ``batch_size`` is not a positive int.
            EmptyBufferError: The buffer holds fewer than ``batch_size`` experiences
                (a ``ValueError``, as velora's).

        Example:
            >>> import torch
            >>> buf = ReplayBuffer(10, 2, 1, 1)
            >>> buf.sample(1)
            Traceback (most recent call last):
            ...
            replaybank.errors.EmptyBufferError: sample(batch_size=1): Buffer does not contain enough experiences. Available: 0, Requested: 1; add more experiences or lower batch_size
            >>> for i in range(5):
            ...     buf.add(torch.full((2,), float(i)), torch.zeros(1), 0.0, torch.ones(2),
            ...             False, torch.zeros(1))
            >>> _ = torch.manual_seed(0)
            >>> first = buf.sample(3).states
            >>> _ = torch.manual_seed(0)
            >>> torch.equal(first, buf.sample(3).states)
            True
        """  # noqa: E501
        return self._uniform(batch_size)

    def warm(self, agent: Any, n_samples: int, num_envs: int = 8) -> None:
        """Fill the buffer to ``n_samples`` experiences from the agent's own env.

        Runs ``num_envs`` copies of ``agent.env`` (``gymnasium.make_vec`` of its spec id,
        synchronous) with ``agent.predict(states, hidden, train_mode=True) -> (actions,
        hidden)`` on tensors on ``agent.device``, and stores each real step of every copy
        with the hidden state ``predict`` returned for it. The step after an episode end,
        which only resets that copy (gymnasium's next-step autoreset), is not stored.
        Truncation is stored apart from termination in :attr:`core`; a batch's
        ``dones`` holds both. The arguments are checked before any env is made, and what
        ``predict`` returns is checked before the envs step with it.

        Args:
            agent: An object with ``env`` (a gymnasium env with a spec id), ``device``
                and ``predict(states, hidden, train_mode=True)``.
            n_samples: Stop once the buffer holds at least this many experiences (an
                int from 0 to ``capacity``).
            num_envs: Number of env copies; an int of at least 2.

        Raises:
            ConfigError: ``num_envs`` not an int >= 2, or ``n_samples`` not an int in
                ``[0, capacity]`` (more could never be reached). Both are ValueErrors,
                as velora's.
            ArgumentError: ``agent`` lacks ``env`` (with a spec id), ``device`` or
                ``predict``; ``predict`` did not return ``(actions, hidden)`` with a
                hidden state; or the env refused its actions.
            DtypeError, ShapeError: ``predict`` returned actions or hidden states that
                are not numbers or not ``num_envs`` rows of the buffer's dimensions.

        Example:
            >>> import gymnasium as gym, torch
            >>> class Agent:
            ...     env, device = gym.make("CartPole-v1"), torch.device("cpu")
            ...     def predict(self, states, hidden, train_mode=False):
            ...         return torch.zeros(len(states), dtype=torch.long), states[:, :2]
            >>> buf = ReplayBuffer(100, 4, 1, 2)
            >>> buf.warm(Agent(), 50, num_envs=2)
            >>> len(buf) >= 50, tuple(buf.sample(4).hiddens.shape)
            (True, (4, 2))
        """
        if is_int(num_envs) and num_envs < 2:  # velora's message word for word, then the fix
            raise ConfigError(
                f"warm: 'num_envs={int(num_envs)}' cannot be smaller than 2. Pass "
                "num_envs=2 or more (the default is 8)"
            )
        check_int("warm", "num_envs", num_envs, 2, kind_error=ConfigError,
                  fix="use num_envs=2 or more (the default is 8)")
        check_int("warm", "n_samples", n_samples, 0, self.capacity, kind_error=ConfigError,
                  fix=f"the buffer holds at most capacity={self.capacity} experiences; "
                  "pass e.g. n_samples=batch_size * 2")
        env_id, device = self._checked_agent(agent)
        gym = require_extra("gymnasium", "gym")
        torch = torch_module()
        envs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
        try:
            hidden = None
            obs, _ = envs.reset()
            resets = np.zeros(num_envs, dtype=bool)  # copies whose next step only resets
            while len(self) < n_samples:
                out = agent.predict(torch.as_tensor(obs, device=device), hidden,
                                    train_mode=True)
                act, acts, hid = self._checked_prediction(out, num_envs)
                hidden = out[1]
                try:
                    nxt, reward, term, trunc, _ = envs.step(act)
                except (AssertionError, ValueError, TypeError, IndexError) as exc:
                    raise ArgumentError(
                        f"warm(agent={describe(agent)}): the env refused the actions predict "
                        f"returned ({describe(act)}: {exc!r}); predict must return one "
                        "action of the env's action space per env copy") from exc
                real = np.flatnonzero(~resets)
                if len(real):
                    self._store_steps(real, obs, acts, reward, nxt, term, trunc, hid)
                resets = np.logical_or(term, trunc)
                obs = nxt
        finally:
            envs.close()

    @staticmethod
    def _checked_agent(agent: Any) -> tuple[str, Any]:
        """``(env spec id, torch device)`` of a velora agent, or an ArgumentError naming
        what it lacks."""
        env = getattr(agent, "env", None)
        env_id = getattr(getattr(env, "spec", None), "id", None)
        if not isinstance(env_id, str):
            raise ArgumentError(
                f"warm(agent={describe(agent)}): agent.env={describe(env)} is not a gymnasium "
                "env with a spec id; pass a velora agent whose env was made with gym.make")
        if not callable(getattr(agent, "predict", None)):
            raise ArgumentError(
                f"warm(agent={describe(agent)}): agent.predict is missing or not callable; "
                "it must be predict(states, hidden, train_mode=True) -> (actions, hidden)")
        if not hasattr(agent, "device"):
            raise ArgumentError(f"warm(agent={describe(agent)}): agent.device is missing; "
                                "set it to the torch device of the agent's networks")
        try:  # torch's parse (None stays None)
            device = checked_device(agent.device, available=False)
        except ConfigError:
            raise ArgumentError(
                f"warm(agent={describe(agent)}): agent.device={describe(agent.device)} is not "
                "a torch device; set it to e.g. torch.device('cpu')") from None
        return env_id, device

    def _checked_prediction(self, out: Any, num_envs: int) -> tuple[Array, Array, Array]:
        """``(actions for the env, action rows (num_envs, action_dim), hidden rows
        (num_envs, hidden_dim))`` of what ``predict`` returned, checked before the envs
        step."""
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ArgumentError(f"warm: agent.predict returned {describe(out)}; it must return "
                                "(actions, hidden) with hidden (num_envs, hidden_dim)")
        actions, hidden = out
        if hidden is None:
            raise ArgumentError("warm: agent.predict returned no hidden state; it must return "
                                "(actions, hidden) with hidden (num_envs, hidden_dim)")
        act = numbers(actions, "warm: predict's actions", "convert the value to a float tensor")
        col = act[:, None] if act.ndim == 1 else act
        if act.ndim == 0 or len(act) != num_envs:
            raise ShapeError(f"warm: predict's actions have shape {act.shape}; expected one "
                             f"action per env copy, ({num_envs},) or ({num_envs}, "
                             f"{self.action_dim})")
        acts = _floats(col, "warm: predict's actions", (num_envs, self.action_dim))
        hid = _floats(hidden, "warm: predict's hidden", (num_envs, self.hidden_dim))
        return act, acts, hid

    def _store_steps(self, rows: Array, obs: Any, action: Array, reward: Any, nxt: Any,
                     term: Any, trunc: Any, hidden: Array) -> None:
        """Append the rows ``rows`` of one vector step, in env order (``action`` and
        ``hidden``: the checked rows of every env copy)."""
        n = len(rows)
        self.buffer.extend(
            obs=_floats(np.asarray(obs)[rows], "warm: states", (n, self.state_dim)),
            action=action[rows],
            reward=np.asarray(reward, dtype=np.float32)[rows],
            next_obs=_floats(np.asarray(nxt)[rows], "warm: next states", (n, self.state_dim)),
            terminated=np.asarray(term, dtype=bool)[rows],
            truncated=np.asarray(trunc, dtype=bool)[rows],
            hidden=hidden[rows])
