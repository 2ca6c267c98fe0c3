"""PFlashConfig.bands through the engine (CPU reference backend, tiny synthetic models): generate compress=auto
and compress use the prompt length's band for what the request does not set, and say which setting ran."""
import shutil

import numpy as np
import pytest
from tests.daemon.engine_client import EngineClient

from flashd.daemon.config import EngineConfig
from flashd.daemon.engine import Engine
from flashd.daemon.pflash.config import PFlashBand, PFlashConfig
from flashd.protocol import messages as m

# prompts below 400 tokens: keep everything, score with both layers; from 400: keep 10%, score with layer 0 only
BANDS = (PFlashBand(from_tokens=0, keep=1.0, score_layers=2, score_from=1),
         PFlashBand(from_tokens=400, keep=0.1, score_layers=1, score_from=0))


@pytest.fixture
def client(pflash_models):
    engine = Engine(EngineConfig(model=str(pflash_models["target"]), device="cpu", max_ctx=1024,
                                 prefill_drafter=str(pflash_models["drafter"]),
                                 pflash=PFlashConfig(forward_chunk=256, bands=BANDS, threshold=100)))
    engine.load()
    engine.start()
    yield EngineClient(engine)
    engine.stop(10)


def prompt(n, seed=0):
    return [int(t) for t in np.random.default_rng(seed).integers(0, 500, n)]


def _setting(done):
    c = done["compress"]
    return c["keep"], c["first_layer"], c["layers"]


def test_compress_auto_uses_the_band_of_the_prompts_length(client):
    short, long = prompt(300, 1), prompt(600, 2)
    done = client.ask(m.Generate, ids=short, max_tokens=2, ignore_eos=True, stream=False, compress="auto")
    assert _setting(done) == (1.0, 1, 2) and done["n_prompt"] == 300          # keep 1.0: every chunk
    done = client.ask(m.Generate, ids=long, max_tokens=2, ignore_eos=True, stream=False, compress="auto")
    assert _setting(done) == (0.1, 0, 1)
    assert done["n_prompt"] == len(client.ask(m.Compress, ids=long, keep=0.1, layers=1, first_layer=0)["ids"])
    # the band's boundary: 399 tokens is the first band, 400 the second
    for n, want in ((399, (1.0, 1, 2)), (400, (0.1, 0, 1))):
        done = client.ask(m.Generate, ids=prompt(n, 3), max_tokens=1, ignore_eos=True, stream=False, compress="auto")
        assert _setting(done) == want, n


def test_what_the_request_sets_wins_over_the_band(client):
    long = prompt(600, 4)
    done = client.ask(m.Generate, ids=long, max_tokens=1, ignore_eos=True, stream=False, compress="always", keep=0.3)
    assert _setting(done) == (0.3, 0, 1)                                       # keep given, the band's window
    r = client.ask(m.Compress, ids=long, keep=0.2)                             # compress: its keep, the band's window
    assert (r["keep"], r["first_layer"], r["layers"]) == (0.2, 0, 1)
    r = client.ask(m.Compress, ids=long, keep=0.2, layers=2)                   # a window given: the config's other end
    assert (r["keep"], r["first_layer"], r["layers"]) == (0.2, 0, 2)
    short = prompt(300, 5)
    r = client.ask(m.Compress, ids=short, keep=0.2)
    assert (r["first_layer"], r["layers"]) == (1, 2)
    r = client.ask(m.Compress, ids=short, keep=0.2, layers=1)                  # [config's 0, 1): valid
    assert (r["first_layer"], r["layers"]) == (0, 1)
    done = client.ask(m.Generate, ids=prompt(150, 6), max_tokens=1, ignore_eos=True, stream=False, compress="auto",
                      threshold=200)
    assert "compress" not in done                                              # auto's threshold still decides


def test_a_drafter_the_request_names_gets_the_configs_own_setting(client, pflash_models, tmp_path):
    """The bands were measured on the configured drafter file: another file (a copy here) runs with the config's
    own window (all layers); the configured file named by the request gets its band."""
    copy = tmp_path / "drafter-copy.gguf"
    shutil.copy(pflash_models["drafter"], copy)
    r = client.ask(m.Compress, ids=prompt(600, 7), keep=0.5, drafter=str(copy))
    assert r["event"] == "result" and (r["first_layer"], r["layers"]) == (0, 2)
    r = client.ask(m.Compress, ids=prompt(600, 7), keep=0.5, drafter=str(pflash_models["drafter"]))
    assert (r["first_layer"], r["layers"]) == (0, 1)
