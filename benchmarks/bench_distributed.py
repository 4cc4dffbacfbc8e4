"""Sharded replay service benchmark (``rb.distributed``) on a local Ray cluster.

For 1, 2 and 4 shards (one lane per shard, obs float32[17], action float32[6]):

* insert throughput: one client ``extend`` s chunks of ``--chunk`` steps per lane
  (batched client-side with the client's default send size unless ``--max-rows`` /
  ``--max-bytes`` say otherwise, pipelined per shard), rows/s until ``flush()`` returns;
* sample throughput: ``client.sample(256)`` calls/s and items/s, with the per-call
  latency (median), and how many calls took one round trip;
* the floor of a sample call: a bare Ray actor whose method returns a prebuilt numpy
  batch of the same fields and shapes (one round trip, same serialisation), measured in
  the same run; the ratio ``sample latency / bare round trip`` (target: within 3x);
* the fan-out floor for ``S`` shards: ``S`` bare actors called in parallel, each
  returning ``B / S`` rows (what one round trip to ``S`` actors costs on this machine;
  with more shards than cores it grows with ``S``), and the ratio to it;
* per shard, the batched insert rate against a single in-process buffer's ``extend`` of
  the same chunks (target: >= 50%);
* the latency (median) of ``client.sample_sequences(16, 64)`` (R2D2-sized windows,
  exact over the shards: candidate starts from every shard and one rejection stream),
  on a second service of ``--seq-capacity`` steps per shard holding continuous
  trajectories (episodes of 1,000 steps; the insert data above is i.i.d. noise, every
  step a discontinuity, so it holds no window).

Wall-clock times (Ray work happens in other processes), median of ``--repeats`` runs of
each measurement. Each shard reserves one logical CPU (Ray is started with
``num_cpus = max(shards) + 1``); on a machine with fewer cores the shards share them,
which the table's header reports.

Run: ``python benchmarks/bench_distributed.py [--shards 1 2 4] [--sampler uniform|prioritized]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np

import replaybank as rb

OBS, ACT, BATCH = 17, 6, 256
SEQ_B, SEQ_L, EPISODE = 16, 64, 1000


def chunk_values(steps: int, lanes: int, t0: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(t0)
    n = (steps, lanes)
    return {"obs": rng.standard_normal((*n, OBS), dtype=np.float32),
            "action": rng.standard_normal((*n, ACT), dtype=np.float32),
            "reward": rng.standard_normal(n, dtype=np.float32),
            "next_obs": rng.standard_normal((*n, OBS), dtype=np.float32),
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}


def trajectories(steps: int, lanes: int) -> dict[str, Any]:
    """``steps`` continuous steps per lane (``next_obs[t] == obs[t + 1]``), truncated
    every ``EPISODE`` steps."""
    rng = np.random.default_rng(1)
    obs = rng.standard_normal((steps + 1, lanes, OBS), dtype=np.float32)
    n = (steps, lanes)
    trunc = np.zeros(n, bool)
    trunc[EPISODE - 1::EPISODE] = True
    return {"obs": obs[:-1], "action": rng.standard_normal((*n, ACT), dtype=np.float32),
            "reward": rng.standard_normal(n, dtype=np.float32), "next_obs": obs[1:],
            "terminated": np.zeros(n, bool), "truncated": trunc}


def sequence_latency(shards: int, capacity: int, sampler: str, calls: int) -> float:
    """Median seconds of ``client.sample_sequences(SEQ_B, SEQ_L)`` over ``shards``
    shards of ``capacity`` continuous steps each."""
    from replaybank.distributed import ReplayService

    svc = ReplayService(shards, config(capacity, sampler), num_lanes=shards, seed=1,
                        timeout=120.0)
    try:
        client = svc.client()
        client.extend(**trajectories(capacity, shards), env_ids=np.arange(shards))
        client.flush()
        client.sample_sequences(SEQ_B, SEQ_L)  # warm
        lat = []
        for _ in range(calls):
            t = time.perf_counter()
            client.sample_sequences(SEQ_B, SEQ_L)
            lat.append(time.perf_counter() - t)
        return statistics.median(lat)
    finally:
        svc.shutdown()


def config(capacity: int, sampler: str) -> dict[str, Any]:
    return {"capacity": capacity, "sampler": {"type": sampler}}


def in_process_extend_rate(capacity: int, chunk: int, sampler: str, repeats: int) -> float:
    """Rows/s of a single in-process buffer extending ``chunk``-step chunks."""
    data = chunk_values(chunk, 1)
    one = {k: v[:, 0] for k, v in data.items()}
    rates = []
    for _ in range(repeats):
        buf = rb.from_config(config(capacity, sampler))
        t = time.perf_counter()
        n = 0
        while n < capacity:
            buf.extend(**one)
            n += chunk
        rates.append(n / (time.perf_counter() - t))
    return statistics.median(rates)


def bench_shards(shards: int, capacity: int, chunk: int, sampler: str, calls: int,
                 repeats: int, bare: Any, send: dict[str, int],
                 seq_capacity: int) -> dict[str, float]:
    from replaybank.distributed import ReplayService

    svc = ReplayService(shards, config(capacity, sampler), num_lanes=shards, seed=0,
                        timeout=120.0)
    try:
        client = svc.client(max_in_flight=4, **send)
        data = chunk_values(chunk, shards)
        lanes = np.arange(shards)
        inserts = []
        for _ in range(repeats):
            t = time.perf_counter()
            n = 0
            while n < capacity * shards:
                client.extend(**data, env_ids=lanes)
                n += chunk * shards
            client.flush()
            inserts.append(n / (time.perf_counter() - t))
        client.sample(BATCH)  # warm
        before = client.draw_paths["one_trip"]
        lat = []
        for _ in range(calls):
            t = time.perf_counter()
            client.sample(BATCH)
            lat.append(time.perf_counter() - t)
        sample_lat = statistics.median(lat)
        bare_lat = bare(calls)
        fan, actors = make_fanout(_ray(), sampler, shards)
        fan_lat = fan(calls)
        for a in actors:
            _ray().kill(a)
        out = {"shards": shards, "insert_rows_s": statistics.median(inserts),
                "sample_calls_s": 1 / sample_lat, "sample_items_s": BATCH / sample_lat,
                "sample_ms": sample_lat * 1e3, "bare_ms": bare_lat * 1e3,
                "ratio": sample_lat / bare_lat, "fan_ms": fan_lat * 1e3,
                "fan_ratio": sample_lat / fan_lat,
                "one_trip": (client.draw_paths["one_trip"] - before) / calls}
    finally:
        svc.shutdown()
    # after the shutdown: each shard reserves a CPU of the cluster
    out["seq_ms"] = 1e3 * sequence_latency(shards, seq_capacity, sampler, max(1, calls // 3))
    return out


def _ray() -> Any:
    import ray

    return ray


def make_bare(ray: Any, sampler: str) -> Any:
    """A bare actor returning a prebuilt batch of the same fields: its round trip."""

    return make_fanout(ray, sampler, 1, num_cpus=1)


def make_fanout(ray: Any, sampler: str, shards: int, num_cpus: float = 0) -> Any:
    """``shards`` bare actors, each returning a prebuilt batch of ``ceil(B / shards)``
    rows; ``run(calls)`` is the median time of one parallel round of calls to all."""

    @ray.remote
    class Bare:
        def __init__(self, n: int) -> None:
            buf = rb.from_config(config(4096, sampler))
            d = chunk_values(4096, 1)
            buf.extend(**{k: v[:, 0] for k, v in d.items()})
            self.batch = buf.sample(n).to_dict(nested=False)

        def sample(self) -> dict[str, Any]:
            return self.batch

    actors = [Bare.options(num_cpus=num_cpus).remote(-(-BATCH // shards))
              for _ in range(shards)]
    ray.get([a.sample.remote() for a in actors])

    def run(calls: int) -> float:
        lat = []
        for _ in range(calls):
            t = time.perf_counter()
            ray.get([a.sample.remote() for a in actors])
            lat.append(time.perf_counter() - t)
        return statistics.median(lat)

    return run, actors


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--capacity", type=int, default=200_000, help="per shard")
    p.add_argument("--chunk", type=int, default=1024, help="steps per lane per extend")
    p.add_argument("--calls", type=int, default=300, help="sample calls timed")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seq-capacity", type=int, default=50_000,
                   help="per shard, for sample_sequences")
    p.add_argument("--sampler", default="uniform", choices=["uniform", "prioritized"])
    p.add_argument("--max-rows", type=int, default=None,
                   help="client rows per shard per send (default: the client's)")
    p.add_argument("--max-bytes", type=int, default=None,
                   help="client bytes per shard per send (default: the client's)")
    a = p.parse_args()
    send = {k: v for k, v in (("max_rows", a.max_rows), ("max_bytes", a.max_bytes))
            if v is not None}
    import ray

    ray.init(num_cpus=max(a.shards) + 1, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="rbbench", dir="/tmp"))
    bare, _actor = make_bare(ray, a.sampler)
    local = in_process_extend_rate(a.capacity, a.chunk, a.sampler, a.repeats)
    rows = [bench_shards(s, a.capacity, a.chunk, a.sampler, a.calls, a.repeats, bare, send,
                         a.seq_capacity) for s in a.shards]
    print(f"rb.distributed, sampler={a.sampler}, {os.cpu_count()} CPU cores on this "
          f"machine, Ray logical CPUs {max(a.shards) + 1} (one per shard + bare actor); "
          f"chunk {a.chunk} steps/lane, capacity {a.capacity:,}/shard, batch {BATCH}, "
          f"client sends {send or 'default'}")
    print(f"single in-process buffer extend: {local:,.0f} rows/s")
    head = (f"{'shards':>6} {'insert rows/s':>14} {'per shard':>12} {'vs local':>9} "
            f"{'sample/s':>9} {'items/s':>11} {'sample ms':>10} {'bare ms':>8} {'ratio':>6} "
            f"{'fan-out ms':>10} {'ratio':>6} {'1 trip':>6} {'seq ms':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        per = r["insert_rows_s"] / r["shards"]
        print(f"{r['shards']:>6} {r['insert_rows_s']:>14,.0f} {per:>12,.0f} "
              f"{per / local:>8.0%} {r['sample_calls_s']:>9,.0f} {r['sample_items_s']:>11,.0f} "
              f"{r['sample_ms']:>10.2f} {r['bare_ms']:>8.2f} {r['ratio']:>6.2f} "
              f"{r['fan_ms']:>10.2f} {r['fan_ratio']:>6.2f} {r['one_trip']:>6.0%} "
              f"{r['seq_ms']:>7.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
