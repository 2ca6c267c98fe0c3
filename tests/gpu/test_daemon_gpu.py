"""The daemon on the GPU: `flashd serve --device cuda` streams the reference backend's greedy text, over stdin
and over ZeroMQ.

Tolerance: the CUDA path's logits differ from the reference's by up to ~1e-2 of their scale (gemv_rows quantizes x
to int8 with one scale a 128-column group; tests/gpu/logits_check.py), and a random 512-token model has near-ties
within 48 tokens (this one: top-2 gaps of 0.26% and 0.08% of the scale at steps 7 and 9, computed on the CPU), so
the GPU's tokens must equal the reference's greedy tokens up to the reference's first near-tie (greedy_prefix_agrees,
the whole-model tests' rule), and the ZeroMQ stream must equal the stdin stream token for token (one daemon, one
path: no tolerance)."""
import msgpack
import pytest
import zmq

from flashd.clients.tokenizer import Tokenizer
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.runner import ModelRunner
from tests.daemon.daemon_harness import ServeDaemon, generated
from tests.gpu.logits_check import greedy_prefix_agrees

TEXT = "def fibonacci(n):"
PROMPT = 'generate id={id} text="%s" max_tokens=48 ignore_eos=true' % TEXT


@pytest.fixture(scope="module")
def model(synthetic_model):
    return synthetic_model(arch="qwen2", weight_type="Q4_K", n_layers=2, hidden=256, n_heads=2, n_kv_heads=1,
                           ffn=512, vocab_size=512, seed=3)   # head_dim 128


def test_gpu_daemon_streams_the_reference_text(native, model, tmp_path):
    ops = ReferenceOps()
    lm = load_model(model, ops.load_weight)
    ref = ModelRunner(ops, lm.config, lm.weights, 256, 64)
    tok = Tokenizer.from_gguf(model)
    gpu = ServeDaemon(model, tmp_path, "--device", "cuda", "--zmq", "tcp://127.0.0.1:*")
    try:
        assert gpu.ready.get("backend") == "cuda", gpu.ready
        got_ids, got_text, done_gpu = generated(gpu.ask(PROMPT.format(id="a"), "a"))
        assert done_gpu["event"] == "done" and done_gpu["n_gen"] == 48
        ok, where = greedy_prefix_agrees(ref, tok.encode(TEXT), got_ids)
        assert ok, f"the GPU's greedy tokens leave the reference's at step {where} without a near-tie"
        assert got_text == tok.decode(got_ids)
        # the same request over ZeroMQ
        endpoint = gpu.ready.get("zmq") or gpu.ready.get("endpoint")
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(endpoint)
        sock.send(msgpack.packb({"cmd": "generate", "id": "z", "text": TEXT, "max_tokens": 48,
                                 "ignore_eos": True}))
        ids = []
        while True:
            assert sock.poll(30000), "no answer over ZeroMQ"
            ev = msgpack.unpackb(sock.recv(), raw=False)
            if ev["event"] == "token":
                ids += list(ev["ids"])
            else:
                assert ev["event"] == "done", ev
                break
        sock.close(0)
        assert ids == got_ids
    finally:
        gpu.kill()
