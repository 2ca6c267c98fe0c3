"""flashd's DFlash drafter against llama.cpp's draft-dflash running the same drafter, block by block (CPU).

    python bench/compare_dflash_llama_cpp.py --bin-dir /tmp/lcp-build/build/bin \
        --target TARGET.gguf --drafter DRAFTER.gguf [--prompt TEXT] [--blocks 6]

The drafter is exported with scripts/export_dflash_llama_cpp.py and run by llama-speculative-simple
(`--spec-type draft-dflash`, greedy, `--spec-draft-n-max block_size - 1` so its block is the trained
one) with -v, whose LOG_DBG lines (common/speculative.cpp, draft()) give, per drafted block, the top 3
candidates of every depth and their probabilities, and after each verify "the last target token is: (id)".
flashd replays the same steps on the reference backend (float32 numpy): the target's prefill of the
prompt but its last token (examples/speculative-simple evaluates inp[:-1] and keeps id_last = inp[-1]),
then per block DFlashDrafter.propose and one target forward of the block's root, committing it and
taking the target's argmax as the next root -- what llama.cpp does when no draft token is accepted (a
random drafter's case; with accepted tokens the replay would need llama.cpp's choices, so the
comparison stops at the first block where llama.cpp accepted any).

Probabilities: llama.cpp's draft sampler is top_k(10) (the impl's constructor), so its p are
softmax over the 10 best logits; flashd's top-10 log-probs are renormalised the same way here.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CANDIDATE = re.compile(r"draft candidate\s+(\d+), pos\s+(\d+):\s+(\d+) \(\s*([\d.]+)\)")
ROOT = re.compile(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((\d+)\)")
TOP_K = 10


def llama_blocks(bin_dir: Path, target: Path, drafter: Path, prompt: str, n_draft: int, n_tokens: int):
    """[(candidates (n_draft, 3) of (id, p), next root, n accepted)] from llama-speculative-simple -v."""
    cmd = [str(bin_dir / "llama-speculative-simple"), "-m", str(target), "-md", str(drafter), "-p", prompt,
           "-n", str(n_tokens), "-ngl", "0", "--temp", "0", "-c", "1024", "--spec-type", "draft-dflash",
           "--spec-draft-n-max", str(n_draft), "-v"]
    err = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=True).stderr
    blocks, cur = [], None
    for line in err.splitlines():
        if m := CANDIDATE.search(line):
            k, pos, tok, p = int(m[1]), int(m[2]), int(m[3]), float(m[4])
            if pos == 0 and k == 0:
                cur = {}
            cur.setdefault(pos, []).append((tok, p))
        elif (m := ROOT.search(line)) and cur is not None:
            blocks.append(([cur[d] for d in sorted(cur)], int(m[3]), int(m[1])))
            cur = None
    return blocks


def flashd_blocks(target: Path, drafter_path: Path, prompt_ids: list[int], roots: list[int]):
    """flashd's per-depth top-10 (ids, p over the 10) for each block, and the target's next root."""
    from flashd.daemon.backends.base import Batch, KVCacheSpec
    from flashd.daemon.backends.reference import ReferenceOps
    from flashd.daemon.models import load_model
    from flashd.daemon.models.dense import forward
    from flashd.daemon.speculative.dflash_drafter import load_dflash_drafter

    ops = ReferenceOps()
    tgt = load_model(target, ops.load_weight)
    cfg = tgt.config
    cache = ops.kv_cache(KVCacheSpec(cfg.n_layers, 1024, cfg.n_kv_heads, cfg.head_dim))
    drafter = load_dflash_drafter(drafter_path, ops, cfg, tgt.weights, 1024)

    def run(ids, n_past):
        n = len(ids)
        batch = Batch(np.asarray(ids, np.int32), np.arange(n_past, n_past + n, dtype=np.int32),
                      np.array([n_past], np.int32), None, n)
        return np.asarray(forward(ops, cfg, tgt.weights, cache, batch, hidden_sink=drafter.capture_hidden))

    ctx = prompt_ids[:-1]
    run(ctx, 0)
    drafter.begin(ctx, prompt_ids[-1])
    root, n_past, out = prompt_ids[-1], len(ctx), []
    for want_root in roots:
        prop = drafter.propose(drafter.max_depth, TOP_K)
        p = np.exp(prop.logprobs - prop.logprobs.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        nxt = int(np.argmax(run([root], n_past)[-1]))
        out.append((prop.tokens, p, nxt))
        drafter.accept([], nxt, rows=[0])
        root, n_past = want_root, n_past + 1        # llama.cpp's root, so one flip does not end the replay
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", type=Path, required=True, help="llama.cpp's build/bin (llama-speculative-simple)")
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--drafter", type=Path, required=True, help="flashd's DFlash GGUF (exported here)")
    ap.add_argument("--prompt", default="hello world this is")
    ap.add_argument("--blocks", type=int, default=6)
    args = ap.parse_args(argv)

    from flashd.clients.tokenizer import Tokenizer
    from flashd.daemon.models.dflash_weights import open_dflash
    from flashd.scripts.export_dflash_llama_cpp import export

    _, dcfg = open_dflash(args.drafter)
    n_draft = dcfg.block_size - 1
    with tempfile.TemporaryDirectory() as tmp:
        exported = Path(tmp) / "dflash-llama.gguf"
        export(args.drafter, args.target, exported)
        llama = llama_blocks(args.bin_dir, args.target, exported, args.prompt, n_draft, args.blocks + 1)
    llama = llama[:args.blocks]
    n_same = next((i + 1 for i, b in enumerate(llama) if b[2]), len(llama))   # up to the first acceptance
    llama = llama[:n_same]
    # llama.cpp's prompt is tokenized with special tokens (common_tokenize add_special = true)
    prompt_ids = Tokenizer.from_gguf(args.target).encode(args.prompt, add_special=True)
    ours = flashd_blocks(args.target, args.drafter, prompt_ids, [b[1] for b in llama])

    worst, top1_same, n_depths, roots_same = 0.0, 0, 0, 0
    for i, ((cands, root, _), (ids, p, nxt)) in enumerate(zip(llama, ours)):
        print(f"block {i}: target next root llama.cpp {root}, flashd {nxt}")
        roots_same += root == nxt
        for d, top in enumerate(cands):
            mine = [(int(ids[d, k]), float(p[d, k])) for k in range(len(top))]
            diff = max(abs(a[1] - b[1]) for a, b in zip(top, mine))
            same_ids = [a[0] for a in top] == [b[0] for b in mine]
            worst = max(worst, diff) if same_ids else worst
            top1_same += top[0][0] == mine[0][0]
            n_depths += 1
            print(f"  depth {d}: llama.cpp {top}  flashd {[(t, round(q, 3)) for t, q in mine]}"
                  f"{'' if same_ids else '  <- ids differ'}")
    print(f"{len(llama)} blocks, {n_depths} depths: top-1 equal at {top1_same}/{n_depths}; target roots equal "
          f"{roots_same}/{len(llama)}; largest |p difference| where the top-3 ids agree: {worst:.4f} "
          f"(llama.cpp prints 3 decimals)")
    return 0 if top1_same == n_depths and roots_same == len(llama) else 1


if __name__ == "__main__":
    sys.exit(main())
