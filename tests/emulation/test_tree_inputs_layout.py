"""The CUDA runner's packed verify inputs (one upload per tree forward): the host image written
by pack_tree_inputs is read back through the same byte offsets as the device views of
tree_input_views (checked here on the host, with a numpy buffer standing in for device memory)."""
import numpy as np
import pytest

from flashd.daemon.backends.cuda.tree_inputs import pack_tree_inputs, tree_input_views, tree_input_words
from flashd.daemon.backends.cuda.tensor import DeviceTensor

BASE = 1 << 20        # a fake device address: views are offsets from it


@pytest.fixture
def rng():
    return np.random.default_rng(201)


def read(pack: np.ndarray, view: DeviceTensor, n_items: int) -> np.ndarray:
    start = view.ptr - BASE
    raw = pack.view(np.uint8)[start:start + n_items * view.dtype.itemsize]
    assert start + view.nbytes <= pack.nbytes                  # the view lies inside the allocation
    return raw.view(view.dtype)


@pytest.mark.parametrize("n_tree,n", [(65, 1), (65, 23), (65, 65), (9, 8), (2, 1)])
def test_views_read_what_the_pack_wrote(rng, n_tree, n):
    ids = rng.integers(0, 150_000, n).astype(np.int32)
    positions = (1000 + rng.integers(0, n, n)).astype(np.int32)
    mask = rng.integers(0, 2, (n, n)).astype(np.uint8)
    pack = pack_tree_inputs(ids, positions, mask, 977, n_tree)
    assert pack.dtype == np.int32 and pack.size == tree_input_words(n_tree)
    t = DeviceTensor(BASE, (tree_input_words(n_tree),), np.dtype(np.int32), None)
    v_ids, v_pos, v_n_past, v_mask = tree_input_views(t, n_tree)
    assert (v_ids.shape, v_pos.shape, v_n_past.shape, v_mask.shape) == ((n_tree,), (n_tree,), (1,), (n_tree * n_tree,))
    np.testing.assert_array_equal(read(pack, v_ids, n), ids)
    np.testing.assert_array_equal(read(pack, v_pos, n), positions)
    assert read(pack, v_n_past, 1)[0] == 977
    np.testing.assert_array_equal(read(pack, v_mask, n * n).reshape(n, n), mask)   # the (n, n) view's bytes
    assert v_ids.ptr % 4 == v_pos.ptr % 4 == v_n_past.ptr % 4 == 0


def test_a_smaller_tree_leaves_no_stale_inputs():
    big = pack_tree_inputs(np.arange(40), np.arange(40), np.ones((40, 40)), 5, 65)
    small = pack_tree_inputs(np.arange(3), np.arange(3), np.eye(3), 5, 65)
    assert big.size == small.size and not small[3:65].any() and small.view(np.uint8)[(2 * 65 + 1) * 4 + 9:].sum() == 0
