"""The synthetic models' tokenizer: GPT-2 byte-level BPE trained on a small embedded English + code
text, with ChatML's special tokens, in the id order of Qwen2.5's vocabulary (bytes, merges, specials).
"""
from __future__ import annotations

import functools
import re
from collections import Counter, defaultdict
from dataclasses import dataclass

import gguf

__all__ = ["N_BYTE_TOKENS", "SPECIAL_TOKENS", "SyntheticVocab", "build_vocab", "bytes_to_unicode"]

# Special tokens, appended after the byte and merge tokens (ChatML, as in Qwen2.5 and SmolLM2).
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
N_BYTE_TOKENS = 256

_TRAINING_TEXT = '''\
The quick brown fox jumps over the lazy dog. A language model reads text as a sequence of tokens
and predicts the next one. When the model is small, it runs fast on the local machine; when it is
large, the weights are stored in quantized formats and read from memory for every new token. This
is the reason that decoding at batch one is bound by memory bandwidth and by the time it takes to
launch the kernels, and not by the number of operations. Speculative decoding drafts several
tokens with a cheap model and then verifies all of them with one forward pass of the target, so
the output is exactly the same as plain greedy decoding while the number of passes goes down.
Hello, world! How are you today? I am fine, thank you. What is the answer to this question?
The user asked the assistant to write a function that returns the sum of the numbers in a list,
and the assistant wrote the function, tested it, and explained how it works in a few sentences.

def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return b


class Tokenizer:
    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]]) -> None:
        self.vocab = vocab
        self.merges = {pair: rank for rank, pair in enumerate(merges)}

    def encode(self, text: str) -> list[int]:
        tokens = [self.vocab[ch] for ch in text]
        return tokens


for i in range(10):
    print(f"value {i}: {i * i}")

import numpy as np
x = np.zeros((4, 8), dtype=np.float32)
result = {"name": "model", "layers": 24, "hidden_size": 1536, "vocab_size": 151936}
if result["layers"] > 0 and x.shape[0] == 4:
    print("ok", result)
else:
    raise ValueError("the model has no layers")
'''

# ASCII rendering of the qwen2 / llama-bpe pre-tokenizer pattern (the embedded text is ASCII):
# contractions | optional non-letter + letters | one digit | punctuation run | newlines | spaces.
_PRETOKEN_RE = re.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@functools.cache
def bytes_to_unicode() -> tuple[str, ...]:
    """GPT-2's printable character for each byte value 0..255 (index = byte)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return tuple(chr(table[b]) for b in range(256))


def _byte_tokens_in_vocab_order() -> list[str]:
    """The 256 byte tokens in GPT-2 / Qwen id order (printable bytes first: '!' is id 0)."""
    chars = bytes_to_unicode()
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    rest = [b for b in range(256) if b not in set(printable)]
    return [chars[b] for b in printable + rest]


@dataclass(slots=True, frozen=True)
class SyntheticVocab:
    tokens: tuple[str, ...]        # id -> token string (byte-level unicode form)
    token_types: tuple[int, ...]   # gguf.TokenType: NORMAL for bytes and merges, CONTROL for specials
    merges: tuple[str, ...]        # "left right", highest priority first
    bos_id: int
    eos_id: int
    pad_id: int


def _train_merges(text: str, max_merges: int) -> list[tuple[str, str]]:
    """Byte-level BPE merges learned from `text` (most frequent pair first, ties by pair order)."""
    chars = bytes_to_unicode()
    word_counts = Counter(_PRETOKEN_RE.findall(text))
    words = [[chars[b] for b in w.encode("utf-8")] for w in word_counts]
    freqs = list(word_counts.values())
    pair_counts: Counter[tuple[str, str]] = Counter()
    pair_words: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
    for i, w in enumerate(words):
        for pair in zip(w, w[1:]):
            pair_counts[pair] += freqs[i]
            pair_words[pair].add(i)

    merges: list[tuple[str, str]] = []
    while len(merges) < max_merges and pair_counts:
        best = min(pair_counts, key=lambda p: (-pair_counts[p], p))
        merges.append(best)
        joined = best[0] + best[1]
        for i in sorted(pair_words.pop(best)):
            old = words[i]
            for pair in zip(old, old[1:]):
                pair_counts[pair] -= freqs[i]
                if pair_counts[pair] == 0:
                    del pair_counts[pair]
            new: list[str] = []
            k = 0
            while k < len(old):
                if k + 1 < len(old) and (old[k], old[k + 1]) == best:
                    new.append(joined)
                    k += 2
                else:
                    new.append(old[k])
                    k += 1
            words[i] = new
            for pair in zip(new, new[1:]):
                pair_counts[pair] += freqs[i]
                pair_words[pair].add(i)
    return merges


@functools.cache
def build_vocab(vocab_size: int) -> SyntheticVocab:
    """256 byte tokens, merge tokens up to vocab_size - 3, then the 3 special tokens.

    Merges come from BPE on the embedded text; when the text has no pairs left (vocabularies larger
    than a few hundred merges, e.g. the real 151936), further merges extend existing tokens by one
    lowercase letter, in id order, so every token still comes from exactly one merge rule chain.
    """
    n_merge_tokens = vocab_size - N_BYTE_TOKENS - len(SPECIAL_TOKENS)
    tokens = _byte_tokens_in_vocab_order()
    known = set(tokens)
    merges: list[str] = []
    # Training can repeat a result string ("a"+"bc" and "ab"+"c"); such a rule adds no token, so
    # ask for enough rules and stop at the token count.
    for left, right in _train_merges(_TRAINING_TEXT, n_merge_tokens * 2):
        if len(tokens) - N_BYTE_TOKENS == n_merge_tokens:
            break
        merges.append(f"{left} {right}")
        if left + right not in known:
            known.add(left + right)
            tokens.append(left + right)
    letters = [bytes_to_unicode()[b] for b in range(ord("a"), ord("z") + 1)]
    stem = N_BYTE_TOKENS  # extend merge tokens in id order, including the ones made here
    while len(tokens) - N_BYTE_TOKENS < n_merge_tokens:
        # The newest token is the longest, so its extensions are new: stem never passes the end.
        assert stem < len(tokens)
        left = tokens[stem]
        stem += 1
        for letter in letters:
            if len(tokens) - N_BYTE_TOKENS == n_merge_tokens:
                break
            if left + letter not in known:
                known.add(left + letter)
                tokens.append(left + letter)
                merges.append(f"{left} {letter}")
    n_normal = len(tokens)
    tokens += SPECIAL_TOKENS
    token_types = [int(gguf.TokenType.NORMAL)] * n_normal + [int(gguf.TokenType.CONTROL)] * len(SPECIAL_TOKENS)
    endoftext, _, im_end = (n_normal + i for i in range(len(SPECIAL_TOKENS)))
    return SyntheticVocab(tuple(tokens), tuple(token_types), tuple(merges),
                          bos_id=endoftext, eos_id=im_end, pad_id=endoftext)
