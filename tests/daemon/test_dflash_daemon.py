"""A synthetic DFlash drafter end to end through the real daemon (`flashd serve --draft FILE.gguf`,
CPU reference backend): DDTree at budgets 8..64 and chain mode stream exactly the tokens plain
greedy decoding streams, and `done` reports the speculative steps."""
from __future__ import annotations

import pytest

from tests.daemon.daemon_harness import SYNTHETIC_SPEC, check_speculative_equals_greedy
from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash

PROMPTS = ['def fib(n):', 'The quick brown fox jumps over', 'x']


@pytest.fixture(scope="module")
def dflash_drafter(tmp_path_factory):
    s = SYNTHETIC_SPEC
    spec = spec_for_target(s.hidden, s.n_layers, s.vocab_size, n_features=2, block_size=16, seed=9)
    return write_synthetic_dflash(tmp_path_factory.mktemp("dflash") / "tiny-dflash.gguf", spec)


def test_dflash_ddtree_through_the_daemon_equals_greedy(spawn_serve, dflash_drafter):
    daemon = spawn_serve("--draft", str(dflash_drafter))
    configs = [(mode, budget, dflash_drafter.stem)
               for mode, budget in (("chain", 15), ("ddtree", 8), ("ddtree", 22), ("ddtree", 40), ("ddtree", 64))]
    check_speculative_equals_greedy(daemon, PROMPTS, 48, configs)
