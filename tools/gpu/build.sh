#!/usr/bin/env bash
# Builds the binaries tools/gpu/session.sh runs on the GPU machine (which has
# no Go toolchain) and packs them into .gpu/bins.tar.xz: the device tool
# carries at most 64 MiB with the working tree, so carry only that archive.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu/bin
export CGO_ENABLED=0
# The default model stays out of this trigon (12.7 MB the archive cannot
# spare): it reads models/default/ from the carried repository instead.
go build -tags external_default_model -ldflags "-s -w" -o .gpu/bin/trigon ./cmd/trigon
go test -c -ldflags "-s -w" -o .gpu/bin/cuda.test ./backend/cuda
# padhf widens the default model for the K-quant files of session.sh's kq_ppl.
go build -ldflags "-s -w" -o .gpu/bin/padhf ./tools/padhf
# gotrace is Go's own trace tool (cmd/trace), for session.sh serve_stalls: the
# execution trace of a serving run is too large to bring back whole.
go build -ldflags "-s -w" -o .gpu/bin/gotrace cmd/trace
go test -c -tags external_default_model -ldflags "-s -w" -o .gpu/bin/llama.test ./model/llama
# What was built, so a session's summary says which code it ran: the commit
# and any uncommitted change (helpers may be editing the tree meanwhile).
{ git describe --always --dirty; git status --porcelain -- '*.go' '*.cu' '*.cuh'; } >.gpu/bin/BUILD
if [ -n "$(git status --porcelain -- '*.go' '*.cu' '*.cuh')" ]; then
  echo "build.sh: building uncommitted changes:" >&2; git status --porcelain -- '*.go' '*.cu' '*.cuh' >&2
fi
# OLD=<commit>: also build that commit's trigon as bin/trigon_old, for
# session.sh's ab_old (the same step, this build against that one).
rm -f .gpu/bin/trigon_old .gpu/bin/BUILD_OLD
if [ -n "${OLD:-}" ]; then
  wt=$(mktemp -d)
  git worktree add -q --detach "$wt" "$OLD"
  (cd "$wt" && go build -tags external_default_model -ldflags "-s -w" -o "$OLDPWD/.gpu/bin/trigon_old" ./cmd/trigon)
  git -C "$wt" describe --always >.gpu/bin/BUILD_OLD
  git worktree remove --force "$wt"
fi
tar -C .gpu -cf - bin | xz -9e -T0 > .gpu/bins.tar.xz  # -9e: the tree and the archive must stay under 64 MiB
ls -la .gpu/bin .gpu/bins.tar.xz
