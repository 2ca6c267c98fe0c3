"""How coarse may the int8 x of the tensor-core GEMV be? The logits with x quantized per 32 columns (what the GPU's
gemv_rows kernels and llama.cpp's MMQ do: q = rint(x * 127 / max|x|) per block, the block's scale max|x| / 127)
against per 256 columns (one scale a K-quant super-block: ggml's Q8_K, what its CPU dot products use), on the CPU
reference backend with a real model -- the question behind NOTES' session-31 lever (a super-block's 8 sub-block
sums accumulated in int32 need one x scale a super-block).

    python bench/lab/x_quant_block.py MODEL.gguf [--prompts 6] [--new 48] [--blocks 32,256]

Each prompt of bench/spec_prompts.jsonl (raw, as bench_spec encodes them) is answered greedily by the unquantized
reference (float32 weights dequantized from the GGUF, float32 x); then every linear layer's x is fake-quantized per
block of each size (the weights stay as they are) and the same token sequence is scored teacher-forced. Printed per
block size: top-1 agreement with the unquantized argmax over the answer positions, and the logits' error relative
to their spread (max over positions of max |dlogit| / (max - min of that position's reference logits), and the
median). Reference forward only: minutes on a CPU for the 1.5B.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def fake_quant_x(x: np.ndarray, block: int) -> np.ndarray:
    """x (n, cols) float32 -> the values int8 codes per `block` columns stand for: rint(x * 127 / amax) * amax / 127
    (amax = max |x| of the block; an all-zero block stays zero), in float32 as the kernels' products see them."""
    n, cols = x.shape
    if block <= 0 or cols % block:
        return x
    b = x.reshape(n, cols // block, block).astype(np.float32)
    amax = np.abs(b).max(axis=2, keepdims=True)
    d = amax / np.float32(127)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(b * inv)
    return (q * d).reshape(n, cols).astype(np.float32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--prompts", type=int, default=6, help="first N prompts of bench/spec_prompts.jsonl")
    ap.add_argument("--new", type=int, default=48, help="greedy answer tokens a prompt (the scored positions)")
    ap.add_argument("--blocks", default="32,256", help="comma list of x block sizes (columns a scale)")
    args = ap.parse_args(argv)

    from flashd.clients.tokenizer import Tokenizer
    from flashd.daemon.backends.reference import ReferenceOps
    from flashd.daemon.models import load_model
    from flashd.daemon.runner import ModelRunner
    from flashd.protocol.messages import SamplingParams

    ops = ReferenceOps()
    t0 = time.perf_counter()
    lm = load_model(args.model, ops.load_weight)
    tok = Tokenizer.from_gguf(args.model)
    texts = [json.loads(line)["text"] for line in (ROOT / "bench" / "spec_prompts.jsonl").read_text().splitlines()
             if line.strip()][:args.prompts]
    print(f"# {args.model.name}: loaded in {time.perf_counter() - t0:.0f} s; {len(texts)} prompts x {args.new} tokens")
    runner = ModelRunner(ops, lm.config, lm.weights, 2048, 512)
    linear = ReferenceOps.linear
    block = {"size": 0}

    def quantized_linear(self, x, weight, bias=None, residual=None):
        return linear(self, fake_quant_x(np.asarray(x, np.float32), block["size"]), weight, bias, residual)
    ReferenceOps.linear = quantized_linear
    sizes = [int(b) for b in args.blocks.split(",")]
    stats = {b: {"agree": 0, "n": 0, "rel": []} for b in sizes}
    try:
        for text in texts:
            prompt = tok.encode(text, add_special=True)
            block["size"] = 0
            answer = [s.token for s in runner.generate(prompt, SamplingParams(), args.new)]
            seq = prompt + answer
            ref = np.asarray(runner.score(seq))[len(prompt) - 1:len(seq) - 1]      # the logits that chose answer
            for b in sizes:
                block["size"] = b
                got = np.asarray(runner.score(seq))[len(prompt) - 1:len(seq) - 1]
                s = stats[b]
                s["agree"] += int((got.argmax(axis=1) == ref.argmax(axis=1)).sum())
                s["n"] += len(ref)
                spread = ref.max(axis=1) - ref.min(axis=1)
                s["rel"].extend((np.abs(got - ref).max(axis=1) / spread).tolist())
            print(f"  {text[:50]!r}: {len(answer)} tokens scored", flush=True)
    finally:
        ReferenceOps.linear = linear
    print("| x block (columns a scale) | top-1 agreement with unquantized x | max dlogit / spread | median |")
    print("|---:|---:|---:|---:|")
    for b in sizes:
        s = stats[b]
        rel = np.asarray(s["rel"])
        print(f"| {b} | {s['agree']}/{s['n']} ({s['agree'] / max(s['n'], 1):.2%}) | {rel.max():.2e} | "
              f"{np.median(rel):.2e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
