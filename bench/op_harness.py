"""Check one op against its reference, then time it: the harness of the per-op benchmarks
(bench_sampling.py, bench_flashprefill.py, bench_flashprefill_sparse_attention.py, bench_gemv_multi.py).

    ap = argparse.ArgumentParser(description=__doc__); add_arguments(ap)
    h = OpHarness.on_gpu(ap.parse_args())          # prints the device, its DRAM peak and the seed
    rng = h.rng("fd_argmax 1x151936")              # a case's inputs come from (seed, case name)
    ...upload inputs, make the output tensors...
    h.run("fd_argmax 1x151936", launch, result, reference, Tolerance.exact("token ids are integers"),
          n_bytes=4 * 151936)

run() launches the op once and compares result() (its output, downloaded) with reference() (numpy,
the oracle). On a mismatch it prints the case, how many elements are off, the worst one (got, want,
error and bound), the tolerance's reason and the seed that repeats the inputs, and exits with status
1: an op is never timed while it is wrong. Then it times launch() with timing.KernelTimer (L2 flushed
before every repetition, CUDA events, median of --reps; graph=True captures the launch once into a
CUDA graph and times the replay, as the captured decode step runs it) and prints one report() line:
us, GB/s and/or TFLOP/s, % of peak.

The seed is fresh unless --seed is given; it is printed first and with every failure. Each case draws
from its own generator (seed, case name), so --seed N repeats every case's inputs, and a case's inputs
do not depend on which cases ran before it.

Run the benchmarks as scripts (python bench/bench_x.py, or python -m flashd.bench.bench_x); they import
this harness and each other as flashd.bench.* (bench/ is that package), as tests/bench does.
"""
from __future__ import annotations

import argparse
import importlib.util
import secrets
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from flashd.bench.timing import device_line, open_gpu, report

REPO = Path(__file__).resolve().parents[1]
PEAK_F16_TFLOPS = 989.0   # nominal dense f16 tensor-core peak of an H100 / H200 SXM (the same chip)

Check = Callable[[np.ndarray, np.ndarray], "str | None"]


@dataclass(frozen=True)
class Tolerance:
    """|got - want| <= atol + rtol * |want| elementwise (atol may be an array: a per-element bound);
    NaN in got fails unless want holds NaN at the same place. `reason` says why this bound."""

    reason: str
    atol: float | np.ndarray = 0.0
    rtol: float = 0.0

    @classmethod
    def exact(cls, reason: str) -> "Tolerance":
        return cls(reason)

    def __call__(self, got, want) -> str | None:
        got, want = np.asarray(got), np.asarray(want)
        if got.shape != want.shape:
            return f"shape {got.shape} != the reference's {want.shape}"
        g, w = got.astype(np.float64), want.astype(np.float64)
        with np.errstate(invalid="ignore"):
            err = np.abs(g - w)
            bound = np.broadcast_to(self.atol + self.rtol * np.abs(w), err.shape)
            same = (g == w) | (np.isnan(g) & np.isnan(w))
            bad = ~((err <= bound) | same)
        if not bad.any():
            return None
        excess = np.where(bad, np.nan_to_num(err - bound, nan=np.inf, posinf=np.inf), -np.inf)
        i = np.unravel_index(int(np.argmax(excess)), err.shape)
        return (f"{int(bad.sum())} of {bad.size} elements off; worst at {tuple(int(v) for v in i)}: "
                f"got {got[i].item()!r}, want {want[i].item()!r}, |err| {err[i]:.4g} > bound {bound[i]:.4g}")


def add_arguments(ap: argparse.ArgumentParser, reps: int = 30) -> argparse.ArgumentParser:
    ap.add_argument("--seed", type=int, default=None,
                    help="seed of every case's inputs (default: a fresh one, printed)")
    ap.add_argument("--reps", type=int, default=reps, help=f"timed repetitions per case, median (default {reps})")
    return ap


def op_parser(doc: str, quick_help: str, reps: int = 30) -> argparse.ArgumentParser:
    """The command line of an op benchmark with a --quick subset: --seed, --reps (default `reps`), --quick;
    `doc` (the script's docstring, its command line included) is the --help text."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap, reps=reps)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    return ap


def run_cases(args, bench_case: Callable[..., None], cases, quick_cases) -> None:
    """OpHarness.on_gpu(args), then bench_case(h, *case) for each case (quick_cases under --quick)."""
    h = OpHarness.on_gpu(args)
    for case in (quick_cases if args.quick else cases):
        bench_case(h, *case)


def case_rng(seed: int, case: str) -> np.random.Generator:
    """The generator of one case's inputs: depends on the seed and the case's name only."""
    return np.random.default_rng([seed, zlib.crc32(case.encode())])


def repo_module(relpath: str):
    """A module of this repository loaded from its file (an oracle under tests/), without putting
    its folder on sys.path."""
    path = REPO / relpath
    name = "flashd_bench_" + path.stem
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class OpHarness:
    def __init__(self, seed: int | None, reps: int, dev=None, timer=None, script: str | None = None):
        self.seed = secrets.randbits(32) if seed is None else int(seed)
        self.reps = reps
        self.dev, self.timer = dev, timer
        self.script = script or Path(sys.argv[0]).name
        self._graphs = []

    @classmethod
    def on_gpu(cls, args) -> "OpHarness":
        h = cls(args.seed, args.reps, *open_gpu())
        print(f"{device_line(h.timer)}; seed {h.seed} (--seed {h.seed} repeats these inputs)", flush=True)
        return h

    def rng(self, case: str) -> np.random.Generator:
        return case_rng(self.seed, case)

    def fail(self, case: str, problem: str, reason: str) -> None:
        print(f"FAIL {case}: {problem}\n  tolerance: {reason}\n  seed {self.seed}: "
              f"python bench/{self.script} --seed {self.seed} repeats the inputs", flush=True)
        raise SystemExit(1)

    def _launch(self, launch, case: str) -> None:
        status = launch()
        if status:
            self.dev.native.check(status, case)

    def graphed(self, fn: Callable[[], None]) -> Callable[[], None]:
        """fn captured once into a CUDA graph; returns its replay."""
        dev = self.dev
        lib, check = dev.lib, dev.native.check
        check(lib.fd_graph_begin_capture(dev.stream), "fd_graph_begin_capture")
        fn()
        out = dev.ffi.new("void**")
        check(lib.fd_graph_end_capture(dev.stream, out), "fd_graph_end_capture")
        self._graphs.append(out)
        exe = out[0]
        return lambda: check(lib.fd_graph_launch(exe, dev.stream), "fd_graph_launch")

    def check(self, case: str, got, want, check: Check) -> None:
        problem = check(got, want)
        if problem:
            self.fail(case, problem, getattr(check, "reason", getattr(check, "__doc__", None) or "see the benchmark"))

    def run(self, case: str, launch: Callable[[], "int | None"], result: Callable[[], np.ndarray],
            reference: Callable[[], np.ndarray], check: Check, *, n_bytes: float | None = None,
            flops: float | None = None, peak_tflops: float | None = None, graph: bool = False) -> float:
        """Check, then time; returns the median milliseconds. launch() enqueues the op (returns its
        status or None), result() downloads its output, reference() computes the expected one."""
        self._launch(launch, case)
        self.dev.synchronize()
        self.check(case, result(), reference(), check)
        fn = (lambda: self._launch(launch, case))
        if graph:
            fn = self.graphed(fn)
        ms = self.timer.time(fn, reps=self.reps)
        print(report(case, ms, n_bytes=n_bytes, flops=flops, peak_gbs=self.timer.peak_gbs if n_bytes else None,
                     peak_tflops=peak_tflops), flush=True)
        return ms
