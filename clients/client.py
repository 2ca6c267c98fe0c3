"""The Python client: talks to a flashd daemon over ZeroMQ (a DEALER to the daemon's ROUTER).

    with Client("tcp://127.0.0.1:5555") as client:
        for event in client.generate("def fib(n):", max_tokens=64):
            print(event.get("text", ""), end="")
        print(client.complete("x = ", max_tokens=8).text)

Each request gets a client-side id (uuid4 hex), so several may be in flight at once from one
Client: whichever caller is waiting reads frames off the socket and files each event under its
request id. The socket is used under a lock, so a Client may be shared by threads; a wait holds
the lock for at most POLL_SLICE_S at a time.

Timeouts are inactivity timeouts: the longest wait for the *next* event of a request (a streamed
generation may run for longer in total). When one expires the request is cancelled on the daemon
and ClientTimeout is raised. A daemon's `error` event raises DaemonError(code, message).
"""
from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..protocol import wire

__all__ = ["Client", "ClientTimeout", "Completion", "DaemonError", "DaemonGone", "GenerationStream"]

POLL_SLICE_S = 0.05  # longest time the socket lock is held while waiting for a frame
TERMINAL_EVENTS = frozenset({"done", "result", "error"})
CANCEL_DRAIN_S = 10.0  # how long a cancelled stream waits for its terminal event


class DaemonError(Exception):
    """The daemon answered a request with an `error` event."""

    def __init__(self, code: str, message: str, request_id: str | None = None):
        super().__init__(code, message, request_id)
        self.code = code
        self.message = message
        self.request_id = request_id

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class ClientTimeout(TimeoutError):
    """No event arrived for a request within the timeout (the request was cancelled)."""


class DaemonGone(ConnectionError):
    """The daemon process the client was watching has exited."""


@dataclass(slots=True)
class Completion:
    """A finished generation."""

    text: str
    ids: list[int]
    reason: str                  # "stop" (EOS, stop id or stop string) or "length"
    n_prompt: int
    n_gen: int
    timings: dict
    logprobs: list | None = None
    spec: dict | None = None
    request_id: str = ""


def _new_id() -> str:
    return uuid.uuid4().hex


def _drop_none(fields: dict) -> dict:
    return {k: v for k, v in fields.items() if v is not None}


class GenerationStream:
    """The events of one generate request: token events, then exactly one terminal event (the
    `done` event is yielded; an `error` event raises DaemonError). Closing it (or leaving a
    `with` block, or breaking out of a for loop and dropping it) before the end cancels the
    request on the daemon."""

    def __init__(self, client: "Client", request_id: str, timeout_s: float):
        self._client = client
        self.id = request_id
        self.timeout_s = timeout_s
        self.done: dict | None = None  # the terminal event once seen
        self._finished = False

    def __iter__(self) -> "GenerationStream":
        return self

    def __next__(self) -> dict:
        if self._finished:
            raise StopIteration
        event = self._client._wait_event(self.id, self.timeout_s)
        if event is None:
            self._abandon()
            raise ClientTimeout(f"no event for generate {self.id} in {self.timeout_s:g} s; "
                                f"the request was cancelled")
        return self._take(event)

    def poll(self, timeout_s: float) -> dict | None:
        """The next event, or None if none arrived within timeout_s (the request goes on).
        After the terminal event, raises StopIteration like next()."""
        if self._finished:
            raise StopIteration
        event = self._client._wait_event(self.id, timeout_s)
        return None if event is None else self._take(event)

    def _take(self, event: dict) -> dict:
        kind = event.get("event")
        if kind in TERMINAL_EVENTS:
            self._finished = True
            self.done = event
            self._client._forget(self.id)
            if kind == "error":
                raise DaemonError(event.get("code", "internal"), event.get("message", ""), self.id)
        return event

    @property
    def finished(self) -> bool:
        return self._finished

    def cancel(self, *, wait_s: float = CANCEL_DRAIN_S) -> dict | None:
        """Ask the daemon to stop this request and wait (up to wait_s) for its terminal event,
        which is returned (usually an error event with code "cancelled", or `done` if it ended
        first). Returns None if it was already finished or did not end in time."""
        if self._finished:
            return None
        self._client._send({"cmd": "cancel", "id": _new_id(), "target": self.id}, expect_reply=False)
        deadline = time.monotonic() + wait_s
        while (remaining := deadline - time.monotonic()) > 0:
            event = self._client._wait_event(self.id, remaining)
            if event is None:
                break
            if event.get("event") in TERMINAL_EVENTS:
                self._finished = True
                self.done = event
                self._client._forget(self.id)
                return event
        self._abandon()
        return None

    def _abandon(self) -> None:
        """Stop listening: cancel on the daemon, drop whatever arrives for this id later."""
        if not self._finished:
            self._finished = True
            self._client._abandon(self.id)

    def close(self) -> None:
        if not self._finished:
            self._abandon()

    def __enter__(self) -> "GenerationStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class Client:
    """A connection to one daemon. `address`: "tcp://127.0.0.1:PORT" or "ipc:///path".

    tokenizer: an optional flashd.clients.tokenizer.Tokenizer; text prompts are then tokenized
      here and sent as ids (otherwise they are sent as text and the daemon tokenizes them).
    daemon_alive: an optional callable checked while waiting; when it returns False the wait
      raises DaemonGone (e.g. a spawned daemon process that exited).
    """

    def __init__(self, address: str, *, timeout_s: float = 300.0, tokenizer=None,
                 daemon_alive: Callable[[], bool] | None = None, context: zmq.Context | None = None):
        if not isinstance(address, str) or "://" not in address:
            raise ValueError(f"address must look like tcp://HOST:PORT or ipc://PATH, got {address!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.address = address
        self.timeout_s = float(timeout_s)
        self.tokenizer = tokenizer
        self.daemon_alive = daemon_alive
        self._context = context or zmq.Context.instance()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        # The connection's ups and downs: a daemon that dies (kill -9) drops the connection, and
        # the requests it had will never be answered. ZeroMQ reconnects by itself once a daemon
        # serves the address again; until then requests fail at once with DaemonGone.
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._lost = False  # the connection was up and went down, and is not up again yet
        try:
            self._socket.connect(address)
        except zmq.ZMQError as exc:
            self._close_socket()
            raise ValueError(f"cannot connect to {address}: {exc}") from None
        self._lock = threading.Lock()
        self._pending: dict[str, collections.deque] = {}  # request id -> events not yet taken
        self._abandoned: set[str] = set()  # ids whose events are dropped on arrival
        self._closed = False

    # -- plumbing --------------------------------------------------------------------------------
    def _send(self, fields: dict, *, expect_reply: bool = True) -> str:
        """Send one request (fields include "cmd" and "id"); register its id for replies."""
        if self._closed:
            raise RuntimeError("the client is closed")
        request_id = fields["id"]
        frame = wire.encode_request(fields, pack_ids=True)
        with self._lock:
            if self._connection_lost():   # not queued for a daemon that may come back much later
                raise DaemonGone(f"the daemon at {self.address} went away (the connection is down)")
            if expect_reply:
                self._pending[request_id] = collections.deque()
            else:
                self._abandoned.add(request_id)
            self._socket.send(frame, copy=False)
        return request_id

    def _dispatch(self, frame: bytes) -> None:
        """File one received event under its request id (lock held)."""
        try:
            event = wire.decode_event(frame)
        except ValueError:
            return  # not an event frame: nothing a caller waits on
        request_id = event.get("id")
        if request_id is None:
            if event.get("event") == "error" and len(self._pending) == 1:
                # The daemon could not read the id of a request; with one in flight it is that one.
                request_id = next(iter(self._pending))
            else:
                return  # e.g. a `ready` event
        request_id = str(request_id)
        queue = self._pending.get(request_id)
        if queue is not None:
            queue.append(event)
        elif request_id in self._abandoned and event.get("event") in TERMINAL_EVENTS:
            self._abandoned.discard(request_id)

    def _wait_event(self, request_id: str, timeout_s: float) -> dict | None:
        """The next event of `request_id`, or None after timeout_s without one."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            with self._lock:
                queue = self._pending.get(request_id)
                if queue is None:
                    raise RuntimeError("the client is closed" if self._closed
                                       else f"request {request_id} is not in flight")
                if queue:
                    return queue.popleft()
                remaining = deadline - time.monotonic()
                slice_ms = max(0, int(min(POLL_SLICE_S, remaining) * 1000))
                if self._socket.poll(slice_ms, zmq.POLLIN):
                    self._drain()
                    if queue:
                        return queue.popleft()
                if self._connection_lost():
                    self._drain()     # what the daemon sent before it went away is still its answer
                    if queue:
                        return queue.popleft()
                    raise DaemonGone(f"the daemon at {self.address} went away with request {request_id} "
                                     f"in flight")
            if time.monotonic() >= deadline:
                return None
            if self.daemon_alive is not None and not self.daemon_alive():
                raise DaemonGone(f"the daemon at {self.address} has exited")

    def _drain(self) -> None:
        """File every frame already received, without blocking (lock held)."""
        while True:
            try:
                self._dispatch(self._socket.recv(zmq.NOBLOCK))
            except zmq.Again:
                return

    def _connection_lost(self) -> bool:
        """Whether the connection to the daemon is down now, by the monitor's events so far (lock held)."""
        while True:
            try:
                message = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return self._lost
            self._lost = message["event"] == zmq.EVENT_DISCONNECTED

    def _close_socket(self) -> None:
        self._socket.disable_monitor()
        self._monitor.close(0)
        self._socket.close(linger=200)  # a moment for the cancels to leave

    def _forget(self, request_id: str) -> None:
        with self._lock:
            self._pending.pop(request_id, None)

    def _abandon(self, request_id: str) -> None:
        """Cancel `request_id` on the daemon and drop its later events."""
        with self._lock:
            if self._pending.pop(request_id, None) is None:
                return
            self._abandoned.add(request_id)
        if not self._closed:
            try:
                self._send({"cmd": "cancel", "id": _new_id(), "target": request_id}, expect_reply=False)
            except (zmq.ZMQError, DaemonGone):   # gone: nothing left to cancel there
                pass

    def request(self, cmd: str, *, timeout_s: float | None = None, **fields: Any) -> dict:
        """Send one request and return its `result` event (or `done`); raises DaemonError on an
        `error` event and ClientTimeout (after cancelling) when no answer comes in time."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        request_id = fields.pop("id", None) or _new_id()
        self._send({"cmd": cmd, "id": request_id, **_drop_none(fields)})
        while True:
            event = self._wait_event(request_id, timeout_s)
            if event is None:
                self._abandon(request_id)
                raise ClientTimeout(f"no answer to {cmd} {request_id} from {self.address} in {timeout_s:g} s"
                                    f"{'; the request was cancelled' if cmd != 'cancel' else ''}")
            kind = event.get("event")
            if kind in TERMINAL_EVENTS:
                self._forget(request_id)
                if kind == "error":
                    raise DaemonError(event.get("code", "internal"), event.get("message", ""), request_id)
                return event

    # -- generation ------------------------------------------------------------------------------
    def generate(self, prompt: str | None = None, ids: Sequence[int] | None = None, *,
                 max_tokens: int | None = None, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                 repeat_penalty: float | None = None, repeat_last_n: int | None = None,
                 frequency_penalty: float | None = None, presence_penalty: float | None = None,
                 seed: int | None = None, stop: str | Sequence[str] | None = None,
                 stop_ids: Sequence[int] | None = None, logprobs: int | None = None,
                 add_special: bool | None = None, stream: bool = True, request_id: str | None = None,
                 timeout_s: float | None = None, **extra: Any) -> GenerationStream:
        """Start a generation and return its event stream (the request is sent now).

        Give exactly one of `prompt` (text) or `ids`. Arguments left as None take the daemon's
        defaults; `extra` passes other protocol fields (spec=, budget=, draft=, ignore_eos=, ...).
        With stream=False the daemon sends only the `done` event, carrying ids and text.
        """
        if (prompt is None) == (ids is None):
            raise ValueError("give exactly one of prompt (text) or ids")
        fields: dict[str, Any] = {"cmd": "generate", "id": request_id or _new_id()}
        if prompt is not None:
            if not isinstance(prompt, str):
                raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
            if self.tokenizer is not None:
                fields["ids"] = self.tokenizer.encode(prompt, add_special=bool(add_special))
            else:
                fields["text"] = prompt
                if add_special is not None:
                    fields["add_special"] = add_special
        else:
            fields["ids"] = [int(t) for t in ids]
        if isinstance(stop, str):
            stop = [stop]
        fields.update(_drop_none({
            "max_tokens": max_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p,
            "min_p": min_p, "repeat_penalty": repeat_penalty, "repeat_last_n": repeat_last_n,
            "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty, "seed": seed,
            "stop": list(stop) if stop is not None else None,
            "stop_ids": list(stop_ids) if stop_ids is not None else None,
            "logprobs": logprobs, **extra,
        }))
        if not stream:
            fields["stream"] = False
        self._send(fields)
        return GenerationStream(self, fields["id"], self.timeout_s if timeout_s is None else timeout_s)

    def complete(self, prompt: str | None = None, ids: Sequence[int] | None = None, **kwargs: Any) -> Completion:
        """Run a generation to the end and return its output (same arguments as generate)."""
        stream = self.generate(prompt, ids, **kwargs)
        text: list[str] = []
        out_ids: list[int] = []
        logprobs: list = []
        done: dict = {}
        with stream:
            for event in stream:
                if event["event"] == "token":
                    text.append(event.get("text", ""))
                    out_ids.extend(event.get("ids", ()))
                    logprobs.extend(event.get("logprobs") or ())
                elif event["event"] == "done":
                    done = event
        if "ids" in done:  # stream=False: the whole output rides on the done event
            out_ids = list(done["ids"])
            text = [done.get("text", "")]
            logprobs = list(done.get("logprobs") or ())
        return Completion(
            text="".join(text), ids=out_ids, reason=done.get("reason", ""),
            n_prompt=done.get("n_prompt", 0), n_gen=done.get("n_gen", len(out_ids)),
            timings=done.get("timings", {}), logprobs=logprobs or None, spec=done.get("spec"),
            request_id=stream.id)

    # -- other verbs -----------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        return list(self.request("tokenize", text=text, add_special=add_special or None)["ids"])

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.request("detokenize", ids=[int(t) for t in ids])["text"]

    def score(self, ids: Sequence[int], **fields: Any) -> dict:
        """{"argmax": [next-token argmax at every position], "logprobs": [log p(ids[i+1])]}"""
        event = self.request("score", ids=[int(t) for t in ids], **fields)
        return {k: v for k, v in event.items() if k not in ("id", "event")}

    def status(self, *, timeout_s: float | None = None) -> dict:
        event = self.request("status", timeout_s=timeout_s)
        return {k: v for k, v in event.items() if k not in ("id", "event")}

    def cancel(self, request_id: str) -> dict:
        """Cancel a request (of any client) by id; the daemon's answer, e.g. {"cancelled": True}."""
        event = self.request("cancel", target=request_id)
        return {k: v for k, v in event.items() if k not in ("id", "event")}

    def park(self, what: str = "target") -> dict:
        return self._result("park", what=what)

    def unpark(self, what: str = "target") -> dict:
        return self._result("unpark", what=what)

    def free(self, what: str = "drafter") -> dict:
        return self._result("free", what=what)

    def quit(self, *, timeout_s: float = 10.0) -> dict:
        """Ask the daemon to exit after answering."""
        return self._result("quit", timeout_s=timeout_s)

    def _result(self, cmd: str, **fields: Any) -> dict:
        event = self.request(cmd, **fields)
        return {k: v for k, v in event.items() if k not in ("id", "event")}

    def wait_ready(self, timeout_s: float = 30.0) -> dict:
        """Block until the daemon answers `status` (it may still be starting); its status."""
        return self.status(timeout_s=timeout_s)

    # -- lifetime --------------------------------------------------------------------------------
    def close(self) -> None:
        """Cancel requests still in flight and close the socket."""
        if self._closed:
            return
        with self._lock:
            in_flight = list(self._pending)
        for request_id in in_flight:
            self._abandon(request_id)
        with self._lock:
            self._closed = True
            self._close_socket()

    # The with-protocol as GenerationStream's, each closing its own thing (here the socket and every request).
    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.address!r})"
