"""What the CUDA backend still refuses for a hybrid (qwen35) target, without a GPU: draft tree verification -- the
runner's tree entry points (and the device state's node buffers) raise TreeVerifyUnsupported with a message that
says what to do instead. A speculative request never gets there: it is decoded plainly
(tests/daemon/test_spec_plain_without_trees.py). The GPU side: tests/gpu/test_cuda_qwen35.py."""
import pytest

from flashd.daemon.backends.cuda.hybrid_runner import CudaHybridRunner
from flashd.daemon.backends.cuda.recurrent_state import TREE_UNSUPPORTED, TreeVerifyUnsupported


def test_the_hybrid_runner_refuses_trees_without_touching_the_device():
    runner = CudaHybridRunner.__new__(CudaHybridRunner)     # no device: the refusals come first
    assert runner.max_tree_nodes == 1
    with pytest.raises(TreeVerifyUnsupported, match="without spec, or the model with --device cpu"):
        runner.forward_tree([1, 2], [0, 1], [[True, False], [True, True]])
    with pytest.raises(TreeVerifyUnsupported):
        runner.commit_tree([0])
    assert issubclass(TreeVerifyUnsupported, NotImplementedError) and "draft tree" in TREE_UNSUPPORTED
