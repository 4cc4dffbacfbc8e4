"""One call at a time, for free while a single thread uses the buffer.

A buffer's public calls (add, extend, sample, priority updates, clear, state) read and
write several arrays each; two of them interleaved by two threads could return a
transition whose ``next_obs``, action or reward belong to another step. Every call
therefore runs under the buffer's :class:`CallGuard`:

* while only the thread that built the buffer calls it (the common training loop), a
  call raises and lowers a ``busy`` flag and checks the thread id: no lock. The compiled
  writer (``replaybank/_lane.c``) does this itself in C, so the hot ``add``/``extend``
  pay nothing in Python;
* the first call from any other thread switches the guard to *shared* mode for good:
  from then on every call of every thread takes one lock (a few hundred nanoseconds).
  The switch waits for a call of the owner thread that is in flight, so no call ever
  overlaps another.

The switch is a two-flag handshake (Dekker): the owner raises ``busy`` before it checks
``shared``, a second thread raises ``shared`` (holding the lock) before it checks
``busy``. Under the GIL each of those loads and stores is atomic and ordered, so either
the owner sees ``shared`` and takes the lock, or the second thread sees ``busy`` and
waits for it to drop. (The compiled writer checks and raises ``busy`` in one step: it
holds the GIL throughout.) In shared mode ``holder`` names the thread holding the lock,
which the compiled writer lets through.

Calls of a guarded buffer must not call each other's guarded entry points (the lock
is not re-entrant); buffers call their internal, unguarded methods instead.

Example:
    >>> g = CallGuard()
    >>> locked = g.enter()  # the owner thread: no lock taken
    >>> locked, g.shared
    (False, False)
    >>> g.leave(locked)
"""

from __future__ import annotations

import threading
import time
from _thread import get_ident
from typing import TYPE_CHECKING

from replaybank.storage.writers.compiled import ACCEL

__all__ = ["CallGuard"]


class _GuardFlags:
    """The guard's flags in Python (the compiled writer's ``GuardState`` when built)."""

    __slots__ = ("busy", "holder", "owner", "shared")

    def __init__(self) -> None:
        self.owner = 0
        self.holder = 0
        self.shared = False
        self.busy = False


if TYPE_CHECKING:
    _Flags = _GuardFlags
else:  # the compiled writer reads these flags without a Python call
    _Flags = getattr(ACCEL, "GuardState", _GuardFlags)


class CallGuard(_Flags):
    """The handshake state of one buffer (see the module docstring).

    A call runs between :meth:`enter` and :meth:`leave`::

        locked = guard.enter()
        try:
            ...
        finally:
            guard.leave(locked)

    Attributes:
        owner: Thread id of the thread that may call without the lock (the builder).
        shared: Set for good once another thread called: every call takes ``lock``.
        busy: The owner thread is inside an unlocked call.
        holder: Thread id holding ``lock`` in shared mode (0: none).
        lock: Held by every call in shared mode.
    """

    __slots__ = ("lock",)

    def __init__(self) -> None:
        self.owner = get_ident()
        self.holder = 0
        self.shared = False
        self.busy = False
        self.lock = threading.Lock()

    def enter(self) -> bool:
        """Start a call; True when it holds the lock (pass the result to :meth:`leave`)."""
        self.busy = True
        if self.shared or get_ident() != self.owner:
            self.busy = False
            self.lock_shared()
            return True
        return False

    def leave(self, locked: bool) -> None:
        """End a call started by :meth:`enter`."""
        if locked:
            self.unlock()
        else:
            self.busy = False

    def lock_shared(self) -> None:
        """Take the lock; on the first call from a second thread, switch to shared mode
        and wait until the owner's unlocked call in flight (if any) has returned."""
        self.lock.acquire()
        if not self.shared:
            self.shared = True
            while self.busy:  # the owner is mid-call: it releases the GIL regularly
                time.sleep(0)
        self.holder = get_ident()

    def unlock(self) -> None:
        """Release the lock taken by :meth:`lock_shared`."""
        self.holder = 0
        self.lock.release()

    def __reduce__(self) -> tuple[type[CallGuard], tuple[()]]:
        """A copy is a fresh guard owned by the thread that unpickles it."""
        return (CallGuard, ())
