"""CudaOps.reserve_attention without a GPU (the host-memory stand-in of test_cuda_kv_prefix_on_host.py): a new
attention workspace is zero-filled before any kernel sees it, because its head holds the one-token
attention launches' split arrival counters, which must start idle (native/include/flashd_attention.h,
native/cuda/attention_splitk_combine.cuh); a workspace that already covers the shape is kept as it is."""
from __future__ import annotations

import numpy as np
from tests.cuda_on_host.test_cuda_kv_prefix_on_host import HostMemoryLib, HostNative

from flashd.daemon.backends.cuda.ops import CudaOps
from flashd.daemon.backends.cuda.tensor import Device


class DirtyMallocLib(HostMemoryLib):
    """cudaMalloc hands back whatever the memory held: here 0x05 bytes (a count the counters must never
    start from)."""

    def fd_malloc(self, out, n_bytes):
        status = super().fd_malloc(out, n_bytes)
        self.ffi.memmove(self.ffi.cast("char*", out[0]), b"\x05" * n_bytes, n_bytes)
        return status

    def fd_attention_decode_workspace_bytes(self, shape, chunk_len):
        return 16384 + shape.n_heads * 8 * (shape.head_dim + 2) * 4

    def fd_attention_workspace_bytes(self, n, shape, chunk_len):
        return 16384 + n * shape.n_heads * 8 * (shape.head_dim + 2) * 4


class DirtyNative(HostNative):
    def __init__(self):
        super().__init__()
        self.lib = DirtyMallocLib(self.ffi)


def test_a_new_attention_workspace_is_zero_filled():
    dev = Device(DirtyNative())
    ops = CudaOps(dev)
    ops.reserve_attention(12, 2, 128, 4096, n_tokens=1)
    first = ops.attn_workspace
    assert not dev.download(first).any()
    dev.upload(np.full(first.nbytes, 7, np.uint8), out=first)      # kernels may leave partials behind
    ops.reserve_attention(12, 2, 128, 4096, n_tokens=1)            # covered: kept, not refilled
    assert ops.attn_workspace is first and dev.download(first)[0] == 7
    ops.reserve_attention(12, 2, 128, 4096, n_tokens=65)           # grown: a new buffer, zero-filled
    assert ops.attn_workspace is not first and not dev.download(ops.attn_workspace).any()
