"""Speculative decoding benchmark: flashd's drafters (draft model, n-grams, optional DFlash) in
chain and DDTree mode over a budget sweep, against flashd's own plain decoding, and llama.cpp's
plain (llama-simple), draft-model and n-gram speculative decoding (llama-speculative-simple with
--spec-type draft-simple and one row per n-gram type: ngram-simple, ngram-map-k, ngram-mod by
default; the common_speculative path llama-server uses) on the same prompts and GPU; with --dflash
also llama.cpp's --spec-type draft-dflash running that same drafter, exported to llama.cpp's layout
(scripts/export_dflash_llama_cpp.py) -- where llama.cpp can run it: not for a qwen2 target in this
llama.cpp, whose row then says why (bench/llama_spec.py). Prints a markdown table. The llama.cpp side
(its command lines and output parsing) is bench/llama_spec.py.

    python bench/bench_spec.py --sdist llama_cpp_python-0.3.36.tar.gz \
        [--target qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b] [--dflash PATH] \
        [--prompts bench/spec_prompts.jsonl] [--max-tokens 256] [--out bench/results/]
    python bench/bench_spec.py --skip-llama --quick          # flashd only, 8 prompts, 3 configs
    python bench/bench_spec.py --sdist ... --build-dir /tmp/lcp-build --arch cpu --build-only

Method: greedy decoding (temperature 0), every prompt once per configuration and round after a
warm-up pass over the first prompts for every configuration (CUDA graph capture of each tree size
happens there); with --rounds N the timed passes are interleaved (plain, then every configuration,
N times) and each row is its median pass. Decode speed is
(tokens - 1) / (time from the first generated token to the last): prefill excluded, as
llama-speculative-simple's "decoded ... t/s" does. llama-simple's t/s includes its prompt's
evaluation (short prompts: a few percent). Every speculative output is compared with flashd's
plain output of the same prompt (column "exact": prompts with identical tokens). A llama.cpp row
whose tool failed shows no speed and the tool's message in that column.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from flashd.bench.out_files import commit_label, file_label
from flashd.bench.llama_spec import (DEFAULT_NGRAM_TYPES, NGRAM_TYPES, LlamaResult, LlamaRun, build_llama_tools,
                                     export_dflash, llama_runs, run_llama)

HERE = Path(__file__).resolve().parent


def log(msg: str) -> None:
    print(f"[bench_spec {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Row:
    system: str
    drafter: str
    mode: str
    budget: str
    tok_s: float
    tokens_per_step: float | None = None
    accepted_per_step: float | None = None
    draft_ms_step: float | None = None
    verify_ms_step: float | None = None
    exact: str = ""
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------- flashd

def load_flashd(target: str, max_ctx: int, device: str, tuning: str = ""):
    """The engine, loaded, and the CUDA launch tuning in effect (set before the load: graphs are captured with it;
    None on another backend)."""
    from flashd.clients.registry import resolve_model
    from flashd.daemon.bench_cli import apply_tuning, parse_tuning
    from flashd.daemon.config import EngineConfig
    from flashd.daemon.engine import Engine

    engine = Engine(EngineConfig(model=str(resolve_model(target)), device=device, max_ctx=max_ctx))
    in_effect = apply_tuning(engine.backend, parse_tuning(tuning))
    engine.load()
    return engine, in_effect


def ngram_config(text: str):
    """NgramConfig from 'field=value,...' (integers; '' = the defaults)."""
    from flashd.daemon.speculative.ngram import NgramConfig

    fields = dict(kv.strip().split("=", 1) for kv in text.split(",") if kv.strip())
    return NgramConfig(**{k: int(v) for k, v in fields.items()})


def make_drafters(engine, draft: str | None, dflash: str | None, quick: bool, ngram_fields: str = ""):
    """[(label, drafter, mode, budget)] of the configurations to run."""
    from flashd.clients.registry import resolve_model
    from flashd.daemon.speculative.draft_model import DraftModelConfig, DraftModelDrafter
    from flashd.daemon.speculative.loader import DrafterContext, load_drafter
    from flashd.daemon.speculative.ngram import NgramDrafter

    ctx = DrafterContext(backend=engine.backend, target_file=engine.model.file, target_model=engine.model,
                         max_ctx=engine.config.max_ctx, prefill_chunk=engine.config.prefill_chunk)
    configs = []
    if draft:
        base = load_drafter(str(resolve_model(draft)), ctx)
        runner, name = base.runner, base.name

        def dm(depth):
            return DraftModelDrafter(runner, name, DraftModelConfig(max_depth=depth))

        # verification reads the weights once per 8 tree rows (row-invariant GEMVs, cuda/ops.py), so
        # budgets 7, 15, 22 (3 passes), 32, 48 span one to seven passes
        chains = [4] if quick else [3, 5, 7]
        trees = [(6, 7)] if quick else [(6, 7), (6, 22), (8, 48)]
        configs += [(name, dm(d), "chain", d) for d in chains]
        configs += [(name, dm(d), "ddtree", b) for d, b in trees]
        configs += [(name, dm(7), "auto", 7)]
    ngram = NgramDrafter(ngram_config(ngram_fields))
    configs += [("ngram", ngram, "chain", 7)] + ([] if quick else [("ngram", ngram, "chain", 3),
                                                                     ("ngram", ngram, "ddtree", 7),
                                                                     ("ngram", ngram, "ddtree", 22)])
    configs += [("ngram", ngram, "auto", 7)]
    if dflash:
        dfl = load_drafter(str(dflash), ctx)
        configs += [(dfl.name, dfl, "chain", dfl.max_depth)]
        configs += [(dfl.name, dfl, "ddtree", b) for b in ([22] if quick else [8, 16, 22, 32, 64])]
        configs += [(dfl.name, dfl, "auto", dfl.max_depth)]   # spec=auto must not lose to plain (issue 12, item 4)
    # loading drafter models may grow the shared scratch arena: recapture graphs (as engine.py does)
    for runner in {id(r): r for r in [engine.runner] + [getattr(d, "runner", None) for _, d, _, _ in configs]}.values():
        if hasattr(runner, "drop_graphs"):
            runner.drop_graphs()
    return configs


def timed(gen) -> tuple[list[int], float]:
    """(tokens, seconds from the first token to the last)."""
    out, t_first = [], None
    for s in gen:
        if t_first is None:
            t_first = time.perf_counter()
        out.append(s.token)
    return out, (time.perf_counter() - t_first) if t_first else 0.0


@dataclass
class Pass:
    """One timed pass of a configuration over every prompt."""
    tok_s: float
    outputs: list
    steps: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0


def median_pass(passes: list[Pass]) -> Pass:
    """The pass of median speed (the lower middle one of an even count), whose own stats the row then shows."""
    return sorted(passes, key=lambda p: p.tok_s)[(len(passes) - 1) // 2]


def plain_pass(runner, prompts, greedy, max_tokens) -> Pass:
    outs, n_tok, secs = [], 0, 0.0
    for p in prompts:
        toks, dt = timed(runner.generate(p, greedy, max_tokens))
        outs.append(toks)
        n_tok, secs = n_tok + len(toks) - 1, secs + dt
    return Pass(n_tok / secs, outs)


def spec_pass(runner, drafter, cfg, policy, prompts, greedy, max_tokens) -> Pass:
    from flashd.daemon.speculative.decoder import SpecDecoder

    out = Pass(0.0, [])
    n_tok, secs = 0, 0.0
    for p in prompts:
        dec = SpecDecoder(runner, drafter, cfg, policy)
        toks, dt = timed(dec.generate(p, greedy, max_tokens))
        out.outputs.append(toks)
        n_tok, secs = n_tok + len(toks) - 1, secs + dt
        st = dec.stats
        out.steps, out.accepted = out.steps + st.steps, out.accepted + st.accepted
        out.draft_s, out.verify_s = out.draft_s + st.draft_s, out.verify_s + st.verify_s
    out.tok_s = n_tok / secs
    return out


def run_flashd(engine, prompts: list[list[int]], max_tokens: int, configs, n_warm: int, rounds: int = 1) -> list[Row]:
    """Plain decoding and every configuration, warmed up first (graph captures), then `rounds` timed passes each,
    interleaved round by round (plain, then every configuration) so that a slow stretch of the machine falls on all
    of them alike; each row is its median pass (extra["rounds_tok_s"]: every pass's speed). A speculative pass's
    "exact" counts its outputs equal to the first plain pass's."""
    from flashd.daemon.speculative.decoder import SpecConfig, SpecDecoder
    from flashd.daemon.speculative.policy import DepthPolicy
    from flashd.protocol.messages import SamplingParams

    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    greedy = SamplingParams()
    runner = engine.runner
    for p in prompts[:n_warm]:
        timed(runner.generate(p, greedy, max_tokens))
    # spec=auto: one policy per configuration, learning from the warm-up on (as the engine keeps one)
    setups = [(SpecConfig(mode, budget), DepthPolicy(budget) if mode == "auto" else None) for _, _, mode, budget in configs]
    for (_, drafter, _, _), (cfg, policy) in zip(configs, setups):
        for p in prompts[:n_warm]:
            timed(SpecDecoder(runner, drafter, cfg, policy).generate(p, greedy, max_tokens))
    plain, spec = [], [[] for _ in configs]
    for r in range(rounds):
        plain.append(plain_pass(runner, prompts, greedy, max_tokens))
        log(f"flashd plain{f' (round {r + 1})' if rounds > 1 else ''}: {plain[-1].tok_s:.1f} tok/s")
        for (label, drafter, mode, budget), (cfg, policy), passes in zip(configs, setups, spec):
            passes.append(spec_pass(runner, drafter, cfg, policy, prompts, greedy, max_tokens))
            ps = passes[-1]
            log(f"flashd {label} {mode} {budget}: {ps.tok_s:.1f} tok/s, {(ps.accepted + ps.steps) / ps.steps:.2f} "
                f"tokens/step" + (f", policy {policy.info()}" if policy else ""))
    want = plain[0].outputs
    base = median_pass(plain)
    rows = [Row("flashd", "-", "plain", "-", base.tok_s)]
    if rounds > 1:
        rows[0].extra["rounds_tok_s"] = [round(p.tok_s, 1) for p in plain]
    for (label, drafter, mode, budget), (cfg, policy), passes in zip(configs, setups, spec):
        m = median_pass(passes)
        exact = sum(got == w for got, w in zip(m.outputs, want))
        row = Row("flashd", label, mode, str(budget), m.tok_s, (m.accepted + m.steps) / m.steps, m.accepted / m.steps,
                  1e3 * m.draft_s / m.steps, 1e3 * m.verify_s / m.steps, f"{exact}/{len(prompts)}")
        if rounds > 1:
            row.extra["rounds_tok_s"] = [round(p.tok_s, 1) for p in passes]
            row.extra["rounds_exact"] = [sum(got == w for got, w in zip(p.outputs, want)) for p in passes]
        if policy:
            row.extra["policy"] = policy.info()
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------- llama.cpp

def llama_rows(results) -> list[Row]:
    """bench/llama_spec.py's results as table rows; a failed run keeps the tool's message in the exact
    column and no number (nan)."""
    rows = []
    for r in results:
        extra = {"spec_type": r.run.spec_type, "n_drafted": r.n_drafted, "n_accept": r.n_accept,
                 "prompts_with_counts": r.n_counted}
        if r.accept_rate is not None:
            extra["accept_rate"] = r.accept_rate
        failed = (r.failed or "").replace("|", "\\|")          # the message sits in a markdown cell
        rows.append(Row("llama.cpp", r.run.drafter, r.run.mode, r.run.budget, r.tok_s, exact=failed, extra=extra))
    return rows


# ----------------------------------------------------------------------------------------- table

def table(rows: list[Row], title: str) -> str:
    def f(x, spec=".2f"):
        return "" if x is None else format(x, spec)

    base = {r.system: r.tok_s for r in rows if r.mode == "plain"}
    lines = [title, "",
             "| system | drafter | mode | budget | tok/s | vs own plain | tokens/step | accepted/step "
             "| draft ms/step | verify ms/step | exact |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        ok = r.tok_s == r.tok_s          # nan: a failed llama.cpp tool, no number to show
        ratio = f"{r.tok_s / base[r.system]:.2f}x" if ok and base.get(r.system, 0) > 0 else ""
        acc = f(r.accepted_per_step) or (f"accept {100 * r.extra['accept_rate']:.1f}%" if "accept_rate" in r.extra else "")
        speed = f"{r.tok_s:.1f}" if ok else "failed"
        lines.append(f"| {r.system} | {r.drafter} | {r.mode} | {r.budget} | {speed} | {ratio} | "
                     f"{f(r.tokens_per_step)} | {acc} | {f(r.draft_ms_step)} | {f(r.verify_ms_step)} | {r.exact} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b", help="model name or GGUF path")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model name or path ('' = none)")
    ap.add_argument("--dflash", default=None, help="a DFlash drafter GGUF (optional)")
    ap.add_argument("--ngram", default="", metavar="FIELD=VALUE,...",
                    help="the n-gram drafter's NgramConfig fields, e.g. min_ngram=1 (bench/ngram_offline.py estimates "
                         "them on the CPU)")
    ap.add_argument("--prompts", type=Path, default=HERE / "spec_prompts.jsonl")
    ap.add_argument("--n-prompts", type=int, default=None, help="first N prompts (default all)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-ctx", type=int, default=2048)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warmup", type=int, default=2, help="prompts run once untimed per configuration")
    ap.add_argument("--rounds", type=int, default=1,
                    help="timed passes of plain decoding and of every configuration, interleaved; each row shows its "
                         "median pass (the quick set's speculative rows spread up to ~+-8%% between single passes)")
    ap.add_argument("--quick", action="store_true", help="8 prompts and one config per drafter/mode")
    ap.add_argument("--skip-llama", action="store_true", help="flashd only")
    ap.add_argument("--sdist", type=Path, help="llama_cpp_python-*.tar.gz (its vendored llama.cpp is built)")
    ap.add_argument("--llama-bin", type=Path, help="folder with built llama-simple and llama-speculative-simple")
    ap.add_argument("--build-dir", type=Path, default=Path("/tmp/llama-cpp-build"))
    ap.add_argument("--arch", default="90", help="CMAKE_CUDA_ARCHITECTURES, or 'cpu' for a build without CUDA")
    ap.add_argument("--llama-draft-max", type=int, default=16,
                    help="llama.cpp's draft length cap: --spec-draft-n-max, or the n-gram type's own length flag")
    ap.add_argument("--llama-ngram-types", default=",".join(DEFAULT_NGRAM_TYPES),
                    help=f"comma-separated llama.cpp n-gram --spec-type rows ('' = none); of {', '.join(NGRAM_TYPES)}")
    ap.add_argument("--llama-dflash", type=Path, default=None,
                    help="a DFlash drafter GGUF in llama.cpp's own layout (its convert_hf_to_gguf.py) for the "
                         "draft-dflash row; default: --dflash exported to that layout (scripts/"
                         "export_dflash_llama_cpp.py), a row llama.cpp 0.3.36 runs for llama / qwen3 / qwen35 "
                         "targets only -- its qwen2 graph records no layer inputs, so for Qwen2.5 the row is a "
                         "failure saying so (bench/llama_spec.py)")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="folder for the markdown + json result")
    ap.add_argument("--tuning", default="", metavar="FIELD=N,...",
                    help="CUDA launch tuning overrides (flashd_tuning.h), e.g. gemv_rows=1: set before the load, so every "
                         "graph is captured with it; the table's title prints the tuning in effect")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    try:
        ngram_config(args.ngram)                                  # a bad --ngram fails before any loading
    except (TypeError, ValueError) as exc:
        ap.error(f"--ngram: {exc}")

    bin_dir = args.llama_bin
    try:
        ngram_types = [t for t in args.llama_ngram_types.split(",") if t]
        llama_runs(None, args.llama_draft_max, ngram_types)          # checks the names before any work
    except ValueError as exc:
        ap.error(str(exc))
    if not args.skip_llama and bin_dir is None:
        if args.sdist is None:
            ap.error("--sdist or --llama-bin is required (or --skip-llama)")
        bin_dir = build_llama_tools(args.sdist, args.build_dir, args.arch, log)
    if args.build_only:
        print(bin_dir)
        return 0

    records = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    n = args.n_prompts or (8 if args.quick else len(records))
    texts = [r["text"] for r in records[:n]]
    engine, tuning = load_flashd(args.target, args.max_ctx, args.device, args.tuning)
    prompts = [engine.tokenizer.encode(t) for t in texts]
    configs = make_drafters(engine, args.draft or None, args.dflash, args.quick, args.ngram)
    rows = run_flashd(engine, prompts, args.max_tokens, configs, args.warmup, args.rounds)
    if not args.skip_llama:
        from flashd.clients.registry import resolve_model
        draft = Path(resolve_model(args.draft)) if args.draft else None   # none: plain and n-gram rows only
        target = Path(engine.model.path)
        llama_dflash, not_run = args.llama_dflash, []
        if llama_dflash is None and args.dflash:         # flashd's drafter in llama.cpp's layout, if it can run there
            llama_dflash, why = export_dflash(Path(resolve_model(args.dflash)), target, args.build_dir / "dflash")
            if why:
                log(f"llama.cpp draft-dflash row: {why}")
                not_run = [LlamaResult(LlamaRun(Path(args.dflash).stem, "chain", "llama-speculative-simple",
                                                "draft-dflash"), failed=why)]
        runs = llama_runs(draft, args.llama_draft_max, ngram_types, llama_dflash)
        rows += llama_rows(run_llama(bin_dir, runs, target, texts, args.max_tokens, log) + not_run)
    commit = commit_label(HERE)
    device = engine.backend.info() if hasattr(engine.backend, "info") else {}
    title = (f"### Speculative decoding: {Path(engine.model.path).name}, {len(prompts)} prompts x {args.max_tokens} "
             f"tokens, greedy; {device.get('name', args.device) if isinstance(device, dict) else device}; "
             f"flashd {commit}, {datetime.date.today()}"
             + (f"; median of {args.rounds} interleaved rounds" if args.rounds > 1 else "")
             + (f"; tuning {', '.join(f'{k}={v}' for k, v in tuning.items())}" if tuning else ""))
    text = table(rows, title)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = f"spec-{datetime.date.today().isoformat()}-{file_label(commit)}"
        (args.out / f"{stamp}.md").write_text(text + "\n")
        (args.out / f"{stamp}.json").write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
