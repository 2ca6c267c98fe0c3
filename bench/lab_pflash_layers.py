"""Lab: which drafter layers locate the NIAH needle? (issue 5: a cheaper PFlash drafter forward)

Scoring with the first L of the drafter's N layers costs about L / N of its forward, but on the H100
(bench/results/2026-11-21-h100-niah-layers-*.md) the first 10 or 14 of Qwen2.5-Coder-0.5B's 24 layers,
max-aggregated from layer 0, lost the needle where all 24 kept it. This asks why, offline: one full
drafter forward per case records every layer's (T, S) tail attention maxima separately (the
attention of layer l does not depend on later layers, so a forward truncated at L would give the
same maxima for l < L); then for each layer window [lo, hi) and aggregation over its layers (max as
the anchor does, or mean as the original SpecPrefill), it runs the chunk selection and checks
whether every token of the needle's value was kept. A window with hi < N that keeps the needle as
reliably as [0, N) is a candidate for `score_layers` plus a first scoring layer.

    python bench/lab_pflash_layers.py --drafter qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        --tokens 4096 --cases 6 --device cpu --keeps 0.02,0.03,0.05 [--save-dir DIR] [--out bench/results/]

On the CPU (reference backend) a 4K-token case takes about a minute, 8K about four. One table per
keep fraction (the selection is cheap once the maxima are recorded). --save-dir keeps each case's
per-layer maxima (an .npz per case, named by seed, length and index) and reuses them when run again,
so a new window or keep is a re-analysis, not a new forward.
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import numpy as np

from flashd.bench.out_files import write_md_json
from flashd.daemon.pflash.calibrate import layer_maxima
from flashd.daemon.pflash.needles import make_case, needle_positions


def log(msg: str) -> None:
    print(f"[lab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


LOWS = (0, 2, 4, 6, 8, 10, 12)     # first scoring layers the tables cover


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--cases", type=int, default=6)
    ap.add_argument("--keeps", default="0.05", help="comma-separated keep fractions, one table each")
    ap.add_argument("--alpha", type=float, default=0.7)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--save-dir", type=Path, default=None, help="cache of per-case per-layer maxima (.npz)")
    args = ap.parse_args(argv)
    keeps = [float(k) for k in args.keeps.split(",")]
    if not keeps or not all(0.0 < k <= 1.0 for k in keeps):
        ap.error(f"--keeps must be fractions in (0, 1], got {args.keeps!r}")

    from flashd.clients.chat_template import ChatTemplate
    from flashd.clients.tokenizer import Tokenizer
    from flashd.daemon.models import open_model
    from flashd.daemon.pflash.config import PFlashConfig
    from flashd.daemon.pflash.selection import kept_positions
    from flashd.daemon.pflash.service import PrefillCompressor

    if args.device == "cuda":
        from flashd.daemon.backends.cuda.backend import CudaBackend as Backend
    else:
        from flashd.daemon.backends import ReferenceBackend as Backend
    f, _ = open_model(args.drafter)
    tok = Tokenizer.from_gguf(f.metadata_dict)
    template = ChatTemplate.from_gguf(args.drafter)
    pc = PFlashConfig(keep=keeps[0], alpha=args.alpha, forward_chunk=1024)
    drafter = PrefillCompressor(Backend(), pc, str(args.drafter), tok).load()[0]
    n_layers = drafter.model.config.n_layers
    windows = sorted({(lo, hi) for hi in range(4, n_layers + 1, 2) for lo in LOWS if lo < hi - 1}
                     | {(0, n_layers)})
    kept = {(keep, w, agg): 0 for keep in keeps for w in windows for agg in ("max", "mean")}
    for i in range(args.cases):
        case = make_case(tok, template, args.tokens, args.seed * 1_000_003 + args.tokens * 101 + i)
        where = np.asarray(needle_positions(tok, case))
        t0 = time.perf_counter()
        cached = args.save_dir / f"{args.drafter.stem}-s{args.seed}-t{args.tokens}-a{args.alpha}-{i}.npz" \
            if args.save_dir else None
        if cached is not None and cached.exists():
            layers = np.load(cached)["layers"]
        else:
            layers = layer_maxima(drafter, case.ids, args.alpha)        # (N, T, S)
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                np.savez_compressed(cached, layers=layers)
        log(f"case {i}: {case.n_tokens} tokens, needle at {where[0]} (depth {case.depth:.2f}), "
            f"maxima in {time.perf_counter() - t0:.1f} s")
        for (lo, hi) in windows:
            for agg in ("max", "mean"):
                probs = layers[lo:hi].max(axis=0) if agg == "max" else layers[lo:hi].mean(axis=0)
                for keep in keeps:
                    sel = kept_positions(probs, keep, pc.chunk_tokens, pc.smooth_tokens, pc.first_chunks,
                                         pc.last_chunks)
                    kept[(keep, (lo, hi), agg)] += bool(np.isin(where, sel).all())
    lines = []
    for keep in keeps:
        lines += [f"### Needle kept by PFlash selection per drafter-layer window: {args.drafter.name}, "
                  f"{args.cases} cases of {args.tokens} tokens, keep {keep}, alpha {args.alpha}, "
                  f"{args.device}, {datetime.date.today()}", "",
                  "Cost of a window [lo, hi) = hi / N of the drafter forward. Cell: cases whose needle value was "
                  "kept (max / mean over the window's layers).", "",
                  "| hi \\ lo | " + " | ".join(str(lo) for lo in LOWS) + " |",
                  "|---" * (len(LOWS) + 1) + "|"]
        for hi in sorted({hi for _, hi in windows}):
            cells = [f"{kept[(keep, (lo, hi), 'max')]}/{kept[(keep, (lo, hi), 'mean')]}" if (lo, hi) in windows
                     else "" for lo in LOWS]
            lines.append(f"| {hi} | " + " | ".join(cells) + " |")
        lines.append("")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_md_json(args.out, f"{datetime.date.today()}-{args.device}-pflash-layer-windows-{args.tokens}", text,
                      {"drafter": args.drafter.name, "tokens": args.tokens, "cases": args.cases, "alpha": args.alpha,
                       "kept": {f"{k}-{w[0]}-{w[1]}-{a}": v for (k, w, a), v in kept.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
