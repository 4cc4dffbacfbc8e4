"""Named functions that views call (hindsight reward and termination functions).

A config file cannot hold a Python function, so it names one: a name given to
:func:`register_function`, or an import path ``"module:attr"`` (resolved on first use, so
registering imports nothing). :func:`resolve_function` turns either (or a callable) into
the callable; :func:`function_name` finds the name a callable can be written under.

Names read from a file that the program did not write (a checkpoint being loaded, a memmap
directory being reopened: :func:`names_from_file`) are resolved without importing
anything new: an import path whose module is not imported yet is refused (importing runs
the module's code, and a file may name any module on ``sys.path``, the working directory
included), unless the loader passes ``trust_imports=True``. Registered names, the
modules of replaybank itself and modules the program already imported resolve as usual.

Example:
    >>> import numpy as np
    >>> def dist_reward(achieved, desired, info):
    ...     return -(np.linalg.norm(achieved - desired, axis=-1) > 0.05).astype(np.float32)
    >>> register_function("dist_reward", dist_reward)
    >>> resolve_function("dist_reward") is dist_reward, function_name(dist_reward)
    (True, 'dist_reward')
    >>> function_name(len)  # importable by path: builtins:len
    'builtins:len'
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from replaybank.errors import ConfigError

__all__ = ["FUNCTIONS", "function_name", "names_from_file", "register_function",
           "resolve_function"]

#: Registered functions by name: a callable, or an import path ``"module:attr"``.
FUNCTIONS: dict[str, Any] = {}
#: The file whose names are being resolved without new imports, or None.
_FILE: ContextVar[str | None] = ContextVar("replaybank_names_from_file", default=None)


@contextlib.contextmanager
def names_from_file(source: str, trust_imports: bool = False) -> Iterator[None]:
    """Resolve the function names of the file ``source`` in this block without importing
    a module that is not imported yet (``trust_imports=True``: as usual).

    Example:
        >>> with names_from_file("ckpt/"):
        ...     resolve_function("builtins:len") is len  # builtins is imported
        True
        >>> with names_from_file("ckpt/"):
        ...     resolve_function("antigravity:fly")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        replaybank.errors.ConfigError: function='antigravity:fly' is named by ckpt/, ...
    """
    token = _FILE.set(None if trust_imports else str(source))
    try:
        yield
    finally:
        _FILE.reset(token)


def register_function(name: str, target: Callable[..., Any] | str) -> None:
    """Make ``target`` nameable in configs (e.g. ``reward_fn: "fetch_reach"``).

    Args:
        name: The name configs use.
        target: The callable, or ``"module:attr"`` imported on first use.

    Raises:
        ConfigError: ``name`` is not a non-empty str, or ``target`` is neither a callable
            nor a ``"module:attr"`` string.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"register_function(name={name!r}): name must be a non-empty str")
    if not callable(target) and not (isinstance(target, str) and ":" in target):
        raise ConfigError(f"register_function({name!r}, target={target!r}): target must be "
                          "a callable or an import path 'module:attr'")
    FUNCTIONS[name] = target


def _import(path: str, what: str, registered: bool = False) -> Callable[..., Any]:
    mod, _, attr = path.partition(":")
    source = None if registered else _FILE.get()
    if source is not None and mod not in sys.modules \
            and mod.partition(".")[0] != "replaybank":
        raise ConfigError(
            f"{what}={path!r} is named by {source}, and replaybank does not import a module "
            f"a file names (importing {mod!r} would run its code); import {mod} yourself, "
            f"or rb.register_function(name, fn), before loading, or pass "
            "trust_imports=True if you trust the file")
    try:
        obj: Any = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{what}={path!r}: cannot import it ({exc})") from exc
    if not callable(obj):
        raise ConfigError(f"{what}={path!r}: {type(obj).__name__} is not callable")
    return obj  # type: ignore[no-any-return]


def resolve_function(value: Callable[..., Any] | str, what: str = "function"
                     ) -> Callable[..., Any]:
    """The callable ``value`` names (a callable is returned as it is).

    Args:
        value: A callable, a registered name or an import path ``"module:attr"``.
        what: The argument name, for errors (``"reward_fn"``).

    Raises:
        ConfigError: An unknown name, a path that does not import, or not a callable.
    """
    if callable(value):
        return value
    if isinstance(value, str):
        if value in FUNCTIONS:
            target = FUNCTIONS[value]
            return target if callable(target) else _import(target, what, registered=True)
        if ":" in value:
            return _import(value, what)
        raise ConfigError(f"{what}={value!r}: no function is registered under that name; "
                          f"known names: {sorted(FUNCTIONS)}; register it with "
                          f"rb.register_function({value!r}, fn) or give 'module:attr'")
    raise ConfigError(f"{what}={value!r}: pass a callable, a name registered with "
                      "rb.register_function, or an import path 'module:attr'")


def function_name(fn: Callable[..., Any]) -> str | None:
    """The name a config can write ``fn`` under: its registered name, else its import path
    when importing that path gives ``fn`` back, else None (a lambda, a bound method)."""
    for name, target in FUNCTIONS.items():
        if target is fn:
            return name
    for name, target in FUNCTIONS.items():
        if isinstance(target, str):
            try:
                if resolve_function(target) is fn:
                    return name
            except ConfigError:
                continue
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if isinstance(mod, str) and isinstance(qual, str) and "<" not in qual:
        path = f"{mod}:{qual}"
        try:
            if _import(path, "function") is fn:
                return path
        except ConfigError:
            return None
    return None
