"""Inside one GEMV launch: per-CTA globaltimer stamps of the one-row decode GEMVs (bench/lab; not a test).

Needs a library built with bench/lab/gemv_stamps.patch applied (it adds the stamps to gemv.cu's gemv_kernel, every
variant, and an `lab_gemv_stamps` entry point; never part of the library; CUDA only), loaded through FLASHD_NATIVE_LIB:

    git apply bench/lab/gemv_stamps.patch && <build the library> && FLASHD_NATIVE_LIB=lib.so \\
        python bench/lab/gemv_stamps.py MODEL [--depth 128] [--reps 16] \\
            [--tuning gemv_xq_direct=0 --tuning gemv_xq_direct=1]

Each --tuning FIELD=N,... is one run (fd_tuning_t fields, flashd_tuning.h, over the table's tuning of this GPU; none:
one run with the table's): the tuning is set, the decode graph recaptured (launches read the tuning when captured),
replayed --reps times at --depth cached tokens and its stamps read back. So one stamped build compares, e.g.,
gemv_xq_direct=0 and =1 (which only changes launches that take the x pre-pass: gemv_xq_prepass_cols /
gemv_xq_prepass_norm_cols > 0 in the table, or set them in the same --tuning).

Per CTA and launch the patch records (ns, %globaltimer): t_start (kernel entry; the first step's weights are then
issued), t_wait (pdl_wait returned: the previous kernel has completed), t_pro (the prologue's end: x staged in shared
memory -- quantized in the CTA (XQ), copied from the pre-pass's image (IMG) or as floats (F32); for XG launches, which
read the image in place from global memory, nothing is staged and t_pro is taken right after pdl_wait), the earliest /
latest time a warp's first step had landed, the earliest / latest time a warp finished its steps, and the variant
(flags: pre-pass image or not, XG, PAIR, SWIGLU, XQ). The x pre-pass launch (gemv_xq_image_kernel) is not stamped (it is
at its register cap: any stamping code spilled), so for IMG / XG launches `gap` includes it; nor are split-row launches
(gemv_split_kernel, fd_tuning_t.gemv_split_cols): with the split on, ffn_down's time shows in the next launch's
`gap` (the chain tracer, gpu_host.sh chain, times it directly). Launches are rebuilt
exactly (records of CTA index b are in launch order; CTA 0's are every GEMV launch).

Printed per launch shape and variant (means over CTAs, then over the launches of that shape in the replayed steps),
in us after the launch's earliest t_wait (~ when its predecessor completed): when the prologue ended, when the first
weights were usable, when CTAs finished (mean and last) -- the last is what the launch adds to the step after its
predecessor; `gap` is from the previous stamped launch's last CTA end to this one's first wait (the kernels between,
e.g. the x pre-pass, norms, attention, and the launch latency; means of gaps under 50 us). The stamping itself adds to
each CTA's exit (one L2 round trip per warp, two more for the last one), so the decode step of a stamped build is
slower than an unpatched one: compare runs of one build, not with other builds.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time
from collections import defaultdict

import numpy as np

FIELDS = 16
(F_T_START, F_T_WAIT, F_T_PRO, F_FIRST_MIN, F_FIRST_MAX, F_END_MIN, F_END_MAX, F_KEY_RC, F_KEY_MISC, F_SEQ, F_FLAGS,
 F_MAGIC) = range(12)
LAB_MAGIC = 0x3253504D41545347              # the patch's record layout ("GSTAMPS2")
IMG, XG, PAIR, SWIGLU, XQ = 1, 2, 4, 8, 16
SUMMARY_TUNING = ("pdl", "gemv_int8_x", "gemv_xq_prepass_cols", "gemv_xq_prepass_norm_cols", "gemv_swiglu_pair",
                  "gemv_xq_direct")


def variant(flags: int) -> str:
    v = "XG" if flags & XG else "IMG" if flags & IMG else "XQ" if flags & XQ else "F32"
    return v + ("+pair" if flags & PAIR else "")


class Lab:
    """The patch's entry point, from the library the daemon loaded (same path: the same module, the same symbols)."""

    def __init__(self, path: str):
        self.dll = ctypes.CDLL(path)
        try:
            self.fn = self.dll.lab_gemv_stamps
        except AttributeError:
            raise SystemExit(f"{path}: no lab_gemv_stamps -- build the library with bench/lab/gemv_stamps.patch") from None
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        self.fn.restype = ctypes.c_int
        info = (ctypes.c_int * 4)()
        self._call(None, None, 0, info)
        self.ring, self.max_ctas, fields, magic = list(info)
        if fields != FIELDS or magic != LAB_MAGIC & 0x7FFFFFFF:
            raise SystemExit(f"{path}: stamp layout {fields} fields / magic {magic:#x}: not this tool's patch")

    def _call(self, dst, counts, reset: int, info=None) -> None:
        st = self.fn(dst, counts, reset, info)
        if st:
            raise SystemExit(f"lab_gemv_stamps: CUDA error {st}")

    def reset(self) -> None:
        self._call(None, None, 1)

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        buf = np.zeros((self.ring, self.max_ctas, FIELDS), dtype=np.uint64)
        counts = np.zeros(self.max_ctas, dtype=np.uint32)
        self._call(buf.ctypes.data_as(ctypes.c_void_p), counts.ctypes.data_as(ctypes.c_void_p), 0)
        return buf, counts


def decode(r: np.ndarray) -> dict:
    rc, misc, seq, flags = int(r[F_KEY_RC]), int(r[F_KEY_MISC]), int(r[F_SEQ]), int(r[F_FLAGS])
    return dict(t0=int(r[F_T_START]), tw=int(r[F_T_WAIT]), tp=int(r[F_T_PRO]), fmin=int(r[F_FIRST_MIN]),
                fmax=int(r[F_FIRST_MAX]), emin=int(r[F_END_MIN]), emax=int(r[F_END_MAX]),
                rows=rc >> 32, cols=rc & 0xFFFFFFFF, steps=misc & 0xFFFFFFFF, mats=(misc >> 32) & 0xFF,
                swiglu=(misc >> 40) & 1, nx=(misc >> 41) & 0xF, xq=(misc >> 45) & 1, warps=(misc >> 46) & 0x3F,
                sm=misc >> 52, grid=seq >> 32, cta=seq & 0xFFFFFFFF, flags=flags, variant=variant(flags),
                ok=int(r[F_MAGIC]) == LAB_MAGIC)


def launches(buf: np.ndarray, counts: np.ndarray) -> tuple[list[list[dict]], list[str]]:
    """Every recorded launch, in stream order, as its CTAs' records; and warnings. CTA index 0's records are the
    launches (every grid has a CTA 0); CTA index b's are, in order, those of the launches whose grid exceeds b."""
    ring = buf.shape[0]
    notes = []
    n0 = min(int(counts[0]), ring)
    if int(counts.max()) > ring:
        notes.append(f"ring full: CTA index {int(counts.argmax())} had {int(counts.max())} records, {ring} kept -- "
                     "the later launches are not shown (fewer --reps)")
    heads = [decode(buf[i, 0]) for i in range(n0)]
    out = [[h] for h in heads]
    bad = sum(not h["ok"] for h in heads)
    for b in range(1, buf.shape[1]):
        n_b = min(int(counts[b]), ring)
        i = 0
        for li, h in enumerate(heads):
            if i >= n_b:
                break
            if h["grid"] <= b:
                continue
            r = decode(buf[i, b])
            i += 1
            if not r["ok"] or r["grid"] != h["grid"] or r["flags"] != h["flags"] or r["cols"] != h["cols"]:
                bad += 1
                break                  # this CTA index's order no longer matches: drop its remaining records
            out[li].append(r)
    if bad:
        notes.append(f"{bad} records did not match their launch (layout or ordering): left out")
    short = sum(len(g) != g[0]["grid"] for g in out)
    if short:
        notes.append(f"{short} launches have fewer CTA records than CTAs (CTA indices >= the patch's "
                     f"LAB_MAX_CTAS, or dropped)")
    return [g for g in out if g[0]["ok"]], notes


def per_shape(groups: list[list[dict]]) -> dict:
    """(shape, variant) -> one dict of timings (ns, relative to the launch's first wait) per launch."""
    mean = statistics.fmean          # of differences: the stamps themselves (~1.8e18 ns) do not fit a double exactly
    table = defaultdict(list)
    prev_end = None                  # the previous launch's last CTA end
    for g in groups:
        h = g[0]
        w0 = min(r["tw"] for r in g)
        ends = [r["emax"] for r in g if r["emax"]]
        if not ends:
            continue
        firsts = [r["fmax"] for r in g if r["fmax"]]
        key = (h["rows"], h["cols"], h["mats"], h["swiglu"], h["nx"], h["variant"])
        table[key].append(dict(
            ctas=len(g), grid=h["grid"], warps=h["warps"], steps=h["steps"],
            start=w0 - min(r["t0"] for r in g),                   # entry before the wait returned
            wait_spread=max(r["tw"] for r in g) - w0,
            pro=mean(r["tp"] - w0 for r in g), pro_max=max(r["tp"] for r in g) - w0,
            first=mean(f - w0 for f in firsts) if firsts else None,
            end_med=mean(e - w0 for e in ends), end_max=max(ends) - w0,
            gap=None if prev_end is None else w0 - prev_end))
        prev_end = max(ends)
    return table


def m(ls: list[dict], f: str) -> float:
    vals = [x[f] for x in ls if x[f] is not None and (f != "gap" or 0 <= x[f] < 50_000)]
    return statistics.fmean(vals) / 1e3 if vals else float("nan")


def print_table(table: dict) -> None:
    print(f"{'rows x cols':>15} {'mats':>4} {'sw':>2} {'nx':>2} {'variant':>9} {'n':>5} {'grid':>4} {'warps':>5} "
          f"{'steps':>5} {'pre-wait':>8} {'w.spread':>8} {'prologue':>8} {'pro.max':>8} {'1st w.':>7} {'end mean':>8} "
          f"{'end max':>8} {'gap':>6}")
    order = sorted(table.items(), key=lambda kv: -m(kv[1], "end_max") * len(kv[1]))
    for key, ls in order:
        rows, cols, mats, sw, nx, var = key
        print(f"{rows:>6} x {cols:<6} {mats:>4} {sw:>2} {nx:>2} {var:>9} {len(ls):>5} {ls[0]['grid']:>4} "
              f"{ls[0]['warps']:>5} {ls[0]['steps']:>5} {m(ls, 'start'):8.2f} {m(ls, 'wait_spread'):8.2f} "
              f"{m(ls, 'pro'):8.2f} {m(ls, 'pro_max'):8.2f} {m(ls, 'first'):7.2f} {m(ls, 'end_med'):8.2f} "
              f"{m(ls, 'end_max'):8.2f} {m(ls, 'gap'):6.2f}")
    print("  (us after the launch's first wait returned; means over CTAs, then over launches. variant: F32 float x, XQ "
          "x quantized in each CTA, IMG the pre-pass's image copied to shared memory, XG the image read in place from "
          "global memory -- nothing staged: XG's prologue is the stamp right after pdl_wait, ~0 -- +pair: gate and "
          "up in one dot loop. IMG / XG gaps include the unstamped x pre-pass launch)")


def compare(runs: list[tuple[str, dict]]) -> None:
    """Per launch shape: each run's variant(s), end max and gap, side by side."""
    shapes = defaultdict(dict)
    for name, table in runs:
        for key, ls in table.items():
            shapes[key[:5]].setdefault(name, []).append(f"{key[5]} {m(ls, 'end_max'):.2f}/{m(ls, 'gap'):.2f}")
    print("\nper shape, per run: variant, end max / gap in us (the gap of IMG / XG launches includes the x pre-pass)")
    names = [n for n, _ in runs]
    print(f"{'rows x cols':>15} {'mats':>4} {'sw':>2} {'nx':>2}  " + "  ".join(f"{n[:28]:>28}" for n in names))
    for key in sorted(shapes):
        rows, cols, mats, sw, nx = key
        print(f"{rows:>6} x {cols:<6} {mats:>4} {sw:>2} {nx:>2}  "
              + "  ".join(f"{', '.join(shapes[key].get(n, ['-'])):>28}" for n in names))


def parse_tuning(text: str) -> dict[str, int]:
    out = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"--tuning {item!r}: expected FIELD=INTEGER")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            raise SystemExit(f"--tuning {item!r}: expected FIELD=INTEGER") from None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="GGUF path")
    ap.add_argument("--depth", type=int, default=128, help="cached tokens of the replayed decode step")
    ap.add_argument("--reps", type=int, default=16, help="stamped decode steps per run (graph replays)")
    ap.add_argument("--warm", type=int, default=5, help="unstamped replays before each run's stamped ones")
    ap.add_argument("--tuning", action="append", default=[], metavar="FIELD=N,...",
                    help="one run with these launch tuning overrides (flashd_tuning.h fields); repeat to compare "
                         "runs, e.g. --tuning gemv_xq_direct=0 --tuning gemv_xq_direct=1")
    ap.add_argument("--dump", help="write each run's raw records here (.npz: ring and counts per run)")
    args = ap.parse_args(argv)
    path = os.environ.get("FLASHD_NATIVE_LIB")
    if not path:
        raise SystemExit("set FLASHD_NATIVE_LIB to a library built with bench/lab/gemv_stamps.patch")
    runs_tuning = [parse_tuning(t) for t in args.tuning] or [{}]

    from flashd.daemon.config import EngineConfig
    from flashd.daemon.engine import Engine
    from flashd.protocol.messages import SamplingParams

    # the per-op graph decode: the persistent forward (forward.cu) does not run gemv_kernel
    engine = Engine(EngineConfig(model=args.model, device="cuda", max_ctx=args.depth + 256, prefix_cache=False,
                                 forward="graph"))
    native = engine.backend.device.native
    if os.path.realpath(str(native.path)) != os.path.realpath(path):
        raise SystemExit(f"the daemon loaded {native.path}, not FLASHD_NATIVE_LIB={path}")
    base = native.tuning()
    native.set_tuning(**runs_tuning[0])      # before load: the first graphs are captured with it
    engine.load()
    runner = engine.runner
    if getattr(runner, "forward_path", "graph") != "graph":
        raise SystemExit(f"decode runs on the {runner.forward_path} forward, not the per-op graph")
    dev, lib = runner.dev, runner.dev.lib
    lab = Lab(path)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 1000, args.depth)]
    for _ in runner.generate(prompt, SamplingParams(), 2):
        pass

    results, dumps = [], {}
    for i, changes in enumerate(runs_tuning):
        native.set_tuning(**base)
        tuning = native.set_tuning(**changes)
        name = ",".join(f"{k}={v}" for k, v in changes.items()) or "table tuning"
        runner.drop_graphs()
        runner._warm_up()                    # one eager step (first-use setup), then the greedy graph, captured now
        graph = runner._graph(None)
        for _ in range(args.warm):
            runner._set_state(args.depth, args.depth)
            dev.native.check(lib.fd_graph_launch(graph, dev.stream), "graph launch")
        dev.synchronize()
        lab.reset()
        t0 = time.perf_counter()
        for _ in range(args.reps):
            runner._set_state(args.depth, args.depth)
            dev.native.check(lib.fd_graph_launch(graph, dev.stream), "graph launch")
        dev.synchronize()
        step_us = (time.perf_counter() - t0) / args.reps * 1e6
        buf, counts = lab.read()
        groups, notes = launches(buf, counts)
        print(f"\n=== run {i + 1}: {name}  ({', '.join(f'{k}={tuning[k]}' for k in SUMMARY_TUNING if k in tuning)})")
        print(f"decode step (graph replay, stamped build, host clock incl. the state uploads): {step_us:.1f} us; "
              f"{len(groups)} launches recorded, {sum(map(len, groups))} CTA records "
              f"({len(groups) / max(args.reps, 1):.1f} launches per step)")
        for n in notes:
            print(f"note: {n}")
        table = per_shape(groups)
        print_table(table)
        results.append((name, table))
        if args.dump:
            dumps[f"ring_{i}"], dumps[f"counts_{i}"] = buf[:max(1, min(int(counts.max()), lab.ring))], counts
    if len(results) > 1:
        compare(results)
    native.set_tuning(**base)
    if args.dump:
        np.savez_compressed(args.dump, **dumps, names=np.array([n for n, _ in results]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
