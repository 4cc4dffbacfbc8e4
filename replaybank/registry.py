"""Registries of the buffer, sampler and view types that configs can name.

A config names its buffer type (``"ReplayBuffer"``) and its components' types
(``"uniform"``, ``"nstep"``); these registries map each name to its class, or to a
``"module:ClassName"`` import path resolved on first use, so that registering a type
imports nothing. A component may also be named by its class name (``"PrioritizedSampler"``
for ``"prioritized"``, ``"NStepView"`` for ``"nstep"``), as buffer types are:
:func:`canonical_type` maps such an alias to the registered name.
:func:`constructor_params` lists every constructor argument a registered buffer type
accepts, following ``**kwargs`` to the class they reach; the config models of
:mod:`replaybank.config` are derived from it.

The same goes for the storage kinds that live in rooms above the core
(``storage="torch"`` in :mod:`replaybank.device`, ``storage="shared"`` in
:mod:`replaybank.shared`): :func:`register_storage` maps the name to how its backend is
built and which store serves it, and :func:`register_feature` names a function the core
calls without importing the room that defines it (the device twin of hindsight
relabelling, the prefetcher). The core asks these tables, so it imports neither room.

This module imports neither pydantic nor any buffer; :mod:`replaybank.config` re-exports
its public functions. The built-in types are registered, as classes, at the top of the
package (``replaybank/__init__.py``), the one place that imports every layer: this lowest
layer names none of them.

Example:
    >>> register_sampler("uniform", "replaybank.samplers.uniform:UniformSampler")
    >>> SAMPLERS["uniform"].resolve().__name__
    'UniformSampler'
    >>> "capacity" in constructor_params("ReplayBuffer")
    True
    >>> canonical_type(SAMPLERS, "PrioritizedSampler"), canonical_type(VIEWS, "nstep")
    ('prioritized', 'nstep')
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BUFFERS",
    "BUFFER_LISTENERS",
    "FEATURES",
    "STORAGE_KINDS",
    "SAMPLERS",
    "VIEWS",
    "Entry",
    "StorageKind",
    "buffer_types",
    "canonical_type",
    "constructor_params",
    "feature",
    "register_buffer",
    "register_feature",
    "register_sampler",
    "register_storage",
    "register_view",
    "sampler_types",
    "storage_names",
    "view_types",
]


@dataclass(frozen=True)
class Entry:
    """One registered type: its class or import path, and how its ``**kwargs`` pass on.

    Example:
        >>> Entry("replaybank.views.nstep:NStepView").resolve().__name__
        'NStepView'
    """

    target: Any  # a class, or "module:attr" imported on first use
    exclude: tuple[str, ...] = ()
    kwargs_to: Any = None  # where the class's **kwargs go (default: its base class)

    @property
    def class_name(self) -> str:
        """The name of the class, read without importing it.

        Example:
            >>> Entry("replaybank.views.nstep:NStepView").class_name
            'NStepView'
        """
        if isinstance(self.target, str):
            return self.target.partition(":")[2]
        return str(getattr(self.target, "__name__", ""))

    def resolve(self) -> Any:
        """The class (importing its module when the target is an import path)."""
        if not isinstance(self.target, str):
            return self.target
        mod, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(mod), attr)


BUFFERS: dict[str, Entry] = {}
SAMPLERS: dict[str, Entry] = {}
VIEWS: dict[str, Entry] = {}
# called after every register_buffer (the config models cache per buffer type)
BUFFER_LISTENERS: list[Callable[[], None]] = []


def register_buffer(name: str, target: Any, exclude: tuple[str, ...] = (),
                    kwargs_to: Any = None) -> None:
    """Make a buffer type buildable from configs.

    Args:
        name: The ``type`` value in configs (the class name by convention).
        target: The class, or ``"module:ClassName"`` (imported on first use).
        exclude: Constructor arguments its ``**kwargs`` does not accept (e.g. ``sampler``
            for a buffer that builds its own).
        kwargs_to: The class (or import path) its ``**kwargs`` are passed to, when that
            is not its base class (a front end that wraps a ReplayBuffer).

    Example:
        >>> register_buffer("ReplayBuffer", "replaybank.buffers.replay:ReplayBuffer")
        >>> "ReplayBuffer" in buffer_types()
        True
    """
    BUFFERS[name] = Entry(target, tuple(exclude), kwargs_to)
    for listener in BUFFER_LISTENERS:
        listener()


def register_sampler(name: str, target: Any) -> None:
    """Register a sampler type (its ``config()["type"]``) and its class or import path.

    Example:
        >>> register_sampler("uniform", "replaybank.samplers.uniform:UniformSampler")
        >>> "uniform" in sampler_types()
        True
    """
    SAMPLERS[name] = Entry(target)


def register_view(name: str, target: Any) -> None:
    """Register a view type (its ``config()["type"]``) and its class or import path.

    Example:
        >>> register_view("nstep", "replaybank.views.nstep:NStepView")
        >>> "nstep" in view_types()
        True
    """
    VIEWS[name] = Entry(target)


@dataclass(frozen=True)
class StorageKind:
    """A storage name beyond the core's own (``"numpy"``, ``"memmap"``).

    Example:
        >>> kind = StorageKind(lambda path, device: ("backend", path, device))
        >>> kind.backend(None, "cpu"), kind.store is None
        (('backend', None, 'cpu'), True)
    """

    #: ``backend(path, device)`` builds the array backend (raising ``ConfigError`` for
    #: arguments the storage does not take).
    backend: Callable[[Any, Any], Any]
    #: ``store(backend, rows, lanes, rows_only, spec)`` returns the store that serves the
    #: backend, or None for the local store (e.g. the device path turned off); None: always
    #: local.
    store: Callable[..., Any] | None = None


#: Storage names served by rooms above the core: name -> :class:`StorageKind`.
STORAGE_KINDS: dict[str, StorageKind] = {}
#: Functions the core calls from rooms above it: name -> function.
FEATURES: dict[str, Callable[..., Any]] = {}
#: The storage names the core builds itself.
CORE_STORAGES = ("numpy", "memmap")


def register_storage(name: str, backend: Callable[[Any, Any], Any],
                     store: Callable[..., Any] | None = None) -> None:
    """Make ``storage=name`` buildable (in constructors and configs).

    Args:
        name: The ``storage`` value (``"torch"``, ``"shared"``).
        backend: ``backend(path, device)``: the array backend.
        store: ``store(backend, rows, lanes, rows_only, spec)``: the store of a backend
            of this kind, or None for the local store.

    Example:
        >>> register_storage("example", lambda path, device: None)
        >>> "example" in storage_names()
        True
        >>> del STORAGE_KINDS["example"]
    """
    STORAGE_KINDS[name] = StorageKind(backend, store)


def storage_names() -> tuple[str, ...]:
    """Every storage name a buffer accepts.

    Example:
        >>> storage_names()[:2]
        ('numpy', 'memmap')
    """
    return CORE_STORAGES + tuple(STORAGE_KINDS)


def register_feature(name: str, fn: Callable[..., Any]) -> None:
    """Provide the function the core calls as ``feature(name)``.

    Args:
        name: The feature's name (``"prefetcher"``, ``"device_relabeling"``).
        fn: The function (or class) that implements it.

    Example:
        >>> register_feature("example", len)
        >>> feature("example")([1, 2])
        2
        >>> del FEATURES["example"]
    """
    FEATURES[name] = fn


def feature(name: str) -> Callable[..., Any]:
    """The function registered as ``name``.

    Raises:
        KeyError: Nothing registered under ``name`` (the room that provides it was not
            imported: import :mod:`replaybank`, which registers every built-in one).

    Example:
        >>> import replaybank
        >>> feature("prefetcher").__name__
        'Prefetcher'
    """
    try:
        return FEATURES[name]
    except KeyError:
        raise KeyError(f"no feature {name!r} registered (import replaybank, which "
                       f"registers the built-in ones; registered: {sorted(FEATURES)})") from None


def canonical_type(registry: dict[str, Entry], name: Any) -> Any:
    """The registered name that ``name`` stands for in ``registry``.

    A registered name is returned as it is; the name of a registered class
    (``"PrioritizedSampler"``) becomes the name it is registered under (``"prioritized"``;
    the first one when it is registered under several); anything else is returned
    unchanged, for the caller's "unknown type" error.

    Example:
        >>> canonical_type(SAMPLERS, "UniformSampler"), canonical_type(SAMPLERS, "fifo")
        ('uniform', 'fifo')
    """
    if not isinstance(name, str) or name in registry:
        return name
    for key, entry in registry.items():
        if entry.class_name == name:
            return key
    return name


def buffer_types() -> list[str]:
    """Registered buffer type names."""
    return sorted(BUFFERS)


def sampler_types() -> list[str]:
    """Registered sampler type names."""
    return sorted(SAMPLERS)


def view_types() -> list[str]:
    """Registered view type names."""
    return sorted(VIEWS)


def constructor_params(type_name: str) -> dict[str, inspect.Parameter]:
    """Every constructor argument of a registered buffer type, following ``**kwargs``
    to the base class (or the registered ``kwargs_to`` class), minus ``exclude``.

    Example:
        >>> "alpha" in constructor_params("PrioritizedReplayBuffer")
        True
    """
    entry = BUFFERS[type_name]
    chain = [entry.resolve()]
    if entry.kwargs_to is not None:
        chain.append(Entry(entry.kwargs_to).resolve())
    else:
        chain.extend(chain[0].__mro__[1:])
    return _signature_params(chain, entry.exclude)


def _signature_params(chain: list[type], exclude: tuple[str, ...]
                      ) -> dict[str, inspect.Parameter]:
    out: dict[str, inspect.Parameter] = {}
    for klass in chain:
        if "__init__" not in vars(klass) or klass is object:
            continue
        sig = inspect.signature(klass.__init__, eval_str=True)  # type: ignore[misc]
        more = False
        for name, p in list(sig.parameters.items())[1:]:
            if p.kind is p.VAR_KEYWORD:
                more = True
            elif p.kind is not p.VAR_POSITIONAL and name not in out and name not in exclude:
                out[name] = p
        if not more:
            break
    return out
