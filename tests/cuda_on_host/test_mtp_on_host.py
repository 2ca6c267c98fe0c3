"""The qwen35 MTP block (models/qwen35_mtp.py) and the mtp drafter (speculative/mtp_drafter.py) through CudaOps without
a GPU, on the host stand-in library and the host-attention ops of test_qwen35_forward_on_host.py: the block's
weights load through CudaOps.load_weight (eh_proj split into its column halves), its forward runs every projection,
norm, embed and the gated attention's ops through the C ABI's Python side, and the drafter's inputs go through
StagedInputs' device buffers. Checked against the reference backend: a replay over a prompt (the GEMM path: more
than 8 rows) and one-row chain steps (GEMV), and the drafter's proposals next to the reference drafter's, given the
same target. The kernels themselves on a GPU: tests/gpu/test_mtp_gpu.py."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from flashd.daemon.backends.base import Batch
from flashd.daemon.models import load_model, open_model
from flashd.daemon.models.qwen35_mtp import mtp_cache_spec, mtp_forward
from flashd.daemon.models.qwen35_mtp_weights import load_mtp_weights, mtp_config
from flashd.daemon.runner import ModelRunner
from flashd.daemon.speculative.mtp_drafter import load_mtp_drafter
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from tests.cuda_on_host.test_qwen35_forward_on_host import REF, REL_TOL, SPEC, HostAttentionOps, ModelNative
from flashd.daemon.backends.cuda.tensor import Device

MTP_SPEC = dataclasses.replace(SPEC, mtp=True)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_synthetic_model(tmp_path_factory.mktemp("mtphost") / "m.gguf", MTP_SPEC)


class MTPHostOps(HostAttentionOps):
    """HostAttentionOps whose attention workspace (the reference attention needs none) only records its size."""

    def reserve_attention(self, n_heads, n_kv_heads, head_dim, max_ctx, n_tokens=0):
        self.reserved = (n_heads, n_kv_heads, head_dim, max_ctx, n_tokens)


def host_ops():
    ops = MTPHostOps(Device(ModelNative()))
    ops.reserve_arena(8 << 20)
    ops.reserve_scratch(2 * SPEC.hidden * max(SPEC.ffn, 2 * SPEC.hidden, 2 * SPEC.n_heads * 32, SPEC.vocab_size))
    return ops


def close(got, want):
    scale = float(np.abs(want).max())
    assert float(np.abs(np.asarray(got) - np.asarray(want)).max()) <= REL_TOL * scale


def block(ops, path):
    f, cfg = open_model(path)
    target = load_model((f, cfg), ops.load_weight)
    return cfg, target, load_mtp_weights(f, cfg, mtp_config(f, cfg), ops.load_weight, target.weights)


def test_replay_and_chain_steps_match_the_reference(path):
    ops = host_ops()
    cfg, _, w = block(ops, path)
    _, _, rw = block(REF, path)
    rng = np.random.default_rng(0)
    n = 12
    ids = rng.integers(0, SPEC.vocab_size, n).astype(np.int32)
    h = rng.standard_normal((n, SPEC.hidden)).astype(np.float32)
    caches = ops.kv_cache(mtp_cache_spec(cfg, 64)), REF.kv_cache(mtp_cache_spec(cfg, 64))
    outs = []
    for o, ww, cache in ((ops, w, caches[0]), (REF, rw, caches[1])):
        o.begin_forward()
        put = o.from_numpy if o is REF else (lambda a, o=o: o.dev.upload(np.ascontiguousarray(a)))
        logits, g = mtp_forward(o, cfg, ww, cache, Batch(put(ids), put(np.arange(n, dtype=np.int32)),
                                                         put(np.zeros(1, np.int32))), put(h), all_logits=True)
        rows = [(np.array(o.to_numpy(logits)), np.array(o.to_numpy(g)))]
        gg = np.array(o.to_numpy(g))[-1:]
        for k in range(3):           # chain steps: one row each, the block's own row fed back
            o.begin_forward()
            logits, g = mtp_forward(o, cfg, ww, cache, Batch(put(np.array([7 + k], np.int32)),
                                                             put(np.array([n + k], np.int32)),
                                                             put(np.array([n + k], np.int32))), put(gg))
            gg = np.array(o.to_numpy(g))
            rows.append((np.array(o.to_numpy(logits)), gg))
        outs.append(rows)
    for (lg, g), (rl, rg) in zip(*outs):
        close(lg, rl)
        close(g, rg)


def test_the_drafter_over_cuda_ops_proposes_the_reference_drafters_chain(path):
    """Both drafters see the same target rows (the reference target's) and the same commits: their chains agree
    wherever the reference's top-2 logits are not within rounding of each other."""
    ops = host_ops()
    f, cfg = open_model(path)
    host_target = load_model((f, cfg), ops.load_weight)
    ref_target = load_model((f, cfg), REF.load_weight)
    runner = ModelRunner(REF, cfg, ref_target.weights, 64, 16)
    d_host = load_mtp_drafter(ops, f, host_target, 64, 16)
    d_ref = load_mtp_drafter(REF, f, ref_target, 64, 16)
    prompt = np.random.default_rng(4).integers(0, SPEC.vocab_size, 20).tolist()

    def sink(i, h):
        d_ref.capture_hidden(i, h)
        d_host.capture_hidden(i, ops.dev.upload(np.ascontiguousarray(h)))       # a device tensor, as on CUDA
    logits = runner.start(prompt, hidden_sink=sink)[0]
    root = int(np.argmax(logits))
    for d in (d_host, d_ref):
        d.begin(prompt, root)
    agree = 0
    for step in range(3):
        p_host, p_ref = d_host.propose(3, 1), d_ref.propose(3, 1)
        agree += int(np.array_equal(p_host.tokens, p_ref.tokens))
        # verify the reference's chain on the target: one tree forward, sink to both
        chain = [root] + [int(t) for t in p_ref.tokens[:, 0]]
        mask = np.tril(np.ones((len(chain), len(chain)), bool))
        pos = np.arange(runner.n_past, runner.n_past + len(chain), dtype=np.int32)
        out = runner.logits_to_host(runner.forward_tree(chain, pos, mask, hidden_sink=sink))
        acc = []
        while len(acc) < len(chain) - 1 and int(np.argmax(out[len(acc)])) == chain[len(acc) + 1]:
            acc.append(chain[len(acc) + 1])
        bonus = int(np.argmax(out[len(acc)]))
        runner.commit_tree(np.arange(len(acc) + 1, dtype=np.int32))
        for d in (d_host, d_ref):
            d.accept(acc, bonus, list(range(len(acc) + 1)))
        root = bonus
    assert agree == 3
    assert ops.reserved == (SPEC.n_heads, SPEC.n_kv_heads, 32, 64, 1)      # decode's (a replay needs none)
    assert d_host.forwards == d_ref.forwards > 0
    d_host.end()
    d_ref.end()
