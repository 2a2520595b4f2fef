#!/usr/bin/env bash
# device.sh is the whole job on the GPU machine, so that one device call does
# it: a smoke run of train.py (tiny data and model, through export and
# evaluation, to fail in seconds rather than after training), the real run, and
# packing of the results into $OUT as at most 15 MiB pieces (the device returns
# files of at most 16 MiB). Extra arguments go to the real run; those that
# choose what is trained (--draft, --no-teacher, --tokenizer DIR, --teacher DIR)
# go to the smoke run too, so that it takes the same path.
#
# Run from the repository root with .gpu/train-default-model carried:
#   bash tools/train-default-model/device.sh                 # the default model
#   bash tools/train-default-model/device.sh --draft         # its draft (docs/speculative.md)
# Reassemble here: cat result.tar.part-* > result.tar && sha256sum -c result.tar.sha256
set -uo pipefail
: "${OUT:?OUT must name the folder whose files come back}"
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true

archive=.gpu/train-default-model/gosrc.tar.xz
heldout=models/default/heldout.go.txt
script=tools/train-default-model/train.py
[[ -f $archive ]] || { echo "device.sh: $archive missing (run prepare.sh, carry .gpu/train-default-model)"; exit 1; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)' | tee -a "$OUT/gpu.txt"

smoke=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
	case ${args[i]} in
	--draft | --no-teacher) smoke+=("${args[i]}") ;;
	--tokenizer | --teacher) smoke+=("${args[i]}" "${args[i + 1]:-}"); i=$((i + 1)) ;;
	--tokenizer=* | --teacher=*) smoke+=("${args[i]}") ;;
	esac
done

rm -rf /tmp/smoke /tmp/run
python3 "$script" --archive "$archive" --heldout-text "$heldout" --out /tmp/smoke --smoke --no-compile "${smoke[@]}" 2>&1 | tee "$OUT/smoke.log"
rc=$?
if ((rc != 0)); then
	echo "device.sh: smoke run failed ($rc); no real run"
	exit "$rc"
fi

python3 "$script" --archive "$archive" --heldout-text "$heldout" --out /tmp/run "$@" 2>&1 | tee "$OUT/train.log"
rc=$?

# The rescue checkpoint travels only when the export did not happen.
exclude=()
[[ -f /tmp/run/hf/model.safetensors ]] && exclude=(--exclude=./ckpt.pt)
tar -C /tmp/run "${exclude[@]}" -cf /tmp/result.tar . &&
	(cd /tmp && sha256sum result.tar >"$OUT/result.tar.sha256") &&
	split -b 15M -d /tmp/result.tar "$OUT/result.tar.part-"
ls -l "$OUT"
echo "device.sh: train.py exited $rc"
exit "$rc"
