"""The CUDA backend's load-time checks, without a GPU: a model whose head_dim no attention kernel is
instantiated for is refused by CudaBackend.plan (which every load -- target, draft model, PFlash
drafter -- goes through) with a ModelLoadError naming the supported sizes, before anything is
allocated; on a GPU it would otherwise fail at its first forward with FD_E_SHAPE."""
from types import SimpleNamespace

import pytest

from flashd.daemon.backends.cuda.backend import HEAD_DIMS, CudaBackend
from flashd.daemon.models.gguf_file import ModelLoadError, ModelUnsupported


@pytest.mark.parametrize("head_dim", [16, 32, 80, 96, 192, 512])
def test_unsupported_head_dim_is_refused_at_plan_time(head_dim):
    backend = CudaBackend.__new__(CudaBackend)      # no device: the check comes before any device call
    with pytest.raises(ModelLoadError, match=f"head_dim {head_dim}.*--device cpu"):
        backend.plan(SimpleNamespace(head_dim=head_dim), weight_bytes=0, max_ctx=64, prefill_chunk=16)


def test_supported_head_dims_reach_the_device():
    assert HEAD_DIMS == (64, 128, 256)
    backend = CudaBackend.__new__(CudaBackend)
    backend.device = None                           # past the check, plan asks the device: AttributeError
    for head_dim in HEAD_DIMS:
        with pytest.raises(AttributeError):
            backend.plan(SimpleNamespace(head_dim=head_dim), weight_bytes=0, max_ctx=64, prefill_chunk=16)


class _Device:
    """A stand-in for Device: info() as a GPU of compute capability `cc` reports it; nothing else."""
    def __init__(self, cc):
        self.cc = cc

    def info(self):
        return {"cc": self.cc}


@pytest.mark.parametrize("cc", ["8.6", "8.9", "12.0", "7.5"])
def test_head_dim_256_is_refused_where_a_block_lacks_the_shared_memory(cc):
    """head_dim 256's split-K decode block takes ~150 KB of shared memory: GPUs of 99 KB are refused at plan time,
    with a message naming the capability and --device cpu (ModelUnsupported: --device auto falls back)."""
    backend = CudaBackend.__new__(CudaBackend)
    backend.device = _Device(cc)
    with pytest.raises(ModelUnsupported, match=f"head_dim 256.*compute capability {cc}.*--device cpu"):
        backend.plan(SimpleNamespace(head_dim=256), weight_bytes=0, max_ctx=64, prefill_chunk=16)


@pytest.mark.parametrize("cc", ["8.0", "9.0"])
def test_head_dim_256_passes_on_sm80_and_sm90(cc):
    backend = CudaBackend.__new__(CudaBackend)
    backend.device = _Device(cc)                    # past the check, plan asks device.lib: AttributeError
    with pytest.raises(AttributeError):
        backend.plan(SimpleNamespace(head_dim=256), weight_bytes=0, max_ctx=64, prefill_chunk=16)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_pflash_drafters_of_64_and_128_are_taken(head_dim):
    CudaBackend.__new__(CudaBackend).check_pflash_drafter(SimpleNamespace(head_dim=head_dim))


def test_a_pflash_drafter_of_head_dim_256_is_refused():
    """PFlash's kernels (scores, block-sparse attention, tail probabilities) serve dense drafters of 64 / 128: a
    head_dim 256 drafter is refused when it is checked, before anything is loaded."""
    with pytest.raises(ModelUnsupported, match="PFlash.*64 and 128.*head_dim 256"):
        CudaBackend.__new__(CudaBackend).check_pflash_drafter(SimpleNamespace(head_dim=256))
