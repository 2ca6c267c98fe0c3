"""bench/eval_drafter.py end to end on tiny synthetic models on the CPU: the target's answers (greedy_answers, in
prompt order), the trainer's held-out measures and the walk, per prompt; and greedy_answers against one-prompt batches
(no timing asserted)."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from flashd.bench.eval_drafter import main   # noqa: E402


@pytest.fixture
def tiny(tmp_path, synthetic_model):
    from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash

    target = synthetic_model(arch="qwen2", n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=320,
                             seed=1, name="eval-drafter-target")
    spec = spec_for_target(64, 3, 320, n_features=2, block_size=8, n_layers=1, head_dim=16, ffn=64, seed=5)
    return target, write_synthetic_dflash(tmp_path / "d.gguf", spec)


def test_runs_on_tiny_models(tmp_path, capsys, tiny):
    target, drafter = tiny
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"text": t, "kind": k}) + "\n"
                               for t, k in (("def f(x):", "code"), ("a longer prompt, a b c d e", "prose"))))
    assert main([str(target), str(drafter), "--prompts", str(prompts), "--max-new", "10", "--device", "cpu",
                 "--per-prompt"]) == 0
    out = capsys.readouterr().out
    assert "2 prompts of p.jsonl" in out and "accept_len" in out and "along the runtime's walk" in out
    assert out.count(" tokens  '") == 2                         # one line a prompt
    assert "kind 'code': 1 prompts" in out and "kind 'prose': 1 prompts" in out


def test_greedy_answers_keep_the_prompt_order(tiny):
    from flashd.train.batch_decode import greedy_answers
    from flashd.train.target import TorchTarget

    target = TorchTarget(tiny[0], device="cpu", max_pos=64)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 300, n).astype(np.int32) for n in (9, 3, 6)]
    together = greedy_answers(target, prompts, 6, [])
    alone = [greedy_answers(target, [p], 6, [])[0] for p in prompts]
    for a, b in zip(together, alone):
        assert a.dtype == np.int32 and np.array_equal(a, b)
