"""Prompts the target writes itself (train/self_prompts.py) and BatchDecoder's sampling (CPU, float32).

The sampler is checked against its definition: at a vanishing temperature it is the greedy decoder, with a seeded
generator it repeats itself, and its first tokens over many copies of one prompt follow softmax(logits / T)
(a fixed seed, so the test is deterministic; the bound is 5 standard errors of each frequency)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flashd.clients.chat_template import ChatTemplate               # noqa: E402
from flashd.clients.tokenizer import Tokenizer                      # noqa: E402
from flashd.train.batch_decode import BatchDecoder                  # noqa: E402
from flashd.train.generate import plan_prompts, render_prompts      # noqa: E402
from flashd.train.recipe import TrainConfig                         # noqa: E402
from flashd.train.self_prompts import (CHAT, RAW, RAW_OPENERS, chat_user_prefix,   # noqa: E402
                                       complete_prompts, opener_kinds)
from flashd.train.target import TorchTarget                         # noqa: E402

TARGET = dict(arch="qwen2", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=320, seed=9)
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def target(synthetic_model):
    return TorchTarget(synthetic_model(**TARGET))


def prompts():
    rng = np.random.default_rng(1)
    return [rng.integers(0, 300, n).astype(np.int32) for n in (4, 9, 6)]


def test_sampling_at_a_vanishing_temperature_is_greedy(target):
    greedy = BatchDecoder(target, prompts(), 10, []).run()
    cold = BatchDecoder(target, prompts(), 10, [], temperature=1e-6, generator=torch.Generator().manual_seed(0)).run()
    assert [a.tolist() for a in cold] == [a.tolist() for a in greedy]


def test_sampling_repeats_with_the_seed_and_differs_from_greedy(target):
    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return [a.tolist() for a in BatchDecoder(target, prompts(), 12, [], temperature=1.0, generator=g).run()]
    assert run(3) == run(3)
    greedy = [a.tolist() for a in BatchDecoder(target, prompts(), 12, []).run()]
    assert run(3) != greedy and run(3) != run(4)
    with pytest.raises(ValueError, match="temperature"):
        BatchDecoder(target, prompts(), 4, [], temperature=-1.0)
    with pytest.raises(ValueError, match="graph"):
        BatchDecoder(target, prompts(), 4, [], graph=True, temperature=1.0)


def test_first_sampled_tokens_follow_the_softmax(target):
    p = np.array([7, 3, 250, 11], np.int32)
    n, temp = 2000, 1.5
    with torch.no_grad():
        _, logits = target.forward(torch.tensor([p.tolist()]), logits=True)
    probs = torch.softmax(logits[0, -1].double() / temp, -1).numpy()
    got = BatchDecoder(target, [p] * n, 1, [], temperature=temp, generator=torch.Generator().manual_seed(11)).run()
    freq = np.bincount([int(a[0]) for a in got], minlength=len(probs)) / n
    se = np.sqrt(probs * (1 - probs) / n)
    assert np.all(np.abs(freq - probs) <= 5 * se + 1e-12), np.max(np.abs(freq - probs) / (se + 1e-12))


def test_chat_user_prefix():
    assert chat_user_prefix(ChatTemplate(TEMPLATE)) == "<|im_start|>user\n"
    assert chat_user_prefix(None) is None
    assert chat_user_prefix(ChatTemplate("{{ 'x' }}")) is None        # the content never appears


def test_complete_prompts_raw_and_chat(target, synthetic_model):
    tok = Tokenizer.from_gguf(synthetic_model(**TARGET))
    template = ChatTemplate(TEMPLATE)
    kinds = [(RAW, "def "), (RAW, "// Rust\n"), (CHAT, ""), (CHAT, "")]
    out = complete_prompts(target, tok, template, kinds, 8, 1.0, 400, [], 0)
    out_first = out
    raw = [o for o in out if not tok.decode(o.tolist()).startswith("<|im_start|>")]
    chat = [o for o in out if tok.decode(o.tolist()).startswith("<|im_start|>")]
    assert len(raw) == 2 and len(out) >= 3               # a chat request may come out empty and be dropped
    starts = {tuple(tok.encode(o, add_special=True)) for o in ("def ", "// Rust\n")}
    for r in raw:                                          # the opener, then exactly 8 sampled tokens
        assert any(tuple(r[:len(s)]) == s and len(r) == len(s) + 8 for s in starts)
    for c in chat:                                         # a whole user turn, then the generation prompt
        text = tok.decode(c.tolist())
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n") and text.startswith("<|im_start|>user\n")
    # no template: chat openers become raw ones (the first opener)
    out = complete_prompts(target, tok, None, [(CHAT, "")], 5, 1.0, 400, [], 0)
    first = tok.encode(RAW_OPENERS[0], add_special=True)
    assert len(out) == 1 and out[0][:len(first)].tolist() == first
    # a prompt over max_prompt is dropped
    assert complete_prompts(target, tok, None, [(RAW, "def ")], 5, 1.0, 3, [], 0) == []
    again = complete_prompts(target, tok, template, kinds, 8, 1.0, 400, [], 0)                 # seeded
    assert [o.tolist() for o in again] == [o.tolist() for o in out_first]


def test_opener_kinds_and_the_prompt_plan(synthetic_model):
    kinds = opener_kinds(10, seed=0)
    assert [k for k, _ in kinds].count(RAW) == 5 and [k for k, _ in kinds].count(CHAT) == 5
    assert all(o in RAW_OPENERS for k, o in kinds if k == RAW) and all(o == "" for k, o in kinds if k == CHAT)
    assert opener_kinds(10, seed=0) == kinds
    tc = TrainConfig(max_prompt=400, max_new=24, max_seq=424, self_prompt_fraction=0.4)
    target = synthetic_model(**TARGET)
    ids, kind, texts = plan_prompts(target, tc, 20)
    # the 12 rendered prompts are drawn from this machine's sources: one that cannot be shortened under max_prompt
    # (a single long line: this tiny vocabulary spends about a token a byte) is dropped, so count what rendered
    n_rendered = len(render_prompts(target, tc, 12))
    assert 8 <= n_rendered <= 12
    assert len(ids) == len(kind) == len(texts) == 8 + n_rendered and int((kind != 0).sum()) == 8
    assert all(len(ids[j]) == 0 for j in range(len(ids)) if kind[j])
    assert all(len(ids[j]) for j in range(len(ids)) if not kind[j])
    own = np.nonzero(kind)[0]
    assert own.max() - own.min() >= 12                     # spread through the list, not bunched
    ids, kind, _ = plan_prompts(target, TrainConfig(self_prompt_fraction=0.0), 6)
    assert not kind.any() and len(ids) == len(render_prompts(target, TrainConfig(self_prompt_fraction=0.0), 6)) >= 4
