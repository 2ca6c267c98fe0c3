"""Fixtures for the PFlash CPU tests: fresh random inputs per test, and tiny synthetic target and
drafter models (same vocabulary; a drafter with another vocabulary for the text round trip)."""
from pathlib import Path

import numpy as np
import pytest

from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model

TARGET_SPEC = SyntheticSpec(arch="qwen2", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128,
                            vocab_size=512, seed=11, name="pflash-target")
# a different family and shape, the same vocabulary (the maker's tokenizer depends on vocab_size only)
DRAFTER_SPEC = SyntheticSpec(arch="qwen3", n_layers=2, hidden=64, n_heads=4, n_kv_heads=1, ffn=96,
                             vocab_size=512, seed=12, name="pflash-drafter")
OTHER_VOCAB_SPEC = SyntheticSpec(arch="llama", n_layers=1, hidden=32, n_heads=2, n_kv_heads=1, ffn=64,
                                 vocab_size=400, seed=13, name="pflash-other-vocab")


@pytest.fixture
def rng():
    return np.random.default_rng(201)


@pytest.fixture(scope="session")
def pflash_models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pflash-models")
    return {"target": write_synthetic_model(d / "target.gguf", TARGET_SPEC),
            "drafter": write_synthetic_model(d / "drafter.gguf", DRAFTER_SPEC),
            "other_vocab": write_synthetic_model(d / "other.gguf", OTHER_VOCAB_SPEC)}
