"""The DFlash drafter's forwards as replayed CUDA graphs (speculative/replay.py, backends/cuda/graphs.py) against
the same drafter run eagerly: two drafters on one CUDA backend, fed the same prompt features, the same verify
features (device buffers, as the runner hands them over) and the same accept / skip sequence -- commits of 1 to 16
rows, a gap -- must propose bitwise the same ids and log-probs at every step. A replay launches the kernels the
eager forward launches, on the same inputs, so nothing looser than equality is acceptable. The cache's
bookkeeping (captures, keys, dropped graphs) is checked on the CPU: tests/cuda_on_host/test_graph_cache_on_host.py."""
import numpy as np
import pytest

from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash
from tests.gpu.test_dflash_gpu import TARGET



def test_replayed_drafts_equal_eager_drafts(native, synthetic_model, tmp_path):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    from flashd.daemon.backends.cuda.graphs import GraphCache
    from flashd.daemon.models import load_model, open_model
    from flashd.daemon.models.weights import total_weight_bytes
    from flashd.daemon.speculative.dflash_drafter import load_dflash_drafter
    from flashd.daemon.speculative.replay import EagerReplay

    backend = CudaBackend()
    ops = backend.ops
    target_path = synthetic_model(**TARGET)
    f, cfg = open_model(target_path)
    max_ctx, chunk = 512, 64
    plan = backend.plan(cfg, total_weight_bytes(f, cfg), max_ctx, chunk)
    lm = load_model((f, cfg), ops.load_weight)
    backend.make_runner(cfg, lm.weights, max_ctx, chunk, plan)       # reserves the arena and workspaces
    spec = spec_for_target(256, 4, 1000, n_features=3, n_layers=2, head_dim=64, ffn=512, block_size=16, seed=7)
    path = write_synthetic_dflash(tmp_path / "dflash.gguf", spec)
    graphed = load_dflash_drafter(path, ops, cfg, lm.weights, max_ctx, inject_chunk=chunk)
    eager = load_dflash_drafter(path, ops, cfg, lm.weights, max_ctx, inject_chunk=chunk)
    eager._replay = EagerReplay()
    assert isinstance(graphed._replay, GraphCache)
    layers = graphed.target_layer_ids
    hidden = graphed.cfg.model.hidden

    rng = np.random.default_rng(301)
    prompt = rng.integers(0, 1000, 37).tolist()
    prompt_f = {l: rng.standard_normal((37, hidden)).astype(np.float32) for l in layers}
    for d in (graphed, eager):
        for l in sorted(layers):                            # as a prefill's hidden sink hands them over
            d.capture_hidden(l, ops.dev.upload(prompt_f[l]))
        d.begin(prompt, 5)

    commits = [1, 3, 16, 2, 1, 7, 16, 5, 1, 1]           # rows a verify commits (root + accepted)
    for step, m in enumerate(commits):
        props = [d.propose(15, 4) for d in (graphed, eager)]
        np.testing.assert_array_equal(props[0].tokens, props[1].tokens, err_msg=f"step {step}")
        np.testing.assert_array_equal(props[0].logprobs, props[1].logprobs, err_msg=f"step {step}")
        feats = [ops.dev.upload(rng.standard_normal((16, hidden)).astype(np.float32)) for _ in layers]
        rows = np.sort(rng.choice(16, m, replace=False)).tolist()
        accepted = rng.integers(0, 1000, m - 1).tolist()
        bonus = int(rng.integers(0, 1000))
        for d in (graphed, eager):
            d.capture_device(feats, 16)
            d.accept(accepted, bonus, rows)
        if step == 4:                                       # a plain burst: a gap in the drafter's context
            gap = rng.integers(0, 1000, 3).tolist()
            for d in (graphed, eager):
                d.skip(gap)
    final = [d.propose(15, 4) for d in (graphed, eager)]
    np.testing.assert_array_equal(final[0].tokens, final[1].tokens)
    np.testing.assert_array_equal(final[0].logprobs, final[1].logprobs)
    assert graphed.injected_rows == eager.injected_rows
    cache = graphed._replay
    # the block once, one injection graph per commit size seen (1, 2, 3, 5, 7, 16); every later use a replay
    assert cache.captures == 1 + len(set(commits)) and cache.replays == 2 * len(commits) + 1
    for d in (graphed, eager):
        d.close()
    assert len(cache) == 0
