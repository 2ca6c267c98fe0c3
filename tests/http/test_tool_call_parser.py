"""ToolCallParser on its own: the formats it recognises, what it refuses, and that the way the
output is cut into tokens never changes the result (property test)."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashd.clients.http.tools import TextPiece, ToolCall, ToolCallParser

NAMES = {"get_weather", "get_time"}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def parse(text: str, cuts: list[int] | None = None, names=NAMES) -> list:
    """Pieces from feeding `text` cut at `cuts`, with consecutive text pieces merged."""
    parser = ToolCallParser(names)
    bounds = [0, *sorted(set(c for c in (cuts or []) if 0 < c < len(text))), len(text)]
    pieces = []
    for start, end in zip(bounds, bounds[1:]):
        pieces += parser.feed(text[start:end])
    pieces += parser.finish()
    merged: list = []
    for piece in pieces:
        if isinstance(piece, TextPiece) and merged and isinstance(merged[-1], TextPiece):
            merged[-1] = TextPiece(merged[-1].text + piece.text)
        else:
            merged.append(piece)
    return merged


PARIS = ToolCall("get_weather", {"city": "Paris"})

CASES = [
    (CALL, [PARIS]),
    ("Sure.\n" + CALL, [TextPiece("Sure.\n"), PARIS]),
    (CALL + "\n" + CALL, [PARIS, PARIS]),
    (CALL + "\nAnything else?", [PARIS, TextPiece("\nAnything else?")]),
    (CALL + "\n\n", [PARIS]),  # whitespace after the last call is dropped
    ('<tool_call>{"name": "get_time", "parameters": {}}</tool_call>', [ToolCall("get_time", {})]),
    ('<tool_call>\n{"name": "get_time", "arguments": "{}"}\n</tool_call>', [ToolCall("get_time", {})]),
    ('<tool_call>\n{"name": "get_time", "arguments": {}}\n', [ToolCall("get_time", {})]),  # cut before the tag
    ('  {"name": "get_weather", "arguments": {"city": "Paris"}}  ', [PARIS]),
    ('[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]',
     [PARIS, ToolCall("get_time", {})]),
    ('{"name": "get_time", "arguments": {}}\n{"name": "get_time", "arguments": {}}',
     [ToolCall("get_time", {}), ToolCall("get_time", {})]),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', [PARIS]),
    ('```\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', [PARIS]),
    # not calls: the text comes back as it was
    ('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', None),
    ('<tool_call>\n{"name": "get_time", "arguments": [1]}\n</tool_call>', None),
    ('<tool_call>\n{"name": "get_time", "arguments": {}, "extra": 1}\n</tool_call>', None),
    ('<tool_call>\n{"name": "get_time", "arguments": {}} {"name": "get_time"}\n</tool_call>', None),
    ('<tool_call>\n{"name": "get_time", "arguments": "{oops"}\n</tool_call>', None),
    ('<tool_call> not json', None),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}} and some words', None),
    ('{"city": "Paris"}', None),
    ('[1, 2, 3]', None),
    ('```python\nprint("hi")\n```', None),
    ('```json\n{"a": 1}\n```', None),
    ("a < b and <tool_ca but no tag", None),
    ("<tool_call", None),
    ("", []),
    ("   ", None),
]


@pytest.mark.parametrize("text, expected", CASES)
def test_formats(text, expected):
    assert parse(text) == (expected if expected is not None else [TextPiece(text)])


def test_every_cut_gives_the_same_result():
    for text, expected in CASES:
        whole = parse(text)
        for cut in range(len(text) + 1):
            assert parse(text, [cut]) == whole, (text, cut)


def test_text_is_released_as_soon_as_it_cannot_be_a_tag():
    parser = ToolCallParser(NAMES)
    assert parser.feed("Hello <tool") == [TextPiece("Hello ")]
    assert parser.feed("box> done") == [TextPiece("<toolbox> done")]
    assert parser.feed("\n<tool_call>\n") == [TextPiece("\n")]
    assert parser.feed('{"name": "get_time", "arguments": {}}\n</tool_call>') == [ToolCall("get_time", {})]


def test_any_name_without_a_tool_list():
    assert parse('<tool_call>{"name": "x", "arguments": {}}</tool_call>', names=None) == [ToolCall("x", {})]


def test_arguments_json_keeps_unicode():
    assert ToolCall("f", {"city": "Zürich"}).arguments_json == '{"city": "Zürich"}'


text_parts = st.sampled_from(["Hi ", "<tool_call>", "</tool_call>", "\n", "<", "tool", "{", "}", "```",
                              '{"name": "get_time", "arguments": {}}', "json", " ", "x"])


@settings(max_examples=300, deadline=None)
@given(st.lists(text_parts, max_size=12), st.lists(st.integers(0, 200), max_size=8))
def test_cutting_never_changes_the_result_and_no_text_is_lost(parts, cuts):
    text = "".join(parts)
    whole = parse(text)
    assert parse(text, cuts) == whole
    # Nothing is invented or dropped but tags and whitespace: text pieces are substrings in order.
    rest = text
    for piece in whole:
        if isinstance(piece, TextPiece):
            at = rest.find(piece.text)
            assert at >= 0, (text, whole)
            rest = rest[at + len(piece.text):]
    if not any(isinstance(p, ToolCall) for p in whole):
        assert "".join(p.text for p in whole) == text


@pytest.mark.parametrize("arguments", [{"a": [1, {"b": None}]}, {"q": "</tool_call> inside a string"}])
def test_nested_and_tricky_arguments(arguments):
    body = json.dumps({"name": "get_time", "arguments": arguments})
    got = parse(f"<tool_call>\n{body}\n</tool_call>")
    if "</tool_call>" in json.dumps(arguments):
        # The first closing tag ends the block, so this is not a valid call: the text comes back.
        assert got == [TextPiece(f"<tool_call>\n{body}\n</tool_call>")]
    else:
        assert got == [ToolCall("get_time", arguments)]
