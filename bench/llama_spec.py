"""llama.cpp's side of bench_spec.py: plain decoding (llama-simple) and speculative decoding
(llama-speculative-simple) with a draft model and with its n-gram drafters, over the same prompts.

Written against the llama.cpp vendored in llama-cpp-python 0.3.36 (vendor/llama.cpp); the sources
each rule below comes from are named beside it:

* common/common.h: `common_params_speculative::types` defaults to {NONE}; with only NONE,
  common_speculative_init (common/speculative.cpp) builds no implementation and
  examples/speculative-simple prints "failed to initialize speculative decoding" and exits 1.
  So every speculative run passes `--spec-type` (common/arg.cpp), one of SPEC_TYPES.
* Each type reads its draft length from its own flag (common_speculative_n_max in
  common/speculative.cpp): draft-* types `--spec-draft-n-max` (the old --draft/--draft-max are
  removed: common/arg.cpp's arg_removed), ngram-simple/-map-k/-map-k4v the m-gram length
  `--spec-ngram-*-size-m`, ngram-mod `--spec-ngram-mod-n-max`; ngram-cache drafts a fixed 8
  (create_state_ngram_cache: "n_draft = 8; // TODO get from config?").
* draft-simple needs a draft model (`-md`; without one common_speculative_impl_draft_simple
  throws "draft-simple requires a draft context"); the n-gram types need none.
* draft-dflash loads a GGUF of llama.cpp's own DFlash layout (src/models/dflash.cpp: tensors
  fc.weight, enc.output_norm.weight, key dflash.target_layers holding layer ids + 1 as
  conversion/qwen.py writes them, a float32 dflash.rope.freq_base, the target's tokenizer with
  tokenizer.ggml.mask_token_id). flashd's DFlash GGUF (scripts/convert_dflash.py, flashd
  train-drafter) names them dflash.fc.weight, dflash.hidden_norm.weight, dflash.target_layer_ids,
  dflash.mask_token_id, stores the theta as float64 and carries no tokenizer, so llama.cpp does not
  load it ("key dflash.rope.freq_base has wrong type f64 but expected type f32"). The two compute the
  same drafter (scripts/export_dflash_llama_cpp.py's docstring: every piece compared), so
  `export_dflash` writes llama.cpp's layout of the same bytes; bench/compare_dflash_llama_cpp.py shows
  llama.cpp's drafts equal to flashd's on the CPU. The row runs `--spec-draft-n-max block_size - 1`
  (dflash_n_max): llama.cpp decodes a block of n_max + 1 tokens, and only the full block is the
  function flashd drafts with (its attention over the block is non-causal, so a shorter block changes
  every row). llama.cpp can run it only for a target whose graph records layer inputs (the
  extraction DFlash needs): not qwen2 (src/models/qwen2.cpp sets no res->t_layer_inp, so llama.cpp
  aborts: GGML_ASSERT "layer input tensor is null", src/llama-graph.cpp), i.e. not the shipped
  drafter's Qwen2.5-Coder-1.5B target; there the row is a failure that says so.

What the tools print (parse_llama_output): llama-simple's stderr line
"main: decoded %d tokens in %.2f s, speed: %.2f t/s" (examples/simple/simple.cpp, prompt
evaluation included); llama-speculative-simple's LOG_INF lines, on stderr at the default
verbosity (common/log.cpp), "decoded %4d tokens in %8.3f seconds, speed: %8.3f t/s" (prompt
excluded) and "n_drafted = %d", "n_accept  = %d" (examples/speculative-simple). Those LOG_INF
lines go through common/log.cpp's asynchronous logger, whose singleton is leaked on purpose and not
flushed at exit (common_log_main: "this design may cause logs to be lost if not flushed before the
program exits"), and the tool returns without flushing it: a run's last lines can be missing (seen
on the CPU build: a failing draft-dflash run ended without its "failed to ..." lines). So a run that
exits 0 without its "decoded" line is run again (LOST_LOG_RETRIES), acceptance totals come only
from runs that printed both counts, and a failure is described by its first error line.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

LLAMA_TOOLS = ("llama-simple", "llama-speculative-simple")

# common/speculative.cpp's common_speculative_type_from_name_map, in its order
SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
              "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
NGRAM_TYPES = tuple(t for t in SPEC_TYPES if t.startswith("ngram-"))
DEFAULT_NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod")

# the flag that caps each n-gram type's draft length (common_speculative_n_max); ngram-cache has none
NGRAM_LENGTH_FLAG = {"ngram-simple": "--spec-ngram-simple-size-m", "ngram-map-k": "--spec-ngram-map-k-size-m",
                     "ngram-map-k4v": "--spec-ngram-map-k4v-size-m", "ngram-mod": "--spec-ngram-mod-n-max"}
# ngram-mod discards a draft shorter than n-min (draft_one in common/speculative.cpp); its defaults
# are n-max 64, n-min 48 (common.h), so the cap keeps that 3/4 ratio rather than n-min > n-max
NGRAM_MOD_MIN_FRACTION = 48 / 64


@dataclass(frozen=True)
class LlamaRun:
    """One llama.cpp row: the tool, its --spec-type (None for llama-simple) and that type's flags."""
    drafter: str                     # the table's drafter column
    mode: str                        # "plain", "chain" (draft model) or "ngram"
    tool: str
    spec_type: str | None = None
    spec_args: tuple[str, ...] = ()  # the type's own flags (draft model, draft length)
    budget: str = "-"


@dataclass
class LlamaResult:
    run: LlamaRun
    tok_s: float = float("nan")
    n_tokens: int = 0
    n_drafted: int = 0
    n_accept: int = 0
    n_counted: int = 0               # prompts whose n_drafted and n_accept lines both arrived
    failed: str | None = None        # the failing tool's own words; tok_s stays nan

    @property
    def accept_rate(self) -> float | None:
        return self.n_accept / self.n_drafted if self.n_drafted else None


def ngram_args(spec_type: str, draft_max: int) -> tuple[tuple[str, ...], str]:
    """(flags, budget text) capping an n-gram type's draft at draft_max; llama.cpp's other n-gram
    settings (lookup lengths, min hits) stay at its defaults."""
    if spec_type == "ngram-cache":
        return (), "8 (fixed)"
    flag = NGRAM_LENGTH_FLAG[spec_type]
    if spec_type == "ngram-mod":
        n_min = max(1, round(draft_max * NGRAM_MOD_MIN_FRACTION))
        return (flag, str(draft_max), "--spec-ngram-mod-n-min", str(n_min)), f"max {draft_max}, min {n_min}"
    return (flag, str(draft_max)), f"max {draft_max}"


def dflash_n_max(dflash: Path) -> int:
    """--spec-draft-n-max for a llama.cpp-layout DFlash GGUF: its block_size - 1 (the block it was trained
    with; common/speculative.cpp reads dflash.block_size, 16 when absent, and clamps n_max to it - 1)."""
    import gguf

    field = gguf.GGUFReader(dflash).fields.get("dflash.block_size")
    return (int(field.contents()) if field is not None else 16) - 1


def export_dflash(dflash: Path, target: Path, out_dir: Path) -> tuple[Path | None, str | None]:
    """flashd's DFlash GGUF written in llama.cpp's layout under out_dir (scripts/export_dflash_llama_cpp.py),
    or None and the reason llama.cpp cannot run it for this target."""
    from flashd.scripts.export_dflash_llama_cpp import ExportError, export

    out = Path(out_dir) / f"{Path(dflash).stem}-llama-cpp.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        export(dflash, target, out)
    except ExportError as exc:
        return None, f"not run: {exc}"
    return out, None


def llama_runs(draft: Path | None, draft_max: int, ngram_types: Sequence[str] = DEFAULT_NGRAM_TYPES,
               dflash: Path | None = None) -> list[LlamaRun]:
    """The rows to run: plain, the draft-model chain (when there is a draft), a llama.cpp-layout DFlash
    drafter (when given; its full block, dflash_n_max, not draft_max), one row per n-gram type."""
    unknown = [t for t in ngram_types if t not in NGRAM_TYPES]
    if unknown:
        raise ValueError(f"not llama.cpp n-gram speculative types: {unknown}; known: {', '.join(NGRAM_TYPES)}")
    runs = [LlamaRun("-", "plain", "llama-simple")]
    n_max = ("--spec-draft-n-max", str(draft_max))
    if draft is not None:
        runs.append(LlamaRun(draft.stem, "chain", "llama-speculative-simple", "draft-simple",
                             ("-md", str(draft), "-ngld", "99", *n_max), f"max {draft_max}"))
    if dflash is not None:
        block = dflash_n_max(dflash)
        runs.append(LlamaRun(dflash.stem, "chain", "llama-speculative-simple", "draft-dflash",
                             ("-md", str(dflash), "-ngld", "99", "--spec-draft-n-max", str(block)),
                             f"block {block + 1}: max {block}"))
    for t in ngram_types:
        args, budget = ngram_args(t, draft_max)
        runs.append(LlamaRun(t, "ngram", "llama-speculative-simple", t, args, budget))
    return runs


def llama_cmd(bin_dir: Path, run: LlamaRun, target: Path, text: str, max_tokens: int) -> list[str]:
    if run.tool == "llama-simple":
        # its own small parser (examples/simple/simple.cpp): -m, -n, -ngl, then the prompt as the rest
        return [str(bin_dir / run.tool), "-m", str(target), "-n", str(max_tokens), "-ngl", "99", text]
    # greedy (--temp 0), as flashd's rows; -c bounds the KV cache (the default is the model's full context)
    return [str(bin_dir / run.tool), "-m", str(target), "-p", text, "-n", str(max_tokens), "-ngl", "99",
            "-fa", "on", "--temp", "0", "-c", "4096", "--spec-type", run.spec_type, *run.spec_args]


DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) (?:seconds|s), speed:\s+([\d.]+) t/s")
N_DRAFTED = re.compile(r"\bn_drafted\s*=\s*(\d+)")
N_ACCEPT = re.compile(r"\bn_accept\s*=\s*(\d+)")
# common/log.cpp's prefix (on in this version): "0.00.005.803 E " is an error-level line
ERROR_LINE = re.compile(r"^(?:\d+\.\d+\.\d+\.\d+ E |.*\berror\b)", re.I)
FAILURE_WORDS = re.compile(r"error|fail|invalid|unknown|abort|exception|unable|missing|requires", re.I)
LOST_LOG_RETRIES = 2


@dataclass
class LlamaOutput:
    n_tokens: int
    seconds: float
    n_drafted: int | None = None     # None: the line is absent (llama-simple, or a run that printed no totals)
    n_accept: int | None = None


def parse_llama_output(stderr: str) -> LlamaOutput | None:
    """The decode totals a tool printed, or None without a "decoded" line."""
    m = DECODED.search(stderr)
    if m is None:
        return None
    d, a = N_DRAFTED.search(stderr), N_ACCEPT.search(stderr)
    return LlamaOutput(int(m.group(1)), float(m.group(2)), int(d.group(1)) if d else None,
                       int(a.group(1)) if a else None)


def failure_text(tool: str, returncode: int, stderr: str) -> str:
    """A failed run's reason in the tool's words: its first error line (the cause; later ones are its
    consequences, e.g. "failed to load model" after the loader's reason), else the last line that says
    something failed (usage text and load logs say nothing), else the last line, else the exit status."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ERROR_LINE.search(ln)]
    said = [ln for ln in lines if FAILURE_WORDS.search(ln)]
    why = errors[0] if errors else (said or lines or [f"exit {returncode}"])[-1]
    return f"{tool} failed (exit {returncode}): {why[:200]}"


def run_llama(bin_dir: Path, runs: Sequence[LlamaRun], target: Path, texts: Sequence[str], max_tokens: int,
              log: Callable[[str], None] = print, timeout: float = 600) -> list[LlamaResult]:
    """Every run over the prompts. A tool that fails (exit status, or no "decoded" line) makes its row a
    failure carrying the tool's message, never a number, and the other rows still run."""
    results = []
    for run in runs:
        res = LlamaResult(run)
        n_tok, secs = 0, 0.0
        for text in texts:
            cmd = llama_cmd(bin_dir, run, target, text, max_tokens)
            for _ in range(1 + LOST_LOG_RETRIES):
                # errors="replace": a token's partial UTF-8 in the generated text must not end the run
                proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
                out = parse_llama_output(proc.stderr)
                if proc.returncode != 0 or out is not None:
                    break
                log(f"{run.tool} {run.spec_type or ''} exited 0 without its 'decoded' line (llama.cpp's logger "
                    "is not flushed at exit): running it again")
            if proc.returncode != 0 or out is None:
                res.failed = failure_text(run.tool, proc.returncode, proc.stderr)
                log(f"{res.failed}\n  command (prompt left out): {' '.join(a for a in cmd if a != text)}\n"
                    f"  stderr tail:\n{proc.stderr[-2000:]}")
                break
            n_tok, secs = n_tok + out.n_tokens, secs + out.seconds
            if out.n_drafted is not None and out.n_accept is not None:
                res.n_drafted, res.n_accept = res.n_drafted + out.n_drafted, res.n_accept + out.n_accept
                res.n_counted += 1
        if res.failed is None:
            res.n_tokens, res.tok_s = n_tok, (n_tok / secs if secs > 0 else float("nan"))
            rate = (f", accepted {100 * res.accept_rate:.1f}% of {res.n_drafted} drafted "
                    f"({res.n_counted}/{len(texts)} prompts reported both counts)") if res.n_drafted else ""
            log(f"llama.cpp {run.tool} {run.spec_type or ''}: {res.tok_s:.1f} tok/s{rate}")
        results.append(res)
    return results


def build_llama_tools(sdist: Path, build_dir: Path, arch: str, log: Callable[[str], None] = print) -> Path:
    """Configure (through compare_llama_cpp's build, which also builds llama-bench) and build the two
    example tools; their bin folder."""
    from flashd.bench.compare_llama_cpp import build_llama_bench

    build_llama_bench(sdist, build_dir, arch, os.cpu_count() or 8)
    bin_dir = build_dir / "build" / "bin"
    missing = [t for t in LLAMA_TOOLS if not (bin_dir / t).exists()]
    if missing:
        log("building " + ", ".join(missing))
        subprocess.run(["cmake", "--build", str(build_dir / "build"), "-j", str(os.cpu_count() or 8), "--target",
                        *missing], check=True, stdout=subprocess.DEVNULL)
    return bin_dir
