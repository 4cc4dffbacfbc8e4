"""The argument checks of the pytorchrl front ends, as named ``check_*`` functions.

Every public call of a front end checks its arguments here before it changes anything,
so a rejected call leaves the storage (and the dicts it was given) as they were. An
argument of the wrong kind raises :class:`~replaybank.errors.ArgumentError` (a
``TypeError`` and a ``ValueError``), a value out of range a
:class:`~replaybank.errors.ConfigError`; both name the call, the argument, the bad value
and the fix. pytorchrl's reference types each argument (``size (int)``, ``alpha
(float)``, ``n_step (int or float)``, ...); the ranges are those of the schemes
(PER's ``alpha >= 0``, ``beta`` in ``[0, 1]``, ERE's ``eta`` in ``(0, 1]``, ...).

Example:
    >>> check_number("PERBuffer", "alpha", 0.6, lo=0.0)
    0.6
    >>> try:
    ...     check_number("PERBuffer", "alpha", float("nan"), lo=0.0, example=0.6)
    ... except ConfigError as exc:
    ...     print(exc)
    PERBuffer(alpha=nan): must be a finite number >= 0.0; pass e.g. alpha=0.6
    >>> try:
    ...     check_count("generate_batches", "num_mini_batch", 0)
    ... except ConfigError as exc:
    ...     print(exc)
    generate_batches(num_mini_batch=0): must be an int >= 1; pass e.g. num_mini_batch=1
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from replaybank.errors import ArgumentError, ConfigError, describe
from replaybank.spec import real_array

__all__ = ["check_bool", "check_count", "check_int", "check_mapping", "check_number",
           "check_whole", "numeric_kind"]

#: numpy dtype kinds of values a storage can hold (bool, ints, floats).


def _is_real(value: Any) -> bool:
    return not isinstance(value, (bool, np.bool_)) and isinstance(
        value, (int, float, np.integer, np.floating))


def check_number(call: str, name: str, value: Any, lo: float = -math.inf,
                 hi: float = math.inf, lo_open: bool = False, example: Any = None) -> float:
    """A finite real number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``).

    Args:
        call: The call, for the message (``"PERBuffer"``, ``"get_priority"``).
        name: The argument's name.
        value: What the caller passed.
        lo: Smallest legal value.
        hi: Largest legal value.
        lo_open: ``lo`` itself is not legal.
        example: A legal value for the message (default: ``hi`` or ``lo``).

    Returns:
        ``value`` as a float.

    Raises:
        ArgumentError: Not a real number (a string, None, a bool, an array, ...).
        ConfigError: NaN, infinite or out of range.
    """
    shown = example if example is not None else (hi if math.isfinite(hi) else lo)
    if math.isfinite(lo) and math.isfinite(hi):
        rule = f"a number in {'(' if lo_open else '['}{lo}, {hi}]"
    elif math.isfinite(lo):
        rule = f"a finite number {'>' if lo_open else '>='} {lo}"
    else:
        rule = "a finite number"
    if not _is_real(value):
        raise ArgumentError(f"{call}({name}={describe(value)}): must be {rule}, not a "
                            f"{type(value).__name__}; pass e.g. {name}={shown}")
    x = float(value)
    if not (math.isfinite(x) and lo <= x <= hi) or (lo_open and x == lo):
        raise ConfigError(f"{call}({name}={value!r}): must be {rule}; pass e.g. "
                          f"{name}={shown}")
    return x


def _is_whole(value: Any, allow_float: bool) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, np.integer)):
        return True
    return allow_float and isinstance(value, (float, np.floating)) \
        and float(value).is_integer()


def check_whole(call: str, name: str, value: Any, lo: int = 1,
                allow_float: bool = False) -> int:
    """An int ``>= lo`` (with ``allow_float``, also a float with no fraction, as
    pytorchrl's ``n_step (int or float)``).

    Raises:
        ArgumentError: Not an int (or a whole float when allowed).
        ConfigError: Below ``lo``.
    """
    what = "a whole number" if allow_float else "an int"
    if not _is_whole(value, allow_float):
        raise ArgumentError(f"{call}({name}={describe(value)}): must be {what} >= {lo}; "
                            f"pass e.g. {name}={max(lo, 1)}")
    if value < lo:
        raise ConfigError(f"{call}({name}={value!r}): must be {what} >= {lo}; pass e.g. "
                          f"{name}={max(lo, 1)}")
    return int(value)


def check_int(call: str, name: str, value: Any) -> int:
    """An int of any sign (a position).

    Raises:
        ArgumentError: Not an int (a float, a string, None, a bool, ...).
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ArgumentError(f"{call}({name}={describe(value)}): must be an int; pass e.g. "
                            f"{name}=0")
    return int(value)


def check_bool(call: str, name: str, value: Any) -> bool:
    """A bool flag.

    Raises:
        ArgumentError: Not a bool (``"yes"``, None, 1, ...).
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"{call}({name}={describe(value)}): must be True or False")
    return bool(value)


def check_count(call: str, name: str, value: Any, lo: int = 1) -> int:
    """A count argument of a call (``num_mini_batch``, ``mini_batch_size``, ...): an int
    ``>= lo``."""
    return check_whole(call, name, value, lo)


def check_mapping(call: str, name: str, value: Any, what: str) -> Mapping[str, Any]:
    """A dict argument.

    Raises:
        ArgumentError: ``value`` is not a mapping; the message says what it should hold.
    """
    if not isinstance(value, Mapping):
        raise ArgumentError(f"{call}({name}={describe(value)}): expected a dict ({what})")
    return value


def numeric_kind(call: str, name: str, array: np.ndarray) -> None:
    """Refuse arrays that hold no real numbers (strings, None, objects, complex): the
    core's rule (:func:`replaybank.spec.real_array`), named for this call.

    Raises:
        DtypeError: ``array``'s dtype is not bool, int or float.
    """
    real_array(array, f"{call}: {name}={describe(array)}", "pass a tensor or array of numbers")
