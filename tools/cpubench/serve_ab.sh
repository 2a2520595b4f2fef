#!/usr/bin/env bash
# Serving on the CPU with the default model, an old build against a new one
# (docs/benchmarks.md, "Serving", "CPU, old build against new"). Not run by CI.
#
#   tools/cpubench/serve_ab.sh OLD_COMMIT [SCRATCH]   (default scratch /tmp/trigon-serve-ab)
#
# Builds OLD_COMMIT (a detached worktree under SCRATCH) and the working tree,
# then for each of ROUNDS rounds (default 2), old then new, and each load:
# a fresh `trigon serve --device cpu` (the embedded default model) on
# loopback, waits for /health, runs the NEW build's `trigon bench serve`
# against it (the same client for both servers), then SIGTERMs it.
# Loads:
#   short  --rate 4 --num-prompts 50 --input-len uniform:32-128 --output-len fixed:32 --seed 1
#   long   --rate 2 --num-prompts 20 --input-len fixed:768 --output-len fixed:64 --seed 2
#          (long prompts arriving while streams decode)
# Writes SCRATCH/out/ROUND-BUILD-LOAD.{json,log,uptime} and prints a table.
set -euo pipefail
cd "$(dirname "$0")/../.."
old=${1:?usage: serve_ab.sh OLD_COMMIT [SCRATCH]}
scratch=${2:-/tmp/trigon-serve-ab}
rounds=${ROUNDS:-2}
port=${PORT:-8031}
mkdir -p "$scratch/out"
if [ ! -d "$scratch/old" ]; then
	git worktree add --detach "$scratch/old" "$old" >/dev/null
fi
(cd "$scratch/old" && git checkout -q --detach "$old" && go build -o "$scratch/trigon-old" ./cmd/trigon)
go build -o "$scratch/trigon-new" ./cmd/trigon

declare -A load=(
	[short]="--rate 4 --num-prompts 50 --input-len uniform:32-128 --output-len fixed:32 --seed 1"
	[long]="--rate 2 --num-prompts 20 --input-len fixed:768 --output-len fixed:64 --seed 2"
)
url=http://127.0.0.1:$port
run() { # round build load
	local tag=$scratch/out/$1-$2-$3 pid up=
	"$scratch/trigon-$2" serve --device cpu --host 127.0.0.1 --port "$port" >"$tag.log" 2>&1 &
	pid=$!
	for _ in $(seq 300); do
		curl -fs "$url/health" >/dev/null 2>&1 && { up=1; break; }
		kill -0 "$pid" 2>/dev/null || { echo "serve_ab: $2 server exited, see $tag.log" >&2; return 1; }
		sleep 0.2
	done
	[ -n "$up" ] || { kill -TERM "$pid"; echo "serve_ab: $2 server not healthy in 60 s, see $tag.log" >&2; return 1; }
	uptime >"$tag.uptime"
	# shellcheck disable=SC2086 # the load's flags are words
	"$scratch/trigon-new" bench serve --url "$url" ${load[$3]} --progress=false --json >"$tag.json"
	kill -TERM "$pid"
	wait "$pid" || true
}
for r in $(seq "$rounds"); do
	for b in old new; do
		for l in short long; do
			run "$r" "$b" "$l"
			echo "round $r $b $l: $(cat "$scratch/out/$r-$b-$l.uptime")" >&2
		done
	done
done
printf '| load | round | build | completed | output tok/s | TTFT p50 / p99 ms | ITL p50 / p99 / max ms |\n|---|---|---|---|---|---|---|\n'
for l in short long; do
	for r in $(seq "$rounds"); do
		for b in old new; do
			jq -r --arg l "$l" --arg r "$r" --arg b "$b" '"| \($l) | \($r) | \($b) | \(.completed) | \(.output_token_throughput|.*10|round/10) | \(.ttft_ms.p50|.*10|round/10) / \(.ttft_ms.p99|.*10|round/10) | \(.itl_ms.p50|.*100|round/100) / \(.itl_ms.p99|.*10|round/10) / \(.itl_ms.max|.*10|round/10) |"' \
				"$scratch/out/$r-$b-$l.json"
		done
	done
done
printf '\nmeans over the rounds:\n'
for l in short long; do
	for b in old new; do
		jq -rs --arg l "$l" --arg b "$b" 'def m(f): (map(f)|add/length*100|round/100);
			"| \($l) | mean | \($b) | | \(m(.output_token_throughput)) | \(m(.ttft_ms.p50)) / \(m(.ttft_ms.p99)) | \(m(.itl_ms.p50)) / \(m(.itl_ms.p99)) / \(m(.itl_ms.max)) |"' \
			"$scratch"/out/*-"$b-$l.json"
	done
done
grep -h 'model loaded' "$scratch"/out/1-*-short.log | sed 's/.*msg="model loaded"//' >&2
