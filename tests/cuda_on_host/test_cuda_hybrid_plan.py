"""A qwen35 (hybrid) model on the CUDA backend's load-time plan, without a GPU: CudaBackend.plan (every load goes
through it) passes a hybrid on to the device-sized plan unless a linear-attention shape is one the recurrent
kernels refuse (flashd_recurrent.h: more than CONV_MAX_K conv taps, a head over DELTA_MAX_DK), which it refuses
with a ModelLoadError naming the limit and --device cpu before anything is allocated. The sizes a hybrid adds
(hybrid_plan.py) cover what its layers hold."""
from types import SimpleNamespace

import pytest

from flashd.daemon.backends.cuda.backend import CudaBackend
from flashd.daemon.backends.cuda.hybrid_plan import (hybrid_largest_weight, hybrid_layer_bytes, hybrid_state_bytes,
                                                     hybrid_workspace_bytes)
from flashd.daemon.backends.cuda.recurrent_ops import CONV_MAX_K, DELTA_MAX_DK
from flashd.daemon.models import open_model
from flashd.daemon.models.gguf_file import ModelLoadError
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec


def hybrid_cfg(conv_kernel=4, state=64):
    return SimpleNamespace(head_dim=64, linear=SimpleNamespace(conv_kernel=conv_kernel, head_dim=state))


@pytest.mark.parametrize("kw, match", [(dict(conv_kernel=CONV_MAX_K + 1), f"up to {CONV_MAX_K} taps"),
                                       (dict(state=DELTA_MAX_DK * 2), f"heads of up to {DELTA_MAX_DK}")])
def test_shapes_the_recurrent_kernels_refuse_are_refused_at_plan_time(kw, match):
    backend = CudaBackend.__new__(CudaBackend)      # no device: the check comes before any device call
    with pytest.raises(ModelLoadError, match=f"{match}.*--device cpu"):
        backend.plan(hybrid_cfg(**kw), weight_bytes=0, max_ctx=64, prefill_chunk=16)


def test_a_qwen35_model_gets_past_the_checks_to_the_device(tmp_path):
    spec = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, head_dim=64, weight_type="F32")
    _, cfg = open_model(write_synthetic_model(tmp_path / "q35.gguf", spec))
    backend = CudaBackend.__new__(CudaBackend)
    backend.device = None                           # past the checks, plan asks the device: AttributeError
    with pytest.raises(AttributeError):
        backend.plan(cfg, weight_bytes=0, max_ctx=64, prefill_chunk=16)


def test_hybrid_sizes_cover_the_state_and_the_layers(tmp_path):
    spec = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, n_heads=2, n_kv_heads=1, head_dim=64,
                         weight_type="F32", ssm_state=32, ssm_k_heads=2, ssm_v_heads=4, ssm_conv_kernel=4)
    _, cfg = open_model(write_synthetic_model(tmp_path / "q35.gguf", spec))
    lin = cfg.linear
    assert len(lin.linear_layers) == 3
    assert hybrid_state_bytes(cfg) == 3 * 4 * (3 * lin.conv_channels + 4 * 32 * 32)
    chunk = 16
    assert hybrid_layer_bytes(cfg, chunk) >= 4 * chunk * (3 * lin.conv_channels + 4 * lin.value_dim + cfg.ffn)
    assert hybrid_largest_weight(cfg) >= max(2 * cfg.q_dim, lin.conv_channels, cfg.ffn) * cfg.hidden
    assert hybrid_workspace_bytes(cfg, chunk) >= 4 * lin.head_dim          # l2_norm's weight
