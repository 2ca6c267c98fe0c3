"""Self-distillation data: the target's own greedy answers to the prompts of data.py, saved in shards.

Route: batched greedy decoding of the torch target (target.py) with a KV cache, `gen_batch` prompts at a time
(left-padded; each sequence at its own RoPE positions), one CUDA graph replay per token on the GPU
(batch_decode.py). flashd's engine decodes one sequence at a time (~800 tok/s for the 1.5B on an H100), so 20
minutes would give < 1 M tokens; a batch of 256 decodes 256 sequences per
step for a few times the cost of one, which is what makes minutes of generation enough. The answers are the bf16 torch
target's greedy tokens: where two logits are within bf16 rounding they may differ from flashd's own greedy
choice, which only adds a little label noise (the drafter's labels are the target's argmax either way).

Files in the work folder:
    prompts.npz              the prompt plan, built once: ids (tokens int32 concatenated, offsets int64), kind int8
                             (0 rendered from data.py; self_prompts.RAW / CHAT: written by the target when its shard
                             is generated, ids empty) and opener (str, the start of a RAW one)
    data/shard-NNNNN.npz     tokens int32 (prompt + answer, concatenated), offsets int64 (n + 1,), prompt_len int32
    gen_state.json           {"seconds": generation time so far, "tokens": answer tokens so far, "done": bool}
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import numpy as np

from flashd.clients.chat_template import ChatTemplate
from flashd.clients.tokenizer import Tokenizer

from .batch_decode import BatchDecoder
from .data import build_prompts, data_sources
from .recipe import TrainConfig
from .self_prompts import complete_prompts, opener_kinds

__all__ = ["render_prompts", "plan_prompts", "generate", "load_samples", "gen_state"]


def render_prompts(target_path: Path, tc: TrainConfig, n: int) -> list[np.ndarray]:
    """Up to n prompts as token ids (int32), chat ones through the target's chat template; a prompt over
    tc.max_prompt tokens is shortened (its snippet halved) until it fits, or dropped."""
    tok = Tokenizer.from_gguf(target_path)
    template = ChatTemplate.from_gguf(target_path)
    out = []
    for p in build_prompts(n, seed=tc.seed, raw_fraction=tc.raw_fraction, mix=tc.data_mix,
                           wide_fraction=tc.wide_fraction, header_fraction=tc.header_fraction,
                           problem_fraction=tc.problem_fraction, task_fraction=tc.task_fraction):
        while p is not None:
            if p.chat and template is not None:
                text = template.render([{"role": "user", "content": p.text}], add_generation_prompt=True)
            else:
                text = p.text
            ids = tok.encode(text, add_special=True)
            if 0 < len(ids) <= tc.max_prompt:
                out.append(np.asarray(ids, np.int32))
                break
            p = p.shortened()
    return out


def plan_prompts(target_path: Path, tc: TrainConfig, n: int) -> tuple[list[np.ndarray], np.ndarray, list[str]]:
    """The run's n prompts: (ids, kind int8 (n,), opener): kind 0 a rendered prompt (its ids), kind RAW / CHAT one
    the target writes itself at generation time (ids empty, opener its start; self_prompts.py), a share
    tc.self_prompt_fraction spread evenly through the list."""
    n_self = round(n * tc.self_prompt_fraction)
    rendered = iter(render_prompts(target_path, tc, n - n_self))
    openers = iter(opener_kinds(n_self, tc.seed))
    ids, kinds, texts = [], [], []
    for j in range(n):
        own = (j * n_self) // n != ((j + 1) * n_self) // n
        item = next(openers, None) if own else next(rendered, None)
        if item is None:
            continue
        if own:
            ids.append(np.zeros(0, np.int32))
            kinds.append(item[0])
            texts.append(item[1])
        else:
            ids.append(item)
            kinds.append(0)
            texts.append("")
    return ids, np.asarray(kinds, np.int8), texts


def _save_npz(path: Path, **arrays) -> None:
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def _ragged(seqs: list[np.ndarray]) -> dict:
    offsets = np.zeros(len(seqs) + 1, np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    return {"tokens": np.concatenate(seqs).astype(np.int32) if seqs else np.zeros(0, np.int32), "offsets": offsets}


def _unragged(tokens, offsets) -> list[np.ndarray]:
    return [tokens[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def gen_state(work: Path) -> dict:
    p = work / "gen_state.json"
    return json.loads(p.read_text()) if p.exists() else {"seconds": 0.0, "tokens": 0, "done": False}


def _answer(target, prompts: list[np.ndarray], max_new: int, stop_ids: list[int], graph: bool | None = None):
    """Greedy answers (each ends with its stop token, or is max_new long) for a batch of prompts (batch_decode.py;
    graph None: a CUDA graph per step on the GPU)."""
    return BatchDecoder(target, prompts, max_new, stop_ids, graph=graph).run()


def generate(target, target_path: Path, work: Path, tc: TrainConfig, deadline: float,
             log: Callable[[str], None]) -> dict:
    """Generate shards until the data budget (tc.max_tokens, tc.gen_minutes summed over calls), the prompts or
    the deadline (time.monotonic()) run out; resumable shard by shard. Returns gen_state."""
    state = gen_state(work)
    if state["done"]:
        return state
    (work / "data").mkdir(parents=True, exist_ok=True)
    pfile = work / "prompts.npz"
    if not pfile.exists():
        t0 = time.monotonic()
        log("data sources: " + ", ".join(f"{s.kind}={s.root}/*{s.suffix}" for s in data_sources(tc.sources_mix)))
        prompts, kinds, openers = plan_prompts(target_path, tc, max(tc.gen_batch, tc.max_tokens // 200))
        _save_npz(pfile, **_ragged(prompts), kind=kinds, opener=np.asarray(openers, dtype=str))
        log(f"{int((kinds == 0).sum())} prompts rendered, {int((kinds != 0).sum())} to be written by the target, "
            f"in {time.monotonic() - t0:.0f} s")
    z = np.load(pfile)
    prompts = _unragged(z["tokens"], z["offsets"])
    kinds = z["kind"] if "kind" in z else np.zeros(len(prompts), np.int8)
    openers = z["opener"].tolist() if "opener" in z else [""] * len(prompts)
    tok = Tokenizer.from_gguf(target_path)
    template = ChatTemplate.from_gguf(target_path)
    stop_ids = sorted(tok.stop_ids)
    n_shards = (len(prompts) + tc.gen_batch - 1) // tc.gen_batch
    for i in range(n_shards):
        path = work / "data" / f"shard-{i:05d}.npz"
        if path.exists():
            continue
        if state["tokens"] >= tc.max_tokens or state["seconds"] >= tc.gen_minutes * 60:
            break
        if time.monotonic() >= deadline:
            return state
        t0 = time.monotonic()
        part = range(i * tc.gen_batch, min(len(prompts), (i + 1) * tc.gen_batch))
        batch = [prompts[j] for j in part if kinds[j] == 0]
        own = [(int(kinds[j]), openers[j]) for j in part if kinds[j] != 0]
        if own:       # the shard's self-written prompts, sampled with a seed of (seed, shard)
            batch += complete_prompts(target, tok, template, own, tc.self_prompt_tokens, tc.self_prompt_temperature,
                                      tc.max_prompt, stop_ids, tc.seed * 1_000_003 + i)
        batch = sorted(batch, key=len)
        answers = _answer(target, batch, tc.max_new, stop_ids) if batch else []
        seqs = [np.concatenate([p, a]) for p, a in zip(batch, answers)]
        _save_npz(path, **_ragged(seqs), prompt_len=np.array([len(p) for p in batch], np.int32))
        dt = time.monotonic() - t0
        n_new = int(sum(len(a) for a in answers))
        state["seconds"] += dt
        state["tokens"] += n_new
        (work / "gen_state.json").write_text(json.dumps(state))
        log(f"gen shard {i + 1}/{n_shards}: {n_new} answer tokens in {dt:.1f} s ({n_new / dt:.0f} tok/s); "
            f"total {state['tokens']} tokens, {state['seconds'] / 60:.1f} min")
    state["done"] = True
    (work / "gen_state.json").write_text(json.dumps(state))
    return state


def load_samples(work: Path) -> list[tuple[np.ndarray, int]]:
    """Every generated (prompt + answer ids, prompt length), in shard order."""
    out = []
    for path in sorted((work / "data").glob("shard-*.npz")):
        z = np.load(path)
        out.extend(zip(_unragged(z["tokens"], z["offsets"]), z["prompt_len"].tolist()))
    return out
