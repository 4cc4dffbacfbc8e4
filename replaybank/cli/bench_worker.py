"""One (library, case) measurement of ``replaybank bench``, in a process of its own.

``python -m replaybank.cli.bench_worker LIBRARY CASE CAPACITY REPEATS`` builds
``LIBRARY``'s buffer (:mod:`replaybank.cli.bench_harness`), fills it to ``CAPACITY``, times
``CASE`` ``REPEATS`` times after a warm-up, and prints one JSON line:
``{"library", "case", "version", "us_per_call" (best), "repeats_us", "na", "floor_us",
"floor_repeats_us"}`` (``us_per_call`` null and ``na`` set when the library has no such
operation). ``floor_us`` is the best time of the case's floor
(:data:`replaybank.cli.bench_harness.FLOORS`: replaybank's ``sample`` only), timed in this
process interleaved with the case (each repeat times one, then the other); null otherwise.
Any failure prints ``{"library", "case", "error"}`` and exits with status 1.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

__all__ = ["main", "run"]


def run(library: str, case: str, capacity: int, repeats: int) -> dict[str, Any]:
    """Measure ``case`` on ``library``'s buffer; the JSON record (see the module doc)."""
    from replaybank.cli.bench_harness import build_target, measure, measure_floor

    target = build_target(library, capacity, case)
    floor_times: list[float] | None = None
    paired = measure_floor(target, case, repeats)
    if paired is None:
        times = measure(target, case, repeats)
    else:
        times, floor_times = paired
    rec: dict[str, Any] = {"library": library, "case": case, "version": target.version,
                           "capacity": capacity}
    if times is None:
        rec.update(us_per_call=None, repeats_us=[], na=target.na or "not supported")
    else:
        rec.update(us_per_call=min(times) * 1e6, repeats_us=[t * 1e6 for t in times], na=None)
    rec.update(floor_us=None if floor_times is None else min(floor_times) * 1e6,
               floor_repeats_us=[t * 1e6 for t in floor_times or []])
    return rec


def main(argv: list[str] | None = None) -> int:
    """Run one measurement and print its JSON line; the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 4:
        print("usage: python -m replaybank.cli.bench_worker LIBRARY CASE CAPACITY REPEATS",
              file=sys.stderr)
        return 2
    library, case = args[0], args[1]
    try:
        rec = run(library, case, int(args[2]), int(args[3]))
    except Exception as exc:  # reported to the parent, which shows it in the table
        traceback.print_exc(file=sys.stderr)
        print(json.dumps({"library": library, "case": case,
                          "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps(rec))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
