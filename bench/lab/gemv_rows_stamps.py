"""Inside the one-row dp4a GEMV launches of a decode step: per-CTA globaltimer stamps (bench/lab; not a test).

Needs a library built with bench/lab/gemv_rows_stamps.patch (gemv_rows_tma_kernel's DP instantiations stamp each CTA:
entry, after pdl_wait, inside the x staging -- thread 0 after its warp's own norm sum (its loads returned), after the
barrier that has every warp's sum, after the scale, after its warp's groups are quantized; the norm stamps are absent
in launches without a norm --, x staged (the last barrier), warp 0's first piece landed, the last warp's items done, the
fold done; an `lab_rows_stamps` entry point reads them), loaded through FLASHD_NATIVE_LIB; CUDA only:

    bash bench/prebuilt_lib.sh HEAD stamps .libs bench/lab/gemv_rows_stamps.patch   (CPU machine)
    FLASHD_NATIVE_LIB=stamps.so python bench/lab/gemv_rows_stamps.py MODEL [--reps 12] [--tuning F=N,...]...

Each --tuning is one run: the tuning set, the decode graph recaptured, replayed --reps times and its stamps read back.
Printed per launch shape (rows x cols, SwiGLU), means over CTAs then launches, in us after the launch's first
pdl_wait return (~ when its predecessor completed): entry (negative: resident before the wait), x staged, first
piece landed, items done (mean over CTAs and the latest CTA), fold done (mean and latest = what the launch adds after
its predecessor, plus the exit). Launches are rebuilt from CTA index 0's records (every launch has a CTA 0).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
from collections import defaultdict

import numpy as np

MAGIC = 0x52535441424C4142
T0, TW, TX, TF, TI, TE, RC, MISC, MAG, NMATS, XS_OWN, XS_ALL, XS_SCALE, XS_QUANT = range(14)


class Lab:
    def __init__(self, path: str):
        self.fn = ctypes.CDLL(path).lab_rows_stamps
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        info = (ctypes.c_int * 3)()
        self._call(None, None, 0, info)
        self.ring, self.ctas, self.fields = list(info)

    def _call(self, dst, counts, reset, info=None):
        st = self.fn(dst, counts, reset, info)
        if st:
            raise SystemExit(f"lab_rows_stamps: error {st}")

    def reset(self):
        self._call(None, None, 1)

    def read(self):
        buf = np.zeros((self.ring, self.ctas, self.fields), np.uint64)
        counts = np.zeros(self.ctas, np.uint32)
        self._call(buf.ctypes.data_as(ctypes.c_void_p), counts.ctypes.data_as(ctypes.c_void_p), 0)
        return buf, counts


def launches(buf, counts):
    """Per launch (stream order): its CTAs' records. CTA index b's records are those of the launches whose grid > b."""
    n0 = min(int(counts[0]), buf.shape[0])
    grids = [int(buf[i, 0, MISC]) & 0xFFFF for i in range(n0)]
    out = [[buf[i, 0]] for i in range(n0)]
    for b in range(1, buf.shape[1]):
        i = 0
        n_b = min(int(counts[b]), buf.shape[0])
        for li, g in enumerate(grids):
            if i >= n_b:
                break
            if g <= b:
                continue
            r = buf[i, b]
            i += 1
            if int(r[MAG]) != MAGIC or int(r[RC]) != int(out[li][0][RC]):
                break
            out[li].append(r)
    return [g for g in out if int(g[0][MAG]) == MAGIC]


def buf_fields(g) -> int:
    return len(g[0])


def table(groups):
    rows = defaultdict(list)
    prev_end = None
    for g in groups:
        h = g[0]
        rc, misc = int(h[RC]), int(h[MISC])
        key = (rc >> 32, rc & 0xFFFFFFFF, (misc >> 24) & 1, int(h[NMATS]), (misc >> 16) & 0xFF, misc & 0xFFFF)
        w0 = min(int(r[TW]) for r in g)

        def rel(f, agg=statistics.fmean):
            vals = [int(r[f]) - w0 for r in g if int(r[f])]
            return agg(vals) / 1e3 if vals else None

        end_max = rel(TE, max)
        extra = {}
        if buf_fields(g) > XS_QUANT:   # the patch's x-staging stamps (CTA thread 0; 0 where the launch has no norm)
            extra = dict(xs_own=rel(XS_OWN), xs_all=rel(XS_ALL), xs_scale=rel(XS_SCALE), xs_quant=rel(XS_QUANT))
        rows[key].append(dict(entry=rel(T0), wait_spread=rel(TW, max), **extra, x=rel(TX), first=rel(TF),
                              items=rel(TI), items_max=rel(TI, max), end=rel(TE), end_max=end_max,
                              gap=None if prev_end is None else (w0 - prev_end) / 1e3))
        prev_end = w0 + end_max * 1e3
    return rows


def show(rows):
    cols = tuple(c for c in ("entry", "wait_spread", "xs_own", "xs_all", "xs_scale", "xs_quant", "x", "first", "items",
                             "items_max", "end", "end_max", "gap") if c in next(iter(rows.values()))[0])
    print(f"{'rows x cols':>15} {'sw':>2} {'mats':>4} {'warps':>5} {'grid':>4} {'n':>4} " +
          " ".join(f"{c:>11}" for c in cols))
    for key, ls in sorted(rows.items(), key=lambda kv: -statistics.fmean(x["end_max"] for x in kv[1]) * len(kv[1])):
        r, c, sw, mats, warps, grid = key
        vals = []
        for f in cols:
            v = [x[f] for x in ls if x.get(f) is not None and (f != "gap" or 0 <= x[f] < 50)]
            vals.append(statistics.fmean(v) if v else float("nan"))
        print(f"{r:>6} x {c:<6} {sw:>2} {mats:>4} {warps:>5} {grid:>4} {len(ls):>4} " +
              " ".join(f"{v:11.2f}" for v in vals))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=128)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--tuning", action="append", default=[])
    args = ap.parse_args(argv)
    path = os.environ.get("FLASHD_NATIVE_LIB")
    if not path:
        raise SystemExit("set FLASHD_NATIVE_LIB to a library built with bench/lab/gemv_rows_stamps.patch")
    from flashd.daemon.config import EngineConfig
    from flashd.daemon.engine import Engine
    from flashd.protocol.messages import SamplingParams

    engine = Engine(EngineConfig(model=args.model, device="cuda", max_ctx=args.depth + 256, prefix_cache=False,
                                 forward="graph"))
    native = engine.backend.device.native
    base = native.tuning()
    engine.load()
    runner = engine.runner
    dev, lib = runner.dev, runner.dev.lib
    lab = Lab(path)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 1000, args.depth)]
    for _ in runner.generate(prompt, SamplingParams(), 2):
        pass
    for text in args.tuning or [""]:
        changes = {k: int(v) for k, _, v in (i.partition("=") for i in text.split(",") if i)}
        native.set_tuning(**base)
        native.set_tuning(**changes)
        runner.drop_graphs()
        runner._warm_up()
        graph = runner._graph(None)
        for _ in range(4):
            runner._set_state(args.depth, args.depth)
            dev.native.check(lib.fd_graph_launch(graph, dev.stream), "graph launch")
        dev.synchronize()
        lab.reset()
        for _ in range(args.reps):
            runner._set_state(args.depth, args.depth)
            dev.native.check(lib.fd_graph_launch(graph, dev.stream), "graph launch")
        dev.synchronize()
        groups = launches(*lab.read())
        print(f"\n=== {text or 'table tuning'}: {len(groups)} launches ({len(groups) / args.reps:.1f} a step)")
        show(table(groups))
    native.set_tuning(**base)
    print("  (us after the launch's first pdl_wait return; entry < 0: resident before it; gap: from the previous "
          "stamped launch's last fold to this one's first wait -- attention and launch latency between)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
