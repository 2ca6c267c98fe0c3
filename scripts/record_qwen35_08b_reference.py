"""Record llama.cpp's logits on the 0.8B-shape synthetic qwen35 model (issue 15: "the 0.8B-shape model agrees with
llama.cpp on the GPU the same way" as the tiny models of scripts/record_qwen35_reference.py do).

The model is the file `make_synthetic_gguf OUT --preset qwen3.5-0.8b` writes (MODEL below: the preset as it is,
seed 0; BF16 matrices drawn from a 256-row pool per tensor, random_blocks; 24 layers, 18 Gated DeltaNet + 6 full
attention; vocabulary 248320, tied lm_head; 1.5 GB, written in ~10 s, deterministic: its md5 is recorded):

- teacher forcing: PROMPT_LEN random token ids (fixed seed) in one decode: per position the argmax and the top-N_TOP
  ids and logits (JSON), and the full logits row at FULL_ROWS -- 248320 floats each, so not in the JSON: float16 in
  the .npz next to it ("positions", "logits");
- greedy: N_GENERATE argmax tokens after the prompt, one Llama.eval per token, with each step's top-N_TOP.

random_blocks draws token_embd's 248320 rows from 256 distinct rows, and the lm_head is token_embd (tied): every id
of a class (the ids whose rows are byte-identical) gets the same logit, bit for bit, so a plain top-k would be k
copies of the best class. The top lists are therefore over one id per class, its lowest (`token_classes`,
recorded): the best N_TOP of each row's 256 distinct logits. The argmax (numpy's: the first maximum) is always
such an id.

The recording itself is scripts/llama_cpp_logits.py (shared with the tiny models' recorders). It needs
llama-cpp-python 0.3.36 (not a flashd dependency; any target directory on PYTHONPATH):
    pip install --target DIR llama-cpp-python==0.3.36
    PYTHONPATH=DIR python -m flashd.scripts.record_qwen35_08b_reference --out tests/data/reference/qwen35-08b-synthetic.json
(writes qwen35-08b-synthetic.json and qwen35-08b-synthetic.npz; ~75 s on 2 CPU cores).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from flashd.daemon.models.gguf_file import GGUFFile
from flashd.scripts.llama_cpp_logits import model_identity, prompt_ids, record_logits, recorder_info, run_recorder
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_presets import PRESETS

FORMAT = "flashd-qwen35-08b-reference/1"
PRESET = "qwen3.5-0.8b"
MODEL = PRESETS[PRESET]
PROMPT_LEN = 48
PROMPT_SEED = 8
N_GENERATE = 16
N_TOP = 64                  # of the 256 distinct logits per row (token_classes)
FULL_ROWS = (0, 23, 47)
N_CTX = 64


def token_classes(path: Path) -> np.ndarray:
    """Per token id, the lowest id whose token_embd row is byte-identical to its own (int64, n_vocab)."""
    rows = np.asarray(GGUFFile(path).tensor("token_embd.weight").blocks)
    key = np.ascontiguousarray(rows[:, :16]).view(np.dtype((np.void, 16))).ravel()    # the first 16 bytes ...
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    classes = first[inverse.ravel()]
    for i in range(0, len(rows), 8192):                                              # ... then the whole rows
        assert np.array_equal(rows[i:i + 8192], rows[classes[i:i + 8192]]), "rows share 16 bytes, not all"
    return classes


def record(tmp: Path) -> dict:
    path = write_synthetic_model(tmp / "qwen35-08b.gguf", MODEL)
    classes = np.unique(token_classes(path))
    ids = prompt_ids(MODEL.vocab_size, PROMPT_LEN, PROMPT_SEED)
    rec = record_logits(path, ids, n_ctx=N_CTX, n_generate=N_GENERATE, full_rows=FULL_ROWS, n_top=N_TOP,
                        full_rows_array=True, columns=classes)
    rows = rec["teacher_forced"].pop("full_rows")
    rec["teacher_forced"]["full_rows_positions"] = list(FULL_ROWS)
    return {"format": FORMAT, "recorder": recorder_info(N_CTX, "scripts/record_qwen35_08b_reference.py"),
            "preset": PRESET, **model_identity(path, MODEL), "token_classes": classes.tolist(), **rec,
            "npz": {"positions": np.array(FULL_ROWS, np.int32), "logits": rows.astype(np.float16)}}


def main(argv: list[str] | None = None) -> int:
    return run_recorder(__doc__, argv, record, lambda rec: f"{PROMPT_LEN} teacher-forced positions (top-{N_TOP} "
                        f"of {len(rec['token_classes'])} distinct logits, {len(FULL_ROWS)} full rows in the .npz), "
                        f"{N_GENERATE} greedy tokens")


if __name__ == "__main__":
    raise SystemExit(main())
