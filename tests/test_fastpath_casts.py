"""The compiled writer's input casts (issue 26): every source dtype / layout it converts
itself lands exactly as the reference writer lands it, and every value the casting rules
refuse is refused the same way.

Oracle: a twin buffer driven under ``REPLAYBANK_WRITER=reference`` (the Python boundary's
``cast_field`` and the reference applier). The buffer under test runs under ``compiled``
(under ``auto`` too, which is the Python writer with ``REPLAYBANK_PURE_PYTHON=1``). Each
kind of input (float64 into float32, ints into float and bool fields, int widenings,
big-endian, strided and read-only arrays, numpy scalars, (nested) lists, torch tensors:
plain, float64, strided, requiring grad, bool / int flags) is fed to ``add`` and
``extend`` of one and four lanes on small rings that wrap, with episode ends and gaps.
After every call the two buffers' whole states must be equal byte for byte, and with the
accelerator built no call may have taken the Python boundary (the compiled kernels did
the cast). Per casting rule, the compiled path must raise what the reference raises and
leave the buffer exactly as it was (the C boundary returns 0 before a byte is written).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.storage.writers.compiled import CompiledWriter, accelerated
from tests.twins import Under, same_everything, snapshot, twins

try:  # torch is an optional extra: its input kinds are left out without it
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

ACCEL = accelerated()
_NOT_BUILT = pytest.mark.skipif(not ACCEL, reason="_lane not built")
#: the writer under test: compiled where built; auto everywhere (the Python writer when
#: the accelerator is off, which must still match the reference)
WRITERS = [pytest.param("compiled", marks=_NOT_BUILT), "auto"]

pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning"),
]

#: obs float32 [3], action int64 (discrete) or float32 [2] (continuous), reward float32,
#: flags bool, one extra float64 field: the stored dtypes the casts go into
SPEC_INT = {"obs": ((3,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
            "terminated": ((), "bool"), "truncated": ((), "bool"),
            "value": ((), "float64")}
SPEC_FLOAT = {**SPEC_INT, "action": ((2,), "float32")}

Conv = Callable[[np.ndarray], Any]


def _strided(a: np.ndarray) -> np.ndarray:
    """``a`` as every other element of the last axis of an array twice as wide."""
    wide = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype) if a.ndim else None
    if wide is None:
        return a
    wide[..., ::2] = a
    return wide[..., ::2]


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.flags.writeable = False
    return a


def _tensor(a: np.ndarray, strided: bool = False, grad: bool = False) -> Any:
    t = torch.from_numpy(np.array(a, copy=True))
    if strided and t.ndim:
        wide = torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype)
        wide[..., ::2] = t
        t = wide[..., ::2]
    if grad:
        t = t.clone().requires_grad_(True)
    return t


#: how a float field's value may come: each the same numbers in another type / layout
FLOAT_KINDS: dict[str, Conv] = {
    "exact": lambda a: a,
    "f64": lambda a: a.astype(np.float64),
    "f64 strided": lambda a: _strided(a.astype(np.float64)),
    "f64 readonly": lambda a: _readonly(a.astype(np.float64)),
    "f64 big-endian": lambda a: a.astype(">f8"),
    "f32 big-endian": lambda a: a.astype(">f4"),
    "f32 strided": _strided,
    "f32 fortran": lambda a: np.asfortranarray(a) if a.ndim else a,
    "list": lambda a: a.tolist(),
    "tuple": lambda a: tuple(a.tolist()) if a.ndim else a.tolist(),
}
#: the values of an int-valued float field (rounded): ints into float
INT_INTO_FLOAT: dict[str, Conv] = {
    "int64": lambda a: np.round(a).astype(np.int64),
    "int32": lambda a: np.round(a).astype(np.int32),
    "int8": lambda a: np.round(a).astype(np.int8),
    "uint16": lambda a: np.abs(np.round(a)).astype(np.uint16),
    "int list": lambda a: np.round(a).astype(np.int64).tolist(),
}
#: how an int64 field's value may come (values in [0, 4))
INT_KINDS: dict[str, Conv] = {
    "exact": lambda a: a,
    "int32": lambda a: a.astype(np.int32),
    "int8": lambda a: a.astype(np.int8),
    "uint8": lambda a: a.astype(np.uint8),
    "uint32": lambda a: a.astype(np.uint32),
    "int16 strided": lambda a: _strided(a.astype(np.int16)) if a.ndim else a,
    "big-endian": lambda a: a.astype(">i8"),
    "f64 integral": lambda a: a.astype(np.float64),
    "list": lambda a: a.tolist(),
    "bool-free mix": lambda a: [*a.tolist()[:-1], float(a.reshape(-1)[-1])] if a.ndim == 1
    else a.tolist(),
}
def _last_leaf_as(a: np.ndarray, cast: Callable[[Any], Any]) -> Any:
    """``a.tolist()`` with its last number made ``cast(number)`` (a list of one kind of
    number but the last)."""
    out = a.tolist()
    if a.ndim == 0:
        return cast(out)
    node = out
    while isinstance(node[-1], list):
        node = node[-1]
    node[-1] = cast(node[-1])
    return out


def _ragged(a: np.ndarray, longer: bool) -> Any:
    """``a.tolist()`` with its last innermost list one number longer (or shorter): a
    ragged nest, which no array of the field's shape holds."""
    out = a.tolist()
    node = out
    while isinstance(node[-1], list):
        node = node[-1]
    if longer:
        node.append(node[-1])
    else:
        node.pop()
    return out


#: how a bool flag may come
FLAG_KINDS: dict[str, Conv] = {
    "exact": lambda a: a,
    "int64": lambda a: a.astype(np.int64),
    "int32": lambda a: a.astype(np.int32),
    "uint8": lambda a: a.astype(np.uint8),
    "int8 strided": lambda a: _strided(a.astype(np.int8)) if a.ndim else a.astype(np.int8),
    "f64": lambda a: a.astype(np.float64),
    "non-canonical": lambda a: a.view(np.uint8).__mul__(3).view(np.bool_),
    "list": lambda a: a.tolist(),
    "int list": lambda a: a.astype(np.int64).tolist(),
    "bool list, last an int": lambda a: _last_leaf_as(a, int),
    "bool list, last a float": lambda a: _last_leaf_as(a, float),
}
if torch is not None:
    FLOAT_KINDS.update({
        "torch": lambda a: _tensor(a),
        "torch f64": lambda a: _tensor(a.astype(np.float64)),
        "torch strided": lambda a: _tensor(a, strided=True),
        "torch grad": lambda a: _tensor(a, grad=True),
    })
    INT_KINDS.update({
        "torch": lambda a: _tensor(a),
        "torch int32": lambda a: _tensor(a.astype(np.int32)),
        "torch uint8 strided": lambda a: _tensor(a.astype(np.uint8), strided=True),
    })
    FLAG_KINDS.update({
        "torch": lambda a: _tensor(a),
        "torch int64": lambda a: _tensor(a.astype(np.int64)),
        "torch strided": lambda a: _tensor(a, strided=True),
    })


def _scalar_kinds(kinds: dict[str, Conv]) -> dict[str, Conv]:
    """The kinds of a 0-d value of one env's add: the array kinds that keep 0-d values
    0-d, plus numpy and Python scalars."""
    out = {k: c for k, c in kinds.items() if "strided" not in k}
    out["numpy scalar"] = lambda a: a[()]
    out["python"] = lambda a: a.item()
    return out


def _stream(rng: np.random.Generator, n: int, lanes: int, cont: bool,
            cur: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``n`` steps of ``lanes`` lanes in the stored dtypes, ``[n, lanes, ...]``: each lane
    sequential (next obs the next obs) but for episode ends and rare gaps."""
    obs = np.empty((n, lanes, 3), np.float32)
    nxt = rng.standard_normal((n, lanes, 3)).astype(np.float32)
    term = rng.random((n, lanes)) < 0.1
    trunc = rng.random((n, lanes)) < 0.05
    for i in range(n):
        obs[i] = cur
        cur = nxt[i].copy()
        ends = term[i] | trunc[i] | (rng.random(lanes) < 0.05)
        cur[ends] = rng.standard_normal((int(ends.sum()), 3)).astype(np.float32)
    act = (rng.standard_normal((n, lanes, 2)).astype(np.float32) if cont
           else rng.integers(0, 4, (n, lanes)).astype(np.int64))
    rew = rng.standard_normal((n, lanes)).astype(np.float32)
    rew[rng.random((n, lanes)) < 0.3] = 2.0  # some integral rewards
    return {"obs": obs, "action": act, "reward": rew, "next_obs": nxt, "terminated": term,
            "truncated": trunc, "value": rng.standard_normal((n, lanes))}, cur


def _pick(rng: np.random.Generator, kinds: dict[str, Conv]) -> Conv:
    names = sorted(kinds)
    return kinds[names[int(rng.integers(len(names)))]]


def _as_call(rng: np.random.Generator, d: dict[str, np.ndarray], cont: bool, scalar: bool
             ) -> dict[str, Any]:
    """The call of the values ``d`` (``[...]`` stored dtypes) with every field in a kind
    picked at random (0-d values: the scalar kinds too)."""
    floats = _scalar_kinds(FLOAT_KINDS) if scalar else FLOAT_KINDS
    flags = _scalar_kinds(FLAG_KINDS) if scalar else FLAG_KINDS
    ints = _scalar_kinds(INT_KINDS) if scalar else INT_KINDS
    out: dict[str, Any] = {}
    for k in ("obs", "next_obs"):
        out[k] = _pick(rng, FLOAT_KINDS)(d[k])
    out["action"] = _pick(rng, FLOAT_KINDS if cont else ints)(d["action"])
    rew = d["reward"]
    integral = np.array_equal(rew, np.round(rew))
    out["reward"] = _pick(rng, {**floats, **(INT_INTO_FLOAT if integral else {})})(rew)
    for k in ("terminated", "truncated"):
        out[k] = _pick(rng, flags)(d[k])
    out["value"] = _pick(rng, floats)(d["value"].astype(np.float32).astype(np.float64))
    return out


def _no_general(fast: Under, slow: Under, rng: np.random.Generator, cont: bool = False
                ) -> list[int]:
    """A list that grows by one whenever ``fast`` takes the Python boundary from now on,
    after a first exact add of one step to both twins (which allocates the storage: the
    Python boundary's work)."""
    lanes = fast.buf.num_envs
    d, _ = _stream(rng, 1, lanes, cont, rng.standard_normal((lanes, 3)).astype(np.float32))
    one = {k: v[0, 0, ...] if lanes == 1 else v[0] for k, v in d.items()}
    for b in (fast, slow):
        b.add(**one)
    general: list[int] = []
    inner = fast.buf._write
    fast.buf._write = lambda *a, **k: general.append(1) or inner(*a, **k)  # type: ignore
    return general


def _drive(rng: np.random.Generator, writer: str, lanes: int, cont: bool, cap: int,
           calls: int) -> None:
    spec = SPEC_FLOAT if cont else SPEC_INT
    fast, slow = twins(writer, lambda: rb.ReplayBuffer(capacity=cap * lanes, num_envs=lanes,
                                                        spec=spec, seed=0))
    general = _no_general(fast, slow, rng, cont)
    cur = rng.standard_normal((lanes, 3)).astype(np.float32)
    for _ in range(calls):
        if rng.random() < 0.5:  # extend: [n, lanes, ...] ([n, ...] for one lane)
            n = int(rng.integers(1, cap + 3))
            d, cur = _stream(rng, n, lanes, cont, cur)
            if lanes == 1:
                d = {k: v[:, 0] for k, v in d.items()}
            call = _as_call(rng, d, cont, scalar=False)
            fast.extend(**call)
            slow.extend(**call)
        else:  # add: [lanes, ...] ([...] for one lane)
            d, cur = _stream(rng, 1, lanes, cont, cur)
            d = {k: v[0, 0, ...] if lanes == 1 else v[0] for k, v in d.items()}
            call = _as_call(rng, d, cont, scalar=lanes == 1)
            fast.add(**call)
            slow.add(**call)
        same_everything(fast, slow)
    if writer == "compiled":
        assert general == [], "a cast took the Python boundary"


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("lanes", [1, 4])
@pytest.mark.parametrize("cont", [False, True], ids=["int action", "float action"])
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), cap=st.sampled_from([5, 8, 21]))
def test_every_input_kind_lands_as_the_reference(writer: str, lanes: int, cont: bool,
                                                 seed: int, cap: int) -> None:
    """Random kinds per field and call, add and extend, rings that wrap: the whole state
    equals the reference twin's after every call, and no call took the Python path."""
    _drive(np.random.default_rng(seed), writer, lanes, cont, cap, calls=14)


def _one_kind_call(kind: str, conv: Conv, field: str, d: dict[str, np.ndarray],
                   cont: bool) -> dict[str, Any]:
    call: dict[str, Any] = dict(d)
    if field == "obs":
        call["obs"], call["next_obs"] = conv(d["obs"]), conv(d["next_obs"])
    else:
        call[field] = conv(d[field])
    return call


def _kind_cases() -> list[Any]:
    cases = []
    for name in FLOAT_KINDS:
        cases += [("obs", name), ("value", name)]
    cases += [("reward", name) for name in INT_INTO_FLOAT]
    cases += [("action", name) for name in INT_KINDS]
    cases += [("terminated", name) for name in FLAG_KINDS]
    return [pytest.param(f, k, id=f"{f}-{k}") for f, k in cases]


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("lanes", [1, 4])
@pytest.mark.parametrize(("field", "kind"), _kind_cases())
def test_each_kind_alone(writer: str, lanes: int, field: str, kind: str) -> None:
    """One kind in one field, everything else exact: extends and adds (0-d values in
    their array kind) that wrap a ring of 6 rows twice, state equal after each call."""
    conv = {**FLOAT_KINDS, **INT_INTO_FLOAT, **INT_KINDS, **FLAG_KINDS}
    table = {"obs": FLOAT_KINDS, "value": FLOAT_KINDS, "reward": INT_INTO_FLOAT,
             "action": INT_KINDS, "terminated": FLAG_KINDS}[field]
    c = table.get(kind, conv[kind])
    rng = np.random.default_rng(hash((field, kind, lanes)) % 2**32)
    fast, slow = twins(writer, lambda: rb.ReplayBuffer(capacity=6 * lanes, num_envs=lanes,
                                                        spec=SPEC_INT, seed=0))
    general = _no_general(fast, slow, rng)
    cur = rng.standard_normal((lanes, 3)).astype(np.float32)
    for n in (4, 5, 1, 7, 2):
        d, cur = _stream(rng, n, lanes, False, cur)
        if field == "reward":
            d["reward"] = np.round(d["reward"] * 3)
        if lanes == 1:
            d = {k: v[:, 0] for k, v in d.items()}
        fast.extend(**_one_kind_call(kind, c, field, d, False))
        slow.extend(**_one_kind_call(kind, c, field, d, False))
        same_everything(fast, slow)
        one = {k: v[0, ...] for k, v in d.items()}
        fast.add(**_one_kind_call(kind, c, field, one, False))
        slow.add(**_one_kind_call(kind, c, field, one, False))
        same_everything(fast, slow)
    if writer == "compiled":
        assert general == []


def _refused_cases() -> list[Any]:
    """(field, bad values [n, ...] or None (the step's), a function making the bad value
    from the good one): one per casting rule."""
    big = 2.0**63
    cases: list[tuple[str, str, Callable[[np.ndarray], Any]]] = [
        ("action", "float beyond int64", lambda a: np.full(a.shape, big)),
        ("action", "NaN into int", lambda a: np.where(a == a.reshape(-1)[0], np.nan, 1.0)
         .astype(np.float64)),
        ("action", "fraction into int", lambda a: a.astype(np.float64) + 0.5),
        ("action", "fraction in a list", lambda a: (a.astype(np.float64) + 0.5).tolist()),
        ("action", "uint64 beyond int64", lambda a: np.full(a.shape, 2**63, np.uint64)),
        ("action", "complex", lambda a: a.astype(np.complex128)),
        ("action", "string", lambda a: a.astype(str)),
        ("terminated", "2 in int64 flags", lambda a: a.astype(np.int64) + 2),
        ("terminated", "-1 in int8 flags", lambda a: -a.astype(np.int8) - 1),
        ("terminated", "2 in a list", lambda a: (a.astype(np.int64) + 2).tolist()),
        ("terminated", "0.5 in f64 flags", lambda a: a.astype(np.float64) + 0.5),
        ("obs", "complex obs", lambda a: a.astype(np.complex64)),
        ("obs", "string obs", lambda a: a.astype(str)),
        ("obs", "wrong shape", lambda a: a[..., :2]),
        ("obs", "ragged list, last row longer", lambda a: _ragged(a, True)),
        ("obs", "ragged list, last row shorter", lambda a: _ragged(a, False)),
        ("terminated", "ragged flags", lambda a: _ragged(a, True) if a.ndim else [a.item()]),
    ]
    if torch is not None:
        cases += [
            ("action", "torch NaN into int", lambda a: _tensor(np.full(a.shape, np.nan))),
            ("terminated", "torch int 2 flags",
             lambda a: _tensor(a.astype(np.int64) + 2)),
            ("obs", "torch complex obs", lambda a: _tensor(a.astype(np.complex64))),
            ("obs", "torch wrong shape", lambda a: _tensor(a[..., :2])),
        ]
    return [pytest.param(f, conv, id=f"{f}-{name}") for f, name, conv in cases]


def _edge_floats(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float64 values of ``shape`` whose float32 cast is easy to get wrong: NaNs with
    payloads and signs, infinities, signed zeros, float64 subnormals (0 in float32),
    values in float32's subnormal range, beyond its largest (inf), halfway between two
    float32s (round to even), around 2**24, mixed with plain normals."""
    f32 = np.finfo(np.float32)
    nan_bits = np.array([0x7FF8000000000001, 0xFFF0000000000ABC, 0x7FF4000000000000],
                        np.uint64).view(np.float64)
    halfway = (np.float64(1.0) + np.float64(2.0) ** -24) * np.array([1.0, 3.0, -5.0])
    edges = np.concatenate([
        nan_bits, [np.inf, -np.inf, 0.0, -0.0, 5e-324, -2.2e-308, float(f32.tiny) / 3,
                   -float(f32.smallest_subnormal), float(f32.max) * 1.0000001, -1e300,
                   float(f32.max), 2.0**24 + 1, -(2.0**24) - 3], halfway])
    out = rng.standard_normal(shape)
    flat = out.reshape(-1)
    at = rng.choice(flat.size, size=min(flat.size, 8 * edges.size), replace=False)
    flat[at] = np.resize(edges, at.size)
    return out


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("lanes", [1, 4])
def test_edge_values_through_long_casts(writer: str, lanes: int) -> None:
    """Long chunks (vector bodies and tails of every cast kernel) of edge values in
    float64 obs and next_obs, int64 rewards beyond float32's exact range, float64 values
    and int8 / uint8 / int64 flags: the whole state equals the reference's, byte for byte."""
    rng = np.random.default_rng(lanes)
    n = 397  # odd: every kernel's vector body leaves a tail
    fast, slow = twins(writer, lambda: rb.ReplayBuffer(capacity=450 * lanes, num_envs=lanes,
                                                        spec=SPEC_INT, seed=0))
    general = _no_general(fast, slow, rng)
    for flag_type in (np.int8, np.uint8, np.int64):
        lead = (n, lanes) if lanes > 1 else (n,)
        call = {"obs": _edge_floats(rng, (*lead, 3)), "next_obs": _edge_floats(rng, (*lead, 3)),
                "action": rng.integers(0, 4, lead),
                "reward": rng.integers(-(2**40), 2**40, lead) | 1,
                "terminated": (rng.random(lead) < 0.05).astype(flag_type),
                "truncated": (rng.random(lead) < 0.05).astype(flag_type),
                "value": _edge_floats(rng, lead)}
        fast.extend(**call)
        slow.extend(**call)
        same_everything(fast, slow)
        stored = fast.buf.state_dict()["table"]["fields/obs"]
        assert np.isnan(stored).any() and np.isinf(stored).any()  # the edges went in
    if writer == "compiled":
        assert general == [], "a cast took the Python boundary"


#: obs width of the large-chunk test: a chunk of 26 steps or more holds 1,024 obs items,
#: enough for the compiled writer to convert float64 observations where it writes them
WIDE_OBS = 40


def _lanes_apart(a: np.ndarray) -> np.ndarray:
    """``a`` ``[n, lanes, ...]`` as a view of a lane-major array (its step and lane dims do
    not merge into one stride); ``a`` itself with one dim before the items."""
    if a.ndim < 3:
        return a
    return np.ascontiguousarray(a.swapaxes(0, 1)).swapaxes(0, 1)


def _column_slice(a: np.ndarray) -> np.ndarray:
    """``a`` as the first columns of a wider array (each cell's items contiguous, the
    cells not)."""
    wide = np.zeros((*a.shape[:-1], a.shape[-1] + 3), a.dtype)
    wide[..., :a.shape[-1]] = a
    return wide[..., :a.shape[-1]]


#: layouts of the large chunks' obs and next_obs: float64 contiguous, column slices
#: (cells apart), strided (every other item), lanes apart; float32 strided (the stored
#: format, not contiguous)
LAYOUTS: dict[str, Conv] = {
    "f64": lambda a: a,
    "f64 column slice": _column_slice,
    "f64 strided": _strided,
    "f32 strided": lambda a: _strided(a.astype(np.float32)),
    "f64 lanes apart": _lanes_apart,
}


def _f64_stream(rng: np.random.Generator, n: int, lanes: int, cur: np.ndarray
                ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``n`` steps of ``lanes`` lanes with float64 obs / next_obs ``[n, lanes, WIDE_OBS]``:
    each lane sequential but for episode ends and gaps (some only in the last item), and
    some next observations that differ from the next step's obs as float64 but not once
    cast to float32."""
    obs = np.empty((n, lanes, WIDE_OBS))
    nxt = np.empty((n, lanes, WIDE_OBS))
    term = rng.random((n, lanes)) < 0.03
    trunc = rng.random((n, lanes)) < 0.02
    for i in range(n):
        obs[i] = cur
        nxt[i] = rng.standard_normal((lanes, WIDE_OBS))
        cur = nxt[i].copy()
        jump = term[i] | trunc[i] | (rng.random(lanes) < 0.03)
        cur[jump] = rng.standard_normal((int(jump.sum()), WIDE_OBS))
        near = ~jump & (rng.random(lanes) < 0.1)
        nxt[i, near] *= 1.0 + 1e-12  # another float64, the same float32
        last = ~jump & ~near & (rng.random(lanes) < 0.05)
        cur[last, -1] += 1.0  # a gap only the last item of the obs shows
    return {"obs": obs, "action": rng.integers(0, 4, (n, lanes)),
            "reward": rng.standard_normal((n, lanes)), "next_obs": nxt, "terminated": term,
            "truncated": trunc, "value": rng.standard_normal((n, lanes))}, cur


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("lanes", [1, 4])
@pytest.mark.parametrize("storage", ["numpy", "memmap"])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), cap=st.sampled_from([37, 90]))
def test_large_float64_chunks_land_as_the_reference(
        tmp_path_factory: pytest.TempPathFactory, writer: str, lanes: int, storage: str,
        seed: int, cap: int) -> None:
    """obs and next_obs chunks of 1,024 items or more, each in a layout of its own
    (float64 contiguous or in column slices: converted where written, the continuity
    compared on the items as given first; strided or lane-major: converted first):
    extends that wrap, of every lane or of some (``env_ids``), with episode ends,
    gaps and next observations equal only once cast, on numpy and memmap storage (which
    writes in chunks), some of one step: the whole state equals the reference's after
    every call."""
    rng = np.random.default_rng(seed)
    spec = {**SPEC_INT, "obs": ((WIDE_OBS,), "float32")}

    def make() -> rb.ReplayBuffer:
        kw: dict[str, Any] = {} if storage == "numpy" else {
            "storage": "memmap", "path": tmp_path_factory.mktemp("lazy")}
        return rb.ReplayBuffer(capacity=cap * lanes, num_envs=lanes, spec=spec, seed=0, **kw)

    fast, slow = twins(writer, make)
    cur = rng.standard_normal((lanes, WIDE_OBS))
    for _ in range(6):
        ids = None
        if lanes > 1 and rng.random() < 0.3:
            ids = sorted(rng.choice(lanes, size=int(rng.integers(1, lanes)), replace=False))
        width = lanes if ids is None else len(ids)
        if rng.random() < 0.75:
            n = int(rng.integers(26, 2 * cap + 5))
            d, nxt_cur = _f64_stream(rng, n, width, cur if ids is None else cur[ids])
        else:
            d, nxt_cur = _f64_stream(rng, 1, width, cur if ids is None else cur[ids])
        if ids is None:
            cur = nxt_cur
        else:
            cur[ids] = nxt_cur
        if lanes == 1:
            d = {k: v[:, 0] for k, v in d.items()}
        for k in ("obs", "next_obs"):  # each in a layout of its own
            d[k] = LAYOUTS[sorted(LAYOUTS)[int(rng.integers(len(LAYOUTS)))]](d[k])
        kw = {"env_ids": ids} if ids is not None else {}
        for b in (fast, slow):
            b.extend(**d, **kw)
        same_everything(fast, slow)


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("lanes", [1, 4])
def test_large_float64_chunks_broadcast(writer: str, lanes: int) -> None:
    """obs and next_obs chunks of 1,024 items or more that are broadcasts (stride 0 over
    the steps, over the lanes, or over everything): read as the reference reads them."""
    rng = np.random.default_rng(lanes)
    spec = {**SPEC_INT, "obs": ((WIDE_OBS,), "float32")}
    fast, slow = twins(writer, lambda: rb.ReplayBuffer(capacity=64 * lanes, num_envs=lanes,
                                                        spec=spec, seed=0))
    n = 40
    lead = (n, lanes) if lanes > 1 else (n,)
    row = rng.standard_normal(WIDE_OBS)
    per_lane = rng.standard_normal((lanes, WIDE_OBS)) if lanes > 1 else row
    d, _ = _f64_stream(rng, n, lanes, rng.standard_normal((lanes, WIDE_OBS)))
    if lanes == 1:
        d = {k: v[:, 0] for k, v in d.items()}
    shapes = (*lead, WIDE_OBS)
    for obs, nxt in [(np.broadcast_to(row, shapes), np.broadcast_to(row, shapes)),
                     (np.broadcast_to(per_lane, shapes), d["next_obs"]),
                     (np.broadcast_to(np.float64(0.5), shapes), np.broadcast_to(row, shapes)),
                     (d["obs"], np.broadcast_to(per_lane, shapes))]:
        for b in (fast, slow):
            b.extend(**{**d, "obs": obs, "next_obs": nxt})
        same_everything(fast, slow)


@pytest.mark.parametrize("writer", WRITERS)
def test_large_float64_chunks_that_are_the_buffers_own_memory(writer: str) -> None:
    """obs and next_obs given as views of the buffer's own float64 field (its state dict's
    arrays are views): converted before anything is written, as the reference does."""
    lanes, n = 2, 30
    spec = {**SPEC_INT, "obs": ((WIDE_OBS,), "float32"), "big": ((WIDE_OBS,), "float64")}
    fast, slow = twins(writer, lambda: rb.ReplayBuffer(capacity=2 * n * lanes,
                                                        num_envs=lanes, spec=spec, seed=0))
    rng = np.random.default_rng(0)
    for _ in range(3):
        d, _ = _f64_stream(rng, n, lanes, rng.standard_normal((lanes, WIDE_OBS)))
        d["big"] = rng.standard_normal((n, lanes, WIDE_OBS))
        for b in (fast, slow):
            own = b.buf.state_dict()["table"]["fields/big"].reshape(-1, lanes, WIDE_OBS)
            b.extend(**{**d, "obs": own[:n], "next_obs": own[n:2 * n]})
        same_everything(fast, slow)


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("lanes", [1, 4])
@pytest.mark.parametrize("op", ["add", "extend"])
@pytest.mark.parametrize(("field", "bad"), _refused_cases())
def test_refused_casts_match_the_reference(writer: str, lanes: int, op: str, field: str,
                                           bad: Callable[[np.ndarray], Any]) -> None:
    """A value a casting rule refuses: the writer under test raises the reference's
    exception type and message, and both buffers stay exactly as they were."""
    rng = np.random.default_rng(3)
    fast, slow = twins(writer, lambda: rb.ReplayBuffer(capacity=6 * lanes, num_envs=lanes,
                                                        spec=SPEC_INT, seed=0))
    cur = rng.standard_normal((lanes, 3)).astype(np.float32)
    d, cur = _stream(rng, 9, lanes, False, cur)  # wraps the ring once
    if lanes == 1:
        d = {k: v[:, 0] for k, v in d.items()}
    for b in (fast, slow):
        b.extend(**d)
    before = snapshot(fast.buf)
    d, cur = _stream(rng, 3, lanes, False, cur)
    if lanes == 1:
        d = {k: v[:, 0] for k, v in d.items()}
    call = {k: v[0, ...] for k, v in d.items()} if op == "add" else dict(d)
    call = _one_kind_call("bad", bad, field, call, False)
    errors = []
    for b in (fast, slow):
        with pytest.raises(Exception) as info:  # the type is compared below
            getattr(b, op)(**call)
        errors.append(info.value)
    assert type(errors[0]) is type(errors[1]) and str(errors[0]) == str(errors[1])
    assert snapshot(fast.buf) == before
    same_everything(fast, slow)


@_NOT_BUILT
@pytest.mark.parametrize("lanes", [1, 4])
def test_compiled_refusal_writes_nothing(lanes: int) -> None:
    """The C boundary itself returns 0 for a refused cast in a late field (after the
    casts of the earlier ones succeeded) and leaves the table untouched."""
    rng = np.random.default_rng(5)
    buf = rb.ReplayBuffer(capacity=4 * lanes, num_envs=lanes, spec=SPEC_INT, seed=0)
    cur = rng.standard_normal((lanes, 3)).astype(np.float32)
    d, cur = _stream(rng, 6, lanes, False, cur)
    buf.extend(**d)
    w = CompiledWriter.of(buf.table)
    assert w is not None
    before = snapshot(buf)
    d, cur = _stream(rng, 3, lanes, False, cur)
    obs64, nxt64 = d["obs"].astype(np.float64), d["next_obs"].astype(np.float64)
    ok_flags = d["terminated"].astype(np.int64)
    bad_flags = ok_flags + 2
    assert w.write(None, True, obs64, d["action"], d["reward"], nxt64, ok_flags,
                   bad_flags, {"value": d["value"]}) == 0
    assert snapshot(buf) == before
    assert w.write(None, True, obs64, d["action"], d["reward"], nxt64, ok_flags,
                   ok_flags, {"value": d["value"]}) == 3
    assert snapshot(buf) != before


@_NOT_BUILT
@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_torch_tensors_that_need_the_host() -> None:
    """Tensors the direct read leaves to the host callback (lazy negation, bfloat16, a
    subclass, requires_grad through the plain read) still land as the reference's; a
    tensor is read where it lies, never through a shadowing instance attribute."""
    rng = np.random.default_rng(11)
    fast, slow = twins("compiled", lambda: rb.ReplayBuffer(capacity=8, spec=SPEC_FLOAT,
                                                            seed=0))
    general = _no_general(fast, slow, rng, cont=True)
    cur = rng.standard_normal((1, 3)).astype(np.float32)

    class Sub(torch.Tensor):
        pass

    makers: list[Callable[[np.ndarray], Any]] = [
        lambda a: torch.from_numpy(-a)._neg_view(),  # a lazy negation: values a
        lambda a: torch.from_numpy(a).to(torch.bfloat16).to(torch.float32),
        lambda a: torch.from_numpy(a).as_subclass(Sub),
        lambda a: torch.from_numpy(a).requires_grad_(True),
    ]
    for make in makers:
        d, cur = _stream(rng, 5, 1, True, cur)
        d = {k: v[:, 0] for k, v in d.items()}
        call = dict(d, obs=make(d["obs"]), next_obs=make(d["next_obs"]),
                    action=make(d["action"]))
        fast.extend(**call)
        slow.extend(**call)
        same_everything(fast, slow)
    assert general == []
    t = torch.zeros(3)
    t.data_ptr = lambda: 0  # type: ignore[method-assign]  # must not be called
    for b in (fast, slow):
        b.add(obs=t, action=np.zeros(2, np.float32), reward=0.0, next_obs=t + 1,
              terminated=False, truncated=False, value=0.0)
    same_everything(fast, slow)


def _offset(t: Any) -> Any:
    """``t``'s values in a tensor that starts one row into its storage."""
    pad = torch.zeros((1, *t.shape), dtype=t.dtype)
    return torch.cat([pad, t[None]])[1]


def _expanded(t: Any) -> Any:
    """``t``'s values where the leading dim has stride 0 (an ``expand`` of one row) when all
    its rows are equal, else a transposed copy (a column-major layout)."""
    if t.ndim >= 2 and bool((t == t[:1]).all()):
        return t[:1].expand(*t.shape)
    if t.ndim < 2:
        return t
    rev = tuple(range(t.ndim - 1, -1, -1))
    return t.permute(rev).contiguous().permute(rev)


#: tensor layouts and dtypes a torch loop hands over, each with the same values
TENSOR_MAKERS: dict[str, Callable[[Any], Any]] = {
    "plain": lambda t: t,
    "offset": _offset,
    "expanded or column-major": _expanded,
    "strided": lambda t: torch.stack([t, t], dim=-1)[..., 0],
    "float64": lambda t: t.double() if t.is_floating_point() else t,
    "int64 flags": lambda t: t.long() if t.dtype == torch.bool else t,
    "float flags": lambda t: t.float() if t.dtype == torch.bool else t,
    "requires grad": lambda t: t.float().requires_grad_(True) if t.is_floating_point() else t,
}


@_NOT_BUILT
@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("lanes", [1, 3])
@pytest.mark.parametrize("maker", sorted(TENSOR_MAKERS))
def test_torch_tensor_layouts_land_as_the_reference(lanes: int, maker: str) -> None:
    """Every field a torch CPU tensor (offsets into storage, stride-0 expands, column-major
    and strided layouts, float64 values, int and float flags, requires_grad): the
    compiled writer reads each where it lies (never the Python boundary) and stores what
    the reference writer stores."""
    rng = np.random.default_rng(5 + lanes)
    fast, slow = twins("compiled", lambda: rb.ReplayBuffer(capacity=6 * lanes, num_envs=lanes,
                                                            spec=SPEC_FLOAT, seed=0))
    general = _no_general(fast, slow, rng, cont=True)
    cur = rng.standard_normal((lanes, 3)).astype(np.float32)
    make = TENSOR_MAKERS[maker]
    for i in range(8):
        n = 1 + i % 3
        d, cur = _stream(rng, n, lanes, True, cur)
        if i % 4 == 0:  # equal rows: the expand maker's stride-0 case
            d["obs"][:] = d["obs"][:1]
        if lanes == 1:
            d = {k: v[:, 0] for k, v in d.items()}
        call = {k: make(torch.from_numpy(np.array(v))) for k, v in d.items()}
        op = "extend" if i % 2 else "add"
        if op == "add":
            call = {k: v[0] for k, v in call.items()}
        for b in (fast, slow):
            getattr(b, op)(**call)
        same_everything(fast, slow)
    assert general == []


@_NOT_BUILT
@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_torch_lazy_conjugation_lands_as_the_reference() -> None:
    """A complex tensor with a lazy conjugation bit (which a zero-copy export does not
    carry) stores its conjugated values, as the reference writer does."""
    spec = {**SPEC_FLOAT, "z": ((2,), "complex64")}
    rng = np.random.default_rng(3)
    fast, slow = twins("compiled", lambda: rb.ReplayBuffer(capacity=8, spec=spec, seed=0))
    z = (rng.standard_normal(2) + 1j * rng.standard_normal(2)).astype(np.complex64)
    lazy = torch.from_numpy(z.copy()).conj()
    assert lazy.is_conj()
    for b in (fast, slow):
        b.add(obs=np.zeros(3, np.float32), action=np.zeros(2, np.float32), reward=0.0,
              next_obs=np.ones(3, np.float32), terminated=False, truncated=False,
              value=0.0, z=lazy)
    same_everything(fast, slow)
    assert np.array_equal(fast.buf.table.arrays["z"][0, 0], np.conj(z))
