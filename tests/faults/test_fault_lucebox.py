"""Bad input on `flashd-lucebox-daemon`: unknown and malformed commands, ids files that are missing,
empty, odd-sized, out of the vocabulary, not regular files (a directory, a FIFO with no writer,
/dev/zero), numbers out of range, bad samp= values, bytes that are not UTF-8. Every command is
answered by exactly one status line and exactly one -1 on the stream; afterwards the daemon
streams the same ids as when it was fresh, and quits cleanly with nothing left on the stream.
"""
from __future__ import annotations

import os
import re

from tests.daemon.daemon_harness import LUCEBOX_MODULE, READ_TIMEOUT_S, SYNTHETIC_SPEC, LuceboxDaemon, write_ids
from flashd.protocol.errors import ERROR_CODES

PROMPT = [21, 300, 7, 451, 88, 13]
ERR_LINE = re.compile(r"err (\w+) .*")


def _bad_commands(tmp_path) -> list[str | bytes]:
    prompt = write_ids(tmp_path / "prompt.bin", PROMPT)
    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x00\x00\x02")
    oov = write_ids(tmp_path / "oov.bin", [1, SYNTHETIC_SPEC.vocab_size])
    negative = write_ids(tmp_path / "negative.bin", [1, -7])
    long_prompt = write_ids(tmp_path / "long.bin", [5] * 600)
    (tmp_path / "a-directory").mkdir()
    os.mkfifo(tmp_path / "fifo.bin")            # opening it for reading must not wait for a writer
    return [
        "LIST_SLOTS", "hello there", "snap=1", "compress", "park sideways", "unpark 7", "free everything",
        f"{tmp_path}/missing.bin 8", f"{tmp_path}/empty.bin 8", f"{tmp_path}/odd.bin 8", f"{oov} 8",
        f"{negative} 8", f"{tmp_path}/a-directory 8", f"{tmp_path}/fifo.bin 8", "/dev/zero 8",
        f"{long_prompt} 8", f"{prompt} 600",
        f"{prompt}", f"{prompt} 0", f"{prompt} -1", f"{prompt} {10**30}", f"{prompt} 1e3", f"{prompt} nan",
        f"{prompt} 8 samp=", f"{prompt} 8 samp=nan", f"{prompt} 8 samp=inf,0.9", f"{prompt} 8 samp=0.5,nan",
        f"{prompt} 8 samp=0.5,0.9,1.5", f"{prompt} 8 samp=1,1,1,1,1,1,1,1", f"{prompt} 8 samp=0.5,0.9,40,0",
        f"{prompt} 8 samp=0.5,0.9,40,1.1,-1", f"{prompt} 8 samp=0.5,0.9,40,1.1,{2**64}",
        f"{prompt} 8 snap=3", f"{prompt} 8 extra words",
        f"compress {prompt} 0", f"compress {prompt} 1001", f"compress {prompt} 500",
        b"\xff\xfe garbage", b"/tmp/\xc3\x28.bin 8", b"\x00\x01\x02",
    ]


def test_lucebox_bad_input(faults, fault_model, tmp_path):
    daemon = LuceboxDaemon(LUCEBOX_MODULE, fault_model, fault_model, tmp_path, "--max-ctx=512")
    try:
        with faults.case("Lucebox bad input") as case:
            case.check(daemon.status_line() == "[daemon] ready", "no ready line")
            prompt = tmp_path / "prompt.bin"
            commands = _bad_commands(tmp_path)
            case.sent()
            fresh_status, fresh = daemon.command(f"{prompt} 16")
            case.check(fresh_status.startswith("ok N=") and len(fresh) == 16, f"fresh: {fresh_status} {fresh}")
            for command in commands:
                case.sent()
                if isinstance(command, bytes):
                    daemon.proc.stdin.write(command + b"\n")
                    daemon.proc.stdin.flush()
                    status, ids = daemon.status_line(), daemon.stream_until_sentinel()
                else:
                    status, ids = daemon.command(command)
                case.no_traceback([status], f"{command!r}")
                match = ERR_LINE.fullmatch(status)
                case.check(match is not None and match.group(1) in ERROR_CODES,
                           f"{command!r}: not an err line with a flashd code: {status!r}")
                case.check(ids == [], f"{command!r}: ids streamed before the -1: {ids}")
            case.sent()
            status, again = daemon.command(f"{prompt} 16")
            case.check(status.startswith("ok N=") and again == fresh,
                       f"after the bad commands: {status}, {again} != {fresh}")
            case.sent()
            case.check(daemon.command("quit") == ("ok quit", []), "quit")
            case.check(daemon.wait() == 0, f"exit status {daemon.proc.returncode}")
            case.check(daemon.stream_rest() == b"", "bytes left on the stream (a doubled -1?)")
            case.check(daemon.out.at_eof(READ_TIMEOUT_S) == b"", "status lines left over (a doubled answer?)")
            case.check("Traceback" not in daemon.stderr_tail(100_000), "a traceback on the daemon's stderr")
    finally:
        daemon.kill()
