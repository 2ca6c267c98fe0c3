"""GGUFFile's own header parser (daemon/models/gguf_header.py) against gguf-py's GGUFReader, the
definition: every metadata value and every tensor's bytes, shape and dtype equal, for every weight
format; corrupt files are clear ModelLoadErrors."""
import gguf
import numpy as np
import pytest

from flashd.daemon.models.gguf_file import GGUFFile, ModelLoadError
from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model

FORMATS = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K"]


def _same_value(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    return a == b


def _assert_matches_reader(path):
    ours, reader = GGUFFile(path), gguf.GGUFReader(path)
    expected = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata_dict.keys() == expected.keys()
    for key, value in expected.items():
        assert _same_value(ours.metadata(key), value), key
    assert ours.names == [t.name for t in reader.tensors]
    for t in reader.tensors:
        mine = ours.tensor(t.name)
        assert mine.blocks.dtype == t.data.dtype and mine.blocks.shape == t.data.shape, t.name
        assert np.array_equal(mine.blocks.view(np.uint8), np.asarray(t.data).view(np.uint8)), t.name
        assert mine.shape == tuple(int(d) for d in reversed(t.shape.tolist()))


@pytest.mark.parametrize("weight_type", FORMATS)
def test_every_format_matches_gguf_reader(tmp_path, weight_type):
    spec = SyntheticSpec(arch="qwen2", n_layers=1, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab_size=300,
                         weight_type=weight_type, seed=3)
    _assert_matches_reader(write_synthetic_model(tmp_path / f"{weight_type}.gguf", spec))


def test_a_real_file_matches_gguf_reader(real_model):
    _assert_matches_reader(real_model("qwen2.5-coder-0.5b"))


def test_corrupt_files_are_clear_errors(tmp_path):
    good = write_synthetic_model(tmp_path / "good.gguf", SyntheticSpec(vocab_size=300, seed=1))
    data = good.read_bytes()
    cases = {"empty": b"", "not_gguf": b"PK\x03\x04" + data[4:], "header_cut": data[:600],
             "data_cut": data[:len(data) - 100], "version": data[:4] + (9).to_bytes(4, "little") + data[8:]}
    for name, content in cases.items():
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(content)
        with pytest.raises(ModelLoadError, match="not a readable GGUF file") as info:
            GGUFFile(path)
        assert str(path) in str(info.value)
    with pytest.raises(ModelLoadError, match="no such model file"):
        GGUFFile(tmp_path / "missing.gguf")
