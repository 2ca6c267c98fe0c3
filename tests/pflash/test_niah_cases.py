"""flashd.daemon.pflash.needles: cases fit their size, hold the needle once at the stated depth, and are
reproducible from the seed."""
import pytest

from flashd.clients.chat_template import ChatTemplate
from flashd.clients.tokenizer import Tokenizer

from flashd.daemon.pflash.needles import make_case


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
