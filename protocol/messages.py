"""The request schema: one slotted dataclass per verb, checked in __post_init__.

Every dialect (line, msgpack, Lucebox) decodes its input into a verb and a dict of plain values
and hands them to request_from_fields, the single validation path. A bad value raises
ProtocolError("bad_request", "<field>: <why>") carrying the request id when it is known.
Events (token/done/result/error/ready) live in events.py and are re-exported here.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Union

from .checks import (
    INT32_MAX,
    check_bool,
    check_choice,
    check_float,
    check_ids_or_file,
    check_int,
    check_optional,
    check_request_id,
    check_str,
    check_str_tuple,
    check_token_ids,
)
from .errors import ProtocolError
from .events import (  # noqa: F401  (re-exported: the brief's API names them in messages)
    DONE_REASONS,
    PROTOCOL_VERSION,
    TERMINAL_EVENTS,
    TIMING_KEYS,
    done_event,
    error_event,
    ready_event,
    result_event,
    token_event,
)
from .ids import IdsFile, unpack_ids

SEED_LIMIT = 2**64  # seeds are uint64
MAX_STOP_STRINGS = 16
MAX_STOP_IDS = 256
MAX_LOGPROBS = 20
MAX_BUDGET = 1024
SPEC_MODES = ("off", "chain", "ddtree", "auto")
COMPRESS_MODES = ("off", "auto", "always")
PARK_TARGETS = ("target", "draft", "all")
FREE_TARGETS = ("drafter",)


@contextlib.contextmanager
def _errors_answer(request_id: str) -> Iterator[None]:
    """Stamp ProtocolErrors raised inside with the request id they answer."""
    try:
        yield
    except ProtocolError as exc:
        raise exc.with_request_id(request_id) from None


def _check_prompt(request: Any, *, ids_min_len: int) -> None:
    """Exactly one of text / ids (ids may still be an unread IdsFile)."""
    if (request.text is None) == (request.ids is None):
        raise ProtocolError("bad_request", "text, ids: give exactly one of text or ids"
                            + (", not both" if request.text is not None else ""))
    if request.text is not None:
        request.text = check_str("text", request.text)
    else:
        request.ids = check_ids_or_file("ids", request.ids, min_len=ids_min_len)


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How the next token is chosen from the target's logits.

    The exact algorithm (penalties, then temperature, top_k, top_p, min_p, and a counter-based
    draw) is defined once in flashd.daemon.sampling; every backend reproduces it.
    """

    temperature: float = 0.0  # 0 = greedy (argmax); >= 0
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # nucleus: smallest set with cumulative probability >= top_p; (0, 1]
    min_p: float = 0.0  # drop tokens with p < min_p * p_max; [0, 1)
    repeat_penalty: float = 1.0  # llama.cpp: logit/penalty if > 0 else logit*penalty; 1 = off
    repeat_last_n: int = 64  # window (tokens) the three penalties look at; 0 = penalties off
    frequency_penalty: float = 0.0  # OpenAI: logit -= f * count(token in window); [-2, 2]
    presence_penalty: float = 0.0  # OpenAI: logit -= p * (token in window); [-2, 2]
    seed: int = 0  # uint64

    def __post_init__(self) -> None:
        normalised = {
            "temperature": check_float("temperature", self.temperature, 0.0),
            "top_k": check_int("top_k", self.top_k, 0, INT32_MAX),
            "top_p": check_float("top_p", self.top_p, 0.0, 1.0, lo_open=True),
            "min_p": check_float("min_p", self.min_p, 0.0, 1.0, hi_open=True),
            "repeat_penalty": check_float("repeat_penalty", self.repeat_penalty, 0.0, lo_open=True),
            "repeat_last_n": check_int("repeat_last_n", self.repeat_last_n, 0, INT32_MAX),
            "frequency_penalty": check_float("frequency_penalty", self.frequency_penalty, -2.0, 2.0),
            "presence_penalty": check_float("presence_penalty", self.presence_penalty, -2.0, 2.0),
            "seed": check_int("seed", self.seed, 0, SEED_LIMIT - 1),
        }
        for name, value in normalised.items():
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


SAMPLING_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SamplingParams))


@dataclass(slots=True)
class Generate:
    id: str
    text: str | None = None  # prompt text, tokenized by the daemon with the target's tokenizer
    ids: list[int] | IdsFile | None = None  # prompt token ids (or an unread @file)
    max_tokens: int = 256  # generated tokens at most; 0 = only prefill
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()  # stop strings; the output ends before the match
    stop_ids: tuple[int, ...] = ()  # stop at these ids too; like EOS, not part of the output
    ignore_eos: bool = False
    logprobs: int = 0  # top alternatives reported per generated token; 0 = no logprobs
    add_special: bool = False  # text prompts: add BOS when the model's tokenizer wants one
    spec: str = "off"  # speculative decoding: off | chain | ddtree
    budget: int | None = None  # ddtree node budget (non-root nodes); None = daemon default
    draft: str | None = None  # drafter name (a --draft model, "ngram" or "mtp"); None = default
    compress: str | None = None  # PFlash prompt compression: off | auto | always; None = the daemon's --compress
    keep: float | None = None  # compression keep ratio; None = daemon default
    threshold: int | None = None  # compress=auto: compress prompts longer than this; None = daemon default
    stream: bool = True  # token events as they come; false = all output in the done event

    def __post_init__(self) -> None:
        self.id = check_request_id(self.id)
        with _errors_answer(self.id):
            _check_prompt(self, ids_min_len=1)
            self.max_tokens = check_int("max_tokens", self.max_tokens, 0, INT32_MAX)
            if not isinstance(self.sampling, SamplingParams):
                raise ProtocolError("bad_request", "sampling: expected SamplingParams")
            self.stop = check_str_tuple("stop", self.stop, max_len=MAX_STOP_STRINGS)
            stop_ids = check_token_ids("stop_ids", self.stop_ids)
            if len(stop_ids) > MAX_STOP_IDS:
                raise ProtocolError("bad_request", f"stop_ids: at most {MAX_STOP_IDS} ids, got {len(stop_ids)}")
            self.stop_ids = tuple(stop_ids)
            self.ignore_eos = check_bool("ignore_eos", self.ignore_eos)
            self.logprobs = check_int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
            self.add_special = check_bool("add_special", self.add_special)
            self.spec = check_choice("spec", self.spec, SPEC_MODES)
            self.budget = check_optional(check_int, "budget", self.budget, 1, MAX_BUDGET)
            self.draft = check_optional(check_str, "draft", self.draft, allow_empty=False)
            self.compress = check_optional(check_choice, "compress", self.compress, COMPRESS_MODES)
            self.keep = check_optional(check_float, "keep", self.keep, 0.0, 1.0, lo_open=True)
            self.threshold = check_optional(check_int, "threshold", self.threshold, 1, INT32_MAX)
            self.stream = check_bool("stream", self.stream)


@dataclass(slots=True)
class Tokenize:
    id: str
    text: str
    add_special: bool = False  # add BOS (and other special tokens) the model wants

    def __post_init__(self) -> None:
        self.id = check_request_id(self.id)
        with _errors_answer(self.id):
            self.text = check_str("text", self.text)
            self.add_special = check_bool("add_special", self.add_special)


@dataclass(slots=True)
class Detokenize:
    id: str
    ids: list[int] | IdsFile

    def __post_init__(self) -> None:
        self.id = check_request_id(self.id)
        with _errors_answer(self.id):
            self.ids = check_ids_or_file("ids", self.ids)


@dataclass(slots=True)
class Score:
    id: str
    ids: list[int] | IdsFile  # at least 2: position i is scored on predicting ids[i+1]

    def __post_init__(self) -> None:
        self.id = check_request_id(self.id)
        with _errors_answer(self.id):
            self.ids = check_ids_or_file("ids", self.ids, min_len=2)


@dataclass(slots=True)
class Compress:
    id: str
    text: str | None = None
    ids: list[int] | IdsFile | None = None
    keep: float = 0.05  # fraction of the prompt to keep, (0, 1]
    drafter: str | None = None  # scoring model path or name; None = the --prefill-drafter
    alpha: float | None = None  # FlashPrefill block threshold in [0, 1]; None = daemon default
    layers: int | None = None   # drafter layers run to score (the first N, 0 = all); None = daemon default
    first_layer: int | None = None  # the first of them whose attention scores; None = daemon default

    def __post_init__(self) -> None:
        self.id = check_request_id(self.id)
        with _errors_answer(self.id):
            _check_prompt(self, ids_min_len=1)
            self.keep = check_float("keep", self.keep, 0.0, 1.0, lo_open=True)
            self.drafter = check_optional(check_str, "drafter", self.drafter, allow_empty=False)
            self.alpha = check_optional(check_float, "alpha", self.alpha, 0.0, 1.0)
            self.layers = check_optional(check_int, "layers", self.layers, 0)
            self.first_layer = check_optional(check_int, "first_layer", self.first_layer, 0)


@dataclass(slots=True)
class _ParkRequest:
    """What park and unpark share: the models they act on. Two request types (the engine dispatches
    on the type), one set of fields and checks."""
    id: str
    what: str = "target"  # target | draft | all

    def __post_init__(self) -> None:
        self.id = check_request_id(self.id)
        with _errors_answer(self.id):
            self.what = check_choice("what", self.what, PARK_TARGETS)


@dataclass(slots=True)
class Park(_ParkRequest):
    pass


@dataclass(slots=True)
class Unpark(_ParkRequest):
    pass


@dataclass(slots=True)
class Free:
    id: str
    what: str = "drafter"  # only the PFlash drafter can be freed

    def __post_init__(self) -> None:
        self.id = check_request_id(self.id)
        with _errors_answer(self.id):
            self.what = check_choice("what", self.what, FREE_TARGETS)


@dataclass(slots=True)
class Status:
    id: str

    def __post_init__(self) -> None:
        self.id = check_request_id(self.id)


@dataclass(slots=True)
class Cancel:
    id: str
    target: str  # id of the request to cancel (ints allowed, made strings like ids)

    def __post_init__(self) -> None:
        self.id = check_request_id(self.id)
        with _errors_answer(self.id):
            self.target = check_request_id(self.target, name="target")


@dataclass(slots=True)
class Quit:
    id: str

    def __post_init__(self) -> None:
        self.id = check_request_id(self.id)


Request = Union[Generate, Tokenize, Detokenize, Score, Compress, Park, Unpark, Free, Status, Cancel, Quit]

VERBS: dict[str, type] = {
    "generate": Generate,
    "tokenize": Tokenize,
    "detokenize": Detokenize,
    "score": Score,
    "compress": Compress,
    "park": Park,
    "unpark": Unpark,
    "free": Free,
    "status": Status,
    "cancel": Cancel,
    "quit": Quit,
}
_VERB_OF: dict[type, str] = {cls: verb for verb, cls in VERBS.items()}


def _wire_fields(cls: type) -> dict[str, dataclasses.Field]:
    """Fields a client may send for `cls`: its own (minus id) with sampling flattened."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "id"}
    if cls is Generate:
        del fields["sampling"]
        fields.update({f.name: f for f in dataclasses.fields(SamplingParams)})
    return fields


WIRE_FIELDS: dict[str, tuple[str, ...]] = {verb: tuple(_wire_fields(cls)) for verb, cls in VERBS.items()}


def verb_of(request: Request) -> str:
    return _VERB_OF[type(request)]


def _id_for_errors(fields: dict, default_id: str) -> str | None:
    """The id an error about these fields answers, or None when the id itself is bad."""
    try:
        return check_request_id(fields.get("id", default_id))
    except ProtocolError:
        return None


def request_from_fields(verb: str, fields: dict, default_id: str) -> Request:
    """Build and check the request for `verb` from decoded field values.

    fields: field name -> str | int | float | bool | list[int] | list[str] | IdsFile; sampling
    fields are flat keys. `id` defaults to default_id (the server's assigned id).
    """
    request_id = _id_for_errors(fields, default_id)
    cls = VERBS.get(verb) if isinstance(verb, str) else None
    if cls is None:
        raise ProtocolError(
            "unknown_command",
            f"unknown command {verb!r}; commands: {', '.join(VERBS)}",
            request_id,
        )
    if request_id is None:
        check_request_id(fields.get("id", default_id))  # raises: the id itself is bad
    allowed = _wire_fields(cls)
    kwargs: dict[str, Any] = {}
    sampling: dict[str, Any] = {}
    with _errors_answer(request_id):
        for key, value in fields.items():
            if key == "id":
                continue
            if not isinstance(key, str):
                raise ProtocolError("bad_request", f"field names must be strings, got {key!r}")
            if key not in allowed:
                raise ProtocolError(
                    "bad_request",
                    f"{key}: unknown field for {verb} (fields: {', '.join(allowed) or 'none'})",
                )
            (sampling if key in SAMPLING_FIELDS else kwargs)[key] = value
        missing = [name for name, f in allowed.items()
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                   and name not in kwargs]
        if missing:
            raise ProtocolError("bad_request", f"{missing[0]}: required for {verb}")
        if sampling:
            kwargs["sampling"] = SamplingParams(**sampling)
        return cls(request_id, **kwargs)


def request_to_fields(request: Request) -> dict[str, Any]:
    """The inverse of request_from_fields: id plus every field that differs from its default
    (sampling flattened; tuples as lists). request_from_fields(verb_of(r), request_to_fields(r),
    any_id) == r.
    """
    out: dict[str, Any] = {"id": request.id}
    for f in dataclasses.fields(request):
        if f.name == "id":
            continue
        value = getattr(request, f.name)
        if isinstance(value, SamplingParams):
            for sf in dataclasses.fields(SamplingParams):
                if getattr(value, sf.name) != sf.default:
                    out[sf.name] = getattr(value, sf.name)
            continue
        if f.default is not dataclasses.MISSING and value == f.default:
            continue
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def resolve_ids_files(request: Request, read_bytes: Callable[[str], bytes]) -> Request:
    """Replace an IdsFile in `request.ids` with the ids read through `read_bytes(path)`.

    The file holds raw little-endian int32 ids. A read failure (OSError) or a size that is not
    a multiple of 4 raises ProtocolError("bad_request") naming the path; the ids are then
    checked like inline ids (range, and count: generate/compress >= 1, score >= 2).
    Requests without an IdsFile are returned unchanged.
    """
    ids = getattr(request, "ids", None)
    if not isinstance(ids, IdsFile):
        return request
    with _errors_answer(request.id):
        try:
            data = read_bytes(ids.path)
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            raise ProtocolError("bad_request", f"ids: cannot read @{ids.path}: {reason}") from None
        values = unpack_ids(data, what=f"ids: @{ids.path}")
        try:
            return dataclasses.replace(request, ids=values)
        except ProtocolError as exc:
            raise ProtocolError(exc.code, f"{exc.message} (read from @{ids.path})") from None
