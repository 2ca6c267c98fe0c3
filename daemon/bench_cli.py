"""The `flashd bench` command (see flashd.daemon.bench)."""
from __future__ import annotations

import sys

import click

from .serve_command import kv_type_options, kv_types_option, parse_tuning, size_option
from .vram_budget import DEFAULT_MARGIN


@click.command("bench")
@click.option("--model", "-m", "model", default=None, help="GGUF path or known model name (default model if omitted)")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("-p", "--prompt-sizes", default="512,8192", show_default=True, help="ppN tests (comma list; empty: none)")
@click.option("-n", "--gen-sizes", default="128", show_default=True, help="tgN tests (comma list; empty: none)")
@click.option("-d", "--depths", default="0,8192", show_default=True, help="depths for the tg tests")
@click.option("-r", "--reps", default=3, show_default=True, help="repetitions per test (median reported)")
@click.option("--max-ctx", default=None, type=int, help="default: what the tests need")
@click.option("--prefill-chunk", default=512, show_default=True)
@click.option("--forward", type=click.Choice(["persistent", "graph"]), default="graph", show_default=True,
              help="CUDA decode path: the one-launch persistent forward or the per-op graph (the table says which ran)")
@click.option("--vram-budget", metavar="SIZE", callback=size_option, default=None,
              help="As `flashd serve --vram-budget` (e.g. 24GiB): refuse to load what the plan says would not fit.")
@click.option("--vram-margin", metavar="SIZE", callback=size_option, default=f"{DEFAULT_MARGIN >> 20}MiB",
              show_default=True, help="As `flashd serve --vram-margin`.")
@click.option("--tuning", "tuning", metavar="FIELD=N,...", callback=lambda ctx, param, v: parse_tuning(v), default="",
              help="CUDA: launch tuning overrides for an A/B, e.g. gemv_rounds=0,pdl=0 (fields of flashd_tuning.h's "
                   "fd_tuning_t; the table prints the tuning in effect).")
@kv_type_options
def bench_command(model, device, prompt_sizes, gen_sizes, depths, reps, max_ctx, prefill_chunk, forward, vram_budget,
                  vram_margin, tuning, kv_type, kv_type_k, kv_type_v, kv_window):
    """llama-bench-like table of prefill and decode throughput, with % of the bandwidth roofline."""
    from ..clients.registry import DEFAULT_MODEL, resolve_model
    from .bench import format_table, run_bench
    from .config import EngineConfig
    from .engine import Engine

    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]   # noqa: E731
    tests = [f"pp{n}" for n in ints(prompt_sizes)]
    tests += [f"tg{n}" + (f"@d{d}" if d else "") for n in ints(gen_sizes) for d in ints(depths)]
    need = max([n for n in ints(prompt_sizes)] + [n + max(d, 1) + 1 for n in ints(gen_sizes) for d in ints(depths)]
               + [16])
    path = resolve_model(model or DEFAULT_MODEL)
    engine = Engine(EngineConfig(model=str(path), device=device, max_ctx=max_ctx or need,
                                 prefill_chunk=prefill_chunk, prefix_cache=False,   # every prefill measured cold
                                 forward=forward, vram_budget=vram_budget, vram_margin=vram_margin,
                                 kv_types=kv_types_option(kv_type, kv_type_k, kv_type_v, kv_window)))
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    in_effect = apply_tuning(engine.backend, tuning)   # before load: graphs are captured with it
    log(f"loading {path} on {engine.backend.name}")
    engine.load()
    cfg = engine.model.config
    f = engine.model.file
    embd = f.tensor("token_embd.weight").n_bytes
    copy_gbs = None
    note = ""
    if engine.backend.name == "cuda":
        from .backends.cuda.backend import measure_copy_gbs
        copy_gbs = measure_copy_gbs(engine.backend.device)
        info = engine.backend.info()
        note = (f"GPU: {info['name']}; roofline: measured device copy bandwidth {copy_gbs:.0f} GB/s / bytes read "
                f"per decode step")
        note += "\ntuning: " + ", ".join(f"{k}={v}" for k, v in in_effect.items())
        fwd = engine.ready_info()["forward"]
        note += f"\ndecode forward: {fwd['path']}" + (f" (plan {fwd['plan']})" if "plan" in fwd else
                                                      f" ({fwd['note']})")
    note += ("\n" if note else "") + f"KV cache: {engine.config.kv_types}"
    from .backends.kv_types import row_bytes
    kv = engine.config.kv_types                        # the roofline's K/V bytes per value, K and V averaged
    kv_elem = (row_bytes(kv.k, cfg.head_dim) + row_bytes(kv.v, cfg.head_dim)) / (2 * cfg.head_dim)
    results = run_bench(engine.runner, cfg, tests, reps=reps, weight_bytes=engine.model.file_weight_bytes,
                        embd_bytes=embd, copy_gbs=copy_gbs, log=log, kv_elem_bytes=kv_elem)
    plan = engine.vram_plan()
    vram = plan.lines() if plan is not None else None
    click.echo(format_table(cfg.name or path.name, engine.backend.name, path.stat().st_size, results, vram, note))


def apply_tuning(backend, changes: dict[str, int]) -> dict[str, int] | None:
    """The CUDA launch tuning in effect after `changes` (None on another backend, where changes are refused)."""
    if backend.name != "cuda":
        if changes:
            raise click.UsageError("--tuning applies to the CUDA backend only")
        return None
    native = backend.device.native
    try:
        return native.set_tuning(**changes) if changes else native.tuning()
    except (KeyError, RuntimeError) as exc:
        raise click.UsageError(f"--tuning: {exc}") from exc


