"""The training data's sources: installed Python / C sources only, never the flashd repository (its bench/
prompt set in particular); the rendered prompts contain no benchmark prompt."""
from __future__ import annotations

import json
from pathlib import Path

from flashd.train.data import REPO_ROOT, build_prompts, data_sources

BENCH_PROMPTS = REPO_ROOT / "bench" / "spec_prompts.jsonl"


def test_sources_are_installed_files_outside_the_repository():
    sources = data_sources()
    assert {s.kind for s in sources} >= {"stdlib"}
    for s in sources:
        assert REPO_ROOT not in s.root.parents and s.root != REPO_ROOT


def test_prompts_contain_no_benchmark_prompt():
    prompts = build_prompts(400, seed=1)
    assert len(prompts) == 400
    bench = [json.loads(line)["text"].strip() for line in BENCH_PROMPTS.read_text().splitlines() if line.strip()]
    assert bench
    for p in prompts:
        kind, rel, _ = p.origin.split(":", 2)
        assert kind in ("stdlib", "site", "include") and not Path(rel).is_absolute()
        assert not any(b in p.text for b in bench), p.origin
    assert any(p.chat for p in prompts) and any(not p.chat for p in prompts)


def test_the_daemon_and_cli_never_import_torch():
    """torch is an optional extra: importing the CLI (which registers train-drafter) and the daemon loads no torch."""
    import subprocess
    import sys
    code = ("import sys, flashd.clients.cli, flashd.daemon.server, flashd.train.data, flashd.train.command; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
