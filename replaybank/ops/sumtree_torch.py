"""A binary sum tree (and min tree) in torch tensors: update and stratified search on the
device, with torch ops only and no value read back to the host.

Layout: ``tree[1]`` is the root, node ``i`` has children ``2i`` and ``2i + 1``, leaf ``s``
(slot ``s`` of ``cap`` leaves, ``cap`` a power of two) is node ``cap + s``; ``tree[0]``
is unused (a scratch node). Sums are float64, like the host tree
(:mod:`replaybank.ops.sumtree`); the min tree holds ``+inf`` for empty (zero) leaves, so
its root is the smallest positive priority.

* :func:`update` writes leaves (one ``index_copy_``) and recomputes the touched parents
  level by level (``depth`` gathers + ``index_copy_`` per tree, whatever the batch).
* :func:`find` descends all targets together, ``depth`` gathers: a target goes right when
  it is at least the left child's mass (or the left child is empty) and the right child
  has mass, so an empty leaf is never returned.

Example:
    >>> import torch
    >>> s, m = build(torch, torch.tensor([1.0, 0.0, 3.0]), 4)
    >>> float(s[1]), float(m[1])
    (4.0, 1.0)
    >>> find(torch, s, torch.tensor([0.5, 1.0, 3.9]), 2).tolist()
    [0, 2, 2]
    >>> update(torch, s, m, torch.tensor([1]), torch.tensor([4.0]), 2)
    >>> float(s[1]), find(torch, s, torch.tensor([1.5]), 2).tolist()
    (8.0, [1])
"""

from __future__ import annotations

from typing import Any

__all__ = ["build", "depth_of", "find", "update"]


def depth_of(n: int) -> tuple[int, int]:
    """``(cap, depth)``: leaves (the power of two >= ``n``, at least 2) and levels."""
    cap, depth = 2, 1
    while cap < n:
        cap *= 2
        depth += 1
    return cap, depth


def build(torch: Any, leaves: Any, cap: int) -> tuple[Any, Any]:
    """Sum and min trees ``[2 * cap]`` over ``leaves`` ``[n]`` (float64, n <= cap)."""
    dev = leaves.device
    s = torch.zeros(2 * cap, dtype=torch.float64, device=dev)
    m = torch.full((2 * cap,), float("inf"), dtype=torch.float64, device=dev)
    n = int(leaves.shape[0])
    lv = leaves.to(torch.float64)
    s[cap:cap + n] = lv
    m[cap:cap + n] = torch.where(lv > 0, lv, float("inf"))
    width = cap
    while width > 1:  # level by level: nodes [width // 2, width) from [width, 2 * width)
        lo = width // 2
        s[lo:width] = s[width:2 * width:2] + s[width + 1:2 * width:2]
        m[lo:width] = torch.minimum(m[width:2 * width:2], m[width + 1:2 * width:2])
        width = lo
    return s, m


def update(torch: Any, s: Any, m: Any, slots: Any, values: Any, depth: int) -> None:
    """Set leaves ``slots`` ``[k]`` (distinct) to ``values`` ``[k]`` and recompute their
    parents, in place."""
    cap = (s.shape[0]) // 2
    v = values.to(torch.float64)
    node = slots.to(torch.int64) + cap
    s.index_copy_(0, node, v)
    m.index_copy_(0, node, torch.where(v > 0, v, float("inf")))
    for _ in range(depth):  # parents of the touched nodes (duplicates write equal values)
        node = node // 2
        left, right = 2 * node, 2 * node + 1
        s.index_copy_(0, node, s.index_select(0, left) + s.index_select(0, right))
        m.index_copy_(0, node, torch.minimum(m.index_select(0, left), m.index_select(0, right)))


def find(torch: Any, s: Any, targets: Any, depth: int) -> Any:
    """Leaves at prefix masses ``targets`` ``[B]`` (float64, in ``[0, total)``): ``[B]``."""
    cap = (s.shape[0]) // 2
    node = torch.ones_like(targets, dtype=torch.int64)
    t = targets.to(torch.float64)
    for _ in range(depth):
        left = s.index_select(0, 2 * node)
        right = s.index_select(0, 2 * node + 1)
        go = ((t >= left) | (left <= 0)) & (right > 0)
        t = torch.where(go, t - left, t)
        node = 2 * node + go.to(torch.int64)
    return node - cap
