"""Uniform draws on the device: item keys and storage slots from device lane counters.

The device twin of :class:`~replaybank.samplers.uniform.UniformSampler` for the CUDA graph
of :meth:`DevicePath.sample_fn <replaybank.device.path.DevicePath.sample_fn>` (the eager
``sample`` draws on the host). Every step live in some lane is drawn with the same
probability ``1 / size``, as the host sampler draws them, but from a ``torch.Generator``
on the device: the same distribution, not the same keys. Only torch ops on device
tensors, with no value read back to the host, so the draw can be captured in a CUDA graph
(the live count stays a device tensor).

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

__all__ = ["uniform_keys"]


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
