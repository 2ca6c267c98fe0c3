"""The hybrid decode step that CudaHybridRunner captures in a CUDA graph (models.qwen35.forward with
new_sequence=False on device-resident ids / positions / n_past), run without a GPU on the host stand-in library of
test_qwen35_forward_on_host.py, with every upload, download and stream synchronization outside attention refused:
a captured body may do none (the attention kernels are the dense decode graph's, captured there; here their host
stand-in reads its inputs back, so attention alone is let through). Checked: the step's logits follow the
reference's decode steps; reading n_past back (new_sequence=None) is refused; after hybrid_ops' constants are
dropped (ops.release()) the fused step still uploads nothing and the composed one (HybridFusedDefaults) needs
prepare_capture first, and runs after it. The GPU run of the graph itself:
tests/gpu/test_cuda_qwen35.py."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from flashd.daemon.backends.base import Batch, HybridFusedDefaults
from flashd.daemon.backends.cuda.tensor import Device
from flashd.daemon.models import load_model
from flashd.daemon.models.qwen35 import forward
from flashd.daemon.runner import ModelRunner
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from tests.cuda_on_host.test_qwen35_forward_on_host import REF, SPEC, HostAttentionOps, ModelNative, close


class GuardedOps(HostAttentionOps):
    """HostAttentionOps whose device refuses transfers while `guard` is set, except inside attention."""

    guard = False

    def attention(self, q, k, v, cache_layer, batch):
        was, self.guard = self.guard, False
        try:
            return super().attention(q, k, v, cache_layer, batch)
        finally:
            self.guard = was


def guarded(ops: GuardedOps) -> GuardedOps:
    dev = ops.dev
    for name in ("upload", "download", "synchronize"):
        def wrapped(*args, _orig=getattr(dev, name), _name=name, **kw):
            if ops.guard:
                raise AssertionError(f"{_name} inside the decode step")
            return _orig(*args, **kw)
        setattr(dev, name, wrapped)
    return ops


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_synthetic_model(tmp_path_factory.mktemp("q35step") / "m.gguf", SPEC)


def setup(path, max_ctx=64, chunk=16):
    ops = guarded(GuardedOps(Device(ModelNative())))
    ops.reserve_arena(8 << 20)
    ops.reserve_scratch(2 * SPEC.hidden * max(SPEC.ffn, 2 * SPEC.n_heads * 32, SPEC.vocab_size))
    lm, ref_lm = load_model(path, ops.load_weight), load_model(path, REF.load_weight)
    return (ops, ModelRunner(ops, lm.config, lm.weights, max_ctx, chunk),
            ModelRunner(REF, ref_lm.config, ref_lm.weights, max_ctx, chunk))


def step(ops, run, token: int, new_sequence=False):
    """One decode step as the graph's body runs it: inputs in device memory, uploaded before the guard."""
    ids, pos, n_past = (ops.dev.upload(np.array([v], np.int32)) for v in (token, run.n_past, run.n_past))
    ops.begin_forward()
    ops.guard = True
    try:
        logits = forward(ops, run.cfg, run.weights, run.cache,
                         Batch(ids=ids, positions=pos, n_past=n_past, n_tokens=1), new_sequence=new_sequence)
    finally:
        ops.guard = False
    run.n_past += 1
    return ops.to_numpy(logits)


def test_decode_steps_on_device_inputs_follow_the_reference_without_host_steps(path):
    ops, host, ref = setup(path)
    prompt = np.random.default_rng(4).integers(0, SPEC.vocab_size, 18).tolist()
    close(host.prefill(prompt), ref.prefill(prompt))
    for t in (3, 141, 59, 26):
        close(step(ops, host, t), ref.prefill([t]))


def test_reading_n_past_back_is_a_host_step(path):
    ops, host, _ = setup(path)
    host.prefill([1, 2, 3])
    with pytest.raises(AssertionError, match="download"):
        step(ops, host, 4, new_sequence=None)


def test_after_release_only_the_composed_step_needs_prepare_capture(path, monkeypatch):
    """The fused delta rule (cuda/fused_ops.py) reads no constant of hybrid_ops', so after release() a step still
    uploads nothing; the composition that shapes past the fused kernel run (HybridFusedDefaults: l2_norm's weight)
    needs prepare_capture first, and runs after it."""
    ops, host, ref = setup(path)
    prompt = [5, 6, 7, 8]
    close(host.prefill(prompt), ref.prefill(prompt))
    ops._hybrid_init()                               # what CudaOps.release() does to hybrid_ops' constants
    close(step(ops, host, 9), ref.prefill([9]))      # the fused step: nothing uploaded
    monkeypatch.setattr(ops, "gated_delta_rule_fused",
                        functools.partial(HybridFusedDefaults.gated_delta_rule_fused, ops))
    host.reset(), ref.reset()
    close(host.prefill(prompt), ref.prefill(prompt))
    ops._hybrid_init()
    with pytest.raises(AssertionError, match="upload"):
        step(ops, host, 9)                           # l2_norm's weight would be uploaded inside the body
    ops.prepare_capture(host.cfg)
    host.reset(), ref.reset()                        # the refused step left the state mid-layer: start again
    close(host.prefill(prompt), ref.prefill(prompt))
    close(step(ops, host, 9), ref.prefill([9]))
