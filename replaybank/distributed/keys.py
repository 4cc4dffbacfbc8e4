"""Global item keys of a sharded replay service: ``(shard, local key)`` in one int64.

A shard's buffer names each stored step by its item key ``seq * lanes + lane``
(:mod:`replaybank.ops.ring`): the lane-local sequence number ``seq`` never repeats, so a
key carries the step's slot *and* its generation (which write of that slot it is), and a
key whose step was overwritten is detectably stale. The service keeps that property
across shards by packing the shard index into the low digits:

``global = local * num_shards + shard``, so ``shard = global % num_shards`` and
``local = global // num_shards``.

Keys stay non-negative and unique over the service's lifetime; a late priority update
for an overwritten step is dropped by the shard that held it.

Example:
    >>> import numpy as np
    >>> g = to_global(np.array([0, 5, 7]), shard=2, num_shards=4)
    >>> g.tolist()
    [2, 22, 30]
    >>> shard, local = to_local(g, num_shards=4)
    >>> shard.tolist(), local.tolist()
    ([2, 2, 2], [0, 5, 7])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import ShapeError, describe
from replaybank.host import as_numpy

__all__ = ["group_by_shard", "group_rows_by_shard", "to_global", "to_local"]

IntArray = npt.NDArray[np.int64]


def to_global(local: IntArray, shard: int, num_shards: int) -> IntArray:
    """Global keys ``[B]`` of shard ``shard``'s local item keys ``[B]``."""
    return np.asarray(local, dtype=np.int64) * num_shards + shard


def to_local(keys: IntArray, num_shards: int) -> tuple[IntArray, IntArray]:
    """Split global keys ``[B]`` into (shard ``[B]``, local item key ``[B]``)."""
    keys = np.asarray(keys, dtype=np.int64)
    return keys % num_shards, keys // num_shards


def group_by_shard(keys: IntArray, values: npt.NDArray[np.float64], num_shards: int
                   ) -> dict[int, tuple[IntArray, npt.NDArray[np.float64]]]:
    """``{shard: (local keys, values)}`` of global ``keys`` ``[B]`` and ``values`` ``[B]``.

    The caller checks the arguments first, with one buffer's rules
    (:func:`~replaybank.buffers.priorities.checked_updates`): ``keys`` are 1-D
    non-negative int64 and ``values`` one float64 per key. Within each shard the keys
    keep their order.

    Example:
        >>> out = group_by_shard(np.array([0, 3, 5]), np.array([1.0, 2.0, 3.0]), 2)
        >>> {s: (k.tolist(), v.tolist()) for s, (k, v) in out.items()}
        {0: ([0], [1.0]), 1: ([1, 2], [2.0, 3.0])}
    """
    shard, local = to_local(keys, num_shards)
    out: dict[int, tuple[IntArray, npt.NDArray[np.float64]]] = {}
    for s in np.unique(shard).tolist():
        m = shard == s
        out[int(s)] = (local[m], np.asarray(values, np.float64)[m])
    return out


def group_rows_by_shard(keys: IntArray, rows: Sequence[npt.NDArray[Any]], num_shards: int
                        ) -> dict[int, tuple[IntArray, list[npt.NDArray[Any]]]]:
    """``{shard: (local keys, [row block, ...])}`` of global ``keys`` ``[B]`` and arrays
    ``rows`` of shape ``[B, ...]`` each (row ``i`` goes with ``keys[i]``).

    The row-wise counterpart of :func:`group_by_shard` (sequence priorities send a
    ``[B, L]`` block of TD errors and mask per shard). The caller validates: ``keys``
    are 1-D non-negative integers and every array in ``rows`` has ``len(keys)`` rows;
    within each shard the rows keep their order.

    Raises:
        ShapeError: An array of ``rows`` has another number of rows than ``keys``, or is
            a ragged nest (rows of different lengths; the check of
            :func:`~replaybank.host.as_numpy`, naming ``rows[i]``).

    Example:
        >>> import numpy as np
        >>> td = np.arange(6.0).reshape(3, 2)
        >>> out = group_rows_by_shard(np.array([0, 3, 5]), [td], 2)
        >>> {s: (k.tolist(), r[0].tolist()) for s, (k, r) in out.items()}
        {0: ([0], [[0.0, 1.0]]), 1: ([1, 2], [[2.0, 3.0], [4.0, 5.0]])}
    """
    k = np.asarray(keys, dtype=np.int64)
    blocks = [
        as_numpy(
            r,
            f"group_rows_by_shard: rows[{i}]",
            expected=f"[B={len(k)}, ...] (one row per key, all of one shape)",
            fix="pass arrays with one row per key",
        )
        for i, r in enumerate(rows)
    ]
    for r in blocks:
        if r.shape[:1] != k.shape:
            raise ShapeError(f"group_rows_by_shard: {describe(r)} has not one row per key "
                             f"({len(k)} keys)")
    shard, local = to_local(k, num_shards)
    out: dict[int, tuple[IntArray, list[npt.NDArray[Any]]]] = {}
    for s in np.unique(shard).tolist():
        m = shard == s
        out[int(s)] = (local[m], [r[m] for r in blocks])
    return out
