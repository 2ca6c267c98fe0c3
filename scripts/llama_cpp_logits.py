"""What the synthetic-model llama.cpp recorders share (scripts/record_yarn_reference.py,
scripts/record_qwen35_reference.py): how llama.cpp is loaded (float32 K/V, CPU, one decode for the whole
prompt), the teacher-forced and greedy recording over a prompt, and the `recorder` metadata.

- teacher forcing: the prompt evaluated in one decode; per position the argmax, the top-N_TOP ids and logits,
  and the full logits row at the positions `full_rows` names;
- greedy: `n_generate` argmax tokens after the prompt, one Llama.eval per token, with each step's top-N_TOP.

llama-cpp-python is imported only when a recording runs (it is not a flashd dependency).
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
from typing import Callable

import numpy as np

N_TOP = 5


def run_recorder(doc: str, argv: list[str] | None, record: Callable[[Path], dict],
                 summary: Callable[[dict], str]) -> int:
    """A recorder's main: --out FILE (the help is `doc`'s first paragraph); record(a temporary folder for the
    models it writes) -> the recording, written to FILE as compact JSON (its "npz" entry, a dict of arrays, if
    any: to FILE with the suffix .npz instead, np.savez_compressed); `summary(recording)` on stderr."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    out = p.parse_args(argv).out
    with tempfile.TemporaryDirectory() as tmp:
        rec = record(Path(tmp))
    arrays = rec.pop("npz", None)       # arrays too big for the JSON: next to it, FILE with .npz for .json
    if arrays is not None:
        np.savez_compressed(out.with_suffix(".npz"), **arrays)
    out.write_text(json.dumps(rec, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"{out}: {summary(rec)}", file=sys.stderr)
    return 0


def prompt_ids(vocab_size: int, length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab_size, length).tolist()


def top(row: np.ndarray, n_top: int = N_TOP, columns: np.ndarray | None = None) -> tuple[list[int], list[float]]:
    """The n_top highest logits of `row` (equal logits: lower id first), over the ids `columns` (ascending) only
    if given."""
    if columns is None:
        order = np.argsort(-row, kind="stable")[:n_top]
    else:
        order = columns[np.argsort(-row[columns], kind="stable")[:n_top]]
    return [int(i) for i in order], [round(float(row[i]), 6) for i in order]


def load_kwargs(n_ctx: int) -> dict:
    import llama_cpp

    return dict(n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=2, n_threads_batch=2, seed=1234,
                logits_all=True, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
                flash_attn=False, n_gpu_layers=0, verbose=False)


def model_identity(model_path: Path, spec) -> dict:
    """The SyntheticSpec's fields (less type_overrides) and the written file's md5, so a test can rebuild the
    model from its seed and check it is the recorded one."""
    return {"spec": {k: getattr(spec, k) for k in spec.__dataclass_fields__ if k != "type_overrides"},
            "gguf_md5": hashlib.md5(model_path.read_bytes()).hexdigest()}


def record_logits(model_path: Path, ids: list[int], *, n_ctx: int, n_generate: int,
                  full_rows: tuple[int, ...], n_top: int = N_TOP, full_rows_array: bool = False,
                  columns: np.ndarray | None = None) -> dict:
    """llama.cpp's teacher-forced and greedy logits for `ids`: {"prompt_ids", "teacher_forced", "greedy"}, the
    top-`n_top` per position and step. full_rows_array: teacher_forced["full_rows"] is one float32 array
    (len(full_rows), n_vocab) in full_rows' order (for a vocabulary too big for JSON lists; the caller stores it),
    else {str(position): row rounded to 1e-6}. columns: the top lists over these ids only (ascending; a vocabulary
    whose lm_head repeats rows: one id per distinct row, so that the lists are not all copies of one logit)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(model_path), **load_kwargs(n_ctx))
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[:len(ids)], dtype=np.float32)
    tf = [top(r, n_top, columns) for r in logits]
    generated, steps = [], []
    row = logits[-1]
    for _ in range(n_generate):
        steps.append(top(row, n_top, columns))
        nxt = int(np.argmax(row))
        generated.append(nxt)
        llm.eval([nxt])
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return {
        "prompt_ids": ids,
        "teacher_forced": {"argmax_ids": [t[0][0] for t in tf], "top_ids": [t[0] for t in tf],
                           "top_logits": [t[1] for t in tf],
                           "full_rows": logits[list(full_rows)].copy() if full_rows_array else
                           {str(p): [round(float(x), 6) for x in logits[p]] for p in full_rows}},
        "greedy": {"generated_ids": generated, "top_ids": [s[0] for s in steps], "top_logits": [s[1] for s in steps]},
    }


def recorder_info(n_ctx: int, script: str) -> dict:
    import llama_cpp

    kwargs = load_kwargs(n_ctx)
    return {"tool": "llama-cpp-python", "llama_cpp_python_version": llama_cpp.__version__,
            "llama_system_info": llama_cpp.llama_print_system_info().decode().strip(),
            "python": platform.python_version(), "machine": platform.machine(),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "load": "llama_cpp.Llama(model_path, " + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")",
            "teacher_forced": "Llama.reset(); Llama.eval(prompt_ids) (one decode); logits = Llama.scores",
            "greedy": "then n_generate times: next = argmax(last logits row); Llama.eval([next])",
            "script": script}
