"""Record llama.cpp's tokenizer behaviour on a text corpus, as the oracle for flashd's tokenizer.

    python -m flashd.scripts.record_tokenizer_reference MODEL.gguf [MODEL.gguf ...] \
        [--corpus tests/data/tokenizer/corpus.json] [--out-dir tests/data/tokenizer]

Needs llama-cpp-python (not a flashd dependency; built from source once, then this script is run
by hand and its outputs committed). For each GGUF it writes `<out-dir>/<gguf stem>.json` with:

- `tokenize`: the ids llama.cpp gives for every corpus text (add_bos false, special tokens
  parsed), and for the `texts_no_special` texts also with special=false;
- `vocab`: size, BOS/EOS/EOT ids, add_bos/add_eos, the end-of-generation ids and the control ids;
- `pieces_sha256`: a digest over every token's piece (llama_token_to_piece), with and without
  special rendering, so the whole id -> bytes table is checked without storing it; plus
  `piece_samples`, the pieces of a sample of ids, for readable failures;
- `detokenize`: llama_detokenize of some id sequences (corpus ids, ids cut inside a UTF-8
  character, random ids), as hex bytes since they need not be valid UTF-8;
- `pre_variants`: the corpus ids llama.cpp gives for the same vocabulary under each of the other
  pre-tokenizer kinds flashd supports (`variant_metadata`: `tokenizer.ggml.pre` replaced, and a
  few multi-digit tokens added so digit grouping shows), from a tensor-less copy of the GGUF.
  This checks every kind's regexes against llama.cpp, not only the two the models use.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import random
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["record", "pieces_digest", "variant_metadata", "PRE_VARIANT_KINDS", "main"]

# Pre-tokenizer kinds recorded for every vocabulary (see `variant_metadata`).
# (llama.cpp names GPT-2's kind "gpt-2"; flashd also accepts "gpt2".)
PRE_VARIANT_KINDS = ("qwen2", "smollm", "llama-bpe", "gpt-2", "default")
# Extra tokens and merges for the variants: neither model's vocabulary has multi-digit tokens, so
# without them "\p{N}" and "\p{N}{1,3}" (and "\p{N}+") would tokenize alike.
_DIGIT_MERGES = ("1 2", "12 3", "4 5", "45 6")

# Random id sequences are drawn from this seed so that re-recording gives the same file.
_SEED = 20240601
_N_RANDOM_SEQUENCES = 8
_RANDOM_SEQUENCE_LEN = 40
_N_PIECE_SAMPLES = 400


def pieces_digest(pieces) -> str:
    """sha256 over the pieces of ids 0..n-1, each prefixed by its length (u32 little-endian),
    so that the digest pins down every piece, not just their concatenation."""
    h = hashlib.sha256()
    for piece in pieces:
        h.update(len(piece).to_bytes(4, "little"))
        h.update(piece)
    return h.hexdigest()


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def variant_metadata(metadata: dict, pre_kind: str) -> dict:
    """`tokenizer.*` metadata with `tokenizer.ggml.pre` set to `pre_kind` and the digit tokens
    of `_DIGIT_MERGES` appended (ids after the model's vocabulary, lowest merge priority)."""
    tokens = list(metadata["tokenizer.ggml.tokens"])
    new_tokens = ["".join(m.split(" ")) for m in _DIGIT_MERGES]
    if set(new_tokens) & set(tokens):
        raise ValueError(f"vocabulary already has some of {new_tokens}")
    return {
        **metadata,
        "tokenizer.ggml.pre": pre_kind,
        "tokenizer.ggml.tokens": tokens + new_tokens,
        "tokenizer.ggml.token_type": [int(t) for t in metadata["tokenizer.ggml.token_type"]]
        + [1] * len(new_tokens),  # NORMAL
        "tokenizer.ggml.merges": list(metadata["tokenizer.ggml.merges"]) + list(_DIGIT_MERGES),
    }


def _gguf_str(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _write_variant_gguf(reader, dst: Path, pre_kind: str) -> None:
    """A copy of the metadata of the GGUF open in `reader` (no tensors), `variant_metadata`
    applied."""
    src = Path(reader.data.filename)
    metadata = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.ggml.")}
    overrides = {k: v for k, v in variant_metadata(metadata, pre_kind).items()
                 if k in ("tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                          "tokenizer.ggml.token_type", "tokenizer.ggml.merges")}
    with open(src, "rb") as f:  # the metadata is at the start of the file
        raw = f.read(max(fld.offset + sum(p.nbytes for p in fld.parts)
                         for fld in reader.fields.values()))
    kvs = []
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):  # the reader's pseudo-fields for the header
            continue
        if name not in overrides:
            kvs.append(raw[field.offset:field.offset + sum(p.nbytes for p in field.parts)])
            continue
        value = overrides.pop(name)
        if name == "tokenizer.ggml.pre":
            encoded = struct.pack("<I", 8) + _gguf_str(value)
        elif name == "tokenizer.ggml.token_type":
            encoded = struct.pack("<IIQ", 9, 5, len(value)) + np.asarray(value, "<i4").tobytes()
        else:  # arrays of strings
            encoded = struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_gguf_str(v) for v in value)
        kvs.append(_gguf_str(name) + encoded)
    for name, value in overrides.items():  # e.g. a file without tokenizer.ggml.pre
        assert name == "tokenizer.ggml.pre", name
        kvs.append(_gguf_str(name) + struct.pack("<I", 8) + _gguf_str(value))
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)
    data += b"\0" * (-len(data) % 32)  # the (empty) data section starts aligned
    dst.write_bytes(data)


def _tokenize_pre_variants(gguf_path: Path, texts: list[str]) -> list[dict]:
    import llama_cpp

    import gguf

    reader = gguf.GGUFReader(gguf_path)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in PRE_VARIANT_KINDS:
            variant = Path(tmp) / f"{kind}.gguf"
            _write_variant_gguf(reader, variant, kind)
            llm = llama_cpp.Llama(model_path=str(variant), vocab_only=True, verbose=False)
            ids = [[int(t) for t in llm.tokenize(t.encode("utf-8"), add_bos=False, special=True)]
                   for t in texts]
            out.append({"pre": kind, "ids": ids})
            del llm
    return out


def record(gguf_path: Path, corpus: dict) -> dict:
    import llama_cpp  # imported here: only this script needs it

    llm = llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    null = llama_cpp.LLAMA_TOKEN_NULL

    def optional(token_id: int) -> int | None:
        return None if token_id == null else int(token_id)

    def piece(token_id: int, special: bool) -> bytes:
        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(vocab, token_id, buf, size, 0, special)
            if n >= 0:
                return buf.raw[:n]
            size = -n  # a negative result is the size needed

    def detokenize(ids: list[int], unparse_special: bool) -> bytes:
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        size = 64 + 16 * len(ids)
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, unparse_special)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def tokenize(text: str, special: bool) -> list[int]:
        return [int(t) for t in llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)]

    tokenized = [{"text": t, "special": True, "ids": tokenize(t, True)} for t in corpus["texts"]]
    tokenized += [{"text": t, "special": False, "ids": tokenize(t, False)}
                  for t in corpus["texts_no_special"]]

    pieces_special = [piece(i, True) for i in range(n_vocab)]
    pieces_plain = [piece(i, False) for i in range(n_vocab)]
    rng = random.Random(_SEED)
    control_ids = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, i)]
    sample_ids = sorted(set(rng.sample(range(n_vocab), _N_PIECE_SAMPLES)) | set(control_ids)
                        | set(range(min(300, n_vocab))) | set(range(max(0, n_vocab - 300), n_vocab)))

    sequences = [entry["ids"] for entry in tokenized[::7] if entry["ids"]]
    for entry in tokenized:  # cut multi-token characters in the middle: invalid UTF-8
        text, ids = entry["text"], entry["ids"]
        if any(ord(c) > 0x7FF for c in text) and len(ids) > 2:
            sequences.append(ids[:len(ids) // 2 + 1])
            sequences.append(ids[1:])
    sequences += [[rng.randrange(n_vocab) for _ in range(_RANDOM_SEQUENCE_LEN)]
                  for _ in range(_N_RANDOM_SEQUENCES)]
    detokenized = [{"ids": ids, "unparse_special": flag, "bytes_hex": detokenize(ids, flag).hex()}
                   for ids in sequences for flag in (True, False)]

    return {
        "comment": "llama.cpp tokenizer oracle; written by scripts/record_tokenizer_reference.py",
        "llama_cpp_python_version": llama_cpp.__version__,
        "gguf_file": gguf_path.name,
        "gguf_md5": _md5(gguf_path),
        "vocab": {
            "n_vocab": n_vocab,
            "bos_id": optional(llama_cpp.llama_vocab_bos(vocab)),
            "eos_id": optional(llama_cpp.llama_vocab_eos(vocab)),
            "eot_id": optional(llama_cpp.llama_vocab_eot(vocab)),
            "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
            "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
            "eog_ids": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)],
            "control_ids": control_ids,
        },
        "tokenize": tokenized,
        "pieces_sha256": {"special": pieces_digest(pieces_special),
                          "plain": pieces_digest(pieces_plain)},
        "piece_samples": [{"id": i, "special_hex": pieces_special[i].hex(),
                           "plain_hex": pieces_plain[i].hex()} for i in sample_ids],
        "detokenize": detokenized,
        "pre_variants": _tokenize_pre_variants(gguf_path, corpus["texts"]),
    }


def _format(result: dict) -> str:
    """JSON with one top-level key per line and one list item per line (reviewable diffs)."""
    lines = []
    for key, value in result.items():
        if isinstance(value, list):
            items = ",\n".join(" " + json.dumps(v, ensure_ascii=False) for v in value)
            lines.append(f"{json.dumps(key)}: [\n{items}\n]")
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main(argv: list[str] | None = None) -> int:
    repo = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", type=Path, help="GGUF files")
    parser.add_argument("--corpus", type=Path, default=repo / "tests/data/tokenizer/corpus.json")
    parser.add_argument("--out-dir", type=Path, default=repo / "tests/data/tokenizer")
    args = parser.parse_args(argv)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("record_tokenizer_reference needs llama-cpp-python (pip install llama-cpp-python)",
              file=sys.stderr)
        return 2
    corpus = json.loads(args.corpus.read_text(encoding="utf-8"))
    for gguf_path in args.models:
        if not gguf_path.is_file():
            print(f"{gguf_path}: no such file", file=sys.stderr)
            return 2
        result = record(gguf_path, corpus)
        out = args.out_dir / f"{gguf_path.stem}.json"
        out.write_text(_format(result), encoding="utf-8")
        print(f"{out}: {len(result['tokenize'])} tokenizations, {len(result['detokenize'])} "
              f"detokenizations", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
