"""Security defaults of the daemon's file access (daemon/file_access.py), on the real processes: a
request may read @file prompts only from the allowed directories (default: the system temp dir) and
load a drafter GGUF only from the models' own directories, the model cache and --allow-models.
Symlinks and `..` are resolved before the check; a refusal is a clear `bad_request`, and the daemon
serves on as before."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.daemon.daemon_harness import generated, write_ids
from flashd.daemon.file_access import FileAccess, resolve_dirs
from flashd.protocol.errors import ProtocolError

PROMPT = [21, 300, 7, 451, 88, 13]


def _error(events: list[dict]) -> dict:
    assert events[-1]["event"] == "error", events
    return events[-1]


def test_ids_files_in_the_temp_dir_are_read_by_default(spawn_serve, tmp_path):
    daemon = spawn_serve()
    path = write_ids(tmp_path / "prompt.bin", PROMPT)
    ids, _, done = generated(daemon.ask(f"generate id=a ids=@{path} max_tokens=4 ignore_eos=true", "a"))
    assert done["event"] == "done" and len(ids) == 4 and done["n_prompt"] == len(PROMPT)


def test_ids_files_outside_the_allowed_dirs_are_refused(spawn_serve, tmp_path):
    daemon = spawn_serve()
    inline, _, _ = generated(daemon.ask(f"generate id=ref ids={','.join(map(str, PROMPT))} max_tokens=4 "
                                        f"ignore_eos=true", "ref"))
    link = tmp_path / "link.bin"
    link.symlink_to("/etc/passwd")                           # inside by name, outside once resolved
    dotdot = f"{tmp_path}/../../../../../../../../etc/passwd"  # `..` climbs out of the temp dir
    for n, path in enumerate([link, dotdot, "/etc/passwd", "/dev/zero", "/proc/self/environ"]):
        error = _error(daemon.ask(f'generate id=e{n} ids=@"{path}" max_tokens=4', f"e{n}"))
        assert error["code"] == "bad_request", error
        assert "not inside a directory this daemon reads ids files from" in error["message"], error
        assert "--allow-files" in error["message"]
    # every verb that takes ids goes through the same check
    for verb in ("score", "detokenize", "compress"):
        error = _error(daemon.ask(f"{verb} id={verb} ids=@/etc/passwd", verb))
        assert error["code"] == "bad_request" and "not inside" in error["message"], error
    again, _, _ = generated(daemon.ask(f"generate id=again ids={','.join(map(str, PROMPT))} max_tokens=4 "
                                       f"ignore_eos=true", "again"))
    assert again == inline


def test_allow_files_replaces_the_default_and_none_reads_nothing(spawn_serve, tmp_path):
    (tmp_path / "allowed").mkdir()
    in_temp = write_ids(tmp_path / "prompt.bin", PROMPT)
    allowed = write_ids(tmp_path / "allowed" / "prompt.bin", PROMPT)
    daemon = spawn_serve("--allow-files", str(tmp_path / "allowed"))
    _, _, done = generated(daemon.ask(f"generate id=a ids=@{allowed} max_tokens=2 ignore_eos=true", "a"))
    assert done["event"] == "done"
    assert "not inside" in _error(daemon.ask(f"generate id=b ids=@{in_temp} max_tokens=2", "b"))["message"]
    closed = spawn_serve("--allow-files", "none")
    error = _error(closed.ask(f"generate id=c ids=@{in_temp} max_tokens=2", "c"))
    assert error["code"] == "bad_request" and "reads no ids files" in error["message"], error


def test_ids_file_over_the_request_size_limit(spawn_serve, tmp_path):
    daemon = spawn_serve("--max-request-bytes", "4096")
    big = write_ids(tmp_path / "big.bin", [5] * 2000)          # 8000 bytes
    error = _error(daemon.ask(f"generate id=a ids=@{big} max_tokens=2", "a"))
    assert error["code"] == "bad_request" and "exceeds the limit of 4096 bytes" in error["message"], error


def test_bad_allow_dirs_are_usage_errors(synthetic_model, tmp_path):
    for flag in ("--allow-files", "--allow-models"):
        proc = subprocess.run([sys.executable, "-m", "flashd.daemon", "--model", str(synthetic_model), flag,
                               str(tmp_path / "missing")], capture_output=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert f"{flag} {tmp_path / 'missing'}: not a directory".encode() in proc.stderr, proc.stderr


def test_request_drafter_paths_are_confined_to_model_dirs(spawn_serve, synthetic_model, tmp_path):
    prompt = ",".join(map(str, PROMPT * 10))
    (tmp_path / "elsewhere").mkdir()
    elsewhere = tmp_path / "elsewhere" / "drafter.gguf"
    shutil.copy(synthetic_model, elsewhere)
    (synthetic_model.parent / "notes.gguf").write_bytes(b"not a model at all")
    daemon = spawn_serve(max_ctx=512)
    for n, path in enumerate([elsewhere, "/etc/passwd", "/dev/zero", f"{synthetic_model.parent}/../../{elsewhere}"]):
        error = _error(daemon.ask(f'compress id=d{n} ids={prompt} keep=0.5 drafter="{path}"', f"d{n}"))
        assert error["code"] == "bad_request", error
        assert "not inside a directory this daemon loads models from" in error["message"], error
        assert "--allow-models" in error["message"]
    error = _error(daemon.ask(f'compress id=g ids={prompt} keep=0.5 drafter="{synthetic_model.parent}/notes.gguf"',
                              "g"))
    assert error["code"] == "bad_request" and "is not a GGUF file" in error["message"], error
    # the target's own directory is a model dir: a drafter there loads
    ok = daemon.ask(f'compress id=ok ids={prompt} keep=0.5 drafter="{synthetic_model}"', "ok")[-1]
    assert ok["event"] == "result", ok
    # --allow-models adds a directory
    wider = spawn_serve("--allow-models", str(tmp_path / "elsewhere"), max_ctx=512)
    result = wider.ask(f'compress id=w ids={prompt} keep=0.5 drafter="{elsewhere}"', "w")[-1]
    assert result["event"] == "result" and result["ids"] == ok["ids"], result


def test_lucebox_paths_are_confined(spawn_lucebox, synthetic_model, tmp_path):
    prompt = write_ids(tmp_path / "prompt.bin", PROMPT)
    daemon = spawn_lucebox("--max-ctx=512")
    assert daemon.status_line() == "[daemon] ready"
    status, first = daemon.command(f"{prompt} 4")              # the temp dir: Lucebox's client's files
    assert status.startswith("ok N=6 gen=4") and len(first) == 4, status
    status, ids = daemon.command("/etc/passwd 4")
    assert status.startswith("err bad_request ids: cannot read") and "$FLASHD_ALLOW_FILES" in status, status
    assert ids == []
    (tmp_path / "elsewhere").mkdir()
    elsewhere = tmp_path / "elsewhere" / "drafter.gguf"
    shutil.copy(synthetic_model, elsewhere)
    status, ids = daemon.command(f"compress {prompt} 500 {elsewhere}")
    assert status.startswith("err bad_request drafter:") and "$FLASHD_ALLOW_MODELS" in status, status
    assert ids == []
    status, again = daemon.command(f"{prompt} 4")
    assert status.startswith("ok N=6 gen=4") and again == first
    (tmp_path / "allowed").mkdir()
    narrowed = spawn_lucebox("--max-ctx=512", env={"FLASHD_ALLOW_FILES": str(tmp_path / "allowed")})
    assert narrowed.status_line() == "[daemon] ready"
    status, ids = narrowed.command(f"{prompt} 4")
    assert status.startswith("err bad_request") and "not inside" in status and ids == [], status
    status, ids = narrowed.command(f"{write_ids(tmp_path / 'allowed' / 'p.bin', PROMPT)} 4")
    assert status.startswith("ok N=6 gen=4") and ids == first, status


# -- FileAccess itself -----------------------------------------------------------------------------

def test_file_access_is_checked_on_construction(tmp_path):
    with pytest.raises(ValueError, match="no symlinks"):
        FileAccess(ids_dirs=("relative/dir",), model_dirs=(), max_ids_bytes=16)
    with pytest.raises(ValueError, match="max_ids_bytes"):
        FileAccess(ids_dirs=(), model_dirs=(), max_ids_bytes=0)
    with pytest.raises(ValueError, match="not a directory"):
        resolve_dirs([str(tmp_path / "missing")], "--allow-files")
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    assert resolve_dirs([str(link), str(tmp_path)], "--allow-files") == (os.path.realpath(tmp_path),)


def test_file_access_prefix_is_not_containment(tmp_path):
    """/tmp/ab is not inside /tmp/a: the check compares whole path components."""
    (tmp_path / "a").mkdir()
    (tmp_path / "ab").mkdir()
    write_ids(tmp_path / "ab" / "p.bin", PROMPT)
    access = FileAccess(ids_dirs=resolve_dirs([str(tmp_path / "a")], "x"), model_dirs=(), max_ids_bytes=1024)
    with pytest.raises(OSError, match="not inside"):
        access.read_ids(str(tmp_path / "ab" / "p.bin"))
    with pytest.raises(ProtocolError, match="not inside"):
        access.model_path("drafter", str(tmp_path / "ab" / "p.bin"))
