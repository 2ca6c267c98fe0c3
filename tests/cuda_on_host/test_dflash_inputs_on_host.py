"""StagedInputs (the DFlash drafter's per-step inputs) over the CUDA backend's Device on a host-memory
stand-in: each name keeps one buffer (same address step after step, so a step allocates nothing),
grows it only for a larger input, and the tensor it returns holds the input's values."""
from __future__ import annotations

import numpy as np

from flashd.daemon.backends.cuda.ops import CudaOps
from flashd.daemon.backends.cuda.tensor import Device
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.speculative.dflash_inputs import StagedInputs
from tests.cuda_on_host.test_cuda_kv_prefix_on_host import HostNative


def test_one_buffer_per_name_reused_and_grown():
    ops = CudaOps(Device(HostNative()))
    staged = StagedInputs(ops)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 12)).astype(np.float32)
    t1 = staged.put("feature0", a)
    np.testing.assert_array_equal(ops.dev.download(t1), a)
    t2 = staged.put("feature0", a[:3] + 1)                  # smaller: the same buffer
    assert t2.ptr == t1.ptr and t2.shape == (3, 12)
    np.testing.assert_array_equal(ops.dev.download(t2), a[:3] + 1)
    ids = staged.put("block_ids", np.arange(16, dtype=np.int32))
    assert ids.ptr != t1.ptr and ids.dtype == np.int32
    big = rng.standard_normal((9, 12)).astype(np.float32)
    t3 = staged.put("feature0", big)                        # larger: grown once
    np.testing.assert_array_equal(ops.dev.download(t3), big)
    assert staged.put("feature0", big[:2]).ptr == t3.ptr


def test_reference_backend_gets_the_arrays():
    x = np.arange(6, dtype=np.int32)
    np.testing.assert_array_equal(StagedInputs(ReferenceOps()).put("block_ids", x), x)
