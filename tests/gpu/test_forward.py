"""The persistent forward (native/cuda/forward.cu, backends/cuda/persistent.py) against its oracles:
the reference backend, the per-op CUDA path, and itself (row invariance).

Tolerances: as test_cuda_model.py (logits_check: max |a - b| <= 2e-2 * max |ref|, argmax equal where
the reference's top-2 gap is clear). The persistent path shares the per-op path's GEMV arithmetic but not
its attention (float32 SIMT here, split f16 hi/lo tensor-core products there), so the two paths agree
to that tolerance, not bit for bit. Row invariance is exact: a tree node's logits equal, bit for bit, a
one-row forward over its path.
"""
import numpy as np
import pytest
from tests.gpu.attention_oracle import tree_mask
from tests.gpu.logits_check import REL_TOL, assert_logits_close, greedy_prefix_agrees

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model, open_model
from flashd.daemon.models.weights import total_weight_bytes
from flashd.daemon.runner import ModelRunner
from flashd.protocol.messages import SamplingParams

ARCHS = ["llama", "qwen2", "qwen3"]
FORMATS = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K"]


@pytest.fixture(scope="module")
def backend(native):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    return CudaBackend()


def cuda_runner(backend, path, forward, max_ctx=256, chunk=64):
    f, cfg = open_model(path)
    plan = backend.plan(cfg, total_weight_bytes(f, cfg), max_ctx, chunk)
    lm = load_model((f, cfg), backend.ops.load_weight)
    backend.forward_path = forward
    try:
        runner = backend.make_runner(cfg, lm.weights, max_ctx, chunk, plan)
    finally:
        backend.forward_path = "graph"
    assert runner.forward_path == forward, runner.forward_note     # the path under test really runs
    return runner


def ref_runner(path, max_ctx=256, chunk=64):
    ops = ReferenceOps()
    lm = load_model(path, ops.load_weight)
    return ModelRunner(ops, lm.config, lm.weights, max_ctx, chunk)


def chain_logits(runner, prompt, chain):
    """Logits of every chain token after the prompt: prefill (per-op), then one verify forward of the chain
    (causal mask: the persistent forward in groups of its max_rows)."""
    runner.reset()
    runner.prefill(prompt)
    n = len(chain)
    mask = np.tril(np.ones((n, n), np.uint8))
    logits = runner.forward_tree(chain, np.arange(runner.n_past, runner.n_past + n), mask)
    return runner.logits_to_host(logits).copy()


def ref_chain_logits(ref, prompt, chain):
    ref.reset()
    ref.prefill(prompt)
    return ref.prefill(chain, all_logits=True)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_forward_matches_reference_and_per_op_path(backend, synthetic_model, arch, fmt):
    path = synthetic_model(arch=arch, weight_type=fmt, n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                           ffn=512, vocab_size=1000)
    rng = np.random.default_rng(101)
    prompt, chain = rng.integers(0, 1000, 37).tolist(), rng.integers(0, 1000, 11).tolist()  # 11: two launches
    pers = cuda_runner(backend, path, "persistent")
    graph = cuda_runner(backend, path, "graph")
    ref = ref_runner(path)
    got = chain_logits(pers, prompt, chain)
    assert_logits_close(got, ref_chain_logits(ref, prompt, chain))
    assert_logits_close(got, chain_logits(graph, prompt, chain))
    tokens = [s.token for s in pers.generate(prompt, SamplingParams(), 24)]   # decode: the captured graph
    ok, where = greedy_prefix_agrees(ref, prompt, tokens)
    assert ok, f"greedy diverges from the reference at token {where} without a near-tie"


def random_tree(rng, n):
    """(parents, ancestor mask, depths) of a random tree (attention_oracle.tree_mask)."""
    mask = tree_mask(rng, n)
    parents = [int(np.flatnonzero(mask[i, :i]).max()) if i else -1 for i in range(n)]
    return parents, mask, mask.sum(1) - 1


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
def test_tree_rows_are_bitwise_one_row_forwards(backend, synthetic_model, n):
    path = synthetic_model(arch="qwen2", weight_type="Q4_K", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                           ffn=512, vocab_size=1000)
    run = cuda_runner(backend, path, "persistent")
    rng = np.random.default_rng(102)
    prompt = rng.integers(0, 1000, 70).tolist()
    parents, mask, depth = random_tree(rng, n)
    tokens = rng.integers(0, 1000, n).tolist()
    run.reset()
    run.prefill(prompt)
    base = run.n_past
    tree = run.logits_to_host(run.forward_tree(tokens, base + depth, mask)).copy()
    for i in range(n):
        chain = []
        j = i
        while j >= 0:
            chain.insert(0, j)
            j = parents[j]
        run.n_past = base
        for j in chain:                              # one-row forwards along the node's path
            row = run.logits_to_host(run.forward_tree([tokens[j]], [run.n_past], np.ones((1, 1), np.uint8)))
            run.commit_tree(np.array([0], np.int32))
        assert np.array_equal(row[0], tree[i]), f"node {i} (depth {depth[i]}) differs from its one-row forward"
    # the decode step (no mask) takes the same path: its greedy token after node n-1's path is that row's argmax
    chain = []
    j = n - 1
    while j >= 0:
        chain.insert(0, tokens[j])
        j = parents[j]
    run.n_past = base
    assert run.greedy_continue(chain, 1)[0] == int(np.argmax(tree[n - 1]))


@pytest.mark.parametrize("arch", ARCHS)
def test_persistent_and_graph_paths_give_the_same_tokens(backend, synthetic_model, arch):
    path = synthetic_model(arch=arch, weight_type="Q4_K", n_layers=3, hidden=256, n_heads=4, n_kv_heads=1,
                           ffn=512, vocab_size=1000)
    ref = ref_runner(path)
    prompt = [3, 14, 15, 92, 65]
    a = [s.token for s in cuda_runner(backend, path, "persistent").generate(prompt, SamplingParams(), 48)]
    b = [s.token for s in cuda_runner(backend, path, "graph").generate(prompt, SamplingParams(), 48)]
    for got in (a, b):
        ok, where = greedy_prefix_agrees(ref, prompt, got)
        assert ok, f"greedy diverges from the reference at token {where} without a near-tie"
    if a != b:                       # only where the reference itself has a near-tie
        k = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        logits = ref.score(prompt + a)[len(prompt) - 1 + k]
        lo, hi = np.sort(logits)[-2:]
        assert hi - lo <= REL_TOL * float(np.abs(logits).max()), f"paths differ at token {k} without a near-tie"


SHAPES = [   # awkward: GQA 7 and 16 (two head tiles), head_dim 64 / 128 != hidden / heads, widths not 256-multiples
    dict(arch="qwen2", weight_type="Q8_0", hidden=448, n_heads=7, n_kv_heads=1, ffn=352),
    dict(arch="llama", weight_type="Q5_0", hidden=256, n_heads=16, n_kv_heads=1, head_dim=64, ffn=608),
    dict(arch="qwen3", weight_type="Q4_0", hidden=160, n_heads=4, n_kv_heads=2, head_dim=128, ffn=288),
    dict(arch="qwen3", weight_type="BF16", hidden=200, n_heads=6, n_kv_heads=3, head_dim=64, ffn=304),
    dict(arch="qwen2", weight_type="Q6_K", hidden=512, n_heads=8, n_kv_heads=8, ffn=768),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s['arch']}-{s['weight_type']}-h{s['hidden']}-{s['n_heads']}x{s['n_kv_heads']}")
def test_awkward_shapes(backend, synthetic_model, shape):
    path = synthetic_model(n_layers=2, vocab_size=777, **shape)
    rng = np.random.default_rng(103)
    prompt, chain = rng.integers(0, 777, 45).tolist(), rng.integers(0, 777, 9).tolist()
    got = chain_logits(cuda_runner(backend, path, "persistent"), prompt, chain)
    assert_logits_close(got, ref_chain_logits(ref_runner(path), prompt, chain))


def test_long_context_combines_splits(backend, synthetic_model):
    """700 keys = 11 chunks of 64: several splits per row, combined by the last one to finish."""
    path = synthetic_model(arch="qwen2", weight_type="Q4_K", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                           ffn=512, vocab_size=1000)
    rng = np.random.default_rng(104)
    prompt, chain = rng.integers(0, 1000, 700).tolist(), rng.integers(0, 1000, 6).tolist()
    run = cuda_runner(backend, path, "persistent", max_ctx=4096, chunk=128)
    assert run.persistent.info()["n_splits"] > 1
    got = chain_logits(run, prompt, chain)
    assert_logits_close(got, ref_chain_logits(ref_runner(path, max_ctx=4096, chunk=128), prompt, chain))


def test_plan_reports_its_schedule(backend, synthetic_model, native):
    path = synthetic_model(arch="qwen2", weight_type="Q4_K", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                           ffn=512, vocab_size=1000)
    info = cuda_runner(backend, path, "persistent").persistent.info()
    n_sms = backend.device.info()["n_sms"]
    assert info["n_ctas"] == n_sms and info["n_stages"] == 5 * 2 + 1
    assert 1 <= info["max_rows"] <= 8 and info["ring_bytes"] >= info["max_step_bytes"] > 0
    assert info["smem_bytes"] > info["n_warps"] * info["ring_bytes"] and 8 <= info["n_warps"] <= 16


def test_seeded_sampling_through_the_persistent_forward(backend, synthetic_model):
    path = synthetic_model(arch="qwen2", weight_type="Q8_0", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                           ffn=512, vocab_size=1000)
    run = cuda_runner(backend, path, "persistent")
    p = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=7)
    a = [s.token for s in run.generate([1, 2, 3], p, 30)]
    assert a == [s.token for s in run.generate([1, 2, 3], p, 30)]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_real_model_forward(backend, real_model, name):
    path = real_model(name)
    from flashd.clients.tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(path)
    prompt = tok.encode("import numpy as np\n\ndef softmax(x, axis=-1):\n    \"\"\"Numerically stable softmax.\"\"\"\n")
    chain = tok.encode("    z = x - x.max(axis=axis, keepdims=True)\n    e = np.exp(z)\n")
    pers = cuda_runner(backend, path, "persistent", max_ctx=512, chunk=128)
    ref = ref_runner(path, max_ctx=512, chunk=128)
    assert_logits_close(chain_logits(pers, prompt, chain), ref_chain_logits(ref, prompt, chain))
    start = tok.encode("def quicksort(arr):\n")
    got = [s.token for s in pers.generate(start, SamplingParams(), 48)]
    ok, where = greedy_prefix_agrees(ref, start, got)
    assert ok, f"greedy diverges from the reference at token {where} without a near-tie"
