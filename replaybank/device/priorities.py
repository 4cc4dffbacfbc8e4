"""Prioritized draws on the device: a device sum tree mirroring a :class:`PrioritizedSampler`.

For device storage (:mod:`replaybank.device.path`) the buffer's
:class:`~replaybank.samplers.prioritized.PrioritizedSampler` stays the record of every
priority (its host tree takes writes, ``update_priorities``, checkpoints and the host
paths: sequences, ``replace=False``). :class:`DevicePriorities` keeps a copy of its stored
priorities in a wide device sum tree and min tree (:mod:`replaybank.device.sumtree`:
fanout 1024 on CUDA, so a draw or an update of 1M slots is about a dozen kernels) and
draws from it:

* before a draw, :meth:`DevicePriorities.sync` brings the device tree up to date with one
  host-to-device copy: the slots writes touched since the last draw (per lane the rows
  ``[old written, new written)``) and the slots ``update_priorities`` changed
  (:meth:`DevicePriorities.touch`), with their stored priorities read from the host tree;
  a clear, a state load or a new sampler rebuilds the whole tree once;
* the draw is stratified like the host sampler's: ``B`` equal segments of the total mass,
  one uniform target in each (from the device generator), a vectorised descent; the
  probabilities ``P(i) = p_i / total`` and the importance weights are the host
  sampler's, computed by the same function on device tensors
  (:func:`~replaybank.samplers.prioritized.importance_weights`; ``weight_norm``:
  ``(p_i / p_min) ** -beta``, the batch-max ratio, or ``(N * P(i)) ** -beta``; clamped to
  ``[2**-126, float32 max]``), with ``beta`` from the sampler's schedule, which the call
  advances as a host sample does.

Same probabilities and weights as the host sampler for the same stored priorities; the
keys follow the same distribution, drawn by another generator (not the same keys).
``update_priorities`` itself runs on the host (its checks raise errors there: one
device-to-host transfer of the tensors, :func:`~replaybank.buffers.priorities.to_host`);
the device tree takes the new values at the next draw.

Example:
    >>> import numpy as np, torch
    >>> from replaybank.samplers.base import LaneView
    >>> from replaybank.samplers.prioritized import PrioritizedSampler
    >>> ps = PrioritizedSampler(alpha=1.0, eps=0.0)
    >>> ps.bind(4, 1)
    >>> ps.on_write(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]))
    >>> lanes = LaneView(4, 1, np.array([4]), np.array([4]))
    >>> dp = DevicePriorities(torch, torch.device("cpu"))
    >>> dp.sync(ps, lanes, epoch=0)
    >>> float(dp.tree.total())
    10.0
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaybank.device.sumtree import TorchSumTree, fanout_for
from replaybank.samplers.base import LaneView
from replaybank.samplers.prioritized import PrioritizedSampler, importance_weights

__all__ = ["DevicePriorities"]


class DevicePriorities:
    """The device sum/min tree of a :class:`PrioritizedSampler` and its draws.

    Args:
        torch: The torch module.
        device: The storage's ``torch.device``.
    """

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch = torch
        self.device = device
        self.tree: TorchSumTree | None = None
        self._source: tuple[int, int] | None = None  # (id of the sampler, table epoch)
        self._written: np.ndarray[Any, Any] | None = None
        self._touched: list[np.ndarray[Any, Any]] = []
        self._strata: dict[int, Any] = {}  # batch size -> arange(B) on the device

    def touch(self, slots: np.ndarray[Any, Any]) -> None:
        """The host sampler's priorities of ``slots`` changed (an update): copy them at
        the next :meth:`sync`."""
        self._touched.append(np.asarray(slots, dtype=np.int64).reshape(-1))

    def sync(self, sampler: PrioritizedSampler, lanes: LaneView, epoch: int) -> None:
        """Bring the device trees up to date with ``sampler`` (host to device only)."""
        torch = self.torch
        n = lanes.T * lanes.lanes
        if self._source != (id(sampler), epoch) or self.tree is None:
            leaves = sampler.priorities(np.arange(n))
            self.tree = TorchSumTree(
                torch, torch.from_numpy(np.ascontiguousarray(leaves)).to(self.device),
                fanout_for(self.device))
            self._source = (id(sampler), epoch)
            self._written = lanes.written.copy()
            self._touched = []
            return
        parts = self._touched
        prev = self._written
        assert prev is not None
        T, L = lanes.T, lanes.lanes  # noqa: N806
        for lane in np.flatnonzero(lanes.written != prev).tolist():
            seq = np.arange(max(int(prev[lane]), int(lanes.written[lane]) - T),
                            int(lanes.written[lane]), dtype=np.int64)
            parts.append(seq % T * L + lane)
        if not parts:
            return
        slots = np.unique(np.concatenate(parts))
        vals = sampler.priorities(slots)
        dev = torch.from_numpy(np.concatenate([slots, vals.view(np.int64)])).to(
            self.device, non_blocking=True)  # one copy: slots, then the values' bits
        k = len(slots)
        assert self.tree is not None
        self.tree.update(dev[:k], dev[k:].view(torch.float64))
        self._written = lanes.written.copy()
        self._touched = []

    def draw(self, sampler: PrioritizedSampler, generator: Any, lanes: LaneView, written: Any,
             batch_size: int, beta: float) -> tuple[Any, Any, Any, Any]:
        """Stratified draws: ``(keys, slots, probabilities float64, weights float32)``,
        each ``[B]`` on the device (``lanes``: the host's lane counters; ``written``: their
        device copy, read when the lanes hold different steps)."""
        torch = self.torch
        tree = self.tree
        assert tree is not None
        total = tree.total()
        u = torch.rand(batch_size, generator=generator, device=self.device,
                       dtype=torch.float64)
        strata = self._strata.get(batch_size)
        if strata is None:
            strata = self._strata[batch_size] = torch.arange(
                batch_size, device=self.device, dtype=torch.float64)
        targets = (strata + u) * (total / batch_size)
        slots = tree.find(targets)  # [B]
        p = tree.leaves(slots)  # [B] stored priorities
        probs = p / total
        p_min = tree.min_positive() if sampler.weight_norm == "buffer" else None
        w = importance_weights(p, p_min, beta, sampler.weight_norm,
                               float(lanes.counts.sum()), total).to(torch.float32)
        return self._keys(slots, lanes, written), slots, probs, w

    def _keys(self, slots: Any, lanes: LaneView, written: Any) -> Any:
        """The item keys of drawn ``slots`` ``[B]``: the live step each slot holds."""
        torch, L, T = self.torch, lanes.lanes, lanes.T  # noqa: N806
        host = lanes.written
        if L == 1 or bool((host == host[0]).all()):
            # every lane's newest step is `last`: the step at row r is
            # r + T * floor((last - r) / T), so key = slot + L * T * floor((last - r) / T)
            last = int(host[0]) - 1
            row = slots if L == 1 else torch.div(slots, L, rounding_mode="floor")
            return torch.add(slots, torch.div(last - row, T, rounding_mode="floor"),
                             alpha=L * T)
        lane = slots % L
        row = slots // L
        newest = written.index_select(0, lane) - 1  # the lane's newest sequence number
        seq = newest - (newest - row) % T  # the live step stored at this row
        return seq * L + lane
