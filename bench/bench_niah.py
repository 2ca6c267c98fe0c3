"""PFlash needle-in-a-haystack: pass rate and time to first token, PFlash vs flashd's dense
prefill vs llama.cpp's dense prefill, on one GPU in one run.

    python bench/bench_niah.py --target qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --drafter qwen2.5-coder-0.5b-instruct-q8_0.gguf --llama-bench /tmp/llama-cpp-build/build/bin/llama-bench \
        --cases 20 --lengths 4096,8192,16384,32768 --out bench/results/

    python bench/bench_niah.py --target ... --drafter ... --auto --kinds single,multi-all,two-hop \
        --rope-scaling yarn --rope-factor 4 --rope-orig-ctx 32768 --lengths 8192,32768,65536,131072 ...

For every length and case kind (--kinds: needles.KINDS -- single, multi, multi-all, two-hop), `--cases` cases from
flashd.daemon.pflash.needles (needles at seeded depths in generated filler, the question at the end, sized with the
target's tokenizer to at most the length less the answer's tokens):

- flashd dense: `generate` of the whole prompt (greedy, --max-tokens per asked value); TTFT = wall time from the
  request to its first token event; pass = every value the question asks for appears in the output text.
- PFlash: `compress` (drafter resident, --keep, --alpha, --layers) then `generate` of the kept ids; TTFT =
  wall time from the compress request to the generate's first token (both requests included).
  With --auto instead: `generate compress=auto` with the drafter's stored calibration (`flashd pflash-calibrate`
  under the same --rope-* options; its band for each prompt's length) and --threshold; TTFT = that request to its
  first token (the compression inside it).
- llama.cpp: llama-bench -p LENGTH -n 0 -fa 1 -ngl 99 on the same target GGUF; TTFT = LENGTH /
  its prefill tok/s (a prefill time: llama-bench runs no NIAH, so no pass rate).
- Sweep (not with --auto): PFlash pass rate and TTFT for every (--sweep-keeps x --sweep-alphas x --sweep-layers),
  at every length, on the first kind's cases.

Each length runs one warm-up case first (graph capture, arena growth; not counted). Output: markdown tables
(niah_report.py; stdout, and --out/<date>-niah.md plus .json): the first kind's headline, the sweep, and every kind's
pass rate by length.
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

from flashd.bench.niah_report import format_markdown
from flashd.bench.out_files import write_md_json
from flashd.daemon.pflash.needles import ANSWER_VALUES, KINDS, case_seed, make_case


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


def generate_ttft(client: InProcess, ids, max_tokens: int, t_start: float | None = None,
                  **fields) -> tuple[float, str, dict]:
    """(seconds from t_start (default: now) to the first token, output text, the done event); fields: more Generate
    fields (compress=...)."""
    from flashd.protocol import messages as m

    first: list[float] = []
    t0 = time.perf_counter() if t_start is None else t_start
    req = m.Generate(client.next_id(), ids=list(ids), max_tokens=max_tokens, stream=True, **fields)
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
    return first[0] - t0, "".join(texts), done_events[-1]


def parse_window(text: str) -> tuple[int, int]:
    """Drafter scoring layers: "L" = the first L (0 = all), "F:L" = layers F..L-1 score ("F:" or
    "F:0": F to the last); -> (first_layer, layers)."""
    first, _, layers = text.rpartition(":")
    return int(first or 0), int(layers or 0)


def window_label(first: int, layers: int) -> str:
    return f"{first}:{layers or 'all'}" if first else str(layers or "all")


def setting_label(compressed: dict | None) -> str:
    """What a compression ran with (a result / done `compress` map: keep, first_layer, layers), or "dense"."""
    if compressed is None:
        return "dense"
    return f"keep {compressed['keep']:g} layers [{compressed['first_layer']}, {compressed['layers']})"


def pflash_ttft(client: InProcess, ids, max_tokens: int, keep: float, alpha: float,
                window: tuple[int, int] = (0, 0)) -> tuple[float, str, int, str]:
    """compress then generate of the kept ids: (TTFT s, answer, kept tokens, setting_label)."""
    from flashd.protocol import messages as m

    t0 = time.perf_counter()
    res = client.run(m.Compress(client.next_id(), ids=list(ids), keep=keep, alpha=alpha, first_layer=window[0],
                                layers=window[1]))
    ttft, text, _ = generate_ttft(client, res["ids"], max_tokens, t_start=t0)
    return ttft, text, res["n_out"], setting_label(res)


def auto_ttft(client: InProcess, ids, max_tokens: int) -> tuple[float, str, int, str]:
    """generate compress=auto (the daemon's calibrated bands and threshold): (TTFT s, answer, prompt tokens the
    target prefilled, setting_label)."""
    ttft, text, done = generate_ttft(client, ids, max_tokens, compress="auto")
    return ttft, text, done["n_prompt"], setting_label(done.get("compress"))


def summarise(rows: list[tuple[float, bool]]) -> dict:
    times = [t for t, _ in rows]
    return {"n": len(rows), "pass": sum(ok for _, ok in rows), "ttft_s": statistics.median(times),
            "ttft_min_s": min(times), "ttft_max_s": max(times)}


def pflash_rows(run, cases, budget: int) -> dict:
    """run(ids, max_tokens) -> (TTFT, answer, kept tokens, setting) over the cases: summarise() + the median kept
    tokens and the settings that ran."""
    rows, kept, settings = [], [], []
    for c in cases:
        t, text, n_kept, setting = run(c.ids, budget)
        rows.append((t, c.passed(text)))
        kept.append(n_kept)
        if setting not in settings:
            settings.append(setting)
    return {**summarise(rows), "kept_tokens": statistics.median(kept), "settings": settings}


def dense_rows(client: InProcess, cases, budget: int) -> dict:
    rows = []
    for c in cases:
        t, text, _ = generate_ttft(client, c.ids, budget)
        rows.append((t, c.passed(text)))
    return summarise(rows)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, required=True, help="target GGUF (e.g. Qwen2.5-Coder-1.5B-Instruct)")
    ap.add_argument("--drafter", type=Path, required=True, help="PFlash drafter GGUF (e.g. Qwen2.5-Coder-0.5B)")
    ap.add_argument("--cases", type=int, default=20, help="cases per length and kind")
    ap.add_argument("--lengths", default="4096,8192,16384,32768", help="prompt tokens (at most), comma separated")
    ap.add_argument("--kinds", default="single", help="case kinds, comma separated (needles.KINDS: "
                    f"{', '.join(KINDS)}); the headline table and the sweep use the first")
    ap.add_argument("--auto", action="store_true", help="PFlash rows: generate compress=auto with the drafter's "
                    "stored calibration (flashd pflash-calibrate with the same --rope-* options), not --keep/--layers")
    ap.add_argument("--threshold", type=int, default=None, help="--auto: compress prompts above this many tokens "
                    "(default: flashd serve's --compress-threshold default)")
    ap.add_argument("--keep", type=float, default=0.05, help="headline PFlash keep ratio")
    ap.add_argument("--alpha", type=float, default=0.7, help="FlashPrefill alpha (headline, and --auto's)")
    ap.add_argument("--layers", default="0", help="headline drafter scoring layers: L (the first L, 0 = all) or F:L")
    ap.add_argument("--forward-chunk", type=int, default=4096, help="drafter tokens per forward (multiple of 128)")
    ap.add_argument("--prefill-chunk", type=int, default=512,
                    help="the target's prompt tokens per prefill forward (`flashd serve --prefill-chunk`)")
    ap.add_argument("--sweep-keeps", default="0.02,0.05,0.1", help="keep ratios of the sweep ('' = no sweep)")
    ap.add_argument("--sweep-alphas", default="0.12,0.5,0.7,0.85", help="alphas of the sweep")
    ap.add_argument("--sweep-layers", default="", help="scoring-layer windows of the sweep, e.g. 4:10,0 "
                                                        "('' = the headline's)")
    ap.add_argument("--sweep-cases", type=int, default=None, help="cases per sweep point (default --cases)")
    ap.add_argument("--last-chunks", type=int, default=1,
                    help="32-token chunks always kept at the prompt's end (PFlash's rule: 1; the question sits there)")
    ap.add_argument("--max-tokens", type=int, default=24, help="generated tokens per asked value")
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
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] or ["single"]
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown or len(set(args.kinds)) != len(args.kinds):
        ap.error(f"--kinds: each of {', '.join(KINDS)} at most once, got {','.join(args.kinds)}")
    try:
        args.lengths = [int(x) for x in args.lengths.split(",") if x]
    except ValueError:
        ap.error(f"--lengths: comma-separated token counts, got {args.lengths!r}")
    if not args.lengths or min(args.lengths) <= args.max_tokens * max(ANSWER_VALUES[k] for k in args.kinds):
        ap.error("--lengths: every length must exceed the answer's tokens (--max-tokens per asked value)")
    if args.cases < 1 or args.max_tokens < 1:
        ap.error("--cases and --max-tokens must be >= 1")
    if args.threshold is not None and not args.auto:
        ap.error("--threshold is --auto's")
    if args.rope_scaling is None and (args.rope_factor is not None or args.rope_orig_ctx is not None):
        ap.error("--rope-factor / --rope-orig-ctx need --rope-scaling")
    return args


def pflash_config(args, rope):
    """The engine's PFlashConfig: the headline's, or under --auto the drafter's stored calibration (its bands) and
    --threshold; (config, the calibration's record or None). SystemExit when --auto finds no calibration."""
    from flashd.daemon.models import open_model
    from flashd.daemon.pflash.calibration_store import calibrated_pflash, load_calibration, rope_tag
    from flashd.daemon.pflash.config import PFlashConfig

    base = PFlashConfig(keep=args.keep, alpha=args.alpha, last_chunks=args.last_chunks,
                        forward_chunk=args.forward_chunk,
                        **({"threshold": args.threshold} if args.threshold is not None else {}))
    if not args.auto:
        return base, None
    tag = rope_tag(open_model(args.drafter, rope)[1].rope_scaling)
    calibration = load_calibration(args.drafter, tag)
    if calibration is None:
        raise SystemExit(f"--auto: no calibration stored for {args.drafter.name}{' under ' + tag if tag else ''}; run "
                         f"`flashd pflash-calibrate --drafter {args.drafter}` with the same --rope-* options first")
    return calibrated_pflash(base, calibration), calibration.as_dict()


def make_cases(tok, template, length: int, kind: str, args, n: int, first: int = 0) -> list:
    """n cases of `kind` (case_seed's bench stream from index `first`), sized to leave the answer's tokens."""
    size = length - args.max_tokens * ANSWER_VALUES[kind]
    return [make_case(tok, template, size, case_seed("bench", args.seed, length, kind, first + i), kind=kind)
            for i in range(n)]


def measure_length(client: InProcess, tok, template, length: int, args, headline, sweep_points) -> dict:
    """Every kind's dense and PFlash rows at one length; the first kind's sweep."""
    sweep_cases = args.sweep_cases or args.cases
    first = args.kinds[0]
    log(f"length {length}: making {args.cases} cases of {', '.join(args.kinds)}")
    cases = make_cases(tok, template, length, first, args, max(args.cases, sweep_cases) + 1)
    warm, cases = cases[0], cases[1:]              # case 0 of the first kind: the warm-up (not counted)
    generate_ttft(client, warm.ids, 2)                                  # the dense path
    if args.auto:
        generate_ttft(client, warm.ids, 2, compress="always")           # the drafter at this length's band
    else:
        pflash_ttft(client, warm.ids, 2, args.keep, args.alpha, headline)
    row: dict = {"prompt_tokens": statistics.median(c.n_tokens for c in cases), "kinds": {}}
    for kind in args.kinds:
        kind_cases = cases[:args.cases] if kind == first else make_cases(tok, template, length, kind, args, args.cases)
        budget = args.max_tokens * ANSWER_VALUES[kind]
        r: dict = {"prompt_tokens": statistics.median(c.n_tokens for c in kind_cases)}
        if not args.skip_dense:
            r["dense"] = dense_rows(client, kind_cases, budget)
            log(f"  {kind} dense: {r['dense']}")
        if args.auto:
            r["pflash"] = pflash_rows(lambda ids, n: auto_ttft(client, ids, n), kind_cases, budget)
        else:
            r["pflash"] = pflash_rows(lambda ids, n: pflash_ttft(client, ids, n, args.keep, args.alpha, headline),
                                      kind_cases, budget)
        log(f"  {kind} pflash{' auto' if args.auto else ''}: {r['pflash']}")
        row["kinds"][kind] = r
    row["dense"], row["pflash"] = row["kinds"][first].get("dense"), row["kinds"][first]["pflash"]
    row["sweep"] = []
    for keep, alpha, window in sweep_points:
        point = {"keep": keep, "alpha": alpha, "layers": window_label(*window)}
        if (keep, alpha, window) == (args.keep, args.alpha, headline) and sweep_cases <= args.cases:
            row["sweep"].append({**point, **row["pflash"]})
            continue
        budget = args.max_tokens * ANSWER_VALUES[first]
        row["sweep"].append({**point, **pflash_rows(
            lambda ids, n: pflash_ttft(client, ids, n, keep, alpha, window), cases[:sweep_cases], budget)})
        log(f"  sweep keep={keep} alpha={alpha} layers={point['layers']}: {row['sweep'][-1]}")
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    from flashd.clients.chat_template import ChatTemplate
    from flashd.daemon.backends.kv_types import parse_kv_types
    from flashd.daemon.config import EngineConfig
    from flashd.daemon.engine import Engine
    from flashd.daemon.pflash.calibration_store import describe_bands
    from flashd.daemon.vram_budget import parse_size

    headline = parse_window(args.layers)
    windows = [parse_window(x) for x in args.sweep_layers.split(",") if x] or [headline]
    keeps = [float(x) for x in args.sweep_keeps.split(",") if x]
    alphas = [float(x) for x in args.sweep_alphas.split(",") if x]
    sweep_points = [] if args.auto else list(itertools.product(keeps, alphas, windows))
    rope = None if args.rope_scaling is None else (args.rope_scaling, args.rope_factor, args.rope_orig_ctx)
    pflash, calibration = pflash_config(args, rope)
    kv_k, _, kv_v = (args.kv_type or "").partition("/")
    extra = dict(rope_override=rope, kv_types=parse_kv_types(kv_k or None, None, kv_v or None))
    if args.vram_budget:
        extra["vram_budget"] = parse_size(args.vram_budget)
    engine = Engine(EngineConfig(model=str(args.target), device=args.device, max_ctx=max(args.lengths) + args.max_tokens,
                                 **extra, prefill_drafter=str(args.drafter), prefill_chunk=args.prefill_chunk,
                                 prefix_cache=False,     # every TTFT a cold prefill (cases may share a prefix)
                                 pflash=pflash))
    engine.load()
    engine.start()
    client = InProcess(engine)
    template = ChatTemplate.from_gguf(args.target)
    results: dict = {"device": engine.backend.info(), "target": str(args.target), "drafter": str(args.drafter),
                     "rope_scaling": rope, "vram_budget": args.vram_budget, "kv_type": args.kv_type or "f16",
                     "mode": "auto" if args.auto else "explicit", "kinds": args.kinds, "keep": args.keep,
                     "prefill_chunk": args.prefill_chunk,
                     "alpha": args.alpha, "layers": window_label(*headline), "last_chunks": args.last_chunks,
                     "cases": args.cases, "max_tokens_per_value": args.max_tokens, "threshold": pflash.threshold,
                     "calibration": calibration, "bands_text": describe_bands(pflash.bands), "lengths": {}}
    try:
        for length in args.lengths:
            results["lengths"][length] = measure_length(client, engine.tokenizer, template, length, args, headline,
                                                        sweep_points)
    finally:
        engine.stop(10)
    if not args.skip_llama:
        llama_column(results, args)
    md = format_markdown(results)
    print(md)
    if args.out is not None:
        stem = write_md_json(args.out, f"{datetime.date.today().isoformat()}-niah", md, results, indent=1, default=str)
        log(f"wrote {stem}.md and .json")
    return 0


def llama_column(results: dict, args) -> None:
    """llama.cpp's dense prefill at each length's median prompt (llama-bench pp, -fa 1): TTFT = tokens / tok/s."""
    from flashd.bench.compare_llama_cpp import build_llama_bench, run_llama_bench
    exe = args.llama_bench
    if exe is None:
        if args.sdist is None:
            raise SystemExit("--llama-bench or --sdist is needed for the llama.cpp column (or --skip-llama)")
        import os
        exe = build_llama_bench(args.sdist, args.build_dir, args.arch, os.cpu_count() or 4)
    for row in results["lengths"].values():
        n = int(row["prompt_tokens"])
        tps = run_llama_bench(exe, args.target, str(n), "0", "0", args.llama_reps)[f"pp{n}"]
        row["llama"] = {"prompt_tokens": n, "pp_tok_s": tps, "ttft_s": n / tps}
        log(f"llama.cpp pp{n}: {tps:.0f} tok/s -> {n / tps:.3f} s")


if __name__ == "__main__":
    raise SystemExit(main())
