"""``ReplayService``: a replay buffer sharded over Ray actors, with global prioritisation.

``ReplayService(num_shards, config)`` starts ``num_shards`` Ray actors (one CPU each by
default), each holding the buffer ``rb.from_config(config)`` (any buffer type: uniform,
PER, n-step, sequences, HER) over its share of the env lanes. ``service.client()``
returns a picklable :class:`~replaybank.distributed.client.ReplayClient` with the
buffer's interface (a ``MultiAgentReplayBuffer`` config gets a
:class:`~replaybank.multiagent.distributed.MultiAgentReplayClient` over it: agent dicts
in, ``MultiAgentBatch`` out; how a type is served is registered,
:mod:`replaybank.distributed.served`). What is guaranteed:

* Lanes: global lane ``l`` lives on shard ``l % num_shards`` (local lane
  ``l // num_shards``), so each env lane's episodes stay on one shard and n-step returns,
  sequence windows and HER goals are exactly those of one buffer. ``num_lanes`` must be a
  multiple of ``num_shards``; ``config`` describes *one shard's* buffer (its
  ``capacity`` is per shard; ``num_envs`` is set to ``num_lanes // num_shards``).
* Sampling: a batch is split across shards by a multinomial draw in proportion to their
  priority totals (uniform: sizes); probabilities and importance weights use the global
  total, size and smallest priority, so the distribution and the weights equal one
  buffer's with the same contents (:mod:`replaybank.distributed.split`). Without rate
  limits or ``max_times_sampled`` a sample takes one round trip (each shard draws a
  few spare items along with its mass; :mod:`replaybank.distributed.client`).
* Keys: ``batch.indices`` carry (shard, slot, generation); a late priority update for
  an overwritten item is ignored (:mod:`replaybank.distributed.keys`).
* Rate limiting: ``rate_limit`` (a :class:`~replaybank.distributed.limiter.RateLimit`,
  Reverb's semantics) is enforced by one limiter *per shard*, each with the limit as
  given, counting items (a sample of 256 counts 256). Blocked calls wait inside the
  async shard actor with a timeout; nothing else on the shard stalls.
  ``max_times_sampled`` retires an item after that many draws (prioritized samplers).
* Checkpoints: :meth:`ReplayService.checkpoint` saves every shard, then a manifest,
  then a ``DONE`` marker (:mod:`replaybank.distributed.checkpoint`);
  :meth:`ReplayService.restore` rebuilds the service and the clients' sampling state,
  so the next sample is identical. A shard whose process dies is restarted by Ray (up
  to ``max_restarts`` times) and reloads the latest checkpoint of ``checkpoint_dir``;
  meanwhile clients sample from the other shards and report ``degraded_shards``.

Example (Ray is started on first use; tests start it themselves)::

    import replaybank as rb
    svc = rb.distributed.ReplayService(
        2, {"type": "PrioritizedReplayBuffer", "capacity": 100_000}, num_lanes=8,
        checkpoint_dir="ckpt", seed=0)
    writer = svc.client()           # pass it to Ray actors: it pickles
    learner = svc.client("learner")
    batch = learner.sample(256)
    learner.update_priorities(batch.indices, td_errors)
    svc.checkpoint()                # ckpt/000001, recorded in ckpt/LATEST
"""

from __future__ import annotations

import math
import os
import weakref
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from replaybank.config import BufferConfig, validate_config
from replaybank.distributed import checkpoint
from replaybank.distributed.client import ReplayClient
from replaybank.distributed.errors import ShardUnavailableError
from replaybank.distributed.served import service_kind
from replaybank.distributed.shard import Shard, ShardSpec
from replaybank.distributed.writer import MAX_BYTES, MAX_ROWS
from replaybank.errors import CheckpointError, ConfigError, ReplayBankError, require_extra

__all__ = ["ReplayService"]


def _config_dict(config: Any) -> dict[str, Any]:
    """``config`` (a BufferConfig, dict or YAML/JSON path) as a validated JSON-able dict."""
    if isinstance(config, BufferConfig):
        cfg = config
    elif isinstance(config, (str, os.PathLike)):
        from replaybank.config.files import read_config_file

        cfg = validate_config(read_config_file(Path(config)))
    elif isinstance(config, Mapping):
        cfg = validate_config(config)
    else:
        raise ConfigError(f"ReplayService(config={config!r}): pass a buffer config (a "
                          "dict, rb.BufferConfig or a YAML/JSON path)")
    out: dict[str, Any] = cfg.model_dump(mode="json")
    return out


def _shard_seed(seed: int | None, index: int) -> int | None:
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint32)[0])


class ReplayService:
    """A sharded replay buffer on Ray actors (see the module docs).

    Args:
        num_shards: Number of shard actors.
        config: One shard's buffer config (dict, ``rb.BufferConfig`` or a YAML/JSON
            path); ``num_envs`` is replaced by ``num_lanes // num_shards``.
        num_lanes: Global env lanes (default ``num_shards``); a multiple of
            ``num_shards``.
        rate_limit: A :class:`~replaybank.distributed.limiter.RateLimit` applied to each
            shard, or None.
        max_times_sampled: Retire items after this many draws (prioritized samplers).
        checkpoint_dir: Where :meth:`checkpoint` writes by default and records the latest
            checkpoint, which a restarted shard reloads.
        max_restarts: How often Ray restarts a dead shard (-1: always).
        seed: Seed of the shards' generators and the clients' batch splits (default:
            the config's ``seed``).
        timeout: Seconds every blocking call waits (start-up, rate limiter, flushes).
        num_cpus: CPUs Ray reserves per shard (a number >= 0; a shard mostly waits
            on calls, so a fraction is often enough). All shards must fit in the
            cluster at once: more than it has is refused as they start.
        **ray_options: Further ``ActorClass.options`` (``resources``, ``scheduling_strategy``).

    Raises:
        ConfigError: A bad argument (named, with the rule), or more shards than the Ray
            cluster can ever run at once with their ``num_cpus`` (and ``num_gpus``,
            ``resources``): checked against ``ray.cluster_resources()`` as they start.
        ShardUnavailableError: A shard did not start within ``timeout`` (e.g. other
            actors hold the resources it needs); the message names the shards.
        MissingDependencyError: Ray is not installed.
    """

    def __init__(self, num_shards: int, config: Any, *, num_lanes: int | None = None,
                 rate_limit: Any = None, max_times_sampled: int | None = None,
                 checkpoint_dir: Any = None, max_restarts: int = 3,
                 seed: int | None = None, timeout: float = 60.0, num_cpus: float = 1.0,
                 _restore: str | None = None, **ray_options: Any) -> None:
        ray = require_extra("ray", "ray")
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise ConfigError(f"ReplayService(num_shards={num_shards!r}): must be an int >= 1")
        lanes = num_shards if num_lanes is None else num_lanes
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1 \
                or lanes % num_shards:
            raise ConfigError(
                f"ReplayService(num_lanes={num_lanes!r}): must be a positive multiple of "
                f"num_shards={num_shards} (each shard holds num_lanes // num_shards lanes)")
        if max_times_sampled is not None and (isinstance(max_times_sampled, bool) or not
                                              isinstance(max_times_sampled, int)
                                              or max_times_sampled < 1):
            raise ConfigError(f"ReplayService(max_times_sampled={max_times_sampled!r}): "
                              "must be an int >= 1 or None")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) \
                or max_restarts < -1:
            raise ConfigError(f"ReplayService(max_restarts={max_restarts!r}): must be an "
                              "int >= -1 (-1: restart forever)")
        if isinstance(num_cpus, bool) or not isinstance(num_cpus, (int, float)) \
                or not 0 <= num_cpus < math.inf:
            raise ConfigError(f"ReplayService(num_cpus={num_cpus!r}): must be a number >= 0 "
                              "(CPUs Ray reserves per shard; fractions such as 0.25 are fine)")
        if rate_limit is not None:
            from replaybank.distributed.limiter import RateLimit

            if not isinstance(rate_limit, RateLimit):
                raise ConfigError(f"ReplayService(rate_limit={rate_limit!r}): pass a "
                                  "replaybank.distributed.RateLimit or None")
        cfg = _config_dict(config)
        if cfg.get("num_envs", 1) not in (1, lanes // num_shards):
            raise ConfigError(
                f"ReplayService: config num_envs={cfg['num_envs']} but each shard holds "
                f"num_lanes // num_shards = {lanes // num_shards} lanes; set num_lanes= "
                "on the service instead")
        self.num_shards = num_shards
        self.num_lanes = lanes
        self.config = cfg
        self.rate_limit = rate_limit
        self.max_times_sampled = max_times_sampled
        self.timeout = float(timeout)
        self.seed = cfg.get("seed") if seed is None else seed
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        if self.checkpoint_dir is not None:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self._clients: dict[str, weakref.ref[Any]] = {}
        self._saved_clients: dict[str, Any] = {}
        self._checkpoints = 0
        actor = ray.remote(Shard).options(num_cpus=num_cpus, max_restarts=max_restarts,
                                          max_task_retries=0, **ray_options)
        per = lanes // num_shards
        self._shards = [actor.remote(ShardSpec(
            index=i, num_shards=num_shards, config=cfg, lanes=per,
            seed=_shard_seed(self.seed, i), rate_limit=rate_limit,
            max_times_sampled=max_times_sampled,
            checkpoint_dir=None if self.checkpoint_dir is None else str(self.checkpoint_dir),
            restore=_restore)) for i in range(num_shards)]
        # (after the first actor: Ray may have been started by it)
        request = _shard_request(num_cpus, ray_options)
        too_many = _unschedulable(num_shards, request, ray.cluster_resources())
        if too_many is not None:
            self.shutdown()
            raise ConfigError(too_many)
        refs = [s.info.remote() for s in self._shards]
        try:
            infos = ray.get(refs, timeout=self.timeout)
        except Exception as exc:
            # (before the shards let their resources and calls go)
            free = ray.available_resources()
            _, waiting = ray.wait(refs, num_returns=len(refs), timeout=0)
            self.shutdown()
            cause = _creation_error(exc)
            if cause is not None:  # the shard's own error (bad config, damaged checkpoint)
                raise cause from None
            if isinstance(exc, ray.exceptions.GetTimeoutError):
                raise ShardUnavailableError(_not_started(
                    [i for i, r in enumerate(refs) if r in waiting], request,
                    ray.cluster_resources(), free, self.timeout)) from None
            raise
        self.sampler_config: dict[str, Any] = infos[0]["sampler"]
        #: Steps all shards hold together (the config's ``capacity`` is per shard).
        self.capacity = int(sum(info["capacity"] for info in infos))

    # ------------------------------------------------------------------ clients
    def client(self, name: str = "default", seed: int | np.random.Generator | None = None,
               *, max_rows: int = MAX_ROWS, max_bytes: int = MAX_BYTES,
               max_age_s: float = 1.0, max_in_flight: int = 4,
               timeout: float | None = None) -> Any:
        """A client of this service: a :class:`ReplayClient`, or the front of the
        buffer type (:mod:`replaybank.distributed.served`), e.g. a
        :class:`~replaybank.multiagent.distributed.MultiAgentReplayClient` for a
        ``MultiAgentReplayBuffer`` config.

        Args:
            name: Names the client's sampling state in checkpoints: after
                :meth:`restore`, ``client(name)`` continues where the saved one stopped.
            seed: Seed of the batch split (default: derived from the service seed and
                ``name``).
            max_rows: Pending rows per shard that trigger a send (one ``extend`` on the
                shard).
            max_bytes: Pending bytes per shard that trigger a send. The defaults (64 Ki
                rows, 4 MiB) amortise Ray's ~1-3 ms per call; lower them (or
                ``max_age_s``) when rows must reach the learner sooner.
            max_age_s: Age of the oldest pending row that triggers a send.
            max_in_flight: Unacknowledged sends per shard before a write waits.
            timeout: Seconds blocking calls wait (default: the service's).
        """
        if seed is None and self.seed is not None:
            seed = int(np.random.SeedSequence(
                [int(self.seed), zlib.crc32(name.encode())]).generate_state(1, np.uint32)[0])
        core = ReplayClient(self._shards, self.num_lanes, self.sampler_config, seed,
                            max_rows=max_rows, max_age_s=max_age_s,
                            max_in_flight=max_in_flight,
                            timeout=self.timeout if timeout is None else timeout,
                            rate_limited=self.rate_limit is not None, max_bytes=max_bytes,
                            max_times_sampled=self.max_times_sampled,
                            capacity=self.capacity)
        c = service_kind(self.config.get("type")).client(core, self.config)
        saved = self._saved_clients.pop(name, None)
        if saved is not None:
            c.load_state_dict(saved)
        self._clients[name] = weakref.ref(c)
        return c

    # ------------------------------------------------------------------ queries
    def _get(self, refs: list[Any]) -> list[Any]:
        ray = require_extra("ray", "ray")
        out = []
        for ref in refs:
            try:
                out.append(ray.get(ref, timeout=self.timeout))
            except ray.exceptions.RayActorError:
                out.append(None)
        return out

    def shard_pids(self) -> list[int | None]:
        """The worker process id of each shard (None: the shard is down)."""
        return self._get([s.pid.remote() for s in self._shards])

    def stats(self) -> dict[str, Any]:
        """Sizes, totals, inserts, samples, blocked calls and limiter state per shard.

        Returns:
            ``{"num_shards", "num_lanes", "size", "total", "inserts", "samples",
            "degraded_shards", "rate_limit", "shards": [per-shard dict or None]}``
            (a shard that is down is None and listed in ``degraded_shards``).
        """
        shards = self._get([s.stats.remote() for s in self._shards])
        live = [s for s in shards if s is not None]
        return {
            "num_shards": self.num_shards, "num_lanes": self.num_lanes,
            "size": sum(s["size"] for s in live), "total": sum(s["total"] for s in live),
            "inserts": sum(s["inserts"] for s in live),
            "samples": sum(s["samples"] for s in live),
            "blocked_inserts": sum(s["blocked_inserts"] for s in live),
            "blocked_samples": sum(s["blocked_samples"] for s in live),
            "degraded_shards": [i for i, s in enumerate(shards) if s is None],
            "rate_limit": None if self.rate_limit is None else repr(self.rate_limit),
            "max_times_sampled": self.max_times_sampled,
            "shards": shards,
        }

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, path: Any = None) -> Path:
        """Save every shard, then the manifest, then ``DONE`` (see the module docs).

        The clients made by :meth:`client` that are still alive are flushed first and
        their sampling state goes into the manifest. Each shard's snapshot is atomic;
        rows written by other processes while the shards save may be in some shards'
        snapshots and not others'.

        Args:
            path: The checkpoint folder (default: ``<checkpoint_dir>/<n>``, numbered).

        Returns:
            The checkpoint folder.

        Raises:
            ConfigError: No ``path`` and no ``checkpoint_dir``.
            CheckpointError: A shard could not save (no ``DONE`` is written).
        """
        ray = require_extra("ray", "ray")
        if path is None:
            if self.checkpoint_dir is None:
                raise ConfigError("checkpoint(path=None): this service has no "
                                  "checkpoint_dir; pass a path")
            self._checkpoints += 1
            path = self.checkpoint_dir / f"{self._checkpoints:06d}"
        root = Path(path).expanduser().resolve()
        clients = {}
        for name, ref in list(self._clients.items()):
            c = ref()
            if c is not None:
                c.flush()
                clients[name] = c.state_dict()
        checkpoint.begin(root)
        try:
            ray.get([s.save.remote(str(root)) for s in self._shards],
                    timeout=self.timeout)
        except Exception as exc:
            raise CheckpointError(f"checkpoint({str(root)!r}): a shard failed to save "
                                  f"({type(exc).__name__}: {exc}); no DONE written") from exc
        checkpoint.finish(root, {
            "num_shards": self.num_shards, "num_lanes": self.num_lanes,
            "config": self.config, "seed": self.seed,
            "max_times_sampled": self.max_times_sampled,
            "rate_limit": None if self.rate_limit is None else self.rate_limit.to_dict(),
            "clients": clients,
        }, latest_dir=self.checkpoint_dir)
        return root

    @classmethod
    def restore(cls, path: Any, num_shards: int | None = None, **kwargs: Any
                ) -> ReplayService:
        """A new service with the state of the checkpoint at ``path``.

        Args:
            path: A folder written by :meth:`checkpoint` (with its ``DONE`` marker).
            num_shards: Must equal the saved shard count when given.
            **kwargs: Other constructor arguments (``checkpoint_dir``,
                ``max_restarts``, ``timeout``, ``num_cpus``, Ray options); the config,
                lanes, seed, rate limit and ``max_times_sampled`` are the saved ones.

        Raises:
            CheckpointError: No ``DONE`` marker, a damaged manifest or shard, a shard
                file missing (checked before any shard starts; the message names the
                file), or another shard count.
        """
        root = Path(path).expanduser().resolve()
        m = checkpoint.read_manifest(root)
        if num_shards is not None and num_shards != m["num_shards"]:
            raise CheckpointError(
                f"ReplayService.restore(num_shards={num_shards}): the checkpoint at {root} "
                f"has {m['num_shards']} shards; restore it with the same count")
        # every shard's files are there before any shard starts (a shard that fails to
        # load would surface as Ray's actor error, not as this CheckpointError)
        checkpoint.check_shards(root, int(m["num_shards"]))
        rate = None
        if m.get("rate_limit") is not None:
            from replaybank.distributed.limiter import RateLimit

            rate = RateLimit(**m["rate_limit"])
        svc = cls(m["num_shards"], m["config"], num_lanes=m["num_lanes"], seed=m["seed"],
                  rate_limit=rate, max_times_sampled=m.get("max_times_sampled"),
                  _restore=str(root), **kwargs)
        svc._saved_clients = dict(m.get("clients", {}))
        return svc

    # ------------------------------------------------------------------ lifetime
    def shutdown(self) -> None:
        """Kill every shard actor (their data is gone; checkpoint first)."""
        ray = require_extra("ray", "ray")
        for s in self._shards:
            ray.kill(s, no_restart=True)
        self._shards = []

    def __enter__(self) -> ReplayService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (f"ReplayService(num_shards={self.num_shards}, num_lanes={self.num_lanes}, "
                f"buffer={self.config.get('type')!r})")


def _shard_request(num_cpus: float, ray_options: Mapping[str, Any]) -> dict[str, float]:
    """The resources one shard actor asks Ray for: ``{"CPU": num_cpus}``, ``"GPU"``
    (``num_gpus=``) and the custom ``resources=``."""
    out = {"CPU": float(num_cpus)}
    if ray_options.get("num_gpus"):
        out["GPU"] = float(ray_options["num_gpus"])
    for name, amount in (ray_options.get("resources") or {}).items():
        out[str(name)] = float(amount)
    return out


def _unschedulable(num_shards: int, request: Mapping[str, float],
                   total: Mapping[str, float]) -> str | None:
    """Why ``num_shards`` actors asking ``request`` each can never all run on a cluster
    with ``total`` resources (``ray.cluster_resources()``: every node's, used or not), or
    None when they fit. Ray would keep the others waiting until a timeout.

    Example:
        >>> _unschedulable(2, {"CPU": 1.0}, {"CPU": 2.0}) is None
        True
        >>> print(_unschedulable(3, {"CPU": 1.0}, {"CPU": 2.0}))
        ... # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
        ReplayService(num_shards=3, num_cpus=1.0): shards [2] could not be scheduled: each
        shard asks for 1 CPU and the Ray cluster has 2 CPU in all ... Pass num_cpus=0.66 per
        shard ..., or fewer shards (num_shards <= 2), or more resources for Ray ...
    """
    room = num_shards
    short = []
    for name, need in request.items():
        if need > 0.0:
            fits = math.floor(float(total.get(name, 0.0)) / need + 1e-9)
            if fits < num_shards:
                room = min(room, fits)
                short.append(f"{float(total.get(name, 0.0)):g} {name}")
    if room >= num_shards:
        return None
    fixes = []
    cpus = float(total.get("CPU", 0.0))
    if request.get("CPU", 0.0) * num_shards > cpus:
        per = math.floor(cpus / num_shards * 100) / 100
        if per > 0:
            fixes.append(f"num_cpus={per:g} per shard (a shard mostly waits on calls)")
    if room > 0:
        fixes.append(f"fewer shards (num_shards <= {room})")
    fixes.append("more resources for Ray (ray.init(num_cpus=...) or more nodes)")
    asks = ", ".join(f"{v:g} {k}" for k, v in request.items() if v > 0)
    return (f"ReplayService(num_shards={num_shards}, num_cpus={request.get('CPU', 0.0)!r}): "
            f"shards {list(range(room, num_shards))} could not be scheduled: each shard "
            f"asks for {asks} and the Ray cluster has {', '.join(short)} in all "
            f"(ray.cluster_resources()), room for {room} shard{'s' * (room != 1)}. "
            f"Pass {', or '.join(fixes)}")


def _not_started(shards: list[int], request: Mapping[str, float],
                 total: Mapping[str, float], free: Mapping[str, float],
                 timeout: float) -> str:
    """The message of shards that did not answer within ``timeout`` at start-up."""
    asks = ", ".join(f"{v:g} {k}" for k, v in request.items() if v > 0)
    have = ", ".join(f"{float(total.get(k, 0.0)):g} {k} ({float(free.get(k, 0.0)):g} free)"
                     for k, v in request.items() if v > 0)
    return (f"ReplayService: shards {shards} did not start within timeout={timeout:g}s; "
            f"each shard asks for {asks} and the Ray cluster has {have} while the other "
            "shards run: other actors or tasks may hold the rest. Free them, pass a "
            "smaller num_cpus= per shard or fewer shards, or raise timeout= (restoring "
            "a large checkpoint takes time)")


def _creation_error(exc: BaseException) -> ReplayBankError | None:
    """The replaybank error a shard's ``__init__`` raised, inside Ray's error (or None).

    The innermost one: Ray wraps a task's error in a class that is both its own error
    and the cause's type (``RayTaskError(CheckpointError)``, whose message is Ray's
    remote traceback); the user gets the shard's error itself, with its own message.
    """
    found: ReplayBankError | None = None
    cause: Any = exc
    for _ in range(4):
        if isinstance(cause, ReplayBankError):
            found = cause
        cause = getattr(cause, "cause", None)
        if cause is None:
            break
    return found
