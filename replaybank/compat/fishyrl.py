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
lanes (:class:`~replaybank.samplers.lane_split.LaneSplitSampler`) and returned buffer by
buffer. A rejected call (a non-dict experience, hostile sizes, a state dict that does
not fit) raises a :class:`~replaybank.errors.ReplayBankError` and changes nothing.

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
import re
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

from replaybank.buffers.arguments import make_rng
from replaybank.buffers.replay import ReplayBuffer
from replaybank.compat.base import Core, FrontEnd, restored_on_error
from replaybank.compat.checks import (
    check_bool,
    check_int,
    check_type,
    is_int,
    saved_generator,
)
from replaybank.compat.devices import torch_module
from replaybank.compat.sequence import SequenceReplayBuffer
from replaybank.errors import (
    ArgumentError,
    CheckpointError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    ShapeError,
    SpecError,
    describe,
)
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
    """A buffer's capacity: a positive int (a ConfigError for anything else)."""
    return check_int(where, "capacity", capacity, kind_error=ConfigError, example="100_000")


def _experience(experience: Any, where: str = "add") -> Mapping[str, Any]:
    """``experience`` checked to be a dict with str keys (fishyrl's ``dict[str,
    np.ndarray]``).

    Raises:
        ArgumentError: Not a dict, or a key that is not a str.
    """
    out: Mapping[str, Any] = check_type(where, "experience", experience, Mapping,
                                        "a dict (of numpy arrays, e.g. {'obs': obs, "
                                        "'action': action})")
    bad = [k for k in out if not isinstance(k, str)]
    if bad:
        raise ArgumentError(f"{where}(experience): keys {bad!r} are not strs; name every "
                            "entry of an experience with a str")
    return out


class _Rows:
    """The key bookkeeping and core calls that both fishyrl buffers share: a
    :class:`~replaybank.compat.sequence.SequenceReplayBuffer` (windows running over
    episode ends) over one rows :class:`~replaybank.buffers.replay.ReplayBuffer` of
    ``lanes`` lanes."""

    buffer: ReplayBuffer
    sequences: SequenceReplayBuffer
    _keys: frozenset[str] | None
    _capacity: int
    _validate_keys: bool
    _rng: np.random.Generator
    _lanes: int
    #: A group of buffers (IndependentVectorizedBuffer): messages speak of each buffer.
    _group = False
    _zeros: dict[str, Any]

    def _setup(self, capacity: Any, validate_keys: Any, seed: Any, lanes: int) -> None:
        """Check a SequentialBuffer's ``capacity`` and ``validate_keys`` (then ``seed``)
        and build the core with ``lanes`` lanes."""
        self._capacity = _capacity(capacity, "SequentialBuffer")
        self._validate_keys = check_bool("SequentialBuffer", "validate_keys", validate_keys)
        self._rng = make_rng(seed)
        self._fresh(self._capacity, lanes, self._rng)

    def _fresh(self, capacity: int, lanes: int, rng: np.random.Generator) -> None:
        self._lanes = lanes
        self.sequences = SequenceReplayBuffer(capacity * lanes, num_envs=lanes, seed=rng,
                                              episode_boundary="cross", next_obs=False,
                                              lane_split="random" if lanes > 1 else None)
        self.buffer = self.sequences.buffer
        # one lane: values carry no lane dim; several: [lanes, ...] (env_ids spells
        # out a lane dim of 1 for a group of one buffer)
        self._env_ids = [0] if self._group and lanes == 1 \
            else None
        self._keys = None
        self._zeros = {}

    def _checked(self, experience: Any) -> Any:
        """``experience`` as the core stores it (key set checked, or completed with zeros
        when keys are not validated)."""
        if not isinstance(experience, Mapping):
            _experience(experience)  # raises
        keys = self._keys
        if keys is not None and experience.keys() == keys:  # str keys, checked before
            return experience
        _experience(experience)
        if keys is None:
            if not experience:
                raise SpecError("add(experience={}): an experience needs one or more keys, "
                                "e.g. {'obs': obs, 'action': action}")
            return experience
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
        checked = self._checked(experience)
        try:
            self.buffer.add(env_ids=self._env_ids, **{PREFIX: checked})
        except (ShapeError, DtypeError, SpecError) as exc:  # the core wrote nothing
            vec = self._group
            raise type(exc)(_in_our_words(str(exc), vec)) from None
        if self._keys is None:  # the first add set the keys (a rejected one did not)
            self._keys = frozenset(experience)

    def _sample(self, batch_size: int, sequence_length: Any) -> dict[str, np.ndarray]:
        cap = self._capacity
        length = check_int("sample", "sequence_length", sequence_length, 1, cap,
                           fix=f"a sequence holds consecutive experiences of one buffer, "
                           f"which stores at most capacity={cap}: pass e.g. "
                           f"sequence_length={min(cap, 16)}, or build the buffer with a "
                           "larger capacity")
        try:
            sb = self.sequences.sample(batch_size, length)
        except EmptyBufferError:
            held = len(self.buffer) // self._lanes
            where = ("each buffer holds" if self._group
                     else "the buffer holds")
            raise EmptyBufferError(
                f"sample(batch_size={batch_size}, sequence_length={length}): {where} {held} "
                f"experiences, fewer than one sequence of {length}; add more experiences "
                "or pass a shorter sequence_length") from None
        n = len(_PRE)
        out = {k[n:]: sb[k] for k in sb if k.startswith(_PRE)}
        if self._lanes > 1:  # fishyrl's order: buffer 0's sequences, then buffer 1's, ...
            lane = np.asarray(sb["starts"]) % self._lanes  # [B]
            if (np.diff(lane) < 0).any():
                order = np.argsort(lane, kind="stable")  # draw order within a buffer
                out = {k: v[order] for k, v in out.items()}
        return out

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
        damaged = "the state is damaged; restore it from a checkpoint"
        if keys is not None and (not isinstance(keys, (list, tuple))
                                 or not all(isinstance(k, str) for k in keys)):
            raise CheckpointError(f"load_state_dict: keys={describe(keys)} is not a list of "
                                  f"str keys or None; {damaged}")
        validate = state_dict.get("validate_keys", self._validate_keys)
        if not isinstance(validate, (bool, np.bool_)):
            raise CheckpointError(f"load_state_dict: validate_keys={describe(validate)} is "
                                  f"not a bool; {damaged}")
        core_state: Any = state_dict["buffer"]
        if not isinstance(core_state, dict):
            raise CheckpointError(f"load_state_dict: buffer={describe(core_state)} is not a "
                                  f"core state dict; {damaged}")
        self._check_layout(core_state.get("metadata"), capacity)
        with restored_on_error(self, "__dict__"):
            self._fresh(capacity, self._lanes, rng)  # the saved keys replace the current ones
            self.buffer.load_state_dict(core_state)
            stored = self.buffer.spec
            names = [] if stored is None else [f[len(_PRE):] for f in stored
                                               if f.startswith(_PRE)]
            if not _same_keys([] if keys is None else list(keys), names):
                raise CheckpointError(f"load_state_dict: keys={describe(keys)} do not match "
                                      f"the stored fields {sorted(names)}; {damaged}")
        self._keys = None if keys is None else frozenset(keys)
        self._validate_keys = bool(validate)

    def _check_layout(self, meta: Any, capacity: int) -> None:
        """A saved state holds as many buffers of ``capacity`` experiences as this
        buffer (group) has, told in fishyrl's terms (the core would compare its total
        capacities).

        Raises:
            CheckpointError: Naming both layouts and the buffer to build to load it.
        """
        if not isinstance(meta, Mapping):
            return  # the core names what is missing
        saved_lanes: Any = meta.get("num_envs")
        saved_total: Any = meta.get("capacity")
        if not (is_int(saved_lanes) and is_int(saved_total)):
            return  # the core names what is damaged
        lanes, total = int(saved_lanes), int(saved_total)
        if lanes < 1 or total % lanes:
            return
        each = total // lanes
        if (lanes, each) == (self._lanes, capacity):
            return
        vec = self._group
        if vec:
            have = f"this group has num_buffers={self._lanes} of capacity={capacity}"
        else:
            have = f"this SequentialBuffer has capacity={capacity}"
        if lanes == 1 and not vec:
            build = f"SequentialBuffer({each})"
        else:
            build = f"IndependentVectorizedBuffer({lanes}, {each})"
        raise CheckpointError(
            f"load_state_dict: the state holds {lanes} buffer{'s' if lanes > 1 else ''} of "
            f"capacity={each} but {have}; load it into {build}")


#: A stored field in a core message: ``field 'fishyrl/key'`` or ``fishyrl/key``
#: (``key/entry`` for an entry of a dict value).
_FIELD = re.compile(r"(field )?'?" + re.escape(_PRE) + r"([^\s=:,;)']+)'?")
_FIRST = "its shape in the first add"
#: The core's advice about its own declarations, in this front end's terms.
_ADVICE = tuple((re.compile(pattern), words) for pattern, words in (
    (r"\(leading dims \(\) \+ field shape \([^)]*\)\)", f"({_FIRST})"),
    (r"\(leading dims \((\d+),\) \+ field shape (\([^)]*\))\)",
     rf"(num_buffers=\1, then {_FIRST} \2)"),
    (r"reshape the value or check num_envs / (the number of steps|env_ids)",
     "reshape it: a key keeps the shape of its first add (reset() starts over)"),
    (r"or declare the field as float",
     "or add floats from the first add on (a key keeps the dtype of its first add; "
     "reset() starts over)"),
    (r"or declare (a wider dtype|the field's dtype)",
     "or add a dtype that holds it from the first add on (a key keeps the dtype of its "
     "first add; reset() starts over)"),
    (r"pass a bool \(e\.g\. terminated=bool\(x\)\)", "pass True/False or 0/1"),
))


def _in_our_words(message: str, vec: bool) -> str:
    """A core error of ``add`` in this front end's terms: a field ``fishyrl/<key>`` is
    the entry ``experience['<key>']`` it came from, and advice about the core's field
    declarations, envs and lanes says what a fishyrl user does (a key keeps the shape
    and dtype of its first add; ``reset()`` starts over).

    Example:
        >>> _in_our_words("field 'fishyrl/r' is int64; round it, or declare the field "
        ...               "as float", vec=False)
        "add: experience['r'] is int64; round it, or add floats from the first add on (a key keeps the dtype of its first add; reset() starts over)"
    """  # noqa: E501
    message = _FIELD.sub(lambda m: "experience" + "".join(
        f"[{part!r}]" for part in m.group(2).split(SEP)), message)
    for pattern, words in _ADVICE:
        message = pattern.sub(words, message)
    shape = f"([num_buffers, ...], then {_FIRST})" if vec else f"({_FIRST})"
    message = message.replace("(leading dims + field shape)", shape)
    return message if message.startswith("add") else f"add: {message}"


def _same_keys(keys: list[str], names: list[str]) -> bool:
    """Whether the experience ``keys`` are exactly those of the stored field ``names``
    (a dict value is stored as ``key/entry`` fields)."""
    def under(name: str, key: str) -> bool:
        return name == key or name.startswith(key + SEP)

    return all(any(under(n, k) for n in names) for k in keys) and \
        all(any(under(n, k) for k in keys) for n in names)


class SequentialBuffer(_Rows, FrontEnd, Buffer):
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
        ArgumentError: validate_keys is not a bool.

    Example:
        >>> import numpy as np
        >>> buf = SequentialBuffer(3, seed=0)
        >>> for t in range(5):
        ...     buf.add({"x": np.array(t)})
        >>> buf.size, buf.is_full, buf.sample(2, 3)["x"].tolist()
        (3, True, [[2, 3, 4], [2, 3, 4]])
    """

    _repr_fields = ("capacity", "validate_keys=_validate_keys", "size")

    def __init__(self, capacity: int, validate_keys: bool = True, seed: int | None = None
                 ) -> None:
        self._setup(capacity, validate_keys, seed, 1)

    @property
    def capacity(self) -> int:
        """The maximum number of experiences the buffer can store."""
        return self._capacity

    @property
    def is_full(self) -> bool:
        """Whether the buffer is full (holds ``capacity`` experiences)."""
        return len(self.buffer) >= self._capacity

    size: Core[int] = Core("The current number of experiences stored in the buffer.", "len")

    def reset(self) -> None:
        """Reset/initialize the buffer: nothing stored, no keys (the generator goes on)."""
        self._fresh(self._capacity, 1, self._rng)

    def add(self, experience: dict[str, np.ndarray]) -> None:
        """Add an experience to the buffer.

        Args:
            experience: ``{key: array}``, one experience; the keys of the first add are
                the buffer's (``validate_keys``).

        Raises:
            ArgumentError: ``experience`` is not a dict with str keys.
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
            ConfigError: batch_size or sequence_length not a positive int (an
                :class:`~replaybank.errors.ArgumentError` for one that is no int), or
                ``sequence_length > capacity``.
            EmptyBufferError: Fewer than ``sequence_length`` experiences are stored.
        """
        return self._sample(check_int("sample", "batch_size", batch_size, example=16),
                            sequence_length)

    def state_dict(self) -> dict[str, Any]:
        """Return the state of the buffer: ``{"buffer": core state dict, "validate_keys",
        "keys", "capacity"}``, a snapshot (its arrays are copies: adds after the call do
        not change it, and it loads the buffer as it was; it costs a copy of the stored
        experiences)."""
        return {**self._state(), "capacity": self._capacity}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a :meth:`state_dict`: its capacity, keys, data and generator state.

        Raises:
            CheckpointError: Not a state dict of this front end, or damaged (its keys do
                not match its data, ...); the buffer is then unchanged.
        """
        capacity = self._capacity
        if isinstance(state_dict, Mapping) and "capacity" in state_dict:
            capacity = _capacity(state_dict["capacity"], "load_state_dict")
        self._load(state_dict, capacity, self._rng)
        self._capacity = capacity


class IndependentVectorizedBuffer(_Rows, FrontEnd, Buffer):
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
            does not take, or a ``buffer_class`` that is not a :class:`Buffer` class
            (:class:`~replaybank.errors.ArgumentError`, a TypeError too).

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

    _group = True

    _repr_fields = ("num_buffers", "size")

    def __init__(self, num_buffers: int, *buffer_args: Any,
                 buffer_class: type[Buffer] = SequentialBuffer, seed: int | None = None,
                 **buffer_kwargs: Any) -> None:
        check_int("IndependentVectorizedBuffer", "num_buffers", num_buffers,
                  kind_error=ConfigError, fix="pass one buffer per env, e.g. num_buffers=4")
        if not (isinstance(buffer_class, type) and issubclass(buffer_class, Buffer)):
            raise ArgumentError(f"IndependentVectorizedBuffer(buffer_class="
                                f"{describe(buffer_class)}): expected a Buffer class, e.g. "
                                "SequentialBuffer")
        self.num_buffers = int(num_buffers)
        self._rng = make_rng(seed)
        self._buffers: list[Buffer] | None = None
        if buffer_class is SequentialBuffer:
            try:
                bound = inspect.signature(SequentialBuffer).bind(*buffer_args,
                                                                 **buffer_kwargs)
            except TypeError as exc:
                raise ArgumentError(
                    f"IndependentVectorizedBuffer: buffer arguments {buffer_args!r}, "
                    f"{buffer_kwargs!r} do not fit SequentialBuffer(capacity, "
                    f"validate_keys=True) ({exc})") from None
            if "seed" in bound.arguments:
                raise ArgumentError("IndependentVectorizedBuffer: pass seed= to the group, "
                                    "not to its buffers")
            bound.apply_defaults()
            self._setup(bound.arguments["capacity"], bound.arguments["validate_keys"],
                        self._rng, self.num_buffers)
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

    def __len__(self) -> int:
        """:attr:`size` (other buffer classes hold no core buffer)."""
        return self.size

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
            ArgumentError: ``experience`` is not a dict with str keys.
            SpecError, ShapeError: Keys differ (naming the missing and unexpected ones),
                or a value's leading dim is not ``num_buffers``; nothing is added to any
                buffer (fishyrl's buffers could desync here; these cannot; other
                ``buffer_class`` es get the dict and leading dims checked first).
        """
        if self._buffers is not None:
            _experience(experience)
            values = {k: np.asarray(v) for k, v in experience.items()}
            for k, v in values.items():
                if v.ndim == 0 or v.shape[0] != self.num_buffers:
                    raise ShapeError(f"add: experience[{k!r}]={describe(v)}: expected a "
                                     f"leading dim of num_buffers={self.num_buffers}")
            for i, b in enumerate(self._buffers):
                b.add({k: v[i] for k, v in values.items()})
            return
        self._add(experience)

    def sample(self, batch_size: int, **sample_kwargs: Any) -> dict[str, np.ndarray]:
        """Sample a batch divided randomly among the buffers (each buffer equally likely
        per sequence) and concatenated buffer by buffer, as fishyrl's reference says:
        buffer 0's sequences first, then buffer 1's, ...

        Args:
            batch_size: The number of sequences ``B``.
            **sample_kwargs: The buffers' ``sample`` arguments (``sequence_length``).

        Returns:
            ``{key: [B, L, *shape]}``.

        Raises:
            ArgumentError: ``batch_size`` not an int, or a keyword
                ``SequentialBuffer.sample`` does not take (a TypeError too).
            ConfigError, EmptyBufferError: As :meth:`SequentialBuffer.sample`.

        Warns:
            UserWarning: ``batch_size`` does not divide by ``num_buffers`` (as fishyrl;
                the batch still has ``batch_size`` sequences).
        """
        n = self.num_buffers
        batch_size = check_int("sample", "batch_size", batch_size, example=16)
        if batch_size % n:
            warnings.warn(f"sample(batch_size={batch_size}): not divisible by the number of "
                          f"buffers {n}; the buffers' shares of the batch differ",
                          stacklevel=2)
        if self._buffers is not None:
            # a failed draw changes nothing
            with restored_on_error(self._rng.bit_generator, "state"):
                counts = np.bincount(self._rng.integers(0, n, size=batch_size), minlength=n)
                parts = [b.sample(int(c), **sample_kwargs)
                         for b, c in zip(self._buffers, counts, strict=True) if c > 0]
            return {k: np.concatenate([p[k] for p in parts], axis=0) for k in parts[0]}
        if set(sample_kwargs) != {"sequence_length"}:
            raise ArgumentError(
                f"sample() got keyword arguments {sorted(sample_kwargs)}; the buffers' "
                "sample takes sequence_length= (e.g. sample(16, sequence_length=64))")
        return self._sample(batch_size, sample_kwargs["sequence_length"])

    def state_dict(self) -> dict[str, Any]:
        """Return the state of all buffers: ``{"buffer": core state dict,
        "validate_keys", "keys"}``, a snapshot as :meth:`SequentialBuffer.state_dict`'s
        (other buffer classes: ``{"_buffers": [...], "_rng": ...}`` as fishyrl)."""
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
            self._load_list(state_dict)
            return
        self._load(state_dict, self._capacity, self._rng)

    def _load_list(self, state_dict: Any) -> None:
        """Load the state of a list of other buffers: all of them or none."""
        buffers = self._buffers
        assert buffers is not None
        if not isinstance(state_dict, Mapping) or not isinstance(
                state_dict.get("_buffers"), (list, tuple)) \
                or len(state_dict["_buffers"]) != len(buffers) or "_rng" not in state_dict:
            raise CheckpointError(
                f"load_state_dict: expected {{'_buffers': [{len(buffers)} buffer states], "
                f"'_rng': ...}} from state_dict(); got {describe(state_dict)}")
        rng = saved_generator(state_dict["_rng"], "load_state_dict: _rng",
                              "pass the state_dict() of a group of the same buffer class")
        before = [b.state_dict() for b in buffers]
        try:
            for b, s in zip(buffers, state_dict["_buffers"], strict=True):
                b.load_state_dict(s)
        except Exception as exc:
            for b, s in zip(buffers, before, strict=True):
                b.load_state_dict(s)
            if isinstance(exc, CheckpointError):
                raise
            raise CheckpointError(f"load_state_dict: a buffer's state does not load "
                                  f"({type(exc).__name__}: {exc}); nothing was loaded"
                                  ) from exc
        self._rng.bit_generator.state = rng.bit_generator.state


#: torch.tensor's keywords that Tensor.to does not take (the reference passes
#: ``tensor_kwargs`` to the torch.tensor constructor).
_CONSTRUCTOR_ONLY = ("requires_grad", "pin_memory")


def convert_samples_to_tensors(
    samples: dict[str, np.ndarray], **tensor_kwargs: Any
) -> dict[str, Any]:
    """Convert sampled experiences from numpy arrays to tensors.

    ``tensor_kwargs`` are what fishyrl's reference says: keyword arguments of the
    ``torch.tensor`` constructor (``dtype``, ``device``, ``requires_grad``,
    ``pin_memory``), each giving what ``torch.tensor(array, **tensor_kwargs)`` gives;
    ``Tensor.to``'s keywords (``non_blocking``, ``copy``, ``memory_format``) are taken
    too.

    Args:
        samples: A batch, ``{key: array}``.
        **tensor_kwargs: ``torch.tensor`` (or ``Tensor.to``) keywords, e.g. ``device=``,
            ``dtype=``, ``requires_grad=``.

    Returns:
        ``{key: torch.Tensor}``; without ``tensor_kwargs`` (or ones that change nothing) a
        tensor shares memory with its array (a read-only array is copied first). With
        ``requires_grad=True`` each tensor is a leaf that collects its gradient.

    Raises:
        MissingDependencyError: torch is not installed.
        ArgumentError: ``samples`` is not a dict, ``requires_grad``/``pin_memory`` is not
            a bool, or keywords torch refuses (an unknown device, gradients for an
            integer array, pinning without CUDA, ...).
        DtypeError: A value holds no numbers.

    Example:
        >>> import numpy as np, torch
        >>> out = convert_samples_to_tensors({"obs": np.zeros((2, 3), np.float64)},
        ...                                  dtype=torch.float32, device="cpu")
        >>> out["obs"].dtype, tuple(out["obs"].shape), out["obs"].device.type
        (torch.float32, (2, 3), 'cpu')
        >>> convert_samples_to_tensors({"obs": np.zeros(2)}, requires_grad=True)["obs"]
        tensor([0., 0.], dtype=torch.float64, requires_grad=True)
    """
    torch = torch_module()
    call = "convert_samples_to_tensors"
    check_type(call, "samples", samples, Mapping, "a dict of numpy arrays (a batch of sample())")
    to_kwargs = {k: v for k, v in tensor_kwargs.items() if k not in _CONSTRUCTOR_ONLY}
    grad, pin = (
        check_bool(call, name, tensor_kwargs.get(name, False)) for name in _CONSTRUCTOR_ONLY
    )
    out: dict[str, Any] = {}
    for k, v in samples.items():
        try:
            if isinstance(v, np.ndarray):
                t = torch.from_numpy(v if v.flags.writeable else v.copy())
            else:
                t = torch.as_tensor(v)
        except (TypeError, RuntimeError, ValueError) as exc:
            raise DtypeError(
                f"{call}: samples[{k!r}]={describe(v)} is not numbers torch can hold ({exc})"
            ) from None
        try:
            t = t.to(**to_kwargs) if to_kwargs else t
            if pin:
                t = t.pin_memory()
            out[k] = t.requires_grad_() if grad else t
        except (TypeError, RuntimeError, ValueError) as exc:
            raise ArgumentError(
                f"{call}(**{tensor_kwargs!r}): torch refuses them for samples[{k!r}] "
                f"({str(exc).splitlines()[0]}); pass torch.tensor keywords, e.g. "
                "device='cpu', dtype=torch.float32, requires_grad=True (float data)"
            ) from None
    return out
