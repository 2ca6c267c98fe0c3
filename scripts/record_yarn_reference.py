"""Record llama.cpp's logits on a tiny synthetic qwen2 model with YaRN rope scaling (issue 16, item 2).

The model (YARN_SPEC: float32 weights, so llama.cpp's CPU matmuls do not quantize activations; rope_dim 32,
theta 1e4, original context 64, factor 4) is written by make_synthetic_gguf from a fixed seed, so a test
can rebuild it bit for bit and compare flashd's reference backend with what llama.cpp computed:

- teacher forcing: PROMPT_LEN random token ids (fixed seed) evaluated in one decode; per position the
  argmax, the top-5 ids and logits, and the full logits row at FULL_ROWS (positions before and past 64);
- greedy: N_GENERATE argmax tokens after the prompt, one Llama.eval per token, with each step's top-5.

The recording itself (llama.cpp's settings, the two passes, the metadata) is scripts/llama_cpp_logits.py,
shared with scripts/record_qwen35_reference.py. It needs llama-cpp-python (not a flashd dependency):
    pip install llama-cpp-python==0.3.36        # builds llama.cpp from source
    python -m flashd.scripts.record_yarn_reference --out tests/data/reference/yarn-synthetic.json
"""
from __future__ import annotations

from pathlib import Path

from flashd.scripts.llama_cpp_logits import model_identity, prompt_ids, record_logits, recorder_info, run_recorder
from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model

FORMAT = "flashd-yarn-reference/1"
YARN_SPEC = SyntheticSpec(arch="qwen2", n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, ffn=256, vocab_size=512,
                          context_length=64, rope_theta=10000.0, rope_scaling="yarn", rope_factor=4.0,
                          rope_orig_ctx=64, weight_type="F32", seed=16, name="synthetic yarn qwen2")
PROMPT_LEN = 200            # positions 64..199 are past the original context
PROMPT_SEED = 2
N_GENERATE = 16
FULL_ROWS = (0, 40, 63, 64, 100, 150, 199)
N_CTX = 256


def record(model_path: Path) -> dict:
    ids = prompt_ids(YARN_SPEC.vocab_size, PROMPT_LEN, PROMPT_SEED)
    return {"format": FORMAT, "model": model_identity(model_path, YARN_SPEC),
            "recorder": recorder_info(N_CTX, "scripts/record_yarn_reference.py"),
            **record_logits(model_path, ids, n_ctx=N_CTX, n_generate=N_GENERATE, full_rows=FULL_ROWS)}


def main(argv: list[str] | None = None) -> int:
    return run_recorder(__doc__, argv, lambda tmp: record(write_synthetic_model(tmp / "yarn.gguf", YARN_SPEC)),
                        lambda rec: f"{len(rec['prompt_ids'])} teacher-forced positions, {N_GENERATE} greedy tokens")


if __name__ == "__main__":
    raise SystemExit(main())
