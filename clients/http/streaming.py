"""Starting a streamed response only once the daemon has answered.

The first item of a generation is awaited before the HTTP response starts, so a request the
daemon refuses (context overflow, overload, a parked model) gets a real 4xx/5xx status instead of
a 200 stream carrying an error. Until then the request polls for the client's disconnect itself;
once streaming, Starlette notices the disconnect and cancels the response, which cancels the
daemon request (DaemonLink.generate's cleanup).
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from .sse import SSE_HEADERS

__all__ = ["DisconnectWatch", "stream_after_first"]

T = TypeVar("T")


class DisconnectWatch:
    """`check()` reports the HTTP client's disconnect while `active` (before streaming starts)."""

    def __init__(self, request: Request):
        self._request = request
        self.active = True

    async def check(self) -> bool:
        return self.active and await self._request.is_disconnected()


async def stream_after_first(items: AsyncIterator[T], watch: DisconnectWatch,
                             render: Callable[[T | None, AsyncIterator[T]], AsyncIterator[bytes]]
                             ) -> StreamingResponse:
    """Await the first of `items` (its errors propagate: a normal error response), then stream
    render(first, rest) as server-sent events."""
    first = await anext(items, None)

    async def body() -> AsyncIterator[bytes]:
        watch.active = False
        async with aclosing(items):
            async for chunk in render(first, items):
                yield chunk

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)
