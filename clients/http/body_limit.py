"""A bound on request bodies: 413 before the body is read into memory, not after.

Starlette reads a whole body into memory for `request.json()`; without a bound one POST could take
the gateway's memory. A declared Content-Length over the limit is refused before anything is read;
a body sent without one (chunked) is counted as it arrives and refused as soon as it passes the
limit. The 413 goes through the app's HTTPException handler, so it has the endpoint's error shape
(OpenAI or Anthropic).
"""
from __future__ import annotations

from starlette.exceptions import HTTPException

__all__ = ["BodyLimit"]


class BodyLimit:
    """ASGI middleware: HTTP request bodies of at most `max_bytes` bytes."""

    def __init__(self, app, max_bytes: int):
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.app, self.max_bytes = app, max_bytes

    def _too_large(self, n_bytes: int | str) -> HTTPException:
        return HTTPException(413, f"request body of {n_bytes} bytes exceeds the limit of {self.max_bytes} bytes "
                                  f"(flashd http --max-body-bytes)")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self.app(scope, _refuse_body(self._too_large(int(declared))), send)
            return
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise self._too_large(f"more than {self.max_bytes}")
            return message

        await self.app(scope, counted, send)


def _refuse_body(error: HTTPException):
    """A receive() that raises the 413 at the first read of the body (routing, the API key and
    the 404/405 answers still happen first, as they would for any body)."""

    async def receive():
        raise error

    return receive
