"""flashd.daemon.pflash.needles: cases fit their size, hold the needle once at the stated depth, and are
reproducible from the seed."""
import pytest

from flashd.clients.chat_template import ChatTemplate
from flashd.clients.tokenizer import Tokenizer

from flashd.daemon.pflash.needles import KINDS, case_seed, fact_positions, make_case, needle_positions


def test_cases_fit_hold_the_needle_and_repeat(pflash_models):
    tok = Tokenizer.from_gguf(pflash_models["target"])
    template = ChatTemplate.from_gguf(pflash_models["target"])
    for n_tokens, seed in ((400, 1), (1500, 2), (3000, 3)):
        case = make_case(tok, template, n_tokens, seed)
        assert case.n_tokens == len(case.ids) <= n_tokens
        assert case.n_tokens > 0.85 * n_tokens                   # sentences of this tokenizer are long
        text = tok.decode(case.ids)
        assert text.count(f"The secret number of the {case.key} project is {case.value}.") == 1
        assert text.rstrip().endswith("assistant")                 # the chat prompt ends with the assistant header
        needle_at = text.index(case.value) / len(text)
        assert abs(needle_at - case.depth) < 0.1
        assert make_case(tok, template, n_tokens, seed) == case
    assert make_case(tok, template, 1500, 7).value != make_case(tok, template, 1500, 8).value


def test_harder_kinds_fit_hold_their_facts_and_repeat(pflash_models):
    """multi: four needles with distinct keys, the asked-for one once; two-hop: the link and the fact once each, in
    opposite halves of the filler, the question naming the project but not the team."""
    import re
    tok = Tokenizer.from_gguf(pflash_models["target"])
    template = ChatTemplate.from_gguf(pflash_models["target"])
    for n_tokens, seed in ((600, 11), (2000, 12)):
        multi = make_case(tok, template, n_tokens, seed, kind="multi")
        assert multi.kind == "multi" and multi.n_tokens == len(multi.ids) <= n_tokens
        text = tok.decode(multi.ids)
        found = re.findall(r"The secret number of the ([a-z]+-[a-z]+) project is (\d{7})\.", text)
        assert len(found) == 4 and len({k for k, _ in found}) == 4
        assert found.count((multi.key, multi.value)) == 1
        assert f"of the {multi.key} project?" in text
        hop = make_case(tok, template, n_tokens, seed, kind="two-hop")
        text = tok.decode(hop.ids)
        link = re.search(rf"The {hop.key} project is run by the ([a-z]+) team\.", text)
        assert link is not None and text.count(f"The {hop.key} project is run by") == 1
        fact = f"The secret number of the {link.group(1)} team is {hop.value}."
        assert text.count(fact) == 1
        assert abs(text.index(fact) - link.start()) / len(text) > 0.25     # far apart
        question = text[text.rindex("What is the secret number"):]
        assert hop.key in question and link.group(1) not in question
        assert make_case(tok, template, n_tokens, seed, kind="two-hop") == hop
    with pytest.raises(ValueError, match="unknown case kind"):
        make_case(tok, template, 600, 1, kind="three-hop")


def test_multi_all_spreads_its_needles_and_asks_for_every_value(pflash_models):
    """multi-all: four needles, one in each quarter of [0.05, 0.95]; the question names every key (in another
    order than the text), and the answer must hold every value."""
    import re
    tok = Tokenizer.from_gguf(pflash_models["target"])
    template = ChatTemplate.from_gguf(pflash_models["target"])
    case = make_case(tok, template, 2500, 21, kind="multi-all")
    assert case.kind == "multi-all" and case.n_tokens == len(case.ids) <= 2500
    text = tok.decode(case.ids)
    body = text[text.index("Read the following text"):text.rindex("What are the secret numbers")]
    found = re.findall(r"The secret number of the ([a-z]+-[a-z]+) project is (\d{7})\.", body)
    assert len(found) == 4 and sorted(v for _, v in found) == sorted(case.values)
    quarters = sorted(int(4 * (body.index(v) / len(body) - 0.05) / 0.9) for _, v in found)
    assert quarters == [0, 1, 2, 3]                                  # one needle per band (text positions ~ depth)
    question = text[text.rindex("What are the secret numbers"):]
    asked = re.findall(r"[a-z]+-[a-z]+", question)
    assert asked == [dict((v, k) for k, v in found)[v] for v in case.values]    # values in the question's order
    assert set(case.facts) == {f"The secret number of the {k} project is {v}." for k, v in found}
    assert make_case(tok, template, 2500, 21, kind="multi-all") == case
    assert make_case(tok, template, 2500, 22, kind="multi-all").values != case.values


def test_answers_pass_only_with_every_asked_value(pflash_models):
    tok = Tokenizer.from_gguf(pflash_models["target"])
    template = ChatTemplate.from_gguf(pflash_models["target"])
    every = make_case(tok, template, 1200, 5, kind="multi-all")
    assert every.passed(", ".join(every.values)) and every.passed(" ".join(reversed(every.values)) + " done")
    assert not every.passed(", ".join(every.values[:3]))
    assert not every.passed(every.values[0][:6])
    single = make_case(tok, template, 1200, 5)
    assert single.values == (single.value,) and single.passed(f"The number is {single.value}.")
    assert not single.passed("I do not know.")
    multi = make_case(tok, template, 1200, 5, kind="multi")
    assert multi.values == (multi.value,)                           # the distractors' values do not count
    hop = make_case(tok, template, 1200, 5, kind="two-hop")
    assert hop.passed(hop.value) and not hop.passed("north")


def test_fact_positions_cover_exactly_what_the_answer_needs(pflash_models):
    """single: the value's tokens (as needle_positions); the others: every token of each needed sentence."""
    tok = Tokenizer.from_gguf(pflash_models["target"])
    template = ChatTemplate.from_gguf(pflash_models["target"])
    single = make_case(tok, template, 1500, 8)
    assert fact_positions(tok, single) == needle_positions(tok, single)
    for kind, n_facts in (("multi", 1), ("multi-all", 4), ("two-hop", 2)):
        case = make_case(tok, template, 1500, 8, kind=kind)
        where = fact_positions(tok, case)
        assert len(case.facts) == n_facts and where == sorted(set(where))
        covered = tok.decode([case.ids[i] for i in where])
        for fact in case.facts:
            assert fact in covered, (kind, fact)
        # nothing but the facts (and the tokens straddling their edges): a run per fact
        runs = 1 + sum(b != a + 1 for a, b in zip(where, where[1:]))
        assert runs == n_facts and len(tok.encode(" ".join(case.facts))) - len(where) >= -2 * n_facts


def test_case_seeds_bench_streams_are_stable_and_calibration_is_disjoint():
    # the bench's single-needle seeds are its first version's formula (results comparable across sessions)
    assert case_seed("bench", 0, 32768, "single", 1) == 32768 * 101 + 1
    assert case_seed("bench", 2, 8192, "two-hop", 3) == 2 * 1_000_003 + 8192 * 101 + 500_000 * 3 + 3
    bench = {case_seed("bench", s, n, k, i) for s in range(3) for n in (8192, 32768, 65536, 131072)
             for k in KINDS for i in range(21)}
    calib = {case_seed("calibrate", s, n, k, i) for s in range(3) for n in (8192, 32768, 65536, 131072)
             for k in KINDS for i in range(21)}
    assert not bench & calib and len(calib) == 3 * 4 * len(KINDS) * 21
    with pytest.raises(ValueError, match="unknown seed stream"):
        case_seed("test", 0, 1, "single", 0)
    with pytest.raises(ValueError, match="unknown case kind"):
        case_seed("bench", 0, 1, "double", 0)


def test_a_size_too_small_for_the_question_is_refused(pflash_models):
    tok = Tokenizer.from_gguf(pflash_models["target"])
    template = ChatTemplate.from_gguf(pflash_models["target"])
    with pytest.raises(ValueError, match="too small for the multi-all case"):
        make_case(tok, template, 100, 1, kind="multi-all")
    with pytest.raises(ValueError, match="n_tokens must be >= 1"):
        make_case(tok, template, 0, 1)


@pytest.mark.parametrize("n", [0, 1, 7, 40, 333])
def test_largest_fit_finds_the_bisections_answer_from_any_guess(n):
    """The gallop-then-bisect search make_case uses returns the largest fitting count whatever the guess."""
    from flashd.daemon.pflash.needles import _largest_fit
    for limit in range(0, n + 1, max(1, n // 13)):
        for guess in {0, n, limit, max(limit - 9, 0), min(limit + 30, n), n // 2}:
            assert _largest_fit(lambda k: k <= limit, n, guess) == limit, (n, limit, guess)
