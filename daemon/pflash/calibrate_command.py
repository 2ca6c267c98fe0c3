"""`flashd pflash-calibrate --drafter D`: measure and store D's PFlash setting per prompt length (calibrate.py;
stored by calibration_store.py, under the drafter's RoPE scaling)."""
from __future__ import annotations

import sys
import time

import click

from ..serve_command import rope_options, rope_override
from .needles import KINDS

MIN_LENGTH = 256        # tokens: shorter prompts have too few 32-token chunks for a keep fraction to mean much


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated fractions, got {text!r}") from None
    if not values or not all(0.0 < v <= 1.0 for v in values):
        raise click.BadParameter(f"fractions must be in (0, 1], got {text!r}")
    return values


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated token counts, got {text!r}") from None
    if not values or not all(v >= MIN_LENGTH for v in values):
        raise click.BadParameter(f"lengths must be >= {MIN_LENGTH} tokens, got {text!r}")
    if len(set(values)) != len(values):
        raise click.BadParameter(f"lengths must not repeat, got {text!r}")
    return sorted(values)


def _kinds(text: str) -> list[str]:
    values = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in values if k not in KINDS]
    if not values or unknown:
        raise click.BadParameter(f"unknown case kind(s) {', '.join(unknown) or '(none given)'}; "
                                 f"known: {', '.join(KINDS)}")
    if len(set(values)) != len(values):
        raise click.BadParameter(f"kinds must not repeat, got {text!r}")
    return values


@click.command("pflash-calibrate")
@click.option("--drafter", required=True, metavar="PATH|NAME", help="The PFlash drafter (--prefill-drafter) to calibrate.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--lengths", default="8192,32768", show_default=True,
              help="Prompt lengths of the cases (tokens, comma separated): one band each. Up to the drafter's "
                   "context (orig_ctx x factor under --rope-scaling: 131072 for Qwen2.5 with yarn x4).")
@click.option("--kinds", default=",".join(KINDS), show_default=True,
              help="Case kinds measured at every length (comma separated): single, multi (one asked for among four), "
                   "multi-all (four asked for), two-hop (two facts far apart).")
@click.option("--cases", type=click.IntRange(1, 100), default=4, show_default=True, help="Cases per length and kind.")
@click.option("--keeps", default="0.02,0.03,0.05,0.1", show_default=True,
              help="Keep fractions to try (the smallest that keeps every case's facts wins, after the layer count).")
@click.option("--alpha", type=click.FloatRange(0.0, 1.0), default=0.7, show_default=True,
              help="FlashPrefill block threshold used while scoring (as --compress-alpha).")
@click.option("--forward-chunk", type=click.IntRange(128), default=1024, show_default=True,
              help="Drafter tokens per forward (a multiple of 128; 4096 on a GPU). The scores depend on it only "
                   "through float rounding (sums in another order).")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@rope_options
@click.option("--merge", is_flag=True,
              help="Add these lengths' bands to the stored calibration (same drafter file, scaling, kinds, cases, "
                   "alpha and seed; a band of the same length is replaced): calibrate a few lengths at a time.")
@click.option("--require-margin", is_flag=True,
              help="Count a setting only if the next smaller --keeps value also keeps every case's facts there: slack "
                   "for prompts the calibration did not see, at the price of larger keeps or more layers.")
@click.option("--margin-from", type=click.IntRange(min=1), default=None, metavar="TOKENS",
              help="--require-margin at the lengths of at least TOKENS only (e.g. past the drafter's native "
                   "context, where a one-layer window proved fragile).")
@click.option("--dry-run", is_flag=True, help="Measure and print, but do not store.")
def calibrate_command(drafter, device, lengths, kinds, cases, keeps, alpha, forward_chunk, seed, rope_scaling,
                      rope_factor, rope_orig_ctx, merge, require_margin, margin_from, dry_run):
    """Find, for each prompt length, the drafter-layer window and keep fraction that keep every generated
    needle-in-a-haystack case's facts at the least cost, and store them with the drafter for `flashd serve
    --prefill-drafter` (with the same --rope-* options), which uses them by the prompt's length for whatever of
    --compress-layers / --compress-first-layer / --compress-keep its command line does not give."""
    from ...clients.chat_template import ChatTemplate
    from ...clients.registry import ModelFetchError, ModelNotFoundError, resolve_model
    from ...clients.tokenizer import Tokenizer
    from ..backends import select_backend
    from ..models import open_model
    from .calibrate import CalibrationFailed, calibrate
    from .calibrate import merge as merge_bands
    from .calibration_store import load_calibration, save_calibration
    from .config import PFlashConfig
    from .service import PrefillCompressor, drafter_token_limit

    lengths, keeps, kinds = _ints(lengths), _floats(keeps), _kinds(kinds)
    if require_margin and margin_from is not None:
        raise click.UsageError("--require-margin and --margin-from: give one (--require-margin is every length)")
    if require_margin:
        margin_from = 0
    if forward_chunk % 128:
        raise click.BadParameter(f"must be a multiple of 128, got {forward_chunk}", param_hint="--forward-chunk")
    rope = rope_override(rope_scaling, rope_factor, rope_orig_ctx)
    try:
        path = resolve_model(drafter)
    except (ModelNotFoundError, ModelFetchError) as exc:
        raise click.ClickException(str(exc)) from None
    opened, dcfg = open_model(path, rope)
    limit = drafter_token_limit(dcfg)
    if lengths[-1] > limit:
        hint = "" if rope else "; --rope-scaling yarn --rope-factor F extends it to orig_ctx x F"
        raise click.BadParameter(f"{lengths[-1]} tokens is past the drafter's {limit} (its context{hint})",
                                 param_hint="--lengths")
    log = lambda msg: print(f"[calibrate {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    tokenizer = Tokenizer.from_gguf(opened.metadata_dict)
    template = ChatTemplate.from_gguf(path)
    backend = select_backend(device)
    config = PFlashConfig(alpha=alpha, forward_chunk=forward_chunk)
    model = PrefillCompressor(backend, config, str(path), tokenizer, rope_override=rope).load()[0]
    log(f"{path.name} on {backend.name}{' under ' + str(rope) if rope else ''}: lengths {lengths}, kinds {kinds}, "
        f"{cases} case(s) each, keeps {keeps}")
    started = time.perf_counter()
    try:
        result = calibrate(model, tokenizer, template, path, lengths=lengths, cases=cases, keeps=keeps, alpha=alpha,
                           kinds=kinds, seed=seed, margin_from=margin_from, log=log)
    except CalibrationFailed as exc:
        raise click.ClickException(str(exc)) from None
    n = result.n_layers
    for b in result.bands:
        click.echo(f"{path.name} at {b.length} tokens: score with layers [{b.score_from}, {b.score_layers}) of {n} "
                   f"(the forward runs {b.score_layers}/{n} = {b.score_layers / n:.0%} of the drafter), keep "
                   f"{b.keep:g}{' (also passes at the next smaller keep)' if b.margin else ''}")
    click.echo(f"{len(lengths) * len(kinds) * cases} cases in {time.perf_counter() - started:.0f} s")
    if dry_run:
        return
    if merge:
        stored = load_calibration(path, result.rope, shipped=False)   # the user's own bands only
        if stored is not None:
            try:
                result = merge_bands(stored, result)
            except ValueError as exc:
                raise click.ClickException(f"--merge: {exc}") from None
    saved = save_calibration(result, path)
    click.echo(f"stored in {saved} (bands at {', '.join(str(b.length) for b in result.bands)} tokens); `flashd serve "
               f"--prefill-drafter {drafter}{' --rope-scaling ...' if result.rope else ''}` uses it for the compress "
               f"settings its command line does not give")
