"""Speculative decoding through the real daemon on the GPU: `flashd serve --device cuda --draft
DFLASH.gguf --draft ngram` with a synthetic target and a synthetic DFlash drafter. DDTree at
budgets 8..64, chain mode and n-grams stream exactly the tokens plain greedy decoding streams
(verification is row-invariant: bit-for-bit the decode step's logits), and `done` reports the
speculative steps."""
import pytest

from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash
from tests.daemon.daemon_harness import ServeDaemon, check_speculative_equals_greedy

# head_dim 64 (the CUDA attention kernels take 64, 128, 256)
TARGET = dict(arch="qwen3", n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab_size=1000, seed=11,
              name="dflash-gpu-target")
PROMPTS = ["def fib(n):", "The quick brown fox jumps over", "x"]
CONFIGS = [("chain", 15, "dflash"), ("ddtree", 8, "dflash"), ("ddtree", 22, "dflash"), ("ddtree", 40, "dflash"),
           ("ddtree", 64, "dflash"), ("chain", 7, "ngram"), ("ddtree", 22, "ngram")]


@pytest.mark.slow
def test_spec_through_the_gpu_daemon_equals_greedy(native, synthetic_model, tmp_path):
    target = synthetic_model(**TARGET)
    spec = spec_for_target(256, 4, 1000, n_features=3, n_layers=2, head_dim=64, ffn=512, block_size=16, seed=3)
    drafter = write_synthetic_dflash(tmp_path / "dflash.gguf", spec)
    daemon = ServeDaemon(target, tmp_path, "--device", "cuda", "--draft", str(drafter), "--draft", "ngram")
    try:
        assert daemon.ready.get("backend") == "cuda", daemon.ready
        configs = [(mode, budget, drafter.stem if draft == "dflash" else draft) for mode, budget, draft in CONFIGS]
        check_speculative_equals_greedy(daemon, PROMPTS, 64, configs)
    finally:
        daemon.kill()
