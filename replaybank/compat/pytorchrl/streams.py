"""The running episodes of a HER learner, kept apart per *stream*: a run of inserted
slices that continue each other.

A pytorchrl gradient worker fed by several collection workers appends their exports
interleaved (``insert_data_slice`` with slices of A, B, A, B, ...), so the rows written
after collector A's export are collector B's, and A's running episodes go on in A's
next export. Each collector's exports continue each other: a recurrent collector
re-sends its newest ``overlap_length`` rows at the head of its next export (the rule by
which a slice continues the stored rows, :mod:`~replaybank.compat.pytorchrl.segments`),
and a feed-forward collector's next export starts where the previous one stopped (its
first ``Observation`` is the previous export's last ``NextObservation``). A stream is
such a run of slices; each keeps the running episode of every env, so hindsight
relabelling only ever sees the steps of one stream's episode.

A stream is named by where its newest row is stored: ``end``, the sequence number
after that row in the storage's real lanes (every env's lane is written together). The
storage decides which stream a slice continues (it holds the rows to compare); this
module keeps the streams, newest first, and forgets a stream

* once its newest row has left the storage (no slice can be matched to it any more;
  pytorchrl's storage loses an episode's rows there too),
* once no env's episode is running in it, unless its newest rows may still be re-sent
  (a recurrent collector's: they must be recognised, not relabelled again); continuing
  it or starting a new stream is otherwise the same,
* when more than :data:`MAX_STREAMS` are kept: the least recently written goes (a
  collector that stopped, or exports after gaps that nothing continues).

Example:
    >>> streams = Streams(keep_finished=False)
    >>> a = Stream.new(envs=1)
    >>> a.episodes[0].append({"obs": 0})
    >>> streams.wrote(a, oldest=0, end=4)   # collector A: rows 0-3, an episode running
    >>> b = Stream.new(envs=1)
    >>> b.episodes[0].append({"obs": 9})
    >>> streams.wrote(b, oldest=0, end=8)   # collector B: rows 4-7
    >>> [s.end for s in streams.newest_first()], streams.at(8) is b, streams.at(4)
    ([8, 4], True, None)
    >>> streams.wrote(a, oldest=4, end=12)  # A again: rows 8-11 (rows 0-3 overwritten)
    >>> [s.end for s in streams.newest_first()]
    [12, 8]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_STREAMS", "Stream", "Streams"]

#: Streams followed at once (the most recently written): collectors feeding one learner.
MAX_STREAMS = 64


@dataclass(eq=False)
class Stream:
    """One stream of continuing slices.

    Attributes:
        end: Sequence number after its newest stored row (-1 before its first write).
        episodes: Per env, the steps of its running episode so far (each a dict of the
            step's values ``[1, *shape]``).
        own: Its newest rows are the storage's own steps (``insert_transition``, or the
            overlap ``reset`` puts back), not a slice's: the next slice continues them,
            as those rows added one by one would.

    Example:
        >>> s = Stream.new(envs=2)
        >>> s.episodes[1].append({"obs": 0})
        >>> s.running()
        [1]
    """

    end: int
    episodes: list[list[dict[str, Any]]]
    own: bool = False

    @classmethod
    def new(cls, envs: int) -> Stream:
        """A stream nothing was written to yet: no episode running in its ``envs`` envs."""
        return cls(-1, [[] for _ in range(envs)])

    def running(self) -> list[int]:
        """The envs whose episode is running (holds steps)."""
        return [e for e, steps in enumerate(self.episodes) if steps]


class Streams:
    """The streams followed, newest (most recently written) first.

    Args:
        keep_finished: Keep a stream in which no episode is running (a recurrent
            collector re-sends its newest rows at the head of its next export).

    Example:
        >>> s = Stream.new(envs=1)
        >>> streams = Streams(keep_finished=False)
        >>> streams.wrote(s, oldest=0, end=3)   # no episode running: not kept
        >>> streams.newest_first()
        []
        >>> streams = Streams(keep_finished=True)
        >>> streams.wrote(s, oldest=0, end=3)
        >>> streams.at(3) is s
        True
    """

    def __init__(self, keep_finished: bool) -> None:
        self._keep_finished = keep_finished
        self._open: list[Stream] = []  # oldest first

    def clear(self) -> None:
        """Forget every stream (the storage dropped its rows)."""
        self._open = []

    def newest_first(self) -> list[Stream]:
        """The open streams, the most recently written first."""
        return self._open[::-1]

    def at(self, end: int) -> Stream | None:
        """The open stream whose newest row is the one before ``end`` (the write head:
        the stream that rows written next continue), or None."""
        if self._open and self._open[-1].end == end:
            return self._open[-1]
        return None

    def wrote(self, stream: Stream, oldest: int, end: int) -> None:
        """``stream`` (its episodes brought up to date) now ends at ``end``, the newest
        stream; the streams to forget (module docstring) are forgotten.

        Args:
            stream: The stream just written (a new one or one of the open streams).
            oldest: Sequence number of the oldest row stored.
            end: Sequence number after the stream's newest row.
        """
        stream.end = end
        kept = [
            s
            for s in self._open
            if s is not stream and s.end > oldest and (self._keep_finished or s.running())
        ]
        if self._keep_finished or stream.running():
            kept.append(stream)
        self._open = kept[-MAX_STREAMS:]
