"""A qwen35 hybrid (Gated DeltaNet + gated full attention) on the CUDA backend end to end, against the reference
backend (the oracle), on tiny synthetic models of several shapes: head counts, GQA, partial rotary dims, the
delta rule's head size S (queries, keys and values share S in qwen35: d_k == d_v in the kernels' terms; d_k !=
d_v is tests/gpu/test_gated_delta_rule.py's), Hv > Hk, attention layers placed at different intervals.

Tolerance (logits_check.py, as the dense models' tests/gpu/test_cuda_model.py): max |cuda - ref| <= 2e-2 *
max |ref| (REL_TOL) plus argmax agreement wherever the reference's top-2 gap is clear; greedy tokens equal the
reference's up to the first near-tie. The CUDA path rounds prefill GEMM weights and activations and the K/V
cache to float16 and runs the delta rule's prefill in its recurrent form (the reference: the chunked form),
rounding-level differences that the recurrent state carries from token to token.

The CUDA runner decodes a hybrid on CudaRunner's captured decode graph (backends/cuda/hybrid_runner.py; ABI 13's
gate kernels leave no host step in the forward): the graph's greedy tokens equal the eager forward's (the
logprobs path: a forward per token, selection on the host) token for token, bit-identical kernels, and the
reference's up to a near-tie. Draft trees are verified eagerly; speculative decoding must give exactly this
runner's plain greedy tokens (every op of a verify computes each row as a decode step does)."""
import numpy as np
import pytest
from tests.gpu.logits_check import assert_logits_close, greedy_prefix_agrees
from tests.gpu.test_cuda_model import make_runners   # the reference runner and the CUDA one, for the same file
from tests.speculative.spec_drafters import OracleDrafter, plain, spec

from flashd.daemon.speculative.ngram import NgramConfig, NgramDrafter
from flashd.protocol.messages import SamplingParams

VOCAB = 1000
# name -> SyntheticSpec fields: layer i is full attention iff (i + 1) % full_attn_interval == 0
SHAPES = {
    "mha_full_rope": dict(n_layers=4, hidden=256, n_heads=4, n_kv_heads=4, head_dim=64, rope_dim=64, ffn=512,
                          ssm_state=64, ssm_k_heads=2, ssm_v_heads=4, ssm_conv_kernel=4, full_attn_interval=4),
    "gqa_partial_rope": dict(n_layers=4, hidden=256, n_heads=4, n_kv_heads=1, head_dim=64, rope_dim=16, ffn=512,
                             ssm_state=32, ssm_k_heads=1, ssm_v_heads=4, ssm_conv_kernel=4, full_attn_interval=2),
    "hd128_conv3": dict(n_layers=6, hidden=256, n_heads=2, n_kv_heads=1, head_dim=128, rope_dim=32, ffn=512,
                        ssm_state=128, ssm_k_heads=2, ssm_v_heads=2, ssm_conv_kernel=3, full_attn_interval=3),
    # head_dim 256 as the real Qwen3.5 files (64 of 256 dims rotated): GQA 4 and GQA 6 (a row tile of 16 query
    # rows only partly used, twice the heads of a KV head than the 0.8B's)
    "hd256_gqa4": dict(n_layers=4, hidden=256, n_heads=4, n_kv_heads=1, head_dim=256, rope_dim=64, ffn=512,
                       ssm_state=64, ssm_k_heads=2, ssm_v_heads=4, ssm_conv_kernel=4, full_attn_interval=2),
    "hd256_gqa6": dict(n_layers=3, hidden=256, n_heads=6, n_kv_heads=1, head_dim=256, rope_dim=64, ffn=512,
                       ssm_state=32, ssm_k_heads=1, ssm_v_heads=2, ssm_conv_kernel=4, full_attn_interval=3),
    # the 0.8B's real shape (scripts/synthetic_presets.py "qwen3.5-0.8b": 8 / 2 heads, head_dim 256, rope_dim 64,
    # 16 / 16 DeltaNet heads of 128, hidden 1024, ffn 3584), cut to 4 layers (3 linear, 1 full) and a small vocab
    "qwen35_08b_4l": dict(n_layers=4, hidden=1024, n_heads=8, n_kv_heads=2, head_dim=256, rope_dim=64, ffn=3584,
                          ssm_state=128, ssm_k_heads=16, ssm_v_heads=16, ssm_conv_kernel=4, full_attn_interval=4,
                          rope_theta=10_000_000.0, rms_eps=1e-6, tie_embeddings=True),
    # the 27B's Gated DeltaNet heads: 3 value heads per key head (48 on 16) of 128 -- the fused delta rule's
    # whole-head block at its limit (fused_ops.py) -- with its attention heads of 256 (64 dims rotated)
    "v3_per_k": dict(n_layers=4, hidden=256, n_heads=4, n_kv_heads=1, head_dim=256, rope_dim=64, ffn=512,
                     ssm_state=128, ssm_k_heads=2, ssm_v_heads=6, ssm_conv_kernel=4, full_attn_interval=4),
}
# weight formats per shape: every 2-D matrix in it (ssm_conv1d stays F32); Q4_K needs 256-wide rows, which
# gqa_partial_rope's ssm_out (Hv S = 128 columns) lacks
FORMATS = [("mha_full_rope", "F32"), ("mha_full_rope", "Q8_0"), ("mha_full_rope", "Q4_K"),
           ("gqa_partial_rope", "Q8_0"), ("gqa_partial_rope", "F16"), ("hd128_conv3", "Q8_0"),
           ("hd256_gqa4", "Q8_0"), ("hd256_gqa4", "Q4_K"), ("hd256_gqa6", "F16"), ("qwen35_08b_4l", "Q8_0"),
           ("qwen35_08b_4l", "BF16"), ("v3_per_k", "Q8_0")]


@pytest.fixture(scope="module")
def cuda_backend(native):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    return CudaBackend()


def model(synthetic_model, shape: str, fmt: str = "Q8_0"):
    return synthetic_model(arch="qwen35", weight_type=fmt, vocab_size=VOCAB, **SHAPES[shape])


def ids_of(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, n).tolist()


@pytest.mark.parametrize("shape, fmt", FORMATS)
def test_prefill_and_decode_logits_match_reference(cuda_backend, synthetic_model, shape, fmt):
    ref, cuda = make_runners(cuda_backend, model(synthetic_model, shape, fmt))
    assert type(cuda).__name__ == "CudaHybridRunner" and cuda.forward_path == "graph"
    ids = ids_of(77)            # 77: two chunks of 64 + 13 (the state crosses a chunk), a partial GEMM tile
    assert_logits_close(cuda.score(ids), ref.score(ids))
    # decode path (GEMV, one-token conv and delta-rule kernels, fused rope + decode attention), from slot 0
    cuda.reset(), ref.reset()
    got = np.concatenate([cuda.prefill([t], all_logits=True) for t in ids[:20]])
    want = np.concatenate([ref.prefill([t], all_logits=True) for t in ids[:20]])
    assert_logits_close(got, want)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_decode_after_a_chunked_prefill(cuda_backend, synthetic_model, shape):
    """The state a prefill leaves (GEMM path, prefill kernels) carries into decode steps (GEMV, decode kernels)."""
    ref, cuda = make_runners(cuda_backend, model(synthetic_model, shape))
    ids = ids_of(90, seed=1)
    assert_logits_close(cuda.prefill(ids[:80]), ref.prefill(ids[:80]))      # 64 + 16: two chunks
    got = np.concatenate([cuda.prefill([t], all_logits=True) for t in ids[80:]])
    want = np.concatenate([ref.prefill([t], all_logits=True) for t in ids[80:]])
    assert_logits_close(got, want)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_prefill_in_two_chunks_equals_one(cuda_backend, synthetic_model, shape):
    """Prefill of 50 tokens, then 10 more, against the 60 at once (the recurrent state and the K/V cache carry
    the first call's context into the second); both against the reference."""
    ref, cuda = make_runners(cuda_backend, model(synthetic_model, shape))
    ids = ids_of(60, seed=2)
    one = cuda.prefill(ids, all_logits=True)
    cuda.reset()
    two = np.concatenate([cuda.prefill(ids[:50], all_logits=True), cuda.prefill(ids[50:], all_logits=True)])
    assert_logits_close(two, one)
    assert_logits_close(two, ref.prefill(ids, all_logits=True))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_decode_matches_reference(cuda_backend, synthetic_model, shape):
    ref, cuda = make_runners(cuda_backend, model(synthetic_model, shape))
    prompt = [3, 14, 15, 92, 65, 35, 89, 79]
    got = [s.token for s in cuda.generate(prompt, SamplingParams(), 16)]
    assert len(got) == 16
    ok, where = greedy_prefix_agrees(ref, prompt, got)
    assert ok, f"greedy diverges from the reference at token {where} without a near-tie"
    again = [s.token for s in cuda.generate(prompt, SamplingParams(), 16)]     # a new sequence: state cleared
    assert again == got


@pytest.mark.parametrize("shape, fmt", FORMATS)
def test_graph_decode_equals_eager_and_reference(cuda_backend, synthetic_model, shape, fmt):
    """The captured decode step (one graph launch per token, the token chosen on the device) against the eager
    forward per token (logprobs: host selection) -- the same kernels on the same inputs, so the same tokens -- and
    the reference's greedy tokens up to a near-tie; twice, the second a new sequence (state cleared by the prefill)."""
    ref, cuda = make_runners(cuda_backend, model(synthetic_model, shape, fmt))
    assert cuda.graphs, "the decode graph was not captured at construction"
    prompt = ids_of(13, seed=8)
    graph = [s.token for s in cuda.generate(prompt, SamplingParams(), 40)]
    eager = [s.token for s in cuda.generate(prompt, SamplingParams(), 40, logprobs=1)]
    assert graph == eager, "graph replay differs from eager execution"
    ok, where = greedy_prefix_agrees(ref, prompt, graph)
    assert ok, f"greedy diverges from the reference at token {where} without a near-tie"
    assert [s.token for s in cuda.generate(prompt, SamplingParams(), 40)] == graph


def test_greedy_continue_from_an_empty_context_starts_a_new_sequence(cuda_backend, synthetic_model):
    """greedy_continue from slot 0 feeds its tokens through the decode graph, whose forward does not read n_past
    back: the runner clears the recurrent state first (a dirty state from the last request would change every
    token). Against the reference's greedy tokens, and against the same call on a fresh runner, exactly."""
    path = model(synthetic_model, "gqa_partial_rope")
    ref, cuda = make_runners(cuda_backend, path)
    _, fresh = make_runners(cuda_backend, path)
    [s.token for s in cuda.generate(ids_of(30, seed=9), SamplingParams(), 10)]        # leaves a state behind
    cuda.reset()
    feed = ids_of(6, seed=10)
    chain = cuda.greedy_continue(feed, 12)
    assert chain == fresh.greedy_continue(feed, 12)
    ok, where = greedy_prefix_agrees(ref, feed, chain)
    assert ok, f"greedy_continue diverges from the reference at token {where} without a near-tie"


def test_a_graph_recaptured_after_the_constants_are_dropped(cuda_backend, synthetic_model):
    """After ops.release() (parking) hybrid_ops' constants are gone and the engine drops the graphs; the next
    capture makes l2_norm's weight before it begins (an upload inside a capture fails; only the composition past
    the fused delta rule's limit reads it): same tokens as before."""
    _, cuda = make_runners(cuda_backend, model(synthetic_model, "hd128_conv3"))
    prompt = ids_of(9, seed=11)
    before = [s.token for s in cuda.generate(prompt, SamplingParams(), 20)]
    cuda.drop_graphs()
    cuda.ops._hybrid_init()            # what release() does to hybrid_ops' constants (the arena stays)
    assert [s.token for s in cuda.generate(prompt, SamplingParams(), 20)] == before


def test_prefix_reuse_keeps_the_device_state_bit_for_bit(cuda_backend, synthetic_model):
    """A hybrid keeps one prefix: the K/V and a host copy of the recurrent state at the last prompt's last
    whole-chunk boundary (models/qwen35.py HybridCache). A second prompt sharing it continues from that copy,
    loaded back onto the device: tokens and logprobs equal a runner's that reuses nothing, exactly."""
    path = model(synthetic_model, "gqa_partial_rope")
    _, cuda = make_runners(cuda_backend, path)
    _, fresh = make_runners(cuda_backend, path)
    fresh.reuse_prefix = False
    rng = np.random.default_rng(4)
    a = rng.integers(0, VOCAB, 150).tolist()
    b = a[:140] + rng.integers(0, VOCAB, 60).tolist()

    def run(runner, prompt):
        return [(s.token, s.logprob) for s in runner.generate(prompt, SamplingParams(), 12, logprobs=3)]

    run(cuda, a)
    assert run(cuda, b) == run(fresh, b)
    assert cuda.n_reused > 0 and fresh.n_reused == 0
    # the graph path (CudaRunner.generate's _prefill_prompt) marks the state at the boundary as start() does
    greedy = lambda runner, prompt: [s.token for s in runner.generate(prompt, SamplingParams(), 12)]   # noqa: E731
    greedy(cuda, a)
    assert greedy(cuda, b) == greedy(fresh, b)
    assert cuda.n_reused > 0


def test_a_drafters_chain_with_checkpoint_and_rewind(cuda_backend, synthetic_model):
    """A hybrid as a draft model (greedy_continue, checkpoint / rewind): after a rewind to the chain's root the
    same one-token forwards from the same (reloaded) state choose the same tokens."""
    _, cuda = make_runners(cuda_backend, model(synthetic_model, "mha_full_rope"))
    cuda.prefill([1, 2, 3])
    cuda.checkpoint()
    chain = cuda.greedy_continue([4], 3)
    assert len(chain) == 3 and cuda.n_past == 6
    cuda.rewind(4, [1, 2, 3, 4])
    assert cuda.n_past == 4
    assert cuda.greedy_continue([chain[0]], 1) == chain[1:2]


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("mode, budget", [("chain", 4), ("ddtree", 8), ("ddtree", 30)])
def test_speculative_decoding_equals_plain_greedy(cuda_backend, synthetic_model, shape, mode, budget):
    """Draft trees verified with a state per node (the _tree kernels, row-invariant projections, masked attention
    split like decode's) and committed (the accepted node's state, the path's K/V moved): token for token this
    runner's plain greedy output, with the n-gram drafter and with OracleDrafter (long accepts, off-spine paths)."""
    _, cuda = make_runners(cuda_backend, model(synthetic_model, shape))
    prompts = [[5, 9, 77, 12, 5, 9, 77, 12, 100, 200], ids_of(70, seed=6)]    # the second spans a whole chunk
    accepted = 0
    for i, prompt in enumerate(prompts):
        want = [s.token for s in plain(cuda, prompt, 32)]
        for drafter in (NgramDrafter(NgramConfig(min_ngram=1)), OracleDrafter(want, VOCAB, seed=i)):
            got, stats = spec(cuda, drafter, mode, budget, prompt, 32)
            assert [s.token for s in got] == want, (prompt, type(drafter).__name__, stats)
            assert stats.accepted + stats.steps + 1 == len(want)
            accepted += stats.accepted if isinstance(drafter, OracleDrafter) else 0
    assert accepted > 0, "the oracle never got a token accepted"


def test_the_composed_paths_give_the_reference_too(cuda_backend, synthetic_model):
    """CudaOps' fused-op switches (cuda/fused_ops.py): fused_delta_prefill on and off (off, the default: a prefill's
    delta rule composed from the primitive kernels) and fuse_hybrid off (every fused op composed: the unfused launches, the A/B of the decode
    step) score within the reference's tolerance, as the fused default does. Eager scoring: no graph to drop."""
    ref, cuda = make_runners(cuda_backend, model(synthetic_model, "v3_per_k"))
    ids = ids_of(77, seed=12)
    want = ref.score(ids)
    assert_logits_close(cuda.score(ids), want)
    ops = cuda.ops
    before = ops.fuse_hybrid, ops.fused_delta_prefill
    try:
        for switch in ("fused_delta_prefill", "fuse_hybrid"):
            for value in (True, False):
                setattr(ops, switch, value)
                cuda.reset()
                assert_logits_close(cuda.score(ids), want)
            setattr(ops, switch, before[0] if switch == "fuse_hybrid" else before[1])
    finally:
        ops.fuse_hybrid, ops.fused_delta_prefill = before
