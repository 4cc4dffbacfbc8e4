"""Uniform draws on the device: item keys and storage slots from device lane counters.

The device twin of :class:`~replaybank.samplers.uniform.UniformSampler` for device storage
(see :mod:`replaybank.device.path`). Every step live in some lane is drawn with the
same probability ``1 / size``, as the host sampler draws them, but from a
``torch.Generator`` on the device: the same distribution, not the same keys. Only torch
ops on device tensors, with no value read back to the host, so the draw queues on the
device and can be captured in a CUDA graph (the live count stays a device tensor).

Keys are ``seq * lanes + lane`` and slots ``(seq mod T) * lanes + lane``
(:mod:`replaybank.ops.ring`); lane ``l`` holds the sequence numbers
``[written[l] - counts[l], written[l])``.

Example:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> written, counts = torch.tensor([7, 2]), torch.tensor([4, 2])  # T = 4, 2 lanes
    >>> keys, slots = uniform_keys(torch, g, written, counts, 4, 1000)
    >>> seq, lane = keys // 2, keys % 2
    >>> bool(((lane == 0) & (seq >= 3) & (seq < 7) | (lane == 1) & (seq < 2)).all())
    True
    >>> bool((slots == seq % 4 * 2 + lane).all())
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["lane_keys", "lockstep_keys", "uniform_keys"]


def lockstep_keys(torch: Any, generator: Any, device: Any, written: np.ndarray[Any, Any],
                  counts: np.ndarray[Any, Any], batch_size: int) -> Any:
    """``batch_size`` keys drawn uniformly over the live steps in one kernel, from the
    host's lane counters, when every lane holds the same steps; None otherwise.

    Lanes that all wrote ``w`` steps and keep the last ``c`` hold exactly the keys
    ``[(w - c) * lanes, w * lanes)`` (a key is ``seq * lanes + lane``), so one
    ``torch.randint`` over that range is the uniform draw: the common case (one lane, or
    vector envs stepping together). Eager calls only: a CUDA graph must read the counters
    on the device (:func:`uniform_keys`), since the host values are baked into the launch.

    Args:
        torch: The torch module.
        generator: A ``torch.Generator`` on ``device``.
        device: Where the keys go.
        written: Steps ever written per lane, ``[lanes]`` int64 (host).
        counts: Live steps per lane, ``[lanes]`` int64 (host; at least one live step).
        batch_size: Keys ``B``.

    Returns:
        ``[B]`` int64 keys on ``device``, or None (lanes of unequal steps).

    Example:
        >>> import numpy as np, torch
        >>> g = torch.Generator().manual_seed(0)
        >>> keys = lockstep_keys(torch, g, torch.device("cpu"), np.array([7, 7]),
        ...                      np.array([4, 4]), 1000)
        >>> int(keys.min()), int(keys.max())  # seq 3..6 of both lanes: keys 6..13
        (6, 13)
        >>> lockstep_keys(torch, g, torch.device("cpu"), np.array([7, 2]),
        ...               np.array([4, 2]), 8) is None
        True
    """
    lanes = len(written)
    w, c = int(written[0]), int(counts[0])
    if lanes > 1 and not ((written == w).all() and (counts == c).all()):
        return None
    return torch.randint((w - c) * lanes, w * lanes, (batch_size,), generator=generator,
                         device=device)


def lane_keys(torch: Any, generator: Any, total: int, cum: Any, key_base: Any,
              batch_size: int) -> Any:
    """``batch_size`` keys drawn uniformly over the live steps of lanes holding different
    steps, in four kernels: the host's live count, the device's lane tables.

    Draw ``u`` uniform in ``[0, total)``; its lane ``l`` is the first whose running count
    ``cum[l]`` exceeds ``u``, its sequence number ``written[l] - cum[l] + u``, so its key
    ``(written[l] - cum[l]) * lanes + l + u * lanes = key_base[l] + u * lanes``. Eager
    calls only (``total`` is a host int baked into the launch).

    Args:
        torch: The torch module.
        generator: A ``torch.Generator`` on the tables' device.
        total: Live steps (host int, > 0).
        cum: ``[lanes]`` int64 running live counts on the device.
        key_base: ``[lanes]`` int64 on the device, ``(written - cum) * lanes + lane``.
        batch_size: Keys ``B``.

    Returns:
        ``[B]`` int64 keys on the tables' device.

    Example:
        >>> import numpy as np, torch
        >>> written, counts = np.array([7, 2]), np.array([4, 2])  # T = 4, 2 lanes
        >>> cum = np.cumsum(counts)
        >>> base = (written - cum) * 2 + np.arange(2)
        >>> keys = lane_keys(torch, torch.Generator().manual_seed(0), 6,
        ...                  torch.from_numpy(cum), torch.from_numpy(base), 1000)
        >>> seq, lane = keys // 2, keys % 2
        >>> bool(((lane == 0) & (seq >= 3) & (seq < 7) | (lane == 1) & (seq < 2)).all())
        True
    """
    lanes = int(cum.shape[0])
    u = torch.randint(0, total, (batch_size,), generator=generator, device=cum.device)
    lane = torch.searchsorted(cum, u, right=True)
    return torch.add(key_base.index_select(0, lane), u, alpha=lanes)


def uniform_keys(torch: Any, generator: Any, written: Any, counts: Any, T: int,  # noqa: N803
                 batch_size: int) -> tuple[Any, Any]:
    """``batch_size`` keys drawn uniformly over the live steps, with their slots.

    Args:
        torch: The torch module.
        generator: A ``torch.Generator`` on the counters' device.
        written: Steps ever written per lane, ``[lanes]`` int64 on the device.
        counts: Live steps per lane, ``[lanes]`` int64 (their sum must be > 0: checked on
            the host by the caller, who knows the size).
        T: Rows per lane.
        batch_size: Keys ``B``.

    Returns:
        ``(keys [B], slots [B])``, int64 tensors on the device.
    """
    lanes = int(written.shape[0])
    total = counts.sum()
    u = torch.rand(batch_size, generator=generator, device=counts.device,
                   dtype=torch.float64)
    u = torch.minimum((u * total).to(torch.int64), total - 1)  # [B] in [0, size)
    if lanes == 1:
        seq = written - counts + u  # [B]
        return seq, seq % T
    cum = counts.cumsum(0)  # [lanes]
    lane = torch.searchsorted(cum, u, right=True)  # [B]
    # lane l holds draws [cum[l] - counts[l], cum[l]): seq = written[l] - counts[l] + offset
    seq = (written - cum).index_select(0, lane) + u
    return seq * lanes + lane, seq % T * lanes + lane
