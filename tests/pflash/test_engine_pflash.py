"""PFlash through the engine on the CPU reference backend, with tiny synthetic target and drafter:
compress, generate compress=..., park/unpark/free, the park policy, the text round trip for a
drafter with another vocabulary, and the errors (the engine keeps serving after each)."""

import numpy as np
import pytest
from tests.daemon.engine_client import EngineClient

from flashd.daemon.config import EngineConfig
from flashd.daemon.engine import Engine
from flashd.daemon.pflash.config import PFlashConfig
from flashd.daemon.pflash.drafter import chunk_bounds
from flashd.protocol import messages as m
from flashd.protocol.errors import ProtocolError

from flashd.daemon.pflash.calibrate import layer_maxima


class Client(EngineClient):
    def greedy(self, ids, n=12) -> list[int]:
        return super().greedy(ids, n)


def start(models, **pflash) -> tuple[Engine, Client]:
    cfg = EngineConfig(model=str(models["target"]), device="cpu", max_ctx=1024,
                       prefill_drafter=str(models["drafter"]) if pflash.pop("drafter", True) else None,
                       pflash=PFlashConfig(forward_chunk=256, **pflash))
    engine = Engine(cfg)
    engine.load()
    engine.start()
    return engine, Client(engine)


@pytest.fixture
def served(pflash_models):
    engines = []

    def make(**pflash):
        engine, client = start(pflash_models, **pflash)
        engines.append(engine)
        return client
    yield make
    for e in engines:
        e.stop(10)


def prompt(n, seed=0):
    return [int(t) for t in np.random.default_rng(seed).integers(0, 500, n)]


def test_compress_returns_whole_chunks_in_order(served):
    c = served()
    ids = prompt(700)
    r = c.ask(m.Compress, ids=ids, keep=0.2)
    assert r["event"] == "result" and r["n_in"] == 700 and r["n_out"] == len(r["ids"])
    n_chunks = -(-700 // 32)
    # reconstruct the kept chunk indices from the ids: the output is a concatenation of whole chunks
    out, pos, chunks = r["ids"], 0, []
    for ch in range(n_chunks):
        piece = ids[ch * 32:(ch + 1) * 32]
        if out[pos:pos + len(piece)] == piece:
            chunks.append(ch)
            pos += len(piece)
    assert pos == len(out)
    assert chunks[0] == 0 and chunks[-1] == n_chunks - 1
    assert len(chunks) == int(np.ceil(0.2 * n_chunks))
    assert r["drafter_tokens"] == 700 and r["load_ms"] == 0      # resident, same vocabulary: ids as is
    assert c.ask(m.Compress, ids=ids, keep=1.0)["ids"] == ids


def test_chunked_drafter_forward_equals_one_forward(served, pflash_models):
    """The drafter's chunking (forward_chunk 256 vs one 1024-token forward) does not change the
    importance: the same attention is computed, only split differently."""
    c = served()
    drafter = c.engine.compressor.drafter
    ids = prompt(600, seed=3)
    a = drafter.tail_probs(ids, alpha=0.0)
    drafter.config = PFlashConfig(forward_chunk=1024)
    b = drafter.tail_probs(ids, alpha=0.0)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)      # float32 sums in another order
    assert chunk_bounds(600, 256, 8) == [(0, 256), (256, 512), (512, 600)]
    assert chunk_bounds(517, 256, 8) == [(0, 256), (256, 517)]   # a 5-token tail merges into the chunk before
    assert chunk_bounds(5, 256, 8) == [(0, 5)]


def test_generate_compress_always_equals_generate_on_the_compressed_ids(served):
    c = served()
    ids = prompt(500, seed=1)
    kept = c.ask(m.Compress, ids=ids, keep=0.3)["ids"]
    done = c.ask(m.Generate, ids=ids, max_tokens=10, ignore_eos=True, stream=False, compress="always", keep=0.3)
    assert done["event"] == "done" and done["n_prompt"] == len(kept)
    assert done["compress"]["n_in"] == 500 and done["compress"]["n_out"] == len(kept)
    assert done["ids"] == c.greedy(kept, 10)


def test_generate_compress_auto_threshold(served):
    c = served()
    ids = prompt(300, seed=2)
    short = c.ask(m.Generate, ids=ids, max_tokens=4, ignore_eos=True, stream=False, compress="auto", threshold=300)
    assert "compress" not in short and short["n_prompt"] == 300
    long = c.ask(m.Generate, ids=ids, max_tokens=4, ignore_eos=True, stream=False, compress="auto", threshold=299,
                 keep=0.1)
    assert long["compress"]["n_in"] == 300 and long["n_prompt"] < 300
    assert c.ask(m.Generate, ids=ids, max_tokens=4, ignore_eos=True, stream=False)["n_prompt"] == 300  # default off


def test_daemon_default_mode_applies_when_the_request_does_not_say(served):
    c = served(mode="always", keep=0.1)
    ids = prompt(400, seed=4)
    assert c.ask(m.Generate, ids=ids, max_tokens=2, ignore_eos=True, stream=False)["compress"]["n_in"] == 400
    assert "compress" not in c.ask(m.Generate, ids=ids, max_tokens=2, ignore_eos=True, stream=False, compress="off")


def test_park_unpark_round_trips_give_the_same_output(served):
    c = served()
    ids = prompt(40, seed=5)
    before = c.greedy(ids)
    kept_before = c.ask(m.Compress, ids=prompt(300), keep=0.2)["ids"]
    r = c.ask(m.Park, what="all")
    assert r["parked"] == {"target": True, "drafter": True}
    status = c.ask(m.Status)
    assert status["memory"]["resident_weights_bytes"] == 0 and status["prefill_drafter"]["loaded"] is False
    assert c.ask(m.Generate, ids=ids, max_tokens=2)["code"] == "parked"
    assert c.ask(m.Unpark, what="all")["parked"] == {"target": False}
    assert c.greedy(ids) == before
    assert c.ask(m.Compress, ids=prompt(300), keep=0.2)["ids"] == kept_before
    c.ask(m.Park, what="target")
    c.ask(m.Unpark, what="target")
    assert c.greedy(ids) == before


def test_free_drafter_then_compress_loads_it_again(served):
    c = served()
    ids = prompt(300)
    first = c.ask(m.Compress, ids=ids, keep=0.2)
    assert c.ask(m.Free, what="drafter")["freed"] == "drafter"
    assert c.ask(m.Status)["prefill_drafter"]["loaded"] is False
    assert c.ask(m.Free, what="drafter")["code"] == "not_loaded"
    again = c.ask(m.Compress, ids=ids, keep=0.2)
    assert again["ids"] == first["ids"] and again["load_ms"] > 0


def test_park_policy_choreography(served):
    c = served(drafter_policy="park")
    assert c.ask(m.Status)["prefill_drafter"]["loaded"] is False      # not loaded at startup
    ids = prompt(40, seed=6)
    before = c.greedy(ids)
    r = c.ask(m.Compress, ids=prompt(300), keep=0.2)
    assert r["event"] == "result" and r["load_ms"] > 0
    status = c.ask(m.Status)
    assert status["parked"] == {"target": False} and status["prefill_drafter"]["loaded"] is False
    assert c.greedy(ids) == before
    done = c.ask(m.Generate, ids=prompt(300), max_tokens=4, ignore_eos=True, stream=False, compress="always",
                 keep=0.2)
    assert done["n_prompt"] == r["n_out"]


def test_drafter_with_another_vocabulary_goes_through_text(served, pflash_models):
    c = served()
    tok = c.engine.tokenizer
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 12
    ids = tok.encode(text)
    r = c.ask(m.Compress, ids=ids, keep=1.0, drafter=str(pflash_models["other_vocab"]))
    assert r["event"] == "result"
    assert tok.decode(r["ids"]) == text                      # keep=1: the text survives the round trip
    r = c.ask(m.Compress, ids=ids, keep=0.2, drafter=str(pflash_models["other_vocab"]))
    assert r["n_out"] < len(ids)
    assert not c.engine.compressor._shares_vocab(c.engine.compressor.drafter)


def test_errors_then_the_engine_keeps_serving(served, pflash_models, tmp_path):
    c = served()
    ids = prompt(40, seed=7)
    before = c.greedy(ids)
    assert c.ask(m.Compress, ids=ids, keep=0.5, drafter=str(tmp_path / "missing.gguf"))["code"] == "bad_request"
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf")
    assert c.ask(m.Compress, ids=ids, keep=0.5, drafter=str(bogus))["code"] == "bad_request"
    assert c.ask(m.Compress, ids=[600], keep=0.5)["code"] == "bad_request"     # outside the vocabulary
    with pytest.raises(Exception) as exc:
        m.Compress("x", ids=ids, keep=0.0)
    assert "keep" in str(exc.value)
    assert c.greedy(ids) == before
    assert c.ask(m.Compress, ids=ids, keep=0.5)["event"] == "result"


def test_no_drafter_is_not_loaded(served):
    c = served(drafter=False)
    ids = prompt(40)
    assert c.ask(m.Compress, ids=ids, keep=0.5)["code"] == "not_loaded"
    assert c.ask(m.Generate, ids=ids, compress="always", max_tokens=2)["code"] == "not_loaded"
    assert c.ask(m.Generate, ids=ids, max_tokens=2, ignore_eos=True, stream=False)["event"] == "done"


def test_prompt_longer_than_the_drafter_was_trained_for(served):
    c = served()
    trained = c.engine.compressor.drafter.model.config.context_length
    r = c.ask(m.Compress, ids=prompt(trained + 1), keep=0.1)
    assert r["code"] == "ctx_overflow" and str(trained) in r["message"]
    assert c.ask(m.Compress, ids=prompt(64), keep=0.5)["event"] == "result"


def test_rope_scaling_extends_the_drafter_with_the_target(pflash_models):
    """--rope-scaling reaches the PFlash drafter (it scores the target's prompt positions): under YaRN x2 the
    drafter's limit is twice its trained context, the VRAM plan sizes it so, and a prompt past the trained length
    compresses instead of answering ctx_overflow."""
    cfg = EngineConfig(model=str(pflash_models["target"]), device="cpu", max_ctx=1024,
                       prefill_drafter=str(pflash_models["drafter"]), pflash=PFlashConfig(forward_chunk=256),
                       rope_override=("yarn", 2.0, None))
    engine = Engine(cfg)
    engine.load()
    engine.start()
    try:
        c = Client(engine)
        dcfg = engine.compressor.drafter.model.config
        trained = dcfg.context_length
        assert dcfg.rope_scaling is not None and dcfg.max_context == 2 * trained
        from flashd.daemon.models import open_model
        from flashd.daemon.vram_ledger import LedgerState, VramLedger
        ledger = VramLedger.for_engine(engine.backend, cfg, *open_model(cfg.model, cfg.rope_override))
        settings = dict(ledger.plan(LedgerState(pflash=cfg.prefill_drafter)).settings)
        assert settings["prefill_drafter_tokens"] == 2 * trained
        r = c.ask(m.Compress, ids=prompt(trained + 1), keep=0.1)
        assert r["event"] == "result" and r["n_in"] == trained + 1
    finally:
        engine.stop(10)


def test_scoring_with_the_first_layers_equals_a_truncated_drafter(served):
    """layers=1 of the 2-layer drafter scores exactly as a 1-layer model with the same weights (the
    max over layers needs no later layer; the last layer run skips its output projection and MLP,
    which feed nothing), and differs from scoring with both layers."""
    c = served()
    drafter = c.engine.compressor.drafter
    ids = prompt(400, seed=5)
    first = drafter.tail_probs(ids, alpha=0.0, layers=1)
    both = drafter.tail_probs(ids, alpha=0.0, layers=0)
    np.testing.assert_array_equal(both, drafter.tail_probs(ids, alpha=0.0, layers=2))
    np.testing.assert_array_equal(both, drafter.tail_probs(ids, alpha=0.0, layers=9))   # capped at the model's
    all_layers = drafter.model.weights.layers
    try:
        drafter.model.weights.layers = all_layers[:1]        # the oracle: a full forward of a 1-layer model
        truncated = drafter.tail_probs(ids, alpha=0.0, layers=0)
    finally:
        drafter.model.weights.layers = all_layers
    np.testing.assert_array_equal(first, truncated)
    assert np.all(both >= first) and np.any(both > first)     # a max over more layers
    with pytest.raises(ValueError, match="score layers"):
        drafter.tail_probs(ids, layers=-1)


def test_compress_layers_field(served):
    c = served(score_layers=1)
    ids = prompt(600, seed=6)
    default = c.ask(m.Compress, ids=ids, keep=0.1)
    assert default["event"] == "result"
    assert c.ask(m.Compress, ids=ids, keep=0.1, layers=1)["ids"] == default["ids"]   # the daemon default is 1
    assert c.ask(m.Compress, ids=ids, keep=0.1, layers=0)["event"] == "result"     # every layer
    with pytest.raises(ProtocolError, match="layers: must be >= 0"):
        m.Compress("bad", ids=ids, keep=0.1, layers=-1)


def test_first_scoring_layer_leaves_out_the_layers_before_it(served):
    """tail_probs(first=1) is the max over layer 1 alone (layer 0 still runs: layer 1 reads its
    output), recorded per layer through ops.tail_max_probs by bench/lab_pflash_layers.py."""
    c = served()
    drafter = c.engine.compressor.drafter
    ids = prompt(400, seed=7)
    per_layer = layer_maxima(drafter, ids, 0.0)
    both = drafter.tail_probs(ids, alpha=0.0)
    assert len(per_layer) == 2
    np.testing.assert_array_equal(both, np.maximum(per_layer[0], per_layer[1]))
    np.testing.assert_array_equal(drafter.tail_probs(ids, alpha=0.0, first=1), per_layer[1])
    assert not np.array_equal(per_layer[0], per_layer[1])
    for layers, first in ((1, 1), (0, 2), (2, 5)):
        with pytest.raises(ValueError, match="first scoring layer"):
            drafter.tail_probs(ids, layers=layers, first=first)


def test_compress_first_layer_field_and_its_errors(served):
    c = served(score_from=1)
    ids = prompt(600, seed=8)
    default = c.ask(m.Compress, ids=ids, keep=0.1)
    assert c.ask(m.Compress, ids=ids, keep=0.1, first_layer=1)["ids"] == default["ids"]
    assert c.ask(m.Compress, ids=ids, keep=0.1, first_layer=0)["event"] == "result"
    bad = c.ask(m.Compress, ids=ids, keep=0.1, layers=1)          # the daemon's first layer 1 is not run
    assert bad["event"] == "error" and bad["code"] == "bad_request" and "first scoring layer" in bad["message"]
    assert c.ask(m.Compress, ids=ids, keep=0.1, layers=1, first_layer=0)["event"] == "result"
    assert c.ask(m.Compress, ids=ids, keep=0.1)["ids"] == default["ids"]          # still serving
    with pytest.raises(ValueError, match="score_from"):
        PFlashConfig(score_layers=2, score_from=2)
