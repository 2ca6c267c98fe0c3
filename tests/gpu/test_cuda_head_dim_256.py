"""Dense models of head_dim 256 (the attention shape of the Qwen3.5 files; qwen35 hybrids themselves:
test_cuda_qwen35.py) on the CUDA backend end to end: every attention path a dense forward takes -- prefill
(fd_attention_prefill's head_dim 256 shapes), the fused decode rope step and split-K decode, tree verification
(fd_attention_masked), the persistent forward's attention items -- against the reference backend, with
test_cuda_model.py's tolerances (logits_check.py), and speculative decoding equal to plain greedy token for token.

Shapes: G = 4 and G = 6 (a row tile of 16 query rows partly used), partial rotary dims, prompts crossing the
64-slot chunk and the 32-key prefill tiles."""
import numpy as np
import pytest
from tests.gpu.logits_check import assert_logits_close, greedy_prefix_agrees
from tests.gpu.test_cuda_model import make_runners
from tests.gpu.test_forward import cuda_runner, ref_runner
from tests.speculative.spec_drafters import OracleDrafter, plain, spec

from flashd.daemon.speculative.ngram import NgramConfig, NgramDrafter
from flashd.protocol.messages import SamplingParams

VOCAB = 1000
SHAPES = {
    "qwen3_g4": dict(arch="qwen3", n_layers=3, hidden=256, n_heads=4, n_kv_heads=1, head_dim=256, ffn=512),
    "qwen2_g6": dict(arch="qwen2", n_layers=2, hidden=512, n_heads=12, n_kv_heads=2, head_dim=256, ffn=512),
    "llama_g4_partial_rope": dict(arch="llama", n_layers=2, hidden=256, n_heads=8, n_kv_heads=2, head_dim=256,
                                  rope_dim=64, ffn=512),
}


@pytest.fixture(scope="module")
def cuda_backend(native):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    return CudaBackend()


def model(synthetic_model, shape: str, fmt: str = "Q8_0"):
    return synthetic_model(weight_type=fmt, vocab_size=VOCAB, **SHAPES[shape])


def ids_of(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, n).tolist()


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_K", "F16"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_prefill_and_decode_logits_match_reference(cuda_backend, synthetic_model, shape, fmt):
    ref, cuda = make_runners(cuda_backend, model(synthetic_model, shape, fmt))
    ids = ids_of(150)                        # 150: two 64-token chunks and a part, over 32-key tiles
    assert_logits_close(cuda.score(ids), ref.score(ids))
    cuda.reset(), ref.reset()
    got = np.concatenate([cuda.prefill([t], all_logits=True) for t in ids[:70]])    # decode steps past a chunk
    want = np.concatenate([ref.prefill([t], all_logits=True) for t in ids[:70]])
    assert_logits_close(got, want)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_graph_decode_equals_eager_and_reference(cuda_backend, synthetic_model, shape):
    ref, cuda = make_runners(cuda_backend, model(synthetic_model, shape))
    prompt = ids_of(13, seed=3)
    graph = [s.token for s in cuda.generate(prompt, SamplingParams(), 40)]
    eager = [s.token for s in cuda.generate(prompt, SamplingParams(), 40, logprobs=1)]
    assert graph == eager, "graph replay differs from eager execution"
    ok, where = greedy_prefix_agrees(ref, prompt, graph)
    assert ok, f"greedy diverges from the reference at token {where} without a near-tie"


@pytest.mark.parametrize("shape", list(SHAPES))
def test_persistent_forward_matches_reference(cuda_backend, synthetic_model, shape):
    """The persistent forward's attention items at head_dim 256 (forward_attention.cuh)."""
    path = model(synthetic_model, shape)
    ref = ref_runner(path)
    prompt = ids_of(9, seed=4)
    got = [s.token for s in cuda_runner(cuda_backend, path, "persistent").generate(prompt, SamplingParams(), 32)]
    ok, where = greedy_prefix_agrees(ref, prompt, got)
    assert ok, f"persistent greedy diverges from the reference at token {where} without a near-tie"


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("mode, budget", [("chain", 4), ("ddtree", 8), ("ddtree", 30)])
def test_speculative_decoding_equals_plain_greedy(cuda_backend, synthetic_model, shape, mode, budget):
    """Tree verification (masked attention split as decode's) reproduces plain greedy decoding exactly."""
    _, cuda = make_runners(cuda_backend, model(synthetic_model, shape))
    accepted = 0
    for i, prompt in enumerate([[5, 9, 77, 12, 5, 9, 77, 12, 100, 200], ids_of(70, seed=6)]):
        want = [s.token for s in plain(cuda, prompt, 32)]
        for drafter in (NgramDrafter(NgramConfig(min_ngram=1)), OracleDrafter(want, VOCAB, seed=i)):
            got, stats = spec(cuda, drafter, mode, budget, prompt, 32)
            assert [s.token for s in got] == want, (prompt, type(drafter).__name__, stats)
            accepted += stats.accepted if isinstance(drafter, OracleDrafter) else 0
    assert accepted > 0, "the oracle never got a token accepted"
