"""Bad input on `flashd serve`'s stdin: malformed lines, unknown verbs and fields, wrong types,
huge / negative / non-finite numbers, bytes that are not UTF-8, lines around the size limit and
prompts longer than the context. Each bad line gets exactly one error, under the line's own id
when it has a readable one; afterwards the daemon generates what a fresh one does.

One daemon serves the whole module (every fault here is a request the daemon refuses, which by
the protocol leaves no state behind: reusing it is part of what is checked).
"""
from __future__ import annotations

import pytest

from tests.daemon.daemon_harness import ServeDaemon, generated
from tests.faults.fault_io import ASSIGNED, line_error

LIMIT = 1_000_000          # --max-request-bytes: "a 1 MB line" is just over or just under it
MAX_CTX = 512


@pytest.fixture(scope="module")
def daemon(fault_model, tmp_path_factory):
    d = ServeDaemon(fault_model, tmp_path_factory.mktemp("lines"), "--max-request-bytes", str(LIMIT),
                    max_ctx=MAX_CTX)
    yield d
    d.kill()


def _run(faults, fault_class: str, daemon, fresh_probe, cases) -> None:
    with faults.case(fault_class) as case:
        for line, code, request_id in cases:
            line_error(case, daemon, line, code, request_id, f"{line[:60]!r}")
        case.probe(daemon, fresh_probe, fault_class)


# One table of (line, error code, id) per kind of fault, each with its own test so a failure names the
# kind: the tables have the same shape on purpose.
MALFORMED = [
    ("garbage", "unknown_command", ASSIGNED),
    ("generate", "bad_request", ASSIGNED),
    ('generate id=m1 text="unterminated', "bad_request", "m1"),
    ('generate text="no closing quote id=m2', "bad_request", ASSIGNED),   # id= inside the string
    ("generate id=m3 ids=1,2,", "bad_request", "m3"),
    ("generate id=m4 =5", "bad_request", "m4"),
    ("generate id=m5 7x=1", "bad_request", "m5"),
    ('generate id=m6 text="a" text="b"', "bad_request", "m6"),
    ('generate id=m7 text="a"max_tokens=1', "bad_request", "m7"),
    ('generate id=m8 stop={"a":1} text="a"', "bad_request", "m8"),
    ('generate id=m9 ids=[1,2 text="a"', "bad_request", "m9"),
    ('generate text="a" id=m10 max_tokens=', "bad_request", "m10"),
    ("generate id=m11 ids=@", "bad_request", "m11"),
    ('generate id="" text="a"', "bad_request", None),        # id present but unreadable: null
    ("generate id=[1,2] text=a", "bad_request", None),
    ("\x00\x00\x00", "unknown_command", ASSIGNED),
    ("id=m12", "unknown_command", ASSIGNED),              # the first word is the verb, not a field
]


def test_malformed_lines(faults, daemon, fresh_probe):
    _run(faults, "malformed lines", daemon, fresh_probe, MALFORMED)


def test_blank_and_comment_lines_get_no_answer(faults, daemon, fresh_probe):
    """Not requests (SPEC.md): no reply at all, so the next event is the next request's."""
    with faults.case("malformed lines") as case:
        for line in ("", "   ", "\t", "# generate id=c1 text=a", "   # status id=c2"):
            case.sent()
            daemon.send(line)
        case.sent()
        daemon.send("status id=after-blank")
        event = daemon.next_event()
        case.check(event.get("id") == "after-blank", f"a blank or comment line was answered: {event}")


UNKNOWN = [
    ("frobnicate id=u1", "unknown_command", "u1"),
    ("GENERATE id=u2 text=a", "unknown_command", "u2"),
    ("generate id=u3 text=a bogus=1", "bad_request", "u3"),
    ("generate id=u4 text=a Max_tokens=1", "bad_request", "u4"),
    ("status id=u5 extra=1", "bad_request", "u5"),
    ("cancel id=u6 target=x extra=z", "bad_request", "u6"),
    ("cancel id=u7", "bad_request", "u7"),
    ("quit id=u8 now=true", "bad_request", "u8"),         # must not quit
    ("park id=u9 what=everything", "bad_request", "u9"),
    ("tokenize id=u10", "bad_request", "u10"),
    ("compress id=u11 text=a", "not_loaded", "u11"),      # no prefill drafter on this daemon
    ("free id=u12", "not_loaded", "u12"),
    ("generate id=u13 text=a draft=nosuch spec=chain", "not_loaded", "u13"),
]


def test_unknown_verbs_and_fields(faults, daemon, fresh_probe):
    _run(faults, "unknown verbs and fields", daemon, fresh_probe, UNKNOWN)


WRONG_TYPES = [
    ("generate id=w1 text=a max_tokens=abc", "bad_request", "w1"),
    ("generate id=w2 text=a max_tokens=1.5", "bad_request", "w2"),
    ("generate id=w3 text=a max_tokens=1e3", "bad_request", "w3"),
    ("generate id=w4 text=a max_tokens=true", "bad_request", "w4"),
    ("generate id=w5 text=a temperature=true", "bad_request", "w5"),
    ("generate id=w6 text=a stop=5", "bad_request", "w6"),
    ('generate id=w7 ids="5"', "bad_request", "w7"),
    ('generate id=w8 ids=[1,"a"]', "bad_request", "w8"),
    ("generate id=w9 ids=[1.5]", "bad_request", "w9"),
    ("generate id=w10 text=a stream=1", "bad_request", "w10"),
    ("generate id=w11 text=a ignore_eos=yes", "bad_request", "w11"),
    ("generate id=w12 text=a spec=7", "bad_request", "w12"),
    ("generate id=w13 text=5", "bad_request", "w13"),
    ('generate id=w14 text="a" ids=1,2', "bad_request", "w14"),
    ("score id=w15 ids=5", "bad_request", "w15"),
    ("detokenize id=w16 ids=[[1]]", "bad_request", "w16"),
    ("cancel id=w17 target=[1]", "bad_request", "w17"),
]


def test_wrong_types(faults, daemon, fresh_probe):
    _run(faults, "wrong types", daemon, fresh_probe, WRONG_TYPES)


NUMBERS = [
    ("generate id=n1 text=a max_tokens=-1", "bad_request", "n1"),
    (f"generate id=n2 text=a max_tokens={10**30}", "bad_request", "n2"),
    ("generate id=n3 text=a max_tokens=nan", "bad_request", "n3"),
    ("generate id=n4 text=a max_tokens=2147483648", "bad_request", "n4"),
    ("generate id=n5 text=a temperature=nan", "bad_request", "n5"),
    ("generate id=n6 text=a temperature=inf", "bad_request", "n6"),
    ("generate id=n7 text=a temperature=1e309", "bad_request", "n7"),      # a float that overflows to inf
    ("generate id=n8 text=a temperature=-0.5", "bad_request", "n8"),
    ("generate id=n9 text=a top_p=0", "bad_request", "n9"),
    ("generate id=n10 text=a top_p=1e-400", "bad_request", "n10"),         # underflows to 0
    ("generate id=n11 text=a min_p=1", "bad_request", "n11"),
    ("generate id=n12 text=a top_k=-1", "bad_request", "n12"),
    ("generate id=n13 text=a seed=-1", "bad_request", "n13"),
    (f"generate id=n14 text=a seed={2**64}", "bad_request", "n14"),
    ("generate id=n15 text=a repeat_penalty=0", "bad_request", "n15"),
    ("generate id=n16 text=a frequency_penalty=-2.0001", "bad_request", "n16"),
    (f"generate id=n17 text=a logprobs={10**30}", "bad_request", "n17"),
    ("generate id=n18 text=a budget=0 spec=chain", "bad_request", "n18"),
    ("generate id=n19 ids=-5", "bad_request", "n19"),
    ("generate id=n20 ids=2147483648", "bad_request", "n20"),
    ("generate id=n21 ids=512 max_tokens=1", "bad_request", "n21"),        # = vocab size
    (f"generate id=n22 ids={10**30}", "bad_request", "n22"),
    ("detokenize id=n23 ids=1,-1", "bad_request", "n23"),
    (f"cancel id=n24 target={10**30}", "result", None),                    # an int id is its digits
]


def test_huge_negative_and_non_finite_numbers(faults, daemon, fresh_probe):
    cases = [c for c in NUMBERS if c[1] != "result"]
    with faults.case("huge and negative numbers") as case:
        for line, code, request_id in cases:
            line_error(case, daemon, line, code, request_id, f"{line[:60]!r}")
        # a huge integer id is legal (its decimal string); cancelling nothing answers false
        line, _, _ = NUMBERS[-1]
        case.sent()
        events = daemon.ask(line, "n24")
        case.no_traceback(events, line)
        case.check(events == [{"id": "n24", "event": "result", "cancelled": False}], f"{line}: {events}")
        case.probe(daemon, fresh_probe, "huge and negative numbers")


INVALID_UTF8 = [
    (b'generate id=v1 text="\xff"', "v1"),
    (b'generate id=v2 text="\xc3("', "v2"),
    (b'generate id=v3 text="\xc0\xaf"', "v3"),             # an overlong encoding of '/'
    (b'generate id=v4 text="\xed\xa0\x80"', "v4"),         # a UTF-16 surrogate, encoded
    (b'generate text="\xe2\x82" id=v5', "v5"),             # a truncated sequence before the id
    (b"\xfe\xff id=v6", "v6"),
    (b"generate text=\x80", ASSIGNED),
    (b"generate id=\xff text=a", None),                    # id= present, but not text: null
]


def test_invalid_utf8(faults, daemon, fresh_probe):
    """A line that is not UTF-8 is refused whole, under its id= when the id itself is readable."""
    with faults.case("invalid UTF-8") as case:
        for line, request_id in INVALID_UTF8:
            line_error(case, daemon, line, "bad_request", request_id, f"{line[:60]!r}")
        case.probe(daemon, fresh_probe, "invalid UTF-8")


def test_lines_around_the_size_limit(faults, daemon, fresh_probe):
    """A line of LIMIT bytes is served; one byte more is refused (its bytes are dropped as they
    stream in, so the id cannot be read); neither disturbs the next line."""
    greedy = 'generate id={id} text="The quick brown fox" max_tokens=24 ignore_eos=true'
    with faults.case("1 MB lines") as case:
        at_limit = greedy.format(id="at-limit").ljust(LIMIT)
        case.sent()
        ids, _, done = generated(daemon.ask(at_limit, "at-limit"))
        case.check(done["event"] == "done" and ids == fresh_probe["greedy"],
                   f"a line of exactly {LIMIT} bytes: {done}")
        line_error(case, daemon, greedy.format(id="over").ljust(LIMIT + 1), "bad_request", ASSIGNED,
                   f"a line of {LIMIT + 1} bytes")
        line_error(case, daemon, "generate id=way-over text=" + "a" * (3 * LIMIT), "bad_request", ASSIGNED,
                   f"a line of {3 * LIMIT} bytes")
        # just under the limit and parsed whole: 333k prompt ids, far over the context
        many_ids = "generate id=many ids=" + ",".join(["5"] * ((LIMIT - 40) // 2))
        line_error(case, daemon, many_ids, "ctx_overflow", "many", f"{len(many_ids)} bytes of ids")
        case.probe(daemon, fresh_probe, "1 MB lines")


def test_prompt_longer_than_the_context(faults, daemon, fresh_probe):
    fits = MAX_CTX - 12
    with faults.case("prompt longer than the context") as case:
        for line, request_id in [
            ('generate id=c1 text="' + "word " * 2000 + '"', "c1"),
            ("generate id=c2 ids=" + ",".join(["5"] * (MAX_CTX + 1)) + " max_tokens=0", "c2"),
            ("generate id=c3 ids=" + ",".join(["5"] * fits) + " max_tokens=13", "c3"),
            ("score id=c4 ids=" + ",".join(["5"] * (MAX_CTX + 1)), "c4"),
        ]:
            line_error(case, daemon, line, "ctx_overflow", request_id, f"{line[:40]!r}... ({len(line)} chars)")
        # the boundary itself is allowed: prompt + max_tokens == max_ctx
        case.sent()
        ids, _, done = generated(daemon.ask("generate id=c5 ignore_eos=true max_tokens=12 ids="
                                            + ",".join(["5"] * fits), "c5"))
        case.check(done["event"] == "done" and len(ids) == 12, f"prompt + max_tokens == max_ctx: {done}")
        case.probe(daemon, fresh_probe, "prompt longer than the context")
