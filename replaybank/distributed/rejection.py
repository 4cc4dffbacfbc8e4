"""Exact window sampling over shards: rejection on one interleaved stream of candidates.

One buffer draws window starts from its sampler's law *conditioned on usable starts*
(a start whose window holds the steps asked for, see
:mod:`replaybank.buffers.sequences`). Over shards, splitting the batch by shard mass
(size, or total priority) is not that law: a shard whose episodes are short has fewer
usable starts per unit of mass, and would get too many windows. The fraction of usable
starts of a shard is not known without scanning it, so the client samples by rejection
instead:

1. each live shard draws ``m_s`` candidate starts *independently* from its sampler's
   unconditional law (``p_i / total_s``, or uniform over its steps), reports which are
   usable, the windows of the usable ones and its mass ``total_s`` at the draw
   (:meth:`~replaybank.distributed.shard.Shard.candidates`);
2. the client draws a stream of shard labels i.i.d. from ``total_s / total``; the
   ``j``-th label ``s`` takes shard ``s``'s ``j``-th candidate, so the stream is an
   i.i.d. sequence of starts with one big buffer's law ``p_i / total``;
3. the first ``B`` usable candidates of the stream form the batch: i.i.d. from that law
   conditioned on usable, which is one buffer's sequence law over all shards' items.

The labels are independent of the candidates, so how many candidates each shard was
asked for (a guess from the previous call's masses and usable rate, padded) decides the
cost, never which windows are kept. When the stream needs a shard's ``m_s + 1``-th
candidate, the shards are asked for more in another round trip (a *top-up*; their
masses may have moved in between, the same inexactness as the top-up of
:func:`replaybank.distributed.client.ReplayClient.sample`), and the labels already
drawn are kept.

:class:`CandidateStream` holds the candidates and the label stream; it does no I/O.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> stream = CandidateStream([0, 1], 2, rng)
    >>> for s in (0, 1):
    ...     stream.add(s, {"usable": np.array([True, False, True]), "mass": (3, 3.0, 1.0),
    ...                    "fields": {"starts": np.array([10 + s, 20 + s])},
    ...                    "priorities": None})
    >>> stream.consume() is None, stream.accepted
    (True, 2)
    >>> sorted(int(k) % 2 for p in stream.parts() for k in p["fields"]["starts"])
    [0, 1]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.distributed.split import check_held
from replaybank.errors import EmptyBufferError

__all__ = ["CandidateStream", "candidate_counts"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Standard deviations and items of padding on the candidates asked of each shard.
SPARE_SD = 4.0
SPARE_ITEMS = 4
#: The lowest usable rate a guess assumes (a rarer one needs top-ups).
MIN_RATE = 1.0 / 64.0
#: Most candidates one shard is asked for in one round trip.
MAX_CANDIDATES = 1 << 16


def candidate_counts(needed: int, rate: float, shares: dict[int, float]) -> dict[int, int]:
    """Candidates to ask each shard for so that ``needed`` usable ones are likely found.

    Args:
        needed: Usable candidates still needed.
        rate: The expected fraction ``r`` of usable candidates (clamped to
            ``[MIN_RATE, 1]``).
        shares: Each shard's expected share ``q_s`` of the labels (``total_s / total``).

    Returns:
        ``{shard: count}``. The labels until ``needed`` usable ones are found number
        ``needed / r`` on average, with standard deviation ``sqrt(needed (1 - r)) / r``
        (negative binomial); of ``K`` = the mean plus 4 of those, shard ``s`` expects
        ``K q_s``, and is asked for that plus 4 binomial standard deviations plus 4 (at
        most :data:`MAX_CANDIDATES`).

    Example:
        >>> candidate_counts(100, 1.0, {0: 0.5, 1: 0.5})
        {0: 74, 1: 74}
    """
    rate = min(1.0, max(MIN_RATE, rate))
    k = (needed + SPARE_SD * math.sqrt(needed * (1.0 - rate))) / rate
    out = {}
    for s, q in shares.items():
        q = min(1.0, max(0.0, q))
        guess = k * q + SPARE_SD * math.sqrt(k * q * (1.0 - q)) + SPARE_ITEMS
        out[s] = int(min(MAX_CANDIDATES, math.ceil(guess)))
    return out


class _Pool:
    """One shard's candidates so far: usable flags, windows of the usable ones."""

    def __init__(self) -> None:
        self.usable = np.zeros(0, bool)
        self.rank = np.zeros(0, np.int64)  # row among the usable windows, per candidate
        self.fields: list[dict[str, Any]] = []
        self.priorities: list[npt.NDArray[np.float64]] = []
        self.n_usable = 0
        self.next = 0  # the next candidate the stream takes
        self.taken: list[IntArray] = []  # rows (among usable windows) taken, in order

    def add(self, reply: dict[str, Any]) -> None:
        usable = np.asarray(reply["usable"], bool)
        rank = np.cumsum(usable, dtype=np.int64) - 1 + self.n_usable
        self.usable = np.concatenate([self.usable, usable])
        self.rank = np.concatenate([self.rank, rank])
        if reply["fields"] is not None:
            self.fields.append(reply["fields"])
            if reply["priorities"] is not None:
                self.priorities.append(np.asarray(reply["priorities"], np.float64))
        self.n_usable += int(usable.sum())

    def part(self, mass: tuple[int, float, float]) -> dict[str, Any] | None:
        if not self.taken:
            return None
        rows = np.concatenate(self.taken)
        if not len(rows):
            return None
        if len(self.fields) == 1:
            fields = self.fields[0]
            prio = self.priorities[0] if self.priorities else None
        else:
            names = list(self.fields[0])
            fields = {k: np.concatenate([f[k] for f in self.fields], axis=0) for k in names}
            prio = np.concatenate(self.priorities) if self.priorities else None
        return {"fields": {k: v[rows] for k, v in fields.items()},
                "priorities": None if prio is None else prio[rows], "mass": mass}


class CandidateStream:
    """Shard candidates and the label stream that interleaves them (module docs).

    Args:
        live: The shards drawn from.
        batch_size: Usable candidates wanted ``B``.
        rng: The client's generator (draws the labels).
    """

    def __init__(self, live: list[int], batch_size: int, rng: np.random.Generator) -> None:
        self.live = list(live)
        self.batch_size = batch_size
        self._rng = rng
        self._pools = {s: _Pool() for s in self.live}
        self.masses: dict[int, tuple[int, float, float]] = {}
        self._labels = np.zeros(0, np.int64)  # drawn, not yet consumed (indices in live)
        self._p: npt.NDArray[np.float64] | None = None  # label law, from the first masses
        #: Usable candidates taken so far.
        self.accepted = 0
        #: Candidates the stream has taken (usable or not).
        self.consumed = 0

    def add(self, shard: int, reply: dict[str, Any]) -> None:
        """Append a shard's :meth:`~replaybank.distributed.shard.Shard.candidates` reply;
        its mass replaces the shard's previous one (the labels keep the first law)."""
        self._pools[shard].add(reply)
        size, total, p_min = reply["mass"]
        self.masses[shard] = (int(size), float(total), float(p_min))

    def shares(self) -> dict[int, float]:
        """Each live shard's share of the labels, ``total_s / total``.

        Raises:
            EmptyBufferError: Every live shard's mass is 0.
        """
        if self._p is None:
            check_held([self.masses[s][0] for s in self.live],
                       f"sample_sequences(batch_size={self.batch_size})")
            totals = np.array([float(self.masses[s][1]) for s in self.live])
            total = float(totals.sum())
            if not total > 0.0:
                raise EmptyBufferError(
                    f"sample_sequences(batch_size={self.batch_size}): the live shards hold "
                    f"nothing to draw (masses {totals.tolist()}); add data, or wait for "
                    "the writers")
            self._p = totals / total
        return {s: float(q) for s, q in zip(self.live, self._p, strict=True)}

    @property
    def rate(self) -> float:
        """Usable fraction of the candidates taken so far (1.0 before any)."""
        return self.accepted / self.consumed if self.consumed else 1.0

    def consume(self) -> dict[int, int] | None:
        """Take candidates in label order until ``B`` are usable (returns None) or a
        shard has none left: then returns ``{shard: count}`` of candidates to ask for
        (at least one for every shard the labels already drawn need more of)."""
        shares = self.shares()
        live = self.live
        while self.accepted < self.batch_size:
            need = self.batch_size - self.accepted
            if not len(self._labels):
                k = max(64, 2 * math.ceil(need / max(self.rate, MIN_RATE)))
                assert self._p is not None
                self._labels = self._rng.choice(len(live), size=k, p=self._p)
            labels = self._labels
            cand = np.empty(len(labels), np.int64)
            cut = len(labels)
            for i, s in enumerate(live):
                pool = self._pools[s]
                at = np.flatnonzero(labels == i)
                cand[at] = pool.next + np.arange(len(at))
                left = len(pool.usable) - pool.next
                if len(at) > left:
                    cut = min(cut, int(at[left]))  # the stream stops before this label
            lab, cand = labels[:cut], cand[:cut]
            ok = np.zeros(cut, bool)
            for i, s in enumerate(live):
                at = lab == i
                ok[at] = self._pools[s].usable[cand[at]]
            hits = np.flatnonzero(ok)
            if len(hits) >= need:
                cut = int(hits[need - 1]) + 1  # stop at the B-th usable candidate
                lab, cand, ok = lab[:cut], cand[:cut], ok[:cut]
            for i, s in enumerate(live):
                pool = self._pools[s]
                at = lab == i
                pool.next += int(at.sum())
                pool.taken.append(pool.rank[cand[at & ok]])
            self.accepted += int(ok.sum())
            self.consumed += cut
            self._labels = self._labels[cut:]
            if self.accepted < self.batch_size and len(self._labels):
                return self._top_up(shares)
        return None

    def _top_up(self, shares: dict[int, float]) -> dict[int, int]:
        """More candidates for the labels still to take: what the remaining labels need
        plus a guess for the labels after them."""
        need = self.batch_size - self.accepted
        guess = candidate_counts(need, self.rate, shares)
        out = {}
        for i, s in enumerate(self.live):
            pool = self._pools[s]
            short = int((self._labels == i).sum()) - (len(pool.usable) - pool.next)
            if short > 0:
                out[s] = min(MAX_CANDIDATES, max(short, guess[s]))
        return out

    def parts(self) -> list[dict[str, Any]]:
        """Each shard's taken windows (shard order; label order within a shard), for
        :func:`~replaybank.distributed.split.merge`."""
        out = []
        for s in sorted(self.live):
            part = self._pools[s].part(self.masses[s])
            if part is not None:
                out.append(part)
        return out
