"""`flashd http`: serve the OpenAI/Anthropic gateway with uvicorn, in front of a running daemon
(--daemon ADDR) or of a private daemon started on --model (clients/spawn.py) and stopped on exit."""
from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

import click

from ...protocol.messages import MAX_BUDGET, SPEC_MODES
from .config import DEFAULT_MAX_BODY_BYTES, GatewayConfig

__all__ = ["http_command", "serve"]

GRACEFUL_SHUTDOWN_S = 5.0  # streams still open at Ctrl-C get this long, then are cut (and cancelled)


def serve(link, config: GatewayConfig, *, verbose: bool = False) -> None:
    """Run the gateway until interrupted (blocking)."""
    import uvicorn

    from .app import create_app

    uvicorn.run(create_app(link, config), host=config.host, port=config.port,
                log_level="info" if verbose else "warning", access_log=verbose,
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)


@contextlib.contextmanager
def _daemon_client(daemon: str | None, model: str | None, device: str | None, max_ctx: int | None,
                   verbose: bool, timeout_s: float, drafts: tuple[str, ...] = ()) -> Iterator[tuple[object, str | None]]:
    """(client, model file to read the tokenizer from, or None for the daemon's own)."""
    from ..cli import _resolve
    from ..client import Client
    from ..registry import DEFAULT_MODEL
    from ..spawn import DaemonOptions, DaemonStartError, LocalDaemon

    if daemon is not None:
        model_path = str(_resolve(model)) if model is not None else None
        try:
            client = Client(daemon, timeout_s=timeout_s)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--daemon") from None
        with client:
            yield client, model_path
        return
    model_path = str(_resolve(model or DEFAULT_MODEL))
    options = DaemonOptions(model=model_path, device=device, max_ctx=max_ctx,
                            log_level="info" if verbose else "warning",
                            extra_args=tuple(a for d in drafts for a in ("--draft", d)))
    try:
        local = LocalDaemon.start(options)
    except DaemonStartError as exc:
        raise click.ClickException(str(exc)) from None
    with local, local.connect(timeout_s=timeout_s) as client:
        yield client, model_path


@click.command("http")
@click.option("--daemon", metavar="ADDR",
              help="Serve a running daemon (tcp://127.0.0.1:PORT or ipc://PATH) instead of starting one.")
@click.option("--model", "-m", metavar="NAME|PATH",
              help="Model to start a daemon with (default: qwen2.5-coder-0.5b); with --daemon, the GGUF to "
                   "read the tokenizer and chat template from (default: the file the daemon reports).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=None,
              help="Device of a started daemon (default: auto).")
@click.option("--max-ctx", type=click.IntRange(16, 1 << 20), default=None,
              help="Context size of a started daemon (default: the daemon's).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes the model to the network, so it needs "
                   "--api-key.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--api-key", envvar="FLASHD_API_KEY", metavar="KEY",
              help="Require this key (Authorization: Bearer KEY or x-api-key: KEY); also $FLASHD_API_KEY.")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=DEFAULT_MAX_BODY_BYTES, show_default=True,
              help="Largest request body; larger ones are answered 413.")
@click.option("--model-name", metavar="NAME",
              help="The model's name in /v1/models and responses (default: its registry name or file stem).")
@click.option("--default-temperature", type=click.FloatRange(0.0, 2.0), default=1.0, show_default=True,
              help="Temperature of requests that give none (OpenAI's and Anthropic's documented default is 1).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1.0), default=600.0, show_default=True,
              help="Longest wait, in seconds, for the daemon's next event before a request is cancelled.")
@click.option("--draft", "drafts", multiple=True, metavar="NAME|PATH|ngram|mtp",
              help="Drafter(s) of a started daemon (its --draft; repeatable), for speculative decoding.")
@click.option("--spec", type=click.Choice(list(SPEC_MODES)), default="off", show_default=True,
              help="Speculative decoding of requests that do not choose (request extension `spec`).")
@click.option("--spec-budget", type=click.IntRange(1, MAX_BUDGET), default=None,
              help="Chain length or DDTree node budget for --spec (default: the daemon's).")
@click.option("--spec-draft", metavar="NAME",
              help="Drafter for --spec (default: the daemon's first --draft).")
@click.option("--verbose", "-v", is_flag=True, help="Log every request and the started daemon's info logs.")
def http_command(daemon, model, device, max_ctx, host, port, api_key, max_body_bytes, model_name, default_temperature,
                 timeout_s, drafts, spec, spec_budget, spec_draft, verbose):
    """Serve OpenAI- and Anthropic-compatible HTTP APIs (chat, completions, messages, tool calls,
    streaming) for editors and coding agents. Base URLs: http://HOST:PORT/v1 (OpenAI) and
    http://HOST:PORT (Anthropic)."""
    from ..client import ClientTimeout, DaemonError, DaemonGone
    from .daemon_link import DaemonLink

    try:
        config = GatewayConfig(host=host, port=port, api_key=api_key, max_body_bytes=max_body_bytes,
                               default_temperature=default_temperature,
                               inactivity_timeout_s=timeout_s, spec=spec, spec_budget=spec_budget,
                               spec_draft=spec_draft)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr)
    if daemon is not None and drafts:
        raise click.UsageError("--draft loads drafters into a started daemon; with --daemon, start that daemon "
                               "with its own --draft")
    with _daemon_client(daemon, model, device, max_ctx, verbose, timeout_s, drafts) as (client, model_path):
        try:
            link = DaemonLink.open(client, model_path=model_path, model_name=model_name,
                                   inactivity_timeout_s=timeout_s)
        except (DaemonError, ClientTimeout, DaemonGone) as exc:
            raise click.ClickException(f"daemon: {exc}") from None
        except (OSError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"flashd http: {link.model_id} (max_ctx {link.max_ctx}) at http://{host}:{port}/v1 "
                   f"(OpenAI) and http://{host}:{port} (Anthropic)"
                   f"{'; API key required' if api_key else ''}", err=True)
        serve(link, config, verbose=verbose)
