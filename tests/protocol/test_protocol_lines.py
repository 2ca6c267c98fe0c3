"""The line dialect: value grammar, round trips of every verb, bad lines, JSON Lines output."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashd.protocol.errors import ProtocolError
from flashd.protocol.events import done_event, error_event, token_event
from flashd.protocol.ids import IdsFile
from flashd.protocol.lines import encode_event, format_fields, format_request, parse_fields, parse_line
from flashd.protocol.messages import Generate, Park, Score, Status, Tokenize


def line_error(line, default_id="d0", **kwargs):
    with pytest.raises(ProtocolError) as info:
        parse_line(line, default_id, **kwargs)
    return info.value


# ---------------------------------------------------------------------------- value grammar


def test_value_grammar():
    fields = parse_fields(
        'a=-3 b=1e-3 c=1,2,3 d=true e=false f=@/tmp/p.bin g="s p" h=["x","y"] i=word '
        'j=-0.5 k=+7 l=.5 m=2. n=-2.5E+2 o=[1,2] p=[] q=@"/tmp/my file.bin" r=1,-2 s=a=b t=0'
    )
    assert fields == {
        "a": -3, "b": 1e-3, "c": [1, 2, 3], "d": True, "e": False, "f": IdsFile("/tmp/p.bin"),
        "g": "s p", "h": ["x", "y"], "i": "word", "j": -0.5, "k": 7, "l": 0.5, "m": 2.0,
        "n": -250.0, "o": [1, 2], "p": [], "q": IdsFile("/tmp/my file.bin"), "r": [1, -2],
        "s": "a=b", "t": 0,
    }
    assert type(fields["a"]) is int and type(fields["b"]) is float and type(fields["t"]) is int


def test_bare_words_that_are_not_numbers_stay_strings():
    fields = parse_fields("a=1a b=nan c=inf d=True e=1,2, f=١٢ g=0x10 h=1_000 i=- j=1.2.3")
    assert fields == {"a": "1a", "b": "nan", "c": "inf", "d": "True", "e": "1,2,", "f": "١٢",
                      "g": "0x10", "h": "1_000", "i": "-", "j": "1.2.3"}


@pytest.mark.parametrize(
    "literal, text",
    [
        (r'"say \"hi\""', 'say "hi"'),
        (r'"def f():\n\treturn 1\n"', "def f():\n\treturn 1\n"),
        (r'"back\\slash \/ \b\f\r"', "back\\slash / \b\f\r"),
        (r'"\u00e9\u4e2d\ud83d\ude00"', "é中😀"),
        ('"é中😀 raw"', "é中😀 raw"),
        ('"tab\traw"', "tab\traw"),  # raw control characters are accepted inside strings
        ('""', ""),
        ('"a=b c=d"', "a=b c=d"),
        ('"# not a comment"', "# not a comment"),
        (r'"\u0000nul"', "\x00nul"),
    ],
)
def test_json_string_escapes(literal, text):
    request = parse_line(f"tokenize id=t text={literal}", "d0")
    assert request == Tokenize("t", text=text)


def test_json_arrays_and_int_lists():
    request = parse_line(r'generate ids=[1, 2, 3] stop=["\n\n","###"] stop_ids=7', "d0")
    assert request.ids == [1, 2, 3] and request.stop == ("\n\n", "###") and request.stop_ids == (7,)
    assert parse_line("score ids=10,20,30", "d0").ids == [10, 20, 30]
    assert parse_line("generate ids=5", "d0").ids == [5]
    assert parse_line('generate text="x" stop="END"', "d0").stop == ("END",)


def test_whitespace_blank_and_comments():
    assert parse_line("", "d0") is None
    assert parse_line("   \t \r\n", "d0") is None
    assert parse_line("# a comment", "d0") is None
    assert parse_line("   # indented comment", "d0") is None
    assert parse_line("  status   id=s  \r\n", "d0") == Status("s")
    assert parse_line("park\twhat=all", "d0") == Park("d0", what="all")


def test_numbers_widen_for_float_fields():
    request = parse_line('generate text="x" temperature=1 frequency_penalty=-1 keep=1', "d0")
    assert request.sampling.temperature == 1.0 and request.sampling.frequency_penalty == -1.0
    assert request.keep == 1.0


# ---------------------------------------------------------------------------- round trips


def test_every_verb_round_trips(sample_request):
    line = format_request(sample_request)
    assert "\n" not in line
    assert parse_line(line, "other-default") == sample_request


def test_design_examples_parse():
    request = parse_line('generate id=a text="def fib(n):" max_tokens=64 temperature=0 spec=ddtree budget=22', "d")
    assert request == Generate("a", text="def fib(n):", max_tokens=64, spec="ddtree", budget=22)
    compress = parse_line("compress id=b ids=@/tmp/p.bin keep=0.05", "d")
    assert compress.ids == IdsFile("/tmp/p.bin") and compress.keep == 0.05
    assert parse_line('tokenize id=t text="hello world"', "d") == Tokenize("t", text="hello world")
    assert parse_line("score id=s ids=1,2,3", "d") == Score("s", ids=[1, 2, 3])
    for line in ("park what=target", "unpark what=target", "free what=drafter", "status",
                 "cancel target=a", "quit"):
        assert parse_line(line, "d").id == "d"


def test_format_fields_writes_raw_fields():
    assert format_fields("generate", {"id": "a", "text": 'x "y"', "ids": [1, 2], "stream": False,
                                      "seed": 3, "keep": 0.5, "what": "true"}) == (
        'generate id=a text="x \\"y\\"" ids=1,2 stream=false seed=3 keep=0.5 what="true"')


@settings(max_examples=300, deadline=None)
@given(text=st.text(), request_id=st.text(min_size=1, max_size=256))
def test_any_string_survives_the_line_codec(text, request_id):
    request = Tokenize(request_id, text=text)
    assert parse_line(format_request(request), "d0") == request


@settings(max_examples=200, deadline=None)
@given(
    temperature=st.floats(0, 1e6, allow_nan=False),
    top_p=st.floats(1e-6, 1.0),
    frequency_penalty=st.floats(-2, 2),
    seed=st.integers(0, 2**64 - 1),
    ids=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=50),
)
def test_numbers_survive_the_line_codec(temperature, top_p, frequency_penalty, seed, ids):
    fields = {"id": "n", "ids": ids, "temperature": temperature, "top_p": top_p,
              "frequency_penalty": frequency_penalty, "seed": seed}
    request = parse_line(format_fields("generate", fields), "d0")
    assert request.ids == ids and request.sampling.seed == seed
    assert request.sampling.temperature == temperature and request.sampling.top_p == top_p
    assert request.sampling.frequency_penalty == frequency_penalty


@settings(max_examples=500, deadline=None)
@given(line=st.text(max_size=200))
def test_arbitrary_lines_only_raise_protocol_errors(line):
    try:
        parse_line(line, "d0")
    except ProtocolError as exc:
        assert exc.code in ("bad_request", "unknown_command")


# ---------------------------------------------------------------------------- bad lines


# A table, one bad line a row (same shape on purpose); test_protocol_wire.py has a table and an arbitrary-input
# property of the same shape for the wire codec, kept apart so a failure names its codec.
@pytest.mark.parametrize(
    "line, code, request_id, match",
    [
        ('generate text="abc', "bad_request", "d0", "text: unterminated string"),
        ('generate id=a text="abc', "bad_request", "a", "unterminated string"),
        ('generate text="abc\\" id=b', "bad_request", "d0", "unterminated"),
        ('generate text="abc" id=b max_tokens=1 foo', "bad_request", "b", "expected key=value, got 'foo'"),
        ('generate id=a text="x"max_tokens=3', "bad_request", "a", "unexpected 'm' after the value"),
        ('generate id=a ids=[1,2]x', "bad_request", "a", "unexpected 'x'"),
        ('generate text="x" id="z', "bad_request", None, "id: unterminated string"),
        ('generate text="x id=7" max_tokens=zz', "bad_request", "d0", "max_tokens: expected an integer"),
        ('generate text="x id=7" max_tokens=1 m+=1 id=q', "bad_request", "q", "bad field name 'm+'"),
        ('generate max_tokens="zz id=q', "bad_request", "d0", "max_tokens: unterminated"),
        ('generate id=a ids=[1,2', "bad_request", "a", "ids: bad JSON array"),
        ('generate id=a text="bad \\q escape"', "bad_request", "a", "text: bad JSON string: Invalid \\escape"),
        ("generate id=a text=", "bad_request", "a", "text: missing value"),
        ("generate id=a text= max_tokens=1", "bad_request", "a", "text: missing value"),
        ('generate id=a text={"x":1}', "bad_request", "a", "JSON objects are not values"),
        ("generate id=a ids=@", "bad_request", "a", "@ needs a file path"),
        ("generate id=a 1x=3", "bad_request", "a", "bad field name '1x'"),
        ("generate id=a =3", "bad_request", "a", "bad field name ''"),
        ('generate id=a text="x" text="y"', "bad_request", "a", "text: given twice"),
        ("frobnicate id=z", "unknown_command", "z", "unknown command 'frobnicate'"),
        ("GENERATE id=z", "unknown_command", "z", "unknown command"),
        ('frobnicate id="z', "unknown_command", None, "unknown command"),
        ("frobnicate x", "unknown_command", "d0", "unknown command"),
        ("id=a generate", "unknown_command", "d0", "unknown command 'id=a'"),
        ('generate id=a foo=1 text="x"', "bad_request", "a", "foo: unknown field for generate"),
        ("status extra=1", "bad_request", "d0", "extra: unknown field for status"),
        ('generate id=a text="x" ids=1,2', "bad_request", "a", "not both"),
        ("generate id=a", "bad_request", "a", "exactly one of text or ids"),
        ("generate id=a text=5", "bad_request", "a", "text: expected a string, got int 5 (quote it"),
        ("generate id=a text=hello", None, None, None),  # a bare word is a string
        ('generate id=a text="x" temperature=-1', "bad_request", "a", "temperature: must be >= 0"),
        ('generate id=a text="x" temperature=nan', "bad_request", "a", "temperature: expected a number, got str"),
        ('generate id=a text="x" temperature=1e999', "bad_request", "a", "temperature: must be finite"),
        ('generate id=a text="x" top_p=0', "bad_request", "a", "top_p: must be > 0"),
        ('generate id=a text="x" seed=18446744073709551616', "bad_request", "a", "seed: must be <="),
        ('generate id=a text="x" top_k=true', "bad_request", "a", "top_k: expected an integer, got bool"),
        ('generate id=a text="x" max_tokens=1.5', "bad_request", "a", "max_tokens: expected an integer"),
        ('generate id=a text="x" max_tokens=1e3', "bad_request", "a", "max_tokens: expected an integer"),
        ('generate id=a text="x" stream=1', "bad_request", "a", "stream: expected true or false"),
        ('generate id=a text="x" spec=fast', "bad_request", "a", "spec: must be one of off|chain|ddtree"),
        ('generate id=a text="x" stop=[""]', "bad_request", "a", "stop[0]: must not be empty"),
        ('generate id=a text="x" stop=[1,2]', "bad_request", "a", "stop[0]: expected a string"),
        ('generate id=a text="\\ud800"', "bad_request", "a", "lone surrogate"),
        ("generate id=a ids=1,-2", "bad_request", "a", "ids: element 1 is -2"),
        ('generate id=a ids=[1,"b"]', "bad_request", "a", "ids: element 1 is str"),
        ("generate id=a ids=[1.5]", "bad_request", "a", "ids: element 0 is float"),
        ("score id=a ids=1", "bad_request", "a", "at least 2"),
        ("park id=a what=everything", "bad_request", "a", "what: must be one of target|draft|all"),
        ("free id=a what=target", "bad_request", "a", "what: must be one of drafter"),
        ("cancel id=a", "bad_request", "a", "target: required"),
        ("tokenize id=a", "bad_request", "a", "text: required"),
        ('generate id=[1,2] text="x"', "bad_request", None, "id: expected a string or integer"),
        ('generate id="" text="x"', "bad_request", None, "id: must not be empty"),
        ('generate id=1.5 text="x"', "bad_request", None, "id: expected a string or integer"),
    ],
)
def test_bad_lines(line, code, request_id, match):
    if code is None:
        assert parse_line(line, "d0").text == "hello"
        return
    error = line_error(line)
    assert error.code == code, error
    assert error.request_id == request_id
    assert match in error.message, error.message


def test_int_ids_and_oversized_lines():
    assert parse_line('generate id=17 text="x"', "d0").id == "17"
    error = line_error("status " + "x" * 100, max_line_chars=50)
    assert error.code == "bad_request" and "exceeds the limit of 50" in error.message


# ---------------------------------------------------------------------------- output


def test_encode_event_is_one_compact_json_line():
    event = token_event("a", [198, 5], "\n é 🙂\u2028")
    line = encode_event(event)
    assert "\n" not in line and "é" in line and "🙂" in line
    assert line.startswith('{"id":"a","event":"token","ids":[198,5]')
    assert json.loads(line) == event


def test_encode_event_writes_non_finite_floats_as_null():
    event = token_event("a", [1], "x", [{"id": 1, "logprob": float("-inf"), "top": [[1, float("-inf")]]}])
    decoded = json.loads(encode_event(event))
    assert decoded["logprobs"] == [{"id": 1, "logprob": None, "top": [[1, None]]}]
    done = done_event("a", "stop", 1, 1, {"decode_tok_s": float("nan"), "decode_ms": 1.5})
    assert json.loads(encode_event(done))["timings"] == {"decode_tok_s": None, "decode_ms": 1.5}


def test_design_error_example():
    line = encode_event(error_event("c", "ctx_overflow", "prompt 40000 + max_tokens 64 > max_ctx 32768"))
    assert line == ('{"id":"c","event":"error","code":"ctx_overflow",'
                    '"message":"prompt 40000 + max_tokens 64 > max_ctx 32768"}')
