"""A model whose logits are NaN on the CUDA backend: fd_argmax answers -1 for such rows (documented), and every
path that picks a token on the device -- plain decoding's graph, greedy_continue's and greedy_stream's replays, the verify forward's
argmax_rows -- raises NonFiniteLogits (protocol error `model_output`) instead of handing -1 on as a token."""
import numpy as np
import pytest

from flashd.daemon.sampling import NonFiniteLogits
from flashd.protocol.messages import SamplingParams
from tests.daemon.test_nan_model import nan_model
from tests.gpu.test_forward import cuda_runner

MODEL = dict(arch="qwen2", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab_size=500, seed=3,
             weight_type="Q8_0", name="nan-logits")


@pytest.fixture(scope="module")
def backend(native):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    return CudaBackend()


def test_device_token_choice_refuses_nan_logits(backend, synthetic_model, tmp_path):
    run = cuda_runner(backend, nan_model(synthetic_model(**MODEL), tmp_path), "graph", max_ctx=256, chunk=64)
    with pytest.raises(NonFiniteLogits):
        list(run.generate([1, 2, 3, 4], SamplingParams(), 6))
    run.reset()
    run.prefill([1, 2, 3, 4])
    with pytest.raises(NonFiniteLogits):
        run.greedy_continue([5], 4)
    run.reset()
    run.prefill([1, 2, 3, 4])
    with pytest.raises(NonFiniteLogits):
        list(run.greedy_stream([5], 4))
    run.reset()
    run.prefill([1, 2, 3, 4])
    mask = np.tril(np.ones((3, 3), np.uint8))
    with pytest.raises(NonFiniteLogits):
        run.argmax_rows(run.forward_tree([5, 6, 7], run.n_past + np.arange(3), mask))
