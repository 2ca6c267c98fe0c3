"""Whole-model behaviour of the reference backend on synthetic models of every architecture and
weight format: KV-cache consistency, chunking invariance, tree masks, load errors."""
import numpy as np
import pytest

from flashd.daemon.backends.base import Batch, KVCacheSpec
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import ModelLoadError, load_model, open_model
from flashd.daemon.models.dense import forward
from flashd.daemon.runner import ModelRunner
from flashd.protocol.messages import SamplingParams
from flashd.scripts.gguf_out import new_gguf

ops = ReferenceOps()
ARCHS = ["llama", "qwen2", "qwen3"]
FORMATS = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K"]


def runner_for(path, max_ctx=64, chunk=512):
    lm = load_model(path, ops.load_weight)
    return ModelRunner(ops, lm.config, lm.weights, max_ctx, chunk)


def tiny(synthetic_model, arch, fmt="Q8_0", **kw):
    # hidden 256 so that K-quant rows (256-element blocks) fit; 2 layers keeps it fast
    kw = {"n_layers": 2, "hidden": 256, "n_heads": 4, "n_kv_heads": 2, "ffn": 256, "vocab_size": 300, **kw}
    return synthetic_model(arch=arch, weight_type=fmt, **kw)


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decode_equals_full_forward(synthetic_model, arch):
    """Logits of token t computed with the KV cache (one token at a time) equal the logits of a
    single forward over the whole sequence: the cache stores exactly what attention needs."""
    r = runner_for(tiny(synthetic_model, arch))
    ids = np.random.default_rng(201).integers(0, 300, 12).tolist()
    full = r.score(ids)
    r.reset()
    step = np.concatenate([r.prefill([t], all_logits=True) for t in ids])
    # float32 matmuls of 1 row vs 12 rows sum in different orders: ~1e-6 relative on O(1) logits
    np.testing.assert_allclose(step, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_chunking_does_not_change_logits(synthetic_model, arch):
    path = tiny(synthetic_model, arch)
    ids = np.random.default_rng(202).integers(0, 300, 23).tolist()
    whole = runner_for(path).score(ids)
    chunked = runner_for(path, chunk=5).score(ids)
    np.testing.assert_allclose(chunked, whole, rtol=1e-4, atol=1e-4)   # same reason as above


def test_explicit_causal_mask_equals_implicit(synthetic_model):
    path = tiny(synthetic_model, "qwen2")
    lm = load_model(path, ops.load_weight)
    ids = np.array([5, 17, 200, 3, 99], np.int32)
    outs = []
    for mask in (None, np.tril(np.ones((5, 5), bool))):
        cache = ops.kv_cache(KVCacheSpec(lm.config.n_layers, 16, lm.config.n_kv_heads, lm.config.head_dim))
        batch = Batch(ids=ids, positions=np.arange(5, dtype=np.int32), n_past=np.array([0], np.int32), mask=mask)
        outs.append(forward(ops, lm.config, lm.weights, cache, batch, all_logits=True))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_weight_format_runs(synthetic_model, fmt):
    r = runner_for(tiny(synthetic_model, "qwen2", fmt))
    toks = [s.token for s in r.generate([1, 2, 3], SamplingParams(), 4)]
    assert len(toks) == 4 and all(0 <= t < 300 for t in toks)
    logits = r.score([1, 2, 3, 4])
    assert np.isfinite(logits).all()


def test_greedy_generation_matches_argmax_of_teacher_forcing(synthetic_model):
    """The generated sequence is, at every step, the argmax of the full-sequence logits."""
    r = runner_for(tiny(synthetic_model, "llama"))
    prompt = [7, 8, 9]
    out = [s.token for s in r.generate(prompt, SamplingParams(), 8)]
    logits = r.score(prompt + out)
    assert logits[len(prompt) - 1:-1].argmax(-1).tolist() == out


def test_seeded_sampling_is_reproducible(synthetic_model):
    r = runner_for(tiny(synthetic_model, "qwen3"))
    p = SamplingParams(temperature=1.5, top_k=50, top_p=0.95, seed=42)
    a = [s.token for s in r.generate([1, 2], p, 10)]
    assert a == [s.token for s in r.generate([1, 2], p, 10)]


def test_unsupported_format_is_a_load_error_naming_it(synthetic_model):
    path = tiny(synthetic_model, "qwen2", "Q5_1")
    with pytest.raises(ModelLoadError, match="Q5_1"):
        open_model(path)


def test_unsupported_architecture_is_a_load_error_naming_it(tmp_path):
    path = tmp_path / "gemma.gguf"
    with new_gguf(path, "gemma") as w:
        w.add_block_count(1)
        w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    with pytest.raises(ModelLoadError, match="gemma"):
        open_model(path)


def test_garbage_file_is_a_load_error(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ModelLoadError, match="not a readable GGUF"):
        open_model(path)
    with pytest.raises(ModelLoadError, match="no such"):
        open_model(tmp_path / "missing.gguf")
