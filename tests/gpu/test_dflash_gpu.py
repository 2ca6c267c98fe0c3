"""The DFlash drafter forward on the CUDA backend against the reference backend (the oracle).

Same synthetic target and drafter files on both backends; the context is injected in pieces
(one long prefill-like piece through the GEMM path, then decode-like pieces through the GEMV
path) with a draft after every piece, so the cached context K/V (Ops.kv_write -> fd_rope_kv_write
with q = NULL), the block's masked non-causal attention and the borrowed embedding/lm_head are
all compared.

Tolerance (as tests/gpu/test_cuda_model.py): the CUDA path keeps K/V in float16 and feeds the GEMM
float16 activations (2^-11 relative rounding) with float32 accumulation; through the drafter's
layers this moves logits by ~1e-3 of their scale, so max |cuda - ref| <= 2e-2 * max |ref|, plus
argmax agreement wherever the reference's top-2 gap is clear (> 2e-2 * scale).
"""
import numpy as np
import pytest
from tests.gpu.logits_check import assert_logits_close

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.models.dflash import (TargetHead, block_batch, block_mask, dflash_cache_spec, draft_block,
                                         inject_context)
from flashd.daemon.models.dflash_weights import load_dflash_weights, open_dflash
from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash

TARGET = dict(arch="qwen3", n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab_size=1000, seed=11,
              name="dflash-gpu-target")


@pytest.fixture(scope="module")
def cuda_ops(native):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    ops = CudaBackend().ops
    ops.reserve_arena(64 << 20)          # per half: far above a 77-row injection or a 16-row block
    ops.reserve_scratch(1 << 20)         # float16 elements: every drafter weight takes the GEMM path
    return ops


def drafts(ops, target, drafter_path, feats, root, pieces):
    """Logits (B-1, vocab) after each piece of context, on `ops`."""
    f, cfg = open_dflash(drafter_path)
    w = load_dflash_weights(f, cfg, ops.load_weight)
    head = TargetHead(target.weights.token_embd, target.weights.output)
    spec = dflash_cache_spec(cfg, 256)
    cache = ops.kv_cache(spec)
    if hasattr(ops, "reserve_attention"):   # as DFlashDrafter does: the block's rows need a workspace
        ops.reserve_attention(cfg.model.n_heads, cfg.model.n_kv_heads, cfg.model.head_dim, spec.max_ctx,
                              n_tokens=cfg.block_size)
    mask = block_mask(ops, cfg)
    out, n = [], 0
    for m in pieces:
        ops.begin_forward()
        inject_context(ops, cfg, w, cache, [ops.from_numpy(np.ascontiguousarray(x[n:n + m])) for x in feats],
                       ops.from_numpy(np.arange(n, n + m, dtype=np.int32)), ops.from_numpy(np.array([n], np.int32)))
        n += m
        ids = np.full(cfg.block_size, cfg.mask_token_id, np.int32)
        ids[0] = root
        ops.begin_forward()
        batch = block_batch(cfg, ops.from_numpy(ids), ops.from_numpy(np.arange(n, n + cfg.block_size, dtype=np.int32)),
                            ops.from_numpy(np.array([n], np.int32)), mask)
        out.append(np.array(ops.to_numpy(draft_block(ops, cfg, w, head, cache, batch))))
    return out


@pytest.mark.parametrize("fmt", ["F16", "BF16", "Q8_0", "Q4_K"])
def test_dflash_forward_cuda_matches_reference(cuda_ops, synthetic_model, tmp_path, fmt):
    rng = np.random.default_rng(101)
    target_path = synthetic_model(**TARGET)
    spec = spec_for_target(256, 4, 1000, n_features=3, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512,
                           block_size=16, weight_type=fmt, seed=int(rng.integers(1 << 30)))
    path = write_synthetic_dflash(tmp_path / f"dflash-{fmt}.gguf", spec)
    pieces = [77, 1, 5, 3]             # 77: a partial GEMM tile; then GEMV-sized pieces
    feats = [rng.standard_normal((sum(pieces), 256)).astype(np.float32) for _ in range(3)]
    root = int(rng.integers(999))
    ref_ops = ReferenceOps()
    want = drafts(ref_ops, load_model(target_path, ref_ops.load_weight), path, feats, root, pieces)
    got = drafts(cuda_ops, load_model(target_path, cuda_ops.load_weight), path, feats, root, pieces)
    for g, w in zip(got, want):
        assert g.shape == w.shape == (15, 1000)
        assert_logits_close(g, w)


@pytest.mark.parametrize("mode,budget", [("chain", 15), ("ddtree", 8), ("ddtree", 22), ("ddtree", 64), ("auto", 15)])
def test_dflash_spec_decoding_on_cuda_equals_greedy(native, synthetic_model, tmp_path, mode, budget):
    """The DFlash drafter on the CUDA backend inside the speculative decoder: the output equals the
    CUDA runner's plain greedy decoding token for token (verification is row-invariant); auto mixes plain runs
    (greedy_stream, the drafter told by skip) with drafted steps."""
    from flashd.daemon.backends.cuda.backend import CudaBackend
    from flashd.daemon.models import open_model
    from flashd.daemon.models.weights import total_weight_bytes
    from flashd.daemon.speculative.decoder import SpecConfig, SpecDecoder
    from flashd.daemon.speculative.dflash_drafter import load_dflash_drafter
    from flashd.protocol.messages import SamplingParams

    backend = CudaBackend()
    target_path = synthetic_model(**TARGET)
    f, cfg = open_model(target_path)
    max_ctx, chunk = 512, 64
    plan = backend.plan(cfg, total_weight_bytes(f, cfg), max_ctx, chunk)
    lm = load_model((f, cfg), backend.ops.load_weight)
    runner = backend.make_runner(cfg, lm.weights, max_ctx, chunk, plan)
    spec = spec_for_target(256, 4, 1000, n_features=3, n_layers=2, head_dim=64, ffn=512, block_size=16, seed=3)
    path = write_synthetic_dflash(tmp_path / "dflash.gguf", spec)
    drafter = load_dflash_drafter(path, backend.ops, cfg, lm.weights, max_ctx, inject_chunk=chunk)
    rng = np.random.default_rng(102)
    for n_prompt in (3, 100):
        prompt = rng.integers(0, 1000, n_prompt).tolist()
        want = [s.token for s in runner.generate(prompt, SamplingParams(), 48)]
        walks = []
        walk_device = runner.walk_device
        runner.walk_device = lambda logits: walks.append(1) or walk_device(logits)
        dec = SpecDecoder(runner, drafter, SpecConfig(mode, budget))
        got = [s.token for s in dec.generate(prompt, SamplingParams(), 48)]
        del runner.walk_device
        assert len(got) == 48 and dec.stats.steps >= 1
        assert got == want, f"{mode} budget {budget}, prompt of {n_prompt}"
        assert walks, "greedy DFlash steps build their trees on the device (SpecConfig.device_tree)"
        if mode != "auto":                  # the host build (the oracle): the same steps (auto's follow timings)
            host = SpecDecoder(runner, drafter, SpecConfig(mode, budget, device_tree=False))
            assert [s.token for s in host.generate(prompt, SamplingParams(), 48)] == want
            assert (host.stats.steps, host.stats.histogram, host.stats.drafted_nodes) == \
                (dec.stats.steps, dec.stats.histogram, dec.stats.drafted_nodes)
