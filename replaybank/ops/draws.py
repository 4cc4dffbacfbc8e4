"""Exact uniform integer draws from a generator's raw 64-bit output.

``np.random.Generator.integers`` spends several microseconds of argument handling per
call, which is most of a small batch's draw. :func:`uniform_ints` reads the bit
generator's raw words (``BitGenerator.random_raw``) and maps them to ``[0, high)`` in
one pass. Each value is exactly uniform: candidates that would bias the result are
rejected, as in Lemire's multiply-shift method.

The stream, fixed so that every implementation gives the same values:

* ``high <= 2**32``: every raw word gives two 32-bit candidates, the low half first.
  A candidate ``x`` gives ``p = x * high``; it is accepted when ``p mod 2**32 >=
  2**32 mod high``, and the value is ``p >> 32`` (Lemire, "Fast random integer
  generation in an interval", 2019).
* ``high > 2**32``: every raw word is one candidate ``x``; ``v = x & (2**k - 1)`` with
  ``2**k`` the smallest power of two ``>= high``, accepted when ``v < high``.
* Rounds: with ``r`` values still to draw, a round reads ``r // 2 + 2`` words (first
  case) or ``2 * r + 8`` words (second case), keeps its accepted candidates in order up
  to ``r`` and drops the rest. Rounds repeat until ``size`` values are drawn.

The C kernel (``replaybank._sampling.map_raw``), the numba kernel
(:mod:`replaybank.ops.draws_numba`) and the numpy function :func:`map_raw` map a round
identically (the tests compare them). Where the C kernels are built, :func:`uniform_ints`
reads the raw words through the bit generator's C interface (its ``capsule``, under its
``lock``) in one call, ``replaybank._sampling.uniform``: the same words in the same
rounds as ``random_raw``, so the same values and the same generator state after.

Example:
    >>> import numpy as np
    >>> v = uniform_ints(np.random.default_rng(0), 10, 1000)
    >>> v.dtype, int(v.min()), int(v.max()), len(np.unique(v))
    (dtype('int64'), 0, 9, 10)
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.ops.jit import pick_kernel

__all__ = ["counted_ints", "lane_ints", "map_raw", "rewind", "rewinds", "round_words",
           "uniform_ints"]

IntArray = npt.NDArray[np.int64]
U64Array = npt.NDArray[np.uint64]

_LOW32 = np.uint64(0xFFFFFFFF)
_TWO32 = 1 << 32


def round_words(high: int, remaining: int) -> int:
    """Raw 64-bit words one round reads when ``remaining`` values are still to draw.

    Example:
        >>> round_words(10, 7), round_words(2**40, 7)
        (5, 22)
    """
    return remaining // 2 + 2 if high <= _TWO32 else 2 * remaining + 8


def map_raw(raw: U64Array, high: int, out: IntArray, start: int) -> int:
    """Map one round's raw words to values in ``[0, high)`` (numpy; the kernel's oracle).

    Args:
        raw: Raw words of the bit generator ``[q]`` (uint64).
        high: Exclusive upper bound, ``1 <= high <= 2**63``.
        out: Output ``[size]`` (int64); values go to ``out[start:]``.
        start: Values already drawn.

    Returns:
        Values drawn after this round (``start`` plus those accepted, at most
        ``len(out)``).

    Example:
        >>> out = np.zeros(3, np.int64)
        >>> map_raw(np.array([2**32 + 2**31], np.uint64), 4, out, 0), out.tolist()
        (2, [2, 0, 0])
    """
    if high <= _TWO32:
        if sys.byteorder == "little":
            x = raw.view(np.uint32).astype(np.uint64)  # low half of each word first
        else:  # pragma: no cover - big-endian machines
            x = np.empty(2 * len(raw), np.uint64)
            x[0::2] = raw & _LOW32
            x[1::2] = raw >> np.uint64(32)
        p = x * np.uint64(high)
        keep = (p & _LOW32) >= np.uint64(_TWO32 % high)
        vals = (p >> np.uint64(32))[keep]
    else:
        mask = np.uint64((1 << (high - 1).bit_length()) - 1)
        v = raw & mask
        vals = v[v < np.uint64(high)]
    n = min(len(vals), len(out) - start)
    out[start:start + n] = vals[:n]
    return start + n


@cache
def _kernel() -> Any:
    """The raw-word mapper (C where built, else numba when it imports, else
    :func:`map_raw`), loaded once."""
    return pick_kernel("auto", "replaybank.ops.draws_numba", "map_raw", map_raw,
                       "uniform_ints", compiled="replaybank._sampling")[0]


@cache
def _direct() -> Any:
    """The C draw that reads the bit generator's raw words itself
    (``replaybank._sampling.uniform``), or None where the C kernels are not loaded."""
    module, name = pick_kernel("auto", None, None, None, "uniform_ints",
                               compiled="replaybank._sampling")
    return module.uniform if name == "c" else None


def uniform_ints(rng: np.random.Generator, high: int, size: int, kernel: Any = None,
                 offset: int = 0) -> IntArray:
    """``size`` independent, exactly uniform int64 values in ``[offset, offset + high)``.

    Args:
        rng: The generator; only its bit generator's raw output is read.
        high: Exclusive upper bound of the draws, ``1 <= high <= 2**63``.
        size: Number of values (``>= 0``).
        kernel: A :func:`map_raw`-compatible mapper; default the C kernel where built,
            else numba's when numba imports, else :func:`map_raw`.
        offset: Added to every draw (e.g. a lane's oldest live key), in the same pass.

    Returns:
        ``[size]`` int64.

    Raises:
        ValueError: ``high`` or ``size`` out of range, or ``offset + high - 1`` beyond
            int64.

    Example:
        >>> a = uniform_ints(np.random.default_rng(3), 6, 4)
        >>> b = uniform_ints(np.random.default_rng(3), 6, 4, kernel=map_raw)
        >>> a.tolist() == b.tolist(), bool(np.all((a >= 0) & (a < 6)))
        (True, True)
        >>> (uniform_ints(np.random.default_rng(3), 6, 4, offset=100) - 100).tolist() == a.tolist()
        True
    """
    return counted_ints(rng, high, size, kernel, offset)[0]


def counted_ints(rng: np.random.Generator, high: int, size: int, kernel: Any = None,
                 offset: int = 0) -> tuple[IntArray, int]:
    """:func:`uniform_ints` and the raw words it read from the bit generator (what
    :func:`rewind` puts back).

    Example:
        >>> rng = np.random.default_rng(3)
        >>> v, words = counted_ints(rng, 6, 4)
        >>> v.tolist() == uniform_ints(np.random.default_rng(3), 6, 4).tolist(), words
        (True, 4)
    """
    if not 1 <= high <= 1 << 63 or size < 0 or not -(1 << 63) <= offset <= (1 << 63) - high:
        raise ValueError(f"uniform_ints(high={high}, size={size}, offset={offset}): need "
                         "1 <= high <= 2**63, size >= 0 and offset + high - 1 inside int64")
    out = np.empty(size, np.int64)
    if kernel is None:
        direct = _direct()
        if direct is not None:  # the same rounds, read through the generator's C interface
            bits = rng.bit_generator
            with bits.lock:  # as random_raw: one thread draws from a generator at a time
                return out, direct(bits.capsule, high, out, offset)
    mapper = _kernel() if kernel is None else kernel
    random_raw = rng.bit_generator.random_raw
    done = words = 0
    while done < size:
        q = round_words(high, size - done)
        words += q
        done = mapper(random_raw(q), high, out, done)
    if offset:
        out += offset
    return out, words


@cache
def _lanes() -> Any:
    """The C draw of several lanes' keys (``replaybank._sampling.uniform_lanes``), or None
    where the C kernels are not loaded."""
    module, name = pick_kernel("auto", None, None, None, "lane_ints",
                               compiled="replaybank._sampling")
    return module.uniform_lanes if name == "c" else None


def lane_ints(rng: np.random.Generator, written: IntArray, counts: IntArray,
              size: int) -> IntArray | None:
    """``size`` uniform item keys over the live steps of every lane: the values of
    ``uniform_ints(rng, counts.sum(), size)`` mapped by
    :func:`replaybank.ops.ring.uniform_keys`, in one C call.

    Returns:
        ``[size]`` int64 keys, or None (nothing drawn) where the C kernels are not built,
        no step is live, or the counters are not int64 arrays: the caller then takes the
        two steps above, which give the same keys or raise.

    Example:
        >>> from replaybank.ops import ring
        >>> w, c = np.array([9, 4]), np.array([6, 4])
        >>> keys = lane_ints(np.random.default_rng(2), w, c, 5)
        >>> want = ring.uniform_keys(uniform_ints(np.random.default_rng(2), 10, 5), w, c)
        >>> keys is None or keys.tolist() == want.tolist()
        True
    """
    direct = _lanes()
    if direct is None or size < 0:
        return None
    out = np.empty(size, np.int64)
    bits = rng.bit_generator
    try:
        with bits.lock:  # as random_raw: one thread draws from a generator at a time
            if direct(bits.capsule, written, counts, out) < 0:
                return None
    except TypeError:  # counters of another dtype: the numpy steps convert them
        return None
    return out


#: Bit generators whose raw words can be put back exactly: ``random_raw`` leaves their
#: buffered 32-bit half alone, and ``advance(2**128 - k)`` steps their state back ``k``
#: words.
_REWINDABLE = (np.random.PCG64, np.random.PCG64DXSM)


def rewinds(rng: np.random.Generator) -> bool:
    """Whether :func:`rewind` can put back ``rng``'s raw words (PCG64, the default, and
    PCG64DXSM); other generators are restored from a saved ``bit_generator.state``.

    Example:
        >>> rewinds(np.random.default_rng(0)), rewinds(np.random.Generator(np.random.MT19937(0)))
        (True, False)
    """
    return type(rng.bit_generator) in _REWINDABLE


def rewind(rng: np.random.Generator, words: int) -> None:
    """Put the generator back by ``words`` raw words (``rewinds(rng)`` must hold): its
    state is then exactly what it was before they were drawn, its buffered 32-bit half
    included.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> before = rng.bit_generator.state
        >>> _, words = counted_ints(rng, 10, 5)
        >>> rewind(rng, words)
        >>> rng.bit_generator.state == before
        True
    """
    bits: Any = rng.bit_generator  # a PCG64 or PCG64DXSM (rewinds)
    now = bits.state
    bits.advance((1 << 128) - words)  # resets the buffered half: put back below
    back = dict(bits.state)
    back["has_uint32"], back["uinteger"] = now["has_uint32"], now["uinteger"]
    bits.state = back
