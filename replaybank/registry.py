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
    "SAMPLERS",
    "VIEWS",
    "Entry",
    "buffer_types",
    "canonical_type",
    "constructor_params",
    "register_buffer",
    "register_sampler",
    "register_view",
    "sampler_types",
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
