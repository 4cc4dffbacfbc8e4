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
as in velora. Where this front end behaves differently from velora, and why:
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
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from replaybank.buffers.replay import ReplayBuffer as CoreBuffer
from replaybank.errors import CheckpointError, ShapeError, describe, require_extra
from replaybank.io.atomic import temp_path

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
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
Array = npt.NDArray[Any]


def _torch() -> Any:
    return require_extra("torch", "torch")


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


def _uses_numpy(device: Any) -> bool:
    """Whether a buffer on ``device`` keeps numpy storage (the CPU) or torch storage."""
    return device is None or _torch().device(device).type == "cpu"


def _host(x: Any) -> Any:
    """A tensor as a host numpy array (a view for CPU tensors); anything else as it is."""
    if hasattr(x, "detach") and hasattr(x, "numpy"):
        return x.detach().cpu().numpy()
    return x


def _floats(x: Any, what: str, shape: tuple[int, ...]) -> Array:
    """``x`` as a float32 array of ``shape``, by torch's assignment rules (what velora's
    ``tensor[i] = x`` accepts): leading size-1 dims dropped, then broadcast.

    Raises:
        ShapeError: ``x`` does not fit ``shape``.
    """
    a = np.asarray(_host(x), dtype=np.float32)
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
    """``x`` (``(n,)`` or ``(n, 1)``, any dtype) as ``n`` bools (nonzero: True)."""
    a = np.asarray(_host(x))
    if a.shape not in ((n,), (n, 1)):
        raise ShapeError(f"{what}: shape {a.shape} but {n} rows; pass ({n},) or ({n}, 1)")
    return (a if a.dtype == np.bool_ else a != 0).reshape(n)


class BufferBase(ABC):
    """The storage of every velora buffer: experiences as individual items.

    Items are ``(state, action, reward, next_state, done, hidden)``; the buffer is a ring
    of ``capacity`` items (the oldest is overwritten first).

    Args:
        capacity: Maximum number of stored experiences.
        state_dim: Dimension of state observations.
        action_dim: Dimension of actions.
        hidden_dim: Dimension of the hidden states.
        device: Where the data and the sampled tensors live (None: the CPU).

    Raises:
        CapacityError: ``capacity`` is not a positive int, or does not fit in memory.
        ConfigError: ``device`` is not a torch device or is not available.

    Example:
        >>> import torch
        >>> buf = ReplayBuffer(10, 3, 1, 2)
        >>> buf.add(torch.zeros(3), torch.ones(1), 0.5, torch.ones(3), True, torch.zeros(2))
        >>> buf.metadata()["size"], buf.dones[0].item(), buf.next_states[0].tolist()
        (1, 1.0, [1.0, 1.0, 1.0])
    """

    def __init__(self, capacity: int, state_dim: int, action_dim: int, hidden_dim: int, *,
                 device: Device | None = None) -> None:
        torch = _torch()
        self.capacity = capacity
        self.state_dim = state_dim
        self.action_dim = action_dim
        self.hidden_dim = hidden_dim
        self.device = device
        self._numpy = _uses_numpy(device)
        spec = {"obs": ((state_dim,), "float32"), "action": ((action_dim,), "float32"),
                "reward": ((), "float32"), "terminated": ((), "bool"),
                "truncated": ((), "bool"), "hidden": ((hidden_dim,), "float32")}
        # velora samples with torch's global generator: torch.manual_seed(s) before
        # building the buffer makes its samples reproducible here too
        seed = int(torch.randint(0, 2**62, ()).item())
        self._core = CoreBuffer(capacity, seed=seed, spec=spec,
                                storage="numpy" if self._numpy else "torch",
                                device=None if self._numpy else device)
        self._tensor_type = torch.Tensor
        self._from_numpy = torch.from_numpy
        self._shapes = ((state_dim,), (action_dim,), (hidden_dim,))
        self._no_trunc: dict[int, Array] = {}  # add_multi's truncated=False, by rows

    @property
    def core(self) -> CoreBuffer:
        """The :class:`replaybank.ReplayBuffer` holding the data (terminated and
        truncated apart, ``sample_sequences``, ``rb.save``, ...)."""
        return self._core

    # ------------------------------------------------------------------ writing
    def add(self, state: Tensor, action: Tensor, reward: float,
            next_state: Tensor, done: bool, hidden: Tensor) -> None:
        """Add one experience (the oldest is overwritten when the buffer is full).

        Values are stored as float32. Tensors on any device, numpy arrays and Python
        numbers are accepted; a value with extra leading size-1 dims, or one that
        broadcasts (e.g. a scalar action), is stored as torch's assignment would.

        Args:
            state: Observation ``(state_dim,)``.
            action: Action taken ``(action_dim,)``.
            reward: Reward received.
            next_state: Observation after the action ``(state_dim,)``.
            done: Whether the episode ended (stored as the core's ``terminated``).
            hidden: Hidden state of the prediction network ``(hidden_dim,)``.

        Raises:
            ShapeError: A value does not fit its field; nothing is stored.

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
            s = _floats(state, "add(state=...)", ss)
            a = _floats(action, "add(action=...)", sa)
            ns = _floats(next_state, "add(next_state=...)", ss)
            h = _floats(hidden, "add(hidden=...)", sh)
        if type(reward) is not float:
            reward = float(reward)
        if type(done) is not bool:
            done = bool(done)
        self._core.add(obs=s, action=a, reward=reward, next_obs=ns, terminated=done,
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
            dones: Episode ends ``(n,)`` or ``(n, 1)`` (nonzero: ended).
            hiddens: Hidden states ``(n, hidden_dim)``.

        Raises:
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
            s = states.numpy() if type(states) is tensor else states
            a = actions.numpy() if type(actions) is tensor else actions
            r = rewards.numpy() if type(rewards) is tensor else rewards
            ns = next_states.numpy() if type(next_states) is tensor else next_states
            d = dones.numpy() if type(dones) is tensor else dones
            h = hiddens.numpy() if type(hiddens) is tensor else hiddens
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
                d = d != 0
        except (AttributeError, TypeError, RuntimeError, ValueError):  # other formats
            s, a, r, ns, d, h = _rows(states, actions, rewards, next_states, dones, hiddens,
                                      self._shapes)
            n = s.shape[0]
        no = self._no_trunc.get(n)
        if no is None:
            no = np.zeros(n, dtype=bool)
            if len(self._no_trunc) < 8:
                self._no_trunc[n] = no
        self._core.extend(obs=s, action=a, reward=r, next_obs=ns, terminated=d,
                          truncated=no, hidden=h)

    # ------------------------------------------------------------------ reading
    @abstractmethod
    def sample(self, batch_size: int) -> BatchExperience:
        """Sample experiences; every field of the batch is ``(batch_size, features)``."""

    def __len__(self) -> int:
        """Number of stored experiences (at most ``capacity``)."""
        return len(self._core)

    @property
    def size(self) -> int:
        """Number of stored experiences (velora's attribute; as ``len(buf)``)."""
        return len(self._core)

    @property
    def position(self) -> int:
        """Index where the next experience is written (wraps at ``capacity``)."""
        return int(self._core.table.written[0]) % self._core.rows

    def _field(self, name: str, width: int) -> Any:
        """Storage of field ``name`` as ``(capacity, width)``: a view, not a copy."""
        a = self._core.table.arrays[name].reshape(self._core.rows, width)
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
        t = self._core.table.arrays
        ended = t["terminated"] | t["truncated"]
        if self._numpy:
            return self._from_numpy(ended.reshape(-1, 1).astype(np.float32))
        return ended.reshape(-1, 1).float()

    @property
    def next_states(self) -> Tensor:
        """All next observations ``(capacity, state_dim)``, exactly as added; zeros where
        nothing is stored yet (a copy: the core stores each observation once)."""
        core = self._core
        n, w = len(core), int(core.table.written[0])
        keys = np.arange(w - n, w, dtype=np.int64)
        rows = keys % core.rows
        if self._numpy:
            out = np.zeros((core.rows, self.state_dim), dtype=np.float32)
            if n:
                out[rows] = core.table.gather_next("obs", keys)
            return self._from_numpy(out)
        torch = _torch()
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
        return {
            "capacity": self.capacity,
            "state_dim": self.state_dim,
            "action_dim": self.action_dim,
            "hidden_dim": self.hidden_dim,
            "position": self.position,
            "size": self.size,
            "device": str(self.device) if self.device else None,
        }

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
        return {"states": self.states, "actions": self.actions, "rewards": self.rewards,
                "next_states": self.next_states, "dones": self.dones,
                "hiddens": self.hiddens}

    # ------------------------------------------------------------------ files
    def save(self, dirpath: str | Path, prefix: str = "buffer_") -> None:
        """Write ``<prefix>metadata.json`` and ``<prefix>state.safetensors`` in ``dirpath``.

        The files are velora's (velora loads them, and :meth:`load` loads velora's); each
        is written to a temporary name and renamed, so a crash never leaves half a file.

        Args:
            dirpath: Folder of the files (created with its parents when missing).
            prefix: Start of both file names.

        Example:
            >>> import tempfile, torch
            >>> d = tempfile.mkdtemp()
            >>> ReplayBuffer(8, 3, 1, 2).save(d, prefix="b_")
            >>> sorted(p.name for p in Path(d).iterdir())
            ['b_metadata.json', 'b_state.safetensors']
        """
        storch = require_extra("safetensors.torch", "torch")
        folder = Path(dirpath)
        folder.mkdir(parents=True, exist_ok=True)
        meta_path = Path(folder, f"{prefix}metadata").with_suffix(".json")
        state_path = Path(folder, f"{prefix}state").with_suffix(".safetensors")
        tensors = {k: v.contiguous() for k, v in self.state_dict().items()}
        with temp_path(state_path) as tmp:
            storch.save_file(tensors, str(tmp))
            os.replace(tmp, state_path)
        with temp_path(meta_path) as tmp:
            tmp.write_text(json.dumps(self.metadata(), indent=2))
            os.replace(tmp, meta_path)

    @classmethod
    def load(cls, state_path: str | Path, metadata: dict[MetaDataKeys, Any]) -> Self:
        """A new buffer holding a saved state (files of :meth:`save`, or of velora).

        Args:
            state_path: The ``.safetensors`` file (its suffix may be left out).
            metadata: The dict of the matching ``<prefix>metadata.json``, already loaded.

        Returns:
            A buffer on ``metadata["device"]`` (the CPU when it is None) whose items,
            ``position`` and ``size`` are those saved.

        Raises:
            CheckpointError: A tensor is missing or its shape does not match the
                metadata, or ``position``/``size`` are impossible; nothing is built.

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
        torch = _torch()
        snp = require_extra("safetensors.numpy", "torch")
        path = Path(state_path).with_suffix(".safetensors")
        device = metadata["device"] or "cpu"
        cap, pos, size = (metadata["capacity"], metadata["position"], metadata["size"])
        data = snp.load_file(str(path))
        widths = {"states": metadata["state_dim"], "actions": metadata["action_dim"],
                  "rewards": 1, "next_states": metadata["state_dim"], "dones": 1,
                  "hiddens": metadata["hidden_dim"]}
        for key, width in widths.items():
            got = data.get(key)
            if got is None or got.shape != (cap, width):
                have = None if got is None else got.shape
                raise CheckpointError(
                    f"load({str(path)!r}): tensor {key!r} has shape {have} but the metadata "
                    f"says ({cap}, {width}); pass the metadata saved with this file")
        if not (0 <= size <= cap and 0 <= pos < cap and (size == cap or pos == size)):
            raise CheckpointError(
                f"load({str(path)!r}): position={pos}, size={size} are impossible for "
                f"capacity={cap}; pass the metadata saved with this file")
        buf = cls(capacity=cap, state_dim=metadata["state_dim"],
                  action_dim=metadata["action_dim"], hidden_dim=metadata["hidden_dim"],
                  device=torch.device(device) if device else None)
        if size == cap:
            # the rows before `position` first, then all in age order: each row lands at
            # its saved index and the next write goes to `position`, as in velora
            order = np.concatenate([np.arange(pos), (np.arange(cap) + pos) % cap])
        else:
            order = np.arange(size)
        if len(order):
            f32 = {k: np.ascontiguousarray(v[order], dtype=np.float32)
                   for k, v in data.items() if k in widths}
            buf._core.extend(obs=f32["states"], action=f32["actions"],
                             reward=f32["rewards"][:, 0], next_obs=f32["next_states"],
                             terminated=f32["dones"][:, 0] != 0,
                             truncated=np.zeros(len(order), dtype=bool),
                             hidden=f32["hiddens"])
        return buf

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(capacity={self.capacity}, state_dim={self.state_dim}, "
                f"action_dim={self.action_dim}, hidden_dim={self.hidden_dim}, "
                f"size={len(self)}, device={self.device!r})")


def _column(x: Any, what: str, n: int) -> Any:
    """``x`` (``(n,)`` or ``(n, 1)``) as ``(n,)``, on the host."""
    a = _host(x)
    if np.shape(a) == (n, 1):
        return np.reshape(a, n)
    if np.shape(a) != (n,):
        raise ShapeError(f"{what}: shape {tuple(np.shape(a))} but {n} rows; pass ({n},) or "
                         f"({n}, 1)")
    return a


def _rows(states: Any, actions: Any, rewards: Any, next_states: Any, dones: Any,
          hiddens: Any, shapes: tuple[tuple[int, ...], ...]) -> tuple[Array, ...]:
    """:meth:`BufferBase.add_multi`'s values of any type, device or dtype, as the stored
    float32 (bool ``dones``) arrays, each with ``n`` rows.

    Raises:
        ShapeError: A value does not fit its field.
    """
    ss, sa, sh = shapes
    s = _host(states)
    n = int(np.shape(s)[0]) if np.ndim(s) else -1
    s = _floats(s, "add_multi(states=...)", (n, *ss))
    a = _host(actions)
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
        state_dim: Dimension of state observations.
        action_dim: Dimension of actions.
        hidden_dim: Dimension of the hidden states.
        device: Where the data and the sampled tensors live (None: the CPU).

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
        return BufferConfig(type="ReplayBuffer", capacity=self.capacity,
                            state_dim=self.state_dim, action_dim=self.action_dim,
                            hidden_dim=self.hidden_dim)

    def sample(self, batch_size: int) -> BatchExperience:
        """Draw ``batch_size`` experiences uniformly (with replacement).

        Args:
            batch_size: Number of experiences.

        Returns:
            A :class:`BatchExperience`; every field ``(batch_size, features)`` on the
            buffer's device.

        Raises:
            ValueError: The buffer holds fewer than ``batch_size`` experiences (also a
                non-positive ``batch_size``).

        Example:
            >>> import torch
            >>> buf = ReplayBuffer(10, 2, 1, 1)
            >>> buf.sample(1)
            Traceback (most recent call last):
            ...
            ValueError: sample(batch_size=1): the buffer holds 0 experiences; add more or lower batch_size
        """  # noqa: E501
        n = len(self._core)
        if n < batch_size:
            raise ValueError(f"sample(batch_size={batch_size}): the buffer holds {n} "
                             "experiences; add more or lower batch_size")
        b = self._core.sample(batch_size).to_dict(nested=False)
        term, trunc = b["terminated"], b["truncated"]
        if self._numpy:
            t = self._from_numpy
            ended = term | trunc
            return BatchExperience(t(b["obs"]), t(b["action"]), t(b["reward"][:, None]),
                                   t(b["next_obs"]), t(ended.astype(np.float32)[:, None]),
                                   t(b["hidden"]))
        return BatchExperience(b["obs"], b["action"], b["reward"][:, None], b["next_obs"],
                               (term | trunc).float()[:, None], b["hidden"])

    def warm(self, agent: Any, n_samples: int, num_envs: int = 8) -> None:
        """Fill the buffer to ``n_samples`` experiences from the agent's own env.

        Runs ``num_envs`` copies of ``agent.env`` (``gymnasium.make_vec`` of its spec id,
        synchronous) with ``agent.predict(states, hidden, train_mode=True) -> (actions,
        hidden)`` on tensors on ``agent.device``, and stores each real step of every copy
        with the hidden state ``predict`` returned for it. The step after an episode end,
        which only resets that copy (gymnasium's next-step autoreset), is not stored.
        Truncation is stored apart from termination in :attr:`core`; a batch's
        ``dones`` holds both.

        Args:
            agent: An object with ``env`` (a gymnasium env with a spec id), ``device``
                and ``predict(states, hidden, train_mode=True)``.
            n_samples: Stop once the buffer holds at least this many experiences.
            num_envs: Number of env copies; at least 2.

        Raises:
            ValueError: ``num_envs < 2``, or ``n_samples > capacity`` (never reached).
            TypeError: ``predict`` returned no hidden state.

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
        if num_envs < 2:
            raise ValueError(f"warm(num_envs={num_envs!r}): cannot be smaller than 2; use "
                             "num_envs=2 or more (the default is 8)")
        if n_samples > self.capacity:
            raise ValueError(f"warm(n_samples={n_samples}): the buffer holds at most "
                             f"capacity={self.capacity} experiences; lower n_samples")
        gym = require_extra("gymnasium", "gym")
        torch = _torch()
        envs = gym.make_vec(agent.env.spec.id, num_envs=num_envs, vectorization_mode="sync")
        try:
            hidden = None
            obs, _ = envs.reset()
            resets = np.zeros(num_envs, dtype=bool)  # copies whose next step only resets
            while len(self) < n_samples:
                actions, hidden = agent.predict(torch.as_tensor(obs, device=agent.device),
                                                hidden, train_mode=True)
                if hidden is None:
                    raise TypeError(
                        f"warm(agent={describe(agent)}): predict returned no hidden state; "
                        "it must return (actions, hidden) with hidden (num_envs, hidden_dim)")
                act = np.asarray(_host(actions))
                nxt, reward, term, trunc, _ = envs.step(act)
                real = np.flatnonzero(~resets)
                if len(real):
                    self._store_steps(real, obs, act, reward, nxt, term, trunc, _host(hidden))
                resets = np.logical_or(term, trunc)
                obs = nxt
        finally:
            envs.close()

    def _store_steps(self, rows: Array, obs: Any, act: Array, reward: Any, nxt: Any,
                     term: Any, trunc: Any, hidden: Any) -> None:
        """Append the rows ``rows`` of one vector step, in env order."""
        n = len(rows)
        a = act[rows]
        if a.ndim == 1:
            a = a[:, None]
        self._core.extend(
            obs=_floats(np.asarray(obs)[rows], "warm: states", (n, self.state_dim)),
            action=_floats(a, "warm: actions", (n, self.action_dim)),
            reward=np.asarray(reward, dtype=np.float32)[rows],
            next_obs=_floats(np.asarray(nxt)[rows], "warm: next states", (n, self.state_dim)),
            terminated=np.asarray(term, dtype=bool)[rows],
            truncated=np.asarray(trunc, dtype=bool)[rows],
            hidden=_floats(np.asarray(hidden)[rows], "warm: hidden", (n, self.hidden_dim)))
