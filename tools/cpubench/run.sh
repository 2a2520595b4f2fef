#!/usr/bin/env bash
# CPU backend against llama.cpp on the default model (docs/benchmarks.md,
# "CPU backend: vector kernels"). Not run by CI.
#
#   tools/cpubench/run.sh [SCRATCH]   (default /tmp/trigon-cpubench)
#
# Needs node and npm: llama.cpp's prebuilt CPU build comes from the npm
# package node-llama-cpp@3.21.1, installed into SCRATCH (outside the repo).
# For each of q8_0 (the embedded model), f16 and bf16 (trigon convert of
# models/default/hf) and 1 and 2 threads it prints trigon's and
# llama.cpp's prompt and generation tok/s, the median of RUNS runs each
# (512 prompt tokens, 128 generated). llama.cpp refuses the model's
# tokenizer.ggml.pre ("trigon-go"), so it reads a copy with "llama-bpe"
# (setpre); the tensors are the same bytes.
set -euo pipefail
cd "$(dirname "$0")/../.."
scratch=${1:-/tmp/trigon-cpubench}
runs=${RUNS:-3}
in=${INPUT_LEN:-512}
out=${OUTPUT_LEN:-128}
mkdir -p "$scratch/models"
if [ ! -d "$scratch/node_modules/node-llama-cpp" ]; then
	(cd "$scratch" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm i -E node-llama-cpp@3.21.1 >/dev/null)
fi
cp tools/cpubench/llama_bench.mjs "$scratch/"
go build -o "$scratch/trigon" ./cmd/trigon
cp models/default/trigon-go.q8_0.gguf "$scratch/models/q8_0.gguf"
for t in f16 bf16; do
	[ -f "$scratch/models/$t.gguf" ] || "$scratch/trigon" convert --type $t --name trigon-go-12m models/default/hf "$scratch/models/$t.gguf" >/dev/null
done
for t in q8_0 f16 bf16; do
	go run ./tools/cpubench/setpre "$scratch/models/$t.gguf" "$scratch/models/$t.llama.gguf" llama-bpe >/dev/null
done
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "| model | threads | trigon prompt tok/s | llama.cpp | trigon generation tok/s | llama.cpp |"
echo "|---|---|---|---|---|---|"
for t in q8_0 f16 bf16; do
	for th in 1 2; do
		tr=$(for _ in $(seq "$runs"); do
			"$scratch/trigon" bench latency --device cpu -m "$scratch/models/$t.gguf" --input-len "$in" --output-len "$out" \
				--threads "$th" --iters 1 --warmup 1 --sustained-probe 0 --json 2>/dev/null
		done)
		lr=$(cd "$scratch" && node llama_bench.mjs "models/$t.llama.gguf" "$th" "$in" "$out" "$runs" 2>/dev/null | grep '^{')
		tp=$(echo "$tr" | grep -o '"prefill_tokens_per_s": *[0-9.e+]*' | grep -o '[0-9.e+]*$' | median)
		tg=$(echo "$tr" | grep -o '"decode_tokens_per_s": *[0-9.e+]*' | grep -o '[0-9.e+]*$' | median)
		lp=$(echo "$lr" | grep -o '"prompt_tokens_per_s":[0-9.e+]*' | grep -o '[0-9.e+]*$' | median)
		lg=$(echo "$lr" | grep -o '"decode_tokens_per_s":[0-9.e+]*' | grep -o '[0-9.e+]*$' | median)
		printf "| default %s (%d in / %d out) | %d | %.0f | %.0f | %.1f | %.1f |\n" "$t" "$in" "$out" "$th" "$tp" "$lp" "$tg" "$lg"
	done
done
