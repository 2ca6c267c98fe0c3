"""Inside one GEMV launch: per-CTA globaltimer stamps of the one-row decode GEMVs (bench/lab; not a test).

Needs a library built with bench/lab/gemv_stamps.patch applied (it adds the stamps to gemv.cu's kernel and an
`fd_lab_gemv_stamps` entry point; never part of the library), loaded through FLASHD_NATIVE_LIB:

    git apply bench/lab/gemv_stamps.patch && <build> && FLASHD_NATIVE_LIB=lib.so \
        python bench/lab/gemv_stamps.py MODEL [--depth 128] [--reps 24]

Per CTA and launch the patch records (ns, %globaltimer): t_start (kernel entry; the first step's weights are then
issued), t_wait (pdl_wait returned: the previous kernel has completed), t_pro (x staged in shared memory), the
earliest / latest time a warp's first step had landed, the earliest / latest time a warp finished its steps.
Printed per launch shape (median over the launches of that shape in the replayed steps), relative to the launch's
earliest t_wait (~ when its predecessor completed): when the prologue ended, when the first weights were usable,
when CTAs finished (mean and last) -- the last is what the launch adds to the step after its predecessor.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time
from collections import defaultdict

import numpy as np

from flashd.daemon.config import EngineConfig
from flashd.daemon.engine import Engine
from flashd.protocol.messages import SamplingParams

MAX_CTAS, RING, FIELDS = 264, 4096, 16


def read_stamps(lab) -> list[dict]:
    buf = np.zeros((RING, MAX_CTAS, FIELDS), dtype=np.uint64)
    counts = np.zeros(MAX_CTAS, dtype=np.uint32)
    st = lab.fd_lab_gemv_stamps(buf.ctypes.data_as(ctypes.c_void_p), counts.ctypes.data_as(ctypes.c_void_p), 0)
    if st:
        raise SystemExit(f"fd_lab_gemv_stamps: {st}")
    recs = []
    for b in range(MAX_CTAS):
        for slot in range(min(int(counts[b]), RING)):
            r = buf[slot, b]
            if r[0] == 0:
                continue
            rows, cols = int(r[7]) >> 32, int(r[7]) & 0xFFFFFFFF
            misc = int(r[8])
            recs.append(dict(
                t0=int(r[0]), tw=int(r[1]), tp=int(r[2]), fmin=int(r[3]), fmax=int(r[4]), emin=int(r[5]),
                emax=int(r[6]), rows=rows, cols=cols, steps=misc & 0xFFFFFFFF, mats=(misc >> 32) & 0xFF,
                swiglu=(misc >> 40) & 1, nx=(misc >> 41) & 0xF, xq=(misc >> 45) & 1, warps=(misc >> 46) & 0x3F,
                sm=misc >> 52, grid=int(r[9]) >> 32, cta=int(r[9]) & 0xFFFFFFFF,
                tp2=int(r[10])))        # a variant's second prologue (pad[0]), 0 if not recorded
    return recs


def launches(recs: list[dict], gap_ns: int) -> list[list[dict]]:
    """Records grouped per launch: same shape key, t_start within gap_ns of the previous record of that group."""
    by_key = defaultdict(list)
    for r in recs:
        by_key[(r["rows"], r["cols"], r["steps"], r["mats"], r["swiglu"])].append(r)
    out = []
    for rs in by_key.values():
        rs.sort(key=lambda r: r["t0"])
        cur = [rs[0]]
        for r in rs[1:]:
            if r["t0"] - cur[-1]["t0"] > gap_ns or len(cur) == r["grid"]:
                out.append(cur)
                cur = []
            cur.append(r)
        out.append(cur)
    out.sort(key=lambda g: min(r["t0"] for r in g))
    return out


def summarize(groups: list[list[dict]]) -> None:
    med = statistics.fmean       # %globaltimer ticks in ~1 us steps on H100/H200: means over CTAs and launches
    per_shape = defaultdict(list)
    prev_end = None
    for g in groups:
        w0 = min(r["tw"] for r in g)
        ends = sorted(r["emax"] for r in g if r["emax"])
        if not ends:
            continue
        key = (g[0]["rows"], g[0]["cols"], g[0]["mats"], g[0]["swiglu"])
        per_shape[key].append(dict(
            ctas=len(g), grid=g[0]["grid"], warps=g[0]["warps"], steps=g[0]["steps"],
            start=w0 - min(r["t0"] for r in g),                      # entry before the wait returned
            wait_spread=max(r["tw"] for r in g) - w0,
            pro=med(r["tp"] for r in g) - w0, pro_max=max(r["tp"] for r in g) - w0,
            pro2=med(r["tp2"] - r["tp"] for r in g) if all(r["tp2"] for r in g) else None,
            first=med(r["fmax"] for r in g if r["fmax"]) - w0,
            end_med=med(ends) - w0, end_max=ends[-1] - w0,
            gap=(w0 - prev_end) if prev_end is not None and 0 <= w0 - prev_end < 50_000 else None))
        prev_end = ends[-1]
    print(f"{'rows x cols':>16} {'mats':>4} {'sw':>2} {'n':>5} {'grid':>4} {'warps':>5} {'steps':>6} "
          f"{'pre-wait':>8} {'w.spread':>8} {'prologue':>8} {'pro.max':>8} {'1st w.':>7} {'end med':>8} {'end max':>8} "
          f"{'gap':>6} {'pro2':>6}   (us after the launch's first wait returned; means over CTAs and launches)")
    for key, ls in sorted(per_shape.items(), key=lambda kv: -med(x["end_max"] for x in kv[1]) * len(kv[1])):
        def m(f):
            vals = [x[f] for x in ls if x[f] is not None]
            return med(vals) / 1e3 if vals else float("nan")
        print(f"{key[0]:>7} x {key[1]:<6} {key[2]:>4} {key[3]:>2} {len(ls):>5} {ls[0]['grid']:>4} {ls[0]['warps']:>5} "
              f"{ls[0]['steps']:>6} {m('start'):8.2f} {m('wait_spread'):8.2f} {m('pro'):8.2f} {m('pro_max'):8.2f} "
              f"{m('first'):7.2f} {m('end_med'):8.2f} {m('end_max'):8.2f} {m('gap'):6.2f} {m('pro2'):6.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=128)
    ap.add_argument("--reps", type=int, default=24)
    ap.add_argument("--gap-us", type=float, default=4.0)
    ap.add_argument("--dump", help="write the raw records (.npy of dicts) here")
    ap.add_argument("--tuning", action="append", default=[], help="k=v: a launch tuning field (flashd_tuning.h)")
    args = ap.parse_args()
    path = os.environ.get("FLASHD_NATIVE_LIB")
    if not path:
        raise SystemExit("set FLASHD_NATIVE_LIB to a library built with bench/lab/gemv_stamps.patch")
    engine = Engine(EngineConfig(model=args.model, device="cuda", max_ctx=args.depth + 256, prefix_cache=False))
    if args.tuning:
        engine.backend.device.native.set_tuning(**{k: int(v) for k, v in (t.split("=") for t in args.tuning)})
    engine.load()
    runner = engine.runner
    dev, lib = runner.dev, runner.dev.lib
    lab = ctypes.CDLL(path)
    lab.fd_lab_gemv_stamps.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    prompt = list(np.random.default_rng(0).integers(0, 1000, args.depth))
    for _ in runner.generate(prompt, SamplingParams(), 2):
        pass
    graph = runner._graph(None)
    for _ in range(5):
        runner._set_state(args.depth, args.depth)
        lib.fd_graph_launch(graph, dev.stream)
    dev.synchronize()
    lab.fd_lab_gemv_stamps(None, None, 1)
    t0 = time.perf_counter()
    for _ in range(args.reps):
        runner._set_state(args.depth, args.depth)
        lib.fd_graph_launch(graph, dev.stream)
    dev.synchronize()
    print(f"decode step (graph replay, stamped build): {(time.perf_counter() - t0) / args.reps * 1e6:.1f} us")
    recs = read_stamps(lab)
    diffs = sorted({r["tp"] - r["tw"] for r in recs if r["tp"] > r["tw"]})
    print(f"{len(recs)} CTA records; smallest nonzero prologue stamp difference {diffs[0] if diffs else 0} ns")
    summarize(launches(recs, int(args.gap_us * 1e3)))
    if args.dump:
        np.save(args.dump, np.array(recs, dtype=object), allow_pickle=True)


if __name__ == "__main__":
    main()
