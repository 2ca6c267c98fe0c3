"""Server-sent events: the framing of every streamed response (`text/event-stream`)."""
from __future__ import annotations

import json

__all__ = ["SSE_HEADERS", "sse_event"]

# No caching, and no buffering by a reverse proxy (nginx honours X-Accel-Buffering).
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(data: dict | str, event: str | None = None) -> bytes:
    """One event: optional `event: NAME` line, one `data:` line (compact JSON, or a literal
    string such as "[DONE]"), blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode("utf-8")
