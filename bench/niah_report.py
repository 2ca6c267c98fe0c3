"""bench_niah.py's Markdown: the headline table (the first case kind: dense, llama.cpp, PFlash), the sweep, and the
pass rates of every case kind by length (needles.py says what each kind is)."""
from __future__ import annotations

from pathlib import Path

__all__ = ["format_markdown", "pass_cell"]


def pass_cell(r: dict | None) -> str:
    """"19/20 (95%)" of a summarise() dict; "-" when the mode did not run."""
    if not r:
        return "-"
    return f"{r['pass']}/{r['n']} ({100 * r['pass'] / r['n']:.0f}%)"


def _pflash_label(results: dict) -> str:
    if results["mode"] == "auto":
        return f"PFlash auto (calibrated, threshold {results['threshold']})"
    return "PFlash"


def _header(results: dict) -> list[str]:
    dev = results["device"]
    if results["mode"] == "auto":
        setting = (f"PFlash = `generate compress=auto` with the drafter's stored calibration "
                   f"({results['calibration']['date']}: {results['bands_text']}), prompts above {results['threshold']} "
                   f"tokens compressed")
    else:
        setting = (f"headline keep={results['keep']}, alpha={results['alpha']}, drafter scoring layers="
                   f"{results['layers']}")
    rope = results.get("rope_scaling")
    return [f"# PFlash NIAH: {Path(results['target']).name} + drafter {Path(results['drafter']).name}", "",
            f"Device: {dev.get('name', dev)}. {results['cases']} cases per length and kind; {setting}; last "
            f"{results['last_chunks']} chunk(s) always kept; RoPE scaling {rope or 'none'}. TTFT = median seconds from "
            f"request to first token (PFlash: compression + prefill of the kept ids; llama.cpp: prompt tokens / "
            f"llama-bench pp tok/s, -fa 1). Pass = every value the question asks for is in the answer.", ""]


def format_markdown(results: dict) -> str:
    first = results["kinds"][0]
    label = _pflash_label(results)
    lines = _header(results) + [
        f"## {first} (headline)", "",
        f"| tokens | flashd dense pass | flashd dense TTFT s | llama.cpp TTFT s | {label} pass | PFlash TTFT s "
        "| kept tokens | vs llama.cpp | vs flashd dense |",
        "|---|---|---|---|---|---|---|---|---|"]
    for row in results["lengths"].values():
        dense, pf, ll = row.get("dense"), row["pflash"], row.get("llama")
        cells = [str(int(row["prompt_tokens"])), pass_cell(dense),
                 f"{dense['ttft_s']:.3f}" if dense else "-",
                 f"{ll['ttft_s']:.3f}" if ll else "-",
                 pass_cell(pf), f"{pf['ttft_s']:.3f}", str(int(pf["kept_tokens"])),
                 f"{ll['ttft_s'] / pf['ttft_s']:.1f}x" if ll else "-",
                 f"{dense['ttft_s'] / pf['ttft_s']:.1f}x" if dense else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    sweeps = [(row, s) for row in results["lengths"].values() for s in row.get("sweep", [])]
    if sweeps:
        lines += ["", "## Sweep (PFlash pass rate, median TTFT s, kept tokens)", "",
                  "| tokens | keep | alpha | drafter layers | pass | TTFT s | kept tokens |", "|---|---|---|---|---|---|---|"]
        for row, s in sweeps:
            lines.append(f"| {int(row['prompt_tokens'])} | {s['keep']} | {s['alpha']} | {s.get('layers', 'all')} | "
                         f"{pass_cell(s)} | {s['ttft_s']:.3f} | {int(s['kept_tokens'])} |")
    lines += ["", f"## Case kinds by length (pass: flashd dense / {label})", "",
              "| tokens | kind | dense pass | PFlash pass | PFlash TTFT s | kept tokens | settings that ran |",
              "|---|---|---|---|---|---|---|"]
    for row in results["lengths"].values():
        for kind, r in row["kinds"].items():
            pf = r["pflash"]
            lines.append(f"| {int(r['prompt_tokens'])} | {kind} | {pass_cell(r.get('dense'))} | {pass_cell(pf)} | "
                         f"{pf['ttft_s']:.3f} | {int(pf['kept_tokens'])} | {', '.join(pf.get('settings', [])) or '-'} |")
    return "\n".join(lines) + "\n"
