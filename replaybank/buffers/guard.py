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
waits for it to drop. Only the owner thread ever writes ``busy``: a second thread that
raised and lowered it too (as this guard once did, before it looked at the thread id)
lowered the flag of the owner's call in flight and went in beside it. (The compiled
writer checks and raises ``busy`` in one step: it holds the GIL throughout.) In shared
mode ``holder`` names the thread holding the lock, which the compiled writer lets
through.

A call made inside another call of the same thread (a public call inside
``with buf.exclusive():``, ``rb.save``'s ``state_dict()``) is *nested*: it neither
takes the lock (its thread holds it, or is the owner mid-call) nor lowers ``busy`` when
it returns, so the outer section stays one section. Buffers still call their internal,
unguarded methods from inside their own calls: nesting is for sections a caller opens.

Example:
    >>> g = CallGuard()
    >>> state = g.enter()  # the owner thread: no lock taken
    >>> state == UNLOCKED, g.shared, g.enter() == NESTED
    (True, False, True)
    >>> g.leave(NESTED)  # the inner call: the outer one is still under way
    >>> g.busy
    True
    >>> g.leave(state)
"""

from __future__ import annotations

import threading
import time
from _thread import get_ident
from typing import TYPE_CHECKING

from replaybank.storage.writers.compiled import ACCEL

__all__ = ["LOCKED", "NESTED", "UNLOCKED", "CallGuard"]

#: What :meth:`CallGuard.enter` returns (pass it to :meth:`CallGuard.leave`): the owner's
#: call without the lock (``busy`` raised), a call holding the lock, a call nested in a
#: call of the same thread (nothing to undo).
UNLOCKED, LOCKED, NESTED = 0, 1, 2


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

        state = guard.enter()
        try:
            ...
        finally:
            guard.leave(state)

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

    def enter(self) -> int:
        """Start a call: :data:`UNLOCKED`, :data:`LOCKED` or :data:`NESTED` (pass the
        result to :meth:`leave`)."""
        me = get_ident()
        if me == self.owner:
            if self.busy:  # inside the owner's own unlocked call (only it raises busy)
                return NESTED
            self.busy = True  # raised before shared is read (the handshake)
            if not self.shared:
                return UNLOCKED
            self.busy = False
        if self.holder == me:  # inside this thread's own locked call
            return NESTED
        self.lock_shared()
        return LOCKED

    def leave(self, state: int) -> None:
        """End a call started by :meth:`enter` (``state``: what it returned)."""
        if state == LOCKED:
            self.unlock()
        elif state == UNLOCKED:
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
