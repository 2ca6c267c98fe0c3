"""Without a GPU: the CUDA backend refuses a q8_0 / q4_0 KV cache at load (plan and make_runner, before
anything is allocated) with a message naming the kernels not yet converted, and it is a KVTypeUnsupported --
a ModelLoadError, not ModelUnsupported, so --device auto does not quietly move the model to the CPU."""
from types import SimpleNamespace

import pytest

from flashd.daemon.backends.base import KVCacheSpec
from flashd.daemon.backends.cuda.backend import CudaBackend, KVTypeUnsupported
from flashd.daemon.backends.cuda.kv_cache import CudaKVCache
from flashd.daemon.backends.kv_types import KVTypes
from flashd.daemon.models.gguf_file import ModelLoadError, ModelUnsupported


@pytest.mark.parametrize("types", [KVTypes("q8_0", "q8_0"), KVTypes("f16", "q4_0"), KVTypes("q4_0", "f16")], ids=str)
def test_quantized_kv_is_refused_at_plan_and_runner(types):
    backend = CudaBackend.__new__(CudaBackend)      # no device: the check comes before any device call
    cfg = SimpleNamespace(head_dim=128, linear=None)
    with pytest.raises(KVTypeUnsupported, match="fd_rope_kv_write.*--kv-type f16, or --device cpu") as exc:
        backend.plan(cfg, weight_bytes=0, max_ctx=64, prefill_chunk=16, kv_types=types)
    assert isinstance(exc.value, ModelLoadError) and not isinstance(exc.value, ModelUnsupported)
    with pytest.raises(KVTypeUnsupported):
        backend.make_runner(cfg, None, 64, 16, None, kv_types=types)
    with pytest.raises(ValueError, match="float16 K/V only"):
        CudaKVCache(None, KVCacheSpec(1, 64, 1, 128, types))


def test_f16_kv_reaches_the_device():
    backend = CudaBackend.__new__(CudaBackend)
    backend.device = None                           # past the checks, plan asks the device: AttributeError
    with pytest.raises(AttributeError):
        backend.plan(SimpleNamespace(head_dim=128, linear=None), weight_bytes=0, max_ctx=64, prefill_chunk=16,
                     kv_types=KVTypes())
