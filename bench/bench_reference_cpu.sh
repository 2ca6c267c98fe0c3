#!/usr/bin/env bash
# The CPU reference backend's throughput on the default model (Qwen2.5-Coder-0.5B Q4_K_M):
# the foundation issue asks for >= 3 tokens/s of decode on a 2-core machine.
#   bench/bench_reference_cpu.sh [extra flashd bench options]
set -euo pipefail
echo "# $(date -u +%F) $(git rev-parse --short HEAD 2>/dev/null) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
exec flashd bench --model qwen2.5-coder-0.5b --device cpu -p 64 -n 32 -d 0,256 -r 3 "$@"
