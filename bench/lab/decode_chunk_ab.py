"""tg128 at depth 0 / 8192 / 32768 with the decode attention's chunk_len 64 / 128 / 256 (bench/lab; not a test): the
runner's DECODE_CHUNK_SLOTS patched at run time, graphs dropped between, two rounds, one engine (max_ctx 33,024).
At 8K keys chunk 64 gives 128 chunks -> 128 splits a KV head, 128 -> 64, 256 -> 32 (fewer, longer splits: fewer late
blocks, bench/NOTES.md session 40). CUDA only:

    FLASHD_NATIVE_LIB=... python bench/lab/decode_chunk_ab.py MODEL.gguf
"""
import sys
import flashd.daemon.backends.cuda.attention_ops as ao
import flashd.daemon.backends.cuda.decode_step as rm
from flashd.daemon.bench import run_bench
from flashd.daemon.config import EngineConfig
from flashd.daemon.engine import Engine

model = sys.argv[1]
engine = Engine(EngineConfig(model=model, device="cuda", max_ctx=32768 + 256, prefix_cache=False))
engine.load()
r = engine.runner
for rnd in (1, 2):
    for chunk in (64, 128, 256):
        ao.DECODE_CHUNK_SLOTS = rm.DECODE_CHUNK_SLOTS = chunk
        r.drop_graphs()
        res = run_bench(r, engine.model.config, ["tg128", "tg128@d8192", "tg128@d32768"], reps=2)
        print(f"r{rnd} {model.split('/')[-1]} chunk {chunk}: " + "  ".join(f"{x.test} {x.tok_s:.1f}" for x in res),
              flush=True)
r.close()
