"""fd_prefetch_l2 (prefetch.cu) and the tuning's l2_prefetch_mlp (a captured forward's concurrent branch asking L2 for
each layer's MLP weights, CudaOps.prefetch): the prefetch is a hint -- it returns 0 on any range, aligned or not,
refuses a NULL range of bytes, changes no byte -- and decoding with the branch (every mode) gives the tokens and the
tree logits it gives without it. The branch's fork / join calls themselves: tests/cuda_on_host/
test_prefetch_branch_on_host.py."""
import numpy as np
import pytest

from tests.gpu.test_forward import cuda_runner

FD_E_ARG = -1

MODEL = dict(arch="qwen2", n_layers=3, hidden=256, n_heads=4, n_kv_heads=2, ffn=768, vocab_size=500, seed=23,
             weight_type="Q4_K", name="l2-prefetch")
PROMPT = [3, 17, 42, 7, 99, 5, 250, 31]


@pytest.fixture
def restore_tuning(native):
    before = native.tuning()
    yield before
    native.set_tuning(**before)


def test_the_prefetch_changes_no_byte_and_takes_any_range(native, dev, rng):
    data = rng.integers(0, 256, (1 << 20) + 37, dtype=np.uint8)
    d = dev.upload(data)
    base = native.ffi.cast("char*", d.ptr)
    for off, n in [(0, data.size), (3, data.size - 3), (17, 1000), (5, 9), (0, 0), (1 << 20, 37)]:
        assert native.lib.fd_prefetch_l2(base + off, n, dev.stream) == 0, (off, n)
    assert native.lib.fd_prefetch_l2(native.ffi.NULL, 64, dev.stream) == FD_E_ARG
    assert native.lib.fd_prefetch_l2(native.ffi.NULL, 0, dev.stream) == 0
    dev.synchronize()
    assert np.array_equal(dev.download(d), data)


@pytest.fixture(scope="module")
def run(native, synthetic_model):
    from flashd.daemon.backends.cuda.backend import CudaBackend
    return cuda_runner(CudaBackend(), synthetic_model(**MODEL), "graph", max_ctx=256, chunk=64)


def decode(run, n_new=24):
    run.drop_graphs()            # recaptured under the tuning now in effect (a graph keeps its launches)
    run.reset()
    run.prefill(PROMPT)          # eager: the branch's stream is made here, outside any capture
    return run.greedy_continue([5], n_new)


def tree_logits(run):
    """A verify forward of 4 chain tokens (the tree graph, captured) after the prompt."""
    run.drop_graphs()
    run.reset()
    run.prefill(PROMPT)
    n = 4
    mask = np.tril(np.ones((n, n), np.uint8))
    logits = run.forward_tree(np.array([5, 9, 11, 2], np.int32), np.arange(run.n_past, run.n_past + n, dtype=np.int32),
                              mask)
    return run.logits_to_host(logits)


def test_decoding_with_the_branch_gives_the_same_tokens_and_logits(native, run, restore_tuning):
    major = int(run.dev.info()["cc"].split(".")[0])
    native.set_tuning(l2_prefetch_mlp=0)
    want_tokens, want_logits = decode(run), tree_logits(run)
    for mode in (1, 2, 3):
        native.set_tuning(l2_prefetch_mlp=mode)
        assert decode(run) == want_tokens, mode
        assert np.array_equal(tree_logits(run), want_logits), mode
        if major >= 8:
            assert run.dev._branch is not None      # the branch was made (and so forked in the captures)
