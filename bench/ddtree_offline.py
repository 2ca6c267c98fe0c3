"""DDTree acceptance offline: tokens a step at a node budget, from a DFlash drafter's per-depth candidates.

    python bench/ddtree_offline.py TARGET.gguf DRAFTER.gguf [--prompts bench/spec_prompts.jsonl] [--n-prompts 8]
        [--max-new 128] [--anchors 0] [--budgets 8,16,22,32] [--temperatures 0.5,0.7,1,1.5] [--top-k 8[,16...]]
        [--device cpu|cuda] [--answers CACHE.npz] [--dump STEPS.npz]

The target (train/target.py) answers each prompt greedily (as bench/eval_drafter.py; --answers keeps the answers
in a file, so a rerun on the CPU skips the slow part). At up to --anchors random answer positions a of each
sequence the drafter drafts the block [token a, MASK x 15] from the target's features of positions < a -- the
runtime's draft step rooted at a -- and its per-depth top-K, ranked by log_softmax(logits / temperature), go
through the runtime's own tree build (speculative/tree.py build_tree: best first under the budget, chain seed)
and greedy walk (accept.py) against the target's actual continuation a+1, a+2, ... Printed: tokens a step (1 +
accepted) per draft temperature and budget, and for the top-1 chain of depth 15. The temperature only reshapes
the tree (which candidates a budget buys), never the candidates, so this tunes DFlashDrafter's `temperature`
for tokens a step without a GPU.

Two averages. Rooted anywhere: every drafted position alike (the trainer's held-out accept_len is this kind).
Along the walk (with --anchors 0, a draft at every answer position): steps tile each answer as the runtime's do
-- a step rooted at a emits 1 + accepted tokens and the next is rooted where it ended -- so easy stretches take
few long steps and hard ones many short ones; this is the runtime's tokens a step (the speculative decoder on the
CPU reference backend over the same 8 prompts x 128 tokens: 2.546 at DDTree 32, the walk 2.546; bench/results/
2026-11-28-cpu-session28-ddtree-offline.md), lower than rooted anywhere (3.10 there).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from flashd.train.walk import walk

ROOT = Path(__file__).resolve().parents[1]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def accepted_in_tree(root: int, ids: np.ndarray, lp: np.ndarray, cont: np.ndarray, budget: int) -> int:
    """Drafted tokens the target keeps in one DDTree step: ids / lp (depth, K) candidates best first, cont the
    target's continuation after the root (-1 past the answer's end)."""
    from flashd.daemon.speculative.accept import greedy_walk
    from flashd.daemon.speculative.drafter import Proposal
    from flashd.daemon.speculative.tree import build_tree

    max_depth = min(len(ids), budget, int((cont >= 0).sum()))
    if max_depth <= 0:
        return 0
    tree = build_tree(root, Proposal(ids, lp), budget, chain_seed=True, max_depth=max_depth)
    path, _ = greedy_walk(tree, lambda node: int(cont[tree.depths[node]]) if tree.depths[node] < len(cont) else -1)
    return len(path) - 1


def chain_accepted(ids: np.ndarray, cont: np.ndarray) -> int:
    """Leading agreements of the top-1 chain with the continuation."""
    n = 0
    while n < len(ids) and n < len(cont) and cont[n] >= 0 and ids[n, 0] == cont[n]:
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("drafter", type=Path)
    ap.add_argument("--prompts", type=Path, default=ROOT / "bench" / "spec_prompts.jsonl")
    ap.add_argument("--n-prompts", type=int, default=8, help="first N prompts (0: all)")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--anchors", type=int, default=0,
                    help="draft steps rooted at this many random answer positions a sequence; 0: at every position, "
                         "which also gives the walk (the runtime's steps)")
    ap.add_argument("--budgets", default="8,16,22,32")
    ap.add_argument("--temperatures", default="0.5,0.7,1,1.5")
    ap.add_argument("--top-k", default="8", help="comma list: candidates per depth (the runtime asks 8)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--answers", type=Path, help="npz cache of the target's answers (written if missing)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dump", type=Path,
                    help="npz of every draft step's root, continuation, candidates and normalisers")
    args = ap.parse_args(argv)
    budgets, temps, top_ks = _ints(args.budgets), _floats(args.temperatures), _ints(args.top_k)
    if not budgets or min(budgets) < 1 or not temps or min(temps) <= 0 or not top_ks or min(top_ks) < 1:
        raise SystemExit("--budgets >= 1, --temperatures > 0, --top-k >= 1")

    from flashd.clients.tokenizer import Tokenizer
    from flashd.train import require_torch
    from flashd.train.batch_decode import greedy_answers
    from flashd.train.export import load_drafter
    from flashd.train.target import TorchTarget

    torch = require_torch()
    tok = Tokenizer.from_gguf(args.target)
    texts = [json.loads(line)["text"] for line in args.prompts.read_text().splitlines() if line.strip()]
    prompts = [np.asarray(tok.encode(t), np.int32) for t in texts[:args.n_prompts or None]]
    drafter, cfg = load_drafter(args.drafter, args.device)
    B = cfg.block_size
    target = TorchTarget(args.target, device=args.device, max_pos=max(len(p) for p in prompts) + args.max_new + B)
    t0 = time.perf_counter()
    if args.answers is not None and args.answers.exists():
        cached = np.load(args.answers)
        answers = [cached[f"a{i}"] for i in range(len(prompts))]
    else:
        answers = greedy_answers(target, prompts, args.max_new, tok.stop_ids)
        if args.answers is not None:
            np.savez(args.answers, **{f"a{i}": a for i, a in enumerate(answers)})
    print(f"# {args.drafter.name} on {args.target.name}, {target.dtype} on {args.device}: {len(prompts)} prompts of "
          f"{args.prompts.name} (raw), {sum(len(a) for a in answers)} answer tokens ({time.perf_counter() - t0:.0f} s)")

    rng = np.random.default_rng(args.seed)
    blocks = []        # (root, cont (B-1,), ids (B-1, K), top logits (B-1, K), lse (len(temps), B-1))
    where = []         # (sequence, anchor position) of each block
    with torch.no_grad():
        for si, (prompt, answer) in enumerate(zip(prompts, answers)):
            seq = np.concatenate([prompt, answer]).astype(np.int64)
            p, n = len(prompt), len(seq)
            if n - p < 2:
                continue
            pos = np.arange(p, n - 1)                     # anchors: answer tokens with a next token
            if args.anchors:
                pos = np.sort(rng.choice(pos, min(args.anchors, len(pos)), replace=False))
            ids = torch.from_numpy(seq)[None].to(args.device)
            feats, _ = target.forward(ids, capture=cfg.target_layer_ids)
            ctx = drafter.context(torch.cat(feats, dim=-1).float())
            anchors = torch.from_numpy(pos)[None].to(args.device)
            keep = torch.ones_like(anchors, dtype=torch.bool)
            block = torch.full((1, len(pos), B), cfg.mask_token_id, dtype=torch.long, device=args.device)
            block[0, :, 0] = ids[0, anchors[0]]
            h = drafter.blocks(ctx, target.embed[block].float(), anchors, keep)          # (1, A, B, D)
            for j, a in enumerate(pos.tolist()):
                logits = drafter.logits(h[0, j, 1:].float(), target.lm_head.float())      # (B-1, V)
                top = logits.topk(max(top_ks), dim=-1)             # best first: [:k] is the top-k
                lse = torch.stack([torch.logsumexp(logits / t, dim=-1) for t in temps])   # (n_temps, B-1)
                cont = np.full(B - 1, -1, np.int64)
                tail = seq[a + 1:a + B]
                cont[:len(tail)] = tail
                blocks.append((int(seq[a]), cont, top.indices.cpu().numpy().astype(np.int32),
                               top.values.double().cpu().numpy(), lse.double().cpu().numpy()))
                where.append((si, a, p, n))
    print(f"{len(blocks)} draft steps (anchors), top-{','.join(map(str, top_ks))} candidates per depth")
    if args.dump is not None:
        np.savez(args.dump, roots=np.array([b[0] for b in blocks]), cont=np.stack([b[1] for b in blocks]),
                 ids=np.stack([b[2] for b in blocks]), vals=np.stack([b[3] for b in blocks]),
                 lse=np.stack([b[4] for b in blocks]), temperatures=np.array(temps))
    chain = [chain_accepted(b[2], b[1]) for b in blocks]
    w = walk(where, chain)
    print(f"chain (top-1, depth {B - 1}): {1 + np.mean(chain):.3f} tokens a step rooted anywhere"
          + (f", {w:.3f} along the runtime's walk" if w else ""))
    print("tokens a step rooted anywhere" + (" (along the runtime's walk)" if w else ""))
    print("| draft temperature | K | " + " | ".join(f"budget {b}" for b in budgets) + " |")
    print("|---:|---:|" + "---:|" * len(budgets))
    for ti, t in enumerate(temps):
        for k in top_ks:
            row = []
            for budget in budgets:
                acc = [accepted_in_tree(root, ids[:, :k], vals[:, :k] / t - lse[ti][:, None], cont, budget)
                       for root, cont, ids, vals, lse in blocks]
                w = walk(where, acc)
                row.append(f"{1 + float(np.mean(acc)):.3f}" + (f" ({w:.3f})" if w else ""))
            print(f"| {t:g} | {k} | " + " | ".join(row) + " |")
    # the most a tree of these candidates could accept: every depth's true token among the top-K (no budget)
    for k in top_ks:
        reach = []
        for _, cont, ids, _, _ in blocks:
            n = 0
            while n < len(ids) and cont[n] >= 0 and cont[n] in ids[n, :k]:
                n += 1
            reach.append(n)
        print(f"top-{k} ceiling (the true path inside the candidates, any budget): {1 + float(np.mean(reach)):.3f} "
              f"tokens a step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
