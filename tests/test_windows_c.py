"""The C window kernels (replaybank/ops/windows_c.py over replaybank/_windows.c) against
their numpy oracles (replaybank/ops/windows.py and the numpy compositions of
windows_numba.py) and their numba twins, on random tables: ring wraps, episode ends,
several lanes, cleared and overwritten history, padding, stop/cross, strict or not,
burn-in. Also: every wrong argument raises before anything is written."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaybank.ops import ring, windows
from replaybank.ops.jit import pure_python
from tests.relinking import relink_forever

wc = pytest.importorskip("replaybank.ops.windows_c")

try:
    from replaybank.ops import stack_numba as sn
    from replaybank.ops import windows_numba as wn
except ImportError:  # pragma: no cover - numba missing: the numpy oracles only
    sn = wn = None  # type: ignore[assignment]

FLAGS = wc.FLAG_NAMES
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def tables(draw: Any) -> tuple[Any, ...]:
    """A random step table: links ``[T, lanes]`` (0, or a side slot + 1), written and
    live counts per lane (wrapped rings, cleared or partly overwritten lanes), and bool
    terminated/truncated by slot."""
    # up to 40 rows: windows long enough for the kernels' eight-byte boundary scans
    nrows = draw(st.one_of(st.integers(1, 10), st.integers(11, 40)))
    lanes = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    p = draw(st.sampled_from([0.0, 0.03, 0.1, 0.3, 0.8]))
    link = np.where(rng.random((nrows, lanes)) < p,
                    rng.integers(1, 9, (nrows, lanes)), 0).astype(np.int32)
    written = rng.integers(0, 4 * nrows + 1, size=lanes).astype(np.int64)
    counts = np.minimum(written, rng.integers(0, nrows + 1, size=lanes)).astype(np.int64)
    term = rng.random(nrows * lanes) < 0.3
    trunc = rng.random(nrows * lanes) < 0.2
    return link, written, counts, term, trunc, rng


def bounds_of(link: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray((link != 0).T.astype(np.uint8))


def live_keys(written: np.ndarray, counts: np.ndarray, lanes: int) -> np.ndarray:
    return np.array([s * lanes + lane for lane in range(lanes)
                     for s in range(written[lane] - counts[lane], written[lane])], np.int64)


def oracle_plan(link: np.ndarray, written: np.ndarray, counts: np.ndarray,
                term: np.ndarray, trunc: np.ndarray, keys: np.ndarray, ext: np.ndarray,
                width: int, burn_in: int) -> tuple[Any, ...]:
    """The window plan from numpy: ``windows.window_plan`` and the flag arithmetic of
    ``views.sequence.gather_numpy``; side rows ``(b, j, slot)`` in row-major order."""
    slots, lk, ends, first0 = windows.window_plan(link, written, counts, keys, width)
    nb = len(keys)
    valid = np.arange(width)[None, :] < ext[:, None]  # [B, W]
    tm = term[slots[:, :width]] & valid
    tr = trunc[slots[:, :width]] & valid
    cut = lk > 0
    first = np.zeros((nb, width), bool)
    first[:, 0] = first0
    first[:, 1:] = cut[:, :-1]
    first &= valid
    last = (tm | tr | ends) & valid
    burn = np.zeros((nb, width), bool)
    burn[:, :burn_in] = True
    flags = np.stack([first, last, tm, valid & ~burn, burn, tm, tr])
    pos = np.argwhere((lk != 0) & valid)
    side = np.column_stack([pos, lk[pos[:, 0], pos[:, 1]] - 1]).astype(np.int64) \
        if len(pos) else np.zeros((0, 3), np.int64)
    tail = bool(np.all(pos[:, 1] == width - 1)) if len(pos) else True
    return slots, slots[:, :width], flags, side, tail


def assert_plan(got: tuple[Any, ...], want: tuple[Any, ...]) -> None:
    slots, steps, flags, side, tail = got
    if isinstance(flags, dict):
        flags = np.stack([flags[n] for n in FLAGS])
    assert steps.flags.c_contiguous
    np.testing.assert_array_equal(slots, want[0])
    np.testing.assert_array_equal(steps, want[1])
    np.testing.assert_array_equal(flags, want[2])
    np.testing.assert_array_equal(np.asarray(side).reshape(-1, 3), want[3])
    assert tail == want[4]


@SETTINGS
@given(tab=tables(), width=st.integers(1, 44), cross=st.booleans())
def test_window_extent_matches_numpy_and_numba(tab: Any, width: int, cross: bool) -> None:
    link, written, counts, *_ = tab
    lanes = link.shape[1]
    keys = np.arange(-lanes, int(written.max() + 2) * lanes, dtype=np.int64)
    want = windows.window_extent(link, written, counts, keys, width, cross)
    for b in (None, bounds_of(link)):
        got = wc.window_extent(link, written, counts, keys, width, cross, b)
        np.testing.assert_array_equal(got, want)
        if wn is not None:
            np.testing.assert_array_equal(
                wn.window_extent(link, written, counts, keys, width, cross, b), want)
    if not pure_python():  # (REPLAYBANK_PURE_PYTHON=1 switches the C kernels off)
        assert windows.kernel(windows.window_extent)[1] == "c"


@SETTINGS
@given(tab=tables(), width=st.integers(1, 44), cross=st.booleans(),
       short=st.integers(0, 12), nb=st.integers(1, 6), spare=st.integers(0, 6),
       burn_in=st.integers(0, 4))
def test_draw_and_draw_plan_match_numpy(tab: Any, width: int, cross: bool, short: int,
                                        nb: int, spare: int, burn_in: int) -> None:
    link, written, counts, term, trunc, rng = tab
    size = int(counts.sum())
    if size == 0:
        return
    min_len = max(1, width - short)
    burn_in = min(burn_in, width - 1)
    flat = rng.integers(0, size, size=nb + spare).astype(np.int64)
    # oracle: numpy key mapping and extents, valid draws first, then invalid ones
    all_keys = ring.uniform_keys(flat, written, counts)
    all_ext = windows.window_extent(link, written, counts, all_keys, width, cross)
    good = np.flatnonzero(all_ext >= min_len)
    bad = np.flatnonzero(all_ext < min_len)
    order = np.concatenate([good, bad])[:nb]
    n_want = min(len(good), nb)
    keys, ext, n = wc.draw_windows(link, written, counts, flat, width, cross, min_len, nb)
    assert n == n_want
    np.testing.assert_array_equal(keys, all_keys[order])
    np.testing.assert_array_equal(ext, all_ext[order])
    for b in (None, bounds_of(link)):
        got = wc.draw_plan(link, written, counts, flat, width, cross, min_len, nb, term,
                           trunc, burn_in, b)
        np.testing.assert_array_equal(got[0], all_keys[order])
        np.testing.assert_array_equal(got[1], all_ext[order])
        assert got[2] == n_want
        if n_want < nb:
            assert got[3] is None
        else:
            assert_plan(got[3], oracle_plan(link, written, counts, term, trunc, got[0],
                                            got[1], width, burn_in))
        if wn is not None:  # the numba twin gives the same, bit for bit
            twin = wn.draw_plan(link, written, counts, flat, width, cross, min_len, nb,
                                term, trunc, burn_in, b)
            np.testing.assert_array_equal(twin[0], got[0])
            np.testing.assert_array_equal(twin[1], got[1])
            assert twin[2] == got[2] and (twin[3] is None) == (got[3] is None)
            if got[3] is not None:
                assert_plan(got[3], twin[3])
        for module in (wc, wn):  # draw_take: the same plan, then the rows it names
            if module is not None:
                check_draw_take(module, link, b, written, counts, flat, cross, min_len, nb,
                                term, trunc, width, burn_in, got)


def check_draw_take(module: Any, link: Any, bounds: Any, written: Any, counts: Any,
                    flat: Any, cross: bool, min_len: int, nb: int, term: Any, trunc: Any,
                    width: int, burn_in: int, want: Any) -> None:
    """``module.draw_take`` gives ``draw_plan``'s result ``want`` and gathers its rows:
    a [T * lanes, 3] float32 field at the steps and a [T * lanes] int64 one at the
    slots; nothing when no plan was written."""
    n = link.size
    f32 = np.arange(3 * n, dtype=np.float32).reshape(n, 3)
    i64 = np.arange(n, dtype=np.int64) * 7 - 3
    keys, ext = np.empty(nb, np.int64), np.empty(nb, np.int64)
    slots, steps = np.empty((nb, width + 1), np.int64), np.empty((nb, width), np.int64)
    flags, side = np.empty((7, nb, width), bool), np.empty((nb * width, 3), np.int64)
    a = np.full((nb, width, 3), -1, np.float32)
    o = np.full((nb, width + 1), -1, np.int64)
    n_ok, n_side, tail = module.draw_take(link, bounds, written, counts, flat, cross,
                                          min_len, keys, ext, term, trunc, width, burn_in,
                                          slots, steps, flags, side, ((f32, a),), ((i64, o),))
    np.testing.assert_array_equal(keys, want[0])
    np.testing.assert_array_equal(ext, want[1])
    assert n_ok == want[2]
    if want[3] is None:
        assert n_side == -1
        assert (a == -1).all() and (o == -1).all()  # nothing gathered
        return
    assert_plan((slots, steps, flags, side[:n_side], tail), want[3])
    np.testing.assert_array_equal(a, f32[steps])
    np.testing.assert_array_equal(o, i64[slots])


@SETTINGS
@given(tab=tables(), width=st.integers(1, 44), cross=st.booleans(), strict=st.booleans(),
       burn_in=st.integers(0, 4))
def test_sequence_plan_matches_numpy(tab: Any, width: int, cross: bool, strict: bool,
                                     burn_in: int) -> None:
    link, written, counts, term, trunc, _ = tab
    keys = live_keys(written, counts, link.shape[1])
    if len(keys) == 0:
        return
    burn_in = min(burn_in, width - 1)
    ext = windows.window_extent(link, written, counts, keys, width, cross)
    if strict:  # full windows only, as a strict draw keeps
        keys, ext = keys[ext == width], ext[ext == width]
        if len(keys) == 0:
            return
    want = oracle_plan(link, written, counts, term, trunc, keys, ext, width, burn_in)
    for b in (None, bounds_of(link)):
        got = wc.sequence_plan(link, written, counts, term, trunc, keys, ext, width,
                               burn_in, b)
        assert_plan(got, want)
        if wn is not None:
            assert_plan(wn.sequence_plan(link, written, counts, term, trunc, keys, ext,
                                         width, burn_in, b), want)


@SETTINGS
@given(tab=tables(), width=st.integers(1, 44))
def test_window_plan_matches_numpy(tab: Any, width: int) -> None:
    link, written, counts, *_ = tab
    keys = live_keys(written, counts, link.shape[1])
    got = wc.window_plan(link, written, counts, keys, width)
    want = windows.window_plan(link, written, counts, keys, width)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


@SETTINGS
@given(tab=tables(), k=st.integers(1, 6), was_cleared=st.booleans())
def test_stack_plan_matches_numpy_and_numba(tab: Any, k: int, was_cleared: bool) -> None:
    link, written, counts, *_, rng = tab
    keys = live_keys(written, counts, link.shape[1])
    # each lane's last clear: never, or anywhere up to its oldest live step
    cleared = rng.integers(0, written - counts + 1) if was_cleared \
        else np.zeros_like(written)
    slots, side, ok = windows.stack_slots(link, written, counts, cleared, keys, k)
    got = wc.stack_slots(link, written, counts, cleared, keys, k)
    for g, w in zip(got, (slots, side, ok), strict=True):
        np.testing.assert_array_equal(g, w)
    bufs = windows.stack_buffers(len(keys), k)
    p_slots, p_side, step, p_ok, n_bad, n_side = wc.stack_plan(link, written, counts,
                                                               cleared, keys, k, bufs)
    assert p_slots.base is bufs[0] or p_slots is bufs[1]
    np.testing.assert_array_equal(p_slots, slots)
    np.testing.assert_array_equal(step, slots[:, k - 1])
    assert n_bad == int((~ok).sum()) and n_side == int((side >= 0).sum())
    assert (p_ok is None) == (n_bad == 0)
    if sn is not None:
        twin = sn.stack_plan(link, written, counts, cleared, keys, k)
        np.testing.assert_array_equal(twin[0], p_slots)
        np.testing.assert_array_equal(twin[1], p_side)
        assert twin[4:] == (n_bad, n_side)
    if not pure_python():  # (REPLAYBANK_PURE_PYTHON=1 switches the C kernels off)
        assert windows.kernel(windows.stack_slots)[1] == "c"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tab=tables(), steps=st.lists(st.integers(0, 25), min_size=1, max_size=6))
def test_sync_boundaries_matches_a_fresh_computation(tab: Any, steps: list[int]) -> None:
    link, written, *_ = tab
    rng = tab[-1]
    lanes = link.shape[1]
    bounds = np.zeros((lanes, link.shape[0]), np.uint8)
    seen = np.full(lanes, 2**62, np.int64)
    w = written.copy()
    for d in steps:  # writes move written forward; the rows they touched change links
        w = w + rng.integers(0, d + 1, size=lanes)
        link = np.where(rng.random(link.shape) < 0.3, rng.integers(0, 3, link.shape),
                        link).astype(np.int32)
        seen[:] = 2**62  # links changed anywhere: recompute whole
        wc.sync_boundaries(link, w, seen, bounds)
        np.testing.assert_array_equal(bounds, bounds_of(link))
        np.testing.assert_array_equal(seen, w)
    if wn is not None:  # incremental syncs agree with the numba twin's
        a, b = np.zeros_like(bounds), np.zeros_like(bounds)
        sa, sb = np.full(lanes, 2**62, np.int64), np.full(lanes, 2**62, np.int64)
        for d in steps:
            w = w + d
            rows = (np.arange(int(w.max()) - d - 1, int(w.max())) % link.shape[0])
            link[rows] = rng.integers(0, 3, (len(rows), lanes))
            wc.sync_boundaries(link, w, sa, a)
            wn.sync_boundaries(link, w, sb, b)
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(sa, sb)


def test_bad_arguments_raise_before_writing() -> None:
    link = np.zeros((4, 2), np.int32)
    written, counts = np.array([4, 4]), np.array([4, 4])
    term = np.zeros(8, bool)
    c = wc._windows
    keys = np.full(2, -7, np.int64)
    ext = np.full(2, -7, np.int64)
    slots = np.full((2, 3), -7, np.int64)
    steps = np.full((2, 2), -7, np.int64)
    flags = np.zeros((7, 2, 2), bool)
    side = np.full((4, 3), -7, np.int64)

    def draw_plan(fields: Any = (), obs: Any = (), take: bool = False, **over: Any) -> Any:
        """draw_plan, or draw_take with ``fields`` and ``obs`` (``take``)."""
        args = {"link": link, "bounds": None, "written": written, "counts": counts,
                "flat": np.array([0, 1, 2]), "cross": False, "min_len": 2, "keys": keys,
                "ext": ext, "term": term, "trunc": term, "width": 2, "burn_in": 0,
                "slots": slots, "steps": steps, "flags": flags, "side": side}
        args.update(over)
        if take:
            return c.draw_take(*args.values(), fields, obs)
        return c.draw_plan(*args.values())

    cases = [
        ({"flat": np.array([0, 1, 8])}, ValueError),  # a draw past the live steps
        ({"flat": np.array([0, 1, -1])}, ValueError),
        ({"flat": np.array([0])}, ValueError),  # fewer draws than keys
        ({"flat": np.array([0.0, 1.0, 2.0])}, TypeError),
        ({"link": link.astype(np.int64)}, TypeError),
        ({"link": np.zeros((4, 2, 1), np.int32)}, ValueError),
        ({"link": np.asfortranarray(np.zeros((4, 3), np.int32))[:, :2]}, TypeError),
        ({"written": np.array([4])}, ValueError),
        ({"written": np.array([4, 4], np.int32)}, TypeError),
        ({"counts": np.array([5, 4])}, ValueError),  # more live steps than rows
        ({"counts": np.array([-1, 4])}, ValueError),
        ({"written": np.array([2, 4])}, ValueError),  # counts > written
        ({"bounds": np.zeros((2, 3), np.uint8)}, ValueError),
        ({"term": np.zeros(7, bool)}, ValueError),
        ({"trunc": np.zeros(8, np.uint8)}, TypeError),
        ({"slots": np.zeros((2, 2), np.int64)}, ValueError),
        ({"flags": np.zeros((7, 2, 2), bool)[:, :, ::-1]}, TypeError),
        ({"side": np.zeros((3, 3), np.int64)}, ValueError),
        ({"width": 0}, ValueError),
        ({"burn_in": -1}, ValueError),
        ({"keys": np.zeros(2, np.int64)[::-1].copy().view(np.float64)}, TypeError),
    ]
    ro = np.zeros(2, np.int64)
    ro.flags.writeable = False
    cases.append(({"keys": ro}, TypeError))
    for over, exc in cases:
        with pytest.raises(exc):
            draw_plan(**over)
        assert (keys == -7).all() and (ext == -7).all() and (slots == -7).all()
        assert (steps == -7).all() and (side == -7).all() and not flags.any()
    src = np.zeros((8, 2), np.float32)
    take_cases = [
        ({"fields": [(src, np.zeros((2, 2, 2), np.float32))]}, TypeError),  # not a tuple
        ({"fields": ((src,),)}, TypeError),
        ({"fields": ((src, np.zeros((2, 2, 3), np.float32)),)}, ValueError),  # out size
        ({"obs": ((src, np.zeros((2, 2, 2), np.float32)),)}, ValueError),  # not [B, W + 1]
        ({"fields": ((src[:7], np.zeros((2, 2, 2), np.float32)),)}, ValueError),  # rows
        ({"fields": ((np.zeros((8, 1), object), np.zeros((2, 2, 1), object)),)},
         ValueError),
        ({"obs": ((src, np.zeros((2, 3, 2), np.float32)[:, ::-1]),)}, ValueError),
    ]
    for over, exc in [*cases, *take_cases]:
        args = {"fields": (), "obs": ()}
        args.update(over)
        fields, obs = args.pop("fields"), args.pop("obs")
        with pytest.raises(exc):
            draw_plan(fields=fields, obs=obs, take=True, **args)
        assert (keys == -7).all() and (ext == -7).all() and (slots == -7).all()
        assert (steps == -7).all() and (side == -7).all() and not flags.any()
    assert draw_plan()[0] == 2  # the same call with good arguments writes
    assert (keys != -7).all()
    with pytest.raises(TypeError):
        c.draw_plan(link)
    with pytest.raises(ValueError):  # a negative key would index before the table
        c.plan(link, None, written, counts, np.array([-1, 0]), np.array([2, 2]), term,
               term, 2, 0, slots, steps, flags, side)
    out = np.full(2 * 6, -7, np.int64)
    never = np.zeros(2, np.int64)
    with pytest.raises(ValueError):
        c.stack(link, written, counts, never, np.array([-3, 1]), 2, out)
    with pytest.raises(ValueError):
        c.stack(link, written, counts, never, np.array([0, 1]), 2, out[:-1])
    with pytest.raises(ValueError, match="cleared"):  # a clear after a live step
        c.stack(link, written, counts, np.array([0, 1]), np.array([0, 1]), 2, out)
    with pytest.raises(ValueError, match="cleared"):
        c.stack(link, written, counts, np.array([-1, 0]), np.array([0, 1]), 2, out)
    with pytest.raises(ValueError, match="cleared"):
        c.stack(link, written, counts, np.zeros(1, np.int64), np.array([0, 1]), 2, out)
    with pytest.raises(TypeError):
        c.stack(link, written, counts, never.astype(np.int32), np.array([0, 1]), 2, out)
    assert (out == -7).all()
    with pytest.raises(ValueError):
        c.extent(link, None, written, counts, np.array([2**62]), 2, False,
                 np.zeros(1, np.int64))
    with pytest.raises(ValueError):
        c.sync(link, written, np.zeros(2, np.int64), np.zeros((2, 3), np.uint8))
    with pytest.raises(ValueError):
        c.window_plan(link, written, counts, np.array([0]), 2, np.zeros((1, 3), np.int64),
                      np.zeros((1, 2), np.int32), np.zeros((1, 2), bool),
                      np.zeros(2, bool))


def _relinking_table(n: int = 4096, d: int = 256, pool: int = 1 << 16) -> tuple[Any, ...]:
    """One lane of ``n`` steps whose every next observation is kept aside (step ``k``'s
    in side slot ``k``), as a shared table whose writer keeps relinking steps."""
    src = np.arange(n * d, dtype=np.float32).reshape(n, d)
    side = np.full((pool, d), -1.0, np.float32)
    side[:n] = np.roll(src, -1, axis=0)
    link = np.arange(1, n + 1, dtype=np.int32)
    return src, side, link


@pytest.mark.parametrize("kernel", ["c", "numpy"])
def test_take_steps_takes_the_next_row_of_a_step_relinked_while_it_copies(kernel: str) -> None:
    """A shared table's writer relinks a step (link k -> 0) and reuses its side slot at
    once: a gather that read the link before and copied the slot after would return
    another step's data. take_steps reads each side row's link again after the copies
    and takes the next row where it changed (the C kernel copies without the GIL, so a
    thread relinks during the copies; the oracle's link is read through a view that
    relinks every step right after its first read)."""
    src, side, link = _relinking_table()
    n, d = src.shape
    slots = np.arange(n, dtype=np.int64)
    want = np.roll(src, -1, axis=0)
    if kernel == "numpy":
        class RelinkAfterRead(np.ndarray):  # type: ignore[type-arg]
            reads = 0

            def __getitem__(self, i: Any) -> Any:
                out = np.asarray(self)[i]
                RelinkAfterRead.reads += 1
                if RelinkAfterRead.reads == 1:  # every step relinked, every slot reused
                    np.asarray(self)[:] = 0
                    side[:n] = -1.0
                return out

        obs, nxt = np.empty((n, d), np.float32), np.empty((n, d), np.float32)
        got = windows.take_steps(slots, 1, link.view(RelinkAfterRead), ((src, obs),),
                                 ((src, side, nxt),))
        assert got == 0 and np.array_equal(nxt, want) and np.array_equal(obs, src)
        return
    import threading

    stop = threading.Event()
    writer = threading.Thread(target=relink_forever, args=(src, side, link, stop))
    writer.start()
    try:
        torn = 0
        for _ in range(60):
            obs, nxt = np.empty((n, d), np.float32), np.empty((n, d), np.float32)
            wc.take_steps(slots, 1, link, ((src, obs), (src, np.empty((n, d), np.float32))),
                          ((src, side, nxt),))
            torn += int((nxt != want).any(axis=1).sum())
    finally:
        stop.set()
        writer.join()
    assert torn == 0
