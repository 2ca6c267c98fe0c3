"""Where a benchmark's --out results go: its Markdown table and the same figures as JSON, side by side
(bench_prefix.py, bench_niah.py, bench_forward.py, lab_pflash_layers.py)."""
from __future__ import annotations

import json
from pathlib import Path


def write_md_json(out_dir: Path, name: str, text: str, data, **dumps_kwargs) -> Path:
    """out_dir/name.md (text) and out_dir/name.json (json.dumps(data, **dumps_kwargs)); out_dir is made if
    missing. The name's last dotted part is replaced, as Path.with_suffix does. Returns out_dir/name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / name
    stem.with_suffix(".md").write_text(text)
    stem.with_suffix(".json").write_text(json.dumps(data, **dumps_kwargs))
    return stem
