"""The decode GEMVs' L2 prefetch plan (fd_gemv_prefetch_set; native/cuda/gemv_prefetch.cuh says why).

A dense decoder's decode step runs its projections in a fixed order -- per layer QKV, O, gate/up, down, then
the next layer's QKV -- with the attention kernels between. The plan tells each projection launch the next
one's weights, which it asks the L2 to prefetch once the previous kernel has finished, so DRAM keeps streaming
across the launches' fixed costs. Keys are a launch's first matrix (q, o, gate, down), as the C side looks them
up. A hint only: a missing or stale entry changes no result, so the plan is registered for dense models only
(a hybrid's layer order differs) and removed before the weights it names are freed (PrefetchPlan.close).
"""
from __future__ import annotations

from .tensor import DeviceTensor

__all__ = ["PrefetchPlan", "LM_HEAD_PREFETCH_BYTES", "projection_order"]

# The lm_head (~190 MB for the 1.5B) does not fit the 50 MB L2: the last down projection asks for its first part.
LM_HEAD_PREFETCH_BYTES = 16 << 20


def _range(w) -> tuple[int, int] | None:
    """(device address, bytes) of a weight: a QuantWeight's blocks or a device tensor; None otherwise."""
    t = getattr(w, "data", w)
    return (t.ptr, t.nbytes) if isinstance(t, DeviceTensor) else None


def projection_order(weights) -> list[list]:
    """The dense decode step's GEMV launches in order, each the list of its matrices (the first is the key)."""
    order = []
    for layer in weights.layers:
        order += [[layer.attn_q, layer.attn_k, layer.attn_v], [layer.attn_output], [layer.ffn_gate, layer.ffn_up],
                  [layer.ffn_down]]
    order.append([weights.output])
    return order


class PrefetchPlan:
    """Registers launch -> next launch's ranges for one model's weights; close() removes them."""

    def __init__(self, native, weights):
        self.native = native
        self.keys: list[int] = []
        order = projection_order(weights)
        for launch, nxt in zip(order, order[1:]):
            key = _range(launch[0])
            ranges = [_range(w) for w in nxt]
            if key is None or any(r is None for r in ranges):
                continue
            if nxt is order[-1]:
                ranges = [(p, min(n, LM_HEAD_PREFETCH_BYTES)) for p, n in ranges]
            ffi = native.ffi
            ptrs = ffi.new("void*[]", [ffi.cast("void*", p) for p, _ in ranges])
            sizes = ffi.new("size_t[]", [n for _, n in ranges])
            native.check(native.lib.fd_gemv_prefetch_set(ffi.cast("void*", key[0]), len(ranges), ptrs, sizes),
                         "fd_gemv_prefetch_set")
            self.keys.append(key[0])

    def close(self) -> None:
        ffi = self.native.ffi
        for key in self.keys:
            self.native.lib.fd_gemv_prefetch_set(ffi.cast("void*", key), 0, ffi.NULL, ffi.NULL)
        self.keys = []
