"""Config values taken as written: one check for every int, float, bool and text field.

A config file is read by YAML or JSON and a config dict is written by hand, so a value may
arrive as text (``"0.5"``; YAML 1.1 reads ``1e6`` as text), as a float where an int is
meant (``4.0``) or as a word where a bool is meant (``"no"``). None of these is converted:
pydantic's lax parsing would read ``"0.5"`` as 0.5 for one field while a buffer constructor
refuses it for another. :func:`strict_value` accepts a value only when it already is one of
the field's kinds (numpy scalars included, recorded as plain Python values) and otherwise
raises a ``ValueError`` that says what to write, which
:func:`replaybank.config.models.format_error` turns into the
:class:`~replaybank.errors.ConfigError` naming the key and the value.

Example:
    >>> strict_value(3, (int,))
    3
    >>> strict_value("0.5", (float,))
    Traceback (most recent call last):
    ...
    ValueError: must be a float; write 0.5 (a number, not text)
    >>> strict_value(4.0, (int,), rule="an int >= 0")
    Traceback (most recent call last):
    ...
    ValueError: must be an int >= 0; write 4
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["KINDS", "kind_rule", "simple_kinds", "strict", "strict_value"]

#: The kinds a config field can be checked as, and how a message names each.
KINDS: dict[type, str] = {bool: "true or false", int: "an int", float: "a float",
                          str: "a string", type(None): "null"}

_TRUE = ("true", "yes", "on", "y")
_FALSE = ("false", "no", "off", "n")
#: Text YAML 1.1 leaves as text although it reads as a number: an exponent without a dot.
_YAML_EXPONENT = re.compile(r"^[+-]?\d+[eE][+-]?\d+$")


#: Annotation names (``from __future__ import annotations`` leaves them as text) of KINDS.
_NAMES = {"int": int, "float": float, "bool": bool, "str": str, "None": type(None)}


def simple_kinds(annotation: Any) -> tuple[type, ...] | None:
    """The kinds of an annotation made of ``int``, ``float``, ``bool``, ``str`` and
    ``None`` only (a type, a ``|`` union, or the text of either), in the order a value is
    tried (bool, int, float, str, None); None for any other annotation.

    Example:
        >>> simple_kinds(int | None), simple_kinds("float | None"), simple_kinds("View")
        ((<class 'int'>, <class 'NoneType'>), (<class 'float'>, <class 'NoneType'>), None)
    """
    if isinstance(annotation, str):
        parts = [a.strip() for a in annotation.split("|")]
        if not all(a in _NAMES for a in parts):
            return None
        kinds = {_NAMES[a] for a in parts}
    elif annotation in KINDS and annotation is not type(None):
        kinds = {annotation}
    else:
        args = typing.get_args(annotation)
        if typing.get_origin(annotation) not in (typing.Union, types.UnionType) or \
                not args or not all(a in KINDS for a in args):
            return None
        kinds = set(args)
    return tuple(k for k in KINDS if k in kinds)


def kind_rule(kinds: tuple[type, ...]) -> str:
    """What a value of one of ``kinds`` is, for ``"must be ..."``.

    Example:
        >>> kind_rule((int, type(None))), kind_rule((bool, type(None)))
        ('an int or null', 'true, false or null')
    """
    names = [n for k in kinds for n in (("true", "false") if k is bool else (KINDS[k],))]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _as_kind(value: Any, kind: type) -> tuple[bool, Any]:
    """``(True, value as a plain kind)`` when ``value`` already is one, else ``(False,
    None)``: bools are not numbers, floats are not ints, text is nothing but text."""
    if kind is type(None):
        return value is None, None
    if isinstance(value, (bool, np.bool_)):
        return (True, bool(value)) if kind is bool else (False, None)
    if kind is int:
        return (True, int(value)) if isinstance(value, (int, np.integer)) else (False, None)
    if kind is float:
        ok = isinstance(value, (int, float, np.integer, np.floating))
        return (True, float(value)) if ok else (False, None)
    if kind is str:
        return (True, value) if isinstance(value, str) else (False, None)
    return False, None


def _whole(n: int) -> str:
    """``"1000000 or 1_000_000"`` for a large int, else the int."""
    return f"{n} or {n:_}" if f"{n:_}" != str(n) else str(n)


def _near(number: float, minimum: int | None) -> int:
    """The whole number nearest ``number``, at least ``minimum``."""
    return max(round(number), minimum) if minimum is not None else round(number)


def _fix(value: Any, kinds: tuple[type, ...], minimum: int | None) -> str:
    """What to write instead of ``value`` (``"; write ..."``), when it can be told."""
    if isinstance(value, str):
        text = value.strip()
        if bool in kinds and text.lower() in (*_TRUE, *_FALSE):
            return f"; write {'true' if text.lower() in _TRUE else 'false'} (a bool, not text)"
        if int not in kinds and float not in kinds:
            return ""
        try:
            number = float(text)
        except ValueError:
            return ""
        if not math.isfinite(number):
            return ""
        why = (f" (YAML reads {text} as text)" if _YAML_EXPONENT.match(text)
               else " (a number, not text)")
        if int in kinds and number.is_integer():
            return f"; write {_whole(int(number))}{why}"
        if float in kinds:
            return f"; write {number!r}{why}"
        return f"; write a whole number, e.g. {_near(number, minimum)}{why}"
    if isinstance(value, (bool, np.bool_)):
        return ""
    if int in kinds and isinstance(value, (float, np.floating)) and math.isfinite(value):
        if float(value).is_integer():
            return f"; write {_whole(int(value))}"
        return f"; write a whole number, e.g. {_near(float(value), minimum)}"
    if bool in kinds and isinstance(value, (int, np.integer)) and value in (0, 1):
        return f"; write {'true' if value else 'false'}"
    return ""


def strict_value(value: Any, kinds: tuple[type, ...], rule: str | None = None,
                 minimum: int | None = None) -> Any:
    """``value`` as the first of ``kinds`` it already is, or a ``ValueError`` with the fix.

    Args:
        value: What the config holds.
        kinds: Accepted kinds, from :data:`KINDS` (``type(None)`` for null); the first
            that ``value`` is wins. A float field takes ints (``1`` is ``1.0``); no field
            takes text for a number or bool, a float for an int, or a bool for a number.
        rule: What the field must be, for the message (default: from ``kinds``).
        minimum: The smallest int the field takes, for the whole number a fractional
            value is told to become.

    Returns:
        The value as a plain Python ``int``, ``float``, ``bool``, ``str`` or None.

    Raises:
        ValueError: ``"must be <rule>[; write <fix>][ (why)]"``.

    Example:
        >>> strict_value("1e6", (int,), rule="a positive int")
        Traceback (most recent call last):
        ...
        ValueError: must be a positive int; write 1000000 or 1_000_000 (YAML reads 1e6 as text)
        >>> strict_value("no", (bool,))
        Traceback (most recent call last):
        ...
        ValueError: must be true or false; write false (a bool, not text)
    """
    for kind in kinds:
        ok, plain = _as_kind(value, kind)
        if ok:
            return plain
    raise ValueError(f"must be {rule or kind_rule(kinds)}{_fix(value, kinds, minimum)}")


def strict(kinds: tuple[type, ...], rule: str | None = None) -> Callable[[Any], Any]:
    """A pydantic before-validator of :func:`strict_value` (run before pydantic's own
    parsing, which would read ``"0.5"`` as a number).

    Example:
        >>> from typing import Annotated
        >>> from pydantic import BeforeValidator, TypeAdapter
        >>> TypeAdapter(Annotated[int, BeforeValidator(strict((int,)))]).validate_python(3)
        3
    """
    def check(value: Any) -> Any:
        return strict_value(value, kinds, rule)
    return check
