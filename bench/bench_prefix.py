"""Prompt prefix reuse in an agent loop: time to first token per turn with the prefix cache on and
off, side by side on the same engine build and device.

    python bench/bench_prefix.py --model qwen2.5-coder-0.5b [--device cpu|cuda] [--system-tokens 3000]
        [--turns 6] [--side-requests] [--out bench/results/]

A conversation as a coding agent drives one: a long system prompt (tools, instructions: filler
prose from flashd.daemon.pflash.needles sized to --system-tokens), then --turns user turns; every turn re-sends the
whole conversation so far (the model's chat template) and generates --max-tokens greedy tokens,
which become the next turn's assistant message. With --side-requests an unrelated short request
(a title to summarise, say) runs between turns, which overwrites the KV cache: the host-RAM copies
(--prefix-cache-ram-mb) are what keeps the conversation's prefix then. Each configuration runs on
a fresh engine; TTFT is the engine's own (request start to first token). Outputs must be equal
across configurations (reuse is bit for bit a fresh prefill); the table says whether they were.
"""
from __future__ import annotations

import argparse
import datetime
import random
import sys
import time
from pathlib import Path

from flashd.bench.bench_niah import InProcess
from flashd.bench.out_files import write_md_json
from flashd.daemon.pflash.needles import filler_sentence as _sentence

CONFIGS = {"off": dict(prefix_cache=False), "on": dict(prefix_cache=True, prefix_cache_ram_mb=0),
           "on+ram": dict(prefix_cache=True)}


def log(msg: str) -> None:
    print(f"[prefix {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def system_prompt(tokenizer, n_tokens: int, seed: int) -> str:
    rng = random.Random(seed)
    text = "You are a careful coding assistant. Background notes follow.\n"
    while len(tokenizer.encode(text)) < n_tokens:
        text += " ".join(_sentence(rng) for _ in range(20)) + "\n"
    return text


def run_config(args, name: str, fields: dict) -> list[dict]:
    from flashd.clients.chat_template import ChatTemplate
    from flashd.clients.registry import resolve_model
    from flashd.daemon.config import EngineConfig
    from flashd.daemon.engine import Engine
    from flashd.protocol import messages as m

    path = resolve_model(args.model)
    engine = Engine(EngineConfig(model=str(path), device=args.device, max_ctx=args.max_ctx, **fields))
    engine.load()
    engine.start()
    try:
        client = InProcess(engine)
        template = ChatTemplate.from_gguf(path)
        tok = engine.tokenizer
        messages = [{"role": "system", "content": system_prompt(tok, args.system_tokens, args.seed)}]
        rows = []
        for turn in range(args.turns):
            messages.append({"role": "user", "content": f"Step {turn + 1}: write the next helper function."})
            ids = tok.encode(template.render(messages, add_generation_prompt=True))
            done = client.run(m.Generate(client.next_id(), ids=ids, max_tokens=args.max_tokens, stream=False,
                                         ignore_eos=True))        # the engine times the first token either way
            messages.append({"role": "assistant", "content": done["text"]})
            rows.append({"turn": turn + 1, "prompt_tokens": done["n_prompt"], "cached": done["n_cached"],
                         "ttft_ms": done["timings"]["ttft_ms"], "reply": done["ids"]})
            log(f"{name} turn {turn + 1}: {done['n_prompt']} tokens, {done['n_cached']} cached, "
                f"TTFT {done['timings']['ttft_ms']:.1f} ms")
            if args.side_requests:
                side = tok.encode(template.render([{"role": "user", "content": f"Give a title to: {turn} apples"}],
                                                  add_generation_prompt=True))
                client.run(m.Generate(client.next_id(), ids=side, max_tokens=4, stream=False))
        return rows
    finally:
        engine.stop(10.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--system-tokens", type=int, default=3000)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-ctx", type=int, default=8192)
    ap.add_argument("--side-requests", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    results = {name: run_config(args, name, fields) for name, fields in CONFIGS.items()}
    same = all(r["reply"] == o["reply"] for rows in results.values() for r, o in zip(rows, results["off"]))
    lines = [f"### Prefix reuse in an agent loop: {args.model}, {args.device}, system prompt ~{args.system_tokens} "
             f"tokens, {args.turns} turns x {args.max_tokens} tokens"
             f"{', a side request between turns' if args.side_requests else ''}; {datetime.date.today()}", "",
             "TTFT ms per turn (cached prompt tokens); `on` = the KV cache's prefix only, `on+ram` = with host-RAM "
             f"copies. Outputs equal across configurations: {'yes' if same else 'NO'}.", "",
             "| turn | prompt tokens | off | on | on+ram | off / on+ram |", "|---|---|---|---|---|---|"]
    for i, off in enumerate(results["off"]):
        on, ram = results["on"][i], results["on+ram"][i]
        lines.append(f"| {off['turn']} | {off['prompt_tokens']} | {off['ttft_ms']:.1f} | {on['ttft_ms']:.1f} "
                     f"({on['cached']}) | {ram['ttft_ms']:.1f} ({ram['cached']}) | "
                     f"{off['ttft_ms'] / ram['ttft_ms']:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        side = "-side" if args.side_requests else ""
        write_md_json(args.out, f"{datetime.date.today()}-{args.device}-prefix-reuse{side}", text,
                      {"args": {k: str(v) for k, v in vars(args).items()}, "results": results, "outputs_equal": same})
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
