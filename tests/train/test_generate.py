"""Self-distillation data: the batched, left-padded greedy decoding of generate.py gives each prompt's own greedy
answer (float32, CPU), and the bfloat16 paths the GPU takes (target in bf16, drafter under bf16 autocast) run."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flashd.train.generate import _answer                            # noqa: E402
from flashd.train.loop import Trainer                                # noqa: E402
from flashd.train.recipe import TrainConfig, drafter_config          # noqa: E402
from flashd.train.target import TorchTarget                          # noqa: E402

TARGET = dict(arch="qwen3", n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=320, seed=5)


def greedy(target, prompt, n, stop):
    ids = list(prompt)
    for _ in range(n):
        _, logits = target.forward(torch.tensor([ids]), logits=True)
        ids.append(int(logits[0, -1].argmax()))
        if ids[-1] in stop:
            break
    return ids[len(prompt):]


def test_batched_answers_equal_one_by_one_greedy(synthetic_model):
    t = TorchTarget(synthetic_model(**TARGET))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 300, n).astype(np.int32) for n in (3, 11, 7)]
    stop = [5, 17]
    got = _answer(t, prompts, 12, stop)
    for p, a in zip(prompts, got):
        want = greedy(t, p, 12, stop)
        assert a.tolist() == want[:len(a)] and len(a) >= 3     # a long tail may stop a batch early, never wrongly


def test_bfloat16_paths_run(synthetic_model):
    t = TorchTarget(synthetic_model(**TARGET), dtype=torch.bfloat16)
    rng = np.random.default_rng(1)
    answers = _answer(t, [rng.integers(0, 300, n).astype(np.int32) for n in (4, 9)], 6, [])
    assert [len(a) for a in answers] == [6, 6]
    tc = TrainConfig(block_size=4, n_layers=1, n_features=2, anchors=4, batch_seqs=2, max_prompt=8, max_new=24,
                     max_seq=32)
    samples = [(rng.integers(0, 300, 30).astype(np.int32), 8) for _ in range(6)]
    tr = Trainer(t, drafter_config(t.cfg, tc, 319), tc, samples, log=lambda m: None, autocast=True)
    r = tr.train_step(tr.next_batch())
    assert np.isfinite(r["loss"])


def test_batch_decoder_stops_and_trims(synthetic_model):
    """Every answer ends at its first stop token; a batch whose sequences are all done stops within CHECK_EVERY
    steps; on the CPU the step runs eagerly (no CUDA graph)."""
    from flashd.train.batch_decode import CHECK_EVERY, BatchDecoder

    t = TorchTarget(synthetic_model(**TARGET))
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 300, n).astype(np.int32) for n in (5, 2, 8, 6)]
    free = BatchDecoder(t, prompts, 40, []).run()                  # no stop ids: every answer max_new long
    assert not BatchDecoder(t, prompts, 4, []).graph_on
    assert [len(a) for a in free] == [40] * 4
    stop = sorted({int(a[2]) for a in free})                       # each answer's third token stops it (or earlier)
    dec = BatchDecoder(t, prompts, 40, stop)
    got = dec.run()
    for a, f in zip(got, free):
        hit = int(np.nonzero(np.isin(f, stop))[0][0])
        assert hit <= 2 and a.tolist() == f[:hit + 1].tolist()
    assert int(dec.col) <= 3 + CHECK_EVERY                         # stopped soon after the last one finished
    with pytest.raises(ValueError):
        BatchDecoder(t, prompts, 0, [])
    with pytest.raises(ValueError, match="CUDA graph needs a CUDA target"):
        BatchDecoder(t, prompts, 4, [], graph=True)


@pytest.mark.parametrize("how", ["matmul", "kq", "sdpa"])
def test_every_decode_attention_gives_the_greedy_answers(synthetic_model, how):
    """TorchTarget(decode_attention=...): each kernel choice of the static decode step computes the same function,
    so the batched answers are each prompt's one-by-one greedy continuation (float32, CPU)."""
    t = TorchTarget(synthetic_model(**TARGET), decode_attention=how)
    rng = np.random.default_rng(6)
    prompts = [rng.integers(0, 300, n).astype(np.int32) for n in (4, 13, 1)]
    for p, a in zip(prompts, _answer(t, prompts, 10, [])):
        assert a.tolist() == greedy(t, p, 10, [])
    with pytest.raises(ValueError, match="decode attention"):
        TorchTarget(synthetic_model(**TARGET), decode_attention="flash")
