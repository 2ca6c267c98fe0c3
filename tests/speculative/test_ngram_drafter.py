"""The n-gram drafter's proposals on hand-made sequences: the longest suffix that occurred before wins, candidates
ranked by agreeing matches then recency."""
import numpy as np

from flashd.daemon.speculative.ngram import NgramConfig, NgramDrafter


def proposal(seq, depth=4, top_k=2, **cfg):
    d = NgramDrafter(NgramConfig(**cfg))
    d.begin(seq[:-1], seq[-1])
    return d.propose(depth, top_k)


def test_the_longest_suffix_wins_and_an_unseen_one_gives_nothing():
    p = proposal([7, 1, 2, 3, 9, 8, 1, 2, 3, 4, 5, 2, 3], depth=2, top_k=1)
    # "2 3" occurred twice (-> 9, -> 4); the longer "1 2 3" is not a suffix (the suffix is "5 2 3"), so both vote
    assert p.tokens[0, 0] == 4                      # a tie broken by recency: the latest match first
    assert proposal([1, 2, 3, 4]).n_depth == 0


def test_agreeing_matches_outvote_the_latest():
    # (bigrams only) "5 6" was followed by 1 2 twice and by 3 4 once (the latest)
    p = proposal([5, 6, 1, 2, 0, 5, 6, 1, 2, 0, 5, 6, 3, 4, 0, 5, 6], depth=2, top_k=2, max_ngram=2)
    assert p.tokens[:, 0].tolist() == [1, 2]
    assert p.tokens[0, 1] == 3
    assert np.allclose(np.exp(p.logprobs[0, :2]), [2 / 3, 1 / 3])
