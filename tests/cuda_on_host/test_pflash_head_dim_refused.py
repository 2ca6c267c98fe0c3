"""A PFlash drafter whose head_dim PFlash's CUDA kernels do not cover (anything but 64 / 128: a head_dim 256 model,
which the target's attention kernels now take) is refused when PrefillCompressor checks it -- before the VRAM
admission and any load -- as a bad_request naming the head_dims; without a GPU (a stand-in backend that has
CudaBackend's check and nothing else)."""
import pytest

from flashd.daemon.backends.cuda.backend import CudaBackend
from flashd.daemon.pflash.config import PFlashConfig
from flashd.daemon.pflash.service import PrefillCompressor
from flashd.protocol.errors import ProtocolError


class _Backend:
    name = "cuda"
    check_pflash_drafter = CudaBackend.check_pflash_drafter


def _compressor():
    comp = PrefillCompressor(_Backend(), PFlashConfig(), None, None)
    comp.admit = lambda *a: pytest.fail("admitted a drafter the kernels refuse")
    return comp


def test_head_dim_256_drafter_is_refused_at_check(synthetic_model):
    path = synthetic_model(arch="qwen3", n_layers=1, hidden=256, n_heads=2, n_kv_heads=1, head_dim=256, ffn=256,
                           vocab_size=300)
    with pytest.raises(ProtocolError, match="PFlash.*64 and 128.*head_dim 256") as err:
        _compressor().check(str(path))
    assert err.value.code == "bad_request"


def test_head_dim_64_drafter_passes_the_check(synthetic_model):
    path = synthetic_model(arch="qwen2", n_layers=1, hidden=128, n_heads=2, n_kv_heads=1, ffn=256, vocab_size=300)
    comp = _compressor()
    comp.admit = None
    assert comp.check(str(path))[0] == str(path)
