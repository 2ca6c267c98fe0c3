"""fd_argmax, fd_sample and fd_decode_advance against flashd.daemon.sampling (float64)."""
import math

import numpy as np
import pytest

from flashd.daemon.sampling import candidate_probs, sample
from flashd.protocol.messages import SamplingParams
from tests.sampling.sampling_boundaries import boundaries   # the float32-boundary oracle, shared with the CPU emulation

F32 = lambda v: float(np.float32(v))   # noqa: E731  parameters the kernel sees exactly (float args)


# ---- argmax -----------------------------------------------------------------------------------
# 16384 and up take the 8-block cluster kernel on sm_90 (16385, 20001: slices of unequal length, no float4)
@pytest.mark.parametrize("n_rows,n_vocab", [(1, 151936), (3, 262144), (4, 7), (2, 1), (8, 1001), (1, 16384),
                                            (2, 16385), (5, 20001)])
def test_argmax_lowest_id_wins_ties_and_nan_never_wins(native, dev, rng, poisoned, n_rows, n_vocab):
    x = rng.standard_normal((n_rows, n_vocab)).astype(np.float32)
    for r in range(n_rows):
        if n_vocab > 2:
            ids = rng.choice(n_vocab, size=min(3, n_vocab), replace=False)
            x[r, ids] = x[r].max() + 1.0                      # a three-way tie at the top
            x[r, rng.integers(0, n_vocab)] = np.nan           # NaN anywhere, even above the max
    dx = dev.upload(x)
    out = poisoned((n_rows,), np.int32)
    native.check(native.lib.fd_argmax(dev.p(out, "int32_t*"), dev.p(dx, "float*"), n_rows, n_vocab, dev.stream),
                 "fd_argmax")
    dev.synchronize()
    expect = [int(np.flatnonzero(row == np.nanmax(row))[0]) for row in x]
    assert dev.download(out).tolist() == expect


@pytest.mark.parametrize("n_vocab", [151936, 16387])
def test_argmax_long_rows_ties_across_slices_and_nan_rows(native, dev, n_vocab):
    """The cluster kernel's merge: a tie between the first and the last slice, between two middle
    slices, a winner in the last element, and an all-NaN long row."""
    x = np.zeros((4, n_vocab), np.float32)
    x[0, [n_vocab - 1, 0]] = 3.0                 # tie first / last element: 0
    x[1, [n_vocab // 2 + 5, n_vocab // 4 + 3]] = 2.0
    x[2, n_vocab - 1] = 1.0                      # last element alone
    x[3] = np.nan
    dx = dev.upload(x)
    out = dev.empty((4,), np.int32)
    native.check(native.lib.fd_argmax(dev.p(out, "int32_t*"), dev.p(dx, "float*"), 4, n_vocab, dev.stream),
                 "fd_argmax")
    dev.synchronize()
    assert dev.download(out).tolist() == [0, n_vocab // 4 + 3, n_vocab - 1, -1]


def test_argmax_special_rows(native, dev):
    x = np.array([[-np.inf, -np.inf, -np.inf, -np.inf],       # all -inf: lowest id
                  [np.nan, np.nan, np.nan, np.nan],           # all NaN: -1
                  [np.nan, -np.inf, 5.0, 5.0],
                  [0.0, -0.0, -1.0, 0.0]], np.float32)        # -0 == 0: lowest id
    dx = dev.upload(x)
    out = dev.empty((4,), np.int32)
    native.check(native.lib.fd_argmax(dev.p(out, "int32_t*"), dev.p(dx, "float*"), 4, 4, dev.stream), "fd_argmax")
    dev.synchronize()
    assert dev.download(out).tolist() == [0, -1, 2, 0]


# ---- sampling: exact agreement with the reference, away from float32 boundaries ----------------
class Sampler:
    def __init__(self, native, dev, n_vocab, rng):
        self.native, self.dev, self.n_vocab = native, dev, n_vocab
        self.ws = dev.empty((native.lib.fd_sample_workspace_bytes(n_vocab),), np.uint8)
        # stale garbage, including plausible window positions: the kernel must not trust it
        garbage = rng.integers(0, 64, self.ws.nbytes // 4, dtype=np.int32).view(np.uint8)
        dev.upload(garbage, out=self.ws)
        self.out = dev.empty((1,), np.int32)
        self.step = dev.empty((1,), np.int32)
        self.n_history = dev.empty((1,), np.int32)

    def __call__(self, logits, history, params, step):
        dev, lib = self.dev, self.native.lib
        dl = dev.upload(logits)
        hist = dev.upload(np.asarray(history, np.int32) if len(history) else np.zeros(1, np.int32))
        dev.upload(np.array([len(history)], np.int32), out=self.n_history)
        dev.upload(np.array([step], np.int32), out=self.step)
        dev.fill_bytes(self.out, 0xFF)
        self.native.check(lib.fd_sample(dev.p(self.out, "int32_t*"), dev.p(dl, "float*"), self.n_vocab,
                                        dev.p(hist, "int32_t*"), dev.p(self.n_history, "int32_t*"),
                                        params.repeat_last_n, params.repeat_penalty, params.frequency_penalty,
                                        params.presence_penalty, params.temperature, params.top_k, params.top_p,
                                        params.min_p, params.seed, dev.p(self.step, "int32_t*"), dev.p(self.ws),
                                        dev.stream), "fd_sample")
        dev.synchronize()
        return int(dev.download(self.out)[0])


def make_logits(rng, n_vocab, kind):
    if kind == "llm":          # a bulk around 0 and a few strong candidates
        x = rng.standard_normal(n_vocab) * 2.0
        spikes = rng.choice(n_vocab, size=min(20, n_vocab), replace=False)
        x[spikes] += rng.uniform(4.0, 12.0, spikes.size)
    elif kind == "flat":       # huge nucleus: exercises the overflow (whole-vocabulary) paths
        x = rng.standard_normal(n_vocab) * 0.05
    else:                      # "ties": integer logits, many exact ties at every threshold
        x = rng.integers(-6, 7, n_vocab).astype(np.float64)
    return x.astype(np.float32)


def random_params(rng, n_vocab):
    return SamplingParams(
        temperature=F32(rng.choice([0.3, 0.7, 1.0, 1.6])),
        top_k=int(rng.choice([0, 0, 1, 7, 40, 1000, 5000, n_vocab])),
        top_p=F32(rng.choice([1.0, 1.0, 0.95, 0.9, 0.5, 0.2])),
        min_p=F32(rng.choice([0.0, 0.0, 0.05, 0.3])),
        repeat_penalty=F32(rng.choice([1.0, 1.0, 1.3, 0.8])),
        repeat_last_n=int(rng.choice([0, 8, 64, 1000])),
        frequency_penalty=F32(rng.choice([0.0, 0.5, -0.25])),
        presence_penalty=F32(rng.choice([0.0, 0.75])),
        seed=int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2)),
    )


@pytest.mark.parametrize("n_vocab", [151936, 262144, 4099, 64, 7, 1])
def test_sample_matches_reference_token_for_token(native, dev, rng, n_vocab):
    sampler = Sampler(native, dev, n_vocab, rng)
    n_cases = 60 if n_vocab > 100_000 else 120
    n_exact = 0
    for case in range(n_cases):
        kind = ("llm", "flat", "ties")[case % 3]
        logits = make_logits(rng, n_vocab, kind)
        history = rng.integers(0, n_vocab, int(rng.integers(0, 300))).astype(np.int32)
        if history.size and n_vocab > 10:   # repeats, so counts > 1 matter
            history[-20:] = rng.choice(history[: max(1, history.size // 2)], min(20, history.size))
        params = random_params(rng, n_vocab)
        step = int(rng.integers(0, 2**31 - 1))
        got = sampler(logits, history, params, step)
        border, loose = boundaries(logits, history, params, step)
        if border:   # float32 may legitimately differ: the token must still be a possible one
            assert loose[got], f"case {case} ({kind}): gpu token {got} outside the kept set, {params}"
            continue
        expect = sample(logits, history, params, step)
        assert got == expect, (f"case {case} ({kind}): gpu {got} != reference {expect} with {params}, "
                               f"step {step}, history length {history.size}")
        n_exact += 1
    # "flat" cases (a third) have nuclei of ~1e5 ids whose mass steps are below MASS_TOL: mostly
    # boundary cases; the others almost never are
    assert n_exact >= n_cases // 3, f"only {n_exact} of {n_cases} cases were away from float32 boundaries"


def test_sample_penalties_window_and_counts(native, dev, rng):
    """A token penalised once with its window count, tokens outside the window untouched."""
    n_vocab = 1000
    sampler = Sampler(native, dev, n_vocab, rng)
    logits = np.zeros(n_vocab, np.float32)
    logits[[1, 2, 3]] = [5.0, 5.2, 5.1]
    history = np.array([2, 2, 2, 7, 2, 3, 3], np.int32)
    params = SamplingParams(temperature=0.05, top_k=1, repeat_last_n=5, frequency_penalty=0.1,
                            presence_penalty=0.05, seed=3)
    # window = [2, 7, 2, 3, 3]: 2 -> 5.2 - 0.2 - 0.05 = 4.95, 3 -> 5.1 - 0.2 - 0.05 = 4.85: 1 wins
    assert sampler(logits, history, params, 0) == sample(logits, history, params, 0) == 1
    params_off = SamplingParams(temperature=0.05, top_k=1, repeat_last_n=0, frequency_penalty=2.0, seed=3)
    assert sampler(logits, history, params_off, 0) == 2


def test_sample_rejects_bad_arguments(native, dev):
    t = dev.empty((1024,))
    i = dev.upload(np.zeros(1, np.int32))
    call = lambda temperature, top_k, top_p, min_p: native.lib.fd_sample(  # noqa: E731
        dev.p(i, "int32_t*"), dev.p(t, "float*"), 10, dev.p(i, "int32_t*"), dev.p(i, "int32_t*"), 0, 1.0, 0.0, 0.0,
        temperature, top_k, top_p, min_p, 0, dev.p(i, "int32_t*"), dev.p(t), dev.stream)
    assert call(0.0, 0, 1.0, 0.0) == native.lib.FD_E_ARG      # greedy goes through fd_argmax
    assert call(1.0, -1, 1.0, 0.0) == native.lib.FD_E_ARG
    assert call(1.0, 0, 0.0, 0.0) == native.lib.FD_E_ARG
    assert call(1.0, 0, 1.0, 1.0) == native.lib.FD_E_ARG
    assert call(1.0, 0, 1.0, 0.0) == 0


# ---- the on-device decode loop: distribution and bookkeeping ------------------------------------
def test_sampled_distribution_chi_square_and_decode_advance(native, dev, rng):
    """N draws with the step advanced on the device by fd_decode_advance (no host round trip, as in
    the captured decode loop): the histogram matches the reference's kept distribution (chi-square),
    every draw equals the reference token for its step, and the bookkeeping is exact."""
    n_vocab, n_draws = 64, 20000
    logits = (rng.standard_normal(n_vocab) * 1.2).astype(np.float32)   # some 20-30 ids survive the filters
    params = SamplingParams(temperature=F32(0.9), top_k=30, top_p=F32(0.95), min_p=F32(0.01), seed=12345)
    ids, probs = candidate_probs(logits, params)
    lib, ffi = native.lib, native.ffi
    ring_ptr = ffi.new("void**")
    native.check(lib.fd_host_alloc(ring_ptr, 4 * n_draws), "fd_host_alloc")
    try:
        ring = np.frombuffer(ffi.buffer(ring_ptr[0], 4 * n_draws), np.int32)
        ring[:] = -7
        dl = dev.upload(logits)
        ws = dev.empty((lib.fd_sample_workspace_bytes(n_vocab),), np.uint8)
        token = dev.empty((1,), np.int32)
        history = dev.upload(np.full(n_draws + 3, -1, np.int32))
        n_history = dev.upload(np.array([3], np.int32))
        step = dev.upload(np.array([0], np.int32))
        positions = dev.upload(np.array([100], np.int32))
        n_past = dev.upload(np.array([100], np.int32))
        p = dev.p
        for _ in range(n_draws):
            native.check(lib.fd_sample(p(token, "int32_t*"), p(dl, "float*"), n_vocab, p(history, "int32_t*"),
                                       p(n_history, "int32_t*"), params.repeat_last_n, params.repeat_penalty,
                                       params.frequency_penalty, params.presence_penalty, params.temperature,
                                       params.top_k, params.top_p, params.min_p, params.seed,
                                       p(step, "int32_t*"), p(ws), dev.stream), "fd_sample")
            native.check(lib.fd_decode_advance(p(token, "int32_t*"), p(history, "int32_t*"),
                                               p(n_history, "int32_t*"), ffi.cast("int32_t*", ring_ptr[0]), n_draws,
                                               p(step, "int32_t*"), p(positions, "int32_t*"),
                                               p(n_past, "int32_t*"), dev.stream), "fd_decode_advance")
        dev.synchronize()
        draws = ring.copy()
    finally:
        lib.fd_host_free(ring_ptr[0])
    assert dev.download(step)[0] == n_draws and dev.download(n_history)[0] == n_draws + 3
    assert dev.download(positions)[0] == 100 + n_draws and dev.download(n_past)[0] == 100 + n_draws
    np.testing.assert_array_equal(dev.download(history)[3:], draws)

    reference = np.array([sample(logits, np.array([], np.int32), params, s) for s in range(n_draws)])
    for s in np.flatnonzero(draws != reference):
        assert boundaries(logits, np.array([], np.int32), params, int(s))[0], f"step {s}: mismatch off a boundary"
    assert np.isin(draws, ids).all(), "a draw outside the kept set"

    counts = np.array([(draws == t).sum() for t in ids], np.float64)
    expected = probs * n_draws
    big = expected >= 5                                   # pool tiny cells (chi-square validity)
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    obs, exp = (obs, exp) if exp[-1] > 0 else (obs[:-1], exp[:-1])
    chi2, dof = float(((obs - exp) ** 2 / exp).sum()), len(exp) - 1
    assert dof >= 5, f"only {dof + 1} cells: the test distribution is too peaked to say anything"
    # Wilson-Hilferty: z ~ N(0, 1) under the hypothesis; z < 4.5 fails a correct sampler ~3e-6 of runs
    z = ((chi2 / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    assert z < 4.5, f"chi-square {chi2:.1f} with {dof} dof (z = {z:.2f})"
