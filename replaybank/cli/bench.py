"""``replaybank bench``: replaybank against the peer libraries installed here.

Cases (capacity ``--scale`` x 1,000,000, rounded down to a multiple of 256 and at least
1,024; obs float32[17], action float32[6]; the harness is
:mod:`replaybank.cli.bench_harness`, shared with ``benchmarks/``):

* ``add``: one transition at a time; ``extend``: chunks of 256; ``sample``: ``sample(256)``;
* ``per``: prioritized ``sample(256)`` + ``update_priorities`` of the 256 (n/a in SB3);
* ``add`` of the inputs real environments give (the harness's input kinds; every library
  gets the same objects, replaybank's spec says obs float32[17], action float32[6]):
  ``add-x4`` (4 envs per call, the stored dtypes: the base of the ``x4`` cases),
  ``add-f64`` (MuJoCo: float64 obs/next_obs and a ``np.float64`` reward, 1 env),
  ``add-f64x4`` (the same with 4 envs: float64 ``[4, 17]`` obs and ``[4]`` rewards),
  ``add-int-flags`` (terminated/truncated as Python ints, 1 env), ``add-torch`` (obs,
  next_obs, action as torch CPU tensors, reward a float and flags bools, as gymnasium's
  ``NumpyToTorch`` gives them; 1 env). SB3 gets ``done = terminated | truncated`` and
  ``infos`` built beforehand, cpprb ``done = terminated``; n/a for tianshou and torchrl;
* window cases (:mod:`~replaybank.cli.bench_windows`): ``sequences``
  (``sample_sequences(16, 64)`` over 16 lanes of obs float32[64]) and ``framestack``
  (``sample(32)`` of 4-frame stacks of uint8 84x84 frames, a fifth of the capacity); n/a
  for the peers (cpprb and SB3 have no window sampler; tianshou's frame stacks and
  torchrl's slices are not wired here, ``benchmarks/bench_framestack.py`` times tianshou's).

Each (library, case) runs in its own process (``python -m replaybank.cli.bench_worker``),
one after another, so one library's imports cannot slow another's; in it, the buffer is
filled to capacity and the case timed ``--repeats`` times (CPU time of that process), the
best kept. Peers not installed are skipped with the ``pip`` line that installs them.
The ratio is peer us / replaybank us: above 1, replaybank is faster.

The floor column (where a case has one: :data:`~replaybank.cli.bench_harness.FLOORS`): for
``sample``, the same ``sample(256)`` done as six ``ndarray.take`` gathers from preallocated
numpy arrays (obs, action, reward, next_obs, terminated, truncated) at ``rng.integers``
indices, the memory-latency floor of a random row gather; for the window cases, the same
windows gathered with ``ndarray.take``. Timed in replaybank's process interleaved with its
call; shown as floor us and ``rb`` = replaybank / floor (target <= 1.1, ``!`` marks a
miss). ``per`` has none (:data:`~replaybank.cli.bench_harness.NO_FLOOR`
says why, and so does the table's note).

JSON (``--json``; ``"format": "replaybank.bench"``, ``"version": 1``): ``scale``,
``capacity``, ``repeats``, ``cases``, ``libraries`` (measured, replaybank first),
``skipped`` (``[{"library", "reason", "install"}]``), ``results``
(``[{"case", "library", "version", "us_per_call", "ratio", "na", "error", "floor_us",
"over_floor"}]``: ``floor_us`` the case's floor, the same in every library's row, null
where there is none; ``over_floor`` = ``us_per_call / floor_us``), ``floors`` (case ->
what its floor is, for the cases run that have one), ``no_floor`` (case -> why it has
none), ``floor_target`` (1.1: replaybank's ``over_floor`` at most this), ``build`` (which
of replaybank's C modules were built and used: :func:`~replaybank.cli.main.build_line`).

Example:
    >>> main(["--help"])  # doctest: +ELLIPSIS
    usage: replaybank bench ...
    0
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from replaybank.cli.args import positive_float, positive_int
from replaybank.cli.bench_harness import CASES, FLOOR_TARGET, FLOORS, NO_FLOOR
from replaybank.cli.main import build_line
from replaybank.errors import closest, require_extra

__all__ = ["FORMAT", "PEERS", "build_parser", "main", "render_table", "run_bench"]

FORMAT = "replaybank.bench"
# peer: (module that must import, pip line)
PEERS: dict[str, tuple[str, str]] = {
    "cpprb": ("cpprb", "pip install cpprb"),
    "sb3": ("stable_baselines3", "pip install stable-baselines3"),
    "tianshou": ("tianshou", "pip install tianshou"),
    "torchrl": ("torchrl", "pip install torchrl"),
}


def build_parser() -> argparse.ArgumentParser:
    """The ``replaybank bench`` argument parser."""
    p = argparse.ArgumentParser(
        prog="replaybank bench",
        description="Time add / extend / sample / PER (and add of float64, int, torch inputs, "
                    "sequence windows and frame stacks) "
                    "of replaybank and the installed peer libraries, each library and case in "
                    "its own process, and print us per call with the ratio peer / replaybank "
                    "(> 1: replaybank faster).")
    p.add_argument("--peers", default=",".join(PEERS),
                   help=f"comma-separated peers, '' for replaybank alone (default: "
                        f"{','.join(PEERS)})")
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma-separated cases (default: {','.join(CASES)})")
    p.add_argument("--scale", type=positive_float("--scale", "0.1"), default=0.1,
                   help="capacity = scale x 1,000,000 transitions, rounded down to a "
                        "multiple of 256, at least 1,024 (default 0.1: 99,840)")
    p.add_argument("--repeats", type=positive_int("--repeats", "5"), default=5,
                   help="timed repeats per case, best kept (default 5)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _split(text: str, allowed: tuple[str, ...] | list[str], what: str, flag: str,
           empty_ok: bool = False) -> list[str]:
    """The comma-separated names of ``text``, each one of ``allowed``, in order, once.

    Raises:
        ValueError: ``"argument --flag: ..."``: a name not allowed (with the one probably
            meant), or none at all where ``empty_ok`` is false.

    Example:
        >>> _split("add, per,add", CASES, "case", "--cases")
        ['add', 'per']
        >>> _split("ad", CASES, "case", "--cases")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: argument --cases: unknown case 'ad' (did you mean 'add'?); choose from ...
    """
    items = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in items if s not in allowed]
    if bad:
        near = closest(bad[0], allowed)
        meant = f" (did you mean {near!r}?)" if near is not None else ""
        names = f"{what}{'s' if len(bad) > 1 else ''} {', '.join(map(repr, bad))}"
        raise ValueError(f"argument {flag}: unknown {names}{meant}; choose from "
                         f"{', '.join(allowed)}")
    if not items and not empty_ok:
        raise ValueError(f"argument {flag}: {text!r} names no {what}; pass e.g. {flag} "
                         f"{allowed[0]}, or leave {flag} out for all of them")
    return list(dict.fromkeys(items))


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _worker(library: str, case: str, capacity: int, repeats: int) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "replaybank.cli.bench_worker", library, case, str(capacity),
           str(repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if lines:
        rec: dict[str, Any] = json.loads(lines[-1])
        return rec
    tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return {"library": library, "case": case, "error": tail}


def run_bench(peers: list[str], cases: list[str], scale: float, repeats: int,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every (library, case) worker; the JSON-ready report (see the module doc)."""
    capacity = max(round(scale * 1_000_000), 1024)
    capacity -= capacity % 256
    libraries = ["replaybank"]
    skipped = []
    for peer in peers:
        module, pip = PEERS[peer]
        if _installed(module):
            libraries.append(peer)
        else:
            skipped.append({"library": peer, "reason": f"{module} is not installed",
                            "install": pip})
    results = []
    for case in cases:
        base: float | None = None
        floor: float | None = None
        for lib in libraries:
            if progress is not None:
                progress(f"{lib} {case}")
            rec = _worker(lib, case, capacity, repeats)
            us = rec.get("us_per_call")
            if lib == "replaybank":  # the first: its worker also times the case's floor
                base, floor = us, rec.get("floor_us")
            ratio = us / base if (us is not None and base) else None
            results.append({"case": case, "library": lib, "version": rec.get("version"),
                            "us_per_call": us, "ratio": ratio, "na": rec.get("na"),
                            "error": rec.get("error"), "floor_us": floor,
                            "over_floor": us / floor if (us is not None and floor) else None})
    return {"format": FORMAT, "version": 1, "scale": scale, "capacity": capacity,
            "repeats": repeats, "cases": cases, "libraries": libraries, "skipped": skipped,
            "results": results, "floors": {c: FLOORS[c] for c in cases if c in FLOORS},
            "no_floor": {c: NO_FLOOR[c] for c in cases if c in NO_FLOOR},
            "floor_target": FLOOR_TARGET, "build": build_line()}


def _floor_cell(r: dict[str, Any] | None, target: float) -> str:
    """The floor column's cell of replaybank's row ``r``: floor us (replaybank / floor)."""
    if r is None or r.get("floor_us") is None:
        return "-"
    over = r.get("over_floor")
    if over is None:
        return f"{r['floor_us']:.2f}"
    shown = round(over, 2)  # the mark agrees with the ratio printed (1.104 shows 1.10: met)
    return f"{r['floor_us']:.2f} (rb {shown:.2f}x){'!' if shown > target else ''}"


def render_table(report: dict[str, Any]) -> str:
    """The report as plain text: per case, us per call and peer / replaybank per library,
    and the case's floor with replaybank / floor where it has one."""
    libs: list[str] = report["libraries"]
    by = {(r["case"], r["library"]): r for r in report["results"]}
    versions = {r["library"]: r["version"] for r in report["results"] if r.get("version")}
    floors: dict[str, str] = report.get("floors") or {}
    target = float(report.get("floor_target") or 1.1)
    head = [f"capacity {report['capacity']:,} (scale {report['scale']}), obs float32[17], "
            f"action float32[6], batch 256, best of {report['repeats']}; "
            "us per call (ratio = peer / replaybank, > 1: replaybank faster)",
            "libraries: " + ", ".join(f"{lib} {versions.get(lib, '?')}" for lib in libs),
            *([f"replaybank's {report['build']}"] if report.get("build") else [])]
    w = 22
    wc = max([8, *(len(c) + 2 for c in report["cases"])])
    cols = [libs[0], *(["floor"] if floors else []), *libs[1:]]
    lines = [*head, "", f"{'case':<{wc}}" + "".join(f"{c:>{w}}" for c in cols)]
    notes: list[str] = []
    for case in report["cases"]:
        cells = []
        for lib in libs:
            r = by.get((case, lib))
            if r is None:
                cell = "-"
            elif r.get("error"):
                cell = "error"
                notes.append(f"{lib} {case}: {r['error']}")
            elif r["us_per_call"] is None:
                cell = "n/a"
                notes.append(f"{lib} {case}: n/a ({r['na']})")
            elif lib == "replaybank":
                cell = f"{r['us_per_call']:.2f}"
            else:
                ratio = r["ratio"]
                cell = f"{r['us_per_call']:.2f} ({ratio:.2f}x)" if ratio else \
                    f"{r['us_per_call']:.2f}"
            cells.append(f"{cell:>{w}}")
            if lib == libs[0] and floors:
                cells.append(f"{_floor_cell(r, target):>{w}}")
        lines.append(f"{case:<{wc}}" + "".join(cells))
    for case, what in floors.items():
        notes.append(f"floor ({case}): {what}; rb = replaybank / floor (target <= {target}, "
                     "'!' marks a miss), timed in replaybank's process, interleaved with it")
    for case, why in (report.get("no_floor") or {}).items():
        notes.append(f"{case}: no floor: {why}")
    for s in report["skipped"]:
        notes.append(f"{s['library']} skipped: {s['reason']} ({s['install']})")
    return "\n".join(lines + (["", *notes] if notes else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run ``replaybank bench``; the exit status (2: bad arguments)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): a status, not an exit
        return exc.code if isinstance(exc.code, int) else 2
    try:
        peers = _split(args.peers, list(PEERS), "peer", "--peers", empty_ok=True)
        cases = _split(args.cases, CASES, "case", "--cases")
    except ValueError as exc:
        parser.print_usage(sys.stderr)
        print(f"replaybank bench: error: {exc}", file=sys.stderr)
        return 2
    n_jobs = len(cases) * (1 + sum(_installed(PEERS[p][0]) for p in peers))
    if sys.stdout.isatty() and not args.quiet:
        require_extra("rich", "cli")  # the bar; --quiet runs without it
        from rich.console import Console
        from rich.progress import Progress

        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("bench", total=n_jobs)
            started = [False]

            def progress(label: str) -> None:
                if started[0]:
                    bar.advance(task)
                started[0] = True
                bar.update(task, description=label)

            report = run_bench(peers, cases, args.scale, args.repeats, progress)
    else:
        report = run_bench(peers, cases, args.scale, args.repeats)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_table(report), end="")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
