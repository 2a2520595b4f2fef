#!/bin/bash
# gpu_run.sh runs the CUDA backend's test binary on a GPU machine (one
# without Go): build it first with
#   CGO_ENABLED=0 go test -c -o .gpu/cuda.test ./backend/cuda
# then, from the repository root there: bash backend/cuda/gpu_run.sh [tests|sanitize|bench|all]
# Full logs go to $OUT (or /tmp/gpu-out); a short summary is printed last.
set -o pipefail
cd "$(dirname "$0")"
BIN=../../.gpu/cuda.test
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
what=${1:-all}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader > "$OUT/smi.txt" 2>&1
cat "$OUT/smi.txt"
summary() { grep -E '^(--- FAIL|FAIL|ok|PASS)|relative error|cuda: ' "$1" | grep -vE '^\s+--- PASS' ; }
if [[ $what == tests || $what == all ]]; then
  timeout 240 $BIN -test.v -test.count=1 -test.timeout=230s > "$OUT/test.log" 2>&1
  echo "tests rc=$?"
  grep -E '^(--- FAIL|FAIL|PASS$)|cuda: ' "$OUT/test.log" | head -40
  grep -E -A6 -- '--- FAIL' "$OUT/test.log" | grep -vE '^\s*$' | head -60
  grep -E -A9 -- '=== RUN   TestAttention/window' "$OUT/test.log" | grep -E 'RUN|sequence|relative|diagnostic'
  grep -cE -- '--- PASS' "$OUT/test.log" | sed 's/^/passed: /'
fi
if [[ $what == sanitize || $what == all ]]; then
  RUN='TestGraph|TestEmbed|TestAddRMSNorm|TestSiLUMul|TestRoPEStoreKV|TestMatMul/(Q8|Q4)|TestAttention/(decode_gqa1|decode_gqa7|prefix_cached|padding|window|mixed)|TestSample/(vocab1000_|vocab50_)|TestDeviceChecks'
  timeout 200 compute-sanitizer --tool memcheck --print-limit 20 $BIN -test.run "$RUN" -test.count=1 > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"
  grep -E 'ERROR SUMMARY|========= (Invalid|Program hit|Error)' "$OUT/memcheck.log" | head -20
  grep -E '^(--- FAIL|FAIL|PASS$|ok)' "$OUT/memcheck.log" | head
fi
if [[ $what == racecheck || $what == all ]]; then
  RUN='TestAttention/(prefix_cached|window_gqa2|window_unroll4)|TestSample/vocab1000_|TestAddRMSNorm'
  timeout 150 compute-sanitizer --tool racecheck --print-limit 10 $BIN -test.run "$RUN" -test.count=1 > "$OUT/racecheck.log" 2>&1
  echo "racecheck rc=$?"
  grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|========= (Error|Warning|Race)' "$OUT/racecheck.log" | head -10
  grep -E '^(--- FAIL|FAIL|PASS$|ok)' "$OUT/racecheck.log" | head
fi
if [[ $what == bench || $what == all ]]; then
  timeout 150 $BIN -test.run '^$' -test.bench . -test.benchtime 100x -test.count=1 > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"
  grep -E '^Benchmark|FAIL' "$OUT/bench.log"
fi
