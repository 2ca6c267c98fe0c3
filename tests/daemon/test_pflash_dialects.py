"""PFlash `compress` through the three dialects of the real daemon process (stdin JSON lines,
ZeroMQ msgpack, Lucebox pipes), on the tiny synthetic target and a synthetic drafter with the same
vocabulary: the same kept ids everywhere, generate compress=always equals generate on the kept
ids, park/unpark round trips keep the output, bad input answers an error and the daemon serves on."""
from __future__ import annotations

import numpy as np
import pytest

from tests.daemon.daemon_harness import SYNTHETIC_SPEC, ZmqPeer, generated, write_ids
from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model

DRAFTER_SPEC = SyntheticSpec(arch="qwen3", n_layers=2, hidden=64, n_heads=4, n_kv_heads=1, ffn=96,
                             vocab_size=SYNTHETIC_SPEC.vocab_size, seed=77, name="daemon-drafter")
PROMPT = [int(t) for t in np.random.default_rng(5).integers(0, SYNTHETIC_SPEC.vocab_size - 3, 450)]
KEEP = 0.25
MAX_CTX = 1024


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    return write_synthetic_model(tmp_path_factory.mktemp("pflash-drafter") / "drafter.gguf", DRAFTER_SPEC)


@pytest.fixture(scope="module")
def expected_kept(tmp_path_factory, drafter, synthetic_model):
    from tests.daemon.daemon_harness import ServeDaemon
    daemon = ServeDaemon(synthetic_model, tmp_path_factory.mktemp("pflash-expected"), "--prefill-drafter",
                         str(drafter), max_ctx=MAX_CTX)
    try:
        result = daemon.ask(f"compress id=c ids={','.join(map(str, PROMPT))} keep={KEEP}", "c")[-1]
    finally:
        daemon.kill()
    assert result["event"] == "result", result
    return result["ids"]


def test_stdin_compress_generate_park_round_trip(spawn_serve, drafter, expected_kept):
    daemon = spawn_serve("--prefill-drafter", str(drafter), max_ctx=MAX_CTX)
    ids = ",".join(map(str, PROMPT))
    result = daemon.ask(f"compress id=c1 ids={ids} keep={KEEP}", "c1")[-1]
    assert result["ids"] == expected_kept and result["n_in"] == len(PROMPT) and result["n_out"] == len(expected_kept)
    assert len(expected_kept) < len(PROMPT)
    plain, _, _ = generated(daemon.ask(f"generate id=g1 ids={','.join(map(str, expected_kept))} max_tokens=12 "
                                       f"ignore_eos=true", "g1"))
    events = daemon.ask(f"generate id=g2 ids={ids} max_tokens=12 ignore_eos=true compress=always keep={KEEP}", "g2")
    out, _, done = generated(events)
    assert out == plain and done["n_prompt"] == len(expected_kept) and done["compress"]["n_in"] == len(PROMPT)

    parked = daemon.ask("park id=p what=all", "p")[-1]
    assert parked["parked"] == {"target": True, "drafter": True}
    assert daemon.ask(f"generate id=g3 ids={ids} max_tokens=2", "g3")[-1]["code"] == "parked"
    assert daemon.ask("unpark id=u what=all", "u")[-1]["parked"] == {"target": False}
    again, _, _ = generated(daemon.ask(f"generate id=g4 ids={ids} max_tokens=12 ignore_eos=true compress=always "
                                       f"keep={KEEP}", "g4"))
    assert again == plain

    # bad input: clear errors, then the daemon serves as before
    assert daemon.ask(f"compress id=e1 ids={ids} keep=0", "e1")[-1]["code"] == "bad_request"
    assert daemon.ask(f"compress id=e2 ids={ids} keep=1.5", "e2")[-1]["code"] == "bad_request"
    assert daemon.ask(f'compress id=e3 ids={ids} drafter="/nonexistent/d.gguf"', "e3")[-1]["code"] == "bad_request"
    assert daemon.ask(f"generate id=e4 ids={ids} compress=sometimes", "e4")[-1]["code"] == "bad_request"
    assert daemon.ask("free id=f what=drafter", "f")[-1]["freed"] == "drafter"
    assert daemon.ask(f"compress id=c2 ids={ids} keep={KEEP}", "c2")[-1]["ids"] == expected_kept


def test_zmq_compress(spawn_serve, zmq_context, drafter, expected_kept):
    daemon = spawn_serve("--zmq", "tcp://127.0.0.1:*", "--prefill-drafter", str(drafter), max_ctx=MAX_CTX)
    peer = ZmqPeer(zmq_context, daemon.ready["zmq"], daemon)
    try:
        result = peer.ask({"cmd": "compress", "id": "z", "ids": PROMPT, "keep": KEEP})[-1]
        assert result["event"] == "result" and list(result["ids"]) == expected_kept
        done = peer.ask({"cmd": "generate", "id": "zg", "ids": PROMPT, "max_tokens": 4, "ignore_eos": True,
                         "compress": "auto", "threshold": 100, "keep": KEEP, "stream": False})[-1]
        assert done["n_prompt"] == len(expected_kept)
        bad = peer.ask({"cmd": "compress", "id": "zb", "ids": PROMPT, "keep": -1})[-1]
        assert bad["event"] == "error" and bad["code"] == "bad_request"
    finally:
        peer.close()


def test_lucebox_compress_free_and_generate(spawn_lucebox, drafter, expected_kept, tmp_path):
    daemon = spawn_lucebox("--max-ctx=1024", env={"FLASHD_ALLOW_MODELS": str(drafter.parent)})
    assert daemon.status_line() == "[daemon] ready"
    prompt = write_ids(tmp_path / "prompt.bin", PROMPT)
    status, ids = daemon.command(f"compress {prompt} {int(KEEP * 1000)} {drafter} qwen3")
    assert status.startswith(f"ok compress n_in={len(PROMPT)} n_out={len(expected_kept)} ms="), status
    assert ids == expected_kept
    status, ids = daemon.command("free drafter")
    assert status == "ok free" and ids == []
    status, ids = daemon.command("free drafter")
    assert status.startswith("err not_loaded") and ids == []
    status, ids = daemon.command(f"compress {prompt} 250 {tmp_path / 'missing.gguf'}")
    assert status.startswith("err bad_request") and ids == []
    kept = write_ids(tmp_path / "kept.bin", expected_kept)
    status, ids = daemon.command(f"{kept} 6")
    assert status.startswith(f"ok N={len(expected_kept)} gen=6") and len(ids) == 6


def test_lucebox_24gb_choreography(spawn_lucebox, drafter, expected_kept, tmp_path):
    """What a Lucebox client does on a 24 GB card: park target, compress, free drafter, unpark,
    generate -- the output equals generating the kept ids on a daemon that never parked."""
    daemon = spawn_lucebox("--max-ctx=1024", env={"FLASHD_ALLOW_MODELS": str(drafter.parent)})
    assert daemon.status_line() == "[daemon] ready"
    prompt = write_ids(tmp_path / "prompt.bin", PROMPT)
    kept = write_ids(tmp_path / "kept.bin", expected_kept)
    status, before = daemon.command(f"{kept} 8")
    assert status.startswith("ok N=") and len(before) == 8
    assert daemon.command("park target") == ("ok park what=target", [])
    status, ids = daemon.command(f"compress {prompt} {int(KEEP * 1000)} {drafter}")
    assert status.startswith("ok compress") and ids == expected_kept
    assert daemon.command("free drafter") == ("ok free", [])
    status, ids = daemon.command(f"{kept} 8")
    assert status.startswith("err parked") and ids == []
    assert daemon.command("unpark target") == ("ok unpark what=target", [])
    status, after = daemon.command(f"{kept} 8")
    assert status.startswith("ok N=") and after == before
