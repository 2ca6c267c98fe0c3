"""bench/ddtree_offline.py: the walk (the runtime's steps tiling an answer), the tree and chain acceptance of one
draft step, and a whole run on tiny synthetic models on the CPU (no timing asserted)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from flashd.bench.ddtree_offline import accepted_in_tree, chain_accepted, main, walk   # noqa: E402


def test_walk_tiles_the_answer_as_the_runtime_does():
    # one sequence, prompt 2 tokens, 8 tokens in all: steps may root at positions 2..6
    acc = {2: 2, 3: 0, 4: 0, 5: 1, 6: 0}
    where = [(0, a, 2, 8) for a in acc]
    # rooted at 2: 3 tokens (2 accepted + the bonus), then at 5: 2 tokens, then 7 = the end: 5 tokens in 2 steps
    assert walk(where, list(acc.values())) == pytest.approx(2.5)
    assert walk([(0, a, 2, 8) for a in (2, 3, 4, 6)], [2, 0, 0, 0]) is None   # the walk needs position 5


def test_tree_finds_what_the_chain_misses():
    ids = np.array([[10, 11], [20, 21], [30, 31]], np.int32)
    lp = np.log(np.array([[0.9, 0.05], [0.6, 0.35], [0.5, 0.4]]))
    cont = np.array([10, 21, 30, -1])                # depth 2's true token is the second candidate
    assert chain_accepted(ids, cont) == 1
    assert accepted_in_tree(1, ids, lp, cont, budget=1) == 1
    # the chain seed first: (10), (10, 20), (10, 20, 30); then best first: (10, 21) 0.315, (10, 20, 31) 0.216,
    # (10, 21, 30) 0.1575, (11) 0.05
    assert accepted_in_tree(1, ids, lp, cont, budget=3) == 1
    assert accepted_in_tree(1, ids, lp, cont, budget=4) == 2
    assert accepted_in_tree(1, ids, lp, cont, budget=5) == 2
    assert accepted_in_tree(1, ids, lp, cont, budget=6) == 3
    assert accepted_in_tree(1, ids, lp, np.array([-1, -1, -1, -1]), budget=8) == 0    # nothing left to accept


def test_runs_on_tiny_models(tmp_path, capsys, synthetic_model):
    from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash

    target = synthetic_model(arch="qwen2", n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=320,
                             seed=1, name="ddtree-offline-target")
    spec = spec_for_target(64, 3, 320, n_features=2, block_size=16, n_layers=1, head_dim=16, ffn=64, seed=5)
    drafter = write_synthetic_dflash(tmp_path / "d.gguf", spec)
    args = [str(target), str(drafter), "--n-prompts", "2", "--max-new", "12", "--budgets", "4,8",
            "--temperatures", "1", "--top-k", "4", "--answers", str(tmp_path / "a.npz")]
    assert main(args) == 0
    assert main(args + ["--dump", str(tmp_path / "s.npz")]) == 0                    # the answers come from the cache
    out = capsys.readouterr().out
    assert "along the runtime's walk" in out and "| 1 | 4 |" in out
    steps = np.load(tmp_path / "s.npz")
    assert steps["ids"].shape[1:] == (15, 4) and len(steps["roots"]) == len(steps["cont"])
