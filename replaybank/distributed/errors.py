"""Errors of the sharded replay service (part of replaybank's one error tree).

Example:
    >>> from replaybank.errors import ReplayBankError
    >>> issubclass(ShardUnavailableError, ReplayBankError)
    True
"""

from __future__ import annotations

from replaybank.errors import ReplayBankError

__all__ = ["RowsRejectedWarning", "ShardUnavailableError"]


class ShardUnavailableError(ReplayBankError, RuntimeError):
    """A shard did not come back in time: its pending rows stay queued in the client
    (a later ``flush()`` sends them again), or no live shard is left to sample from, or
    a shard of a new service did not start in time (the message names it)."""


class RowsRejectedWarning(UserWarning):
    """A shard refused the rows of an earlier ``add``/``extend`` call after the client had
    queued them (a client checks every call before it queues it; a shard can still
    refuse rows it checks differently: another client's first rows set a different
    spec, or its view reshapes the inputs). Issued once per call, naming it; those rows
    are not stored, every other call's rows are, and no later call raises it."""
