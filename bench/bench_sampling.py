"""Token selection (native/cuda/sampling.cu): fd_argmax and fd_sample, each checked against
flashd.daemon.sampling (the definition every backend reproduces) before it is timed.

    python bench/bench_sampling.py [--seed N] [--reps 30]

Shapes: the Qwen2.5-Coder vocabulary (151936, the 0.5B and the 1.5B share it) for one row (the decode
step) and 8 rows (verify rows), plus an awkward one (3 rows of 16385: the cluster kernel's slices of
unequal length, no float4 loads). Every call is captured once in a CUDA graph and replayed, as in the
captured decode step; L2 is flushed before every repetition (bench/timing.py).

Checks:
  fd_argmax  exact: token ids are integers and the rule is defined (the lowest id wins a tie).
  fd_sample  token for token against flashd.daemon.sampling.sample at CHECK_STEPS steps (u = uniform(seed,
             step) is defined, so the sampled token is too), except where tests/sampling/sampling_boundaries.py
             finds a decision within float32 rounding of its threshold (the kernel computes in float32,
             the reference in float64): there the token must lie in the loosened kept set. The same rule as
             tests/gpu/test_sampling_gpu.py. Greedy (temperature 0) is fd_argmax's job: fd_sample refuses it.
GB/s counts one read of the logits (4 bytes per entry); the sampler's passes over the logits reread
them (from L2 after the first), so the number is a lower bound on the traffic the kernel makes.
"""
from __future__ import annotations

import argparse

import numpy as np

from flashd.bench.op_harness import OpHarness, Tolerance, add_arguments, repo_module

N_VOCAB = 151936                       # Qwen2.5-Coder 0.5B and 1.5B
ARGMAX_SHAPES = [(1, N_VOCAB), (8, N_VOCAB), (3, 16385)]      # (n_rows, n_vocab); the last is the awkward one
SAMPLE_VOCABS = [N_VOCAB, 4099]        # 4099: no float4 alignment, one CTA-sized slice
N_HISTORY = 256
CHECK_STEPS = 16
# name: fd_sample's knobs (temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, frequency, presence)
SAMPLE_CASES = {
    "T=0.8": (0.8, 0, 1.0, 0.0, 1.0, 64, 0.0, 0.0),
    "T=0.8 top_k 40 top_p 0.95 rep 1.1": (0.8, 40, 0.95, 0.0, 1.1, 64, 0.0, 0.0),
    "T=0.8 top_p 0.9 min_p 0.05": (0.8, 0, 0.9, 0.05, 1.0, 64, 0.0, 0.0),
    "T=1.0 top_k 1 freq 0.5 presence 0.5": (1.0, 1, 1.0, 0.0, 1.0, 64, 0.5, 0.5),
}


def f32(v: float) -> float:
    """A float parameter as the kernel receives it (a C float): the reference gets the same value."""
    return float(np.float32(v))


def sampling_params(knobs, seed: int):
    from flashd.protocol.messages import SamplingParams

    t, top_k, top_p, min_p, rep, last_n, freq, pres = knobs
    return SamplingParams(temperature=f32(t), top_k=int(top_k), top_p=f32(top_p), min_p=f32(min_p),
                          repeat_penalty=f32(rep), repeat_last_n=int(last_n), frequency_penalty=f32(freq),
                          presence_penalty=f32(pres), seed=int(seed))


def llm_logits(rng, n_rows: int, n_vocab: int) -> np.ndarray:
    """A bulk around 0 and ~20 strong candidates per row, as a language model's logits look."""
    x = rng.standard_normal((n_rows, n_vocab)) * 2.0
    for r in range(n_rows):
        spikes = rng.choice(n_vocab, size=min(20, n_vocab), replace=False)
        x[r, spikes] += rng.uniform(4.0, 12.0, spikes.size)
    return x.astype(np.float32)


def history_ids(rng, n_vocab: int, n: int = N_HISTORY) -> np.ndarray:
    """Generated ids with repeats in the recent window (so penalty counts > 1 occur)."""
    h = rng.integers(0, n_vocab, n).astype(np.int32)
    h[-20:] = rng.choice(h[: n // 2], 20)
    return h


def argmax_reference(x: np.ndarray) -> np.ndarray:
    return np.argmax(x, axis=1).astype(np.int32)       # the first (lowest) id of the maximum


class SampleCheck:
    """Device tokens vs the reference's at each step; off a float32 boundary they must be equal."""

    reason = ("fd_sample follows flashd.daemon.sampling exactly (counter-based u); a token may differ only "
              "where a threshold or u lies within float32 rounding of a boundary (tests/sampling/sampling_boundaries.py), "
              "and must then be in the loosened kept set")

    def __init__(self, logits, history, params, steps):
        self.logits, self.history, self.params, self.steps = logits, history, params, list(steps)

    def __call__(self, got, want) -> str | None:
        boundaries = repo_module("tests/sampling/sampling_boundaries.py").boundaries
        for step, g, w in zip(self.steps, got.tolist(), want.tolist()):
            if g == w:
                continue
            border, loose = boundaries(self.logits, self.history, self.params, step)
            if border and 0 <= g < loose.size and loose[g]:
                continue
            return (f"step {step}: device token {g}, reference {w} "
                    f"({'on a float32 boundary, but outside the kept set' if border else 'off any float32 boundary'})")
        return None


def bench_argmax(h: OpHarness) -> None:
    dev, lib = h.dev, h.dev.lib
    for n_rows, n_vocab in ARGMAX_SHAPES:
        case = f"fd_argmax {n_rows}x{n_vocab}"
        x = llm_logits(h.rng(case), n_rows, n_vocab)
        logits, out = dev.upload(x), dev.empty((n_rows,), np.int32)
        dev.fill_bytes(out, 0xFF)
        h.run(case, lambda: lib.fd_argmax(dev.p(out, "int32_t*"), dev.p(logits, "float*"), n_rows, n_vocab,
                                          dev.stream),
              lambda: dev.download(out), lambda: argmax_reference(x),
              Tolerance.exact("token ids are integers; the lowest id wins a tie"),
              n_bytes=4 * n_rows * n_vocab, graph=True)


def bench_sample(h: OpHarness) -> None:
    from flashd.daemon.sampling import sample

    dev, lib, p = h.dev, h.dev.lib, h.dev.p
    for n_vocab in SAMPLE_VOCABS:
        ws = dev.empty((lib.fd_sample_workspace_bytes(n_vocab),), np.uint8)
        out, step = dev.empty((1,), np.int32), dev.upload(np.zeros(1, np.int32))
        n_history = dev.upload(np.array([N_HISTORY], np.int32))
        for name, knobs in SAMPLE_CASES.items():
            case = f"fd_sample vocab {n_vocab} {name}"
            rng = h.rng(case)
            x = llm_logits(rng, 1, n_vocab)[0]
            hist = history_ids(rng, n_vocab)
            params = sampling_params(knobs, int(rng.integers(0, 2**63)))
            steps = [int(s) for s in rng.integers(0, 2**31 - 1, CHECK_STEPS)]
            logits, history = dev.upload(x), dev.upload(hist)

            def launch():
                return lib.fd_sample(p(out, "int32_t*"), p(logits, "float*"), n_vocab, p(history, "int32_t*"),
                                     p(n_history, "int32_t*"), params.repeat_last_n, params.repeat_penalty,
                                     params.frequency_penalty, params.presence_penalty, params.temperature,
                                     params.top_k, params.top_p, params.min_p, params.seed, p(step, "int32_t*"),
                                     p(ws), dev.stream)

            def tokens():
                got = []
                for s in steps:
                    dev.upload(np.array([s], np.int32), out=step)
                    dev.native.check(launch(), case)
                    got.append(int(dev.download(out)[0]))
                return np.array(got, np.int64)

            h.run(case, launch, tokens, lambda: np.array([sample(x, hist, params, s) for s in steps], np.int64),
                  SampleCheck(x, hist, params, steps), n_bytes=4 * n_vocab, graph=True)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    ap.add_argument("--only", choices=("argmax", "sample"), help="run one of the two ops")
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    h = OpHarness.on_gpu(args)
    if args.only in (None, "argmax"):
        bench_argmax(h)
    if args.only in (None, "sample"):
        bench_sample(h)


if __name__ == "__main__":
    main()
