"""Needle-in-a-haystack cases (bench/bench_niah.py, `flashd pflash-calibrate`): natural-looking filler generated here,
facts ("needles") holding random 7-digit values at seeded depths, and a question at the end.

Kinds (make_case(kind=...)), reported beside each other:
  single     one needle (a random key and value) at a uniform depth in [0.1, 0.9]; the question asks for its value.
  multi      four needles of the same form with distinct keys at random depths; the question asks for one of them
             (the others are distractors: a compressor that keeps "a number" is not enough).
  multi-all  four needles with distinct keys, one in each quarter of [0.05, 0.95] (spread depths); the question asks
             for all four values, naming the keys in a shuffled order. Pass = every value is in the answer.
  two-hop    two facts far apart -- "The {key} project is run by the {team} team." in one half of the filler and
             "The secret number of the {team} team is {value}." in the other (depths 0.05-0.35 and 0.65-0.95,
             either order) -- and a question that needs both ("... of the team that runs the {key} project?").

The filler is built from sentence templates over small word lists (an invented town's daily
life), so it reads like prose but carries no information about the needles. Each case is sized
with the target's tokenizer to at most `n_tokens` prompt tokens (within ~1%, never above), as a
chat prompt (the model's own template) ending with the assistant header. A case is a pure function
of (tokenizer, template, n_tokens, seed, kind). `NiahCase.passed(answer)`: every value the question
asks for appears in the answer. `NiahCase.facts`: the text a compressor must keep for the answer
(fact_positions maps it to prompt positions; pflash-calibrate requires them kept).
"""
from __future__ import annotations

import bisect
import hashlib
import math
import random
from dataclasses import dataclass

__all__ = ["NiahCase", "make_case", "filler_sentence", "needle_positions", "fact_positions", "answer_values", "case_seed",
           "KINDS", "ANSWER_VALUES"]

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
ALL_QUESTION = ("What are the secret numbers of the {keys} projects? Answer with the numbers only, in that order, "
                "separated by commas.")
TWO_HOP_QUESTION = "What is the secret number of the team that runs the {key} project? Answer with the number only."
_TEAMS = ["north", "harbour", "granite", "silver", "evening", "lantern", "river", "summit", "orchard", "tide"]
KINDS = ("single", "multi", "multi-all", "two-hop")
N_MULTI = 4          # needles of a multi case (one asked for, three distractors)
N_ALL = 4            # needles of a multi-all case, every one asked for
ANSWER_VALUES = {"single": 1, "multi": 1, "multi-all": N_ALL, "two-hop": 1}   # values an answer holds, by kind


@dataclass(slots=True, frozen=True)
class NiahCase:
    ids: list[int]             # the whole chat prompt, target token ids
    value: str                 # the (first) asked-for value: 7 digits
    key: str                   # its project key ("amber-falcon")
    depth: float               # where the needle holding `value` sits in the filler, 0..1
    n_tokens: int
    kind: str = "single"       # KINDS
    values: tuple[str, ...] = ()   # every value the answer needs (single, multi, two-hop: (value,))
    facts: tuple[str, ...] = ()    # the prompt text a compressor must keep for the answer (fact_positions)

    def passed(self, answer: str) -> bool:
        """Every asked-for value appears in the model's answer (substring: the value's 7 digits)."""
        return all(v in answer for v in answer_values(self))


def answer_values(case: NiahCase) -> tuple[str, ...]:
    """The values the question asks for (cases made before `values` existed ask for `value`)."""
    return case.values or (case.value,)


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


@dataclass(slots=True, frozen=True)
class _Drawn:
    needles: list[tuple[float, str]]   # (depth 0..1, sentence)
    question: str
    key: str
    value: str
    depth: float                       # of the needle holding `value`
    values: tuple[str, ...]
    facts: tuple[str, ...]


def _new_key(rng: random.Random, taken: list[str]) -> str:
    while True:
        k = f"{rng.choice(_KEY_WORDS)}-{rng.choice(_KEY_WORDS)}"
        if k not in taken:
            return k


def _needles(rng: random.Random, kind: str) -> _Drawn:
    """The needles, question and answer of `kind`. The single needle's draws are those of the original generator,
    and multi's and two-hop's those of their first version, so their cases stay what they were for a seed."""
    key = f"{rng.choice(_KEY_WORDS)}-{rng.choice(_KEY_WORDS)}"
    value = str(rng.randrange(1_000_000, 10_000_000))
    fact = f"The secret number of the {key} project is {value}."
    if kind == "single":
        # the value alone answers (it is the prompt's only 7-digit number): what must survive is its digits
        depth = rng.uniform(0.1, 0.9)
        return _Drawn([(depth, fact)], QUESTION.format(key=key), key, value, depth, (value,), (value,))
    if kind in ("multi", "multi-all"):
        n = N_MULTI if kind == "multi" else N_ALL
        keys = [key]
        while len(keys) < n:
            keys.append(_new_key(rng, keys))
        values = [value] + [str(rng.randrange(1_000_000, 10_000_000)) for _ in keys[1:]]
        if kind == "multi":
            depths = [rng.uniform(0.05, 0.95) for _ in keys]
        else:                          # one needle in each of n equal bands of [0.05, 0.95]
            width = 0.9 / n
            depths = [rng.uniform(0.05 + i * width, 0.05 + (i + 1) * width) for i in range(n)]
            rng.shuffle(depths)        # which key sits in which band
        facts = [f"The secret number of the {k} project is {v}." for k, v in zip(keys, values)]
        needles = list(zip(depths, facts))
        if kind == "multi":            # the asked-for sentence: key and value (the distractors share the form)
            return _Drawn(needles, QUESTION.format(key=key), key, value, depths[0], (value,), (facts[0],))
        order = list(range(n))
        rng.shuffle(order)             # the question names the keys in another order than the text
        asked = [keys[i] for i in order]
        question = ALL_QUESTION.format(keys=", ".join(asked[:-1]) + " and " + asked[-1])
        return _Drawn(needles, question, key, value, depths[0], tuple(values[i] for i in order), tuple(facts))
    if kind == "two-hop":
        team = rng.choice(_TEAMS)
        near, far = rng.uniform(0.05, 0.35), rng.uniform(0.65, 0.95)
        link_depth, fact_depth = (near, far) if rng.random() < 0.5 else (far, near)
        link, fact = f"The {key} project is run by the {team} team.", f"The secret number of the {team} team is {value}."
        return _Drawn([(link_depth, link), (fact_depth, fact)], TWO_HOP_QUESTION.format(key=key), key, value,
                      fact_depth, (value,), (link, fact))
    raise ValueError(f"unknown case kind {kind!r}; known: {', '.join(KINDS)}")


def _largest_fit(fits, n: int, guess: int, step: int = 8) -> int:
    """The largest k in [0, n] with fits(k) (fits is monotone: a longer prefix of the filler is a longer prompt; k = 0
    is taken to fit, make_case checks it), searched from `guess`: gallop to a bracket, then bisect. One fits() is a
    tokenization of the whole prompt, so a good guess saves most of a plain bisection's ~log2(n) calls; the answer
    is the same. step: the first gallop's stride (how far off the guess may be)."""
    if guess == 0 or fits(guess):
        lo = guess                                   # fits
        probe = lo + step
        while probe <= n and fits(probe):
            lo, step = probe, step * 2
            probe = lo + step
        hi = min(probe, n + 1) - 1                   # every count above hi does not fit (or is past the pool)
    else:
        hi = guess - 1
        probe = hi + 1 - step
        while probe > 0 and not fits(probe):
            hi, step = probe - 1, step * 2
            probe = hi + 1 - step
        lo = max(probe, 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def make_case(tokenizer, template, n_tokens: int, seed: int, kind: str = "single") -> NiahCase:
    """A case of at most n_tokens prompt tokens (kind: KINDS)."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    rng = random.Random(seed)
    drawn = _needles(rng, kind)
    needles, question = drawn.needles, drawn.question
    renders: dict[int, list[int]] = {}          # sentence count -> prompt ids (the pool only grows at its end)

    def render(k: int) -> list[int]:
        if k not in renders:
            renders[k] = _render(template, tokenizer, pool[:k], needles, question)
        return renders[k]

    # sentences are ~12 tokens: start a little over, then find the largest count that fits
    pool = [filler_sentence(rng) for _ in range(max(n_tokens // 9, 8))]
    while len(render(len(pool))) < n_tokens:
        pool += [filler_sentence(rng) for _ in range(len(pool) // 2 + 1)]
    # a guess from the mean tokens per sentence, corrected once by the guess's own length (one tokenization of the
    # whole prompt each: at 128K tokens the search is most of a case's time)
    bare = len(render(0))
    per_sentence = max((len(render(len(pool))) - bare) / len(pool), 1e-9)
    guess = min(max(int((n_tokens - bare) / per_sentence), 0), len(pool))
    guess = min(max(guess + math.floor((n_tokens - len(render(guess))) / per_sentence), 0), len(pool))
    lo = _largest_fit(lambda k: len(render(k)) <= n_tokens, len(pool), guess, step=2)
    ids = render(lo)
    if len(ids) > n_tokens:
        raise ValueError(f"n_tokens {n_tokens} is too small for the {kind} case's needles and question "
                         f"({len(ids)} tokens without filler)")
    return NiahCase(ids=ids, value=drawn.value, key=drawn.key, depth=drawn.depth, n_tokens=len(ids), kind=kind,
                    values=drawn.values, facts=drawn.facts)


def case_seed(stream: str, seed: int, length: int, kind: str, i: int) -> int:
    """The seed of case i of `kind` at `length` tokens. stream "bench": bench_niah's (single: its first version's
    formula, case 0 the warm-up, so results stay comparable across sessions; the other kinds offset by 500,000 per
    KINDS index); "calibrate": `flashd pflash-calibrate`'s, a disjoint stream (>= 2**40, above every bench seed for
    seeds below 10**6), so a calibration is never measured on the cases bench_niah then reports."""
    if kind not in KINDS:
        raise ValueError(f"unknown case kind {kind!r}; known: {', '.join(KINDS)}")
    if stream == "bench":
        return seed * 1_000_003 + length * 101 + 500_000 * KINDS.index(kind) + i
    if stream == "calibrate":
        digest = hashlib.sha256(f"calibrate/{seed}/{length}/{kind}/{i}".encode()).digest()
        return (1 << 40) + int.from_bytes(digest[:5], "little")
    raise ValueError(f"unknown seed stream {stream!r} (bench, calibrate)")


def needle_positions(tokenizer, case: NiahCase) -> list[int]:
    """Prompt positions of the value's tokens (its last occurrence: the question does not repeat it)."""
    want = tokenizer.encode(case.value)
    ids = case.ids
    for s in range(len(ids) - len(want), -1, -1):
        if ids[s:s + len(want)] == want:
            return list(range(s, s + len(want)))
    raise ValueError(f"value {case.value} not found as tokens {want} in the prompt")


def fact_positions(tokenizer, case: NiahCase) -> list[int]:
    """Ascending prompt positions of every token that overlaps one of the case's facts (each fact's last occurrence
    in the prompt's bytes; a token that straddles a fact's edge counts). Byte offsets, not re-tokenized text: a
    fact's tokens inside the prompt depend on the text before it."""
    ends, total = [], 0
    for t in case.ids:                           # byte end of each token
        total += len(tokenizer.token_bytes(t))
        ends.append(total)
    prompt = tokenizer.ids_bytes(case.ids)
    positions: set[int] = set()
    for fact in case.facts or (case.value,):
        want = fact.encode("utf-8")
        start = prompt.rfind(want)
        if start < 0:
            raise ValueError(f"fact {fact!r} not found in the {case.kind} case's prompt")
        stop = start + len(want)
        first = bisect.bisect_right(ends, start)          # first token ending after the fact's start
        last = bisect.bisect_left(ends, stop)             # the token holding the fact's last byte
        positions.update(range(first, last + 1))
    return sorted(positions)
