"""The Lucebox-compatible dialect: the argv and stdin commands of Lucebox's daemon binary
(`test_dflash --daemon`; protocol/SPEC.md describes it), so existing
Lucebox clients can run flashd unchanged.

  argv    TARGET DRAFT --daemon --stream-fd=FD [--max-ctx=N] [--ddtree] [--ddtree-budget=N]
          [--fast-rollback] [--ddtree-temp=T] [--ddtree-no-chain-seed]   (also `--flag VALUE`)
  stdin   <ids_path> <n_gen> [samp=temp,top_p,top_k,rep_pen,seed[,freq,pres]]   generate
          compress <ids_path> <keep_x1000> [drafter_gguf] [drafter_arch] [nopark]
          park [all|target|draft]   unpark [all|target|draft]   free drafter   quit | exit
  stream  generated ids as little-endian int32 on --stream-fd; every command, failed ones
          included, ends with exactly one -1
  stdout  `[daemon] ready` once, then one `ok ...` / `err CODE message` line per command

Commands become ordinary Requests (to_request) and run through the same engine.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Union

from .checks import check_request_id
from .errors import ERROR_CODES, ProtocolError
from .ids import IdsFile, pack_ids
from .messages import MAX_BUDGET, Request, SamplingParams, request_from_fields

SENTINEL = -1  # ends every command's output on the stream fd
READY_LINE = "[daemon] ready"
LUCEBOX_REPEAT_WINDOW = 256  # Lucebox's SamplerCfg.rep_window: its penalties see 256 tokens

_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


# ---------------------------------------------------------------------------- argv


@dataclass(slots=True, frozen=True)
class LuceboxArgs:
    target: str  # target GGUF path
    draft: str  # speculative drafter path (Lucebox always loads one)
    stream_fd: int  # inherited pipe the token ids are written to
    max_ctx: int | None = None
    ddtree: bool = False  # tree verification instead of chain
    ddtree_budget: int | None = None  # non-root tree nodes
    fast_rollback: bool = False  # accepted for compatibility; flashd never replays (ARCHITECTURE.md, DDTree verification: the commit moves K/V)
    ddtree_temp: float | None = None  # draft softmax temperature for the tree's top-K
    ddtree_chain_seed: bool = True  # insert the top-1 chain before best-first expansion

    def __post_init__(self) -> None:
        for name in ("target", "draft"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name}: expected a non-empty path")
        if isinstance(self.stream_fd, bool) or not isinstance(self.stream_fd, int) or self.stream_fd < 0:
            raise ValueError(f"--stream-fd must be an int >= 0, got {self.stream_fd!r}")
        if self.max_ctx is not None and self.max_ctx < 1:
            raise ValueError(f"--max-ctx must be >= 1, got {self.max_ctx}")
        if self.ddtree_budget is not None and not 1 <= self.ddtree_budget <= MAX_BUDGET:
            raise ValueError(f"--ddtree-budget must be in [1, {MAX_BUDGET}], got {self.ddtree_budget}")
        if self.ddtree_temp is not None and not (math.isfinite(self.ddtree_temp) and self.ddtree_temp > 0):
            raise ValueError(f"--ddtree-temp must be a finite number > 0, got {self.ddtree_temp}")


def _int_arg(flag: str, text: str) -> int:
    if not _INT.fullmatch(text):
        raise ValueError(f"{flag} expects an integer, got {text!r}")
    return int(text)


def _float_arg(flag: str, text: str) -> float:
    if not _FLOAT.fullmatch(text):
        raise ValueError(f"{flag} expects a number, got {text!r}")
    return float(text)


# flag -> (LuceboxArgs field, value parser); switches take no value.
_VALUE_FLAGS = {
    "--stream-fd": ("stream_fd", _int_arg),
    "--max-ctx": ("max_ctx", _int_arg),
    "--ddtree-budget": ("ddtree_budget", _int_arg),
    "--ddtree-temp": ("ddtree_temp", _float_arg),
}
_SWITCHES = {
    "--daemon": ("daemon", True),
    "--ddtree": ("ddtree", True),
    "--fast-rollback": ("fast_rollback", True),
    "--ddtree-no-chain-seed": ("ddtree_chain_seed", False),
}
USAGE = (
    "usage: flashd-lucebox-daemon TARGET DRAFT --daemon --stream-fd=FD [--max-ctx=N] [--ddtree] "
    "[--ddtree-budget=N] [--fast-rollback] [--ddtree-temp=T] [--ddtree-no-chain-seed]"
)


def parse_argv(argv: list[str]) -> LuceboxArgs:
    """The daemon's arguments (without the program name) -> LuceboxArgs; ValueError (with
    the usage line) on an unknown flag, a missing/bad value or a missing --daemon/--stream-fd.
    """
    values: dict[str, Any] = {}
    positional: list[str] = []
    seen: set[str] = set()
    index = 0
    only_positional = False
    while index < len(argv):
        arg = argv[index]
        index += 1
        if only_positional or not arg.startswith("-") or arg == "-":
            positional.append(arg)
            continue
        if arg == "--":
            only_positional = True
            continue
        flag, has_value, value = arg.partition("=")
        if flag in seen:
            raise ValueError(f"{flag} given twice\n{USAGE}")
        seen.add(flag)
        if flag in _SWITCHES:
            if has_value:
                raise ValueError(f"{flag} takes no value, got {arg!r}\n{USAGE}")
            name, setting = _SWITCHES[flag]
            values[name] = setting
        elif flag in _VALUE_FLAGS:
            if not has_value:
                if index >= len(argv):
                    raise ValueError(f"{flag} needs a value\n{USAGE}")
                value = argv[index]
                index += 1
            name, parse = _VALUE_FLAGS[flag]
            try:
                values[name] = parse(flag, value)
            except ValueError as exc:
                raise ValueError(f"{exc}\n{USAGE}") from None
        else:
            raise ValueError(f"unknown flag {flag!r}\n{USAGE}")
    if len(positional) != 2:
        raise ValueError(f"expected TARGET and DRAFT paths, got {len(positional)} positional "
                         f"arguments {positional}\n{USAGE}")
    if not values.pop("daemon", False):
        raise ValueError(f"--daemon is required (flashd-lucebox-daemon only runs as a daemon)\n{USAGE}")
    if "stream_fd" not in values:
        raise ValueError(f"--stream-fd=FD is required (token ids are written there)\n{USAGE}")
    try:
        return LuceboxArgs(target=positional[0], draft=positional[1], **values)
    except ValueError as exc:
        raise ValueError(f"{exc}\n{USAGE}") from None


# ---------------------------------------------------------------------------- commands


@dataclass(slots=True, frozen=True)
class LuceboxGenerate:
    ids_path: str  # raw little-endian int32 prompt file
    n_gen: int  # >= 1
    sampling: SamplingParams = field(default_factory=SamplingParams)  # greedy without samp=


@dataclass(slots=True, frozen=True)
class LuceboxCompress:
    ids_path: str
    keep_x1000: int  # kept fraction x 1000, in [1, 1000]
    drafter: str | None = None  # scoring model GGUF; None = the daemon's default
    drafter_arch: str | None = None  # accepted for compatibility; the GGUF names its arch
    nopark: bool = False  # accepted for compatibility; flashd parks only if its plan needs it


@dataclass(slots=True, frozen=True)
class LuceboxPark:
    what: str = "all"  # all | target | draft; a bare `park` parks all, as in Lucebox


@dataclass(slots=True, frozen=True)
class LuceboxUnpark:
    what: str = "all"


@dataclass(slots=True, frozen=True)
class LuceboxFree:
    what: str = "drafter"


@dataclass(slots=True, frozen=True)
class LuceboxQuit:
    pass


@dataclass(slots=True, frozen=True)
class LuceboxUnknown:
    line: str  # answered with `err unknown_command ...` and one -1


LuceboxCommand = Union[
    LuceboxGenerate, LuceboxCompress, LuceboxPark, LuceboxUnpark, LuceboxFree, LuceboxQuit, LuceboxUnknown
]

_SAMP_NAMES = ("temp", "top_p", "top_k", "rep_pen", "seed", "freq", "pres")
_SAMP_INTS = frozenset({"top_k", "seed"})


def _bad(message: str) -> ProtocolError:
    return ProtocolError("bad_request", message)


def looks_like_path(token: str) -> bool:
    """Lucebox's rule for a generate line: the first word starts with / or . or contains /."""
    return token.startswith(("/", ".")) or "/" in token


def parse_samp(text: str) -> SamplingParams:
    """`temp,top_p,top_k,rep_pen,seed[,freq,pres]` (a prefix may be given) -> SamplingParams
    with Lucebox's meaning: temp <= 0 is greedy (the other values are then ignored), top_p
    outside (0, 1) and top_k <= 0 are off, penalties look at the last 256 tokens.
    """
    parts = text.split(",")
    if not 1 <= len(parts) <= len(_SAMP_NAMES):
        raise _bad(f"samp: expected 1 to {len(_SAMP_NAMES)} comma-separated values "
                   f"({','.join(_SAMP_NAMES)}), got {len(parts)}")
    given: dict[str, float | int] = {}
    for name, part in zip(_SAMP_NAMES, parts):
        if name in _SAMP_INTS:
            if not _INT.fullmatch(part):
                raise _bad(f"samp: {name} must be an integer, got {part!r}")
            given[name] = int(part)
        else:
            if not _FLOAT.fullmatch(part):
                raise _bad(f"samp: {name} must be a number, got {part!r}")
            given[name] = float(part)
    temperature = given["temp"]
    if not math.isfinite(temperature):
        raise _bad(f"samp: temp must be finite, got {temperature}")
    if temperature <= 0:
        return SamplingParams()
    top_p = given.get("top_p", 1.0)
    top_k = given.get("top_k", 0)
    try:
        return SamplingParams(
            temperature=temperature,
            top_p=top_p if 0 < top_p < 1 else 1.0,
            top_k=max(top_k, 0),
            repeat_penalty=given.get("rep_pen", 1.0),
            repeat_last_n=LUCEBOX_REPEAT_WINDOW,
            seed=given.get("seed", 0),
            frequency_penalty=given.get("freq", 0.0),
            presence_penalty=given.get("pres", 0.0),
        )
    except ProtocolError as exc:
        raise _bad(f"samp: {exc.message}") from None


def _parse_int(what: str, text: str, lo: int, hi: int | None = None) -> int:
    if not _INT.fullmatch(text):
        raise _bad(f"{what} must be an integer, got {text!r}")
    value = int(text)
    if value < lo or (hi is not None and value > hi):
        raise _bad(f"{what} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value}")
    return value


def _parse_generate(words: list[str]) -> LuceboxGenerate:
    if len(words) < 2:
        raise _bad("generate: expected `<ids_path> <n_gen> [samp=...]`, n_gen is missing")
    n_gen = _parse_int("n_gen", words[1], 1)
    sampling = SamplingParams()
    extra = words[2:]
    samp = [w for w in extra if w.startswith("samp=")]
    other = [w for w in extra if not w.startswith("samp=")]
    if other:
        raise _bad(f"generate: unsupported argument {other[0]!r} (only samp=... may follow n_gen)")
    if len(samp) > 1:
        raise _bad("samp: given twice")
    if samp:
        sampling = parse_samp(samp[0][len("samp="):])
    return LuceboxGenerate(ids_path=words[0], n_gen=n_gen, sampling=sampling)


def _parse_compress(words: list[str]) -> LuceboxCompress:
    if len(words) < 3:
        raise _bad("compress: expected `compress <ids_path> <keep_x1000> [drafter_gguf] [drafter_arch]`")
    keep_x1000 = _parse_int("keep_x1000", words[2], 1, 1000)
    rest = words[3:]
    nopark = rest.count("nopark")
    if nopark > 1:
        raise _bad("compress: nopark given twice")
    rest = [w for w in rest if w != "nopark"]
    if len(rest) > 2:
        raise _bad(f"compress: unexpected argument {rest[2]!r}")
    return LuceboxCompress(
        ids_path=words[1],
        keep_x1000=keep_x1000,
        drafter=rest[0] if rest else None,
        drafter_arch=rest[1] if len(rest) > 1 else None,
        nopark=bool(nopark),
    )


def _parse_park_what(verb: str, words: list[str]) -> str:
    if len(words) == 1:
        return "all"
    if len(words) == 2 and words[1] in ("all", "target", "draft"):
        return words[1]
    raise _bad(f"{verb}: expected `{verb} [all|target|draft]`, got {' '.join(words)!r}")


def parse_command(line: str) -> LuceboxCommand | None:
    """One stdin line -> a command; None for a blank line. Unknown commands come back as
    LuceboxUnknown (answer `err unknown_command` and one -1); bad arguments to a known
    command raise ProtocolError("bad_request").
    """
    words = line.split()
    if not words:
        return None
    head = words[0]
    if head in ("quit", "exit") and len(words) == 1:
        return LuceboxQuit()
    if head == "park":
        return LuceboxPark(_parse_park_what("park", words))
    if head == "unpark":
        return LuceboxUnpark(_parse_park_what("unpark", words))
    if words in (["free", "drafter"], ["drafter", "free"]):
        return LuceboxFree()
    if head == "free":
        raise _bad(f"free: expected `free drafter`, got {' '.join(words)!r}")
    if head == "compress":
        return _parse_compress(words)
    if looks_like_path(head):
        return _parse_generate(words)
    return LuceboxUnknown(line.strip())


def _sampling_fields(sampling: SamplingParams) -> dict[str, Any]:
    defaults = SamplingParams()
    return {
        name: getattr(sampling, name)
        for name in SamplingParams.__dataclass_fields__
        if getattr(sampling, name) != getattr(defaults, name)
    }


def to_request(command: LuceboxCommand, request_id: str, args: LuceboxArgs | None = None) -> Request:
    """A Lucebox command -> the equivalent Request (through request_from_fields; prompt files
    stay IdsFile for the server to read with resolve_ids_files).

    Generate uses speculative decoding as the Lucebox daemon does: spec=ddtree (budget
    --ddtree-budget) with --ddtree, else spec=chain; without `args`, spec=off.
    Raises ProtocolError: unknown_command for LuceboxUnknown, bad_request for bad values.
    """
    request_id = check_request_id(request_id)
    fields: dict[str, Any] = {"id": request_id}
    if isinstance(command, LuceboxGenerate):
        fields.update(ids=IdsFile(command.ids_path), max_tokens=command.n_gen)
        fields.update(_sampling_fields(command.sampling))
        if args is not None:
            fields["spec"] = "ddtree" if args.ddtree else "chain"
            if args.ddtree and args.ddtree_budget is not None:
                fields["budget"] = args.ddtree_budget
        return request_from_fields("generate", fields, request_id)
    if isinstance(command, LuceboxCompress):
        fields.update(ids=IdsFile(command.ids_path), keep=command.keep_x1000 / 1000)
        if command.drafter is not None:
            fields["drafter"] = command.drafter
        return request_from_fields("compress", fields, request_id)
    if isinstance(command, (LuceboxPark, LuceboxUnpark, LuceboxFree)):
        verb = {LuceboxPark: "park", LuceboxUnpark: "unpark", LuceboxFree: "free"}[type(command)]
        return request_from_fields(verb, {**fields, "what": command.what}, request_id)
    if isinstance(command, LuceboxQuit):
        return request_from_fields("quit", fields, request_id)
    if isinstance(command, LuceboxUnknown):
        raise ProtocolError("unknown_command", f"unknown command {command.line!r:.80}", request_id)
    raise TypeError(f"not a Lucebox command: {command!r}")


# ---------------------------------------------------------------------------- output


def encode_ids(ids: list[int]) -> bytes:
    """Token ids for the stream fd: little-endian int32, 4 bytes each, no header."""
    return pack_ids(ids)


def encode_sentinel() -> bytes:
    """The -1 that ends every command's output on the stream fd."""
    return pack_ids([SENTINEL])


def _status_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:.3f}"
    text = str(value)
    if not text or any(ch.isspace() for ch in text):
        raise ValueError(f"status line values must be non-empty words, got {text!r}")
    return text


def ok_line(*words: str, **fields: Any) -> str:
    """`ok WORD... key=value ...` (floats with 3 decimals), e.g. ok_line("park", what="all")."""
    return " ".join(["ok", *(_status_value(w) for w in words),
                     *(f"{key}={_status_value(value)}" for key, value in fields.items())])


def generate_ok_line(n_prompt: int, n_gen: int, prefill_s: float, decode_s: float, stream_fd: int) -> str:
    """Exactly Lucebox's status line after a generate."""
    decode_tok_s = n_gen / max(1e-9, decode_s)
    return (f"ok N={n_prompt} gen={n_gen} prefill_s={prefill_s:.3f} decode_s={decode_s:.3f} "
            f"decode_tok_s={decode_tok_s:.1f} stream_fd={stream_fd}")


def err_line(code: str, message: str = "") -> str:
    """`err CODE message` on one line (whitespace runs in the message become one space).
    CODE is a flashd error code, so `err unknown_command` reads as in Lucebox.
    """
    if code not in ERROR_CODES:
        raise ValueError(f"unknown error code {code!r}")
    flat = " ".join(message.split())
    return f"err {code} {flat}" if flat else f"err {code}"
