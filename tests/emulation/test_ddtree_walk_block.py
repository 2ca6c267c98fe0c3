"""The device DDTree's walk block (tree_build.py; fd_ddtree_build writes it, ddtree.cu): walk_tree reads back
the DraftTree a block of [n_built | tokens | parents | depths | ranks] holds. Checked here with the block written
on the host from build_tree's trees, in the layout the kernel's header gives; the kernel itself is checked
against build_tree on the GPU (tests/gpu/test_ddtree_build_gpu.py)."""
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
