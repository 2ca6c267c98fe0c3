"""A model whose forward gives NaN logits (a broken weight file): `generate` ends with the protocol error
`model_output` instead of streaming tokens chosen from NaN, greedy and sampled, plain and speculative; the daemon keeps
serving (tokenize, and a request on a healthy daemon's probe is unchanged)."""
from __future__ import annotations

import shutil

import numpy as np
from gguf import GGUFReader


def nan_model(synthetic_model, tmp_path):
    """The synthetic model with output_norm.weight (float32) set to NaN: every logit is NaN."""
    path = tmp_path / "nan-output-norm.gguf"
    shutil.copy(synthetic_model, path)
    t = next(t for t in GGUFReader(path).tensors if t.name == "output_norm.weight")
    assert t.tensor_type == 0                                   # F32
    with open(path, "r+b") as f:
        f.seek(t.data_offset)
        f.write(np.full(t.n_elements, np.nan, np.float32).tobytes())
    return path


def test_nan_logits_end_the_request_with_model_output_and_the_daemon_keeps_serving(spawn_serve, synthetic_model,
                                                                                 tmp_path):
    daemon = spawn_serve(model=nan_model(synthetic_model, tmp_path))
    for i, extra in enumerate(["", " temperature=0.7 seed=5", " spec=chain draft=ngram", " spec=auto draft=ngram"]):
        events = daemon.ask(f'generate id=g{i} text="hello world" max_tokens=8{extra}', f"g{i}")
        err = events[-1]
        assert err["event"] == "error" and err["code"] == "model_output", events
        assert "NaN" in err["message"]
        assert not [e for e in events if e["event"] == "token"], "no token is chosen from NaN logits"
    tok = daemon.ask('tokenize id=t text="still serving"', "t")
    assert tok[-1]["event"] == "result" and tok[-1]["ids"]
