"""Tiny synthetic target and draft models on the reference backend, shared by the spec tests."""
from __future__ import annotations

import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.runner import ModelRunner

from tests.speculative.spec_models import DRAFT, OTHER_VOCAB, TARGET  # noqa: F401  (re-exported for fixtures)


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
