#!/usr/bin/env bash
# One GPU-machine session: the checks of the CUDA backend that need a GPU and
# the runs behind the figures of docs/benchmarks.md, in one call (device
# time is scarce). Build first, on the development machine:
#
#   tools/gpu/build.sh                # .gpu/bins.tar.xz
#   OLD=<commit> tools/gpu/build.sh   # the same, plus that commit's trigon (ab_old)
#
# then on the GPU machine, from the repository root, carrying .gpu/bins.tar.xz
# (the device tool's `run`):
#
#   bash tools/gpu/session.sh [PART...]          (default: final)
#
# Parts that check the code (docs/gpu-tests.md):
#   cuda_tests     every backend/cuda test, then memcheck over a subset
#   model_tests    the fixture models against transformers, the default model GPU against CPU
#   bigref         the Llama-3-8B-shaped model against transformers (TestBigRef)
#   graphs         the graph tests, and greedy text with decode graphs on against off
#   default_model  the embedded model, CUDA against CPU
#   serve_smoke    trigon serve: a completion, a stream, /metrics, SIGTERM
#   tp_tests       tensor parallelism: the one-GPU tests (TP=1 through the new path, TP=2
#                  on one device, EmbedShard, NCCL of one rank) and, on 2+ GPUs, NCCL's
#                  against the in-process group
# Parts that measure (docs/benchmarks.md):
#   tp_bench       2+ GPUs: bench latency llama-3-8b batch 4 at TP=1 and TP=2, the NCCL
#                  all-reduce benchmark (bus bandwidth), a 70B-shape dummy model served at TP=N
#   peers          trigon against the gpt-fast-style model and HF at ARCH (default llama-3-8b)
#   qwen3_peers    peers at qwen3-8b, keeping a llama run's files as llama-*
#   bench_rows     bench latency at BATCHES (default "1 4 64"), 2048-token prompts, graphs off and on
#   rows_long      batch 16 at 32768-token prompts
#   kv_rows        bf16 against the quantized KV caches (fp8, int8, int4): batch 16 at 32k, batch 4 at 2k
#   kv_check       the KV formats' kernel tests (bf16, fp8, int8, int4), then the default model per KV
#                  format, the fixtures and the default model (kv_tests: the same)
#   new_tests      the new kernels' and paths' tests in priority order, then the KV attention benchmark
#   kv_attn_bench  decode attention over bf16, fp8, int8 and int4 caches (BenchmarkAttentionDecodeQuant)
#   kv_attn_stalls ncu's stall reasons and memory sections for that kernel, bf16 against int4 at 16 x 32k
#   kv_attn_source ncu source counters (instructions and stalls per SASS line) of that kernel:
#                  int4 at 16 x 32k and 4 x 2k, bf16 at 4 x 2k (KV_SRC_CASES)
#   spec_rows_b    spec_rows with SPEC_BIN_B's server, files tagged -b
#   kv_int4_ab     the int4 row at 16 x 32k, SPEC_BIN_B's build then this one
#   kq_ppl         the default model padded to 512 wide (tools/padhf) in bf16 and the K-quants
#                  (q6_k, q5_k, q4_k_m, q4_k): trigon eval perplexity on CUDA of each file
#   spec_ab        spec_rows for this build and SPEC_BIN_B in turn at each of SPEC_CONCS (1 4)
#   spec_warm_8b   a speculating 8B dummy server's load time, this build and SPEC_BIN_B
#   kv_capacity    the KV capacity serve states at load, per KV dtype (dummy Llama-3.1-8B)
#   wq_rows        quantized weights beside bf16: AWQ, FP8 and Q4_K at batch 1, 4 and 16,
#                  2048-token prompts; AWQ with the int8 KV cache at batch 4
#   spec_verify    the 8B verify step of k=4 draft tokens against a decode step, batch 1 and 4
#   gemv_check     the decode GEMVs' tests at 1-32 rows, then BenchmarkMatMulDecode's graph cases
#   spec_forms     the verify step's native and decode-row forms as the runner times them: the
#                  default model (batch 1, k 4 and 8) and the 8B shape (batch 1 and 4, k 4)
#   wq_bench       BenchmarkMatMulWQuant: AWQ4 and FP8 decode products at each decode tuning
#   wq_tests       the quantized-weight kernels' tests, then the default model quantized on CUDA
#   f8_plan        TestF8GemmPlan: FP8 prefill products on cuBLASLt's FP8 GEMM, or why not
#   f8_prefill     BenchmarkF8Prefill: the FP8 prefill product and its passes against BF16
#   wq_check       the quantized-weight kernels' tests (TestF8GemmPlan's paths included), then
#                  BenchmarkF8Prefill and BenchmarkMatMulWQuant: one call checks and measures
#   gemm_large     BenchmarkMatMulLargeBatch: the 8B products at 128 and 256 rows, heuristic against tuned
#   spec_tests     TestSpeculativeCUDA (engine, graphs off and on), TestGraphVerifyAttention and
#                  TestFlatVerifyStepRows
#   fix_tests      the two tests a compile error failed (TestKVReadersRefuseOtherFormats, TestF8ActQuant)
#   rows_large     batch 128 and 256 at 192-token prompts (the serving issue's shape)
#   rows_256       bench latency batch 256 at 192- and 16-token prompts
#   serve_budget   128/128 at 256 in flight against a fresh server per step token budget
#   serve_mixed_ab the mixed-step cap and the tuner's end against .gpu/trigon_old: 1,024/128 at
#                  8 requests/s (old, new with a given budget, new), 128/128 at 256 and 64 in flight
#   serve_stalls   a cold 8 requests/s run with CUDA's lazy and eager module loading, then
#                  lazy under --profile-dir (the Go execution trace of the run)
#   serve_ab       bench serve against trigon serve on the default model, --queue-ahead off and on
#   spec_rows      speculative decoding at batch 1 on the default model: bench serve over the
#                  code-editing and held-out Go prompt sets, no speculation, prompt lookup and
#                  the draft model (DRAFT), tokens/s against plain and the acceptance; then the
#                  8B-shape verify step against a decode step at batch 1 and 4
#   prefill_attn_bench  BenchmarkAttentionPrefill (graph-timed)
#   spec_host_profile  a speculating server's Go CPU profile and execution trace (/start_profile)
#   spec_profile   ncu, kernel by kernel: the default model's decode step against its verify step
#                  of 1+SPEC_K rows (default 8) after a SPEC_CTX-token prompt (default 128)
#   step_profile   ncu, kernel by kernel: a llama-3-8b decode step at PROFILE_BATCH (default 256)
#   ab_old         this build against .gpu/trigon_old, alternating, and the before/after table
#   final          cuda_tests and model_tests (stopping on a failure), then default_model,
#                  peers, BATCHES="1 64" bench_rows and serve_smoke
# Results: $OUT/summary.txt and $OUT/logs.tgz (the device tool returns at most
# 8 files). OUT defaults to ./gpu-out.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
[ -f .gpu/bins.tar.xz ] && tar -C .gpu -xJf .gpu/bins.tar.xz && cp .gpu/bin/* .gpu/
root=$PWD
PY=python3
$PY -c 'import torch, transformers' 2>/dev/null || PY=/opt/torch/.venv/bin/python
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
say() { tee -a "$OUT/summary.txt"; }

nvidia-smi -L | say
[ -f .gpu/BUILD ] && sed 's/^/build: /' .gpu/BUILD | say

# latency_line FILE: one line per result of a `bench latency --json` file,
# with the floors measured in the same run and the ratios against them.
latency_line() {
$PY - "$1" <<'PY' 2>&1 | say
import json, sys
d = json.load(open(sys.argv[1]))
for r in d if isinstance(d, list) else [d]:
    i, p = r["itl_ms"], r["prefill_ms"]["p50"]
    def x(a, b):
        return "%.3fx" % (a / b) if a and b else "-"
    def ms(v, f="%.3f"):
        return f % v if v is not None else "-"
    fl, fa = r.get("decode_floor_ms"), r.get("decode_floor_all_weights_ms")
    gb, gs = r.get("prefill_gemm_floor_ms"), r.get("prefill_gemm_floor_sustained_ms")
    dg = r.get("decode_gemm_floor_ms")
    print("%s batch %d, %d in, %d out, graphs %s: ITL p50 %.3f p99 %.3f ms = %s / %s the decode floor %s, "
          "%s / %s the all-weights floor %s, %s the decode GEMM floor %s; prefill p50 %.1f ms = %s the GEMM floor %s (burst), %s the sustained %s; "
          "%.1f decode tok/s" % (
              r["arch"], r["batch"], r["input_len"], r["output_len"], r["cuda_graphs"], i["p50"], i["p99"],
              x(i["p50"], fl), x(i["p99"], fl), ms(fl), x(i["p50"], fa), x(i["p99"], fa), ms(fa), x(i["p50"], dg), ms(dg),
              p, x(p, gb), ms(gb, "%.1f"), x(p, gs), ms(gs, "%.1f"), r.get("decode_tokens_per_s") or 0))
PY
}

# latency OUTFILE ARGS...: one `bench latency --device cuda --json` run of
# this build (LAT_BIN: another binary), then its line.
latency() {
local f=$1; shift
log "bench latency $* (${LAT_BIN:-.gpu/trigon})"
if "${LAT_BIN:-.gpu/trigon}" bench latency --device cuda --json "$@" >"$f" 2>>"$OUT/bench.err"; then
  latency_line "$f"
else
  echo "rc=$?" | say; tail -3 "$OUT/bench.err" | say
fi
}

# cuda_tests: every backend/cuda test into cuda-tests.log (the verdict, the
# pass and skip counts, any failures), then compute-sanitizer's memcheck
# over the norm, RoPE, prefill add, decode/mixed/prefix attention (over
# bf16, int8, fp8 and int4 caches) and a wgmma prefill case (at most
# 150 s). Returns the tests' status.
cuda_tests() {
log "backend/cuda: every test"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.timeout 6m >"$OUT/cuda-tests.log" 2>&1)
local rc=$?
echo "rc=$rc" | say
grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/cuda-tests.log" | tail -8 | say
grep -c -- "--- PASS" "$OUT/cuda-tests.log" | sed 's/^/passed (tests and subtests): /' | say
grep -c -- "--- SKIP" "$OUT/cuda-tests.log" | sed 's/^/skipped: /' | say
grep -E "^\s+--- FAIL" "$OUT/cuda-tests.log" | head -20 | say
log "memcheck"
(cd backend/cuda && timeout 150 compute-sanitizer --tool memcheck "$root/.gpu/cuda.test" -test.v -test.run \
  'TestAddRMSNorm|TestRoPEStoreKV|TestMatMulAddPrefill/n17|TestAttention/(decode_gqa4_d128|mixed_gqa4_d128|decode_bs8_gqa4_d128|prefill_prefix_gqa8_d128)$|TestAttentionPrefillWG/prefill_bs8_gqa4_d128$|TestAttentionQuant/(int8_g32_mixed_gqa4_d128|fp8_g0_prefix_cached_gqa4_d64|int4_g32_w128_mixed_gqa4_d128|int4_g8_w0_prefix_cached_gqa4_d64)$' \
  >"$OUT/memcheck.log" 2>&1)
echo "memcheck rc=$?" | say
grep -E "ERROR SUMMARY|^(PASS|FAIL)" "$OUT/memcheck.log" | say
# A pattern that matches no test would pass with 0 errors: say how many ran.
grep -c -- "--- PASS" "$OUT/memcheck.log" | sed 's/^/memcheck: tests and subtests passed: /' | say
return $rc
}

# model_tests: the fixture models against transformers and the default
# model GPU against CPU (model/llama), into llama-cuda.log. Returns their
# status.
model_tests() {
log "fixture models and the default model on CUDA (llama.test)"
(cd model/llama && "$root/.gpu/llama.test" -test.run 'TestFixturesCUDA|TestDefaultModelCUDAMatchesCPU|TestDefaultModelQuantizedCUDAMatchesCPU|TestTensorParallelCUDA|TestSpeculativeCUDA|TestKQuant' -test.timeout 8m -test.v >"$OUT/llama-cuda.log" 2>&1)
local rc=$?
echo "rc=$rc" | say
grep -E "worst|near tie|^(--- FAIL|--- PASS|--- SKIP|FAIL|PASS)" "$OUT/llama-cuda.log" | say
return $rc
}

# bigref: a Llama-3-8B-shaped model with random weights written by
# transformers (tools/bigref/bigref.py, reused if this machine made it),
# then trigon on CUDA against its logits and greedy tokens (TestBigRef).
bigref() {
log "Llama-3-8B-shaped model: transformers reference"
if [[ -f /tmp/bigref/.complete ]]; then
  echo "reusing /tmp/bigref (this machine made it earlier)" | say
else
  rm -rf /tmp/bigref
  PYTHONUNBUFFERED=1 $PY tools/bigref/bigref.py /tmp/bigref 2>&1 | tee "$OUT/bigref-py.log" | tail -8 | say
  [[ ${PIPESTATUS[0]} == 0 ]] && touch /tmp/bigref/.complete
fi
log "Llama-3-8B-shaped model: trigon on CUDA against transformers"
(cd model/llama && TRIGON_BIGREF=/tmp/bigref TRIGON_BIGREF_OUT="$OUT/bigref.json" "$root/.gpu/llama.test" -test.run 'TestBigRef' -test.v -test.timeout 8m >"$OUT/bigref-go.log" 2>&1)
echo "rc=$?" | say
grep -E "loaded|short|batch [0-9]|near tie|FAIL|PASS|Error|error" "$OUT/bigref-go.log" | head -30 | say
}

# graphs: the graph capture tests, then the default model's greedy text
# with decode graphs on and off (they must match).
graphs() {
log "graph tests; trigon run --cuda-graphs on against off"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run 'TestGraph' -test.v >"$OUT/graph-tests.log" 2>&1)
echo "rc=$?" | say; grep -E "^(--- |FAIL|PASS|ok)" "$OUT/graph-tests.log" | tail -5 | say
local p='func reverse(s string) string {'
.gpu/trigon run --device cuda --cuda-graphs on --temperature 0 --max-tokens 64 "$p" >"$OUT/run-graphs.txt" 2>"$OUT/run-graphs.err"; echo "rc=$?" | say
.gpu/trigon run --device cuda --cuda-graphs off --temperature 0 --max-tokens 64 "$p" >"$OUT/run-nographs.txt" 2>"$OUT/run-nographs.err"
if cmp -s "$OUT/run-graphs.txt" "$OUT/run-nographs.txt"; then echo "graphs on/off greedy text identical" | say; else echo "graphs on/off greedy text differ" | say; fi
tail -1 "$OUT/run-graphs.err" | say
}

# default_model: the embedded model on CUDA and on the CPU, greedy (a
# difference is reported: near ties may part them), then one sampled run.
default_model() {
log "default model: trigon run, cuda vs cpu, greedy, and with default sampling"
local p='func reverse(s string) string {'
.gpu/trigon run --device cuda --temperature 0 --max-tokens 64 "$p" >"$OUT/dm-cuda.txt" 2>"$OUT/dm-cuda.err"; echo "rc=$?" | say
.gpu/trigon run --device cpu --temperature 0 --max-tokens 64 "$p" >"$OUT/dm-cpu.txt" 2>"$OUT/dm-cpu.err"
if cmp -s "$OUT/dm-cuda.txt" "$OUT/dm-cpu.txt"; then echo "cuda and cpu greedy text identical" | say; else echo "cuda and cpu greedy text differ" | say; fi
tail -1 "$OUT/dm-cuda.err" | say; tail -1 "$OUT/dm-cpu.err" | say
.gpu/trigon run --device cuda --max-tokens 96 --seed 1 "$p" 2>/dev/null | say
}

# serve_smoke: trigon serve on the default model: a completion, a
# streamed completion, the metrics, and a SIGTERM drain (exit status 0).
serve_smoke() {
log "trigon serve --device cuda: completion, stream, metrics, SIGTERM drain"
.gpu/trigon serve --device cuda --port 8011 >"$OUT/serve.log" 2>&1 &
local pid=$! i
for i in $(seq 100); do curl -sf localhost:8011/health >/dev/null && break; sleep 0.2; done
curl -s localhost:8011/v1/completions -H 'Content-Type: application/json' \
  -d '{"prompt":"func reverse(s string) string {","max_tokens":32,"temperature":0}' | say; echo | say
curl -sN localhost:8011/v1/completions -H 'Content-Type: application/json' \
  -d '{"prompt":"package main","max_tokens":8,"stream":true,"seed":3}' | tail -3 | say
curl -s localhost:8011/metrics | grep -E '^trigon_(generation_tokens_total|prompt_tokens_total|kv_cache_usage_perc)' | say
kill -TERM "$pid"; wait "$pid"; echo "serve exit=$?" | say
}

# peers: trigon (graphs off and on) against the PyTorch peers on ARCH
# (default llama-3-8b), batch 4, 2048-token prompts, 128 output tokens,
# after the gpt-fast model's self-test; compare.py's table, then trigon's
# ratios against the floors of its own run.
peers() {
local arch=${ARCH:-llama-3-8b}
log "peers, same shapes, same call: trigon graphs off/on, gpt-fast style, HF eager and static+compile ($arch)"
$PY bench/peers/selftest.py --device cuda 2>&1 | tail -2 | say
local a=(--arch "$arch" --batch 4 --input-len 2048 --output-len 128)
.gpu/trigon bench latency --device cuda "${a[@]}" --cuda-graphs both --json >"$OUT/trigon.json" 2>>"$OUT/peers.err"; echo "trigon rc=$?" | say
PYTHONUNBUFFERED=1 timeout "${GPTFAST_TIMEOUT:-300}" $PY bench/peers/gptfast_peer.py "${a[@]}" >"$OUT/gptfast.jsonl" 2>>"$OUT/peers.err"; echo "gptfast rc=$?" | say
PYTHONUNBUFFERED=1 timeout "${HF_TIMEOUT:-240}" $PY bench/peers/hf_peer.py "${a[@]}" >"$OUT/hf.jsonl" 2>>"$OUT/peers.err"; echo "hf rc=$?" | say
$PY bench/peers/compare.py --markdown "$OUT/trigon.json" "$OUT/gptfast.jsonl" "$OUT/hf.jsonl" 2>&1 | say
latency_line "$OUT/trigon.json"
}

# qwen3_peers: the peers at qwen3-8b; a llama-3-8b peers run of the same
# call keeps its files as llama-*.
qwen3_peers() {
local f
for f in trigon.json gptfast.jsonl hf.jsonl; do [[ -f $OUT/$f ]] && mv "$OUT/$f" "$OUT/llama-$f"; done
ARCH=qwen3-8b peers
}

# bench_rows: the llama-3-8b decode rows at BATCHES (default "1 4 64"),
# 2048-token prompts, 64 output tokens, graphs off then on.
bench_rows() {
local n
for n in ${BATCHES:-1 4 64}; do
  latency "$OUT/bench-$n.json" --arch llama-3-8b --batch "$n" --input-len 2048 --output-len 64 --cuda-graphs both
done
}

# rows_long: long context, batch 16 at 32768-token prompts (64 GiB of KV),
# graphs on, one warm-up and two timed iterations.
rows_long() {
latency "$OUT/bench-long-16.json" --arch llama-3-8b --batch 16 --input-len 32768 --output-len 64 \
  --warmup 1 --iters 2 --cuda-graphs on
}

# kv_rows: the quantized KV cache's rows (docs/kv-cache.md): batch 16 at
# 32768-token prompts and batch 4 at 2048, bf16 then each quantized format
# (KV_DTYPES, default "fp8 int8 int4"; int4 with its default window of
# 128), one process each, graphs on.
kv_rows() {
local dt
for dt in bf16 ${KV_DTYPES:-fp8 int8 int4}; do
  latency "$OUT/bench-kv-$dt-16x32k.json" --arch llama-3.1-8b --batch 16 --input-len 32768 --output-len 33 \
    --warmup 0 --iters 1 --cuda-graphs on --kv-cache-dtype "$dt"
  latency "$OUT/bench-kv-$dt-4x2k.json" --arch llama-3.1-8b --batch 4 --input-len 2048 --output-len 128 \
    --cuda-graphs on --kv-cache-dtype "$dt"
done
}

# wq_rows: the quantized weight formats beside bf16 in one call, Llama-3-8B
# shape, 2048-token prompts, graphs on: each format's decode step against
# its own floor (packed weights + KV at the copy ceiling of the same run)
# and its prefill of BATCH x 2048 against bf16's; then AWQ weights with the
# int8 KV cache (the design's deployment) at batch 4.
wq_rows() {
local dt n
for n in ${WQ_BATCHES:-1 4 16}; do
  for dt in bf16 ${WQ_DTYPES:-awq4_g128 fp8 q4_k}; do
    latency "$OUT/bench-wq-$dt-$n.json" --arch llama-3-8b --dtype "$dt" --batch "$n" --input-len 2048 \
      --output-len 64 --iters 2 --cuda-graphs on --sustained-probe 0
  done
done
latency "$OUT/bench-wq-awq-int8kv-4.json" --arch llama-3-8b --dtype awq4_g128 --kv-cache-dtype int8 --batch 4 \
  --input-len 2048 --output-len 64 --iters 2 --cuda-graphs on --sustained-probe 0
}

# spec_verify: bench latency with a speculative config times the target's
# verify step of k draft tokens against a decode step timed alike.
spec_verify() {
local n
for n in 1 4; do
  log "bench latency llama-3-8b batch $n, verify k=4 against decode"
  .gpu/trigon bench latency --device cuda --arch llama-3-8b --batch "$n" --input-len 2048 --output-len 64 \
    --cuda-graphs on --sustained-probe 0 --speculative-config '{"method": "ngram", "num_speculative_tokens": 4}' \
    >"$OUT/spec-verify-$n.txt" 2>>"$OUT/bench.err"
  echo "rc=$?" | say
  grep -i -E "verify|decode step|ITL" "$OUT/spec-verify-$n.txt" | head -8 | say
done
}

# gemv_check: the decode GEMVs' tests (register and bulk-copy variants,
# the fused products built on them, 1 to 32 rows), then
# BenchmarkMatMulDecode's graph-timed 8B products with the tuner's choices.
gemv_check() {
log "backend/cuda: GEMV tests"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.timeout 4m -test.run \
  'TestGEMV|TestMatMul$|TestMatMulAdd|TestFusedQKVRoPE|TestLaunchEarly|TestGateUpSiLU|TestBulkFusedRows' >"$OUT/gemv-check.log" 2>&1)
echo "rc=$?" | say
grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/gemv-check.log" | tail -6 | say
grep -c -- "--- PASS" "$OUT/gemv-check.log" | sed 's/^/passed (tests and subtests): /' | say
grep -E "^\s+--- FAIL" "$OUT/gemv-check.log" | head -20 | say
log "BenchmarkMatMulDecode (graph-timed 8B products)"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.run XXX -test.bench 'BenchmarkMatMulDecode/graph' -test.benchtime 20x >"$OUT/gemv-bench.log" 2>&1)
grep -E "^Benchmark|\[(4|16|20|32),|FAIL" "$OUT/gemv-bench.log" | say
}

# spec_forms: the verify step's two forms (runner/verify.go), timed by the
# runner and as bench latency's verify steps: the default model at batch 1
# with k 4 and 8 after SPEC_CTX-token prompts (default 512), then the 8B
# shape at batch 1 and 4 with k 4.
spec_forms() {
local row m b k arch f
for row in default:1:4 default:1:8 llama-3-8b:1:4 llama-3-8b:4:4; do
  IFS=: read -r m b k <<<"$row"
  arch=(--arch llama-3-8b)
  [[ $m == default ]] && arch=(--model models/default/trigon-go.q8_0.gguf)
  f="$OUT/spec-forms-$m-b$b-k$k.txt"
  log "bench latency ${arch[*]} --batch $b --input-len ${SPEC_CTX:-512} --output-len 64, verify k=$k"
  .gpu/trigon bench latency --device cuda "${arch[@]}" --batch "$b" --input-len "${SPEC_CTX:-512}" --output-len 64 \
    --cuda-graphs on --sustained-probe 0 --speculative-config "{\"method\": \"ngram\", \"num_speculative_tokens\": $k}" \
    >"$f" 2>>"$OUT/bench.err"
  echo "rc=$?" | say
  grep -E "verify|decode step" "$f" | head -6 | say
done
}

# wq_bench: the weight-quantized decode products at the 8B shapes, graph
# timed, at each Tuning.WQDecodeKSplit / WQDecodeWaves (WQWaves for 32 rows)
# of BenchmarkMatMulWQuant.
wq_bench() {
log "BenchmarkMatMulWQuant"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run XXX -test.bench 'BenchmarkMatMulWQuant' -test.benchtime 20x >"$OUT/wq-bench.log" 2>&1)
echo "rc=$?" | say
grep -E "^Benchmark|FAIL|panic" "$OUT/wq-bench.log" | say
}

# wq_tests: the weight-quantized products' GPU tests (the AWQ4 device
# layout, the 1-16-row decode kernels at every tuning, the CUDA-core
# fallbacks), then the default model quantized, CUDA against CPU.
wq_tests() {
log "backend/cuda: the quantized-weight tests"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.timeout 8m -test.run \
  'TestWQuantKernelsCompile|TestF8ActQuant|TestAWQReadBack|TestMatMulWQuant|TestWQDecodeTunings|TestAWQGemvCUDACores|TestF8GemvCUDACores|TestKernelsWaitForPredecessor|TestAWQRepack|TestWQuantCodes' \
  >"$OUT/wq-tests.log" 2>&1)
echo "rc=$?" | say
grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/wq-tests.log" | tail -12 | say
grep -c -- "--- PASS" "$OUT/wq-tests.log" | sed 's/^/passed (tests and subtests): /' | say
grep -E "^\s+--- FAIL|_test.go:[0-9]+:" "$OUT/wq-tests.log" | head -20 | say
log "model/llama: TestDefaultModelQuantizedCUDAMatchesCPU"
(cd model/llama && "$root/.gpu/llama.test" -test.v -test.run 'TestDefaultModelQuantizedCUDAMatchesCPU' >"$OUT/wq-llama.log" 2>&1)
echo "rc=$?" | say
grep -E "relative|^(--- FAIL|--- PASS|FAIL|PASS)|^\s+--- (FAIL|PASS)" "$OUT/wq-llama.log" | head -12 | say
}

# f8_plan: whether the FP8 products of prefill-sized rows run on cuBLASLt's
# FP8 GEMM (TestF8GemmPlan), and why not.
f8_plan() {
log "backend/cuda: TestF8GemmPlan"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.run 'TestF8GemmPlan' >"$OUT/f8-plan.log" 2>&1)
echo "rc=$?" | say
grep -E "FP8 GEMM|^(--- FAIL|--- PASS|FAIL|PASS)|^\s+--- (FAIL|PASS)" "$OUT/f8-plan.log" | head -20 | say
}

# f8_prefill: the FP8 product of prefill-sized rows against BF16's, and
# its passes alone (BenchmarkF8Prefill).
f8_prefill() {
log "BenchmarkF8Prefill"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run XXX -test.bench 'BenchmarkF8Prefill' -test.benchtime 20x >"$OUT/f8-prefill.log" 2>&1)
echo "rc=$?" | say
grep -E "^Benchmark|FAIL|panic|Error" "$OUT/f8-prefill.log" | say
}

# wq_check: the quantized-weight kernels' GPU tests (the decode kernels at
# every tuning, the CUDA-core fallbacks, the FP8 prefill paths and which one
# each 8B shape takes), then the FP8 prefill and the decode benchmarks,
# stopping before the benchmarks on a failure.
wq_check() {
log "backend/cuda: the quantized-weight tests and TestF8GemmPlan"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.timeout 6m -test.run \
  'TestMatMulWQuant|TestWQDecodeTunings|TestAWQGemvCUDACores|TestF8GemvCUDACores|TestF8ActQuant|TestF8GemmPlan|TestAWQReadBack' \
  >"$OUT/wq-check.log" 2>&1)
local rc=$?
echo "rc=$rc" | say
grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/wq-check.log" | tail -12 | say
grep -c -- "--- PASS" "$OUT/wq-check.log" | sed 's/^/passed (tests and subtests): /' | say
grep -E "^\s+--- FAIL|_test.go:[0-9]+:.*(FAIL|relative error [0-9.e-]+ >|want|Error)" "$OUT/wq-check.log" | head -20 | say
grep -E "cuBLASLt [0-9]+, sm_|FP8 GEMM path" "$OUT/wq-check.log" | head -8 | say
grep -oE "sm_[0-9]+: (cuBLASLt FP8 GEMM|BF16 GEMM of the codes)[^(]*" "$OUT/wq-check.log" | sort | uniq -c | sed 's/^/FP8 prefill cases on: /' | say
if ((rc != 0)); then log "wq_check: tests failed, benchmarks skipped"; return 1; fi
f8_prefill
grep -E "path: |no scaled_gemm" "$OUT/f8-prefill.log" | head -6 | say
wq_bench
}

# gemm_large: Llama-3-8B's products at 128 and 256 rows, cuBLASLt's
# heuristic choice against the tuner's (BenchmarkMatMulLargeBatch).
gemm_large() {
log "BenchmarkMatMulLargeBatch"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run XXX -test.bench 'BenchmarkMatMulLargeBatch' -test.benchtime 20x >"$OUT/gemm-large.log" 2>&1)
echo "rc=$?" | say
grep -E "^Benchmark|FAIL|panic" "$OUT/gemm-large.log" | say
}

# spec_tests: the speculative-decoding GPU tests (greedy identity through
# the engine, graphs off and on; verify-shaped attention from a graph).
spec_tests() {
log "model/llama: TestSpeculativeCUDA; backend/cuda: TestGraphVerifyAttention"
(cd model/llama && "$root/.gpu/llama.test" -test.run 'TestSpeculativeCUDA' -test.v >"$OUT/spec-tests.log" 2>&1)
echo "rc=$?" | say
grep -E "prompts as plain|accepted|^(--- FAIL|--- PASS|FAIL|PASS|ok)|^\s+--- (FAIL|PASS)|Error|graph" "$OUT/spec-tests.log" | head -30 | say
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.run 'TestGraphVerifyAttention|TestFlatVerifyStepRows' >"$OUT/spec-tests-cuda.log" 2>&1)
echo "rc=$?" | say
grep -E "^(--- FAIL|--- PASS|FAIL|PASS|ok)|^\s+--- (FAIL|PASS)|StepKeys 0|relative error" "$OUT/spec-tests-cuda.log" | head -30 | say
}

# fix_tests: the tests that failed on compile errors of the tests' own
# modules, after their fix.
fix_tests() {
log "backend/cuda: TestKVReadersRefuseOtherFormats, TestF8ActQuant"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.timeout 2m -test.run 'TestKVReadersRefuseOtherFormats|TestF8ActQuant' >"$OUT/fix-tests.log" 2>&1)
echo "rc=$?" | say
grep -E "^(--- FAIL|--- PASS|FAIL|PASS|ok)|^\s+--- FAIL" "$OUT/fix-tests.log" | head -12 | say
}

# kv_capacity: the KV capacity `trigon serve` states at load (default
# --gpu-memory-utilization) on dummy Llama-3.1-8B weights, bf16 and each
# of KV_DTYPES (default "fp8 int8 int4"): the tokens, and how many
# 32768-token sequences that is.
kv_capacity() {
local dt pid i
for dt in bf16 ${KV_DTYPES:-fp8 int8 int4}; do
  .gpu/trigon serve --device cuda --port 8015 --load-format dummy --model llama-3.1-8b --max-model-len 32768 \
    --max-num-batched-tokens 8192 --kv-cache-dtype "$dt" >"$OUT/capacity-$dt.log" 2>&1 &
  pid=$!
  for i in $(seq 600); do grep -q 'model loaded' "$OUT/capacity-$dt.log" && break; sleep 0.2; done
  grep -m1 -o 'kv_capacity_tokens=[0-9]*' "$OUT/capacity-$dt.log" | cut -d= -f2 | \
    awk -v dt="$dt" '{printf "kv capacity %s: %d tokens = %.1f sequences of 32768\n", dt, $1, $1/32768}' | say
  kill -TERM "$pid"; wait "$pid"
done
}

# kv_attn_bench: BenchmarkAttentionDecodeQuant, decode attention over
# bf16, fp8, int8 and int4 caches (16 x 32k, 4 x 2k), graph-timed.
kv_attn_bench() {
log "BenchmarkAttentionDecodeQuant"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run XXX -test.bench 'BenchmarkAttentionDecodeQuant' -test.benchtime 20x >"$OUT/kv-attn-bench.log" 2>&1)
echo "rc=$?" | say
grep -E "^Benchmark|FAIL|panic" "$OUT/kv-attn-bench.log" | say
grep -E "blocks an SM" "$OUT/kv-attn-bench.log" | sed 's/^ *//' | sort -u | say
}

# kv_attn_stalls: ncu's warp-state, scheduler, memory and occupancy
# sections for attn_decode_mma over the bf16 and int4 caches at 16 x 32k
# (BenchmarkAttentionDecodeQuant's cases, one benchmark iteration each),
# into kv-attn-stalls.log, and the lines that compare them.
kv_attn_stalls() {
local ncu dt
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for dt in bf16 int4; do
  log "ncu: attn_decode_mma over the $dt cache at 16 x 32k: stall reasons, memory, occupancy"
  (cd backend/cuda && timeout "${NCU_TIMEOUT:-200}" "$ncu" --graph-profiling node --kernel-name regex:attn_decode_mma --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    "$root/.gpu/cuda.test" -test.run XXX -test.bench "BenchmarkAttentionDecodeQuant/^${dt}_b16_ctx32768\$" -test.benchtime 1x \
    >"$OUT/kv-attn-stalls-$dt.log" 2>&1)
  echo "rc=$?" | say
  grep -E "attn_decode_mma|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|No Eligible|Issued Warp|Eligible Warps|Active Warps Per|Stall|L1/TEX Hit|L2 Hit|Block Limit|Dynamic Shared|Grid Size|Block Size" "$OUT/kv-attn-stalls-$dt.log" | head -45 | say
  # The stall reasons, largest first (cycles a warp waits per instruction issued).
  grep -E "smsp__average_warps_issue_stalled_" "$OUT/kv-attn-stalls-$dt.log" | awk '{print $NF, $1}' | sort -gr | head -10 | say
done
}

# kv_attn_source: ncu's source counters of attn_decode_mma over the int4
# cache (16 x 32k and 4 x 2k) and the bf16 cache at 4 x 2k: instructions
# executed and stall samples per SASS instruction (kv-attn-source-CASE.csv)
# with the warp-state and scheduler sections, and the instructions a tile
# (the main loop's executed instructions over the launch's tiles).
kv_attn_source() {
local ncu c rep
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for c in ${KV_SRC_CASES:-int4_b16_ctx32768 int4_b4_ctx2048 bf16_b4_ctx2048}; do
  rep=/tmp/kvsrc-$c
  log "ncu: attn_decode_mma source counters, $c"
  (cd backend/cuda && timeout "${NCU_TIMEOUT:-200}" "$ncu" --graph-profiling node --kernel-name regex:attn_decode_mma --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters --section LaunchStats --import-source no -f -o "$rep" \
    "$root/.gpu/cuda.test" -test.run XXX -test.bench "BenchmarkAttentionDecodeQuant/^${c}\$" -test.benchtime 1x \
    >"$OUT/kv-attn-source-$c.log" 2>&1)
  echo "rc=$?" | say
  "$ncu" -i "$rep.ncu-rep" --print-details all >>"$OUT/kv-attn-source-$c.log" 2>&1
  "$ncu" -i "$rep.ncu-rep" --page source --csv --print-source sass >"$OUT/kv-attn-source-$c.csv" 2>"$OUT/kv-attn-source-$c.err" || echo "source page rc=$?" | say
  grep -E "Duration|DRAM Throughput|Issued Warp|No Eligible|Eligible Warps|Executed Ipc|Grid Size|Registers Per|Warp Cycles Per Issued" "$OUT/kv-attn-source-$c.log" | head -12 | say
  python3 - "$OUT/kv-attn-source-$c.csv" <<'PY' 2>&1 | say
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = None
for i, r in enumerate(rows):
    if any("Instructions Executed" in x for x in r):
        hdr, body = r, rows[i + 1:]
        break
if hdr is None:
    sys.exit("no source rows: " + " | ".join(",".join(r)[:200] for r in rows[:4]))
ie = [j for j, x in enumerate(hdr) if x.strip() == "Instructions Executed"]
ie = ie[0] if ie else [j for j, x in enumerate(hdr) if "Instructions Executed" in x][0]
src = [j for j, x in enumerate(hdr) if x.strip() in ("Source", "SASS")][0]
st = [j for j, x in enumerate(hdr) if "Warp Stall Sampling (All" in x]
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
tot = sum(num(r[ie]) for r in body if len(r) > ie)
hmma = sum(num(r[ie]) for r in body if len(r) > ie and "HMMA" in r[src])
print("executed warp instructions %.0f, HMMA %.0f (32 a 16-token tile: %.0f tiles): %.0f instructions a tile" % (tot, hmma, hmma / 32, tot / max(1, hmma / 32)))
ops = collections.Counter()
for r in body:
    if len(r) > ie:
        o = r[src].strip().split()
        o = [w for w in o if not w.startswith("@")]
        if o: ops[o[0].split(".")[0]] += num(r[ie])
print("by opcode (a tile):", ", ".join("%s %.0f" % (k, v / max(1, hmma / 32)) for k, v in ops.most_common(24)))
if st:
    top = sorted(body, key=lambda r: -num(r[st[0]]) if len(r) > st[0] else 0)[:12]
    print("most stall samples:", " | ".join("%s %s" % (r[src].strip()[:48], r[st[0]]) for r in top))
PY
done
}

# kv_int4_ab: the int4 row at 16 x 32k, SPEC_BIN_B's build then this one.
kv_int4_ab() {
local b
for b in ${SPEC_BIN_B:-} .gpu/trigon; do
  LAT_BIN=$b latency "$OUT/bench-kv-int4-16x32k-$(basename "$b").json" --arch llama-3.1-8b --batch 16 --input-len 32768 \
    --output-len 33 --warmup 0 --iters 1 --cuda-graphs on --kv-cache-dtype int4
done
}

# spec_rows_b: spec_rows again with SPEC_BIN_B's server (its files tagged -b).
spec_rows_b() { SPEC_BIN=$SPEC_BIN_B SPEC_TAG=-b spec_rows; }

# spec_ab: spec_rows for this build and SPEC_BIN_B in turn, at each
# concurrency of SPEC_CONCS (default 1 4); files tagged -cN and -cNb.
spec_ab() {
local c
for c in ${SPEC_CONCS:-1 4}; do
  SPEC_CONC=$c SPEC_TAG=-c$c spec_rows
  SPEC_CONC=$c SPEC_BIN=$SPEC_BIN_B SPEC_TAG=-c${c}b spec_rows
done
}

# spec_warm_8b: how long a speculating server's load takes on the 8B shape
# (dummy weights, prompt lookup k 12), this build and SPEC_BIN_B: the
# "verify graphs warmed" line of each, and the whole load.
spec_warm_8b() {
local b pid i f t0
for b in .gpu/trigon ${SPEC_BIN_B:-}; do
  f="$OUT/spec-warm-8b-$(basename "$b").log"
  log "spec_warm_8b: $b serve --load-format dummy --model llama-3-8b, prompt lookup k 12"
  t0=$SECONDS
  "$b" serve --device cuda --port 8017 --load-format dummy --model llama-3-8b --max-model-len 8192 \
    --speculative-config '{"method": "ngram", "num_speculative_tokens": 12}' >"$f" 2>&1 &
  pid=$!
  for i in $(seq 900); do curl -sf localhost:8017/health >/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.2; done
  echo "up after $((SECONDS - t0))s" | say
  grep -E "verify graphs warmed|decode shapes warmed|model loaded|kernels prepared|error" "$f" | cut -c1-300 | say
  kill -TERM $pid; wait $pid
done
}

# new_tests: the GPU tests of this milestone's new kernels and paths, in
# priority order, for a call with little device time: quantized KV,
# format builds, quantized weights, speculative decoding's graphs and the
# sampling tests an earlier failure could have hidden, TP's CUDA pieces;
# then the model-level TP, speculative and K-quant tests, then the
# quantized decode attention benchmark at 16 x 32k.
new_tests() {
log "backend/cuda: the new kernels' tests"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.timeout 4m -test.run \
  'TestAttentionQuant|TestRoPEStoreKVQuant|TestRoPEStoreKVInt4|TestKVReadersRefuseOtherFormats|TestMatMulWQuant|TestWQDecodeTunings|TestAWQReadBack|TestAWQGemvCUDACores|TestF8GemvCUDACores|TestF8ActQuant|TestWQuantCodes|TestKQuant|TestGraphVerifyAttention|TestSampleTo|TestSmallCopies|TestEmbedShard|TestNCCL|TestLaunchEarly' \
  >"$OUT/new-cuda.log" 2>&1)
echo "rc=$?" | say
grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/new-cuda.log" | tail -12 | say
grep -c -- "--- PASS" "$OUT/new-cuda.log" | sed 's/^/passed (tests and subtests): /' | say
grep -E "^\s+--- FAIL" "$OUT/new-cuda.log" | head -20 | say
log "model/llama: TP, speculative, K-quant"
(cd model/llama && "$root/.gpu/llama.test" -test.v -test.timeout 3m -test.run 'TestTensorParallelCUDA|TestSpeculativeCUDA|TestKQuant' >"$OUT/new-llama.log" 2>&1)
echo "rc=$?" | say
grep -E "^(--- FAIL|--- PASS|--- SKIP|FAIL|PASS)|of 40 prompts|departs" "$OUT/new-llama.log" | head -24 | say
log "BenchmarkAttentionDecodeQuant bf16, fp8, int8, int4 at 16 x 32k"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run XXX -test.bench 'BenchmarkAttentionDecodeQuant/(bf16|fp8|int8|int4)_b16_ctx32768' -test.benchtime 10x >"$OUT/new-bench.log" 2>&1)
grep -E "^Benchmark|FAIL" "$OUT/new-bench.log" | say
}

# kv_tests: the KV format tests (kv_check).
kv_tests() { kv_check; }

# kv_check: the KV formats' kernels (bf16, fp8, int8, int4) against the
# CPU (a subset of cuda_tests, for iterating on them; TestRoPEStoreKV
# matches TestRoPEStoreKVQuant and TestRoPEStoreKVInt4), the quantized
# modules' builds, then the default model through the runner with every
# KV format (TestKVCacheDTypesCUDA), the fixtures and the default model.
kv_check() {
log "backend/cuda: KV cache format tests"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.v -test.timeout 5m -test.run \
  'TestRoPEStoreKV|TestAttentionQuant|TestDecodePlan|TestAttention$|TestGraphVerifyAttention|TestFlatVerifyStepRows|TestFusedQKVRoPE|TestKVReadersRefuseOtherFormats|TestCheckKVSpec|TestKernelsCompile|TestKernelsWaitForPredecessor' \
  >"$OUT/kv-check.log" 2>&1)
local rc=$?
echo "rc=$rc" | say
grep -E "^(--- FAIL|FAIL|PASS|ok)|panic" "$OUT/kv-check.log" | tail -8 | say
grep -c -- "--- PASS" "$OUT/kv-check.log" | sed 's/^/passed (tests and subtests): /' | say
grep -E "^\s+--- FAIL" "$OUT/kv-check.log" | head -20 | say
grep -E "error|Error" "$OUT/kv-check.log" | head -12 | say
log "model/llama: TestKVCacheDTypesCUDA, the fixtures, the default model"
(cd model/llama && "$root/.gpu/llama.test" -test.v -test.timeout 5m -test.run \
  'TestKVCacheDTypesCUDA|TestFixturesCUDA|TestDefaultModelCUDAMatchesCPU' >"$OUT/kv-llama.log" 2>&1)
local rc2=$?
echo "rc=$rc2" | say
grep -E "perplexity|greedy|worst|^(--- FAIL|--- PASS|FAIL|PASS)|panic" "$OUT/kv-llama.log" | head -24 | say
((rc == 0)) && return $rc2
return $rc
}

# rows_large: large batches at the serving issue's shape (192-token
# prompts, 128 output tokens), graphs on.
rows_large() {
local n
for n in ${LARGE_BATCHES:-128 256}; do
  latency "$OUT/bench-large-$n.json" --arch llama-3-8b --batch "$n" --input-len 192 --output-len 128 --cuda-graphs on
done
}

# serve_ab: bench serve against trigon serve on the default model (the
# Llama-3-8B-shaped bigref model has no tokenizer, which the server needs):
# 32 requests of 512 prompt and 128 output tokens, 8 at a time, with the
# serving engine queueing decode steps ahead off and on, alternating, a
# fresh server each run; in the first round four greedy requests at once,
# whose texts must not depend on the setting.
serve_ab() {
local r qa pid i
for r in 1 2; do
  for qa in false true; do
    log "trigon serve --queue-ahead=$qa, bench serve 32 x 512 -> 128, concurrency 8"
    .gpu/trigon serve --device cuda --port 8012 --queue-ahead=$qa >"$OUT/serve-ab.log" 2>&1 &
    pid=$!
    for i in $(seq 300); do curl -sf localhost:8012/health >/dev/null && break; sleep 0.2; done
    .gpu/trigon bench serve --url http://127.0.0.1:8012 --rate inf --num-prompts 32 --max-concurrency 8 \
      --input-len fixed:512 --output-len fixed:128 --json >"$OUT/serve-ab-$r-$qa.json" 2>>"$OUT/serve-ab.err"
    echo "rc=$?" | say
    $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print({k: d.get(k) for k in ("completed","failed","ttft_ms","itl_ms","output_token_throughput")})' "$OUT/serve-ab-$r-$qa.json" 2>&1 | say
    if ((r == 1)); then
      local cp=()
      for i in 1 2 3 4; do
        curl -s -m 60 localhost:8012/v1/completions -H 'Content-Type: application/json' \
          -d "{\"prompt\": \"func reverse$i(s string) string {\", \"max_tokens\": 96, \"temperature\": 0}" >"$OUT/greedy-$qa-$i.json" &
        cp+=($!)
      done
      wait "${cp[@]}"
    fi
    kill -TERM "$pid"; wait "$pid"
  done
done
$PY - "$OUT" <<'PY' 2>&1 | say
import json, sys
out = sys.argv[1]
def text(qa, i):
    try:
        return json.load(open(f"{out}/greedy-{qa}-{i}.json"))["choices"][0]["text"]
    except Exception as e:
        return f"<{e}>"
same = [text("false", i) == text("true", i) for i in range(1, 5)]
print(f"greedy texts with and without --queue-ahead: {sum(same)} of 4 identical")
PY
}

# spec_rows: speculative decoding's speed targets (docs/speculative.md).
# For each run of SPEC_RUNS (SET:METHOD[:K], SET edit or heldout, the
# prompt sets of models/default/prompts/; METHOD none, noqa (none with
# --queue-ahead=false, what a draft model turns off), ngram (prompt lookup,
# n-grams of 2 to 4) or draft (the draft model DRAFT)), a fresh trigon serve
# on the default model, a warm-up of two random-prompt requests (graph
# captures), then bench serve over the set's SPEC_PROMPTS prompts (default
# all 50), one at a time, SPEC_OUT_LEN (default 256) output tokens each,
# greedy (SPEC_PASSES times on the same server, default once; SPEC_CONC
# requests at a time, default 1; SPEC_BIN the server's binary, default
# .gpu/trigon, with SPEC_TAG appended to the set's name in the files); the
# spec_decode counters of /metrics before and after. Each run's
# line and a table at the end give output tok/s, its ratio to the same
# set's none run, TPOT, the acceptance rate and tokens per verify step.
# Then bench latency's verify step (k 4) against a decode step on the
# Llama-3-8B shape at batch 1 and 4 (SPEC_8B=0: not). SPEC_DEVICE (default cuda) lets the
# serve loop run on the CPU, for checking this script.
spec_rows() {
local draft=${DRAFT:-models/default/draft/trigon-go-draft.q8_0.gguf}
local dev=${SPEC_DEVICE:-cuda} port=8016 run set method k cfg name pid i
local runs=(${SPEC_RUNS:-edit:none edit:ngram:4 edit:ngram:8 heldout:none heldout:draft:3 heldout:draft:2 heldout:draft:4 edit:noqa edit:draft:3 heldout:ngram:4})
[[ -f $draft ]] || log "spec_rows: no draft model at $draft (DRAFT=...): its runs will fail"
for run in "${runs[@]}"; do
  if ((SECONDS > ${SKIP_AFTER:-500})); then log "spec_rows: no new run after ${SECONDS}s"; break; fi
  IFS=: read -r set method k <<<"$run"
  local flags=()
  case $method in
  none) name=none ;;
  noqa) name=noqa; flags=(--queue-ahead=false) ;;
  ngram) name=ngram$k; cfg="{\"method\": \"ngram\", \"num_speculative_tokens\": $k, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 4}" ;;
  draft) name=draft$k; cfg="{\"method\": \"draft_model\", \"model\": \"$draft\", \"num_speculative_tokens\": $k}" ;;
  *) log "spec_rows: unknown method in $run"; continue ;;
  esac
  [[ $method == ngram || $method == draft ]] && flags=(--speculative-config "$cfg")
  local f="$OUT/spec-$set${SPEC_TAG:-}-$name"
  log "spec $set${SPEC_TAG:-} $name: ${SPEC_BIN:-.gpu/trigon} serve --device $dev ${flags[*]} (concurrency ${SPEC_CONC:-1})"
  "${SPEC_BIN:-.gpu/trigon}" serve --device "$dev" --port $port "${flags[@]}" >"$f.serve.log" 2>&1 &
  pid=$!
  for i in $(seq 600); do curl -sf localhost:$port/health >/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.2; done
  if ! curl -sf localhost:$port/health >/dev/null; then
    echo "server did not come up" | say; tail -5 "$f.serve.log" | say
    kill -TERM $pid 2>/dev/null; wait $pid; continue
  fi
  .gpu/trigon bench serve --url http://127.0.0.1:$port --rate inf --num-prompts 2 --max-concurrency 1 \
    --input-len fixed:128 --output-len fixed:64 --progress=false --json >/dev/null 2>>"$f.err"
  local np=() pass
  [[ -n ${SPEC_PROMPTS:-} ]] && np=(--num-prompts "$SPEC_PROMPTS")
  # SPEC_PASSES > 1 runs the set again on the same server (spec-SET-NAME-passN):
  # the later passes find every step shape's graphs captured.
  for pass in $(seq ${SPEC_PASSES:-1}); do
    local g=$f
    ((pass > 1)) && g=$f-pass$pass
    curl -s localhost:$port/metrics >"$g.metrics0"
    .gpu/trigon bench serve --url http://127.0.0.1:$port --rate inf --max-concurrency "${SPEC_CONC:-1}" "${np[@]}" \
      --dataset-name custom --dataset-path "models/default/prompts/$set.jsonl" --custom-output-len "${SPEC_OUT_LEN:-256}" \
      --progress=false --json >"$g.json" 2>>"$f.err" || { echo "bench serve rc=$?" | say; tail -3 "$f.err" | say; }
    curl -s localhost:$port/metrics >"$g.metrics1"
    spec_summary "$OUT" "$(basename "$g")"
  done
  kill -TERM $pid; wait $pid
done
spec_summary "$OUT"
local b
[[ ${SPEC_8B:-1} == 1 ]] || return 0
for b in 1 4; do
  latency "$OUT/spec-verify-8b-$b.json" --arch llama-3-8b --batch $b --input-len 512 --output-len 64 \
    --speculative-config '{"method": "ngram", "num_speculative_tokens": 4}'
  python3 - "$OUT/spec-verify-8b-$b.json" <<'PY' 2>&1 | say
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit("no bench latency result: %s" % e)
d = d[-1] if isinstance(d, list) else d  # with graphs both: the graphs-on result, the engine's case
v, p, r = d.get("verify_step_ms") or {}, d.get("verify_decode_step_ms") or {}, d.get("verify_ratio")
print("llama-3-8b batch %d: verify step (k %s, %s form) mean %.3f ms p50 %.3f, decode step mean %.3f ms p50 %.3f: verify / decode %s (target <= 1.15)" % (
    d["batch"], d.get("verify_tokens"), d.get("verify_form", "?"), v.get("mean", 0), v.get("p50", 0), p.get("mean", 0), p.get("p50", 0),
    "%.3f" % r if r else "-"))
PY
done
}

# spec_host_profile: where a speculating server's host time goes. A fresh
# trigon serve on the default model with prompt lookup (k SPEC_K, default
# 8) and --profile-dir, the edit set once to capture its graphs, then the
# set again (SPEC_PROMPTS, default 20) between POST /start_profile and
# /stop_profile: the Go CPU profile and execution trace land in
# $OUT/prof (go tool pprof / go tool trace on the development machine).
spec_host_profile() {
local k=${SPEC_K:-8} port=8017 pid i
local cfg="{\"method\": \"ngram\", \"num_speculative_tokens\": $k, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 4}"
log "spec_host_profile: trigon serve --device cuda --speculative-config $cfg --profile-dir"
.gpu/trigon serve --device cuda --port $port --speculative-config "$cfg" --profile-dir "$OUT/prof" >"$OUT/prof-serve.log" 2>&1 &
pid=$!
for i in $(seq 600); do curl -sf localhost:$port/health >/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.2; done
local set=(--rate inf --max-concurrency 1 --dataset-name custom --dataset-path models/default/prompts/edit.jsonl --custom-output-len 256 --progress=false --json)
.gpu/trigon bench serve --url http://127.0.0.1:$port "${set[@]}" >"$OUT/prof-pass1.json" 2>>"$OUT/prof.err"
curl -s -X POST localhost:$port/start_profile | say; echo | say
curl -s localhost:$port/metrics >"$OUT/spec-edit-prof.metrics0"
.gpu/trigon bench serve --url http://127.0.0.1:$port "${set[@]}" --num-prompts "${SPEC_PROMPTS:-20}" >"$OUT/spec-edit-prof.json" 2>>"$OUT/prof.err"
curl -s localhost:$port/metrics >"$OUT/spec-edit-prof.metrics1"
curl -s -X POST localhost:$port/stop_profile | say; echo | say
kill -TERM $pid; wait $pid
spec_summary "$OUT" spec-edit-prof
ls -la "$OUT/prof" | say
}

# spec_summary DIR [RUN]: one run's line (RUN: DIR/RUN.json and its
# metrics), or without RUN the table of every spec-* run in DIR.
spec_summary() {
python3 - "$@" <<'PY' 2>&1 | say
import glob, json, os, re, sys
out = sys.argv[1]
def counters(path):
    c = {}
    try:
        for line in open(path):
            m = re.match(r'^trigon_spec_decode_(num_drafts|num_draft_tokens|num_accepted_tokens)_total(?:\{[^}]*\})? (\S+)', line)
            if m:
                c[m.group(1)] = float(m.group(2))
            m = re.match(r'^trigon_spec_decode_num_accepted_tokens_per_pos_total\{(?:[^}]*,)?position="(\d+)"[^}]*\} (\S+)', line)
            if m:
                c["pos%s" % m.group(1)] = float(m.group(2))
            m = re.match(r'^trigon_graph_events_total\{(?:[^}]*,)?event="(\w+)"[^}]*\} (\S+)', line)
            if m:
                c["graph_" + m.group(1)] = float(m.group(2))
            m = re.match(r'^trigon_spec_decode_draft_seconds_(sum|count)(?:\{[^}]*\})? (\S+)', line)
            if m:
                c["draft_" + m.group(1)] = float(m.group(2))
    except OSError:
        pass
    return c
def row(name):
    try:
        d = json.load(open(os.path.join(out, name + ".json")))
    except Exception as e:
        return None, "%s: no result (%s)" % (name, e)
    a, b = counters(os.path.join(out, name + ".metrics0")), counters(os.path.join(out, name + ".metrics1"))
    delta = {k: b[k] - a.get(k, 0) for k in b}
    _, sset, meth = name.split("-", 2)  # meth may end in -passN
    r = {"set": sset, "method": meth, "tps": d.get("output_token_throughput") or 0, "completed": d.get("completed"),
         "failed": d.get("failed"), "tpot": (d.get("tpot_ms") or {}).get("p50"), "out": d.get("output_tokens")}
    drafts, toks, acc = delta.get("num_drafts", 0), delta.get("num_draft_tokens", 0), delta.get("num_accepted_tokens", 0)
    r["acc"] = acc / toks if toks else None
    r["per_step"] = 1 + acc / drafts if drafts else None
    r["pos"] = [int(delta[k]) for k in sorted((k for k in delta if k.startswith("pos")), key=lambda k: int(k[3:]))]
    r["drafts"], r["draft_tokens"] = int(drafts), int(toks)
    n = delta.get("draft_count", 0)
    r["draft_ms"] = 1e3 * delta.get("draft_sum", 0) / n if n else None
    # Device time per step kind and mode over the run (bench serve's steps).
    st = d.get("steps") or {}
    r["steps"] = " ".join("%s/%s %.3f p50 %.3f (host %.3f p50 %.3f, n %d)" % (g["kind"], g["mode"], g["device_ms"]["mean"], g["device_ms"].get("p50", 0),
                                                                         g["host_ms"]["mean"], g["host_ms"].get("p50", 0), g["device_ms"]["count"])
                          for g in (st.get("groups") or []) if g["device_ms"]["count"]) or "-"
    r["steps"] += "; host phases (mean/p50) " + " ".join("%s %.3f/%.3f" % (ph["phase"], ph["ms"]["mean"], ph["ms"].get("p50", 0)) for ph in (st.get("host_phases") or []) if ph["ms"]["count"])
    r["steps"] += "; gap %.3f" % (st.get("gap_ms") or {}).get("mean", 0)
    r["steps"] += "; graphs captured %d, evicted %d" % (delta.get("graph_capture", 0), delta.get("graph_eviction", 0))
    try:
        base = json.load(open(os.path.join(out, "spec-%s-none.json" % sset))).get("output_token_throughput")
    except Exception:
        base = None
    r["ratio"] = r["tps"] / base if base else None
    return r, None
def fmt(r):
    f = lambda v, s: s % v if v is not None else "-"
    return "| %s | %s | %d/%s | %.1f | %s | %s | %s | %s | %s | %s | %s |" % (
        r["set"], r["method"], r["completed"] or 0, (r["completed"] or 0) + (r["failed"] or 0), r["tps"],
        f(r["ratio"], "%.2fx"), f(r["tpot"], "%.3f"), f(r["acc"] and 100 * r["acc"], "%.1f%%"),
        f(r["per_step"], "%.2f"), (" ".join(map(str, r["pos"])) + " of %d drafts, %d tokens" % (r["drafts"], r["draft_tokens"])) if r["drafts"] else "-",
        f(r["draft_ms"], "%.3f"), r["steps"])
head = ("| prompts | speculation | completed | output tok/s | vs none | TPOT p50 ms | acceptance | tokens per verify step | "
        "accepted per position | draft ms per step | device ms per step (kind/mode) |\n|---|---|---|---|---|---|---|---|---|---|---|")
if len(sys.argv) > 2:
    r, err = row(sys.argv[2])
    print(err or fmt(r))
else:
    names = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(out, "spec-*.json")) if not os.path.basename(p).startswith("spec-verify"))
    rows = [row(n)[0] for n in names]
    print(head)
    for r in rows:
        if r:
            print(fmt(r))
PY
}

# ncu_kernels CMD...: runs CMD under ncu, every graph node profiled
# alone at the clocks and caches the GPU has (no clock lock, no cache
# flush), one duration a kernel, into $OUT/$ncu_name.csv.
ncu_kernels() {
local ncu
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout "${NCU_TIMEOUT:-240}" "$ncu" --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum \
  --csv --print-units base ${ncu_flags:-} "$@" >"$OUT/$ncu_name.csv" 2>"$OUT/$ncu_name.err"
echo "rc=$?" | say
}

# ncu_steps CSV LABEL:INDEX...: cuts the kernels of CSV into steps, each
# starting at an embedding kernel, and prints the steps named by INDEX
# (Python's: -1 the last) kernel by kernel, summed over kernels of a name.
ncu_steps() {
$PY - "$@" <<'PY' 2>&1 | say
import csv, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
if not rows:
    sys.exit("no kernels in " + sys.argv[1])
h, rows = rows[0], rows[1:]
ki, mi, vi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
ks = [(r[ki], float(r[vi].replace(",", ""))) for r in rows if r[mi] == "gpu__time_duration.sum"]
steps, cur = [], []
for name, ns in ks:
    if name.startswith("embed") and cur:
        steps.append(cur); cur = []
    cur.append((name, ns))
steps.append(cur)
print(f"{len(ks)} kernels, {len(steps)} steps")
for arg in sys.argv[2:]:
    label, idx = arg.split(":")
    st = steps[int(idx)]
    print(f"-- {label} (step {idx}): {len(st)} kernels, {sum(n for _, n in st)/1e3:.1f} us")
    agg = {}
    for name, ns in st:
        short = name.split("(")[0][:60]
        c, t = agg.get(short, (0, 0.0)); agg[short] = (c + 1, t + ns)
    for short, (c, t) in sorted(agg.items(), key=lambda x: -x[1][1]):
        print(f"   {t/1e3:9.1f} us  {c:4d}x  {short}")
PY
}

# spec_profile: the default model's decode step and its verify step of
# 1+SPEC_K rows (prompt lookup's shape), kernel by kernel. bench
# latency's last 18 steps are verify steps, the 18 before them plain
# decode steps.
spec_profile() {
local k=${SPEC_K:-8} ctx=${SPEC_CTX:-128}
log "ncu: default model, batch 1, $ctx-token prompt, decode step against a verify step of 1+$k rows"
ncu_name=spec-ncu ncu_kernels .gpu/trigon bench latency --device cuda --batch 1 --input-len "$ctx" --output-len 4 \
  --iters 1 --warmup 0 --cuda-graphs on --sustained-probe 0 \
  --speculative-config "{\"method\": \"ngram\", \"num_speculative_tokens\": $k}"
ncu_steps "$OUT/spec-ncu.csv" decode:-19 verify:-1
}

# step_profile: one llama-3-8b decode step at PROFILE_BATCH (default 256)
# sequences of 192-token prompts, kernel by kernel (bench latency's
# --profile-steps brackets the prefill and that step).
step_profile() {
local n=${PROFILE_BATCH:-256}
log "ncu: llama-3-8b decode step at batch $n, 192-token prompts"
ncu_name=step-ncu-$n ncu_flags="--profile-from-start off" ncu_kernels .gpu/trigon bench latency --device cuda \
  --arch llama-3-8b --batch "$n" --input-len 192 --output-len 4 --iters 1 --warmup 0 --cuda-graphs on \
  --sustained-probe 0 --profile-steps 1
ncu_steps "$OUT/step-ncu-$n.csv" decode:-1
}

# prefill_attn_bench: the prefill attention kernels alone, graph-timed
# (TFLOP/s counting the causal half).
prefill_attn_bench() {
log "BenchmarkAttentionPrefill (graph-timed)"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run '^$' -test.bench '^BenchmarkAttentionPrefill$' -test.benchtime 20x -test.v >"$OUT/prefill-attn-bench.log" 2>&1)
echo "rc=$?" | say
grep -E "^Benchmark.*/" "$OUT/prefill-attn-bench.log" | awk '{print $1, $3, $4, $5, $6}' | say
}

# ab_old: this build (.gpu/trigon) against an older one (.gpu/trigon_old,
# built by `OLD=<commit> tools/gpu/build.sh`) in one call: bench latency at
# 2048-token prompts, graphs on, for each row of AB_ROWS (arch:batch:output
# tokens; default llama-3-8b at batch 1, 4 and 64 and qwen3-8b at batch 4,
# the output lengths of docs/benchmarks.md's rows), the two builds
# alternating (the order flips every round, so a drift of the machine's
# clock or temperature falls on both), ROUNDS rounds (default 2). Then the
# table: ITL p50 and p99 and prefill p50 of every run, the means per
# build, and new / old. No new run starts after SKIP_AFTER seconds.
ab_old() {
[[ -x .gpu/trigon_old ]] || { log "ab_old: no .gpu/trigon_old in this archive (OLD=<commit> tools/gpu/build.sh)"; return 1; }
sed 's/^/old build: /' .gpu/BUILD_OLD 2>/dev/null | say
local rows order r row arch b o bin f
read -ra rows <<<"${AB_ROWS:-llama-3-8b:1:64 llama-3-8b:4:128 llama-3-8b:64:64 qwen3-8b:4:128}"
for r in $(seq "${ROUNDS:-2}"); do
  if ((r % 2)); then order=(trigon_old trigon); else order=(trigon trigon_old); fi
  for row in "${rows[@]}"; do
    IFS=: read -r arch b o <<<"$row"
    for bin in "${order[@]}"; do
      if ((SECONDS > ${SKIP_AFTER:-500})); then log "ab_old: no new run after ${SECONDS}s"; break 3; fi
      f="$OUT/ab-$r-$arch-b$b-$([[ $bin == trigon_old ]] && echo old || echo new).json"
      log "round $r: $bin bench latency --arch $arch --batch $b --input-len 2048 --output-len $o --cuda-graphs on"
      if ! ".gpu/$bin" bench latency --device cuda --arch "$arch" --batch "$b" --input-len 2048 --output-len "$o" \
        --cuda-graphs on --json >"$f" 2>>"$OUT/bench.err"; then
        tail -3 "$OUT/bench.err" | say; rm -f "$f"
      fi
    done
  done
done
$PY - "$OUT" <<'PY' 2>&1 | say
import glob, json, os, re, statistics, sys
runs = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "ab-*.json"))):
    m = re.match(r"ab-(\d+)-(.+)-b(\d+)-(old|new)\.json$", os.path.basename(f))
    d = json.load(open(f))
    d = d[0] if isinstance(d, list) else d
    key = (m.group(2), int(m.group(3)), d["output_len"])
    runs.setdefault(key, {}).setdefault(m.group(4), []).append(
        (d["itl_ms"]["p50"], d["itl_ms"]["p99"], d["prefill_ms"]["p50"]))
print("| row | metric | old, each run | new, each run | old mean | new mean | new / old |")
print("|---|---|---|---|---|---|---|")
for (arch, batch, out), by in sorted(runs.items()):
    for k, metric in enumerate(("ITL p50 ms", "ITL p99 ms", "prefill p50 ms")):
        o = [v[k] for v in by.get("old", [])]
        n = [v[k] for v in by.get("new", [])]
        mo = statistics.mean(o) if o else None
        mn = statistics.mean(n) if n else None
        each = lambda vs: " / ".join("%.3f" % v for v in vs) or "-"
        mean = lambda v: "%.3f" % v if v is not None else "-"
        ratio = "%.4f" % (mn / mo) if mo and mn else "-"
        print("| %s batch %d, 2048 in, %d out | %s | %s | %s | %s | %s | %s |" % (
            arch, batch, out, metric, each(o), each(n), mean(mo), mean(mn), ratio))
PY
}

# serve_load: issue #28's loads on random Llama-3-8B weights made on the
# device (serve --load-format dummy): 128/128 with 256 in flight, then
# 1024/128 at 8 requests/s, each with the server's step-time histograms;
# beside them bench latency's decode at batch 256 (192-token prompts), the
# runner's speed the server is held to.
serve_load() {
latency "$OUT/latency-256.json" --arch llama-3-8b --batch 256 --input-len 192 --output-len 128 --cuda-graphs on
log "trigon serve --load-format dummy --model llama-3-8b --max-seqs 256 --max-num-batched-tokens 8192"
.gpu/trigon serve --device cuda --port 8013 --load-format dummy --model llama-3-8b --max-seqs 256 \
  --max-num-batched-tokens 8192 >"$OUT/serve-load.log" 2>&1 &
local pid=$! i
for i in $(seq 600); do curl -sf localhost:8013/health >/dev/null && break; sleep 0.2; done
grep -m1 'model loaded' "$OUT/serve-load.log" | say
for load in "inf 256 1000 128" "8 0 200 1024"; do
  read -r rate conc n in <<<"$load"
  log "bench serve --rate $rate --max-concurrency $conc --num-prompts $n --input-len fixed:$in --output-len fixed:128"
  .gpu/trigon bench serve --url http://127.0.0.1:8013 --rate "$rate" --max-concurrency "$conc" --num-prompts "$n" \
    --input-len "fixed:$in" --output-len fixed:128 --token-ids 100-100000 --progress=false --json \
    >"$OUT/serve-load-$rate.json" 2>>"$OUT/serve-load.err" || tail -3 "$OUT/serve-load.err" | say
  $PY - "$OUT/serve-load-$rate.json" <<'PY' 2>&1 | say
import json, sys
d = json.load(open(sys.argv[1]))
d = d[0] if isinstance(d, list) else d
print({k: d.get(k) for k in ("completed", "failed", "output_token_throughput", "ttft_ms", "itl_ms")})
print(json.dumps(d.get("steps"))[:3000])
PY
done
kill -TERM "$pid"; wait "$pid"; echo "serve exit=$?" | say
}

# rows_256: bench latency at batch 256 with 192-token prompts (the serving
# issue's row) and with 16-token prompts (the same step with almost no
# attention), for the split between the projections and the rest.
rows_256() {
latency "$OUT/latency-256-192.json" --arch llama-3-8b --batch 256 --input-len 192 --output-len 128 --cuda-graphs on
latency "$OUT/latency-256-16.json" --arch llama-3-8b --batch 256 --input-len 16 --output-len 64 --cuda-graphs on
}

# serve_budget: 128/128 with 256 in flight (1000 prompts) against a fresh
# server per step token budget (BUDGETS, default "8192 2048 1024"): how the
# budget trades prefill bursts against decode rows at full load.
serve_budget() {
local bt pid i
for bt in ${BUDGETS:-8192 2048 1024}; do
  log "trigon serve --load-format dummy --model llama-3-8b --max-seqs 256 --max-num-batched-tokens $bt; bench serve 128/128, 256 in flight"
  .gpu/trigon serve --device cuda --port 8015 --load-format dummy --model llama-3-8b --max-seqs 256 \
    --max-num-batched-tokens "$bt" >"$OUT/serve-budget-$bt.log" 2>&1 &
  pid=$!
  for i in $(seq 600); do curl -sf localhost:8015/health >/dev/null && break; sleep 0.2; done
  grep -E -m3 'model loaded|kernels prepared|decode shapes warmed' "$OUT/serve-budget-$bt.log" | say
  .gpu/trigon bench serve --url http://127.0.0.1:8015 --rate inf --max-concurrency 256 --num-prompts "${BUDGET_N:-1000}" \
    --input-len fixed:128 --output-len fixed:128 --token-ids 100-100000 --progress=false \
    >"$OUT/serve-budget-$bt.txt" 2>>"$OUT/serve-budget.err" || tail -3 "$OUT/serve-budget.err" | say
  grep -E "^(completed|failed|duration|output throughput)|^(TTFT|ITL) |^(decode|prefill|mixed) |summed|tokens per step" "$OUT/serve-budget-$bt.txt" | say
  kill -TERM "$pid"; wait "$pid"; echo "serve exit=$?" | say
done
}

# serve_sweep: issue #28's rate sweep at 1024/128 on dummy Llama-3-8B
# weights: 2, 4, 8, 16 and 32 requests/s, goodput at TTFT <= 1 s and ITL
# p99 <= 85 ms, the curve as JSON and PNG ($OUT/sweep.png).
serve_sweep() {
log "trigon serve --load-format dummy --model llama-3-8b --max-seqs 256; bench serve --rate ${SWEEP:-2,4,8,16,32}"
.gpu/trigon serve --device cuda --port 8014 --load-format dummy --model llama-3-8b --max-seqs 256 \
  >"$OUT/serve-sweep.log" 2>&1 &
local pid=$! i
for i in $(seq 600); do curl -sf localhost:8014/health >/dev/null && break; sleep 0.2; done
grep -E -m3 'model loaded|kernels prepared|decode shapes warmed' "$OUT/serve-sweep.log" | say
.gpu/trigon bench serve --url http://127.0.0.1:8014 --rate "${SWEEP:-2,4,8,16,32}" --num-prompts "${SWEEP_N:-100}" \
  --input-len fixed:1024 --output-len fixed:128 --token-ids 100-100000 --goodput ttft:1000,itl:85 \
  --plot "$OUT/sweep.png" --progress=false >"$OUT/sweep.txt" 2>>"$OUT/serve-sweep.err" || tail -3 "$OUT/serve-sweep.err" | say
say <"$OUT/sweep.txt"
kill -TERM "$pid"; wait "$pid"; echo "serve exit=$?" | say
}

# serve_mixed_ab: the mixed-step cap and the tuner's end against the old
# build (.gpu/trigon_old), a fresh dummy Llama-3-8B server per run: for each
# of MIXED_RUNS (default "old new2048 new ratio2"; new2048 is this build
# with the budget given, ratio2 with --max-mixed-step-ratio 2), 1,024/128 at 8 requests/s
# (MIXED_N prompts, default 200), then for old and new 128/128 with 256 in
# flight (1,000 prompts) and with 64 in flight (500 prompts). MIXED_LOADS
# picks the loads (default "rate8 full mid"). The load lines say the
# budget, the caps and the tuner's end.
serve_mixed_ab() {
local run bin port=8019 pid i extra load
for load in ${MIXED_LOADS:-rate8 full mid}; do
  for run in ${MIXED_RUNS:-old new2048 new ratio2}; do
    [ $load != rate8 ] && [ $run = new2048 ] && continue
    if ((SECONDS > ${SKIP_AFTER:-500})); then log "serve_mixed_ab: no new run after ${SECONDS}s"; break 2; fi
    bin=.gpu/trigon extra=()
    [ $run = old ] && bin=.gpu/trigon_old
    [ $run = new2048 ] && extra=(--max-num-batched-tokens 2048)
    [ $run = ratio2 ] && extra=(--max-mixed-step-ratio 2)
    log "serve_mixed_ab $load $run: $bin serve --load-format dummy --model llama-3-8b --max-seqs 256 ${extra[*]}"
    $bin serve --device cuda --port $port --load-format dummy --model llama-3-8b --max-seqs 256 "${extra[@]}" \
      >"$OUT/mixed-$load-$run.log" 2>&1 &
    pid=$!
    for i in $(seq 600); do curl -sf localhost:$port/health >/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.2; done
    grep -E 'model loaded|decode shapes warmed|mixed-step|GEMM tuning' "$OUT/mixed-$load-$run.log" | say
    if [ $load = rate8 ]; then
      .gpu/trigon bench serve --url http://127.0.0.1:$port --rate 8 --num-prompts "${MIXED_N:-200}" \
        --input-len fixed:1024 --output-len fixed:128 --token-ids 100-100000 --goodput ttft:1000,itl:85 \
        --progress=false >"$OUT/mixed-$load-$run.txt" 2>>"$OUT/mixed.err" || tail -3 "$OUT/mixed.err" | say
    elif [ $load = mid ]; then
      .gpu/trigon bench serve --url http://127.0.0.1:$port --rate inf --max-concurrency 64 --num-prompts 500 \
        --input-len fixed:128 --output-len fixed:128 --token-ids 100-100000 \
        --progress=false >"$OUT/mixed-$load-$run.txt" 2>>"$OUT/mixed.err" || tail -3 "$OUT/mixed.err" | say
    else
      .gpu/trigon bench serve --url http://127.0.0.1:$port --rate inf --max-concurrency 256 --num-prompts 1000 \
        --input-len fixed:128 --output-len fixed:128 --token-ids 100-100000 \
        --progress=false >"$OUT/mixed-$load-$run.txt" 2>>"$OUT/mixed.err" || tail -3 "$OUT/mixed.err" | say
    fi
    grep -E "^(completed|failed|duration|output throughput|request goodput)|^(TTFT|ITL) |^(decode|prefill|mixed) |summed|idle|tokens per step" "$OUT/mixed-$load-$run.txt" | say
    kill -TERM $pid; wait $pid
  done
done
}

# serve_stalls: what the slow mixed steps of a cold 8 requests/s run are
# (1,024/128, STALL_N prompts, default 200, dummy Llama-3-8B): a fresh
# server with CUDA's default lazy module loading, one with
# CUDA_MODULE_LOADING=EAGER (every kernel of cuBLASLt loaded when the
# library loads), then lazy again under --profile-dir: its Go execution
# trace (go tool trace -pprof=syscall shows the cgo calls' time by stack,
# -pprof=sched the time goroutines waited to run once runnable, -pprof=sync
# the time they blocked on locks and channels: with .gpu/gotrace, a build of
# cmd/trace, these run there into $OUT/{syscall,sched,sync}.pprof). STALL_MODES picks the runs (default "LAZY EAGER PROFILE").
serve_stalls() {
local mode port=8018 pid i
for mode in ${STALL_MODES:-LAZY EAGER PROFILE}; do
  local env=LAZY extra=()
  [ $mode = EAGER ] && env=EAGER
  # The trace of a 25 s run is about 500 MB: too large to come back.
  [ $mode = PROFILE ] && extra=(--profile-dir /tmp/prof)
  log "serve_stalls $mode: CUDA_MODULE_LOADING=$env trigon serve --load-format dummy --model llama-3-8b --max-seqs 256 ${extra[*]}"
  CUDA_MODULE_LOADING=$env .gpu/trigon serve --device cuda --port $port --load-format dummy --model llama-3-8b --max-seqs 256 \
    "${extra[@]}" >"$OUT/stalls-$mode.log" 2>&1 &
  pid=$!
  for i in $(seq 600); do curl -sf localhost:$port/health >/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.2; done
  grep -E -m3 'model loaded|kernels prepared|decode shapes warmed' "$OUT/stalls-$mode.log" | say
  [ $mode = PROFILE ] && { curl -s -X POST localhost:$port/start_profile | say; echo | say; }
  .gpu/trigon bench serve --url http://127.0.0.1:$port --rate 8 --num-prompts "${STALL_N:-200}" \
    --input-len fixed:1024 --output-len fixed:128 --token-ids 100-100000 --goodput ttft:1000,itl:85 \
    --progress=false >"$OUT/stalls-$mode.txt" 2>>"$OUT/stalls.err" || tail -3 "$OUT/stalls.err" | say
  [ $mode = PROFILE ] && { curl -s -X POST localhost:$port/stop_profile | say; echo | say; }
  grep -E "^(completed|duration|output throughput)|^(TTFT|ITL) |^(decode|prefill|mixed) |summed|idle|by phase|tokens per step" "$OUT/stalls-$mode.txt" | say
  kill -TERM $pid; wait $pid
done
ls -la /tmp/prof | say
[ -x .gpu/gotrace ] && for f in /tmp/prof/trace-*.out; do
  for k in syscall sched sync; do .gpu/gotrace -pprof=$k "$f" >"$OUT/$k.pprof" 2>>"$OUT/stalls.err"; done
done
cp /tmp/prof/cpu-*.pprof "$OUT/" 2>/dev/null
}

# final: correctness of the build that is measured (stopping there on a
# failure), then the peers, the batch 1 and 64 rows and the server: what
# the latest figures of docs/benchmarks.md ran.
# tp_tests: the tensor-parallel tests that run on one GPU, and the NCCL
# tests, which skip below two.
tp_tests() {
log "tensor parallelism: backend/cuda (EmbedShard, NCCL)"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run 'TestEmbedShard|TestEmbed$|TestNCCL' -test.v >"$OUT/tp-cuda.log" 2>&1)
echo "rc=$?" | say
grep -E "^(--- FAIL|--- SKIP|--- PASS|FAIL|PASS|ok)|panic" "$OUT/tp-cuda.log" | head -20 | say
log "tensor parallelism: model/llama (TP=1 path, TP=2 on one GPU)"
(cd model/llama && "$root/.gpu/llama.test" -test.run 'TestTensorParallelCUDA' -test.v >"$OUT/tp-llama.log" 2>&1)
echo "rc=$?" | say
grep -E "relative|^(--- FAIL|--- PASS|FAIL|PASS)" "$OUT/tp-llama.log" | say
}

# tp_bench: with NGPU (default: every GPU, at least 2) ranks, bench
# latency at TP=1 and TP=NGPU (llama-3-8b, batch 4, 2048-token prompts),
# NCCL's all-reduce benchmark, and trigon serve of a 70B-shape dummy model
# at TP=NGPU (one completion).
tp_bench() {
local n=${NGPU:-$(nvidia-smi -L | wc -l)}
if ((n < 2)); then log "tp_bench: $n GPU, needs 2"; return 0; fi
latency "$OUT/tp1.json" --arch llama-3-8b --batch 4 --input-len 2048 --output-len 128 --cuda-graphs on
latency "$OUT/tp$n.json" --arch llama-3-8b --batch 4 --input-len 2048 --output-len 128 --cuda-graphs on --tensor-parallel-size "$n"
log "NCCL all-reduce over $n GPUs"
(cd backend/cuda && "$root/.gpu/cuda.test" -test.run XXX -test.bench BenchmarkNCCLAllReduce -test.benchtime 200x >"$OUT/tp-nccl-bench.log" 2>&1)
echo "rc=$?" | say
grep -E "^Benchmark" "$OUT/tp-nccl-bench.log" | say
log "trigon serve --load-format dummy --model llama-3.1-70b --tensor-parallel-size $n"
.gpu/trigon serve --device cuda --load-format dummy --model llama-3.1-70b --tensor-parallel-size "$n" --max-context 4096 --port 8399 >"$OUT/tp-serve.log" 2>&1 &
local pid=$!
for _ in $(seq 1 240); do curl -sf localhost:8399/health >/dev/null && break; sleep 1; done
curl -s localhost:8399/v1/completions -H 'content-type: application/json' -d '{"prompt":"hello","max_tokens":16}' | head -c 400 | say
echo | say
kill -TERM $pid; wait $pid; echo "serve rc=$?" | say
grep -E "loaded|error|Error" "$OUT/tp-serve.log" | head -5 | say
}

final() {
cuda_tests; local rc=$?
model_tests; local rc2=$?
if ((rc != 0 || rc2 != 0)); then log "tests failed: skipping the measurements"; return 1; fi
default_model
peers
BATCHES="1 64" bench_rows
serve_smoke
}

# kq_ppl: the K-quant files of docs/quantization.md's perplexity table,
# written here with this build's padhf and convert, evaluated on CUDA
# (the table's figures are the CPU's on the same files).
kq_ppl() {
local d=/tmp/kq
rm -rf "$d"; mkdir -p "$d"
log "K-quant perplexity on CUDA: the padded default model"
if ! .gpu/padhf models/default/hf "$d/pad512" 512 1024 >>"$OUT/kq.log" 2>&1; then
  echo "padhf failed" | say; tail -3 "$OUT/kq.log" | say; return 1
fi
for t in bf16 q6_k q5_k q4_k_m q4_k; do
  .gpu/trigon convert --type $t --name trigon-go-pad512 "$d/pad512" "$d/pad512.$t.gguf" >>"$OUT/kq.log" 2>&1 || { echo "convert $t failed" | say; continue; }
  echo "$t: $(stat -c %s "$d/pad512.$t.gguf") bytes: $(.gpu/trigon eval perplexity --device cuda -m "$d/pad512.$t.gguf" models/default/heldout.go.txt 2>>"$OUT/kq.log" | tail -1)" | say
done
}

# A part is skipped once SKIP_AFTER seconds (default 500) have passed, so
# that the logs still come back inside the device's 600-second limit.
for part in "${@:-final}"; do
  if ((SECONDS > ${SKIP_AFTER:-500})); then log "skipped $part: ${SECONDS}s gone"; continue; fi
  "$part"
done
log "done in ${SECONDS}s"
# The device tool returns at most 8 files: pack every log into one archive,
# written outside $OUT (tar fails on a folder that changes while it reads it).
(cd "$OUT" && tar -czf /tmp/session-logs.tgz --exclude=summary.txt . &&
  find . -type f ! -name summary.txt -delete && mv /tmp/session-logs.tgz logs.tgz) ||
  echo "packing the logs failed: the device returns only the first 8 files" | say
