"""Device-resident target features (drafter.py, "Device-resident features") on the CPU reference backend.

The runner side: `forward_tree(..., capture=layers)` writes exactly the rows a hidden sink sees into
`tree_features(layers)`, in the order the layers are named, with the logits unchanged. The drafter
side: a DFlash drafter fed through capture_device + gather_rows drafts bit for bit what the host path
(capture_hidden, device_features off) drafts, and the decoder routes a verify's features to one path
only. The pending rows' overflow (accepts without a propose between them) injects first and keeps the
context equal to the committed sequence's features. tests/gpu/test_tree_capture_gpu.py checks the same
on the CUDA backend (graph replay against the eager forward, bitwise).
"""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models.dflash import inject_context
from flashd.daemon.speculative.decoder import SpecConfig, SpecDecoder
from flashd.daemon.speculative.drafter import Proposal
from flashd.daemon.speculative.tree import build_tree
from flashd.protocol.messages import SamplingParams

from tests.speculative.test_dflash_drafter import TARGET, dflash_path, make_drafter, prompts  # noqa: F401 (fixture)


def verify_tree(runner, rng):
    """A DDTree of 12 nodes from random per-depth candidates, as the decoder verifies one."""
    vocab = TARGET["vocab_size"]
    tokens = rng.integers(0, vocab, (6, 3)).astype(np.int32)
    logprobs = np.sort(np.log(rng.uniform(0.05, 1.0, (6, 3))), axis=1)[:, ::-1]
    return build_tree(int(rng.integers(vocab)), Proposal(tokens, logprobs), 11)


def test_capture_writes_the_rows_the_sink_sees(make_runner):
    rng = np.random.default_rng(201)
    runner = make_runner(TARGET)
    runner.reset()
    runner.prefill(rng.integers(0, TARGET["vocab_size"], 9).tolist())
    tree = verify_tree(runner, rng)
    args = (tree.tokens, tree.positions(runner.n_past), tree.ancestor_mask())
    seen: dict[int, np.ndarray] = {}
    want = np.array(runner.forward_tree(*args, hidden_sink=lambda i, h: seen.__setitem__(i, np.array(h))))
    layers = (2, 0)                                     # named out of order: buffers follow the naming
    got = np.array(runner.forward_tree(*args, capture=layers))
    np.testing.assert_array_equal(got, want)
    bufs = runner.tree_features(layers)
    assert len(bufs) == 2 and all(b.shape == (runner.max_tree_nodes, TARGET["hidden"]) for b in bufs)
    for j, layer in enumerate(layers):
        np.testing.assert_array_equal(bufs[j][:tree.n_nodes], seen[layer])
    assert runner.tree_features(list(layers))[0] is bufs[0]           # kept: the same buffers every time
    both: dict[int, np.ndarray] = {}                    # a sink and a capture together: both get the rows
    runner.forward_tree(*args, hidden_sink=lambda i, h: both.__setitem__(i, np.array(h)), capture=(1,))
    np.testing.assert_array_equal(both[1], seen[1])
    np.testing.assert_array_equal(runner.tree_features((1,))[0][:tree.n_nodes], seen[1])
    with pytest.raises(ValueError, match="capture layers"):
        runner.forward_tree(*args, capture=(3,))
    assert runner.n_past == 9                           # verify forwards commit nothing


class Recorder:
    """Wraps a drafter's calls: proposals made, capture_hidden / capture_device calls seen."""

    def __init__(self, drafter):
        self.proposals, self.hidden, self.device = [], 0, 0
        propose, hidden, device = drafter.propose, drafter.capture_hidden, drafter.capture_device

        def rec_propose(*a):
            p = propose(*a)
            self.proposals.append(p)
            return p

        def rec_hidden(*a):
            self.hidden += 1
            hidden(*a)

        def rec_device(*a):
            self.device += 1
            device(*a)
        drafter.propose, drafter.capture_hidden, drafter.capture_device = rec_propose, rec_hidden, rec_device


@pytest.mark.parametrize("mode,budget", [("chain", 15), ("ddtree", 22)])
def test_device_path_drafts_bit_for_bit_as_the_host_path(make_runner, dflash_path, mode, budget):
    runner = make_runner(TARGET)
    prompt = prompts()[2]                               # 45 tokens: one prefill chunk of the runner's 64
    runs = {}
    for device in (False, True):
        drafter = make_drafter(dflash_path, runner)
        drafter.device_features = device
        rec = Recorder(drafter)
        dec = SpecDecoder(runner, drafter, SpecConfig(mode, budget))
        tokens = [s.token for s in dec.generate(prompt, SamplingParams(), 40)]
        cache = [np.array(c[:drafter.injected_rows]) for i in range(drafter.cfg.model.n_layers)
                 for c in drafter.cache.layer(i)]
        runs[device] = tokens, dec.stats, rec, cache
    (t0, s0, r0, c0), (t1, s1, r1, c1) = runs[False], runs[True]
    assert t1 == t0 and s1.histogram == s0.histogram and s1.steps == s0.steps
    assert len(r1.proposals) == len(r0.proposals)
    for a, b in zip(r0.proposals, r1.proposals):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.logprobs, b.logprobs)
    for a, b in zip(c0, c1):
        np.testing.assert_array_equal(a, b)
    n_layers = len(drafter.target_layer_ids)
    # host path: the prompt's prefill plus every verify through capture_hidden; device path: the
    # prompt's only, then one capture_device per verify
    assert r0.device == 0 and r0.hidden == n_layers * (1 + s0.steps)
    assert r1.hidden == n_layers and r1.device == s1.steps


def committed_features(rng, n, hidden=64):
    return [rng.standard_normal((n, hidden)).astype(np.float32) for _ in range(2)]


def test_pending_rows_overflow_injects_first_and_keeps_the_context(make_runner, dflash_path):
    """Accepts without a propose between them (a policy's plain steps, or depth-0 steps): the device
    pending buffers (pending_cap rows) are injected when the next rows would not fit; after the
    last propose the context holds the prompt rows then every step's committed rows, in order."""
    rng = np.random.default_rng(202)
    runner = make_runner(TARGET)
    drafter = make_drafter(dflash_path, runner, inject_chunk=4)
    assert drafter.pending_cap == 16                    # at least a block (16): a step's committed rows fit
    layers = drafter.cfg.target_layer_ids
    prompt_f = committed_features(rng, 5)
    for j, layer in enumerate(layers):
        drafter.capture_hidden(layer, prompt_f[j])
    drafter.begin([1, 2, 3, 4, 5], 9)
    want = [[f] for f in prompt_f]
    injected = []
    for step in range(14):
        n = int(rng.integers(2, 9))                     # a verify forward of n rows
        feats = committed_features(rng, n)
        # the root (row 0, always committed), then 1 .. n - 1 accepted nodes: >= 28 rows in all, so
        # the 16 pending rows overflow at least once
        rows = np.concatenate([[0], np.sort(rng.choice(np.arange(1, n), int(rng.integers(1, n)), replace=False))])
        drafter.capture_device([np.pad(f, ((0, 3), (0, 0))) for f in feats], n)   # buffers longer than n rows
        drafter.accept(list(range(len(rows) - 1)), 7, rows.tolist())
        for j in range(2):
            want[j].append(feats[j][rows])
        injected.append(drafter.injected_rows)
    assert injected[-1] > 0 and drafter.forwards == 0  # an overflow injected before any propose
    drafter.propose(4, 2)
    total = sum(len(w) for w in want[0])
    assert drafter.injected_rows == total

    ops = ReferenceOps()
    fresh = ops.kv_cache(drafter.cache.spec)
    inject_context(ops, drafter.cfg, drafter.weights, fresh, [np.concatenate(w) for w in want],
                   np.arange(total, dtype=np.int32), np.array([0], np.int32))
    for i in range(drafter.cfg.model.n_layers):
        for got_c, want_c in zip(drafter.cache.layer(i), fresh.layer(i)):
            # injected in other chunks than one forward of all rows: float32 rounding only
            np.testing.assert_allclose(got_c[:total], want_c[:total], rtol=1e-5,
                                       atol=1e-5 * np.abs(want_c[:total]).max())
    drafter.capture_device(committed_features(rng, 3), 3)
    with pytest.raises(RuntimeError, match="committed row 3 of a verify forward with 3 captured rows"):
        drafter.accept([1, 2], 3, [0, 1, 3])
    drafter.end()
