"""train/batch_decode.py on the GPU: the decode step replayed as a CUDA graph gives exactly the answers of the same
step run eagerly (the same kernels on the same inputs), in float32 and in the bfloat16 the training uses, and those
answers are each prompt's one-by-one greedy continuation (float32), for every decode attention (train/target.py
DECODE_ATTENTION). Needs PyTorch with CUDA on the GPU host."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("PyTorch without CUDA", allow_module_level=True)

from flashd.train.batch_decode import BatchDecoder                   # noqa: E402
from flashd.train.target import TorchTarget                          # noqa: E402
from tests.train.test_generate import TARGET                         # noqa: E402


def greedy(target, prompt, n, stop):
    """One prompt, one token at a time, each by a whole causal forward (the oracle)."""
    ids = list(prompt)
    for _ in range(n):
        _, logits = target.forward(torch.tensor([ids], device=target.device), logits=True)
        ids.append(int(logits[0, -1].argmax()))
        if ids[-1] in stop:
            break
    return ids[len(prompt):]


@pytest.mark.parametrize("how", ["matmul", "kq", "sdpa"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_replays_equal_eager_steps(synthetic_model, dtype, how):
    t = TorchTarget(synthetic_model(**TARGET), device="cuda", dtype=getattr(torch, dtype), decode_attention=how)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 300, n).astype(np.int32) for n in (3, 17, 9, 12, 1)]
    stop = [5, 17]
    graphed = BatchDecoder(t, prompts, 48, stop, graph=True)
    assert graphed.graph_on
    got = graphed.run()
    want = BatchDecoder(t, prompts, 48, stop, graph=False).run()
    assert [a.tolist() for a in got] == [a.tolist() for a in want]
    if dtype == "float32":
        for p, a in zip(prompts, got):
            assert a.tolist() == greedy(t, p, 48, stop)[:len(a)]
