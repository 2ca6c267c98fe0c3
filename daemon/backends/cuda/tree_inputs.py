"""The verify forward's inputs as one int32 device block, uploaded in one copy per tree (CudaRunner.forward_tree):
[ids (n_tree) | positions (n_tree) | n_past (1) | mask (n_tree * n_tree bytes, row-major)], its device views and
its host image. tests/emulation/test_tree_inputs_layout.py checks that the image and the views agree."""
from __future__ import annotations

import numpy as np

from .tensor import DeviceTensor

__all__ = ["tree_input_words", "tree_input_views", "pack_tree_inputs"]


def tree_input_words(n_tree: int) -> int:
    """int32 words of the verify inputs for trees of up to n_tree nodes: [ids (n_tree) | positions
    (n_tree) | n_past (1) | mask (n_tree * n_tree bytes, row-major)]."""
    return 2 * n_tree + 1 + -(-n_tree * n_tree // 4)


def tree_input_views(t: DeviceTensor, n_tree: int) -> tuple[DeviceTensor, DeviceTensor, DeviceTensor, DeviceTensor]:
    """(ids, positions, n_past, mask) views of a tree_input_words(n_tree) int32 tensor."""
    mask = DeviceTensor(t.ptr + (2 * n_tree + 1) * 4, (n_tree * n_tree,), np.dtype(np.uint8), t.owner)
    return t[:n_tree], t[n_tree:2 * n_tree], t[2 * n_tree:2 * n_tree + 1], mask


def pack_tree_inputs(ids, positions, mask, n_past: int, n_tree: int) -> np.ndarray:
    """The host image of the verify inputs of an n-node tree (n <= n_tree): mask (n, n) fills the
    first n * n mask bytes, which the (n, n) view of tree_input_views reads."""
    n = len(ids)
    pack = np.zeros(tree_input_words(n_tree), np.int32)
    pack[:n] = ids
    pack[n_tree:n_tree + n] = np.asarray(positions, np.int32)
    pack[2 * n_tree] = n_past
    pack[2 * n_tree + 1:].view(np.uint8)[:n * n] = np.ascontiguousarray(mask, dtype=np.uint8).reshape(-1)
    return pack
