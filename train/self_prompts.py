"""Prompts the target writes itself: a short generic opener, then what the target samples after it.

Why: the file-based prompts (data.py) are snippets of Python and C sources, while users (and bench/spec_prompts.jsonl)
start the target with a line or two in any language or a question in prose, and the target then writes freely. A
drafter trained only on the first kind accepts 2.06 tokens a block on 8 unseen training-style prompts but 1.35 on 8
of the benchmark's (128 answer tokens each; bench/eval_drafter.py on the CPU, session 27). Letting the target
write the prompt itself gives data from the distribution it writes in, with nothing taken from any benchmark:

    raw    an opener from RAW_OPENERS (a language marker or a bare first word: "// Rust\\n", "-- SQL\\n",
           "Question:"), then up to `tokens` tokens sampled at `temperature`: the prompt; the target's greedy
           continuation of it is the answer.
    chat   the chat template's text before a user message's content (Magpie's observation: an instruction-tuned
           model asked to continue there writes a plausible user request), sampled up to the end-of-turn token;
           the request is rendered as a normal user turn and the greedy assistant answer is the answer.

Only the answers are trained on (the sampled part is prompt, as any prompt is): the labels stay the target's greedy
tokens. Sampling uses BatchDecoder's Gumbel-max at temperature > 0, seeded per shard.

Measured once, and lost (`train-drafter --self-prompts 0.4`, H100, session 27; the default is 0): in 5 generation
minutes the data was 3.66 M answer tokens instead of ~6 M (the eager sampling before each shard's answers, and
shorter answers: 12.6 K tok/s against ~20 K), 3,700 training steps in 9 minutes, and on bench/spec_prompts.jsonl
the drafter accepted less than the file-only drafter trained with 6.1 M tokens and 4,051 steps (chain 15: 1.82
tokens a step against 2.04; DDTree 22: 2.30 against 2.42). The comparison is confounded by the data volume; a
fair one keeps the tokens and steps equal; the sampling has since moved into the CUDA graph (BatchDecoder with the default generator).
"""
from __future__ import annotations

import random

import numpy as np

from .batch_decode import BatchDecoder

__all__ = ["RAW_OPENERS", "RAW", "CHAT", "opener_kinds", "chat_user_prefix", "complete_prompts"]

RAW, CHAT = 1, 2         # prompt kinds in prompts.npz ("kind"; 0: a rendered prompt from data.py)

# generic openers: a language marker or a bare first word, never a task
RAW_OPENERS = (
    "# Python\n", "#!/usr/bin/env python3\n", "import ", "def ", "class ", "from ",
    "// C\n#include <", "/* C */\n", "// C++\n#include <", "template <typename T>\n",
    "// Rust\n", "fn ", "use std::", "// Go\npackage ", "// Java\npublic class ", "// JavaScript\n", "const ",
    "function ", "// TypeScript\n", "#!/bin/bash\n", "#!/bin/sh\n", "-- SQL\n", "SELECT ", "CREATE TABLE ",
    "<!DOCTYPE html>\n", "# Makefile\n", "---\n", "{\n", "# ", "## ", "Question:", "Q:", "Problem:", "Task:",
    "Explain", "Why", "How", "What", "Write", "The", "In", "Step 1:", "Summary:", "Note:", "1.", "- ",
)


def opener_kinds(n: int, seed: int) -> list[tuple[int, str]]:
    """n (kind, opener) pairs: half raw (an opener of RAW_OPENERS), half chat (opener ""), in a seeded order."""
    rng = random.Random(seed * 7919 + 17)
    out = [(CHAT, "") if i % 2 else (RAW, rng.choice(RAW_OPENERS)) for i in range(n)]
    rng.shuffle(out)
    return out


def chat_user_prefix(template) -> str | None:
    """The template's text before a user message's content (with a system prompt the template adds by itself),
    or None when the template has no such split (no template: chat openers become raw openers)."""
    if template is None:
        return None
    mark = "\u2063FLASHD_USER\u2063"
    text = template.render([{"role": "user", "content": mark}], add_generation_prompt=False)
    i = text.find(mark)
    return text[:i] if i > 0 else None


def complete_prompts(target, tok, template, kinds: list[tuple[int, str]], tokens: int, temperature: float,
                     max_prompt: int, stop_ids: list[int], seed: int) -> list[np.ndarray]:
    """The finished prompts (token ids) for (kind, opener) pairs: each opener's sampled continuation, and for chat
    the sampled request rendered as a user turn with the generation prompt. A chat request that comes out empty,
    or a prompt over max_prompt tokens, is dropped. `seed` seeds the sampler: on CUDA the device's default
    generator (so the steps replay a CUDA graph, as greedy decoding does), elsewhere a torch.Generator."""
    from . import require_torch
    torch = require_torch()
    if target.device.type == "cuda":
        torch.cuda.manual_seed(seed)
        generator = None
    else:
        generator = torch.Generator(device=target.device).manual_seed(seed)
    prefix = chat_user_prefix(template)
    starts, kind_of = [], []
    for kind, opener in kinds:
        if kind == CHAT and prefix is not None:
            starts.append(np.asarray(tok.encode(prefix, add_special=True), np.int32))
        else:
            kind = RAW
            starts.append(np.asarray(tok.encode(opener or RAW_OPENERS[0], add_special=True), np.int32))
        kind_of.append(kind)
    if not starts:
        return []
    order = sorted(range(len(starts)), key=lambda i: len(starts[i]))
    sampled = BatchDecoder(target, [starts[i] for i in order], tokens, stop_ids, temperature=temperature,
                           generator=generator).run()
    stops = set(stop_ids)
    out = []
    for i, got in zip(order, sampled):
        got = got[:-1] if len(got) and int(got[-1]) in stops else got
        if kind_of[i] == RAW:
            ids = np.concatenate([starts[i], got]).astype(np.int32)
        else:
            request = tok.decode(got.tolist(), skip_special=True).strip()
            if not request:
                continue
            text = template.render([{"role": "user", "content": request}], add_generation_prompt=True)
            ids = np.asarray(tok.encode(text, add_special=True), np.int32)
        if 0 < len(ids) <= max_prompt:
            out.append(ids)
    return out
