"""spec=auto's plain bursts with the DFlash drafter (drafter.py and dflash_drafter.py, "Gaps"), CPU reference backend.

When the depth policy settles on plain decoding, the decoder runs those steps as bursts on the runner's
decode path, with no feature capture, and tells the drafter `skip(tokens)`. The output must stay plain
greedy decoding's; the drafter's context must keep every injected row at its absolute position (RoPE)
in consecutive slots, the block after a gap must sit at the root's absolute position, and no feature
of a skipped position may enter the context.
"""
from __future__ import annotations

import numpy as np

from flashd.daemon.speculative import dflash_drafter as dflash_module
from flashd.daemon.speculative.decoder import SpecConfig, SpecDecoder
from flashd.daemon.speculative.policy import PolicyConfig
from flashd.protocol.messages import SamplingParams

from tests.speculative.test_dflash_drafter import TARGET, dflash_path, make_drafter  # noqa: F401 (fixture)
from tests.speculative.test_spec_decode import ModeledCostPolicy


class PositionLog:
    """Wraps dflash_drafter's inject_context and block_batch: records (first slot, positions) of each
    injection and the positions / context slots of each drafted block."""

    def __init__(self, monkeypatch):
        self.injected: list[tuple[int, list[int]]] = []
        self.blocks: list[tuple[list[int], int]] = []
        inject, block = dflash_module.inject_context, dflash_module.block_batch

        def rec_inject(ops, cfg, w, cache, feats, positions, start):
            self.injected.append((int(np.asarray(start)[0]), np.asarray(positions).tolist()))
            return inject(ops, cfg, w, cache, feats, positions, start)

        def rec_block(cfg, ids, positions, n_ctx, mask):
            self.blocks.append((np.asarray(positions).tolist(), int(np.asarray(n_ctx)[0])))
            return block(cfg, ids, positions, n_ctx, mask)
        monkeypatch.setattr(dflash_module, "inject_context", rec_inject)
        monkeypatch.setattr(dflash_module, "block_batch", rec_block)


def test_skip_keeps_absolute_positions(make_runner, dflash_path, monkeypatch):
    """begin (5 prompt rows), a verify step, a plain burst of 3, then a draft: the rows before the gap
    wait through the burst (skip injects nothing) and go in at the next draft at positions 5, 6 in slots 5, 6;
    the block sits at position 10 in slot 7."""
    log = PositionLog(monkeypatch)
    rng = np.random.default_rng(201)
    runner = make_runner(TARGET)
    drafter = make_drafter(dflash_path, runner)
    layers = drafter.cfg.target_layer_ids
    hidden = TARGET["hidden"]
    for layer in layers:
        drafter.capture_hidden(layer, rng.standard_normal((5, hidden)).astype(np.float32))
    drafter.begin([1, 2, 3, 4, 5], 9)                    # committed 0..4, root 9 at position 5
    drafter.propose(4, 1)                                # injects the prompt: positions 0..4, slots 0..4
    feats = [rng.standard_normal((3, hidden)).astype(np.float32) for _ in layers]
    drafter.capture_device(feats, 3)
    drafter.accept([11], 12, [0, 2])                     # committed: root (5) and one accepted node (6)
    drafter.skip([13, 14, 15])                           # committed: 12 (7), 13 (8), 14 (9); root 15 at 10
    assert len(log.injected) == 1                        # the rows before the gap wait for the next draft
    drafter.propose(4, 1)
    assert log.injected[-1] == (5, [5, 6])               # ... at their own positions, in the next slots
    assert [s for s, _ in log.injected] == [0, 5] and log.injected[0][1] == [0, 1, 2, 3, 4]
    block_positions, n_ctx = log.blocks[-1]
    assert n_ctx == 7 and block_positions[0] == 10 and block_positions == list(range(10, 10 + drafter.cfg.block_size))
    assert drafter.injected_rows == 7                    # the gap's 3 positions have no row
    drafter.capture_device(feats, 3)
    drafter.accept([], 16, [0])                          # root 15 (position 10) committed with features
    drafter.propose(4, 1)
    assert log.injected[-1] == (7, [10])                 # slot 7 holds position 10
    assert log.blocks[-1] == (list(range(11, 11 + drafter.cfg.block_size)), 8)
    drafter.end()


def test_auto_bursts_skip_capture_and_stay_exact(make_runner, dflash_path, monkeypatch):
    """A policy that settles on plain steps (the synthetic drafter's drafts are poor; step costs are
    modelled, not timed): the plain tokens come from greedy_stream runs, the drafter is told
    through skip(), no verify forward runs for them, and the output is plain greedy decoding's."""
    runner = make_runner(TARGET)
    prompt = np.random.default_rng(202).integers(0, TARGET["vocab_size"], 12).tolist()
    want = [s.token for s in runner.generate(prompt, SamplingParams(), 60)]
    drafter = make_drafter(dflash_path, runner)
    bursts, verifies, skipped = [], [], []
    greedy_stream, forward_tree, skip = runner.greedy_stream, runner.forward_tree, drafter.skip

    def rec_stream(feed, n_new):
        bursts.append(n_new)
        return greedy_stream(feed, n_new)

    def rec_tree(ids, *a, **k):
        verifies.append(len(ids))
        return forward_tree(ids, *a, **k)

    def rec_skip(tokens):
        skipped.append(len(tokens))
        skip(tokens)
    monkeypatch.setattr(runner, "greedy_stream", rec_stream)
    monkeypatch.setattr(runner, "forward_tree", rec_tree)
    monkeypatch.setattr(drafter, "skip", rec_skip)
    policy = ModeledCostPolicy(6, PolicyConfig(explore_every=4))
    dec = SpecDecoder(runner, drafter, SpecConfig("auto", 6), policy)
    got = [s.token for s in dec.generate(prompt, SamplingParams(), 60)]
    assert got == want
    assert skipped == bursts and sum(bursts) > 0         # every burst reached the drafter as one skip
    stats = dec.stats
    assert len(verifies) + sum(bursts) == stats.steps    # a step is a verify forward or a burst's token
    # context rows: the prompt's, then each verify step's committed rows; none for burst tokens
    assert drafter.injected_rows <= len(prompt) + len(verifies) + stats.accepted


def test_a_request_that_never_drafts_injects_nothing(make_runner, dflash_path, monkeypatch):
    """begin, then only plain bursts: the prompt's rows stay pending (no injection forward runs), and a draft
    after two gaps injects the prompt at positions 0..4 and roots the block at the committed count."""
    log = PositionLog(monkeypatch)
    rng = np.random.default_rng(203)
    runner = make_runner(TARGET)
    drafter = make_drafter(dflash_path, runner)
    for layer in drafter.cfg.target_layer_ids:
        drafter.capture_hidden(layer, rng.standard_normal((5, TARGET["hidden"])).astype(np.float32))
    drafter.begin([1, 2, 3, 4, 5], 9)
    drafter.skip([10, 11])
    drafter.skip([12, 13, 14])
    assert log.injected == [] and drafter.injected_rows == 0
    drafter.propose(4, 1)
    assert log.injected == [(0, [0, 1, 2, 3, 4])]
    assert log.blocks[-1] == (list(range(10, 10 + drafter.cfg.block_size)), 5)
    drafter.end()
