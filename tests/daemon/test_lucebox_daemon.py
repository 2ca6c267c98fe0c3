"""`flashd-lucebox-daemon`: Lucebox's daemon command line and pipes, served by flashd.

The test plays a Lucebox client: it passes a pipe's write end as --stream-fd, writes commands on
stdin, reads one status line per command from stdout and int32 ids from the pipe up to -1.
Reading exactly up to each command's -1 checks the framing: a missing -1 times out, an extra -1
shows up as an empty answer to the next command or as bytes left on the stream at exit.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from tests.daemon.daemon_harness import LONG_MAX_CTX, LUCEBOX_MODULE, READ_TIMEOUT_S, SYNTHETIC_SPEC, generated, write_ids

VOCAB = SYNTHETIC_SPEC.vocab_size
PROMPT = [21, 300, 7, 451, 88, 13]
GENERATE_OK = re.compile(r"ok N=(\d+) gen=(\d+) prefill_s=\d+\.\d{3} decode_s=\d+\.\d{3} "
                         r"decode_tok_s=\d+\.\d stream_fd=\d+")


def ready(daemon) -> None:
    assert daemon.status_line() == "[daemon] ready"


def stdin_dialect_ids(spawn_serve, line: str, *extra: str) -> list[int]:
    serve = spawn_serve(*extra, max_ctx=LONG_MAX_CTX)
    ids, _, done = generated(serve.ask(line, "x"))
    assert done["event"] == "done", done
    return ids


def test_generate_streams_ids_equal_to_the_stdin_dialect(spawn_lucebox, spawn_serve, tmp_path):
    prompt = write_ids(tmp_path / "prompt.bin", PROMPT)
    daemon = spawn_lucebox("--max-ctx=512")
    ready(daemon)
    status, ids = daemon.command(f"{prompt} 20")
    match = GENERATE_OK.fullmatch(status)
    assert match, status
    assert int(match.group(1)) == len(PROMPT) and int(match.group(2)) == len(ids)
    assert 1 <= len(ids) <= 20 and all(0 <= t < VOCAB for t in ids)
    assert ids == stdin_dialect_ids(spawn_serve, f"generate id=x ids=@{prompt} max_tokens=20")
    again_status, again = daemon.command(f"{prompt} 20")
    assert again == ids and GENERATE_OK.fullmatch(again_status)


def test_samp_means_what_lucebox_means(spawn_lucebox, spawn_serve, synthetic_model, tmp_path):
    """samp=temp,top_p,top_k,rep_pen,seed is the stdin dialect's sampling fields with Lucebox's
    256-token penalty window: both must draw the same tokens. The Lucebox daemon decodes
    speculatively with DRAFT (chain), so the stdin dialect does too (sampled speculative output
    has the target's distribution but its own random stream)."""
    prompt = write_ids(tmp_path / "prompt.bin", PROMPT)
    daemon = spawn_lucebox("--max-ctx=512")
    ready(daemon)
    status, ids = daemon.command(f"{prompt} 24 samp=0.8,0.9,40,1.1,7")
    assert GENERATE_OK.fullmatch(status), status
    want = stdin_dialect_ids(spawn_serve, f"generate id=x ids=@{prompt} max_tokens=24 temperature=0.8 top_p=0.9 "
                                          f"top_k=40 repeat_penalty=1.1 repeat_last_n=256 seed=7 spec=chain",
                             "--draft", str(synthetic_model))
    assert ids == want
    greedy_status, greedy = daemon.command(f"{prompt} 24 samp=0,0.9,40,1.1,7")   # temp 0: greedy
    assert greedy == stdin_dialect_ids(spawn_serve, f"generate id=x ids=@{prompt} max_tokens=24")


def test_every_command_ends_with_exactly_one_sentinel(spawn_lucebox, tmp_path):
    prompt = write_ids(tmp_path / "prompt.bin", PROMPT)
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x00\x00\x02")
    out_of_vocab = write_ids(tmp_path / "oov.bin", [1, VOCAB + 1])
    long_prompt = write_ids(tmp_path / "long.bin", [5] * 60)
    daemon = spawn_lucebox("--max-ctx=64")
    ready(daemon)
    first_status, first = daemon.command(f"{prompt} 8")
    assert GENERATE_OK.fullmatch(first_status) and first
    failing = [   # (command, status line prefix)
        (f"{tmp_path}/missing.bin 8", "err bad_request ids: cannot read"),
        (f"{tmp_path}/odd.bin 8", "err bad_request"),
        (f"{out_of_vocab} 8", "err bad_request"),
        (f"{prompt} x", "err bad_request n_gen"),
        (f"{prompt} 0", "err bad_request n_gen"),
        (f"{prompt} -3", "err bad_request n_gen"),
        (f"{prompt}", "err bad_request"),
        (f"{prompt} 8 samp=hot", "err bad_request samp"),
        (f"{prompt} 8 extra", "err bad_request"),
        (f"{long_prompt} 8", "err ctx_overflow"),
        (f"{prompt} 100", "err ctx_overflow"),
        ("hello there", "err unknown_command"),
        ("LIST_SLOTS", "err unknown_command"),
        (f"compress {prompt} 500", "err not_loaded"),
        (f"compress {prompt} 5000", "err bad_request"),
        ("free drafter", "err not_loaded"),
        ("free everything", "err bad_request"),
        ("park sideways", "err bad_request"),
    ]
    for command, prefix in failing:
        status, ids = daemon.command(command)
        assert status.startswith(prefix), (command, status)
        assert ids == [], (command, ids)
    status, ids = daemon.command("park")
    assert status == "ok park what=all" and ids == []
    status, ids = daemon.command(f"{prompt} 8")
    assert status.startswith("err parked") and ids == []
    status, ids = daemon.command("unpark")
    assert status == "ok unpark what=all" and ids == []
    status, ids = daemon.command(f"{prompt} 8")
    assert GENERATE_OK.fullmatch(status) and ids == first     # as before the errors and the park
    assert daemon.command("quit") == ("ok quit", [])
    assert daemon.wait() == 0
    assert daemon.stream_rest() == b""                         # no stray -1 anywhere
    assert daemon.out.at_eof(READ_TIMEOUT_S) == b""


def test_invalid_utf8_and_blank_lines(spawn_lucebox, tmp_path):
    prompt = write_ids(tmp_path / "prompt.bin", PROMPT)
    daemon = spawn_lucebox("--max-ctx=512")
    ready(daemon)
    daemon.proc.stdin.write(b"\n\xff\xfe garbage\n")
    daemon.proc.stdin.flush()
    assert daemon.status_line().startswith("err bad_request")
    assert daemon.stream_until_sentinel() == []
    status, ids = daemon.command(f"{prompt} 4")                 # the blank line was no command
    assert GENERATE_OK.fullmatch(status) and ids


def test_a_parked_drafter_means_plain_decoding(spawn_lucebox, tmp_path):
    """Lucebox's pflash client parks the drafter right after boot, then generates: the tokens are plain
    decoding's (speculative decoding never changes them), never an error."""
    prompt = write_ids(tmp_path / "prompt.bin", PROMPT)
    daemon = spawn_lucebox("--max-ctx=512")
    ready(daemon)
    _, want = daemon.command(f"{prompt} 16")
    assert daemon.command("park draft") == ("ok park what=draft", [])
    status, got = daemon.command(f"{prompt} 16")
    assert GENERATE_OK.fullmatch(status) and got == want
    assert daemon.command("unpark draft") == ("ok unpark what=draft", [])
    status, got = daemon.command(f"{prompt} 16")
    assert GENERATE_OK.fullmatch(status) and got == want


def test_end_of_stdin_exits_zero(spawn_lucebox):
    daemon = spawn_lucebox()
    ready(daemon)
    daemon.proc.stdin.close()
    assert daemon.wait() == 0
    assert daemon.stream_rest() == b""


def test_ddtree_flags_are_accepted_and_serve_the_same_output(spawn_lucebox, tmp_path):
    prompt = write_ids(tmp_path / "prompt.bin", PROMPT)
    plain = spawn_lucebox("--max-ctx=512")
    ready(plain)
    _, want = plain.command(f"{prompt} 16")
    tree = spawn_lucebox("--max-ctx=512", "--ddtree", "--ddtree-budget=22", "--fast-rollback", "--ddtree-temp=0.7",
                         "--ddtree-no-chain-seed")
    ready(tree)
    status, got = tree.command(f"{prompt} 16")
    assert GENERATE_OK.fullmatch(status) and got == want
    assert "--ddtree-temp 0.7 is accepted but not used" in tree.stderr_tail()


def test_sigterm_cancels_the_running_command(spawn_lucebox, tmp_path):
    prompt = write_ids(tmp_path / "prompt.bin", PROMPT)
    daemon = spawn_lucebox(f"--max-ctx={LONG_MAX_CTX}")
    ready(daemon)
    daemon.send(f"{prompt} 8000")
    first = daemon.stream_buffered_ids(1)
    assert len(first) == 1
    daemon.signal(signal.SIGTERM)
    assert daemon.status_line().startswith("err cancelled")
    rest = daemon.stream_until_sentinel()
    assert len(first) + len(rest) < 8000
    assert daemon.wait() == 0


def test_closing_the_stream_stops_the_daemon(spawn_lucebox, tmp_path):
    prompt = write_ids(tmp_path / "prompt.bin", PROMPT)
    daemon = spawn_lucebox(f"--max-ctx={LONG_MAX_CTX}")
    ready(daemon)
    daemon.send(f"{prompt} 8000")
    assert daemon.stream_buffered_ids(1)
    daemon.close_stream()
    assert daemon.wait() == 1
    assert "closed" in daemon.stderr_tail()


def test_console_script(spawn_lucebox, tmp_path):
    script = shutil.which("flashd-lucebox-daemon")
    if script is None:
        pytest.skip("the flashd-lucebox-daemon console script is not installed")
    prompt = write_ids(tmp_path / "prompt.bin", PROMPT)
    daemon = spawn_lucebox("--max-ctx", "512", argv_head=[script])    # `--flag VALUE` works too
    ready(daemon)
    status, ids = daemon.command(f"{prompt} 5")
    assert GENERATE_OK.fullmatch(status) and ids


# --------------------------------------------------------------------------- bad command lines

def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*LUCEBOX_MODULE, *argv], stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=READ_TIMEOUT_S, **kwargs)


@pytest.mark.parametrize("argv,needle", [
    (["{model}", "{model}", "--stream-fd=1"], b"--daemon is required"),
    (["{model}", "{model}", "--daemon"], b"--stream-fd=FD is required"),
    (["{model}", "--daemon", "--stream-fd=1"], b"TARGET and DRAFT"),
    (["{model}", "{model}", "--daemon", "--stream-fd=1", "--frobnicate"], b"unknown flag"),
    (["{model}", "{model}", "--daemon", "--stream-fd=x"], b"expects an integer"),
    (["{model}", "{model}", "--daemon", "--stream-fd=1", "--max-ctx=4"], b"max_ctx"),
], ids=["no-daemon", "no-stream-fd", "no-draft", "unknown-flag", "bad-fd", "tiny-ctx"])
def test_bad_argv_is_a_usage_error(synthetic_model, argv, needle):
    result = _run([a.replace("{model}", str(synthetic_model)) for a in argv])
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and result.stdout == b""


def test_vram_budget_comes_from_the_environment(synthetic_model):
    """Lucebox's argv has no room for --vram-budget: $FLASHD_VRAM_BUDGET, parsed as strictly."""
    argv = [str(synthetic_model), str(synthetic_model), "--daemon", "--stream-fd=2"]
    bad = _run(argv, env={**os.environ, "FLASHD_VRAM_BUDGET": "lots"})
    assert bad.returncode == 2 and b"$FLASHD_VRAM_BUDGET: 'lots' is not a size" in bad.stderr
    small = _run(argv, env={**os.environ, "FLASHD_VRAM_BUDGET": "524388KiB"})     # the 512 MiB margin + 100 KiB
    assert small.returncode == 1 and b"does not fit --vram-budget 512.1 MiB" in small.stderr and small.stdout == b""


def test_unreadable_or_non_gguf_draft_is_refused(synthetic_model, tmp_path):
    missing = _run([str(synthetic_model), str(tmp_path / "draft.gguf"), "--daemon", "--stream-fd=2"])
    assert missing.returncode == 1 and b"draft.gguf" in missing.stderr and missing.stdout == b""
    (tmp_path / "notes.txt").write_text("not a model")
    bogus = _run([str(synthetic_model), str(tmp_path / "notes.txt"), "--daemon", "--stream-fd=2"])
    assert bogus.returncode == 1 and b"not a GGUF file" in bogus.stderr


@pytest.mark.parametrize("fd", ["987", "1"], ids=["not-open", "stdout"])
def test_stream_fd_must_be_an_open_fd_of_its_own(synthetic_model, fd):
    result = _run([str(synthetic_model), str(synthetic_model), "--daemon", f"--stream-fd={fd}"])
    assert result.returncode == 1 and f"--stream-fd={fd}".encode() in result.stderr and result.stdout == b""


def test_no_arguments_prints_the_usage():
    result = subprocess.run([sys.executable, "-m", "flashd.daemon.lucebox"], capture_output=True,
                            timeout=READ_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and b"usage: flashd-lucebox-daemon" in result.stderr
