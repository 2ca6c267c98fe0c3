"""A speculative request on a target runner that verifies no draft trees (`tree_unsupported`: a hybrid on the
CUDA backend, backends/cuda/hybrid_runner.py) is decoded plainly: the same tokens as spec=off, and its done.spec
says "unsupported" with the runner's reason (daemon/generation.py; protocol/SPEC.md, park / unpark). The runner
is stood in for by a reference runner whose tree entry points refuse, so this runs without a GPU."""
import pytest

import flashd.daemon.engine as engine_module
from flashd.daemon.backends import ReferenceBackend
from flashd.daemon.backends.cuda.hybrid_runner import CudaHybridRunner
from flashd.daemon.config import EngineConfig
from flashd.daemon.engine import Engine
from flashd.daemon.runner import ModelRunner
from flashd.protocol import messages as m
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec
from tests.daemon.engine_client import EngineClient

SPEC = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, rope_dim=16,
                     ffn=128, ssm_state=16, ssm_k_heads=1, ssm_v_heads=2, full_attn_interval=2, weight_type="Q8_0",
                     seed=43, name="plain-qwen35")
PROMPT = [5, 17, 101, 3, 44, 9, 5, 17, 101, 3, 44, 9]


class NoTreeRunner(ModelRunner):
    tree_unsupported = CudaHybridRunner.tree_unsupported

    def forward_tree(self, *args, **kwargs):
        raise AssertionError("a tree forward on a runner that verifies no trees")


class NoTreeBackend(ReferenceBackend):
    def make_runner(self, cfg, weights, max_ctx, prefill_chunk, plan=None, kv_types=None):
        return NoTreeRunner(self.ops, cfg, weights, max_ctx, prefill_chunk, kv_types)


@pytest.mark.parametrize("spec", ["chain", "ddtree"])
def test_a_speculative_request_decodes_plainly_and_says_why(tmp_path, monkeypatch, spec):
    monkeypatch.setattr(engine_module, "select_backend", lambda device: NoTreeBackend())
    model = str(write_synthetic_model(tmp_path / "q35.gguf", SPEC))
    engine = Engine(EngineConfig(model=model, device="cpu", max_ctx=256, drafts=("ngram",)))
    engine.load()
    engine.start()
    try:
        client = EngineClient(engine)
        plain = client.greedy(PROMPT, 12)
        done = client.ask(m.Generate, ids=PROMPT, max_tokens=12, ignore_eos=True, stream=False, spec=spec,
                          draft="ngram")
    finally:
        engine.stop()
    assert done["event"] == "done", done
    assert done["ids"] == plain
    assert done["spec"]["unsupported"] == "hybrid target on the CUDA backend" and done["spec"]["steps"] == 0
