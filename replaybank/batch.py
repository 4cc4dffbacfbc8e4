"""Typed, frozen sample containers.

A :class:`Batch` holds flat fields (``obs``, ``action``, ``obs/desired_goal``, extras)
shaped ``[B, *field_shape]`` plus sampling metadata (``indices``, and where the
sampler or view provides them ``weights``, ``probabilities``, ``discount``).
A :class:`SequenceBatch` holds fields shaped ``[B, L, *field_shape]`` plus masks.

Both are immutable, offer typed attribute access for the standard names (read-only
attributes that mypy and IDEs see), mapping access for every name (``batch["log_prob"]``;
a nested prefix such as ``batch["obs"]`` returns a dict of its sub-fields), ``to_dict()``
and ``to_torch(device)``. A standard field the batch does not hold (``weights`` from a
uniform sampler) raises :class:`AttributeError`, as any other missing attribute does;
extras are also reachable as attributes (untyped).

Value types: both classes are generic in the type of their values, ``Batch[V]``; a bare
``Batch`` is ``Batch[numpy.typing.NDArray[Any]]``, what ``buf.sample`` returns, and
``to_torch`` returns ``Batch[torch.Tensor]`` (``SequenceBatch[torch.Tensor]``), whose
standard fields a type checker sees as tensors. torch is imported for type checkers only
(and at run time by ``to_torch``). Batches sampled from torch storage hold tensors too,
but are typed as the numpy default.

Example:
    >>> import numpy as np
    >>> b = Batch({"obs": np.zeros((2, 3)), "reward": np.ones(2, np.float32),
    ...            "terminated": np.array([True, False]), "truncated": np.array([False, True])})
    >>> b.done.tolist()
    [True, True]
    >>> b["reward"].shape
    (2,)
"""

from __future__ import annotations

import typing
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, NoReturn, cast, overload

import numpy as np
from numpy.typing import NDArray

from replaybank.errors import ConfigError, closest, require_extra
from replaybank.host import as_numpy, is_tensor
from replaybank.spec import FIELD_ALIASES, SEP, unflatten
from replaybank.transfer import to_device

if TYPE_CHECKING:  # torch stays optional: only type checkers import it here
    import torch
    from typing_extensions import TypeVar

    #: The type of a batch's values: numpy arrays unless it says otherwise.
    V = TypeVar("V", default=NDArray[Any])
else:  # a TypeVar default is for type checkers (typing.TypeVar takes it from Python 3.13)
    V = typing.TypeVar("V")

__all__ = ["Batch", "SequenceBatch", "storage_device", "torch_device"]

_F = typing.TypeVar("_F", bound="_FrozenArrays[Any]")


#: Devices :func:`torch_device` accepted, by the argument given (``torch.cuda.is_available``
#: costs microseconds per call on a GPU machine, and every ``to_torch`` asks).
_CHECKED_DEVICES: dict[Any, Any] = {}


def torch_device(torch: Any, device: Any, call: str | None = None) -> Any:
    """``device`` as a ``torch.device``, checked to exist on this machine.

    Args:
        torch: The torch module.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, a ``torch.device`` or None
            (the CPU).
        call: The call to name in an error (``"to_torch"`` gives
            ``to_torch(device='gpu'): ...``); None names the argument only.

    Returns:
        The ``torch.device`` (a bare ``"cuda"`` keeps no index).

    Raises:
        ConfigError: ``device`` is not a torch device (``"gpu"`` is not one: torch calls
            it ``"cuda"``), or names a CUDA/MPS device this machine does not have.

    Example:
        >>> import torch
        >>> torch_device(torch, "gpu", "to_torch")
        Traceback (most recent call last):
        ...
        replaybank.errors.ConfigError: to_torch(device='gpu'): not a torch device; torch calls the GPU 'cuda': use 'cuda', 'cuda:0', 'cpu' or a torch.device
    """  # noqa: E501
    try:  # a device checked before (CUDA does not come and go within a process)
        known = _CHECKED_DEVICES.get(device)
    except TypeError:  # unhashable: checked below, and refused there
        known = None
    if known is not None:
        return known
    arg = f"device={device!r}" if call is None else f"{call}(device={device!r})"
    try:
        dev = torch.device("cpu" if device is None else device)
    except (RuntimeError, TypeError, ValueError) as exc:
        hint = "torch calls the GPU 'cuda': " if str(device).lower().startswith("gpu") else ""
        raise ConfigError(f"{arg}: not a torch device; {hint}use 'cuda', 'cuda:0', 'cpu' "
                          "or a torch.device") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{arg}: CUDA is not available on this machine; use "
                              "device='cpu' (or None) or install a CUDA build of torch")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"{arg}: only {torch.cuda.device_count()} CUDA device(s); "
                              "pick an index below that")
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ConfigError(f"{arg}: MPS (Apple GPU) is not available on this machine; "
                              "use device='cpu' (or None)")
    if len(_CHECKED_DEVICES) < 64:
        _CHECKED_DEVICES[device] = dev
    return dev


#: torch device types whose tensors hold shapes and dtypes but no values: a buffer stored
#: there could never return what was added (its sample raises torch's bare
#: NotImplementedError, or serves tensors without data).
_DATALESS_DEVICES = frozenset({"meta"})


def storage_device(torch: Any, device: Any, call: str | None = None) -> Any:
    """``device`` as a ``torch.device`` that a buffer's storage can live on: one
    :func:`torch_device` accepts and that holds data (not ``"meta"``).

    Args:
        torch: The torch module.
        device: As in :func:`torch_device`.
        call: The call to name in an error (``"load"`` gives ``load(device='meta'): ...``);
            None names the argument only.

    Returns:
        The ``torch.device``.

    Raises:
        ConfigError: As :func:`torch_device`, or ``device`` holds no data (``"meta"``).

    Example:
        >>> import torch
        >>> storage_device(torch, "meta")
        Traceback (most recent call last):
        ...
        replaybank.errors.ConfigError: device='meta': a 'meta' tensor holds shapes, not values, so a buffer stored there could not return what it stores; use device='cpu', 'cuda' or another device that holds data
    """  # noqa: E501
    dev = torch_device(torch, device, call)
    if dev.type in _DATALESS_DEVICES:
        arg = f"device={device!r}" if call is None else f"{call}(device={device!r})"
        raise ConfigError(
            f"{arg}: a {dev.type!r} tensor holds shapes, not values, so a buffer stored there "
            "could not return what it stores; use device='cpu', 'cuda' or another device "
            "that holds data"
        )
    return dev


def _tensor(value: Any, torch: Any, device: Any, non_blocking: bool, pin: bool) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=non_blocking) if device is not None else value
    arr = np.asarray(value)
    if not arr.flags.writeable or not arr.flags.c_contiguous or arr.dtype.byteorder == ">":
        arr = np.ascontiguousarray(arr).copy()
    t = torch.from_numpy(arr)  # zero-copy on CPU
    if pin and torch.cuda.is_available():
        t = t.pin_memory()
    if device is not None:
        t = t.to(device, non_blocking=non_blocking)
    return t


class StandardField:
    """A typed, read-only standard field of a batch (``batch.obs``): one dict lookup.

    A field the batch does not hold raises a bare ``AttributeError``, so Python falls back
    to the batch's ``__getattr__`` (nested ``obs/...`` prefixes, extras, the usual "has no
    field" error). A type checker sees the batch's value type: ``NDArray`` for
    ``Batch``, ``torch.Tensor`` for what ``to_torch()`` returns.
    """

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> StandardField: ...

    @overload
    def __get__(self, obj: _FrozenArrays[V], owner: type | None = None) -> V: ...

    def __get__(self, obj: _FrozenArrays[V] | None, owner: type | None = None) -> V:
        if obj is None:
            return cast(V, self)  # class access: the descriptor (the first overload)
        try:
            v: V = obj._data[self.name]
        except KeyError:
            raise AttributeError(self.name) from None  # __getattr__ takes over
        return v

    def __set__(self, obj: Any, value: NoReturn) -> None:
        # batches are frozen; ``NoReturn`` makes a type checker flag every assignment
        raise AttributeError(f"{type(obj).__name__} is frozen; build a new one instead")


class _FrozenArrays(Mapping[str, Any], Generic[V]):
    """Shared machinery: an immutable mapping of flat field names to arrays (of type
    ``V``: numpy arrays, or torch tensors)."""

    __slots__ = ("_data",)
    _data: dict[str, Any]

    def __init__(self, data: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_data", dict(data))

    @classmethod
    def own(cls: type[_F], data: dict[str, Any]) -> _F:
        """Wrap ``data`` without copying the dict (the caller hands it over and never
        changes it again); ``cls(data)`` copies.

        Example:
            >>> Batch.own({"reward": np.zeros(2, np.float32)}).batch_size
            2
        """
        obj = object.__new__(cls)
        object.__setattr__(obj, "_data", data)
        return obj

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen; build a new one instead")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __getitem__(self, key: str) -> Any:
        if key in self._data:
            return self._data[key]
        prefix = key + SEP
        sub = {k[len(prefix):]: v for k, v in self._data.items() if k.startswith(prefix)}
        if sub:
            return unflatten(sub)
        raise KeyError(f"{key!r}: not in this batch{self._meant(key)}; available: "
                       f"{sorted(self._data)}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        return key in self._data or any(k.startswith(key + SEP) for k in self._data)

    def __getattr__(self, name: str) -> Any:
        # only called when normal lookup fails: expose fields as attributes
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__} has no field {name!r}{self._meant(name)}; "
                f"available: {sorted(self._data)}"
            ) from None

    def _meant(self, name: str) -> str:
        """What a missing field ``name`` probably meant (another library's name for a
        field, a close name, or torch's ``to``), as `` (did you mean ...)``; or ``""``."""
        if name == "to":
            return " (a batch moves to a device with to_torch(device=...))"
        if name == "discount":  # (n_step=1 builds the one-step view, which has none)
            return (" (one-step transitions carry none: bootstrap with gamma, or build the "
                    "buffer with view=rb.NStepView(n=1, gamma=...) for a discount of gamma)")
        guess = FIELD_ALIASES.get(name, "done" if name == "dones" else None)
        if guess is None:
            guess = closest(name, self._data)
        if guess is None or guess == name or not (guess in self or hasattr(type(self), guess)):
            return ""
        return f" (did you mean {guess}?)"

    def __repr__(self) -> str:
        parts = []
        for k, v in self._data.items():
            shape = tuple(getattr(v, "shape", ()))
            parts.append(f"{k}: {getattr(v, 'dtype', type(v).__name__)}{list(shape)}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _FrozenArrays)
        if set(self._data) != set(other._data):
            return False
        return all(np.array_equal(np.asarray(self._data[k]), np.asarray(other._data[k]))
                   for k in self._data)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._data,))

    def to_dict(self, nested: bool = True) -> dict[str, Any]:
        """Return the fields as a dict (nested by ``/`` unless ``nested=False``)."""
        return unflatten(self._data) if nested else dict(self._data)

    @property
    def batch_size(self) -> int:
        """Leading dimension B."""
        first = next(iter(self._data.values()))
        return int(first.shape[0])

    def _torch_values(self, device: Any, non_blocking: bool, pin_memory: bool
                      ) -> dict[str, Any]:
        """The fields as torch tensors (what ``to_torch`` wraps)."""
        torch = require_extra("torch", "torch")
        if device is not None:
            device = torch_device(torch, device, "to_torch")
            if device.type != "cpu" and len(self._data) > 1:
                # one copy for every field: a copy call per field costs more than the bytes
                moved = to_device(torch, self._data, device, non_blocking, pin_memory)
                if moved is not None:
                    return moved
        return {k: _tensor(v, torch, device, non_blocking, pin_memory)
                for k, v in self._data.items()}

    def _numpy_values(self) -> dict[str, Any]:
        """The fields as numpy arrays (what ``numpy`` wraps)."""
        return {k: as_numpy(v) for k, v in self._data.items()}

    def tensors_together(self: _F) -> _F:
        """The same batch with its numpy arrays as tensors on the device of its tensors.

        A batch of torch storage gathers its fields as tensors, while what a sampler or a
        view computes on the host (``indices``, ``weights``, ``probabilities``, a
        sequence batch's ``starts``) is numpy; a training step multiplies them together
        (``(batch.weights * td ** 2).mean()``), so they are handed out as tensors too (one
        packed copy to a GPU). A batch without tensors comes back as it is.

        Example:
            >>> import torch
            >>> b = Batch({"reward": torch.zeros(2), "weights": np.ones(2, np.float32)})
            >>> type(b.tensors_together().weights).__name__
            'Tensor'
        """
        like = next((v for v in self._data.values() if is_tensor(v)), None)
        host = {k: v for k, v in self._data.items() if isinstance(v, np.ndarray)}
        if like is None or not host:
            return self
        moved = type(self).own(host)._torch_values(like.device, True, False)
        return type(self).own({k: moved[k] if k in host else v for k, v in self._data.items()})


class Batch(_FrozenArrays[V]):
    """A batch of transitions, every field shaped ``[B, *field_shape]``.

    Standard attributes: ``obs``, ``next_obs``, ``action``, ``reward``, ``terminated``,
    ``truncated``, ``done`` (``terminated | truncated``), ``indices`` (item keys
    ``seq * num_envs + lane``, see :mod:`replaybank.ops.ring`; equal to the storage slot
    until the ring wraps, and detectably stale once the step is overwritten). Samplers
    and views add ``weights`` and ``probabilities`` (prioritized), ``discount``
    (n-step: ``gamma ** L``). Each is a typed read-only property (shape and meaning in
    its docstring) that raises :class:`AttributeError` when the batch lacks it. Extras
    are reachable by name (``batch["log_prob"]``, or untyped ``batch.log_prob``).

    Example:
        >>> b = Batch({"reward": np.zeros(4, np.float32)})
        >>> b.batch_size
        4
        >>> b.reward = 1
        Traceback (most recent call last):
        ...
        AttributeError: Batch is frozen; build a new one instead
    """

    __slots__ = ()

    # Standard fields: one dict lookup on a hit (faster than the __getattr__ path). On a
    # miss the bare AttributeError makes Python call __getattr__, which serves a nested
    # prefix (``obs/...``) or raises the usual "has no field" AttributeError.
    obs = StandardField(
        """Observations ``[B, *obs_shape]``; for dict observations (stored as
        ``obs/<key>``) a nested dict of such arrays.""")
    action = StandardField(
        """Actions ``[B, *action_shape]``.""")
    reward = StandardField(
        """Rewards ``[B]`` (the n-step return ``G`` with an n-step view).""")
    next_obs = StandardField(
        """Next observations ``[B, *obs_shape]`` (the true final observation where an
        episode ended; ``n`` steps ahead with an n-step view); nested dict as ``obs``.""")
    terminated = StandardField(
        """``[B]`` bool: the episode terminated at this step (no bootstrapping).""")
    truncated = StandardField(
        """``[B]`` bool: the episode was cut off at this step (still bootstraps).""")
    indices = StandardField(
        """Item keys ``[B]`` int64 (``seq * num_envs + lane``) for
        ``update_priorities``.""")
    weights = StandardField(
        """Importance-sampling weights ``[B]`` float32 (prioritized samplers only).""")
    probabilities = StandardField(
        """Sampling probability of each item ``[B]`` float64 (prioritized samplers
        only).""")
    discount = StandardField(
        """Bootstrap discount ``gamma ** L`` ``[B]`` (n-step views only).""")

    @property
    def done(self) -> V:
        """``terminated | truncated``, shaped ``[B]`` bool (a stored ``done`` if present).

        Raises:
            KeyError: The batch holds neither ``done`` nor ``terminated`` and ``truncated``.
        """
        if "done" in self._data:
            v: V = self._data["done"]
            return v
        d: V = self._data["terminated"] | self._data["truncated"]
        return d

    def to_torch(self, device: Any = None, non_blocking: bool = True,
                 pin_memory: bool = False) -> Batch[torch.Tensor]:
        """Return the same container with every array as a torch tensor.

        Args:
            device: Target device (``None`` keeps CPU, zero-copy for numpy storage). To
                another device, numpy fields travel packed in one buffer with one copy
                (:mod:`replaybank.transfer`) and arrive as views of one allocation.
            non_blocking: Pass ``non_blocking`` to ``Tensor.to``.
            pin_memory: Gather into pinned host memory first (fast host-to-GPU copies;
                only when CUDA is available).

        Returns:
            A new container of the same type holding tensors, typed ``Batch[torch.Tensor]``.

        Raises:
            MissingDependencyError: torch is not installed.
            ConfigError: ``device`` is not a torch device (``"gpu"``: torch calls it
                ``"cuda"``) or is not available here (``"cuda"`` without CUDA).
        """
        out = type(self).own(self._torch_values(device, non_blocking, pin_memory))
        return cast("Batch[torch.Tensor]", out)

    def numpy(self) -> Batch[NDArray[Any]]:
        """Return the same container with every value as a numpy array."""
        return cast("Batch[NDArray[Any]]", type(self).own(self._numpy_values()))


class SequenceBatch(_FrozenArrays[V]):
    """A batch of sequences, every field shaped ``[B, L, *field_shape]``.

    Besides the stored fields it carries ``mask`` (valid, loss-counted steps),
    ``is_first`` (an episode starts here), ``is_last`` (last valid step of its episode
    within the window), ``is_terminal`` (the episode terminated at this step), ``burn_in``
    (the step is a burn-in step), all ``[B, L]`` bool, and ``starts`` (item key
    ``seq * lanes + lane`` of each window's first step, ``[B]``, as
    ``update_sequence_priorities`` expects), and from prioritized samplers ``weights``
    and ``probabilities`` ``[B]``. Each standard field is a typed read-only property
    that raises :class:`AttributeError` when the batch lacks it; extras and
    ``initial/<field>`` are reachable by name.

    Example:
        >>> sb = SequenceBatch({"obs": np.zeros((2, 5, 3)), "mask": np.ones((2, 5), bool)})
        >>> sb.sequence_length
        5
    """

    __slots__ = ()

    @property
    def sequence_length(self) -> int:
        """Second dimension L (including burn-in steps)."""
        first = next(iter(self._data.values()))
        return int(first.shape[1])


    obs = StandardField(
        """Observations ``[B, L, *obs_shape]`` (zero where padded); nested dict for dict
        observations.""")
    action = StandardField(
        """Actions ``[B, L, *action_shape]`` (zero where padded).""")
    reward = StandardField(
        """Rewards ``[B, L]`` (zero where padded).""")
    next_obs = StandardField(
        """Next observations ``[B, L, *obs_shape]`` (the true final observation where an
        episode ended; zero where padded); nested dict for dict observations.""")
    terminated = StandardField(
        """``[B, L]`` bool: the episode terminated at this step.""")
    truncated = StandardField(
        """``[B, L]`` bool: the episode was cut off at this step.""")
    mask = StandardField(
        """``[B, L]`` bool: valid steps that count in the loss (not padding, not burn-in).""")
    is_first = StandardField(
        """``[B, L]`` bool: an episode starts here (or the previous step is gone).""")
    is_last = StandardField(
        """``[B, L]`` bool: the episode ended here (terminated, truncated or a
        discontinuity in the data).""")
    is_terminal = StandardField(
        """``[B, L]`` bool: the episode terminated here.""")
    burn_in = StandardField(
        """``[B, L]`` bool: a burn-in step (excluded from ``mask``).""")
    starts = StandardField(
        """Item keys ``[B]`` int64 of each window's first step (``seq * lanes + lane``),
        for ``update_sequence_priorities``.""")
    indices = StandardField(
        """Item keys ``[B, L]`` int64 of every step, ``-1`` where padded (rollout
        ``recurrent_generator`` batches only).""")
    weights = StandardField(
        """Importance-sampling weights ``[B]`` float32 (prioritized samplers only).""")
    probabilities = StandardField(
        """Sampling probability of each window start ``[B]`` float64 (prioritized
        samplers only).""")

    @property
    def done(self) -> V:
        """``terminated | truncated``, shaped ``[B, L]`` bool.

        Raises:
            KeyError: The batch lacks ``terminated`` or ``truncated``.
        """
        d: V = self._data["terminated"] | self._data["truncated"]
        return d

    def to_torch(self, device: Any = None, non_blocking: bool = True,
                 pin_memory: bool = False) -> SequenceBatch[torch.Tensor]:
        """Return the same container with every array as a torch tensor.

        Args:
            device: Target device (``None`` keeps CPU, zero-copy for numpy storage). To
                another device, numpy fields travel packed in one buffer with one copy
                (:mod:`replaybank.transfer`) and arrive as views of one allocation.
            non_blocking: Pass ``non_blocking`` to ``Tensor.to``.
            pin_memory: Gather into pinned host memory first (fast host-to-GPU copies;
                only when CUDA is available).

        Returns:
            A new container of the same type holding tensors, typed ``SequenceBatch[torch.Tensor]``.

        Raises:
            MissingDependencyError: torch is not installed.
            ConfigError: ``device`` is not a torch device (``"gpu"``: torch calls it
                ``"cuda"``) or is not available here (``"cuda"`` without CUDA).
        """
        out = type(self).own(self._torch_values(device, non_blocking, pin_memory))
        return cast("SequenceBatch[torch.Tensor]", out)

    def numpy(self) -> SequenceBatch[NDArray[Any]]:
        """Return the same container with every value as a numpy array."""
        return cast("SequenceBatch[NDArray[Any]]", type(self).own(self._numpy_values()))


if not TYPE_CHECKING:
    # Run-time introspection (``typing.get_type_hints`` of a field or of ``done``) reads a
    # bare batch's value type, the default of ``V``: numpy arrays. The classes above were
    # made generic over the TypeVar itself, so subscripting (``Batch[torch.Tensor]``) and
    # type checkers are unaffected.
    V = NDArray[Any]
