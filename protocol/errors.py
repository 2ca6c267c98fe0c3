"""The closed set of error codes and the exception that carries one.

Every failed request ends with one `error` event whose `code` is a key of ERROR_CODE_MEANINGS;
SPEC.md has the same table. Adding a code is a protocol change: update both.
"""

from __future__ import annotations

# code -> when the daemon uses it (SPEC.md, "Error codes", repeats this table).
ERROR_CODE_MEANINGS: dict[str, str] = {
    "bad_request": "the request could not be parsed or a field is invalid: malformed line or "
    "frame, unknown field, wrong type, value out of range, both or neither of text/ids, "
    "unreadable @file, frame over the size limit",
    "unknown_command": "the verb (line dialect, Lucebox dialect) or `cmd` (msgpack) is not a "
    "known command",
    "ctx_overflow": "prompt tokens + max_tokens exceed the daemon's max_ctx",
    "not_loaded": "the request needs a model that is not loaded (e.g. a drafter it names, "
    "or speculative decoding / compression with no drafter)",
    "parked": "the model the request needs is parked; `unpark` it first",
    "oom": "device memory ran out while serving this request, or a model it would load (unpark, a "
    "prefill drafter) does not fit --vram-budget and was refused before anything was allocated; the "
    "daemon keeps serving",
    "cancelled": "the request was cancelled by `cancel` (or its ZeroMQ client went away)",
    "internal": "a bug in flashd; the message says what failed; the daemon keeps serving",
    "model_output": "the model's forward gave logits that are not numbers (NaN) where a token is chosen: a "
    "broken or unsupported weight file; the request ends, the daemon keeps serving",
    "overloaded": "the request queue is full; retry later",
    "not_implemented": "a documented capability that this release does not have yet "
    "(e.g. a spec or compress mode)",
}

ERROR_CODES: frozenset[str] = frozenset(ERROR_CODE_MEANINGS)


class ProtocolError(Exception):
    """A request failed with a protocol error code.

    `request_id` is the id of the request the error answers, when it is known (the id the
    client gave, or the one the server assigned); None when the id itself was unreadable.
    """

    def __init__(self, code: str, message: str, request_id: str | None = None):
        if code not in ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}; known: {sorted(ERROR_CODES)}")
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, got {type(message).__name__}")
        super().__init__(code, message, request_id)
        self.code = code
        self.message = message
        self.request_id = request_id

    def with_request_id(self, request_id: str | None) -> ProtocolError:
        """The same error, answering `request_id` (keeps an id already set)."""
        if self.request_id is not None or request_id is None:
            return self
        return ProtocolError(self.code, self.message, request_id)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.message!r}, request_id={self.request_id!r})"
