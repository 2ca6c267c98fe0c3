"""The n-gram drafter's tokens a step offline: the speculative decoder's greedy walk replayed over the target's own
answers, no GPU.

    python bench/ngram_offline.py TARGET.gguf [--prompts bench/spec_prompts.jsonl] [--n-prompts 0] [--max-new 256]
        [--answers CACHE.npz] [--modes chain:7,chain:3,ddtree:7,ddtree:22] [--variant min_ngram=1,max_ngram=6 ...]

The target (train/target.py, torch on the CPU) answers each prompt greedily -- the tokens the runtime's greedy
speculative decoding emits, whatever the drafter (spec == plain) -- and --answers keeps them in a file, so a rerun
skips the slow part. Then each (mode, budget) replays the decoder's loop (speculative/decoder.py) with the real
NgramDrafter over each answer: begin(prompt, first token), propose, build the chain or the DDTree (speculative/
tree.py build_tree, chain seed), walk it against the answer's next tokens (accept.py greedy_walk), accept(accepted,
bonus). A step without a proposal is one plain step. Printed per variant and mode: target forwards a token (the
speed-relevant figure: tokens / forwards), tokens a drafted step (bench_spec's "tokens/step" counts drafted steps),
and the share of steps with a draft. With --step-ms (a plain step's and each mode's drafted step's GPU time, from
bench_spec on the same target: its plain tok/s and draft + verify ms a step) it also estimates the speed against
plain decoding: tokens / (plain steps x plain ms + drafted steps x drafted ms), over tokens x plain ms.

A variant is NgramConfig fields to change ("" = the defaults; e.g. min_ngram=1: single-token matches too).
(Session 33 also tried a chain voted only among the matches on it so far: no change, not kept -- bench/results/
2026-11-28-cpu-session33-ngram-offline.md.)
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def replay(prompt: np.ndarray, answer: np.ndarray, drafter, mode: str, budget: int, top_k: int = 8) -> tuple:
    """(target forwards, drafted steps, tokens emitted by drafted steps) of one answer under the decoder's loop."""
    from flashd.daemon.speculative.accept import greedy_walk
    from flashd.daemon.speculative.drafter import Proposal
    from flashd.daemon.speculative.tree import build_tree

    ans = [int(t) for t in answer]
    if not ans:
        return 0, 0, 0
    drafter.begin([int(t) for t in prompt], ans[0])
    i, forwards, drafted, drafted_tokens = 0, 1, 0, 0          # the prefill's forward gave ans[0]
    while i < len(ans) - 1:
        left = len(ans) - 1 - i                                 # tokens still to emit after the root ans[i]
        max_depth = min(left - 1, drafter.max_depth, budget)    # a step emits accepted + 1
        prop = drafter.propose(max_depth, 1 if mode == "chain" else top_k) if max_depth > 0 else Proposal.empty()
        forwards += 1
        if prop.n_depth == 0:
            drafter.accept([], ans[i + 1])
            i += 1
            continue
        cont = ans[i + 1:]
        if mode == "chain":
            acc = 0
            while acc < prop.n_depth and acc < len(cont) - 1 and int(prop.tokens[acc, 0]) == cont[acc]:
                acc += 1
        else:
            tree = build_tree(ans[i], prop, budget, chain_seed=True, max_depth=max_depth)
            path, _ = greedy_walk(tree, lambda node: cont[tree.depths[node]] if tree.depths[node] < len(cont) else -1)
            acc = min(len(path) - 1, len(cont) - 1)
        drafter.accept(cont[:acc], cont[acc])
        drafted += 1
        drafted_tokens += acc + 1
        i += acc + 1
    drafter.end()
    return forwards, drafted, drafted_tokens


def speed_vs_plain(n_tokens: int, forwards: int, drafted: int, plain_ms: float, drafted_ms: float) -> float:
    """Estimated speed against plain decoding: n_tokens plain steps' time over the replay's (forwards - drafted)
    plain steps and drafted steps at their own cost."""
    return n_tokens * plain_ms / ((forwards - drafted) * plain_ms + drafted * drafted_ms)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", type=Path)
    ap.add_argument("--prompts", type=Path, default=ROOT / "bench" / "spec_prompts.jsonl")
    ap.add_argument("--n-prompts", type=int, default=0, help="first N prompts (0: all)")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--answers", type=Path, help="npz cache of the target's answers (written if missing)")
    ap.add_argument("--modes", default="chain:7,chain:3,ddtree:7,ddtree:22", help="mode:budget, comma-separated")
    ap.add_argument("--step-ms", default="", metavar="plain=MS,MODE:BUDGET=MS,...",
                    help="GPU ms of a plain step and of a drafted step per mode, e.g. plain=1.015,chain:7=1.19 "
                         "(bench_spec's figures): adds the estimated speed against plain decoding")
    ap.add_argument("--variant", action="append", default=None,
                    help="NgramConfig fields, field=value,...; repeat for more ('' = the defaults; default: '' and "
                         "min_ngram=1)")
    args = ap.parse_args(argv)

    from flashd.clients.tokenizer import Tokenizer
    from flashd.daemon.speculative.ngram import NgramConfig, NgramDrafter

    tok = Tokenizer.from_gguf(args.target)
    texts = [json.loads(line)["text"] for line in args.prompts.read_text().splitlines() if line.strip()]
    prompts = [np.asarray(tok.encode(t), np.int32) for t in texts[:args.n_prompts or None]]
    t0 = time.perf_counter()
    if args.answers is not None and args.answers.exists():
        cached = np.load(args.answers)
        answers = [cached[f"a{i}"] for i in range(len(prompts))]
    else:
        from flashd.train.batch_decode import greedy_answers
        from flashd.train.target import TorchTarget
        target = TorchTarget(args.target, device="cpu", max_pos=max(len(p) for p in prompts) + args.max_new + 1)
        answers = greedy_answers(target, prompts, args.max_new, tok.stop_ids)
        if args.answers is not None:
            np.savez(args.answers, **{f"a{i}": a for i, a in enumerate(answers)})
    print(f"# n-gram drafter on {args.target.name}'s greedy answers: {len(prompts)} prompts of {args.prompts.name}, "
          f"{sum(len(a) for a in answers)} answer tokens ({time.perf_counter() - t0:.0f} s)\n")
    step_ms = {k.strip(): float(v) for k, v in (kv.split("=") for kv in args.step_ms.split(",") if kv.strip())}
    est = "plain" in step_ms
    print("| variant | mode | budget | tokens / target forward | tokens / drafted step | steps with a draft |"
          + (" est. vs plain |" if est else ""))
    print("| --- | --- | ---: | ---: | ---: | ---: |" + (" ---: |" if est else ""))
    for variant in (args.variant if args.variant is not None else ["", "min_ngram=1"]):
        fields = dict(kv.split("=") for kv in variant.split(",") if kv)
        cfg = NgramConfig(**{k: int(v) for k, v in fields.items()})
        for spec in [m for m in args.modes.split(",") if m]:
            mode, budget = spec.split(":")
            drafter = NgramDrafter(cfg)
            f = d = dt = n_tok = 0
            for p, a in zip(prompts, answers):
                fw, dr, drt = replay(p, a, drafter, mode, int(budget))
                f, d, dt, n_tok = f + fw, d + dr, dt + drt, n_tok + len(a)
            row = (f"| {variant or 'defaults'} | {mode} | {budget} | {n_tok / max(f, 1):.3f} | {dt / max(d, 1):.3f} | "
                   f"{d / max(f - len(prompts), 1):.1%} |")
            if est:
                ms = step_ms.get(spec)
                row += f" {speed_vs_plain(n_tok, f, d, step_ms['plain'], ms):.2f}x |" if ms else " |"
            print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
