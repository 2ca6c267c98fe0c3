"""Drafter training speed (train/loop.py): time of one training step and where it goes.

    python bench/bench_train_step.py TARGET.gguf [--steps 12] [--batch-seqs 8] [--anchors 128] [--profile]
                                     [--compile off,on] [--distill 0,0.5] [--distill-top 32,0]

The samples are random token ids shaped like the self-distillation data (prompts of 64-512 tokens, answers of
256-512), so a synthetic target serves as well as the real one: the step's cost depends on shapes only. Prints
the mean step time over --steps batches, each already run once (cuDNN builds an attention plan per new shape:
the first pass pays it, see Trainer._tensors), sequence tokens per second (the trainer log's "tok/s"), the peak
memory, and with --profile torch.profiler's CUDA-time table of three steps. Each configuration also prints how
long its warm-up pass took: with --compile on (Trainer(compile=True): one layer of the target and of the drafter
through torch.compile) that pass includes the compilation, which a training run pays out of its time budget.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch-seqs", type=int, default=8)
    ap.add_argument("--anchors", type=int, default=128)
    ap.add_argument("--loss-rows", default="0",
                    help="comma list of Trainer loss_rows values to compare (0: the whole block's logits at once)")
    ap.add_argument("--ce", default="float32",
                    help="comma list: float32 (the log-softmax on a float32 copy of the logits) and/or bfloat16 "
                         "(on the autocast logits as they are); with loss_rows 0 only")
    ap.add_argument("--rmsnorm", default="fused",
                    help="comma list: fused (train/target.py's rmsnorm, F.rms_norm) and/or composite (the casts, powers "
                         "and products it replaced in session 28: the A/B's baseline)")
    ap.add_argument("--distill", default="0",
                    help="comma list of TrainConfig.distill values (soft targets' share; > 0 needs loss_rows > 0)")
    ap.add_argument("--distill-top", default="32",
                    help="comma list of TrainConfig.distill_top values (the target's top tokens kept a position; 0: "
                         "the whole vocabulary); with distill > 0 only")
    ap.add_argument("--compile", default="off",
                    help="comma list: off (eager layers) and/or on (Trainer(compile=True): the target's and the "
                         "drafter's layer functions through torch.compile)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)

    from flashd.train import drafter as train_drafter
    from flashd.train import loop as train_loop
    from flashd.train import require_torch
    from flashd.train import target as train_target
    from flashd.train.loop import Trainer
    from flashd.train.recipe import TrainConfig, drafter_config
    from flashd.train.target import TorchTarget

    torch = require_torch()
    tc = TrainConfig(batch_seqs=args.batch_seqs, anchors=args.anchors)
    target = TorchTarget(args.target, device=args.device, max_pos=tc.max_seq + tc.block_size)
    rng = np.random.default_rng(0)
    vocab = target.cfg.vocab_size
    samples = []
    for _ in range(64 * tc.eval_every // (tc.eval_every - 1) + 2):
        p, a = int(rng.integers(64, 513)), int(rng.integers(256, 513))
        samples.append((rng.integers(0, vocab - 1, p + a).astype(np.int32), p))
    cfg = drafter_config(target.cfg, tc, mask_token_id=vocab - 1)
    dev_name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"# {args.target.name} on {dev_name}: drafter {cfg.model.n_layers} layers, ffn {cfg.model.ffn}; "
          f"{args.batch_seqs} sequences x {args.anchors} anchors x block {cfg.block_size} a step")
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    fused = train_target.rmsnorm

    def composite(x, w, eps: float):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)
    norms = {"fused": fused, "composite": composite}
    tops = [int(k) for k in args.distill_top.split(",")]
    configs = [(int(r), ce, nm, cp, float(dl), k) for dl in args.distill.split(",") for cp in args.compile.split(",")
               for nm in args.rmsnorm.split(",") for r in args.loss_rows.split(",") for ce in args.ce.split(",")
               for k in (tops if float(dl) else tops[:1])
               if (int(r) == 0 or ce == "float32") and (int(r) > 0 or not float(dl))]
    for rows, ce, nm, cp, dl, top in configs:
        if ce not in ("float32", "bfloat16") or nm not in norms or cp not in ("off", "on"):
            raise SystemExit(f"--ce {ce!r}: float32 or bfloat16; --rmsnorm {nm!r}: fused or composite; "
                             f"--compile {cp!r}: off or on")
        for mod in (train_target, train_drafter, train_loop):       # every module that calls it by name
            mod.rmsnorm = norms[nm]
        tcd = TrainConfig(batch_seqs=args.batch_seqs, anchors=args.anchors, distill=dl, distill_top=top)
        trainer = Trainer(target, cfg, tcd, samples, log=lambda m: None, loss_rows=rows, ce_float32=ce == "float32",
                          compile=cp == "on")          # sets the shared target's layers too
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        batches = [trainer._epoch_order(0)[i % trainer.per_epoch] for i in range(args.steps)]
        sync()
        t0 = time.perf_counter()
        first = None
        for b in batches:                   # warm-up over the same batches: every shape's kernel plans built
            trainer.train_step(b)           # (and with --compile on, the compiled graphs: the first step compiles)
            if first is None:
                sync()
                first = time.perf_counter() - t0
        sync()
        warm = time.perf_counter() - t0
        t0, tokens = time.perf_counter(), 0
        for b in batches:
            tokens += trainer.train_step(b)["tokens"]
        sync()
        dt = (time.perf_counter() - t0) / args.steps
        peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else float("nan")
        dtxt = f"distill {dl:g}" + (f" top {top}" if dl else "")
        print(f"loss_rows {rows}, ce {ce}, rmsnorm {nm}, compile {cp}, {dtxt}: {dt * 1e3:.1f} ms a step, "
              f"{tokens / args.steps / dt:,.0f} sequence tok/s, "
              f"peak {peak:.1f} GiB; warm-up {warm:.1f} s for {args.steps} steps (the first {first:.1f} s)")
        if args.profile:
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
            with profile(activities=acts) as prof:
                for b in batches[:3]:
                    trainer.train_step(b)
                sync()
            key = "cuda_time_total" if args.device == "cuda" else "cpu_time_total"
            print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
