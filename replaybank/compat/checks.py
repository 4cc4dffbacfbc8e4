"""The argument checks of the front ends, written once: ints, numbers, flags, types, dicts,
the values a user passes as data (numbers, one number, done flags) and a saved
generator state.

Every front end checks a public call's arguments here before it changes anything, so a
rejected call leaves the buffer (and the dicts it was given) as they were. A message
names the call, the argument, the bad value, the rule and the fix::

    sample(batch_size=0): must be an int >= 1; pass e.g. batch_size=64

What the front ends' reference libraries document differently is a parameter, not a
copy: the error raised for a value of the wrong kind (``kind_error``: an
:class:`~replaybank.errors.ArgumentError`, a ``TypeError`` and a ``ValueError``, by
default; velora raises a :class:`~replaybank.errors.ConfigError` for both) and for one
out of range (``error``), the example in the fix, and the fix itself where the library
says more (``fix``). ``call=None`` names the argument alone (``capacity=0: ...``), as
a constructor whose class the traceback already shows.

The checks of a hot path (``add``, ``sample``) take the plain case first: one ``type``
test before any ``isinstance`` or call.

Example:
    >>> check_int("sample", "batch_size", 32)
    32
    >>> check_number("PERBuffer", "alpha", 0.6, lo=0.0)
    0.6
    >>> try:
    ...     check_number("PERBuffer", "alpha", float("nan"), lo=0.0, example=0.6)
    ... except ConfigError as exc:
    ...     print(exc)
    PERBuffer(alpha=nan): must be a finite number >= 0.0; pass e.g. alpha=0.6
    >>> try:
    ...     check_int("generate_batches", "num_mini_batch", 0)
    ... except ConfigError as exc:
    ...     print(exc)
    generate_batches(num_mini_batch=0): must be an int >= 1; pass e.g. num_mini_batch=1
    >>> done_flag(1.0, "add(done=...)"), flag_values(np.array([0, 1]), "dones").tolist()
    (True, [False, True])
"""

from __future__ import annotations

import math
import numbers as _numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import (
    ArgumentError,
    CheckpointError,
    ConfigError,
    DtypeError,
    ShapeError,
    describe,
)
from replaybank.host import as_numpy
from replaybank.spec import real_array

__all__ = ["check_bool", "check_int", "check_mapping", "check_number", "check_type", "done_flag",
           "flag_values", "host_array", "int_rule", "is_int", "is_real", "numbers", "one_number",
           "saved_generator"]

Array = npt.NDArray[Any]
_BOOLS = (bool, np.bool_)
#: Scalars :func:`one_number` returns as they are.
_SCALARS = frozenset({float, int, bool, np.float32, np.float64, np.int64, np.int32, np.bool_})
#: numpy bit generators whose state a saved state may hold.
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (Python's, numpy's, any ``numbers.Integral``) and
    not a bool.

    Example:
        >>> is_int(3), is_int(np.int64(3)), is_int(True), is_int(3.0)
        (True, True, False, False)
    """
    return type(value) is int or (isinstance(value, _numbers.Integral)
                                  and not isinstance(value, _BOOLS))


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number (any ``numbers.Real``: ints, floats, numpy
    scalars) and not a bool.

    Example:
        >>> is_real(0.5), is_real(np.float32(1)), is_real(False), is_real("1")
        (True, True, False, False)
    """
    return type(value) is float or type(value) is int or (
        isinstance(value, _numbers.Real) and not isinstance(value, _BOOLS))


def _site(call: str | None, name: str, value: Any) -> str:
    """``call(name=value)``, or ``name=value`` without a call."""
    shown = f"{name}={describe(value)}"
    return shown if call is None else f"{call}({shown})"


def int_rule(lo: int | None = 1, hi: int | None = None, allow_float: bool = False) -> str:
    """The rule an int argument breaks, in words (also for pydantic validators).

    Example:
        >>> int_rule(), int_rule(0, 10), int_rule(None), int_rule(1, allow_float=True)
        ('an int >= 1', 'an int from 0 to 10', 'an int', 'a whole number >= 1')
    """
    what = "a whole number" if allow_float else "an int"
    if lo is None:
        return what
    return f"{what} >= {lo}" if hi is None else f"{what} from {lo} to {hi}"


def check_int(call: str | None, name: str, value: Any, lo: int | None = 1,
              hi: int | None = None, *, allow_float: bool = False,
              error: type[Exception] = ConfigError,
              kind_error: type[Exception] = ArgumentError, example: Any = None,
              fix: str | None = None) -> int:
    """An int in ``[lo, hi]`` (``lo=None``: of any sign; with ``allow_float``, also a
    float with no fraction, as pytorchrl's ``n_step (int or float)``).

    Args:
        call: The call, for the message (``"sample"``), or None to name the argument only.
        name: The argument's name (or a longer label, such as ``"load: metadata size"``).
        value: What the caller passed.
        lo: Smallest legal value (None: no bound).
        hi: Largest legal value (None: no bound).
        allow_float: Also accept a float with no fraction.
        error: Raised for an int out of range.
        kind_error: Raised for a value that is not an int (a bool, a float, a string).
        example: A legal value for the fix (default: ``lo``, at least 1; 0 without ``lo``).
        fix: The whole fix, instead of ``pass e.g. {name}={example}``.

    Returns:
        ``value`` as an int.

    Raises:
        ArgumentError: (``kind_error``) Not an int.
        ConfigError: (``error``) Out of range.

    Example:
        >>> check_int(None, "hidden_dim", 0, lo=0), check_int("f", "n", 2.0, allow_float=True)
        (0, 2)
        >>> check_int("warm", "n_samples", 11, 0, 10)
        Traceback (most recent call last):
        ...
        replaybank.errors.ConfigError: warm(n_samples=11): must be an int from 0 to 10; pass e.g. n_samples=1
    """  # noqa: E501
    if type(value) is int and (lo is None or value >= lo) and (hi is None or value <= hi):
        return value
    whole = is_int(value) or (allow_float and isinstance(value, (float, np.floating))
                              and float(value).is_integer())
    if whole and (lo is None or value >= lo) and (hi is None or value <= hi):
        return int(value)
    if fix is None:
        shown = example if example is not None else (0 if lo is None else max(lo, 1))
        fix = f"pass e.g. {name}={shown}"
    raise (error if whole else kind_error)(
        f"{_site(call, name, value)}: must be {int_rule(lo, hi, allow_float)}; {fix}")


def check_number(call: str | None, name: str, value: Any, lo: float = -math.inf,
                 hi: float = math.inf, lo_open: bool = False, *,
                 error: type[Exception] = ConfigError,
                 kind_error: type[Exception] = ArgumentError, example: Any = None) -> float:
    """A finite real number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``).

    Args:
        call: The call, for the message (``"PERBuffer"``), or None.
        name: The argument's name.
        value: What the caller passed.
        lo: Smallest legal value.
        hi: Largest legal value.
        lo_open: ``lo`` itself is not legal.
        error: Raised for a number that is NaN, infinite or out of range.
        kind_error: Raised for a value that is not a real number.
        example: A legal value for the message (default: ``hi`` or ``lo``).

    Returns:
        ``value`` as a float.

    Raises:
        ArgumentError: (``kind_error``) Not a real number (a string, None, a bool, an
            array, ...).
        ConfigError: (``error``) NaN, infinite or out of range.

    Example:
        >>> check_number("discount_cumsum", "discount", "x", kind_error=ConfigError,
        ...              example=0.99)
        Traceback (most recent call last):
        ...
        replaybank.errors.ConfigError: discount_cumsum(discount='x'): must be a finite number, not a str; pass e.g. discount=0.99
    """  # noqa: E501
    shown = example if example is not None else (hi if math.isfinite(hi) else lo)
    if math.isfinite(lo) and math.isfinite(hi):
        rule = f"a number in {'(' if lo_open else '['}{lo}, {hi}]"
    elif math.isfinite(lo):
        rule = f"a finite number {'>' if lo_open else '>='} {lo}"
    else:
        rule = "a finite number"
    if not is_real(value):
        raise kind_error(f"{_site(call, name, value)}: must be {rule}, not a "
                         f"{type(value).__name__}; pass e.g. {name}={shown}")
    x = float(value)
    if not (math.isfinite(x) and lo <= x <= hi) or (lo_open and x == lo):
        raise error(f"{_site(call, name, value)}: must be {rule}; pass e.g. {name}={shown}")
    return x


def check_bool(call: str | None, name: str, value: Any, fix: str = "", *,
               error: type[Exception] = ArgumentError) -> bool:
    """A bool flag (Python's or numpy's).

    Args:
        call: The call, for the message, or None.
        name: The argument's name.
        value: What the caller passed.
        fix: Words after ``must be True or False`` (what each value means).
        error: Raised for a value that is not a bool.

    Raises:
        ArgumentError: (``error``) Not a bool (``"yes"``, None, 1, ...).

    Example:
        >>> check_bool("SequentialBuffer", "validate_keys", "yes")
        Traceback (most recent call last):
        ...
        replaybank.errors.ArgumentError: SequentialBuffer(validate_keys='yes'): must be True or False
    """  # noqa: E501
    if type(value) is bool:
        return value
    if not isinstance(value, np.bool_):
        raise error(f"{_site(call, name, value)}: must be True or False{fix}")
    return bool(value)


def check_type(call: str | None, name: str, value: Any, kind: type | tuple[type, ...],
               expected: str, error: type[Exception] = ArgumentError) -> Any:
    """An argument of a given type (a path, a str key, a Sampler, a dict, ...).

    Args:
        call: The call, for the message, or None.
        name: The argument's name (or a longer label, such as ``"load(...): metadata"``).
        value: What the caller passed.
        kind: The accepted type, or a tuple of them (as ``isinstance`` takes).
        expected: What to pass instead, for the message (``"a folder path (str or
            pathlib.Path)"``).
        error: Raised for a value of another type.

    Returns:
        ``value``, as it is.

    Raises:
        ArgumentError: (``error``) ``value`` is not a ``kind``; the message names the
            call, the argument, the value and what was ``expected``.

    Example:
        >>> check_type("save", "prefix", 3, str, "a string, e.g. prefix='buffer_'")
        Traceback (most recent call last):
        ...
        replaybank.errors.ArgumentError: save(prefix=3): expected a string, e.g. prefix='buffer_'
    """
    if not isinstance(value, kind):
        raise error(f"{_site(call, name, value)}: expected {expected}")
    return value


def check_mapping(call: str | None, name: str, value: Any, what: str) -> Mapping[str, Any]:
    """A dict argument (:func:`check_type` of a ``Mapping``).

    Args:
        call: The call, for the message, or None.
        name: The argument's name.
        value: What the caller passed.
        what: What the dict holds, for the message (``"the step, e.g. {...}"``).

    Raises:
        ArgumentError: ``value`` is not a mapping; the message says what it should hold.

    Example:
        >>> check_mapping("add", "experience", [1], "of numpy arrays")
        Traceback (most recent call last):
        ...
        replaybank.errors.ArgumentError: add(experience=[1]): expected a dict (of numpy arrays)
    """
    return check_type(call, name, value, Mapping, f"a dict ({what})")  # type: ignore[no-any-return]


# ---------------------------------------------------------------------- data values
def host_array(x: Any, what: str) -> Array:
    """``x`` on the host (a torch tensor copied) as a numpy array, through the one ragged
    check (:func:`replaybank.host.as_numpy`) named for the call.

    Args:
        x: What the caller passed (a tensor, array, list or number).
        what: The argument, for the message (``"add(state=...)"``).

    Raises:
        ShapeError: ``x`` is a ragged nest (rows of different lengths), naming ``what``,
            the value, the first unlike row and the fix.

    Example:
        >>> host_array([[1.0, 2.0], [3.0]], "add(state=...)")
        Traceback (most recent call last):
        ...
        replaybank.errors.ShapeError: add(state=...): got [[1.0, 2.0], [3.0]]: a ragged nest, rows of different lengths ([1] has shape (1,) but [0] has shape (2,)); expected one array (at every depth, rows of one length): pass one tensor or array whose rows all have one length
    """  # noqa: E501
    return as_numpy(x, label=lambda: f"{what}: got {describe(x)}",
                    fix="pass one tensor or array whose rows all have one length")


def numbers(x: Any, what: str, fix: str = "pass a tensor or array of numbers") -> Array:
    """``x`` on the host (a torch tensor copied) as a numeric array: bool, int or float.

    The refusals are the core's (:func:`replaybank.spec.real_array`, and the one ragged
    check through :func:`host_array`), named for the call.

    Args:
        x: What the caller passed (a tensor, array, list or number).
        what: The argument, for the message (``"add(state=...)"``).
        fix: The fix, for the message.

    Raises:
        DtypeError: ``x`` is or holds None, strings, objects or complex numbers (numpy
            would turn None into NaN when asked for floats).
        ShapeError: ``x`` is a ragged nest, naming ``what`` (:func:`host_array`).

    Example:
        >>> numbers([1, 2], "x").dtype.kind
        'i'
        >>> numbers(None, "add(state=...)")
        Traceback (most recent call last):
        ...
        replaybank.errors.DtypeError: add(state=...): got None: expected real numbers, got objects of type NoneType; pass a tensor or array of numbers
    """  # noqa: E501
    a = host_array(x, what)
    if a.dtype.kind not in "biuf":
        real_array(a, f"{what}: got {describe(x)}", fix)  # raises, naming what it holds
    return a


def one_number(x: Any, what: str, fix: str = "pass one number") -> Any:
    """One number of ``x``: a Python or numpy scalar as it is, or the value of a
    one-element tensor, array or list as a Python scalar.

    Raises:
        DtypeError: ``x`` is not a number (None, a string, ...).
        ShapeError: ``x`` holds more than one value.

    Example:
        >>> one_number(np.array([[2.5]]), "reward"), one_number(np.float32(1), "reward")
        (2.5, np.float32(1.0))
    """
    if type(x) in _SCALARS:
        return x
    a = numbers(x, what, fix)
    if a.size != 1:
        raise ShapeError(f"{what}: got {describe(x)}, {a.size} values; expected one number "
                         "(a float, or a one-element tensor)")
    return a.reshape(()).item()


def done_flag(x: Any, what: str, fix: str = "pass done=bool(terminated or truncated)") -> bool:
    """One episode end: a bool, or 0/1 (a number, or a one-element tensor or array).

    Args:
        x: What the caller passed.
        what: The argument, for the message (``"add(done=...)"``).
        fix: The fix for a value that is not 0/1.

    Raises:
        DtypeError: Not 0/1 (``"False"``, NaN, 2, 0.5, None, ...).
        ShapeError: More than one value.

    Example:
        >>> done_flag(np.int64(0), "done"), done_flag(True, "done")
        (False, True)
    """
    if type(x) is bool:
        return x
    v = x if type(x) is int or type(x) is float else one_number(
        x, what, "pass done=True or done=False")
    if v != 0 and v != 1:  # NaN compares unequal to both
        raise DtypeError(f"{what}: got {describe(x)}; a done flag is True/False or 0/1; {fix}")
    return bool(v)


def flag_values(a: Array, what: str) -> Array:
    """Numeric ``a`` as bools, every value checked to be 0/1 (bools as they are).

    Raises:
        DtypeError: A value other than 0/1 (NaN, 2, 0.5), or ``a`` holds no numbers.

    Example:
        >>> flag_values(np.array([2.0]), "add_multi(dones=...)")
        Traceback (most recent call last):
        ...
        replaybank.errors.DtypeError: add_multi(dones=...): a done flag is True/False or 0/1, found 2.0; pass dones=terminated | truncated
    """  # noqa: E501
    if a.dtype.kind == "b":
        return a
    if a.dtype.kind not in "iuf":
        raise DtypeError(f"{what}: dtype {a.dtype} holds no flags; pass bools or 0/1 numbers")
    one: Array = np.equal(a, 1)
    ok = one | np.equal(a, 0)
    if not ok.all():
        bad = a[~ok].reshape(-1)[0]
        raise DtypeError(f"{what}: a done flag is True/False or 0/1, found {bad.item()!r}; "
                         "pass dones=terminated | truncated")
    return one


# ---------------------------------------------------------------------- saved state
def saved_generator(state: Any, what: str, fix: str) -> np.random.Generator:
    """A numpy Generator restored from a saved ``bit_generator.state`` dict, checked.

    Args:
        state: The saved state (``rng.bit_generator.state``, maybe damaged).
        what: Where it was found, for the message (``"load_state_dict: _rng"``).
        fix: The fix, for the message.

    Raises:
        CheckpointError: Not the state of one of numpy's bit generators, or a damaged one.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> saved_generator(rng.bit_generator.state, "rng", "").random() == rng.random()
        True
        >>> saved_generator({"bit_generator": "PCG64", "state": 3}, "rng", "pass a saved one")
        Traceback (most recent call last):
        ...
        replaybank.errors.CheckpointError: rng holds a damaged PCG64 state ('int' object is not subscriptable); pass a saved one
    """  # noqa: E501
    name = state.get("bit_generator") if isinstance(state, Mapping) else None
    if name not in _BIT_GENERATORS:
        raise CheckpointError(f"{what}={describe(state)} is not a numpy bit generator state "
                              f"({', '.join(_BIT_GENERATORS)}); {fix}")
    bits = getattr(np.random, name)()
    try:
        bits.state = dict(state)
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        raise CheckpointError(f"{what} holds a damaged {name} state ({exc}); {fix}") from None
    return np.random.Generator(bits)
