"""KV cache types side by side: teacher-forced argmax agreement with the f16 cache, and decode speed at depth.

    python bench/bench_kv_types.py --model qwen2.5-coder-1.5b --text FILE [--tokens 8192] [--types f16,q8_0,q4_0,q4_0@256]
        [--device auto|cpu|cuda] [--depth 32768] [--gen 128] [--reps 3] [--out bench/results/]

One weight load; per KV type (K and V both in that type, `--kv-type`; 'K/V' for two types; '@U' adds a
full-precision window of U positions, KVTypes.window; --chunk must be a multiple of U) a fresh runner and cache:

- agreement: the first --tokens tokens of the text file are fed teacher-forced (chunked prefill, every
  position's logits); at each position the argmax is compared with the f16 cache's argmax there. The f16 row
  is the baseline (100%). Issue 16's bar: q8_0 >= 99.5%, q4_0 >= 98% over 8K tokens of real code (1.5B).
- decode: tok/s of --gen greedy tokens after a random --depth-token prompt (flashd bench's tgN@dD: median of
  --reps after a warm-up).

A type the backend refuses (a head_dim that is not whole 32-value blocks, say) gets a row that says why instead
of numbers. On CUDA a quantized cache decodes on the per-op graph path (no fused rope + write).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import sys
import time
from pathlib import Path

import numpy as np

from flashd.bench.out_files import write_md_json

__all__ = ["main", "teacher_forced_argmax", "agreement"]


def log(msg: str) -> None:
    print(f"[kv-types {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def teacher_forced_argmax(runner, ids: list[int], rows: int | None = None) -> np.ndarray:
    """int64 (len(ids),): the argmax of the logits at every position, fed in forwards of `rows` tokens (None: the
    runner's prefill chunk) from an empty context (only one forward's logits are on the host at a time)."""
    runner.reset()
    out = []
    step = min(rows or runner.prefill_chunk, runner.prefill_chunk)
    try:
        for start in range(0, len(ids), step):
            logits = runner.prefill(ids[start:start + step], all_logits=True)
            out.append(np.argmax(np.asarray(logits), axis=-1))
    finally:
        runner.reset()
    return np.concatenate(out)


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Fraction of positions whose argmax is the same."""
    return float(np.mean(a == b))


def parse_type(kind: str):
    """'T' (K and V both), 'K/V', either with '@U': a full-precision window of U positions (KVTypes.window)."""
    from flashd.daemon.backends.kv_types import KVTypes

    types, _, window = kind.partition("@")
    k, _, v = types.partition("/")
    return KVTypes(k, v or k, int(window) if window else 0)


def run_type(backend, cfg, weights, weight_bytes: int, kind: str, ids: list[int], args) -> dict:
    """One KV type's row: {'type', 'argmax' or 'refused', 'tok_s', 'kv_bytes'}."""
    from flashd.daemon.bench import run_bench
    from flashd.daemon.models.gguf_file import ModelLoadError
    try:
        types = parse_type(kind)
        plan = backend.plan(cfg, weight_bytes, args.max_ctx, args.chunk, kv_types=types)
        runner = backend.make_runner(cfg, weights, args.max_ctx, args.chunk, plan, kv_types=types)
    except (ModelLoadError, ValueError) as exc:
        log(f"{kind}: refused: {exc}")
        return {"type": kind, "refused": str(exc)}
    try:
        t0 = time.perf_counter()
        top = teacher_forced_argmax(runner, ids, args.logit_rows)
        log(f"{kind}: teacher-forced {len(ids)} tokens in {time.perf_counter() - t0:.1f} s")
        tests = [f"tg{args.gen}@d{args.depth}"] if args.gen > 0 else []
        speed = run_bench(runner, cfg, tests, reps=args.reps, log=log) if tests else []
        return {"type": kind, "argmax": top, "kv_bytes": int(runner.cache.n_bytes),
                "tok_s": speed[0].tok_s if speed else None}
    finally:
        if hasattr(runner, "close"):
            runner.close()
        del runner
        gc.collect()


def f16_argmax(rows: list[dict]) -> np.ndarray | None:
    return next((r["argmax"] for r in rows if r["type"] == "f16" and "argmax" in r), None)


def table(rows: list[dict], args, n_tokens: int) -> str:
    base = f16_argmax(rows)
    lines = [f"### KV cache types: {args.model}, {args.device}, {n_tokens} teacher-forced tokens of {args.text}, "
             f"decode tg{args.gen}@d{args.depth}; {datetime.date.today()}", "",
             "| KV type | argmax agreement with f16 | KV cache bytes | decode tok/s |", "|---|---|---|---|"]
    for r in rows:
        if "refused" in r:
            lines.append(f"| {r['type']} | refused: {r['refused']} | | |")
            continue
        agree = f"{100 * agreement(r['argmax'], base):.2f}%" if base is not None else "(no f16 row)"
        speed = f"{r['tok_s']:.1f}" if r["tok_s"] is not None else ""
        lines.append(f"| {r['type']} | {agree} | {r['kv_bytes']} | {speed} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF path or model name")
    ap.add_argument("--text", type=Path, required=True, help="text file fed teacher-forced (e.g. real code)")
    ap.add_argument("--tokens", type=int, default=8192, help="teacher-forced tokens (fewer if the text is shorter)")
    ap.add_argument("--types", default="f16,q8_0,q4_0", help="comma-separated; a type names K and V, K/V names each")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--depth", type=int, default=32768, help="decode speed measured after this many tokens")
    ap.add_argument("--gen", type=int, default=128, help="decode tokens timed (0: no decode timing)")
    ap.add_argument("--reps", type=int, default=3)
    # every position's logits of a forward (rows x vocab float32, 39 MB at 64 x 151936) must fit the runner's
    # activation arena: 512 rows overflowed it on the 1.5B; so the text goes in forwards of --logit-rows, while --chunk
    # (the runner's prefill chunk, a multiple of any window) sizes the runner as the daemon would
    ap.add_argument("--chunk", type=int, default=512, help="the runner's prefill chunk (a multiple of a window)")
    ap.add_argument("--logit-rows", type=int, default=64, help="tokens per teacher-forced forward (their logits "
                                                               "must fit the arena)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    from flashd.clients.registry import resolve_model
    from flashd.clients.tokenizer import Tokenizer
    from flashd.daemon.backends import select_backend
    from flashd.daemon.models import load_model, open_model
    from flashd.daemon.models.weights import total_weight_bytes

    path = resolve_model(args.model)
    f, cfg = open_model(path)
    ids = Tokenizer.from_gguf(f.metadata_dict).encode(args.text.read_text())[:args.tokens]
    if len(ids) < 2:
        raise SystemExit(f"{args.text}: fewer than 2 tokens")
    args.max_ctx = max(len(ids), args.depth + args.gen + 2, 16)
    backend = select_backend(args.device)
    log(f"loading {path} on {backend.name}; {len(ids)} tokens, max_ctx {args.max_ctx}")
    weight_bytes = total_weight_bytes(f, cfg)
    weights = load_model((f, cfg), backend.ops.load_weight).weights
    rows = [run_type(backend, cfg, weights, weight_bytes, kind.strip(), ids, args)
            for kind in args.types.split(",") if kind.strip()]
    text = table(rows, args, len(ids))
    print(text)
    if args.out:
        base = f16_argmax(rows)
        data = [{k: v for k, v in r.items() if k != "argmax"}
                | ({"agreement": agreement(r["argmax"], base)} if "argmax" in r and base is not None else {})
                for r in rows]
        write_md_json(args.out, f"{datetime.date.today()}-{backend.name}-kv-types", text, data, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
