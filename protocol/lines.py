"""The line dialect (stdin/stdout): `VERB key=value ...` in, one JSON object per line out.

Value grammar (SPEC.md, "Line dialect"), decided by the value's first character:
  "..."      JSON string (all JSON escapes: \\n, \\", \\u00e9, surrogate pairs)
  [...]      JSON array (stop=["\\n\\n","###"], ids=[5])
  @path      IdsFile(path); @"..." for a path with spaces
  otherwise  a bare word up to the next whitespace: true|false -> bool, 12 / -3 -> int,
             1,2,3 -> int list, 0.5 / 1e-3 / -2.5E+2 -> float, anything else -> str
Values must be followed by whitespace or the end of the line.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .errors import ProtocolError
from .ids import IdsFile
from .checks import check_request_id
from .messages import VERBS, Request, request_from_fields, request_to_fields, verb_of

MAX_LINE_CHARS = 64 * 1024 * 1024  # same bound as a msgpack frame

_KEY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
_SPACE = re.compile(r"\s*")
_WORD = re.compile(r"\S+")
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_INT_LIST = re.compile(r"[+-]?[0-9]+(?:,[+-]?[0-9]+)+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_ID_KEY = re.compile(r"(?<!\S)id=")  # `id=` starting a field (lookbehind sees before pos)
_SAFE_PATH = re.compile(r"[^\s\"][^\s]*")  # an @path that needs no quoting
_SAFE_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*", re.ASCII)  # a str that reads back as itself
_JSON = json.JSONDecoder(strict=False)  # strict=False: raw tabs etc. allowed inside strings


def _bad(message: str) -> ProtocolError:
    return ProtocolError("bad_request", message)


class _UnterminatedString(ProtocolError):
    """A string that runs to the end of the line: nothing after its opening quote (at
    `start`) can be a field, which matters when guessing the request id for the error."""

    def __init__(self, message: str, start: int):
        super().__init__("bad_request", message)
        self.start = start


def _bare_value(word: str) -> Any:
    if word == "true":
        return True
    if word == "false":
        return False
    if _INT.fullmatch(word):
        return int(word)
    if _INT_LIST.fullmatch(word):
        return [int(part) for part in word.split(",")]
    if _FLOAT.fullmatch(word):
        return float(word)
    return word


def _json_value(text: str, pos: int, key: str) -> tuple[Any, int]:
    try:
        return _JSON.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Unterminated string"):
            raise _UnterminatedString(f"{key}: unterminated string", pos) from None
        what = "JSON string" if text[pos] == '"' else "JSON array"
        raise _bad(f"{key}: bad {what}: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise _bad(f"{key}: JSON value nested too deeply") from None


def _parse_value(text: str, pos: int, key: str) -> tuple[Any, int]:
    """Parse the value starting at text[pos]; returns (value, end)."""
    if pos >= len(text) or text[pos].isspace():
        raise _bad(f"{key}: missing value after '='")
    first = text[pos]
    if first in '"[':
        value, end = _json_value(text, pos, key)
    elif first == "@":
        if text.startswith('"', pos + 1):
            path, end = _json_value(text, pos + 1, key)
        else:
            match = _WORD.match(text, pos + 1)
            path, end = (match.group(), match.end()) if match else ("", pos + 1)
        if not path:
            raise _bad(f"{key}: @ needs a file path")
        value = IdsFile(path)
    elif first == "{":
        raise _bad(f"{key}: JSON objects are not values in the line dialect")
    else:
        match = _WORD.match(text, pos)
        value, end = _bare_value(match.group()), match.end()
    if end < len(text) and not text[end].isspace():
        raise _bad(f"{key}: unexpected {text[end]!r} after the value (separate fields with spaces)")
    return value, end


def parse_fields(text: str) -> dict[str, Any]:
    """`key=value ...` -> {key: decoded value}; raises ProtocolError("bad_request")."""
    return _FieldParser(text).run()


class _FieldParser:
    """Parses `key=value ...`, keeping what an error report needs: the fields read so far and
    where the field being read starts."""

    def __init__(self, text: str):
        self.text = text
        self.fields: dict[str, Any] = {}
        self.field_start = 0

    def run(self) -> dict[str, Any]:
        text = self.text
        pos = _SPACE.match(text).end()
        while pos < len(text):
            self.field_start = pos
            match = _KEY.match(text, pos)
            if match is None:
                token = _WORD.match(text, pos).group()
                if "=" in token:
                    raise _bad(f"bad field name {token.split('=', 1)[0]!r} (letters, digits, _)")
                raise _bad(f"expected key=value, got {token!r}")
            key = match.group(1)
            if key in self.fields:
                raise _bad(f"{key}: given twice")
            self.fields[key], pos = _parse_value(text, match.end(), key)
            pos = _SPACE.match(text, pos).end()
        return self.fields

    def id_for_error(self, error: ProtocolError, default_id: str) -> str | None:
        """Best effort: the id the error answers. An id= read before the error wins; else the
        first id= from the failing field on (none inside an unterminated string, which runs
        to the end of the line); else default_id. None when that id= cannot be read."""
        raw_id = self.fields.get("id")
        if "id" not in self.fields:
            end = error.start if isinstance(error, _UnterminatedString) else len(self.text)
            tail = self.text[:end]
            match = _ID_KEY.search(tail, self.field_start)
            if match is None:
                raw_id = default_id
            else:
                try:
                    raw_id, _ = _parse_value(tail, match.end(), "id")
                except ProtocolError:
                    return None
        try:
            return check_request_id(raw_id)
        except ProtocolError:
            return None


def parse_line(line: str, default_id: str, max_line_chars: int = MAX_LINE_CHARS) -> Request | None:
    """One stdin line -> a Request; None for a blank line or a `#` comment.

    Raises ProtocolError: unknown_command for an unknown verb, bad_request for anything else
    malformed. The error carries the request's id (its `id=` or default_id) where readable.
    """
    if len(line) > max_line_chars:
        raise ProtocolError(
            "bad_request", f"line of {len(line)} characters exceeds the limit of {max_line_chars}", default_id
        )
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    parts = text.split(None, 1)
    verb, rest = parts[0], (parts[1] if len(parts) > 1 else "")
    parser = _FieldParser(rest)
    try:
        fields = parser.run()
    except ProtocolError as exc:
        request_id = parser.id_for_error(exc, default_id)
        if verb not in VERBS:
            raise ProtocolError("unknown_command", f"unknown command {verb!r}; commands: "
                                f"{', '.join(VERBS)}", request_id) from None
        raise ProtocolError(exc.code, exc.message, request_id) from None
    return request_from_fields(verb, fields, default_id)


def undecodable_line_id(line: bytes, default_id: str) -> str | None:
    """The id the error about a line that is not UTF-8 answers: the line's id= when that field
    itself is readable, else default_id; None when id= is present but unreadable (its own bytes
    are not UTF-8), as for the errors of parse_line. The line is read with the bad bytes escaped
    (surrogateescape) only to find its id; the request is refused whole."""
    parts = line.decode("utf-8", "surrogateescape").strip().split(None, 1)
    parser = _FieldParser(parts[1] if len(parts) > 1 else "")
    try:
        fields = parser.run()
    except ProtocolError as exc:
        request_id = parser.id_for_error(exc, default_id)
    else:
        try:
            request_id = check_request_id(fields.get("id", default_id))
        except ProtocolError:
            request_id = None
    if request_id is not None and any("\udc80" <= c <= "\udcff" for c in request_id):
        return None            # an escaped byte: the id= was there but is not text
    return request_id


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN/Infinity: non-finite floats become null (e.g. a log p of -inf)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def encode_event(event: dict) -> str:
    """An event -> one line of JSON (no trailing newline, UTF-8 text kept as is)."""
    try:
        return json.dumps(event, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a non-finite float somewhere: rare, so only then walk the event
        return json.dumps(_finite_or_none(event), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back as the same float
    if isinstance(value, str):
        if _SAFE_WORD.fullmatch(value) and value not in ("true", "false"):
            return value
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, IdsFile):
        return "@" + (value.path if _SAFE_PATH.fullmatch(value.path) else json.dumps(value.path, ensure_ascii=False))
    if isinstance(value, (list, tuple)):
        if len(value) >= 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return ",".join(str(v) for v in value)
        return json.dumps(list(value), ensure_ascii=False, separators=(",", ":"))
    raise TypeError(f"cannot write {type(value).__name__} in the line dialect")


def format_fields(verb: str, fields: dict[str, Any]) -> str:
    """`VERB key=value ...` for raw fields (client side; no validation)."""
    return " ".join([verb] + [f"{key}={_format_value(value)}" for key, value in fields.items()])


def format_request(request: Request) -> str:
    """A Request -> the line that parse_line reads back as an equal Request."""
    return format_fields(verb_of(request), request_to_fields(request))
