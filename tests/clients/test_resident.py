"""Resident daemons behind the CLI (clients/resident.py, daemon/lifetime.py): a second command
reuses the first one's daemon, `ps` shows it, `stop` ends it, the keep-alive ends it by itself,
and files left by a killed daemon do not stop the next command.

Each test gets its own runtime directory (FLASHD_RUNTIME_DIR), so "the daemon" is unambiguous;
daemons still running at the end of a test are stopped. Oracle for outputs: the module's shared
daemon (tests/clients/conftest.py) on the same tiny model, greedy.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from flashd.clients.resident import (
    ResidentKey, format_keep_alive, list_resident, parse_keep_alive, runtime_dir, stop_resident,
)
from flashd.clients.spawn import DaemonStartError
from flashd.daemon.lifetime import IdleTimer, ReadyFile

TIMEOUT_S = 60.0
FLASHD = [sys.executable, "-m", "flashd.clients.cli"]


@pytest.fixture
def rundir(monkeypatch):
    directory = tempfile.mkdtemp(prefix="fdrt-")
    monkeypatch.setenv("FLASHD_RUNTIME_DIR", directory)
    yield Path(directory)
    for daemon, _ in list_resident():
        stop_resident(daemon)
    shutil.rmtree(directory, ignore_errors=True)


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(FLASHD + list(args), input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=dict(os.environ))


def generate(model: Path, prompt: str, *extra: str) -> subprocess.CompletedProcess:
    return run_cli("generate", prompt, "--model", str(model), "--device", "cpu", "-n", "8", "-v", *extra)


def _pid_from(stderr: str) -> tuple[str, int]:
    """('started'|'using', pid) from the -v line '[started the resident daemon pid N ...]'."""
    for line in stderr.splitlines():
        if "the resident daemon pid" in line:
            words = line.strip("[]").split()
            return words[0], int(words[words.index("pid") + 1])
    raise AssertionError(f"no resident daemon line in:\n{stderr}")


def _wait_gone(pid: int, timeout_s: float = TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _greedy(client, prompt: str, n: int = 8) -> str:
    return client.complete(prompt, max_tokens=n, temperature=0).text


# ------------------------------------------------------------------------------ the pieces


@pytest.mark.parametrize("text, seconds", [("300", 300.0), ("30s", 30.0), ("5m", 300.0), ("1.5h", 5400.0),
                                           ("2d", 172800.0), ("0", 0.0), (" 10M ", 600.0), ("-1", None),
                                           ("forever", None), ("inf", None)])
def test_keep_alive_durations(text, seconds):
    assert parse_keep_alive(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "five", "-5", "-1s", "1e400", "nan", "3w"])
def test_bad_keep_alive_durations_are_refused(text):
    with pytest.raises(ValueError, match="keep-alive"):
        parse_keep_alive(text)


def test_keep_alive_formats_back():
    assert [format_keep_alive(s) for s in (None, 300.0, 7200.0, 90.0, 0.5)] == ["forever", "5m", "2h", "90s", "0.5s"]


def test_idle_timer_counts_requests_in_flight():
    now = [100.0]
    timer = IdleTimer(10.0, clock=lambda: now[0])
    now[0] += 9.0
    assert timer.idle_s() == 9.0 and not timer.expired()
    timer.begin()
    timer.begin()
    now[0] += 50.0
    assert timer.idle_s() is None and not timer.expired()      # busy: never idle, however long
    timer.end()
    assert timer.idle_s() is None                               # one still in flight
    timer.end()
    now[0] += 10.0
    assert timer.expired() and timer.info() == {"keep_alive_s": 10.0, "idle_s": 10.0}
    assert not IdleTimer(None, clock=lambda: now[0] + 1e9).expired()
    with pytest.raises(ValueError):
        IdleTimer(-1.0)


def test_ready_file_is_replaced_whole_and_removed_only_by_its_owner(tmp_path):
    path = tmp_path / "k.json"
    ready_file = ReadyFile(path)
    ready_file.write({"event": "ready", "zmq": f"ipc://{tmp_path}/k.sock"}, 60.0)
    record = json.loads(path.read_text())
    assert record["pid"] == os.getpid() and record["keep_alive_s"] == 60.0 and record["ready"]["event"] == "ready"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.json"]        # no temporary left behind
    path.write_text(json.dumps({**record, "pid": os.getpid() + 1}))        # a newer daemon's file
    ready_file.remove()
    assert path.exists()
    (tmp_path / "k.sock").write_text("")
    path.write_text(json.dumps(record))
    ready_file.remove(f"ipc://{tmp_path}/k.sock")
    assert list(tmp_path.iterdir()) == []


def test_runtime_dir_must_be_private(monkeypatch, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv("FLASHD_RUNTIME_DIR", str(shared))
    with pytest.raises(DaemonStartError, match="mode 0700"):
        runtime_dir()
    monkeypatch.setenv("FLASHD_RUNTIME_DIR", str(tmp_path / "new" / "dir"))
    assert runtime_dir().stat().st_mode & 0o777 == 0o700


def test_resident_key_separates_settings():
    base = ResidentKey(model="/m.gguf", device="cpu", max_ctx=4096)
    assert base.digest() == ResidentKey(model="/m.gguf", device="cpu", max_ctx=4096).digest()
    others = [ResidentKey(model="/n.gguf", device="cpu", max_ctx=4096), ResidentKey(model="/m.gguf", device="cuda",
              max_ctx=4096), ResidentKey(model="/m.gguf", device="cpu", max_ctx=2048),
              ResidentKey(model="/m.gguf", device="cpu", max_ctx=4096, drafts=("/d.gguf",))]
    assert len({base.digest(), *(k.digest() for k in others)}) == 5


# ------------------------------------------------------------------------------ the CLI


def test_second_generate_reuses_the_resident_daemon(rundir, tiny_model, client):
    first = generate(tiny_model, "def fib(n):")
    assert first.returncode == 0, first.stderr
    how, pid = _pid_from(first.stderr)
    assert how == "started"
    second = generate(tiny_model, "class Node:")
    assert second.returncode == 0, second.stderr
    assert _pid_from(second.stderr) == ("using", pid)          # no new process, so no model load
    assert "loaded" not in second.stderr                       # the daemon's load log is not shown again
    assert first.stdout == _greedy(client, "def fib(n):") and second.stdout == _greedy(client, "class Node:")

    listed = run_cli("ps", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["pid"] == pid and row["model"] == str(tiny_model.resolve()) and row["served"] == 2
    assert row["state"] == "idle" and row["keep_alive_s"] == 300.0 and row["backend"] == "reference"
    human = run_cli("ps")
    assert f"pid {pid}" in human.stdout and "exits in" in human.stdout

    stopped = run_cli("stop", str(tiny_model))
    assert stopped.returncode == 0 and f"stopped pid {pid}" in stopped.stdout, stopped.stderr
    assert _wait_gone(pid)
    assert list(rundir.glob("*.json")) == [] and list(rundir.glob("*.sock")) == []
    assert run_cli("ps").stdout.strip() == "no resident daemons"
    assert run_cli("stop", str(tiny_model)).returncode == 1      # nothing left to stop: said, status 1


def test_different_settings_get_different_daemons(rundir, tiny_model):
    a = generate(tiny_model, "x", "--max-ctx", "1024")
    b = generate(tiny_model, "x", "--max-ctx", "2048")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert _pid_from(a.stderr)[1] != _pid_from(b.stderr)[1]
    assert sorted(d.ready["max_ctx"] for d, _ in list_resident()) == [1024, 2048]
    assert run_cli("stop").returncode == 0
    assert list_resident() == []


def start_idle(model: Path, keep_alive: str) -> int:
    """Start a resident daemon as every command does, but send it no request (`flashd chat` with no
    turn on stdin): the pid. A request sent after the daemon is ready could find it already gone
    when the machine stalls for longer than a short keep-alive (its idle time counts from ready), a
    race; with none there is nothing to race."""
    result = run_cli("chat", "--model", str(model), "--device", "cpu", "--keep-alive", keep_alive, "-v", stdin="")
    assert result.returncode == 0, result.stderr
    how, pid = _pid_from(result.stderr)
    assert how == "started"
    return pid


def test_keep_alive_ends_an_idle_daemon(rundir, tiny_model):
    pid = start_idle(tiny_model, "1s")
    assert _wait_gone(pid), "the daemon outlived its keep-alive by a minute"
    assert list(rundir.glob("*.json")) == [] and list(rundir.glob("*.sock")) == []
    log = next(rundir.glob("*.log")).read_text()
    assert "--keep-alive" not in log or "idle for 1 s" in log


def test_keep_alive_zero_is_a_private_daemon(rundir, tiny_model, client):
    result = run_cli("generate", "x", "--model", str(tiny_model), "--device", "cpu", "-n", "8", "--keep-alive", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout == _greedy(client, "x")
    assert list(rundir.glob("*.json")) == [] and list_resident() == []


def test_a_killed_daemons_files_do_not_stop_the_next_command(rundir, tiny_model):
    first = generate(tiny_model, "x", "--keep-alive", "-1")
    _, pid = _pid_from(first.stderr)
    os.kill(pid, signal.SIGKILL)
    assert _wait_gone(pid)
    assert list(rundir.glob("*.json"))                          # its ready file is still there
    second = generate(tiny_model, "x")
    assert second.returncode == 0, second.stderr
    how, new_pid = _pid_from(second.stderr)
    assert how == "started" and new_pid != pid
    assert second.stdout == first.stdout


def test_commands_started_together_share_one_daemon(rundir, tiny_model):
    processes = [subprocess.Popen(FLASHD + ["generate", "x", "--model", str(tiny_model), "--device", "cpu", "-n", "8",
                                            "-v"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(3)]
    outputs = [p.communicate(timeout=TIMEOUT_S) for p in processes]
    assert all(p.returncode == 0 for p in processes), outputs
    pids = {_pid_from(err)[1] for _, err in outputs}
    assert len(pids) == 1 and sorted(_pid_from(err)[0] for _, err in outputs) == ["started", "using", "using"]
    assert len({out for out, _ in outputs}) == 1


def test_keep_alive_with_daemon_is_a_usage_error(daemon):
    result = run_cli("generate", "x", "--daemon", daemon.address, "--keep-alive", "5m")
    assert result.returncode == 2 and "--keep-alive is for a daemon the command starts" in result.stderr


def test_bad_keep_alive_is_a_usage_error(rundir, tiny_model, monkeypatch):
    result = generate(tiny_model, "x", "--keep-alive", "soon")
    assert result.returncode == 2 and "keep-alive 'soon'" in result.stderr
    monkeypatch.setenv("FLASHD_KEEP_ALIVE", "later")
    result = generate(tiny_model, "x")
    assert result.returncode == 2 and "FLASHD_KEEP_ALIVE" in result.stderr


def test_a_daemon_that_fails_to_start_says_why(rundir, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    result = run_cli("generate", "x", "--model", str(bad), "--device", "cpu")
    assert result.returncode == 1 and "exited with status" in result.stderr, result.stderr
    assert list(rundir.glob("*.json")) == [] and list_resident() == []


def test_status_and_ps_do_not_keep_a_daemon_alive(rundir, tiny_model):
    """`flashd ps` asks status; it must not count as activity (IdleTimer), or polling would keep
    every daemon loaded forever. Status reports keep_alive_s and idle_s.

    No clock decides: first, on a daemon whose keep-alive no run outlasts, the idle time that
    status reports never goes back however often status is asked (a status counted as activity
    would restart it); then a daemon with a short keep-alive, polled all the while, still ends."""
    result = generate(tiny_model, "x", "--keep-alive", "10m")
    assert result.returncode == 0, result.stderr
    _, pid = _pid_from(result.stderr)
    idle = []
    for _ in range(10):
        [(daemon, status)] = list_resident()
        assert status["keep_alive_s"] == 600.0 and status["idle_s"] is not None, status
        idle.append(status["idle_s"])
    assert idle == sorted(idle), idle
    stop_resident(daemon)
    assert _wait_gone(pid)

    pid = start_idle(tiny_model, "3s")
    deadline = time.monotonic() + TIMEOUT_S                      # only detects a hang
    while time.monotonic() < deadline and list_resident():       # polls status every 0.2 s
        time.sleep(0.2)
    assert _wait_gone(pid)
