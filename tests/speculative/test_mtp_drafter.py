"""The qwen35 target's own MTP block as a drafter (speculative/mtp_drafter.py) on the reference backend.

- spec == plain greedy, token for token, with the mtp drafter in chain, ddtree and auto modes on a synthetic
  qwen35 + MTP target (the block's random weights seldom guess the target's tokens, so this checks that drafting
  and the replay change no token);
- an oracle subclass continues each chain with the true tokens (the block still runs every forward), so whole
  chains are accepted and the accept / replay bookkeeping runs on long accepted paths;
- after a request the block's K/V cache holds exactly the entries a from-scratch replay of the committed
  sequence gives (pairs (x_p, h_{p-1}) with the target's own rows), within float32 rounding: the target's verify
  rows are the recurrent form's, a prefill's the chunked form's (reference backend);
- the drafts are the block's: depth 1 of every step equals a direct mtp_forward over the committed sequence;
- a target without nextn layers asked for `--draft mtp` answers a DrafterLoadError naming the cause.
"""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.base import Batch
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model, open_model
from flashd.daemon.models.gguf_file import GGUFFile
from flashd.daemon.models.qwen35_mtp import mtp_cache_spec, mtp_forward, target_hidden
from flashd.daemon.runner import ModelRunner
from flashd.daemon.speculative.drafter import DrafterLoadError
from flashd.daemon.speculative.loader import DrafterContext, load_drafter
from flashd.daemon.speculative.mtp_drafter import MTPDrafter, load_mtp_drafter

from tests.speculative.spec_drafters import plain, spec
from tests.speculative.spec_models import HYBRID_TARGET

MTP_TARGET = dict(HYBRID_TARGET, mtp=True, name="spec-hybrid-mtp")
N_GEN = 24
PROMPTS = [[5, 9, 77, 12, 5, 9, 77, 12, 100, 200], [42], list(range(260, 300))]
MAX_CTX = 128


class Target:
    def __init__(self, path, prefill_chunk=16):
        self.ops = ReferenceOps()
        self.file, cfg = open_model(path)
        self.model = load_model((self.file, cfg), self.ops.load_weight)
        self.cfg = cfg
        self.runner = ModelRunner(self.ops, cfg, self.model.weights, MAX_CTX, prefill_chunk)

    def drafter(self, cls=MTPDrafter, **kwargs):
        d = load_mtp_drafter(self.ops, self.file, self.model, MAX_CTX, 16, **kwargs)
        if cls is not MTPDrafter:
            d.__class__ = cls
        return d

    def rows(self, tokens):
        """The target's raw last-layer rows over `tokens` (a fresh prefill)."""
        rows, last = [], self.cfg.n_layers - 1
        self.runner.reset()
        self.runner.prefill(tokens, hidden_sink=lambda i, h: rows.append(np.array(h)) if i == last else None)
        return np.concatenate(rows)


class OracleMTP(MTPDrafter):
    """Continues every chain with the true tokens (self.truth: the whole greedy sequence, prompt included)."""

    truth: list[int] = []

    def _chain_token(self, logits, depth):
        return self.truth[self._n + 1 + depth]


class Snapshot(MTPDrafter):
    """Keeps what the cache holds when the request ends (end() resets the counters)."""

    def end(self):
        if getattr(self, "_root", None) is not None:
            self.snap = (self._n_mtp, self.cache.save_prefix(self._n_mtp).copy())
        super().end()


@pytest.fixture(scope="module")
def target(synthetic_model):
    return Target(synthetic_model(**MTP_TARGET))


@pytest.mark.parametrize("mode,budget", [("chain", 3), ("chain", 4), ("ddtree", 8), ("auto", 4)])
def test_spec_equals_plain_greedy(target, mode, budget):
    drafter = target.drafter()
    for prompt in PROMPTS:
        want = [s.token for s in plain(target.runner, prompt, N_GEN)]
        got, stats = spec(target.runner, drafter, mode, budget, prompt, N_GEN)
        assert [s.token for s in got] == want, (mode, prompt, stats)
        assert stats.accepted + stats.steps + 1 == len(want)
    assert drafter.forwards > 0


def test_whole_chains_accepted_and_the_cache_is_a_replay(target):
    """Oracle chains: every step accepts its whole chain; then the block's cache equals a from-scratch replay."""
    drafter = target.drafter(OracleMTP)
    for prompt in PROMPTS:
        want = [s.token for s in plain(target.runner, prompt, N_GEN)]
        drafter.truth = list(prompt) + want
        drafter.__class__ = type("OracleSnapshot", (OracleMTP, Snapshot), {})
        got, stats = spec(target.runner, drafter, "chain", 4, prompt, N_GEN)
        assert [s.token for s in got] == want
        assert stats.histogram[4] >= 3, stats.histogram
        n_mtp, kv = drafter.snap
        seq = list(prompt) + want
        assert n_mtp >= len(prompt) + N_GEN - 5          # the last step's root + its chain at most
        check_cache_is_replay(target, seq[:n_mtp], kv)


def check_cache_is_replay(target: Target, tokens, kv):
    ops, cfg = target.ops, target.cfg
    raw = target.rows(tokens)
    h = np.asarray(target_hidden(ops, cfg, target.model.weights, raw))
    prev = np.concatenate([np.zeros((1, cfg.hidden), np.float32), h[:-1]])
    d = target.drafter()
    cache = ops.kv_cache(mtp_cache_spec(cfg, MAX_CTX))
    ops.begin_forward()
    n = len(tokens)
    mtp_forward(ops, cfg, d.weights, cache, Batch(np.array(tokens, np.int32), np.arange(n, dtype=np.int32),
                                                  np.zeros(1, np.int32)), prev)
    want = cache.save_prefix(n)
    assert kv.shape == want.shape
    np.testing.assert_allclose(kv, want, rtol=0, atol=2e-4)
    # a cache built from the block's own rows (or one entry late) would be far off: the check has teeth
    assert np.abs(want[:, :, 1:] - want[:, :, :-1]).max() > 100 * 2e-4


def test_depth_one_drafts_are_the_blocks(target):
    """Each step's first candidate is argmax of mtp_forward over the committed sequence + root."""
    class Record(MTPDrafter):
        seen: list = []

        def _chain_token(self, logits, depth):
            if depth == 0:
                self.seen.append((self._n, self._root, int(np.argmax(logits)), logits.copy()))
            return int(np.argmax(logits))

    prompt = PROMPTS[0]
    d = target.drafter(Record)
    Record.seen = []
    got, _ = spec(target.runner, d, "chain", 2, prompt, 12)
    seq = list(prompt) + [s.token for s in got]
    ops, cfg = target.ops, target.cfg
    for n, root, tok, logits in Record.seen[:4]:
        assert seq[n] == root
        tokens = seq[:n + 1]
        h = np.asarray(target_hidden(ops, cfg, target.model.weights, target.rows(seq[:n])))
        prev = np.concatenate([np.zeros((1, cfg.hidden), np.float32), h])
        cache = ops.kv_cache(mtp_cache_spec(cfg, MAX_CTX))
        ops.begin_forward()
        want, _ = mtp_forward(ops, cfg, d.weights, cache, Batch(np.array(tokens, np.int32),
                                                                 np.arange(n + 1, dtype=np.int32),
                                                                 np.zeros(1, np.int32)), prev)
        np.testing.assert_allclose(logits, np.asarray(want)[0], rtol=0, atol=1e-4)


def test_a_target_without_mtp_layers_is_refused(synthetic_model):
    path = synthetic_model(**HYBRID_TARGET)
    ops = ReferenceOps()
    f, cfg = open_model(path)
    model = load_model((f, cfg), ops.load_weight)

    class Backend:
        pass
    Backend.ops = ops
    ctx = DrafterContext(backend=Backend, target_file=GGUFFile(path), target_model=model, max_ctx=64, prefill_chunk=16)
    with pytest.raises(DrafterLoadError, match="no multi-token-prediction"):
        load_drafter("mtp", ctx)


def test_tree_candidates_are_each_chain_steps_top_k(target):
    """propose(depth, K): row d is the top-K of chain step d's log-softmax, best first, its first entry the chain
    token that step d + 1 was run with (so depth d is conditioned on the top-1 chain, as DDTree expects)."""
    class Rows(MTPDrafter):
        def _chain_token(self, logits, depth):
            self.rows = getattr(self, "rows", []) + [logits.copy()]
            return int(np.argmax(logits))

    prompt = PROMPTS[0]
    d = target.drafter(Rows)
    logits = target.runner.start(prompt, hidden_sink=lambda i, h: d.capture_hidden(i, h))[0]
    d.begin(prompt, int(np.argmax(logits)))
    p = d.propose(3, 4)
    assert p.tokens.shape == (3, 4) and np.all(np.diff(p.logprobs, axis=1) <= 0)
    for row, toks, lps in zip(d.rows, p.tokens, p.logprobs):
        lp = row.astype(np.float64) - row.max() - np.log(np.exp(row.astype(np.float64) - row.max()).sum())
        assert toks[0] == int(np.argmax(row))
        np.testing.assert_allclose(lps, lp[toks], rtol=0, atol=1e-9)
        assert set(toks.tolist()) == set(np.argsort(-lp, kind="stable")[:4].tolist())
    d.end()


def test_sampling_with_the_mtp_drafter_is_reproducible(target):
    from flashd.protocol.messages import SamplingParams
    params = SamplingParams(temperature=0.8, seed=11)
    d = target.drafter()
    runs = [[s.token for s in spec(target.runner, d, "ddtree", 6, PROMPTS[0], 16, params)[0]] for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 16
