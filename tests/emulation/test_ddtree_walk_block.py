"""The device DDTree's walk block (tree_build.py; fd_ddtree_build writes it, ddtree.cu): walk_tree reads back
the DraftTree a block of [n_built | tokens | parents | depths | ranks] holds. Checked here with the block written
on the host from build_tree's trees, in the layout the kernel's header gives; the kernel itself is checked
against build_tree on the GPU (tests/gpu/test_ddtree_build_gpu.py). Also the wrapper's argument checks, which run
before anything reaches the device."""
import numpy as np
import pytest

from flashd.daemon.backends.cuda.tree_build import walk_tree, walk_words
from flashd.daemon.speculative.drafter import Proposal
from flashd.daemon.speculative.tree import build_tree


def block_of(tree, n_tree: int) -> np.ndarray:
    b = np.full(walk_words(n_tree), -7, np.int32)        # unwritten words: junk the reader must not use
    b[0] = tree.n_nodes
    for j, field in enumerate((tree.tokens, tree.parents, tree.depths, tree.ranks)):
        b[1 + j * n_tree:1 + j * n_tree + tree.n_nodes] = field
    return b


@pytest.mark.parametrize("budget,n_tree", [(22, 23), (22, 40), (0, 1), (64, 256)])
def test_walk_tree_reads_the_tree_back(budget, n_tree):
    rng = np.random.default_rng(budget)
    prop = Proposal(rng.integers(0, 1000, (15, 8)).astype(np.int32), -np.sort(rng.exponential(2, (15, 8)), axis=1))
    tree = build_tree(11, prop, budget)
    got = walk_tree(block_of(tree, n_tree), n_tree, tree.scores)
    for field in ("tokens", "parents", "depths", "ranks", "scores"):
        np.testing.assert_array_equal(getattr(got, field), getattr(tree, field))
    assert np.isnan(walk_tree(block_of(tree, n_tree), n_tree).scores).all()      # not read back: NaN
    assert got.children() == tree.children()


@pytest.mark.parametrize("n_built", [0, 24])
def test_a_count_outside_the_block_is_an_error(n_built):
    b = np.zeros(walk_words(23), np.int32)
    b[0] = n_built
    with pytest.raises(RuntimeError, match="nodes for a block of 23"):
        walk_tree(b, 23)


def fake(shape, dtype):
    """A device tensor at a fake address: the wrapper's checks run before anything touches the device."""
    from flashd.daemon.backends.cuda.tensor import DeviceTensor
    return DeviceTensor(1 << 20, tuple(shape), np.dtype(dtype), None)


@pytest.mark.parametrize("change,match", [
    (dict(n_depth=17, rows=17), "n_depth 17"), (dict(k=17), "k 17"), (dict(budget=16), "budget 16 < n_tree 16"),
    (dict(n_tree=257, budget=5), "n_tree 257"), (dict(n_past=-1), "n_past -1"), (dict(rows=2), "for 3 depths"),
    (dict(lp_dtype=np.float32), "logprobs float64"), (dict(walk_words=10), "walk"),
    (dict(inputs_words=10), "tree_inputs"),
])
def test_ddtree_build_refuses_bad_arguments_before_the_call(change, match):
    from flashd.daemon.backends.cuda.tree_build import TreeBuildOps
    from flashd.daemon.backends.cuda.tree_inputs import tree_input_words
    a = dict(n_depth=3, k=4, budget=5, n_tree=16, n_past=0, rows=3, lp_dtype=np.float64, walk_words=None,
             inputs_words=None)
    a.update(change)
    n_tree = a["n_tree"]
    ids, lp = fake((a["rows"], a["k"]), np.int32), fake((a["rows"], a["k"]), a["lp_dtype"])
    inputs = fake((a["inputs_words"] or tree_input_words(n_tree),), np.int32)
    walk = fake((a["walk_words"] or walk_words(n_tree),), np.int32)
    with pytest.raises((ValueError, TypeError), match=match):
        TreeBuildOps().ddtree_build(ids, lp, n_depth=a["n_depth"], budget=a["budget"], chain_seed=True, root=1,
                                    n_past=a["n_past"], tree_inputs=inputs, walk=walk, n_tree=n_tree)
