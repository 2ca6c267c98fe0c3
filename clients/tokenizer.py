"""The model's tokenizer, rebuilt from a GGUF file's `tokenizer.*` metadata.

Only byte-level BPE (`tokenizer.ggml.model == "gpt2"`, used by Qwen2, SmolLM2, Llama 3, ...) is
supported. Encoding runs on the `tokenizers` library: a BPE model over the GGUF vocab and merges,
behind the pre-tokenizer regexes llama.cpp uses for the file's `tokenizer.ggml.pre` kind, with
CONTROL/USER_DEFINED tokens registered as added tokens so they are matched atomically in text.
Decoding is done here, from a per-id table of raw bytes, so that it is exact for any id sequence
(including ones that split a UTF-8 character) and so streaming can hold back incomplete characters.

The oracle is llama.cpp's tokenizer (tests/data/tokenizer/*.json, recorded by
scripts/record_tokenizer_reference.py); where llama.cpp and Hugging Face differ, this follows
llama.cpp, because GGUF files are produced for and checked against it.
"""
from __future__ import annotations

import codecs
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from gguf import GGUFReader, TokenType
from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from ..daemon.models.gguf_header import read_gguf_metadata

__all__ = [
    "Tokenizer", "StreamDecoder", "PRE_TOKENIZER_REGEXES", "read_gguf_metadata", "tokenizer_metadata",
]

# --- pre-tokenizer regexes, per `tokenizer.ggml.pre` kind -------------------------------------
# Copied from llama.cpp (src/llama-vocab.cpp). Each kind is a list of regexes applied in turn: a
# regex splits every piece produced so far into its matches and the text between matches (both
# kept), exactly like a sequence of HF `Split(..., behavior="isolated")` pre-tokenizers.

_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# The contraction group is spelled with explicit case classes (as llama.cpp does) instead of the
# tokenizer.json `(?i:...)`: Oniguruma's case folding would also match e.g. "'ſ" (long s).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3_REGEX = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

_REGEXES_LLAMA3 = (_LLAMA3_REGEX,)
_REGEXES_QWEN2 = (_QWEN2_REGEX,)
_REGEXES_STARCODER = (r"\p{N}", _GPT2_REGEX)  # digits split one by one, then GPT-2
_REGEXES_GPT2 = (_GPT2_REGEX,)
_REGEXES_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]")

PRE_TOKENIZER_REGEXES: Mapping[str, tuple[str, ...]] = {
    "default": _REGEXES_DEFAULT,
    "llama-bpe": _REGEXES_LLAMA3, "llama3": _REGEXES_LLAMA3, "llama-v3": _REGEXES_LLAMA3,
    "falcon3": _REGEXES_LLAMA3, "pixtral": _REGEXES_LLAMA3,
    "qwen2": _REGEXES_QWEN2, "deepseek-r1-qwen": _REGEXES_QWEN2,
    "smollm": _REGEXES_STARCODER, "starcoder": _REGEXES_STARCODER, "refact": _REGEXES_STARCODER,
    "command-r": _REGEXES_STARCODER, "codeshell": _REGEXES_STARCODER,
    "gpt2": _REGEXES_GPT2, "gpt-2": _REGEXES_GPT2, "phi-2": _REGEXES_GPT2, "mpt": _REGEXES_GPT2,
    "olmo": _REGEXES_GPT2,
}
# Kinds for which llama.cpp uses whole-word vocab hits before merging (`ignore_merges`) and whose
# default for `add_bos_token` (when the key is absent) is true.
_LLAMA3_KINDS = frozenset(k for k, v in PRE_TOKENIZER_REGEXES.items() if v is _REGEXES_LLAMA3)

# --- end-of-generation detection ---------------------------------------------------------------
# llama.cpp decides which tokens end generation partly by their text (llama-vocab.cpp, "maintain
# a list of tokens that cause end-of-generation"); mirrored so flashd stops where llama.cpp does,
# with one deliberate difference: only tokens the GGUF types as CONTROL qualify by text. (llama.cpp
# 0.3.36 also promotes NORMAL tokens with these texts, e.g. "</s>" in Qwen2's vocabulary, which is
# ordinary text there: HTML strike-through, and HF does not stop on it.)
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
})
# Fill-in-the-middle pad / repo-name / file-separator tokens also end generation in llama.cpp;
# they come from metadata keys, else from these texts (first match by id).
_FIM_EOG_TEXTS = {
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}

# Token types whose text is matched atomically in input and rendered verbatim on output.
_CONTROL_TYPES = frozenset({int(TokenType.CONTROL), int(TokenType.UNKNOWN)})
_USER_DEFINED = int(TokenType.USER_DEFINED)
_NORMAL = int(TokenType.NORMAL)


def _byte_level_alphabet() -> dict[int, int]:
    """GPT-2's byte -> code point map: printable latin-1 bytes map to themselves, the other 68
    bytes to U+0100.. in order, so every byte string is a printable str."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: b for b in printable}
    n_shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = 256 + n_shifted
            n_shifted += 1
    return mapping


def _byte_level_to_latin1_table() -> dict[int, str]:
    """str.translate table turning a byte-level token into a latin-1 str whose code points are
    the bytes. Code points 0..255 that the alphabet does not use (e.g. a raw "\n") decode, as in
    HF's ByteLevel decoder, to their own UTF-8 bytes."""
    table = {cp: chr(b) for b, cp in _byte_level_alphabet().items()}
    for cp in range(256):
        table.setdefault(cp, chr(cp).encode("utf-8").decode("latin-1"))
    return table


_BYTE_LEVEL_TO_LATIN1 = _byte_level_to_latin1_table()


def _byte_level_to_bytes(token: str) -> bytes:
    try:
        return token.translate(_BYTE_LEVEL_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:  # a code point outside the alphabet: keep its UTF-8, like HF
        return b"".join(_BYTE_LEVEL_TO_LATIN1[ord(c)].encode("latin-1")
                        if ord(c) in _BYTE_LEVEL_TO_LATIN1 else c.encode("utf-8") for c in token)


# --- GGUF metadata --------------------------------------------------------------------------------

# read_gguf_metadata: the fast header parser (flashd.daemon.models.gguf_header), re-exported here


def tokenizer_metadata(source: str | Path | GGUFReader | Mapping[str, object]) -> dict[str, object]:
    """The `tokenizer.*` metadata of a GGUF given as a path, an open `gguf.GGUFReader`, or the
    file's parsed metadata (a mapping, e.g. GGUFFile.metadata_dict: nothing is read again)."""
    if isinstance(source, Mapping):
        return {k: v for k, v in source.items() if k.startswith("tokenizer.")}
    if isinstance(source, GGUFReader):
        return {k: f.contents() for k, f in source.fields.items() if k.startswith("tokenizer.")}
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such GGUF file")
        return read_gguf_metadata(path, prefix="tokenizer.")
    raise TypeError(f"expected a GGUF path or gguf.GGUFReader, got {type(source).__name__}")


def _optional_id(metadata: Mapping[str, object], key: str, vocab_size: int) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    token_id = int(value)
    if token_id == 0xFFFFFFFF or token_id < 0:  # llama.cpp writes -1 (as u32) for "none"
        return None
    if token_id >= vocab_size:
        raise ValueError(f"{key} = {token_id} is outside the vocabulary (size {vocab_size})")
    return token_id


# --- the tokenizer -------------------------------------------------------------------------------

class Tokenizer:
    """Byte-level BPE tokenizer of one model. Thread-safe."""

    __slots__ = ("vocab_size", "bos_id", "eos_id", "eot_id", "pad_id", "add_bos", "add_eos",
                 "stop_ids", "special_ids", "added_ids", "pre_kind", "_tokens", "_token_bytes",
                 "_hf", "_encode_lock")

    def __init__(self, metadata: Mapping[str, object]):
        """Build from a GGUF's `tokenizer.*` metadata (see `tokenizer_metadata`)."""
        model_kind = metadata.get("tokenizer.ggml.model")
        if model_kind is None:
            raise ValueError("GGUF has no tokenizer (tokenizer.ggml.model is missing)")
        if model_kind != "gpt2":
            raise ValueError(f"unsupported tokenizer model {model_kind!r}: flashd supports only "
                             f"byte-level BPE ('gpt2')")
        pre_kind = str(metadata.get("tokenizer.ggml.pre") or "default")
        regexes = PRE_TOKENIZER_REGEXES.get(pre_kind)
        if regexes is None:
            raise ValueError(f"unsupported pre-tokenizer kind {pre_kind!r} (tokenizer.ggml.pre); "
                             f"supported: {', '.join(sorted(PRE_TOKENIZER_REGEXES))}")
        tokens = list(metadata.get("tokenizer.ggml.tokens") or [])
        if not tokens:
            raise ValueError("GGUF tokenizer has no tokens (tokenizer.ggml.tokens)")
        vocab_size = len(tokens)
        token_types = metadata.get("tokenizer.ggml.token_type")
        if token_types is None:
            token_types = [_NORMAL] * vocab_size
        token_types = [int(t) for t in token_types]
        if len(token_types) != vocab_size:
            raise ValueError(f"tokenizer.ggml.token_type has {len(token_types)} entries for "
                             f"{vocab_size} tokens")
        merges = metadata.get("tokenizer.ggml.merges")
        if merges is None:
            raise ValueError("byte-level BPE tokenizer without tokenizer.ggml.merges")
        # llama.cpp renames empty tokens so every token has a text.
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]

        self.vocab_size = vocab_size
        self.pre_kind = pre_kind
        self._tokens = tokens
        self.bos_id = _optional_id(metadata, "tokenizer.ggml.bos_token_id", vocab_size)
        self.eos_id = _optional_id(metadata, "tokenizer.ggml.eos_token_id", vocab_size)
        self.eot_id = _optional_id(metadata, "tokenizer.ggml.eot_token_id", vocab_size)
        self.pad_id = _optional_id(metadata, "tokenizer.ggml.padding_token_id", vocab_size)
        add_bos_default = pre_kind in _LLAMA3_KINDS
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos_default))
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
        if self.add_bos and self.bos_id is None:
            raise ValueError("tokenizer.ggml.add_bos_token is set but there is no bos_token_id")
        if self.add_eos and self.eos_id is None:
            raise ValueError("tokenizer.ggml.add_eos_token is set but there is no eos_token_id")

        self.special_ids = frozenset(i for i, t in enumerate(token_types) if t in _CONTROL_TYPES)
        self.added_ids = frozenset(i for i, t in enumerate(token_types) if t == _USER_DEFINED)
        self.stop_ids = self._find_stop_ids(metadata)
        # Raw bytes per id: byte-level decoding for NORMAL tokens, the stored text for
        # CONTROL/USER_DEFINED ones, nothing for UNUSED/BYTE/undefined (llama.cpp prints those
        # as empty for BPE vocabs).
        self._token_bytes: list[bytes] = [
            _byte_level_to_bytes(tok) if typ == _NORMAL
            else tok.encode("utf-8") if (typ in _CONTROL_TYPES or typ == _USER_DEFINED)
            else b""
            for tok, typ in zip(tokens, token_types)]
        self._hf = self._build_hf(tokens, merges, regexes, pre_kind)
        self._encode_lock = threading.Lock()

    def _find_stop_ids(self, metadata: Mapping[str, object]) -> frozenset[int]:
        control = sorted(self.special_ids)
        stop = {i for i in control if self._tokens[i] in _EOG_TEXTS}
        for role, texts in _FIM_EOG_TEXTS.items():
            fim_id = _optional_id(metadata, f"tokenizer.ggml.{role}_token_id", self.vocab_size)
            if fim_id is None:
                fim_id = next((i for i in control if self._tokens[i] in texts), None)
            if fim_id is not None:
                stop.add(fim_id)
        eom_id = _optional_id(metadata, "tokenizer.ggml.eom_token_id", self.vocab_size)
        stop.update(i for i in (self.eos_id, self.eot_id, eom_id) if i is not None)
        return frozenset(stop)

    def _build_hf(self, tokens: list[str], merges: Iterable[str], regexes: tuple[str, ...],
                  pre_kind: str) -> HFTokenizer:
        vocab = {tok: i for i, tok in enumerate(tokens)}  # duplicates: the last id wins, as in llama.cpp
        # Some vocabularies lack byte tokens that valid text rarely or never produces (SmolLM2
        # lacks 0xC0, 0xC1, 0xF1, 0xF2, 0xF5-0xFF and six ASCII control bytes). Such bytes are
        # dropped when encoding, by llama.cpp and HF alike (no unknown token in byte-level BPE).
        merge_pairs = []
        for n, merge in enumerate(merges):
            left, sep, right = merge.partition(" ")
            if not sep:
                raise ValueError(f"tokenizer.ggml.merges[{n}] = {merge!r} is not 'left right'")
            merge_pairs.append((left, right))
        try:
            model = models.BPE(vocab, merge_pairs, ignore_merges=pre_kind in _LLAMA3_KINDS)
        except Exception as exc:  # tokenizers raises a bare Exception for merges out of vocab
            raise ValueError(f"inconsistent BPE vocabulary/merges: {exc}") from exc
        hf = HFTokenizer(model)
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        # Added tokens bypass the pre-tokenizer and BPE. CONTROL ones are "special" (matched only
        # while encode_special_tokens is off); USER_DEFINED ones are always matched, as llama.cpp
        # does for its parse_special=false.
        hf.add_special_tokens([AddedToken(self._tokens[i], special=True, normalized=False)
                               for i in sorted(self.special_ids)])
        hf.add_tokens([AddedToken(self._tokens[i], special=False, normalized=False)
                       for i in sorted(self.added_ids)])
        return hf

    @classmethod
    def from_gguf(cls, source: str | Path | GGUFReader | Mapping[str, object]) -> "Tokenizer":
        """The tokenizer of a GGUF file given as a path, an open `gguf.GGUFReader`, or its parsed
        metadata (GGUFFile.metadata_dict)."""
        return cls(tokenizer_metadata(source))

    # -- encoding --

    def encode(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids of `text`.

        add_special: prepend BOS (append EOS) when the model's metadata asks for it.
        parse_special: match CONTROL tokens such as "<|im_end|>" in the text as single ids; when
        false they are tokenized as plain text. USER_DEFINED tokens are matched either way.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        with self._encode_lock:  # encode_special_tokens is tokenizer-wide state
            self._hf.encode_special_tokens = not parse_special
            ids = self._hf.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos:
            ids.insert(0, self.bos_id)
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    # -- decoding --

    def _check_id(self, token_id) -> int:
        try:
            as_int = int(token_id)
        except (TypeError, ValueError):
            raise ValueError(f"token id {token_id!r} is not an integer") from None
        if as_int != token_id or not 0 <= as_int < self.vocab_size:
            raise ValueError(f"token id {token_id!r} is out of range [0, {self.vocab_size})")
        return as_int

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (may be part of a UTF-8 character); b"" for unused ids."""
        return self._token_bytes[self._check_id(token_id)]

    def token_text(self, token_id: int) -> str:
        """The token as stored in the vocabulary (byte-level form, e.g. "Ġworld")."""
        return self._tokens[self._check_id(token_id)]

    def ids_bytes(self, ids: Iterable[int], *, skip_special: bool = False) -> bytes:
        """Concatenated raw bytes of `ids`; CONTROL tokens left out when `skip_special`."""
        table = self._token_bytes
        special = self.special_ids
        out = []
        for token_id in ids:
            token_id = self._check_id(token_id)
            if not (skip_special and token_id in special):
                out.append(table[token_id])
        return b"".join(out)

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of `ids`; byte sequences that are not valid UTF-8 become U+FFFD (as in HF)."""
        return self.ids_bytes(ids, skip_special=skip_special).decode("utf-8", errors="replace")

    def stream_decoder(self, *, skip_special: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, skip_special=skip_special)

    def __repr__(self) -> str:
        return (f"Tokenizer(gpt2/{self.pre_kind}, vocab_size={self.vocab_size}, bos={self.bos_id}, "
                f"eos={self.eos_id}, add_bos={self.add_bos})")


class StreamDecoder:
    """Incremental detokenizer: `feed` returns only text that is complete, holding back the bytes
    of a UTF-8 character split across tokens; the concatenation of all `feed` results and `flush`
    equals `Tokenizer.decode` of all ids."""

    __slots__ = ("_tokenizer", "_skip_special", "_utf8")

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: int | Iterable[int]) -> str:
        """Text that became complete with `ids` (one id or several)."""
        if not isinstance(ids, Iterable):
            ids = (ids,)
        return self._utf8.decode(self._tokenizer.ids_bytes(ids, skip_special=self._skip_special))

    def flush(self) -> str:
        """Whatever is held back (an incomplete character becomes U+FFFD); the decoder is then
        empty and can be reused."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
