"""scripts/gguf_out: a GGUF is written whole or not at all (new_gguf, written_gguf)."""
import gguf
import numpy as np
import pytest

from flashd.scripts.gguf_out import new_gguf, written_gguf


def test_a_complete_file_is_kept_and_readable(tmp_path):
    path = tmp_path / "ok.gguf"
    with new_gguf(path, "llama") as writer:
        writer.add_block_count(3)
        writer.add_tensor("t", np.arange(6, dtype=np.float32).reshape(2, 3))
    reader = gguf.GGUFReader(path)
    assert [t.name for t in reader.tensors] == ["t"]
    assert np.array_equal(np.asarray(reader.tensors[0].data).reshape(2, 3), np.arange(6).reshape(2, 3))
    assert reader.fields["llama.block_count"].parts[-1][0] == 3


def test_a_new_gguf_that_raises_leaves_nothing(tmp_path):
    path = tmp_path / "bad.gguf"
    with pytest.raises(ValueError, match="bad tensor"):
        with new_gguf(path, "llama") as writer:
            writer.add_tensor("t", np.zeros(4, np.float32))
            raise ValueError("bad tensor")
    assert not path.exists()


def test_a_failure_leaves_no_partial_file(tmp_path):
    path = tmp_path / "bad.gguf"
    with pytest.raises(RuntimeError, match="disk full"):
        with written_gguf(path, "llama") as writer:
            writer.add_tensor("t", np.zeros(4, np.float32))
            writer.write_header_to_file()
            raise RuntimeError("disk full")
    assert not path.exists()
