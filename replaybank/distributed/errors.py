"""Errors of the sharded replay service (part of replaybank's one error tree).

Example:
    >>> from replaybank.errors import ReplayBankError
    >>> issubclass(ShardUnavailableError, ReplayBankError)
    True
"""

from __future__ import annotations

from replaybank.errors import ReplayBankError

__all__ = ["ShardUnavailableError"]


class ShardUnavailableError(ReplayBankError, RuntimeError):
    """A shard did not come back in time: its pending rows stay queued in the client
    (a later ``flush()`` sends them again), or no live shard is left to sample from."""
