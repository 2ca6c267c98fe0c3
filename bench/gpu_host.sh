#!/usr/bin/env bash
# gpu_host.sh -- the steps of a session on the lent GPU host (no network there), one per call.
#
#   bench/gpu_host.sh setup        install carried wheels (.whl/), install flashd, build the library
#   bench/gpu_host.sh recv         append carried model/sdist chunks (.xfer/*) to $XFER/
#   bench/gpu_host.sh sdist        join the sdist's chunks, build llama.cpp's tools in the background
#   bench/gpu_host.sh assemble     join chunks into $MODELS/*.gguf and the sdist, check md5
#   bench/gpu_host.sh llama        build llama-bench from the sdist in the background (setsid)
#   bench/gpu_host.sh test [ARGS]  GPU test suite (pytest -m gpu), log under $OUT
#   bench/gpu_host.sh bench        flashd vs llama.cpp table for the real models, under $OUT
#   bench/gpu_host.sh clones [--random-blocks]  synthetic clones of the 1.5B and 0.5B files (shapes and formats) in
#                  $MODELS; --random-blocks: random valid blocks instead of quantized random weights (seconds instead
#                  of minutes; the kernels' work is the same, for speed runs; written as clone-*-rb.gguf)
#   bench/gpu_host.sh ab MODEL [TUNING ...]  flashd bench tg128 per launch-tuning override (e.g. gemv_split_cols=8192;
#                  "-" is the table's entry; default list: int8 activations, PDL, rounds, step bytes, the session-18 fields)
#   bench/gpu_host.sh kv MODEL [TYPE ...]  tg128 at depth 0 and 32768 per KV cache type (default f16 q8_0 q4_0), one
#                  build, one machine (issue 16's bar: q8_0 at 32K at least as fast as f16)
#   bench/gpu_host.sh profile MODEL  nsys kernel summary of a short decode (if nsys is installed)
#   bench/gpu_host.sh chain MODEL [BENCH ARGS]  a decode step's kernel chain: CUPTI tracer (bench/lab/chain_trace.c,
#                  built there against the toolkit's CUPTI) around `flashd bench -n 64`, then chain_report.py (what each
#                  kernel adds to the step); e.g. `chain M --tuning gemv_rows=1` or `chain M --kv-type q8_0`
#   bench/gpu_host.sh ncu-src MODEL REGEX SKIP COUNT [BENCH ARGS]  ncu of COUNT launches of kernels matching REGEX
#                  after SKIP of them (replayed alone, caches flushed), details + warp stalls by SASS line
#                  (bench/lab/ncu_source_top.py)
#   bench/gpu_host.sh ab-libs MODEL [BENCH ARGS] -- LIB ...  `flashd bench` per carried library (carried-libs), e.g.
#                  `ab-libs M -n 128 -d 0,32768 --kv-type q8_0 -- main spread`
#   bench/gpu_host.sh carried-libs DIR  unpack DIR/*.so.gz (bench/prebuilt_lib.sh, built on the CPU machine) into
#                  $HOST_DIR/libs/; then FLASHD_NATIVE_LIB=$HOST_DIR/libs/NAME.so picks one: an A/B of library versions
#                  in one call without building here (a fresh host's build is ~130-210 s of the call)
#   bench/gpu_host.sh bg NAME CMD...   run CMD in the background (survives the call), log $LOGS/NAME.log
#   bench/gpu_host.sh train TARGET [ARGS]  flashd train-drafter TARGET in the background, from a copy of the code and a
#                  working directory outside the checkout (the next call replaces the checkout, which removed a
#                  running trainer's working directory once); log $LOGS/train.log, drafter in $HOST_DIR/dflash/
#   bench/gpu_host.sh logs [N]     copy $LOGS/* to $OUT and print the last N lines of each (default 15)
#   bench/gpu_host.sh lab [ROUNDS] [FLAGS ...]  bench/lab/megakernel_lab.cu built once per flag set (e.g. "-DMK_ATTN=1"
#                  "-DMK_ATTN=1 -DMK_POSTNORM=1"; "" = the default; default list: the session-35 variants) and run
#                  `15 128 11` for each in turn, ROUNDS times (default 2), output in $OUT/lab.txt
#
# .whl/ holds what the host's image lacks (its python3 is 3.12 with numpy, click, msgpack, jinja2, tokenizers, torch):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl cffi pycparser pyzmq gguf
# (~1.3 MB; name .whl in the call's carry). The tracked DFlash drafter (53 MB) would fill the 64 MiB a call carries:
# hide it while working with the host (git update-index --skip-worktree, move it out) and put it back before stopping.
#
# Models travel as chunks, one a call (named q15_NN / q05_NN / lcp_NN, joined in name order by `assemble`), made on
# the CPU machine by bench/host_prep.sh (`chunks qwen2.5-coder-1.5b q15`: 21 chunks of 53 MiB; `next` before each
# call), carried in .xfer/ and appended by `recv`. Keep the chunk calls back to back: the host is released 30 s
# after a call ends, and its files with it. A call can also carry libraries prebuilt there (`host_prep.sh lib`,
# ~4-9 min each on two cores), unpacked by `carried-libs`, so the host needs no build (~130-210 s of device time).
#
# Every step exports the same environment, so steps can run in separate calls while the host
# stays warm (files under /root and /tmp persist; the checkout is re-sent each call).
set -uo pipefail
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
HOST_DIR=${FLASHD_HOST_DIR:-/root}           # survives between calls while the host stays warm
export FLASHD_MODELS_DIR=${FLASHD_MODELS_DIR:-$HOST_DIR/models}
export FLASHD_CACHE_DIR=${FLASHD_CACHE_DIR:-$HOST_DIR/flashd-cache}
export HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}
XFER=$HOST_DIR/xfer
MODELS=$FLASHD_MODELS_DIR
LOGS=$HOST_DIR/logs
mkdir -p "$OUT" "$MODELS" "$XFER" "$LOGS"
step=${1:-}; shift || true

case "$step" in
setup)
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null || exit 1
    python3 -c "import flashd.daemon, cffi, zmq, gguf; print('python deps ok')" || exit 1
    time flashd build 2>&1 | tail -3
    ;;
recv)
    cp .xfer/* $XFER/ && ls $XFER | tr '\n' ' ' && echo
    ;;
sdist)          # the llama-cpp-python sdist alone (its two chunks come first), then its build in the background
    cat $XFER/lcp_?? > $HOST_DIR/llama_cpp_python-0.3.36.tar.gz && ls -la $HOST_DIR/llama_cpp_python-0.3.36.tar.gz
    setsid nohup python3 bench/bench_spec.py --sdist $HOST_DIR/llama_cpp_python-0.3.36.tar.gz \
        --build-dir $HOST_DIR/llama-build --build-only > $LOGS/llama_build.log 2>&1 < /dev/null &
    echo "llama.cpp (llama-bench, llama-simple, llama-speculative-simple) building in the background"
    ;;
assemble)
    cat $XFER/q05_?? > $MODELS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    cat $XFER/q15_?? > $MODELS/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    cat $XFER/lcp_?? > $HOST_DIR/llama_cpp_python-0.3.36.tar.gz
    md5sum $MODELS/*.gguf
    ;;
llama)
    setsid nohup python3 bench/compare_llama_cpp.py --sdist $HOST_DIR/llama_cpp_python-0.3.36.tar.gz \
        --build-dir $HOST_DIR/llama-build --model /dev/null --build-only > $HOST_DIR/llama_build.log 2>&1 < /dev/null &
    echo "llama.cpp build started in the background (log $HOST_DIR/llama_build.log)"
    ;;
test)
    python3 -m pytest tests/gpu -m gpu -q -rs "$@" 2>&1 | tee "$OUT/gpu_tests.log" | tail -60
    ;;
bench)
    python3 bench/compare_llama_cpp.py --llama-bench $HOST_DIR/llama-build/build/bin/llama-bench \
        --model $MODELS/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --model $MODELS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
    ;;
clones)
    sfx=""; [ "${1:-}" = --random-blocks ] && sfx=-rb
    for preset in qwen2.5-coder-1.5b-q4_k_m qwen2.5-coder-0.5b-q4_k_m; do
        [ -f $MODELS/clone-$preset$sfx.gguf ] || python3 -m flashd.scripts.make_synthetic_gguf \
            $MODELS/clone-$preset$sfx.gguf --preset $preset -q "$@"
    done
    ls -la $MODELS
    ;;
ab-libs)        # ab-libs MODEL BENCH_ARGS -- LIB ...: `flashd bench` per carried library ($HOST_DIR/libs/LIB.so), one machine
    model=$1; shift
    args=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
    shift
    for lib in "$@"; do
        echo "== $lib ${args[*]}"
        FLASHD_NATIVE_LIB=$HOST_DIR/libs/$lib.so flashd bench -m "$model" -p "" -r 3 "${args[@]}" 2>&1 | grep -E "^\| .*tg"
    done | tee -a "$OUT/ab-libs.log"
    ;;
ab)             # ab MODEL [TUNING ...]: tg128 per tuning override ("-": the table's entry), one build, one machine
    model=$1; shift
    [ $# -gt 0 ] || set -- - gemv_int8_x=0 pdl=0 gemv_rounds=2 gemv_stage_bytes=6144 gemv_xq_direct=1 gemv_split_cols=8192
    for tuning in "$@"; do
        echo "== $tuning"
        [ "$tuning" = - ] && tuning=""
        flashd bench -m "$model" -p "" -n 128 -d 0 -r 3 --tuning "$tuning" 2>&1 | grep -E "^\| .*tg|^tuning"
    done | tee -a "$OUT/ab.log"
    ;;
kv)             # kv MODEL [TYPE ...]: tg128 at depth 0 and 32768 per KV type
    model=$1; shift
    [ $# -gt 0 ] || set -- f16 q8_0 q4_0
    for kv in "$@"; do
        echo "== kv $kv"
        flashd bench -m "$model" -p "" -n 128 -d 0,32768 -r 3 --kv-type "$kv" 2>&1 | grep -E "^\| .*tg"
    done | tee -a "$OUT/kv.log"
    ;;
carried-libs)   # carried-libs DIR: the prebuilt libraries carried in DIR, unpacked
    mkdir -p $HOST_DIR/libs
    for f in "$1"/*.so.gz; do gunzip -c "$f" > $HOST_DIR/libs/$(basename "$f" .gz) && echo "$HOST_DIR/libs/$(basename "$f" .gz)"; done
    ;;
clones-wait)   # the clones step, in the foreground (used after setup)
    "$0" clones
    ;;
profile)
    model=$1; shift
    if command -v nsys >/dev/null; then
        nsys profile --cuda-graph-trace=node -o $OUT/decode -f true --stats=false flashd bench -m "$model" -p "" -n 64 -d 0 -r 1 >/dev/null 2>&1
        nsys stats -r cuda_gpu_kern_sum -f csv -o $OUT/kern $OUT/decode.nsys-rep >/dev/null 2>&1
        python3 - "$OUT" <<'PY'
import csv, glob, sys
f = glob.glob(sys.argv[1] + "/kern*.csv")[0]
rows = list(csv.DictReader(open(f)))
tot = sum(float(r["Total Time (ns)"]) for r in rows)
for r in rows[:25]:
    print(f'{float(r["Total Time (ns)"])/tot*100:5.1f}%  n={r["Instances"]:>6}  avg={float(r["Avg (ns)"])/1e3:7.2f} us  {r["Name"][:110]}')
PY
    else
        echo "nsys not installed"
    fi
    ;;
chain)
    model=$1; shift
    cu=${CUDA_HOME:-/usr/local/cuda}/targets/x86_64-linux
    [ -f $cu/include/cupti.h ] || cu=$(dirname "$(dirname "$(find / -name cupti.h -path '*include*' 2>/dev/null | head -1)")")
    [ -f $HOST_DIR/chain_trace.so ] || gcc -O2 -shared -fPIC -I$cu/include bench/lab/chain_trace.c -L$cu/lib -lcupti \
        -o $HOST_DIR/chain_trace.so || exit 1
    LD_LIBRARY_PATH=$cu/lib:${LD_LIBRARY_PATH:-} LD_PRELOAD=$HOST_DIR/chain_trace.so CHAIN_TRACE_OUT=$OUT/trace.tsv \
        flashd bench -m "$model" -p "" -n 64 -d 0 -r 1 "$@" > /dev/null 2>&1
    python3 bench/lab/chain_report.py --steps 16 $OUT/trace.tsv | tee $OUT/chain.txt | tail -12
    rm -f $OUT/trace.tsv
    ;;
lab)
    rounds=${1:-2}; shift || true
    [ $# -gt 0 ] || set -- "" "-DMK_ATTN=1" "-DMK_POSTNORM=1" "-DMK_ATTN=1 -DMK_POSTNORM=1"
    i=0
    for flags in "$@"; do
        # shellcheck disable=SC2086
        nvcc -O3 -std=c++17 -arch=sm_90a $flags -o $HOST_DIR/mk_$i bench/lab/megakernel_lab.cu || exit 1
        i=$((i + 1))
    done
    for r in $(seq 1 "$rounds"); do
        i=0
        for flags in "$@"; do
            echo "== round $r: ${flags:-default}"
            $HOST_DIR/mk_$i 15 128 11 2>&1 | grep -vE "^argmax"
            i=$((i + 1))
        done
    done | tee $OUT/lab.txt
    ;;
ncu-src)
    model=$1 regex=$2 skip=$3 count=$4; shift 4
    ncu --target-processes all -k regex:"$regex" --launch-skip "$skip" --launch-count "$count" \
        --section SpeedOfLight --section WarpStateStats --section SourceCounters --section LaunchStats \
        --section Occupancy -o $HOST_DIR/ncu_rep -f flashd bench -m "$model" -p "" -n 32 -d 0 -r 1 "$@" > /dev/null 2>&1
    ncu --import $HOST_DIR/ncu_rep.ncu-rep --print-summary none --page details > $OUT/ncu_details.txt 2>&1
    ncu --import $HOST_DIR/ncu_rep.ncu-rep --page source --csv --print-source sass > $HOST_DIR/ncu_src.csv 2>/dev/null
    python3 bench/lab/ncu_source_top.py $HOST_DIR/ncu_src.csv | tee $OUT/ncu_source_top.txt | head -80
    grep -E "^  [a-z_ ]*void|Duration|Warp Cycles Per Issued|Registers Per" $OUT/ncu_details.txt | head -40
    ;;
bg)
    name=$1; shift
    # a copy of the checkout, imported as `flashd` through PYTHONPATH: the next call replaces the
    # working tree under a running job
    tree=$HOST_DIR/tree-$name pp=$HOST_DIR/pp-$name
    rm -rf "$tree" "$pp" && mkdir -p "$tree" "$pp" && ln -s "$tree" "$pp/flashd"
    tar --exclude=./.xfer --exclude=./.whl -cf - . | (cd "$tree" && tar xf -)
    cmd=$(printf '%q ' "$@")     # each argument quoted as given (a -k expression with spaces stays one)
    (cd "$tree" && PYTHONPATH=$pp:$PYTHONPATH setsid nohup bash -c "$cmd; echo \"exit=\$?\"" \
        > "$LOGS/$name.log" 2>&1 < /dev/null &)
    echo "started $name in $tree (log $LOGS/$name.log)"
    ;;
train)
    target=$1; shift
    rm -rf $HOST_DIR/fdsrc $HOST_DIR/fdpath && cp -r . $HOST_DIR/fdsrc && mkdir -p $HOST_DIR/fdpath $HOST_DIR/dflash
    ln -s $HOST_DIR/fdsrc $HOST_DIR/fdpath/flashd
    name=$(basename "$target" .gguf)
    ( cd $HOST_DIR/dflash && PYTHONPATH=$HOST_DIR/fdpath:$PYTHONPATH setsid nohup python3 -m flashd.clients.cli \
        train-drafter "$target" --out $HOST_DIR/dflash/$name-dflash.gguf --resume "$@" > $LOGS/train.log 2>&1 < /dev/null & )
    echo "training $name in the background (log $LOGS/train.log); rerun with --resume to continue a run"
    ;;
logs)
    n=${1:-15}
    cp $LOGS/* "$OUT/" 2>/dev/null
    for f in $LOGS/*; do echo "== $f"; tail -n "$n" "$f"; done
    ;;
*)
    echo "usage: $0 setup|recv|assemble|llama|test|bench|clones|ab|ab-libs|kv|carried-libs|profile|chain|ncu-src|bg|train|logs" >&2
    exit 2
    ;;
esac
