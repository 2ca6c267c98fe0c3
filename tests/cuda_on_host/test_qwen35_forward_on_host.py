"""A whole qwen35 forward through CudaOps without a GPU: models/qwen35.py on the host stand-in library of
test_hybrid_ops_on_host.py (every projection, norm, split, silu / swiglu, conv and delta-rule call goes through the
C ABI's Python side, the recurrent state is a CudaRecurrentState), except RoPE and attention, which this test's
ops subclass computes by the reference on host copies (their kernels are GPU-tested: tests/gpu/test_attention_*,
test_rope.py). Against the reference backend, driven by ModelRunner on both: scoring over prefill chunks, decode
steps after a prefill, and prefix reuse, whose state copy is saved from and loaded back into the device state,
giving tokens and logprobs equal to a runner that reuses nothing; a draft tree's verify and commit. What is left
for the GPU run: the kernels themselves and CudaHybridRunner (tests/gpu/test_cuda_qwen35.py)."""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.base import Batch
from flashd.daemon.backends.cuda.ops import CudaOps
from flashd.daemon.backends.cuda.tensor import Device
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.runner import ModelRunner
from flashd.protocol.messages import SamplingParams
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec
from tests.cuda_on_host.test_hybrid_ops_on_host import HybridLib, HybridNative, _rms

REF = ReferenceOps()
SPEC = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, rope_dim=16,
                     ffn=128, vocab_size=300, weight_type="F32", ssm_state=16, ssm_k_heads=1, ssm_v_heads=2,
                     full_attn_interval=2, seed=5)
REL_TOL = 5e-3      # the GEMM path (more than 8 rows) rounds weights to float16; the reference does not


class ModelLib(HybridLib):
    def fd_add(self, y, a, b, n, stream):
        self._a(y, (n,))[...] = self._a(a, (n,)) + self._a(b, (n,))
        return 0

    def fd_gemv_swiglu(self, y, wg, qg, wu, qu, rows, cols, x, n_x, norm_w, eps, stream):
        xs = self._a(x, (n_x, cols))
        if not self._null(norm_w):
            xs = _rms(xs, self._a(norm_w, (cols,)), eps)
        g, u = xs @ self._a(wg, (rows, cols)).T, xs @ self._a(wu, (rows, cols)).T
        self._a(y, (n_x, rows))[...] = g / (1 + np.exp(-g)) * u
        return 0

    def fd_gemm_swiglu_f16(self, y, x, wg, wu, m, n, k, stream):
        xs = self._a(x, (m, k))
        g = xs @ self._a(wg, (n, k), np.float16).astype(np.float32).T
        u = xs @ self._a(wu, (n, k), np.float16).astype(np.float32).T
        self._a(y, (m, n))[...] = g / (1 + np.exp(-g)) * u
        return 0


class ModelNative(HybridNative):
    def __init__(self):
        super().__init__()
        self.lib = ModelLib(self.ffi)


class HostAttentionOps(CudaOps):
    """CudaOps with RoPE and attention by the reference on host copies, over a reference KV cache."""

    def kv_cache(self, spec):
        return REF.kv_cache(spec)

    def rope(self, x, positions, theta, rope_dim, neox, scaling=None):
        return ("roped", self.materialize(x), positions, theta, rope_dim, neox, scaling)

    def _roped(self, r):
        return REF.rope(self.to_numpy(r[1]), self.to_numpy(r[2]), *r[3:])

    def attention(self, q, k, v, cache_layer, batch):
        host = Batch(ids=self.to_numpy(batch.ids), positions=self.to_numpy(batch.positions),
                     n_past=self.to_numpy(batch.n_past), n_tokens=batch.n_tokens,
                     mask=None if batch.mask is None else self.to_numpy(batch.mask).astype(bool))
        out = np.ascontiguousarray(REF.attention(self._roped(q), self._roped(k), self.to_numpy(v), cache_layer, host),
                                   np.float32)
        return self.dev.upload(out, out=self.take(out.shape))

    def kv_compact(self, cache, n_past, src_offsets):
        REF.kv_compact(cache, n_past, src_offsets)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_synthetic_model(tmp_path_factory.mktemp("q35host") / "m.gguf", SPEC)


def runners(path, n=1, max_ctx=128, chunk=16):
    ops = HostAttentionOps(Device(ModelNative()))
    ops.reserve_arena(8 << 20)
    ops.reserve_scratch(2 * SPEC.hidden * max(SPEC.ffn, 2 * SPEC.n_heads * 32, SPEC.vocab_size))
    lm = load_model(path, ops.load_weight)
    ref_lm = load_model(path, REF.load_weight)
    return (ModelRunner(REF, ref_lm.config, ref_lm.weights, max_ctx, chunk),
            *[ModelRunner(ops, lm.config, lm.weights, max_ctx, chunk) for _ in range(n)])


def close(got, want):
    scale = float(np.abs(want).max())
    assert float(np.abs(got - want).max()) <= REL_TOL * scale


def test_scoring_over_prefill_chunks_matches_the_reference(path):
    ref, host = runners(path)
    ids = np.random.default_rng(0).integers(0, SPEC.vocab_size, 37).tolist()    # chunks of 16, 16, 5
    close(host.score(ids), ref.score(ids))


def test_decode_steps_after_a_prefill_match_the_reference(path):
    ref, host = runners(path)
    ids = np.random.default_rng(1).integers(0, SPEC.vocab_size, 26).tolist()
    close(host.prefill(ids[:20]), ref.prefill(ids[:20]))
    for t in ids[20:]:
        close(host.prefill([t]), ref.prefill([t]))


def test_prefix_reuse_reloads_the_device_state_bit_for_bit(path):
    _, host, fresh = runners(path, n=2)
    fresh.reuse_prefix = False
    rng = np.random.default_rng(2)
    a = rng.integers(0, SPEC.vocab_size, 40).tolist()
    b = a[:36] + rng.integers(0, SPEC.vocab_size, 10).tolist()

    def run(runner, prompt):
        return [(s.token, s.logprob) for s in runner.generate(prompt, SamplingParams(), 6, logprobs=2)]

    run(host, a)
    assert run(host, b) == run(fresh, b)
    assert host.n_reused == 32 and fresh.n_reused == 0


def test_a_draft_tree_verify_and_commit_match_the_reference(path):
    """A tree's verify (a state per node on the device: the tree kernels, node buffers, parents uploaded), the
    commit of one root-to-node path (keep_node copies its last node's state in) and decode after it."""
    ref, host = runners(path)
    prompt = np.random.default_rng(3).integers(0, SPEC.vocab_size, 20).tolist()
    close(host.prefill(prompt), ref.prefill(prompt))
    ids, parents = [7, 8, 9, 10, 11, 12], [-1, 0, 0, 1, 3, 2]       # root 0; path 0 -> 1 -> 3 -> 4
    mask = np.eye(6, dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
    depth = mask.sum(1) - 1
    positions = (len(prompt) + depth).astype(np.int32)
    close(host.logits_to_host(host.forward_tree(ids, positions, mask)),
          ref.logits_to_host(ref.forward_tree(ids, positions, mask)))
    host.commit_tree([0, 1, 3, 4])
    ref.commit_tree([0, 1, 3, 4])
    assert host.n_past == ref.n_past == len(prompt) + 4
    for t in (5, 6):
        close(host.prefill([t]), ref.prefill([t]))
