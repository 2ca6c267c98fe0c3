"""Lucebox's own pflash client against flashd-lucebox-daemon: does it get plain greedy decoding's tokens?

    python bench/check_lucebox_client.py --pflash PATH/TO/lucebox-hub/optimizations/pflash \
        --target MODEL.gguf --draft DRAFT.gguf [--n-gen 32] [--out bench/results/]

Lucebox's `DflashClient` (pflash/dflash_client.py in lucebox-hub, not vendored here: point --pflash at
a checkout) spawns the daemon binary it is given with its own flags (`--daemon --fast-rollback --ddtree
--ddtree-budget=16 --max-ctx=N --stream-fd=FD`), waits for `[daemon] ready`, parks the drafter, and then
talks over stdin and the stream fd. This script gives it flashd-lucebox-daemon as that binary and runs
the choreography its pflash pipeline runs: generate; park target, unpark target; generate again; unpark
the drafter and generate (speculative now); park it again and generate. Every answer must equal plain
greedy decoding of the same prompt ids, computed by flashd's own daemon (`flashd serve`, stdin dialect,
temperature 0). Prints a table and, with --out, writes it with the date, commit and machine.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from flashd.bench.out_files import commit_label


def plain_greedy(target: str, prompt_ids: list[int], n_gen: int, max_ctx: int) -> list[int]:
    """flashd serve's stdin dialect, greedy: the reference tokens."""
    request = f"generate id=ref ids={','.join(map(str, prompt_ids))} max_tokens={n_gen} temperature=0"
    proc = subprocess.run([sys.executable, "-m", "flashd.daemon", "--model", target, "--max-ctx", str(max_ctx),
                           "--log-level", "warning"], input=request + "\n", capture_output=True, text=True,
                          timeout=900)
    ids: list[int] = []
    for line in proc.stdout.splitlines():
        event = json.loads(line)
        if event.get("id") != "ref":
            continue
        if event["event"] == "token":
            ids += event["ids"]
        elif event["event"] == "error":
            raise SystemExit(f"reference run failed: {event}")
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pflash", required=True, help="lucebox-hub's optimizations/pflash folder")
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--n-gen", type=int, default=32)
    parser.add_argument("--max-ctx", type=int, default=2048)
    parser.add_argument("--prompt-ids", default="9707,11,1879,0,2679,525,498,30,358,1079,1661,13",
                        help="comma-separated prompt token ids (default: a short greeting in Qwen2.5's vocabulary)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    daemon_bin = shutil.which("flashd-lucebox-daemon")
    if daemon_bin is None:
        raise SystemExit("flashd-lucebox-daemon is not on PATH (pip install -e .)")
    # Lucebox's own client lives in an external checkout (not vendored, not installable from here):
    # the folder named by --pflash is put on the path for this one import, the only such edit in flashd
    sys.path.insert(0, str(Path(args.pflash).resolve()))
    from pflash.dflash_client import DflashClient

    prompt = [int(t) for t in args.prompt_ids.split(",")]
    reference = plain_greedy(args.target, prompt, args.n_gen, args.max_ctx)

    started = time.perf_counter()
    client = DflashClient(daemon_bin, args.target, args.draft, max_ctx=args.max_ctx, boot_timeout_s=900.0)
    boot_s = time.perf_counter() - started
    steps = []

    def step(name: str, action=None) -> None:
        if action is not None:
            action()
        t0 = time.perf_counter()
        tokens = client.generate(prompt, args.n_gen)
        steps.append({"step": name, "tokens": len(tokens), "equal": tokens == reference,
                      "seconds": round(time.perf_counter() - t0, 3), "first": tokens[:8]})

    try:
        step("generate (drafter parked at boot)")
        step("park target, unpark target, generate", lambda: (client.park_target(), client.unpark_target()))
        step("unpark drafter, generate (speculative)", client.unpark_draft)
        step("park drafter, generate", client.park_draft)
    finally:
        client.close()

    lines = [f"# Lucebox's pflash client against flashd-lucebox-daemon", "",
             f"date {datetime.date.today()}, commit {_commit()}, {platform.node()} ({platform.processor() or platform.machine()})",
             f"target {args.target}, draft {args.draft}, prompt {len(prompt)} ids, n_gen {args.n_gen}, "
             f"boot {boot_s:.1f} s; reference: flashd serve greedy, first ids {reference[:8]}", "",
             "| step | tokens | equal to plain greedy | seconds |", "| --- | ---: | --- | ---: |"]
    lines += [f"| {s['step']} | {s['tokens']} | {'yes' if s['equal'] else 'NO ' + str(s['first'])} | {s['seconds']} |"
              for s in steps]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{datetime.date.today()}-{platform.node()}-lucebox-client.md"
        path.write_text(text)
        print(f"wrote {path}")
    return 0 if all(s["equal"] and s["tokens"] == args.n_gen for s in steps) else 1


def _commit() -> str:
    return commit_label(Path(__file__).parent)


if __name__ == "__main__":
    raise SystemExit(main())
