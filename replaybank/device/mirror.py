"""The device mirror: the bookkeeping a device-side sampler needs, copied to the device.

Device storage (torch tensors on a GPU) keeps its bookkeeping (lane counters ``written``
and ``counts``, the next-observation ``link`` of every slot; see
:mod:`replaybank.storage.table`) in host numpy, where the writer's index arithmetic runs.
The CUDA graph of :meth:`DevicePath.sample_fn <replaybank.device.path.DevicePath.sample_fn>`
draws its keys and patches next observations on the device, from values no launch may take
from the host, so it needs the same bookkeeping on the device (the eager ``sample`` reads
the host's). :class:`DeviceMirror` holds it there and brings it up to date before each
``sample_fn`` call with one host-to-device copy of what changed since (never a
device-to-host copy):

* a write advances ``written``; it changes links only in the rows it wrote and in the row
  before them (the previous newest step is relinked), so per lane the rows
  ``[old written - 1, new written)`` are copied (all rows when that spans the ring);
* a clear or a state load changes links without a write: the table's ``epoch`` moves and
  the whole link array is copied once.

Every tensor is updated in place, so a CUDA graph captured over them stays valid.

Example:
    >>> import numpy as np, torch
    >>> from replaybank.spec import Spec
    >>> from replaybank.storage.table import StepTable
    >>> from replaybank.storage.writers.reference import write
    >>> spec = Spec.coerce({"obs": ((), "float32"), "terminated": ((), "bool"),
    ...                     "truncated": ((), "bool")})
    >>> t = StepTable(spec, T=4, lanes=1, obs_fields=["obs"])
    >>> m = DeviceMirror(torch, torch.device("cpu"), t)
    >>> no = np.zeros((3, 1), bool)
    >>> _ = write(t, np.array([0]), {"obs": np.zeros((3, 1), np.float32),
    ...           "terminated": no, "truncated": no}, {"obs": np.zeros((3, 1), np.float32)})
    >>> m.sync(t)
    >>> m.written.tolist(), m.counts.tolist(), m.link.tolist() == t.link.reshape(-1).tolist()
    ([3], [3], True)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybank.storage.table import StepTable

__all__ = ["DeviceMirror"]


class DeviceMirror:
    """``written``/``counts`` ``[lanes]`` (int64) and ``link`` ``[T * lanes]`` (int64: the
    gather indexes with it as it is) of a
    step table, as tensors on ``device``, kept current by :meth:`sync`.

    Args:
        torch: The torch module.
        device: The ``torch.device`` of the storage.
        table: The step table mirrored.
    """

    def __init__(self, torch: Any, device: Any, table: StepTable) -> None:
        self.torch = torch
        self.device = device
        lanes = table.lanes
        self.written = torch.zeros(lanes, dtype=torch.int64, device=device)
        self.counts = torch.zeros(lanes, dtype=torch.int64, device=device)
        self.link = torch.zeros(table.T * lanes, dtype=torch.int64, device=device)
        self._epoch = -1  # the table epoch mirrored (-1: nothing yet)
        self._written = np.zeros(lanes, dtype=np.int64)
        self._counts = np.zeros(lanes, dtype=np.int64)

    def _upload(self, host: np.ndarray[Any, Any]) -> Any:
        """One host-to-device copy of an int64 array."""
        return self.torch.from_numpy(host).to(self.device, non_blocking=True)

    def sync(self, table: StepTable) -> None:
        """Copy what changed in ``table``'s bookkeeping since the last call (host to
        device only; nothing when nothing changed)."""
        written, counts = table.written, table.counts
        if table.epoch == self._epoch and written.tobytes() == self._written.tobytes() \
                and counts.tobytes() == self._counts.tobytes():
            return  # no write since (a bytes compare: ~20x cheaper than np.array_equal)
        lanes = table.lanes
        if table.epoch != self._epoch:
            link = table.link.reshape(-1).astype(np.int64)
            dev = self._upload(np.concatenate([written, counts, link]))
            self.link.copy_(dev[2 * lanes:])
        else:
            T = table.T  # noqa: N806
            idx = []
            for lane in np.flatnonzero(written != self._written).tolist():
                lo, hi = int(self._written[lane]) - 1, int(written[lane])
                seq = np.arange(max(lo, hi - T), hi, dtype=np.int64)  # [k] rows changed
                idx.append(seq % T * lanes + lane)
            slots = np.concatenate(idx) if idx else np.zeros(0, dtype=np.int64)
            vals = table.link.reshape(-1)[slots].astype(np.int64)
            dev = self._upload(np.concatenate([written, counts, slots, vals]))
            k = len(slots)
            if k:
                self.link.index_copy_(0, dev[2 * lanes:2 * lanes + k], dev[2 * lanes + k:])
        self.written.copy_(dev[:lanes])
        self.counts.copy_(dev[lanes:2 * lanes])
        self._epoch = table.epoch
        self._written = written.copy()
        self._counts = counts.copy()
