#!/usr/bin/env bash
# CPU backend against llama.cpp (docs/benchmarks.md, "CPU backend: vector
# kernels"). Not run by CI.
#
#   tools/cpubench/run.sh [SCRATCH [SET]]   (default /tmp/trigon-cpubench, default)
#
# SET is the models measured:
#   default    the default model: q8_0 (the embedded file), f16 and bf16
#              (trigon convert of models/default/hf); 512 prompt tokens,
#              128 generated.
#   synthetic  a 132M-parameter Llama of random weights (tools/cpubench/synthhf
#              over the default model's tokenizer), converted to q8_0, q4_0
#              and f16; 256 prompt tokens, 64 generated.
# TYPES and THREADS (space-separated) pick rows of the set; RUNS, INPUT_LEN
# and OUTPUT_LEN override its defaults. Each row starts once the CPUs are
# idle (QUIET_WAIT below) and prints the load average on stderr.
#
# Needs node and npm: llama.cpp's prebuilt CPU build comes from the npm
# package node-llama-cpp@3.21.1, installed into SCRATCH (outside the repo).
# For each type and thread count it prints trigon's and llama.cpp's prompt
# and generation tok/s, the median of RUNS runs each. llama.cpp refuses the
# tokenizer.ggml.pre trigon convert writes for this tokenizer ("trigon-go"),
# so it reads a copy with "llama-bpe" (setpre); the tensors are the same
# bytes.
set -euo pipefail
cd "$(dirname "$0")/../.."
scratch=${1:-/tmp/trigon-cpubench}
set=${2:-default}
runs=${RUNS:-3}
threads=${THREADS:-1 2}
case $set in
default)
	types=${TYPES:-q8_0 f16 bf16}
	in=${INPUT_LEN:-512} out=${OUTPUT_LEN:-128}
	label="default" prefix="" name=trigon-go-12m ;;
synthetic)
	types=${TYPES:-q8_0 q4_0 f16}
	in=${INPUT_LEN:-256} out=${OUTPUT_LEN:-64}
	label="132M synthetic Llama" prefix="synth-" name=synthetic-llama-132m ;;
*)
	echo "run.sh: unknown set $set (default or synthetic)" >&2
	exit 2 ;;
esac
mkdir -p "$scratch/models"
if [ ! -d "$scratch/node_modules/node-llama-cpp" ]; then
	(cd "$scratch" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm i -E node-llama-cpp@3.21.1 >/dev/null)
fi
cp tools/cpubench/llama_bench.mjs "$scratch/"
go build -o "$scratch/trigon" ./cmd/trigon
src=models/default/hf
if [ "$set" = default ]; then
	cp models/default/trigon-go.q8_0.gguf "$scratch/models/q8_0.gguf"
else
	src=$scratch/models/synth-hf
	[ -f "$src/model.safetensors" ] || go run ./tools/cpubench/synthhf models/default/hf "$src"
fi
for t in $types; do
	f=$scratch/models/$prefix$t.gguf
	[ -f "$f" ] || "$scratch/trigon" convert --type "$t" --name "$name" "$src" "$f" >/dev/null 2>&1
	go run ./tools/cpubench/setpre "$f" "${f%.gguf}.llama.gguf" llama-bpe >/dev/null
done
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# quiet waits (at most QUIET_WAIT seconds, default 180) until the CPUs
# were at least 90% idle over 3 s, so that a row does not start in the
# middle of another process's build on a shared machine; 0 skips it.
quiet() {
	local lim=${QUIET_WAIT:-180} start=$SECONDS idle a b
	[ "$lim" -gt 0 ] && [ -r /proc/stat ] || return 0
	while :; do
		read -ra a < /proc/stat; sleep 3; read -ra b < /proc/stat
		local tot=0
		for i in 1 2 3 4 5 6 7 8; do tot=$((tot + b[i] - a[i])); done
		idle=$((100 * (b[4] - a[4]) / (tot > 0 ? tot : 1)))
		[ "$idle" -ge 90 ] && return 0
		[ $((SECONDS - start)) -ge "$lim" ] && { echo "run.sh: CPUs still busy (${idle}% idle), measuring anyway" >&2; return 0; }
	done
}
echo "| model | threads | trigon prompt tok/s | llama.cpp | trigon generation tok/s | llama.cpp |"
echo "|---|---|---|---|---|---|"
for t in $types; do
	for th in $threads; do
		f=models/$prefix$t
		quiet
		echo "load average before the row: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" >&2
		tr=$(for _ in $(seq "$runs"); do
			"$scratch/trigon" bench latency --device cpu -m "$scratch/$f.gguf" --input-len "$in" --output-len "$out" \
				--threads "$th" --iters 1 --warmup 1 --sustained-probe 0 --json 2>/dev/null
		done)
		lr=$(cd "$scratch" && node llama_bench.mjs "$f.llama.gguf" "$th" "$in" "$out" "$runs" 2>/dev/null | grep '^{')
		tp=$(echo "$tr" | grep -o '"prefill_tokens_per_s": *[0-9.e+]*' | grep -o '[0-9.e+]*$' | median)
		tg=$(echo "$tr" | grep -o '"decode_tokens_per_s": *[0-9.e+]*' | grep -o '[0-9.e+]*$' | median)
		lp=$(echo "$lr" | grep -o '"prompt_tokens_per_s":[0-9.e+]*' | grep -o '[0-9.e+]*$' | median)
		lg=$(echo "$lr" | grep -o '"decode_tokens_per_s":[0-9.e+]*' | grep -o '[0-9.e+]*$' | median)
		printf "| %s %s (%d in / %d out) | %d | %.0f | %.0f | %.1f | %.1f |\n" "$label" "$t" "$in" "$out" "$th" "$tp" "$lp" "$tg" "$lg"
	done
done
