"""The rules a field's values obey, as methods of :class:`replaybank.spec.FieldSpec`.

``FieldSpec.cast`` checks up to 64 values of a plain int or float array as Python numbers
and larger arrays with numpy reductions: both must take the same decision (the same
array, or the same error), which the tests below check value by value against a tiled
copy of each value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from replaybank.errors import DtypeError, ReplayBankError, ShapeError
from replaybank.spec import FieldSpec, Spec, cast_field

DTYPES = [np.bool_, np.int8, np.uint8, np.int32, np.int64, np.uint64, np.float16,
          np.float32, np.float64]
VALUES: list[Any] = [0, 1, 2, -1, 0.5, 1.0, -0.0, np.nan, np.inf, 127, 128, 255, 256,
                     2**31, 2**63 - 1, 2**63, -2**63, 2.0**63, 2**64 - 1]


def _outcome(field: FieldSpec, arr: np.ndarray) -> tuple[Any, ...]:
    try:
        out = field.cast("x", arr)
    except ReplayBankError as exc:  # the rule's words (the value shown differs in size)
        return (type(exc).__name__, str(exc).split(": ", 1)[1].split(";")[0]
                if "do not fit" not in str(exc) else "range")
    return ("ok", out.dtype.str, out.reshape(-1)[:1].tobytes())


@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
def test_small_and_large_values_take_the_same_decision(src: Any, dst: Any) -> None:
    for v in VALUES:
        with np.errstate(all="ignore"):
            one = np.array([v]).astype(src)
        if one.astype(object)[0] != v and not (isinstance(v, float) and np.isnan(v)):
            continue  # the value does not exist in src
        small, large = one, np.repeat(one, 70)
        with np.errstate(over="ignore"):  # same kind: float32 2**31 into float16 is inf
            got_small = _outcome(FieldSpec("x", small.shape, np.dtype(dst)), small)
            got_large = _outcome(FieldSpec("x", large.shape, np.dtype(dst)), large)
        assert got_small == got_large, (src, dst, v)


def test_cast_is_cast_field_and_keeps_a_matching_array() -> None:
    f = FieldSpec("obs", (3,), np.dtype(np.float32))
    arr = np.zeros((2, 3), np.float32)
    assert f.cast("obs", arr, (2,)) is arr is cast_field("obs", arr, f, (2,))
    out = f.cast("obs", np.ones((2, 3)), (2,))  # float64 -> float32: same kind
    assert out.dtype == np.float32 and out.tolist() == [[1.0] * 3] * 2


@pytest.mark.parametrize("value, dtype, words", [
    (2.0**63, np.int64, "do not fit field"),  # exact bounds: numpy's 2.0**63 would pass
    (np.nan, np.int32, "finite integral"),
    (0.5, np.bool_, "finite integral"),
    (2, np.bool_, "only accepts 0/1"),
    (1 + 0j, np.float32, "safely (same kind)"),
    (1 + 0j, np.int64, "got complex numbers"),  # (not NaN, inf or a fraction)
    (0j, np.bool_, "got complex numbers"),
    ("1", np.float32, "string (unicode) data"),
    (None, np.float32, "not a number numpy can convert exactly"),
])
def test_cast_refusals_name_the_rule(value: Any, dtype: Any, words: str) -> None:
    with pytest.raises(DtypeError, match=r"^a=") as info:
        FieldSpec("a", (), np.dtype(dtype)).cast("a", value)
    assert words in str(info.value)


def test_a_refused_list_is_shown_as_written() -> None:
    """The message shows the user's own items, not numpy's conversion of the list (which
    turns False into 0.0 beside a float, or into 0j beside a complex)."""
    f = FieldSpec("t", (), np.dtype(np.bool_))
    for value, shown in (([0.5, False], "[0.5, False]"), ([0j, False], "[0j, False]"),
                         ((2, True), "(2, True)")):
        with pytest.raises(DtypeError) as info:
            f.cast("t", value, (2,))
        assert str(info.value).startswith(f"t={shown}: "), str(info.value)
    with pytest.raises(DtypeError, match=r"^t=\[0.5, 0.0\]: "):  # an array: its values
        f.cast("t", np.array([0.5, 0.0]), (2,))


def test_stray_bool_bytes_are_stored_as_0_1() -> None:
    raw = np.array([2, 0, 1], np.uint8).view(np.bool_)
    for dtype in (np.bool_, np.int64, np.float32):
        out = FieldSpec("t", (3,), np.dtype(dtype)).cast("t", raw)
        assert out.view(np.uint8).tolist()[:1] != [2] and out.tolist() == [1, 0, 1]


def test_shape_rules() -> None:
    f = FieldSpec("obs", (3,), np.dtype(np.float32))
    f.check_shape("obs", np.zeros((4, 3)), (4,))
    with pytest.raises(ShapeError, match=r"next_obs=.*expected shape \(4, 3\)"):
        f.check_shape("next_obs", np.zeros((4, 2)), (4,))
    with pytest.raises(ShapeError, match=r"expected shape \(3,\)"):
        f.cast("obs", [1.0, 2.0])
    assert f.leading_of("add", np.zeros(3), [(), (1,)]) == ()
    assert f.leading_of("add", np.zeros((1, 3)), [(), (1,)]) == (1,)
    with pytest.raises(ShapeError, match=r"extend: obs=.*\(T, 3\), \(T, 2, 3\)"):
        f.leading_of("extend", np.zeros(3), [(5,), (5, 2)])


def test_infer_is_spec_infer_for_one_field() -> None:
    value = np.zeros((4, 2), ">f4")
    assert FieldSpec.infer("obs", value, (4,)) == Spec.infer({"obs": value}, (4,))["obs"]
    assert FieldSpec.infer("r", 1.5).dtype == np.float32
    assert FieldSpec.infer("a", 3).dtype == np.int64
    with pytest.raises(ShapeError, match="leading dims"):
        FieldSpec.infer("obs", np.zeros(3), (4,))
    with pytest.raises(DtypeError, match="string"):
        FieldSpec.infer("name", "abc")


class _Sub(np.ndarray):
    """An ndarray subclass (cast converts it)."""


@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
def test_stores_as_is_only_for_values_cast_passes_unchanged(src: Any, dst: Any) -> None:
    """``stores_as_is`` (the collectors' quick test on arrival) says True only for a value
    that ``cast`` returns itself, also as one row of ``[n, *shape]`` zeros: never for a
    value cast refuses or converts (another dtype, byte order, shape, a subclass, a list,
    stray bool bytes)."""
    field = FieldSpec("x", (2,), dst)
    with np.errstate(all="ignore"):
        values = [np.array([v, 0]).astype(src) for v in (0, 1, 2, -1, 0.5, np.nan)]
    other = [values[1].reshape(1, 2), values[1].tolist(), values[1].view(_Sub),
             np.ma.masked_array(values[1])]
    if values[1].dtype.itemsize > 1:
        other.append(values[1].astype(values[1].dtype.newbyteorder()))
    if dst is np.bool_:
        other.append(np.array([1, 2], np.uint8).view(np.bool_))  # stray bool bytes
    assert not any(field.stores_as_is(v) for v in other)
    for v in values:
        if not field.stores_as_is(v):
            assert np.dtype(src) != np.dtype(dst)  # (same dtype and shape: as it is)
            continue
        assert field.cast("x", v) is v
        rows = np.zeros((3, 2), v.dtype)
        rows[1] = v
        assert field.cast("x", rows, (3,)) is rows
    assert field.stores_as_is(np.zeros(2, dst)) is True
