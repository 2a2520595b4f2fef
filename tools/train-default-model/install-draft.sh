#!/usr/bin/env bash
# install-draft.sh puts the draft trained by `device.sh --draft` into the
# tree (docs/speculative.md, "The default model's draft"): it reassembles and
# checks the result archive from the folder the device's files came back to,
# checks that the draft's tokenizer.json is the default model's byte for byte,
# converts the HF directory to models/default/draft/trigon-go-draft.q8_0.gguf,
# copies the training summary, log and samples beside it, and runs the draft
# once on the CPU against the default model.
#
#   tools/train-default-model/install-draft.sh FILES_DIR
set -euo pipefail
[[ $# == 1 && -d $1 ]] || { echo "usage: install-draft.sh FILES_DIR (with result.tar.part-* and result.tar.sha256)" >&2; exit 2; }
src=$(cd "$1" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat "$src"/result.tar.part-* >"$work/result.tar"
(cd "$work" && sed 's|[^ ]*result.tar$|result.tar|' "$src/result.tar.sha256" | sha256sum -c --quiet -)
mkdir "$work/run"
tar -C "$work/run" -xf "$work/result.tar"
hf=$work/run/hf
[[ -f $hf/model.safetensors ]] || { echo "install-draft.sh: no exported model in the archive (see train.log)" >&2; exit 1; }
cmp "$hf/tokenizer.json" models/default/hf/tokenizer.json ||
	{ echo "install-draft.sh: the draft's tokenizer.json is not the default model's" >&2; exit 1; }

dst=models/default/draft
mkdir -p "$dst"
go run ./cmd/trigon convert --type q8_0 --name trigon-go-draft "$hf" "$dst/trigon-go-draft.q8_0.gguf"
cp "$work/run/summary.json" "$dst/train-summary.json"
cp "$work/run/train-log.csv" "$dst/train-log.csv"
[[ -f $work/run/samples.txt ]] && cp "$work/run/samples.txt" "$dst/samples.txt"
ls -l "$dst"
grep -E '"(params|steps|train_seconds|exported_heldout_loss_bf16|heldout_top1_agreement_with_teacher_bf16|heldout_text_ppl)"' "$dst/train-summary.json"

# The draft loads beside the default model and proposes (greedy, CPU).
go run ./cmd/trigon run --device cpu --temperature 0 -n 96 \
	--speculative-config "{\"method\": \"draft_model\", \"model\": \"$dst/trigon-go-draft.q8_0.gguf\", \"num_speculative_tokens\": 3}" \
	"$(head -c 1200 models/default/heldout.go.txt)" >/dev/null
