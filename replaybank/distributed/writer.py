"""Client-side write batching of the sharded replay service.

A client's ``add``/``extend`` calls do not go to the shards one by one: :class:`RowBatcher`
splits each call's lanes by shard (global lane ``l`` -> shard ``l % num_shards``, local
lane ``l // num_shards``) and appends the rows to that shard's pending group. A group
becomes one ``extend(env_ids=local_lanes, ...)`` on its shard, values shaped
``[T, k, *field_shape]`` (``T`` steps of ``k`` local lanes), when it holds ``max_rows``
rows, when its oldest row is ``max_age_s`` seconds old (checked on each call), on
``flush()``, and before the client is pickled or closed.

Each lane's steps keep their order: a shard holds one pending group at a time, and a
call whose lane set (or whether it carries priorities) differs from the pending
group's closes that group first.

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
    >>> obs = payload["values"]["obs"]  # [t, k, 3]: global lanes 1 and 3
    >>> payload["env_ids"], obs.shape, obs[:, :, 0].tolist()
    ([0, 1], (2, 2, 3), [[10.0, 30.0], [11.0, 31.0]])
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import ShapeError, describe

__all__ = ["RowBatcher", "tree_map"]

IntArray = npt.NDArray[np.int64]


def tree_map(fn: Callable[[Any], Any], value: Any) -> Any:
    """``fn`` applied to every leaf of nested dicts (dict observations)."""
    if isinstance(value, dict):
        return {k: tree_map(fn, v) for k, v in value.items()}
    return fn(value)


@dataclass
class _Group:
    env_ids: tuple[int, ...]
    prioritized: bool
    born: float
    chunks: list[dict[str, Any]] = field(default_factory=list)  # values [t, k, ...]
    priorities: list[Any] = field(default_factory=list)  # [t, k] each
    rows: int = 0


class RowBatcher:
    """Pending rows per shard (see the module docs).

    Args:
        num_shards: Shards of the service.
        max_rows: Rows (steps x lanes) per shard that close a group.
        max_age_s: Age in seconds of a group's oldest row that closes every group.
        clock: Time source (``time.monotonic``).
    """

    def __init__(self, num_shards: int, max_rows: int, max_age_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.num_shards = num_shards
        self.max_rows = max_rows
        self.max_age_s = max_age_s
        self.clock = clock
        self._groups: dict[int, _Group] = {}
        self._closed: dict[int, list[dict[str, Any]]] = {}

    @property
    def pending_rows(self) -> int:
        """Rows not yet handed out by :meth:`take`."""
        closed = sum(int(np.prod(_lead(p["values"]))) for ps in self._closed.values()
                     for p in ps)
        return closed + sum(g.rows for g in self._groups.values())

    def append(self, values: dict[str, Any], lanes: IntArray, priority: Any, steps: bool
               ) -> list[int]:
        """Queue one call's rows.

        Args:
            values: Field values ``[k, *shape]`` (``steps=False``, one step of ``k``
                lanes) or ``[t, k, *shape]`` (``steps=True``); nested dicts allowed.
            lanes: The ``k`` global lanes, ``[k]``.
            priority: None, or ``[k]`` / ``[t, k]`` float initial priorities.
            steps: Whether values carry a leading step dimension.

        Returns:
            Shards whose pending rows reached ``max_rows`` or ``max_age_s`` (ready for
            :meth:`take`).
        """
        axis = 1 if steps else 0
        t = int(_lead(values)[0]) if steps else 1
        shard_of = lanes % self.num_shards
        now = self.clock()
        for s in np.unique(shard_of).tolist():
            idx = np.flatnonzero(shard_of == s)
            local = tuple((lanes[idx] // self.num_shards).tolist())
            def pick(v: Any, i: IntArray = idx) -> Any:
                return np.take(v, i, axis=axis)

            part = tree_map(pick, values)
            if not steps:
                part = tree_map(lambda v: v[None], part)
            pr = None
            if priority is not None:
                pr = np.take(priority, idx, axis=axis)
                pr = pr[None] if not steps else pr
            g = self._groups.get(s)
            if g is not None and (g.env_ids != local or g.prioritized != (pr is not None)):
                self._close(s)
                g = None
            if g is None:
                g = self._groups[s] = _Group(local, pr is not None, now)
            g.chunks.append(part)
            if pr is not None:
                g.priorities.append(pr)
            g.rows += t * len(local)
            if g.rows >= self.max_rows:
                self._close(s)
        if any(now - g.born >= self.max_age_s for g in self._groups.values()):
            for s in list(self._groups):
                self._close(s)
        return sorted(self._closed)

    def _close(self, shard: int) -> None:
        g = self._groups.pop(shard)
        values = _concat(g.chunks)
        pr = None if not g.prioritized else np.concatenate(g.priorities, axis=0)
        self._closed.setdefault(shard, []).append(
            {"env_ids": list(g.env_ids), "values": values, "priority": pr})

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


def _lead(values: dict[str, Any]) -> tuple[int, ...]:
    v: Any = values
    while isinstance(v, dict):
        v = next(iter(v.values()))
    return tuple(np.shape(v)[:2])


def _concat(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    if len(chunks) == 1:
        return chunks[0]
    return {k: _concat([c[k] for c in chunks]) if isinstance(chunks[0][k], dict)
            else np.concatenate([c[k] for c in chunks], axis=0) for k in chunks[0]}


def lanes_of(env_ids: Any, num_lanes: int, call: str) -> IntArray:
    """``env_ids`` checked as distinct global lanes in ``[0, num_lanes)``.

    Raises:
        ShapeError: Not 1-D ints, out of range, or repeated.
    """
    arr = np.asarray(env_ids)
    if arr.ndim != 1 or len(arr) == 0 or not np.issubdtype(arr.dtype, np.integer) \
            or arr.min() < 0 or arr.max() >= num_lanes or len(np.unique(arr)) != len(arr):
        raise ShapeError(f"{call}(env_ids={describe(env_ids)}): must be distinct lane "
                         f"ids in [0, {num_lanes}) (the service's num_lanes)")
    return arr.astype(np.int64)
