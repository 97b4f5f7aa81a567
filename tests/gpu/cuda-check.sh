#!/usr/bin/env bash
# One prepared run on a machine with an NVIDIA GPU: llama-cpp-python built with CUDA for this
# GPU's architecture only, the GPU tests, and tallow bench against llama-bench from the same
# source (tests/benchmarks/gpu.py: pp512 and tg128 at all layers, and the planner's device
# memory against what llama.cpp allocates). Everything it finds goes to OUT.
#
#     tests/gpu/cuda-check.sh [OUT]        # default: $OUT, else ./cuda-results
#
# A machine without a route to a package index needs PIP_FIND_LINKS (a wheelhouse with
# tallow's dependencies and llama-cpp-python's source) and TALLOW_TEST_HOME holding the
# default model (the tests' shared home, as the main suite leaves it).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${1:-${OUT:-cuda-results}}
VENV=${TALLOW_CUDA_VENV:-.cuda-venv}
mkdir -p "$OUT"
status=0

if ! nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv >"$OUT/gpu.csv" 2>&1; then
  echo "no NVIDIA GPU answers nvidia-smi: nothing to check" | tee "$OUT/summary.txt"
  exit 2
fi
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
spec=$("$VENV/bin/python" -c 'import tomllib; d = tomllib.load(open("pyproject.toml", "rb"))
print(next(s for s in d["project"]["dependencies"] if s.startswith("llama-cpp-python")))')
started=$(date +%s)
if ! CMAKE_ARGS="-DGGML_CUDA=on -DGGML_CUDA_NO_VMM=on -DCMAKE_CUDA_ARCHITECTURES=$cap" \
     CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
     "$VENV/bin/pip" install -q --no-cache-dir --force-reinstall "$spec" >"$OUT/build.log" 2>&1; then
  echo "the CUDA build failed (sm_$cap): see build.log" | tee "$OUT/summary.txt"
  exit 1
fi
echo "build: $(( $(date +%s) - started )) s for sm_$cap" >"$OUT/summary.txt"
"$VENV/bin/pip" install -q -e ".[test]" >>"$OUT/build.log" 2>&1 || status=1

"$VENV/bin/python" -m tallow.cli doctor --json --no-live >"$OUT/doctor.json" 2>>"$OUT/summary.txt" || status=1
"$VENV/bin/python" -m pytest -m gpu -v -p no:cacheprovider tests/gpu >"$OUT/tests.log" 2>&1 || status=1
tail -n 3 "$OUT/tests.log" >>"$OUT/summary.txt"
"$VENV/bin/python" tests/benchmarks/gpu.py --rounds 2 --reps 3 >"$OUT/bench.log" 2>&1 || status=1
tail -n 5 "$OUT/bench.log" >>"$OUT/summary.txt"
cat "$OUT/summary.txt"
exit "$status"
