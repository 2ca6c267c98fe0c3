"""The Lucebox-compatible dialect: argv, stdin commands, their Requests, stream and status lines."""

import pytest

from flashd.protocol.errors import ProtocolError
from flashd.protocol.ids import IdsFile
from flashd.protocol.lucebox import (
    LUCEBOX_REPEAT_WINDOW, READY_LINE, SENTINEL, LuceboxArgs, LuceboxCompress, LuceboxFree,
    LuceboxGenerate, LuceboxPark, LuceboxQuit, LuceboxUnknown, LuceboxUnpark, encode_ids,
    encode_sentinel, err_line, generate_ok_line, ok_line, parse_argv, parse_command, parse_samp,
    to_request,
)
from flashd.protocol.messages import (
    Compress, Free, Generate, Park, Quit, SamplingParams, Unpark,
)

# ---------------------------------------------------------------------------- argv


def test_minimal_argv():
    args = parse_argv(["/m/target.gguf", "/m/draft", "--daemon", "--stream-fd=5"])
    assert args == LuceboxArgs(target="/m/target.gguf", draft="/m/draft", stream_fd=5, max_ctx=None,
                               ddtree=False, ddtree_budget=None, fast_rollback=False,
                               ddtree_temp=None, ddtree_chain_seed=True)


def test_full_argv_in_both_value_forms():
    expected = LuceboxArgs(target="t.gguf", draft="d.gguf", stream_fd=3, max_ctx=32768, ddtree=True,
                           ddtree_budget=22, fast_rollback=True, ddtree_temp=0.5,
                           ddtree_chain_seed=False)
    assert parse_argv(["t.gguf", "d.gguf", "--daemon", "--stream-fd=3", "--max-ctx=32768", "--ddtree",
                       "--ddtree-budget=22", "--fast-rollback", "--ddtree-temp=0.5",
                       "--ddtree-no-chain-seed"]) == expected
    assert parse_argv(["--daemon", "--stream-fd", "3", "--max-ctx", "32768", "--ddtree",
                       "--ddtree-budget", "22", "--fast-rollback", "--ddtree-temp", "0.5",
                       "--ddtree-no-chain-seed", "t.gguf", "d.gguf"]) == expected


@pytest.mark.parametrize(
    "argv, match",
    [
        (["t", "d", "--daemon", "--stream-fd=3", "-ctk", "q8_0"], "unknown flag '-ctk'"),
        (["t", "d", "--daemon", "--stream-fd=3", "--port=8080"], "unknown flag '--port'"),
        (["t", "d", "--stream-fd=3"], "--daemon is required"),
        (["t", "d", "--daemon"], "--stream-fd=FD is required"),
        (["t", "--daemon", "--stream-fd=3"], "expected TARGET and DRAFT"),
        (["t", "d", "e", "--daemon", "--stream-fd=3"], "expected TARGET and DRAFT"),
        (["t", "d", "--daemon", "--stream-fd=abc"], "--stream-fd expects an integer"),
        (["t", "d", "--daemon", "--stream-fd"], "--stream-fd needs a value"),
        (["t", "d", "--daemon", "--stream-fd=-1"], "--stream-fd must be an int >= 0"),
        (["t", "d", "--daemon=1", "--stream-fd=3"], "--daemon takes no value"),
        (["t", "d", "--daemon", "--stream-fd=3", "--stream-fd=4"], "--stream-fd given twice"),
        (["t", "d", "--daemon", "--stream-fd=3", "--max-ctx=0"], "--max-ctx must be >= 1"),
        (["t", "d", "--daemon", "--stream-fd=3", "--ddtree-budget=0"], "--ddtree-budget must be in"),
        (["t", "d", "--daemon", "--stream-fd=3", "--ddtree-temp=0"], "--ddtree-temp must be"),
        (["t", "d", "--daemon", "--stream-fd=3", "--ddtree-temp=nan"], "--ddtree-temp expects a number"),
    ],
)
def test_bad_argv(argv, match):
    with pytest.raises(ValueError, match=match.replace("[", r"\[")) as info:
        parse_argv(argv)
    assert "usage: flashd-lucebox-daemon" in str(info.value)


# ---------------------------------------------------------------------------- commands


def test_generate_without_samp_is_greedy():
    assert parse_command("/tmp/p.bin 64") == LuceboxGenerate("/tmp/p.bin", 64, SamplingParams())
    assert parse_command("./p.bin 1\n").ids_path == "./p.bin"
    assert parse_command("rel/p.bin 2").ids_path == "rel/p.bin"


def test_generate_with_samp():
    command = parse_command("/tmp/p.bin 128 samp=0.7,0.9,40,1.1,42")
    assert command.sampling == SamplingParams(temperature=0.7, top_p=0.9, top_k=40, repeat_penalty=1.1,
                                              seed=42, repeat_last_n=LUCEBOX_REPEAT_WINDOW)
    full = parse_command("/tmp/p.bin 64 samp=0.5,0.95,20,1.0,0,0.8,1.2").sampling
    assert (full.frequency_penalty, full.presence_penalty) == (0.8, 1.2)
    assert parse_command("/tmp/p.bin 8 samp=0.7").sampling == SamplingParams(
        temperature=0.7, repeat_last_n=LUCEBOX_REPEAT_WINDOW)


def test_samp_follows_lucebox_meaning():
    assert parse_samp("0,0.9,40,1.3,7") == SamplingParams()  # temp 0: greedy, rest ignored
    assert parse_samp("-1") == SamplingParams()
    assert parse_samp("1.0,0,0").top_p == 1.0  # top_p 0 means off
    assert parse_samp("1.0,1.0,-5").top_k == 0  # top_k <= 0 means off
    assert parse_samp("1.0,1e-1,5,1,18446744073709551615").seed == 2**64 - 1


@pytest.mark.parametrize(
    "line, match",
    [
        ("/tmp/p.bin", "n_gen is missing"),
        ("/tmp/p.bin 0", "n_gen must be in [1"),
        ("/tmp/p.bin -3", "n_gen must be in [1"),
        ("/tmp/p.bin 12abc", "n_gen must be an integer"),
        ("/tmp/p.bin 8 snap=100:2", "unsupported argument 'snap=100:2'"),
        ("/tmp/p.bin 8 samp=0.7 samp=0.8", "samp: given twice"),
        ("/tmp/p.bin 8 samp=", "samp: temp must be a number"),
        ("/tmp/p.bin 8 samp=abc", "samp: temp must be a number"),
        ("/tmp/p.bin 8 samp=0.7,0.9,1.5", "samp: top_k must be an integer"),
        ("/tmp/p.bin 8 samp=0.7,0.9,4,1,-1", "samp: seed: must be >= 0"),
        ("/tmp/p.bin 8 samp=1,1,1,1,1,1,1,1", "expected 1 to 7"),
        ("/tmp/p.bin 8 samp=0.7,0.9,40,0", "samp: repeat_penalty: must be > 0"),
        ("/tmp/p.bin 8 samp=0.7,0.9,40,1,0,3", "samp: frequency_penalty: must be <= 2"),
        ("/tmp/p.bin 8 samp=0.7,0.9,40,1,18446744073709551616", "samp: seed: must be <="),
        ("/tmp/p.bin 8 samp=1e999", "samp: temp must be finite"),
        ("compress /tmp/p.bin", "compress: expected"),
        ("compress /tmp/p.bin 0 d.gguf", "keep_x1000 must be in [1, 1000]"),
        ("compress /tmp/p.bin 1001 d.gguf", "keep_x1000 must be in [1, 1000]"),
        ("compress /tmp/p.bin 5.5 d.gguf", "keep_x1000 must be an integer"),
        ("compress /tmp/p.bin 50 d.gguf qwen3 extra", "unexpected argument 'extra'"),
        ("compress /tmp/p.bin 50 nopark nopark", "nopark given twice"),
        ("park everything", "park: expected `park [all|target|draft]`"),
        ("park target draft", "park: expected"),
        ("unpark x", "unpark: expected"),
        ("free", "free: expected `free drafter`"),
        ("free target", "free: expected `free drafter`"),
    ],
)
def test_bad_command_arguments(line, match):
    with pytest.raises(ProtocolError) as info:
        parse_command(line)
    assert info.value.code == "bad_request"
    assert match in info.value.message, info.value.message


def test_compress_park_free_quit_commands():
    assert parse_command("compress /tmp/p.bin 50 /m/qwen3-0.6b.gguf") == LuceboxCompress(
        "/tmp/p.bin", 50, drafter="/m/qwen3-0.6b.gguf")
    assert parse_command("compress /tmp/p.bin 50 /m/d.gguf qwen3 nopark") == LuceboxCompress(
        "/tmp/p.bin", 50, drafter="/m/d.gguf", drafter_arch="qwen3", nopark=True)
    assert parse_command("compress /tmp/p.bin 1000") == LuceboxCompress("/tmp/p.bin", 1000)
    assert parse_command("park") == LuceboxPark("all")
    for what in ("all", "target", "draft"):
        assert parse_command(f"park {what}") == LuceboxPark(what)
        assert parse_command(f"unpark {what}") == LuceboxUnpark(what)
    assert parse_command("unpark") == LuceboxUnpark("all")
    assert parse_command("free drafter") == LuceboxFree()
    assert parse_command("drafter free") == LuceboxFree()
    assert parse_command("quit") == LuceboxQuit()
    assert parse_command("exit\r\n") == LuceboxQuit()


def test_blank_and_unknown_commands():
    assert parse_command("") is None
    assert parse_command("  \n") is None
    for line in ("LIST_SLOTS", "SNAPSHOT 3", "generate in.bin 8 out.bin", "hello world", "quit now",
                 "RESTORE 1 /tmp/p.bin 8"):
        assert parse_command(line) == LuceboxUnknown(line)


# ---------------------------------------------------------------------------- to_request


ARGS_CHAIN = parse_argv(["t", "d", "--daemon", "--stream-fd=3"])
ARGS_TREE = parse_argv(["t", "d", "--daemon", "--stream-fd=3", "--ddtree", "--ddtree-budget=22"])


def test_generate_becomes_a_generate_request():
    command = parse_command("/tmp/p.bin 64 samp=0.7,0.9,40,1.1,42")
    assert to_request(command, "l1", ARGS_TREE) == Generate(
        "l1", ids=IdsFile("/tmp/p.bin"), max_tokens=64, sampling=command.sampling, spec="ddtree", budget=22)
    assert to_request(command, "l2", ARGS_CHAIN) == Generate(
        "l2", ids=IdsFile("/tmp/p.bin"), max_tokens=64, sampling=command.sampling, spec="chain")
    assert to_request(parse_command("/tmp/p.bin 8"), "l3") == Generate("l3", ids=IdsFile("/tmp/p.bin"), max_tokens=8)
    assert to_request(parse_command("/tmp/p.bin 8"), 4).id == "4"


def test_other_commands_become_requests():
    assert to_request(parse_command("compress /tmp/p.bin 50 /m/d.gguf"), "c") == Compress(
        "c", ids=IdsFile("/tmp/p.bin"), keep=0.05, drafter="/m/d.gguf")
    assert to_request(parse_command("compress /tmp/p.bin 1000"), "c").keep == 1.0
    assert to_request(parse_command("compress /tmp/p.bin 1000"), "c").drafter is None
    assert to_request(parse_command("park"), "p") == Park("p", what="all")
    assert to_request(parse_command("park draft"), "p") == Park("p", what="draft")
    assert to_request(parse_command("unpark target"), "u") == Unpark("u", what="target")
    assert to_request(parse_command("free drafter"), "f") == Free("f")
    assert to_request(parse_command("exit"), "q") == Quit("q")


def test_unknown_command_becomes_unknown_command_error():
    with pytest.raises(ProtocolError) as info:
        to_request(parse_command("LIST_SLOTS"), "l9")
    assert (info.value.code, info.value.request_id) == ("unknown_command", "l9")
    assert "LIST_SLOTS" in info.value.message
    with pytest.raises(TypeError):
        to_request("quit", "x")


# ---------------------------------------------------------------------------- output


def test_stream_encoding():
    assert SENTINEL == -1
    assert encode_sentinel() == b"\xff\xff\xff\xff"
    assert encode_ids([1, 248069]) == b"\x01\x00\x00\x00" + (248069).to_bytes(4, "little")
    assert encode_ids([]) == b""


def test_status_lines():
    assert READY_LINE == "[daemon] ready"
    assert generate_ok_line(5, 64, 0.0123, 0.5, 3) == (
        "ok N=5 gen=64 prefill_s=0.012 decode_s=0.500 decode_tok_s=128.0 stream_fd=3")
    assert ok_line("park", what="all") == "ok park what=all"
    assert ok_line(n_in=32000, n_out=1600, ms=12.5, cached=True) == "ok n_in=32000 n_out=1600 ms=12.500 cached=1"
    assert ok_line() == "ok"
    with pytest.raises(ValueError):
        ok_line(path="has space")
    assert err_line("unknown_command") == "err unknown_command"
    assert err_line("bad_request", "n_gen: must be\nin [1, inf]") == "err bad_request n_gen: must be in [1, inf]"
    with pytest.raises(ValueError):
        err_line("bad_args", "x")
