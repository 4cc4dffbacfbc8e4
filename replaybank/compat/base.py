"""The base every front end builds on: it owns the core buffer and the chores around it.

A front end speaks another library's API over a replaybank buffer it owns (composition:
the core buffer is an attribute, never a base class). What every front end does the same
way lives here, written once:

* :class:`FrontEnd` holds the core buffer (:attr:`FrontEnd.buffer`), answers ``len()``
  with the core's length and writes its ``repr`` from a table of attribute names
  (``_repr_fields``);
* :class:`Core` is one line of a front end's name-translation table: a read-only
  attribute answered by the core buffer's attribute (or method) of that, or another,
  name, by the core buffer itself (``"buffer"``) or by its length (``"len"``), with its
  own docstring;
* :class:`Checkpointed` adds replaybank's checkpoint verbs for a front end registered as
  a buffer type (``SequenceReplayBuffer``, ``PathBuffer``): ``state_dict`` (the core's
  state beside the front end's own entries), ``load_state_dict`` (the front end's entries
  checked before the core loads, so a state that fails changes nothing), ``save``,
  ``load`` and ``config`` through :mod:`replaybank.persist`;
* :func:`restored_on_error` makes a call that fails change nothing: the attributes it
  names (a front end's whole ``__dict__``, a generator's ``state``) are put back when
  the block raises.

What is left in a front end is its name-translation table and the methods whose
semantics differ from the core's. Front ends whose library saves its own way (velora's
files, fishyrl's state dicts) keep their own ``state_dict``/``save``.

Example:
    >>> import numpy as np
    >>> from replaybank.buffers.replay import ReplayBuffer
    >>> class Tiny(FrontEnd):
    ...     _repr_fields = ("capacity", "size=len")
    ...     capacity: Core[int] = Core("Total steps.")
    ...     def __init__(self, capacity):
    ...         self.buffer = ReplayBuffer(capacity)
    >>> tiny = Tiny(8)
    >>> tiny.buffer.add(obs=np.zeros(2), action=0, reward=1.0, next_obs=np.ones(2),
    ...                 terminated=False, truncated=False)
    >>> len(tiny), tiny, Tiny.capacity.__doc__
    (1, Tiny(capacity=8, size=1), 'Total steps.')
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, overload

from replaybank import persist

if TYPE_CHECKING:  # pydantic loads with the first config() call
    from replaybank.config import AnyBuffer, BufferConfig

__all__ = ["Checkpointed", "Core", "FrontEnd", "restored_on_error"]

T = TypeVar("T")


class Core(Generic[T]):
    """A read-only front-end attribute answered by the core buffer: one line of the
    name-translation table (a property written once).

    Reading it on a front end reads ``front_end.buffer.<name>`` (a method of the core is
    read as its bound method, so a delegating method is one line too), or, for the names
    ``"buffer"`` and ``"len"``, ``front_end.buffer`` and ``len(front_end.buffer)``; setting
    it raises an ``AttributeError``, as a property without a setter does; on the class it
    is the descriptor itself, whose ``__doc__`` documents the attribute.

    Args:
        doc: The attribute's docstring.
        name: The core buffer's attribute (default: the same name as on the front end),
            ``"buffer"`` for the core buffer itself or ``"len"`` for its length.

    Example:
        >>> from replaybank.buffers.replay import ReplayBuffer
        >>> class Front(FrontEnd):
        ...     size: Core[int] = Core("Total steps.", "capacity")
        ...     core: Core[ReplayBuffer] = Core("The core buffer.", "buffer")
        ...     held: Core[int] = Core("Steps stored.", "len")
        ...     clear: Core[Callable[[], None]] = Core("Drop every step.")
        ...     def __init__(self):
        ...         self.buffer = ReplayBuffer(4)
        >>> front = Front()
        >>> front.size, Front.size.name, front.core is front.buffer, front.held
        (4, 'capacity', True, 0)
        >>> front.size = 8
        Traceback (most recent call last):
        ...
        AttributeError: Front.size is read-only: the core buffer's capacity
    """

    def __init__(self, doc: str, name: str | None = None) -> None:
        self.__doc__ = doc
        self.name = name or ""
        self.attr = self.name

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = name
        self.name = self.name or name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Core[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object, owner: type | None = None) -> T | Core[T]:
        if obj is None:
            return self
        buffer = obj.buffer  # type: ignore[attr-defined]
        if self.name == "buffer":
            return buffer  # type: ignore[no-any-return]
        if self.name == "len":
            return len(buffer)  # type: ignore[return-value]
        return getattr(buffer, self.name)  # type: ignore[no-any-return]

    def __set__(self, obj: object, value: Any) -> None:
        raise AttributeError(f"{type(obj).__name__}.{self.attr} is read-only: the core "
                             f"buffer's {self.name}")


class FrontEnd:
    """A front end: another library's API over a core buffer it owns.

    Subclasses set :attr:`buffer` in their constructor and list the attributes their
    ``repr`` shows in ``_repr_fields``.

    Attributes:
        buffer: The core buffer (a :class:`~replaybank.buffers.replay.ReplayBuffer`,
            :class:`~replaybank.buffers.rollout.buffer.RolloutBuffer`, or another front
            end) that holds the data.

    Example:
        >>> from replaybank.buffers.replay import ReplayBuffer
        >>> class Plain(FrontEnd):
        ...     _repr_fields = ("capacity",)
        ...     def __init__(self):
        ...         self.buffer = ReplayBuffer(4)
        ...         self.capacity = 4
        >>> len(Plain()), repr(Plain())
        (0, 'Plain(capacity=4)')
    """

    #: What ``repr`` shows, in order, as ``Name(label=value, ...)``: an attribute name, or
    #: ``"label=attribute"`` (``"size=len"``: ``len(self)``).
    _repr_fields: ClassVar[tuple[str, ...]] = ()
    buffer: Any

    def __len__(self) -> int:
        """What the core buffer holds (see each front end for the unit; 0 while a front
        end that builds its core lazily has none)."""
        return 0 if self.buffer is None else len(self.buffer)

    def __repr__(self) -> str:
        parts = []
        for field in self._repr_fields:
            label, _, attr = field.partition("=")
            value = len(self) if attr == "len" else getattr(self, attr or label)
            parts.append(f"{label}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


class Checkpointed:
    """replaybank's checkpoint verbs for a front end registered as a buffer type.

    The state is the core buffer's (at the top level, or under ``_core_key``) with the
    front end's own entries (:meth:`_own_state`) beside it. Loading checks the own
    entries first (:meth:`_checked_own_state`), then the core checks and loads its part,
    then the own entries are applied: a state that does not fit raises and changes
    nothing. A subclass also defines ``init_config()`` (its constructor values, for
    :func:`replaybank.config.buffer_config`) and owns :attr:`FrontEnd.buffer`.

    Example:
        >>> import tempfile
        >>> from replaybank.compat.trajectory import PathBuffer
        >>> d = tempfile.mkdtemp()
        >>> PathBuffer(4, gamma=0.9).save(d)
        >>> PathBuffer.load(d).gamma, PathBuffer(4).config().type
        (0.9, 'PathBuffer')
    """

    #: Where the core's state goes: None, merged into the top level; else under this key.
    _core_key: ClassVar[str | None] = None
    buffer: Any

    def _own_state(self) -> dict[str, Any]:
        """The front end's own entries of the state (JSON-able values or arrays)."""
        raise NotImplementedError

    def _checked_own_state(self, state: Any) -> Callable[[], None]:
        """Check the own entries of ``state`` (a :meth:`state_dict`, maybe damaged) and
        return what sets them; nothing is changed yet.

        Raises:
            CheckpointError: The entries do not fit this front end.
        """
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The core buffer's state and this front end's own entries; leaves are arrays or
        JSON-able values."""
        core = self.buffer.state_dict()
        out = dict(core) if self._core_key is None else {self._core_key: core}
        out.update(self._own_state())
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`: the front end's entries are checked first and
        the core buffer checks its own, so a state that fails changes nothing.

        Raises:
            CheckpointError: The state does not fit this buffer or is damaged.
        """
        apply = self._checked_own_state(state)
        self.buffer.load_state_dict(state if self._core_key is None else state[self._core_key])
        apply()

    def save(self, dirpath: Any, prefix: str = "buffer_") -> None:
        """Write ``<prefix>metadata.json`` and ``<prefix>state.safetensors`` atomically;
        restore with :meth:`load` (or :func:`replaybank.load`)."""
        persist.save(self, dirpath, prefix=prefix)  # type: ignore[arg-type]

    @classmethod
    def load(cls, dirpath: Any, prefix: str = "buffer_", *,
             trust_imports: bool = False) -> AnyBuffer:
        """Restore a buffer saved with :meth:`save` (identical next sample)."""
        return persist.load(dirpath, prefix=prefix, trust_imports=trust_imports)

    def config(self) -> BufferConfig:
        """A validated config object (pydantic) that rebuilds an equivalent empty buffer."""
        from replaybank.config import buffer_config

        return buffer_config(self)


@contextmanager
def restored_on_error(obj: Any, *names: str) -> Iterator[None]:
    """Put back the attributes ``names`` of ``obj`` (shallow copies taken on entry) when
    the ``with`` block raises, then re-raise: a call that fails half-way changes nothing.

    Args:
        obj: The object whose attributes the block may change.
        *names: The attributes to restore (``"__dict__"``: every attribute of a front
            end; ``"state"`` of a numpy bit generator: the draws).

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> first = rng.random()
        >>> rng = np.random.default_rng(0)
        >>> try:
        ...     with restored_on_error(rng.bit_generator, "state"):
        ...         _ = rng.random()
        ...         raise ValueError("a late failure")
        ... except ValueError:
        ...     pass
        >>> rng.random() == first
        True
    """
    saved = {name: copy.copy(getattr(obj, name)) for name in names}
    try:
        yield
    except BaseException:
        for name, value in saved.items():
            setattr(obj, name, value)
        raise
