"""A qwen35 (hybrid) model on the CUDA backend: refused at plan time (every load goes through CudaBackend.plan)
with a ModelLoadError that says to run it on the CPU, before anything is allocated -- the Gated DeltaNet
kernels are issue 15, item 3."""
import pytest

from flashd.daemon.backends.cuda.backend import CudaBackend
from flashd.daemon.models import open_model
from flashd.daemon.models.gguf_file import ModelLoadError
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec


def test_qwen35_is_refused_at_plan_time(tmp_path):
    spec = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, head_dim=64, weight_type="F32")
    _, cfg = open_model(write_synthetic_model(tmp_path / "q35.gguf", spec))
    backend = CudaBackend.__new__(CudaBackend)      # no device: the check comes before any device call
    with pytest.raises(ModelLoadError, match="qwen35's linear-attention.*--device cpu"):
        backend.plan(cfg, weight_bytes=0, max_ctx=64, prefill_chunk=16)
