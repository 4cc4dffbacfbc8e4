"""One call at a time, for free while a single thread uses the buffer.

A buffer's public calls (add, extend, sample, priority updates, clear, state) read and
write several arrays each; two of them interleaved by two threads could return a
transition whose ``next_obs``, action or reward belong to another step. Every call
therefore runs under the buffer's :class:`CallGuard`:

* while only the thread that built the buffer calls it (the common training loop), a
  call costs two flag stores and a thread-id check (tens of nanoseconds, no lock);
* the first call from any other thread switches the guard to *shared* mode for good:
  from then on every call of every thread takes one lock (a few hundred nanoseconds).
  The switch waits for a call of the owner thread that is in flight, so no call ever
  overlaps another.

The switch is a two-flag handshake (Dekker): the owner raises ``busy`` before it checks
``shared``, a second thread raises ``shared`` (holding the lock) before it checks
``busy``. Under the GIL each of those loads and stores is atomic and ordered, so either
the owner sees ``shared`` and takes the lock, or the second thread sees ``busy`` and
waits for it to drop.

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

__all__ = ["CallGuard", "get_ident"]


class CallGuard:
    """The handshake state of one buffer (see the module docstring).

    The hot paths inline :meth:`enter` / :meth:`leave` (a method call would cost as much
    as the guard itself)::

        g = self._guard
        g.busy = True
        locked = g.shared or get_ident() != g.owner
        if locked:
            g.busy = False
            g.lock_shared()
        try:
            ...
        finally:
            if locked:
                g.lock.release()
            else:
                g.busy = False

    Attributes:
        owner: Thread id of the thread that may call without the lock (the builder).
        shared: Set for good once another thread called: every call takes ``lock``.
        busy: The owner thread is inside an unlocked call.
        lock: Held by every call in shared mode.
    """

    __slots__ = ("busy", "lock", "owner", "shared")

    def __init__(self) -> None:
        self.owner = get_ident()
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
            self.lock.release()
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

    def __reduce__(self) -> tuple[type[CallGuard], tuple[()]]:
        """A copy is a fresh guard owned by the thread that unpickles it."""
        return (CallGuard, ())
