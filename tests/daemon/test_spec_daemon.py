"""Speculative decoding through the real daemon process: `flashd serve --draft ...` and
`generate ... spec=chain|ddtree budget=N draft=NAME` over stdin and ZeroMQ.

Output equality is exact: greedy speculative output is plain greedy output token for token
(daemon/speculative/decoder.py), so every comparison is with the same request at spec=off.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.daemon.daemon_harness import LONG_MAX_CTX, READ_TIMEOUT_S, SYNTHETIC_SPEC, ZmqPeer, generated
from flashd.scripts.make_synthetic_gguf import write_synthetic_model

GEN = 'generate id={id} text="def fib(n): return fib(n - 1) + fib(n - 2)" max_tokens=40 ignore_eos=true'


@pytest.fixture
def spec_daemon(spawn_serve, synthetic_model):
    """The tiny target with itself as draft model (named by its file stem) and the n-gram drafter."""
    return spawn_serve("--draft", str(synthetic_model), "--draft", "ngram", "--zmq", "tcp://127.0.0.1:*",
                       max_ctx=LONG_MAX_CTX)


def run(daemon, line: str, request_id: str):
    events = daemon.ask(line.format(id=request_id), request_id)
    ids, text, done = generated(events)
    assert done["event"] == "done", done
    return ids, text, done, events


def test_status_lists_the_drafters(spec_daemon, synthetic_model):
    status = spec_daemon.ask("status id=s", "s")[-1]
    names = [d["name"] for d in status["drafters"]]
    assert names == [synthetic_model.stem, "ngram"]
    assert status["drafters"][0]["kind"] == "DraftModelDrafter"


@pytest.mark.parametrize("extra", ["spec=chain", "spec=chain budget=3 draft=ngram", "spec=ddtree",
                                   "spec=ddtree budget=8 draft=ngram", "spec=ddtree budget=40"])
def test_spec_output_equals_plain_and_done_reports_stats(spec_daemon, extra):
    want, want_text, _, _ = run(spec_daemon, GEN, "plain")
    ids, text, done, events = run(spec_daemon, GEN + " " + extra, "spec")
    assert ids == want and text == want_text
    stats = done["spec"]
    assert stats["mode"] == extra.split()[0].split("=")[1]
    assert stats["steps"] >= 1 and stats["steps"] + stats["accepted"] == len(ids) - 1
    assert sum(stats["accepted_histogram"]) == stats["steps"]
    assert stats["accepted_per_step"] == pytest.approx(stats["accepted"] / stats["steps"], abs=1e-4)
    assert stats["draft_ms"] >= 0 and stats["verify_ms"] > 0
    assert len(events) - 1 >= stats["steps"]             # tokens streamed as they were accepted


def test_stop_strings_and_stop_ids_cut_a_step_like_plain_decoding(spec_daemon):
    full, text, _, _ = run(spec_daemon, GEN, "full")
    stop_id = full[17]
    mid = text[len(text) // 3: len(text) // 3 + 3]
    for cut in (f"stop_ids={stop_id}", f"stop={mid!r}".replace("'", '"')):
        want, want_text, want_done, _ = run(spec_daemon, GEN + " " + cut, "p-" + cut[:4])
        for extra in ("spec=chain draft=ngram", "spec=ddtree budget=16"):
            ids, got_text, done, _ = run(spec_daemon, GEN + f" {cut} {extra}", "s-" + cut[:4])
            assert (ids, got_text, done["reason"]) == (want, want_text, want_done["reason"])


def test_non_streaming_spec(spec_daemon):
    want, _, _, _ = run(spec_daemon, GEN, "a")
    events = spec_daemon.ask(GEN.format(id="b") + " spec=ddtree stream=false", "b")
    assert len(events) == 1 and events[0]["ids"] == want and "spec" in events[0]


@pytest.mark.parametrize("line,code", [
    (GEN + " spec=ddtree draft=nope", "not_loaded"),
    (GEN + " spec=chain budget=0", "bad_request"),
    (GEN + " spec=ddtree budget=1000", "bad_request"),     # > prefill_chunk - 1 nodes per verify
    (GEN + " spec=tree", "bad_request"),
])
def test_bad_spec_requests_are_errors_and_the_daemon_stays_fresh(spec_daemon, line, code):
    want, _, _, _ = run(spec_daemon, GEN + " spec=ddtree", "before")
    err = spec_daemon.ask(line.format(id="bad"), "bad")[-1]
    assert err["event"] == "error" and err["code"] == code, err
    assert run(spec_daemon, GEN + " spec=ddtree", "after")[0] == want


def test_spec_over_zeromq(spec_daemon, zmq_context):
    want, _, _, _ = run(spec_daemon, GEN, "plain")
    peer = ZmqPeer(zmq_context, spec_daemon.ready["zmq"], spec_daemon)
    try:
        events = peer.ask({"cmd": "generate", "id": "z", "text": "def fib(n): return fib(n - 1) + fib(n - 2)",
                           "max_tokens": 40, "ignore_eos": True, "spec": "ddtree", "budget": 12, "draft": "ngram"})
        ids, _, done = generated(events)
        assert done["event"] == "done" and ids == want and done["spec"]["draft"] == "ngram"
    finally:
        peer.close()


def test_sampled_spec_is_served(spec_daemon):
    line = GEN + " temperature=0.8 top_k=20 seed=3 spec=ddtree"
    ids, _, done, _ = run(spec_daemon, line, "s1")
    again, _, _, _ = run(spec_daemon, line, "s2")
    assert len(ids) == 40 and ids == again                 # seeded: reproducible
    assert done["spec"]["steps"] >= 1


def test_ngrams_are_built_in(spawn_serve):
    """A daemon started without --draft still drafts with n-grams: `draft=ngram`, and as the default
    drafter; the output is plain decoding's. A drafter it does not have is `not_loaded`."""
    daemon = spawn_serve()
    plain, _, _, _ = run(daemon, GEN, "plain")
    for i, extra in enumerate([" spec=chain draft=ngram", " spec=ddtree budget=9 draft=ngram", " spec=auto"]):
        ids, _, done, _ = run(daemon, GEN + extra, f"s{i}")
        assert ids == plain and done["spec"]["draft"] == "ngram" and done["spec"]["steps"] >= 1, extra
    err = daemon.ask(GEN.format(id="x") + " spec=chain draft=nope", "x")[-1]
    assert err["event"] == "error" and err["code"] == "not_loaded" and "ngram" in err["message"]


def test_a_draft_model_with_another_vocabulary_is_a_startup_error(synthetic_model, tmp_path):
    import dataclasses

    other = write_synthetic_model(tmp_path / "other-vocab.gguf",
                                  dataclasses.replace(SYNTHETIC_SPEC, vocab_size=SYNTHETIC_SPEC.vocab_size + 64))
    result = subprocess.run([sys.executable, "-m", "flashd.daemon", "--model", str(synthetic_model), "--device", "cpu",
                             "--draft", str(other)], stdin=subprocess.DEVNULL, capture_output=True,
                            timeout=READ_TIMEOUT_S)
    assert result.returncode == 1 and result.stdout == b""
    assert b"vocabulary" in result.stderr and b"other-vocab" in result.stderr


def test_park_unpark_keeps_spec_output(spawn_serve, synthetic_model, tmp_path):
    """Parking and unparking the target reloads drafters that borrow its weights (DFlash) and
    keeps every drafter's output equal to plain greedy decoding."""
    from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash

    s = SYNTHETIC_SPEC
    dflash = write_synthetic_dflash(tmp_path / "park-dflash.gguf",
                                    spec_for_target(s.hidden, s.n_layers, s.vocab_size, n_features=2,
                                                    block_size=8, seed=4))
    daemon = spawn_serve("--draft", str(synthetic_model), "--draft", "ngram", "--draft", str(dflash))
    want, _, _, _ = run(daemon, GEN, "plain")
    drafts = [synthetic_model.stem, "ngram", dflash.stem]
    for name in drafts:
        assert run(daemon, GEN + f" spec=ddtree budget=12 draft={name}", f"before-{name}")[0] == want
    for verb in ("park", "unpark"):
        answer = daemon.ask(f"{verb} id={verb} what=target", verb)[-1]
        assert answer["event"] == "result", answer
    for name in drafts:
        assert run(daemon, GEN + f" spec=ddtree budget=12 draft={name}", f"after-{name}")[0] == want


def test_park_draft_releases_the_draft_model_and_unpark_restores_it(spec_daemon, synthetic_model):
    """`park what=draft` closes the draft model (n-grams hold nothing and stay): requests naming it
    decode plainly (the same tokens; done.spec says the drafter was parked) while n-grams still
    draft; `unpark what=draft` loads it again from its file and the output equals the output before
    the round trip."""
    model_spec = GEN + f" spec=chain draft={synthetic_model.stem}"
    before, _, _, _ = run(spec_daemon, model_spec, "before")
    parked = spec_daemon.ask("park id=pk what=draft", "pk")[-1]
    assert parked["event"] == "result" and parked["parked"]["spec_drafters"] == [synthetic_model.stem]
    status = spec_daemon.ask("status id=st", "st")[-1]
    assert [d.get("parked", False) for d in status["drafters"]] == [True, False]
    while_parked, _, done, _ = run(spec_daemon, model_spec, "while-parked")
    assert while_parked == before and done["spec"]["parked"] is True and done["spec"]["steps"] == 0
    dflt, _, done, _ = run(spec_daemon, GEN + " spec=chain", "dflt")                   # the default drafter
    assert dflt == before and done["spec"] == {**done["spec"], "draft": synthetic_model.stem, "parked": True}
    plain, _, _, _ = run(spec_daemon, GEN, "plain")
    ngram, _, _, _ = run(spec_daemon, GEN + " spec=chain draft=ngram", "ngram")
    assert ngram == plain == before
    unparked = spec_daemon.ask("unpark id=up what=draft", "up")[-1]
    assert unparked["event"] == "result" and "spec_drafters" not in unparked["parked"]
    after, _, done, _ = run(spec_daemon, model_spec, "after")
    assert after == before and done["spec"]["draft"] == synthetic_model.stem
