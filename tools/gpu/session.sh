#!/usr/bin/env bash
# One GPU-machine session: the checks of the CUDA backend that need the H200,
# in one call (device time is scarce). Build first, on the development machine:
#
#   tools/gpu/build.sh
#
# Parts: checks (kernel tests, fixtures on CUDA, trigon run), quick_tests,
# cuda_tests (every test + memcheck), bigref (Llama-3-8B shape vs
# transformers), serve_smoke, bench_rows, graphs, profile (ncu), attn_bench,
# attn_check, default_model, peers, overlap (bench overlap), margin, pdl,
# tune_prefill, prefetch, qkvrope, fuse_ab, fill_check, fuse_norm, add_ab, queue_ab, norm_prefetch, chain, chain_ops, chain_final, chain_verify, tests_only,
# prefill_ab, prefill_small, prefill_tile, cluster_final, cluster_fit, step_trace, pdl_some, attn_pdl, pdl_final, verify_final, spin_ab,
# bulk, bulk_bench, bulk_ab, verify_bulk, bulk_qkv, serve_ab, greedy_same, b16_ab, ktrace and ktrace_qkv (a CUPTI kernel timeline), fix8, ab_old, step_edges, prefetch_ab,
# prefill_chunks, splits, o_overlap, qwen3_pdl, pdl_verify, prefill_wg, wg_bench, bias_check,
# p99_spread (one A/B experiment or check each), final (tests, then peers,
# rows and the server: what docs/benchmarks.md's latest section ran;
# ARCH=<name> runs peers, and ktrace, on another architecture);
# `session.sh bigref graphs` runs those two. Results: $OUT/summary.txt and
# $OUT/logs.tgz (the device tool returns at most 8 files).
#
# then run from the repository root on the GPU machine (the device tool's
# `run`, carrying .gpu/bins.tar.xz):  bash tools/gpu/session.sh
# Logs and JSON results go to $OUT (default ./gpu-out).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
[ -f .gpu/bins.tar.xz ] && tar -C .gpu -xJf .gpu/bins.tar.xz && cp .gpu/bin/* .gpu/
root=$PWD
PY=python3
$PY -c 'import torch, transformers' 2>/dev/null || PY=/opt/torch/.venv/bin/python
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

# all_cuda_tests runs every backend/cuda test into cuda-tests.log, prints
# the verdict, the pass count and any failures, and returns the status.
all_cuda_tests() {
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.timeout 6m >"$OUT/cuda-tests.log" 2>&1)
local rc=$?
echo "rc=$rc" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/cuda-tests.log" | tail -8 | tee -a "$OUT/summary.txt"
grep -c -- "--- PASS" "$OUT/cuda-tests.log" | sed 's/^/passed (tests and subtests): /' | tee -a "$OUT/summary.txt"
grep -c -- "--- SKIP" "$OUT/cuda-tests.log" | sed 's/^/skipped: /' | tee -a "$OUT/summary.txt"
grep -E "^\s+--- FAIL" "$OUT/cuda-tests.log" | head -20 | tee -a "$OUT/summary.txt"
return $rc
}

# model_tests: the CUDA model tests (the fixture models against
# transformers, the default model GPU against CPU) into llama-cuda.log.
model_tests() {
log "model tests on CUDA"
(cd model/llama && "$root/.gpu/llama.test" -test.run 'TestFixturesCUDA|TestDefaultModelCUDAMatchesCPU' -test.v >"$OUT/llama-cuda.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "worst|^(--- FAIL|FAIL|PASS)" "$OUT/llama-cuda.log" | tee -a "$OUT/summary.txt"
}

# memcheck PATTERN runs compute-sanitizer's memcheck over the backend/cuda
# tests PATTERN selects (at most 150 s).
memcheck() {
(cd backend/cuda && timeout 150 compute-sanitizer --tool memcheck "$root/.gpu/cuda.test" -test.run "$1" >"$OUT/memcheck.log" 2>&1)
echo "memcheck rc=$?" | tee -a "$OUT/summary.txt"; grep -E "ERROR SUMMARY|^(PASS|FAIL)" "$OUT/memcheck.log" | tee -a "$OUT/summary.txt"
}
# cuda_tests_run LOG PATTERN [VAR=VALUE...]: the backend/cuda tests
# PATTERN selects, under the given environment, into LOG; prints the
# verdict, failures and pass/skip counts.
cuda_tests_run() {
local logf=$1 pat=$2; shift 2
(cd backend/cuda && env "$@" "$root/.gpu/cuda.test" -test.v -test.run "$pat" >"$OUT/$logf" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/$logf" | tail -6 | tee -a "$OUT/summary.txt"
grep -E "^\s+--- FAIL" "$OUT/$logf" | head -10 | tee -a "$OUT/summary.txt"
grep -c -- "--- PASS" "$OUT/$logf" | sed 's/^/passed: /' | tee -a "$OUT/summary.txt"
grep -c -- "--- SKIP" "$OUT/$logf" | sed 's/^/skipped: /' | tee -a "$OUT/summary.txt"
}
nvidia-smi -L | tee -a "$OUT/summary.txt"
[ -f .gpu/BUILD ] && sed 's/^/build: /' .gpu/BUILD | tee -a "$OUT/summary.txt"

checks() {
log "kernel tests: attention and RoPE at head dims 16, 32, 64, 128, 256"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run 'TestAttention|TestRoPEStoreKV' -test.v >"$OUT/cuda-attn.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)" "$OUT/cuda-attn.log" | tail -5 | tee -a "$OUT/summary.txt"

log "memcheck over the new head-dim cases"
(cd backend/cuda && compute-sanitizer --tool memcheck "$root/.gpu/cuda.test" -test.run 'TestAttention/(mixed_gqa2_d32|mixed_gqa2_d16|mixed_gqa4_d256)' >"$OUT/memcheck.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "ERROR SUMMARY|^(PASS|FAIL)" "$OUT/memcheck.log" | tee -a "$OUT/summary.txt"

log "fixture models end to end on CUDA vs transformers and the CPU"
(cd model/llama && "$root/.gpu/llama.test" -test.run 'TestFixturesCUDA' -test.v >"$OUT/fixtures-cuda.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "worst|near tie|^(--- FAIL|FAIL|PASS)" "$OUT/fixtures-cuda.log" | tee -a "$OUT/summary.txt"

log "trigon kernels"
.gpu/trigon kernels 2>&1 | tail -3 | tee -a "$OUT/summary.txt"

log "trigon run on the default model: cuda vs cpu, greedy"
p='func reverse(s string) string {'
.gpu/trigon run --device cuda --temperature 0 --max-tokens 64 "$p" >"$OUT/run-cuda.txt" 2>"$OUT/run-cuda.err"; echo "rc=$?" | tee -a "$OUT/summary.txt"
.gpu/trigon run --device cpu --temperature 0 --max-tokens 64 "$p" >"$OUT/run-cpu.txt" 2>"$OUT/run-cpu.err"
tail -1 "$OUT/run-cuda.err" | tee -a "$OUT/summary.txt"; tail -1 "$OUT/run-cpu.err" | tee -a "$OUT/summary.txt"
if cmp -s "$OUT/run-cuda.txt" "$OUT/run-cpu.txt"; then echo "cuda and cpu greedy text identical" | tee -a "$OUT/summary.txt"; else echo "cuda and cpu greedy text differ (see run-*.txt)" | tee -a "$OUT/summary.txt"; fi

if .gpu/trigon bench latency --help >/dev/null 2>&1; then
  log "trigon bench latency (default model, cuda)"
  .gpu/trigon bench latency --arch default --batch 4 --input-len 512 --output-len 64 --device cuda 2>&1 | tail -20 | tee -a "$OUT/summary.txt"
fi

}

quick_tests() {
log "backend/cuda: matmul (tuned plans), attention, graph tests"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.run 'TestMatMul|TestAttention|TestGraph|TestAddRMSNorm' >"$OUT/quick-tests.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/quick-tests.log" | tail -6 | tee -a "$OUT/summary.txt"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'MatMulDecode/graph' -test.benchtime 100x >"$OUT/matmul-bench.log" 2>&1)
grep -E "^Benchmark" "$OUT/matmul-bench.log" | awk '{print $1, $3, $4, $5, $6, $7}' | tee -a "$OUT/summary.txt"
}

cuda_tests() {
log "backend/cuda: every test, then memcheck over attention, GEMV, norm, RoPE and matmul"
all_cuda_tests
memcheck 'TestAttention/(decode_gqa4_d128|mixed_gqa4_d128|window_gqa2|prefill_prefix_gqa8_d128|decode_gqa5_d128|decode_only_hint_broken.*|bad_block_id.*)$|TestGEMV/n(3|9)_.*_w8_s4|TestAddRMSNorm|TestSiLUMul|TestRoPEStoreKV|TestMatMul'
}

bench_b4() {
for g in off on; do
  log "bench latency llama-3-8b --batch 4 --input-len 2048 --output-len 64 --cuda-graphs $g"
  .gpu/trigon bench latency --arch llama-3-8b --batch 4 --input-len 2048 --output-len 64 --device cuda --cuda-graphs $g --json \
    >"$OUT/bench-4-$g.json" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
  $PY -c "import json,sys;d=json.load(open(sys.argv[1]));print({k:d.get(k) for k in ['cuda_graphs','itl_ms','prefill_ms','decode_floor_ms','ceiling_share']})" "$OUT/bench-4-$g.json" 2>&1 | tee -a "$OUT/summary.txt"
done
}

# overlap: `trigon bench overlap` (mixed vs serial vs second-stream
# prefill while batch 4 decodes at context 2048) for chunks $CHUNKS.
overlap() {
for c in ${CHUNKS:-512 2048}; do
  log "bench overlap llama-3-8b --batch 4 --context 2048 --prompt-len 2048 --chunk $c --cuda-graphs on"
  .gpu/trigon bench overlap --device cuda --arch llama-3-8b --batch 4 --context 2048 --prompt-len 2048 --chunk $c \
    --cuda-graphs on --iters ${OVERLAP_ITERS:-3} >"$OUT/overlap-$c.txt" 2>>"$OUT/overlap.err"; echo "rc=$?" | tee -a "$OUT/summary.txt"
  cat "$OUT/overlap-$c.txt" | tee -a "$OUT/summary.txt"; tail -3 "$OUT/overlap.err"
done
}

# bench_env "ENV=V ..." LABEL: the batch-4 step (graphs on, output 64) with
# backend knobs set, for A/B comparisons in one call.
bench_env() {
  log "bench latency llama-3-8b --batch 4 --input-len 2048 --output-len 64 --cuda-graphs on, with $1"
  env $1 .gpu/trigon bench latency --arch llama-3-8b --batch 4 --input-len 2048 --output-len 64 --device cuda --cuda-graphs on --json \
    >"$OUT/bench-4-$2.json" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
  $PY -c "import json,sys;d=json.load(open(sys.argv[1]));i=d['itl_ms'];print('ITL p50 %.3f p90 %.3f p99 %.3f ms, queued %s ms, prefill p50 %.1f ms, floor %.3f ms'%(i['p50'],i['p90'],i['p99'],d.get('queued_step_ms'),d['prefill_ms']['p50'],d['decode_floor_ms']))" "$OUT/bench-4-$2.json" 2>&1 | tee -a "$OUT/summary.txt"
}

# add_ab: MatMulAdd (the default NormFuser op) against no fusion,
# alternating three times, then batch 1 and 64 with the defaults.
add_ab() {
for r in 1 2 3; do
  bench_env "TRIGON_CUDA_FUSE_NORM=off" "fuseoff-$r"
  bench_env "TRIGON_CUDA_FUSE_NORM=add" "fuseadd-$r"
done
for bs in 1 64; do
  log "bench latency llama-3-8b --batch $bs --input-len 2048 --output-len 64 --cuda-graphs on"
  .gpu/trigon bench latency --arch llama-3-8b --batch $bs --input-len 2048 --output-len 64 --device cuda --cuda-graphs on --json \
    >"$OUT/bench-$bs.json" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
  $PY -c "import json,sys;d=json.load(open(sys.argv[1]));i=d['itl_ms'];print('ITL p50 %.3f p99 %.3f ms, queued %s ms, floor %.3f ms'%(i['p50'],i['p99'],d.get('queued_step_ms'),d['decode_floor_ms']))" "$OUT/bench-$bs.json" 2>&1 | tee -a "$OUT/summary.txt"
done
}

# margin: the GEMV tuner's margin, default (0.03) against 0.12.
margin() {
bench_env "TRIGON_CUDA_GEMV_MARGIN=0.03" m03
bench_env "TRIGON_CUDA_GEMV_MARGIN=0.12" m12
}

# pdl: programmatic dependent launch on against off (kernels that fill
# the GPU let the next one in after their main loop): tests with PDL on,
# then the batch-4 step twice each way, alternating.
pdl() {
log "PDL on: attention, GEMV and graph tests"
(cd backend/cuda && TRIGON_CUDA_PDL=on "$root/.gpu/cuda.test" -test.v -test.run 'TestAttention|TestGEMV|TestGraph|TestMatMul|TestAddRMSNorm' >"$OUT/pdl-tests.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/pdl-tests.log" | tail -6 | tee -a "$OUT/summary.txt"
for r in 1 2; do
  bench_env "TRIGON_CUDA_PDL=off" pdloff$r
  bench_env "TRIGON_CUDA_PDL=on" pdlon$r
done
}

# tune_prefill: prefill of 4 x 2048 with cuBLASLt's heuristic choice
# (default) against the tuner timing eight algorithms for prefill shapes too.
tune_prefill() {
for r in 64 8192; do
  log "bench latency llama-3-8b --batch 4 --input-len 2048 --output-len 8, TRIGON_CUDA_TUNE_MAX_ROWS=$r"
  TRIGON_CUDA_TUNE_MAX_ROWS=$r .gpu/trigon bench latency --arch llama-3-8b --batch 4 --input-len 2048 --output-len 8 --device cuda \
    --cuda-graphs on --iters 5 --json >"$OUT/bench-tune-$r.json" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
  $PY -c "import json,sys;d=json.load(open(sys.argv[1]));print({k:d.get(k) for k in ['prefill_ms','prefill_gemm_floor_ms','matmul_flops_per_s']})" "$OUT/bench-tune-$r.json" 2>&1 | tee -a "$OUT/summary.txt"
done
}

# prefetch: does prefetching a product's weight into L2 during the norm
# before it shorten the pair? (add_rmsnorm's prefetching blocks)
prefetch() {
log "add_rmsnorm prefetch: tests, then norm+product pairs (graph-timed)"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.run 'TestAddRMSNorm' >"$OUT/prefetch-tests.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/prefetch-tests.log" | tail -4 | tee -a "$OUT/summary.txt"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'PrefetchL2' -test.benchtime 40x >"$OUT/prefetch-bench.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^Benchmark.*-16" "$OUT/prefetch-bench.log" | awk '{print $1, $5, $6, $7, $8}' | tee -a "$OUT/summary.txt"
}

# qkvrope: the QKV projection with RoPE and the KV write in its epilogue
# (qkv_rope_bf16): its tests, memcheck, the model tests on CUDA, the GEMV
# benchmark (the kernel file was refactored) and the step fused vs not.
qkvrope() {
log "fused QKV+RoPE: kernel tests (and GEMV, MatMul, graphs)"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.run 'TestFusedQKVRoPE|TestGEMV|TestMatMul|TestGraph|TestRoPEStoreKV|TestKernels' >"$OUT/qkvrope-tests.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/qkvrope-tests.log" | tail -6 | tee -a "$OUT/summary.txt"
grep -E "^\s+--- FAIL" "$OUT/qkvrope-tests.log" | head -20 | tee -a "$OUT/summary.txt"
memcheck 'TestFusedQKVRoPE$|TestFusedQKVRoPEGraph|TestFusedQKVRoPEDeviceChecks'
log "model on CUDA: fixtures vs transformers, default model vs CPU"
(cd model/llama && "$root/.gpu/llama.test" -test.run 'TestFixturesCUDA|TestDefaultModelCUDAMatchesCPU' -test.v >"$OUT/llama-cuda.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "worst|^(--- FAIL|FAIL|PASS)" "$OUT/llama-cuda.log" | tee -a "$OUT/summary.txt"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'MatMulDecode/graph_(qkv|o|down)_n4' -test.benchtime 50x >"$OUT/gemv-bench.log" 2>&1)
grep -E "^Benchmark.*-16" "$OUT/gemv-bench.log" | awk '{print $1, $5, $6, $7, $8}' | tee -a "$OUT/summary.txt"
for r in 1 2; do
  bench_env "TRIGON_CUDA_FUSE_QKV_ROPE=off" fuseoff$r
  bench_env "TRIGON_CUDA_FUSE_QKV_ROPE=on" fuseon$r
done
}

# fuse_ab: the batch-4 step with the fused QKV+RoPE kernel off and on,
# twice, alternating.
fuse_ab() {
for r in 1 2; do
  bench_env "TRIGON_CUDA_FUSE_QKV_ROPE=off" fuseoff$r
  bench_env "TRIGON_CUDA_FUSE_QKV_ROPE=on" fuseon$r
done
}

# fuse_norm: the NormFuser kernels (norms and SiLU folded into the decode
# GEMVs) against the unfused ops and the CPU, memcheck over them, the
# CUDA model tests, then the batch-4 step with the fusion off and on,
# alternating.
fuse_norm() {
log "NormFuser kernel tests (and the GEMV / fused QKV tests they share code with)"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.run 'TestNormFuse|TestNormQKVRoPE|TestFusedQKVRoPE|TestGEMV|TestKernelsWait' \
  >"$OUT/fuse-tests.log" 2>&1)
local rc=$?
echo "rc=$rc" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic|error:" "$OUT/fuse-tests.log" | head -12 | tee -a "$OUT/summary.txt"
grep -E "^\s+--- FAIL" "$OUT/fuse-tests.log" | head -10 | tee -a "$OUT/summary.txt"
grep -E "relative error" "$OUT/fuse-tests.log" | awk '{print $NF}' | sort -g | tail -1 | sed 's/^/largest relative error logged: /' | tee -a "$OUT/summary.txt"
memcheck 'TestNormFused/k1000_m520_inter264_n(3|9)$|TestNormQKVRoPE/h4_kv4_hd16_k1000_n9$|TestNormFusedGraph'
log "fixture models and the default model on CUDA (llama.test)"
(cd model/llama && "$root/.gpu/llama.test" -test.run 'TestFixturesCUDA|TestDefaultModelCUDAMatchesCPU' -test.v >"$OUT/llama-cuda.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "worst|near tie|^(--- FAIL|FAIL|PASS)" "$OUT/llama-cuda.log" | tee -a "$OUT/summary.txt"
if ((rc != 0)); then log "fused-kernel tests failed: no A/B"; return; fi
log "BenchmarkNormFused (graph-timed, batch 4, Llama-3-8B shapes)"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'NormFused' -test.benchtime 50x >"$OUT/normfused-bench.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^Benchmark" "$OUT/normfused-bench.log" | awk '{print $1, $3, $4, $5, $6}' | tee -a "$OUT/summary.txt"
for r in 1 2; do
  for v in ${NORM_CONFIGS:-off on}; do
    bench_env "TRIGON_CUDA_FUSE_NORM=${v%%:*} TRIGON_CUDA_FUSE_NORM_SCALE=${v##*:}" "norm-${v//[,:]/-}-$r"
  done
done
}

# prefill_chunks: prefill of 4 x 2048 tokens in steps of $CHUNK_SIZES
# tokens (the GEMM floor's probe runs at the same row count), and prefill
# attention's kernel benchmark.
prefill_chunks() {
for c in ${CHUNK_SIZES:-2048 4096 8192}; do
  log "bench latency llama-3-8b --batch 4 --input-len 2048 --output-len 4 --prefill-chunk $c --iters 5"
  .gpu/trigon bench latency --arch llama-3-8b --batch 4 --input-len 2048 --output-len 4 --prefill-chunk $c --iters 5 \
    --device cuda --cuda-graphs on --json >"$OUT/prefill-$c.json" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
  $PY -c "import json,sys;d=json.load(open(sys.argv[1]));print({k:d.get(k) for k in ['prefill_ms','prefill_gemm_floor_ms','matmul_flops_per_s']})" "$OUT/prefill-$c.json" 2>&1 | tee -a "$OUT/summary.txt"
done
log "BenchmarkAttentionPrefill"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'AttentionPrefill' -test.benchtime 20x >"$OUT/attn-prefill-bench.log" 2>&1)
grep -E "^Benchmark" "$OUT/attn-prefill-bench.log" | tee -a "$OUT/summary.txt"
}

# queue_ab: SampleTo / ReadAsync tests, then decode steps queued on the
# device's sampled ids (--queue-ahead, the default) against one at a
# time, alternating, at batch 4 and 1.
queue_ab() {
log "SampleTo, Sample and graph tests"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.run 'TestSampleTo|TestSample$|TestGraph' >"$OUT/sample-tests.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/sample-tests.log" | head -8 | tee -a "$OUT/summary.txt"
for r in 1 2; do
  for bs in 4 1; do
    for q in false true; do
      log "bench latency llama-3-8b --batch $bs --output-len 64 --cuda-graphs on --queue-ahead=$q"
      .gpu/trigon bench latency --arch llama-3-8b --batch $bs --input-len 2048 --output-len 64 --device cuda --cuda-graphs on \
        --queue-ahead=$q --json >"$OUT/bench-$bs-q$q-$r.json" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
      $PY -c "import json,sys;d=json.load(open(sys.argv[1]));i=d['itl_ms'];print('ITL p50 %.3f p90 %.3f p99 %.3f ms, queued %.3f ms, queue_ahead %s'%(i['p50'],i['p90'],i['p99'],d.get('queued_step_ms'),d.get('queue_ahead')))" "$OUT/bench-$bs-q$q-$r.json" 2>&1 | tee -a "$OUT/summary.txt"
    done
  done
done
}

# norm_prefetch: the norms prefetching the next product's weight into L2
# (backend.NormPrefetcher): its test, then the batch-4 step at 0 / 8 / 16
# MiB, alternating.
norm_prefetch() {
log "TestAddRMSNormPrefetch"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.run 'TestAddRMSNorm' >"$OUT/norm-tests.log" 2>&1)
local rc=$?
echo "rc=$rc" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic|differ" "$OUT/norm-tests.log" | head -6 | tee -a "$OUT/summary.txt"
if ((rc != 0)); then return; fi
for r in 1 2; do
  for mb in ${NPF_SIZES:-0 8 16}; do
    log "bench latency llama-3-8b --batch 4 --output-len 128 --cuda-graphs on, TRIGON_CUDA_NORM_PREFETCH_MB=$mb"
    TRIGON_CUDA_NORM_PREFETCH_MB=$mb .gpu/trigon bench latency --arch llama-3-8b --batch 4 --input-len 2048 --output-len 128 \
      --device cuda --cuda-graphs on --json >"$OUT/bench-4-npf$mb-$r.json" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
    $PY -c "import json,sys;d=json.load(open(sys.argv[1]));i=d['itl_ms'];print('ITL p50 %.3f p90 %.3f p99 %.3f ms, floor %.3f'%(i['p50'],i['p90'],i['p99'],d['decode_floor_ms']))" "$OUT/bench-4-npf$mb-$r.json" 2>&1 | tee -a "$OUT/summary.txt"
  done
done
}

# chain_ab RUNS: the batch-4 step (output CHAIN_OUT, default 128, graphs
# on) with chains off then on, RUNS times.
chain_ab() {
for r in $(seq "$1"); do
  for c in off on; do
    log "bench latency llama-3-8b --batch 4 --output-len ${CHAIN_OUT:-128} --cuda-graphs on, TRIGON_CUDA_CHAIN=$c"
    TRIGON_CUDA_CHAIN=$c .gpu/trigon bench latency --arch llama-3-8b --batch 4 --input-len 2048 --output-len ${CHAIN_OUT:-128} \
      --device cuda --cuda-graphs on --json >"$OUT/bench-4-chain-$c-$r.json" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
    $PY -c "import json,sys;d=json.load(open(sys.argv[1]));i=d['itl_ms'];print('ITL p50 %.3f p90 %.3f p99 %.3f ms, floor %.3f, prefill %.1f'%(i['p50'],i['p90'],i['p99'],d['decode_floor_ms'],d['prefill_ms']['p50']))" "$OUT/bench-4-chain-$c-$r.json" 2>&1 | tee -a "$OUT/summary.txt"
  done
done
}

# prefill_ab RUNS: the batch-4 bench (2048-token prompts, output 128,
# graphs on) for each of AB_VARIANTS (default: trigon-base, a build of the
# commit before a change when the archive holds one, then trigon), each
# BINARY or BINARY:VAR=VALUE (one environment setting), alternating, RUNS
# times.
prefill_ab() {
for r in $(seq "$1"); do
  for v in ${AB_VARIANTS:-trigon-base trigon}; do
    bin=${v%%:*}; env=; [[ $v == *:* ]] && env=${v#*:}
    [ -x ".gpu/$bin" ] || continue
    log "bench latency llama-3-8b --batch 4 --output-len 128 --cuda-graphs on ($bin $env)"
    env $env ".gpu/$bin" bench latency --arch llama-3-8b --batch 4 --input-len 2048 --output-len 128 \
      --device cuda --cuda-graphs on --json >"$OUT/bench-4-$r-${v//[:=]/_}.json" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
    $PY -c "import json,sys;d=json.load(open(sys.argv[1]));i=d['itl_ms'];p=d['prefill_ms']['p50'];f=d['prefill_gemm_floor_ms'];fs=d.get('prefill_gemm_floor_sustained_ms') or 0;print('prefill %.1f ms (GEMM floor %.1f: %.3fx; sustained %.1f: %.3fx), ITL p50 %.3f p99 %.3f ms, floor %.3f'%(p,f,p/f,fs,p/fs if fs else 0,i['p50'],i['p99'],d['decode_floor_ms']))" "$OUT/bench-4-$r-${v//[:=]/_}.json" 2>&1 | tee -a "$OUT/summary.txt"
  done
done
}

# prefill_tile: prefill attention's tiling (TRIGON_CUDA_PREFILL_TILE) for
# each of TILES: the attention tests under it, then
# BenchmarkAttentionPrefill (graph-timed TFLOP/s).
prefill_tile() {
for tl in ${TILES:-128:64:8 128:32:8 64:64:4 64:32:4 128:128:8 32:32:2}; do
  log "TRIGON_CUDA_PREFILL_TILE=$tl: TestAttention, BenchmarkAttentionPrefill"
  (cd backend/cuda && TRIGON_CUDA_PREFILL_TILE=$tl "$root/.gpu/cuda.test" -test.run 'TestAttention' -test.timeout 3m >"$OUT/tile-$tl-tests.log" 2>&1)
  echo "tests rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL)|relative error [0-9.e-]+ >" "$OUT/tile-$tl-tests.log" | head -5 | tee -a "$OUT/summary.txt"
  (cd backend/cuda && TRIGON_CUDA_PREFILL_TILE=$tl "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'BenchmarkAttentionPrefill' -test.benchtime 20x >"$OUT/tile-$tl-bench.log" 2>&1)
  grep -E "Benchmark.*TFLOP|rror" "$OUT/tile-$tl-bench.log" | tee -a "$OUT/summary.txt"
done
}

# prefill_small: the bandwidth kernels of prefill (silu_mul_v8, the norm's
# 16-byte path for F32 weights): every backend/cuda test, the CUDA model
# tests, the batch-4 bench against the base build, then ncu's kernel times.
prefill_small() {
log "backend/cuda: every test"
all_cuda_tests
model_tests
prefill_ab 2
profile
}

# cluster_final: every backend/cuda test (TestAttentionCluster among them),
# the CUDA model tests, decode attention graph-timed with its splits merged
# by attn_decode_combine and inside clusters (TRIGON_CUDA_ATTN_CLUSTER),
# the batch-4 bench alternating the two (and once the previous build,
# .gpu/trigon-prev), then ncu's kernel times.
cluster_final() {
log "backend/cuda: every test"
all_cuda_tests
model_tests
for c in off on; do
  log "BenchmarkAttentionDecode b4 ctx 2048, TRIGON_CUDA_ATTN_CLUSTER=$c"
  (cd backend/cuda && TRIGON_CUDA_ATTN_CLUSTER=$c "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'BenchmarkAttentionDecode/b4_ctx2048_h32_kv8_d128_stages3$' -test.benchtime 200x >"$OUT/attn-cl-$c.log" 2>&1)
  grep -E "Benchmark.*op|rror" "$OUT/attn-cl-$c.log" | tee -a "$OUT/summary.txt"
done
AB_VARIANTS="trigon:TRIGON_CUDA_ATTN_CLUSTER=off trigon:TRIGON_CUDA_ATTN_CLUSTER=on trigon-prev trigon:TRIGON_CUDA_ATTN_CLUSTER=off trigon:TRIGON_CUDA_ATTN_CLUSTER=on" prefill_ab 1
profile
}

# step_trace [ENV=V ...]: the batch-4 step (graphs on, output 128) with
# --step-trace: ITL against the device-timed step, and where the slow
# steps fall (tools/gpu/step_trace.py).
step_trace() {
  local tag=${1:-default}
  tag=${tag:-default}
  log "bench latency ${ARCH:-llama-3-8b} --batch 4 --input-len 2048 --output-len 128 --cuda-graphs on --step-trace ($tag)"
  local f="$OUT/trace-${SECONDS}-${tag//[^A-Za-z0-9]/_}.json"
  env ${1:-} .gpu/${BIN:-trigon} bench latency --arch ${ARCH:-llama-3-8b} --batch 4 --input-len 2048 --output-len 128 --device cuda --cuda-graphs on \
    --step-trace --json >"$f" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
  $PY tools/gpu/step_trace.py "$f" 2>&1 | tee -a "$OUT/summary.txt"
}

# cluster_fit: the refactored decode merges (attention tests, cluster
# byte-identity, the occupancy query), the cluster benchmark, the step
# trace, and PDL on against off.
cluster_fit() {
log "TestAttention*, TestClusterFit, TestDecodePlan, TestKernelsWait*"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.run 'TestAttention|TestClusterFit|TestDecodePlan|TestKernelsWait' >"$OUT/attn-tests.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic|resident" "$OUT/attn-tests.log" | tail -8 | tee -a "$OUT/summary.txt"
grep -c -- "--- PASS" "$OUT/attn-tests.log" | sed 's/^/passed: /' | tee -a "$OUT/summary.txt"
grep -c -- "--- SKIP" "$OUT/attn-tests.log" | sed 's/^/skipped: /' | tee -a "$OUT/summary.txt"
log "BenchmarkAttentionDecodeCluster"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'BenchmarkAttentionDecodeCluster' -test.benchtime 100x -test.v >"$OUT/attn-cluster.log" 2>&1)
grep -E "^Benchmark|resident|rror" "$OUT/attn-cluster.log" | awk '{$2=""; print}' | tee -a "$OUT/summary.txt"
step_trace
step_trace TRIGON_CUDA_PDL=on
step_trace TRIGON_CUDA_ATTN_CLUSTER=on
step_trace
step_trace TRIGON_CUDA_PDL=on
}

# pdl_some: programmatic dependent launch for chosen kernels only
# (TRIGON_CUDA_PDL=name,...): tests with every listed kernel on, then the
# batch-4 step traced per subset, the default first and last.
pdl_some() {
local all=attn_decode_combine,gemv_add_bf16,qkv_rope_bf16,attn_decode_mma,add_rmsnorm,silu_mul,silu_mul_v8
log "PDL for $all: attention, GEMV, QKV+RoPE, norm and graph tests"
(cd backend/cuda && TRIGON_CUDA_PDL=$all "$root/.gpu/cuda.test" -test.v -test.run 'TestAttention|TestGEMV|TestGraph|TestQKVRoPE|TestNormFused|TestMatMulAdd|TestAddRMSNorm|TestSiLUMul' >"$OUT/pdl-tests.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/pdl-tests.log" | tail -6 | tee -a "$OUT/summary.txt"
grep -c -- "--- PASS" "$OUT/pdl-tests.log" | sed 's/^/passed: /' | tee -a "$OUT/summary.txt"
for v in ${PDL_SETS:-default attn_decode_combine attn_decode_combine,gemv_add_bf16 qkv_rope_bf16 attn_decode_mma add_rmsnorm,silu_mul,silu_mul_v8 default}; do
  if [[ $v == default ]]; then step_trace; else step_trace "TRIGON_CUDA_PDL=$v"; fi
done
}

# attn_pdl: decode attention's prologue before its wait. Tests without
# PDL and with PDL on QKV, attention and combine (the model tests too: a
# stale newest K/V row would show in the logits), the graph-timed
# attention, then the batch-4 step traced, alternating.
attn_pdl() {
local set=qkv_rope_bf16,attn_decode_mma,attn_decode_combine
log "TestAttention, TestGraph, TestQKVRoPE, TestKernelsWait (no PDL)"
(cd backend/cuda && TRIGON_CUDA_PDL=off "$root/.gpu/cuda.test" -test.v -test.run 'TestAttention|TestGraph|TestQKVRoPE|TestKernelsWait' >"$OUT/attn-tests.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/attn-tests.log" | tail -4 | tee -a "$OUT/summary.txt"
grep -c -- "--- PASS" "$OUT/attn-tests.log" | sed 's/^/passed: /' | tee -a "$OUT/summary.txt"
log "the same with TRIGON_CUDA_PDL=$set"
(cd backend/cuda && TRIGON_CUDA_PDL=$set "$root/.gpu/cuda.test" -test.v -test.run 'TestAttention|TestGraph|TestQKVRoPE|TestKernelsWait' >"$OUT/attn-tests-pdl.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/attn-tests-pdl.log" | tail -4 | tee -a "$OUT/summary.txt"
grep -c -- "--- PASS" "$OUT/attn-tests-pdl.log" | sed 's/^/passed: /' | tee -a "$OUT/summary.txt"
log "model tests on CUDA, TRIGON_CUDA_PDL=$set"
(cd model/llama && TRIGON_CUDA_PDL=$set "$root/.gpu/llama.test" -test.run 'TestFixturesCUDA|TestDefaultModelCUDAMatchesCPU' -test.v >"$OUT/llama-cuda-pdl.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "worst|^(--- FAIL|FAIL|PASS)" "$OUT/llama-cuda-pdl.log" | tee -a "$OUT/summary.txt"
for v in off attn_decode_combine,attn_decode_mma; do
  log "BenchmarkAttentionDecode b4 ctx2048 stages3, TRIGON_CUDA_PDL=$v"
  (cd backend/cuda && TRIGON_CUDA_PDL=$v "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'BenchmarkAttentionDecode/b4_ctx2048_h32_kv8_d128_stages3$' -test.benchtime 300x >"$OUT/attn-b-$v.log" 2>&1)
  grep -E "Benchmark.*op|rror" "$OUT/attn-b-$v.log" | awk '{$2=""; print}' | tee -a "$OUT/summary.txt"
done
for v in ${PDL_SETS:-off attn_decode_mma,attn_decode_combine $set off attn_decode_mma,attn_decode_combine $set}; do
  step_trace "TRIGON_CUDA_PDL=$v"
done
}

# chain: the chained layer products (kernels/chain.cu): their tests, the
# graph-timed layer boundary, the model's CUDA tests, then the batch-4
# step with and without chains, alternating.
chain() {
log "TestChain*, TestKernelsCompile/chain, TestKernelsWait*"
(cd backend/cuda && TRIGON_CUDA_CHAIN=on "$root/.gpu/cuda.test" -test.v -test.timeout 4m -test.run 'TestChain|TestKernelsCompile/chain|TestKernelsWait' >"$OUT/chain-tests.log" 2>&1)
local rc=$?
echo "rc=$rc" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic|relative error|differ|Chain|timeout" "$OUT/chain-tests.log" | head -40 | tee -a "$OUT/summary.txt"
if ((rc != 0)); then return; fi
log "BenchmarkChainLayer"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'BenchmarkChainLayer' -test.benchtime 200x >"$OUT/chain-bench.log" 2>&1)
grep -E "Benchmark|rror" "$OUT/chain-bench.log" | tee -a "$OUT/summary.txt"
log "model tests on CUDA (chains on)"
(cd model/llama && TRIGON_CUDA_CHAIN=on "$root/.gpu/llama.test" -test.run 'TestFixturesCUDA|TestDefaultModelCUDAMatchesCPU' -test.v >"$OUT/llama-cuda.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "worst|^(--- FAIL|FAIL|PASS)" "$OUT/llama-cuda.log" | head -20 | tee -a "$OUT/summary.txt"
chain_ab 2
}

# chain_ops: BenchmarkChainOps (each product alone, separate and chained)
# and BenchmarkChainLayer for CHAIN_VARIANTS, each KC:STAGE_KB:NC:NOMATH
# (ring tile columns, the largest ADD input staged in shared memory,
# consumer warps, consumers that do not multiply).
chain_ops() {
for v in ${CHAIN_VARIANTS:-1024:72:16:0 1024:72:16:1}; do
  IFS=: read -r kc kb nc nm <<<"$v"
  log "BenchmarkChainOps KC=$kc STAGE_KB=$kb NC=$nc NOMATH=$nm"
  (cd backend/cuda && TRIGON_CUDA_CHAIN=on TRIGON_CUDA_CHAIN_KC=$kc TRIGON_CUDA_CHAIN_STAGE_KB=$kb \
    TRIGON_CUDA_CHAIN_NC=$nc TRIGON_CUDA_CHAIN_NOMATH=${nm:-0} "$root/.gpu/cuda.test" -test.run '^$' \
    -test.bench "${CHAIN_BENCH:-BenchmarkChainOps|BenchmarkChainLayer}" -test.benchtime 50x >"$OUT/chain-ops-$kc-$kb-$nc-$nm.log" 2>&1)
  grep -E "^Benchmark|rror|panic" "$OUT/chain-ops-$kc-$kb-$nc-$nm.log" | sed -E 's/ +/ /g' | tee -a "$OUT/summary.txt"
done
}

# chain_final: memcheck over a chain launch and its graph replay, the CUDA
# model tests with chains on, the batch-4 step with chains off and on, and
# the chain stream alone (NOMATH) for the ADD ops with nothing staged (one
# ring tile more).
chain_final() {
log "memcheck TestChainGraph"
memcheck 'TestChainGraph'
log "model tests on CUDA, TRIGON_CUDA_CHAIN=on"
(cd model/llama && TRIGON_CUDA_CHAIN=on "$root/.gpu/llama.test" -test.run 'TestFixturesCUDA|TestDefaultModelCUDAMatchesCPU' -test.v >"$OUT/llama-cuda-chain.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "worst|^(--- FAIL|FAIL|PASS)" "$OUT/llama-cuda-chain.log" | tee -a "$OUT/summary.txt"
chain_ab 1
log "BenchmarkChainOps o and down, NOMATH=1, nothing staged (STAGE_KB=0) and staged (72)"
for kb in 0 72; do
  (cd backend/cuda && TRIGON_CUDA_CHAIN_NOMATH=1 TRIGON_CUDA_CHAIN_STAGE_KB=$kb "$root/.gpu/cuda.test" -test.run '^$' \
    -test.bench 'BenchmarkChainOps/(o|down)_chain' -test.benchtime 50x >"$OUT/chain-nomath-$kb.log" 2>&1)
  grep -E "^Benchmark|rror|panic" "$OUT/chain-nomath-$kb.log" | sed -E 's/ +/ /g;s/^/STAGE_KB='$kb' /' | tee -a "$OUT/summary.txt"
done
}

# tests_only: every backend/cuda test and the CUDA model tests with
# chains off and on (after a kernel refactor).
tests_only() {
log "backend/cuda: every test"
all_cuda_tests
for c in off on; do
  log "model tests on CUDA, TRIGON_CUDA_CHAIN=$c"
  (cd model/llama && TRIGON_CUDA_CHAIN=$c "$root/.gpu/llama.test" -test.run 'TestFixturesCUDA|TestDefaultModelCUDAMatchesCPU' -test.v >"$OUT/llama-cuda-chain-$c.log" 2>&1)
  echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "worst|^(--- FAIL|FAIL|PASS)" "$OUT/llama-cuda-chain-$c.log" | tee -a "$OUT/summary.txt"
done
}

# chain_verify: every backend/cuda test, memcheck over the chain tests,
# the CUDA model tests with chains off (the default) and on, and the
# batch-4 step with chains off and on, alternating.
chain_verify() {
log "backend/cuda: every test"
all_cuda_tests
memcheck 'TestChainGraph|TestChain/h8_kv2_hd64_hidden512_inter1376_n3'
for c in off on; do
  log "model tests on CUDA, TRIGON_CUDA_CHAIN=$c"
  (cd model/llama && TRIGON_CUDA_CHAIN=$c "$root/.gpu/llama.test" -test.run 'TestFixturesCUDA|TestDefaultModelCUDAMatchesCPU' -test.v >"$OUT/llama-cuda-chain-$c.log" 2>&1)
  echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "worst|^(--- FAIL|FAIL|PASS)" "$OUT/llama-cuda-chain-$c.log" | tee -a "$OUT/summary.txt"
done
chain_ab 2
}

# fill_check: synthetic weights made on the device (FillNormal) against
# the CPU's bytes, then the batch-4 step with weights made on the device
# and uploaded from the host (same bytes: same tokens, same times).
fill_check() {
log "FillNormal on the device vs the CPU"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.run 'TestFillNormal' >"$OUT/fill-tests.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- |FAIL|PASS|ok)|differ|panic" "$OUT/fill-tests.log" | tail -8 | tee -a "$OUT/summary.txt"
for d in true false; do
  log "bench latency llama-3-8b --batch 4 --output-len 16 --weights-on-device=$d"
  /usr/bin/time -f "wall %e s, max rss %M KB" .gpu/trigon bench latency --device cuda --arch llama-3-8b --batch 4 --input-len 2048 \
    --output-len 16 --warmup 0 --iters 1 --cuda-graphs on --weights-on-device=$d 2>&1 | grep -E "prefill|ITL|wall|rror" | tee -a "$OUT/summary.txt"
done
}

# splits: decode attention at forced split counts (graph-timed).
splits() {
log "decode attention split counts (splits0 = the planner's pick)"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'AttentionDecodeSplits' -test.benchtime 50x >"$OUT/splits-bench.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^Benchmark.*-16" "$OUT/splits-bench.log" | awk '{print $1, $5, $6, $7, $8}' | tee -a "$OUT/summary.txt"
}

bigref() {
log "Llama-3-8B-shaped model: transformers reference"
if [[ -f /tmp/bigref/.complete ]]; then
  echo "reusing /tmp/bigref (this machine made it earlier)" | tee -a "$OUT/summary.txt"
else
  rm -rf /tmp/bigref
  PYTHONUNBUFFERED=1 $PY tools/bigref/bigref.py /tmp/bigref 2>&1 | tee "$OUT/bigref-py.log" | tail -8 | tee -a "$OUT/summary.txt"
  [[ ${PIPESTATUS[0]} == 0 ]] && touch /tmp/bigref/.complete
fi
log "Llama-3-8B-shaped model: trigon on CUDA vs transformers"
(cd model/llama && TRIGON_BIGREF=/tmp/bigref TRIGON_BIGREF_OUT="$OUT/bigref.json" "$root/.gpu/llama.test" -test.run 'TestBigRef' -test.v -test.timeout 8m >"$OUT/bigref-go.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "loaded|short|batch [0-9]|near tie|FAIL|PASS|Error|error" "$OUT/bigref-go.log" | head -30 | tee -a "$OUT/summary.txt"
if .gpu/trigon bench latency --help >/dev/null 2>&1; then
  log "trigon bench latency llama-3-8b batch 4 ctx 2048"
  .gpu/trigon bench latency --arch llama-3-8b --batch 4 --input-len 2048 --output-len 64 --device cuda --json >"$OUT/bench-8b.json" 2>"$OUT/bench-8b.err"; tail -3 "$OUT/bench-8b.err" | tee -a "$OUT/summary.txt"; head -c 2000 "$OUT/bench-8b.json" | tee -a "$OUT/summary.txt"
fi
}

serve_smoke() {
log "trigon serve --device cuda: completion, chat, metrics, SIGTERM drain"
.gpu/trigon serve --device cuda --port 8011 >"$OUT/serve.log" 2>&1 &
pid=$!
for i in $(seq 100); do curl -sf localhost:8011/health >/dev/null && break; sleep 0.2; done
curl -s localhost:8011/v1/completions -H 'Content-Type: application/json' \
  -d '{"prompt":"func reverse(s string) string {","max_tokens":32,"temperature":0}' | tee -a "$OUT/summary.txt"; echo | tee -a "$OUT/summary.txt"
curl -sN localhost:8011/v1/completions -H 'Content-Type: application/json' \
  -d '{"prompt":"package main","max_tokens":8,"stream":true,"seed":3}' | tail -3 | tee -a "$OUT/summary.txt"
curl -s localhost:8011/metrics | grep -E '^trigon_(generation_tokens_total|prompt_tokens_total|kv_cache_usage_ratio)' | tee -a "$OUT/summary.txt"
kill -TERM $pid; wait $pid; echo "serve exit=$?" | tee -a "$OUT/summary.txt"
}

bench_rows() {
for n in ${BATCHES:-1 4 64}; do
  log "bench latency llama-3-8b --batch $n --input-len 2048 --output-len 64 --cuda-graphs both"
  .gpu/trigon bench latency --arch llama-3-8b --batch $n --input-len 2048 --output-len 64 --device cuda --cuda-graphs both --json \
    >"$OUT/bench-$n.json" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
  $PY -c "import json,sys
for d in json.load(open(sys.argv[1])): print({k:d.get(k) for k in ['batch','cuda_graphs','itl_ms','prefill_ms','decode_floor_ms','ceiling_share','copy_ceiling_bytes_per_s','prefill_gemm_floor_ms','prefill_gemm_floor_sustained_ms']})" "$OUT/bench-$n.json" 2>&1 | tee -a "$OUT/summary.txt"
done
}

graphs() {
log "graph capture: kernel tests, and run/serve with --cuda-graphs on vs off"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run 'TestGraph' -test.v >"$OUT/graph-tests.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- |FAIL|PASS|ok)" "$OUT/graph-tests.log" | tail -5 | tee -a "$OUT/summary.txt"
p='func reverse(s string) string {'
.gpu/trigon run --device cuda --cuda-graphs on --temperature 0 --max-tokens 64 "$p" >"$OUT/run-graphs.txt" 2>"$OUT/run-graphs.err"; echo "rc=$?" | tee -a "$OUT/summary.txt"
.gpu/trigon run --device cuda --cuda-graphs off --temperature 0 --max-tokens 64 "$p" >"$OUT/run-nographs.txt" 2>"$OUT/run-nographs.err"
if cmp -s "$OUT/run-graphs.txt" "$OUT/run-nographs.txt"; then echo "graphs on/off greedy text identical" | tee -a "$OUT/summary.txt"; else echo "graphs on/off greedy text differ" | tee -a "$OUT/summary.txt"; fi
tail -1 "$OUT/run-graphs.err" | tee -a "$OUT/summary.txt"
}

# train_start / train_wait: tools/train-default-model/device.sh in the
# background (carry .gpu/train-default-model too), beside parts that only
# check correctness; train_wait before anything that times. Its result
# parts (result.tar.part-*) come back as they are; its logs go in logs.tgz.
train_start() {
log "default model: training in the background (${TRAIN_ARGS:---max-steps 3000})"
bash tools/train-default-model/device.sh ${TRAIN_ARGS:---max-steps 3000} >"$OUT/train-device.log" 2>&1 &
train_pid=$!
}
train_wait() {
wait "$train_pid"; echo "train rc=$?" | tee -a "$OUT/summary.txt"
grep -E "trained|calibrated|first step|heldout|held-out loss|export|ppl|best" "$OUT/train-device.log" | tail -12 | tee -a "$OUT/summary.txt"
}

# profile: kernel times (ncu, one pass of gpu__time_duration) of one
# prefill and two decode steps at batch 4, context 2048, summarised by
# tools/gpu/ncu_summary.py.
profile() {
log "ncu: llama-3-8b batch 4, 2048-token prompts, prefill + 2 decode steps, graphs off"
ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --page raw --print-units base \
  .gpu/trigon bench latency --arch llama-3-8b --batch 4 --input-len 2048 --output-len 8 --warmup 0 --iters 1 \
  --device cuda --profile-steps 2 >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
echo "rc=$?" | tee -a "$OUT/summary.txt"
$PY tools/gpu/ncu_summary.py "$OUT/ncu.csv" 2>&1 | tee -a "$OUT/summary.txt"
}

attn_bench() {
log "kernel benchmarks (graph-timed): decode and prefill attention, decode GEMMs (cuBLASLt vs the tuner's choice)"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'AttentionDecode|AttentionPrefill|MatMulDecode/graph' -test.benchtime 50x -test.v >"$OUT/attn-bench.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^Benchmark" "$OUT/attn-bench.log" | awk '{print $1, $3, $4, $5, $6, $7}' | tee -a "$OUT/summary.txt"
}

# attn_check: the attention kernels' tests, memcheck and benchmarks.
attn_check() {
log "attention tests + memcheck"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.run 'TestAttention|TestGraph|TestDecodePlan|TestPrefillTiling' >"$OUT/attn-tests.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/attn-tests.log" | tail -6 | tee -a "$OUT/summary.txt"
memcheck 'TestAttention/(decode_gqa4_d128|mixed_gqa4_d128|window_gqa2|prefill_prefix_gqa8_d128|prefill_gqa8_d256|decode_bs8_gqa4_d128|decode_only_hint_broken.*|bad_block_id.*)$'
attn_bench
}

# default_model: the embedded model on CUDA and CPU, greedy: the texts must match.
default_model() {
log "default model: trigon run, cuda vs cpu, greedy, and with default sampling"
p='func reverse(s string) string {'
.gpu/trigon run --device cuda --temperature 0 --max-tokens 64 "$p" >"$OUT/dm-cuda.txt" 2>"$OUT/dm-cuda.err"; echo "rc=$?" | tee -a "$OUT/summary.txt"
.gpu/trigon run --device cpu --temperature 0 --max-tokens 64 "$p" >"$OUT/dm-cpu.txt" 2>"$OUT/dm-cpu.err"
if cmp -s "$OUT/dm-cuda.txt" "$OUT/dm-cpu.txt"; then echo "cuda and cpu greedy text identical" | tee -a "$OUT/summary.txt"; else echo "cuda and cpu greedy text differ" | tee -a "$OUT/summary.txt"; fi
tail -1 "$OUT/dm-cuda.err" | tee -a "$OUT/summary.txt"; tail -1 "$OUT/dm-cpu.err" | tee -a "$OUT/summary.txt"
.gpu/trigon run --device cuda --max-tokens 96 --seed 1 "$p" 2>/dev/null | tee -a "$OUT/summary.txt"
}

# peers: trigon against the PyTorch peers on ARCH (default llama-3-8b),
# batch 4, 2048-token prompts, 128 output tokens, after the gpt-fast
# model's self-test.
peers() {
log "peers, same shapes, same call: trigon graphs off/on, gpt-fast style, HF eager and static+compile (${ARCH:-llama-3-8b})"
$PY bench/peers/selftest.py --device cuda 2>&1 | tail -2 | tee -a "$OUT/summary.txt"
a="--arch ${ARCH:-llama-3-8b} --batch 4 --input-len 2048 --output-len 128"
.gpu/trigon bench latency --device cuda $a --cuda-graphs both --json >"$OUT/trigon.json" 2>>"$OUT/peers.err"; echo "trigon rc=$?" | tee -a "$OUT/summary.txt"
PYTHONUNBUFFERED=1 timeout ${GPTFAST_TIMEOUT:-300} $PY bench/peers/gptfast_peer.py $a >"$OUT/gptfast.jsonl" 2>>"$OUT/peers.err"; echo "gptfast rc=$?" | tee -a "$OUT/summary.txt"
PYTHONUNBUFFERED=1 timeout ${HF_TIMEOUT:-240} $PY bench/peers/hf_peer.py $a >"$OUT/hf.jsonl" 2>>"$OUT/peers.err"; echo "hf rc=$?" | tee -a "$OUT/summary.txt"
$PY bench/peers/compare.py --markdown "$OUT/trigon.json" "$OUT/gptfast.jsonl" "$OUT/hf.jsonl" 2>&1 | tee -a "$OUT/summary.txt"
$PY -c "import json,sys
for d in json.load(open(sys.argv[1])):
  p,i=d['prefill_ms']['p50'],d['itl_ms'];f,fs=d['prefill_gemm_floor_ms'],d.get('prefill_gemm_floor_sustained_ms') or float('nan')
  fa=d.get('decode_floor_all_weights_ms') or float('nan')
  print('trigon graphs %s: prefill %.1f ms = %.3fx the GEMM floor %.1f (burst), %.3fx the sustained %.1f; ITL p50 %.3f p99 %.3f = %.3fx / %.3fx the decode floor %.3f, %.3fx / %.3fx the all-weights floor %.3f'%(d['cuda_graphs'],p,p/f,f,p/fs,fs,i['p50'],i['p99'],i['p50']/d['decode_floor_ms'],i['p99']/d['decode_floor_ms'],d['decode_floor_ms'],i['p50']/fa,i['p99']/fa,fa))" "$OUT/trigon.json" 2>&1 | tee -a "$OUT/summary.txt"
}

# final: correctness of the build that is measured (every backend/cuda
# test, the fixture models against transformers, the default model GPU
# against CPU), stopping there on a failure; then the peers in one call,
# the batch 1 and 64 rows, and the server smoke test.
final() {
log "backend/cuda: every test"
all_cuda_tests; rc=$?
memcheck 'TestAddRMSNorm|TestRoPEStoreKV|TestMatMulAddPrefill/n17|TestAttention/(decode_gqa4_d128|mixed_gqa4_d128|decode_bs8_gqa4_d128|prefill_prefix_gqa8_d128)$|TestAttentionPrefillWG/prefill_bs8_gqa4_d128_wg_on$'
log "fixture models and the default model on CUDA (llama.test)"
(cd model/llama && "$root/.gpu/llama.test" -test.run 'TestFixturesCUDA|TestDefaultModelCUDAMatchesCPU' -test.v >"$OUT/llama-cuda.log" 2>&1)
rc2=$?; echo "rc=$rc2" | tee -a "$OUT/summary.txt"; grep -E "worst|near tie|^(--- FAIL|FAIL|PASS)" "$OUT/llama-cuda.log" | tee -a "$OUT/summary.txt"
if ((rc != 0 || rc2 != 0)); then log "tests failed: skipping the measurements"; return; fi
default_model
peers
BATCHES="1 64" bench_rows
serve_smoke
}

# verify_final: every backend/cuda test and the CUDA model tests on the
# build, then the batch-4 step traced with the default ring depth and
# with two stages, alternating.
verify_final() {
log "backend/cuda: every test"
all_cuda_tests
model_tests
for v in "" TRIGON_CUDA_DECODE_STAGES=2 "" TRIGON_CUDA_DECODE_STAGES=2; do step_trace "$v"; done
}

# spin_ab: the read-back waits polling (callSpin) against the previous
# build (trigon-prev) sleeping on a channel: the sampling tests, the CUDA
# model tests, then the batch-4 step traced, alternating.
spin_ab() {
log "TestSample, TestReadAsync, TestGraph, TestDeviceChecks"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.run 'TestSample|TestReadAsync|TestGraph|TestDeviceChecks|TestReadReports' >"$OUT/spin-tests.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/spin-tests.log" | tail -4 | tee -a "$OUT/summary.txt"
grep -c -- "--- PASS" "$OUT/spin-tests.log" | sed 's/^/passed: /' | tee -a "$OUT/summary.txt"
model_tests
for b in trigon trigon-prev trigon trigon-prev; do log "binary $b"; BIN=$b step_trace; done
}

# pdl_final: the batch-4 step traced with the default PDL set and with
# PDL off, alternating.
pdl_final() {
for v in "" TRIGON_CUDA_PDL=off "" TRIGON_CUDA_PDL=off; do step_trace "$v"; done
}

# bulk: the bulk-copy GEMV (kernels/gemv_bulk.cu): its tests (PDL as
# default, then on for every kernel), the products it touches, the CUDA
# model tests, the tuner's choices, and the batch-4 step with it off, tuned
# and always, and with the bulk kernels added to the PDL set, alternating.
bulk() {
log "TestGEMVBulk*, TestGateUpSiLU, TestGEMV, TestNormFused, TestMatMul, TestGraph, TestKernelsWait"
cuda_tests_run bulk-tests.log 'TestGEMVBulk|TestGateUpSiLU|TestGEMV|TestNormFused|TestMatMul|TestGraph|TestKernelsWait'
log "the same bulk tests with PDL on every kernel"
cuda_tests_run bulk-tests-pdl.log 'TestGEMVBulk|TestGateUpSiLU' TRIGON_CUDA_PDL=on
model_tests
local pdl=qkv_rope_bf16,attn_decode_mma,attn_decode_combine,gemvb_bf16,gemvb_add_bf16,gemvb_silu_bf16
for v in TRIGON_CUDA_GEMV_BULK=off "" TRIGON_CUDA_GEMV_BULK=always TRIGON_CUDA_PDL=$pdl TRIGON_CUDA_GEMV_BULK=off "" TRIGON_CUDA_GEMV_BULK=always TRIGON_CUDA_PDL=$pdl; do
  step_trace "$v"
done
for f in "$OUT"/trace-*.json; do $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d if isinstance(d,dict) else d[0]; print(sys.argv[1].split("/")[-1]); [print("  ",c) for c in r.get("kernel_choices") or []]' "$f"; done | tee -a "$OUT/summary.txt"
}

# bulk_bench: BenchmarkGEMVBulk (graph-timed products and the layer's run
# of them) with the default PDL set and with the bulk kernels added to it,
# then the batch-4 step: bulk off, the default, and the default with the
# bulk kernels under PDL, alternating three times.
bulk_bench() {
local pdl=qkv_rope_bf16,attn_decode_mma,attn_decode_combine,gemvb_bf16,gemvb_add_bf16,gemvb_silu_bf16
for v in "" TRIGON_CUDA_PDL=$pdl; do
  log "BenchmarkGEMVBulk ${v:-default PDL}"
  (cd backend/cuda && env $v "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'BenchmarkGEMVBulk' -test.benchtime 200x -test.v >"$OUT/bulk-bench.log" 2>&1)
  grep -E "^Benchmark|rror|gemm|\]\^T" "$OUT/bulk-bench.log" | awk '{$2=""; print}' | tee -a "$OUT/summary.txt"
done
for r in 1 2 3; do
  for v in TRIGON_CUDA_GEMV_BULK=off "" TRIGON_CUDA_PDL=$pdl; do step_trace "$v"; done
done
}

# bulk_ab: the bulk GEMV on by default (bulkPick's variants for the
# residual adds and GateUpSiLU, PDL on them): its tests, the products it
# touches, the CUDA model tests, the graph-timed products, then the
# batch-4 step with it off and on, alternating four times.
bulk_ab() {
log "TestGEMVBulk*, TestGateUpSiLU, TestGEMV, TestNormFused, TestMatMul, TestGraph, TestKernelsWait, TestPDLEnv"
cuda_tests_run bulk-tests.log 'TestGEMVBulk|TestGateUpSiLU|TestGEMV|TestNormFused|TestMatMul|TestGraph|TestKernelsWait|TestPDLEnv'
model_tests
log "BenchmarkGEMVBulk"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'BenchmarkGEMVBulk' -test.benchtime 200x >"$OUT/bulk-bench.log" 2>&1)
grep -E "us/op|FAIL|rror" "$OUT/bulk-bench.log" | awk '{print $1, $(NF-1), "us"}' | tee -a "$OUT/summary.txt"
for r in 1 2 3 4; do
  for v in TRIGON_CUDA_GEMV_BULK=off ""; do step_trace "$v"; done
done
}

# verify_bulk: the bulk GEMV on by default: every backend/cuda test,
# memcheck over the bulk kernels, and the Llama-3-8B-shaped model against
# transformers (the fixture models are too small for the bulk kernels'
# k multiples; this one runs them in every decode step).
verify_bulk() {
log "backend/cuda: every test"
all_cuda_tests
log "memcheck: bulk GEMV, its add and SiLU kernels"
memcheck 'TestGEMVBulk/n(1|9)_.*_w8_c1024_s2|TestGEMVBulkAdd/n(1|9)_|TestGateUpSiLU/n9_'
bigref
}

# bulk_qkv: the bulk GEMV's QKV variant (off by default until this runs):
# its tests and the graph test of the bulk kernels, memcheck over it, the
# CUDA model tests with it on, then the batch-4 step with it off and on,
# alternating.
bulk_qkv() {
log "TestBulkQKVRoPE, TestGEMVBulkGraph, TestFusedQKVRoPE, TestKernelsWait, TestPDLEnv"
cuda_tests_run bulk-qkv-tests.log 'TestBulkQKVRoPE|TestGEMVBulkGraph|TestFusedQKVRoPE|TestKernelsWait|TestPDLEnv'
log "memcheck: the bulk QKV kernel"
memcheck 'TestBulkQKVRoPE/h(32|8)_.*_n(1|8)$'
log "model tests with TRIGON_CUDA_GEMV_BULK_QKV=on"
(cd model/llama && TRIGON_CUDA_GEMV_BULK_QKV=on "$root/.gpu/llama.test" -test.run 'TestFixturesCUDA|TestDefaultModelCUDAMatchesCPU' -test.v >"$OUT/llama-cuda-qkv.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "worst|^(--- FAIL|FAIL|PASS)" "$OUT/llama-cuda-qkv.log" | tee -a "$OUT/summary.txt"
for r in 1 2 3; do
  for v in TRIGON_CUDA_GEMV_BULK_QKV=off TRIGON_CUDA_GEMV_BULK_QKV=on; do step_trace "$v"; done
done
}

# greedy_same: whether serve_ab's four greedy requests got the same texts
# with and without --queue-ahead (batch composition may differ between the
# runs, so a difference is reported, not failed).
greedy_same() {
$PY - "$OUT" <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
out = sys.argv[1]
def text(qa, i):
    try:
        return json.load(open(f"{out}/greedy-{qa}-{i}.json"))["choices"][0]["text"]
    except Exception as e:
        return f"<{e}>"
same = [text("false", i) == text("true", i) for i in range(1, 5)]
print(f"greedy texts with and without --queue-ahead: {sum(same)} of 4 identical")
print("  first:", repr(text("true", 1)[:120]))
PY
}

# serve_ab: the serving engine's --queue-ahead against without it, on the
# default model (the Llama-3-8B-shaped bigref model has no tokenizer, which
# the server needs): 32 requests of 512 prompt and 128 output tokens, 8 at
# a time, alternating (the server restarted each run).
serve_ab() {
for r in 1 2; do
  for qa in false true; do
    log "trigon serve --queue-ahead=$qa, bench serve 32 x 512 -> 128, concurrency 8"
    .gpu/trigon serve --device cuda --port 8012 --queue-ahead=$qa >"$OUT/serve-ab.log" 2>&1 &
    local pid=$!
    for i in $(seq 300); do curl -sf localhost:8012/health >/dev/null && break; sleep 0.2; done
    .gpu/trigon bench serve --url http://127.0.0.1:8012 --rate inf --num-prompts 32 --max-concurrency 8 \
      --input-len fixed:512 --output-len fixed:128 --json >"$OUT/serve-ab-$r-$qa.json" 2>>"$OUT/serve-ab.err"
    echo "rc=$?" | tee -a "$OUT/summary.txt"
    $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print({k: d.get(k) for k in ("completed","failed","ttft_ms","itl_ms","output_token_throughput")})' "$OUT/serve-ab-$r-$qa.json" 2>&1 | tee -a "$OUT/summary.txt"
    if ((r == 1)); then  # four greedy requests at once, their texts kept
      local cp=()
      for i in 1 2 3 4; do
        curl -s -m 60 localhost:8012/v1/completions -H 'Content-Type: application/json' \
          -d "{\"prompt\": \"func reverse$i(s string) string {\", \"max_tokens\": 96, \"temperature\": 0}" >"$OUT/greedy-$qa-$i.json" &
        cp+=($!)
      done
      wait "${cp[@]}"
    fi
    kill -TERM $pid; wait $pid
  done
done
}

# b16_ab: the batch-16 decode step (two 8-row x tiles, where the bulk
# GEMV's registers allow one block an SM) with the bulk GEMV on (the
# default) and off, alternating twice.
b16_ab() {
for r in 1 2; do for v in "" TRIGON_CUDA_GEMV_BULK=off; do
  local f="$OUT/b16-$r-${v:-default}.json"; f=${f//=/_}
  log "bench latency llama-3-8b --batch 16 --input-len 2048 --output-len 48 --iters 2 (${v:-default})"
  env $v timeout 90 .gpu/trigon bench latency --arch llama-3-8b --batch 16 --input-len 2048 --output-len 48 --warmup 1 --iters 2 \
    --device cuda --cuda-graphs on --json >"$f" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
  $PY -c "import json,sys; d=json.load(open(sys.argv[1])); d=d[0] if isinstance(d,list) else d; print('ITL p50 %.3f p99 %.3f ms; floor %.3f' % (d['itl_ms']['p50'], d['itl_ms']['p99'], d['decode_floor_ms']))" "$f" 2>&1 | tee -a "$OUT/summary.txt"
done; done
}

# ktrace: a kernel timeline of the batch-4 decode step through CUPTI
# (tools/gpu/probes/ktrace.c, loaded by the driver through
# CUDA_INJECTION64_PATH; Nsight Systems is not on the machine): every
# kernel's start and end inside the replayed graphs, PDL overlaps
# included, summarised by tools/gpu/ktrace_summary.py. Tracing costs a
# little time itself: compare its step with an untraced one, not the
# peers.
ktrace_build() {
[[ -f /tmp/ktrace.so && -n ${KTRACE_LIBDIR:-} ]] && return 0
log "ktrace: build the CUPTI kernel tracer"
local hdr lib rec ok=
hdr=$(find /usr/local /opt -name cupti.h -path '*include*' 2>/dev/null | head -1)
lib=$(find /usr/local /opt -name 'libcupti.so*' 2>/dev/null | head -1)
echo "cupti.h: ${hdr:-none}; libcupti: ${lib:-none}" | tee -a "$OUT/summary.txt"
[[ -n $hdr && -n $lib ]] || return 1
for rec in "10 6 4" "10 5 4" "10 5 3" "9 5 3"; do
  set -- $rec
  if gcc -O2 -shared -fPIC -DKREC=CUpti_ActivityKernel$1 -DMREC=CUpti_ActivityMemcpy$2 -DSREC=CUpti_ActivityMemset$3 \
    -I"$(dirname "$hdr")" -I/usr/local/cuda/include \
    -o /tmp/ktrace.so tools/gpu/probes/ktrace.c "$lib" -lpthread 2>>"$OUT/ktrace-build.log"; then ok=$rec; break; fi
done
echo "built with CUpti_ActivityKernel, Memcpy, Memset versions ${ok:-: none compiled (ktrace-build.log)}" | tee -a "$OUT/summary.txt"
[[ -n $ok ]] || return 1
KTRACE_LIBDIR=$(dirname "$lib")
}

# ktrace_run TAG [ENV...]: the traced batch-4 run with backend knobs set.
ktrace_run() {
local tag=$1; shift
log "ktrace ($tag): bench latency ${ARCH:-llama-3-8b} --batch 4 --input-len 2048 --output-len 64 --cuda-graphs on, traced, $*"
env "$@" LD_LIBRARY_PATH="$KTRACE_LIBDIR:${LD_LIBRARY_PATH:-}" CUDA_INJECTION64_PATH=/tmp/ktrace.so KTRACE_OUT="$OUT/ktrace-$tag.csv" \
  .gpu/trigon bench latency --arch ${ARCH:-llama-3-8b} --batch 4 --input-len 2048 --output-len 64 --warmup 1 --iters 1 \
  --device cuda --cuda-graphs on --json >"$OUT/ktrace-$tag.json" 2>"$OUT/ktrace-$tag.err"
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "ktrace|rror" "$OUT/ktrace-$tag.err" | head -5 | tee -a "$OUT/summary.txt"
$PY -c "import json,sys; d=json.load(open(sys.argv[1])); d=d[0] if isinstance(d,list) else d; print('traced ITL p50 %.3f ms' % d['itl_ms']['p50'])" "$OUT/ktrace-$tag.json" 2>&1 | tee -a "$OUT/summary.txt"
$PY tools/gpu/ktrace_summary.py "$OUT/ktrace-$tag.csv" --top ${KTRACE_TOP:-20} 2>&1 | tee -a "$OUT/summary.txt"
gzip -f "$OUT/ktrace-$tag.csv"
}

ktrace() {
ktrace_build || return
ktrace_run default
}

# ktrace_qkv: the timeline with the QKV projection on the bulk GEMV, whose
# step was slower than its graph-timed product predicts (ninth session).
ktrace_qkv() {
ktrace_build || return
ktrace_run bulkqkv TRIGON_CUDA_GEMV_BULK_QKV=on
}

# fix8: the fused products' 8-row limit for the bulk GEMV (tests).
fix8() {
log "TestGateUpSiLU, TestBulkQKVRoPE, TestBulkFusedRows, TestBulkOccupancy, TestGEMVBulk*, TestMatMulAdd"
cuda_tests_run fix8-tests.log 'TestGateUpSiLU|TestBulkQKVRoPE|TestBulkFusedRows|TestBulkOccupancy|TestGEMVBulk|TestMatMulAdd'
}

# ab_old: the batch-4 step traced, this build against .gpu/trigon_old (a
# build of an earlier commit that build.sh packs when OLD=<commit> is
# given), alternating twice; AB_ENVS lists knob settings of this build to
# run after each old run (default: this build as it is).
ab_old() {
[[ -x .gpu/trigon_old ]] || { log "ab_old: no .gpu/trigon_old in this archive"; return; }
sed 's/^/old build: /' .gpu/BUILD_OLD 2>/dev/null | tee -a "$OUT/summary.txt"
for r in 1 2; do
  BIN=trigon_old step_trace TRIGON_AB=old
  for v in ${AB_ENVS:-TRIGON_AB=new}; do step_trace "$v"; done
done
}

# step_edges: the step's edges (one input copy, the split greedy argmax,
# no logits gather in decode): the sampling, feeding and graph tests.
step_edges() {
log "TestSample*, TestSmallCopies, TestDeviceChecks, TestReadReports*, TestGraph*, TestEmbed"
cuda_tests_run edges-tests.log 'TestSample|TestSmallCopies|TestDeviceChecks|TestReadReports|TestGraph|TestEmbed'
}

# prefetch_ab: the norms' L2 prefetch of the next weight (8 MiB by
# default, tuned when the products were the register GEMV) against none,
# 4 and 16 MiB, now that the bulk GEMV streams its weight early under PDL:
# the batch-4 step traced, alternating twice.
prefetch_ab() {
for r in 1 2; do
  for v in TRIGON_AB=default TRIGON_CUDA_NORM_PREFETCH_MB=0 TRIGON_CUDA_NORM_PREFETCH_MB=4 TRIGON_CUDA_NORM_PREFETCH_MB=16; do
    step_trace "$v"
  done
done
}

# attn_pf: decode attention's L2 hints (the O weight prefetched while the
# KV cache streams, the K/V reads evict_first): the attention tests (the
# _hinted runs compare bytes with the hints off), memcheck, the graph-timed
# attention + O pair, then the batch-4 step alternating twice, and the
# timeline with the hints on.
attn_pf() {
log "TestAttention, TestDecodePlan (hinted cases: L2 hints on against off, byte for byte)"
cuda_tests_run attn-pf-tests.log 'TestAttention$|TestDecodePlan'
memcheck 'TestAttention/(decode_gqa4_d128|decode_many_seqs|mixed_gqa4_d128)_hinted$'
log "BenchmarkAttentionPrefetch (graph-timed attention + O product)"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'AttentionPrefetch' -test.benchtime 100x >"$OUT/attn-pf-bench.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "^Benchmark|rror" "$OUT/attn-pf-bench.log" | awk '{$2=""; print}' | tee -a "$OUT/summary.txt"
for r in 1 2; do
  for v in ${PF_ENVS:-TRIGON_AB=default TRIGON_CUDA_KV_EVICT_FIRST=on TRIGON_CUDA_KV_EVICT_FIRST=on,TRIGON_CUDA_ATTN_PREFETCH_MB=8 TRIGON_CUDA_KV_EVICT_FIRST=on,TRIGON_CUDA_ATTN_PREFETCH_MB=16 TRIGON_CUDA_KV_EVICT_FIRST=on,TRIGON_CUDA_ATTN_PREFETCH_MB=24}; do
    step_trace "${v//,/ }"
  done
done
if [[ -n ${PF_KTRACE:-} ]]; then
  ktrace_build && ktrace_run pf ${PF_KTRACE//,/ }
fi
}

# launch_first: the norm and the decode combine letting the next product
# launch before they wait (its early weight loads overlap the product
# before them), the norm's prefetch blocks not waiting: every backend/cuda
# test, the CUDA model tests, memcheck on the norm and attention, then the
# batch-4 step against .gpu/trigon_old (ab_old; AB_ENVS) and the timeline.
launch_first() {
ab_old
log "backend/cuda: every test"
all_cuda_tests
model_tests
memcheck 'TestAddRMSNorm|TestAttention/(decode_gqa4_d128|mixed_gqa4_d128)(_hinted)?$'
ktrace_build && ktrace_run default
}

# lf_sweep: the norms' prefetch size with and without launch_first's
# change (.gpu/trigon_old is the build before it), three alternating
# rounds of the batch-4 step.
lf_sweep() {
sed 's/^/old build: /' .gpu/BUILD_OLD 2>/dev/null | tee -a "$OUT/summary.txt"
for r in 1 2 3; do
  for v in ${LF_RUNS:-old:TRIGON_AB=old12 old:TRIGON_AB=old,TRIGON_CUDA_NORM_PREFETCH_MB=8 new:TRIGON_AB=new12 new:TRIGON_CUDA_NORM_PREFETCH_MB=8 new:TRIGON_CUDA_NORM_PREFETCH_MB=16 new:TRIGON_CUDA_NORM_PREFETCH_MB=4}; do
    local bin=trigon e=${v#*:}
    [[ ${v%%:*} == old ]] && bin=trigon_old
    BIN=$bin step_trace "${e//,/ }"
  done
done
}

# sweep: the batch-4 step traced under each of SWEEP_ENVS (settings of one
# run joined by commas; TRIGON_AB=default for none), ROUNDS (default 2)
# alternating rounds.
sweep() {
for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
  for v in ${SWEEP_ENVS:-TRIGON_AB=default}; do step_trace "${v//,/ }"; done
done
}

# bulk_qkv_default: the bulk QKV GEMV on by default: its tests and the
# env parsing, the CUDA model tests, then the batch-4 step against
# TRIGON_CUDA_GEMV_BULK_QKV=off, alternating twice.
bulk_qkv_default() {
log "TestBulkQKVRoPE, TestFusedQKVRoPE, TestGEMVBulkGraph, TestParseBulkQKV, TestKernelsWait"
cuda_tests_run bqkv-tests.log 'TestBulkQKVRoPE|TestFusedQKVRoPE|TestGEMVBulkGraph|TestParseBulkQKV|TestKernelsWait'
model_tests
for r in 1 2; do step_trace TRIGON_AB=default; step_trace TRIGON_CUDA_GEMV_BULK_QKV=off; done
}

# qkv_pin: the fused QKV+RoPE kernel's pinned GEMV variant
# (TRIGON_CUDA_QKV_GEMV): its tests, the CUDA model tests, then the
# batch-4 step with each variant in QKV_VARIANTS (and the tuner's pick,
# and the bulk QKV kernel), alternating ROUNDS times.
qkv_pin() {
log "TestFusedQKVRoPE*, TestParseQKVGEMV"
cuda_tests_run qkv-tests.log 'TestFusedQKVRoPE|TestParseQKVGEMV'
model_tests
for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
  for v in ${QKV_VARIANTS:-8x2 tuner}; do
    if [[ $v == bulk ]]; then step_trace TRIGON_CUDA_GEMV_BULK_QKV=on; else step_trace TRIGON_CUDA_QKV_GEMV=$v; fi
  done
done
}

# attn_early_tests: the decode attention tests with attention letting its
# dependents launch at its start (TRIGON_CUDA_EARLY_LAUNCH=qkv_rope_bf16,gemvb_silu_bf16,attn_decode_mma).
attn_early_tests() {
log "TestAttention*, TestKernelsWait* with TRIGON_CUDA_EARLY_LAUNCH=qkv_rope_bf16,gemvb_silu_bf16,attn_decode_mma"
cuda_tests_run attn-early.log 'TestAttention|TestKernelsWait' TRIGON_CUDA_EARLY_LAUNCH=qkv_rope_bf16,gemvb_silu_bf16,attn_decode_mma
}

# qkv_rows: the pinned QKV GEMV variant (default) against the tuner's
# pick (TRIGON_CUDA_QKV_GEMV=tuner) at batches 2 and 8 (output 64, graphs
# on), alternating twice: the batches the pin covers but the batch-4
# sweep did not measure.
qkv_rows() {
for r in 1 2; do
  for n in 2 8; do
    for v in TRIGON_AB=pinned TRIGON_CUDA_QKV_GEMV=tuner; do
      log "bench latency llama-3-8b --batch $n --input-len 2048 --output-len 64 --cuda-graphs on ($v)"
      env $v .gpu/trigon bench latency --arch llama-3-8b --batch $n --input-len 2048 --output-len 64 --device cuda --cuda-graphs on --json \
        >"$OUT/qkv-$n-${v##*=}-$r.json" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
      $PY -c "import json,sys
d=json.load(open(sys.argv[1]))
d=d[0] if isinstance(d,list) else d
print('ITL p50 %.3f p99 %.3f ms;' % (d['itl_ms']['p50'], d['itl_ms']['p99']), [c for c in d.get('kernel_choices',[]) if 'x[6144,' in c])" "$OUT/qkv-$n-${v##*=}-$r.json" 2>&1 | tee -a "$OUT/summary.txt"
    done
  done
done
}

# qkv_arch: the pinned QKV GEMV variant against the tuner's pick on the
# other named architectures (batch 4, output 64, graphs on), alternating
# twice, after TestFusedQKVRoPE.
qkv_arch() {
log "TestFusedQKVRoPE*"
cuda_tests_run qkv-tests.log 'TestFusedQKVRoPE'
for r in 1 2; do
  for a in ${QKV_ARCHS:-qwen2.5-7b llama-3.2-1b}; do
    for v in TRIGON_AB=pinned TRIGON_CUDA_QKV_GEMV=tuner; do
      log "bench latency $a --batch 4 --input-len 2048 --output-len 64 --cuda-graphs on ($v)"
      env $v .gpu/trigon bench latency --arch $a --batch 4 --input-len 2048 --output-len 64 --device cuda --cuda-graphs on --json \
        >"$OUT/qkv-$a-${v##*=}-$r.json" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
      $PY -c "import json,sys
d=json.load(open(sys.argv[1]))
d=d[0] if isinstance(d,list) else d
print('ITL p50 %.3f p99 %.3f ms;' % (d['itl_ms']['p50'], d['itl_ms']['p99']), [c.split(';')[0] for c in d.get('kernel_choices',[])])" "$OUT/qkv-$a-${v##*=}-$r.json" 2>&1 | tee -a "$OUT/summary.txt"
    done
  done
done
}

# clock_trace: the batch-4 step traced while nvidia-smi samples the SM
# clock, power and temperature every 5 ms (clocks.csv), to check that the
# steps after each prefill are slower because the clock climbs back after
# the power-capped prefill (docs/benchmarks.md, eleventh session). Prints
# each change of the SM clock.
clock_trace() {
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 5 >"$OUT/clocks.csv" 2>&1 &
local pid=$!
step_trace
kill $pid 2>/dev/null; wait $pid 2>/dev/null
log "SM clock changes (timestamp, SM MHz, memory MHz, W, C)"
awk -F', ' '$2 != last {print; last = $2}' "$OUT/clocks.csv" | head -200 | tee -a "$OUT/summary.txt"
}

# verify: after a refactor of kernel code, every test, memcheck, the
# CUDA model tests, the kernel benchmarks and the batch-4 step.
verify() {
log "backend/cuda: every test"
all_cuda_tests
memcheck 'TestAttention/(decode_gqa4_d128|mixed_gqa4_d128|prefill_prefix_gqa8_d128|prefill_gqa8_d256|bad_block_id.*)$|TestGEMV/n(3|9)_.*_w8_s4'
log "fixture models and the default model on CUDA (llama.test)"
(cd model/llama && "$root/.gpu/llama.test" -test.run 'TestFixturesCUDA|TestDefaultModelCUDAMatchesCPU' -test.v >"$OUT/llama-cuda.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "worst|^(--- FAIL|FAIL|PASS)" "$OUT/llama-cuda.log" | tee -a "$OUT/summary.txt"
attn_bench
bench_b4
}

# prefill_wg: the wgmma prefill attention kernel: ptxas's report and the
# SASS's tensor-core instructions, the attention tests under every prefill
# setting, memcheck on two of them, the kernel benchmark, and the batch-4
# prefill with the wgmma kernel against the mma.sync one, alternating.
prefill_wg() {
log "TestPrefillWGCompile: ptxas report; HGMMA/HMMA counts in the SASS"
mkdir -p /tmp/cubins
cuda_tests_run wg-compile.log 'TestPrefillWGCompile' TRIGON_TEST_CUBIN_DIR=/tmp/cubins
grep -E "attn_prefill_wg|Used|spill|serializ|arning" "$OUT/wg-compile.log" | head -24 | tee -a "$OUT/summary.txt"
local objdump
objdump=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
for f in /tmp/cubins/*.cubin; do
  [ -n "$objdump" ] && echo "$(basename "$f"): HGMMA $("$objdump" -sass "$f" | grep -c HGMMA), HMMA $("$objdump" -sass "$f" | grep -c 'HMMA'), LDL/STL $("$objdump" -sass "$f" | grep -cE 'LDL|STL')" | tee -a "$OUT/summary.txt"
done
log "TestAttention, TestAttentionPrefillWG, TestPrefillWGSelect"
cuda_tests_run wg-tests.log 'TestAttention$|TestAttentionPrefillWG|TestPrefillWGSelect'
grep -E "relative error" "$OUT/wg-tests.log" | head -20 | tee -a "$OUT/summary.txt"
memcheck 'TestAttentionPrefillWG/(prefill_bs8_gqa4_d128_wg_on|prefill_ragged_gqa1_d64_wg_n64)$'
log "BenchmarkAttentionPrefill (graph-timed)"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'AttentionPrefill' -test.benchtime 20x -test.v >"$OUT/wg-bench.log" 2>&1)
# (AttentionPrefill also matches BenchmarkAttentionPrefillWGAblation.)
grep -E "^Benchmark" "$OUT/wg-bench.log" | awk '{print $1, $3, $4, $5, $6}' | tee -a "$OUT/summary.txt"
[ -n "${WG_NO_E2E:-}" ] && return
for round in 1 2; do
  for env in TRIGON_CUDA_PREFILL_WGMMA=on TRIGON_CUDA_PREFILL_WGMMA=off; do
    local f="$OUT/prefill-${env##*=}-$round.json"
    env $env .gpu/trigon bench latency --arch llama-3-8b --batch 4 --input-len 2048 --output-len 16 --iters 5 --device cuda \
      --cuda-graphs on --json >"$f" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
    $PY -c "import json,sys; r=json.load(open(sys.argv[1])); p=r['prefill_ms']; print(sys.argv[2], 'prefill p50 %.1f min %.1f ms; floors %.1f burst %.1f sustained: %.3fx / %.3fx; ITL p50 %.3f' % (p['p50'], p['min'], r['prefill_gemm_floor_ms'], r['prefill_gemm_floor_sustained_ms'], p['p50']/r['prefill_gemm_floor_ms'], p['p50']/r['prefill_gemm_floor_sustained_ms'], r['itl_ms']['p50']))" "$f" "$env" | tee -a "$OUT/summary.txt"
  done
done
}

# wg_bench: the prefill attention benchmarks alone (every kernel setting
# and the wgmma kernel's ablations).
wg_bench() {
log "BenchmarkAttentionPrefill, BenchmarkAttentionPrefillWGAblation (graph-timed)"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run '^$' -test.bench 'AttentionPrefill' -test.benchtime 20x -test.v >"$OUT/wg-bench.log" 2>&1)
grep -E "^Benchmark" "$OUT/wg-bench.log" | awk '{print $1, $3, $4, $5, $6}' | tee -a "$OUT/summary.txt"
}

# p99_spread: the batch-4 decode's p99 over RUNS (default 4) processes of
# `bench latency --iters 10`, graphs on, each against its own floors: how
# the p99 the peers' single run reports varies between processes.
p99_spread() {
log "bench latency llama-3-8b --batch 4 --input-len 2048 --output-len 128 --cuda-graphs on --iters 10, ${RUNS:-4} runs"
for r in $(seq "${RUNS:-4}"); do
  local f="$OUT/spread-$r.json"
  .gpu/trigon bench latency --arch llama-3-8b --batch 4 --input-len 2048 --output-len 128 --iters 10 --device cuda \
    --cuda-graphs on --json >"$f" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
  $PY -c "import json,sys; d=json.load(open(sys.argv[1])); i=d['itl_ms']; fa=d['decode_floor_all_weights_ms']; p=d['prefill_ms']['p50']
print('run %s: %d ITLs, p50 %.3f p99 %.3f ms = %.3fx / %.3fx the floor %.3f, %.3fx / %.3fx the all-weights floor %.3f; prefill p50 %.1f ms = %.3fx burst, %.3fx sustained' % (sys.argv[2], i['count'], i['p50'], i['p99'], i['p50']/d['decode_floor_ms'], i['p99']/d['decode_floor_ms'], d['decode_floor_ms'], i['p50']/fa, i['p99']/fa, fa, p, p/d['prefill_gemm_floor_ms'], p/d['prefill_gemm_floor_sustained_ms']))" "$f" "$r" | tee -a "$OUT/summary.txt"
done
}

# bias_check: the QKV bias in the fused QKV+RoPE kernel: its tests (and
# the kernel's other users), the CUDA model tests (the qwen2 fixture has
# attention biases), Qwen2.5-7B's batch-4 step fused against unfused
# (TRIGON_CUDA_FUSE_QKV_ROPE=off: the path every biased model took
# before), and one traced Llama-3-8B step, whose kernel gained the bias
# argument.
bias_check() {
log "TestFusedQKVRoPE*, TestNormQKVRoPE, TestNormFused*, TestChain"
cuda_tests_run bias-tests.log 'TestFusedQKVRoPE|TestNormQKVRoPE|TestNormFused|TestChain'
model_tests
for env in TRIGON_AB=fused TRIGON_CUDA_FUSE_QKV_ROPE=off; do
  local f="$OUT/qwen-${env##*=}.json"
  env $env .gpu/trigon bench latency --arch qwen2.5-7b --batch 4 --input-len 2048 --output-len 128 --device cuda \
    --cuda-graphs on --json >"$f" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
  $PY -c "import json,sys; d=json.load(open(sys.argv[1])); i=d['itl_ms']
print(sys.argv[2], 'qwen2.5-7b batch 4: ITL p50 %.3f p99 %.3f ms, floor %.3f; queued step %.3f ms; prefill p50 %.1f ms' % (i['p50'], i['p99'], d['decode_floor_ms'], d.get('queued_step_ms') or 0, d['prefill_ms']['p50']))" "$f" "$env" | tee -a "$OUT/summary.txt"
done
step_trace
}

# o_overlap: decode attention with two ring stages (two 75 KB blocks an
# SM) and its dependents launched at its start, so that one block of the
# O product (w8_c1024_s2, 72 KB) fits beside them and streams its ring
# during attention; against the default, each knob alone, and the O
# product on four consumer warps (fewer registers). The batch-4 step
# traced, alternating three times, then the timeline of the pair.
o_overlap() {
local s2=TRIGON_CUDA_DECODE_STAGES=2 early=TRIGON_CUDA_EARLY_LAUNCH=qkv_rope_bf16,gemvb_silu_bf16,attn_decode_mma
for r in 1 2 3; do
  for v in TRIGON_AB=default "$s2 $early" "$s2" "$early" "$s2 $early TRIGON_CUDA_BULK_PICK=4096x4096=w4_c1024_s2"; do
    step_trace "$v"
  done
done
if ((SECONDS < ${SKIP_AFTER:-100000})); then
  ktrace_build && ktrace_run s2early $s2 $early
fi
}

# qwen3_pdl: Qwen3's unfused QKV path (plain gemv_bf16, then
# rope_store_kv with the q/k norms) launched under PDL as well as the
# default set; the kernels' wait tests and the CUDA model tests under
# it, then the qwen3-8b batch-4 step, alternating twice.
qwen3_pdl() {
local set=qkv_rope_bf16,attn_decode_mma,attn_decode_combine,gemvb_bf16,gemvb_add_bf16,gemvb_silu_bf16,gemvb_qkv_rope_bf16,add_rmsnorm,gemv_bf16,rope_store_kv
log "TestKernelsWait*, TestRoPE*, TestGEMV*, TestAttention/decode with TRIGON_CUDA_PDL=$set"
cuda_tests_run pdl-tests.log 'TestKernelsWait|TestRoPE|TestGEMV|TestAttention/decode' TRIGON_CUDA_PDL=$set
log "model tests on CUDA with it"
(cd model/llama && TRIGON_CUDA_PDL=$set "$root/.gpu/llama.test" -test.run 'TestFixturesCUDA|TestDefaultModelCUDAMatchesCPU' -test.v >"$OUT/llama-cuda-pdl.log" 2>&1)
echo "rc=$?" | tee -a "$OUT/summary.txt"; grep -E "worst|^(--- FAIL|FAIL|PASS)" "$OUT/llama-cuda-pdl.log" | tee -a "$OUT/summary.txt"
for r in 1 2; do
  for v in TRIGON_AB=default TRIGON_CUDA_PDL=$set; do
    log "bench latency qwen3-8b --batch 4 --input-len 2048 --output-len 128 --cuda-graphs on ($v)"
    env $v .gpu/trigon bench latency --arch qwen3-8b --batch 4 --input-len 2048 --output-len 128 --device cuda --cuda-graphs on \
      --json >"$OUT/q3-$r-${v%%=*}.json" 2>>"$OUT/bench.err"
    $PY -c "import json,sys; d=json.load(open(sys.argv[1])); i=d['itl_ms']; print('ITL p50 %.3f p99 %.3f ms; floors %.3f / %.3f' % (i['p50'], i['p99'], d['decode_floor_ms'], d['decode_floor_all_weights_ms']))" "$OUT/q3-$r-${v%%=*}.json" | tee -a "$OUT/summary.txt"
  done
done
}

# pdl_verify: the default PDL set with gemv_bf16 and rope_store_kv: every
# backend/cuda test, then the batch-16 Llama step (where plain register
# GEMVs may run) against the previous set, and the batch-4 Llama step.
pdl_verify() {
local old=qkv_rope_bf16,attn_decode_mma,attn_decode_combine,gemvb_bf16,gemvb_add_bf16,gemvb_silu_bf16,gemvb_qkv_rope_bf16,add_rmsnorm
log "backend/cuda: every test"
all_cuda_tests
for v in TRIGON_AB=default TRIGON_CUDA_PDL=$old; do
  log "bench latency llama-3-8b --batch 16 --input-len 2048 --output-len 64 --cuda-graphs on ($v)"
  env $v .gpu/trigon bench latency --arch llama-3-8b --batch 16 --input-len 2048 --output-len 64 --device cuda --cuda-graphs on \
    --json >"$OUT/b16-${v%%=*}.json" 2>>"$OUT/bench.err"
  $PY -c "import json,sys; d=json.load(open(sys.argv[1])); i=d['itl_ms']; print('ITL p50 %.3f p99 %.3f ms' % (i['p50'], i['p99']))" "$OUT/b16-${v%%=*}.json" | tee -a "$OUT/summary.txt"
done
step_trace
}

# qk_pair: Qwen3's Q/K-norm QKV path as FusedQKVRoPE's pair (the pinned
# GEMV, then rope_store_kv, both under PDL at that site): the QKV, RoPE,
# graph and wait tests, memcheck over the small pair cases, the CUDA model
# tests, then the qwen3-8b batch-4 step with the pair and without it
# (TRIGON_CUDA_QK_NORM_PAIR=off), alternating three times, and the
# llama-3-8b step.
qk_pair() {
log "TestFusedQKVRoPE*, TestRoPE*, TestKernelsWait, TestPDLEnv, TestNormQKVRoPE, TestGraph"
cuda_tests_run qk-pair-tests.log 'TestFusedQKVRoPE|TestRoPE|TestKernelsWait|TestPDLEnv|TestNormQKVRoPE|TestGraph'
log "memcheck: the pair's cases at 8 heads"
memcheck 'TestFusedQKVRoPEQKNorm/h8_kv2'
model_tests
for r in 1 2 3; do
  for v in TRIGON_AB=default TRIGON_CUDA_QK_NORM_PAIR=off; do
    ARCH=qwen3-8b step_trace "$v"
  done
done
step_trace
for f in "$OUT"/trace-*.json; do
  $PY -c "import json,sys; d=json.load(open(sys.argv[1])); d=d[0] if isinstance(d,list) else d; print('%s: %s prefill p50 %.2f ms' % (sys.argv[1].split('/')[-1], d['arch'], d['prefill_ms']['p50']))" "$f" | tee -a "$OUT/summary.txt"
done
}

# qwen3_peers: the peers at qwen3-8b after a llama-3-8b peers run in the
# same call, whose files it keeps as llama-*.
qwen3_peers() {
local f
for f in trigon.json gptfast.jsonl hf.jsonl; do [[ -f $OUT/$f ]] && mv "$OUT/$f" "$OUT/llama-$f"; done
ARCH=qwen3-8b peers
}

# qk_verify: the final code's QKV, graph, wait and launch tests, and the
# CUDA model tests (a short call after a refactor of the launch helpers).
qk_verify() {
log "TestFusedQKVRoPE*, TestGraph*, TestKernelsWait, TestPDLEnv, TestAttention/decode, TestGEMV"
cuda_tests_run qk-verify.log 'TestFusedQKVRoPE|TestGraph|TestKernelsWait|TestPDLEnv|TestAttention/decode|TestGEMV'
model_tests
}

# early_w: the products' early weight reads, now that device-filled and
# fused-product weights count as pristine: the tests they touch, then the
# batch-4 step against TRIGON_CUDA_EARLY_WEIGHTS=off, three alternating
# rounds. (Call 2 of 2026-11-30p also ran a reverted L2 prefetch here.)
early_w() {
log "TestPristine, TestGEMVBulk*, TestGateUpSiLU, TestMatMulAdd, TestFusedQKVRoPE*, TestGraph*, TestKernelsWait*, TestFillNormal, TestPDLEnv"
cuda_tests_run early-w-tests.log 'TestPristine|TestGEMVBulk|TestGateUpSiLU|TestMatMulAdd|TestFusedQKVRoPE|TestGraph|TestKernelsWait|TestFillNormal|TestPDLEnv|TestNormFused'
model_tests
local v r
for r in 1 2 3; do
  for v in TRIGON_AB=default TRIGON_CUDA_EARLY_WEIGHTS=off; do step_trace "$v"; done
done
step_trace
}

# early_sweep: knobs last measured while the products' early weight reads
# were off in the benchmark (device-filled weights were not pristine),
# re-measured with them on: the batch-4 step per setting (EARLY_SETS,
# ';'-separated, each a space-separated env list), two rounds.
early_sweep() {
local v r sets
IFS=';' read -ra sets <<<"${EARLY_SETS:-TRIGON_AB=default;TRIGON_CUDA_GEMV_BULK_QKV=on;TRIGON_CUDA_DECODE_STAGES=2 TRIGON_CUDA_EARLY_LAUNCH=qkv_rope_bf16,gemvb_silu_bf16,attn_decode_mma;TRIGON_CUDA_BULK_PICK=4096x4096=w8_c1024_s3;TRIGON_CUDA_NORM_PREFETCH_MB=0;TRIGON_CUDA_NORM_PREFETCH_MB=4;TRIGON_CUDA_FUSE_NORM=add,qkv;TRIGON_CUDA_PDL=on}"
for r in 1 2; do
  for v in "${sets[@]}"; do step_trace "$v"; done
done
step_trace
}

# pdl_tail: PDL on the kernels outside the default set (embed, the
# greedy pick and the small copies between replays), the LM head on the
# bulk GEMV (streaming early under PDL), and larger norm prefetches,
# now that the products read their weights early: two rounds.
pdl_tail() {
local d=qkv_rope_bf16,attn_decode_mma,attn_decode_combine,gemvb_bf16,gemvb_add_bf16,gemvb_silu_bf16,gemvb_qkv_rope_bf16,add_rmsnorm
EARLY_SETS="TRIGON_AB=default;TRIGON_CUDA_PDL=on;TRIGON_CUDA_PDL=$d,argmax_rows,copy_words,embed;TRIGON_CUDA_GEMV_MARGIN=0;TRIGON_CUDA_GEMV_MARGIN=0 TRIGON_CUDA_PDL=on;TRIGON_CUDA_NORM_PREFETCH_MB=16;TRIGON_CUDA_NORM_PREFETCH_MB=24" early_sweep
}

# early_launch: the products that let their dependents launch at their
# start (TRIGON_CUDA_EARLY_LAUNCH): the default set against none, every
# product that takes the flag, and the QKV product alone; two rounds.
early_launch() {
local E=TRIGON_CUDA_EARLY_LAUNCH
EARLY_SETS="${EL_SETS:-TRIGON_AB=default;$E=off;$E=on;$E=qkv_rope_bf16}" early_sweep
}

# early_rows: launchEarly (TRIGON_CUDA_EARLY_LAUNCH) at the other rows:
# its tests, batch 1 and 64 with the default set against off (two
# rounds), and Qwen3-8B's batch-4 step against off.
early_rows() {
log "TestLaunchEarly, TestParseLaunchEarly, TestKernelsWait*, TestFusedQKVRoPE, TestGateUpSiLU"
cuda_tests_run early-tests.log 'TestLaunchEarly|TestParseLaunchEarly|TestKernelsWait|TestFusedQKVRoPE|TestGateUpSiLU'
local r e n f
for r in 1 2; do
  for e in TRIGON_AB=default TRIGON_CUDA_EARLY_LAUNCH=off; do
    for n in 1 64; do
      log "bench latency llama-3-8b --batch $n --input-len 2048 --output-len 64 --cuda-graphs on ($e)"
      f="$OUT/rows-$r-$n-${e//[^A-Za-z0-9]/_}.json"
      env $e .gpu/trigon bench latency --arch llama-3-8b --batch $n --input-len 2048 --output-len 64 --device cuda --cuda-graphs on --json \
        >"$f" 2>>"$OUT/bench.err" || tail -3 "$OUT/bench.err"
      $PY -c "import json,sys
d=json.load(open(sys.argv[1])); d=d[0] if isinstance(d,list) else d
print('  ITL p50 %.3f p99 %.3f ms, prefill %.1f ms, floor %.3f' % (d['itl_ms']['p50'], d['itl_ms']['p99'], d['prefill_ms']['p50'], d['decode_floor_ms']))" "$f" 2>&1 | tee -a "$OUT/summary.txt"
    done
  done
done
for r in 1 2; do
  ARCH=qwen3-8b step_trace
  ARCH=qwen3-8b step_trace TRIGON_CUDA_EARLY_LAUNCH=off
done
}

# A part is skipped once SKIP_AFTER seconds (default 500) have passed, so
# that the logs still come back inside the device's 600-second limit.
for part in ${@:-checks bigref}; do
  if ((SECONDS > ${SKIP_AFTER:-500})) && [[ $part != train_wait ]]; then log "skipped $part: ${SECONDS}s gone"; continue; fi
  "$part"
done
log "done in ${SECONDS}s"
# The device tool returns at most 8 files: pack every log into one archive
# (the training run's result parts stay beside it).
# The archive is written outside $OUT: tar fails on a folder that changes
# while it reads it.
(cd "$OUT" && tar -czf /tmp/session-logs.tgz --exclude=summary.txt --exclude='result.tar.*' . &&
  find . -type f ! -name summary.txt ! -name 'result.tar.*' -delete && mv /tmp/session-logs.tgz logs.tgz) ||
  echo "packing the logs failed: the device returns only the first 8 files" | tee -a "$OUT/summary.txt"
