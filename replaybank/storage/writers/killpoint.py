"""Test hook: kill the process just before the n-th durable store of the writers.

``REPLAYBANK_KILL_AT=<n>`` (read once, at import), or :func:`arm` in a test process,
makes the writers of durable tables (memmap files, shared-memory writers) kill their own
process with ``SIGKILL`` just before their n-th store to the shared data (lane counters,
links, side slots, each field's rows, and the stores of a durable table's ``clear()``),
counting over the whole process. Crash-safety
tests (``tests/test_hardening_inputs.py``) run adds and extends in a child process
killed at every store point in turn and reopen the files, checking that the buffer holds
exactly the steps of the completed writes (and at most a complete prefix of the
interrupted one).

The compiled writer counts stores only in its kill-point build,
``replaybank._lane_killpoints`` (the same source compiled with ``REPLAYBANK_KILLPOINTS``),
which :mod:`~replaybank.storage.writers.compiled` loads instead of the production
``replaybank._lane`` when ``REPLAYBANK_KILLPOINTS=1`` or ``REPLAYBANK_KILL_AT`` is set at
import: the production build pays nothing for the hook. With that build loaded it keeps
the count, so the Python and C writers share it. Unset (the normal case), :data:`KILL_AT`
is 0 and the Python writer skips the hook with one test per write.

This is a test hook, not an API: nothing in replaybank sets it.

Example:
    >>> KILL_AT >= 0  # 0 unless the test hook is armed
    True
"""

from __future__ import annotations

import os
import signal

from replaybank.errors import ConfigError
from replaybank.storage import side_store, table
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
#: The compiled writer counts stores (its kill-point build is loaded).
_C_COUNTS = ACCEL is not None and bool(ACCEL.KILLPOINTS)


def arm(n: int) -> None:
    """Kill the process before the ``n``-th durable store from now (0: disarm).

    Args:
        n: Store count (``>= 0``).

    Raises:
        ConfigError: The production compiled writer is loaded (it does not count its
            stores): set ``REPLAYBANK_KILLPOINTS=1`` before importing replaybank.
    """
    global KILL_AT
    if ACCEL is not None and not _C_COUNTS and n:
        raise ConfigError("killpoint.arm(): the production compiled writer counts no stores; "
                          "set REPLAYBANK_KILLPOINTS=1 before importing replaybank (it loads "
                          "the kill-point build replaybank._lane_killpoints)")
    KILL_AT = max(0, int(n))
    _done[0] = 0
    side_store.GROW_POINT[0] = table.CLEAR_POINT[0] = store_point if KILL_AT else None
    if _C_COUNTS:
        ACCEL.arm(KILL_AT)


def store_point() -> None:
    """Count one durable store; kill the process (SIGKILL) before the ``KILL_AT``-th."""
    if _C_COUNTS:  # one count for the C and the Python writers
        ACCEL.store_point()
        return
    _done[0] += 1
    if _done[0] == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)


# armed from the environment at import: the side store's growth and clear() count too
side_store.GROW_POINT[0] = table.CLEAR_POINT[0] = store_point if KILL_AT else None
