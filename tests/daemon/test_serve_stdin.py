"""`flashd serve` over stdin/stdout: spawn the real process, send line-dialect requests, read JSON
events. "Behaves like a fresh daemon" is checked by generating the probes (a greedy and a
seeded sampled generation) and comparing with the probes' output on a daemon that served nothing
else (`reference_outputs`): exact equality, since the same process on the same inputs must
compute the same bits.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest

from tests.daemon.daemon_harness import (
    LONG_GENERATE_TOKENS, LONG_MAX_CTX, READ_TIMEOUT_S, SYNTHETIC_SPEC, ServeDaemon, generated, write_ids,
)

VOCAB = SYNTHETIC_SPEC.vocab_size


def test_ready_event_describes_the_daemon(spawn_serve, synthetic_model):
    daemon = spawn_serve(max_ctx=320)
    ready = daemon.ready
    assert ready["event"] == "ready" and "id" not in ready
    assert ready["protocol"] == 1
    assert ready["model"] == str(synthetic_model)
    assert ready["arch"] == "qwen2" and ready["vocab_size"] == VOCAB and ready["max_ctx"] == 320
    assert ready["pid"] == daemon.proc.pid
    assert ready["zmq"] is None and ready["stdin"] is True
    assert ready["forward"]["path"] == "reference"      # the CPU backend has one forward (cuda: graph / persistent)


def test_generate_streams_tokens_then_one_done(spawn_serve):
    daemon = spawn_serve()
    events = daemon.ask('generate id=g text="hello world" max_tokens=17 ignore_eos=true', "g")
    ids, text, done = generated(events)
    assert done == {**done, "id": "g", "event": "done", "reason": "length", "n_gen": 17}
    assert done["n_prompt"] > 0
    assert len(ids) == 17 and all(0 <= t < VOCAB for t in ids)
    assert [e for e in events if e["event"] in ("done", "result", "error")] == [done]
    # The streamed text is the detokenized ids.
    detok = daemon.ask(f"detokenize id=d ids={','.join(map(str, ids))}", "d")
    assert detok[-1]["event"] == "result" and detok[-1]["text"] == text


def test_stream_false_puts_the_output_in_done(spawn_serve):
    daemon = spawn_serve()
    streamed, _, _ = generated(daemon.ask('generate id=a text="abc" max_tokens=9 ignore_eos=true', "a"))
    events = daemon.ask('generate id=b text="abc" max_tokens=9 ignore_eos=true stream=false', "b")
    assert len(events) == 1 and events[0]["event"] == "done"
    assert events[0]["ids"] == streamed


def test_greedy_output_is_deterministic(spawn_serve, reference_outputs):
    daemon = spawn_serve()
    first = daemon.probe()
    assert first == reference_outputs
    assert daemon.probe() == first


def test_server_assigns_unique_ids(spawn_serve):
    daemon = spawn_serve()
    daemon.send('tokenize text="a"')
    daemon.send('tokenize text="b"')
    daemon.send('tokenize id=mine text="c"')
    first, second, third = (daemon.next_event() for _ in range(3))
    assert first["id"].startswith("r") and second["id"].startswith("r") and first["id"] != second["id"]
    assert third["id"] == "mine"


def test_tokenize_detokenize_round_trip(spawn_serve):
    daemon = spawn_serve()
    text = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # é ü 🙂"
    quoted = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    tok = daemon.ask(f'tokenize id=t text="{quoted}"', "t")[-1]
    assert tok["event"] == "result" and len(tok["ids"]) > 5
    detok = daemon.ask(f"detokenize id=d ids={','.join(map(str, tok['ids']))}", "d")[-1]
    assert detok["text"] == text


def test_score_agrees_with_greedy_generation(spawn_serve):
    """score's argmax at position i is the greedy next token after ids[:i+1]: generate greedily
    from a prompt, then score prompt + output teacher-forced; every argmax must be the token
    generation chose (same model, same math)."""
    daemon = spawn_serve()
    prompt = daemon.ask('tokenize id=t text="Once upon a time"', "t")[-1]["ids"]
    out, _, _ = generated(daemon.ask(f"generate id=g ids={','.join(map(str, prompt))} max_tokens=12 "
                                     f"ignore_eos=true", "g"))
    seq = prompt + out
    result = daemon.ask(f"score id=s ids={','.join(map(str, seq))}", "s")[-1]
    assert result["event"] == "result"
    assert len(result["argmax"]) == len(seq) and len(result["logprobs"]) == len(seq) - 1
    assert result["argmax"][len(prompt) - 1:-1] == out
    assert all(lp <= 0 for lp in result["logprobs"])


def test_status_reports_an_idle_daemon(spawn_serve):
    daemon = spawn_serve(max_ctx=256)
    status = daemon.ask("status id=st", "st")[-1]
    assert status["event"] == "result"
    assert status["running"] is None and status["queued"] == 0
    assert status["max_ctx"] == 256 and status["parked"] == {"target": False}
    assert status["forward"]["path"] == "reference"


def test_ids_file_prompt_equals_inline_ids(spawn_serve, tmp_path):
    daemon = spawn_serve()
    prompt = [5, 17, 300, 42, 7]
    path = write_ids(tmp_path / "prompt.bin", prompt)
    inline, _, _ = generated(daemon.ask(f"generate id=a ids={','.join(map(str, prompt))} max_tokens=8 "
                                        f"ignore_eos=true", "a"))
    from_file, _, done = generated(daemon.ask(f"generate id=b ids=@{path} max_tokens=8 ignore_eos=true", "b"))
    assert from_file == inline and done["n_prompt"] == len(prompt)


def test_the_next_prompt_reuses_the_cached_prefix_and_the_output_is_unchanged(spawn_serve, tmp_path):
    """Prefix reuse (SPEC.md): a prompt that repeats the last one's first 1,100 tokens keeps two
    whole 512-token chunks; its output equals a daemon's with --no-prefix-cache (bit for bit, so
    the greedy ids are equal)."""
    rng = random.Random(7)
    first = [rng.randrange(VOCAB) for _ in range(1200)]
    second = first[:1100] + [rng.randrange(VOCAB) for _ in range(150)]
    files = [write_ids(tmp_path / f"p{i}.bin", p) for i, p in enumerate((first, second))]
    runs = {}
    for flag in ("--prefix-cache", "--no-prefix-cache"):
        daemon = spawn_serve(flag, max_ctx=1400)
        runs[flag] = [generated(daemon.ask(f"generate id=r{i} ids=@{f} max_tokens=12 ignore_eos=true", f"r{i}"))
                      for i, f in enumerate(files)]
        if flag == "--prefix-cache":
            assert daemon.ask("status id=st", "st")[-1]["prefix_cache"] == {
                "enabled": True, "tokens": 1250,            # nothing overwritten yet: no host copy
                "ram": {"snapshots": 0, "tokens": 0, "bytes": 0, "max_bytes": 4096 << 20}}
    (ids_a, _, done_a), (ids_b, _, done_b) = runs["--prefix-cache"]
    assert (done_a["n_cached"], done_b["n_cached"]) == (0, 1024)
    assert done_b["n_prompt"] == 1250
    assert [d["n_cached"] for _, _, d in runs["--no-prefix-cache"]] == [0, 0]
    assert [ids_a, ids_b] == [ids for ids, _, _ in runs["--no-prefix-cache"]]
    status = daemon.ask("status id=st", "st")[-1]           # the --no-prefix-cache daemon
    assert status["prefix_cache"] == {"enabled": False, "tokens": 0, "ram": None}


def test_interleaved_conversations_and_park_keep_their_prefixes_in_host_ram(spawn_serve, tmp_path):
    """A long prompt, an unrelated side request, then the long one continued: the side request's
    prefill overwrites the cache, but the long prompt's chunks were copied to host RAM first and
    come back; parking the target keeps them there too. Outputs equal a --no-prefix-cache daemon's."""
    rng = random.Random(11)
    long_prompt = [rng.randrange(VOCAB) for _ in range(1200)]
    prompts = [long_prompt, [rng.randrange(VOCAB) for _ in range(600)], long_prompt + [rng.randrange(VOCAB)] * 50,
               long_prompt + [rng.randrange(VOCAB) for _ in range(60)]]
    files = [write_ids(tmp_path / f"i{i}.bin", p) for i, p in enumerate(prompts)]
    outputs = {}
    for flag in ("--prefix-cache", "--no-prefix-cache"):
        daemon = spawn_serve(flag, max_ctx=1400)
        runs = []
        for i, f in enumerate(files):
            if i == 3:
                for verb in ("park", "unpark"):
                    assert daemon.ask(f"{verb} id={verb} what=target", verb)[-1]["event"] == "result"
            runs.append(generated(daemon.ask(f"generate id=g{i} ids=@{f} max_tokens=8 ignore_eos=true", f"g{i}")))
        outputs[flag] = [ids for ids, _, _ in runs]
        if flag == "--prefix-cache":
            assert [done["n_cached"] for _, _, done in runs] == [0, 0, 1024, 1024]
            ram = daemon.ask("status id=st", "st")[-1]["prefix_cache"]["ram"]
            assert ram["snapshots"] >= 1 and ram["bytes"] > 0
    assert outputs["--prefix-cache"] == outputs["--no-prefix-cache"]


# ------------------------------------------------------------------------------- bad input

@pytest.fixture(scope="module")
def bad_input_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-files")
    (root / "odd.bin").write_bytes(b"\x01\x00\x00\x00\x02\x00")          # 6 bytes: not whole int32s
    write_ids(root / "out_of_vocab.bin", [1, 2, VOCAB + 5])
    write_ids(root / "negative.bin", [1, -3])
    (root / "empty.bin").write_bytes(b"")
    (root / "a_directory").mkdir()
    return root


@pytest.fixture(scope="module")
def long_lived_daemon(synthetic_model, tmp_path_factory):
    """One daemon for every bad input in turn: each must leave it behaving like a fresh one."""
    daemon = ServeDaemon(synthetic_model, tmp_path_factory.mktemp("bad-input"), "--max-request-bytes", "4096",
                         max_ctx=256)
    yield daemon
    daemon.kill()


# (name, line, expected code, expected id: None for "an id the server assigned", "null" for
# null, the answer when the line's id= is there but unreadable); "{files}" is the files folder.
BAD_LINES = [
    ("unterminated-string", 'generate id=u1 text="abc max_tokens=3', "bad_request", "u1"),
    ("unterminated-list", "generate id=u2 stop=[\"a\" text=\"x\"", "bad_request", "u2"),
    ("no-verb", "id=nv text=\"hi\" max_tokens=2", "unknown_command", None),
    ("only-punctuation", "%%% ### $$$", "unknown_command", None),
    ("unknown-verb", "frobnicate id=uv x=1", "unknown_command", "uv"),
    ("verb-case", "GENERATE id=vc text=\"hi\"", "unknown_command", "vc"),
    ("field-without-value", "generate id=fv text=", "bad_request", "fv"),
    ("not-key-value", "generate id=kv hello", "bad_request", "kv"),
    ("duplicate-field", 'generate id=df text="a" text="b"', "bad_request", "df"),
    ("unknown-field", 'generate id=uf text="hi" frobnicate=1', "bad_request", "uf"),
    ("wrong-type-int", 'generate id=wi text="hi" max_tokens=lots', "bad_request", "wi"),
    ("wrong-type-bool", 'generate id=wb text="hi" ignore_eos=3', "bad_request", "wb"),
    ("wrong-type-text", "generate id=wt text=12", "bad_request", "wt"),
    ("negative-max-tokens", 'generate id=nm text="hi" max_tokens=-1', "bad_request", "nm"),
    ("top-p-out-of-range", 'generate id=tp text="hi" top_p=1.5', "bad_request", "tp"),
    ("negative-temperature", 'generate id=nt text="hi" temperature=-0.5', "bad_request", "nt"),
    ("spec-unknown", 'generate id=su text="hi" spec=magic', "bad_request", "su"),
    ("both-text-and-ids", 'generate id=bt text="hi" ids=1,2', "bad_request", "bt"),
    ("neither-text-nor-ids", "generate id=nn max_tokens=3", "bad_request", "nn"),
    ("bad-id-type", 'generate id=[1,2] text="hi"', "bad_request", "null"),
    ("empty-id", 'generate id="" text="hi"', "bad_request", "null"),
    ("ids-out-of-vocab", f"generate id=ov ids=1,2,{VOCAB} max_tokens=2", "bad_request", "ov"),
    ("ids-negative", "generate id=ng ids=-4,2 max_tokens=2", "bad_request", "ng"),
    ("detokenize-out-of-vocab", f"detokenize id=dv ids={VOCAB + 100}", "bad_request", "dv"),
    ("score-one-id", "score id=s1 ids=[5]", "bad_request", "s1"),
    ("ctx-overflow", 'generate id=co text="hi" max_tokens=300', "ctx_overflow", "co"),
    ("ctx-overflow-ids", f"generate id=ci ids={','.join(['7'] * 250)} max_tokens=10", "ctx_overflow", "ci"),
    ("score-over-ctx", f"score id=sc ids={','.join(['3'] * 257)}", "ctx_overflow", "sc"),
    ("missing-file", "generate id=mf ids=@{files}/does-not-exist.bin", "bad_request", "mf"),
    ("directory-file", "generate id=dr ids=@{files}/a_directory", "bad_request", "dr"),
    ("odd-size-file", "generate id=os ids=@{files}/odd.bin", "bad_request", "os"),
    ("empty-file", "generate id=ef ids=@{files}/empty.bin", "bad_request", "ef"),
    ("file-out-of-vocab", "generate id=fo ids=@{files}/out_of_vocab.bin max_tokens=2", "bad_request", "fo"),
    ("file-negative-id", "generate id=fn ids=@{files}/negative.bin", "bad_request", "fn"),
    ("compress", "compress id=cp ids=1,2,3 keep=0.5", "not_loaded", "cp"),
    ("unknown-drafter", 'generate id=ud text="hi" draft=nonexistent', "not_loaded", "ud"),
    ("free-drafter", "free id=fr what=drafter", "not_loaded", "fr"),
    ("overlong-line", "generate id=ol text=\"" + "x" * 5000 + "\"", "bad_request", None),
]
BAD_BYTES = [
    ("invalid-utf8", b"generate id=iu text=\"\xff\xfe\"\n", "bad_request"),
    ("garbage-bytes", b"\x00\x01\x02\xc3\x28\x80garbage\n", "bad_request"),
    ("lone-surrogate-escape", b'generate id=ls text="\\ud800"\n', "bad_request"),
]


@pytest.mark.parametrize("name,line,code,request_id", BAD_LINES, ids=[b[0] for b in BAD_LINES])
def test_bad_line_is_an_error_and_the_daemon_stays_fresh(long_lived_daemon, reference_outputs, bad_input_files,
                                                         name, line, code, request_id):
    daemon = long_lived_daemon
    daemon.send(line.replace("{files}", str(bad_input_files)))
    event = daemon.next_event()
    assert event["event"] == "error", event
    assert event["code"] == code, event
    assert event["message"]
    if request_id == "null":                                   # an id was given but is unreadable
        assert event["id"] is None
    elif request_id is not None:
        assert event["id"] == request_id
    else:
        assert isinstance(event["id"], str) and event["id"]     # the server's assigned id
    if "{files}" in line and name != "file-out-of-vocab":     # (that file reads fine: the id is named)
        assert str(bad_input_files) in event["message"]          # the error names the file
    assert daemon.probe() == reference_outputs


@pytest.mark.parametrize("name,data,code", BAD_BYTES, ids=[b[0] for b in BAD_BYTES])
def test_bad_bytes_are_an_error_and_the_daemon_stays_fresh(long_lived_daemon, reference_outputs, name, data, code):
    daemon = long_lived_daemon
    daemon.send(data)
    event = daemon.next_event()
    assert event["event"] == "error" and event["code"] == code, event
    assert daemon.probe() == reference_outputs


def test_blank_lines_and_comments_are_ignored(long_lived_daemon, reference_outputs):
    daemon = long_lived_daemon
    daemon.send(b"\n   \n# a comment\r\n")
    assert daemon.probe() == reference_outputs     # the first event read is the probe's own


# ------------------------------------------------------------------------- park, cancel, queue

def test_park_then_unpark_gives_the_same_output(spawn_serve, reference_outputs):
    daemon = spawn_serve()
    before = daemon.probe()
    parked = daemon.ask("park id=p what=target", "p")[-1]
    assert parked["event"] == "result" and parked["parked"] == {"target": True}
    assert daemon.ask("status id=s", "s")[-1]["parked"] == {"target": True}
    refused = daemon.ask('generate id=g text="hi" max_tokens=3', "g")
    assert refused == [{**refused[0], "event": "error", "code": "parked"}]
    assert daemon.ask("score id=sc ids=1,2,3", "sc")[-1]["code"] == "parked"
    tokenized = daemon.ask('tokenize id=t text="still works"', "t")[-1]   # the tokenizer stays loaded
    assert tokenized["event"] == "result"
    unparked = daemon.ask("unpark id=u what=target", "u")[-1]
    assert unparked["event"] == "result" and unparked["parked"] == {"target": False}
    assert daemon.probe() == before == reference_outputs


def _start_long_generate(daemon: ServeDaemon, request_id: str) -> dict:
    daemon.send(f'generate id={request_id} text="count" max_tokens={LONG_GENERATE_TOKENS} ignore_eos=true')
    first = daemon.first_event_for(request_id)
    assert first["event"] == "token", first
    return first


def test_cancel_a_running_generate(spawn_serve, reference_outputs):
    daemon = spawn_serve(max_ctx=LONG_MAX_CTX)
    _start_long_generate(daemon, "long")
    cancel = daemon.ask("cancel id=c target=long", "c")
    assert cancel == [{"id": "c", "event": "result", "cancelled": True}]
    events = daemon.events_for("long")
    terminals = [e for e in events if e["event"] != "token"]
    assert terminals == [{**terminals[0], "id": "long", "event": "error", "code": "cancelled"}]
    assert len(events) < LONG_GENERATE_TOKENS
    daemon.wait_idle()
    again = daemon.ask("cancel id=c2 target=long", "c2")
    assert again[-1]["cancelled"] is False                     # nothing left to cancel
    assert daemon.probe() == reference_outputs


def test_cancel_a_queued_request(spawn_serve, reference_outputs):
    daemon = spawn_serve(max_ctx=LONG_MAX_CTX)
    _start_long_generate(daemon, "long")
    daemon.send('generate id=queued text="hi" max_tokens=4')
    assert daemon.ask("cancel id=c1 target=queued", "c1")[-1]["cancelled"] is True
    queued = daemon.events_for("queued")
    assert [e["event"] for e in queued] == ["error"] and queued[0]["code"] == "cancelled"
    assert daemon.ask("cancel id=c2 target=long", "c2")[-1]["cancelled"] is True
    assert daemon.events_for("long")[-1]["code"] == "cancelled"
    assert daemon.probe() == reference_outputs


def test_queue_overflow_is_overloaded_not_a_hang(spawn_serve, reference_outputs):
    daemon = spawn_serve("--max-queue", "1", max_ctx=LONG_MAX_CTX)
    _start_long_generate(daemon, "long")
    for i in range(4):
        daemon.send(f'generate id=q{i} text="hi" max_tokens=2 ignore_eos=true')
    terminals = {}
    for i in range(1, 4):     # q0 may wait in the queue; q1..q3 find it full and are refused at once
        event = daemon.first_event_for(f"q{i}")
        terminals[f"q{i}"] = event
    assert all(e["event"] == "error" and e["code"] == "overloaded" for e in terminals.values()), terminals
    assert daemon.ask("cancel id=c target=long", "c")[-1]["cancelled"] is True
    assert daemon.events_for("long")[-1]["code"] == "cancelled"
    q0 = daemon.events_for("q0")
    assert q0[-1]["event"] == "done" and q0[-1]["n_gen"] == 2
    assert daemon.probe() == reference_outputs


# ------------------------------------------------------------------------------ stopping

def test_quit_answers_then_exits_zero(spawn_serve):
    daemon = spawn_serve()
    assert daemon.ask("quit id=q", "q") == [{"id": "q", "event": "result", "quitting": True}]
    assert daemon.wait() == 0


def test_quit_cancels_what_is_queued(spawn_serve):
    daemon = spawn_serve(max_ctx=LONG_MAX_CTX)
    _start_long_generate(daemon, "long")
    daemon.send("quit id=q")
    daemon.send('generate id=after text="hi" max_tokens=2')
    assert daemon.ask("cancel id=c target=long", "c")[-1]["cancelled"] is True
    assert daemon.events_for("long")[-1]["code"] == "cancelled"
    assert daemon.events_for("q")[-1] == {"id": "q", "event": "result", "quitting": True}
    assert daemon.events_for("after")[-1]["code"] == "cancelled"
    assert daemon.wait() == 0


def test_end_of_stdin_finishes_pending_work_then_exits_zero(spawn_serve):
    daemon = spawn_serve()
    daemon.send('generate id=last text="bye" max_tokens=40 ignore_eos=true')
    daemon.close_stdin()
    ids, _, done = generated(daemon.events_for("last"))
    assert done["event"] == "done" and len(ids) == 40
    assert daemon.wait() == 0
    assert daemon.out.at_eof(READ_TIMEOUT_S) == b""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_cancels_the_running_request_and_exits_zero(spawn_serve, sig):
    daemon = spawn_serve(max_ctx=LONG_MAX_CTX)
    _start_long_generate(daemon, "long")
    daemon.signal(sig)
    assert daemon.events_for("long")[-1]["code"] == "cancelled"
    assert daemon.wait() == 0


def test_a_reader_that_closes_stdout_stops_the_daemon(spawn_serve):
    """Without --zmq nobody is left to answer: the running request is cancelled, exit 0."""
    daemon = spawn_serve(max_ctx=LONG_MAX_CTX)
    _start_long_generate(daemon, "long")
    daemon.proc.stdout.close()
    assert daemon.wait() == 0
    assert "stdout is closed" in daemon.stderr_tail()


def test_stdout_is_only_protocol_json(spawn_serve):
    """Logs go to stderr: stdout holds nothing but JSON events, and the log has the load line."""
    daemon = spawn_serve()
    daemon.ask('generate id=g text="x" max_tokens=3', "g")
    daemon.ask("quit id=q", "q")
    assert daemon.wait() == 0
    assert daemon.out.at_eof(READ_TIMEOUT_S) == b""
    assert "loaded" in daemon.stderr_tail()


# ------------------------------------------------------------------------- refusing to start

def _run_serve(*args: str, timeout: float = READ_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashd.daemon", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=timeout)


def test_missing_model_fails_with_a_clear_message(tmp_path):
    result = _run_serve("--model", str(tmp_path / "nope.gguf"), "--device", "cpu")
    assert result.returncode != 0 and result.stdout == b""
    assert b"nope.gguf" in result.stderr


def test_non_gguf_model_fails_with_a_clear_message(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model at all")
    result = _run_serve("--model", str(bogus), "--device", "cpu")
    assert result.returncode == 1 and result.stdout == b""
    assert b"not a GGUF file" in result.stderr


def test_unreadable_draft_fails_before_loading(synthetic_model, tmp_path):
    result = _run_serve("--model", str(synthetic_model), "--draft", str(tmp_path / "draft.gguf"))
    assert result.returncode == 1 and b"draft.gguf" in result.stderr


@pytest.mark.parametrize("args,needle", [
    (["--zmq", "tcp://0.0.0.0:5555"], b"zmq-allow-remote"),
    (["--zmq", "tcp://*:5555"], b"zmq-allow-remote"),
    (["--zmq", "udp://127.0.0.1:5555"], b"only tcp:// and ipc://"),
    (["--zmq", "tcp://127.0.0.1"], b"PORT"),
    (["--no-stdin"], b"--no-stdin needs --zmq"),
], ids=["any-interface", "star", "bad-scheme", "no-port", "nothing-to-serve"])
def test_refused_command_lines(synthetic_model, args, needle):
    result = _run_serve("--model", str(synthetic_model), "--device", "cpu", *args)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and result.stdout == b""


def test_draft_files_are_checked_and_reported(spawn_serve, synthetic_model):
    daemon = spawn_serve("--draft", str(synthetic_model), "--draft", "ngram")
    assert daemon.ready["drafts"] == [str(synthetic_model), "ngram"]
    status = daemon.ask("status id=st", "st")[-1]
    assert [d["name"] for d in status["drafters"]] == [synthetic_model.stem, "ngram"]
    assert os.path.exists(daemon.ready["model"])
