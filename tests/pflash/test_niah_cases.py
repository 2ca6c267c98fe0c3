"""flashd.daemon.pflash.needles: cases fit their size, hold the needle once at the stated depth, and are
reproducible from the seed."""
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
