"""How a shard serves a buffer type, and which client speaks for it: a small registry.

Every shard runs one code path whatever buffer the service's config names: it samples,
draws window candidates, reads its mass and applies priorities on the buffer's *core*
(a :class:`~replaybank.buffers.replay.ReplayBuffer`: the one thing the sampling code
knows), writes the rows a client sends through a :class:`Served` (the buffer's own
write), and saves and restores the whole buffer (:mod:`replaybank.persist`). On the
client side, every service has one :class:`~replaybank.distributed.client.ReplayClient`
(the core's interface: batching, global sampling, priorities, checkpoints); a buffer
type whose ``add`` and batches differ from the core's (a
:class:`~replaybank.multiagent.buffer.MultiAgentReplayBuffer`: agent dicts in,
:class:`~replaybank.multiagent.batch.MultiAgentBatch` out) wraps it in a *front*.

A buffer type says how it is served with :func:`register_service_kind`: its config
``type`` and a :class:`ServiceKind` (or its ``"module:attr"`` import path, imported on
first use, so that this package names no room it does not need). Types not registered
are served as the core itself (:class:`CoreServed`, the client unwrapped): every
single-agent buffer. ``replaybank.distributed`` registers the multi-agent buffer
(:mod:`replaybank.multiagent.distributed`).

Example:
    >>> import replaybank as rb
    >>> buf = rb.ReplayBuffer(8, seed=0)
    >>> served = service_kind("ReplayBuffer").serve(buf)
    >>> served.core is buf, isinstance(served, Served)
    (True, True)
    >>> import replaybank.distributed  # registers the multi-agent buffer
    >>> type(service_kind("MultiAgentReplayBuffer")).__name__
    'MultiAgentServing'
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from replaybank.errors import ReplayBankError
from replaybank.registry import BUFFERS, Entry, canonical_type
from replaybank.views.base import InputTransform

__all__ = ["SERVICE_KINDS", "CoreServed", "CutsEpisodes", "Refusal", "Served", "ServiceKind",
           "register_service_kind", "service_kind"]

#: A call whose rows the buffer refused: (the call's tag, its rows here, the error).
Refusal = tuple[Any, int, ReplayBankError]


@runtime_checkable
class Served(Protocol):
    """What a shard needs from the buffer it holds, besides the buffer itself.

    Attributes:
        core: The core buffer that samples (``sample``, ``sample_sequences``,
            ``sampler``, ``table``, ``update_priorities``, ...): the buffer itself, or
            the core a composed buffer stores its steps in.
    """

    core: Any

    def write(self, env_ids: list[int], priority: Any, values: dict[str, Any],
              calls: list[tuple[Any, int, int]] | None) -> tuple[int, list[Refusal]]:
        """Write one payload: ``values`` ``[T, k, *shape]`` (nested dicts kept) of the
        local lanes ``env_ids``, ``priority`` ``[T, k]`` or None.

        Args:
            env_ids: The local lanes of the payload's columns.
            priority: Initial priorities ``[T, k]`` or None.
            values: The rows, as the service's client sent them.
            calls: ``(call tag, first step, end step)`` of each client call in the
                payload, or None (an untagged payload).

        Returns:
            ``(rows written, refused calls)``: each refused call's steps changed
            nothing.

        Raises:
            ReplayBankError: The buffer refused an untagged payload.
        """
        ...

    def write_rule(self) -> dict[str, Any]:
        """What a client checks a write against: ``{"spec", "rows", "transform"}`` and
        whatever the buffer type's front needs (see
        :meth:`~replaybank.distributed.shard.Shard.write_rule`)."""
        ...

    def clear(self) -> None:
        """Drop every stored step, as the buffer's own ``clear()`` does (the whole
        buffer: a composed buffer's bookkeeping too)."""
        ...


@runtime_checkable
class CutsEpisodes(Protocol):
    """A :class:`Served` whose buffer can end the running episodes of some of its lanes
    early (a ``MultiAgentReplayBuffer``'s ``end_episodes``): what a client's cut of its
    write stream (:meth:`~replaybank.distributed.client.ReplayClient.cut_episodes`)
    needs of a shard. Checked when a cut arrives; a shard whose buffer cannot refuses it."""

    def end_episodes(self, env_ids: list[int]) -> None:
        """End the running episodes of the local lanes ``env_ids`` after their newest
        stored step (the env was reset while they ran).

        Raises:
            ReplayBankError: The buffer refused (nothing changed).
        """
        ...


@runtime_checkable
class ServiceKind(Protocol):
    """How a service serves one buffer type: the shard side and the client side."""

    def serve(self, buf: Any) -> Served:
        """The :class:`Served` of a shard's buffer ``buf``."""
        ...

    def client(self, core: Any, config: dict[str, Any]) -> Any:
        """The client users get: ``core`` (a
        :class:`~replaybank.distributed.client.ReplayClient`) as it is, or wrapped in a
        front with the buffer type's interface. ``config`` is one shard's buffer config."""
        ...


class CoreServed:
    """A single-agent buffer served as it is: ``core`` is the buffer and a payload is one
    ``buf.extend(env_ids=..., priority=..., **values)``.

    When the buffer refuses a tagged payload (it checks everything before it writes,
    so nothing of it was stored), each call's steps are written on their own, in
    order, so one bad call does not cost the others their rows.

    Args:
        buf: The shard's buffer.
    """

    def __init__(self, buf: Any) -> None:
        self.core = buf

    def write(self, env_ids: list[int], priority: Any, values: dict[str, Any],
              calls: list[tuple[Any, int, int]] | None) -> tuple[int, list[Refusal]]:
        """One ``extend``; on refusal, each call on its own (see :class:`Served`)."""
        n = _steps_of(values) * len(env_ids)
        try:
            self.core.extend(env_ids=env_ids, priority=priority, **values)
        except ReplayBankError as exc:  # a refused extend leaves the buffer as it was
            if not calls or any(tag is None for tag, _, _ in calls):
                raise  # no calls to name: the sender gets the error
            if len(calls) == 1:
                return 0, [(calls[0][0], n, exc)]
            refused: list[Refusal] = []
            for call, t0, t1 in calls:
                pr = None if priority is None else priority[t0:t1]
                try:
                    self.core.extend(env_ids=env_ids, priority=pr,
                                     **step_slice(values, t0, t1))
                except ReplayBankError as err:
                    refused.append((call, (t1 - t0) * len(env_ids), err))
            return n - sum(r for _, r, _ in refused), refused
        return n, []

    def write_rule(self) -> dict[str, Any]:
        """``{"spec", "rows", "transform"}`` of the buffer (see
        :meth:`~replaybank.distributed.shard.Shard.write_rule`)."""
        buf = self.core
        return {"spec": buf.spec, "rows": bool(buf.rows_only),
                "transform": isinstance(buf.view, InputTransform)}

    def clear(self) -> None:
        """The buffer's ``clear()``."""
        self.core.clear()


class _CoreKind:
    """The service kind of every unregistered buffer type: served as itself."""

    def serve(self, buf: Any) -> Served:
        return CoreServed(buf)

    def client(self, core: Any, config: dict[str, Any]) -> Any:
        return core


#: Buffer config type -> the :class:`ServiceKind` that serves it (or its import path).
SERVICE_KINDS: dict[str, Entry] = {}
_CORE = _CoreKind()


def register_service_kind(buffer_type: str, target: Any) -> None:
    """Serve the buffer type ``buffer_type`` (its config ``type``) with ``target``.

    Args:
        buffer_type: The registered buffer type name (``"MultiAgentReplayBuffer"``).
        target: A :class:`ServiceKind`, or ``"module:attr"`` naming one (imported when a
            service of that type starts).

    Example:
        >>> register_service_kind("MyBuffer", "replaybank.distributed.served:_CORE")
        >>> service_kind("MyBuffer") is _CORE
        True
        >>> del SERVICE_KINDS["MyBuffer"]
    """
    SERVICE_KINDS[buffer_type] = Entry(target)


def service_kind(buffer_type: Any) -> ServiceKind:
    """The :class:`ServiceKind` of a buffer config ``type`` (a class name alias too);
    unregistered types are served as the core itself."""
    entry = SERVICE_KINDS.get(canonical_type(BUFFERS, buffer_type))
    if entry is None:
        return _CORE
    kind: ServiceKind = entry.resolve()
    return kind


def step_slice(values: dict[str, Any], t0: int, t1: int) -> dict[str, Any]:
    """Steps ``[t0, t1)`` of ``[T, k, *shape]`` values (nested dicts kept; views).

    Example:
        >>> import numpy as np
        >>> step_slice({"obs": {"a": np.arange(4)}}, 1, 3)["obs"]["a"].tolist()
        [1, 2]
    """
    return {k: step_slice(v, t0, t1) if isinstance(v, dict) else v[t0:t1]
            for k, v in values.items()}


def _steps_of(values: dict[str, Any]) -> int:
    first: Any = values
    while isinstance(first, dict):
        if not first:
            return 0
        first = next(iter(first.values()))
    return int(first.shape[0])
