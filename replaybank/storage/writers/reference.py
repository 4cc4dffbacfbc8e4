"""The reference write of a step table: ``n`` steps to any set of lanes, in step or not.

Every other writer (:mod:`~replaybank.storage.writers.lean`, the compiled writer of
:mod:`~replaybank.storage.writers.compiled`) leaves the table exactly as this module does:
same data, links, side slots, free-slot order and counters. When every lane is written
and all lanes are in step (always with one lane) :func:`write` hands over to
:func:`write_sync`, the common case; otherwise it does the same four steps with
per-lane bookkeeping: evict the live steps whose rows are overwritten (``counts`` first,
then their side slots), check whether each lane's previous newest step continues into
the first new observation, link the steps inside the chunk (a side slot where an episode
ends or the data jumps, and for each lane's newest step), then write data and links,
relink the previous newest steps and advance the counters.

Example:
    >>> import numpy as np
    >>> from replaybank.spec import Spec
    >>> from replaybank.storage.table import StepTable
    >>> spec = Spec.coerce({"obs": ((), "int64"), "terminated": ((), "bool"),
    ...                     "truncated": ((), "bool")})
    >>> t = StepTable(spec, T=4, lanes=2, obs_fields=["obs"])
    >>> no = np.zeros((2, 1), bool)
    >>> write(t, np.array([1]), {"obs": np.array([[3], [4]]), "terminated": no,
    ...       "truncated": no}, {"obs": np.array([[4], [5]])}).tolist()  # lane 1 only
    [[1], [3]]
    >>> t.written.tolist(), t.counts.tolist()
    ([0, 2], [0, 2])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from replaybank.ops.continuity import bitwise_equal_rows, chunk_breaks, same_bytes

if TYPE_CHECKING:
    from replaybank.storage.table import StepTable

__all__ = ["write", "write_sync"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
_NO_KEYS: IntArray = np.zeros((0, 0), dtype=np.int64)


def write(
    table: StepTable,
    lane_ids: IntArray,
    values: Mapping[str, npt.NDArray[Any]],
    next_obs: Mapping[str, npt.NDArray[Any]],
    done: BoolArray | None = None,
    want_keys: bool = True,
) -> IntArray:
    """Append ``n`` steps to each lane in ``lane_ids``.

    Args:
        lane_ids: Distinct lanes, ``[m]``.
        values: Every stored field, ``[n, m, *shape]``, already validated and cast.
        next_obs: Next observation of every obs field, ``[n, m, *shape]``.
        done: ``terminated | truncated``, ``[n, m]``; read from ``values`` when None.
        want_keys: Return the keys (False: an empty array, slightly faster).

    Returns:
        Item keys of the written steps, ``[n, m]``.
    """
    be, T, L = table.backend, table.T, table.lanes  # noqa: N806
    lane_ids = np.asarray(lane_ids, dtype=np.int64)
    first = next(iter(values.values()))
    n, m = int(first.shape[0]), int(first.shape[1])
    all_lanes = m == L and (L == 1 or bool(np.all(lane_ids == np.arange(L))))
    if done is None:
        done = np.asarray(values["terminated"], dtype=bool) | \
            np.asarray(values["truncated"], dtype=bool)
    if n and all_lanes and (L == 1 or (table.written.min() == table.written.max()
                                       and table.counts.min() == table.counts.max())):
        return write_sync(table, values, next_obs, done, n, want_keys)
    s0 = table.written.copy() if all_lanes else table.written[lane_ids]  # [m]
    keys = (s0[None, :] + np.arange(n)[:, None]) * L + lane_ids[None, :]  # [n, m]
    if n == 0:
        return keys
    c0 = table.counts.copy() if all_lanes else table.counts[lane_ids]  # [m]
    # steps that this same write overwrites again (n > T) are dropped
    k0 = max(0, n - T)
    nk = n - k0
    if k0:
        values = {k: v[k0:] for k, v in values.items()}
        next_obs = {k: v[k0:] for k, v in next_obs.items()}
    done_k = done[k0:]
    new_counts = np.minimum(c0 + n, T)
    # rows of the kept steps: [nk, m]; equal across lanes when the lanes are in step
    sync = bool(np.all(s0 == s0[0]))
    start = int(s0[0] + k0) % T
    if sync:
        rows1 = (start + np.arange(nk)) % T  # [nk]
        rows = np.broadcast_to(rows1[:, None], (nk, m))
    else:
        rows = (s0[None, :] + k0 + np.arange(nk)[:, None]) % T
    lanes_b = np.broadcast_to(lane_ids[None, :], (nk, m))
    if sync and all_lanes:
        index: Any = slice(start, start + nk) if start + nk <= T else rows1
    else:
        index = (rows, lanes_b)

    # 1. evict: old live steps whose rows are written now leave the ring; drop them
    #    from counts first, then free their side slots
    prev_live = (c0 > 0) & (new_counts > n)  # the previous newest step survives
    if np.any(c0 > 0):
        old_links = table.link[index].reshape(nk, m)  # [nk, m] links of rows overwritten
        evicted = ((rows - (s0 - c0)[None, :]) % T < c0[None, :]) & (old_links > 0)
        kept_old = np.maximum(c0 - np.maximum(0, c0 + n - T), 0)
        if all_lanes:
            table.counts[:] = kept_old
        else:
            table.counts[lane_ids] = kept_old
        if np.any(evicted):
            table.side.release(old_links[evicted])

    # 2. continuity of each lane's previous newest step with the first new obs
    cont_prev: tuple[IntArray, IntArray, Any] | None = None
    if k0 == 0 and np.any(prev_live):
        js = np.flatnonzero(prev_live)
        prow = (s0[js] - 1) % T
        plane = lane_ids[js]
        plink = table.link[prow, plane]
        pend = plink > 0
        js, prow, plane, plink = js[pend], prow[pend], plane[pend], plink[pend]
        if len(js):
            same = ~(np.asarray(be.to_numpy(be.gather(table.arrays["terminated"],
                                                      (prow, plane))), dtype=bool)
                     | np.asarray(be.to_numpy(be.gather(table.arrays["truncated"],
                                                        (prow, plane))), dtype=bool))
            for name in table.obs_fields:
                kept = be.to_numpy(be.gather(table.side[name], plink - 1))
                same &= bitwise_equal_rows(kept, values[name][0, js])
            # relinked after the row they will point to is written
            cont_prev = (prow[same], plane[same], plink[same])

    # 3. links inside the chunk: continue unless done or next_obs differs
    need = np.ones((nk, m), dtype=bool)  # the last step of each lane is always pending
    if nk > 1:
        cont = ~done_k[:-1]
        for name in table.obs_fields:
            a = next_obs[name][:-1].reshape((nk - 1) * m, -1)
            b = values[name][1:].reshape((nk - 1) * m, -1)
            cont &= bitwise_equal_rows(a, b).reshape(nk - 1, m)
        need[:-1] = ~cont
    links = np.zeros((nk, m), dtype=np.int32)
    if nk == 1:
        slots = table.side.alloc(m)
        links[0] = slots + 1
        for name in table.obs_fields:
            be.write(table.side[name], slots, next_obs[name][0])
    else:
        slots = table.side.alloc(int(np.count_nonzero(need)))
        links[need] = slots + 1
        for name in table.obs_fields:
            be.write(table.side[name], slots, next_obs[name][need])

    # 4. data and links, then relink the previous newest steps, then counters
    for name, v in values.items():
        be.write(table.arrays[name], index, v)
    table.link[index] = links
    if cont_prev is not None and len(cont_prev[0]):
        table.link[cont_prev[0], cont_prev[1]] = 0
        table.side.release(cont_prev[2])
    if all_lanes:
        table.written += n
        table.counts[:] = new_counts
        table.episodes += done.sum(axis=0)
    else:
        table.written[lane_ids] = s0 + n
        table.counts[lane_ids] = new_counts
        table.episodes[lane_ids] += done.sum(axis=0)
    return keys


def write_sync(table: StepTable, values: Mapping[str, Any], next_obs: Mapping[str, Any],
               done: BoolArray, n: int, want_keys: bool = True) -> IntArray:
    """:func:`write` for every lane at once when all lanes are in step (the common case).

    Same steps as the general path with Python-int bookkeeping and slice writes.
    Precondition: every lane has the same ``written`` and ``counts`` (always true with
    one lane) and ``n >= 1``.

    Args:
        values: Every stored field, ``[n, lanes, *shape]``.
        next_obs: Next observation of every obs field, ``[n, lanes, *shape]``.
        done: ``terminated | truncated``, ``[n, lanes]`` bool.
        n: Number of steps.
        want_keys: Return the keys (False: an empty array).

    Returns:
        Item keys ``[n, lanes]``.
    """
    be, T, L = table.backend, table.T, table.lanes  # noqa: N806
    w, c = int(table.written[0]), int(table.counts[0])
    keys = np.arange(w * L, (w + n) * L, dtype=np.int64).reshape(n, L) if want_keys \
        else _NO_KEYS
    k0 = max(0, n - T)
    if k0:
        values = {k: v[k0:] for k, v in values.items()}
        next_obs = {k: v[k0:] for k, v in next_obs.items()}
    nk = n - k0
    done_k = done[k0:] if k0 else done
    start = (w + k0) % T
    wraps = start + nk > T
    index: Any = (start + np.arange(nk)) % T if wraps else slice(start, start + nk)
    link = table.link
    new_c = min(c + n, T)
    kept_old = max(c - max(0, c + n - T), 0)
    side = table.side
    free = side.free

    # 1. evict: drop leaving steps from counts first, then free their side slots
    if kept_old < c:
        if table.durable or L > 1:
            table.counts[:] = kept_old
        if k0 == 0:
            j0 = T - c  # new steps j >= j0 overwrite live old steps
            old = link[(start + j0 + np.arange(n - j0)) % T] if wraps else \
                link[start + j0:start + n]
        else:
            rows = (start + np.arange(nk)) % T
            old = link[rows][((rows - (w - c)) % T) < c]
        if np.count_nonzero(old):
            old = old[old > 0]
            free.extend((old - 1).tolist())

    # 2. continuity of the previous newest steps with the first new obs
    relink: Any = None
    if kept_old:
        prow = (w - 1) % T
        if L == 1:
            p = int(link[prow, 0])
            if p and not (table.arrays["terminated"][prow, 0]
                          or table.arrays["truncated"][prow, 0]) and all(
                    same_bytes(be.to_numpy(side[nm][p - 1]), values[nm][0, 0])
                    for nm in table.obs_fields):
                relink = p
        else:
            plink = link[prow]  # [L]
            same = (plink > 0) & ~(np.asarray(table.arrays["terminated"][prow], dtype=bool)
                                   | np.asarray(table.arrays["truncated"][prow], dtype=bool))
            if same.any():
                for nm in table.obs_fields:
                    same &= bitwise_equal_rows(be.to_numpy(be.gather(
                        side[nm], np.maximum(plink - 1, 0))), values[nm][0])
                if same.any():
                    relink = np.where(same, plink, 0)

    # 3. links inside the chunk: continue unless done or next_obs differs
    need = chunk_breaks(table.obs_fields, values, next_obs, done_k) if nk > 1 else None
    if need is None:  # only the newest step of each lane is kept aside
        if L == 1:
            slot = side.take()
            for nm in table.obs_fields:
                be.write(side[nm], slot, next_obs[nm][-1, 0])
            link[index] = 0
            last = (start + nk - 1) % T
            link[last, 0] = slot + 1
        else:
            slots = side.alloc(L)
            for nm in table.obs_fields:
                be.write(side[nm], slots, next_obs[nm][-1])
            link[index] = 0
            link[(start + nk - 1) % T] = slots + 1
    else:
        links = np.zeros((nk, L), dtype=np.int32)
        slots = side.alloc(int(np.count_nonzero(need)))
        links[need] = slots + 1
        for nm in table.obs_fields:
            be.write(side[nm], slots, next_obs[nm][need])
        link[index] = links

    # 4. data (links are in place), then relink the previous newest steps, then counters
    for nm, v in values.items():
        be.write(table.arrays[nm], index, v)
    if relink is not None:
        prow = (w - 1) % T
        if L == 1:
            link[prow, 0] = 0
            free.append(relink - 1)
        else:
            link[prow][relink > 0] = 0
            free.extend((relink[relink > 0] - 1).tolist())
    table.written[:] = w + n
    table.counts[:] = new_c
    if L == 1:
        ends = int(np.count_nonzero(done))
        if ends:
            table.episodes[0] += ends
    else:
        table.episodes += done.sum(axis=0)
    return keys
