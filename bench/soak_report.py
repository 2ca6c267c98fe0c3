"""bench/soak.py's output: the summary table and the JSON result of a run."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

__all__ = ["report", "as_json"]


def report(config, result) -> str:
    """The summary table (markdown) of a SoakResult."""
    ready = result.ready
    rows = [("model", f"{Path(ready.get('model', '?')).name} ({ready.get('backend')}, max_ctx {ready.get('max_ctx')})"),
            ("duration", f"{result.seconds:.0f} s"), *((k, str(v)) for k, v in sorted(result.counts.items())),
            ("output mismatches (a)", str(len(result.mismatches))),
            ("terminal-event violations (b)", str(len(result.violations))),
            ("unexpected errors", str(len(result.unexpected_errors)))]
    for name, m in result.memory.items():
        t = m["trend"]
        rows.append((f"{name} (c)", "not judged (too few samples after warm-up)" if t is None else
                     f"{t['start_mib']:.1f} -> {t['end_mib']:.1f} MiB: growth {t['growth_mib']:+.1f} MiB "
                     f"(limit {m['threshold_mib']} MiB), slope {t['slope_mib_per_min']:+.2f} MiB/min, "
                     f"peak {t['peak_mib']:.1f}, {t['n']} samples -> {'ok' if m['ok'] else 'FAIL'}"))
    rows.append(("result", "PASS" if result.ok else "FAIL"))
    width = max(len(k) for k, _ in rows)
    return "\n".join([f"| {'what'.ljust(width)} | value |", f"| {'-' * width} | --- |"]
                     + [f"| {k.ljust(width)} | {v} |" for k, v in rows])


def as_json(config, result) -> dict:
    """The JSON result: the config, the counts, every problem and every memory sample."""
    return {"config": asdict(config), "ok": result.ok, "seconds": round(result.seconds, 1), "counts": result.counts,
            "mismatches": result.mismatches, "violations": result.violations,
            "unexpected_errors": result.unexpected_errors, "memory": result.memory,
            "samples": [s.as_dict() for s in result.samples],
            "ready": {k: result.ready.get(k) for k in ("model", "backend", "max_ctx", "vocab_size", "drafts")}}
