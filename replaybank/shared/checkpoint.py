"""The learner's snapshot as a table state: what ``rb.save`` writes of a shared buffer.

A ``storage="shared"`` owner's table is a snapshot (:mod:`replaybank.shared.lanes`): its
counters are the window ``[lo, hi)`` of each lane, while its data, links and side store
are the shared arrays that writers keep writing. Saved as they are, the counters and the
links would not belong together (the newest step of a window often links to the next
row, which the window leaves out), and the data could change under the file writer.
:func:`snapshot_state` copies them instead into the state of a plain table that holds
exactly the window: the counters ``written = hi``, ``counts = hi - lo``; the data copied;
each window step's next observation kept aside in a compact side store where the state
needs it (an ended episode, data out of order, and the newest step of each lane, whose
next observation may be the next row's, outside the window). The caller re-checks the
snapshot afterwards (:meth:`~replaybank.shared.lanes.LaneSnapshot.intact`) and copies
again when writers outran it, as for a sample.

Links are read twice, before and after the side slots are copied: a writer relinks a
step whose next add continued it (link ``k > 0`` becomes ``0``) after that add's commit
and frees the slot only then, so a link still ``k`` on the second read proves the slot's
copy whole, and a link that became ``0`` proves the next row committed (it is read then).

Example:
    >>> import numpy as np, replaybank as rb
    >>> buf = rb.ReplayBuffer(8, num_envs=1, storage="shared",
    ...                       spec={"obs": ((), "float32"), "action": ((), "int64")})
    >>> w = buf.writer([0]).open()
    >>> for t in range(3):
    ...     w.add(obs=np.full(1, t, np.float32), action=np.zeros(1, np.int64),
    ...           reward=np.zeros(1, np.float32), next_obs=np.full(1, t + 1, np.float32),
    ...           terminated=np.zeros(1, bool), truncated=np.zeros(1, bool))
    >>> len(buf)  # steps 0 and 1; step 2 waits for its next observation
    2
    >>> state = snapshot_state(buf.table, buf.store.reader.snapshot)
    >>> state["meta/written"].tolist(), state["meta/counts"].tolist()
    ([2], [2])
    >>> int(state["meta/link"][1, 0]), state["side/obs"].tolist()  # step 1's next obs
    (1, [2.0])
    >>> w.close(); buf.close()
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.shared.lanes import LaneSnapshot
from replaybank.shared.snapshot import range_slots
from replaybank.storage.table import StepTable

__all__ = ["snapshot_state"]


def snapshot_state(table: StepTable, snapshot: LaneSnapshot) -> dict[str, npt.NDArray[Any]]:
    """A copy of the steps in ``snapshot``'s windows as the state of a plain table
    (keys as :func:`~replaybank.storage.table_state.table_state`, without
    ``free_slots``: a loaded table rebuilds its free list).

    Args:
        table: The owner's table (local counters refreshed by ``snapshot``; shared data,
            links and side store).
        snapshot: The lanes' windows ``lo``, ``hi`` ``[lanes]``, as last refreshed.

    Returns:
        ``fields/<name>`` ``[T, lanes, ...]``, ``side/<name>`` ``[k, ...]`` (``k >= 1``
        slots: one per window step whose next observation is kept aside),
        ``meta/written``, ``meta/counts``, ``meta/episodes``, ``meta/cleared``
        ``[lanes]`` and ``meta/link`` ``[T, lanes]``: copies, valid when the snapshot is still
        :meth:`~replaybank.shared.lanes.LaneSnapshot.intact` after the call.
    """
    T, lanes = table.T, table.lanes  # noqa: N806
    lo, hi = snapshot.lo.copy(), snapshot.hi.copy()
    slots = range_slots(lo, hi, T, lanes)  # [n] window steps, lane by lane, oldest first
    newest = np.zeros(len(slots), bool)  # [n] the newest step of its lane's window
    newest[np.cumsum(hi - lo)[hi > lo] - 1] = True
    link = table.flat(table.link)  # [T * lanes], shared
    before = link[slots].astype(np.int64)  # [n] first read
    kept = {name: arr[before[before > 0] - 1].copy() for name, arr in table.side.arrays.items()}
    fields = {name: np.array(arr) for name, arr in table.arrays.items()}  # [T, lanes, ...]
    after = link[slots].astype(np.int64)  # [n] second read: a change is a relink to 0
    # [n] whose next obs the state keeps aside: a slot still linked (its copy is whole),
    # or the newest step of a window, whose next row the state does not hold
    aside = (after > 0) | newest
    still = (after > 0) & (after == before)  # (other changes: writers outran the guard)
    from_row = aside & ~still  # relinked: the next row is committed, read it now
    nxt = slots[from_row] + lanes  # [m] the next step's slot: the next row of the lane
    rows_next, lanes_next = nxt // lanes % T, nxt % lanes
    side: dict[str, npt.NDArray[Any]] = {}
    for name, arr in table.side.arrays.items():
        out = np.zeros((max(1, int(aside.sum())), *arr.shape[1:]), arr.dtype)
        out[np.flatnonzero(still[aside])] = kept[name][still[before > 0]]
        src = table.arrays.get(name)  # None: a rows table's mark (all zero)
        if src is not None:
            out[np.flatnonzero(from_row[aside])] = src[rows_next, lanes_next]
        side[name] = out
    new_link = np.zeros((T, lanes), np.int32)
    new_link.reshape(-1)[slots[aside]] = np.arange(1, int(aside.sum()) + 1)
    state: dict[str, npt.NDArray[Any]] = {f"fields/{k}": v for k, v in fields.items()}
    state.update({f"side/{k}": v for k, v in side.items()})
    state.update({"meta/written": hi, "meta/counts": hi - lo,
                  "meta/episodes": np.array(table.episodes, np.int64),
                  "meta/link": new_link,
                  # (writers never clear: where a lane began, below every window)
                  "meta/cleared": np.minimum(np.array(table.cleared, np.int64), lo)})
    return state
