"""What the recurrent-layer GPU tests share (test_causal_conv1d.py, test_gated_delta_rule.py): a CudaOps whose
arena starts as NaN bytes, draft-tree shapes, and a node's root-to-node path."""
import numpy as np

POISON_BYTE = 0xFF   # as tests/gpu/conftest.py's: float32 0xFFFFFFFF is a NaN (not imported: a conftest is pytest's)

# parents of draft trees: a chain, a root with many children, a DDTree-like shape, two roots (both from the
# committed context), and the largest tree a hybrid verifies (65 nodes, MAX_TREE_NODES), random parents
TREES = [[-1, 0, 1, 2], [-1, 0, 0, 0, 0], [-1, 0, 0, 1, 1, 3, 2, 6, 4], [-1, -1, 0, 1, 2, 0],
         [-1] + [int(p) for p in np.random.default_rng(65).integers(0, np.arange(1, 65))]]


def poisoned_ops(dev, half_bytes: int = 64 << 20):
    """A CudaOps on the dev fixture's Device whose arena is filled with NaN bytes (POISON_BYTE) on its stream:
    an output element a kernel forgot to write stays NaN."""
    from flashd.daemon.backends.cuda.ops import CudaOps
    from flashd.daemon.backends.cuda.tensor import DeviceTensor
    ops = CudaOps(dev)
    ops.reserve_arena(half_bytes)
    dev.fill_bytes(DeviceTensor(ops.arena.alloc.ptr, (2 * ops.arena.half_bytes,), np.dtype(np.uint8)), POISON_BYTE)
    ops.begin_forward()
    return ops


def path_to(parents, i: int) -> list[int]:
    """Node i's root-to-node path (its ancestors, then i)."""
    path = []
    while i >= 0:
        path.append(i)
        i = int(parents[i])
    return path[::-1]
