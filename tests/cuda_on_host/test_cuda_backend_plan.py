"""The CUDA backend's load-time checks, without a GPU: a model whose head_dim no attention kernel is
instantiated for is refused by CudaBackend.plan (which every load -- target, draft model, PFlash
drafter -- goes through) with a ModelLoadError naming the supported sizes, before anything is
allocated; on a GPU it would otherwise fail at its first forward with FD_E_SHAPE."""
from types import SimpleNamespace

import pytest

from flashd.daemon.backends.cuda.backend import HEAD_DIMS, CudaBackend
from flashd.daemon.models.gguf_file import ModelLoadError


@pytest.mark.parametrize("head_dim", [16, 32, 80, 96, 256])
def test_unsupported_head_dim_is_refused_at_plan_time(head_dim):
    backend = CudaBackend.__new__(CudaBackend)      # no device: the check comes before any device call
    with pytest.raises(ModelLoadError, match=f"head_dim {head_dim}.*--device cpu"):
        backend.plan(SimpleNamespace(head_dim=head_dim), weight_bytes=0, max_ctx=64, prefill_chunk=16)


def test_supported_head_dims_reach_the_device():
    backend = CudaBackend.__new__(CudaBackend)
    backend.device = None                           # past the check, plan asks the device: AttributeError
    for head_dim in HEAD_DIMS:
        with pytest.raises(AttributeError):
            backend.plan(SimpleNamespace(head_dim=head_dim), weight_bytes=0, max_ctx=64, prefill_chunk=16)
