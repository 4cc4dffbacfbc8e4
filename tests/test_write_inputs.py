"""Every input kind a user may pass to ``add`` / ``extend`` lands exactly as the reference
writer lands it, and every value the casting rules refuse is refused the same way.

Oracle: a twin buffer built the same way and driven under ``REPLAYBANK_WRITER=reference``
(every call validated and cast by the general path, ``check_call`` / ``cast_field``, and
written by the reference writer). The buffer under test runs under ``auto`` (the fastest
writer that applies). After every call the whole state must be equal byte for byte
(:func:`tests.twins.same_everything`: table data, links, side store, free-slot order,
counters, sampler, view and generator state); a refused call must raise the same
exception type (and message) in both and leave both exactly as they were.

1. Random call sequences mixing every input kind (exact arrays, other dtypes, big-endian,
   non-contiguous and read-only arrays, Python and numpy scalars, (nested) lists, torch
   tensors, non-canonical bools, ...) over flat, dict and frame-stack observations, extra
   fields, several lanes out of step, initial priorities, episode ends and gaps, small
   rings that wrap, memmap files and inferred specs.
2. One case per casting rule of :func:`replaybank.spec.cast_field` (and the field-set
   and shape checks of :func:`replaybank.buffers.checked_call.check_call`), for a scalar, an
   array, an extra and a dict-obs field, in ``add`` of one and of four lanes, ``env_ids``
   adds and ``extend``: refused values, and their accepted neighbours (lossless edges,
   rounding traps).
3. Bad initial priorities are refused before anything is written.
"""

from __future__ import annotations

import functools
import pickle
import tempfile
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.spec import unflatten
from tests.twins import Under, same_everything, same_sampler, same_state, snapshot, twins

try:  # torch is an optional extra: its input kinds are left out without it
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

pytestmark = [
    # float64 values beyond float32's range become inf (as numpy casts them), with a warning
    pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning"),
]

Shape = tuple[int, ...]
Fields = dict[str, tuple[Shape, np.dtype[Any]]]


# ---------------------------------------------------------------- canonical values
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
# exponent bits of a float's NaN/inf, and its mantissa mask
_NAN_BITS = {2: (0x7C00, 0x3FF), 4: (0x7F800000, 0x7FFFFF),
             8: (0x7FF0000000000000, 0xFFFFFFFFFFFFF)}
_SPECIAL = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 3.0e38, -3.0e38, 1e-40, -1e-310,
                     6.5e4, 1e300, 2.0**24 + 1, 0.1, -1.0])


def _floats(rng: np.random.Generator, dt: np.dtype[Any], shape: Shape) -> np.ndarray:
    """Floats of every magnitude, with NaN (random payloads, quiet and signalling, either
    sign), signed zeros, infinities, denormals and values beyond the dtype's range."""
    x = np.asarray(rng.standard_normal(shape) * 10.0 ** rng.integers(-4, 6, shape))
    x = np.where(rng.random(shape) < 0.25, rng.choice(_SPECIAL, size=shape), x)
    with np.errstate(over="ignore"):
        out = np.asarray(x.astype(dt))
    nan_at = rng.random(shape) < 0.06
    if nan_at.any():
        exp, mant = _NAN_BITS[dt.itemsize]
        k = int(nan_at.sum())
        payload = rng.integers(1, mant, k, dtype=np.uint64, endpoint=True)
        sign = rng.integers(0, 2, k, dtype=np.uint64) << np.uint64(dt.itemsize * 8 - 1)
        bits = out.view(_UINT[dt.itemsize])
        bits[nan_at] = (np.uint64(exp) | payload | sign).astype(bits.dtype)
    return out


def _ints(rng: np.random.Generator, dt: np.dtype[Any], shape: Shape) -> np.ndarray:
    info = np.iinfo(dt)
    x = rng.integers(max(int(info.min), -100), min(int(info.max), 100), shape,
                     endpoint=True)
    ends = rng.choice(np.array([info.min, info.max], dtype=dt), size=shape)
    return np.asarray(np.where(rng.random(shape) < 0.1, ends, x.astype(dt)), dtype=dt)


def canon(rng: np.random.Generator, dt: np.dtype[Any], shape: Shape) -> np.ndarray:
    """A value of exactly the stored dtype (any bit pattern a field may hold)."""
    if dt.kind == "f":
        return _floats(rng, dt, shape)
    if dt.kind == "b":
        return np.asarray(rng.random(shape) < 0.5)
    return _ints(rng, dt, shape)


# ---------------------------------------------------------------- input kinds
_TORCH_DTYPES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64",
                 "uint8", "bool"}


def _tensor(a: np.ndarray, strided: bool = False) -> Any:
    """``a`` as a torch CPU tensor (a strided view when ``strided``), or None."""
    if torch is None or a.dtype.name not in _TORCH_DTYPES or not a.dtype.isnative:
        return None
    if strided and a.ndim >= 1:
        base = np.empty((*a.shape[:-1], a.shape[-1] * 2), a.dtype)
        base[..., ::2] = a
        return torch.from_numpy(base)[..., ::2]
    return torch.from_numpy(np.array(a, copy=True))


def _fits(v: np.ndarray, dt: Any) -> bool:
    info = np.iinfo(dt)
    return not v.size or (int(v.min()) >= info.min and int(v.max()) <= info.max)


def _strided(v: np.ndarray) -> np.ndarray:
    base = np.empty((*v.shape[:-1], v.shape[-1] * 2), v.dtype)
    base[..., ::2] = v
    return base[..., ::2]


def _readonly(v: np.ndarray) -> np.ndarray:
    c = np.array(v, copy=True)
    c.setflags(write=False)
    return c


def _noncanonical(rng: np.random.Generator, v: np.ndarray) -> np.ndarray:
    """A bool array with the same truth values held in bytes other than 0/1."""
    u = v.astype(np.uint8) * rng.integers(1, 256, v.shape, dtype=np.uint8, endpoint=False)
    return np.asarray(u).view(np.bool_)


def _as_ints(v: np.ndarray) -> np.ndarray:
    """Floats as int64 (finite, rounded, clipped): an int value for a float field."""
    x = np.nan_to_num(v.astype(np.float64), nan=0.0, posinf=7.0, neginf=-7.0)
    return np.clip(np.round(x), -(2.0**53), 2.0**53).astype(np.int64)


def _negzero(v: np.ndarray) -> np.ndarray:
    """An int value as float64 with its zeros as -0.0."""
    f = v.astype(np.float64)
    return np.where(f == 0, -0.0, f)


class _Sub(np.ndarray):
    """An ndarray subclass (what a library's own array type may be)."""


def _array_kinds(rng: np.random.Generator, v: np.ndarray) -> dict[str, Callable[[], Any]]:
    """Input kinds of the value ``v`` (the stored dtype, call shape) that the general
    path accepts: name -> builder."""
    dt = v.dtype
    k: dict[str, Callable[[], Any]] = {
        "exact": lambda: v,
        "readonly": lambda: _readonly(v),
        "list": lambda: v.tolist(),
        "torch": lambda: _tensor(v),
        "subclass": lambda: np.array(v, copy=True).view(_Sub),
    }
    if dt.itemsize > 1:
        k["big_endian"] = lambda: v.astype(dt.newbyteorder(">"))
    if v.ndim >= 1:
        k["strided"] = lambda: _strided(v)
        k["negative_strides"] = lambda: np.array(v[::-1], copy=True)[::-1]
        k["tuple"] = lambda: tuple(v.tolist())
        k["list_of_rows"] = lambda: list(v)  # numpy scalars or arrays
        k["torch_strided"] = lambda: _tensor(v, strided=True)
    if v.ndim >= 2:
        k["fortran"] = lambda: np.asfortranarray(v)
        k["transposed"] = lambda: np.array(np.swapaxes(v, 0, 1), copy=True).swapaxes(0, 1)
    if dt.kind == "f":
        k["float64"] = lambda: v.astype(np.float64)
        k["float32"] = lambda: v.astype(np.float32)
        k["float16"] = lambda: v.astype(np.float16)
        k[">f8"] = lambda: v.astype(">f8")
        k[">f4"] = lambda: v.astype(">f4")
        k["int64"] = lambda: _as_ints(v)
        k[">i8"] = lambda: _as_ints(v).astype(">i8")
        k["int8"] = lambda: np.clip(_as_ints(v), -128, 127).astype(np.int8)
        k["bool"] = lambda: v > 0
        k["torch_float64"] = lambda: _tensor(v.astype(np.float64))
        k["torch_float32"] = lambda: _tensor(v.astype(np.float32))
        k["torch_int64"] = lambda: _tensor(_as_ints(v))
        k["torch_bool"] = lambda: _tensor(v > 0)
        k["nested_float_list"] = lambda: v.astype(np.float64).tolist()
    elif dt.kind in "iu":
        k["int64"] = lambda: v.astype(np.int64)
        k[">i8"] = lambda: v.astype(">i8")
        k["torch_int64"] = lambda: _tensor(v.astype(np.int64))
        if _fits(v, np.int8):
            k["int8"] = lambda: v.astype(np.int8)
        if _fits(v, np.uint8):
            k["uint8"] = lambda: v.astype(np.uint8)
        if _fits(v, np.uint64):
            k["uint64"] = lambda: v.astype(np.uint64)
        if not v.size or np.abs(v.astype(np.float64)).max() <= 2.0**53:
            k["float64"] = lambda: v.astype(np.float64)
            k["-0.0"] = lambda: _negzero(v)
            k[">f8"] = lambda: v.astype(">f8")
            k["torch_float64"] = lambda: _tensor(v.astype(np.float64))
    elif dt.kind == "b":
        k["int64"] = lambda: v.astype(np.int64)
        k["int8"] = lambda: v.astype(np.int8)
        k["uint8"] = lambda: v.astype(np.uint8)
        k["uint64"] = lambda: v.astype(np.uint64)
        k[">i8"] = lambda: v.astype(">i8")
        k["float64"] = lambda: v.astype(np.float64)
        k["-0.0"] = lambda: _negzero(v)
        k["non_canonical"] = lambda: _noncanonical(rng, v)
        k["torch_bool"] = lambda: _tensor(v)
        k["torch_int64"] = lambda: _tensor(v.astype(np.int64))
        k["torch_float32"] = lambda: _tensor(v.astype(np.float32))
    return k


def _scalar_kinds(v: np.ndarray) -> dict[str, Callable[[], Any]]:
    """Scalar input kinds of the 0-d value ``v`` (a scalar field of a one-lane add)."""
    dt = v.dtype
    x = v[()]
    k: dict[str, Callable[[], Any]] = {
        "python": lambda: x.item(),
        "numpy_scalar": lambda: x,
        "0-d": lambda: np.asarray(v),
    }
    if torch is not None and dt.name in _TORCH_DTYPES:
        k["torch_0d"] = lambda: torch.tensor(x.item())
    if dt.kind == "f":
        k["np_float64"] = lambda: np.float64(x)
        k["np_float32"] = lambda: np.float32(x)
        k["np_float16"] = lambda: np.float16(x)
        k["python_int"] = lambda: int(_as_ints(v))
        k["python_big_int"] = lambda: (int(_as_ints(v)) % 4096 + 2**20) * 2**41 + 1
        k["python_bool"] = lambda: bool(x > 0)
        k["np_bool"] = lambda: np.bool_(x > 0)
        k["np_int64"] = lambda: np.int64(_as_ints(v))
    elif dt.kind in "iu":
        k["np_int64"] = lambda: np.int64(x)
        if abs(int(x)) <= 2**53:
            k["python_float"] = lambda: float(x)
            k["np_float64"] = lambda: np.float64(x)
            k["-0.0"] = lambda: -0.0 if x == 0 else float(x)
        if _fits(v, np.uint8):
            k["np_uint8"] = lambda: np.uint8(x)
        if _fits(v, np.int8):
            k["np_int8"] = lambda: np.int8(x)
    elif dt.kind == "b":
        k["python_int"] = lambda: int(x)
        k["python_float"] = lambda: float(x)
        k["np_int8"] = lambda: np.int8(x)
        k["np_uint64"] = lambda: np.uint64(x)
        k["np_float32"] = lambda: np.float32(x)
        k["-0.0"] = lambda: -0.0 if not x else 1.0
    return k


def variant(rng: np.random.Generator, v: np.ndarray, scalar_ok: bool,
            same_dtype: bool = False) -> Any:
    """``v`` (stored dtype, call shape) as an input of a random kind the general path
    accepts; ``scalar_ok``: Python and numpy scalars too (a 0-d value of a one-lane add);
    ``same_dtype``: only kinds a first add infers the same field from."""
    if same_dtype:
        kinds: dict[str, Callable[[], Any]] = {
            "exact": lambda: v, "readonly": lambda: _readonly(v)}
        if v.dtype.itemsize > 1:
            kinds["big_endian"] = lambda: v.astype(v.dtype.newbyteorder(">"))
        if v.ndim >= 1:
            kinds["strided"] = lambda: _strided(v)
    else:
        kinds = _array_kinds(rng, v)
        if scalar_ok and v.ndim == 0:
            kinds.update(_scalar_kinds(v))
    names = sorted(kinds)
    while True:
        out = kinds[names[int(rng.integers(len(names)))]]()
        if out is not None:  # a torch kind without torch
            return out


# ---------------------------------------------------------------- layouts
@dataclass(frozen=True)
class Layout:
    """A buffer's fields: ``spec`` is passed to the buffer unless ``inferred`` (the first
    add then implies it)."""

    spec: dict[str, Any]
    frame_stack: int = 1
    inferred: bool = False

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"frame_stack": self.frame_stack}
        if not self.inferred:
            out["spec"] = self.spec
        return out


LAYOUTS = {
    # flat obs, int action, float32 reward, scalar extras
    "flat": Layout({"obs": ((3,), "float32"), "action": ((), "int64"),
                    "reward": ((), "float32"), "log_prob": ((), "float32"),
                    "mode": ((), "int8")}),
    # 2-D obs, float action, float64 reward, array / bool / uint8 / float16 extras
    "wide": Layout({"obs": ((2, 3), "float32"), "action": ((2,), "float32"),
                    "reward": ((), "float64"), "hidden": ((2,), "float32"),
                    "valid": ((2,), "bool"), "count": ((), "uint8"), "h16": ((), "float16")}),
    # a dict observation (float and uint8 parts)
    "dict": Layout({"obs": {"a": ((3,), "float32"), "b": ((2,), "uint8")},
                    "action": ((), "int64"), "reward": ((), "float32"),
                    "log_prob": ((), "float32")}),
    # frame stacks: stacks of 4 frames [4, 2, 3] in, the newest frame stored
    "stack": Layout({"obs": ((2, 3), "float32"), "action": ((), "int64"),
                     "reward": ((), "float32")}, frame_stack=4),
    # no spec: the first add implies it
    "inferred": Layout({"obs": ((3,), "float32"), "action": ((2,), "float32"),
                        "reward": ((), "float32"), "log_prob": ((), "float32"),
                        "step": ((), "int64")}, inferred=True),
}

_FLAGS = {"terminated": ((), np.dtype(np.bool_)), "truncated": ((), np.dtype(np.bool_))}


def layout_fields(layout: Layout) -> Fields:
    """Every stored field of a layout: flat name -> (shape, dtype)."""
    spec = rb.Spec.coerce(layout.spec)
    out: Fields = {n: (f.shape, f.dtype) for n, f in spec.items()}
    out.setdefault("reward", ((), np.dtype(np.float32)))
    out.update({k: v for k, v in _FLAGS.items() if k not in out})
    return out


def buffer_fields(buf: Any) -> Fields:
    return {n: (f.shape, f.dtype) for n, f in buf.spec.items()}


def _obs_names(fields: Fields) -> list[str]:
    return [n for n in fields if n == "obs" or n.startswith("obs/")]


# ---------------------------------------------------------------- the random driver
class Driver:
    """Feeds the same random calls to a buffer under ``auto`` and its reference twin and
    compares their whole state after each."""

    def __init__(self, rng: np.random.Generator, layout: Layout, fast: Under, ref: Under,
                 lanes: int, prioritized: bool) -> None:
        self.rng, self.layout, self.fast, self.ref = rng, layout, fast, ref
        self.lanes, self.prioritized = lanes, prioritized
        self.p_end = float(rng.choice([0.0, 0.1, 0.3]))
        self.p_gap = float(rng.choice([0.0, 0.05, 0.2]))
        self.fields = layout_fields(layout)
        self.cur = {n: canon(rng, dt, (lanes, *s))
                    for n, (s, dt) in self.fields.items() if n in _obs_names(self.fields)}
        self.fresh = np.ones(lanes, bool)  # [lanes] the lane's next step starts an episode
        self.starts = np.empty((0, 0), bool)  # [n, m] of the call being made

    # the canonical values of a call: flat names -> [n, m, *shape] (stored dtypes)
    def _values(self, ids: np.ndarray, n: int) -> dict[str, np.ndarray]:
        rng, m = self.rng, len(ids)
        obs_names = _obs_names(self.fields)
        out: dict[str, np.ndarray] = {}
        for name in obs_names:
            s, dt = self.fields[name]
            out[name] = np.empty((n, m, *s), dt)
            out["next_" + name] = canon(rng, dt, (n, m, *s))
        term = rng.random((n, m)) < self.p_end / 2
        trunc = rng.random((n, m)) < self.p_end / 2
        for i in range(n):
            for name in obs_names:
                out[name][i] = self.cur[name][ids]
            for j, lane in enumerate(ids):
                ended = bool(term[i, j] or trunc[i, j])
                gap = rng.random() < self.p_gap  # data out of order: next_obs is not next
                jump = obs_names[int(rng.integers(len(obs_names)))]  # a gap moves one part
                for name in obs_names:
                    s, dt = self.fields[name]
                    if ended or (gap and name == jump):
                        self.cur[name][lane] = canon(rng, dt, s)
                    else:
                        self.cur[name][lane] = out["next_" + name][i, j]
        for name, (s, dt) in self.fields.items():
            if name not in out and name not in _FLAGS:
                out[name] = canon(rng, dt, (n, m, *s))
        out["terminated"], out["truncated"] = term, trunc
        # [n, m] the steps that start an episode: a lane's first, or one after an end
        self.starts = np.empty((n, m), bool)
        for i in range(n):
            self.starts[i] = self.fresh[ids]
            self.fresh[ids] = term[i] | trunc[i]
        return out

    def _stacked(self, frame: np.ndarray, lead: Shape) -> np.ndarray:
        """A stack of ``frame_stack`` frames whose newest is ``frame`` (older ones random,
        or at an episode's first step ``frame`` repeated, as the buffer rebuilds it)."""
        k, axis = self.layout.frame_stack, len(lead)
        older = canon(self.rng, frame.dtype, (*lead, k - 1, *frame.shape[axis:]))
        starts = self.starts.reshape(lead + (1,) * (frame.ndim - axis + 1))
        older = np.where(starts, np.expand_dims(frame, axis), older)
        return np.concatenate([older, np.expand_dims(frame, axis)], axis=axis)

    def _call(self, values: dict[str, np.ndarray], lead: Shape, plain: bool) -> dict[str, Any]:
        """The call's keywords: every value reshaped to ``lead`` and of a random kind
        (``plain``: of the stored dtype)."""
        rng = self.rng
        scalar_ok = lead == () and not plain
        kw: dict[str, Any] = {}
        for name, v in values.items():
            shape = self.fields[name.removeprefix("next_")][0]
            v = v.reshape(lead + shape)
            top = name.split("/")[0]
            if self.layout.frame_stack > 1 and top in ("obs", "next_obs"):
                v = self._stacked(v, lead)
            kw[name] = variant(rng, v, scalar_ok, same_dtype=plain)
        call = unflatten(kw)
        for top in ("obs", "next_obs"):  # a dict observation: other containers too
            if isinstance(call[top], dict) and not plain:
                u = rng.random()
                if u < 0.2:
                    call[top] = OrderedDict(reversed(list(call[top].items())))
                elif u < 0.4:
                    call[top] = dict(reversed(list(call[top].items())))
        return call

    def _priority(self, lead: Shape) -> Any:
        rng = self.rng
        size = int(np.prod(lead, dtype=np.int64))
        p = rng.random(lead) * 3.0
        p = np.where(rng.random(lead) < 0.1, 0.0, p)
        u = rng.random()
        if u < 0.2:
            return float(rng.random() * 2.0)  # one value for every step
        if u < 0.4:
            return p.tolist()
        if u < 0.5 and torch is not None:
            return torch.from_numpy(np.asarray(p, np.float32))
        if u < 0.6:
            return np.asarray(p, np.float32).reshape(size)
        return p

    def step(self) -> None:
        """One random call (add or extend, all lanes or some, any input kinds)."""
        rng, L = self.rng, self.lanes  # noqa: N806
        first = self.fast.spec is None
        u = 0.0 if first else rng.random()
        ids = np.arange(L)
        env_ids: Any = None
        if u < 0.35:  # one step of every lane
            method, n = "add", 1
            lead: Shape = (L,) if L > 1 or (not first and rng.random() < 0.2) else ()
        elif u < 0.55:  # one step of some lanes, in any order (async envs)
            method, n = "add", 1
            ids = rng.permutation(L)[:int(rng.integers(1, L + 1))]
            env_ids = [ids.tolist(), ids, tuple(ids.tolist()), ids.astype(np.int32)][
                int(rng.integers(4))]
            lead = (len(ids),)
        elif u < 0.9:  # a chunk of every lane (some longer than the ring, some empty)
            method, n = "extend", int(rng.integers(0, self.fast.rows + 4))
            lead = (n, L) if L > 1 or rng.random() < 0.2 else (n,)
        else:  # a chunk of some lanes
            method, n = "extend", int(rng.integers(1, self.fast.rows + 2))
            ids = rng.permutation(L)[:int(rng.integers(1, L + 1))]
            env_ids = ids.tolist()
            lead = (n, len(ids))
        # a first add (the spec is inferred from it) and empty chunks ((nested) lists of
        # no steps lose their shape): arrays of the stored dtypes
        call = self._call(self._values(ids, n), lead, plain=first or n == 0)
        if env_ids is not None:
            call["env_ids"] = env_ids
        if self.prioritized and not first and rng.random() < 0.6:
            call["priority"] = self._priority(lead if lead else (1,))
        self.apply(method, call)
        if first and self.layout.inferred:  # both twins inferred the intended spec
            assert buffer_fields(self.fast) == self.fields
        if rng.random() < 0.04:
            self.fast.clear()
            self.ref.clear()
            self.fresh[:] = True  # a lane's first step after a clear starts an episode
            same_everything(self.fast, self.ref)

    def apply(self, method: str, call: dict[str, Any]) -> None:
        """The call on both twins: both accept it, and their states stay equal."""
        getattr(self.ref, method)(**call)  # the generator makes only valid calls
        getattr(self.fast, method)(**call)
        same_everything(self.fast, self.ref)


def _make(layout: Layout, lanes: int, rows: int, prioritized: bool,
          **kw: Any) -> Callable[[], rb.ReplayBuffer]:
    rows = max(rows, layout.frame_stack)  # a stack fits in a lane

    def make() -> rb.ReplayBuffer:
        extra = dict(kw)
        if "path" in extra:
            extra["path"] = next(extra["path"])
        if prioritized and lanes % 2:  # both spellings of a prioritized buffer
            return rb.PrioritizedReplayBuffer(rows * lanes, alpha=0.7, num_envs=lanes, seed=3,
                                              **layout.kwargs(), **extra)
        sampler = rb.PrioritizedSampler(alpha=0.6) if prioritized else None
        return rb.ReplayBuffer(rows * lanes, num_envs=lanes, seed=3, sampler=sampler,
                               **layout.kwargs(), **extra)
    return make


def _drive(seed: int, layout_name: str, lanes: int, rows: int, prioritized: bool,
           calls: int, **kw: Any) -> Driver:
    rng = np.random.default_rng(seed)
    layout = LAYOUTS[layout_name]
    fast, ref = twins("auto", _make(layout, lanes, rows, prioritized, **kw))
    driver = Driver(rng, layout, fast, ref, lanes, prioritized)
    for _ in range(calls):
        driver.step()
    same_state(fast, ref)
    same_sampler(fast, ref)
    return driver


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("prioritized", [False, True])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), lanes=st.integers(1, 4),
       rows=st.sampled_from([2, 3, 5, 8]))
def test_mixed_input_kinds_match_reference(layout: str, prioritized: bool, seed: int,
                                           lanes: int, rows: int) -> None:
    """Random sequences of adds and extends (all lanes or some, lanes out of step, chunks
    longer than the ring, episode ends, gaps, priorities) whose every value is of a random
    input kind: after each call the buffer under ``auto`` holds the reference's bytes."""
    _drive(seed, layout, lanes, rows, prioritized, calls=10)


@pytest.mark.parametrize("layout", ["flat", "dict", "wide"])
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), lanes=st.integers(1, 4),
       rows=st.sampled_from([3, 5]), prioritized=st.booleans())
def test_mixed_input_kinds_on_memmap_match_reference(layout: str, seed: int, lanes: int,
                                                     rows: int, prioritized: bool) -> None:
    """The same on memmap files (the compiled writer's crash-safe order)."""
    with tempfile.TemporaryDirectory() as tmp:
        names = iter([Path(tmp) / "fast", Path(tmp) / "reference"])
        d = _drive(seed, layout, lanes, rows, prioritized, calls=10, storage="memmap",
                   path=names)
        assert d.fast.backend.name == "memmap"
        d.fast.close()
        d.ref.close()


def test_the_driver_mixes_every_kind() -> None:
    """The generator reaches every input kind it knows (a guard against a kind that is
    silently never drawn)."""
    rng = np.random.default_rng(0)
    seen: set[str] = set()
    for dt in ("float32", "float16", "int64", "int8", "uint8", "bool"):
        v = canon(rng, np.dtype(dt), (2, 3))
        seen |= set(_array_kinds(rng, v))
        seen |= set(_scalar_kinds(np.asarray(v[0, 0])))
    assert {"exact", "big_endian", "strided", "negative_strides", "fortran", "transposed",
            "readonly", "list", "tuple", "float64", "float16", "int64", "bool",
            "non_canonical", "python", "numpy_scalar", "python_int", "python_float",
            "python_bool", "-0.0", "subclass", "list_of_rows"} <= seen
    if torch is not None:
        assert {"torch", "torch_strided", "torch_float64", "torch_bool", "torch_int64",
                "torch_0d"} <= seen
    bits = _floats(rng, np.dtype(np.float32), (4000,))
    assert np.isnan(bits).any() and np.isinf(bits).any() and (np.signbit(bits) & (bits == 0)).any()
    assert len(set(bits[np.isnan(bits)].view(np.uint32).tolist())) > 10  # NaN payloads


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mixed_input_kinds_long_runs(layout: str) -> None:
    """Many seeds, long sequences (``-m slow``)."""
    for seed in range(40):
        rng = np.random.default_rng(seed)
        _drive(seed, layout, int(rng.integers(1, 5)), int(rng.choice([2, 3, 5, 8])),
               bool(seed % 2), calls=40)


# ---------------------------------------------------------------- casting rules
# Scalar, array, extra and dict-obs fields of every kind the rules distinguish.
_RULE_SPECS = {
    "flat": {"obs": ((3,), "float32"), "action": ((2,), "int64"), "reward": ((), "float32"),
             "log_prob": ((), "float32"), "mode": ((), "int8"), "count": ((), "uint8"),
             "seen": ((2,), "bool"), "h16": ((2,), "float16"), "s16": ((), "float16")},
    "dict": {"obs": {"pos": ((3,), "float32"), "cell": ((2,), "int16")},
             "action": ((2,), "int64"), "reward": ((), "float32"), "log_prob": ((), "float32")},
}


@dataclass(frozen=True)
class Form:
    """How a rule's call is made: lanes of the buffer, method, env_ids, steps, sampler."""

    lanes: int
    method: str
    env_ids: tuple[int, ...] | None = None
    n: int = 1
    prioritized: bool = False
    priority: bool = False

    @property
    def ids(self) -> np.ndarray:
        return np.arange(self.lanes) if self.env_ids is None else np.array(self.env_ids)

    @property
    def lead(self) -> Shape:
        m = len(self.ids)
        explicit = self.lanes > 1 or self.env_ids is not None
        if self.method == "add":
            return (m,) if explicit else ()
        return (self.n, m) if explicit else (self.n,)


FORMS = {
    "add1": Form(1, "add"),
    "add4": Form(4, "add", prioritized=True),
    "ids": Form(4, "add", env_ids=(3, 1), prioritized=True, priority=True),
    "extend1": Form(1, "extend", n=3, prioritized=True, priority=True),
    "extend4": Form(4, "extend", n=3),
}


class _Drop:
    """Marks a field the rule leaves out of the call."""


DROP = _Drop()


@dataclass(frozen=True)
class Rule:
    """One casting rule: ``where`` (a flat field name, ``next_obs`` or ``next_obs/<key>``)
    gets ``make(good)`` (``good``: a valid value, stored dtype, the call's shape);
    ``error`` is the type both writers raise, None when both accept it; then ``last``
    (when given) is the last stored element of the field, bitwise."""

    id: str
    where: str
    make: Callable[[np.ndarray], Any]
    error: type[Exception] | None
    last: Any = None

    @property
    def layout(self) -> str:
        return "dict" if "/" in self.where else "flat"


def put(x: Any, dtype: Any = None) -> Callable[[np.ndarray], Any]:
    """The good value as ``dtype`` with its LAST element ``x`` (a write that converts
    element by element would have written the others before meeting it)."""
    def make(good: np.ndarray) -> np.ndarray:
        arr = np.array(good, dtype=dtype if dtype is not None else good.dtype)
        arr.reshape(-1)[-1] = x
        return arr
    return make


def scalar(x: Any, dtype: Any) -> Callable[[np.ndarray], Any]:
    """A numpy scalar ``dtype(x)`` for a 0-d value (a scalar field of a one-lane add),
    else as :func:`put`."""
    def make(good: np.ndarray) -> Any:
        return np.dtype(dtype).type(x) if good.ndim == 0 else put(x, dtype)(good)
    return make


def listed(x: Any) -> Callable[[np.ndarray], Any]:
    """The good value as (nested) Python lists with its last element ``x`` (a 0-d value:
    ``x`` itself, e.g. a Python scalar)."""
    def make(good: np.ndarray) -> Any:
        lst = good.tolist()
        if not isinstance(lst, list):
            return x
        node = lst
        while isinstance(node[-1], list):
            node = node[-1]
        node[-1] = x
        return lst
    return make


def _widen(good: np.ndarray) -> np.ndarray:
    """A trailing dim more (a 0-d value) or one element more along the last dim."""
    if good.ndim == 0:
        return good[None]
    return np.concatenate([good, good[..., :1]], axis=-1)


_BIG = 2**62 + 2**38 + 1  # int64 -> float32 rounds up; via float64 it would tie to even
_HALF_TRAP = 1 + 2**-11 + 2**-40  # float64 -> float16 rounds up; via float32 it would not
_QNAN64 = np.array([0x7FF8000020000001], np.uint64).view(np.float64)[0]  # a NaN payload
_SNAN64 = np.array([0xFFF0000000000001], np.uint64).view(np.float64)[0]  # signalling, < 0

D, S, X = rb.DtypeError, rb.ShapeError, rb.SpecError


def _int_rules(where: str, dt: Any) -> list[Rule]:
    """Rules of an integer field (refused: fractions, NaN, inf, complex, out of range)."""
    info = np.iinfo(dt)
    lo, hi = int(info.min), int(info.max)
    rules = [
        Rule("fraction", where, put(2.5, np.float64), D),
        Rule("fraction-f16", where, put(0.5, np.float16), D),
        Rule("nan", where, put(np.nan, np.float64), D),
        Rule("inf", where, put(np.inf, np.float64), D),
        Rule("-inf", where, put(-np.inf, np.float32), D),
        Rule("complex", where, lambda g: g.astype(np.complex128), D),
        Rule("python-complex", where, listed(1 + 0j), D),
        Rule("above-max", where, put(hi + 1, np.int64 if hi < 2**63 - 1 else np.uint64), D),
        Rule("below-min", where,
             put(lo - 1, np.int64) if lo > -(2**63) else put(-1e19, np.float64), D),
        Rule("max", where, put(hi, np.int64), None, last=hi),
        Rule("min", where, put(lo, np.int64), None, last=lo),
        Rule("float-max", where, put(float(hi) if hi < 2**53 else 2.0**62, np.float64), None,
             last=hi if hi < 2**53 else 2**62),
        Rule("integral-float", where, put(2.0, np.float64), None, last=2),
        Rule("-0.0", where, put(-0.0, np.float64), None, last=0),
        Rule("bool", where, lambda g: g > 0, None),
        Rule("big-endian", where, put(hi, ">i8"), None, last=hi),
        Rule("big-endian-above", where, put(hi + 1 if hi < 2**63 - 1 else 2**64 - 1,
                                            ">i8" if hi < 2**63 - 1 else ">u8"), D),
        Rule("big-endian-fraction", where, put(0.25, ">f8"), D),
        Rule("python-int-above", where, listed(hi + 1), D),
        Rule("python-2**64", where, listed(2**64), D),
        Rule("python-2**70", where, listed(2**70), D),
        Rule("python-float-fraction", where, listed(1.5), D),
        Rule("python-float-integral", where, listed(3.0), None, last=3),
        Rule("np-float64-fraction", where, scalar(0.5, np.float64), D),
        Rule("np-float32-integral", where, scalar(5.0, np.float32), None, last=5),
        Rule("np-uint64-max", where, scalar(2**64 - 1, np.uint64), D),
        Rule("np-bool", where, scalar(True, np.bool_), None, last=1),
    ]
    if dt == np.int64:
        rules += [
            Rule("2.0**63", where, put(2.0**63, np.float64), D),
            Rule("2.0**62", where, put(2.0**62, np.float64), None, last=2**62),
            Rule("-2.0**63", where, put(-(2.0**63), np.float64), None, last=-(2**63)),
            Rule("float32-2**63", where, put(2.0**63, np.float32), D),
            Rule("uint64-in-range", where, lambda g: put(2**63 - 1)(np.abs(g).astype(np.uint64)),
                 None, last=2**63 - 1),
            Rule("uint64-2**63", where, lambda g: put(2**63)(np.abs(g).astype(np.uint64)), D),
            Rule("python-2**63", where, listed(2**63), D),
        ]
    if torch is not None:
        rules += [
            Rule("torch-fraction", where, lambda g: torch.from_numpy(put(0.5, np.float64)(g)),
                 D),
            Rule("torch-nan", where, lambda g: torch.from_numpy(put(np.nan, np.float32)(g)), D),
            Rule("torch-integral", where, lambda g: torch.from_numpy(put(3.0, np.float64)(g)),
                 None, last=3),
        ]
    return rules


def _float_rules(where: str, dt: Any) -> list[Rule]:
    """Rules of a float field (refused: complex; accepted: overflow to inf, rounding)."""
    f = np.dtype(dt).type
    rules = [
        Rule("complex", where, lambda g: g.astype(np.complex64), D),
        Rule("python-complex", where, listed(complex(1.0, 0.0)), D),
        Rule("overflow-to-inf", where, put(1e300, np.float64), None, last=f(np.inf)),
        Rule("-overflow-to-inf", where, put(-1e300, np.float64), None, last=f(-np.inf)),
        Rule("-0.0", where, put(-0.0, np.float64), None, last=f(-0.0)),
        Rule("nan-payload", where, put(_QNAN64, np.float64), None,
             last=np.array([_QNAN64]).astype(dt)[0]),
        Rule("signalling-nan", where, put(_SNAN64, np.float64), None,
             last=np.array([_SNAN64]).astype(dt)[0]),
        Rule("tie-to-even", where, put(1 + 2.0**-24, np.float64), None,
             last=np.array([1 + 2.0**-24]).astype(dt)[0]),
        Rule("int64-no-double-rounding", where, put(_BIG, np.int64), None,
             last=np.array([_BIG], np.int64).astype(dt)[0]),
        Rule("uint64-big", where, put(2**64 - 1, np.uint64), None,
             last=np.array([2**64 - 1], np.uint64).astype(dt)[0]),
        Rule("python-int-big", where, listed(_BIG), None),
        Rule("bool", where, lambda g: g > 0, None),
        Rule("int64-list", where, lambda g: np.full(g.shape, _BIG, np.int64).tolist(), None,
             last=np.array([_BIG], np.int64).astype(dt)[0]),
        Rule("python-bool", where, listed(True), None, last=f(1)),
        Rule("float16", where, lambda g: g.astype(np.float16), None),
        Rule("big-endian-f8", where, put(0.1, ">f8"), None, last=np.array([0.1]).astype(dt)[0]),
        Rule("big-endian-i8", where, put(-7, ">i8"), None, last=f(-7)),
        Rule("half-trap", where, put(_HALF_TRAP, np.float64), None,
             last=np.array([_HALF_TRAP]).astype(dt)[0]),
        Rule("python-half-trap", where, listed(_HALF_TRAP), None,
             last=np.array([_HALF_TRAP]).astype(dt)[0]),
        Rule("np-float64-half-trap", where, scalar(_HALF_TRAP, np.float64), None,
             last=np.array([_HALF_TRAP]).astype(dt)[0]),
        Rule("np-float64-nan-payload", where, scalar(_QNAN64, np.float64), None,
             last=np.array([_QNAN64]).astype(dt)[0]),
        Rule("python-nan-payload", where, listed(_QNAN64), None,
             last=np.array([_QNAN64]).astype(dt)[0]),
        Rule("np-float32-max", where, scalar(np.finfo(np.float32).max, np.float32), None,
             last=np.array([np.finfo(np.float32).max]).astype(dt)[0]),
        Rule("np-int64-big", where, scalar(_BIG, np.int64), None,
             last=np.array([_BIG], np.int64).astype(dt)[0]),
        Rule("np-bool", where, scalar(True, np.bool_), None, last=f(1)),
        Rule("python-2**63", where, listed(2**63), None),
        Rule("python-2**64", where, listed(2**64), D),
    ]
    if torch is not None:
        rules += [
            Rule("torch-float64", where, lambda g: torch.from_numpy(put(0.1, np.float64)(g)),
                 None, last=np.array([0.1]).astype(dt)[0]),
            Rule("torch-complex", where,
                 lambda g: torch.from_numpy(g.astype(np.complex64)), D),
        ]
    return rules


def _bool_rules(where: str) -> list[Rule]:
    """Rules of a bool field (refused: anything but 0/1; non-canonical bytes: stored 1)."""
    rules = [
        Rule("int-2", where, put(2, np.int64), D),
        Rule("int-minus-1", where, put(-1, np.int8), D),
        Rule("float-0.5", where, put(0.5, np.float64), D),
        Rule("float-2.0", where, put(2.0, np.float64), D),
        Rule("nan", where, put(np.nan, np.float64), D),
        Rule("complex", where, lambda g: g.astype(np.complex128), D),
        Rule("python-int-2", where, listed(2), D),
        Rule("string-True", where, listed("True"), D),
        Rule("int-1", where, put(1, np.int64), None, last=True),
        Rule("uint8-0", where, put(0, np.uint8), None, last=False),
        Rule("uint64-1", where, put(1, np.uint64), None, last=True),
        Rule("float-1.0", where, put(1.0, np.float64), None, last=True),
        Rule("-0.0", where, put(-0.0, np.float64), None, last=False),
        Rule("python-int-1", where, listed(1), None, last=True),
        Rule("np-int64-2", where, scalar(2, np.int64), D),
        Rule("np-float32-1", where, scalar(1.0, np.float32), None, last=True),
        Rule("np-float64-nan", where, scalar(np.nan, np.float64), D),
        Rule("non-canonical", where,
             lambda g: put(2)(g.astype(np.uint8)).view(np.bool_), None, last=True),
        Rule("non-canonical-255", where,
             lambda g: put(255)(g.astype(np.uint8)).view(np.bool_), None, last=True),
    ]
    if torch is not None:
        rules.append(Rule("torch-int-2", where, lambda g: torch.from_numpy(put(2, np.int64)(g)),
                          D))
    return rules


def _any_rules(where: str) -> list[Rule]:
    """Rules of every field: what is no number, and wrong shapes."""
    return [
        Rule("string", where, listed("1"), D),
        Rule("string-array", where, lambda g: g.astype(str), D),
        Rule("bytes", where, listed(b"1"), D),
        Rule("None", where, listed(None), D),
        Rule("object", where, listed(object()), D),
        Rule("object-array", where, lambda g: g.astype(object), D),
        Rule("datetime", where, lambda g: np.zeros(g.shape, "datetime64[s]"), D),
        Rule("timedelta", where, lambda g: np.zeros(g.shape, "timedelta64[s]"), D),
        Rule("wider", where, _widen, S),
        Rule("no-lead", where, lambda g: g[(0,) * min(g.ndim, 1)] if g.ndim else g[None], S),
    ]


def _some(rules: list[Rule], ids: set[str]) -> list[Rule]:
    assert ids <= {r.id for r in rules}, ids - {r.id for r in rules}
    return [r for r in rules if r.id in ids]


def _rules() -> list[Rule]:
    rules: list[Rule] = []
    # array fields: obs (the first value), next_obs (after obs and action), a dict obs
    rules += _float_rules("obs", np.float32) + _any_rules("obs")
    rules += _some(_float_rules("next_obs", np.float32) + _any_rules("next_obs"),
                   {"complex", "overflow-to-inf", "nan-payload", "signalling-nan",
                    "int64-no-double-rounding", "half-trap", "python-bool", "float16",
                    "string", "None", "datetime", "wider", "no-lead", "bool"})
    rules += _some(_float_rules("obs/pos", np.float32) + _any_rules("obs/pos"),
                   {"complex", "overflow-to-inf", "-0.0", "nan-payload", "tie-to-even",
                    "int64-no-double-rounding", "uint64-big", "python-int-big", "bool",
                    "float16", "big-endian-f8", "string", "object-array", "wider", "no-lead"})
    rules += _some(_float_rules("next_obs/pos", np.float32) + _any_rules("next_obs/pos"),
                   {"complex", "overflow-to-inf", "nan-payload", "int64-no-double-rounding",
                    "half-trap", "string", "wider", "bool"})
    rules += _int_rules("action", np.int64) + _any_rules("action")
    rules += _some(_int_rules("obs/cell", np.int16),
                   {"fraction", "nan", "inf", "above-max", "below-min", "max", "min", "-0.0",
                    "bool", "python-2**70", "complex", "big-endian-above"})
    rules += _some(_int_rules("next_obs/cell", np.int16),
                   {"fraction", "nan", "above-max", "python-2**70", "-0.0", "max", "bool"})
    # scalar fields: reward, the flags (after next_obs), scalar extras (after everything)
    rules += _float_rules("reward", np.float32) + _any_rules("reward")
    rules += _bool_rules("terminated") + _any_rules("truncated")
    rules += _some(_bool_rules("truncated"),
                   {"int-2", "float-0.5", "python-int-2", "non-canonical", "int-1"})
    rules += _some(_float_rules("log_prob", np.float32),
                   {"complex", "overflow-to-inf", "python-bool", "int64-no-double-rounding"})
    rules += _int_rules("mode", np.int8)
    rules += _some(_int_rules("count", np.uint8) + _any_rules("count"),
                   {"below-min", "above-max", "max", "min", "-0.0", "fraction", "nan",
                    "python-int-above", "big-endian-above", "np-uint64-max", "np-bool", "bool",
                    "float-max", "python-2**64", "string", "None"})
    # array extras: bool and float16 (the last field of the call), a float16 scalar
    rules += _bool_rules("seen") + _float_rules("h16", np.float16)
    rules += _some(_any_rules("h16"), {"string", "None", "datetime", "wider"})
    rules += _some(_float_rules("s16", np.float16),
                   {"half-trap", "python-half-trap", "np-float64-half-trap", "tie-to-even",
                    "overflow-to-inf", "python-nan-payload", "np-float64-nan-payload",
                    "signalling-nan", "python-int-big", "np-int64-big", "np-float32-max",
                    "python-bool", "complex", "python-2**64"})
    # the field set
    rules += [
        Rule("missing", "log_prob", lambda g: DROP, X),
        Rule("missing", "terminated", lambda g: DROP, X),
        Rule("missing", "next_obs", lambda g: DROP, X),
        Rule("missing", "next_obs/cell", lambda g: DROP, X),
        Rule("missing", "obs/pos", lambda g: DROP, X),
        Rule("unknown", "zzz", lambda g: g, X),
        Rule("unknown", "next_obs/zzz", lambda g: g, X),
        Rule("reserved", "done", lambda g: g, X),
    ]
    ids = [f"{r.where}-{r.id}" for r in rules]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    return rules


with np.errstate(over="ignore", invalid="ignore"):  # the expected casts of the rules
    RULES = _rules()


def _good_values(rng: np.random.Generator, fields: Fields, form: Form,
                 cur: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Valid canonical values (finite, small) of every field, call-shaped; each lane's obs
    continues its previous next_obs (``cur``, updated)."""
    lead, ids = form.lead, form.ids
    n, m = (1 if form.method == "add" else form.n), len(ids)
    out: dict[str, np.ndarray] = {}
    for name, (s, dt) in fields.items():
        if name in _FLAGS:
            v = rng.random((n, m)) < 0.15
        elif dt.kind == "f":
            v = rng.standard_normal((n, m, *s)).astype(dt)
        elif dt.kind == "b":
            v = rng.random((n, m, *s)) < 0.5
        else:
            v = rng.integers(0, 50, (n, m, *s)).astype(dt)
        if name in cur:  # obs: a chain per lane; next_obs: the next step's obs
            nxt = v
            v = np.concatenate([cur[name][ids][None], nxt[:-1]])
            out["next_" + name] = nxt.reshape(lead + s)
            cur[name][ids] = nxt[-1]
        out[name] = v.reshape(lead + s)
    return out


def _call_of(values: dict[str, Any], form: Form, rng: np.random.Generator) -> dict[str, Any]:
    call = unflatten({k: v for k, v in values.items() if v is not DROP})
    if form.env_ids is not None:
        call["env_ids"] = list(form.env_ids)
    if form.priority:
        call["priority"] = rng.random(form.lead) + 0.1
    return call


def _last_stored(buf: Any, name: str, form: Form) -> np.ndarray:
    """The stored values of field ``name`` of the steps the last call wrote, call-shaped."""
    t = buf.table
    ids = form.ids
    n = 1 if form.method == "add" else form.n
    rows = (t.written[ids][None, :] - n + np.arange(n)[:, None]) % t.T  # [n, m]
    got = np.asarray(t.arrays[name])[rows, ids[None, :]]
    return got.reshape(form.lead + got.shape[2:])


def _rule_twins(form: Form, layout: str) -> tuple[Under, Under]:
    spec = _RULE_SPECS[layout]
    sampler = (lambda: rb.PrioritizedSampler(alpha=0.6)) if form.prioritized else (lambda: None)
    rows = 2 if form.method == "add" else 4  # the good calls before the rule's wrap the ring
    return twins("auto", lambda: rb.ReplayBuffer(rows * form.lanes, num_envs=form.lanes,
                                                 seed=1, spec=spec, sampler=sampler()))


def _refused_alike(fast: Under, ref: Under, method: str, call: dict[str, Any],
                   error: type[Exception]) -> None:
    """Both raise ``error`` (same type, same first message line) and neither changed."""
    before = snapshot(fast), snapshot(ref)
    with pytest.raises(error) as ea:
        getattr(fast, method)(**call)
    with pytest.raises(error) as eb:
        getattr(ref, method)(**call)
    assert type(ea.value) is type(eb.value) is error, (ea.value, eb.value)
    assert str(ea.value).splitlines()[:1] == str(eb.value).splitlines()[:1]
    assert snapshot(fast) == before[0], "the refused call changed the buffer under test"
    assert snapshot(ref) == before[1], "the refused call changed the reference"


def _same_outcome(fast: Under, ref: Under, method: str, call: dict[str, Any]) -> None:
    """Both accept the call, or both refuse it alike; either way their states are equal."""
    outcome = []
    for b in (ref, fast):
        before = snapshot(b)
        try:
            getattr(b, method)(**call)
            outcome.append(None)
        except Exception as e:  # compared below
            outcome.append((type(e), str(e).splitlines()[:1]))
            assert snapshot(b) == before, f"a refused call changed the buffer ({e!r})"
    assert outcome[0] == outcome[1], outcome
    same_everything(fast, ref)


@pytest.mark.parametrize("rule", RULES, ids=[f"{r.where}-{r.id}" for r in RULES])
def test_casting_rule(rule: Rule) -> None:
    """A value one casting rule refuses gets the same error from both writers and leaves
    both buffers exactly as they were (table, counters, sampler, generator); a value the
    rules accept is stored with the reference's bytes. Good calls before and after; in
    adds of one lane and of four, chunks of four lanes, and (every other rule) env_ids adds
    with priorities or one-lane chunks with priorities (:data:`FORMS`)."""
    i = RULES.index(rule)
    for form in ("add1", "add4", "extend4", ("ids", "extend1")[i % 2]):
        print(f"form {form}")  # shown with a failure
        _check_rule(rule, form)


@functools.cache
def _warm(form: str, layout: str) -> bytes:
    """The twins of a form and layout after the same good calls (the ring wrapped, episode
    ends, side slots in use) with each lane's current obs, pickled: every rule starts
    from copies of them."""
    f = FORMS[form]
    rng = np.random.default_rng(zlib.crc32(f"{form} {layout}".encode()))
    fast, ref = _rule_twins(f, layout)
    fields = buffer_fields(fast)
    cur = {n: rng.standard_normal((f.lanes, *s)).astype(dt)
           for n, (s, dt) in fields.items() if n in _obs_names(fields)}
    for _ in range(2 if f.method == "extend" else 3):
        call = _call_of(_good_values(rng, fields, f, cur), f, rng)
        getattr(fast, f.method)(**call)
        getattr(ref, f.method)(**call)
    same_everything(fast, ref)
    return pickle.dumps((fast.buf, ref.buf, cur))


def _check_rule(rule: Rule, form: str) -> None:
    f = FORMS[form]
    rng = np.random.default_rng(zlib.crc32(f"{rule.where} {rule.id} {form}".encode()))
    fast_buf, ref_buf, cur = pickle.loads(_warm(form, rule.layout))
    fast, ref = Under.of("auto", fast_buf), Under.of("reference", ref_buf)
    fields = buffer_fields(fast)
    values: dict[str, Any] = _good_values(rng, fields, f, cur)
    if rule.where in values:
        values[rule.where] = rule.make(values[rule.where])
    else:  # a field (or a next_obs key) the buffer does not store
        like = "next_obs/pos" if rule.where.startswith("next_obs/") else "reward"
        values[rule.where] = rule.make(values[like])
    call = _call_of(values, f, rng)
    if rule.error is not None:
        _refused_alike(fast, ref, f.method, call, rule.error)
    else:
        getattr(ref, f.method)(**call)
        getattr(fast, f.method)(**call)
        same_everything(fast, ref)
        if rule.last is not None and not rule.where.startswith("next_obs"):
            got = _last_stored(ref, rule.where, f).reshape(-1)[-1:]
            want = np.array([rule.last]).astype(got.dtype)
            assert got.tobytes() == want.tobytes(), (got, want)
    call = _call_of(_good_values(rng, fields, f, cur), f, rng)  # still writable alike
    getattr(fast, f.method)(**call)
    getattr(ref, f.method)(**call)
    same_everything(fast, ref)


def test_every_rule_field_is_stored() -> None:
    """The rules name fields of the rule specs (a typo would test nothing)."""
    stored = {layout: set(buffer_fields(_rule_twins(FORMS["add1"], layout)[0]))
              for layout in _RULE_SPECS}
    for r in RULES:
        name = r.where.removeprefix("next_")
        if r.id in ("unknown", "reserved") or r.where == "next_obs":
            continue
        assert name in stored[r.layout], r


# ---------------------------------------------------------------- priorities
_BAD_PRIORITIES: list[tuple[str, Callable[[Shape], Any], type[Exception]]] = [
    ("nan", lambda lead: np.where(np.arange(int(np.prod(lead))) == 0, np.nan, 1.0)
     .reshape(lead), D),
    ("negative", lambda lead: put(-0.5, np.float64)(np.ones(lead)), D),
    ("inf", lambda lead: put(np.inf, np.float64)(np.ones(lead)), D),
    ("python-nan", lambda lead: float("nan"), D),
    ("python-negative", lambda lead: -1, D),
    ("too-many", lambda lead: np.ones(int(np.prod(lead)) + 1), S),
    # fewer values than steps (one value would be broadcast)
    ("too-few", lambda lead: np.ones(0 if np.prod(lead) <= 2 else int(np.prod(lead)) - 1), S),
    ("string", lambda lead: "high", D),
    ("list-with-None", lambda lead: [None] * int(np.prod(lead)), D),
]
_GOOD_PRIORITIES: list[tuple[str, Callable[[Shape], Any]]] = [
    ("-0.0", lambda lead: -0.0),
    ("zeros", lambda lead: np.zeros(lead)),
    ("bool", lambda lead: True),
    ("int", lambda lead: 2),
    ("other-shape", lambda lead: np.ones((int(np.prod(lead)), 1))),
    ("float32-big-endian", lambda lead: np.full(lead, 0.5, ">f4")),
    ("list", lambda lead: np.full(lead, 1.5).tolist()),
]
# taken alike today, whatever the rule becomes: complex priorities lose their imaginary
# part (numpy's ComplexWarning) instead of being refused
_ODD_PRIORITIES: list[tuple[str, Callable[[Shape], Any]]] = [
    ("complex", lambda lead: np.full(lead, 1 + 2j)),
    ("python-complex", lambda lead: 1 + 0j),
]
if torch is not None:
    _BAD_PRIORITIES.append(("torch-nan", lambda lead: torch.full(lead, float("nan")), D))
    _GOOD_PRIORITIES.append(("torch", lambda lead: torch.full(lead, 0.25)))

_PRIORITY_FORMS = {
    "add1": Form(1, "add", prioritized=True),
    "add3": Form(3, "add", prioritized=True),
    "ids": Form(3, "add", env_ids=(2, 0), prioritized=True),
    "extend3": Form(3, "extend", n=4, prioritized=True),
    "extend-ids": Form(3, "extend", env_ids=(1,), n=2, prioritized=True),
}


def _prio_twins(form: Form) -> tuple[Under, Under]:
    return twins("auto", lambda: rb.PrioritizedReplayBuffer(
        4 * form.lanes, alpha=0.6, num_envs=form.lanes, seed=2, spec=_RULE_SPECS["flat"]))


@pytest.mark.filterwarnings("ignore:Casting complex values to real")
@pytest.mark.parametrize("form", list(_PRIORITY_FORMS))
def test_priorities_are_checked_before_any_write(form: str) -> None:
    """Bad initial priorities (NaN, negative, inf, wrong count, no numbers) get the
    reference's error and leave both buffers as they were, whatever input kinds the
    values have; a bad value with a bad priority gets the reference's error (the
    value's); good priorities of every kind land alike."""
    f = _PRIORITY_FORMS[form]
    rng = np.random.default_rng(11)
    fast, ref = _prio_twins(f)
    fields = buffer_fields(fast)
    cur = {n: rng.standard_normal((f.lanes, *s)).astype(dt)
           for n, (s, dt) in fields.items() if n in _obs_names(fields)}
    lead = f.lead if f.method == "extend" or f.lanes > 1 or f.env_ids else (1,)

    def good(kinds: bool = False) -> dict[str, Any]:
        values = _good_values(rng, fields, f, cur)
        if kinds:  # odd input kinds (the general path casts them)
            values = {k: variant(rng, v, scalar_ok=f.lead == ()) for k, v in values.items()}
        return _call_of(values, f, rng)

    for _ in range(3):
        call = {**good(), "priority": rng.random(lead) + 0.1}
        getattr(fast, f.method)(**call)
        getattr(ref, f.method)(**call)
    same_everything(fast, ref)
    for name, bad, error in _BAD_PRIORITIES:
        for kinds in (False, True):
            call = {**good(kinds), "priority": bad(lead)}
            _refused_alike(fast, ref, f.method, call, error)
        # a bad value too: the reference checks the values first
        call = {**good(), "priority": bad(lead)}
        call["mode"] = np.full(np.shape(call["mode"]), 300)
        _refused_alike(fast, ref, f.method, call, D)
        del name
    for _name, p in _GOOD_PRIORITIES:
        for kinds in (False, True):
            call = {**good(kinds), "priority": p(lead)}
            getattr(ref, f.method)(**call)
            getattr(fast, f.method)(**call)
            same_everything(fast, ref)
    for _name, p in _ODD_PRIORITIES:
        _same_outcome(fast, ref, f.method, {**good(), "priority": p(lead)})
    # a good priority with a bad value: refused before the sampler hears of it
    call = {**good(), "priority": np.ones(lead)}
    call["action"] = np.full(np.shape(call["action"]), 0.5)
    _refused_alike(fast, ref, f.method, call, D)


def test_priority_without_a_prioritized_sampler_is_refused() -> None:
    """``priority=`` on a uniform buffer: the reference's ConfigError, nothing written."""
    f = FORMS["add4"]
    fast, ref = twins("auto", lambda: rb.ReplayBuffer(16, num_envs=4, seed=0,
                                                      spec=_RULE_SPECS["flat"]))
    rng = np.random.default_rng(0)
    fields = buffer_fields(fast)
    cur = {"obs": rng.standard_normal((4, 3)).astype(np.float32)}
    call = _call_of(_good_values(rng, fields, f, cur), f, rng)
    fast.add(**call)
    ref.add(**call)
    call = {**_call_of(_good_values(rng, fields, f, cur), f, rng), "priority": np.ones(4)}
    _refused_alike(fast, ref, "add", call, rb.ConfigError)


# ---------------------------------------------------------------- env_ids
_BAD_ENV_IDS: list[tuple[str, Any, int]] = [  # (name, env_ids, lanes the values carry)
    ("duplicate", [1, 1], 2),
    ("out-of-range", [4], 1),
    ("negative", [-1], 1),
    ("bools", [True, False], 2),
    ("numpy-bools", np.array([False, True]), 2),
    ("floats", [0.0, 1.0], 2),
    ("empty", [], 1),
    ("2-D", [[0], [1]], 2),
    ("string", ["0"], 1),
    ("with-None", [0, None], 2),
    ("scalar", 1, 1),
]


@pytest.mark.parametrize("method", ["add", "extend"])
@pytest.mark.parametrize("priority", [False, True])
def test_bad_env_ids_are_refused_before_any_write(method: str, priority: bool) -> None:
    """env_ids that are not distinct lane indices get the reference's error and change
    nothing (with or without initial priorities); valid ones of other types land alike."""
    f = Form(4, method, env_ids=(3, 1), n=2, prioritized=True)
    rng = np.random.default_rng(5)
    fast, ref = twins("auto", lambda: rb.ReplayBuffer(12, num_envs=4, seed=0,
                                                      spec=_RULE_SPECS["flat"],
                                                      sampler=rb.PrioritizedSampler()))
    fields = buffer_fields(fast)
    cur = {"obs": rng.standard_normal((4, 3)).astype(np.float32)}
    every = Form(4, method, n=2)
    for _ in range(3):
        call = _call_of(_good_values(rng, fields, every, cur), every, rng)
        getattr(fast, method)(**call)
        getattr(ref, method)(**call)
    for name, env_ids, m in _BAD_ENV_IDS:
        ids = tuple(range(m))
        g = Form(4, method, env_ids=ids, n=2)
        call = _call_of(_good_values(rng, fields, g, cur), g, rng)
        call["env_ids"] = env_ids
        if priority:
            call["priority"] = np.ones(g.lead)
        print(name)
        _refused_alike(fast, ref, method, call, rb.ShapeError)
    for env_ids in ([3, 1], (3, 1), np.array([3, 1], np.uint8), np.array([3, 1], np.int32),
                    np.array([3, 1], ">i8")):
        call = _call_of(_good_values(rng, fields, f, cur), f, rng)
        call["env_ids"] = env_ids
        if priority:
            call["priority"] = rng.random(f.lead) + 0.5
        getattr(ref, method)(**call)
        getattr(fast, method)(**call)
        same_everything(fast, ref)
