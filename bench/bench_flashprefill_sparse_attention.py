"""FlashPrefill's block-sparse attention (native/cuda/attention_sparse.cu): fd_flashprefill_sparse_attention,
the last of the four entry points CudaOps.flashprefill_attention calls (fd_attention_block_sparse with every
head FD_MASK_LISTS), checked against the float64 brute-force oracle of the GPU tests
(tests/gpu/attention_oracle.py) before it is timed.

    python bench/bench_flashprefill_sparse_attention.py [--seed N] [--reps 20] [--quick]

Cases: one drafter forward chunk of 4096 tokens (PFlashConfig.forward_chunk), the last chunk of an 8K and
of a 32K prompt (p0 = 4096, 28672), with the heads of Qwen2.5-Coder-0.5B (14 / 2, head_dim 64, the usual
drafter) and 1.5B (12 / 2, head_dim 128), plus an awkward one (p0 384, n 700: partial last blocks).
--quick: the two 32K cases. The selection is realistic: FlashPrefill's own rule (mean_K -> score ->
select at PFlashConfig's alpha 0.7, 2 sink blocks, a window of 4, the last 2 query blocks dense) applied
by the numpy oracle to structured inputs (bench_flashprefill.prefill_inputs), so each row attends its
sinks, its window and the ~10% of blocks that lean towards it; the kept fraction is printed. The dense
causal kernel (fd_attention_prefill) is timed on the same chunk for comparison.

Check: the rows of four query blocks (check_blocks: first, middle, third from last, last) in every head,
not all 4096 (the float64 oracle over 32K keys would take many minutes; these take ~40 s of host CPU per
32K case, most of it the dense last block), with tolerance atol 2e-3 * max|v|: the kernel rounds q to
float16 in its mma fragments (the oracle is given the same rounded q) and P to float16 before P V
(tests/gpu/test_flashprefill.py's bound). The selection's own host time (~12 s per 32K case) is not timed.
TFLOP/s counts only the attended pairs: 4 * head_dim per (row, head, visible key) (QK^T and PV, 2 FLOPs
per multiply-add), % of the nominal dense f16 peak (989 TFLOP/s); masked work is overhead.
"""
from __future__ import annotations

import argparse

import numpy as np

from flashd.bench.bench_flashprefill import MODELS, B, n_blocks, oracle_selection, prefill_inputs, query_block_rows
from flashd.bench.op_harness import PEAK_F16_TFLOPS, OpHarness, Tolerance, op_parser, repo_module, run_cases
from flashd.bench.timing import report
from flashd.daemon.backends.cuda.ops import attention_shape

# (model, p0, n): the last chunk of a prompt of p0 + n tokens
CASES = [("qwen2.5-0.5b", 4096, 4096), ("qwen2.5-0.5b", 28672, 4096),
         ("qwen2.5-1.5b", 4096, 4096), ("qwen2.5-1.5b", 28672, 4096),
         ("qwen2.5-0.5b", 384, 700)]
QUICK_CASES = [("qwen2.5-0.5b", 28672, 4096), ("qwen2.5-1.5b", 28672, 4096)]


def check_blocks(n: int) -> list[int]:
    """The query blocks whose rows are checked: first, middle, third from last (sparse), last (dense)."""
    n_mq = n_blocks(n)
    return sorted({b for b in (0, n_mq // 2, n_mq - 3, n_mq - 1) if 0 <= b < n_mq})


def kept_slots(idx, cnt, mq: int, h: int, n_keys: int) -> np.ndarray:
    """The cache slots of the key blocks (query block mq, head h) attends, ascending."""
    blocks = idx[mq, h, :cnt[mq, h]]
    return np.concatenate([np.arange(kb * B, min(kb * B + B, n_keys)) for kb in blocks] or [np.zeros(0, int)])


def visible_pairs(idx, cnt, p0: int, n: int) -> int:
    """(row, head, key) triples the kernel must attend: a kept block below the diagonal is seen whole by
    every row of the query block; in the diagonal block row r sees r + 1 keys."""
    total = 0
    for mq, (m, rows) in enumerate(query_block_rows(p0, n)):
        for h in range(cnt.shape[1]):
            kept = idx[mq, h, :cnt[mq, h]]
            total += rows * B * int((kept < m).sum()) + (rows * (rows + 1) // 2 if (kept == m).any() else 0)
    return total


def dense_pairs(p0: int, n: int, n_heads: int) -> int:
    return n_heads * (n * p0 + n * (n + 1) // 2)


def sampled_output(o: np.ndarray, p0: int, n: int, d: int, n_heads: int) -> np.ndarray:
    """The rows of check_blocks(n), every head: (n_checked_rows, n_heads, d) from o (n, n_heads * d)."""
    rows = np.concatenate([np.arange(mq * B, min(n, mq * B + B)) for mq in check_blocks(n)])
    return o.reshape(n, n_heads, d)[rows]


def sparse_reference(q, kc, vc, idx, cnt, p0: int) -> np.ndarray:
    """The float64 oracle on the rows of check_blocks: per (query block, head), attention_oracle over the
    slots of the kept blocks (a hidden slot contributes nothing, so the others are left out), causal."""
    oracle = repo_module("tests/gpu/attention_oracle.py").attention_oracle
    n, n_heads, d = q.shape
    n_kv = kc.shape[0]
    group, n_keys = n_heads // n_kv, p0 + n
    q16 = q.astype(np.float16).astype(np.float32)          # the kernel's mma fragments hold q in float16
    out = []
    for mq in check_blocks(n):
        rows = np.arange(mq * B, min(n, mq * B + B))
        block = np.empty((rows.size, n_heads, d))
        for h in range(n_heads):
            cols = kept_slots(idx, cnt, mq, h, n_keys)
            visible = cols[None, :] <= (p0 + rows)[:, None]
            kv = h // group
            block[:, h] = oracle(q16[rows, h:h + 1], kc[kv:kv + 1, cols], vc[kv:kv + 1, cols], visible,
                                 1.0 / np.sqrt(d))
        out.append(block)
    return np.concatenate(out)


def bench_case(h: OpHarness, model: str, p0: int, n: int) -> None:
    n_heads, n_kv, d = MODELS[model]
    dev, lib, p = h.dev, h.dev.lib, h.dev.p
    n_keys = p0 + n
    max_ctx = n_keys + 64
    scale = float(1.0 / np.sqrt(d))
    label = f"{model} p0={p0} n={n}"
    q, kc, vc = prefill_inputs(h.rng(label), p0, n, n_heads, n_kv, d, max_ctx)
    idx, cnt = oracle_selection(q, kc, p0, n_kv)
    pairs = visible_pairs(idx, cnt, p0, n)
    print(f"#   {label}: selection keeps {100 * pairs / dense_pairs(p0, n, n_heads):.1f}% of the causal "
          f"(row, head, key) pairs", flush=True)
    qd, kd, vd = dev.upload(q), dev.upload(kc), dev.upload(vc)
    idx_d, cnt_d = dev.upload(idx), dev.upload(cnt)
    o = dev.empty((n, n_heads * d))
    dev.fill_bytes(o, 0xFF)                                 # NaN: rows the kernel leaves unwritten fail
    v_max = float(np.abs(vc[:, :n_keys].astype(np.float64)).max())
    shape = attention_shape(dev.ffi, n_heads, n_kv, d, max_ctx, scale)
    h.run(f"fd_flashprefill_sparse_attention {label}",
          lambda: lib.fd_flashprefill_sparse_attention(p(o, "float*"), p(qd, "float*"), p(kd), p(vd), p0, n, shape,
                                                       p(idx_d, "int32_t*"), p(cnt_d, "int32_t*"), dev.stream),
          lambda: sampled_output(dev.download(o), p0, n, d, n_heads),
          lambda: sparse_reference(q, kc, vc, idx, cnt, p0),
          Tolerance("q rounded to float16 in the mma fragments (the oracle gets the same q), P rounded to "
                    "float16 before P V: 2e-3 * max|v|", atol=2e-3 * v_max),
          flops=4.0 * d * pairs, peak_tflops=PEAK_F16_TFLOPS)

    n_past = dev.upload(np.array([p0], np.int32))
    od = dev.empty((n, n_heads * d))

    def dense():
        dev.native.check(lib.fd_attention_prefill(p(od, "float*"), p(qd, "float*"), p(kd), p(vd),
                                                  p(n_past, "int32_t*"), n, shape, dev.stream), "fd_attention_prefill")
    ms = h.timer.time(dense, reps=h.reps)
    print(report(f"  dense fd_attention_prefill {label}", ms, flops=4.0 * d * dense_pairs(p0, n, n_heads),
                 peak_tflops=PEAK_F16_TFLOPS), flush=True)


def build_parser() -> argparse.ArgumentParser:
    return op_parser(__doc__, "only the two 32K-context cases", reps=20)


def main(argv=None) -> None:
    run_cases(build_parser().parse_args(argv), bench_case, CASES, QUICK_CASES)


if __name__ == "__main__":
    main()
