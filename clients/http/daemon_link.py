"""The gateway's side of the daemon: the ZeroMQ client, the model's tokenizer and chat template
(read from the GGUF the daemon reports in `status`, ARCHITECTURE.md: prompts are built and
tokenized here), and an async view of a generation for the event loop.

The ZeroMQ client (flashd.clients.client.Client) is blocking and thread-safe; every call that can
wait runs in a worker thread (anyio.to_thread), so the event loop never blocks on the daemon and
any number of requests can be in flight (the daemon queues them, batch 1).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import jinja2
import jinja2.meta

from ..chat_template import ChatTemplate
from ..client import Client, DaemonError, DaemonGone, GenerationStream
from ..registry import KNOWN_MODELS
from ..tokenizer import Tokenizer
from .errors import ApiError, daemon_error_to_api

__all__ = ["DaemonLink", "ModelFiles", "model_id_for"]

POLL_S = 0.1              # longest wait of one worker-thread poll; a disconnect is noticed within it
MAX_EVENTS_PER_POLL = 64  # events handed to the loop per thread hop
TERMINAL_EVENTS = frozenset({"done", "result", "error"})


def _template_uses(template_source: str, variable: str) -> bool:
    """Whether a Jinja template reads `variable` (e.g. whether a chat template renders tools)."""
    try:
        ast = jinja2.Environment().parse(template_source)
    except jinja2.TemplateSyntaxError:
        return False
    return variable in jinja2.meta.find_undeclared_variables(ast)


@dataclass(slots=True)
class ModelFiles:
    """What the gateway reads from the model's GGUF."""

    path: Path
    tokenizer: Tokenizer
    template: ChatTemplate | None   # None: the GGUF has no chat template (chat endpoints refuse)
    template_renders_tools: bool    # whether the chat template shows `tools` to the model

    @classmethod
    def load(cls, path: str | Path) -> "ModelFiles":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the model file is not readable here (the gateway reads "
                                    f"the tokenizer and chat template from it)")
        template = ChatTemplate.from_gguf(path)
        return cls(path=path, tokenizer=Tokenizer.from_gguf(path), template=template,
                   template_renders_tools=template is not None and _template_uses(template.source, "tools"))


def model_id_for(path: Path) -> str:
    """The name /v1/models shows: the registry name of a known model file, else the file's stem."""
    for name, known in KNOWN_MODELS.items():
        if path.name == known.filename:
            return name
    return path.stem


def _poll_batch(stream: GenerationStream, timeout_s: float) -> list[dict]:
    """In a worker thread: the next events of `stream` (waiting up to timeout_s for the first,
    then taking what is already there). An error event comes back as a dict, not an exception."""
    events: list[dict] = []
    try:
        event = stream.poll(timeout_s)
        while event is not None:
            events.append(event)
            if event.get("event") in TERMINAL_EVENTS or len(events) >= MAX_EVENTS_PER_POLL:
                break
            event = stream.poll(0)
    except StopIteration:
        pass
    except DaemonError as exc:
        events.append({"event": "error", "code": exc.code, "message": exc.message})
    return events


class ClientGone(Exception):
    """The HTTP client went away while its request ran (the daemon request was cancelled)."""


class DaemonLink:
    """One daemon, shared by every request of the gateway."""

    def __init__(self, client: Client, model: ModelFiles, *, model_id: str, max_ctx: int,
                 inactivity_timeout_s: float):
        self.client = client
        self.model = model
        self.model_id = model_id
        self.max_ctx = max_ctx
        self.inactivity_timeout_s = inactivity_timeout_s
        self.created = int(time.time())

    @classmethod
    def open(cls, client: Client, *, model_path: str | Path | None = None, model_name: str | None = None,
             inactivity_timeout_s: float = 600.0, status_timeout_s: float = 30.0) -> "DaemonLink":
        """Ask the daemon what it serves and load the tokenizer and chat template of that model
        (or of `model_path`, for a daemon whose file is elsewhere)."""
        status = client.status(timeout_s=status_timeout_s)
        path = model_path or status.get("model")
        if not isinstance(path, (str, Path)) or not path:
            raise ValueError(f"the daemon's status names no model file ({status.get('model')!r})")
        model = ModelFiles.load(path)
        max_ctx = status.get("max_ctx")
        if not isinstance(max_ctx, int) or max_ctx < 1:
            raise ValueError(f"the daemon's status has no usable max_ctx ({max_ctx!r})")
        return cls(client, model, model_id=model_name or model_id_for(model.path), max_ctx=max_ctx,
                   inactivity_timeout_s=inactivity_timeout_s)

    async def status(self) -> dict:
        try:
            return await anyio.to_thread.run_sync(lambda: self.client.status(timeout_s=5.0))
        except (DaemonError, DaemonGone, TimeoutError) as exc:
            raise ApiError(503, f"the daemon does not answer: {exc}") from None

    async def generate(self, fields: dict, is_disconnected: Callable[[], Awaitable[bool]] | None = None
                       ) -> AsyncIterator[dict]:
        """The daemon's events for one generate request (`fields`: Client.generate's keyword
        arguments, `ids` among them): token events, then the done event. A daemon error raises
        ApiError. Leaving early (the HTTP client went away, the consumer stopped, the task was
        cancelled) cancels the request on the daemon."""
        try:
            stream = await anyio.to_thread.run_sync(lambda: self.client.generate(**fields))
        except (DaemonGone, OSError) as exc:
            raise ApiError(503, f"the daemon is not reachable: {exc}") from None
        last_event = time.monotonic()
        try:
            while True:
                try:
                    events = await anyio.to_thread.run_sync(_poll_batch, stream, POLL_S, abandon_on_cancel=True)
                except DaemonGone as exc:
                    raise ApiError(503, f"the daemon went away: {exc}") from None
                now = time.monotonic()
                if events:
                    last_event = now
                elif now - last_event > self.inactivity_timeout_s:
                    raise ApiError(503, f"the daemon sent nothing for {self.inactivity_timeout_s:g} s; "
                                        f"the request was cancelled")
                for event in events:
                    kind = event.get("event")
                    if kind == "error":
                        raise daemon_error_to_api(str(event.get("code")), str(event.get("message", "")))
                    yield event
                    if kind == "done":
                        return
                if is_disconnected is not None and await is_disconnected():
                    raise ClientGone()
        finally:
            if not stream.finished:
                # Not awaited: this may run while the task is being cancelled (client gone).
                asyncio.get_running_loop().run_in_executor(None, stream.close)
