"""Record llama.cpp's logits on a tiny synthetic qwen2 model with YaRN rope scaling (issue 16, item 2).

The model (YARN_SPEC: float32 weights, so llama.cpp's CPU matmuls do not quantize activations; rope_dim 32,
theta 1e4, original context 64, factor 4) is written by make_synthetic_gguf from a fixed seed, so a test
can rebuild it bit for bit and compare flashd's reference backend with what llama.cpp computed:

- teacher forcing: PROMPT_LEN random token ids (fixed seed) evaluated in one decode; per position the
  argmax, the top-5 ids and logits, and the full logits row at FULL_ROWS (positions before and past 64);
- greedy: N_GENERATE argmax tokens after the prompt, one Llama.eval per token, with each step's top-5.

Like scripts/record_reference_outputs.py this needs llama-cpp-python (not a flashd dependency):
    pip install llama-cpp-python==0.3.36        # builds llama.cpp from source
    python -m flashd.scripts.record_yarn_reference --out tests/data/reference/yarn-synthetic.json
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model

FORMAT = "flashd-yarn-reference/1"
YARN_SPEC = SyntheticSpec(arch="qwen2", n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, ffn=256, vocab_size=512,
                          context_length=64, rope_theta=10000.0, rope_scaling="yarn", rope_factor=4.0,
                          rope_orig_ctx=64, weight_type="F32", seed=16, name="synthetic yarn qwen2")
PROMPT_LEN = 200            # positions 64..199 are past the original context
PROMPT_SEED = 2
N_GENERATE = 16
N_TOP = 5
FULL_ROWS = (0, 40, 63, 64, 100, 150, 199)
N_CTX = 256


def prompt_ids(vocab_size: int) -> list[int]:
    return np.random.default_rng(PROMPT_SEED).integers(0, vocab_size, PROMPT_LEN).tolist()


def top(row: np.ndarray) -> tuple[list[int], list[float]]:
    order = np.argsort(-row, kind="stable")[:N_TOP]
    return [int(i) for i in order], [round(float(row[i]), 6) for i in order]


def record(model_path: Path) -> dict:
    import llama_cpp

    kwargs = dict(n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=2, n_threads_batch=2, seed=1234,
                  logits_all=True, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
                  flash_attn=False, n_gpu_layers=0, verbose=False)
    llm = llama_cpp.Llama(model_path=str(model_path), **kwargs)
    ids = prompt_ids(YARN_SPEC.vocab_size)
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[:PROMPT_LEN], dtype=np.float32)
    tf = [top(r) for r in logits]
    generated, steps = [], []
    row = logits[-1]
    for _ in range(N_GENERATE):
        steps.append(top(row))
        nxt = int(np.argmax(row))
        generated.append(nxt)
        llm.eval([nxt])
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return {
        "format": FORMAT,
        "model": {"spec": {k: getattr(YARN_SPEC, k) for k in YARN_SPEC.__dataclass_fields__
                           if k != "type_overrides"},
                  "gguf_md5": hashlib.md5(model_path.read_bytes()).hexdigest()},
        "recorder": {"tool": "llama-cpp-python", "llama_cpp_python_version": llama_cpp.__version__,
                     "llama_system_info": llama_cpp.llama_print_system_info().decode().strip(),
                     "python": platform.python_version(), "machine": platform.machine(),
                     "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                     "load": "llama_cpp.Llama(model_path, " + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")",
                     "teacher_forced": "Llama.reset(); Llama.eval(prompt_ids) (one decode); logits = Llama.scores",
                     "greedy": "then n_generate times: next = argmax(last logits row); Llama.eval([next])",
                     "script": "scripts/record_yarn_reference.py"},
        "prompt_ids": ids,
        "teacher_forced": {"argmax_ids": [t[0][0] for t in tf], "top_ids": [t[0] for t in tf],
                           "top_logits": [t[1] for t in tf],
                           "full_rows": {str(p): [round(float(x), 6) for x in logits[p]] for p in FULL_ROWS}},
        "greedy": {"generated_ids": generated, "top_ids": [s[0] for s in steps], "top_logits": [s[1] for s in steps]},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_synthetic_model(Path(tmp) / "yarn.gguf", YARN_SPEC)
        rec = record(path)
    args.out.write_text(json.dumps(rec, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(rec['prompt_ids'])} teacher-forced positions, {N_GENERATE} greedy tokens",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
