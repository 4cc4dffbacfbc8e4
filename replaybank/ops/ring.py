"""Pure ring arithmetic for lane-major replay storage.

Storage is ``[T, lanes, ...]``. Every step written to lane ``l`` gets a lane-local
sequence number ``s = 0, 1, 2, ...`` that never repeats (not even after ``clear``); it
lives at row ``s % T``. A lane has written ``written[l]`` steps in total and holds the
last ``counts[l]`` of them, so its live sequence numbers are
``[written[l] - counts[l], written[l])``. A step table also records ``cleared[l]``, the
``written[l]`` of the lane's last ``clear`` (0 when never cleared): the steps below it
do not exist for history lookups (frame stacks pad there, as before a lane's first step).

Two integer names for a stored step:

* **slot** ``= row * lanes + lane``: where it lives in storage (``[0, T * lanes)``).
* **index** (item key) ``= s * lanes + lane``: unique for the lifetime of the buffer.
  ``batch.indices`` are keys, so a key whose step was overwritten is detectably stale.
  Before the ring wraps, keys equal slots.

Every function here is pure and vectorised over numpy arrays; :func:`uniform_keys` and
:func:`key_to_slot`, on every sample's path, run as one C pass where the C kernels are
built (``replaybank._sampling``; these numpy bodies are their oracles).

Example:
    >>> import numpy as np
    >>> written, counts = np.array([5, 3]), np.array([4, 3])
    >>> slots = np.array([0, 1, 2])
    >>> keys = slot_to_key(slots, written, counts, T=4)
    >>> keys.tolist()
    [8, 1, 2]
    >>> key_to_slot(keys, T=4, lanes=2).tolist()
    [0, 1, 2]
    >>> is_live(keys, written, counts).tolist()
    [True, True, True]
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops.jit import pick_kernel

__all__ = [
    "is_live",
    "key_to_seq",
    "key_to_slot",
    "lane_offsets",
    "seq_to_slot",
    "slot_to_key",
    "uniform_keys",
]

IntArray = npt.NDArray[np.int64]


@cache
def _compiled() -> Any:
    """The C twins of :func:`uniform_keys` and :func:`key_to_slot`
    (``replaybank._sampling``), or None where the C kernels are not loaded."""
    module, name = pick_kernel("auto", None, None, None, "ring", compiled="replaybank._sampling")
    return module if name == "c" else None


def key_to_seq(keys: IntArray, lanes: int) -> tuple[IntArray, IntArray]:
    """Split item keys into (sequence number, lane)."""
    keys = np.asarray(keys, dtype=np.int64)
    return keys // lanes, keys % lanes


def seq_to_slot(seq: IntArray, lane: IntArray, T: int, lanes: int) -> IntArray:  # noqa: N803
    """Storage slot of lane-local sequence numbers ``seq`` in ``lane``."""
    return (np.asarray(seq, np.int64) % T) * lanes + np.asarray(lane, np.int64)


def key_to_slot(keys: IntArray, T: int, lanes: int) -> IntArray:  # noqa: N803
    """Storage slot of item keys (in one C pass where built, for keys >= 0).

    Example:
        >>> key_to_slot(np.array([0, 5, 13]), T=4, lanes=2).tolist()
        [0, 5, 5]
    """
    c = _compiled()
    if c is not None and type(keys) is np.ndarray and keys.dtype == np.int64 \
            and keys.flags.c_contiguous:
        out = np.empty(keys.shape, np.int64)
        if c.key_slots(keys, lanes, T, out):
            return out
    seq, lane = key_to_seq(keys, lanes)
    return seq_to_slot(seq, lane, T, lanes)


def slot_to_key(slots: IntArray, written: IntArray, counts: IntArray, T: int) -> IntArray:  # noqa: N803
    """Item key of the live step in each slot (slots must be live).

    The live sequence numbers of lane ``l`` are ``[oldest, written)`` with
    ``oldest = written - counts``; row ``r`` holds the unique one congruent to ``r`` mod T.
    """
    lanes = len(written)
    slots = np.asarray(slots, dtype=np.int64)
    row, lane = slots // lanes, slots % lanes
    oldest = written[lane] - counts[lane]
    seq = oldest + (row - oldest) % T
    return np.asarray(seq * lanes + lane, dtype=np.int64)


def is_live(keys: IntArray, written: IntArray, counts: IntArray) -> npt.NDArray[np.bool_]:
    """Whether each key still names a stored (not overwritten, not cleared) step."""
    lanes = len(written)
    seq, lane = key_to_seq(keys, lanes)
    ok = (lane >= 0) & (seq >= 0)
    lane_c = np.clip(lane, 0, lanes - 1)
    return ok & (seq < written[lane_c]) & (seq >= written[lane_c] - counts[lane_c])


def lane_offsets(counts: IntArray) -> IntArray:
    """Exclusive prefix sum of per-lane counts: where each lane starts in a flat order."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def uniform_keys(
    flat: IntArray, written: IntArray, counts: IntArray
) -> IntArray:
    """Map flat positions ``[0, counts.sum())`` to item keys, lane by lane.

    Position ``p`` names the ``p``-th live step when lanes are concatenated in lane order
    and each lane is ordered oldest to newest. Drawing ``p`` uniformly therefore draws
    uniformly over every live step of every lane.

    Args:
        flat: Positions, ``[B]`` ints in ``[0, counts.sum())``.
        written: Steps ever written per lane, ``[lanes]``.
        counts: Live steps per lane, ``[lanes]``.

    Returns:
        Item keys ``[B]``.
    """
    lanes = len(counts)
    flat = np.asarray(flat, dtype=np.int64)
    if lanes == 1:
        return np.asarray(written[0] - counts[0] + flat, dtype=np.int64)
    c = _compiled()
    if c is not None and flat.flags.c_contiguous and type(written) is np.ndarray \
            and type(counts) is np.ndarray and written.dtype == counts.dtype == np.int64:
        out = np.empty(flat.shape, np.int64)
        if c.lane_keys(flat, written, counts, out):  # (False: out of range, numpy decides)
            return out
    if np.all(counts == counts[0]):
        # all lanes equally full (synchronous vector envs): no search needed
        c = int(counts[0])
        lane = flat // c
        seq = written[lane] - c + flat % c
        return seq * lanes + lane
    starts = lane_offsets(counts)
    lane = np.searchsorted(starts, flat, side="right") - 1
    seq = written[lane] - counts[lane] + (flat - starts[lane])
    return seq * lanes + lane


def as_int_array(values: Any, name: str, call: str = "") -> IntArray:
    """Convert user-given indices (host values) to an int64 array (no validation of range
    beyond what int64 holds).

    Args:
        values: The item keys the user passed (``batch.indices`` or ``batch.starts``).
        name: The argument's name (``"indices"``, ``"starts"``).
        call: The public call, for the messages (``"update_priorities"``).

    Raises:
        ShapeError: Nested rows of different lengths (:func:`~replaybank.spec.rows_array`).
        DtypeError: Not integers, or unsigned ones beyond int64 (no key is that large).

    Example:
        >>> as_int_array(np.array([2**64 - 1], np.uint64), "indices")
        Traceback (most recent call last):
        ...
        replaybank.errors.DtypeError: indices=array(shape=(1,), dtype=uint64) holds 18446744073709551615, beyond int64: no item key is that large; pass batch.indices as sampled
    """  # noqa: E501
    from replaybank.errors import DtypeError, describe
    from replaybank.spec import rows_array

    def label() -> str:  # for the messages only: describing a long list costs
        said = f"{name}={describe(values)}"
        return f"{call}({said})" if call else said

    arr = rows_array(values, label, "[B] item keys (one per sampled row)",
                     f"pass batch.{name} as sampled")
    if not isinstance(arr, np.ndarray):  # numpy could not convert it
        raise DtypeError(f"{label()}: expected integer indices; pass batch.{name} as sampled")
    if arr.dtype.kind not in "iu" or (arr.dtype.kind == "u" and arr.itemsize == 8 and arr.size
                                      and int(arr.max()) > np.iinfo(np.int64).max):
        if arr.dtype.kind != "u":
            raise DtypeError(f"{label()}: expected integer indices; pass batch.{name} as "
                             "sampled")
        raise DtypeError(f"{label()} holds {int(arr.max())}, beyond int64: no "
                         f"item key is that large; pass batch.{name} as sampled")
    return arr.astype(np.int64, copy=False).reshape(-1)
