"""A wide sum tree (and min tree) in torch tensors: update and stratified search on the
device, with torch ops only and no value read back to the host.

On a GPU every torch op is a kernel launch (several microseconds each), so the tree is
wide and shallow rather than binary: each node sums ``fanout`` children (1024 on CUDA,
where 1M leaves need two levels: a search is about a dozen kernels and an update about
half a dozen, whatever the batch; a binary tree needs ``log2(n)`` levels of several ops
each). Level 0 holds the leaves; level ``j + 1`` holds the sums of the ``fanout``-blocks
of level ``j``; every level but the top is padded with zeros to a multiple of
``fanout``, so ``level.view(-1, fanout)`` are its blocks, and the top has at most
``fanout`` nodes. Sums are float64, like the host tree (:mod:`replaybank.ops.sumtree`).
The min tree holds, above the leaves, the smallest *positive* leaf below each node
(``+inf`` where none), so its top gives the smallest positive priority.

* :meth:`TorchSumTree.update` writes leaves (one ``index_copy_``) and recomputes the
  blocks above them (per level: one block gather, a row sum and a row min, two
  ``index_copy_``; duplicate blocks write equal values).
* :meth:`TorchSumTree.find` descends all targets together: per level, the cumulative sums
  of each target's block and one batched ``searchsorted`` (the first child whose running
  mass exceeds the target; a zero child never is, since it adds nothing to the running
  mass). A target at or past its block's mass (float rounding) takes the block's last
  positive child, and negative remainders are clamped to 0, so an empty leaf is never
  returned while the tree holds mass.

Example:
    >>> import torch
    >>> t = TorchSumTree(torch, torch.tensor([1.0, 0.0, 3.0]), fanout=2)
    >>> float(t.total()), float(t.min_positive())
    (4.0, 1.0)
    >>> t.find(torch.tensor([0.5, 1.0, 3.9], dtype=torch.float64)).tolist()
    [0, 2, 2]
    >>> t.update(torch.tensor([1]), torch.tensor([4.0]))
    >>> float(t.total()), t.find(torch.tensor([1.5], dtype=torch.float64)).tolist()
    (8.0, [1])
"""

from __future__ import annotations

from typing import Any

__all__ = ["TorchSumTree", "fanout_for"]


def fanout_for(device: Any) -> int:
    """The fanout for ``device``: 1024 on CUDA (fewest kernels), 64 elsewhere (a CPU
    pays for the ``[B, fanout]`` blocks it scans, not for launches).

    Example:
        >>> import torch
        >>> fanout_for(torch.device("cpu"))
        64
    """
    return 1024 if getattr(device, "type", None) == "cuda" else 64


def _padded(n: int, fanout: int) -> int:
    return -(-n // fanout) * fanout


class TorchSumTree:
    """Sum and min trees over ``n`` leaves on ``leaves.device``.

    Args:
        torch: The torch module.
        leaves: ``[n]`` non-negative leaf values (any float dtype; stored as float64).
        fanout: Children per node (at least 2).

    Attributes:
        n: Leaves.
        sums: The sum levels, leaves first (``sums[-1]``: the top, at most ``fanout``
            nodes).
        mins: The min levels above the leaves (``mins[j]`` beside ``sums[j + 1]``).
    """

    def __init__(self, torch: Any, leaves: Any, fanout: int) -> None:
        if fanout < 2:
            raise ValueError(f"TorchSumTree(fanout={fanout}): at least 2")
        self.torch, self.fanout = torch, int(fanout)
        self.n = n = int(leaves.shape[0])
        dev = leaves.device
        size = max(n, 1)
        base = torch.zeros(_padded(size, fanout) if size > fanout else size,
                           dtype=torch.float64, device=dev)
        base[:n] = leaves.to(torch.float64)
        self.sums: list[Any] = [base]
        self.mins: list[Any] = []
        while self.sums[-1].shape[0] > fanout:
            below = self.sums[-1].view(-1, fanout)
            parents = below.shape[0]
            size = _padded(parents, fanout) if parents > fanout else parents
            s = torch.zeros(size, dtype=torch.float64, device=dev)
            m = torch.full((size,), float("inf"), dtype=torch.float64, device=dev)
            s[:parents] = below.sum(1)
            level = len(self.sums) - 1  # the leaves' blocks, or the min level's
            m[:parents] = self._block_min(0, below) if level == 0 \
                else self._block_min(level, self.mins[level - 1].view(-1, fanout))
            self.sums.append(s)
            self.mins.append(m)

    def _block_min(self, level: int, blocks: Any) -> Any:
        """Row minimum of ``blocks`` ``[k, fanout]`` of sum level ``level``: the smallest
        positive leaf (leaves) or the children's minimum (min levels)."""
        torch = self.torch
        if level == 0:
            return torch.where(blocks > 0, blocks, float("inf")).amin(1)
        return blocks.amin(1)

    def total(self) -> Any:
        """The sum of every leaf, a 0-d float64 tensor on the device."""
        return self.sums[-1].sum()

    def min_positive(self) -> Any:
        """The smallest positive leaf (``inf`` when none), a 0-d tensor on the device."""
        if self.mins:
            return self.mins[-1].amin()
        leaves = self.sums[0]  # one level: the leaves themselves
        return self.torch.where(leaves > 0, leaves, float("inf")).amin()

    def leaves(self, slots: Any) -> Any:
        """The leaf values at ``slots`` ``[k]`` (float64, on the device)."""
        return self.sums[0].index_select(0, slots)

    def update(self, slots: Any, values: Any) -> None:
        """Set leaves ``slots`` ``[k]`` (distinct) to ``values`` ``[k]``; recompute the
        blocks above them, in place."""
        torch, f = self.torch, self.fanout
        node = slots.to(torch.int64)
        self.sums[0].index_copy_(0, node, values.to(torch.float64))
        for j in range(1, len(self.sums)):
            node = torch.div(node, f, rounding_mode="floor")
            blocks = self.sums[j - 1].view(-1, f).index_select(0, node)  # [k, f]
            self.sums[j].index_copy_(0, node, blocks.sum(1))
            if j == 1:
                mins = self._block_min(0, blocks)
            else:
                mins = self._block_min(j - 1, self.mins[j - 2].view(-1, f)
                                       .index_select(0, node))
            self.mins[j - 1].index_copy_(0, node, mins)

    def find(self, targets: Any) -> Any:
        """Leaves at prefix masses ``targets`` ``[B]`` (float64, in ``[0, total)``): ``[B]``
        int64, each the first leaf whose running mass exceeds its target."""
        torch = self.torch
        t = targets.to(torch.float64).clamp_min(0.0)
        top = self.sums[-1]  # one row for every target: one cumsum, one search
        c = top.cumsum(0)
        idx = torch.minimum(torch.searchsorted(c, t, right=True),
                            torch.searchsorted(c, c[-1:], right=False))
        t = (t - (c - top).index_select(0, idx)).clamp_min(0.0)
        for j in range(len(self.sums) - 2, -1, -1):
            blocks = self.sums[j].view(-1, self.fanout).index_select(0, idx)  # [B, f]
            k, t = self._pick(blocks, t)
            idx = torch.add(k, idx, alpha=self.fanout)  # idx * fanout + k, one kernel
        return idx

    def _pick(self, rows: Any, t: Any) -> tuple[Any, Any]:
        """Per row of ``rows`` ``[B, w]``: the first entry whose running sum exceeds
        ``t`` ``[B]`` (at most the row's last positive entry), and what remains of
        ``t`` past the entries before it."""
        torch = self.torch
        c = rows.cumsum(1)  # [B, w], non-decreasing
        k = torch.searchsorted(c, t.unsqueeze(1), right=True)  # [B, 1]
        last = torch.searchsorted(c, c[:, -1:].contiguous(), right=False)  # last positive
        k = torch.minimum(k, last)
        before = (c - rows).gather(1, k)  # running sum before entry k
        return k.squeeze(1), (t - before.squeeze(1)).clamp_min(0.0)
