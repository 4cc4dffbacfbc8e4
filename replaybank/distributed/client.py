"""The picklable client of a sharded replay service: ``rb.ReplayBuffer``'s interface.

``service.client()`` returns a :class:`ReplayClient`. It speaks the buffer's interface
(``add``, ``extend``, ``sample``, ``sample_sequences``, ``update_priorities``,
``update_sequence_priorities``, ``len``) and returns the same :class:`~replaybank.batch.Batch` /
:class:`~replaybank.batch.SequenceBatch` types, so training code does not change when
it moves from one process to a cluster. It pickles (pass it to Ray tasks and actors:
pending rows are flushed first; the copy starts with an empty write queue and a copy
of the generator).

Writes: rows are batched per shard (:mod:`replaybank.distributed.writer`: copied once
into the group, closed at ``max_rows`` rows or ``max_bytes`` bytes, 64 Ki rows / 4 MiB by
default) and each group is sent as one ``extend(env_ids=...)`` of its shard. The client
puts the group in Ray's object store itself (``ray.put``, one copy into shared memory)
and passes the reference, so the shard reads the arrays in place (zero-copy, into its
buffer's storage) and a resend after a shard restart does not serialise the rows
again. At most ``max_in_flight`` sends per shard are unacknowledged. Ray costs about
1-3 ms per send whatever its size, which is why the defaults are large: with 1 Ki-row
sends that cost was ~90% of a send's time. A send that fails because its shard died is
sent again once Ray has restarted the shard (for up to ``timeout`` seconds); if the
shard does not come back, the call raises
:class:`~replaybank.distributed.errors.ShardUnavailableError` and the rows stay queued
(a later ``flush()`` sends them). A send that a shard's rate limiter holds past
``timeout`` raises :class:`~replaybank.distributed.limiter.RateLimitTimeout` in the call
that waited for it; nothing of it is written, and the shard turns the client's later
sends away too (they may not be written before it), so the rows stay queued, in order:
the next ``flush()`` (or a write that has to wait for a send) sends them again, the held
send first, and each row is written exactly once. Rows are never dropped silently; a
shard restored from its latest checkpoint holds what that checkpoint held (rows
acknowledged after it are gone with the crashed process).

Bad rows are refused by the call that passes them, before anything is queued: each
``add``/``extend`` is checked with one buffer's rules (field set, trailing shapes, the
casting rules of :meth:`~replaybank.spec.FieldSpec.cast`, through
:func:`~replaybank.buffers.checked_call.check_call`, against the spec the shards hold, asked
once, or the one this client's first call implies while none does; initial priorities
against the shards' sampler with :func:`~replaybank.buffers.priorities.priority_values`),
and the rows are queued as checked and cast. A shard can still refuse rows the client
could not check (another client's first rows set another spec first, or the shards'
view reshapes the inputs, as frame stacks do); it then writes the other calls of the
batch and names the refused ones, which the client reports once per call with a
:class:`~replaybank.distributed.errors.RowsRejectedWarning` (and in ``rejected``),
never by raising in a later call, whose own rows were stored.

Reads (one round trip): a batch must be split across shards by a multinomial draw over
the shards' masses (size, or total priority) *at the draw*
(:mod:`replaybank.distributed.split`), which the client cannot know before it asks.
So each live shard is asked, in one parallel round of calls, to draw ``m_s`` items
*and* report its mass ``(size, total, p_min)`` at that draw (:meth:`Shard.draw`). The
client then draws the split ``c ~ Multinomial(B, mass_s / sum(mass))`` from those
reported masses and keeps, of shard ``s``'s ``m_s`` draws, a uniformly random subset
of ``c_s`` (in draw order). Why this is exact: the ``m_s`` draws are independent of
``c`` and each has the shard's marginal ``p_i / total_s`` (stratified draws too: a
uniformly chosen stratum of ``m_s`` has it), so each kept item has it, and the batch
has one buffer's marginal ``p_i / total`` with weights from the same masses. ``m_s`` is
a spare-padded guess of ``c_s`` from the masses of the previous reply (``B q + 4 sd +
4``, ``q`` the previous share: ``B`` for a single shard or the first call), and the
previous masses only decide how many spares travel, never which items are kept, so
a stale guess costs bandwidth, not exactness. When ``c_s > m_s`` for some shard (a
share grew by more than 4 standard deviations since the last call: rare), those
shards are asked for ``c_s`` fresh items in a second round trip with the *same*
``c`` (drawing a new ``c`` would bias the split against large counts); their masses
may have moved in between, the inexactness the two-trip protocol always had. The
other option, a cached split checked against the reply, would need a second trip on
every write or priority update (every learner step), and every shard drawing ``B``
items moves ``S`` times the batch; spare-padded guesses move about ``1 + 4 sd / B`` of
it. ``draw_paths`` counts the calls that took one trip, needed the top-up, or took
the two-trip protocol. The shards' ``samples`` counts include the spare draws.

Windows (``sample_sequences``) cannot be split by mass exactly: a shard's share of the
*usable* starts is not its share of the mass. Over two or more live shards the client
samples them by rejection instead (:mod:`replaybank.distributed.rejection`): each shard
draws candidate starts independently and returns the usable ones' windows, one stream
of shard labels interleaves them, and the first ``B`` usable ones are kept; the
candidates asked for are sized from the previous masses and the usable rate of recent
calls of the same window shape (``draw_paths`` counts a call that needed more candidates
as ``top_up``).

The two-trip protocol (one round trip asks every live shard for its mass and whether its
limiter lets the draw through, a multinomial split follows, the shards draw in parallel)
is kept where spare draws would change state that matters: with rate limits (the limiter
counts every item drawn, and a batch draws only from the shards whose limiter allows
it), with ``max_times_sampled`` (every draw counts towards retiring the item), and for
``replace=False``. For ``sample`` the first trip also counts each shard's distinct items
(for a prioritized sampler, those with a positive priority), so a batch larger than all
of them together is refused, naming ``batch_size`` and the total, before anything is
drawn, and no shard is asked for more than it holds. With a uniform sampler the split is
multivariate hypergeometric over those counts, so the batch is a uniformly random subset
of all items, as one buffer's. With a prioritized one each shard draws its own
successive sample of ``min(B, its items)`` in the second trip, and the client takes a
prefix of each, as many as one buffer's successive sampling over all items would take
(:func:`~replaybank.distributed.split.split_successive`: exactly one buffer's law; the
spare draws count in the shards' ``samples``). Where shards may not draw spares (rate
limits, ``max_times_sampled``) the counts come first, from the shards' masses depleted
as items are taken (:func:`~replaybank.distributed.split.split_depleting`: one buffer's
law when priorities are equal within each shard, approximately otherwise). Distinct
windows (``sample_sequences(replace=False)``) are split the same way over each shard's
*servable* window starts (usable, of positive priority:
:func:`~replaybank.buffers.sequences.servable_windows`) and their mass, counted in the
first trip: one buffer's successive sampling over usable starts, a ``B`` above them all
refused, naming ``batch_size`` and the total, before anything is drawn, and no shard
asked for more windows than it serves. A shard whose call fails because its process died
is marked *degraded* (``degraded_shards``) and the batch is drawn from the others
(totals renormalised); a probe notices when Ray has restarted it. With rate limits, a
batch is drawn from the shards whose limiter lets it through now (renormalised the same
way; with one limiter per shard, waiting on a shard that needs inserts while the writer
waits on another that needs samples would deadlock), and waits, polling, while none
does. The beta schedule of a prioritized sampler is followed by each client (its
``calls`` count, saved with the client state).

Example (needs Ray; see :class:`~replaybank.distributed.service.ReplayService`)::

    service = ReplayService(2, {"capacity": 10_000, "sampler": {"type": "prioritized"}})
    client = service.client()
    client.add(obs=..., action=..., reward=..., next_obs=..., terminated=...,
               truncated=..., env_ids=[lane], priority=p0)
    batch = client.sample(256)
    client.update_priorities(batch.indices, new_priorities)
    seq = client.sample_sequences(32, 20, burn_in=4)          # R2D2 learner
    client.update_sequence_priorities(seq.starts, td_errors, eta=0.9, mask=seq.mask)

Priority updates (``update_priorities``, ``update_sequence_priorities``) are checked
here before anything is sent, so a bad call changes no shard; then each shard gets its
own keys (and rows) in one call, all shards in parallel, and the applied counts are
summed (stale keys, retired ones and shards that are down are skipped).
"""

from __future__ import annotations

import collections
import contextlib
import math
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from replaybank.batch import Batch, SequenceBatch
from replaybank.buffers.arguments import positional_values
from replaybank.buffers.buffer_state import probe_rng
from replaybank.buffers.checked_call import check_call
from replaybank.buffers.inputs import UNSET
from replaybank.buffers.one_thread import ThreadCheck, one_thread_call
from replaybank.buffers.priorities import (
    checked_updates,
    nothing_sampled,
    priority_values,
    to_host,
)
from replaybank.buffers.sequences import check_eta, checked_window_updates
from replaybank.buffers.store import no_device_draws
from replaybank.distributed.errors import RowsRejectedWarning, ShardUnavailableError
from replaybank.distributed.keys import group_by_shard, group_rows_by_shard
from replaybank.distributed.rejection import CandidateStream, candidate_counts
from replaybank.distributed.split import (
    check_distinct,
    check_held,
    merge,
    split_counts,
    split_depleting,
    split_distinct,
    split_successive,
)
from replaybank.distributed.writer import MAX_BYTES, MAX_ROWS, RowBatcher, lanes_of, tree_map
from replaybank.errors import (
    CheckpointError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    ShapeError,
    describe,
)
from replaybank.samplers.prioritized import PrioritizedSampler
from replaybank.samplers.sample_args import check_replace, check_size_arg
from replaybank.spec import SEP, Spec, as_array, rows_array, unflatten

__all__ = ["ReplayClient"]

#: Spare draws per shard on the one-trip path: ``B q + SPARE_SD sd + SPARE_ITEMS``.
SPARE_SD = 4.0
SPARE_ITEMS = 4
#: Further round trips a window draw may take when its candidates fall short.
MAX_TOP_UPS = 16

#: One send to a shard: (extend task ref, payload object ref, send number, [(call, rows)]).
Send = tuple[Any, Any, int, list[tuple[Any, int]]]


def _ray() -> Any:
    import ray

    return ray


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name}={value!r}: must be an int >= 1")
    return int(value)


#: The fix a second thread's call is told (see :class:`ReplayClient`, Threads).
_ONE_THREAD_FIX = (
    "a ReplayClient is for one thread at a time (its write queue and acknowledgements "
    "are not locked: a lock would hold a collector's add for the learner's round trips, "
    "and a sample waiting on a rate limiter for inserts a blocked add would make never "
    "returns); give each thread its own client: service.client(name) with its own name "
    "in each (e.g. 'learner' and 'collector'), or pickle.loads(pickle.dumps(client))")


def _draw_call(n: int, sequences: tuple[int] | None) -> str:
    """The call a draw of ``n`` serves, as its messages name it."""
    return f"sample{'' if sequences is None else '_sequences'}(batch_size={n})"


class ReplayClient:
    """Reads and writes a :class:`~replaybank.distributed.service.ReplayService`.

    Built by ``service.client()``; see the module docs for what each call does.

    Threads: a client serves one thread at a time. A call made while another thread's
    call on the same client runs raises
    :class:`~replaybank.errors.ConcurrentCallError` before it queues, sends or draws
    anything; give each thread its own client (``service.client("learner")`` and
    ``service.client("collector")``). Unchecked, a collector thread's ``add`` beside the
    learner's ``sample`` and ``update_priorities`` broke the acknowledgement queue
    (``IndexError: pop from an empty deque`` in 2 runs of 3 of a probe).

    Args:
        shards: The shard actor handles, in shard order.
        num_lanes: Global lanes (env lanes) of the service.
        sampler: The shards' sampler config (``{"type": ..., ...}``).
        seed: Seed or Generator of the batch split.
        max_rows: Pending rows per shard that trigger a send.
        max_age_s: Age of the oldest pending row that triggers a send of everything.
        max_in_flight: Unacknowledged sends per shard before a write waits.
        timeout: Seconds any blocking call (rate limiter included) waits.
        rate_limited: The shards have rate limiters: a sample of empty shards waits for
            data (up to ``timeout``) instead of raising EmptyBufferError, and samples
            take the two-trip protocol.
        max_bytes: Pending bytes per shard that trigger a send.
        max_times_sampled: The service's ``max_times_sampled`` (set: samples take the
            two-trip protocol).
        capacity: Steps all shards hold together (:attr:`capacity`); None: unknown.

    Attributes:
        num_shards: Number of shards.
        num_lanes: Global lanes.
        draw_paths: Sample calls by path: ``one_trip``, ``top_up`` (a second trip for
            shards whose spares fell short) and ``two_trips`` (rate limits,
            ``max_times_sampled`` or ``replace=False``).
        rejected: ``{call number: report}`` of the ``add``/``extend`` calls whose rows a
            shard refused after this client had checked and queued them (each also
            reported once with a
            :class:`~replaybank.distributed.errors.RowsRejectedWarning`).
    """

    def __init__(self, shards: list[Any], num_lanes: int, sampler: dict[str, Any],
                 seed: int | np.random.Generator | None = None, max_rows: int = MAX_ROWS,
                 max_age_s: float = 1.0, max_in_flight: int = 4,
                 timeout: float = 60.0, rate_limited: bool = False,
                 max_bytes: int = MAX_BYTES, max_times_sampled: int | None = None,
                 capacity: int | None = None) -> None:
        self._shards = list(shards)
        self._capacity = capacity
        self.num_shards = len(self._shards)
        self.num_lanes = num_lanes
        self.max_rows = _positive("max_rows", max_rows)
        self.max_bytes = _positive("max_bytes", max_bytes)
        self.max_in_flight = _positive("max_in_flight", max_in_flight)
        if not (isinstance(max_age_s, (int, float)) and max_age_s >= 0):
            raise ConfigError(f"max_age_s={max_age_s!r}: must be a number >= 0 (seconds)")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ConfigError(f"timeout={timeout!r}: must be a number > 0 (seconds)")
        self.max_age_s = float(max_age_s)
        self.timeout = float(timeout)
        self.rate_limited = rate_limited
        self.max_times_sampled = max_times_sampled
        self.draw_paths = {"one_trip": 0, "top_up": 0, "two_trips": 0}
        # each shard's mass (total) in its latest reply: sizes the next one-trip draw
        self._seen: list[float] | None = None
        self._sampler_config = dict(sampler)
        self._schedule: PrioritizedSampler | None = None
        if sampler.get("type") == "prioritized":
            params = {k: v for k, v in sampler.items() if k != "type"}
            self._schedule = PrioritizedSampler(**params, kernel="numpy")
        self._rng = seed if isinstance(seed, np.random.Generator) \
            else np.random.default_rng(seed)
        # window widths this client drew (what update_sequence_priorities checks
        # td_errors against when no mask is given, as one buffer does)
        self._seq_widths: set[int] = set()
        # the shards' priority rule, asked once: (has priorities, largest raw priority)
        self._priority_rule: tuple[bool, float] | None = None
        # what writes are checked against (Shard.write_rule), asked before the first
        # write and again after a shard refused rows
        self._rules: dict[str, Any] | None = None
        self._calls = 0  # add/extend calls so far: a refused call is named by its number
        # refused calls not yet reported: number -> (call, shards, rows, error)
        self._unreported: dict[int, tuple[str, list[int], int, BaseException]] = {}
        self.rejected: dict[int, str] = {}
        # whether the shards draw independently (exact windows), asked once
        self._draws_independent: bool | None = None
        # per window shape: (usable, drawn) candidates of the recent window draws (each
        # call halves the old counts); their ratio sizes the next draw
        self._window_rates: dict[tuple[int, str], tuple[float, float]] = {}
        self._reset_io()

    def _reset_io(self) -> None:
        self.thread_check = ThreadCheck("ReplayClient", _ONE_THREAD_FIX)
        self._batcher = RowBatcher(self.num_shards, self.max_rows, self.max_age_s,
                                   self.max_bytes)
        # per shard, each send: (extend task ref, payload object ref, its number, the
        # calls in it and their rows there)
        self._in_flight: dict[int, collections.deque[Send]] = {
            s: collections.deque() for s in range(self.num_shards)}
        self._degraded: dict[int, Any] = {}  # shard -> probe ref
        #: How often each shard was found dead by this client (shard -> count).
        self.shard_failures: dict[int, int] = {}
        # sends are numbered per shard: Ray may start an async actor's calls out of order,
        # and the shard writes each client's rows in this order (Shard._turn)
        self._id = uuid.uuid4().hex
        self._seq = [0] * self.num_shards

    @property
    def num_envs(self) -> int:
        """The same as :attr:`num_lanes`, under the local buffer's name: the env lanes
        ``add``/``extend`` take values for, so :func:`replaybank.collect`,
        :class:`replaybank.Collector` and :func:`replaybank.warm` fill a client as they
        fill a buffer of ``num_envs`` lanes."""
        return int(self.num_lanes)

    @property
    def spec(self) -> Spec | None:
        """The stored fields, as a buffer's ``spec``: those the shards hold, or the ones
        this client's first call implied while no shard holds any (None before that,
        or while every shard is down). Asked of the shards once (see
        :meth:`write_rule`), so reading it per step costs nothing."""
        rule = self._write_rule()
        spec: Spec | None = None if rule is None else rule["spec"]
        return spec

    @property
    def capacity(self) -> int:
        """Steps all shards hold together (each shard holds its config's ``capacity``),
        as a buffer's ``capacity``.

        Raises:
            ConfigError: The client was built without it (not by
                :meth:`ReplayService.client
                <replaybank.distributed.service.ReplayService.client>`).
        """
        if self._capacity is None:
            raise ConfigError("ReplayClient.capacity: this client was built without it; "
                              "get clients from ReplayService.client()")
        return int(self._capacity)

    # ------------------------------------------------------------------ pickling
    @one_thread_call("pickle")
    def __getstate__(self) -> dict[str, Any]:
        """Flush (and wait for) pending rows, then pickle without the write queues."""
        self.flush()
        state = self.__dict__.copy()
        for name in ("_batcher", "_in_flight", "_degraded", "_id", "_seq", "shard_failures",
                     "thread_check"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_io()

    # ------------------------------------------------------------------ writes
    @one_thread_call("add")
    def add(self, /, *args: Any, obs: Any = UNSET, action: Any = UNSET, reward: Any = UNSET,
            next_obs: Any = UNSET, terminated: Any = UNSET, truncated: Any = UNSET,
            env_ids: Any = None, priority: Any = None, **extras: Any) -> None:
        """Queue one step per lane (as :meth:`replaybank.ReplayBuffer.add`).

        Values are ``[num_lanes, *shape]`` (``[*shape]`` with one lane), or
        ``[len(env_ids), *shape]`` for the global lanes ``env_ids``; ``priority`` is
        None, one number, or one per lane (prioritized shards only). The call is
        checked here, with one buffer's rules, before anything is queued (see
        :meth:`_checked`), so bad rows raise in this call and nothing of it is kept.

        Raises:
            SpecError: A field is missing or unknown (the shards' fields, or the ones
                this client's first call implied).
            ShapeError: ``env_ids``, a value's shape or the number of priorities does
                not fit.
            DtypeError: A value the fields' casting rules refuse, or a priority that is
                not a number, negative, NaN, infinite or above the shards' limit.
            ConfigError: ``priority`` given while the shards' sampler has none.
            ArgumentError: Positional values (keyword arguments only, as
                :meth:`replaybank.ReplayBuffer.add`).
            ShardUnavailableError: A send of earlier rows could not be delivered.
            RateLimitTimeout: A send of earlier rows was held by a shard's rate limiter
                past ``timeout`` (this call's rows are queued; every queued row is sent
                again by the next ``flush()``).
        """
        if args:
            raise positional_values("add", args)
        values = self._values(obs, action, reward, next_obs, terminated, truncated, extras)
        self._write("add", values, env_ids, priority)

    @one_thread_call("extend")
    def extend(self, /, *args: Any, obs: Any = UNSET, action: Any = UNSET, reward: Any = UNSET,
               next_obs: Any = UNSET, terminated: Any = UNSET, truncated: Any = UNSET,
               env_ids: Any = None, priority: Any = None, **extras: Any) -> None:
        """Queue ``T`` steps per lane: values ``[T, num_lanes, *shape]`` (``[T, *shape]``
        with one lane) or ``[T, len(env_ids), *shape]``; ``priority`` None, one number
        or ``[T, k]`` (``[T]`` with one lane). Checked as :meth:`add` is (the same
        errors), before anything is queued."""
        if args:
            raise positional_values("extend", args)
        values = self._values(obs, action, reward, next_obs, terminated, truncated, extras)
        self._write("extend", values, env_ids, priority)

    def _write(self, call: str, values: dict[str, Any], env_ids: Any, priority: Any) -> None:
        """Number the call, check it, queue its rows and send the groups that are full."""
        self._calls += 1
        tag = (call, self._calls)
        lanes = self._lanes(env_ids, call)
        rows, pr = self._checked(call, values, env_ids, lanes, priority)
        try:
            self._queue(self._batcher.append(rows, lanes, pr, steps=True, call=tag))
        finally:
            self._report(stacklevel=4)

    def _checked(self, call: str, values: dict[str, Any], env_ids: Any, lanes: Any,
                 priority: Any) -> tuple[dict[str, Any], Any]:
        """The rows of one ``add``/``extend`` as they are queued: values
        ``[T, k, *shape]`` (nested dicts kept) and priorities ``[T, k]`` or None.

        The values are checked and cast with one buffer's rules
        (:func:`~replaybank.buffers.checked_call.check_call` against the shards' spec, or the
        spec this client's first call implied while no shard holds one) and the
        priorities with :func:`~replaybank.buffers.priorities.priority_values` against
        the shards' limit, so the rows a shard receives are ones it stores. Where the
        shards' view reshapes the inputs (frame stacks) only the leading dims are
        checked here; a shard that refuses rows reports them (:meth:`_report`).
        """
        steps = call == "extend"
        k = len(lanes)
        rule = self._write_rule()
        spec = None
        if rule is not None and not rule["transform"]:
            ids, num = (None, self.num_lanes) if env_ids is None else (np.arange(k), k)
            checked = check_call(rule["spec"], values, steps, ids, num, rule["rows"])
            spec = checked.spec
            flat = dict(checked.values)
            for name, v in checked.next_obs.items():
                flat["next_" + name] = v
            rows, out = unflatten(flat), checked.out
        else:
            single = env_ids is None and self.num_lanes == 1
            if single:
                values = tree_map(lambda v: v[:, None] if steps else v[None], values)
            lead = _lead(values)
            want = (lead[0] if lead else -1, k) if steps else (k,)
            self._check_lead(values, want, call, "[T, num_lanes, *shape] or [T, len(env_ids), "
                             "*shape]" if steps else "[num_lanes, *shape] or "
                             "[len(env_ids), *shape]")
            rows = values if steps else tree_map(lambda v: v[None], values)
            out = (int(want[0]) if steps else 1, k)
        pr = None
        if priority is not None and rule is None:
            pr = self._priority(priority, out, call)  # no shard answered: checked there
        elif priority is not None and rule is not None:
            if rule["limit"] is None:
                raise ConfigError(
                    f"{call}(priority={describe(priority)}): the service's sampler "
                    f"({rule['sampler']}) has no priorities; leave priority=None or build "
                    "the service with sampler={'type': 'prioritized', ...}")
            pr = priority_values(priority, out, float(rule["limit"]),
                                 f"{call}(priority={describe(priority)})").reshape(out)
        if rule is not None and rule["spec"] is None:
            rule["spec"] = spec  # a valid first call implies the spec (as one buffer's)
        return rows, pr

    def write_rule(self) -> dict[str, Any] | None:
        """What this client checks writes against: :meth:`Shard.write_rule
        <replaybank.distributed.shard.Shard.write_rule>` of the shards (asked once, and
        again after a shard refused rows), or None while no shard answers. A buffer
        type's client front reads its own entries from it (the multi-agent layout)."""
        return self._write_rule()

    def _write_rule(self) -> dict[str, Any] | None:
        """What writes are checked against (:meth:`Shard.write_rule
        <replaybank.distributed.shard.Shard.write_rule>`), asked of every live shard
        once (the first spec any holds; none yet: the first call implies it), and again
        after a shard refused rows; None while no shard answers."""
        if self._rules is None:
            self._probe()
            live = [s for s in range(self.num_shards) if s not in self._degraded]
            answers, _ = self._gather({s: self._shards[s].write_rule.remote() for s in live})
            if answers:
                rules = [answers[s] for s in sorted(answers)]
                self._rules = next((r for r in rules if r["spec"] is not None), rules[0])
        return self._rules

    @staticmethod
    def _values(obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any,
                truncated: Any, extras: dict[str, Any]) -> dict[str, Any]:
        given = {"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                 "terminated": terminated, "truncated": truncated, **extras}
        return {k: _host_values(k, v) for k, v in given.items() if v is not UNSET}

    def _lanes(self, env_ids: Any, call: str) -> Any:
        if env_ids is None:
            return np.arange(self.num_lanes, dtype=np.int64)
        return lanes_of(env_ids, self.num_lanes, call)

    @staticmethod
    def _check_lead(values: dict[str, Any], lead: tuple[int, ...], call: str,
                    want: str) -> None:
        def check(name: str, v: Any) -> None:
            if isinstance(v, dict):
                for k, x in v.items():
                    check(f"{name}/{k}", x)
            elif tuple(np.shape(v)[:len(lead)]) != lead:
                raise ShapeError(f"{call}({name}={describe(v)}): leading dims must be "
                                 f"{lead}, i.e. {want}")
        for name, v in values.items():
            check(name, v)

    @staticmethod
    def _priority(priority: Any, out: tuple[int, int], call: str) -> Any:
        """``priority`` as ``[T, k]`` float64 (one number or one per row), its values
        unchecked: for a write while no shard can say its priority rule.

        Raises:
            ShapeError: A ragged nest (the one ragged check,
                :func:`~replaybank.spec.rows_array`), or neither one number nor one per
                row.
            DtypeError: Not numbers.
        """
        # (a ragged list: the ShapeError a shard-checked write raises, priority_values')
        rows = rows_array(
            to_host(priority)[0],
            lambda: f"{call}(priority={describe(priority)})",
            f"one priority per step ({out[0] * out[1]} values) or one for all",
            "pass a flat list or array of numbers, e.g. np.abs(td_errors)",
        )
        if not isinstance(rows, np.ndarray) or rows.dtype.kind not in "biuf":
            raise DtypeError(f"{call}(priority={describe(priority)}): priorities must be "
                             "numbers; pass e.g. np.abs(td_errors)")
        p = rows.astype(np.float64)
        if p.size == 1:
            return np.full(out, float(p.reshape(-1)[0]))
        if p.size != out[0] * out[1]:
            raise ShapeError(f"{call}(priority={describe(priority)}): expected one number "
                             f"or one per row ({out[0] * out[1]} values)")
        return p.reshape(out)

    def _queue(self, ready: list[int]) -> None:
        for s in ready:
            payload = self._batcher.take(s)
            while payload is not None:
                self._send(s, payload)
                payload = self._batcher.take(s)

    def _send(self, shard: int, payload: dict[str, Any]) -> None:
        q = self._in_flight[shard]
        seq = self._seq[shard]
        self._seq[shard] += 1
        k = len(payload["env_ids"])  # the calls of the send and their rows here
        calls = [(tag, (t1 - t0) * k) for tag, t0, t1 in payload.get("calls", [])]
        data = _ray().put(payload)  # one copy into shared memory; resends reuse it
        # while sends the rate limiter turned away wait to be sent again (by _ack, in
        # order), a new one waits behind them
        held = any(sent[0] is None for sent in q)
        q.append((None if held else self._submit(shard, data, seq), data, seq, calls))
        while len(q) > self.max_in_flight:
            self._ack(shard)

    def _submit(self, shard: int, data: Any, seq: int) -> Any:
        """Send the payload ``data`` (an object ref) as send ``seq``, telling the shard
        which of our sends is the oldest unacked."""
        q = self._in_flight[shard]
        floor = q[0][2] if q else seq
        return self._shards[shard].extend.remote(data, self.timeout, (self._id, seq, floor))

    def _ack(self, shard: int) -> None:
        """Wait for the oldest send to ``shard``; resend it while the shard restarts.
        Rows the shard refused are noted for :meth:`_report` (never raised here: the
        call that waits is not the one that passed them).

        A send the rate limiter turned away (not written) is sent again here, alone;
        once it is written, the later sends turned away with it go again, in order
        (the shard writes each send once: a resend of a written one is skipped).

        Raises:
            RateLimitTimeout: The rate limiter turned the send away again; every send
                not written stays queued for the next call.
            ShardUnavailableError: The shard did not come back, or did not answer, in
                time (the rows stay queued).
        """
        ray = _ray()
        q = self._in_flight[shard]
        ref, data, seq, calls = q[0]
        if ref is None:  # turned away by the rate limiter: send it again
            ref = self._submit(shard, data, seq)
            q[0] = (ref, data, seq, calls)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                reply = ray.get(ref, timeout=self.timeout + 10.0)
                q.popleft()
                for tag, rows, error in reply["refused"]:
                    self._refused(shard, tag, rows, error)
                for i, (later, d, n, c) in enumerate(q):
                    if later is None:  # turned away with this one: its turn has come
                        q[i] = (self._submit(shard, d, n), d, n, c)
                return
            except ray.exceptions.RayActorError:
                if time.monotonic() > deadline:
                    raise ShardUnavailableError(
                        f"flush: shard {shard} did not come back within timeout="
                        f"{self.timeout}s; its {len(q)} pending sends stay queued, call "
                        "flush() again (or restart the service from a checkpoint)") from None
                time.sleep(0.2)
                ref = self._submit(shard, data, seq)
                q[0] = (ref, data, seq, calls)
            except ray.exceptions.GetTimeoutError:
                raise ShardUnavailableError(
                    f"flush: shard {shard} did not answer within {self.timeout + 10.0}s; "
                    "the rows stay queued, call flush() again") from None
            except Exception as exc:  # the shard failed before it wrote (or rate limit)
                cause = getattr(exc, "cause", None)
                error = cause if isinstance(cause, Exception) else exc
                if _is_rate_limit(cause):
                    self._turned_away(shard)
                    raise error from None  # the rows stay queued for a retry
                q.popleft()  # nothing of the send was written: its calls are refused
                for tag, rows in calls:
                    self._refused(shard, tag, rows, error)
                return

    def _turned_away(self, shard: int) -> None:
        """The oldest send to ``shard`` was turned away by the rate limiter (nothing of it
        written). Wait for the later sends in flight (the shard turns them away at once,
        as they may not be written before it) and mark every send not written as unsent
        (reference None), to be sent again, in order, by :meth:`_ack`."""
        ray = _ray()
        q = self._in_flight[shard]
        deadline = time.monotonic() + self.timeout + 10.0
        kept: collections.deque[Send] = collections.deque()
        for i, (ref, data, seq, calls) in enumerate(q):
            if i == 0 or ref is None:
                kept.append((None, data, seq, calls))
                continue
            try:
                reply = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError:
                kept.append((ref, data, seq, calls))  # still on its way: waited for later
                continue
            except ray.exceptions.RayActorError:
                kept.append((None, data, seq, calls))  # sent again once the shard is back
                continue
            except Exception as exc:
                cause = getattr(exc, "cause", None)
                if _is_rate_limit(cause):
                    kept.append((None, data, seq, calls))
                    continue
                error = cause if isinstance(cause, Exception) else exc
                for tag, rows in calls:  # nothing of the send was written
                    self._refused(shard, tag, rows, error)
                continue
            for tag, rows, error in reply["refused"]:  # written (not after a held send)
                self._refused(shard, tag, rows, error)
        q.clear()
        q.extend(kept)

    def _refused(self, shard: int, tag: Any, rows: int, error: BaseException) -> None:
        """Note that ``shard`` refused ``rows`` rows of the call ``tag`` (reported once by
        :meth:`_report`); the shards' spec is asked again before the next write."""
        self._rules = None
        call, number = tag
        got = self._unreported.get(number)
        if got is None:
            self._unreported[number] = (call, [shard], rows, error)
        else:
            got[1].append(shard)
            self._unreported[number] = (call, got[1], got[2] + rows, got[3])

    def _report(self, stacklevel: int = 3) -> None:
        """Warn once per call whose rows a shard refused (:class:`RowsRejectedWarning`),
        and record it in :attr:`rejected`; never raised by a later call, whose own rows
        were stored."""
        unreported, self._unreported = self._unreported, {}
        for number, (call, shards, rows, error) in sorted(unreported.items()):
            if number in self.rejected:
                continue  # another shard's part of a call already reported
            what = f"its {rows} rows, which are not stored" if rows else "it"
            message = (
                f"{call} call {number} of this client (every add/extend/end_episodes call "
                f"it received counts, from 1): shards {sorted(set(shards))} refused {what} "
                f"({type(error).__name__}: {error}); the other calls' rows were stored. "
                "Fix those values and write them again")
            self.rejected[number] = message
            warnings.warn(RowsRejectedWarning(message), stacklevel=stacklevel)

    @one_thread_call("flush")
    def flush(self, wait: bool = True) -> None:
        """Send every pending row; with ``wait``, also wait until each shard wrote them.

        Sends a shard's rate limiter held (see :meth:`add`) go again, the oldest first:
        without ``wait`` only that one is sent now, the others once it is written (by a
        later call that waits).

        Rows a shard refused (possible only where the client could not check them: see
        :meth:`_checked`) are reported once, naming their call, with a
        :class:`~replaybank.distributed.errors.RowsRejectedWarning` (and in
        :attr:`rejected`), never raised: every other call's rows were stored.

        Raises:
            ShardUnavailableError: A shard did not come back in time (rows stay queued).
            RateLimitTimeout: A shard's rate limiter held a send past ``timeout`` (the
                rows not written stay queued, in order; call ``flush()`` again once the
                learner has sampled).
        """
        try:
            self._queue(self._batcher.close_all())
            for s in range(self.num_shards):
                q = self._in_flight[s]
                if wait:
                    while q:
                        self._ack(s)
                elif q and q[0][0] is None:
                    # held by the rate limiter: send it again (the later ones it held
                    # follow once it is written, in _ack)
                    _, data, seq, calls = q[0]
                    q[0] = (self._submit(s, data, seq), data, seq, calls)
        finally:
            self._report(stacklevel=3)

    @one_thread_call("close")
    def close(self) -> None:
        """Flush and wait; the client may still be used afterwards."""
        self.flush()

    @one_thread_call("end_episodes")
    def cut_episodes(self, env_ids: Any) -> None:
        """End the running episodes of the global lanes ``env_ids`` on their shards
        after the rows this client queued for them, in the order of its writes: the
        shards' ``end_episodes`` (a ``MultiAgentReplayBuffer``'s). A buffer type's front
        calls it (:meth:`MultiAgentReplayClient.end_episodes
        <replaybank.multiagent.distributed.MultiAgentReplayClient.end_episodes>`).

        The cut travels as a write of no rows (:meth:`RowBatcher.cut
        <replaybank.distributed.writer.RowBatcher.cut>`), sent now with the rows queued
        before it, so the client does not wait for it and it is sent again, in order,
        as rows are (a shard that restarts, a rate limiter that holds earlier rows). A
        shard whose buffer keeps no episodes refuses it; the call is then reported as
        a refused write is (:class:`~replaybank.distributed.errors.RowsRejectedWarning`,
        :attr:`rejected`), counted as an add/extend call.

        Args:
            env_ids: Distinct global lanes.

        Raises:
            ShapeError: ``env_ids`` are not distinct lanes of the service (nothing queued).
            ShardUnavailableError: A send of earlier rows could not be delivered (the
                cut stays queued behind them).
            RateLimitTimeout: A send of earlier rows was held by a rate limiter past
                ``timeout`` (the cut stays queued behind them).
        """
        lanes = lanes_of(env_ids, self.num_lanes, "end_episodes")
        self._calls += 1
        try:
            self._queue(self._batcher.cut(lanes, ("end_episodes", self._calls)))
        finally:
            self._report(stacklevel=4)

    @one_thread_call("clear")
    def clear(self) -> None:
        """Drop every row of the service, as :meth:`replaybank.ReplayBuffer.clear` drops
        a buffer's.

        This client's queued rows are dropped (never sent), and every shard is cleared
        with its buffer's own ``clear()``: PER priorities and the running max priority
        (new rows start at 1 again), sequence state, a multi-agent buffer's joint
        episode bookkeeping and cuts, and the ``max_times_sampled`` counts; the rate
        limiters' sizes drop to 0. As for a buffer, the spec, the generators, the beta
        schedule and the counts of ``service.stats()`` go on, and keys drawn before
        turn stale (a late ``update_priorities`` for them is ignored). A ``sample`` then
        raises :class:`~replaybank.errors.EmptyBufferError` until rows are written.

        Everything this client wrote before the call is gone, also rows it had sent
        that a shard had not written yet (a shard voids them, even one a rate limiter
        holds); its later rows follow the clear. Other clients: each shard clears
        between two of its calls, so each send of another client lands wholly before
        the clear (dropped) or wholly after it (kept), never half; rows another client
        still queues, or sends while the shards clear, are kept where they arrive after
        it, so for a clean cut flush and pause the other writers first. A shard that
        Ray restarts later reloads the latest checkpoint, which may predate the clear:
        checkpoint after it.

        Shards that are down are waited for, as a write waits for them (up to
        ``timeout``), because skipping one would leave its rows to be sampled after
        the clear.

        Raises:
            ShardUnavailableError: A shard was down and did not come back within
                ``timeout`` (it names the shards; nothing was cleared and this
                client's queued rows are kept), or one died while the others cleared
                and did not come back (named; call ``clear()`` again).
            ReplayBankError: A shard's own error (one that could not start).

        Example (needs Ray)::

            client.extend(**first_task_steps)
            client.clear()                  # between tasks, as buf.clear()
            client.sample(32)               # EmptyBufferError, as a buffer's
        """
        ray = _ray()
        deadline = time.monotonic() + self.timeout
        self._probe()  # first every shard answers (one it finds dead is waited for)
        self._gather({s: self._shards[s].mass.remote() for s in range(self.num_shards)
                      if s not in self._degraded})
        while self._degraded:
            if time.monotonic() > deadline:
                raise ShardUnavailableError(
                    f"clear: shards {sorted(self._degraded)} are down and did not come back "
                    f"within timeout={self.timeout}s; nothing was cleared (this client's "
                    "queued rows are kept). Call clear() again once Ray has restarted "
                    "them (client.degraded_shards), or restart the service")
            time.sleep(0.2)
            self._probe()
        self._batcher = RowBatcher(self.num_shards, self.max_rows, self.max_age_s,
                                   self.max_bytes)
        todo = list(range(self.num_shards))
        while True:
            # each shard voids this client's sends numbered below its next one
            done, todo = self._gather({s: self._shards[s].clear.remote(
                (self._id, self._seq[s])) for s in todo})
            for s in done:  # read the void sends' replies (none is left unread), drop them
                sent = [ref for ref, _, _, _ in self._in_flight[s] if ref is not None]
                self._in_flight[s].clear()
                for ref in sent:  # written and cleared, or never written: gone alike
                    with contextlib.suppress(Exception):
                        ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            if not todo:
                return
            if time.monotonic() > deadline:
                raise ShardUnavailableError(
                    f"clear: shards {sorted(todo)} died while the service was cleared and "
                    f"did not come back within timeout={self.timeout}s; the other shards "
                    "were cleared. Call clear() again once Ray has restarted them")
            time.sleep(0.2)

    @property
    def pending_rows(self) -> int:
        """Rows queued here and not yet sent."""
        return self._batcher.pending_rows

    # ------------------------------------------------------------------ reads
    @property
    def degraded_shards(self) -> frozenset[int]:
        """Shards whose process died and that are not back yet (sampling skips them)."""
        self._probe()
        return frozenset(self._degraded)

    def _probe(self) -> None:
        if not self._degraded:
            return
        ray = _ray()
        for s, probe in list(self._degraded.items()):
            ready, _ = ray.wait([probe], timeout=0)
            if ready:
                try:
                    ray.get(probe)
                    del self._degraded[s]
                except ray.exceptions.RayActorError:
                    self._degraded[s] = self._shards[s].mass.remote()

    def _mark_degraded(self, shard: int) -> None:
        self.shard_failures[shard] = self.shard_failures.get(shard, 0) + 1
        self._degraded[shard] = self._shards[shard].mass.remote()

    def _gather(self, refs: dict[int, Any]) -> tuple[dict[int, Any], list[int]]:
        """``ray.get`` each; shards whose process died go to the failed list.

        Every reference is waited for (all within one ``timeout + 10`` s deadline)
        before an error is raised: the first shard's error (or a ShardUnavailableError
        for a shard that did not answer), never one that leaves another shard's reply
        unread (Ray logs an "Unhandled error" for an abandoned failed reference).
        """
        ray = _ray()
        out: dict[int, Any] = {}
        failed: list[int] = []
        error: BaseException | None = None
        deadline = time.monotonic() + self.timeout + 10.0
        for s, ref in refs.items():
            try:
                out[s] = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except ray.exceptions.RayActorError:
                failed.append(s)
            except ray.exceptions.GetTimeoutError:
                if error is None:
                    error = ShardUnavailableError(f"shard {s} did not answer within "
                                                  f"{self.timeout + 10.0}s")
            except ray.exceptions.RayTaskError as exc:
                if error is None:
                    cause = exc.cause
                    error = cause if isinstance(cause, Exception) else exc
        for s in failed:
            self._mark_degraded(s)
        if error is not None:
            raise error from None
        return out, failed

    def _live(self, call: str) -> list[int]:
        """The shards not known to be down (after a probe for restarted ones).

        Raises:
            ShardUnavailableError: Every shard is down.
        """
        self._probe()
        live = [s for s in range(self.num_shards) if s not in self._degraded]
        if not live:
            raise ShardUnavailableError(f"{call}: every shard is down "
                                        f"({sorted(self._degraded)}); wait for Ray to "
                                        "restart them")
        return live

    @one_thread_call("masses")
    def masses(self) -> dict[int, tuple[int, float, float]]:
        """``{shard: (size, total, p_min)}`` of the live shards (one round trip)."""
        self._probe()
        live = [s for s in range(self.num_shards) if s not in self._degraded]
        out, _ = self._gather({s: self._shards[s].mass.remote() for s in live})
        return out

    @one_thread_call("len")
    def __len__(self) -> int:
        """Items stored in the live shards, this client's own queued rows included (they
        are sent first, see :meth:`_send_own_rows`); rows other clients still queue are
        not counted."""
        self._send_own_rows()
        return sum(m[0] for m in self.masses().values())

    def _send_own_rows(self) -> None:
        """Before a read (``sample``, ``sample_sequences``, ``len``): send the rows this
        client queued and wait until the live shards wrote them, so that the read sees
        every row this client added before it, as a read of one buffer does (a training
        loop that adds and samples through one client runs as it runs on a buffer,
        without ``flush()`` calls). Costs nothing when nothing is queued or in flight
        (a learner that only samples).

        Shards known to be down are not waited for (their rows stay queued, the read
        skips them). With rate limits the rows are sent without waiting: a limiter may
        hold inserts until samples come, which this read is.

        Raises:
            ShardUnavailableError: A live shard did not take the rows in time (they stay
                queued).
        """
        if not self._batcher.pending_rows and not any(self._in_flight.values()):
            return
        self._probe()
        try:
            self._queue(self._batcher.close_all())
            if self.rate_limited:
                return
            for s in range(self.num_shards):
                while self._in_flight[s] and s not in self._degraded:
                    self._ack(s)
        finally:
            self._report(stacklevel=4)

    @one_thread_call("sample")
    def sample(self, /, batch_size: int, replace: bool = True, **kwargs: Any) -> Batch:
        """Sample ``batch_size`` transitions from every live shard (global distribution).

        Args:
            batch_size: B.
            replace: Draw with replacement (default); ``False`` draws distinct items:
                with a uniform sampler a uniformly random subset of all shards' items
                (one buffer's law: the shard counts are multivariate hypergeometric);
                with a prioritized one, one buffer's successive sampling over all
                shards' items (each next item in proportion to priority among those
                not drawn yet), exactly; with rate limits or ``max_times_sampled``,
                where shards may not draw spares, that law when priorities are equal
                within each shard and approximately otherwise (see the module docs).
            **kwargs: Sampler options (``beta`` for prioritized shards).

        Returns:
            A :class:`~replaybank.batch.Batch` as one buffer returns, ``indices`` being
            global keys; prioritized: global ``probabilities`` and ``weights``.

        Raises:
            EmptyBufferError: The live shards hold nothing, or (``replace=False``)
                fewer distinct items than ``batch_size`` (refused before anything is
                drawn: the generators are unchanged).
            ShardUnavailableError: No shard is alive.
            RateLimitTimeout: A shard's rate limiter held the call past ``timeout``.
        """
        return Batch.own(self._draw(batch_size, None, {"replace": replace, **kwargs}))

    def sample_fn(self, batch_size: int) -> Callable[[], Batch]:
        """Refused, as a local buffer on host storage refuses it: the shards draw and
        gather on the host of their own processes, so there is no device path to
        capture; call :meth:`sample` (and ``batch.to_torch(device)``).

        Raises:
            ConfigError: Always (the buffer's message, naming the client).
        """
        raise no_device_draws("a ReplayClient (its shards sample on their own hosts)")

    @one_thread_call("sample_sequences")
    def sample_sequences(self, /, batch_size: int, sequence_length: int,
                         **kwargs: Any) -> SequenceBatch:
        """Sample ``[B, L]`` windows (as :meth:`replaybank.ReplayBuffer.sample_sequences`).

        The windows follow one buffer's law over all shards (the sampler's law
        conditioned on usable starts): with several live shards whose sampler draws
        independently (uniform, prioritized), by rejection on one stream of candidate
        starts from every shard (:mod:`replaybank.distributed.rejection`: one round
        trip, more only when the candidates fall short); with one live shard, that
        shard's own draw. ``replace=False`` draws distinct windows with one buffer's
        law (successive sampling over the usable starts of positive priority, see
        :func:`~replaybank.buffers.sequences.sample_sequences`): the batch is split over
        the shards' servable starts as :meth:`sample` splits distinct items, exactly
        for a uniform sampler and, without rate limits or ``max_times_sampled``, a
        prioritized one (with them, exactly when priorities are equal within each
        shard). With rate limits, ``max_times_sampled`` or other samplers, a batch with
        replacement is split by shard mass, which equals that law when every shard has
        the same fraction of usable starts. ``starts`` are global keys.

        Raises:
            EmptyBufferError: No usable window, or (``replace=False``) fewer servable
                ones over the live shards than ``batch_size`` (refused before anything
                is drawn: the generators are unchanged).
            ConfigError: Bad window arguments.
        """
        call = "sample_sequences"
        batch_size = check_size_arg("batch_size", batch_size, call)
        length = check_size_arg("sequence_length", sequence_length, call)
        batch = SequenceBatch.own(self._draw(batch_size, (length,), kwargs))
        if len(self._seq_widths) < 16:  # what update_sequence_priorities checks against
            self._seq_widths.add(int(batch.mask.shape[1]))
        return batch

    def _draw(self, n: int, sequences: tuple[int] | None, kwargs: dict[str, Any]
              ) -> dict[str, Any]:
        n = check_size_arg("batch_size", n, "sample" if sequences is None else "sample_sequences")
        if "replace" in kwargs:  # a numpy bool as a bool, so the split sees the same value
            kwargs["replace"] = check_replace(
                kwargs["replace"], "sample" if sequences is None else "sample_sequences")
        beta = None
        if self._schedule is not None:
            beta = self._schedule.resolve_beta(kwargs.pop("beta", None))
            kwargs["beta"] = beta
        self._send_own_rows()
        if self.rate_limited or self.max_times_sampled is not None \
                or kwargs.get("replace", True) is not True:
            fields = self._draw_two_trips(n, sequences, kwargs, beta)
        elif sequences is not None and self.num_shards - len(self._degraded) > 1 \
                and self._independent():
            fields = self._draw_windows(n, sequences[0], kwargs, beta)
        else:
            fields = self._draw_one_trip(n, sequences, kwargs, beta)
        if self._schedule is not None:
            self._schedule.calls += 1
        return fields

    def _spares(self, n: int, live: list[int]) -> dict[int, int]:
        """Items each live shard draws on the one-trip path: ``B`` without a previous
        reply, else ``B q + SPARE_SD sd + SPARE_ITEMS`` (at most ``B``) with ``q`` its
        share of the previous reply's masses."""
        seen = self._seen
        total = 0.0 if seen is None else sum(seen[s] for s in live)
        if seen is None or len(live) == 1 or not total > 0.0:
            return dict.fromkeys(live, n)
        out = {}
        for s in live:
            q = seen[s] / total
            guess = n * q + SPARE_SD * math.sqrt(n * q * (1.0 - q)) + SPARE_ITEMS
            out[s] = min(n, math.ceil(guess))
        return out

    def _draw_one_trip(self, n: int, sequences: tuple[int] | None, kwargs: dict[str, Any],
                       beta: float | None) -> dict[str, Any]:
        """Spare-padded draws and masses in one round trip; the split from those masses
        and a random subset per shard (see the module docs for why this is exact)."""
        for _ in range(self.num_shards + 1):
            live = self._live(f"sample(batch_size={n})")
            want = self._spares(n, live)
            replies, failed = self._gather({s: self._shards[s].draw.remote(
                want[s], kwargs, sequences) for s in live})
            if failed:
                continue  # renormalise over the shards still alive
            masses = {s: replies[s]["mass"] for s in live}
            seen = [0.0] * self.num_shards if self._seen is None else list(self._seen)
            for s in live:
                seen[s] = float(masses[s][1])
            self._seen = seen
            call = _draw_call(n, sequences)
            check_held([masses[s][0] for s in live], call)
            counts = split_counts(np.array([masses[s][1] for s in live]), n, self._rng, call)
            parts: dict[int, dict[str, Any]] = {}
            short: dict[int, int] = {}
            for s, c in zip(live, counts.tolist(), strict=True):
                got = 0 if replies[s]["fields"] is None else want[s]
                if 0 < c <= got:
                    parts[s] = _subset(replies[s], c, got, self._rng)
                elif c > got:
                    short[s] = c
            if short:  # the same split, fresh draws of the shards whose spares fell short
                more, failed = self._gather({s: self._shards[s].sample.remote(
                    c, kwargs, sequences, self.timeout) for s, c in short.items()})
                if failed:
                    continue
                for s, r in more.items():
                    parts[s] = r
                    masses[s] = r["mass"]
                self.draw_paths["top_up"] += 1
            else:
                self.draw_paths["one_trip"] += 1
            return merge([parts[s] for s in sorted(parts)], list(masses.values()), beta,
                         self._sampler_config.get("weight_norm"))
        raise ShardUnavailableError(f"sample(batch_size={n}): shards kept failing "
                                    f"({sorted(self._degraded)} down)")

    def _draw_windows(self, n: int, length: int, kwargs: dict[str, Any],
                      beta: float | None) -> dict[str, Any]:
        """Exact windows: candidates from every live shard, the first ``n`` usable ones
        of one label stream (:mod:`replaybank.distributed.rejection`), more candidates
        in further round trips when the stream runs past a shard's (at most
        ``MAX_TOP_UPS``). A call that raises leaves the generator as it was."""
        saved = self._rng.bit_generator.state
        try:
            return self._windows(n, length, kwargs, beta)
        except BaseException:
            self._rng.bit_generator.state = saved
            raise

    def _windows(self, n: int, length: int, kwargs: dict[str, Any],
                 beta: float | None) -> dict[str, Any]:
        for _ in range(self.num_shards + 1):
            live = self._live(f"sample_sequences(batch_size={n})")
            seen = self._seen
            total = 0.0 if seen is None else sum(seen[s] for s in live)
            shares = {s: (seen[s] / total if seen is not None and total > 0.0
                          else 1.0) for s in live}
            key = (length, repr(sorted((k, v) for k, v in kwargs.items() if k != "beta")))
            acc, used = self._window_rates.get(key, (0.0, 0.0))
            want = candidate_counts(n, acc / used if used else 1.0, shares)
            stream = CandidateStream(live, n, self._rng)
            trips = 0
            failed: list[int] = []
            while want and trips <= MAX_TOP_UPS:
                replies, failed = self._gather({s: self._shards[s].candidates.remote(
                    c, kwargs, length) for s, c in want.items()})
                if failed:
                    break
                for s, r in replies.items():
                    stream.add(s, r)
                want = stream.consume() or {}
                trips += 1
            if failed:
                continue  # renormalise over the shards still alive
            if want:
                raise EmptyBufferError(
                    f"sample_sequences(batch_size={n}, sequence_length={length}): "
                    f"{stream.accepted} usable windows among {stream.consumed} candidate "
                    f"starts drawn from the live shards in {trips} round trips; add more "
                    "data, shorten sequence_length/burn_in, or use strict=False (padded "
                    "windows) or episode_boundary='cross'")
            if len(self._window_rates) >= 16 and key not in self._window_rates:
                self._window_rates.clear()
            self._window_rates[key] = (0.5 * acc + stream.accepted, 0.5 * used + stream.consumed)
            seen_now = [0.0] * self.num_shards if seen is None else list(seen)
            for s in live:
                seen_now[s] = float(stream.masses[s][1])
            self._seen = seen_now
            self.draw_paths["one_trip" if trips == 1 else "top_up"] += 1
            return merge(stream.parts(), [stream.masses[s] for s in live], beta,
                         self._sampler_config.get("weight_norm"))
        raise ShardUnavailableError(f"sample_sequences(batch_size={n}): shards kept "
                                    f"failing ({sorted(self._degraded)} down)")

    def _independent(self) -> bool:
        """Whether the shards' sampler draws independently (exact windows; asked of one
        live shard once: every shard has the same config)."""
        if self._draws_independent is None:
            answered, value = self._ask_one(
                lambda shard: shard.supports_candidates.remote())
            if answered:
                self._draws_independent = bool(value)
        return bool(self._draws_independent)

    def _ask_one(self, call: Callable[[Any], Any]) -> tuple[bool, Any]:
        """``call(shard)`` (a remote call's reference) of the first live shard that
        answers: ``(True, its answer)``, or ``(False, None)`` while every shard is down."""
        self._probe()
        for s in range(self.num_shards):
            if s in self._degraded:
                continue
            out, _ = self._gather({s: call(self._shards[s])})
            if s in out:
                return True, out[s]
        return False, None

    def _draw_two_trips(self, n: int, sequences: tuple[int] | None,
                        kwargs: dict[str, Any], beta: float | None) -> dict[str, Any]:
        """Masses (and limiter permissions) first, then the split and the draws.

        ``replace=False``: the shards' distinct items (for windows, their servable
        starts) are counted in the first trip and a larger batch is refused before
        anything is drawn; then the split is one buffer's law
        (:mod:`replaybank.distributed.split`): hypergeometric by size without
        priorities, with them each shard's own successive draws merged
        (:meth:`_draw_successive`), or where shards may not draw spares (rate limits,
        ``max_times_sampled``) the depleting split. A call that raises leaves the
        generator as it was.
        """
        saved = self._rng.bit_generator.state
        try:
            return self._two_trips(n, sequences, kwargs, beta)
        except BaseException:
            self._rng.bit_generator.state = saved
            raise

    def _two_trips(self, n: int, sequences: tuple[int] | None, kwargs: dict[str, Any],
                   beta: float | None) -> dict[str, Any]:
        # replace=False: split over each shard's pool, its distinct items or (windows)
        # its servable window starts, counted in the first trip
        distinct = kwargs.get("replace", True) is False
        window = None if sequences is None or not distinct else (sequences[0], kwargs)
        spares = not self.rate_limited and self.max_times_sampled is None
        for _ in range(self.num_shards + 1):
            states = self._ready(n, distinct, window)
            masses = {s: st[:3] for s, st in states.items()}
            ids = sorted(masses)
            if distinct:
                have = np.array([states[s][3] for s in ids], np.int64)
                check_distinct(n, np.array([states[s][0] for s in ids], np.int64), have,
                               "the shards whose rate limiter allows the draw now"
                               if self.rate_limited else "the live shards",
                               **self._distinct_words(n, sequences))
                if self._schedule is None:
                    counts = split_distinct(have, n, self._rng)
                elif spares:
                    fields = self._draw_successive(n, masses, have, sequences, kwargs, beta)
                    if fields is None:
                        continue  # a shard died, or the shards' pools shrank: again
                    return fields
                else:
                    counts = split_depleting(np.array([states[s][4] for s in ids]), have,
                                             n, self._rng)
            else:
                call = _draw_call(n, sequences)
                check_held([masses[s][0] for s in ids], call, "the shards whose rate "
                           "limiter allows the draw now" if self.rate_limited
                           else "the live shards")
                counts = split_counts(np.array([masses[s][1] for s in ids]), n, self._rng,
                                      call)
            refs = {s: self._shards[s].sample.remote(int(c), kwargs, sequences, self.timeout)
                    for s, c in zip(ids, counts.tolist(), strict=True) if c > 0}
            replies, failed = self._gather(refs)
            if failed:
                continue  # renormalise over the shards still alive
            for s, r in replies.items():
                masses[s] = r["mass"]
            self.draw_paths["two_trips"] += 1
            return merge([replies[s] for s in sorted(replies)], list(masses.values()),
                         beta, self._sampler_config.get("weight_norm"))
        raise ShardUnavailableError(f"sample(batch_size={n}): shards kept failing "
                                    f"({sorted(self._degraded)} down)")

    def _distinct_words(self, n: int, sequences: tuple[int] | None) -> dict[str, str]:
        """How :func:`check_distinct` names a ``replace=False`` call of ``n`` (windows:
        ``sample_sequences``, whose pool is the servable window starts)."""
        if sequences is None:
            return {}
        prio = "" if self._schedule is None else " with a positive priority"
        return {"call": f"sample_sequences(batch_size={n}, sequence_length={sequences[0]}, "
                        "replace=False)",
                "servable": f"start a usable window{prio}",
                "fixes": ", or shorten sequence_length/burn_in, or use strict=False (padded "
                         "windows) or episode_boundary='cross'"}

    def _draw_successive(self, n: int, masses: dict[int, tuple[int, float, float]],
                         have: npt.NDArray[np.int64], sequences: tuple[int] | None,
                         kwargs: dict[str, Any], beta: float | None
                         ) -> dict[str, Any] | None:
        """One buffer's prioritized ``sample(n, replace=False)`` (or ``sample_sequences``)
        over all shards.

        Each shard with a pool draws its own successive sample of ``min(n, its pool)``
        (distinct items, or windows of servable starts: :meth:`Shard.draw
        <replaybank.distributed.shard.Shard.draw>`, in draw order, with the pool's mass
        at the draw); :func:`split_successive` decides how many of each the batch takes,
        a prefix of each. None when a shard died or the shards drew fewer than ``n``
        (their pools changed since they were counted): the caller asks again.
        """
        want = {s: min(n, int(c)) for s, c in zip(sorted(masses), have.tolist(), strict=True)
                if c > 0}
        replies, failed = self._gather({s: self._shards[s].draw.remote(c, kwargs, sequences)
                                        for s, c in want.items()})
        got = {s: r for s, r in replies.items() if r["fields"] is not None}
        if failed or sum(len(r["priorities"]) for r in got.values()) < n:
            return None
        for s, r in replies.items():
            masses[s] = r["mass"]
        ids = sorted(got)
        counts = split_successive([got[s]["priorities"] for s in ids],
                                  [float(got[s]["pool"][1]) for s in ids], n, self._rng)
        parts = [_prefix(got[s], int(c)) for s, c in zip(ids, counts.tolist(), strict=True)
                 if c > 0]
        self.draw_paths["two_trips"] += 1
        return merge(parts, list(masses.values()), beta,
                     self._sampler_config.get("weight_norm"))

    def _ready(self, n: int, distinct: bool = False,
               window: tuple[int, dict[str, Any]] | None = None
               ) -> dict[int, tuple[int, float, float, int, float]]:
        """The states ``(size, total, p_min, pool count, pool mass)`` of the live shards
        a sample of ``n`` may draw from now (:meth:`Shard.draw_state
        <replaybank.distributed.shard.Shard.draw_state>`: with ``distinct`` the pool is
        the distinct items, or the servable starts of ``window`` = ``(sequence_length,
        kwargs)``; else the size and total).

        Without rate limits: every live shard. With them: the shards whose limiter lets
        ``n`` samples through now (so a reader never waits on a shard that needs inserts
        while a writer waits on another that needs samples); when none does, wait (up to
        ``timeout``, polling) as a rate-limited sample waits.
        """
        deadline = time.monotonic() + self.timeout
        pause = 0.002
        while True:
            self._probe()
            live = [s for s in range(self.num_shards) if s not in self._degraded]
            states, _ = self._gather({s: self._shards[s].draw_state.remote(n, distinct,
                                                                           window)
                                      for s in live})
            if not states:
                raise ShardUnavailableError(
                    f"sample(batch_size={n}): every shard is down "
                    f"({sorted(self._degraded)}); wait for Ray to restart them")
            ready = {s: (*st[:3], *st[4:]) for s, st in states.items()
                     if st[3] and st[1] > 0.0}
            if ready or not self.rate_limited:
                return ready or {s: (*st[:3], *st[4:]) for s, st in states.items()}
            if time.monotonic() > deadline:
                from replaybank.distributed.limiter import RateLimitTimeout

                raise RateLimitTimeout(
                    f"sample(batch_size={n}): no shard's rate limiter allowed it within "
                    f"timeout={self.timeout}s (service.stats() shows each limiter); insert "
                    "more, or raise timeout")
            time.sleep(pause)
            pause = min(0.05, pause * 2)

    @one_thread_call("update_priorities")
    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """Set priorities of sampled global ``indices`` (as
        :meth:`replaybank.ReplayBuffer.update_priorities`); stale ones (overwritten
        since), retired ones and those of shards that are down are ignored.

        Every argument is checked here, with one buffer's rules
        (:func:`~replaybank.buffers.priorities.checked_updates`, the local buffer's own
        checks), before anything is sent, so a bad call changes no shard and raises
        what a local buffer raises; then each shard gets its own keys in one call, all
        shards in parallel.

        Args:
            indices: ``batch.indices`` of :meth:`sample`, ``[B]`` global keys (numpy, a
                list or a torch tensor on any device; ``[B, 1]`` is flattened, as one
                buffer does).
            priorities: ``[B]`` new priorities (a torch tensor may require grad).

        Returns:
            Number of priorities applied, summed over the shards.

        Raises:
            ConfigError: The service's sampler has no priorities, or an index is
                negative (not a key).
            ShapeError: No shard holds any storage yet (nothing was written), the
                numbers of indices and priorities differ, or either is a ragged list.
            DtypeError: ``indices`` are not integers, or a priority is not a number,
                negative, NaN, infinite or above the largest priority the shards store
                (their ``priority_limit``).
        """
        call = "update_priorities"
        limit = self._priorities_limit(call)
        if limit is not None:
            self._check_storage(call, "indices")
        keys, p = checked_updates(indices, priorities, math.inf if limit is None else limit)
        if limit is None:  # every shard is down: nothing can be applied
            return 0
        groups = group_by_shard(keys, p, self.num_shards)
        self._probe()
        refs = {s: self._shards[s].update_priorities.remote(k, v)
                for s, (k, v) in groups.items() if s not in self._degraded}
        out, _ = self._gather(refs)
        return int(sum(out.values()))

    def _check_storage(self, call: str, keys: str) -> None:
        """Refuse a priority update while no shard holds any storage (nothing was ever
        written, by this client or another one), as one buffer refuses it
        (:func:`~replaybank.buffers.priorities.nothing_sampled`; ``keys`` names the
        call's argument of sampled keys).

        Raises:
            ShapeError: No live shard has a spec yet and this client queued no rows.
        """
        rule = self._write_rule()
        if rule is None or rule["spec"] is not None:
            return
        # no spec known here: another client may have written since the shards were asked
        self._probe()
        live = [s for s in range(self.num_shards) if s not in self._degraded]
        answers, _ = self._gather({s: self._shards[s].write_rule.remote() for s in live})
        fresh = next((answers[s] for s in sorted(answers) if answers[s]["spec"] is not None),
                     None)
        if fresh is not None:
            self._rules = fresh
            return
        raise nothing_sampled(call, keys, "service")  # one buffer's message

    @one_thread_call("update_sequence_priorities")
    def update_sequence_priorities(self, starts: Any, td_errors: Any, eta: float = 0.9,
                                   mask: Any = None) -> int:
        """Set R2D2 priorities of sampled windows (as
        :meth:`replaybank.ReplayBuffer.update_sequence_priorities`).

        Each window's priority is ``eta * max|td| + (1 - eta) * mean|td|`` over its
        masked steps, exactly one buffer's rule. Every argument is checked here before
        anything is sent, so a bad call changes no shard; then each shard gets its own
        starts and rows in one call, all shards in parallel. Starts overwritten since
        the draw (stale), starts retired by ``max_times_sampled``, rows without a
        counted step and the rows of shards that are down are skipped.

        Args:
            starts: ``batch.starts`` of :meth:`sample_sequences`, ``[B]`` global keys
                (numpy, a list or a torch tensor on any device).
            td_errors: ``[B, L]`` TD errors of the window steps (a torch tensor may be
                on any device and require grad: it is detached and copied once).
            eta: Weight of the max in ``[0, 1]`` (0.9 in R2D2).
            mask: ``[B, L]`` steps that count (e.g. ``batch.mask``: padding and burn-in
                excluded); default all, in which case ``L`` must be the width of a
                window this client drew.

        Returns:
            Number of priorities applied, summed over the shards.

        Raises:
            ConfigError: ``eta`` outside ``[0, 1]``, a negative start, or the service's
                sampler has no priorities.
            ShapeError: ``starts`` is not ``[B]``, ``td_errors`` not ``[B, L]``,
                ``mask`` not of ``td_errors``' shape, or no shard holds any storage yet
                (nothing was written).
            DtypeError: ``starts`` are not integers, ``td_errors`` not numbers, or a
                counted TD error is NaN or infinite (or its priority above the
                sampler's ``priority_limit``).

        Example (needs Ray)::

            batch = client.sample_sequences(32, 20, burn_in=4)
            td = learner.td_errors(batch)                       # [32, 24]
            client.update_sequence_priorities(batch.starts, td, mask=batch.mask)
        """
        call = "update_sequence_priorities"
        check_eta(eta)  # first, as one buffer does
        limit = self._priorities_limit(call)
        up = checked_window_updates(starts, td_errors, eta, mask,
                                    math.inf if limit is None else limit, self._seq_widths)
        if limit is None:  # every shard is down: nothing can be applied (as update_priorities)
            return 0
        if not len(up.keys):  # no row has a counted step: nothing changes
            return 0
        keys, td, m = up.keys, up.td_errors, up.mask
        self._check_storage(call, "starts")
        rows: list[np.ndarray[Any, Any]] = [td] if mask is None else [td, m]
        groups = group_rows_by_shard(keys, rows, self.num_shards)
        self._probe()
        refs = {s: self._shards[s].update_sequence_priorities.remote(
                    k, r[0], float(eta), None if mask is None else r[1])
                for s, (k, r) in groups.items() if s not in self._degraded}
        out, _ = self._gather(refs)
        return int(sum(out.values()))

    def _priorities_limit(self, call: str) -> float | None:
        """The largest raw priority the shards store (``inf``: no bound); None while
        every shard is down.

        Raises:
            ConfigError: The shards' sampler has no priorities.
        """
        rule = self._rule()
        if rule is None:
            return None
        has_priorities, limit = rule
        if not has_priorities:
            raise ConfigError(
                f"{call}: the service's sampler ({self._sampler_config.get('type')!r}) has "
                "no priorities; build the service with sampler={'type': 'prioritized', ...}")
        return limit

    def _rule(self) -> tuple[bool, float] | None:
        """Whether the shards' sampler has priorities and the largest raw priority they
        store (asked of one live shard once: every shard has the same config); None
        while every shard is down."""
        if self._priority_rule is None:
            answered, limit = self._ask_one(lambda shard: shard.priority_limit.remote())
            if answered:
                self._priority_rule = (limit is not None,
                                       math.inf if limit is None else float(limit))
        return self._priority_rule

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The sampling state: generator, beta-schedule calls, and the shard masses and
        usable-window rates that size the next draws (JSON-able)."""
        return {"rng": self._rng.bit_generator.state,
                "calls": None if self._schedule is None else self._schedule.calls,
                "shard_masses": self._seen,
                "window_rates": [[k[0], k[1], a, u]
                                 for k, (a, u) in self._window_rates.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Every entry is checked before anything changes, so a damaged state leaves the
        client (its generator included) exactly as it was, as one buffer's
        ``load_state_dict`` does.

        Raises:
            CheckpointError: ``state`` is not a dict, lacks ``rng``, or an entry does
                not fit this client (a generator state of another type, a ``calls``
                that is not an int >= 0, ``shard_masses`` that are not one number >= 0
                per shard, ``window_rates`` that are not ``[length, key, usable,
                drawn]`` rows).
        """
        rng, calls, seen, rates = _checked_state(state, self.num_shards, self._rng)
        self._rng.bit_generator.state = rng
        if self._schedule is not None and calls is not None:
            self._schedule.calls = calls
        self._seen = seen
        self._window_rates = rates

    def save(self, dirpath: Any, prefix: str = "buffer_") -> None:
        """Refused, as ``rb.save(client, d)`` is: a client holds no rows (its service's
        shards do). The local buffer's ``buf.save(d)`` raises this error here, not an
        AttributeError, so training code that checkpoints learns the fix.

        Raises:
            ConfigError: Always; it names ``service.checkpoint(path)`` and
                ``ReplayService.restore(path)``.
        """
        raise ConfigError(f"save(dirpath={describe(dirpath)}): {self.how_to_save()}")

    def how_to_save(self) -> str:
        """Why ``rb.save`` cannot save a client, and what does
        (:class:`~replaybank.persist.SavedElsewhere`)."""
        return ("a service client holds no rows (its service's shards do); save the whole "
                "service with service.checkpoint(path) (it saves this client's sampling "
                "state too) and bring it back with ReplayService.restore(path)")

    def __repr__(self) -> str:
        return (f"ReplayClient(num_shards={self.num_shards}, num_lanes={self.num_lanes}, "
                f"pending_rows={self.pending_rows})")


def _checked_state(state: Any, num_shards: int, rng: np.random.Generator
                   ) -> tuple[Any, int | None, list[float] | None,
                              dict[tuple[int, str], tuple[float, float]]]:
    """The entries of a :meth:`ReplayClient.state_dict`, checked and parsed (nothing is
    applied): ``(rng state, calls, shard masses, window rates)``.

    Raises:
        CheckpointError: An entry is missing or does not fit (see
            :meth:`ReplayClient.load_state_dict`).
    """
    fix = "pass a state saved by ReplayClient.state_dict() (or svc.checkpoint())"
    if not isinstance(state, dict):
        raise CheckpointError(f"load_state_dict(state={describe(state)}): expected the dict "
                              f"of ReplayClient.state_dict(); {fix}")
    if "rng" not in state:
        raise CheckpointError(f"load_state_dict: the state has no 'rng' entry (it has "
                              f"{sorted(state)}); {fix}")
    probe_rng(rng, state["rng"])
    calls = state.get("calls")
    if calls is not None and (isinstance(calls, bool) or not isinstance(calls, (int, np.integer))
                              or calls < 0):
        raise CheckpointError(f"load_state_dict: state['calls']={calls!r} must be None or an "
                              f"int >= 0 (the beta schedule's sample calls); {fix}")
    seen = state.get("shard_masses")
    masses: list[float] | None = None
    if seen is not None:
        try:
            masses = [float(m) for m in seen]
        except (TypeError, ValueError):
            masses = None
        if masses is None or len(masses) != num_shards \
                or not all(math.isfinite(m) and m >= 0.0 for m in masses):
            raise CheckpointError(
                f"load_state_dict: state['shard_masses']={describe(seen)} must be None or "
                f"one finite number >= 0 per shard ({num_shards}); {fix}")
    rates: dict[tuple[int, str], tuple[float, float]] = {}
    rows = state.get("window_rates", [])
    try:
        for n, k, a, u in rows:
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) \
                    or not isinstance(k, str):
                raise TypeError(n, k)
            rates[(int(n), k)] = (float(a), float(u))
    except (TypeError, ValueError):
        raise CheckpointError(
            f"load_state_dict: state['window_rates']={describe(rows)} must be a list of "
            f"[sequence_length, key, usable, drawn] rows; {fix}") from None
    return state["rng"], None if calls is None else int(calls), masses, rates


def _subset(reply: dict[str, Any], c: int, got: int, rng: np.random.Generator
            ) -> dict[str, Any]:
    """``c`` of a shard's ``got`` draws, chosen uniformly at random (in draw order)."""
    if c == got:
        return reply
    pick = np.sort(rng.choice(got, size=c, replace=False))
    pr = reply["priorities"]
    return {"fields": {k: v[pick] for k, v in reply["fields"].items()},
            "priorities": None if pr is None else pr[pick], "mass": reply["mass"]}


def _prefix(reply: dict[str, Any], c: int) -> dict[str, Any]:
    """The first ``c`` of a shard's draws (a successive sample's prefix is one of ``c``)."""
    pr = reply["priorities"]
    return {"fields": {k: v[:c] for k, v in reply["fields"].items()},
            "priorities": None if pr is None else pr[:c], "mass": reply["mass"]}


def _lead(values: dict[str, Any]) -> tuple[int, ...]:
    v: Any = values
    while isinstance(v, dict):
        if not v:
            return ()
        v = next(iter(v.values()))
    return tuple(np.shape(v))


def _is_rate_limit(exc: Any) -> bool:
    """Whether ``exc`` is the rate limiter's timeout (the rows are kept for a retry)."""
    try:
        from replaybank.distributed.limiter import RateLimitTimeout
    except ImportError:  # pragma: no cover - the limiter lands separately
        return False
    return isinstance(exc, RateLimitTimeout)


def _host_values(name: str, value: Any) -> Any:
    """One argument of ``add``/``extend`` (nested dicts kept) as host arrays, each leaf
    through :func:`~replaybank.spec.as_array` as the core's add boundary converts it: a
    tuple holding arrays, or a list of them (one per step), is refused by the tuple rule
    (:func:`~replaybank.spec.check_tuple`) instead of being stacked part-first here and
    sent to the shards with its parts on the lane axis; a ragged nest is the one ragged
    ShapeError. ``name`` is the argument (``"obs"``, ``"obs/pos"``), as the core names it.

    Raises:
        ShapeError: A tuple holding arrays (or a list of them), or a ragged nest.
        DtypeError: A tensor numpy cannot show.
    """
    if isinstance(value, Mapping):
        return {k: _host_values(f"{name}{SEP}{k}", v) for k, v in value.items()}
    return as_array(value, name)
