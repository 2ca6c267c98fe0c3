"""The n-gram drafter's proposals on hand-made sequences: the longest suffix that occurred before wins, candidates
ranked by agreeing matches then recency, and (vote="consistent") a chain that is one earlier continuation."""
import numpy as np
import pytest

from flashd.daemon.speculative.ngram import NgramConfig, NgramDrafter


def proposal(seq, vote, depth=4, top_k=2, **cfg):
    d = NgramDrafter(NgramConfig(vote=vote, **cfg))
    d.begin(seq[:-1], seq[-1])
    return d.propose(depth, top_k)


def test_the_longest_suffix_wins_and_an_unseen_one_gives_nothing():
    p = proposal([7, 1, 2, 3, 9, 8, 1, 2, 3, 4, 5, 2, 3], "latest", depth=2, top_k=1)
    # "2 3" occurred twice (-> 9, -> 4); the longer "1 2 3" is not a suffix (the suffix is "5 2 3"), so both vote
    assert p.tokens[0, 0] == 4                      # a tie broken by recency: the latest match first
    assert proposal([1, 2, 3, 4], "latest").n_depth == 0


@pytest.mark.parametrize("vote", ["latest", "consistent"])
def test_agreeing_matches_outvote_the_latest(vote):
    # (bigrams only) "5 6" was followed by 1 2 twice and by 3 4 once (the latest)
    p = proposal([5, 6, 1, 2, 0, 5, 6, 1, 2, 0, 5, 6, 3, 4, 0, 5, 6], vote, depth=2, top_k=2, max_ngram=2)
    assert p.tokens[:, 0].tolist() == [1, 2]
    assert p.tokens[0, 1] == 3
    assert np.allclose(np.exp(p.logprobs[0, :2]), [2 / 3, 1 / 3])


def test_a_consistent_chain_is_one_earlier_continuation():
    # (bigrams only) after "8 9": 1 2 6 (oldest), 1 5 7, 3 2 7 (latest). Every match votes: depth 0 -> 1 (2 of 3), depth 1 -> 2 (the
    # first and the latest), depth 2 -> 7: the chain 1 2 7 occurred nowhere. Consistent: depth 1 hears only the two
    # matches that went on with 1 (2 and 5 tie: the latest, 5), depth 2 only 1 5's match: 1 5 7, which did occur.
    seq = [8, 9, 1, 2, 6, 0, 8, 9, 1, 5, 7, 0, 8, 9, 3, 2, 7, 0, 8, 9]
    assert proposal(seq, "latest", depth=3, top_k=1, max_ngram=2).tokens[:, 0].tolist() == [1, 2, 7]
    assert proposal(seq, "consistent", depth=3, top_k=1, max_ngram=2).tokens[:, 0].tolist() == [1, 5, 7]


def test_a_bad_vote_is_refused():
    with pytest.raises(ValueError, match="vote"):
        NgramConfig(vote="majority")
