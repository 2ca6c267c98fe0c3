"""flashd.bench: the benchmarks (bench/NOTES.md) and their shared helpers (timing.py: CUDA-event timing
with the L2 flushed; op_harness.py: check an op against its reference, then time it).

Each benchmark is a script: `python bench/bench_x.py ...` (or `python -m flashd.bench.bench_x ...`) from a
checkout installed with `pip install -e .`; they import each other as flashd.bench.*."""
