"""The CUDA backend end to end against the reference backend (the oracle).

Tolerance of logits: the CUDA path stores the KV cache in float16 and feeds the prefill GEMM
float16 activations (2^-11 relative rounding), accumulating in float32; through a few layers
this moves logits by ~1e-3 of their scale, so we require max |cuda - ref| <= 2e-2 * max |ref|
plus argmax agreement wherever the reference's top-2 gap is clear (> 2e-2 * scale).
Greedy sequences must match token for token until the first position where the reference's
top-2 logits are within that tolerance (a near-tie either backend may break differently).
"""
import numpy as np
import pytest
from tests.gpu.logits_check import assert_logits_close, greedy_prefix_agrees

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.runner import ModelRunner
from flashd.protocol.messages import SamplingParams

ARCHS = ["llama", "qwen2", "qwen3"]
FORMATS = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K"]


@pytest.fixture(scope="module")
def cuda_backend(native):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    return CudaBackend()


def make_runners(backend, path, max_ctx=256, chunk=64):
    ref_ops = ReferenceOps()
    lm_ref = load_model(path, ref_ops.load_weight)
    ref = ModelRunner(ref_ops, lm_ref.config, lm_ref.weights, max_ctx, chunk)
    return ref, make_cuda_runner(backend, path, max_ctx, chunk)


def make_cuda_runner(backend, path, max_ctx=256, chunk=64):
    """The CUDA runner for the file at `path` (planned and checked to fit as the daemon does)."""
    from flashd.daemon.models.weights import total_weight_bytes
    from flashd.daemon.models import open_model
    f, cfg = open_model(path)
    plan = backend.plan(cfg, total_weight_bytes(f, cfg), max_ctx, chunk)
    backend.check_fits(plan)
    lm = load_model((f, cfg), backend.ops.load_weight)
    return backend.make_runner(cfg, lm.weights, max_ctx, chunk, plan)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_synthetic_logits_match_reference(cuda_backend, synthetic_model, arch, fmt):
    path = synthetic_model(arch=arch, weight_type=fmt, n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                           ffn=512, vocab_size=1000)
    ref, cuda = make_runners(cuda_backend, path)
    ids = np.random.default_rng(101).integers(0, 1000, 77).tolist()   # 77: a partial GEMM tile, 2 chunks
    assert_logits_close(cuda.score(ids), ref.score(ids))
    # decode path (GEMV + split-K attention), one token at a time
    cuda.reset(), ref.reset()
    got = np.concatenate([cuda.prefill([t], all_logits=True) for t in ids[:20]])
    want = np.concatenate([ref.prefill([t], all_logits=True) for t in ids[:20]])
    assert_logits_close(got, want)


@pytest.mark.parametrize("arch", ARCHS)
def test_graph_decode_equals_eager_and_reference(cuda_backend, synthetic_model, arch):
    path = synthetic_model(arch=arch, weight_type="Q4_K", n_layers=3, hidden=256, n_heads=4, n_kv_heads=1,
                           ffn=512, vocab_size=1000)
    ref, cuda = make_runners(cuda_backend, path)
    prompt = [3, 14, 15, 92, 65]
    graph = [s.token for s in cuda.generate(prompt, SamplingParams(), 40)]
    eager = [s.token for s in cuda.generate(prompt, SamplingParams(), 40, logprobs=1)]   # host path
    assert graph == eager, "graph replay differs from eager execution"
    ok, where = greedy_prefix_agrees(ref, prompt, graph)
    assert ok, f"greedy diverges from the reference at token {where} without a near-tie"


def test_seeded_sampling_on_gpu_is_reproducible(cuda_backend, synthetic_model):
    path = synthetic_model(arch="qwen2", weight_type="Q8_0", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                           ffn=512, vocab_size=1000)
    _, cuda = make_runners(cuda_backend, path)
    p = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=7)
    a = [s.token for s in cuda.generate([1, 2, 3], p, 30)]
    b = [s.token for s in cuda.generate([1, 2, 3], p, 30)]
    assert a == b
    c = [s.token for s in cuda.generate([1, 2, 3], SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=8), 30)]
    assert a != c


def test_stopping_early_leaves_the_runner_clean(cuda_backend, synthetic_model):
    path = synthetic_model(arch="qwen2", weight_type="Q8_0", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                           ffn=512, vocab_size=1000)
    _, cuda = make_runners(cuda_backend, path)
    full = [s.token for s in cuda.generate([9, 8, 7], SamplingParams(), 20)]
    gen = cuda.generate([9, 8, 7], SamplingParams(), 20)
    first = [next(gen).token for _ in range(3)]
    gen.close()
    assert first == full[:3]
    assert [s.token for s in cuda.generate([9, 8, 7], SamplingParams(), 20)] == full


def test_prefix_reuse_is_bit_for_bit_a_fresh_prefill(cuda_backend, synthetic_model):
    """Prompt prefix reuse on the GPU (ModelRunner.start; the CUDA runner's graph path keeps the
    chunks too): greedy tokens, and logprobs on the host path, equal those of a runner that reuses
    nothing, exactly: the kept 64-token chunks hold what a fresh prefill writes there."""
    path = synthetic_model(arch="qwen2", weight_type="Q4_K", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                           ffn=512, vocab_size=1000)
    _, cuda = make_runners(cuda_backend, path)
    _, fresh = make_runners(cuda_backend, path)
    fresh.reuse_prefix = False
    rng = np.random.default_rng(102)
    a = rng.integers(0, 1000, 150).tolist()
    b = a[:140] + rng.integers(0, 1000, 60).tolist()

    def run(runner, prompt, **kw):
        return [(s.token, s.logprob) for s in runner.generate(prompt, SamplingParams(), 12, **kw)]

    run(cuda, a)
    assert run(cuda, b, logprobs=3) == run(fresh, b, logprobs=3)        # host path (start + prefill)
    assert cuda.n_reused == 128 and fresh.n_reused == 0
    assert run(cuda, a) == run(fresh, a)                                  # graph path
    assert cuda.n_reused == 128
    # with host copies (PrefixStore): a side request in between, then a's conversation again
    from flashd.daemon.prefix_cache import PrefixStore
    cuda.prefix_store = PrefixStore(1 << 30, 64)
    side = rng.integers(0, 1000, 70).tolist()
    run(cuda, side)
    turn = a + rng.integers(0, 1000, 30).tolist()
    assert run(cuda, turn, logprobs=3) == run(fresh, turn, logprobs=3)
    assert cuda.n_reused == 128


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_real_model_matches_reference(cuda_backend, real_model, name):
    path = real_model(name)
    ref, cuda = make_runners(cuda_backend, path, max_ctx=512, chunk=128)
    from flashd.clients.tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(path)
    code = tok.encode("import numpy as np\n\ndef softmax(x, axis=-1):\n    \"\"\"Numerically stable softmax.\"\"\"\n"
                      "    z = x - x.max(axis=axis, keepdims=True)\n    e = np.exp(z)\n    return e / e.sum(axis=axis,"
                      " keepdims=True)\n\n\nclass Stack:\n    def __init__(self):\n        self.items = []\n")
    assert_logits_close(cuda.score(code), ref.score(code))
    prompt = tok.encode("def quicksort(arr):\n")
    got = [s.token for s in cuda.generate(prompt, SamplingParams(), 32)]
    ok, where = greedy_prefix_agrees(ref, prompt, got)
    assert ok, f"greedy diverges from the reference at token {where} without a near-tie"
