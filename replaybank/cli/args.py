"""Argument types of the ``replaybank`` commands: values checked when they are parsed.

Each factory returns an ``argparse`` ``type=`` function that refuses a bad value with
``argparse.ArgumentTypeError``: argparse then prints the usage and ``argument --flag:
'<value>': must be <rule>; pass e.g. --flag <example>`` and the command exits with status
2, before it has read a file or printed anything. Numbers must be finite (``nan`` and
``inf`` parse as floats but are never a scale, a count or a time), and an output file must
be writable where it is to go.

Example:
    >>> import argparse
    >>> p = argparse.ArgumentParser(prog="replaybank bench", exit_on_error=False)
    >>> _ = p.add_argument("--scale", type=positive_float("--scale", "0.1"))
    >>> p.parse_args(["--scale", "0.5"]).scale
    0.5
    >>> try:
    ...     p.parse_args(["--scale", "nan"])
    ... except argparse.ArgumentError as exc:
    ...     print(exc)
    argument --scale: 'nan': must be a finite number > 0; pass e.g. --scale 0.1
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["finite_float", "non_negative_float", "non_negative_int", "positive_float",
           "positive_int", "writable_dir", "writable_file"]


def _refuse(text: str, rule: str, flag: str, example: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{text!r}: must be {rule}; pass e.g. {flag} {example}")


def _float(rule: str, ok: Callable[[float], bool], flag: str, example: str
           ) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise _refuse(text, rule, flag, example) from None
        if not math.isfinite(value) or not ok(value):
            raise _refuse(text, rule, flag, example)
        return value
    parse.__name__ = "number"  # argparse names the type in its own messages
    return parse


def _int(rule: str, minimum: int, flag: str, example: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise _refuse(text, rule, flag, example) from None
        if value < minimum:
            raise _refuse(text, rule, flag, example)
        return value
    parse.__name__ = "int"
    return parse


def positive_float(flag: str, example: str) -> Callable[[str], float]:
    """A finite float > 0 (``--scale``).

    Example:
        >>> positive_float("--scale", "0.1")("0.25")
        0.25
    """
    return _float("a finite number > 0", lambda v: v > 0, flag, example)


def non_negative_float(flag: str, example: str) -> Callable[[str], float]:
    """A finite float >= 0 (a time in seconds, where 0 means every time).

    Example:
        >>> non_negative_float("--progress-every", "5")("0")
        0.0
    """
    return _float("a finite number >= 0", lambda v: v >= 0, flag, example)


def finite_float(flag: str, example: str) -> Callable[[str], float]:
    """Any finite float (a target return may be negative).

    Example:
        >>> finite_float("--target", "475")("-20.5")
        -20.5
    """
    return _float("a finite number", lambda v: True, flag, example)


def positive_int(flag: str, example: str) -> Callable[[str], int]:
    """An int >= 1 (a count of repeats, envs, steps).

    Example:
        >>> positive_int("--repeats", "5")("3")
        3
    """
    return _int("an int >= 1", 1, flag, example)


def non_negative_int(flag: str, example: str) -> Callable[[str], int]:
    """An int >= 0 (a count where 0 turns the thing off).

    Example:
        >>> non_negative_int("--draws", "4096")("0")
        0
    """
    return _int("an int >= 0", 0, flag, example)


def writable_file(flag: str, example: str) -> Callable[[str], Path]:
    """A file path this process can write: not a directory, in an existing directory it
    may write to (the file itself writable if it exists).

    Example:
        >>> try:
        ...     writable_file("--plot", "out.png")("/nonexistent_dir/out.png")
        ... except argparse.ArgumentTypeError as exc:
        ...     print(exc)
        '/nonexistent_dir/out.png': directory /nonexistent_dir does not exist; create it or pass e.g. --plot out.png
    """  # noqa: E501
    def parse(text: str) -> Path:
        path = Path(text)
        folder = path.parent
        if not text or path.is_dir():
            raise argparse.ArgumentTypeError(
                f"{text!r}: is a directory; pass a file name, e.g. {flag} "
                f"{Path(text or '.') / example}")
        if not folder.exists():
            raise argparse.ArgumentTypeError(
                f"{text!r}: directory {folder} does not exist; create it or pass e.g. "
                f"{flag} {example}")
        if not folder.is_dir():
            raise argparse.ArgumentTypeError(
                f"{text!r}: {folder} is not a directory; pass e.g. {flag} {example}")
        target = path if path.exists() else folder
        if not os.access(target, os.W_OK):
            what = "file" if target is path else f"directory {folder}"
            raise argparse.ArgumentTypeError(
                f"{text!r}: the {what} is not writable by this process; pass a writable "
                f"path, e.g. {flag} {example}, or fix its permissions")
        return path
    parse.__name__ = "path"
    return parse


def writable_dir(flag: str, example: str) -> Callable[[str], Path]:
    """A directory this process can write into, or create (with its missing parents): not
    an existing file, under an existing ancestor that is a writable directory.

    Example:
        >>> import tempfile
        >>> writable_dir("--out", "demo_out")(tempfile.mkdtemp() + "/new/out").name
        'out'
        >>> try:
        ...     writable_dir("--out", "demo_out")(__file__)
        ... except argparse.ArgumentTypeError as exc:
        ...     print(str(exc).split(":")[-1].strip())
        is a file; pass a directory, e.g. --out demo_out
    """
    def parse(text: str) -> Path:
        path = Path(text)
        if not text:
            raise argparse.ArgumentTypeError(f"{text!r}: pass a directory, e.g. {flag} "
                                             f"{example}")
        if path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(
                f"{text!r}: is a file; pass a directory, e.g. {flag} {example}")
        ancestor = path
        while not ancestor.exists():  # the nearest part of the path that is there
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise argparse.ArgumentTypeError(
                f"{text!r}: {ancestor} is a file, so the directory cannot be created; pass "
                f"e.g. {flag} {example}")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(
                f"{text!r}: directory {ancestor} is not writable by this process; pass a "
                f"writable path, e.g. {flag} {example}, or fix its permissions")
        return path
    parse.__name__ = "directory"
    return parse
