"""The C row gathers against their numpy oracles: of window batches
(``replaybank._windows.take_rows`` and :func:`replaybank.ops.windows.take_rows`), alone on
random jobs and inside the sequence and frame-stack gathers on random buffers (several
lanes, wrapped rings, episode ends, truncations and padded windows); and of one-step
batches (``take_steps`` and :func:`replaybank.ops.windows.take_steps`) against each other
and a plain loop."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaybank as rb
from replaybank.ops import windows
from replaybank.views.framestack import FrameStackView

wc = pytest.importorskip("replaybank.ops.windows_c")

DTYPES = [np.uint8, np.bool_, np.int16, np.float32, np.int64, np.float64, np.complex128]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), n_jobs=st.integers(0, 5))
def test_take_rows_matches_the_numpy_oracle(seed: int, n_jobs: int) -> None:
    rng = np.random.default_rng(seed)
    jobs_c: list[tuple[Any, Any, Any]] = []
    jobs_np: list[tuple[Any, Any, Any]] = []
    for _ in range(n_jobs):
        dtype = DTYPES[int(rng.integers(len(DTYPES)))]
        shape = tuple(int(d) for d in rng.integers(1, 5, int(rng.integers(0, 3))))
        n = int(rng.integers(1, 40))
        src: Any = (rng.standard_normal((n, *shape)) * 50).astype(dtype)
        idx_shape = tuple(int(d) for d in rng.integers(1, 6, int(rng.integers(1, 3))))
        idx = rng.integers(0, n, idx_shape)
        outs = [np.full((*idx.shape, *shape), 7, dtype) for _ in range(2)]
        jobs_c.append((src, idx, outs[0]))
        jobs_np.append((src, idx, outs[1]))
    wc.take_rows(tuple(jobs_c))
    windows.take_rows(tuple(jobs_np))
    for (src, idx, a), (_, _, b) in zip(jobs_c, jobs_np, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, src[idx])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), n_jobs=st.integers(1, 4))
def test_window_pairs_match_the_numpy_oracle(seed: int, n_jobs: int) -> None:
    """Window pairs ``(src, idx [B, W + 1], obs, next)``, mixed with plain jobs: obs is
    ``src[idx[:, :-1]]`` and next ``src[idx[:, 1:]]`` in C and in numpy."""
    rng = np.random.default_rng(seed)
    jobs_c: list[tuple[Any, ...]] = []
    jobs_np: list[tuple[Any, ...]] = []
    for _ in range(n_jobs):
        dtype = DTYPES[int(rng.integers(len(DTYPES)))]
        shape = tuple(int(d) for d in rng.integers(1, 5, int(rng.integers(0, 3))))
        n = int(rng.integers(1, 40))
        src: Any = (rng.standard_normal((n, *shape)) * 50).astype(dtype)
        idx = rng.integers(0, n, (int(rng.integers(1, 6)), int(rng.integers(2, 9))))
        pair = bool(rng.integers(2))
        cols = idx.shape[1] - 1 if pair else idx.shape[1]
        outs = [np.full((idx.shape[0], cols, *shape), 7, dtype) for _ in range(4)]
        jobs_c.append((src, idx, outs[0], outs[1]) if pair else (src, idx, outs[0]))
        jobs_np.append((src, idx, outs[2], outs[3]) if pair else (src, idx, outs[2]))
    wc.take_rows(tuple(jobs_c))
    windows.take_rows(tuple(jobs_np))
    for c, o in zip(jobs_c, jobs_np, strict=True):
        src, idx = c[0], c[1]
        for a, b in zip(c[2:], o[2:], strict=True):
            np.testing.assert_array_equal(a, b)
        if len(c) == 4:
            np.testing.assert_array_equal(c[2], src[idx[:, :-1]])
            np.testing.assert_array_equal(c[3], src[idx[:, 1:]])
        else:
            np.testing.assert_array_equal(c[2], src[idx])


@pytest.mark.parametrize("take", [wc.take_rows, windows.take_rows], ids=["c", "numpy"])
def test_window_pairs_are_checked_before_copying(take: Any) -> None:
    src = np.arange(12, dtype=np.float32).reshape(6, 2)
    obs, nxt = np.zeros((1, 2, 2), np.float32), np.zeros((1, 2, 2), np.float32)
    good = (src, np.array([1, 2]), np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match=r"\[B, W \+ 1\]"):
        take((good, (src, np.array([0, 1, 2]), obs, nxt)))  # idx not [B, W + 1]
    with pytest.raises(ValueError, match=r"\[B, W \+ 1\]"):
        take(((src, np.array([[0], [1]]), obs, nxt),))  # W = 0
    with pytest.raises(ValueError, match="next holds"):
        take(((src, np.array([[0, 1, 2]]), obs, np.zeros((1, 3, 2), np.float32)),))
    with pytest.raises(ValueError, match="out holds"):
        take(((src, np.array([[0, 1, 2]]), np.zeros((1, 3, 2), np.float32), nxt),))
    with pytest.raises(IndexError):
        take((good, (src, np.array([[0, 1, 6]]), obs, nxt)))
    with pytest.raises(TypeError):
        take(((src, np.array([[0, 1]]), obs, nxt, nxt),))
    assert not good[2].any() and not obs.any() and not nxt.any()  # nothing was copied


@pytest.mark.parametrize("take", [wc.take_rows, windows.take_rows], ids=["c", "numpy"])
def test_take_rows_checks_every_job_before_copying(take: Any) -> None:
    src = np.arange(12, dtype=np.float32).reshape(6, 2)
    out = np.zeros((2, 2), np.float32)
    bad_out = np.zeros((2, 2), np.float32)
    for idx, exc in ((np.array([0, 6]), IndexError), (np.array([-1, 0]), IndexError),
                     (np.array([0, 1], np.int32), TypeError)):
        with pytest.raises(exc):
            take(((src, np.array([1, 2]), out), (src, idx, bad_out)))
        assert not out.any() and not bad_out.any()  # the good job was not copied either
    with pytest.raises(ValueError, match="rows of 8 bytes"):
        take(((src, np.array([1, 2]), np.zeros((3, 2), np.float32)),))


def test_take_rows_refuses_what_it_cannot_read() -> None:
    src = np.arange(12, dtype=np.float32).reshape(6, 2)
    with pytest.raises((TypeError, ValueError, BufferError)):
        wc.take_rows(((src[:, :1], np.array([0]), np.zeros((1, 1), np.float32)),))
    with pytest.raises(TypeError, match="without objects"):
        wc.take_rows(((np.array([None, 1], object), np.array([0]), np.zeros(1, object)),))
    with pytest.raises(TypeError):
        wc.take_rows([(src, np.array([0]), np.zeros((1, 2), np.float32))])


def test_row_kernel_leaves_c_out_in_pure_python_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAYBANK_PURE_PYTHON", "1")
    assert windows.row_kernel() == (windows.take_rows, "numpy")
    monkeypatch.delenv("REPLAYBANK_PURE_PYTHON")
    assert windows.row_kernel()[1] == "c"


def _steps_case(rng: np.random.Generator) -> tuple[Any, ...]:
    """A random ``take_steps`` call: slots (one wrap), lanes, link, fields, side arrays."""
    n = int(rng.integers(1, 30))
    lanes = int(rng.integers(1, n + 1))
    b = int(rng.integers(0, 20))
    slots = rng.integers(0, 2 * n, b)
    srcs = []
    for _ in range(int(rng.integers(0, 5))):
        dtype = DTYPES[int(rng.integers(len(DTYPES)))]
        shape = tuple(int(d) for d in rng.integers(1, 4, int(rng.integers(0, 3))))
        srcs.append((rng.standard_normal((n, *shape)) * 50).astype(dtype))
    n_obs = int(rng.integers(0, min(len(srcs), 2) + 1))
    rows = int(rng.integers(1, 6))
    sides = [(rng.standard_normal((rows + int(rng.integers(0, 3)), *src.shape[1:])) * 50
              ).astype(src.dtype) for src in srcs[:n_obs]]
    link = np.where(rng.random(n) < 0.3, rng.integers(1, rows + 1, n), 0).astype(np.int32)
    return slots, lanes, link, srcs, sides


def _steps_outs(b: int, srcs: list[Any], n_obs: int) -> tuple[list[Any], list[Any]]:
    outs = [np.full((b, *src.shape[1:]), 7, src.dtype) for src in srcs]
    nxts = [np.full((b, *src.shape[1:]), 7, src.dtype) for src in srcs[:n_obs]]
    return outs, nxts


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**16), base=st.sampled_from([None, 0, 1, 7, 2**40]))
def test_take_steps_matches_the_numpy_oracle_and_a_loop(seed: int, base: int | None) -> None:
    """``base`` (when given) is added to the slots passed and subtracted by the kernels."""
    slots, lanes, link, srcs, sides = _steps_case(np.random.default_rng(seed))
    n, b, n_obs = len(link), len(slots), len(sides)
    got = []
    for take in (wc.take_steps, windows.take_steps):
        outs, nxts = _steps_outs(b, srcs, n_obs)
        args = (tuple(zip(srcs, outs, strict=True)), tuple(zip(srcs, sides, nxts, strict=False)))
        if base is None:
            n_side = take(slots, lanes, link, *args)
        else:
            n_side = take(slots + base, lanes, link, *args, base)
        got.append((n_side, outs, nxts))
    want_side = 0
    for i, slot in enumerate(slots.tolist()):
        s = slot % n
        for k, src in enumerate(srcs):
            for _, outs, nxts in got:
                np.testing.assert_array_equal(outs[k][i], src[s])
                if k < n_obs:
                    want = sides[k][link[s] - 1] if link[s] > 0 else src[(s + lanes) % n]
                    np.testing.assert_array_equal(nxts[k][i], want)
        want_side += int(link[s] > 0) if n_obs else 0
    assert got[0][0] == got[1][0] == want_side


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_take_steps_reads_item_keys_at_their_slots(seed: int) -> None:
    """``keys=True``: each entry is an item key, read at ``(key // lanes % T) * lanes +
    key % lanes``: the same rows as the slots given outright, from C and from numpy."""
    rng = np.random.default_rng(seed)
    slots, lanes, link, srcs, sides = _steps_case(rng)
    n = len(link)
    if n % lanes:
        lanes = 1
    # small keys, keys about 2**51 (where the kernels' reciprocal division hands over to
    # the machine's) and keys up to 2**62
    edge = 2**51 + rng.integers(-2 * n, 2 * n, len(slots))
    keys = np.choose(rng.integers(0, 3, len(slots)), [rng.integers(0, 2**40, len(slots)),
                                                       edge, rng.integers(0, 2**62, len(slots))])
    keys = keys.astype(np.int64)
    at = keys // lanes % (n // lanes) * lanes + keys % lanes
    n_obs = len(sides)
    for take in (wc.take_steps, windows.take_steps):
        got, want = _steps_outs(len(keys), srcs, n_obs), _steps_outs(len(keys), srcs, n_obs)
        for idx, (outs, nxts), extra in ((keys, got, (0, True)), (at, want, ())):
            take(idx, lanes, link, tuple(zip(srcs, outs, strict=True)),
                 tuple(zip(srcs, sides, nxts, strict=False)), *extra)
        for a, b in zip([*got[0], *got[1]], [*want[0], *want[1]], strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("take", [wc.take_steps, windows.take_steps], ids=["c", "numpy"])
def test_take_steps_refuses_bad_keys(take: Any) -> None:
    src = np.arange(12, dtype=np.float32).reshape(6, 2)
    out = np.zeros((2, 2), np.float32)
    link = np.zeros(6, np.int32)
    with pytest.raises(IndexError):
        take(np.array([3, -1]), 2, link, ((src, out),), (), 0, True)
    with pytest.raises(ValueError, match="whole number of rows"):
        take(np.array([3, 1]), 4, link, ((src, out),), (), 0, True)
    assert not out.any()


@pytest.mark.parametrize("take", [wc.take_steps, windows.take_steps], ids=["c", "numpy"])
def test_take_steps_checks_everything_before_copying(take: Any) -> None:
    src = np.arange(12, dtype=np.float32).reshape(6, 2)
    side = np.full((2, 2), -1, np.float32)
    link = np.array([0, 2, 0, 0, 0, 1], np.int32)
    out, nxt = np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32)

    def call(slots: Any, lk: Any = link, o: Any = out, sd: Any = side, lanes: int = 1) -> Any:
        return take(np.asarray(slots, np.int64), lanes, lk, ((src, o),), ((src, sd, nxt),))

    assert call([1, 11]) == 2 and out.tolist() == [[2, 3], [10, 11]]
    assert nxt.tolist() == [[-1, -1], [-1, -1]]
    out[:] = nxt[:] = 0
    for args, exc in ((([0, 12],), IndexError), (([-1, 0],), IndexError),
                      (([1, 0], np.array([0, 3, 0, 0, 0, 0], np.int32)), IndexError),
                      (([1, 0], np.array([0, -1, 0, 0, 0, 0], np.int32)), IndexError),
                      (([1, 0], np.zeros(5, np.int32)), ValueError),
                      (([1, 0], link, np.zeros((3, 2), np.float32)), ValueError),
                      (([1, 0], link, out, np.zeros((2, 3), np.float32)), ValueError)):
        with pytest.raises(exc):
            call(*args)
        assert not out.any() and not nxt.any()  # nothing was copied
    with pytest.raises(ValueError, match="lanes"):
        call([0, 1], lanes=7)
    for slots, base in (([5, 6], 6), ([17, 30], 5)):  # below the base, past one wrap
        with pytest.raises(IndexError):
            take(np.asarray(slots, np.int64), 1, link, ((src, out),), ((src, side, nxt),),
                 base)
        assert not out.any() and not nxt.any()
    if take is wc.take_steps:
        with pytest.raises(ValueError, match="base"):
            take(np.array([0, 1]), 1, link, ((src, out),), ((src, side, nxt),), -1)


def test_take_steps_refuses_objects_and_the_table_still_serves_them() -> None:
    objs = np.array(["a", None, 3, 4.0], object)
    with pytest.raises((TypeError, ValueError), match="without objects"):
        wc.take_steps(np.array([0]), 1, np.zeros(4, np.int32), ((objs, np.empty(1, object)),),
                      ())
    n_side = windows.take_steps(np.array([0, 5]), 1, np.zeros(4, np.int32),
                                ((objs, out := np.empty(2, object)),), ())
    assert n_side == 0 and out.tolist() == ["a", None]


def test_steps_kernel_leaves_c_out_in_pure_python_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAYBANK_PURE_PYTHON", "1")
    assert windows.kernel(windows.take_steps) == (windows.take_steps, "numpy")
    monkeypatch.delenv("REPLAYBANK_PURE_PYTHON")
    assert windows.kernel(windows.take_steps)[1] == "c"


def _random_buffer(rng: np.random.Generator, lanes: int, rows: int, n: int,
                   frame_stack: int = 1) -> rb.ReplayBuffer:
    """A buffer of ``lanes`` lanes and ``rows`` rows each, written ``n`` steps per lane
    (the ring wraps), with random episode ends and truncations."""
    buf = rb.ReplayBuffer(rows * lanes, num_envs=lanes, seed=int(rng.integers(2**16)),
                          frame_stack=frame_stack)
    obs = rng.integers(0, 255, (n + 1, lanes, 3, 2)).astype(np.uint8)
    term = rng.random((n, lanes)) < 0.15
    trunc = (rng.random((n, lanes)) < 0.1) & ~term
    nxt = obs[1:].copy()
    ended = term | trunc
    nxt[ended] = 255 - nxt[ended]  # a final observation that is not the next reset one
    buf.extend(obs=obs[:n], action=rng.integers(0, 4, (n, lanes)),
               reward=rng.standard_normal((n, lanes)).astype(np.float32), next_obs=nxt,
               terminated=term, truncated=trunc)
    return buf


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), lanes=st.integers(1, 4), rows=st.integers(4, 24),
       length=st.integers(1, 6), burn_in=st.integers(0, 2), cross=st.booleans(),
       strict=st.booleans())
def test_sequence_gather_is_the_same_with_either_row_kernel(
        seed: int, lanes: int, rows: int, length: int, burn_in: int, cross: bool,
        strict: bool) -> None:
    pytest.importorskip("numba")
    from replaybank.views import sequence

    if strict and burn_in + length > rows:
        return  # never fits (sample_sequences says so)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(rows // 2, 3 * rows))
    bufs = [_random_buffer(np.random.default_rng(seed), lanes, rows, n) for _ in range(2)]
    kw = {"episode_boundary": "cross" if cross else "stop", "strict": strict,
          "burn_in": burn_in}
    got: list[Any] = []
    for buf, take in zip(bufs, (wc.take_rows, windows.take_rows), strict=True):
        old = sequence._row_kernel
        sequence._row_kernel = lambda take=take: take  # type: ignore[assignment]
        try:
            got.append(buf.sample_sequences(8, length, **kw))
        except rb.EmptyBufferError:
            got.append(None)
        finally:
            sequence._row_kernel = old
    if got[0] is None:
        assert got[1] is None
        return
    assert got[1] is not None
    a, b = got[0].to_dict(nested=False), got[1].to_dict(nested=False)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), lanes=st.integers(1, 3), rows=st.integers(4, 16),
       k=st.integers(2, 4))
def test_frame_stacks_are_the_same_with_either_row_kernel(seed: int, lanes: int, rows: int,
                                                         k: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(rows // 2, 3 * rows))
    buf = _random_buffer(rng, lanes, rows, n, frame_stack=k)
    t, view = buf.table, buf.view
    assert isinstance(view, FrameStackView)
    live = np.concatenate([np.arange(w - c, w) * lanes + lane for lane, (w, c)
                           in enumerate(zip(t.written.tolist(), t.counts.tolist(), strict=True))])
    keys = rng.choice(live, 12).astype(np.int64)
    ok = view.valid(t, keys)
    keys = keys if ok is None else keys[ok]
    if len(keys) == 0:
        return
    view.gather_valid(t, keys)  # picks the kernels
    got = []
    for take in (wc.take_rows, windows.take_rows):
        view._take = take
        out = view.gather_valid(t, keys)
        assert out is not None
        got.append(out)
    ref = view.gather(t, keys)
    for name in ref:
        np.testing.assert_array_equal(got[0][name], got[1][name], err_msg=name)
        np.testing.assert_array_equal(got[0][name], ref[name], err_msg=name)
