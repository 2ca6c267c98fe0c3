"""`flashd pflash-calibrate --drafter D`: measure and store D's PFlash setting (calibrate.py)."""
from __future__ import annotations

import sys
import time

import click


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
    if not values or not all(v >= 256 for v in values):
        raise click.BadParameter(f"lengths must be >= 256 tokens, got {text!r}")
    return values


@click.command("pflash-calibrate")
@click.option("--drafter", required=True, metavar="PATH|NAME", help="The PFlash drafter (--prefill-drafter) to calibrate.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--lengths", default="4096,8192", show_default=True, help="Prompt lengths of the needle cases (tokens).")
@click.option("--cases", type=click.IntRange(1, 100), default=4, show_default=True, help="Needle cases per length.")
@click.option("--keeps", default="0.02,0.03,0.05,0.1", show_default=True,
              help="Keep fractions to try (the smallest that keeps every needle wins, after the layer count).")
@click.option("--alpha", type=click.FloatRange(0.0, 1.0), default=0.7, show_default=True,
              help="FlashPrefill block threshold used while scoring (as --compress-alpha).")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@click.option("--dry-run", is_flag=True, help="Measure and print, but do not store.")
def calibrate_command(drafter, device, lengths, cases, keeps, alpha, seed, dry_run):
    """Find the drafter-layer window and keep fraction that keep the needle in generated
    needle-in-a-haystack cases at the least cost, and store them for `flashd serve --prefill-drafter`
    (used for whatever of --compress-layers / --compress-first-layer / --compress-keep is not given)."""
    from ...clients.chat_template import ChatTemplate
    from ...clients.registry import ModelFetchError, ModelNotFoundError, resolve_model
    from ...clients.tokenizer import Tokenizer
    from ..backends import select_backend
    from ..models import open_model
    from .calibrate import CalibrationFailed, calibrate, save_calibration
    from .config import PFlashConfig
    from .service import PrefillCompressor

    lengths, keeps = _ints(lengths), _floats(keeps)
    try:
        path = resolve_model(drafter)
    except (ModelNotFoundError, ModelFetchError) as exc:
        raise click.ClickException(str(exc)) from None
    log = lambda msg: print(f"[calibrate {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    opened, _ = open_model(path)
    tokenizer = Tokenizer.from_gguf(opened.metadata_dict)
    template = ChatTemplate.from_gguf(path)
    backend = select_backend(device)
    config = PFlashConfig(alpha=alpha, forward_chunk=1024)
    model = PrefillCompressor(backend, config, str(path), tokenizer).load()[0]
    log(f"{path.name} on {backend.name}: {len(lengths)} length(s) x {cases} case(s), keeps {keeps}")
    started = time.perf_counter()
    try:
        result = calibrate(model, tokenizer, template, path, lengths=lengths, cases=cases, keeps=keeps, alpha=alpha,
                           seed=seed, log=log)
    except CalibrationFailed as exc:
        raise click.ClickException(str(exc)) from None
    n = result.n_layers
    click.echo(f"{path.name}: score with layers [{result.score_from}, {result.score_layers}) of {n} "
               f"(the forward runs {result.score_layers}/{n} = {result.score_layers / n:.0%} of the drafter), "
               f"keep {result.keep:g}{' (also passes at the next smaller keep)' if result.margin else ''}; "
               f"{len(lengths) * cases} cases in {time.perf_counter() - started:.0f} s")
    if dry_run:
        return
    stored = save_calibration(result, path)
    click.echo(f"stored in {stored}; `flashd serve --prefill-drafter {drafter}` uses it for the compress settings "
               f"its command line does not give")
