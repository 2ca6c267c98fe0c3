"""Representative requests of every verb, with non-default values, shared by the codec tests."""

import pytest

from flashd.protocol.ids import IdsFile
from flashd.protocol.messages import (
    Cancel, Compress, Detokenize, Free, Generate, Park, Quit, SamplingParams, Score, Status,
    Tokenize, Unpark,
)

FULL_SAMPLING = SamplingParams(
    temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1, repeat_last_n=128,
    frequency_penalty=-0.5, presence_penalty=1.5, seed=2**64 - 1,
)

SAMPLE_REQUESTS = {
    "generate-full": Generate(
        "gen 1", text='def f():\n\t"quoted" \\ é 🙂 \u2028', max_tokens=64, sampling=FULL_SAMPLING,
        stop=("\n\n", "###"), stop_ids=(2,), ignore_eos=True, logprobs=5, add_special=True,
        spec="ddtree", budget=22, draft="ngram", compress="auto", keep=0.1, stream=False,
    ),
    "generate-ids": Generate("g2", ids=[1, 2, 3], max_tokens=0),
    "generate-one-id": Generate("g3", ids=[7], sampling=SamplingParams(temperature=1e-3, seed=5)),
    "generate-file": Generate("g4", ids=IdsFile("/tmp/my prompt.bin"), spec="chain"),
    "generate-empty-text": Generate("g5", text=""),
    "tokenize": Tokenize("t", text="hello world", add_special=True),
    "tokenize-empty": Tokenize("t2", text=""),
    "detokenize": Detokenize("d", ids=[0, 2**31 - 1]),
    "detokenize-empty": Detokenize("d2", ids=[]),
    "score": Score("s", ids=[1, 2]),
    "compress-ids": Compress("c", ids=[5, 6, 7], keep=0.5, drafter="/m/drafter.gguf"),
    "compress-text": Compress("c2", text="long prompt"),
    "compress-file": Compress("c3", ids=IdsFile("/tmp/p.bin")),
    "park-target": Park("p1"),
    "park-draft": Park("p2", what="draft"),
    "park-all": Park("p3", what="all"),
    "unpark-all": Unpark("u", what="all"),
    "free": Free("f"),
    "status": Status("é-unicode id"),
    "cancel": Cancel("x", target="gen 1"),
    "quit": Quit("q"),
}


@pytest.fixture(params=list(SAMPLE_REQUESTS.values()), ids=list(SAMPLE_REQUESTS))
def sample_request(request):
    return request.param
