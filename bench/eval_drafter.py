"""Offline acceptance of a DFlash drafter: the trainer's held-out measure on any prompt set.

    python bench/eval_drafter.py TARGET.gguf DRAFTER.gguf [--prompts bench/spec_prompts.jsonl | --training N]
                                 [--max-new 256] [--device cuda] [--anchors 128] [--per-prompt]

The target (train/target.py: the GGUF dequantized, bf16 on the GPU, float32 on the CPU) answers each prompt
greedily (train/batch_decode.py, as the trainer's data generation), then the drafter (its GGUF dequantized into
train/drafter.py's TorchDrafter) drafts blocks at up to --anchors random answer positions of each sequence, every
block seeing the true context before its anchor: top-1 agreement with the target's token by block position, and
accept_len, the mean count of leading agreements of a block (chain acceptance without the bonus token; a chain
step then yields 1 + accept_len tokens on average). This is the number `flashd train-drafter` logs as
"held-out"; run on bench/spec_prompts.jsonl (encoded raw, as bench/bench_spec.py does) it says what the runtime
should accept there, so the two can be compared: a gap means a difference between training and the runtime (or
between prompt sets, which --training N, N training-style prompts from data.py, shows). The prompts' `kind`
(the benchmark's "code" and "reasoning") also gets a line each: accept_len and the walk of its prompts alone.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("drafter", type=Path)
    ap.add_argument("--prompts", type=Path, default=ROOT / "bench" / "spec_prompts.jsonl")
    ap.add_argument("--n-prompts", type=int, default=0, help="first N prompts (0: all)")
    ap.add_argument("--training", type=int, default=0,
                    help="N training-style prompts (train/data.py, seed 1: not the trainer's seed-0 set) instead")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--per-prompt", action="store_true", help="also each prompt's accept_len and first line")
    ap.add_argument("--loss-rows", type=int, default=1024,
                    help="block rows whose logits are formed at once (Trainer loss_rows; memory only)")
    args = ap.parse_args(argv)

    from flashd.clients.tokenizer import Tokenizer
    from flashd.train import require_torch
    from flashd.train.batch_decode import greedy_answers
    from flashd.train.export import load_drafter
    from flashd.train.generate import render_prompts
    from flashd.train.loop import Trainer
    from flashd.train.recipe import TrainConfig
    from flashd.train.target import TorchTarget

    require_torch()                     # a clear message when torch is missing
    tok = Tokenizer.from_gguf(args.target)
    kinds: list[str] = []
    if args.training:
        tc0 = TrainConfig(seed=1)
        prompts = render_prompts(args.target, tc0, args.training)
        source = f"{len(prompts)} training-style prompts (data.py, seed 1)"
    else:
        rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
        rows = rows[:args.n_prompts or None]
        prompts = [np.asarray(tok.encode(r["text"]), np.int32) for r in rows]
        kinds = [r.get("kind", "") for r in rows]
        source = f"{len(prompts)} prompts of {args.prompts.name} (raw)"
    drafter, cfg = load_drafter(args.drafter, args.device)
    max_prompt = max(len(p) for p in prompts)
    tc = TrainConfig(block_size=cfg.block_size, n_layers=cfg.model.n_layers, n_features=cfg.n_features,
                     anchors=args.anchors, max_prompt=max_prompt, max_new=args.max_new,
                     max_seq=max_prompt + args.max_new, eval_every=2)
    target = TorchTarget(args.target, device=args.device, max_pos=tc.max_seq + tc.block_size)
    t0 = time.perf_counter()
    answers = greedy_answers(target, prompts, args.max_new, tok.stop_ids)
    # the samples by prompt length, as before greedy_answers existed: the evaluation's batches (and the anchors it
    # draws for them) stay those of earlier figures
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    samples = [(np.concatenate([prompts[i], answers[i]]).astype(np.int32), len(prompts[i])) for i in order]
    n_ans = sum(len(a) for a in answers)
    print(f"# {args.drafter.name} on {args.target.name}, {target.dtype} on {args.device}: {source}, "
          f"{n_ans} answer tokens in {time.perf_counter() - t0:.1f} s")
    # the trainer's own measurement: a Trainer over these samples, its drafter replaced by the file's, every
    # sample in the evaluation set (nothing is trained)
    trainer = Trainer(target, cfg, tc, samples + samples[:1], log=lambda m: None, loss_rows=args.loss_rows)
    trainer.drafter = drafter
    trainer.eval_set = samples
    ev = trainer.evaluate(max_samples=len(samples))
    print("top-1 agreement by block position: " + " ".join(f"{a:.2f}" for a in ev["acc"]))
    print(f"accept_len {ev['accept_len']:.2f} over {ev['blocks']} blocks (a chain step: {1 + ev['accept_len']:.2f} "
          f"tokens)")
    wk = trainer.walk_eval(max_samples=len(samples))
    if wk:
        print(f"chain tokens a step along the runtime's walk: {wk['walk']:.3f} ({wk['anywhere']:.3f} per position, "
              f"{wk['drafts']} drafts; train/walk.py)")
    if len(set(kinds)) > 1:
        for kind in sorted(set(kinds)):
            trainer.eval_set = [samples[j] for j, i in enumerate(order) if kinds[i] == kind]
            ev_k, wk_k = trainer.evaluate(max_samples=len(samples)), trainer.walk_eval(max_samples=len(samples))
            acc_k, walk_k = ev_k.get("accept_len", float("nan")), wk_k.get("walk") or float("nan")
            print(f"  kind {kind!r}: {len(trainer.eval_set)} prompts, accept_len {acc_k:.2f}, walk {walk_k:.3f}")
    if args.per_prompt:
        for ids, plen in samples:
            trainer.eval_set = [(ids, plen)]
            one = trainer.evaluate(max_samples=1)
            first = tok.decode(ids[:plen].tolist()).strip().splitlines()
            print(f"  {one.get('accept_len', float('nan')):5.2f}  {len(ids) - plen:4d} tokens  "
                  f"{(first[0] if first else '')[:70]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
