"""Needle-in-a-haystack cases (bench/bench_niah.py, `flashd pflash-calibrate`): natural-looking filler generated here, one needle
(a random key and a random 7-digit value) at a random depth, and a question asking for the value.

Harder kinds (make_case(kind=...)), reported beside the single needle:
  multi    four needles of the same form with distinct keys at random depths; the question asks for one of them
           (the others are distractors: a compressor that keeps "a number" is not enough).
  two-hop  two facts far apart -- "The {key} project is run by the {team} team." in one half of the filler and
           "The secret number of the {team} team is {value}." in the other (depths 0.05-0.35 and 0.65-0.95, either
           order) -- and a question that needs both ("... of the team that runs the {key} project?").

The filler is built from sentence templates over small word lists (an invented town's daily
life), so it reads like prose but carries no information about the needle. Each case is sized
with the target's tokenizer to at most `n_tokens` prompt tokens (within ~1%, never above), as a
chat prompt (the model's own template) ending with the assistant header. Pass = the value's
digits appear in the model's answer.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["NiahCase", "make_case", "filler_sentence", "needle_positions", "KINDS"]

_SUBJECTS = ["The baker", "A fisherman", "The old librarian", "Her neighbour", "The mayor", "A young teacher",
             "The ferry captain", "My grandmother", "The carpenter", "A travelling musician", "The gardener",
             "The postwoman", "A retired sailor", "The innkeeper", "The miller's son"]
_VERBS = ["walked past", "repaired", "painted", "talked about", "remembered", "looked after", "visited",
          "wrote a letter about", "photographed", "sold", "cleaned", "described", "measured", "sketched"]
_OBJECTS = ["the harbour wall", "the blue bicycle", "the bell tower", "a basket of apples", "the river bridge",
            "the market square", "an old wooden boat", "the school garden", "the lighthouse", "a pile of letters",
            "the stone fountain", "the orchard gate", "the weather vane", "the bakery window"]
_TIMES = ["early in the morning", "after the rain stopped", "on a quiet Sunday", "before the market opened",
          "late in the afternoon", "during the autumn fair", "while the tide was low", "in the first week of spring"]
_COMMENTS = ["Nobody seemed to mind.", "It was an ordinary day in the town.", "The air smelled of salt and bread.",
             "Children were playing near the water.", "A few gulls circled overhead.",
             "The church clock struck the hour.", "Somewhere a dog barked twice.",
             "The shops were slowly filling with people.", "Clouds drifted in from the west."]
_KEY_WORDS = ["amber", "falcon", "willow", "cobalt", "harbor", "juniper", "lantern", "meadow", "orchid", "pepper",
              "quartz", "raven", "saffron", "thistle", "umber", "violet", "walnut", "zephyr", "copper", "indigo"]

QUESTION = "What is the secret number of the {key} project? Answer with the number only."
TWO_HOP_QUESTION = "What is the secret number of the team that runs the {key} project? Answer with the number only."
_TEAMS = ["north", "harbour", "granite", "silver", "evening", "lantern", "river", "summit", "orchard", "tide"]
KINDS = ("single", "multi", "two-hop")
N_MULTI = 4


@dataclass(slots=True, frozen=True)
class NiahCase:
    ids: list[int]         # the whole chat prompt, target token ids
    value: str             # the answer: 7 digits
    key: str
    depth: float           # where the needle holding the value sits in the filler, 0..1
    n_tokens: int
    kind: str = "single"   # KINDS


def filler_sentence(rng: random.Random) -> str:
    if rng.random() < 0.25:
        return rng.choice(_COMMENTS)
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TIMES)}."


def _render(template, tokenizer, sentences: list[str], needles: list[tuple[float, str]], question: str) -> list[int]:
    """The chat prompt: the filler with each (depth, sentence) needle inserted before sentence int(depth * n)."""
    n = len(sentences)
    at = sorted(((int(d * n), k, text) for k, (d, text) in enumerate(needles)))
    body_parts, prev = [], 0
    for i, _, text in at:
        body_parts += sentences[prev:i] + [text]
        prev = i
    body = " ".join(body_parts + sentences[prev:])
    content = f"Read the following text carefully.\n\n{body}\n\n{question}"
    if template is not None:
        text = template.render([{"role": "user", "content": content}], add_generation_prompt=True)
    else:
        text = content + "\n"
    return tokenizer.encode(text, add_special=True)


def _needles(rng: random.Random, kind: str) -> tuple[list[tuple[float, str]], str, str, str, float]:
    """(depth, sentence) needles, the question, the key, the value, the answer's depth -- for `kind`. The single
    needle's draws are those of the original generator, so its cases stay what they were for a seed."""
    key = f"{rng.choice(_KEY_WORDS)}-{rng.choice(_KEY_WORDS)}"
    value = str(rng.randrange(1_000_000, 10_000_000))
    if kind == "single":
        depth = rng.uniform(0.1, 0.9)
        return [(depth, f"The secret number of the {key} project is {value}.")], QUESTION.format(key=key), key, value, depth
    if kind == "multi":
        keys = [key]
        while len(keys) < N_MULTI:
            k = f"{rng.choice(_KEY_WORDS)}-{rng.choice(_KEY_WORDS)}"
            if k not in keys:
                keys.append(k)
        values = [value] + [str(rng.randrange(1_000_000, 10_000_000)) for _ in keys[1:]]
        depths = [rng.uniform(0.05, 0.95) for _ in keys]
        needles = [(d, f"The secret number of the {k} project is {v}.") for d, k, v in zip(depths, keys, values)]
        return needles, QUESTION.format(key=key), key, value, depths[0]
    if kind == "two-hop":
        team = rng.choice(_TEAMS)
        near, far = rng.uniform(0.05, 0.35), rng.uniform(0.65, 0.95)
        link_depth, fact_depth = (near, far) if rng.random() < 0.5 else (far, near)
        needles = [(link_depth, f"The {key} project is run by the {team} team."),
                   (fact_depth, f"The secret number of the {team} team is {value}.")]
        return needles, TWO_HOP_QUESTION.format(key=key), key, value, fact_depth
    raise ValueError(f"unknown case kind {kind!r}; known: {', '.join(KINDS)}")


def make_case(tokenizer, template, n_tokens: int, seed: int, kind: str = "single") -> NiahCase:
    """A case of at most n_tokens prompt tokens (kind: KINDS; single: the needle at a uniform depth in [0.1, 0.9])."""
    rng = random.Random(seed)
    needles, question, key, value, depth = _needles(rng, kind)
    # sentences are ~12 tokens: start a little over, then cut by bisection on the sentence count
    pool = [filler_sentence(rng) for _ in range(max(n_tokens // 9, 8))]
    while len(_render(template, tokenizer, pool, needles, question)) < n_tokens:
        pool += [filler_sentence(rng) for _ in range(len(pool) // 2 + 1)]
    lo, hi = 0, len(pool)                        # largest count whose prompt fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(_render(template, tokenizer, pool[:mid], needles, question)) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    ids = _render(template, tokenizer, pool[:lo], needles, question)
    return NiahCase(ids=ids, value=value, key=key, depth=depth, n_tokens=len(ids), kind=kind)


def needle_positions(tokenizer, case: NiahCase) -> list[int]:
    """Prompt positions of the value's tokens (its last occurrence: the question does not repeat it)."""
    want = tokenizer.encode(case.value)
    ids = case.ids
    for s in range(len(ids) - len(want), -1, -1):
        if ids[s:s + len(want)] == want:
            return list(range(s, s + len(want)))
    raise ValueError(f"value {case.value} not found as tokens {want} in the prompt")
