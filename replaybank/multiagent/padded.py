"""Whole joint episodes padded to a length (QMIX/VDN with recurrent agents).

An *episode* here is a joint episode of one env (lane): it starts after a joint end
(the stored joint ``terminated | truncated``, :mod:`replaybank.multiagent.episodes`), after
a *cut* (a step after which the env was reset while its episode ran, recorded by
:meth:`~replaybank.multiagent.MultiAgentReplayBuffer.end_episodes`; such an episode is
complete: it ended, cut short as by a time limit) or at the first step the lane stored
since the buffer was built or cleared, and runs up to and including its next joint end or
cut. An agent that ends early or joins late, or a discontinuity in the data (which splits
the core's episodes), does not split a joint episode.

* :func:`find_episodes` lists the episodes of the live steps whose *first step is still
  stored* (:class:`EpisodeIndex` keeps that list for a buffer, scanning only new steps):
  the oldest episode of a lane that lost steps to the ring is left out, since it may
  have lost its start (it is left out also when the ring happened to stop exactly
  at its start: the table no longer knows). Running episodes (no joint end yet) are
  listed only when asked, with ``complete`` False.
* :func:`gather_episodes` reads the first ``max_length`` steps of chosen episodes into
  ``[B, max_length, *shape]`` arrays, zero where the episode has no step (episodes
  longer than ``max_length`` are cut: their first ``max_length`` steps are served and
  ``lengths`` still says how long they are).

Keys are the core's item keys ``seq * lanes + lane`` (:mod:`replaybank.ops.ring`).

Example:
    >>> import numpy as np
    >>> done = np.array([[False], [True], [False], [False], [True], [False]])  # [T, lanes]
    >>> eps = find_episodes(done, np.array([6]), np.array([6]), np.array([0]), True)
    >>> eps.starts.tolist(), eps.lengths.tolist(), eps.complete.tolist()
    ([0, 2, 5], [2, 3, 1], [True, True, False])
    >>> find_episodes(done, np.array([6]), np.array([6]), np.array([0]), False).starts.tolist()
    [0, 2]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.host import as_numpy
from replaybank.storage.table import StepTable

__all__ = ["EpisodeIndex", "EpisodeList", "find_episodes", "gather_episodes"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class EpisodeList:
    """The whole episodes of a table, lane by lane, oldest first.

    Attributes:
        starts: ``[E]`` int64 item keys of the episodes' first steps.
        lengths: ``[E]`` int64 steps of each episode (so far, for a running one).
        complete: ``[E]`` bool: the episode has ended (its last step is a joint end).
    """

    starts: IntArray
    lengths: IntArray
    complete: BoolArray

    def __len__(self) -> int:
        return int(self.starts.shape[0])


def find_episodes(done: BoolArray, written: IntArray, counts: IntArray, origin: IntArray,
                  include_running: bool, cuts: list[IntArray] | None = None) -> EpisodeList:
    """The episodes of the live steps whose first step is stored.

    The plain scan of every live step (:class:`EpisodeIndex` keeps the same list up to
    date by scanning only the steps added since its last call; this is its oracle).

    Args:
        done: ``[T, lanes]`` bool: the joint episode ended at the step in that slot.
        written: ``[lanes]`` steps ever written per lane (the next sequence number).
        counts: ``[lanes]`` live steps per lane (the newest ``counts`` steps).
        origin: ``[lanes]`` sequence number of the first step each lane stored since it
            was built or cleared (an episode starts there).
        include_running: List the running episode of each lane too.
        cuts: Per lane, the sequence numbers of the steps after which an episode was cut
            (None: none).

    Returns:
        The :class:`EpisodeList`, lane by lane, each lane oldest first.
    """
    T, lanes = done.shape  # noqa: N806
    ends = []
    for lane in range(lanes):
        end = int(written[lane])
        seqs = np.arange(end - int(counts[lane]), end, dtype=np.int64)  # [n] live steps
        ends.append(seqs[np.asarray(done[seqs % T, lane], bool)])  # [m] joint ends
    return _from_ends(_with_cuts(ends, cuts, written, counts), written, counts, origin,
                      include_running)


def _with_cuts(ends: list[IntArray], cuts: list[IntArray] | None, written: IntArray,
               counts: IntArray) -> list[IntArray]:
    """Per lane, the joint ends and the live cuts, sorted (sequence numbers)."""
    if cuts is None:
        return ends
    out = []
    for lane, e in enumerate(ends):
        c = cuts[lane]
        c = c[(c >= int(written[lane]) - int(counts[lane])) & (c < int(written[lane]))]
        out.append(np.union1d(e, c).astype(np.int64) if len(c) else e)
    return out


def _from_ends(ends: list[IntArray], written: IntArray, counts: IntArray, origin: IntArray,
               include_running: bool) -> EpisodeList:
    """The :class:`EpisodeList` of lanes whose live joint ends (sequence numbers, sorted)
    are ``ends[lane]``."""
    lanes = len(ends)
    starts: list[IntArray] = []
    lengths: list[IntArray] = []
    complete: list[BoolArray] = []
    for lane in range(lanes):
        end = int(written[lane])
        oldest = end - int(counts[lane])
        if oldest == end:
            continue
        e = ends[lane]  # [m] joint ends
        first = e[e < end - 1] + 1  # steps right after a joint end
        if oldest == int(origin[lane]):
            first = np.concatenate([np.array([oldest], np.int64), first])
        j = np.searchsorted(e, first)  # the first end at or after each start
        ok = j < len(e)
        if len(e):
            last = np.where(ok, e[np.minimum(j, len(e) - 1)], end - 1)
        else:
            last = np.full(len(first), end - 1, np.int64)
        if not include_running:
            first, last, ok = first[ok], last[ok], ok[ok]
        starts.append(first * lanes + lane)
        lengths.append(last - first + 1)
        complete.append(ok)
    if not starts:
        return EpisodeList(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool))
    return EpisodeList(np.concatenate(starts).astype(np.int64),
                       np.concatenate(lengths).astype(np.int64),
                       np.concatenate(complete).astype(bool))


class EpisodeIndex:
    """:func:`find_episodes` of one table, kept up to date: each call scans only the
    steps written since the previous one (and drops the joint ends the ring evicted), so
    that a call costs in the number of stored episodes, not of stored steps. A cleared or
    reloaded table (its ``epoch`` changed) or another table is scanned whole.

    Example:
        >>> import numpy as np, replaybank as rb
        >>> buf = rb.ReplayBuffer(8, seed=0)
        >>> index = EpisodeIndex()
        >>> for t in range(10):
        ...     buf.add(obs=np.zeros(1, np.float32), action=0, reward=0.0,
        ...             next_obs=np.zeros(1, np.float32), terminated=t % 3 == 2,
        ...             truncated=False)
        ...     eps = index.episodes(buf.table, np.array([0]), False)
        >>> eps.starts.tolist(), eps.lengths.tolist()
        ([3, 6], [3, 3])
    """

    def __init__(self) -> None:
        self._table: Any = None
        self._epoch = -1
        self._seen = np.zeros(0, np.int64)  # [lanes] steps scanned per lane
        self._ends: list[IntArray] = []  # per lane: the live joint ends, sorted

    def episodes(self, table: StepTable, origin: IntArray, include_running: bool,
                 cuts: list[IntArray] | None = None) -> EpisodeList:
        """The :class:`EpisodeList` of ``table`` (as :func:`find_episodes` with ``done``
        its ``terminated | truncated``, and ``cuts``)."""
        lanes, T = table.lanes, table.T  # noqa: N806
        written, counts = table.written, table.counts
        if table is not self._table or table.epoch != self._epoch \
                or len(self._seen) != lanes or bool(np.any(written < self._seen)):
            self._table, self._epoch = table, table.epoch
            self._seen = np.zeros(lanes, np.int64)
            self._ends = [np.zeros(0, np.int64) for _ in range(lanes)]
        term, trunc = table.arrays["terminated"], table.arrays["truncated"]
        for lane in range(lanes):
            end = int(written[lane])
            oldest = end - int(counts[lane])
            lo = max(int(self._seen[lane]), oldest)
            e = self._ends[lane]
            if len(e) and e[0] < oldest:
                e = e[np.searchsorted(e, oldest):]  # evicted by the ring
            if lo < end:
                seqs = np.arange(lo, end, dtype=np.int64)  # [k] steps not scanned yet
                rows = seqs % T
                d = as_numpy(term[rows, lane]) | as_numpy(trunc[rows, lane])  # [k]
                e = np.concatenate([e, seqs[np.asarray(d, bool)]])
            self._ends[lane] = e
            self._seen[lane] = end
        return _from_ends(_with_cuts(self._ends, cuts, written, counts), written, counts,
                          origin, include_running)


def _scatter(values: Any, mask: BoolArray) -> Any:
    """``values`` ``[n, *shape]`` placed at the True entries of ``mask`` ``[B, L]`` in a
    zero ``[B, L, *shape]`` array (a tensor on ``values``' device for torch storage)."""
    shape = (*mask.shape, *values.shape[1:])
    if isinstance(values, np.ndarray):
        out = np.zeros(shape, values.dtype)
        out[mask] = values
        return out
    torch = sys.modules["torch"]  # torch storage imported it
    t = values.new_zeros(shape)
    t[torch.as_tensor(mask, device=values.device)] = values
    return t


def gather_episodes(table: StepTable, starts: IntArray, lengths: IntArray,
                    max_length: int) -> dict[str, Any]:
    """The first ``max_length`` steps of episodes, padded with zeros.

    Args:
        table: The core's step table.
        starts: ``[B]`` item keys of the episodes' first steps.
        lengths: ``[B]`` their lengths (cut to ``max_length``).
        max_length: Steps ``L`` per episode in the batch.

    Returns:
        ``{name: [B, L, *shape]}`` for every stored field and ``next_<obs field>``, plus
        ``mask`` ``[B, L]`` bool (the step exists) and ``starts`` ``[B]``.
    """
    lanes = table.lanes
    k = np.arange(max_length, dtype=np.int64)  # [L]
    keys = starts[:, None] + k[None, :] * lanes  # [B, L]
    mask = k[None, :] < np.minimum(lengths, max_length)[:, None]  # [B, L]
    flat = table.gather_transitions(keys[mask])  # {name: [n, *shape]}
    out: dict[str, Any] = {name: _scatter(v, mask) for name, v in flat.items()}
    out["mask"] = mask
    out["starts"] = starts.astype(np.int64)
    return out
