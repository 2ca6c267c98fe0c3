"""fd_kv_compact (speculative decoding's commit) against a numpy copy of the same moves.

The kernel copies float16 rows bit for bit, so the oracle is exact equality: rows the commit
writes equal the source rows of the original cache, every other slot is untouched.
"""
import numpy as np
import pytest


def random_path(rng, n_nodes: int) -> np.ndarray:
    """Node offsets of a root-to-node path in a random tree numbered parents first: strictly
    increasing, offsets[0] = 0, offsets[i] >= i."""
    parent = [-1] + [int(rng.integers(0, i)) for i in range(1, n_nodes)]
    node = int(rng.integers(0, n_nodes))
    path = []
    while node >= 0:
        path.append(node)
        node = parent[node]
    return np.array(path[::-1], np.int32)


def compact_oracle(cache: np.ndarray, n_past: int, offsets: np.ndarray) -> np.ndarray:
    out = cache.copy()                      # (2 * n_layers, Hkv, max_ctx, d)
    out[:, :, n_past:n_past + len(offsets)] = cache[:, :, n_past + offsets]
    return out


@pytest.mark.parametrize("n_layers,n_kv_heads,head_dim,max_ctx,n_past,n_nodes", [
    (1, 1, 2, 8, 0, 5),            # smallest shapes
    (3, 2, 64, 97, 40, 23),        # prime max_ctx, the default DDTree budget
    (28, 2, 128, 300, 211, 65),    # the 1.5B target's layer shape
    (2, 5, 130, 64, 1, 63),        # head_dim not a multiple of the 128-thread block
])
def test_kv_compact_matches_numpy(native, dev, rng, n_layers, n_kv_heads, head_dim, max_ctx, n_past, n_nodes):
    for _ in range(4):                     # several random paths, fresh cache each time
        offsets = random_path(rng, n_nodes)
        cache = rng.standard_normal((2 * n_layers, n_kv_heads, max_ctx, head_dim)).astype(np.float16)
        d_cache = dev.upload(cache)
        d_off = dev.upload(offsets)
        d_np = dev.upload(np.array([n_past], np.int32))
        native.check(native.lib.fd_kv_compact(dev.p(d_cache), dev.p(d_off, "int32_t*"), dev.p(d_np, "int32_t*"),
                                              len(offsets), n_layers, n_kv_heads, max_ctx, head_dim, dev.stream),
                     "fd_kv_compact")
        dev.synchronize()
        got = dev.download(d_cache)
        want = compact_oracle(cache, n_past, offsets)
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), f"offsets {offsets.tolist()}"


def test_kv_compact_rejects_bad_arguments(native, dev):
    d = dev.empty((64,), np.float16)
    off = dev.upload(np.array([0], np.int32))
    npast = dev.upload(np.array([0], np.int32))
    lib = native.lib
    assert lib.fd_kv_compact(dev.p(d), dev.p(off, "int32_t*"), dev.p(npast, "int32_t*"), 1, 1, 1, 8, 3,
                             dev.stream) == lib.FD_E_ARG                       # odd head_dim
    assert lib.fd_kv_compact(dev.ffi.NULL, dev.p(off, "int32_t*"), dev.p(npast, "int32_t*"), 1, 1, 1, 8, 4,
                             dev.stream) == lib.FD_E_ARG
    assert lib.fd_kv_compact(dev.p(d), dev.p(off, "int32_t*"), dev.p(npast, "int32_t*"), 0, 1, 1, 8, 4,
                             dev.stream) == 0                                  # nothing to move
