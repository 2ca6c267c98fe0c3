"""bench_kv_types.py on the CPU with a tiny synthetic model: one row per KV type, f16 agreeing with itself,
the quantized caches smaller, the JSON beside the Markdown; and the teacher-forced argmax is the runner's
score() argmax whatever the chunking."""
import json

import numpy as np
import pytest

from flashd.bench import bench_kv_types as bench
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.runner import ModelRunner
from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model

SPEC = SyntheticSpec(arch="qwen2", n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=512,
                     seed=61, name="kvb")                    # head_dim 32


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_synthetic_model(tmp_path_factory.mktemp("kvb") / "kvb.gguf", SPEC)


def test_teacher_forced_argmax_is_score_argmax(model):
    ops = ReferenceOps()
    lm = load_model(model, ops.load_weight)
    ids = [int(t) for t in np.random.default_rng(0).integers(0, 512, 37)]
    r = ModelRunner(ops, lm.config, lm.weights, 64, 8)
    np.testing.assert_array_equal(bench.teacher_forced_argmax(r, ids), np.argmax(r.score(ids), axis=-1))
    np.testing.assert_array_equal(bench.teacher_forced_argmax(r, ids, 5), np.argmax(r.score(ids), axis=-1))
    assert r.n_past == 0


def test_bench_rows_per_type(model, tmp_path, capsys):
    text = tmp_path / "code.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 20)
    out = tmp_path / "out"
    assert bench.main(["--model", str(model), "--text", str(text), "--tokens", "40", "--device", "cpu",
                       "--depth", "8", "--gen", "2", "--reps", "1", "--chunk", "16", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| f16 | 100.00% |" in printed and "| q8_0 |" in printed and "| q4_0 |" in printed
    data = json.loads(next(out.glob("*-kv-types.json")).read_text())
    by = {row["type"]: row for row in data}
    assert by["f16"]["agreement"] == 1.0 and 0.0 <= by["q4_0"]["agreement"] <= 1.0
    assert by["f16"]["kv_bytes"] > by["q8_0"]["kv_bytes"] > by["q4_0"]["kv_bytes"]
    assert all(row["tok_s"] > 0 for row in data)


def test_type_names_parse_with_a_window():
    assert str(bench.parse_type("q4_0@256")) == "q4_0,window=256"
    assert str(bench.parse_type("q8_0/q4_0@64")) == "k=q8_0,v=q4_0,window=64"
    assert str(bench.parse_type("q4_0/f16")) == "k=q4_0,v=f16"
    with pytest.raises(ValueError, match="window"):
        bench.parse_type("q4_0@100")


def test_a_window_row_on_the_cpu(model, tmp_path):
    text = tmp_path / "code.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 40)
    out = tmp_path / "out"
    assert bench.main(["--model", str(model), "--text", str(text), "--tokens", "150", "--device", "cpu",
                       "--gen", "0", "--chunk", "64", "--types", "f16,q4_0,q4_0@64", "--out", str(out)]) == 0
    by = {row["type"]: row for row in json.loads(next(out.glob("*-kv-types.json")).read_text())}
    assert by["q4_0@64"]["kv_bytes"] > by["q4_0"]["kv_bytes"]       # the reference keeps full-precision copies
    assert 0.0 <= by["q4_0@64"]["agreement"] <= 1.0
