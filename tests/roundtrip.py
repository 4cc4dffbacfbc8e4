"""Reusable checkpoint round-trip check for every buffer type.

``assert_roundtrip(buf, tmp_path)`` saves ``buf`` to files, loads it back and asserts:

1. the loaded buffer has the same type and bit-identical state (every array, every
   JSON value: counters, generator, sampler state);
2. the next sample of the loaded buffer equals the next sample of the original;
3. after the same further adds, states and samples still agree;
4. the same holds in memory: ``from_config(buf.config())`` + ``load_state_dict``.

Other test files import it: ``from tests.roundtrip import assert_roundtrip``.

Example:
    >>> import tempfile, numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=8, seed=0)
    >>> add_random(buf, np.random.default_rng(0), 10)
    >>> type(assert_roundtrip(buf, tempfile.mkdtemp())).__name__
    'ReplayBuffer'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from replaybank.config import buffer_config, from_config
from replaybank.io.state_tree import split_state
from replaybank.persist import load as load_buffer
from replaybank.persist import save as save_buffer
from replaybank.spec import unflatten

__all__ = ["add_random", "assert_roundtrip", "assert_same", "assert_same_state",
           "random_fields"]


def _np(value: Any) -> Any:
    if hasattr(value, "detach"):  # torch tensor
        return value.detach().cpu().numpy()
    return value


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Recursive equality; arrays must match in dtype, shape and bytes (NaN-safe)."""
    a, b = _np(a), _np(b)
    if isinstance(a, Mapping) or (hasattr(a, "keys") and hasattr(a, "__getitem__")):
        ka, kb = sorted(a.keys()), sorted(b.keys())
        assert ka == kb, f"{where}: keys differ: {ka} vs {kb}"
        for k in ka:
            assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, f"{where}: dtype {a.dtype} vs {b.dtype}"
        assert a.shape == b.shape, f"{where}: shape {a.shape} vs {b.shape}"
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), \
            f"{where}: values differ"
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: {a} vs {b}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}/{i}")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def _drop(state: Mapping[str, Any], ignore: tuple[str, ...]) -> dict[str, Any]:
    out = dict(state)
    for path in ignore:
        *parents, last = path.split(".")
        node: Any = out
        for p in parents:
            node[p] = dict(node[p])
            node = node[p]
        node.pop(last, None)
    return out


def assert_same_state(a: Any, b: Any, ignore: tuple[str, ...] = ()) -> None:
    """Two buffers (or state dicts) hold bit-identical state.

    Args:
        ignore: Dotted key paths to leave out (e.g. ``"init.path"``).
    """
    sa = _drop(a if isinstance(a, Mapping) else a.state_dict(), ignore)
    sb = _drop(b if isinstance(b, Mapping) else b.state_dict(), ignore)
    ta, arrays_a = split_state(sa)
    tb, arrays_b = split_state(sb)
    assert_same(ta, tb, "state")
    assert_same(arrays_a, arrays_b, "arrays")


def random_fields(buf: Any, rng: np.random.Generator) -> dict[str, Any]:
    """One random ``add`` for a ReplayBuffer-like buffer with a spec (all lanes)."""
    spec, n = buf.spec, buf.num_envs
    lead = (n,) if n > 1 else ()
    flat: dict[str, Any] = {}
    for name, f in spec.items():
        shape = lead + tuple(f.shape)
        if f.dtype.kind == "b":
            p = 0.05 if name == "truncated" else 0.15
            v: Any = rng.random(shape) < p
        elif f.dtype.kind in "iu":
            v = rng.integers(0, 5, size=shape).astype(f.dtype)
        elif f.dtype.kind == "f":
            v = rng.standard_normal(shape).astype(f.dtype)
        else:
            v = np.zeros(shape, f.dtype)
        flat[name] = v
        if name == "obs" or name.startswith("obs/"):
            flat["next_" + name] = (rng.standard_normal(shape) * 10).astype(f.dtype) \
                if f.dtype.kind == "f" else v.copy()
    return unflatten(flat)


def add_random(buf: Any, rng: np.random.Generator, steps: int,
               obs_shape: tuple[int, ...] = (3,)) -> None:
    """Add ``steps`` random steps; mostly continuing episodes (next_obs == next obs).

    On an empty buffer without spec, the first add defines obs (float32 ``obs_shape``),
    action (int64), reward, terminated and truncated.
    """
    n = buf.num_envs
    lead = (n,) if n > 1 else ()
    if buf.spec is not None and "obs" in buf.spec:
        obs_shape = tuple(buf.spec["obs"].shape)
    obs = rng.standard_normal(lead + obs_shape).astype(np.float32)
    for _ in range(steps):
        if buf.spec is None:
            fields: dict[str, Any] = {
                "obs": obs, "action": rng.integers(0, 4, size=lead),
                "reward": rng.standard_normal(lead).astype(np.float32),
                "terminated": rng.random(lead) < 0.15, "truncated": rng.random(lead) < 0.05}
        else:
            fields = random_fields(buf, rng)
            if "obs" in fields and not isinstance(fields["obs"], dict):
                fields["obs"] = obs.astype(fields["obs"].dtype).reshape(fields["obs"].shape)
        nxt = rng.standard_normal(lead + obs_shape).astype(np.float32)
        if "obs" in fields and not isinstance(fields["obs"], dict):
            fields["next_obs"] = nxt.astype(fields["obs"].dtype).reshape(fields["obs"].shape)
        buf.add(**fields)
        done = np.asarray(fields["terminated"]) | np.asarray(fields["truncated"])
        reset = rng.standard_normal(lead + obs_shape).astype(np.float32)
        obs = np.where(np.reshape(done, done.shape + (1,) * len(obs_shape)), reset, nxt)


def _default_sample(buf: Any) -> Any:
    return buf.sample(8) if len(buf) else None


def _default_add(buf: Any, i: int) -> None:
    add_random(buf, np.random.default_rng(1000 + i), 1)


def assert_roundtrip(
    buf: Any,
    tmp_path: Any,
    *,
    prefix: str = "buffer_",
    sample: Callable[[Any], Any] | None = _default_sample,
    add: Callable[[Any, int], None] | None = _default_add,
    steps: int = 3,
    in_memory: bool = True,
    ignore: tuple[str, ...] = (),
    **load_overrides: Any,
) -> Any:
    """Save -> load -> identical state, identical next sample, identical further adds.

    Args:
        buf: Any registered buffer type.
        tmp_path: Directory for the checkpoint.
        prefix: File prefix.
        sample: Draws the batch to compare (None: no sampling).
        add: ``add(buffer, i)`` adds the same data to a buffer for step ``i`` (None: no
            further adds).
        steps: Number of further adds.
        in_memory: Also check ``from_config(buf.config())`` + ``load_state_dict``.
        ignore: State key paths that may differ (e.g. ``"init.storage"`` when loading
            with another storage).
        **load_overrides: Passed to :func:`~replaybank.persist.load`.

    Returns:
        The loaded buffer.
    """
    save_buffer(buf, tmp_path, prefix=prefix)
    loaded = load_buffer(tmp_path, prefix=prefix, **load_overrides)
    assert type(loaded) is type(buf), f"loaded a {type(loaded).__name__}"
    assert_same_state(buf, loaded, ignore)
    twins = [loaded]
    if in_memory:
        fresh = from_config(buffer_config(buf), **load_overrides)
        fresh.load_state_dict(buf.state_dict())
        assert_same_state(buf, fresh, ignore)
        twins.append(fresh)
    for i in range(steps + 1):
        if sample is not None:
            want = sample(buf)
            for twin in twins:
                assert_same(want, sample(twin), f"sample after {i} adds")
        if i == steps or add is None:
            break
        for b in (buf, *twins):
            add(b, i)
        for twin in twins:
            assert_same_state(buf, twin, ignore)
    return loaded
