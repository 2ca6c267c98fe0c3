"""The decode GEMVs' L2 prefetch plan (backends/cuda/prefetch_plan.py), without a GPU: on the host stand-in library
(tests/cuda_on_host/test_cuda_kv_prefix_on_host.py) that records fd_gemv_prefetch_set. Each projection launch's
first matrix maps to the next launch's matrices in the dense decode order (QKV -> O -> gate/up -> down -> the next
layer's QKV; the last down -> the lm_head's first LM_HEAD_PREFETCH_BYTES), and close() removes every entry. The
prefetch itself (a hint that never changes a result): tests/gpu/test_tuning.py."""
from __future__ import annotations

import types

import numpy as np
from tests.cuda_on_host.test_cuda_kv_prefix_on_host import HostNative

from flashd.daemon.backends.cuda.ops import QuantWeight
from flashd.daemon.backends.cuda.prefetch_plan import LM_HEAD_PREFETCH_BYTES, PrefetchPlan, projection_order
from flashd.daemon.backends.cuda.tensor import Device

NAMES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def weights(dev: Device, n_layers: int, lm_head_bytes: int = 4096):
    def w(n_bytes):
        return QuantWeight(dev.empty((n_bytes,), np.uint8), 12, 1, 256)
    layers = [types.SimpleNamespace(**{name: w(64 * (i + 1) + 16 * k) for k, name in enumerate(NAMES)})
              for i in range(n_layers)]
    return types.SimpleNamespace(layers=layers, output=w(lm_head_bytes))


def addr(wt):
    return wt.data.ptr


def test_each_launch_asks_for_the_next_launchs_matrices_and_close_removes_them():
    native = HostNative()
    dev = Device(native, 0)
    ws = weights(dev, 3, lm_head_bytes=LM_HEAD_PREFETCH_BYTES + 4096)
    plan = PrefetchPlan(native, ws)
    table = native.lib.prefetch
    order = projection_order(ws)
    assert [len(launch) for launch in order] == [3, 1, 2, 1] * 3 + [1]
    assert len(table) == len(order) - 1 == len(plan.keys)
    for launch, nxt in zip(order, order[1:]):
        want = [(addr(m), m.nbytes) for m in nxt]
        if nxt is order[-1]:
            want = [(addr(ws.output), LM_HEAD_PREFETCH_BYTES)]        # the lm_head: its first part only
        assert table[addr(launch[0])] == want
    l0, l1 = ws.layers[0], ws.layers[1]
    assert table[addr(l0.ffn_down)] == [(addr(l1.attn_q), l1.attn_q.nbytes), (addr(l1.attn_k), l1.attn_k.nbytes),
                                        (addr(l1.attn_v), l1.attn_v.nbytes)]
    plan.close()
    assert table == {} and plan.keys == []


def test_weights_without_device_blocks_are_skipped():
    native = HostNative()
    dev = Device(native, 0)
    ws = weights(dev, 2)
    ws.layers[1].attn_output = object()          # not on the device: no entry names it or is keyed by it
    plan = PrefetchPlan(native, ws)
    table = native.lib.prefetch
    assert addr(ws.layers[1].attn_q) not in table                       # its successor is the odd one
    assert addr(ws.layers[1].ffn_gate) in table
    assert len(table) == len(projection_order(ws)) - 1 - 2
    plan.close()
    assert table == {}
