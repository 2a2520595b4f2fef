#!/usr/bin/env bash
# prepare.sh collects the training corpus for trigon's default model: the Go
# distribution's own non-test sources (BSD-3-Clause, The Go Authors), split by
# file into train and held-out sets, packed into one xz archive small enough to
# carry to the GPU machine, plus the held-out evaluation text that ships in
# models/default/heldout.go.txt.
#
# Usage: tools/train-default-model/prepare.sh [GOROOT]
#
# Selection (applied to GOROOT/src, paths relative to it):
#   - regular files named *.go, not *_test.go;
#   - no file under a directory named testdata;
#   - vendor/ and cmd/vendor/: only golang.org/x/... (same licence and authors
#     as Go itself); other vendored modules carry other licences and are left out;
#   - no file carrying Go's generated-code marker line
#     (^// Code generated .* DO NOT EDIT\.$): rewrite tables, syscall constant
#     tables, zipped tzdata and the like teach a small model nothing about
#     writing Go and would dominate the corpus by size;
#   - no file over MAX_FILE_BYTES (384 KiB): only large constant tables remain
#     above that once generated files are gone.
# Split: key = first 8 hex digits of sha256("trigon-default-model/v1:" + path);
# a file is held out when key mod 1000 < 20 (about 2%). The rule depends only
# on the path, so it is stable across machines and Go patch releases.
#
# Outputs:
#   .gpu/train-default-model/gosrc.tar.xz   src/<path> for every selected file,
#                                           MANIFEST.tsv (path, split, bytes),
#                                           GO_VERSION
#   models/default/heldout.go.txt           held-out files concatenated (see below)
#   models/default/data-manifest.txt        Go version, counts, held-out file list
set -euo pipefail

readonly SALT="trigon-default-model/v1:"
readonly HELDOUT_PER_MILLE=20
readonly MAX_FILE_BYTES=$((384 * 1024))
# heldout.go.txt: held-out files in key order, each at most EVAL_MAX_FILE bytes,
# appended until the text reaches EVAL_TARGET_BYTES.
readonly EVAL_MAX_FILE=$((16 * 1024))
readonly EVAL_TARGET_BYTES=$((60 * 1024))

die() { echo "prepare.sh: $*" >&2; exit 1; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
goroot=${1:-$(go env GOROOT 2>/dev/null || true)}
[[ -n "$goroot" && -d "$goroot/src" ]] || die "no Go source tree: pass GOROOT (got '${goroot}')"
[[ -f "$goroot/VERSION" ]] || die "$goroot/VERSION missing: need a released Go distribution"
go_version=$(head -n1 "$goroot/VERSION")
for tool in sha256sum xz tar; do
	command -v "$tool" >/dev/null || die "$tool not found"
done

outdir="$repo/.gpu/train-default-model"
modeldir="$repo/models/default"
mkdir -p "$outdir" "$modeldir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/stage/src"

cd "$goroot/src"
# Candidate list, sorted bytewise so every later step is deterministic.
find . \( -name testdata -o -name vendor \) -prune -o -type f -name '*.go' ! -name '*_test.go' -print |
	sed 's|^\./||' >"$work/cand"
for v in vendor/golang.org/x cmd/vendor/golang.org/x; do
	[[ -d "$v" ]] || continue
	find "$v" -name testdata -prune -o -type f -name '*.go' ! -name '*_test.go' -print >>"$work/cand"
done
LC_ALL=C sort -u -o "$work/cand" "$work/cand"
[[ -s "$work/cand" ]] || die "no Go files under $goroot/src"

# Generated files and sizes in one pass each (forks are the cost here).
tr '\n' '\0' <"$work/cand" | xargs -0 grep -lE '^// Code generated .* DO NOT EDIT\.$' >"$work/generated" || true
n_generated=$(wc -l <"$work/generated")
tr '\n' '\0' <"$work/cand" | xargs -0 stat -c '%s %n' >"$work/sizes"
n_large=0
: >"$work/manifest"
declare -A generated=()
while IFS= read -r path; do generated[$path]=1; done <"$work/generated"
while read -r size path; do
	[[ -z ${generated[$path]:-} ]] || continue
	if ((size > MAX_FILE_BYTES)); then
		n_large=$((n_large + 1))
		continue
	fi
	key=$(printf '%s%s' "$SALT" "$path" | sha256sum)
	key=${key:0:8}
	if (((16#$key) % 1000 < HELDOUT_PER_MILLE)); then split=heldout; else split=train; fi
	printf '%s\t%s\t%s\t%s\n' "$path" "$split" "$size" "$key" >>"$work/manifest"
done <"$work/sizes"

# Stage the selection (tar reads the list, so odd characters in paths are safe).
cut -f1 "$work/manifest" >"$work/paths"
tar -C "$goroot/src" -cf - -T "$work/paths" | tar -C "$work/stage/src" -xf -
{
	printf 'path\tsplit\tbytes\n'
	cut -f1-3 "$work/manifest"
} >"$work/stage/MANIFEST.tsv"
printf '%s\n' "$go_version" >"$work/stage/GO_VERSION"

archive="$outdir/gosrc.tar.xz"
tar -C "$work/stage" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
	-cf - GO_VERSION MANIFEST.tsv src | xz -9e -T2 -c >"$archive.tmp"
mv "$archive.tmp" "$archive"

# Held-out evaluation text: files in key order (a pseudo-random but fixed
# order), raw bytes concatenated with nothing between them (gofmt'd files end
# in a newline, so each file starts on a fresh line).
awk -F'\t' '$2 == "heldout"' "$work/manifest" | LC_ALL=C sort -t$'\t' -k4,4 -k1,1 >"$work/heldout"
eval_txt="$modeldir/heldout.go.txt"
: >"$eval_txt.tmp"
: >"$work/evalfiles"
total=0
while IFS=$'\t' read -r path split size key; do
	((size <= EVAL_MAX_FILE)) || continue
	cat "$goroot/src/$path" >>"$eval_txt.tmp"
	printf '%s\n' "$path" >>"$work/evalfiles"
	total=$((total + size))
	((total < EVAL_TARGET_BYTES)) || break
done <"$work/heldout"
mv "$eval_txt.tmp" "$eval_txt"

n_train=$(awk -F'\t' '$2 == "train"' "$work/manifest" | wc -l)
n_held=$(awk -F'\t' '$2 == "heldout"' "$work/manifest" | wc -l)
b_train=$(awk -F'\t' '$2 == "train" { s += $3 } END { print s + 0 }' "$work/manifest")
b_held=$(awk -F'\t' '$2 == "heldout" { s += $3 } END { print s + 0 }' "$work/manifest")
{
	echo "# Corpus of trigon's default model, written by tools/train-default-model/prepare.sh"
	echo "go_version: $go_version"
	echo "candidates: $(wc -l <"$work/cand") (*.go, not *_test.go, no testdata/, vendor only golang.org/x)"
	echo "dropped_generated: $n_generated"
	echo "dropped_over_${MAX_FILE_BYTES}_bytes: $n_large"
	echo "train_files: $n_train"
	echo "train_bytes: $b_train"
	echo "heldout_files: $n_held"
	echo "heldout_bytes: $b_held"
	echo "archive_sha256: $(sha256sum "$archive" | cut -d' ' -f1)"
	echo "heldout_go_txt_bytes: $(stat -c %s "$eval_txt")"
	echo "heldout_go_txt_sha256: $(sha256sum "$eval_txt" | cut -d' ' -f1)"
	echo "heldout_go_txt_files (in order):"
	sed 's/^/  /' "$work/evalfiles"
	echo "heldout_files (all):"
	awk -F'\t' '$2 == "heldout" { print "  " $1 }' "$work/manifest"
} >"$modeldir/data-manifest.txt"

echo "prepare.sh: $go_version: train $n_train files ($b_train bytes), held out $n_held files ($b_held bytes)"
echo "prepare.sh: dropped $n_generated generated and $n_large oversized files"
echo "prepare.sh: $archive ($(stat -c %s "$archive") bytes)"
echo "prepare.sh: $eval_txt ($(stat -c %s "$eval_txt") bytes, $(wc -l <"$work/evalfiles") files)"
