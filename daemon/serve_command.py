"""`flashd serve` (and `python -m flashd.daemon`): the daemon's command line -> ServeConfig -> serve().

The options are the daemon's whole configuration; daemon/server.py holds what they configure (the
front ends and the process life cycle).
"""
from __future__ import annotations

import click

from ..protocol import wire
from .backends.kv_types import KV_CACHE_TYPES, parse_kv_types
from .config import DEVICES, FORWARDS, MAX_TREE_NODES_OPTION, MIN_TREE_NODES
from .pflash.config import COMPRESS_MODES, DRAFTER_POLICIES, PFlashConfig
from .process import LOG_LEVELS
from .server import ServeConfig, serve
from .vram_budget import DEFAULT_MARGIN, SIZE_HELP, parse_size

__all__ = ["serve_command", "size_option", "kv_type_options", "kv_types_option", "rope_options", "rope_override",
           "parse_tuning"]

KV_TYPE_HELP = ("KV cache storage of K and V: f16 (the backend's unquantized cache), q8_0 (34 bytes per 32 values, "
                "~1.9x smaller) or q4_0 (18 bytes per 32, ~3.6x smaller); ggml's block formats and rounding. "
                "Quantized types need head_dim % 32 == 0. On CUDA a quantized cache runs the per-op graph decode "
                "(not --forward persistent); its kernels are new and not yet measured on a GPU.")


def parse_tuning(text: str) -> dict[str, int]:
    """'gemv_rounds=0,pdl=0' -> {'gemv_rounds': 0, 'pdl': 0}; field names are checked against the library."""
    out = {}
    for item in (t.strip() for t in (text or "").split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            raise click.BadParameter(f"{item!r}: expected FIELD=INTEGER") from None
        if not sep or not name.strip():
            raise click.BadParameter(f"{item!r}: expected FIELD=INTEGER")
    return out


def kv_type_options(command):
    """--kv-type (both), --kv-type-k, --kv-type-v, --kv-window: shared by `flashd serve` and `flashd bench`."""
    command = click.option("--kv-window", type=click.IntRange(0, 1 << 20), default=None,
                           help="Keep the current block of this many positions (a multiple of 64) at full precision "
                                "beside a quantized K / V: each token reads its own block's keys and values exact, "
                                "older blocks quantized. Default: 512 when K or V is q4_0, else none; 0: none. "
                                "--prefill-chunk must be a multiple of it.")(command)
    command = click.option("--kv-type-v", type=click.Choice(KV_CACHE_TYPES), default=None,
                           help="V's storage (default: --kv-type).")(command)
    command = click.option("--kv-type-k", type=click.Choice(KV_CACHE_TYPES), default=None,
                           help="K's storage (default: --kv-type).")(command)
    return click.option("--kv-type", type=click.Choice(KV_CACHE_TYPES), default=None,
                        help=KV_TYPE_HELP + " Default: f16.")(command)


def kv_types_option(kv_type, kv_type_k, kv_type_v, kv_window):
    """The KVTypes of the --kv-type* and --kv-window options (click.BadParameter for a window they cannot take)."""
    try:
        return parse_kv_types(kv_type, kv_type_k, kv_type_v, kv_window)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--kv-window") from None


def rope_options(command):
    """--rope-scaling, --rope-factor, --rope-orig-ctx: shared by `flashd serve` and `flashd pflash-calibrate`
    (rope_override() turns them into EngineConfig.rope_override)."""
    command = click.option("--rope-orig-ctx", type=click.IntRange(1, 1 << 30), default=None,
                           help="The context the model was trained at, for --rope-scaling (default: the GGUF's "
                                "original context, else its context_length). The positions it is meant to see grow "
                                "to orig_ctx * factor.")(command)
    command = click.option("--rope-factor", type=click.FloatRange(1.0, 1024.0), default=None,
                           help="Context extension factor for --rope-scaling (default: the GGUF's).")(command)
    return click.option("--rope-scaling", type=click.Choice(("none", "linear", "yarn")), default=None,
                        help="RoPE position scaling over what the GGUF says (e.g. Qwen2.5's model card: yarn with "
                             "factor 4 over its 32K context runs 128K). Default: the GGUF's rope.scaling "
                             "metadata.")(command)


def rope_override(rope_scaling: str | None, rope_factor: float | None, rope_orig_ctx: int | None) -> tuple | None:
    """The rope options as EngineConfig.rope_override ((kind, factor, orig_ctx) or None); a factor or original
    context without --rope-scaling is a usage error."""
    if rope_scaling is None and (rope_factor is not None or rope_orig_ctx is not None):
        raise click.UsageError("--rope-factor / --rope-orig-ctx need --rope-scaling linear|yarn")
    return None if rope_scaling is None else (rope_scaling, rope_factor, rope_orig_ctx)


def size_option(ctx, param, value):
    """click callback: a size like 24GiB (vram_budget.parse_size) -> bytes; None stays None."""
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("serve")
@click.option("--model", required=True, metavar="PATH|NAME", help="Target model: a GGUF path or a model name.")
@click.option("--draft", "drafts", multiple=True, metavar="PATH|NAME",
              help="Speculative-decoding drafter (repeatable; `ngram` is built in; `mtp`: the target's own "
                   "multi-token-prediction block, a qwen35 GGUF with nextn layers).")
@click.option("--prefill-drafter", metavar="PATH|NAME", help="PFlash prompt-scoring model.")
@click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True)
@click.option("--max-ctx", type=click.IntRange(16, 1 << 20), default=4096, show_default=True,
              help="Context slots: prompt + max_tokens must fit.")
@click.option("--zmq", "zmq_address", metavar="ADDR",
              help="Also serve ZeroMQ on a ROUTER socket: tcp://127.0.0.1:PORT (PORT may be *) or ipc://PATH.")
@click.option("--zmq-allow-remote", is_flag=True,
              help="Allow a non-loopback tcp:// address. ZeroMQ has no authentication: anyone who can reach the "
                   "address can use the model.")
@click.option("--no-stdin", is_flag=True, help="Do not read requests from stdin (needs --zmq).")
@click.option("--max-queue", type=click.IntRange(min=1), default=64, show_default=True,
              help="Requests waiting behind the running one; more are answered `overloaded`.")
@click.option("--max-request-bytes", type=click.IntRange(min=1), default=wire.MAX_FRAME_BYTES, show_default=True,
              help="Largest stdin line, ZeroMQ frame or @file.")
@click.option("--allow-files", "allow_files", multiple=True, metavar="DIR",
              help="Directory `ids=@PATH` prompt files may be read from (repeatable; symlinks and .. are resolved "
                   "first). Default: the system temp dir; `none`: no @file prompts.")
@click.option("--allow-models", "allow_models", multiple=True, metavar="DIR",
              help="Directory a request's `compress drafter=PATH` may load a GGUF from (repeatable), besides the "
                   "directories of --model/--draft/--prefill-drafter and the flashd model cache.")
@click.option("--prefix-cache/--no-prefix-cache", default=True, show_default=True,
              help="Keep the cached K/V of the previous prompt's common prefix (whole --prefill-chunk chunks; the "
                   "output is bit for bit that of an empty cache).")
@click.option("--prefill-chunk", type=click.IntRange(16, 16384), default=512, show_default=True, metavar="TOKENS",
              help="Prompt tokens per prefill forward. Larger chunks prefill long prompts faster on a GPU (the "
                   "projections' matrix products get taller: on an H100, a 4K-token prompt of the 1.5B model goes "
                   "~2x faster at 4096 than at 512, bench/NOTES.md) but cost activation memory (part of the "
                   "--vram-budget plan: ~0.19 MB a token for the 1.5B, 0.78 GB at 4096) and make prefix reuse "
                   "coarser: a prompt reuses whole chunks of its common prefix only.")
@click.option("--prefix-cache-ram-mb", type=click.IntRange(min=0), default=4096, show_default=True,
              help="Host RAM for copies of earlier prompts' prefixes, so that interleaved conversations each keep "
                   "theirs (0: only the one in the KV cache).")
@click.option("--forward", type=click.Choice(FORWARDS), default="graph", show_default=True,
              help="CUDA decode steps and draft verification: graph = the per-op CUDA graph; persistent = the whole "
                   "forward in one launch where the model allows (experimental: exact, but ~2x slower than graph on "
                   "an H100 today, bench/NOTES.md; status says which ran and why).")
@click.option("--keep-alive", "keep_alive", type=float, default=-1.0, show_default=True, metavar="SECONDS",
              help="Exit after this long with no request in flight (status and quit do not count); negative: "
                   "never.")
@click.option("--ready-file", metavar="PATH",
              help="Once serving, write the ready event with the daemon's pid here (JSON, replaced atomically); "
                   "removed at exit. How the CLI's resident daemons are found.")
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default="info", show_default=True)
@click.option("--compress", "compress_mode", type=click.Choice(COMPRESS_MODES), default="off", show_default=True,
              help="PFlash default for generate requests that do not say: auto compresses prompts longer than "
                   "--compress-threshold (needs --prefill-drafter).")
@click.option("--compress-threshold", type=click.IntRange(min=1), default=32000, show_default=True,
              help="Prompt tokens above which compress=auto compresses.")
@click.option("--compress-keep", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
              help="Default kept fraction of the prompt's 32-token chunks (default: the drafter's calibration for the "
                   "prompt's length, `flashd pflash-calibrate`, else 0.05).")
@click.option("--compress-alpha", type=click.FloatRange(0.0, 1.0), default=0.7, show_default=True,
              help="FlashPrefill block threshold of the drafter's sparse attention (0 = dense).")
@click.option("--compress-layers", type=click.IntRange(min=0), default=None,
              help="Drafter layers run to score tokens: the first N (0 = all; fewer is faster). Default: the "
                   "drafter's calibration for the prompt's length (`flashd pflash-calibrate`), else 0.")
@click.option("--compress-first-layer", type=click.IntRange(min=0), default=None,
              help="First drafter layer whose attention scores (below --compress-layers; earlier layers run "
                   "but do not count). Default: the drafter's calibration, else 0.")
@rope_options
@click.option("--drafter-policy", type=click.Choice(DRAFTER_POLICIES), default="resident", show_default=True,
              help="resident: the prefill drafter stays loaded; park: each compression parks the target, loads "
                   "the drafter, frees it and unparks the target (for GPUs that cannot hold both).")
@click.option("--vram-budget", metavar="SIZE", callback=size_option, default=None,
              help="Device memory the daemon may use, e.g. 24GiB: the target, its KV cache at --max-ctx, the "
                   "drafters, the prefill drafter and the workspaces are planned up front (`status` reports the "
                   "plan); what would not fit is refused at start, and a later load (unpark, compress "
                   f"drafter=...) is refused with `oom` while the daemon keeps serving. SIZE: {SIZE_HELP}. "
                   "Default: no budget (the free device memory is checked).")
@click.option("--vram-margin", metavar="SIZE", callback=size_option, default=f"{DEFAULT_MARGIN >> 20}MiB",
              show_default=True,
              help="The part of --vram-budget kept for what the plan does not itemize: the CUDA context, kernel "
                   "images, CUDA graphs, allocator rounding.")
@click.option("--max-tree-nodes", type=click.IntRange(MIN_TREE_NODES, MAX_TREE_NODES_OPTION), default=None,
              metavar="N",
              help="Nodes (root included) of the largest draft tree the target verifies, so speculative budgets "
                   "are clamped to N - 1 drafted nodes. A hybrid (Qwen3.5) target keeps a whole recurrent state per "
                   "node (~150 MB at the 27B shape). Default: 65 on the GPU and for a hybrid (the prefill chunk for a "
                   "dense model on the CPU), which --vram-budget lowers for a hybrid target that would not fit "
                   "otherwise (not below 9); a given N is kept as given.")
@click.option("--tuning", "tuning", metavar="FIELD=N,...", default="",
              callback=lambda ctx, param, v: parse_tuning(v),
              help="CUDA launch tuning overrides (flashd_tuning.h; `status` reports the table in effect), set before "
                   "anything is captured. E.g. gemv_rows=0: the one-row dp4a GEMV kernels for every format (on sm_90 the table "
                   "puts Q4_K / Q6_K projections on the multi-row tensor-core GEMV, gemv_rows=1 with "
                   "gemv_rows_formats=3), or gemv_rows_formats=15: Q8_0 / Q5_0 there too (coarser x codes).")
@kv_type_options
def serve_command(model, drafts, prefill_drafter, device, max_ctx, zmq_address, zmq_allow_remote, no_stdin,
                  max_queue, max_request_bytes, allow_files, allow_models, prefix_cache, prefill_chunk,
                  prefix_cache_ram_mb, forward, keep_alive, ready_file, log_level, compress_mode,
                  compress_threshold, compress_keep, compress_alpha, compress_layers, compress_first_layer,
                  rope_scaling, rope_factor, rope_orig_ctx, drafter_policy, vram_budget, vram_margin,
                  max_tree_nodes, tuning, kv_type, kv_type_k, kv_type_v, kv_window):
    """Run the daemon: requests on stdin (line dialect) and/or ZeroMQ, JSON events on stdout."""
    rope = rope_override(rope_scaling, rope_factor, rope_orig_ctx)
    given = {name: value for name, value in (("keep", compress_keep), ("score_layers", compress_layers),
                                             ("score_from", compress_first_layer)) if value is not None}
    try:
        config = ServeConfig(model=model, drafts=tuple(drafts), prefill_drafter=prefill_drafter, device=device,
                             max_ctx=max_ctx, zmq=zmq_address, zmq_allow_remote=zmq_allow_remote,
                             stdin=not no_stdin, max_queue=max_queue, max_request_bytes=max_request_bytes,
                             allow_files=tuple(allow_files) or None, allow_models=tuple(allow_models),
                             prefix_cache=prefix_cache, prefix_cache_ram_mb=prefix_cache_ram_mb,
                             prefill_chunk=prefill_chunk,
                             forward=forward, log_level=log_level, rope_override=rope,
                             vram_budget=vram_budget, vram_margin=vram_margin,
                             kv_types=kv_types_option(kv_type, kv_type_k, kv_type_v, kv_window),
                             max_tree_nodes=max_tree_nodes, tuning=tuple(tuning.items()),
                             keep_alive_s=None if keep_alive < 0 else keep_alive, ready_file=ready_file,
                             pflash=PFlashConfig(mode=compress_mode, threshold=compress_threshold,
                                                 alpha=compress_alpha, drafter_policy=drafter_policy, **given),
                             pflash_given=frozenset(given))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    raise SystemExit(serve(config))
