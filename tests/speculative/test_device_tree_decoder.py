"""The decoder's device-tree step (SpecDecoder._device_step; drafter.py, "Proposals on the device") on the CPU
reference backend, with the device's side emulated in numpy exactly as its kernel and runner define it
(backends/cuda/tree_build.py, tree_verify.py): the tree is build_tree's, the forward has budget + 1 rows, rows the
tree could not fill are padding (the root at n_past, masked to themselves), and the walk reads the built nodes
only. The decoder must emit what the host build emits (the same steps, drafts and commits), fall back to the
host build where the runner cannot take a tree, and never pad a tree whose candidates cannot fill the budget.
The kernel itself is checked against build_tree on the GPU (tests/gpu/test_ddtree_build_gpu.py) and the whole
path end to end there (tests/gpu/test_dflash_gpu.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.speculative.decoder import SpecConfig, SpecDecoder, _tree_capacity
from flashd.daemon.speculative.drafter import DeviceProposal, Proposal
from flashd.daemon.speculative.tree import build_tree
from flashd.protocol.messages import SamplingParams

from tests.speculative.test_dflash_drafter import TARGET, dflash_path, make_drafter, prompts  # noqa: F401 (fixture)


class EmulatedDeviceTree:
    """A reference runner with tree_verify.py's interface, the kernel's work done by build_tree."""

    device_tree = True

    def __init__(self, runner, max_depth: int = 16, max_k: int = 16):
        self.runner, self.max_depth, self.max_k = runner, max_depth, max_k
        self.forwards: list[tuple[int, int]] = []       # (rows forwarded, nodes built) per device step
        self._last = None

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def device_tree_fits(self, n_depth, k, budget):
        return 1 <= n_depth <= self.max_depth and 1 <= k <= self.max_k and budget + 1 <= self.runner.max_tree_nodes

    def forward_tree_device(self, proposal, *, n_depth, budget, chain_seed, root, capture=()):
        assert self.device_tree_fits(n_depth, proposal.k, budget)
        prop = Proposal(np.asarray(proposal.ids)[:n_depth], np.asarray(proposal.logprobs)[:n_depth])
        tree = build_tree(root, prop, budget, chain_seed=chain_seed)
        n, m = tree.n_nodes, budget + 1
        ids = np.concatenate([tree.tokens, np.full(m - n, root, np.int32)])
        positions = np.concatenate([tree.positions(self.runner.n_past), np.full(m - n, self.runner.n_past, np.int32)])
        mask = np.eye(m, dtype=bool)
        mask[:n, :n] = tree.ancestor_mask()
        self.forwards.append((m, n))
        logits = self.runner.forward_tree(ids, positions, mask, capture=capture)
        self._last = tree
        return logits

    def walk_device(self, logits):
        return self._last, np.argmax(np.asarray(logits), axis=-1).astype(np.int32)


def offer_device_proposals(drafter):
    """The reference drafter's propose(), handed over as a DeviceProposal (numpy arrays stand in for the device)."""
    drafter.device_proposals = True
    calls = []

    def propose_device(max_depth, top_k):
        p = drafter.propose(max_depth, top_k)
        calls.append(p)
        return DeviceProposal(p.tokens, p.logprobs, p.n_depth)
    drafter.propose_device = propose_device
    return calls


def run(runner, drafter, cfg, prompt, n_new):
    dec = SpecDecoder(runner, drafter, cfg)
    tokens = [s.token for s in dec.generate(prompt, SamplingParams(), n_new)]
    return tokens, dec.stats


@pytest.mark.parametrize("mode,budget", [("chain", 15), ("ddtree", 8), ("ddtree", 22), ("ddtree", 40), ("auto", 15)])
def test_device_step_emits_what_the_host_build_emits(make_runner, dflash_path, mode, budget):
    runner = make_runner(TARGET)
    prompt = prompts()[2]
    base = run(runner, make_drafter(dflash_path, runner), SpecConfig(mode, budget, device_tree=False), prompt, 40)
    plain = [s.token for s in runner.generate(prompt, SamplingParams(), 40)]
    emu = EmulatedDeviceTree(runner)
    drafter = make_drafter(dflash_path, runner)
    calls = offer_device_proposals(drafter)
    tokens, stats = run(emu, drafter, SpecConfig(mode, budget), prompt, 40)
    assert tokens == base[0] == plain
    if mode != "auto":                                  # auto's depths follow measured step times
        assert stats.steps == base[1].steps and stats.histogram == base[1].histogram
        assert stats.drafted_nodes == base[1].drafted_nodes
    assert len(emu.forwards) == len(calls) > 0          # every drafted step took the device path
    assert all(m == n for m, n in emu.forwards)         # finite candidates: never a padding row


def test_the_budget_never_exceeds_what_the_candidates_can_make(make_runner, dflash_path):
    """Near the end of a request the depth shrinks (a step emits at most the tokens still wanted): a DDTree of
    budget 40 over one depth of 8 candidates is 8 nodes, not 8 + 32 padding rows."""
    runner = make_runner(TARGET)
    emu = EmulatedDeviceTree(runner)
    drafter = make_drafter(dflash_path, runner)
    offer_device_proposals(drafter)
    run(emu, drafter, SpecConfig("ddtree", 40), prompts()[1], 3)        # steps of depth <= 1
    assert emu.forwards and all(m == n <= 9 for m, n in emu.forwards)
    assert [_tree_capacity(d, k, 40) for d, k in [(1, 8), (2, 8), (3, 2), (0, 8), (15, 1)]] == [8, 40, 14, 0, 15]


def test_a_tree_the_runner_cannot_take_is_built_on_the_host(make_runner, dflash_path):
    runner = make_runner(TARGET)
    emu = EmulatedDeviceTree(runner, max_k=4)            # top_k 8 does not fit: every step falls back
    drafter = make_drafter(dflash_path, runner)
    calls = offer_device_proposals(drafter)
    tokens, _ = run(emu, drafter, SpecConfig("ddtree", 22), prompts()[2], 24)
    assert not calls and not emu.forwards               # the drafter ran once a step, on the host path
    assert tokens == [s.token for s in runner.generate(prompts()[2], SamplingParams(), 24)]


def test_padding_rows_change_nothing(make_runner):
    """Candidates the tree cannot use (-inf) leave rows of the forward unfilled: the built nodes' logits are
    those of the tree forwarded alone (padding rows see only themselves)."""
    runner = make_runner(TARGET)
    rng = np.random.default_rng(7)
    runner.reset()
    runner.prefill(rng.integers(0, TARGET["vocab_size"], 11).tolist())
    lp = np.log(np.sort(rng.uniform(0.05, 1, (4, 3)), axis=1)[:, ::-1])
    lp[1, 1:] = -np.inf                                  # depth 2: one usable candidate
    lp[2:, :] = -np.inf                                  # nothing below depth 2
    ids = rng.integers(0, TARGET["vocab_size"], (4, 3)).astype(np.int32)
    emu = EmulatedDeviceTree(runner)
    logits = np.asarray(emu.forward_tree_device(DeviceProposal(ids, lp, 4), n_depth=4, budget=10, chain_seed=True,
                                                root=5))
    tree, argmax = emu.walk_device(logits)
    assert emu.forwards == [(11, tree.n_nodes)] and tree.n_nodes == 1 + 3 + 3     # 3 at depth 1, 3 below them
    alone = np.asarray(runner.forward_tree(tree.tokens, tree.positions(runner.n_past), tree.ancestor_mask()))
    # float32 rounding only: numpy's matmuls block a batch of 11 rows differently from one of 7 (the CUDA verify is
    # row-invariant bit for bit, tests/gpu); a padding row leaking into a node would move its logits by O(1)
    np.testing.assert_allclose(logits[:tree.n_nodes], alone, rtol=1e-5, atol=1e-5 * np.abs(alone).max())
    assert len(argmax) == 11 and runner.n_past == 11
