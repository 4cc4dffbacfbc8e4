"""The input kinds against their conversion floor: how much of a converting ``add`` or
``extend`` is the conversion itself.

``bench_core.py --table inputs`` asks every input kind to stay within 1.5x of the
exact-dtype call. A kind's values must be read and converted, so a writer can be no faster
than its exact path plus the least conversion the libraries themselves can do. This
script measures that sum beside replaybank, with the objects of ``bench_core.py``
(:func:`replaybank.cli.bench_harness.input_steps` and ``input_chunks``: capacity 1M filled
sequentially per lane, obs float32[17], action float32[6], reward float32, bool flags):

* ``rb``: replaybank's ``add`` / ``extend(256)`` of the kind;
* ``exact``: the same call with the exact-dtype kind (the stored dtypes);
* ``conv``: the kind's conversion by numpy and torch, beyond what the exact values cost.
  Each value of one call goes into a preallocated C-contiguous array of its stored dtype
  by ``np.copyto(out, value, casting="unsafe")`` (numpy's own cast, and its reading of
  lists and scalars); a torch tensor first makes the two calls that tell where its items
  are and whether torch negates them lazily (``torch.utils.dlpack.to_dlpack(t)``,
  ``t.is_neg()``: the least torch API that does), then the exact values' copy. The same
  copies of the exact kind's values are subtracted.

``floor = exact + conv``: a writer as fast as replaybank's exact path that converts with
numpy's and torch's own primitives. Columns: the times (us per call), ``rb/exact`` (the
target's ratio, <= 1.5), ``floor/exact`` (the least that ratio can be, by this measure)
and ``rb/floor`` (below 1: replaybank converts faster than numpy would). For lists numpy is
slow, so their floor is loose (``rb/floor`` well below 1).

Each time is the best of ``--repeats`` rounds of ``--calls`` calls on distinct objects,
the collector run and 16 MB read before each round (no round finds its inputs in the
core's caches), the three measures interleaved in every repeat.

Usage::

    python benchmarks/bench_input_floor.py [--envs 1,4] [--ops add,extend] [--repeats 7]
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from replaybank.cli.bench_harness import (
    CHUNK,
    INPUT_KINDS,
    filled_replaybank,
    input_chunks,
    input_steps,
)

#: the stored dtypes of bench_harness.SPEC and the default reward and flags
STORED = {"obs": np.float32, "next_obs": np.float32, "action": np.float32,
          "reward": np.float32, "terminated": np.bool_, "truncated": np.bool_}


def _is_tensor(v: Any) -> bool:
    return type(v).__module__.startswith("torch")


def converter(calls: list[dict[str, Any]], exact: list[dict[str, Any]]
              ) -> Callable[[int], None]:
    """What converting call ``i``'s values takes: numpy's cast of each into a preallocated
    array of its stored dtype (a tensor: its DLPack export and lazy-negation query, then
    the exact values' copy). The work of each call is listed beforehand, so the loop
    pays no type tests."""
    outs = {k: np.empty(np.shape(v), STORED[k]) for k, v in exact[0].items()}
    tensors = [[v for v in d.values() if _is_tensor(v)] for d in calls]
    copies = [[(outs[k], exact[i][k] if _is_tensor(v) else v) for k, v in d.items()]
              for i, d in enumerate(calls)]
    copyto = np.copyto
    if not any(tensors):
        def run(i: int) -> None:
            for out, v in copies[i]:
                copyto(out, v, casting="unsafe")
        return run
    from torch.utils.dlpack import to_dlpack

    def run_tensors(i: int) -> None:
        for t in tensors[i]:
            to_dlpack(t)
            t.is_neg()
        for out, v in copies[i]:
            copyto(out, v, casting="unsafe")
    return run_tensors


#: touched before every round: what the last round read leaves the core's caches, so no
#: measure finds its inputs warmer than another's (the round that read the exact values
#: last would otherwise favour the next exact round)
_EVICT = np.ones(1 << 21)  # 16 MB


def timed(fn: Callable[[int], Any], n: int) -> float:
    """Seconds per ``fn(i)`` over ``i`` in ``range(n)``, the collector run and the core's
    caches flushed of the last round's data first."""
    gc.collect()
    _EVICT.sum()
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t0) / n


def measure(envs: int, op: str, kinds: list[str], calls: int, repeats: int,
            capacity: int) -> dict[str, dict[str, float]]:
    """Best seconds per call of rb, exact and conv for each kind."""
    buf = filled_replaybank(capacity - capacity % (CHUNK * envs), envs)
    make = input_steps if op == "add" else input_chunks
    data = {k: make(k, calls, envs) for k in kinds}
    call = buf.add if op == "add" else buf.extend
    plans: dict[str, dict[str, Callable[[int], Any]]] = {}
    for k in kinds:
        items = data[k]
        plans[k] = {"rb": lambda i, items=items: call(**items[i]),
                    "conv": converter(items, data["exact"]),
                    "copy": converter(data["exact"], data["exact"])}
        for fn in plans[k].values():  # warm up (and a refusal shows here)
            fn(0)
    gc.collect()
    gc.freeze()  # the inputs and the filled buffer stay out of the collector's scans
    best: dict[str, dict[str, float]] = {k: {} for k in kinds}
    for _ in range(repeats):
        for k in kinds:
            for name, fn in plans[k].items():
                t = timed(fn, calls)
                best[k][name] = min(best[k].get(name, float("inf")), t)
    gc.unfreeze()
    for k in kinds:
        best[k]["conv"] = max(best[k]["conv"] - best[k]["copy"], 0.0)
    return best


def report(envs: int, op: str, kinds: list[str], best: dict[str, dict[str, float]]) -> None:
    exact = best["exact"]["rb"]
    print(f"\n{op}{f'({CHUNK})' if op == 'extend' else ''}, {envs} env"
          f"{'s' if envs > 1 else ''} (us per call)")
    print(f"{'kind':<16}{'rb':>8}{'exact':>8}{'conv':>8}{'rb/exact':>10}"
          f"{'floor/exact':>13}{'rb/floor':>10}")
    for k in kinds:
        rb_t, conv = best[k]["rb"], best[k]["conv"]
        floor = exact + conv
        print(f"{k:<16}{rb_t * 1e6:8.2f}{exact * 1e6:8.2f}{conv * 1e6:8.2f}"
              f"{rb_t / exact:10.2f}{floor / exact:13.2f}{rb_t / floor:10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", default="1,4")
    parser.add_argument("--ops", default="add,extend")
    parser.add_argument("--kinds", default=",".join(INPUT_KINDS))
    parser.add_argument("--calls", type=int, default=0,
                        help="calls per round (default: 500 adds, 16 extends)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--capacity", type=int, default=1_000_000)
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in INPUT_KINDS]
    if bad:
        raise SystemExit(f"--kinds: unknown {bad}; choose from {', '.join(INPUT_KINDS)}")
    if "exact" not in kinds:
        kinds.insert(0, "exact")
    import replaybank as rb

    print(f"replaybank {rb.__version__}, numpy {np.__version__}; conv = numpy's cast into "
          "the stored dtype (torch: to_dlpack + is_neg) minus the exact values' copy")
    for envs in (int(e) for e in args.envs.split(",")):
        for op in args.ops.split(","):
            calls = args.calls or (500 if op == "add" else 16)
            report(envs, op, kinds, measure(envs, op, kinds, calls, args.repeats,
                                            args.capacity))


if __name__ == "__main__":
    main()
