"""bench/ngram_offline.py's replay of the speculative decoder's greedy loop with the n-gram drafter, and
bench_spec.py's --ngram fields, on hand-made token sequences (no model)."""
import numpy as np
import pytest

from flashd.bench.bench_spec import ngram_config
from flashd.bench.ngram_offline import replay, speed_vs_plain
from flashd.daemon.speculative.ngram import NgramConfig, NgramDrafter


@pytest.mark.parametrize("mode,budget", [("chain", 7), ("chain", 3), ("ddtree", 7), ("ddtree", 22)])
def test_an_answer_that_repeats_the_prompt_takes_few_forwards(mode, budget):
    prompt = np.array([9, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 0], np.int32)
    answer = prompt[1:].copy()                               # the answer copies the prompt after its first token
    forwards, drafted, drafted_tokens = replay(prompt, answer, NgramDrafter(NgramConfig(min_ngram=1)), mode, budget)
    # forwards: the prefill (answer[0]) and one a step; every step after the first match drafts the copy
    assert drafted >= 1 and drafted_tokens <= len(answer) - 1
    assert forwards == 1 + (len(answer) - 1 - drafted_tokens) + drafted
    assert forwards <= 2 + -(-(len(answer) - 2) // (min(budget, 7) + 1))


def test_no_match_means_one_plain_forward_a_token():
    prompt = np.arange(10, 20, dtype=np.int32)
    answer = np.arange(100, 130, dtype=np.int32)             # nothing repeats
    assert replay(prompt, answer, NgramDrafter(), "chain", 7) == (len(answer), 0, 0)


def test_bench_spec_ngram_fields():
    assert ngram_config("") == NgramConfig()
    assert ngram_config("min_ngram=1, max_ngram=6") == NgramConfig(min_ngram=1, max_ngram=6)
    with pytest.raises(TypeError):
        ngram_config("no_such_field=1")
    with pytest.raises(ValueError):
        ngram_config("min_ngram=x")


def test_the_speed_estimate():
    assert speed_vs_plain(100, 100, 0, 1.0, 5.0) == 1.0                 # no draft: plain decoding
    assert speed_vs_plain(100, 50, 50, 1.0, 1.0) == 2.0                 # drafts as cheap as plain steps: 2 tokens each
    assert abs(speed_vs_plain(100, 60, 20, 1.0, 1.5) - 100 / 70) < 1e-12   # 40 plain + 20 drafted x 1.5
