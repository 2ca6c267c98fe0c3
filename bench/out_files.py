"""Where a benchmark's --out results go: its Markdown table and the same figures as JSON, side by side
(bench_prefix.py, bench_niah.py, bench_forward.py, lab_pflash_layers.py), and the commit its title names."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path


def commit_label(where: Path | None = None) -> str:
    """The short commit of the checkout holding `where` (default: this folder), with "+dirty" when tracked files
    differ from it -- a GPU host's copy of a working tree whose git metadata is older than the files it runs would
    otherwise be labelled with a commit that is not the code measured -- or "?" without git."""
    cwd = Path(where) if where is not None else Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=cwd)
        if head.returncode != 0 or not head.stdout.strip():
            return "?"
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                 text=True, cwd=cwd)
    except OSError:
        return "?"
    return head.stdout.strip() + ("+dirty" if changed.returncode != 0 or changed.stdout.strip() else "")


def file_label(label: str) -> str:
    """commit_label's text as part of a file name: "+" -> "-" and "?" -> "unknown" (a GPU host's file return refuses
    names with such characters: session 33's "+dirty" result files were left on the host)."""
    return label.replace("+", "-").replace("?", "unknown")


def write_md_json(out_dir: Path, name: str, text: str, data, **dumps_kwargs) -> Path:
    """out_dir/name.md (text) and out_dir/name.json (json.dumps(data, **dumps_kwargs)); out_dir is made if
    missing. The name's last dotted part is replaced, as Path.with_suffix does. Returns out_dir/name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / name
    stem.with_suffix(".md").write_text(text)
    stem.with_suffix(".json").write_text(json.dumps(data, **dumps_kwargs))
    return stem
