"""Peak extra memory (RSS) of save and load for a >= 1 GiB buffer.

Each phase runs in its own subprocess, which resets its peak-RSS mark
(``/proc/self/clear_refs``), runs the phase and reads ``VmHWM`` from ``/proc/self/status``:

* save: peak RSS during ``buf.save`` minus RSS before it (the buffer is already in memory);
* load: peak RSS during ``rb.load`` minus RSS before it minus the loaded buffer's own
  bytes (the buffer has to be somewhere);
* baseline: the same for ``safetensors.numpy.save_file`` / ``load_file`` of the same
  arrays (what velora's save does), to compare.

Target: extra <= 0.2x the buffer size for replaybank.

Run: ``python benchmarks/bench_checkpoint.py [--gib 1.0] [--no-baseline]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

OBS = 1024  # float32 values per observation: 4 KiB per step


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(key)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _build(gib: float) -> Any:
    import numpy as np

    import replaybank as rb

    steps = int(gib * 2**30) // (OBS * 4)
    steps -= steps % 8192
    buf = rb.ReplayBuffer(steps, seed=0, spec={"obs": ((OBS,), "float32"),
                                               "action": ((), "int64")})
    chunk = 8192
    row = np.arange(OBS, dtype=np.float32)
    prev = row.copy()
    for i in range(0, steps, chunk):
        block = np.empty((chunk + 1, OBS), np.float32)
        block[0] = prev
        block[1:] = row[None, :] + (i + 1 + np.arange(chunk, dtype=np.float32))[:, None]
        prev = block[-1].copy()
        done = np.zeros(chunk, bool)
        done[::1000] = True
        block_next = block[1:].copy()
        buf.extend(obs=block[:-1], action=np.arange(chunk), reward=np.ones(chunk),
                   next_obs=block_next, terminated=done, truncated=np.zeros(chunk, bool))
        del block, block_next
    return buf


def child(phase: str, gib: float, d: str) -> None:
    import replaybank as rb
    from replaybank.io.state_tree import split_state

    out: dict[str, Any] = {"phase": phase}
    if phase in ("save", "baseline_save"):
        buf = _build(gib)
        out["nbytes"] = buf.nbytes()
        before = _status("VmRSS")
        _reset_peak()
        t0 = time.perf_counter()
        if phase == "save":
            buf.save(d)
        else:
            from safetensors.numpy import save_file

            _, arrays = split_state(buf.state_dict())
            save_file({k: v for k, v in arrays.items()}, os.path.join(d, "base.safetensors"))
        out["seconds"] = time.perf_counter() - t0
        out["extra"] = _status("VmHWM") - before
    else:
        before = _status("VmRSS")
        _reset_peak()
        t0 = time.perf_counter()
        if phase == "load":
            buf = rb.load(d)
            out["nbytes"] = buf.nbytes()
        else:
            from safetensors.numpy import load_file

            arrays = load_file(os.path.join(d, "base.safetensors"))
            out["nbytes"] = sum(a.nbytes for a in arrays.values())
        out["seconds"] = time.perf_counter() - t0
        out["extra"] = _status("VmHWM") - before - out["nbytes"]
    print(json.dumps(out), flush=True)


def run(phase: str, gib: float, d: str) -> dict[str, Any]:
    res = subprocess.run([sys.executable, __file__, "--child", phase, "--gib", str(gib),
                          "--dir", d], capture_output=True, text=True, check=True)
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--child", default=None)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--no-baseline", action="store_true")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.gib, args.dir)
        return
    phases = ["save", "load"] + ([] if args.no_baseline else ["baseline_save",
                                                               "baseline_load"])
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        print(f"buffer of {args.gib} GiB (obs float32[{OBS}]), files in {d}")
        for phase in phases:
            r = run(phase, args.gib, d)
            ratio = r["extra"] / r["nbytes"]
            mark = "ok" if ratio <= 0.2 or phase.startswith("baseline") else "OVER 0.2x"
            print(f"{phase:>14}: buffer {r['nbytes'] / 2**30:.3f} GiB, peak extra RSS "
                  f"{r['extra'] / 2**20:8.1f} MiB = {ratio:.3f}x buffer, "
                  f"{r['seconds']:.2f} s  [{mark}]")


if __name__ == "__main__":
    main()
