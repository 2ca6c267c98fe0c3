"""`flashd train-drafter TARGET`: train a DFlash block drafter for TARGET and export the GGUF `--draft` loads.

    flashd train-drafter TARGET.gguf --out drafter.gguf [--minutes 19.5] [--resume] [--max-tokens N]
                         [--layers 3] [--block-size 16] [--features 5] [--gen-minutes 7] [--train-minutes 10.5]
                         [--loss-rows N] [--ce float32|bfloat16] [--compile] [--data-mix code|wide]
                         [--wide-fraction F] [--header-fraction F] [--problem-fraction F] [--task-fraction F]
                         [--self-prompts F]
                         [--distill F] [--distill-top N]

One call: load the target (dequantized to bf16 on the GPU), generate the self-distillation data (resumable, shard
by shard), train, checkpoint, export. `--minutes` bounds this call (it stops, checkpoints and exports before);
`--gen-minutes` and `--train-minutes` are the totals over all calls, so a run split into calls of 10 minutes
(`--resume`) does the same work as one. Everything lives in the work folder (default OUT.work/): prompts, data
shards, checkpoint.pt, log.txt, sources.json, report.json. torch is imported only when the command runs.
`--compile` runs one layer of the target's training forward and of the drafter through torch.compile (the
elementwise work fused; the first steps pay the compilation); off by default until it is timed on a GPU, and not
part of the recipe: a resume may switch it.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import click
import numpy as np

__all__ = ["train_command", "pick_mask_token"]

EXPORT_RESERVE_S = 40.0     # kept back from --minutes for the last checkpoint, evaluation and the export


def pick_mask_token(embed, used: set[int], stop_ids: set[int]) -> int:
    """The MASK id: the highest id never seen in the data (nor a stop token) whose embedding row is not degenerate
    (RMS >= half the median row's). The embedding is frozen, so MASK must be a row with a usable vector: padded
    vocabulary rows can be all zeros, and a zero row would make every masked position identical."""
    rms = embed.float().pow(2).mean(-1).sqrt()
    floor = 0.5 * float(rms.median())
    for i in range(embed.shape[0] - 1, -1, -1):
        if i not in used and i not in stop_ids and float(rms[i]) >= floor:
            return i
    raise ValueError("no embedding row can serve as MASK (every row is used by the data or degenerate)")


class _Log:
    def __init__(self, path: Path):
        self.path, self.t0 = path, time.monotonic()

    def __call__(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {msg}"
        click.echo(line, err=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def _defaulted(param: str) -> bool:
    """The option was not given on the command line (its value is the default)."""
    return click.get_current_context().get_parameter_source(param) == click.core.ParameterSource.DEFAULT


@click.command("train-drafter")
@click.argument("target", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="the drafter GGUF to write")
@click.option("--work", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="work folder (data, checkpoint, log); default OUT.work")
@click.option("--resume", is_flag=True, help="continue the run in the work folder (data, checkpoint)")
@click.option("--minutes", type=click.FloatRange(min=0.5), default=19.5, show_default=True,
              help="wall-clock limit of this call; it checkpoints and exports before")
@click.option("--gen-minutes", type=click.FloatRange(min=0.05), default=7.0, show_default=True,
              help="data generation budget, summed over calls")
@click.option("--train-minutes", type=click.FloatRange(min=0.05), default=10.5, show_default=True,
              help="training budget, summed over calls (the learning-rate schedule's clock)")
@click.option("--max-tokens", type=click.IntRange(min=1), default=6_000_000, show_default=True,
              help="answer tokens to generate at most")
@click.option("--layers", type=click.IntRange(min=1), default=3, show_default=True, help="drafter layers")
@click.option("--block-size", type=click.IntRange(min=2), default=16, show_default=True)
@click.option("--features", type=click.IntRange(min=1), default=5, show_default=True, help="target layers read")
@click.option("--max-mb", type=float, default=56.0, show_default=True, help="Q8_0 size cap (sets the SwiGLU width)")
@click.option("--max-new", type=click.IntRange(min=2), default=512, show_default=True, help="answer tokens per prompt")
@click.option("--max-prompt", type=click.IntRange(min=1), default=512, show_default=True)
@click.option("--raw-fraction", type=click.FloatRange(0, 1), default=0.5, show_default=True,
              help="share of raw code-completion prompts (bench_spec.py prompts raw code); the rest are chat")
@click.option("--data-mix", type=click.Choice(["code", "wide"]), default="code", show_default=True,
              help="code: Python and C sources (the shipped drafter's data); wide: also the packages' C++ and "
                   "documentation, and answers in other languages (train/data.py; its one run lost to code: README)")
@click.option("--distill", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="the share of the loss that learns the target's whole distribution at each labelled position "
                   "instead of its greedy token alone (soft targets; needs --loss-rows > 0; experimental)")
@click.option("--distill-top", type=click.IntRange(min=0), default=32, show_default=True,
              help="with --distill: the target's distribution over its top N tokens at each position, renormalized "
                   "(0: over the whole vocabulary, a much longer step: bench/bench_train_step.py)")
@click.option("--wide-fraction", type=click.FloatRange(0, 1), default=0.15, show_default=True,
              help="with --data-mix code: this share of the prompts is what wide adds (C++ and documentation sources, "
                   "Python snippets translated into other languages), the rest code's own")
@click.option("--header-fraction", type=click.FloatRange(0, 1), default=0.2, show_default=True,
              help="share of prompts that are a function's signature and docstring line from the Python sources, "
                   "completed raw: the target writes the body (train/styles.py)")
@click.option("--problem-fraction", type=click.FloatRange(0, 1), default=0.1, show_default=True,
              help="share of prompts that are arithmetic / logic word problems built from train/styles.py's "
                   "templates, raw (Question: ... Answer:) or chat")
@click.option("--task-fraction", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="share of prompts that are a one-line request in a comment (\"// Go: ...\", the request a "
                   "docstring's summary from the Python sources), completed raw (train/styles.py; experimental)")
@click.option("--self-prompts", "self_prompt_fraction", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="share of prompts the target writes itself after a generic opener (train/self_prompts.py; "
                   "experimental: 0.4 lost in its one measured run)")
@click.option("--batch-seqs", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--anchors", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--gen-batch", type=click.IntRange(min=1), default=256, show_default=True,
              help="prompts decoded together")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default=None, help="torch device (default: cuda when available, else cpu)")
@click.option("--outtype", type=click.Choice(["q8_0", "f32", "f16", "bf16"]), default="q8_0", show_default=True)
@click.option("--loss-rows", type=click.IntRange(min=0), default=4096, show_default=True,
              help="the loss over N block rows at a time (train/linear_ce.py: each chunk's gradient formed at once; "
                   "~14 GiB peak for a 1.5B target at 4096, ~11 at 2048 for 24 GB cards); 0: the whole block's "
                   "logits at once (~34 GiB, ~10% slower)")
@click.option("--ce", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True,
              help="with --loss-rows 0 only: the whole block's log-softmax on a float32 copy of the logits, or on "
                   "the bf16 logits as they are (no copy: 21 GiB, the fastest step; session 28's one run used it)")
@click.option("--compile/--no-compile", "compile_layers", default=False, show_default=True,
              help="torch.compile one layer's function of the target's forward and of the drafter (reused by every "
                   "layer: norms, RoPE, SwiGLU and casts fused); the compilation is paid out of the training "
                   "budget, and at the recipe's budget it costs more steps than it saves (bench/NOTES.md, session 29)")
def train_command(target, out, work, resume, minutes, gen_minutes, train_minutes, max_tokens, layers, block_size,
                  features, max_mb, max_new, max_prompt, raw_fraction, data_mix, distill, distill_top, wide_fraction,
                  header_fraction, problem_fraction, task_fraction, self_prompt_fraction, batch_seqs, anchors,
                  gen_batch, seed, device, outtype, loss_rows, ce, compile_layers):
    """Train a DFlash drafter for TARGET (a dense llama / qwen2 / qwen3 GGUF) by self-distillation.

    --compile runs one layer of the target's training forward and of the drafter through torch.compile."""
    if ce == "bfloat16" and loss_rows:
        raise click.UsageError("--ce bfloat16 applies to the whole block's logits: add --loss-rows 0")
    if distill and not loss_rows:
        raise click.UsageError("--distill runs in the chunked loss: --loss-rows must be > 0")
    from . import TorchMissing, require_torch
    try:
        require_torch()
    except TorchMissing as exc:
        raise click.ClickException(str(exc)) from None
    from .recipe import TrainConfig
    if data_mix == "wide" and _defaulted("wide_fraction"):
        wide_fraction = 0.0         # the whole wide mix: no share of it to blend in
    try:
        tc = TrainConfig(block_size=block_size, n_layers=layers, n_features=features, max_mb=max_mb,
                         anchors=anchors, batch_seqs=batch_seqs, max_seq=max_prompt + max_new, seed=seed,
                         max_tokens=max_tokens, max_prompt=max_prompt, max_new=max_new, gen_batch=gen_batch,
                         raw_fraction=raw_fraction, self_prompt_fraction=self_prompt_fraction, data_mix=data_mix,
                         wide_fraction=wide_fraction, header_fraction=header_fraction,
                         problem_fraction=problem_fraction, task_fraction=task_fraction, distill=distill,
                         distill_top=distill_top,
                         gen_minutes=gen_minutes, train_minutes=train_minutes)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    work = work or out.with_name(out.name + ".work")
    if work.exists() and any(work.iterdir()) and not resume:
        raise click.ClickException(f"{work} holds an earlier run: pass --resume to continue it, or another --work")
    work.mkdir(parents=True, exist_ok=True)
    try:
        train_drafter(target, out, work, tc, minutes, device, outtype, loss_rows, ce == "float32", compile_layers)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def train_drafter(target_path: Path, out: Path, work: Path, tc, minutes: float, device: str | None,
                  outtype: str = "q8_0", loss_rows: int = 4096, ce_float32: bool = True,
                  compile_layers: bool = False) -> dict | None:
    """The whole call; returns the report (None when the call ended during data generation)."""
    import torch

    from flashd.clients.tokenizer import Tokenizer

    from .data import data_sources
    from .export import export
    from .generate import generate, load_samples
    from .loop import Trainer
    from .recipe import drafter_config, param_count, q8_0_bytes
    from .target import TorchTarget

    start = time.monotonic()
    deadline = start + minutes * 60 - EXPORT_RESERVE_S
    log = _Log(work / "log.txt")
    listed = [{"kind": s.kind, "root": str(s.root), "suffix": s.suffix} for s in data_sources(tc.sources_mix)]
    if tc.problem_fraction:
        listed.append({"kind": "problems", "root": "flashd/train/styles.py", "suffix": "PROBLEM_TEMPLATES"})
    (work / "sources.json").write_text(json.dumps(listed, indent=1))
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    target = TorchTarget(target_path, dev, max_pos=tc.max_seq + tc.block_size)
    log(f"target {target.cfg.name or target_path.name}: {target.cfg.n_layers} layers, hidden {target.cfg.hidden}, "
        f"loaded on {dev} in {time.monotonic() - start:.0f} s")
    state = generate(target, target_path, work, tc, deadline, log)
    if not state["done"]:
        log(f"stopped during data generation ({state['tokens']} tokens so far): run again with --resume")
        return None
    samples = load_samples(work)
    mask_file = work / "mask.json"
    if not mask_file.exists():
        used = set(np.unique(np.concatenate([s for s, _ in samples])).tolist()) if samples else set()
        stop = set(Tokenizer.from_gguf(target_path).stop_ids)
        mask_file.write_text(json.dumps({"mask_token_id": pick_mask_token(target.embed, used, stop)}))
    mask_id = json.loads(mask_file.read_text())["mask_token_id"]
    cfg = drafter_config(target.cfg, tc, mask_id, name=f"{target.cfg.name or target_path.stem} dflash (flashd)")
    matrices, norms = param_count(cfg)
    log(f"drafter: {cfg.model.n_layers} layers, ffn {cfg.model.ffn}, block {cfg.block_size}, target layers "
        f"{list(cfg.target_layer_ids)}, mask id {mask_id}; {(matrices + norms) / 1e6:.1f} M parameters, "
        f"{q8_0_bytes(cfg) / 1e6:.1f} MB as Q8_0; {len(samples)} samples, {state['tokens']} answer tokens")
    trainer = Trainer(target, cfg, tc, samples, log, loss_rows=loss_rows, ce_float32=ce_float32,
                      compile=compile_layers)
    if compile_layers:
        log("layers compiled (torch.compile): the first steps include the compilation")
    ckpt = work / "checkpoint.pt"
    if ckpt.exists():
        trainer.load(ckpt)
        log(f"resumed at step {trainer.step} ({trainer.train_seconds / 60:.1f} min trained)")
    ev = trainer.run(deadline, ckpt)
    export(trainer.drafter, out, outtype)
    report = {"target": target_path.name, "out": str(out), "bytes": out.stat().st_size,
              "params": matrices + norms, "gen": state, "sources": [f"{s.root}/*{s.suffix}" for s in data_sources(tc.sources_mix)],
              "done": trainer.progress() >= 1.0}
    trainer.write_report(work / "report.json", ev, report)
    log(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB); training {trainer.progress():.0%} done"
        + ("" if trainer.progress() >= 1.0 else ": run again with --resume to continue"))
    return {"eval": ev, **report}
