"""Test hook: kill the process just before the n-th durable store of the writers.

``REPLAYBANK_KILL_AT=<n>`` (read once, at import), or :func:`arm` in a test process,
makes the writers of durable tables (memmap files) kill their own process with
``SIGKILL`` just before their n-th store to the files (lane counters, links, side slots,
each field's rows), counting over the whole process. Crash-safety tests
(``tests/test_hardening_inputs.py``) run adds and extends in a child process killed at
every store point in turn and reopen the files, checking that the buffer holds exactly
the steps of the completed writes (and at most a complete prefix of the interrupted
one). When the C accelerator is loaded it keeps the count, so Python and C writers
share it. Unset (the normal case), :data:`KILL_AT` is 0 and the writers skip the hook
with one test per write.

This is a test hook, not an API: nothing in replaybank sets it.

Example:
    >>> KILL_AT >= 0  # 0 unless the test hook is armed
    True
"""

from __future__ import annotations

import os
import signal

from replaybank.storage.writers.compiled import ACCEL

__all__ = ["KILL_AT", "arm", "store_point"]


def _read() -> int:
    try:
        return max(0, int(os.environ.get("REPLAYBANK_KILL_AT", "0") or 0))
    except ValueError:
        return 0


#: The store before which the process kills itself (0: never). Read it as
#: ``killpoint.KILL_AT`` (:func:`arm` rebinds it).
KILL_AT = _read()
_done = [0]


def arm(n: int) -> None:
    """Kill the process before the ``n``-th durable store from now (0: disarm).

    Args:
        n: Store count (``>= 0``).
    """
    global KILL_AT
    KILL_AT = max(0, int(n))
    _done[0] = 0
    if ACCEL is not None:
        ACCEL.arm(KILL_AT)


def store_point() -> None:
    """Count one durable store; kill the process (SIGKILL) before the ``KILL_AT``-th."""
    if ACCEL is not None:  # one count for the C and the Python writers
        ACCEL.store_point()
        return
    _done[0] += 1
    if _done[0] == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
