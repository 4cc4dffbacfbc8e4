"""Checks of the arguments of a sample call, made before anything is drawn.

A sample call that fails changes no state (generator, beta schedule, priorities), so every
argument is checked before the first draw: ``batch_size`` (an int, not a bool, positive,
and small enough that the draw fits in memory), ``replace`` (a real bool; numpy bools
too) and the keyword options (only those the sampler names in its ``sample`` signature).

The checks are O(1) and cost nothing on the common path: callers test ``type(b) is int
and 0 < b <= LARGE_BATCH`` themselves and call :func:`check_batch_size` only otherwise.

``beta`` (the importance-sampling exponent) is an option of prioritized samplers only: a
sampler without priorities does not take it (:class:`~replaybank.samplers.base.
SamplerTraits` leaves it out of their options), and :func:`check_options` says so.

Example:
    >>> check_batch_size(32, available=100, replace=True)
    32
    >>> check_options("sample", {"betta": 0.5}, ("beta",))
    Traceback (most recent call last):
    ...
    replaybank.errors.ArgumentError: sample(betta=0.5): unknown keyword argument 'betta'; did you mean beta= (not betta=); this sampler/view accepts batch_size, replace, beta
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from replaybank.errors import (
    ArgumentError,
    CapacityError,
    ConfigError,
    EmptyBufferError,
    closest,
    describe,
)
from replaybank.storage.backends.base import available_memory

__all__ = ["BYTES_PER_DRAW", "LARGE_BATCH", "MAX_BATCH", "check_batch_size", "check_draw_size",
           "check_options", "check_replace", "check_size_arg", "empty_buffer_message"]

#: Batches up to this size skip the memory check (a few MB of keys at most).
LARGE_BATCH = 1 << 20
#: The largest batch any sample call accepts (int32 indices of a batch stay valid).
MAX_BATCH = (1 << 31) - 1
#: Bytes a sampler needs per drawn item besides the item's fields (keys, targets,
#: uniforms, probabilities, weights, masks: a generous bound).
BYTES_PER_DRAW = 64


def check_size_arg(name: str, value: Any, call: str = "sample", lo: int = 1) -> int:
    """An int argument ``>= lo`` (not a bool; numpy ints accepted).

    Raises:
        ConfigError: Not an int, a bool, or below ``lo``.

    Example:
        >>> check_size_arg("sequence_length", np.int64(8), "sample_sequences")
        8
    """
    if type(value) is int and value >= lo:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < lo:
        rule = "a positive int" if lo == 1 else f"an int >= {lo}"
        fix = f"{call}(256)" if name == "batch_size" else f"{name}={max(lo, 1)}"
        raise ConfigError(
            f"{call}({name}={describe(value)}): {name} must be {rule} (not a bool or "
            f"float); pass e.g. {fix}"
        )
    return int(value)


def check_draw_size(what: str, items: int, item_bytes: int = 0, fix: str = "") -> None:
    """Raise when ``items`` drawn items (each ``item_bytes`` of fields plus
    :data:`BYTES_PER_DRAW`) exceed :data:`MAX_BATCH` or the available memory.

    Args:
        what: The call and argument(s), e.g. ``"sample(batch_size=10**12)"``.
        items: Items the call would draw and gather.
        item_bytes: Bytes of one item's fields.
        fix: What to lower, for the message.

    Raises:
        CapacityError: Too many items.

    Example:
        >>> check_draw_size("sample(batch_size=8)", 8)
    """
    fix = fix or "lower the batch size"
    if items > MAX_BATCH:
        raise CapacityError(f"{what}: at most {MAX_BATCH:,} items per call; {fix}")
    if items > LARGE_BATCH:
        need = items * (BYTES_PER_DRAW + max(0, int(item_bytes)))
        avail = available_memory()
        if avail is not None and need > avail:
            raise CapacityError(
                f"{what}: the batch needs about {need:,} bytes ({need / 2**30:.2f} GiB) but "
                f"only {avail:,} bytes ({avail / 2**30:.2f} GiB) of memory are available; {fix}"
            )


def check_replace(replace: Any, call: str = "sample") -> bool:
    """``replace`` as a bool: only True/False (or a numpy bool) are accepted.

    Raises:
        ArgumentError: Anything else (``"no"``, 0, None), which would otherwise count as
            its truth value.
    """
    if replace is True or replace is False:
        return replace
    if isinstance(replace, np.bool_):
        return bool(replace)
    raise ArgumentError(
        f"{call}(replace={describe(replace)}): replace must be a bool; pass replace=True "
        "(with replacement) or replace=False (distinct items)"
    )


def empty_buffer_message(call: str, more: str = "") -> str:
    """What a draw from a buffer that holds nothing says: one wording for a local buffer
    and the Ray client (:mod:`replaybank.distributed`), which adds what only it can do.

    Args:
        call: The call with its arguments (``"sample(batch_size=8)"``).
        more: Appended after the fix (``", or wait for the writers ..."``).

    Example:
        >>> empty_buffer_message("sample(batch_size=8)")
        'sample(batch_size=8): the buffer is empty; add transitions first'
    """
    return f"{call}: the buffer is empty; add transitions first{more}"


def check_batch_size(batch_size: Any, available: int, replace: Any, call: str = "sample",
                     item_bytes: int = 0, name: str = "batch_size") -> int:
    """Validate ``batch_size`` and ``replace`` against the number of sampleable items.

    Args:
        batch_size: The call's batch size.
        available: Items that can be drawn.
        replace: The call's ``replace``.
        call: The public call, for the message.
        item_bytes: Bytes of one item's fields (for the memory check of large batches).
        name: The argument's name, for the message.

    Returns:
        ``batch_size`` as an int.

    Raises:
        ConfigError: Not a positive int (or a bool).
        ArgumentError: ``replace`` is not a bool.
        CapacityError: The batch cannot fit in memory (or exceeds :data:`MAX_BATCH`).
        EmptyBufferError: Nothing to sample, or too few items without replacement.
    """
    b = check_size_arg(name, batch_size, call)
    if b > LARGE_BATCH:
        check_draw_size(f"{call}({name}={b})", b, item_bytes, f"lower {name}")
    replace = check_replace(replace, call)
    if available <= 0:
        raise EmptyBufferError(empty_buffer_message(f"{call}({name}={b})"))
    if not replace and b > available:
        raise EmptyBufferError(
            f"{call}({name}={b}, replace=False): buffer holds {available} "
            "sampleable transitions; add more, lower batch_size or use replace=True"
        )
    return b


def check_options(call: str, kwargs: Mapping[str, Any], accepted: Iterable[str],
                  fixed: tuple[str, ...] = ("batch_size", "replace"), sampler: Any = None
                  ) -> None:
    """Raise when ``kwargs`` holds a keyword the call does not take.

    Args:
        call: The public call (``"sample"``, ``"sample_sequences"``).
        kwargs: The call's extra keyword arguments.
        accepted: The options the sampler (and view) take.
        fixed: The call's own arguments, listed in the message.
        sampler: The sampler, named in the message of a ``beta`` it does not take.

    Raises:
        ArgumentError: An unknown keyword, named with the accepted ones; ``beta`` for a
            sampler without priorities, saying so.

    Example:
        >>> check_options("sample", {"beta": 0.5}, ("replace",))
        Traceback (most recent call last):
        ...
        replaybank.errors.ArgumentError: sample(beta=0.5): this sampler has no priorities, so there is no importance-sampling exponent beta to set; drop beta=, or build the buffer with sampler=rb.PrioritizedSampler(beta=...) for prioritized replay (this sampler/view accepts batch_size, replace)
    """  # noqa: E501
    owner = "" if sampler is None else f" ({type(sampler).__name__})"
    ok = set(accepted) | set(fixed)
    unknown = [k for k in kwargs if k not in ok]
    if unknown:
        names = list(dict.fromkeys((*fixed, *accepted)))
        if unknown == ["beta"]:  # PER's option given to a sampler without priorities
            raise ArgumentError(
                f"{call}(beta={describe(kwargs['beta'])}): this sampler{owner} has no "
                "priorities, so there is no importance-sampling exponent beta to set; drop "
                "beta=, or build the buffer with sampler=rb.PrioritizedSampler(beta=...) "
                f"for prioritized replay (this sampler/view accepts {', '.join(names)})"
            )
        given = ", ".join(f"{k}={describe(kwargs[k])}" for k in unknown)
        plural = "s" if len(unknown) > 1 else ""
        hints = []
        for k in unknown:
            near = closest(k, [*names, "beta"])
            if k == "beta" or (near == "beta" and "beta" not in names):
                hints.append(f"beta is an option of prioritized samplers only: this "
                             f"sampler{owner} has no priorities")
            elif near is not None:
                hints.append(f"did you mean {near}= (not {k}=)")
        raise ArgumentError(
            f"{call}({given}): unknown keyword argument{plural} "
            f"{', '.join(repr(k) for k in unknown)}; "
            + "".join(f"{h}; " for h in dict.fromkeys(hints))
            + f"this sampler/view accepts {', '.join(names)}"
        )
