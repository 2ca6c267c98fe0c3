"""Tiny synthetic target and draft models on the reference backend, shared by the spec tests."""
from __future__ import annotations

import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.runner import ModelRunner

# A small vocabulary (the minimum is 256 bytes + 3 specials) keeps the reference forward cheap and
# makes drafts from a different-seed model agree with the target now and then.
TARGET = dict(arch="qwen2", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=320,
              seed=1, name="spec-target")
DRAFT = dict(TARGET, n_layers=1, seed=1, name="spec-draft")   # same seed: shares the embeddings
OTHER_VOCAB = dict(DRAFT, vocab_size=384, name="spec-other-vocab")


@pytest.fixture(scope="session")
def make_runner(synthetic_model):
    ops = ReferenceOps()
    loaded = {}

    def make(fields: dict, max_ctx: int = 256, prefill_chunk: int = 64) -> ModelRunner:
        path = synthetic_model(**fields)
        if path not in loaded:
            loaded[path] = load_model(path, ops.load_weight)
        m = loaded[path]
        return ModelRunner(ops, m.config, m.weights, max_ctx, prefill_chunk)

    return make
