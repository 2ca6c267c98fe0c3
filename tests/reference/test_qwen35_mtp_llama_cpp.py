"""The qwen35 multi-token-prediction block (models/qwen35_mtp.py) on the reference backend against llama.cpp: the
tiny synthetic qwen35 + MTP model of scripts/record_qwen35_mtp_reference.py (float32 weights), rebuilt bit for bit
from its seed, against llama.cpp 0.3.36's recorded MTP logits (tests/data/reference/qwen35-mtp-synthetic.json):
the target's output-normed hidden rows h_p, the block replayed over the 40-token prompt with pairs (x_p, h_{p-1})
(what llama.cpp's MTP driver feeds it after a prefill), and a 4-step draft chain that feeds each step's own normed
output back as the next step's h.

Tolerance: |logit difference| <= 1e-4 (TOL of tests/reference/llama_cpp_recording.py; logits up to ~8 here). With
float32 weights llama.cpp's CPU matmuls do not quantize activations; what remains is float32 rounding in another
order (the trunk's recurrent vs chunked delta rule, matmul summation order, eh_proj as two half-width products
instead of one product over the concatenation) and the JSON's 1e-6 rounding. Measured when recorded (x86-64):
h rows 1.3e-6, replay full rows 2.4e-6, top-5 logits at every position 2.4e-6, chain rows 2.4e-6; 1e-4 is 40x
the worst. The mistakes one can make in the block cost far more (checked below: the halves of eh_proj swapped,
the raw instead of the output-normed target row, h_p instead of h_{p-1}, the chain fed the target's row instead
of its own).
"""
import dataclasses

import numpy as np
import pytest

from flashd.daemon.backends.base import Batch
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model, open_model
from flashd.daemon.models.qwen35_mtp import mtp_cache_spec, mtp_forward, target_hidden
from flashd.daemon.models.qwen35_mtp_weights import load_mtp_weights, mtp_config
from flashd.daemon.runner import ModelRunner
from flashd.scripts.record_qwen35_mtp_reference import FORMAT, MODEL, N_CHAIN
from tests.reference.llama_cpp_recording import TOL, load_recording, rebuilt_model

REC = load_recording("qwen35-mtp-synthetic.json")


class Setup:
    def __init__(self, path):
        self.ops = ops = ReferenceOps()
        f, self.cfg = open_model(path)
        self.target = load_model((f, self.cfg), ops.load_weight)
        self.w = load_mtp_weights(f, self.cfg, mtp_config(f, self.cfg), ops.load_weight, self.target.weights)
        self.ids = REC["model"]["prompt_ids"]
        rows = []
        runner = ModelRunner(ops, self.cfg, self.target.weights, 128, 512)
        last = self.cfg.n_layers - 1
        self.logits = np.asarray(runner.prefill(self.ids, all_logits=True,
                                                hidden_sink=lambda i, h: rows.append(np.array(h)) if i == last else None))
        self.raw = np.concatenate(rows)
        self.h = np.asarray(target_hidden(ops, self.cfg, self.target.weights, self.raw))

    def replay(self, h_prev, w=None):
        """The block over the prompt: (logits (N, V), its normed rows (N, D), the cache)."""
        ops, n = self.ops, len(self.ids)
        cache = ops.kv_cache(mtp_cache_spec(self.cfg, 128))
        ops.begin_forward()
        batch = Batch(np.array(self.ids, np.int32), np.arange(n, dtype=np.int32), np.zeros(1, np.int32))
        logits, g = mtp_forward(ops, self.cfg, w or self.w, cache, batch, h_prev, all_logits=True)
        return np.asarray(logits), np.asarray(g), cache

    def shifted(self, h):
        return np.concatenate([np.zeros((1, self.cfg.hidden), np.float32), h[:-1]])

    def chain(self, own_h: bool = True):
        """The recorded chain's steps after the replay: each step's logits."""
        _, _, cache = self.replay(self.shifted(self.h))
        n, tok, hrow, out = len(self.ids), REC["model"]["chain"]["tokens"][0], self.h[-1:], []
        for k in range(N_CHAIN):
            self.ops.begin_forward()
            batch = Batch(np.array([tok], np.int32), np.array([n + k], np.int32), np.array([n + k], np.int32))
            logits, g = mtp_forward(self.ops, self.cfg, self.w, cache, batch, hrow)
            out.append(np.asarray(logits)[0])
            tok = int(out[-1].argmax())
            hrow = np.asarray(g) if own_h else self.h[-1:]
        return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = rebuilt_model(tmp_path_factory.mktemp("mtp") / "mtp.gguf", MODEL, REC["model"]["gguf_md5"])
    return Setup(path)


def full_row_error(logits, rows) -> float:
    return max(float(np.abs(logits[int(p)] - np.array(r)).max()) for p, r in rows.items())


def test_recording_is_of_this_model():
    assert REC["format"] == FORMAT and REC["model"]["spec"]["mtp"] is True
    assert REC["recorder"]["llama_cpp_python_version"] == "0.3.36"
    assert len(REC["model"]["prompt_ids"]) == 40 and len(REC["model"]["chain"]["rows"]) == N_CHAIN


def test_target_hidden_rows_match_llama_cpp(setup):
    t = REC["model"]["target"]
    assert np.array_equal(setup.logits.argmax(1), t["argmax_ids"])
    err = max(float(np.abs(setup.h[int(p)] - np.array(r)).max()) for p, r in t["h_rows"].items())
    assert err <= TOL, f"h rows differ by {err:.2e}"


def test_replay_logits_match_llama_cpp(setup):
    rep = REC["model"]["replay"]
    logits, _, _ = setup.replay(setup.shifted(setup.h))
    worst = full_row_error(logits, rep["full_rows"])
    assert worst <= TOL, f"worst full-row difference {worst:.2e}"
    top_ids, top_logits = np.array(rep["top_ids"]), np.array(rep["top_logits"])
    np.testing.assert_allclose(np.take_along_axis(logits, top_ids, 1), top_logits, rtol=0, atol=TOL)
    clear = top_logits[:, 0] - top_logits[:, 1] > 2 * TOL
    assert clear.sum() >= 38 and np.array_equal(logits.argmax(1)[clear], np.array(rep["argmax_ids"])[clear])


def test_draft_chain_matches_llama_cpp(setup):
    ch = REC["model"]["chain"]
    rows = setup.chain()
    assert [int(r.argmax()) for r in rows] == ch["argmax_ids"]
    assert ch["tokens"][1:] == ch["argmax_ids"][:-1]
    worst = max(float(np.abs(r - np.array(x)).max()) for r, x in zip(rows, ch["rows"]))
    assert worst <= TOL, f"worst chain-row difference {worst:.2e}"


def test_the_oracle_tells_wrong_blocks_apart(setup):
    """What a wrong block would give is far outside TOL, so the tests above would catch it."""
    rows = REC["model"]["replay"]["full_rows"]
    swapped = dataclasses.replace(setup.w, eh_proj_e=setup.w.eh_proj_h, eh_proj_h=setup.w.eh_proj_e)
    for name, logits in [("eh_proj halves swapped", setup.replay(setup.shifted(setup.h), swapped)[0]),
                         ("raw target row", setup.replay(setup.shifted(setup.raw))[0]),
                         ("h_p instead of h_{p-1}", setup.replay(setup.h)[0])]:
        assert full_row_error(logits, rows) > 100 * TOL, name
    rec_rows = REC["model"]["chain"]["rows"]
    wrong = setup.chain(own_h=False)
    assert max(float(np.abs(r - np.array(x)).max()) for r, x in zip(wrong[1:], rec_rows[1:])) > 100 * TOL
