#!/bin/bash
# The GPU machine check, in one run: the CUDA tests, bench_torch_storage.py, and
# bench_distributed.py and `replaybank bench` on the machine's CPU cores.
#
#   bash benchmarks/device_check.sh [tests] [torch] [dist] [bench] [cpu]   (default: all)
#
# `cpu` runs issue 29's CPU benchmarks on the machine's quieter cores: bench_core.py
# (core table), bench_per.py, bench_sequences.py, bench_framestack.py, and
# bench_window_overhead.py (is a case's time above its take floor a fixed cost per call or
# memory? uniform sample(256), sequences and frame stacks; the H200 host's 16 cores showed
# 18 us against 4-7 us here for the windows) (about a minute here).
#
# Run from the repository root with a Python that has torch (a CUDA build), numpy,
# safetensors, pydantic, hypothesis and pytest (pytest-xdist optional), plus ray for
# `dist` and cpprb / stable-baselines3 / tianshou for the peers of `bench`. It builds the
# C modules in place, and writes each step's log to $OUT (default /tmp/device_check; at
# most 8 files, what the device tool brings back).
# Step time limits: TT, TB, TD, TR seconds (defaults 200, 120, 120, 150; TR for each of the
# bench step's two runs). On the H200 machine of docs/benchmarks.md the first four steps
# took 125 s together, with tianshou failing to import; with tianshou importing, one
# bench run of all three peers passed 150 s and printed nothing (its table comes at the end).
#
# A machine without a package index: WHEELS=<folder> installs every *.whl there (no
# dependencies resolved: bring each one) and unpacks every *.tar.xz there (a package
# tree too large for a wheel, e.g. ray without its Java jars and dashboard) into
# $SITE (default /tmp/site), which goes first on PYTHONPATH.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
PY=${PY:-python3}
T0=$(date +%s)
t() { echo "== t=$(( $(date +%s) - T0 ))s $*"; }
if [ -n "${WHEELS:-}" ]; then
  SITE=${SITE:-/tmp/site}
  mkdir -p "$SITE"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
      "$WHEELS"/*.whl > "$OUT/wheels.log" 2>&1 || echo "wheel install FAILED (wheels.log)"
  for tarball in "$WHEELS"/*.tar.xz; do
    [ -e "$tarball" ] && { tar xJf "$tarball" -C "$SITE" || echo "unpacking $tarball FAILED"; }
  done
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  t "wheels from $WHEELS installed into $SITE"
fi

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  echo "cores: $(nproc); $(lscpu 2>/dev/null | grep -m1 'Model name' | tr -s ' ')"
  $PY -c "import sys, numpy, torch; print(sys.version.split()[0], 'numpy', numpy.__version__,
'torch', torch.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
} 2>&1 | tee "$OUT/machine.txt"
$PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1 && echo "C modules built" \
    || echo "C modules NOT built (see build.log): the Python writer serves"

XDIST=$($PY -c "import xdist" 2>/dev/null && echo "-n 4")
for step in ${*:-tests torch dist bench cpu}; do
  case $step in
  tests)
    t "CUDA tests"
    timeout "${TT:-200}" $PY -m pytest -q -rs -p no:cacheprovider -o addopts= -m "not slow" \
      $XDIST -W ignore::DeprecationWarning \
      tests/test_torch_storage.py tests/test_device_per.py tests/test_device_sampling.py \
      tests/test_prefetch.py tests/test_torch_priorities.py tests/test_transfer.py \
      tests/test_day_one.py tests/test_compat_velora.py::test_cuda_device \
      tests/test_compat_pytorchrl.py::test_get_priority_tensor_in_tensor_out \
      --deselect tests/test_day_one.py::test_version_matches_the_metadata \
      2>&1 | tee "$OUT/tests.log" | tail -40 ;;
  torch)
    t "bench_torch_storage.py"
    timeout "${TB:-120}" $PY benchmarks/bench_torch_storage.py 2>&1 \
      | tee "$OUT/bench_torch_storage.txt" ;;
  dist)
    t "bench_distributed.py"
    timeout "${TD:-120}" $PY benchmarks/bench_distributed.py 2>&1 \
      | tee "$OUT/bench_distributed.txt" | tail -8 ;;
  bench)
    t "replaybank bench"
    # the table prints at the end: two runs, so a slow peer cannot take the other rows
    timeout "${TR:-150}" $PY -m replaybank.cli.main bench --scale 1 \
      --peers cpprb,sb3 --cases sample,per,sequences,framestack --repeats 3 \
      --quiet 2>&1 | tee "$OUT/replaybank_bench.txt" | head -9
    t "replaybank bench, tianshou"
    timeout "${TR:-150}" $PY -m replaybank.cli.main bench --scale 1 \
      --peers tianshou --cases sample,per --repeats 2 \
      --quiet 2>&1 | tee -a "$OUT/replaybank_bench.txt" | head -6 ;;
  cpu)
    for script in bench_core.py bench_per.py bench_sequences.py bench_framestack.py \
        bench_window_overhead.py; do
      t "$script"
      args=""; [ "$script" = bench_core.py ] && args="--table core"
      echo "## $script" >> "$OUT/cpu_benchmarks.txt"
      timeout 120 $PY "benchmarks/$script" $args 2>&1 | tee -a "$OUT/cpu_benchmarks.txt" | tail -6
    done ;;
  *) echo "unknown step $step (tests, torch, dist, bench, cpu)" ;;
  esac
done
t done
