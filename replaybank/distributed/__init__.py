"""Replay past one machine: a buffer sharded over Ray actors (``rb.distributed``).

:class:`ReplayService` starts the shards; :meth:`ReplayService.client` returns a
picklable :class:`ReplayClient` with ``rb.ReplayBuffer``'s interface (for a
``MultiAgentReplayBuffer`` config, a
:class:`~replaybank.multiagent.distributed.MultiAgentReplayClient` with that buffer's).
Ray is imported when a service starts, not when this package is imported. How a buffer
type is served is registered with :func:`register_service_kind`
(:mod:`replaybank.distributed.served`); this package registers the multi-agent buffer.

Example:
    >>> from replaybank.distributed import keys
    >>> keys.to_local(keys.to_global([4], shard=1, num_shards=3), 3)[0].tolist()
    [1]
"""

from replaybank.distributed.client import ReplayClient
from replaybank.distributed.errors import RowsRejectedWarning, ShardUnavailableError
from replaybank.distributed.limiter import RateLimit, RateLimiter, RateLimitTimeout
from replaybank.distributed.served import register_service_kind
from replaybank.distributed.service import ReplayService
from replaybank.multiagent.distributed import SERVING as MULTI_AGENT_SERVING

__all__ = ["RateLimit", "RateLimitTimeout", "RateLimiter", "ReplayClient", "ReplayService",
           "RowsRejectedWarning", "ShardUnavailableError", "register_service_kind"]

# the buffer types whose shards and clients differ from the core's: an import the import
# linter sees (this layer sits above the multi-agent room)
register_service_kind("MultiAgentReplayBuffer", MULTI_AGENT_SERVING)
