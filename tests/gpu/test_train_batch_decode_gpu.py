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


def test_sampling_replays_a_graph_with_the_default_generator(synthetic_model):
    """Sampling (self_prompts.py) on the GPU with generator None replays a CUDA graph drawing from the device's default
    generator: a vanishing temperature gives the greedy answers, a reseeded generator the same samples, and the first
    sampled token over many copies of one prompt follows softmax(logits / T) within 5 standard errors."""
    t = TorchTarget(synthetic_model(**TARGET), device="cuda", dtype=torch.float32)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 300, n).astype(np.int32) for n in (3, 17, 9)]
    greedy_answers = BatchDecoder(t, prompts, 24, [], graph=True).run()
    cold = BatchDecoder(t, prompts, 24, [], temperature=1e-6)
    assert cold.graph_on
    assert [a.tolist() for a in cold.run()] == [a.tolist() for a in greedy_answers]

    def sample(seed):
        torch.cuda.manual_seed(seed)
        return [a.tolist() for a in BatchDecoder(t, prompts, 24, [], temperature=1.0).run()]
    assert sample(3) == sample(3) and sample(3) != sample(4)
    p = np.array([7, 3, 250, 11], np.int32)
    n, temp = 4000, 1.5
    with torch.no_grad():
        _, logits = t.forward(torch.tensor([p.tolist()], device="cuda"), logits=True)
    probs = torch.softmax(logits[0, -1].double() / temp, -1).cpu().numpy()
    torch.cuda.manual_seed(11)
    got = BatchDecoder(t, [p] * n, 2, [], temperature=temp).run()
    freq = np.bincount([int(a[0]) for a in got], minlength=len(probs)) / n
    se = np.sqrt(probs * (1 - probs) / n)
    assert np.all(np.abs(freq - probs) <= 5 * se + 1e-12)
