"""What the CUDA backend still refuses for a hybrid (qwen35) target, without a GPU: a speculative request on a
runner that cannot verify draft trees (CudaHybridRunner.tree_unsupported) is answered with a bad_request error
naming why, before any drafter or forward is touched (drafter_set.spec_decoder); the runner's tree entry points
and the device state's node buffers raise the same message. The GPU side: tests/gpu/test_cuda_qwen35.py."""
from types import SimpleNamespace

import pytest

from flashd.daemon.backends.cuda.hybrid_runner import CudaHybridRunner
from flashd.daemon.backends.cuda.recurrent_state import TREE_UNSUPPORTED, TreeVerifyUnsupported
from flashd.daemon.drafter_set import DrafterSet
from flashd.protocol.errors import ProtocolError


def test_a_speculative_request_on_a_cuda_hybrid_is_a_bad_request():
    drafters = DrafterSet(backend=None)
    runner = SimpleNamespace(tree_unsupported=CudaHybridRunner.tree_unsupported)
    for spec in ("chain", "auto", "ddtree"):
        req = SimpleNamespace(spec=spec, budget=None)
        with pytest.raises(ProtocolError) as e:
            drafters.spec_decoder(req, runner, drafter=None)
        assert e.value.code == "bad_request" and "not supported on the CUDA backend" in str(e.value)


def test_the_hybrid_runner_refuses_trees_without_touching_the_device():
    runner = CudaHybridRunner.__new__(CudaHybridRunner)     # no device: the refusals come first
    assert runner.max_tree_nodes == 1
    with pytest.raises(TreeVerifyUnsupported, match="without spec, or the model with --device cpu"):
        runner.forward_tree([1, 2], [0, 1], [[True, False], [True, True]])
    with pytest.raises(TreeVerifyUnsupported):
        runner.commit_tree([0])
    assert issubclass(TreeVerifyUnsupported, NotImplementedError) and "draft tree" in TREE_UNSUPPORTED
