"""One error tree for replaybank.

Every error a user can trigger is a subclass of :class:`ReplayBankError` and of the
matching builtin (``ValueError``, ``TypeError``, ...), so ``except ValueError`` keeps
working. Messages name the argument, the bad value, the rule and the fix.

Example:
    >>> from replaybank.errors import ShapeError
    >>> issubclass(ShapeError, ValueError)
    True
"""

from __future__ import annotations

import difflib
import errno
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "ArgumentError",
    "BufferChangedError",
    "CapacityError",
    "CheckpointError",
    "ConcurrentCallError",
    "ConfigError",
    "DtypeError",
    "EmptyBufferError",
    "MissingDependencyError",
    "ReplayBankError",
    "ShapeError",
    "SpecError",
    "closest",
    "describe",
    "os_error_fix",
    "require_extra",
]


class ReplayBankError(Exception):
    """Base class of every error raised by replaybank."""


class SpecError(ReplayBankError, ValueError):
    """A field set or field spec does not match what the buffer stores."""


class ShapeError(ReplayBankError, ValueError):
    """An array has the wrong shape or leading dimensions."""


class DtypeError(ReplayBankError, TypeError):
    """A value cannot be cast safely to a field's dtype."""


class EmptyBufferError(ReplayBankError, ValueError):
    """Sampling was requested from a buffer that holds too few items."""


class CapacityError(ReplayBankError, ValueError):
    """A capacity is invalid, does not divide across lanes, or does not fit in memory."""


class CheckpointError(ReplayBankError, ValueError):
    """A checkpoint on disk is missing, corrupt, or does not match."""


class ConfigError(ReplayBankError, ValueError):
    """A configuration value is invalid."""


class ArgumentError(ConfigError, TypeError):
    """A call got a keyword argument it does not take, or an argument of the wrong kind
    (also a ``TypeError``, as Python's own unexpected-keyword error)."""


class ConcurrentCallError(ReplayBankError, RuntimeError):
    """A buffer that serves one thread at a time (a rollout buffer, a Ray client) was
    called from a second thread while another thread's call on it was still running."""


class BufferChangedError(ReplayBankError, RuntimeError):
    """A minibatch generator was resumed after the rollout it reads changed (an ``add``,
    ``reset`` or new advantages since it was made), as a dict changed during iteration."""


class MissingDependencyError(ReplayBankError, ImportError):
    """An optional dependency is not installed."""


def describe(value: Any) -> str:
    """Return a short, readable description of a value for an error message.

    Arrays are described by shape and dtype rather than printed in full.

    Args:
        value: Anything a user passed in.

    Returns:
        A one-line description.

    Example:
        >>> describe(np.zeros((2, 3), dtype=np.float32))
        'array(shape=(2, 3), dtype=float32)'
        >>> describe(3)
        '3'
    """
    if isinstance(value, np.ndarray):
        return f"array(shape={tuple(value.shape)}, dtype={value.dtype})"
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{type(value).__name__}(shape={tuple(shape)}, dtype={dtype})"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def closest(name: str, names: Iterable[str]) -> str | None:
    """The one of ``names`` a misspelt ``name`` most probably meant, for a "did you mean",
    or None.

    A match has difflib's ratio of at least 0.75, or at least 0.6 with a run of 3 or more
    characters in common (``"lamda"`` -> ``"gae_lambda"``, ``"epsilon"`` -> ``"eps"``) or
    the very same letters (two swapped: ``"pso"`` -> ``"pos"``): a short word shares
    enough scattered letters with an unrelated one to reach 0.6 (``"view"`` and
    ``"device"``), a typo keeps a run of the word or its letters.

    Example:
        >>> closest("capacty", ["capacity", "num_envs"]), closest("x", ["capacity"])
        ('capacity', None)
        >>> closest("view", ["device", "k"]), closest("lamda", ["gae_lambda", "gamma"])
        (None, 'gae_lambda')
        >>> closest("pso", ["pos", "vel"])
        'pos'
    """
    for near in difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.6):
        match = difflib.SequenceMatcher(None, name, near)
        if match.ratio() >= 0.75 or sorted(name) == sorted(near) or \
                match.find_longest_match(0, len(name), 0, len(near)).size >= 3:
            return near
    return None


def os_error_fix(exc: OSError) -> str:
    """What to do about a failed file write, by its cause (for the end of a message).

    Example:
        >>> os_error_fix(PermissionError(13, "Permission denied"))
        'the directory is not writable by this process: save to a writable path or fix its permissions'
        >>> os_error_fix(OSError(28, "No space left on device"))
        'free disk space and try again'
    """  # noqa: E501
    code = exc.errno
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ("the directory is not writable by this process: save to a writable path or "
                "fix its permissions")
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return "free disk space and try again"
    if code == errno.ENAMETOOLONG:
        return "use a shorter path or prefix"
    return "fix the cause above and try again"


def require_extra(module: str, extra: str) -> Any:
    """Import an optional dependency or raise an error naming the extra to install.

    Args:
        module: Module to import, e.g. ``"torch"``.
        extra: The replaybank extra that provides it, e.g. ``"torch"``.

    Returns:
        The imported module.

    Raises:
        MissingDependencyError: If the module is not installed.

    Example:
        >>> require_extra("json", "core").__name__
        'json'
    """
    import importlib

    found = sys.modules.get(module)  # imported already: no import machinery per call
    if found is not None:
        return found
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"{module} is required for this feature but is not installed; "
            f'run: pip install "replaybank[{extra}]"'
        ) from exc
