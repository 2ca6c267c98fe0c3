#!/usr/bin/env bash
# prebuilt_lib.sh REF NAME [OUTDIR [PATCH ...]] -- build the CUDA library of git ref REF (with the lab's PATCHes applied,
# e.g. bench/lab/persistent_ports.patch) for sm_90 on this (CPU-only) machine and
# write it gzipped to OUTDIR/NAME.so.gz (default OUTDIR .libs/, git-ignored locally), so that a GPU-host call can A/B
# several versions without building there (bench/gpu_host.sh carried-libs; the host's toolkit and this nvcc must be
# the same release, as flashd's build flags are). Two cores: ~6-9 minutes a library; ~17 MB gzipped each, so two fit
# a call's 64 MiB carry with the working tree (hide the tracked drafter first, as gpu_host.sh's header says).
set -euo pipefail
ref=$1 name=$2 out=${3:-.libs}
shift 2; [ $# -gt 0 ] && shift
root=$(git rev-parse --show-toplevel)
mkdir -p "$out"
out=$(cd "$out" && pwd)
patches=()
for f in "$@"; do patches+=("$(cd "$(dirname "$f")" && pwd)/$(basename "$f")"); done
tmp=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tmp/flashd" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git -C "$root" worktree add -q --detach "$tmp/flashd" "$ref"     # imported as `flashd` through PYTHONPATH
for f in "${patches[@]}"; do git -C "$tmp/flashd" apply "$f"; done
lib=$(cd "$tmp" && PYTHONPATH="$tmp" FLASHD_CACHE_DIR="$tmp/cache" python3 -c "
from flashd.daemon.backends.cuda.build import build_library
print(build_library('sm_90', force=True))" | tail -1)
gzip -9 -c "$lib" > "$out/$name.so.gz"
echo "$out/$name.so.gz ($(git -C "$root" rev-parse --short "$ref")${patches:+ + ${#patches[@]} patch(es)})"
