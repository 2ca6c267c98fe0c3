"""What the tests against llama.cpp's recordings on synthetic models share (test_yarn_llama_cpp.py,
test_qwen35_llama_cpp.py; recorded by scripts/llama_cpp_logits.py): the recording, the model rebuilt from
its seed (and checked to be the recorded one), a reference-backend runner and the prompt's logits."""
import hashlib
import json
from pathlib import Path

import numpy as np

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.runner import ModelRunner
from flashd.scripts.make_synthetic_gguf import write_synthetic_model

RECORDINGS = Path(__file__).resolve().parents[1] / "data" / "reference"
TOL = 1e-4          # |logit difference|; each test's docstring gives the measured error and why this bound


def load_recording(file_name: str) -> dict:
    return json.loads((RECORDINGS / file_name).read_text())


def rebuilt_model(path: Path, spec, gguf_md5: str) -> Path:
    """The recorded model written again from its spec at `path`; fails unless it is the recorded file."""
    write_synthetic_model(path, spec)
    assert file_md5(path) == gguf_md5, "not the recorded model"
    return path


def file_md5(path) -> str:
    md5 = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            md5.update(chunk)
    return md5.hexdigest()


def runner(path) -> ModelRunner:
    ops = ReferenceOps()
    lm = load_model(path, ops.load_weight)
    return ModelRunner(ops, lm.config, lm.weights, 256, 512)


def prompt_logits(path, prompt) -> tuple[np.ndarray, ModelRunner]:
    """Every position's logits over `prompt` in one prefill, and the runner."""
    r = runner(path)
    r.reset()
    return np.asarray(r.prefill(prompt, all_logits=True)), r


def worst_full_row_error(logits, rec) -> float:
    """The largest |difference| between `logits` and the recording's full rows."""
    return max(float(np.abs(logits[int(p)] - np.array(row)).max()) for p, row in rec["teacher_forced"]["full_rows"].items())


def load_full_rows(file_name: str) -> tuple[list[int], np.ndarray]:
    """A recording's full logits rows kept in the .npz next to its JSON (a vocabulary too big for JSON lists):
    (positions, float32 rows (n, n_vocab), stored as float16)."""
    with np.load(RECORDINGS / file_name) as z:
        return [int(p) for p in z["positions"]], z["logits"].astype(np.float32)


def row_spread(rows: np.ndarray) -> float:
    """The largest max - min over `rows`: the scale a relative logit tolerance is taken of."""
    return float((rows.max(1) - rows.min(1)).max())


def worst_scaled_error(logits, positions, rows) -> float:
    """max over the full rows of max |logits[p] - row| / (the row's max - min)."""
    return max(float(np.abs(logits[p] - row).max() / (row.max() - row.min())) for p, row in zip(positions, rows))


def greedy_agrees(got: list[int], greedy: dict, same_token, tol: float) -> tuple[bool, int]:
    """(True, n) if `got` is the recorded greedy tokens up to the first step where the recorded top-2 gap is
    within `tol` (a near-tie either implementation may break differently; after it the contexts differ), n the
    steps compared; (False, s) at the first step s that differs without one. same_token(a, b): a and b give the
    same logits everywhere (a model with repeated embedding rows); plain equality otherwise."""
    for s, (a, b) in enumerate(zip(got, greedy["generated_ids"])):
        if same_token(a, b):
            continue
        top2 = greedy["top_logits"][s]
        return top2[0] - top2[1] <= tol, s
    return len(got) == len(greedy["generated_ids"]), len(got)
