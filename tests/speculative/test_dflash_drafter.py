"""The DFlash drafter through the speculative decoder on the CPU reference backend.

A synthetic target (tests/speculative/conftest.py) and a synthetic DFlash drafter matched to it: the
output of chain and DDTree decoding at budgets 8..64 must equal plain greedy decoding token for
token; every committed position enters the drafter's context exactly once (no recomputation);
and the drafter's cached context K/V equal those computed from scratch from a plain prefill of
the committed sequence (so the verify rows it keeps are the accepted path's).
"""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models.dflash import TargetHead, inject_context
from flashd.daemon.models.dflash_weights import load_dflash_weights, open_dflash
from flashd.daemon.speculative.decoder import SpecConfig, SpecDecoder
from flashd.daemon.speculative.dflash_drafter import DFlashDrafter, load_dflash_drafter
from flashd.daemon.speculative.drafter import DrafterLoadError
from flashd.protocol.messages import SamplingParams
from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash

# the shared spec target's shapes (conftest.py) with 3 layers, so the drafter reads 2 of them
TARGET = dict(arch="qwen2", n_layers=3, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=320, seed=1,
              name="dflash-spec-target")

N_NEW = 40


class CountingOps(ReferenceOps):
    """The reference ops, recording every context K/V write of layer 0: (first slot, rows)."""

    def __init__(self):
        self.writes: list[tuple[int, int]] = []
        self._layer0 = None

    def kv_write(self, k, v, cache_layer, start) -> None:
        if self._layer0 is not None and np.shares_memory(cache_layer[0], self._layer0):
            self.writes.append((int(start[0]), int(k.shape[0])))
        super().kv_write(k, v, cache_layer, start)


@pytest.fixture(scope="module")
def dflash_path(tmp_path_factory):
    spec = spec_for_target(TARGET["hidden"], TARGET["n_layers"], TARGET["vocab_size"], n_features=2, block_size=16,
                           n_layers=2, head_dim=16, ffn=128, seed=5)
    return write_synthetic_dflash(tmp_path_factory.mktemp("dflash") / "drafter.gguf", spec)


def make_drafter(path, runner, ops=None, **kwargs) -> DFlashDrafter:
    ops = ops or runner.ops
    f, cfg = open_dflash(path)
    w = load_dflash_weights(f, cfg, ops.load_weight)
    d = DFlashDrafter(ops, cfg, w, TargetHead(runner.weights.token_embd, runner.weights.output), runner.max_ctx,
                      **kwargs)
    if isinstance(ops, CountingOps):
        ops._layer0 = d.cache.layer(0)[0]
    return d


def prompts():
    rng = np.random.default_rng(201)
    return [rng.integers(0, TARGET["vocab_size"], n).tolist() for n in (1, 6, 45)]


@pytest.mark.parametrize("mode,budget", [("chain", 15), ("ddtree", 8), ("ddtree", 16), ("ddtree", 22),
                                         ("ddtree", 40), ("ddtree", 64)])
def test_dflash_spec_decoding_equals_greedy(make_runner, dflash_path, mode, budget):
    runner = make_runner(TARGET)
    ops = CountingOps()
    drafter = make_drafter(dflash_path, runner, ops)
    drafter.check_target(runner.cfg)
    for prompt in prompts():
        want = [s.token for s in runner.generate(prompt, SamplingParams(), N_NEW)]
        ops.writes.clear()
        forwards0 = drafter.forwards
        dec = SpecDecoder(runner, drafter, SpecConfig(mode, budget))
        got = [s.token for s in dec.generate(prompt, SamplingParams(), N_NEW)]
        assert got == want, f"{mode} budget {budget}, prompt of {len(prompt)}: spec output differs from greedy"
        # one drafter pass per step that drafted (a last step with nothing left to draft runs none)
        assert dec.stats.steps - 1 <= drafter.forwards - forwards0 <= dec.stats.steps
        # each committed position's context K/V written once, in order, never recomputed
        slots = [s for start, n in ops.writes for s in range(start, start + n)]
        assert slots == list(range(len(slots)))
        assert len(prompt) <= len(slots) <= len(prompt) + N_NEW


def test_cached_context_is_the_committed_sequence(make_runner, dflash_path):
    """After a DDTree run the drafter's context K/V equal a from-scratch injection of features from a
    plain prefill of the committed tokens: the verify rows it kept were the accepted path's. The
    45-token prompt is injected in chunks of 7 rows."""
    runner = make_runner(TARGET)
    drafter = make_drafter(dflash_path, runner, inject_chunk=7)
    prompt = prompts()[2]
    dec = SpecDecoder(runner, drafter, SpecConfig("ddtree", 32))
    got = [s.token for s in dec.generate(prompt, SamplingParams(), N_NEW)]
    n = drafter.injected_rows
    assert n >= len(prompt) + dec.stats.steps - 2      # the root of each step but the last was committed
    seq = (prompt + got)[:n]

    feats = {}
    runner.reset()
    runner.prefill(seq, hidden_sink=lambda layer, h: feats.setdefault(layer, []).append(np.array(h)))
    runner.reset()
    cfg, ops = drafter.cfg, ReferenceOps()
    fresh = ops.kv_cache(drafter.cache.spec)
    inject_context(ops, cfg, drafter.weights, fresh, [np.concatenate(feats[l]) for l in cfg.target_layer_ids],
                   np.arange(n, dtype=np.int32), np.array([0], np.int32))
    for i in range(cfg.model.n_layers):
        for got_c, want_c in zip(drafter.cache.layer(i), fresh.layer(i)):
            scale = np.abs(want_c[:n]).max()
            # the target's features from tree verification vs a causal prefill: float32 rounding only
            assert np.abs(got_c[:n] - want_c[:n]).max() <= 1e-4 * scale


def test_proposal_shape_and_logprobs(make_runner, dflash_path):
    runner = make_runner(TARGET)
    drafter = make_drafter(dflash_path, runner)
    prompt = prompts()[1]
    runner.reset()
    runner.prefill(prompt, hidden_sink=dec_sink(drafter))
    drafter.begin(prompt, 7)
    p = drafter.propose(max_depth=64, top_k=8)
    assert p.tokens.shape == (15, 8) and p.logprobs.shape == (15, 8)
    assert (np.diff(p.logprobs, axis=1) <= 0).all()                      # best first
    assert (p.logprobs <= 0).all() and np.isfinite(p.logprobs).all()
    assert len(set(p.tokens[0].tolist())) == 8                          # distinct candidates per depth
    short = drafter.propose(max_depth=3, top_k=2)
    assert short.tokens.shape == (3, 2)
    np.testing.assert_array_equal(short.tokens, p.tokens[:3, :2])        # same context: same drafts
    info = drafter.info()
    cfg = drafter.cfg
    assert info["max_depth"] == 15 and info["target_layer_ids"] == list(cfg.target_layer_ids)
    # float32 K and V per layer for max_ctx + B slots (the block's scratch slots after the context)
    assert info["kv_bytes"] == 2 * cfg.model.n_layers * (runner.max_ctx + 16) * cfg.model.kv_dim * 4
    drafter.end()


def dec_sink(drafter):
    wanted = set(drafter.target_layer_ids)
    return lambda layer, h: drafter.capture_hidden(layer, h) if layer in wanted else None


def test_load_checks_the_target(make_runner, synthetic_model, tmp_path):
    runner = make_runner(TARGET)
    cfg = runner.cfg
    wrong_hidden = write_synthetic_dflash(tmp_path / "h.gguf", spec_for_target(128, cfg.n_layers, cfg.vocab_size))
    with pytest.raises(DrafterLoadError, match="hidden size 128 != the target's 64"):
        load_dflash_drafter(wrong_hidden, runner.ops, cfg, runner.weights, 64)
    deep = write_synthetic_dflash(tmp_path / "l.gguf", spec_for_target(64, 8, cfg.vocab_size, n_features=3))
    with pytest.raises(DrafterLoadError, match="target_layer_ids .* name a layer >= the target's 3 layers"):
        load_dflash_drafter(deep, runner.ops, cfg, runner.weights, 64)
    big_mask = write_synthetic_dflash(tmp_path / "m.gguf", spec_for_target(64, cfg.n_layers, 1000))
    with pytest.raises(DrafterLoadError, match="mask_token_id 999 is outside the target's vocabulary of 320"):
        load_dflash_drafter(big_mask, runner.ops, cfg, runner.weights, 64)
    with pytest.raises(DrafterLoadError, match="not a DFlash drafter"):
        load_dflash_drafter(synthetic_model(**TARGET), runner.ops, cfg, runner.weights, 64)


def test_accept_keeps_exactly_the_committed_rows(make_runner, dflash_path):
    """begin/accept bookkeeping on features given directly: the context after a verify holds the
    prompt rows, then the verify rows named by `rows` (root first), in that order."""
    rng = np.random.default_rng(202)
    runner = make_runner(TARGET)
    drafter = make_drafter(dflash_path, runner)
    cfg = drafter.cfg
    layers = cfg.target_layer_ids
    prompt_f = {l: rng.standard_normal((5, 64)).astype(np.float32) for l in layers}
    for l in sorted(layers):
        drafter.capture_hidden(l, prompt_f[l][:3])          # two prefill chunks
    for l in sorted(layers):
        drafter.capture_hidden(l, prompt_f[l][3:])
    drafter.begin([1, 2, 3, 4, 5], 9)
    drafter.propose(4, 2)
    verify_f = {l: rng.standard_normal((7, 64)).astype(np.float32) for l in layers}
    for l in sorted(layers):
        drafter.capture_hidden(l, verify_f[l])
    drafter.accept([11, 12], 13, [0, 2, 5])
    drafter.propose(4, 2)                                    # injects the 3 committed rows
    assert drafter.injected_rows == 8

    ops = ReferenceOps()
    fresh = ops.kv_cache(drafter.cache.spec)
    feats = [np.concatenate([prompt_f[l], verify_f[l][[0, 2, 5]]]) for l in layers]
    inject_context(ops, cfg, drafter.weights, fresh, feats, np.arange(8, dtype=np.int32), np.array([0], np.int32))
    for i in range(cfg.model.n_layers):
        for got_c, want_c in zip(drafter.cache.layer(i), fresh.layer(i)):
            np.testing.assert_allclose(got_c[:8], want_c[:8], rtol=1e-5, atol=1e-5 * np.abs(want_c[:8]).max())
    with pytest.raises(RuntimeError, match="2 committed rows for root \\+ 2 accepted"):
        drafter.accept([1, 2], 3, [0, 1])
    drafter.end()
