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
    assert hashlib.md5(path.read_bytes()).hexdigest() == gguf_md5, "not the recorded model"
    return path


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
