"""Disk-backed storage: every array in a ``numpy.memmap`` file, so capacity can exceed RAM.

``ReplayBuffer(capacity=..., storage="memmap", path="run/replay")`` keeps each field,
the side store of final observations and the bookkeeping (lane counters, links) in
files under ``path``, plus a small JSON manifest (``replaybank_memmap.json``: array
names, dtypes and row shapes, and the config of the owning buffer). Writes go straight
to the page cache through the mappings; the step table's write order (a ``start``
counter per lane advances first for evicted steps, then data and links are written, then
``written`` advances; a reopened table takes ``counts = written - start``: see
:class:`~replaybank.storage.table.StepTable`) means the files describe a consistent
buffer at every instant, so a process killed (even with SIGKILL) between or during adds
loses nothing that an earlier add completed. Call
:meth:`MemmapBackend.flush` to survive an OS crash too.

Files are safe to share and to damage: their disk blocks are reserved when they are
created or grown (a full disk raises :class:`~replaybank.errors.CapacityError` then, not
SIGBUS in a later add: at construction for the fields, or in the add that grows the side
store, which starts small and doubles up to one observation per step; that add is then
left undone), one process at a time writes a directory (an ``flock`` on
:data:`LOCK` naming its pid, held until :meth:`MemmapBackend.close` or garbage
collection; ``rb.open(path, mode="r")`` reads beside the writer: a snapshot of the steps
complete at the open, :func:`~replaybank.storage.table_state.snapshot_table`), file
names come from array names (never from the manifest, so no file outside the directory
is opened or removed), and a damaged manifest, a truncated file or lane counters that no write could
have left (a hand-edited ``start``) give :class:`~replaybank.errors.CheckpointError` on
reopen, before anything is written. A buffer whose first allocation fails (a capacity
beyond the free disk space) removes the files it created and its manifest and releases
the lock, so the path is free for a new buffer.

``rb.open(path)`` (:func:`replaybank.persist.open`) reopens the files in a new process and
continues where the old one stopped, rebuilding the buffer from the owner record the buffer
keeps in the manifest (the backend never reads it). Generator and sampler state (e.g. PER
priorities) live in memory: ``buf.flush()`` saves them next to the files
(:mod:`replaybank.persist`), and a reopened buffer restores them when the files still
hold exactly the steps they held at that flush, so it draws the identical next sample.
Without such a flush (or with steps added after it) a reopened buffer starts a fresh
generator (from the config seed) and gives every live step the sampler's default state
(e.g. the running max priority).

Example:
    >>> import tempfile, numpy as np
    >>> import replaybank as rb
    >>> d = tempfile.mkdtemp()
    >>> buf = rb.ReplayBuffer(capacity=64, storage="memmap", path=d, seed=0)
    >>> for t in range(5):
    ...     buf.add(obs=np.full(2, t, np.float32), action=t, reward=1.0,
    ...             next_obs=np.full(2, t + 1, np.float32), terminated=False, truncated=False)
    >>> buf.backend.close()  # or let the process end: the next writer may open it
    >>> again = rb.open(d)
    >>> len(again), again.sample(2).obs.shape
    (5, (2, 2))
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import shutil
import stat
import uuid
import weakref
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import numpy.typing as npt

from replaybank.errors import (
    CapacityError,
    CheckpointError,
    ConfigError,
    ReplayBankError,
    SpecError,
    describe,
    os_error_fix,
)
from replaybank.io.atomic import remove_stale_temps, temp_path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK", "MANIFEST", "MODES", "RESUME_PREFIX", "MemmapBackend"]

MANIFEST = "replaybank_memmap.json"
#: The writer's lock file (``flock``; it holds the writing process's pid).
LOCK = "replaybank_memmap.lock"
#: ``"r+"``: read and write (one writer at a time, locked); ``"r"``: read only, no lock.
MODES = ("r+", "r")
#: File name prefix of the generator/sampler state that ``flush()`` saves
#: (:mod:`replaybank.io.resume`); removed with the buffer's files.
RESUME_PREFIX = "replaybank_resume_"
_FORMAT = "replaybank.memmap"
_VERSION = 1
_MAX_NDIM = 32
_MAX_BYTES = 1 << 60  # no file of a sane manifest is larger (1 EiB)
_FULL = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}  # the disk (or a limit) is full
_NO_FALLOCATE = {errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS}


#: The writable backends of this process (the fork hook hands each child a refusing copy).
_WRITERS: weakref.WeakSet[MemmapBackend] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child inherits every writable backend of its parent: none of them is
    the child's to write (see :meth:`MemmapBackend._inherited`)."""
    for backend in list(_WRITERS):
        backend._inherited()


if hasattr(os, "register_at_fork"):  # POSIX: os.fork and multiprocessing's "fork"
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _write_json_atomic(path: Path, data: Any) -> None:
    with temp_path(path) as tmp:
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)


def _holder(fd: int) -> int | None:
    """The pid a lock file names (None while it is being written)."""
    try:
        return int(os.pread(fd, 32, 0).decode("ascii").strip())
    except (OSError, ValueError):
        return None


class _NoSpaceError(Exception):
    """The disk (or a file size limit) has no room for ``need`` bytes (``free``: the
    free bytes when known)."""

    def __init__(self, need: int, free: int | None, cause: OSError | None = None) -> None:
        super().__init__(need, free)
        self.need, self.free, self.cause = need, free, cause


def _gib(n: int) -> str:
    return f"{n:,} bytes ({n / 2**30:.2f} GiB)"


def _nbytes(shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    """Bytes of an array (Python ints: no int64 overflow)."""
    n = dtype.itemsize
    for d in shape:
        n *= int(d)
    return n


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _parse_dtype(descr: Any) -> np.dtype[Any]:
    """The dtype of a manifest's ``dtype`` entry (``dtype_to_descr`` output)."""
    if isinstance(descr, list):  # structured: JSON turned the descr's tuples into lists
        descr = [tuple(f) if isinstance(f, list) else f for f in descr]
    dtype = np.lib.format.descr_to_dtype(descr)
    if dtype.hasobject:
        raise ValueError("object dtypes cannot be mapped from a file")
    return dtype


def _check_manifest(data: Any, where: str) -> dict[str, Any]:
    """Check every entry of a decoded memmap manifest (types, dtypes, shapes, sizes).

    Raises:
        CheckpointError: Naming the file, the entry, its value and the rule.
    """
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise CheckpointError(f"{where} is not a replaybank memmap manifest (expected a JSON "
                              f'object with "format": "{_FORMAT}"); check the path')
    version = data.get("version", 0)
    if not _is_int(version) or version < 0:
        raise CheckpointError(f"{where}: version={describe(version)} is not an int >= 0; "
                              "the manifest is damaged")
    if version > _VERSION:
        raise CheckpointError(f"{where}: version {version} was written by a newer replaybank; "
                              "upgrade replaybank")
    arrays = data.get("arrays")
    if not isinstance(arrays, dict):
        raise CheckpointError(f"{where}: entry 'arrays'={describe(arrays)} is not an object; "
                              "the manifest is damaged")
    for name, entry in arrays.items():
        _check_entry(name, entry, where)
    for key in ("config", "config_error", "buffer_id"):
        value, typ = data.get(key), (dict if key == "config" else str)
        if value is not None and not isinstance(value, typ):
            raise CheckpointError(f"{where}: entry {key!r}={describe(value)} is not a "
                                  f"{typ.__name__} or null; the manifest is damaged")
    return data


def _check_entry(name: str, entry: Any, where: str) -> None:
    what = f"{where}: array {name!r}"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{what} is {describe(entry)}, not an object; the manifest is "
                              "damaged")
    file = MemmapBackend.file_name(name)  # never a name from the file: see _remove_files
    for key, ok, rule in (
        ("file", lambda v: v == file, f"{file!r} (the array's own file)"),
        ("dtype", lambda v: isinstance(v, (str, list)), "a dtype description"),
        ("row_shape", lambda v: isinstance(v, list) and len(v) <= _MAX_NDIM
         and all(_is_int(d) and d >= 0 for d in v), f"a list of <= {_MAX_NDIM} ints >= 0"),
        ("rows", lambda v: _is_int(v) and v >= 0, "an int >= 0"),
        ("growable", lambda v: isinstance(v, bool), "true or false"),
    ):
        if key not in entry or not ok(entry[key]):
            raise CheckpointError(f"{what}: {key}={describe(entry.get(key, '<missing>'))} "
                                  f"must be {rule}; the manifest is damaged")
    try:
        dtype = _parse_dtype(entry["dtype"])
    except Exception as exc:  # numpy raises many kinds on bad descrs
        raise CheckpointError(f"{what}: dtype={describe(entry['dtype'])} is not a dtype "
                              f"that can be mapped ({type(exc).__name__}: {exc}); the "
                              "manifest is damaged") from exc
    nbytes = _nbytes((entry["rows"], *entry["row_shape"]), dtype)
    row = _nbytes(tuple(entry["row_shape"]), dtype)
    if nbytes > _MAX_BYTES or row > _MAX_BYTES:
        raise CheckpointError(f"{what}: rows={entry['rows']} x row_shape={entry['row_shape']} "
                              f"of {dtype} is {nbytes:,} bytes, more than any file here; the "
                              "manifest is damaged")


class MemmapBackend:
    """Arrays in ``numpy.memmap`` files under a directory.

    The disk blocks of every file are reserved when it is created or grown
    (``posix_fallocate``; a sparse file where the filesystem cannot reserve), so a full
    disk raises :class:`~replaybank.errors.CapacityError` then, never SIGBUS on a later
    write. One process writes a directory at a time: a writable backend holds an
    exclusive lock (``flock`` on :data:`LOCK`, which names its pid) from its creation
    until :meth:`close` or until it is garbage collected (or the process ends); a
    read-only one (``mode="r"``) takes no lock and maps the files read-only.

    Args:
        path: Directory for the files (created when missing).
        reopen: Map the existing files of a buffer at ``path`` instead of creating new
            ones (what :func:`replaybank.persist.open` does).
        overwrite: Replace a buffer that already exists at ``path``.
        mode: ``"r+"`` (read and write, the default) or ``"r"`` (read only; needs
            ``reopen=True``): the data files are mapped read-only (writes raise
            :class:`~replaybank.errors.ConfigError`), the bookkeeping files (counters,
            links) copy-on-write, so that changes stay in this process's memory.
        reserve: Reserve the disk blocks of new and grown files and check the free space
            first. ``False`` makes sparse files (a capacity beyond the free disk space is
            then accepted, and a write that finds the disk full kills the process with
            SIGBUS).

    Raises:
        ConfigError: ``path`` already holds a buffer (and neither ``reopen`` nor
            ``overwrite`` was given), another writer holds it, or a bad ``mode``.
        CheckpointError: ``reopen`` and there is no buffer at ``path``, its manifest is
            damaged, or its files do not match the manifest.
        CapacityError: A file does not fit in the free disk space.

    Example:
        >>> import tempfile
        >>> be = MemmapBackend(tempfile.mkdtemp())
        >>> a = be.allocate("obs", (4, 1, 3), np.dtype("float32"))
        >>> be.write(a, (np.array([1]), np.array([0])), np.ones((1, 3), np.float32))
        >>> float(be.gather(a, (np.array([0, 1]), np.array([0, 0]))).sum())
        3.0
        >>> be.close()
    """

    name = "memmap"
    host_numpy = True
    durable = True

    def __init__(self, path: Any, reopen: bool = False, overwrite: bool = False,
                 mode: str = "r+", reserve: bool = True) -> None:
        if mode not in MODES:
            raise ConfigError(f"mode={mode!r}: choose 'r+' (read and write; one writer at a "
                              "time) or 'r' (read only, beside a writer)")
        if mode == "r" and not reopen:
            raise ConfigError("MemmapBackend(mode='r') maps the files of an existing buffer "
                              "read-only: pass reopen=True (rb.open(path, mode='r'))")
        if not isinstance(path, (str, bytes, os.PathLike)) or not os.fspath(path):
            raise ConfigError(f"path={describe(path)}: memmap storage needs a directory "
                              "for its files; pass e.g. path='runs/replay' (an empty path "
                              "would write into the current directory)")
        self.path = Path(os.fsdecode(os.fspath(path))).expanduser()  # ~: the home, not a dir "~"
        self.reopen = bool(reopen)
        self.mode = mode
        self.reserve = bool(reserve)
        self._writable = mode == "r+"
        self._maps: dict[str, np.memmap[Any, Any]] = {}
        #: bytes of the arrays created since the owner last recorded itself
        self._batch: dict[str, int] = {}
        self._unlock: weakref.finalize[Any, Any] | None = None
        #: A failed first allocation gave the path back (no manifest, lock released):
        #: the next allocation claims it again.
        self._given_back = False
        #: A writable reopen: the bytes of the files a reopen may write (the manifest and
        #: the lane counters) as they were before it, until :meth:`commit_open`.
        self._undo: dict[str, bytes] | None = None
        #: The writer's pid when this object is a forked child's copy of it (None: not).
        self._forked_from: int | None = None
        #: The pid that took the writer's lock (None: not locked).
        self._pid: int | None = None
        try:
            self._start(overwrite)
        except BaseException:
            self.close()
            raise

    def _start(self, overwrite: bool) -> None:
        manifest = self.path / MANIFEST
        if self.reopen:
            if not manifest.is_file():
                raise CheckpointError(f"no memmap buffer at {self.path}: {MANIFEST} is "
                                      "missing; check the path")
            if self._writable:
                self._lock()
            self.manifest: dict[str, Any] = self._read_manifest()
            self._check_lane_counters()
            if self._writable:
                remove_stale_temps(self.path, (MANIFEST,))
                self._undo = self._snapshot()
            return
        self.manifest = {"format": _FORMAT, "version": _VERSION, "arrays": {}, "config": None,
                         "buffer_id": uuid.uuid4().hex}
        self._claim(overwrite)

    def _claim(self, overwrite: bool) -> None:
        """Take :attr:`path` for a new buffer: the directory, the writer's lock, then the
        (empty) manifest. Also how a backend whose first allocation failed (and gave the
        path back: :meth:`_give_back`) takes it again for a retry.

        Raises:
            ConfigError: The directory cannot be made, another writer holds it, or it
                already holds a buffer (and not ``overwrite``); the lock is released.
        """
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"path={str(self.path)!r}: cannot create the directory ({exc})") \
                from exc
        self._lock()
        try:
            remove_stale_temps(self.path, (MANIFEST,))
            if (self.path / MANIFEST).exists():
                if not overwrite and not self._never_used():
                    raise ConfigError(
                        f"path={str(self.path)!r} already holds a replaybank memmap buffer; "
                        "reopen it with rb.open(path), choose an empty directory, or "
                        "replace it (deleting its steps) with rb.ReplayBuffer(..., "
                        "storage=rb.MemmapBackend(path, overwrite=True))"
                    )
                self._remove_files()
            self._save_manifest()
        except BaseException:
            self._release_lock()
            raise
        self._given_back = False

    # ------------------------------------------------------------------ reopen
    def _snapshot(self) -> dict[str, bytes]:
        """The bytes of every file a reopen may write: the manifest (the owner record,
        the buffer id) and the lane counters ``meta/*`` of one row per lane (the step
        table repairs ``counts`` and ``start`` from each other when it maps them)."""
        out = {MANIFEST: (self.path / MANIFEST).read_bytes()}
        for name, entry in self.manifest["arrays"].items():
            if name.startswith("meta/") and entry["row_shape"] == []:
                with contextlib.suppress(OSError):
                    out[self.file_name(name)] = (self.path / self.file_name(name)).read_bytes()
        return out

    def commit_open(self) -> None:
        """The buffer reopened on these files is complete: its writes stay (no-op unless
        this backend reopened files for writing)."""
        self._undo = None

    def abort_open(self) -> None:
        """Undo what a failed reopen wrote and release the files (:meth:`close`).

        :func:`replaybank.persist.open` calls this when rebuilding the buffer on the files
        failed part way (an override that does not fit them, damaged links): every file
        gets back the bytes it had when this backend opened it, so a failed open changes
        nothing. (A process killed during a reopen leaves only repairs that any later
        reopen makes too: ``counts = written - start``, and the owner record.)
        """
        undo, self._undo = self._undo, None
        if undo is not None:
            for base, data in undo.items():
                file = self.path / base
                with contextlib.suppress(OSError):
                    if file.read_bytes() == data:
                        continue
                    if base == MANIFEST:  # atomically, as it is always written
                        with temp_path(file) as tmp:
                            tmp.write_bytes(data)
                            os.replace(tmp, file)
                    else:  # in place: the pages this process mapped see it
                        fd = os.open(file, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
                        try:
                            os.pwrite(fd, data, 0)
                        finally:
                            os.close(fd)
            self._maps.clear()  # the buffer is gone: nothing to flush over the restored bytes
        self.close()

    # ------------------------------------------------------------------ lock
    def _lock(self) -> None:
        """Take the writer's lock of :attr:`path` (or raise naming its holder)."""
        if fcntl is None:  # pragma: no cover - Windows
            return
        file = self.path / LOCK
        try:
            fd = os.open(file, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as exc:
            raise ConfigError(f"path={str(self.path)!r}: cannot open the lock file {file} "
                              f"({exc}); use a writable directory, or rb.open(path, mode='r') "
                              "to read") from exc
        for attempt in range(2):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(fd)
                if attempt == 0 and holder == os.getpid():
                    gc.collect()  # an unreachable buffer of ours may still hold it
                    continue
                os.close(fd)
                who = (f"this process (pid {holder}): another buffer here has it open; close "
                       "it (buf.backend.close()) or delete it first"
                       if holder == os.getpid() else
                       f"process {holder if holder is not None else '(pid unknown)'}: let it "
                       "finish or stop it first")
                raise ConfigError(
                    f"path={str(self.path)!r}: the memmap buffer there is open for writing by "
                    f"{who}; one process writes a buffer at a time (lock {file}). To read "
                    "beside the writer, open it with rb.open(path, mode='r')"
                ) from None
            except OSError as exc:
                os.close(fd)
                raise ConfigError(f"path={str(self.path)!r}: cannot lock {file} ({exc}); use "
                                  "a local filesystem, or rb.open(path, mode='r') to read") \
                    from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._unlock = weakref.finalize(self, os.close, fd)
        self._pid = os.getpid()
        _WRITERS.add(self)

    def _inherited(self) -> None:
        """In a child forked from the writer: refuse every write from now on and close
        the child's copy of the lock file descriptor. The parent keeps the lock (an
        ``flock`` lasts while any descriptor of it is open, so the copy is closed, never
        unlocked): a child that outlives a killed parent does not hold the directory."""
        if self._forked_from is None:
            self._forked_from = self._pid or os.getppid()
        self._writable = False
        unlock, self._unlock = self._unlock, None
        detached = unlock.detach() if unlock is not None else None
        if detached is not None:
            with contextlib.suppress(OSError):
                os.close(detached[2][0])

    def close(self) -> None:
        """Flush the files and release the writer's lock (idempotent).

        The buffer must not be written after this; another process (or buffer) may then
        open the directory for writing. A read-only backend has nothing to release.
        """
        if self._writable and self._maps:
            with contextlib.suppress(OSError, ValueError):
                self.flush()
        self._writable = False
        self._release_lock()

    def _release_lock(self) -> None:
        if self._unlock is not None:
            self._unlock()  # closes the lock file: the lock is released
            self._unlock = None

    @property
    def read_only(self) -> bool:
        """Opened with ``mode="r"``: read only, beside a writer that may be adding."""
        return self.mode == "r"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (a read-only backend reports False)."""
        return self.mode == "r+" and not self._writable

    def _refuse(self, what: str) -> ConfigError:
        if self._forked_from is not None:
            return ConfigError(
                f"memmap buffer at {self.path}: cannot {what} in process {os.getpid()}: it "
                f"was inherited through os.fork() from the writer, process "
                f"{self._forked_from}, and one process writes a memmap directory at a time "
                "(two would hand out the same slots). Open the path in this process with "
                "rb.open(path) after the writer closed it (buf.close()), read it with "
                "rb.open(path, mode='r'), or use storage='shared' for several writer "
                "processes")
        why = ("it was opened read-only (mode='r'); reopen it with rb.open(path) to write"
               if self.mode == "r" else "it was closed (buf.close()), and another process "
               "may write its files now; reopen it with rb.open(path)")
        return ConfigError(f"memmap buffer at {self.path}: cannot {what}: {why}")

    def check_writable(self, what: str) -> None:
        """Raise ConfigError when the files are read-only here (``mode="r"``) or closed.

        Example:
            >>> import tempfile, os
            >>> be = MemmapBackend(os.path.join(tempfile.mkdtemp(), "b"))
            >>> be.check_writable("add()")  # open for writing: nothing raised
            >>> be.close()
            >>> be.check_writable("add()")
            Traceback (most recent call last):
            ...
            replaybank.errors.ConfigError: memmap buffer at ...: cannot add(): it was closed ...
        """
        if not self._writable:
            raise self._refuse(what)

    # ------------------------------------------------------------------ files
    def _read_manifest(self) -> dict[str, Any]:
        manifest = self.path / MANIFEST
        try:
            data = json.loads(manifest.read_bytes().decode("utf-8"))
        except FileNotFoundError as exc:
            raise CheckpointError(f"no memmap buffer at {self.path}: {MANIFEST} is "
                                  "missing; check the path") from exc
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise CheckpointError(f"{manifest} cannot be read ({type(exc).__name__}: "
                                  f"{exc}); the manifest is damaged") from exc
        return _check_manifest(data, str(manifest))

    def _read_counter(self, name: str) -> npt.NDArray[np.int64] | None:
        """The lane counter ``meta/<name>`` ``[lanes]`` as its file holds it now, or None
        where it cannot be checked here (absent, not int64 ``[lanes]``, short or not a
        regular file: mapping it reports that)."""
        entry = self.manifest["arrays"].get(f"meta/{name}")
        if entry is None or entry["row_shape"] != [] or \
                _parse_dtype(entry["dtype"]) != np.dtype("<i8"):
            return None
        nbytes = 8 * int(entry["rows"])
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(self._file(f"meta/{name}"), flags)  # a FIFO never blocks
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size < nbytes:
                return None
            data = os.pread(fd, nbytes, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(data) < nbytes:
            return None
        return np.frombuffer(data, dtype="<i8").astype(np.int64)

    def _check_lane_counters(self) -> None:
        """Check the stored ``start`` of each lane against ``written``, ``counts`` and the
        ring size before the step table maps them (a reopened table takes ``counts =
        written - start``, so a hand-edited ``start`` would silently hide steps, or empty
        the buffer, and the table rewrites ``counts`` from it).

        The step table's durable write order (:class:`~replaybank.storage.table.StepTable`)
        moves one end of a lane's live window ``[start, written)`` per store, so a process
        killed at any instant leaves, per lane, ``0 <= counts <= T`` (a ring of ``T``
        rows), ``0 <= start <= written``, and the live steps ``L = min(written - start,
        T)`` at most one write chunk (``max(1, T // 4)`` evicted steps:
        ``StepTable.chunk``) below the stored ``counts``, or ``start == written`` (killed
        in ``clear()``). ``counts`` itself may lag ``L`` by any number of new steps (killed
        before it followed the commit). Anything else was not written by a buffer.

        Files are read ``start``, then ``counts``, then ``written``: ``start`` and
        ``written`` only grow, so a read beside a writer (``mode="r"``) sees a window at
        least as wide as the true one at the moment ``counts`` was read.

        Raises:
            CheckpointError: Naming the file, the lane, the values and the rule.
        """
        start = self._read_counter("start")  # absent in files older than the counter
        counts = self._read_counter("counts")
        written = self._read_counter("written")
        link = self.manifest["arrays"].get("meta/link")
        if start is None or counts is None or written is None or link is None or \
                link["row_shape"] != [len(start)] or not len(counts) == len(written) == \
                len(start) or link["rows"] < 1:
            return  # mapping the arrays names what is missing or the wrong size
        T = int(link["rows"])  # noqa: N806
        chunk = max(1, T // 4)  # StepTable.chunk
        fix = ("the lane counters are damaged (hand-edited?): restore the buffer from a "
               "checkpoint (rb.save / rb.load)")
        for lane in range(len(start)):
            s, c, w = int(start[lane]), int(counts[lane]), int(written[lane])
            if not 0 <= c <= T:
                raise CheckpointError(
                    f"{self.path / self.file_name('meta/counts')}: meta/counts[{lane}] = {c} "
                    f"is outside [0, {T}] (each lane holds at most capacity // num_envs = "
                    f"{T} steps); {fix}")
            if w < 0:
                raise CheckpointError(
                    f"{self.path / self.file_name('meta/written')}: meta/written[{lane}] = "
                    f"{w} is negative (it counts the steps ever written to lane {lane}); {fix}")
            where = f"{self.path / self.file_name('meta/start')}: meta/start[{lane}] = {s}"
            values = f"(meta/written[{lane}] = {w}, meta/counts[{lane}] = {c})"
            if s < 0:
                raise CheckpointError(f"{where} is negative {values}; it counts the steps "
                                      f"ever evicted from lane {lane}; {fix}")
            if s > w:
                raise CheckpointError(
                    f"{where} is past written {values}; the oldest live step of lane {lane} "
                    f"cannot come after its newest (start <= written); {fix}")
            live = min(w - s, T)
            if s < w and c - live > chunk:
                raise CheckpointError(
                    f"{where} leaves written - start = {live} live steps {values} but "
                    f"counts records {c}: a write moves them at most {chunk} steps apart "
                    f"(a ring of {T} rows), so this start would hide {c - live} stored "
                    f"steps; {fix}")

    def _never_used(self) -> bool:
        """Whether the buffer at :attr:`path` never stored a step, so a new buffer may
        take its place: its manifest has no owner record (a buffer records its config
        before its first write stores anything: a buffer built without ``spec`` and
        closed before any add, or killed during its first add) and every lane's
        ``written`` counter that its files hold is 0."""
        try:
            data = _check_manifest(json.loads((self.path / MANIFEST).read_bytes()
                                              .decode("utf-8")), MANIFEST)
        except (OSError, ValueError, RecursionError, CheckpointError):
            return False
        if data.get("config") is not None or data.get("config_error") is not None:
            return False
        if "meta/written" not in data["arrays"]:
            return True
        self.manifest = data
        try:
            written = self._read_counter("written")
        finally:
            self.manifest = {"format": _FORMAT, "version": _VERSION, "arrays": {},
                             "config": None, "buffer_id": uuid.uuid4().hex}
        return written is not None and not written.any()

    def _remove_files(self) -> None:
        """Delete the old buffer's files: only names derived from its array names, inside
        :attr:`path` (never a file its manifest names elsewhere)."""
        try:
            old = json.loads((self.path / MANIFEST).read_bytes().decode("utf-8"))
        except (OSError, ValueError, RecursionError):
            old = {}
        arrays = old.get("arrays") if isinstance(old, dict) else None
        for name in arrays if isinstance(arrays, dict) else ():
            with contextlib.suppress(OSError):
                (self.path / self.file_name(name)).unlink()  # never follows a link
        with contextlib.suppress(OSError):
            (self.path / MANIFEST).unlink()
        for stale in self.path.glob(RESUME_PREFIX + "*"):  # the old buffer's resume state
            with contextlib.suppress(OSError):
                stale.unlink()

    @property
    def buffer_id(self) -> str:
        """A random id of the buffer in these files, made at creation (and recorded on
        first use for files written before ids existed): resume state names it."""
        bid = self.manifest.get("buffer_id")
        if not isinstance(bid, str):
            bid = self.manifest["buffer_id"] = uuid.uuid4().hex
            if self._writable:
                self._save_manifest()
        return bid

    def _save_manifest(self) -> None:
        _write_json_atomic(self.path / MANIFEST, self.manifest)

    @staticmethod
    def file_name(name: str) -> str:
        """The file of array ``name`` (one name in the directory, no separators).

        Example:
            >>> MemmapBackend.file_name("side/obs")
            'side%2Fobs.bin'
        """
        return quote(name, safe="") + ".bin"

    def _file(self, name: str) -> Path:
        base = self.file_name(name)
        try:
            limit = os.pathconf(self.path, "PC_NAME_MAX")
        except (OSError, ValueError):  # (no such query here: the common limit)
            limit = 255
        if len(os.fsencode(base)) > limit:
            field = name.split("/", 1)[1] if name.startswith(("fields/", "side/")) else name
            raise SpecError(
                f"memmap storage at {self.path}: the field {field[:40]!r}... "
                f"({len(field)} characters) is stored in the file {base[:40]}... of "
                f"{len(os.fsencode(base))} bytes, but this file system allows names of "
                f"{limit}; use a shorter field name (or storage='numpy')"
            )
        file = self.path / base
        real = os.path.realpath(file)
        if os.path.dirname(real) != os.path.realpath(self.path):
            raise CheckpointError(f"{file} resolves to {real}, outside {self.path}; the "
                                  "directory was tampered with: remove that link")
        return file

    def _reserve(self, fd: int, start: int, end: int, what: str) -> None:
        """Give the file bytes ``[start, end)`` (and the size ``end``) real disk blocks.

        Raises:
            _NoSpaceError: Not that much free space, or the disk (or RLIMIT_FSIZE) refused it
                (the file keeps its old size).
        """
        if end <= start:
            os.ftruncate(fd, end)
            return
        need = end - start
        if self.reserve:
            free = shutil.disk_usage(self.path).free
            if need > free:
                raise _NoSpaceError(need, free)
        try:
            fallocate = getattr(os, "posix_fallocate", None)
            if self.reserve and fallocate is not None:
                try:
                    fallocate(fd, start, need)
                    return
                except OSError as exc:
                    if exc.errno not in _NO_FALLOCATE:
                        raise
            os.ftruncate(fd, end)  # sparse: this filesystem cannot reserve blocks
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            if exc.errno in _FULL:
                raise _NoSpaceError(need, None, exc) from exc
            raise CheckpointError(f"memmap storage at {self.path}: cannot size the file for "
                                  f"{what} ({exc})") from exc

    def _create(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        """Create the file of array ``name`` with its disk blocks reserved.

        Raises:
            CapacityError: It does not fit on the disk.
            ConfigError, CheckpointError: It cannot be created or sized.

            On any failure the arrays created since the owner last recorded itself are
            removed too (:meth:`_rollback`): a buffer that cannot be built leaves no
            files behind.
        """
        what = f"array {name!r} {list(shape)}"
        if not name.startswith("side/") and len(shape) >= 2:  # [T, lanes, ...]
            what += f" (capacity {shape[0] * shape[1]:,} steps)"
        held = sum(self._batch.values())
        try:
            file = self._file(name)
            with contextlib.suppress(FileNotFoundError):
                file.unlink()  # a planted link is removed, never written through
            try:
                fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except OSError as exc:
                raise ConfigError(f"path={str(self.path)!r}: cannot create {file} ({exc})") \
                    from exc
            try:
                self._reserve(fd, 0, _nbytes(shape, dtype), what)
            except BaseException:
                with contextlib.suppress(OSError):
                    file.unlink()
                raise
            finally:
                os.close(fd)
        except _NoSpaceError as exc:
            self._rollback()
            raise self._no_space(what, exc, held) from exc.cause
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        """Remove the arrays created since the owner last recorded itself (the owner's
        allocation failed part way). When nothing else was ever stored here (no array,
        no owner record: the buffer's first allocation failed), give the path back
        (:meth:`_give_back`)."""
        for name in self._batch:
            self._maps.pop(name, None)
            self.manifest["arrays"].pop(name, None)
        unused = not self.manifest["arrays"] and self.manifest.get("config") is None \
            and self.manifest.get("config_error") is None
        if unused:  # the manifest goes first: no moment where it names a missing file
            with contextlib.suppress(OSError):
                (self.path / MANIFEST).unlink()
        else:
            self._save_manifest()
        for name in self._batch:
            with contextlib.suppress(OSError):
                (self.path / self.file_name(name)).unlink()
        self._batch.clear()
        if unused:
            self._give_back()

    def _give_back(self) -> None:
        """Release :attr:`path` after a failed first allocation: its manifest and array
        files are gone (the directory, a user's other files and the lock file stay), and
        the lock is released, so that a new buffer there, or this one's next allocation
        (:meth:`_claim`), starts afresh; ``rb.open`` finds no buffer. (An allocation
        failure leaves the owning buffer without storage: when that was its construction,
        the buffer never exists, but a traceback may keep this object alive.)"""
        self._maps.clear()
        self._release_lock()
        self._given_back = True

    def _no_space(self, what: str, exc: _NoSpaceError, held: int = 0) -> CapacityError:
        total = (f" ({_gib(exc.need + held)} with the {_gib(held)} of the buffer's other new "
                 "files, now removed)" if held else "")
        why = (f"only {_gib(exc.free + held)} are free on that disk" if exc.free is not None
               else f"the disk (or a file size limit) refused them ({exc.cause})")
        return CapacityError(
            f"memmap storage at {self.path}: {what} needs {_gib(exc.need)}{total} but {why}; "
            "lower capacity (or the observation size), free disk space, or choose a path on "
            "a disk with more room"
        )

    def _map(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
        # read-only: data files are mapped read-only (a write raises), bookkeeping
        # copy-on-write (the table may repair its counters in memory; files never change)
        private = name.startswith("meta/")
        if _nbytes(shape, dtype) == 0:
            out = np.zeros(shape, dtype=dtype)
            out.flags.writeable = self._writable or private
            return out
        file = self._file(name)
        try:
            mm: np.memmap[Any, Any] = (
                np.memmap(file, dtype=dtype, mode="r+", shape=shape) if self._writable
                else np.memmap(file, dtype=dtype, mode="c", shape=shape) if private
                else np.memmap(file, dtype=dtype, mode="r", shape=shape))
        except OSError as exc:
            raise self._open_error(file, name, exc) from exc
        self._maps[name] = mm
        return mm.view(np.ndarray)

    def _open_error(self, file: Path, name: str, exc: OSError) -> ReplayBankError:
        """The library error of a data file that cannot be opened (``exc``)."""
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            how = "read and written" if self._writable else "read"
            fix = ("fix its permissions (or its file system), or open it read-only with "
                   "rb.open(path, mode='r')" if self._writable else "fix its permissions")
            return ConfigError(f"path={str(self.path)!r}: {file} (array {name!r}) cannot be "
                               f"{how} by this process ({exc.strerror}); {fix}")
        if exc.errno in (errno.EISDIR, errno.ENOTDIR, errno.ENOENT, errno.ELOOP):
            return CheckpointError(f"{file} (array {name!r}) cannot be opened ({exc}); the "
                                   "files are damaged: restore the buffer from a checkpoint "
                                   "(rb.save / rb.load)")
        return CheckpointError(f"{file} (array {name!r}) cannot be mapped ({exc}); "
                               f"{os_error_fix(exc)}")

    def _array(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any],
               growable: bool) -> npt.NDArray[Any]:
        dtype = np.dtype(dtype)
        if not shape:
            raise ConfigError(f"memmap array {name!r}: 0-d arrays are not supported")
        if dtype.hasobject:
            raise ConfigError(f"memmap array {name!r}: dtype={dtype} holds Python objects, "
                              "which cannot live in a file; use numpy storage")
        if self.reopen:
            return self._reopen_array(name, shape, dtype, growable)
        if not self._writable:
            raise self._refuse(f"allocate array {name!r}")
        if self._given_back:  # an earlier first allocation failed and gave the path back
            self._claim(overwrite=False)
        self._new_file(name, shape, dtype, growable)
        self._batch[name] = _nbytes(shape, dtype)
        return self._map(name, shape, dtype)

    def _new_file(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any],
                  growable: bool) -> None:
        """Create the file of array ``name`` (zero-filled, its blocks reserved), then
        name it in the manifest (replaced atomically): a process killed in between
        leaves a file that no manifest names, which the next creation replaces."""
        self._create(name, shape, dtype)
        self.manifest["arrays"][name] = {
            "file": self.file_name(name), "dtype": np.lib.format.dtype_to_descr(dtype),
            "row_shape": list(shape[1:]), "rows": int(shape[0]), "growable": growable}
        self._save_manifest()

    def _reopen_array(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any],
                      growable: bool) -> npt.NDArray[Any]:
        old = self.manifest["arrays"].get(name)
        if old is None or _parse_dtype(old["dtype"]) != dtype or \
                old["row_shape"] != list(shape[1:]):
            raise CheckpointError(
                f"{self.path}: array {name!r} on disk is {old} but the buffer needs "
                f"{list(shape)} of {dtype}; the files belong to a different buffer"
            )
        file = self._file(name)
        try:
            info = file.stat()
        except OSError as exc:
            raise CheckpointError(f"{file} (array {name!r}) cannot be read ({exc}); the "
                                  "files are damaged") from exc
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{file} (array {name!r}) is not a regular file (a "
                                  "directory or device took its place); the files are "
                                  "damaged: restore the buffer from a checkpoint "
                                  "(rb.save / rb.load)")
        size = info.st_size
        row = _nbytes(shape[1:], dtype)
        rows = int(shape[0])
        if growable:  # the side store grows; its file size is the truth
            rows = max(rows, int(old["rows"]))
            need = rows * row
            rows = max(rows, size // row) if row else rows
        else:
            if int(old["rows"]) != rows:  # a ring of another size: the rows mean other steps
                raise CheckpointError(
                    f"{self.path}: array {name!r} on disk has {old['rows']} rows but the "
                    f"buffer needs {rows}; the files belong to a buffer of another capacity "
                    "(open them with the capacity they were created with)")
            need = rows * row
        if size < need:  # a mapping beyond the file's end would SIGBUS on first read
            raise CheckpointError(f"{file} holds {size:,} bytes but array {name!r} needs "
                                  f"{need:,} ({rows} rows of {row} bytes); the file is "
                                  "truncated, the files are damaged")
        return self._map(name, (rows, *shape[1:]), dtype)

    # ------------------------------------------------------------------ protocol
    def allocate(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """A zero-filled array in a new file (or the existing file when reopening)."""
        return self._array(name, shape, dtype, growable=name.startswith("side/"))

    def allocate_meta(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """Bookkeeping arrays persist in files too (``meta/<name>``)."""
        return self._array(f"meta/{name}", shape, dtype, growable=False)

    def add_meta(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """The bookkeeping array ``meta/<name>``, created zero-filled when reopened files
        lack it (written by a version before it existed), else the existing one.

        The file is complete on disk before the manifest names it (see
        :meth:`_new_file`), so a kill at any instant leaves the files reading as
        before or with the new array all zeros.

        Raises:
            ConfigError: The files are read-only here (``mode="r"``) or closed.
            CapacityError: The disk has no room for the file (nothing is created).

        Example:
            >>> import tempfile
            >>> be = MemmapBackend(tempfile.mkdtemp())
            >>> be.add_meta("cleared", (2,), np.dtype("int64")).tolist()
            [0, 0]
            >>> be.close()
        """
        key = f"meta/{name}"
        if key in self.manifest["arrays"] or not self.reopen:
            return self.allocate_meta(name, shape, dtype)
        if not self._writable:
            raise self._refuse(f"add array {key!r}")
        dtype = np.dtype(dtype)
        self._new_file(key, shape, dtype, growable=False)
        return self._map(key, shape, dtype)

    def resize(self, name: str, array: Any, length: int) -> Any:
        """Grow (or shrink) the file of ``name`` along axis 0 (content kept, new rows zero).

        Raises:
            CapacityError: The disk has no room for the new rows (the array is unchanged).
            ConfigError: The backend is read-only or closed.
        """
        if not self._writable:
            raise self._refuse(f"grow array {name!r}")
        mm = self._maps.get(name)
        if mm is None:  # zero-byte arrays are plain numpy
            out = np.zeros((length, *array.shape[1:]), dtype=array.dtype)
            out[: len(array)] = array
            return out
        mm.flush()
        row_shape = tuple(array.shape[1:])
        row = _nbytes(row_shape, array.dtype)
        fd = os.open(self._file(name), os.O_RDWR)
        what = f"the side store {name!r} growing to {length:,} slots"
        try:
            end = length * row
            self._reserve(fd, min(os.fstat(fd).st_size, end), end, what)
        except _NoSpaceError as exc:
            raise self._no_space(what, exc) from exc.cause
        finally:
            os.close(fd)
        del self._maps[name]
        entry = self.manifest["arrays"].get(name)
        if isinstance(entry, dict):  # after the file: a file longer than rows is fine
            entry["rows"] = int(length)
            self._save_manifest()
        return self._map(name, (length, *row_shape), array.dtype)

    def write(self, array: Any, index: Any, values: npt.NDArray[Any]) -> None:
        """``array[index] = values``.

        Raises:
            ConfigError: ``array`` is a file of a read-only backend.
        """
        try:
            array[index] = values
        except ValueError as exc:  # "assignment destination is read-only"
            if isinstance(array, np.ndarray) and not array.flags.writeable:
                raise self._refuse("write") from exc
            raise

    def index(self, index: npt.NDArray[np.int64]) -> Any:
        """The index itself (host memory)."""
        return index

    def gather(self, array: Any, index: Any) -> Any:
        """``array[index]`` as a new in-memory numpy array."""
        return array[index]

    def to_numpy(self, array: Any) -> npt.NDArray[Any]:
        """The mapped array itself (no copy)."""
        return np.asarray(array)

    def flush(self) -> None:
        """msync every mapping (durable against an OS crash, not only a process kill).

        Raises:
            ConfigError: The backend is read-only, inherited through a fork or closed (it
                has nothing to flush, and ``buf.flush()`` must not write resume state
                beside another writer).
        """
        if not self._writable:
            raise self._refuse("flush()")
        for mm in self._maps.values():
            mm.flush()

    def requires_memory(self) -> bool:
        """Data lives on disk: no RAM check at allocation."""
        return False

    def __getstate__(self) -> dict[str, Any]:
        """Refused: a pickled copy of mapped files would be a second writer (or a silent
        in-memory copy). Pass the directory instead and reopen it there.

        Raises:
            ConfigError: Always, naming the path and the fix.
        """
        raise ConfigError(
            f"a memmap buffer (path={str(self.path)!r}) cannot be pickled or copied: pass "
            "the path and call rb.open(path) in the other process (after buf.flush(), and "
            "after this process closed it), or rb.save(buf, dir) / rb.load(dir) for a copy"
        )

    # ------------------------------------------------------------------ owner
    def record_owner(self, record: dict[str, Any] | None, error: str | None = None) -> None:
        """Keep the owning buffer's record (its config) in the manifest.

        The backend never reads it: the buffer writes it, and
        :func:`replaybank.persist.open` rebuilds the buffer from it. Reopened files keep
        the record they were created with: the overrides of ``rb.open(path, seed=7)``
        apply to that open only, and the next plain ``rb.open(path)`` rebuilds the
        buffer as it was created.

        Args:
            record: A JSON-able description of the owner, or None when it could not
                describe itself.
            error: Why there is no record (shown when the buffer is reopened).
        """
        self._batch.clear()  # its arrays are complete
        if self.reopen and isinstance(self.manifest.get("config"), dict):
            return
        self.manifest["config"] = record
        self.manifest["config_error"] = error
        # a read-only reopen rebuilds the owner, which records itself; a path given back
        # (a failed first allocation) gets the record when it is claimed again
        if self._writable and not self._given_back:
            self._save_manifest()

    def owner_record(self) -> dict[str, Any] | None:
        """The record :meth:`record_owner` kept, or None."""
        cfg = self.manifest.get("config")
        return cfg if isinstance(cfg, dict) else None
