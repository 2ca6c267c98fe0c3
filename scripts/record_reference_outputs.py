"""Record llama.cpp's outputs on the real models, as an independent oracle for flashd's tests.

CI cannot run llama.cpp, so this script is run by hand (it needs `pip install llama-cpp-python`,
which is not a flashd dependency) and its JSON outputs are committed under tests/data/reference/.
For each model it records, from llama.cpp's own float32 logits:

- greedy generation: the prompt ids (llama.cpp's tokenizer) and `n_generate` greedy ids per prompt,
  with the top-k ids and logits at every generated position, so a test can tell a near-tie (two
  logits closer than quantization noise) from a real divergence;
- teacher forcing: the argmax, top-k logits and the log-probability of the actual next token at
  each of the first `n_teacher_forced` positions of a source file, evaluated in one decode call.

Greedy is argmax over the logits llama.cpp returned (ties go to the lowest id, as in llama.cpp's
greedy sampler); it is cross-checked against a repeat run and against `Llama.generate` with
temp=0, top_k=1, repeat_penalty=1.0, and the script fails if any of them disagree.

Usage:
    python -m flashd.scripts.record_reference_outputs --models-dir DIR \
        --out tests/data/reference
The inputs (prompts.json, the source excerpt) are read from the --out folder; see its README.md.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# File formats and names, one constant a line: a list, alike in shape only to other lists of names (the
# GGUF keys of daemon/models/dflash_config.py).
OUTPUT_FORMAT = "flashd-reference-outputs/1"
PROMPTS_FORMAT = "flashd-reference-prompts/1"
PROMPTS_FILE = "prompts.json"
SOURCE_FILE = "textwrap_excerpt.py"


@dataclass(frozen=True, slots=True)
class ReferenceModel:
    """One model to record: the output file stem and the GGUF file name inside --models-dir."""

    out_stem: str
    gguf_name: str


REFERENCE_MODELS = (
    ReferenceModel("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    ReferenceModel("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"),
)


# Settings one a line with their defaults: alike in shape to other settings records (make_synthetic_dflash.py's
# SyntheticDFlashSpec), with nothing in common to share.
@dataclass(frozen=True, slots=True)
class RecordingConfig:
    """How llama.cpp is driven. Every field ends up in the output's `recorder` metadata."""

    n_threads: int = 2
    n_ctx: int = 2048
    # n_batch = n_ubatch >= n_teacher_forced + 1 so the whole teacher-forced text is one decode.
    n_batch: int = 1024
    seed: int = 1234
    n_generate: int = 32
    n_teacher_forced: int = 512
    n_top: int = 5
    # Logits and log-probabilities are rounded to this many decimals in the JSON (file size).
    n_decimals: int = 4
    # A step whose top-2 logits differ by less than this is listed as a near-tie.
    near_tie_logit_gap: float = 0.1

    def __post_init__(self) -> None:
        for name in ("n_threads", "n_ctx", "n_batch", "n_generate", "n_teacher_forced", "n_top"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_top < 2:
            raise ValueError(f"n_top must be >= 2 to measure the top-2 gap, got {self.n_top}")
        if self.n_batch < self.n_teacher_forced + 1:
            raise ValueError(
                f"n_batch ({self.n_batch}) must hold the {self.n_teacher_forced + 1} "
                "teacher-forced tokens so they are evaluated in one decode"
            )
        if self.n_ctx < self.n_batch:
            raise ValueError(f"n_ctx ({self.n_ctx}) must be >= n_batch ({self.n_batch})")
        if not 0 <= self.n_decimals <= 8:
            raise ValueError(f"n_decimals must be in [0, 8], got {self.n_decimals}")
        if self.near_tie_logit_gap < 0:
            raise ValueError(f"near_tie_logit_gap must be >= 0, got {self.near_tie_logit_gap}")


def file_md5(path: Path) -> str:
    digest = hashlib.md5()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_prompts(path: Path) -> list[dict]:
    """prompts.json -> [{"name", "kind", "text"}]; raises ValueError on a malformed file."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != PROMPTS_FORMAT:
        raise ValueError(f"{path}: format must be {PROMPTS_FORMAT!r}, got {data.get('format')!r}")
    prompts = data.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        raise ValueError(f"{path}: 'prompts' must be a non-empty list")
    names = set()
    for i, p in enumerate(prompts):
        if not isinstance(p, dict) or not {"name", "kind", "text"} <= p.keys():
            raise ValueError(f"{path}: prompt {i} needs keys name, kind, text")
        if p["kind"] not in ("raw", "chat"):
            raise ValueError(f"{path}: prompt {p['name']!r} kind must be 'raw' or 'chat'")
        if not p["text"]:
            raise ValueError(f"{path}: prompt {p['name']!r} has empty text")
        if p["name"] in names:
            raise ValueError(f"{path}: duplicate prompt name {p['name']!r}")
        names.add(p["name"])
    return prompts


def top_k_row(logits: np.ndarray, n_top: int) -> tuple[list[int], list[float]]:
    """logits float32[n_vocab] -> (ids, logits) of the n_top largest, descending; ties by lower id."""
    # Stable sort on -logits keeps equal logits in id order, matching argmax's lowest-id rule.
    order = np.argsort(-logits, kind="stable")[:n_top]
    return [int(i) for i in order], [float(logits[i]) for i in order]


def log_softmax_at(logits: np.ndarray, token_id: int) -> float:
    """log p(token_id) under softmax(logits), computed in float64 from llama.cpp's float32 logits."""
    row = logits.astype(np.float64)
    row_max = row.max()
    return float(row[token_id] - row_max - math.log(np.exp(row - row_max).sum()))


def near_ties(top_logits: list[list[float]], gap: float) -> list[int]:
    """Indices of rows whose top-2 logits differ by less than `gap`."""
    return [i for i, row in enumerate(top_logits) if row[0] - row[1] < gap]


def rounded(rows: list[list[float]], n_decimals: int) -> list[list[float]]:
    return [[round(x, n_decimals) for x in row] for row in rows]


class LlamaCppRecorder:
    """One loaded llama.cpp model and the calls that record it. Holds no per-step state."""

    def __init__(self, gguf_path: Path, config: RecordingConfig):
        try:
            import llama_cpp
        except ImportError as e:
            raise SystemExit(
                "llama-cpp-python is needed to record reference outputs "
                "(pip install llama-cpp-python; it is not a flashd dependency)"
            ) from e
        self.llama_cpp = llama_cpp
        self.config = config
        # The exact constructor arguments; also written verbatim into the output metadata.
        self.llama_kwargs = dict(
            n_ctx=config.n_ctx,
            n_batch=config.n_batch,
            n_ubatch=config.n_batch,
            n_threads=config.n_threads,
            n_threads_batch=config.n_threads,
            seed=config.seed,
            logits_all=True,
            # float32 KV cache, like flashd's reference backend (llama.cpp's default is f16).
            type_k=llama_cpp.GGML_TYPE_F32,
            type_v=llama_cpp.GGML_TYPE_F32,
            flash_attn=False,
            n_gpu_layers=0,
            verbose=False,
        )
        self.llm = llama_cpp.Llama(model_path=str(gguf_path), **self.llama_kwargs)
        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.vocab = vocab
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
        self.n_vocab = int(self.llm.n_vocab())

    def is_end_of_generation(self, token_id: int) -> bool:
        return bool(self.llama_cpp.llama_vocab_is_eog(self.vocab, token_id))

    def tokenize(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=self.add_bos, special=True))

    def detokenize(self, ids: list[int]) -> str:
        return self.llm.detokenize(ids, special=True).decode("utf-8", errors="replace")

    def greedy(self, prompt_ids: list[int]) -> tuple[list[int], np.ndarray]:
        """Greedy decode from a fresh context.

        Returns (generated ids [n_generate], logits float32[n_generate, n_vocab]) where row i is
        the logits llama.cpp computed for choosing generated id i.
        """
        n_generate = self.config.n_generate
        self.llm.reset()
        self.llm.eval(prompt_ids)
        generated: list[int] = []
        step_logits = np.empty((n_generate, self.n_vocab), dtype=np.float32)
        for step in range(n_generate):
            # scores: float32[n_ctx, n_vocab]; row n_tokens-1 predicts the next token.
            step_logits[step] = self.llm.scores[self.llm.n_tokens - 1]
            next_id = int(np.argmax(step_logits[step]))
            generated.append(next_id)
            if step + 1 < n_generate:
                self.llm.eval([next_id])
        return generated, step_logits

    def greedy_via_generate(self, prompt_ids: list[int]) -> list[int]:
        """The same greedy decode through llama.cpp's own sampler chain (cross-check)."""
        self.llm.reset()
        out: list[int] = []
        for token in self.llm.generate(prompt_ids, **self.generate_kwargs()):
            out.append(int(token))
            if len(out) == self.config.n_generate:
                break
        return out

    @staticmethod
    def generate_kwargs() -> dict:
        return dict(top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0, temp=0.0, repeat_penalty=1.0,
                    frequency_penalty=0.0, presence_penalty=0.0, reset=True)

    def teacher_forced_logits(self, ids: list[int]) -> np.ndarray:
        """ids [n] -> logits float32[n, n_vocab] from one eval of the whole sequence."""
        self.llm.reset()
        self.llm.eval(ids)
        return np.array(self.llm.scores[: len(ids)], dtype=np.float32)


def record_greedy(recorder: LlamaCppRecorder, prompts: list[dict]) -> tuple[list[dict], dict]:
    config = recorder.config
    records = []
    max_repeat_diff = 0.0
    for prompt in prompts:
        prompt_ids = recorder.tokenize(prompt["text"])
        if len(prompt_ids) + config.n_generate > config.n_ctx:
            raise ValueError(f"prompt {prompt['name']!r} is too long for n_ctx={config.n_ctx}")
        ids_a, logits_a = recorder.greedy(prompt_ids)
        ids_b, logits_b = recorder.greedy(prompt_ids)
        ids_gen = recorder.greedy_via_generate(prompt_ids)
        if ids_a != ids_b:
            raise RuntimeError(f"{prompt['name']}: llama.cpp greedy is not repeatable: {ids_a} vs {ids_b}")
        if ids_a != ids_gen:
            raise RuntimeError(
                f"{prompt['name']}: argmax loop {ids_a} disagrees with Llama.generate {ids_gen}")
        max_repeat_diff = max(max_repeat_diff, float(np.abs(logits_a - logits_b).max()))
        top = [top_k_row(row, config.n_top) for row in logits_a]
        top_logits = [t[1] for t in top]
        gaps = [row[0] - row[1] for row in top_logits]
        first_eog = next((i for i, t in enumerate(ids_a) if recorder.is_end_of_generation(t)), None)
        records.append({
            "name": prompt["name"],
            "kind": prompt["kind"],
            "prompt_ids": prompt_ids,
            "generated_ids": ids_a,
            "generated_text": recorder.detokenize(ids_a),
            "first_eog_step": first_eog,
            "top_ids": [t[0] for t in top],
            "top_logits": rounded(top_logits, config.n_decimals),
            "min_top2_gap": round(min(gaps), config.n_decimals),
            "near_tie_steps": near_ties(top_logits, config.near_tie_logit_gap),
        })
    consistency = {
        "repeat_run_ids_identical": True,
        "llama_generate_ids_identical": True,
        "max_abs_logit_diff_between_repeat_runs": max_repeat_diff,
    }
    return records, consistency


def record_teacher_forced(recorder: LlamaCppRecorder, source_text: str) -> dict:
    config = recorder.config
    all_ids = recorder.tokenize(source_text)
    n_needed = config.n_teacher_forced + 1
    if len(all_ids) < n_needed:
        raise ValueError(f"source text has {len(all_ids)} tokens, need at least {n_needed}")
    ids = all_ids[:n_needed]
    logits = recorder.teacher_forced_logits(ids)
    again = recorder.teacher_forced_logits(ids)
    repeat_diff = float(np.abs(logits - again).max())
    if not np.array_equal(logits.argmax(axis=1), again.argmax(axis=1)):
        raise RuntimeError("teacher-forced argmax is not repeatable in llama.cpp")
    positions = range(config.n_teacher_forced)
    top = [top_k_row(logits[i], config.n_top) for i in positions]
    top_logits = [t[1] for t in top]
    # Position i's logits predict ids[i + 1].
    target_logprobs = [log_softmax_at(logits[i], ids[i + 1]) for i in positions]
    mean_nll = -sum(target_logprobs) / len(target_logprobs)
    argmax_ids = [int(logits[i].argmax()) for i in positions]
    return {
        "n_source_tokens": len(all_ids),
        "ids": ids,
        "argmax_ids": argmax_ids,
        "top_ids": [t[0] for t in top],
        "top_logits": rounded(top_logits, config.n_decimals),
        "target_logprobs": [round(x, config.n_decimals) for x in target_logprobs],
        "mean_nll": round(mean_nll, 6),
        "perplexity": round(math.exp(mean_nll), 6),
        "argmax_equals_next_fraction": round(
            sum(a == t for a, t in zip(argmax_ids, ids[1:])) / len(argmax_ids), 6),
        "near_tie_positions": near_ties(top_logits, config.near_tie_logit_gap),
        "max_abs_logit_diff_between_repeat_runs": repeat_diff,
    }


def recorder_metadata(recorder: LlamaCppRecorder, config: RecordingConfig) -> dict:
    llama_cpp = recorder.llama_cpp
    kwargs = {k: v for k, v in recorder.llama_kwargs.items()}
    calls = {
        "load": "llama_cpp.Llama(model_path, " + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")",
        "tokenize": f"Llama.tokenize(text.encode('utf-8'), add_bos={recorder.add_bos}, special=True)"
                    " (add_bos = llama_vocab_get_add_bos, i.e. the GGUF metadata)",
        "greedy": "Llama.reset(); Llama.eval(prompt_ids); then for each of n_generate steps: "
                  "logits = Llama.scores[Llama.n_tokens - 1]; next = numpy.argmax(logits); "
                  "Llama.eval([next])",
        "greedy_cross_check": "Llama.reset(); Llama.generate(prompt_ids, "
                              + ", ".join(f"{k}={v!r}" for k, v in recorder.generate_kwargs().items())
                              + "), first n_generate tokens; must equal the argmax loop",
        "teacher_forced": "Llama.reset(); Llama.eval(ids[:n_teacher_forced + 1]) (one decode, "
                          "n_batch = n_ubatch >= len); logits = Llama.scores[:len]",
        "top": "ids of the n_top largest logits, descending; equal logits ordered by lower id",
        "logprob": "log_softmax in float64 of the float32 logits row, at the actual next id",
    }
    return {
        "tool": "llama-cpp-python",
        "llama_cpp_python_version": llama_cpp.__version__,
        "llama_system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "n_threads": config.n_threads,
        "n_ctx": config.n_ctx,
        "n_batch": config.n_batch,
        "n_ubatch": config.n_batch,
        "seed": config.seed,
        "n_generate": config.n_generate,
        "n_teacher_forced": config.n_teacher_forced,
        "n_top": config.n_top,
        "n_decimals": config.n_decimals,
        "near_tie_logit_gap": config.near_tie_logit_gap,
        "kv_cache_type": "f32",
        "calls": calls,
        "script": "scripts/record_reference_outputs.py",
    }


def record_model(model: ReferenceModel, models_dir: Path, inputs_dir: Path,
                 config: RecordingConfig) -> dict:
    gguf_path = models_dir / model.gguf_name
    if not gguf_path.is_file():
        raise FileNotFoundError(f"{gguf_path} not found (pass --models-dir)")
    prompts_path = inputs_dir / PROMPTS_FILE
    source_path = inputs_dir / SOURCE_FILE
    prompts = load_prompts(prompts_path)
    source_text = source_path.read_text(encoding="utf-8")

    recorder = LlamaCppRecorder(gguf_path, config)
    greedy, consistency = record_greedy(recorder, prompts)
    teacher_forced = record_teacher_forced(recorder, source_text)
    consistency["teacher_forced_max_abs_logit_diff_between_repeat_runs"] = \
        teacher_forced.pop("max_abs_logit_diff_between_repeat_runs")
    return {
        "format": OUTPUT_FORMAT,
        "model": {
            "name": model.out_stem,
            "gguf_file": model.gguf_name,
            "gguf_md5": file_md5(gguf_path),
            "n_vocab": recorder.n_vocab,
            "add_bos": recorder.add_bos,
            "bos_id": int(recorder.llm.token_bos()),
            "eos_id": int(recorder.llm.token_eos()),
        },
        "recorder": recorder_metadata(recorder, config),
        "self_consistency": consistency,
        "inputs": {
            "prompts_file": PROMPTS_FILE,
            "prompts_md5": file_md5(prompts_path),
            "source_file": SOURCE_FILE,
            "source_md5": file_md5(source_path),
        },
        "greedy": greedy,
        "teacher_forced": teacher_forced,
    }


def dump_compact(obj, indent: int = 0) -> str:
    """JSON with dicts indented one key per line and each list of scalars on one line.

    Keeps the files small and their diffs readable (one generated step / position per line).
    """
    pad = " " * indent
    inner = " " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {dump_compact(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(x, (dict, list)) for x in obj):
        items = [inner + dump_compact(x, indent + 1) for x in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models-dir", type=Path, required=True,
                        help="folder holding the GGUF files named in REFERENCE_MODELS")
    parser.add_argument("--out", type=Path, required=True,
                        help="folder with prompts.json and the source excerpt; outputs go here")
    parser.add_argument("--model", choices=[m.out_stem for m in REFERENCE_MODELS], action="append",
                        help="record only this model (repeatable; default: all)")
    args = parser.parse_args(argv)
    config = RecordingConfig()
    chosen = [m for m in REFERENCE_MODELS if args.model is None or m.out_stem in args.model]
    for model in chosen:
        record = record_model(model, args.models_dir, args.out, config)
        out_path = args.out / f"{model.out_stem}.json"
        out_path.write_text(dump_compact(record) + "\n", encoding="utf-8")
        n_ties = sum(len(g["near_tie_steps"]) for g in record["greedy"])
        print(f"{out_path}: {len(record['greedy'])} prompts ({n_ties} near-tie steps), "
              f"teacher-forced ppl {record['teacher_forced']['perplexity']:.3f}, "
              f"{len(record['teacher_forced']['near_tie_positions'])} near-tie positions",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
