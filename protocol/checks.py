"""Field validators shared by every message: one function per value kind.

Each takes the field name and the decoded value, returns the normalised value (ints widened to
float for float fields, lists frozen to tuples where the message stores tuples) and raises
ProtocolError("bad_request", "<field>: <why>") otherwise. bool is never accepted as a number:
in Python it is an int subclass, on the wire it is a different type.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import ProtocolError
from .ids import IdsFile

INT32_MAX = 2**31 - 1
MAX_ID_CHARS = 256  # request ids are correlation tags, not payloads


def _bad(name: str, why: str) -> ProtocolError:
    return ProtocolError("bad_request", f"{name}: {why}")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(value, IdsFile):
        return "@file"
    return type(value).__name__


def _show(value: Any, max_chars: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """An int in [lo, hi] (either bound optional)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"expected an integer, got {_kind(value)} {_show(value)}")
    if lo is not None and value < lo:
        raise _bad(name, f"must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise _bad(name, f"must be <= {hi}, got {value}")
    return int(value)


def check_float(
    name: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """A finite number in the range given by lo/hi; `_open` excludes that bound."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(name, f"expected a number, got {_kind(value)} {_show(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise _bad(name, f"must be finite, got {number}")
    if lo is not None and (number <= lo if lo_open else number < lo):
        raise _bad(name, f"must be {'>' if lo_open else '>='} {lo}, got {number}")
    if hi is not None and (number >= hi if hi_open else number > hi):
        raise _bad(name, f"must be {'<' if hi_open else '<='} {hi}, got {number}")
    return number


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _bad(name, f"expected true or false, got {_kind(value)} {_show(value)}")
    return value


def check_str(name: str, value: Any, *, allow_empty: bool = True) -> str:
    """A str that is valid Unicode (no lone surrogates, which cannot be encoded as UTF-8)."""
    if not isinstance(value, str):
        hint = " (quote it as a JSON string)" if isinstance(value, (int, float, list)) else ""
        raise _bad(name, f"expected a string, got {_kind(value)} {_show(value)}{hint}")
    if not allow_empty and not value:
        raise _bad(name, "must not be empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _bad(name, f"contains a lone surrogate at index {exc.start} (invalid Unicode)") from None
    return value


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _bad(name, f"must be one of {'|'.join(choices)}, got {_show(value)}")
    return value


def check_optional(check, name: str, value: Any, *args, **kwargs):
    """None passes through; anything else goes to `check`."""
    return None if value is None else check(name, value, *args, **kwargs)


def check_request_id(value: Any, name: str = "id") -> str:
    """A request id: a non-empty string of at most MAX_ID_CHARS, or an int (made a string)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise _bad(name, f"expected a string or integer, got {_kind(value)} {_show(value)}")
    check_str(name, value, allow_empty=False)
    if len(value) > MAX_ID_CHARS:
        raise _bad(name, f"must be at most {MAX_ID_CHARS} characters, got {len(value)}")
    return value


def check_token_ids(name: str, value: Any, *, min_len: int = 0) -> list[int]:
    """A list of token ids in [0, 2^31); a single int is a one-element list."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise _bad(name, f"expected a list of token ids, got {_kind(value)} {_show(value)}")
    # Fast path in C for long prompts; the loop below only runs to name the bad element.
    all_ok = set(map(type, value)) <= {int} and (not value or (min(value) >= 0 and max(value) <= INT32_MAX))
    for index, token in enumerate(() if all_ok else value):
        if isinstance(token, bool) or not isinstance(token, int):
            raise _bad(name, f"element {index} is {_kind(token)} {_show(token)}, expected an integer")
        if token < 0 or token > INT32_MAX:
            raise _bad(name, f"element {index} is {token}, token ids must be in [0, {INT32_MAX}]")
    if len(value) < min_len:
        raise _bad(name, f"needs at least {min_len} ids, got {len(value)}")
    return list(value)


def check_ids_or_file(name: str, value: Any, *, min_len: int = 0) -> list[int] | IdsFile:
    """Token ids, or an IdsFile whose contents are checked once the server reads it."""
    if isinstance(value, IdsFile):
        return value
    return check_token_ids(name, value, min_len=min_len)


def check_str_tuple(name: str, value: Any, *, max_len: int) -> tuple[str, ...]:
    """Non-empty strings, at most max_len of them; a single string is a one-element tuple."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise _bad(name, f"expected a list of strings, got {_kind(value)} {_show(value)}")
    if len(value) > max_len:
        raise _bad(name, f"at most {max_len} entries, got {len(value)}")
    return tuple(check_str(f"{name}[{i}]", item, allow_empty=False) for i, item in enumerate(value))
