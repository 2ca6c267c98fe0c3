"""PFlash needle-in-a-haystack: pass rate and time to first token, PFlash vs flashd's dense
prefill vs llama.cpp's dense prefill, on one GPU in one run.

    python bench/bench_niah.py --target qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --drafter qwen2.5-coder-0.5b-instruct-q8_0.gguf --llama-bench /tmp/llama-cpp-build/build/bin/llama-bench \
        --cases 20 --lengths 4096,8192,16384,32768 --out bench/results/

For every length, `--cases` cases from flashd.daemon.pflash.needles (needle at a random depth in generated
filler, the question at the end, sized with the target's tokenizer to at most that many tokens):

- flashd dense: `generate` of the whole prompt (greedy, --max-tokens); TTFT = wall time from the
  request to its first token event; pass = the needle's value appears in the output text.
- PFlash: `compress` (drafter resident, --keep, --alpha, --layers) then `generate` of the kept ids; TTFT =
  wall time from the compress request to the generate's first token (both requests included).
- llama.cpp: llama-bench -p LENGTH -n 0 -fa 1 -ngl 99 on the same target GGUF; TTFT = LENGTH /
  its prefill tok/s (a prefill time: llama-bench runs no NIAH, so no pass rate).
- Sweep: PFlash pass rate and TTFT for every (--sweep-keeps x --sweep-alphas x --sweep-layers), at
  every length.

Each mode runs one warm-up case first (graph capture, arena growth; not counted). Output: a
markdown table (stdout, and --out/<date>-niah.md plus .json).
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import statistics
import sys
import threading
import time
from pathlib import Path

from flashd.bench.out_files import write_md_json
from flashd.daemon.pflash.needles import make_case


def log(msg: str) -> None:
    print(f"[niah {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class InProcess:
    """The engine in this process; requests timed on the engine thread's events."""

    def __init__(self, engine):
        self.engine = engine
        self.n = 0

    def run(self, request) -> dict:
        done = threading.Event()
        out: list[dict] = []

        def emit(event):
            out.append(event)
            if event["event"] in ("done", "result", "error"):
                done.set()

        self.engine.submit(request, emit)
        done.wait()
        if out[-1]["event"] == "error":
            raise RuntimeError(f"{request.id}: {out[-1]}")
        return out[-1]

    def next_id(self) -> str:
        self.n += 1
        return f"b{self.n}"


def generate_ttft(client: InProcess, ids, max_tokens: int, t_start: float | None = None) -> tuple[float, str]:
    """(seconds from t_start (default: now) to the first token, output text)."""
    from flashd.protocol import messages as m

    first: list[float] = []
    t0 = time.perf_counter() if t_start is None else t_start
    req = m.Generate(client.next_id(), ids=list(ids), max_tokens=max_tokens, stream=True)
    texts: list[str] = []
    done_events = []
    done = threading.Event()

    def emit(event):                     # the engine thread
        if event["event"] == "token":
            if not first:
                first.append(time.perf_counter())
            texts.append(event.get("text", ""))
        if event["event"] in ("done", "error"):
            done_events.append(event)
            done.set()

    client.engine.submit(req, emit)
    done.wait()
    if done_events[-1]["event"] == "error":
        raise RuntimeError(str(done_events[-1]))
    return first[0] - t0, "".join(texts)


def parse_window(text: str) -> tuple[int, int]:
    """Drafter scoring layers: "L" = the first L (0 = all), "F:L" = layers F..L-1 score ("F:" or
    "F:0": F to the last); -> (first_layer, layers)."""
    first, _, layers = text.rpartition(":")
    return int(first or 0), int(layers or 0)


def window_label(first: int, layers: int) -> str:
    return f"{first}:{layers or 'all'}" if first else str(layers or "all")


def pflash_ttft(client: InProcess, ids, max_tokens: int, keep: float, alpha: float,
                window: tuple[int, int] = (0, 0)) -> tuple[float, str, int]:
    from flashd.protocol import messages as m

    t0 = time.perf_counter()
    res = client.run(m.Compress(client.next_id(), ids=list(ids), keep=keep, alpha=alpha, first_layer=window[0],
                                layers=window[1]))
    ttft, text = generate_ttft(client, res["ids"], max_tokens, t_start=t0)
    return ttft, text, res["n_out"]


def summarise(rows: list[tuple[float, bool]]) -> dict:
    times = [t for t, _ in rows]
    return {"n": len(rows), "pass": sum(ok for _, ok in rows), "ttft_s": statistics.median(times),
            "ttft_min_s": min(times), "ttft_max_s": max(times)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, required=True, help="target GGUF (e.g. Qwen2.5-Coder-1.5B-Instruct)")
    ap.add_argument("--drafter", type=Path, required=True, help="PFlash drafter GGUF (e.g. Qwen2.5-Coder-0.5B)")
    ap.add_argument("--cases", type=int, default=20, help="cases per length")
    ap.add_argument("--lengths", default="4096,8192,16384,32768", help="prompt tokens (at most), comma separated")
    ap.add_argument("--keep", type=float, default=0.05, help="headline PFlash keep ratio")
    ap.add_argument("--alpha", type=float, default=0.7, help="headline FlashPrefill alpha")
    ap.add_argument("--layers", default="0", help="headline drafter scoring layers: L (the first L, 0 = all) or F:L")
    ap.add_argument("--forward-chunk", type=int, default=4096, help="drafter tokens per forward (multiple of 128)")
    ap.add_argument("--sweep-keeps", default="0.02,0.05,0.1", help="keep ratios of the sweep ('' = no sweep)")
    ap.add_argument("--sweep-alphas", default="0.12,0.5,0.7,0.85", help="alphas of the sweep")
    ap.add_argument("--sweep-layers", default="", help="scoring-layer windows of the sweep, e.g. 4:10,0 "
                                                        "('' = the headline's)")
    ap.add_argument("--sweep-cases", type=int, default=None, help="cases per sweep point (default --cases)")
    ap.add_argument("--last-chunks", type=int, default=1,
                    help="32-token chunks always kept at the prompt's end (PFlash's rule: 1; the question sits there)")
    ap.add_argument("--kinds", default="single", help="case kinds, comma separated (needles.KINDS: single, multi, "
                    "two-hop); the headline and the sweep use the first, the others get dense + headline PFlash rows")
    ap.add_argument("--max-tokens", type=int, default=24, help="generated tokens per case")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-llama", action="store_true", help="no llama.cpp column")
    ap.add_argument("--skip-dense", action="store_true", help="no flashd dense column")
    ap.add_argument("--llama-bench", type=Path, help="a built llama-bench (else built from --sdist)")
    ap.add_argument("--sdist", type=Path, help="llama_cpp_python-*.tar.gz to build llama-bench from")
    ap.add_argument("--build-dir", type=Path, default=Path("/tmp/llama-cpp-build"))
    ap.add_argument("--arch", default="90", help="CMAKE_CUDA_ARCHITECTURES for the llama-bench build")
    ap.add_argument("--llama-reps", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--rope-scaling", default=None, choices=("none", "linear", "yarn"),
                    help="as `flashd serve --rope-scaling` (e.g. yarn with --rope-factor 4 for 128K on Qwen2.5)")
    ap.add_argument("--rope-factor", type=float, default=None)
    ap.add_argument("--rope-orig-ctx", type=int, default=None)
    ap.add_argument("--vram-budget", default=None, help="as `flashd serve --vram-budget` (e.g. 24GiB): the load "
                    "refuses what the plan says would not fit, so a run that loads fits")
    ap.add_argument("--kv-type", default=None, help="the target's KV cache type (f16, q8_0, q4_0; or K/V)")
    ap.add_argument("--out", type=Path, default=None, help="folder for the markdown + json result")
    args = ap.parse_args(argv)

    from flashd.clients.chat_template import ChatTemplate
    from flashd.daemon.config import EngineConfig
    from flashd.daemon.engine import Engine
    from flashd.daemon.backends.kv_types import parse_kv_types
    from flashd.daemon.pflash.config import PFlashConfig
    from flashd.daemon.vram_budget import parse_size

    lengths = [int(x) for x in args.lengths.split(",") if x]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] or ["single"]
    keeps = [float(x) for x in args.sweep_keeps.split(",") if x]
    alphas = [float(x) for x in args.sweep_alphas.split(",") if x]
    headline = parse_window(args.layers)
    windows = [parse_window(x) for x in args.sweep_layers.split(",") if x] or [headline]
    sweep_cases = args.sweep_cases or args.cases
    max_ctx = max(lengths) + args.max_tokens
    rope = None if args.rope_scaling is None else (args.rope_scaling, args.rope_factor, args.rope_orig_ctx)
    kv_k, _, kv_v = (args.kv_type or "").partition("/")
    extra = dict(rope_override=rope, kv_types=parse_kv_types(kv_k or None, None, kv_v or None))
    if args.vram_budget:
        extra["vram_budget"] = parse_size(args.vram_budget)
    engine = Engine(EngineConfig(model=str(args.target), device=args.device, max_ctx=max_ctx, **extra,
                                 prefill_drafter=str(args.drafter), prefill_chunk=512,
                                 prefix_cache=False,     # every TTFT a cold prefill (cases may share a prefix)
                                 pflash=PFlashConfig(keep=args.keep, alpha=args.alpha,
                                                     last_chunks=args.last_chunks, forward_chunk=args.forward_chunk)))
    engine.load()
    engine.start()
    client = InProcess(engine)
    template = ChatTemplate.from_gguf(args.target)
    tok = engine.tokenizer
    results: dict = {"device": engine.backend.info(), "target": str(args.target), "drafter": str(args.drafter),
                     "rope_scaling": rope, "vram_budget": args.vram_budget, "kv_type": args.kv_type or "f16",
                     "keep": args.keep, "alpha": args.alpha, "layers": window_label(*headline), "last_chunks": args.last_chunks, "cases": args.cases,
                     "lengths": {}}
    try:
        for length in lengths:
            log(f"length {length}: making {args.cases} cases")
            cases = [make_case(tok, template, length - args.max_tokens, args.seed * 1_000_003 + length * 101 + i,
                               kind=kinds[0]) for i in range(max(args.cases, sweep_cases) + 1)]
            warm, cases = cases[0], cases[1:]
            row: dict = {"prompt_tokens": statistics.median(c.n_tokens for c in cases)}
            generate_ttft(client, warm.ids, 2)                              # warm-up (dense path)
            pflash_ttft(client, warm.ids, 2, args.keep, args.alpha, headline)      # warm-up (drafter)
            if not args.skip_dense:
                rows = []
                for c in cases[:args.cases]:
                    t, text = generate_ttft(client, c.ids, args.max_tokens)
                    rows.append((t, c.value in text))
                row["dense"] = summarise(rows)
                log(f"  dense: {row['dense']}")
            rows, kept = [], []
            for c in cases[:args.cases]:
                t, text, n_out = pflash_ttft(client, c.ids, args.max_tokens, args.keep, args.alpha, headline)
                rows.append((t, c.value in text))
                kept.append(n_out)
            row["pflash"] = {**summarise(rows), "kept_tokens": statistics.median(kept)}
            log(f"  pflash: {row['pflash']}")
            row["sweep"] = []
            for keep, alpha, window in itertools.product(keeps, alphas, windows):
                point = {"keep": keep, "alpha": alpha, "layers": window_label(*window)}
                if (keep, alpha, window) == (args.keep, args.alpha, headline) and sweep_cases <= args.cases:
                    row["sweep"].append({**point, **row["pflash"]})
                    continue
                rows, kept = [], []
                for c in cases[:sweep_cases]:
                    t, text, n_out = pflash_ttft(client, c.ids, args.max_tokens, keep, alpha, window)
                    rows.append((t, c.value in text))
                    kept.append(n_out)
                row["sweep"].append({**point, **summarise(rows), "kept_tokens": statistics.median(kept)})
                log(f"  sweep keep={keep} alpha={alpha} layers={point['layers']}: {row['sweep'][-1]}")
            row["kinds"] = {kinds[0]: {"dense": row.get("dense"), "pflash": row["pflash"]}}
            for kind in kinds[1:]:
                row["kinds"][kind] = harder_rows(client, tok, template, length, kind, args, headline)
                log(f"  {kind}: {row['kinds'][kind]}")
            results["lengths"][length] = row
    finally:
        engine.stop(10)

    if not args.skip_llama:
        from flashd.bench.compare_llama_cpp import build_llama_bench, run_llama_bench
        exe = args.llama_bench
        if exe is None:
            if args.sdist is None:
                raise SystemExit("--llama-bench or --sdist is needed for the llama.cpp column (or --skip-llama)")
            import os
            exe = build_llama_bench(args.sdist, args.build_dir, args.arch, os.cpu_count() or 4)
        for length, row in results["lengths"].items():
            n = int(row["prompt_tokens"])
            tps = run_llama_bench(exe, args.target, str(n), "0", "0", args.llama_reps)[f"pp{n}"]
            row["llama"] = {"prompt_tokens": n, "pp_tok_s": tps, "ttft_s": n / tps}
            log(f"llama.cpp pp{n}: {tps:.0f} tok/s -> {n / tps:.3f} s")

    md = format_markdown(results, args)
    print(md)
    if args.out is not None:
        stem = write_md_json(args.out, f"{datetime.date.today().isoformat()}-niah", md, results, indent=1, default=str)
        log(f"wrote {stem}.md and .json")
    return 0


def harder_rows(client, tok, template, length: int, kind: str, args, headline) -> dict:
    """Dense (unless --skip-dense) and headline-PFlash pass rates and TTFTs over args.cases cases of `kind`."""
    cases = [make_case(tok, template, length - args.max_tokens, args.seed * 1_000_003 + length * 101 + 500_000 + i,
                       kind=kind) for i in range(args.cases)]
    out = {}
    if not args.skip_dense:
        rows = []
        for c in cases:
            t, text = generate_ttft(client, c.ids, args.max_tokens)
            rows.append((t, c.value in text))
        out["dense"] = summarise(rows)
    rows = []
    for c in cases:
        t, text, _ = pflash_ttft(client, c.ids, args.max_tokens, args.keep, args.alpha, headline)
        rows.append((t, c.value in text))
    out["pflash"] = summarise(rows)
    return out


def format_markdown(results: dict, args) -> str:
    dev = results["device"]
    lines = [f"# PFlash NIAH: {Path(results['target']).name} + drafter {Path(results['drafter']).name}", "",
             f"Device: {dev.get('name', dev)}. {results['cases']} cases per length; headline keep={results['keep']}, "
             f"alpha={results['alpha']}, drafter scoring layers={results['layers']}, last {results['last_chunks']} chunk(s) always kept; TTFT = median seconds from request to first token (PFlash: compress + "
             f"generate of the kept ids; llama.cpp: prompt tokens / llama-bench pp tok/s, -fa 1).", "",
             "| tokens | flashd dense pass | flashd dense TTFT s | llama.cpp TTFT s | PFlash pass | PFlash TTFT s "
             "| kept tokens | vs llama.cpp | vs flashd dense |",
             "|---|---|---|---|---|---|---|---|---|"]
    for length, row in results["lengths"].items():
        dense, pf, ll = row.get("dense"), row["pflash"], row.get("llama")
        cells = [str(int(row["prompt_tokens"])),
                 f"{dense['pass']}/{dense['n']}" if dense else "-",
                 f"{dense['ttft_s']:.3f}" if dense else "-",
                 f"{ll['ttft_s']:.3f}" if ll else "-",
                 f"{pf['pass']}/{pf['n']}", f"{pf['ttft_s']:.3f}", str(int(pf["kept_tokens"])),
                 f"{ll['ttft_s'] / pf['ttft_s']:.1f}x" if ll else "-",
                 f"{dense['ttft_s'] / pf['ttft_s']:.1f}x" if dense else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Sweep (PFlash pass rate, median TTFT s, kept tokens)", "",
              "| tokens | keep | alpha | drafter layers | pass | TTFT s | kept tokens |", "|---|---|---|---|---|---|---|"]
    for length, row in results["lengths"].items():
        for s in row["sweep"]:
            lines.append(f"| {int(row['prompt_tokens'])} | {s['keep']} | {s['alpha']} | {s.get('layers', 'all')} | "
                         f"{s['pass']}/{s['n']} | "
                         f"{s['ttft_s']:.3f} | {int(s['kept_tokens'])} |")
    kinds = {k for row in results["lengths"].values() for k in row.get("kinds", {})}
    if len(kinds) > 1:
        lines += ["", "## Case kinds (pass: dense / headline PFlash; needles.py says what each kind is)", "",
                  "| tokens | kind | dense pass | PFlash pass | PFlash TTFT s |", "|---|---|---|---|---|"]
        for row in results["lengths"].values():
            for kind, r in row["kinds"].items():
                d, pf = r.get("dense"), r["pflash"]
                dense_cell = f"{d['pass']}/{d['n']}" if d else "-"
                lines.append(f"| {int(row['prompt_tokens'])} | {kind} | {dense_cell} | {pf['pass']}/{pf['n']} | "
                             f"{pf['ttft_s']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
