"""flashd.clients.tokenizer against llama.cpp (recorded oracle) and on a synthetic vocabulary.

The oracle files tests/data/tokenizer/<gguf stem>.json were written by
scripts/record_tokenizer_reference.py with llama-cpp-python 0.3.36. Token ids are compared with
exact equality: tokenization is discrete, so there is no tolerance.
"""
from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import gguf
import numpy as np
import pytest

from flashd.clients.registry import KNOWN_MODELS
from flashd.clients.tokenizer import Tokenizer, read_gguf_metadata, tokenizer_metadata
from flashd.scripts.gguf_out import new_gguf
from flashd.scripts.record_tokenizer_reference import PRE_VARIANT_KINDS, pieces_digest, variant_metadata

DATA = Path(__file__).resolve().parent.parent / "data" / "tokenizer"
MODELS = ["qwen2.5-coder-0.5b", "smollm2-135m"]
CORPUS = json.loads((DATA / "corpus.json").read_text(encoding="utf-8"))
MULTIBYTE_TEXTS = [t for t in CORPUS["texts"] if any(ord(c) > 0x7F for c in t)]


@functools.lru_cache(maxsize=None)
def _tokenizer(path: Path) -> Tokenizer:  # one construction per GGUF per test session
    return Tokenizer.from_gguf(path)


@functools.lru_cache(maxsize=None)
def _reference(stem: str) -> dict:
    return json.loads((DATA / f"{stem}.json").read_text(encoding="utf-8"))


@pytest.fixture(params=MODELS)
def model(request, real_model):
    """(tokenizer, llama.cpp reference) of one real model."""
    path = real_model(request.param)
    reference = _reference(path.stem)
    # The oracle was recorded from the very file the registry pins (md5 of the whole file).
    assert reference["gguf_file"] == path.name
    assert reference["gguf_md5"] == KNOWN_MODELS[request.param].md5
    return _tokenizer(path), reference


def _promoted_by_llama_cpp(tok: Tokenizer, reference: dict) -> set[int]:
    """Ids llama.cpp treats as control although the GGUF types them NORMAL: it promotes tokens by
    text ("</s>" in Qwen2's vocab). flashd deliberately does not (see tokenizer.py); this returns
    that set and checks it holds nothing else, so any new divergence fails loudly."""
    promoted = set(reference["vocab"]["control_ids"]) - tok.special_ids
    assert {tok.token_text(i) for i in promoted} <= {"</s>"}
    return promoted


# ---- real models vs llama.cpp --------------------------------------------------------------------

def test_ids_equal_llama_cpp_on_corpus(model):
    tok, reference = model
    assert len(reference["tokenize"]) >= 60
    mismatches = []
    for entry in reference["tokenize"]:
        ids = tok.encode(entry["text"], parse_special=entry["special"])
        if ids != entry["ids"]:
            mismatches.append(f"{entry['text']!r} special={entry['special']}: flashd {ids} "
                              f"llama.cpp {entry['ids']}")
    assert not mismatches, "\n".join(mismatches)


@pytest.mark.slow  # builds five tokenizers per model (~3 s for Qwen2's vocabulary)
@pytest.mark.parametrize("name", MODELS)
def test_every_pre_kind_matches_llama_cpp(name, real_model):
    """The same vocabulary under each supported pre-tokenizer kind, plus a few multi-digit
    tokens so that digit grouping matters (see variant_metadata)."""
    path = real_model(name)
    reference = _reference(path.stem)
    assert [v["pre"] for v in reference["pre_variants"]] == list(PRE_VARIANT_KINDS)
    metadata = tokenizer_metadata(path)
    for variant in reference["pre_variants"]:
        tok = Tokenizer(variant_metadata(metadata, variant["pre"]))
        for text, expected in zip(CORPUS["texts"], variant["ids"], strict=True):
            assert tok.encode(text) == expected, (variant["pre"], text)


def test_vocab_facts_match_llama_cpp(model):
    tok, reference = model
    vocab = reference["vocab"]
    assert tok.vocab_size == vocab["n_vocab"]
    assert (tok.bos_id, tok.eos_id) == (vocab["bos_id"], vocab["eos_id"])
    assert (tok.add_bos, tok.add_eos) == (vocab["add_bos"], vocab["add_eos"])
    promoted = _promoted_by_llama_cpp(tok, reference)
    assert tok.special_ids == set(vocab["control_ids"]) - promoted
    assert tok.stop_ids == set(vocab["eog_ids"]) - promoted
    assert tok.eos_id in tok.stop_ids
    assert tok.encode("<|im_end|>") == [tok.eos_id]  # both models end a chat turn with it


def test_every_token_piece_matches_llama_cpp(model):
    tok, reference = model
    n = tok.vocab_size
    assert pieces_digest(tok.token_bytes(i) for i in range(n)) == reference["pieces_sha256"]["special"]
    promoted = _promoted_by_llama_cpp(tok, reference)
    plain = (b"" if i in promoted else tok.ids_bytes([i], skip_special=True) for i in range(n))
    assert pieces_digest(plain) == reference["pieces_sha256"]["plain"]
    for sample in reference["piece_samples"]:  # readable diagnostics for a sample of ids
        assert tok.token_bytes(sample["id"]).hex() == sample["special_hex"], sample


def test_detokenize_matches_llama_cpp(model):
    tok, reference = model
    for entry in reference["detokenize"]:
        expected = bytes.fromhex(entry["bytes_hex"])
        skip = not entry["unparse_special"]
        assert tok.ids_bytes(entry["ids"], skip_special=skip) == expected, entry["ids"]
        assert tok.decode(entry["ids"], skip_special=skip) == expected.decode("utf-8", "replace")


def test_decode_encode_round_trip(model):
    tok, _ = model
    # Bytes the vocabulary has no token for (SmolLM2 lacks e.g. 0x04) are dropped by encoding,
    # in llama.cpp too; the round trip holds for everything else.
    single_bytes = {tok.token_bytes(i) for i in range(tok.vocab_size)}
    for text in CORPUS["texts"]:
        representable = bytes(b for b in text.encode() if bytes([b]) in single_bytes).decode()
        assert tok.decode(tok.encode(text)) == representable
        assert tok.decode(tok.encode(text, parse_special=False)) == representable


def test_stream_decoder_one_id_at_a_time(model):
    tok, _ = model
    assert len(MULTIBYTE_TEXTS) >= 15
    n_split = 0  # texts where some token ends inside a UTF-8 character
    for text in MULTIBYTE_TEXTS:
        ids = tok.encode(text)
        n_split += any(_ends_mid_character(tok.ids_bytes(ids[:k])) for k in range(1, len(ids)))
        stream = tok.stream_decoder()
        chunks = [stream.feed(token_id) for token_id in ids]
        assert all("\ufffd" not in chunk for chunk in chunks), (text, chunks)
        assert "".join(chunks) + stream.flush() == text
        assert stream.flush() == ""
    assert n_split >= 5  # the test does exercise held-back partial characters


def _ends_mid_character(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.reason == "unexpected end of data"
    return False


def test_add_special_and_skip_special(model):
    tok, _ = model
    assert tok.add_bos is False  # both models: llama.cpp and the GGUF agree (checked above)
    assert tok.encode("hi", add_special=True) == tok.encode("hi")
    chat = "<|im_start|>user\nhi<|im_end|>"
    ids = tok.encode(chat)
    assert tok.decode(ids) == chat
    assert tok.decode(ids, skip_special=True) == "user\nhi"
    stream = tok.stream_decoder(skip_special=True)
    assert "".join(stream.feed(i) for i in ids) + stream.flush() == "user\nhi"


def test_construction_takes_the_fast_path(real_model, monkeypatch):
    """From a path, the tokenizer reads the GGUF with the bulk header parser (daemon/models/gguf_header.py),
    never with gguf.GGUFReader, whose ~900K numpy views cost ~10 s for this vocabulary. Checked by
    structure, not by a clock: a GGUFReader that cannot be built changes nothing. (The time itself is
    measured by bench/bench_startup.py.)"""
    path = real_model("qwen2.5-coder-0.5b")  # the 151936-token vocabulary

    def no_reader(self, *args, **kwargs):
        raise AssertionError("Tokenizer.from_gguf(path) built a gguf.GGUFReader (the slow path)")

    monkeypatch.setattr(gguf.GGUFReader, "__init__", no_reader)
    tok = Tokenizer.from_gguf(path)
    assert tok.vocab_size == 151936
    assert tok.decode(tok.encode("def fibonacci(n):")) == "def fibonacci(n):"


@pytest.mark.slow  # gguf.GGUFReader takes ~2 s to index SmolLM2's metadata
def test_from_open_gguf_reader_equals_from_path(real_model):
    path = real_model("smollm2-135m")
    from_reader = Tokenizer.from_gguf(gguf.GGUFReader(path))
    from_path = _tokenizer(path)
    for text in CORPUS["texts"][:30]:
        assert from_reader.encode(text) == from_path.encode(text)
    assert from_reader.stop_ids == from_path.stop_ids
    assert from_reader.special_ids == from_path.special_ids


# ---- synthetic vocabulary --------------------------------------------------------------------------

def _byte_level_alphabet() -> list[str]:
    """GPT-2 byte -> char table, written out independently of the module under test."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


BYTE_CHARS = _byte_level_alphabet()  # id b is the token of byte b
TINY_MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġwor l", "Ġworl d"]
TINY_EXTRA = [("he", 1), ("ll", 1), ("hell", 1), ("hello", 1), ("Ġw", 1), ("Ġwo", 1), ("Ġwor", 1),
              ("Ġworl", 1), ("Ġworld", 1), ("<|im_start|>", 3), ("<|im_end|>", 3), ("<tool>", 4),
              ("[PAD]", 5), ("<|endoftext|>", 3)]


def _tiny_metadata(**overrides) -> dict:
    tokens = BYTE_CHARS + [t for t, _ in TINY_EXTRA]
    types = [1] * 256 + [ty for _, ty in TINY_EXTRA]
    metadata = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": np.array(types, np.int32),
        "tokenizer.ggml.merges": TINY_MERGES,
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
        "tokenizer.ggml.add_bos_token": False,
    }
    metadata.update(overrides)
    return {k: v for k, v in metadata.items() if v is not None}


def _id(tok: Tokenizer, text: str) -> int:
    return next(i for i in range(tok.vocab_size) if tok.token_text(i) == text)


def test_byte_level_token_bytes():
    tok = Tokenizer(_tiny_metadata())
    for b in range(256):
        assert tok.token_bytes(b) == bytes([b])
    assert tok.token_bytes(_id(tok, "Ġworld")) == b" world"
    assert tok.token_text(_id(tok, "Ġworld")) == "Ġworld"
    assert tok.token_bytes(_id(tok, "<tool>")) == b"<tool>"        # added tokens: text as is
    assert tok.token_bytes(_id(tok, "<|im_end|>")) == b"<|im_end|>"
    assert tok.token_bytes(_id(tok, "[PAD]")) == b""               # UNUSED: prints nothing


def test_bpe_merges_and_pre_tokenizer():
    tok = Tokenizer(_tiny_metadata())
    assert tok.encode("hello world") == [_id(tok, "hello"), _id(tok, "Ġworld")]
    # qwen2 splits digits one by one and keeps "\n\n" apart from the following word
    assert tok.encode("12") == [ord("1"), ord("2")]
    assert tok.decode(tok.encode("hello\n\n world, 123!")) == "hello\n\n world, 123!"
    assert tok.encode("") == []


def test_special_and_added_tokens_are_atomic():
    tok = Tokenizer(_tiny_metadata())
    start, end, tool = _id(tok, "<|im_start|>"), _id(tok, "<|im_end|>"), _id(tok, "<tool>")
    assert tok.encode("<|im_start|>hello<|im_end|>") == [start, _id(tok, "hello"), end]
    as_text = tok.encode("<|im_start|>hello", parse_special=False)
    assert start not in as_text and tok.decode(as_text) == "<|im_start|>hello"
    # USER_DEFINED tokens are matched whether or not special tokens are parsed (as in llama.cpp)
    assert tok.encode("<tool>", parse_special=False) == [tool]
    assert tok.encode("x<tool>", parse_special=True) == [ord("x"), tool]
    assert tok.special_ids == {start, end, _id(tok, "<|endoftext|>")}
    assert tool not in tok.special_ids
    assert tok.stop_ids == {end, _id(tok, "<|endoftext|>")}
    assert tok.decode([start, _id(tok, "hello"), tool, end], skip_special=True) == "hello<tool>"


def test_add_special_prepends_bos_only_when_asked():
    tok = Tokenizer(_tiny_metadata(**{"tokenizer.ggml.add_bos_token": True}))
    bos = _id(tok, "<|endoftext|>")
    assert tok.encode("hello", add_special=True) == [bos, _id(tok, "hello")]
    assert tok.encode("hello") == [_id(tok, "hello")]
    with pytest.raises(ValueError, match="bos_token_id"):
        Tokenizer(_tiny_metadata(**{"tokenizer.ggml.add_bos_token": True,
                                    "tokenizer.ggml.bos_token_id": None}))


def test_llama3_pre_kind_defaults():
    tok = Tokenizer(_tiny_metadata(**{"tokenizer.ggml.pre": "llama-bpe",
                                      "tokenizer.ggml.add_bos_token": None}))
    assert tok.add_bos is True  # llama.cpp's default for llama3-style vocabularies
    assert tok.encode("1234") == [ord("1"), ord("2"), ord("3"), ord("4")]  # no 3-digit tokens here


@pytest.mark.parametrize("pre", ["qwen2", "smollm", "llama-bpe", "gpt2", "default"])
def test_each_pre_kind_round_trips(pre):
    tok = Tokenizer(_tiny_metadata(**{"tokenizer.ggml.pre": pre}))
    rng = random.Random(7)
    for text in CORPUS["texts"]:
        assert tok.decode(tok.encode(text)) == text
    for _ in range(50):  # random code points, including unassigned and control ones
        text = "".join(chr(rng.choice([rng.randrange(0x20, 0x7F), rng.randrange(0, 0x3000),
                                       rng.randrange(0xE000, 0x110000)])) for _ in range(12))
        assert tok.decode(tok.encode(text, parse_special=False)) == text


def test_decode_replaces_invalid_utf8_like_hf():
    tok = Tokenizer(_tiny_metadata())
    euro = "€".encode()  # 3 bytes
    assert tok.decode([euro[0], euro[1]]) == "\ufffd"       # truncated sequence: one U+FFFD
    assert tok.decode([0xFF, ord("a")]) == "\ufffda"        # invalid byte
    assert tok.decode([euro[0], ord("a"), euro[0]]) == "\ufffda\ufffd"


def test_stream_decoder_holds_partial_characters():
    tok = Tokenizer(_tiny_metadata())
    stream = tok.stream_decoder()
    emoji = "🤖".encode()  # 4 bytes, one byte token each
    assert [stream.feed(b) for b in emoji] == ["", "", "", "🤖"]
    assert stream.feed([ord("o"), ord("k")]) == "ok"
    assert stream.feed(emoji[0]) == ""
    assert stream.flush() == "\ufffd"  # an incomplete character at the end
    assert stream.feed(ord("x")) == "x"  # reusable after flush
    assert stream.feed([0xFF]) == "\ufffd"  # invalid bytes are not held back


def test_out_of_range_ids_are_rejected():
    tok = Tokenizer(_tiny_metadata())
    n = tok.vocab_size
    for bad in (n, -1, 10**12):
        with pytest.raises(ValueError, match=str(bad)):
            tok.decode([1, bad])
        with pytest.raises(ValueError, match=str(bad)):
            tok.token_bytes(bad)
    with pytest.raises(ValueError, match=str(n)):
        tok.stream_decoder().feed([n])
    with pytest.raises(ValueError, match="not an integer"):
        tok.decode(["a"])
    assert tok.decode(np.array([ord("h"), ord("i")], dtype=np.int32)) == "hi"
    with pytest.raises(TypeError):
        tok.encode(b"bytes")


def test_unsupported_model_and_pre_kinds_are_named():
    with pytest.raises(ValueError, match="'llama'"):
        Tokenizer(_tiny_metadata(**{"tokenizer.ggml.model": "llama"}))
    with pytest.raises(ValueError, match="'made-up-pre'"):
        Tokenizer(_tiny_metadata(**{"tokenizer.ggml.pre": "made-up-pre"}))
    with pytest.raises(ValueError, match="tokenizer.ggml.model"):
        Tokenizer(_tiny_metadata(**{"tokenizer.ggml.model": None}))
    with pytest.raises(ValueError, match="merges"):
        Tokenizer(_tiny_metadata(**{"tokenizer.ggml.merges": None}))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        Tokenizer(_tiny_metadata(**{"tokenizer.ggml.eos_token_id": 10**6}))
    with pytest.raises(ValueError, match="token_type"):
        Tokenizer(_tiny_metadata(**{"tokenizer.ggml.token_type": [1, 1]}))
    with pytest.raises(ValueError, match="merges"):
        Tokenizer(_tiny_metadata(**{"tokenizer.ggml.merges": ["h e", "x y"]}))  # y z not in vocab


def _write_tiny_gguf(path: Path, metadata: dict) -> None:
    with new_gguf(path, "llama") as writer:
        writer.add_tokenizer_model(metadata["tokenizer.ggml.model"])
        writer.add_tokenizer_pre(metadata["tokenizer.ggml.pre"])
        writer.add_token_list(metadata["tokenizer.ggml.tokens"])
        writer.add_token_types(metadata["tokenizer.ggml.token_type"].tolist())
        writer.add_token_merges(metadata["tokenizer.ggml.merges"])
        writer.add_bos_token_id(metadata["tokenizer.ggml.bos_token_id"])
        writer.add_eos_token_id(metadata["tokenizer.ggml.eos_token_id"])
        writer.add_add_bos_token(False)


def test_gguf_file_path_and_reader_agree(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(path, _tiny_metadata())
    from_path = Tokenizer.from_gguf(path)
    from_str = Tokenizer.from_gguf(str(path))
    from_reader = Tokenizer.from_gguf(gguf.GGUFReader(path))
    for tok in (from_path, from_str, from_reader):
        assert tok.encode("<|im_start|>hello world") == [_id(tok, "<|im_start|>"),
                                                          _id(tok, "hello"), _id(tok, "Ġworld")]
        assert tok.eos_id == _id(tok, "<|im_end|>")
    fast = read_gguf_metadata(path)
    assert fast["general.architecture"] == "llama"
    assert fast["tokenizer.ggml.tokens"] == _tiny_metadata()["tokenizer.ggml.tokens"]
    assert list(fast["tokenizer.ggml.token_type"]) == list(_tiny_metadata()["tokenizer.ggml.token_type"])
    assert tokenizer_metadata(path).keys() == {k for k in fast if k.startswith("tokenizer.")}


def test_bad_gguf_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_gguf(tmp_path / "missing.gguf")
    not_gguf = tmp_path / "not.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(ValueError, match="not a GGUF file"):
        Tokenizer.from_gguf(not_gguf)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="not a GGUF file"):
        Tokenizer.from_gguf(empty)
    good = tmp_path / "tiny.gguf"
    _write_tiny_gguf(good, _tiny_metadata())
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[:2000])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        Tokenizer.from_gguf(truncated)
    with pytest.raises(TypeError):
        Tokenizer.from_gguf(42)
