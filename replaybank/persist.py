"""Saving, loading and reopening buffers: ``rb.save``, ``rb.load``, ``rb.open``, ``flush``.

Every registered buffer type (:mod:`replaybank.registry`) is saved the same way:
its ``state_dict()`` goes into an atomic two-file checkpoint (:mod:`replaybank.io.checkpoint`)
whose manifest also carries the buffer's config, and :func:`load` rebuilds the right type
from that config (by its registered name) before it fills it. This module knows buffers
only through the small protocols below and the registry, so it imports no buffer class
and sits below them: a buffer's ``save``/``load``/``flush``/``open`` methods are thin
calls into it.

Disk-backed (memmap) buffers keep their data in files that are always consistent
(:mod:`replaybank.storage.backends.memmap`); the buffer writes its config into the
storage's *owner record* (:func:`record_owner`) so that :func:`open` can rebuild it from
the files alone. Generator, sampler and view state live in memory: :func:`flush`
(``buf.flush()``) syncs the files and saves that state, with the lane counters it
belongs to and the buffer's id, as an atomic checkpoint (``replaybank_resume_*``) in the
buffer's directory. :func:`open` restores it when it belongs to this buffer and the files
hold exactly the steps they held at that flush (the same ``written``, ``counts`` and
``episodes`` per lane): the reopened buffer then draws the identical next sample. When
steps were added or the buffer was cleared after the last flush, the reopened buffer
keeps a fresh generator and the sampler's default state and warns
(:class:`ResumeWarning`). A typical use is a preemptible job that calls ``flush()`` on
its shutdown signal.

Example:
    >>> import tempfile, numpy as np
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(capacity=16, seed=0)
    >>> for t in range(5):
    ...     buf.add(obs=np.full(2, t, np.float32), action=t, reward=1.0,
    ...             next_obs=np.full(2, t + 1, np.float32), terminated=False, truncated=False)
    >>> d = tempfile.mkdtemp()
    >>> _ = save(buf, d)
    >>> back = load(d)
    >>> bool(np.array_equal(back.sample(3).obs, buf.sample(3).obs))
    True
    >>> d = tempfile.mkdtemp()
    >>> disk = rb.PrioritizedReplayBuffer(32, storage="memmap", path=d, seed=0)
    >>> disk.extend(obs=np.zeros((6, 2)), action=np.zeros(6), reward=np.ones(6),
    ...             next_obs=np.ones((6, 2)), terminated=np.zeros(6, bool),
    ...             truncated=np.zeros(6, bool))
    >>> _ = disk.update_priorities(np.arange(6), np.arange(6.0))
    >>> disk.flush()
    >>> again = open(d, mode="r")  # read-only, beside the writer
    >>> disk.sample(4).indices.tolist() == again.sample(4).indices.tolist()
    True
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, runtime_checkable

import numpy as np

from replaybank.batch import storage_device
from replaybank.errors import (
    ArgumentError,
    CheckpointError,
    ConfigError,
    describe,
    require_extra,
)
from replaybank.io.checkpoint import load_state, open_checked, save_state, verify_crcs
from replaybank.io.lazy_tensor import lazy_tensors
from replaybank.io.manifest import checkpoint_paths
from replaybank.io.safetensors_stream import StateFile
from replaybank.io.state_tree import join_state
from replaybank.storage.backends.base import ArrayBackend, DurableBackend
from replaybank.storage.backends.memmap import RESUME_PREFIX, MemmapBackend
from replaybank.storage.table_state import state_views
from replaybank.views.named_functions import names_from_file

if TYPE_CHECKING:  # the return type of load(), for annotations only
    from replaybank.config import AnyBuffer

__all__ = ["COUNTERS", "Exclusive", "Persistable", "Resumable", "ResumeWarning", "directory",
           "flush", "load", "load_into", "load_overriding", "open", "record_owner", "save"]

_KIND = "replaybank.memmap_resume"
#: The lane counters a resume state belongs to.
COUNTERS = ("written", "counts", "episodes")


class ResumeWarning(UserWarning):
    """A reopened memmap buffer could not restore the state of its last ``flush()``."""


@runtime_checkable
class Persistable(Protocol):
    """What :func:`save` and :func:`load` need of a buffer (and ``config()`` through
    :func:`replaybank.config.buffer_config`)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to restore the buffer exactly."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        ...

    def metadata(self) -> dict[str, Any]:
        """A JSON-able description (type, capacity, spec, ...)."""
        ...


#: A buffer of any type that :func:`load_into` restores and hands back.
P = TypeVar("P", bound=Persistable)


@runtime_checkable
class Resumable(Persistable, Protocol):
    """A buffer whose storage may be durable (memmap), as :func:`flush` and :func:`open`
    need it."""

    @property
    def backend(self) -> ArrayBackend:
        """Where the arrays live."""
        ...

    def resume_state(self) -> dict[str, Any] | None:
        """Generator, sampler and view state plus the lane counters (:data:`COUNTERS`),
        or None before the storage exists."""
        ...

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`resume_state` (its counters were checked to match)."""
        ...

    def reopened(self) -> None:
        """The storage was reopened from its files: rebuild what lives in memory."""
        ...


@runtime_checkable
class SavedElsewhere(Protocol):
    """An object with a buffer's interface whose data :func:`save` cannot reach: it lives
    elsewhere and is saved by its owner (a sharded service's client: the shards hold the
    rows, ``service.checkpoint()`` saves them). :func:`save` and :func:`load_into` refuse
    it with its own advice."""

    def how_to_save(self) -> str:
        """What saves (and restores) this object's data, for the refusal's message."""
        ...


def _refuse_saved_elsewhere(buf: Any, call: str) -> None:
    """Refuse a :class:`SavedElsewhere` object, naming the call and its owner's fix.

    Raises:
        ConfigError: ``buf`` is one.
    """
    if isinstance(buf, SavedElsewhere):
        raise ConfigError(f"{call}(buf={type(buf).__name__}): {buf.how_to_save()}")


# ---------------------------------------------------------------------- checkpoints
def save(buf: Persistable, dirpath: Any, prefix: str = "buffer_") -> Path:
    """Save a buffer as ``<prefix>metadata.json`` + ``<prefix>state.safetensors`` (atomic).

    Args:
        buf: Any registered buffer type.
        dirpath: Directory of the two files.
        prefix: File name prefix.

    Returns:
        The manifest path.

    Raises:
        CheckpointError: The write failed (the previous checkpoint is left intact), or
            ``dirpath`` is a file.
        ConfigError: The buffer's config cannot be described (unregistered component),
            or ``buf`` is saved by its owner (:class:`SavedElsewhere`: a sharded
            service's client, whose service saves with ``service.checkpoint()``).
        ArgumentError: ``dirpath`` is not a path (a str or ``os.PathLike``).
    """
    _refuse_saved_elsewhere(buf, "save")
    path = directory(dirpath, "save", "dirpath", reading=False)
    with _exclusive(buf):  # another thread's adds wait until the files are written
        from replaybank.config import buffer_config  # pydantic loads with the first save

        dump = buffer_config(buf).model_dump(mode="json")
        info = {"buffer_type": type(buf).__name__, "config": dump, "metadata": buf.metadata()}
        with state_views():  # written before anything can change: no copy of the data
            state = buf.state_dict()
            return save_state(state, path, prefix, info)


@runtime_checkable
class Exclusive(Protocol):
    """A buffer whose calls can be held off by other threads while it is saved."""

    def exclusive(self) -> AbstractContextManager[None]:
        """A context in which no other thread's call on the buffer runs."""
        ...


def _exclusive(buf: Any) -> AbstractContextManager[None]:
    return buf.exclusive() if isinstance(buf, Exclusive) else contextlib.nullcontext()


def _restore(buf: Persistable, manifest: dict[str, Any], sf: StateFile) -> None:
    state = join_state(manifest["state"], lazy_tensors(manifest, sf))
    try:
        buf.load_state_dict(state)
    except CheckpointError:
        raise
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise CheckpointError(
            f"the checkpoint does not fit a {type(buf).__name__}: {type(exc).__name__}: {exc}"
        ) from exc


def load_into(buf: P, dirpath: Any, prefix: str = "buffer_") -> P:
    """Load a checkpoint into an existing buffer of the same type, capacity and spec.

    Every file check runs before the buffer is touched.

    Returns:
        ``buf`` (typed as what was passed in).

    Raises:
        CheckpointError: Any problem with the files, or they do not fit ``buf``;
            ``dirpath`` is a file (pass the directory that holds it).
        ConfigError: ``buf`` is restored by its owner (:class:`SavedElsewhere`: a
            sharded service's client, whose service restores with
            ``ReplayService.restore``).
        ArgumentError: ``dirpath`` is not a path (a str or ``os.PathLike``).

    Example:
        >>> import tempfile, numpy as np
        >>> import replaybank as rb
        >>> d = tempfile.mkdtemp()
        >>> src = rb.ReplayBuffer(8, seed=0)
        >>> src.add(obs=np.zeros(2), action=0, reward=1.0, next_obs=np.ones(2),
        ...         terminated=False, truncated=False)
        >>> _ = save(src, d)
        >>> len(load_into(rb.ReplayBuffer(8), d))
        1
    """
    _refuse_saved_elsewhere(buf, "load_into")
    manifest, sf = open_checked(directory(dirpath, "load_into", "dirpath"), prefix)
    with sf:
        verify_crcs(manifest, sf)
        _restore(buf, manifest, sf)
    return buf


def load(dirpath: str | os.PathLike[str], prefix: str = "buffer_", *,
         trust_imports: bool = False, **overrides: Any) -> AnyBuffer:
    """Rebuild a saved buffer exactly (its type comes from the manifest).

    Args:
        dirpath: Directory of the checkpoint.
        prefix: File name prefix.
        trust_imports: Let the checkpoint's config import the modules it names (a HER
            ``reward_fn`` saved as ``"module:attr"``). By default a module that is not
            imported yet is refused (importing runs its code): import it, or register
            the function (:func:`replaybank.register_function`), before loading.
        **overrides: Config entries to change, e.g. ``path=`` (with ``storage="memmap"``,
            the default when ``path`` is given) to load into a new memmap directory, or
            ``storage="numpy"`` to load a torch buffer's checkpoint into host memory (a
            storage other than the saved one drops the saved ``device``), or
            ``device="cpu"`` to load one saved on a GPU on a machine without it.

    A checkpoint never chooses where files are written: the buffer is loaded into memory
    (``storage="numpy"``, even when the saved buffer was a memmap buffer, whose ``path``
    in the saved config is ignored) unless the caller passes ``path=`` here. A
    ``storage="shared"`` buffer's checkpoint (the steps its learner sampled from when it
    was saved) is loaded into memory too.

    Returns:
        The buffer (of the saved registered type); its next ``sample()`` equals the saved
        buffer's. A type checker sees :data:`replaybank.config.AnyBuffer`, the union of
        the package's buffer types: narrow it with ``isinstance(buf, rb.ReplayBuffer)``.

    Raises:
        CheckpointError: Missing, truncated or corrupted files, an edited manifest, a
            newer format version or a spec that does not match the state; ``dirpath`` is
            a file (pass the directory that holds it).
        ConfigError: ``device=`` (for torch storage) is not a device this machine has,
            or holds no data (``"meta"``: :func:`~replaybank.batch.storage_device`).
        ArgumentError: ``dirpath`` is not a path (a str or ``os.PathLike``).
    """
    # open_checked warns (RuntimeWarning) at load's caller when it falls back to the
    # manifest embedded in the state file
    manifest, sf = open_checked(directory(dirpath, "load", "dirpath"), prefix)
    buf: AnyBuffer = _rebuild(manifest, sf, trust_imports, lambda config: overrides)
    return buf


def load_overriding(dirpath: Any, prefix: str,
                    overrides: Callable[[dict[str, Any]], dict[str, Any]], *,
                    trust_imports: bool = False) -> Any:
    """:func:`load`, with the config overrides chosen from the saved config it reads.

    That config is the one :func:`load` rebuilds the buffer from: the manifest's, or the
    copy embedded in the state file when ``<prefix>metadata.json`` is missing or belongs
    to another save (with the same ``RuntimeWarning``). ``replaybank inspect`` reads
    checkpoints this way, replacing the functions the config names by stubs (never the
    config of another save's manifest).

    Args:
        dirpath: Directory of the checkpoint.
        prefix: File name prefix.
        overrides: ``overrides(config) -> {key: value}`` (``config``: the saved config
            as a dict, before its file locations are dropped).
        trust_imports: As in :func:`load`.

    Returns:
        The buffer, as :func:`load` returns it.

    Raises:
        CheckpointError, ArgumentError: As :func:`load`.

    Example:
        >>> import tempfile
        >>> import replaybank as rb
        >>> d = tempfile.mkdtemp()
        >>> rb.ReplayBuffer(8, seed=0).save(d)
        >>> load_overriding(d, "buffer_", lambda cfg: {"seed": cfg["seed"] + 1}).config().seed
        1
    """
    manifest, sf = open_checked(directory(dirpath, "load", "dirpath"), prefix)
    return _rebuild(manifest, sf, trust_imports, overrides)


def _rebuild(manifest: dict[str, Any], sf: StateFile, trust_imports: bool,
             overrides_of: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """The body of :func:`load` once the files are open: checksums, the buffer rebuilt
    from the saved config with ``overrides_of(config)``, its state restored."""
    with sf:
        verify_crcs(manifest, sf)
        cfg = manifest.get("config")
        if not isinstance(cfg, dict):
            raise CheckpointError(f"{sf.path}: the manifest has no buffer config; load the "
                                  "state into a buffer you build with load_into(buf, ...)")
        overrides = dict(overrides_of(cfg))
        cfg = _in_memory(cfg)
        if overrides.get("path") is not None:
            overrides["path"] = os.fspath(overrides["path"])
            overrides.setdefault("storage", "memmap")
        storage = overrides.get("storage", cfg.get("storage"))
        if storage == "torch" and overrides.get("device") is not None:
            # the caller's device: a ConfigError of load's argument (not of the checkpoint),
            # raised before anything is built, by the rule torch storage applies
            storage_device(require_extra("torch", "torch"), overrides["device"], "load")
        if "device" in cfg and storage != cfg.get("storage"):
            # the saved device belongs to the saved storage (a torch buffer's): loading
            # into another storage (storage="numpy", a memmap path=) drops it, unless given
            cfg["device"] = None
        try:
            from replaybank.config import from_config

            with names_from_file(str(sf.path), trust_imports):
                buf = from_config(cfg, **overrides)
        except ConfigError as exc:
            raise CheckpointError(f"cannot rebuild the saved buffer: {exc}") from exc
        _restore(buf, manifest, sf)
    return buf


def directory(path: Any, call: str, arg: str, reading: bool = True) -> Path:
    """A directory argument of :func:`save`, :func:`load`, :func:`load_into` or
    :func:`open` as a Path.

    Args:
        path: What the caller passed.
        call: The public call, for the message.
        arg: The argument's name, for the message.
        reading: The call reads the directory (a file there names its checkpoint or
            buffer file: the message says which directory to pass).

    Raises:
        ArgumentError: ``path`` is not a str, bytes or ``os.PathLike``.
        CheckpointError: ``path`` is a file.

    Example:
        >>> directory("ckpt", "load", "dirpath").name
        'ckpt'
        >>> directory(None, "load", "dirpath")
        Traceback (most recent call last):
        ...
        replaybank.errors.ArgumentError: load(dirpath=None): dirpath must be a directory path (a str or pathlib.Path); pass e.g. load('checkpoints/run1')
    """  # noqa: E501
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise ArgumentError(
            f"{call}({arg}={describe(path)}): {arg} must be a directory path (a str or "
            f"pathlib.Path); pass e.g. {call}('checkpoints/run1')")
    p = Path(os.fsdecode(os.fspath(path))).expanduser()  # ~ as a shell would read it
    if p.is_file():
        if not reading:
            raise CheckpointError(
                f"{call}({arg}='{p}'): that is a file; {call} writes its files into a "
                f"directory (created when missing): pass a directory path, e.g. '{p.parent}'")
        hint = ""
        for suffix in ("metadata.json", "state.safetensors"):
            if p.name.endswith(suffix) and p.name not in (suffix, f"buffer_{suffix}"):
                hint = f" with prefix='{p.name[:-len(suffix)]}'"
        raise CheckpointError(
            f"{call}({arg}='{p}'): that is a file; pass the directory that holds it: "
            f"{call}('{p.parent}'){hint}")
    return p


#: Storages a checkpoint is loaded from into memory: files (their place is never read
#: from a checkpoint) and shared memory (whose owner only samples what writers add).
_LOADED_IN_MEMORY = ("memmap", "shared")


def _in_memory(cfg: dict[str, Any]) -> dict[str, Any]:
    """A saved config with its file locations dropped: ``path`` (from a file, never
    trusted as a place to write) is None, and ``storage="memmap"`` or ``"shared"``
    becomes ``"numpy"``."""
    cfg = dict(cfg)
    if "path" in cfg:
        cfg["path"] = None
    if cfg.get("storage") in _LOADED_IN_MEMORY:
        cfg["storage"] = "numpy"
    return cfg


# ---------------------------------------------------------------------- memmap buffers
def record_owner(backend: ArrayBackend, owner: Any) -> None:
    """Write ``owner``'s config into a durable backend's owner record (no-op otherwise).

    An owner that cannot describe itself (an unregistered sampler or view) records None
    and why; :func:`open` then needs the missing parts as overrides.
    """
    if not (backend.durable and isinstance(backend, DurableBackend)):
        return
    try:
        from replaybank.config import buffer_config

        record: dict[str, Any] | None = buffer_config(owner).model_dump(mode="json")
        error = None
    except (ConfigError, ImportError, TypeError, ValueError) as exc:
        record, error = None, f"{type(exc).__name__}: {exc}"
    backend.record_owner(record, error)


def _durable(buf: Resumable) -> DurableBackend | None:
    be = buf.backend
    return be if be.durable and isinstance(be, DurableBackend) else None


def flush(buf: Resumable, before: Callable[[], None] | None = None) -> Path | None:
    """Sync a memmap buffer's files and save its generator, sampler and view state by them.

    Args:
        buf: The buffer.
        before: Run once the files are known to be writable here, held ``exclusive``
            with the save (e.g. a wrapper recording its owner config): a refused flush
            does not run it.

    Returns:
        The resume manifest's path, or None when nothing was ever added (no files to
        resume yet).

    Raises:
        ConfigError: The buffer's storage is not durable (use ``save(dirpath)``), or this
            process may not write its files: opened read-only, inherited through a fork,
            or closed (``buf.close()`` released the lock, so another process may own the
            files now; reopen them with ``rb.open(path)``). Nothing is written then.
        CheckpointError: The state could not be written (the previous one is kept).
    """
    backend = _durable(buf)
    if backend is None:
        raise ConfigError(
            f"flush(): {type(buf).__name__} with {buf.backend!r} storage has no files to "
            "resume from; flush() is for storage='memmap' buffers, use save(dirpath) to "
            "checkpoint an in-memory buffer"
        )
    with _exclusive(buf):
        # before anything, even with nothing to save: after close() the files may have
        # another writer, whose resume state this one must not replace
        backend.check_writable("flush()")
        if before is not None:
            before()
        state = buf.resume_state()
        if state is None:
            return None
        backend.flush()
        return save_state(state, backend.path, prefix=RESUME_PREFIX,
                          info={"kind": _KIND, "buffer_id": backend.buffer_id})


def open(path: Any, mode: str = "r+", *, trust_imports: bool = False,
         **overrides: Any) -> AnyBuffer:
    """Reopen the memmap buffer at ``path`` (in this or a new process).

    Args:
        path: Directory of a buffer built with ``storage="memmap"``.
        mode: ``"r+"`` (read and write: the one writer of ``path``, which stays locked
            until the buffer is garbage collected or ``buf.close()``) or ``"r"``
            (read only, beside a writer: files mapped read-only, writes raise ConfigError).
        trust_imports: Let the recorded config import the modules it names (as in
            :func:`load`; by default a module not imported yet is refused).
        **overrides: Config entries to change for this open (e.g. ``seed=``,
            ``n_step=``): they are not recorded, so the next ``open(path)`` without them
            rebuilds the buffer with the config it was created with (``buf.config()``
            shows the one in use; ``save``/``load`` carry it). The files stay where they
            are: the buffer always uses ``path`` (not a path recorded in its files);
            ``storage`` cannot be overridden, nor ``capacity`` and ``num_envs`` changed
            (they fix the files' shape).

    Returns:
        The buffer (of its registered type), holding every step added before the old
        process stopped, with the state of its last :func:`flush` when that still fits.
        A type checker sees :data:`replaybank.config.AnyBuffer`, as for :func:`load`.

    Raises:
        CheckpointError: No buffer at ``path`` (or ``path`` is a file), no config
            recorded for it, or its lane counters or links are damaged.
        ConfigError: ``storage`` given as an override, or a ``capacity`` or ``num_envs``
            override that differs from the files' (they fix the files' shape).
        ArgumentError: ``path`` is not a path (a str or ``os.PathLike``).

    Example:
        >>> import tempfile
        >>> import replaybank as rb
        >>> d = tempfile.mkdtemp()
        >>> _ = rb.ReplayBuffer(8, storage="memmap", path=d,
        ...                     spec={"obs": ((2,), "float32"), "action": ((), "int64")})
        >>> open(d, mode="r").spec["obs"].shape
        (2,)
    """
    path = directory(path, "open", "path")
    if not isinstance(mode, str) or mode not in ("r", "r+"):
        raise ArgumentError(f"open({path}, mode={describe(mode)}): expected 'r+' (read and "
                            "write) or 'r' (read only, beside a writer)")
    if "storage" in overrides:
        raise ConfigError(f"open({path}, storage=...): a reopened buffer keeps its files at "
                          f"{path}; drop the storage override (to copy the buffer elsewhere "
                          "or into memory, save() it and load() it, with path=new_dir for "
                          "new files)")
    backend = MemmapBackend(path, reopen=True, mode=mode)
    try:  # a failed open changes nothing: what the rebuild wrote is undone
        buf = _reopen(backend, path, trust_imports, overrides)
    except BaseException:
        backend.abort_open()
        raise
    backend.commit_open()
    return cast("AnyBuffer", buf)  # _reopen rebuilds a registered type (it is Resumable)


#: Config entries that fix the shape of a memmap buffer's files.
_FILE_SHAPE = ("capacity", "num_envs")


def _reopen(backend: MemmapBackend, path: Path, trust_imports: bool,
            overrides: dict[str, Any]) -> Resumable:
    """The body of :func:`open` once the files are locked and checked."""
    cfg = backend.owner_record()
    if cfg is None:
        why = backend.manifest.get("config_error")
        if why is None:  # no step was ever stored: a new buffer may take the path
            raise CheckpointError(
                f"the memmap buffer at {path} has no recorded config: it was built without "
                "spec= and nothing was ever added to it, so it holds no step and cannot be "
                f"rebuilt; build a new buffer there instead (rb.ReplayBuffer(..., "
                f"storage='memmap', path={str(path)!r}) takes the place of this empty one)")
        raise CheckpointError(f"the memmap buffer at {path} has no recorded config ({why}); "
                              "it cannot be rebuilt")
    for key in _FILE_SHAPE:
        if key in overrides and key in cfg and overrides[key] != cfg[key]:
            raise ConfigError(
                f"open({path}, {key}={describe(overrides[key])}): the files at {path} hold "
                f"a buffer of {key}={cfg[key]}, fixed when they were created; drop the {key} "
                f"override (for another {key}, build a new buffer and copy the steps you "
                "need into it)")
    cfg = {**cfg, "storage": "memmap", "path": str(backend.path), **overrides}
    from replaybank.config import from_config

    with names_from_file(str(backend.path), trust_imports):
        buf = from_config(cfg, storage=backend)
    if not isinstance(buf, Resumable):
        raise CheckpointError(f"{type(buf).__name__} cannot be reopened from memmap files")
    buf.reopened()
    _load_resume(buf, backend)
    return buf


def _load_resume(buf: Resumable, backend: DurableBackend) -> bool:
    """Restore the state of the last :func:`flush` when it fits (else warn)."""
    meta, _ = checkpoint_paths(backend.path, RESUME_PREFIX)
    current = buf.resume_state()
    if not meta.exists() or current is None:
        return False
    try:
        manifest, state = load_state(backend.path, RESUME_PREFIX)
    except CheckpointError as exc:
        return _skip(backend.path, f"its resume state cannot be read ({exc})")
    if manifest.get("kind") != _KIND or manifest.get("buffer_id") != backend.buffer_id:
        return _skip(backend.path, "its resume state belongs to another buffer")
    for name in COUNTERS:
        saved, now = np.asarray(state.get(name)), np.asarray(current[name])
        if saved.shape != now.shape or not np.array_equal(saved, now):
            return _skip(backend.path, "steps were added (or the buffer cleared) after its "
                                       "last flush()")
    try:
        buf.load_resume_state(state)  # checked first: a state that does not fit changes nothing
    except CheckpointError as exc:
        return _skip(backend.path, f"its resume state does not fit the buffer ({exc})")
    return True


def _skip(path: Path, why: str) -> bool:
    warnings.warn(
        f"memmap buffer at {path}: {why}; it continues with every stored step but a fresh "
        "generator and default sampler state (e.g. priorities). Call flush() after the "
        "last add (e.g. on a shutdown signal) to resume exactly",
        ResumeWarning, stacklevel=3,
    )
    return False
