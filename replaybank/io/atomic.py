"""Atomic file replacement by temporary name, and removal of the temporaries killed writers leave.

A file is replaced atomically by writing ``<name>.tmp-<pid>-<tag>`` beside it, fsyncing it
and renaming it over ``<name>`` (:func:`temp_path` names it and marks it *in flight* while
it is written). A writer killed before the rename (SIGKILL, OOM killer, power loss) leaves
its temporary behind at full size; nothing else would ever remove it.
:func:`remove_stale_temps`, called by the next writer of the same directory, removes the
temporaries of processes that no longer exist and this process's own ones that are not in
flight; it never touches a live process's temporary.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> d = Path(tempfile.mkdtemp())
    >>> with temp_path(d / "state.json") as tmp:
    ...     _ = tmp.write_text("{}")
    ...     os.replace(tmp, d / "state.json")
    >>> _ = (d / "dead.json.tmp-999999999-0123abcd").write_text("left by a killed save")
    >>> [p.name for p in remove_stale_temps(d)]
    ['dead.json.tmp-999999999-0123abcd']
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import uuid
from collections.abc import Collection, Iterator
from pathlib import Path

__all__ = ["pid_alive", "remove_stale_temps", "temp_path"]

#: ``<name>.tmp-<pid>`` (older memmap manifests) or ``<name>.tmp-<pid>-<hex tag>``.
_TEMP = re.compile(r"^(?P<base>.+)\.tmp-(?P<pid>[0-9]{1,10})(?:-(?P<tag>[0-9a-f]{8,32}))?$")
_IN_FLIGHT: set[str] = set()  # absolute temporaries this process is writing now
_LOCK = threading.Lock()


def pid_alive(pid: int) -> bool:
    """Whether a process with id ``pid`` exists (one of another user's counts too).

    A pid no process can have (0 or below, which ``kill`` reads as process groups, or
    beyond the platform's pid range, read from a file or segment name someone else
    made) is not alive; where the system cannot tell, the process counts as alive (what
    it owns is kept).

    Example:
        >>> pid_alive(os.getpid()), pid_alive(0), pid_alive(2**64)
        (True, False, False)
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # (OverflowError: beyond any pid)
        return False
    except OSError:  # exists but is not ours (PermissionError), or cannot tell: keep
        return True
    return True


@contextlib.contextmanager
def temp_path(target: Path) -> Iterator[Path]:
    """A fresh temporary name beside ``target``, in flight for the ``with`` block.

    The caller writes it and renames it over ``target`` inside the block; the name is
    removed when the block ends while it still exists (an error before the rename).

    Args:
        target: The file to replace.

    Yields:
        ``<target>.tmp-<pid>-<tag>``.
    """
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    key = os.path.abspath(tmp)
    with _LOCK:
        _IN_FLIGHT.add(key)
    try:
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
        with _LOCK:
            _IN_FLIGHT.discard(key)


def remove_stale_temps(directory: Path, bases: Collection[str] | None = None) -> list[Path]:
    """Remove temporaries in ``directory`` that no running writer will finish.

    A temporary (``<name>.tmp-<pid>[-<tag>]``) is stale when process ``pid`` no longer
    exists, or when it is this process and the name is not in flight here (a write that
    raised without cleaning up). Another live process's temporary is kept.

    Args:
        directory: The directory to clean.
        bases: Only temporaries of the files of these names (None: of any file).

    Returns:
        The removed paths.
    """
    removed: list[Path] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    me = os.getpid()
    for name in names:
        m = _TEMP.match(name)
        if m is None or (bases is not None and m["base"] not in bases):
            continue
        pid = int(m["pid"])
        path = Path(directory) / name
        if pid == me:
            with _LOCK:
                if os.path.abspath(path) in _IN_FLIGHT:
                    continue
        elif pid_alive(pid):
            continue
        try:
            if not path.is_file() or path.is_symlink():
                continue
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed
