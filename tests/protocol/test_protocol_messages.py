"""The request schema and its single validation path (request_from_fields), IdsFile
resolution, event constructors and the error-code set."""

import dataclasses
import pickle

import pytest

from flashd.protocol import errors, events
from flashd.protocol.errors import ERROR_CODES, ProtocolError
from flashd.protocol.ids import IdsFile, pack_ids, unpack_ids
from flashd.protocol.messages import (
    SAMPLING_FIELDS, VERBS, WIRE_FIELDS, Cancel, Compress, Detokenize, Free, Generate, Park,
    SamplingParams, Score, Status, Tokenize, request_from_fields, request_to_fields,
    resolve_ids_files, verb_of,
)


def raises_protocol(code, *, request_id="unset", match=None):
    """Context manager: a ProtocolError with `code` (and request_id / message text)."""

    class _Check:
        def __enter__(self):
            return self

        def __exit__(self, exc_type, exc, tb):
            assert exc_type is ProtocolError, f"expected ProtocolError({code}), got {exc_type}: {exc}"
            assert exc.code == code, f"code {exc.code!r} != {code!r}: {exc.message}"
            if request_id != "unset":
                assert exc.request_id == request_id
            if match is not None:
                assert match in exc.message, f"{match!r} not in {exc.message!r}"
            self.error = exc
            return True

    return _Check()


# ---------------------------------------------------------------------------- errors


def test_error_codes_are_the_documented_closed_set():
    assert ERROR_CODES == {
        "bad_request", "unknown_command", "ctx_overflow", "not_loaded", "parked", "oom",
        "cancelled", "internal", "overloaded", "not_implemented", "model_output",
    }
    assert set(errors.ERROR_CODE_MEANINGS) == ERROR_CODES


def test_protocol_error_rejects_unknown_code_and_keeps_fields():
    with pytest.raises(ValueError, match="unknown error code"):
        ProtocolError("nope", "x")
    exc = ProtocolError("oom", "out of memory", "r1")
    assert (exc.code, exc.message, exc.request_id) == ("oom", "out of memory", "r1")
    assert str(exc) == "oom: out of memory"
    copy = pickle.loads(pickle.dumps(exc))
    assert (copy.code, copy.message, copy.request_id) == ("oom", "out of memory", "r1")
    assert exc.with_request_id("other") is exc  # an id already set is kept
    assert ProtocolError("oom", "m").with_request_id("r2").request_id == "r2"


# ---------------------------------------------------------------------------- sampling


def test_sampling_defaults_and_greedy():
    params = SamplingParams()
    assert params.greedy
    assert (params.temperature, params.top_k, params.top_p, params.min_p) == (0.0, 0, 1.0, 0.0)
    assert (params.repeat_penalty, params.repeat_last_n, params.seed) == (1.0, 64, 0)
    assert not SamplingParams(temperature=0.5).greedy
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 1.0


def test_sampling_widens_ints_to_float():
    params = SamplingParams(temperature=1, top_p=1, repeat_penalty=2, frequency_penalty=-2)
    assert isinstance(params.temperature, float) and params.temperature == 1.0
    assert isinstance(params.frequency_penalty, float)


@pytest.mark.parametrize(
    "field, value, why",
    [
        ("temperature", -0.1, ">= 0"),
        ("temperature", float("nan"), "finite"),
        ("temperature", float("inf"), "finite"),
        ("temperature", "0.5", "expected a number"),
        ("temperature", True, "expected a number"),
        ("top_k", -1, ">= 0"),
        ("top_k", 1.0, "expected an integer"),
        ("top_k", 2**31, "<="),
        ("top_p", 0.0, "> 0"),
        ("top_p", 1.01, "<= 1"),
        ("min_p", 1.0, "< 1"),
        ("min_p", -0.1, ">= 0"),
        ("repeat_penalty", 0.0, "> 0"),
        ("repeat_last_n", -1, ">= 0"),
        ("frequency_penalty", 2.5, "<= 2"),
        ("presence_penalty", -2.01, ">= -2"),
        ("seed", -1, ">= 0"),
        ("seed", 2**64, "<="),
        ("seed", False, "expected an integer"),
    ],
)
def test_sampling_rejects_bad_values(field, value, why):
    with raises_protocol("bad_request", match=why) as check:
        SamplingParams(**{field: value})
    assert check.error.message.startswith(f"{field}:")


def test_sampling_accepts_range_edges():
    SamplingParams(top_p=1.0, min_p=0.0, frequency_penalty=-2, presence_penalty=2, seed=2**64 - 1)
    SamplingParams(top_p=1e-9, min_p=0.999, repeat_penalty=1e-6, repeat_last_n=0)


# ---------------------------------------------------------------------------- requests


def test_generate_defaults():
    request = Generate("a", text="x")
    assert request.max_tokens == 256 and request.sampling == SamplingParams()
    assert request.stop == () and request.stop_ids == () and request.logprobs == 0
    assert (request.spec, request.budget, request.draft) == ("off", None, None)
    assert (request.compress, request.keep, request.stream) == (None, None, True)
    assert request.add_special is False and request.ignore_eos is False


def test_generate_normalises_lists_and_single_values():
    request = Generate("a", ids=(1, 2), stop="END", stop_ids=[3, 4])
    assert request.ids == [1, 2] and request.stop == ("END",) and request.stop_ids == (3, 4)
    assert Generate("a", ids=9, stop_ids=2).ids == [9]
    assert Generate("a", ids=9, stop_ids=2).stop_ids == (2,)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "exactly one of text or ids"),
        ({"text": "x", "ids": [1]}, "not both"),
        ({"ids": []}, "at least 1"),
        ({"ids": [1, -2]}, "element 1 is -2"),
        ({"ids": [2**31]}, "element 0"),
        ({"ids": [1, True]}, "element 1 is bool"),
        ({"ids": "1,2"}, "expected a list of token ids"),
        ({"text": 5}, "quote it"),
        ({"text": b"x"}, "expected a string, got bytes"),
        ({"text": "\ud800"}, "lone surrogate"),
        ({"text": "x", "max_tokens": -1}, "max_tokens: must be >= 0"),
        ({"text": "x", "max_tokens": 2**31}, "max_tokens"),
        ({"text": "x", "stop": [""]}, "stop[0]: must not be empty"),
        ({"text": "x", "stop": ["s"] * 17}, "at most 16"),
        ({"text": "x", "stop": [1]}, "stop[0]: expected a string"),
        ({"text": "x", "stop_ids": [-1]}, "stop_ids"),
        ({"text": "x", "stop_ids": list(range(257))}, "at most 256"),
        ({"text": "x", "ignore_eos": 1}, "ignore_eos: expected true or false"),
        ({"text": "x", "logprobs": 21}, "logprobs: must be <= 20"),
        ({"text": "x", "add_special": "yes"}, "add_special"),
        ({"text": "x", "spec": "fast"}, "spec: must be one of off|chain|ddtree"),
        ({"text": "x", "budget": 0}, "budget: must be >= 1"),
        ({"text": "x", "budget": 1025}, "budget: must be <= 1024"),
        ({"text": "x", "draft": ""}, "draft: must not be empty"),
        ({"text": "x", "compress": "yes"}, "compress: must be one of off|auto|always"),
        ({"text": "x", "keep": 0}, "keep: must be > 0"),
        ({"text": "x", "keep": 1.5}, "keep: must be <= 1"),
        ({"text": "x", "stream": None}, "stream"),
        ({"text": "x", "sampling": {"temperature": 1}}, "sampling"),
    ],
)
def test_generate_rejects(kwargs, match):
    with raises_protocol("bad_request", request_id="r9", match=match):
        Generate("r9", **kwargs)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Tokenize("a", text=None), "text: expected a string"),
        (lambda: Tokenize("a", text="x", add_special=0), "add_special"),
        (lambda: Detokenize("a", ids=[-1]), "ids"),
        (lambda: Score("a", ids=[1]), "at least 2"),
        (lambda: Compress("a", keep=0.5), "exactly one of text or ids"),
        (lambda: Compress("a", ids=[1], keep=0.0), "keep: must be > 0"),
        (lambda: Compress("a", ids=[1], drafter=3), "drafter"),
        (lambda: Park("a", what="everything"), "what: must be one of target|draft|all"),
        (lambda: Free("a", what="target"), "what: must be one of drafter"),
        (lambda: Cancel("a", target=""), "target: must not be empty"),
        (lambda: Cancel("a", target=[1]), "target: expected a string or integer"),
    ],
)
def test_other_verbs_reject(make, match):
    with raises_protocol("bad_request", request_id="a", match=match):
        make()


@pytest.mark.parametrize("bad_id", ["", None, 1.5, [1], True, "x" * 257, "\udc80"])
def test_request_ids_are_checked(bad_id):
    with raises_protocol("bad_request", request_id=None, match="id:"):
        Status(bad_id)


def test_int_ids_become_strings():
    assert Status(7).id == "7"
    assert Cancel("a", target=12).target == "12"


def test_every_verb_has_a_class_and_fields():
    assert set(VERBS) == {"generate", "tokenize", "detokenize", "score", "compress", "park",
                          "unpark", "free", "status", "cancel", "quit"}
    assert set(SAMPLING_FIELDS) <= set(WIRE_FIELDS["generate"])
    assert "sampling" not in WIRE_FIELDS["generate"]


# ---------------------------------------------------------------------------- request_from_fields


def test_request_from_fields_gathers_flat_sampling_fields():
    request = request_from_fields("generate", {"id": "a", "text": "x", "temperature": 0.5,
                                               "top_k": 3, "seed": 9}, "d0")
    assert request.sampling == SamplingParams(temperature=0.5, top_k=3, seed=9)


def test_request_from_fields_default_id_and_int_id():
    assert request_from_fields("status", {}, "d7").id == "d7"
    assert request_from_fields("status", {"id": 42}, "d7").id == "42"


def test_request_from_fields_errors_carry_the_id():
    with raises_protocol("unknown_command", request_id="a", match="frobnicate"):
        request_from_fields("frobnicate", {"id": "a"}, "d0")
    with raises_protocol("unknown_command", request_id="d0"):
        request_from_fields("GENERATE", {}, "d0")
    with raises_protocol("bad_request", request_id="a", match="bogus: unknown field for generate"):
        request_from_fields("generate", {"id": "a", "text": "x", "bogus": 1}, "d0")
    with raises_protocol("bad_request", request_id="d0", match="temperature: unknown field for tokenize"):
        request_from_fields("tokenize", {"text": "x", "temperature": 1.0}, "d0")
    with raises_protocol("bad_request", request_id="a", match="temperature: must be >= 0"):
        request_from_fields("generate", {"id": "a", "text": "x", "temperature": -1}, "d0")
    with raises_protocol("bad_request", request_id="a", match="text: required for tokenize"):
        request_from_fields("tokenize", {"id": "a"}, "d0")
    with raises_protocol("bad_request", request_id="a", match="target: required for cancel"):
        request_from_fields("cancel", {"id": "a"}, "d0")
    with raises_protocol("bad_request", request_id=None, match="id:"):
        request_from_fields("status", {"id": {"x": 1}}, "d0")
    with raises_protocol("bad_request", request_id="a", match="field names must be strings"):
        request_from_fields("status", {"id": "a", 3: 1}, "d0")
    with raises_protocol("bad_request", request_id="a", match="sampling: unknown field"):
        request_from_fields("generate", {"id": "a", "text": "x", "sampling": {}}, "d0")


def test_request_to_fields_inverts_request_from_fields(sample_request):
    verb = verb_of(sample_request)
    fields = request_to_fields(sample_request)
    assert fields["id"] == sample_request.id
    assert request_from_fields(verb, fields, "unused") == sample_request


def test_request_to_fields_is_compact():
    assert request_to_fields(Generate("a", text="x")) == {"id": "a", "text": "x"}
    assert request_to_fields(Generate("a", ids=[1], stop=("s",), sampling=SamplingParams(seed=3))) == {
        "id": "a", "ids": [1], "stop": ["s"], "seed": 3}


# ---------------------------------------------------------------------------- @file ids


def _reader(files):
    def read_bytes(path):
        if path not in files:
            raise FileNotFoundError(2, "No such file or directory", path)
        return files[path]
    return read_bytes


def test_resolve_ids_files_reads_little_endian_int32():
    request = Generate("a", ids=IdsFile("/p.bin"), max_tokens=3)
    data = bytes([1, 0, 0, 0, 0x10, 0x27, 0, 0, 0xFF, 0xFF, 0xFF, 0x7F])  # 1, 10000, 2^31-1
    resolved = resolve_ids_files(request, _reader({"/p.bin": data}))
    assert resolved.ids == [1, 10000, 2**31 - 1]
    assert resolved.max_tokens == 3 and request.ids == IdsFile("/p.bin")  # original untouched


def test_resolve_ids_files_leaves_other_requests_alone():
    def never(path):
        raise AssertionError("must not read")
    request = Generate("a", ids=[1, 2])
    assert resolve_ids_files(request, never) is request
    assert resolve_ids_files(Status("s"), never).id == "s"


@pytest.mark.parametrize(
    "request_, files, match",
    [
        (Generate("a", ids=IdsFile("/missing.bin")), {}, "cannot read @/missing.bin: No such file"),
        (Generate("a", ids=IdsFile("/odd.bin")), {"/odd.bin": b"\x01\x00\x00"}, "/odd.bin: 3 bytes"),
        (Generate("a", ids=IdsFile("/empty.bin")), {"/empty.bin": b""}, "at least 1 ids, got 0 (read from @/empty.bin)"),
        (Score("a", ids=IdsFile("/one.bin")), {"/one.bin": pack_ids([5])}, "at least 2"),
        (Detokenize("a", ids=IdsFile("/neg.bin")), {"/neg.bin": pack_ids([3, -1])}, "element 1 is -1"),
        (Compress("a", ids=IdsFile("/empty.bin")), {"/empty.bin": b""}, "at least 1"),
    ],
)
def test_resolve_ids_files_errors_name_the_path(request_, files, match):
    with raises_protocol("bad_request", request_id="a", match=match):
        resolve_ids_files(request_, _reader(files))


def test_resolve_ids_files_turns_any_oserror_into_bad_request():
    def denied(path):
        raise PermissionError(13, "Permission denied", path)
    with raises_protocol("bad_request", request_id="a", match="Permission denied"):
        resolve_ids_files(Detokenize("a", ids=IdsFile("/root/x")), denied)


def test_ids_file_needs_a_path():
    with raises_protocol("bad_request", match="non-empty path"):
        IdsFile("")


def test_pack_and_unpack_ids():
    assert pack_ids([1, -1, 256]) == b"\x01\x00\x00\x00\xff\xff\xff\xff\x00\x01\x00\x00"
    assert unpack_ids(pack_ids([0, -(2**31), 2**31 - 1])) == [0, -(2**31), 2**31 - 1]
    assert unpack_ids(memoryview(b"")) == []
    with pytest.raises(ValueError, match="int32"):
        pack_ids([2**31])
    with pytest.raises(ValueError, match="integers"):
        pack_ids([1.5])


# ---------------------------------------------------------------------------- events


def test_token_event_shape():
    assert events.token_event("a", [198], "\n") == {"id": "a", "event": "token", "ids": [198], "text": "\n"}
    lp = [{"id": 198, "logprob": -0.1, "top": [[198, -0.1], [5, -2.3]]}]
    assert events.token_event("a", [198], "\n", lp)["logprobs"] == lp
    with pytest.raises(ValueError, match="one entry per token"):
        events.token_event("a", [1, 2], "xy", lp)
    with pytest.raises(TypeError):
        events.token_event("a", (1,), "x")


def test_done_event_shape_and_checks():
    event = events.done_event("a", "length", 5, 64, {"decode_ms": 10.0}, {"steps": 14, "accepted_per_step": 4.6})
    assert event == {"id": "a", "event": "done", "reason": "length", "n_prompt": 5, "n_cached": 0, "n_gen": 64,
                     "timings": {"decode_ms": 10.0}, "spec": {"steps": 14, "accepted_per_step": 4.6}}
    assert events.done_event("a", "stop", 600, 1, {}, n_cached=512)["n_cached"] == 512
    assert "spec" not in events.done_event("a", "stop", 1, 0, {})
    whole = events.done_event("a", "stop", 1, 2, {}, ids=[3, 4], text="hi")
    assert (whole["ids"], whole["text"]) == ([3, 4], "hi")
    with pytest.raises(ValueError, match="reason"):
        events.done_event("a", "cancelled", 1, 0, {})
    with pytest.raises(ValueError, match="n_gen"):
        events.done_event("a", "stop", 1, -1, {})
    with pytest.raises(ValueError, match="n_cached"):
        events.done_event("a", "stop", 5, 1, {}, n_cached=6)


def test_result_error_ready_events():
    assert events.result_event("t", ids=[1, 2]) == {"id": "t", "event": "result", "ids": [1, 2]}
    assert events.error_event("c", "ctx_overflow", "too long") == {
        "id": "c", "event": "error", "code": "ctx_overflow", "message": "too long"}
    assert events.error_event(None, "bad_request", "x")["id"] is None
    with pytest.raises(ValueError):
        events.error_event("c", "teapot", "x")
    ready = events.ready_event(model="m.gguf", max_ctx=4096)
    assert ready == {"event": "ready", "protocol": events.PROTOCOL_VERSION, "model": "m.gguf", "max_ctx": 4096}
    assert events.TERMINAL_EVENTS == {"done", "result", "error"}
