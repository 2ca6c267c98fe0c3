"""The qwen35 MTP block (models/qwen35_mtp.py) and the mtp drafter (speculative/mtp_drafter.py) on the CUDA backend.

- The block's logits on the GPU against the reference backend's, fed the same target rows: the replay over a
  prompt (more than 8 rows: the GEMM path, float16 weights and activations) and one-row chain steps (GEMV), with
  logits_check.py's tolerance (max |cuda - ref| <= 2e-2 * max |ref|, argmax equal where the top-2 gap is clear:
  the float16 rounding of the GEMM path and the K/V cache, as every CUDA model test), on shapes with head_dim
  64 and 256 (the real Qwen3.5's), F32 and Q8_0 weights, the block's own head (mtp_own_head) or the target's.
- Speculative decoding with the mtp drafter (chain, ddtree, auto) gives exactly the CUDA runner's plain greedy
  tokens; an oracle subclass (true chain tokens, the block still run) gets whole chains accepted.
"""
import dataclasses

import numpy as np
import pytest
from tests.gpu.logits_check import assert_logits_close
from tests.speculative.spec_drafters import plain, spec

from flashd.daemon.backends.base import Batch
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model, open_model
from flashd.daemon.models.qwen35_mtp import mtp_cache_spec, mtp_forward
from flashd.daemon.models.qwen35_mtp_weights import load_mtp_weights, mtp_config
from flashd.daemon.models.weights import total_weight_bytes
from flashd.daemon.speculative.mtp_drafter import MTPDrafter, load_mtp_drafter

VOCAB = 1000
SHAPES = {
    "hd64": dict(n_layers=4, hidden=256, n_heads=4, n_kv_heads=1, head_dim=64, rope_dim=16, ffn=512, ssm_state=32,
                 ssm_k_heads=1, ssm_v_heads=4, ssm_conv_kernel=4, full_attn_interval=2),
    "hd256": dict(n_layers=4, hidden=256, n_heads=4, n_kv_heads=1, head_dim=256, rope_dim=64, ffn=512, ssm_state=64,
                  ssm_k_heads=2, ssm_v_heads=4, ssm_conv_kernel=4, full_attn_interval=4),
}
CASES = [("hd64", "F32", False), ("hd64", "Q8_0", True), ("hd256", "Q8_0", False)]
MAX_CTX, CHUNK = 256, 64


@pytest.fixture(scope="module")
def cuda_backend(native):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    return CudaBackend()


def mtp_model(synthetic_model, shape, fmt="Q8_0", own_head=False):
    return synthetic_model(arch="qwen35", weight_type=fmt, vocab_size=VOCAB, mtp=True, mtp_own_head=own_head,
                           **SHAPES[shape])


def cuda_target(backend, path):
    """(file, LoadedModel, runner) on the CUDA backend."""
    f, cfg = open_model(path)
    plan = backend.plan(cfg, total_weight_bytes(f, cfg), MAX_CTX, CHUNK)
    backend.check_fits(plan)
    lm = load_model((f, cfg), backend.ops.load_weight)
    return f, lm, backend.make_runner(cfg, lm.weights, MAX_CTX, CHUNK, plan)


def run_block(ops, cfg, w, ids, h, chain):
    """The replay of (ids, h) from slot 0, then one-row steps over `chain` fed the block's own rows: the logits of
    the replay's rows and of every step, on the host."""
    cache = ops.kv_cache(mtp_cache_spec(cfg, MAX_CTX))
    up = ops.from_numpy
    n = len(ids)
    ops.begin_forward()
    logits, g = mtp_forward(ops, cfg, w, cache, Batch(up(np.array(ids, np.int32)), up(np.arange(n, dtype=np.int32)),
                                                      up(np.zeros(1, np.int32))), up(h), all_logits=True)
    out = [np.array(ops.to_numpy(logits))]
    gg = np.array(ops.to_numpy(g))[-1:]
    for k, tok in enumerate(chain):
        ops.begin_forward()
        logits, g = mtp_forward(ops, cfg, w, cache, Batch(up(np.array([tok], np.int32)),
                                                          up(np.array([n + k], np.int32)),
                                                          up(np.array([n + k], np.int32))), up(gg))
        gg = np.array(ops.to_numpy(g))
        out.append(np.array(ops.to_numpy(logits)))
    return out


@pytest.mark.parametrize("shape, fmt, own_head", CASES)
def test_block_logits_match_the_reference(cuda_backend, synthetic_model, shape, fmt, own_head):
    path = mtp_model(synthetic_model, shape, fmt, own_head)
    f, lm, _ = cuda_target(cuda_backend, path)
    cfg = lm.config
    ref_ops = ReferenceOps()
    ref_lm = load_model((f, cfg), ref_ops.load_weight)
    mcfg = mtp_config(f, cfg)
    w = load_mtp_weights(f, cfg, mcfg, cuda_backend.ops.load_weight, lm.weights)
    rw = load_mtp_weights(f, cfg, mcfg, ref_ops.load_weight, ref_lm.weights)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, 40).tolist()
    h = rng.standard_normal((40, cfg.hidden)).astype(np.float32)
    chain = [3, 500, 999]
    got = run_block(cuda_backend.ops, cfg, w, ids, h, chain)
    want = run_block(ref_ops, cfg, rw, ids, h, chain)
    for g, r in zip(got, want):
        assert_logits_close(g, r)


class OracleMTP(MTPDrafter):
    truth: list = []

    def _chain_token(self, logits, depth):
        return self.truth[self._n + 1 + depth]


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("mode, budget", [("chain", 3), ("ddtree", 8), ("auto", 4)])
def test_speculative_decoding_with_the_mtp_drafter_equals_plain_greedy(cuda_backend, synthetic_model, shape, mode,
                                                                         budget):
    f, lm, cuda = cuda_target(cuda_backend, mtp_model(synthetic_model, shape))
    drafter = load_mtp_drafter(cuda_backend.ops, f, lm, MAX_CTX, CHUNK)
    prompts = [[5, 9, 77, 12, 5, 9, 77, 12, 100, 200], np.random.default_rng(6).integers(0, VOCAB, 70).tolist()]
    for prompt in prompts:
        want = [s.token for s in plain(cuda, prompt, 32)]
        got, stats = spec(cuda, drafter, mode, budget, prompt, 32)
        assert [s.token for s in got] == want, (prompt, stats)
        assert stats.accepted + stats.steps + 1 == len(want)
    assert drafter.forwards > 0


@pytest.mark.parametrize("shape", list(SHAPES))
def test_whole_mtp_chains_accepted_on_the_gpu(cuda_backend, synthetic_model, shape):
    f, lm, cuda = cuda_target(cuda_backend, mtp_model(synthetic_model, shape))
    drafter = load_mtp_drafter(cuda_backend.ops, f, lm, MAX_CTX, CHUNK)
    drafter.__class__ = OracleMTP
    prompt = np.random.default_rng(7).integers(0, VOCAB, 70).tolist()
    want = [s.token for s in plain(cuda, prompt, 32)]
    drafter.truth = prompt + want
    got, stats = spec(cuda, drafter, "chain", 4, prompt, 32)
    assert [s.token for s in got] == want
    assert stats.histogram[4] >= 4, stats.histogram
    assert drafter.replayed > len(prompt) + stats.accepted      # the prompt and every committed position replayed


def test_a_parked_target_keeps_no_mtp_weights(cuda_backend, synthetic_model):
    """close() drops the block's weights, the target borrows and its cache (drafter_set.park calls it)."""
    f, lm, _ = cuda_target(cuda_backend, mtp_model(synthetic_model, "hd64"))
    drafter = load_mtp_drafter(cuda_backend.ops, f, lm, MAX_CTX, CHUNK)
    drafter.close()
    assert drafter.weights is None and drafter.cache is None and drafter.target_weights is None
    assert dataclasses.is_dataclass(lm.weights)
