"""The daemon on the GPU: `flashd serve --device cuda` streams the same text as the CPU reference
daemon, over stdin and over ZeroMQ. The synthetic model's top-2 logit gaps are ~0.1-1, far above
the CUDA path's ~1e-3 deviation, so greedy outputs are expected to be identical."""
import msgpack
import pytest
import zmq

from tests.daemon.daemon_harness import ServeDaemon, generated

PROMPT = 'generate id={id} text="def fibonacci(n):" max_tokens=48 ignore_eos=true'


@pytest.fixture(scope="module")
def model(synthetic_model):
    return synthetic_model(arch="qwen2", weight_type="Q4_K", n_layers=2, hidden=256, n_heads=2, n_kv_heads=1,
                           ffn=512, vocab_size=512, seed=3)   # head_dim 128


def test_gpu_daemon_streams_the_reference_text(native, model, tmp_path):
    cpu = ServeDaemon(model, tmp_path)
    gpu = ServeDaemon(model, tmp_path, "--device", "cuda", "--zmq", "tcp://127.0.0.1:*")
    try:
        assert gpu.ready.get("backend") == "cuda", gpu.ready
        want_ids, want_text, done = generated(cpu.ask(PROMPT.format(id="a"), "a"))
        got_ids, got_text, done_gpu = generated(gpu.ask(PROMPT.format(id="a"), "a"))
        assert done_gpu["event"] == "done" and done_gpu["n_gen"] == 48
        assert got_ids == want_ids and got_text == want_text
        # the same request over ZeroMQ
        endpoint = gpu.ready.get("zmq") or gpu.ready.get("endpoint")
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(endpoint)
        sock.send(msgpack.packb({"cmd": "generate", "id": "z", "text": "def fibonacci(n):", "max_tokens": 48,
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
        assert ids == want_ids
    finally:
        for d in (cpu, gpu):
            d.kill()
