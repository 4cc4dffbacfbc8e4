"""Field specs and the array-shape conventions of replaybank.

Shape conventions (written once, checked everywhere):

* storage arrays are ``[T, lanes, *field_shape]`` (``T = capacity // num_envs``),
* sampled batches are ``[B, *field_shape]``,
* sampled sequences are ``[B, L, *field_shape]``.

Nested dict values (e.g. goal-conditioned observations) are flattened to ``/``-joined
names: ``{"obs": {"observation": x, "desired_goal": g}}`` becomes the fields
``obs/observation`` and ``obs/desired_goal``.

Dtype inference keeps numpy arrays' dtypes as they are (uint8 stays uint8), in native
byte order (a big-endian ``>f4`` array gives a ``float32`` field). Python scalars and
lists get the usual RL dtypes: ``float -> float32``, ``int -> int64``, ``bool -> bool``;
nothing is silently widened to float64. Fields hold numbers: object, string and datetime
dtypes are refused (:data:`UNSTORABLE_KINDS`), since no checkpoint could hold them.

The rules a field's values obey are methods of :class:`FieldSpec`, each written once and
used by every writer in Python: :meth:`FieldSpec.infer` (the field an example implies),
:meth:`FieldSpec.leading_of` and :meth:`FieldSpec.check_shape` (the shape rule) and
:meth:`FieldSpec.cast` (the casting rules). ``replaybank/_lane.c`` is their compiled
twin for the hot ``add``/``extend``, tested against them.

Example:
    >>> import numpy as np
    >>> spec = Spec.infer({"obs": np.zeros(3, np.float32), "reward": 1.0})
    >>> spec["obs"]
    FieldSpec(name='obs', shape=(3,), dtype=dtype('float32'))
    >>> spec["reward"].dtype
    dtype('float32')
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import DtypeError, ShapeError, SpecError, closest, describe
from replaybank.host import as_numpy, is_tensor

__all__ = ["FIELD_ALIASES", "INFO_FIX", "INFO_NAMES", "QUICK_VALUES", "SEP", "STANDARD", "UNSET",
           "UNSTORABLE_KINDS", "FieldSpec", "Spec",
           "as_array", "assignable_dtypes", "check_tuple", "collect_fields", "flatten",
           "holds_array", "native", "real_array", "real_floats", "rows_array",
           "stored_by_assignment", "tree_map", "unflatten"]

SEP = "/"

#: dtype kinds no field may have (they train but can never be saved): kind -> what it is
UNSTORABLE_KINDS = {"O": "object-dtype", "U": "string (unicode)", "S": "bytes-string",
                    "M": "datetime", "m": "timedelta"}

#: Names other libraries give the standard fields (SB3, gymnasium, D4RL, ...): the
#: name replaybank uses, for the "did you mean" of a refused call or a missing batch field.
FIELD_ALIASES = {
    "observation": "obs", "observations": "obs", "state": "obs", "states": "obs",
    "next_observation": "next_obs", "next_observations": "next_obs", "next_state": "next_obs",
    "next_states": "next_obs", "new_obs": "next_obs", "obs_next": "next_obs",
    "actions": "action", "rewards": "reward", "terminal": "terminated",
    "terminals": "terminated", "terminations": "terminated", "timeout": "truncated",
    "timeouts": "truncated", "truncation": "truncated", "truncations": "truncated",
}

#: Field names under which loops pass gymnasium's ``info`` (SB3's ``infos``), and what to
#: do instead: replaybank stores numeric fields, not the dict as a whole.
INFO_NAMES = frozenset({"info", "infos"})
INFO_FIX = ("a gymnasium info is not stored as a whole: pass the values you need from it as "
            "fields of their own (e.g. is_success=info['is_success']), and a time limit as "
            "truncated=")

#: The standard fields of a step, in the order ``add`` takes them.
STANDARD = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


class _Unset:
    """Marks a standard field the caller did not pass."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


def collect_fields(obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
                   truncated: Any, extras: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of one ``add``/``extend`` call as a dict: the standard fields the
    caller passed (not :data:`UNSET`), then the extras.

    Example:
        >>> sorted(collect_fields(1, UNSET, 0.5, 2, False, UNSET, {"h": 0}))
        ['h', 'next_obs', 'obs', 'reward', 'terminated']
    """
    out: dict[str, Any] = {}  # in STANDARD order, unrolled (every add builds one)
    if obs is not UNSET:
        out["obs"] = obs
    if action is not UNSET:
        out["action"] = action
    if reward is not UNSET:
        out["reward"] = reward
    if next_obs is not UNSET:
        out["next_obs"] = next_obs
    if terminated is not UNSET:
        out["terminated"] = terminated
    if truncated is not UNSET:
        out["truncated"] = truncated
    if extras:
        out.update(extras)
    return out


@dataclass(frozen=True)
class FieldSpec:
    """Per-item shape and dtype of one stored field, and the rules its values obey.

    The rules every writer applies to a value of the field live here, once:

    * :meth:`infer`: the field an example value implies (dtype defaults, leading dims);
    * :meth:`leading_of`: which of a call's allowed leading dims a value carries;
    * :meth:`check_shape`: a value is ``leading + shape``;
    * :meth:`cast`: a value checked and cast to :attr:`dtype` under the casting rules.

    Args:
        name: Flat field name (nested names joined with ``/``).
        shape: Shape of one item, without the time or lane dimensions.
        dtype: Numpy dtype the field is stored with.

    Example:
        >>> FieldSpec("action", (6,), np.dtype("float32")).nbytes
        24
        >>> FieldSpec("action", (), np.int64).cast("action", 2.0).tolist()
        2
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _shape_of(self.name, self.shape))
        object.__setattr__(self, "dtype", _dtype_of(self.name, self.dtype))
        if any(s < 0 for s in self.shape):
            raise SpecError(f"FieldSpec(name={self.name!r}, shape={self.shape}): negative dim")
        if self.dtype.kind in UNSTORABLE_KINDS:
            raise SpecError(
                f"FieldSpec(name={self.name!r}, dtype={self.dtype.str!r}): "
                f"{UNSTORABLE_KINDS[self.dtype.kind]} fields cannot be stored (checkpoints "
                "and memmap files hold numeric arrays only); encode the values as a numeric "
                "array (e.g. token ids or one-hot codes) and declare that dtype"
            )

    @property
    def nbytes(self) -> int:
        """Bytes of one item."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @classmethod
    def infer(cls, name: str, value: Any, leading: tuple[int, ...] = (),
              arg: str | None = None) -> FieldSpec:
        """The field an example value implies: its shape after ``leading``, its dtype
        (arrays keep theirs, in native byte order; Python floats are float32, ints int64).

        Args:
            name: The field's flat name.
            value: An example value ``[*leading, *item_shape]`` (array, scalar, list,
                torch tensor).
            leading: Leading dims to strip (e.g. ``(num_envs,)``).
            arg: How the call names the value, in the errors (``"obs['b']"`` for the
                field ``obs/b`` of a multi-agent buffer); None: ``name``.

        Returns:
            The field spec.

        Raises:
            ShapeError: The value lacks the leading dims.
            DtypeError: The value holds strings, objects or dates (:data:`UNSTORABLE_KINDS`).

        Example:
            >>> FieldSpec.infer("obs", [[1.0, 2.0]], leading=(1,))
            FieldSpec(name='obs', shape=(2,), dtype=dtype('float32'))
        """
        said = name if arg is None else arg
        arr = as_array(value, said)
        if arr.shape[: len(leading)] != leading:
            raise ShapeError(
                f"{said}: shape {arr.shape} does not start with the leading dims {leading}; "
                f"pass values shaped {leading} + item shape"
            )
        # a tensor's dtype is that of its host array (bfloat16: float32, which holds it)
        dtype = arr.dtype if is_tensor(value) else _default_dtype(value)
        if dtype.kind in UNSTORABLE_KINDS:
            raise DtypeError(
                f"{said}={describe(value)}: {UNSTORABLE_KINDS[dtype.kind]} values "
                f"({dtype.str}) cannot be stored (checkpoints and memmap files hold "
                "numeric arrays only); "
                + (INFO_FIX if name.split(SEP, 1)[0] in INFO_NAMES else
                   "pass a number or a numeric array (encode text or objects as numbers, "
                   "e.g. token ids or one-hot codes)")
            )
        return cls(name, arr.shape[len(leading):], native(dtype))

    def leading_of(self, call: str, value: Any, candidates: list[tuple[int, ...]],
                   array: npt.NDArray[Any] | None = None) -> tuple[int, ...]:
        """Which of the allowed leading dims ``value`` carries, told by its ndim.

        Args:
            call: The call, for the message (``"add"``, ``"extend"``: its step dim is
                shown as ``T``).
            value: The user's value ``[*leading, *shape]``.
            candidates: The leading dims the call allows, e.g. ``[(), (1,)]``.
            array: ``value`` already turned into an array (:func:`as_array`), if it was.

        Returns:
            The first candidate whose length plus ``len(shape)`` is the value's ndim.

        Raises:
            ShapeError: No candidate fits, naming the shapes that would.

        Example:
            >>> FieldSpec("obs", (3,), np.float32).leading_of("add", np.zeros((4, 3)),
            ...                                               [(), (4,)])
            (4,)
        """
        arr = as_array(value, self.name) if array is None else array
        for lead in candidates:
            if arr.ndim == len(lead) + len(self.shape):
                return lead
        if call == "extend":  # the step dim is free: show it as T
            shapes = ["(" + ", ".join(["T", *map(str, lead[1:] + self.shape)]) + ")"
                      for lead in candidates]
        else:
            shapes = [str(lead + self.shape) for lead in candidates]
        raise ShapeError(
            f"{call}: {self.name}={describe(value)}: expected one of the shapes "
            f"{', '.join(shapes)} "
            "(leading dims + field shape); reshape the value or check num_envs / env_ids"
        ) from None

    def check_shape(self, arg: str, value: Any, leading: tuple[int, ...] = (),
                    shape: tuple[int, ...] | None = None) -> None:
        """The shape rule: a value of this field is ``[*leading, *shape]``.

        Args:
            arg: Name of the argument, for the message (e.g. ``"next_obs/pos"``).
            value: The user's value (what the message shows).
            leading: The expected leading dims, e.g. ``()``, ``(num_envs,)`` or
                ``(T, num_envs)``.
            shape: The value's shape, when known (else that of ``as_array(value)``).

        Raises:
            ShapeError: Another shape.

        Example:
            >>> FieldSpec("obs", (3,), np.float32).check_shape("obs", np.zeros((2, 3)), (2,))
            >>> FieldSpec("obs", (3,), np.float32).check_shape("obs", np.zeros(2))
            Traceback (most recent call last):
            ...
            replaybank.errors.ShapeError: obs=array(shape=(2,), dtype=float64): expected shape (3,) (leading dims () + field shape (3,)); reshape the value or check num_envs / the number of steps
        """  # noqa: E501
        expected = leading + self.shape
        if (as_array(value, arg).shape if shape is None else shape) != expected:
            raise ShapeError(
                f"{arg}={describe(value)}: expected shape {expected} "
                f"(leading dims {leading} + field shape {self.shape}); "
                "reshape the value or check num_envs / the number of steps"
            )

    def stores_as_is(self, value: Any) -> bool:
        """Whether :meth:`cast` (no leading dims) returns ``value`` itself with nothing
        to check: a numpy array (not a subclass) of exactly this field's shape and dtype,
        bools as canonical 0/1 bytes. Every rule of the field accepts such a value, also
        as one row of a ``[n, *shape]`` array whose other rows are zeros.

        A cheap test (no conversion, no message) for a caller that only needs to know
        that a value passes, such as a collector checking each env's observation as it
        arrives; False says only that :meth:`cast` must judge the value.

        Example:
            >>> f = FieldSpec("obs", (3,), np.float32)
            >>> f.stores_as_is(np.zeros(3, np.float32)), f.stores_as_is(np.zeros(3))
            (True, False)
        """
        if type(value) is not np.ndarray or value.shape != self.shape:
            return False
        src, dst = value.dtype, self.dtype
        return (src is dst or src == dst) and (dst.kind != "b" or _canonical_bools(value))

    def cast(self, arg: str, value: Any, leading: tuple[int, ...] = (),
             array: npt.NDArray[Any] | None = None) -> npt.NDArray[Any]:
        """Check one value against the field and cast it to the field's dtype.

        The casting rules: a value of another dtype is accepted when numpy casts it within
        its kind (float64 to float32, int to float); an integer or bool field takes
        floats and ints whose values are integral, finite and in range (checked exactly,
        so ``2.0**63`` does not fit int64), a bool field 0/1 values only; strings,
        objects, dates and complex values into real fields are refused. Bool values are
        stored as canonical 0/1 bytes.

        Args:
            arg: Name of the argument, for the message (e.g. ``"obs/observation"``).
            value: The user's value ``[*leading, *shape]`` (array, scalar, list, torch
                tensor).
            leading: The expected leading dims, e.g. ``()``, ``(num_envs,)`` or
                ``(T, num_envs)``.
            array: ``value`` already turned into an array (:func:`as_array`), if it was.

        Returns:
            An array ``[*leading, *shape]`` of the field's dtype (``value`` itself, no
            copy, when it already matches).

        Raises:
            ShapeError: Wrong shape (:meth:`check_shape`).
            DtypeError: The value breaks a casting rule, naming it and the fix.

        Example:
            >>> f = FieldSpec("action", (), np.int64)
            >>> f.cast("action", 2.0).dtype
            dtype('int64')
            >>> f.cast("action", float("nan"))
            Traceback (most recent call last):
            ...
            replaybank.errors.DtypeError: action=nan: field 'action' is int64 and needs finite integral values (found NaN, inf or a fraction); round or fix the value, or declare the field as float
        """  # noqa: E501
        if type(value) is np.ndarray:
            arr = value
        elif array is None:
            arr = as_array(value, arg)
        else:  # converted by the caller: the tuple rule still holds
            if type(value) is tuple or type(value) is list:
                check_tuple(arg, value)
            arr = array
        if arr.shape != leading + self.shape:
            self.check_shape(arg, value, leading, arr.shape)
        src, dst = arr.dtype, self.dtype
        if (src is dst or src == dst) and (dst.kind != "b" or _canonical_bools(arr)):
            return arr
        rule = _RULES.get((src, dst))
        if rule is None:
            rule = _DtypeRule.of(src, dst)
        return rule.apply(self, arg, value, arr)

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-able description ``{"shape": [...], "dtype": "float32"}``.

        Non-native byte orders and void dtypes keep their full ``dtype.str`` (``">i4"``),
        so ``from_json(to_json())`` gives back the identical dtype.

        Example:
            >>> FieldSpec("x", (2,), np.dtype(">i4")).to_json()
            {'shape': [2], 'dtype': '>i4'}
            >>> FieldSpec.from_json("x", {"shape": [2], "dtype": ">i4"}).dtype.str
            '>i4'
        """
        exact = self.dtype.kind == "V" or not self.dtype.isnative
        return {"shape": list(self.shape), "dtype": self.dtype.str if exact else self.dtype.name}

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> FieldSpec:
        """Inverse of :meth:`to_json`."""
        return cls(name, tuple(data["shape"]), np.dtype(data["dtype"]))


# ---------------------------------------------------------------- the casting rules
# FieldSpec.cast decides once per (value dtype, field dtype) which of the checks below a
# value needs (a _DtypeRule), then runs them. Up to _SMALL values of a plain int or float
# array are checked as Python numbers (fewer steps than numpy's reductions); a value
# that fails there is checked again by the numpy checks, which raise the error.

_SMALL = 64
#: The most values a casting rule checks as Python numbers (:data:`_SMALL`, public for
#: writers that make the same 0/1 check inline).
QUICK_VALUES = _SMALL


def _canonical_bools(arr: npt.NDArray[Any]) -> bool:
    """Whether every byte of the bool array ``arr`` is 0 or 1."""
    if arr.size <= 4096:
        return not arr.tobytes().translate(None, b"\x00\x01")
    return int(arr.view(np.uint8).max()) <= 1


class _DtypeRule:
    """The checks a value of dtype ``src`` needs to become a field's dtype ``dst`` (two
    different dtypes), decided once (:meth:`of`) and applied to each value (:meth:`apply`).

    Attributes:
        refuse: Why every value is refused (``"data"``: strings, objects, dates;
            ``"kind"``: no same-kind cast, e.g. complex to float), else None.
        canonical: Bool values: bytes other than 0/1 become canonical first.
        integral: Floats (or complex) into an integer or bool field: finite integral
            values only (complex values never are).
        zero_one: Into a bool field: 0/1 values only.
        bounds: Into an integer field: ``(min, max, float or int)``, the exact range and
            the Python type the values' extremes are compared as.
        quick: The checks on at most ``_SMALL`` values as Python numbers (None: none).
        plain: No check at all (``astype`` only).
    """

    __slots__ = ("bounds", "canonical", "dst", "integral", "plain", "quick", "refuse", "src",
                 "zero_one")

    def __init__(self, src: np.dtype[Any], dst: np.dtype[Any]) -> None:
        s, d = src.kind, dst.kind
        self.src, self.dst = src, dst
        self.refuse: str | None = None
        self.canonical = s == "b"
        self.integral = d in "iub" and s in "fc"
        self.zero_one = False
        self.bounds: tuple[int, int, type] | None = None
        if s in UNSTORABLE_KINDS:
            self.refuse = "data"
        elif not (self.integral or (d in "iu" and s == "b") or (d in "biu" and s in "iu")) \
                and not np.can_cast(src, dst, casting="same_kind"):
            self.refuse = "kind"
        elif d == "b":
            self.zero_one = True
        elif d in "iu" and s in "iuf":
            info = np.iinfo(dst)
            self.bounds = (int(info.min), int(info.max), float if s == "f" else int)
        self.quick: Callable[[list[Any]], bool] | None = None
        if self.refuse is None and (s in "iu" or (s == "f" and src.itemsize <= 8)):
            if d == "b":
                self.quick = _small_floats_0_1 if s == "f" else _small_ints_0_1
            elif self.bounds is not None:
                self.quick = partial(_small_floats_in if s == "f" else _small_ints_in,
                                     *self.bounds[:2])
        self.plain = not (self.refuse or self.canonical or self.integral or self.zero_one
                          or self.bounds)

    @staticmethod
    def of(src: np.dtype[Any], dst: np.dtype[Any]) -> _DtypeRule:
        """The rule of ``src`` into ``dst`` (kept for the dtype pairs in use)."""
        if len(_RULES) > 1024:
            _RULES.clear()
        rule = _RULES[(src, dst)] = _DtypeRule(src, dst)
        return rule

    def apply(self, field: FieldSpec, arg: str, value: Any,
              arr: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """``arr`` (``value`` as an array of the field's shape) cast to the field's dtype.

        Raises:
            DtypeError: A broken rule, naming ``arg``, the value and the fix.
        """
        dst = self.dst
        if self.plain:
            return arr.astype(dst, copy=False)
        quick = self.quick
        if quick is not None and arr.size <= _SMALL and quick(arr.reshape(-1).tolist()):
            return arr.astype(dst, copy=False)
        if self.refuse == "data":
            what = ("not a number numpy can convert exactly (e.g. an int beyond 64 bits, "
                    "None or mixed types)") if self.src.kind == "O" \
                else f"{UNSTORABLE_KINDS[self.src.kind]} data"
            raise DtypeError(
                f"{arg}={describe(value)}: field {field.name!r} is {dst.name} but the value "
                f"is {what}; convert the value to a number or a numeric array of dtype "
                f"{dst.name}"
            )
        if self.canonical and arr.size and int(arr.view(np.uint8).max()) > 1:
            arr = arr.view(np.uint8) != 0  # a bool byte other than 0/1: store canonical 0/1
        if self.integral and self.src.kind == "c":
            raise DtypeError(
                f"{arg}={_shown(value, arr)}: field {field.name!r} is {dst.name} and takes "
                "real numbers, got complex numbers (numpy would drop the imaginary part); "
                "pass real values, e.g. x.real or np.abs(x)"
            )
        if self.integral and (not np.all(np.isfinite(arr))
                              or not np.all(arr == np.round(arr))):
            raise DtypeError(
                f"{arg}={_shown(value, arr)}: field {field.name!r} is {dst.name} and needs "
                "finite integral values (found NaN, inf or a fraction); round or fix the "
                "value, or declare the field as float"
            )
        if self.refuse == "kind":
            raise DtypeError(
                f"{arg}={describe(value)}: cannot cast {self.src.name} to field "
                f"{field.name!r} of dtype {dst.name} safely (same kind); convert the value "
                "or declare the field's dtype"
            )
        if self.zero_one and not np.all((arr == 0) | (arr == 1)):
            raise DtypeError(
                f"{arg}={_shown(value, arr)}: field {field.name!r} is bool and only accepts "
                "0/1 or True/False values; pass a bool (e.g. terminated=bool(x))"
            )
        if self.bounds is not None and arr.size:
            # exact bounds: Python compares int with int and float with int exactly (numpy
            # would round int64's max to 2.0**63 and let 2.0**63 through)
            lo, hi, to_py = self.bounds
            if to_py(arr.min()) < lo or to_py(arr.max()) > hi:
                raise DtypeError(
                    f"{arg}={_shown(value, arr)}: values from {arr.min()} to {arr.max()} do "
                    f"not fit field {field.name!r} ({dst.name}, range [{lo}, {hi}]); clip "
                    "the value or declare a wider dtype"
                )
        return arr.astype(dst, copy=False)


def _small_floats_in(lo: int, hi: int, vals: list[float]) -> bool:
    # a loop, not all() over a generator: fewer steps for the one value of a scalar;
    # Python floats compare exactly with ints
    for v in vals:  # noqa: SIM110
        if not (v.is_integer() and lo <= v <= hi):
            return False
    return True


def _small_ints_in(lo: int, hi: int, vals: list[int]) -> bool:
    return not vals or (min(vals) >= lo and max(vals) <= hi)


def _small_floats_0_1(vals: list[float]) -> bool:
    # 0.0 and 1.0 are the only finite integral values a bool field takes
    return all(v == 0.0 or v == 1.0 for v in vals)


def _small_ints_0_1(vals: list[int]) -> bool:
    return vals.count(0) + vals.count(1) == len(vals)  # (fewer steps than a set)


def _shown(value: Any, arr: npt.NDArray[Any]) -> Any:
    """A refused value in a message: its values when it has a few (a list or tuple as the
    user wrote it, not as numpy converted its items), else its description."""
    return describe(value) if arr.size > 4 or isinstance(value, (list, tuple)) \
        else arr.tolist()


#: The rule of each (value dtype, field dtype) pair met so far.
_RULES: dict[tuple[np.dtype[Any], np.dtype[Any]], _DtypeRule] = {}


def stored_by_assignment(arr: npt.NDArray[Any], dst: np.dtype[Any]) -> bool:
    """Whether :meth:`FieldSpec.cast` would store ``arr`` (the field's shape, another
    dtype than the field's ``dst``) as ``arr.astype(dst)`` without an error: its casting
    rule checks nothing, or the rule's check of at most :data:`QUICK_VALUES` values as
    Python numbers passes. Assigning ``arr`` into an array of ``dst`` then stores what the
    cast would. False when the rule is not made yet (the first cast of this pair makes
    it) or must look closer: cast the value then.

    Example:
        >>> f = FieldSpec("action", (2,), np.int64)
        >>> _ = f.cast("action", np.array([1.0, 2.0]))  # the rule of float64 -> int64
        >>> stored_by_assignment(np.array([1.0, 2.0]), f.dtype)
        True
        >>> stored_by_assignment(np.array([1.5, 2.0]), f.dtype)  # the cast would raise
        False
    """
    rule = _RULES.get((arr.dtype, dst))
    if rule is None:
        return False
    if rule.plain:
        return True
    quick = rule.quick
    return quick is not None and arr.size <= _SMALL and quick(arr.reshape(-1).tolist())


def assignable_dtypes(dst: np.dtype[Any]) -> frozenset[np.dtype[Any]]:
    """The numeric dtypes whose arrays a field of dtype ``dst`` takes by assignment with
    no look at their values (its casting rule checks nothing), and for a bool field the
    integer dtypes (their rule's only check: 0/1 values, which the caller makes).

    Example:
        >>> np.dtype(np.float64) in assignable_dtypes(np.dtype(np.float32))
        True
        >>> np.dtype(np.float64) in assignable_dtypes(np.dtype(np.int64))  # checked
        False
        >>> sorted(d.str for d in assignable_dtypes(np.dtype(bool)))[:2]
        ['<i2', '<i4']
    """
    srcs = [np.dtype(c) for c in "bBhHiIlLqQefd"]
    if dst.kind == "b":
        return frozenset(src for src in srcs if src.kind in "iu")
    return frozenset(src for src in srcs if src != dst and _DtypeRule(src, dst).plain)


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to ``/``-joined keys.

    Args:
        values: A mapping whose values may be mappings themselves.
        prefix: Prefix for every key (used in recursion).

    Returns:
        A flat dict.

    Example:
        >>> flatten({"obs": {"a": 1, "b": {"c": 2}}, "r": 3})
        {'obs/a': 1, 'obs/b/c': 2, 'r': 3}
        >>> flatten(flatten({"obs": {"a": 1}}))
        {'obs/a': 1}
    """
    out: dict[str, Any] = {}
    for key, value in values.items():
        # already-flat names ("obs/goal") pass through, so flatten is idempotent
        if not (type(key) is str and key in _GOOD_NAMES) and not _good_name(key):
            raise SpecError(
                f"field name {key!r}: names must be non-empty strings (nested levels "
                f"joined by {SEP!r} must be non-empty too); rename the field"
            )
        name = f"{prefix}{SEP}{key}" if prefix else key
        if type(value) not in _LEAF_TYPES and isinstance(value, Mapping):
            if not value:
                raise SpecError(f"field {name!r}: empty dict; "
                                + (INFO_FIX if key in INFO_NAMES and not prefix
                                   else "give at least one sub-field"))
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def tree_map(fn: Callable[[Any], Any], value: Any) -> Any:
    """``fn`` of every leaf of ``value``: a dict (a dict observation) is walked, nested
    dicts too, and rebuilt with the same keys; anything else is a leaf.

    Only ``dict`` (and its subclasses) is walked, not every ``Mapping``: a leaf that is a
    mapping of another kind is given to ``fn`` whole.

    Args:
        fn: Applied to each leaf.
        value: A leaf or a nested dict of leaves.

    Returns:
        ``fn(value)`` for a leaf, else a new dict of the mapped entries (nested alike).

    Example:
        >>> tree_map(len, {"a": [1, 2], "b": {"c": [3]}})
        {'a': 2, 'b': {'c': 1}}
        >>> tree_map(abs, -3)
        3
    """
    if isinstance(value, dict):
        return {k: tree_map(fn, v) for k, v in value.items()}
    return fn(value)


#: Field names already found valid by :func:`flatten` (every add passes the same few).
_GOOD_NAMES: set[str] = set()

#: Exact types of values that are never mappings (checked before the slower
#: ``isinstance(value, Mapping)``).
_LEAF_TYPES = frozenset({np.ndarray, float, int, bool, complex, list, tuple, str, bytes,
                         type(None), *(t for t in np.sctypeDict.values()
                                       if isinstance(t, type) and issubclass(t, np.generic))})


def _good_name(key: Any) -> bool:
    """A field name: a non-empty string whose ``/``-separated levels are non-empty."""
    if not isinstance(key, str) or not key or "" in key.split(SEP):
        return False
    if type(key) is str and len(_GOOD_NAMES) < 4096:
        _GOOD_NAMES.add(key)
    return True


def unflatten(values: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`flatten`.

    Example:
        >>> unflatten({"obs/a": 1, "obs/b/c": 2, "r": 3})
        {'obs': {'a': 1, 'b': {'c': 2}}, 'r': 3}
    """
    out: dict[str, Any] = {}
    for name, value in values.items():
        parts = name.split(SEP)
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _default_dtype(value: Any) -> np.dtype[Any]:
    """Dtype for a value: arrays keep theirs, Python numbers get RL defaults."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and not isinstance(value, (list, tuple)):
        try:
            return np.dtype(dtype)  # type: ignore[no-any-return]
        except TypeError:  # e.g. a torch dtype
            return np.dtype(str(dtype).replace("torch.", ""))
    arr = np.asarray(value)
    if arr.dtype == np.float64:
        return np.dtype(np.float32)
    if arr.dtype.kind in "iu":
        return np.dtype(np.int64)
    return arr.dtype


def native(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """``dtype`` in native byte order (an inferred field stores values, not byte orders:
    a big-endian ``>f4`` array is stored as ``float32`` and every writer takes it).

    Example:
        >>> native(np.dtype(">f4")).str == np.dtype(np.float32).str
        True
    """
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def as_array(value: Any, arg: str | None = None) -> npt.NDArray[Any]:
    """Turn an input value (array, scalar, list, torch tensor) into a numpy array.

    numpy arrays (subclasses too) come back as they are; everything else goes through
    :func:`replaybank.host.as_numpy` (a torch tensor on any device becomes a host array;
    one with nothing numpy can show raises a ``DtypeError`` naming ``arg``). A tuple
    given as the value of ``arg``, or a list of them (one per step or env), obeys the
    tuple rule first (:func:`check_tuple`).

    Example:
        >>> as_array([1.0, 2.0]).shape
        (2,)
    """
    if type(value) is np.ndarray or isinstance(value, np.ndarray):
        return value
    if (type(value) is tuple or type(value) is list) and arg is not None:
        check_tuple(arg, value)
    return as_numpy(value, arg)  # a torch tensor on any device: see replaybank.host


# ---------------------------------------------------------------- the tuple rule
def check_tuple(arg: str, value: tuple[Any, ...] | list[Any], fix: str | None = None) -> None:
    """The tuple rule of the add boundary: a tuple that holds arrays is a structured
    value, which numpy would stack part-first (alone, or as the items of a list).

    A gymnasium ``Tuple`` space's value is a tuple; a vector env's is a tuple of arrays
    ``[num_envs]``, one per component, so ``np.asarray`` would make the component axis
    the env axis and store each lane's values in another lane. A tuple that holds an
    array or tensor with at least one dim (at any depth) is refused in every field:
    pass the dict ``{'0': v[0], '1': v[1], ...}`` (the fields ``obs/0``, ``obs/1``, ...
    that :func:`replaybank.collect` stores a Tuple space as). A tuple of numbers (or of
    lists of numbers) reads as a list does: it holds one value per env
    (``action=(0, 1, 2)``) or one item (a single env's ``Tuple(Discrete, Discrete)``
    value stacks to a vector), never parts on the env axis. A list whose items are
    such tuples (or lists of them), as ``extend(obs=[(a0, b0), (a1, b1), ...])`` gives one
    per step, is refused alike: numpy would make the parts an axis of each step (with a
    vector env's parts ``[num_envs]``, the env axis). Its fix is the dict of one
    sequence per part, ``{'0': [v[0] for v in obs], ...}``. A list of numbers (or of
    arrays) is never walked past its first item. The compiled
    writer takes nests of numbers only, so such a value always reaches this rule,
    whichever writer runs.

    Args:
        arg: The argument, as the call names it (``"obs"``, ``"next_obs/pos"``,
            ``"action"``).
        value: The tuple passed, or a list (checked for items that are such tuples).
        fix: What to pass instead, for a front end whose fields are fixed arrays (None:
            the dict of parts, which the core buffers store as fields ``arg/0``, ...).

    Raises:
        ShapeError: The tuple (or a tuple item of the list) holds an array or tensor,
            naming ``arg``, the tuple and the dict to pass.

    Example:
        >>> check_tuple("action", (0, 1, 2))  # one action per env: taken as a list
        >>> check_tuple("obs", (np.zeros(2), np.ones(2)))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        replaybank.errors.ShapeError: obs=(array(shape=(2,), dtype=float64), ...): a tuple holding arrays is ...
        >>> check_tuple("obs", [(np.zeros(2), np.ones(2))] * 4)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        replaybank.errors.ShapeError: obs=[4 items: (array(shape=(2,), dtype=float64), ...), ...]: its items (one per step or env) are tuples holding arrays, ...
    """  # noqa: E501
    if isinstance(value, tuple):
        if not holds_array(value):
            return
        item = value
    else:
        found = _tuple_item(value)
        if found is None:
            return
        item = found
    n = len(item)
    more = ", ..." if n > 3 else ""
    shown = "(" + ", ".join(describe(v) for v in item[:3]) + more + ")"
    name = arg if SEP not in arg else "v"
    if item is value:
        parts = ", ".join(f"'{i}': {name}[{i}]" for i in range(min(n, 3))) + more
        what, source = "a tuple holding arrays is", "the tuple v"
    else:
        parts = ", ".join(f"'{i}': [s[{i}] for s in {name}]" for i in range(min(n, 3))) + more
        shown = f"[{len(value)} items: {shown}, ...]"
        what, source = "its items (one per step or env) are tuples holding arrays, each", "v"
    target = f"{arg}={{{parts}}}" if name == arg else f"{{{parts}}} in place of {source}"
    field = arg.removeprefix("next_")  # (a next observation is stored as its obs field)
    fields = ", ".join(f"{field}{SEP}{i}" for i in range(min(n, 3))) + more
    if fix is None:
        fix = (f"Pass its parts as a dict, {target} (stored as the fields {fields}, as "
               "rb.collect stores a Tuple space); values of several envs go in an array or "
               "a list (one entry per env), not a tuple")
    raise ShapeError(
        f"{arg}={shown}: {what} a structured value (a gymnasium Tuple "
        "space's, a recurrent state (h, c)), which numpy would stack part-first: with "
        f"several envs each lane would store other envs' values. {fix}")


def _tuple_item(value: list[Any]) -> tuple[Any, ...] | None:
    """The first item of ``value`` (at any depth of lists) that is a tuple holding an
    array or tensor, or None. A list whose first item is neither a tuple nor a list (a
    list of numbers or of arrays, the common inputs) is not walked further: one look."""
    if not value or not (type(value[0]) is tuple or type(value[0]) is list):
        return None
    for item in value:
        if type(item) is tuple:
            if holds_array(item):
                return item
        elif type(item) is list:
            found = _tuple_item(item)
            if found is not None:
                return found
    return None


def holds_array(value: tuple[Any, ...] | list[Any]) -> bool:
    """Whether ``value`` holds, at any depth of tuples and lists, an array or tensor with
    at least one dim: the tuples :func:`check_tuple` refuses.

    Example:
        >>> holds_array((np.zeros(2), np.ones(3))), holds_array((0, 1.5))
        (True, False)
    """
    for item in value:
        if type(item) is tuple or type(item) is list:
            if holds_array(item):
                return True
        elif isinstance(item, np.ndarray):
            if item.ndim:
                return True
        elif is_tensor(item) and item.dim():
            return True
    return False


class Spec(Mapping[str, FieldSpec]):
    """An ordered set of :class:`FieldSpec` keyed by flat field name.

    Args:
        fields: The field specs, in storage order.

    Example:
        >>> spec = Spec([FieldSpec("obs", (4,), np.float32)])
        >>> list(spec), spec.nbytes_per_item
        (['obs'], 16)
    """

    def __init__(self, fields: Any = ()) -> None:
        self._fields: dict[str, FieldSpec] = {}
        for f in fields:
            if f.name in self._fields:
                raise SpecError(f"field {f.name!r} given twice; give each field once")
            self._fields[f.name] = f

    def __getitem__(self, name: str) -> FieldSpec:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Spec):
            return NotImplemented
        return list(self._fields.values()) == list(other._fields.values())

    def __hash__(self) -> int:
        return hash(tuple(self._fields.values()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}: {f.dtype.name}{list(f.shape)}" for n, f in self._fields.items())
        return f"Spec({inner})"

    @property
    def nbytes_per_item(self) -> int:
        """Bytes of one item of every field together."""
        return sum(f.nbytes for f in self._fields.values())

    def with_fields(self, extra: Any) -> Spec:
        """Return a new spec with ``extra`` field specs appended."""
        return Spec([*self._fields.values(), *extra])

    def to_json(self) -> dict[str, Any]:
        """JSON-able form: ``{name: {"shape": [...], "dtype": ...}}`` in order."""
        return {n: f.to_json() for n, f in self._fields.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Spec:
        """Inverse of :meth:`to_json`."""
        return cls(FieldSpec.from_json(n, d) for n, d in data.items())

    @classmethod
    def coerce(cls, spec: Any) -> Spec:
        """Build a spec from a Spec, ``{name: (shape, dtype)}`` or ``{name: {"shape", "dtype"}}``.

        Nested dicts of such entries are flattened.

        Example:
            >>> Spec.coerce({"obs": ((3,), "uint8")})["obs"].dtype
            dtype('uint8')
        """
        if isinstance(spec, Spec):
            return spec
        if not isinstance(spec, Mapping):
            raise SpecError(
                f"spec={describe(spec)}: expected a Spec or a dict "
                "{name: (shape, dtype)}; build one with replaybank.Spec"
            )
        fields = []
        for name, entry in _flatten_spec(spec).items():
            if isinstance(entry, FieldSpec):
                fields.append(FieldSpec(name, entry.shape, entry.dtype))
            elif isinstance(entry, Mapping):
                fields.append(_field_from_mapping(name, entry))
            elif isinstance(entry, (tuple, list)) and len(entry) == 2:
                fields.append(FieldSpec(name, entry[0], entry[1]))
            else:
                raise SpecError(
                    f"spec[{name!r}]={describe(entry)}: expected (shape, dtype) or "
                    '{"shape": ..., "dtype": ...}'
                )
        return cls(fields)

    @classmethod
    def infer(cls, values: Mapping[str, Any], leading: tuple[int, ...] = ()) -> Spec:
        """Infer a spec from (flat or nested) example values.

        Args:
            values: Example values of one add.
            leading: Leading dims to strip from every value (e.g. ``(num_envs,)``).

        Returns:
            The inferred spec.

        Raises:
            ShapeError: If a value lacks the leading dims.
            DtypeError: If a value holds strings, objects or dates
                (:meth:`FieldSpec.infer`, one field each).
        """
        return cls(FieldSpec.infer(name, value, leading)
                   for name, value in flatten(values).items())


def _shape_of(name: str, shape: Any) -> tuple[int, ...]:
    """A field's ``shape`` as a tuple of ints (one int: a 1-D shape, as numpy reads it)."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        return (int(shape),)
    try:
        if isinstance(shape, (str, bytes, Mapping)):
            raise TypeError
        return tuple(operator.index(s) for s in shape)
    except TypeError:
        raise SpecError(f"FieldSpec(name={name!r}, shape={describe(shape)}): expected a tuple "
                        "of ints, e.g. shape=(3,) (or () for one number per step)") from None


#: The dtype names numpy reads (for a "did you mean" when one is misspelt).
_DTYPE_NAMES = sorted({k for k in np.sctypeDict if isinstance(k, str) and len(k) > 2})


def _dtype_of(name: str, dtype: Any) -> np.dtype[Any]:
    """A field's ``dtype`` as numpy reads it, or a SpecError naming the value."""
    try:
        out: np.dtype[Any] = np.dtype(dtype)
    except TypeError:
        near = closest(dtype, _DTYPE_NAMES) if isinstance(dtype, str) else None
        meant = f" (did you mean {near!r}?)" if near else ""
        raise SpecError(f"FieldSpec(name={name!r}, dtype={describe(dtype)}): not a dtype "
                        f"numpy knows{meant}; pass e.g. dtype='float32'") from None
    return out


#: The keys of a field written as a mapping, ``{"shape": ..., "dtype": ...}``.
_FIELD_KEYS = ("shape", "dtype")


def _is_field_mapping(entry: Mapping[str, Any]) -> bool:
    """Whether ``entry`` is one field written as a mapping (its ``shape`` ints or its
    ``dtype`` not a spec entry), not a nested group whose fields include one named
    ``shape`` or ``dtype``: so a misspelt or extra key is refused, not read as a field."""
    shape = entry.get("shape")
    if "shape" in entry and (isinstance(shape, (int, np.integer)) or (
            isinstance(shape, (tuple, list))
            and all(isinstance(s, (int, np.integer)) for s in shape))):
        return True
    return "dtype" in entry and not isinstance(entry["dtype"], (Mapping, FieldSpec, tuple,
                                                                 list))


def _field_from_mapping(name: str, entry: Mapping[str, Any]) -> FieldSpec:
    """The field ``name`` written as ``{"shape": ..., "dtype": ...}``: exactly those keys."""
    unknown = [k for k in entry if k not in _FIELD_KEYS]
    missing = [k for k in _FIELD_KEYS if k not in entry]
    if unknown or missing:
        parts = []
        for k in unknown:
            near = closest(str(k), [m for m in _FIELD_KEYS if m not in entry]) \
                if isinstance(k, str) else None
            parts.append(f"unknown key {k!r}" + (f" (did you mean {near!r}?)" if near else ""))
        parts += [f"no {k!r}" for k in missing if not any(
            closest(str(u), [k]) for u in unknown)]
        raise SpecError(f"spec[{name!r}]={describe(dict(entry))}: {'; '.join(parts)}; a field "
                        'is {"shape": [3], "dtype": "float32"}, with exactly those keys')
    return FieldSpec(name, entry["shape"], entry["dtype"])


def _flatten_spec(spec: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, entry in spec.items():
        name = f"{prefix}{SEP}{key}" if prefix else str(key)
        is_leaf = isinstance(entry, (FieldSpec, tuple, list)) or (
            isinstance(entry, Mapping) and _is_field_mapping(entry)
        )
        if is_leaf:
            out[name] = entry
        elif isinstance(entry, Mapping):
            out.update(_flatten_spec(entry, name))
        else:
            raise SpecError(f"spec[{name!r}]={describe(entry)}: expected (shape, dtype)")
    return out


def cast_field(
    arg: str, value: Any, field: FieldSpec, leading: tuple[int, ...]
) -> npt.NDArray[Any]:
    """``field.cast(arg, value, leading)``: see :meth:`FieldSpec.cast`, which holds the
    casting rules (kept for the callers that name the function).

    Example:
        >>> f = FieldSpec("action", (), np.int64)
        >>> cast_field("action", 2.0, f, ()).dtype
        dtype('int64')
        >>> cast_field("action", 2.5, f, ())
        Traceback (most recent call last):
        ...
        replaybank.errors.DtypeError: action=2.5: field 'action' is int64 ...
    """
    return field.cast(arg, value, leading)


# ---------------------------------------------------------------- numbers a learner sends back
# (priorities, TD errors, values, reward functions' results): real numbers only, never
# strings ("0.5" is not silently parsed), None, objects or complex values (whose imaginary
# part numpy would drop with a warning)
def real_floats(value: Any, label: str, fix: str = "pass numbers (a list, numpy array or "
                "tensor of floats)") -> npt.NDArray[np.float64]:
    """``value`` (a number, list, array; tensors already on the host) as float64, when it
    holds real numbers only (:func:`real_array`, then a float64 copy if needed).

    Args:
        value: What the user passed.
        label: The start of the message: the call, argument and value, e.g.
            ``f"update_priorities(priorities={describe(p)})"``.
        fix: What to pass instead, for the message.

    Returns:
        A float64 array of ``value``'s shape (bools are 0.0 and 1.0, as numpy casts them;
        NaN and inf are left to the caller).

    Raises:
        DtypeError: Strings (also numbers as text), None, other objects or complex
            values.
        ShapeError: Ragged nested lists (:func:`replaybank.host.as_numpy`).

    Example:
        >>> real_floats([1, 2.5], "priorities=[1, 2.5]").tolist()
        [1.0, 2.5]
    """
    return real_array(value, label, fix).astype(np.float64, copy=False)


def rows_array(value: Any, label: str | Callable[[], str], expected: str, fix: str) -> Any:
    """``value`` (host values: lists, arrays, numbers) as a numpy array, or a ShapeError
    when its nested rows have different lengths, naming the argument and its value
    (``label``), the first unlike row, the shape ``expected`` and the ``fix``: the ragged
    check of :func:`replaybank.host.as_numpy` (the one every boundary uses). Every
    argument of rows (priorities, keys, TD errors, masks) is converted through it, so a
    ragged list gets one kind of error wherever it is passed.

    Args:
        value: What the user passed.
        label: The start of the message: the call, argument and value, e.g.
            ``f"update_priorities(priorities={describe(p)})"``, or a function that
            returns it (called only for the message: describing a long list costs more
            than converting it).
        expected: The shape wanted, in words (``"[B=2, L] (one row per start)"``).
        fix: What to pass instead.

    Returns:
        ``np.asarray(value)``; ``value`` itself when numpy cannot convert it at all
        (a TypeError: left to the caller's dtype check, which names it).

    Raises:
        ShapeError: Rows of different lengths.

    Example:
        >>> rows_array([[1.0, 2.0], [3.0]], "f(x=[[1.0, 2.0], [3.0]])", "[B=2, L]",
        ...            "pad the short rows")
        Traceback (most recent call last):
        ...
        replaybank.errors.ShapeError: f(x=[[1.0, 2.0], [3.0]]): a ragged nest, rows of different lengths ([1] has shape (1,) but [0] has shape (2,)); expected [B=2, L]: pad the short rows
    """  # noqa: E501
    try:
        return as_numpy(value, label=label, expected=expected, fix=fix)
    except DtypeError:  # (a tensor numpy cannot show: named already)
        raise
    except TypeError:  # not numbers: the caller's dtype check names it
        return value


def real_array(value: Any, label: str, fix: str = "pass numbers (a list, numpy array or "
               "tensor of floats)") -> npt.NDArray[Any]:
    """``value`` as a numpy array of its own real dtype (bools, ints, floats), or the
    errors :func:`real_floats` documents.

    Example:
        >>> real_array(np.float32(0.5), "reward=0.5").dtype
        dtype('float32')
        >>> real_array([1 + 0j], "x=[(1+0j)]")
        Traceback (most recent call last):
        ...
        replaybank.errors.DtypeError: x=[(1+0j)]: expected real numbers, got complex numbers (numpy would drop the imaginary part); pass their magnitude, e.g. np.abs(x)
    """  # noqa: E501
    try:  # (a ragged nest: the ShapeError of the one ragged check, host.as_numpy)
        arr = as_numpy(value, label=label, expected="one array of real numbers", fix=fix)
    except DtypeError:
        raise
    except TypeError as exc:  # numpy cannot convert it at all
        raise DtypeError(f"{label}: expected real numbers ({exc}); {fix}") from None
    kind = arr.dtype.kind
    if kind in "biuf":
        return arr
    if kind == "c":
        raise DtypeError(f"{label}: expected real numbers, got complex numbers (numpy would "
                         "drop the imaginary part); pass their magnitude, e.g. np.abs(x)")
    if kind in "US":
        what = "str (a number given as text is not parsed)"
    elif kind == "O":
        found = sorted({type(v).__name__ for v in arr.reshape(-1)[:64].tolist()
                        if isinstance(v, bool)
                        or not isinstance(v, (int, float, np.integer, np.floating))})
        what = f"objects of type {', '.join(found) or 'object'}"
    else:
        what = f"dtype {arr.dtype}"
    raise DtypeError(f"{label}: expected real numbers, got {what}; {fix}")
