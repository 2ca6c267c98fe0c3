"""--device auto and a model the CUDA kernels do not cover (a qwen35 hybrid whose shape CudaBackend.plan refuses:
this one's attention head_dim 32, as a real Qwen3.5's 256, has no prefill attention kernel): the engine falls back
to the CPU reference backend for it and serves (greedy output equal to an engine started with --device cpu), while
--device cuda keeps the refusal. The CUDA backend is stood in for by a backend that refuses such a model the way
CudaBackend.plan does (ModelUnsupported), so this runs without a GPU."""
import pytest

import flashd.daemon.engine as engine_module
from flashd.daemon.backends import ReferenceBackend
from flashd.daemon.config import EngineConfig
from flashd.daemon.engine import Engine
from flashd.daemon.models.gguf_file import ModelUnsupported
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec
from tests.daemon.engine_client import EngineClient

SPEC = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, rope_dim=16,
                     ffn=128, ssm_state=16, ssm_k_heads=1, ssm_v_heads=2, full_attn_interval=2, weight_type="Q8_0",
                     seed=41, name="auto-qwen35")


class NoLinearAttention(ReferenceBackend):
    """Stands in for CudaBackend: refuses this linear-attention model at plan time, as CudaBackend.plan does (its
    head_dim; the message names the layers so that the tests below can tell the refusal apart)."""
    name = "cuda"

    def plan(self, cfg, *args, **kwargs):
        if getattr(cfg, "linear", None) is not None:
            raise ModelUnsupported(f"the CUDA backend has no kernels yet for {cfg.arch}'s linear-attention layers")
        return super().plan(cfg, *args, **kwargs)


@pytest.fixture
def model(tmp_path):
    return str(write_synthetic_model(tmp_path / "q35.gguf", SPEC))


def greedy(engine, n=12):
    engine.load()
    engine.start()
    try:
        return EngineClient(engine).greedy([5, 17, 101, 3, 44, 9], n)
    finally:
        engine.stop()


def test_auto_falls_back_to_the_cpu_and_serves(model, monkeypatch, caplog):
    monkeypatch.setattr(engine_module, "select_backend",
                        lambda device: ReferenceBackend() if device == "cpu" else NoLinearAttention())
    engine = Engine(EngineConfig(model=model, device="auto", max_ctx=256))
    ids = greedy(engine)
    assert engine.backend.name == "reference" and engine.ops is engine.backend.ops
    assert engine.drafters.backend is engine.backend
    assert "CPU reference backend" in caplog.text
    assert ids == greedy(Engine(EngineConfig(model=model, device="cpu", max_ctx=256)))


def test_cuda_keeps_the_refusal(model, monkeypatch):
    monkeypatch.setattr(engine_module, "select_backend", lambda device: NoLinearAttention())
    with pytest.raises(ModelUnsupported, match="linear-attention"):
        Engine(EngineConfig(model=model, device="cuda", max_ctx=256)).load()
