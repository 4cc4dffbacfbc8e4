"""Shared-memory storage: the step table's arrays in ``multiprocessing.shared_memory``
segments, written by several collector processes and sampled by one learner.

``ReplayBuffer(capacity, num_envs, spec=..., storage="shared")`` builds the *owner*: it
creates one segment per array (fields, final-observation side store, lane counters,
links) and samples them. Collector processes never get the owner itself; they get a
picklable handle, ``buf.writer(lanes)``, whose ``open()`` attaches the same segments
(:class:`SharedBackend` with a :class:`SharedLayout`) and writes only its own lanes.
How the learner reads while writers write is in :mod:`replaybank.shared.lanes`.

Segments are named ``rbk<owner pid>_<owner's PID namespace>_<token>_<n>`` (pid and
namespace in hex; the namespace is the inode of ``/proc/self/ns/pid``, ``0`` where it
cannot be read). The owner unlinks them when it is closed, garbage collected or its
interpreter exits (in its own process: a child forked from it, which inherits those exit
hooks, never unlinks them). After a SIGKILL of the owner, Python's resource tracker (a
separate process) unlinks them, and as a last resort the next owner that starts on the
machine removes the segments whose owner is provably gone (:func:`sweep_stale`): owners of *its
own* PID namespace whose pid no longer exists. A pid means nothing outside its namespace:
containers that share ``/dev/shm`` each see their own pids, so segments of another
namespace (or of an unknown one) are never swept. Attaching processes do not register the
segments with their resource tracker (which would unlink them when the writer exits).

Every segment is created at its full size and its memory reserved at once
(``posix_fallocate`` where the platform has it), so a full ``/dev/shm`` raises
:class:`~replaybank.errors.CapacityError` at construction, never SIGBUS in a later add.
Arrays never grow: the side store is allocated whole (one slot per step, so that each
writer hands out slots from its own lanes' share without coordinating; see
:func:`replaybank.shared.lanes.claim_side_slots`). That reserves one extra
observation per step; it is the price of lock-free writers.

Example:
    >>> import numpy as np
    >>> owner = SharedBackend()
    >>> a = owner.allocate("obs", (4, 1, 3), np.dtype("float32"))
    >>> writer = SharedBackend(owner.layout())  # in a collector process
    >>> b = writer.allocate("obs", (4, 1, 3), np.dtype("float32"))
    >>> b[0, 0] = 7.0
    >>> float(a[0, 0, 0])  # the same memory
    7.0
    >>> del a, b; writer.close(); owner.close()
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
import threading
import uuid
import weakref
from dataclasses import dataclass, field
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.errors import CapacityError, CheckpointError, ConfigError
from replaybank.io.atomic import pid_alive
from replaybank.storage.backends.numpy import NumpyBackend

__all__ = ["COUNTERS", "PREFIX", "SharedBackend", "SharedLayout", "pid_alive",
           "pid_namespace", "segment_name", "segment_names", "shared_backend", "sweep_stale"]

#: Segment name prefix; a name is ``rbk<pid hex>_<pid namespace hex>_<token>_<n>``.
PREFIX = "rbk"
_NAME = re.compile(rf"^{PREFIX}([0-9a-f]+)_([0-9a-f]+)_([0-9a-f]{{8}})_(\d+)$")
#: Names written before the namespace was recorded: listed, never swept (their owner's
#: namespace is unknown, so a dead pid proves nothing).
_OLD_NAME = re.compile(rf"^{PREFIX}([0-9a-f]+)_([0-9a-f]{{8}})_(\d+)$")
_NS_FILE = "/proc/self/ns/pid"
_SHM_DIR = Path("/dev/shm")
#: Lane counters that the owner (the learner) reads as a snapshot: its table gets local
#: copies, refreshed from the shared ones before each sample.
COUNTERS = ("written", "episodes", "start")
#: ``counts`` is local in every process: a writer derives it from ``written - start``
#: for its own lanes, the owner from its snapshot (no process writes another's lanes).
_LOCAL = "counts"


@dataclass(frozen=True)
class SharedLayout:
    """Where each array of a shared buffer lives: picklable, sent to writer processes.

    Attributes:
        token: Random id of this buffer's segments.
        owner_pid: The process that created them.
        arrays: ``{array name: (segment name, shape, dtype str)}``.
    """

    token: str
    owner_pid: int
    arrays: dict[str, tuple[str, tuple[int, ...], str]] = field(default_factory=dict)


def pid_namespace() -> int | None:
    """The id of this process's PID namespace (the inode of ``/proc/self/ns/pid``), or
    None where the system does not show it (no ``/proc``, not Linux).

    Two live namespaces never share an id, and a namespace outlives every process in it,
    so an owner recorded with this id and a pid that no longer exists here is gone.

    Example:
        >>> ns = pid_namespace()
        >>> ns is None or ns > 0
        True
    """
    try:
        ino = os.stat(_NS_FILE).st_ino
    except (OSError, ValueError):
        return None
    return int(ino) if ino > 0 else None


def segment_name(pid: int, namespace: int | None, token: str, n: int) -> str:
    """The name of array ``n`` of the owner ``pid`` in PID namespace ``namespace`` (None:
    unknown, written as ``0``, never swept).

    Example:
        >>> segment_name(0x1f, 0xf0000004, "0123abcd", 2)
        'rbk1f_f0000004_0123abcd_2'
    """
    return f"{PREFIX}{pid:x}_{namespace or 0:x}_{token}_{n}"


def segment_names() -> list[str]:
    """Names of the replaybank segments on this machine (``[]`` where ``/dev/shm`` cannot
    be listed)."""
    try:
        return sorted(p.name for p in _SHM_DIR.iterdir()
                      if _NAME.match(p.name) or _OLD_NAME.match(p.name))
    except OSError:
        return []


def sweep_stale() -> list[str]:
    """Unlink the replaybank segments whose owner is provably gone (a SIGKILLed owner
    whose resource tracker died too); returns the names removed.

    Provably gone: the segment names this process's PID namespace (:func:`pid_namespace`)
    and a pid that no longer exists in it. Segments of other namespaces (containers that
    share ``/dev/shm``: their pids mean nothing here), of an unknown namespace, or named
    before namespaces were recorded are left alone; where this process cannot read its
    own namespace, nothing is swept.

    Example:
        >>> isinstance(sweep_stale(), list)
        True
    """
    ns = pid_namespace()
    if ns is None:
        return []
    removed = []
    for name in segment_names():
        m = _NAME.match(name)
        if m is None or int(m.group(2), 16) != ns or pid_alive(int(m.group(1), 16)):
            continue
        with contextlib.suppress(OSError):
            (_SHM_DIR / name).unlink()
            removed.append(name)
    return removed


_ATTACH_LOCK = threading.Lock()


def _attach_segment(name: str) -> shared_memory.SharedMemory:
    """Map an existing segment without registering it with this process's resource
    tracker (which would unlink it when a writer exits; a forked writer shares its
    owner's tracker, so registering and unregistering would drop the owner's record)."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]
    with _ATTACH_LOCK:
        register = resource_tracker.register
        resource_tracker.register = lambda *args, **kwargs: None
        try:
            return shared_memory.SharedMemory(name=name)
        finally:
            resource_tracker.register = register


def _reserve(shm: shared_memory.SharedMemory, nbytes: int, what: str) -> None:
    """Reserve the segment's memory now (tmpfs pages), so that a full ``/dev/shm`` is an
    error here and not SIGBUS on a later write."""
    fd = getattr(shm, "_fd", -1)
    if nbytes == 0 or fd < 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        raise CapacityError(
            f'storage="shared": {what} needs {nbytes:,} bytes of shared memory but '
            f"{_SHM_DIR} has too little free ({exc.strerror}); lower capacity, free "
            f"{_SHM_DIR} (docker: --shm-size) or use storage=\"memmap\"") from exc


#: How many forks this process descends through from the one that imported this module
#: (one item, counted in each child): an owner's cleanup made before a fork is, in the
#: child, a copy that must not unlink.
_FORKS = [0]


def _forked() -> None:
    _FORKS[0] += 1


if hasattr(os, "register_at_fork"):  # POSIX: os.fork and multiprocessing's "fork"
    os.register_at_fork(after_in_child=_forked)


class _Cleanup:
    """Unlinks an owner's segments once (close, garbage collection or exit), in the
    owner's process only: a child forked from it inherits the object, its ``atexit``
    and ``weakref.finalize`` hooks, but its exit or close only drops its own mappings."""

    def __init__(self) -> None:
        self.segments: list[shared_memory.SharedMemory] = []
        self.forks = _FORKS[0]  # the owner's process (made in it)

    def __call__(self) -> None:
        segments, self.segments = self.segments, []
        owner = _FORKS[0] == self.forks
        for shm in segments:
            if owner:
                with contextlib.suppress(FileNotFoundError, OSError):
                    shm.unlink()
            with contextlib.suppress(BufferError, OSError):
                shm.close()  # arrays still viewing it keep the mapping until collected


class SharedBackend:
    """Arrays in shared-memory segments: created by the owner, attached by writers.

    Args:
        layout: None for the owner (creates segments); the owner's :meth:`layout` to
            attach them in another process (a writer).

    The owner's lane counters (:data:`COUNTERS`) are local arrays: its table is a
    snapshot refreshed from the shared counters (:meth:`shared`). ``counts`` is local
    everywhere (a writer derives it from ``written - start``). A writer's table
    uses the shared arrays directly and keeps the crash-safe write order
    (``durable``): ``start`` advances before evicted rows are rewritten and ``written``
    after the data, which is what lets the owner read beside it.
    """

    name = "shared"
    host_numpy = True
    #: Arrays are allocated whole and never grow (other processes map them).
    fixed_size = True

    def __init__(self, layout: SharedLayout | None = None) -> None:
        self.owner = layout is None
        #: Writers keep the crash-safe write order of durable storage.
        self.durable = not self.owner
        self._segments: dict[str, shared_memory.SharedMemory] = {}
        self._shared: dict[str, npt.NDArray[Any]] = {}
        if layout is None:
            sweep_stale()
            self._layout = SharedLayout(uuid.uuid4().hex[:8], os.getpid())
            self._namespace = pid_namespace()
            self._cleanup = _Cleanup()
            self._finalizer = weakref.finalize(self, self._cleanup)
            atexit.register(self._finalizer)
        else:
            if not isinstance(layout, SharedLayout):
                raise ConfigError(f"SharedBackend(layout={layout!r}): pass the owner's "
                                  "backend.layout() (or use buf.writer(lanes).open())")
            self._layout = layout

    # ------------------------------------------------------------------ segments
    def layout(self) -> SharedLayout:
        """What a writer needs to attach these arrays (see :class:`SharedLayout`)."""
        return SharedLayout(self._layout.token, self._layout.owner_pid,
                            dict(self._layout.arrays))

    def _create(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]
                ) -> npt.NDArray[Any]:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        seg = segment_name(self._layout.owner_pid, self._namespace, self._layout.token,
                           len(self._layout.arrays))
        shm = shared_memory.SharedMemory(name=seg, create=True, size=max(nbytes, 1))
        self._cleanup.segments.append(shm)
        _reserve(shm, nbytes, f"array {name!r} {shape} {dtype}")
        self._layout.arrays[name] = (seg, tuple(shape), dtype.str)
        self._segments[name] = shm
        arr: npt.NDArray[Any] = np.ndarray(shape, dtype=dtype, buffer=shm.buf)
        arr[...] = 0
        return arr

    def _attach(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]
                ) -> npt.NDArray[Any]:
        entry = self._layout.arrays.get(name)
        if entry is None:
            raise CheckpointError(f"shared buffer {self._layout.token}: no array {name!r} "
                                  "(the writer's config does not match the owner's)")
        seg, have_shape, have_dtype = entry
        if tuple(have_shape) != tuple(shape) or np.dtype(have_dtype) != dtype:
            raise CheckpointError(
                f"shared buffer {self._layout.token}: array {name!r} is {tuple(have_shape)} "
                f"{np.dtype(have_dtype)}, the writer expects {tuple(shape)} {dtype}")
        try:
            shm = _attach_segment(seg)
        except FileNotFoundError as exc:
            raise CheckpointError(
                f"shared buffer {self._layout.token}: segment {seg} is gone (its owner, pid "
                f"{self._layout.owner_pid}, exited or closed it)") from exc
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if shm.size < nbytes:
            shm.close()
            raise CheckpointError(f"shared buffer {self._layout.token}: segment {seg} holds "
                                  f"{shm.size} bytes, array {name!r} needs {nbytes}")
        self._segments[name] = shm
        arr: npt.NDArray[Any] = np.ndarray(shape, dtype=dtype, buffer=shm.buf)
        return arr

    def _array(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]
               ) -> npt.NDArray[Any]:
        dtype = np.dtype(dtype)
        if name in self._shared:
            arr = self._shared[name]
            if arr.shape != tuple(shape) or arr.dtype != dtype:
                raise ConfigError(f"shared array {name!r} exists as {arr.shape} {arr.dtype}")
            return arr
        arr = self._create(name, shape, dtype) if self.owner else \
            self._attach(name, shape, dtype)
        self._shared[name] = arr
        return arr

    # ------------------------------------------------------------------ ArrayBackend
    def allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return self._array(name, shape, dtype)

    def allocate_meta(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        if name == _LOCAL:
            return np.zeros(shape, dtype=dtype)
        arr = self._array(name, shape, dtype)
        if self.owner and name in COUNTERS:
            return np.zeros(shape, dtype=dtype)  # the owner's snapshot (shared/lanes.py)
        return arr

    def shared(self, name: str, shape: tuple[int, ...], dtype: Any) -> npt.NDArray[Any]:
        """The shared array ``name`` (created by the owner on first call)."""
        return self._array(name, tuple(shape), np.dtype(dtype))

    def resize(self, name: str, array: Any, length: int) -> Any:
        if len(array) == length:
            return array
        raise CapacityError(
            f'storage="shared": array {name!r} cannot grow from {len(array)} to {length} '
            "rows (other processes map it); shared buffers are allocated whole")

    # the arrays are plain numpy arrays in this process: numpy storage's reads and writes
    write = NumpyBackend.write
    gather = NumpyBackend.gather
    index = NumpyBackend.index
    to_numpy = NumpyBackend.to_numpy
    flush = NumpyBackend.flush
    requires_memory = NumpyBackend.requires_memory

    # ------------------------------------------------------------------ lifetime
    @property
    def token(self) -> str:
        """Random id of this buffer's segments."""
        return self._layout.token

    def close(self) -> None:
        """Owner: unlink every segment (mapped arrays stay readable until collected;
        in a child forked from the owner, only drop the child's mappings); writer: drop
        its mappings. Idempotent."""
        if self.owner:
            self._finalizer()
            atexit.unregister(self._finalizer)
        else:
            for shm in self._segments.values():
                with contextlib.suppress(BufferError, OSError):
                    shm.close()
        self._segments = {}

    def __getstate__(self) -> dict[str, Any]:
        raise ConfigError(
            'a storage="shared" buffer cannot be pickled: send buf.writer(lanes) (a handle) '
            "to a collector process and call its open() there")


def shared_backend(path: Any, device: Any) -> SharedBackend:
    """The owner's backend of ``storage="shared"`` (registered by the package).

    Raises:
        ConfigError: A ``path`` or a ``device`` (its arrays live in shared memory).

    Example:
        >>> be = shared_backend(None, None)
        >>> be.owner, be.name
        (True, 'shared')
        >>> be.close()
    """
    if path is not None or device is not None:
        raise ConfigError(f'storage="shared" takes neither path={path!r} nor '
                          f"device={device!r}: its arrays live in shared memory")
    return SharedBackend()
