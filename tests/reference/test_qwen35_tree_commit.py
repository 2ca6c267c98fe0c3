"""A draft tree's verify and commit on a hybrid (qwen35) model, through ModelRunner.forward_tree / commit_tree
(models/qwen35_tree.py): the live recurrent state is untouched by the verify, the commit keeps exactly the accepted
node's state (a copy of its node buffer, bit for bit) and nothing else, and decoding goes on as if the path's
tokens had been decoded one by one.

Tolerances: node states and the committed state are compared bitwise with the node buffers they were copied from.
Against one-token decode steps along a path, logits within 1e-4 and states within 1e-5 (absolute) with equal
argmax: the reference backend's projections of n rows are one BLAS gemm and of one row a gemv, which round the
last bits differently (ReferenceOps.begin_forward); the recurrent arithmetic itself is bitwise
(test_qwen35_tree_state.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.models.qwen35_tree import MAX_TREE_NODES, path_to
from flashd.daemon.runner import ModelRunner
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec

SPEC = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, rope_dim=16,
                     ssm_state=16, ssm_k_heads=1, ssm_v_heads=2, full_attn_interval=2, weight_type="F32", seed=41)
PROMPT = [5, 9, 300, 301, 7, 8, 100, 17, 18, 19]
# node 0 = root; 1-2-3-4 a chain (the spine), 5 and 6 off-spine siblings, 7 below 6
PARENTS = np.array([-1, 0, 1, 2, 3, 0, 1, 6], np.int32)
TOKENS = np.array([11, 12, 13, 14, 15, 40, 41, 42], np.int32)
LOGITS_TOL, STATE_TOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    ops = ReferenceOps()
    return ops, load_model(write_synthetic_model(tmp_path_factory.mktemp("q35t") / "m.gguf", SPEC), ops.load_weight)


def runner(model) -> ModelRunner:
    ops, m = model
    r = ModelRunner(ops, m.config, m.weights, 128, 16)
    r.start(PROMPT)
    return r


def ancestor_mask(parents) -> np.ndarray:
    mask = np.eye(len(parents), dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
    return mask


def verify(r: ModelRunner):
    depths = np.array([len(path_to(PARENTS, i)) - 1 for i in range(len(PARENTS))])
    return r.logits_to_host(r.forward_tree(TOKENS, r.n_past + depths, ancestor_mask(PARENTS)))


def decoded(model, tokens):
    """Logits rows and the state after one-token decode steps of `tokens` after PROMPT."""
    r = runner(model)
    rows = [r.prefill([int(t)])[0] for t in tokens]
    return np.array(rows), r.cache.save_state(), r


def test_verify_leaves_the_live_state_and_gives_decode_logits(model):
    r = runner(model)
    before = r.cache.save_state()
    logits = verify(r)
    for got, want in zip(r.cache.save_state(), before):
        np.testing.assert_array_equal(got, want)
    assert r.n_past == len(PROMPT)
    for i in range(len(PARENTS)):
        rows, _, _ = decoded(model, TOKENS[path_to(PARENTS, i)])
        np.testing.assert_allclose(logits[i], rows[-1], rtol=0, atol=LOGITS_TOL)
        assert np.argmax(logits[i]) == np.argmax(rows[-1])


@pytest.mark.parametrize("path", [[0], [0, 1, 2, 3, 4], [0, 5], [0, 1, 6, 7]],
                         ids=["reject-all", "accept-spine", "off-spine-leaf", "off-spine-deep"])
def test_commit_keeps_exactly_the_accepted_nodes_state(model, path):
    r = runner(model)
    verify(r)
    state = r.cache.state
    node = (state.node_conv[:, path[-1]].copy(), state.node_ssm[:, path[-1]].copy())
    r.commit_tree(path)
    assert r.n_past == len(PROMPT) + len(path)
    for got, want in zip(r.cache.save_state(), node):
        np.testing.assert_array_equal(got, want)          # a copy of the node's state, no recomputation
    rows, want_state, plain = decoded(model, TOKENS[path])
    for got, want in zip(r.cache.save_state(), want_state):
        np.testing.assert_allclose(got, want, rtol=0, atol=STATE_TOL)
    # decoding goes on from the committed path: K/V moved, the state kept
    for t in (3, 4, 5):
        np.testing.assert_allclose(r.prefill([t])[0], plain.prefill([t])[0], rtol=0, atol=LOGITS_TOL)


def test_the_rejected_nodes_leave_no_trace(model):
    """Verify, commit the root only, verify the same tree again: the second verify sees the state after the root,
    as a runner that decoded the root plainly does."""
    r = runner(model)
    verify(r)
    r.commit_tree([0])
    again = verify(r)
    _, _, plain = decoded(model, TOKENS[:1])
    np.testing.assert_allclose(again, plain.logits_to_host(verify(plain)), rtol=0, atol=LOGITS_TOL)


def test_only_a_root_to_node_path_of_the_last_verify_can_be_committed(model):
    r = runner(model)
    with pytest.raises(ValueError, match="no tree forward"):
        r.commit_tree([0])
    verify(r)
    for bad in ([0, 2], [0, 1, 7], [1, 2]):
        with pytest.raises(ValueError, match="root-to-node path"):
            r.commit_tree(bad)
    r.prefill([3])                      # any other forward makes the node states stale
    with pytest.raises(ValueError, match="no tree forward"):
        r.commit_tree([0])


def test_a_mask_that_is_not_a_trees_is_refused(model):
    r = runner(model)
    mask = np.ones((3, 3), bool)        # every node sees every other: no recurrent state can follow it
    with pytest.raises(ValueError, match="tree mask"):
        r.forward_tree([1, 2, 3], [r.n_past] * 3, mask)


def test_rewind_cuts_a_hybrid_context_back(model):
    """A hybrid draft model's cut-back (ModelRunner.checkpoint / rewind): the checkpoint's state is loaded and the
    kept tokens after it are prefilled again, so the context is, bit for bit, one that never saw the rest."""
    r = runner(model)
    n0 = r.n_past
    r.checkpoint()
    chain = r.greedy_continue([11], 5)                  # the context: PROMPT + 11 + chain[:-1]
    context = PROMPT + [11] + chain[:-1]
    assert r.n_past == len(context)
    with pytest.raises(ValueError):
        r.rewind(len(context) + 1, context)             # past the end
    r.rewind(n0 + 3, context)
    assert r.n_past == n0 + 3
    kept = runner(model)
    kept.prefill(context[n0:n0 + 3])
    np.testing.assert_array_equal(r.prefill([7]), kept.prefill([7]))
    for a, b in zip(r.cache.save_state(), kept.cache.save_state()):
        np.testing.assert_array_equal(a, b)
    r.checkpoint()
    with pytest.raises(ValueError, match="checkpoint"):
        r.rewind(n0, context)                           # before the checkpoint: the state there is gone


def test_a_hybrid_verify_is_bounded_in_nodes(model):
    """Each node keeps a whole recurrent state: a hybrid's tree is at most MAX_TREE_NODES nodes whatever the chunk."""
    ops, m = model
    assert ModelRunner(ops, m.config, m.weights, 1024, 512).max_tree_nodes == MAX_TREE_NODES
    assert ModelRunner(ops, m.config, m.weights, 1024, 16).max_tree_nodes == 16
    r = ModelRunner(ops, m.config, m.weights, 1024, 512)
    r.start(PROMPT)
    n = MAX_TREE_NODES + 1
    with pytest.raises(ValueError, match="at most"):
        r.forward_tree(list(range(n)), r.n_past + np.arange(n), np.tril(np.ones((n, n), bool)))
