"""Rate limiting of a replay shard: a minimum size before sampling and a sample-to-insert
ratio kept within an error buffer, with Reverb's semantics (pure Python and asyncio, no Ray).

The rule, Reverb's ``RateLimiter`` (``SampleToInsertRatio`` and ``MinSize``) restated:
everything is counted in items: a call that inserts 10 items counts 10 inserts, a sample of
256 items counts 256 samples. With ``I`` inserts, ``S`` samples and ``D`` deletes counted so
far, the limiter sees

* ``size = I - D``: the items the table holds (deletes and overwrites lower it);
* ``diff = I * samples_per_insert - S``: how far sampling lags behind the target ratio.
  Deletes do not enter ``diff``, exactly as in Reverb: the ratio is about how often each
  inserted item is sampled over its lifetime, and an overwritten item was inserted.

A :class:`RateLimit` fixes a window ``[min_diff, max_diff]`` for ``diff``:

* ``error_buffer=e`` (a number): the window is centred on ``samples_per_insert *
  min_size_to_sample``, i.e. ``[spi * min_size - e, spi * min_size + e]``. The offset is the
  ``diff`` the limiter has at the moment sampling may begin (``min_size`` inserts, no
  samples), so the window constrains only what happens after that point;
* ``error_buffer=(lo, hi)``: the window is ``[lo, hi]`` as given, without any offset;
* ``error_buffer=None`` with a ratio: the narrowest window Reverb accepts,
  ``spi * min_size +- max(1, spi)``.

Reverb's rule for a call of ``n`` items is

* insert: allowed while the table is still filling (``size + n <= min_size``), or when the
  call keeps ``diff`` at or below the top of the window (``diff + n * spi <= max_diff``);
* sample: allowed only when ``size >= min_size`` and the call keeps ``diff`` at or above the
  bottom of the window (``diff - n >= min_diff``).

Reverb only ever asks about one item at a time. A call of many items can be larger than the
window (a sample of 256 against a window 16 wide), and then the rule above would block it
forever. replaybank adds one clause per side, which never changes a one-item decision:

* an insert is also allowed whenever ``size < min_size`` or ``diff <= centre``;
* a sample is also allowed whenever ``size >= min_size`` and ``diff >= centre``,

where ``centre = (min_diff + max_diff) / 2``. Because the window is at least ``2 * max(1,
spi)`` wide (validated, as Reverb does), ``diff <= centre`` already lets one inserted item
through and ``diff >= centre`` one sampled item, so for ``n = 1`` this is Reverb's rule
exactly. (Windows are validated up to float rounding, :data:`ROUNDING_ULPS` units in the
last place: ``(1.3, 3.3)`` is 2 wide as written, ``3.3 - 1.3 == 1.9999999999999998`` in
binary floats, and is accepted for a ratio of 1, where Reverb would refuse it. Only in such a
window, and only where ``diff`` lies within that rounding of the centre, can the centre
clause let one item through that Reverb's comparison would hold back.)

A large call waits at most until ``diff`` has swung back to the centre and then
goes through whole; it can leave ``diff`` outside the window by at most ``n * spi - width/2``
(inserts) or ``n - width/2`` (samples), and the opposite side then repays the overshoot.
Once the table holds ``min_size`` items and ``diff`` is inside the window, calls no larger
than half the window (``n * spi`` for inserts, ``n`` for samples) never take it outside.
An insert and a sample can never both be blocked (that would need ``diff > centre`` and
``diff < centre``), so a writer and a learner that keep calling never deadlock, whatever
their batch sizes.

``samples_per_insert=None`` applies the minimum size only (Reverb's ``MinSize``): inserts
are never blocked and ``diff`` is reported with a ratio of 1.

:meth:`RateLimiter.on_insert` / :meth:`~RateLimiter.on_sample` /
:meth:`~RateLimiter.on_delete` count unconditionally (the caller has checked, or the data is
already there); :meth:`RateLimiter.wait_insert` / :meth:`~RateLimiter.wait_sample` wait on an
:class:`asyncio.Condition` until the rule allows the call, then count it, or raise
:class:`RateLimitTimeout`. :meth:`RateLimiter.wait_insert_blocking` and
:meth:`~RateLimiter.wait_sample_blocking` do the same for threads. Every state change wakes
every waiter, of both kinds. All decisions use exact rational arithmetic (``Fraction`` of
the float ratio), so they do not depend on rounding.

Example:
    >>> limiter = RateLimiter(RateLimit(min_size_to_sample=2, samples_per_insert=1.0,
    ...                                 error_buffer=2.0))
    >>> limiter.can_sample(1)
    False
    >>> limiter.on_insert(2)  # window [0, 4], diff = 2: the centre
    >>> limiter.can_sample(1), limiter.can_sample(3), limiter.can_sample(5)
    (True, True, True)
    >>> limiter.on_sample(5)  # diff = -3, below the window
    >>> limiter.can_sample(1), limiter.can_insert(100)
    (False, True)
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from numbers import Integral, Real
from typing import Any

from replaybank.errors import CheckpointError, ConfigError, ReplayBankError, describe

__all__ = ["ROUNDING_ULPS", "RateLimit", "RateLimitTimeout", "RateLimiter"]

#: The checks of a :class:`RateLimit` on its window accept a value that misses its bound by
#: at most this many units in the last place (``math.ulp``) of the largest magnitude
#: compared: decimal inputs are rounded to binary floats, so ``(1.3, 3.3)``, written 2 wide,
#: is ``1.9999999999999998`` wide as floats, and ``0.7 * 3`` is ``2.0999999999999996``.
ROUNDING_ULPS = 4

_COUNTERS = ("inserts", "samples", "deletes", "blocked_inserts", "blocked_samples",
             "insert_timeouts", "sample_timeouts")


# the name the service's API promises (like the builtin TimeoutError it extends)
class RateLimitTimeout(ReplayBankError, TimeoutError):  # noqa: N818
    """A rate-limited insert or sample call was not allowed before its timeout."""


def _is_real(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _at_least(value: float, bound: float, *operands: float) -> bool:
    """``value >= bound`` up to the rounding of float inputs: :data:`ROUNDING_ULPS` units in
    the last place of the largest of ``|value|``, ``|bound|`` and the ``operands`` that
    ``value`` was computed from (``hi - lo`` is off by up to an ulp of ``hi``, not of the
    difference)."""
    slack = ROUNDING_ULPS * math.ulp(max(abs(value), abs(bound), *map(abs, operands)))
    return value >= bound - slack


def _suggest(value: float, accepted: Callable[[float], bool]) -> str:
    """The shortest decimal text near ``value`` that ``accepted`` takes (at worst
    ``repr(value)``, which reads back as ``value`` itself), for an error message's fix."""
    for digits in (6, 12, 15):
        text = f"{value:.{digits}g}"
        if accepted(float(text)):
            return text
    return repr(float(value))


@dataclass(frozen=True)
class RateLimit:
    """What a :class:`RateLimiter` enforces: a minimum size and a sample-to-insert ratio.

    The rule is in the module docstring; in short, sampling waits until the table holds
    ``min_size_to_sample`` items, and then ``diff = inserts * samples_per_insert - samples``
    is kept within ``[min_diff, max_diff]`` (inserts wait above it, samples below it).

    Args:
        min_size_to_sample: Items the table must hold before any sample (an int >= 1).
        samples_per_insert: Target number of times each inserted item is sampled over its
            lifetime (a finite float > 0), or ``None`` for the minimum size alone.
        error_buffer: Allowed deviation of ``diff``: a number ``e`` (window
            ``spi * min_size +- e``), a pair ``(min_diff, max_diff)`` used as given, or
            ``None`` for the narrowest window, ``spi * min_size +- max(1, spi)``. Either form
            must give a window at least ``2 * max(1, spi)`` wide whose bottom is at most
            ``spi * min_size`` (both up to float rounding, see :data:`ROUNDING_ULPS`: a
            window written ``(1.3, 3.3)`` is 2 wide).

    Raises:
        ConfigError: A value is of the wrong kind or out of range (the message names it and
            the fix).

    Example:
        >>> limit = RateLimit(min_size_to_sample=100, samples_per_insert=4.0,
        ...                   error_buffer=40.0)
        >>> limit.min_diff, limit.max_diff
        (360.0, 440.0)
        >>> RateLimit(10, 4.0, (0.0, 8.0)).max_diff
        8.0
    """

    min_size_to_sample: int = 1
    samples_per_insert: float | None = None
    error_buffer: float | tuple[float, float] | None = None

    def __post_init__(self) -> None:
        size = self.min_size_to_sample
        if not _is_count(size) or size < 1:
            raise ConfigError(
                f"RateLimit(min_size_to_sample={describe(size)}): min_size_to_sample must "
                "be an int >= 1 (the items the table holds before sampling may start); "
                "pass e.g. min_size_to_sample=1000"
            )
        spi = self.samples_per_insert
        if spi is not None and (not _is_real(spi) or not math.isfinite(spi) or spi <= 0):
            raise ConfigError(
                f"RateLimit(samples_per_insert={describe(spi)}): samples_per_insert must be "
                "a finite number > 0 (how many times each item is sampled on average), or "
                "None to apply the minimum size only; pass e.g. samples_per_insert=8.0"
            )
        # numpy scalars become Python numbers (same values), so the limit compares, hashes
        # and serialises like one built from Python numbers
        object.__setattr__(self, "min_size_to_sample", int(size))
        if spi is not None:
            spi = float(spi)
            object.__setattr__(self, "samples_per_insert", spi)
        buf = self.error_buffer
        if buf is None:
            return
        if spi is None:
            raise ConfigError(
                f"RateLimit(error_buffer={describe(buf)}): an error buffer needs a ratio to "
                "bound but samples_per_insert=None; pass samples_per_insert too, or drop "
                "error_buffer"
            )
        need = 2 * max(1.0, float(spi))
        offset = float(spi) * size
        if isinstance(buf, (tuple, list)):
            if len(buf) != 2 or not all(_is_real(v) and math.isfinite(v) for v in buf):
                raise ConfigError(
                    f"RateLimit(error_buffer={describe(buf)}): a window must be a pair of "
                    "finite numbers (min_diff, max_diff); pass e.g. error_buffer=(0.0, 64.0)"
                )
            lo, hi = float(buf[0]), float(buf[1])
            low_ok = _at_least(offset, lo)
            if not _at_least(hi - lo, need, lo, hi):
                # a window that passes both checks: the bottom kept (or lowered to the
                # offset), the top raised to the required width
                lo_text = (_suggest(lo, lambda v: v == lo) if low_ok
                           else _suggest(offset, lambda v: _at_least(offset, v)))
                hi_text = _suggest(max(hi, float(lo_text) + need),
                                   lambda v: _at_least(v - float(lo_text), need, v))
                raise ConfigError(
                    f"RateLimit(error_buffer={describe(buf)}): the window is {hi - lo:.12g} "
                    f"wide but must be at least 2 * max(1, samples_per_insert) = {need:.12g}, "
                    f"else single calls could block for good; widen it, e.g. error_buffer="
                    f"({lo_text}, {hi_text})"
                )
            if not low_ok:
                at_most = _suggest(offset, lambda v: _at_least(offset, v))
                raise ConfigError(
                    f"RateLimit(error_buffer={describe(buf)}): min_diff {lo:.12g} is above "
                    f"samples_per_insert * min_size_to_sample = {offset:.12g}, so sampling "
                    "would be blocked for good once the minimum size is reached; lower "
                    f"min_diff to at most {at_most}"
                )
            object.__setattr__(self, "error_buffer", (lo, hi))
            return
        if not _is_real(buf) or not math.isfinite(buf) or not _at_least(float(buf), need / 2):
            half = _suggest(max(need / 2, 0.1 * offset), lambda v: _at_least(v, need / 2))
            raise ConfigError(
                f"RateLimit(error_buffer={describe(buf)}): a half-width must be a finite "
                f"number >= max(1, samples_per_insert) = {need / 2:.12g}, else single calls "
                f"could block for good; pass e.g. error_buffer={half}"
            )
        object.__setattr__(self, "error_buffer", float(buf))

    @property
    def min_diff(self) -> float:
        """Bottom of the ``diff`` window (``-inf`` without a ratio)."""
        return float(self._window()[0])

    @property
    def max_diff(self) -> float:
        """Top of the ``diff`` window (``inf`` without a ratio)."""
        return float(self._window()[1])

    def _window(self) -> tuple[Fraction | float, Fraction | float]:
        spi = self.samples_per_insert
        if spi is None:
            return -math.inf, math.inf
        buf = self.error_buffer
        if isinstance(buf, tuple):
            return Fraction(buf[0]), Fraction(buf[1])
        half = Fraction(max(1.0, float(spi)) if buf is None else buf)
        offset = Fraction(spi) * self.min_size_to_sample
        return offset - half, offset + half

    def to_dict(self) -> dict[str, Any]:
        """The three arguments, JSON-ready (a window becomes a two-item list).

        Example:
            >>> RateLimit(5, 2.0, (0.0, 8.0)).to_dict()
            {'min_size_to_sample': 5, 'samples_per_insert': 2.0, 'error_buffer': [0.0, 8.0]}
        """
        buf = self.error_buffer
        return {
            "min_size_to_sample": int(self.min_size_to_sample),
            "samples_per_insert": None if self.samples_per_insert is None
            else float(self.samples_per_insert),
            "error_buffer": list(buf) if isinstance(buf, tuple)
            else None if buf is None else float(buf),
        }


class RateLimiter:
    """Counts the inserts, samples and deletes of one table and decides which calls may go.

    The decision rule (Reverb's, plus a clause that keeps calls of many items from blocking
    for good) is in the module docstring. One limiter serves one table; the async waits of
    one limiter must all run on one event loop, and the blocking waits may run on any
    threads (all state is behind one lock).

    Args:
        limit: The :class:`RateLimit` to enforce.

    Raises:
        ConfigError: ``limit`` is not a :class:`RateLimit`.

    Example:
        >>> import asyncio
        >>> limiter = RateLimiter(RateLimit(1, samples_per_insert=2.0, error_buffer=2.0))
        >>> limiter.on_insert(1)
        >>> asyncio.run(limiter.wait_sample(2, timeout=0.01))
        >>> limiter.stats()["samples"], limiter.can_sample(1)
        (2, False)
        >>> asyncio.run(limiter.wait_sample(4, timeout=0.01))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        replaybank.distributed.limiter.RateLimitTimeout: wait_sample(n=4, timeout=0.01) ...
    """

    def __init__(self, limit: RateLimit) -> None:
        if not isinstance(limit, RateLimit):
            raise ConfigError(
                f"RateLimiter(limit={describe(limit)}): limit must be a RateLimit; pass e.g. "
                "RateLimiter(RateLimit(min_size_to_sample=1000, samples_per_insert=8.0, "
                "error_buffer=800.0))"
            )
        self._limit = limit
        spi = limit.samples_per_insert
        self._spi = Fraction(1) if spi is None else Fraction(spi)
        self._lo, self._hi = limit._window()
        self._centre: Fraction | float = 0 if spi is None else (self._lo + self._hi) / 2
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._waiting = {"insert": 0, "sample": 0}
        self._lock = threading.RLock()
        self._tcond = threading.Condition(self._lock)
        self._acond = asyncio.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async_waiters = 0
        self._wake_pending = False
        self._wake_tasks: set[asyncio.Task[None]] = set()

    @property
    def limit(self) -> RateLimit:
        """The enforced :class:`RateLimit`."""
        return self._limit

    @property
    def size(self) -> int:
        """Items the table holds as the limiter counts them: inserts minus deletes."""
        return self._counts["inserts"] - self._counts["deletes"]

    def _diff(self) -> Fraction:
        return self._counts["inserts"] * self._spi - self._counts["samples"]

    # ------------------------------------------------------------------ decisions
    def can_insert(self, n: int) -> bool:
        """Whether an insert of ``n`` items is allowed now (the module's rule).

        Args:
            n: Items the call inserts (an int >= 1).

        Raises:
            ConfigError: ``n`` is not an int >= 1.

        Example:
            >>> RateLimiter(RateLimit(1, 1.0, (0.0, 2.0))).can_insert(1000)
            True
        """
        n = _check_n("can_insert", n, 1)
        with self._lock:
            return self._can_insert(n)

    def can_sample(self, n: int) -> bool:
        """Whether a sample of ``n`` items is allowed now (the module's rule).

        Args:
            n: Items the call samples (an int >= 1).

        Raises:
            ConfigError: ``n`` is not an int >= 1.

        Example:
            >>> RateLimiter(RateLimit(min_size_to_sample=3)).can_sample(1)
            False
        """
        n = _check_n("can_sample", n, 1)
        with self._lock:
            return self._can_sample(n)

    def _can_insert(self, n: int) -> bool:
        if self._limit.samples_per_insert is None or self.size < self._limit.min_size_to_sample:
            return True
        diff = self._diff()
        return diff + n * self._spi <= self._hi or diff <= self._centre

    def _can_sample(self, n: int) -> bool:
        if self.size < self._limit.min_size_to_sample:
            return False
        if self._limit.samples_per_insert is None:
            return True
        diff = self._diff()
        return diff - n >= self._lo or diff >= self._centre

    # ------------------------------------------------------------------ counting
    def on_insert(self, n: int) -> None:
        """Count ``n`` inserted items, allowed or not, and wake the waiters.

        Args:
            n: Items inserted (an int >= 0).

        Raises:
            ConfigError: ``n`` is not an int >= 0 (nothing is counted).
        """
        n = _check_n("on_insert", n, 0)
        with self._lock:
            self._counts["inserts"] += n
            self._notify()

    def on_sample(self, n: int) -> None:
        """Count ``n`` sampled items, allowed or not, and wake the waiters.

        Args:
            n: Items sampled (an int >= 0).

        Raises:
            ConfigError: ``n`` is not an int >= 0 (nothing is counted).
        """
        n = _check_n("on_sample", n, 0)
        with self._lock:
            self._counts["samples"] += n
            self._notify()

    def on_delete(self, n: int) -> None:
        """Count ``n`` items removed or overwritten (they lower :attr:`size`, not ``diff``).

        Args:
            n: Items deleted (an int >= 0, at most :attr:`size`).

        Raises:
            ConfigError: ``n`` is not an int in ``[0, size]`` (nothing is counted).
        """
        n = _check_n("on_delete", n, 0)
        with self._lock:
            if n > self.size:
                raise ConfigError(
                    f"on_delete(n={n}): the limiter counts only {self.size} items "
                    f"({self._counts['inserts']} inserts - {self._counts['deletes']} "
                    "deletes); count each insert with on_insert before deleting it"
                )
            self._counts["deletes"] += n
            self._notify()

    def _notify(self) -> None:
        """Wake every waiter (caller holds ``self._lock``): threads now, async ones via
        a task on their loop (a synchronous caller cannot hold the asyncio lock)."""
        self._tcond.notify_all()
        loop = self._loop
        if self._async_waiters == 0 or loop is None or self._wake_pending or loop.is_closed():
            return
        self._wake_pending = True
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._spawn_wake()
        else:
            loop.call_soon_threadsafe(self._spawn_wake)

    def _spawn_wake(self) -> None:
        loop = self._loop
        if loop is None:  # pragma: no cover - the loop is only ever set, never cleared
            return
        task = loop.create_task(self._wake())
        self._wake_tasks.add(task)
        task.add_done_callback(self._wake_tasks.discard)

    async def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        async with self._acond:
            self._acond.notify_all()

    # ------------------------------------------------------------------ waiting
    async def wait_insert(self, n: int, timeout: float | None = None) -> None:
        """Wait until an insert of ``n`` items is allowed, then count it.

        Args:
            n: Items the call inserts (an int >= 1).
            timeout: Seconds to wait at most (``None``: no limit; ``0``: check once).

        Raises:
            RateLimitTimeout: Not allowed within ``timeout`` (nothing is counted).
            ConfigError: Bad ``n`` or ``timeout``.
        """
        await self._wait("insert", _check_n("wait_insert", n, 1),
                         _check_timeout("wait_insert", timeout))

    async def wait_sample(self, n: int, timeout: float | None = None) -> None:
        """Wait until a sample of ``n`` items is allowed, then count it.

        Args:
            n: Items the call samples (an int >= 1).
            timeout: Seconds to wait at most (``None``: no limit; ``0``: check once).

        Raises:
            RateLimitTimeout: Not allowed within ``timeout`` (nothing is counted).
            ConfigError: Bad ``n`` or ``timeout``.
        """
        await self._wait("sample", _check_n("wait_sample", n, 1),
                         _check_timeout("wait_sample", timeout))

    def wait_insert_blocking(self, n: int, timeout: float | None = None) -> None:
        """:meth:`wait_insert` for threads: blocks the calling thread.

        Raises:
            RateLimitTimeout: Not allowed within ``timeout`` (nothing is counted).
            ConfigError: Bad ``n`` or ``timeout``.
        """
        self._wait_blocking("insert", _check_n("wait_insert_blocking", n, 1),
                            _check_timeout("wait_insert_blocking", timeout))

    def wait_sample_blocking(self, n: int, timeout: float | None = None) -> None:
        """:meth:`wait_sample` for threads: blocks the calling thread.

        Raises:
            RateLimitTimeout: Not allowed within ``timeout`` (nothing is counted).
            ConfigError: Bad ``n`` or ``timeout``.
        """
        self._wait_blocking("sample", _check_n("wait_sample_blocking", n, 1),
                            _check_timeout("wait_sample_blocking", timeout))

    def _try_count(self, kind: str, n: int) -> bool:
        """Count the call if the rule allows it now (caller holds ``self._lock``)."""
        if kind == "insert":
            if not self._can_insert(n):
                return False
            self._counts["inserts"] += n
        else:
            if not self._can_sample(n):
                return False
            self._counts["samples"] += n
        return True

    async def _wait(self, kind: str, n: int, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        with self._lock:
            if self._try_count(kind, n):
                self._notify()
                return
            self._loop = loop
            self._async_waiters += 1
            self._waiting[kind] += 1
            self._counts[f"blocked_{kind}s"] += 1
        try:
            async with self._acond:
                while True:
                    with self._lock:
                        if self._try_count(kind, n):
                            self._tcond.notify_all()
                            break
                    remaining = None if deadline is None else deadline - loop.time()
                    if remaining is not None and remaining <= 0:
                        self._timed_out(kind, n, timeout)
                    try:
                        await asyncio.wait_for(self._acond.wait(), remaining)
                    except (TimeoutError, asyncio.TimeoutError):
                        continue  # checked once more above, then timed out
                self._acond.notify_all()
        finally:
            with self._lock:
                self._async_waiters -= 1
                self._waiting[kind] -= 1

    def _wait_blocking(self, kind: str, n: int, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if self._try_count(kind, n):
                self._notify()
                return
            self._waiting[kind] += 1
            self._counts[f"blocked_{kind}s"] += 1
            try:
                while not self._try_count(kind, n):
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        self._timed_out(kind, n, timeout)
                    self._tcond.wait(remaining)
            finally:
                self._waiting[kind] -= 1
            self._notify()

    def _timed_out(self, kind: str, n: int, timeout: float | None) -> None:
        with self._lock:
            self._counts[f"{kind}_timeouts"] += 1
            message = self._blocked_message(kind, n)
        raise RateLimitTimeout(f"wait_{kind}(n={n}, timeout={timeout}) {message}")

    def _blocked_message(self, kind: str, n: int) -> str:
        limit, c = self._limit, self._counts
        diff = self._diff()
        state = (f"inserts={c['inserts']}, samples={c['samples']}, deletes={c['deletes']}, "
                 f"size={self.size}, diff={float(diff):g} (window [{float(self._lo):g}, "
                 f"{float(self._hi):g}])")
        head = f"was not allowed in time under {limit!r}; {state}; "
        if kind == "sample" and self.size < limit.min_size_to_sample:
            more = limit.min_size_to_sample - self.size
            return head + (f"sampling waits for the table to hold min_size_to_sample="
                           f"{limit.min_size_to_sample} items: insert {more} more")
        if kind == "sample":
            # allowed once diff - n >= min_diff or diff >= centre
            target = min(self._lo + n, self._centre)
            more = max(1, math.ceil((target - diff) / self._spi))
            return head + (f"sampling {n} items would take diff below min_diff and diff "
                           f"is below the centre: insert {more} more items (each adds "
                           f"samples_per_insert={float(self._spi):g} to diff)")
        # an insert: allowed once diff + n * spi <= max_diff or diff <= centre
        target = max(self._hi - n * self._spi, self._centre)
        more = max(1, math.ceil(diff - target))
        return head + (f"inserting {n} items would take diff above max_diff and diff is "
                       f"above the centre: sample {more} more items")

    # ------------------------------------------------------------------ inspection
    def stats(self) -> dict[str, Any]:
        """The limiter's state, JSON-ready.

        Returns:
            ``inserts``, ``samples``, ``deletes``, ``size``, ``diff``, ``min_diff``,
            ``max_diff`` (``diff`` uses a ratio of 1 when ``samples_per_insert`` is None;
            the window is then infinite), ``min_size_to_sample``, ``samples_per_insert``,
            ``blocked_inserts`` / ``blocked_samples`` (wait calls that had to wait),
            ``insert_timeouts`` / ``sample_timeouts``, ``waiting_inserts`` /
            ``waiting_samples`` (wait calls waiting now), ``can_insert`` / ``can_sample``
            (whether one item would go through now).

        Example:
            >>> RateLimiter(RateLimit(2, 1.0, 2.0)).stats()["max_diff"]
            4.0
        """
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
            out.update(
                size=self.size,
                diff=float(self._diff()),
                min_diff=float(self._lo),
                max_diff=float(self._hi),
                min_size_to_sample=self._limit.min_size_to_sample,
                samples_per_insert=self._limit.samples_per_insert,
                waiting_inserts=self._waiting["insert"],
                waiting_samples=self._waiting["sample"],
                can_insert=self._can_insert(1),
                can_sample=self._can_sample(1),
            )
            return out

    def state_dict(self) -> dict[str, Any]:
        """The limit and every counter (waiting calls are not state), JSON-ready.

        Example:
            >>> limiter = RateLimiter(RateLimit(2, 1.0, 2.0))
            >>> limiter.on_insert(3)
            >>> other = RateLimiter(RateLimit(2, 1.0, 2.0))
            >>> other.load_state_dict(limiter.state_dict())
            >>> other.state_dict() == limiter.state_dict()
            True
        """
        with self._lock:
            return {"limit": self._limit.to_dict(), **self._counts}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the counters of :meth:`state_dict` and wake the waiters.

        Args:
            state: What :meth:`state_dict` returned, for the same :class:`RateLimit`.

        Raises:
            CheckpointError: ``state`` is malformed or was saved under another limit
                (the limiter is left unchanged).
        """
        if not isinstance(state, Mapping):
            raise CheckpointError(
                f"load_state_dict(state={describe(state)}): state must be the mapping "
                "RateLimiter.state_dict() returned"
            )
        missing = [k for k in ("limit", *_COUNTERS) if k not in state]
        if missing:
            raise CheckpointError(
                f"load_state_dict(state): missing keys {missing}; pass the mapping "
                "RateLimiter.state_dict() returned"
            )
        if state["limit"] != self._limit.to_dict():
            raise CheckpointError(
                f"load_state_dict(state): saved under limit {state['limit']}, but this "
                f"limiter enforces {self._limit.to_dict()}; build the limiter with the "
                "saved RateLimit"
            )
        counts = {k: state[k] for k in _COUNTERS}
        bad = {k: v for k, v in counts.items() if not _is_count(v) or v < 0}
        if bad or counts["deletes"] > counts["inserts"]:
            raise CheckpointError(
                f"load_state_dict(state): counters must be ints >= 0 with deletes <= "
                f"inserts, got {counts}; pass the mapping RateLimiter.state_dict() returned"
            )
        with self._lock:
            self._counts = {k: int(v) for k, v in counts.items()}
            self._notify()

    def __repr__(self) -> str:
        with self._lock:
            return (f"RateLimiter({self._limit!r}, inserts={self._counts['inserts']}, "
                    f"samples={self._counts['samples']}, deletes={self._counts['deletes']})")


def _check_n(call: str, n: Any, lo: int) -> int:
    if not _is_count(n) or n < lo:
        rule = "an int >= 1" if lo == 1 else "an int >= 0"
        raise ConfigError(
            f"{call}(n={describe(n)}): n counts items and must be {rule} (not a bool or "
            f"float); pass e.g. {call}({max(lo, 1)})"
        )
    return int(n)


def _check_timeout(call: str, timeout: Any) -> float | None:
    if timeout is None:
        return None
    if not _is_real(timeout) or math.isnan(timeout) or timeout < 0:
        raise ConfigError(
            f"{call}(timeout={describe(timeout)}): timeout must be None (wait without "
            "limit) or a number of seconds >= 0; pass e.g. timeout=5.0"
        )
    return None if math.isinf(timeout) else float(timeout)
