"""Record llama.cpp's logits on tiny synthetic qwen35 (Qwen3.5 hybrid) models (issue 15, item 7).

Each model of MODELS (float32 weights, so llama.cpp's CPU matmuls do not quantize activations) is written by
make_synthetic_gguf from a fixed seed, so a test rebuilds it bit for bit and compares flashd's reference backend
with what llama.cpp computed. The two models mix Gated DeltaNet and full-attention layers differently and cover
partial rotary dims, value heads sharing key heads (Hv = 2 Hk, Hv = 3 Hk), tied and untied embeddings:

- teacher forcing: PROMPT_LEN random token ids (fixed seed) evaluated in one decode (llama.cpp runs its
  recurrent gated delta rule over them; flashd's reference prefill the chunked form, chunks of 64): per position
  the argmax, the top-5 ids and logits, and the full logits row at FULL_ROWS;
- greedy: N_GENERATE argmax tokens after the prompt, one Llama.eval per token, with each step's top-5.

The recording itself (llama.cpp's settings, the two passes, the metadata) is scripts/llama_cpp_logits.py,
shared with scripts/record_yarn_reference.py. It needs llama-cpp-python (not a flashd dependency):
    pip install llama-cpp-python==0.3.36        # builds llama.cpp from source (CPU)
    python -m flashd.scripts.record_qwen35_reference --out tests/data/reference/qwen35-synthetic.json
"""
from __future__ import annotations

from pathlib import Path

from flashd.scripts.llama_cpp_logits import model_identity, prompt_ids, record_logits, recorder_info, run_recorder
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec

FORMAT = "flashd-qwen35-reference/1"
MODELS = {
    # layers: linear, linear, full, linear, linear, full; head_dim 64 with 16 rotated dims; Hk 2, Hv 4
    "hybrid-a": SyntheticSpec(arch="qwen35", n_layers=6, hidden=128, n_heads=4, n_kv_heads=2, head_dim=64, rope_dim=16,
                              ffn=256, vocab_size=512, rope_theta=10000.0, ssm_state=32, ssm_k_heads=2, ssm_v_heads=4,
                              ssm_conv_kernel=4, full_attn_interval=3, weight_type="F32", seed=35,
                              name="synthetic qwen35 a"),
    # layers: linear, full, linear, full; one KV head, rope over 8 of 32 dims; Hk 1, Hv 3; conv kernel 3; tied
    "hybrid-b": SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, rope_dim=8,
                              ffn=128, vocab_size=384, rope_theta=1_000_000.0, ssm_state=16, ssm_k_heads=1,
                              ssm_v_heads=3, ssm_conv_kernel=3, full_attn_interval=2, tie_embeddings=True,
                              weight_type="F32", seed=36, name="synthetic qwen35 b"),
}
PROMPT_LEN = 200            # several of the reference prefill's 64-token delta-rule chunks
PROMPT_SEED = 3
N_GENERATE = 16
FULL_ROWS = (0, 1, 63, 64, 65, 127, 128, 199)
N_CTX = 256


def record_model(model_path: Path, spec: SyntheticSpec) -> dict:
    ids = prompt_ids(spec.vocab_size, PROMPT_LEN, PROMPT_SEED)
    return {**model_identity(model_path, spec),
            **record_logits(model_path, ids, n_ctx=N_CTX, n_generate=N_GENERATE, full_rows=FULL_ROWS)}


def record_all(tmp: Path) -> dict:
    models = {name: record_model(write_synthetic_model(tmp / f"{name}.gguf", spec), spec)
              for name, spec in MODELS.items()}
    return {"format": FORMAT, "recorder": recorder_info(N_CTX, "scripts/record_qwen35_reference.py"), "models": models}


def main(argv: list[str] | None = None) -> int:
    return run_recorder(__doc__, argv, record_all, lambda rec: f"{len(rec['models'])} models, {PROMPT_LEN} "
                        f"teacher-forced positions, {N_GENERATE} greedy tokens")


if __name__ == "__main__":
    raise SystemExit(main())
