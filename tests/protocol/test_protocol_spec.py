"""SPEC.md is the user-facing reference: its tables must match the code."""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from flashd.protocol import lucebox
from flashd.protocol.errors import ERROR_CODES
from flashd.protocol.messages import VERBS, WIRE_FIELDS, _wire_fields

SPEC = (Path(__file__).resolve().parents[2] / "protocol" / "SPEC.md").read_text(encoding="utf-8")
ROW = re.compile(r"^\| `([^`]+)` \|(.*)$", re.MULTILINE)


def section(title_pattern):
    """The text from the heading matching title_pattern to the next heading of any level."""
    match = re.search(rf"^#+ {title_pattern}\s*$(.*?)(?=^#+ |\Z)", SPEC, re.MULTILINE | re.DOTALL)
    assert match, f"no section {title_pattern!r} in SPEC.md"
    return match.group(1)


def verb_section(verb):
    return section(rf"(?:[a-z]+ / )?{verb}(?: / [a-z]+)?")


def test_error_code_table_matches():
    codes = {name for name, _ in ROW.findall(section("Error codes"))}
    assert codes == ERROR_CODES


@pytest.mark.parametrize("verb", list(VERBS))
def test_verb_fields_and_defaults_match(verb):
    text = verb_section(verb)
    rows = {name: rest for name, rest in ROW.findall(text)}
    assert set(rows) == set(WIRE_FIELDS[verb]), f"{verb}: SPEC fields differ from the code"
    if not rows:
        assert "No fields" in text
    for name, field in _wire_fields(VERBS[verb]).items():
        cells = [cell.strip() for cell in rows[name].split("|")]
        default_cell = cells[1]
        if field.default is dataclasses.MISSING:
            assert default_cell == "required", (verb, name)
            continue
        default = field.default
        expected = list(default) if isinstance(default, tuple) else default
        assert json.loads(default_cell.strip("`")) == expected, (verb, name, default_cell)


def test_lucebox_flag_table_matches():
    flags = {name.split("=")[0] for name, _ in ROW.findall(section("Lucebox-compatible dialect"))
             if name.startswith("--")}
    assert flags == set(lucebox._VALUE_FLAGS) | set(lucebox._SWITCHES)


def code_blocks(text):
    return re.findall(r"^```\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_json_examples_are_valid_events():
    from flashd.protocol.events import EVENT_NAMES
    from flashd.protocol.errors import ERROR_CODES as codes

    examples = [line for block in code_blocks(SPEC) for line in block.splitlines()
                if line.startswith("{") and "..." not in line]
    examples += re.findall(r"`(\{\"id\".*?\})`", SPEC)
    assert len(examples) >= 10
    for line in examples:
        event = json.loads(line)
        if "event" in event:  # msgpack request example has "cmd" instead
            assert event["event"] in EVENT_NAMES, line
            if event["event"] == "error":
                assert event["code"] in codes


def test_line_dialect_examples_parse():
    from flashd.protocol.lines import parse_line

    block = code_blocks(section("Line dialect"))[0]
    requests = [line for line in block.splitlines() if line and not line.startswith(("{", "..."))]
    assert len(requests) == 7
    for line in requests:
        assert parse_line(line, "d0") is not None, line


def test_lucebox_status_line_examples_match_the_helpers():
    block = code_blocks(section("Lucebox-compatible dialect"))[1]
    lines = [line.split("   (")[0].rstrip() for line in block.splitlines()]
    assert lines[0] == lucebox.generate_ok_line(5, 64, 0.003, 0.110, 3)
    assert lines[1] == lucebox.ok_line("compress", n_in=32000, n_out=1600, ms=812.5)
    assert lines[2] == lucebox.ok_line("park", what="all")
    assert lines[3] == lucebox.err_line("unknown_command", "unknown command 'LIST_SLOTS'")
    assert lines[4] == lucebox.err_line("bad_request", "n_gen: must be in [1, inf], got 0")
