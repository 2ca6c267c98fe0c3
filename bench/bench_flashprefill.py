"""FlashPrefill block scoring (native/cuda/flashprefill.cu): fd_flashprefill_mean_k, fd_flashprefill_score,
fd_flashprefill_select and fd_flashprefill_tail_max_probs, each checked against the numpy oracle
flashd.daemon.pflash.flashprefill (mean_k, score, select, tail_max_probs) before it is timed. The
block-sparse attention that consumes the selection is bench_flashprefill_sparse_attention.py.

    python bench/bench_flashprefill.py [--seed N] [--reps 30] [--quick]

Cases: one drafter forward chunk of PFlashConfig.forward_chunk = 4096 tokens, the last chunk of an 8K
and of a 32K prompt (p0 = 4096, 28672: the most key blocks), with the heads of Qwen2.5-Coder-0.5B
(14 / 2 heads, head_dim 64, the usual drafter) and 1.5B (12 / 2, head_dim 128), plus an awkward one
(p0 256, n 777: a partial last query and key block). --quick: the 32K 0.5B case only. The inputs have
structure (prefill_inputs: a tenth of the key blocks lean towards the queries' direction), so that
selection at PFlashConfig's alpha keeps a realistic fraction of blocks rather than all of them (random
Gaussian q and k score every block alike); the kept fraction is printed after fd_flashprefill_select.

Tolerances (as tests/gpu/test_flashprefill.py, whose reasons follow):
  mean_k  rtol 1e-5, atol 1e-6: float32 sums of <= 128 float16 values.
  score   rtol 1e-4, atol 2e-5: float32 q . mean_k and exp2 by ex2.approx (2 ulp); scores in [0, 1].
  select  exact: the device's own float32 scores go to the oracle too, so the thresholds compare the
          same values (alpha * max in float32 both sides).
  tail    rtol 1e-4, atol 1e-6: float32 dots of float32 q with float16 k, exp2 approx, float32
          log-sum-exp.
GB/s counts the bytes each op must move (inputs read once, outputs written once); score also reports
its FLOPs (2 * head_dim per q . mean_k, no peak: it runs on the CUDA cores in float32).
"""
from __future__ import annotations

import argparse

import numpy as np

from flashd.bench.op_harness import OpHarness, Tolerance, op_parser, run_cases

B = 128                       # FD_FLASHPREFILL_BLOCK == flashprefill.BLOCK
MODELS = {                    # n_heads, n_kv_heads, head_dim
    "qwen2.5-0.5b": (14, 2, 64),
    "qwen2.5-1.5b": (12, 2, 128),
}
# (model, p0, n): the chunk of n new tokens at cache slots [p0, p0 + n), the last chunk of its prompt
CASES = [("qwen2.5-0.5b", 4096, 4096), ("qwen2.5-0.5b", 28672, 4096),
         ("qwen2.5-1.5b", 4096, 4096), ("qwen2.5-1.5b", 28672, 4096),
         ("qwen2.5-0.5b", 256, 777)]
QUICK_CASES = [("qwen2.5-0.5b", 28672, 4096)]
# PFlashConfig's defaults (daemon/pflash/config.py)
ALPHA, SINK_BLOCKS, WINDOW_BLOCKS, LAST_FULL_BLOCKS, TAIL_TOKENS = 0.7, 2, 4, 2, 8
RELEVANT_FRACTION = 0.1       # of the key blocks, per KV head, that lean towards the queries


def n_blocks(n: int) -> int:
    return -(-n // B)


def first_full_block(p0: int, n: int) -> int:
    """The last chunk of a prompt of p0 + n tokens: its last LAST_FULL_BLOCKS query blocks attend densely."""
    return n_blocks(p0 + n) - LAST_FULL_BLOCKS


def query_block_rows(p0: int, n: int):
    """(m, rows) per query block: its absolute block index and its number of new tokens."""
    return [(p0 // B + mq, min(B, n - mq * B)) for mq in range(n_blocks(n))]


def causal_blocks(p0: int, n: int, n_heads: int) -> int:
    """(query block, head, key block kb <= m) triples: what a dense selection would keep."""
    return n_heads * sum(m + 1 for m, _ in query_block_rows(p0, n))


def mean_k_bytes(n_keys: int, n_kv: int, d: int) -> int:
    return 2 * n_keys * n_kv * d + 4 * n_blocks(n_keys) * n_kv * d


def score_bytes(p0: int, n: int, n_heads: int, n_kv: int, d: int) -> int:
    n_kb = n_blocks(p0 + n)
    return 4 * (n * n_heads * d + n_kb * n_kv * d + n_blocks(n) * n_heads * n_kb)


def score_flops(p0: int, n: int, n_heads: int, d: int) -> int:
    """2 * d per (query row, head, key block kb <= m): the dots q_j . mean_k[kb]."""
    return 2 * d * n_heads * sum(rows * (m + 1) for m, rows in query_block_rows(p0, n))


def select_bytes(p0: int, n: int, n_heads: int) -> int:
    per = n_blocks(n) * n_heads
    return 4 * (2 * per * n_blocks(p0 + n) + per)       # scores read, idx written, cnt written


def tail_bytes(n_keys: int, n_tail: int, n_heads: int, n_kv: int, d: int) -> int:
    return 2 * n_keys * n_kv * d + 4 * n_tail * n_heads * d + 2 * 4 * n_tail * n_keys   # K, q, acc read + write


def slots_first(cache: np.ndarray) -> np.ndarray:
    """(n_kv, slots, d) as the device stores the cache -> (slots, n_kv, d) as the oracle takes it."""
    return np.ascontiguousarray(cache.transpose(1, 0, 2))


def prefill_inputs(rng, p0: int, n: int, n_heads: int, n_kv: int, d: int, max_ctx: int | None = None):
    """q (n, n_heads, d) float32 and the caches k, v (n_kv, max_ctx, d) float16 with slots >= p0 + n NaN (a
    kernel must never read them). Per KV head a unit direction u: the queries of its heads lean along u
    (+3u), and each key block leans along u by b -- b in [2, 3) for RELEVANT_FRACTION of the blocks, about
    0 for the rest -- so the block scores single out the relevant blocks, as trained attention does."""
    n_keys = p0 + n
    max_ctx = n_keys if max_ctx is None else max_ctx
    u = rng.standard_normal((n_kv, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    n_kb = n_blocks(n_keys)
    relevant = rng.uniform(size=(n_kv, n_kb)) < RELEVANT_FRACTION
    lean = np.where(relevant, rng.uniform(2.0, 3.0, (n_kv, n_kb)), 0.3 * rng.standard_normal((n_kv, n_kb)))
    k = rng.standard_normal((n_kv, n_keys, d)) + np.repeat(lean, B, axis=1)[:, :n_keys, None] * u[:, None, :]
    group = n_heads // n_kv
    q = rng.standard_normal((n, n_heads, d)) + 3.0 * np.repeat(u, group, axis=0)[None]
    kc = np.full((n_kv, max_ctx, d), np.nan, np.float16)
    vc = np.full((n_kv, max_ctx, d), np.nan, np.float16)
    kc[:, :n_keys] = k
    vc[:, :n_keys] = rng.standard_normal((n_kv, n_keys, d))
    return q.astype(np.float32), kc, vc


def oracle_selection(q, kc, p0: int, n_kv: int):
    """FlashPrefill's selection of one chunk by the numpy oracle (mean_K -> score -> select, float64
    scores rounded to float32 as the device keeps them): idx (Mq, H, Nk), cnt (Mq, H)."""
    from flashd.daemon.pflash import flashprefill as fp

    n, _, d = q.shape
    mk = fp.mean_k(slots_first(kc)[:p0 + n].astype(np.float64))
    s = fp.score(q, mk, p0, 1.0 / np.sqrt(d)).astype(np.float32)
    return fp.select(s, p0, np.float32(ALPHA), SINK_BLOCKS, WINDOW_BLOCKS, first_full_block(p0, n))


def bench_case(h: OpHarness, model: str, p0: int, n: int) -> None:
    from flashd.daemon.backends.cuda.ops import attention_shape
    from flashd.daemon.pflash import flashprefill as fp

    n_heads, n_kv, d = MODELS[model]
    dev, lib, p = h.dev, h.dev.lib, h.dev.p
    n_keys, max_ctx = p0 + n, p0 + n + 64
    n_mq, n_kb = n_blocks(n), n_blocks(n_keys)
    scale = float(1.0 / np.sqrt(d))
    label = f"{model} p0={p0} n={n}"
    q, kc, vc = prefill_inputs(h.rng(label), p0, n, n_heads, n_kv, d, max_ctx)
    del vc
    qd, kd = dev.upload(q), dev.upload(kc)
    keys64 = slots_first(kc)[:n_keys].astype(np.float64)
    shape = attention_shape(dev.ffi, n_heads, n_kv, d, max_ctx, scale)

    mk = dev.empty((n_kb, n_kv, d))
    h.run(f"fd_flashprefill_mean_k {label}",
          lambda: lib.fd_flashprefill_mean_k(p(mk, "float*"), p(kd), n_keys, shape, dev.stream),
          lambda: dev.download(mk), lambda: fp.mean_k(keys64),
          Tolerance("float32 sums of <= 128 float16 values", atol=1e-6, rtol=1e-5),
          n_bytes=mean_k_bytes(n_keys, n_kv, d))

    score = dev.empty((n_mq, n_heads, n_kb))
    h.run(f"fd_flashprefill_score {label}",
          lambda: lib.fd_flashprefill_score(p(score, "float*"), p(qd, "float*"), p(mk, "float*"), p0, n, shape,
                                            dev.stream),
          lambda: dev.download(score), lambda: fp.score(q, dev.download(mk).astype(np.float64), p0, scale),
          Tolerance("float32 q . mean_k, exp2 by ex2.approx (2 ulp); normalised scores lie in [0, 1]",
                    atol=2e-5, rtol=1e-4),
          n_bytes=score_bytes(p0, n, n_heads, n_kv, d), flops=score_flops(p0, n, n_heads, d))

    s32 = dev.download(score)
    idx, cnt = dev.empty((n_mq, n_heads, n_kb), np.int32), dev.empty((n_mq, n_heads), np.int32)
    full = first_full_block(p0, n)
    h.run(f"fd_flashprefill_select {label}",
          lambda: lib.fd_flashprefill_select(p(idx, "int32_t*"), p(cnt, "int32_t*"), p(score, "float*"), p0, n, n_heads,
                                             ALPHA, SINK_BLOCKS, WINDOW_BLOCKS, full, dev.stream),
          lambda: np.concatenate([dev.download(idx).ravel(), dev.download(cnt).ravel()]),
          lambda: np.concatenate([a.ravel() for a in fp.select(s32, p0, np.float32(ALPHA), SINK_BLOCKS,
                                                               WINDOW_BLOCKS, full)]),
          Tolerance.exact("the oracle thresholds the device's own float32 scores"),
          n_bytes=select_bytes(p0, n, n_heads))
    kept = int(dev.download(cnt).sum())
    print(f"#   kept {kept} of {causal_blocks(p0, n, n_heads)} causal (query block, head, key block) triples "
          f"({100 * kept / causal_blocks(p0, n, n_heads):.1f}%) at alpha {ALPHA}", flush=True)

    n_tail = min(TAIL_TOKENS, n)
    rng = h.rng(f"tail {label}")
    acc0 = rng.uniform(0, 2.0 / n_keys, size=(n_tail, n_keys)).astype(np.float32)
    acc, ws = dev.upload(acc0), dev.empty((2 * n_tail * n_heads,))
    q_tail = dev.upload(q[n - n_tail:])
    h.run(f"fd_flashprefill_tail_max_probs {label} tail {n_tail}",
          lambda: lib.fd_flashprefill_tail_max_probs(p(acc, "float*"), p(q_tail, "float*"), p(kd), n_keys, n_tail,
                                                     shape, p(ws, "float*"), dev.stream),
          lambda: dev.download(acc),
          lambda: np.maximum(acc0, fp.tail_max_probs(q[n - n_tail:], keys64, n_keys, scale)),
          Tolerance("float32 dots of float32 q with float16 k, exp2 approx, float32 log-sum-exp",
                    atol=1e-6, rtol=1e-4),
          n_bytes=tail_bytes(n_keys, n_tail, n_heads, n_kv, d))


def build_parser() -> argparse.ArgumentParser:
    return op_parser(__doc__, "only the 32K-context 0.5B case")


def main(argv=None) -> None:
    run_cases(build_parser().parse_args(argv), bench_case, CASES, QUICK_CASES)


if __name__ == "__main__":
    main()
