"""Prefetch: the next batches sampled in a background thread and staged for the device.

A training loop that keeps its buffer in host memory (numpy or memmap storage) pays for
``sample`` and for the host-to-device copy before every step. :class:`Prefetcher` runs
``sample`` in one background thread, ``depth`` batches ahead, packs each batch's numpy
fields into one byte buffer (:class:`~replaybank.transfer.PackedLayout`; pinned host
memory when the target is a CUDA device and CUDA is available) and, when the loop asks
for it, starts one ``non_blocking=True`` copy of that buffer to the device and hands
out each field as a view of the copy, so the step's wait is a queue ``get`` plus one
copy launch (a copy per field cost 13 to 20 us of host time each on a GPU machine). For
the CPU the arrays are wrapped as tensors without a copy, and tensor fields (device
storage) are handed over as they are.

* Order: one thread calls ``sample`` in sequence, so the batches are exactly those of
  calling ``sample`` in a loop from the same state (nothing else sampling meanwhile).
* Errors: an exception raised by ``sample`` in the thread is raised again by the
  ``next()`` that would have returned its batch; the thread stops.
* Shutdown: :meth:`Prefetcher.close` (or leaving the ``with`` block) stops the thread
  and waits for it; it is idempotent. ``next()`` after ``close()`` raises StopIteration.
* Pinned buffers are reused: ``depth + 2`` sets rotate, and a set is refilled only after
  the device copy that read it has completed (an event per set). Elsewhere each batch
  gets a new buffer: on the CPU the fields handed out are views of it.
* The thread starts a sample only when fewer than ``depth`` batches are ready, and
  ``next()`` makes room as its last step, so the thread never wakes while ``next()``
  runs: the thread's sampling holds the GIL, and overlapping it would add to the wait.

torch is imported when a prefetcher is built (the ``torch`` extra), never at module
import.

Example:
    >>> import numpy as np, replaybank as rb
    >>> buf = rb.ReplayBuffer(64, seed=0)
    >>> for t in range(10):
    ...     buf.add(obs=np.full(2, t, np.float32), action=0, reward=1.0,
    ...             next_obs=np.full(2, t + 1, np.float32), terminated=False,
    ...             truncated=False)
    >>> with buf.prefetcher(4, device="cpu") as pf:
    ...     b = next(pf)
    >>> type(b.obs).__name__, tuple(b.obs.shape)
    ('Tensor', (4, 2))
"""

from __future__ import annotations

import contextlib
import queue
import threading
import typing
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, overload

import numpy as np

from replaybank.batch import Batch, SequenceBatch, torch_device
from replaybank.errors import ConfigError, require_extra
from replaybank.transfer import StagingBuffer

if TYPE_CHECKING:  # torch is imported when a prefetcher is built
    import torch
    from typing_extensions import TypeVar

    #: What ``next()`` returns: the sampled batch type with torch tensor fields.
    B = TypeVar("B", default=Any)
else:
    B = typing.TypeVar("B")

__all__ = ["Prefetcher"]

_STOP = object()


class Prefetcher(Generic[B]):
    """Batches from ``sample()`` prepared ``depth`` ahead in a thread, moved to ``device``.

    Args:
        sample: Returns the next batch (a :class:`~replaybank.batch.Batch` or
            :class:`~replaybank.batch.SequenceBatch` of numpy arrays or tensors).
        device: Where the batches go (``"cuda"``, ``"cpu"``, a ``torch.device``).
        depth: Batches sampled ahead (a positive int).

    Attributes:
        pinned: Whether batches are staged in pinned host memory (CUDA target only).

    Raises:
        ConfigError: ``depth`` is not a positive int, or ``device`` is not available.
        MissingDependencyError: torch is not installed.
    """

    # a type checker reads what next() returns from what sample returns: a Batch or
    # SequenceBatch of any values comes back with torch tensor fields
    @overload
    def __init__(self: Prefetcher[Batch[torch.Tensor]], sample: Callable[[], Batch[Any]],
                 device: Any = "cuda", depth: int = 2) -> None: ...

    @overload
    def __init__(self: Prefetcher[SequenceBatch[torch.Tensor]],
                 sample: Callable[[], SequenceBatch[Any]], device: Any = "cuda",
                 depth: int = 2) -> None: ...

    @overload
    def __init__(self: Prefetcher[Any], sample: Callable[[], Any], device: Any = "cuda",
                 depth: int = 2) -> None: ...

    def __init__(self, sample: Callable[[], Any], device: Any = "cuda", depth: int = 2) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ConfigError(f"prefetcher(depth={depth!r}): must be a positive int "
                              "(batches sampled ahead); pass e.g. depth=2")
        torch = require_extra("torch", "torch")
        self.torch = torch
        self.device = torch_device(torch, device, "prefetcher")
        self.pinned = bool(self.device.type == "cuda" and torch.cuda.is_available())
        # numpy fields travel packed when they are copied to another device; to the CPU
        # they are wrapped without a copy (a view per field would cost more than a wrap)
        self._packs = self.device.type != "cpu"
        self._sample = sample
        # the thread samples a batch only after taking a unit of room, which next()
        # gives back as its last step: it never wakes (and takes the GIL) while next()
        # runs, so a step's wait is next()'s own work, not part of the next sample
        self._room = threading.Semaphore(depth)
        self._ready: queue.Queue[Any] = queue.Queue()  # bounded by the room: <= depth
        n_sets = depth + 2  # queued + the one being filled + the one being copied
        self._free: queue.Queue[int] = queue.Queue()
        for k in range(n_sets):
            self._free.put(k)
        self._sets: list[dict[str, Any]] = [{} for _ in range(n_sets)]
        self._staging = [StagingBuffer(torch, self.pinned) for _ in range(n_sets)]
        self._events: list[Any] = [None] * n_sets
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="replaybank-prefetch",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the thread
    def _stage(self, k: int, batch: Any) -> Any:
        """``batch``'s fields ready for the device: ``(layout, buffer)`` packed into set
        ``k``'s staging buffer (for another device, when every field has a layout), else
        a dict of tensors (numpy arrays copied into pinned set ``k`` on CUDA or wrapped
        without a copy; tensors kept)."""
        packed = self._staging[k].pack(batch) if self._packs else None
        if packed is not None:
            return packed
        torch = self.torch
        out: dict[str, Any] = {}
        pinned = self._sets[k]
        for name, value in batch.items():
            if isinstance(value, torch.Tensor):
                out[name] = value
                continue
            arr = np.asarray(value)
            if not self.pinned:
                if not arr.flags.writeable or not arr.flags.c_contiguous:
                    arr = np.array(arr, order="C")
                out[name] = torch.from_numpy(arr)
                continue
            host = pinned.get(name)  # pragma: no cover - needs CUDA
            if host is None or tuple(host.shape) != arr.shape \
                    or host.numpy().dtype != arr.dtype:  # pragma: no cover - needs CUDA
                host = pinned[name] = torch.from_numpy(np.empty_like(arr)).pin_memory()
            host.numpy()[...] = arr  # pragma: no cover - needs CUDA
            out[name] = host  # pragma: no cover - needs CUDA
        return out

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._room.acquire()
                k = self._free.get()
                if k < 0 or self._stop.is_set():
                    return
                event = self._events[k]
                if event is not None:  # pragma: no cover - needs CUDA
                    event.synchronize()  # the copy that read set k is done
                batch = self._sample()
                self._put((k, type(batch), self._stage(k, batch)))
        except BaseException as exc:  # re-raised by next()
            self._put(exc)

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self._ready.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    # ------------------------------------------------------------------ the loop
    def __iter__(self) -> Iterator[B]:
        return self

    def __next__(self) -> B:
        """The next batch, its fields on the device (copies queued with non_blocking)."""
        if self._closed:
            raise StopIteration
        item = self._ready.get()
        if isinstance(item, BaseException):
            self.close()
            raise item
        k, kind, fields = item
        torch = self.torch
        try:
            if isinstance(fields, tuple):  # packed: one copy, a view per field
                layout, buf = fields
                out = layout.unpack(buf.to(self.device, non_blocking=True))
            else:
                out = {name: t.to(self.device, non_blocking=True)
                       for name, t in fields.items()}
            if self.pinned:  # pragma: no cover - needs CUDA
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(self.device))
                self._events[k] = event
            batch: B = kind(out)
        finally:  # set k goes back, and the thread may sample again: last, even on error
            self._free.put(k)
            self._room.release()
        return batch

    def close(self) -> None:
        """Stop the thread and wait for it (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._room.release()  # a thread waiting for room wakes and sees the stop
        self._free.put(-1)
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):  # unblock a thread waiting to queue
                self._ready.get_nowait()
            self._thread.join(timeout=0.05)

    def __enter__(self) -> Prefetcher[B]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Prefetcher(device={str(self.device)!r}, depth={self._ready.maxsize}, "
                f"pinned={self.pinned})")
