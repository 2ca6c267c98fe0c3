"""A qwen35 (hybrid) model served by the daemon on the CPU backend: greedy generation through `flashd serve`
equals the reference forward run one token at a time in this process (prompt fed token by token: the
recurrent form of the delta rule only), for two prompts in turn and the first again (each request starts a
new sequence: no state leaks from the one before, and no prefix is reused)."""
import numpy as np

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.runner import ModelRunner
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec
from tests.daemon.daemon_harness import generated

SPEC = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, rope_dim=16,
                     ffn=128, ssm_state=16, ssm_k_heads=1, ssm_v_heads=2, full_attn_interval=2, weight_type="Q8_0",
                     seed=1535, name="daemon-qwen35")
N_GEN = 20


def token_by_token(runner: ModelRunner, prompt: list[int], n: int) -> list[int]:
    runner.reset()
    for t in prompt:
        logits = runner.prefill([t])[0]
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = runner.prefill([out[-1]])[0]
    return out


def test_daemon_greedy_equals_the_reference_token_by_token(spawn_serve, tmp_path):
    model = write_synthetic_model(tmp_path / "q35.gguf", SPEC)
    daemon = spawn_serve(model=model)
    assert daemon.ready["arch"] == "qwen35"
    ops = ReferenceOps()
    lm = load_model(model, ops.load_weight)
    runner = ModelRunner(ops, lm.config, lm.weights, 512, 512)
    for i, text in enumerate(["Once upon a time", "def fib(n):", "Once upon a time"]):
        prompt = daemon.ask(f'tokenize id=t{i} text="{text}"', f"t{i}")[-1]["ids"]
        ids, _, done = generated(daemon.ask(f'generate id=g{i} text="{text}" max_tokens={N_GEN} ignore_eos=true',
                                            f"g{i}"))
        assert done["event"] == "done" and done.get("n_cached", 0) == 0
        assert ids == token_by_token(runner, prompt, N_GEN), text


def test_speculative_request_on_a_hybrid_decodes_plainly(spawn_serve, tmp_path):
    """Drafts cannot be verified on a recurrent state yet (issue 15, item 4): the request decodes plainly, the
    same tokens, and its done.spec says why."""
    daemon = spawn_serve(model=write_synthetic_model(tmp_path / "q35.gguf", SPEC))
    text = "ab ab ab ab ab ab"
    plain, _, _ = generated(daemon.ask(f'generate id=p text="{text}" max_tokens={N_GEN} ignore_eos=true', "p"))
    ids, _, done = generated(daemon.ask(f'generate id=s text="{text}" max_tokens={N_GEN} ignore_eos=true '
                                        "spec=chain draft=ngram", "s"))
    assert ids == plain
    assert done["spec"]["unsupported"] == "hybrid target" and done["spec"]["steps"] == 0
