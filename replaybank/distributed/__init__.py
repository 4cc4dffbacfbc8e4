"""Replay past one machine: a buffer sharded over Ray actors (``rb.distributed``).

:class:`ReplayService` starts the shards; :meth:`ReplayService.client` returns a
picklable :class:`ReplayClient` with ``rb.ReplayBuffer``'s interface. Ray is imported
when a service starts, not when this package is imported.

Example:
    >>> from replaybank.distributed import keys
    >>> keys.to_local(keys.to_global([4], shard=1, num_shards=3), 3)[0].tolist()
    [1]
"""

from replaybank.distributed.client import ReplayClient
from replaybank.distributed.errors import RowsRejectedWarning, ShardUnavailableError
from replaybank.distributed.limiter import RateLimit, RateLimiter, RateLimitTimeout
from replaybank.distributed.service import ReplayService

__all__ = ["RateLimit", "RateLimitTimeout", "RateLimiter", "ReplayClient", "ReplayService",
           "RowsRejectedWarning", "ShardUnavailableError"]
