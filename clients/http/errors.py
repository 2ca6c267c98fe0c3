"""Errors of the HTTP gateway, in the shape each API's clients expect.

`ApiError` is raised anywhere a request cannot be served; app.py turns it into a response in the
dialect of the endpoint (OpenAI or Anthropic). Validation errors from pydantic (FastAPI's 422)
become a 400 whose message names the parameter (`messages[0].content: ...`).

OpenAI:    {"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": ...}}
Anthropic: {"type": "error", "error": {"type": "invalid_request_error", "message": ...}}
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ApiError", "anthropic_error_body", "daemon_error_to_api", "openai_error_body",
    "validation_message",
]

# HTTP status -> the Anthropic error type for it (docs: "Errors").
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}
# HTTP status -> the OpenAI error type.
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error",
                 500: "server_error", 503: "server_error"}


@dataclass(slots=True)
class ApiError(Exception):
    """A request that cannot be served: HTTP `status`, a message for the user, and (for OpenAI's
    error shape) the parameter it concerns and a machine-readable code."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None

    def __post_init__(self) -> None:
        if not 400 <= self.status <= 599:
            raise ValueError(f"ApiError.status must be a 4xx/5xx code, got {self.status}")

    def __str__(self) -> str:
        return self.message


def openai_error_body(error: ApiError) -> dict:
    return {"error": {"message": error.message, "type": _OPENAI_TYPES.get(error.status, "server_error"),
                      "param": error.param, "code": error.code}}


def anthropic_error_body(error: ApiError) -> dict:
    kind = _ANTHROPIC_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


# Daemon error code -> (HTTP status, OpenAI code). See protocol/SPEC.md "Error codes".
_DAEMON_STATUS = {
    "bad_request": (400, None),
    "ctx_overflow": (400, "context_length_exceeded"),
    "unknown_command": (500, None),
    "not_loaded": (503, "model_not_loaded"),
    "parked": (503, "model_parked"),
    "oom": (503, "out_of_memory"),
    "overloaded": (503, "overloaded"),
    "cancelled": (503, "cancelled"),
    "not_implemented": (400, "not_implemented"),
    "internal": (500, None),
    "model_output": (500, "model_output"),
}


def daemon_error_to_api(code: str, message: str) -> ApiError:
    """The ApiError for a daemon `error` event."""
    status, api_code = _DAEMON_STATUS.get(code, (500, None))
    return ApiError(status, f"daemon: {code}: {message}", code=api_code or code)


# ----------------------------------------------------------------------------------------------
# pydantic validation errors -> one readable message
# ----------------------------------------------------------------------------------------------

# Labels pydantic puts in an error's `loc` for the branch of a union it tried; they are not part
# of the request's path. Our field names are all snake_case, so a label is recognised by shape.
_BRANCH_WORDS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "literal", "json"})


def _is_branch_label(part: Any) -> bool:
    if not isinstance(part, str):
        return False
    return (part in _BRANCH_WORDS or part[:1].isupper() or "[" in part or "-" in part)


def _path(loc: Iterable[Any]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _is_branch_label(part):
            continue
        else:
            text += f".{part}" if text else str(part)
    return text


def _one_message(error: Mapping[str, Any], hints: Mapping[str, str]) -> tuple[str, str]:
    """(path, message) of one pydantic error dict (as FastAPI's RequestValidationError.errors())."""
    loc = list(error.get("loc") or ())
    if loc and loc[0] == "body":
        loc = loc[1:]
    kind = error.get("type", "")
    message = str(error.get("msg", "invalid value"))
    if kind == "json_invalid":
        detail = (error.get("ctx") or {}).get("error", "")
        position = f" at position {loc[0]}" if loc and isinstance(loc[0], int) else ""
        return "", f"the request body is not valid JSON{position}" + (f": {detail}" if detail else "")
    path = _path(loc)
    if kind == "extra_forbidden":
        message = "unknown parameter (flashd does not accept it; see the README's list)"
    elif kind == "missing":
        message = "required parameter is missing"
    elif kind == "model_attributes_type" and not path:
        message = "the request body must be a JSON object"
    elif kind == "value_error" and message.startswith("Value error, "):
        message = message[len("Value error, "):]
    elif kind == "assertion_error" and message.startswith("Assertion failed, "):
        message = message[len("Assertion failed, "):]
    if "input" in error and kind not in ("missing", "extra_forbidden", "json_invalid", "value_error"):
        shown = repr(error["input"])
        if len(shown) <= 60:
            message += f", got {shown}"
    top = loc[0] if loc and isinstance(loc[0], str) else None
    if top in hints and kind != "missing":
        message += f" ({hints[top]})"
    return path, message


def validation_message(errors: Iterable[Mapping[str, Any]], hints: Mapping[str, str] = {}) -> tuple[str, str | None]:
    """(message, param) for a list of pydantic errors: each distinct path once, its messages
    joined (a union's branches give one message per branch), at most 4 paths."""
    by_path: dict[str, list[str]] = {}
    for error in errors:
        path, message = _one_message(error, hints)
        messages = by_path.setdefault(path, [])
        if message not in messages:
            messages.append(message)
    if not by_path:
        return "invalid request", None
    parts = []
    for path, messages in list(by_path.items())[:4]:
        joined = " or ".join(messages) if len(messages) > 1 else messages[0]
        parts.append(f"{path}: {joined}" if path else joined)
    if len(by_path) > 4:
        parts.append(f"(and {len(by_path) - 4} more)")
    first = next(iter(by_path))
    return "; ".join(parts), (first or None)
