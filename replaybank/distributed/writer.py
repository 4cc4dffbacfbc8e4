"""Client-side write batching of the sharded replay service.

A client's ``add``/``extend`` calls do not go to the shards one by one: :class:`RowBatcher`
splits each call's lanes by shard (global lane ``l`` -> shard ``l % num_shards``, local
lane ``l // num_shards``) and copies the rows into that shard's pending group. A group
becomes one ``extend(env_ids=local_lanes, ...)`` on its shard, values shaped
``[T, k, *field_shape]`` (``T`` steps of ``k`` local lanes), when it holds ``max_rows``
rows or ``max_bytes`` bytes, when its oldest row is ``max_age_s`` seconds old (checked
on each call), on ``flush()``, and before the client is pickled or closed.

Cost per row: a group's buffer is allocated once, for the rows it may hold
(``min(max_rows, max_bytes / row bytes)`` in whole steps), and each call's rows are
copied into it once (a strided slice when a shard's lanes are evenly spaced
in the call, as with ``env_ids=range(num_lanes)``; ``np.take`` otherwise). A call whose
steps do not fit in the group's room fills it, closes it, and continues in a new one,
so a payload never exceeds the limits by more than one step of one call. The defaults
(:data:`MAX_ROWS`, :data:`MAX_BYTES`) make each send large enough that Ray's cost per
call (~1-3 ms: an object-store put, the task, the reply) is small beside the rows'
own cost, and small enough that a few sends in flight per shard stay cheap in memory.

Each lane's steps keep their order: a shard holds one pending group at a time, and a
call whose lane set, fields, dtypes or shapes (or whether it carries priorities)
differ from the pending group's closes that group first. An episode cut (:meth:`RowBatcher.cut`)
closes the groups of its lanes' shards and follows them as a payload of no rows.

A closed group travels as one flat byte buffer with its layout (:func:`unpack` gives
the shard ``[T, k, *shape]`` views of it): Ray serialises one buffer about twice as
fast as a dict of arrays.

Example:
    >>> import numpy as np
    >>> b = RowBatcher(num_shards=2, max_rows=4, max_age_s=60.0)
    >>> for t in range(2):
    ...     obs = t + 10 * np.arange(4)[:, None] + np.zeros((4, 3))  # lane l: 10 l + t
    ...     ready = b.append({"obs": obs, "reward": np.ones(4)}, np.arange(4), None,
    ...                      steps=False)
    >>> ready
    [0, 1]
    >>> payload = b.take(1)
    >>> values, priority = unpack(payload)
    >>> obs = values["obs"]  # [t, k, 3]: global lanes 1 and 3
    >>> payload["env_ids"], obs.shape, obs[:, :, 0].tolist()
    ([0, 1], (2, 2, 3), [[10.0, 30.0], [11.0, 31.0]])
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import ShapeError, describe
from replaybank.host import as_numpy
from replaybank.spec import tree_map

__all__ = ["MAX_BYTES", "MAX_ROWS", "RowBatcher", "tree_map", "unpack"]

IntArray = npt.NDArray[np.int64]

#: Default rows (steps x lanes) per shard per send.
MAX_ROWS = 65_536
#: Default bytes per shard per send (4 MiB).
MAX_BYTES = 4 << 20


Path = tuple[str, ...]
#: A group's layout: ``(path, dtype, per-row shape, byte offset)`` per field (path None:
#: the initial priorities), in the flat buffer of ``steps x lanes`` rows per field.
Layout = list[tuple[Path | None, str, tuple[int, ...], int]]


def _leaves(value: Any, prefix: Path = ()) -> list[tuple[Path, Any]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, (*prefix, k))]
    return [(prefix, value)]


@dataclass
class _Group:
    env_ids: tuple[int, ...]
    signature: tuple[Any, ...]  # (path, dtype, per-row shape) per field, priority last
    born: float
    flat: npt.NDArray[np.uint8]  # every field's [cap, k, *shape] block, 64-byte aligned
    views: list[Any]  # those blocks as arrays, in signature order
    offsets: list[int]
    cap: int
    steps: int = 0  # filled steps
    # the call each run of steps came from: [call, first step, end step] in this group
    calls: list[list[Any]] = field(default_factory=list)


class RowBatcher:
    """Pending rows per shard (see the module docs).

    A closed group is a payload ``{"env_ids", "flat", "layout", "steps", "rows",
    "calls"}``: the fields' bytes in one flat ``uint8`` array (Ray serialises one
    buffer about twice as fast as a dict of arrays), read back by :func:`unpack`, and
    which call each run of steps came from (``(call, first step, end step)`` each, the
    tags :meth:`append` was given), so a shard that refuses one call's rows can still
    write the others' and say which call it refused.

    Args:
        num_shards: Shards of the service.
        max_rows: Rows (steps x lanes) per shard that close a group.
        max_age_s: Age in seconds of a group's oldest row that closes every group.
        max_bytes: Bytes (values and priorities) per shard that close a group.
        clock: Time source (``time.monotonic``).
    """

    def __init__(self, num_shards: int, max_rows: int, max_age_s: float,
                 max_bytes: int = MAX_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.num_shards = num_shards
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.clock = clock
        self._groups: dict[int, _Group] = {}
        self._closed: dict[int, list[dict[str, Any]]] = {}

    @property
    def pending_rows(self) -> int:
        """Rows not yet handed out by :meth:`take`."""
        closed = sum(int(p["rows"]) for ps in self._closed.values() for p in ps)
        return closed + sum(g.steps * len(g.env_ids) for g in self._groups.values())

    def append(self, values: dict[str, Any], lanes: IntArray, priority: Any, steps: bool,
               call: Any = None) -> list[int]:
        """Queue one call's rows (copied: the caller may reuse its arrays).

        Args:
            values: Field values ``[k, *shape]`` (``steps=False``, one step of ``k``
                lanes) or ``[t, k, *shape]`` (``steps=True``); nested dicts allowed.
            lanes: The ``k`` global lanes, ``[k]``.
            priority: None, or ``[k]`` / ``[t, k]`` float initial priorities.
            steps: Whether values carry a leading step dimension.
            call: The call's tag (picklable), named in the payloads' ``"calls"``.

        Returns:
            Shards whose pending rows reached ``max_rows``, ``max_bytes`` or
            ``max_age_s`` (ready for :meth:`take`).
        """
        leaves = _leaves(values)
        srcs = [np.asarray(v) for _, v in leaves]
        paths: list[Path | None] = [path for path, _ in leaves]
        if priority is not None:
            srcs.append(np.asarray(priority, np.float64))
            paths.append(None)
        if not steps:
            srcs = [a[None] for a in srcs]
        t = int(srcs[0].shape[0])
        signature = tuple((path, a.dtype, a.shape[2:])
                          for path, a in zip(paths, srcs, strict=True))
        shard_of = lanes % self.num_shards
        now = self.clock()
        for s in np.unique(shard_of).tolist():
            idx = np.flatnonzero(shard_of == s)
            local = tuple((lanes[idx] // self.num_shards).tolist())
            pick = _picker(idx)
            g = self._groups.get(s)
            if g is not None and (g.env_ids != local or g.signature != signature):
                self._close(s)
                g = None
            done = 0
            while done < t:
                if g is None:
                    g = self._groups[s] = self._new_group(local, signature, now)
                n = min(t - done, g.cap - g.steps)
                for dst, src in zip(g.views, srcs, strict=True):
                    pick(src[done:done + n], dst[g.steps:g.steps + n])
                g.calls.append([call, g.steps, g.steps + n])
                g.steps += n
                done += n
                if g.steps >= g.cap:
                    self._close(s)
                    g = None
        if any(now - g.born >= self.max_age_s for g in self._groups.values()):
            for s in list(self._groups):
                self._close(s)
        return sorted(self._closed)

    def _new_group(self, local: tuple[int, ...], signature: tuple[Any, ...],
                   now: float) -> _Group:
        """A group with room for ``max_rows`` / ``max_bytes`` worth of whole steps."""
        k = len(local)
        row = [int(dt.itemsize) * math.prod(shape) for _, dt, shape in signature]
        step_bytes = max(k * sum(row), 1)
        cap = max(1, min(-(-self.max_rows // k), self.max_bytes // step_bytes))
        flat, offsets = _alloc([cap * k * r for r in row])
        views = [flat[o:o + cap * k * r].view(dt).reshape(cap, k, *shape)
                 for o, r, (_, dt, shape) in zip(offsets, row, signature, strict=True)]
        return _Group(local, signature, now, flat, views, offsets, cap)

    def _close(self, shard: int) -> None:
        g = self._groups.pop(shard)
        n, k = g.steps, len(g.env_ids)
        flat, offsets = g.flat, g.offsets
        if n < g.cap:  # compact: send the filled rows only
            flat, offsets = _alloc([v[:n].nbytes for v in g.views])
            for v, o in zip(g.views, offsets, strict=True):
                flat[o:o + v[:n].nbytes] = v[:n].reshape(-1).view(np.uint8)
        layout: Layout = [(path, dt.str, shape, o) for (path, dt, shape), o
                          in zip(g.signature, offsets, strict=True)]
        self._closed.setdefault(shard, []).append(
            {"env_ids": list(g.env_ids), "flat": flat, "layout": layout, "steps": n,
             "rows": n * k, "calls": [tuple(c) for c in g.calls]})

    def cut(self, lanes: IntArray, call: Any = None) -> list[int]:
        """Queue an episode cut of the global ``lanes`` after every row queued for them.

        A cut is a write of no rows: each shard of ``lanes`` closes its pending group
        (the rows before the cut) and gets a payload ``{"env_ids": local lanes, "cut":
        True, "steps": 0, "rows": 0, "calls": [(call, 0, 0)]}`` after it, so the shard
        ends those lanes' episodes between the same steps as the client's calls did
        (:meth:`~replaybank.distributed.shard.Shard.extend` writes each client's
        payloads in order).

        Args:
            lanes: ``[m]`` distinct global lanes.
            call: The call's tag (picklable), named in the payload's ``"calls"``.

        Returns:
            Shards that have payloads ready (for :meth:`take`).

        Example:
            >>> b = RowBatcher(num_shards=2, max_rows=64, max_age_s=60.0)
            >>> b.append({"obs": np.zeros(4)}, np.arange(4), None, steps=False)
            []
            >>> b.cut(np.array([3]), ("end_episodes", 2))
            [1]
            >>> [(p["env_ids"], p["rows"], p.get("cut", False)) for p in (b.take(1), b.take(1))]
            [([0, 1], 2, False), ([1], 0, True)]
        """
        lanes = np.asarray(lanes, np.int64)
        shard_of = lanes % self.num_shards
        for s in np.unique(shard_of).tolist():
            local = sorted((lanes[shard_of == s] // self.num_shards).tolist())
            if s in self._groups:
                self._close(s)
            self._closed.setdefault(s, []).append(
                {"env_ids": local, "cut": True, "steps": 0, "rows": 0,
                 "calls": [(call, 0, 0)]})
        return sorted(self._closed)

    def close_all(self) -> list[int]:
        """Close every pending group; the shards that have payloads ready."""
        for s in list(self._groups):
            self._close(s)
        return sorted(self._closed)

    def take(self, shard: int) -> dict[str, Any] | None:
        """The oldest ready payload of ``shard`` (None: none ready)."""
        ready = self._closed.get(shard)
        if not ready:
            return None
        payload = ready.pop(0)
        if not ready:
            del self._closed[shard]
        return payload


def unpack(payload: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """``(values, priority)`` of a payload: ``[T, k, *shape]`` views of its flat buffer
    (nested dicts rebuilt; ``priority`` ``[T, k]`` or None). A payload with
    ``"values"`` (built by hand) is returned as it is."""
    if "flat" not in payload:
        return payload["values"], payload.get("priority")
    flat, n, k = payload["flat"], int(payload["steps"]), len(payload["env_ids"])
    values: dict[str, Any] = {}
    priority = None
    for path, dt, shape, off in payload["layout"]:
        size = n * k * np.dtype(dt).itemsize * math.prod(shape)
        a = flat[off:off + size].view(dt).reshape(n, k, *shape)
        if path is None:
            priority = a
            continue
        node = values
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = a
    return values, priority


def _alloc(sizes: list[int]) -> tuple[npt.NDArray[np.uint8], list[int]]:
    """One flat buffer holding blocks of ``sizes`` bytes at 64-byte aligned offsets."""
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // 64) * 64
    return np.empty(end, np.uint8), offsets


def _picker(idx: IntArray) -> Callable[[Any, Any], None]:
    """``pick(src [t, K, ...], dst [t, k, ...])``: copy lanes ``idx`` of ``src`` into
    ``dst`` (one copy: a strided slice when ``idx`` is evenly spaced)."""
    k = len(idx)
    step = int(idx[1] - idx[0]) if k > 1 else 1
    if step > 0 and bool(np.all(idx == idx[0] + step * np.arange(k))):
        lanes_slice = slice(int(idx[0]), int(idx[0]) + step * (k - 1) + 1, step)

        def by_slice(src: Any, dst: Any) -> None:
            dst[...] = src[:, lanes_slice]

        return by_slice

    def by_take(src: Any, dst: Any) -> None:
        np.take(src, idx, axis=1, out=dst, mode="clip")

    return by_take


def _lead(values: dict[str, Any]) -> tuple[int, ...]:
    v: Any = values
    while isinstance(v, dict):
        v = next(iter(v.values()))
    return tuple(np.shape(v)[:2])


def lanes_of(env_ids: Any, num_lanes: int, call: str) -> IntArray:
    """``env_ids`` checked as distinct global lanes in ``[0, num_lanes)``.

    Raises:
        ShapeError: Not 1-D ints, out of range, or repeated; a ragged nest (the one ragged
            check, :func:`~replaybank.host.as_numpy`).
    """
    arr = as_numpy(
        env_ids,
        label=lambda: f"{call}(env_ids={describe(env_ids)})",
        expected="[k] distinct lane ids",
        fix=f"pass distinct lane ids in [0, {num_lanes}) (the service's num_lanes)",
    )
    if arr.ndim != 1 or len(arr) == 0 or not np.issubdtype(arr.dtype, np.integer) \
            or arr.min() < 0 or arr.max() >= num_lanes or len(np.unique(arr)) != len(arr):
        raise ShapeError(f"{call}(env_ids={describe(env_ids)}): must be distinct lane "
                         f"ids in [0, {num_lanes}) (the service's num_lanes)")
    return arr.astype(np.int64)
