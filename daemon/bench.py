"""`flashd bench`: llama-bench-like throughput of the engine on one model, in process.

Tests (llama-bench's names): ppN = prefill of N tokens into an empty context; tgN = N decode
steps after a 1-token prompt; tgN@dD = N decode steps after a D-token prompt. Each is repeated
and the median reported, with the share of the memory-bandwidth roofline for decode:
roofline tok/s = measured device copy bandwidth / bytes one decode step must read (every
weight once, one embedding row, and the KV cache up to the depth).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..protocol.messages import SamplingParams

__all__ = ["BenchResult", "run_bench", "parse_test", "format_table", "decode_bytes_per_token",
           "recurrent_state_bytes"]


# A plain record, one field a line: alike in shape only to other modules' records (models/weights.py).
@dataclass(slots=True)
class BenchResult:
    test: str
    tok_s: float
    tok_s_stdev: float
    roofline_pct: float | None = None


def parse_test(spec: str) -> tuple[str, int, int]:
    """'pp512' -> ('pp', 512, 0); 'tg128' -> ('tg', 128, 0); 'tg128@d8192' -> ('tg', 128, 8192)."""
    kind, rest = spec[:2], spec[2:]
    depth = 0
    if "@d" in rest:
        rest, d = rest.split("@d", 1)
        depth = int(d)
    if kind not in ("pp", "tg") or not rest.isdigit() or int(rest) <= 0:
        raise ValueError(f"bad test {spec!r}: expected ppN, tgN or tgN@dD")
    return kind, int(rest), depth


def decode_bytes_per_token(cfg, weight_bytes: int, embd_bytes: int, depth: int, kv_elem_bytes: float = 2) -> int:
    """Bytes a decode step reads: all weights except the embedding table (one row of it), plus K
    and V of every attention layer for `depth` cached positions (kv_elem_bytes per value, K and V averaged: 2 for
    float16, 34/32 for q8_0, 18/32 for q4_0). A hybrid (cfg.linear: qwen35) has K/V in its full-attention layers
    only, and each step also reads and writes its recurrent state (recurrent_state_bytes), counted twice."""
    row = embd_bytes // cfg.vocab_size
    weights = weight_bytes - (0 if cfg.tie_embeddings else embd_bytes) + row
    lin = getattr(cfg, "linear", None)
    kv_layers = cfg.n_layers if lin is None else len(lin.attention_layers)
    state = 0 if lin is None else 2 * recurrent_state_bytes(cfg)
    return int(weights + 2 * kv_layers * depth * cfg.kv_dim * kv_elem_bytes + state)


def recurrent_state_bytes(cfg) -> int:
    """A hybrid's recurrent state, float32: the conv window (K - 1, C) and the delta-rule memory (Hv, S, S) of every
    Gated DeltaNet layer (backends/cuda/hybrid_plan.py hybrid_state_bytes, the device copy's size)."""
    lin = cfg.linear
    per_layer = (lin.conv_kernel - 1) * lin.conv_channels + lin.n_v_heads * lin.head_dim * lin.head_dim
    return 4 * len(lin.linear_layers) * per_layer


def _sync(runner):
    dev = getattr(runner, "dev", None)
    if dev is not None:
        dev.synchronize()


def _time_pp(runner, vocab: int, n: int, rng) -> float:
    ids = rng.integers(100, vocab - 100, n).tolist()
    runner.reset()
    _sync(runner)
    t0 = time.perf_counter()
    runner.prefill(ids)
    _sync(runner)
    dt = time.perf_counter() - t0
    runner.reset()
    return n / dt


def _time_tg(runner, vocab: int, n: int, depth: int, rng) -> float:
    prompt = rng.integers(100, vocab - 100, max(depth, 1)).tolist()
    gen = runner.generate(prompt, SamplingParams(), n + 1)
    next(gen)                                   # first token comes from the prefill: not timed
    t0 = time.perf_counter()
    count = sum(1 for _ in gen)
    dt = time.perf_counter() - t0
    return count / dt


def run_bench(runner, cfg, tests: list[str], *, reps: int = 3, weight_bytes: int = 0, embd_bytes: int = 0,
              copy_gbs: float | None = None, log=None, kv_elem_bytes: float = 2) -> list[BenchResult]:
    rng = np.random.default_rng(0)
    results = []
    for spec in tests:
        kind, n, depth = parse_test(spec)
        need = n if kind == "pp" else max(depth, 1) + n + 1
        if need > runner.max_ctx:
            raise ValueError(f"{spec} needs max_ctx >= {need} (have {runner.max_ctx})")
        fn = (lambda: _time_pp(runner, cfg.vocab_size, n, rng)) if kind == "pp" else \
             (lambda: _time_tg(runner, cfg.vocab_size, n, depth, rng))
        fn()                                    # warm-up
        samples = [fn() for _ in range(reps)]
        med = statistics.median(samples)
        pct = None
        if kind == "tg" and copy_gbs and weight_bytes:
            roof = copy_gbs * 1e9 / decode_bytes_per_token(cfg, weight_bytes, embd_bytes, depth, kv_elem_bytes)
            pct = 100.0 * med / roof
        results.append(BenchResult(spec, med, statistics.pstdev(samples), pct))
        if log:
            log(f"{spec}: {med:.1f} tok/s")
    return results


def format_table(model_name: str, backend: str, size_bytes: int, results: list[BenchResult], vram: list[str] | None,
                 roofline_note: str = "") -> str:
    """The results as a markdown table; `vram`: the VRAM plan's lines (VramPlan.lines), printed below it."""
    lines = ["| model | size | backend | test | t/s | % roofline |", "| --- | ---: | --- | --- | ---: | ---: |"]
    for r in results:
        pct = f"{r.roofline_pct:.1f}" if r.roofline_pct is not None else ""
        lines.append(f"| {model_name} | {size_bytes / 2**30:.2f} GiB | {backend} | {r.test} | "
                     f"{r.tok_s:.2f} ± {r.tok_s_stdev:.2f} | {pct} |")
    if vram:
        lines += ["", *vram]
    if roofline_note:
        lines.append(roofline_note)
    return "\n".join(lines)
