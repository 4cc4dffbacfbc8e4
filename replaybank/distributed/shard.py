"""One shard of the sharded replay service: a replaybank buffer behind a Ray actor.

:class:`Shard` is a plain class (the service wraps it with ``ray.remote``); its waiting
methods are coroutines, so Ray runs it as an *async actor*: a call blocked by the rate
limiter awaits inside the actor's event loop and never stalls the other calls (samples,
priority updates, stats) queued on the same shard.

Each shard holds the buffer ``rb.from_config(config)`` (any registered type: it samples
from the buffer's core and writes through the buffer's own write, as its
:class:`~replaybank.distributed.served.ServiceKind` says) with ``num_envs`` set to its
share of the service's lanes (global lane ``l`` lives on shard ``l % num_shards`` as
local lane ``l // num_shards``), its own rate limiter (one per shard: the limit applies
to each shard as given) and its counters. A sample returns the stored fields with item
keys made global (:mod:`replaybank.distributed.keys`), the shard's *mass* (size, total
priority, smallest priority) at the draw, and for prioritized samplers the stored
priority of every drawn item, from which the client computes the global probabilities
and importance weights.

``max_times_sampled`` (queue-like use, prioritized samplers only): the shard counts how
often each stored item was drawn (per slot, reset when the slot holds a new item) and
gives an item that reached the count a stored priority of 0
(:meth:`~replaybank.samplers.prioritized.PrioritizedSampler.exclude`): it is never
drawn again, and later priority updates for it are dropped. (Within one sample call
with replacement an item may still be drawn more than once.)

Example:
    >>> import numpy as np
    >>> s = Shard(ShardSpec(index=1, num_shards=2, config={"capacity": 8}, lanes=1, seed=0))
    >>> s.extend_now({"env_ids": [0], "values": {
    ...     "obs": np.zeros((3, 1, 2)), "action": np.zeros((3, 1)), "reward": np.ones((3, 1)),
    ...     "next_obs": np.ones((3, 1, 2)), "terminated": np.zeros((3, 1), bool),
    ...     "truncated": np.zeros((3, 1), bool)}, "priority": None})
    []
    >>> out = s.sample_now(4, {}, sequences=None)
    >>> out["mass"], sorted(set(out["fields"]["indices"].tolist()) - {1, 3, 5})
    ((3, 3.0, inf), [])
"""

from __future__ import annotations

import asyncio
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from replaybank import persist
from replaybank.buffers.sequences import sequence_candidates, servable_windows
from replaybank.config import from_config
from replaybank.distributed import checkpoint
from replaybank.distributed.keys import to_global
from replaybank.distributed.served import CutsEpisodes, Refusal, Served, service_kind
from replaybank.distributed.writer import unpack
from replaybank.errors import CheckpointError, ConfigError, ReplayBankError
from replaybank.ops import ring

__all__ = ["PriorityMass", "Shard", "ShardSpec"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
#: (size, total mass, smallest positive stored priority): what global sampling needs.
Mass = tuple[int, float, float]


@runtime_checkable
class PriorityMass(Protocol):
    """A priority sampler whose sum, minimum and per-slot priorities can be read, and
    whose items can be excluded from drawing (checked once when a shard starts)."""

    weight_norm: str | None

    @property
    def total(self) -> float:
        """Sum of the stored priorities."""
        ...

    def priorities(self, slots: IntArray) -> FloatArray:
        """Stored priorities of ``slots``."""
        ...

    def range_min(self, a: int, b: int) -> float:
        """Smallest positive stored priority of slots ``[a, b)``."""
        ...

    def exclude(self, slots: IntArray) -> None:
        """Stored priority 0 for ``slots``."""
        ...

    def config(self) -> dict[str, Any]:
        """Constructor arguments with ``type``."""
        ...


@dataclass(frozen=True)
class ShardSpec:
    """How to build one shard (picklable; Ray passes it again when it restarts one).

    Attributes:
        index: This shard's index in ``[0, num_shards)``.
        num_shards: Shards in the service.
        config: The buffer config (a dict); ``num_envs`` and ``seed`` are set here.
        lanes: Local lanes of this shard (its buffer's ``num_envs``).
        seed: This shard's buffer seed (None: fresh entropy).
        rate_limit: A :class:`~replaybank.distributed.limiter.RateLimit` or None.
        max_times_sampled: Draws after which an item is never drawn again (None: off).
        checkpoint_dir: Where the service records its latest checkpoint; a restarted
            shard reloads its folder from there.
        restore: A checkpoint to load at first start (``ReplayService.restore``).
    """

    index: int
    num_shards: int
    config: dict[str, Any]
    lanes: int
    seed: int | None = None
    rate_limit: Any = None
    max_times_sampled: int | None = None
    checkpoint_dir: str | None = None
    restore: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _reconstructed() -> bool:
    """Whether Ray restarted this actor after its process died (False outside Ray)."""
    try:
        import ray
    except ImportError:  # pragma: no cover - the service needs ray anyway
        return False
    if not ray.is_initialized():
        return False
    try:
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # not inside an actor
        return False


class Shard:
    """One shard: a buffer, its rate limiter and counters (see the module docs).

    Args:
        spec: What to build.

    Raises:
        ConfigError: ``max_times_sampled`` with a sampler that has no priorities.
        CheckpointError: The checkpoint to restore is damaged or does not fit.
    """

    def __init__(self, spec: ShardSpec) -> None:
        self.spec = spec
        # an error here is kept and raised by info() and mass(): Ray keeps no exception
        # of a failed actor constructor, only its text
        self.error: ReplayBankError | None = None
        try:
            self._build(spec)
        except ReplayBankError as exc:
            self.error = exc

    def _build(self, spec: ShardSpec) -> None:
        cfg = {**spec.config, "num_envs": spec.lanes, "seed": spec.seed}
        #: The whole buffer (what is saved and restored).
        self.buf: Any = from_config(cfg)
        #: How its rows are written; ``served.core`` samples.
        self.served: Served = service_kind(cfg.get("type")).serve(self.buf)
        #: The core buffer every draw, mass and priority update uses.
        self.core: Any = self.served.core
        sampler = self.core.sampler
        self.prio: PriorityMass | None = sampler if isinstance(sampler, PriorityMass) else None
        if spec.max_times_sampled is not None and self.prio is None:
            raise ConfigError(
                f"ReplayService(max_times_sampled={spec.max_times_sampled}): needs a "
                f"prioritized sampler, the buffer has {type(sampler).__name__}; use "
                "sampler={'type': 'prioritized', 'alpha': 0.0} for uniform draws"
            )
        self.limiter: Any = None
        if spec.rate_limit is not None:
            from replaybank.distributed.limiter import RateLimiter

            self.limiter = RateLimiter(spec.rate_limit)
        self.n_slots = int(self.core.capacity)
        self.T = self.n_slots // spec.lanes
        self.times = np.zeros(self.n_slots, np.int64)  # draws of the item in each slot
        self.times_key = np.full(self.n_slots, -1, np.int64)  # which item they count
        self.inserts = 0
        self.samples = 0
        self.restored_from: str | None = None
        self._next_seq: dict[str, int] = {}  # per client: the send to write next
        # per client: its oldest send the rate limiter turned away (not written); its
        # later sends are turned away at once until the client sends that one again
        self._held: dict[str, int] = {}
        self._cond: asyncio.Condition | None = None
        root: Path | None = None
        if spec.restore is not None:
            root = Path(spec.restore)
        elif spec.checkpoint_dir is not None and _reconstructed():
            root = checkpoint.latest(Path(spec.checkpoint_dir))
        if root is not None:
            self.load(str(root))

    # ------------------------------------------------------------------ queries
    def pid(self) -> int:
        """The worker process id (tests SIGKILL it)."""
        return os.getpid()

    def mass(self) -> Mass:
        """``(size, total, p_min)``: total priority and smallest positive stored priority
        (prioritized), or ``(size, size, inf)``."""
        if self.error is not None:
            raise self.error
        size = len(self.core)
        if self.prio is None:
            return size, float(size), math.inf
        return size, float(self.prio.total), float(self.prio.range_min(0, self.n_slots))

    def draw_state(self, n: int, distinct: bool = False,
                   window: tuple[int, dict[str, Any]] | None = None
                   ) -> tuple[int, float, float, bool, int, float]:
        """What the client splits a batch by, before anything is drawn.

        Args:
            n: The batch size (for the rate limiter).
            distinct: A ``replace=False`` draw: count what it may take.
            window: ``(sequence_length, kwargs)`` of a ``sample_sequences`` call, or None
                for ``sample``.

        Returns:
            :meth:`mass`, whether the rate limiter lets a sample of ``n`` through now
            (True without a limiter: the client draws from the shards that may), and the
            *pool* a draw takes from: its count and mass. With ``distinct``, the items
            (:meth:`distinct_items`, their mass the total) or, for windows, the servable
            window starts and their mass (:meth:`servable_windows`); else the size and
            total.

        Raises:
            ConfigError: Bad window arguments (checked as ``sample_sequences`` checks
                them; nothing is drawn).
        """
        size, total, p_min = self.mass()
        allowed = self.limiter is None or self.limiter.can_sample(n)
        count, pool = size, total
        if distinct:
            count, pool = self._pool(window)
        return size, total, p_min, allowed, count, pool

    def _pool(self, window: tuple[int, dict[str, Any]] | None) -> tuple[int, float]:
        """What a ``replace=False`` draw takes from: ``(count, mass)`` of the distinct
        items, or of the servable window starts of ``window``."""
        if window is None:
            return self.distinct_items(), self.mass()[1]
        return self.servable_windows(*window)

    def servable_windows(self, sequence_length: int, kwargs: dict[str, Any]
                         ) -> tuple[int, float]:
        """How many distinct windows ``sample_sequences(B, sequence_length, **kwargs,
        replace=False)`` may draw here, and their mass (the servable starts' stored
        priorities, or their count):
        :func:`~replaybank.buffers.sequences.servable_windows`.

        Raises:
            ConfigError: Bad window arguments.
        """
        if self.error is not None:
            raise self.error
        buf = self.core
        return servable_windows(buf.table, buf.lane_view(), buf.sampler_traits,
                                sequence_length, **kwargs)

    def distinct_items(self) -> int:
        """How many distinct items a ``replace=False`` draw may take: the sampleable
        items, of them only those with a positive stored priority (prioritized; the
        others are never drawn, e.g. retired by ``max_times_sampled``)."""
        size = len(self.core)
        if self.prio is None or size == 0:
            return size
        stored = self.prio.priorities(np.arange(self.n_slots, dtype=np.int64))
        return min(size, int(np.count_nonzero(stored > 0.0)))

    def info(self) -> dict[str, Any]:
        """Sampler config, lanes, capacity (steps), pid and where the shard was restored
        from.

        Raises:
            ReplayBankError: The error that stopped the shard from starting.
        """
        if self.error is not None:
            raise self.error
        return {"sampler": self.core.sampler.config(), "lanes": self.spec.lanes,
                "capacity": self.n_slots, "pid": os.getpid(), "prioritized": self.prio is not None,
                "restored_from": self.restored_from}

    def stats(self) -> dict[str, Any]:
        """Size, capacity, total, inserts, samples, blocked calls and limiter state.

        ``samples`` counts the items drawn, the spares of the client's one-round-trip
        draws included (the limiter's own counts are exact: limited shards draw no
        spares)."""
        size, total, p_min = self.mass()
        limiter = None if self.limiter is None else self.limiter.stats()
        return {
            "shard": self.spec.index, "size": size, "capacity": self.n_slots,
            "total": total, "min_priority": p_min, "inserts": self.inserts,
            "samples": self.samples, "pid": os.getpid(),
            "blocked_inserts": 0 if limiter is None else limiter["blocked_inserts"],
            "blocked_samples": 0 if limiter is None else limiter["blocked_samples"],
            "limiter": limiter,
            "restored_from": self.restored_from,
        }

    # ------------------------------------------------------------------ writes
    async def extend(self, payload: dict[str, Any], timeout: float | None,
                     writer: tuple[str, int, int] | None = None) -> dict[str, Any]:
        """Write a batch of rows, first waiting for the rate limiter when it blocks.

        The limiter counts the rows (``wait_insert`` or ``on_insert``) and, as deletes,
        the steps they overwrote (which lowers its size, not its sample/insert ratio).
        A client's payload names the calls its rows came from (``"calls"``); when the
        buffer refuses the batch, each call's rows are written on their own and the
        calls the buffer refuses are returned (see :meth:`extend_now`).

        Args:
            payload: One ``buf.extend``: a client's flat buffer and layout
                (:func:`~replaybank.distributed.writer.unpack`; the client puts it in
                Ray's object store once, so it arrives here as a read-only view of
                shared memory, copied only into the buffer), ``{"env_ids",
                "values", "priority"}``, or an episode cut of no rows
                (:meth:`~replaybank.distributed.writer.RowBatcher.cut`, which the rate
                limiter does not count).
            timeout: Seconds a blocked insert (or this send's turn) waits.
            writer: ``(client, seq, floor)`` ordering this client's sends (see
                :meth:`_turn`); default ``payload["writer"]`` or none.

        Returns:
            ``{"mass": (size, total, p_min), "refused": [(call, rows, error), ...]}``.
        """
        if writer is None:
            writer = payload.get("writer")
        if writer is not None and not await self._turn(writer, timeout):
            # a resend of rows already written, or a send its client's clear voided
            return {"mass": self.mass(), "refused": []}
        from replaybank.distributed.limiter import RateLimitTimeout

        written_or_refused = True
        refused: list[Refusal] = []
        try:
            n = self._rows(payload)
            if self.limiter is None or n == 0 or self.limiter.can_insert(n):
                refused = self.extend_now(payload)  # (an episode cut inserts nothing)
            else:
                try:
                    await self.limiter.wait_insert(n, timeout)  # counts the n inserts
                except RateLimitTimeout:
                    if writer is not None and self._voided(writer):
                        return {"mass": self.mass(), "refused": []}
                    written_or_refused = False  # nothing written: the client resends it
                    raise
                if writer is not None and self._voided(writer):
                    # its client cleared this shard while it waited: never written
                    self.limiter.on_delete(n)
                    return {"mass": self.mass(), "refused": []}
                written, refused = self._write(payload)
                lost = n - written
                if lost:  # counted as inserts, never stored: at least the size is right
                    self.limiter.on_delete(lost)
        finally:
            if writer is not None:
                if written_or_refused:  # (a clear may have moved the client past it)
                    self._next_seq[writer[0]] = max(writer[1] + 1,
                                                    self._next_seq.get(writer[0], 0))
                else:  # this send stays next; the later ones are turned away at once
                    self._hold(writer[0], writer[1])
                cond = self._order()
                async with cond:
                    cond.notify_all()
        return {"mass": self.mass(), "refused": refused}

    def _voided(self, writer: tuple[str, int, int]) -> bool:
        """Whether the send ``(client, seq, floor)``, past its turn, was voided since by
        its client's :meth:`clear` (which moved the client's next send past it)."""
        name, seq, _ = writer
        return self._next_seq.get(name, seq) > seq

    async def clear(self, writer: tuple[str, int] | None = None) -> int:
        """Drop every stored step: the buffer's own ``clear()`` (the whole buffer, through
        :meth:`~replaybank.distributed.served.Served.clear`: PER priorities and the
        running max priority, the sequence state, a multi-agent buffer's episode
        bookkeeping and cuts), the ``max_times_sampled`` counts, and the steps from the
        rate limiter's size (its insert and sample counts, like :meth:`stats`'
        ``inserts`` and ``samples``, keep counting).

        It runs between two other calls of this shard, so each write (one send of a
        client) lands wholly before or wholly after it. The generator, the spec and
        the sequence numbers go on (keys drawn before it turn stale).

        Args:
            writer: ``(client, upto)``: the clearing client's sends to this shard
                numbered below ``upto`` are void: those not written yet never are
                (one waiting for the rate limiter included), so everything that client
                wrote before its clear is gone and its later sends (from ``upto``)
                follow in order.

        Returns:
            Steps dropped.

        Raises:
            ReplayBankError: The error that stopped the shard from starting.
        """
        if self.error is not None:
            raise self.error
        before = len(self.core)
        self.served.clear()
        self.times[:] = 0
        self.times_key[:] = -1
        if self.limiter is not None:
            self.limiter.on_delete(min(before, self.limiter.size))
        if writer is not None:
            name, upto = writer
            self._next_seq[name] = max(int(upto), self._next_seq.get(name, 0))
            self._held.pop(name, None)
            cond = self._order()  # its voided sends waiting for their turn give up
            async with cond:
                cond.notify_all()
        return before

    def _order(self) -> asyncio.Condition:
        if self._cond is None:  # made inside the actor's event loop
            self._cond = asyncio.Condition()
        return self._cond

    async def _turn(self, writer: tuple[str, int, int], timeout: float | None) -> bool:
        """Wait until the rows ``(client, seq, floor)`` are next in that client's order.

        Ray may start an async actor's calls out of submission order; each client numbers
        its sends to a shard, and says which is its oldest unacknowledged one (``floor``:
        every earlier send was written, by this process or by the one whose checkpoint it
        restored). Returns False for a send already written (a resend after a lost reply), or
        voided by its client's :meth:`clear`.

        A send the rate limiter turned away is not written and stays next in its
        client's order (:meth:`extend`); the client's later sends are then turned away
        too, at once, and the client sends them all again, in order, starting with the
        held one (whose arrival lifts the hold).

        Raises:
            RateLimitTimeout: An earlier send of this client was turned away by the rate
                limiter, or this one waited ``timeout`` for its turn (nothing written:
                the client sends it again).
        """
        from replaybank.distributed.limiter import RateLimitTimeout

        name, seq, floor = writer
        expected = self._next_seq.setdefault(name, floor)
        if seq < expected:
            return False
        if self._held.get(name, seq + 1) >= seq:  # the held send (or an earlier one) again
            self._held.pop(name, None)

        def ready() -> bool:
            return self._next_seq[name] >= seq or self._held.get(name, seq) < seq

        cond = self._order()
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(ready), timeout)
            except (TimeoutError, asyncio.TimeoutError):
                self._hold(name, seq)
                cond.notify_all()
                raise RateLimitTimeout(
                    f"shard {self.spec.index}: send {seq} of a client waited {timeout}s "
                    "for its earlier sends (held by the rate limiter); not written, the "
                    "client sends it again") from None
            held = self._held.get(name, seq)
            if held < seq:
                raise RateLimitTimeout(
                    f"shard {self.spec.index}: send {held} of this client was turned away "
                    f"by the rate limiter, so send {seq} waits for it (not written; the "
                    "client sends both again, in order)")
        return self._next_seq[name] == seq

    def _hold(self, name: str, seq: int) -> None:
        """Note that send ``seq`` of client ``name`` was not written (the oldest such)."""
        self._held[name] = min(seq, self._held.get(name, seq))

    @staticmethod
    def _rows(payload: dict[str, Any]) -> int:
        if "rows" in payload:
            return int(payload["rows"])
        first: Any = payload["values"]
        while isinstance(first, dict):
            first = next(iter(first.values()))
        return int(np.shape(first)[0]) * len(payload["env_ids"])

    def extend_now(self, payload: dict[str, Any]) -> list[Refusal]:
        """Write the rows (``buf.extend(env_ids=..., priority=..., **values)``, or the
        buffer type's own write: :class:`~replaybank.distributed.served.Served`) and
        count them.

        ``payload`` is a client's (:func:`~replaybank.distributed.writer.unpack` reads
        its flat buffer) or ``{"env_ids", "values", "priority"}``.

        Returns:
            The calls whose rows the buffer refused, ``(call, rows, error)`` each: when
            the payload names its calls (``"calls"``: ``(call, first step, end step)``
            each) and the buffer refuses the whole batch, each call's steps are written
            on their own, in order, so one bad call does not cost the others their rows.

        Raises:
            ReplayBankError: The buffer refused a payload that names no calls (nothing
                was written).
        """
        written, refused = self._write(payload)
        if self.limiter is not None:
            self.limiter.on_insert(written)
        return refused

    def _write(self, payload: dict[str, Any]) -> tuple[int, list[Refusal]]:
        """Write through the buffer's :class:`~replaybank.distributed.served.Served`:
        the rows written and the refused calls; counts inserts and overwritten steps."""
        if payload.get("cut"):
            return 0, self._cut(payload)
        before = len(self.core)
        values, priority = unpack(payload)
        written, refused = self.served.write(payload["env_ids"], priority, values,
                                             payload.get("calls"))
        self.inserts += written
        overwritten = before + written - len(self.core)
        if self.limiter is not None and overwritten > 0:
            self.limiter.on_delete(overwritten)
        return written, refused

    def _cut(self, payload: dict[str, Any]) -> list[Refusal]:
        """End the running episodes of the payload's local lanes (a client's
        :meth:`~replaybank.distributed.writer.RowBatcher.cut`, in its write order)
        through :class:`~replaybank.distributed.served.CutsEpisodes`; a buffer that
        cannot, or that refuses, refuses the cut's call (nothing changes).

        Raises:
            ReplayBankError: The refusal of an untagged cut.
        """
        tags = [tag for tag, _, _ in payload.get("calls") or ()]
        try:
            served = self.served
            if not isinstance(served, CutsEpisodes):
                raise ConfigError(
                    f"end_episodes: shard {self.spec.index} holds a "
                    f"{type(self.buf).__name__}, which keeps no joint episodes to end; only "
                    "a MultiAgentReplayBuffer's shards take episode cuts")
            served.end_episodes([int(e) for e in payload["env_ids"]])
        except ReplayBankError as exc:
            if not tags or any(tag is None for tag in tags):
                raise
            return [(tag, 0, exc) for tag in tags]
        return []

    # ------------------------------------------------------------------ reads
    async def sample(self, n: int, kwargs: dict[str, Any], sequences: tuple[int] | None,
                     timeout: float | None) -> dict[str, Any]:
        """Draw ``n`` items (or windows), first waiting for the rate limiter when it
        blocks (the limiter counts the ``n`` samples)."""
        if self.limiter is None or self.limiter.can_sample(n):
            out = self.sample_now(n, kwargs, sequences)
            if self.limiter is not None:
                self.limiter.on_sample(n)
            return out
        await self.limiter.wait_sample(n, timeout)
        return self.sample_now(n, kwargs, sequences)

    def draw(self, n: int, kwargs: dict[str, Any], sequences: tuple[int] | None
             ) -> dict[str, Any]:
        """The client's one-round-trip draw: up to ``n`` items and the mass at the draw.

        Draws ``n`` items (or windows) when ``n > 0`` and the shard holds mass (else
        ``fields`` is None); the client keeps a random subset of them, or with
        ``replace=False`` a prefix (see :mod:`replaybank.distributed.client`). With
        ``replace=False`` it draws at most what its pool holds (:meth:`distinct_items`,
        or for windows :meth:`servable_windows`; all of them when ``n`` is larger), in
        the sampler's draw order, and the reply's ``pool`` is that pool's ``(count,
        mass)`` at the draw (None with replacement). Only for shards without a rate
        limiter or ``max_times_sampled``, where drawing spare items changes nothing but
        the ``samples`` count.

        Raises:
            ConfigError: The shard has a rate limiter or ``max_times_sampled``.
        """
        self._spares_allowed("draw")
        mass = self.mass()
        pool = None
        if kwargs.get("replace", True) is False and n > 0 and mass[1] > 0.0:
            pool = self._pool(None if sequences is None else (sequences[0], kwargs))
            n = min(n, pool[0])
        if n <= 0 or not mass[1] > 0.0:
            return {"fields": None, "priorities": None, "mass": mass, "pool": pool}
        return {**self.sample_now(n, kwargs, sequences), "pool": pool}

    def _spares_allowed(self, call: str) -> None:
        if self.limiter is not None or self.spec.max_times_sampled is not None:
            raise ConfigError(
                f"Shard.{call}: shard {self.spec.index} has a rate limiter or "
                "max_times_sampled, whose counts spare draws would change; use sample()")

    def supports_candidates(self) -> bool:
        """Whether this shard's sampler draws keys independently
        (:class:`~replaybank.samplers.base.IndependentDraws`): :meth:`candidates` works."""
        if self.error is not None:
            raise self.error
        return self.core.sampler_traits.independent is not None

    def candidates(self, n: int, kwargs: dict[str, Any], sequence_length: int
                   ) -> dict[str, Any]:
        """The client's exact window draw: ``n`` window starts drawn independently from
        the shard's sampler (:func:`~replaybank.buffers.sequences.sequence_candidates`).

        Returns:
            ``usable`` ``[n]`` bool, ``fields`` (the usable candidates' windows with
            global ``starts``, draw order; None when none is usable or nothing was
            drawn), their stored ``priorities`` (prioritized samplers) and the ``mass``
            at the draw.

        Raises:
            ConfigError: The shard has a rate limiter or ``max_times_sampled``, or
                bad window arguments.
        """
        self._spares_allowed("candidates")
        mass = self.mass()
        out: dict[str, Any] = {"usable": np.zeros(0, bool), "fields": None,
                               "priorities": None, "mass": mass}
        if n <= 0 or not mass[1] > 0.0:
            return out
        buf = self.core
        usable, batch = sequence_candidates(buf.table, buf.lane_view(), buf.rng,
                                            buf.sampler_traits, n, sequence_length, **kwargs)
        self.samples += n
        out["usable"] = usable
        if batch is not None:
            fields = batch.to_dict(nested=False)
            out["fields"], out["priorities"], _ = self._globalised(fields, "starts")
        return out

    def sample_now(self, n: int, kwargs: dict[str, Any], sequences: tuple[int] | None
                   ) -> dict[str, Any]:
        """Draw now: fields with global keys, the mass, and drawn items' priorities."""
        if sequences is None:
            batch = self.core.sample(n, **kwargs)
            key_name = "indices"
        else:
            batch = self.core.sample_sequences(n, sequences[0], **kwargs)
            key_name = "starts"
        mass = self.mass()  # at the draw (before max_times_sampled excludes items)
        fields, priorities, local = self._globalised(batch.to_dict(nested=False), key_name)
        if self.spec.max_times_sampled is not None:
            self._count(local, ring.key_to_slot(local, self.T, self.spec.lanes))
        self.samples += n
        return {"fields": fields, "priorities": priorities, "mass": mass}

    def _globalised(self, fields: dict[str, Any], key_name: str
                    ) -> tuple[dict[str, Any], FloatArray | None, IntArray]:
        """``fields`` with their local keys ``fields[key_name]`` made global, the stored
        priorities of those items (None without priorities) and the local keys."""
        local = np.asarray(fields[key_name], np.int64)
        fields[key_name] = to_global(local, self.spec.index, self.spec.num_shards)
        if self.prio is None:
            return fields, None, local
        slots = ring.key_to_slot(local, self.T, self.spec.lanes)
        return fields, self.prio.priorities(slots), local

    def _count(self, keys: IntArray, slots: IntArray) -> None:
        """Count draws per item; exclude the items that reached ``max_times_sampled``."""
        assert self.prio is not None and self.spec.max_times_sampled is not None
        new = self.times_key[slots] != keys  # the slot holds another item now
        self.times[slots[new]] = 0
        self.times_key[slots] = keys
        np.add.at(self.times, slots, 1)
        done = slots[self.times[slots] >= self.spec.max_times_sampled]
        if len(done):
            self.prio.exclude(np.unique(done))

    def _not_spent(self, keys: IntArray) -> npt.NDArray[np.bool_] | None:
        """Which local ``keys`` may still take a priority (None: all of them): with
        ``max_times_sampled``, an item that reached the count stays at priority 0."""
        if self.spec.max_times_sampled is None or not len(keys):
            return None
        slots = ring.key_to_slot(keys, self.T, self.spec.lanes)
        spent = (self.times_key[slots] == keys) \
            & (self.times[slots] >= self.spec.max_times_sampled)
        keep: npt.NDArray[np.bool_] = ~spent
        return keep

    def update_priorities(self, keys: IntArray, priorities: FloatArray) -> int:
        """Apply new priorities to local ``keys`` (stale and exhausted ones dropped; the
        client has checked the arguments, so a bad call never reaches a shard)."""
        keys = np.asarray(keys, np.int64)
        priorities = np.asarray(priorities, np.float64)
        keep = self._not_spent(keys)
        if keep is not None:
            keys, priorities = keys[keep], priorities[keep]
        if not len(keys) or len(self.core) == 0:  # nothing live (a fresh shard: all stale)
            return 0
        return int(self.core.update_priorities(keys, priorities))

    def update_sequence_priorities(self, starts: IntArray, td_errors: FloatArray,
                                   eta: float, mask: npt.NDArray[np.bool_] | None = None
                                   ) -> int:
        """R2D2 priorities of sampled windows from their TD errors (this shard's rows).

        Applies ``eta * max|td| + (1 - eta) * mean|td|`` over each row's masked steps
        with the buffer's ``update_sequence_priorities``; the same bookkeeping as
        :meth:`update_priorities`: starts overwritten since the draw (stale) and starts
        retired by ``max_times_sampled`` are dropped, and rows without a counted step
        are left unchanged. The client has checked the arguments (a bad call is refused
        before it reaches any shard).

        Args:
            starts: Local item keys ``[B]`` of the windows' first steps.
            td_errors: ``[B, L]`` float64 TD errors of the window steps.
            eta: Weight of the max in ``[0, 1]``.
            mask: ``[B, L]`` bool steps that count (None: all).

        Returns:
            Number of priorities applied.
        """
        keys = np.asarray(starts, np.int64)
        td = np.asarray(td_errors, np.float64)
        # an explicit mask: the buffer's own check of td_errors' width against the
        # windows it drew (the client made it against its own draws) is not repeated
        m = np.ones(td.shape, bool) if mask is None else np.asarray(mask, bool)
        keep = self._not_spent(keys)
        if keep is not None:
            keys, td, m = keys[keep], td[keep], m[keep]
        if not len(keys) or len(self.core) == 0:  # nothing live (a fresh shard: all stale)
            return 0
        return int(self.core.update_sequence_priorities(keys, td, eta=float(eta), mask=m))

    def priority_limit(self) -> float | None:
        """The largest raw priority the buffer accepts (``inf``: no bound), or None when
        its sampler has no priorities; the client checks sequence priorities against it
        before sending any."""
        if self.error is not None:
            raise self.error
        traits = self.core.sampler_traits
        if traits.priority is None:
            return None
        return math.inf if traits.bounded is None else float(traits.bounded.priority_limit)

    def write_rule(self) -> dict[str, Any]:
        """What a client checks an ``add``/``extend`` against before it queues the rows
        (so bad rows are refused by the call that passes them, as one buffer does).

        Returns:
            ``{"spec"}``: the stored fields (None before the first write: the first call
            implies them); ``"rows"``: the buffer stores rows (``next_obs=False``);
            ``"transform"``: its view reshapes the inputs (frame stacks: the client
            cannot check the fields against the spec, this shard does);
            ``"limit"``: the largest raw priority (None: the sampler has no priorities);
            ``"sampler"``: the sampler's class name; and what the buffer type's
            client front needs (:meth:`~replaybank.distributed.served.Served.write_rule`).

        Raises:
            ReplayBankError: The error that stopped the shard from starting.
        """
        if self.error is not None:
            raise self.error
        return {**self.served.write_rule(), "limit": self.priority_limit(),
                "sampler": type(self.core.sampler).__name__}

    # ------------------------------------------------------------------ state
    def save(self, root: str) -> str:
        """Save the buffer and the shard state into ``<root>/shard-NNN`` (atomic files)."""
        where = checkpoint.shard_dir(Path(root), self.spec.index)
        where.mkdir(parents=True, exist_ok=True)
        persist.save(self.buf, where, checkpoint.BUFFER_PREFIX)
        times = where / checkpoint.TIMES
        np.save(f"{times}.tmp.npy", np.stack([self.times, self.times_key]))
        os.replace(f"{times}.tmp.npy", times)
        checkpoint.write_json(where / checkpoint.SHARD_JSON, {
            "index": self.spec.index, "inserts": self.inserts, "samples": self.samples,
            "limiter": None if self.limiter is None else self.limiter.state_dict(),
        })
        return str(where)

    def load(self, root: str) -> None:
        """Load ``<root>/shard-NNN`` (written by :meth:`save`).

        Raises:
            CheckpointError: A file is missing or damaged (named).
        """
        where = checkpoint.shard_dir(Path(root), self.spec.index)
        state = checkpoint.read_json(where / checkpoint.SHARD_JSON, "the shard state")
        times = checkpoint.read_array(where / checkpoint.TIMES, "the shard's sample counts")
        if times.shape != (2, self.n_slots) or times.dtype.kind not in "iu":
            raise CheckpointError(
                f"{where / checkpoint.TIMES}: holds {times.dtype} {times.shape}, expected "
                f"int64 (2, {self.n_slots}) (the sample counts of this shard's slots); the "
                "checkpoint is damaged or of another capacity, restore another one")
        try:
            inserts, samples = int(state["inserts"]), int(state["samples"])
            limiter = state["limiter"]
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{where / checkpoint.SHARD_JSON}: not a shard state ({type(exc).__name__}: "
                f"{exc}); the checkpoint is damaged, restore another one") from None
        persist.load_into(self.buf, where, checkpoint.BUFFER_PREFIX)
        self.times = times[0].astype(np.int64)
        self.times_key = times[1].astype(np.int64)
        self.inserts, self.samples = inserts, samples
        if self.limiter is not None and limiter is not None:
            self.limiter.load_state_dict(limiter)
        self.restored_from = str(root)

