"""Self-distillation data generation speed (train/batch_decode.py): answer tokens per second of the torch target's
batched greedy decoding, the decode step replayed as a CUDA graph against the same step run eagerly, on the same
prompt batches (rendered from the local sources as `flashd train-drafter` renders them).

    python bench/bench_train_gen.py TARGET.gguf [--batches 2] [--gen-batch 256] [--max-new 512] [--device cuda]

Prints one line per (mode, batch) and the totals; the answers of both modes are compared (equal on the same
kernels except where two bf16 logits tie, which the count of differing answers shows).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np


def profile(target, batches, max_new: int, stop_ids, torch) -> None:
    """Where a batch's time goes: the prefill alone, then the op table of eager static decode steps."""
    from flashd.train.batch_decode import BatchDecoder

    sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)
    for i, batch in enumerate(batches):
        sync()
        t0 = time.perf_counter()
        BatchDecoder(target, batch, 1, stop_ids, graph=False).run()
        sync()
        print(f"prefill batch {i}: {time.perf_counter() - t0:.2f} s ({sum(len(p) for p in batch)} prompt tokens)")
    dec = BatchDecoder(target, batches[0], max(max_new, 24), stop_ids, graph=False)   # 19 steps below
    first = target.step(dec.prompt_ids, dec.prompt_pos, dec.cache, 0, dec.valid).argmax(-1)
    dec.tok.copy_(first[:, None])
    for _ in range(3):
        dec._step()
    sync()
    t0 = time.perf_counter()
    for _ in range(8):
        dec._step()
    sync()
    print(f"eager decode step: {(time.perf_counter() - t0) / 8 * 1e3:.2f} ms")
    from torch.profiler import ProfilerActivity, profile as torch_profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if target.device.type == "cuda" else [])
    with torch_profile(activities=acts) as prof:
        for _ in range(8):
            dec._step()
        sync()
    key = "cuda_time_total" if target.device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=20, max_name_column_width=50))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--gen-batch", type=int, default=256)
    ap.add_argument("--max-new", type=int, default=512)
    ap.add_argument("--max-prompt", type=int, default=512)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--modes", default="graph,eager", help="comma list of graph / eager")
    ap.add_argument("--attention", default="sdpa",
                    help="comma list of the static step's decode attention kernels to compare (train/target.py "
                         "DECODE_ATTENTION: matmul, kq, sdpa)")
    ap.add_argument("--profile", action="store_true",
                    help="also: each batch's prefill alone (max_new 1), and torch.profiler's table of 8 eager decode "
                         "steps of the first batch (CUDA time by op)")
    ap.add_argument("--random-prompts", action="store_true",
                    help="random token ids (lengths 64 .. --max-prompt) instead of rendered prompts: for synthetic "
                         "targets, whose tokenizer cannot render the sources")
    args = ap.parse_args(argv)

    from flashd.clients.tokenizer import Tokenizer
    from flashd.train import require_torch
    from flashd.train.batch_decode import BatchDecoder
    from flashd.train.generate import render_prompts
    from flashd.train.recipe import TrainConfig
    from flashd.train.target import TorchTarget

    torch = require_torch()
    tc = TrainConfig(gen_batch=args.gen_batch, max_new=args.max_new, max_prompt=args.max_prompt)
    target = TorchTarget(args.target, device=args.device)
    n_prompts = args.batches * args.gen_batch
    if args.random_prompts:
        rng = np.random.default_rng(0)
        prompts = [rng.integers(0, target.cfg.vocab_size, int(n)).astype(np.int32)
                   for n in rng.integers(min(64, args.max_prompt), args.max_prompt + 1, n_prompts)]
        stop_ids = []
    else:
        prompts = render_prompts(args.target, tc, n_prompts)
        stop_ids = sorted(Tokenizer.from_gguf(args.target).stop_ids)
    batches = [sorted(prompts[i * args.gen_batch:(i + 1) * args.gen_batch], key=len) for i in range(args.batches)]
    print(f"# {args.target.name} on {torch.cuda.get_device_name() if args.device == 'cuda' else args.device}, "
          f"{target.dtype}; {len(batches)} batches of {args.gen_batch} prompts, max_new {args.max_new}")
    answers = {}
    for how, mode in ((h, m) for h in args.attention.split(",") for m in args.modes.split(",")):
        target.decode_attention = how
        mode = f"{mode}/{how}" if "," in args.attention else mode
        total_tokens, total_s, answers[mode] = 0, 0.0, []
        for i, batch in enumerate(batches):
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            got = BatchDecoder(target, batch, args.max_new, stop_ids, graph=mode.startswith("graph")).run()
            if args.device == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            n = sum(len(a) for a in got)
            total_tokens, total_s = total_tokens + n, total_s + dt
            answers[mode] += got
            print(f"{mode:6s} batch {i}: {n} answer tokens in {dt:.2f} s = {n / dt:,.0f} tok/s")
        print(f"{mode:6s} total: {total_tokens} tokens in {total_s:.2f} s = {total_tokens / total_s:,.0f} tok/s")
    if args.profile:
        target.decode_attention = args.attention.split(",")[0]
        profile(target, batches, args.max_new, stop_ids, torch)
    runs = list(answers.items())
    for name, got in runs[1:]:
        diff = sum(x.tolist() != y.tolist() for x, y in zip(runs[0][1], got))
        print(f"answers differing between {runs[0][0]} and {name}: {diff} of {len(got)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
