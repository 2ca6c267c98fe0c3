"""The verify forward with device-resident feature capture (CudaRunner.forward_tree(capture=layers): a CUDA
graph per (n, layers) whose device copies fill runner.tree_features) against the eager forward with a host
hidden sink, the path it replaces for the DFlash drafter.

Bitwise, not within a tolerance: both run the same kernels on the same arena addresses (the graph is the
eager body captured), and the capture is a copy, so logits and features must agree bit for bit -- on the
per-op graph path and on the persistent forward (one launch, or groups of max_rows rows for larger trees).
Then the DFlash drafter fed through capture_device + Ops.gather_rows (fd_embed over a float32 table, a bit
copy) drafts exactly what the host path drafts, and the output equals plain greedy decoding.
"""
import numpy as np
import pytest
from tests.gpu.test_forward import cuda_runner, random_tree

from flashd.protocol.messages import SamplingParams
from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash

TARGET = dict(arch="qwen3", n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab_size=1000, seed=11,
              weight_type="Q4_K", name="tree-capture-target")
LAYERS = (3, 0, 2)          # named out of order: tree_features follows the naming


@pytest.fixture(scope="module")
def backend(native):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    return CudaBackend()


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("forward", ["graph", "persistent"])
@pytest.mark.parametrize("n", [1, 5, 8, 13, 23])
def test_graph_capture_equals_the_eager_sink_bitwise(backend, synthetic_model, forward, n):
    run = cuda_runner(backend, synthetic_model(**TARGET), forward, max_ctx=512, chunk=64)
    rng = np.random.default_rng(201)
    run.reset()
    run.prefill(rng.integers(0, 1000, 70).tolist())
    base = run.n_past
    _, mask, depth = random_tree(rng, n)
    tokens = rng.integers(0, 1000, n).tolist()
    seen: dict[int, list[np.ndarray]] = {}

    def sink(layer, h):                 # the decoder's host sink (the persistent forward: groups of rows)
        if layer in LAYERS:
            seen.setdefault(layer, []).append(run.ops.to_numpy(h).copy())
    sink.layers = frozenset(LAYERS)
    eager = run.logits_to_host(run.forward_tree(tokens, base + depth, mask, hidden_sink=sink)).copy()
    want = {layer: np.concatenate(rows) for layer, rows in seen.items()}
    assert all(w.shape == (n, TARGET["hidden"]) for w in want.values())
    for replay in range(2):             # the first call captures the graph; both launch it
        got = run.logits_to_host(run.forward_tree(tokens, base + depth, mask, capture=LAYERS)).copy()
        assert any(key[:2] == (n, LAYERS) for key in run.tree_graphs)
        assert np.array_equal(bits(got), bits(eager)), f"replay {replay}: logits differ from the eager forward"
        bufs = run.tree_features(LAYERS)
        for j, layer in enumerate(LAYERS):
            rows = run.dev.download(bufs[j])[:n]
            assert np.array_equal(bits(rows), bits(want[layer])), f"replay {replay}: layer {layer} features differ"
    plain = run.logits_to_host(run.forward_tree(tokens, base + depth, mask)).copy()   # the graph without capture
    assert np.array_equal(bits(plain), bits(eager))
    assert run.n_past == base


def test_gather_rows_is_a_bit_copy(backend, rng):
    ops, dev = backend.ops, backend.ops.dev
    table = rng.standard_normal((40, 1536)).astype(np.float32)
    table[3, :4] = [-0.0, np.inf, -np.inf, np.float32(1e-40)]          # signed zero, infinities, a subnormal
    table[5, :2] = np.frombuffer(np.array([0x7fc01234, 0xffa00001], np.uint32).tobytes(), np.float32)   # NaNs
    ids = np.array([5, 0, 39, 3, 3, 17], np.int32)
    out = dev.empty((8, 1536), np.float32)
    dev.fill_bytes(out, 0xFF)
    ops.gather_rows(dev.upload(table), dev.upload(ids), out[1:7])        # into rows 1..6 of a larger buffer
    got = dev.download(out)
    assert np.array_equal(bits(got[1:7]), bits(table[ids]))
    assert (bits(got[[0, 7]]) == 0xFFFFFFFF).all()                     # nothing written outside the rows
    with pytest.raises(ValueError, match="gather_rows"):
        ops.gather_rows(dev.upload(table), dev.upload(ids), out[:5])


@pytest.mark.parametrize("forward", ["graph", "persistent"])
@pytest.mark.parametrize("mode,budget", [("chain", 15), ("ddtree", 22)])
def test_dflash_device_features_draft_as_the_host_path(backend, synthetic_model, tmp_path, forward, mode, budget):
    from flashd.daemon.speculative.decoder import SpecConfig, SpecDecoder
    from flashd.daemon.speculative.dflash_drafter import load_dflash_drafter

    run = cuda_runner(backend, synthetic_model(**TARGET), forward, max_ctx=512, chunk=64)
    spec = spec_for_target(256, 4, 1000, n_features=3, n_layers=2, head_dim=64, ffn=512, block_size=16, seed=3)
    drafter = load_dflash_drafter(write_synthetic_dflash(tmp_path / "dflash.gguf", spec), backend.ops, run.cfg,
                                  run.weights, 512, inject_chunk=64)
    run.drop_graphs()                   # the drafter may have grown the shared arena (engine.py does this)
    propose = drafter.propose
    proposals: list = []
    drafter.propose = lambda *a: proposals.append(propose(*a)) or proposals[-1]
    prompt = np.random.default_rng(202).integers(0, 1000, 100).tolist()
    want = [s.token for s in run.generate(prompt, SamplingParams(), 48)]
    runs = {}
    for device in (False, True):
        drafter.device_features = device
        proposals.clear()
        # the host's tree build in both runs: the proposals come back to be compared (the device-built tree's own
        # test: test_dflash_gpu.py)
        dec = SpecDecoder(run, drafter, SpecConfig(mode, budget, device_tree=False))
        got = [s.token for s in dec.generate(prompt, SamplingParams(), 48)]
        assert got == want, f"{forward} {mode}: device_features={device} differs from plain greedy"
        runs[device] = list(proposals), dec.stats.histogram
    (p0, h0), (p1, h1) = runs[False], runs[True]
    assert h1 == h0 and len(p1) == len(p0)
    for a, b in zip(p0, p1):
        assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.logprobs, b.logprobs)
