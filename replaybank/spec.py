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

Example:
    >>> import numpy as np
    >>> spec = Spec.infer({"obs": np.zeros(3, np.float32), "reward": 1.0})
    >>> spec["obs"]
    FieldSpec(name='obs', shape=(3,), dtype=dtype('float32'))
    >>> spec["reward"].dtype
    dtype('float32')
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from replaybank.errors import DtypeError, ShapeError, SpecError, describe
from replaybank.host import as_numpy

__all__ = ["SEP", "STANDARD", "UNSET", "UNSTORABLE_KINDS", "FieldSpec", "Spec", "as_array",
           "collect_fields", "flatten", "native", "real_array", "real_floats", "unflatten"]

SEP = "/"

#: dtype kinds no field may have (they train but can never be saved): kind -> what it is
UNSTORABLE_KINDS = {"O": "object-dtype", "U": "string (unicode)", "S": "bytes-string",
                    "M": "datetime", "m": "timedelta"}

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
    """Per-item shape and dtype of one stored field.

    Args:
        name: Flat field name (nested names joined with ``/``).
        shape: Shape of one item, without the time or lane dimensions.
        dtype: Numpy dtype the field is stored with.

    Example:
        >>> FieldSpec("action", (6,), np.dtype("float32")).nbytes
        24
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
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
                raise SpecError(f"field {name!r}: empty dict; give at least one sub-field")
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


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


def as_array(value: Any) -> npt.NDArray[Any]:
    """Turn an input value (array, scalar, list, torch tensor) into a numpy array.

    numpy arrays (subclasses too) come back as they are; everything else goes through
    :func:`replaybank.host.as_numpy` (a torch tensor on any device becomes a host array).

    Example:
        >>> as_array([1.0, 2.0]).shape
        (2,)
    """
    if type(value) is np.ndarray or isinstance(value, np.ndarray):
        return value
    return as_numpy(value)  # a torch tensor on any device: see replaybank.host


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
                fields.append(FieldSpec(name, tuple(entry["shape"]), np.dtype(entry["dtype"])))
            elif isinstance(entry, (tuple, list)) and len(entry) == 2:
                fields.append(FieldSpec(name, tuple(entry[0]), np.dtype(entry[1])))
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
        """
        fields = []
        for name, value in flatten(values).items():
            arr = as_array(value)
            if arr.shape[: len(leading)] != leading:
                raise ShapeError(
                    f"{name}: shape {arr.shape} does not start with the leading dims {leading}; "
                    f"pass values shaped {leading} + item shape"
                )
            dtype = _default_dtype(value)
            if dtype.kind in UNSTORABLE_KINDS:
                raise DtypeError(
                    f"{name}={describe(value)}: {UNSTORABLE_KINDS[dtype.kind]} values "
                    f"({dtype.str}) cannot be stored (checkpoints and memmap files hold "
                    "numeric arrays only); pass a number or a numeric array (encode text or "
                    "objects as numbers, e.g. token ids or one-hot codes)"
                )
            fields.append(FieldSpec(name, arr.shape[len(leading):], native(dtype)))
        return cls(fields)


def _flatten_spec(spec: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, entry in spec.items():
        name = f"{prefix}{SEP}{key}" if prefix else str(key)
        is_leaf = isinstance(entry, (FieldSpec, tuple, list)) or (
            isinstance(entry, Mapping) and "shape" in entry and "dtype" in entry
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
    """Validate one input value against its field and cast it to the field dtype.

    Args:
        arg: Name of the argument, for the error message (e.g. ``"obs/observation"``).
        value: The user's value.
        field: The field spec.
        leading: The expected leading dims, e.g. ``()``, ``(num_envs,)`` or ``(T, num_envs)``.

    Returns:
        An array of shape ``leading + field.shape`` and dtype ``field.dtype``
        (no copy when the input already matches).

    Raises:
        ShapeError: Wrong shape.
        DtypeError: The value cannot be cast safely (same kind) to the dtype (strings
            and objects never can), or an integer field got a non-integral, NaN or
            out-of-range value (the range is checked exactly, so ``2.0**63`` does not
            fit int64). Bool values are stored as canonical 0/1 bytes.

    Example:
        >>> f = FieldSpec("action", (), np.int64)
        >>> cast_field("action", 2.0, f, ()).dtype
        dtype('int64')
        >>> cast_field("action", 2.5, f, ())
        Traceback (most recent call last):
        ...
        replaybank.errors.DtypeError: action=2.5: field 'action' is int64 ...
    """
    return _cast(arg, value, as_array(value), field, leading)


def _cast(arg: str, value: Any, arr: npt.NDArray[Any], field: FieldSpec,
          leading: tuple[int, ...]) -> npt.NDArray[Any]:
    """:func:`cast_field` of ``value`` already turned into ``arr`` (``as_array(value)``;
    ``value`` itself is what the messages show)."""
    expected = leading + field.shape
    if arr.shape != expected:
        raise ShapeError(
            f"{arg}={describe(value)}: expected shape {expected} "
            f"(leading dims {leading} + field shape {field.shape}); "
            "reshape the value or check num_envs / the number of steps"
        )
    src, dst = arr.dtype, field.dtype
    # the values every rule below accepts, decided in fewer steps (same result)
    if src is dst or src == dst:
        if src.kind != "b" or _canonical_bools(arr):
            return arr
    else:
        quick: _Quick = _QUICK.get((src, dst), _unknown)
        if quick is _unknown:
            quick = _QUICK[(src, dst)] = _quick_rule(src, dst)
        if quick is not None:
            out = quick(arr, dst)
            if out is not None:
                return out
    if src.kind in UNSTORABLE_KINDS:
        what = ("not a number numpy can convert exactly (e.g. an int beyond 64 bits, None "
                "or mixed types)") if src.kind == "O" else f"{UNSTORABLE_KINDS[src.kind]} data"
        raise DtypeError(
            f"{arg}={describe(value)}: field {field.name!r} is {dst.name} but the value is "
            f"{what}; convert the value to a number or a numeric array of dtype {dst.name}"
        )
    if src.kind == "b" and arr.size and int(arr.view(np.uint8).max()) > 1:
        arr = arr.view(np.uint8) != 0  # a bool byte other than 0/1: store canonical 0/1
    if arr.dtype == dst:
        return arr
    if (dst.kind in "iub" and src.kind in "fc") or (dst.kind in "iu" and src.kind == "b"):
        # integral floats are accepted for integer/bool fields; check exactly
        if src.kind == "c" or not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise DtypeError(
                f"{arg}={describe(value) if arr.size > 4 else arr.tolist()}: field {field.name!r} "
                f"is {dst.name} and needs finite integral values (found NaN, inf or a "
                "fraction); round or fix the value, or declare the field as float"
            )
    elif (dst.kind == "b" and src.kind in "iu") or (dst.kind in "iu" and src.kind in "iu"):
        pass  # checked value by value below
    elif not np.can_cast(src, dst, casting="same_kind"):
        raise DtypeError(
            f"{arg}={describe(value)}: cannot cast {src.name} to field {field.name!r} of dtype "
            f"{dst.name} safely (same kind); convert the value or declare the field's dtype"
        )
    if dst.kind == "b":
        if not np.all((arr == 0) | (arr == 1)):
            raise DtypeError(
                f"{arg}={describe(value) if arr.size > 4 else arr.tolist()}: field "
                f"{field.name!r} is bool and only accepts 0/1 or True/False values; "
                "pass a bool (e.g. terminated=bool(x))"
            )
    elif dst.kind in "iu" and src.kind in "iuf":
        info = np.iinfo(dst)
        # exact bounds: Python compares int with int and float with int exactly (numpy
        # would round int64's max to 2.0**63 and let 2.0**63 through)
        to_py = float if src.kind == "f" else int
        if arr.size and (to_py(arr.min()) < info.min or to_py(arr.max()) > info.max):
            raise DtypeError(
                f"{arg}={describe(value) if arr.size > 4 else arr.tolist()}: values from "
                f"{arr.min()} to {arr.max()} do not fit field {field.name!r} ({dst.name}, range "
                f"[{info.min}, {info.max}]); clip the value or declare a wider dtype"
            )
    return arr.astype(dst, copy=False)


# ---------------------------------------------------------------- the casts, decided quickly
# A quick rule takes an array of exactly the expected shape whose dtype differs from the
# field's and returns the array that the rules of :func:`_cast` return for it, or None
# when it cannot tell in a few steps (a large array whose values must be checked) or the
# value is refused: the rules themselves then decide (and raise the error).

_SMALL = 64  # values checked one by one as Python numbers up to this size


def _canonical_bools(arr: npt.NDArray[Any]) -> bool:
    """Whether every byte of the bool array ``arr`` is 0 or 1."""
    if arr.size <= 4096:
        return not arr.tobytes().translate(None, b"\x00\x01")
    return int(arr.view(np.uint8).max()) <= 1


def _astype(arr: npt.NDArray[Any], dst: np.dtype[Any]) -> npt.NDArray[Any] | None:
    return arr.astype(dst, copy=False)


def _int_to_bool(arr: npt.NDArray[Any], dst: np.dtype[Any]) -> npt.NDArray[Any] | None:
    if arr.size > _SMALL or not set(arr.reshape(-1).tolist()) <= {0, 1}:
        return None
    return arr.astype(dst, copy=False)


def _int_to_int(arr: npt.NDArray[Any], dst: np.dtype[Any]) -> npt.NDArray[Any] | None:
    if arr.size > _SMALL:
        return None
    vals = arr.reshape(-1).tolist()
    info = np.iinfo(dst)
    if vals and (min(vals) < info.min or max(vals) > info.max):
        return None
    return arr.astype(dst, copy=False)


def _float_to_bool(arr: npt.NDArray[Any], dst: np.dtype[Any]) -> npt.NDArray[Any] | None:
    # 0.0 and 1.0 are the only finite integral values a bool field takes
    if arr.size > _SMALL or not all(v == 0.0 or v == 1.0 for v in arr.reshape(-1).tolist()):
        return None
    return arr.astype(dst, copy=False)


def _float_to_int(arr: npt.NDArray[Any], dst: np.dtype[Any]) -> npt.NDArray[Any] | None:
    if arr.size > _SMALL:
        return None
    info = np.iinfo(dst)
    lo, hi = info.min, info.max
    for v in arr.reshape(-1).tolist():  # Python floats: exact comparisons with ints
        if not (v.is_integer() and lo <= v <= hi):
            return None
    return arr.astype(dst, copy=False)


_Quick: TypeAlias = \
    "Callable[[npt.NDArray[Any], np.dtype[Any]], npt.NDArray[Any] | None] | None"
_QUICK: dict[tuple[np.dtype[Any], np.dtype[Any]], _Quick] = {}
_unknown: Any = object()


def _quick_rule(src: np.dtype[Any], dst: np.dtype[Any]) -> _Quick:
    """The quick rule of a cast from ``src`` to another dtype ``dst`` (None: none), chosen
    as :func:`_cast` chooses its checks."""
    if src.kind in UNSTORABLE_KINDS or src.kind in "bc" or src.kind not in "iuf" \
            or (src.kind == "f" and src.itemsize > 8):
        return None  # refused, bools (0/1 bytes) and the rest: the rules decide
    if dst.kind in "iub" and src.kind == "f":
        return _float_to_bool if dst.kind == "b" else _float_to_int
    if dst.kind == "b":
        return _int_to_bool
    if dst.kind in "iu":
        return _int_to_int
    if dst.kind in "fc" and np.can_cast(src, dst, casting="same_kind"):
        return _astype
    return None


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
        DtypeError: Strings (also numbers as text), None, other objects, complex values or
            ragged nested lists.

    Example:
        >>> real_floats([1, 2.5], "priorities=[1, 2.5]").tolist()
        [1.0, 2.5]
    """
    return real_array(value, label, fix).astype(np.float64, copy=False)


def real_array(value: Any, label: str, fix: str = "pass numbers (a list, numpy array or "
               "tensor of floats)") -> npt.NDArray[Any]:
    """``value`` as a numpy array of its own real dtype (bools, ints, floats), or the
    DtypeError :func:`real_floats` documents.

    Example:
        >>> real_array(np.float32(0.5), "reward=0.5").dtype
        dtype('float32')
        >>> real_array([1 + 0j], "x=[(1+0j)]")
        Traceback (most recent call last):
        ...
        replaybank.errors.DtypeError: x=[(1+0j)]: expected real numbers, got complex numbers (numpy would drop the imaginary part); pass their magnitude, e.g. np.abs(x)
    """  # noqa: E501
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged nesting
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
